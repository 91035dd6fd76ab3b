/* async.c - libpsclient: the asynchronous step (psc_pushpull_start,
 * psc_wait, psc_poll): a PUSHPULL run on the library's step thread while
 * the caller computes. */
#define _GNU_SOURCE
#include "internal.h"

static void *async_main(void *arg)
{
    psc_client *c = arg;
    pthread_mutex_lock(&c->async_mu);
    for (;;) {
        while (!c->async_pending && !c->async_stop)
            pthread_cond_wait(&c->async_cv, &c->async_mu);
        if (c->async_stop)
            break;
        pthread_mutex_unlock(&c->async_mu);
        int rc = psc__run(c, OP_PUSHPULL, 0, c->layout.total);
        pthread_mutex_lock(&c->async_mu);
        c->async_rc = rc;
        c->async_pending = 0;
        pthread_cond_broadcast(&c->async_cv);
    }
    pthread_mutex_unlock(&c->async_mu);
    return NULL;
}

int psc_pushpull_start(psc_client *c)
{
    int rc = psc__ready(c, "psc_pushpull_start");
    if (rc != 0)
        return rc;
    if (!c->async_running) {
        if (psc__start_thread(&c->async_thread, async_main, c) != 0)
            return psc__fail(c, PSC_ENOMEM, "cannot start the library's step thread");
        c->async_running = 1;
    }
    pthread_mutex_lock(&c->async_mu);
    c->async_rc = 0;
    c->async_pending = 1;
    pthread_cond_broadcast(&c->async_cv);
    pthread_mutex_unlock(&c->async_mu);
    return 0;
}

int psc_wait(psc_client *c)
{
    if (!c->async_running)
        return 0;
    pthread_mutex_lock(&c->async_mu);
    while (c->async_pending)
        pthread_cond_wait(&c->async_cv, &c->async_mu);
    int rc = c->async_rc;
    c->async_rc = 0;
    pthread_mutex_unlock(&c->async_mu);
    return rc;
}

int psc_poll(psc_client *c)
{
    return !psc__busy(c);
}

void psc__async_stop(psc_client *c)
{
    if (!c->async_running)
        return;
    psc_wait(c); /* the step in flight first */
    psc__thread_stop(c->async_thread, &c->async_mu, &c->async_cv, &c->async_stop, &c->async_running);
}
