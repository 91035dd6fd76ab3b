/* handle.c - one handler per message type. Each first checks that the
 * connection may send it (handshake done, role, model state), then acts and
 * queues exactly one reply (or parks a pull that will get one later). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "common/log.h"
#include "common/vec.h"
#include "dashboard.h"
#include "proto/errors.h"
#include "psd.h"

static void reply_ok(srv_conn *c, uint64_t id)
{
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER;
    r.id = id;
    r.mver = c->srv->model.version;
    srv_send(c, &r, NULL);
}

/* ---- pulls ---------------------------------------------------------------- */

/* Answers a pull with [off, off+len) of blocks blk at model version ver:
 * the model's current blocks, or a pinned snapshot's. */
static void send_params(srv_conn *c, srv_blk *const *blk, uint64_t ver, uint64_t id, uint64_t off, uint64_t len,
                        uint32_t rdt)
{
    psd *s = c->srv;
    ps_msg r;
    ps_msg_init(&r, PS_MSG_PARAMS);
    r.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    if (rdt != PS_DT_F32 && rdt != SRV_RDT_SHM) {
        r.has |= PS_F_DT; /* srv_send converts from the blocks */
        r.dt = rdt;
    }
    r.id = id;
    r.mver = ver;
    r.off = off;
    r.ndata = len;
    s->stats.pulls++;
    if (rdt == SRV_RDT_SHM) {
        /* into the worker's segment, after its gradient half; the reply
         * only says where */
        float *dst = c->shm_out + off;
        for (uint64_t done = 0; done < len;) {
            size_t n;
            const float *src = srv_blocks_at(blk, off + done, len - done, &n);
            memcpy(dst + done, src, n * sizeof(float));
            done += n;
        }
        r.has = (r.has & ~(uint64_t)(PS_F_DATA | PS_F_DT)) | PS_F_LEN | PS_F_INSHM;
        r.len = len;
        r.inshm = 1;
        r.ndata = 0;
    }
    srv_worker *w = c->worker;
    if (w && s->cfg.dc_lambda > 0 && s->cfg.mode == PS_MODE_ASGD && blk == s->model.blk &&
        (!w->base_snap || w->base_snap->version != ver)) {
        /* DC-ASGD: what this worker computes its next gradient against */
        srv_snap *snap = srv_snap_take(&s->model);
        if (snap) {
            srv_snap_unref(w->base_snap);
            w->base_snap = snap;
        }
    }
    srv_send(c, &r, rdt == SRV_RDT_SHM ? NULL : blk);
}

static void send_current(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint32_t rdt)
{
    send_params(c, c->srv->model.blk, c->srv->model.version, id, off, len, rdt);
}

/* Parked pulls come and go every BSP round: freed ones are kept for reuse
 * (at most PARKED_SPARE), so parking allocates nothing in steady state. */
#define PARKED_SPARE 256
static srv_parked *parked_spare;
static unsigned nparked_spare;

static srv_parked *parked_get(void)
{
    srv_parked *p = parked_spare;
    if (!p)
        return malloc(sizeof *p);
    parked_spare = p->next;
    nparked_spare--;
    return p;
}

static void parked_put(srv_parked *p)
{
    if (nparked_spare >= PARKED_SPARE) {
        free(p);
        return;
    }
    p->next = parked_spare;
    parked_spare = p;
    nparked_spare++;
}

void srv_parked_free_spare(void)
{
    while (parked_spare) {
        srv_parked *p = parked_spare;
        parked_spare = p->next;
        free(p);
    }
    nparked_spare = 0;
}

static int pull_ready(srv_conn *c, uint64_t min)
{
    psd *s = c->srv;
    if (s->paused && c->role == PS_ROLE_WORKER)
        return 0; /* ADMIN pause: held until resume */
    if (s->policy->pull_ready)
        return s->policy->pull_ready(s, c, min);
    return s->model.initialized && s->model.version >= min;
}

/* 0 when psd may answer in element type rdt; else sends UNSUPPORTED. */
static int check_rdt(srv_conn *c, uint64_t id, uint32_t rdt)
{
    if (rdt == PS_DT_F32 || rdt == SRV_RDT_SHM || c->srv->cfg.wire_bf16)
        return 0;
    srv_send_error(c, id, PS_EUNSUPPORTED, 0, "parameters as %s refused: this psd sends float32 only "
                                              "(wire_bf16 = no); its welcome did not offer %s; nothing was changed",
                   ps_dtype_name(rdt), ps_dtype_name(rdt));
    return -1;
}

