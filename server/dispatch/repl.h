/* repl.h - a leader's side of replication (repl.c): the ADMIN commands a
 * follower sends, and promote. */
#ifndef SRV_DISPATCH_REPL_H
#define SRV_DISPATCH_REPL_H

#include "server/store/psd.h"

typedef struct srv_repl_command {
    const char *name;
    void (*run)(srv_conn *c, ps_msg *m);
} srv_repl_command;

/* The commands, ended by a NULL name; admin.c dispatches them (none only reads). */
extern const srv_repl_command srv_repl_commands[];

/* New records: the followers' waiting fetches get them (connection/write.c,
 * before a worker's reply). */
void srv_admin_repl_wake(psd *s);
/* psd's tick: fetches waiting past their time are answered, followers
 * silent past max_replica_lag leave the in-sync set. */
void srv_admin_repl_tick(psd *s);

#endif
