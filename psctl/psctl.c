/* psctl.c - the operator's view of a running psd, and its controls: the
 * commands, the options and main(). It speaks the same protocol as the
 * workers, with the admin role: STATUS and METRICS to read, ADMIN commands
 * to act, PULL (from a pinned snapshot) to save the model as a safetensors
 * file. Talking to psd is session.c's, the output print.c's, save save.c's.
 *
 * Exit codes: 0 success, 1 psd answered with an error, 2 bad usage, 3 psd
 * not reachable (refused, unresolvable), 4 timed out, 5 a local file could
 * not be written (save). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/parse.h"
#include "proto/errors.h"
#include "psctl/psctl.h"

#define DEFAULT_TIMEOUT_MS 5000
#define CHECKPOINT_TIMEOUT_MS 600000 /* writing a big model's checkpoint takes a while */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psctl [options] COMMAND [ARGS]\n"
            "\n"
            "Shows and controls a running psd.\n"
            "\n"
            "Reading:\n"
            "  status             mode, model version, rates, settings, one row per worker\n"
            "  workers            every worker seen: state, why it left or was lost,\n"
            "                     address, pushes, last report\n"
            "  metrics            psd's counters in the Prometheus text format (the\n"
            "                     same text psd serves at http://metrics_listen/metrics)\n"
            "  history            what psd recorded of the run: its rates, learning\n"
            "                     rate and round times each second, every worker's\n"
            "                     reported loss and accuracy, and the events (joins,\n"
            "                     losses, checkpoints, pauses, settings); --json or\n"
            "                     --csv (one row per value) for programs\n"
            "\n"
            "Controlling:\n"
            "  set KEY=VALUE...   change settings of the running psd, all or none: lr,\n"
            "                     momentum, weight_decay, clip_norm, nonfinite, the lr\n"
            "                     schedule, staleness_scale, dc_lambda, the connection\n"
            "                     limits and timeouts, log_level\n"
            "                     (the ones conf/psd.conf marks reloadable). A later\n"
            "                     reload (SIGHUP) or restart takes the file's values.\n"
            "  pause              hold every worker's next pull until resume (workers\n"
            "                     wait; pushes already sent are applied, nothing is lost)\n"
            "  resume             let the workers go on\n"
            "  checkpoint         write a checkpoint to psd's state_dir now and return\n"
            "                     once it is written\n"
            "  save PATH          write the model to PATH as a safetensors file (float32\n"
            "                     tensors named as the workers name them, buffers in\n"
            "                     their own dtype, all of one model version), readable\n"
            "                     with the safetensors package or a few lines of NumPy\n"
            "  shutdown           stop psd as SIGTERM does\n"
            "  reset              start fresh: psd sets the checkpoints in its state_dir\n"
            "                     aside (as psd --fresh does: into a dated subfolder,\n"
            "                     nothing deleted) and drops the model, so the next worker\n"
            "                     to connect initialises it; refused while workers are\n"
            "                     connected, unless --force (they are disconnected and\n"
            "                     exit with an error)\n"
            "\n"
            "Options (before or after the command):\n"
            "  -s, --server HOST:PORT  psd's address (default $PSD_SERVER or 127.0.0.1:7000);\n"
            "                          HOST:PORT,HOST:PORT,...: the psd of a model split over\n"
            "                          several, in part order: each command goes to each psd in\n"
            "                          turn (--json: an array), and save joins their parts\n"
            "                          (and each table's rows from every psd, into one table)\n"
            "  -t, --timeout MS        give up on a reply after MS milliseconds (default\n"
            "                          5000; checkpoint 600000)\n"
            "  -j, --json              machine-readable output: one JSON document on stdout\n"
            "                          (not for metrics, which is Prometheus text already)\n"
            "      --csv               history as CSV: series,shard,t,version,column,value\n"
            "      --force             reset even while workers are connected\n"
            "  -T, --token-file PATH   the secret to prove to psd when it requires one\n"
            "                          (default $PSD_TOKEN_FILE; mode 600): its\n"
            "                          admin_token_file, or its token_file, which allows only\n"
            "                          status, workers, metrics and history\n"
            "  -h, --help              this help\n"
            "\n"
            "Exit codes:\n"
            "  0  done\n"
            "  1  psd refused the request (the message says why)\n"
            "  2  usage error\n"
            "  3  psd not reachable (not running, wrong address)\n"
            "  4  timed out waiting for psd\n"
            "  5  a local file could not be written (save)\n");
}

