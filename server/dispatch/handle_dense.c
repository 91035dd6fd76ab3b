/* handle_dense.c - the handlers of the dense model's messages: INIT,
 * PUSH, PUSHPULL and PULL (a push's gradient checked, widened or copied
 * out of the worker's segment, handed to the policy, and answered now, once
 * its update is installed, or once its bsp round is kept), and the end of
 * a push applied off the loop (srv_push_finished). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "proto/errors.h"
#include "proto/vec.h"
#include "server/answer/pull.h"
#include "server/answer/reply.h"
#include "server/dispatch/handle.h"
#include "server/policy/policy.h"
#include "server/replog/pushid.h"
#include "server/replog/replog.h"
#include "server/session/hello.h"
#include "server/session/ledger.h"
#include "server/store/psd.h"
#include "server/store/scratch.h"
#include "server/update/update.h"

/* c->wide holds at least n floats (grown when needed; bounded by the
 * model's size, as every caller checks the range first). 0, or -1 when out
 * of memory (c->wide unchanged). */
static int wide_reserve(srv_conn *c, uint64_t n)
{
    if (c->wide_cap >= n)
        return 0;
    float *p = realloc(c->wide, (size_t)n * sizeof(float));
    if (!p)
        return -1;
    c->wide = p;
    c->wide_cap = (size_t)n;
    return 0;
}

/* A pull, answered now or parked by the answer layer, or refused here. */
static void pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt)
{
    char err[256];
    int rc = srv_pull(c, id, off, len, min, rdt, err, sizeof err);
    if (rc != 0)
        srv_send_error(c, id, rc, 0, "%s", err);
}

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
    double norm = sqrt(srv_sumsq_of(g, (size_t)m->ndata));
    if (norm > s->cfg.clip_norm) {
        double f = s->cfg.clip_norm / norm;
        for (uint64_t i = 0; i < m->ndata; i++)
            g[i] = (float)(g[i] * f);
    }
    SRV_COUNT(s, sanitized_pushes, 1);
    PS_LOG(PS_LOG_INFO, "conn %llu (%s): %s for [%llu, %llu) held %zu NaN or infinite values: sanitised "
                        "(nonfinite = clip), norm %g -> %g",
           (unsigned long long)c->cid, c->addr, ps_msg_type_name(m->type), (unsigned long long)m->off,
           (unsigned long long)(m->off + m->ndata), bad, norm, norm > s->cfg.clip_norm ? s->cfg.clip_norm : norm);
}

/* A packed or bfloat16 tensor (dt 1, 2 or 3) becomes float32 in the
 * connection's own buffer, where m then points: everything after this sees
 * float32 only (proto's codec decodes every form). The range is checked
 * first, so the buffer never grows beyond the model; a compressed frame
 * must say it holds exactly the ndata values before anything is sized for
 * them. *maxabs gets the largest |value| when the decoding found it
 * (bfloat16: not finite when some value is not), else NAN. */
static int decode_data(srv_conn *c, ps_msg *m, float *maxabs, char *err, size_t errlen)
{
    psd *s = c->srv;
    const char *what = ps_msg_type_name(m->type);
    if (m->dt == PS_DT_BF16 && !s->cfg.wire_bf16) {
        snprintf(err, errlen, "%s with bfloat16 data refused: this psd takes float32 only "
                              "(wire_bf16 = no); its welcome did not offer bf16", what);
        return PS_EUNSUPPORTED;
    }
    uint8_t *planes = NULL;
    if (m->dt == PS_DT_F32ZSTD) {
        uint64_t want = m->ndata * sizeof(float);
        if (ps_codec_zstd_check(m->packed, (size_t)m->packed_len, m->ndata) != 0) {
            snprintf(err, errlen, "%s: compressed data (dt 3) of %llu bytes is not one zstd frame that says it "
                                  "holds len %llu float32 values (%llu bytes)",
                     what, (unsigned long long)m->packed_len, (unsigned long long)m->ndata,
                     (unsigned long long)want);
            return PS_EBAD_FIELD;
        }
        if (!(planes = srv_planes(s, (size_t)want))) {
            snprintf(err, errlen, "no memory to decompress %llu values", (unsigned long long)m->ndata);
            return PS_ENOMEM;
        }
    }
    if (wide_reserve(c, m->ndata) != 0) {
        snprintf(err, errlen, "no memory to decode %llu values of %s data", (unsigned long long)m->ndata,
                 ps_dtype_name(m->dt));
        return PS_ENOMEM;
    }
    char cerr[160];
    int rc = ps_codec_decode(srv_codec(s), m, c->wide, planes, maxabs, cerr, sizeof cerr);
    if (rc != 0)
        snprintf(err, errlen, "%s: %s", what, cerr);
    return rc;
}