static void do_pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt)
{
    psd *s = c->srv;
    uint64_t total = s->model.layout.total;
    if (check_rdt(c, id, rdt) != 0)
        return;
    if (!s->model.has_layout) {
        srv_send_error(c, id, PS_ENOT_READY, 0, "no model yet: the first worker has not said hello");
        return;
    }
    if (len == 0 || off > total || len > total - off) {
        srv_send_error(c, id, PS_ERANGE, 0, "pull range [%llu, %llu) is outside the model's %llu parameters",
                       (unsigned long long)off, (unsigned long long)(off + len), (unsigned long long)total);
        return;
    }
    if (c->pinned) {
        /* ADMIN pin: that version, whatever min says */
        send_params(c, c->pinned->blk, c->pinned->version, id, off, len, rdt);
        return;
    }
    /* an earlier pull for this version or an older one still waits: this
     * one waits behind it, so that their replies leave in request order
     * (it may be ready already when the earlier one's version has just
     * come and the waiting pulls are about to be answered) */
    int behind = 0;
    for (const srv_parked *p = c->parked; p && !behind; p = p->next)
        behind = p->min <= min;
    if (!behind && pull_ready(c, min)) {
        send_current(c, id, off, len, rdt);
        return;
    }
    if (c->nparked >= SRV_PARKED_MAX) {
        srv_send_error(c, id, PS_ELIMIT, 0, "more than %d pulls already waiting on this connection",
                       SRV_PARKED_MAX);
        return;
    }
    srv_parked *p = parked_get();
    if (!p) {
        srv_send_error(c, id, PS_ENOMEM, 0, "out of memory parking a pull");
        return;
    }
    *p = (srv_parked){.id = id, .min = min, .off = off, .len = len, .rdt = rdt};
    /* append, so replies leave in request order (the list is short: at
     * most SRV_PARKED_MAX) */
    srv_parked **tail = &c->parked;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    c->nparked++;
    if (behind && !s->applying)
        srv_conn_answer_parked(c);
}

void srv_conn_answer_parked(srv_conn *c)
{
    srv_parked **pp = &c->parked;
    while (!c->closing && *pp) { /* closing frees the list: test it first */
        srv_parked *p = *pp;
        if (!pull_ready(c, p->min)) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        c->nparked--;
        c->last_msg_ms = srv_now_ms(); /* an admin's idleness counts from now */
        if (c->worker)
            c->worker->last_seen_ms = srv_now_ms(); /* its silence counts from now */
        send_current(c, p->id, p->off, p->len, p->rdt);
        parked_put(p);
    }
}

void srv_answer_parked(psd *s)
{
    if (s->applying)
        return; /* the blocks are being written: the update's end answers them */
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->parked && !c->closing)
            srv_conn_answer_parked(c);
}

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
        if (s->workers[shard])
            s->workers[shard]->round = UINT64_MAX;
    }
    return s->workers[shard];
}

void srv_conn_detach(srv_conn *c, int state, const char *why)
{
    psd *s = c->srv;
    while (c->parked) {
        srv_parked *p = c->parked;
        c->parked = p->next;
        parked_put(p);
    }
    c->nparked = 0;
    srv_snap_unref(c->pinned);
    c->pinned = NULL;
    srv_auth_free(c);
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
    srv_snap_unref(w->base_snap);
    w->base_snap = NULL;
    if (state == SRV_W_LEFT)
        s->stats.worker_leaves++;
    else
        s->stats.worker_deaths++;
    PS_LOG(state == SRV_W_LEFT ? PS_LOG_INFO : PS_LOG_WARN, "worker shard %u/%u (%s) %s: %s; %llu pushes, clock %llu",
           w->shard, w->nshards, w->addr, state == SRV_W_LEFT ? "left" : "lost", why,
           (unsigned long long)w->pushes, (unsigned long long)w->clock);
    s->policy->worker_left(s, w);
}

/* ---- hello ------------------------------------------------------------------ */

