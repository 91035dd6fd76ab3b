/* checkpoint.c - writing checkpoints (see checkpoint.h): a snapshot and
 * the optimizer state copied on the loop, the file written on the thread
 * pool, old ones pruned; checkpoints at rest and at exit. Loading is in
 * ckpt_load.c, the files' names and listing in ckpt_file.c. */
#include "server/report/checkpoint.h"
#include "server/report/ckpt_file.h"
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
#include "server/store/sparse_optim.h"
#include "server/store/stats.h"

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
    /* the embedding tables' rows, copied on the loop: for table i, rows
     * keys (little-endian uint64) and their row floats each */
    struct ckpt_table {
        uint64_t rows;
        uint32_t floats;
        uint8_t *keys;
        float *data;
    } tables[PS_TABLES_MAX];
    uint32_t ntables;
    uint64_t tables_stamp;    /* s->tables.stamp when they were copied */
    ps_buf header;
    int rc;
    char err[PS_CONFIG_PATH_MAX * 2 + 256];
    double seconds;
} ckpt_job;

/* "plan": the job's plan (plan.c) and who is out of it: {epochs, samples,
 * batch, seed, out: [shards below M that joined and then left or were
 * lost]}. The round is the checkpoint's version. */
static void pack_plan(msgpack_packer *pk, const psd *s)
{
    const ps_plan *p = &s->plan.p;
    uint32_t m = (uint32_t)s->cfg.workers, nout = 0;
    for (uint32_t i = 0; i < m && i < s->nworkers_cap; i++)
        nout += s->workers[i] && s->workers[i]->state != SRV_W_CONNECTED;
    ps_pack_key(pk, "plan");
    msgpack_pack_map(pk, 5);
    ps_pack_key(pk, "epochs");
    msgpack_pack_uint64(pk, p->epochs);
    ps_pack_key(pk, "samples");
    msgpack_pack_uint64(pk, p->samples);
    ps_pack_key(pk, "batch");
    msgpack_pack_uint64(pk, p->batch);
    ps_pack_key(pk, "seed");
    msgpack_pack_uint64(pk, p->seed);
    ps_pack_key(pk, "out");
    msgpack_pack_array(pk, nout);
    for (uint32_t i = 0; i < m && i < s->nworkers_cap; i++)
        if (s->workers[i] && s->workers[i]->state != SRV_W_CONNECTED)
            msgpack_pack_uint32(pk, i);
}

/* "tables": per table its declaration (PROTOCOL.md 13.1, defaults filled
 * in), its row count and the floats of each row (weights, state, step). */
static void pack_tables(msgpack_packer *pk, const psd *s, const ckpt_job *j)
{
    ps_pack_key(pk, "tables");
    msgpack_pack_array(pk, j->ntables);
    for (uint32_t i = 0; i < j->ntables; i++) {
        const ps_table_def *d = srv_tables_def(&s->tables, i);
        uint32_t hps = ps_topt_hps(d->opt), nhp = 0;
        for (uint32_t b = hps; b; b &= b - 1)
            nhp++;
        msgpack_pack_map(pk, d->nparts > 1 ? 10 : 9);
        ps_pack_kstr(pk, "name", d->name);
        ps_pack_key(pk, "dim");
        msgpack_pack_uint32(pk, d->dim);
        ps_pack_kstr(pk, "rinit", ps_rinit_name(d->rinit));
        ps_pack_key(pk, "scale");
        msgpack_pack_double(pk, d->scale);
        ps_pack_key(pk, "seed");
        msgpack_pack_uint64(pk, d->seed);
        ps_pack_kstr(pk, "opt", ps_topt_name(d->opt));
        ps_pack_key(pk, "hp");
        msgpack_pack_map(pk, nhp);
        for (uint32_t h = 0; h < PS_HP_COUNT; h++)
            if (hps & (1u << h)) {
                ps_pack_key(pk, ps_hp_name(h));
                msgpack_pack_double(pk, d->hp[h]);
            }
        ps_pack_key(pk, "rows");
        msgpack_pack_uint64(pk, j->tables[i].rows);
        ps_pack_key(pk, "floats");
        msgpack_pack_uint32(pk, j->tables[i].floats);
        if (d->nparts > 1) { /* the part of a split table this psd holds */
            ps_pack_key(pk, "part");
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, d->part);
            msgpack_pack_uint32(pk, d->nparts);
        }
    }
}

static int build_header(psd *s, ckpt_job *j, const char *const *names)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &j->header, ps_buf_write);
    const ps_layout *l = &s->model.layout;
    const ps_config *c = &s->cfg;
    msgpack_pack_map(&pk, 8 + (s->plan.set ? 1 : 0) + (j->ntables ? 1 : 0));
    ps_pack_key(&pk, "version");
    msgpack_pack_uint64(&pk, j->version);
    ps_pack_key(&pk, "created");
    msgpack_pack_double(&pk, (double)time(NULL));
    ps_pack_key(&pk, "params");
    msgpack_pack_uint64(&pk, l->total);
    ps_pack_key(&pk, "layout");
    ps_layout_pack(&pk, l);
    ps_pack_kstr(&pk, "optimizer", srv_optim_name(&s->model.opt));
    ps_pack_key(&pk, "settings");
    msgpack_pack_map(&pk, 6);
    ps_pack_key(&pk, "lr");
    msgpack_pack_double(&pk, c->lr);
    ps_pack_key(&pk, "momentum");
    msgpack_pack_double(&pk, c->momentum);
    ps_pack_key(&pk, "weight_decay");
    msgpack_pack_double(&pk, c->weight_decay);
    ps_pack_key(&pk, "beta1");
    msgpack_pack_double(&pk, c->beta1);
    ps_pack_key(&pk, "beta2");
    msgpack_pack_double(&pk, c->beta2);
    ps_pack_key(&pk, "mode");
    msgpack_pack_str(&pk, strlen(s->policy->name));
    msgpack_pack_str_body(&pk, s->policy->name, strlen(s->policy->name));
    ps_pack_key(&pk, "state");
    msgpack_pack_array(&pk, (uint32_t)j->nstate);
    for (size_t i = 0; i < j->nstate; i++) {
        msgpack_pack_str(&pk, strlen(names[i]));
        msgpack_pack_str_body(&pk, names[i], strlen(names[i]));
    }
    ps_pack_key(&pk, "clocks");
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
    if (j->ntables)
        pack_tables(&pk, s, j);
    return j->header.len > CKPT_HEADER_MAX ? PS_ETOO_BIG : 0;
}

