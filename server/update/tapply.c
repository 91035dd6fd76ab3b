/* tapply.c - the apply threads of table_apply = hogwild (see tapply.h).
 *
 * Owns the pool (psd.tapply): its threads, the queue of jobs waiting, the
 * list of jobs done and not handed back, and the spare jobs kept for
 * reuse. One mutex guards the two lists and the count of jobs queued or
 * running; the rows themselves are stepped without it. */
#include "server/update/tapply.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/errors.h"
#include "server/tables/sparse_optim.h"

#define THREADS_DEFAULT_MAX 8

typedef struct tjob {
    struct tjob *next;
    ps_table_def def;       /* the table's declaration, copied */
    uint32_t n;             /* keys */
    float **rows;           /* where each key's row lies (NULL: skipped by admission) */
    uint8_t *keys;          /* a copy of the push's keys */
    float *g;               /* a copy of its gradients, n x dim */
    uint8_t *pkeys;         /* a copy of a TPUSHPULL's pull keys */
    uint32_t npk;
    size_t cap_n, cap_k, cap_g, cap_pk; /* room in rows, keys, g (floats) and pkeys */
    srv_tapply_tag tag;
    srv_tapply_result res;
} tjob;

struct srv_tapply {
    uv_async_t async;       /* finished jobs: wakes the loop */
    pthread_t *th;
    int nth;
    pthread_mutex_t mu;
    pthread_cond_t work;    /* a job is queued, or stop */
    pthread_cond_t idle;    /* busy fell to 0 */
    tjob *q, *q_tail;       /* queued (mu) */
    tjob *done, *done_tail; /* finished, not handed back (mu) */
    uint32_t busy;          /* queued or running (mu) */
    int stop;               /* (mu) */
    uint32_t pending;       /* queued and not handed back: the loop's count */
    tjob *spare;            /* the loop's */
    srv_tapply_done_cb cb;
    void *arg;
};

int srv_tapply_threads(int setting)
{
    if (setting > 0)
        return setting;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > THREADS_DEFAULT_MAX ? THREADS_DEFAULT_MAX : (int)n;
}

/* One optimizer step per row, in place (srv_sparse_step writes a row only
 * when its new values are all finite: a row whose step is not is left as
 * it was). A row another thread steps meanwhile may lose one of the two
 * steps, or mix them value by value: Hogwild!. */
static void run(tjob *j)
{
    const uint32_t dim = j->def.dim;
    j->res = (srv_tapply_result){0};
    for (uint32_t k = 0; k < j->n; k++) {
        float *row = j->rows[k];
        if (!row)
            continue;
        if (srv_sparse_step(&j->def, row, j->g + (size_t)k * dim, 1.0))
            j->res.rows++;
        else if (j->res.refused++ == 0)
            j->res.bad_key = ps_key_at(j->keys, k);
    }
    if (j->res.refused)
        j->res.rc = PS_ENONFINITE;
}

static void *thread_main(void *arg)
{
    srv_tapply *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->q && !p->stop)
            pthread_cond_wait(&p->work, &p->mu);
        if (!p->q)
            break; /* stop, and nothing left */
        tjob *j = p->q;
        p->q = j->next;
        if (!p->q)
            p->q_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        run(j);
        pthread_mutex_lock(&p->mu);
        j->next = NULL;
        if (p->done_tail)
            p->done_tail->next = j;
        else
            p->done = j;
        p->done_tail = j;
        if (--p->busy == 0)
            pthread_cond_broadcast(&p->idle);
        uv_async_send(&p->async);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Hands the finished jobs back, in the order they finished (the loop). */
static void deliver(srv_tapply *p)
{
    pthread_mutex_lock(&p->mu);
    tjob *j = p->done;
    p->done = p->done_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (j) {
        tjob *next = j->next;
        j->res.pkeys = j->pkeys;
        j->res.npk = j->npk;
        p->pending--;
        p->cb(p->arg, &j->tag, &j->res);
        j->next = p->spare;
        p->spare = j;
        j = next;
    }
}

static void on_async(uv_async_t *h)
{
    deliver(h->data);
}

static void job_free(tjob *j)
{
    free(j->rows);
    free(j->keys);
    free(j->g);
    free(j->pkeys);
    free(j);
}

