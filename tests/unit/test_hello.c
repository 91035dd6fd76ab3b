/* test_hello.c - a connection's hello (server/hello.c), linked from psd's
 * core library with a fake connection layer: psd.io records what psd
 * would send. The check changes nothing; the first worker fixes the
 * layout and is asked for the initial values; a shard already connected,
 * a BSP job's other worker count, a layout that differs, a model over
 * max_params, another protocol version are refused, and the connection
 * closed; a second hello is refused and costs only itself; an admin
 * learns the layout; a worker that leaves is detached and its policy told. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/config/config.h"
#include "proto/errors.h"
#include "server/report/dashboard.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"
#include "server/update/update.h"

/* ---- the fake connection layer ------------------------------------------------ */

static struct {
    int n;                /* replies queued */
    uint32_t type;        /* of the last */
    uint64_t id;
    int code, fatal;      /* ERROR */
    char text[512];
    int need_init;        /* WELCOME */
    uint64_t params;
    char mode[16];
    int has_layout;
} sent;

static void fake_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    sent.n++;
    sent.type = m->type;
    sent.id = m->id;
    sent.need_init = m->need_init;
    sent.params = m->params;
    snprintf(sent.mode, sizeof sent.mode, "%s", m->mode);
    sent.has_layout = (m->has & PS_F_LAYOUT) != 0;
}

static void fake_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text)
{
    sent.n++;
    sent.type = PS_MSG_ERROR;
    sent.id = id;
    sent.code = code;
    sent.fatal = fatal;
    snprintf(sent.text, sizeof sent.text, "%s", text);
    if (fatal)
        c->close_after_write = 1;
}

static int fake_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out)
{
    return -1;
}

static const srv_io fake_io = {.send = fake_send, .send_error = fake_send_error, .give_rbuf = fake_give_rbuf};

/* ---- a psd and its connections ------------------------------------------------- */

static psd *make_psd(const char *mode, const char *workers)
{
    psd *s = calloc(1, sizeof *s);
    char err[256];
    ps_config_defaults(&s->cfg);
    assert_int_equal(ps_config_set(&s->cfg, "mode", mode, err, sizeof err), 0);
    assert_int_equal(ps_config_set(&s->cfg, "workers", workers, err, sizeof err), 0);
    assert_int_equal(ps_config_set(&s->cfg, "max_params", "1000", err, sizeof err), 0);
    s->policy = srv_policy_for(&s->cfg);
    s->io = &fake_io;
    memset(&sent, 0, sizeof sent);
    return s;
}

static srv_conn *conn(psd *s, const char *addr)
{
    srv_conn *c = calloc(1, sizeof *c);
    c->srv = s;
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->next = s->conns;
    s->conns = c;
    return c;
}

static void free_psd(psd *s)
{
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    s->policy->destroy(s);
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        free(s->workers[i]);
    free(s->workers);
    srv_update_free(s);
    srv_dash_free(s); /* a join or leave tells the dashboard, which then exists */
    srv_model_free(&s->model);
    srv_parked_free_spare();
    srv_blk_pool_free();
    free(s);
}

static ps_layout layout_of(uint32_t n)
{
    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {n};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    return l;
}

static ps_msg hello(uint32_t role, uint32_t shard, uint32_t nshards, ps_layout *l)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE;
    m.id = 7;
    m.proto = PS_PROTO_VERSION;
    m.role = role;
    if (role == PS_ROLE_WORKER) {
        m.has |= PS_F_SHARD | PS_F_LAYOUT;
        m.shard = shard;
        m.nshards = nshards;
        m.layout = l;
    }
    return m;
}

/* A hello accepted: 0, and the WELCOME is what was sent. */
static void accept_ok(srv_conn *c, const ps_msg *m)
{
    char err[1200] = "";
    int rc = srv_hello_accept(c, m, NULL, err, sizeof err);
    if (rc != 0)
        fail_msg("hello refused (%d): %s", rc, err);
}

/* A hello refused: the code, a text saying part, and nothing sent (the
 * dispatch layer sends the ERROR). */
