/* test_policy.c - the consistency policies (server/policy.c) and the update
 * engine under them (server/update.c), linked from psd's core library and
 * driven without sockets: a psd with a model, workers and a fake clock
 * (psd.clock). Each policy only decides, so its answers are return values:
 * ASGD scales a stale push; BSP closes a round when every live worker has
 * pushed, or all but the backup workers, refuses a second push and drops a
 * late one, closes a round a lost worker left open, keeps a whole-model
 * buffer it is offered (handing back its old one) and times the round with
 * psd's clock; SSP answers a pull only within `staleness` clocks of the
 * slowest live worker; a waiting worker is told whom it waits for
 * (server/join.c, from the policies' state). The engine applies a big update off the loop and
 * hands it back through its done callback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/config/config.h"
#include "server/policy/join.h"
#include "proto/errors.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"
#include "server/update/update.h"

/* ---- a psd without sockets ------------------------------------------------- */

static uint64_t fake_ms;
static uint64_t fake_clock(void)
{
    return fake_ms;
}

static void set(psd *s, const char *key, const char *value)
{
    char err[256];
    assert_int_equal(ps_config_set(&s->cfg, key, value, err, sizeof err), 0);
}

/* A psd of n parameters (all 0, initialised), plain SGD with lr 1 and no
 * warm-up (w -= g),
 * nworkers connected workers, mode and settings given as KEY=VALUE pairs
 * ending with NULL. */
static psd *make_psd(uint64_t n, uint32_t nworkers, ...)
{
    psd *s = calloc(1, sizeof *s);
    assert_non_null(s);
    ps_config_defaults(&s->cfg);
    set(s, "optimizer", "sgd");
    set(s, "momentum", "0");
    set(s, "lr", "1");
    set(s, "warmup_versions", "0");
    va_list ap;
    va_start(ap, nworkers);
    for (const char *kv; (kv = va_arg(ap, const char *));) {
        char key[64];
        const char *eq = strchr(kv, '=');
        assert_non_null(eq);
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        set(s, key, eq + 1);
    }
    va_end(ap);
    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {(uint32_t)n};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    assert_int_equal(srv_model_set_layout(&s->model, &l, &s->cfg), 0);
    s->model.initialized = 1;
    s->policy = srv_policy_for(&s->cfg);
    s->clock = fake_clock;
    fake_ms = 1000;
    s->nworkers_cap = nworkers;
    s->workers = calloc(nworkers, sizeof *s->workers);
    for (uint32_t i = 0; i < nworkers; i++) {
        s->workers[i] = calloc(1, sizeof(srv_worker));
        s->workers[i]->shard = i;
        s->workers[i]->nshards = nworkers;
        s->workers[i]->state = SRV_W_CONNECTED;
    }
    return s;
}

static void free_psd(psd *s)
{
    s->policy->destroy(s);
    assert_null(s->policy_state);
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        free(s->workers[i]);
    free(s->workers);
    srv_update_free(s);
    srv_model_free(&s->model);
    free(s);
}

static float param(psd *s, uint64_t i)
{
    size_t len;
    return srv_model_at(&s->model, i, 1, &len)[0];
}

/* A push of the whole model, every value g, against version base. */
static int push_all(psd *s, uint32_t shard, uint64_t base, float g, int fin)
{
    uint64_t n = s->model.layout.total;
    float *v = malloc(n * sizeof *v);
    for (uint64_t i = 0; i < n; i++)
        v[i] = g;
    char err[256] = "";
    srv_push p = {.base = base, .off = 0, .n = n, .g = v, .fin = fin};
    int rc = s->policy->push(s, s->workers[shard], &p, err, sizeof err);
    free(v);
    return rc;
}

static int pull_ready(psd *s, uint32_t shard, uint64_t min)
{
    if (s->policy->pull_ready)
        return s->policy->pull_ready(s, s->workers[shard], min);
    return s->model.initialized && s->model.version >= min;
}