void srv_hello_accept(srv_conn *c, ps_msg *m, const uint8_t *sproof)
{
    psd *s = c->srv;
    int need_init = 0;
    if (c->role != PS_ROLE_NONE) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "hello sent twice");
        return;
    }
    if (m->proto != PS_PROTO_VERSION) {
        srv_send_error(c, m->id, PS_EUNSUPPORTED, 1, "protocol version %u; this psd speaks version %u",
                       m->proto, PS_PROTO_VERSION);
        return;
    }
    if (m->role == PS_ROLE_WORKER) {
        char mine[512], theirs[512];
        if (s->cfg.mode == PS_MODE_BSP && m->nshards != (uint32_t)s->cfg.workers) {
            srv_send_error(c, m->id, PS_ESHARD, 1,
                           "shard %u/%u: this psd runs BSP rounds of %d workers; start workers with --shard "
                           "K/%d",
                           m->shard, m->nshards, s->cfg.workers, s->cfg.workers);
            return;
        }
        if (m->shard < s->nworkers_cap && s->workers[m->shard] &&
            s->workers[m->shard]->state == SRV_W_CONNECTED) {
            srv_send_error(c, m->id, PS_ESHARD, 1, "shard %u is already connected from %s", m->shard,
                           s->workers[m->shard]->addr);
            return;
        }
        if (!s->model.has_layout && m->layout->total > s->cfg.max_params) {
            srv_send_error(c, m->id, PS_ELIMIT, 1,
                           "a model of %llu parameters is over this psd's max_params (%llu); raise max_params "
                           "in psd.conf if it is meant",
                           (unsigned long long)m->layout->total, (unsigned long long)s->cfg.max_params);
            return;
        }
        if (!s->model.has_layout) {
            int rc = srv_model_set_layout(&s->model, m->layout, &s->cfg);
            if (rc != 0) {
                srv_send_error(c, m->id, rc, 1, "cannot hold a model of %llu parameters: %s",
                               (unsigned long long)m->layout->total, ps_strerror(rc));
                return;
            }
            ps_layout_describe(&s->model.layout, mine, sizeof mine);
            PS_LOG(PS_LOG_INFO, "model layout from shard %u (%s): %llu parameters: %s", m->shard, c->addr,
                   (unsigned long long)s->model.layout.total, mine);
        } else if (!ps_layout_equal(&s->model.layout, m->layout)) {
            ps_layout_describe(&s->model.layout, mine, sizeof mine);
            ps_layout_describe(m->layout, theirs, sizeof theirs);
            srv_send_error(c, m->id, PS_ELAYOUT, 1,
                           "model layout mismatch: psd holds %llu parameters (%s), this worker has %llu (%s)",
                           (unsigned long long)s->model.layout.total, mine, (unsigned long long)m->layout->total,
                           theirs);
            return;
        }
        if (!s->model.initialized && !s->init_owner) {
            s->init_owner = c;
            need_init = 1;
        }
        srv_worker *w = worker_slot(s, m->shard);
        if (!w) {
            srv_send_error(c, m->id, PS_ENOMEM, 1, "out of memory");
            return;
        }
        int rejoin = w->joined_ms != 0;
        if (!rejoin && m->shard < s->nrestored)
            w->clock = s->restored_clocks[m->shard];
        s->stats.worker_joins++;
        w->shard = m->shard;
        w->nshards = m->nshards;
        w->state = SRV_W_CONNECTED;
        w->conn = c;
        snprintf(w->addr, sizeof w->addr, "%s", c->addr);
        w->joined_ms = w->last_seen_ms = srv_now_ms();
        c->worker = w;
        s->nshards = m->nshards;
        PS_LOG(PS_LOG_INFO, "worker shard %u/%u %s from %s at model version %llu", m->shard, m->nshards,
               rejoin ? "rejoined" : "joined", c->addr, (unsigned long long)s->model.version);
        s->policy->worker_joined(s, w);
        if (m->has & PS_F_SHM) {
            char why[160];
            if (!c->same_host)
                snprintf(why, sizeof why, "the worker is not on psd's machine");
            if (c->same_host && srv_shm_attach(c, m, s->model.layout.total, why, sizeof why) == 0)
                PS_LOG(PS_LOG_INFO, "shard %u (%s): tensors through shared memory (pid %u)", m->shard, c->addr,
                       m->shm_pid);
            else
                PS_LOG(PS_LOG_INFO, "shard %u (%s): shared memory not used, tensors over TCP: %s", m->shard,
                       c->addr, why);
        }
        w->shm = c->shm != NULL;
    } else {
        PS_LOG(PS_LOG_DEBUG, "conn %llu (%s): admin client", (unsigned long long)c->cid, c->addr);
    }
    c->role = m->role;

    ps_msg r;
    ps_msg_init(&r, PS_MSG_WELCOME);
    r.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT;
    r.id = m->id;
    r.proto = PS_PROTO_VERSION;
    snprintf(r.mode, sizeof r.mode, "%s", s->policy->name);
    r.mver = s->model.version;
    r.params = s->model.has_layout ? s->model.layout.total : 0;
    r.workers = (uint32_t)s->cfg.workers;
    r.need_init = need_init;
    r.has |= PS_F_HB;
    r.hb = s->cfg.heartbeat_timeout;
    if (c->shm) {
        r.has |= PS_F_INSHM;
        r.inshm = 1;
    }
    if (s->cfg.wire_bf16) {
        r.has |= PS_F_WIRE;
        r.wire = PS_WIRE_BIT(PS_DT_BF16);
    }
    if (s->model.has_layout) {
        r.has |= PS_F_FP;
        r.fp = s->model.fp;
        if (c->role == PS_ROLE_ADMIN) {
            /* an admin learns the tensors' names and shapes (psctl save) */
            r.has |= PS_F_LAYOUT;
            r.layout = &s->model.layout;
        }
    }
    if (sproof) {
        r.has |= PS_F_SPROOF; /* psd holds the secret too */
        memcpy(r.sproof, sproof, sizeof r.sproof);
    }
    srv_send(c, &r, NULL);
}

