/* policy.c - consistency modes: when a push is applied, when a round closes
 * and when a pull may be answered.
 *   asgd  applies each push as it arrives (optionally scaled by staleness or
 *         delay-compensated, DC-ASGD);
 *   bsp   sums a round's pushes and applies their mean once the live workers
 *         (less backup_workers) have pushed;
 *   ssp   applies pushes as they arrive, but answers a worker's pull only
 *         while it is at most `staleness` clocks ahead of the slowest live
 *         worker.
 * They decide only (policy.h): they get checked pushes, read the clock
 * psd.clock, apply through the update engine (update.h), and return
 * SRV_WAKE when waiting pulls may have become answerable. Each owns its
 * state in psd.policy_state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/policy/policy.h"
#include "server/update/update.h"

static uint64_t now_ms(const psd *s)
{
    return s->clock ? s->clock() : srv_now_ms();
}

/* A fin chunk's update is in: a new version, and the pusher's clock. */
static void step_done(psd *s, srv_worker *w)
{
    srv_model_bump(&s->model);
    w->clock++;
}

/* ---- ASGD and SSP: each push applied as it arrives -------------------------- */

/* ASGD's own state: what staleness scaling and DC-ASGD need. */
typedef struct asgd_state {
    float *scratch;      /* model-sized: a push's transformed gradient */
    srv_snap **base;     /* DC-ASGD: per shard, the parameters that worker last
                          * pulled (NULL: none) */
    uint32_t nbase;
} asgd_state;

static asgd_state *asgd_get(psd *s)
{
    if (!s->policy_state)
        s->policy_state = calloc(1, sizeof(asgd_state));
    return s->policy_state;
}

static srv_snap *asgd_base(psd *s, const srv_worker *w)
{
    asgd_state *a = s->policy_state;
    return a && w->shard < a->nbase ? a->base[w->shard] : NULL;
}

static void asgd_drop_base(psd *s, const srv_worker *w)
{
    asgd_state *a = s->policy_state;
    if (a && w->shard < a->nbase) {
        srv_snap_unref(a->base[w->shard]);
        a->base[w->shard] = NULL;
    }
}

/* Applies p's gradient to its range now, as ASGD and SSP do; a fin chunk
 * completes the step and makes a new version. Staleness scaling and
 * DC-ASGD (asgd only, compensate) transform g into the scratch buffer
 * first. */
static int apply_now(psd *s, srv_worker *w, const srv_push *p, int compensate, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    uint64_t off = p->off, n = p->n;
    const float *g = p->g;
    uint64_t stale = m->version - p->base;
    srv_snap *base = compensate ? asgd_base(s, w) : NULL;
    int scale = compensate && s->cfg.staleness_scale && stale > 0;
    int dc = compensate && s->cfg.dc_lambda > 0 && base && stale > 0;
    if (scale || dc) {
        asgd_state *a = asgd_get(s);
        if (a && !a->scratch)
            a->scratch = malloc(m->layout.total * sizeof(float));
        float *t = a ? a->scratch : NULL;
        if (!t) {
            snprintf(err, errlen, "out of memory for a gradient scratch buffer");
            return PS_ENOMEM;
        }
        float k = scale ? 1.0f / (1.0f + (float)stale) : 1.0f;
        const float lam = (float)s->cfg.dc_lambda;
        for (uint64_t done = 0; done < n;) {
            size_t len;
            const float *wn = srv_model_at(m, off + done, n - done, &len);
            const float *gi = g + done;
            float *ti = t + off + done;
            if (dc) {
                /* g + lambda * g * g * (w_now - w_base): a first-order Taylor
                 * correction of the gradient for the updates it missed */
                size_t blen;
                const float *wb = srv_snap_at(base, off + done, n - done, &blen);
                for (size_t i = 0; i < len; i++)
                    ti[i] = k * (gi[i] + lam * gi[i] * gi[i] * (wn[i] - wb[i]));
            } else {
                for (size_t i = 0; i < len; i++)
                    ti[i] = k * gi[i];
            }
            done += len;
        }
        g = t + off;
    }
    /* scaling by k <= 1 keeps the push's bound; DC-ASGD's correction has none */
    srv_grad gr = {.g = g, .has_gmax = p->has_gmax && !dc, .gmax = p->gmax};
    srv_update_tag tag = {.w = w, .fin = p->fin};
    int rc = srv_update_apply(s, &gr, off, n, p->may_defer ? &tag : NULL);
    if (rc == SRV_PENDING)
        return SRV_PENDING;
    if (rc == PS_ENONFINITE) {
        snprintf(err, errlen, "applying this gradient to [%llu, %llu) would make parameters infinite or NaN; "
                 "refused, the model unchanged", (unsigned long long)off, (unsigned long long)(off + n));
        return rc;
    }
    if (rc != 0) {
        snprintf(err, errlen, "out of memory for a copy of a model block");
        return PS_ENOMEM;
    }
    if (!p->fin)
        return 0;
    step_done(s, w);
    return SRV_WAKE;
}

