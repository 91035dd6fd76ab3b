/* psctl.c - the operator's view of a running psd, and its controls. It
 * speaks the same protocol as the workers, with the admin role: STATUS and
 * METRICS to read, ADMIN commands to act, PULL (from a pinned snapshot) to
 * save the model as a safetensors file.
 *
 * Exit codes: 0 success, 1 psd answered with an error, 2 bad usage, 3 psd
 * not reachable (refused, unresolvable), 4 timed out, 5 a local file could
 * not be written (save). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/client.h"
#include "common/json.h"
#include "proto/errors.h"

enum { EXIT_OK = 0, EXIT_REMOTE = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_TIMEOUT = 4, EXIT_LOCAL = 5 };

#define DEFAULT_TIMEOUT_MS 5000
#define CHECKPOINT_TIMEOUT_MS 600000 /* writing a big model's checkpoint takes a while */
#define SAVE_CHUNK (1u << 20)        /* floats per pull, as psworker pulls */

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

/* ---- errors ------------------------------------------------------------------ */

static int exit_code(int rc)
{
    switch (rc) {
    case 0:
        return EXIT_OK;
    case PS_ETIMEOUT:
        return EXIT_TIMEOUT;
    case PS_ECONNECT:
    case PS_ECLOSED:
    case PS_EINVAL:
        return EXIT_UNREACHABLE;
    default:
        return EXIT_REMOTE;
    }
}

/* One line on stderr for a failed exchange with psd. */
static int report(ps_client *c, int rc, int timeout)
{
    if (rc == PS_ETIMEOUT)
        fprintf(stderr, "psctl: %s (nothing within %d ms; see --timeout)\n", ps_client_error(c), timeout);
    else if (rc == PS_ECONNECT)
        fprintf(stderr, "psctl: %s (is psd running there? see --server)\n", ps_client_error(c));
    else
        fprintf(stderr, "psctl: %s\n", ps_client_error(c));
    return exit_code(rc);
}

/* ---- msgpack object helpers ----------------------------------------------- */


static double num(const msgpack_object *map, const char *key)
{
    const msgpack_object *o = ps_map_get(map, key);
    if (!o)
        return NAN;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return NAN;
    }
}

static const char *str(const msgpack_object *map, const char *key, char *buf, size_t len)
{
    const msgpack_object *o = ps_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_STR) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    }
    return buf;
}

static int flag(const msgpack_object *map, const char *key)
{
    const msgpack_object *o = ps_map_get(map, key);
    return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

static void json_string(FILE *f, const char *s, size_t n)
{
    ps_buf b = {0};
    if (ps_json_str(&b, s, n, PS_JSON_UTF8) == 0)
        fwrite(b.p, 1, b.len, f);
    else
        fputs("\"\"", f); /* out of memory: an empty string keeps the JSON whole */
    ps_buf_free(&b);
}

/* Writes o as JSON. Maps with non-string keys do not occur in psd's replies;
 * their keys are written as strings anyway. */
static void json(FILE *f, const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        fputs("null", f);
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        fputs(o->via.boolean ? "true" : "false", f);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%" PRIu64, o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        fprintf(f, "%" PRId64, o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isfinite(o->via.f64))
            fprintf(f, "%.17g", o->via.f64);
        else
            fputs("null", f);
        break;
    case MSGPACK_OBJECT_STR:
        json_string(f, o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputs(", ", f);
            json(f, &o->via.array.ptr[i]);
        }
        fputc(']', f);
        break;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (i)
                fputs(", ", f);
            if (kv->key.type == MSGPACK_OBJECT_STR)
                json_string(f, kv->key.via.str.ptr, kv->key.via.str.size);
            else
                fputs("\"?\"", f);
            fputs(": ", f);
            json(f, &kv->val);
        }
        fputc('}', f);
        break;
    default:
        fputs("null", f);
        break;
    }
}

/* ---- printing ------------------------------------------------------------------ */

static void print_worker_rows(const msgpack_object *ws, int with_why)
{
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    char state[32], addr[80], via[8], why[128];
    if (n == 0)
        return;
    printf("  %-7s %-10s %-22s %-4s %8s %9s %5s %8s %8s %10s%s\n", "SHARD", "STATE", "ADDRESS", "VIA", "PUSHES",
           "LAST SEEN", "EPOCH", "LOSS", "ACCURACY", "SAMPLES/S", with_why ? "  WHY" : "");
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        char shard[24], loss[16] = "-", acc[16] = "-";
        snprintf(shard, sizeof shard, "%.0f/%.0f", num(w, "shard"), num(w, "shards"));
        if (!isnan(num(w, "loss")))
            snprintf(loss, sizeof loss, "%.4f", num(w, "loss"));
        if (!isnan(num(w, "accuracy")))
            snprintf(acc, sizeof acc, "%.2f%%", 100 * num(w, "accuracy"));
        str(w, "why", why, sizeof why);
        printf("  %-7s %-10s %-22s %-4s %8.0f %7.1f s %5.0f %8s %8s %10.0f%s%s\n", shard,
               str(w, "state", state, sizeof state), str(w, "address", addr, sizeof addr),
               str(w, "transport", via, sizeof via), num(w, "pushes"), num(w, "last_seen"), num(w, "epoch"), loss, acc, num(w, "samples_per_second"),
               with_why && why[0] ? "  " : "", with_why ? why : "");
    }
}