/* A hello: accepted at once, or, when psd requires a token, kept until the
 * AUTH that answers its CHALLENGE (auth.c). Nothing of the job (shards,
 * layout) is checked or told before that. */
static void handle_hello(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    if (c->role != PS_ROLE_NONE) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "hello sent twice");
        return;
    }
    if (m->proto != PS_PROTO_VERSION) {
        srv_send_error(c, m->id, PS_EUNSUPPORTED, 1, "protocol version %u; this psd speaks version %u",
                       m->proto, PS_PROTO_VERSION);
        return;
    }
    if (s->token.len)
        srv_auth_challenge(c, m);
    else
        srv_hello_accept(c, m, NULL);
}

/* ---- init, push, pull --------------------------------------------------------- */

/* nonfinite = clip: NaN becomes 0, +-inf +-FLT_MAX, and the push is scaled
 * down to the L2 norm clip_norm (> 0, checked at start and reload). In
 * place: m->data points into the connection's receive buffer, which is
 * writable (the decoder may already have moved the floats there to align
 * them) and holds this frame only until its handler returns. The norm is
 * taken in double, where FLT_MAX squared does not overflow. */
static void sanitize_push(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    float *g = (float *)(uintptr_t)m->data;
    size_t bad = 0;
    for (uint64_t i = 0; i < m->ndata; i++) {
        if (isnan(g[i]))
            g[i] = 0.0f, bad++;
        else if (isinf(g[i]))
            g[i] = g[i] > 0 ? FLT_MAX : -FLT_MAX, bad++;
    }
    double norm = sqrt(ps_vec_sumsq(g, m->ndata));
    if (norm > s->cfg.clip_norm) {
        double f = s->cfg.clip_norm / norm;
        for (uint64_t i = 0; i < m->ndata; i++)
            g[i] = (float)(g[i] * f);
    }
    s->stats.sanitized_pushes++;
    PS_LOG(PS_LOG_INFO, "conn %llu (%s): %s for [%llu, %llu) held %zu NaN or infinite values: sanitised "
                        "(nonfinite = clip), norm %g -> %g",
           (unsigned long long)c->cid, c->addr, ps_msg_type_name(m->type), (unsigned long long)m->off,
           (unsigned long long)(m->off + m->ndata), bad, norm, norm > s->cfg.clip_norm ? s->cfg.clip_norm : norm);
}

/* bfloat16 data becomes float32 in the connection's own buffer, where m
 * then points: everything after this sees float32 only. *finite tells
 * whether every value is finite (checked on the way). */
