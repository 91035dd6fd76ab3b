/* repl.c - a leader's side of replication (PROTOCOL.md 17): the ADMIN
 * commands its followers send (`replicate`: a snapshot; `repl_chunk`: its
 * bytes; `repl_fetch`: the log's records from a position, which also tells
 * the leader what the follower holds), `promote`, which a follower
 * answers, and `step_down`, which a follower promoted by hand sends the
 * leader it followed. The log and the followers' slots are
 * replog/replog.c's. */
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
#include "server/store/parts.h"
#include "server/replog/pushid.h"

#define CHUNK_BYTES ((size_t)SRV_BLK_FLOATS * 4) /* a chunk or a fetch: one block's bytes at most */
#define FETCH_WAIT_MAX_MS 1000
#define SNAP_IDLE_MS 60000   /* a snapshot nobody reads for this long is freed */
#define SLOT_IDLE_MS 300000  /* a follower out of sync that fetches nothing for this long is forgotten */

/* The connection of f's waiting fetch, NULL when none or when it has
 * closed (wait_c is then forgotten: a freed connection is never touched). */
static srv_conn *waiting(psd *s, srv_follower *f)
{
    if (f->wait_c && srv_conn_by_cid(s, f->wait_cid) != f->wait_c)
        f->wait_c = NULL;
    return f->wait_c;
}

/* Why this psd cannot lead followers now; NULL when it can. */
static const char *cannot_lead(const psd *s)
{
    if (s->follow)
        return "this psd is a follower itself";
    if (s->policy->piece && s->policy->piece(s))
        return "replication refuses bsp_piece: a round closing piece by piece applies and answers its pieces "
               "before the round's pushes are kept";
    if (s->policy->rounds && s->tables.n)
        return "replication with mode = bsp takes dense models only: a round keeps its table pushes until it "
               "closes, acknowledged before, and a leader lost in the round would lose them";
    if (s->cfg.hogwild)
        return "replication refuses hogwild = yes: the workers step the model in place, not through psd";
    if (s->cfg.table_apply == PS_TABLE_APPLY_HOGWILD)
        return "replication refuses table_apply = hogwild: its apply threads race, so a follower could not "
               "apply the same steps";
    return NULL;
}

/* The snapshot of slot (uintptr_t)arg - 1 is written (rc 0) or failed. */
static void snap_done(psd *s, int rc, uint64_t version, void *arg)
{
    size_t i = (size_t)(uintptr_t)arg - 1;
    srv_follower *f = s->replog && i < SRV_FOLLOWERS_MAX ? &s->replog->f[i] : NULL;
    if (!f || !f->used || !f->snap_writing)
        return;
    f->snap_writing = 0;
    srv_conn *c = srv_conn_by_cid(s, f->snap_cid);
    if (rc != 0) {
        if (c)
            srv_send_error(c, f->snap_id, PS_EIO, 0, "the snapshot failed (see the leader's log)");
        srv_replog_snap_close(f);
        return;
    }
    off_t end = lseek(f->snap_fd, 0, SEEK_END);
    f->snap_size = end > 0 ? (uint64_t)end : 0;
    f->snap_ready = 1;
    f->last_ms = srv_now_ms();
    PS_LOG(PS_LOG_INFO, "replication: snapshot of version %" PRIu64 " at position %" PRIu64 ": %" PRIu64 " bytes",
           version, f->snap_pos, f->snap_size);
    if (c) {
        char text[160];
        snprintf(text, sizeof text, "snapshot %" PRIu64 " %" PRIu64 " %" PRIu64, f->snap_size, f->snap_pos,
                 s->replog->history);
        srv_send_ok_text(c, f->snap_id, text);
    }
}

/* replicate ADVERTISE [FP]: a snapshot for the follower that workers reach at
 * ADVERTISE; answered OK "snapshot SIZE POSITION HISTORY" once written. */
