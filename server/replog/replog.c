/* replog.c - the replication log: records of a leader's changes, in order,
 * for its followers (replog.h; the records' bytes are in PROTOCOL.md 17).
 * Owns psd.replog and the followers' slots; applies records on a follower. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "proto/msg.h"
#include "server/replog/replog.h"
#include "server/tables/sparse_optim.h"

/* Record kinds (the byte after a record's length). */
enum {
    REC_LAYOUT = 'L', /* the dense layout: a HELLO message's msgpack bytes with "layout" */
    REC_DENSE = 'D',  /* version, initialised, off, n, nstate, values, state buffers */
    REC_ROWS = 'T',   /* table, n, scale, keys, row gradients */
    REC_TABLE = 'N',  /* a table declared */
    REC_BOUNDS = 'B', /* the tables' bounds and memory cap */
    REC_PUSHID = 'P', /* a client's push id applied: cid, pid */
};
#define STATE_MAX 4
#define DENSE_PIECE ((uint64_t)1 << 18) /* values a dense record carries at most: 1 MiB of parameters */
#define LOG_MAX_DEFAULT ((size_t)1 << 30) /* 1 GiB of records kept for a follower behind */

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put_f64(uint8_t *p, double v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static double get_f64(const uint8_t *p) { double v; memcpy(&v, p, 8); return v; }

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
    if (!s->replog)
        return;
    free(s->replog->buf);
    free(s->replog);
    s->replog = NULL;
}

/* Room for a record of len bytes (after its 4-byte length); its start, or
 * NULL when out of memory (the followers then miss it: they are dropped
 * from the in-sync set and must snapshot again). */
static uint8_t *rec_begin(psd *s, size_t len, int kind)
{
    srv_replog *r = s->replog;
    size_t need = r->len + 4 + len;
    if (need > r->cap) {
        size_t cap = r->cap ? r->cap : 1 << 16;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb) {
            PS_LOG(PS_LOG_ERROR, "replication: no memory for a %zu-byte record: the followers start over", len);
            for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
                r->f[i].pos = 0, r->f[i].insync = 0;
            r->base += r->len;
            r->len = 0;
            return NULL;
        }
        r->buf = nb;
        r->cap = cap;
    }
    uint8_t *p = r->buf + r->len;
    put_u32(p, (uint32_t)len);
    p[4] = (uint8_t)kind;
    r->len = need;
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

