/* stats.h - psd's clock and histograms (stats.c); srv_hist and srv_stats
 * are in psd.h with the state they are part of. */
#ifndef SRV_STORE_STATS_H
#define SRV_STORE_STATS_H

#include "server/store/psd.h"

/* psd's clock: milliseconds of a monotonic clock. */
uint64_t srv_now_ms(void);

#endif
