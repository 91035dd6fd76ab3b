/* handle.c - the dispatch table (one handler per message type psd
 * receives, from proto/messages.def) and the handlers of the small
 * messages (the dense model's are in handle_dense.c, the tables' in
 * handle_table.c). srv_handle checks what messages.def says of
 * every type (handshake done, the sender's role); each handler then checks
 * the rest (model state), acts and queues exactly one reply (or parks a
 * pull that will get one later). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/dispatch/admin.h"
#include "common/log.h"
#include "server/dispatch/handle.h"
#include "server/policy/join.h"
#include "server/policy/policy.h"
#include "server/report/dashboard.h"
#include "server/dispatch/handle_table.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"
#include "server/report/status.h"

/* HEARTBEAT. With base, a worker of a planned BSP job says the round it
 * rejoins at (srv_plan_rejoin). Without an id it is fire-and-forget, so a
 * worker's heartbeat thread never has a reply to read, except that one
 * asking with "wait" while one of the worker's pulls is parked is told what
 * that pull waits for: an OK with "wait" and "text" (id 0 for a heartbeat
 * without one), which the worker reads among the replies it is waiting for. */
int srv_on_heartbeat(srv_conn *c, ps_msg *m)
{
    char why[240];
    if ((m->has & PS_F_BASE) && c->worker && srv_plan_rejoin(c->srv, c->worker, m->base) == SRV_WAKE)
        srv_answer_parked(c->srv);
    int tell = (m->has & PS_F_WAIT) && m->wait && c->worker &&
               ((c->parked && srv_wait_describe(c->srv, c->worker, why, sizeof why)) ||
                srv_barrier_describe(c, why, sizeof why));
    if (!tell) {
        if (m->has & PS_F_ID)
            srv_send_ok(c, m->id);
        return 0;
    }
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER | PS_F_WAIT | PS_F_TEXT;
    r.id = (m->has & PS_F_ID) ? m->id : 0;
    r.mver = c->srv->model.version;
    r.wait = 1;
    r.text = why;
    r.text_len = (uint32_t)strlen(why);
    srv_send(c, &r, NULL);
    return 0;
}

/* ---- reports (the dense model's messages: handle_dense.c) --------------------- */

/* FOR TESTS ONLY: with PSD_TEST_HOLD_REPORT=KIND:MS in psd's environment
 * (KIND epoch or progress), the first report of that kind is answered
 * only after psd's loop has slept MS milliseconds, logged first, so that
 * a test signals a worker while it waits for that reply
 * (tests/integration/test_stop_grace.py). */
