/* join.c - whom a bsp round or the ssp clocks wait for (join.h): the
 * shards that have not joined, and for a waiting worker's heartbeat the
 * whole answer (those, and the shards that have not pushed or are behind).
 * It only reads; the session layer acts on it at join_timeout
 * (srv_join_tick in hello.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/policy/join.h"
#include "server/policy/policy.h"

uint32_t srv_join_present(const psd *s)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        n += s->workers[i] && s->workers[i]->state == SRV_W_CONNECTED;
    return n;
}

uint32_t srv_join_missing(const psd *s, uint32_t *out, uint32_t max)
{
    if (s->cfg.mode != PS_MODE_BSP && s->cfg.mode != PS_MODE_SSP)
        return 0;
    if (srv_join_present(s) == 0)
        return 0;
    uint32_t n = 0, m = (uint32_t)s->cfg.workers;
    for (uint32_t i = 0; i < m; i++) {
        if (i < s->nworkers_cap && s->workers[i])
            continue;
        if (n < max)
            out[n] = i;
        n++;
    }
    return n;
}

/* Appends "shard 2/3" or "shards 1/4, 2/4" (and "and N more" past 8) for
 * the n shards of which ids holds the first min(n, 8), at buf[*used]. */
static void list_shards(const psd *s, const uint32_t *ids, uint32_t n, char *buf, size_t len, size_t *used)
{
    if (*used < len)
        *used += (size_t)snprintf(buf + *used, len - *used, "%s", n == 1 ? "shard " : "shards ");
    for (uint32_t i = 0; i < n && i < 8 && *used < len; i++)
        *used += (size_t)snprintf(buf + *used, len - *used, "%s%u/%d", i ? ", " : "", ids[i], s->cfg.workers);
    if (n > 8 && *used < len)
        *used += (size_t)snprintf(buf + *used, len - *used, " and %u more", n - 8);
}

void srv_join_describe(const psd *s, char *buf, size_t len)
{
    uint32_t miss[8];
    uint32_t n = srv_join_missing(s, miss, 8);
    size_t used = 0;
    if (len)
        buf[0] = '\0';
    list_shards(s, miss, n, buf, len, &used);
}

/* SSP: the connected shards more than `staleness` clocks behind w. */
static uint32_t ssp_behind(const psd *s, const srv_worker *w, uint32_t *out, uint32_t max)
{
    uint64_t st = (uint64_t)s->cfg.staleness;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        const srv_worker *o = s->workers[i];
        if (!o || o == w || o->state != SRV_W_CONNECTED || o->clock + st >= w->clock)
            continue;
        if (n < max)
            out[n] = i;
        n++;
    }
    return n;
}

int srv_wait_describe(psd *s, const srv_worker *w, char *buf, size_t len)
{
    if (!len)
        return 0;
    buf[0] = '\0';
    if (s->paused) {
        snprintf(buf, len, "psd is paused (psctl resume)");
        return 1;
    }
    if (!s->model.initialized) {
        snprintf(buf, len, "the initial values (the first worker sends them)");
        return 1;
    }
    int bsp = s->cfg.mode == PS_MODE_BSP, ssp = s->cfg.mode == PS_MODE_SSP;
    if (!w || (!bsp && !ssp))
        return 0;
    uint32_t miss[8], late[8];
    uint32_t nmiss = srv_join_missing(s, miss, 8), nlate = 0;
    if (bsp && s->policy && s->policy->unpushed)
        nlate = s->policy->unpushed(s, late, 8);
    else if (ssp)
        nlate = ssp_behind(s, w, late, 8);
    size_t used = 0;
    if (bsp)
        used = (size_t)snprintf(buf, len, "round %llu waits for ", (unsigned long long)s->model.version);
    else
        used = (size_t)snprintf(buf, len, "clock %llu waits for ", (unsigned long long)w->clock);
    if (nmiss) {
        list_shards(s, miss, nmiss, buf, len, &used);
        if (used < len)
            used += (size_t)snprintf(buf + used, len - used, " (never joined)");
    }
    if (nlate) {
        if (nmiss && used < len)
            used += (size_t)snprintf(buf + used, len - used, " and ");
        list_shards(s, late, nlate, buf, len, &used);
        if (used < len) {
            if (bsp)
                snprintf(buf + used, len - used, " (%s not pushed)", nlate == 1 ? "has" : "have");
            else
                snprintf(buf + used, len - used, " (more than %d clock%s behind)", s->cfg.staleness,
                         s->cfg.staleness == 1 ? "" : "s");
        }
    }
    if (!nmiss && !nlate)
        snprintf(buf, len, bsp ? "round %llu to close" : "the slowest worker (clock %llu)",
                 (unsigned long long)(bsp ? s->model.version : w->clock));
    return 1;
}

uint64_t srv_join_waited(const psd *s, uint64_t now)
{
    return s->join_since_ms && now > s->join_since_ms ? now - s->join_since_ms : 0;
}
