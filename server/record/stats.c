/* stats.c - psd's clock and its histograms, and psd.stats, the counters
 * every layer counts into: written here only, through the functions of
 * stats.h, at the bottom so that any file may call them. */
#include <assert.h>
#include <stddef.h>
#include <string.h>

#include "server/record/stats.h"
#include "server/store/psd.h"

uint64_t srv_now_ms(void)
{
    return uv_hrtime() / 1000000;
}

void srv_hist_init(srv_hist *h, const double *bounds, unsigned n)
{
    memset(h, 0, sizeof *h);
    h->n = n > SRV_HIST_MAX ? SRV_HIST_MAX : n;
    memcpy(h->bounds, bounds, h->n * sizeof *bounds);
}

void srv_hist_observe(srv_hist *h, double v)
{
    unsigned i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->total++;
    h->sum += v;
}


/* ---- psd.stats: written here only (stats.h) ------------------------------ */

void srv_stats_init(psd *s)
{
    static const double staleness_bounds[] = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
    static const double round_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    srv_hist_init(&s->stats.staleness, staleness_bounds, sizeof staleness_bounds / sizeof staleness_bounds[0]);
    srv_hist_init(&s->stats.round_seconds, round_bounds, sizeof round_bounds / sizeof round_bounds[0]);
}

void srv_stats_add(psd *s, size_t field, uint64_t n)
{
    assert(field % sizeof(uint64_t) == 0 && field + sizeof(uint64_t) <= offsetof(srv_stats, push_rate));
    uint64_t v;
    memcpy(&v, (char *)&s->stats + field, sizeof v);
    v += n;
    memcpy((char *)&s->stats + field, &v, sizeof v);
}

void srv_stats_observe(psd *s, int which, double v)
{
    srv_hist_observe(which == SRV_HIST_STALENESS ? &s->stats.staleness : &s->stats.round_seconds, v);
}

void srv_stats_rejected(psd *s, int code)
{
    uint64_t idx = (uint64_t)(-(int64_t)code); /* a positive code counts nowhere */
    if (idx < sizeof s->stats.rejected / sizeof s->stats.rejected[0])
        s->stats.rejected[idx]++;
}

void srv_stats_model_at(psd *s, uint64_t init_ms)
{
    s->stats.init_ms = init_ms;
}

void srv_stats_checkpoint(psd *s, uint64_t version, uint64_t tables_stamp, const char *err)
{
    if (!err) {
        s->stats.checkpoints++;
        s->stats.checkpoint_ms = srv_now_ms();
        s->stats.checkpoint_version = version;
        s->stats.checkpoint_tables_stamp = tables_stamp;
        s->stats.checkpoint_error[0] = '\0';
        return;
    }
    s->stats.checkpoint_failures++;
    size_t n = strnlen(err, sizeof s->stats.checkpoint_error - 1); /* cut, for the ADMIN reply */
    memcpy(s->stats.checkpoint_error, err, n);
    s->stats.checkpoint_error[n] = '\0';
}

void srv_stats_checkpoint_loaded(psd *s, uint64_t version, uint64_t tables_stamp)
{
    s->stats.checkpoint_ms = srv_now_ms();
    s->stats.checkpoint_version = version;
    s->stats.checkpoint_tables_stamp = tables_stamp;
}

void srv_stats_model_reset(psd *s)
{
    s->stats.init_ms = 0;
    s->stats.checkpoint_ms = 0; /* the new model's first checkpoint is written */
    s->stats.checkpoint_version = 0;
}

void srv_stats_rates(psd *s)
{
    s->stats.push_rate = (double)(s->stats.pushes - s->stats.last_pushes);
    s->stats.pull_rate = (double)(s->stats.pulls - s->stats.last_pulls);
    s->stats.last_pushes = s->stats.pushes;
    s->stats.last_pulls = s->stats.pulls;
}