/* w leaves as srv_conn_detach() tells the policy */
static int lose(psd *s, uint32_t shard)
{
    s->workers[shard]->state = SRV_W_LOST;
    return s->policy->worker_left(s, s->workers[shard]);
}

/* What a waiting worker's heartbeat is told (server/join.c). */
static void expect_wait(psd *s, uint32_t shard, const char *want)
{
    char buf[240];
    int rc = srv_wait_describe(s, s->workers[shard], buf, sizeof buf);
    if (!want) {
        assert_int_equal(rc, 0);
        assert_string_equal(buf, "");
        return;
    }
    assert_int_equal(rc, 1);
    assert_string_equal(buf, want);
}

/* ---- ASGD ---------------------------------------------------------------- */

static void test_asgd_applies_each_push(void **state)
{
    psd *s = make_psd(8, 2, "mode=asgd", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 0), 0); /* a chunk: applied, no version */
    assert_int_equal(s->model.version, 0);
    assert_true(param(s, 3) == -1.0f);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE); /* the step's last */
    assert_int_equal(s->model.version, 1);
    assert_int_equal(s->workers[0]->clock, 1);
    assert_true(param(s, 3) == -2.0f);
    free_psd(s);
}

static void test_asgd_staleness_scale(void **state)
{
    psd *s = make_psd(8, 2, "mode=asgd", "staleness_scale=yes", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -1.0f); /* fresh: unscaled */
    /* computed against version 0, the model is at 1: 1 / (1 + 1) */
    assert_int_equal(push_all(s, 1, 0, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -1.5f);
    /* 2 versions behind: 1 / 3 */
    assert_int_equal(push_all(s, 0, 0, 3.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -2.5f);
    assert_int_equal(s->model.version, 3);
    free_psd(s);
}

static void test_asgd_without_scale_ignores_staleness(void **state)
{
    psd *s = make_psd(8, 2, "mode=asgd", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 1, 0, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -2.0f);
    free_psd(s);
}

static void test_asgd_dc_keeps_what_was_pulled(void **state)
{
    psd *s = make_psd(8, 2, "mode=asgd", "dc_lambda=1", NULL);
    s->policy->pulled(s, s->workers[1], 0); /* worker 1 computes against w = 0 */
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE); /* w = -1 */
    /* g + lambda g g (w_now - w_base) = 2 + 4 * (-1 - 0) = -2: w = -1 + 2 */
    assert_int_equal(push_all(s, 1, 0, 2.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == 1.0f);
    /* DC off at a reload: the snapshots go, and a stale push is plain */
    set(s, "dc_lambda", "0");
    s->policy->reconfigured(s);
    assert_int_equal(push_all(s, 1, 0, 2.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -1.0f);
    free_psd(s);
}

/* ---- BSP ----------------------------------------------------------------- */

static void test_bsp_round_closes_when_all_pushed(void **state)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), 0); /* kept: 1 of 2 */
    assert_int_equal(s->model.version, 0);
    assert_true(param(s, 0) == 0.0f);
    assert_false(pull_ready(s, 0, 1));
    fake_ms += 1500;
    assert_int_equal(push_all(s, 1, 0, 3.0f, 1), SRV_WAKE); /* closes: mean (1 + 3) / 2 */
    assert_int_equal(s->model.version, 1);
    assert_true(param(s, 7) == -2.0f);
    assert_int_equal(s->stats.rounds, 1);
    assert_int_equal(s->stats.round_seconds.total, 1);
    assert_true(s->stats.round_seconds.sum == 1.5); /* psd's clock, not the wall's */
    assert_true(pull_ready(s, 0, 1));
    assert_int_equal(s->workers[0]->clock, 1);
    assert_int_equal(s->workers[1]->clock, 1);
    free_psd(s);
}

static void test_bsp_refuses_a_second_push(void **state)
{
    psd *s = make_psd(8, 3, "mode=bsp", "workers=3", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), PS_EDUPLICATE);
    assert_int_equal(push_all(s, 1, 0, 1.0f, 1), 0);
    assert_int_equal(s->model.version, 0); /* the duplicate did not count */
    free_psd(s);
}

