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
/* The same for a PARAMS whose m->ndata float32 words of data (4 x ndata
 * bytes, m->dt float32) are the bytes of the pieces pc[0..npc), sent in
 * that order; each piece's owner keeps a reference until the write is
 * done. */
void srv_send_pieces(srv_conn *c, const ps_msg *m, const srv_piece *pc, size_t npc);
/* Queues an ERROR reply for request id; fatal closes after it is sent. */
void srv_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Answers request id with an OK carrying the model's version. */
void srv_send_ok(srv_conn *c, uint64_t id);
/* The same with a text for people (an ADMIN command's answer). */
void srv_send_ok_text(srv_conn *c, uint64_t id, const char *text);
/* The open connection numbered cid (a request that waits for its answer
 * keeps its connection's number, not a pointer); NULL when it has closed
 * or is closing. */
srv_conn *srv_conn_by_cid(psd *s, uint64_t cid);

/* the answer layer's other files */
#include "server/answer/barrier.h"
#include "server/answer/pull.h"

/* Bytes [0, len) as a PARAMS (id) of len/4 (rounded up) float32 words in
 * as many blocks as they take, `ver` v (the replication stream, a move of
 * parts); fill, when given, writes them (p NULL), else they are copied
 * from p. An ERROR (IO for a fill that failed, NOMEM) otherwise. */
void srv_send_bytes(srv_conn *c, uint64_t id, uint64_t v, const uint8_t *p, size_t len,
                    int (*fill)(void *, uint8_t *, size_t), void *arg);

/* An ADMIN request's argument i as text into buf (len bytes, cut; "" when
 * absent), and as a decimal number (0 when absent or not one). */
void srv_arg_str(const ps_msg *m, uint32_t i, char *buf, size_t len);
uint64_t srv_arg_u64(const ps_msg *m, uint32_t i);

#endif
