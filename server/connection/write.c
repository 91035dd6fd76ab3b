/* write.c - queued writes: a reply's header encoded into a write request
 * that owns it, its tensor sent from the model's blocks (referenced until
 * the write is done) or from a buffer encode.c converted it into; ERROR
 * replies; cutting a client that stops reading its replies. Owns the write
 * requests (their pool is psd.out, encode.h). */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/store/parts.h"
#include "server/connection/encode.h"
#include "server/connection/write.h"
#include "server/connection/net.h"
#include "proto/errors.h"
#include "server/report/status.h"
#include "server/dispatch/admin.h"
#include "server/replog/replog.h"

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
    SRV_COUNT(s, disconnects_output, 1);
    PS_LOG(PS_LOG_WARN, "conn %llu (%s): %zu bytes of replies unsent, over max_output_buffer (%llu): the client "
                        "does not read them; closing",
           (unsigned long long)c->cid, c->addr, queued, (unsigned long long)s->cfg.max_output_buffer);
    snprintf(c->close_reason, sizeof c->close_reason, "stopped reading its replies (over max_output_buffer)");
    srv_conn_close(c);
}

/* ---- replies held for the followers (replication = sync) ------------------ */

typedef struct held_write {
    srv_held h;
    srv_wreq *r;
    srv_conn *c;
    unsigned nbufs;
    uv_buf_t bufs[];
} held_write;

static void held_drop(srv_held *h)
{
    held_write *w = (held_write *)h;
    wreq_put(w->r);
    free(w);
}

/* Past the lease's fence (coord/, docs/fault-tolerance.md): this leader may
 * have lost its part to another, so a worker's reply goes only once every
 * follower it knows is in sync, has fetched since the fence and holds it
 * (a follower that fetches from its leader does not campaign), and a
 * lagging follower is not dropped. */
static int fenced(const psd *s)
{
    return s->coord.fence_ms && srv_now_ms() >= s->coord.fence_ms;
}

static int all_followers_hold(const psd *s, uint64_t lsn)
{
    uint32_t used = 0;
    for (int i = 0; s->replog && i < SRV_FOLLOWERS_MAX; i++)
        if (s->replog->f[i].used) {
            used++;
            if (s->replog->f[i].last_ms < s->coord.fence_ms)
                return 0; /* silent since before the fence: it may lead by now */
        }
    return used && srv_replog_insync(s) == used && lsn <= srv_replog_acked(s);
}

/* With a coordinator: whether a follower that etcd's in-sync key names (a
 * follower that could be elected) has not fetched past lsn. A follower
 * that left the in-sync set still counts until etcd has the smaller set
 * (coord.c writes it at once). */
static int named_lack(const psd *s, uint64_t lsn)
{
    for (int i = 0; s->replog && s->coord.published && i < SRV_FOLLOWERS_MAX; i++)
        if ((s->coord.published >> i & 1) && s->replog->f[i].used && s->replog->f[i].pos < lsn)
            return 1;
    return 0;
}

/* Whether a reply to c must wait for the followers: with replication =
 * sync and a follower in sync, a worker's reply waits until they hold every
 * change made before it (the push it answers among them); a reply queued
 * behind one waiting waits too. *lsn: the position it waits for. */
static int must_hold(psd *s, srv_conn *c, uint64_t *lsn)
{
    if (c->held_head) {
        *lsn = c->held_tail->lsn;
        return 1;
    }
    int fence = c->role == PS_ROLE_WORKER && fenced(s);
    if (!fence && (!s->replog || (c->role != PS_ROLE_WORKER && !c->mover)))
        return 0;
    if (s->replog) {
        srv_replog_flush(s);
        srv_admin_repl_wake(s); /* waiting fetches get the new records (async too: not on the tick) */
    }
    if (!fence && s->cfg.replication != PS_REPLICATION_SYNC)
        return 0;
    *lsn = srv_replog_end(s);
    if (fence) {
        if (all_followers_hold(s, *lsn)) { /* nothing new since their last fetch */
            SRV_COUNT(s, fenced_acks, 1);
            return 0;
        }
        SRV_COUNT(s, fenced_held, 1);
        return 1;
    }
    return (srv_replog_insync(s) > 0 && *lsn > srv_replog_acked(s)) || named_lack(s, *lsn);
}