static void expect_refused(srv_conn *c, const ps_msg *m, int code, const char *part)
{
    char err[1200] = "";
    int before = sent.n;
    assert_int_equal(srv_hello_accept(c, m, NULL, err, sizeof err), code);
    assert_int_equal(sent.n, before);
    if (!strstr(err, part))
        fail_msg("refusal '%s' lacks '%s'", err, part);
}

/* ---- tests --------------------------------------------------------------------- */

static void test_first_worker_fixes_the_layout(void **state)
{
    psd *s = make_psd("asgd", "2");
    ps_layout l = layout_of(100);
    srv_conn *a = conn(s, "a:1"), *b = conn(s, "b:1");
    ps_msg m = hello(PS_ROLE_WORKER, 0, 2, &l);
    accept_ok(a, &m);
    assert_int_equal(sent.n, 1);
    assert_int_equal(sent.type, PS_MSG_WELCOME);
    assert_int_equal(sent.id, 7);
    assert_int_equal(sent.need_init, 1); /* the first is asked for the initial values */
    assert_int_equal(sent.params, 100);
    assert_string_equal(sent.mode, "asgd");
    assert_int_equal(a->role, PS_ROLE_WORKER);
    assert_ptr_equal(s->init_owner, a);
    assert_true(s->model.has_layout);
    assert_non_null(a->worker);
    assert_int_equal(a->worker->state, SRV_W_CONNECTED);
    assert_ptr_equal(a->worker->conn, a);
    assert_int_equal(s->stats.worker_joins, 1);
    /* the second is not asked again */
    m = hello(PS_ROLE_WORKER, 1, 2, &l);
    accept_ok(b, &m);
    assert_int_equal(sent.type, PS_MSG_WELCOME);
    assert_int_equal(sent.need_init, 0);
    assert_int_equal(s->stats.worker_joins, 2);
    free_psd(s);
}

static void test_refusals(void **state)
{
    psd *s = make_psd("bsp", "2");
    ps_layout l = layout_of(100), other = layout_of(50), big = layout_of(5000);
    srv_conn *a = conn(s, "a:1");
    /* a model over max_params: refused, and nothing fixed */
    ps_msg m = hello(PS_ROLE_WORKER, 0, 2, &big);
    char err[512];
    assert_int_equal(srv_hello_check(s, a, &m, err, sizeof err), PS_ELIMIT);
    expect_refused(a, &m, PS_ELIMIT, "max_params");
    assert_false(s->model.has_layout);
    assert_int_equal(a->role, PS_ROLE_NONE);
    /* BSP rounds of 2 workers: a worker of 3 is refused */
    srv_conn *b = conn(s, "b:1");
    m = hello(PS_ROLE_WORKER, 0, 3, &l);
    expect_refused(b, &m, PS_ESHARD, "BSP rounds of 2 workers");
    /* another protocol version */
    srv_conn *c = conn(s, "c:1");
    m = hello(PS_ROLE_WORKER, 0, 2, &l);
    m.proto = PS_PROTO_VERSION + 1;
    expect_refused(c, &m, PS_EUNSUPPORTED, "protocol version");
    /* one joins; the same shard again, and another layout, are refused */
    srv_conn *d = conn(s, "d:1"), *e = conn(s, "e:1"), *f = conn(s, "f:1");
    m = hello(PS_ROLE_WORKER, 0, 2, &l);
    accept_ok(d, &m);
    assert_int_equal(sent.type, PS_MSG_WELCOME);
    expect_refused(e, &m, PS_ESHARD, "already connected from d:1");
    m = hello(PS_ROLE_WORKER, 1, 2, &other);
    expect_refused(f, &m, PS_ELAYOUT, "layout mismatch at tensor 0: psd holds w[100], this worker has w[50] "
                                      "(psd: 100 parameters in 1 tensors, from the job's first worker; this worker: "
                                      "50 in 1)");
    expect_refused(f, &m, PS_ELAYOUT, "`psctl reset`");
    assert_null(f->worker);
    /* a second hello costs only itself */
    m = hello(PS_ROLE_WORKER, 0, 2, &l);
    expect_refused(d, &m, PS_ESTATE, "hello sent twice");
    assert_int_equal(s->stats.worker_joins, 1);
    free_psd(s);
}

