/* test_tapply.c - the apply threads of table_apply = hogwild
 * (server/update/tapply.c) and the loop's half of their pushes
 * (srv_tables_pin in server/tables/table.c).
 *
 * Several streams of pushes, each with one push in flight at a time as a
 * connection has in psd (its next push queued from the done callback),
 * run on a pool of 4 threads:
 * - streams on distinct keys: every row ends at exactly P SGD steps;
 * - streams on the same keys: no row lost, every value a whole number of
 *   steps between one stream's and all streams' (steps may be lost: the
 *   point of Hogwild!), every push counted;
 * - streams making new rows at every push under a table cap with eviction,
 *   and under expiry: rows are removed while other pushes are in flight
 *   (the loop drains the threads first), and every stored row is exactly a
 *   whole number of steps, the same in each of its values (no torn row);
 * - a step that would not be finite leaves its row and is reported, the
 *   push's other rows applied; a push past max_table_memory is refused at
 *   once with nothing queued; freeing the pool hands back every queued push.
 * Clean under ThreadSanitizer too (a build with -fsanitize=thread: the
 * only races allowed are those on the rows' floats). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/msg.h"
#include "proto/table.h"
#include "server/tables/sparse_optim.h"
#include "server/tables/table.h"
#include "server/update/tapply.h"

#define THREADS 4
#define STREAMS 4
#define DIM 8
#define MAXKEYS 256

static char err[512];

typedef struct stream {
    uint64_t keys[MAXKEYS];
    uint32_t nkeys;
    uint32_t pushed, done, target;
    int fresh_each;          /* a push adds nkeys new keys after the first ones */
    uint32_t hot;            /* keys pushed every time (the first hot of keys) */
} stream;

typedef struct run {
    uv_loop_t loop;
    uv_timer_t guard;
    srv_tables ts;
    uint32_t ti;
    srv_tapply *p;
    stream st[STREAMS];
    uint32_t nstreams;
    uint32_t finished;       /* streams done */
    uint32_t results, refused;
    int timed_out;
    float g[MAXKEYS * DIM];
} run;

static void keys_le(uint8_t *out, const uint64_t *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            out[8 * i + b] = (uint8_t)(k[i] >> (8 * b));
}

static void setup_run(run *r, uint64_t max_bytes, const srv_table_bounds *b)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(uv_loop_init(&r->loop), 0);
    srv_tables_init(&r->ts, max_bytes);
    if (b)
        srv_tables_set_bounds(&r->ts, b);
    ps_table_def d;
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR;
    hp.v[PS_HP_LR] = 0.5;
    assert_int_equal(ps_table_def_make(&d, "emb", DIM, "zeros", 0, 0, 7, "sgd", &hp, err, sizeof err), 0);
    assert_int_equal(srv_tables_declare(&r->ts, &d, &r->ti, err, sizeof err), 0);
    for (int i = 0; i < MAXKEYS * DIM; i++)
        r->g[i] = 1.0f;
}

static void submit(run *r, uint32_t s);

static void on_done(void *arg, const srv_tapply_tag *tag, const srv_tapply_result *res)
{
    run *r = arg;
    stream *st = &r->st[tag->id];
    r->results++;
    if (res->rc != 0)
        r->refused++;
    st->done++;
    if (st->pushed < st->target)
        submit(r, (uint32_t)tag->id);
    else if (++r->finished == r->nstreams)
        uv_timer_stop(&r->guard);
}

/* Stream s's next push: its keys (and, fresh_each, keys no push had). */
static void submit(run *r, uint32_t s)
{
    stream *st = &r->st[s];
    uint64_t k[MAXKEYS];
    uint32_t n = st->nkeys;
    memcpy(k, st->keys, sizeof(uint64_t) * n);
    if (st->fresh_each)
        for (uint32_t i = st->hot; i < n; i++)
            k[i] = ((uint64_t)(s + 1) << 40) + (uint64_t)st->pushed * MAXKEYS + i;
    uint8_t kb[MAXKEYS * 8];
    keys_le(kb, k, n);
    srv_tapply_tag tag = {.id = s, .type = PS_MSG_TPUSH, .ti = r->ti};
    st->pushed++;
    int rc = srv_tapply_push(r->p, &r->ts, r->ti, kb, n, r->g, &tag, NULL, 0, err, sizeof err);
    if (rc != 1)
        fail_msg("push %u of stream %u: %d %s", st->pushed, s, rc, err);
}

