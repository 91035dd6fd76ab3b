/* psctl.c - the operator's view of a running psd, and its controls: the
 * commands, the options and main(). It speaks the same protocol as the
 * workers, with the admin role: STATUS and METRICS to read, ADMIN commands
 * to act, PULL (from a pinned snapshot) to save the model as a safetensors
 * file. The commands are commands.c's table (a command is a row there);
 * this file holds the options, also a table, and main(). Talking to psd is
 * session.c's, the output print.c's, save save.c's.
 *
 * Exit codes: 0 success, 1 psd answered with an error, 2 bad usage, 3 psd
 * not reachable (refused, unresolvable), 4 timed out, 5 a local file could
 * not be written (save). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/parse.h"
#include "proto/ps_limits.h"
#include "psctl/psctl.h"

#define DEFAULT_TIMEOUT_MS 5000

/* ---- options ----------------------------------------------------------------------------- */

enum { OPT_CSV = 256, OPT_FORCE, OPT_COMMANDS_MD };

/* One row per option: getopt's table, its short letters and the usage are
 * made from it. */
static const struct psctl_option {
    const char *name;
    int key;            /* the short letter, or OPT_* for long only */
    const char *arg;    /* its argument's name; NULL: none */
    const char *help;
} options[] = {
    {"server", 's', "HOST:PORT",
     "psd's address (default $PSD_SERVER or 127.0.0.1:7000); HOST:PORT,HOST:PORT,...: the psd of a model "
     "split over several, in part order: each command goes to each psd in turn (--json: an array), and "
     "save joins their parts (and each table's rows from every psd, into one table); HOST:PORT/HOST:PORT: a "
     "part's replicas, of which psctl talks to the one that leads (promote: give the follower alone)"},
    {"timeout", 't', "MS", "give up on a reply after MS milliseconds (default 5000; checkpoint 600000)"},
    {"json", 'j', NULL,
     "machine-readable output: one JSON document on stdout (not for metrics, which is Prometheus text "
     "already)"},
    {"csv", OPT_CSV, NULL, "history as CSV: series,shard,t,version,column,value"},
    {"force", OPT_FORCE, NULL, "reset even while workers are connected"},
    {"token-file", 'T', "PATH",
     "the secret to prove to psd when it requires one (default $PSD_TOKEN_FILE; mode 600): its "
     "admin_token_file, or its token_file, which allows only the reading commands"},
    {"version", 'V', NULL, "print the version"},
    {"help", 'h', NULL, "this help"},
    {"commands-markdown", OPT_COMMANDS_MD, NULL, "print the table of commands of docs/running.md"},
};
#define NOPTIONS (sizeof options / sizeof options[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: psctl [options] COMMAND [ARGS]\n"
               "\n"
               "Shows and controls a running psd.\n"
               "\n");
    psctl_commands_usage(f);
    fprintf(f, "\nOptions (before or after the command):\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        const struct psctl_option *o = &options[i];
        char left[64];
        if (o->key < 256)
            snprintf(left, sizeof left, "  -%c, --%s%s%s", o->key, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "      --%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        psctl_wrap(f, left, 26, o->help);
    }
    fprintf(f, "\n"
               "Exit codes:\n"
               "  0  done\n"
               "  1  psd refused the request (the message says why)\n"
               "  2  usage error\n"
               "  3  psd not reachable (not running, wrong address)\n"
               "  4  timed out waiting for psd\n"
               "  5  a local file could not be written (save)\n");
}

