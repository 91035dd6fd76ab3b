/* move_fetch.c - a destination's side of a move of parts (PROTOCOL.md 18):
 * a thread for each source of its rows talks to that source (common/conn.c,
 * an admin hello as a follower's) and sends `move_fetch` until the source
 * has handed its rows over: first the pass, at most `rate` bytes a second,
 * then the rows changed since, and, once an answer of them is small (or
 * after MAX_ROUNDS), the final fetch, from which on the source refuses
 * those keys. It hands each answer to the loop, which applies it
 * (tables/table_move.c); the handover is the loop's last item from that
 * source, after which this psd owns the keys (store/parts.c). Owns
 * psd.parts.t, and writes what psd.parts says of the rows taken. */
#define _GNU_SOURCE
#include "server/connection/move_fetch.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/conn.h"
#include "common/hostport.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/dispatch/move_state.h"
#include "server/store/parts.h"

#define TIMEOUT_MS 30000
#define SMALL_BYTES ((size_t)1 << 20) /* rows changed since the pass: few enough to hand over */
#define MAX_ROUNDS 20                 /* rounds of changed rows before the handover anyway */
#define WAIT_READY_MS 20              /* a ready fetcher's pause between rounds while the others pass */

typedef struct item {
    struct item *next;
    int kind;          /* 'D' a session begins (what was taken from the source goes), 'R' rows,
                        * 'P' the pass is over, 'H' handed over, 'E' the source refused */
    uint32_t src;
    uint8_t *b;
    size_t len;
    uint64_t pause_ms; /* 'H': from the final fetch sent to its last answer */
} item;

typedef struct fetcher {
    pthread_t th;
    int started;
    int ready;         /* its pass is over and few of its rows change: it may hand over */
    int failed;        /* the loop could not apply an answer: stop before the handover (under mu) */
    uint64_t posted, applied; /* answers of rows handed to the loop, and applied there (under mu) */
    uint32_t src;
    /* where it is reached: the map's address (several, '/'-separated, for
     * a part given as its replicas), those its WELCOME's `replicas` named,
     * a NOT_LEADER's `leader`; at: the one tried now */
    char reps[PS_REPLICAS_MAX][PS_ADDR_MAX + 1];
    uint32_t nreps, at;
    struct srv_move_thread *all;
} fetcher;

struct srv_move_thread {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int stop;
    int fds[PS_PARTS_MAX]; /* each fetcher's socket, shut down to stop a wait */
    uv_async_t async;
    psd *s;
    ps_token token;
    char self[PS_ADDR_MAX + 1];
    uint64_t epoch, rate;
    fetcher f[PS_PARTS_MAX];
    int nf;
    int nready;        /* fetchers ready to hand over (under mu) */
};

static void post(struct srv_move_thread *t, item *it)
{
    pthread_mutex_lock(&t->mu);
    if (t->tail)
        t->tail->next = it;
    else
        t->head = it;
    t->tail = it;
    pthread_mutex_unlock(&t->mu);
    uv_async_send(&t->async);
}

static void post_kind(struct srv_move_thread *t, int kind, uint32_t src, const char *text, uint64_t pause_ms)
{
    item *it = calloc(1, sizeof *it);
    if (!it)
        return;
    it->kind = kind;
    it->src = src;
    it->pause_ms = pause_ms;
    if (text && (it->b = (uint8_t *)strdup(text)))
        it->len = strlen(text);
    post(t, it);
}

static int stopping(struct srv_move_thread *t)
{
    pthread_mutex_lock(&t->mu);
    int st = t->stop;
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Its session ends: told to stop, or an answer could not be applied. */
static int ends(fetcher *f)
{
    pthread_mutex_lock(&f->all->mu);
    int st = f->all->stop || f->failed;
    pthread_mutex_unlock(&f->all->mu);
    return st;
}

/* Waits ms unless told to stop. */
static void pause_ms(struct srv_move_thread *t, uint64_t ms)
{
    struct timespec ts = ps_deadline_ms(ms);
    pthread_mutex_lock(&t->mu);
    /* the condition is broadcast as answers are applied too: wait on */
    while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &ts) == 0) {
    }
    pthread_mutex_unlock(&t->mu);
}

