/* checkpoint.c - writing checkpoints (see checkpoint.h): psd forks, the
 * writer process writes its copy-on-write image of the parameters, the
 * optimizer state and the tables' rows and exits, the loop watches its pipe
 * and prunes old ones; checkpoints at rest and at exit. Loading is in
 * ckpt_load.c, the files' names and listing in ckpt_file.c, a follower's
 * snapshot written into a descriptor in snapshot.c. */
#include "server/report/checkpoint.h"
#include "server/report/ckpt_file.h"
#include "server/report/ckpt_job.h"
#include "server/policy/policy.h"
#include "server/update/update.h"
#include "server/update/tapply.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h> /* getrlimit */
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/tables/sparse_optim.h"
#include "server/record/stats.h"
#include "server/replog/pushid.h"
#include "server/store/parts.h"

enum { CKPT_AT_MKDIR = 1, CKPT_AT_CREATE, CKPT_AT_WRITE, CKPT_AT_RENAME, CKPT_AT_EXIT };
#define CKPT_WBUF (1u << 20)

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
 * in), its row count, the floats of each row (weights, state, step) and
 * its clock (pushes applied to it, which its rows' last-push clocks after
 * the rows count). */
static void pack_tables(msgpack_packer *pk, const psd *s, const ckpt_job *j)
{
    ps_pack_key(pk, "tables");
    msgpack_pack_array(pk, j->ntables);
    for (uint32_t i = 0; i < j->ntables; i++) {
        const ps_table_def *d = srv_tables_def(&s->tables, i);
        msgpack_pack_map(pk, PS_TABLE_DEF_KEYS + 3 + (d->nparts > 1));
        ps_pack_table_def(pk, d);
        ps_pack_key(pk, "rows");
        msgpack_pack_uint64(pk, j->tables[i].rows);
        ps_pack_key(pk, "floats");
        msgpack_pack_uint32(pk, j->tables[i].floats);
        ps_pack_key(pk, "clock");
        msgpack_pack_uint64(pk, j->tables[i].clock);
        if (d->nparts > 1) { /* the part of a split table this psd holds */
            ps_pack_key(pk, "part");
            msgpack_pack_array(pk, 2);
            msgpack_pack_uint32(pk, d->part);
            msgpack_pack_uint32(pk, d->nparts);
        }
    }
}

/* "pushids": the push ids applied per client (replog/pushid.c), so that a
 * psd restarted from this checkpoint answers a push it holds and a client
 * sends again without applying it twice: 16 bytes per client, its cid and
 * highest pid applied, little-endian. */
static void pack_pushids(msgpack_packer *pk, const psd *s)
{
    uint32_t n = srv_pushid_count(s), i = 0;
    uint8_t *b = malloc((size_t)n * 16);
    uint64_t cid, pid;
    for (uint32_t it = 0; b && i < n && srv_pushid_next(s, &it, &cid, &pid); i++) {
        srv_ckpt_put_u32(b + 16 * i, (uint32_t)cid);
        srv_ckpt_put_u32(b + 16 * i + 4, (uint32_t)(cid >> 32));
        srv_ckpt_put_u32(b + 16 * i + 8, (uint32_t)pid);
        srv_ckpt_put_u32(b + 16 * i + 12, (uint32_t)(pid >> 32));
    }
    ps_pack_key(pk, "pushids");
    msgpack_pack_bin(pk, b ? 16 * i : 0);
    msgpack_pack_bin_body(pk, b, b ? 16 * i : 0);
    free(b);
}

static int build_header(psd *s, ckpt_job *j, const char *const *names)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, &j->header, ps_buf_write);
    const ps_layout *l = &s->model.layout;
    const ps_config *c = &s->cfg;
    int pushids = srv_pushid_count(s) > 0, parts = s->parts.epoch > 0;
    msgpack_pack_map(&pk, 8 + (s->plan.set ? 1 : 0) + (j->ntables ? 1 : 0) + pushids + parts);
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
    if (pushids)
        pack_pushids(&pk, s);
    if (parts) { /* the part map psd holds (PROTOCOL.md 18) */
        ps_pack_key(&pk, "parts");
        srv_parts_pack(&pk, &s->parts);
    }
    return j->header.len > CKPT_HEADER_MAX ? PS_ETOO_BIG : 0;
}

static int saved(const psd *s);

