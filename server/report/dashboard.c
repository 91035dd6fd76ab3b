/* dashboard.c - the run's history filled from psd's state, the JSON
 * endpoints and page files served over HTTP, and the ADMIN `history`
 * command (see dashboard.h); who may read them is dash_access.c's. */
#include "server/report/dashboard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "server/record/history.h"
#include "server/policy/join.h"
#include "server/policy/policy.h"
#include "server/replog/replog.h"
#include "proto/errors.h"

#ifndef PSD_WEB_DIR
#define PSD_WEB_DIR "/usr/local/share/psd/web"
#endif

#define SAMPLE_MS 1000          /* psd's series: one sample a second */
#define WEB_FILE_MAX (4u << 20) /* largest page file served */
#define LR_CURVE_POINTS 200     /* points of the learning-rate schedule */
#define VER_RING 256            /* (log position, model version) samples: a minute of ticks */

/* What the last tick saw of a worker, to notice joins, leaves and losses. */
typedef struct seen_worker {
    uint64_t joined_ms;
    int state;
} seen_worker;

struct srv_dash {
    srv_history *h;
    int failed;                  /* out of memory once: logged, nothing kept */
    uint64_t last_sample_ms;
    uint64_t pushes, pulls, bytes_in, bytes_out; /* counters at the last sample */
    uint64_t round_counts[SRV_HIST_MAX + 1];     /* round_seconds buckets then */
    uint64_t tab_pulled[PS_TABLES_MAX], tab_pushed[PS_TABLES_MAX]; /* each table's row counters then */
    const void *tab_id[PS_TABLES_MAX]; /* which table those were of (its definition) */
    seen_worker *seen;           /* by shard */
    uint32_t nseen;
    int paused;
    uint64_t checkpoints, checkpoint_failures;
    ps_config cfg;               /* the settings the last tick saw */
    /* A leader's replication log position at each tick where it moved, with
     * the model version of the tick before: every change up to that version
     * was flushed into the log by then (the tick flushes after this), so a
     * follower that fetched past the position holds that version at least
     * (srv_dash_versions_behind). Oldest first from vr_head - vr_n. */
    uint64_t vr_pos[VER_RING], vr_ver[VER_RING];
    uint32_t vr_head, vr_n;
    uint64_t vr_prev, vr_history;
};

static double since_start(const psd *s, uint64_t ms)
{
    return ms > s->start_ms ? (double)(ms - s->start_ms) / 1e3 : 0.0;
}

static const char *const worker_states[] = {"connected", "left", "lost"};

static struct srv_dash *dash_get(psd *s)
{
    if (s->dash)
        return s->dash->failed ? NULL : s->dash;
    struct srv_dash *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    s->dash = d;
    d->h = srv_history_new();
    if (!d->h) {
        d->failed = 1;
        PS_LOG(PS_LOG_WARN, "dashboard: out of memory; psd keeps no history of this run");
        return NULL;
    }
    d->cfg = s->cfg;
    d->paused = s->paused;
    d->checkpoints = s->stats.checkpoints;
    d->checkpoint_failures = s->stats.checkpoint_failures;
    d->pushes = s->stats.pushes;
    d->pulls = s->stats.pulls;
    d->bytes_in = s->stats.bytes_in;
    d->bytes_out = s->stats.bytes_out;
    memcpy(d->round_counts, s->stats.round_seconds.counts, sizeof d->round_counts);
    d->last_sample_ms = srv_now_ms();
    return d;
}

void srv_dash_free(psd *s)
{
    if (!s->dash)
        return;
    srv_history_free(s->dash->h);
    free(s->dash->seen);
    free(s->dash);
    s->dash = NULL;
}

/* ---- recording ---------------------------------------------------------------- */

