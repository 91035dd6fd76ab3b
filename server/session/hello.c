/* hello.c - a connection's membership: its hello, in three steps (check
 * it against the job, join it: the layout, the worker's record, the
 * policy, shared memory; and the WELCOME), and its leaving
 * (srv_conn_detach). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/store/parts.h"
#include "server/session/hello.h"
#include "server/report/checkpoint.h"
#include "common/log.h"
#include "server/report/dashboard.h"
#include "server/policy/join.h"
#include "server/policy/policy.h"
#include "proto/errors.h"
#include "server/replog/replog.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"

/* ---- membership ------------------------------------------------------------ */

static srv_worker *worker_slot(psd *s, uint32_t shard)
{
    if (shard >= s->nworkers_cap) {
        uint32_t cap = s->nworkers_cap ? s->nworkers_cap : 8;
        while (cap <= shard)
            cap *= 2;
        srv_worker **w = realloc(s->workers, cap * sizeof *w);
        if (!w)
            return NULL;
        memset(w + s->nworkers_cap, 0, (cap - s->nworkers_cap) * sizeof *w);
        s->workers = w;
        s->nworkers_cap = cap;
    }
    if (!s->workers[shard]) {
        s->workers[shard] = calloc(1, sizeof(srv_worker));
    }
    return s->workers[shard];
}

/* Every worker has gone: the model is written to the state dir now (not
 * at the next checkpoint_interval, which a short job never reaches), or,
 * without one, psd says once where the model is and how to keep it. */
static void last_worker_left(psd *s)
{
    if (s->cfg.state_dir[0]) {
        srv_checkpoint_at_rest(s, "the last worker left"); /* the tick retries if it cannot start now */
        return;
    }
    if (s->said_memory_only || !s->model.initialized)
        return;
    s->said_memory_only = 1;
    PS_LOG(PS_LOG_WARN, "every worker has left: the model (version %llu) exists only in memory and is lost when "
                        "psd stops; keep it with `psctl save FILE.safetensors`, or start psd with --state-dir DIR "
                        "(state_dir) to have it checkpointed",
           (unsigned long long)s->model.version);
}

void srv_conn_detach(srv_conn *c, int state, const char *why)
{
    psd *s = c->srv;
    srv_pulls_drop(c);
    if (c->barrier_ver)
        srv_barrier_leave(c); /* the others no longer wait for it */
    if (s->init_owner == c) {
        s->init_owner = NULL;
        if (!s->model.initialized) {
            PS_LOG(PS_LOG_WARN, "the worker sending the initial values (%s) left before finishing; the next "
                                "worker to connect will be asked for them", c->addr);
            /* workers already waiting cannot be asked: tell them to reconnect */
            for (srv_conn *o = s->conns; o; o = o->next) {
                if (o == c || o->closing || !o->parked)
                    continue;
                /* the error may close o, which frees its list: step with care */
                for (srv_parked *p = o->parked, *next; p && !o->closing; p = next) {
                    next = p->next;
                    srv_send_error(o, p->id, PS_ENOT_READY, 1,
                                   "the worker initialising the model left; reconnect to be asked for initial "
                                   "values");
                }
            }
        }
    }
    srv_worker *w = c->worker;
    if (!w)
        return;
    c->worker = NULL;
    w->conn = NULL;
    w->state = state;
    snprintf(w->why, sizeof w->why, "%s", why);
    if (state == SRV_W_LEFT)
        SRV_COUNT(s, worker_leaves, 1);
    else
        SRV_COUNT(s, worker_deaths, 1);
    PS_LOG(state == SRV_W_LEFT ? PS_LOG_INFO : PS_LOG_WARN, "worker shard %u/%u (%s) %s: %s; %llu pushes, clock %llu",
           w->shard, w->nshards, w->addr, state == SRV_W_LEFT ? "left" : "lost", why,
           (unsigned long long)w->pushes, (unsigned long long)w->clock);
    srv_dash_notice(s); /* a worker may leave and rejoin within a tick: two events */
    if (s->policy->worker_left(s, w) == SRV_WAKE)
        srv_answer_parked(s);
    if (s->model.has_layout && !s->model.initialized) {
        int connected = 0;
        for (uint32_t i = 0; i < s->nworkers_cap && !connected; i++)
            connected = s->workers[i] && s->workers[i]->state == SRV_W_CONNECTED;
        if (!connected) {
            /* nobody holds the layout and it has no values: the next
             * worker's hello proposes one again */
            PS_LOG(PS_LOG_INFO, "no worker left before the model got its initial values: its layout (%llu "
                                "parameters) is released",
                   (unsigned long long)s->model.layout.total);
            srv_model_release(&s->model);
            srv_plan_clear(&s->plan); /* it was for that model */
        }
    }
    if (!s->stopping && srv_work_stopped(s))
        last_worker_left(s);
}

