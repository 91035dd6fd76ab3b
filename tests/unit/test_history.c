/* test_history.c - unit tests for server/history.c: the bounded series,
 * the event ring and their JSON, CSV and table forms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/record/history.h"

static const char *const cols2[] = {"a", "b"};

static void add2(srv_series *s, double t, uint64_t v, double a, double b)
{
    double vals[2] = {a, b};
    srv_series_add(s, t, v, vals);
}

/* Until the series is full every sample is a point of its own. */
static void test_series_fills(void **state)
{
    (void)state;
    srv_series s;
    assert_int_equal(srv_series_init(&s, 2, cols2), 0);
    assert_int_equal(srv_series_count(&s), 0);
    for (unsigned i = 0; i < SRV_SERIES_POINTS; i++)
        add2(&s, i * 0.5, i * 10, i, -(double)i);
    assert_int_equal(srv_series_count(&s), SRV_SERIES_POINTS);
    assert_int_equal(s.stride, 1);
    double t, vals[2];
    uint64_t ver;
    srv_series_get(&s, 7, &t, &ver, vals);
    assert_true(t == 3.5);
    assert_int_equal(ver, 70);
    assert_true(vals[0] == 7 && vals[1] == -7);
    srv_series_free(&s);
}

/* Past the bound, pairs merge: the series never holds more than
 * SRV_SERIES_POINTS (+1 being filled), still starts at the run's start, ends
 * at its last sample, and each point is the mean of the samples it stands
 * for. */
static void test_series_thins(void **state)
{
    (void)state;
    srv_series s;
    assert_int_equal(srv_series_init(&s, 2, cols2), 0);
    double *t0 = s.t, *v0 = s.v;
    unsigned total = 10 * SRV_SERIES_POINTS + 3;
    for (unsigned i = 0; i < total; i++) {
        add2(&s, i, i, i, 1.0);
        assert_true(srv_series_count(&s) <= SRV_SERIES_POINTS + 1);
    }
    /* 10 x the bound: halved 4 times (2, 4, 8, 16 samples a point) */
    assert_int_equal(s.stride, 16);
    assert_ptr_equal(s.t, t0); /* fixed memory: nothing reallocated */
    assert_ptr_equal(s.v, v0);
    assert_int_equal(s.n, total / 16);
    double t, vals[2];
    uint64_t ver;
    for (unsigned i = 0; i < s.n; i++) {
        srv_series_get(&s, i, &t, &ver, vals);
        /* point i holds samples 16i .. 16i+15: their mean and the last time */
        assert_true(t == 16.0 * i + 15);
        assert_int_equal(ver, 16 * i + 15);
        assert_true(fabs(vals[0] - (16.0 * i + 7.5)) < 1e-9);
        assert_true(vals[1] == 1.0);
    }
    /* the last point shown is the one being filled: the newest sample's time */
    unsigned n = srv_series_count(&s);
    assert_int_equal(n, s.n + 1);
    srv_series_get(&s, n - 1, &t, &ver, vals);
    assert_true(t == total - 1);
    unsigned pend_first = s.n * 16;
    double mean = 0;
    for (unsigned i = pend_first; i < total; i++)
        mean += i;
    mean /= total - pend_first;
    assert_true(fabs(vals[0] - mean) < 1e-9);
    srv_series_free(&s);
}

/* Missing values (NaN) are left out of means, and a point with none is
 * missing itself. */
static void test_series_missing(void **state)
{
    (void)state;
    srv_series s;
    assert_int_equal(srv_series_init(&s, 2, cols2), 0);
    for (unsigned i = 0; i < SRV_SERIES_POINTS; i++)
        add2(&s, i, i, i % 2 ? NAN : 4.0, NAN);
    add2(&s, 1000, 1000, 8.0, NAN); /* full: halves */
    assert_int_equal(s.stride, 2);
    double t, vals[2];
    uint64_t ver;
    srv_series_get(&s, 0, &t, &ver, vals);
    assert_true(vals[0] == 4.0);
    assert_true(isnan(vals[1]));
    srv_series_free(&s);
}