static int widen(srv_conn *c, ps_msg *m, int *finite)
{
    psd *s = c->srv;
    if (!s->cfg.wire_bf16) {
        srv_send_error(c, m->id, PS_EUNSUPPORTED, 0, "%s with bfloat16 data refused: this psd takes float32 only "
                                                     "(wire_bf16 = no); its welcome did not offer bf16",
                       ps_msg_type_name(m->type));
        return -1;
    }
    if (c->wide_cap < m->ndata) {
        /* bounded by the model's size (the range is checked first) */
        float *p = realloc(c->wide, (size_t)m->ndata * sizeof(float));
        if (!p) {
            srv_send_error(c, m->id, PS_ENOMEM, 0, "no memory to widen %llu bfloat16 values",
                           (unsigned long long)m->ndata);
            return -1;
        }
        c->wide = p;
        c->wide_cap = (size_t)m->ndata;
    }
    *finite = ps_bf16_to_f32_finite(c->wide, m->data16, (size_t)m->ndata);
    m->data = c->wide;
    m->data16 = NULL;
    m->dt = PS_DT_F32;
    return 0;
}

static int check_data(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    uint64_t total = s->model.layout.total;
    int finite = -1; /* not known yet */
    if (m->off > total || m->ndata > total - m->off || m->ndata == 0) {
        srv_send_error(c, m->id, PS_ERANGE, 0, "%s range [%llu, %llu) is outside the model's %llu parameters",
                       ps_msg_type_name(m->type), (unsigned long long)m->off,
                       (unsigned long long)(m->off + m->ndata), (unsigned long long)total);
        return -1;
    }
    /* widened only once the range is known to fit: the buffer then never
     * grows beyond the model */
    if (m->dt == PS_DT_BF16 && widen(c, m, &finite) != 0)
        return -1;
    if (finite < 0)
        finite = ps_vec_all_finite(m->data, m->ndata);
    if (!finite) {
        if (m->type != PS_MSG_INIT && s->cfg.nonfinite == PS_NONFINITE_CLIP) {
            sanitize_push(c, m);
            return 0;
        }
        srv_send_error(c, m->id, PS_ENONFINITE, 0, "%s for [%llu, %llu) contains NaN or infinity; rejected, the "
                                                   "model is unchanged",
                       ps_msg_type_name(m->type), (unsigned long long)m->off,
                       (unsigned long long)(m->off + m->ndata));
        return -1;
    }
    return 0;
}

static void handle_init(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    if (s->model.initialized || s->init_owner != c) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "init refused: %s",
                       s->model.initialized ? "the model already has its values" : "another worker is initialising it");
        return;
    }
    if (check_data(c, m) != 0)
        return;
    for (uint64_t done = 0; done < m->ndata;) {
        srv_wseg seg;
        if (srv_model_write_begin(&s->model, m->off + done, m->ndata - done, &seg) != 0) {
            srv_send_error(c, m->id, PS_ENOMEM, 0, "out of memory");
            return;
        }
        memcpy(seg.wo, m->data + done, seg.len * sizeof(float));
        srv_model_write_end(&s->model, &seg);
        done += seg.len;
    }
    if (m->fin) {
        s->model.initialized = 1;
        s->init_owner = NULL;
        s->stats.init_ms = srv_now_ms();
        PS_LOG(PS_LOG_INFO, "model initialised by shard %u (%s)", c->worker->shard, c->addr);
    }
    reply_ok(c, m->id);
    if (m->fin)
        srv_answer_parked(s);
}

/* A pushpull whose gradient is in the worker's segment: copied into the
 * connection's own buffer first (the worker could change it while psd
 * checks and applies it), where m then points as for a TCP push; the
 * reply goes into the segment too (SRV_RDT_SHM). */
