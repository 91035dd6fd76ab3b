/* mapkey.c - the job's part map in etcd (issue 45): /psd/JOB/map holds the
 * newest map a move's end made, "EPOCH DENSE ENTRY,ENTRY,..." (an entry
 * is a part's name in the map: an address, or its replicas "A/B"). Each
 * part's leader puts it once it serves under it; the parts of one map put
 * the same value, and a part never goes back to an older map, so the key
 * only moves forward. No lease: the map outlives its leaders. Workers
 * learn a map from the parts (WELCOME, MOVED: PROTOCOL.md 18), where the
 * switch happens key by key; the key is the job's map in one place, for
 * operators and tools (`etcdctl get /psd/JOB/map`), and psd's status says
 * which epoch it put (`coordinator.map_epoch`). */
#include "server/coord/mapkey.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "server/coord/etcd.h"

static void put_done(void *arg, int ok, json_t *a, const char *err, uint64_t sent_ms)
{
    (void)a;
    (void)sent_ms;
    srv_coord *k = arg;
    k->map_busy = 0;
    if (k->stopped)
        return;
    if (!ok) {
        srv_coord_unreached(k, err);
        return;
    }
    srv_coord_reached(k);
    k->s->coord.map_epoch = k->map_sending;
    PS_LOG(PS_LOG_INFO, "coordinator: the job's part map %" PRIu64 " is in etcd (/psd/%s/map)", k->map_sending,
           k->s->cfg.job);
}

void srv_coord_map_step(srv_coord *k)
{
    psd *s = k->s;
    const srv_parts *p = &s->parts;
    if (k->map_busy || p->moving || !p->epoch || p->self < 0 || p->epoch <= s->coord.map_epoch)
        return;
    static char val[PS_PARTS_MAX * (PS_ADDR_MAX + 1) + 64], v64[4 * sizeof val / 3 + 8], body[sizeof v64 + 1024];
    int at = snprintf(val, sizeof val, "%" PRIu64 " %u ", p->epoch, p->dense);
    for (uint32_t i = 0; i < p->n && at > 0 && (size_t)at < sizeof val; i++)
        at += snprintf(val + at, sizeof val - (size_t)at, "%s%s", i ? "," : "", p->addrs[i]);
    if (at <= 0 || (size_t)at >= sizeof val)
        return;
    char key[300], key64[420];
    snprintf(key, sizeof key, "/psd/%s/map", s->cfg.job);
    srv_b64_encode(key, strlen(key), key64);
    srv_b64_encode(val, (size_t)at, v64);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\"}", key64, v64);
    k->map_busy = 1;
    k->map_sending = p->epoch;
    if (srv_etcd_call(k->etcd, "/v3/kv/put", body, put_done, k) != 0) {
        k->map_busy = 0;
        PS_LOG(PS_LOG_ERROR, "coordinator: no memory for a request to etcd");
    }
}
