/* status.c - what psctl shows: the status map (STATUS_REPLY body) and the
 * Prometheus text exposition (METRICS_REPLY, later also over HTTP). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server/policy/join.h"
#include "server/policy/policy.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/report/status.h"
#include "server/replog/replog.h"
#include "server/report/dashboard.h"

static const char *const worker_states[] = {"connected", "left", "lost"};

/* "replication" (PROTOCOL.md 17): this psd's role, its leader (a follower)
 * or its followers (a leader with a log). */
static void pack_replication(msgpack_packer *pk, psd *s, uint64_t now)
{
    const srv_follow *f = s->follow;
    const srv_replog *r = s->replog;
    ps_pack_key(pk, "replication");
    msgpack_pack_map(pk, 9);
    ps_pack_kstr(pk, "role", f ? "follower" : "leader");
    ps_pack_kstr(pk, "mode", s->cfg.replication == PS_REPLICATION_SYNC ? "sync" : "async");
    ps_pack_kstr(pk, "leader", f ? f->leader : "");
    ps_pack_ku64(pk, "applied", f ? f->applied : 0);
    ps_pack_ku64(pk, "lag_bytes", f && f->leader_end > f->applied ? f->leader_end - f->applied : 0);
    ps_pack_kstr(pk, "error", f && f->failed ? f->error : "");
    ps_pack_ku64(pk, "log_end", srv_replog_end(s));
    ps_pack_ku64(pk, "insync", srv_replog_insync(s));
    ps_pack_key(pk, "followers");
    uint32_t n = 0;
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++)
        n += r->f[i].used;
    msgpack_pack_array(pk, n);
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++) {
        const srv_follower *x = &r->f[i];
        if (!x->used)
            continue;
        msgpack_pack_map(pk, 6);
        ps_pack_kstr(pk, "addr", x->addr);
        ps_pack_kstr(pk, "peer", x->peer);
        ps_pack_key(pk, "insync");
        if (x->insync)
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
        ps_pack_ku64(pk, "lag_bytes", srv_replog_end(s) > x->pos ? srv_replog_end(s) - x->pos : 0);
        ps_pack_kf64(pk, "last_fetch", x->last_ms ? (double)(now - x->last_ms) / 1000.0 : -1.0);
        ps_pack_key(pk, "lag_versions"); /* at most; -1: unknown (report/dashboard.c) */
        msgpack_pack_int64(pk, srv_dash_versions_behind(s, x->pos));
    }
}

/* "coordinator" (docs/fault-tolerance.md, elections through etcd): this
 * psd's part in its election, and whether the part can fail over now. */
static void pack_coordinator(msgpack_packer *pk, const psd *s, uint64_t now)
{
    static const char *const roles[] = {"off", "starting", "leader", "follower", "campaigning"};
    const srv_coord_view *v = &s->coord;
    ps_pack_key(pk, "coordinator");
    msgpack_pack_map(pk, 13);
    ps_pack_kstr(pk, "role", roles[v->role >= 0 && v->role <= SRV_COORD_CAMPAIGNING ? v->role : 0]);
    ps_pack_kstr(pk, "key", v->key);
    ps_pack_kstr(pk, "leader", v->leader);
    ps_pack_key(pk, "can_fail_over");
    if (v->role != SRV_COORD_OFF && v->reachable)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_key(pk, "fenced");
    if (v->fence_ms && now >= v->fence_ms)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_key(pk, "listed");
    if (v->listed)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_key(pk, "handing_back");
    if (v->handing_back)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_kf64(pk, "renewed", v->renewed_ms ? (double)(now - v->renewed_ms) / 1000.0 : -1.0);
    ps_pack_kf64(pk, "unreachable", v->unreachable_ms ? (double)(now - v->unreachable_ms) / 1000.0 : 0.0);
    ps_pack_kstr(pk, "error", v->reachable ? "" : v->error);
    ps_pack_ku64(pk, "elections", v->elections);
    ps_pack_ku64(pk, "renewals", v->renewals);
    ps_pack_ku64(pk, "map_epoch", v->map_epoch);
}

/* "parts" (PROTOCOL.md 18): the part map psd holds and a move of parts
 * under way: where it goes, and the rows given and taken so far. */
