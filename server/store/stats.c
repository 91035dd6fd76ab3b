/* stats.c - psd's clock and its histograms: the small things every layer
 * of psd counts with, at the bottom so that any file may call them. */
#include <string.h>

#include "server/store/stats.h"
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

