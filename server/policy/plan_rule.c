/* plan_rule.c - whether a job's plan rules the rounds: the mode's policy
 * says whether it has a plan (its ops table's `plan`); the plan itself, its
 * rounds, members and slices, is the store's (store/plan.c). */
#include "server/policy/policy.h"

int srv_plan_active(const psd *s)
{
    return s->plan.set && s->policy && s->policy->plan && s->model.initialized;
}

int srv_plan_done(const psd *s)
{
    return srv_plan_active(s) && s->model.version >= s->plan.rounds;
}