/* Shard's record, as a worker lost for `why` that has no connection;
 * NULL (logged) out of memory: the shard is then still waited for. */
static srv_worker *record_lost(psd *s, uint32_t shard, const char *why)
{
    srv_worker *w = worker_slot(s, shard);
    if (!w) {
        PS_LOG(PS_LOG_ERROR, "out of memory recording shard %u as lost; it is still waited for", shard);
        return NULL;
    }
    w->shard = shard;
    w->nshards = (uint32_t)s->cfg.workers;
    w->state = SRV_W_LOST;
    w->last_seen_ms = srv_now_ms();
    snprintf(w->addr, sizeof w->addr, "-");
    snprintf(w->why, sizeof w->why, "%s", why);
    return w;
}

void srv_init_owner_done(psd *s)
{
    s->init_owner = NULL;
}

void srv_workers_forget(psd *s)
{
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        free(s->workers[i]);
        s->workers[i] = NULL;
    }
    s->nshards = 0;
    s->init_owner = NULL;
    s->said_memory_only = 0;
}

void srv_workers_out_restored(psd *s)
{
    srv_plan *pl = &s->plan;
    char why[96];
    snprintf(why, sizeof why, "out of the job at the checkpoint of version %llu",
             (unsigned long long)s->model.version);
    for (uint32_t i = 0; i < pl->nout; i++) {
        const srv_worker *w = record_lost(s, pl->out[i], why);
        if (w)
            PS_LOG(PS_LOG_INFO, "worker shard %u/%u is not waited for: %s; it may join again", w->shard,
                   w->nshards, why);
    }
    free(pl->out);
    pl->out = NULL;
    pl->nout = 0;
}

void srv_worker_never_joined(psd *s, uint32_t shard, const char *why)
{
    srv_worker *w = record_lost(s, shard, why);
    if (!w)
        return;
    SRV_COUNT(s, worker_deaths, 1);
    PS_LOG(PS_LOG_WARN, "worker shard %u/%u lost: %s", w->shard, w->nshards, why);
    srv_dash_notice(s);
    if (s->policy->worker_left(s, w) == SRV_WAKE)
        srv_answer_parked(s);
}

/* ---- shards that never join (bsp, ssp) ------------------------------------- */

/* continue: every missing shard is declared lost, as a worker that died. */
static void go_on(psd *s)
{
    char why[96];
    snprintf(why, sizeof why, "never joined within join_timeout (%.0f s)", (double)s->cfg.join_timeout / 1e3);
    uint32_t m = (uint32_t)s->cfg.workers;
    for (uint32_t i = 0; i < m; i++)
        if (i >= s->nworkers_cap || !s->workers[i])
            srv_worker_never_joined(s, i, why);
}

/* stop: every connected worker is told why, with an ERROR that ends its
 * connection, and recorded as left. Their waiting pulls are dropped first,
 * so that a round their leaving closes answers none of them; psd keeps
 * the model (and writes it to its state dir once the last has left). */
