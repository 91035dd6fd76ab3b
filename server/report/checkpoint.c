/* checkpoint.c - writing and loading checkpoints (see checkpoint.h). */
#include "server/report/checkpoint.h"
#include "server/policy/policy.h"
#include "server/update/update.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/log.h"
#include "proto/errors.h"

#define CKPT_MAGIC "PSDCKPT1"
#define CKPT_END "PSDE"
#define CKPT_FORMAT 1
#define CKPT_MAX_STATE 4
#define CKPT_HEADER_MAX (4u << 20)

/* Everything a write needs, owned by the job so the loop can go on. */
typedef struct ckpt_job {
    psd *s;
    char dir[PS_CONFIG_PATH_MAX];
    int keep;
    uint64_t version;
    srv_snap *snap;           /* parameters (a reference, not a copy) */
    size_t n;
    float *state[CKPT_MAX_STATE]; /* copies of the optimizer state */
    size_t nstate;
    ps_buf header;
    int rc;
    char err[PS_CONFIG_PATH_MAX * 2 + 256];
    double seconds;
} ckpt_job;

static void pk_key(msgpack_packer *pk, const char *k)
{
    msgpack_pack_str(pk, strlen(k));
    msgpack_pack_str_body(pk, k, strlen(k));
}

static void pk_str(msgpack_packer *pk, const char *k, const char *v)
{
    pk_key(pk, k);
    msgpack_pack_str(pk, strlen(v));
    msgpack_pack_str_body(pk, v, strlen(v));
}

static int buf_write_cb(void *data, const char *p, size_t len)
{
    ps_buf *b = data;
    if (ps_buf_reserve(b, len) != 0)
        return -1;
    memcpy(b->p + b->len, p, len);
    b->len += len;
    return 0;
}

/* "plan": the job's plan (plan.c) and who is out of it: {epochs, samples,
 * batch, seed, out: [shards below M that joined and then left or were
 * lost]}. The round is the checkpoint's version. */
static void pack_plan(msgpack_packer *pk, const psd *s)
{
    const ps_plan *p = &s->plan.p;
    uint32_t m = (uint32_t)s->cfg.workers, nout = 0;
    for (uint32_t i = 0; i < m && i < s->nworkers_cap; i++)
        nout += s->workers[i] && s->workers[i]->state != SRV_W_CONNECTED;
    pk_key(pk, "plan");
    msgpack_pack_map(pk, 5);
    pk_key(pk, "epochs");
    msgpack_pack_uint64(pk, p->epochs);
    pk_key(pk, "samples");
    msgpack_pack_uint64(pk, p->samples);
    pk_key(pk, "batch");
    msgpack_pack_uint64(pk, p->batch);
    pk_key(pk, "seed");
    msgpack_pack_uint64(pk, p->seed);
    pk_key(pk, "out");
    msgpack_pack_array(pk, nout);
    for (uint32_t i = 0; i < m && i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->state != SRV_W_CONNECTED)
            msgpack_pack_uint32(pk, i);
}

static int build_header(psd *s, ckpt_job *j, const char *const *names)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &j->header, buf_write_cb);
    const ps_layout *l = &s->model.layout;
    const ps_config *c = &s->cfg;
    msgpack_pack_map(&pk, s->plan.set ? 9 : 8);
    pk_key(&pk, "version");
    msgpack_pack_uint64(&pk, j->version);
    pk_key(&pk, "created");
    msgpack_pack_double(&pk, (double)time(NULL));
    pk_key(&pk, "params");
    msgpack_pack_uint64(&pk, l->total);
    pk_key(&pk, "layout");
    ps_layout_pack(&pk, l);
    pk_str(&pk, "optimizer", srv_optim_name(&s->model.opt));
    pk_key(&pk, "settings");
    msgpack_pack_map(&pk, 6);
    pk_key(&pk, "lr");
    msgpack_pack_double(&pk, c->lr);
    pk_key(&pk, "momentum");
    msgpack_pack_double(&pk, c->momentum);
    pk_key(&pk, "weight_decay");
    msgpack_pack_double(&pk, c->weight_decay);
    pk_key(&pk, "beta1");
    msgpack_pack_double(&pk, c->beta1);
    pk_key(&pk, "beta2");
    msgpack_pack_double(&pk, c->beta2);
    pk_key(&pk, "mode");
    msgpack_pack_str(&pk, strlen(s->policy->name));
    msgpack_pack_str_body(&pk, s->policy->name, strlen(s->policy->name));
    pk_key(&pk, "state");
    msgpack_pack_array(&pk, (uint32_t)j->nstate);
    for (size_t i = 0; i < j->nstate; i++) {
        msgpack_pack_str(&pk, strlen(names[i]));
        msgpack_pack_str_body(&pk, names[i], strlen(names[i]));
    }
    pk_key(&pk, "clocks");
    uint32_t nw = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        nw += s->workers[i] != NULL;
    msgpack_pack_array(&pk, nw);
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        if (!s->workers[i])
            continue;
        msgpack_pack_array(&pk, 2);
        msgpack_pack_uint32(&pk, i);
        msgpack_pack_uint64(&pk, s->workers[i]->clock);
    }
    if (s->plan.set)
        pack_plan(&pk, s);
    return j->header.len > CKPT_HEADER_MAX ? PS_ETOO_BIG : 0;
}

