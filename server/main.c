/* main.c - psd's life: options, configuration, the loop, signals, exit. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/dispatch/admin.h"
#include "server/report/checkpoint.h"
#include "common/log.h"
#include "common/parse.h"
#include "server/report/ckpt_file.h"
#include "server/report/reshard.h"
#include "server/report/dashboard.h"
#include "server/connection/move_fetch.h"
#include "server/connection/http.h"
#include "server/connection/net.h"
#include "server/connection/follow.h"
#include "server/coord/coord.h"
#include "server/replog/replog.h"
#include "server/report/notify.h"
#include "server/policy/policy.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/store/scratch.h"
#include "server/answer/reply.h"
#include "server/report/safetensors.h"
#include "server/session/session.h"
#include "server/replog/pushid.h"
#include "server/update/update.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psd [options]\n"
            "\n"
            "psd holds a model's parameters and applies the gradients psworker\n"
            "processes push to it. Settings come from the defaults, then the\n"
            "configuration file, then these options.\n"
            "\n"
            "  -c, --config PATH      read settings from PATH (see conf/psd.conf)\n"
            "  -l, --listen HOST:PORT listen address (default 127.0.0.1:7000; port 0 = any free)\n"
            "  -m, --mode MODE        asgd, bsp or ssp\n"
            "  -w, --workers M        workers in a BSP round\n"
            "  -s, --state-dir DIR    directory for state and checkpoints\n"
            "      --port-file PATH   write the bound port to PATH once listening\n"
            "      --replica-of HOST:PORT  follow that leader psd, a replica of its part\n"
            "      --log-level LEVEL  debug, info, warn or error\n"
            "  -o, --set KEY=VALUE    set any configuration key (repeatable), e.g.\n"
            "                         --set lr=0.01 --set metrics_listen=127.0.0.1:9470\n"
            "      --print-config     check and print the resulting settings and exit\n"
            "      --fresh            do not resume from state_dir's checkpoints: move\n"
            "                         them into a dated subfolder of it (set-aside-...;\n"
            "                         nothing is deleted) and start without a model\n"
            "      --init-from FILE   start from the model in FILE, a safetensors file as\n"
            "                         `psctl save` writes it (init_from): its layout and\n"
            "                         values; refused when state_dir holds a checkpoint,\n"
            "                         unless with --fresh\n"
            "      --reshard-from DIR0,DIR1,...\n"
            "                         offline: read the newest checkpoints of a job's old\n"
            "                         parts (their state dirs, in part order), write the\n"
            "                         first checkpoint of new part --part I/N into\n"
            "                         --state-dir (dense model cut anew, table rows by the\n"
            "                         hash of their keys, optimizer state kept) and exit\n"
            "      --part I/N         the new part --reshard-from writes\n"
            "      --config-reference print every setting as a Markdown table (docs/configuration.md)\n"
            "  -h, --help             this help\n"
            "  -V, --version          print the version\n"
            "\n"
            "psd runs in the foreground and logs to stderr. Under systemd (psd.service,\n"
            "Type=notify) it reports READY=1 once it listens, a one-line STATUS= and\n"
            "watchdog pings (WatchdogSec=).\n"
            "\n"
            "Signals:\n"
            "  SIGINT, SIGTERM  stop accepting, answer waiting pulls with SHUTDOWN, write a\n"
            "                   last checkpoint (with a state_dir) and exit 0\n"
            "  SIGHUP           read the configuration file again and apply the settings\n"
            "                   that may change at run time (lr, momentum, schedules,\n"
            "                   log_level, ...; see conf/psd.conf); a file with a bad line\n"
            "                   is refused and psd keeps its settings\n"
            "\n"
            "Exit status: 0 after SIGINT, SIGTERM or `psctl shutdown`; 1 when psd cannot\n"
            "start (address in use, unusable state_dir) or its last checkpoint fails;\n"
            "2 for a bad option or configuration.\n"
            "\n"
            "psctl (see psctl --help) shows and controls a running psd.\n");
}

/* Every option as a Markdown table row: docs/configuration.md's configuration
 * reference is this output, and a test keeps the two equal. */
