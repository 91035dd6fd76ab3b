/* test_etcd.c - unit tests for server/coord/etcd.c: base64 (RFC 4648's
 * vectors, refusals), the members' URLs, and a request that no member
 * answers failing through its callback, each member tried once, on a real
 * libuv loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/coord/etcd.h"

static void test_base64_vectors(void **state)
{
    (void)state;
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char out[64], back[64];
        srv_b64_encode(plain[i], strlen(plain[i]), out);
        assert_string_equal(out, coded[i]);
        assert_int_equal(srv_b64_decode(coded[i], back, sizeof back), (long)strlen(plain[i]));
        assert_string_equal(back, plain[i]);
    }
    char key[64];
    srv_b64_encode("/psd/j/part/0/leader", 20, key);
    assert_string_equal(key, "L3BzZC9qL3BhcnQvMC9sZWFkZXI="); /* as etcd shows it */
}

static void test_base64_refusals(void **state)
{
    (void)state;
    char out[4];
    assert_int_equal(srv_b64_decode("Zm9v!", out, sizeof out), -1);     /* not base64 */
    assert_int_equal(srv_b64_decode("Zm9vYmFy", out, sizeof out), -1);  /* 6 bytes do not fit 4 */
    assert_int_equal(srv_b64_decode("Zm9v", out, sizeof out), 3);
}

static void test_urls(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char err[300];
    assert_null(srv_etcd_new(&loop, "", 500, err, sizeof err));
    assert_non_null(strstr(err, "no URL"));
    assert_null(srv_etcd_new(&loop, "127.0.0.1:2379", 500, err, sizeof err));
    assert_non_null(strstr(err, "not an http://"));
    assert_null(srv_etcd_new(&loop, "http://a,http://b,http://c,http://d,http://e,http://f,http://g,http://h,http://i",
                             500, err, sizeof err));
    assert_non_null(strstr(err, "at most 8"));
    srv_etcd *e = srv_etcd_new(&loop, " http://127.0.0.1:1/, http://127.0.0.1:2", 500, err, sizeof err);
    if (!e)
        fail_msg("%s", err);
    assert_string_equal(srv_etcd_member(e), "http://127.0.0.1:1"); /* the trailing slash goes */
    srv_etcd_close(e);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* A loopback port nothing listens on. */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct answer {
    int calls, ok;
    char err[400];
} answer;

static void on_answer(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)a;
    (void)sent_ms;
    answer *r = arg;
    r->calls++;
    r->ok = ok;
    snprintf(r->err, sizeof r->err, "%s", err ? err : "");
}

static void test_no_member_answers(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    char urls[100], err[300];
    int p1 = dead_port(), p2 = dead_port();
    snprintf(urls, sizeof urls, "http://127.0.0.1:%d,http://127.0.0.1:%d", p1, p2);
    srv_etcd *e = srv_etcd_new(&loop, urls, 1000, err, sizeof err);
    assert_non_null(e);
    answer r = {0};
    assert_int_equal(srv_etcd_call(e, "/v3/kv/range", "{\"key\":\"AA==\"}", on_answer, &r), 0);
    assert_int_equal(srv_etcd_busy(e), 1);
    while (r.calls == 0 && uv_run(&loop, UV_RUN_ONCE)) /* ends once the callback came: both refused */
        ;
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.ok, 0);
    char second[40];
    snprintf(second, sizeof second, "127.0.0.1:%d", p2);
    assert_non_null(strstr(r.err, second)); /* the last member tried names the failure */
    assert_int_equal(srv_etcd_busy(e), 0);
    srv_etcd_close(e);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_vectors),
        cmocka_unit_test(test_base64_refusals),
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_no_member_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
