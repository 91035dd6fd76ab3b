/* plan.h - the job's plan (plan.c): a BSP round's workers and samples. */
#ifndef SRV_STORE_PLAN_H
#define SRV_STORE_PLAN_H

#include "server/store/psd.h"

/* Fixes the plan p (checked by the decoder): rounds per epoch and in all.
 * The caller makes sure it is not set yet. */
void srv_plan_fix(srv_plan *pl, const ps_plan *p);
/* Forgets the plan (the model it was for is released; at exit). */
void srv_plan_clear(srv_plan *pl);
/* Fixes the plan p read from a checkpoint, with the nout shards in out
 * that were out of its job then (copied into pl->out). Returns 0, or -1
 * out of memory (the plan is fixed, the list empty). */
int srv_plan_restore(srv_plan *pl, const ps_plan *p, const uint32_t *out, uint32_t nout);
/* Whether the plan rules the rounds (srv_plan_active, srv_plan_done) is the
 * policy's to say (policy.h): its ops table says whether the mode has a plan. */
/* 1 the first time it is asked (the end of the plan is then logged once),
 * 0 after. */
int srv_plan_say_done(srv_plan *pl);
/* Fixes the current round's members (below) now if they are not: the BSP
 * policy calls it as a round closes. 0, or -1 when out of memory. */
int srv_plan_open(psd *s);
/* The shards that train the current round (version v): fixed the first
 * time the round is asked about (psd's policy asks as the round before
 * closes) as shards 0..M-1 less those that joined and then left or were
 * lost and those rejoining at a later round (srv_plan_rejoin_at). Fixed
 * anew only when none of them is still in the job (all gone or not
 * joined), so a worker that joins mid-round trains from the next round on
 * and nobody's share of a round changes after it was handed out.
 * Returns 1 when shard w is one of them and not rejoining later (also
 * when memory ran out: then nobody is left out), else 0. */
int srv_plan_member(psd *s, const srv_worker *w);
/* Worker w is in the current round's job: connected, and not rejoining
 * at a later round (srv_plan_rejoin_at). */
int srv_plan_in(const psd *s, const srv_worker *w);
/* The first round connected worker w trains (its WELCOME's base): the
 * current one when it is among its workers and has not completed its push
 * (pushed: it has), or when the round's workers are not fixed yet (they
 * will be with w among them); else the next, or the round it said it
 * rejoins at. */
uint64_t srv_plan_first(psd *s, const srv_worker *w, int pushed);
/* Worker w says it rejoins at round `round` (a HEARTBEAT's base,
 * PROTOCOL.md 8, "The plan"): the rounds before it go without w, the
 * current one too when it is before (w's share of it is not trained, as
 * for a worker lost in it). Returns 1 when that changed w's rounds (then
 * the caller lets the policy close the current round without w), 0 when
 * the round is not after the current one or w's rejoin round. */
int srv_plan_rejoin_at(psd *s, srv_worker *w, uint64_t round);
/* Pushes that close the current round of an active plan: its members that
 * are still in the job (connected, or not joined yet). */
uint32_t srv_plan_needed(psd *s);
/* Worker w's samples of round ver, the current one, in *out (the caller
 * asked whether the plan rules the rounds, srv_plan_active): 1 when it
 * trains that round (a member, the plan not done), else 0. */
int srv_plan_slice(psd *s, const srv_worker *w, uint64_t ver, ps_slice *out);

#endif
