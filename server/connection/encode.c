/* encode.c - a reply's tensor in the form its request asked for (rdt):
 * bfloat16, or one zstd frame of the values' byte planes, converted from the
 * model's blocks through proto's codec; and the connection layer's buffer
 * pools (srv_outbufs, in psd.out): those converted tensors and net.c's
 * write requests. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/codec.h"
#include "server/connection/encode.h"
#include "server/store/scratch.h"

srv_outbufs *srv_outbufs_get(psd *s)
{
    if (!s->out)
        s->out = calloc(1, sizeof *s->out);
    return s->out;
}

void srv_outbufs_free(psd *s)
{
    srv_outbufs *o = s->out;
    if (!o)
        return;
    if (o->last)
        srv_narrow_put(o, o->last);
    while (o->free) {
        srv_narrow *b = o->free;
        o->free = b->next;
        free(b);
    }
    free(o);
    s->out = NULL;
}

/* Buffers for parameters sent as bfloat16 (converted from the blocks, so a
 * consistent snapshot like the blocks themselves). Kept for reuse, at most
 * NARROW_SPARE of them: a worker has at most PS_PULL_WINDOW chunk replies in
 * flight, so this many serve 8 workers without allocating, and they hold at
 * most NARROW_SPARE * PS_CHUNK_FLOATS * 2 bytes (32 MiB).
 *
 * The last one converted is also kept as `last`, with what it holds (model
 * version, range, first block): the next reply of the same values (every
 * worker's at the end of a BSP round) shares it, reference-counted, instead
 * of converting again. */
#define NARROW_SPARE 16


static srv_narrow *narrow_get(srv_outbufs *o, size_t bytes)
{
    /* the first spare big enough, else a new one */
    for (srv_narrow **pp = &o->free; *pp; pp = &(*pp)->next) {
        if ((*pp)->cap >= bytes) {
            srv_narrow *b = *pp;
            *pp = b->next;
            o->free_count--;
            return b;
        }
    }
    srv_narrow *b = malloc(sizeof *b + bytes);
    if (b)
        b->cap = bytes;
    return b;
}

void srv_narrow_put(srv_outbufs *o, srv_narrow *b)
{
    if (--b->refs > 0)
        return;
    if (o->free_count >= NARROW_SPARE) {
        /* full: keep the bigger ones */
        srv_narrow **small = &o->free;
        for (srv_narrow **pp = &o->free; *pp; pp = &(*pp)->next)
            if ((*pp)->cap < (*small)->cap)
                small = pp;
        if ((*small)->cap >= b->cap) {
            free(b);
            return;
        }
        srv_narrow *victim = *small;
        *small = victim->next;
        free(victim);
        o->free_count--;
    }
    b->next = o->free;
    o->free = b;
    o->free_count++;
}

/* m's values compressed into b: one zstd frame (level 1) of their byte
 * planes, laid out block by block in psd's scratch (proto's codec). 0, or
 * -1 when out of memory. */
static int compress_into(psd *s, srv_narrow *b, const ps_msg *m, srv_blk *const *blk)
{
    size_t n = (size_t)m->ndata, raw = n * sizeof(float);
    uint8_t *planes = srv_planes(s, raw);
    if (!planes)
        return -1;
    uint64_t off = m->off;
    for (size_t at = 0; at < n;) {
        size_t len;
        const float *p = srv_blocks_at(blk, off, n - at, &len);
        ps_codec_planes_put(planes, n, at, p, len);
        at += len;
        off += len;
    }
    char err[128];
    if (ps_codec_zstd_encode(srv_codec(s), (uint8_t *)b->v, b->cap, planes, n, &b->len, err, sizeof err) != 0) {
        PS_LOG(PS_LOG_ERROR, "compressing a reply of %zu values: %s", n, err);
        return -1;
    }
    return 0;
}

/* m's data (m->ndata values from m->off of blocks blk) as m->dt says
 * (bfloat16, or compressed), with a reference for the caller; NULL when
 * out of memory. The last conversion is reused when nothing was written to
 * the model since (its stamp) and it holds the same range of the same
 * blocks at the same version in the same type: every worker's reply at the
 * end of a BSP round is converted once. */
srv_narrow *srv_narrow_of(psd *s, const ps_msg *m, srv_blk *const *blk)
{
    srv_outbufs *o = srv_outbufs_get(s);
    if (!o)
        return NULL;
    const srv_blk *first = blk[m->off >> SRV_BLK_SHIFT];
    srv_narrow *l = o->last;
    /* a table's rows (ROWS) come in fresh blocks every time, which the
     * pool hands out again at the same address, and the model's stamp does
     * not see rows change: their conversion is never reused */
    int shared = m->type != PS_MSG_ROWS;
    if (shared && l && l->stamp == s->model.stamp && l->ver == m->mver && l->off == m->off && l->n == m->ndata &&
        l->blk == first && l->dt == m->dt) {
        l->refs++;
        return l;
    }
    int zstd = m->dt == PS_DT_F32ZSTD;
    srv_narrow *b = narrow_get(o, zstd ? ps_codec_zstd_bound((size_t)m->ndata)
                                       : (size_t)m->ndata * sizeof(uint16_t));
    if (!b)
        return NULL;
    size_t bytes = (size_t)m->ndata * sizeof(uint16_t);
    if (zstd) {
        b->refs = 1;
        if (compress_into(s, b, m, blk) != 0) {
            srv_narrow_put(o, b);
            return NULL;
        }
        bytes = b->len;
    } else {
        uint64_t off = m->off, left = m->ndata;
        for (uint16_t *dst = b->v; left > 0;) {
            size_t len;
            const float *p = srv_blocks_at(blk, off, left, &len);
            ps_codec_bf16_encode(dst, p, len);
            dst += len;
            off += len;
            left -= len;
        }
    }
    *b = (srv_narrow){.cap = b->cap, .len = bytes, .dt = m->dt, .refs = shared ? 2 : 1, .stamp = s->model.stamp,
                         .ver = m->mver, .off = m->off, .n = m->ndata, .blk = first};
    if (!shared)
        return b;
    if (o->last)
        srv_narrow_put(o, o->last);
    o->last = b;
    return b;
}

