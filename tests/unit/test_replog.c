/* test_replog.c - the replication log (server/replog/replog.c), without
 * sockets: a leader psd's updates, table declarations and table pushes are
 * recorded; a follower psd that applies the log's bytes holds the leader's
 * dense parameters, optimizer state, version, tables and rows bit for bit
 * (the dense values as a fetch's answer carries them, the pushes between
 * two fetches once); answers that lie about their length, their position,
 * their version, their blocks, and records that lie about their length,
 * kind, size or the follower's layout are refused with a reason, and change
 * nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/policy/policy.h"
#include "server/replog/records.h"
#include "server/replog/replog.h"
#include "server/store/psd.h"
#include "server/tables/sparse_optim.h"
#include "server/update/update.h"

#define N 300000 /* parameters: part of one block (2^20), which an answer carries as they are */

static void set(psd *s, const char *key, const char *value)
{
    char err[256];
    assert_int_equal(ps_config_set(&s->cfg, key, value, err, sizeof err), 0);
}

static psd *make_psd(void)
{
    psd *s = calloc(1, sizeof *s);
    assert_non_null(s);
    ps_config_defaults(&s->cfg);
    set(s, "optimizer", "sgd");
    set(s, "momentum", "0.9");
    set(s, "lr", "0.1");
    set(s, "warmup_versions", "0");
    s->policy = srv_policy_for(&s->cfg);
    srv_tables_init(&s->tables, (uint64_t)1 << 30);
    srv_tables_configure(&s->tables, &s->cfg);
    return s;
}

static void free_psd(psd *s)
{
    srv_replog_free(s);
    srv_update_free(s);
    srv_model_free(&s->model);
    srv_tables_free(&s->tables);
    free(s);
}

static ps_table_def table_def(void)
{
    ps_table_def d;
    char err[256];
    ps_hp hp;
    memset(&hp, 0, sizeof hp);
    assert_int_equal(ps_table_def_make(&d, "emb", 4, "normal", 1, 0.1, 7, "adagrad", &hp, err, sizeof err), 0);
    return d;
}

/* The leader's model of N values, given values i / N + shift as an INIT
 * does (marked, for the log's next flush), and flushed. */
static void init_model(psd *s, float shift)
{
    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {N};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    srv_model_propose(&s->model, &l);
    assert_int_equal(srv_model_commit(&s->model, &s->cfg), 0);
    srv_model_mark(&s->model, 0, N);
    for (uint64_t i = 0; i < N; i++) {
        srv_wseg seg;
        assert_int_equal(srv_model_write_begin(&s->model, i, 1, &seg), 0);
        seg.wo[0] = (float)i / N + shift;
        srv_model_write_end(&s->model, &seg);
    }
    srv_model_set_initialized(&s->model, 0);
    srv_replog_flush(s);
}

/* table_def()'s table declared on s: its index. */
static uint32_t declare_table(psd *s)
{
    ps_table_def d = table_def();
    uint32_t ti;
    char err[256];
    assert_int_equal(srv_tables_declare(&s->tables, &d, &ti, err, sizeof err), 0);
    return ti;
}

/* A leader with a log, a model of N values and a table, changed a few times. */
static psd *busy_leader(void)
{
    psd *s = make_psd();
    assert_int_equal(srv_replog_start(s), 0);
    init_model(s, 0.0f);
    char err[256];
    uint32_t ti = declare_table(s);
    float *g = malloc(N * sizeof *g);
    assert_non_null(g);
    for (int step = 0; step < 3; step++) {
        for (uint64_t i = 0; i < N; i++)
            g[i] = (float)((i * 7 + (uint64_t)step) % 13) / 13.0f - 0.5f;
        srv_grad gr = {.g = g, .has_gmax = 1, .gmax = 0.5f};
        assert_int_equal(srv_update_apply(s, &gr, step == 1 ? 1000 : 0, step == 1 ? 5000 : N, NULL), 0);
        srv_model_bump(&s->model);
        srv_replog_flush(s);
        uint8_t keys[8 * 16];
        float rg[16 * 4];
        for (int k = 0; k < 16; k++) {
            uint64_t key = (uint64_t)(k * 3 + step);
            memcpy(keys + 8 * k, &key, 8);
            for (int j = 0; j < 4; j++)
                rg[k * 4 + j] = 0.01f * (float)(k - j + step);
        }
        assert_int_equal(srv_update_rows(s, ti, keys, 16, rg, NULL, NULL, NULL, 0, err, sizeof err), 0);
    }
    free(g);
    srv_replog_flush(s);
    return s;
}

