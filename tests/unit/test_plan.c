/* test_plan.c - a BSP job coordinated by its plan (server/plan.c, with the
 * hello, the pulls and the BSP policy that use it), linked from psd's core
 * library with a fake connection layer that records the replies. The first
 * hello's plan is the job's and every WELCOME tells it; the PARAMS that
 * opens a round carries each worker's part of the round's global batch;
 * a worker lost mid-job leaves its share to the others from the next
 * round, and its round closes without it; a worker that rejoins waits for
 * the next round and its late push is dropped, so nothing is counted
 * twice; the WELCOME names a worker's first round, and a worker may say it
 * rejoins at a later one (as a client of a split model does); a lone worker gets the whole global batch; after the plan's last
 * round every pull says done, every push is dropped and the version stays;
 * without a plan BSP is as before. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <unistd.h>

#include "server/report/checkpoint.h"
#include "server/config/config.h"
#include "proto/errors.h"
#include "server/report/dashboard.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"
#include "server/update/update.h"

/* ---- the fake connection layer: the replies, per connection ------------------ */

#define NCONN 8

typedef struct reply {
    int n;         /* replies to this connection */
    uint32_t type; /* the last one's */
    int code;
    uint64_t ver;
    int has_plan, has_slice, done;
    int has_base;  /* a WELCOME's first round for this worker */
    uint64_t base;
    ps_plan plan;
    ps_slice slice;
} reply;

static srv_conn *conns[NCONN];
static reply got[NCONN];

static reply *reply_of(const srv_conn *c)
{
    for (int i = 0; i < NCONN; i++)
        if (conns[i] == c)
            return &got[i];
    fail_msg("a reply to an unknown connection");
    return NULL;
}

static void fake_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    reply *r = reply_of(c);
    r->n++;
    r->type = m->type;
    r->ver = m->mver;
    r->has_plan = (m->has & PS_F_PLAN) != 0;
    r->plan = m->plan;
    r->has_slice = (m->has & PS_F_SLICE) != 0;
    r->slice = m->slice;
    r->done = (m->has & PS_F_DONE) && m->done;
    r->has_base = (m->has & PS_F_BASE) != 0;
    r->base = m->base;
}

static void fake_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text)
{
    reply *r = reply_of(c);
    r->n++;
    r->type = PS_MSG_ERROR;
    r->code = code;
}

static int fake_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out)
{
    return -1;
}

static const srv_io fake_io = {.send = fake_send, .send_error = fake_send_error, .give_rbuf = fake_give_rbuf};

/* A worker's PULL as dispatch makes it: a refusal comes back as a code
 * (none is expected here). */
static void pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt)
{
    char err[256] = "";
    int rc = srv_pull(c, id, off, len, min, rdt, err, sizeof err);
    if (rc != 0)
        fail_msg("srv_pull refused: %s", err);
}

/* ---- a BSP psd of a model of N values ----------------------------------------- */

#define N 8

static ps_layout lay;
static int nconns;

static psd *make_psd(const char *workers)
{
    psd *s = calloc(1, sizeof *s);
    char err[256];
    ps_config_defaults(&s->cfg);
    assert_int_equal(ps_config_set(&s->cfg, "mode", "bsp", err, sizeof err), 0);
    assert_int_equal(ps_config_set(&s->cfg, "workers", workers, err, sizeof err), 0);
    assert_int_equal(ps_config_set(&s->cfg, "optimizer", "sgd", err, sizeof err), 0);
    s->policy = srv_policy_for(&s->cfg);
    s->io = &fake_io;
    memset(conns, 0, sizeof conns);
    memset(got, 0, sizeof got);
    nconns = 0;
    ps_layout_init(&lay);
    uint32_t dims[1] = {N};
    assert_int_equal(ps_layout_add(&lay, "w", 1, dims), 0);
    return s;
}

static void free_psd(psd *s)
{
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        srv_pulls_drop(c);
        free(c);
    }
    s->policy->destroy(s);
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        free(s->workers[i]);
    free(s->workers);
    srv_update_free(s);
    srv_dash_free(s);
    srv_model_free(&s->model);
    srv_plan_clear(&s->plan);
    free(s->restored_clocks); /* a checkpoint's (test_checkpoint_keeps_the_plan) */
    srv_parked_free_spare();
    srv_blk_pool_free();
    free(s);
}

