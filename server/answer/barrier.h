/* barrier.h - BARRIERs (barrier.c). */
#ifndef SRV_ANSWER_BARRIER_H
#define SRV_ANSWER_BARRIER_H

#include "server/store/psd.h"

/* BARRIER (barrier.c): worker c has reached model version ver and waits,
 * in BSP, until every worker taking part in barriers has (ver 0: c stops
 * taking part); c then stands at ver, its latest. Answered now or parked
 * (0), or refused with err: a second one while one waits (PS_ESTATE), a
 * version above the model's plus one (PS_EBAD_FIELD). */
int srv_barrier(srv_conn *c, uint64_t id, uint64_t ver, char *err, size_t errlen);
/* What c's parked barrier waits for ("barrier at version 12 waits for
 * shard 2/3 (at version 11)"), for HEARTBEAT's wait notice; 0 when none
 * is parked or it waits for nobody. */
int srv_barrier_describe(const srv_conn *c, char *out, size_t len);
/* Answers the parked barriers every worker taking part has reached. */
void srv_barrier_release(psd *s);
/* c stops taking part (its worker left or it closes): its own parked
 * barrier is dropped, the others' may go. */
void srv_barrier_leave(srv_conn *c);

#endif
