/* handback.c - a leader stopped by SIGTERM or SIGINT hands its part back
 * (issue 44) instead of leaving its followers to wait for its lease to
 * lapse. Owns psd.coord.handing_back and the hand-back key,
 * /psd/JOB/part/N/handback.
 *
 * 1. It stops acknowledging: its workers' connections close (their pushes
 *    not answered go, with their push ids, to the next leader) and a
 *    worker's hello is refused with SHUTDOWN (session/hello.c) while it
 *    hands back. It goes on renewing its lease meanwhile.
 * 2. It drains: once no update runs off the loop, its in-sync followers
 *    (and those etcd's in-sync key still names) fetch up to its log's end,
 *    so that nothing it applied is left behind; at most max_replica_lag
 *    (a follower in sync fetches far more often).
 * 3. It chooses its successor, the follower that fetched furthest (the
 *    lowest address among equals), and in one transaction, if the key is
 *    still the one it created, deletes the key and puts the hand-back key,
 *    "ADDR POSITION SUCCESSOR" (no lease): this psd, the position the
 *    successor holds everything before, the successor. Then it revokes its
 *    lease. The successor reads the key gone and the hand-back key naming
 *    it and campaigns at once (coord.c), without waiting for
 *    max_replica_lag; an election deletes the hand-back key.
 * 4. psd stops as it does without a coordinator (its last checkpoint).
 *
 * Each etcd request is bounded (etcd.c); a failure ends the hand-back
 * there, psd stops, and the followers elect one when the lease lapses, as
 * after a kill. Calls nothing of coord.c: it reads and writes the state
 * coord_int.h shares, and coord.c's renewals go on meanwhile. */
#include "server/coord/coord.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "server/connection/net.h"
#include "server/coord/coord_int.h"
#include "server/coord/etcd.h"
#include "server/dispatch/repl.h"
#include "server/replog/replog.h"
#include "server/update/update.h"

#define HB_STEP_MS 20 /* the hand-back's timer */

/* The followers that must hold the log's end: in sync, or named by etcd's
 * in-sync key (psd.coord.published). 1 when each has fetched up to end. */
static int drained(const psd *s, uint64_t end)
{
    const srv_replog *r = s->replog;
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && (r->f[i].insync || (s->coord.published >> i & 1)) && r->f[i].pos < end)
            return 0;
    return 1;
}

/* The successor: the in-sync follower that fetched furthest, the lowest
 * address among equals; NULL when none is in sync. */
static const srv_follower *successor(const psd *s)
{
    const srv_follower *best = NULL;
    const srv_replog *r = s->replog;
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++) {
        const srv_follower *f = &r->f[i];
        if (f->used && f->insync &&
            (!best || f->pos > best->pos || (f->pos == best->pos && strcmp(f->addr, best->addr) < 0)))
            best = f;
    }
    return best;
}

static void revoke_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)a, (void)sent_ms;
    srv_coord *k = arg;
    if (k->stopped)
        return;
    if (!ok)
        PS_LOG(PS_LOG_WARN, "coordinator: etcd did not take the lease back (%s): it lapses by itself", err);
    k->hb_stage = HB_OVER; /* the timer stops psd: not from inside etcd's callback */
}

static void delete_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)sent_ms;
    srv_coord *k = arg;
    psd *s = k->s;
    if (k->stopped)
        return;
    if (!ok) {
        PS_LOG(PS_LOG_ERROR, "coordinator: etcd did not take part %d's key back (%s): the followers elect a leader "
               "once its lease lapses", s->cfg.part, err);
        k->hb_stage = HB_OVER;
        return;
    }
    if (!json_is_true(json_object_get(a, "succeeded"))) {
        PS_LOG(PS_LOG_WARN, "coordinator: part %d's key was no longer this leader's: nothing to hand back",
               s->cfg.part);
        k->hb_stage = HB_OVER;
        return;
    }
    s->coord.role = SRV_COORD_STARTING;
    s->coord.leader[0] = 0;
    s->coord.fence_ms = 1;
    PS_LOG(PS_LOG_WARN, "coordinator: part %d's key deleted: the part has no leader until its successor takes it",
           s->cfg.part);
    char body[96];
    snprintf(body, sizeof body, "{\"ID\":\"%s\"}", k->lease);
    k->lease[0] = 0;
    k->hb_stage = HB_REVOKING;
    if (srv_etcd_call(k->etcd, "/v3/lease/revoke", body, revoke_done, k) != 0)
        k->hb_stage = HB_OVER;
}

