/* threads.c - libpsclient: the library's threads: starting and stopping
 * one, the heartbeat thread of each link, and what psd said a step waits
 * for. The asynchronous step's thread is async.c's. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

/* ps_conn's on_wait: psd told, answering a heartbeat, what a parked
 * pull of ours waits for. Runs on the thread receiving the step's reply. */
void psc__on_wait(void *arg, const char *text, size_t len)
{
    psc_client *c = arg;
    pthread_mutex_lock(&c->wait_mu);
    if (len >= sizeof c->waiting)
        len = sizeof c->waiting - 1;
    memcpy(c->waiting, text, len);
    c->waiting[len] = '\0';
    /* a peer's text is for people: no control characters on a terminal */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)c->waiting[i] < 0x20 || c->waiting[i] == 0x7f)
            c->waiting[i] = ' ';
    pthread_mutex_unlock(&c->wait_mu);
}

/* A step begins or ends: what psd said of the last one no longer holds. */
void psc__waiting_clear(psc_client *c)
{
    pthread_mutex_lock(&c->wait_mu);
    c->waiting[0] = '\0';
    pthread_mutex_unlock(&c->wait_mu);
}

size_t psc_waiting_for(psc_client *c, char *buf, size_t len)
{
    if (!c) {
        if (len)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&c->wait_mu);
    size_t n = strlen(c->waiting);
    if (len)
        snprintf(buf, len, "%s", c->waiting);
    pthread_mutex_unlock(&c->wait_mu);
    return n;
}

/* A library thread: it blocks every signal, so that a process-directed
 * one (SIGINT, SIGTERM) is handled by the caller's threads, whose waits
 * it can end (option interrupt). */
int psc__start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static void *hb_main(void *arg)
{
    psc_link *ln = arg;
    pthread_mutex_lock(&ln->lock);
    while (!ln->hb_stop) {
        struct timespec until = ps_deadline_ms(ln->hb_interval_ms);
        int rc = pthread_cond_timedwait(&ln->wake, &ln->lock, &until);
        if (ln->hb_stop)
            break;
        if (rc == ETIMEDOUT && ln->cl.fd >= 0) {
            ps_msg m;
            ps_msg_init(&m, PS_MSG_HEARTBEAT);
            /* psd answers this only while one of our pulls is parked,
             * telling what it waits for (on_wait) */
            m.has = PS_F_WAIT;
            m.wait = 1;
            /* the send lock is held (the condition wait returned with it), so
             * no other frame can be half written: send without taking it */
            ps_conn_send_noreply_held(&ln->cl, &m);
        }
    }
    pthread_mutex_unlock(&ln->lock);
    return NULL;
}

/* Stops a thread of the library that waits on cv under mu until *stop:
 * sets *stop, wakes the thread and joins it; *running and *stop are 0 after.
 * Nothing when *running is 0. */
void psc__thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop, int *running)
{
    if (!*running)
        return;
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(th, NULL);
    *running = 0;
    *stop = 0;
}

void psc__hb_stop(psc_link *ln)
{
    psc__thread_stop(ln->hb_thread, &ln->lock, &ln->wake, &ln->hb_stop, &ln->hb_running);
}

void psc__hb_start(psc_link *ln)
{
    if (ln->hb_running || ln->hb_interval_ms == 0)
        return;
    if (psc__start_thread(&ln->hb_thread, hb_main, ln) == 0)
        ln->hb_running = 1;
    else
        PS_LOG(PS_LOG_WARN, "cannot start the heartbeat thread; psd may declare this worker dead when it is idle");
}