/* An update a push started off the loop is in (asgd, ssp). */
static int step_applied(psd *s, const srv_update_tag *tag)
{
    if (!tag->fin)
        return 0;
    step_done(s, tag->w);
    return SRV_WAKE;
}

/* ---- ASGD ---------------------------------------------------------------- */

static int asgd_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    return apply_now(s, w, p, 1, err, errlen);
}

static int asgd_left(psd *s, srv_worker *w)
{
    asgd_drop_base(s, w);
    return 0;
}

static int noop_member(psd *s, srv_worker *w)
{
    return 0;
}

/* DC-ASGD: what this worker computes its next gradient against. */
static void asgd_pulled(psd *s, srv_worker *w, uint64_t ver)
{
    if (!(s->cfg.dc_lambda > 0))
        return;
    srv_snap *old = asgd_base(s, w);
    if (old && old->version == ver)
        return;
    asgd_state *a = asgd_get(s);
    if (!a)
        return;
    if (w->shard >= a->nbase) {
        uint32_t cap = a->nbase ? a->nbase : 8;
        while (cap <= w->shard)
            cap *= 2;
        srv_snap **b = realloc(a->base, cap * sizeof *b);
        if (!b)
            return;
        memset(b + a->nbase, 0, (cap - a->nbase) * sizeof *b);
        a->base = b;
        a->nbase = cap;
    }
    srv_snap *snap = srv_snap_take(&s->model);
    if (snap) {
        srv_snap_unref(a->base[w->shard]);
        a->base[w->shard] = snap;
    }
}

/* DC-ASGD off: the parameters each worker last pulled are no longer
 * needed, and would otherwise pin old snapshots. */
static void asgd_reconfigured(psd *s)
{
    asgd_state *a = s->policy_state;
    if (!a || s->cfg.dc_lambda > 0)
        return;
    for (uint32_t i = 0; i < a->nbase; i++) {
        srv_snap_unref(a->base[i]);
        a->base[i] = NULL;
    }
}

static void asgd_destroy(psd *s)
{
    asgd_state *a = s->policy_state;
    if (!a)
        return;
    for (uint32_t i = 0; i < a->nbase; i++)
        srv_snap_unref(a->base[i]);
    free(a->base);
    free(a->scratch);
    free(a);
    s->policy_state = NULL;
}

const srv_policy_ops srv_policy_asgd = {
    .name = "asgd",
    .push = asgd_push,
    .applied = step_applied,
    .worker_left = asgd_left,
    .worker_joined = noop_member,
    .pull_ready = NULL,
    .pulled = asgd_pulled,
    .reconfigured = asgd_reconfigured,
    .destroy = asgd_destroy,
};

/* ---- SSP ----------------------------------------------------------------- */

/* Smallest clock among the live workers; UINT64_MAX when there is none.
 * Shards below M that have not joined yet count as live at clock 0, so the
 * first worker to connect cannot run away before the others start (as BSP
 * rounds wait for all M); a worker that left or died no longer counts. */
static uint64_t ssp_min_clock(psd *s, const srv_worker *except)
{
    uint64_t min = UINT64_MAX;
    uint32_t m = (uint32_t)s->cfg.workers;
    for (uint32_t i = 0; i < s->nworkers_cap || i < m; i++) {
        srv_worker *w = i < s->nworkers_cap ? s->workers[i] : NULL;
        if (!w) {
            if (i < m)
                min = 0;
            continue;
        }
        if (w != except && w->state == SRV_W_CONNECTED && w->clock < min)
            min = w->clock;
    }
    return min;
}