/* The plan line of psctl status: where a BSP job run by a plan stands
 * (proto/PROTOCOL.md section 8, "The plan"); nothing when psd has none.
 * Rounds are counted from 1 here: round v + 1 is the one model version v
 * trains, so the last is "round R of R". */
static void print_plan(const msgpack_object *b)
{
    const msgpack_object *pl = ps_map_get(b, "plan");
    if (!pl || pl->type != MSGPACK_OBJECT_MAP)
        return;
    double rounds = num(pl, "rounds"), per_epoch = num(pl, "rounds_per_epoch"), epochs = num(pl, "epochs");
    double samples = num(pl, "samples"), batch = num(pl, "batch"), v = num(b, "version");
    if (flag(pl, "done")) {
        printf("plan: done at round %.0f (%.0f epochs of %.0f samples, %.0f a round)\n", rounds, epochs, samples,
               batch);
        return;
    }
    if (!(per_epoch >= 1) || !(v >= 0) || !(rounds >= 1)) {
        printf("plan: %.0f epochs of %.0f samples, %.0f a round\n", epochs, samples, batch);
        return;
    }
    printf("plan: epoch %.0f/%.0f, round %.0f of %.0f, ", num(pl, "epoch") + 1, epochs, v + 1, rounds);
    double n = num(pl, "round_workers");
    if (!(n >= 1)) {
        printf("the round not handed out yet (%.0f samples a round)\n", batch);
        return;
    }
    /* the round's samples, fewer in an epoch's last round, split as psd
     * splits them: parts differ by one sample at most */
    double i = fmod(v, per_epoch), left = samples - i * batch;
    double len = left < batch ? left : batch;
    double lo = floor(len / n), hi = ceil(len / n);
    if (lo == hi)
        printf("%.0f worker%s a round (%.0f samples each)\n", n, n == 1 ? "" : "s", lo);
    else
        printf("%.0f workers a round (%.0f-%.0f samples each)\n", n, lo, hi);
}