static void assert_same(const psd *a, const psd *b)
{
    assert_int_equal(a->model.version, b->model.version);
    assert_int_equal(a->model.initialized, b->model.initialized);
    assert_int_equal(a->model.layout.total, b->model.layout.total);
    for (uint64_t at = 0; at < N;) {
        size_t la, lb;
        const float *pa = srv_model_at(&a->model, at, N - at, &la);
        const float *pb = srv_model_at(&b->model, at, N - at, &lb);
        size_t n = la < lb ? la : lb;
        assert_memory_equal(pa, pb, n * sizeof(float));
        at += n;
    }
    float *sa[4], *sb[4];
    const char *na[4], *nb[4];
    size_t ka = srv_optim_state_buffers((srv_optim *)&a->model.opt, sa, na, 4);
    size_t kb = srv_optim_state_buffers((srv_optim *)&b->model.opt, sb, nb, 4);
    assert_int_equal(ka, 1); /* momentum */
    assert_int_equal(ka, kb);
    assert_memory_equal(sa[0], sb[0], N * sizeof(float));
    assert_int_equal(a->tables.n, b->tables.n);
    const ps_table_def *d = srv_tables_def(&a->tables, 0);
    uint32_t nf = srv_sparse_row_floats(d);
    srv_table_stats ta, tb;
    srv_tables_stats(&a->tables, 0, &ta);
    srv_tables_stats(&b->tables, 0, &tb);
    assert_int_equal(ta.rows, tb.rows);
    assert_int_equal(ta.clock, tb.clock);
    for (uint64_t key = 0; key < 64; key++) {
        const float *ra = srv_tables_row(&a->tables, 0, key), *rb = srv_tables_row(&b->tables, 0, key);
        assert_int_equal(ra == NULL, rb == NULL);
        if (ra)
            assert_memory_equal(ra, rb, nf * sizeof(float));
    }
}

/* The answer to a fetch from `from` (at most max bytes of records) as the
 * bytes a follower receives; *next: the position it moves to. */
static uint8_t *answer(psd *l, uint64_t from, size_t max, size_t *len, uint64_t *next)
{
    srv_replog_answer a;
    assert_int_equal(srv_replog_answer_make(l, from, max, 1, &a), 0);
    uint8_t *b = malloc(a.ndata * 4 + 1);
    assert_non_null(b);
    size_t w = 0; /* the pieces, in order, as the connection writes them */
    for (size_t i = 0; i < a.npc; i++) {
        assert_true(w + a.pc[i].len <= a.ndata * 4);
        memcpy(b + w, a.pc[i].p, a.pc[i].len);
        w += a.pc[i].len;
    }
    assert_int_equal(w, a.ndata * 4);
    *len = a.ndata * 4;
    *next = a.next;
    srv_replog_answer_free(&a);
    return b;
}

/* One fetch from position from, answered with at most max bytes of
 * records, applied by f: the position after it. */
static uint64_t fetch_one(psd *l, psd *f, uint64_t from, size_t max)
{
    char err[256] = "";
    size_t len;
    uint64_t next, got;
    uint8_t *b = answer(l, from, max, &len, &next);
    assert_true(next > from);
    if (srv_replog_apply_answer(f, b, len, from, srv_replog_end(l), &got, NULL, err, sizeof err) != 0)
        fail_msg("apply: %s", err);
    assert_int_equal(got, next);
    free(b);
    return next;
}

