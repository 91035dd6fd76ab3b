/* follow.c - a follower's side of replication (PROTOCOL.md 17): a thread
 * talks to the leader (common/conn.c, as psctl does: an admin hello with
 * the admin token, then `replicate`, `repl_chunk` and `repl_fetch`), and
 * hands the snapshot and the records it fetched to the loop, which applies
 * them in order (replog.c, report/ckpt_load.c). A fetch asks for the
 * position after what the thread holds, which tells the leader that this
 * follower holds every change before it. `psctl promote` stops the thread,
 * applies what it still holds and makes this psd a leader. Owns psd.follow. */
#define _GNU_SOURCE
#include "server/connection/follow.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/conn.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/replog/replog.h"
#include "server/session/pushid.h"
#include "server/report/checkpoint.h"

#define FETCH_WAIT_MS 500
#define TIMEOUT_MS 10000

typedef struct item {
    struct item *next;
    int kind;            /* 'S' a snapshot in fd, 'R' records */
    int fd;
    uint64_t pos, end;   /* the position it starts at; the leader's end */
    size_t len, cap;
    uint8_t b[];
} item;

struct srv_follow_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    int stop;
    int fd;              /* the connection's socket, shut down to stop a wait */
    uv_async_t async;
    item *spare;         /* a records item the loop applied, for the next fetch */
    psd *s;
    ps_token token;
    char leader[sizeof ((ps_config *)0)->replica_of];
    char advertise[sizeof ((ps_config *)0)->advertise];
    _Atomic uint64_t fp;  /* the fingerprint of the model this psd holds (0: none), for the leader to check */
    _Atomic uint64_t contact_ms; /* srv_now_ms() of the leader's last answer (coord/: a live leader) */
};

static void post(srv_follow_thread *t, item *it)
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

static int stopping(srv_follow_thread *t)
{
    pthread_mutex_lock(&t->mu);
    int st = t->stop;
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Waits ms unless told to stop. */
static void pause_ms(srv_follow_thread *t, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&t->mu);
    if (!t->stop)
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    pthread_mutex_unlock(&t->mu);
}

static int admin(ps_conn *c, const char *cmd, const char *const *args, unsigned n, ps_msg *r)
{
    ps_msg m;
    ps_msg_init(&m, PS_MSG_ADMIN);
    m.has = PS_F_CMD | PS_F_ARGS;
    snprintf(m.cmd, sizeof m.cmd, "%s", cmd);
    for (unsigned i = 0; i < n; i++)
        m.args[i] = (ps_str){args[i], (uint32_t)strlen(args[i])};
    m.nargs = n;
    return ps_conn_call(c, &m, r, TIMEOUT_MS);
}

/* The bytes of whole records at the start of p[0..len) (zero padding after). */
static size_t records_len(const uint8_t *p, size_t len)
{
    size_t at = 0;
    while (at + 4 <= len) {
        uint32_t l;
        memcpy(&l, p + at, 4);
        if (l == 0 || l > len - at - 4)
            break;
        at += 4 + (size_t)l;
    }
    return at;
}

/* An item of room for len bytes: a spare one the loop gave back when it is
 * big enough (records come in the same sizes, so the memory is reused
 * rather than faulted in afresh each time), else a new one. */
static item *take_item(srv_follow_thread *t, size_t len)
{
    pthread_mutex_lock(&t->mu);
    item *it = t->spare;
    if (it && it->cap >= len)
        t->spare = NULL;
    else
        it = NULL;
    pthread_mutex_unlock(&t->mu);
    if (!it) {
        size_t cap = len < ((size_t)4 << 20) + 64 ? ((size_t)4 << 20) + 64 : len;
        if (!(it = malloc(sizeof *it + cap)))
            return NULL;
        it->cap = cap;
    }
    return it;
}

/* The leader refused this follower for good (another model, settings it
 * cannot replicate, a wrong token): the loop stops following, with why. */
static void refused(srv_follow_thread *t, const char *why)
{
    size_t n = strlen(why);
    item *it = calloc(1, sizeof *it + n + 1);
    if (!it)
        return;
    it->kind = 'E', it->fd = -1, it->len = n;
    memcpy(it->b, why, n + 1);
    post(t, it);
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
}

/* One session with the leader: snapshot, then fetches until an error.
 * Returns after logging why it ended. */
