/* print.c - psctl's output (psctl.h): psd's STATUS for people (status,
 * workers, the plan line, the tables' lines) and as JSON, written by
 * common/json.c, whose string escaper and raw text psd's JSON uses too.
 * Owns nothing. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "psctl/psctl.h"

double psctl_num(const msgpack_object *map, const char *key)
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

const char *psctl_str(const msgpack_object *map, const char *key, char *buf, size_t len)
{
    const msgpack_object *o = ps_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_STR) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    }
    return buf;
}

int psctl_flag(const msgpack_object *map, const char *key)
{
    const msgpack_object *o = ps_map_get(map, key);
    return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

void psctl_json(FILE *f, const msgpack_object *o)
{
    ps_buf b = {0};
    if (ps_json_msgpack(&b, o) == 0)
        fwrite(b.p, 1, b.len, f);
    else
        fputs("null", f); /* out of memory: a null keeps the output JSON */
    ps_buf_free(&b);
}

void psctl_json_string(FILE *f, const char *s, size_t n)
{
    ps_buf b = {0};
    if (ps_json_str(&b, s, n, PS_JSON_UTF8) == 0)
        fwrite(b.p, 1, b.len, f);
    else
        fputs("\"\"", f); /* out of memory: an empty string keeps the JSON whole */
    ps_buf_free(&b);
}

static void print_worker_rows(const msgpack_object *ws, int with_why)
{
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    char state[32], addr[80], via[16], tvia[16], why[128];
    if (n == 0)
        return;
    printf("  %-7s %-10s %-22s %-7s %-6s %8s %9s %5s %8s %8s %10s%s\n", "SHARD", "STATE", "ADDRESS", "VIA", "TABLES",
           "PUSHES", "LAST SEEN", "EPOCH", "LOSS", "ACCURACY", "SAMPLES/S", with_why ? "  WHY" : "");
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        char shard[24], loss[16] = "-", acc[16] = "-";
        snprintf(shard, sizeof shard, "%.0f/%.0f", psctl_num(w, "shard"), psctl_num(w, "shards"));
        if (!isnan(psctl_num(w, "loss")))
            snprintf(loss, sizeof loss, "%.4f", psctl_num(w, "loss"));
        if (!isnan(psctl_num(w, "accuracy")))
            snprintf(acc, sizeof acc, "%.2f%%", 100 * psctl_num(w, "accuracy"));
        psctl_str(w, "why", why, sizeof why);
        printf("  %-7s %-10s %-22s %-7s %-6s %8.0f %7.1f s %5.0f %8s %8s %10.0f%s%s\n", shard,
               psctl_str(w, "state", state, sizeof state), psctl_str(w, "address", addr, sizeof addr),
               psctl_str(w, "transport", via, sizeof via), psctl_str(w, "table_transport", tvia, sizeof tvia),
               psctl_num(w, "pushes"), psctl_num(w, "last_seen"), psctl_num(w, "epoch"), loss, acc,
               psctl_num(w, "samples_per_second"), with_why && why[0] ? "  " : "", with_why ? why : "");
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
    double rounds = psctl_num(pl, "rounds"), per_epoch = psctl_num(pl, "rounds_per_epoch"), epochs = psctl_num(pl, "epochs");
    double samples = psctl_num(pl, "samples"), batch = psctl_num(pl, "batch"), v = psctl_num(b, "version");
    if (psctl_flag(pl, "done")) {
        printf("plan: done at round %.0f (%.0f epochs of %.0f samples, %.0f a round)\n", rounds, epochs, samples,
               batch);
        return;
    }
    if (!(per_epoch >= 1) || !(v >= 0) || !(rounds >= 1)) {
        printf("plan: %.0f epochs of %.0f samples, %.0f a round\n", epochs, samples, batch);
        return;
    }
    printf("plan: epoch %.0f/%.0f, round %.0f of %.0f, ", psctl_num(pl, "epoch") + 1, epochs, v + 1, rounds);
    double n = psctl_num(pl, "round_workers");
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

/* replicas (PROTOCOL.md 17): a follower's leader and lag, a leader's followers */
static void print_replication(const msgpack_object *b)
{
    const msgpack_object *r = ps_map_get(b, "replication");
    if (!r || r->type != MSGPACK_OBJECT_MAP)
        return;
    char role[32], leader[300], err[700], mode[16];
    psctl_str(r, "role", role, sizeof role);
    psctl_str(r, "mode", mode, sizeof mode);
    if (strcmp(role, "follower") == 0) {
        psctl_str(r, "error", err, sizeof err);
        printf("replica: follower of %s, applied %.0f bytes of its log, %.0f behind%s%s\n",
               psctl_str(r, "leader", leader, sizeof leader), psctl_num(r, "applied"), psctl_num(r, "lag_bytes"),
               err[0] ? "; STOPPED: " : "", err);
        return;
    }
    const msgpack_object *fs = ps_map_get(r, "followers");
    uint32_t n = fs && fs->type == MSGPACK_OBJECT_ARRAY ? fs->via.array.size : 0;
    if (n == 0)
        return; /* a leader without followers: nothing to say */
    printf("replicas: leader (replication %s), %.0f of %u followers in sync, log at %.0f bytes\n", mode,
           psctl_num(r, "insync"), n, psctl_num(r, "log_end"));
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *f = &fs->via.array.ptr[i];
        char addr[80];
        double lv = ps_map_get(f, "lag_versions") ? psctl_num(f, "lag_versions") : -1;
        char vers[48] = "";
        if (lv >= 0)
            snprintf(vers, sizeof vers, " (%.0f versions at most)", lv);
        printf("  follower %s: %s, %.0f bytes behind%s, last fetch %.1f s ago\n",
               psctl_str(f, "addr", addr, sizeof addr), psctl_flag(f, "insync") ? "in sync" : "NOT in sync",
               psctl_num(f, "lag_bytes"), vers, psctl_num(f, "last_fetch"));
    }
}