static void on_guard(uv_timer_t *t)
{
    run *r = t->data;
    r->timed_out = 1;
}

/* Starts the pool, one push per stream, and runs the loop until every
 * stream has made its pushes (30 s at most). */
static void go(run *r)
{
    r->p = srv_tapply_new(&r->loop, THREADS, on_done, r, err, sizeof err);
    assert_non_null(r->p);
    uv_timer_init(&r->loop, &r->guard);
    r->guard.data = r;
    uv_timer_start(&r->guard, on_guard, 30000, 0);
    for (uint32_t s = 0; s < r->nstreams; s++)
        submit(r, s);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    assert_false(r->timed_out);
    assert_int_equal(srv_tapply_pending(r->p), 0);
}

static void finish(run *r)
{
    srv_tapply_free(r->p);
    uv_close((uv_handle_t *)&r->guard, NULL);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&r->loop), 0);
    srv_tables_free(&r->ts);
}

/* The value of every weight of a row of zeros after m SGD steps of
 * gradient 1 at lr 0.5. */
static float after(uint32_t m)
{
    return -0.5f * (float)m;
}

static void test_distinct_keys_exact(void **state)
{
    (void)state;
    static run r;
    setup_run(&r, 1ull << 30, NULL);
    r.nstreams = STREAMS;
    for (uint32_t s = 0; s < STREAMS; s++) {
        r.st[s].nkeys = MAXKEYS;
        r.st[s].target = 200;
        for (uint32_t i = 0; i < MAXKEYS; i++)
            r.st[s].keys[i] = ((uint64_t)s << 32) ^ (0x9e3779b97f4a7c15ull * (i + 1));
    }
    go(&r);
    assert_int_equal(r.results, STREAMS * 200);
    assert_int_equal(r.refused, 0);
    srv_table_stats st;
    srv_tables_stats(&r.ts, r.ti, &st);
    assert_int_equal(st.rows, STREAMS * MAXKEYS);
    assert_int_equal(st.rows_pushed, (uint64_t)STREAMS * 200 * MAXKEYS);
    for (uint32_t s = 0; s < STREAMS; s++)
        for (uint32_t i = 0; i < MAXKEYS; i++) {
            const float *row = srv_tables_row(&r.ts, r.ti, r.st[s].keys[i]);
            assert_non_null(row);
            for (int j = 0; j < DIM; j++)
                if (row[j] != after(200))
                    fail_msg("stream %u key %u value %d: %g, want %g", s, i, j, row[j], after(200));
        }
    finish(&r);
}

/* 1 when every weight of row is after(m) for one whole m in lo..hi. */
static int whole_steps(const float *row, uint32_t lo, uint32_t hi, int same)
{
    for (int j = 0; j < DIM; j++) {
        float m = row[j] / -0.5f;
        if (m != floorf(m) || m < (float)lo || m > (float)hi || (same && row[j] != row[0]))
            return 0;
    }
    return 1;
}

static void test_shared_keys_no_row_lost(void **state)
{
    (void)state;
    static run r;
    setup_run(&r, 1ull << 30, NULL);
    r.nstreams = STREAMS;
    for (uint32_t s = 0; s < STREAMS; s++) {
        r.st[s].nkeys = 64;
        r.st[s].target = 300;
        for (uint32_t i = 0; i < 64; i++)
            r.st[s].keys[i] = 1000 + i; /* the same keys in every stream */
    }
    go(&r);
    assert_int_equal(r.results, STREAMS * 300);
    srv_table_stats st;
    srv_tables_stats(&r.ts, r.ti, &st);
    assert_int_equal(st.rows, 64);
    assert_int_equal(st.rows_pushed, (uint64_t)STREAMS * 300 * 64);
    uint32_t lost_somewhere = 0;
    for (uint32_t i = 0; i < 64; i++) {
        const float *row = srv_tables_row(&r.ts, r.ti, 1000 + i);
        assert_non_null(row);
        /* a row may lose steps to a race, never gain one; each of its
         * values is some thread's whole write */
        if (!whole_steps(row, 300, STREAMS * 300, 0))
            fail_msg("key %u: %g is not a whole number of steps in 300..%u", 1000 + i, row[0], STREAMS * 300);
        lost_somewhere += row[0] != after(STREAMS * 300);
    }
    print_message("shared keys: %u of 64 rows lost a step to a race\n", lost_somewhere);
    finish(&r);
}