static int ssp_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    return apply_now(s, w, p, 0, err, errlen);
}

static int ssp_pull_ready(psd *s, const srv_worker *w, uint64_t min)
{
    if (!s->model.initialized || s->model.version < min)
        return 0;
    if (!w)
        return 1;
    uint64_t slowest = ssp_min_clock(s, NULL);
    return slowest == UINT64_MAX || w->clock <= slowest + (uint64_t)s->cfg.staleness;
}

static int ssp_joined(psd *s, srv_worker *w)
{
    /* A newcomer (or a worker back from the dead) starts level with the
     * slowest live worker, so it does not hold the others back; and the
     * others may have been waiting for it. */
    uint64_t slowest = ssp_min_clock(s, w);
    if (slowest != UINT64_MAX && w->clock < slowest)
        w->clock = slowest;
    return SRV_WAKE;
}

static int ssp_left(psd *s, srv_worker *w)
{
    /* the slowest may have gone: waiting pulls may now be answerable */
    return SRV_WAKE;
}

static void noop_destroy(psd *s)
{
}

const srv_policy_ops srv_policy_ssp = {
    .name = "ssp",
    .push = ssp_push,
    .applied = step_applied,
    .worker_left = ssp_left,
    .worker_joined = ssp_joined,
    .pull_ready = ssp_pull_ready,
    .destroy = noop_destroy,
};

/* ---- BSP ----------------------------------------------------------------- */

/* A shard's part of the round (shard-order sums). */
typedef struct bsp_shard {
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
    struct bsp_range {
        uint64_t lo, hi;
    } *rg;
    size_t nrg, rg_cap;
} bsp_shard;

/* BSP's own state: the round, and each shard's gradient kept for it. */
typedef struct bsp_state {
    float *acc;     /* the round's sum of complete pushes (arrival order
                     * only): a push's chunks are kept apart until its fin
                     * chunk, so one that never finishes leaves no trace */
    bsp_shard **sh; /* per shard, NULL until it pushes */
    uint32_t nsh;
    float **src;    /* the gradients a round's mean sums, in order */
    const float *const **blk; /* and their blocks kept apart (srv_grad.blk) */
    const float **xs;
    size_t src_cap;
    uint32_t count; /* complete pushes in the current round */
    uint64_t round_start_ms;
    /* A round closing piece by piece (bsp_piece; pieces_on): piece p is
     * [p * piece, (p + 1) * piece); pcount[p] counts the shards whose push
     * covers it, pclosed[p] says its mean is applied. Valid for round
     * pround only. */
    uint64_t piece, pround;
    size_t npieces, nclosed, pcap;
    uint32_t *pcount;
    uint8_t *pclosed;
    srv_snap *base; /* the version before the round's first piece closed */
    float gmax;     /* the largest |value| of this round's pushes so far */
    int gmax_unknown; /* one of them came without it */
} bsp_state;

/* Pushes that close a round: the workers that are not gone (M less those
 * that joined once and left or died), less the backup workers; at least 1. */
static uint32_t bsp_needed(psd *s)
{
    if (srv_plan_active(s)) {
        /* the round's members still in the job (the plan's), and those
         * gone after their push was complete: it counts */
        uint32_t live = srv_plan_needed(s), b = (uint32_t)s->cfg.backup_workers;
        const bsp_state *st = s->policy_state;
        for (uint32_t i = 0; st && i < st->nsh; i++) {
            const bsp_shard *sh = st->sh[i];
            const srv_worker *w = i < s->nworkers_cap ? s->workers[i] : NULL;
            if (sh && sh->round == s->model.version && sh->round_fin && w && w->state != SRV_W_CONNECTED)
                live++;
        }
        return live > b ? live - b : 1;
    }
    uint32_t gone = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (w && w->state != SRV_W_CONNECTED)
            gone++;
    }
    uint32_t m = (uint32_t)s->cfg.workers;
    uint32_t live = gone >= m ? 0 : m - gone;
    uint32_t b = (uint32_t)s->cfg.backup_workers;
    return live > b ? live - b : 1;
}

