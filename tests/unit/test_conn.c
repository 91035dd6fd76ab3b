/* test_conn.c - a connection's framing (server/net.c), linked from psd's
 * core library: psd's connection layer on a loopback port of its own
 * loop, and a plain socket as the peer. A frame that arrives in pieces is
 * handled once whole, and not before; frames that arrive together are
 * answered each, in order; a bad message after the hello costs only
 * itself; a frame longer than the limit before the hello is refused and
 * the connection closed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/config/config.h"
#include "proto/errors.h"
#include "proto/frame.h"
#include "server/connection/net.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/update/update.h"

typedef struct peer {
    psd *s;
    uv_loop_t loop;
    int fd;
    uint8_t in[1 << 16];
    size_t have;
    int eof;
} peer;

static peer *start(void)
{
    peer *p = calloc(1, sizeof *p);
    psd *s = p->s = calloc(1, sizeof *p->s);
    char err[256];
    ps_config_defaults(&s->cfg);
    assert_int_equal(ps_config_set(&s->cfg, "listen", "127.0.0.1:0", err, sizeof err), 0);
    s->policy = srv_policy_for(&s->cfg);
    assert_int_equal(uv_loop_init(&p->loop), 0);
    s->loop = &p->loop;
    assert_int_equal(srv_listen(s), 0);
    p->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(p->fd, (struct sockaddr *)&a, sizeof a), 0);
    return p;
}

static void stop(peer *p)
{
    psd *s = p->s;
    close(p->fd);
    srv_stop(s);
    uv_run(&p->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&p->loop), 0);
    s->policy->destroy(s);
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        free(s->workers[i]);
    free(s->workers);
    srv_update_free(s);
    srv_model_free(&s->model);
    ps_buf_free(&s->enc);
    srv_parked_free_spare();
    srv_net_free_spare(s);
    srv_blk_pool_free();
    free(s);
    free(p);
}

static void put(peer *p, const void *b, size_t n)
{
    assert_int_equal(send(p->fd, b, n, 0), (ssize_t)n);
}

static void put_msg(peer *p, const ps_msg *m)
{
    ps_buf b = {0};
    assert_int_equal(ps_msg_encode_full(m, &b), 0);
    put(p, b.p, b.len);
    ps_buf_free(&b);
}

/* Runs psd's loop and reads what it sends for up to ms milliseconds, or
 * until `frames` whole frames are in (0: the whole time). */
static void pump(peer *p, int ms, int frames)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        uv_run(&p->loop, UV_RUN_NOWAIT);
        ssize_t r = recv(p->fd, p->in + p->have, sizeof p->in - p->have, MSG_DONTWAIT);
        if (r > 0)
            p->have += (size_t)r;
        else if (r == 0)
            p->eof = 1;
        int whole = 0;
        size_t at = 0;
        uint32_t len;
        while (ps_frame_header(p->in + at, p->have - at, 1u << 20, &len) == 1 && p->have - at >= 4 + len)
            at += 4 + len, whole++;
        if ((frames && whole >= frames) || p->eof)
            return;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms)
            return;
        usleep(1000);
    }
}

/* Takes the first frame psd sent and decodes it into m. */
static void take(peer *p, ps_msg *m, msgpack_zone *z)
{
    uint32_t len;
    assert_int_equal(ps_frame_header(p->in, p->have, 1u << 20, &len), 1);
    assert_true(p->have >= 4 + len);
    static uint8_t payload[1 << 16];
    memcpy(payload, p->in + 4, len);
    memmove(p->in, p->in + 4 + len, p->have - 4 - len);
    p->have -= 4 + len;
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    char err[256];
    msgpack_zone_clear(z);
    assert_int_equal(ps_msg_decode(payload, len, &lim, z, m, NULL, err, sizeof err), 0);
}

static ps_msg admin_hello(uint64_t id)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE;
    m.id = id;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_ADMIN;
    return m;
}

static ps_msg heartbeat(uint64_t id)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HEARTBEAT);
    m.has = PS_F_ID;
    m.id = id;
    return m;
}

static void test_frame_in_pieces(void **state)
{
    peer *p = start();
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    ps_msg m = admin_hello(5), r;
    ps_buf b = {0};
    assert_int_equal(ps_msg_encode_full(&m, &b), 0);
    /* two bytes of the header, then all but the last byte: no answer yet */
    put(p, b.p, 2);
    pump(p, 50, 0);
    assert_int_equal(p->have, 0);
    put(p, b.p + 2, b.len - 3);
    pump(p, 50, 0);
    assert_int_equal(p->have, 0);
    put(p, b.p + b.len - 1, 1);
    pump(p, 5000, 1);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_WELCOME);
    assert_int_equal(r.id, 5);
    ps_buf_free(&b);
    msgpack_zone_destroy(&z);
    stop(p);
}

static void test_frames_together_answered_in_order(void **state)
{
    peer *p = start();
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    ps_buf all = {0}, one = {0};
    ps_msg ms[3] = {admin_hello(1), heartbeat(2), heartbeat(3)};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ps_msg_encode_full(&ms[i], &one), 0);
        assert_int_equal(ps_buf_reserve(&all, one.len), 0);
        memcpy(all.p + all.len, one.p, one.len);
        all.len += one.len;
    }
    put(p, all.p, all.len); /* one write: three frames */
    pump(p, 5000, 3);
    ps_msg r;
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_WELCOME);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_OK);
    assert_int_equal(r.id, 2);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_OK);
    assert_int_equal(r.id, 3);
    ps_buf_free(&all);
    ps_buf_free(&one);
    msgpack_zone_destroy(&z);
    stop(p);
}

static void test_bad_message_after_hello_costs_itself(void **state)
{
    peer *p = start();
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    ps_msg m = admin_hello(1), r;
    put_msg(p, &m);
    pump(p, 5000, 1);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_WELCOME);
    /* a frame whose payload is not msgpack (0xc1 is reserved) */
    uint8_t bad[5];
    ps_frame_put_len(bad, 1);
    bad[4] = 0xc1;
    put(p, bad, sizeof bad);
    m = heartbeat(9);
    put_msg(p, &m);
    pump(p, 5000, 2);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_ERROR);
    assert_int_equal(r.code, -PS_EMALFORMED);
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_OK);
    assert_int_equal(r.id, 9);
    assert_false(p->eof);
    msgpack_zone_destroy(&z);
    stop(p);
}

static void test_oversized_frame_before_hello(void **state)
{
    peer *p = start();
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    uint8_t hdr[4];
    ps_frame_put_len(hdr, PS_FRAME_MAX_PREAUTH + 1);
    put(p, hdr, sizeof hdr);
    pump(p, 5000, 1);
    ps_msg r;
    take(p, &r, &z);
    assert_int_equal(r.type, PS_MSG_ERROR);
    assert_int_equal(r.code, -PS_ETOO_BIG);
    pump(p, 5000, 0); /* then psd closes it */
    assert_true(p->eof);
    msgpack_zone_destroy(&z);
    stop(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_in_pieces),
        cmocka_unit_test(test_frames_together_answered_in_order),
        cmocka_unit_test(test_bad_message_after_hello_costs_itself),
        cmocka_unit_test(test_oversized_frame_before_hello),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