static void print_reference(FILE *f)
{
    size_t n;
    const ps_config_option *o = ps_config_options(&n);
    fprintf(f, "| key | default | reload | meaning |\n|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "| `%s` | `%s` | %s | %s |\n", o[i].name, o[i].def[0] ? o[i].def : "(empty)",
                ps_config_reloadable(&o[i]) ? "yes" : "no", o[i].help);
}

static int write_port_file(const char *path, int port)
{
    char tmp[PS_CONFIG_PATH_MAX + 16];
    if (strlen(path) >= PS_CONFIG_PATH_MAX)
        return -1;
    memcpy(tmp, path, strlen(path));
    memcpy(tmp + strlen(path), ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "%d\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* psd's stop (psd.shutdown): see psd.h. Does nothing when psd is already
 * stopping. */
static void srv_shutdown(psd *s, const char *why)
{
    if (s->stopping)
        return;
    PS_LOG(PS_LOG_INFO, "%s: stopping (model version %llu)", why, (unsigned long long)s->model.version);
    srv_notify_stopping(s, why);
    uv_signal_stop(&s->sigint);
    uv_signal_stop(&s->sigterm);
    uv_signal_stop(&s->sighup);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sighup, NULL);
    uv_timer_stop(&s->tick);
    uv_close((uv_handle_t *)&s->tick, NULL);
    srv_http_stop(s);
    srv_admin_stop(s); /* before the connections are shut: one answer each */
    srv_coord_stop(s);
    srv_follow_stop(s);
    srv_move_fetch_stop(s);
    srv_move_drop_close(s);
    srv_stop(s);
}

/* stop_grace: after a first SIGTERM or SIGINT with workers connected, psd
 * serves on until they have left or this time (srv_now_ms) has come; the
 * tick checks. 0: no grace running. */
static uint64_t g_stop_deadline;
static const char *g_stop_signal;
static int g_stop_checkpointed; /* the grace's one checkpoint is started */

static uint32_t workers_connected(const psd *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->state == SRV_W_CONNECTED)
            n++;
    return n;
}

static void stop_grace_tick(psd *s, uint64_t now)
{
    if (!g_stop_deadline || s->stopping)
        return;
    uint32_t n = workers_connected(s);
    if (n == 0) {
        PS_LOG(PS_LOG_INFO, "%s: every worker has left", g_stop_signal);
    } else if (now >= g_stop_deadline) {
        PS_LOG(PS_LOG_WARN, "%s: stop_grace over with %u worker%s still connected", g_stop_signal, n,
               n == 1 ? "" : "s");
    } else {
        if (!g_stop_checkpointed) /* once, at the first round's end */
            g_stop_checkpointed = srv_checkpoint_at_rest(s, g_stop_signal);
        return;
    }
    srv_shutdown(s, g_stop_signal);
}

/* A leader's hand-back (coord/handback.c) is over: psd stops. */
static void handed_back(psd *s)
{
    srv_shutdown(s, g_stop_signal);
}

static void on_signal(uv_signal_t *h, int signum)
{
    psd *s = h->data;
    if (signum == SIGHUP) {
        PS_LOG(PS_LOG_INFO, "SIGHUP: reloading %s", s->config_path[0] ? s->config_path : "(no configuration file)");
        if (srv_update_busy(s))
            s->reload_pending = 1; /* after the update off the loop */
        else
            srv_reload(s);
        return;
    }
    const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (!g_stop_signal && srv_coord_hand_back(s, name, handed_back)) {
        g_stop_signal = name; /* a second signal stops at once */
        return;
    }
    uint32_t n = workers_connected(s);
    if (!g_stop_deadline && s->cfg.stop_grace && n > 0) {
        g_stop_deadline = srv_now_ms() + s->cfg.stop_grace;
        g_stop_signal = name;
        PS_LOG(PS_LOG_INFO, "%s: waiting up to %.1f s (stop_grace) for %u connected worker%s to leave, then "
               "stopping (model version %llu); a second signal stops at once", name,
               (double)s->cfg.stop_grace / 1e3, n, n == 1 ? "" : "s", (unsigned long long)s->model.version);
        g_stop_checkpointed = srv_checkpoint_at_rest(s, name);
        return;
    }
    srv_shutdown(s, name);
}

