/* model.c - the parameter store: the layout, the parameters in
 * copy-on-write blocks (see psd.h), snapshots, and a small pool of free
 * blocks so that steady-state updates of shared blocks allocate nothing.
 * Knows nothing of connections or modes. Loop thread only. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "server/model/model.h"
#include "proto/errors.h"
#include "server/store/psd.h"

/* Free blocks kept for reuse, in bytes: room for the blocks replies hold
 * while 8 workers pull (one chunk each) without holding on to much more. */
#define POOL_MAX_BYTES ((size_t)16 << 20)

/* Receive buffers adopted blocks let go, for the next ones a connection
 * needs (a fresh one of tens of MB is page faults as it fills). */
#define RBUF_SPARES 2
static srv_rbuf rbuf_spares[RBUF_SPARES];

static srv_blk *pool;
static size_t pool_bytes;

static srv_blk *blk_new(size_t cap)
{
    for (srv_blk **pp = &pool; *pp; pp = &(*pp)->next) {
        if ((*pp)->cap == cap) {
            srv_blk *b = *pp;
            *pp = b->next;
            pool_bytes -= cap * sizeof(float);
            b->refs = 1;
            b->next = NULL;
            return b;
        }
    }
    srv_blk *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    /* 64-byte alignment for vector loads; size rounded up for aligned_alloc */
    size_t bytes = ((cap * sizeof(float)) + 63) & ~(size_t)63;
    b->w = aligned_alloc(64, bytes ? bytes : 64);
    if (!b->w) {
        free(b);
        return NULL;
    }
    b->refs = 1;
    b->cap = cap;
    return b;
}

void srv_blk_pool_free(void)
{
    for (int i = 0; i < RBUF_SPARES; i++) {
        free(rbuf_spares[i].mem);
        rbuf_spares[i] = (srv_rbuf){0};
    }
    while (pool) {
        srv_blk *b = pool;
        pool = b->next;
        free(b->w);
        free(b);
    }
    pool_bytes = 0;
}

srv_blk *srv_blk_fresh(size_t cap)
{
    return blk_new(cap);
}

srv_blk *srv_blk_ref(srv_blk *b)
{
    b->refs++;
    return b;
}

srv_blk *srv_blk_adopt(uint8_t *mem, size_t cap)
{
    srv_blk *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->refs = 1;
    b->ext = mem;
    b->ext_cap = cap;
    return b;
}

srv_rbuf srv_rbuf_spare(size_t need)
{
    for (int i = 0; i < RBUF_SPARES; i++)
        if (rbuf_spares[i].mem && rbuf_spares[i].cap >= need) {
            srv_rbuf r = rbuf_spares[i];
            rbuf_spares[i] = (srv_rbuf){0};
            return r;
        }
    return (srv_rbuf){0};
}

/* An adopted block's buffer, kept in place of the smallest kept one when
 * bigger. */
static void rbuf_keep(uint8_t *mem, size_t cap)
{
    int k = 0;
    for (int i = 1; i < RBUF_SPARES; i++)
        if (!rbuf_spares[i].mem || (rbuf_spares[k].mem && rbuf_spares[i].cap < rbuf_spares[k].cap))
            k = i;
    if (rbuf_spares[k].mem && rbuf_spares[k].cap >= cap) {
        free(mem);
        return;
    }
    free(rbuf_spares[k].mem);
    rbuf_spares[k] = (srv_rbuf){.mem = mem, .cap = cap};
}

void srv_blk_unref(srv_blk *b)
{
    if (!b || --b->refs > 0)
        return;
    if (b->ext) {
        rbuf_keep(b->ext, b->ext_cap);
        free(b);
        return;
    }
    if (b->hw_steps) {
        srv_hogwild_block_free(b);
        return;
    }
    size_t bytes = b->cap * sizeof(float);
    if (pool_bytes + bytes <= POOL_MAX_BYTES) {
        b->next = pool;
        pool = b;
        pool_bytes += bytes;
        return;
    }
    free(b->w);
    free(b);
}

/* floats in block i of a model of n */
static size_t blk_cap(size_t n, size_t i)
{
    size_t start = i << SRV_BLK_SHIFT;
    return n - start < SRV_BLK_FLOATS ? n - start : SRV_BLK_FLOATS;
}