static void stop_job(psd *s, const char *names)
{
    char why[96], text[400];
    snprintf(why, sizeof why, "job stopped: %.60s never joined", names);
    snprintf(text, sizeof text,
             "the job stopped: %s never joined within join_timeout (%.0f s) and join_timeout_action is stop; "
             "start every worker of the job, or set join_timeout_action = continue to go on without the missing "
             "ones",
             names, (double)s->cfg.join_timeout / 1e3);
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->worker && !c->closing)
            srv_pulls_drop(c);
    for (srv_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (!c->worker || c->closing)
            continue;
        srv_conn_detach(c, SRV_W_LEFT, why);
        /* id 0: it ends the connection rather than answers one request */
        srv_send_error(c, 0, PS_ETIMEOUT, 1, "%s", text);
    }
}

void srv_join_tick(psd *s, uint64_t now)
{
    uint32_t miss[1];
    uint32_t n = srv_join_missing(s, miss, 1);
    if (n == 0) {
        s->join_since_ms = 0;
        s->join_warned_ms = 0;
        return;
    }
    if (!s->join_since_ms) {
        s->join_since_ms = now;
        return;
    }
    char names[200];
    srv_join_describe(s, names, sizeof names);
    uint64_t waited = now - s->join_since_ms, limit = s->cfg.join_timeout;
    uint32_t here = srv_join_present(s), m = (uint32_t)s->cfg.workers;
    int rounds = s->policy->rounds;
    if (limit && waited >= limit) {
        s->join_since_ms = 0;
        s->join_warned_ms = 0;
        if (s->cfg.join_timeout_action == PS_JOIN_STOP) {
            PS_LOG(PS_LOG_ERROR, "join_timeout (%.0f s): %s never joined; stopping the job "
                                 "(join_timeout_action = stop): %u worker%s told and disconnected; psd keeps "
                                 "the model",
                   (double)limit / 1e3, names, here, here == 1 ? "" : "s");
            stop_job(s, names);
        } else {
            PS_LOG(PS_LOG_WARN, "join_timeout (%.0f s): %s never joined; going on with %u of %u workers "
                                "(join_timeout_action = continue): the missing shards are declared lost and "
                                "their data shared by the others from their next epoch",
                   (double)limit / 1e3, names, here, m);
            go_on(s);
        }
        return;
    }
    uint64_t first = limit && limit / 2 < SRV_JOIN_WARN_FIRST_MS ? limit / 2 : SRV_JOIN_WARN_FIRST_MS;
    if (s->join_warned_ms ? now - s->join_warned_ms < SRV_JOIN_WARN_MS : waited < first)
        return;
    s->join_warned_ms = now;
    char then[160];
    if (limit)
        snprintf(then, sizeof then, "in %.0f s (join_timeout) psd %s", (double)(limit - waited) / 1e3,
                 s->cfg.join_timeout_action == PS_JOIN_STOP ? "stops the job" : "goes on without it");
    else
        snprintf(then, sizeof then, "join_timeout is 0: psd waits for ever");
    if (rounds)
        PS_LOG(PS_LOG_WARN, "BSP round %llu waits for %s (never joined): %u of %u workers present, waiting %.0f s; %s",
               (unsigned long long)s->model.version, names, here, m, (double)waited / 1e3, then);
    else
        PS_LOG(PS_LOG_WARN, "SSP waits for %s (never joined; no worker runs more than staleness %d clocks ahead of "
                            "it): %u of %u workers present, waiting %.0f s; %s",
               names, s->cfg.staleness, here, m, (double)waited / 1e3, then);
}

/* ---- hello ------------------------------------------------------------------ */

int srv_hello_precheck(const srv_conn *c, const ps_msg *m, char *err, size_t errlen)
{
    if (c->role != PS_ROLE_NONE) {
        snprintf(err, errlen, "hello sent twice");
        return PS_ESTATE;
    }
    if (m->proto != PS_PROTO_VERSION) {
        snprintf(err, errlen, "protocol version %u; this psd speaks version %u", m->proto, PS_PROTO_VERSION);
        return PS_EUNSUPPORTED;
    }
    return 0;
}

