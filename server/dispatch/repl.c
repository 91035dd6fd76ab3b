/* repl.c - a leader's side of replication (PROTOCOL.md 17): the ADMIN
 * commands its followers send (`replicate`: a snapshot; `repl_chunk`: its
 * bytes; `repl_fetch`: the log's records from a position, which also tells
 * the leader what the follower holds) and `promote`, which a follower
 * answers. The log and the followers' slots are replog/replog.c's. */
#define _GNU_SOURCE
#include "server/dispatch/repl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/answer/reply.h"
#include "server/policy/policy.h"
#include "server/replog/replog.h"
#include "server/report/checkpoint.h"
#include "server/session/pushid.h"

#define CHUNK_BYTES ((size_t)SRV_BLK_FLOATS * 4) /* a chunk or a fetch: one block's bytes at most */
#define FETCH_WAIT_MAX_MS 1000

/* A snapshot being written or read by one follower. */
typedef struct snap_state {
    int fd;                 /* the memory file, -1: none */
    uint64_t size, pos, version;
    int ready;
    uint64_t cid, id;       /* the `replicate` waiting for it */
} snap_state;
static snap_state snaps[SRV_FOLLOWERS_MAX];

static void arg_str(const ps_msg *m, uint32_t i, char *buf, size_t len)
{
    buf[0] = 0;
    if (i < m->nargs) {
        size_t n = m->args[i].len < len - 1 ? m->args[i].len : len - 1;
        memcpy(buf, m->args[i].p, n);
        buf[n] = 0;
    }
}

static uint64_t arg_u64(const ps_msg *m, uint32_t i)
{
    char b[32];
    arg_str(m, i, b, sizeof b);
    return strtoull(b, NULL, 10);
}

static srv_conn *conn_by_cid(psd *s, uint64_t cid)
{
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->cid == cid)
            return c->closing ? NULL : c;
    return NULL;
}

static void ok_text(srv_conn *c, uint64_t id, uint64_t ver, const char *text)
{
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER | PS_F_TEXT;
    r.id = id;
    r.mver = ver;
    r.text = text;
    r.text_len = (uint32_t)strlen(text);
    srv_send(c, &r, NULL);
}

/* bytes [0, len) as a PARAMS of len/4 (rounded up) float32 words in as
 * many blocks as they take, ver = v; fill, when given, writes them. */
static void send_bytes(srv_conn *c, uint64_t id, uint64_t v, const uint8_t *p, size_t len,
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
        srv_send_error(c, id, fill ? PS_EIO : PS_ENOMEM, 0, "cannot send %zu bytes of the replication stream", len);
    }
    for (size_t i = 0; blk && i < nblk; i++)
        if (blk[i])
            srv_blk_unref(blk[i]);
    free(blk);
}

/* Why this psd cannot lead followers now; NULL when it can. */
static const char *cannot_lead(const psd *s)
{
    if (s->follow)
        return "this psd is a follower itself";
    if (s->policy->rounds)
        return "replication needs mode asgd or ssp: a bsp round keeps pushes a follower does not have (yet)";
    if (s->cfg.hogwild)
        return "replication refuses hogwild = yes: the workers step the model in place, not through psd";
    if (s->cfg.table_apply == PS_TABLE_APPLY_HOGWILD)
        return "replication refuses table_apply = hogwild: its apply threads race, so a follower could not "
               "apply the same steps";
    return NULL;
}

static void snap_done(psd *s, int rc, uint64_t version, void *arg)
{
    snap_state *st = arg;
    srv_conn *c = conn_by_cid(s, st->cid);
    if (rc != 0) {
        if (c)
            srv_send_error(c, st->id, PS_EIO, 0, "the snapshot failed (see the leader's log)");
        close(st->fd);
        st->fd = -1;
        return;
    }
    off_t end = lseek(st->fd, 0, SEEK_END);
    st->size = end > 0 ? (uint64_t)end : 0;
    st->version = version;
    st->ready = 1;
    PS_LOG(PS_LOG_INFO, "replication: snapshot of version %" PRIu64 " at position %" PRIu64 ": %" PRIu64 " bytes",
           version, st->pos, st->size);
    if (c) {
        char text[160];
        snprintf(text, sizeof text, "snapshot %" PRIu64 " %" PRIu64 " %" PRIu64, st->size, st->pos,
                 s->replog ? s->replog->history : 0);
        ok_text(c, st->id, version, text);
    }
}

