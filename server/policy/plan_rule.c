/* plan_rule.c - whether a job's plan rules the rounds: the mode's policy
 * says whether it has a plan (its ops table's `plan`); the plan itself, its
 * rounds, members and slices, is the store's (store/plan.c). And a
 * (re)joining worker's first round: the one its WELCOME names, and the
 * one it says it rejoins at (PROTOCOL.md 8, "The plan"). */
#include "server/policy/bsp.h"
#include "server/policy/policy.h"
#include "server/store/plan.h"

int srv_plan_active(const psd *s)
{
    return s->plan.set && s->policy && s->policy->plan && s->model.initialized;
}

int srv_plan_done(const psd *s)
{
    return srv_plan_active(s) && s->model.version >= s->plan.rounds;
}

/* Worker w's push of the current round is complete. */
static int pushed_now(const psd *s, const srv_worker *w)
{
    const srv_bsp_state *b = s->policy_state;
    const srv_bsp_shard *sh = b && w->shard < b->nsh ? b->sh[w->shard] : NULL;
    return sh && sh->round == s->model.version && sh->round_fin;
}

int srv_plan_first_round(psd *s, const srv_worker *w, uint64_t *round)
{
    if (!srv_plan_active(s) || srv_plan_done(s))
        return 0;
    *round = srv_plan_first(s, w, pushed_now(s, w));
    return 1;
}

int srv_plan_rejoin(psd *s, srv_worker *w, uint64_t round)
{
    if (!srv_plan_active(s) || srv_plan_done(s) || !srv_plan_rejoin_at(s, w, round))
        return 0;
    /* out of the current round: its unfinished push is dropped, and the
     * round may close without it, as when a worker leaves */
    return s->policy->worker_left(s, w);
}