static int push_from_shm(srv_conn *c, ps_msg *m)
{
    uint64_t n = c->shm_params;
    if (!c->shm) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "%s with 'inshm' refused: this connection has no shared segment "
                                               "(psd's welcome did not say inshm)",
                       ps_msg_type_name(m->type));
        return -1;
    }
    if (m->type != PS_MSG_PUSHPULL || m->rdt != PS_DT_F32) {
        srv_send_error(c, m->id, PS_EUNSUPPORTED, 0, "'inshm' is for pushpulls answered in float32, not a %s%s",
                       ps_msg_type_name(m->type), m->type == PS_MSG_PUSHPULL ? " asking for bfloat16" : "");
        return -1;
    }
    if (m->len == 0 || m->off > n || m->len > n - m->off ||
        m->poff > n || m->plen > n - m->poff || m->plen == 0) {
        srv_send_error(c, m->id, PS_ERANGE, 0, "%s with 'inshm': push [%llu, %llu) and pull [%llu, %llu) must "
                                               "lie in the model's %llu parameters",
                       ps_msg_type_name(m->type), (unsigned long long)m->off, (unsigned long long)(m->off + m->len),
                       (unsigned long long)m->poff, (unsigned long long)(m->poff + m->plen), (unsigned long long)n);
        return -1;
    }
    if (c->wide_cap < m->len) {
        float *p = realloc(c->wide, (size_t)m->len * sizeof(float));
        if (!p) {
            srv_send_error(c, m->id, PS_ENOMEM, 0, "no memory for a push of %llu values",
                           (unsigned long long)m->len);
            return -1;
        }
        c->wide = p;
        c->wide_cap = (size_t)m->len;
    }
    memcpy(c->wide, c->shm + m->off, (size_t)m->len * sizeof(float));
    m->data = c->wide;
    m->ndata = m->len;
    m->dt = PS_DT_F32;
    m->rdt = SRV_RDT_SHM;
    return 0;
}

static void handle_push(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char err[256];
    if (!s->model.initialized) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "push before the model has its initial values");
        return;
    }
    if (m->inshm && push_from_shm(c, m) != 0)
        return;
    /* a pushpull's reply type is checked before its push is applied */
    if ((m->type == PS_MSG_PUSHPULL && check_rdt(c, m->id, m->rdt) != 0) || check_data(c, m) != 0)
        return;
    if (m->fin && m->base <= s->model.version) {
        srv_hist_observe(&s->stats.staleness, (double)(s->model.version - m->base));
        c->worker->staleness = s->model.version - m->base;
    }
    if (m->data == c->wide) {
        /* widened from bfloat16 or copied from shm: the policy may keep
         * the buffer (bsp) */
        s->push_buf = &c->wide;
        s->push_buf_cap = &c->wide_cap;
    }
    int rc = s->policy->push(s, c->worker, m->base, m->off, m->data, m->ndata, m->fin, err, sizeof err);
    s->push_buf = NULL;
    s->push_buf_cap = NULL;
    if (rc == SRV_PENDING) {
        /* applied off the loop: srv_push_done() replies */
        srv_apply *a = s->applying;
        a->id = m->id;
        a->type = m->type;
        a->poff = m->poff;
        a->plen = m->plen;
        a->min = m->min;
        a->rdt = m->rdt;
        return;
    }
    if (rc == PS_ESTALE) {
        /* A push for a round that closed without it (backup workers): drop
         * it and count it; a pushpull still gets the current model so the
         * worker catches up. */
        if (m->fin)
            s->stats.dropped_pushes++;
        PS_LOG(PS_LOG_DEBUG, "shard %u: %s", c->worker->shard, err);
        if (m->type == PS_MSG_PUSHPULL) {
            do_pull(c, m->id, m->poff, m->plen, m->min, m->rdt);
            return;
        }
    }
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return;
    }
    if (m->fin) {
        c->worker->pushes++;
        s->stats.pushes++;
    }
    if (m->type == PS_MSG_PUSHPULL)
        do_pull(c, m->id, m->poff, m->plen, m->min, m->rdt);
    else
        reply_ok(c, m->id);
}

void srv_push_done(psd *s, const srv_apply *a)
{
    srv_conn *c = a->c;
    if (a->fin) {
        a->w->pushes++;
        s->stats.pushes++;
    }
    if (c->closing)
        return;
    if (a->type == PS_MSG_PUSHPULL)
        do_pull(c, a->id, a->poff, a->plen, a->min, a->rdt);
    else
        reply_ok(c, a->id);
}

static void handle_report(srv_conn *c, ps_msg *m)
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
    reply_ok(c, m->id);
}

/* ---- dispatch ------------------------------------------------------------------ */