/* replicate ADVERTISE [FP]: a snapshot for the follower that workers reach at
 * ADVERTISE; answered OK "snapshot SIZE POSITION HISTORY" once written. */
static void cmd_replicate(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char addr[64], err[256];
    arg_str(m, 0, addr, sizeof addr);
    const char *why = cannot_lead(s);
    if (why) {
        srv_send_error(c, m->id, s->follow ? PS_ENOT_LEADER : PS_EINVAL, 0, "replicate: %s", why);
        return;
    }
    if (!addr[0]) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "replicate: give the follower's address (args[0])");
        return;
    }
    if (!s->model.initialized) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "replicate: the model has no values yet; ask again");
        return;
    }
    uint64_t fp = arg_u64(m, 1);
    if (fp && fp != s->model.fp) {
        srv_send_error(c, m->id, PS_ELAYOUT, 0,
                       "replicate: follower %s holds another model (fingerprint %016" PRIx64 ", this leader's %016"
                       PRIx64 "): start it with --fresh to set its checkpoints aside, or follow its own part's leader",
                       addr, fp, s->model.fp);
        return;
    }
    if (srv_replog_start(s) != 0) {
        srv_send_error(c, m->id, PS_ENOMEM, 0, "replicate: no memory for the log");
        return;
    }
    srv_follower *f = srv_replog_follower(s, addr);
    if (!f) {
        srv_send_error(c, m->id, PS_ELIMIT, 0, "replicate: %d followers already", SRV_FOLLOWERS_MAX);
        return;
    }
    snap_state *st = &snaps[f - s->replog->f];
    if (st->fd >= 0 && !st->ready && st->cid) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "replicate: a snapshot for %s is being written", addr);
        return;
    }
    if (st->fd > 0)
        close(st->fd);
    st->fd = memfd_create("psd-snapshot", MFD_CLOEXEC);
    if (st->fd < 0) {
        srv_send_error(c, m->id, PS_EIO, 0, "replicate: no memory file: %s", strerror(errno));
        return;
    }
    srv_replog_flush(s); /* the snapshot holds everything before its position */
    st->pos = srv_replog_end(s);
    st->ready = 0;
    st->cid = c->cid;
    st->id = m->id;
    f->insync = 0;
    f->pos = st->pos;
    f->last_ms = srv_now_ms();
    snprintf(f->peer, sizeof f->peer, "%s", c->addr);
    int rc = srv_checkpoint_snapshot(s, st->fd, snap_done, st, err, sizeof err);
    if (rc != 0) {
        close(st->fd);
        st->fd = -1;
        srv_send_error(c, m->id, rc, 0, "replicate: %s", err);
        return;
    }
    /* checkpoints keep no push ids: the log gives them to the follower
     * right after the snapshot's position */
    uint64_t cid, pid;
    for (uint32_t it = 0; srv_pushid_next(s, &it, &cid, &pid);)
        srv_replog_pushid(s, cid, pid);
    PS_LOG(PS_LOG_INFO, "replication: follower %s (from %s) asks for a snapshot", addr, c->addr);
}

static int fill_chunk(void *arg, uint8_t *dst, size_t len)
{
    const uint64_t *a = arg; /* fd, offset */
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread((int)a[0], dst + got, len - got, (off_t)(a[1] + got));
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* repl_chunk ADVERTISE OFFSET: up to a block of the snapshot's bytes. */
static void cmd_repl_chunk(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char addr[64];
    arg_str(m, 0, addr, sizeof addr);
    uint64_t off = arg_u64(m, 1);
    srv_follower *f = s->replog ? srv_replog_follower(s, addr) : NULL;
    snap_state *st = f ? &snaps[f - s->replog->f] : NULL;
    if (!st || st->fd < 0 || !st->ready || off > st->size) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "repl_chunk: no snapshot for %s at %" PRIu64, addr, off);
        return;
    }
    size_t len = st->size - off < CHUNK_BYTES ? (size_t)(st->size - off) : CHUNK_BYTES;
    uint64_t a[2] = {(uint64_t)st->fd, off};
    f->last_ms = srv_now_ms();
    send_bytes(c, m->id, st->size, NULL, len, fill_chunk, a);
}

/* Answers f's waiting fetch with the records from its position, when there
 * are some or force. */
