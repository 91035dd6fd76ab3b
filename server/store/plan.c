/* plan.c - the job's plan (psd.plan): a BSP job of `epochs` passes over
 * `samples` samples, `batch` of them per round. From it and the model
 * version it derives the round's epoch and global batch, which shards
 * train the round (fixed once per round) and each one's part of the
 * batch; and when the job is done. It decides nothing about pushes: the
 * BSP policy asks it who must push, the pull replies what to tell each
 * worker (PROTOCOL.md 8, "The plan"). */
#include <stdlib.h>
#include <string.h>

#include "server/store/plan.h"
#include "common/log.h"
#include "server/store/psd.h"

void srv_plan_fix(srv_plan *pl, const ps_plan *p)
{
    srv_plan_clear(pl);
    pl->set = 1;
    pl->p = *p;
    pl->per_epoch = (p->samples + p->batch - 1) / p->batch;
    pl->rounds = p->epochs * pl->per_epoch; /* <= 2^20 * 2^40 */
}

int srv_plan_restore(srv_plan *pl, const ps_plan *p, const uint32_t *out, uint32_t nout)
{
    srv_plan_fix(pl, p);
    if (nout == 0)
        return 0;
    pl->out = malloc(nout * sizeof *pl->out);
    if (!pl->out)
        return -1;
    memcpy(pl->out, out, nout * sizeof *out);
    pl->nout = nout;
    return 0;
}

void srv_plan_clear(srv_plan *pl)
{
    free(pl->out);
    free(pl->members);
    memset(pl, 0, sizeof *pl);
    pl->round = UINT64_MAX;
}

int srv_plan_in(const psd *s, const srv_worker *w)
{
    return w->state == SRV_W_CONNECTED && w->plan_from <= s->model.version;
}

/* Shard i is in the job: connected and not rejoining at a later round, or
 * never joined (it is still to come, as BSP's first rounds wait for all M). */
static int in_job(const psd *s, uint32_t i)
{
    const srv_worker *w = i < s->nworkers_cap ? s->workers[i] : NULL;
    return !w || srv_plan_in(s, w);
}

static uint32_t members_in_job(const psd *s)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < s->plan.nmembers; k++)
        n += in_job(s, s->plan.members[k]);
    return n;
}

int srv_plan_say_done(srv_plan *pl)
{
    if (pl->said_done)
        return 0;
    pl->said_done = 1;
    return 1;
}

int srv_plan_open(psd *s)
{
    srv_plan *pl = &s->plan;
    uint64_t r = s->model.version;
    if (pl->round == r && members_in_job(s) > 0)
        return 0;
    uint32_t m = (uint32_t)s->cfg.workers;
    if (pl->cap < m) {
        uint32_t *p = realloc(pl->members, m * sizeof *p);
        if (!p)
            return -1;
        pl->members = p;
        pl->cap = m;
    }
    int again = pl->round == r;
    pl->nmembers = 0;
    for (uint32_t i = 0; i < m; i++)
        if (in_job(s, i))
            pl->members[pl->nmembers++] = i;
    pl->round = r;
    if (pl->nmembers != pl->last_nmembers || again) {
        if (r < pl->rounds)
            PS_LOG(PS_LOG_INFO, "plan: round %llu (epoch %llu) is trained by %u of %u workers, %llu samples each",
                   (unsigned long long)r, (unsigned long long)(r / pl->per_epoch), pl->nmembers, m,
                   (unsigned long long)(pl->nmembers ? pl->p.batch / pl->nmembers : 0));
        pl->last_nmembers = pl->nmembers;
    }
    return 0;
}

int srv_plan_member(psd *s, const srv_worker *w)
{
    if (w->plan_from > s->model.version)
        return 0;
    if (srv_plan_open(s) != 0)
        return 1;
    for (uint32_t k = 0; k < s->plan.nmembers; k++)
        if (s->plan.members[k] == w->shard)
            return 1;
    return 0;
}

uint64_t srv_plan_first(psd *s, const srv_worker *w, int pushed)
{
    uint64_t v = s->model.version;
    if (w->plan_from > v)
        return w->plan_from;
    if (s->plan.round != v)
        return v; /* not fixed yet: it will be with w among its workers */
    return !pushed && srv_plan_member(s, w) ? v : v + 1;
}

int srv_plan_rejoin_at(psd *s, srv_worker *w, uint64_t round)
{
    if (round <= s->model.version || round <= w->plan_from)
        return 0;
    w->plan_from = round;
    PS_LOG(PS_LOG_INFO, "plan: shard %u rejoins at round %llu (round %llu is open): the rounds before go without it",
           w->shard, (unsigned long long)round, (unsigned long long)s->model.version);
    return 1;
}

uint32_t srv_plan_needed(psd *s)
{
    if (srv_plan_open(s) != 0)
        return (uint32_t)s->cfg.workers;
    return members_in_job(s);
}

int srv_plan_slice(psd *s, const srv_worker *w, uint64_t ver, ps_slice *out)
{
    const srv_plan *pl = &s->plan;
    if (!pl->set || !s->model.initialized || ver != s->model.version || ver >= pl->rounds || srv_plan_open(s) != 0)
        return 0;
    uint32_t rank = 0;
    while (rank < pl->nmembers && pl->members[rank] != w->shard)
        rank++;
    if (rank == pl->nmembers)
        return 0;
    uint64_t i = ver % pl->per_epoch;
    uint64_t lo = i * pl->p.batch;
    uint64_t hi = lo + pl->p.batch < pl->p.samples ? lo + pl->p.batch : pl->p.samples;
    uint64_t len = hi - lo, count = pl->nmembers;
    /* len <= 2^40, rank < 2^16: no overflow */
    *out = (ps_slice){.epoch = ver / pl->per_epoch, .lo = lo + len * rank / count,
                      .hi = lo + len * (rank + 1) / count, .rank = rank, .count = (uint32_t)count};
    return 1;
}