/* New rows at every push, under a cap that evicts (bounds b): rows move
 * while other pushes are in flight. */
static void churn(const srv_table_bounds *b, uint64_t max_bytes)
{
    static run r;
    setup_run(&r, max_bytes, b);
    r.nstreams = STREAMS;
    for (uint32_t s = 0; s < STREAMS; s++) {
        r.st[s].nkeys = 96;
        r.st[s].hot = 32;
        r.st[s].fresh_each = 1;
        r.st[s].target = 150;
        for (uint32_t i = 0; i < 32; i++)
            r.st[s].keys[i] = ((uint64_t)(s + 100) << 40) + i;
    }
    go(&r);
    assert_int_equal(r.results, STREAMS * 150);
    assert_int_equal(r.refused, 0);
    srv_table_stats st;
    srv_tables_stats(&r.ts, r.ti, &st);
    assert_int_equal(st.rows_pushed, (uint64_t)STREAMS * 150 * 96);
    assert_true(st.evicted + st.expired > 0);
    /* the hot rows of each stream (one push of it in flight at a time: no
     * race) are whole steps, the same in every value; a new row one step */
    uint64_t stored = 0;
    for (uint32_t s = 0; s < STREAMS; s++)
        for (uint32_t i = 0; i < 150 * MAXKEYS; i++) {
            uint64_t key = i < 32 ? ((uint64_t)(s + 100) << 40) + i : ((uint64_t)(s + 1) << 40) + i;
            const float *row = srv_tables_row(&r.ts, r.ti, key);
            if (!row)
                continue;
            stored++;
            if (!whole_steps(row, 1, i < 32 ? 150 : 1, 1))
                fail_msg("stream %u key %llu: a torn or wrong row (%g, %g)", s, (unsigned long long)key, row[0],
                         row[DIM - 1]);
        }
    assert_int_equal(stored, st.rows);
    print_message("churn: %llu rows stored, %llu evicted, %llu expired\n", (unsigned long long)st.rows,
                  (unsigned long long)st.evicted, (unsigned long long)st.expired);
    finish(&r);
}

static void test_eviction_while_in_flight(void **state)
{
    (void)state;
    srv_table_bounds b = {.table_bytes = 1u << 20, .full = PS_TABLE_FULL_EVICT};
    churn(&b, 1ull << 30);
}

static void test_expiry_while_in_flight(void **state)
{
    (void)state;
    srv_table_bounds b = {.expire = 40};
    churn(&b, 1ull << 30);
}

static int single_rc;
static srv_tapply_result single;
static void on_single(void *arg, const srv_tapply_tag *tag, const srv_tapply_result *res)
{
    (void)arg;
    (void)tag;
    single = *res;
    single_rc++;
}

static void stop_timer(uv_timer_t *t)
{
    uv_timer_stop(t);
}

/* Runs the loop until on_single has been called `want` times (10 s at
 * most: a timer keeps the loop alive, as psd's listener does). */
