/* follow_thread.c - a follower's thread (PROTOCOL.md 17): it talks to the
 * leader (common/conn.c, as psctl does: an admin hello with the admin
 * token, then `replicate`, `repl_chunk` and `repl_fetch`) and hands the
 * snapshot and each answer it fetched to the loop (follow.c), which
 * applies them in order. A fetch asks for the position after what the
 * thread holds, which tells the leader that this follower holds every
 * change before it. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/conn.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/connection/follow_int.h"
#include "server/replog/replog.h"

#define FETCH_WAIT_MS 500
#define TIMEOUT_MS 10000
/* While the loop loads a snapshot, the thread goes on fetching the log's
 * tail and queues up to this many bytes of answers: the leader keeps a
 * bounded log (its max_bytes), and a big table's snapshot takes longer to
 * load than a busy leader's log lasts. */
#define CATCHUP_QUEUE_MAX ((size_t)1 << 30)

static void post(srv_follow_thread *t, item *it)
{
    pthread_mutex_lock(&t->mu);
    t->queued += it->kind == 'R';
    t->queued_bytes += it->kind == 'R' ? it->len : 0;
    t->loading |= it->kind == 'S';
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
    struct timespec ts = ps_deadline_ms((uint64_t)ms);
    pthread_mutex_lock(&t->mu);
    if (!t->stop)
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    pthread_mutex_unlock(&t->mu);
}

/* Sends `repl_fetch` from position from (its answer is read apart, so that
 * the next fetch can go before the last answer is handed to the loop). */
static int send_fetch(srv_follow_thread *t, ps_conn *c, uint64_t from, uint64_t hist, uint64_t *id)
{
    char f[32], w[16], h[32];
    pthread_mutex_lock(&t->mu);
    const char *loading = t->loading ? "1" : "0"; /* its loop cannot apply yet: not in sync */
    pthread_mutex_unlock(&t->mu);
    snprintf(f, sizeof f, "%" PRIu64, from);
    snprintf(w, sizeof w, "%d", FETCH_WAIT_MS);
    snprintf(h, sizeof h, "%" PRIu64, hist);
    ps_msg m;
    ps_msg_init(&m, PS_MSG_ADMIN);
    m.has = PS_F_CMD | PS_F_ARGS;
    snprintf(m.cmd, sizeof m.cmd, "%s", "repl_fetch");
    const char *a[] = {t->advertise, f, w, h, loading, srv_replog_release()};
    for (unsigned i = 0; i < 6; i++)
        m.args[i] = (ps_str){a[i], (uint32_t)strlen(a[i])};
    m.nargs = 6;
    int rc = ps_conn_send(c, &m);
    *id = m.id;
    return rc;
}

/* Waits while the loop applies slower than answers come, rather than read
 * and queue more (each a frame's memory, faulted in afresh); but not while
 * it loads a snapshot, up to CATCHUP_QUEUE_MAX. Before the next answer is
 * read, after the last one's fetch has told the leader it is held. */