static void hold_report(int epoch_end, const srv_worker *w)
{
    static int done;
    const char *e = getenv("PSD_TEST_HOLD_REPORT");
    const char *kind = epoch_end ? "epoch:" : "progress:";
    if (done || !e || strncmp(e, kind, strlen(kind)) != 0)
        return;
    long ms = strtol(e + strlen(kind), NULL, 10);
    done = 1;
    PS_LOG(PS_LOG_WARN, "PSD_TEST_HOLD_REPORT: holding the %.*s report of shard %u for %ld ms (a test's fault; "
                        "never in production)", (int)strlen(kind) - 1, kind, w->shard, ms);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

int srv_on_report(srv_conn *c, ps_msg *m)
{
    srv_worker *w = c->worker;
    /* psworker reports every second too (loss since its last report, the
     * epochs done so far): only the report that ends an epoch is logged */
    int epoch_end = m->epoch != w->epoch || (m->has & PS_F_ACC);
    int level = epoch_end ? PS_LOG_INFO : PS_LOG_DEBUG;
    w->has_report = 1;
    w->epoch = m->epoch;
    if (m->has & PS_F_LOSS)
        w->loss = m->loss;
    if (m->has & PS_F_ACC) {
        w->acc = m->acc;
        w->has_acc = 1;
    }
    if (m->has & PS_F_TLOSS)
        w->tloss = m->tloss;
    if (m->has & PS_F_SAMPLES)
        w->samples = m->samples;
    if (m->has & PS_F_RATE)
        w->rate = m->rate;
    if (m->has & PS_F_ACC)
        PS_LOG(level, "shard %u/%u epoch %u: loss %.4f, test accuracy %.2f%%, %.0f samples/s", w->shard,
               w->nshards, w->epoch, w->loss, 100.0 * w->acc, w->rate);
    else
        PS_LOG(level, "shard %u/%u epoch %u: loss %.4f, %.0f samples/s", w->shard, w->nshards, w->epoch,
               w->loss, w->rate);
    srv_dash_report(c->srv, w, (m->has & PS_F_ACC) != 0, epoch_end);
    hold_report(epoch_end, w);
    srv_send_ok(c, m->id);
    return 0;
}

/* ---- the other messages ------------------------------------------------------- */

/* accepted at once, or, when psd requires a token, kept until the AUTH
 * that answers its CHALLENGE (auth.c); nothing of the job (shards,
 * layout) is checked or told before that */
int srv_on_hello(srv_conn *c, ps_msg *m)
{
    char err[1200];
    int rc = srv_hello_precheck(c, m, err, sizeof err);
    if (rc == 0)
        rc = c->srv->token.len ? srv_auth_challenge(c, m, err, sizeof err) : srv_hello_accept(c, m, NULL, err, sizeof err);
    /* a second hello costs only itself; any other refusal ends the connection */
    if (rc != 0)
        srv_send_error(c, m->id, rc, rc != PS_ESTATE, "%s", err);
    return 0;
}


int srv_on_barrier(srv_conn *c, ps_msg *m)
{
    char err[200];
    int rc = srv_barrier(c, m->id, m->mver, err, sizeof err);
    if (rc != 0)
        srv_send_error(c, m->id, rc, 0, "%s", err);
    return 0;
}

int srv_on_status(srv_conn *c, ps_msg *m)
{
    ps_msg r;
    ps_msg_init(&r, PS_MSG_STATUS_REPLY);
    r.has = PS_F_ID;
    r.id = m->id;
    srv_send(c, &r, NULL);
    return 0;
}

int srv_on_metrics(srv_conn *c, ps_msg *m)
{
    ps_buf text = {0};
    if (srv_metrics_text(c->srv, &text) != 0) {
        ps_buf_free(&text);
        srv_send_error(c, m->id, PS_ENOMEM, 0, "out of memory");
        return 0;
    }
    ps_msg r;
    ps_msg_init(&r, PS_MSG_METRICS_REPLY);
    r.has = PS_F_ID | PS_F_TEXT;
    r.id = m->id;
    r.text = (const char *)text.p;
    r.text_len = (uint32_t)text.len;
    srv_send(c, &r, NULL);
    ps_buf_free(&text);
    return 0;
}

int srv_on_admin(srv_conn *c, ps_msg *m)
{
    srv_handle_admin(c, m); /* dispatch/admin.c */
    return 0;
}

int srv_on_auth(srv_conn *c, ps_msg *m)
{
    srv_send_error(c, m->id, PS_ESTATE, 0, "auth without a challenge: %s",
                   c->srv->token.len ? "this connection is authenticated already" : "psd requires no token");
    return 0;
}

int srv_on_bye(srv_conn *c, ps_msg *m)
{
    /* the worker's reason (optional text), printable bytes only */
    char why[96] = "said bye";
    if ((m->has & PS_F_TEXT) && m->text_len) {
        size_t n = m->text_len < sizeof why - 1 ? m->text_len : sizeof why - 1;
        for (size_t i = 0; i < n; i++)
            why[i] = m->text[i] >= 0x20 && m->text[i] < 0x7f ? m->text[i] : '?';
        why[n] = '\0';
    }
    srv_conn_detach(c, SRV_W_LEFT, why);
    srv_send_ok(c, m->id);
    c->close_after_write = 1;
    return SRV_STOP_READING;
}

/* the table messages: dispatch/handle_table.c */
/* ---- dispatch ------------------------------------------------------------------ */

/* The handler of each type psd receives, from messages.def: srv_on_<name>,
 * NULL for the types only psd sends. */
static srv_handler *const handlers[PS_MSG_TYPE_MAX + 1] = {
#define PS_MSG(NAME, name, t, dir, required) [t] = SRV_HANDLER_##dir(name),
#include "proto/messages.def"
#undef PS_MSG
};

/* A reader's connection only pulls (PROTOCOL.md 15): what would change the
 * model or the tables (a push, initial values, a new table, a report, a
 * barrier) is refused, on a follower with NOT_LEADER (whose reply names
 * the leader), on a leader with FORBIDDEN. 1 when m was refused. */
static int reader_refuses(srv_conn *c, const ps_msg *m)
{
    uint32_t t = m->type;
    /* the workers' types (messages.def) all write, but declaring a table psd has */
    int writes = ps_msg_type_dir(t) == PS_DIR_W &&
                 !(t == PS_MSG_TABLE && srv_tables_find(&c->srv->tables, m->tab) >= 0);
    if (!c->reader || !writes)
        return 0;
    if (c->srv->follow)
        srv_send_error(c, m->id, PS_ENOT_LEADER, 0,
                       "%s refused: this psd is a follower of %s (a read replica) and this connection a reader, "
                       "which only pulls; changes go to the leader", ps_msg_type_name(t), c->srv->cfg.replica_of);
    else
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0,
                       "%s refused: this connection said hello as a reader, which only pulls; say hello without "
                       "\"reader\" to push", ps_msg_type_name(t));
    return 1;
}

