/* reply.c - how the dispatch layer answers: srv_send and srv_send_error go
 * through the functions the connection layer registered in psd.io (net.c's
 * in psd, a test's fakes in the unit tests), so that no handler calls up
 * into the connection code. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "server/store/psd.h"
#include "server/answer/reply.h"

void srv_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    c->srv->io->send(c, m, blk);
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
