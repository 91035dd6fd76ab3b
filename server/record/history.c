/* history.c - bounded time series and the event ring (see history.h), and
 * their JSON, CSV and table forms. */
#include "common/json.h"
#include "server/record/history.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"

/* ---- series -------------------------------------------------------------------- */

int srv_series_init(srv_series *s, unsigned ncols, const char *const *cols)
{
    memset(s, 0, sizeof *s);
    if (ncols == 0 || ncols > SRV_SERIES_COLS_MAX)
        return PS_EINVAL;
    s->ncols = ncols;
    s->cols = cols;
    s->stride = 1;
    s->t = malloc(SRV_SERIES_POINTS * sizeof *s->t);
    s->version = malloc(SRV_SERIES_POINTS * sizeof *s->version);
    s->v = malloc((size_t)SRV_SERIES_POINTS * ncols * sizeof *s->v);
    if (!s->t || !s->version || !s->v) {
        srv_series_free(s);
        return PS_ENOMEM;
    }
    return 0;
}

void srv_series_free(srv_series *s)
{
    free(s->t);
    free(s->version);
    free(s->v);
    s->t = NULL;
    s->version = NULL;
    s->v = NULL;
    s->n = 0;
}

/* The mean of two values where either may be missing (NaN). */
static double mean2(double a, double b)
{
    if (isnan(a))
        return b;
    if (isnan(b))
        return a;
    return (a + b) / 2;
}

/* Full: merges points 2i and 2i+1 into point i. Each stored point then
 * stands for twice the samples. */
static void halve(srv_series *s)
{
    unsigned nc = s->ncols;
    for (unsigned i = 0; i < s->n / 2; i++) {
        unsigned a = 2 * i, b = 2 * i + 1;
        s->t[i] = s->t[b];
        s->version[i] = s->version[b];
        for (unsigned c = 0; c < nc; c++)
            s->v[i * nc + c] = mean2(s->v[a * nc + c], s->v[b * nc + c]);
    }
    s->n /= 2;
    s->stride *= 2;
}

void srv_series_add(srv_series *s, double t, uint64_t version, const double *vals)
{
    if (!s->t)
        return;
    for (unsigned c = 0; c < s->ncols; c++) {
        if (isnan(vals[c]))
            continue;
        s->pend_sum[c] += vals[c];
        s->pend_cnt[c]++;
    }
    s->pend_t = t;
    s->pend_version = version;
    if (++s->pend < s->stride)
        return;
    if (s->n == SRV_SERIES_POINTS) {
        halve(s); /* the point being filled now needs twice the samples */
        if (s->pend < s->stride)
            return;
    }
    unsigned i = s->n++;
    s->t[i] = s->pend_t;
    s->version[i] = s->pend_version;
    for (unsigned c = 0; c < s->ncols; c++) {
        s->v[i * s->ncols + c] = s->pend_cnt[c] ? s->pend_sum[c] / s->pend_cnt[c] : NAN;
        s->pend_sum[c] = 0;
        s->pend_cnt[c] = 0;
    }
    s->pend = 0;
}

unsigned srv_series_count(const srv_series *s)
{
    return s->n + (s->pend > 0);
}

void srv_series_get(const srv_series *s, unsigned i, double *t, uint64_t *version, double *vals)
{
    if (i < s->n) {
        *t = s->t[i];
        *version = s->version[i];
        memcpy(vals, s->v + (size_t)i * s->ncols, s->ncols * sizeof *vals);
        return;
    }
    *t = s->pend_t;
    *version = s->pend_version;
    for (unsigned c = 0; c < s->ncols; c++)
        vals[c] = s->pend_cnt[c] ? s->pend_sum[c] / s->pend_cnt[c] : NAN;
}

/* ---- the history ------------------------------------------------------------------ */

static const char *const psd_cols[SRV_H_COLS] = {
    "pushes_per_second", "pulls_per_second", "bytes_in_per_second", "bytes_out_per_second",
    "lr", "round_seconds_p50", "round_seconds_p99",
};
static const char *const train_cols[] = {"loss", "samples_per_second", "samples"};
static const char *const eval_cols[] = {"accuracy", "test_loss"};
static const char *const table_cols[SRV_HT_COLS] = {"rows", "bytes", "rows_pulled_per_second",
                                                    "rows_pushed_per_second"};

