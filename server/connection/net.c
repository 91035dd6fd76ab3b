/* net.c - psd's sockets: the listener, accepting, reading frames into a
 * connection's buffer and handing each to dispatch, resuming connections
 * held while an update ran off the loop, stopping. Writes are in write.c,
 * closing in close.c, reply tensors' encoding in encode.c. */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dispatch/admin.h"
#include "common/log.h"
#include "server/dispatch/handle.h"
#include "server/dispatch/handle_table.h"
#include "server/connection/move_fetch.h"
#include "server/connection/close.h"
#include "server/connection/http.h"
#include "server/connection/net.h"
#include "server/connection/follow.h"
#include "server/connection/write.h"
#include "proto/errors.h"
#include "server/answer/reply.h"
#include "server/session/session.h"
#include "server/update/update.h"
#include "server/update/tapply.h"

#define RBUF_INITIAL (64 * 1024)

/* ---- reading ------------------------------------------------------------ */

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    srv_conn *c = (srv_conn *)h;
    if (c->want_end > c->rlen) {
        /* the rest of a big frame and no more: the next one then starts at
         * the front of the buffer, aligned, and nothing is moved */
        buf->base = (char *)c->rbuf + c->rlen;
        buf->len = c->want_end - c->rlen;
        return;
    }
    if (c->rcap - c->rlen < 4096) {
        size_t cap = c->rcap ? c->rcap * 2 : RBUF_INITIAL;
        uint8_t *p = realloc(c->rbuf, cap);
        if (!p) {
            buf->base = NULL;
            buf->len = 0;
            return;
        }
        c->rbuf = p;
        c->srv->rbuf_bytes += cap - c->rcap;
        c->rcap = cap;
    }
    buf->base = (char *)c->rbuf + c->rlen;
    buf->len = c->rcap - c->rlen;
}

/* Makes room for a whole frame of `need` bytes; bounded by the frame limit
 * checked before, and all connections' buffers with the keys of the parked
 * table pulls by max_receive_memory: PS_ELIMIT when they would pass it,
 * PS_ENOMEM without memory. */
static int ensure_cap(srv_conn *c, size_t need)
{
    psd *s = c->srv;
    if (c->rcap >= need)
        return 0;
    if (s->rbuf_bytes + s->parked_bytes - c->rcap + need > s->cfg.max_receive_memory)
        return PS_ELIMIT;
    srv_rbuf sp = srv_rbuf_spare(need);
    if (sp.mem) {
        /* a buffer the replication log let go (its pages mapped already),
         * with what the frame has so far */
        memcpy(sp.mem, c->rbuf, c->rlen);
        free(c->rbuf);
        c->rbuf = sp.mem;
        s->rbuf_bytes += sp.cap - c->rcap;
        c->rcap = sp.cap;
        return 0;
    }
    uint8_t *p = realloc(c->rbuf, need);
    if (!p)
        return PS_ENOMEM;
    c->rbuf = p;
    s->rbuf_bytes += need - c->rcap;
    c->rcap = need;
    return 0;
}

/* Frames of at least this size are read up to their end and no further
 * (see on_alloc). */
#define BIG_FRAME (64 * 1024)

/* Moves rbuf[pos..rlen) to the front. */
static void compact(srv_conn *c, size_t pos)
{
    if (pos > 0) {
        memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
        c->rlen -= pos;
    }
    c->rpos = 0;
}

/* 1 when buf starts like an HTTP request line (a browser or curl pointed
 * at the protocol port: "GET " read as a frame length is 1195725856). */
static int looks_like_http(const uint8_t *buf, size_t len)
{
    static const char *const methods[] = {"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS "};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        size_t n = strlen(methods[i]);
        if (len >= 4 && memcmp(buf, methods[i], len < n ? len : n) == 0)
            return 1;
    }
    return 0;
}

/* Answers an HTTP request on the protocol port in HTTP, saying what the
 * port is and where the metrics are, logs it, and closes. */