/* A worker of shard k of m says hello (with plan p unless NULL) on a new
 * connection, which is returned; the first one gives the initial values. */
static srv_conn *join(psd *s, uint32_t k, uint32_t m, const ps_plan *p)
{
    assert_true(nconns < NCONN);
    srv_conn *c = calloc(1, sizeof *c);
    c->srv = s;
    snprintf(c->addr, sizeof c->addr, "w%u:%d", k, nconns);
    c->next = s->conns;
    s->conns = c;
    conns[nconns++] = c;
    ps_msg h;
    ps_msg_init(&h, PS_MSG_HELLO);
    h.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT;
    h.proto = PS_PROTO_VERSION;
    h.role = PS_ROLE_WORKER;
    h.shard = k;
    h.nshards = m;
    h.layout = &lay;
    if (p) {
        h.has |= PS_F_PLAN;
        h.plan = *p;
    }
    char err[1200] = "";
    if (srv_hello_accept(c, &h, NULL, err, sizeof err) != 0)
        fail_msg("hello refused: %s", err);
    assert_int_equal(reply_of(c)->type, PS_MSG_WELCOME);
    if (!s->model.initialized) {
        assert_int_equal(srv_model_commit(&s->model, &s->cfg), 0);
        s->model.initialized = 1;
        s->init_owner = NULL;
    }
    return c;
}

/* The worker's step: pushes zeros for round `base`; a pushpull's pull for
 * base + 1 follows as handle.c does it (answered or parked). Returns the
 * policy's code. */
static int step(psd *s, srv_conn *c, uint64_t base)
{
    static const float zeros[N];
    char err[256];
    srv_push p = {.base = base, .off = 0, .n = N, .g = zeros, .fin = 1};
    int rc = s->policy->push(s, c->worker, &p, err, sizeof err);
    if (rc == SRV_WAKE)
        srv_answer_parked(s);
    if (rc >= 0 || rc == PS_ESTALE)
        pull(c, 1, 0, N, base + 1, PS_DT_F32);
    return rc;
}

static void lose(srv_conn *c)
{
    srv_conn_detach(c, SRV_W_LOST, "no heartbeat");
    c->closing = 1;
}

static void expect_slice(srv_conn *c, uint64_t ver, uint64_t epoch, uint64_t lo, uint64_t hi, uint32_t rank,
                         uint32_t count)
{
    reply *r = reply_of(c);
    assert_int_equal(r->type, PS_MSG_PARAMS);
    assert_int_equal(r->ver, ver);
    assert_true(r->has_slice);
    assert_false(r->done);
    assert_int_equal(r->slice.epoch, epoch);
    assert_int_equal(r->slice.lo, lo);
    assert_int_equal(r->slice.hi, hi);
    assert_int_equal(r->slice.rank, rank);
    assert_int_equal(r->slice.count, count);
}

/* 2 epochs of 10 samples, 4 a round: rounds of 4, 4 and 2 samples, 6 in all */
static const ps_plan plan10 = {.epochs = 2, .samples = 10, .batch = 4, .seed = 9};

/* ---- tests ---------------------------------------------------------------------- */

static void test_first_hello_fixes_the_plan(void **state)
{
    psd *s = make_psd("3");
    srv_conn *a = join(s, 0, 3, &plan10);
    assert_true(got[0].has_plan);
    assert_memory_equal(&got[0].plan, &plan10, sizeof plan10);
    assert_int_equal(s->plan.per_epoch, 3);
    assert_int_equal(s->plan.rounds, 6);
    /* another plan does not replace it; that worker is told the job's */
    ps_plan other = plan10;
    other.epochs = 5;
    join(s, 1, 3, &other);
    assert_true(got[1].has_plan);
    assert_memory_equal(&got[1].plan, &plan10, sizeof plan10);
    /* a worker without a plan is told it too */
    join(s, 2, 3, NULL);
    assert_true(got[2].has_plan);
    (void)a;
    free_psd(s);
}

