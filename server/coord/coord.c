/* coord.c - leadership of a part through etcd (issue 44): the lease, the
 * election and the fence. Owns psd.coord (what the connection layer, status
 * and metrics read) and psd.coord_state.
 *
 * The part's key, /psd/JOB/part/N/leader, is held by its leader under a
 * lease of lease_ttl; its value is "ADDR POSITION": where workers reach the
 * leader and its replication log's end. /psd/JOB/part/N/insync (no lease)
 * names the leader's in-sync followers, "ADDR,ADDR": the leader writes it
 * as soon as the set changes, and until etcd has the new set a follower
 * that left it still counts for sync replies (write.c), so every follower
 * the key names holds every acknowledged push.
 *
 * - A leader renews its lease every third of lease_ttl. psd.coord.fence_ms
 *   is the request time of the last renewal etcd answered plus 2/3 of
 *   lease_ttl: etcd counts the lease from when it got that request, later,
 *   so the fence passes before the lease can lapse. Past the fence a
 *   worker's reply goes only once every follower holds it (write.c), and no
 *   follower leaves the in-sync set (repl.c): while a follower fetches from
 *   its leader it does not campaign, so no other psd can lead meanwhile.
 * - A leader that finds its lease gone (etcd answered the renewal without
 *   it) takes the key again when nobody holds it, else steps down: its
 *   workers are disconnected (they go to the new leader and send again
 *   what was not acknowledged) and it follows the new leader.
 * - A follower reads the part's keys (/psd/JOB/part/N/...) every READ_MS,
 *   and at every step of the timer (STEP_MS) once its leader has been
 *   silent for max_replica_lag: it may then campaign as soon as the key is
 *   gone, and finds it gone sooner.
 *   When the leader key is gone and the hand-back key (handback.c: a leader
 *   stopped by a signal) names this follower as its successor, it
 *   campaigns at once. When the leader key names
 *   another leader, it follows that one; when it is gone, the follower
 *   campaigns if the in-sync key names it, it holds a snapshot, and it has
 *   heard nothing from its leader for max_replica_lag, and no in-sync peer
 *   that holds more of the log (its position key, elect.c) goes first: a
 *   lease, then one
 *   transaction that puts the key only if it does not exist (its create
 *   revision is 0) and the in-sync key is as the follower read it (its mod
 *   revision), then promote.
 *
 * Everything runs on the loop; etcd.c makes the requests. */
#include "server/coord/coord.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/connection/follow.h"
#include "server/connection/net.h"
#include "server/coord/coord_int.h"
#include "server/coord/elect.h"
#include "server/coord/mapkey.h"
#include "server/coord/etcd.h"
#include "server/coord/jobkey.h"
#include "server/replog/replog.h"

#define STEP_MS 100   /* the timer: what is due is sent */
#define READ_MS 250   /* a follower reads the key this often (STEP_MS when its leader is silent) */
#define RETRY_MS 250  /* a failed renewal is tried again after this */

static const char *role_name(int role)
{
    static const char *const n[] = {"off", "starting", "leader", "follower", "campaigning"};
    return role >= 0 && role <= SRV_COORD_CAMPAIGNING ? n[role] : "?";
}

/* The value a leader publishes: "ADDR POSITION". */
static void leader_value(srv_coord *k, char *out, size_t len)
{
    snprintf(out, len, "%s %" PRIu64, k->self, srv_replog_end(k->s));
}

/* A leader's value: its address into addr. */
static void parse_value(const char *val, char *addr, size_t alen)
{
    char a[300] = "";
    sscanf(val, "%299s", a);
    snprintf(addr, alen, "%s", a);
}

/* Who holds the part's key, from the answer of a transaction that failed
 * its compare (its else branch reads the key): the holder's address, or ""
 * when nobody does. */
static void txn_holder(json_t *a, char *addr, size_t alen)
{
    char val[600] = "";
    json_t *rs = json_object_get(a, "responses");
    json_t *r0 = json_is_array(rs) ? json_object_get(json_array_get(rs, 0), "response_range") : NULL;
    json_t *kvs = r0 ? json_object_get(r0, "kvs") : NULL;
    json_t *kv = json_is_array(kvs) ? json_array_get(kvs, 0) : NULL;
    addr[0] = 0;
    if (kv) {
        srv_etcd_kv_value(kv, val, sizeof val);
        parse_value(val, addr, alen);
    }
}