static void cmd_replicate(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char addr[64], err[256];
    srv_arg_str(m, 0, addr, sizeof addr);
    const char *why = cannot_lead(s);
    if (why) {
        srv_send_error(c, m->id, s->follow ? PS_ENOT_LEADER : PS_EINVAL, 0, "replicate: %s", why);
        return;
    }
    if (!addr[0]) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "replicate: give the follower's address (args[0])");
        return;
    }
    /* a psd that holds nothing yet (a part a move is to add): its
     * followers start from nothing, at the log's start */
    int empty = !s->model.has_layout && s->tables.n == 0 && !srv_parts_known(&s->parts);
    if (!empty && !srv_checkpoint_has_state(s)) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "replicate: the model has no values yet (a part a move adds: "
                       "its rows come with the move's end); ask again");
        return;
    }
    if (s->parts.moving) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "replicate: a move of parts is under way; ask again when it is "
                       "over (a snapshot holds no move under way)");
        return;
    }
    uint64_t fp = srv_arg_u64(m, 1);
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
    if (f->snap_writing) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "replicate: a snapshot for %s is being written", addr);
        return;
    }
    srv_replog_snap_close(f);
    srv_conn *old = waiting(s, f);
    if (old) /* a fetch of its last session: the follower starts again */
        srv_send_error(old, f->wait_id, PS_ESTATE, 0, "repl_fetch: %s asked for a snapshot again", addr);
    f->wait_c = NULL;
    if (empty) {
        srv_replog_flush(s);
        f->snap_pos = f->pos = srv_replog_end(s);
        f->insync = 0;
        f->last_ms = srv_now_ms();
        snprintf(f->peer, sizeof f->peer, "%s", c->addr);
        char text[160];
        snprintf(text, sizeof text, "snapshot 0 %" PRIu64 " %" PRIu64, f->snap_pos, s->replog->history);
        srv_send_ok_text(c, m->id, text);
        PS_LOG(PS_LOG_INFO, "replication: follower %s (from %s) starts from nothing: this psd holds nothing yet",
               addr, c->addr);
        return;
    }
    f->snap_fd = memfd_create("psd-snapshot", MFD_CLOEXEC);
    if (f->snap_fd < 0) {
        srv_send_error(c, m->id, PS_EIO, 0, "replicate: no memory file: %s", strerror(errno));
        return;
    }
    srv_replog_flush(s); /* the snapshot holds everything before its position */
    f->snap_pos = srv_replog_end(s);
    f->snap_cid = c->cid;
    f->snap_id = m->id;
    f->insync = 0;
    f->pos = f->snap_pos;
    f->last_ms = srv_now_ms();
    snprintf(f->peer, sizeof f->peer, "%s", c->addr);
    int rc = srv_checkpoint_snapshot(s, f->snap_fd, snap_done, (void *)(uintptr_t)(f - s->replog->f + 1), err,
                                     sizeof err);
    if (rc != 0) {
        srv_replog_snap_close(f);
        srv_send_error(c, m->id, rc, 0, "replicate: %s", err);
        return;
    }
    f->snap_writing = 1; /* it holds the push ids too (report/checkpoint.c) */
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
    srv_arg_str(m, 0, addr, sizeof addr);
    uint64_t off = srv_arg_u64(m, 1);
    srv_follower *f = srv_replog_follower_find(s, addr);
    if (!f || f->snap_fd < 0 || !f->snap_ready || off > f->snap_size) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "repl_chunk: no snapshot for %s at %" PRIu64 "%s", addr, off,
                       f ? "" : " (not a follower of this leader: send replicate first)");
        return;
    }
    size_t len = f->snap_size - off < CHUNK_BYTES ? (size_t)(f->snap_size - off) : CHUNK_BYTES;
    uint64_t a[2] = {(uint64_t)f->snap_fd, off};
    f->last_ms = srv_now_ms();
    srv_send_bytes(c, m->id, f->snap_size, NULL, len, fill_chunk, a);
}

/* Answers f's waiting fetch with the records from its position (and the
 * dense values they mark), when there are some or force. */
