/* session.c - a worker's connection to psd (see session.h). */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "layer.h"
#include "proto/errors.h"

/* largest tensor chunk in one frame, in floats (4 MiB) */
#define CHUNK_FLOATS PS_CHUNK_FLOATS

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *ps_session_error(const ps_session *ss)
{
    if (ss->err[0] || !ss->links)
        return ss->err;
    return ps_client_error(&ss->links[ss->err_link].cl);
}

__attribute__((format(printf, 2, 3)))
static int serr(ps_session *ss, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ss->err, sizeof ss->err, fmt, ap);
    va_end(ap);
    return PS_EINVAL;
}

/* Splits "host:port,host:port,..." into links, part i on the i-th, each
 * with the layout of its part. */
static int links_make(ps_session *ss, const char *server)
{
    uint32_t n = 1;
    for (const char *p = server; *p; p++)
        n += *p == ',';
    if (n > PS_PARTS_MAX)
        return serr(ss, "--server lists %u psd; at most %u may share a model", n, PS_PARTS_MAX);
    ss->links = calloc(n, sizeof *ss->links);
    if (!ss->links)
        return serr(ss, "out of memory");
    ps_layout whole;
    if (ps_model_layout(ss->model, &whole) != 0)
        return serr(ss, "the model's layout does not fit the protocol's limits");
    const char *p = server;
    for (uint32_t i = 0; i < n; i++) {
        ps_link *ln = &ss->links[i];
        size_t len = strcspn(p, ",");
        ps_client_init(&ln->cl);
        pthread_mutex_init(&ln->lock, NULL);
        pthread_cond_init(&ln->wake, NULL);
        ln->cl.send_lock = &ln->lock;
        ss->nlinks = i + 1;
        if (len == 0 || len >= sizeof ln->server)
            return serr(ss, "--server: psd %u of %u in \"%.200s\" is %s", i + 1, n, server,
                        len ? "too long" : "empty");
        memcpy(ln->server, p, len);
        ln->server[len] = '\0';
        p += len + (p[len] == ',');
        /* one psd: its part is the model, under the model's own layout */
        if (ps_layout_part(&whole, i, n, &ln->layout, &ln->lo, &ln->hi) != 0) {
            return serr(ss, "the model's %llu parameters cannot be split over %u psd (a part needs at least %u "
                            "values, and the name of a cut tensor with its range must fit in %d bytes)",
                        (unsigned long long)whole.total, n, PS_PART_ALIGN, PS_NAME_MAX);
        }
    }
    return 0;
}

int ps_session_init(ps_session *ss, const char *server, uint32_t shard, uint32_t nshards, ps_model *model,
                    uint64_t seed, int timeout_ms, int reconnect_ms)
{
    memset(ss, 0, sizeof *ss);
    ss->shm_fd = -1;
    ss->shard = shard;
    ss->nshards = nshards;
    ss->model = model;
    ss->seed = seed;
    ss->timeout_ms = timeout_ms;
    ss->reconnect_ms = reconnect_ms;
    return links_make(ss, server);
}

/* Sets the link ss->err_link to i and returns rc: the error to tell. */
static int lfail(ps_session *ss, uint32_t i, int rc)
{
    ss->err_link = i;
    return rc;
}

/* ---- heartbeats ----------------------------------------------------------- */

static void *hb_main(void *arg)
{
    ps_link *ln = arg;
    pthread_mutex_lock(&ln->lock);
    while (!ln->hb_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + ln->hb_interval_ms * 1000000ull;
        until.tv_sec += (time_t)(ns / 1000000000ull);
        until.tv_nsec = (long)(ns % 1000000000ull);
        int rc = pthread_cond_timedwait(&ln->wake, &ln->lock, &until);
        if (ln->hb_stop)
            break;
        if (rc == ETIMEDOUT && ln->cl.fd >= 0) {
            ps_msg m;
            ps_msg_init(&m, PS_MSG_HEARTBEAT);
            /* the send lock is held (the condition wait returned with it), so
             * no other frame can be half written: send without taking it */
            ps_client_send_noreply_held(&ln->cl, &m);
        }
    }
    pthread_mutex_unlock(&ln->lock);
    return NULL;
}