static void answer_http(srv_conn *c)
{
    psd *s = c->srv;
    const char *metrics = srv_http_address(s);
    char where[160], body[512], resp[768];
    if (metrics[0])
        snprintf(where, sizeof where, "psd serves its metrics at http://%s/metrics and its dashboard at http://%s/",
                 metrics, metrics);
    else
        snprintf(where, sizeof where, "psd serves no HTTP: set metrics_listen (e.g. 127.0.0.1:9100) for its metrics "
                                      "and dashboard");
    snprintf(body, sizeof body,
             "This is psd's protocol port: it speaks length-prefixed msgpack frames (proto/PROTOCOL.md), not "
             "HTTP.\n%s.\n", where);
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     strlen(body), body);
    PS_LOG(PS_LOG_INFO, "conn %llu (%s): an HTTP request on the protocol port; %s", (unsigned long long)c->cid,
           c->addr, where);
    uv_buf_t b = uv_buf_init(resp, (unsigned)(n < (int)sizeof resp ? n : (int)sizeof resp - 1));
    (void)uv_try_write((uv_stream_t *)&c->tcp, &b, 1); /* a fresh socket takes it; best effort */
    snprintf(c->close_reason, sizeof c->close_reason, "an HTTP request on the protocol port");
    srv_conn_close(c);
}

static void process_frames(srv_conn *c)
{
    psd *s = c->srv;
    size_t pos = c->rpos;
    c->want_end = 0;
    while (!c->closing && !c->close_after_write) {
        if (srv_update_busy(s) || c->tapply_busy) {
            /* an update is applied off the loop (or this connection's table
             * push is with the apply threads): the rest waits, in place,
             * and what the peer sends meanwhile waits in the kernel */
            c->held = 1;
            c->rpos = pos;
            uv_read_stop((uv_stream_t *)&c->tcp);
            return;
        }
        uint32_t plen = 0;
        uint32_t limit = c->role == PS_ROLE_NONE ? PS_FRAME_MAX_PREAUTH : (uint32_t)s->cfg.max_frame;
        int rc = ps_frame_header(c->rbuf + pos, c->rlen - pos, limit, &plen);
        if (rc == 0)
            break;
        if (rc < 0 && c->role == PS_ROLE_NONE && pos == 0 && looks_like_http(c->rbuf, c->rlen)) {
            answer_http(c);
            return;
        }
        if (rc < 0) {
            srv_send_error(c, 0, rc, 1, "frame length %u is %s (limit %u bytes%s)", plen,
                           rc == PS_ETOO_BIG ? "over the limit" : "invalid", limit,
                           c->role == PS_ROLE_NONE ? " before hello" : "");
            return;
        }
        size_t flen = PS_FRAME_HDR + (size_t)plen;
        if (c->rlen - pos < flen) {
            /* incomplete: it stays where it is when it fits there and starts
             * float-aligned (its tensor is then aligned too); otherwise it
             * moves to the front, and the buffer grows to hold all of it */
            if (pos + flen > c->rcap || pos % PS_DATA_ALIGN != 0)
                compact(c, pos), pos = 0;
            rc = ensure_cap(c, pos + flen);
            if (rc == PS_ELIMIT) {
                snprintf(c->close_reason, sizeof c->close_reason, "receive buffers full (max_receive_memory)");
                srv_send_error(c, 0, PS_ELIMIT, 1,
                               "a %zu-byte frame would take psd's receive buffers past max_receive_memory (%llu "
                               "bytes, %llu in use, %llu of them by waiting table pulls); try again later",
                               flen, (unsigned long long)s->cfg.max_receive_memory,
                               (unsigned long long)(s->rbuf_bytes + s->parked_bytes),
                               (unsigned long long)s->parked_bytes);
                return;
            }
            if (rc != 0) {
                srv_send_error(c, 0, PS_ENOMEM, 1, "no memory for a %zu-byte frame", flen);
                return;
            }
            c->rpos = pos;
            if (flen >= BIG_FRAME)
                c->want_end = pos + flen;
            return;
        }
        ps_msg m;
        char err[256];
        msgpack_zone_clear(&c->zone);
        ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
        SRV_COUNT(s, bytes_in, flen);
        SRV_COUNT(s, frames_in, 1);
        rc = ps_msg_decode(c->rbuf + pos + PS_FRAME_HDR, plen, &lim, &c->zone, &m, &s->scratch_layout, err,
                           sizeof err);
        if (rc != 0 && ps_msg_from_server_only(m.type)) {
            /* a message only psd sends: its type is what is wrong, not
             * the fields it lacks (PROTOCOL.md section 5) */
            rc = PS_EBAD_TYPE;
            snprintf(err, sizeof err, "psd does not accept %s messages (only psd sends them)",
                     ps_msg_type_name(m.type));
        }
        if (rc != 0) {
            /* The framing is intact, so a bad message costs only itself once
             * the connection is established; before hello it ends it. */
            srv_send_error(c, m.has & PS_F_ID ? m.id : 0, rc, c->role == PS_ROLE_NONE, "%s", err);
        } else {
            c->frame_end = pos + flen;
            if (srv_handle(c, &m) == SRV_STOP_READING)
                uv_read_stop((uv_stream_t *)&c->tcp);
            if (c->rbuf_given) {
                /* the handler kept the buffer, and no byte followed the
                 * frame in it: go on in the one it gave back, empty (held
                 * like the others when the frame started an update) */
                c->rbuf_given = 0;
                pos = 0;
                if (srv_update_busy(s))
                    continue;
                break;
            }
        }
        pos += flen;
    }
    if (c->closing)
        return;
    if (pos == c->rlen)
        c->rpos = c->rlen = 0;
    else
        compact(c, pos); /* a few bytes of the next header */
}