srv_history *srv_history_new(void)
{
    srv_history *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    if (srv_series_init(&h->psd, SRV_H_COLS, psd_cols) != 0) {
        free(h);
        return NULL;
    }
    return h;
}

void srv_history_free(srv_history *h)
{
    if (!h)
        return;
    srv_series_free(&h->psd);
    for (unsigned i = 0; i < SRV_HISTORY_SHARDS; i++) {
        if (!h->w[i])
            continue;
        srv_series_free(&h->w[i]->train);
        srv_series_free(&h->w[i]->eval);
        free(h->w[i]);
    }
    for (unsigned i = 0; i < PS_TABLES_MAX; i++) {
        if (h->tab[i])
            srv_series_free(&h->tab[i]->s);
        free(h->tab[i]);
    }
    free(h);
}

srv_worker_hist *srv_history_worker(srv_history *h, uint32_t shard)
{
    if (shard >= SRV_HISTORY_SHARDS)
        return NULL;
    if (h->w[shard])
        return h->w[shard];
    srv_worker_hist *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->shard = shard;
    if (srv_series_init(&w->train, 3, train_cols) != 0 || srv_series_init(&w->eval, 2, eval_cols) != 0) {
        srv_series_free(&w->train);
        free(w);
        return NULL;
    }
    h->w[shard] = w;
    return w;
}

srv_table_hist *srv_history_table(srv_history *h, unsigned i, const char *name)
{
    if (i >= PS_TABLES_MAX)
        return NULL;
    srv_table_hist *th = h->tab[i];
    if (th && strcmp(th->name, name) == 0)
        return th;
    if (th) { /* another table at this place: a new series */
        srv_series_free(&th->s);
    } else if (!(th = calloc(1, sizeof *th))) {
        return NULL;
    }
    h->tab[i] = th;
    snprintf(th->name, sizeof th->name, "%s", name);
    if (srv_series_init(&th->s, SRV_HT_COLS, table_cols) != 0) {
        free(th);
        h->tab[i] = NULL;
        return NULL;
    }
    return th;
}

void srv_history_event(srv_history *h, double t, uint64_t version, const char *kind, const char *fmt, ...)
{
    srv_event *e;
    if (h->ev_n < SRV_EVENTS_MAX) {
        e = &h->ev[(h->ev_first + h->ev_n) % SRV_EVENTS_MAX];
        h->ev_n++;
    } else {
        e = &h->ev[h->ev_first];
        h->ev_first = (h->ev_first + 1) % SRV_EVENTS_MAX;
        h->events_dropped++;
    }
    e->t = t;
    e->version = version;
    snprintf(e->kind, sizeof e->kind, "%s", kind);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->text, sizeof e->text, fmt, ap);
    va_end(ap);
}

/* ---- quantiles of bucket counts ------------------------------------------------- */

double srv_bucket_quantile(const double *bounds, unsigned n, const uint64_t *cnt, double q)
{
    uint64_t total = 0;
    for (unsigned i = 0; i <= n; i++)
        total += cnt[i];
    if (total == 0)
        return NAN;
    double rank = q * (double)total, cum = 0;
    for (unsigned i = 0; i < n; i++) {
        if (cnt[i] > 0 && cum + (double)cnt[i] >= rank) {
            double lo = i ? bounds[i - 1] : 0, hi = bounds[i];
            return lo + (hi - lo) * (rank - cum) / (double)cnt[i];
        }
        cum += (double)cnt[i];
    }
    return n ? bounds[n - 1] : NAN;
}

/* ---- JSON ---------------------------------------------------------------------- */

int srv_json_str(ps_buf *b, const char *s)
{
    /* texts are ASCII; anything else is shown as '?' */
    return ps_json_str(b, s, strlen(s), PS_JSON_ASCII);
}