static void job_free(ckpt_job *j)
{
    srv_snap_unref(j->snap);
    for (size_t i = 0; i < j->nstate; i++)
        free(j->state[i]);
    ps_buf_free(&j->header);
    free(j);
}

/* Prepares a job on the loop thread; NULL when out of memory. */
static ckpt_job *job_new(psd *s)
{
    ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    float *bufs[CKPT_MAX_STATE];
    const char *names[CKPT_MAX_STATE];
    j->s = s;
    snprintf(j->dir, sizeof j->dir, "%s", s->cfg.state_dir);
    j->keep = s->cfg.checkpoint_keep;
    j->version = s->model.version;
    j->snap = srv_snap_take(&s->model);
    if (!j->snap) {
        free(j);
        return NULL;
    }
    j->n = s->model.layout.total;
    j->nstate = srv_optim_state_buffers(&s->model.opt, bufs, names, CKPT_MAX_STATE);
    for (size_t i = 0; i < j->nstate; i++) {
        j->state[i] = malloc(j->n * sizeof(float));
        if (!j->state[i]) {
            j->nstate = i;
            job_free(j);
            return NULL;
        }
        memcpy(j->state[i], bufs[i], j->n * sizeof(float));
    }
    if (build_header(s, j, names) != 0) {
        job_free(j);
        return NULL;
    }
    return j;
}