static void hb_stop(ps_link *ln)
{
    if (!ln->hb_running)
        return;
    pthread_mutex_lock(&ln->lock);
    ln->hb_stop = 1;
    pthread_cond_signal(&ln->wake);
    pthread_mutex_unlock(&ln->lock);
    pthread_join(ln->hb_thread, NULL);
    ln->hb_running = 0;
    ln->hb_stop = 0;
}

static void hb_start(ps_link *ln)
{
    if (ln->hb_running || ln->hb_interval_ms == 0)
        return;
    if (pthread_create(&ln->hb_thread, NULL, hb_main, ln) == 0)
        ln->hb_running = 1;
    else
        PS_LOG(PS_LOG_WARN, "cannot start the heartbeat thread; psd may declare this worker dead when it is idle");
}

/* ---- requests ------------------------------------------------------------- */

/* Sends values[0..n) as chunks of type INIT or PUSH (fin on the last) to
 * ln's psd, back to back, without reading the OKs: *sent says how many
 * chunks went. Offsets are ln's part's own (psd holds just that part). */
static int chunks_out(ps_link *ln, uint32_t type, const float *values, size_t n, uint64_t base, size_t *sent)
{
    *sent = 0;
    for (size_t off = 0; off < n; off += CHUNK_FLOATS) {
        size_t len = n - off < CHUNK_FLOATS ? n - off : CHUNK_FLOATS;
        ps_msg m;
        ps_msg_init(&m, type);
        m.has = PS_F_OFF | PS_F_DATA | PS_F_FIN | (type == PS_MSG_PUSH ? PS_F_BASE : 0);
        m.off = off;
        m.data = values + off;
        m.ndata = len;
        m.fin = off + len == n;
        m.base = base;
        int rc = ps_client_send(&ln->cl, &m);
        if (rc != 0)
            return rc;
        (*sent)++;
    }
    return 0;
}

/* Reads the OKs of `sent` chunks (psd answers in order). A push psd
 * dropped because its round had closed is counted (*dropped, once per
 * step), not an error. */
static int chunks_acks(ps_link *ln, size_t sent, int timeout_ms, uint64_t *dropped)
{
    for (size_t i = 0; i < sent; i++) {
        ps_msg r;
        int rc = ps_client_recv(&ln->cl, &r, timeout_ms);
        if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_ESTALE) {
            if (dropped)
                *dropped += i + 1 == sent; /* the fin chunk's answer counts the step */
            continue;
        }
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_OK)
            return PS_EMALFORMED;
    }
    return 0;
}

static int send_chunks(ps_session *ss, ps_link *ln, uint32_t type, const float *values, size_t n, uint64_t base)
{
    size_t sent;
    int rc = chunks_out(ln, type, values, n, base, &sent);
    return rc != 0 ? rc : chunks_acks(ln, sent, ss->timeout_ms, type == PS_MSG_PUSH ? &ss->dropped : NULL);
}

/* Pulls ln's part at version >= min into dst (its first value), with
 * PS_PULL_WINDOW chunk requests in flight. */
static int pull_part(ps_session *ss, ps_link *ln, float *dst, uint64_t min)
{
    return ps_client_pull_chunks(&ln->cl, dst, ln->hi - ln->lo, min, CHUNK_FLOATS, PS_PULL_WINDOW, &ln->version,
                                 ss->timeout_ms);
}

/* One psd: pulls the whole model at version >= min into the model's own
 * parameters. */
static int pull_all(ps_session *ss, uint64_t min)
{
    ps_model_unbind_params(ss->model);
    int rc = pull_part(ss, &ss->links[0], ps_model_params(ss->model), min);
    if (rc == 0) {
        ss->have_params = 1;
        ss->version = ss->links[0].version;
    }
    return rc;
}

/* ---- shared memory --------------------------------------------------------- */

/* The segment a psd on this machine can map instead of sending the tensors
 * over loopback TCP (server/shm.c): a memfd of 2 x n floats (n: the whole
 * model's parameters), gradient then parameters, sealed so that it can
 * neither shrink (psd would fault on the missing pages) nor grow. Made
 * once; every connection offers the same one, and a psd holding one part
 * of the model maps that part of both halves. */