int srv_conn_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out)
{
    const uint8_t *d = data;
    if (c->frame_end != c->rlen || c->rbuf_given || !c->rbuf || d < c->rbuf || d >= c->rbuf + c->rlen)
        return -1;
    out->mem = c->rbuf;
    out->cap = c->rcap;
    c->rbuf = repl.mem;
    c->srv->rbuf_bytes -= c->rcap; /* the policy holds that one now */
    c->rcap = repl.mem ? repl.cap : 0;
    c->srv->rbuf_bytes += c->rcap;
    c->rpos = c->rlen = c->want_end = c->frame_end = 0;
    c->rbuf_given = 1;
    return 0;
}

/* Handles what held connections received while an update was applied off
 * the loop, and lets them read again. */
static void resume_held(psd *s)
{
    /* The pusher is held like the others (its reads stopped when its
     * update started). When a frame starts another update, the
     * connections not reached yet stay held, reads stopped, until that one
     * is done. */
    for (srv_conn *c = s->conns, *next; c && !srv_update_busy(s); c = next) {
        next = c->next; /* process_frames may close c; it is freed later */
        if (c->held && !c->closing && !c->tapply_busy) {
            c->held = 0;
            uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
            process_frames(c);
        }
    }
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    srv_conn *c = (srv_conn *)st;
    if (nread < 0) {
        if (nread != UV_EOF)
            PS_LOG(PS_LOG_INFO, "conn %llu (%s): %s", (unsigned long long)c->cid, c->addr, uv_strerror((int)nread));
        srv_conn_close(c);
        return;
    }
    if (nread == 0)
        return;
    if (!buf->base) {
        srv_send_error(c, 0, PS_ENOMEM, 1, "no memory for the read buffer");
        return;
    }
    c->rlen += (size_t)nread;
    if (c->worker)
        c->worker->last_seen_ms = srv_now_ms();
    process_frames(c);
}

/* ---- accepting ----------------------------------------------------------- */

