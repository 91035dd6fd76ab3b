/* commands.c - psctl's commands, each declared once in one table: its
 * name, arguments, help, whether it only reads (allowed with the workers'
 * token), its default timeout, the function that runs it, its help and its
 * row of docs/running.md. The usage text, the argument checks, the
 * "unknown command" message and the docs' table of commands (psctl
 * --commands-markdown) are made from the table; adding a command is adding
 * a row and its run function here.
 * main() and the options are psctl.c's. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "psctl/psctl.h"

#define CHECKPOINT_TIMEOUT_MS 600000 /* writing a big model's checkpoint takes a while */

/* ---- run functions: one exchange with one psd (ss open) ------------------------------------- */

static int run_status(session *ss, const psctl_call *k)
{
    ps_msg r;
    int status = psctl_ask(ss, PS_MSG_STATUS, PS_MSG_STATUS_REPLY, "status", &r);
    if (status != EXIT_OK)
        return status;
    if (k->as_json) {
        psctl_json(stdout, r.body);
        fputc('\n', stdout);
    } else {
        psctl_print_status(r.body);
    }
    return EXIT_OK;
}

static int run_workers(session *ss, const psctl_call *k)
{
    ps_msg r;
    int status = psctl_ask(ss, PS_MSG_STATUS, PS_MSG_STATUS_REPLY, "status", &r);
    if (status != EXIT_OK)
        return status;
    if (k->as_json) {
        const msgpack_object *ws = ps_map_get(r.body, "workers");
        if (ws)
            psctl_json(stdout, ws);
        else
            fputs("[]", stdout);
        fputc('\n', stdout);
    } else {
        psctl_print_workers(r.body);
    }
    return EXIT_OK;
}

static int run_metrics(session *ss, const psctl_call *k)
{
    (void)k;
    ps_msg r;
    int status = psctl_ask(ss, PS_MSG_METRICS, PS_MSG_METRICS_REPLY, "metrics", &r);
    if (status == EXIT_OK)
        fwrite(r.text, 1, r.text_len, stdout);
    return status;
}

static int run_history(session *ss, const psctl_call *k)
{
    ps_msg r;
    /* psd writes the history in the form asked for */
    char *form[1] = {k->as_json ? "json" : k->csv ? "csv" : "table"};
    int rc = psctl_admin(ss, "history", form, 1, &r);
    if (rc != 0)
        return psctl_report(&ss->c, rc, ss->timeout);
    fwrite(r.text, 1, r.text_len, stdout);
    return EXIT_OK;
}

static int run_save(session *ss, const psctl_call *k)
{
    return psctl_save(ss, k->server, k->args[0], k->as_json);
}

/* save with a model split over several psd: the parts joined in one file */
static int run_save_parts(struct session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout,
                          const psctl_call *k)
{
    return psctl_save_parts(ss, list, n, token, timeout, k->args[0], k->as_json);
}

/* set, pause, resume, checkpoint, shutdown, reset: one ADMIN request named
 * as the command, its OK's text printed. */
static int run_admin(session *ss, const psctl_call *k)
{
    ps_msg r;
    char *forced[1] = {"force"};
    int rc = k->force ? psctl_admin(ss, k->cmd->name, forced, 1, &r)
                      : psctl_admin(ss, k->cmd->name, k->args, k->nargs, &r);
    if (rc != 0)
        return psctl_report(&ss->c, rc, ss->timeout);
    if (k->as_json) {
        printf("{\"ok\": true, \"command\": \"%s\", \"version\": %" PRIu64 ", \"message\": ", k->cmd->name, r.mver);
        psctl_json_string(stdout, r.text ? r.text : "", r.text ? r.text_len : 0);
        printf("}\n");
    } else {
        printf("%.*s\n", (int)r.text_len, r.text ? r.text : "");
    }
    return EXIT_OK;
}

/* ---- argument checks beyond their count ------------------------------------------------------ */