static void job_free(ckpt_job *j)
{
    srv_snap_unref(j->snap);
    for (size_t i = 0; i < j->nstate; i++)
        free(j->state[i]);
    for (uint32_t i = 0; i < j->ntables; i++) {
        free(j->tables[i].keys);
        free(j->tables[i].data);
    }
    ps_buf_free(&j->header);
    free(j);
}

/* srv_tables_each's callback: one row into the job's copy. */
typedef struct table_copy {
    struct ckpt_table *t;
    uint64_t at;
} table_copy;

static void copy_row(uint64_t key, const float *row, void *arg)
{
    table_copy *c = arg;
    for (int b = 0; b < 8; b++)
        c->t->keys[8 * c->at + (uint64_t)b] = (uint8_t)(key >> (8 * b));
    memcpy(c->t->data + c->at * c->t->floats, row, c->t->floats * sizeof(float));
    c->at++;
}

/* Copies every table's rows into j (on the loop: the pool thread then
 * writes them while the tables go on changing). 0 or -1 out of memory. */
static int copy_tables(psd *s, ckpt_job *j)
{
    for (uint32_t i = 0; i < s->tables.n; i++) {
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        struct ckpt_table *t = &j->tables[i];
        t->rows = st.rows;
        t->floats = srv_sparse_row_floats(srv_tables_def(&s->tables, i));
        t->keys = malloc(st.rows ? st.rows * 8 : 1);
        t->data = malloc(st.rows ? st.rows * t->floats * sizeof(float) : 1);
        j->ntables = i + 1;
        if (!t->keys || !t->data)
            return -1;
        table_copy c = {t, 0};
        srv_tables_each(&s->tables, i, copy_row, &c);
    }
    return 0;
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
    j->tables_stamp = s->tables.stamp;
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
    if (copy_tables(s, j) != 0 || build_header(s, j, names) != 0) {
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

/* The file work, on a pool thread (or the loop at shutdown): touches only
 * the job. */
static void job_run(ckpt_job *j)
{
    char tmp[PS_CONFIG_PATH_MAX + 64], path[PS_CONFIG_PATH_MAX + 64];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    srv_ckpt_path(path, sizeof path, j->dir, j->version, "");
    srv_ckpt_path(tmp, sizeof tmp, j->dir, j->version, ".tmp");
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
    srv_ckpt_put_u32(head + 8, j->ntables ? CKPT_FORMAT_TABLES : CKPT_FORMAT);
    srv_ckpt_put_u32(head + 12, (uint32_t)j->header.len);
    int bad = write_all(fd, head, sizeof head, &crc) || write_all(fd, j->header.p, j->header.len, &crc);
    for (size_t i = 0; !bad && i < j->snap->nblk; i++)
        bad = write_all(fd, j->snap->blk[i]->w, j->snap->blk[i]->cap * sizeof(float), &crc);
    for (size_t i = 0; !bad && i < j->nstate; i++)
        bad = write_all(fd, j->state[i], j->n * sizeof(float), &crc);
    for (uint32_t i = 0; !bad && i < j->ntables; i++)
        bad = write_all(fd, j->tables[i].keys, j->tables[i].rows * 8, &crc) ||
              write_all(fd, j->tables[i].data, j->tables[i].rows * j->tables[i].floats * sizeof(float), &crc);
    srv_ckpt_put_u32(tail, (uint32_t)crc);
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
    size_t nv = srv_ckpt_list_versions(j->dir, &vers);
    for (size_t i = (size_t)j->keep; i < nv; i++) {
        srv_ckpt_path(path, sizeof path, j->dir, vers[i], "");
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
        srv_stats_checkpoint(s, j->version, j->tables_stamp, NULL);
        PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 " written to %s/ckpt-%020" PRIu64 ".psdc in %.3f s",
               j->version, j->dir, j->version, j->seconds);
    } else {
        srv_stats_checkpoint(s, j->version, j->tables_stamp, j->err);
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

/* The newest checkpoint holds the model's version and the tables as they
 * are (a table push changes no version in asgd: the tables' stamp does). */
static int saved(const psd *s)
{
    return s->stats.checkpoint_ms && s->stats.checkpoint_version == s->model.version &&
           s->stats.checkpoint_tables_stamp == s->tables.stamp;
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
    if (!force && saved(s))
        return;
    ckpt_job *j = job_new(s);
    if (!j) {
        srv_stats_checkpoint(s, 0, 0, "out of memory");
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
    if (saved(s))
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
    if (saved(s))
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