static void print_status(const msgpack_object *b)
{
    char mode[32], listen[300], opt[32], metrics[300], ckpt[96];
    double params = num(b, "parameters");
    /* what a crash would lose: the newest checkpoint beside the model's version */
    if (!flag(b, "state_dir"))
        snprintf(ckpt, sizeof ckpt, "no checkpoints: no state dir");
    else if (isnan(num(b, "checkpoint_version")))
        snprintf(ckpt, sizeof ckpt, "checkpoint: none yet");
    else
        snprintf(ckpt, sizeof ckpt, "checkpoint: version %.0f, %.1f s ago", num(b, "checkpoint_version"),
                 num(b, "checkpoint_age"));
    printf("psd %s  mode %s  model version %.0f (%s)  uptime %.1f s%s\n", str(b, "listen", listen, sizeof listen),
           str(b, "mode", mode, sizeof mode), num(b, "version"), ckpt, num(b, "uptime"),
           flag(b, "paused") ? "  PAUSED (psctl resume)" : "");
    printf("parameters %.0f (%.2f MB), optimizer %s, state %.2f MB, lr %g (now %g)\n", params,
           num(b, "bytes") / 1e6, str(b, "optimizer", opt, sizeof opt), num(b, "optimizer_state_bytes") / 1e6,
           num(b, "lr"), num(b, "lr_current"));
    printf("pushes %.0f (%.1f/s)  pulls %.0f (%.1f/s)  rounds %.0f  connections %.0f\n", num(b, "pushes"),
           num(b, "push_rate"), num(b, "pulls"), num(b, "pull_rate"), num(b, "rounds"), num(b, "connections"));
    char resumed[1200];
    const msgpack_object *rf = ps_map_get(b, "resumed_from");
    if (rf && rf->type == MSGPACK_OBJECT_STR && str(b, "resumed_from", resumed, sizeof resumed)[0])
        printf("model resumed at start from version %.0f in %s (psd --fresh begins anew)\n",
               num(b, "resumed_version"), resumed);
    const msgpack_object *inf = ps_map_get(b, "init_from");
    if (inf && inf->type == MSGPACK_OBJECT_STR && str(b, "init_from", resumed, sizeof resumed)[0])
        printf("model from %s at start (init_from)\n", resumed);
    str(b, "metrics_listen", metrics, sizeof metrics);
    if (metrics[0] && strcmp(metrics, "-") != 0)
        printf("metrics: http://%s/metrics\n", metrics);
    print_plan(b);
    /* embedding tables: one line each */
    const msgpack_object *tl = ps_map_get(b, "tables");
    for (uint32_t i = 0; tl && tl->type == MSGPACK_OBJECT_ARRAY && i < tl->via.array.size; i++) {
        const msgpack_object *t = &tl->via.array.ptr[i];
        char name[80], decl[300];
        printf("table %s: %.0f rows, %.2f MB, pulled %.0f (%.0f/s), pushed %.0f (%.0f/s); %s\n",
               str(t, "name", name, sizeof name), num(t, "rows"), num(t, "bytes") / 1e6, num(t, "rows_pulled"),
               num(t, "rows_pulled_rate"), num(t, "rows_pushed"), num(t, "rows_pushed_rate"),
               str(t, "declared", decl, sizeof decl));
        /* the bounds' work (table_admit, table_expire, table_memory): when there is any */
        if (num(t, "admitted") + num(t, "filtered") + num(t, "expired") + num(t, "evicted") > 0)
            printf("  rows admitted %.0f (pushes filtered %.0f), expired %.0f, evicted %.0f\n", num(t, "admitted"),
                   num(t, "filtered"), num(t, "expired"), num(t, "evicted"));
    }
    const msgpack_object *ws = ps_map_get(b, "workers");
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    printf("workers: %u seen, %.0f expected\n", n, num(b, "workers_expected"));
    const msgpack_object *wf = ps_map_get(b, "waiting_for");
    if (wf && wf->type == MSGPACK_OBJECT_ARRAY && wf->via.array.size) {
        printf("waiting for shard%s", wf->via.array.size == 1 ? "" : "s");
        for (uint32_t i = 0; i < wf->via.array.size; i++)
            if (wf->via.array.ptr[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                printf("%s %llu/%.0f", i ? "," : "", (unsigned long long)wf->via.array.ptr[i].via.u64,
                       num(b, "workers_expected"));
        double limit = num(b, "join_timeout");
        if (limit > 0)
            printf(" (never joined) for %.0f s; join_timeout %.0f s\n", num(b, "join_wait"), limit);
        else
            printf(" (never joined) for %.0f s; join_timeout 0: waiting for ever\n", num(b, "join_wait"));
    }
    print_worker_rows(ws, 0);
}

static void print_workers(const msgpack_object *b)
{
    const msgpack_object *ws = ps_map_get(b, "workers");
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    if (n == 0) {
        printf("no worker has connected yet (%.0f expected)\n", num(b, "workers_expected"));
        return;
    }
    print_worker_rows(ws, 1);
}

/* ---- talking to psd --------------------------------------------------------------- */

typedef struct session {
    ps_client c;
    int timeout;
    ps_token token;     /* the secret, when psd requires one (len 0: none) */
    ps_layout layout;   /* from the WELCOME, when psd has one */
    int has_layout;
    char mode[16];
    uint64_t fp;
} session;

static int open_session(session *ss, const char *server)
{
    ps_msg m, r;
    int rc = ps_client_connect(&ss->c, server, ss->timeout);
    if (rc != 0)
        return rc;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_ADMIN;
    rc = ps_client_hello(&ss->c, &m, ss->token.b, ss->token.len, &r, ss->timeout);
    if (rc != 0)
        return rc;
    snprintf(ss->mode, sizeof ss->mode, "%s", r.mode);
    if ((r.has & PS_F_LAYOUT) && r.layout) {
        ss->layout = *r.layout;
        ss->has_layout = 1;
        ss->fp = r.fp;
    }
    return 0;
}

/* Sends ADMIN cmd with args and waits for its OK. */
static int admin(session *ss, const char *cmd, char **args, int nargs, ps_msg *r)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_ADMIN);
    m.has = PS_F_CMD;
    snprintf(m.cmd, sizeof m.cmd, "%s", cmd);
    if (nargs > 0) {
        m.has |= PS_F_ARGS;
        for (int i = 0; i < nargs; i++) {
            m.args[i].p = args[i];
            m.args[i].len = (uint32_t)strlen(args[i]);
        }
        m.nargs = (uint32_t)nargs;
    }
    int rc = ps_client_call(&ss->c, &m, r, ss->timeout);
    if (rc == 0 && r->type != PS_MSG_OK) {
        snprintf(ss->c.err, sizeof ss->c.err, "psd answered %s with %s", cmd, ps_msg_type_name(r->type));
        return PS_EMALFORMED;
    }
    return rc;
}

/* ---- save: safetensors ------------------------------------------------------------------ */

static int json_str_buf(ps_buf *b, const char *s)
{
    return ps_json_str(b, s, strlen(s), PS_JSON_UTF8);
}

static int bprintf(ps_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bprintf(ps_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp || ps_buf_reserve(b, (size_t)n) != 0)
        return -1;
    memcpy(b->p + b->len, tmp, (size_t)n);
    b->len += (size_t)n;
    return 0;
}

/* Bytes a value of tensor t takes in the file: float32, or a buffer's
 * own dtype (num_batches_tracked as I64), which load_state_dict(strict)
 * wants back. */
static size_t save_size(const ps_tensor_desc *t)
{
    return t->save_dt == PS_SAVE_F64 || t->save_dt == PS_SAVE_I64 ? 8 : 4;
}

/* Writes values [pos, pos+n) of the model (whole layout l) to f, each in
 * its tensor's dtype (little-endian, as safetensors is; the machines psd
 * runs on are). 0, or -1 when the write fails. */