static int shm_create(ps_session *ss)
{
    size_t n = ps_model_nparams(ss->model), bytes = n * 2 * sizeof(float);
    if (ss->shm)
        return 0;
    int fd = memfd_create("psworker", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return -1;
    }
    ss->shm_fd = fd;
    ss->shm = p;
    return 0;
}

static void shm_free(ps_session *ss)
{
    if (!ss->shm)
        return;
    ps_model_unbind_params(ss->model);
    if (!ss->comm_running)
        ps_model_bind_grads(ss->model, NULL);
    munmap(ss->shm, ps_model_nparams(ss->model) * 2 * sizeof(float));
    close(ss->shm_fd);
    ss->shm = NULL;
    ss->shm_fd = -1;
    ss->shm_ok = 0;
}

/* Sends ln's part of the gradient as a PUSHPULL that pulls the part back
 * at version >= min: through the segment when ln's psd mapped it (the
 * gradient must be there already), else with grads[lo, hi) as data. */
static int pushpull_send(ps_session *ss, ps_link *ln, const float *grads, uint64_t base, uint64_t min)
{
    size_t n = ln->hi - ln->lo;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.base = base;
    m.plen = n;
    m.min = min;
    if (ln->shm_ok && !ss->comm_running) {
        if (grads != ss->shm)
            memcpy(ss->shm + ln->lo, grads + ln->lo, n * sizeof(float));
        m.has |= PS_F_LEN | PS_F_INSHM;
        m.len = n;
        m.inshm = 1;
    } else {
        m.has |= PS_F_DATA;
        m.data = grads + ln->lo;
        m.ndata = n;
    }
    return ps_client_send(&ln->cl, &m);
}

/* Reads the answer to pushpull_send: *data and *version describe the
 * parameters that came back. Through the segment they are in its second
 * half; over TCP they are read straight into dst when it is not NULL, and
 * otherwise stay in the client's receive buffer until ps_session adopts
 * them. Touches neither the model nor the session's version (it may run on
 * the comm thread). */
static int pushpull_recv(ps_session *ss, ps_link *ln, float *dst, const float **data, uint64_t *version)
{
    size_t n = ln->hi - ln->lo;
    ps_msg r;
    if (ln->shm_ok && !ss->comm_running) {
        int rc = ps_client_recv(&ln->cl, &r, ss->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || !r.inshm || r.off != 0 || r.len != n)
            return PS_EMALFORMED;
        *data = ss->shm + ps_model_nparams(ss->model) + ln->lo;
    } else {
        int rc = ps_client_recv_into(&ln->cl, &r, dst, dst ? n : 0, ss->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || r.off != 0 || r.ndata != n)
            return PS_EMALFORMED;
        *data = r.data;
    }
    *version = r.mver;
    return 0;
}

/* One PUSHPULL round trip of one psd's whole model (n <= CHUNK_FLOATS). */
static int pushpull(ps_session *ss, const float *grads, uint64_t base, uint64_t min, const float **data,
                    uint64_t *version)
{
    ps_link *ln = &ss->links[0];
    int rc = pushpull_send(ss, ln, grads, base, min);
    return rc != 0 ? rc : pushpull_recv(ss, ln, NULL, data, version);
}

/* Makes the parameters that just arrived the model's: no copy, the model
 * reads them where they landed, and that buffer leaves the client (which
 * gets the previous one back) so no later receive can overwrite them. */
static void adopt(ps_session *ss, const float *data, uint64_t version)
{
    ps_client *cl = &ss->links[0].cl;
    if (ss->bsp && version > ss->version + 1)
        ss->dropped++; /* the round closed without our push */
    ps_model_bind_params(ss->model, (float *)(uintptr_t)data);
    if (ss->shm && data == ss->shm + ps_model_nparams(ss->model))
        ; /* psd writes there only when asked, and the next step asks */
    else if (data == cl->wide)
        ps_client_swap_wide(cl, &ss->held_wide, &ss->held_wide_cap);
    else
        ps_client_swap_rbuf(cl, &ss->held, &ss->held_cap);
    ss->links[0].version = version;
    ss->version = version;
}

/* ---- pipelining ------------------------------------------------------------ */