static void pack_str(msgpack_packer *pk, const char *v)
{
    size_t n = strlen(v);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, v, n);
}

static void pack_parts(msgpack_packer *pk, const psd *s, uint64_t now)
{
    const srv_parts *p = &s->parts;
    ps_pack_key(pk, "parts");
    msgpack_pack_map(pk, 8);
    ps_pack_ku64(pk, "epoch", p->epoch);
    ps_pack_key(pk, "dropping"); /* the rows the last move took away are still being dropped */
    if (s->tables.drop.on)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_ku64(pk, "dense", p->dense);
    ps_pack_key(pk, "self");
    msgpack_pack_int32(pk, p->epoch ? p->self : -1);
    ps_pack_key(pk, "addrs");
    msgpack_pack_array(pk, p->epoch ? p->n : 0);
    for (uint32_t i = 0; p->epoch && i < p->n; i++)
        pack_str(pk, p->addrs[i]);
    ps_pack_key(pk, "moving");
    if (p->moving)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_kstr(pk, "error", p->error);
    ps_pack_key(pk, "move");
    if (!p->moving && !p->ended_ms) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_map(pk, 17);
    ps_pack_ku64(pk, "epoch", p->mv_epoch);
    ps_pack_ku64(pk, "old_n", p->old_n);
    ps_pack_ku64(pk, "new_n", p->new_n);
    ps_pack_key(pk, "old_self");
    msgpack_pack_int32(pk, p->old_self);
    ps_pack_key(pk, "new_self");
    msgpack_pack_int32(pk, p->new_self);
    ps_pack_key(pk, "addrs");
    msgpack_pack_array(pk, p->new_n);
    for (uint32_t i = 0; i < p->new_n; i++)
        pack_str(pk, p->new_addrs[i]);
    ps_pack_ku64(pk, "sources", (uint64_t)__builtin_popcountll(p->want));
    ps_pack_ku64(pk, "handed", (uint64_t)__builtin_popcountll(p->handed));
    ps_pack_ku64(pk, "switched", (uint64_t)__builtin_popcountll(p->switched));
    ps_pack_key(pk, "handed_by"); /* the sources that handed their rows over, by index */
    msgpack_pack_array(pk, (size_t)__builtin_popcountll(p->handed));
    for (uint32_t i = 0; i < 64; i++)
        if ((p->handed >> i) & 1)
            msgpack_pack_uint32(pk, i);
    ps_pack_ku64(pk, "rows_given", p->rows_out);
    ps_pack_ku64(pk, "bytes_given", p->bytes_out);
    ps_pack_ku64(pk, "rows_taken", p->rows_in);
    ps_pack_ku64(pk, "bytes_taken", p->bytes_in);
    ps_pack_ku64(pk, "rate", p->rate);
    ps_pack_kf64(pk, "seconds", (double)((p->moving ? now : p->ended_ms) - p->started_ms) / 1000.0);
    ps_pack_ku64(pk, "handover_ms_max", p->pause_ms_max);
}

