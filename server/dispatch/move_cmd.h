/* move_cmd.h - a move of parts (move_cmd.c): the ADMIN commands psctl and
 * a destination send (PROTOCOL.md 18). */
#ifndef SRV_DISPATCH_MOVE_CMD_H
#define SRV_DISPATCH_MOVE_CMD_H

#include "server/store/psd.h"

typedef struct srv_move_command {
    const char *name;
    void (*run)(srv_conn *c, ps_msg *m);
} srv_move_command;

/* The commands, ended by a NULL name; admin.c dispatches them (none only reads). */
extern const srv_move_command srv_move_commands[];

#endif