/* The checks of an INIT's or a push's data, once, before anything acts on
 * it: the range, the element type (bfloat16 widened), finiteness
 * (sanitised with nonfinite = clip, for pushes). 0, with the largest
 * |value| in *gmax (-1 when not known: sanitised), or a negative PS_E*
 * code with err filled. The one pass over the data that finds whether it
 * is finite finds its largest magnitude too, from which the update engine
 * may know an update stays finite without trying it (update.h). */
static int check_data(srv_conn *c, ps_msg *m, float *gmax, char *err, size_t errlen)
{
    psd *s = c->srv;
    uint64_t total = s->model.layout.total;
    float mx = NAN; /* not known yet */
    *gmax = -1;
    if (!srv_range_ok(total, m->off, m->ndata)) {
        snprintf(err, errlen, "%s range [%llu, %llu) is outside the model's %llu parameters",
                       ps_msg_type_name(m->type), (unsigned long long)m->off,
                       (unsigned long long)(m->off + m->ndata), (unsigned long long)total);
        return PS_ERANGE;
    }
    /* widened only once the range is known to fit: the buffer then never
     * grows beyond the model */
    int bf16 = m->dt == PS_DT_BF16;
    /* counted once accepted */
    uint64_t left_out = m->dt == PS_DT_F32Z ? m->ndata - m->nz : 0;
    uint64_t zin = m->dt == PS_DT_F32ZSTD ? m->packed_len : 0, zout = zin ? m->ndata * sizeof(float) : 0;
    int rc = m->dt != PS_DT_F32 ? decode_data(c, m, &mx, err, errlen) : 0;
    if (rc != 0)
        return rc;
    if (!bf16)
        mx = ps_vec_maxabs(m->data, m->ndata);
    if (!isfinite(mx)) {
        if (m->type != PS_MSG_INIT && s->cfg.nonfinite == PS_NONFINITE_CLIP) {
            sanitize_push(c, m);
            SRV_COUNT(s, zeros_elided, left_out);
            SRV_COUNT(s, zstd_in, zin);
            SRV_COUNT(s, zstd_out, zout);
            return 0;
        }
        snprintf(err, errlen, "%s for [%llu, %llu) contains NaN or infinity; rejected, the "
                                                   "model is unchanged",
                       ps_msg_type_name(m->type), (unsigned long long)m->off,
                       (unsigned long long)(m->off + m->ndata));
        return PS_ENONFINITE;
    }
    *gmax = mx;
    SRV_COUNT(s, zeros_elided, left_out);
    SRV_COUNT(s, zstd_in, zin);
    SRV_COUNT(s, zstd_out, zout);
    return 0;
}

