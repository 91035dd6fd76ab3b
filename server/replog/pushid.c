/* pushid.c - pushes applied once: the highest push number applied per
 * client (psd.pushids), in an open-addressing hash table keyed by the
 * client's random identity. Linear probing, at most half full, deletion by
 * shifting back the entries after the one removed (so no tombstones).
 * Bounded: at most SRV_PUSHIDS_MAX clients; a new one past that forgets
 * the client whose last push is the oldest (a scan, only when a new client
 * arrives at a full table). */
#include "server/replog/pushid.h"
#include "server/replog/replog.h"

#include <stdlib.h>

#include "common/log.h"
#include "proto/errors.h"

#define FIRST_CAP 64u

static uint32_t home(uint64_t cid, uint32_t cap)
{
    return (uint32_t)((cid * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

/* The slot holding cid, or UINT32_MAX. */
static uint32_t find(const srv_pushids *t, uint64_t cid)
{
    if (!t->cap || cid == 0)
        return UINT32_MAX;
    for (uint32_t i = home(cid, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->slot[i].cid == cid)
            return i;
        if (t->slot[i].cid == 0)
            return UINT32_MAX;
    }
}

/* Puts an entry not present into a table with room for it. */
static void place(srv_pushids *t, srv_pushid_ent e)
{
    uint32_t i = home(e.cid, t->cap);
    while (t->slot[i].cid != 0)
        i = (i + 1) & (t->cap - 1);
    t->slot[i] = e;
    t->n++;
}

/* Empties slot i, shifting back the entries of its probe run. */
static void remove_at(srv_pushids *t, uint32_t i)
{
    uint32_t mask = t->cap - 1;
    t->slot[i].cid = 0;
    t->n--;
    for (uint32_t j = (i + 1) & mask; t->slot[j].cid != 0; j = (j + 1) & mask) {
        uint32_t h = home(t->slot[j].cid, t->cap);
        /* j's entry may move to i when i lies cyclically in [h, j) */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            t->slot[i] = t->slot[j];
            t->slot[j].cid = 0;
            i = j;
        }
    }
}

static int grow(srv_pushids *t)
{
    uint32_t cap = t->cap ? t->cap * 2 : FIRST_CAP;
    srv_pushid_ent *old = t->slot, *e = calloc(cap, sizeof *e);
    if (!e)
        return PS_ENOMEM;
    uint32_t ocap = t->cap;
    t->slot = e;
    t->cap = cap;
    t->n = 0;
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i].cid)
            place(t, old[i]);
    free(old);
    return 0;
}

/* Room for one more client: the table grown to stay at most half full, or,
 * at SRV_PUSHIDS_MAX clients, the one that pushed longest ago forgotten. */
static int make_room(srv_pushids *t)
{
    if (t->n >= SRV_PUSHIDS_MAX) {
        uint32_t old = UINT32_MAX;
        for (uint32_t i = 0; i < t->cap; i++)
            if (t->slot[i].cid && (old == UINT32_MAX || t->slot[i].used < t->slot[old].used))
                old = i;
        PS_LOG(PS_LOG_DEBUG, "push ids: %u clients recorded, forgetting client %016llx (its last push is the "
                             "oldest)", t->n, (unsigned long long)t->slot[old].cid);
        remove_at(t, old);
        return 0;
    }
    return (t->n + 1) * 2 > t->cap ? grow(t) : 0;
}

static int record(srv_pushids *t, uint64_t cid, uint64_t pid, int exact)
{
    uint32_t i = find(t, cid);
    if (i != UINT32_MAX) {
        if (exact || pid > t->slot[i].pid)
            t->slot[i].pid = pid;
        t->slot[i].used = ++t->clock;
        return 0;
    }
    int rc = make_room(t);
    if (rc != 0)
        return rc;
    place(t, (srv_pushid_ent){.cid = cid, .pid = pid, .used = ++t->clock});
    return 0;
}

int srv_pushid_done(const psd *s, uint64_t cid, uint64_t pid)
{
    const srv_pushids *t = &s->pushids;
    uint32_t i = find(t, cid);
    if (i != UINT32_MAX && pid != 0 && pid <= t->slot[i].pid)
        return 1;
    for (uint32_t j = 0; j < t->nround && pid != 0; j++)
        if (t->round[j].cid == cid && pid <= t->round[j].pid)
            return 2;
    return 0;
}

void srv_pushid_mark_round(psd *s, uint64_t cid, uint64_t pid)
{
    srv_pushids *t = &s->pushids;
    if (cid == 0 || pid == 0)
        return;
    if (t->nround == t->round_cap) {
        uint32_t cap = t->round_cap ? t->round_cap * 2 : 16;
        srv_pushid_ent *r = realloc(t->round, cap * sizeof *r);
        if (!r) {
            PS_LOG(PS_LOG_WARN, "push ids: out of memory keeping client %016llx's push %llu with its round: "
                                "recorded now", (unsigned long long)cid, (unsigned long long)pid);
            srv_pushid_mark(s, cid, pid);
            return;
        }
        t->round = r;
        t->round_cap = cap;
    }
    t->round[t->nround++] = (srv_pushid_ent){.cid = cid, .pid = pid};
}

void srv_pushid_round_closed(psd *s)
{
    srv_pushids *t = &s->pushids;
    /* the round's values go into the log first (a round closes on the
     * loop, no update running): a follower that holds an id holds the
     * round it counts in (PROTOCOL.md 17) */
    srv_replog_flush(s);
    for (uint32_t j = 0; j < t->nround; j++) {
        uint64_t cid = t->round[j].cid, pid = t->round[j].pid;
        if (record(t, cid, pid, 0) != 0)
            PS_LOG(PS_LOG_WARN, "push ids: out of memory recording client %016llx's push %llu: were it sent again "
                                "it would be applied again", (unsigned long long)cid, (unsigned long long)pid);
        else
            srv_replog_pushid(s, cid, pid);
    }
    t->nround = 0;
}

void srv_pushid_round_drop(psd *s)
{
    s->pushids.nround = 0;
}

void srv_pushid_mark(psd *s, uint64_t cid, uint64_t pid)
{
    if (cid == 0 || pid == 0)
        return;
    if (record(&s->pushids, cid, pid, 0) != 0)
        PS_LOG(PS_LOG_WARN, "push ids: out of memory recording client %016llx's push %llu: were it sent again it "
                            "would be applied again", (unsigned long long)cid, (unsigned long long)pid);
    else
        srv_replog_pushid(s, cid, pid); /* the followers know it too (PROTOCOL.md 17) */
}

int srv_pushid_set(psd *s, uint64_t cid, uint64_t pid)
{
    if (cid == 0 || pid == 0)
        return PS_EINVAL;
    return record(&s->pushids, cid, pid, 1);
}

int srv_pushid_next(const psd *s, uint32_t *it, uint64_t *cid, uint64_t *pid)
{
    const srv_pushids *t = &s->pushids;
    for (; *it < t->cap; (*it)++)
        if (t->slot[*it].cid) {
            *cid = t->slot[*it].cid;
            *pid = t->slot[*it].pid;
            (*it)++;
            return 1;
        }
    return 0;
}

uint32_t srv_pushid_count(const psd *s)
{
    return s->pushids.n;
}

void srv_pushid_free(psd *s)
{
    free(s->pushids.slot);
    free(s->pushids.round);
    s->pushids = (srv_pushids){0};
}
