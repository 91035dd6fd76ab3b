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

/* A destination's fetching brought this (connection/move_fetch.c): 'D' a
 * session with source src begins, 'R' rows (b[0..len), an answer of
 * move_fetch), 'P' its pass is over, 'H' it handed over (its keys waited
 * pause_ms). Applied, and logged for the followers. 0, or the code of rows
 * that did not apply (the move records why). */
int srv_move_take(psd *s, int kind, uint32_t src, const uint8_t *b, size_t len, uint64_t pause_ms);
/* Drops the rows the move's end took away for about budget_us (all of
 * them with UINT64_MAX), logged for the followers; 1 once all are gone. */
int srv_move_drop_more(psd *s, uint64_t budget_us);
/* A follower applies a move's record of its leader's log (psd.move_apply). */
int srv_move_replay(psd *s, const uint8_t *r, size_t len, char *err, size_t errlen);
/* A follower promoted: a move under way goes on from here (a destination
 * fetches again from the parts that did not hand over; the rows the
 * move's end took away go on being dropped). */
void srv_move_resume(psd *s);
/* A leader steps down to follow: its fetching and dropping stop and the
 * move under way is forgotten (its leader's snapshot brings the state). */
void srv_move_forget(psd *s);

#endif
