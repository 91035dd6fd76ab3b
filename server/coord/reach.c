/* reach.c - whether etcd answers (issue 44): each request's outcome, from
 * coord.c and jobkey.c, sets psd.coord.reachable (status, metrics) and
 * logs the change once: an ERROR when no member answers, saying what this
 * psd does meanwhile, and a WARN when one answers again. */
#include <stdio.h>

#include "common/log.h"
#include "server/coord/coord_int.h"
#include "server/record/stats.h"

void srv_coord_reached(srv_coord *k)
{
    psd *s = k->s;
    if (s->coord.unreachable_ms)
        PS_LOG(PS_LOG_WARN, "coordinator: etcd answers again (%s): failover is possible again",
               srv_etcd_member(k->etcd));
    s->coord.reachable = 1;
    s->coord.unreachable_ms = 0;
    k->said_unreachable = 0;
}

void srv_coord_unreached(srv_coord *k, const char *err)
{
    psd *s = k->s;
    s->coord.reachable = 0;
    s->coord.failures++;
    snprintf(s->coord.error, sizeof s->coord.error, "%s", err);
    if (!s->coord.unreachable_ms)
        s->coord.unreachable_ms = srv_now_ms();
    if (!k->said_unreachable) {
        k->said_unreachable = 1;
        PS_LOG(PS_LOG_ERROR, "coordinator: etcd does not answer (%s): this part cannot fail over until it does; %s", err,
               s->coord.role == SRV_COORD_LEADING
                   ? "this leader goes on, acknowledging pushes once its lease's fence passes only while every "
                     "follower holds them"
                   : s->coord.role == SRV_COORD_STARTING
                   ? "this psd acknowledges no push before it holds the part's lease, and asks again"
                   : "this follower goes on following");
    }
}
