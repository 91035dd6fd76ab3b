/* test_settings.c - psd's settings: the option table's hooks and the one
 * cross-check of its settings (server/config.c, server/settings.c), the
 * same at start, --print-config, a reload and `psctl set`:
 * - every option type refuses a bad value (its validate hook) and leaves
 *   the settings as they were; metrics_listen must be an IPv4 or IPv6
 *   address with a port (parsed once, handed back);
 * - the cross-checks: BSP's backup_workers below workers, nonfinite = clip
 *   needs clip_norm, admin_token_file needs token_file, protected mode for
 *   listen and metrics_listen;
 * - a reload whose settings fail the cross-check leaves the old ones in
 *   force; one that passes runs the apply hooks (the optimizer takes its
 *   settings, the policy is told, the log level changes) and keeps what
 *   needs a restart;
 * - psd --print-config exits non-zero for what a start refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/dispatch/admin.h"
#include "server/config/config.h"
#include "server/policy/policy.h"
#include "server/store/psd.h"

extern char **environ;

static ps_config with(const char *const *kv)
{
    ps_config c;
    char err[256];
    ps_config_defaults(&c);
    for (; *kv; kv += 2)
        assert_int_equal(ps_config_set(&c, kv[0], kv[1], err, sizeof err), 0);
    return c;
}

static void expect_refused_when(const char *const *kv, srv_check_when when, const char *part)
{
    ps_config c = with(kv);
    char err[1200] = "";
    srv_settings out;
    memset(&out, 0x5a, sizeof out);
    srv_settings before = out;
    assert_int_equal(srv_config_check(&c, when, &out, err, sizeof err), PS_EINVAL);
    if (!strstr(err, part))
        fail_msg("'%s' lacks '%s'", err, part);
    assert_memory_equal(&out, &before, sizeof out); /* nothing handed back */
}

static void expect_refused(const char *const *kv, const char *part)
{
    expect_refused_when(kv, SRV_CHECK_START, part);
    expect_refused_when(kv, SRV_CHECK_PRINT, part);
    expect_refused_when(kv, SRV_CHECK_RUN, part);
}

/* key = value is refused by the option's validate hook, naming the
 * option, and the settings stay as they were. */
static void expect_bad_value(const char *key, const char *value, const char *part)
{
    ps_config c, before;
    char err[600] = "";
    ps_config_defaults(&c);
    before = c;
    assert_int_equal(ps_config_set(&c, key, value, err, sizeof err), PS_EINVAL);
    if (!strstr(err, part) || strncmp(err, key, strlen(key)) != 0)
        fail_msg("%s = '%s': '%s' lacks the option's name or '%s'", key, value, err, part);
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_defaults_pass(void **state)
{
    (void)state;
    ps_config c;
    ps_config_defaults(&c);
    char err[512];
    srv_settings out;
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, &out, err, sizeof err), 0);
    assert_string_equal(out.metrics_host, ""); /* no endpoint */
    assert_int_equal(out.listen_addr.ss_family, AF_INET); /* 127.0.0.1, resolved */
    assert_int_equal(srv_config_check(&c, SRV_CHECK_RUN, NULL, err, sizeof err), 0);
    assert_int_equal(srv_config_check(&c, SRV_CHECK_PRINT, NULL, err, sizeof err), 0);
}

/* Every row has a validate hook (its own or its type's), and each type
 * refuses a bad value. */
static void test_bad_value_per_type(void **state)
{
    (void)state;
    size_t n;
    const ps_config_option *o = ps_config_options(&n);
    int seen[PS_CT_HOSTPORT + 1] = {0};
    for (size_t i = 0; i < n; i++) {
        assert_non_null(ps_config_validator(&o[i]));
        seen[o[i].type] = 1;
    }
    for (int t = 0; t <= PS_CT_HOSTPORT; t++)
        if (!seen[t])
            fail_msg("no option of type %d: test its bad values here", t);
    expect_bad_value("nesterov", "maybe", "is not a boolean");                          /* BOOL */
    expect_bad_value("workers", "two", "is not an integer");                            /* INT */
    expect_bad_value("workers", "0", "out of range 1..4096");
    expect_bad_value("lr_step_size", "-1", "is not a non-negative integer");            /* U64 */
    expect_bad_value("lr_step_size", "0", "out of range");
    expect_bad_value("lr", "fast", "is not a number");                                  /* DOUBLE */
    expect_bad_value("lr", "nan", "is not a finite number");
    expect_bad_value("momentum", "1", "out of range 0..0.999999");
    expect_bad_value("mode", "async", "is not one of asgd, bsp, ssp");                  /* ENUM */
    char longpath[PS_CONFIG_PATH_MAX + 10];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    expect_bad_value("state_dir", longpath, "the limit is");                            /* STRING */
    expect_bad_value("max_frame", "64X", "is not a size");                              /* SIZE */
    expect_bad_value("max_frame", "1K", "out of range 4K..");
    expect_bad_value("heartbeat_timeout", "10 days", "is not a duration");              /* DURATION */
    expect_bad_value("heartbeat_timeout", "1ms", "out of range 100ms..");
    expect_bad_value("listen", "127.0.0.1", "has no port");                             /* HOSTPORT */
    expect_bad_value("listen", "[::1:7000", "no closing ']'");
}

