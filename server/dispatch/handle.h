/* handle.h - the dispatch layer's handlers (handle.c): one per message. */
#ifndef SRV_HANDLE_H
#define SRV_HANDLE_H

#include "server/store/psd.h"

/* handle.c */
/* srv_handle's answer to the connection layer: read nothing more from c
 * for now (a push whose update runs off the loop: its gradient lies in c's
 * receive buffer until srv_push_finished; a BYE: c closes once its OK is
 * written). The connection layer stops reading; dispatch never touches
 * the socket. */
#define SRV_STOP_READING 1

/* Handles one decoded message from c. Returns 0 or SRV_STOP_READING. */
int srv_handle(srv_conn *c, ps_msg *m);
/* The update of the push psd.push_wait waits for is installed: the
 * policy finishes it (version, clock, round) and the push is answered.
 * Returns the pushing connection (closed meanwhile, maybe: the caller
 * frees it then), and sets *wake when parked pulls may now be answered. */
srv_conn *srv_push_finished(psd *s, const srv_update_tag *tag, int *wake);

#endif