/* Adds replica a (len bytes) to f's unless it is there or they are full;
 * its index, or -1. */
static int learn(fetcher *f, const char *a, size_t len)
{
    return ps_addr_list_add(f->reps, &f->nreps, PS_REPLICAS_MAX, a, len);
}

/* After a connection failed, or a follower refused (NOT_LEADER): the next
 * try goes to the leader it named, or to the source's next replica, so
 * that a source whose follower was promoted during the move is found. */
static void next_replica(fetcher *f, const ps_conn *c, int not_leader)
{
    int k = not_leader && c->remote_leader[0] ? learn(f, c->remote_leader, strlen(c->remote_leader)) : -1;
    uint32_t next = k >= 0 ? (uint32_t)k : (f->at + 1) % f->nreps;
    if (next != f->at)
        PS_LOG(PS_LOG_INFO, "move of parts: part %u at %s %s; trying %s", f->src, f->reps[f->at],
               not_leader ? "follows a leader" : "does not answer", f->reps[next]);
    f->at = next;
}

/* One session with the source: 1 when it handed its rows over or refused
 * (the fetcher ends), 0 to try again. */
static int session(fetcher *f, ps_conn *c)
{
    struct srv_move_thread *t = f->all;
    ps_msg m, r;
    /* every session starts the pass over: a source that restarted knows
     * nothing of what it gave, and the loop forgets what it took from it */
    int fresh = 1, finalv = 0, *final = &finalv;
    const char *addr = f->reps[f->at];
    int rc = ps_conn_connect(c, addr, TIMEOUT_MS);
    if (rc == 0) {
        ps_msg_init(&m, PS_MSG_HELLO);
        m.has = PS_F_VERSION | PS_F_ROLE;
        m.proto = PS_PROTO_VERSION;
        m.role = PS_ROLE_ADMIN;
        rc = ps_conn_hello(c, &m, t->token.len ? t->token.b : NULL, t->token.len, &r, TIMEOUT_MS);
    }
    if (rc != 0) {
        PS_LOG(PS_LOG_WARN, "move of parts: cannot reach part %u at %s: %s; trying again", f->src, addr,
               ps_conn_error(c));
        next_replica(f, c, rc == PS_EREMOTE && c->remote_code == -PS_ENOT_LEADER);
        return 0;
    }
    for (uint32_t k = 0; k < r.nreplicas; k++)
        learn(f, r.replicas[k].p, r.replicas[k].len);
    pthread_mutex_lock(&t->mu);
    t->fds[f->src] = c->fd;
    pthread_mutex_unlock(&t->mu);
    char ep[24], fin[16], st[4], most[24];
    /* answers of a tenth of a second's bytes at the rate, so that it paces
     * the pass evenly (64 KiB to 4 MiB) */
    uint64_t m10 = t->rate ? t->rate / 10 : (4u << 20);
    snprintf(most, sizeof most, "%" PRIu64, m10 < (64u << 10) ? (64u << 10) : m10 > (4u << 20) ? (4u << 20) : m10);
    snprintf(ep, sizeof ep, "%" PRIu64, t->epoch);
    uint64_t t0 = (uint64_t)ps_mono_ms(), sent = 0, final_ms = 0;
    int rounds = 0;
    while (!ends(f)) {
        snprintf(fin, sizeof fin, "%d", *final);
        snprintf(st, sizeof st, "%d", fresh);
        const char *a[] = {t->self, ep, fin, st, most};
        rc = ps_conn_admin(c, "move_fetch", a, 5, &r, TIMEOUT_MS);
        /* the handover's length: from its first answer (the source refuses
         * those keys from just before it; a source with several
         * destinations holds the final fetch until all have asked, while
         * it still serves them) to its last */
        if (*final && !final_ms)
            final_ms = (uint64_t)ps_mono_ms();
        if (rc == 0 && fresh) {
            fresh = 0;
            post_kind(t, 'D', f->src, NULL, 0); /* before this answer's rows */
        }
        if (rc == PS_EREMOTE && c->remote_code == -PS_ENOT_LEADER) {
            next_replica(f, c, 1); /* a follower (its leader was replaced, or it was not promoted yet) */
            return 0;
        }
        if (rc == PS_EREMOTE) {
            post_kind(t, 'E', f->src, ps_conn_error(c), 0);
            return 1;
        }
        if (rc != 0 || r.type != PS_MSG_PARAMS) {
            PS_LOG(PS_LOG_WARN, "move of parts: fetching from part %u at %s: %s; trying again", f->src, addr,
                   rc ? ps_conn_error(c) : "not a PARAMS");
            if (rc != 0)
                next_replica(f, c, 0);
            return 0;
        }
        item *it = calloc(1, sizeof *it);
        size_t len = (size_t)r.ndata * 4;
        if (!it || !(it->b = malloc(len ? len : 1))) {
            free(it);
            post_kind(t, 'E', f->src, "out of memory for the rows fetched", 0);
            return 1;
        }
        memcpy(it->b, r.data, len);
        it->len = len;
        it->kind = 'R';
        it->src = f->src;
        pthread_mutex_lock(&t->mu);
        f->posted++;
        pthread_mutex_unlock(&t->mu);
        post(t, it);
        uint64_t ver = r.mver;
        if (ver == 3) {
            post_kind(t, 'H', f->src, NULL, (uint64_t)ps_mono_ms() - final_ms);
            return 1;
        }
        if (ver == 1 && !*final) {
            if (++rounds == 1)
                post_kind(t, 'P', f->src, NULL, 0);
            /* few rows changed since: ready to hand them over. Every source
             * hands over at once, when all are ready: a worker that found
             * its keys moved sends this part keys of every source, and one
             * key of a source not handed over yet holds its whole request
             * (NOT_READY), so handovers one pass apart held steps for the
             * time between them (0.4 s growing 3 -> 4 parts of 10^7 rows) */
            int all = 0;
            if (len < SMALL_BYTES || rounds >= MAX_ROUNDS) {
                /* and once the loop applied what it fetched: a row it could
                 * not hold stops the fetching before the source hands over */
                pthread_mutex_lock(&t->mu);
                while (!t->stop && !f->failed && f->applied != f->posted)
                    pthread_cond_wait(&t->cv, &t->mu);
                if (!f->ready && !f->failed) {
                    f->ready = 1;
                    t->nready++;
                }
                all = t->nready >= t->nf && !f->failed && !t->stop;
                pthread_mutex_unlock(&t->mu);
            }
            if (all)
                *final = 1;
            else if (f->ready)
                pause_ms(t, WAIT_READY_MS); /* the others' passes: its changed rows meanwhile, now and then */
        }
        /* the rate: the pass and its rounds, not the handover */
        sent += len;
        if (!*final && t->rate) {
            uint64_t due = t0 + sent * 1000 / t->rate, now = (uint64_t)ps_mono_ms();
            if (due > now)
                pause_ms(t, due - now);
        }
    }
    return 1;
}