static void session(srv_follow_thread *t, ps_conn *c)
{
    ps_msg m, r;
    int rc = ps_conn_connect(c, t->leader, TIMEOUT_MS);
    if (rc == 0) {
        ps_msg_init(&m, PS_MSG_HELLO);
        m.has = PS_F_VERSION | PS_F_ROLE;
        m.proto = PS_PROTO_VERSION;
        m.role = PS_ROLE_ADMIN;
        rc = ps_conn_hello(c, &m, t->token.len ? t->token.b : NULL, t->token.len, &r, TIMEOUT_MS);
    }
    if (rc == PS_EREMOTE || rc == PS_EAUTH) {
        refused(t, ps_conn_error(c));
        return;
    }
    if (rc != 0) {
        PS_LOG(PS_LOG_WARN, "replication: cannot reach the leader %s: %s; trying again", t->leader, ps_conn_error(c));
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->fd = c->fd;
    pthread_mutex_unlock(&t->mu);
    char fp[24];
    snprintf(fp, sizeof fp, "%" PRIu64, (uint64_t)t->fp);
    const char *a1[] = {t->advertise, fp};
    rc = admin(c, "replicate", a1, 2, &r);
    if (rc == PS_EREMOTE && (c->remote_code == -PS_ELAYOUT || c->remote_code == -PS_EINVAL ||
                             c->remote_code == -PS_EFORBIDDEN || c->remote_code == -PS_ENOT_LEADER)) {
        refused(t, ps_conn_error(c));
        return;
    }
    if (rc != 0) {
        PS_LOG(rc == PS_EREMOTE && c->remote_code == -PS_ENOT_READY ? PS_LOG_INFO : PS_LOG_WARN,
               "replication: the leader %s refused a snapshot: %s", t->leader, ps_conn_error(c));
        return;
    }
    uint64_t size = 0, pos = 0, hist = 0;
    char text[200];
    snprintf(text, sizeof text, "%.*s", (int)r.text_len, r.text ? r.text : "");
    if (sscanf(text, "snapshot %" SCNu64 " %" SCNu64 " %" SCNu64, &size, &pos, &hist) != 3) {
        PS_LOG(PS_LOG_ERROR, "replication: the leader's answer to replicate is not a snapshot: %s", text);
        return;
    }
    int fd = memfd_create("psd-snapshot", MFD_CLOEXEC);
    if (fd < 0) {
        PS_LOG(PS_LOG_ERROR, "replication: no memory file for the snapshot: %s", strerror(errno));
        return;
    }
    for (uint64_t off = 0; off < size && !stopping(t);) {
        char o[32];
        snprintf(o, sizeof o, "%" PRIu64, off);
        const char *a2[] = {t->advertise, o};
        rc = admin(c, "repl_chunk", a2, 2, &r);
        if (rc != 0 || r.type != PS_MSG_PARAMS) {
            PS_LOG(PS_LOG_WARN, "replication: reading the snapshot at %" PRIu64 ": %s", off, ps_conn_error(c));
            close(fd);
            return;
        }
        size_t n = r.ndata * 4 < size - off ? r.ndata * 4 : (size_t)(size - off);
        if (pwrite(fd, r.data, n, (off_t)off) != (ssize_t)n) {
            PS_LOG(PS_LOG_ERROR, "replication: writing the snapshot: %s", strerror(errno));
            close(fd);
            return;
        }
        off += n;
    }
    item *it = calloc(1, sizeof *it);
    if (!it) {
        close(fd);
        return;
    }
    it->kind = 'S', it->fd = fd, it->pos = pos, it->end = pos;
    post(t, it);
    PS_LOG(PS_LOG_INFO, "replication: snapshot of %" PRIu64 " bytes at position %" PRIu64 " from %s", size, pos,
           t->leader);
    uint64_t from = pos;
    while (!stopping(t)) {
        char f[32], w[16];
        snprintf(f, sizeof f, "%" PRIu64, from);
        snprintf(w, sizeof w, "%d", FETCH_WAIT_MS);
        const char *a3[] = {t->advertise, f, w};
        rc = admin(c, "repl_fetch", a3, 3, &r);
        if (rc != 0 || r.type != PS_MSG_PARAMS) {
            if (!stopping(t))
                PS_LOG(PS_LOG_WARN, "replication: fetching from %s at %" PRIu64 ": %s", t->leader, from,
                       ps_conn_error(c));
            return;
        }
        t->contact_ms = srv_now_ms();
        size_t len = records_len((const uint8_t *)r.data, r.ndata * 4);
        if (len == 0)
            continue;
        it = take_item(t, len);
        if (!it) {
            PS_LOG(PS_LOG_ERROR, "replication: no memory for %zu bytes of records", len);
            return;
        }
        it->next = NULL;
        it->kind = 'R', it->fd = -1, it->pos = from, it->end = r.mver, it->len = len;
        memcpy(it->b, r.data, len);
        from += len;
        post(t, it); /* held here: the next fetch tells the leader so */
    }
}

static void *thread_main(void *arg)
{
    srv_follow_thread *t = arg;
    ps_conn c;
    ps_conn_init(&c);
    int backoff = 100;
    while (!stopping(t)) {
        session(t, &c);
        pthread_mutex_lock(&t->mu);
        t->fd = -1;
        pthread_mutex_unlock(&t->mu);
        ps_conn_close(&c);
        if (stopping(t))
            break;
        pause_ms(t, backoff);
        backoff = backoff < 2000 ? backoff * 2 : 2000;
    }
    ps_conn_free(&c);
    return NULL;
}

/* ---- on the loop ------------------------------------------------------------- */

static void follower_fail(psd *s, const char *why)
{
    srv_follow *f = s->follow;
    snprintf(f->error, sizeof f->error, "%s", why);
    PS_LOG(PS_LOG_ERROR, "replication: this follower stops applying the leader's changes: %s", why);
    f->failed = 1;
}

static void apply_item(psd *s, item *it)
{
    srv_follow *f = s->follow;
    char err[512];
    if (f->failed)
        return;
    if (it->kind == 'E') {
        char why[sizeof f->error];
        snprintf(why, sizeof why, "the leader refused this follower: %.500s", (const char *)it->b);
        follower_fail(s, why);
        return;
    }
    if (it->kind == 'S') {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", it->fd);
        srv_replog_reset(s);
        int rc = srv_checkpoint_load_file(s, path, err, sizeof err);
        if (rc != 0) {
            char why[600];
            snprintf(why, sizeof why, "the leader's snapshot does not load: %s", err);
            follower_fail(s, why);
            return;
        }
        f->t->fp = s->model.has_layout ? s->model.fp : 0;
        f->applied = it->pos;
        f->leader_end = it->end;
        f->snapshots++;
        f->synced = 1;
        PS_LOG(PS_LOG_INFO, "replication: snapshot loaded: model version %" PRIu64 ", %u tables; following %s",
               s->model.version, s->tables.n, f->leader);
        return;
    }
    if (it->pos != f->applied) /* a session before the snapshot that replaced it */
        return;
    int rc = srv_replog_apply(s, it->b, it->len, srv_pushid_set, err, sizeof err);
    if (rc != 0) {
        follower_fail(s, err);
        return;
    }
    f->applied = it->pos + it->len;
    f->leader_end = it->end > f->applied ? it->end : f->applied;
    f->records_bytes += it->len;
}

static void drain(psd *s)
{
    srv_follow_thread *t = s->follow->t;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        item *it = t->head;
        if (it) {
            t->head = it->next;
            if (!t->head)
                t->tail = NULL;
        }
        pthread_mutex_unlock(&t->mu);
        if (!it)
            return;
        apply_item(s, it);
        if (it->fd >= 0)
            close(it->fd);
        if (it->kind == 'R') { /* kept for the thread's next fetch */
            pthread_mutex_lock(&t->mu);
            item *old = t->spare;
            t->spare = it;
            pthread_mutex_unlock(&t->mu);
            it = old;
        }
        free(it);
    }
}

