/* bsp_kept.c - a BSP shard's gradient kept until its round closes
 * (shard-order sums): the slot, the blocks kept in the receive buffers they
 * arrived in (and spares to give back), the ranges pushed this round; and
 * the list of sources a round's mean sums. Owns srv_bsp_shard's buffers. */
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/policy/bsp.h"

/* Floats in block i of a model of total. */
static uint64_t block_len(size_t total, size_t i)
{
    uint64_t start = (uint64_t)i << SRV_BLK_SHIFT;
    return total - start < SRV_BLK_FLOATS ? total - start : SRV_BLK_FLOATS;
}

/* Room for w's kept blocks, once the model's block count is known. */
static int kept_init(srv_bsp_shard *w, size_t nblk)
{
    if (w->nkept)
        return 0;
    w->kept = calloc(nblk, sizeof *w->kept);
    w->kept_at = calloc(nblk, sizeof *w->kept_at);
    w->spare = calloc(nblk + 1, sizeof *w->spare);
    if (!w->kept || !w->kept_at || !w->spare) {
        free(w->kept);
        free(w->kept_at);
        free(w->spare);
        w->kept = NULL;
        w->kept_at = NULL;
        w->spare = NULL;
        return -1;
    }
    w->nkept = nblk;
    return 0;
}

static void spare_put(srv_bsp_shard *w, srv_rbuf r)
{
    if (!r.mem)
        return;
    if (w->nspare < w->nkept + 1)
        w->spare[w->nspare++] = r;
    else
        free(r.mem);
}

/* Block i is no longer kept apart (its buffer becomes a spare). */
static void kept_forget(srv_bsp_shard *w, size_t i)
{
    spare_put(w, w->kept[i]);
    w->kept[i] = (srv_rbuf){0};
    w->kept_at[i] = NULL;
}

/* A new round for w: the last round's blocks are applied, their buffers
 * spares, and the slot's contents stale. */
void srv_bsp_kept_release(srv_bsp_shard *w)
{
    for (size_t i = 0; i < w->nkept; i++)
        kept_forget(w, i);
    w->slot_clean = 0;
}

/* w->slot allocated, and with zero set, holding zeros wherever this round
 * wrote nothing. */
static int slot_ready(srv_bsp_shard *w, size_t total, int zero)
{
    if (!w->slot) {
        if (!(w->slot = calloc(total, sizeof(float))))
            return -1;
        w->slot_clean = 1;
    } else if (zero && !w->slot_clean) {
        memset(w->slot, 0, total * sizeof(float));
        w->slot_clean = 1;
    }
    return 0;
}

/* Before a round's mean: the slot is needed (zeros for what w did not
 * push) unless every block is kept apart. */
int srv_bsp_source_ready(srv_bsp_shard *w, size_t total)
{
    for (size_t i = 0; i < w->nkept; i++)
        if (!w->kept_at[i])
            return slot_ready(w, total, 1);
    return w->nkept ? 0 : slot_ready(w, total, 1);
}

/* Keeps shard w's push p until the round closes:
 * - a whole model in a buffer the caller offers (p->own: widened from
 *   bfloat16, or copied from shared memory): that buffer becomes the slot,
 *   and the caller gets the old slot to fill next time;
 * - one whole block as float32 in the frame it arrived in (p->conn): the
 *   receive buffer is taken from the connection (a spare given in
 *   exchange), and the block is read there when the round closes;
 * - anything else is copied into the slot.
 * So a worker pushing as psworker does (one frame a block) is never
 * copied, and after the first rounds nothing is allocated. */
