/* net.c - psd's sockets: the listener, reading frames into a connection's
 * buffer, queued writes that own their header and hold references to the
 * model blocks their tensor data is sent from, and closing through
 * uv_close. */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dispatch/admin.h"
#include "common/hostport.h"
#include "common/log.h"
#include "server/dispatch/handle.h"
#include "server/connection/encode.h"
#include "server/connection/http.h"
#include "server/connection/net.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"
#include "server/report/status.h"
#include "server/update/update.h"

#define RBUF_INITIAL (64 * 1024)
#define WREQ_INLINE 160

#define WREQ_BLKS 4      /* block references held inline: a chunk spans at most 2 */

/* A queued write: owns its header bytes; tensor bytes come from the model's
 * blocks, referenced until the write is done, or, for a reply in bfloat16,
 * from a buffer they were converted into (owned until then). */
typedef struct srv_wreq {
    uv_write_t req;
    srv_conn *c;
    srv_blk **blk;           /* inline_blk or heap */
    size_t nblk;
    srv_blk *inline_blk[WREQ_BLKS];
    srv_narrow *narrow;      /* converted data (bfloat16, compressed), or NULL */
    psd *srv;
    uint8_t *hdr;            /* inline_hdr or heap */
    uint8_t inline_hdr[WREQ_INLINE];
    struct srv_wreq *next_free;
} srv_wreq;

/* A write request from the pool in psd.out (encode.h), else a new one;
 * NULL when out of memory. */
static srv_wreq *wreq_get(psd *s)
{
    srv_outbufs *o = srv_outbufs_get(s);
    if (!o)
        return NULL;
    srv_wreq *r = o->wreq_free;
    if (r) {
        o->wreq_free = r->next_free;
        o->wreq_free_count--;
        return r;
    }
    r = malloc(sizeof *r);
    if (r) {
        r->blk = r->inline_blk;
        r->nblk = 0;
        r->narrow = NULL;
        r->srv = s;
    }
    return r;
}

static void wreq_put(srv_wreq *r)
{
    if (r->hdr != r->inline_hdr)
        free(r->hdr);
    for (size_t i = 0; i < r->nblk; i++)
        srv_blk_unref(r->blk[i]);
    if (r->blk != r->inline_blk)
        free(r->blk);
    r->blk = r->inline_blk;
    r->nblk = 0;
    srv_outbufs *o = r->srv->out; /* made by wreq_get */
    if (r->narrow)
        srv_narrow_put(o, r->narrow);
    r->narrow = NULL;
    if (o->wreq_free_count >= 256) {
        free(r);
        return;
    }
    r->next_free = o->wreq_free;
    o->wreq_free = r;
    o->wreq_free_count++;
}

void srv_net_free_spare(psd *s)
{
    srv_outbufs *o = s->out;
    while (o && o->wreq_free) {
        srv_wreq *r = o->wreq_free;
        o->wreq_free = r->next_free;
        free(r);
    }
    srv_outbufs_free(s);
}

/* ---- closing ------------------------------------------------------------ */

/* Frees a connection (its handle closed). */
static void conn_free(srv_conn *c)
{
    msgpack_zone_destroy(&c->zone);
    srv_shm_detach(c);
    free(c->wide);
    c->srv->rbuf_bytes -= c->rcap;
    free(c->rbuf);
    free(c);
}

static void on_close(uv_handle_t *h)
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
    if (srv_update_busy(s) && s->push_wait.c == c) {
        c->free_later = 1; /* the update still reads its receive buffer */
        return;
    }
    conn_free(c);
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
        uv_close((uv_handle_t *)st, on_close);
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
        uv_close((uv_handle_t *)&c->tcp, on_close);
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
            uv_close((uv_handle_t *)&c->tcp, on_close);
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
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

/* ---- writing ------------------------------------------------------------ */

static void on_write(uv_write_t *req, int status)
{
    srv_wreq *r = (srv_wreq *)req;
    srv_conn *c = r->c;
    wreq_put(r);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        PS_LOG(PS_LOG_DEBUG, "conn %llu (%s): write failed: %s", (unsigned long long)c->cid, c->addr,
               uv_strerror(status));
        srv_conn_close(c);
        return;
    }
    if (c->close_after_write && !c->closing && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0)
        srv_conn_close(c);
}

/* Disconnects c when the replies queued for it pass max_output_buffer: it
 * sends requests but stopped reading (Redis's client-output-buffer-limit).
 * A reply of `last` bytes just queued alone over the limit is let through. */