/* One tensor as "name[d0,d1]", or "(none)" past the layout's end. */
static void tensor_text(const ps_layout *l, uint32_t i, char *buf, size_t len)
{
    if (i >= l->ntensors) {
        snprintf(buf, len, "(none: %u tensors)", l->ntensors);
        return;
    }
    const ps_tensor_desc *t = &l->t[i];
    size_t pos = (size_t)snprintf(buf, len, "%s[", t->name);
    for (uint32_t d = 0; d < t->ndim && pos < len; d++)
        pos += (size_t)snprintf(buf + pos, len - pos, d ? ",%u" : "%u", t->dims[d]);
    if (pos < len)
        pos += (size_t)snprintf(buf + pos, len - pos, "]");
    if (t->buf && pos < len)
        snprintf(buf + pos, len - pos, " (a buffer: %s, %s)", ps_buf_name(t->buf), ps_save_dt_name(t->save_dt));
}

/* The refusal of a worker whose layout is not psd's: the first tensor
 * that differs (its place, psd's and the worker's), both parameter
 * counts, where psd's layout came from, and what to do. Bounded whatever
 * the layouts (a name is at most 63 bytes, a tensor 6 dims), so it is
 * never cut: a whole list of both layouts was, in the middle of psd's. */
static void layout_mismatch(const ps_layout *mine, const ps_layout *theirs, const char *from, char *err,
                            size_t errlen)
{
    uint32_t i = 0;
    while (i < mine->ntensors && i < theirs->ntensors) {
        const ps_tensor_desc *x = &mine->t[i], *y = &theirs->t[i];
        if (x->ndim != y->ndim || strcmp(x->name, y->name) != 0 ||
            memcmp(x->dims, y->dims, x->ndim * sizeof x->dims[0]) != 0 || x->buf != y->buf ||
            x->save_dt != y->save_dt)
            break;
        i++;
    }
    char a[160], b[160];
    tensor_text(mine, i, a, sizeof a);
    tensor_text(theirs, i, b, sizeof b);
    snprintf(err, errlen,
             "model layout mismatch at tensor %u: psd holds %s, this worker has %s (psd: %llu parameters in %u "
             "tensors, %s; this worker: %llu in %u). Start this worker with psd's model, or, to train another "
             "model on this psd, end the job: `psctl reset` (it sets the model aside and the next worker's becomes "
             "psd's)",
             i, a, b, (unsigned long long)mine->total, mine->ntensors, from, (unsigned long long)theirs->total,
             theirs->ntensors);
}

/* What a layout is, for parts_mismatch: "a part cut at NAME (N values)"
 * or "the whole model (N values)"; at most 63 + 48 bytes. */
static void part_text(const ps_layout *l, char *buf, size_t len)
{
    int piece = ps_layout_first_piece(l);
    if (piece >= 0)
        snprintf(buf, len, "a part cut at %s (%llu values)", l->t[piece].name, (unsigned long long)l->total);
    else
        snprintf(buf, len, "the whole model (%llu values)", (unsigned long long)l->total);
}

/* The refusal of a worker whose layout differs from psd's where one of
 * them is a part of a split model (PROTOCOL.md 6.2): the worker lists the
 * job's psd in another order, or leaves one out or adds one. Fits an
 * ERROR's 511 bytes whatever the names. */
static void parts_mismatch(const ps_layout *mine, const ps_layout *theirs, char *err, size_t errlen)
{
    char a[128], b[128];
    part_text(mine, a, sizeof a);
    part_text(theirs, b, sizeof b);
    snprintf(err, errlen,
             "this worker sends another part of the model than this psd's: psd holds %s, this worker sends %s. "
             "Every worker of a model split over several psd lists all of the job's psd in the job's order (part "
             "i on the i-th): this one lists them in another order, or leaves one out or adds one",
             a, b);
}

/* A reader's hello (PROTOCOL.md 15): on the leader or a follower, once the
 * model has its layout and values there, with that layout. */
static int reader_check(const psd *s, const ps_msg *m, char *err, size_t errlen)
{
    if (s->cfg.hogwild)
        return ps_fail(err, errlen, PS_EUNSUPPORTED, "a reader cannot join a Hogwild! job (hogwild = on): its "
                       "workers step in psd's memory; pull as an admin (psctl save) instead");
    if (!s->model.has_layout || !s->model.initialized)
        return ps_fail(err, errlen, PS_ENOT_READY, "%s: a reader pulls a model that has values; ask again",
                       s->follow ? "this follower has no snapshot of its leader yet"
                                 : "the model has no values yet (no worker has sent them)");
    (void)m;
    return 0;
}