static void answer_fetch(psd *s, srv_follower *f, int force)
{
    srv_conn *c = waiting(s, f);
    if (!c)
        return;
    if (!force && f->wait_from == srv_replog_end(s) && f->wait_from >= s->replog->base)
        return;
    srv_replog_answer a;
    int rc = srv_replog_answer_make(s, f->wait_from, CHUNK_BYTES, !s->upd.running, &a);
    if (rc == 0 && !force && a.next == f->wait_from) {
        srv_replog_answer_free(&a); /* only dense marks, while an update runs: later */
        return;
    }
    f->wait_c = NULL;
    if (rc == PS_ESTALE) {
        srv_send_error(c, f->wait_id, PS_ESTALE, 0,
                       "repl_fetch: position %" PRIu64 " is no longer in the log (it holds %" PRIu64 "..%" PRIu64
                       "): take a snapshot again", f->wait_from, s->replog ? s->replog->base : 0, srv_replog_end(s));
        return;
    }
    if (rc != 0) {
        srv_send_error(c, f->wait_id, rc, 0, "repl_fetch: cannot make the answer: %s", ps_strerror(rc));
        return;
    }
    f->sent_next = a.next;
    ps_msg r;
    ps_msg_init(&r, PS_MSG_PARAMS);
    r.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    r.id = f->wait_id;
    r.mver = srv_replog_end(s);
    r.off = a.off;
    r.data = a.blk[0]->w;
    r.ndata = a.ndata;
    srv_send_pieces(c, &r, a.pc, a.npc);
    srv_replog_answer_free(&a);
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
        if (!f->used)
            continue;
        if (waiting(s, f) && now >= f->wait_until_ms)
            answer_fetch(s, f, 1);
        /* a snapshot whose follower went away, or that nobody reads */
        if (f->snap_fd >= 0 && !f->snap_writing &&
            (!srv_conn_by_cid(s, f->snap_cid) || now - f->last_ms > SNAP_IDLE_MS)) {
            PS_LOG(PS_LOG_WARN, "replication: follower %s %s before it read its snapshot: its memory goes", f->addr,
                   srv_conn_by_cid(s, f->snap_cid) ? "was silent for a minute" : "went away");
            srv_replog_snap_close(f);
        }
        /* a follower out of sync that fetches nothing: forgotten, so that
         * the log need not keep its records */
        if (!f->insync && !f->wait_c && f->snap_fd < 0 && !f->snap_writing && now - f->last_ms > SLOT_IDLE_MS) {
            PS_LOG(PS_LOG_WARN, "replication: follower %s forgotten: nothing fetched for %" PRIu64 " s (it must take "
                   "a snapshot again)", f->addr, (now - f->last_ms) / 1000);
            srv_replog_follower_drop(s, f);
        }
    }
    srv_replog_flush(s);
    srv_admin_repl_wake(s);
    /* past the lease's fence no follower leaves the in-sync set: replies
     * wait for it instead (connection/write.c) */
    int fenced = s->coord.fence_ms && now >= s->coord.fence_ms;
    if (srv_replog_tick(s, now, fenced ? UINT64_MAX : s->cfg.max_replica_lag) && s->repl_release)
        s->repl_release(s);
}

/* repl_fetch ADVERTISE FROM WAIT_MS [HISTORY [LOADING [RELEASE]]]: the records from FROM (the
 * follower holds everything before it), waiting up to WAIT_MS for some.
 * Only a follower with a slot (it asked for a snapshot) may fetch, or one
 * that proves a position in this log: the log's history id and a position
 * at a record's start in it (a follower whose slot was forgotten, or whose
 * connection broke, goes on from where it is). */
