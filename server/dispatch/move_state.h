/* move_state.h - what a move of parts changes on this psd (move_state.c):
 * for the commands (move_cmd.c), the destination's fetching
 * (connection/move_fetch.c) and a follower's replay of its leader's log
 * (psd.move_apply). */
#ifndef SRV_DISPATCH_MOVE_STATE_H
#define SRV_DISPATCH_MOVE_STATE_H

#include "server/store/psd.h"

/* The bits from..to-1 (parts as bits of a uint64_t). */
static inline uint64_t srv_move_bits(uint32_t from, uint32_t to)
{
    uint64_t b = 0;
    for (uint32_t i = from; i < to && i < 64; i++)
        b |= 1ull << i;
    return b;
}

/* The old and new lists into q: q's old map in addrs/old_n, its new one
 * in new_addrs/new_n. 0, or PS_EBAD_FIELD with err. */
int srv_move_parse_lists(srv_parts *q, const char *oldl, const char *newl, char *err, size_t errlen);
/* A source starts marking its moving rows: growing, every old part gives
 * rows; shrinking, those that go. 0 or a PS_E* code. */
int srv_move_mark_begin(psd *s, const srv_parts *q);
/* The move to map epoch begins here (checked, marking begun): q holds the
 * lists (oldl and newl as text), this psd's index in each and the dense
 * parts; switched the destinations a restarted source handed its rows to
 * already. A leader's destination starts fetching; a follower does not. */
void srv_move_begin(psd *s, const srv_parts *q, uint64_t epoch, uint64_t rate, uint64_t switched, const char *oldl,
                    const char *newl);
/* A source hands destination d its rows: d's keys are refused from now on. */
void srv_move_switch(psd *s, int d);
/* The new map is the map: the rows that left go, a few at a time on a
 * leader (srv_move_drop_more), at its log's pace on a follower. */
void srv_move_end(psd *s);
/* The move is called off (before any handover): the map stays. */
void srv_move_call_off(psd *s);

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
/* A leader steps down to follow: its fetching stops and the move under
 * way is forgotten (its leader's snapshot brings the state). */
void srv_move_forget(psd *s);

#endif
