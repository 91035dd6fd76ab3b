/* update.c - the update engine: applies a gradient (a push's floats, or a
 * BSP round's mean made piece by piece from the kept pushes) to a range of
 * the model through the optimizer, into copy-on-write blocks reserved
 * first (srv_model_reserve), so that running out of memory changes
 * nothing. It owns the update being applied off the loop (psd.upd): while
 * one runs on libuv's thread pool psd handles no message; when it is done
 * the engine installs the fresh blocks and calls the done callback the
 * connection layer registered (srv_update_init). It knows nothing of
 * policies, connections or replies. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/vec.h"
#include "proto/errors.h"
#include "server/replog/replog.h"
#include "server/update/update.h"

/* One update: its range, gradient, the optimizer's constants for it and
 * the blocks it reads and writes. psd keeps one (psd.upd.job) and reuses
 * it, so no update allocates in steady state. */
struct srv_update_job {
    uv_work_t req;           /* [off, split) */
    uv_work_t req2;          /* [split, off+n), when the update is split */
    uint64_t split;
    int parts;               /* halves still running */
    int parts_total;         /* halves it runs in (1 or 2) */
    psd *s;
    srv_optim_step st;
    srv_grad grad;           /* a push's floats (in its receive buffer) or a round's mean */
    uint64_t off, n;
    size_t first, nblk;      /* blocks touched */
    srv_blk **old, **fresh;  /* the model's blocks and their new values (NULL:
                              * updated in place); room for cap of each */
    size_t cap;
    srv_update_tag tag;      /* the caller's, handed back to the done callback */
    int make_finite;         /* nonfinite = clip: results made finite (on the loop only) */
    int record;              /* goes into the replication log as its gradient once installed */
    srv_blk *taken;          /* the receive buffer the log took with the gradient in it (record) */
    size_t made_finite;      /* values that were not */
    float *st1, *st2;        /* the optimizer's state buffers (NULL: none) */
    struct mags {
        float w, s1, s2;     /* the largest |value| written: parameters, state */
    } mag[2];                /* per part (a->req, a->req2) */
};

/* ---- updates applied off the loop ------------------------------------------
 *
 * An update of at least APPLY_OFF_LOOP_MIN floats (a few milliseconds of
 * memory traffic) runs on libuv's thread pool, so that psd's loop goes on
 * moving other workers' bytes meanwhile. Until it is done the loop handles
 * no message and answers no pull (srv_update_job), so no reply can take a new
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

/* The largest magnitudes among n values written at parameter off: the
 * parameters at w, the state buffers at the same offset. */
static void measure(struct mags *mg, const float *w, const float *st1, const float *st2, uint64_t off, size_t n)
{
    float x = ps_vec_maxabs(w, n);
    mg->w = x > mg->w || x != x ? x : mg->w; /* a NaN stays */
    if (st1) {
        x = ps_vec_maxabs(st1 + off, n);
        mg->s1 = x > mg->s1 || x != x ? x : mg->s1;
    }
    if (st2) {
        x = ps_vec_maxabs(st2 + off, n);
        mg->s2 = x > mg->s2 || x != x ? x : mg->s2;
    }
}

/* 1 when a buffer lies in parameters [off, off+len). */
static int has_buffers(const ps_layout *l, uint64_t off, size_t len)
{
    for (uint32_t i = 0; i < l->ntensors; i++)
        if (l->t[i].buf && l->t[i].offset < off + len && off < l->t[i].offset + l->t[i].count)
            return 1;
    return 0;
}

/* Zeroes v's values of buffers: v holds parameters [off, off+len). */
static void zero_buffers(const ps_layout *l, uint64_t off, float *v, size_t len)
{
    for (uint32_t i = 0; i < l->ntensors && l->nbuf; i++) {
        const ps_tensor_desc *t = &l->t[i];
        uint64_t a = t->offset > off ? t->offset : off, b = t->offset + t->count < off + len ? t->offset + t->count
                                                                                             : off + len;
        if (t->buf && a < b)
            memset(v + (a - off), 0, (size_t)(b - a) * sizeof(float));
    }
}

/* The buffers among parameters [off, off+len), which the optimizer has
 * just written to wo from wi: each takes its rule's value instead. g: the
 * piece's gradient (a round's mean); a->grad says where a push's own
 * values or a round's first source are. */