static void test_bsp_backup_workers(void **state)
{
    psd *s = make_psd(8, 3, "mode=bsp", "workers=3", "backup_workers=1", NULL);
    assert_int_equal(push_all(s, 2, 0, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 0, 0, 2.0f, 1), SRV_WAKE); /* 3 - 1 pushed: closed */
    assert_int_equal(s->model.version, 1);
    assert_true(param(s, 0) == -1.5f);
    /* the straggler's push for round 0 comes too late: dropped */
    assert_int_equal(push_all(s, 1, 0, 100.0f, 1), PS_ESTALE);
    assert_true(param(s, 0) == -1.5f);
    /* and it takes part in round 1 */
    assert_int_equal(push_all(s, 1, 1, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 0, 1, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -2.5f);
    free_psd(s);
}

static void test_bsp_worker_lost_mid_round(void **state)
{
    psd *s = make_psd(8, 3, "mode=bsp", "workers=3", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 1, 0, 3.0f, 1), 0);
    assert_int_equal(s->model.version, 0);
    /* shard 2 dies before pushing: the round closes with the 2 it has */
    assert_int_equal(lose(s, 2), SRV_WAKE);
    assert_int_equal(s->model.version, 1);
    assert_true(param(s, 0) == -2.0f);
    /* the next round needs the 2 that are left */
    assert_int_equal(push_all(s, 0, 1, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 1, 1, 1.0f, 1), SRV_WAKE);
    assert_int_equal(s->model.version, 2);
    free_psd(s);
}

static void test_bsp_lost_before_any_push_closes_nothing(void **state)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", NULL);
    assert_int_equal(lose(s, 1), 0); /* no push in: nothing to close */
    assert_int_equal(s->model.version, 0);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE); /* 1 live worker */
    assert_int_equal(s->model.version, 1);
    free_psd(s);
}

static void test_bsp_takes_an_offered_buffer(void **state)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", NULL);
    float *buf = malloc(8 * sizeof *buf);
    size_t cap = 8;
    for (int i = 0; i < 8; i++)
        buf[i] = 2.0f;
    char err[256];
    srv_push p = {.base = 0, .off = 0, .n = 8, .g = buf, .fin = 1, .own = &buf, .own_cap = &cap};
    assert_int_equal(s->policy->push(s, s->workers[0], &p, err, sizeof err), 0);
    /* the policy kept it (no copy) and gave back what it had: nothing yet */
    assert_null(buf);
    assert_int_equal(cap, 0);
    assert_int_equal(push_all(s, 1, 0, 4.0f, 1), SRV_WAKE);
    assert_true(param(s, 5) == -3.0f);
    free_psd(s);
}

static void test_bsp_partial_pushes_sum_in_shard_order(void **state)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", NULL);
    char err[256];
    float a[4] = {1, 1, 1, 1}, b[4] = {3, 3, 3, 3};
    srv_push p = {.base = 0, .off = 0, .n = 4, .g = a, .fin = 0};
    assert_int_equal(s->policy->push(s, s->workers[1], &p, err, sizeof err), 0);
    p = (srv_push){.base = 0, .off = 4, .n = 4, .g = b, .fin = 1};
    assert_int_equal(s->policy->push(s, s->workers[1], &p, err, sizeof err), 0);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -1.0f); /* (1 + 1) / 2 */
    assert_true(param(s, 7) == -2.0f); /* (1 + 3) / 2 */
    free_psd(s);
}

/* A push of g into [off, off+n) from shard. */
static int push_range(psd *s, uint32_t shard, uint64_t base, uint64_t off, uint64_t n, float g, int fin)
{
    float v[64];
    assert_true(n <= 64);
    for (uint64_t i = 0; i < n; i++)
        v[i] = g;
    char err[256] = "";
    srv_push p = {.base = base, .off = off, .n = n, .g = v, .fin = fin};
    return s->policy->push(s, s->workers[shard], &p, err, sizeof err);
}

