/* stats.h - psd's clock and histograms (stats.c); srv_hist and srv_stats
 * are in psd.h with the state they are part of. */
#ifndef SRV_RECORD_STATS_H
#define SRV_RECORD_STATS_H

#include <stddef.h>

#include "server/store/psd.h"

/* psd's clock: milliseconds of a monotonic clock. */
uint64_t srv_now_ms(void);

/* psd.stats (srv_stats, psd.h) is written by stats.c only: every other
 * file counts through these and reads the fields (the layer check fails
 * on a write elsewhere). */
/* The histograms' buckets (at start). */
void srv_stats_init(psd *s);
/* Adds n to the uint64_t counter `field` of srv_stats. */
#define SRV_COUNT(s, field, n) srv_stats_add((s), offsetof(srv_stats, field), (uint64_t)(n))
void srv_stats_add(psd *s, size_t field, uint64_t n);
/* One value into a histogram of psd.stats. */
#define SRV_HIST_STALENESS 0     /* versions between a push's base and the model */
#define SRV_HIST_ROUND_SECONDS 1 /* a BSP round's duration */
void srv_stats_observe(psd *s, int which, double v);
/* An ERROR reply of code (negative PS_E*) sent. */
void srv_stats_rejected(psd *s, int code);
/* The model got its initial values at init_ms (0: it has none). */
void srv_stats_model_at(psd *s, uint64_t init_ms);
/* A checkpoint of version and of the tables at tables_stamp written (err
 * NULL) or failed (err: why). */
void srv_stats_checkpoint(psd *s, uint64_t version, uint64_t tables_stamp, const char *err);
/* The model and the tables (at tables_stamp) came from the checkpoint of
 * version, at start. */
void srv_stats_checkpoint_loaded(psd *s, uint64_t version, uint64_t tables_stamp);
/* A reset: no model, no checkpoint of it yet. */
void srv_stats_model_reset(psd *s);
/* The push and pull rates, every second (the tick). */
void srv_stats_rates(psd *s);

#endif
