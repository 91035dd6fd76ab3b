/* replog.c - the replication log: records of a leader's changes, in order,
 * for its followers (replog.h; the records' bytes are in PROTOCOL.md 17).
 * Owns psd.replog and the followers' slots; a fetch's answer is made in
 * replog_answer.c, and a follower applies the records in replog_apply.c. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/errors.h"
#include "proto/msg.h"
#include "server/replog/replog.h"
#include "server/replog/records.h"
#include "server/tables/sparse_optim.h"

uint64_t srv_replog_end(const psd *s)
{
    return s->replog ? s->replog->base + s->replog->len : 0;
}

int srv_replog_start(psd *s)
{
    if (s->replog)
        return 0;
    srv_replog *r = calloc(1, sizeof *r);
    if (!r)
        return PS_ENOMEM;
    r->max_bytes = LOG_MAX_DEFAULT;
    /* FOR TESTS ONLY: a smaller bound, for a test of a follower that
     * catches up while the log moves on (test_replica) */
    const char *test_max = getenv("PSD_TEST_REPLOG_MAX_BYTES");
    if (test_max && strtoull(test_max, NULL, 10) > 0)
        r->max_bytes = (size_t)strtoull(test_max, NULL, 10);
    r->seg_bytes = r->max_bytes / 16;
    if (r->seg_bytes < ((size_t)4 << 10))
        r->seg_bytes = (size_t)4 << 10;
    if (r->seg_bytes > PIECE_MAX)
        r->seg_bytes = PIECE_MAX;
    r->seg_bytes &= ~(((size_t)4 << 10) - 1); /* whole pages */
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        r->f[i].snap_fd = -1;
    r->history = ((uint64_t)srv_now_ms() << 20) ^ (uint64_t)(uintptr_t)r;
    /* everything as it is now is in the snapshot taken at this position */
    r->sent_layout = s->model.blk != NULL;
    r->sent_tables = s->tables.n;
    r->sent_version = s->model.version;
    r->sent_init = s->model.initialized;
    r->sent_bounds = s->tables.bounds;
    r->sent_max_bytes = s->tables.max_bytes;
    srv_model_unmark(&s->model);
    s->replog = r;
    PS_LOG(PS_LOG_INFO, "replication: the log starts (a follower asked for a snapshot)");
    return 0;
}

void srv_replog_free(psd *s)
{
    ps_buf_free(&s->apply_scratch); /* a follower's (replog_apply.c) */
    if (!s->replog)
        return;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        srv_replog_snap_close(&s->replog->f[i]);
    for (size_t i = 0; i < s->replog->nshadow; i++)
        srv_blk_unref(s->replog->shadow[i]);
    srv_blk_unref(s->replog->small);
    free(s->replog->shadow);
    for (size_t i = 0; i < s->replog->nseg; i++)
        srv_blk_unref(s->replog->seg[i].blk);
    free(s->replog->seg);
    srv_blk_unref(s->replog->spare);
    srv_blk_unref(s->replog->grad_spare);
    free(s->replog);
    s->replog = NULL;
}