static void test_rounds_hand_out_the_global_batch(void **state)
{
    psd *s = make_psd("3");
    srv_conn *c[3];
    for (uint32_t k = 0; k < 3; k++)
        c[k] = join(s, k, 3, &plan10);
    /* round 0: samples [0, 4) of epoch 0's order, by rank */
    for (uint32_t k = 0; k < 3; k++)
        pull(c[k], 1, 0, N, 0, PS_DT_F32);
    expect_slice(c[0], 0, 0, 0, 1, 0, 3);
    expect_slice(c[1], 0, 0, 1, 2, 1, 3);
    expect_slice(c[2], 0, 0, 2, 4, 2, 3);
    /* rounds 1, 2 (the epoch's last, 2 samples), 3 (epoch 1 again from 0) */
    uint64_t want[][2] = {{4, 8}, {8, 10}, {0, 4}};
    for (uint64_t r = 0; r < 3; r++) {
        for (uint32_t k = 0; k < 3; k++)
            assert_true(step(s, c[k], r) >= 0);
        assert_int_equal(s->model.version, r + 1);
        uint64_t lo = want[r][0], len = want[r][1] - want[r][0];
        for (uint32_t k = 0; k < 3; k++)
            expect_slice(c[k], r + 1, (r + 1) / 3, lo + len * k / 3, lo + len * (k + 1) / 3, k, 3);
    }
    free_psd(s);
}