static int save_values(FILE *f, const ps_layout *l, uint64_t pos, const float *v, uint64_t n)
{
    uint32_t i = 0;
    while (i < l->ntensors && l->t[i].offset + l->t[i].count <= pos)
        i++;
    for (uint64_t done = 0; done < n && i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        uint64_t end = t->offset + t->count < pos + n ? t->offset + t->count : pos + n;
        uint64_t len = end - (pos + done);
        const float *x = v + done;
        if (t->save_dt == PS_SAVE_F32) {
            if (fwrite(x, sizeof(float), len, f) != len)
                return -1;
        } else {
            for (uint64_t k = 0; k < len; k++) {
                unsigned char b[8];
                if (t->save_dt == PS_SAVE_F64) {
                    double d = x[k];
                    memcpy(b, &d, 8);
                } else if (t->save_dt == PS_SAVE_I64) {
                    int64_t q = (int64_t)llrintf(x[k]);
                    memcpy(b, &q, 8);
                } else {
                    int32_t q = (int32_t)lrintf(x[k]);
                    memcpy(b, &q, 4);
                }
                if (fwrite(b, save_size(t), 1, f) != 1)
                    return -1;
            }
        }
        done += len;
    }
    return 0;
}

/* The safetensors header: 8 bytes of little-endian length N, then N bytes
 * of JSON, padded with spaces so the data starts at a multiple of 8. */
/* An embedding table (PROTOCOL.md 13) as psctl save writes it: its rows,
 * then its keys, after the model's values. */
typedef struct save_table {
    char name[PS_NAME_MAX + 1];
    uint32_t dim;
    uint64_t rows;   /* the rows psd held at the status: rows [0, rows) are saved */
    ps_buf decl;     /* its declaration as JSON, for the file's metadata */
} save_table;

static int safetensors_header(const ps_layout *l, uint64_t version, const char *mode, uint64_t fp,
                              const char *server, const char *part_versions, const save_table *tabs, uint32_t ntabs,
                              ps_buf *out)
{
    ps_buf j = {0};
    int rc = 0;
    rc |= bprintf(&j, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"psd\",\"model_version\":\"%" PRIu64
                      "\",\"mode\":",
                  version);
    rc |= json_str_buf(&j, mode);
    rc |= bprintf(&j, ",\"layout_fingerprint\":\"0x%016" PRIx64 "\",\"server\":", fp);
    rc |= json_str_buf(&j, server);
    if (part_versions) {
        /* a split model: each psd's pinned version, in part order */
        rc |= bprintf(&j, ",\"part_versions\":");
        rc |= json_str_buf(&j, part_versions);
    }
    if (ntabs) {
        /* the tables' declarations, a JSON array as one string (metadata
         * values are strings), for psd's init_from */
        ps_buf a = {0};
        rc |= bprintf(&a, "[");
        for (uint32_t i = 0; i < ntabs; i++) {
            rc |= bprintf(&a, i ? "," : "");
            rc |= ps_buf_reserve(&a, tabs[i].decl.len + 1) != 0;
            if (rc == 0) {
                memcpy(a.p + a.len, tabs[i].decl.p, tabs[i].decl.len);
                a.len += tabs[i].decl.len;
            }
        }
        rc |= bprintf(&a, "]");
        rc |= ps_buf_reserve(&a, 1) != 0;
        if (rc == 0) {
            a.p[a.len] = 0;
            rc |= bprintf(&j, ",\"psd.tables\":");
            rc |= json_str_buf(&j, (const char *)a.p);
        }
        ps_buf_free(&a);
    }
    /* the buffers' rules, so that psd --init-from holds them as buffers */
    for (uint32_t i = 0; i < l->ntensors; i++) {
        char key[PS_NAME_MAX + 16];
        if (!l->t[i].buf)
            continue;
        snprintf(key, sizeof key, "buffer:%s", l->t[i].name);
        rc |= bprintf(&j, ",");
        rc |= json_str_buf(&j, key);
        rc |= bprintf(&j, ":");
        rc |= json_str_buf(&j, ps_buf_name(l->t[i].buf));
    }
    rc |= bprintf(&j, "}");
    uint64_t at = 0; /* bytes: a buffer may be 8 a value */
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        rc |= bprintf(&j, ",");
        rc |= json_str_buf(&j, t->name);
        rc |= bprintf(&j, ":{\"dtype\":\"%s\",\"shape\":[", ps_save_dt_name(t->save_dt));
        for (uint32_t d = 0; d < t->ndim; d++)
            rc |= bprintf(&j, "%s%" PRIu32, d ? "," : "", t->dims[d]);
        rc |= bprintf(&j, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + t->count * save_size(t));
        at += t->count * save_size(t);
    }
    for (uint32_t i = 0; i < ntabs; i++) {
        const save_table *t = &tabs[i];
        char name[PS_NAME_MAX + 32];
        uint64_t rb = t->rows * t->dim * 4;
        snprintf(name, sizeof name, "tables/%s/rows", t->name);
        rc |= bprintf(&j, ",");
        rc |= json_str_buf(&j, name);
        rc |= bprintf(&j, ":{\"dtype\":\"F32\",\"shape\":[%" PRIu64 ",%" PRIu32 "],\"data_offsets\":[%" PRIu64
                          ",%" PRIu64 "]}", t->rows, t->dim, at, at + rb);
        at += rb;
        snprintf(name, sizeof name, "tables/%s/keys", t->name);
        rc |= bprintf(&j, ",");
        rc |= json_str_buf(&j, name);
        rc |= bprintf(&j, ":{\"dtype\":\"I64\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64
                          "]}", t->rows, at, at + t->rows * 8);
        at += t->rows * 8;
    }
    rc |= bprintf(&j, "}");
    while (rc == 0 && (8 + j.len) % 8 != 0)
        rc |= bprintf(&j, " ");
    if (rc != 0 || ps_buf_reserve(out, 8 + j.len) != 0) {
        ps_buf_free(&j);
        return PS_ENOMEM;
    }
    uint64_t n = j.len;
    for (int i = 0; i < 8; i++)
        out->p[i] = (uint8_t)(n >> (8 * i));
    memcpy(out->p + 8, j.p, j.len);
    out->len = 8 + j.len;
    ps_buf_free(&j);
    return 0;
}