int srv_pack_status(msgpack_packer *pk, void *arg)
{
    psd *s = arg;
    uint64_t now = srv_now_ms();
    uint64_t params = s->model.has_layout ? s->model.layout.total : 0;
    uint32_t nw = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        nw += s->workers[i] != NULL;
    char listen[300];
    snprintf(listen, sizeof listen, "%s:%d", s->cfg.listen.host, s->port);

    msgpack_pack_map(pk, 37);
    pack_replication(pk, s, now);
    pack_parts(pk, s, now);
    pack_coordinator(pk, s, now);
    /* the embedding tables (PROTOCOL.md 13): declaration and numbers */
    ps_pack_key(pk, "tables");
    msgpack_pack_array(pk, s->tables.n);
    for (uint32_t i = 0; i < s->tables.n; i++) {
        const ps_table_def *d = srv_tables_def(&s->tables, i);
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        char text[300];
        ps_table_def_text(d, text, sizeof text);
        msgpack_pack_map(pk, PS_TABLE_DEF_KEYS + 12);
        ps_pack_key(pk, "part"); /* [i, n]: this psd holds part i of n (PROTOCOL.md 13.7) */
        msgpack_pack_array(pk, 2);
        msgpack_pack_uint32(pk, d->part);
        msgpack_pack_uint32(pk, d->nparts);
        ps_pack_kf64(pk, "rows_pulled_rate", st.pull_rate);
        ps_pack_kf64(pk, "rows_pushed_rate", st.push_rate);
        ps_pack_table_def(pk, d);
        msgpack_pack_str_with_body(pk, "declared", 8);
        msgpack_pack_str_with_body(pk, text, strlen(text));
        ps_pack_ku64(pk, "rows", st.rows);
        ps_pack_ku64(pk, "bytes", st.bytes);
        ps_pack_ku64(pk, "rows_pulled", st.rows_pulled);
        ps_pack_ku64(pk, "rows_pushed", st.rows_pushed);
        ps_pack_ku64(pk, "admitted", st.admitted);
        ps_pack_ku64(pk, "filtered", st.filtered);
        ps_pack_ku64(pk, "expired", st.expired);
        ps_pack_ku64(pk, "evicted", st.evicted);
    }
    ps_pack_key(pk, "init_from"); /* the safetensors file the model came from at start */
    if (s->model_file[0])
        msgpack_pack_str_with_body(pk, s->model_file, strlen(s->model_file));
    else
        msgpack_pack_nil(pk);
    /* the shards psd waits for (bsp, ssp: never joined), and how long */
    uint32_t miss[64];
    uint32_t nmiss = srv_join_missing(s, miss, 64);
    ps_pack_key(pk, "waiting_for");
    msgpack_pack_array(pk, nmiss < 64 ? nmiss : 64);
    for (uint32_t i = 0; i < nmiss && i < 64; i++)
        msgpack_pack_uint32(pk, miss[i]);
    ps_pack_kf64(pk, "join_wait", (double)srv_join_waited(s, now) / 1000.0);
    ps_pack_kf64(pk, "join_timeout", (double)s->cfg.join_timeout / 1000.0);
    ps_pack_key(pk, "plan"); /* the job's plan and where it stands (BSP) */
    if (s->plan.set && s->policy->plan) {
        const srv_plan *pl = &s->plan;
        uint64_t r = s->model.version < pl->rounds ? s->model.version : pl->rounds;
        msgpack_pack_map(pk, 9);
        ps_pack_ku64(pk, "epochs", pl->p.epochs);
        ps_pack_ku64(pk, "samples", pl->p.samples);
        ps_pack_ku64(pk, "batch", pl->p.batch);
        ps_pack_ku64(pk, "seed", pl->p.seed);
        ps_pack_ku64(pk, "rounds", pl->rounds);
        ps_pack_ku64(pk, "rounds_per_epoch", pl->per_epoch);
        ps_pack_ku64(pk, "epoch", r / pl->per_epoch);
        ps_pack_ku64(pk, "round_workers", pl->round == s->model.version ? pl->nmembers : 0);
        ps_pack_key(pk, "done");
        if (srv_plan_done(s))
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
    } else {
        msgpack_pack_nil(pk);
    }
    ps_pack_key(pk, "resumed_from"); /* the checkpoint the model came from at start */
    if (s->resumed_from[0])
        msgpack_pack_str_with_body(pk, s->resumed_from, strlen(s->resumed_from));
    else
        msgpack_pack_nil(pk);
    ps_pack_key(pk, "resumed_version");
    if (s->resumed_from[0])
        msgpack_pack_uint64(pk, s->resumed_version);
    else
        msgpack_pack_nil(pk);
    ps_pack_kf64(pk, "lr", s->cfg.lr);
    ps_pack_kf64(pk, "lr_current", s->model.nblk ? srv_optim_lr(&s->model.opt, s->model.version) : s->cfg.lr);
    ps_pack_key(pk, "paused");
    if (s->paused)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_kstr(pk, "metrics_listen", s->http_addr); /* http.c, a layer above, writes it */
    ps_pack_ku64(pk, "dropped_pushes", s->stats.dropped_pushes);
    ps_pack_key(pk, "checkpoint_version");
    if (s->stats.checkpoint_ms)
        msgpack_pack_uint64(pk, s->stats.checkpoint_version);
    else
        msgpack_pack_nil(pk);
    ps_pack_key(pk, "state_dir");
    if (s->cfg.state_dir[0])
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_kf64(pk, "checkpoint_age", s->stats.checkpoint_ms ? (double)(now - s->stats.checkpoint_ms) / 1000.0 : -1.0);
    ps_pack_ku64(pk, "heartbeat_timeout_ms", s->cfg.heartbeat_timeout);
    ps_pack_kstr(pk, "mode", s->policy->name);
    ps_pack_ku64(pk, "version", s->model.version);
    ps_pack_ku64(pk, "parameters", params);
    ps_pack_ku64(pk, "bytes", params * 4);
    ps_pack_ku64(pk, "optimizer_state_bytes", s->model.nblk ? srv_optim_state_bytes(&s->model.opt) : 0);
    ps_pack_kstr(pk, "optimizer",
         s->model.nblk ? srv_optim_name(&s->model.opt) : srv_optim_kind_name(s->cfg.optimizer));
    ps_pack_key(pk, "initialized");
    if (s->model.initialized)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    ps_pack_kstr(pk, "listen", listen);
    ps_pack_kf64(pk, "uptime", (double)(now - s->start_ms) / 1000.0);
    ps_pack_ku64(pk, "workers_expected", (uint64_t)s->cfg.workers);
    ps_pack_ku64(pk, "connections", s->nconns);
    ps_pack_ku64(pk, "pushes", s->stats.pushes);
    ps_pack_ku64(pk, "pulls", s->stats.pulls);
    ps_pack_kf64(pk, "push_rate", s->stats.push_rate);
    ps_pack_kf64(pk, "pull_rate", s->stats.pull_rate);
    ps_pack_ku64(pk, "rounds", s->stats.rounds);
    ps_pack_key(pk, "workers");
    msgpack_pack_array(pk, nw);
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (!w)
            continue;
        msgpack_pack_map(pk, 16);
        ps_pack_ku64(pk, "shard", w->shard);
        ps_pack_ku64(pk, "clock", w->clock);
        ps_pack_kstr(pk, "why", w->state == SRV_W_CONNECTED ? "" : w->why);
        ps_pack_ku64(pk, "shards", w->nshards);
        ps_pack_kstr(pk, "state", worker_states[w->state]);
        ps_pack_kstr(pk, "address", w->addr);
        ps_pack_kstr(pk, "transport", w->shm ? (s->model.hw ? "hogwild" : "shm") : "tcp");
        ps_pack_kstr(pk, "table_transport", w->tshm ? "shm" : "tcp");
        ps_pack_ku64(pk, "pushes", w->pushes);
        ps_pack_kf64(pk, "last_seen", (double)(now - w->last_seen_ms) / 1000.0);
        ps_pack_ku64(pk, "epoch", w->epoch);
        ps_pack_key(pk, "loss");
        if (w->has_report)
            msgpack_pack_double(pk, w->loss);
        else
            msgpack_pack_nil(pk);
        ps_pack_key(pk, "accuracy");
        if (w->has_acc)
            msgpack_pack_double(pk, w->acc);
        else
            msgpack_pack_nil(pk);
        ps_pack_key(pk, "test_loss");
        if (w->has_acc)
            msgpack_pack_double(pk, w->tloss);
        else
            msgpack_pack_nil(pk);
        ps_pack_ku64(pk, "samples", w->samples);
        ps_pack_kf64(pk, "samples_per_second", w->rate);
    }
    return 0;
}