static void cmd_repl_fetch(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char addr[64];
    srv_arg_str(m, 0, addr, sizeof addr);
    uint64_t from = srv_arg_u64(m, 1), wait = srv_arg_u64(m, 2), hist = srv_arg_u64(m, 3);
    if (from > srv_replog_end(s)) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "repl_fetch: follower %s is ahead of its leader (position %" PRIu64 ", the leader's log ends at %"
                       PRIu64 "): it holds changes this leader never made; start it again with --fresh", addr,
                       from, srv_replog_end(s));
        return;
    }
    srv_follower *f = srv_replog_follower_find(s, addr);
    /* (a walk over the log's records: not for a follower's usual fetch,
     * from where its last one ended) */
    int proves = (!f || (from != f->pos && from != f->sent_next)) && s->replog && hist == s->replog->history &&
                 srv_replog_at_record(s, from);
    if (!f && proves) {
        if (!(f = srv_replog_follower(s, addr))) {
            srv_send_error(c, m->id, PS_ELIMIT, 0, "repl_fetch: %d followers already", SRV_FOLLOWERS_MAX);
            return;
        }
        snprintf(f->peer, sizeof f->peer, "%s", c->addr);
        PS_LOG(PS_LOG_INFO, "replication: follower %s (from %s) goes on at position %" PRIu64, addr, c->addr, from);
    }
    if (!f) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "repl_fetch: %s is not a follower of this leader (it never asked for a snapshot, or it was "
                       "forgotten after %d s without a fetch): send replicate first", addr, SLOT_IDLE_MS / 1000);
        return;
    }
    if (from >= s->replog->base && from != f->pos && from != f->sent_next && !proves &&
        !srv_replog_at_record(s, from)) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "repl_fetch: position %" PRIu64 " of %s is not where one of this log's records starts (the "
                       "log holds %" PRIu64 "..%" PRIu64 ", the follower was at %" PRIu64 "): take a snapshot again",
                       from, addr, s->replog->base, srv_replog_end(s), f->pos);
        return;
    }
    if (f->wait_c)
        answer_fetch(s, f, 1);
    srv_arg_str(m, 5, f->release, sizeof f->release); /* dense pushes go to it as gradients only when its own */
    srv_replog_flush(s);
    srv_replog_fetched(s, f, from, srv_now_ms(), srv_arg_u64(m, 4) != 0);
    /* what every follower holds goes at once, not at the tick: the next
     * records are written where the last ones were, in the cache, instead
     * of 250 ms of pushes further on (a copy of each push into cold memory
     * was a third of a leader's time in psbench --table --replica) */
    srv_replog_trim_held(s);
    if (s->repl_release)
        s->repl_release(s);
    f->wait_c = c;
    f->wait_cid = c->cid;
    f->wait_id = m->id;
    f->wait_from = from;
    f->wait_until_ms = srv_now_ms() + (wait < FETCH_WAIT_MAX_MS ? wait : FETCH_WAIT_MAX_MS);
    answer_fetch(s, f, wait == 0);
    if (f->snap_fd >= 0 && f->snap_ready && from >= f->snap_pos) /* it has the snapshot: the memory goes */
        srv_replog_snap_close(f);
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
    srv_send_ok_text(c, m->id, "promoted: this psd leads its part now");
}

/* step_down NEW HISTORY: the follower at NEW, which followed this leader's
 * log of id HISTORY, was promoted by hand (follow.c tells its old leader):
 * this psd gives the part up and follows NEW. Refused with a coordinator
 * (etcd names the leader) and by a psd whose log is not that one (it has
 * led another since); a follower answers that it follows already. */
static void cmd_step_down(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char leader[300], err[300], why[400];
    srv_arg_str(m, 0, leader, sizeof leader);
    uint64_t hist = srv_arg_u64(m, 1);
    if (!leader[0] || !hist) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0,
                       "step_down: give the new leader's address (args[0]) and the history id of the log it "
                       "followed (args[1])");
        return;
    }
    if (s->cfg.coordinator[0]) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "step_down refused: this psd has a coordinator, and etcd names its part's leader");
        return;
    }
    if (s->follow) {
        char text[400];
        snprintf(text, sizeof text, "this psd follows %s already", s->follow->leader);
        srv_send_ok_text(c, m->id, text);
        return;
    }
    if (!s->replog || s->replog->history != hist) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "step_down refused: %s followed log %" PRIu64 ", and this psd leads %s: it leads its part "
                       "still; stop the one that should not",
                       leader, hist, s->replog ? "another log" : "no log (no follower ever asked it)");
        return;
    }
    snprintf(why, sizeof why, "its follower %s was promoted (psctl promote)", leader);
    if (!s->step_down || s->step_down(s, leader, why, err, sizeof err) != 0) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "step_down: %s", s->step_down ? err : "not here");
        return;
    }
    snprintf(why, sizeof why, "stepped down: this psd follows %s", leader);
    srv_send_ok_text(c, m->id, why);
}

const srv_repl_command srv_repl_commands[] = {
    {"replicate", cmd_replicate},
    {"repl_chunk", cmd_repl_chunk},
    {"repl_fetch", cmd_repl_fetch},
    {"promote", cmd_promote},
    {"step_down", cmd_step_down},
    {NULL, NULL},
};