/* A worker that sends part of its push and vanishes leaves no trace: the
 * round closes with the others' mean, in either sum order (issue 15, 1). */
static void vanished_push_leaves_no_trace(const char *order)
{
    psd *s = make_psd(8, 3, "mode=bsp", "workers=3", order, NULL);
    assert_int_equal(push_range(s, 2, 0, 0, 4, 100.0f, 0), 0); /* half, not fin */
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 1, 0, 3.0f, 1), 0);
    assert_int_equal(lose(s, 2), SRV_WAKE);
    assert_int_equal(s->model.version, 1);
    for (int i = 0; i < 8; i++)
        assert_true(param(s, i) == -2.0f); /* (1 + 3) / 2, nothing of shard 2 */
    /* and the next round sums only what is pushed in it */
    assert_int_equal(push_all(s, 0, 1, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 1, 1, 1.0f, 1), SRV_WAKE);
    assert_true(param(s, 0) == -3.0f);
    free_psd(s);
}

static void test_bsp_vanished_push_shard_order(void **state)
{
    vanished_push_leaves_no_trace("bsp_sum_order=shard");
}

static void test_bsp_vanished_push_arrival_order(void **state)
{
    vanished_push_leaves_no_trace("bsp_sum_order=arrival");
}

/* The whole gradient pushed with fin false several times, then with fin
 * true: the second push is refused DUPLICATE and the round applies
 * (gA + gB) / 2 (issue 15, 2); chunks of different ranges are one push. */
static void push_counts_once(const char *order)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", order, NULL);
    assert_int_equal(push_all(s, 1, 0, 4.0f, 0), 0);
    assert_int_equal(push_all(s, 1, 0, 4.0f, 0), PS_EDUPLICATE);
    assert_int_equal(push_all(s, 1, 0, 4.0f, 1), PS_EDUPLICATE);
    assert_int_equal(push_range(s, 1, 0, 2, 3, 4.0f, 1), PS_EDUPLICATE); /* overlaps [0, 8) */
    /* shard 0 in chunks out of order: one push */
    assert_int_equal(push_range(s, 0, 0, 4, 4, 2.0f, 0), 0);
    assert_int_equal(push_range(s, 0, 0, 0, 2, 2.0f, 0), 0);
    assert_int_equal(push_range(s, 0, 0, 3, 2, 2.0f, 0), PS_EDUPLICATE); /* 4 again */
    assert_int_equal(push_range(s, 0, 0, 2, 2, 2.0f, 1), 0);
    assert_int_equal(s->model.version, 0); /* shard 1's push never finished */
    assert_int_equal(lose(s, 1), SRV_WAKE); /* and is dropped when it goes */
    for (int i = 0; i < 8; i++)
        assert_true(param(s, i) == -2.0f);
    free_psd(s);

    s = make_psd(8, 2, "mode=bsp", "workers=2", order, NULL);
    assert_int_equal(push_range(s, 1, 0, 0, 4, 4.0f, 0), 0);
    assert_int_equal(push_range(s, 1, 0, 0, 4, 4.0f, 0), PS_EDUPLICATE);
    assert_int_equal(push_range(s, 1, 0, 4, 4, 4.0f, 1), 0);
    assert_int_equal(push_all(s, 1, 0, 4.0f, 1), PS_EDUPLICATE); /* after fin too */
    assert_int_equal(push_all(s, 0, 0, 2.0f, 1), SRV_WAKE);
    for (int i = 0; i < 8; i++)
        assert_true(param(s, i) == -3.0f); /* (2 + 4) / 2, shard 1 counted once */
    free_psd(s);
}

static void test_bsp_push_counts_once_shard_order(void **state)
{
    push_counts_once("bsp_sum_order=shard");
}

