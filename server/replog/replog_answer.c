/* replog_answer.c - a fetch's answer (PROTOCOL.md 17): the records from a
 * follower's position, and the values and optimizer state of the dense
 * blocks the marks among them name, read from the model as the answer is
 * made, into blocks the log keeps for the next answer. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/replog/replog.h"
#include "server/replog/records.h"

/* Writes n bytes at byte position at of the words the answer's blocks hold
 * from word a->off on. */
static void answer_put(srv_replog_answer *a, size_t at, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n) {
        uint64_t word = at / 4;
        size_t in = (size_t)(word & (SRV_BLK_FLOATS - 1)) * 4 + at % 4;
        size_t room = a->blk[word >> SRV_BLK_SHIFT]->cap * 4 - in, k = n < room ? n : room;
        memcpy((uint8_t *)a->blk[word >> SRV_BLK_SHIFT]->w + in, q, k);
        q += k, at += k, n -= k;
    }
}

void srv_replog_answer_free(srv_replog_answer *a)
{
    for (size_t i = 0; a->blk && i < a->nblk; i++)
        if (a->blk[i])
            srv_blk_unref(a->blk[i]);
    free(a->blk);
    free(a->pc);
    memset(a, 0, sizeof *a);
}

/* A run of records in an answer: sent from the log's piece, at byte own of
 * the answer's own bytes (a->blk). */
typedef struct splice {
    size_t own;
    const uint8_t *p;
    size_t len;
    srv_blk *owner;
} splice;

/* The answer's own bytes [from, to) as pieces, a block's run each. */
static void own_pieces(srv_replog_answer *a, size_t from, size_t to)
{
    const size_t bb = (size_t)SRV_BLK_FLOATS * 4;
    while (from < to) {
        size_t i = from / bb, in = from % bb, k = bb - in < to - from ? bb - in : to - from;
        a->pc[a->npc++] = (srv_piece){.p = (const uint8_t *)a->blk[i]->w + in, .len = k, .owner = a->blk[i]};
        from += k;
    }
}

