/* close.c - closing a connection: detaching it from the job, the
 * lingering close after an ERROR (reading and discarding until the peer
 * closes), uv_close and freeing it in the close callback. Owns nothing but
 * the connection it frees. */
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "server/connection/close.h"
#include "server/connection/net.h"
#include "server/session/session.h"
#include "server/update/update.h"

/* ---- closing ------------------------------------------------------------ */

/* Frees a connection (its handle closed). */
void srv_conn_free(srv_conn *c)
{
    msgpack_zone_destroy(&c->zone);
    for (srv_held *h = c->held_head, *next; h; h = next) {
        next = h->next;
        h->drop(h); /* a reply held for the followers, never sent */
    }
    srv_shm_detach(c);
    srv_row_hint_free(&c->row_hint);
    free(c->wide);
    c->srv->rbuf_bytes -= c->rcap;
    free(c->rbuf);
    free(c);
}

void srv_conn_on_close(uv_handle_t *h)
{
    srv_conn *c = (srv_conn *)h;
    psd *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    if ((srv_update_busy(s) && s->push_wait.c == c) || c->tapply_busy) {
        c->free_later = 1; /* the update still reads its receive buffer, or
                            * the apply threads' reply names it */
        return;
    }
    srv_conn_free(c);
}

/* ---- lingering close ----------------------------------------------------
 * A connection closed for an error may still be sending (the rest of a
 * frame psd refused). Closing a socket with unread bytes makes the kernel
 * send a reset, and the peer may then lose the ERROR psd just wrote. So
 * psd shuts down its side once the ERROR is written and reads, discarding,
 * until the peer closes or SRV_LINGER_MS pass (nginx's lingering_close).
 * The connection is detached first, so it holds no worker and no
 * connection slot while it lingers; its receive buffer goes at its first
 * read or tick, off the stack of the handler that refused it (which may
 * still hold pointers into it). */

/* Frees a lingering connection's receive buffer, unless the update running
 * off the loop still reads it (conn_free frees it then). */
static void linger_release(srv_conn *c)
{
    psd *s = c->srv;
    if (!c->rbuf || (srv_update_busy(s) && s->push_wait.c == c))
        return;
    s->rbuf_bytes -= c->rcap;
    free(c->rbuf);
    c->rbuf = NULL;
    c->rcap = c->rlen = c->rpos = 0;
}

static void discard_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char sink[64 * 1024];
    (void)suggested;
    linger_release((srv_conn *)h);
    buf->base = sink;
    buf->len = sizeof sink;
}

static void on_linger_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    if (nread < 0 && !uv_is_closing((uv_handle_t *)st))
        uv_close((uv_handle_t *)st, srv_conn_on_close);
}

static void on_linger_shutdown(uv_shutdown_t *req, int status)
{
    (void)status; /* the peer may be gone already: reading then ends it */
    free(req);
}

static void linger(srv_conn *c)
{
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, on_linger_shutdown) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, discard_alloc, on_linger_read) != 0) {
        free(req);
        uv_read_stop((uv_stream_t *)&c->tcp);
        uv_close((uv_handle_t *)&c->tcp, srv_conn_on_close);
        return;
    }
    c->linger_until_ms = srv_now_ms() + SRV_LINGER_MS;
}

void srv_linger_tick(psd *s, uint64_t now)
{
    for (srv_conn *c = s->conns; c; c = c->next) {
        if (!c->linger || !c->closing || uv_is_closing((uv_handle_t *)&c->tcp))
            continue;
        linger_release(c);
        if (now >= c->linger_until_ms) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            uv_close((uv_handle_t *)&c->tcp, srv_conn_on_close);
        }
    }
}

void srv_conn_close(srv_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    if (c->err_quiet)
        PS_LOG(PS_LOG_INFO, "conn %llu (%s): %u more errors on this connection were not logged",
               (unsigned long long)c->cid, c->addr, c->err_quiet);
    srv_conn_detach(c, SRV_W_LOST, c->close_reason[0] ? c->close_reason : "connection closed");
    srv_auth_free(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (c->linger && !c->srv->stopping) {
        linger(c);
        return;
    }
    uv_close((uv_handle_t *)&c->tcp, srv_conn_on_close);
}


uint32_t srv_conn_close_workers(psd *s, const char *why)
{
    uint32_t n = 0;
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->role == PS_ROLE_WORKER && !c->closing) {
            snprintf(c->close_reason, sizeof c->close_reason, "%s", why);
            srv_conn_close(c);
            n++;
        }
    return n;
}