/* Checks that a safetensors file can hold layout l (no name twice). */
static int save_names_ok(const ps_layout *l)
{
    for (uint32_t i = 0; i < l->ntensors; i++)
        for (uint32_t k = 0; k < i; k++)
            if (strcmp(l->t[i].name, l->t[k].name) == 0) {
                fprintf(stderr, "psctl: the model has two tensors named '%s'; a safetensors file cannot hold that\n",
                        l->t[i].name);
                return -1;
            }
    return 0;
}

/* Writes head and then the values of every session's model, in order (the
 * parts of a split model, or the one model), pulled from their pinned
 * snapshots at versions[i], to path (through path.tmp, renamed once whole).
 * Returns an exit code; the reason is on stderr. */
/* Writes the rows of each table, pulled by position (PROTOCOL.md 13.2),
 * then its keys, to f. An exit code; the reason is on stderr. */
static int save_tables(session *ss, const save_table *tabs, uint32_t ntabs, FILE *f)
{
    for (uint32_t i = 0; i < ntabs; i++) {
        const save_table *t = &tabs[i];
        uint8_t *keys = malloc(t->rows ? t->rows * 8 : 1);
        if (!keys) {
            fprintf(stderr, "psctl: out of memory for the keys of table '%s'\n", t->name);
            return EXIT_LOCAL;
        }
        uint64_t page = PS_TABLE_VALUES_MAX / t->dim < PS_TABLE_KEYS_MAX ? PS_TABLE_VALUES_MAX / t->dim
                                                                          : PS_TABLE_KEYS_MAX;
        for (uint64_t off = 0; off < t->rows; off += page) {
            uint64_t len = t->rows - off < page ? t->rows - off : page;
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_TPULL);
            m.has = PS_F_TAB | PS_F_OFF | PS_F_LEN;
            snprintf(m.tab, sizeof m.tab, "%s", t->name);
            m.off = off;
            m.len = len;
            int rc = ps_client_call(&ss->c, &m, &r, ss->timeout);
            if (rc != 0) {
                free(keys);
                return report(&ss->c, rc, ss->timeout);
            }
            if (r.type != PS_MSG_ROWS || !(r.has & PS_F_KEYS) || r.keys.n != len || r.ndata != len * t->dim) {
                fprintf(stderr, "psctl: psd answered the pull of rows [%" PRIu64 ", %" PRIu64 ") of table '%s' with %s\n",
                        off, off + len, t->name, ps_msg_type_name(r.type));
                free(keys);
                return EXIT_REMOTE;
            }
            memcpy(keys + off * 8, r.keys.p, len * 8);
            if (fwrite(r.data, sizeof(float), len * t->dim, f) != len * t->dim) {
                free(keys);
                return EXIT_LOCAL;
            }
        }
        size_t nk = (size_t)t->rows * 8;
        int bad = fwrite(keys, 1, nk, f) != nk;
        free(keys);
        if (bad)
            return EXIT_LOCAL;
    }
    return EXIT_OK;
}

/* The tables psd holds (STATUS "tables"), copied into *out (*n of them),
 * each with its declaration as JSON. An exit code. */