int srv_on_init(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    if (s->model.initialized || s->init_owner != c) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "init refused: %s",
                       s->model.initialized ? "the model already has its values" : "another worker is initialising it");
        return 0;
    }
    char err[512];
    float gmax;
    int rc = check_data(c, m, &gmax, err, sizeof err);
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return 0;
    }
    /* the hello proposed the layout; its memory is taken now */
    if (srv_model_commit(&s->model, &s->cfg) != 0) {
        srv_send_error(c, m->id, PS_ENOMEM, 0, "cannot hold a model of %llu parameters: out of memory",
                       (unsigned long long)s->model.layout.total);
        return 0;
    }
    for (uint64_t done = 0; done < m->ndata;) {
        srv_wseg seg;
        if (srv_model_write_begin(&s->model, m->off + done, m->ndata - done, &seg) != 0) {
            srv_send_error(c, m->id, PS_ENOMEM, 0, "out of memory");
            return 0;
        }
        memcpy(seg.wo, m->data + done, seg.len * sizeof(float));
        srv_model_write_end(&s->model, &seg);
        done += seg.len;
    }
    srv_model_mark(&s->model, m->off, m->ndata); /* the followers get the values (replication's next flush) */
    if (m->fin) {
        srv_model_set_initialized(&s->model, s->model.version);
        srv_init_owner_done(s);
        srv_stats_model_at(s, srv_now_ms());
        PS_LOG(PS_LOG_INFO, "model initialised by shard %u (%s)", c->worker->shard, c->addr);
    }
    srv_send_ok(c, m->id);
    if (m->fin)
        srv_answer_parked(s);
    return 0;
}

/* A pushpull whose gradient is in the worker's segment: copied into the
 * connection's own buffer first (the worker could change it while psd
 * checks and applies it), where m then points as for a TCP push; the
 * reply goes into the segment too (SRV_RDT_SHM). */
static int push_from_shm(srv_conn *c, ps_msg *m, char *err, size_t errlen)
{
    uint64_t n = c->shm_params;
    if (!c->shm) {
        snprintf(err, errlen, "%s with 'inshm' refused: this connection has no shared segment "
                                               "(psd's welcome did not say inshm)",
                       ps_msg_type_name(m->type));
        return PS_ESTATE;
    }
    if (m->type != PS_MSG_PUSHPULL || m->rdt != PS_DT_F32) {
        snprintf(err, errlen, "'inshm' is for pushpulls answered in float32, not a %s%s",
                       ps_msg_type_name(m->type), m->type == PS_MSG_PUSHPULL ? " asking for bfloat16" : "");
        return PS_EUNSUPPORTED;
    }
    if (!srv_range_ok(n, m->off, m->len) || !srv_range_ok(n, m->poff, m->plen)) {
        snprintf(err, errlen, "%s with 'inshm': push [%llu, %llu) and pull [%llu, %llu) must "
                                               "lie in the model's %llu parameters",
                       ps_msg_type_name(m->type), (unsigned long long)m->off, (unsigned long long)(m->off + m->len),
                       (unsigned long long)m->poff, (unsigned long long)(m->poff + m->plen), (unsigned long long)n);
        return PS_ERANGE;
    }
    if (wide_reserve(c, m->len) != 0) {
        snprintf(err, errlen, "no memory for a push of %llu values", (unsigned long long)m->len);
        return PS_ENOMEM;
    }
    memcpy(c->wide, c->shm + m->off, (size_t)m->len * sizeof(float));
    m->data = c->wide;
    m->ndata = m->len;
    m->dt = PS_DT_F32;
    m->rdt = SRV_RDT_SHM;
    return 0;
}

/* FOR TESTS ONLY: with PSD_TEST_CUT_PUSH=N in psd's environment, every
 * N-th push carrying a push id is applied and its connection then cut
 * (shut down both ways) instead of answered: the reply a resend must make
 * up for is lost (tests/client/test_replicas.py). A push id counts the
 * first time only: in bsp the chunks of an unfinished push are applied
 * again when sent again, and counting them anew could cut every resend of
 * a step of N chunks or more. 1 when it cut. */
