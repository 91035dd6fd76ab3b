/* bsp_tround.h - a BSP round's table pushes, kept until the round closes
 * (PROTOCOL.md 13.5). The BSP policy owns one (in its state) and decides
 * what it keeps, what it drops and when the round applies; this file keeps
 * the rows and sums them in shard order, so the update does not depend on
 * the order the pushes arrived in.
 *
 * Each TPUSH of the round is kept as it came (its keys and rows, copied).
 * A shard may push a key of a table once per round. Applying sums, for each
 * table and each key, the rows of the shards taking part in ascending shard
 * order (0 + g_a + g_b + ..., a < b), and hands each table's sums to the row
 * store with the round's scale (1 / pushes), one optimizer step per key.
 * The sums are float32; a table where one of them overflows (two pushes
 * of -3.4e38) has its sums made again in double, in the same order, each
 * times the scale before it is rounded to float32 (and handed with scale
 * 1), so a finite mean applies. */
#ifndef SRV_BSP_TROUND_H
#define SRV_BSP_TROUND_H

#include <stddef.h>
#include <stdint.h>

#include "server/tables/table.h"

typedef struct srv_tround_push srv_tround_push;

typedef struct srv_tround {
    srv_tround_push *p;     /* the kept pushes, in arrival order */
    size_t np, pcap;
    uint64_t *set;          /* (table, shard, key) already kept: 2 words an entry
                             * (key; table << 32 | shard, + 1 so 0 is empty) */
    size_t set_cap, set_n;  /* entries */
    uint64_t bytes;         /* keys and rows kept */
} srv_tround;

/* Keeps shard's push of the n keys (a "keys" bin) and their rows g (n x
 * dim floats) for table ti. Returns 0, PS_EDUPLICATE (the shard pushed one
 * of these keys of this table earlier in the round; *dup_key names it;
 * nothing kept) or PS_ENOMEM (nothing kept). The caller checked the rest
 * (distinct keys, finite rows, the dimension). */
int srv_tround_keep(srv_tround *r, uint32_t shard, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g,
                    uint32_t dim, uint64_t *dup_key);

/* Drops what shard kept (it left before completing its step). */
void srv_tround_drop(srv_tround *r, uint32_t shard);

/* Applies the round to ts: for every table, the sum over the shards in
 * shards[0..nshards) (ascending) of their rows, key by key, times scale
 * (in double when a float32 sum would overflow), through srv_tables_push. A table whose update is refused (LIMIT,
 * NONFINITE, NOMEM) is left as it was; its error goes to err (the first
 * one) and *failed counts such tables. Then forgets everything kept.
 * Returns 0, or PS_ENOMEM when the sums could not be made (nothing
 * applied, everything kept: the caller may try again). */
int srv_tround_apply(srv_tround *r, srv_tables *ts, const uint32_t *shards, uint32_t nshards, double scale,
                     uint32_t *failed, char *err, size_t errlen);

/* Forgets everything kept (the round closed without it). */
void srv_tround_clear(srv_tround *r);
/* Frees r's memory. */
void srv_tround_free(srv_tround *r);

#endif
