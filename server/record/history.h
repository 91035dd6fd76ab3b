/* history.h - the run's history as the dashboard and `psctl history` show
 * it: time series of a fixed size and a ring of events. Plain data, no psd
 * and no I/O (dashboard.c fills it from psd's state; the unit tests drive
 * it directly).
 *
 * The bound. A series holds at most SRV_SERIES_POINTS points. When it is
 * full, neighbouring points are merged in pairs (times and versions: the
 * later point's; values: their mean, ignoring missing ones), which halves
 * it, and from then on each stored point is the mean of twice as many
 * samples as before (`stride`). So a series always spans the whole run, at
 * a resolution that halves each time the run doubles in length, and never
 * grows. The samples of a point not yet complete are kept apart and shown
 * as the last point. Events go to a ring of SRV_EVENTS_MAX; the oldest are
 * dropped (`events_dropped` counts them). Worker series exist for the first
 * SRV_HISTORY_SHARDS shards, allocated when a shard first reports. Memory:
 * at most (SRV_SERIES_POINTS + 1) * (16 + 8 * columns) bytes a series, about
 * 40 KiB for psd's series and 36 KiB per reporting shard. */
#ifndef SRV_HISTORY_H
#define SRV_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "proto/msg.h"
#include "proto/table.h"

#define SRV_SERIES_POINTS 512  /* points per series (even) */
#define SRV_SERIES_COLS_MAX 8  /* values per point */
#define SRV_EVENTS_MAX 256     /* events kept */
#define SRV_HISTORY_SHARDS 256 /* shards that get series */
#define SRV_EVENT_TEXT 120     /* bytes of an event's text, NUL included */

/* One series: points of (t, version, ncols values). A value may be NaN:
 * missing (no BSP round closed in that second, say). */
typedef struct srv_series {
    unsigned ncols;
    const char *const *cols; /* column names (static strings) */
    unsigned n;              /* complete points stored */
    unsigned stride;         /* samples merged into each stored point */
    double *t;               /* seconds since psd started, [SRV_SERIES_POINTS] */
    uint64_t *version;       /* model version at the sample */
    double *v;               /* values, point i's column c at v[i * ncols + c] */
    /* the point being filled: pend samples so far */
    unsigned pend;
    double pend_t;
    uint64_t pend_version;
    double pend_sum[SRV_SERIES_COLS_MAX];
    unsigned pend_cnt[SRV_SERIES_COLS_MAX];
} srv_series;

/* Allocates a series of ncols (1..SRV_SERIES_COLS_MAX) columns named cols
 * (which must outlive it). Returns 0 or PS_ENOMEM. */
int srv_series_init(srv_series *s, unsigned ncols, const char *const *cols);
void srv_series_free(srv_series *s);
/* Adds one sample: vals[0..ncols). Times should not go backwards. */
void srv_series_add(srv_series *s, double t, uint64_t version, const double *vals);
/* Points to show: the stored ones and the one being filled, if any. */
unsigned srv_series_count(const srv_series *s);
/* Point i (< srv_series_count) into *t, *version and vals[0..ncols). */
void srv_series_get(const srv_series *s, unsigned i, double *t, uint64_t *version, double *vals);

typedef struct srv_event {
    double t;                    /* seconds since psd started */
    uint64_t version;
    char kind[16];               /* joined, left, lost, checkpoint, paused, resumed, settings */
    char text[SRV_EVENT_TEXT];
} srv_event;

/* A worker's series: its reports of training (loss, samples_per_second,
 * samples) and those with a test evaluation (accuracy, test_loss). */
typedef struct srv_worker_hist {
    uint32_t shard;
    int interval_reports;        /* it reports within epochs (dashboard.c) */
    srv_series train;
    srv_series eval;
} srv_worker_hist;

/* An embedding table's series, one sample a second with psd's: rows held,
 * memory, rows pulled and pushed per second. */
typedef struct srv_table_hist {
    char name[PS_NAME_MAX + 1];
    srv_series s;
} srv_table_hist;