/* metrics_listen's own validate hook, and the one parse the cross-check
 * hands back. */
static void test_metrics_listen_parsed_once(void **state)
{
    (void)state;
    ps_config c = with((const char *const[]){"metrics_listen", "[::1]:9470", NULL});
    char err[512];
    srv_settings out;
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, &out, err, sizeof err), 0);
    assert_string_equal(out.metrics_host, "::1");
    assert_int_equal(out.metrics_port, 9470);
    assert_int_equal(out.metrics_addr.ss_family, AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&out.metrics_addr)->sin6_port), 9470);
    expect_bad_value("metrics_listen", "localhost:9100", "not an IPv4 or IPv6 address");
    expect_bad_value("metrics_listen", "nonsense", "has no port");
    c = with((const char *const[]){"metrics_listen", "", NULL}); /* off again */
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, &out, err, sizeof err), 0);
    assert_string_equal(out.metrics_host, "");
}

static void test_cross_checks(void **state)
{
    (void)state;
    expect_refused((const char *const[]){"mode", "bsp", "workers", "2", "backup_workers", "2", NULL},
                   "backup_workers (2) must be less than workers (2)");
    /* only BSP has backup workers */
    ps_config c = with((const char *const[]){"mode", "asgd", "workers", "2", "backup_workers", "2", NULL});
    char err[1200];
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    expect_refused((const char *const[]){"nonfinite", "clip", NULL}, "clip_norm above 0");
    c = with((const char *const[]){"nonfinite", "clip", "clip_norm", "5", NULL});
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    expect_refused((const char *const[]){"optimizer", "sgd", "nesterov", "yes", "momentum", "0", NULL},
                   "nesterov = yes needs momentum above 0");
    expect_refused((const char *const[]){"admin_token_file", "admin.token", NULL},
                   "admin_token_file is set but token_file is not");
}

/* local SGD and elastic averaging (PROTOCOL.md section 8): each with its
 * mode alone, with psd's optimizer the plain sgd it then runs, one of the
 * two; what they need passes. */
static void test_averaging_checks(void **state)
{
    (void)state;
    char err[1200];
    const char *const local_ok[] = {"mode", "bsp", "optimizer", "sgd", "momentum", "0", "local_steps", "8", NULL};
    ps_config c = with(local_ok);
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    const char *const elastic_ok[] = {"mode",          "asgd", "optimizer",   "sgd", "momentum", "0",
                                      "elastic_alpha", "0.2",  "elastic_tau", "4",   NULL};
    c = with(elastic_ok);
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "local_steps", "8", NULL},
                   "local_steps averages a round of models: it needs mode = bsp");
    expect_refused((const char *const[]){"mode", "ssp", "optimizer", "sgd", "momentum", "0", "local_steps", "8", NULL},
                   "local_steps averages a round of models: it needs mode = bsp");
    expect_refused((const char *const[]){"mode", "bsp", "optimizer", "adam", "momentum", "0", "local_steps", "8", NULL},
                   "local_steps averages the workers' models; psd's optimizer (adam) would not run: set optimizer = "
                   "sgd without momentum");
    expect_refused((const char *const[]){"mode", "bsp", "optimizer", "sgd", "local_steps", "8", NULL},
                   "psd's optimizer (sgd with momentum) would not run");
    /* the defaults (adagrad) are refused too */
    expect_refused((const char *const[]){"mode", "bsp", "local_steps", "2", NULL}, "psd's optimizer (adagrad)");
    expect_refused((const char *const[]){"mode", "bsp", "optimizer", "sgd", "momentum", "0", "elastic_alpha", "0.1",
                                         NULL},
                   "elastic averaging is asynchronous: it needs mode = asgd");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "adagrad", "elastic_alpha", "0.1", NULL},
                   "elastic_alpha averages the workers' models; psd's optimizer (adagrad) would not run");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "elastic_alpha", "0.1",
                                         "dc_lambda", "0.5", NULL},
                   "staleness_scale and dc_lambda do not apply");
    expect_refused((const char *const[]){"mode", "bsp", "optimizer", "sgd", "momentum", "0", "elastic_alpha", "0.1",
                                         "local_steps", "4", NULL},
                   "local_steps and elastic_alpha are two ways to average: set one");
    expect_bad_value("local_steps", "10001", "local_steps");
    expect_bad_value("elastic_alpha", "1", "elastic_alpha");
    expect_bad_value("elastic_tau", "0", "elastic_tau");
}

