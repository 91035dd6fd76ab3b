/* base.c - libpsclient: what every other file of the library needs and
 * that calls none of them: the monotonic clock, a client's error and its
 * message, marking the client out of step after an interrupted wait,
 * which errors a reconnect may cure and the public code of a refusal, and
 * the push ids a call begins with. The files stand on each other one way
 * (test integration_deps), each calling only those before it here:
 * base.c; threads.c (heartbeats, what a step waits for), hogwild.c (psd's
 * model segment), chunks.c (chunked pushes and pulls on one link),
 * options.c, topk.c, pieces.c; layout.c (the layout, the links' memory and
 * segments); pmap.c (the job's part map); link.c (hello, opening,
 * reconnecting, psc__ready); step.c;
 * async.c, average.c, table.c; job.c; psclient.c (the client's life). */
#define _GNU_SOURCE
#include "internal.h"

int64_t psc__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *psc_errmsg(const psc_client *c)
{
    if (!c)
        return "out of memory";
    if (c->err[0] || !c->links)
        return c->err[0] ? c->err : "no error";
    return ps_conn_error(&c->links[c->err_link].cl);
}

__attribute__((format(printf, 3, 4)))
int psc__fail(psc_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}

/* Sets the link whose error is told to i and returns rc. */
int psc__lfail(psc_client *c, uint32_t i, int rc)
{
    c->err[0] = '\0';
    c->err_link = i;
    return psc__interrupted(c, rc);
}

/* The one place the client is marked out of step: rc an interrupted wait
 * (PS_CLIENT_EINTR from a link, PSC_EINTR from a call), after which a link
 * may be mid-frame or owe a reply the next call would take for its own, so
 * the next call opens every link anew (psc__ready). Returns rc. */
int psc__interrupted(psc_client *c, int rc)
{
    if (rc == PS_CLIENT_EINTR || rc == PSC_EINTR)
        c->desync = 1;
    return rc;
}

void psc__call_begins(psc_client *c)
{
    char b[64];
    if (c->interrupt && c->wakeup_fd >= 0)
        while (read(c->wakeup_fd, b, sizeof b) > 0) {
        }
}

/* rc means the connection is gone, psd is restarting or full, so trying
 * again may help; not errors that would repeat (a layout psd does not
 * hold, a bad shard or token, a protocol version). */
int psc__recoverable(const psc_client *c, int rc)
{
    const ps_conn *cl = &c->links[c->err_link].cl;
    switch (rc) {
    case PS_ECLOSED:
    case PS_EIO:
    case PS_ECONNECT:
    case PS_ETIMEOUT:
        return 1;
    case PS_EREMOTE:
        /* psd shutting down or full; our old connection not yet noticed
         * gone; the worker giving initial values left before finishing */
        /* a shard taken is our own old connection, not yet noticed gone,
         * only when reconnecting: at the first connect it is another
         * worker's, which retrying does not change */
        /* a follower: its leader, or another replica, will take us */
        return cl->remote_code == -PS_ESHUTDOWN || (cl->remote_code == -PS_ESHARD && c->connected) ||
               cl->remote_code == -PS_ENOT_LEADER ||
               cl->remote_code == -PS_ENOT_READY || cl->remote_code == -PS_ELIMIT;
    default:
        return 0;
    }
}

/* psd's own code for a refusal: PSC_EREMOTE becomes the code psd sent
 * when it is one the header lists. */
int psc__public_code(const psc_client *c, int rc)
{
    if (rc == PS_CLIENT_EINTR)
        return PSC_EINTR;
    if (rc != PS_EREMOTE || !c->links)
        return rc;
    int32_t code = c->links[c->err_link].cl.remote_code; /* positive, as on the wire */
    return code >= 1 && code <= 23 ? -code : rc;
}

void psc__pids_begin(psc_client *c, uint64_t most)
{
    most = most ? most : 1;
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        ln->pid_base = c->next_pid + i * most;
        ln->step_ver = ln->version;
        ln->reopened = 0;
    }
    c->next_pid += (uint64_t)c->nlinks * most;
}

