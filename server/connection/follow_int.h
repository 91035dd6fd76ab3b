/* follow_int.h - what the two halves of a follower's replication share
 * (follow.c on the loop, follow_thread.c on the thread that talks to the
 * leader), for those two files alone: the items the thread hands the loop,
 * and the thread's state. */
#ifndef SRV_FOLLOW_INT_H
#define SRV_FOLLOW_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "server/connection/follow.h"

#define SPARES 3 /* answers' buffers kept for reuse */

typedef struct item {
    struct item *next;
    int kind;            /* 'S' a snapshot in fd, 'R' a fetch's answer, 'E' a refusal */
    int fd;
    uint64_t pos, end;   /* the position it starts at; the leader's end */
    uint8_t *mem;        /* the frame the answer came in (the connection's
                          * receive buffer, swapped for a spare one), or the
                          * refusal's text */
    size_t cap;
    const uint8_t *b;    /* the answer's bytes in mem */
    size_t len;
} item;

struct srv_follow_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int stop;
    int fd;              /* the connection's socket, shut down to stop a wait */
    uv_async_t async;
    item *spare;         /* answers the loop applied, for the next fetches (a list) */
    int nspare;
    int queued;          /* answers posted, not yet applied */
    size_t queued_bytes; /* their bytes */
    int loading;         /* a snapshot posted, not yet loaded */
    uint64_t resume_from, resume_hist; /* where the last session ended, in which log (0: none) */
    psd *s;
    ps_token token;
    char leader[sizeof ((ps_config *)0)->replica_of];
    char advertise[sizeof ((ps_config *)0)->advertise];
    char mode[16];       /* this psd's mode: its leader's must be the same */
    _Atomic uint64_t fp;  /* the fingerprint of the model this psd holds (0: none), for the leader to check */
    _Atomic uint64_t contact_ms; /* srv_now_ms() of the leader's last answer (coord/: a live leader) */
};

/* The thread's body (follow_thread.c): sessions with the leader (a
 * snapshot, then fetches), each answer posted to the loop, until told to
 * stop. */
void *srv_follow_thread_main(void *arg);

#endif