/* Hogwild! (PROTOCOL.md section 8): asgd with plain sgd at a constant
 * rate, hogwild_remote only with hogwild, and neither way of averaging:
 * local_steps is refused by its mode, elastic_alpha by name. */
static void test_hogwild_checks(void **state)
{
    (void)state;
    char err[1200];
    const char *const ok[] = {"mode",    "asgd", "optimizer", "sgd", "momentum", "0", "warmup_versions", "0",
                              "hogwild", "on",   NULL};
    ps_config c = with(ok);
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    expect_refused((const char *const[]){"mode", "ssp", "optimizer", "sgd", "momentum", "0", "hogwild", "on", NULL},
                   "hogwild updates the model without rounds or clocks: it needs mode = asgd");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "adam", "hogwild", "on", NULL},
                   "set optimizer = sgd and momentum = 0");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "hogwild", "on",
                                         "weight_decay", "0.01", NULL},
                   "set weight_decay = 0");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "hogwild", "on",
                                         "warmup_versions", "0", "dc_lambda", "0.5", NULL},
                   "set dc_lambda = 0 and staleness_scale = no");
    expect_refused((const char *const[]){"hogwild_remote", "refuse", NULL},
                   "hogwild_remote is set but hogwild is off");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "hogwild", "on",
                                         "warmup_versions", "0", "elastic_alpha", "0.2", NULL},
                   "hogwild and elastic_alpha are two ways to share a model");
    expect_refused((const char *const[]){"mode", "bsp", "optimizer", "sgd", "momentum", "0", "hogwild", "on",
                                         "local_steps", "4", NULL},
                   "hogwild updates the model without rounds or clocks: it needs mode = asgd");
    expect_refused((const char *const[]){"mode", "asgd", "optimizer", "sgd", "momentum", "0", "hogwild", "on",
                                         "warmup_versions", "0", "local_steps", "4", NULL},
                   "local_steps averages a round of models: it needs mode = bsp");
}

/* Without token_file, listen and metrics_listen must be loopback, unless
 * allow_remote_without_token; with a token anything goes. */
static void test_protected_mode(void **state)
{
    (void)state;
    char err[1200];
    expect_refused((const char *const[]){"listen", "0.0.0.0:7000", NULL}, "protected mode");
    expect_refused((const char *const[]){"listen", "[::]:7000", NULL}, "protected mode");
    expect_refused((const char *const[]){"metrics_listen", "0.0.0.0:9100", NULL},
                   "refusing to serve HTTP on 0.0.0.0:9100 without a token (protected mode)");
    ps_config c = with((const char *const[]){"listen", "0.0.0.0:7000", "metrics_listen", "0.0.0.0:9100",
                                             "allow_remote_without_token", "yes", NULL});
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    c = with((const char *const[]){"listen", "0.0.0.0:7000", "metrics_listen", "0.0.0.0:9100", "token_file",
                                   "workers.token", NULL});
    assert_int_equal(srv_config_check(&c, SRV_CHECK_START, NULL, err, sizeof err), 0);
    c = with((const char *const[]){"listen", "[::1]:0", "metrics_listen", "127.0.0.2:0", NULL});
    assert_int_equal(srv_config_check(&c, SRV_CHECK_RUN, NULL, err, sizeof err), 0);
}

/* ---- reload ------------------------------------------------------------- */

static int reconfigured_calls;
static void fake_reconfigured(psd *s)
{
    (void)s;
    reconfigured_calls++;
}
static const srv_policy_ops fake_policy = {.name = "fake", .reconfigured = fake_reconfigured};