/* The piece that holds position pos (base <= pos < base + len). */
static const srv_replog_seg *seg_of(const srv_replog *r, uint64_t pos)
{
    size_t lo = 0, hi = r->nseg; /* the last piece whose base <= pos */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (r->seg[mid].base <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return &r->seg[lo];
}

const uint8_t *srv_replog_at(const srv_replog *r, size_t off)
{
    const srv_replog_seg *g = seg_of(r, r->base + off);
    return g->buf + (r->base + off - g->base);
}

srv_blk *srv_replog_owner(const srv_replog *r, size_t off, size_t *left)
{
    const srv_replog_seg *g = seg_of(r, r->base + off);
    *left = (size_t)(g->base + g->len - (r->base + off));
    return g->blk;
}

/* Room for one more piece: 0 or -1. */
static int seg_room(srv_replog *r)
{
    if (r->nseg == r->segcap) {
        size_t cap = r->segcap ? 2 * r->segcap : 16;
        srv_replog_seg *g = realloc(r->seg, cap * sizeof *g);
        if (!g)
            return -1;
        r->seg = g;
        r->segcap = cap;
    }
    return 0;
}

/* A gradient's piece rounds its block up to this many floats (1 MiB), so
 * that the next gradient of about its size reuses it. */
#define GRAD_BLK_ROUND ((size_t)1 << 18)

/* A kept block for a piece of need bytes: *keep when nothing sends from it
 * any more and it is big enough (taken from *keep), else a fresh one of
 * round(need) floats; NULL when out of memory. */
static srv_blk *piece_blk(srv_blk **keep, size_t need, size_t round)
{
    size_t words = ((need + 3) / 4 + round - 1) / round * round;
    srv_blk *b = *keep;
    *keep = NULL;
    if (b && (b->refs > 1 || b->cap < words)) {
        srv_blk_unref(b);
        b = NULL;
    }
    return b ? b : srv_blk_fresh(words);
}

/* A new last piece for one gradient's record of need bytes, sealed: a
 * block of its own, which a fetch's answer sends from. 0 or -1. */
static int new_grad_seg(srv_replog *r, size_t need)
{
    srv_blk *b = seg_room(r) == 0 ? piece_blk(&r->grad_spare, need, GRAD_BLK_ROUND) : NULL;
    if (!b)
        return -1;
    r->seg[r->nseg++] = (srv_replog_seg){.base = r->base + r->len, .cap = need, .buf = (uint8_t *)b->w, .blk = b,
                                         .sealed = 1};
    return 0;
}

/* A new last piece, room for need bytes at least (seg_bytes, or need
 * rounded up to a multiple of it when more, so that a record of about the
 * last big one's size finds a block of that size in the block pool; only a
 * piece of seg_bytes is kept as the spare, so that a big record leaves the
 * next pieces their size): 0 or -1. */
static int new_seg(srv_replog *r, size_t need)
{
    srv_blk *b = seg_room(r) == 0 ? piece_blk(&r->spare, need, r->seg_bytes / 4) : NULL;
    if (!b)
        return -1;
    r->seg[r->nseg++] = (srv_replog_seg){.base = r->base + r->len, .cap = b->cap * 4, .buf = (uint8_t *)b->w,
                                         .blk = b};
    return 0;
}

/* Drops the records before low (a record's start): the pieces that end at
 * or before it go whole, but the last one, which starts over empty when
 * low is its end and no answer sends from it (with the followers at the
 * log's end, the next records are written where the last ones were, in
 * the cache). No record is ever moved. */
static void drop_below(srv_replog *r, uint64_t low)
{
    uint64_t end = r->base + r->len;
    size_t n = 0;
    while (n + 1 < r->nseg && r->seg[n].base + r->seg[n].len <= low)
        n++;
    if (n + 1 == r->nseg && r->seg[n].sealed && r->seg[n].base + r->seg[n].len <= low)
        n++; /* a gradient's piece takes no more records: it goes even when last */
    for (size_t i = 0; i < n; i++) {
        /* kept for the next piece, its pages mapped already (an answer may
         * still send from it: the next piece takes it only once it is done) */
        srv_blk *b = r->seg[i].blk;
        srv_blk **keep = r->seg[i].sealed ? &r->grad_spare : &r->spare;
        if (!*keep && !b->ext && (r->seg[i].sealed || r->seg[i].cap == r->seg_bytes))
            *keep = b;
        else
            srv_blk_unref(b);
    }
    if (n) {
        memmove(r->seg, r->seg + n, (r->nseg - n) * sizeof *r->seg); /* a few pointers */
        r->nseg -= n;
    }
    if (r->nseg == 1 && !r->seg[0].sealed && r->seg[0].blk->refs == 1 && low == end) {
        r->seg[0].len = 0;
        r->seg[0].base = end;
    }
    r->base = r->nseg ? r->seg[0].base : end;
    r->len = (size_t)(end - r->base);
}

/* Room for a record of len bytes (after its 4-byte length); its start, or
 * NULL when out of memory (the followers then miss it: they are dropped
 * from the in-sync set and must snapshot again). */
static uint8_t *rec_begin(psd *s, size_t len, int kind)
{
    srv_replog *r = s->replog;
    size_t need = 4 + len;
    srv_replog_seg *last = r->nseg ? &r->seg[r->nseg - 1] : NULL;
    if (kind == REC_GRAD || !last || last->sealed || last->len + need > last->cap) {
        if ((kind == REC_GRAD ? new_grad_seg(r, need) : new_seg(r, need)) != 0) {
            PS_LOG(PS_LOG_ERROR, "replication: no memory for a %zu-byte record: the followers start over", len);
            for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
                r->f[i].pos = 0, r->f[i].insync = 0;
            drop_below(r, r->base + r->len);
            return NULL;
        }
        last = &r->seg[r->nseg - 1];
    }
    uint8_t *p = last->buf + last->len;
    put_u32(p, (uint32_t)len);
    p[4] = (uint8_t)kind;
    last->len += need;
    r->len += need;
    r->records++;
    r->bytes += 4 + len;
    return p + 5;
}

static void rec_layout(psd *s)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE | PS_F_LAYOUT; /* a HELLO's required fields, so that it decodes as one */
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_ADMIN;
    m.layout = &s->model.layout;
    ps_buf b = {0};
    size_t dlen = 0;
    if (ps_msg_encode(&m, &b, &dlen, NULL, NULL) != 0) {
        ps_buf_free(&b);
        return;
    }
    /* the message without its frame's length prefix */
    uint8_t *p = b.len > PS_FRAME_HDR ? rec_begin(s, 1 + b.len - PS_FRAME_HDR, REC_LAYOUT) : NULL;
    if (p)
        memcpy(p, b.p + PS_FRAME_HDR, b.len - PS_FRAME_HDR);
    ps_buf_free(&b);
}