/* Fetches from the leader until the follower holds the log's end. */
static void follow_all(psd *l, psd *f, uint64_t from, size_t max, int *answers)
{
    *answers = 0;
    while (from < srv_replog_end(l)) {
        from = fetch_one(l, f, from, max);
        (*answers)++;
    }
}

static void test_follower_equals_leader(void **state)
{
    (void)state;
    psd *l = busy_leader();
    psd *f = make_psd();
    int answers;
    assert_true(l->replog->dense_records >= 4); /* the INIT and three updates, marked */
    follow_all(l, f, 0, SIZE_MAX, &answers);
    assert_int_equal(answers, 1); /* the pushes between two fetches go once */
    assert_same(l, f);
    /* answers of at most 256 bytes of records (one record at least): the same state */
    psd *g = make_psd();
    follow_all(l, g, 0, 256, &answers);
    assert_true(answers > 1);
    assert_same(l, g);
    srv_replog_answer a;
    assert_int_equal(srv_replog_answer_make(l, srv_replog_end(l) + 1, 100, 1, &a), PS_ESTALE); /* past the end */
    free_psd(g);
    free_psd(f);
    free_psd(l);
}

/* n more table pushes of 16 keys to the leader's table 0. */
static void more_pushes(psd *l, int n, int salt)
{
    char err[256];
    for (int step = 0; step < n; step++) {
        uint8_t keys[8 * 16];
        float rg[16 * 4];
        for (int k = 0; k < 16; k++) {
            uint64_t key = (uint64_t)(k * 5 + step + salt);
            memcpy(keys + 8 * k, &key, 8);
            for (int j = 0; j < 4; j++)
                rg[k * 4 + j] = 0.001f * (float)((k + j + step) % 9) - 0.004f;
        }
        assert_int_equal(srv_update_rows(l, 0, keys, 16, rg, NULL, NULL, NULL, 0, err, sizeof err), 0);
    }
    srv_replog_flush(l);
}

/* The log in pieces (a bound of 16 KiB: pieces of 4 KiB): a follower that
 * fetches answers of at most 1 KiB, the log trimmed to its position after
 * each, ends with the leader's state; every position it fetches from starts
 * a record and the log's base never passes it; once it holds everything
 * the log is one empty piece. A follower left behind past the bound must
 * snapshot again, and the pieces before the log's middle go. */
static void test_log_in_pieces(void **state)
{
    (void)state;
    setenv("PSD_TEST_REPLOG_MAX_BYTES", "16384", 1);
    psd *l = busy_leader();
    unsetenv("PSD_TEST_REPLOG_MAX_BYTES");
    more_pushes(l, 200, 0);
    assert_true(l->replog->nseg > 10);
    srv_follower *fo = srv_replog_follower(l, "127.0.0.1:1");
    assert_non_null(fo);
    psd *f = make_psd();
    uint64_t from = 0;
    int answers = 0;
    while (from < srv_replog_end(l)) {
        assert_true(srv_replog_at_record(l, from));
        fo->pos = from = fetch_one(l, f, from, 1024);
        srv_replog_trim_held(l);
        assert_true(l->replog->base <= from);
        answers++;
    }
    assert_true(answers > 10);
    assert_same(l, f);
    assert_int_equal(l->replog->nseg, 1); /* held by every follower: one piece, empty, for the next records */
    assert_int_equal(l->replog->len, 0);
    /* a second follower far behind, past the bound */
    uint64_t base0 = l->replog->base;
    srv_follower *lag = srv_replog_follower(l, "127.0.0.1:2");
    assert_non_null(lag);
    lag->pos = base0;
    more_pushes(l, 200, 1000);
    uint64_t end = srv_replog_end(l);
    assert_true(end - base0 > 16384);
    fo->pos = end;
    srv_replog_trim(l);
    assert_int_equal(lag->pos, 0); /* it must take a snapshot again */
    assert_true(l->replog->base > base0 && l->replog->base <= base0 + (end - base0) / 2);
    assert_true(srv_replog_at_record(l, l->replog->base));
    assert_int_equal(srv_replog_end(l), end);
    srv_replog_answer a;
    assert_int_equal(srv_replog_answer_make(l, base0, 1024, 1, &a), PS_ESTALE); /* gone */
    free_psd(f);
    free_psd(l);
}