static void test_lost_worker_and_rejoin(void **state)
{
    psd *s = make_psd("3");
    ps_plan p = {.epochs = 10, .samples = 600, .batch = 6, .seed = 1};
    srv_conn *c[3];
    for (uint32_t k = 0; k < 3; k++) {
        c[k] = join(s, k, 3, &p);
        pull(c[k], 1, 0, N, 0, PS_DT_F32);
    }
    /* round 0: shards 0 and 1 push; 2 is cut and declared lost */
    assert_true(step(s, c[0], 0) >= 0);
    assert_true(step(s, c[1], 0) >= 0);
    assert_int_equal(s->model.version, 0);
    lose(c[2]);
    assert_int_equal(s->model.version, 1); /* the round closed without it */
    /* round 1 is shared by the two: 3 samples each */
    expect_slice(c[0], 1, 0, 6, 9, 0, 2);
    expect_slice(c[1], 1, 0, 9, 12, 1, 2);
    /* shard 2 comes back mid-round: its pull waits for the next round */
    srv_conn *back = join(s, 2, 3, &p);
    int n = got[nconns - 1].n;
    pull(back, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(got[nconns - 1].n, n); /* parked */
    /* its late step for round 1 is dropped: nothing counted twice */
    assert_int_equal(step(s, back, 1), PS_ESTALE);
    /* round 1 closes with the two members' pushes alone */
    assert_true(step(s, c[0], 1) >= 0);
    assert_int_equal(s->model.version, 1);
    assert_true(step(s, c[1], 1) >= 0);
    assert_int_equal(s->model.version, 2);
    /* round 2: three again, and the rejoined worker hears its part */
    expect_slice(c[0], 2, 0, 12, 14, 0, 3);
    expect_slice(c[1], 2, 0, 14, 16, 1, 3);
    expect_slice(back, 2, 0, 16, 18, 2, 3);
    free_psd(s);
}

/* The WELCOME names the first round a (re)joining worker trains, and the
 * worker may say it rejoins at a later one (a HEARTBEAT's base, as a
 * worker of a job split over several psd does): the rounds before go
 * without it, the current one too, and their shares stay as handed out. */
static void test_rejoin_at_a_later_round(void **state)
{
    psd *s = make_psd("3");
    ps_plan p = {.epochs = 10, .samples = 600, .batch = 6, .seed = 1};
    srv_conn *c[3];
    for (uint32_t k = 0; k < 3; k++) {
        c[k] = join(s, k, 3, &p);
        pull(c[k], 1, 0, N, 0, PS_DT_F32);
    }
    assert_false(got[0].has_base); /* the first hello: no plan ruled yet */
    /* shard 2 is lost before its push of round 0 and comes back in it: a
     * member of round 0 again, as its WELCOME says */
    lose(c[2]);
    srv_conn *back = join(s, 2, 3, &p);
    assert_true(got[nconns - 1].has_base);
    assert_int_equal(got[nconns - 1].base, 0);
    /* it says it rejoins at round 2: round 0 no longer waits for it */
    assert_true(step(s, c[0], 0) >= 0);
    assert_true(step(s, c[1], 0) >= 0);
    assert_int_equal(s->model.version, 0);
    int rc = srv_plan_rejoin(s, back->worker, 2);
    assert_int_equal(rc, SRV_WAKE); /* round 0 closed */
    srv_answer_parked(s);
    assert_int_equal(s->model.version, 1);
    /* an earlier round, or the same, changes nothing */
    assert_int_equal(srv_plan_rejoin(s, back->worker, 1), 0);
    assert_int_equal(srv_plan_rejoin(s, back->worker, 2), 0);
    /* round 1 is the two others', its pull waits, its push is dropped */
    expect_slice(c[0], 1, 0, 6, 9, 0, 2);
    expect_slice(c[1], 1, 0, 9, 12, 1, 2);
    int n = got[nconns - 1].n;
    pull(back, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(got[nconns - 1].n, n);
    assert_int_equal(step(s, back, 1), PS_ESTALE);
    /* a worker joining now is told round 2 too */
    uint64_t first = 0;
    assert_true(srv_plan_first_round(s, back->worker, &first));
    assert_int_equal(first, 2);
    assert_true(step(s, c[0], 1) >= 0);
    assert_true(step(s, c[1], 1) >= 0);
    assert_int_equal(s->model.version, 2);
    /* round 2: all three */
    expect_slice(c[0], 2, 0, 12, 14, 0, 3);
    expect_slice(c[1], 2, 0, 14, 16, 1, 3);
    expect_slice(back, 2, 0, 16, 18, 2, 3);
    free_psd(s);
}

static void test_lone_worker_keeps_the_global_batch(void **state)
{
    psd *s = make_psd("3");
    ps_plan p = {.epochs = 1, .samples = 100, .batch = 30, .seed = 1};
    srv_conn *c[3];
    for (uint32_t k = 0; k < 3; k++) {
        c[k] = join(s, k, 3, &p);
        pull(c[k], 1, 0, N, 0, PS_DT_F32);
    }
    lose(c[1]);
    lose(c[2]);
    assert_true(step(s, c[0], 0) >= 0); /* round 0 closes with shard 0 alone */
    assert_int_equal(s->model.version, 1);
    expect_slice(c[0], 1, 0, 30, 60, 0, 1);
    free_psd(s);
}

/* A worker that reconnects after its push (a cut connection) waits for the
 * round to close, and does not push the round again. */
static void test_pushed_then_reconnected_waits(void **state)
{
    psd *s = make_psd("2");
    ps_plan p = {.epochs = 1, .samples = 100, .batch = 10, .seed = 1};
    srv_conn *a = join(s, 0, 2, &p), *b = join(s, 1, 2, &p);
    pull(a, 1, 0, N, 0, PS_DT_F32);
    pull(b, 1, 0, N, 0, PS_DT_F32);
    assert_true(step(s, a, 0) >= 0);
    srv_conn_detach(a, SRV_W_LOST, "cut");
    a->closing = 1;
    assert_int_equal(s->model.version, 0); /* b has not pushed */
    srv_conn *a2 = join(s, 0, 2, &p);
    assert_true(got[nconns - 1].has_base);
    assert_int_equal(got[nconns - 1].base, 1); /* its WELCOME: it trains from round 1 */
    int n = got[nconns - 1].n;
    pull(a2, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(got[nconns - 1].n, n); /* parked: it pushed round 0 */
    assert_true(step(s, b, 0) >= 0);
    assert_int_equal(s->model.version, 1);
    expect_slice(a2, 1, 0, 10, 15, 0, 2);
    free_psd(s);
}

static void test_done_after_the_last_round(void **state)
{
    psd *s = make_psd("2");
    ps_plan p = {.epochs = 2, .samples = 4, .batch = 4, .seed = 1}; /* 2 rounds */
    srv_conn *a = join(s, 0, 2, &p), *b = join(s, 1, 2, &p);
    pull(a, 1, 0, N, 0, PS_DT_F32);
    pull(b, 1, 0, N, 0, PS_DT_F32);
    for (uint64_t r = 0; r < 2; r++) {
        assert_false(srv_plan_done(s));
        assert_true(step(s, a, r) >= 0);
        assert_true(step(s, b, r) >= 0);
    }
    assert_int_equal(s->model.version, 2);
    assert_true(srv_plan_done(s));
    reply *ra = reply_of(a);
    assert_int_equal(ra->type, PS_MSG_PARAMS);
    assert_true(ra->done);
    assert_false(ra->has_slice);
    /* a push past the plan is dropped, and its pull (for a version that
     * never comes) answered with done */
    uint64_t rounds = s->stats.rounds;
    int n = ra->n;
    assert_int_equal(step(s, a, 2), PS_ESTALE);
    assert_int_equal(step(s, b, 2), PS_ESTALE);
    assert_int_equal(s->model.version, 2);
    assert_int_equal(s->stats.rounds, rounds);
    assert_int_equal(ra->n, n + 1);
    assert_true(ra->done);
    /* a worker joining now hears it at once too */
    lose(b);
    srv_conn *late = join(s, 1, 2, NULL);
    pull(late, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(reply_of(late)->type, PS_MSG_PARAMS);
    assert_true(reply_of(late)->done);
    free_psd(s);
}

/* No hello with a plan: a rejoining worker counts at once, as before. */
static void test_without_a_plan_as_before(void **state)
{
    psd *s = make_psd("2");
    srv_conn *a = join(s, 0, 2, NULL), *b = join(s, 1, 2, NULL);
    assert_false(got[0].has_plan);
    pull(a, 1, 0, N, 0, PS_DT_F32);
    assert_false(got[0].has_slice);
    assert_false(srv_plan_active(s));
    lose(b);
    srv_conn *b2 = join(s, 1, 2, NULL);
    pull(b2, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(reply_of(b2)->type, PS_MSG_PARAMS); /* answered at once */
    assert_true(step(s, a, 0) >= 0);
    assert_int_equal(s->model.version, 0); /* waits for b2 */
    assert_true(step(s, b2, 0) >= 0);
    assert_int_equal(s->model.version, 1);
    free_psd(s);
}

/* Removes dir's checkpoints and dir (a directory of this test's, in the
 * working directory ctest runs it in). */
static void rm_state(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[512];
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void set_state_dir(psd *s, const char *dir)
{
    char err[256];
    assert_int_equal(ps_config_set(&s->cfg, "state_dir", dir, err, sizeof err), 0);
}

/* A psd of `workers` workers started from dir's newest checkpoint, as
 * main() starts one. */
static psd *restarted(const char *dir, const char *workers)
{
    psd *s = make_psd(workers);
    set_state_dir(s, dir);
    assert_int_equal(srv_checkpoint_load(s), 1);
    srv_workers_out_restored(s);
    return s;
}

/* A checkpoint holds the plan and the shards out of it: a psd started from
 * it has the plan before any hello, goes on at the checkpoint's round, and
 * does not wait for a shard that was lost before; a checkpoint without a
 * plan restores none. */
static void test_checkpoint_keeps_the_plan(void **state)
{
    const char *dir = "test_plan.state";
    rm_state(dir);
    psd *s = make_psd("3");
    set_state_dir(s, dir);
    ps_plan p = {.epochs = 10, .samples = 600, .batch = 6, .seed = 1};
    srv_conn *c[3];
    for (uint32_t k = 0; k < 3; k++) {
        c[k] = join(s, k, 3, &p);
        pull(c[k], 1, 0, N, 0, PS_DT_F32);
    }
    for (uint32_t k = 0; k < 3; k++)
        assert_true(step(s, c[k], 0) >= 0);
    assert_int_equal(s->model.version, 1);
    lose(c[2]);
    assert_int_equal(srv_checkpoint_write_now(s), 0);
    free_psd(s);

    psd *t = restarted(dir, "3");
    assert_int_equal(t->model.version, 1);
    assert_true(t->plan.set);
    assert_memory_equal(&t->plan.p, &p, sizeof p);
    assert_int_equal(t->plan.rounds, 1000);
    assert_true(srv_plan_active(t));
    assert_true(t->nworkers_cap > 2 && t->workers[2] && t->workers[2]->state == SRV_W_LOST);
    assert_true(!t->workers[0] && !t->workers[1]); /* in the job: waited for */
    /* the workers come back without a plan of their own: round 1 is the
     * two's, 3 samples each, as it was before the restart */
    srv_conn *a = join(t, 0, 3, NULL), *b = join(t, 1, 3, NULL);
    assert_true(got[0].has_plan && got[1].has_plan);
    assert_memory_equal(&got[0].plan, &p, sizeof p);
    pull(a, 1, 0, N, 0, PS_DT_F32);
    pull(b, 1, 0, N, 0, PS_DT_F32);
    expect_slice(a, 1, 0, 6, 9, 0, 2);
    expect_slice(b, 1, 0, 9, 12, 1, 2);
    assert_true(step(t, a, 1) >= 0);
    assert_true(step(t, b, 1) >= 0);
    assert_int_equal(t->model.version, 2); /* not held for shard 2 */
    free_psd(t);
    rm_state(dir);

    /* a job without a plan writes none, and its checkpoint restores none */
    psd *u = make_psd("2");
    set_state_dir(u, dir);
    srv_conn *x = join(u, 0, 2, NULL), *y = join(u, 1, 2, NULL);
    pull(x, 1, 0, N, 0, PS_DT_F32);
    pull(y, 1, 0, N, 0, PS_DT_F32);
    assert_true(step(u, x, 0) >= 0);
    assert_true(step(u, y, 0) >= 0);
    assert_int_equal(srv_checkpoint_write_now(u), 0);
    free_psd(u);
    psd *v = restarted(dir, "2");
    assert_int_equal(v->model.version, 1);
    assert_false(v->plan.set);
    assert_int_equal(v->nworkers_cap, 0);
    free_psd(v);
    rm_state(dir);

    /* a finished job whose workers all left: restored done, nobody
     * recorded as out; a worker that comes now hears done at once */
    psd *f = make_psd("2");
    ps_plan two = {.epochs = 2, .samples = 4, .batch = 4, .seed = 1}; /* 2 rounds */
    srv_conn *g = join(f, 0, 2, &two), *h = join(f, 1, 2, &two);
    pull(g, 1, 0, N, 0, PS_DT_F32);
    pull(h, 1, 0, N, 0, PS_DT_F32);
    for (uint64_t r = 0; r < 2; r++) {
        assert_true(step(f, g, r) >= 0);
        assert_true(step(f, h, r) >= 0);
    }
    assert_true(srv_plan_done(f));
    srv_conn_detach(g, SRV_W_LEFT, "said bye");
    srv_conn_detach(h, SRV_W_LEFT, "said bye");
    g->closing = h->closing = 1;
    set_state_dir(f, dir); /* only now: the last worker's leaving would write it in the (absent) loop's pool */
    assert_int_equal(srv_checkpoint_write_now(f), 0);
    free_psd(f);
    psd *d = restarted(dir, "2");
    assert_true(d->plan.set && srv_plan_done(d));
    assert_int_equal(d->nworkers_cap, 0);
    srv_conn *late = join(d, 1, 2, NULL);
    pull(late, 1, 0, N, 0, PS_DT_F32);
    assert_int_equal(reply_of(late)->type, PS_MSG_PARAMS);
    assert_true(reply_of(late)->done);
    free_psd(d);
    rm_state(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_hello_fixes_the_plan),
        cmocka_unit_test(test_rounds_hand_out_the_global_batch),
        cmocka_unit_test(test_lost_worker_and_rejoin),
        cmocka_unit_test(test_rejoin_at_a_later_round),
        cmocka_unit_test(test_lone_worker_keeps_the_global_batch),
        cmocka_unit_test(test_pushed_then_reconnected_waits),
        cmocka_unit_test(test_done_after_the_last_round),
        cmocka_unit_test(test_without_a_plan_as_before),
        cmocka_unit_test(test_checkpoint_keeps_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