static void rec_table(psd *s, uint32_t i)
{
    const ps_table_def *d = srv_tables_def(&s->tables, i);
    size_t len = 1 + 4 + sizeof d->name + 4 + 4 + 8 + 8 + 4 + 8 * PS_HP_COUNT + 4 + 4;
    uint8_t *p = rec_begin(s, len, REC_TABLE);
    if (!p)
        return;
    put_u32(p, i), p += 4;
    memcpy(p, d->name, sizeof d->name), p += sizeof d->name;
    put_u32(p, d->dim), p += 4;
    put_u32(p, d->rinit), p += 4;
    put_f64(p, d->scale), p += 8;
    put_u64(p, d->seed), p += 8;
    put_u32(p, d->opt), p += 4;
    for (int k = 0; k < PS_HP_COUNT; k++)
        put_f64(p, d->hp[k]), p += 8;
    put_u32(p, d->part), p += 4;
    put_u32(p, d->nparts);
}

static void rec_bounds(psd *s)
{
    const srv_table_bounds *b = &s->tables.bounds;
    uint8_t *p = rec_begin(s, 1 + 4 + 8 + 8 + 4 + 8, REC_BOUNDS);
    if (!p)
        return;
    put_u32(p, b->admit), p += 4;
    put_u64(p, b->expire), p += 8;
    put_u64(p, b->table_bytes), p += 8;
    put_u32(p, (uint32_t)b->full), p += 4;
    put_u64(p, s->tables.max_bytes);
}

/* A bsp job's plan, fixed by a worker's hello: a follower promoted runs
 * the rounds by it (PROTOCOL.md 8, "The plan"). */
static void rec_plan(psd *s)
{
    const ps_plan *pl = &s->plan.p;
    uint8_t *p = rec_begin(s, 1 + 32, REC_PLAN);
    if (!p)
        return;
    put_u64(p, pl->epochs);
    put_u64(p + 8, pl->samples);
    put_u64(p + 16, pl->batch);
    put_u64(p + 24, pl->seed);
}

/* The dense range [lo, hi) changed, and the version after: a mark of 28
 * bytes. Its values are read from the model when a fetch ships it
 * (srv_replog_answer_make), so that pushes between two fetches go once. */
static void rec_dense(psd *s, uint64_t lo, uint64_t hi)
{
    srv_model *m = &s->model;
    uint8_t *p = rec_begin(s, 1 + DENSE_MARK, REC_DENSE);
    if (!p)
        return;
    put_u64(p, m->version);
    put_u32(p + 8, (uint32_t)m->initialized);
    put_u64(p + 12, lo);
    put_u64(p + 20, hi - lo);
    s->replog->dense_records++;
    if (hi > lo)
        s->replog->values_end = srv_replog_end(s);
}