static void test_admin_learns_the_layout(void **state)
{
    psd *s = make_psd("asgd", "1");
    ps_layout l = layout_of(10);
    srv_conn *adm = conn(s, "adm:1"), *w = conn(s, "w:1");
    ps_msg m = hello(PS_ROLE_ADMIN, 0, 0, NULL);
    accept_ok(adm, &m);
    assert_int_equal(sent.type, PS_MSG_WELCOME);
    assert_int_equal(sent.params, 0); /* no model yet */
    assert_false(sent.has_layout);
    assert_int_equal(adm->role, PS_ROLE_ADMIN);
    assert_null(adm->worker);
    m = hello(PS_ROLE_WORKER, 0, 1, &l);
    accept_ok(w, &m);
    assert_false(sent.has_layout); /* a worker has its own */
    srv_conn *adm2 = conn(s, "adm:2");
    m = hello(PS_ROLE_ADMIN, 0, 0, NULL);
    accept_ok(adm2, &m);
    assert_true(sent.has_layout);
    assert_int_equal(sent.params, 10);
    free_psd(s);
}

static void test_leaving_tells_the_policy(void **state)
{
    /* BSP rounds of 2: shard 0 pushes, shard 1 leaves, the round closes */
    psd *s = make_psd("bsp", "2");
    ps_layout l = layout_of(4);
    srv_conn *a = conn(s, "a:1"), *b = conn(s, "b:1");
    ps_msg m = hello(PS_ROLE_WORKER, 0, 2, &l);
    accept_ok(a, &m);
    m = hello(PS_ROLE_WORKER, 1, 2, &l);
    accept_ok(b, &m);
    assert_int_equal(s->model.nblk, 0); /* a hello commits no memory */
    assert_int_equal(srv_model_commit(&s->model, &s->cfg), 0); /* as INIT does */
    s->model.initialized = 1;
    s->init_owner = NULL;
    float g[4] = {1, 1, 1, 1};
    char err[256];
    srv_push p = {.base = 0, .off = 0, .n = 4, .g = g, .fin = 1};
    assert_int_equal(s->policy->push(s, a->worker, &p, err, sizeof err), 0);
    assert_int_equal(s->model.version, 0);
    srv_worker *wb = b->worker;
    srv_conn_detach(b, SRV_W_LOST, "test");
    assert_null(b->worker);
    assert_null(wb->conn);
    assert_int_equal(wb->state, SRV_W_LOST);
    assert_string_equal(wb->why, "test");
    assert_int_equal(s->stats.worker_deaths, 1);
    assert_int_equal(s->model.version, 1); /* the round closed without it */
    free_psd(s);
}

/* A hello proposes the layout without taking memory; when every worker
 * has left before INIT the layout is forgotten, and another is accepted
 * (issue 15, 4). */
static void test_layout_released_when_no_one_initialised_it(void **state)
{
    psd *s = make_psd("asgd", "2");
    ps_layout big = layout_of(512), other = layout_of(8);
    srv_conn *a = conn(s, "a:1");
    ps_msg m = hello(PS_ROLE_WORKER, 0, 1, &big);
    accept_ok(a, &m);
    assert_true(s->model.has_layout);
    assert_int_equal(s->model.layout.total, 512);
    assert_int_equal(s->model.nblk, 0);
    assert_null(s->model.blk);
    srv_conn_detach(a, SRV_W_LEFT, "bye");
    assert_false(s->model.has_layout);
    srv_conn *b = conn(s, "b:1");
    m = hello(PS_ROLE_WORKER, 0, 1, &other);
    accept_ok(b, &m);
    assert_non_null(b->worker); /* accepted: no layout mismatch */
    assert_int_equal(s->model.layout.total, 8);
    free_psd(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_worker_fixes_the_layout),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_admin_learns_the_layout),
        cmocka_unit_test(test_leaving_tells_the_policy),
        cmocka_unit_test(test_layout_released_when_no_one_initialised_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
