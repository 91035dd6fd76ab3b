/* follow.h - a follower's side of replication (follow.c). */
#ifndef SRV_CONNECTION_FOLLOW_H
#define SRV_CONNECTION_FOLLOW_H

#include <stddef.h>

#include "server/store/psd.h"

/* With replica_of set: starts following that leader (psd.follow, and
 * psd.promote for psctl promote). After srv_listen (it advertises the bound
 * port). 0, or a negative PS_E* code with err. */
int srv_follow_start(psd *s, char *err, size_t errlen);
/* Follows leader (coord/: the one the coordinator's key names), after
 * dropping the leader this psd followed, if any. 0, or a negative PS_E*
 * code with err. */
int srv_follow_start_to(psd *s, const char *leader, char *err, size_t errlen);
/* psd.step_down: this leader no longer leads; its workers' connections
 * close with why, its replication log goes, and it follows leader.
 * coord/ calls it when another psd holds the part's key. */
int srv_follow_step_down(psd *s, const char *leader, const char *why, char *err, size_t errlen);
/* Stops following (its thread and its queue go; psd.follow NULL). */
void srv_follow_drop(psd *s);
/* srv_now_ms() when the leader last answered a fetch (0: not following). */
uint64_t srv_follow_contact_ms(const psd *s);
/* Stops the thread (at shutdown). */
void srv_follow_stop(psd *s);
/* Frees what is left (at exit, after the loop). */
void srv_follow_free(psd *s);

#endif