int srv_replog_answer_make(psd *s, uint64_t from, size_t max, int dense_ok, srv_replog_answer *a)
{
    srv_replog *r = s->replog;
    srv_model *m = &s->model;
    memset(a, 0, sizeof *a);
    if (!r || from < r->base || from > r->base + r->len)
        return PS_ESTALE;
    /* which records: whole ones, the non-dense ones' bytes up to max, the
     * dense marks' blocks up to ANSWER_BLOCKS (the first of each always) */
    size_t at = (size_t)(from - r->base), end = at, rec_bytes = 0, nrun = 0;
    int in_run = 0; /* the last record is a sent one: the next, in the same piece, continues its run */
    size_t nmark = 0;
    uint32_t *bi = NULL;
    size_t nbi = 0, cbi = 0;
    int dense = 0, shipped = 0; /* shipped: a mark of values taken */
    uint64_t mark_ver = 0; /* the version the last mark taken says, and whether initialised */
    uint32_t mark_init = 0;
    while (end + 4 <= r->len) {
        const uint8_t *q = srv_replog_at(r, end);
        size_t l = 4 + get_u32(q);
        if (q[4] == REC_DENSE) {
            if (!dense_ok)
                break;
            uint64_t lo = get_u64(q + 17), n = get_u64(q + 25);
            /* the blocks [lo, lo + n) touches that are not listed yet */
            size_t b0 = (size_t)(lo >> SRV_BLK_SHIFT), b1 = n ? (size_t)((lo + n - 1) >> SRV_BLK_SHIFT) + 1 : b0;
            size_t add = 0;
            for (size_t b = b0; b < b1; b++) {
                int have = 0;
                for (size_t i = 0; i < nbi && !have; i++)
                    have = bi[i] == b;
                add += !have;
            }
            if (nmark && nbi + add > ANSWER_BLOCKS)
                break;
            if (nbi + add > cbi) {
                size_t nc = cbi ? cbi * 2 : 32;
                while (nc < nbi + add)
                    nc *= 2;
                uint32_t *nb = realloc(bi, nc * sizeof *nb);
                if (!nb) {
                    free(bi);
                    return PS_ENOMEM;
                }
                bi = nb, cbi = nc;
            }
            for (size_t b = b0; b < b1; b++) {
                int have = 0;
                for (size_t i = 0; i < nbi && !have; i++)
                    have = bi[i] == b;
                if (!have)
                    bi[nbi++] = (uint32_t)b;
            }
            nmark++;
            dense = 1;
            shipped |= n > 0;
            mark_ver = get_u64(q + 5);
            mark_init = get_u32(q + 13);
        } else {
            /* a push's id goes with the record before it, its rows or its
             * gradient: a follower holds both or neither */
            if (end > at && rec_bytes + l > max && q[4] != REC_PUSHID)
                break;
            rec_bytes += l;
            size_t left;
            srv_replog_owner(r, end, &left);
            nrun += !in_run; /* a new run of records to send from the log */
            in_run = left > l; /* the piece goes on after it */
        }
        if (q[4] == REC_DENSE)
            in_run = 0;
        end += l;
    }
    /* the blocks in order */
    for (size_t i = 1; i < nbi; i++)
        for (size_t j = i; j > 0 && bi[j - 1] > bi[j]; j--) {
            uint32_t t = bi[j];
            bi[j] = bi[j - 1], bi[j - 1] = t;
        }
    float *st[STATE_MAX];
    const char *names[STATE_MAX];
    size_t nst = m->blk ? srv_optim_state_buffers(&m->opt, st, names, STATE_MAX) : 0;
    if (!m->blk)
        nbi = 0; /* marks before a layout: nothing to read */
    for (size_t i = 0; i < nbi; i++)
        if (bi[i] >= m->nblk)
            nbi = i; /* sorted: marks past the model's end (cannot be) are dropped */
    size_t head = HEAD_FIXED + 4 * nbi + rec_bytes;
    head = (head + 3) & ~(size_t)3;
    /* the values of each block listed (the model's last one may be
     * shorter), then each state buffer's, after the head */
    size_t per = 1 + nst;
    uint64_t values = 0;
    for (size_t i = 0; i < nbi; i++)
        values += (uint64_t)m->blk[bi[i]]->cap * per;
    a->ndata = head / 4 + values;
    /* the answer's own bytes: all but the records, which are sent from the
     * log's pieces, a run of records at a time (splices) */
    size_t own = head - rec_bytes + (size_t)values * 4;
    uint64_t own_words = (own + 3) / 4;
    a->nblk = (size_t)((own_words + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT);
    a->blk = calloc(a->nblk, sizeof *a->blk);
    splice *sp = nrun ? calloc(nrun, sizeof *sp) : NULL;
    a->pc = calloc(a->nblk + nrun + 1, sizeof *a->pc);
    int rc = a->blk && a->pc && (sp || !nrun) ? 0 : PS_ENOMEM;
    /* the blocks the answer is written into: the log's own, kept for the
     * next answer (one copy of the values, into memory faulted in once) */
    if (rc == 0 && r->nshadow < a->nblk) {
        srv_blk **ns = realloc(r->shadow, a->nblk * sizeof *ns);
        if (!ns) {
            rc = PS_ENOMEM;
        } else {
            memset(ns + r->nshadow, 0, (a->nblk - r->nshadow) * sizeof *ns);
            r->shadow = ns;
            r->nshadow = a->nblk;
        }
    }
    for (size_t i = 0; rc == 0 && i < a->nblk; i++) {
        uint64_t need = own_words - ((uint64_t)i << SRV_BLK_SHIFT);
        /* a short last piece: the log's one small block (one size, so that
         * the blocks' pool never fills with odd ones) */
        srv_blk **sh = need < SRV_BLK_FLOATS / 4 ? &r->small : &r->shadow[i];
        if (*sh && (*sh)->refs > 1) { /* still being written to a follower */
            srv_blk_unref(*sh);
            *sh = NULL;
        }
        if (!*sh && !(*sh = srv_blk_fresh(sh == &r->small ? SRV_BLK_FLOATS / 4 : SRV_BLK_FLOATS)))
            rc = PS_ENOMEM;
        else
            a->blk[i] = srv_blk_ref(*sh);
    }
    if (rc != 0) {
        free(bi);
        free(sp);
        srv_replog_answer_free(a);
        return rc;
    }
    size_t w = head - rec_bytes;
    for (size_t i = 0; i < nbi; i++) {
        uint64_t b0 = (uint64_t)bi[i] << SRV_BLK_SHIFT;
        size_t cnt = m->blk[bi[i]]->cap;
        answer_put(a, w, m->blk[bi[i]]->w, cnt * 4);
        w += cnt * 4;
        for (size_t j = 0; j < nst; j++, w += cnt * 4)
            answer_put(a, w, st[j] + b0, cnt * 4);
    }
    a->off = 0;
    a->next = r->base + end;
    uint8_t fixed[HEAD_FIXED];
    put_u32(fixed, (uint32_t)head);
    put_u64(fixed + 4, a->next);
    /* marks of values: read now, so the version now; marks of a version
     * alone (a push that went as its gradient): the last one's, or a
     * follower catching up would be put ahead of the gradients still to
     * come in the log */
    put_u64(fixed + 12, shipped ? m->version : mark_ver);
    put_u32(fixed + 20, shipped ? (uint32_t)m->initialized : mark_init);
    put_u32(fixed + 24, (uint32_t)dense);
    put_u32(fixed + 28, (uint32_t)nst);
    put_u32(fixed + 32, (uint32_t)nbi);
    answer_put(a, 0, fixed, HEAD_FIXED);
    if (nbi)
        answer_put(a, HEAD_FIXED, bi, 4 * nbi);
    w = HEAD_FIXED + 4 * nbi;
    size_t ns = 0;
    for (size_t p = at; p < end;) {
        const uint8_t *q = srv_replog_at(r, p);
        size_t l = 4 + get_u32(q);
        if (q[4] != REC_DENSE) {
            size_t left;
            srv_blk *o = srv_replog_owner(r, p, &left);
            if (ns && sp[ns - 1].p + sp[ns - 1].len == q && sp[ns - 1].owner == o)
                sp[ns - 1].len += l; /* the run goes on */
            else
                sp[ns++] = (splice){.own = w, .p = q, .len = l, .owner = o};
        }
        p += l;
    }
    assert(ns <= nrun);
    static const uint8_t zero[4];
    if (head - rec_bytes > w)
        answer_put(a, w, zero, head - rec_bytes - w);
    /* the answer in order: its own bytes, the runs of records between */
    size_t done = 0;
    for (size_t i = 0; i < ns; i++) {
        own_pieces(a, done, sp[i].own);
        a->pc[a->npc++] = (srv_piece){.p = sp[i].p, .len = sp[i].len, .owner = sp[i].owner};
        done = sp[i].own;
    }
    own_pieces(a, done, own);
    free(sp);
    free(bi);
    r->dense_bytes += values * 4;
    return 0;
}