#define TICK_MS 250 /* on_tick's period */

/* psd's own stalls do not count as its peers' silence: while its loop is
 * held (a table's slots rehashed, a stop by SIGSTOP or a debugger, the
 * machine swapping) their heartbeats and hellos wait unread in the
 * sockets, and the first tick after it runs before they are read. A tick
 * that comes more than 2 periods after the last moves every connected
 * worker's last-seen time, every connection's last-message time and every
 * connection's connect time (which handshake_timeout counts from) forward
 * by the stall's length, never past now. */
static void credit_stall(psd *s, uint64_t now)
{
    uint64_t gap = now - s->last_tick_ms;
    s->last_tick_ms = now;
    if (gap <= 2 * TICK_MS)
        return;
    uint64_t stall = gap - TICK_MS;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (w && w->state == SRV_W_CONNECTED) {
            w->last_seen_ms = w->last_seen_ms + stall < now ? w->last_seen_ms + stall : now;
            n++;
        }
    }
    for (srv_conn *c = s->conns; c; c = c->next) {
        c->last_msg_ms = c->last_msg_ms + stall < now ? c->last_msg_ms + stall : now;
        c->connected_ms = c->connected_ms + stall < now ? c->connected_ms + stall : now;
    }
    if (n > 0)
        PS_LOG(PS_LOG_WARN, "psd's loop was held for %.1f s; its %u connected worker%s silence is counted "
               "without it", (double)stall / 1e3, n, n == 1 ? "'s" : "s'");
}

/* Declares dead every connected worker silent for heartbeat_timeout. A
 * worker waiting for a parked pull is waiting for psd, not silent: its
 * clock restarts when the pull is answered. */
static void check_liveness(psd *s, uint64_t now)
{
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (!w || w->state != SRV_W_CONNECTED || !w->conn || w->conn->parked)
            continue;
        if (now - w->last_seen_ms <= s->cfg.heartbeat_timeout)
            continue;
        srv_conn *c = w->conn;
        snprintf(c->close_reason, sizeof c->close_reason, "silent for %.1f s (heartbeat_timeout %.1f s)",
                 (double)(now - w->last_seen_ms) / 1e3, (double)s->cfg.heartbeat_timeout / 1e3);
        srv_conn_close(c);
    }
}

/* Closes connections that have not said hello within handshake_timeout. */
static void check_handshakes(psd *s, uint64_t now)
{
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->role == PS_ROLE_NONE && !c->closing && !c->close_after_write &&
            now - c->connected_ms > s->cfg.handshake_timeout)
            srv_send_error(c, 0, PS_ETIMEOUT, 1, "%s within handshake_timeout (%.1f s)",
                           c->auth ? "no auth (the answer to psd's challenge)" : "no hello",
                           (double)s->cfg.handshake_timeout / 1e3);
    }
}

/* Closes admin connections silent for idle_timeout, unless psd owes them a
 * reply (a parked pull, a checkpoint). Workers have heartbeat_timeout. */
static void check_idle(psd *s, uint64_t now)
{
    if (!s->cfg.idle_timeout)
        return;
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->role != PS_ROLE_ADMIN || c->closing || c->close_after_write || c->parked ||
            now - c->last_msg_ms <= s->cfg.idle_timeout || srv_admin_waiting(s, c->cid))
            continue;
        SRV_COUNT(s, disconnects_idle, 1);
        srv_send_error(c, 0, PS_ETIMEOUT, 1, "silent for %.1f s, over idle_timeout (%.1f s)",
                       (double)(now - c->last_msg_ms) / 1e3, (double)s->cfg.idle_timeout / 1e3);
    }
}