/* The in-sync key's value, last read: whether it names this psd. */
static void parse_insync(srv_coord *k, const char *insync)
{
    snprintf(k->insync_seen, sizeof k->insync_seen, "%s", insync);
    k->listed = 0;
    for (const char *p = insync; *p;) {
        size_t n = strcspn(p, ",");
        if (n == strlen(k->self) && strncmp(p, k->self, n) == 0)
            k->listed = 1;
        p += n + (p[n] == ',');
    }
}

/* The leader's in-sync followers: their slots (replog.c's) as bits; when
 * list64 is given, their addresses, commas between, base64-encoded into it. */
static uint32_t insync_now(const psd *s, char *list64, size_t len)
{
    char list[600] = "";
    size_t n = 0;
    uint32_t mask = 0;
    const srv_replog *r = s->replog;
    for (int i = 0; r && i < SRV_FOLLOWERS_MAX; i++)
        if (r->f[i].used && r->f[i].insync) {
            mask |= 1u << i;
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? "," : "", r->f[i].addr);
            if (n >= sizeof list)
                n = sizeof list - 1;
        }
    if (list64 && len >= 4 * ((n + 2) / 3) + 1)
        srv_b64_encode(list, n, list64);
    return mask;
}

static void post(srv_coord *k, const char *path, const char *body, srv_etcd_cb cb, int *busy)
{
    *busy = 1;
    if (srv_etcd_call(k->etcd, path, body, cb, k) != 0) {
        *busy = 0;
        PS_LOG(PS_LOG_ERROR, "coordinator: no memory for a request to etcd");
    }
}

/* Gives a lease back (its answer is not awaited: one that is not given
 * back lapses after lease_ttl). */
static void revoke(srv_coord *k, const char *lease)
{
    char body[96];
    if (!lease[0])
        return;
    snprintf(body, sizeof body, "{\"ID\":\"%s\"}", lease);
    if (srv_etcd_call(k->etcd, "/v3/lease/revoke", body, NULL, NULL) != 0)
        PS_LOG(PS_LOG_ERROR, "coordinator: no memory for a request to etcd");
}

/* ---- following, stepping down ---------------------------------------------------- */

static void follow_leader(srv_coord *k, const char *addr)
{
    psd *s = k->s;
    char err[300];
    if (s->follow && strcmp(s->follow->leader, addr) == 0)
        return;
    PS_LOG(PS_LOG_WARN, "coordinator: %s leads part %d of job %s: this psd follows it", addr, s->cfg.part, s->cfg.job);
    if (srv_follow_start_to(s, addr, err, sizeof err) != 0)
        PS_LOG(PS_LOG_ERROR, "coordinator: cannot follow %s: %s", addr, err);
}

/* This psd no longer leads: nothing more is acknowledged, its workers go
 * (they find the new leader and send again what was not answered), and it
 * follows leader when known. */
static void step_down(srv_coord *k, const char *leader)
{
    psd *s = k->s;
    int was = s->coord.role == SRV_COORD_LEADING || k->keep;
    s->coord.fence_ms = 1;
    s->coord.published = 0;
    s->coord.role = leader && leader[0] ? SRV_COORD_FOLLOWING : SRV_COORD_STARTING;
    k->lease[0] = 0;
    k->keep = 0;
    if (was) {
        char err[300];
        s->coord.stepdowns++;
        if (srv_follow_step_down(s, leader, "this psd lost its part's lease", err, sizeof err) != 0)
            PS_LOG(PS_LOG_ERROR, "coordinator: cannot follow %s: %s", leader, err);
    }
    if (leader && leader[0])
        follow_leader(k, leader); /* (a leader that stepped down follows it already) */
}

/* ---- leading --------------------------------------------------------------------- */