static void peer_name(uv_tcp_t *t, char *out, size_t len)
{
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, host, sizeof host);
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, host, sizeof host);
            port = ntohs(a->sin6_port);
        }
    }
    snprintf(out, len, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
}

/* Whether the peer of t runs on this machine (ps_sock_same_host). Only such
 * a peer can share memory with psd; for any other, a hello naming a
 * process would name one of ours. */
static int peer_same_host(uv_tcp_t *t)
{
    uv_os_fd_t fd;
    return uv_fileno((uv_handle_t *)t, &fd) == 0 && ps_sock_same_host(fd);
}

static void on_connection(uv_stream_t *server, int status)
{
    psd *s = server->data;
    if (status < 0) {
        PS_LOG(PS_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    srv_conn *c = calloc(1, sizeof *c);
    if (!c) {
        PS_LOG(PS_LOG_ERROR, "accept: out of memory");
        return;
    }
    uv_tcp_init(s->loop, &c->tcp);
    c->srv = s;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, (uv_close_cb)free);
        return;
    }
    c->cid = ++s->next_cid;
    c->connected_ms = srv_now_ms();
    msgpack_zone_init(&c->zone, 4096);
    peer_name(&c->tcp, c->addr, sizeof c->addr);
    c->same_host = peer_same_host(&c->tcp);
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    SRV_COUNT(s, connections, 1);
    uv_tcp_nodelay(&c->tcp, 1);
    if (s->cfg.send_buffer) {
        int v = (int)s->cfg.send_buffer;
        if (uv_send_buffer_size((uv_handle_t *)&c->tcp, &v) != 0)
            PS_LOG(PS_LOG_WARN, "conn %llu (%s): cannot set its send buffer to %llu bytes", (unsigned long long)c->cid,
                   c->addr, (unsigned long long)s->cfg.send_buffer);
    }
    PS_LOG(PS_LOG_DEBUG, "conn %llu: accepted from %s", (unsigned long long)c->cid, c->addr);
    /* connections still in their handshake: at most max_handshakes, the
     * oldest making way for the new one */
    int waiting = 0;
    srv_conn *oldest = NULL;
    for (srv_conn *o = c->next; o; o = o->next)
        if (o->role == PS_ROLE_NONE && !o->closing && !o->close_after_write) {
            waiting++;
            oldest = o; /* the list runs from the newest to the oldest */
        }
    if (oldest && waiting >= s->cfg.max_handshakes) {
        snprintf(oldest->close_reason, sizeof oldest->close_reason, "handshake not finished (max_handshakes)");
        srv_send_error(oldest, 0, PS_ELIMIT, 1,
                       "closed to make room: %d connections had not finished their handshake (max_handshakes = "
                       "%d) and this was the oldest",
                       waiting, s->cfg.max_handshakes);
    }
    /* open connections, not counting those psd is closing (their close
     * completes on a later turn of the loop) */
    uint32_t open = 1;
    for (srv_conn *o = c->next; o; o = o->next)
        open += !o->closing && !o->close_after_write;
    if (open > (uint32_t)s->cfg.max_connections) {
        srv_send_error(c, 0, PS_ELIMIT, 1, "too many connections (max_connections = %d)", s->cfg.max_connections);
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* The update engine's done callback: an update run off the loop is
 * installed. The policy finishes it and the push is answered
 * (srv_push_finished), the pulls that waited for it are answered first,
 * then the frames held meanwhile (their pulls come after); a SIGHUP that
 * came meanwhile is applied last. */
static void on_update_done(psd *s, const srv_update_tag *tag)
{
    int wake = 0;
    srv_conn *c = srv_push_finished(s, tag, &wake);
    if (c->free_later)
        srv_conn_free(c);
    if (wake)
        srv_answer_parked(s);
    resume_held(s);
    if (s->reload_pending && !srv_update_busy(s)) {
        s->reload_pending = 0;
        srv_reload(s);
    }
}

/* The apply threads' done callback (table_apply = hogwild): a table push
 * is applied. It is answered (srv_tpush_finished) and its connection reads
 * on, the frames it held first; one closed meanwhile is freed now. */
static void on_tapply_done(void *arg, const srv_tapply_tag *tag, const srv_tapply_result *r)
{
    psd *s = arg;
    srv_conn *c = tag->c;
    srv_tpush_finished(tag, r);
    if (c->free_later) {
        srv_conn_free(c);
        return;
    }
    if (c->held && !c->closing && !srv_update_busy(s)) {
        c->held = 0;
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        process_frames(c);
    }
}

int srv_net_tapply_start(psd *s, char *err, size_t errlen)
{
    if (s->cfg.table_apply != PS_TABLE_APPLY_HOGWILD)
        return 0;
    int n = srv_tapply_threads(s->cfg.table_threads);
    s->tapply = srv_tapply_new(s->loop, n, on_tapply_done, s, err, errlen);
    if (!s->tapply)
        return PS_EINVAL;
    PS_LOG(PS_LOG_INFO, "table_apply = hogwild: %d apply thread%s step the rows of table pushes", n, n == 1 ? "" : "s");
    return 0;
}

void srv_net_tapply_stop(psd *s)
{
    srv_tapply_free(s->tapply);
    s->tapply = NULL;
}

static const srv_io net_io = {
    .send = srv_net_send,
    .send_pieces = srv_net_send_pieces,
    .send_error = srv_net_send_error,
    .give_rbuf = srv_conn_give_rbuf,
};

int srv_listen(psd *s)
{
    s->repl_release = srv_net_repl_release;
    s->step_down = srv_follow_step_down;
    srv_move_fetch_init(s);
    s->io = &net_io;
    srv_update_init(s, on_update_done);
    /* listen, resolved at start (main: srv_listen_resolve), or here */
    struct sockaddr_storage addr = s->settings.listen_addr;
    const char *host = s->cfg.listen.host;
    int port = s->cfg.listen.port;
    char err[512];
    int rc = addr.ss_family ? 0 : srv_listen_resolve(host, port, &addr, err, sizeof err);
    if (rc != 0) {
        PS_LOG(PS_LOG_ERROR, "%s", err);
        return rc;
    }
    uv_tcp_init(s->loop, &s->listener);
    s->listener.data = s;
    rc = uv_tcp_bind(&s->listener, (struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection);
    if (rc != 0) {
        PS_LOG(PS_LOG_ERROR, "cannot listen on %s:%d: %s", host, port, uv_strerror(rc));
        uv_close((uv_handle_t *)&s->listener, NULL);
        return PS_EIO;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &bl);
    s->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    s->listening = 1;
    return 0;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    srv_conn *c = req->data;
    free(req);
    srv_conn_close(c);
}

/* Stops accepting and closes every connection once its queued replies are
 * written; the loop ends when the last handle is closed. */
void srv_stop(psd *s)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    if (s->listening) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        s->listening = 0;
    }
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing) {
            if (c->linger && !uv_is_closing((uv_handle_t *)&c->tcp)) {
                uv_read_stop((uv_stream_t *)&c->tcp);
                uv_close((uv_handle_t *)&c->tcp, srv_conn_on_close);
            }
            continue;
        }
        if (c->parked) {
            /* pulls waiting for a version that will not come */
            /* an error may close c (max_output_buffer), which frees the list */
            for (srv_parked *p = c->parked, *pn; p && !c->closing; p = pn) {
                pn = p->next;
                srv_send_error(c, p->id, PS_ESHUTDOWN, 0, "psd is shutting down");
            }
        }
        srv_conn_detach(c, SRV_W_LEFT, "psd shutting down");
        uv_read_stop((uv_stream_t *)&c->tcp);
        uv_shutdown_t *req = malloc(sizeof *req);
        if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
            free(req);
            srv_conn_close(c);
            continue;
        }
        req->data = c;
    }
}
