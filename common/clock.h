/* clock.h - the two clocks the threads of psd and libpsclient read: a
 * monotonic one for how long something took or how long is left, and a
 * deadline ms from now on the clock pthread_cond_timedwait measures
 * (CLOCK_REALTIME, its default). */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC (from an arbitrary start). */
int64_t ps_mono_ms(void);

/* The CLOCK_REALTIME moment ms from now, for pthread_cond_timedwait. */
struct timespec ps_deadline_ms(uint64_t ms);

#endif
