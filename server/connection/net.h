/* net.h - the connection layer: psd's sockets, frames (net.c), queued writes (write.c), closing (close.c);
 * replies' tensors converted for the wire in encode.c. */
#ifndef SRV_NET_H
#define SRV_NET_H

#include "server/store/psd.h"

/* net.c: the connection layer */
/* Registers net.c's functions in s->io and its done callback with the
 * update engine; then listens. */
int srv_listen(psd *s);
void srv_stop(psd *s);
/* table_apply = hogwild: starts the apply threads (s->tapply), their
 * finished pushes answered by net.c; 0, or PS_EINVAL with err (a no-op
 * for ordered). At start, after the settings. */
int srv_net_tapply_start(psd *s, char *err, size_t errlen);
/* Stops them once the loop has ended: every push they hold is applied and
 * handed back (its connection freed if it closed meanwhile). */
void srv_net_tapply_stop(psd *s);
void srv_conn_close(srv_conn *c);
/* Closes every worker's connection, each with reason why (their pushes not
 * answered yet they send again where they go next): a leader that steps
 * down or hands its part back. Returns how many. */
uint32_t srv_conn_close_workers(psd *s, const char *why);
/* Closes the lingering connections whose SRV_LINGER_MS have passed (the tick). */
void srv_linger_tick(psd *s, uint64_t now);
/* For the handler of a frame that ends the bytes read so far: hands the
 * receive buffer holding it to the caller (*out) and gives the connection
 * repl instead (mem NULL: it allocates when it reads next). data is where
 * the handler will read the frame's contents (it must lie in the buffer).
 * Returns 0, or -1 when more bytes follow the frame in the buffer or data
 * lies elsewhere (nothing changes). Reached through s->io->give_rbuf. */
int srv_conn_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out);
/* Frees the connection layer's pools in s->out: spare write requests and
 * converted reply tensors (at exit). */
void srv_net_free_spare(psd *s);

#endif