/* No record is ever moved (no copy but the one into the log): a follower
 * that holds all but the last record leaves that record where it was
 * written, and its bytes stay as they were. Each round: more table pushes
 * than a piece holds (4 KiB), then fetches up to the last record alone. */
static void test_log_never_moves_a_record(void **state)
{
    (void)state;
    setenv("PSD_TEST_REPLOG_MAX_BYTES", "16384", 1);
    psd *l = busy_leader();
    unsetenv("PSD_TEST_REPLOG_MAX_BYTES");
    srv_follower *fo = srv_replog_follower(l, "127.0.0.1:1");
    assert_non_null(fo);
    psd *f = make_psd();
    uint64_t from = 0;
    for (int round = 0; round < 20; round++) {
        uint64_t end0 = srv_replog_end(l);
        more_pushes(l, 11, 100 * round);
        uint64_t last = srv_replog_end(l);
        more_pushes(l, 1, 100 * round + 50);
        assert_true(srv_replog_end(l) - end0 > 4096);
        const uint8_t *at = srv_replog_at(l->replog, (size_t)(last - l->replog->base));
        size_t len = (size_t)(srv_replog_end(l) - last);
        uint8_t *was = malloc(len);
        assert_non_null(was);
        memcpy(was, at, len);
        while (from < last)
            from = fetch_one(l, f, from, (size_t)(last - from));
        assert_int_equal(from, last);
        fo->pos = from;
        srv_replog_trim_held(l);
        assert_true(l->replog->base <= last);
        assert_ptr_equal(srv_replog_at(l->replog, (size_t)(last - l->replog->base)), at);
        assert_memory_equal(at, was, len);
        free(was);
    }
    while (from < srv_replog_end(l))
        from = fetch_one(l, f, from, SIZE_MAX);
    assert_same(l, f);
    free_psd(f);
    free_psd(l);
}

/* One record: u32 len | kind | body. */
static size_t record(uint8_t *out, int kind, const void *body, uint32_t blen)
{
    uint32_t l = blen + 1;
    memcpy(out, &l, 4);
    out[4] = (uint8_t)kind;
    memcpy(out + 5, body, blen);
    return 5 + blen;
}

/* An answer's head (PROTOCOL.md 17) before n bytes of records at out + 36. */
static size_t head(uint8_t *out, uint64_t next, uint64_t version, uint32_t dense, size_t n)
{
    uint32_t h = (uint32_t)((36 + n + 3) & ~(size_t)3), init = 1, nst = 1, nbi = 0;
    memset(out + 36 + n, 0, h - 36 - n);
    memcpy(out, &h, 4), memcpy(out + 4, &next, 8), memcpy(out + 12, &version, 8), memcpy(out + 20, &init, 4);
    memcpy(out + 24, &dense, 4), memcpy(out + 28, &nst, 4), memcpy(out + 32, &nbi, 4);
    return h;
}

static int pushids;
static int count_pushid(psd *s, uint64_t cid, uint64_t pid)
{
    (void)s, (void)cid, (void)pid;
    pushids++;
    return 0;
}