/* ---- main ------------------------------------------------------------------------------ */

typedef struct command {
    const char *name;
    int min_args, max_args;
    const char *args;     /* for the usage line */
} command;

static const command commands[] = {
    {"status", 0, 0, ""},        {"workers", 0, 0, ""},     {"metrics", 0, 0, ""},
    {"set", 1, PS_ARGS_MAX, " KEY=VALUE..."}, {"pause", 0, 0, ""}, {"resume", 0, 0, ""},
    {"checkpoint", 0, 0, ""},    {"save", 1, 1, " PATH"},   {"shutdown", 0, 0, ""},
    {"history", 0, 0, ""},       {"reset", 0, 0, ""},
};

static int history_csv; /* --csv: `history` as CSV */
static int force;       /* --force: `reset` with workers connected */

/* Edit distance with adjacent transpositions counting one ("stauts" is one
 * from "status"), for the "did you mean" of an unknown command. Words are
 * short: longer ones are simply far. */
static size_t edit_distance(const char *a, const char *b)
{
    enum { W = 32 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= W || m >= W)
        return W;
    size_t d[W][W];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m];
}

/* The command name closest to `name` (at most 2 edits, and fewer than
 * half its letters), or NULL. */
static const char *closest_command(const char *name)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        size_t dist = edit_distance(name, commands[i].name);
        if (dist < best_d && dist * 2 < strlen(commands[i].name)) {
            best_d = dist;
            best = commands[i].name;
        }
    }
    return best;
}

/* Runs cmd against the psd at server (one of a split model's, or the
 * only one); ss->c initialised, timeout and token set. */
static int run_one(const command *cmd, session *ss, const char *server, char **args, int nargs, int as_json)
{
    ps_msg m, r;
    int status = EXIT_OK, timeout = ss->timeout;
    int rc = psctl_open(ss, server);
    if (rc != 0) {
        status = psctl_report(&ss->c, rc, timeout);
        goto out;
    }

    if (strcmp(cmd->name, "status") == 0 || strcmp(cmd->name, "workers") == 0) {
        status = psctl_ask(ss, PS_MSG_STATUS, PS_MSG_STATUS_REPLY, "status", &r);
        if (status != EXIT_OK) {
        } else if (cmd->name[0] == 's') {
            if (as_json) {
                psctl_json(stdout, r.body);
                fputc('\n', stdout);
            } else {
                psctl_print_status(r.body);
            }
        } else {
            const msgpack_object *ws = ps_map_get(r.body, "workers");
            if (as_json) {
                if (ws)
                    psctl_json(stdout, ws);
                else
                    fputs("[]", stdout);
                fputc('\n', stdout);
            } else {
                psctl_print_workers(r.body);
            }
        }
    } else if (strcmp(cmd->name, "metrics") == 0) {
        status = psctl_ask(ss, PS_MSG_METRICS, PS_MSG_METRICS_REPLY, "metrics", &r);
        if (status == EXIT_OK)
            fwrite(r.text, 1, r.text_len, stdout);
    } else if (strcmp(cmd->name, "save") == 0) {
        status = psctl_save(ss, server, args[0], as_json);
    } else if (strcmp(cmd->name, "history") == 0) {
        /* psd writes the history in the form asked for */
        char *form[1] = {as_json ? "json" : history_csv ? "csv" : "table"};
        rc = psctl_admin(ss, "history", form, 1, &r);
        if (rc != 0)
            status = psctl_report(&ss->c, rc, timeout);
        else
            fwrite(r.text, 1, r.text_len, stdout);
    } else {
        /* set, pause, resume, checkpoint, shutdown, reset: one ADMIN request */
        char *forced[1] = {"force"};
        if (strcmp(cmd->name, "reset") == 0 && force)
            rc = psctl_admin(ss, cmd->name, forced, 1, &r);
        else
            rc = psctl_admin(ss, cmd->name, args, nargs, &r);
        if (rc != 0) {
            status = psctl_report(&ss->c, rc, timeout);
        } else if (as_json) {
            printf("{\"ok\": true, \"command\": \"%s\", \"version\": %" PRIu64 ", \"message\": ", cmd->name, r.mver);
            psctl_json_string(stdout, r.text ? r.text : "", r.text ? r.text_len : 0);
            printf("}\n");
        } else {
            printf("%.*s\n", (int)r.text_len, r.text ? r.text : "");
        }
        if (rc == 0 && strcmp(cmd->name, "shutdown") == 0)
            goto out; /* psd closes the connection itself */
    }
    if (status == EXIT_OK) {
        ps_msg_init(&m, PS_MSG_BYE);
        ps_client_send(&ss->c, &m);
    }
out:
    return status;
}