/* A configuration file in the test's working directory (the build tree). */
static void write_conf(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static psd *new_psd(const char *conf)
{
    psd *s = calloc(1, sizeof *s);
    assert_non_null(s);
    ps_config_defaults(&s->cfg);
    assert_int_equal(ps_config_set(&s->cfg, "mode", "bsp", NULL, 0), 0);
    assert_int_equal(ps_config_set(&s->cfg, "workers", "3", NULL, 0), 0);
    snprintf(s->config_path, sizeof s->config_path, "%s", conf);
    s->policy = &fake_policy;
    return s;
}

static void test_reload_refused_keeps_settings(void **state)
{
    (void)state;
    const char *conf = "test_settings_reload.conf";
    psd *s = new_psd(conf);
    ps_config before = s->cfg;
    reconfigured_calls = 0;
    /* lr alone would be fine; backup_workers = workers is not, so nothing changes */
    write_conf(conf, "mode = bsp\nworkers = 3\nlr = 0.5\ndc_lambda = 0.1\nbackup_workers = 3\n");
    assert_int_equal(srv_reload(s), PS_EINVAL);
    assert_memory_equal(&s->cfg, &before, sizeof before);
    assert_int_equal(reconfigured_calls, 0);
    /* a file with a bad line: nothing either */
    write_conf(conf, "mode = bsp\nworkers = 3\nlr = 0.5\nmomentum = 2\n");
    assert_int_equal(srv_reload(s), PS_EINVAL);
    assert_memory_equal(&s->cfg, &before, sizeof before);
    unlink(conf);
    free(s);
}

static void test_reload_applies_hooks(void **state)
{
    (void)state;
    const char *conf = "test_settings_apply.conf";
    psd *s = new_psd(conf);
    /* a model with an optimizer, for srv_apply_optimizer to reach */
    assert_int_equal(srv_optim_init(&s->model.opt, &s->cfg, 8), 0);
    s->model.nblk = 1;
    int level = ps_log_get_level();
    reconfigured_calls = 0;
    /* workers needs a restart: kept; the others change */
    write_conf(conf, "mode = bsp\nworkers = 4\nlr = 0.5\nlr_schedule = cosine\ndc_lambda = 0.1\n"
                     "max_connections = 10\nlog_level = error\n");
    assert_int_equal(srv_reload(s), 0);
    assert_int_equal(s->cfg.workers, 3);
    assert_true(s->cfg.lr == 0.5);
    assert_true(s->model.opt.lr == 0.5); /* the optimizer took it */
    assert_int_equal(s->model.opt.lr_schedule, PS_LR_COSINE);
    assert_true(s->cfg.dc_lambda == 0.1);
    assert_int_equal(reconfigured_calls, 1); /* the policy told once */
    assert_int_equal(s->cfg.max_connections, 10);
    assert_int_equal(ps_log_get_level(), PS_LOG_ERROR);
    ps_log_set_level(level);
    srv_optim_free(&s->model.opt);
    unlink(conf);
    free(s);
}

/* Which options may change while psd runs is the apply hooks' to say:
 * `psctl set` and a reload use ps_config_reloadable, --config-reference
 * prints it. */
static void test_reloadable_is_the_apply_hook(void **state)
{
    (void)state;
    assert_true(ps_config_reloadable(ps_config_find("lr")));
    assert_true(ps_config_reloadable(ps_config_find("log_level")));
    assert_true(ps_config_reloadable(ps_config_find("dc_lambda")));
    assert_false(ps_config_reloadable(ps_config_find("workers")));
    assert_false(ps_config_reloadable(ps_config_find("metrics_listen")));
    assert_false(ps_config_reloadable(ps_config_find("optimizer")));
}

/* ---- psd --print-config ---------------------------------------------------- */

/* psd --listen 127.0.0.1:0 --print-config ARGS...: its exit code; its
 * output goes to /dev/null. */
static int print_config(const char *const *args)
{
    const char *argv[32] = {PSD_PATH, "--listen", "127.0.0.1:0", "--print-config"};
    int n = 4;
    for (; *args; args++) {
        assert_true(n < 31);
        argv[n++] = *args;
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, PSD_PATH, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_print_config_exit_codes(void **state)
{
    (void)state;
    assert_int_equal(print_config((const char *const[]){NULL}), 0);
    assert_int_equal(print_config((const char *const[]){"--set", "lr=0.5", NULL}), 0);
    /* a value that does not parse */
    assert_int_equal(print_config((const char *const[]){"--set", "lr=fast", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--set", "metrics_listen=localhost:9100", NULL}), 2);
    /* each cross-check */
    assert_int_equal(print_config((const char *const[]){"--mode", "bsp", "--set", "backup_workers=2", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--set", "nonfinite=clip", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--set", "admin_token_file=a.token", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--listen", "0.0.0.0:0", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--set", "metrics_listen=0.0.0.0:0", NULL}), 2);
    assert_int_equal(print_config((const char *const[]){"--set", "metrics_listen=0.0.0.0:0", "--set",
                                                          "allow_remote_without_token=yes", NULL}),
                     0);
    /* files are a start's to read: a token file that is not there passes */
    assert_int_equal(print_config((const char *const[]){"--set", "token_file=no-such.token", "--listen",
                                                          "0.0.0.0:0", NULL}),
                     0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_pass),
        cmocka_unit_test(test_bad_value_per_type),
        cmocka_unit_test(test_metrics_listen_parsed_once),
        cmocka_unit_test(test_cross_checks),
        cmocka_unit_test(test_averaging_checks),
        cmocka_unit_test(test_hogwild_checks),
        cmocka_unit_test(test_protected_mode),
        cmocka_unit_test(test_reload_refused_keeps_settings),
        cmocka_unit_test(test_reload_applies_hooks),
        cmocka_unit_test(test_reloadable_is_the_apply_hook),
        cmocka_unit_test(test_print_config_exit_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
