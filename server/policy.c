/* policy.c - consistency modes: when a push is applied, when a round closes
 * and when a pull may be answered.
 *   asgd  applies each push as it arrives (optionally scaled by staleness or
 *         delay-compensated, DC-ASGD);
 *   bsp   sums a round's pushes and applies their mean once the live workers
 *         (less backup_workers) have pushed;
 *   ssp   applies pushes as they arrive, but answers a worker's pull only
 *         while it is at most `staleness` clocks ahead of the slowest live
 *         worker.
 * None knows about sockets: they change the model and call
 * srv_answer_parked() when a waiting pull may have become answerable. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/vec.h"
#include "proto/errors.h"
#include "admin.h"
#include "psd.h"

static int check_range(psd *s, uint64_t off, uint64_t n, char *err, size_t errlen)
{
    uint64_t total = s->model.layout.total;
    if (n == 0 || off > total || n > total - off) {
        snprintf(err, errlen, "range [%llu, %llu) is outside the model's %llu parameters",
                 (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)total);
        return PS_ERANGE;
    }
    return 0;
}

static int check_base(psd *s, uint64_t base, char *err, size_t errlen)
{
    if (base > s->model.version) {
        snprintf(err, errlen, "base version %llu is ahead of the model (%llu)", (unsigned long long)base,
                 (unsigned long long)s->model.version);
        return PS_EBAD_FIELD;
    }
    return 0;
}

static float *scratch(psd *s)
{
    if (!s->scratch)
        s->scratch = malloc(s->model.layout.total * sizeof(float));
    return s->scratch;
}

/* ---- updates applied off the loop ------------------------------------------
 *
 * An update of at least APPLY_OFF_LOOP_MIN floats (a few milliseconds of
 * memory traffic) runs on libuv's thread pool, so that psd's loop goes on
 * moving other workers' bytes meanwhile. Until it is done the loop handles
 * no message and answers no pull (srv_apply), so no reply can take a new
 * reference to a block: blocks that nothing else holds are updated in
 * place, and those that replies queued before still send get fresh blocks,
 * which replace the model's when the update is done. */
#define APPLY_OFF_LOOP_MIN (PS_CHUNK_FLOATS / 2)
/* ... and one of at least this many, in two halves on two pool threads */
#define APPLY_SPLIT_MIN PS_CHUNK_FLOATS

/* floats of a round's mean made at a time (in L1, never a model-sized sum) */
#define MEAN_PIECE 4096
/* sources of a mean whose pointers round_mean keeps on its stack; more use
 * the round's own array (srv_grad.xs) */
#define MEAN_SOURCES_ON_STACK 16

/* The mean of nsrc gradients x[k][0..n) into out: the same float
 * operations in the same order as summing whole arrays (first source, +=
 * each next, *= inv), so the result does not depend on the piece size; one
 * pass over the sources for the usual 1 or 2 of them. */
PS_MULTIVERSION static void mean_of(const float *const *x, unsigned nsrc, float inv, size_t n, float *restrict out)
{
    const float *x0 = x[0];
    if (nsrc == 1) {
        for (size_t j = 0; j < n; j++)
            out[j] = x0[j] * inv;
        return;
    }
    const float *x1 = x[1];
    if (nsrc == 2) {
        for (size_t j = 0; j < n; j++)
            out[j] = (x0[j] + x1[j]) * inv;
        return;
    }
    for (size_t j = 0; j < n; j++)
        out[j] = x0[j] + x1[j];
    for (unsigned k = 2; k + 1 < nsrc; k++) {
        const float *xk = x[k];
        for (size_t j = 0; j < n; j++)
            out[j] += xk[j];
    }
    const float *xl = x[nsrc - 1];
    for (size_t j = 0; j < n; j++)
        out[j] = (out[j] + xl[j]) * inv;
}

/* gr's gradient for parameters [off, off+n), n <= MEAN_PIECE and within
 * one block, into out: each source read where that block of it is. */
