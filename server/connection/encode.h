/* encode.h - a reply's tensor converted for the wire (encode.c), and the
 * connection layer's buffer pools. Private to the connection layer. */
#ifndef SRV_CONNECTION_ENCODE_H
#define SRV_CONNECTION_ENCODE_H

#include "server/store/psd.h"

/* Buffers for parameters sent as bfloat16 (converted from the blocks, so a
 * consistent snapshot like the blocks themselves) or as one zstd frame of
 * their byte planes (rdt 3), len bytes of v. Reference-counted: the queued
 * writes sending it, and the pool's `last`. */
typedef struct srv_narrow {
    size_t cap;         /* bytes */
    size_t len;         /* bytes of v in use */
    uint32_t dt;        /* PS_DT_BF16 or PS_DT_F32ZSTD */
    unsigned refs;      /* queued writes, and srv_outbufs.last */
    uint64_t stamp, ver, off, n; /* the model's stamp when converted, and m's */
    const srv_blk *blk; /* the first block it was converted from */
    struct srv_narrow *next;
    uint16_t v[];
} srv_narrow;

/* psd.out: the pools of the connection layer, made at the first reply. */
typedef struct srv_outbufs {
    srv_narrow *last;       /* the last tensor converted, shared by the next
                             * reply of the same values */
    srv_narrow *free;       /* spare buffers (encode.c) */
    unsigned free_count;
    struct srv_wreq *wreq_free; /* spare write requests (net.c) */
    unsigned wreq_free_count;
} srv_outbufs;

/* s->out, made on first use; NULL when out of memory. */
srv_outbufs *srv_outbufs_get(psd *s);
/* Frees the spare converted buffers and s->out (net.c frees its spare
 * write requests first). */
void srv_outbufs_free(psd *s);

/* m's data (m->ndata values from m->off of blocks blk) as m->dt says
 * (PS_DT_BF16, or PS_DT_F32ZSTD), with a reference for the caller; NULL
 * when out of memory. */
srv_narrow *srv_narrow_of(psd *s, const ps_msg *m, srv_blk *const *blk);
/* Drops a reference; the last one puts the buffer back in the pool. */
void srv_narrow_put(srv_outbufs *o, srv_narrow *b);

#endif
