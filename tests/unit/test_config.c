/* test_config.c - unit tests for common/config.c, linked from pscommon;
 * its parsers and formatters are reached through the public functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/config/config.h"
#include "common/log.h"
#include "common/hostport.h"
#include "proto/errors.h"
#include "server/model/optim.h"

#ifndef PS_SOURCE_DIR
#error "PS_SOURCE_DIR must name the source tree"
#endif

/* ---- helpers ---- */

static char tmp_path[PATH_MAX];

/* Write text to a fresh temporary file; return its path (static buffer). */
static const char *write_tmp(const char *text)
{
    const char *dir = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/ps_test_config_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(tmp_path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return tmp_path;
}

/* ps_config_set that must fail with exactly msg, leaving c unchanged. */
static void expect_set_error(const char *key, const char *value, const char *msg)
{
    ps_config c, before;
    char err[512] = "";

    ps_config_defaults(&c);
    before = c;
    assert_int_equal(ps_config_set(&c, key, value, err, sizeof err), PS_EINVAL);
    assert_string_equal(err, msg);
    assert_memory_equal(&c, &before, sizeof c);
}

static void expect_set_ok(ps_config *c, const char *key, const char *value)
{
    char err[512] = "";
    int rc = ps_config_set(c, key, value, err, sizeof err);
    if (rc != 0)
        fail_msg("%s = '%s' rejected: %s", key, value, err);
}

static void format_of(const ps_config *c, const char *key, char *buf, size_t len)
{
    const ps_config_option *o = ps_config_find(key);
    assert_non_null(o);
    ps_config_format(c, o, buf, len);
}

/* ---- the table and the defaults ---- */

static void test_defaults(void **state)
{
    ps_config c;

    ps_config_defaults(&c);
    assert_string_equal(c.listen.host, "127.0.0.1");
    assert_int_equal(c.listen.port, 7000);
    assert_int_equal(c.mode, PS_MODE_ASGD);
    assert_int_equal(c.workers, 2);
    assert_string_equal(c.state_dir, "");
    assert_string_equal(c.port_file, "");
    assert_int_equal(c.optimizer, PS_OPTIMIZER_ADAGRAD);
    assert_true(c.lr == 0.02);
    assert_true(c.momentum == 0.9);
    assert_true(c.weight_decay == 0.0);
    assert_int_equal(c.bsp_sum_order, PS_BSP_SUM_SHARD);
    assert_int_equal(c.max_frame, 64u << 20);
    assert_int_equal(c.max_connections, 1024);
    assert_int_equal(c.log_level, PS_LOG_INFO);
}

/* Every row is consistent: the field size fits the type, bounds are sane,
 * names are unique and findable, and the default formats back to itself
 * (so --print-config of a default config shows exactly the defaults that
 * conf/psd.conf documents). */
static void test_table_sane(void **state)
{
    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    ps_config c;
    char buf[PS_CONFIG_VALUE_MAX];

    assert_true(n >= 13);
    ps_config_defaults(&c);
    for (size_t i = 0; i < n; i++) {
        const ps_config_option *o = &opts[i];
        assert_non_null(o->name);
        assert_non_null(o->def);
        assert_non_null(o->help);
        assert_true(strlen(o->help) > 10);
        assert_true(o->offset + o->size <= sizeof(ps_config));
        assert_ptr_equal(ps_config_find(o->name), o);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(opts[j].name, o->name);
        switch (o->type) {
        case PS_CT_BOOL: assert_int_equal(o->size, sizeof(bool)); break;
        case PS_CT_INT:
            assert_int_equal(o->size, sizeof(int));
            assert_true(o->lo <= o->hi && o->lo >= INT_MIN && o->hi <= INT_MAX);
            break;
        case PS_CT_ENUM:
            assert_int_equal(o->size, sizeof(int));
            assert_non_null(o->words);
            assert_non_null(o->words[0]);
            break;
        case PS_CT_U64:
        case PS_CT_SIZE:
        case PS_CT_DURATION:
            assert_int_equal(o->size, sizeof(uint64_t));
            assert_true(0 <= o->lo && o->lo <= o->hi);
            break;
        case PS_CT_DOUBLE:
            assert_int_equal(o->size, sizeof(double));
            assert_true(o->dmin <= o->dmax);
            break;
        case PS_CT_STRING: assert_true(o->size > 1); break;
        case PS_CT_HOSTPORT: assert_int_equal(o->size, sizeof(ps_hostport)); break;
        }
        ps_config_format(&c, o, buf, sizeof buf);
        assert_string_equal(buf, o->def);
    }
}

/* ---- each type ---- */

static void test_int(void **state)
{
    ps_config c;

    ps_config_defaults(&c);
    expect_set_ok(&c, "workers", "8");
    assert_int_equal(c.workers, 8);
    expect_set_ok(&c, "workers", "  16\t");
    assert_int_equal(c.workers, 16);
    expect_set_ok(&c, "workers", "1");
    expect_set_ok(&c, "workers", "4096");
    assert_int_equal(c.workers, 4096);
    expect_set_ok(&c, "max_connections", "65536");
    assert_int_equal(c.max_connections, 65536);

    expect_set_error("workers", "0", "workers: 0 is out of range 1..4096");
    expect_set_error("workers", "4097", "workers: 4097 is out of range 1..4096");
    expect_set_error("workers", "-3", "workers: -3 is out of range 1..4096");
    expect_set_error("workers", "99999999999999999999999",
                     "workers: 99999999999999999999999 is out of range 1..4096");
    expect_set_error("workers", "abc", "workers: 'abc' is not an integer");
    expect_set_error("workers", "12x", "workers: '12x' is not an integer");
    expect_set_error("workers", "1.5", "workers: '1.5' is not an integer");
    expect_set_error("workers", "0x10", "workers: '0x10' is not an integer");
    expect_set_error("workers", "", "workers: '' is not an integer");
    expect_set_error("workers", "- 1", "workers: '- 1' is not an integer");
    expect_set_error("max_connections", "0", "max_connections: 0 is out of range 1..65536");
}

static void test_double(void **state)
{
    ps_config c;

    ps_config_defaults(&c);
    expect_set_ok(&c, "lr", "0.01");
    assert_true(c.lr == 0.01);
    expect_set_ok(&c, "lr", "1e3");
    assert_true(c.lr == 1000.0);
    expect_set_ok(&c, "lr", "0");
    assert_true(c.lr == 0.0);
    expect_set_ok(&c, "momentum", "0.999999");
    assert_true(c.momentum == 0.999999);
    expect_set_ok(&c, "weight_decay", "5e-4");
    assert_true(c.weight_decay == 5e-4);

    expect_set_error("lr", "0.x", "lr: '0.x' is not a number");
    expect_set_error("lr", "", "lr: '' is not a number");
    expect_set_error("lr", "fast", "lr: 'fast' is not a number");
    expect_set_error("lr", "nan", "lr: 'nan' is not a finite number");
    expect_set_error("lr", "inf", "lr: 'inf' is not a finite number");
    expect_set_error("lr", "1e999", "lr: '1e999' is not a finite number");
    expect_set_error("lr", "1001", "lr: 1001 is out of range 0..1000");
    expect_set_error("lr", "-0.1", "lr: -0.1 is out of range 0..1000");
    expect_set_error("momentum", "1", "momentum: 1 is out of range 0..0.999999");
    expect_set_error("weight_decay", "1.5", "weight_decay: 1.5 is out of range 0..1");

    char buf[64];
    expect_set_ok(&c, "lr", "0.3");
    format_of(&c, "lr", buf, sizeof buf);
    assert_string_equal(buf, "0.3");
}

static void test_enum(void **state)
{
    ps_config c;

    ps_config_defaults(&c);
    expect_set_ok(&c, "mode", "bsp");
    assert_int_equal(c.mode, PS_MODE_BSP);
    expect_set_ok(&c, "mode", "ASGD");
    assert_int_equal(c.mode, PS_MODE_ASGD);
    expect_set_ok(&c, "bsp_sum_order", "arrival");
    assert_int_equal(c.bsp_sum_order, PS_BSP_SUM_ARRIVAL);
    expect_set_ok(&c, "log_level", "debug");
    assert_int_equal(c.log_level, PS_LOG_DEBUG);
    expect_set_ok(&c, "log_level", "error");
    assert_int_equal(c.log_level, PS_LOG_ERROR);
    expect_set_ok(&c, "optimizer", "sgd");

    expect_set_error("mode", "foo", "mode: 'foo' is not one of asgd, bsp, ssp");
    expect_set_error("mode", "", "mode: '' is not one of asgd, bsp, ssp");
    expect_set_error("optimizer", "rmsprop", "optimizer: 'rmsprop' is not one of sgd, adam, adamw, adagrad");
    expect_set_error("bsp_sum_order", "random",
                     "bsp_sum_order: 'random' is not one of shard, arrival");
    expect_set_error("log_level", "loud",
                     "log_level: 'loud' is not one of debug, info, warn, error");
}

static void test_string(void **state)
{
    ps_config c;
    char err[256];
    char big[PS_CONFIG_PATH_MAX + 10];

    ps_config_defaults(&c);
    expect_set_ok(&c, "state_dir", "/var/lib/psd");
    assert_string_equal(c.state_dir, "/var/lib/psd");
    expect_set_ok(&c, "port_file", " run/psd.port ");
    assert_string_equal(c.port_file, "run/psd.port");
    expect_set_ok(&c, "state_dir", "");
    assert_string_equal(c.state_dir, "");

    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ps_config before = c;
    assert_int_equal(ps_config_set(&c, "state_dir", big, err, sizeof err), PS_EINVAL);
    assert_non_null(strstr(err, "state_dir: value is"));
    assert_memory_equal(&c, &before, sizeof c);

    /* The longest that fits. */
    big[PS_CONFIG_PATH_MAX - 1] = '\0';
    expect_set_ok(&c, "state_dir", big);
    assert_int_equal(strlen(c.state_dir), PS_CONFIG_PATH_MAX - 1);
}

static void test_size(void **state)
{
    ps_config c;
    uint64_t v;
    char buf[64];

    ps_config_defaults(&c);
    expect_set_ok(&c, "max_frame", "1G");
    assert_int_equal(c.max_frame, 1u << 30);
    expect_set_ok(&c, "max_frame", "4K");
    assert_int_equal(c.max_frame, 4096);
    expect_set_ok(&c, "max_frame", "4096");
    assert_int_equal(c.max_frame, 4096);
    expect_set_ok(&c, "max_frame", "2047M");
    assert_int_equal(c.max_frame, UINT64_C(2047) << 20);
    expect_set_ok(&c, "max_frame", "16mb");
    assert_int_equal(c.max_frame, 16u << 20);
    expect_set_ok(&c, "max_frame", "16MiB");
    assert_int_equal(c.max_frame, 16u << 20);
    expect_set_ok(&c, "max_frame", "100000");
    format_of(&c, "max_frame", buf, sizeof buf);
    assert_string_equal(buf, "100000");
    expect_set_ok(&c, "max_frame", "1536K");
    format_of(&c, "max_frame", buf, sizeof buf);
    assert_string_equal(buf, "1536K");

    expect_set_error("max_frame", "1K", "max_frame: 1K is out of range 4K..2147483647");
    expect_set_error("max_frame", "2049M", "max_frame: 2049M is out of range 4K..2147483647");
    expect_set_error("max_frame", "1T", "max_frame: 1T is out of range 4K..2147483647");
    expect_set_error("max_frame", "64Q",
                     "max_frame: '64Q' is not a size (a whole number of bytes with an "
                     "optional unit K, M, G or T)");
    expect_set_error("max_frame", "-1",
                     "max_frame: '-1' is not a size (a whole number of bytes with an "
                     "optional unit K, M, G or T)");

    assert_int_equal(ps_config_parse_size("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(ps_config_parse_size("3t", &v), 0);
    assert_int_equal(v, UINT64_C(3) << 40);
    assert_int_equal(ps_config_parse_size("7B", &v), 0);
    assert_int_equal(v, 7);
    assert_int_equal(ps_config_parse_size("16777215T", &v), 0);
    assert_int_equal(ps_config_parse_size("16777216T", &v), PS_EINVAL);   /* 2^64 */
    assert_int_equal(ps_config_parse_size("18446744073709551616", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("M", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("1.5G", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("1 G", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("1iB", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size("1GG", &v), PS_EINVAL);
    assert_int_equal(ps_config_parse_size(NULL, &v), PS_EINVAL);
}

static void test_duration(void **state)
{
    uint64_t ms;
    char buf[32];

    assert_int_equal(ps_config_parse_duration("30s", &ms), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(ps_config_parse_duration("30", &ms), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(ps_config_parse_duration("250ms", &ms), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(ps_config_parse_duration("1.5s", &ms), 0);
    assert_int_equal(ms, 1500);
    assert_int_equal(ps_config_parse_duration("5m", &ms), 0);
    assert_int_equal(ms, 300000);
    assert_int_equal(ps_config_parse_duration("2h", &ms), 0);
    assert_int_equal(ms, 7200000);
    assert_int_equal(ps_config_parse_duration(".5s", &ms), 0);
    assert_int_equal(ms, 500);
    assert_int_equal(ps_config_parse_duration("0", &ms), 0);
    assert_int_equal(ms, 0);
    assert_int_equal(ps_config_parse_duration("-1s", &ms), PS_EINVAL);
    assert_int_equal(ps_config_parse_duration("1d", &ms), PS_EINVAL);
    assert_int_equal(ps_config_parse_duration("s", &ms), PS_EINVAL);
    assert_int_equal(ps_config_parse_duration("", &ms), PS_EINVAL);
    assert_int_equal(ps_config_parse_duration("inf", &ms), PS_EINVAL);
    assert_int_equal(ps_config_parse_duration("1e30h", &ms), PS_EINVAL);

    /* durations are printed in the largest unit that is exact */
    ps_config c;
    ps_config_defaults(&c);
    const ps_config_option *o = ps_config_find("idle_timeout");
    assert_non_null(o);
    c.idle_timeout = 7200000;
    ps_config_format(&c, o, buf, sizeof buf);
    assert_string_equal(buf, "2h");
    c.idle_timeout = 90000;
    ps_config_format(&c, o, buf, sizeof buf);
    assert_string_equal(buf, "90s");
    c.idle_timeout = 1500;
    ps_config_format(&c, o, buf, sizeof buf);
    assert_string_equal(buf, "1500ms");
    c.idle_timeout = 0;
    ps_config_format(&c, o, buf, sizeof buf);
    assert_string_equal(buf, "0s");
}

static void test_bool(void **state)
{
    /* through a boolean option, staleness_scale */
    ps_config c;
    char err[256];
    ps_config_defaults(&c);

    assert_int_equal(ps_config_set(&c, "staleness_scale", "yes", err, sizeof err), 0);
    assert_true(c.staleness_scale);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "OFF", err, sizeof err), 0);
    assert_false(c.staleness_scale);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "true", err, sizeof err), 0);
    assert_true(c.staleness_scale);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "0", err, sizeof err), 0);
    assert_false(c.staleness_scale);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "maybe", err, sizeof err), PS_EINVAL);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "", err, sizeof err), PS_EINVAL);
    assert_int_equal(ps_config_set(&c, "staleness_scale", "yess", err, sizeof err), PS_EINVAL);
    assert_false(c.staleness_scale); /* a refused value changes nothing */
}

/* RFC 6761 6.3: localhost and the names under .localhost are loopback,
 * taken without the resolver; names that only look alike are not. */
static void test_localhost_names(void **state)
{
    (void)state;
    static const char *const yes[] = {"localhost", "LocalHost", "localhost.", "a.localhost", "ps-1.LOCALHOST."};
    static const char *const no[] = {"", ".", "localhos", "mylocalhost", "localhost.example.org", "localhost..",
                                     "127.0.0.1", "::1", "xlocalhost."};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_true(ps_host_is_localhost(yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(ps_host_is_localhost(no[i]));
}

/* A list of addresses: each once, at most cap; an entry of a part map
 * ("A/B", a part given as its replicas) adds each of its addresses. */
static void test_addr_list(void **state)
{
    (void)state;
    char list[3][PS_ADDR_MAX + 1];
    uint32_t n = 0;
    assert_int_equal(ps_addr_list_add(list, &n, 3, "a:1", 3), 0);
    assert_int_equal(ps_addr_list_add(list, &n, 3, "a:1/b:2", 3), 0); /* the first 3 bytes: there already */
    assert_int_equal(ps_addr_list_add(list, &n, 3, "", 0), -1);
    ps_addr_list_add_entry(list, &n, 3, "b:2/a:1//c:3/d:4"); /* d:4 past cap */
    assert_int_equal(n, 3);
    assert_string_equal(list[0], "a:1");
    assert_string_equal(list[1], "b:2");
    assert_string_equal(list[2], "c:3");
    n = 0;
    ps_addr_list_add_entry(list, &n, 3, "//");
    assert_int_equal(n, 0);
    ps_addr_list_add_entry(list, &n, 3, "e:5");
    assert_int_equal(n, 1);
    assert_string_equal(list[0], "e:5");
}

static void test_hostport(void **state)
{
    char host[PS_CONFIG_HOST_MAX], err[512];
    int port = -1;

    assert_int_equal(ps_hostport_parse("127.0.0.1:7000", host, sizeof host, &port, err,
                                              sizeof err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7000);
    assert_int_equal(ps_hostport_parse("[::1]:0", host, sizeof host, &port, err,
                                              sizeof err), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_int_equal(ps_hostport_parse("[fe80::1:2]:65535", host, sizeof host, &port,
                                              err, sizeof err), 0);
    assert_string_equal(host, "fe80::1:2");
    assert_int_equal(port, 65535);
    assert_int_equal(ps_hostport_parse("localhost:80", host, sizeof host, &port, err,
                                              sizeof err), 0);
    assert_string_equal(host, "localhost");
    assert_int_equal(ps_hostport_parse("ps-1.example.org:7000", host, sizeof host,
                                              &port, err, sizeof err), 0);
    assert_string_equal(host, "ps-1.example.org");
    assert_int_equal(ps_hostport_parse("0.0.0.0:7000", host, sizeof host, &port, err,
                                              sizeof err), 0);

    static const char *const bad[] = {
        "",                 /* empty */
        "127.0.0.1",        /* no port */
        "127.0.0.1:",       /* empty port */
        "127.0.0.1:65536",  /* port too big */
        "127.0.0.1:-1",     /* negative port */
        "127.0.0.1:70x",    /* garbage port */
        "127.0.0.1:123456", /* too many digits */
        ":7000",            /* no host */
        "300.1.1.1:7000",   /* not IPv4 */
        "1.2.3:7000",       /* not IPv4 either */
        "::1:7000",         /* IPv6 without brackets */
        "[::1]",            /* no port */
        "[::1]7000",        /* no colon */
        "[::1:7000",        /* no closing bracket */
        "[zz::1]:7000",     /* not IPv6 */
        "[127.0.0.1]:7000", /* brackets are for IPv6 */
        "bad host:7000",    /* space in a host name */
        "-bad:7000",        /* label starts with '-' */
        "a..b:7000",        /* empty label */
        "host/x:7000",      /* '/' */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        if (ps_hostport_parse(bad[i], host, sizeof host, &port, err, sizeof err) == 0)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(strlen(err) > 0);
    }

    /* A few messages in full. */
    ps_hostport_parse("127.0.0.1", host, sizeof host, &port, err, sizeof err);
    assert_string_equal(err, "'127.0.0.1' has no port; write host:port, e.g. 127.0.0.1:7000");
    ps_hostport_parse("::1:7000", host, sizeof host, &port, err, sizeof err);
    assert_string_equal(err, "'::1:7000': an IPv6 address needs brackets, e.g. [::1]:7000");
    ps_hostport_parse("h:65536", host, sizeof host, &port, err, sizeof err);
    assert_string_equal(err, "'h:65536': port 65536 is out of range 0..65535");

    /* Host buffer too small for the host. */
    char small[4];
    assert_int_equal(ps_hostport_parse("localhost:1", small, sizeof small, &port, err,
                                              sizeof err), PS_EINVAL);

    /* Through the table, with the key in front, and formatted back. */
    ps_config c;
    char buf[PS_CONFIG_VALUE_MAX];
    ps_config_defaults(&c);
    expect_set_ok(&c, "listen", "[::1]:0");
    assert_string_equal(c.listen.host, "::1");
    assert_int_equal(c.listen.port, 0);
    format_of(&c, "listen", buf, sizeof buf);
    assert_string_equal(buf, "[::1]:0");
    expect_set_error("listen", "127.0.0.1:99999",
                     "listen: '127.0.0.1:99999': port 99999 is out of range 0..65535");
}

/* ---- keys ---- */

static void test_unknown_key(void **state)
{
    ps_config c;

    expect_set_error("lrr", "0.1", "unknown key 'lrr' (did you mean 'lr'?)");
    expect_set_error("worker", "2", "unknown key 'worker' (did you mean 'workers'?)");
    expect_set_error("frobnicate", "1", "unknown key 'frobnicate'");
    expect_set_error("", "1", "unknown key ''");
    expect_set_error("LR", "1", "unknown key 'LR' (did you mean 'lr'?)");

    /* '-' may stand for '_'. */
    ps_config_defaults(&c);
    expect_set_ok(&c, "max-frame", "1M");
    assert_int_equal(c.max_frame, 1u << 20);
    assert_ptr_equal(ps_config_find("bsp-sum-order"), ps_config_find("bsp_sum_order"));
    assert_null(ps_config_find("max_frame_"));
    assert_null(ps_config_find(NULL));
}

static void test_print_and_differs(void **state)
{
    ps_config a, b;
    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    char line[PS_CONFIG_VALUE_MAX + 64];

    ps_config_defaults(&a);
    b = a;
    expect_set_ok(&b, "lr", "0.5");
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ps_config_differs(&a, &b, &opts[i]), strcmp(opts[i].name, "lr") == 0);

    FILE *f = tmpfile();
    assert_non_null(f);
    ps_config_print(&b, f);
    rewind(f);
    size_t lines = 0;
    bool saw_lr = false, saw_listen = false;
    while (fgets(line, sizeof line, f)) {
        lines++;
        saw_lr |= strcmp(line, "lr = 0.5\n") == 0;
        saw_listen |= strcmp(line, "listen = 127.0.0.1:7000\n") == 0;
    }
    fclose(f);
    assert_int_equal(lines, n);
    assert_true(saw_lr);
    assert_true(saw_listen);
}

/* ---- files ---- */

static void test_load_good(void **state)
{
    ps_config c;
    char err[512] = "";
    const char *path = write_tmp("# a comment\n"
                                 "; another comment\n"
                                 "\n"
                                 "workers = 4\n"
                                 "mode=bsp\n"
                                 "   lr = 0.05   \n"
                                 "\tmomentum = 0.5\n"
                                 "[psd]\n"
                                 "  max_frame = 1M\n"
                                 "  state_dir = /var/lib/psd\n"
                                 "[PSD]\r\n"
                                 "listen = [::1]:0\r\n"
                                 "log_level = debug"); /* no final newline */

    ps_config_defaults(&c);
    int rc = ps_config_load(&c, path, err, sizeof err);
    unlink(path);
    if (rc != 0)
        fail_msg("load failed: %s", err);
    assert_int_equal(c.workers, 4);
    assert_int_equal(c.mode, PS_MODE_BSP);
    assert_true(c.lr == 0.05);
    assert_true(c.momentum == 0.5);
    assert_int_equal(c.max_frame, 1u << 20);
    assert_string_equal(c.state_dir, "/var/lib/psd");
    assert_string_equal(c.listen.host, "::1");
    assert_int_equal(c.listen.port, 0);
    assert_int_equal(c.log_level, PS_LOG_DEBUG);
    /* Untouched keys keep what they had. */
    assert_int_equal(c.max_connections, 1024);
}

static void test_load_empty(void **state)
{
    ps_config c, before;
    char err[256];
    const char *path = write_tmp("");

    ps_config_defaults(&c);
    before = c;
    assert_int_equal(ps_config_load(&c, path, err, sizeof err), 0);
    unlink(path);
    assert_memory_equal(&c, &before, sizeof c);
}

/* Load text that must fail with "<path>:<msg>", leaving c as it was. */
static void expect_load_error(const char *text, const char *msg)
{
    ps_config c, before;
    char err[1024] = "", want[1024];
    const char *path = write_tmp(text);

    ps_config_defaults(&c);
    expect_set_ok(&c, "workers", "7"); /* not just the defaults */
    before = c;
    assert_int_equal(ps_config_load(&c, path, err, sizeof err), PS_EINVAL);
    snprintf(want, sizeof want, "%s:%s", path, msg);
    unlink(path);
    assert_string_equal(err, want);
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_load_bad_lines(void **state)
{
    /* Good lines before the bad one are not applied either. */
    expect_load_error("lr = 0.5\nmode = bsp\nlrr = 0.1\nworkers = 3\n",
                      "3: unknown key 'lrr' (did you mean 'lr'?)");
    expect_load_error("# comment\nlr = 0.x\n", "2: lr: '0.x' is not a number");
    expect_load_error("\n\n\n\n\n\n\n\n\n\n\nworkers = 0\n",
                      "12: workers: 0 is out of range 1..4096");
    expect_load_error("mode = bsp\nthis line has no equals sign\n",
                      "2: syntax error: expected 'key = value', '[section]' or a comment");
    expect_load_error("[psd\nlr = 0.2\n",
                      "1: syntax error: expected 'key = value', '[section]' or a comment");
    expect_load_error("lr = 0.2\n[server]\nworkers = 3\n",
                      "3: unknown section [server]; options go at the top of the file or "
                      "under [psd]");
    /* The first error is reported, whatever its kind. */
    expect_load_error("workers = 5000\nno equals\n", "1: workers: 5000 is out of range 1..4096");
    expect_load_error("no equals\nworkers = 5000\n",
                      "1: syntax error: expected 'key = value', '[section]' or a comment");
    /* An inline '#' is not a comment: it is part of the value. */
    expect_load_error("lr = 0.2 # faster\n", "1: lr: '0.2 # faster' is not a number");
}

static void test_load_long_line(void **state)
{
    char text[2048];
    ps_config c, before;
    char err[512] = "";

    /* A path of 600 bytes does not fit inih's line buffer: a clear error,
     * not a silently cut value. */
    int n = snprintf(text, sizeof text, "workers = 3\nstate_dir = /");
    memset(text + n, 'x', 600);
    strcpy(text + n + 600, "\nlr = 0.2\n");
    const char *path = write_tmp(text);
    ps_config_defaults(&c);
    before = c;
    assert_int_equal(ps_config_load(&c, path, err, sizeof err), PS_EINVAL);
    unlink(path);
    assert_non_null(strstr(err, ":2: line too long"));
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_load_missing(void **state)
{
    ps_config c, before;
    char err[512] = "";

    ps_config_defaults(&c);
    before = c;
    assert_int_equal(ps_config_load(&c, "/nonexistent/dir/psd.conf", err, sizeof err), PS_EIO);
    assert_string_equal(err, "/nonexistent/dir/psd.conf: cannot open: No such file or directory");
    assert_memory_equal(&c, &before, sizeof c);

    /* A directory opens but cannot be read. */
    err[0] = '\0';
    assert_int_equal(ps_config_load(&c, "/", err, sizeof err), PS_EIO);
    assert_non_null(strstr(err, "/: cannot read"));
    assert_memory_equal(&c, &before, sizeof c);
}

/* ---- the shipped conf/psd.conf ---- */

static void test_shipped_conf_parses(void **state)
{
    ps_config c, defaults;
    char err[512] = "";

    ps_config_defaults(&defaults);
    c = defaults;
    int rc = ps_config_load(&c, PS_SOURCE_DIR "/conf/psd.conf", err, sizeof err);
    if (rc != 0)
        fail_msg("conf/psd.conf: %s", err);
    /* Everything in it is commented out: it changes nothing. */
    assert_memory_equal(&c, &defaults, sizeof c);
}

static void trim(char *s)
{
    size_t n = strlen(s), skip = strspn(s, " \t");
    while (n > skip && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' ||
                        s[n - 1] == '\r'))
        n--;
    memmove(s, s + skip, n - skip);
    s[n - skip] = '\0';
}

/* Every key in the table appears in conf/psd.conf as a commented-out line
 * "# key = default", and the file names no key the table lacks. A setting
 * line is '#', one space, then the key; prose may show examples indented
 * further ("#     key = value"). */
static void test_shipped_conf_documents_every_key(void **state)
{
    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    bool seen[256] = {false};
    char line[512];
    int lineno = 0;

    assert_true(n <= sizeof seen / sizeof seen[0]);
    FILE *f = fopen(PS_SOURCE_DIR "/conf/psd.conf", "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[0] != '#' || line[1] != ' ' || line[2] == ' ')
            continue;
        char *body = line + 2;
        char *eq = strchr(body, '=');
        if (!eq)
            continue;
        *eq = '\0';
        char key[512], value[512];
        snprintf(key, sizeof key, "%s", body);
        snprintf(value, sizeof value, "%s", eq + 1);
        trim(key);
        trim(value);
        /* Only lines shaped like a setting: one word before the '='. */
        if (key[0] == '\0' || strspn(key, "abcdefghijklmnopqrstuvwxyz_0123456789") != strlen(key))
            continue;
        const ps_config_option *o = ps_config_find(key);
        if (!o)
            fail_msg("conf/psd.conf:%d documents '%s', which is not an option", lineno, key);
        if (strcmp(value, o->def) != 0)
            fail_msg("conf/psd.conf:%d shows %s = '%s' but the default is '%s'", lineno, key,
                     value, o->def);
        seen[o - opts] = true;
    }
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (!seen[i])
            fail_msg("conf/psd.conf does not document '%s' (default '%s')", opts[i].name,
                     opts[i].def);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_table_sane),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_double),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_addr_list),
        cmocka_unit_test(test_localhost_names),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_print_and_differs),
        cmocka_unit_test(test_load_good),
        cmocka_unit_test(test_load_empty),
        cmocka_unit_test(test_load_bad_lines),
        cmocka_unit_test(test_load_long_line),
        cmocka_unit_test(test_load_missing),
        cmocka_unit_test(test_shipped_conf_parses),
        cmocka_unit_test(test_shipped_conf_documents_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