static void round_mean(const srv_grad *gr, uint64_t off, size_t n, float *out)
{
    const float *x[MEAN_SOURCES_ON_STACK];
    const float **xs = gr->nsrc <= MEAN_SOURCES_ON_STACK ? x : gr->xs;
    size_t b = (size_t)(off >> SRV_BLK_SHIFT);
    uint64_t in = off - ((uint64_t)b << SRV_BLK_SHIFT);
    for (unsigned k = 0; k < gr->nsrc; k++) {
        const float *at = gr->blk && gr->blk[k] ? gr->blk[k][b] : NULL;
        xs[k] = at ? at + in : gr->src[k] + off;
    }
    mean_of(xs, gr->nsrc, gr->inv, n, out);
}

/* The length of a mean piece at off: at most MEAN_PIECE, len, and the rest
 * of off's block. */
static size_t piece_len(uint64_t off, uint64_t len)
{
    uint64_t to_edge = SRV_BLK_FLOATS - (off & (SRV_BLK_FLOATS - 1));
    uint64_t l = len < MEAN_PIECE ? len : MEAN_PIECE;
    return (size_t)(l < to_edge ? l : to_edge);
}

/* Applies gr's gradient to [off, off+len), which lies in one block: reads
 * the parameters from wi, writes them to wo. base is the update's first
 * parameter (a push's g starts there). */
static void run_piece(srv_optim *o, const srv_optim_step *st, const srv_grad *gr, uint64_t base, float *wo,
                      const float *wi, uint64_t off, size_t len)
{
    if (!gr->nsrc) {
        srv_optim_run(o, st, wo, wi, gr->g + (off - base), off, len);
        return;
    }
    float tmp[MEAN_PIECE];
    for (size_t x = 0; x < len;) {
        size_t l = piece_len(off + x, len - x);
        round_mean(gr, off + x, l, tmp);
        if (gr->zero_src)
            memset(gr->src[0] + off + x, 0, l * sizeof(float));
        srv_optim_run(o, st, wo + x, wi + x, tmp, off + x, l);
        x += l;
    }
}

/* The update's constants; for a round, the clip factor needs the norm of
 * the mean, taken piece by piece when clipping is on. */
static void begin_update(srv_model *m, srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    if (!gr->nsrc || !(m->opt.clip_norm > 0)) {
        srv_optim_begin(&m->opt, st, gr->nsrc ? NULL : gr->g, gr->nsrc ? 0 : n, m->version);
        return;
    }
    float tmp[MEAN_PIECE];
    double ss = 0;
    for (uint64_t x = 0; x < n;) {
        size_t l = piece_len(off + x, n - x);
        round_mean(gr, off + x, l, tmp);
        for (size_t j = 0; j < l; j++)
            ss += (double)tmp[j] * tmp[j];
        x += l;
    }
    srv_optim_begin_sumsq(&m->opt, st, ss, m->version);
}

/* Part of a's update: [lo, hi) of [off, off+n), block by block, from the
 * old blocks into the fresh ones (or in place); with copy_rest, also the
 * parts of fresh blocks the update leaves alone. */
static void apply_range(srv_apply *a, uint64_t lo, uint64_t hi, int copy_rest)
{
    srv_optim *o = &a->s->model.opt;
    uint64_t end = a->off + a->n;
    for (size_t i = 0; i < a->nblk; i++) {
        srv_blk *ob = a->old[i], *nb = a->fresh[i];
        uint64_t start = (uint64_t)(a->first + i) << SRV_BLK_SHIFT;
        uint64_t u0 = a->off > start ? a->off : start, u1 = end < start + ob->cap ? end : start + ob->cap;
        if (nb && copy_rest) {
            memcpy(nb->w, ob->w, (size_t)(u0 - start) * sizeof(float));
            memcpy(nb->w + (u1 - start), ob->w + (u1 - start), (size_t)(start + ob->cap - u1) * sizeof(float));
        }
        uint64_t p0 = lo > u0 ? lo : u0, p1 = hi < u1 ? hi : u1;
        if (p0 >= p1)
            continue;
        float *w = nb ? nb->w : ob->w; /* nb NULL: nobody else holds it, in place */
        run_piece(o, &a->st, &a->grad, a->off, w + (p0 - start), ob->w + (p0 - start), p0, (size_t)(p1 - p0));
    }
}