static void on_async(uv_async_t *a)
{
    psd *s = a->data;
    if (s->follow)
        drain(s);
}

static void thread_stop(srv_follow_thread *t)
{
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    if (t->fd >= 0)
        shutdown(t->fd, SHUT_RDWR); /* ends a wait for the leader's reply */
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
}

static int promote(psd *s, char *err, size_t errlen)
{
    srv_follow *f = s->follow;
    if (f->failed)
        return ps_fail(err, errlen, PS_ESTATE, "this follower stopped applying its leader's changes (%s): its state "
                       "is not the leader's", f->error);
    if (!f->synced)
        return ps_fail(err, errlen, PS_ENOT_READY, "this follower has no snapshot of its leader yet");
    srv_follow_thread *t = f->t;
    thread_stop(t);
    drain(s); /* what it holds is applied: every acknowledged push */
    uint64_t applied = f->applied;
    uv_close((uv_handle_t *)&t->async, NULL);
    /* the thread and its queue are gone; the handle's memory lives until
     * the loop closes it: freed at exit */
    s->follow = NULL;
    f->t = NULL;
    f->retired = t;
    PS_LOG(PS_LOG_WARN, "replication: promoted: this psd leads its part now (it had applied the leader's log up to %"
           PRIu64 ", model version %" PRIu64 ")", applied, s->model.version);
    s->follow_retired = f;
    return 0;
}

