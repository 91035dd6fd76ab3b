/* stop.c - SIGTERM and SIGINT in psworker: the handler records the signal,
 * the training (train.c, train_plan.c, report.c) looks at it between steps
 * and leaves psd through pw_stop. It calls nothing of the training. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "worker.h"

volatile sig_atomic_t pw_stop_signal;
static psc_client *stop_client;

/* The library's wait ends too, also one about to begin: a signal that
 * came just before it would not end it, and a BSP round that never closes
 * would hold the worker for ever (psc_interrupt) */
static void on_stop_signal(int sig)
{
    pw_stop_signal = sig;
    if (stop_client)
        psc_interrupt(stop_client);
}

void pw_stop_install(psc_client *pc)
{
    stop_client = pc;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* no SA_RESTART (the library retries its own EINTRs); SA_RESETHAND: a
     * second signal kills at once, for a person who does not want to wait */
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int pw_stop(psc_client *pc, int shard, int nshards, int epoch, size_t step)
{
    int sig = (int)pw_stop_signal;
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
    char why[64];
    snprintf(why, sizeof why, "stopped by %s", name);
    psc_leave(pc, why); /* waits for a pipelined step in flight */
    fprintf(stderr, "psworker %d/%d: %s at epoch %d step %zu: left psd; exiting with %d\n", shard, nshards, why,
            epoch, step, 128 + sig);
    return 128 + sig;
}