static int check_set(char **args, int nargs)
{
    for (int i = 0; i < nargs; i++) {
        const char *eq = strchr(args[i], '=');
        if (!eq || eq == args[i] || strlen(args[i]) > PS_ARG_MAX) {
            fprintf(stderr, "psctl: set wants KEY=VALUE, got '%.100s'\n", args[i]);
            return EXIT_USAGE;
        }
    }
    return EXIT_OK;
}

/* ---- the table --------------------------------------------------------------------------------- */

static const psctl_command commands[] = {
    {"status", "", 0, 0, PSCTL_READS, 0, run_status, NULL, NULL,
     "mode, model version, rates, settings, one row per worker",
     "mode, model version, parameters, optimizer and lr, uptime, push/pull rates, checkpoint, metrics "
     "address, and one row per worker (shard, state, address, how its tensors travel: `tcp` or `shm` "
     "(VIA), how its table requests travel: `shm` through its table segment or `tcp` in frames (TABLES), "
     "pushes, last seen, epoch, loss, accuracy); with `--json`, the same for scripts; stable keys: `mode`,"
     " `version`, `parameters`, `lr`, `paused`, `workers` (each with `shard`, `address`, `transport`, "
     "`table_transport`, `pushes`, `last_seen`, `loss`, `state`, `clock`, `why`, `accuracy`)"},
    {"workers", "", 0, 0, PSCTL_READS, 0, run_workers, NULL, NULL,
     "every worker seen: state, why it left or was lost, address, pushes, last report",
     "every worker seen, including those that left or were lost, with why"},
    {"metrics", "", 0, 0, PSCTL_READS | PSCTL_TEXT, 0, run_metrics, NULL, NULL,
     "psd's counters in the Prometheus text format (the same text psd serves at "
     "http://metrics_listen/metrics)",
     "Prometheus text exposition of psd's counters, gauges and histograms (`--json` is refused: usage "
     "error)"},
    {"history", "", 0, 0, PSCTL_READS | PSCTL_CSV, 0, run_history, NULL, NULL,
     "what psd recorded of the run: its rates, learning rate and round times each second, every "
     "worker's reported loss and accuracy, and the events (joins, losses, checkpoints, pauses, "
     "settings); --json or --csv (one row per value) for programs",
     "what psd recorded of the run (see [the dashboard](metrics.md#dashboard)): psd's rates, learning rate"
     " and round durations each second, each worker's reported loss, rate and accuracy, and the events; a "
     "table, one JSON document (the same as `/api/history`) or CSV rows "
     "`series,shard,t,version,column,value`. Allowed with the workers' token too"},
    {"set", " KEY=VALUE...", 1, PS_ARGS_MAX, 0, 0, run_admin, check_set, NULL,
     "change settings of the running psd, all or none: lr, momentum, weight_decay, clip_norm, "
     "nonfinite, the lr schedule, staleness_scale, dc_lambda, the connection limits and timeouts, "
     "log_level (the ones conf/psd.conf marks reloadable). A later reload (SIGHUP) or restart takes "
     "the file's values.",
     "changes reloadable settings of the running psd (all or none), as a SIGHUP reload would; the file is "
     "not changed"},
    {"pause", "", 0, 0, 0, 0, run_admin, NULL, NULL,
     "hold every worker's next pull until resume (workers wait; pushes already sent are applied, "
     "nothing is lost)",
     "holds every worker's next pull until resume: workers wait, pushes already sent are applied, nothing "
     "is lost (a psworker waits for a reply up to its `--timeout`, 10 minutes by default, before it "
     "reconnects)"},
    {"resume", "", 0, 0, 0, 0, run_admin, NULL, NULL, "let the workers go on",
     "lets the workers go on after `pause`"},
    {"checkpoint", "", 0, 0, 0, CHECKPOINT_TIMEOUT_MS, run_admin, NULL, NULL,
     "write a checkpoint to psd's state_dir now and return once it is written",
     "writes a checkpoint to psd's state directory; returns once it is written"},
    {"save", " PATH", 1, 1, 0, 0, run_save, NULL, run_save_parts,
     "write the model to PATH as a safetensors file (float32 tensors named as the workers name "
     "them, buffers in their own dtype, all of one model version), readable with the safetensors "
     "package or a few lines of NumPy",
     "writes the model to PATH as a safetensors file: one F32 tensor per layout entry (a buffer in its own"
     " dtype, such as I64), named as the workers name them (`fc1.weight`, ...), all of one model version "
     "(psd pins a snapshot while psctl pulls it in chunks), with `model_version`, `mode` and "
     "`layout_fingerprint` in `__metadata__`, and `\"buffer:NAME\": RULE` for each buffer; and each "
     "embedding table ([docs/tables.md](tables.md)) as `tables/NAME/rows` (F32, rows x dim) and "
     "`tables/NAME/keys` (I64: the uint64 keys' bits, so a key of 2^63 or more reads negative; NumPy's "
     "`.view(np.uint64)` gives it back), the rows psd held when `save` began, each page of them as it was "
     "when pulled (pause the job for one state), with the declarations in `__metadata__` as `psd.tables` "
     "(a JSON array); `psd --init-from` takes them back (the rows' optimizer state starts afresh). A model"
     " split over several psd is saved with every part's rows of each table merged into that table's two "
     "tensors (each key once, declared unsplit: one psd `--init-from` the file holds the whole table)"},
    {"parts", " add HOST:PORT [RATE] | remove [RATE] | abort [HOST:PORT]", 1, 3, PSCTL_PARTS, 0, run_admin, psctl_parts_check,
     psctl_parts,
     "grow a running job by the psd at HOST:PORT (a fresh psd with the job's settings) or shrink it by its last "
     "part, while the workers train: the table rows whose part changes move, with their optimizer state, at most "
     "RATE bytes a second (64M, 1G; 256M by default); --server lists the job's parts in order. Run again after an "
     "interruption, it takes the move up where it is; abort calls off a move none of whose rows was handed over",
     "grows a running job by the psd at HOST:PORT (a fresh psd started with the job's settings) or shrinks it by "
     "its last part, while the workers train: the table rows whose part changes move to their new part with their "
     "optimizer state, at most RATE bytes a second (`64M`, `1G`; 256 MiB/s by default), and the workers switch to "
     "the new part map by themselves; dense tensors stay where they are, so only a part a move added can be "
     "removed. `--server` lists the job's parts in the order of its newest map. Prints the rows moved as they go "
     "and the longest handover. Stopped (a part killed, psctl interrupted), the same command run again takes the "
     "move up where it is; `parts abort [HOST:PORT]` calls it off while none of the rows was handed over yet "
     "([tables](tables.md#growing-and-shrinking-a-running-job))"},
    {"shutdown", "", 0, 0, PSCTL_NO_BYE, 0, run_admin, NULL, NULL, "stop psd as SIGTERM does",
     "stops psd as SIGTERM does"},
    {"promote", "", 0, 0, 0, 0, run_admin, NULL, NULL,
     "make this follower (a psd started with replica_of) the leader of its part: it applies what "
     "it holds of its leader's log, then takes the workers' pushes; refused by a leader",
     "makes a follower (a psd started with `--replica-of`) the leader of its part, after it has applied "
     "what it holds of its leader's log; refused by a leader ([fault "
     "tolerance](fault-tolerance.md#replicas-a-part-that-dies-loses-no-acknowledged-push))"},
    {"reset", "", 0, 0, PSCTL_FORCE, 0, run_admin, NULL, NULL,
     "start fresh: psd sets the checkpoints in its state_dir aside (as psd --fresh does: into a "
     "dated subfolder, nothing deleted) and drops the model, so the next worker to connect "
     "initialises it; refused while workers are connected, unless --force (they are disconnected "
     "and exit with an error)",
     "starts fresh without restarting psd: the checkpoints in its state dir are set aside as `psd --fresh`"
     " does (a dated subfolder, nothing deleted), the model is dropped, and the next worker to connect "
     "initialises it (`model version 852 dropped; 3 checkpoint files set aside in DIR/set-aside-...; the "
     "next worker to connect initialises the model`). Refused while workers are connected (it names them: "
     "they would train on a model psd no longer holds) unless `--force`, which disconnects them with an "
     "error they exit on; refused while a checkpoint is being written"},
};