static void *fetcher_main(void *arg)
{
    fetcher *f = arg;
    struct srv_move_thread *t = f->all;
    ps_conn c;
    ps_conn_init(&c);
    uint64_t backoff = 100;
    while (!stopping(t)) {
        int done = session(f, &c);
        pthread_mutex_lock(&t->mu);
        t->fds[f->src] = -1;
        pthread_mutex_unlock(&t->mu);
        ps_conn_close(&c);
        if (done || ends(f))
            break;
        pause_ms(t, backoff);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    ps_conn_free(&c);
    return NULL;
}

/* ---- on the loop ------------------------------------------------------------- */

/* Tells src's fetcher an answer of its was applied (failed: could not be). */
static void applied(struct srv_move_thread *t, uint32_t src, int failed)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->nf; i++)
        if (t->f[i].src == src) {
            t->f[i].applied++;
            t->f[i].failed |= failed;
        }
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void apply_item(psd *s, item *it)
{
    srv_parts *p = &s->parts;
    if (!p->moving)
        return;
    int rc = srv_move_take(s, it->kind, it->src, it->b, it->len, it->pause_ms);
    if (it->kind == 'R')
        applied(p->t, it->src, rc != 0);
}

static void on_async(uv_async_t *a)
{
    psd *s = a->data;
    struct srv_move_thread *t = s->parts.t;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    item *it = t->head;
    t->head = t->tail = NULL;
    pthread_mutex_unlock(&t->mu);
    while (it) {
        item *next = it->next;
        apply_item(s, it);
        free(it->b);
        free(it);
        it = next;
    }
}