/* The layout check of a worker's hello against the model's, if it has one. */
static int layout_check(const psd *s, const ps_msg *m, char *err, size_t errlen)
{
    if (!m->layout)
        return 0;
    if (s->model.has_layout && !ps_layout_equal(&s->model.layout, m->layout)) {
        /* where psd's layout comes from says what to change */
        char from[PS_CONFIG_PATH_MAX + 160];
        if (s->model_file[0])
            snprintf(from, sizeof from, "from %.300s (init_from; start psd without it, or the workers with that model)",
                     s->model_file);
        else if (s->resumed_from[0])
            snprintf(from, sizeof from, "from the checkpoint %.300s (start psd with --fresh to begin anew)",
                     s->resumed_from);
        else if (s->follow)
            snprintf(from, sizeof from, "from the leader %.300s", s->cfg.replica_of);
        else
            snprintf(from, sizeof from, "from the job's first worker");
        if (ps_layout_first_piece(&s->model.layout) >= 0 || ps_layout_first_piece(m->layout) >= 0)
            parts_mismatch(&s->model.layout, m->layout, err, errlen);
        else
            layout_mismatch(&s->model.layout, m->layout, from, err, errlen);
        return PS_ELAYOUT;
    }
    return 0;
}

int srv_hello_check(const psd *s, const srv_conn *c, const ps_msg *m, char *err, size_t errlen)
{
    int rc = srv_hello_precheck(c, m, err, errlen);
    if (rc != 0 || m->role != PS_ROLE_WORKER)
        return rc;
    if ((m->has2 & PS_F2_READER) && m->reader) {
        rc = reader_check(s, m, err, errlen);
        return rc ? rc : layout_check(s, m, err, errlen);
    }
    if (s->coord.handing_back)
        return ps_fail(err, errlen, PS_ESHUTDOWN, "this psd is stopping and hands part %d to a follower: workers "
                       "push to the part's next leader", s->cfg.part);
    if (s->follow)
        return ps_fail(err, errlen, PS_ENOT_LEADER,
                       "this psd is a follower of %s (a replica): workers push to the leader; `psctl promote` "
                       "makes this one lead", s->follow->leader);
    /* a worker taken now would be left waiting on a psd that turns out to
     * follow (its pushes are acknowledged only under a lease) */
    if (s->coord.role == SRV_COORD_STARTING)
        return ps_fail(err, errlen, PS_ENOT_LEADER,
                       "this psd does not know yet whether it leads part %d: it asks the coordinator (etcd); "
                       "workers push to the part's leader", s->cfg.part);
    if (s->policy->rounds && m->nshards != (uint32_t)s->cfg.workers) {
        snprintf(err, errlen, "shard %u/%u: this psd runs BSP rounds of %d workers; start workers with --shard K/%d",
                 m->shard, m->nshards, s->cfg.workers, s->cfg.workers);
        return PS_ESHARD;
    }
    if (m->shard < s->nworkers_cap && s->workers[m->shard] && s->workers[m->shard]->state == SRV_W_CONNECTED) {
        snprintf(err, errlen, "shard %u is already connected from %s", m->shard, s->workers[m->shard]->addr);
        return PS_ESHARD;
    }
    if (!m->layout) {
        /* a part that holds no dense values (PROTOCOL.md 18) */
        if (!srv_parts_table_only(&s->parts))
            return ps_fail(err, errlen, PS_ELAYOUT, "hello: no layout, but this psd holds a part of the dense model "
                           "(it is among the first `dense` parts of its map, or holds no map): send its layout");
        return 0;
    }
    if (!s->model.has_layout && m->layout->total > s->cfg.max_params) {
        snprintf(err, errlen,
                 "a model of %llu parameters is over this psd's max_params (%llu); raise max_params in psd.conf if "
                 "it is meant",
                 (unsigned long long)m->layout->total, (unsigned long long)s->cfg.max_params);
        return PS_ELIMIT;
    }
    if (s->cfg.hogwild && !s->model.has_layout && m->layout->total > SRV_SHM_MAX_PARAMS) {
        snprintf(err, errlen,
                 "a Hogwild! job's model lives in one shared segment of at most %llu values; this worker's has %llu "
                 "(hogwild = on in psd's configuration)",
                 (unsigned long long)SRV_SHM_MAX_PARAMS, (unsigned long long)m->layout->total);
        return PS_ELIMIT;
    }
    return layout_check(s, m, err, errlen);
}