static void *comm_main(void *arg)
{
    ps_session *ss = arg;
    pthread_mutex_lock(&ss->comm_mu);
    for (;;) {
        while (!ss->comm_pending && !ss->comm_stop)
            pthread_cond_wait(&ss->comm_cv, &ss->comm_mu);
        if (ss->comm_stop)
            break;
        const float *g = ss->comm_grads;
        uint64_t base = ss->comm_base;
        pthread_mutex_unlock(&ss->comm_mu);
        const float *data = NULL;
        uint64_t version = 0;
        int rc = pushpull(ss, g, base, 0, &data, &version);
        pthread_mutex_lock(&ss->comm_mu);
        ss->comm_rc = rc;
        ss->comm_data = data;
        ss->comm_version = version;
        ss->comm_pending = 0;
        ss->comm_done = 1;
        pthread_cond_broadcast(&ss->comm_cv);
    }
    pthread_mutex_unlock(&ss->comm_mu);
    return NULL;
}

int ps_session_flush(ps_session *ss)
{
    if (!ss->comm_running)
        return 0;
    pthread_mutex_lock(&ss->comm_mu);
    while (ss->comm_pending)
        pthread_cond_wait(&ss->comm_cv, &ss->comm_mu);
    int done = ss->comm_done, rc = ss->comm_rc;
    ss->comm_done = 0;
    ss->comm_rc = 0;
    pthread_mutex_unlock(&ss->comm_mu);
    if (done && rc == 0)
        adopt(ss, ss->comm_data, ss->comm_version);
    return lfail(ss, 0, rc);
}

static int pipeline_start(ps_session *ss)
{
    size_t n = ps_model_nparams(ss->model);
    for (int i = 0; i < 2; i++) {
        ss->gbuf[i] = ps_falloc(n);
        if (!ss->gbuf[i])
            return PS_ENOMEM;
    }
    pthread_mutex_init(&ss->comm_mu, NULL);
    pthread_cond_init(&ss->comm_cv, NULL);
    if (pthread_create(&ss->comm_thread, NULL, comm_main, ss) != 0) {
        pthread_mutex_destroy(&ss->comm_mu);
        pthread_cond_destroy(&ss->comm_cv);
        return PS_ENOMEM;
    }
    ss->comm_running = 1;
    ss->gcur = 0;
    ps_model_bind_grads(ss->model, ss->gbuf[0]);
    return 0;
}

static void pipeline_stop(ps_session *ss)
{
    if (!ss->comm_running)
        return;
    ps_session_flush(ss);
    pthread_mutex_lock(&ss->comm_mu);
    ss->comm_stop = 1;
    pthread_cond_broadcast(&ss->comm_cv);
    pthread_mutex_unlock(&ss->comm_mu);
    pthread_join(ss->comm_thread, NULL);
    pthread_mutex_destroy(&ss->comm_mu);
    pthread_cond_destroy(&ss->comm_cv);
    ss->comm_running = 0;
    ps_model_bind_grads(ss->model, NULL);
    free(ss->gbuf[0]);
    free(ss->gbuf[1]);
    ss->gbuf[0] = ss->gbuf[1] = NULL;
}

int ps_session_set_pipeline(ps_session *ss, int on)
{
    if (on && !ss->comm_running) {
        if (ss->bsp || ps_model_nparams(ss->model) > CHUNK_FLOATS || ss->nlinks > 1)
            return PS_EINVAL;
        return pipeline_start(ss);
    }
    if (!on)
        pipeline_stop(ss);
    return 0;
}

/* The pipelined step: waits for the previous gradient's round trip, adopts
 * the parameters it brought, and sends the gradient just computed on the
 * comm thread; the next gradient is computed meanwhile (on parameters one
 * step stale). */
static int step_pipelined(ps_session *ss)
{
    uint64_t base = ss->version; /* the gradient's: the flush adopts a newer model */
    int rc = ps_session_flush(ss);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&ss->comm_mu);
    ss->comm_grads = ss->gbuf[ss->gcur];
    ss->comm_base = base;
    ss->comm_pending = 1;
    pthread_cond_broadcast(&ss->comm_cv);
    pthread_mutex_unlock(&ss->comm_mu);
    ss->gcur ^= 1;
    ps_model_bind_grads(ss->model, ss->gbuf[ss->gcur]);
    return 0;
}