static void test_lying_answers_are_refused(void **state)
{
    (void)state;
    psd *l = busy_leader();
    psd *f = make_psd();
    int answers;
    follow_all(l, f, 0, SIZE_MAX, &answers);
    /* one more update on the leader: a true answer to lie with */
    uint64_t from = srv_replog_end(l);
    float *g = calloc(N, sizeof *g);
    assert_non_null(g);
    g[7] = 1.0f;
    srv_grad gr = {.g = g, .has_gmax = 1, .gmax = 1.0f};
    assert_int_equal(srv_update_apply(l, &gr, 0, N, NULL), 0);
    srv_model_bump(&l->model);
    srv_replog_flush(l);
    free(g);
    uint64_t end = srv_replog_end(l), next, got = 0;
    size_t len, n;
    uint8_t *t = answer(l, from, SIZE_MAX, &len, &next);
    uint8_t *b = malloc(len);
    assert_non_null(b);
    char err[256];
    uint64_t version = f->model.version;
    psd *was = busy_leader(); /* the follower's state, to compare with */
    /* shorter than its head says */
    assert_int_equal(srv_replog_apply_answer(f, t, len - 4, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "says"));
    /* a head longer than the answer */
    memcpy(b, t, len);
    uint32_t big = (uint32_t)len + 4;
    memcpy(b, &big, 4);
    assert_int_equal(srv_replog_apply_answer(f, b, len, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    /* a position past the leader's end, or behind the fetch */
    memcpy(b, t, len);
    uint64_t lie = end + 100;
    memcpy(b + 4, &lie, 8);
    assert_int_equal(srv_replog_apply_answer(f, b, len, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "outside"));
    /* a model version behind the follower's */
    memcpy(b, t, len);
    lie = 1;
    memcpy(b + 12, &lie, 8);
    assert_int_equal(srv_replog_apply_answer(f, b, len, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "behind"));
    /* a block past the model's end */
    memcpy(b, t, len);
    uint32_t blk = 5;
    memcpy(b + 36, &blk, 4);
    assert_int_equal(srv_replog_apply_answer(f, b, len, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "block"));
    /* records that lie: a length past the bytes there are, a kind nobody
     * knows, a size their kind does not have, a table the follower lacks */
    uint8_t buf[4096], body[256];
    memset(body, 0, sizeof body);
    n = record(buf + 36, 'T', body, 16);
    uint32_t l32 = 1000;
    memcpy(buf + 36, &l32, 4);
    n = head(buf, from, version, 0, n);
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "bytes where"));
    n = head(buf, from, version, 0, record(buf + 36, 'Z', body, 8));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "unknown kind"));
    n = head(buf, from, version, 0, record(buf + 36, 'P', body, 12));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    /* a valid push id after a lying record: nothing applied, the push id neither */
    size_t k = record(buf + 36, 'P', body, 16);
    k += record(buf + 36 + k, 'Z', body, 4);
    n = head(buf, from, version, 0, k);
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, count_pushid, err, sizeof err),
                     PS_EMALFORMED);
    assert_int_equal(pushids, 0);
    n = head(buf, from, version, 0, record(buf + 36, 'P', body, 16)); /* the callback works */
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, count_pushid, err, sizeof err), 0);
    assert_int_equal(pushids, 1);
    got = 0;
    uint32_t ti = 5, rows = 0;
    memcpy(body, &ti, 4), memcpy(body + 4, &rows, 4);
    n = head(buf, from, version, 0, record(buf + 36, 'T', body, 16));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_ELAYOUT);
    /* optimizer settings of a leader of another release, or of another optimizer */
    uint8_t ob[SRV_OPTIM_SETTINGS_BYTES + 16];
    memset(ob, 0, sizeof ob);
    srv_optim_settings_pack(&l->model.opt, ob);
    memcpy(ob + SRV_OPTIM_SETTINGS_BYTES, "9.9.9", 5);
    n = head(buf, from, version, 0, record(buf + 36, 'O', ob, sizeof ob));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_ELAYOUT);
    assert_non_null(strstr(err, "release"));
    snprintf((char *)ob + SRV_OPTIM_SETTINGS_BYTES, 16, "%s", srv_replog_release());
    uint32_t adam = PS_OPTIMIZER_ADAM;
    memcpy(ob, &adam, 4);
    n = head(buf, from, version, 0, record(buf + 36, 'O', ob, sizeof ob));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_ELAYOUT);
    assert_non_null(strstr(err, "optimizer"));
    /* a gradient longer than its record */
    uint8_t gb[32 + 8];
    memset(gb, 0, sizeof gb);
    uint64_t gn = 3;
    memcpy(gb + 16, &gn, 8);
    n = head(buf, from, version, 0, record(buf + 36, 'G', gb, sizeof gb));
    assert_int_equal(srv_replog_apply_answer(f, buf, n, from, end, &got, NULL, err, sizeof err), PS_EMALFORMED);
    /* another optimizer: two state buffers where the follower keeps one */
    size_t big_len = 40 + ((size_t)3 << 20) * 4;
    uint8_t *o = calloc(1, big_len);
    assert_non_null(o);
    n = head(o, from, version + 1, 1, 4);
    uint32_t nst = 2, nbi = 1;
    memcpy(o + 28, &nst, 4), memcpy(o + 32, &nbi, 4);
    assert_int_equal(n, 40);
    assert_int_equal(srv_replog_apply_answer(f, o, big_len, from, end, &got, NULL, err, sizeof err), PS_ELAYOUT);
    assert_non_null(strstr(err, "optimizer"));
    free(o);
    /* nothing of it changed the follower */
    assert_int_equal(f->model.version, version);
    assert_int_equal(got, 0);
    assert_same(was, f);
    /* the true answer applies */
    assert_int_equal(srv_replog_apply_answer(f, t, len, from, end, &got, NULL, err, sizeof err), 0);
    assert_int_equal(got, end);
    assert_same(l, f);
    free(b);
    free(t);
    free_psd(was);
    free_psd(f);
    free_psd(l);
}