static void lead(srv_coord *k, uint64_t grant_ms)
{
    psd *s = k->s;
    s->coord.renewed_ms = grant_ms;
    s->coord.fence_ms = grant_ms + s->coord.ttl_ms * 2 / 3;
    k->next_renew_ms = grant_ms + s->coord.ttl_ms / 3;
    snprintf(s->coord.leader, sizeof s->coord.leader, "%s", k->self);
    if (s->repl_release)
        s->repl_release(s); /* replies held while nobody led may go */
}

static void publish_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)sent_ms;
    srv_coord *k = arg;
    k->publishing = 0;
    if (k->stopped || k->hb_stage)
        return; /* (handback.c: the key is given up) */
    if (!ok) {
        srv_coord_unreached(k, err);
        return;
    }
    srv_coord_reached(k);
    if (k->s->coord.role == SRV_COORD_LEADING && !json_is_true(json_object_get(a, "succeeded"))) {
        char addr[300];
        txn_holder(a, addr, sizeof addr);
        PS_LOG(PS_LOG_WARN, "coordinator: part %d's key is no longer this leader's (%s)", k->s->cfg.part,
               addr[0] ? addr : "gone");
        step_down(k, addr);
        return;
    }
    if (k->s->coord.role == SRV_COORD_LEADING && k->s->coord.published != k->sending_mask) {
        k->s->coord.published = k->sending_mask; /* etcd holds this in-sync set now */
        if (k->s->repl_release)
            k->s->repl_release(k->s);
    }
}

/* Puts the leader's value and its in-sync set, if the key is still the one
 * it created. Until etcd has the in-sync set, a follower that left it still
 * counts for sync replies (write.c), so a follower that could be elected
 * holds every acknowledged push. */
static void publish(srv_coord *k)
{
    char val[700], v64[1000], l64[1000], body[4096];
    leader_value(k, val, sizeof val);
    srv_b64_encode(val, strlen(val), v64);
    k->sending_mask = insync_now(k->s, l64, sizeof l64);
    snprintf(body, sizeof body,
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"createRevision\":\"%" PRId64 "\"}],"
             "\"success\":[{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}},"
             "{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\"}}],"
             "\"failure\":[{\"requestRange\":{\"key\":\"%s\"}}]}",
             k->key64, k->create_rev, k->key64, v64, k->lease, k->ikey64, l64, k->key64);
    post(k, "/v3/kv/txn", body, publish_done, &k->publishing);
}

static void campaign(srv_coord *k, int keep);

static void renew_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    srv_coord *k = arg;
    psd *s = k->s;
    k->renewing = 0;
    if (k->stopped || s->coord.role != SRV_COORD_LEADING || k->hb_stage > HB_DRAIN)
        return;
    if (!ok) {
        srv_coord_unreached(k, err);
        k->next_renew_ms = srv_now_ms() + RETRY_MS;
        return;
    }
    srv_coord_reached(k);
    json_t *res = json_object_get(a, "result");
    if (srv_etcd_int(res ? res : a, "TTL") <= 0) {
        PS_LOG(PS_LOG_WARN, "coordinator: this leader's lease %s has lapsed in etcd: taking part %d's key again if "
               "nobody holds it", k->lease, s->cfg.part);
        campaign(k, 1);
        return;
    }
    int was_fenced = srv_now_ms() >= s->coord.fence_ms;
    s->coord.renewals++;
    s->coord.renewed_ms = sent_ms;
    s->coord.fence_ms = sent_ms + s->coord.ttl_ms * 2 / 3;
    k->next_renew_ms = sent_ms + s->coord.ttl_ms / 3;
    if (was_fenced && srv_now_ms() < s->coord.fence_ms) {
        PS_LOG(PS_LOG_INFO, "coordinator: lease renewed: this leader acknowledges pushes on its lease again");
        if (s->repl_release)
            s->repl_release(s);
    }
    if (!k->publishing)
        publish(k);
}

static void renew(srv_coord *k)
{
    char body[96];
    snprintf(body, sizeof body, "{\"ID\":\"%s\"}", k->lease);
    post(k, "/v3/lease/keepalive", body, renew_done, &k->renewing);
}

/* ---- campaigning ---------------------------------------------------------------- */