static void hold(srv_conn *c, srv_wreq *r, const uv_buf_t *bufs, unsigned n, uint64_t lsn)
{
    held_write *w = malloc(sizeof *w + n * sizeof *bufs);
    if (!w) {
        wreq_put(r);
        srv_conn_close(c);
        return;
    }
    w->h = (srv_held){.next = NULL, .lsn = lsn, .drop = held_drop};
    w->r = r;
    w->c = c;
    w->nbufs = n;
    memcpy(w->bufs, bufs, n * sizeof *bufs);
    if (c->held_tail)
        c->held_tail->next = &w->h;
    else
        c->held_head = &w->h;
    c->held_tail = &w->h;
}

/* psd.repl_release: sends the held replies the followers now hold (all of
 * them when no follower is in sync any more; past the lease's fence, only
 * those every follower holds). */
void srv_net_repl_release(psd *s)
{
    uint64_t acked = srv_replog_acked(s);
    int fence = fenced(s);
    for (srv_conn *c = s->conns; c; c = c->next) {
        while (c->held_head && (fence ? all_followers_hold(s, c->held_head->lsn)
                                      : (c->held_head->lsn <= acked || srv_replog_insync(s) == 0) &&
                                            !named_lack(s, c->held_head->lsn))) {
            if (fence)
                SRV_COUNT(s, fenced_acks, 1);
            held_write *w = (held_write *)c->held_head;
            c->held_head = w->h.next;
            if (!c->held_head)
                c->held_tail = NULL;
            if (c->closing || uv_write(&w->r->req, (uv_stream_t *)&c->tcp, w->bufs, w->nbufs, on_write) != 0) {
                wreq_put(w->r);
                free(w);
                continue;
            }
            free(w);
        }
    }
}

/* Queues m; its data, when it has some, from the blocks blk (by m->off)
 * or, with pc, from the pieces pc[0..npc) in order. */
static void send_data(srv_conn *c, const ps_msg *m, srv_blk *const *blk, const srv_piece *pc, size_t npc);

/* psd.io->send: see srv_send (psd.h). */
void srv_net_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk)
{
    send_data(c, m, blk, NULL, 0);
}

/* psd.io->send_pieces: see srv_send_pieces (reply.h). */
void srv_net_send_pieces(srv_conn *c, const ps_msg *m, const srv_piece *pc, size_t npc)
{
    send_data(c, m, NULL, pc, npc);
}

static void send_data(srv_conn *c, const ps_msg *m, srv_blk *const *blk, const srv_piece *pc, size_t npc)
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
            SRV_COUNT(s, zstd_sent, z->len);
            SRV_COUNT(s, zstd_sent_raw, zm.ndata * sizeof(float));
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
    if (dlen && pc) {
        assert(m->dt == PS_DT_F32 && !z); /* pieces go as they are */
        npieces = npc;
    } else if (dlen) {
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
    for (size_t i = 0; pc && i < npieces; i++) {
        r->blk[i] = pc[i].owner ? srv_blk_ref(pc[i].owner) : NULL;
        r->nblk = i + 1;
        bufs[1 + i] = uv_buf_init((char *)(uintptr_t)pc[i].p, (unsigned)pc[i].len);
    }
    for (size_t i = 0; !pc && i < npieces && !r->narrow; i++) {
        size_t len;
        const float *p = srv_blocks_at(blk, off, left, &len);
        r->blk[i] = srv_blk_ref(blk[off >> SRV_BLK_SHIFT]);
        r->nblk = i + 1;
        bufs[1 + i] = uv_buf_init((char *)(uintptr_t)p, (unsigned)(len * sizeof(float)));
        off += len;
        left -= len;
    }
    SRV_COUNT(s, bytes_out, s->enc.len + dlen);
    uint64_t lsn;
    if (must_hold(s, c, &lsn)) {
        hold(c, r, bufs, (unsigned)(1 + npieces), lsn);
        if (bufs != small)
            free(bufs);
        return;
    }
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

void srv_net_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *text)
{
    psd *s = c->srv;
    srv_stats_rejected(s, code);
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
    if (code == PS_EMOVED || code == PS_ELAYOUT) /* the part map, when psd holds one (PROTOCOL.md 18) */
        srv_parts_put(&s->parts, &m, code == PS_EMOVED);
    if (code == PS_ENOT_LEADER && s->follow) { /* where the leader is (PROTOCOL.md 15) */
        m.has2 |= PS_F2_LEADER;
        m.leader = (ps_str){s->follow->leader, (uint32_t)strlen(s->follow->leader)};
    }
    srv_net_send(c, &m, NULL);
    if (fatal && !c->closing) {
        c->close_after_write = 1;
        c->linger = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0)
            srv_conn_close(c);
    }
}