static void test_bsp_push_counts_once_arrival_order(void **state)
{
    push_counts_once("bsp_sum_order=arrival");
}

/* ---- updates whose result is not finite (issue 15, 3) --------------------- */

/* Three finite pushes of -3.4e38 at lr 0.5: the third would make w infinite
 * and is refused, the model untouched, counted. */
static void test_asgd_refuses_an_update_to_infinity(void **state)
{
    psd *s = make_psd(8, 1, "mode=asgd", "lr=0.5", NULL);
    assert_int_equal(push_all(s, 0, 0, -3.4e38f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 0, 1, -3.4e38f, 1), SRV_WAKE);
    assert_true(param(s, 0) == 3.4e38f);
    assert_int_equal(push_all(s, 0, 2, -3.4e38f, 1), PS_ENONFINITE);
    assert_int_equal(s->model.version, 2);
    for (int i = 0; i < 8; i++)
        assert_true(param(s, i) == 3.4e38f);
    assert_int_equal(s->stats.nonfinite_updates, 1);
    free_psd(s);
}

/* The same in a BSP round: the round closes with the model unchanged. */
static void test_bsp_round_to_infinity_leaves_the_model(void **state)
{
    psd *s = make_psd(8, 2, "mode=bsp", "workers=2", NULL); /* lr 1: w += 1.7e38 a round */
    for (uint64_t r = 0; r < 3; r++) {
        assert_int_equal(push_all(s, 0, r, -1.7e38f, 1), 0);
        assert_int_equal(push_all(s, 1, r, -1.7e38f, 1), SRV_WAKE);
    }
    assert_int_equal(s->model.version, 3);
    assert_true(param(s, 7) == 3.4e38f);
    assert_int_equal(s->stats.nonfinite_updates, 1);
    free_psd(s);
}

/* Momentum state overflowing refuses the update too; under
 * nonfinite = clip the update is applied with its results made finite. */
static void overflow_by_decay(const char *nonfinite, int clip)
{
    /* w <- w - 1000 (g + w) = -999 w for g = 0: |w| grows 999 times a push */
    psd *s = make_psd(8, 1, "mode=asgd", "lr=1000", "weight_decay=1", "clip_norm=1e9", nonfinite, NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    int rc;
    float before;
    uint64_t v;
    do {
        before = param(s, 0);
        v = s->model.version;
        rc = push_all(s, 0, v, 0.0f, 1);
    } while (rc == SRV_WAKE && v < 40 && s->stats.clipped_updates == 0);
    if (clip) {
        assert_int_equal(rc, SRV_WAKE);
        assert_int_equal(s->stats.clipped_updates, 1);
        assert_int_equal(s->stats.nonfinite_updates, 0);
        assert_true(param(s, 0) == (before > 0 ? -FLT_MAX : FLT_MAX));
        assert_int_equal(s->model.version, v + 1);
    } else {
        assert_int_equal(rc, PS_ENONFINITE);
        assert_true(param(s, 0) == before);
        assert_true(isfinite(before) && fabsf(before) > 1e35f);
        assert_int_equal(s->model.version, v);
        assert_int_equal(s->stats.nonfinite_updates, 1);
    }
    free_psd(s);
}

static void test_nonfinite_reject_by_decay(void **state)
{
    overflow_by_decay("nonfinite=reject", 0);
}

static void test_nonfinite_clip_makes_finite(void **state)
{
    overflow_by_decay("nonfinite=clip", 1);
}

/* A BSP round names the shards that never joined and those that have not
 * pushed; SSP the shards too far behind; a pause and the initial values
 * say so; ASGD's pulls do not wait. */
static void test_wait_describe(void **state)
{
    psd *s = make_psd(8, 3, "mode=bsp", "workers=4", NULL); /* shard 3 never joined */
    expect_wait(s, 0, "round 0 waits for shard 3/4 (never joined) and shards 0/4, 1/4, 2/4 (have not pushed)");
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), 0);
    assert_int_equal(push_all(s, 2, 0, 1.0f, 0), 0); /* not its last chunk: not pushed yet */
    expect_wait(s, 0, "round 0 waits for shard 3/4 (never joined) and shards 1/4, 2/4 (have not pushed)");
    assert_int_equal(push_all(s, 1, 0, 1.0f, 1), 0);
    lose(s, 2); /* gone: no longer waited for */
    expect_wait(s, 1, "round 0 waits for shard 3/4 (never joined)");
    s->paused = 1;
    expect_wait(s, 1, "psd is paused (psctl resume)");
    s->paused = 0;
    s->model.initialized = 0;
    expect_wait(s, 1, "the initial values (the first worker sends them)");
    free_psd(s);

    s = make_psd(8, 2, "mode=bsp", "workers=2", NULL);
    assert_int_equal(push_all(s, 1, 0, 1.0f, 1), 0);
    expect_wait(s, 1, "round 0 waits for shard 0/2 (has not pushed)");
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    expect_wait(s, 1, "round 1 waits for shards 0/2, 1/2 (have not pushed)");
    free_psd(s);

    s = make_psd(8, 3, "mode=ssp", "workers=3", "staleness=1", NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(push_all(s, 0, (uint64_t)i, 1.0f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 2, 3, 1.0f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 2, 4, 1.0f, 1), SRV_WAKE);
    expect_wait(s, 0, "clock 3 waits for shard 1/3 (more than 1 clock behind)");
    free_psd(s);

    s = make_psd(8, 2, "mode=asgd", NULL);
    expect_wait(s, 0, NULL);
    free_psd(s);
}

