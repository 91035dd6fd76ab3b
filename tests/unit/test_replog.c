/* test_replog.c - the replication log (server/replog/replog.c), without
 * sockets: a leader psd's updates, table declarations and table pushes are
 * recorded; a follower psd that applies the log's bytes holds the leader's
 * dense parameters, optimizer state, version, tables and rows bit for bit;
 * records that lie about their length, their kind, their size or the
 * follower's layout are refused with a reason, and change nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/policy/policy.h"
#include "server/replog/replog.h"
#include "server/store/psd.h"
#include "server/tables/sparse_optim.h"
#include "server/update/update.h"

#define N 300000 /* parameters: more than one dense record's piece (2^18) */

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

/* A leader with a log, a model of N values and a table, changed a few times. */
static psd *busy_leader(void)
{
    psd *s = make_psd();
    assert_int_equal(srv_replog_start(s), 0);
    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {N};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    srv_model_propose(&s->model, &l);
    assert_int_equal(srv_model_commit(&s->model, &s->cfg), 0);
    srv_model_mark(&s->model, 0, N);
    for (uint64_t i = 0; i < N; i++) { /* an INIT */
        srv_wseg seg;
        assert_int_equal(srv_model_write_begin(&s->model, i, 1, &seg), 0);
        seg.wo[0] = (float)i / N;
        srv_model_write_end(&s->model, &seg);
    }
    srv_model_set_initialized(&s->model, 0);
    srv_replog_flush(s);
    ps_table_def d = table_def();
    uint32_t ti;
    char err[256];
    assert_int_equal(srv_tables_declare(&s->tables, &d, &ti, err, sizeof err), 0);
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

static void test_follower_equals_leader(void **state)
{
    (void)state;
    psd *l = busy_leader();
    psd *f = make_psd();
    size_t len;
    const uint8_t *p = srv_replog_read(l, 0, SIZE_MAX, &len);
    assert_non_null(p);
    assert_int_equal(len, srv_replog_end(l));
    assert_true(l->replog->dense_records >= 2); /* the whole model, in pieces */
    char err[256] = "";
    int rc = srv_replog_apply(f, p, len, NULL, err, sizeof err);
    if (rc != 0)
        fail_msg("apply: %s", err);
    assert_same(l, f);
    /* read in fetches of at most 64 KiB: whole records each, the same state */
    psd *g = make_psd();
    for (uint64_t at = 0; at < srv_replog_end(l);) {
        const uint8_t *q = srv_replog_read(l, at, 65536, &len);
        assert_non_null(q);
        assert_true(len > 0);
        assert_int_equal(srv_replog_apply(g, q, len, NULL, err, sizeof err), 0);
        at += len;
    }
    assert_same(l, g);
    assert_null(srv_replog_read(l, srv_replog_end(l) + 1, 100, &len)); /* past the end */
    free_psd(g);
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

static void test_lying_records_are_refused(void **state)
{
    (void)state;
    psd *l = busy_leader();
    psd *f = make_psd();
    size_t len;
    const uint8_t *p = srv_replog_read(l, 0, SIZE_MAX, &len);
    char err[256];
    assert_int_equal(srv_replog_apply(f, p, len, NULL, err, sizeof err), 0);
    uint64_t version = f->model.version;
    float first = *srv_model_at(&f->model, 0, 1, &len);
    uint8_t buf[4096], body[256];
    memset(body, 0, sizeof body);
    /* a length past the bytes there are */
    size_t n = record(buf, 'T', body, 16);
    uint32_t lie = 1000;
    memcpy(buf, &lie, 4);
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "bytes where"));
    /* a kind nobody knows */
    n = record(buf, 'Z', body, 8);
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_EMALFORMED);
    assert_non_null(strstr(err, "unknown kind"));
    /* a dense record whose size does not match its n */
    uint64_t v = 99, off = 0, cnt = 10;
    uint32_t init = 1, nst = 1;
    memcpy(body, &v, 8), memcpy(body + 8, &init, 4), memcpy(body + 12, &off, 8), memcpy(body + 20, &cnt, 8);
    memcpy(body + 28, &nst, 4);
    n = record(buf, 'D', body, 32 + 4 * 10); /* state missing */
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_EMALFORMED);
    /* ... or a range outside the model */
    off = N;
    memcpy(body + 12, &off, 8);
    n = record(buf, 'D', body, 32 + 8 * 10);
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_EMALFORMED);
    /* another optimizer: two state buffers where the follower keeps one */
    off = 0, nst = 2;
    memcpy(body + 12, &off, 8), memcpy(body + 28, &nst, 4);
    n = record(buf, 'D', body, 32 + 12 * 10);
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_ELAYOUT);
    assert_non_null(strstr(err, "optimizer"));
    /* a push to a table the follower does not have */
    uint32_t ti = 5, rows = 0;
    memset(body, 0, 16);
    memcpy(body, &ti, 4), memcpy(body + 4, &rows, 4);
    n = record(buf, 'T', body, 16);
    assert_int_equal(srv_replog_apply(f, buf, n, NULL, err, sizeof err), PS_ELAYOUT);
    /* nothing of it changed the follower */
    assert_int_equal(f->model.version, version);
    assert_true(*srv_model_at(&f->model, 0, 1, &len) == first);
    assert_same(l, f);
    /* zero bytes after the records are padding */
    memset(buf, 0, 16);
    assert_int_equal(srv_replog_apply(f, buf, 16, NULL, err, sizeof err), 0);
    free_psd(f);
    free_psd(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follower_equals_leader),
        cmocka_unit_test(test_lying_records_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