const psctl_command *psctl_commands(size_t *n)
{
    *n = sizeof commands / sizeof commands[0];
    return commands;
}

const psctl_command *psctl_command_find(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

/* ---- text made from the table ------------------------------------------------------------------ */

void psctl_wrap(FILE *f, const char *left, int indent, const char *text)
{
    int col = fprintf(f, "%s", left);
    if (col >= indent) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", indent - col, "");
    col = indent;
    const char *p = text;
    while (*p) {
        size_t w = strcspn(p, " ");
        if (col > indent && col + 1 + (int)w > PSCTL_USAGE_WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, w, f);
        col += (int)w;
        p += w;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

void psctl_commands_usage(FILE *f)
{
    static const struct {
        const char *title;
        int reads;
    } groups[] = {
        {"Reading (allowed with the workers' token too):", 1},
        {"Controlling (the admin token, when psd has one):", 0},
    };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        fprintf(f, "%s%s\n", g ? "\n" : "", groups[g].title);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
            const psctl_command *c = &commands[i];
            if (!(c->flags & PSCTL_READS) != !groups[g].reads)
                continue;
            char left[96];
            snprintf(left, sizeof left, "  %s%s", c->name, c->args);
            psctl_wrap(f, left, 21, c->help);
        }
    }
}

void psctl_commands_markdown(FILE *f)
{
    fprintf(f, "| command | what it does |\n|---|---|\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const psctl_command *c = &commands[i];
        const char *opts = c->flags & PSCTL_CSV                        ? " [--json\\|--csv]"
                           : (c->flags & PSCTL_READS) && !(c->flags & PSCTL_TEXT) ? " [--json]"
                           : c->flags & PSCTL_FORCE                    ? " [--force]"
                                                                       : "";
        fprintf(f, "| `%s%s%s` | %s |\n", c->name, c->args, opts, c->doc);
    }
}

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

void psctl_unknown_command(FILE *f, const char *name)
{
    const char *near = closest_command(name);
    fprintf(f, "psctl: unknown command '%.100s' (", name);
    if (near)
        fprintf(f, "did you mean '%s'? ", near);
    fprintf(f, "commands:");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "%s %s", i ? "," : "", commands[i].name);
    fprintf(f, ")\n");
}