/* leadership through etcd (docs/fault-tolerance.md): the part's key, who
 * holds it, and whether the part can fail over now */
/* The part map and a move of parts under way (PROTOCOL.md 18). */
static void print_parts(const msgpack_object *b)
{
    const msgpack_object *p = ps_map_get(b, "parts");
    if (!p)
        return;
    const msgpack_object *mv = ps_map_get(p, "move");
    char err[400];
    const msgpack_object *addrs = ps_map_get(p, "addrs");
    if (psctl_num(p, "epoch") > 0 && addrs && addrs->type == MSGPACK_OBJECT_ARRAY)
        printf("parts: map %.0f, this psd part %.0f of %u (the dense model on the first %.0f)\n",
               psctl_num(p, "epoch"), psctl_num(p, "self"), addrs->via.array.size, psctl_num(p, "dense"));
    if (psctl_flag(p, "moving"))
        printf("parts: MOVING to map %.0f (%.0f parts to %.0f) for %.1f s: rows given %.0f, taken %.0f (%.1f MiB), "
               "%.0f of %.0f sources handed over\n",
               psctl_num(mv, "epoch"), psctl_num(mv, "old_n"), psctl_num(mv, "new_n"), psctl_num(mv, "seconds"),
               psctl_num(mv, "rows_given"), psctl_num(mv, "rows_taken"), psctl_num(mv, "bytes_taken") / 1048576.0,
               psctl_num(mv, "handed"), psctl_num(mv, "sources"));
    psctl_str(p, "error", err, sizeof err);
    if (err[0] && strcmp(err, "-") != 0)
        printf("parts: the move stopped: %s\n", err);
}

static void print_coordinator(const msgpack_object *b)
{
    const msgpack_object *k = ps_map_get(b, "coordinator");
    if (!k || k->type != MSGPACK_OBJECT_MAP)
        return;
    char role[32], key[300], leader[300], err[300];
    psctl_str(k, "role", role, sizeof role);
    if (!role[0] || strcmp(role, "off") == 0)
        return;
    psctl_str(k, "key", key, sizeof key);
    psctl_str(k, "leader", leader, sizeof leader);
    if (strcmp(role, "leader") == 0)
        printf("coordinator: this psd holds %s (lease renewed %.1f s ago)%s\n", key, psctl_num(k, "renewed"),
               psctl_flag(k, "fenced") ? "; FENCED: replies wait until every follower holds them" : "");
    else
        printf("coordinator: %s; %s names %s%s\n", role, key, leader[0] ? leader : "no leader",
               strcmp(role, "follower") == 0 ? (psctl_flag(k, "listed") ? "; in the in-sync set: may take over"
                                                                  : "; not in the in-sync set: will not take over")
                                             : "");
    if (!psctl_flag(k, "can_fail_over"))
        printf("coordinator: etcd does not answer for %.1f s (%s): this part CANNOT FAIL OVER\n",
               psctl_num(k, "unreachable"), psctl_str(k, "error", err, sizeof err));
}