/* One dense step of the leader: gradient g of [off, off+n), as a worker
 * sent it (a log may carry it as it is) or not, then the version. */
static void dense_step(psd *l, const float *g, uint64_t off, uint64_t n, int as_sent)
{
    srv_grad gr = {.g = g, .has_gmax = 1, .gmax = 0.5f, .raw = g, .as_sent = as_sent};
    assert_int_equal(srv_update_apply(l, &gr, off, n, NULL), 0);
    srv_model_bump(&l->model);
    srv_replog_flush(l);
}

/* Follows the leader from *from to its end in answers of at most max bytes
 * of records, the leader told of each fetch (the follower's slot fs). */
static void fetch_all(psd *l, psd *f, srv_follower *fs, uint64_t *from, size_t max)
{
    while (*from < srv_replog_end(l)) {
        *from = fetch_one(l, f, *from, max);
        srv_replog_fetched(l, fs, *from, 0, 0);
    }
}

/* A leader and a follower, both with an update engine, the follower
 * registered in the leader's log (of the leader's release, as its fetches
 * say) at the log's end, *from. */
static srv_follower *pair_with_engines(psd **l, psd **f, uint64_t *from)
{
    *l = make_psd(), *f = make_psd();
    srv_update_init(*l, NULL);
    srv_update_init(*f, NULL);
    assert_int_equal(srv_replog_start(*l), 0);
    srv_follower *fs = srv_replog_follower(*l, "127.0.0.1:1");
    assert_non_null(fs);
    snprintf(fs->release, sizeof fs->release, "%s", srv_replog_release());
    *from = srv_replog_end(*l);
    srv_replog_fetched(*l, fs, *from, 0, 1);
    return fs;
}

/* Dense pushes as the workers sent them go into the log as their gradients
 * (`G`, the optimizer's settings in an `O` before them when they change),
 * which the follower applies through its own update engine: its
 * parameters and momentum are the leader's bit for bit. A push goes as
 * values instead while the follower has not fetched past a mark of values
 * (an answer would ship them as they are then, the push included), and
 * so does an update that is not a push as sent (a round's mean). */