int psctl_command_check(const psctl_command *cmd, char **args, int nargs, int as_json, int csv, int force)
{
    if (as_json && (cmd->flags & PSCTL_TEXT)) {
        fprintf(stderr, "psctl: --json does not apply to %s, which is Prometheus text; `psctl status --json` "
                        "has psd's figures as JSON\n", cmd->name);
        return EXIT_USAGE;
    }
    if (force && !(cmd->flags & PSCTL_FORCE)) {
        fprintf(stderr, "psctl: --force applies to");
        for (size_t i = 0, n = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (commands[i].flags & PSCTL_FORCE)
                fprintf(stderr, "%s %s", n++ ? "," : "", commands[i].name);
        fprintf(stderr, " only\n");
        return EXIT_USAGE;
    }
    (void)csv; /* --csv is ignored by the commands that print no table */
    if (nargs < cmd->min_args || nargs > cmd->max_args) {
        fprintf(stderr, "psctl: %s takes %s (usage: psctl %s%s)\n", cmd->name,
                cmd->max_args == 0 ? "no arguments" : cmd->min_args == cmd->max_args ? "one argument" : "arguments",
                cmd->name, cmd->args);
        return EXIT_USAGE;
    }
    return cmd->check ? cmd->check(args, nargs) : EXIT_OK;
}

int psctl_command_run(const psctl_call *k, session *ss)
{
    int rc = psctl_open(ss, k->server);
    if (rc != 0)
        return psctl_report(&ss->c, rc, ss->timeout);
    int status = k->cmd->run(ss, k);
    if (status == EXIT_OK && !(k->cmd->flags & PSCTL_NO_BYE)) {
        ps_msg m;
        ps_msg_init(&m, PS_MSG_BYE);
        ps_conn_send(&ss->c, &m);
    }
    return status;
}
