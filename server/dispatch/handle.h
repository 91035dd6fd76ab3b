/* handle.h - the dispatch layer's handlers (handle.c): one per message. */
#ifndef SRV_HANDLE_H
#define SRV_HANDLE_H

#include "server/store/psd.h"

/* handle.c */
/* Handles one decoded message from c. */
void srv_handle(srv_conn *c, ps_msg *m);
/* The update of the push psd.push_wait waits for is installed: the
 * policy finishes it (version, clock, round) and the push is answered.
 * Returns the pushing connection (closed meanwhile, maybe: the caller
 * frees it then), and sets *wake when parked pulls may now be answered. */
srv_conn *srv_push_finished(psd *s, const srv_update_tag *tag, int *wake);

#endif
