/* write.h - queued writes (write.c), inside the connection layer: what
 * net.c registers in psd.io. */
#ifndef SRV_CONNECTION_WRITE_H
#define SRV_CONNECTION_WRITE_H

#include "server/store/psd.h"

/* psd.io->send: queues one reply (see srv_send, psd.h). */
void srv_net_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk);
void srv_net_send_pieces(srv_conn *c, const ps_msg *m, const srv_piece *pc, size_t npc);
/* psd.io->send_error: logs and counts the error, queues the ERROR reply
 * and, when fatal, closes c once it is written. */
void srv_net_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text);

/* psd.repl_release: sends the replies held for the followers that they
 * now hold. */
void srv_net_repl_release(psd *s);
#endif