static void link_close(ps_link *ln);

/* Keeps the first error of a step with several psd (the one to reconnect
 * for) and closes link i when its stream may be out of step: the step goes
 * on reading the other links' replies, so that each link left open has
 * nothing outstanding, and ps_session_open reconnects the closed ones. */
static void part_fail(ps_session *ss, uint32_t i, int rc, int *first)
{
    if (*first == 0) {
        *first = rc;
        ss->err_link = i;
    }
    if (rc != PS_EREMOTE || i != ss->err_link)
        link_close(&ss->links[i]);
}

/* A step with the model split over several psd: every part's push goes
 * out before any answer is read, the psd on other machines (TCP) first,
 * so that their bytes are on the wire while a psd on this machine handles
 * its part; parts of at most 2^20 values as one PUSHPULL each, answered
 * straight into the model's parameters; bigger ones as chunked pushes, and
 * then chunked pulls. */
static int step_parts(ps_session *ss)
{
    const float *grads = ps_model_grads(ss->model);
    float *params = ps_model_params(ss->model);
    uint64_t v0 = ss->links[0].version;
    size_t sent[PS_PARTS_MAX] = {0};
    int first = 0, small = 1;
    for (uint32_t i = 0; i < ss->nlinks; i++)
        small &= ss->links[i].hi - ss->links[i].lo <= CHUNK_FLOATS;
    for (int shm = 0; shm < 2; shm++)
        for (uint32_t i = 0; i < ss->nlinks && !first; i++) {
            ps_link *ln = &ss->links[i];
            if (small && ln->shm_ok != shm)
                continue;
            if (!small && shm)
                break;
            int rc = small ? pushpull_send(ss, ln, grads, ln->version, ss->bsp ? ln->version + 1 : 0)
                           : chunks_out(ln, PS_MSG_PUSH, grads + ln->lo, ln->hi - ln->lo, ln->version, &sent[i]);
            if (rc != 0)
                part_fail(ss, i, rc, &first);
            else if (small)
                sent[i] = 1;
        }
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        if (!sent[i])
            continue;
        int rc;
        if (small) {
            const float *data;
            rc = pushpull_recv(ss, ln, params + ln->lo, &data, &ln->version);
            if (rc == 0 && data != params + ln->lo) /* not where it should be: never with the segment bound */
                memcpy(params + ln->lo, data, (ln->hi - ln->lo) * sizeof(float));
        } else {
            rc = chunks_acks(ln, sent[i], ss->timeout_ms, i == 0 ? &ss->dropped : NULL);
        }
        if (rc != 0)
            part_fail(ss, i, rc, &first);
    }
    for (uint32_t i = 0; i < ss->nlinks && !small && !first; i++) {
        ps_link *ln = &ss->links[i];
        int rc = pull_part(ss, ln, params + ln->lo, ss->bsp ? ln->version + 1 : 0);
        if (rc != 0) {
            part_fail(ss, i, rc, &first);
            link_close(ln); /* chunk pulls of its window may be outstanding */
        }
    }
    if (first)
        return first;
    if (small && ss->bsp && ss->links[0].version > v0 + 1)
        ss->dropped++; /* the round closed without our push */
    ss->version = ss->links[0].version;
    return 0;
}

int ps_session_step(ps_session *ss)
{
    if (ss->comm_running)
        return step_pipelined(ss);
    if (ss->nlinks > 1)
        return step_parts(ss);
    size_t n = ps_model_nparams(ss->model);
    const float *grads = ps_model_grads(ss->model);
    uint64_t min = ss->bsp ? ss->version + 1 : 0;
    ss->err_link = 0;
    if (n <= CHUNK_FLOATS) {
        const float *data;
        uint64_t version;
        int rc = pushpull(ss, grads, ss->version, min, &data, &version);
        if (rc != 0)
            return rc;
        adopt(ss, data, version);
        return 0;
    }
    int rc = send_chunks(ss, &ss->links[0], PS_MSG_PUSH, grads, n, ss->version);
    if (rc != 0)
        return rc;
    return pull_all(ss, min);
}