void srv_replog_flush(psd *s)
{
    srv_replog *r = s->replog;
    if (!r || s->upd.running)
        return; /* an update off the loop: shipped once it is installed */
    srv_model *m = &s->model;
    if (!r->sent_layout && m->blk) {
        rec_layout(s);
        r->sent_layout = 1;
    }
    while (r->sent_tables < s->tables.n)
        rec_table(s, r->sent_tables++);
    if (memcmp(&r->sent_bounds, &s->tables.bounds, sizeof r->sent_bounds) != 0 ||
        r->sent_max_bytes != s->tables.max_bytes) {
        rec_bounds(s);
        r->sent_bounds = s->tables.bounds;
        r->sent_max_bytes = s->tables.max_bytes;
    }
    if (s->plan.set && memcmp(&r->sent_plan, &s->plan.p, sizeof r->sent_plan) != 0) {
        rec_plan(s);
        r->sent_plan = s->plan.p;
    }
    uint64_t lo = m->dirty_lo, hi = m->dirty_hi;
    if (m->blk && (hi > lo || m->version != r->sent_version || m->initialized != r->sent_init)) {
        if (hi > m->layout.total)
            hi = m->layout.total;
        if (lo > hi)
            lo = hi;
        /* in pieces of whole blocks, so that a fetch's answer stays bounded */
        for (uint64_t at = lo; at < hi || at == lo;) {
            uint64_t next = (at / DENSE_PIECE + 1) * DENSE_PIECE;
            rec_dense(s, at, hi < next ? hi : next);
            if (hi <= next)
                break;
            at = next;
        }
        r->sent_version = m->version;
        r->sent_init = m->initialized;
    }
    srv_model_unmark(m);
}

void srv_replog_rows(psd *s, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g, double scale)
{
    if (!s->replog)
        return;
    srv_replog_flush(s); /* its table's declaration goes first */
    uint32_t dim = srv_tables_def(&s->tables, ti)->dim;
    size_t len = 1 + 4 + 4 + 8 + (size_t)n * 8 + (size_t)n * dim * 4;
    uint8_t *p = rec_begin(s, len, REC_ROWS);
    if (!p)
        return;
    put_u32(p, ti), p += 4;
    put_u32(p, n), p += 4;
    put_f64(p, scale), p += 8;
    memcpy(p, keys, (size_t)n * 8), p += (size_t)n * 8;
    memcpy(p, g, (size_t)n * dim * 4);
    s->replog->table_records++;
    s->replog->table_bytes += 4 + len;
}

int srv_replog_grad_ok(psd *s, uint64_t n)
{
    srv_replog *r = s->replog;
    if (!r || !s->model.blk || !s->model.initialized || (uint64_t)n * 4 > r->max_bytes / 4 ||
        (uint64_t)n * 4 + GRAD_HEAD + 1 > UINT32_MAX)
        return 0;
    srv_replog_flush(s); /* what changed before it goes first */
    /* a dense mark a follower has not fetched past would ship the values as
     * they are when it is answered, this update's included: the follower
     * would then apply the update twice */
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && (r->f[i].pos < r->values_end || strcmp(r->f[i].release, PSD_VERSION) != 0))
            return 0;
    return 1;
}

/* The optimizer's settings, when they differ from the last logged. */
static void rec_optim(psd *s)
{
    srv_replog *r = s->replog;
    uint8_t b[SRV_OPTIM_SETTINGS_BYTES];
    srv_optim_settings_pack(&s->model.opt, b);
    if (memcmp(b, r->sent_optim, sizeof b) == 0)
        return;
    uint8_t *p = rec_begin(s, 1 + sizeof b + RELEASE_BYTES, REC_OPTIM);
    if (!p)
        return;
    memcpy(p, b, sizeof b);
    memset(p + sizeof b, 0, RELEASE_BYTES);
    memcpy(p + sizeof b, PSD_VERSION, strnlen(PSD_VERSION, RELEASE_BYTES - 1));
    memcpy(r->sent_optim, b, sizeof b);
}

const char *srv_replog_release(void)
{
    return PSD_VERSION;
}

srv_blk *srv_replog_take(psd *s, srv_conn *conn, const float *g)
{
    const uint8_t *gp = (const uint8_t *)g;
    if (!s->replog || !conn || conn->closing || !s->io || !s->io->give_rbuf || !conn->rbuf || gp < conn->rbuf ||
        (size_t)(gp - conn->rbuf) < 5 + GRAD_HEAD)
        return NULL; /* not in its receive buffer, or no room for a record's head before it */
    /* none in its place: its next big frame takes the one this log lets go
     * by then (the follower fetched it before the worker's reply went), so
     * that one buffer, warm, takes the pushes in turn (net.c, ensure_cap) */
    srv_rbuf got;
    if (s->io->give_rbuf(conn, g, (srv_rbuf){0}, &got) != 0)
        return NULL;
    srv_blk *b = srv_blk_adopt(got.mem, got.cap);
    if (!b) {
        /* g stays where it is until the update is done: the buffer goes
         * with the log (never, but for an allocation of a few bytes that
         * failed, which ends nothing) */
        PS_LOG(PS_LOG_WARN, "replication: no memory to keep a receive buffer (%zu bytes): it leaks", got.cap);
    }
    return b;
}

