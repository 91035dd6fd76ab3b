/* asgd.c - the asgd policy: each push applied as it arrives (apply.c),
 * optionally scaled by staleness or delay-compensated (DC-ASGD: the
 * parameters each worker last pulled are kept as its base). */
#include <stdlib.h>
#include <string.h>

#include "server/policy/apply.h"
#include "server/policy/policy.h"

static int asgd_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    return srv_apply_now(s, w, p, 1, err, errlen);
}

static int asgd_left(psd *s, srv_worker *w)
{
    srv_asgd_drop_base(s, w);
    return 0;
}

static int noop_member(psd *s, srv_worker *w)
{
    return 0;
}

/* DC-ASGD: what this worker computes its next gradient against. */
static void asgd_pulled(psd *s, srv_worker *w, uint64_t ver)
{
    if (!(s->cfg.dc_lambda > 0))
        return;
    srv_snap *old = srv_asgd_base(s, w);
    if (old && old->version == ver)
        return;
    srv_asgd_state *a = srv_asgd_get(s);
    if (!a)
        return;
    if (w->shard >= a->nbase) {
        uint32_t cap = a->nbase ? a->nbase : 8;
        while (cap <= w->shard)
            cap *= 2;
        srv_snap **b = realloc(a->base, cap * sizeof *b);
        if (!b)
            return;
        memset(b + a->nbase, 0, (cap - a->nbase) * sizeof *b);
        a->base = b;
        a->nbase = cap;
    }
    srv_snap *snap = srv_snap_take(&s->model);
    if (snap) {
        srv_snap_unref(a->base[w->shard]);
        a->base[w->shard] = snap;
    }
}

/* DC-ASGD off: the parameters each worker last pulled are no longer
 * needed, and would otherwise pin old snapshots. */
static void asgd_reconfigured(psd *s)
{
    srv_asgd_state *a = s->policy_state;
    if (!a || s->cfg.dc_lambda > 0)
        return;
    for (uint32_t i = 0; i < a->nbase; i++) {
        srv_snap_unref(a->base[i]);
        a->base[i] = NULL;
    }
}

static int asgd_check(const ps_config *c, char *err, size_t errlen)
{
    return srv_apply_check(c, 0, err, errlen);
}

static void asgd_destroy(psd *s)
{
    srv_asgd_state *a = s->policy_state;
    if (!a)
        return;
    for (uint32_t i = 0; i < a->nbase; i++)
        srv_snap_unref(a->base[i]);
    free(a->base);
    free(a->scratch);
    free(a);
    s->policy_state = NULL;
}

const srv_policy_ops srv_policy_asgd = {
    .name = "asgd",
    .push = asgd_push,
    .applied = srv_step_applied,
    .worker_left = asgd_left,
    .worker_joined = noop_member,
    .pull_ready = NULL,
    .pulled = asgd_pulled,
    .reconfigured = asgd_reconfigured,
    .destroy = asgd_destroy,
    .tpush = srv_apply_table,
    .tpush_checks = srv_apply_table_checks,
    .check = asgd_check,
};