static void sample(psd *s, struct srv_dash *d, uint64_t now)
{
    double dt = (double)(now - d->last_sample_ms) / 1e3;
    if (dt <= 0)
        return;
    const srv_hist *rh = &s->stats.round_seconds;
    uint64_t delta[SRV_HIST_MAX + 1];
    for (unsigned i = 0; i <= rh->n; i++)
        delta[i] = rh->counts[i] - d->round_counts[i];
    double v[SRV_H_COLS];
    v[SRV_H_PUSHES] = (double)(s->stats.pushes - d->pushes) / dt;
    v[SRV_H_PULLS] = (double)(s->stats.pulls - d->pulls) / dt;
    v[SRV_H_BYTES_IN] = (double)(s->stats.bytes_in - d->bytes_in) / dt;
    v[SRV_H_BYTES_OUT] = (double)(s->stats.bytes_out - d->bytes_out) / dt;
    v[SRV_H_LR] = s->model.nblk ? srv_optim_lr(&s->model.opt, s->model.version) : s->cfg.lr;
    v[SRV_H_ROUND_P50] = srv_bucket_quantile(rh->bounds, rh->n, delta, 0.5);
    v[SRV_H_ROUND_P99] = srv_bucket_quantile(rh->bounds, rh->n, delta, 0.99);
    srv_series_add(&d->h->psd, since_start(s, now), s->model.version, v);
    for (uint32_t i = 0; i < s->tables.n; i++) {
        const ps_table_def *def = srv_tables_def(&s->tables, i);
        srv_table_hist *th = srv_history_table(d->h, i, def->name);
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        if (d->tab_id[i] != def || st.rows_pulled < d->tab_pulled[i] || st.rows_pushed < d->tab_pushed[i]) {
            /* a table new since the last sample: its counters from 0 */
            d->tab_pulled[i] = d->tab_pushed[i] = 0;
            d->tab_id[i] = def;
        }
        double tv[SRV_HT_COLS] = {(double)st.rows, (double)st.bytes,
                                  (double)(st.rows_pulled - d->tab_pulled[i]) / dt,
                                  (double)(st.rows_pushed - d->tab_pushed[i]) / dt};
        if (th)
            srv_series_add(&th->s, since_start(s, now), s->model.version, tv);
        d->tab_pulled[i] = st.rows_pulled;
        d->tab_pushed[i] = st.rows_pushed;
    }
    d->pushes = s->stats.pushes;
    d->pulls = s->stats.pulls;
    d->bytes_in = s->stats.bytes_in;
    d->bytes_out = s->stats.bytes_out;
    memcpy(d->round_counts, rh->counts, sizeof d->round_counts);
    d->last_sample_ms = now;
}

static void note_workers(psd *s, struct srv_dash *d, uint64_t now)
{
    if (d->nseen < s->nworkers_cap) {
        seen_worker *n = realloc(d->seen, s->nworkers_cap * sizeof *n);
        if (!n)
            return;
        memset(n + d->nseen, 0, (s->nworkers_cap - d->nseen) * sizeof *n);
        d->seen = n;
        d->nseen = s->nworkers_cap;
    }
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        const srv_worker *w = s->workers[i];
        seen_worker *sw = &d->seen[i];
        if (!w || (w->joined_ms == sw->joined_ms && w->state == sw->state))
            continue;
        if (w->joined_ms != sw->joined_ms)
            srv_history_event(d->h, since_start(s, w->joined_ms), s->model.version, "joined",
                              "worker %u/%u joined from %s%s", w->shard, w->nshards, w->addr,
                              w->shm ? " (shared memory)" : "");
        if (w->state != SRV_W_CONNECTED)
            srv_history_event(d->h, since_start(s, now), s->model.version, worker_states[w->state],
                              "worker %u/%u %s: %s", w->shard, w->nshards, worker_states[w->state], w->why);
        sw->joined_ms = w->joined_ms;
        sw->state = w->state;
    }
}

static void note_settings(psd *s, struct srv_dash *d, uint64_t now)
{
    if (memcmp(&d->cfg, &s->cfg, sizeof d->cfg) == 0)
        return;
    size_t n;
    const ps_config_option *o = ps_config_options(&n);
    char text[SRV_EVENT_TEXT] = "", was[64], is[64];
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ps_config_differs(&d->cfg, &s->cfg, &o[i]))
            continue;
        ps_config_format(&d->cfg, &o[i], was, sizeof was);
        ps_config_format(&s->cfg, &o[i], is, sizeof is);
        if (used < sizeof text)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%s: %s -> %s", used ? ", " : "",
                                     o[i].name, was, is);
    }
    if (text[0])
        srv_history_event(d->h, since_start(s, now), s->model.version, "settings", "%s", text);
    d->cfg = s->cfg;
}