/* Every psd keeps the workers' reports, so each one's status shows the
 * job's progress. */
int ps_session_report(ps_session *ss, uint32_t epoch, double loss, int has_acc, double acc, double tloss,
                      uint64_t samples, double rate)
{
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_REPORT);
        m.has = PS_F_EPOCH | PS_F_LOSS | PS_F_SAMPLES | PS_F_RATE;
        m.epoch = epoch;
        m.loss = loss;
        m.samples = samples;
        m.rate = rate;
        if (has_acc) {
            m.has |= PS_F_ACC | PS_F_TLOSS;
            m.acc = acc;
            m.tloss = tloss;
        }
        int rc = ps_client_call(&ss->links[i].cl, &m, &r, ss->timeout_ms);
        if (rc != 0)
            return lfail(ss, i, rc);
    }
    return 0;
}

/* From the first psd: every psd sees the same workers come and go. */
int ps_session_live_shards(ps_session *ss, uint32_t *rank, uint32_t *count)
{
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_STATUS);
    int rc = ps_client_call(&ss->links[0].cl, &m, &r, ss->timeout_ms);
    if (rc != 0)
        return lfail(ss, 0, rc);
    const msgpack_object *ws = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "workers") : NULL;
    if (!ws || ws->type != MSGPACK_OBJECT_ARRAY)
        return lfail(ss, 0, PS_EMALFORMED);
    uint32_t lost = 0, lost_below = 0;
    for (uint32_t i = 0; i < ws->via.array.size; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        const msgpack_object *sh = ps_map_get(w, "shard"), *st = ps_map_get(w, "state");
        if (!sh || sh->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !st || st->type != MSGPACK_OBJECT_STR)
            return lfail(ss, 0, PS_EMALFORMED);
        if (sh->via.u64 >= ss->nshards || sh->via.u64 == ss->shard || st->via.str.size != 4 ||
            memcmp(st->via.str.ptr, "lost", 4) != 0)
            continue;
        lost++; /* psd keeps one entry per shard */
        lost_below += sh->via.u64 < ss->shard;
    }
    *count = ss->nshards - lost;
    *rank = ss->shard - lost_below;
    return 0;
}

/* ---- connecting ----------------------------------------------------------- */

static void link_close(ps_link *ln)
{
    hb_stop(ln);
    pthread_mutex_lock(&ln->lock);
    ps_client_close(&ln->cl);
    pthread_mutex_unlock(&ln->lock);
}

/* Connects ln and says hello, offering the segment when there is one;
 * *need_init: this psd asks for initial values. */
static int link_hello(ps_session *ss, ps_link *ln, int *need_init)
{
    ps_msg m, r;
    hb_stop(ln);
    pthread_mutex_lock(&ln->lock);
    int rc = ps_client_connect(&ln->cl, ln->server, 10000);
    pthread_mutex_unlock(&ln->lock);
    if (rc != 0)
        return rc;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_WORKER;
    m.shard = ss->shard;
    m.nshards = ss->nshards;
    m.layout = &ln->layout;
    m.fp = ps_layout_fingerprint(&ln->layout);
    ln->cl.wire_dt = PS_DT_F32; /* until this psd's welcome offers more */
    ln->shm_ok = 0;
    if (ss->shm) {
        m.has |= PS_F_SHM;
        m.shm_pid = (uint32_t)getpid();
        m.shm_fd = (uint32_t)ss->shm_fd;
        if (ss->nlinks > 1) {
            /* this part of both halves: [lo, hi) and [n + lo, n + hi) */
            m.shm_at = 1;
            m.shm_goff = ln->lo;
            m.shm_poff = ps_model_nparams(ss->model) + ln->lo;
        }
    }
    rc = ps_client_hello(&ln->cl, &m, ss->token, ss->token_len, &r, ss->timeout_ms);
    if (rc != 0)
        return rc;
    ln->shm_ok = ss->shm && (r.has & PS_F_INSHM) && r.inshm;
    if (ss->want_shm && !ss->shm_logged) {
        if (ln->shm_ok)
            PS_LOG(PS_LOG_INFO, "tensors through shared memory with psd at %s", ln->server);
        else
            PS_LOG(PS_LOG_DEBUG, "tensors over TCP: psd at %s did not map our shared memory (another machine "
                                 "or user; its log says why)", ln->server);
    }
    if (ss->want_dt != PS_DT_F32) {
        if ((r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(ss->want_dt)))
            ln->cl.wire_dt = ss->want_dt;
        else
            PS_LOG(PS_LOG_WARN, "psd at %s does not offer %s tensors (wire_bf16 = no, or an older psd): "
                                "sending float32", ln->server, ps_dtype_name(ss->want_dt));
    }
    snprintf(ln->mode, sizeof ln->mode, "%s", r.mode);
    ln->version = r.mver;
    *need_init = r.need_init;
    uint64_t hb = (r.has & PS_F_HB) ? r.hb : 0;
    ln->hb_interval_ms = hb ? (hb / 3 > 50 ? hb / 3 : 50) : 0;
    return 0;
}