void srv_ckpt_job_free(ckpt_job *j)
{
    srv_snap_unref(j->snap);
    ps_buf_free(&j->header);
    free(j->wbuf);
    free(j);
}

/* Prepares a job on the loop thread (nothing of the model is copied: the
 * header with the tables' row counts, the paths, a staging buffer); NULL
 * when out of memory. */
ckpt_job *srv_ckpt_job_new(psd *s)
{
    ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->out_fd = -1;
    float *bufs[CKPT_MAX_STATE];
    const char *names[CKPT_MAX_STATE];
    j->s = s;
    snprintf(j->dir, sizeof j->dir, "%s", s->cfg.state_dir);
    j->keep = s->cfg.checkpoint_keep;
    j->tables_stamp = s->tables.stamp;
    const char *slow = getenv("PSD_TEST_CKPT_SLOW_US");
    j->slow_us = slow ? (unsigned)strtoul(slow, NULL, 10) : 0;
    j->snap = srv_snap_take(&s->model);
    j->wbuf = malloc(CKPT_WBUF);
    if (!j->snap || !j->wbuf) {
        srv_ckpt_job_free(j);
        return NULL;
    }
    j->version = j->snap->version; /* Hogwild!: the counter the copy was taken after */
    srv_ckpt_id id = {.version = j->version, .seq = 0};
    srv_ckpt_id *ids;
    size_t nid = srv_ckpt_list(j->dir, &ids);
    for (size_t i = 0; i < nid; i++)
        if (ids[i].version == j->version) {
            /* another of this version (a table push moves no version):
             * its own file, so checkpoint_keep keeps that many; the same
             * one again when nothing changed since it was written */
            id.seq = ids[i].seq + !saved(s);
            break;
        }
    free(ids);
    srv_ckpt_path(j->path, sizeof j->path, j->dir, id, "");
    srv_ckpt_path(j->tmp, sizeof j->tmp, j->dir, id, ".tmp");
    j->n = s->model.layout.total;
    j->nstate = srv_optim_state_buffers(&s->model.opt, bufs, names, CKPT_MAX_STATE);
    for (size_t i = 0; i < j->nstate; i++)
        j->state[i] = bufs[i];
    for (uint32_t i = 0; i < s->tables.n; i++) {
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        j->tables[i].rows = st.rows;
        j->tables[i].clock = st.clock;
        j->tables[i].floats = srv_sparse_row_floats(srv_tables_def(&s->tables, i));
    }
    j->ntables = s->tables.n;
    if (build_header(s, j, names) != 0) {
        srv_ckpt_job_free(j);
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

int srv_ckpt_write_start(ckpt_job *j, int fd, uLong *crc)
{
    uint8_t head[16];
    memcpy(head, CKPT_MAGIC, 8);
    srv_ckpt_put_u32(head + 8, j->ntables ? CKPT_FORMAT_CLOCKS : CKPT_FORMAT);
    srv_ckpt_put_u32(head + 12, (uint32_t)j->header.len);
    int bad = write_all(fd, head, sizeof head, crc) || write_all(fd, j->header.p, j->header.len, crc);
    for (size_t i = 0; !bad && i < j->snap->nblk; i++)
        bad = write_all(fd, j->snap->blk[i]->w, j->snap->blk[i]->cap * sizeof(float), crc);
    for (size_t i = 0; !bad && i < j->nstate; i++)
        bad = write_all(fd, j->state[i], j->n * sizeof(float), crc);
    return bad;
}

/* The tables' keys and rows go out through j->wbuf. */
typedef struct row_writer {
    ckpt_job *j;
    int fd;
    uLong *crc;
    size_t used;
    size_t row_bytes; /* the current table's */
    uint64_t read;    /* row bytes read since the last test pause */
    int bad;
} row_writer;

static void stage(row_writer *w, const void *p, size_t len)
{
    const uint8_t *b = p;
    while (!w->bad && len > 0) {
        size_t k = len < CKPT_WBUF - w->used ? len : CKPT_WBUF - w->used;
        memcpy(w->j->wbuf + w->used, b, k);
        w->used += k;
        b += k;
        len -= k;
        if (w->used == CKPT_WBUF) {
            w->bad = write_all(w->fd, w->j->wbuf, w->used, w->crc);
            w->used = 0;
        }
    }
}

static void flush(row_writer *w)
{
    if (!w->bad && w->used)
        w->bad = write_all(w->fd, w->j->wbuf, w->used, w->crc);
    w->used = 0;
}

static void key_out(uint64_t key, const float *row, void *arg)
{
    (void)row;
    uint8_t k[8];
    for (int b = 0; b < 8; b++)
        k[b] = (uint8_t)(key >> (8 * b));
    stage(arg, k, sizeof k);
}

/* Test only (PSD_TEST_CKPT_SLOW_US): a pause per MiB of rows read, so
 * that a test's table of some tens of MB takes seconds to write. */
static void test_pause(row_writer *w)
{
    w->read += w->row_bytes;
    if (!w->j->slow_us || w->read < (1u << 20))
        return;
    w->read = 0;
    struct timespec ts = {(time_t)(w->j->slow_us / 1000000u), (long)(w->j->slow_us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void stamp_out(uint64_t stamp, void *arg)
{
    uint8_t k[8];
    for (int b = 0; b < 8; b++)
        k[b] = (uint8_t)(stamp >> (8 * b));
    stage(arg, k, sizeof k);
}

static void row_out(uint64_t key, const float *row, void *arg)
{
    (void)key;
    row_writer *w = arg;
    stage(w, row, w->row_bytes);
    test_pause(w);
}

/* Writes the file (to a temporary name, fsynced, renamed into place, the
 * directory fsynced) into j->res. It runs in the writer process, so it
 * calls only async-signal-safe functions and the model's own reading code
 * (no malloc, no stdio, no locks): see srv_checkpoint_start. */
static void job_write(ckpt_job *j)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    j->res.rc = PS_EIO;
    if (j->out_fd < 0 && mkdir(j->dir, 0750) != 0 && errno != EEXIST) {
        j->res.stage = CKPT_AT_MKDIR;
        j->res.err = errno;
        return;
    }
    int fd = j->out_fd >= 0 ? j->out_fd : open(j->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0) {
        j->res.stage = CKPT_AT_CREATE;
        j->res.err = errno;
        return;
    }
    uint8_t tail[8];
    uLong crc = crc32_z(0L, Z_NULL, 0);
    int bad = srv_ckpt_write_start(j, fd, &crc);
    row_writer w = {.j = j, .fd = fd, .crc = &crc};
    for (uint32_t i = 0; !bad && i < j->ntables; i++) {
        w.row_bytes = j->tables[i].floats * sizeof(float);
        srv_tables_each(&j->s->tables, i, key_out, &w);
        flush(&w);
        srv_tables_each(&j->s->tables, i, row_out, &w);
        srv_tables_each_stamp(&j->s->tables, i, stamp_out, &w);
        flush(&w);
        bad = w.bad;
    }
    srv_ckpt_put_u32(tail, (uint32_t)crc);
    memcpy(tail + 4, CKPT_END, 4);
    uLong dummy = 0;
    if (!bad)
        bad = write_all(fd, tail, sizeof tail, &dummy);
    if (j->out_fd >= 0) { /* a snapshot: the descriptor is psd's */
        j->res.stage = CKPT_AT_WRITE;
        j->res.err = errno;
        if (!bad)
            j->res.rc = 0;
        return;
    }
    if (bad || fsync(fd) != 0) {
        j->res.stage = CKPT_AT_WRITE;
        j->res.err = errno;
        close(fd);
        unlink(j->tmp);
        return;
    }
    close(fd);
    if (rename(j->tmp, j->path) != 0) {
        j->res.stage = CKPT_AT_RENAME;
        j->res.err = errno;
        unlink(j->tmp);
        return;
    }
    int dfd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    j->res.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    j->res.rc = 0;
}

/* On the loop (or at shutdown): the old checkpoints pruned, the outcome
 * logged and counted. */
static void job_finish(psd *s, ckpt_job *j)
{
    if (j->res.rc == 0) {
        srv_ckpt_id *vers; /* keep the newest `keep` */
        size_t nv = srv_ckpt_list(j->dir, &vers);
        for (size_t i = (size_t)j->keep; i < nv; i++) {
            char old[PS_CONFIG_PATH_MAX + 64];
            srv_ckpt_path(old, sizeof old, j->dir, vers[i], "");
            unlink(old);
        }
        free(vers);
        srv_stats_checkpoint(s, j->version, j->tables_stamp, NULL);
        if (j->pid)
            PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 " written to %s in %.3f s (fork %.1f ms)",
                   j->version, j->path, j->res.seconds, j->fork_ms);
        else
            PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 " written to %s in %.3f s", j->version, j->path,
                   j->res.seconds);
        return;
    }
    const char *e = strerror(j->res.err);
    switch (j->res.stage) {
    case CKPT_AT_MKDIR: snprintf(j->err, sizeof j->err, "cannot create %s: %s", j->dir, e); break;
    case CKPT_AT_CREATE: snprintf(j->err, sizeof j->err, "cannot create %s: %s", j->tmp, e); break;
    case CKPT_AT_WRITE: snprintf(j->err, sizeof j->err, "writing %s: %s", j->tmp, e); break;
    case CKPT_AT_RENAME: snprintf(j->err, sizeof j->err, "renaming %s: %s", j->tmp, e); break;
    default: break; /* CKPT_AT_EXIT: j->err is set */
    }
    srv_stats_checkpoint(s, j->version, j->tables_stamp, j->err);
    PS_LOG(PS_LOG_ERROR, "checkpoint of version %" PRIu64 " failed: %s", j->version, j->err);
}

/* The writer process: psd's memory as it was at fork(), copy-on-write.
 * Only the thread that called fork() lives here; another psd thread (the
 * libuv pool's, an update's) may have held a lock (malloc's, stdio's, the
 * log's) at that moment, so this calls no function that takes one: only
 * system calls and the model's own reading code. Never returns. */
static void writer_main(ckpt_job *j, int wfd, pid_t parent, int maxfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* psd killed: no orphan writes on */
    if (getppid() != parent)
        _exit(3);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* psd's sockets closed here, so that a connection psd closes is closed
     * (the peer sees it) while this writes */
    for (int fd = 3; fd <= maxfd; fd++)
        if (fd != wfd && fd != j->out_fd)
            close(fd);
    job_write(j);
    const uint8_t *p = (const uint8_t *)&j->res;
    size_t left = sizeof j->res;
    while (left > 0) {
        ssize_t n = write(wfd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(4);
        p += n;
        left -= (size_t)n;
    }
    _exit(0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static char scratch[256];
    *buf = uv_buf_init(scratch, sizeof scratch);
}

static void on_closed(uv_handle_t *h)
{
    ckpt_job *j = h->data;
    psd *s = j->s;
    int st = 0;
    while (waitpid(j->pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || j->got != sizeof j->res) {
        j->res.rc = PS_EIO;
        j->res.stage = CKPT_AT_EXIT;
        if (j->err[0])
            ; /* job_fork's */
        else if (WIFSIGNALED(st))
            snprintf(j->err, sizeof j->err, "the writer process %d was killed by signal %d", (int)j->pid,
                     WTERMSIG(st));
        else
            snprintf(j->err, sizeof j->err, "the writer process %d exited with status %d", (int)j->pid,
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        if (j->out_fd < 0)
            unlink(j->tmp);
    }
    if (j->snap_done) {
        if (j->res.rc != 0)
            PS_LOG(PS_LOG_ERROR, "replication: the snapshot of version %" PRIu64 " failed: %s", j->version,
                   j->err[0] ? j->err : strerror(j->res.err));
        j->snap_done(s, j->res.rc, j->version, j->snap_arg);
        srv_ckpt_job_free(j);
        return;
    }
    s->checkpoint_busy = 0;
    job_finish(s, j);
    srv_ckpt_job_free(j);
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf)
{
    ckpt_job *j = h->data;
    if (nread > 0) {
        size_t k = (size_t)nread < sizeof j->res - j->got ? (size_t)nread : sizeof j->res - j->got;
        memcpy((uint8_t *)&j->res + j->got, buf->base, k);
        j->got += k;
        return;
    }
    if (nread < 0) { /* EOF: the writer has exited */
        uv_read_stop(h);
        uv_close((uv_handle_t *)h, on_closed);
    }
}

/* Forks the writer and watches its pipe; 0, or -1 with j->err set. */
int srv_ckpt_job_fork(psd *s, ckpt_job *j)
{
    struct rlimit rl;
    int maxfd = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 65536
                    ? (int)rl.rlim_cur - 1 : 65535;
    int fds[2];
    if (pipe(fds) != 0 || fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0) {
        snprintf(j->err, sizeof j->err, "cannot make a pipe for the writer: %s", strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0)
        writer_main(j, fds[1], parent, maxfd);
    int e = errno;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    j->fork_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        snprintf(j->err, sizeof j->err, "cannot fork the writer: %s", strerror(e));
        return -1;
    }
    j->pid = pid;
    int rc = uv_pipe_init(s->loop, &j->pipe, 0);
    if (rc != 0) { /* cannot watch it: stop it */
        close(fds[0]);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        unlink(j->tmp);
        snprintf(j->err, sizeof j->err, "cannot watch the writer: %s", uv_strerror(rc));
        return -1;
    }
    j->pipe.data = j;
    if ((rc = uv_pipe_open(&j->pipe, fds[0])) != 0)
        close(fds[0]);
    else
        rc = uv_read_start((uv_stream_t *)&j->pipe, on_alloc, on_read);
    if (rc != 0) { /* on_closed reaps it and reports this */
        kill(pid, SIGKILL);
        snprintf(j->err, sizeof j->err, "cannot watch the writer: %s", uv_strerror(rc));
        uv_close((uv_handle_t *)&j->pipe, on_closed);
    }
    return 0;
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
int srv_ckpt_mid_round(psd *s)
{
    return s->policy->round_base && s->policy->round_base(s);
}

int srv_checkpoint_has_state(const psd *s)
{
    return s->model.initialized || (!s->model.has_layout && !s->parts.moving && srv_parts_table_only(&s->parts));
}

void srv_checkpoint_start(psd *s, int force)
{
    if (!s->cfg.state_dir[0] || !srv_checkpoint_has_state(s) || s->checkpoint_busy)
        return;
    if (srv_update_busy(s) || srv_ckpt_mid_round(s))
        return; /* it writes the optimizer state: the next tick tries again */
    if (!force && saved(s))
        return;
    /* the tables as they are: no apply thread writes a row during fork() */
    srv_tapply_drain(s->tapply);
    ckpt_job *j = srv_ckpt_job_new(s);
    if (!j) {
        srv_stats_checkpoint(s, 0, 0, "out of memory");
        PS_LOG(PS_LOG_ERROR, "checkpoint: out of memory");
        return;
    }
    /* fork(): the writer process gets psd's memory as it is now, copy-on-
     * write, and writes it while psd goes on; the loop pays only for the
     * fork (psd's page tables copied). */
    if (srv_ckpt_job_fork(s, j) != 0) {
        srv_stats_checkpoint(s, j->version, j->tables_stamp, j->err);
        PS_LOG(PS_LOG_ERROR, "checkpoint of version %" PRIu64 " failed: %s", j->version, j->err);
        srv_ckpt_job_free(j);
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
    if (!s->cfg.state_dir[0] || !srv_checkpoint_has_state(s))
        return 1;
    if (saved(s))
        return 1; /* an unchanged model is not written twice */
    if (s->checkpoint_busy || srv_update_busy(s) || srv_ckpt_mid_round(s))
        return 0;
    PS_LOG(PS_LOG_INFO, "checkpoint of version %" PRIu64 ": %s", s->model.version, why);
    srv_checkpoint_start(s, 0);
    return 1;
}

void srv_checkpoint_rest_tick(psd *s)
{
    if (s->paused)
        srv_checkpoint_at_rest(s, "psd is paused");
    else if (srv_work_stopped(s) && !s->follow)
        /* not on a follower (one that led, or took a worker before it
         * knew it follows): its model moves with its leader's log, and it
         * would write it at every tick; checkpoint_interval covers it */
        srv_checkpoint_at_rest(s, "the last worker left");
}

int srv_checkpoint_write_now(psd *s)
{
    if (!s->cfg.state_dir[0] || !srv_checkpoint_has_state(s))
        return 0;
    if (saved(s))
        return 0;
    if (srv_ckpt_mid_round(s))
        PS_LOG(PS_LOG_WARN, "final checkpoint: round %" PRIu64 " had applied some of its pieces; they are written "
               "with it, and the round, done again, applies them a second time", s->model.version);
    ckpt_job *j = srv_ckpt_job_new(s);
    if (!j) {
        PS_LOG(PS_LOG_ERROR, "final checkpoint: out of memory");
        return PS_ENOMEM;
    }
    job_write(j); /* the loop has stopped: nothing changes the model */
    job_finish(s, j);
    int rc = j->res.rc;
    srv_ckpt_job_free(j);
    return rc;
}