/* ---- Prometheus text ------------------------------------------------------ */

static int family(ps_buf *b, const char *name, const char *type, const char *help)
{
    return ps_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value as the text exposition format wants it: backslash, double
 * quote and line feed escaped (\\, \", \n), into out (cut to fit). */
static const char *label_value(const char *v, char *out, size_t len)
{
    size_t k = 0;
    for (; *v && k + 3 <= len; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n')
            out[k++] = '\\';
        out[k++] = *v == '\n' ? 'n' : *v;
    }
    out[k] = '\0';
    return out;
}

static int hist_text(ps_buf *b, const char *name, const char *help, const srv_hist *h)
{
    int rc = family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i < h->n; i++) {
        cum += h->counts[i];
        rc |= ps_buf_printf(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, h->bounds[i], cum);
    }
    rc |= ps_buf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->total);
    rc |= ps_buf_printf(b, "%s_sum %.17g\n%s_count %" PRIu64 "\n", name, h->sum, name, h->total);
    return rc;
}

int srv_metrics_text(psd *s, ps_buf *b)
{
    int rc = 0;
    uint64_t now = srv_now_ms();
    if (ps_buf_reserve(b, 4096) != 0)
        return PS_ENOMEM;
#define SIMPLE(name, type, help, fmt, val)                   \
    do {                                                     \
        rc |= family(b, name, type, help);                   \
        rc |= ps_buf_printf(b, "%s " fmt "\n", name, val);             \
    } while (0)
    SIMPLE("psd_pushes_total", "counter", "Gradient pushes accepted (one per worker step).", "%" PRIu64,
           s->stats.pushes);
    SIMPLE("psd_pulls_total", "counter", "Parameter pulls answered.", "%" PRIu64, s->stats.pulls);
    SIMPLE("psd_received_bytes_total", "counter", "Bytes of frames received.", "%" PRIu64, s->stats.bytes_in);
    SIMPLE("psd_received_frames_total", "counter", "Frames (messages) received.", "%" PRIu64, s->stats.frames_in);
    SIMPLE("psd_sent_bytes_total", "counter", "Bytes of frames queued for sending.", "%" PRIu64,
           s->stats.bytes_out);
    SIMPLE("psd_rounds_total", "counter", "BSP rounds closed.", "%" PRIu64, s->stats.rounds);
    SIMPLE("psd_connections_accepted_total", "counter", "TCP connections accepted.", "%" PRIu64,
           s->stats.connections);
    SIMPLE("psd_connections", "gauge", "Open TCP connections.", "%u", s->nconns);
    SIMPLE("psd_model_version", "gauge", "Updates applied to the model.", "%" PRIu64, s->model.version);
    SIMPLE("psd_model_parameters", "gauge", "Parameters in the model.", "%" PRIu64,
           s->model.has_layout ? s->model.layout.total : 0);
    SIMPLE("psd_uptime_seconds", "gauge", "Seconds since psd started.", "%.3f", (double)(now - s->start_ms) / 1e3);
    SIMPLE("psd_paused", "gauge", "1 while an admin has paused the workers (psctl pause), else 0.", "%d",
           s->paused ? 1 : 0);
    SIMPLE("psd_learning_rate", "gauge", "Learning rate of the next update (lr after the schedule).", "%.9g",
           s->model.nblk ? srv_optim_lr(&s->model.opt, s->model.version) : s->cfg.lr);

    rc |= family(b, "psd_rejected_messages_total", "counter", "Messages refused with an error reply, by reason.");
    for (int code = 1; code < 32; code++) {
        const char *name = ps_errname(-code);
        if (strcmp(name, "UNKNOWN") == 0)
            continue;
        char lower[32];
        size_t i = 0;
        for (; name[i] && i < sizeof lower - 1; i++)
            lower[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
        lower[i] = '\0';
        rc |= ps_buf_printf(b, "psd_rejected_messages_total{reason=\"%s\"} %" PRIu64 "\n", lower, s->stats.rejected[code]);
    }

    uint32_t counts[3] = {0, 0, 0};
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        if (s->workers[i])
            counts[s->workers[i]->state]++;
    rc |= family(b, "psd_workers", "gauge", "Workers by state.");
    for (int st = 0; st < 3; st++)
        rc |= ps_buf_printf(b, "psd_workers{state=\"%s\"} %u\n", worker_states[st], counts[st]);

    rc |= family(b, "psd_worker_loss", "gauge", "Last training loss a worker reported.");
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->has_report)
            rc |= ps_buf_printf(b, "psd_worker_loss{shard=\"%u\"} %.6g\n", i, s->workers[i]->loss);
    rc |= family(b, "psd_worker_test_accuracy_ratio", "gauge", "Last test accuracy a worker reported (0..1).");
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->has_acc)
            rc |= ps_buf_printf(b, "psd_worker_test_accuracy_ratio{shard=\"%u\"} %.6g\n", i, s->workers[i]->acc);
    SIMPLE("psd_dropped_pushes_total", "counter", "Pushes dropped because their BSP round had closed.",
           "%" PRIu64, s->stats.dropped_pushes);
    SIMPLE("psd_worker_joins_total", "counter", "Workers that joined or rejoined.", "%" PRIu64,
           s->stats.worker_joins);
    SIMPLE("psd_worker_leaves_total", "counter", "Workers that said bye.", "%" PRIu64, s->stats.worker_leaves);
    SIMPLE("psd_worker_deaths_total", "counter",
           "Workers lost: connection closed without bye, or silent past heartbeat_timeout.", "%" PRIu64,
           s->stats.worker_deaths);
    SIMPLE("psd_wire_zeros_elided_total", "counter",
           "Values received as zeros left out of the data (float32 without zeros, dt 2): never on the wire.",
           "%" PRIu64, s->stats.zeros_elided);
    SIMPLE("psd_wire_zstd_received_bytes_total", "counter",
           "Bytes of compressed float32 data received (dt 3), as they came over the wire.", "%" PRIu64,
           s->stats.zstd_in);
    SIMPLE("psd_wire_zstd_float_bytes_total", "counter",
           "The float32 bytes those decompressed to: the ratio of the two is what compression saved.", "%" PRIu64,
           s->stats.zstd_out);
    SIMPLE("psd_wire_zstd_sent_bytes_total", "counter",
           "Bytes of compressed float32 parameters sent (rdt 3), as they went over the wire.", "%" PRIu64,
           s->stats.zstd_sent);
    SIMPLE("psd_wire_zstd_sent_float_bytes_total", "counter",
           "The float32 bytes those were compressed from.", "%" PRIu64, s->stats.zstd_sent_raw);
    SIMPLE("psd_sanitized_pushes_total", "counter",
           "Pushes holding NaN or infinity that were sanitised and applied (nonfinite = clip).", "%" PRIu64,
           s->stats.sanitized_pushes);
    SIMPLE("psd_nonfinite_updates_total", "counter",
           "Updates whose result would have made parameters or optimizer state infinite or NaN: refused "
           "(nonfinite = reject).",
           "%" PRIu64, s->stats.nonfinite_updates);
    SIMPLE("psd_clipped_updates_total", "counter",
           "Updates whose infinite or NaN results were made finite (nonfinite = clip).", "%" PRIu64,
           s->stats.clipped_updates);
    rc |= family(b, "psd_disconnects_total", "counter",
                 "Connections psd closed: a client that stopped reading its replies (output_buffer) or an admin "
                 "silent past idle_timeout (idle).");
    rc |= ps_buf_printf(b, "psd_disconnects_total{reason=\"output_buffer\"} %" PRIu64 "\n", s->stats.disconnects_output);
    rc |= ps_buf_printf(b, "psd_disconnects_total{reason=\"idle\"} %" PRIu64 "\n", s->stats.disconnects_idle);
    /* embedding tables (PROTOCOL.md 13), one sample each */
    static const char *const tfam[8][3] = {
        {"psd_table_rows", "gauge", "Rows stored in the embedding table."},
        {"psd_table_bytes", "gauge", "Memory of the embedding table: rows, their optimizer state, hash slots."},
        {"psd_table_rows_pulled_total", "counter", "Rows of the embedding table answered to pulls."},
        {"psd_table_rows_pushed_total", "counter", "Row gradients applied to the embedding table."},
        {"psd_table_rows_admitted_total", "counter", "Rows stored at their key's table_admit-th push."},
        {"psd_table_pushes_filtered_total", "counter",
         "Row gradients of keys not admitted yet (table_admit): counted, not stored."},
        {"psd_table_rows_expired_total", "counter", "Rows dropped for not being pushed in table_expire pushes."},
        {"psd_table_rows_evicted_total", "counter",
         "Rows evicted to make room under table_memory or max_table_memory (table_full = evict)."},
    };
    for (int f = 0; f < 8; f++) {
        rc |= family(b, tfam[f][0], tfam[f][1], tfam[f][2]);
        for (uint32_t i = 0; i < s->tables.n; i++) {
            srv_table_stats st;
            srv_tables_stats(&s->tables, i, &st);
            const uint64_t vs[8] = {st.rows,     st.bytes,    st.rows_pulled, st.rows_pushed,
                                    st.admitted, st.filtered, st.expired,     st.evicted};
            uint64_t v = vs[f];
            char name[2 * PS_NAME_MAX + 1];
            rc |= ps_buf_printf(b, "%s{table=\"%s\"} %" PRIu64 "\n", tfam[f][0],
                                label_value(srv_tables_def(&s->tables, i)->name, name, sizeof name), v);
        }
    }
    SIMPLE("psd_table_memory_limit_bytes", "gauge", "max_table_memory: the most all embedding tables may take.",
           "%" PRIu64, s->cfg.max_table_memory);
    SIMPLE("psd_bsp_early_pieces_total", "counter",
           "BSP round pieces (bsp_piece) applied before their round closed.", "%" PRIu64, s->stats.early_pieces);
    SIMPLE("psd_barriers_total", "counter",
           "BARRIERs answered: steps at which a worker of a BSP job over a split model waited for the others.",
           "%" PRIu64, s->stats.barriers);
    /* a move of parts (PROTOCOL.md 18): the last one's, or the one under way */
    SIMPLE("psd_parts_map_epoch", "gauge", "The part map this psd holds (0: none, the workers' lists).", "%" PRIu64,
           s->parts.epoch);
    SIMPLE("psd_parts_moving", "gauge", "1 while a move of parts is under way here.", "%d", s->parts.moving);
    SIMPLE("psd_parts_move_rows_given", "gauge", "Rows this psd gave other parts in the last or current move.",
           "%" PRIu64, s->parts.rows_out);
    SIMPLE("psd_parts_move_rows_taken", "gauge", "Rows this psd took from other parts in the last or current move.",
           "%" PRIu64, s->parts.rows_in);
    SIMPLE("psd_parts_move_bytes_taken", "gauge", "Bytes of rows this psd took in the last or current move.",
           "%" PRIu64, s->parts.bytes_in);
    {
        const srv_replog *r = s->replog;
        const srv_follow *f = s->follow;
        SIMPLE("psd_replication_follower", "gauge", "1 on a follower (replica_of), 0 on a leader.", "%d", f != NULL);
        SIMPLE("psd_replication_insync_followers", "gauge", "A leader's followers in the in-sync set.", "%" PRIu32,
               srv_replog_insync(s));
        SIMPLE("psd_replication_log_bytes_total", "counter", "Bytes a leader appended to its replication log.",
               "%" PRIu64, r ? r->bytes : 0);
        rc |= family(b, "psd_replication_log_records_bytes_total", "counter",
                     "Bytes of the replication log's records by what they carry: dense ranges (values and state), "
                     "dense pushes (gradients), table pushes (keys and row gradients).");
        rc |= ps_buf_printf(b, "psd_replication_log_records_bytes_total{kind=\"dense\"} %" PRIu64 "\n"
                               "psd_replication_log_records_bytes_total{kind=\"grad\"} %" PRIu64 "\n"
                               "psd_replication_log_records_bytes_total{kind=\"table\"} %" PRIu64 "\n",
                            r ? r->dense_bytes : 0, r ? r->grad_bytes : 0, r ? r->table_bytes : 0);
        SIMPLE("psd_replication_log_gradients_in_place_total", "counter",
               "Dense pushes a leader logged in the receive buffer they came in (no copy into the log).", "%" PRIu64,
               r ? r->grad_taken : 0);
        SIMPLE("psd_replication_followers_dropped_total", "counter",
               "Followers that left the in-sync set (silent for max_replica_lag, or too far behind).", "%" PRIu64,
               r ? r->dropped : 0);
        SIMPLE("psd_replication_lag_bytes", "gauge",
               "A follower: the bytes of its leader's log it has not applied yet, as the leader's last answer said.",
               "%" PRIu64, f && f->leader_end > f->applied ? f->leader_end - f->applied : 0);
        /* a leader's followers, one series each (at most SRV_FOLLOWERS_MAX) */
        static const char *const ffam[3][3] = {
            {"psd_replication_follower_insync", "gauge", "A leader's follower: 1 while in the in-sync set."},
            {"psd_replication_follower_lag_bytes", "gauge",
             "A leader's follower: the bytes of the log it has not fetched yet."},
            {"psd_replication_follower_lag_versions", "gauge",
             "A leader's follower: the model versions it may be behind, at most (-1: unknown, over a minute "
             "behind)."},
        };
        for (int k = 0; k < 3; k++) {
            rc |= family(b, ffam[k][0], ffam[k][1], ffam[k][2]);
            for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++) {
                const srv_follower *x = &r->f[i];
                if (!x->used)
                    continue;
                uint64_t end = srv_replog_end(s);
                int64_t v = k == 0 ? x->insync : k == 1 ? (int64_t)(end > x->pos ? end - x->pos : 0)
                                                        : srv_dash_versions_behind(s, x->pos);
                char name[2 * sizeof x->addr + 1];
                rc |= ps_buf_printf(b, "%s{follower=\"%s\"} %" PRId64 "\n", ffam[k][0],
                                    label_value(x->addr, name, sizeof name), v);
            }
        }
        uint64_t readers = 0;
        for (const srv_conn *c = s->conns; c; c = c->next)
            readers += c->reader && !c->closing;
        SIMPLE("psd_readers", "gauge", "Connections of readers (a hello with reader): clients that only pull.",
               "%" PRIu64, readers);
    }
    {
        const srv_coord_view *v = &s->coord;
        SIMPLE("psd_coordinator_leader", "gauge", "1 while this psd holds its part's lease in etcd (coordinator).",
               "%d", v->role == SRV_COORD_LEADING);
        SIMPLE("psd_coordinator_can_fail_over", "gauge",
               "1 while etcd answers (a coordinator is set): the part can elect a new leader if this one dies.", "%d",
               v->role != SRV_COORD_OFF && v->reachable);
        SIMPLE("psd_coordinator_fenced", "gauge",
               "1 while this leader's lease is past its fence (2/3 of lease_ttl since the last renewal): pushes are "
               "acknowledged only once every follower holds them.", "%d", v->fence_ms && now >= v->fence_ms);
        SIMPLE("psd_coordinator_elections_total", "counter", "Elections this psd won (leaderships taken).",
               "%" PRIu64, v->elections);
        SIMPLE("psd_coordinator_stepdowns_total", "counter", "Leaderships this psd lost to another.", "%" PRIu64,
               v->stepdowns);
        SIMPLE("psd_coordinator_failures_total", "counter", "Requests to etcd that no member answered.", "%" PRIu64,
               v->failures);
        SIMPLE("psd_fenced_replies_held_total", "counter",
               "Workers' replies held because the lease was past its fence.", "%" PRIu64, s->stats.fenced_held);
        SIMPLE("psd_fenced_replies_sent_total", "counter",
               "Workers' replies sent past the fence because every follower held them.", "%" PRIu64,
               s->stats.fenced_acks);
    }
    SIMPLE("psd_checkpoints_total", "counter", "Checkpoints written.", "%" PRIu64, s->stats.checkpoints);
    SIMPLE("psd_checkpoint_failures_total", "counter", "Checkpoints that could not be written.", "%" PRIu64,
           s->stats.checkpoint_failures);
    rc |= family(b, "psd_checkpoint_age_seconds", "gauge",
                 "Seconds since the last checkpoint was written (-1: none yet).");
    rc |= ps_buf_printf(b, "psd_checkpoint_age_seconds %.3f\n",
              s->stats.checkpoint_ms ? (double)(now - s->stats.checkpoint_ms) / 1e3 : -1.0);
    rc |= hist_text(b, "psd_push_staleness_versions", "Model versions applied between a push's base and its arrival.",
                    &s->stats.staleness);
    rc |= hist_text(b, "psd_round_duration_seconds", "Duration of closed BSP rounds.", &s->stats.round_seconds);
#undef SIMPLE
    return rc ? PS_ENOMEM : 0;
}