void psctl_print_status(const msgpack_object *b)
{
    char mode[32], listen[300], opt[32], metrics[300], ckpt[96];
    double params = psctl_num(b, "parameters");
    /* what a crash would lose: the newest checkpoint beside the model's version */
    if (!psctl_flag(b, "state_dir"))
        snprintf(ckpt, sizeof ckpt, "no checkpoints: no state dir");
    else if (isnan(psctl_num(b, "checkpoint_version")))
        snprintf(ckpt, sizeof ckpt, "checkpoint: none yet");
    else
        snprintf(ckpt, sizeof ckpt, "checkpoint: version %.0f, %.1f s ago", psctl_num(b, "checkpoint_version"),
                 psctl_num(b, "checkpoint_age"));
    printf("psd %s  mode %s  model version %.0f (%s)  uptime %.1f s%s\n", psctl_str(b, "listen", listen, sizeof listen),
           psctl_str(b, "mode", mode, sizeof mode), psctl_num(b, "version"), ckpt, psctl_num(b, "uptime"),
           psctl_flag(b, "paused") ? "  PAUSED (psctl resume)" : "");
    printf("parameters %.0f (%.2f MB), optimizer %s, state %.2f MB, lr %g (now %g)\n", params,
           psctl_num(b, "bytes") / 1e6, psctl_str(b, "optimizer", opt, sizeof opt), psctl_num(b, "optimizer_state_bytes") / 1e6,
           psctl_num(b, "lr"), psctl_num(b, "lr_current"));
    printf("pushes %.0f (%.1f/s)  pulls %.0f (%.1f/s)  rounds %.0f  connections %.0f\n", psctl_num(b, "pushes"),
           psctl_num(b, "push_rate"), psctl_num(b, "pulls"), psctl_num(b, "pull_rate"), psctl_num(b, "rounds"), psctl_num(b, "connections"));
    char resumed[1200];
    const msgpack_object *rf = ps_map_get(b, "resumed_from");
    if (rf && rf->type == MSGPACK_OBJECT_STR && psctl_str(b, "resumed_from", resumed, sizeof resumed)[0])
        printf("model resumed at start from version %.0f in %s (psd --fresh begins anew)\n",
               psctl_num(b, "resumed_version"), resumed);
    const msgpack_object *inf = ps_map_get(b, "init_from");
    if (inf && inf->type == MSGPACK_OBJECT_STR && psctl_str(b, "init_from", resumed, sizeof resumed)[0])
        printf("model from %s at start (init_from)\n", resumed);
    psctl_str(b, "metrics_listen", metrics, sizeof metrics);
    if (metrics[0] && strcmp(metrics, "-") != 0)
        printf("metrics: http://%s/metrics\n", metrics);
    print_plan(b);
    print_replication(b);
    print_parts(b);
    print_coordinator(b);
    /* embedding tables: one line each */
    const msgpack_object *tl = ps_map_get(b, "tables");
    for (uint32_t i = 0; tl && tl->type == MSGPACK_OBJECT_ARRAY && i < tl->via.array.size; i++) {
        const msgpack_object *t = &tl->via.array.ptr[i];
        char name[80], decl[300];
        printf("table %s: %.0f rows, %.2f MB, pulled %.0f (%.0f/s), pushed %.0f (%.0f/s); %s\n",
               psctl_str(t, "name", name, sizeof name), psctl_num(t, "rows"), psctl_num(t, "bytes") / 1e6, psctl_num(t, "rows_pulled"),
               psctl_num(t, "rows_pulled_rate"), psctl_num(t, "rows_pushed"), psctl_num(t, "rows_pushed_rate"),
               psctl_str(t, "declared", decl, sizeof decl));
        /* the bounds' work (table_admit, table_expire, table_memory): when there is any */
        if (psctl_num(t, "admitted") + psctl_num(t, "filtered") + psctl_num(t, "expired") + psctl_num(t, "evicted") > 0)
            printf("  rows admitted %.0f (pushes filtered %.0f), expired %.0f, evicted %.0f\n", psctl_num(t, "admitted"),
                   psctl_num(t, "filtered"), psctl_num(t, "expired"), psctl_num(t, "evicted"));
    }
    const msgpack_object *ws = ps_map_get(b, "workers");
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    printf("workers: %u seen, %.0f expected\n", n, psctl_num(b, "workers_expected"));
    const msgpack_object *wf = ps_map_get(b, "waiting_for");
    if (wf && wf->type == MSGPACK_OBJECT_ARRAY && wf->via.array.size) {
        printf("waiting for shard%s", wf->via.array.size == 1 ? "" : "s");
        for (uint32_t i = 0; i < wf->via.array.size; i++)
            if (wf->via.array.ptr[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                printf("%s %llu/%.0f", i ? "," : "", (unsigned long long)wf->via.array.ptr[i].via.u64,
                       psctl_num(b, "workers_expected"));
        double limit = psctl_num(b, "join_timeout");
        if (limit > 0)
            printf(" (never joined) for %.0f s; join_timeout %.0f s\n", psctl_num(b, "join_wait"), limit);
        else
            printf(" (never joined) for %.0f s; join_timeout 0: waiting for ever\n", psctl_num(b, "join_wait"));
    }
    print_worker_rows(ws, 0);
}

void psctl_print_workers(const msgpack_object *b)
{
    const msgpack_object *ws = ps_map_get(b, "workers");
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    if (n == 0) {
        printf("no worker has connected yet (%.0f expected)\n", psctl_num(b, "workers_expected"));
        return;
    }
    print_worker_rows(ws, 1);
}