int srv_hello_join(srv_conn *c, const ps_msg *m, int *need_init, char *err, size_t errlen)
{
    psd *s = c->srv;
    *need_init = 0;
    if (m->role != PS_ROLE_WORKER) {
        PS_LOG(PS_LOG_DEBUG, "conn %llu (%s): admin client", (unsigned long long)c->cid, c->addr);
        c->role = m->role;
        return 0;
    }
    /* the worker's segment first: a Hogwild! job that takes only workers
     * on its machine refuses the others before anything of them is kept */
    if ((m->has & PS_F_SHM) && m->layout) {
        char why[160];
        uint64_t total = s->model.has_layout ? s->model.layout.total : m->layout->total;
        if (!c->same_host)
            snprintf(why, sizeof why, "the worker is not on psd's machine");
        if (c->same_host && srv_shm_attach(c, m, total, why, sizeof why) == 0)
            PS_LOG(PS_LOG_INFO, "shard %u (%s): tensors through shared memory (pid %u)", m->shard, c->addr,
                   m->shm_pid);
        else
            PS_LOG(PS_LOG_INFO, "shard %u (%s): shared memory not used, tensors over TCP: %s", m->shard, c->addr,
                   why);
    }
    if (m->has & PS_F_TSHM) {
        char why[160];
        if (!c->same_host)
            snprintf(why, sizeof why, "the worker is not on psd's machine");
        if (c->same_host && srv_tshm_attach(c, m, why, sizeof why) == 0)
            PS_LOG(PS_LOG_INFO, "shard %u (%s): table rows through shared memory (pid %u, %zu bytes)", m->shard,
                   c->addr, m->tshm.pid, c->tseg_len);
        else
            PS_LOG(PS_LOG_INFO, "shard %u (%s): table segment not used, rows over TCP: %s", m->shard, c->addr, why);
    }
    if ((m->has2 & PS_F2_READER) && m->reader) {
        /* a reader: no shard of the job, no worker record, no pushes
         * (dispatch refuses them); its pulls are answered as a worker's */
        c->reader = 1;
        c->role = m->role;
        PS_LOG(PS_LOG_INFO, "reader joined from %s at model version %llu%s", c->addr,
               (unsigned long long)s->model.version, s->follow ? " (this psd is a follower)" : "");
        return 0;
    }
    if (s->cfg.hogwild && s->cfg.hogwild_remote == PS_HOGWILD_REMOTE_REFUSE && !c->shm) {
        snprintf(err, errlen, "this Hogwild! job takes only workers on psd's machine (hogwild_remote = refuse): "
                              "shard %u could not share psd's memory (%s)",
                 m->shard, !(m->has & PS_F_SHM) ? "it offered no shared segment: shm off?" :
                           c->same_host ? "its segment was not mapped: psd's log says why" : "another machine");
        return PS_EFORBIDDEN;
    }
    if (!s->model.has_layout && m->layout) {
        /* proposed: memory is taken at INIT, and a proposer that leaves
         * before it leaves nothing (srv_conn_detach) */
        srv_model_propose(&s->model, m->layout);
        char mine[512];
        ps_layout_describe(&s->model.layout, mine, sizeof mine);
        PS_LOG(PS_LOG_INFO, "model layout from shard %u (%s): %llu parameters: %s", m->shard, c->addr,
               (unsigned long long)s->model.layout.total, mine);
    }
    /* Hogwild!: the segment exists from the first hello, so that the
     * WELCOME can name it (at most 4 MiB; released as a proposal is) */
    if (s->cfg.hogwild && !s->model.blk && srv_model_commit(&s->model, &s->cfg) != 0) {
        srv_shm_detach(c);
        snprintf(err, errlen, "out of memory (or memfds) for the Hogwild! segment of %llu values",
                 (unsigned long long)s->model.layout.total);
        return PS_ENOMEM;
    }
    if (!s->model.initialized && !s->init_owner && m->layout) {
        s->init_owner = c;
        *need_init = 1;
    }
    /* local SGD: a plan's rounds are global batches, a round here is H
     * local steps of each worker; the workers count their own epochs */
    if ((m->has & PS_F_PLAN) && s->policy->plan && s->cfg.local_steps > 0 && !s->plan.set)
        PS_LOG(PS_LOG_DEBUG, "shard %u proposed a plan: ignored with local_steps", m->shard);
    if ((m->has & PS_F_PLAN) && s->policy->plan && s->cfg.local_steps == 0) {
        const ps_plan *p = &m->plan, *q = &s->plan.p;
        if (!s->plan.set) {
            srv_plan_fix(&s->plan, p);
            PS_LOG(PS_LOG_INFO, "plan from shard %u: %llu epochs of %llu samples, %llu per round (%llu rounds an "
                                "epoch, %llu in all), seed %llu",
                   m->shard, (unsigned long long)p->epochs, (unsigned long long)p->samples,
                   (unsigned long long)p->batch, (unsigned long long)s->plan.per_epoch,
                   (unsigned long long)s->plan.rounds, (unsigned long long)p->seed);
        } else if (memcmp(p, q, sizeof *p) != 0) {
            PS_LOG(PS_LOG_WARN, "shard %u's plan (%llu epochs, %llu samples, %llu per round, seed %llu) is not the "
                                "job's (%llu, %llu, %llu, seed %llu): the job's stands, and the worker is told it",
                   m->shard, (unsigned long long)p->epochs, (unsigned long long)p->samples,
                   (unsigned long long)p->batch, (unsigned long long)p->seed, (unsigned long long)q->epochs,
                   (unsigned long long)q->samples, (unsigned long long)q->batch, (unsigned long long)q->seed);
        }
    }
    srv_worker *w = worker_slot(s, m->shard);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    int rejoin = w->joined_ms != 0;
    if (!rejoin && m->shard < s->nrestored)
        w->clock = s->restored_clocks[m->shard];
    SRV_COUNT(s, worker_joins, 1);
    w->shard = m->shard;
    w->nshards = m->nshards;
    w->state = SRV_W_CONNECTED;
    w->conn = c;
    snprintf(w->addr, sizeof w->addr, "%s", c->addr);
    w->joined_ms = w->last_seen_ms = srv_now_ms();
    w->plan_from = 0; /* until it says it rejoins at a later round */
    c->worker = w;
    s->nshards = m->nshards;
    PS_LOG(PS_LOG_INFO, "worker shard %u/%u %s from %s at model version %llu", m->shard, m->nshards,
           rejoin ? "rejoined" : "joined", c->addr, (unsigned long long)s->model.version);
    srv_dash_notice(s);
    if (s->policy->worker_joined(s, w) == SRV_WAKE)
        srv_answer_parked(s);
    w->shm = c->shm != NULL;
    w->tshm = c->tseg != NULL;
    c->client_id = (m->has2 & PS_F2_CID) ? m->cid : 0; /* its pushes' ids are recorded (pushid.c) */
    c->role = m->role;
    return 0;
}

