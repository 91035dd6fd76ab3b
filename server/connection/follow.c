/* follow.c - a follower's side of replication (PROTOCOL.md 17), on the
 * loop: a thread (follow_thread.c) talks to the leader and hands the
 * snapshot and the records it fetched to the loop, which applies them in
 * order (replog.c, report/ckpt_load.c). `psctl promote` stops the thread,
 * applies what it still holds and makes this psd a leader. Owns
 * psd.follow. */
#define _GNU_SOURCE
#include "server/connection/follow.h"
#include "server/connection/follow_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/answer/pull.h"
#include "server/connection/net.h"
#include "server/connection/tell.h"
#include "server/replog/replog.h"
#include "server/policy/policy.h"
#include "server/replog/pushid.h"
#include "server/dispatch/move_state.h"
#include "server/report/checkpoint.h"

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
        snprintf(why, sizeof why, "the leader refused this follower: %.500s", (const char *)it->mem);
        follower_fail(s, why);
        return;
    }
    if (it->kind == 'S') {
        /* FOR TESTS ONLY: a snapshot that takes this long more to load, as
         * a big table's does (test_replica) */
        const char *slow = getenv("PSD_TEST_SNAPSHOT_LOAD_MS");
        if (slow && atoi(slow) > 0)
            usleep((useconds_t)atoi(slow) * 1000u);
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", it->fd);
        srv_replog_kept kept;
        srv_replog_set_aside(s, &kept); /* loaded into a fresh model: a failed load leaves the old one */
        /* an empty snapshot: the leader holds nothing yet (a part a move is
         * to add), and so does this psd now */
        int rc = lseek(it->fd, 0, SEEK_END) == 0 ? 0 : srv_checkpoint_load_file(s, path, err, sizeof err);
        srv_replog_take_back(s, &kept, rc == 0);
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
    uint64_t next;
    int rc = srv_replog_apply_answer(s, it->b, it->len, it->pos, it->end, &next, srv_pushid_set, err, sizeof err);
    if (rc != 0) {
        char why[600];
        snprintf(why, sizeof why, "the leader's answer from position %" PRIu64 " does not apply: %s", it->pos, err);
        follower_fail(s, why);
        return;
    }
    f->applied = next;
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
        if (it->kind == 'S') {
            pthread_mutex_lock(&t->mu);
            t->loading = 0;
            pthread_mutex_unlock(&t->mu);
        }
        if (it->kind == 'R') { /* kept for the thread's next fetches: two take turns */
            pthread_mutex_lock(&t->mu);
            t->queued--;
            t->queued_bytes -= it->len;
            if (t->nspare < SPARES) {
                it->next = t->spare;
                t->spare = it;
                t->nspare++;
                it = NULL;
            }
            pthread_cond_broadcast(&t->cv); /* a thread waiting for a spare */
            pthread_mutex_unlock(&t->mu);
        }
        if (it)
            free(it->mem);
        free(it);
    }
}

static void on_async(uv_async_t *a)
{
    psd *s = a->data;
    if (!s->follow)
        return;
    uint64_t version = s->model.version;
    drain(s);
    if (s->model.version != version)
        srv_answer_parked(s); /* a reader's pull waiting for a version (PROTOCOL.md 15) */
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

/* ---- a promotion by hand tells the old leader ---------------------------------------- */

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
    s->policy->destroy(s); /* rounds begin afresh: any left from leading before are dropped */
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
    srv_move_resume(s); /* a move under way goes on from this psd */
    if (!s->cfg.coordinator[0]) /* with one, the lease and the fence see to it */
        srv_tell_step_down(f->leader, t->advertise, &t->token, t->resume_hist);
    return 0;
}

int srv_follow_step_down(psd *s, const char *leader, const char *why, char *err, size_t errlen)
{
    /* following first: from here on, a worker's hello is refused
     * (NOT_LEADER), so the workers closed below cannot come back to this
     * psd and make it lead a second time */
    int rc = leader && leader[0] ? srv_follow_start_to(s, leader, err, errlen) : 0;
    uint32_t n = srv_conn_close_workers(s, why);
    srv_move_forget(s);
    PS_LOG(PS_LOG_WARN, "this psd no longer leads part %d (%s; %s): %u workers disconnected, its unacknowledged "
           "pushes dropped", s->cfg.part, why, leader && leader[0] ? leader : "nobody leads now", n);
    srv_replog_free(s); /* a follower's state comes from its leader's snapshot */
    if (rc != 0 && s->shutdown) {
        /* it may not lead and cannot follow: it stops (its supervisor
         * starts it again, and it follows then) rather than take workers
         * back */
        char text[400];
        snprintf(text, sizeof text, "it cannot follow the new leader %s: %s", leader, err);
        PS_LOG(PS_LOG_ERROR, "this psd stops: %s (it may not lead its part any more)", text);
        s->shutdown(s, text);
    }
    return rc;
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
    snprintf(t->mode, sizeof t->mode, "%s", s->policy->name);
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
    if (pthread_create(&t->th, NULL, srv_follow_thread_main, t) != 0) {
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
            free(it->mem);
            free(it);
        }
        for (item *it = t->spare, *next; it; it = next) {
            next = it->next;
            free(it->mem);
            free(it);
        }
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cv);
        free(t);
    }
    free(f);
    s->follow = NULL;
    s->follow_retired = NULL;
}