static bsp_state *bsp_get(psd *s, char *err, size_t errlen)
{
    bsp_state *b = s->policy_state;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b && s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL)
            b->acc = calloc(s->model.layout.total, sizeof(float));
        if (!b || (s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL && !b->acc)) {
            free(b);
            snprintf(err, errlen, "out of memory for the BSP accumulator");
            return NULL;
        }
        b->round_start_ms = now_ms(s);
        s->policy_state = b;
    }
    return b;
}

/* The state of shard i, made when it first pushes; NULL when out of memory. */
static bsp_shard *bsp_shard_get(bsp_state *b, uint32_t i)
{
    if (i >= b->nsh) {
        uint32_t cap = b->nsh ? b->nsh : 8;
        while (cap <= i)
            cap *= 2;
        bsp_shard **p = realloc(b->sh, cap * sizeof *p);
        if (!p)
            return NULL;
        memset(p + b->nsh, 0, (cap - b->nsh) * sizeof *p);
        b->sh = p;
        b->nsh = cap;
    }
    if (!b->sh[i] && (b->sh[i] = calloc(1, sizeof(bsp_shard))))
        b->sh[i]->round = UINT64_MAX;
    return b->sh[i];
}

/* ---- a worker's gradient for the round (shard-order sums) ----------------- */

/* Floats in block i of a model of total. */
static uint64_t block_len(size_t total, size_t i)
{
    uint64_t start = (uint64_t)i << SRV_BLK_SHIFT;
    return total - start < SRV_BLK_FLOATS ? total - start : SRV_BLK_FLOATS;
}

/* Room for w's kept blocks, once the model's block count is known. */
static int kept_init(bsp_shard *w, size_t nblk)
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

static void spare_put(bsp_shard *w, srv_rbuf r)
{
    if (!r.mem)
        return;
    if (w->nspare < w->nkept + 1)
        w->spare[w->nspare++] = r;
    else
        free(r.mem);
}

/* Block i is no longer kept apart (its buffer becomes a spare). */
static void kept_forget(bsp_shard *w, size_t i)
{
    spare_put(w, w->kept[i]);
    w->kept[i] = (srv_rbuf){0};
    w->kept_at[i] = NULL;
}

/* A new round for w: the last round's blocks are applied, their buffers
 * spares, and the slot's contents stale. */
static void kept_release(bsp_shard *w)
{
    for (size_t i = 0; i < w->nkept; i++)
        kept_forget(w, i);
    w->slot_clean = 0;
}

/* w->slot allocated, and with zero set, holding zeros wherever this round
 * wrote nothing. */
static int slot_ready(bsp_shard *w, size_t total, int zero)
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
static int source_ready(bsp_shard *w, size_t total)
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
static int keep_push(psd *s, bsp_shard *w, const srv_push *p)
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
static int range_check(const bsp_shard *w, uint64_t off, uint64_t n, struct bsp_range *dup)
{
    for (size_t i = 0; i < w->nrg; i++)
        if (off < w->rg[i].hi && w->rg[i].lo < off + n) {
            *dup = w->rg[i];
            return PS_EDUPLICATE;
        }
    return 0;
}

/* Records [off, off+n) (checked by range_check) as pushed this round;
 * -1 when out of memory. */
static int range_add(bsp_shard *w, uint64_t off, uint64_t n)
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
        struct bsp_range *r = realloc(w->rg, cap * sizeof *r);
        if (!r)
            return -1;
        w->rg = r;
        w->rg_cap = cap;
    }
    memmove(w->rg + at + 1, w->rg + at, (w->nrg - at) * sizeof *w->rg);
    w->rg[at] = (struct bsp_range){lo, hi};
    w->nrg++;
    return 0;
}

/* w starts a round, or its unfinished push is dropped: nothing of it stays. */
static void shard_reset(bsp_shard *w, uint64_t round)
{
    kept_release(w);
    w->nrg = 0;
    w->round = round;
    w->round_fin = 0;
}

/* Arrival order: w's push is complete; adds what it kept (the ranges it
 * pushed, from its kept blocks or its slot) to the round's sum. */
static void fold_into(bsp_state *b, bsp_shard *w)
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

static void shard_free(bsp_shard *w)
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

/* ---- pieces: a round that closes piece by piece -------------------------- */

/* The rounds close piece by piece: bsp_piece is set and nothing needs the
 * whole round's mean at once (backup workers decide per round who counts,
 * clip_norm clips the whole mean, a plan hands out the next round as it
 * opens, the arrival-order sum has no push apart before its fin). */
