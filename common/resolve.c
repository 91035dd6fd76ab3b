/* resolve.c - a host name resolved within a deadline (resolve.h). */
#define _GNU_SOURCE
#include "resolve.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "hostport.h"

/* A name being resolved on a thread of its own: getaddrinfo has no
 * deadline (a resolver that answers nothing holds it for its timeout times
 * its attempts times the search domains, tens of seconds), so the caller
 * waits on efd until its deadline and may leave the thread to finish
 * alone. Two owners, the caller and the thread; the last to let go frees
 * it. */
typedef struct {
    atomic_int refs;
    int efd; /* an eventfd the thread writes to when done */
    int gai;
    struct addrinfo hints, *res;
    char name[PS_HOSTPORT_HOST_MAX], port[16];
} resolving;

static void resolving_drop(resolving *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    close(r->efd);
    if (r->res)
        freeaddrinfo(r->res);
    free(r);
}

static void *resolve_thread(void *arg)
{
    resolving *r = arg;
    r->gai = getaddrinfo(r->name, r->port, &r->hints, &r->res);
    eventfd_write(r->efd, 1);
    resolving_drop(r);
    return NULL;
}

/* getaddrinfo(name, port, hints), given up at deadline (-1: none) with
 * EAI_AGAIN and *timed_out set. A numeric address needs no resolver and is
 * answered at once. */
int ps_resolve_by(const char *name, const char *port, const struct addrinfo *hints, struct addrinfo **res,
                      int64_t deadline, int *timed_out)
{
    struct addrinfo h = *hints;
    *timed_out = 0;
    h.ai_flags |= AI_NUMERICHOST;
    int gai = getaddrinfo(name, port, &h, res);
    if (gai != EAI_NONAME || (hints->ai_flags & AI_NUMERICHOST))
        return gai;
    resolving *r = calloc(1, sizeof *r);
    if (!r)
        return EAI_MEMORY;
    r->efd = eventfd(0, EFD_CLOEXEC);
    if (r->efd < 0) {
        free(r);
        return EAI_SYSTEM;
    }
    r->hints = *hints;
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->port, sizeof r->port, "%s", port);
    atomic_init(&r->refs, 2);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &attr, resolve_thread, r);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        close(r->efd);
        free(r);
        return getaddrinfo(name, port, hints, res); /* no thread: no deadline either */
    }
    for (;;) {
        int tmo = -1;
        if (deadline >= 0) {
            int64_t left = deadline - ps_mono_ms();
            tmo = left <= 0 ? 0 : left > 60000 ? 60000 : (int)left;
        }
        struct pollfd p = {.fd = r->efd, .events = POLLIN};
        int n = poll(&p, 1, tmo);
        if (n > 0) {
            gai = r->gai;
            *res = r->res;
            r->res = NULL;
            break;
        }
        if ((n == 0 && tmo == 0) || (n < 0 && errno != EINTR)) {
            *timed_out = 1;
            gai = EAI_AGAIN;
            break;
        }
    }
    resolving_drop(r);
    return gai;
}