/* A gradient's record in the receive buffer it came in (taken by
 * srv_replog_take): its length, kind and head written into the bytes
 * before g. The record's body (where its head goes), or NULL. */
static uint8_t *grad_in_place(psd *s, srv_blk *taken, const float *g, uint64_t n)
{
    srv_replog *r = s->replog;
    size_t need = 4 + 1 + GRAD_HEAD + (size_t)n * 4;
    if (seg_room(r) != 0)
        return NULL;
    uint8_t *p = (uint8_t *)(uintptr_t)g - 5 - GRAD_HEAD; /* srv_replog_take saw the room */
    r->seg[r->nseg++] = (srv_replog_seg){.base = r->base + r->len, .len = need, .cap = need, .buf = p,
                                         .blk = taken, .sealed = 1};
    put_u32(p, (uint32_t)(need - 4));
    p[4] = REC_GRAD;
    r->len += need;
    r->records++;
    r->bytes += need;
    r->grad_taken++;
    return p + 5;
}

void srv_replog_grad(psd *s, uint64_t off, uint64_t n, const float *g, int has_gmax, float gmax, int from_first,
                     int clip, srv_blk *taken)
{
    srv_replog *r = s->replog;
    if (!r) {
        srv_blk_unref(taken);
        return;
    }
    rec_optim(s);
    size_t len = 1 + GRAD_HEAD + (size_t)n * 4;
    uint8_t *p = taken ? grad_in_place(s, taken, g, n) : NULL;
    int in_place = p != NULL;
    if (!in_place && !(p = rec_begin(s, len, REC_GRAD))) {
        srv_blk_unref(taken);
        return;
    }
    put_u64(p, s->model.version);
    put_u64(p + 8, off);
    put_u64(p + 16, n);
    put_u32(p + 24, (has_gmax ? GRAD_HAS_GMAX : 0) | (from_first ? GRAD_FROM_FIRST : 0) | (clip ? GRAD_CLIP : 0));
    memcpy(p + 28, &gmax, 4);
    if (!in_place) {
        memcpy(p + GRAD_HEAD, g, (size_t)n * 4);
        srv_blk_unref(taken);
    }
    r->grad_records++;
    r->grad_bytes += 4 + len;
}

void srv_replog_pushid(psd *s, uint64_t cid, uint64_t pid)
{
    if (!s->replog)
        return;
    uint8_t *p = rec_begin(s, 1 + 16, REC_PUSHID);
    if (p) {
        put_u64(p, cid);
        put_u64(p + 8, pid);
    }
}

void srv_replog_move(psd *s, const uint8_t *head, size_t hlen, const uint8_t *data, size_t len)
{
    if (!s->replog)
        return;
    srv_replog_flush(s); /* what came before it (a table declared) goes first */
    uint8_t *p = rec_begin(s, 1 + hlen + len, REC_MOVE);
    if (!p)
        return;
    memcpy(p, head, hlen);
    if (len)
        memcpy(p + hlen, data, len);
}

/* The lowest position a follower still needs (the log's end when none). */
static uint64_t lowest(const srv_replog *r)
{
    uint64_t low = r->base + r->len;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && r->f[i].pos >= r->base && r->f[i].pos < low)
            low = r->f[i].pos;
    return low;
}

void srv_replog_trim(psd *s)
{
    srv_replog *r = s->replog;
    if (!r)
        return;
    uint64_t low = lowest(r);
    if (r->len > r->max_bytes && r->nseg > 1) {
        /* a follower in the older half of a log past its bound snapshots
         * again: the pieces wholly in that half go */
        uint64_t mid = seg_of(r, r->base + r->len / 2)->base;
        if (mid > r->base && low < mid) {
            for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
                if (r->f[i].used && r->f[i].pos < mid) {
                    PS_LOG(PS_LOG_WARN, "replication: follower %s is %" PRIu64 " bytes behind (over the log's "
                           "bound): it must take a snapshot again", r->f[i].addr, r->base + r->len - r->f[i].pos);
                    if (r->f[i].insync)
                        r->dropped++;
                    r->f[i].insync = 0;
                    r->f[i].pos = 0;
                }
            low = mid;
        }
    }
    drop_below(r, low);
}

void srv_replog_trim_held(psd *s)
{
    srv_replog *r = s->replog;
    if (r)
        drop_below(r, lowest(r));
}