static void txn_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)sent_ms;
    srv_coord *k = arg;
    psd *s = k->s;
    k->campaigning = 0;
    if (k->stopped)
        return;
    if (!ok) {
        srv_coord_unreached(k, err);
        revoke(k, k->lease);
        k->lease[0] = 0;
        if (k->keep)
            s->coord.role = SRV_COORD_LEADING, k->next_renew_ms = srv_now_ms() + RETRY_MS;
        else
            s->coord.role = s->follow ? SRV_COORD_FOLLOWING : SRV_COORD_STARTING;
        return;
    }
    srv_coord_reached(k);
    if (!json_is_true(json_object_get(a, "succeeded"))) {
        char addr[300];
        txn_holder(a, addr, sizeof addr);
        revoke(k, k->lease);
        PS_LOG(PS_LOG_INFO, "coordinator: %s took part %d's key first", addr[0] ? addr : "another psd", s->cfg.part);
        if (k->keep || !s->follow)
            step_down(k, addr);
        else
            s->coord.role = SRV_COORD_FOLLOWING;
        return;
    }
    json_t *h = json_object_get(a, "header");
    k->create_rev = srv_etcd_int(h, "revision");
    char why[300];
    if (s->follow) {
        int rc = s->promote ? s->promote(s, why, sizeof why) : PS_ESTATE;
        if (rc != 0) {
            PS_LOG(PS_LOG_ERROR, "coordinator: this follower took part %d's key but cannot lead: %s; letting it go",
                   s->cfg.part, s->promote ? why : "no promote");
            revoke(k, k->lease);
            k->lease[0] = 0;
            s->coord.role = SRV_COORD_FOLLOWING;
            return;
        }
    }
    int kept = k->keep;
    k->keep = 0;
    s->coord.role = SRV_COORD_LEADING;
    if (!kept)
        s->coord.elections++;
    s->coord.published = k->sending_mask;
    lead(k, k->grant_ms);
    PS_LOG(PS_LOG_WARN, "coordinator: this psd %s part %d of job %s (lease %s of %" PRIu64 " s, key revision %" PRId64
           ")", kept ? "keeps leading" : "leads", s->cfg.part, s->cfg.job, k->lease, s->coord.ttl_ms / 1000,
           k->create_rev);
}

static void grant_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    srv_coord *k = arg;
    psd *s = k->s;
    if (k->stopped) {
        k->campaigning = 0;
        return;
    }
    const char *id = ok ? srv_etcd_str(a, "ID") : NULL;
    if (!id) {
        k->campaigning = 0;
        srv_coord_unreached(k, ok ? "etcd granted no lease" : err);
        s->coord.role = k->keep ? SRV_COORD_LEADING : s->follow ? SRV_COORD_FOLLOWING : SRV_COORD_STARTING;
        if (k->keep)
            k->next_renew_ms = srv_now_ms() + RETRY_MS;
        return;
    }
    srv_coord_reached(k);
    snprintf(k->lease, sizeof k->lease, "%s", id);
    k->grant_ms = sent_ms;
    char val[700], v64[1000], l64[1000], body[4096], also[800] = "";
    leader_value(k, val, sizeof val);
    srv_b64_encode(val, strlen(val), v64);
    /* a new leader has no follower in sync yet; one that keeps leading, its own */
    k->sending_mask = k->keep ? insync_now(s, l64, sizeof l64) : 0;
    if (!k->keep)
        l64[0] = 0;
    /* a follower: only if the in-sync set that named it has not changed since */
    if (s->follow)
        snprintf(also, sizeof also, ",{\"target\":\"MOD\",\"key\":\"%s\",\"modRevision\":\"%" PRId64 "\"}",
                 k->ikey64, k->insync_rev);
    snprintf(body, sizeof body,
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\",\"createRevision\":\"0\"}%s],"
             "\"success\":[{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}},"
             "{\"requestPut\":{\"key\":\"%s\",\"value\":\"%s\"}},{\"requestDeleteRange\":{\"key\":\"%s\"}}],"
             "\"failure\":[{\"requestRange\":{\"key\":\"%s\"}}]}",
             k->key64, also, k->key64, v64, k->lease, k->ikey64, l64, k->hkey64, k->key64);
    int busy;
    post(k, "/v3/kv/txn", body, txn_done, &busy);
    if (!busy)
        k->campaigning = 0;
}