static void check_output(srv_conn *c, size_t last)
{
    psd *s = c->srv;
    size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (queued <= s->cfg.max_output_buffer || queued <= last)
        return;
    s->stats.disconnects_output++;
    PS_LOG(PS_LOG_WARN, "conn %llu (%s): %zu bytes of replies unsent, over max_output_buffer (%llu): the client "
                        "does not read them; closing",
           (unsigned long long)c->cid, c->addr, queued, (unsigned long long)s->cfg.max_output_buffer);
    snprintf(c->close_reason, sizeof c->close_reason, "stopped reading its replies (over max_output_buffer)");
    srv_conn_close(c);
}

/* psd.io->send: see srv_send (psd.h). */
static void net_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    psd *s = c->srv;
    size_t dlen = 0;
    if (c->closing)
        return;
    /* compressed values (rdt 3) are made first: their size is in the
     * header. They go as float32 when that is not worth it (ps_codec_worth). */
    srv_narrow *z = NULL;
    ps_msg zm;
    if ((m->has & PS_F_DATA) && m->dt == PS_DT_F32ZSTD && m->ndata) {
        if (!(z = srv_narrow_of(s, m, blk))) {
            srv_conn_close(c);
            return;
        }
        zm = *m;
        if (ps_codec_worth(z->len, zm.ndata * sizeof(float))) {
            zm.has |= PS_F_LEN;
            zm.len = zm.ndata;
            zm.packed = (const uint8_t *)z->v;
            zm.packed_len = z->len;
            s->stats.zstd_sent += z->len;
            s->stats.zstd_sent_raw += zm.ndata * sizeof(float);
        } else {
            zm.has &= ~(uint64_t)PS_F_DT;
            zm.dt = PS_DT_F32;
            srv_narrow_put(s->out, z);
            z = NULL;
        }
        m = &zm;
    }
    int rc = ps_msg_encode(m, &s->enc, &dlen, m->type == PS_MSG_STATUS_REPLY ? srv_pack_status : NULL, s);
    srv_wreq *r = rc == 0 ? wreq_get(s) : NULL;
    if (!r) {
        if (rc != 0)
            PS_LOG(PS_LOG_ERROR, "conn %llu: cannot encode %s reply: %s", (unsigned long long)c->cid,
                   ps_msg_type_name(m->type), ps_strerror(rc));
        if (z)
            srv_narrow_put(s->out, z);
        srv_conn_close(c);
        return;
    }
    r->narrow = z; /* wreq_put lets it go */
    r->c = c;
    r->hdr = r->inline_hdr;
    /* the data's pieces, one per block; the buffer list on the stack when short */
    size_t npieces = 0;
    if (dlen) {
        assert(blk); /* data goes out from the blocks only */
        uint64_t first = m->off >> SRV_BLK_SHIFT, last = (m->off + m->ndata - 1) >> SRV_BLK_SHIFT;
        npieces = m->dt == PS_DT_BF16 || z ? 1 : (size_t)(last - first + 1);
    }
    uv_buf_t small[1 + WREQ_BLKS], *bufs = small;
    if (npieces > WREQ_BLKS) {
        bufs = malloc((1 + npieces) * sizeof *bufs);
        r->blk = malloc(npieces * sizeof *r->blk);
        if (!bufs || !r->blk) {
            if (bufs != small)
                free(bufs);
            if (!r->blk)
                r->blk = r->inline_blk;
            wreq_put(r);
            srv_conn_close(c);
            return;
        }
    }
    if (s->enc.len > WREQ_INLINE && !(r->hdr = malloc(s->enc.len))) {
        r->hdr = r->inline_hdr;
        wreq_put(r);
        if (bufs != small)
            free(bufs);
        srv_conn_close(c);
        return;
    }
    memcpy(r->hdr, s->enc.p, s->enc.len);
    bufs[0] = uv_buf_init((char *)r->hdr, (unsigned)s->enc.len);
    uint64_t off = m->off, left = m->ndata;
    if (dlen && m->dt == PS_DT_BF16) {
        /* converted now, from the blocks as they are: one piece */
        if (!(r->narrow = srv_narrow_of(s, m, blk))) {
            wreq_put(r);
            if (bufs != small)
                free(bufs);
            srv_conn_close(c);
            return;
        }
    }
    if (dlen && r->narrow)
        bufs[1] = uv_buf_init((char *)r->narrow->v, (unsigned)dlen);
    for (size_t i = 0; i < npieces && !r->narrow; i++) {
        size_t len;
        const float *p = srv_blocks_at(blk, off, left, &len);
        r->blk[i] = srv_blk_ref(blk[off >> SRV_BLK_SHIFT]);
        r->nblk = i + 1;
        bufs[1 + i] = uv_buf_init((char *)(uintptr_t)p, (unsigned)(len * sizeof(float)));
        off += len;
        left -= len;
    }
    s->stats.bytes_out += s->enc.len + dlen;
    rc = uv_write(&r->req, (uv_stream_t *)&c->tcp, bufs, (unsigned)(1 + npieces), on_write);
    if (bufs != small)
        free(bufs);
    if (rc != 0) {
        wreq_put(r);
        srv_conn_close(c);
        return;
    }
    check_output(c, s->enc.len + dlen);
}