static void on_tick(uv_timer_t *t)
{
    psd *s = t->data;
    uint64_t now = srv_now_ms();
    srv_model_sync(&s->model); /* Hogwild!: the workers' steps since */
    credit_stall(s, now);
    check_liveness(s, now);
    check_handshakes(s, now);
    check_idle(s, now);
    srv_linger_tick(s, now);
    srv_dash_tick(s, now);
    srv_admin_tick(s);
    srv_admin_repl_tick(s);
    srv_notify_tick(s, now);
    if (s->policy->tick && s->policy->tick(s) == SRV_WAKE)
        srv_answer_parked(s);
    srv_join_tick(s, now);
    srv_checkpoint_rest_tick(s);
    stop_grace_tick(s, now);
    if (s->stopping)
        return;
    if (s->cfg.checkpoint_interval && s->model.initialized) {
        uint64_t last = s->stats.checkpoint_ms ? s->stats.checkpoint_ms : s->stats.init_ms;
        if (now - last >= s->cfg.checkpoint_interval)
            srv_checkpoint_start(s, 0);
    }
    if (now - s->last_rate_ms < 1000)
        return;
    s->last_rate_ms = now;
    srv_stats_rates(s);
    srv_tables_rates(&s->tables);
}

/* glibc serves allocations of 128 KiB and more with mmap at first, but
 * each free of one raises that threshold to its size, after which model
 * blocks and receive buffers come from the heap, where fragmentation keeps
 * freed ones resident (psbench, 235k floats, 8 workers, asgd: peak RSS
 * 23-82 MiB, over the bound of 66 in 4 of 15 runs, against 22-46 MiB in 9
 * runs with the threshold fixed). A
 * fixed threshold keeps them mmapped: freed memory goes back at once, and
 * steady state allocates nothing anyway (blocks are pooled). */
static void malloc_setup(void)
{
#if defined(__GLIBC__) && defined(M_MMAP_THRESHOLD)
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
}

/* Options that map to configuration keys are collected and applied after the
 * file, so flags always win (also over a reloaded file: s->cli_sets). */
/* psd --reshard-from DIRS --part I/N --state-dir NEW: writes new part I of
 * N's first checkpoint into NEW from the old parts' and returns psd's exit
 * status. */
static int reshard(psd *s, const char *from, const char *part)
{
    char err[1200];
    uint64_t i = 0, n = 0;
    const char *slash = part ? strchr(part, '/') : NULL;
    char num[32];
    if (!from || !part) {
        fprintf(stderr, "psd: --reshard-from and --part go together: --reshard-from DIR0,DIR1,... --part I/N "
                        "--state-dir NEW\n");
        return 2;
    }
    if (!slash || (size_t)(slash - part) >= sizeof num ||
        (snprintf(num, sizeof num, "%.*s", (int)(slash - part), part), ps_parse_u64(num, PS_PARTS_MAX, &i)) != 0 ||
        ps_parse_u64(slash + 1, PS_PARTS_MAX, &n) != 0 || n == 0 || i >= n) {
        fprintf(stderr, "psd: --part %s: I/N with 0 <= I < N <= %u (the new part this psd writes)\n", part,
                PS_PARTS_MAX);
        return 2;
    }
    if (!s->cfg.state_dir[0]) {
        fprintf(stderr, "psd: --reshard-from needs --state-dir: the new part's state dir, where its checkpoint "
                        "goes\n");
        return 2;
    }
    srv_ckpt_id *vers = NULL;
    size_t nv = srv_ckpt_list(s->cfg.state_dir, &vers);
    free(vers);
    if (nv > 0) {
        fprintf(stderr, "psd: --reshard-from: the new part's state dir %s holds a checkpoint already; give an "
                        "empty one (or --fresh to set its checkpoints aside)\n",
                s->cfg.state_dir);
        return 1;
    }
    if (srv_reshard(s, from, (uint32_t)i, (uint32_t)n, err, sizeof err) != 0) {
        fprintf(stderr, "psd: --reshard-from: %s\n", err);
        return 1;
    }
    if (srv_checkpoint_write_now(s) != 0) {
        fprintf(stderr, "psd: --reshard-from: could not write the checkpoint into %s (see the log above)\n",
                s->cfg.state_dir);
        return 1;
    }
    PS_LOG(PS_LOG_INFO, "part %llu of %llu written into %s: start psd with --state-dir %s as address %llu of "
                        "the workers' --server list of %llu",
           (unsigned long long)i, (unsigned long long)n, s->cfg.state_dir, s->cfg.state_dir,
           (unsigned long long)i + 1, (unsigned long long)n);
    return 0;
}

