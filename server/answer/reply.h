/* reply.h - the answer layer: replies through the connection layer's
 * registered functions (reply.c) and pulls, parked or answered (pull.c). */
#ifndef SRV_REPLY_H
#define SRV_REPLY_H

#include "server/store/psd.h"

/* reply.c: the replies of the dispatch layer, through s->io */
/* Queues one reply. When m has tensor data (PARAMS), the floats
 * [m->off, m->off + m->ndata) are sent from the blocks blk (the model's or a
 * snapshot's), which keep a reference until the write is done: nothing is
 * copied. blk is NULL for other messages. On failure the connection is
 * closed. */
void srv_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk);
/* Queues an ERROR reply for request id; fatal closes after it is sent. */
void srv_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Answers request id with an OK carrying the model's version. */
void srv_send_ok(srv_conn *c, uint64_t id);

/* pull.c: pulls and parked pulls */
/* A pull of [off, off+len) for version >= min, answered in element type
 * rdt: answered now or parked (0), or refused: a negative PS_E* code with
 * err filled and nothing sent (the dispatch layer sends the ERROR). */
int srv_pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt, char *err,
             size_t errlen);
/* 0 when psd may answer in element type rdt; else PS_EUNSUPPORTED with err. */
int srv_pull_check_rdt(const psd *s, uint32_t rdt, char *err, size_t errlen);
/* Answers every parked pull whose version is now available. */
void srv_answer_parked(psd *s);
/* Answers c's parked pulls that can be answered. */
void srv_conn_answer_parked(srv_conn *c);
/* Drops c's parked pulls and pinned snapshot (it goes away). */
void srv_pulls_drop(srv_conn *c);
/* Frees the parked-pull entries kept for reuse (at exit). */
void srv_parked_free_spare(void);

/* BARRIER (barrier.c): worker c has reached model version ver and waits,
 * in BSP, until every worker taking part in barriers has (ver 0: c stops
 * taking part); answered now or parked (0), or refused with err (a second
 * one while one waits). */
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