static int pieces_on(const psd *s)
{
    const ps_config *c = &s->cfg;
    return c->bsp_piece > 0 && c->bsp_piece < s->model.layout.total && c->bsp_sum_order == PS_BSP_SUM_SHARD &&
           c->backup_workers == 0 && !(c->clip_norm > 0) && !srv_plan_active(s);
}

/* 1 when w's push of the round covers [lo, hi) (its ranges are merged). */
static int covers(const bsp_shard *w, uint64_t lo, uint64_t hi)
{
    for (size_t i = 0; i < w->nrg; i++)
        if (w->rg[i].lo <= lo && hi <= w->rg[i].hi)
            return 1;
    return 0;
}

static uint64_t piece_hi(const bsp_state *b, size_t p, size_t total)
{
    uint64_t hi = (uint64_t)(p + 1) * b->piece;
    return hi < total ? hi : total;
}

/* The pieces of the current round, counted from none (its first push);
 * -1 when out of memory (the round then closes whole). */
static int pieces_begin(psd *s, bsp_state *b)
{
    uint64_t round = s->model.version;
    if (b->pround == round && b->npieces)
        return 0;
    size_t total = s->model.layout.total;
    b->npieces = 0;
    b->nclosed = 0;
    b->pround = round;
    if (!pieces_on(s))
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

/* Counts the pieces of [off, off+n) that w's push now covers whole. */
static void pieces_note(bsp_state *b, const bsp_shard *w, uint64_t off, uint64_t n, size_t total)
{
    if (!b->npieces || !n)
        return;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + n - 1) / b->piece); p++)
        if (!b->pclosed[p] && covers(w, (uint64_t)p * b->piece, piece_hi(b, p, total)))
            b->pcount[p]++;
}

/* Counts every piece again (a shard's unfinished push was dropped). */
static void pieces_recount(psd *s, bsp_state *b)
{
    size_t total = s->model.layout.total;
    for (size_t p = 0; p < b->npieces; p++) {
        if (b->pclosed[p])
            continue;
        b->pcount[p] = 0;
        for (uint32_t i = 0; i < b->nsh; i++) {
            const bsp_shard *w = b->sh[i];
            if (w && w->round == s->model.version && covers(w, (uint64_t)p * b->piece, piece_hi(b, p, total)))
                b->pcount[p]++;
        }
    }
}

static int sources_room(bsp_state *b);

/* Applies the mean of the pieces of [off, off+n) (a push's range; the whole
 * model when the workers needed changed) that every needed push covers,
 * each over the shards that pushed it (in shard order). SRV_WAKE when one
 * closed. */
static int pieces_close(psd *s, bsp_state *b, uint64_t off, uint64_t n)
{
    if (!b->npieces || !n || b->pround != s->model.version || srv_update_busy(s) || sources_room(b) != 0)
        return 0;
    size_t total = s->model.layout.total;
    uint32_t needed = bsp_needed(s);
    int woke = 0;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + n - 1) / b->piece); p++) {
        if (b->pclosed[p] || b->pcount[p] < needed)
            continue;
        uint64_t lo = (uint64_t)p * b->piece, hi = piece_hi(b, p, total);
        srv_grad gr = {.src = b->src, .blk = b->blk, .xs = b->xs, .has_gmax = !b->gmax_unknown, .gmax = b->gmax};
        for (uint32_t i = 0; i < b->nsh; i++) {
            bsp_shard *w = b->sh[i];
            if (!w || w->round != s->model.version || !covers(w, lo, hi))
                continue;
            if (source_ready(w, total) != 0)
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
        s->stats.early_pieces++;
        woke = SRV_WAKE;
    }
    return woke;
}