/* Notes what changed since the last look as events. */
static void note_events(psd *s, struct srv_dash *d, uint64_t now)
{
    note_workers(s, d, now);
    if (s->paused != d->paused) {
        srv_history_event(d->h, since_start(s, now), s->model.version, s->paused ? "paused" : "resumed",
                          s->paused ? "paused by an admin" : "resumed by an admin");
        d->paused = s->paused;
    }
    if (s->stats.checkpoints != d->checkpoints) {
        srv_history_event(d->h, since_start(s, s->stats.checkpoint_ms), s->stats.checkpoint_version, "checkpoint",
                          "checkpoint of version %" PRIu64 " written", s->stats.checkpoint_version);
        d->checkpoints = s->stats.checkpoints;
    }
    if (s->stats.checkpoint_failures != d->checkpoint_failures) {
        srv_history_event(d->h, since_start(s, now), s->model.version, "checkpoint",
                          "a checkpoint failed (psd's log says why)");
        d->checkpoint_failures = s->stats.checkpoint_failures;
    }
    note_settings(s, d, now);
}

void srv_dash_notice(psd *s)
{
    struct srv_dash *d = dash_get(s);
    if (d)
        note_events(s, d, srv_now_ms());
}

static void note_versions(psd *s, struct srv_dash *d)
{
    if (!s->replog || s->replog->history != d->vr_history) {
        d->vr_n = d->vr_head = 0; /* no log, or a new one: its positions start again */
        d->vr_history = s->replog ? s->replog->history : 0;
    }
    if (s->replog) {
        uint64_t end = srv_replog_end(s);
        uint32_t last = (d->vr_head + VER_RING - 1) % VER_RING;
        if (!d->vr_n || d->vr_pos[last] != end) {
            d->vr_pos[d->vr_head] = end;
            d->vr_ver[d->vr_head] = d->vr_prev;
            d->vr_head = (d->vr_head + 1) % VER_RING;
            d->vr_n += d->vr_n < VER_RING;
        }
    }
    d->vr_prev = s->model.version;
}

int64_t srv_dash_versions_behind(psd *s, uint64_t pos)
{
    struct srv_dash *d = dash_get(s);
    if (!s->replog || pos >= srv_replog_end(s))
        return 0;
    for (uint32_t k = 1; d && k <= d->vr_n; k++) {
        uint32_t i = (d->vr_head + VER_RING - k) % VER_RING;
        if (d->vr_pos[i] <= pos)
            return s->model.version > d->vr_ver[i] ? (int64_t)(s->model.version - d->vr_ver[i]) : 0;
    }
    return -1;
}

void srv_dash_tick(psd *s, uint64_t now)
{
    struct srv_dash *d = dash_get(s);
    if (!d)
        return;
    note_events(s, d, now);
    note_versions(s, d);
    if (now - d->last_sample_ms >= SAMPLE_MS)
        sample(s, d, now);
}

void srv_dash_report(psd *s, const srv_worker *w, int has_acc, int epoch_end)
{
    struct srv_dash *d = dash_get(s);
    if (!d)
        return;
    srv_worker_hist *wh = srv_history_worker(d->h, w->shard);
    if (!wh)
        return;
    double t = since_start(s, srv_now_ms());
    double tr[3] = {w->loss, w->rate, (double)w->samples};
    if (!epoch_end)
        wh->interval_reports = 1;
    if (!epoch_end || !wh->interval_reports)
        srv_series_add(&wh->train, t, s->model.version, tr);
    if (has_acc) {
        double ev[2] = {w->acc, w->tloss};
        srv_series_add(&wh->eval, t, s->model.version, ev);
    }
}

/* ---- responses ------------------------------------------------------------------ */

static void resp_text(srv_http_resp *r, int code, const char *reason, const char *text)
{
    r->code = code;
    r->reason = reason;
    r->ctype = "text/plain; charset=utf-8";
    r->body.len = 0;
    srv_json_raw(&r->body, text);
}

