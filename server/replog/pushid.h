/* pushid.h - pushes applied once (pushid.c): for each client that names
 * itself in its hello ("cid"), the highest push number ("pid") psd has
 * applied, so that a push the client sends again after a lost connection
 * is answered without being applied twice (PROTOCOL.md 15). */
#ifndef SRV_REPLOG_PUSHID_H
#define SRV_REPLOG_PUSHID_H

#include "server/store/psd.h"

/* 1: client cid's push pid was applied already (pid is not above the
 * highest marked for cid); 2: it counts in the open bsp round
 * (srv_pushid_mark_round); 0: neither, or cid is 0 or not known. */
int srv_pushid_done(const psd *s, uint64_t cid, uint64_t pid);

/* Records that client cid's push pid was applied (after applying it; a
 * lower pid than the one recorded changes nothing). A new client past
 * SRV_PUSHIDS_MAX forgets the one that pushed longest ago. Out of memory,
 * nothing is recorded (said in the log): a resent push would be applied
 * again. Does nothing for cid or pid 0. */
void srv_pushid_mark(psd *s, uint64_t cid, uint64_t pid);

/* Records that client cid's push pid counts in the open bsp round: it is
 * done (srv_pushid_done) from now on, and recorded as applied when the
 * round closes (srv_pushid_round_closed), so that a checkpoint or a
 * follower's snapshot of the model before the round never holds it. Out
 * of memory, it is recorded at once (logged). */
void srv_pushid_mark_round(psd *s, uint64_t cid, uint64_t pid);

/* The open round closed (its update is in the model; no update runs off
 * the loop): its pushes are recorded as applied, and go into the
 * replication log after the round's values. */
void srv_pushid_round_closed(psd *s);

/* The open round's pushes forgotten: the round was dropped (a reset, a
 * leader stepping down), so a push sent again is applied then. */
void srv_pushid_round_drop(psd *s);

/* For the replication layer, to ship and restore the record: *it starts
 * at 0; each call gives the next (cid, highest pid) in *cid, *pid and
 * returns 1, or 0 when there are no more. The record must not change
 * between the calls of one walk. */
int srv_pushid_next(const psd *s, uint32_t *it, uint64_t *cid, uint64_t *pid);

/* Sets client cid's highest applied pid to pid exactly (a leader's record
 * restored on a follower; forgetting the oldest as srv_pushid_mark does).
 * 0, or PS_ENOMEM, or PS_EINVAL for cid 0 or pid 0. */
int srv_pushid_set(psd *s, uint64_t cid, uint64_t pid);

/* The clients recorded (at most SRV_PUSHIDS_MAX). */
uint32_t srv_pushid_count(const psd *s);

/* Frees the record (psd's end). */
void srv_pushid_free(psd *s);

#endif
