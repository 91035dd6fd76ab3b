/* conn_form.c - the form a tensor travels in on a blocking connection to
 * psd (conn.c): pushes narrowed to bfloat16, compressed with zstd or sent
 * without their zeros when psd offered that and it saves bytes, and the
 * form asked for the reply's parameters. It calls nothing of conn.c. */
#include "conn_form.h"

#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "proto/errors.h"

/* (conn_form.h) */
int ps_conn_grow(ps_conn *c, void **p, size_t *cap, size_t n, size_t esize)
{
    if (n <= *cap)
        return 0;
    void *q = realloc(*p, n * esize);
    if (!q) {
        snprintf(c->err, sizeof c->err, "out of memory for %zu tensor values", n);
        return PS_ENOMEM;
    }
    *p = q;
    *cap = n;
    return 0;
}

/* A message whose reply carries parameters or rows psd may send packed:
 * PULL, PUSHPULL, and a TPULL by key or a TPUSHPULL (PROTOCOL.md 13.2);
 * not those answered in a shared segment ("inshm", "seg": float32 only). */
static int pulls(const ps_msg *m)
{
    return ((m->type == PS_MSG_PULL || m->type == PS_MSG_PUSHPULL) && !m->inshm) ||
           (!(m->has & PS_F_SEG) && ((m->type == PS_MSG_TPULL && (m->has & PS_F_KEYS)) || m->type == PS_MSG_TPUSHPULL));
}

/* A message whose data is a gradient, values or row gradients. */
static int pushes(const ps_msg *m)
{
    return m->type == PS_MSG_PUSH || m->type == PS_MSG_PUSHPULL || m->type == PS_MSG_TPUSH ||
           m->type == PS_MSG_TPUSHPULL;
}

/* 1 when m's tensor may be sent packed: float32 data of an INIT, PUSH or
 * PUSHPULL of at least min values. */
static int packable(const ps_msg *m, uint64_t min)
{
    int tensor = pushes(m) || m->type == PS_MSG_INIT;
    return tensor && (m->has & PS_F_DATA) && m->dt == PS_DT_F32 && m->ndata >= min;
}

/* *nm: *o with its data replaced by zbuf's bytes of type dt; *m then
 * points at nm. The caller's message keeps its data (it may send it
 * again). */
static void packed_msg(ps_conn *c, ps_msg **m, ps_msg *nm, uint32_t dt, size_t bytes)
{
    *nm = **m;
    nm->has |= PS_F_DT | PS_F_LEN;
    nm->dt = dt;
    nm->len = nm->ndata;
    nm->packed = c->zbuf;
    nm->packed_len = bytes;
    nm->data = NULL;
    *m = nm;
}

/* *m's float32 data as one zstd frame of its byte planes (PS_DT_F32ZSTD),
 * into *nm, when that is worth it (ps_codec_worth). Level 1:
 * about 600 MB/s for a gradient, which goes at about half its bytes where
 * inputs repeat a value (standardised blank pixels) or zeros. */
static int compressed(ps_conn *c, ps_msg **m, ps_msg *nm)
{
    if (!packable(*m, 1024))
        return 0;
    if (c->zrest) {
        c->zrest--;
        return 0;
    }
    size_t n = (size_t)(*m)->ndata, raw = n * sizeof(float), cap = ps_codec_zstd_bound(n);
    int rc = ps_conn_grow(c, (void **)&c->zbuf, &c->zbuf_cap, cap, 1);
    if (rc == 0)
        rc = ps_conn_grow(c, (void **)&c->zshuf, &c->zshuf_cap, raw, 1);
    if (rc != 0)
        return rc;
    ps_codec_planes_put(c->zshuf, n, 0, (*m)->data, n);
    size_t got;
    char zerr[128];
    if ((rc = ps_codec_zstd_encode(&c->codec, c->zbuf, cap, c->zshuf, n, &got, zerr, sizeof zerr)) != 0) {
        snprintf(c->err, sizeof c->err, "%s", zerr);
        return rc;
    }
    if (ps_codec_worth(got, raw)) {
        packed_msg(c, m, nm, PS_DT_F32ZSTD, got);
    } else {
        c->zrest = PS_ZSTD_REST;
        PS_LOG(PS_LOG_DEBUG, "%s: %zu bytes compress to %zu only: the next %d pushes go uncompressed", c->server,
               raw, got, PS_ZSTD_REST);
    }
    return 0;
}

/* *m's float32 data without its zeros (PS_DT_F32Z), into *nm, when that
 * is worth it (ps_codec_worth). */
static int without_zeros(ps_conn *c, ps_msg **m, ps_msg *nm)
{
    if (!packable(*m, 64))
        return 0;
    const ps_msg *o = *m;
    size_t n = (size_t)o->ndata, mb = (size_t)ps_f32z_mask_bytes(n);
    /* a read-only count first: a dense gradient costs no packing */
    if (!ps_codec_worth(ps_codec_f32z_size(o->data, n), n * sizeof(float)))
        return 0;
    int rc = ps_conn_grow(c, (void **)&c->zbuf, &c->zbuf_cap, mb + n * sizeof(float), 1);
    if (rc != 0)
        return rc;
    uint64_t nz;
    size_t bytes = ps_codec_f32z_encode(c->zbuf, o->data, n, &nz);
    packed_msg(c, m, nm, PS_DT_F32Z, bytes);
    nm->nz = nz;
    return 0;
}

int ps_conn_form(ps_conn *c, ps_msg **mp, ps_msg *nm)
{
    if (c->wire_dt == PS_DT_BF16) {
        int push = pushes(*mp);
        if (pulls(*mp)) {
            (*mp)->has |= PS_F_RDT;
            (*mp)->rdt = PS_DT_BF16;
        }
        if (push && ((*mp)->has & PS_F_DATA) && (*mp)->dt == PS_DT_F32) {
            /* the caller's m keeps its float32 data (it may send it again) */
            int rc = ps_conn_grow(c, (void **)&c->narrow, &c->narrow_cap, (size_t)(*mp)->ndata, sizeof(uint16_t));
            if (rc != 0)
                return rc;
            ps_codec_bf16_encode(c->narrow, (*mp)->data, (size_t)(*mp)->ndata);
            *nm = **mp;
            nm->has |= PS_F_DT;
            nm->dt = PS_DT_BF16;
            nm->data16 = c->narrow;
            nm->data = NULL;
            *mp = nm;
        }
    }
    if (c->compress && pulls(*mp) && !((*mp)->has & PS_F_RDT)) {
        /* the parameters or rows back compressed too, when that saves
         * (else psd answers in float32) */
        (*mp)->has |= PS_F_RDT;
        (*mp)->rdt = PS_DT_F32ZSTD;
    }
    ps_msg *orig = *mp;
    int rc = c->compress ? compressed(c, mp, nm) : 0;
    if (rc == 0 && *mp == orig && c->skip_zeros)
        rc = without_zeros(c, mp, nm);
    return rc;
}