static int save_tables_list(session *ss, save_table **out, uint32_t *n)
{
    ps_msg m, r;
    *out = NULL;
    *n = 0;
    ps_msg_init(&m, PS_MSG_STATUS);
    int rc = ps_client_call(&ss->c, &m, &r, ss->timeout);
    if (rc != 0)
        return report(&ss->c, rc, ss->timeout);
    const msgpack_object *tl = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "tables") : NULL;
    if (!tl || tl->type != MSGPACK_OBJECT_ARRAY || tl->via.array.size == 0)
        return EXIT_OK; /* no tables, or a psd from before them */
    save_table *t = calloc(tl->via.array.size, sizeof *t);
    if (!t) {
        fprintf(stderr, "psctl: out of memory\n");
        return EXIT_LOCAL;
    }
    int bad = 0;
    for (uint32_t i = 0; i < tl->via.array.size && !bad; i++) {
        const msgpack_object *e = &tl->via.array.ptr[i], *hp = ps_map_get(e, "hp");
        char rinit[32], opt[32];
        double dim = num(e, "dim"), rows = num(e, "rows"), seed = num(e, "seed"), scale = num(e, "scale");
        const msgpack_object *seedo = ps_map_get(e, "seed");
        str(e, "name", t[i].name, sizeof t[i].name);
        str(e, "rinit", rinit, sizeof rinit);
        str(e, "opt", opt, sizeof opt);
        if (!(dim >= 1 && dim <= PS_TABLE_DIM_MAX) || !(rows >= 0) || isnan(seed) || !seedo ||
            seedo->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !hp || hp->type != MSGPACK_OBJECT_MAP) {
            fprintf(stderr, "psctl: psd's status describes table %u in a way this psctl does not know\n", i);
            bad = 1;
            break;
        }
        t[i].dim = (uint32_t)dim;
        t[i].rows = (uint64_t)rows;
        ps_buf *b = &t[i].decl;
        bad |= bprintf(b, "{\"name\":");
        bad |= json_str_buf(b, t[i].name);
        bad |= bprintf(b, ",\"dim\":%u,\"rinit\":", t[i].dim);
        bad |= json_str_buf(b, rinit);
        bad |= bprintf(b, ",\"scale\":%.17g,\"seed\":%" PRIu64 ",\"opt\":", scale, seedo->via.u64);
        bad |= json_str_buf(b, opt);
        bad |= bprintf(b, ",\"hp\":{");
        for (uint32_t k = 0; k < hp->via.map.size; k++) {
            const msgpack_object_kv *kv = &hp->via.map.ptr[k];
            char hn[32];
            double v = kv->val.type == MSGPACK_OBJECT_FLOAT64 || kv->val.type == MSGPACK_OBJECT_FLOAT32 ? kv->val.via.f64
                                                                                                       : NAN;
            if (kv->key.type != MSGPACK_OBJECT_STR || !isfinite(v)) {
                bad = 1;
                break;
            }
            snprintf(hn, sizeof hn, "%.*s", (int)kv->key.via.str.size, kv->key.via.str.ptr);
            bad |= bprintf(b, k ? "," : "");
            bad |= json_str_buf(b, hn);
            bad |= bprintf(b, ":%.17g", v);
        }
        bad |= bprintf(b, "}}");
        *n = i + 1;
    }
    *out = t;
    if (bad) {
        fprintf(stderr, "psctl: cannot describe psd's tables\n");
        return EXIT_REMOTE;
    }
    return EXIT_OK;
}

static void save_tables_free(save_table *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ps_buf_free(&t[i].decl);
    free(t);
}

static int save_write(session *ss, uint32_t n, const uint64_t *versions, const ps_buf *head, const char *path,
                      const ps_layout *whole, const save_table *tabs, uint32_t ntabs)
{
    uint64_t pos = 0; /* in the whole model */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fprintf(stderr, "psctl: path too long: %s\n", path);
        return EXIT_USAGE;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "psctl: cannot create %s: %s\n", tmp, strerror(errno));
        return EXIT_LOCAL;
    }
    int status = EXIT_OK;
    if (fwrite(head->p, 1, head->len, f) != head->len)
        status = EXIT_LOCAL;
    for (uint32_t i = 0; i < n && status == EXIT_OK; i++) {
        const ps_layout *l = &ss[i].layout;
        for (uint64_t off = 0; status == EXIT_OK && off < l->total; off += SAVE_CHUNK) {
            uint64_t len = l->total - off < SAVE_CHUNK ? l->total - off : SAVE_CHUNK;
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_PULL);
            m.has = PS_F_OFF | PS_F_LEN;
            m.off = off;
            m.len = len;
            int rc = ps_client_call(&ss[i].c, &m, &r, ss[i].timeout);
            if (rc != 0) {
                status = report(&ss[i].c, rc, ss[i].timeout);
                break;
            }
            if (r.type != PS_MSG_PARAMS || r.off != off || r.ndata != len || r.mver != versions[i]) {
                fprintf(stderr,
                        "psctl: psd answered the pull of [%" PRIu64 ", %" PRIu64 ") with %s of %" PRIu64
                        " values at version %" PRIu64 " (expected version %" PRIu64 ")\n",
                        off, off + len, ps_msg_type_name(r.type), r.ndata, r.mver, versions[i]);
                status = EXIT_REMOTE;
                break;
            }
            if (save_values(f, whole, pos, r.data, len) != 0)
                status = EXIT_LOCAL;
            pos += len;
        }
    }
    if (status == EXIT_OK && ntabs)
        status = save_tables(ss, tabs, ntabs, f);
    if (status == EXIT_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        status = EXIT_LOCAL;
    if (fclose(f) != 0 && status == EXIT_OK)
        status = EXIT_LOCAL;
    if (status == EXIT_OK && rename(tmp, path) != 0)
        status = EXIT_LOCAL;
    if (status == EXIT_LOCAL)
        fprintf(stderr, "psctl: cannot write %s: %s\n", path, strerror(errno));
    if (status != EXIT_OK)
        unlink(tmp);
    return status;
}