int srv_bsp_keep(psd *s, srv_bsp_shard *w, const srv_push *p)
{
    uint64_t off = p->off, n = p->n;
    const float *g = p->g;
    size_t total = s->model.layout.total;
    size_t nblk = (size_t)((total + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT);
    if (kept_init(w, nblk) != 0)
        return -1;
    if (p->own && off == 0 && n == total) {
        float *old = w->slot;
        w->slot = *p->own;
        *p->own = old;
        *p->own_cap = old ? total : 0;
        for (size_t i = 0; i < nblk; i++)
            kept_forget(w, i);
        w->slot_clean = 1;
        return 0;
    }
    size_t first = (size_t)(off >> SRV_BLK_SHIFT);
    if (!p->own && p->conn && s->io && off == (uint64_t)first << SRV_BLK_SHIFT && n == block_len(total, first)) {
        srv_rbuf repl = w->nspare ? w->spare[--w->nspare] : (srv_rbuf){0};
        srv_rbuf got;
        if (s->io->give_rbuf(p->conn, g, repl, &got) == 0) {
            w->kept[first] = got;
            w->kept_at[first] = g;
            return 0;
        }
        spare_put(w, repl);
    }
    int whole = off == 0 && n == total;
    if (slot_ready(w, total, !whole) != 0)
        return -1;
    /* no block of [off, off+n) is kept apart: bsp_push refuses a range
     * pushed twice in a round */
    memcpy(w->slot + off, g, (size_t)n * sizeof(float));
    if (whole)
        w->slot_clean = 1;
    return 0;
}

/* ---- the ranges of a round's push ---------------------------------------- */

/* 0 when [off, off+n) overlaps no range w pushed this round, else
 * PS_EDUPLICATE with the overlapping range in *dup. */
int srv_bsp_range_check(const srv_bsp_shard *w, uint64_t off, uint64_t n, struct srv_bsp_range *dup)
{
    for (size_t i = 0; i < w->nrg; i++)
        if (off < w->rg[i].hi && w->rg[i].lo < off + n) {
            *dup = w->rg[i];
            return PS_EDUPLICATE;
        }
    return 0;
}

/* Records [off, off+n) (checked by srv_bsp_range_check) as pushed this round;
 * -1 when out of memory. */
int srv_bsp_range_add(srv_bsp_shard *w, uint64_t off, uint64_t n)
{
    uint64_t lo = off, hi = off + n;
    size_t at = 0;
    while (at < w->nrg && w->rg[at].hi < lo)
        at++;
    /* at: the first range that ends at or after lo; merge with the ranges it touches */
    if (at < w->nrg && w->rg[at].hi == lo) {
        w->rg[at].hi = hi;
        if (at + 1 < w->nrg && w->rg[at + 1].lo == hi) {
            w->rg[at].hi = w->rg[at + 1].hi;
            memmove(w->rg + at + 1, w->rg + at + 2, (w->nrg - at - 2) * sizeof *w->rg);
            w->nrg--;
        }
        return 0;
    }
    if (at < w->nrg && w->rg[at].lo == hi) {
        w->rg[at].lo = lo;
        return 0;
    }
    if (w->nrg == w->rg_cap) {
        size_t cap = w->rg_cap ? 2 * w->rg_cap : 4;
        struct srv_bsp_range *r = realloc(w->rg, cap * sizeof *r);
        if (!r)
            return -1;
        w->rg = r;
        w->rg_cap = cap;
    }
    memmove(w->rg + at + 1, w->rg + at, (w->nrg - at) * sizeof *w->rg);
    w->rg[at] = (struct srv_bsp_range){lo, hi};
    w->nrg++;
    return 0;
}

/* w starts a round, or its unfinished push is dropped: nothing of it stays. */
void srv_bsp_shard_reset(srv_bsp_shard *w, uint64_t round)
{
    srv_bsp_kept_release(w);
    w->nrg = 0;
    w->round = round;
    w->round_fin = 0;
}

/* Arrival order: w's push is complete; adds what it kept (the ranges it
 * pushed, from its kept blocks or its slot) to the round's sum. */
void srv_bsp_fold_into(srv_bsp_state *b, srv_bsp_shard *w)
{
    for (size_t r = 0; r < w->nrg; r++)
        for (uint64_t j = w->rg[r].lo; j < w->rg[r].hi;) {
            size_t blk = (size_t)(j >> SRV_BLK_SHIFT);
            uint64_t bs = (uint64_t)blk << SRV_BLK_SHIFT;
            uint64_t end = bs + SRV_BLK_FLOATS < w->rg[r].hi ? bs + SRV_BLK_FLOATS : w->rg[r].hi;
            if (w->nkept && w->kept_at[blk]) {
                const float *g = w->kept_at[blk];
                for (; j < end; j++)
                    b->acc[j] += g[j - bs];
            } else {
                for (; j < end; j++)
                    b->acc[j] += w->slot[j];
            }
        }
}

void srv_bsp_shard_free(srv_bsp_shard *w)
{
    if (!w)
        return;
    free(w->rg);
    free(w->slot);
    for (size_t i = 0; i < w->nkept; i++)
        free(w->kept[i].mem);
    for (size_t i = 0; i < w->nspare; i++)
        free(w->spare[i].mem);
    free(w->kept);
    free(w->kept_at);
    free(w->spare);
    free(w);
}

/* 1 when w's push of the round srv_bsp_covers [lo, hi) (its ranges are merged). */
int srv_bsp_covers(const srv_bsp_shard *w, uint64_t lo, uint64_t hi)
{
    for (size_t i = 0; i < w->nrg; i++)
        if (w->rg[i].lo <= lo && hi <= w->rg[i].hi)
            return 1;
    return 0;
}

/* Room in b->src, blk and xs for every shard's gradient; -1 when out of
 * memory. */
int srv_bsp_sources_room(srv_bsp_state *b)
{
    if (b->src_cap >= b->nsh + 1)
        return 0;
    size_t cap = b->nsh + 1;
    float **p = realloc(b->src, cap * sizeof *p);
    if (p)
        b->src = p;
    const float *const **q = realloc(b->blk, cap * sizeof *q);
    if (q)
        b->blk = q;
    const float **x = realloc(b->xs, cap * sizeof *x);
    if (x)
        b->xs = x;
    if (!p || !q || !x)
        return -1;
    b->src_cap = cap;
    return 0;
}
