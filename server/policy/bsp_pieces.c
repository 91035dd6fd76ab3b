/* bsp_pieces.c - a BSP round that closes piece by piece (bsp_piece): which
 * pieces every needed push covers, and their means applied before the
 * round closes. Owns the piece counts in srv_bsp_state (pcount, pclosed). */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/policy/bsp.h"
#include "server/update/update.h"

/* The rounds close piece by piece: bsp_piece is set and nothing needs the
 * whole round's mean at once (backup workers decide per round who counts,
 * clip_norm clips the whole mean, a plan hands out the next round as it
 * opens, the arrival-order sum has no push apart before its fin). A plan
 * counts from the hello that brings it, before the model has values: the
 * WELCOME (bsp_piece) says what the rounds will do. */
int srv_bsp_pieces_on(const psd *s)
{
    const ps_config *c = &s->cfg;
    /* not with followers: a piece's mean is in the model, and answered,
     * before the round's pushes are kept (dispatch/repl.c refuses a
     * follower while pieces are on) */
    return c->bsp_piece > 0 && c->bsp_piece < s->model.layout.total && c->bsp_sum_order == PS_BSP_SUM_SHARD &&
           c->backup_workers == 0 && !(c->clip_norm > 0) && !s->plan.set && !s->replog;
}

uint64_t srv_bsp_piece_hi(const srv_bsp_state *b, size_t p, size_t total)
{
    uint64_t hi = (uint64_t)(p + 1) * b->piece;
    return hi < total ? hi : total;
}

/* The pieces of the current round, counted from none (its first push);
 * -1 when out of memory (the round then closes whole). */
int srv_bsp_pieces_begin(psd *s, srv_bsp_state *b)
{
    uint64_t round = s->model.version;
    if (b->pround == round && b->npieces)
        return 0;
    size_t total = s->model.layout.total;
    b->npieces = 0;
    b->nclosed = 0;
    b->pround = round;
    if (!srv_bsp_pieces_on(s))
        return 0;
    uint64_t piece = s->cfg.bsp_piece;
    size_t n = (size_t)((total + piece - 1) / piece);
    if (n > b->pcap) {
        uint32_t *c = realloc(b->pcount, n * sizeof *c);
        if (c)
            b->pcount = c;
        uint8_t *d = realloc(b->pclosed, n);
        if (d)
            b->pclosed = d;
        if (!c || !d)
            return -1;
        b->pcap = n;
    }
    memset(b->pcount, 0, n * sizeof *b->pcount);
    memset(b->pclosed, 0, n);
    b->piece = piece;
    b->npieces = n;
    return 0;
}

/* Counts the pieces of [off, off+n) that w's push now srv_bsp_covers whole. */
void srv_bsp_pieces_note(srv_bsp_state *b, const srv_bsp_shard *w, uint64_t off, uint64_t n, size_t total)
{
    if (!b->npieces || !n)
        return;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + n - 1) / b->piece); p++)
        if (!b->pclosed[p] && srv_bsp_covers(w, (uint64_t)p * b->piece, srv_bsp_piece_hi(b, p, total)))
            b->pcount[p]++;
}

/* Counts every piece again (a shard's unfinished push was dropped). */
void srv_bsp_pieces_recount(psd *s, srv_bsp_state *b)
{
    size_t total = s->model.layout.total;
    for (size_t p = 0; p < b->npieces; p++) {
        if (b->pclosed[p])
            continue;
        b->pcount[p] = 0;
        for (uint32_t i = 0; i < b->nsh; i++) {
            const srv_bsp_shard *w = b->sh[i];
            if (w && w->round == s->model.version && srv_bsp_covers(w, (uint64_t)p * b->piece, srv_bsp_piece_hi(b, p, total)))
                b->pcount[p]++;
        }
    }
}

/* Applies the mean of the pieces of [off, off+n) (a push's range; the whole
 * model when the workers needed changed) that every needed push srv_bsp_covers,
 * each over the shards that pushed it (in shard order). SRV_WAKE when one
 * closed. `needed`: the pushes that close a round (bsp_needed). */
int srv_bsp_pieces_close(psd *s, srv_bsp_state *b, uint64_t off, uint64_t n, uint32_t needed)
{
    if (!b->npieces || !n || b->pround != s->model.version || srv_update_busy(s) || srv_bsp_sources_room(b) != 0)
        return 0;
    size_t total = s->model.layout.total;
    int woke = 0;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + n - 1) / b->piece); p++) {
        if (b->pclosed[p] || b->pcount[p] < needed)
            continue;
        uint64_t lo = (uint64_t)p * b->piece, hi = srv_bsp_piece_hi(b, p, total);
        srv_grad gr = {.src = b->src, .blk = b->blk, .xs = b->xs, .has_gmax = !b->gmax_unknown, .gmax = b->gmax};
        for (uint32_t i = 0; i < b->nsh; i++) {
            srv_bsp_shard *w = b->sh[i];
            if (!w || w->round != s->model.version || !srv_bsp_covers(w, lo, hi))
                continue;
            if (srv_bsp_source_ready(w, total) != 0)
                return woke;
            b->blk[gr.nsrc] = w->nkept ? w->kept_at : NULL;
            gr.src[gr.nsrc++] = w->slot;
        }
        if (!gr.nsrc)
            continue;
        if (!b->base && !(b->base = srv_snap_take(&s->model)))
            return woke; /* out of memory: the round closes whole */
        gr.inv = 1.0f / (float)gr.nsrc;
        int rc = srv_update_apply(s, &gr, lo, hi - lo, NULL);
        if (rc == PS_ENONFINITE)
            PS_LOG(PS_LOG_ERROR, "round %llu: piece [%llu, %llu) closed without its update: its mean would make "
                   "parameters infinite or NaN", (unsigned long long)s->model.version, (unsigned long long)lo,
                   (unsigned long long)hi);
        else if (rc != 0)
            return woke; /* out of memory: the round's close applies it */
        b->pclosed[p] = 1;
        b->nclosed++;
        SRV_COUNT(s, early_pieces, 1);
        woke = SRV_WAKE;
    }
    return woke;
}