/* psd.io->send_error: logs and counts the error, queues the ERROR reply and,
 * when fatal, closes c once it is written. */
/* Errors that only a broken or hostile client gets: counted per
 * connection, which is closed at SRV_PROTO_ERRORS_MAX. */
static int is_protocol_error(int code)
{
    return code == PS_EMALFORMED || code == PS_EBAD_TYPE || code == PS_EBAD_FIELD || code == PS_ESTATE ||
           code == PS_EFORBIDDEN;
}

/* "; N more errors not logged" when some were left out since the last line. */
static void quiet_note(srv_conn *c, char *buf, size_t len)
{
    buf[0] = 0;
    if (c->err_quiet)
        snprintf(buf, len, " (%u more errors on this connection not logged before this one)", c->err_quiet);
}

static void net_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text)
{
    psd *s = c->srv;
    unsigned idx = (unsigned)(-code);
    if (idx < sizeof s->stats.rejected / sizeof s->stats.rejected[0])
        s->stats.rejected[idx]++;
    const char *why = "";
    if (is_protocol_error(code) && ++c->proto_errors >= SRV_PROTO_ERRORS_MAX && !fatal) {
        fatal = 1;
        why = " (too many protocol errors)";
        snprintf(c->close_reason, sizeof c->close_reason, "%d protocol errors", SRV_PROTO_ERRORS_MAX);
    }
    /* the first lines for a connection, then one a second: a client
     * sending bad frames in a loop must not fill the log */
    uint64_t now = srv_now_ms();
    if (fatal || c->err_lines < SRV_ERR_LINES_FREE || now - c->err_line_ms >= 1000) {
        char who[32] = "", quiet[96];
        if (c->worker)
            snprintf(who, sizeof who, ", shard %u/%u", c->worker->shard, c->worker->nshards);
        quiet_note(c, quiet, sizeof quiet);
        PS_LOG(fatal ? PS_LOG_WARN : PS_LOG_INFO, "conn %llu (%s%s): %s: %s%s%s%s", (unsigned long long)c->cid,
               c->addr, who, ps_errname(code), text, fatal ? "; closing" : "", why, quiet);
        c->err_lines++;
        c->err_line_ms = now;
        c->err_quiet = 0;
    } else {
        c->err_quiet++;
    }
    ps_msg m;
    ps_msg_init(&m, PS_MSG_ERROR);
    m.has = PS_F_ID | PS_F_CODE | PS_F_TEXT;
    m.id = id;
    m.code = -code;
    m.text = text;
    m.text_len = (uint32_t)strlen(text);
    net_send(c, &m, NULL);
    if (fatal && !c->closing) {
        c->close_after_write = 1;
        c->linger = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0)
            srv_conn_close(c);
    }
}

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
 * checked before, and all connections' buffers by max_receive_memory:
 * PS_ELIMIT when they would pass it, PS_ENOMEM without memory. */
static int ensure_cap(srv_conn *c, size_t need)
{
    psd *s = c->srv;
    if (c->rcap >= need)
        return 0;
    if (s->rbuf_bytes - c->rcap + need > s->cfg.max_receive_memory)
        return PS_ELIMIT;
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
        if (srv_update_busy(s)) {
            /* an update is applied off the loop: the rest waits, in place,
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
                               "bytes, %llu in use); try again later",
                               flen, (unsigned long long)s->cfg.max_receive_memory,
                               (unsigned long long)s->rbuf_bytes);
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
        s->stats.bytes_in += flen;
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
            srv_handle(c, &m);
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
        if (c->held && !c->closing) {
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
    s->stats.connections++;
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
        conn_free(c);
    if (wake)
        srv_answer_parked(s);
    resume_held(s);
    if (s->reload_pending && !srv_update_busy(s)) {
        s->reload_pending = 0;
        srv_reload(s);
    }
}

static const srv_io net_io = {
    .send = net_send,
    .send_error = net_send_error,
    .give_rbuf = srv_conn_give_rbuf,
};

int srv_listen(psd *s)
{
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
                uv_close((uv_handle_t *)&c->tcp, on_close);
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
