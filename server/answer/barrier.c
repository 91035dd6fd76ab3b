/* barrier.c - BARRIER: a worker of a BSP job waits there until every
 * worker that uses barriers has reached the same model version.
 *
 * Over a model split between several psd, a worker starts its next round
 * as soon as the last of its parts answers. The workers then start their
 * rounds apart, and the early ones' pushes share the links with the
 * replies the late ones still wait for, which keeps the late ones late
 * (bench/README.md, multihost.py). libpsclient sends a BARRIER to the psd
 * of part 0 after each whole-model step of such a job, so every worker
 * starts the next round when the last one has its replies.
 *
 * A connection takes part from its first BARRIER on (clients that never
 * send one are never waited for), and stops when it goes away, its worker
 * leaves, or it sends one for version 0 (a worker whose parts are out of
 * step, which must not be waited for). Where a connection stands is its
 * latest BARRIER's version, lower or higher than the one before. A parked
 * BARRIER for version v is answered once every worker taking part, but for
 * backup_workers of them, stands at v or later. A version above the
 * model's plus one is refused: no reply of psd can have told a worker of
 * it (a BSP round closing piece by piece answers pulls at r + 1 while the
 * model is at r). In ASGD and SSP there are no rounds to line up: the OK
 * comes at once. */
#include <stdio.h>

#include "server/answer/barrier.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/policy/policy.h"

/* The highest version a parked barrier may have to go: the (b+1)-th
 * lowest version among the workers taking part, b = backup_workers (a
 * barrier for v goes when at most b of them are below v, as a BSP round
 * does not wait for the slowest b either); UINT64_MAX when fewer take
 * part. One pass per distinct version, at most b+1 passes. */
static uint64_t threshold(const psd *s)
{
    uint64_t below = 0; /* versions up to it are counted */
    uint32_t counted = 0, k = (uint32_t)s->cfg.backup_workers + 1;
    while (counted < k) {
        uint64_t low = UINT64_MAX;
        uint32_t n = 0;
        for (const srv_conn *c = s->conns; c; c = c->next) {
            uint64_t v = c->worker && !c->closing ? c->barrier_ver : 0;
            if (v <= below)
                continue; /* not taking part (0), or counted */
            if (v < low)
                low = v, n = 0;
            n += v == low;
        }
        if (!n)
            return UINT64_MAX;
        counted += n;
        below = low;
    }
    return below;
}

static void answer(srv_conn *c, uint64_t id)
{
    SRV_COUNT(c->srv, barriers, 1);
    srv_send_ok(c, id);
}

int srv_barrier(srv_conn *c, uint64_t id, uint64_t ver, char *err, size_t errlen)
{
    psd *s = c->srv;
    if (c->barrier_parked) {
        snprintf(err, errlen, "a barrier (id %llu) already waits on this connection",
                 (unsigned long long)c->barrier_id);
        return PS_ESTATE;
    }
    if (ver > s->model.version && ver - s->model.version > 1) {
        snprintf(err, errlen, "barrier for version %llu, but psd's model is at version %llu: a worker cannot have "
                 "a version above %llu (the version of a PARAMS psd sent, at most the model's plus one); "
                 "send the version of the last PARAMS, or 0 to withdraw",
                 (unsigned long long)ver, (unsigned long long)s->model.version,
                 (unsigned long long)s->model.version + 1);
        return PS_EBAD_FIELD;
    }
    if (ver == 0) {
        /* "do not wait for me": its parts are out of step (PROTOCOL.md) */
        c->barrier_ver = 0;
        answer(c, id);
        srv_barrier_release(s);
        return 0;
    }
    if (!s->policy->barriers) {
        answer(c, id);
        return 0;
    }
    c->barrier_ver = ver; /* its latest, not the highest it ever sent */
    c->barrier_id = id;
    c->barrier_parked = 1;
    srv_barrier_release(s);
    return 0;
}

int srv_barrier_describe(const srv_conn *c, char *out, size_t len)
{
    if (!c->barrier_parked)
        return 0;
    size_t n = (size_t)snprintf(out, len, "barrier at version %llu waits for",
                                (unsigned long long)c->barrier_ver);
    int named = 0;
    for (const srv_conn *o = c->srv->conns; o && n < len; o = o->next) {
        if (!o->worker || o->closing || !o->barrier_ver || o->barrier_ver >= c->barrier_ver)
            continue;
        if (named == 3) {
            n += (size_t)snprintf(out + n, len - n, ", ...");
            break;
        }
        n += (size_t)snprintf(out + n, len - n, "%s shard %u/%u (at version %llu)", named ? "," : "",
                              o->worker->shard, o->worker->nshards, (unsigned long long)o->barrier_ver);
        named++;
    }
    return named > 0;
}

void srv_barrier_release(psd *s)
{
    uint64_t t = threshold(s);
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->barrier_parked && !c->closing && c->barrier_ver <= t) {
            c->barrier_parked = 0;
            answer(c, c->barrier_id);
        }
}

void srv_barrier_leave(srv_conn *c)
{
    c->barrier_parked = 0;
    c->barrier_ver = 0;
    srv_barrier_release(c->srv);
}
