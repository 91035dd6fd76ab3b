/* ssp.c - the ssp policy: pushes applied as they arrive (apply.c), a
 * worker's pull answered only while it is at most `staleness` clocks ahead
 * of the slowest live worker. Keeps no state of its own beyond the
 * workers' clocks. */
#include <stdint.h>

#include "server/policy/apply.h"
#include "server/policy/policy.h"

/* Smallest clock among the live workers; UINT64_MAX when there is none.
 * Shards below M that have not joined yet count as live at clock 0, so the
 * first worker to connect cannot run away before the others start (as BSP
 * rounds wait for all M); a worker that left or died no longer counts. */
static uint64_t ssp_min_clock(psd *s, const srv_worker *except)
{
    uint64_t min = UINT64_MAX;
    uint32_t m = (uint32_t)s->cfg.workers;
    for (uint32_t i = 0; i < s->nworkers_cap || i < m; i++) {
        srv_worker *w = i < s->nworkers_cap ? s->workers[i] : NULL;
        if (!w) {
            if (i < m)
                min = 0;
            continue;
        }
        if (w != except && w->state == SRV_W_CONNECTED && w->clock < min)
            min = w->clock;
    }
    return min;
}

static int ssp_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    return srv_apply_now(s, w, p, 0, err, errlen);
}

static int ssp_pull_ready(psd *s, const srv_worker *w, uint64_t min)
{
    if (!s->model.initialized || s->model.version < min)
        return 0;
    if (!w)
        return 1;
    uint64_t slowest = ssp_min_clock(s, NULL);
    return slowest == UINT64_MAX || w->clock <= slowest + (uint64_t)s->cfg.staleness;
}

static int ssp_joined(psd *s, srv_worker *w)
{
    /* A newcomer (or a worker back from the dead) starts level with the
     * slowest live worker, so it does not hold the others back; and the
     * others may have been waiting for it. */
    uint64_t slowest = ssp_min_clock(s, w);
    if (slowest != UINT64_MAX && w->clock < slowest)
        w->clock = slowest;
    return SRV_WAKE;
}

static int ssp_left(psd *s, srv_worker *w)
{
    /* the slowest may have gone: waiting pulls may now be answerable */
    return SRV_WAKE;
}

static int ssp_check(const ps_config *c, char *err, size_t errlen)
{
    return srv_apply_check(c, 1, err, errlen);
}

static void noop_destroy(psd *s)
{
}

const srv_policy_ops srv_policy_ssp = {
    .name = "ssp",
    .push = ssp_push,
    .applied = srv_step_applied,
    .worker_left = ssp_left,
    .worker_joined = ssp_joined,
    .pull_ready = ssp_pull_ready,
    .destroy = noop_destroy,
    .tpush = srv_apply_table,
    .tpush_checks = srv_apply_table_checks,
    .check = ssp_check,
};