static int write_all(int fd, const void *p, size_t len, uLong *crc)
{
    const uint8_t *b = p;
    *crc = crc32_z(*crc, b, len);
    while (len > 0) {
        ssize_t n = write(fd, b, len > (1u << 30) ? (1u << 30) : len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_ckpt_name(const char *name, uint64_t *version)
{
    size_t n = strlen(name);
    if (n != 5 + 20 + 5 || strncmp(name, "ckpt-", 5) != 0 || strcmp(name + 25, ".psdc") != 0)
        return 0;
    uint64_t v = 0;
    for (int i = 5; i < 25; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *version = v;
    return 1;
}

/* A checkpoint being written: ckpt-<20 digits>.psdc.tmp. */
static int is_ckpt_tmp_name(const char *name)
{
    uint64_t v;
    char base[32];
    size_t n = strlen(name);
    if (n != 5 + 20 + 5 + 4 || strcmp(name + 30, ".tmp") != 0)
        return 0;
    memcpy(base, name, 30);
    base[30] = 0;
    return is_ckpt_name(base, &v);
}

/* Removes the checkpoints a psd killed while writing them left behind
 * (at start, before any write of this psd's own), each with a log line. */
static void remove_leftovers(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_ckpt_tmp_name(e->d_name))
            continue;
        char path[PS_CONFIG_PATH_MAX + 64];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        if (unlink(path) == 0)
            PS_LOG(PS_LOG_INFO, "removed %s (%lld bytes): a checkpoint whose writing was interrupted", path, size);
        else
            PS_LOG(PS_LOG_WARN, "cannot remove %s, a checkpoint whose writing was interrupted: %s", path,
                   strerror(errno));
    }
    closedir(d);
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Lists checkpoint versions in dir, newest first. *out is malloc'd. */
static size_t list_versions(const char *dir, uint64_t **out)
{
    DIR *d = opendir(dir);
    size_t n = 0, cap = 0;
    uint64_t *v = NULL;
    *out = NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t ver;
        if (!is_ckpt_name(e->d_name, &ver))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *t = realloc(v, nc * sizeof *v);
            if (!t)
                break;
            v = t, cap = nc;
        }
        v[n++] = ver;
    }
    closedir(d);
    if (n)
        qsort(v, n, sizeof *v, cmp_desc);
    *out = v;
    return n;
}

static void ckpt_path(char *buf, size_t len, const char *dir, uint64_t version, const char *suffix)
{
    snprintf(buf, len, "%s/ckpt-%020" PRIu64 ".psdc%s", dir, version, suffix);
}

/* The file work, on a pool thread (or the loop at shutdown): touches only
 * the job. */
static void job_run(ckpt_job *j)
{
    char tmp[PS_CONFIG_PATH_MAX + 64], path[PS_CONFIG_PATH_MAX + 64];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ckpt_path(path, sizeof path, j->dir, j->version, "");
    ckpt_path(tmp, sizeof tmp, j->dir, j->version, ".tmp");
    j->rc = PS_EIO;
    if (mkdir(j->dir, 0750) != 0 && errno != EEXIST) {
        snprintf(j->err, sizeof j->err, "cannot create %s: %s", j->dir, strerror(errno));
        return;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0) {
        snprintf(j->err, sizeof j->err, "cannot create %s: %s", tmp, strerror(errno));
        return;
    }
    uint8_t head[16], tail[8];
    uLong crc = crc32_z(0L, Z_NULL, 0);
    memcpy(head, CKPT_MAGIC, 8);
    put_u32(head + 8, CKPT_FORMAT);
    put_u32(head + 12, (uint32_t)j->header.len);
    int bad = write_all(fd, head, sizeof head, &crc) || write_all(fd, j->header.p, j->header.len, &crc);
    for (size_t i = 0; !bad && i < j->snap->nblk; i++)
        bad = write_all(fd, j->snap->blk[i]->w, j->snap->blk[i]->cap * sizeof(float), &crc);
    for (size_t i = 0; !bad && i < j->nstate; i++)
        bad = write_all(fd, j->state[i], j->n * sizeof(float), &crc);
    put_u32(tail, (uint32_t)crc);
    memcpy(tail + 4, CKPT_END, 4);
    uLong dummy = 0;
    if (!bad)
        bad = write_all(fd, tail, sizeof tail, &dummy);
    if (bad || fsync(fd) != 0) {
        snprintf(j->err, sizeof j->err, "writing %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        snprintf(j->err, sizeof j->err, "renaming %s: %s", tmp, strerror(errno));
        unlink(tmp);
        return;
    }
    int dfd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    /* keep the newest `keep` */
    uint64_t *vers;
    size_t nv = list_versions(j->dir, &vers);
    for (size_t i = (size_t)j->keep; i < nv; i++) {
        ckpt_path(path, sizeof path, j->dir, vers[i], "");
        unlink(path);
    }
    free(vers);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    j->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    j->rc = 0;
}

static void job_finish(psd *s, ckpt_job *j)
{
    if (j->rc == 0) {
        s->stats.checkpoints++;
        s->stats.checkpoint_ms = srv_now_ms();
        s->stats.checkpoint_version = j->version;
        s->stats.checkpoint_error[0] = '\0';
        PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 " written to %s/ckpt-%020" PRIu64 ".psdc in %.3f s",
               j->version, j->dir, j->version, j->seconds);
    } else {
        s->stats.checkpoint_failures++;
        size_t n = strnlen(j->err, sizeof s->stats.checkpoint_error - 1); /* cut, for the ADMIN reply */
        memcpy(s->stats.checkpoint_error, j->err, n);
        s->stats.checkpoint_error[n] = '\0';
        PS_LOG(PS_LOG_ERROR, "checkpoint of version %" PRIu64 " failed: %s", j->version, j->err);
    }
}

static void on_work(uv_work_t *req)
{
    job_run(req->data);
}

static void on_after_work(uv_work_t *req, int status)
{
    ckpt_job *j = req->data;
    psd *s = j->s;
    s->checkpoint_busy = 0;
    if (status == UV_ECANCELED) {
        j->rc = PS_EIO;
        snprintf(j->err, sizeof j->err, "cancelled");
    }
    job_finish(s, j);
    job_free(j);
}

/* A BSP round closing piece by piece has applied some of its pieces: the
 * parameters and the optimizer's state are then of two versions, and a
 * checkpoint waits for the round to close. */
static int mid_round(psd *s)
{
    return s->policy->round_base && s->policy->round_base(s);
}

void srv_checkpoint_start(psd *s, int force)
{
    if (!s->cfg.state_dir[0] || !s->model.initialized || s->checkpoint_busy)
        return;
    if (srv_update_busy(s) || mid_round(s))
        return; /* it writes the optimizer state: the next tick tries again */
    if (!force && s->stats.checkpoint_ms && s->stats.checkpoint_version == s->model.version)
        return;
    ckpt_job *j = job_new(s);
    if (!j) {
        s->stats.checkpoint_failures++;
        snprintf(s->stats.checkpoint_error, sizeof s->stats.checkpoint_error, "out of memory");
        PS_LOG(PS_LOG_ERROR, "checkpoint: out of memory");
        return;
    }
    s->checkpoint_req.data = j;
    if (uv_queue_work(s->loop, &s->checkpoint_req, on_work, on_after_work) != 0) {
        job_free(j);
        return;
    }
    s->checkpoint_busy = 1;
}

int srv_work_stopped(const psd *s)
{
    if (s->stats.worker_joins == 0)
        return 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->state == SRV_W_CONNECTED)
            return 0;
    return 1;
}

