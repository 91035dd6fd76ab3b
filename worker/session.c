/* session.c - a worker's connection to psd (see session.h). */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS */
#include "session.h"

#include <errno.h>
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
    return ps_client_error(&ss->cl);
}

int ps_session_init(ps_session *ss, const char *server, uint32_t shard, uint32_t nshards, ps_model *model,
                    uint64_t seed, int timeout_ms, int reconnect_ms)
{
    memset(ss, 0, sizeof *ss);
    ps_client_init(&ss->cl);
    pthread_mutex_init(&ss->lock, NULL);
    pthread_cond_init(&ss->wake, NULL);
    ss->cl.send_lock = &ss->lock;
    ss->shm_fd = -1;
    ss->server = server;
    ss->shard = shard;
    ss->nshards = nshards;
    ss->model = model;
    ss->seed = seed;
    ss->timeout_ms = timeout_ms;
    ss->reconnect_ms = reconnect_ms;
    return ps_model_layout(model, &ss->layout);
}

/* ---- heartbeats ----------------------------------------------------------- */

static void *hb_main(void *arg)
{
    ps_session *ss = arg;
    pthread_mutex_lock(&ss->lock);
    while (!ss->hb_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + ss->hb_interval_ms * 1000000ull;
        until.tv_sec += (time_t)(ns / 1000000000ull);
        until.tv_nsec = (long)(ns % 1000000000ull);
        int rc = pthread_cond_timedwait(&ss->wake, &ss->lock, &until);
        if (ss->hb_stop)
            break;
        if (rc == ETIMEDOUT && ss->cl.fd >= 0) {
            ps_msg m;
            ps_msg_init(&m, PS_MSG_HEARTBEAT);
            /* the send lock is held (the condition wait returned with it), so
             * no other frame can be half written: send without taking it */
            ps_client_send_noreply_held(&ss->cl, &m);
        }
    }
    pthread_mutex_unlock(&ss->lock);
    return NULL;
}

static void hb_stop(ps_session *ss)
{
    if (!ss->hb_running)
        return;
    pthread_mutex_lock(&ss->lock);
    ss->hb_stop = 1;
    pthread_cond_signal(&ss->wake);
    pthread_mutex_unlock(&ss->lock);
    pthread_join(ss->hb_thread, NULL);
    ss->hb_running = 0;
    ss->hb_stop = 0;
}

static void hb_start(ps_session *ss)
{
    if (ss->hb_running || ss->hb_interval_ms == 0)
        return;
    if (pthread_create(&ss->hb_thread, NULL, hb_main, ss) == 0)
        ss->hb_running = 1;
    else
        PS_LOG(PS_LOG_WARN, "cannot start the heartbeat thread; psd may declare this worker dead when it is idle");
}

/* ---- requests ------------------------------------------------------------- */

/* Sends values[0..n) as chunks of type INIT or PUSH (fin on the last),
 * back to back, and then reads their OKs (psd answers in order). A push psd
 * dropped because its round had closed is counted, not an error. */
static int send_chunks(ps_session *ss, uint32_t type, const float *values, size_t n, uint64_t base)
{
    size_t sent = 0;
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
        int rc = ps_client_send(&ss->cl, &m);
        if (rc != 0)
            return rc;
        sent++;
    }
    for (size_t i = 0; i < sent; i++) {
        ps_msg r;
        int rc = ps_client_recv(&ss->cl, &r, ss->timeout_ms);
        if (rc == PS_EREMOTE && ss->cl.remote_code == -PS_ESTALE) {
            ss->dropped += i + 1 == sent; /* the fin chunk's answer counts the step */
            continue;
        }
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_OK)
            return PS_EMALFORMED;
    }
    return 0;
}

/* Pulls the whole model at version >= min into the model's parameters,
 * PS_PULL_WINDOW chunk requests in flight. */
static int pull_all(ps_session *ss, uint64_t min)
{
    ps_model_unbind_params(ss->model);
    int rc = ps_client_pull_chunks(&ss->cl, ps_model_params(ss->model), ps_model_nparams(ss->model), min,
                                   CHUNK_FLOATS, PS_PULL_WINDOW, &ss->version, ss->timeout_ms);
    if (rc == 0)
        ss->have_params = 1;
    return rc;
}

/* ---- shared memory --------------------------------------------------------- */

/* The segment a psd on this machine can map instead of sending the tensors
 * over loopback TCP (server/shm.c): a memfd of 2 x n floats, sealed so that
 * it can neither shrink (psd would fault on the missing pages) nor grow.
 * Made once; every connection offers the same one. */
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

/* One PUSHPULL round trip of grads through the segment: psd reads them
 * there and answers with the parameters in its second half. */
static int pushpull_shm(ps_session *ss, const float *grads, size_t n, uint64_t base, uint64_t min,
                        const float **data, uint64_t *version)
{
    ps_msg m, r;
    if (grads != ss->shm)
        memcpy(ss->shm, grads, n * sizeof(float));
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_LEN | PS_F_INSHM | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.base = base;
    m.len = n;
    m.inshm = 1;
    m.plen = n;
    m.min = min;
    int rc = ps_client_call(&ss->cl, &m, &r, ss->timeout_ms);
    if (rc != 0)
        return rc;
    if (r.type != PS_MSG_PARAMS || !r.inshm || r.off != 0 || r.len != n)
        return PS_EMALFORMED;
    *data = ss->shm + n;
    *version = r.mver;
    return 0;
}