/* ---- SSP ----------------------------------------------------------------- */

static void test_ssp_bounds(void **state)
{
    psd *s = make_psd(8, 2, "mode=ssp", "workers=2", "staleness=1", NULL);
    assert_true(pull_ready(s, 0, 0));
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE); /* applied at once */
    assert_int_equal(s->model.version, 1);
    assert_true(pull_ready(s, 0, 1)); /* clock 1, slowest 0: within 1 */
    assert_int_equal(push_all(s, 0, 1, 1.0f, 1), SRV_WAKE);
    assert_false(pull_ready(s, 0, 2)); /* clock 2: 2 ahead of shard 1 */
    assert_true(pull_ready(s, 1, 2));  /* the slow one is never held */
    assert_false(pull_ready(s, 1, 3)); /* ... but waits for the version */
    assert_int_equal(push_all(s, 1, 2, 1.0f, 1), SRV_WAKE);
    assert_true(pull_ready(s, 0, 2));
    free_psd(s);
}

static void test_ssp_workers_not_joined_count_at_zero(void **state)
{
    /* workers = 3, but only shards 0 and 1 have ever joined */
    psd *s = make_psd(8, 2, "mode=ssp", "workers=3", "staleness=0", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 1, 1, 1.0f, 1), SRV_WAKE);
    assert_false(pull_ready(s, 0, 0)); /* shard 2 is still at 0 */
    free_psd(s);
}

static void test_ssp_lost_and_joined(void **state)
{
    psd *s = make_psd(8, 2, "mode=ssp", "workers=2", "staleness=0", NULL);
    assert_int_equal(push_all(s, 0, 0, 1.0f, 1), SRV_WAKE);
    assert_int_equal(push_all(s, 0, 1, 1.0f, 1), SRV_WAKE);
    assert_false(pull_ready(s, 0, 0));
    /* the slowest is lost: it no longer holds shard 0 back */
    assert_int_equal(lose(s, 1), SRV_WAKE);
    assert_true(pull_ready(s, 0, 0));
    /* it comes back level with the slowest live worker, not at 0 */
    s->workers[1]->state = SRV_W_CONNECTED;
    assert_int_equal(s->policy->worker_joined(s, s->workers[1]), SRV_WAKE);
    assert_int_equal(s->workers[1]->clock, 2);
    assert_true(pull_ready(s, 0, 0));
    free_psd(s);
}