/* a->req does [off, split) and the rest of the fresh blocks; a->req2, when
 * the update is split, [split, off+n). */
static void apply_work(uv_work_t *req)
{
    srv_apply *a = req->data;
    if (req == &a->req)
        apply_range(a, a->off, a->split, 1);
    else
        apply_range(a, a->split, a->off + a->n, 0);
}

void srv_apply_free(psd *s)
{
    srv_apply *a = s->apply_job;
    if (a) {
        free(a->old);
        free(a->fresh);
        free(a);
        s->apply_job = NULL;
    }
}

static void bsp_round_closed(psd *s);

static void apply_after(uv_work_t *req, int status)
{
    srv_apply *a = req->data;
    psd *s = a->s;
    srv_model *m = &s->model;
    (void)status; /* work queued on a running loop is never cancelled */
    if (--a->parts > 0)
        return; /* the other half is still running */
    srv_model_install(m, a->first, a->nblk, a->old, a->fresh);
    if (a->round) {
        bsp_round_closed(s);
    } else if (a->fin) {
        srv_model_bump(m);
        a->w->clock++;
    }
    s->applying = NULL;
    srv_push_done(s, a);
    if (a->c->free_later)
        srv_conn_free(a->c);
    /* the pulls that waited for this update first, then the frames held
     * meanwhile (their pulls come after) */
    if (a->fin || a->round)
        srv_answer_parked(s);
    srv_resume_held(s);
    if (s->reload_pending && !s->applying) {
        s->reload_pending = 0;
        srv_reload(s);
    }
}

/* The job for an update of nblk blocks: psd's one, grown when needed. */
static srv_apply *apply_job(psd *s, size_t nblk)
{
    srv_apply *a = s->apply_job;
    if (!a && !(a = s->apply_job = calloc(1, sizeof *a)))
        return NULL;
    if (a->cap < nblk) {
        srv_blk **o = realloc(a->old, nblk * sizeof *o);
        if (o)
            a->old = o;
        srv_blk **f = realloc(a->fresh, nblk * sizeof *f);
        if (f)
            a->fresh = f;
        if (!o || !f)
            return NULL;
        a->cap = nblk;
    }
    return a;
}

/* psd's job for an update of [off, off+n) by gr, its blocks reserved
 * (srv_model_reserve); NULL when memory is short, with nothing changed.
 * Allocates nothing in steady state: the job is kept, blocks come from the
 * pool. */
static srv_apply *apply_prepare(psd *s, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    size_t first = (size_t)(off >> SRV_BLK_SHIFT);
    size_t nblk = (size_t)(((off + n - 1) >> SRV_BLK_SHIFT) - first + 1);
    srv_apply *a = apply_job(s, nblk);
    if (!a || srv_model_reserve(&s->model, first, nblk, a->old, a->fresh) != 0)
        return NULL;
    a->first = first;
    a->nblk = nblk;
    a->s = s;
    a->st = *st;
    a->grad = *gr;
    a->off = off;
    a->n = n;
    a->split = off + n;
    a->parts = 1;
    a->req.data = a;
    a->req2.data = a;
    return a;
}

/* Applies the update on the loop, all or nothing: returns 0, or PS_ENOMEM
 * when a shared block could not be copied (then nothing is applied). */
static int apply_sync(psd *s, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    assert(!s->applying); /* psd's one job is free: no message is handled meanwhile */
    srv_apply *a = apply_prepare(s, st, gr, off, n);
    if (!a)
        return PS_ENOMEM;
    apply_work(&a->req);
    srv_model_install(&s->model, a->first, a->nblk, a->old, a->fresh);
    return 0;
}