static int cut_reply(srv_conn *c, uint64_t pid)
{
    static long every = -1;
    static unsigned long n;
    static struct {
        uint64_t cid, pid;
    } seen[16]; /* the highest push id counted, per client */
    if (every < 0) {
        const char *e = getenv("PSD_TEST_CUT_PUSH");
        every = e ? strtol(e, NULL, 10) : 0;
        if (every > 0)
            PS_LOG(PS_LOG_WARN, "PSD_TEST_CUT_PUSH=%ld: every %ld-th push with an id loses its reply (a test's "
                                "fault; never in production)", every, every);
    }
    if (every <= 0)
        return 0;
    unsigned k = 0;
    while (k < 15 && seen[k].cid && seen[k].cid != c->client_id)
        k++;
    if (seen[k].cid == c->client_id && pid <= seen[k].pid)
        return 0;
    seen[k].cid = c->client_id;
    seen[k].pid = pid;
    if (++n % (unsigned long)every != 0)
        return 0;
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return 0;
    PS_LOG(PS_LOG_WARN, "conn %llu (%s): PSD_TEST_CUT_PUSH: push applied, connection cut instead of answered",
           (unsigned long long)c->cid, c->addr);
    shutdown(fd, SHUT_RDWR);
    return 1;
}

/* A push's reply: a PUSHPULL's pull, or OK. With followers, a push that
 * counts in the open bsp round (in_round; round the model's version) is
 * acknowledged once the round closed: before, only this psd holds it
 * (PROTOCOL.md 15). */
static void answer_push(srv_conn *c, const ps_msg *m, int in_round, uint64_t round)
{
    char err[256];
    int later = in_round && c->srv->replog;
    uint64_t min = later && m->min <= round ? round + 1 : m->min;
    int rc;
    if (m->type == PS_MSG_PUSHPULL)
        pull(c, m->id, m->poff, m->plen, min, m->rdt);
    else if (!later)
        srv_send_ok(c, m->id);
    else if ((rc = srv_ok_after(c, m->id, round + 1, err, sizeof err)) != 0)
        srv_send_error(c, m->id, rc, 0, "%s", err);
}