int srv_handle(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    c->last_msg_ms = srv_now_ms();
    srv_model_sync(&s->model); /* Hogwild!: the workers' steps since */
    if (c->auth) {
        /* a challenge is out: only its answer may come */
        char err[1200];
        int rc = m->type == PS_MSG_AUTH ? srv_auth_answer(c, m, err, sizeof err) : 0;
        if (rc != 0)
            srv_send_error(c, m->id, rc, 1, "%s", err);
        else if (m->type != PS_MSG_AUTH)
            srv_send_error(c, m->id, PS_EAUTH, 1, "psd requires a token: expected auth, the answer to its "
                                                  "challenge, not %s",
                           ps_msg_type_name(m->type));
        return 0;
    }
    if (c->role == PS_ROLE_NONE && m->type != PS_MSG_HELLO) {
        srv_send_error(c, m->id, PS_ESTATE, 1, "the first message must be hello, not %s",
                       ps_msg_type_name(m->type));
        return 0;
    }
    if (reader_refuses(c, m))
        return 0;
    /* a reader passed reader_refuses: of the workers' types it only
     * declares a table psd holds (to pull its rows) */
    ps_msg_dir dir = ps_msg_type_dir(m->type);
    if (dir == PS_DIR_W && !c->worker && !c->reader) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0, "%s is for workers; this connection is %s",
                       ps_msg_type_name(m->type), ps_role_name((uint32_t)c->role));
        return 0;
    }
    int reads = m->type == PS_MSG_ADMIN && srv_admin_reads(m->cmd); /* e.g. ADMIN history */
    if (c->admin_readonly && ((m->type == PS_MSG_ADMIN && !reads) || m->type == PS_MSG_PULL)) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0,
                       "%s%s%s refused: this admin connection proved the workers' token and may only read "
                       "(%s), because admin_token_file is not configured; set it in psd's configuration and use "
                       "that token",
                       m->type == PS_MSG_ADMIN ? "admin command '" : "pulling the model",
                       m->type == PS_MSG_ADMIN ? m->cmd : "", m->type == PS_MSG_ADMIN ? "'" : "",
                       srv_admin_readable());
        return 0;
    }
    if (dir == PS_DIR_A && c->role != PS_ROLE_ADMIN) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0, "%s commands are for admin connections; this one is %s",
                       ps_msg_type_name(m->type), ps_role_name((uint32_t)c->role));
        return 0;
    }
    srv_handler *h = m->type <= PS_MSG_TYPE_MAX ? handlers[m->type] : NULL;
    if (!h) {
        srv_send_error(c, m->id, PS_EBAD_TYPE, 0, "psd does not accept %s messages", ps_msg_type_name(m->type));
        return 0;
    }
    return h(c, m);
}