/* The round's update is applied: a new version. */
static void bsp_round_closed(psd *s)
{
    bsp_state *b = s->policy_state;
    uint64_t round = s->model.version;
    srv_model_bump(&s->model);
    s->stats.rounds++;
    uint64_t now = now_ms(s);
    srv_hist_observe(&s->stats.round_seconds, (double)(now - b->round_start_ms) / 1000.0);
    PS_LOG(PS_LOG_DEBUG, "round %llu closed with %u pushes in %llu ms", (unsigned long long)round, b->count,
           (unsigned long long)(now - b->round_start_ms));
    b->round_start_ms = now;
    b->count = 0;
    srv_snap_unref(b->base);
    b->base = NULL;
    b->gmax = 0;
    b->gmax_unknown = 0;
    if (srv_plan_active(s)) {
        /* who trains the next round is fixed now, as its pulls are answered */
        if (srv_plan_open(s) != 0)
            PS_LOG(PS_LOG_ERROR, "out of memory fixing round %llu's workers; every worker trains it",
                   (unsigned long long)s->model.version);
        if (srv_plan_done(s) && !s->plan.said_done) {
            s->plan.said_done = 1;
            PS_LOG(PS_LOG_INFO, "plan: round %llu, the last of %llu epochs, closed: the job is done (model version "
                                "%llu); pushes from now on are dropped",
                   (unsigned long long)round, (unsigned long long)s->plan.p.epochs,
                   (unsigned long long)s->model.version);
        }
    }
}

/* Room in b->src, blk and xs for every shard's gradient; -1 when out of
 * memory. */
static int sources_room(bsp_state *b)
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

/* Closes the round when enough pushes are in: applies their mean, made
 * piece by piece from the shards' gradients in shard order (or from the
 * arrival-order sum), never as a model-sized array. closer is the worker
 * whose push completed the round, and may_defer whether its reply may wait
 * (NULL, 0 when a membership change or the tick closes it): for a big
 * model the update then runs off the loop and this returns SRV_PENDING.
 * Returns SRV_WAKE when the round closed, 0 when it stays open (not
 * enough pushes yet, or out of memory: logged, tried again on the tick). */
static int bsp_try_close(psd *s, srv_worker *closer, int may_defer)
{
    bsp_state *b = s->policy_state;
    if (!b || b->count == 0 || b->count < bsp_needed(s) || srv_update_busy(s))
        return 0;
    size_t total = s->model.layout.total;
    uint64_t round = s->model.version;
    srv_grad gr = {.inv = 1.0f / (float)b->count};
    if (sources_room(b) != 0) {
        PS_LOG(PS_LOG_ERROR, "out of memory closing round %llu; it stays open", (unsigned long long)round);
        return 0;
    }
    gr.src = b->src;
    gr.blk = b->blk;
    gr.xs = b->xs;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        /* in shard order, so the result does not depend on arrival order */
        for (uint32_t i = 0; i < b->nsh; i++) {
            bsp_shard *w = b->sh[i];
            if (!w || w->round != round || !w->round_fin)
                continue;
            if (source_ready(w, total) != 0) {
                PS_LOG(PS_LOG_ERROR, "out of memory closing round %llu; it stays open", (unsigned long long)round);
                return 0;
            }
            b->blk[gr.nsrc] = w->nkept ? w->kept_at : NULL;
            gr.src[gr.nsrc++] = w->slot;
        }
    } else {
        b->blk[gr.nsrc] = NULL;
        gr.src[gr.nsrc++] = b->acc;
        gr.zero_src = 1;
    }
    /* the mean's values lie within its sources' */
    gr.has_gmax = !b->gmax_unknown;
    gr.gmax = b->gmax;
    if (b->npieces && b->pround == round && b->nclosed) {
        /* closing piece by piece: the pieces still open, with every push */
        for (size_t p = 0; p < b->npieces; p++) {
            if (b->pclosed[p])
                continue;
            uint64_t lo = (uint64_t)p * b->piece, hi = piece_hi(b, p, total);
            int rc = srv_update_apply(s, &gr, lo, hi - lo, NULL);
            if (rc != 0 && rc != PS_ENONFINITE) {
                PS_LOG(PS_LOG_ERROR, "out of memory copying a model block closing round %llu; it stays open",
                       (unsigned long long)round);
                return 0;
            }
            b->pclosed[p] = 1;
            b->nclosed++;
        }
        bsp_round_closed(s);
        return SRV_WAKE;
    }
    srv_update_tag tag = {.w = closer, .fin = 1, .round = 1};
    int rc = srv_update_apply(s, &gr, 0, total, closer && may_defer ? &tag : NULL);
    if (rc == SRV_PENDING)
        return SRV_PENDING;
    if (rc == PS_ENONFINITE) {
        /* the round's mean would overflow the model: the round closes
         * with the model unchanged (update.c logged and counted it) */
        PS_LOG(PS_LOG_ERROR, "round %llu closed without its update: its mean would make parameters infinite or NaN",
               (unsigned long long)round);
        if (b->acc)
            memset(b->acc, 0, total * sizeof(float));
        bsp_round_closed(s);
        return SRV_WAKE;
    }
    if (rc != 0) {
        /* nothing applied: the round stays open, tried again on psd's tick */
        PS_LOG(PS_LOG_ERROR, "out of memory copying a model block closing round %llu; it stays open",
               (unsigned long long)round);
        return 0;
    }
    bsp_round_closed(s);
    return SRV_WAKE;
}