int srv_checkpoint_at_rest(psd *s, const char *why)
{
    if (!s->cfg.state_dir[0] || !s->model.initialized)
        return 1;
    if (s->stats.checkpoint_ms && s->stats.checkpoint_version == s->model.version)
        return 1; /* an unchanged model is not written twice */
    if (s->checkpoint_busy || srv_update_busy(s) || mid_round(s))
        return 0;
    PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 ": %s", s->model.version, why);
    srv_checkpoint_start(s, 0);
    return 1;
}

void srv_checkpoint_rest_tick(psd *s)
{
    if (s->paused)
        srv_checkpoint_at_rest(s, "psd is paused");
    else if (srv_work_stopped(s))
        srv_checkpoint_at_rest(s, "the last worker left");
}

int srv_checkpoint_write_now(psd *s)
{
    if (!s->cfg.state_dir[0] || !s->model.initialized)
        return 0;
    if (s->stats.checkpoint_ms && s->stats.checkpoint_version == s->model.version)
        return 0;
    if (mid_round(s))
        PS_LOG(PS_LOG_WARN, "final checkpoint: round %" PRIu64 " had applied some of its pieces; they are written "
               "with it, and the round, done again, applies them a second time", s->model.version);
    ckpt_job *j = job_new(s);
    if (!j) {
        PS_LOG(PS_LOG_ERROR, "final checkpoint: out of memory");
        return PS_ENOMEM;
    }
    job_run(j);
    job_finish(s, j);
    int rc = j->rc;
    job_free(j);
    return rc;
}

/* ---- loading -------------------------------------------------------------- */


static int get_u64(const msgpack_object *map, const char *key, uint64_t *v)
{
    const msgpack_object *o = ps_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    *v = o->via.u64;
    return 0;
}

/* Reads a checkpoint's "plan" (pack_plan) into *p and the shards out of
 * the job into out (those below max, at most max of them, *nout). 0, or
 * -1 with err filled when it is not one psd wrote. */
static int read_plan(const msgpack_object *o, ps_plan *p, uint32_t *out, uint32_t max, uint32_t *nout, char *err,
                     size_t errlen)
{
    *nout = 0;
    const msgpack_object *x = o->type == MSGPACK_OBJECT_MAP ? ps_map_get(o, "out") : NULL;
    if (o->type != MSGPACK_OBJECT_MAP || get_u64(o, "epochs", &p->epochs) || get_u64(o, "samples", &p->samples) ||
        get_u64(o, "batch", &p->batch) || get_u64(o, "seed", &p->seed) || !x || x->type != MSGPACK_OBJECT_ARRAY) {
        snprintf(err, errlen, "not a map of epochs, samples, batch, seed and out");
        return -1;
    }
    if (p->epochs < 1 || p->epochs > PS_PLAN_EPOCHS_MAX || p->samples < 1 || p->samples > PS_PLAN_SAMPLES_MAX ||
        p->batch < 1 || p->batch > p->samples) {
        snprintf(err, errlen, "%llu epochs of %llu samples, %llu per round: out of bounds",
                 (unsigned long long)p->epochs, (unsigned long long)p->samples, (unsigned long long)p->batch);
        return -1;
    }
    for (uint32_t i = 0; i < x->via.array.size; i++) {
        const msgpack_object *e = &x->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            snprintf(err, errlen, "out holds a %s, not a shard", e->type == MSGPACK_OBJECT_STR ? "string" : "non-integer");
            return -1;
        }
        if (e->via.u64 < max && *nout < max)
            out[(*nout)++] = (uint32_t)e->via.u64;
    }
    return 0;
}