/* One PUSHPULL round trip of grads (n <= CHUNK_FLOATS) against base: on
 * success *data and *version describe the parameters that came back, which
 * live in the client's receive buffer until ps_session adopts them. Touches
 * neither the model nor the session's version (it may run on the comm
 * thread). */
static int pushpull(ps_session *ss, const float *grads, size_t n, uint64_t base, uint64_t min, const float **data,
                    uint64_t *version)
{
    if (ss->shm_ok && !ss->comm_running)
        return pushpull_shm(ss, grads, n, base, min, data, version);
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.base = base;
    m.data = grads;
    m.ndata = n;
    m.plen = n;
    m.min = min;
    int rc = ps_client_call(&ss->cl, &m, &r, ss->timeout_ms);
    if (rc != 0)
        return rc;
    if (r.type != PS_MSG_PARAMS || r.off != 0 || r.ndata != n)
        return PS_EMALFORMED;
    *data = r.data;
    *version = r.mver;
    return 0;
}

/* Makes the parameters that just arrived the model's: no copy, the model
 * reads them where they landed, and that buffer leaves the client (which
 * gets the previous one back) so no later receive can overwrite them. */
static void adopt(ps_session *ss, const float *data, uint64_t version)
{
    if (ss->bsp && version > ss->version + 1)
        ss->dropped++; /* the round closed without our push */
    ps_model_bind_params(ss->model, (float *)(uintptr_t)data);
    if (ss->shm && data == ss->shm + ps_model_nparams(ss->model))
        ; /* psd writes there only when asked, and the next step asks */
    else if (data == ss->cl.wide)
        ps_client_swap_wide(&ss->cl, &ss->held_wide, &ss->held_wide_cap);
    else
        ps_client_swap_rbuf(&ss->cl, &ss->held, &ss->held_cap);
    ss->version = version;
}

/* ---- pipelining ------------------------------------------------------------ */