/* The dense range [lo, hi): its values and state, the version after. */
static void rec_dense(psd *s, uint64_t lo, uint64_t hi)
{
    srv_model *m = &s->model;
    float *st[STATE_MAX];
    const char *names[STATE_MAX];
    size_t nst = m->blk ? srv_optim_state_buffers(&m->opt, st, names, STATE_MAX) : 0;
    uint64_t n = hi - lo;
    size_t len = 1 + 8 + 4 + 8 + 8 + 4 + (size_t)n * 4 * (1 + nst);
    uint8_t *p = rec_begin(s, len, REC_DENSE);
    if (!p)
        return;
    put_u64(p, m->version), p += 8;
    put_u32(p, (uint32_t)m->initialized), p += 4;
    put_u64(p, lo), p += 8;
    put_u64(p, n), p += 8;
    put_u32(p, (uint32_t)nst), p += 4;
    for (uint64_t at = lo; at < hi;) {
        size_t got;
        const float *v = srv_model_at(m, at, hi - at, &got);
        memcpy(p, v, got * 4);
        p += got * 4;
        at += got;
    }
    for (size_t k = 0; k < nst; k++) {
        memcpy(p, st[k] + lo, (size_t)n * 4);
        p += (size_t)n * 4;
    }
    s->replog->dense_records++;
    s->replog->dense_bytes += 4 + len;
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
    uint64_t lo = m->dirty_lo, hi = m->dirty_hi;
    if (m->blk && (hi > lo || m->version != r->sent_version || m->initialized != r->sent_init)) {
        if (hi > m->layout.total)
            hi = m->layout.total;
        if (lo > hi)
            lo = hi;
        /* in pieces, so that a record stays well inside a frame */
        for (uint64_t at = lo; at < hi || at == lo; at += DENSE_PIECE) {
            rec_dense(s, at, hi - at < DENSE_PIECE ? hi : at + DENSE_PIECE);
            if (hi == lo)
                break;
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

const uint8_t *srv_replog_read(const psd *s, uint64_t from, size_t max, size_t *len)
{
    const srv_replog *r = s->replog;
    *len = 0;
    if (!r || from < r->base || from > r->base + r->len)
        return NULL;
    size_t at = (size_t)(from - r->base), end = at;
    while (end + 4 <= r->len) {
        size_t l = 4 + get_u32(r->buf + end);
        if (end > at && end + l - at > max)
            break;
        end += l;
    }
    *len = end - at;
    static const uint8_t none[1];
    return r->buf ? r->buf + at : none; /* an empty log: nothing to read, not an error */
}

void srv_replog_trim(psd *s)
{
    srv_replog *r = s->replog;
    if (!r)
        return;
    uint64_t low = r->base + r->len;
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && r->f[i].pos >= r->base && r->f[i].pos < low)
            low = r->f[i].pos;
    if (r->len > r->max_bytes && low - r->base < r->len / 2) {
        /* a follower that far behind snapshots again */
        for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
            if (r->f[i].used && r->f[i].pos < r->base + r->len / 2) {
                PS_LOG(PS_LOG_WARN, "replication: follower %s is %zu bytes behind (over the log's bound): it "
                       "must take a snapshot again", r->f[i].addr, r->len);
                if (r->f[i].insync)
                    r->dropped++;
                r->f[i].insync = 0;
                r->f[i].pos = 0;
            }
        low = r->base + r->len / 2;
        /* whole records only */
        size_t at = 0;
        while (at < low - r->base)
            at += 4 + get_u32(r->buf + at);
        low = r->base + at;
    }
    size_t cut = (size_t)(low - r->base);
    if (cut == 0 || cut < r->len / 2)
        return; /* trimmed in bulk: a memmove of half the log at most */
    memmove(r->buf, r->buf + cut, r->len - cut);
    r->len -= cut;
    r->base = low;
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
        free_slot->used = 1;
        snprintf(free_slot->addr, sizeof free_slot->addr, "%s", addr);
        free_slot->joined_ms = srv_now_ms();
    }
    return free_slot;
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

void srv_replog_fetched(psd *s, srv_follower *f, uint64_t from, uint64_t now_ms)
{
    f->pos = from;
    f->last_ms = now_ms;
    if (!f->insync && f->pos == srv_replog_end(s) && f->pos >= s->replog->base) {
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

/* ---- a follower applies ---------------------------------------------------- */

void srv_replog_reset(psd *s)
{
    if (s->model.has_layout)
        srv_model_release(&s->model);
    if (s->tables.n) {
        uint64_t max = s->tables.max_bytes;
        srv_tables_free(&s->tables);
        srv_tables_init(&s->tables, max);
        srv_tables_configure(&s->tables, &s->cfg);
    }
}

static int apply_layout(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    uint8_t *copy = malloc(len);
    if (!copy)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for the layout");
    memcpy(copy, p, len);
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    ps_msg m;
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    int rc = ps_msg_decode(copy, len, &lim, &z, &m, &s->scratch_layout, err, errlen);
    if (rc == 0 && !(m.has & PS_F_LAYOUT))
        rc = ps_fail(err, errlen, PS_EMALFORMED, "a layout record without a layout");
    if (rc == 0) {
        if (s->model.blk && !ps_layout_equal(&s->model.layout, &s->scratch_layout))
            rc = ps_fail(err, errlen, PS_ELAYOUT, "the leader's model layout differs from this psd's");
        else if (!s->model.blk) {
            srv_model_propose(&s->model, &s->scratch_layout);
            rc = srv_model_commit(&s->model, &s->cfg);
            if (rc != 0)
                ps_fail(err, errlen, rc, "no memory for the leader's model (%" PRIu64 " parameters)",
                        s->scratch_layout.total);
        }
    }
    msgpack_zone_destroy(&z);
    free(copy);
    return rc;
}

static int apply_dense(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    if (len < 32)
        return ps_fail(err, errlen, PS_EMALFORMED, "a dense record of %zu bytes", len);
    uint64_t ver = get_u64(p), off = get_u64(p + 12), n = get_u64(p + 20);
    int init = (int)get_u32(p + 8);
    uint32_t nst = get_u32(p + 28);
    p += 32;
    if (!m->blk)
        return ps_fail(err, errlen, PS_ELAYOUT, "a dense record before the layout");
    float *st[STATE_MAX];
    const char *names[STATE_MAX];
    size_t have = srv_optim_state_buffers(&m->opt, st, names, STATE_MAX);
    if (nst != have)
        return ps_fail(err, errlen, PS_ELAYOUT,
                       "the leader's optimizer keeps %u state buffers, this psd's (%s) %zu: give the follower the "
                       "leader's optimizer settings", nst, srv_optim_name(&m->opt), have);
    if (n > m->layout.total || off > m->layout.total - n || len - 32 != (size_t)n * 4 * (1 + nst))
        return ps_fail(err, errlen, PS_EMALFORMED, "a dense record of [%" PRIu64 ", +%" PRIu64 ") for a model of %"
                       PRIu64 " (%zu bytes)", off, n, m->layout.total, len);
    for (uint64_t done = 0; done < n;) {
        srv_wseg seg;
        if (srv_model_write_begin(m, off + done, n - done, &seg) != 0)
            return ps_fail(err, errlen, PS_ENOMEM, "no memory to apply a dense record");
        memcpy(seg.wo, p + done * 4, seg.len * 4);
        srv_model_write_end(m, &seg);
        done += seg.len;
    }
    p += (size_t)n * 4;
    for (uint32_t k = 0; k < nst; k++, p += (size_t)n * 4)
        memcpy(st[k] + off, p, (size_t)n * 4);
    if (init)
        srv_model_set_initialized(m, ver);
    srv_model_touched(m);
    return 0;
}

static int apply_table(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    ps_table_def d;
    memset(&d, 0, sizeof d);
    size_t want = 4 + sizeof d.name + 4 + 4 + 8 + 8 + 4 + 8 * PS_HP_COUNT + 4 + 4;
    if (len != want)
        return ps_fail(err, errlen, PS_EMALFORMED, "a table record of %zu bytes (%zu expected)", len, want);
    uint32_t i = get_u32(p);
    p += 4;
    memcpy(d.name, p, sizeof d.name), p += sizeof d.name;
    d.name[sizeof d.name - 1] = 0;
    d.dim = get_u32(p), p += 4;
    d.rinit = get_u32(p), p += 4;
    d.scale = get_f64(p), p += 8;
    d.seed = get_u64(p), p += 8;
    d.opt = get_u32(p), p += 4;
    for (int k = 0; k < PS_HP_COUNT; k++)
        d.hp[k] = get_f64(p), p += 8;
    d.part = get_u32(p), p += 4;
    d.nparts = get_u32(p);
    uint32_t idx;
    int rc = srv_tables_declare(&s->tables, &d, &idx, err, errlen);
    if (rc == 0 && idx != i)
        rc = ps_fail(err, errlen, PS_ELAYOUT, "table %s is table %u here, %u on the leader", d.name, idx, i);
    return rc;
}

static int apply_bounds(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    if (len != 32)
        return ps_fail(err, errlen, PS_EMALFORMED, "a bounds record of %zu bytes", len);
    srv_table_bounds b = {.admit = get_u32(p), .expire = get_u64(p + 4), .table_bytes = get_u64(p + 12),
                          .full = (int)get_u32(p + 20)};
    srv_tables_set_bounds(&s->tables, &b);
    srv_tables_set_limit(&s->tables, get_u64(p + 24));
    return 0;
}

static int apply_rows(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    if (len < 16)
        return ps_fail(err, errlen, PS_EMALFORMED, "a rows record of %zu bytes", len);
    uint32_t ti = get_u32(p), n = get_u32(p + 4);
    double scale = get_f64(p + 8);
    if (ti >= s->tables.n)
        return ps_fail(err, errlen, PS_ELAYOUT, "a push to table %u, which this psd does not have", ti);
    uint32_t dim = srv_tables_def(&s->tables, ti)->dim;
    if (len - 16 != (size_t)n * 8 + (size_t)n * dim * 4)
        return ps_fail(err, errlen, PS_EMALFORMED, "a rows record of %zu bytes for %u rows of %u", len, n, dim);
    const uint8_t *keys = p + 16;
    /* the gradients follow the keys, maybe unaligned: copied */
    float *g = malloc((size_t)n * dim * 4 + 1);
    if (!g)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a push of %u rows", n);
    memcpy(g, keys + (size_t)n * 8, (size_t)n * dim * 4);
    char why[256] = "";
    int rc = srv_tables_push(&s->tables, ti, keys, n, g, scale, why, sizeof why);
    free(g);
    if (rc != 0)
        return ps_fail(err, errlen, rc, "the leader's push to table %s does not apply here: %s",
                       srv_tables_def(&s->tables, ti)->name, why);
    return 0;
}

int srv_replog_apply(psd *s, const uint8_t *p, size_t len,
                     int (*pushid)(psd *s, uint64_t cid, uint64_t pid), char *err, size_t errlen)
{
    size_t at = 0;
    while (at + 4 <= len) {
        uint32_t l = get_u32(p + at);
        if (l == 0)
            break; /* padding */
        if (l > len - at - 4)
            return ps_fail(err, errlen, PS_EMALFORMED, "a record of %u bytes where %zu are left", l, len - at - 4);
        const uint8_t *b = p + at + 5;
        size_t bl = l - 1;
        int rc;
        switch (p[at + 4]) {
        case REC_LAYOUT: rc = apply_layout(s, b, bl, err, errlen); break;
        case REC_DENSE: rc = apply_dense(s, b, bl, err, errlen); break;
        case REC_ROWS: rc = apply_rows(s, b, bl, err, errlen); break;
        case REC_TABLE: rc = apply_table(s, b, bl, err, errlen); break;
        case REC_BOUNDS: rc = apply_bounds(s, b, bl, err, errlen); break;
        case REC_PUSHID:
            if (bl != 16)
                rc = ps_fail(err, errlen, PS_EMALFORMED, "a push id record of %zu bytes", bl);
            else
                rc = pushid && pushid(s, get_u64(b), get_u64(b + 8)) == PS_ENOMEM
                         ? ps_fail(err, errlen, PS_ENOMEM, "no memory for a push id") : 0;
            break;
        default: rc = ps_fail(err, errlen, PS_EMALFORMED, "a record of unknown kind %u", p[at + 4]); break;
        }
        if (rc != 0)
            return rc;
        at += 4 + (size_t)l;
    }
    return 0;
}