static int bsp_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    uint64_t round = s->model.version;
    if (p->base < round) {
        snprintf(err, errlen, "push for round %llu arrived after it closed (round %llu is open); dropped",
                 (unsigned long long)p->base, (unsigned long long)round);
        return PS_ESTALE;
    }
    if (srv_plan_active(s)) {
        if (srv_plan_done(s)) {
            snprintf(err, errlen, "push for round %llu after the plan's last round (%llu) closed: the job is done; "
                     "dropped", (unsigned long long)p->base, (unsigned long long)(s->plan.rounds - 1));
            return PS_ESTALE;
        }
        if (!srv_plan_member(s, w)) {
            snprintf(err, errlen, "shard %u joined after round %llu was handed out; it trains from the next round "
                     "on; dropped", w->shard, (unsigned long long)round);
            return PS_ESTALE;
        }
    }
    bsp_state *b = bsp_get(s, err, errlen);
    if (!b)
        return PS_ENOMEM;
    bsp_shard *sh = bsp_shard_get(b, w->shard);
    if (!sh) {
        snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
        return PS_ENOMEM;
    }
    if (sh->round == round && sh->round_fin) {
        snprintf(err, errlen, "shard %u already pushed for round %llu", w->shard, (unsigned long long)round);
        return PS_EDUPLICATE;
    }
    if (sh->round != round)
        shard_reset(sh, round); /* the last round's are applied, or were dropped */
    if (pieces_begin(s, b) != 0)
        PS_LOG(PS_LOG_WARN, "out of memory for round %llu's pieces; it closes whole", (unsigned long long)round);
    struct bsp_range dup;
    if (range_check(sh, p->off, p->n, &dup) != 0) {
        snprintf(err, errlen,
                 "shard %u pushed [%llu, %llu) twice in round %llu (it already sent [%llu, %llu)); a push counts "
                 "once per round",
                 w->shard, (unsigned long long)p->off, (unsigned long long)(p->off + p->n),
                 (unsigned long long)round, (unsigned long long)dup.lo, (unsigned long long)dup.hi);
        return PS_EDUPLICATE;
    }
    int arrival = s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL;
    if (arrival && p->fin && sh->nrg == 0) {
        /* the whole push in one message: straight into the sum */
        for (uint64_t j = 0; j < p->n; j++)
            b->acc[p->off + j] += p->g[j];
    } else {
        if (range_add(sh, p->off, p->n) != 0 || keep_push(s, sh, p) != 0) {
            snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
            return PS_ENOMEM;
        }
        if (arrival && p->fin) {
            fold_into(b, sh);
            kept_release(sh);
        }
    }
    if (!p->has_gmax)
        b->gmax_unknown = 1;
    else if (p->gmax > b->gmax)
        b->gmax = p->gmax;
    pieces_note(b, sh, p->off, p->n, s->model.layout.total); /* pieces: shard order, so never the arrival path */
    if (p->fin) {
        sh->round_fin = 1;
        w->clock++;
        b->count++;
        int rc = bsp_try_close(s, w, p->may_defer);
        if (rc != 0)
            return rc;
    }
    return pieces_close(s, b, p->off, p->n);
}

static int bsp_applied(psd *s, const srv_update_tag *tag)
{
    bsp_round_closed(s);
    return SRV_WAKE;
}

static int bsp_joined(psd *s, srv_worker *w)
{
    return bsp_try_close(s, NULL, 0);
}

/* A worker that leaves or is lost in the middle of its push: what it sent
 * of it is dropped (it never counted), and the round may close without it. */