static void on_async_closed(uv_handle_t *h)
{
    srv_follow_thread *t = (srv_follow_thread *)((char *)h - offsetof(srv_follow_thread, async));
    for (item *it = t->head, *next; it; it = next) {
        next = it->next;
        if (it->fd >= 0)
            close(it->fd);
        free(it);
    }
    free(t->spare);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void srv_follow_drop(psd *s)
{
    srv_follow *f = s->follow;
    if (!f)
        return;
    if (f->t) {
        thread_stop(f->t);
        uv_close((uv_handle_t *)&f->t->async, on_async_closed);
    }
    if (f->retired) { /* stopped at shutdown: its handle is closing */
        s->follow_retired = f;
        s->follow = NULL;
        return;
    }
    free(f);
    s->follow = NULL;
}

uint64_t srv_follow_contact_ms(const psd *s)
{
    return s->follow && s->follow->t ? s->follow->t->contact_ms : 0;
}

int srv_follow_start(psd *s, char *err, size_t errlen)
{
    if (!s->cfg.replica_of[0])
        return 0;
    return srv_follow_start_to(s, s->cfg.replica_of, err, errlen);
}

int srv_follow_start_to(psd *s, const char *leader, char *err, size_t errlen)
{
    srv_follow_drop(s);
    srv_follow *f = calloc(1, sizeof *f);
    srv_follow_thread *t = calloc(1, sizeof *t);
    if (!f || !t) {
        free(f);
        free(t);
        return ps_fail(err, errlen, PS_ENOMEM, "no memory to follow %s", leader);
    }
    t->s = s;
    t->fd = -1;
    t->fp = s->model.has_layout ? s->model.fp : 0; /* from its own checkpoint, say */
    t->token = s->admin_token.len ? s->admin_token : s->token;
    snprintf(t->leader, sizeof t->leader, "%s", leader);
    t->contact_ms = srv_now_ms(); /* as if it had answered: the thread's first answer comes soon */
    if (s->cfg.advertise[0])
        snprintf(t->advertise, sizeof t->advertise, "%s", s->cfg.advertise);
    else
        snprintf(t->advertise, sizeof t->advertise, "127.0.0.1:%d", s->port);
    snprintf(f->leader, sizeof f->leader, "%s", leader);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    uv_async_init(s->loop, &t->async, on_async);
    t->async.data = s;
    f->t = t;
    s->follow = f;
    s->promote = promote;
    if (pthread_create(&t->th, NULL, thread_main, t) != 0) {
        s->follow = NULL;
        uv_close((uv_handle_t *)&t->async, NULL);
        free(f);
        return ps_fail(err, errlen, PS_ENOMEM, "cannot start the replication thread");
    }
    PS_LOG(PS_LOG_INFO, "replication: following the leader %s (workers reach this psd at %s)", t->leader,
           t->advertise);
    return 0;
}

void srv_follow_stop(psd *s)
{
    srv_follow *f = s->follow;
    if (f && f->t) {
        thread_stop(f->t);
        uv_close((uv_handle_t *)&f->t->async, NULL);
        f->retired = f->t;
        f->t = NULL;
    }
}

void srv_follow_free(psd *s)
{
    srv_follow *f = s->follow ? s->follow : s->follow_retired;
    if (!f)
        return;
    srv_follow_thread *t = f->retired;
    if (t) {
        for (item *it = t->head, *next; it; it = next) {
            next = it->next;
            if (it->fd >= 0)
                close(it->fd);
            free(it);
        }
        free(t->spare);
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        free(t);
    }
    free(f);
    s->follow = NULL;
    s->follow_retired = NULL;
}
