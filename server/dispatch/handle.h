/* handle.h - the dispatch layer's entry (handle.c) and its handlers: one
 * per message type psd receives. */
#ifndef SRV_HANDLE_H
#define SRV_HANDLE_H

#include "server/store/psd.h"

/* handle.c; srv_push_finished: handle_dense.c */
/* srv_handle's answer to the connection layer: read nothing more from c
 * for now (a push whose update runs off the loop: its gradient lies in c's
 * receive buffer until srv_push_finished; a BYE: c closes once its OK is
 * written). The connection layer stops reading; dispatch never touches
 * the socket. */
#define SRV_STOP_READING 1

/* Handles one decoded message from c: checks what proto/messages.def
 * says of its type (the handshake is done; the sender's role may send it;
 * psd receives it) and calls its handler. Returns 0 or SRV_STOP_READING. */
int srv_handle(srv_conn *c, ps_msg *m);

/* A message's handler: srv_on_<name> for each type psd receives (dir C, W
 * or A in proto/messages.def), declared here from that file; a new type
 * psd receives that has none is an undefined reference at link time. It
 * runs once srv_handle's checks passed, checks the rest, and queues
 * exactly one reply (now, or later for a parked pull). Returns 0 or
 * SRV_STOP_READING. */
typedef int srv_handler(srv_conn *c, ps_msg *m);
#define SRV_HANDLER_C(name) srv_on_##name
#define SRV_HANDLER_W(name) srv_on_##name
#define SRV_HANDLER_A(name) srv_on_##name
#define SRV_HANDLER_S(name) NULL
/* the table messages share one handler, srv_handle_table (handle_table.c) */
#define srv_on_table srv_handle_table
#define srv_on_tpull srv_handle_table
#define srv_on_tpush srv_handle_table
#define srv_on_tpushpull srv_handle_table
#define SRV_DECLARE_C(name) srv_handler srv_on_##name;
#define SRV_DECLARE_W(name) srv_handler srv_on_##name;
#define SRV_DECLARE_A(name) srv_handler srv_on_##name;
#define SRV_DECLARE_S(name)
#define PS_MSG(NAME, name, t, dir, required) SRV_DECLARE_##dir(name)
#include "proto/messages.def"
#undef PS_MSG
/* The update of the push psd.push_wait waits for is installed: the
 * policy finishes it (version, clock, round) and the push is answered.
 * Returns the pushing connection (closed meanwhile, maybe: the caller
 * frees it then), and sets *wake when parked pulls may now be answered. */
srv_conn *srv_push_finished(psd *s, const srv_update_tag *tag, int *wake);

#endif