int srv_json_num(ps_buf *b, double v)
{
    return isfinite(v) ? ps_buf_printf(b, "%.6g", v) : srv_json_raw(b, "null");
}

int srv_json_fixed(ps_buf *b, double v)
{
    return isfinite(v) ? ps_buf_printf(b, "%.3f", v) : srv_json_raw(b, "null");
}

static int series_json(ps_buf *b, const srv_series *s)
{
    unsigned n = srv_series_count(s);
    double t, vals[SRV_SERIES_COLS_MAX];
    uint64_t ver;
    int rc = ps_buf_printf(b, "{\"stride\": %u, \"t\": [", s->stride);
    for (unsigned i = 0; i < n; i++) {
        srv_series_get(s, i, &t, &ver, vals);
        rc |= srv_json_raw(b, i ? ", " : "");
        rc |= srv_json_fixed(b, t);
    }
    rc |= srv_json_raw(b, "], \"version\": [");
    for (unsigned i = 0; i < n; i++) {
        srv_series_get(s, i, &t, &ver, vals);
        rc |= ps_buf_printf(b, "%s%" PRIu64, i ? ", " : "", ver);
    }
    rc |= srv_json_raw(b, "]");
    for (unsigned c = 0; c < s->ncols; c++) {
        rc |= ps_buf_printf(b, ", \"%s\": [", s->cols[c]);
        for (unsigned i = 0; i < n; i++) {
            srv_series_get(s, i, &t, &ver, vals);
            rc |= srv_json_raw(b, i ? ", " : "");
            rc |= srv_json_num(b, vals[c]);
        }
        rc |= srv_json_raw(b, "]");
    }
    return rc | srv_json_raw(b, "}");
}

static const srv_event *event_at(const srv_history *h, unsigned i)
{
    return &h->ev[(h->ev_first + i) % SRV_EVENTS_MAX];
}

static int history_json(const srv_history *h, ps_buf *b)
{
    int rc = ps_buf_printf(b, "{\"points_max\": %u, \"events_max\": %u, \"events_dropped\": %" PRIu64 ", \"psd\": ",
                             SRV_SERIES_POINTS, SRV_EVENTS_MAX, h->events_dropped);
    rc |= series_json(b, &h->psd);
    rc |= srv_json_raw(b, ", \"workers\": [");
    int first = 1;
    for (unsigned i = 0; i < SRV_HISTORY_SHARDS; i++) {
        const srv_worker_hist *w = h->w[i];
        if (!w)
            continue;
        rc |= ps_buf_printf(b, "%s{\"shard\": %u, \"train\": ", first ? "" : ", ", w->shard);
        rc |= series_json(b, &w->train);
        rc |= srv_json_raw(b, ", \"eval\": ");
        rc |= series_json(b, &w->eval);
        rc |= srv_json_raw(b, "}");
        first = 0;
    }
    rc |= srv_json_raw(b, "], \"tables\": [");
    first = 1;
    for (unsigned i = 0; i < PS_TABLES_MAX; i++) {
        const srv_table_hist *th = h->tab[i];
        if (!th)
            continue;
        rc |= srv_json_raw(b, first ? "{\"name\": " : ", {\"name\": ");
        rc |= srv_json_str(b, th->name);
        rc |= srv_json_raw(b, ", \"series\": ");
        rc |= series_json(b, &th->s);
        rc |= srv_json_raw(b, "}");
        first = 0;
    }
    rc |= srv_json_raw(b, "], \"events\": [");
    for (unsigned i = 0; i < h->ev_n; i++) {
        const srv_event *e = event_at(h, i);
        rc |= srv_json_raw(b, i ? ", {\"t\": " : "{\"t\": ");
        rc |= srv_json_fixed(b, e->t);
        rc |= ps_buf_printf(b, ", \"version\": %" PRIu64 ", \"kind\": ", e->version);
        rc |= srv_json_str(b, e->kind);
        rc |= srv_json_raw(b, ", \"text\": ");
        rc |= srv_json_str(b, e->text);
        rc |= srv_json_raw(b, "}");
    }
    return rc | srv_json_raw(b, "]}\n");
}