static void save_done(const char *path, uint64_t version, const ps_layout *l, uint32_t n, const save_table *tabs,
                      uint32_t ntabs, int as_json)
{
    uint64_t rows = 0;
    for (uint32_t i = 0; i < ntabs; i++)
        rows += tabs[i].rows;
    if (as_json) {
        printf("{\"path\": ");
        json_string(stdout, path, strlen(path));
        printf(", \"version\": %" PRIu64 ", \"parameters\": %" PRIu64 ", \"tensors\": %u, \"format\": "
               "\"safetensors\", \"servers\": %u, \"tables\": %u, \"rows\": %" PRIu64 "}\n",
               version, l->total, l->ntensors, n, ntabs, rows);
    } else {
        printf("saved model version %" PRIu64 " (%u tensors, %" PRIu64 " parameters%s", version, l->ntensors,
               l->total, n > 1 ? ", from its parts" : "");
        if (ntabs)
            printf("; %u tables, %" PRIu64 " rows", ntabs, rows);
        printf(") to %s\n", path);
    }
}

static int cmd_save(session *ss, const char *server, const char *path, int as_json)
{
    ps_msg r;
    ps_buf head = {0};
    if (!ss->has_layout) {
        fprintf(stderr, "psctl: psd has no model yet: no worker has connected\n");
        return EXIT_REMOTE;
    }
    const ps_layout *l = &ss->layout;
    if (save_names_ok(l) != 0)
        return EXIT_REMOTE;
    /* the tables and their rows now; a table's rows [0, rows) are saved,
     * each as it is when its page is pulled (pause the job for one state) */
    save_table *tabs;
    uint32_t ntabs;
    int status = save_tables_list(ss, &tabs, &ntabs);
    if (status != EXIT_OK) {
        save_tables_free(tabs, ntabs);
        return status;
    }
    /* pin one version: every chunk comes from the same snapshot */
    int rc = admin(ss, "pin", NULL, 0, &r);
    if (rc != 0) {
        save_tables_free(tabs, ntabs);
        return report(&ss->c, rc, ss->timeout);
    }
    uint64_t version = r.mver;
    if (safetensors_header(l, version, ss->mode, ss->fp, server, NULL, tabs, ntabs, &head) != 0) {
        fprintf(stderr, "psctl: out of memory\n");
        save_tables_free(tabs, ntabs);
        return EXIT_LOCAL;
    }
    status = save_write(ss, 1, &version, &head, path, l, tabs, ntabs);
    ps_buf_free(&head);
    if (status == EXIT_OK) {
        admin(ss, "unpin", NULL, 0, &r);
        save_done(path, version, l, 1, tabs, ntabs, as_json);
    }
    save_tables_free(tabs, ntabs);
    return status;
}

/* save from a model split over n psd (proto/PROTOCOL.md 6.2): their part
 * layouts joined into the model's (cut tensors whole again), each psd's
 * snapshot pinned, and the parts' values written one after the other,
 * which is the model's flat vector. Each psd pins its own version: for one
 * version of the whole model, pause the job first (psctl pause). */