/* Deletes the key and puts the hand-back key, naming f. */
static void hand_over(srv_coord *k, const srv_follower *f)
{
    psd *s = k->s;
    char val[700], v64[1000], body[4096];
    snprintf(val, sizeof val, "%s %" PRIu64 " %s", k->self, f->pos, f->addr);
    srv_b64_encode(val, strlen(val), v64);
    snprintf(body, sizeof body,
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"createRevision\":\"%" PRId64 "\"}],"
             "\"success\":[{\"requestDeleteRange\":{\"key\":\"%s\"}},"
             "{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\"}}],"
             "\"failure\":[{\"requestRange\":{\"key\":\"%s\"}}]}",
             k->key64, k->create_rev, k->key64, k->hkey64, v64, k->key64);
    PS_LOG(PS_LOG_WARN, "coordinator: handing part %d back: %s, in sync at position %" PRIu64 " (this leader's log "
           "ends at %" PRIu64 "), is named to take it", s->cfg.part, f->addr, f->pos, srv_replog_end(s));
    k->hb_stage = HB_DELETING;
    if (srv_etcd_call(k->etcd, "/v3/kv/txn", body, delete_done, k) != 0)
        k->hb_stage = HB_OVER;
}

static void on_hb_step(uv_timer_t *t)
{
    srv_coord *k = t->data;
    psd *s = k->s;
    if (k->stopped)
        return;
    if (k->hb_stage == HB_OVER) {
        uv_timer_stop(t);
        void (*done)(psd *) = k->hb_done;
        k->hb_done = NULL;
        if (done)
            done(s); /* psd stops: srv_coord_stop closes this timer */
        return;
    }
    if (k->hb_stage != HB_DRAIN || srv_update_busy(s))
        return;
    srv_replog_flush(s);
    srv_admin_repl_wake(s); /* waiting fetches get the last records */
    uint64_t end = srv_replog_end(s);
    int all = drained(s, end);
    if (!all && srv_now_ms() < k->hb_deadline)
        return;
    const srv_follower *f = successor(s);
    if (!f || s->coord.role != SRV_COORD_LEADING) {
        PS_LOG(PS_LOG_WARN, "coordinator: %s: stopping without handing part %d back (its lease lapses)",
               !f ? "no follower in sync any more" : "this psd no longer leads", s->cfg.part);
        k->hb_stage = HB_OVER;
        return;
    }
    if (!all)
        PS_LOG(PS_LOG_WARN, "coordinator: the followers did not all fetch up to position %" PRIu64 " within "
               "max_replica_lag: what they lack was not acknowledged, and its workers send it again", end);
    hand_over(k, f);
}

int srv_coord_hand_back(psd *s, const char *why, void (*done)(psd *s))
{
    srv_coord *k = s->coord_state;
    if (!k || k->stopped || k->hb_stage || s->coord.role != SRV_COORD_LEADING || !k->lease[0] ||
        srv_replog_insync(s) == 0)
        return 0;
    k->hb_done = done;
    k->hb_stage = HB_DRAIN;
    k->hb_deadline = srv_now_ms() + s->cfg.max_replica_lag;
    s->coord.handing_back = 1;
    char reason[sizeof ((srv_conn *)0)->close_reason];
    snprintf(reason, sizeof reason, "%.8s: this psd hands part %d to a follower", why, s->cfg.part);
    uint32_t n = srv_conn_close_workers(s, reason);
    PS_LOG(PS_LOG_WARN, "%s: this leader hands part %d of job %s back: %u worker%s disconnected (what was not "
           "answered they send to the next leader); waiting up to %.1f s (max_replica_lag) for its %u in-sync "
           "follower%s to fetch everything, then deleting its key", why, s->cfg.part, s->cfg.job, n,
           n == 1 ? "" : "s", (double)s->cfg.max_replica_lag / 1e3, srv_replog_insync(s),
           srv_replog_insync(s) == 1 ? "" : "s");
    uv_timer_init(s->loop, &k->hb_timer);
    k->hb_timer.data = k;
    k->hb_timer_on = 1;
    uv_timer_start(&k->hb_timer, on_hb_step, 0, HB_STEP_MS);
    return 1;
}