/* The loaded checkpoint held the plan p: fixes it and says where the job
 * stands; keeps the nout shards in out, which had left the job or been
 * lost when it was written, for the session layer to record as lost at
 * start (the next rounds are then shared by the others, as before the
 * restart; each may rejoin). When every shard was out the job had
 * stopped, and all are waited for again. */
static void restore_plan(psd *s, const ps_plan *p, const uint32_t *out, uint32_t nout)
{
    srv_plan_clear(&s->plan);
    const srv_plan *pl = &s->plan;
    uint64_t r = s->model.version;
    uint64_t per_epoch = (p->samples + p->batch - 1) / p->batch;
    int keep = s->cfg.mode == PS_MODE_BSP && nout < (uint32_t)s->cfg.workers && r < p->epochs * per_epoch;
    if (srv_plan_restore(&s->plan, p, out, keep ? nout : 0) != 0)
        PS_LOG(PS_LOG_ERROR, "out of memory keeping the %u shards out of the job: they are waited for", nout);
    PS_LOG(PS_LOG_INFO, "plan restored from the checkpoint: %llu epochs of %llu samples, %llu per round, seed %llu: "
                        "round %llu of %llu%s",
           (unsigned long long)pl->p.epochs, (unsigned long long)pl->p.samples, (unsigned long long)pl->p.batch,
           (unsigned long long)pl->p.seed, (unsigned long long)(r < pl->rounds ? r : pl->rounds),
           (unsigned long long)pl->rounds, r >= pl->rounds ? " (the job is done)" : "");
    if (s->cfg.mode != PS_MODE_BSP)
        PS_LOG(PS_LOG_INFO, "psd runs %s: the plan is kept (in the next checkpoints) but rules nothing",
               s->policy->name);
}

/* Reads and checks one file; on success fills the model and clocks, and
 * the plan with the shards out of it (*nout of them, in out, below max). */
