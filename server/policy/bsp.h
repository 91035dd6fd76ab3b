/* bsp.h - the bsp policy's parts (bsp.c, bsp_kept.c, bsp_pieces.c) and
 * the state they share: the round (srv_bsp_state, in psd.policy_state in
 * bsp mode) and each shard's gradient kept for it (srv_bsp_shard). Private
 * to the policy layer: the other layers see BSP through policy.h.
 *   bsp.c         the round: who it waits for, closing it, the hooks;
 *   bsp_kept.c    a shard's gradient kept until its round closes (slot,
 *                 blocks kept in their receive buffers, the ranges pushed)
 *                 and the list of sources a round's mean sums;
 *   bsp_pieces.c  a round that closes piece by piece (bsp_piece).
 * bsp.c calls the other two, bsp_pieces.c calls bsp_kept.c. */
#ifndef SRV_POLICY_BSP_H
#define SRV_POLICY_BSP_H

#include "server/policy/policy.h"
#include "server/policy/bsp_tround.h"

/* A shard's part of the round (shard-order sums). */
typedef struct srv_bsp_shard {
    uint64_t round;          /* round this worker last pushed into */
    int round_fin;           /* its push for `round` is complete */
    float *slot;             /* its gradient for the round: what arrived in
                              * pieces other than whole blocks, and zeros;
                              * NULL until needed */
    int slot_clean;          /* slot holds zeros outside what this round wrote */
    /* The blocks of this round's gradient that arrived each in one float32
     * frame stay where they arrived: the receive buffer holding one is
     * taken from the connection (which gets a spare in exchange), so a
     * push is never copied. kept_at[b] points at block b's values in
     * kept[b] (NULL: block b is in slot); spare holds buffers of rounds
     * gone by, for the connection to read into next. */
    srv_rbuf *kept;
    const float **kept_at;
    size_t nkept;            /* entries of kept and kept_at: the model's blocks */
    srv_rbuf *spare;         /* up to nkept + 1 */
    size_t nspare;
    /* the ranges this round's push has covered so far, sorted, disjoint,
     * adjacent ones merged (one range for a push sent in order): a range
     * pushed twice in one round is refused */
    struct srv_bsp_range {
        uint64_t lo, hi;
    } *rg;
    size_t nrg, rg_cap;
} srv_bsp_shard;

/* BSP's own state: the round, and each shard's gradient kept for it. */
typedef struct srv_bsp_state {
    float *acc;     /* the round's sum of complete pushes (arrival order
                     * only): a push's chunks are kept apart until its fin
                     * chunk, so one that never finishes leaves no trace */
    srv_bsp_shard **sh; /* per shard, NULL until it pushes */
    uint32_t nsh;
    float **src;    /* the gradients a round's mean sums, in order */
    const float *const **blk; /* and their blocks kept apart (srv_grad.blk) */
    const float **xs;
    size_t src_cap;
    uint32_t count; /* complete pushes in the current round */
    uint64_t round_start_ms;
    /* A round closing piece by piece (bsp_piece; srv_bsp_pieces_on): piece p is
     * [p * piece, (p + 1) * piece); pcount[p] counts the shards whose push
     * srv_bsp_covers it, pclosed[p] says its mean is applied. Valid for round
     * pround only. */
    uint64_t piece, pround;
    size_t npieces, nclosed, pcap;
    uint32_t *pcount;
    uint8_t *pclosed;
    srv_snap *base; /* the version before the round's first piece closed */
    srv_tround tr;  /* the round's table pushes, applied as it closes */
    float gmax;     /* the largest |value| of this round's pushes so far */
    int gmax_unknown; /* one of them came without it */
} srv_bsp_state;

/* ---- bsp_kept.c: a shard's gradient for the round ---- */

/* Keeps shard w's push p until the round closes (see bsp_kept.c); -1 when
 * out of memory. */
int srv_bsp_keep(psd *s, srv_bsp_shard *w, const srv_push *p);
/* A new round for w: the last round's blocks become spares, the slot stale. */
void srv_bsp_kept_release(srv_bsp_shard *w);
/* Before a round's mean: w's slot ready where no block is kept apart; -1
 * when out of memory. */
int srv_bsp_source_ready(srv_bsp_shard *w, size_t total);
/* 0 when [off, off+n) overlaps no range w pushed this round, else
 * PS_EDUPLICATE with the overlapping range in *dup. */
int srv_bsp_range_check(const srv_bsp_shard *w, uint64_t off, uint64_t n, struct srv_bsp_range *dup);
/* Records [off, off+n) as pushed this round; -1 when out of memory. */
int srv_bsp_range_add(srv_bsp_shard *w, uint64_t off, uint64_t n);
/* 1 when w's push of the round covers [lo, hi). */
int srv_bsp_covers(const srv_bsp_shard *w, uint64_t lo, uint64_t hi);
/* w starts a round, or its unfinished push is dropped. */
void srv_bsp_shard_reset(srv_bsp_shard *w, uint64_t round);
/* Arrival order: adds w's complete push to b->acc. */
void srv_bsp_fold_into(srv_bsp_state *b, srv_bsp_shard *w);
void srv_bsp_shard_free(srv_bsp_shard *w);
/* Room in b->src, blk and xs for every shard's gradient; -1 when out of
 * memory. */
int srv_bsp_sources_room(srv_bsp_state *b);

/* ---- bsp_pieces.c: a round that closes piece by piece ---- */

/* 1 when the rounds close piece by piece (see bsp_pieces.c). */
int srv_bsp_pieces_on(const psd *s);
/* The end of piece p of a model of total floats. */
uint64_t srv_bsp_piece_hi(const srv_bsp_state *b, size_t p, size_t total);
/* The pieces of the current round, counted from none; -1 when out of
 * memory (the round then closes whole). */
int srv_bsp_pieces_begin(psd *s, srv_bsp_state *b);
/* Counts the pieces of [off, off+n) that w's push now covers whole. */
void srv_bsp_pieces_note(srv_bsp_state *b, const srv_bsp_shard *w, uint64_t off, uint64_t n, size_t total);
/* Counts every piece again (a shard's unfinished push was dropped). */
void srv_bsp_pieces_recount(psd *s, srv_bsp_state *b);
/* Applies the mean of the pieces of [off, off+n) that `needed` pushes
 * cover; SRV_WAKE when one closed. */
int srv_bsp_pieces_close(psd *s, srv_bsp_state *b, uint64_t off, uint64_t n, uint32_t needed);

#endif
