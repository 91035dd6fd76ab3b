/* reply.c - how the dispatch layer answers: srv_send and srv_send_error go
 * through the functions the connection layer registered in psd.io (net.c's
 * in psd, a test's fakes in the unit tests), so that no handler calls up
 * into the connection code. */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"

void srv_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    c->srv->io->send(c, m, blk);
}

void srv_send_pieces(srv_conn *c, const ps_msg *m, const srv_piece *pc, size_t npc)
{
    c->srv->io->send_pieces(c, m, pc, npc);
}

void srv_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    c->srv->io->send_error(c, id, code, fatal, text);
}

void srv_send_ok(srv_conn *c, uint64_t id)
{
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER;
    r.id = id;
    r.mver = c->srv->model.version;
    srv_send(c, &r, NULL);
}

void srv_send_ok_text(srv_conn *c, uint64_t id, const char *text)
{
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER | PS_F_TEXT;
    r.id = id;
    r.mver = c->srv->model.version;
    r.text = text;
    r.text_len = (uint32_t)strlen(text);
    srv_send(c, &r, NULL);
}

srv_conn *srv_conn_by_cid(psd *s, uint64_t cid)
{
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->cid == cid)
            return c->closing ? NULL : c;
    return NULL;
}

/* bytes [0, len) as a PARAMS of len/4 (rounded up) float32 words in as
 * many blocks as they take, ver = v; fill, when given, writes them. */
void srv_send_bytes(srv_conn *c, uint64_t id, uint64_t v, const uint8_t *p, size_t len,
                       int (*fill)(void *, uint8_t *, size_t), void *arg)
{
    size_t words = (len + 3) / 4;
    size_t nblk = words ? (words + SRV_BLK_FLOATS - 1) / SRV_BLK_FLOATS : 1;
    srv_blk **blk = calloc(nblk, sizeof *blk);
    int bad = !blk;
    for (size_t i = 0; !bad && i < nblk; i++) {
        size_t cap = words - i * SRV_BLK_FLOATS < SRV_BLK_FLOATS ? words - i * SRV_BLK_FLOATS : SRV_BLK_FLOATS;
        if (!(blk[i] = srv_blk_fresh(cap ? cap : 1)))
            bad = 1;
        else
            blk[i]->w[(cap ? cap : 1) - 1] = 0.0f; /* the padding of the last word */
    }
    for (size_t i = 0; !bad && i < nblk && len; i++) {
        size_t at = i * (size_t)SRV_BLK_FLOATS * 4, n = len - at < SRV_BLK_FLOATS * 4 ? len - at : SRV_BLK_FLOATS * 4;
        if (fill)
            bad = fill(arg, (uint8_t *)blk[i]->w, n) != 0;
        else
            memcpy(blk[i]->w, p + at, n);
    }
    if (!bad) {
        ps_msg r;
        ps_msg_init(&r, PS_MSG_PARAMS);
        r.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
        r.id = id;
        r.mver = v;
        r.off = 0;
        r.data = blk[0]->w;
        r.ndata = words;
        srv_send(c, &r, blk);
    } else {
        srv_send_error(c, id, fill ? PS_EIO : PS_ENOMEM, 0, "cannot send %zu bytes", len);
    }
    for (size_t i = 0; blk && i < nblk; i++)
        if (blk[i])
            srv_blk_unref(blk[i]);
    free(blk);
}

void srv_arg_str(const ps_msg *m, uint32_t i, char *buf, size_t len)
{
    buf[0] = 0;
    if (i < m->nargs) {
        size_t n = m->args[i].len < len - 1 ? m->args[i].len : len - 1;
        memcpy(buf, m->args[i].p, n);
        buf[n] = 0;
    }
}

uint64_t srv_arg_u64(const ps_msg *m, uint32_t i)
{
    char b[32];
    srv_arg_str(m, i, b, sizeof b);
    return strtoull(b, NULL, 10);
}
