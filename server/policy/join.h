/* join.h - the wait for workers that have not joined (join.c): in bsp and
 * ssp a round, or the slowest clock, waits for every shard 0..M-1, so a
 * shard that never joins would hold the job for ever. psd says whom it
 * waits for (a log line every SRV_JOIN_WARN_MS, psctl status, /api/job)
 * and after join_timeout goes on without the missing shards or stops the
 * job (join_timeout_action): srv_join_tick (session.h, hello.c), which
 * owns psd.join_since_ms and psd.join_warned_ms. */
#ifndef SRV_JOIN_H
#define SRV_JOIN_H

#include "server/store/psd.h"

#define SRV_JOIN_WARN_MS 30000       /* between two "waits for" log lines */
#define SRV_JOIN_WARN_FIRST_MS 5000  /* the first, after this much waiting (or half join_timeout) */

/* The shards psd waits for: in bsp and ssp, while a worker is connected,
 * the shards below M that no worker has joined. Fills out with the first
 * max of them, in order, and returns how many there are (may be more than
 * max). 0 in asgd, and while no worker is connected. */
uint32_t srv_join_missing(const psd *s, uint32_t *out, uint32_t max);

/* "shard 2/3" or "shards 1/4, 2/4" (and "and N more" past a few): the
 * shards srv_join_missing returns, for a message. */
void srv_join_describe(const psd *s, char *buf, size_t len);

/* What a pull of worker w (NULL: an admin) that psd has parked waits
 * for, one line for people ("round 3 waits for shard 2/3 (never joined)",
 * "round 3 waits for shard 1/3 (has not pushed)", "clock 7 waits for shard
 * 0/2 (more than 2 clocks behind)", "psd is paused (psctl resume)", "the
 * initial values ..."), written to buf (truncated to len). Returns 1, or 0
 * with buf "" when psd has nothing to say (asgd with the model ready: its
 * pulls do not wait). Reads only (the policy's unpushed hook). */
int srv_wait_describe(psd *s, const srv_worker *w, char *buf, size_t len);

/* Milliseconds psd has waited for the missing shards (0: it waits for none). */
uint64_t srv_join_waited(const psd *s, uint64_t now);

/* Workers connected now. */
uint32_t srv_join_present(const psd *s);

#endif