static int handle_push(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char err[512];
    if (!s->model.initialized) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "push before the model has its initial values");
        return 0;
    }
    int rc = m->inshm ? push_from_shm(c, m, err, sizeof err) : 0;
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return 0;
    }
    /* a pushpull's reply type is checked before its push is applied */
    if (m->type == PS_MSG_PUSHPULL)
        rc = srv_pull_check_rdt(s, m->rdt, err, sizeof err);
    uint64_t pid = (m->has2 & PS_F2_PID) ? m->pid : 0;
    int done = rc == 0 ? srv_pushid_done(s, c->client_id, pid) : 0;
    if (done) {
        /* sent again after a lost connection: applied already, answered
         * as then (PROTOCOL.md 15); one the open round counts, as its
         * first sending would be */
        PS_LOG(PS_LOG_INFO, "conn %llu (%s): push %llu applied already: answered, not applied again",
               (unsigned long long)c->cid, c->addr, (unsigned long long)pid);
        answer_push(c, m, done == 2, s->model.version);
        return 0;
    }
    float gmax = -1;
    if (rc == 0)
        rc = check_data(c, m, &gmax, err, sizeof err);
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return 0;
    }
    if (m->base > s->model.version) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "base version %llu is ahead of the model (%llu)",
                       (unsigned long long)m->base, (unsigned long long)s->model.version);
        return 0;
    }
    if (m->fin) {
        srv_stats_observe(s, SRV_HIST_STALENESS, (double)(s->model.version - m->base));
        c->worker->staleness = s->model.version - m->base;
    }
    /* checked: in range, float32, finite (or sanitised), base not ahead */
    srv_push p = {.base = m->base, .off = m->off, .n = m->ndata, .g = m->data, .fin = m->fin, .conn = c,
                  .may_defer = 1, .has_gmax = gmax >= 0, .gmax = gmax};
    if (m->data == c->wide) {
        /* widened from bfloat16 or copied from shm: the policy may keep
         * the buffer (bsp) */
        p.own = &c->wide;
        p.own_cap = &c->wide_cap;
    }
    uint64_t round = s->model.version;
    rc = s->policy->push(s, c->worker, &p, err, sizeof err);
    /* recorded once it counts: with rounds (bsp) a push of several chunks
     * counts at its last (a worker lost before it has its chunks dropped),
     * and is recorded as applied when its round closes */
    int counted = (rc == SRV_PENDING || rc >= 0) && (m->fin || !s->policy->rounds);
    /* without rounds, a push applied off the loop is recorded once it is
     * installed (srv_push_finished): its id goes into the replication log
     * after its gradient, as one applied now does */
    int later = rc == SRV_PENDING && !s->policy->rounds;
    if (counted && s->policy->rounds) {
        srv_pushid_mark_round(s, c->client_id, pid);
        if (rc != SRV_PENDING && s->model.version != round)
            srv_pushid_round_closed(s); /* it closed the round (off the loop: recorded there) */
    } else if (counted && !later)
        srv_pushid_mark(s, c->client_id, pid);
    if ((rc == SRV_PENDING || rc >= 0) && !later)
        srv_ledger_dense(s, c->client_id, pid, m->off, m->ndata, m->data); /* tests only (PSD_TEST_LEDGER) */
    if (rc == SRV_PENDING) {
        /* applied off the loop: srv_push_finished() replies; the gradient
         * lives in c's receive buffer, so c reads nothing meanwhile */
        s->push_wait = (srv_push_wait){.c = c, .id = m->id, .type = m->type, .poff = m->poff, .plen = m->plen,
                                       .min = m->min, .rdt = m->rdt, .record = later, .cid = c->client_id,
                                       .pid = pid, .off = m->off, .n = m->ndata, .g = m->data};
        return SRV_STOP_READING;
    }
    if (rc == PS_ESTALE) {
        /* A push for a round that closed without it (backup workers): drop
         * it and count it; a pushpull still gets the current model so the
         * worker catches up. */
        if (m->fin)
            SRV_COUNT(s, dropped_pushes, 1);
        PS_LOG(PS_LOG_DEBUG, "shard %u: %s", c->worker->shard, err);
        if (m->type == PS_MSG_PUSHPULL) {
            pull(c, m->id, m->poff, m->plen, m->min, m->rdt);
            return 0;
        }
    }
    if (rc < 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return 0;
    }
    if (rc == SRV_WAKE)
        srv_answer_parked(s); /* a new version: the pulls waiting for it first */
    if (m->fin) {
        c->worker->pushes++;
        SRV_COUNT(s, pushes, 1);
    }
    if (pid && c->client_id && cut_reply(c, pid))
        return 0;
    answer_push(c, m, counted && s->policy->rounds && s->model.version == round, round);
    return 0;
}

int srv_on_push(srv_conn *c, ps_msg *m)
{
    return handle_push(c, m);
}

int srv_on_pushpull(srv_conn *c, ps_msg *m)
{
    return handle_push(c, m);
}

srv_conn *srv_push_finished(psd *s, const srv_update_tag *tag, int *wake)
{
    const srv_push_wait a = s->push_wait;
    srv_conn *c = a.c;
    s->push_wait.c = NULL;
    if (a.record) {
        srv_replog_flush(s); /* its values' mark before its id, when it did not go as its gradient */
        srv_pushid_mark(s, a.cid, a.pid);
        srv_ledger_dense(s, a.cid, a.pid, a.off, a.n, a.g); /* tests only (PSD_TEST_LEDGER) */
    }
    *wake = s->policy->applied(s, tag) == SRV_WAKE;
    if (tag->fin) {
        tag->w->pushes++;
        SRV_COUNT(s, pushes, 1);
    }
    if (c->closing)
        return c;
    if (a.type == PS_MSG_PUSHPULL)
        pull(c, a.id, a.poff, a.plen, a.min, a.rdt);
    else
        srv_send_ok(c, a.id);
    return c;
}

int srv_on_pull(srv_conn *c, ps_msg *m)
{
    pull(c, m->id, m->off, m->len, m->min, m->rdt);
    return 0;
}