/* Starts the update of [off, off+n) by gr off the loop, for the push of
 * worker w (whose connection then reads nothing until it is done); gr's
 * arrays must stay until then. Returns 0, or -1 when it cannot (no memory:
 * the caller applies it on the loop). */
static int apply_off_loop(psd *s, srv_worker *w, const srv_optim_step *st, const srv_grad *gr, uint64_t off,
                          uint64_t n, int fin, int round)
{
    srv_apply *a = apply_prepare(s, st, gr, off, n);
    if (!a)
        return -1;
    a->c = w->conn;
    a->w = w;
    a->fin = fin;
    a->round = round;
    if (n >= APPLY_SPLIT_MIN && gr->nsrc <= MEAN_SOURCES_ON_STACK) {
        /* two threads: a round's workers are waiting, and one thread does
         * not use the memory bandwidth the cores have together (not with
         * more sources than round_mean keeps on its stack: both halves
         * would share gr->xs) */
        a->split = off + n / 2;
        a->parts = 2;
        if (uv_queue_work(s->loop, &a->req2, apply_work, apply_after) != 0) {
            a->split = off + n;
            a->parts = 1;
        }
    }
    /* fails only without a work callback: never after the first succeeded */
    if (uv_queue_work(s->loop, &a->req, apply_work, apply_after) != 0) {
        for (size_t i = 0; i < a->nblk; i++)
            srv_blk_unref(a->fresh[i]);
        return -1;
    }
    s->applying = a;
    uv_read_stop((uv_stream_t *)&a->c->tcp); /* a push's g lives in its receive buffer */
    return 0;
}

/* Applies g to [off, off+n) now, as ASGD and SSP do; a fin chunk completes
 * the step and makes a new version. Staleness scaling and DC-ASGD (asgd
 * only) transform g into the scratch buffer first. */
