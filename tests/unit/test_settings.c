/* test_settings.c - psd's one cross-check of its settings
 * (server/settings.c), the same at start, --print-config, a reload and
 * `psctl set`: metrics_listen must be an IPv4 or IPv6 address with a port
 * (parsed once, handed back), BSP's backup_workers below workers,
 * nonfinite = clip needs clip_norm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <netinet/in.h>
#include <string.h>

#include "server/config.h"
#include "proto/errors.h"
#include "server/psd.h"

static ps_config with(const char *const *kv)
{
    ps_config c;
    char err[256];
    ps_config_defaults(&c);
    for (; *kv; kv += 2)
        assert_int_equal(ps_config_set(&c, kv[0], kv[1], err, sizeof err), 0);
    return c;
}

static void expect_refused(const char *const *kv, const char *part)
{
    ps_config c = with(kv);
    char err[512] = "";
    srv_settings out;
    memset(&out, 0x5a, sizeof out);
    srv_settings before = out;
    assert_int_equal(srv_config_check(&c, &out, err, sizeof err), PS_EINVAL);
    if (!strstr(err, part))
        fail_msg("'%s' lacks '%s'", err, part);
    assert_memory_equal(&out, &before, sizeof out); /* nothing handed back */
}

static void test_defaults_pass(void **state)
{
    ps_config c;
    ps_config_defaults(&c);
    char err[512];
    srv_settings out;
    assert_int_equal(srv_config_check(&c, &out, err, sizeof err), 0);
    assert_string_equal(out.metrics_host, ""); /* no endpoint */
    assert_int_equal(srv_config_check(&c, NULL, err, sizeof err), 0);
}

static void test_metrics_listen_parsed_once(void **state)
{
    ps_config c = with((const char *const[]){"metrics_listen", "[::1]:9470", NULL});
    char err[512];
    srv_settings out;
    assert_int_equal(srv_config_check(&c, &out, err, sizeof err), 0);
    assert_string_equal(out.metrics_host, "::1");
    assert_int_equal(out.metrics_port, 9470);
    assert_int_equal(out.metrics_addr.ss_family, AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&out.metrics_addr)->sin6_port), 9470);
    expect_refused((const char *const[]){"metrics_listen", "localhost:9100", NULL}, "not an IPv4 or IPv6 address");
    expect_refused((const char *const[]){"metrics_listen", "nonsense", NULL}, "metrics_listen");
}

static void test_cross_checks(void **state)
{
    expect_refused((const char *const[]){"mode", "bsp", "workers", "2", "backup_workers", "2", NULL},
                   "backup_workers (2) must be less than workers (2)");
    /* only BSP has backup workers */
    ps_config c = with((const char *const[]){"mode", "asgd", "workers", "2", "backup_workers", "2", NULL});
    char err[512];
    assert_int_equal(srv_config_check(&c, NULL, err, sizeof err), 0);
    expect_refused((const char *const[]){"nonfinite", "clip", NULL}, "clip_norm above 0");
    c = with((const char *const[]){"nonfinite", "clip", "clip_norm", "5", NULL});
    assert_int_equal(srv_config_check(&c, NULL, err, sizeof err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_pass),
        cmocka_unit_test(test_metrics_listen_parsed_once),
        cmocka_unit_test(test_cross_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