/* ---- the update engine ------------------------------------------------------- */

static int done_calls;
static srv_update_tag done_tag;
static void on_done(psd *s, const srv_update_tag *tag)
{
    done_calls++;
    done_tag = *tag;
    assert_false(srv_update_busy(s)); /* installed and free again */
}

static void test_update_off_the_loop(void **state)
{
    /* 2^20 + 10 floats: two blocks, applied in two halves on the pool */
    uint64_t n = ((uint64_t)1 << 20) + 10;
    psd *s = make_psd(n, 1, "mode=asgd", NULL);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    s->loop = &loop;
    float *g = malloc(n * sizeof *g);
    for (uint64_t i = 0; i < n; i++)
        g[i] = (float)(i % 7);
    srv_grad gr = {.g = g};
    /* a snapshot holds the current blocks: the update writes fresh ones */
    srv_snap *snap = srv_snap_take(&s->model);
    assert_non_null(snap);
    /* without a tag: on the loop */
    srv_update_init(s, on_done);
    srv_update_tag tag = {.w = s->workers[0], .fin = 1};
    done_calls = 0;
    assert_int_equal(srv_update_apply(s, &gr, 0, n, &tag), SRV_PENDING);
    assert_true(srv_update_busy(s));
    assert_true(param(s, 6) == 0.0f); /* not installed yet */
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(done_calls, 1);
    assert_ptr_equal(done_tag.w, s->workers[0]);
    assert_int_equal(done_tag.fin, 1);
    assert_true(param(s, 6) == -6.0f);
    assert_true(param(s, n - 1) == -(float)((n - 1) % 7));
    size_t len;
    assert_true(srv_snap_at(snap, 6, 1, &len)[0] == 0.0f); /* the snapshot kept its values */
    srv_snap_unref(snap);
    /* no tag: applied at once, no callback */
    assert_int_equal(srv_update_apply(s, &gr, 0, n, NULL), 0);
    assert_int_equal(done_calls, 1);
    assert_true(param(s, 6) == -12.0f);
    s->loop = NULL;
    assert_int_equal(uv_loop_close(&loop), 0);
    free(g);
    free_psd(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asgd_applies_each_push),
        cmocka_unit_test(test_asgd_staleness_scale),
        cmocka_unit_test(test_asgd_without_scale_ignores_staleness),
        cmocka_unit_test(test_asgd_dc_keeps_what_was_pulled),
        cmocka_unit_test(test_bsp_round_closes_when_all_pushed),
        cmocka_unit_test(test_bsp_refuses_a_second_push),
        cmocka_unit_test(test_bsp_backup_workers),
        cmocka_unit_test(test_bsp_worker_lost_mid_round),
        cmocka_unit_test(test_bsp_lost_before_any_push_closes_nothing),
        cmocka_unit_test(test_bsp_takes_an_offered_buffer),
        cmocka_unit_test(test_bsp_partial_pushes_sum_in_shard_order),
        cmocka_unit_test(test_bsp_vanished_push_shard_order),
        cmocka_unit_test(test_bsp_vanished_push_arrival_order),
        cmocka_unit_test(test_bsp_push_counts_once_shard_order),
        cmocka_unit_test(test_bsp_push_counts_once_arrival_order),
        cmocka_unit_test(test_asgd_refuses_an_update_to_infinity),
        cmocka_unit_test(test_bsp_round_to_infinity_leaves_the_model),
        cmocka_unit_test(test_nonfinite_reject_by_decay),
        cmocka_unit_test(test_nonfinite_clip_makes_finite),
        cmocka_unit_test(test_ssp_bounds),
        cmocka_unit_test(test_ssp_workers_not_joined_count_at_zero),
        cmocka_unit_test(test_ssp_lost_and_joined),
        cmocka_unit_test(test_update_off_the_loop),
        cmocka_unit_test(test_wait_describe),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    srv_blk_pool_free();
    return rc;
}