/* Takes the key when nobody holds it: a lease, then a transaction that
 * puts the key only if it does not exist. keep: this psd leads already and
 * its own lease lapsed. */
static void campaign(srv_coord *k, int keep)
{
    psd *s = k->s;
    char body[64];
    k->keep = keep;
    s->coord.role = SRV_COORD_CAMPAIGNING;
    snprintf(body, sizeof body, "{\"TTL\":\"%" PRIu64 "\"}", (s->coord.ttl_ms + 999) / 1000);
    post(k, "/v3/lease/grant", body, grant_done, &k->campaigning);
}

/* ---- reading the key ---------------------------------------------------------------- */

/* Whether this follower may campaign: it holds its leader's state, was in
 * the in-sync set the key last named, and its leader has not answered for
 * max_replica_lag (a follower that fetches from a live leader never does). */
static int may_campaign(srv_coord *k, uint64_t now)
{
    psd *s = k->s;
    if (!s->follow) {
        /* starting with no leader to follow. After a restart that found
         * the key of its own previous run, it leaves the followers, which
         * may hold more than its checkpoint, lease_ttl to take it first */
        if (!k->said_own_key)
            return 1;
        if (!k->absent_ms)
            k->absent_ms = now;
        return now - k->absent_ms >= s->coord.ttl_ms;
    }
    if (!s->follow->synced || s->follow->failed || !s->follow->t)
        return 0;
    uint64_t contact = srv_follow_contact_ms(s);
    return k->listed && now - contact > s->cfg.max_replica_lag;
}

/* The hand-back key's value (handback.c), "ADDR POSITION SUCCESSOR": 1
 * when the leader this follower follows handed the part back naming it,
 * and it holds what that leader's log had up to POSITION, so it may
 * campaign at once (it is in sync, and its leader acknowledges nothing
 * more). */
static int handed_to_me(srv_coord *k, const char *hb)
{
    psd *s = k->s;
    char from[300] = "", to[300] = "";
    uint64_t pos = 0;
    if (!hb[0] || sscanf(hb, "%299s %" SCNu64 " %299s", from, &pos, to) != 3)
        return 0;
    return s->follow && s->follow->t && s->follow->synced && !s->follow->failed && k->listed &&
           strcmp(from, s->follow->leader) == 0 && strcmp(to, k->self) == 0 && s->follow->applied >= pos;
}