typedef struct srv_history {
    srv_series psd;              /* psd's own numbers, one sample a second */
    srv_worker_hist *w[SRV_HISTORY_SHARDS]; /* NULL until the shard reports */
    srv_table_hist *tab[PS_TABLES_MAX]; /* by declaration order; NULL until sampled */
    srv_event ev[SRV_EVENTS_MAX];
    unsigned ev_first, ev_n;     /* the ring: oldest at ev_first */
    uint64_t events_dropped;
} srv_history;

/* The columns of srv_history.psd, in order. */
enum {
    SRV_H_PUSHES, SRV_H_PULLS, SRV_H_BYTES_IN, SRV_H_BYTES_OUT, SRV_H_LR, SRV_H_ROUND_P50, SRV_H_ROUND_P99,
    SRV_H_COLS
};

/* The columns of a table's series, in order. */
enum { SRV_HT_ROWS, SRV_HT_BYTES, SRV_HT_PULLED, SRV_HT_PUSHED, SRV_HT_COLS };

/* A new, empty history; NULL when out of memory. */
srv_history *srv_history_new(void);
void srv_history_free(srv_history *h);
/* The series of shard, allocated on first use; NULL for a shard past
 * SRV_HISTORY_SHARDS or when out of memory (the report is then not kept). */
srv_worker_hist *srv_history_worker(srv_history *h, uint32_t shard);
/* The series of table i (< PS_TABLES_MAX) called name, allocated on first
 * use; a table i of another name (the tables were dropped and declared
 * anew) starts a new series. NULL when out of memory. */
srv_table_hist *srv_history_table(srv_history *h, unsigned i, const char *name);
/* Appends an event (text is cut to fit), dropping the oldest when full. */
void srv_history_event(srv_history *h, double t, uint64_t version, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The q-quantile (0..1) of the observations counted in buckets cnt[0..n]:
 * bucket i < n holds those up to bounds[i] (ascending, the first from 0),
 * bucket n those past bounds[n-1]. Interpolated linearly inside the
 * bucket, as Prometheus's histogram_quantile does; a quantile in the last
 * bucket is bounds[n-1]. NaN when there are no observations. */
double srv_bucket_quantile(const double *bounds, unsigned n, const uint64_t *cnt, double q);

/* The formats of srv_history_write. */
enum { SRV_HFMT_JSON, SRV_HFMT_CSV, SRV_HFMT_TABLE };

/* Appends the whole history to out:
 *   JSON  {"points_max", "events_max", "events_dropped",
 *          "psd": SERIES, "workers": [{"shard", "train": SERIES, "eval": SERIES}],
 *          "tables": [{"name", "series": SERIES}],
 *          "events": [{"t", "version", "kind", "text"}]}
 *         where SERIES is {"stride", "t": [...], "version": [...], COLUMN: [...]},
 *         columns of equal length, a missing value null;
 *   CSV   one row per value: series,shard,t,version,column,value (shard
 *         empty for psd's series; a table's series is "table" with the
 *         table's name for shard, quoted as RFC 4180 says when it holds a
 *         comma or a double quote), then event rows: event,,t,version,kind,"text";
 *   TABLE the same rows in aligned columns for people.
 * Returns 0 or PS_ENOMEM. */
int srv_history_write(const srv_history *h, int fmt, ps_buf *out);

/* ---- JSON output (also for dashboard.c) ---------------------------------- */

/* Each appends to b and returns 0 or PS_ENOMEM. Raw text is common/json.h's
 * ps_json_raw, the one psctl uses too. */
static inline int srv_json_raw(ps_buf *b, const char *s)
{
    return ps_json_raw(b, s);
}
/* A string literal with JSON escapes; bytes past ASCII become "?" (the
 * texts psd writes are ASCII). */
int srv_json_str(ps_buf *b, const char *s);
/* A number (%.6g, or %.3f for `fixed`); null when it is not finite. */
int srv_json_num(ps_buf *b, double v);
int srv_json_fixed(ps_buf *b, double v);

#endif