void srv_handle(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    c->last_msg_ms = srv_now_ms();
    if (c->auth) {
        /* a challenge is out: only its answer may come */
        if (m->type == PS_MSG_AUTH)
            srv_auth_answer(c, m);
        else
            srv_send_error(c, m->id, PS_EAUTH, 1, "psd requires a token: expected auth, the answer to its "
                                                  "challenge, not %s",
                           ps_msg_type_name(m->type));
        return;
    }
    if (c->role == PS_ROLE_NONE && m->type != PS_MSG_HELLO) {
        srv_send_error(c, m->id, PS_ESTATE, 1, "the first message must be hello, not %s",
                       ps_msg_type_name(m->type));
        return;
    }
    int worker_only = m->type == PS_MSG_INIT || m->type == PS_MSG_PUSH || m->type == PS_MSG_PUSHPULL ||
                      m->type == PS_MSG_REPORT;
    if (worker_only && !c->worker) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0, "%s is for workers; this connection is %s",
                       ps_msg_type_name(m->type), ps_role_name((uint32_t)c->role));
        return;
    }
    int reads = m->type == PS_MSG_ADMIN && strcmp(m->cmd, "history") == 0; /* ADMIN history only reads */
    if (c->admin_readonly && ((m->type == PS_MSG_ADMIN && !reads) || m->type == PS_MSG_PULL)) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0,
                       "%s%s%s refused: this admin connection proved the workers' token and may only read "
                       "(status, workers, metrics, history), because admin_token_file is not configured; set it in psd's "
                       "configuration and use that token",
                       m->type == PS_MSG_ADMIN ? "admin command '" : "pulling the model",
                       m->type == PS_MSG_ADMIN ? m->cmd : "", m->type == PS_MSG_ADMIN ? "'" : "");
        return;
    }
    switch (m->type) {
    case PS_MSG_HELLO:
        handle_hello(c, m);
        break;
    case PS_MSG_INIT:
        handle_init(c, m);
        break;
    case PS_MSG_PUSH:
    case PS_MSG_PUSHPULL:
        handle_push(c, m);
        break;
    case PS_MSG_PULL:
        do_pull(c, m->id, m->off, m->len, m->min, m->rdt);
        break;
    case PS_MSG_HEARTBEAT:
        /* without an id it is fire-and-forget, so a worker's heartbeat
         * thread never has a reply to read */
        if (m->has & PS_F_ID)
            reply_ok(c, m->id);
        break;
    case PS_MSG_REPORT:
        handle_report(c, m);
        break;
    case PS_MSG_STATUS: {
        ps_msg r;
        ps_msg_init(&r, PS_MSG_STATUS_REPLY);
        r.has = PS_F_ID;
        r.id = m->id;
        srv_send(c, &r, NULL);
        break;
    }
    case PS_MSG_METRICS: {
        ps_buf text = {0};
        if (srv_metrics_text(s, &text) != 0) {
            ps_buf_free(&text);
            srv_send_error(c, m->id, PS_ENOMEM, 0, "out of memory");
            break;
        }
        ps_msg r;
        ps_msg_init(&r, PS_MSG_METRICS_REPLY);
        r.has = PS_F_ID | PS_F_TEXT;
        r.id = m->id;
        r.text = (const char *)text.p;
        r.text_len = (uint32_t)text.len;
        srv_send(c, &r, NULL);
        ps_buf_free(&text);
        break;
    }
    case PS_MSG_ADMIN:
        if (c->role != PS_ROLE_ADMIN) {
            srv_send_error(c, m->id, PS_EFORBIDDEN, 0, "admin commands are for admin connections; this one is %s",
                           ps_role_name((uint32_t)c->role));
            break;
        }
        srv_handle_admin(c, m);
        break;
    case PS_MSG_AUTH:
        srv_send_error(c, m->id, PS_ESTATE, 0, "auth without a challenge: %s",
                       s->token.len ? "this connection is authenticated already" : "psd requires no token");
        break;
    case PS_MSG_BYE:
        srv_conn_detach(c, SRV_W_LEFT, "said bye");
        reply_ok(c, m->id);
        c->close_after_write = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        break;
    default:
        srv_send_error(c, m->id, PS_EBAD_TYPE, 0, "psd does not accept %s messages", ps_msg_type_name(m->type));
        break;
    }
}