static void set_buffers(srv_update_job *a, float *wo, const float *wi, const float *g, uint64_t off, size_t len)
{
    const ps_layout *l = &a->s->model.layout;
    const srv_grad *gr = &a->grad;
    float first[MEAN_PIECE];
    int have_first = 0;
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        uint64_t lo = t->offset > off ? t->offset : off, hi = t->offset + t->count < off + len ? t->offset + t->count
                                                                                              : off + len;
        if (!t->buf || lo >= hi)
            continue;
        size_t j0 = (size_t)(lo - off), j1 = (size_t)(hi - off);
        if (gr->nsrc) {
            /* a round: its mean, or its first source's values */
            const float *v = g;
            if (t->buf == PS_BUF_FIRST && !gr->zero_src) {
                if (!have_first) {
                    srv_grad one = *gr;
                    one.nsrc = 1;
                    one.inv = 1.0f;
                    round_mean(&one, off, len, first);
                    have_first = 1;
                }
                v = first;
            }
            memcpy(wo + j0, v + j0, (j1 - j0) * sizeof(float));
            continue;
        }
        const float *v = (gr->raw ? gr->raw : gr->g) + (off - a->off);
        if (t->buf == PS_BUF_FIRST) {
            /* shard 0's values; the others' leave the buffer as it was */
            memcpy(wo + j0, gr->from_first ? v + j0 : wi + j0, (j1 - j0) * sizeof(float));
        } else {
            /* a running mean of the workers' values: each push moves the
             * buffer 1/workers of the way to its own */
            float k = 1.0f / (float)(a->s->cfg.workers > 0 ? a->s->cfg.workers : 1);
            for (size_t j = j0; j < j1; j++)
                wo[j] = wi[j] + (v[j] - wi[j]) * k;
        }
    }
}

/* Applies gr's gradient to [off, off+len), which lies in one block: reads
 * the parameters from wi, writes them to wo. base is the update's first
 * parameter (a push's g starts there). In pieces that stay in the L1
 * cache, each measured (into mg) right after the optimizer wrote it: the
 * bounds the engine keeps cost no pass over memory of their own. */
static void run_piece(srv_update_job *a, struct mags *mg, float *wo, const float *wi, uint64_t off, size_t len)
{
    srv_optim *o = &a->s->model.opt;
    const srv_grad *gr = &a->grad;
    float tmp[MEAN_PIECE], old[MEAN_PIECE];
    for (size_t x = 0; x < len;) {
        size_t l = piece_len(off + x, len - x);
        const float *g = gr->g + (off + x - a->off);
        if (gr->nsrc) {
            round_mean(gr, off + x, l, tmp);
            if (gr->zero_src)
                memset(gr->src[0] + off + x, 0, l * sizeof(float));
            g = tmp;
        }
        /* buffers here: their values before the optimizer (which may
         * write in place) are what their rules start from */
        int bufs = a->s->model.layout.nbuf && has_buffers(&a->s->model.layout, off + x, l);
        if (bufs)
            memcpy(old, wi + x, l * sizeof(float));
        srv_optim_run(o, &a->st, wo + x, wi + x, g, off + x, l);
        if (a->make_finite)
            a->made_finite += srv_optim_make_finite(o, wo + x, off + x, l);
        if (bufs)
            set_buffers(a, wo + x, old, g, off + x, l);
        measure(mg, wo + x, a->st1, a->st2, off + x, l);
        x += l;
    }
}

/* The update's constants; for a round, the clip factor needs the norm of
 * the mean, taken piece by piece when clipping is on (and, with buffers,
 * for a push too: a buffer's values are no gradient). */
static void begin_update(srv_model *m, srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    if (!gr->nsrc && m->layout.nbuf && m->opt.clip_norm > 0) {
        float tmp[MEAN_PIECE];
        srv_sumsq ss = {{0}, 0};
        for (uint64_t x = 0; x < n;) {
            size_t l = piece_len(off + x, n - x);
            memcpy(tmp, gr->g + x, l * sizeof(float));
            zero_buffers(&m->layout, off + x, tmp, l);
            srv_sumsq_add(&ss, tmp, l);
            x += l;
        }
        srv_optim_begin_sumsq(&m->opt, st, srv_sumsq_total(&ss), m->version);
        return;
    }
    if (!gr->nsrc || !(m->opt.clip_norm > 0)) {
        srv_optim_begin(&m->opt, st, gr->nsrc ? NULL : gr->g, gr->nsrc ? 0 : n, m->version);
        return;
    }
    float tmp[MEAN_PIECE];
    srv_sumsq ss = {{0}, 0};
    for (uint64_t x = 0; x < n;) {
        size_t l = piece_len(off + x, n - x);
        round_mean(gr, off + x, l, tmp);
        zero_buffers(&m->layout, off + x, tmp, l);
        srv_sumsq_add(&ss, tmp, l);
        x += l;
    }
    srv_optim_begin_sumsq(&m->opt, st, srv_sumsq_total(&ss), m->version);
}