/* The page's files: a fixed list, so no path from a request reaches the
 * file system. */
static const struct {
    const char *path, *file, *ctype;
} web_files[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/index.html", "index.html", "text/html; charset=utf-8"},
    {"/app.js", "app.js", "text/javascript; charset=utf-8"},
    {"/style.css", "style.css", "text/css; charset=utf-8"},
    {"/uplot/uPlot.iife.min.js", "uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"},
    {"/uplot/uPlot.min.css", "uplot/uPlot.min.css", "text/css; charset=utf-8"},
};

/* Where the page's files are: web_root when set; else ../share/psd/web
 * from the directory of psd's executable, where `cmake --install` puts them
 * (PREFIX/bin/psd) and the build copies them (<build>/server/psd), when it
 * exists; else the install directory the build was configured for. */
static const char *web_dir(const psd *s)
{
    static char found[PS_CONFIG_PATH_MAX];
    static int looked;
    if (s->cfg.web_root[0])
        return s->cfg.web_root;
    if (!looked) {
        looked = 1;
        char exe[PS_CONFIG_PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        char *slash = strrchr(exe, '/');
        struct stat st;
        if (slash) {
            *slash = '\0';
            if ((size_t)snprintf(found, sizeof found, "%s/../share/psd/web", exe) >= sizeof found ||
                stat(found, &st) != 0 || !S_ISDIR(st.st_mode))
                found[0] = '\0';
        }
    }
    return found[0] ? found : PSD_WEB_DIR;
}

/* Reads web_dir()/file into r's body (files are small; read on the loop). */
static void serve_file(psd *s, const char *file, const char *ctype, srv_http_resp *r)
{
    char path[PS_CONFIG_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", web_dir(s), file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > WEB_FILE_MAX) {
        char msg[sizeof path + 400];
        snprintf(msg, sizeof msg,
                 "psd cannot read %s: %s. The dashboard's files are installed by `cmake --install` (uPlot is "
                 "fetched by scripts/setup.sh); set web_root to the directory that holds them.\n",
                 path, fd < 0 ? strerror(errno) : "not a regular file of at most 4 MiB");
        PS_LOG(PS_LOG_WARN, "dashboard: cannot read %s: %s", path, fd < 0 ? strerror(errno) : "not a small file");
        if (fd >= 0)
            close(fd);
        resp_text(r, 404, "Not Found", msg);
        return;
    }
    size_t size = (size_t)st.st_size, got = 0;
    if (ps_buf_reserve(&r->body, size + 1) != 0) {
        close(fd);
        resp_text(r, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    while (got < size) {
        ssize_t k = read(fd, r->body.p + got, size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (got != size) {
        resp_text(r, 500, "Internal Server Error", "the file changed while psd read it\n");
        return;
    }
    r->body.len = size;
    r->code = 200;
    r->reason = "OK";
    r->ctype = ctype;
}

static int kv_str(ps_buf *b, const char *k, const char *v)
{
    return ps_buf_printf(b, "\"%s\": ", k) | srv_json_str(b, v) | srv_json_raw(b, ", ");
}

static int kv_num(ps_buf *b, const char *k, double v)
{
    return ps_buf_printf(b, "\"%s\": ", k) | srv_json_num(b, v) | srv_json_raw(b, ", ");
}

static int kv_u64(ps_buf *b, const char *k, uint64_t v)
{
    return ps_buf_printf(b, "\"%s\": %" PRIu64 ", ", k, v);
}

static int kv_bool(ps_buf *b, const char *k, int v)
{
    return ps_buf_printf(b, "\"%s\": %s, ", k, v ? "true" : "false");
}

/* Where the learning-rate curve ends: past the schedule's own length, and
 * a quarter past the current version. */
static uint64_t lr_horizon(const psd *s)
{
    const ps_config *c = &s->cfg;
    uint64_t h = s->model.version + s->model.version / 4 + 10;
    uint64_t sched = c->warmup_versions;
    if (c->lr_schedule == PS_LR_COSINE)
        sched += c->lr_decay_versions + c->lr_decay_versions / 10;
    else if (c->lr_schedule == PS_LR_STEP)
        sched += 4 * c->lr_step_size;
    else
        sched += c->warmup_versions;
    return h > sched ? h : sched;
}

static int setting(ps_buf *b, const psd *s, const char *name)
{
    char v[PS_CONFIG_VALUE_MAX];
    const ps_config_option *o = ps_config_find(name);
    if (!o)
        return 0;
    ps_config_format(&s->cfg, o, v, sizeof v);
    return kv_str(b, name, v);
}

/* "replication": this psd's role and, a leader, its followers with their
 * lag in bytes and (at most) in model versions; a follower, its leader and
 * lag (PROTOCOL.md 17). */
static int replication_json(psd *s, ps_buf *b, uint64_t now)
{
    const srv_follow *f = s->follow;
    const srv_replog *r = s->replog;
    int rc = srv_json_raw(b, "\"replication\": {");
    rc |= kv_str(b, "role", f ? "follower" : "leader");
    rc |= kv_str(b, "mode", s->cfg.replication == PS_REPLICATION_SYNC ? "sync" : "async");
    rc |= kv_str(b, "leader", f ? f->leader : "");
    rc |= kv_u64(b, "applied", f ? f->applied : 0);
    rc |= kv_u64(b, "lag_bytes", f && f->leader_end > f->applied ? f->leader_end - f->applied : 0);
    rc |= kv_str(b, "error", f && f->failed ? f->error : "");
    rc |= kv_u64(b, "log_end", srv_replog_end(s));
    rc |= kv_u64(b, "insync", srv_replog_insync(s));
    rc |= srv_json_raw(b, "\"followers\": [");
    int first = 1;
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++) {
        const srv_follower *x = &r->f[i];
        if (!x->used)
            continue;
        rc |= srv_json_raw(b, first ? "{" : ", {");
        first = 0;
        rc |= kv_str(b, "addr", x->addr);
        rc |= kv_bool(b, "insync", x->insync);
        rc |= kv_u64(b, "lag_bytes", srv_replog_end(s) > x->pos ? srv_replog_end(s) - x->pos : 0);
        rc |= ps_buf_printf(b, "\"lag_versions\": %" PRId64 ", ", srv_dash_versions_behind(s, x->pos));
        rc |= ps_buf_printf(b, "\"last_fetch\": %.3f}", x->last_ms ? (double)(now - x->last_ms) / 1e3 : -1.0);
    }
    return rc | srv_json_raw(b, "]}, ");
}

/* "parts": the part map this psd holds and a move of parts, under way or
 * the last one (PROTOCOL.md 18): its rows given and taken. */
static int parts_json(psd *s, ps_buf *b, uint64_t now)
{
    const srv_parts *p = &s->parts;
    int rc = srv_json_raw(b, "\"parts\": {");
    rc |= kv_u64(b, "epoch", p->epoch);
    rc |= kv_u64(b, "n", p->epoch ? p->n : 0);
    rc |= kv_u64(b, "dense", p->epoch ? p->dense : 0);
    rc |= ps_buf_printf(b, "\"self\": %d, ", p->epoch ? p->self : -1);
    rc |= kv_bool(b, "moving", p->moving);
    rc |= kv_bool(b, "dropping", s->tables.drop.on);
    rc |= kv_str(b, "error", p->error);
    if (!p->moving && !p->ended_ms)
        return rc | srv_json_raw(b, "\"move\": null}, ");
    rc |= srv_json_raw(b, "\"move\": {");
    rc |= kv_u64(b, "epoch", p->mv_epoch);
    rc |= kv_u64(b, "old_n", p->old_n);
    rc |= kv_u64(b, "new_n", p->new_n);
    rc |= kv_u64(b, "sources", (uint64_t)__builtin_popcountll(p->want));
    rc |= kv_u64(b, "handed", (uint64_t)__builtin_popcountll(p->handed));
    rc |= kv_u64(b, "rows_given", p->rows_out);
    rc |= kv_u64(b, "rows_taken", p->rows_in);
    rc |= kv_u64(b, "bytes_taken", p->bytes_in);
    rc |= kv_u64(b, "handover_ms_max", p->pause_ms_max);
    rc |= ps_buf_printf(b, "\"seconds\": %.1f}}, ",
                        (double)((p->moving ? now : p->ended_ms) - p->started_ms) / 1e3);
    return rc;
}

static int job_json(psd *s, ps_buf *b)
{
    uint64_t now = srv_now_ms();
    int rc = srv_json_raw(b, "{");
    rc |= kv_str(b, "mode", s->policy->name);
    rc |= kv_str(b, "optimizer",
                 s->model.nblk ? srv_optim_name(&s->model.opt) : srv_optim_kind_name(s->cfg.optimizer));
    rc |= kv_num(b, "lr", s->cfg.lr);
    rc |= kv_num(b, "lr_current", s->model.nblk ? srv_optim_lr(&s->model.opt, s->model.version) : s->cfg.lr);
    rc |= srv_json_raw(b, "\"schedule\": {");
    rc |= setting(b, s, "lr_schedule");
    rc |= setting(b, s, "warmup_versions");
    rc |= setting(b, s, "lr_step_size");
    rc |= setting(b, s, "lr_gamma");
    rc |= setting(b, s, "lr_decay_versions");
    rc |= setting(b, s, "lr_min");
    b->len -= 2; /* the last ", " */
    rc |= srv_json_raw(b, "}, \"lr_curve\": {\"version\": [");
    uint64_t hz = lr_horizon(s);
    uint64_t np = hz + 1 < LR_CURVE_POINTS ? hz + 1 : LR_CURVE_POINTS; /* distinct versions */
    for (uint64_t i = 0; s->model.nblk && i < np; i++)
        rc |= ps_buf_printf(b, "%s%" PRIu64, i ? ", " : "", hz * i / (np - 1));
    rc |= srv_json_raw(b, "], \"lr\": [");
    for (uint64_t i = 0; s->model.nblk && i < np; i++) {
        rc |= srv_json_raw(b, i ? ", " : "");
        rc |= srv_json_num(b, srv_optim_lr(&s->model.opt, hz * i / (np - 1)));
    }
    rc |= srv_json_raw(b, "]}, ");
    rc |= kv_u64(b, "version", s->model.version);
    rc |= kv_u64(b, "parameters", s->model.has_layout ? s->model.layout.total : 0);
    rc |= kv_num(b, "uptime", (double)(now - s->start_ms) / 1e3);
    rc |= kv_bool(b, "paused", s->paused);
    rc |= kv_bool(b, "initialized", s->model.initialized);
    rc |= kv_u64(b, "workers_expected", (uint64_t)s->cfg.workers);
    rc |= kv_u64(b, "pushes", s->stats.pushes);
    rc |= kv_num(b, "push_rate", s->stats.push_rate);
    rc |= kv_u64(b, "rounds", s->stats.rounds);
    rc |= kv_u64(b, "checkpoints", s->stats.checkpoints);
    rc |= replication_json(s, b, now);
    rc |= parts_json(s, b, now);
    uint32_t miss[64];
    uint32_t nmiss = srv_join_missing(s, miss, 64);
    rc |= srv_json_raw(b, "\"waiting_for\": [");
    for (uint32_t i = 0; i < nmiss && i < 64; i++)
        rc |= ps_buf_printf(b, "%s%u", i ? ", " : "", miss[i]);
    rc |= srv_json_raw(b, "], ");
    rc |= kv_num(b, "join_wait", (double)srv_join_waited(s, now) / 1e3);
    const srv_hist *st = &s->stats.staleness;
    rc |= srv_json_raw(b, "\"staleness\": {\"bounds\": [");
    for (unsigned i = 0; i < st->n; i++)
        rc |= ps_buf_printf(b, "%s%g", i ? ", " : "", st->bounds[i]);
    rc |= srv_json_raw(b, "], \"counts\": [");
    for (unsigned i = 0; i <= st->n; i++)
        rc |= ps_buf_printf(b, "%s%" PRIu64, i ? ", " : "", st->counts[i]);
    rc |= srv_json_raw(b, "]}, \"workers\": [");
    int first = 1;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        const srv_worker *w = s->workers[i];
        if (!w)
            continue;
        rc |= srv_json_raw(b, first ? "{" : ", {");
        first = 0;
        rc |= kv_u64(b, "shard", w->shard);
        rc |= kv_u64(b, "shards", w->nshards);
        rc |= kv_str(b, "state", worker_states[w->state]);
        rc |= kv_str(b, "why", w->state == SRV_W_CONNECTED ? "" : w->why);
        rc |= kv_str(b, "address", w->addr);
        rc |= kv_str(b, "transport", w->shm ? (s->model.hw ? "hogwild" : "shm") : "tcp");
        rc |= kv_str(b, "table_transport", w->tshm ? "shm" : "tcp");
        rc |= kv_u64(b, "pushes", w->pushes);
        rc |= kv_u64(b, "epoch", w->epoch);
        rc |= kv_u64(b, "samples", w->samples);
        rc |= kv_num(b, "samples_per_second", w->has_report ? w->rate : NAN);
        rc |= kv_num(b, "loss", w->has_report ? w->loss : NAN);
        rc |= kv_num(b, "accuracy", w->has_acc ? w->acc : NAN);
        rc |= kv_u64(b, "staleness", w->staleness);
        rc |= ps_buf_printf(b, "\"last_seen\": %.3f}", (double)(now - w->last_seen_ms) / 1e3);
    }
    return rc | srv_json_raw(b, "]}\n");
}

static void resp_json(srv_http_resp *r, int rc)
{
    if (rc) {
        resp_text(r, 500, "Internal Server Error", "out of memory\n");
        return;
    }
    r->code = 200;
    r->reason = "OK";
    r->ctype = "application/json";
}

void srv_dash_serve(psd *s, const srv_http_req *q, srv_http_resp *r)
{
    /* the page loads nothing from elsewhere and talks to nothing else */
    snprintf(r->extra + strlen(r->extra), sizeof r->extra - strlen(r->extra),
             "Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
             "frame-ancestors 'none'\r\nX-Content-Type-Options: nosniff\r\n");
    if (strcmp(q->path, "/api/job") == 0) {
        resp_json(r, job_json(s, &r->body));
        return;
    }
    if (strcmp(q->path, "/api/history") == 0) {
        struct srv_dash *d = dash_get(s);
        if (!d) {
            resp_text(r, 503, "Service Unavailable", "psd keeps no history: it ran out of memory\n");
            return;
        }
        resp_json(r, srv_history_write(d->h, SRV_HFMT_JSON, &r->body));
        return;
    }
    for (size_t i = 0; i < sizeof web_files / sizeof web_files[0]; i++) {
        if (strcmp(q->path, web_files[i].path) == 0) {
            serve_file(s, web_files[i].file, web_files[i].ctype, r);
            return;
        }
    }
    resp_text(r, 404, "Not Found",
              "not found: psd serves its dashboard at /, its JSON at /api/job and /api/history, and its metrics at "
              "/metrics\n");
}

/* ---- psctl history --------------------------------------------------------------------- */

int srv_dash_history_text(psd *s, const ps_msg *m, ps_buf *text, char *err, size_t errlen)
{
    int fmt = SRV_HFMT_TABLE;
    if (m->nargs > 1) {
        snprintf(err, errlen, "history: at most one argument: json, csv or table");
        return PS_EBAD_FIELD;
    }
    if (m->nargs == 1) {
        const ps_str *a = &m->args[0];
        if (a->len == 4 && memcmp(a->p, "json", 4) == 0)
            fmt = SRV_HFMT_JSON;
        else if (a->len == 3 && memcmp(a->p, "csv", 3) == 0)
            fmt = SRV_HFMT_CSV;
        else if (!(a->len == 5 && memcmp(a->p, "table", 5) == 0)) {
            snprintf(err, errlen, "history: unknown form '%.*s' (json, csv or table)",
                     (int)(a->len > 40 ? 40 : a->len), a->p);
            return PS_EBAD_FIELD;
        }
    }
    struct srv_dash *d = dash_get(s);
    if (!d || srv_history_write(d->h, fmt, text) != 0 || text->len > UINT32_MAX) {
        ps_buf_free(text);
        snprintf(err, errlen, "history: out of memory");
        return PS_ENOMEM;
    }
    return 0;
}