static void wait_single(uv_loop_t *loop, srv_tapply *p, int want)
{
    (void)p;
    uv_timer_t t;
    uv_timer_init(loop, &t);
    uv_timer_start(&t, stop_timer, 10000, 0);
    while (single_rc < want && uv_is_active((uv_handle_t *)&t))
        uv_run(loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    assert_int_equal(single_rc, want);
}

static void test_nonfinite_row_left(void **state)
{
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    srv_tables ts;
    srv_tables_init(&ts, 1ull << 30);
    ps_table_def d;
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR;
    hp.v[PS_HP_LR] = 1.0;
    assert_int_equal(ps_table_def_make(&d, "t", 2, "zeros", 0, 0, 1, "sgd", &hp, err, sizeof err), 0);
    uint32_t ti;
    assert_int_equal(srv_tables_declare(&ts, &d, &ti, err, sizeof err), 0);
    srv_tapply *p = srv_tapply_new(&loop, 2, on_single, NULL, err, sizeof err);
    assert_non_null(p);
    uint64_t k[2] = {5, 6};
    uint8_t kb[16];
    keys_le(kb, k, 2);
    float g[4] = {FLT_MAX, FLT_MAX, 1.0f, 1.0f};
    srv_tapply_tag tag = {.type = PS_MSG_TPUSH};
    single_rc = 0;
    assert_int_equal(srv_tapply_push(p, &ts, ti, kb, 2, g, &tag, NULL, 0, err, sizeof err), 1);
    wait_single(&loop, p, 1);
    assert_int_equal(single.rc, 0);
    assert_int_equal(single.rows, 2);
    /* key 5 at -FLT_MAX: another step overflows */
    uint8_t pk[8];
    keys_le(pk, &k[1], 1);
    assert_int_equal(srv_tapply_push(p, &ts, ti, kb, 2, g, &tag, pk, 1, err, sizeof err), 1);
    wait_single(&loop, p, 2);
    assert_int_equal(single.rc, PS_ENONFINITE);
    assert_int_equal(single.refused, 1);
    assert_int_equal(single.rows, 1);
    assert_int_equal(single.bad_key, 5);
    assert_int_equal(single.npk, 1);
    assert_memory_equal(single.pkeys, pk, 8);
    const float *r5 = srv_tables_row(&ts, ti, 5), *r6 = srv_tables_row(&ts, ti, 6);
    assert_true(r5[0] == -FLT_MAX && r5[1] == -FLT_MAX); /* left as it was */
    assert_true(r6[0] == -2.0f && r6[1] == -2.0f);       /* applied */

    /* past max_table_memory: refused on the loop, nothing queued */
    srv_tables_set_limit(&ts, 65536);
    uint64_t many[512];
    uint8_t mb[512 * 8];
    float mg[512 * 2] = {0};
    for (int i = 0; i < 512; i++)
        many[i] = 100000 + (uint64_t)i;
    keys_le(mb, many, 512);
    assert_int_equal(srv_tapply_push(p, &ts, ti, mb, 512, mg, &tag, NULL, 0, err, sizeof err), PS_ELIMIT);
    assert_non_null(strstr(err, "max_table_memory"));
    assert_int_equal(srv_tapply_pending(p), 0);
    assert_null(srv_tables_row(&ts, ti, 100000));

    /* freeing hands back every push still queued */
    srv_tables_set_limit(&ts, 1ull << 30);
    for (int i = 0; i < 50; i++)
        assert_int_equal(srv_tapply_push(p, &ts, ti, mb, 512, mg, &tag, NULL, 0, err, sizeof err), 1);
    srv_tapply_free(p);
    assert_int_equal(single_rc, 52);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
    srv_tables_free(&ts);
}

static void test_threads_setting(void **state)
{
    (void)state;
    assert_int_equal(srv_tapply_threads(3), 3);
    int n = srv_tapply_threads(0);
    assert_true(n >= 1 && n <= 8);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_null(srv_tapply_new(&loop, 0, on_single, NULL, err, sizeof err));
    assert_non_null(strstr(err, "1..64"));
    assert_null(srv_tapply_new(&loop, 65, on_single, NULL, err, sizeof err));
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distinct_keys_exact),
        cmocka_unit_test(test_shared_keys_no_row_lost),
        cmocka_unit_test(test_eviction_while_in_flight),
        cmocka_unit_test(test_expiry_while_in_flight),
        cmocka_unit_test(test_nonfinite_row_left),
        cmocka_unit_test(test_threads_setting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
