/* join.c - whom a bsp round or the ssp clocks wait for (join.h): the
 * shards that have not joined. It only reads; the session layer acts on
 * it at join_timeout (srv_join_tick in hello.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "join.h"

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

void srv_join_describe(const psd *s, char *buf, size_t len)
{
    uint32_t miss[8];
    uint32_t n = srv_join_missing(s, miss, 8);
    size_t used = (size_t)snprintf(buf, len, "%s", n == 1 ? "shard " : "shards ");
    for (uint32_t i = 0; i < n && i < 8 && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%u/%d", i ? ", " : "", miss[i], s->cfg.workers);
    if (n > 8 && used < len)
        snprintf(buf + used, len - used, " and %u more", n - 8);
}

uint64_t srv_join_waited(const psd *s, uint64_t now)
{
    return s->join_since_ms && now > s->join_since_ms ? now - s->join_since_ms : 0;
}
