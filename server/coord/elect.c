/* elect.c - the newest in-sync follower goes first (issue 44), as etcd-based
 * systems do (Patroni's candidate checks the others' positions before it
 * takes the leader key). Owns srv_coord.pos and the peers read.
 *
 * Each follower keeps /psd/JOB/part/N/pos/ADDR = "POSITION LEADER" under a
 * lease of its own (lease_ttl): how much of LEADER's log it has applied,
 * put again when that changed, at most every SRV_COORD_PUT_MS. A candidate
 * (coord.c: the leader key gone, its own max_replica_lag of silence) reads
 * the part's keys and defers to an in-sync peer of the same leader that
 * holds more, or as much with a lower address. Bounded: a dead peer's key
 * lapses with its lease, and a candidate that has deferred for
 * max_replica_lag + lease_ttl without anyone taking the key campaigns
 * anyway; every in-sync follower
 * holds every acknowledged push, so who wins is a matter of how much of
 * the rest is kept, never of safety.
 *
 * Calls etcd.c alone; coord.c calls it. */
#include "server/coord/elect.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/connection/follow.h"

#define RETRY_MS 1000 /* after etcd failed a request */

static int in_list(const char *list, const char *addr)
{
    size_t len = strlen(addr);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, addr, n) == 0)
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

int srv_coord_newer_peer(const srv_coord_peer *peers, int n, const char *insync, const char *self,
                         const char *leader, uint64_t pos)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        const srv_coord_peer *p = &peers[i];
        if (strcmp(p->addr, self) == 0 || strcmp(p->leader, leader) != 0 || !in_list(insync, p->addr))
            continue;
        if (p->pos < pos || (p->pos == pos && strcmp(p->addr, self) > 0))
            continue;
        if (best < 0 || p->pos > peers[best].pos ||
            (p->pos == peers[best].pos && strcmp(p->addr, peers[best].addr) < 0))
            best = i;
    }
    return best;
}

void srv_coord_peer_read(srv_coord *k, const char *name, const char *val)
{
    if (k->npeers >= SRV_COORD_PEERS_MAX)
        return;
    srv_coord_peer *p = &k->peer[k->npeers];
    char leader[300] = "";
    uint64_t pos = 0;
    if (sscanf(val, "%" SCNu64 " %299s", &pos, leader) != 2)
        return;
    snprintf(p->addr, sizeof p->addr, "%s", name);
    snprintf(p->leader, sizeof p->leader, "%s", leader);
    p->pos = pos;
    k->npeers++;
}

void srv_coord_pos_init(srv_coord *k)
{
    char key[700];
    snprintf(key, sizeof key, "%spos/%s", k->pfx, k->self);
    srv_b64_encode(key, strlen(key), k->pos.key64);
}

static void failed(srv_coord *k, const char *what, const char *err)
{
    PS_LOG(PS_LOG_DEBUG, "coordinator: this follower's position key: %s: %s", what, err ? err : "refused");
    k->pos.next_put_ms = srv_now_ms() + RETRY_MS;
    k->pos.put = 0; /* put again */
}

static void put_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)a, (void)sent_ms;
    srv_coord *k = arg;
    k->pos.busy = 0;
    if (!k->stopped && !ok)
        failed(k, "put", err);
}

static void grant_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    srv_coord *k = arg;
    k->pos.busy = 0;
    if (k->stopped)
        return;
    const char *id = ok ? srv_etcd_str(a, "ID") : NULL;
    if (!id) {
        failed(k, "lease", ok ? "no lease granted" : err);
        return;
    }
    snprintf(k->pos.lease, sizeof k->pos.lease, "%s", id);
    k->pos.next_renew_ms = sent_ms + k->s->coord.ttl_ms / 3;
    k->pos.put = 0;
}