/* A failed open closes every link it connected (fresh[i]), so the next
 * attempt says hello, sends initial values and pulls on each of them
 * again, rather than finding a link open that never got its part; then
 * returns rc, the error of link i. */
static int open_fail(ps_session *ss, const int *fresh, uint32_t i, int rc)
{
    for (uint32_t k = 0; k < ss->nlinks; k++)
        if (fresh[k])
            link_close(&ss->links[k]);
    return lfail(ss, i, rc);
}

int ps_session_open(ps_session *ss)
{
    int need_init[PS_PARTS_MAX] = {0}, fresh[PS_PARTS_MAX] = {0}, any_init = 0;
    size_t n = ps_model_nparams(ss->model);
    ss->err[0] = '\0';
    ps_model_unbind_params(ss->model); /* not in the segment, which psd may write */
    /* a segment when every part can use it (one block each) */
    int small = 1;
    for (uint32_t i = 0; i < ss->nlinks; i++)
        small &= ss->links[i].hi - ss->links[i].lo <= CHUNK_FLOATS;
    if (ss->want_shm && small && !ss->shm && shm_create(ss) != 0)
        PS_LOG(PS_LOG_DEBUG, "no shared-memory segment (%s): tensors over TCP", strerror(errno));
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        if (ln->cl.fd >= 0)
            continue;
        fresh[i] = 1;
        int rc = link_hello(ss, ln, &need_init[i]);
        if (rc != 0)
            return open_fail(ss, fresh, i, rc);
        any_init |= need_init[i];
    }
    ss->shm_logged |= ss->want_shm;
    ss->shm_ok = 0;
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        ss->shm_ok |= ln->shm_ok;
        if (strcmp(ln->mode, ss->links[0].mode) != 0) {
            serr(ss, "psd at %s runs %s but psd at %s runs %s: every psd holding a part of the model must run "
                     "the same mode", ss->links[0].server, ss->links[0].mode, ln->server, ln->mode);
            return open_fail(ss, fresh, i, PS_EINVAL);
        }
    }
    snprintf(ss->mode, sizeof ss->mode, "%s", ss->links[0].mode);
    ss->bsp = strcmp(ss->mode, "bsp") == 0;
    if (!ss->comm_running)
        ps_model_bind_grads(ss->model, ss->shm_ok ? ss->shm : NULL);
    /* the model's own vector from here on */
    float *params = ps_model_params(ss->model);
    if (any_init) {
        /* psd holds no values: offer ours (the latest we pulled, or a
         * seeded start) */
        if (!ss->have_params)
            ps_model_init_params(ss->model, ss->seed);
        else
            PS_LOG(PS_LOG_WARN, "psd has no model (restarted without a checkpoint?): giving it ours");
    }
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        if (!fresh[i])
            continue;
        int rc = need_init[i] ? send_chunks(ss, ln, PS_MSG_INIT, params + ln->lo, ln->hi - ln->lo, 0) : 0;
        if (rc == 0)
            rc = pull_part(ss, ln, params + ln->lo, 0);
        if (rc != 0)
            return open_fail(ss, fresh, i, rc);
    }
    ss->have_params = 1;
    ss->version = ss->links[0].version;
    if (ss->nlinks > 1 && ss->shm_ok) {
        /* the parameters live in the segment's second half, where the psd
         * on this machine answers its part and the others' are read */
        memcpy(ss->shm + n, params, n * sizeof(float));
        ps_model_bind_params(ss->model, ss->shm + n);
    }
    for (uint32_t i = 0; i < ss->nlinks; i++)
        if (fresh[i])
            hb_start(&ss->links[i]);
    return 0;
}