static void test_series_bad_columns(void **state)
{
    (void)state;
    srv_series s;
    assert_int_equal(srv_series_init(&s, 0, cols2), PS_EINVAL);
    assert_int_equal(srv_series_init(&s, SRV_SERIES_COLS_MAX + 1, cols2), PS_EINVAL);
}

/* The ring keeps the newest SRV_EVENTS_MAX events, oldest first. */
static void test_events_ring(void **state)
{
    (void)state;
    srv_history *h = srv_history_new();
    assert_non_null(h);
    for (unsigned i = 0; i < SRV_EVENTS_MAX + 44; i++)
        srv_history_event(h, i, i, "joined", "event %u", i);
    assert_int_equal(h->ev_n, SRV_EVENTS_MAX);
    assert_int_equal(h->events_dropped, 44);
    assert_string_equal(h->ev[h->ev_first].text, "event 44");
    /* a long text is cut, not overrun */
    char longtext[400];
    memset(longtext, 'x', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = '\0';
    srv_history_event(h, 1, 1, "settings", "%s", longtext);
    const srv_event *last = &h->ev[(h->ev_first + h->ev_n - 1) % SRV_EVENTS_MAX];
    assert_int_equal(strlen(last->text), SRV_EVENT_TEXT - 1);
    srv_history_free(h);
}

static void test_workers(void **state)
{
    (void)state;
    srv_history *h = srv_history_new();
    assert_non_null(h);
    srv_worker_hist *w = srv_history_worker(h, 3);
    assert_non_null(w);
    assert_ptr_equal(srv_history_worker(h, 3), w);
    assert_null(srv_history_worker(h, SRV_HISTORY_SHARDS));
    srv_history_free(h);
}

/* A table's series: found again by place and name; another table at the
 * same place starts a new series; JSON and CSV carry it. */
static void test_tables(void **state)
{
    (void)state;
    srv_history *h = srv_history_new();
    assert_non_null(h);
    srv_table_hist *t = srv_history_table(h, 2, "emb");
    assert_non_null(t);
    assert_ptr_equal(srv_history_table(h, 2, "emb"), t);
    assert_null(srv_history_table(h, PS_TABLES_MAX, "x"));
    double v[SRV_HT_COLS] = {100, 8192, 50, 25};
    srv_series_add(&t->s, 1.0, 3, v);
    assert_int_equal(srv_series_count(&t->s), 1);
    srv_table_hist *u = srv_history_table(h, 2, "other");
    assert_non_null(u);
    assert_string_equal(u->name, "other");
    assert_int_equal(srv_series_count(&u->s), 0); /* a new table: a new series */
    srv_series_add(&u->s, 2.0, 4, v);

    ps_buf b = {0};
    assert_int_equal(srv_history_write(h, SRV_HFMT_JSON, &b), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = '\0';
    assert_non_null(strstr((const char *)b.p, "\"tables\": [{\"name\": \"other\", \"series\": {\"stride\": 1, "
                                              "\"t\": [2.000], \"version\": [4], \"rows\": [100], \"bytes\": [8192], "
                                              "\"rows_pulled_per_second\": [50], \"rows_pushed_per_second\": [25]}}]"));
    b.len = 0;
    assert_int_equal(srv_history_write(h, SRV_HFMT_CSV, &b), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = '\0';
    assert_non_null(strstr((const char *)b.p, "\ntable,other,2.000,4,rows_pushed_per_second,25\n"));
    ps_buf_free(&b);
    srv_history_free(h);
}

/* The three forms carry the same points and events. */
static void test_write(void **state)
{
    (void)state;
    srv_history *h = srv_history_new();
    assert_non_null(h);
    double p[SRV_H_COLS] = {10, 11, 1000, 2000, 0.05, NAN, NAN};
    srv_series_add(&h->psd, 1.0, 5, p);
    srv_worker_hist *w = srv_history_worker(h, 1);
    double tr[3] = {0.25, 900, 64};
    srv_series_add(&w->train, 1.5, 6, tr);
    srv_history_event(h, 2.0, 7, "settings", "lr: 0.05 -> \"0.01\"\n");

    ps_buf b = {0};
    assert_int_equal(srv_history_write(h, SRV_HFMT_JSON, &b), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = '\0';
    const char *j = (const char *)b.p;
    assert_non_null(strstr(j, "\"psd\": {\"stride\": 1, \"t\": [1.000], \"version\": [5], \"pushes_per_second\": [10]"));
    assert_non_null(strstr(j, "\"round_seconds_p50\": [null]"));
    assert_non_null(strstr(j, "{\"shard\": 1, \"train\": {\"stride\": 1, \"t\": [1.500], \"version\": [6], \"loss\": [0.25]"));
    assert_non_null(strstr(j, "\"eval\": {\"stride\": 1, \"t\": [], \"version\": [], \"accuracy\": [], \"test_loss\": []}"));
    assert_non_null(strstr(j, "\"kind\": \"settings\", \"text\": \"lr: 0.05 -> \\\"0.01\\\"\\u000a\""));

    b.len = 0;
    assert_int_equal(srv_history_write(h, SRV_HFMT_CSV, &b), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = '\0';
    const char *c = (const char *)b.p;
    assert_true(strncmp(c, "series,shard,t,version,column,value\n", 36) == 0);
    assert_non_null(strstr(c, "\npsd,,1.000,5,lr,0.05\n"));
    assert_non_null(strstr(c, "\npsd,,1.000,5,round_seconds_p99,\n"));
    assert_non_null(strstr(c, "\ntrain,1,1.500,6,loss,0.25\n"));
    assert_non_null(strstr(c, "\nevent,,2.000,7,settings,\"lr: 0.05 -> \"\"0.01\"\"\n\"\n"));

    b.len = 0;
    assert_int_equal(srv_history_write(h, SRV_HFMT_TABLE, &b), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = '\0';
    assert_non_null(strstr((const char *)b.p, "train      1      1.500         6  loss                 0.25\n"));
    ps_buf_free(&b);
    srv_history_free(h);
}

/* Quantiles of a histogram's bucket counts, as histogram_quantile. */
static void test_bucket_quantile(void **state)
{
    (void)state;
    const double bounds[] = {0.001, 0.01, 0.1};
    uint64_t none[4] = {0, 0, 0, 0};
    assert_true(isnan(srv_bucket_quantile(bounds, 3, none, 0.5)));
    /* 10 observations in (0.001, 0.01]: the median halfway through it */
    uint64_t one[4] = {0, 10, 0, 0};
    assert_true(fabs(srv_bucket_quantile(bounds, 3, one, 0.5) - 0.0055) < 1e-12);
    assert_true(fabs(srv_bucket_quantile(bounds, 3, one, 0.99) - (0.001 + 0.009 * 0.99)) < 1e-12);
    /* 90 fast ones and 10 past the last bound: p50 in the first bucket,
     * p99 at the last bound */
    uint64_t tail[4] = {90, 0, 0, 10};
    assert_true(fabs(srv_bucket_quantile(bounds, 3, tail, 0.5) - 0.001 * 50 / 90) < 1e-12);
    assert_true(srv_bucket_quantile(bounds, 3, tail, 0.99) == 0.1);
    /* empty buckets between are skipped */
    uint64_t gap[4] = {1, 0, 1, 0};
    assert_true(fabs(srv_bucket_quantile(bounds, 3, gap, 1.0) - 0.1) < 1e-12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_series_fills),   cmocka_unit_test(test_series_thins),
        cmocka_unit_test(test_series_missing), cmocka_unit_test(test_series_bad_columns),
        cmocka_unit_test(test_events_ring),    cmocka_unit_test(test_workers),
        cmocka_unit_test(test_write),          cmocka_unit_test(test_bucket_quantile),
        cmocka_unit_test(test_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