int main(int argc, char **argv)
{
    const char *server = getenv("PSD_SERVER") && *getenv("PSD_SERVER") ? getenv("PSD_SERVER") : "127.0.0.1:7000";
    const char *token_file = getenv("PSD_TOKEN_FILE") && *getenv("PSD_TOKEN_FILE") ? getenv("PSD_TOKEN_FILE") : NULL;
    int timeout = -1, as_json = 0;
    static const struct option longopts[] = {
        {"server", required_argument, NULL, 's'}, {"timeout", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
        {"token-file", required_argument, NULL, 'T'},
        {"csv", no_argument, NULL, 'C'},
        {"force", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    /* options may come before or after the command ("status --json") */
    while ((opt = getopt_long(argc, argv, "s:t:jhT:CF", longopts, NULL)) != -1) {
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
        case 'C':
            history_csv = 1;
            break;
        case 'F':
            force = 1;
            break;
        case 'h':
            usage(stdout);
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
    const command *cmd = NULL;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            cmd = &commands[i];
    if (!cmd) {
        const char *near = closest_command(name);
        char hint[64] = "";
        if (near)
            snprintf(hint, sizeof hint, "did you mean '%s'? ", near);
        fprintf(stderr,
                "psctl: unknown command '%s' (%scommands: status, workers, metrics, set, pause, resume, checkpoint, "
                "save, shutdown, history, reset)\n",
                name, hint);
        return EXIT_USAGE;
    }
    if (as_json && strcmp(cmd->name, "metrics") == 0) {
        fprintf(stderr, "psctl: --json does not apply to metrics, which is Prometheus text; `psctl status --json` "
                        "has psd's figures as JSON\n");
        return EXIT_USAGE;
    }
    if (force && strcmp(cmd->name, "reset") != 0) {
        fprintf(stderr, "psctl: --force applies to reset only\n");
        return EXIT_USAGE;
    }
    if (nargs < cmd->min_args || nargs > cmd->max_args) {
        fprintf(stderr, "psctl: %s takes %s (usage: psctl %s%s)\n", cmd->name,
                cmd->max_args == 0 ? "no arguments" : cmd->min_args == cmd->max_args ? "one argument" : "arguments",
                cmd->name, cmd->args);
        return EXIT_USAGE;
    }
    if (strcmp(cmd->name, "set") == 0) {
        for (int i = 0; i < nargs; i++) {
            const char *eq = strchr(args[i], '=');
            if (!eq || eq == args[i] || strlen(args[i]) > PS_ARG_MAX) {
                fprintf(stderr, "psctl: set wants KEY=VALUE, got '%.100s'\n", args[i]);
                return EXIT_USAGE;
            }
        }
    }
    if (timeout < 0)
        timeout = strcmp(cmd->name, "checkpoint") == 0 ? CHECKPOINT_TIMEOUT_MS : DEFAULT_TIMEOUT_MS;

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
    if (n > 1 && strcmp(cmd->name, "save") == 0) {
        status = psctl_save_parts(ss, list, n, &token, timeout, args[0], as_json);
    } else {
        /* every other command goes to each psd in turn: a header line
         * before each one's text, a JSON array of their documents */
        if (n > 1 && as_json && cmd->name[0] != 'm')
            printf("[");
        for (uint32_t i = 0; i < n && status == EXIT_OK; i++) {
            if (n > 1 && as_json && cmd->name[0] != 'm' && i > 0)
                printf(",");
            else if (n > 1 && (!as_json || cmd->name[0] == 'm'))
                printf("%s== psd %s (part %u of %u)\n", cmd->name[0] == 'm' ? "# " : (i ? "\n" : ""), list[i],
                       i + 1, n);
            ps_client_init(&ss[i].c);
            ss[i].timeout = timeout;
            ss[i].token = token;
            status = run_one(cmd, &ss[i], list[i], args, nargs, as_json);
            ps_client_free(&ss[i].c);
            ps_token_clear(&ss[i].token);
        }
        if (n > 1 && as_json && cmd->name[0] != 'm' && status == EXIT_OK)
            printf("]\n");
    }
    ps_token_clear(&token);
    return status;
}