static int cmd_save_parts(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout,
                          const char *path, int as_json)
{
    static ps_layout whole;
    const ps_layout *parts[PS_PARTS_MAX];
    uint64_t versions[PS_PARTS_MAX];
    char err[512], pv[PS_PARTS_MAX * 21 + 1] = "";
    ps_msg r;
    int status = EXIT_OK;
    uint32_t opened = 0;
    for (; opened < n && status == EXIT_OK; opened++) {
        session *s = &ss[opened];
        ps_client_init(&s->c);
        s->timeout = timeout;
        s->token = *token;
        int rc = open_session(s, list[opened]);
        if (rc != 0) {
            status = report(&s->c, rc, timeout);
        } else if (!s->has_layout) {
            fprintf(stderr, "psctl: psd at %s has no model yet: no worker has connected\n", list[opened]);
            status = EXIT_REMOTE;
        } else if (opened > 0 && strcmp(s->mode, ss[0].mode) != 0) {
            fprintf(stderr, "psctl: psd at %s runs %s, psd at %s %s: not parts of one job\n", list[0], ss[0].mode,
                    list[opened], s->mode);
            status = EXIT_REMOTE;
        }
        parts[opened] = &s->layout;
    }
    if (status == EXIT_OK && ps_layout_join(parts, n, &whole, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: these psd do not hold the parts of one model in this order (%s); list them as the "
                        "workers' --server does\n", err);
        status = EXIT_REMOTE;
    }
    if (status == EXIT_OK && save_names_ok(&whole) != 0)
        status = EXIT_REMOTE;
    uint32_t pinned = 0;
    for (; pinned < n && status == EXIT_OK; pinned++) {
        int rc = admin(&ss[pinned], "pin", NULL, 0, &r);
        if (rc != 0) {
            status = report(&ss[pinned].c, rc, timeout);
            break;
        }
        versions[pinned] = r.mver;
        size_t len = strlen(pv);
        snprintf(pv + len, sizeof pv - len, "%s%" PRIu64, pinned ? "," : "", r.mver);
    }
    if (status == EXIT_OK) {
        ps_buf head = {0};
        char servers[PS_PARTS_MAX * 301];
        size_t len = 0;
        for (uint32_t i = 0; i < n; i++)
            len += (size_t)snprintf(servers + len, sizeof servers - len, "%s%s", i ? "," : "", list[i]);
        if (safetensors_header(&whole, versions[0], ss[0].mode, ps_layout_fingerprint(&whole), servers, pv, NULL, 0,
                               &head) != 0) {
            fprintf(stderr, "psctl: out of memory\n");
            status = EXIT_LOCAL;
        } else {
            status = save_write(ss, n, versions, &head, path, &whole, NULL, 0);
        }
        ps_buf_free(&head);
    }
    for (uint32_t i = 0; i < opened; i++) {
        if (i < pinned && status == EXIT_OK)
            admin(&ss[i], "unpin", NULL, 0, &r);
        ps_msg m;
        ps_msg_init(&m, PS_MSG_BYE);
        ps_client_send(&ss[i].c, &m);
        ps_client_free(&ss[i].c);
        ps_token_clear(&ss[i].token);
    }
    if (status == EXIT_OK)
        save_done(path, versions[0], &whole, n, NULL, 0, as_json);
    return status;
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

/* Sends a request of type `type` (no fields) and checks the reply is of
 * type `want`; an exit code, the reason on stderr. */
static int ask(session *ss, uint32_t type, uint32_t want, const char *what, ps_msg *r)
{
    ps_msg m;
    ps_msg_init(&m, type);
    int rc = ps_client_call(&ss->c, &m, r, ss->timeout);
    if (rc != 0)
        return report(&ss->c, rc, ss->timeout);
    if (r->type != want) {
        fprintf(stderr, "psctl: psd answered %s with %s\n", what, ps_msg_type_name(r->type));
        return EXIT_REMOTE;
    }
    return EXIT_OK;
}

/* Runs cmd against the psd at server (one of a split model's, or the
 * only one); ss->c initialised, timeout and token set. */
static int run_one(const command *cmd, session *ss, const char *server, char **args, int nargs, int as_json)
{
    ps_msg m, r;
    int status = EXIT_OK, timeout = ss->timeout;
    int rc = open_session(ss, server);
    if (rc != 0) {
        status = report(&ss->c, rc, timeout);
        goto out;
    }

    if (strcmp(cmd->name, "status") == 0 || strcmp(cmd->name, "workers") == 0) {
        status = ask(ss, PS_MSG_STATUS, PS_MSG_STATUS_REPLY, "status", &r);
        if (status != EXIT_OK) {
        } else if (cmd->name[0] == 's') {
            if (as_json) {
                json(stdout, r.body);
                fputc('\n', stdout);
            } else {
                print_status(r.body);
            }
        } else {
            const msgpack_object *ws = ps_map_get(r.body, "workers");
            if (as_json) {
                if (ws)
                    json(stdout, ws);
                else
                    fputs("[]", stdout);
                fputc('\n', stdout);
            } else {
                print_workers(r.body);
            }
        }
    } else if (strcmp(cmd->name, "metrics") == 0) {
        status = ask(ss, PS_MSG_METRICS, PS_MSG_METRICS_REPLY, "metrics", &r);
        if (status == EXIT_OK)
            fwrite(r.text, 1, r.text_len, stdout);
    } else if (strcmp(cmd->name, "save") == 0) {
        status = cmd_save(ss, server, args[0], as_json);
    } else if (strcmp(cmd->name, "history") == 0) {
        /* psd writes the history in the form asked for */
        char *form[1] = {as_json ? "json" : history_csv ? "csv" : "table"};
        rc = admin(ss, "history", form, 1, &r);
        if (rc != 0)
            status = report(&ss->c, rc, timeout);
        else
            fwrite(r.text, 1, r.text_len, stdout);
    } else {
        /* set, pause, resume, checkpoint, shutdown, reset: one ADMIN request */
        char *forced[1] = {"force"};
        if (strcmp(cmd->name, "reset") == 0 && force)
            rc = admin(ss, cmd->name, forced, 1, &r);
        else
            rc = admin(ss, cmd->name, args, nargs, &r);
        if (rc != 0) {
            status = report(&ss->c, rc, timeout);
        } else if (as_json) {
            printf("{\"ok\": true, \"command\": \"%s\", \"version\": %" PRIu64 ", \"message\": ", cmd->name, r.mver);
            json_string(stdout, r.text ? r.text : "", r.text ? r.text_len : 0);
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
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v <= 0 || v > 3600000) {
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
        status = cmd_save_parts(ss, list, n, &token, timeout, args[0], as_json);
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