static void read_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)sent_ms;
    srv_coord *k = arg;
    psd *s = k->s;
    k->reading = 0;
    if (k->stopped || (s->coord.role != SRV_COORD_FOLLOWING && s->coord.role != SRV_COORD_STARTING))
        return;
    if (!ok) {
        srv_coord_unreached(k, err);
        return;
    }
    srv_coord_reached(k);
    char val[600] = "", addr[300] = "", insync[600] = "", hb[700] = "", key[700];
    int held = 0;
    size_t plen = strlen(k->pfx);
    k->insync_rev = 0;
    k->npeers = 0;
    json_t *kvs = json_object_get(a, "kvs");
    for (size_t i = 0; json_is_array(kvs) && i < json_array_size(kvs); i++) {
        json_t *kv = json_array_get(kvs, i);
        const char *key64 = srv_etcd_str(kv, "key");
        if (!key64 || srv_b64_decode(key64, key, sizeof key) < 0 || strncmp(key, k->pfx, plen) != 0)
            continue;
        const char *name = key + plen; /* the part's keys: insync, leader, handback */
        if (strcmp(name, "insync") == 0) {
            srv_etcd_kv_value(kv, insync, sizeof insync);
            k->insync_rev = srv_etcd_int(kv, "mod_revision");
        } else if (strcmp(name, "leader") == 0) {
            srv_etcd_kv_value(kv, val, sizeof val);
            held = 1;
        } else if (strcmp(name, "handback") == 0) {
            srv_etcd_kv_value(kv, hb, sizeof hb);
        } else if (strncmp(name, "pos/", 4) == 0) { /* a follower's position (elect.c) */
            char pv[600];
            srv_etcd_kv_value(kv, pv, sizeof pv);
            srv_coord_peer_read(k, name + 4, pv);
        }
    }
    parse_insync(k, insync);
    if (held) {
        parse_value(val, addr, sizeof addr);
        s->coord.listed = k->listed;
        k->absent_ms = 0;
        k->pos.defer_since = 0;
        snprintf(s->coord.leader, sizeof s->coord.leader, "%s", addr);
        if (strcmp(addr, k->self) == 0) {
            if (!k->said_own_key)
                PS_LOG(PS_LOG_WARN, "coordinator: part %d's key still names this psd (a lease of its previous run): "
                       "waiting for it to lapse", s->cfg.part);
            k->said_own_key = 1;
            return;
        }
        if (addr[0]) {
            s->coord.role = SRV_COORD_FOLLOWING;
            follow_leader(k, addr);
        }
        return;
    }
    s->coord.leader[0] = 0;
    uint64_t now = srv_now_ms();
    s->coord.listed = k->listed;
    if (handed_to_me(k, hb)) {
        PS_LOG(PS_LOG_WARN, "coordinator: %s handed part %d back naming this follower, which holds its log: "
               "campaigning at once", s->follow->leader, s->cfg.part);
        campaign(k, 0);
        return;
    }
    if (may_campaign(k, now)) {
        if (s->follow && srv_coord_defer(k, now))
            return;
        PS_LOG(PS_LOG_WARN, "coordinator: part %d has no leader in etcd%s: campaigning", s->cfg.part,
               s->follow ? " (its lease lapsed) and this follower, in its in-sync set, has not heard from it for "
                           "max_replica_lag" : "");
        campaign(k, 0);
    }
}

/* Whether this follower's leader has been silent for max_replica_lag: it
 * reads the key at every step then, not every READ_MS, so that it finds
 * the dead leader's lease lapsed within STEP_MS (a kill -9 with lease_ttl
 * 2 s: the workers' pause is the lapse, etcd's own check for expired
 * leases, up to 500 ms, this read, and their reconnect; the chaos test
 * holds it to 3 s). A follower that fetches from a live leader reads as
 * before. */
static int leader_silent(srv_coord *k, uint64_t now)
{
    psd *s = k->s;
    return s->follow && s->follow->t && s->follow->synced && k->listed &&
           now - srv_follow_contact_ms(s) > s->cfg.max_replica_lag;
}

static void read_key(srv_coord *k)
{
    char body[1000];
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"range_end\":\"%s\"}", k->pfx64, k->end64);
    post(k, "/v3/kv/range", body, read_done, &k->reading);
}

static void on_step(uv_timer_t *t)
{
    srv_coord *k = t->data;
    psd *s = k->s;
    uint64_t now = srv_now_ms();
    if (k->stopped || k->campaigning || k->hb_stage > HB_DRAIN)
        return; /* (handback.c gives the key up: nothing more) */
    if (!k->job.ok) { /* the job's record first (jobkey.c) */
        srv_coord_job_step(k, now);
        return;
    }
    switch (s->coord.role) {
    case SRV_COORD_LEADING:
        if (!k->renewing && now >= k->next_renew_ms)
            renew(k);
        else if (!k->hb_stage && !k->publishing && insync_now(s, NULL, 0) != s->coord.published)
            publish(k); /* sync replies wait for the followers etcd names until it has the new set */
        else if (!k->hb_stage)
            srv_coord_map_step(k); /* a move's end: the job's map in etcd */
        break;
    case SRV_COORD_STARTING:
    case SRV_COORD_FOLLOWING:
        if (!k->reading && now >= k->next_read_ms) {
            /* half a step: the next tick reads again, however it falls */
            k->next_read_ms = now + (leader_silent(k, now) ? STEP_MS / 2 : READ_MS);
            read_key(k);
        }
        srv_coord_pos_step(k, now); /* this follower's position (elect.c) */
        break;
    default:
        break;
    }
}