static void wait_for_room(srv_follow_thread *t)
{
    pthread_mutex_lock(&t->mu);
    for (int waited = 0; !t->spare && t->queued >= SPARES && !t->stop && waited < 100 &&
                         !(t->loading && t->queued_bytes < CATCHUP_QUEUE_MAX);
         waited++) {
        struct timespec ts = ps_deadline_ms(10);
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
}

/* An item for an answer: the spare one the loop gave back (its memory
 * becomes the connection's receive buffer when the answer is taken, so the
 * buffers take turns and nothing is copied or faulted in afresh), else a
 * new one. */
static item *take_item(srv_follow_thread *t)
{
    pthread_mutex_lock(&t->mu);
    item *it = t->spare;
    if (it) {
        t->spare = it->next;
        t->nspare--;
    }
    pthread_mutex_unlock(&t->mu);
    if (!it)
        it = calloc(1, sizeof *it);
    return it;
}

/* The leader refused this follower for good (another model, settings it
 * cannot replicate, a wrong token): the loop stops following, with why. */
static void refused(srv_follow_thread *t, const char *why)
{
    size_t n = strlen(why);
    item *it = calloc(1, sizeof *it);
    if (!it || !(it->mem = malloc(n + 1))) {
        free(it);
        return;
    }
    it->kind = 'E', it->fd = -1, it->len = n;
    memcpy(it->mem, why, n + 1);
    it->b = it->mem;
    post(t, it);
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
}

/* FOR TESTS ONLY: with PSD_TEST_FOLLOW_HOLD=PATH in psd's environment,
 * while the file PATH exists an answer is dropped unread and nothing more
 * is fetched (the leader counts only what the last fetch said this
 * follower holds), so that a test holds it behind, in sync for
 * max_replica_lag. 1 when the answer was dropped. */
static int test_hold(srv_follow_thread *t)
{
    const char *path = getenv("PSD_TEST_FOLLOW_HOLD");
    if (!path || !path[0] || access(path, F_OK) != 0)
        return 0;
    while (access(path, F_OK) == 0 && !stopping(t))
        pause_ms(t, 20);
    return 1;
}

/* Fetches from position from of the log of history hist until the session
 * ends. resuming: a session that goes on from where the last one ended;
 * returns 1 when the leader refuses that (the caller takes a snapshot). */
static int fetch_loop(srv_follow_thread *t, ps_conn *c, uint64_t from, uint64_t hist, int resuming)
{
    int sent = 0;  /* the fetch from `from` is sent already */
    uint64_t id = 0;
    ps_msg r;
    item *it;
    int rc = 0;
    while (!stopping(t)) {
        if (!sent && (rc = send_fetch(t, c, from, hist, &id)) != 0)
            break;
        sent = 0;
        rc = ps_conn_recv(c, &r, TIMEOUT_MS);
        if (rc == 0 && (r.has & PS_F_ID) && r.id != id)
            rc = PS_EMALFORMED;
        if (resuming && rc == PS_EREMOTE) {
            PS_LOG(PS_LOG_INFO, "replication: the leader %s does not go on from position %" PRIu64 " (%s): this "
                   "follower takes a snapshot", t->leader, from, ps_conn_error(c));
            return 1;
        }
        if (rc != 0 || r.type != PS_MSG_PARAMS)
            break;
        if (test_hold(t))
            continue; /* fetched again from where it was */
        t->contact_ms = srv_now_ms(); /* the leader answered (coord/: a live leader) */
        if (resuming)
            PS_LOG(PS_LOG_INFO, "replication: going on from position %" PRIu64 " of %s", from, t->leader);
        resuming = 0;
        /* the answer's position comes first (PROTOCOL.md 17): the next fetch
         * asks from there, which tells the leader that this follower holds
         * it; the loop checks the rest before it applies anything */
        const uint8_t *d = (const uint8_t *)r.data;
        size_t len = r.ndata * 4;
        uint64_t next;
        if (len < 12) {
            PS_LOG(PS_LOG_ERROR, "replication: an answer of %zu bytes from %s", len, t->leader);
            break;
        }
        memcpy(&next, d + 4, 8);
        if (next == from)
            continue; /* nothing new */
        it = take_item(t);
        if (!it) {
            PS_LOG(PS_LOG_ERROR, "replication: no memory for an answer of %zu bytes", len);
            break;
        }
        it->next = NULL;
        it->kind = 'R', it->fd = -1, it->pos = from, it->end = r.mver, it->len = len;
        if (d >= c->rbuf && d + len <= c->rbuf + c->rcap) { /* the frame is the item's now */
            size_t at = (size_t)(d - c->rbuf);
            ps_conn_swap_rbuf(c, &it->mem, &it->cap);
            it->b = it->mem + at;
        } else {
            if (it->cap < len) {
                uint8_t *nm = realloc(it->mem, len);
                if (!nm) {
                    free(it->mem);
                    free(it);
                    PS_LOG(PS_LOG_ERROR, "replication: no memory for an answer of %zu bytes", len);
                    rc = PS_ENOMEM;
                    break;
                }
                it->mem = nm, it->cap = len;
            }
            memcpy(it->mem, d, len);
            it->b = it->mem;
        }
        from = next > from && next <= r.mver ? next : from; /* a lie: the loop refuses the item */
        /* held here: the next fetch, sent first, tells the leader so (the
         * sync replies waiting for it go before the loop is woken, and
         * before this thread waits for the loop to catch up) */
        sent = (rc = send_fetch(t, c, from, hist, &id)) == 0;
        post(t, it);
        if (rc != 0)
            break;
        wait_for_room(t);
    }
    if (!stopping(t))
        PS_LOG(PS_LOG_WARN, "replication: fetching from %s at %" PRIu64 ": %s", t->leader, from, ps_conn_error(c));
    /* what it holds: the next session goes on from there when the leader still has it */
    t->resume_from = from;
    t->resume_hist = hist;
    return 0;
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
    if (strcmp(r.mode, t->mode) != 0) {
        /* promoted, it would run the job in another mode */
        char why[sizeof t->leader + 3 * sizeof t->mode + 80];
        snprintf(why, sizeof why, "the leader %s runs mode %s and this follower mode %s: start it with --mode %s",
                 t->leader, r.mode, t->mode, r.mode);
        refused(t, why);
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->fd = c->fd;
    pthread_mutex_unlock(&t->mu);
    if (t->resume_hist && fetch_loop(t, c, t->resume_from, t->resume_hist, 1) == 0)
        return; /* went on from where the last session ended */
    t->resume_hist = 0;
    char fp[24];
    snprintf(fp, sizeof fp, "%" PRIu64, (uint64_t)t->fp);
    const char *a1[] = {t->advertise, fp};
    rc = ps_conn_admin(c, "replicate", a1, 2, &r, TIMEOUT_MS);
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
        rc = ps_conn_admin(c, "repl_chunk", a2, 2, &r, TIMEOUT_MS);
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
    fetch_loop(t, c, pos, hist, 0);
}

void *srv_follow_thread_main(void *arg)
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