static void on_closed(uv_handle_t *h)
{
    srv_tapply *p = h->data;
    while (p->spare) {
        tjob *j = p->spare;
        p->spare = j->next;
        job_free(j);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->idle);
    free(p->th);
    free(p);
}

srv_tapply *srv_tapply_new(uv_loop_t *loop, int threads, srv_tapply_done_cb done, void *arg, char *err,
                           size_t errlen)
{
    if (threads < 1 || threads > PS_TABLE_THREADS_MAX) {
        snprintf(err, errlen, "table_threads: %d apply threads asked for, 1..%d allowed", threads,
                 PS_TABLE_THREADS_MAX);
        return NULL;
    }
    srv_tapply *p = calloc(1, sizeof *p);
    if (!p || !(p->th = calloc((size_t)threads, sizeof *p->th))) {
        free(p);
        snprintf(err, errlen, "table_apply = hogwild: out of memory for %d apply threads", threads);
        return NULL;
    }
    p->cb = done;
    p->arg = arg;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    int rc = uv_async_init(loop, &p->async, on_async);
    if (rc != 0) {
        snprintf(err, errlen, "table_apply = hogwild: %s", uv_strerror(rc));
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->idle);
        free(p->th);
        free(p);
        return NULL;
    }
    p->async.data = p;
    uv_unref((uv_handle_t *)&p->async); /* the pool alone keeps no loop running */
    for (; p->nth < threads; p->nth++) {
        rc = pthread_create(&p->th[p->nth], NULL, thread_main, p);
        if (rc != 0) {
            snprintf(err, errlen, "table_apply = hogwild: cannot start apply thread %d of %d: %s", p->nth + 1,
                     threads, strerror(rc));
            srv_tapply_free(p);
            return NULL;
        }
    }
    return p;
}

void srv_tapply_drain(srv_tapply *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    while (p->busy)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

uint32_t srv_tapply_pending(const srv_tapply *p)
{
    return p ? p->pending : 0;
}

static void quiesce(void *arg)
{
    srv_tapply_drain(arg);
}

/* Grows *buf to hold n items of size sz (keeps its contents). */
static int grow(void **buf, size_t *cap, size_t n, size_t sz)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    void *b = realloc(*buf, c * sz);
    if (!b)
        return -1;
    *buf = b;
    *cap = c;
    return 0;
}

int srv_tapply_push(srv_tapply *p, srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g,
                    const srv_tapply_tag *tag, const uint8_t *pkeys, uint32_t npk, char *err, size_t errlen)
{
    const ps_table_def *d = srv_tables_def(ts, i);
    tjob *j = p->spare;
    if (j)
        p->spare = j->next;
    else if (!(j = calloc(1, sizeof *j)))
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", d->name, n);
    size_t nv = (size_t)n * d->dim;
    if (grow((void **)&j->rows, &j->cap_n, n, sizeof *j->rows) != 0 ||
        grow((void **)&j->keys, &j->cap_k, n, 8) != 0 ||
        grow((void **)&j->g, &j->cap_g, nv, sizeof *j->g) != 0 ||
        grow((void **)&j->pkeys, &j->cap_pk, npk, 8) != 0) {
        j->next = p->spare;
        p->spare = j;
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", d->name, n);
    }
    int rc = srv_tables_pin(ts, i, keys, n, j->rows, quiesce, p, err, errlen);
    if (rc != 0) {
        j->next = p->spare;
        p->spare = j;
        return rc;
    }
    j->def = *d;
    j->n = n;
    j->npk = npk;
    if (n) {
        memcpy(j->keys, keys, (size_t)n * 8);
        memcpy(j->g, g, nv * sizeof *g);
    }
    if (npk)
        memcpy(j->pkeys, pkeys, (size_t)npk * 8);
    j->tag = *tag;
    j->next = NULL;
    p->pending++;
    pthread_mutex_lock(&p->mu);
    if (p->q_tail)
        p->q_tail->next = j;
    else
        p->q = j;
    p->q_tail = j;
    p->busy++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return 1;
}

void srv_tapply_free(srv_tapply *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int t = 0; t < p->nth; t++)
        pthread_join(p->th[t], NULL);
    deliver(p); /* every job has finished: each is handed back */
    uv_loop_t *loop = p->async.loop;
    uv_close((uv_handle_t *)&p->async, on_closed);
    uv_run(loop, UV_RUN_NOWAIT);
}
