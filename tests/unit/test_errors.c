/* test_errors.c - psd's one error convention below dispatch
 * (docs/DESIGN.md, "Conventions"): a function that refuses returns a
 * negative PS_E* code with the reason in its caller's buffer and sends
 * nothing; the dispatch layer sends the ERROR. Checked on the answer
 * layer's pulls (server/pull.c) and the session's token challenge
 * (server/auth.c), linked from psd's core library with a fake connection
 * layer that counts what psd would send. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/auth.h"
#include "proto/errors.h"
#include "server/config/config.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"

static struct {
    int replies, errors; /* queued through psd.io */
    uint32_t type;       /* of the last reply */
} sent;

static void fake_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    (void)c, (void)blk;
    sent.replies++;
    sent.type = m->type;
}

static void fake_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text)
{
    (void)c, (void)id, (void)code, (void)fatal, (void)text;
    sent.errors++;
}

static int fake_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out)
{
    (void)c, (void)data, (void)repl, (void)out;
    return -1;
}

static const srv_io fake_io = {.send = fake_send, .send_error = fake_send_error, .give_rbuf = fake_give_rbuf};

static psd *make_psd(void)
{
    psd *s = calloc(1, sizeof *s);
    assert_non_null(s);
    ps_config_defaults(&s->cfg);
    s->policy = srv_policy_for(&s->cfg);
    s->io = &fake_io;
    memset(&sent, 0, sizeof sent);
    return s;
}

static void expect_refused(int rc, int code, const char *err, const char *part)
{
    assert_int_equal(rc, code);
    if (!strstr(err, part))
        fail_msg("'%s' lacks '%s'", err, part);
    assert_int_equal(sent.errors, 0); /* the caller sends it */
    assert_int_equal(sent.replies, 0);
}

static void test_pull_refusals_are_returned(void **state)
{
    (void)state;
    psd *s = make_psd();
    srv_conn c = {.srv = s};
    char err[256] = "";
    expect_refused(srv_pull(&c, 1, 0, 10, 0, PS_DT_F32, err, sizeof err), PS_ENOT_READY, err, "no model yet");

    ps_layout l;
    ps_layout_init(&l);
    uint32_t dims[1] = {100};
    assert_int_equal(ps_layout_add(&l, "w", 1, dims), 0);
    assert_int_equal(srv_model_set_layout(&s->model, &l, &s->cfg), 0);
    expect_refused(srv_pull(&c, 2, 90, 20, 0, PS_DT_F32, err, sizeof err), PS_ERANGE, err,
                   "pull range [90, 110) is outside the model's 100 parameters");
    assert_int_equal(ps_config_set(&s->cfg, "wire_bf16", "no", NULL, 0), 0);
    expect_refused(srv_pull(&c, 3, 0, 10, 0, PS_DT_BF16, err, sizeof err), PS_EUNSUPPORTED, err,
                   "this psd sends float32 only");

    /* no initial values yet: a pull waits (0, nothing sent), up to the limit */
    for (int i = 0; i < SRV_PARKED_MAX; i++)
        assert_int_equal(srv_pull(&c, 10 + (uint64_t)i, 0, 10, 0, PS_DT_F32, err, sizeof err), 0);
    assert_int_equal(c.nparked, SRV_PARKED_MAX);
    expect_refused(srv_pull(&c, 99, 0, 10, 0, PS_DT_F32, err, sizeof err), PS_ELIMIT, err,
                   "pulls already waiting on this connection");

    srv_pulls_drop(&c);
    srv_parked_free_spare();
    s->policy->destroy(s);
    srv_model_free(&s->model);
    srv_blk_pool_free();
    free(s);
}

static void test_auth_refusal_is_returned(void **state)
{
    (void)state;
    assert_int_equal(ps_auth_init(), 0);
    psd *s = make_psd();
    s->token.len = 32;
    memset(s->token.b, 0x42, s->token.len);
    srv_conn c = {.srv = s};
    snprintf(c.addr, sizeof c.addr, "a:1");

    ps_msg h;
    ps_msg_init(&h, PS_MSG_HELLO);
    h.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE;
    h.id = 7;
    h.proto = PS_PROTO_VERSION;
    h.role = PS_ROLE_ADMIN;
    char err[512] = "";
    assert_int_equal(srv_auth_challenge(&c, &h, err, sizeof err), 0);
    assert_int_equal(sent.replies, 1); /* the CHALLENGE, an ordinary reply */
    assert_int_equal(sent.type, PS_MSG_CHALLENGE);
    assert_non_null(c.auth);

    memset(&sent, 0, sizeof sent);
    ps_msg a;
    ps_msg_init(&a, PS_MSG_AUTH);
    a.has = PS_F_ID | PS_F_CNONCE | PS_F_PROOF;
    a.id = 8; /* a proof of zeros: wrong */
    expect_refused(srv_auth_answer(&c, &a, err, sizeof err), PS_EAUTH, err,
                   "authentication failed for role admin: wrong token");

    srv_auth_free(&c);
    s->policy->destroy(s);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_refusals_are_returned),
        cmocka_unit_test(test_auth_refusal_is_returned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