/* Part of a's update: [lo, hi) of [off, off+n), block by block, from the
 * old blocks into the fresh ones (or in place); with copy_rest, also the
 * parts of fresh blocks the update leaves alone. mg: the part's magnitudes. */
static void apply_range(srv_update_job *a, uint64_t lo, uint64_t hi, int copy_rest, struct mags *mg)
{
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
        run_piece(a, mg, w + (p0 - start), ob->w + (p0 - start), p0, (size_t)(p1 - p0));
    }
}

/* a->req does [off, split) and the rest of the fresh blocks; a->req2, when
 * the update is split, [split, off+n). */
static void apply_work(uv_work_t *req)
{
    srv_update_job *a = req->data;
    if (req == &a->req)
        apply_range(a, a->off, a->split, 1, &a->mag[0]);
    else
        apply_range(a, a->split, a->off + a->n, 0, &a->mag[1]);
}

/* The magnitudes a's update wrote widen the model's bounds: the values
 * outside its range are as before, so a bound only grows (a NaN, from
 * nonfinite = clip's inf - inf, makes them unusable until measured). */
static void bounds_widen(srv_model *m, const srv_update_job *a)
{
    for (int i = 0; i < a->parts_total; i++) {
        const struct mags *g = &a->mag[i];
        if (g->w != g->w || g->s1 != g->s1 || g->s2 != g->s2)
            m->bound_ok = 0;
        m->bound_w = g->w > m->bound_w ? g->w : m->bound_w;
        m->bound_s1 = g->s1 > m->bound_s1 ? g->s1 : m->bound_s1;
        m->bound_s2 = g->s2 > m->bound_s2 ? g->s2 : m->bound_s2;
    }
}

void srv_update_free(psd *s)
{
    srv_update_job *a = s->upd.job;
    if (a) {
        free(a->old);
        free(a->fresh);
        free(a);
        s->upd.job = NULL;
    }
}

/* The nonfinite setting gr's update follows (enum ps_nonfinite). */
static int nonfinite_of(const psd *s, const srv_grad *gr)
{
    return gr->nonfinite ? gr->nonfinite - 1 : s->cfg.nonfinite;
}

/* An update applied as its gradient goes into the replication log (in the
 * receive buffer the log took, when it took it). */
static void log_grad(psd *s, const srv_grad *gr, uint64_t off, uint64_t n, srv_blk *taken)
{
    srv_replog_grad(s, off, n, gr->g, gr->has_gmax, gr->gmax, gr->from_first,
                    nonfinite_of(s, gr) == PS_NONFINITE_CLIP, taken);
}

/* Back on the loop once every part is done: the fresh blocks go into the
 * model, the engine is free, and the caller's done callback hears of it. */
static void apply_after(uv_work_t *req, int status)
{
    srv_update_job *a = req->data;
    psd *s = a->s;
    (void)status; /* work queued on a running loop is never cancelled */
    if (--a->parts > 0)
        return; /* the other half is still running */
    srv_model_install(&s->model, a->first, a->nblk, a->old, a->fresh);
    bounds_widen(&s->model, a);
    s->upd.running = NULL;
    if (a->record)
        log_grad(s, &a->grad, a->off, a->n, a->taken);
    a->taken = NULL;
    s->upd.done(s, &a->tag);
}