static int load_one(psd *s, const char *path, uint32_t *out, uint32_t max, uint32_t *nout, char *err, size_t errlen)
{
    int rc = PS_EMALFORMED;
    uint8_t *data = NULL;
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        msgpack_zone_destroy(&zone);
        return PS_EIO;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 24) {
        snprintf(err, errlen, "truncated (%lld bytes)", (long long)st.st_size);
        goto out;
    }
    size_t size = (size_t)st.st_size;
    data = malloc(size);
    if (!data || fread(data, 1, size, f) != size) {
        snprintf(err, errlen, "cannot read %zu bytes", size);
        rc = PS_EIO;
        goto out;
    }
    if (memcmp(data, CKPT_MAGIC, 8) != 0) {
        snprintf(err, errlen, "not a psd checkpoint (bad magic)");
        goto out;
    }
    uint32_t format = get_u32(data + 8), hlen = get_u32(data + 12);
    if (format != CKPT_FORMAT) {
        snprintf(err, errlen, "format version %u, this psd reads %d", format, CKPT_FORMAT);
        goto out;
    }
    if (hlen > CKPT_HEADER_MAX || (size_t)hlen + 24 > size) {
        snprintf(err, errlen, "truncated: header of %u bytes in a %zu-byte file", hlen, size);
        goto out;
    }
    if (memcmp(data + size - 4, CKPT_END, 4) != 0) {
        snprintf(err, errlen, "truncated: no end marker");
        goto out;
    }
    uint32_t want = get_u32(data + size - 8);
    uint32_t got = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), data, size - 8);
    if (want != got) {
        snprintf(err, errlen, "checksum mismatch (stored %08x, computed %08x)", want, got);
        goto out;
    }
    char serr[256];
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, 1u << 20};
    if (ps_scan(data + 16, hlen, &lim, serr, sizeof serr) != 0) {
        snprintf(err, errlen, "bad header: %s", serr);
        goto out;
    }
    msgpack_object h;
    size_t off = 0;
    if (msgpack_unpack((const char *)data + 16, hlen, &off, &zone, &h) != MSGPACK_UNPACK_SUCCESS ||
        h.type != MSGPACK_OBJECT_MAP) {
        snprintf(err, errlen, "bad header");
        goto out;
    }
    const msgpack_object *ver = ps_map_get(&h, "version"), *lay = ps_map_get(&h, "layout");
    const msgpack_object *sta = ps_map_get(&h, "state"), *opt = ps_map_get(&h, "optimizer");
    const msgpack_object *clk = ps_map_get(&h, "clocks");
    if (!ver || ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !lay || lay->type != MSGPACK_OBJECT_ARRAY || !sta ||
        sta->type != MSGPACK_OBJECT_ARRAY || !opt || opt->type != MSGPACK_OBJECT_STR) {
        snprintf(err, errlen, "header lacks version, layout, optimizer or state");
        goto out;
    }
    ps_layout *l = &s->scratch_layout;
    char lerr[256];
    if (ps_layout_unpack(lay, l, lerr, sizeof lerr) != 0) {
        snprintf(err, errlen, "bad layout: %s", lerr);
        goto out;
    }
    size_t n = l->total, nstate = sta->via.array.size;
    if (nstate > CKPT_MAX_STATE || size != 16 + (size_t)hlen + (1 + nstate) * n * sizeof(float) + 8) {
        snprintf(err, errlen, "truncated or padded: %zu bytes, expected %zu for %zu parameters", size,
                 16 + (size_t)hlen + (1 + nstate) * n * sizeof(float) + 8, n);
        goto out;
    }
    /* install */
    srv_model_free(&s->model);
    memset(&s->model, 0, sizeof s->model);
    rc = srv_model_set_layout(&s->model, l, &s->cfg);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory for %zu parameters", n);
        goto out;
    }
    const uint8_t *p = data + 16 + hlen;
    for (size_t i = 0; i < s->model.nblk; i++) {
        srv_blk *b = s->model.blk[i];
        memcpy(b->w, p, b->cap * sizeof(float));
        s->model.stamp++;
        s->model.bound_ok = 0; /* values from elsewhere: the update engine measures them */
        p += b->cap * sizeof(float);
    }
    float *bufs[CKPT_MAX_STATE];
    const char *names[CKPT_MAX_STATE];
    size_t have = srv_optim_state_buffers(&s->model.opt, bufs, names, CKPT_MAX_STATE);
    int match = strlen(srv_optim_name(&s->model.opt)) == opt->via.str.size &&
                !memcmp(srv_optim_name(&s->model.opt), opt->via.str.ptr, opt->via.str.size) && have == nstate;
    for (size_t i = 0; match && i < nstate; i++) {
        const msgpack_object *nm = &sta->via.array.ptr[i];
        match = nm->type == MSGPACK_OBJECT_STR && nm->via.str.size == strlen(names[i]) &&
                !memcmp(nm->via.str.ptr, names[i], nm->via.str.size);
    }
    if (match) {
        for (size_t i = 0; i < nstate; i++, p += n * sizeof(float))
            memcpy(bufs[i], p, n * sizeof(float));
    } else {
        PS_LOG(PS_LOG_WARN, "checkpoint %s holds %.*s optimizer state; psd is configured for %s: starting that "
                            "optimizer's state from zero",
               path, (int)opt->via.str.size, opt->via.str.ptr, srv_optim_name(&s->model.opt));
    }
    s->model.version = ver->via.u64;
    s->model.initialized = 1;
    srv_plan_clear(&s->plan);
    *nout = 0;
    const msgpack_object *plan = ps_map_get(&h, "plan");
    if (plan) {
        ps_plan pp;
        char perr[160];
        if (read_plan(plan, &pp, out, max, nout, perr, sizeof perr) == 0)
            restore_plan(s, &pp, out, *nout);
        else
            PS_LOG(PS_LOG_WARN, "checkpoint %s: its plan is unusable (%s): loaded without it; the next worker's "
                                "hello that carries a plan fixes one",
                   path, perr);
    }
    free(s->restored_clocks);
    s->restored_clocks = NULL;
    s->nrestored = 0;
    if (clk && clk->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < clk->via.array.size; i++) {
            const msgpack_object *e = &clk->via.array.ptr[i];
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 ||
                e->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                e->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.array.ptr[0].via.u64 >= 65536)
                continue;
            uint32_t shard = (uint32_t)e->via.array.ptr[0].via.u64;
            if (shard >= s->nrestored) {
                uint64_t *t = realloc(s->restored_clocks, (shard + 1) * sizeof *t);
                if (!t)
                    break;
                memset(t + s->nrestored, 0, (shard + 1 - s->nrestored) * sizeof *t);
                s->restored_clocks = t;
                s->nrestored = shard + 1;
            }
            s->restored_clocks[shard] = e->via.array.ptr[1].via.u64;
        }
    }
    rc = 0;