int ps_session_recoverable(const ps_session *ss, int rc)
{
    const ps_client *cl = &ss->links[ss->err_link].cl;
    switch (rc) {
    case PS_ECLOSED:
    case PS_EIO:
    case PS_ECONNECT:
    case PS_ETIMEOUT:
        return 1;
    case PS_EREMOTE:
        /* psd shutting down; our old connection not yet noticed gone; the
         * worker giving initial values left before finishing */
        return cl->remote_code == -PS_ESHUTDOWN || cl->remote_code == -PS_ESHARD ||
               cl->remote_code == -PS_ENOT_READY;
    default:
        return 0;
    }
}

int ps_session_reconnect(ps_session *ss)
{
    /* the comm thread is idle: ps_session_step returned its error */
    int64_t start = mono_ms(), deadline = start + ss->reconnect_ms;
    uint64_t delay = 100;
    unsigned seed = (unsigned)(ss->shard * 2654435761u) ^ (unsigned)start;
    uint32_t li = ss->err_link;
    ps_link *ln = &ss->links[li];
    char first[256];
    snprintf(first, sizeof first, "%.200s", ps_session_error(ss));
    PS_LOG(PS_LOG_WARN, "lost psd at %s (%s); reconnecting for up to %d s", ln->server, first,
           ss->reconnect_ms / 1000);
    link_close(ln);
    for (int attempt = 1;; attempt++) {
        /* full jitter: sleep a random time in [delay/2, delay] */
        uint64_t sleep_ms = delay / 2 + (uint64_t)rand_r(&seed) % (delay / 2 + 1);
        int64_t now = mono_ms();
        if (now + (int64_t)sleep_ms > deadline)
            sleep_ms = deadline > now ? (uint64_t)(deadline - now) : 0;
        struct timespec ts = {(time_t)(sleep_ms / 1000), (long)(sleep_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        int rc = ps_session_open(ss);
        if (rc == 0) {
            ss->reconnects++;
            PS_LOG(PS_LOG_INFO, "reconnected to psd at %s after %.1f s (attempt %d): mode %s, model version %" PRIu64,
                   ln->server, (double)(mono_ms() - start) / 1e3, attempt, ss->mode, ln->version);
            return 0;
        }
        /* open stops at the first link that fails; that one is closed again */
        link_close(&ss->links[ss->err_link]);
        if (!ps_session_recoverable(ss, rc))
            return rc;
        if (mono_ms() >= deadline) {
            snprintf(ss->err, sizeof ss->err,
                     "psd at %.280s unreachable for %.0f s (%.200s); giving up (see --reconnect-timeout)", ln->server,
                     (double)(mono_ms() - start) / 1e3, first);
            return PS_ETIMEOUT;
        }
        delay = delay * 2 > 5000 ? 5000 : delay * 2;
    }
}

void ps_session_close(ps_session *ss)
{
    pipeline_stop(ss);
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        hb_stop(ln);
        if (ln->cl.fd >= 0) {
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_BYE);
            ps_client_call(&ln->cl, &m, &r, 5000);
        }
        link_close(ln);
    }
}

void ps_session_free(ps_session *ss)
{
    pipeline_stop(ss);
    if (ss->links)
        shm_free(ss);
    ps_model_unbind_params(ss->model);
    free(ss->held);
    ss->held = NULL;
    free(ss->held_wide);
    ss->held_wide = NULL;
    for (uint32_t i = 0; i < ss->nlinks; i++) {
        ps_link *ln = &ss->links[i];
        hb_stop(ln);
        ln->cl.send_lock = NULL;
        ps_client_free(&ln->cl);
        pthread_mutex_destroy(&ln->lock);
        pthread_cond_destroy(&ln->wake);
    }
    free(ss->links);
    ss->links = NULL;
    ss->nlinks = 0;
}
