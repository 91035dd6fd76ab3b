/* coord.h - leadership of a part through a coordinator, etcd (coord.c;
 * issue 44, docs/fault-tolerance.md "Elections through etcd"). */
#ifndef SRV_COORD_COORD_H
#define SRV_COORD_COORD_H

#include <stddef.h>

#include "server/store/psd.h"

/* With `coordinator` set: asks etcd who leads this part, then leads (holds
 * the part's lease, renews it, publishes its position and in-sync
 * followers) or follows the leader the key names, and takes the key when
 * the leader's lease lapses. Until then this psd acknowledges no push
 * (psd.coord.fence_ms). After srv_listen and srv_follow_start. 0, or a
 * negative PS_E* code with err. Without a coordinator it does nothing. */
int srv_coord_start(psd *s, char *err, size_t errlen);
/* On SIGTERM or SIGINT (why names it): a leader with a follower in sync
 * hands its part back (handback.c): it closes its workers' connections and
 * refuses their hellos, lets its followers fetch its whole log, deletes
 * the part's key naming its successor, revokes its lease, then calls done
 * (from the loop), which stops psd. 1 when it started; 0 when there is
 * nothing to hand back (no coordinator, not leading, no follower in sync):
 * psd stops as without one. */
int srv_coord_hand_back(psd *s, const char *why, void (*done)(psd *s));
/* Stops talking to etcd (at shutdown; the lease is left to lapse). */
void srv_coord_stop(psd *s);
/* Frees what is left (at exit, after the loop). */
void srv_coord_free(psd *s);

#endif