void srv_hello_welcome(srv_conn *c, uint64_t id, int need_init, const uint8_t *sproof)
{
    psd *s = c->srv;
    ps_msg r;
    ps_msg_init(&r, PS_MSG_WELCOME);
    r.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT;
    r.id = id;
    r.proto = PS_PROTO_VERSION;
    snprintf(r.mode, sizeof r.mode, "%s", s->policy->name);
    r.mver = s->model.version;
    r.params = s->model.has_layout ? s->model.layout.total : 0;
    r.workers = (uint32_t)s->cfg.workers;
    r.need_init = need_init;
    r.has |= PS_F_HB;
    r.hb = s->cfg.heartbeat_timeout;
    if (s->policy->piece && (r.piece = s->policy->piece(s)) != 0)
        r.has |= PS_F_PIECE;
    /* the part's replicas as workers reach them, this leader first (PROTOCOL.md 15) */
    char self[sizeof s->cfg.advertise];
    if (s->replog) {
        if (s->cfg.advertise[0])
            snprintf(self, sizeof self, "%s", s->cfg.advertise);
        else
            snprintf(self, sizeof self, "%s:%d", s->cfg.listen.host, s->port);
        r.replicas[r.nreplicas++] = (ps_str){self, (uint32_t)strlen(self)};
        for (int i = 0; i < SRV_FOLLOWERS_MAX && r.nreplicas < PS_REPLICAS_MAX; i++)
            if (s->replog->f[i].used)
                r.replicas[r.nreplicas++] = (ps_str){s->replog->f[i].addr, (uint32_t)strlen(s->replog->f[i].addr)};
        if (r.nreplicas > 1)
            r.has2 |= PS_F2_REPLICAS;
        else
            r.nreplicas = 0;
    }
    if (s->cfg.local_steps > 0) { /* local SGD (PROTOCOL.md section 8) */
        r.has |= PS_F_LOCAL;
        r.local = (uint32_t)s->cfg.local_steps;
    }
    if (s->cfg.elastic_alpha > 0) { /* elastic averaging */
        r.has |= PS_F_ALPHA | PS_F_TAU;
        r.alpha = s->cfg.elastic_alpha;
        r.tau = (uint32_t)s->cfg.elastic_tau;
    }
    if (c->shm) {
        r.has |= PS_F_INSHM;
        r.inshm = 1;
        if (s->model.hw && c->role == PS_ROLE_WORKER) {
            /* Hogwild!: the model itself, to step in */
            r.has |= PS_F_HOGWILD | PS_F_LR;
            r.hw = (ps_pidfd){(uint32_t)getpid(), (uint32_t)s->model.hw->hw_fd};
            r.lr = s->cfg.lr;
        }
    }
    if (c->tseg) {
        r.has |= PS_F_TINSHM;
        r.tinshm = 1;
    }
    /* float32 without its zeros, and compressed, is float32 bit for bit:
     * always offered */
    r.has |= PS_F_WIRE;
    r.wire = PS_WIRE_BIT(PS_DT_F32Z) | PS_WIRE_BIT(PS_DT_F32ZSTD) | (s->cfg.wire_bf16 ? PS_WIRE_BIT(PS_DT_BF16) : 0);
    if (s->model.has_layout) {
        r.has |= PS_F_FP;
        r.fp = s->model.fp;
        if (c->role == PS_ROLE_ADMIN) {
            /* an admin learns the tensors' names and shapes (psctl save) */
            r.has |= PS_F_LAYOUT;
            r.layout = &s->model.layout;
        }
    }
    if (s->plan.set) {
        r.has |= PS_F_PLAN; /* the job's, which the worker follows */
        r.plan = s->plan.p;
        if (c->worker && srv_plan_first_round(s, c->worker, &r.base))
            r.has |= PS_F_BASE; /* the first round it trains */
    }
    srv_parts_put(&s->parts, &r, 0); /* the part map, once psd holds one (PROTOCOL.md 18) */
    if (sproof) {
        r.has |= PS_F_SPROOF; /* psd holds the secret too */
        memcpy(r.sproof, sproof, sizeof r.sproof);
    }
    srv_send(c, &r, NULL);
}

int srv_hello_accept(srv_conn *c, const ps_msg *m, const uint8_t *sproof, char *err, size_t errlen)
{
    int need_init;
    int rc = srv_hello_check(c->srv, c, m, err, errlen);
    if (rc == 0)
        rc = srv_hello_join(c, m, &need_init, err, errlen);
    if (rc != 0)
        return rc;
    srv_hello_welcome(c, m->id, need_init, sproof);
    return 0;
}