srv_follower *srv_replog_follower(psd *s, const char *addr)
{
    srv_replog *r = s->replog;
    if (!r)
        return NULL;
    srv_follower *free_slot = NULL;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++) {
        if (r->f[i].used && strcmp(r->f[i].addr, addr) == 0)
            return &r->f[i];
        if (!r->f[i].used && !free_slot)
            free_slot = &r->f[i];
    }
    if (free_slot) {
        memset(free_slot, 0, sizeof *free_slot);
        free_slot->snap_fd = -1;
        free_slot->used = 1;
        snprintf(free_slot->addr, sizeof free_slot->addr, "%s", addr);
        free_slot->joined_ms = srv_now_ms();
    }
    return free_slot;
}

srv_follower *srv_replog_follower_find(psd *s, const char *addr)
{
    for (int i = 0; s->replog && i < SRV_FOLLOWERS_MAX; i++)
        if (s->replog->f[i].used && strcmp(s->replog->f[i].addr, addr) == 0)
            return &s->replog->f[i];
    return NULL;
}

static void *close_fd(void *arg)
{
    close((int)(intptr_t)arg);
    return NULL;
}

void srv_replog_snap_close(srv_follower *f)
{
    /* closed by a thread of its own: the last close of a memory file frees
     * its pages, 0.1 s for a GiB on the loop (nothing else reads the file:
     * repl_chunk reads it on the loop, through f->snap_fd) */
    pthread_t th;
    pthread_attr_t at;
    if (f->snap_fd >= 0) {
        int threaded = 0;
        if (pthread_attr_init(&at) == 0) {
            threaded = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED) == 0 &&
                       pthread_create(&th, &at, close_fd, (void *)(intptr_t)f->snap_fd) == 0;
            pthread_attr_destroy(&at);
        }
        if (!threaded)
            close(f->snap_fd);
    }
    f->snap_fd = -1;
    f->snap_ready = 0;
    f->snap_cid = 0;
}

void srv_replog_follower_drop(psd *s, srv_follower *f)
{
    (void)s;
    srv_replog_snap_close(f);
    memset(f, 0, sizeof *f);
    f->snap_fd = -1;
}

int srv_replog_at_record(const psd *s, uint64_t pos)
{
    const srv_replog *r = s->replog;
    if (!r || pos < r->base || pos > r->base + r->len)
        return 0;
    if (pos == r->base + r->len)
        return 1;
    /* a piece starts with a record: the walk starts at pos's piece */
    const srv_replog_seg *g = seg_of(r, pos);
    size_t at = 0, want = (size_t)(pos - g->base);
    while (at < want)
        at += 4 + get_u32(g->buf + at);
    return at == want;
}

uint64_t srv_replog_acked(const psd *s)
{
    const srv_replog *r = s->replog;
    uint64_t end = srv_replog_end(s), low = end;
    if (!r)
        return 0;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && r->f[i].insync && r->f[i].pos < low)
            low = r->f[i].pos;
    return low;
}

uint32_t srv_replog_insync(const psd *s)
{
    uint32_t n = 0;
    if (s->replog)
        for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
            n += s->replog->f[i].used && s->replog->f[i].insync;
    return n;
}

void srv_replog_fetched(psd *s, srv_follower *f, uint64_t from, uint64_t now_ms, int loading)
{
    f->pos = from;
    f->last_ms = now_ms;
    if (!f->insync && !loading && f->pos == srv_replog_end(s) && f->pos >= s->replog->base) {
        f->insync = 1;
        f->caught_up = 1;
        PS_LOG(PS_LOG_INFO, "replication: follower %s is in sync at position %" PRIu64, f->addr, f->pos);
    }
}

int srv_replog_tick(psd *s, uint64_t now_ms, uint64_t timeout_ms)
{
    srv_replog *r = s->replog;
    int moved = 0;
    if (!r)
        return 0;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++) {
        srv_follower *f = &r->f[i];
        if (f->used && f->insync && now_ms - f->last_ms > timeout_ms && f->pos < srv_replog_end(s)) {
            f->insync = 0;
            r->dropped++;
            moved = 1;
            PS_LOG(PS_LOG_WARN, "replication: follower %s left the in-sync set (nothing fetched for %" PRIu64
                   " ms, %" PRIu64 " bytes behind): sync replies no longer wait for it", f->addr, now_ms - f->last_ms,
                   srv_replog_end(s) - f->pos);
        }
    }
    srv_replog_trim(s);
    return moved;
}