static void test_gradients_are_replayed(void **state)
{
    (void)state;
    psd *l, *f;
    uint64_t from;
    srv_follower *fs = pair_with_engines(&l, &f, &from);
    init_model(l, -0.25f);
    char err[256];
    uint32_t ti = declare_table(l);
    float *g = malloc(N * sizeof *g);
    assert_non_null(g);
    int grads = 0;
    for (int step = 0; step < 12; step++) {
        for (uint64_t i = 0; i < N; i++)
            g[i] = (float)((i * 11 + (uint64_t)step * 5) % 17) / 17.0f - 0.5f;
        uint64_t before = l->replog->grad_records;
        if (step == 6) {
            set(l, "lr", "0.03"); /* psctl set: the leader's next gradient carries it */
            srv_optim_configure(&l->model.opt, &l->cfg);
        }
        /* step 4: an update that is not a push as sent; the others are */
        dense_step(l, g, step % 3 == 1 ? 2000 : 0, step % 3 == 1 ? 70000 : N, step != 4);
        int expect = step != 0 && step != 4 && step != 5; /* after a mark of values the follower holds */
        assert_int_equal(l->replog->grad_records - before, expect);
        grads += expect;
        uint8_t keys[8 * 16];
        float rg[16 * 4];
        for (int k = 0; k < 16; k++) {
            uint64_t key = (uint64_t)(k * 7 + step);
            memcpy(keys + 8 * k, &key, 8);
            for (int j = 0; j < 4; j++)
                rg[k * 4 + j] = 0.02f * (float)(k + j - step);
        }
        assert_int_equal(srv_update_rows(l, ti, keys, 16, rg, NULL, NULL, NULL, 0, err, sizeof err), 0);
        srv_replog_flush(l);
        if (step != 4) /* two steps between two fetches once: the second a push after a mark of values */
            fetch_all(l, f, fs, &from, step % 2 ? 256 : SIZE_MAX);
    }
    /* a follower of another release (or one that did not say) gets values */
    snprintf(fs->release, sizeof fs->release, "%s", "0.0.9");
    uint64_t before = l->replog->grad_records;
    dense_step(l, g, 0, N, 1);
    assert_int_equal(l->replog->grad_records, before);
    fetch_all(l, f, fs, &from, SIZE_MAX);
    free(g);
    assert_int_equal(l->replog->grad_records, (uint64_t)grads);
    assert_same(l, f);
    assert_true(f->model.opt.lr == 0.03);
    free_psd(f);
    free_psd(l);
}

/* A follower behind by several pushes that went as gradients catches up
 * through answers made after all of them, one gradient an answer: each
 * answer says the version of the last mark it passes (a version alone, after
 * a gradient), not the leader's as the answer is made, which would put the
 * follower ahead of the gradients still to come (it then refused them and
 * stopped following). */
static void test_a_follower_behind_catches_up_through_gradients(void **state)
{
    (void)state;
    psd *l, *f;
    uint64_t from;
    srv_follower *fs = pair_with_engines(&l, &f, &from);
    init_model(l, 0.5f);
    (void)declare_table(l); /* assert_same compares the tables too */
    fetch_all(l, f, fs, &from, SIZE_MAX); /* past the initial values' mark */
    float *g = malloc(N * sizeof *g);
    assert_non_null(g);
    uint64_t before = l->replog->grad_records;
    for (int step = 0; step < 6; step++) {
        for (uint64_t i = 0; i < N; i++)
            g[i] = (float)((i * 7 + (uint64_t)step * 3) % 13) / 13.0f - 0.5f;
        dense_step(l, g, 0, N, 1);
    }
    assert_int_equal(l->replog->grad_records - before, 6); /* all six as gradients */
    uint64_t version = f->model.version;
    while (from < srv_replog_end(l)) {
        from = fetch_one(l, f, from, 256);
        /* at most one gradient an answer (the first holds the optimizer's
         * settings alone): at most one version further */
        assert_true(f->model.version == version || f->model.version == version + 1);
        version = f->model.version;
        srv_replog_fetched(l, fs, from, 0, 0);
    }
    assert_int_equal(version, l->model.version);
    assert_same(l, f);
    free(g);
    free_psd(f);
    free_psd(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follower_equals_leader),
        cmocka_unit_test(test_log_in_pieces),
        cmocka_unit_test(test_log_never_moves_a_record),
        cmocka_unit_test(test_lying_answers_are_refused),
        cmocka_unit_test(test_gradients_are_replayed),
        cmocka_unit_test(test_a_follower_behind_catches_up_through_gradients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