static void answer_fetch(psd *s, srv_follower *f, int force)
{
    srv_conn *c = f->wait_c;
    if (!c)
        return;
    size_t len;
    const uint8_t *p = srv_replog_read(s, f->wait_from, CHUNK_BYTES, &len);
    if (!force && p && len == 0)
        return;
    f->wait_c = NULL;
    if (!p) {
        srv_send_error(c, f->wait_id, PS_ESTALE, 0,
                       "repl_fetch: position %" PRIu64 " is no longer in the log (it holds %" PRIu64 "..%" PRIu64
                       "): take a snapshot again", f->wait_from, s->replog ? s->replog->base : 0, srv_replog_end(s));
        return;
    }
    send_bytes(c, f->wait_id, srv_replog_end(s), p, len, NULL, NULL);
}

void srv_admin_repl_wake(psd *s)
{
    if (!s->replog || s->upd.running)
        return; /* an update off the loop: its push id may be in the log before its values */
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        if (s->replog->f[i].used && s->replog->f[i].wait_c)
            answer_fetch(s, &s->replog->f[i], 0);
}

void srv_admin_repl_tick(psd *s)
{
    if (!s->replog)
        return;
    uint64_t now = srv_now_ms();
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++) {
        srv_follower *f = &s->replog->f[i];
        if (!f->used || !f->wait_c)
            continue;
        int alive = 0;
        for (srv_conn *c = s->conns; c; c = c->next)
            alive |= c == f->wait_c && !c->closing;
        if (!alive)
            f->wait_c = NULL;
        else if (now >= f->wait_until_ms)
            answer_fetch(s, f, 1);
    }
    srv_replog_flush(s);
    srv_admin_repl_wake(s);
    /* past the lease's fence no follower leaves the in-sync set: replies
     * wait for it instead (connection/write.c) */
    int fenced = s->coord.fence_ms && now >= s->coord.fence_ms;
    if (srv_replog_tick(s, now, fenced ? UINT64_MAX : s->cfg.max_replica_lag) && s->repl_release)
        s->repl_release(s);
}

/* repl_fetch ADVERTISE FROM WAIT_MS: the records from FROM (the follower
 * holds everything before it), waiting up to WAIT_MS for some. */
static void cmd_repl_fetch(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char addr[64];
    arg_str(m, 0, addr, sizeof addr);
    uint64_t from = arg_u64(m, 1), wait = arg_u64(m, 2);
    srv_follower *f = s->replog ? srv_replog_follower(s, addr) : NULL;
    if (!f) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "repl_fetch: %s has no snapshot: send replicate first", addr);
        return;
    }
    if (from > srv_replog_end(s)) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "repl_fetch: follower %s is ahead of its leader (position %" PRIu64 ", the leader's log ends at %"
                       PRIu64 "): it holds changes this leader never made; start it again with --fresh", addr,
                       from, srv_replog_end(s));
        return;
    }
    if (f->wait_c)
        answer_fetch(s, f, 1);
    srv_replog_flush(s);
    srv_replog_fetched(s, f, from, srv_now_ms());
    if (s->repl_release)
        s->repl_release(s);
    f->wait_c = c;
    f->wait_id = m->id;
    f->wait_from = from;
    f->wait_until_ms = srv_now_ms() + (wait < FETCH_WAIT_MAX_MS ? wait : FETCH_WAIT_MAX_MS);
    answer_fetch(s, f, wait == 0);
    snap_state *st = &snaps[f - s->replog->f];
    if (st->fd >= 0 && st->ready && from >= st->pos) { /* it has the snapshot: the memory goes */
        close(st->fd);
        st->fd = -1;
        st->cid = 0;
    }
}

/* promote: a follower becomes the leader of its part. */
static void cmd_promote(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char err[256];
    if (!s->follow || !s->promote) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "promote: this psd is not a follower (it leads already)");
        return;
    }
    int rc = s->promote(s, err, sizeof err);
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "promote: %s", err);
        return;
    }
    ok_text(c, m->id, s->model.version, "promoted: this psd leads its part now");
}

void srv_repl_init(void)
{
    for (int i = 0; i < SRV_FOLLOWERS_MAX; i++)
        snaps[i].fd = -1;
}

const srv_repl_command srv_repl_commands[] = {
    {"replicate", cmd_replicate},
    {"repl_chunk", cmd_repl_chunk},
    {"repl_fetch", cmd_repl_fetch},
    {"promote", cmd_promote},
    {NULL, NULL},
};