/* ---- CSV and table ----------------------------------------------------------------- */

/* One row: the four leading fields, then the last two as given. */
static int row(ps_buf *b, int table, const char *series, const char *shard, double t, uint64_t ver,
               const char *what, const char *value)
{
    if (table)
        return ps_buf_printf(b, "%-6s %5s %10.3f %9" PRIu64 "  %-20s %s\n", series, shard, t, ver, what, value);
    return ps_buf_printf(b, "%s,%s,%.3f,%" PRIu64 ",%s,%s\n", series, shard, t, ver, what, value);
}

static int series_rows(ps_buf *b, int table, const char *name, const char *shard, const srv_series *s)
{
    int rc = 0;
    double t, vals[SRV_SERIES_COLS_MAX];
    uint64_t ver;
    char num[32];
    for (unsigned i = 0; i < srv_series_count(s); i++) {
        srv_series_get(s, i, &t, &ver, vals);
        for (unsigned c = 0; c < s->ncols; c++) {
            if (isfinite(vals[c]))
                snprintf(num, sizeof num, "%.6g", vals[c]);
            else
                snprintf(num, sizeof num, "%s", table ? "-" : "");
            rc |= row(b, table, name, shard, t, ver, s->cols[c], num);
        }
    }
    return rc;
}

/* A field for CSV (RFC 4180): as it is, or in double quotes with its own
 * doubled when it holds a comma, a double quote, CR or LF; into out (cut
 * to fit, 2 x the field + 3 bytes holds any). */
static const char *csv_field(const char *v, char *out, size_t len)
{
    if (!v[strcspn(v, ",\"\r\n")]) {
        snprintf(out, len, "%s", v);
        return out;
    }
    size_t k = 0;
    out[k++] = '"';
    for (; *v && k + 4 <= len; v++) {
        if (*v == '"')
            out[k++] = '"';
        out[k++] = *v;
    }
    out[k++] = '"';
    out[k] = '\0';
    return out;
}

static int history_rows(const srv_history *h, int table, ps_buf *b)
{
    int rc = 0;
    char shard[16], text[2 * SRV_EVENT_TEXT + 3];
    if (table)
        rc |= ps_buf_printf(b, "%-6s %5s %10s %9s  %-20s %s\n", "series", "shard", "t", "version", "column",
                              "value");
    else
        rc |= srv_json_raw(b, "series,shard,t,version,column,value\n");
    rc |= series_rows(b, table, "psd", "", &h->psd);
    for (unsigned i = 0; i < SRV_HISTORY_SHARDS; i++) {
        if (!h->w[i])
            continue;
        snprintf(shard, sizeof shard, "%u", h->w[i]->shard);
        rc |= series_rows(b, table, "train", shard, &h->w[i]->train);
        rc |= series_rows(b, table, "eval", shard, &h->w[i]->eval);
    }
    for (unsigned i = 0; i < PS_TABLES_MAX; i++)
        if (h->tab[i])
            rc |= series_rows(b, table, "table", table ? h->tab[i]->name : csv_field(h->tab[i]->name, text, sizeof text),
                              &h->tab[i]->s);
    for (unsigned i = 0; i < h->ev_n; i++) {
        const srv_event *e = event_at(h, i);
        if (table) {
            snprintf(text, sizeof text, "%s", e->text);
        } else {
            /* a quoted CSV field: quotes doubled */
            size_t k = 0;
            text[k++] = '"';
            for (const char *p = e->text; *p && k < sizeof text - 3; p++) {
                if (*p == '"')
                    text[k++] = '"';
                text[k++] = *p;
            }
            text[k++] = '"';
            text[k] = '\0';
        }
        rc |= row(b, table, "event", "", e->t, e->version, e->kind, text);
    }
    return rc;
}

int srv_history_write(const srv_history *h, int fmt, ps_buf *out)
{
    int rc = fmt == SRV_HFMT_JSON ? history_json(h, out) : history_rows(h, fmt == SRV_HFMT_TABLE, out);
    return rc ? PS_ENOMEM : 0;
}