static int apply_now(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                     int compensate, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    uint64_t stale = m->version - base;
    int scale = compensate && s->cfg.staleness_scale && stale > 0;
    int dc = compensate && s->cfg.dc_lambda > 0 && w->base_snap && stale > 0;
    if (scale || dc) {
        float *t = scratch(s);
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
                const float *wb = srv_snap_at(w->base_snap, off + done, n - done, &blen);
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
    srv_optim_step st;
    srv_grad gr = {.g = g};
    begin_update(m, &st, &gr, off, n);
    if (n >= APPLY_OFF_LOOP_MIN && w->conn && apply_off_loop(s, w, &st, &gr, off, n, fin, 0) == 0)
        return SRV_PENDING;
    if (apply_sync(s, &st, &gr, off, n) != 0) {
        snprintf(err, errlen, "out of memory for a copy of a model block");
        return PS_ENOMEM;
    }
    if (fin) {
        srv_model_bump(m);
        w->clock++;
        srv_answer_parked(s);
    }
    return 0;
}

/* ---- ASGD ---------------------------------------------------------------- */

static int asgd_push(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                     char *err, size_t errlen)
{
    int rc = check_range(s, off, n, err, errlen);
    if (rc == 0)
        rc = check_base(s, base, err, errlen);
    if (rc != 0)
        return rc;
    return apply_now(s, w, base, off, g, n, fin, 1, err, errlen);
}

static void noop_member(psd *s, srv_worker *w)
{
}

static void noop_destroy(psd *s)
{
}

const srv_policy_ops srv_policy_asgd = {
    .name = "asgd",
    .push = asgd_push,
    .worker_left = noop_member,
    .worker_joined = noop_member,
    .pull_ready = NULL,
    .destroy = noop_destroy,
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

static int ssp_push(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                    char *err, size_t errlen)
{
    int rc = check_range(s, off, n, err, errlen);
    if (rc == 0)
        rc = check_base(s, base, err, errlen);
    if (rc != 0)
        return rc;
    return apply_now(s, w, base, off, g, n, fin, 0, err, errlen);
}

static int ssp_pull_ready(psd *s, srv_conn *c, uint64_t min)
{
    if (!s->model.initialized || s->model.version < min)
        return 0;
    if (!c->worker)
        return 1;
    uint64_t slowest = ssp_min_clock(s, NULL);
    return slowest == UINT64_MAX || c->worker->clock <= slowest + (uint64_t)s->cfg.staleness;
}

static void ssp_joined(psd *s, srv_worker *w)
{
    /* A newcomer (or a worker back from the dead) starts level with the
     * slowest live worker, so it does not hold the others back; and the
     * others may have been waiting for it. */
    uint64_t slowest = ssp_min_clock(s, w);
    if (slowest != UINT64_MAX && w->clock < slowest)
        w->clock = slowest;
    srv_answer_parked(s);
}

static void ssp_left(psd *s, srv_worker *w)
{
    /* the slowest may have gone: waiting pulls may now be answerable */
    srv_answer_parked(s);
}

const srv_policy_ops srv_policy_ssp = {
    .name = "ssp",
    .push = ssp_push,
    .worker_left = ssp_left,
    .worker_joined = ssp_joined,
    .pull_ready = ssp_pull_ready,
    .destroy = noop_destroy,
};

/* ---- BSP ----------------------------------------------------------------- */

typedef struct bsp_state {
    float *acc;     /* the round's sum (arrival order only) */
    float **src;    /* the gradients a round's mean sums, in order */
    const float *const **blk; /* and their blocks kept apart (srv_grad.blk) */
    const float **xs;
    size_t src_cap;
    uint32_t count; /* complete pushes in the current round */
    uint64_t round_start_ms;
} bsp_state;

/* Pushes that close a round: the workers that are not gone (M less those
 * that joined once and left or died), less the backup workers; at least 1. */
static uint32_t bsp_needed(psd *s)
{
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
        b->round_start_ms = srv_now_ms();
        s->policy_state = b;
    }
    return b;
}

/* ---- a worker's gradient for the round (shard-order sums) ----------------- */

/* Floats in block i of a model of total. */
static uint64_t block_len(size_t total, size_t i)
{
    uint64_t start = (uint64_t)i << SRV_BLK_SHIFT;
    return total - start < SRV_BLK_FLOATS ? total - start : SRV_BLK_FLOATS;
}

/* Room for w's kept blocks, once the model's block count is known. */
static int kept_init(srv_worker *w, size_t nblk)
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

static void spare_put(srv_worker *w, srv_rbuf r)
{
    if (!r.mem)
        return;
    if (w->nspare < w->nkept + 1)
        w->spare[w->nspare++] = r;
    else
        free(r.mem);
}

/* Block i is no longer kept apart (its buffer becomes a spare). */
static void kept_forget(srv_worker *w, size_t i)
{
    spare_put(w, w->kept[i]);
    w->kept[i] = (srv_rbuf){0};
    w->kept_at[i] = NULL;
}

/* A new round for w: the last round's blocks are applied, their buffers
 * spares, and the slot's contents stale. */
static void kept_release(srv_worker *w)
{
    for (size_t i = 0; i < w->nkept; i++)
        kept_forget(w, i);
    w->slot_clean = 0;
}

/* w->slot allocated, and with zero set, holding zeros wherever this round
 * wrote nothing. */
static int slot_ready(srv_worker *w, size_t total, int zero)
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
static int source_ready(srv_worker *w, size_t total)
{
    for (size_t i = 0; i < w->nkept; i++)
        if (!w->kept_at[i])
            return slot_ready(w, total, 1);
    return w->nkept ? 0 : slot_ready(w, total, 1);
}

/* Keeps w's push of g for [off, off+n) until the round closes:
 * - a whole model widened from bfloat16 into the connection's buffer:
 *   that buffer becomes the slot, and the connection gets the old slot to
 *   widen its next push into;
 * - one whole block as float32 in the frame it arrived in: the receive
 *   buffer is taken from the connection (a spare given in exchange), and
 *   the block is read there when the round closes;
 * - anything else is copied into the slot.
 * So a worker pushing as psworker does (one frame a block) is never
 * copied, and after the first rounds nothing is allocated. */
static int keep_push(psd *s, srv_worker *w, uint64_t off, const float *g, uint64_t n)
{
    size_t total = s->model.layout.total;
    size_t nblk = (size_t)((total + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT);
    if (kept_init(w, nblk) != 0)
        return -1;
    int widened = s->push_buf && *s->push_buf == g;
    if (widened && off == 0 && n == total) {
        float *old = w->slot;
        w->slot = *s->push_buf;
        *s->push_buf = old;
        *s->push_buf_cap = old ? total : 0;
        for (size_t i = 0; i < nblk; i++)
            kept_forget(w, i);
        w->slot_clean = 1;
        return 0;
    }
    size_t first = (size_t)(off >> SRV_BLK_SHIFT);
    if (!widened && off == (uint64_t)first << SRV_BLK_SHIFT && n == block_len(total, first) && w->conn) {
        srv_rbuf repl = w->nspare ? w->spare[--w->nspare] : (srv_rbuf){0};
        srv_rbuf got;
        if (srv_conn_give_rbuf(w->conn, g, repl, &got) == 0) {
            kept_forget(w, first); /* the same block pushed twice: the last counts */
            w->kept[first] = got;
            w->kept_at[first] = g;
            return 0;
        }
        spare_put(w, repl);
    }
    int whole = off == 0 && n == total;
    if (slot_ready(w, total, !whole) != 0)
        return -1;
    size_t last = (size_t)((off + n - 1) >> SRV_BLK_SHIFT);
    for (size_t i = first; i <= last; i++) {
        if (!w->kept_at[i])
            continue;
        /* part of a kept block pushed again: the rest of it moves to the
         * slot (a whole block is simply overwritten there) */
        uint64_t bs = (uint64_t)i << SRV_BLK_SHIFT, bl = block_len(total, i);
        if (!(off <= bs && off + n >= bs + bl))
            memcpy(w->slot + bs, w->kept_at[i], (size_t)bl * sizeof(float));
        kept_forget(w, i);
    }
    memcpy(w->slot + off, g, (size_t)n * sizeof(float));
    if (whole)
        w->slot_clean = 1;
    return 0;
}

void srv_worker_free_round(srv_worker *w)
{
    free(w->slot);
    for (size_t i = 0; i < w->nkept; i++)
        free(w->kept[i].mem);
    for (size_t i = 0; i < w->nspare; i++)
        free(w->spare[i].mem);
    free(w->kept);
    free(w->kept_at);
    free(w->spare);
}

/* The round's update is applied: a new version. */
static void bsp_round_closed(psd *s)
{
    bsp_state *b = s->policy_state;
    uint64_t round = s->model.version;
    srv_model_bump(&s->model);
    s->stats.rounds++;
    uint64_t now = srv_now_ms();
    srv_hist_observe(&s->stats.round_seconds, (double)(now - b->round_start_ms) / 1000.0);
    PS_LOG(PS_LOG_DEBUG, "round %llu closed with %u pushes in %llu ms", (unsigned long long)round, b->count,
           (unsigned long long)(now - b->round_start_ms));
    b->round_start_ms = now;
    b->count = 0;
}

/* Closes the round when enough pushes are in: applies their mean, made
 * piece by piece from the shards' gradients in shard order (or from the
 * arrival-order sum), never as a model-sized array. closer is the worker
 * whose push completed the round (NULL when a membership change closes
 * it): for a big model the update then runs off the loop and this returns
 * SRV_PENDING (the closer's reply waits for it); otherwise 0. */
static int bsp_try_close(psd *s, srv_worker *closer)
{
    bsp_state *b = s->policy_state;
    if (!b || b->count == 0 || b->count < bsp_needed(s) || s->applying)
        return 0;
    size_t total = s->model.layout.total;
    uint64_t round = s->model.version;
    srv_grad gr = {.inv = 1.0f / (float)b->count};
    if (b->src_cap < s->nworkers_cap + 1) {
        size_t cap = s->nworkers_cap + 1;
        float **p = realloc(b->src, cap * sizeof *p);
        if (p)
            b->src = p;
        const float *const **q = realloc(b->blk, cap * sizeof *q);
        if (q)
            b->blk = q;
        const float **x = realloc(b->xs, cap * sizeof *x);
        if (x)
            b->xs = x;
        if (!p || !q || !x) {
            PS_LOG(PS_LOG_ERROR, "out of memory closing round %llu; it stays open", (unsigned long long)round);
            return 0;
        }
        b->src_cap = cap;
    }
    gr.src = b->src;
    gr.blk = b->blk;
    gr.xs = b->xs;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        /* in shard order, so the result does not depend on arrival order */
        for (uint32_t i = 0; i < s->nworkers_cap; i++) {
            srv_worker *w = s->workers[i];
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
    srv_optim_step st;
    begin_update(&s->model, &st, &gr, 0, total);
    if (closer && closer->conn && total >= APPLY_OFF_LOOP_MIN &&
        apply_off_loop(s, closer, &st, &gr, 0, total, 1, 1) == 0)
        return SRV_PENDING;
    if (apply_sync(s, &st, &gr, 0, total) != 0) {
        /* nothing applied: the round stays open, tried again on psd's tick */
        PS_LOG(PS_LOG_ERROR, "out of memory copying a model block closing round %llu; it stays open",
               (unsigned long long)round);
        return 0;
    }
    bsp_round_closed(s);
    srv_answer_parked(s);
    return 0;
}

static int bsp_push(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                    char *err, size_t errlen)
{
    int rc = check_range(s, off, n, err, errlen);
    if (rc == 0)
        rc = check_base(s, base, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t round = s->model.version;
    if (base < round) {
        snprintf(err, errlen, "push for round %llu arrived after it closed (round %llu is open); dropped",
                 (unsigned long long)base, (unsigned long long)round);
        return PS_ESTALE;
    }
    if (w->round == round && w->round_fin) {
        snprintf(err, errlen, "shard %u already pushed for round %llu", w->shard, (unsigned long long)round);
        return PS_EDUPLICATE;
    }
    bsp_state *b = bsp_get(s, err, errlen);
    if (!b)
        return PS_ENOMEM;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        if (w->round != round)
            kept_release(w); /* the last round's are applied: spares now */
        if (keep_push(s, w, off, g, n) != 0) {
            snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
            return PS_ENOMEM;
        }
    } else {
        for (uint64_t j = 0; j < n; j++)
            b->acc[off + j] += g[j];
    }
    w->round = round;
    w->round_fin = 0;
    if (fin) {
        w->round_fin = 1;
        w->clock++;
        b->count++;
        return bsp_try_close(s, w);
    }
    return 0;
}

static void bsp_membership(psd *s, srv_worker *w)
{
    bsp_try_close(s, NULL);
}

/* A round that memory kept from closing (every push is in) closes here. */
static void bsp_tick(psd *s)
{
    bsp_try_close(s, NULL);
}

static void bsp_destroy(psd *s)
{
    bsp_state *b = s->policy_state;
    if (b) {
        free(b->acc);
        free(b->src);
        free(b->blk);
        free(b->xs);
        free(b);
        s->policy_state = NULL;
    }
}

const srv_policy_ops srv_policy_bsp = {
    .name = "bsp",
    .push = bsp_push,
    .worker_left = bsp_membership,
    .worker_joined = bsp_membership,
    .pull_ready = NULL,
    .tick = bsp_tick,
    .destroy = bsp_destroy,
};