int main(int argc, char **argv)
{
    static psd srv;
    psd *s = &srv;
    malloc_setup();
    char err[1200];
    const char *config_path = NULL;
    srv_setting sets[128];
    int nsets = 0, print_config = 0, fresh = 0;
    const char *reshard_from = NULL, *reshard_part = NULL;
    enum {
        OPT_PORT_FILE = 1000,
        OPT_LOG_LEVEL,
        OPT_PRINT_CONFIG,
        OPT_CONFIG_REFERENCE,
        OPT_FRESH,
        OPT_INIT_FROM,
        OPT_RESHARD_FROM,
        OPT_PART,
        OPT_REPLICA_OF
    };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},     {"listen", required_argument, NULL, 'l'},
        {"mode", required_argument, NULL, 'm'},       {"workers", required_argument, NULL, 'w'},
        {"state-dir", required_argument, NULL, 's'},  {"port-file", required_argument, NULL, OPT_PORT_FILE},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"set", required_argument, NULL, 'o'},        {"print-config", no_argument, NULL, OPT_PRINT_CONFIG},
        {"config-reference", no_argument, NULL, OPT_CONFIG_REFERENCE},
        {"fresh", no_argument, NULL, OPT_FRESH},      {"init-from", required_argument, NULL, OPT_INIT_FROM},
        {"reshard-from", required_argument, NULL, OPT_RESHARD_FROM},
        {"part", required_argument, NULL, OPT_PART},
        {"replica-of", required_argument, NULL, OPT_REPLICA_OF},
        {"help", no_argument, NULL, 'h'},             {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };

    ps_log_init("psd", PS_LOG_INFO);
    ps_config_defaults(&s->cfg);
    int opt;
    while ((opt = getopt_long(argc, argv, "c:l:m:w:s:o:hV", longopts, NULL)) != -1) {
        const char *key = NULL;
        switch (opt) {
        case 'c':
            config_path = optarg;
            continue;
        case 'l': key = "listen"; break;
        case OPT_REPLICA_OF: key = "replica_of"; break;
        case 'm': key = "mode"; break;
        case 'w': key = "workers"; break;
        case 's': key = "state_dir"; break;
        case OPT_PORT_FILE: key = "port_file"; break;
        case OPT_LOG_LEVEL: key = "log_level"; break;
        case OPT_INIT_FROM: key = "init_from"; break;
        case OPT_CONFIG_REFERENCE:
            print_reference(stdout);
            return 0;
        case OPT_PRINT_CONFIG:
            print_config = 1;
            continue;
        case OPT_FRESH:
            fresh = 1;
            continue;
        case OPT_RESHARD_FROM:
            reshard_from = optarg;
            continue;
        case OPT_PART:
            reshard_part = optarg;
            continue;
        case 'o': {
            char *eq = strchr(optarg, '=');
            if (!eq) {
                fprintf(stderr, "psd: --set wants KEY=VALUE, got '%s'\n", optarg);
                return 2;
            }
            *eq = '\0';
            key = optarg;
            optarg = eq + 1;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("psd %s (protocol %d)\n", PSD_VERSION, PS_PROTO_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (nsets >= (int)(sizeof sets / sizeof sets[0])) {
            fprintf(stderr, "psd: too many options\n");
            return 2;
        }
        sets[nsets++] = (srv_setting){key, optarg};
    }
    if (optind < argc) {
        fprintf(stderr, "psd: unexpected argument '%s' (see psd --help)\n", argv[optind]);
        return 2;
    }
    if (config_path && ps_config_load(&s->cfg, config_path, err, sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    for (int i = 0; i < nsets; i++) {
        if (ps_config_set(&s->cfg, sets[i].key, sets[i].value, err, sizeof err) != 0) {
            fprintf(stderr, "psd: %s\n", err);
            return 2;
        }
    }
    /* the one cross-check, as a reload and `psctl set` make it; --print-config
     * checks settings, not this machine's files (token files and state_dir
     * are read below, at start only): the configuration may be meant for
     * another machine (a container, a cluster) */
    if (srv_config_check(&s->cfg, print_config ? SRV_CHECK_PRINT : SRV_CHECK_START, &s->settings, err,
                         sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    if (print_config) {
        ps_config_print(&s->cfg, stdout);
        return 0;
    }
    if (srv_auth_load(s, err, sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 2;
    }
    /* before anything else: not at the first checkpoint */
    if (srv_state_dir_check(s->cfg.state_dir, err, sizeof err) != 0) {
        fprintf(stderr, "psd: %s\n", err);
        return 1;
    }
    s->cli_sets = sets;
    s->ncli_sets = nsets;
    if (config_path)
        snprintf(s->config_path, sizeof s->config_path, "%s", config_path);
    ps_log_set_level(s->cfg.log_level);

    signal(SIGPIPE, SIG_IGN);
    s->loop = uv_default_loop();
    s->shutdown = srv_shutdown;
    s->start_ms = srv_now_ms();
    s->policy = srv_policy_for(&s->cfg);
    s->clock = srv_now_ms;
    srv_stats_init(s);
    if (fresh && s->cfg.state_dir[0]) {
        char aside[PS_CONFIG_PATH_MAX + 64];
        int n = srv_checkpoint_set_aside(s->cfg.state_dir, aside, sizeof aside, err, sizeof err);
        if (n < 0) {
            PS_LOG(PS_LOG_ERROR, "--fresh: %s", err);
            return 1;
        }
        if (n > 0)
            PS_LOG(PS_LOG_INFO, "--fresh: moved %d checkpoint file%s of %s aside into %s (nothing deleted); "
                                "starting without a model",
                   n, n == 1 ? "" : "s", s->cfg.state_dir, aside);
        else
            PS_LOG(PS_LOG_INFO, "--fresh: no checkpoints in %s; starting without a model", s->cfg.state_dir);
    }
    if (reshard_from || reshard_part)
        return reshard(s, reshard_from, reshard_part);
    if (srv_checkpoint_load(s) < 0)
        return 1;
    srv_workers_out_restored(s); /* a restored plan's shards that were out of its job */
    if (s->resumed_from[0] && s->cfg.init_from[0]) {
        PS_LOG(PS_LOG_ERROR, "init_from %s, but the state dir %s holds a checkpoint (%s, model version %" PRIu64
                             "), which psd would resume: start with --fresh to set the checkpoints aside and begin "
                             "from %s, or without init_from to resume the checkpoint",
               s->cfg.init_from, s->cfg.state_dir, s->resumed_from, s->resumed_version, s->cfg.init_from);
        return 1;
    }
    if (s->cfg.init_from[0]) {
        if (srv_safetensors_load(s, s->cfg.init_from, err, sizeof err) != 0) {
            PS_LOG(PS_LOG_ERROR, "%s", err);
            return 1;
        }
        char desc[512];
        ps_layout_describe(&s->model.layout, desc, sizeof desc);
        PS_LOG(PS_LOG_INFO, "model from %s (init_from): %u tensors, %" PRIu64 " parameters: %s; workers pull "
                            "these values instead of initialising, from version 0 with a fresh optimizer state",
               s->model_file, s->model.layout.ntensors, s->model.layout.total, desc);
    }
    if (s->resumed_from[0])
        PS_LOG(PS_LOG_INFO, "resuming model version %" PRIu64 " from %s; start with --fresh to begin anew",
               s->resumed_version, s->resumed_from);
    if (s->model.initialized)
        srv_stats_model_at(s, srv_now_ms());
    /* Signal handlers first: whoever sees the port file may signal psd at
     * once, and a SIGTERM must then still mean a clean stop. (libuv runs
     * the callbacks from the loop, after everything here is set up.) */
    uv_signal_init(s->loop, &s->sigint);
    uv_signal_init(s->loop, &s->sigterm);
    uv_signal_init(s->loop, &s->sighup);
    s->sigint.data = s->sigterm.data = s->sighup.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sighup, on_signal, SIGHUP);
    uv_timer_init(s->loop, &s->tick);
    s->tick.data = s;
    s->last_tick_ms = srv_now_ms();
    uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
    if (srv_net_tapply_start(s, err, sizeof err) != 0) {
        PS_LOG(PS_LOG_ERROR, "%s", err);
        return 1;
    }
    if (srv_listen(s) != 0 || srv_http_start(s) != 0)
        return 1;
    if (srv_follow_start(s, err, sizeof err) != 0 || srv_coord_start(s, err, sizeof err) != 0) {
        PS_LOG(PS_LOG_ERROR, "%s", err);
        return 1;
    }
    if (s->cfg.port_file[0] && write_port_file(s->cfg.port_file, s->port) != 0) {
        PS_LOG(PS_LOG_ERROR, "cannot write port file %s: %s", s->cfg.port_file, strerror(errno));
        return 1;
    }
    PS_LOG(PS_LOG_INFO, "psd %s listening on %s:%d, mode %s, %d workers, optimizer %s lr %g, %s", PSD_VERSION,
           s->cfg.listen.host, s->port, s->policy->name, s->cfg.workers, srv_optim_kind_name(s->cfg.optimizer),
           s->cfg.lr,
           !s->token.len           ? "no authentication"
           : s->admin_token.len    ? "clients authenticate (worker and admin tokens)"
                                   : "clients authenticate (one token; admins read only)");

    srv_notify_ready(s);

    uv_run(s->loop, UV_RUN_DEFAULT);
    srv_net_tapply_stop(s); /* its last pushes applied: the checkpoint holds them */

    int exit_code = srv_checkpoint_write_now(s) == 0 && !s->refused ? 0 : 1;
    PS_LOG(PS_LOG_INFO, "stopped at model version %llu after %llu pushes", (unsigned long long)s->model.version,
           (unsigned long long)s->stats.pushes);
    s->policy->destroy(s);
    srv_update_free(s);
    srv_parked_free_spare();
    srv_net_free_spare(s);
    srv_admin_free(s);
    srv_coord_free(s);
    srv_follow_free(s);
    srv_replog_free(s);
    srv_dash_free(s);
    srv_codec_free(s);
    srv_pushid_free(s);
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        free(s->workers[i]);
    }
    free(s->workers);
    srv_model_free(&s->model);
    srv_tables_free(&s->tables);
    srv_plan_clear(&s->plan);
    srv_blk_pool_free();
    ps_buf_free(&s->enc);
    free(s->restored_clocks);
    ps_token_clear(&s->token);
    ps_token_clear(&s->admin_token);
    uv_loop_close(s->loop);
    return exit_code;
}