out:
    free(data);
    fclose(f);
    msgpack_zone_destroy(&zone);
    return rc;
}

int srv_checkpoint_load(psd *s)
{
    if (!s->cfg.state_dir[0])
        return 0;
    struct stat st;
    if (stat(s->cfg.state_dir, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        PS_LOG(PS_LOG_ERROR, "state_dir %s: %s", s->cfg.state_dir, strerror(errno));
        return PS_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        PS_LOG(PS_LOG_ERROR, "state_dir %s is not a directory", s->cfg.state_dir);
        return PS_EIO;
    }
    remove_leftovers(s->cfg.state_dir);
    uint64_t *vers;
    size_t nv = list_versions(s->cfg.state_dir, &vers);
    int loaded = 0;
    uint32_t m = (uint32_t)s->cfg.workers, nout = 0;
    uint32_t *out = malloc((m ? m : 1) * sizeof *out);
    if (!out) {
        free(vers);
        PS_LOG(PS_LOG_ERROR, "out of memory loading a checkpoint");
        return PS_ENOMEM;
    }
    for (size_t i = 0; i < nv && !loaded; i++) {
        char path[PS_CONFIG_PATH_MAX + 64], err[512];
        ckpt_path(path, sizeof path, s->cfg.state_dir, vers[i], "");
        if (load_one(s, path, out, m, &nout, err, sizeof err) == 0) {
            char desc[512];
            ps_layout_describe(&s->model.layout, desc, sizeof desc);
            PS_LOG(PS_LOG_INFO, "loaded checkpoint %s: model version %" PRIu64 ", %" PRIu64 " parameters (%s)", path,
                   s->model.version, s->model.layout.total, desc);
            s->stats.checkpoint_ms = srv_now_ms();
            s->stats.checkpoint_version = s->model.version;
            snprintf(s->resumed_from, sizeof s->resumed_from, "%s", path);
            s->resumed_version = s->model.version;
            loaded = 1;
        } else {
            PS_LOG(PS_LOG_ERROR, "checkpoint %s is unusable: %s; trying an older one", path, err);
        }
    }
    if (nv > 0 && !loaded)
        PS_LOG(PS_LOG_WARN, "no valid checkpoint in %s: starting without a model", s->cfg.state_dir);
    free(out);
    free(vers);
    return loaded;
}

int srv_checkpoint_set_aside(const char *dir, char *aside, size_t asidelen, char *err, size_t errlen)
{
    char sub[PS_CONFIG_PATH_MAX + 64] = ""; /* the dated subfolder, once made */
    if (asidelen)
        aside[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot read state_dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    int moved = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue; /* checkpoints and their unfinished .tmp files only */
        if (!sub[0]) {
            /* one dated subfolder per start, never one that exists */
            time_t now = time(NULL);
            struct tm tm;
            char stamp[32];
            gmtime_r(&now, &tm);
            strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
            for (int i = 0; i < 100; i++) {
                if (i == 0)
                    snprintf(sub, sizeof sub, "%s/set-aside-%s", dir, stamp);
                else
                    snprintf(sub, sizeof sub, "%s/set-aside-%s-%d", dir, stamp, i);
                if (mkdir(sub, 0750) == 0 || errno != EEXIST)
                    break;
            }
            struct stat st;
            if (stat(sub, &st) != 0 || !S_ISDIR(st.st_mode)) {
                snprintf(err, errlen, "cannot create %s: %s", sub, strerror(errno));
                closedir(d);
                return PS_EIO;
            }
        }
        char from[PS_CONFIG_PATH_MAX + 300], to[PS_CONFIG_PATH_MAX + 400];
        snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", sub, e->d_name);
        if (rename(from, to) != 0) {
            snprintf(err, errlen, "cannot move %s to %s: %s", from, sub, strerror(errno));
            closedir(d);
            return PS_EIO;
        }
        moved++;
    }
    closedir(d);
    if (asidelen) {
        size_t n = strnlen(sub, asidelen - 1);
        memcpy(aside, sub, n);
        aside[n] = '\0';
    }
    return moved;
}
