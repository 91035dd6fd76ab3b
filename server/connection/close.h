/* close.h - closing connections (close.c), inside the connection layer;
 * srv_conn_close and srv_linger_tick are in net.h for main.c. */
#ifndef SRV_CONNECTION_CLOSE_H
#define SRV_CONNECTION_CLOSE_H

#include "server/store/psd.h"

/* Frees a connection whose handle is closed. */
void srv_conn_free(srv_conn *c);
/* The close callback of a connection's handle: unlinks it and frees it
 * (later, when the update running off the loop still reads its receive
 * buffer). */
void srv_conn_on_close(uv_handle_t *h);

#endif