/* ---- main ------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    const char *server = getenv("PSD_SERVER") && *getenv("PSD_SERVER") ? getenv("PSD_SERVER") : "127.0.0.1:7000";
    const char *token_file = getenv("PSD_TOKEN_FILE") && *getenv("PSD_TOKEN_FILE") ? getenv("PSD_TOKEN_FILE") : NULL;
    int timeout = -1, as_json = 0, history_csv = 0, force = 0;
    struct option longopts[NOPTIONS + 1];
    char shortopts[2 * NOPTIONS + 1];
    size_t ns = 0;
    for (size_t i = 0; i < NOPTIONS; i++) {
        longopts[i] = (struct option){options[i].name, options[i].arg ? required_argument : no_argument, NULL,
                                      options[i].key};
        if (options[i].key < 256) {
            shortopts[ns++] = (char)options[i].key;
            if (options[i].arg)
                shortopts[ns++] = ':';
        }
    }
    longopts[NOPTIONS] = (struct option){NULL, 0, NULL, 0};
    shortopts[ns] = '\0';
    int opt;
    /* options may come before or after the command ("status --json") */
    while ((opt = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            server = optarg;
            break;
        case 't': {
            uint64_t v;
            if (ps_parse_u64(optarg, 3600000, &v) || v == 0) {
                fprintf(stderr, "psctl: bad --timeout '%s': milliseconds, 1..3600000\n", optarg);
                return EXIT_USAGE;
            }
            timeout = (int)v;
            break;
        }
        case 'j':
            as_json = 1;
            break;
        case 'T':
            token_file = optarg;
            break;
        case OPT_CSV:
            history_csv = 1;
            break;
        case OPT_FORCE:
            force = 1;
            break;
        case 'h':
            usage(stdout);
            return EXIT_OK;
        case 'V':
            printf("psctl %s (protocol %d)\n", PSD_VERSION, PS_PROTO_VERSION);
            return EXIT_OK;
        case OPT_COMMANDS_MD:
            psctl_commands_markdown(stdout);
            return EXIT_OK;
        default:
            fprintf(stderr, "psctl: see psctl --help\n");
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "psctl: no command given (try psctl --help)\n");
        return EXIT_USAGE;
    }
    const char *name = argv[optind];
    char **args = argv + optind + 1;
    int nargs = argc - optind - 1;
    const psctl_command *cmd = psctl_command_find(name);
    if (!cmd) {
        psctl_unknown_command(stderr, name);
        return EXIT_USAGE;
    }
    int bad = psctl_command_check(cmd, args, nargs, as_json, history_csv, force);
    if (bad != EXIT_OK)
        return bad;
    if (timeout < 0)
        timeout = cmd->timeout_ms ? cmd->timeout_ms : DEFAULT_TIMEOUT_MS;

    /* "host:port" or a list, one psd per part of a split model */
    static char list[PS_PARTS_MAX][300];
    uint32_t n = 0;
    for (const char *p = server;; n++) {
        size_t len = strcspn(p, ",");
        if (n == PS_PARTS_MAX || len == 0 || len >= sizeof list[0]) {
            fprintf(stderr, "psctl: bad --server '%.200s': HOST:PORT, or HOST:PORT,HOST:PORT,... (at most %u) for "
                            "a model split over several psd\n", server, PS_PARTS_MAX);
            return EXIT_USAGE;
        }
        memcpy(list[n], p, len);
        list[n][len] = '\0';
        if (!p[len]) {
            n++;
            break;
        }
        p += len + 1;
    }
    static session ss[PS_PARTS_MAX]; /* each holds a layout: too big for the stack */
    ps_token token = {0};
    char terr[1536];
    if (token_file && ps_token_load(token_file, &token, terr, sizeof terr) != 0) {
        fprintf(stderr, "psctl: %s\n", terr);
        return EXIT_USAGE;
    }
    int status = EXIT_OK;
    /* a part given as its replicas: its leader */
    for (uint32_t i = 0; i < n && status == EXIT_OK; i++) {
        ss[i].timeout = timeout;
        ss[i].token = token;
        status = psctl_pick_leader(&ss[i], list[i], sizeof list[i]);
        ps_token_clear(&ss[i].token);
    }
    if (status == EXIT_OK && (n > 1 || (cmd->flags & PSCTL_PARTS)) && cmd->run_parts) {
        psctl_call k = {.cmd = cmd, .server = server, .args = args, .nargs = nargs, .as_json = as_json,
                        .csv = history_csv, .force = force};
        status = cmd->run_parts(ss, list, n, &token, timeout, &k);
    } else if (status == EXIT_OK) {
        /* every other command goes to each psd in turn: a header line
         * before each one's text, a JSON array of their documents */
        if (n > 1 && as_json && !(cmd->flags & PSCTL_TEXT))
            printf("[");
        for (uint32_t i = 0; i < n && status == EXIT_OK; i++) {
            if (n > 1 && as_json && !(cmd->flags & PSCTL_TEXT) && i > 0)
                printf(",");
            else if (n > 1 && (!as_json || (cmd->flags & PSCTL_TEXT)))
                printf("%s== psd %s (part %u of %u)\n", (cmd->flags & PSCTL_TEXT) ? "# " : (i ? "\n" : ""), list[i],
                       i + 1, n);
            ps_conn_init(&ss[i].c);
            ss[i].timeout = timeout;
            ss[i].token = token;
            psctl_call k = {.cmd = cmd, .server = list[i], .args = args, .nargs = nargs, .as_json = as_json,
                            .csv = history_csv, .force = force};
            status = psctl_command_run(&k, &ss[i]);
            ps_conn_free(&ss[i].c);
            ps_token_clear(&ss[i].token);
        }
        if (n > 1 && as_json && !(cmd->flags & PSCTL_TEXT) && status == EXIT_OK)
            printf("]\n");
    }
    ps_token_clear(&token);
    return status;
}