static void renew_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)err;
    srv_coord *k = arg;
    k->pos.busy = 0;
    if (k->stopped)
        return;
    if (!ok) {
        k->pos.next_renew_ms = srv_now_ms() + RETRY_MS / 4;
        return;
    }
    json_t *res = json_object_get(a, "result");
    json_t *ttl = json_object_get(res ? res : a, "TTL");
    long long left = json_is_string(ttl) ? strtoll(json_string_value(ttl), NULL, 10)
                     : json_is_integer(ttl) ? (long long)json_integer_value(ttl) : 0;
    if (left <= 0) { /* lapsed: a new lease, and the key again */
        k->pos.lease[0] = 0;
        return;
    }
    k->pos.next_renew_ms = sent_ms + k->s->coord.ttl_ms / 3;
}

static void call(srv_coord *k, const char *path, const char *body, srv_etcd_cb cb)
{
    k->pos.busy = 1;
    if (srv_etcd_call(k->etcd, path, body, cb, k) != 0)
        k->pos.busy = 0;
}

void srv_coord_pos_step(srv_coord *k, uint64_t now)
{
    psd *s = k->s;
    srv_coord_pos *p = &k->pos;
    if (p->busy || !s->follow || !s->follow->synced || now < p->next_put_ms)
        return;
    char body[2000];
    if (!p->lease[0]) {
        snprintf(body, sizeof body, "{\"TTL\":\"%" PRIu64 "\"}", (s->coord.ttl_ms + 999) / 1000);
        call(k, "/v3/lease/grant", body, grant_done);
        return;
    }
    if (now >= p->next_renew_ms) {
        snprintf(body, sizeof body, "{\"ID\":\"%s\"}", p->lease);
        call(k, "/v3/lease/keepalive", body, renew_done);
        return;
    }
    uint64_t applied = s->follow->applied;
    if (p->put == applied + 1 && strcmp(p->put_leader, s->follow->leader) == 0)
        return;
    char val[400], v64[600];
    snprintf(val, sizeof val, "%" PRIu64 " %s", applied, s->follow->leader);
    srv_b64_encode(val, strlen(val), v64);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":\"%s\"}", p->key64, v64, p->lease);
    p->put = applied + 1;
    snprintf(p->put_leader, sizeof p->put_leader, "%s", s->follow->leader);
    p->next_put_ms = now + SRV_COORD_PUT_MS;
    call(k, "/v3/kv/put", body, put_done);
}

/* Whether this candidate, a follower, waits for a newer in-sync peer to
 * take the key (elect.c): the peers' positions are read after a second of
 * silence at least, their last puts in etcd by then. A newer peer heard
 * from the leader later than this one, so it may campaign (after
 * max_replica_lag of silence) up to max_replica_lag after this one; a dead
 * one's key lapses within lease_ttl. So a candidate defers for
 * max_replica_lag + lease_ttl at most. */
int srv_coord_defer(srv_coord *k, uint64_t now)
{
    psd *s = k->s;
    srv_coord_pos *p = &k->pos;
    if (now - srv_follow_contact_ms(s) < 4 * SRV_COORD_PUT_MS)
        return 1;
    int i = srv_coord_newer_peer(k->peer, k->npeers, k->insync_seen, k->self, s->follow->leader, s->follow->applied);
    if (i < 0)
        return 0;
    if (!p->defer_since || strcmp(p->deferred_to, k->peer[i].addr) != 0) {
        if (!p->defer_since)
            p->defer_since = now;
        snprintf(p->deferred_to, sizeof p->deferred_to, "%s", k->peer[i].addr);
        PS_LOG(PS_LOG_INFO, "coordinator: part %d has no leader; %s, in sync, holds more of %s's log (position %"
               PRIu64 ", this follower's %" PRIu64 ") or as much with a lower address: this follower lets it "
               "campaign first", s->cfg.part, k->peer[i].addr, s->follow->leader, k->peer[i].pos, s->follow->applied);
    }
    if (now - p->defer_since < s->cfg.max_replica_lag + s->coord.ttl_ms)
        return 1;
    PS_LOG(PS_LOG_WARN, "coordinator: %s has not taken part %d's key within max_replica_lag + lease_ttl: this "
           "follower campaigns", k->peer[i].addr, s->cfg.part);
    p->defer_since = now; /* (logged again after as long) */
    return 0;
}