static void blocks_free(srv_blk **blk, size_t nblk)
{
    for (size_t i = 0; i < nblk; i++)
        srv_blk_unref(blk[i]);
    free(blk);
}

int srv_model_set_layout(srv_model *m, const ps_layout *l, const ps_config *cfg)
{
    size_t n = l->total;
    size_t nblk = (n + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT;
    if (cfg->hogwild && nblk > 1)
        return PS_EINVAL; /* the hello was refused before (hello.c); a checkpoint or init_from */
    srv_blk **blk = calloc(nblk ? nblk : 1, sizeof *blk);
    if (!blk)
        return PS_ENOMEM;
    if (cfg->hogwild && nblk == 1 && !(blk[0] = srv_hogwild_block(n))) {
        free(blk);
        return PS_ENOMEM;
    }
    for (size_t i = blk[0] ? 1 : 0; i < nblk; i++) {
        if (!(blk[i] = blk_new(blk_cap(n, i)))) {
            blocks_free(blk, i);
            return PS_ENOMEM;
        }
        memset(blk[i]->w, 0, blk[i]->cap * sizeof(float));
    }
    int rc = srv_optim_init(&m->opt, cfg, n);
    if (rc != 0) {
        blocks_free(blk, nblk);
        return rc;
    }
    m->layout = *l;
    m->fp = ps_layout_fingerprint(l);
    m->blk = blk;
    m->nblk = nblk;
    m->hw = cfg->hogwild && nblk == 1 ? blk[0] : NULL;
    m->has_layout = 1;
    m->initialized = 0;
    m->version = 0;
    m->bound_ok = 0;
    return 0;
}

void srv_model_propose(srv_model *m, const ps_layout *l)
{
    m->layout = *l;
    m->fp = ps_layout_fingerprint(l);
    m->has_layout = 1;
    m->initialized = 0;
    m->version = 0;
}

int srv_model_commit(srv_model *m, const ps_config *cfg)
{
    if (m->blk)
        return 0;
    ps_layout l = m->layout;
    return srv_model_set_layout(m, &l, cfg);
}

void srv_model_move(srv_model *m, srv_model *out)
{
    *out = *m;
    m->blk = NULL; /* out owns them now */
    m->nblk = 0;
    m->hw = NULL;
    for (int i = 0; i < SRV_OPTIM_STATE_MAX; i++)
        m->opt.state[i] = NULL;
    srv_model_release(m);
}

void srv_model_move_back(srv_model *m, srv_model *from, int keep)
{
    if (keep) {
        if (m->stamp <= from->stamp)
            m->stamp = from->stamp + 1; /* no cache keyed on the other's stamp holds */
        srv_model_free(from);
        return;
    }
    srv_model_free(m);
    *m = *from;
}

void srv_model_release(srv_model *m)
{
    srv_model_free(m);
    m->has_layout = 0;
    m->initialized = 0;
    m->version = 0;
    m->fp = 0;
    ps_layout_init(&m->layout);
}

const float *srv_blocks_at(srv_blk *const *blk, uint64_t off, uint64_t n, size_t *len)
{
    const srv_blk *b = blk[off >> SRV_BLK_SHIFT];
    size_t in = (size_t)(off & (SRV_BLK_FLOATS - 1));
    size_t room = b->cap - in;
    *len = n < room ? (size_t)n : room;
    return b->w + in;
}

const float *srv_model_at(const srv_model *m, uint64_t off, uint64_t n, size_t *len)
{
    return srv_blocks_at(m->blk, off, n, len);
}

int srv_model_write_begin(srv_model *m, uint64_t off, uint64_t n, srv_wseg *seg)
{
    size_t bi = (size_t)(off >> SRV_BLK_SHIFT);
    size_t in = (size_t)(off & (SRV_BLK_FLOATS - 1));
    srv_blk *b = m->blk[bi];
    size_t room = b->cap - in;
    seg->len = n < room ? (size_t)n : room;
    seg->old = NULL;
    if (b->refs == 1 || b->hw_steps) { /* Hogwild!'s segment: always in place */
        seg->wo = b->w + in;
        seg->wi = seg->wo;
        return 0;
    }
    /* shared: the update writes a fresh block; the rest of it is copied */
    srv_blk *nb = blk_new(b->cap);
    if (!nb)
        return PS_ENOMEM;
    memcpy(nb->w, b->w, in * sizeof(float));
    memcpy(nb->w + in + seg->len, b->w + in + seg->len, (b->cap - in - seg->len) * sizeof(float));
    m->blk[bi] = nb;
    seg->old = b; /* the model's reference, dropped by write_end */
    seg->wo = nb->w + in;
    seg->wi = b->w + in;
    return 0;
}

void srv_model_write_end(srv_model *m, srv_wseg *seg)
{
    m->stamp++;
    m->bound_ok = 0; /* written from outside the update engine */
    srv_blk_unref(seg->old);
    seg->old = NULL;
}

int srv_model_reserve(const srv_model *m, size_t first, size_t nblk, srv_blk **old, srv_blk **fresh)
{
    for (size_t i = 0; i < nblk; i++) {
        old[i] = m->blk[first + i];
        fresh[i] = NULL;
        if (old[i]->refs == 1 || old[i]->hw_steps)
            continue; /* updated in place: no new reference can come meanwhile */
        if (!(fresh[i] = blk_new(old[i]->cap))) {
            for (size_t k = 0; k < i; k++)
                srv_blk_unref(fresh[k]);
            return PS_ENOMEM;
        }
    }
    return 0;
}

void srv_model_install(srv_model *m, size_t first, size_t nblk, srv_blk *const *old, srv_blk *const *fresh)
{
    m->stamp++;
    for (size_t i = 0; i < nblk; i++) {
        if (fresh[i]) {
            m->blk[first + i] = fresh[i];
            srv_blk_unref(old[i]); /* the model's reference */
        }
    }
}

void srv_model_mark(srv_model *m, uint64_t off, uint64_t n)
{
    if (m->dirty_hi <= m->dirty_lo) {
        m->dirty_lo = off;
        m->dirty_hi = off + n;
        return;
    }
    if (off < m->dirty_lo)
        m->dirty_lo = off;
    if (off + n > m->dirty_hi)
        m->dirty_hi = off + n;
}

void srv_model_unmark(srv_model *m)
{
    m->dirty_lo = m->dirty_hi = 0;
}

void srv_model_bump(srv_model *m)
{
    if (m->hw)
        m->version = atomic_fetch_add_explicit(m->hw->hw_steps, 1, memory_order_acq_rel) + 1;
    else
        m->version++;
}

void srv_model_set_initialized(srv_model *m, uint64_t version)
{
    m->initialized = 1;
    srv_model_set_version(m, version); /* Hogwild!: the segment's counter too */
}

void srv_model_touched(srv_model *m)
{
    m->stamp++;
    m->bound_ok = 0; /* values from elsewhere: the update engine measures them */
}

void srv_model_free(srv_model *m)
{
    if (m->blk)
        blocks_free(m->blk, m->nblk);
    m->blk = NULL;
    m->nblk = 0;
    m->hw = NULL;
    srv_optim_free(&m->opt);
}

/* ---- snapshots ------------------------------------------------------------ */

srv_snap *srv_snap_take(srv_model *m)
{
    srv_snap *s = malloc(sizeof *s + m->nblk * sizeof s->blk[0]);
    if (!s)
        return NULL;
    srv_model_sync(m);
    s->refs = 1;
    s->version = m->version;
    s->n = m->layout.total;
    s->nblk = m->nblk;
    for (size_t i = 0; i < m->nblk; i++) {
        if (!m->blk[i]->hw_steps) {
            s->blk[i] = srv_blk_ref(m->blk[i]);
            continue;
        }
        /* Hogwild!'s segment changes under any reference: a copy, read
         * after the counter, so it holds every step counted in version
         * (and maybe parts of later ones) */
        srv_blk *b = blk_new(m->blk[i]->cap);
        if (!b) {
            s->nblk = i;
            srv_snap_unref(s);
            return NULL;
        }
        memcpy(b->w, m->blk[i]->w, b->cap * sizeof(float));
        s->blk[i] = b;
    }
    return s;
}

srv_snap *srv_snap_ref(srv_snap *s)
{
    s->refs++;
    return s;
}

void srv_snap_unref(srv_snap *s)
{
    if (!s || --s->refs > 0)
        return;
    for (size_t i = 0; i < s->nblk; i++)
        srv_blk_unref(s->blk[i]);
    free(s);
}

const float *srv_snap_at(const srv_snap *s, uint64_t off, uint64_t n, size_t *len)
{
    return srv_blocks_at(s->blk, off, n, len);
}