static void on_closed(uv_handle_t *h)
{
    struct srv_move_thread *t = h->data;
    for (item *it = t->head, *next; it; it = next) {
        next = it->next;
        free(it->b);
        free(it);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void srv_move_fetch_stop(psd *s)
{
    struct srv_move_thread *t = s->parts.t;
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    for (uint32_t i = 0; i < PS_PARTS_MAX; i++)
        if (t->fds[i] >= 0)
            shutdown(t->fds[i], SHUT_RDWR);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 0; i < t->nf; i++)
        if (t->f[i].started)
            pthread_join(t->f[i].th, NULL);
    on_async(&t->async); /* what they posted last */
    s->parts.t = NULL;
    t->async.data = t;
    uv_close((uv_handle_t *)&t->async, on_closed);
}

static int start(psd *s, char *err, size_t errlen)
{
    srv_parts *p = &s->parts;
    srv_move_fetch_stop(s);
    struct srv_move_thread *t = calloc(1, sizeof *t);
    if (!t)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory to fetch rows");
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    for (uint32_t i = 0; i < PS_PARTS_MAX; i++)
        t->fds[i] = -1;
    t->s = s;
    t->token = s->admin_token.len ? s->admin_token : s->token;
    snprintf(t->self, sizeof t->self, "%s", p->new_addrs[p->new_self]);
    t->epoch = p->mv_epoch;
    t->rate = p->rate;
    uv_async_init(s->loop, &t->async, on_async);
    t->async.data = s;
    p->t = t;
    for (uint32_t j = 0; j < p->old_n; j++) {
        if (!((p->want >> j) & 1) || ((p->handed >> j) & 1))
            continue; /* no rows from it, or all of them already */
        fetcher *f = &t->f[t->nf++];
        f->src = j;
        f->all = t;
        ps_addr_list_add_entry(f->reps, &f->nreps, PS_REPLICAS_MAX, p->addrs[j]); /* A/B: its replicas */
        if (!f->nreps) /* an entry of slashes alone: as it is (it will not connect) */
            learn(f, p->addrs[j], strlen(p->addrs[j]));
        if (pthread_create(&f->th, NULL, fetcher_main, f) != 0) {
            srv_move_fetch_stop(s);
            return ps_fail(err, errlen, PS_ENOMEM, "cannot start a thread to fetch rows");
        }
        f->started = 1;
    }
    return 0;
}

/* ---- dropping the rows a move took away, a few milliseconds a turn ---- */

#define DROP_BUDGET_US 3000

struct srv_move_drop {
    uv_idle_t idle;
    psd *s;
};

static void on_drop_idle(uv_idle_t *h)
{
    struct srv_move_drop *d = h->data;
    psd *s = d->s;
    if (srv_move_drop_more(s, DROP_BUDGET_US)) {
        uv_idle_stop(h);
        PS_LOG(PS_LOG_INFO, "move of parts: the %" PRIu64 " rows that left are dropped", s->tables.drop.dropped);
    }
}

static void drop_start(psd *s)
{
    struct srv_move_drop *d = s->parts.drop;
    if (!d) {
        if (!(d = calloc(1, sizeof *d))) {
            srv_move_drop_more(s, UINT64_MAX);
            return;
        }
        d->s = s;
        uv_idle_init(s->loop, &d->idle);
        d->idle.data = d;
        s->parts.drop = d;
    }
    uv_idle_start(&d->idle, on_drop_idle);
}

static void on_drop_closed(uv_handle_t *h)
{
    free(h->data);
}

void srv_move_drop_close(psd *s)
{
    struct srv_move_drop *d = s->parts.drop;
    if (!d)
        return;
    s->parts.drop = NULL;
    uv_idle_stop(&d->idle);
    uv_close((uv_handle_t *)&d->idle, on_drop_closed);
}

void srv_move_fetch_init(psd *s)
{
    s->move_start = start;
    s->move_stop = srv_move_fetch_stop;
    s->move_drop = drop_start;
    s->move_apply = srv_move_replay;
}