static void *comm_main(void *arg)
{
    ps_session *ss = arg;
    size_t n = ps_model_nparams(ss->model);
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
        int rc = pushpull(ss, g, n, base, 0, &data, &version);
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
    return rc;
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
        if (ss->bsp || ps_model_nparams(ss->model) > CHUNK_FLOATS)
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

int ps_session_step(ps_session *ss)
{
    if (ss->comm_running)
        return step_pipelined(ss);
    size_t n = ps_model_nparams(ss->model);
    const float *grads = ps_model_grads(ss->model);
    uint64_t min = ss->bsp ? ss->version + 1 : 0;
    if (n <= CHUNK_FLOATS) {
        const float *data;
        uint64_t version;
        int rc = pushpull(ss, grads, n, ss->version, min, &data, &version);
        if (rc != 0)
            return rc;
        adopt(ss, data, version);
        return 0;
    }
    int rc = send_chunks(ss, PS_MSG_PUSH, grads, n, ss->version);
    if (rc != 0)
        return rc;
    return pull_all(ss, min);
}

int ps_session_report(ps_session *ss, uint32_t epoch, double loss, int has_acc, double acc, double tloss,
                      uint64_t samples, double rate)
{
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
    return ps_client_call(&ss->cl, &m, &r, ss->timeout_ms);
}

int ps_session_live_shards(ps_session *ss, uint32_t *rank, uint32_t *count)
{
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_STATUS);
    int rc = ps_client_call(&ss->cl, &m, &r, ss->timeout_ms);
    if (rc != 0)
        return rc;
    const msgpack_object *ws = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "workers") : NULL;
    if (!ws || ws->type != MSGPACK_OBJECT_ARRAY)
        return PS_EMALFORMED;
    uint32_t lost = 0, lost_below = 0;
    for (uint32_t i = 0; i < ws->via.array.size; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        const msgpack_object *sh = ps_map_get(w, "shard"), *st = ps_map_get(w, "state");
        if (!sh || sh->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !st || st->type != MSGPACK_OBJECT_STR)
            return PS_EMALFORMED;
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

int ps_session_open(ps_session *ss)
{
    ps_msg m, r;
    hb_stop(ss);
    pthread_mutex_lock(&ss->lock);
    int rc = ps_client_connect(&ss->cl, ss->server, 10000);
    pthread_mutex_unlock(&ss->lock);
    if (rc != 0)
        return rc;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_WORKER;
    m.shard = ss->shard;
    m.nshards = ss->nshards;
    m.layout = &ss->layout;
    m.fp = ps_layout_fingerprint(&ss->layout);
    ss->cl.wire_dt = PS_DT_F32; /* until this psd's welcome offers more */
    ps_model_unbind_params(ss->model); /* not in the segment, which psd may write */
    ss->shm_ok = 0;
    if (ss->want_shm && ps_model_nparams(ss->model) <= CHUNK_FLOATS && shm_create(ss) == 0) {
        m.has |= PS_F_SHM;
        m.shm_pid = (uint32_t)getpid();
        m.shm_fd = (uint32_t)ss->shm_fd;
    }
    rc = ps_client_hello(&ss->cl, &m, ss->token, ss->token_len, &r, ss->timeout_ms);
    if (rc != 0)
        return rc;
    ss->shm_ok = ss->shm && (r.has & PS_F_INSHM) && r.inshm;
    if (!ss->comm_running)
        ps_model_bind_grads(ss->model, ss->shm_ok ? ss->shm : NULL);
    if (ss->want_shm && !ss->shm_logged) {
        ss->shm_logged = 1;
        if (ss->shm_ok)
            PS_LOG(PS_LOG_INFO, "tensors through shared memory with psd at %s", ss->server);
        else
            PS_LOG(PS_LOG_DEBUG, "tensors over TCP: psd at %s did not map our shared memory (another machine "
                                 "or user; its log says why)", ss->server);
    }
    if (ss->want_dt != PS_DT_F32) {
        if ((r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(ss->want_dt)))
            ss->cl.wire_dt = ss->want_dt;
        else
            PS_LOG(PS_LOG_WARN, "psd at %s does not offer %s tensors (wire_bf16 = no, or an older psd): "
                                "sending float32", ss->server, ps_dtype_name(ss->want_dt));
    }
    snprintf(ss->mode, sizeof ss->mode, "%s", r.mode);
    ss->bsp = strcmp(r.mode, "bsp") == 0;
    ss->version = r.mver;
    uint64_t hb = (r.has & PS_F_HB) ? r.hb : 0;
    ss->hb_interval_ms = hb ? (hb / 3 > 50 ? hb / 3 : 50) : 0;
    ps_model_unbind_params(ss->model); /* the model's own vector from here on */
    if (r.need_init) {
        /* psd holds no values: offer ours (the latest we pulled, or a
         * seeded start) */
        if (!ss->have_params)
            ps_model_init_params(ss->model, ss->seed);
        else
            PS_LOG(PS_LOG_WARN, "psd has no model (restarted without a checkpoint?): giving it ours");
        rc = send_chunks(ss, PS_MSG_INIT, ps_model_params(ss->model), ps_model_nparams(ss->model), 0);
        if (rc != 0)
            return rc;
    }
    rc = pull_all(ss, 0);
    if (rc != 0)
        return rc;
    hb_start(ss);
    return 0;
}

int ps_session_recoverable(const ps_session *ss, int rc)
{
    switch (rc) {
    case PS_ECLOSED:
    case PS_EIO:
    case PS_ECONNECT:
    case PS_ETIMEOUT:
        return 1;
    case PS_EREMOTE:
        /* psd shutting down; our old connection not yet noticed gone; the
         * worker giving initial values left before finishing */
        return ss->cl.remote_code == -PS_ESHUTDOWN || ss->cl.remote_code == -PS_ESHARD ||
               ss->cl.remote_code == -PS_ENOT_READY;
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
    char first[256];
    snprintf(first, sizeof first, "%.200s", ps_session_error(ss));
    PS_LOG(PS_LOG_WARN, "lost psd at %s (%s); reconnecting for up to %d s", ss->server, first,
           ss->reconnect_ms / 1000);
    hb_stop(ss);
    pthread_mutex_lock(&ss->lock);
    ps_client_close(&ss->cl);
    pthread_mutex_unlock(&ss->lock);
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
                   ss->server, (double)(mono_ms() - start) / 1e3, attempt, ss->mode, ss->version);
            return 0;
        }
        pthread_mutex_lock(&ss->lock);
        ps_client_close(&ss->cl);
        pthread_mutex_unlock(&ss->lock);
        if (!ps_session_recoverable(ss, rc))
            return rc;
        if (mono_ms() >= deadline) {
            snprintf(ss->cl.err, sizeof ss->cl.err,
                     "psd at %s unreachable for %.0f s (%s); giving up (see --reconnect-timeout)", ss->server,
                     (double)(mono_ms() - start) / 1e3, first);
            return PS_ETIMEOUT;
        }
        delay = delay * 2 > 5000 ? 5000 : delay * 2;
    }
}

void ps_session_close(ps_session *ss)
{
    pipeline_stop(ss);
    hb_stop(ss);
    if (ss->cl.fd >= 0) {
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_BYE);
        ps_client_call(&ss->cl, &m, &r, 5000);
    }
    pthread_mutex_lock(&ss->lock);
    ps_client_close(&ss->cl);
    pthread_mutex_unlock(&ss->lock);
}

void ps_session_free(ps_session *ss)
{
    pipeline_stop(ss);
    shm_free(ss);
    ps_model_unbind_params(ss->model);
    free(ss->held);
    ss->held = NULL;
    free(ss->held_wide);
    ss->held_wide = NULL;
    hb_stop(ss);
    ss->cl.send_lock = NULL;
    ps_client_free(&ss->cl);
    pthread_mutex_destroy(&ss->lock);
    pthread_cond_destroy(&ss->wake);
}
