/* handle_table.h - the dispatch layer's handlers of the table messages
 * (handle_table.c; PROTOCOL.md 13). */
#ifndef SRV_HANDLE_TABLE_H
#define SRV_HANDLE_TABLE_H

#include "server/store/psd.h"

/* Handles a decoded TABLE, TPULL, TPUSH or TPUSHPULL from c, which
 * srv_handle has let through (the handshake is done; a worker's type from
 * a worker, or a reader declaring a table psd has): checks the rest
 * (table, row dimension, keys, base, finiteness, the mode) and declares,
 * answers, applies or parks; queues exactly one reply, now or (a parked
 * pull) later. The handler of the four types (handle.h). Returns 0. */
int srv_handle_table(srv_conn *c, ps_msg *m);

struct srv_tapply_tag;
struct srv_tapply_result;
/* A table push the apply threads took (table_apply = hogwild) is applied:
 * answers it (OK, the rows of a TPUSHPULL's pull, or the error of rows
 * refused) unless its connection is closing, and marks the connection
 * free to read on (tapply_busy 0); the caller resumes its frames. */
void srv_tpush_finished(const struct srv_tapply_tag *tag, const struct srv_tapply_result *r);

#endif