/* The job for an update of nblk blocks: psd's one, grown when needed. */
static srv_update_job *apply_job(psd *s, size_t nblk)
{
    srv_update_job *a = s->upd.job;
    if (!a && !(a = s->upd.job = calloc(1, sizeof *a)))
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
static srv_update_job *apply_prepare(psd *s, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    size_t first = (size_t)(off >> SRV_BLK_SHIFT);
    size_t nblk = (size_t)(((off + n - 1) >> SRV_BLK_SHIFT) - first + 1);
    srv_update_job *a = apply_job(s, nblk);
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
    a->parts = a->parts_total = 1;
    a->make_finite = 0;
    a->made_finite = 0;
    memset(a->mag, 0, sizeof a->mag);
    float *bufs[2] = {NULL, NULL};
    srv_optim_state_buffers(&s->model.opt, bufs, NULL, 2);
    a->st1 = bufs[0];
    a->st2 = bufs[1];
    a->req.data = a;
    a->req2.data = a;
    return a;
}

/* Applies the update on the loop, all or nothing: returns 0, or PS_ENOMEM
 * when a shared block could not be copied (then nothing is applied). With
 * make_finite, every result that is not finite is made so; *made counts
 * them. */
static int apply_sync(psd *s, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n,
                      int make_finite, size_t *made)
{
    assert(!s->upd.running); /* psd's one job is free: no message is handled meanwhile */
    srv_update_job *a = apply_prepare(s, st, gr, off, n);
    if (!a)
        return PS_ENOMEM;
    a->make_finite = make_finite;
    apply_work(&a->req);
    *made = a->made_finite;
    srv_model_install(&s->model, a->first, a->nblk, a->old, a->fresh);
    bounds_widen(&s->model, a);
    return 0;
}

/* Starts the update of [off, off+n) by gr off the loop; gr's arrays must
 * stay until it is done. Returns 0, or -1 when it cannot (no memory: the
 * caller applies it on the loop). */
static int apply_off_loop(psd *s, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n,
                          const srv_update_tag *tag)
{
    srv_update_job *a = apply_prepare(s, st, gr, off, n);
    if (!a)
        return -1;
    a->tag = *tag;
    if (n >= APPLY_SPLIT_MIN && gr->nsrc <= MEAN_SOURCES_ON_STACK) {
        /* two threads: a round's workers are waiting, and one thread does
         * not use the memory bandwidth the cores have together (not with
         * more sources than round_mean keeps on its stack: both halves
         * would share gr->xs) */
        a->split = off + n / 2;
        a->parts = a->parts_total = 2;
        if (uv_queue_work(s->loop, &a->req2, apply_work, apply_after) != 0) {
            a->split = off + n;
            a->parts = a->parts_total = 1;
        }
    }
    /* fails only without a work callback: never after the first succeeded */
    if (uv_queue_work(s->loop, &a->req, apply_work, apply_after) != 0) {
        for (size_t i = 0; i < a->nblk; i++)
            srv_blk_unref(a->fresh[i]);
        return -1;
    }
    s->upd.running = a;
    return 0;
}

/* ---- results that would not be finite ------------------------------------- */

/* 1 when applying gr to [off, off+n) with st leaves every parameter and
 * the optimizer's state finite: the update run on copies, piece by piece,
 * before anything is written (finite pushes can still overflow a float:
 * three pushes of -3.4e38 with lr 0.5). */
static int update_finite(srv_model *m, const srv_optim_step *st, const srv_grad *gr, uint64_t off, uint64_t n)
{
    float tmp[MEAN_PIECE];
    for (uint64_t x = 0; x < n;) {
        size_t l = piece_len(off + x, n - x), got;
        const float *wi = srv_model_at(m, off + x, l, &got);
        assert(got == l); /* a piece lies within one block */
        const float *g = gr->g + x;
        if (gr->nsrc) {
            round_mean(gr, off + x, l, tmp);
            g = tmp;
        }
        if (!srv_optim_finite(&m->opt, st, wi, g, off + x, l))
            return 0;
        x += l;
    }
    return 1;
}

/* ---- the entry point ------------------------------------------------------ */

void srv_update_init(psd *s, srv_update_done_cb done)
{
    s->upd.done = done;
    s->grad_apply = srv_update_replay;
}

int srv_update_replay(psd *s, const srv_replay *rp, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    srv_model_set_version(m, rp->version);
    srv_grad gr = {.g = rp->g, .has_gmax = rp->has_gmax, .gmax = rp->gmax, .raw = rp->g,
                   .from_first = rp->from_first, .nonfinite = 1 + (rp->clip ? PS_NONFINITE_CLIP : PS_NONFINITE_REJECT)};
    int rc = srv_update_apply(s, &gr, rp->off, rp->n, NULL);
    if (rc == PS_ENONFINITE)
        return ps_fail(err, errlen, rc, "the leader's update of [%llu, %llu) at version %llu would not be finite "
                       "here", (unsigned long long)rp->off, (unsigned long long)(rp->off + rp->n),
                       (unsigned long long)rp->version);
    if (rc != 0)
        return ps_fail(err, errlen, rc, "no memory to apply the leader's update");
    return 0;
}

int srv_update_busy(const psd *s)
{
    return s->upd.running != NULL;
}

/* The model's bounds measured: one pass over the parameters and the
 * state, on the loop, once after values came from outside the engine (the
 * initial values, a checkpoint); the engine's updates keep them from then
 * on. Unusable (-1) when a sum of squares is negative (a checkpoint's). */
static void bounds_measure(srv_model *m)
{
    float w = 0;
    for (size_t i = 0; i < m->nblk; i++) {
        float x = ps_vec_maxabs(m->blk[i]->w, m->blk[i]->cap);
        w = x > w ? x : w;
    }
    float *bufs[2] = {NULL, NULL};
    size_t nb = srv_optim_state_buffers(&m->opt, bufs, NULL, 2);
    float sm[2] = {0, 0};
    int ok = isfinite(w);
    for (size_t k = 0; k < nb && k < 2; k++) {
        sm[k] = ps_vec_maxabs(bufs[k], m->opt.n);
        ok &= isfinite(sm[k]);
    }
    if (ok)
        ok = srv_optim_state_valid(&m->opt);
    m->bound_w = w;
    m->bound_s1 = sm[0];
    m->bound_s2 = sm[1];
    m->bound_ok = ok ? 1 : -1;
}

int srv_update_apply(psd *s, const srv_grad *gr, uint64_t off, uint64_t n, const srv_update_tag *tag)
{
    assert(!s->upd.running);
    srv_model *m = &s->model;
    /* with followers: the gradient into the log once applied, or the range
     * marked for the log's next flush (its values shipped) */
    int record = gr->as_sent && !gr->nsrc && srv_replog_grad_ok(s, n);
    if (!record)
        srv_model_mark(m, off, n);
    srv_optim_step st;
    begin_update(m, &st, gr, off, n);
    if (m->bound_ok == 0)
        bounds_measure(m);
    /* Finite pushes can still overflow a parameter or the state. Where the
     * bounds of the gradient, the parameters and the state show that no
     * value can come near FLT_MAX, the update is applied at once (its pass,
     * on the thread pool for a big one, widens the bounds); otherwise it is
     * first tried on copies here, and refused or clipped. */
    int sure = gr->has_gmax && m->bound_ok == 1 &&
               srv_optim_surely_finite(&m->opt, &st, gr->gmax, m->bound_w, m->bound_s1, m->bound_s2);
    int clip = 0;
    if (!sure && !update_finite(m, &st, gr, off, n)) {
        if (nonfinite_of(s, gr) != PS_NONFINITE_CLIP) {
            SRV_COUNT(s, nonfinite_updates, 1);
            PS_LOG(PS_LOG_WARN, "an update of [%llu, %llu) would make parameters or optimizer state infinite or "
                                "NaN: refused, the model unchanged (nonfinite = reject)",
                   (unsigned long long)off, (unsigned long long)(off + n));
            return PS_ENONFINITE;
        }
        clip = 1; /* applied on the loop, its results made finite */
    }
    /* the log takes the buffer the gradient came in, to send it from there */
    srv_blk *taken = record && gr->conn ? srv_replog_take(s, gr->conn, gr->g) : NULL;
    /* not Hogwild!'s segment (at most one block: short on the loop), which
     * a snapshot copies on the loop at any time */
    if (!clip && tag && s->upd.done && n >= APPLY_OFF_LOOP_MIN && !m->hw &&
        apply_off_loop(s, &st, gr, off, n, tag) == 0) {
        s->upd.running->record = record;
        s->upd.running->taken = taken;
        return SRV_PENDING;
    }
    size_t made = 0;
    int rc = apply_sync(s, &st, gr, off, n, clip, &made);
    if (rc == 0 && record)
        log_grad(s, gr, off, n, taken);
    else
        srv_blk_unref(taken); /* nothing applied: no record */
    if (rc == 0 && clip) {
        SRV_COUNT(s, clipped_updates, 1);
        PS_LOG(PS_LOG_WARN, "an update of [%llu, %llu) made %zu values infinite or NaN: made finite "
                            "(nonfinite = clip: NaN 0, +-inf +-FLT_MAX)",
               (unsigned long long)off, (unsigned long long)(off + n), made);
    }
    return rc;
}
