/* parts.h - the job's part map and a move of parts under way (parts.c;
 * PROTOCOL.md 18): which part owns a table key now, so that a table
 * request for a key that moved is refused (MOVED) or waits (NOT_READY)
 * with nothing changed. The rows themselves move through tables/
 * (table_move.c), the move's commands are dispatch/move.c's, the fetching
 * of rows connection/move.c's. */
#ifndef SRV_STORE_PARTS_H
#define SRV_STORE_PARTS_H

#include "server/store/psd.h"

/* What a table request may do with one key. */
enum srv_key_verdict {
    SRV_KEY_OWN = 0,    /* this psd holds it: apply */
    SRV_KEY_MOVED,      /* it lives on another part of the map this psd serves under: MOVED */
    SRV_KEY_WAIT,       /* it is being handed over to this psd, or from it: NOT_READY */
    SRV_KEY_RANGE,      /* no map: not this psd's part (the old RANGE check decides) */
};

/* The verdict for key of a table declared [part, nparts]. */
int srv_parts_key(const srv_parts *p, uint32_t part, uint32_t nparts, uint64_t key);

/* Whether psd holds a map (a move of parts reached it). */
static inline int srv_parts_known(const srv_parts *p)
{
    return p->epoch > 0 || p->moving;
}

/* The map this psd serves under, for WELCOME and ERROR: the new one once
 * it is a part the move added or every destination of its rows has taken
 * them over, or (moved: for an ERROR MOVED) as soon as a move is under way,
 * else the one it held before; fills m->pmap (the addresses point into p)
 * and sets PS_F2_PMAP. Nothing when that map is epoch 0 (the workers'
 * own lists). */
void srv_parts_put(const srv_parts *p, ps_msg *m, int moved);

/* Whether the map psd serves under says it holds no dense values (its
 * index is past the map's `dense`): a worker's hello without a layout is
 * then taken. */
int srv_parts_table_only(const srv_parts *p);

/* Whether a TABLE declared as part part of nparts names this psd's part
 * in the map it holds or in the one a move goes to. */
int srv_parts_declared(const srv_parts *p, uint32_t part, uint32_t nparts);

/* The index of addr (HOST:PORT) in the new map, or -1. */
int srv_parts_new_index(const srv_parts *p, const char *addr);

/* The map a checkpoint's header holds (report/checkpoint.c): packed as
 * [epoch, dense, self, [addresses]]; read back, 0, or -1 when it is not
 * one (p is then unchanged). */
void srv_parts_pack(msgpack_packer *pk, const srv_parts *p);
int srv_parts_restore(srv_parts *p, const msgpack_object *o);

/* Parses "A,B,C" into the new map's addresses; 0 or -1 (err says why). */
int srv_parts_parse(srv_parts *p, const char *list, char *err, size_t errlen);

#endif