/* ---- start and stop ------------------------------------------------------------------ */

int srv_coord_start(psd *s, char *err, size_t errlen)
{
    if (!s->cfg.coordinator[0])
        return 0;
    if (!s->cfg.job[0])
        return ps_fail(err, errlen, PS_EINVAL, "coordinator is set but job is not: give the job's name (job = NAME), "
                       "the same on every psd of the job");
    for (const char *p = s->cfg.job; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
            return ps_fail(err, errlen, PS_EINVAL, "job \"%s\": only letters, digits, '-', '_' and '.'", s->cfg.job);
    if (s->cfg.lease_ttl % 1000)
        return ps_fail(err, errlen, PS_EINVAL, "lease_ttl must be whole seconds (etcd's leases are), not %" PRIu64
                       " ms", s->cfg.lease_ttl);
    srv_coord *k = calloc(1, sizeof *k);
    if (!k)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for the coordinator");
    k->s = s;
    uint64_t timeout = s->cfg.lease_ttl / 6 < 1000 ? s->cfg.lease_ttl / 6 : 1000;
    if (!(k->etcd = srv_etcd_new(s->loop, s->cfg.coordinator, timeout, err, errlen))) {
        free(k);
        return PS_EINVAL;
    }
    if (s->cfg.advertise[0])
        snprintf(k->self, sizeof k->self, "%s", s->cfg.advertise);
    else
        snprintf(k->self, sizeof k->self, "127.0.0.1:%d", s->port); /* as follow.c names this psd */
    char path[300];
    snprintf(s->coord.key, sizeof s->coord.key, "/psd/%s/part/%d/leader", s->cfg.job, s->cfg.part);
    srv_b64_encode(s->coord.key, strlen(s->coord.key), k->key64);
    snprintf(path, sizeof path, "/psd/%s/part/%d/insync", s->cfg.job, s->cfg.part);
    srv_b64_encode(path, strlen(path), k->ikey64);
    snprintf(path, sizeof path, "/psd/%s/part/%d/handback", s->cfg.job, s->cfg.part);
    srv_b64_encode(path, strlen(path), k->hkey64);
    snprintf(k->pfx, sizeof k->pfx, "/psd/%s/part/%d/", s->cfg.job, s->cfg.part);
    srv_b64_encode(k->pfx, strlen(k->pfx), k->pfx64);
    srv_coord_pos_init(k);
    srv_coord_job_init(k);
    snprintf(path, sizeof path, "/psd/%s/part/%d0", s->cfg.job, s->cfg.part); /* the end of the part's keys */
    srv_b64_encode(path, strlen(path), k->end64);
    s->coord.ttl_ms = s->cfg.lease_ttl;
    s->coord.fence_ms = 1; /* nothing is acknowledged before this psd holds the lease */
    s->coord.role = s->follow ? SRV_COORD_FOLLOWING : SRV_COORD_STARTING;
    s->coord.reachable = 1;
    s->coord_state = k;
    uv_timer_init(s->loop, &k->timer);
    k->timer.data = k;
    uv_timer_start(&k->timer, on_step, 0, STEP_MS);
    PS_LOG(PS_LOG_INFO, "coordinator: etcd at %s, key %s, lease_ttl %" PRIu64 " s; this psd (%s) %s", s->cfg.coordinator,
           s->coord.key, s->cfg.lease_ttl / 1000, k->self, role_name(s->coord.role));
    return 0;
}

void srv_coord_stop(psd *s)
{
    srv_coord *k = s->coord_state;
    if (!k || k->stopped)
        return;
    k->stopped = 1;
    uv_timer_stop(&k->timer);
    uv_close((uv_handle_t *)&k->timer, NULL);
    if (k->hb_timer_on) {
        uv_timer_stop(&k->hb_timer);
        uv_close((uv_handle_t *)&k->hb_timer, NULL);
    }
    srv_etcd_close(k->etcd); /* the lease, unless handed back (handback.c), is left to lapse */
}

void srv_coord_free(psd *s)
{
    srv_coord_stop(s);
    free(s->coord_state);
    s->coord_state = NULL;
}