static int bsp_left(psd *s, srv_worker *w)
{
    bsp_state *b = s->policy_state;
    if (b && w->shard < b->nsh && b->sh[w->shard]) {
        bsp_shard *sh = b->sh[w->shard];
        if (sh->round == s->model.version && !sh->round_fin && sh->nrg) {
            PS_LOG(PS_LOG_INFO, "shard %u's unfinished push for round %llu dropped", w->shard,
                   (unsigned long long)sh->round);
            shard_reset(sh, UINT64_MAX);
            if (b->npieces && b->pround == s->model.version)
                pieces_recount(s, b);
        }
    }
    int rc = bsp_try_close(s, NULL, 0);
    return rc || !b ? rc : pieces_close(s, b, 0, s->model.layout.total);
}

/* Without a plan as the default: the model initialised and at min. With
 * one a worker's pull waits while the worker has no part in the current
 * round (it joined after the round was handed out) or has already pushed
 * its part (it reconnected after its push): it is answered with the next
 * round, so a round never gets a share twice. Once the plan is done every
 * pull is answered (its reply says done). */
static int bsp_pull_ready(psd *s, const srv_worker *w, uint64_t min)
{
    if (!s->model.initialized)
        return 0;
    if (w && srv_plan_active(s)) {
        if (srv_plan_done(s))
            return 1;
        if (!srv_plan_member(s, w))
            return 0;
        bsp_state *b = s->policy_state;
        const bsp_shard *sh = b && w->shard < b->nsh ? b->sh[w->shard] : NULL;
        if (sh && sh->round == s->model.version && sh->round_fin)
            return 0;
    }
    return s->model.version >= min;
}

static uint64_t bsp_range_version(psd *s, uint64_t off, uint64_t len)
{
    const bsp_state *b = s->policy_state;
    if (!b || !b->nclosed || b->pround != s->model.version || !len)
        return 0;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + len - 1) / b->piece); p++)
        if (!b->pclosed[p])
            return 0;
    return s->model.version + 1;
}

static srv_snap *bsp_round_base(psd *s)
{
    const bsp_state *b = s->policy_state;
    return b ? b->base : NULL;
}

static uint64_t bsp_piece(const psd *s)
{
    return pieces_on(s) ? s->cfg.bsp_piece : 0;
}

static uint32_t bsp_unpushed(psd *s, uint32_t *out, uint32_t max)
{
    const bsp_state *b = s->policy_state;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (!w || w->state != SRV_W_CONNECTED || (srv_plan_active(s) && !srv_plan_member(s, w)))
            continue;
        const bsp_shard *sh = b && i < b->nsh ? b->sh[i] : NULL;
        if (sh && sh->round == s->model.version && sh->round_fin)
            continue;
        if (n < max)
            out[n] = i;
        n++;
    }
    return n;
}

/* A round that memory kept from closing (every push is in) closes here. */
static int bsp_tick(psd *s)
{
    return bsp_try_close(s, NULL, 0);
}

static void bsp_destroy(psd *s)
{
    bsp_state *b = s->policy_state;
    if (b) {
        for (uint32_t i = 0; i < b->nsh; i++)
            shard_free(b->sh[i]);
        free(b->sh);
        free(b->acc);
        free(b->src);
        free(b->blk);
        free(b->xs);
        free(b->pcount);
        free(b->pclosed);
        srv_snap_unref(b->base);
        free(b);
        s->policy_state = NULL;
    }
}

const srv_policy_ops srv_policy_bsp = {
    .name = "bsp",
    .push = bsp_push,
    .applied = bsp_applied,
    .worker_left = bsp_left,
    .worker_joined = bsp_joined,
    .pull_ready = bsp_pull_ready,
    .range_version = bsp_range_version,
    .round_base = bsp_round_base,
    .piece = bsp_piece,
    .unpushed = bsp_unpushed,
    .tick = bsp_tick,
    .destroy = bsp_destroy,
};

const srv_policy_ops *srv_policy_for(const ps_config *cfg)
{
    return cfg->mode == PS_MODE_BSP   ? &srv_policy_bsp
           : cfg->mode == PS_MODE_SSP ? &srv_policy_ssp
                                      : &srv_policy_asgd;
}
