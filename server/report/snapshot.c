/* snapshot.c - a follower's snapshot (PROTOCOL.md 17): what a checkpoint
 * holds, in a checkpoint's bytes, written into a descriptor the caller
 * gives (dispatch/repl.c's memory file), with no file, rename or pruning,
 * and the caller told when it is done.
 *
 * Written from psd's loop, without fork: the file's start (header,
 * parameters, optimizer state) at once, then the tables' rows a block at a
 * time from an idle handle, at most about 4 milliseconds of blocks per turn
 * of the loop, while pushes go on: the tables keep each row a push is about
 * to change before its block is written (tables/table_snap.c). A forked
 * writer made every first write to a page of rows after the fork a
 * copy-on-write fault, about 17 us on the 2-core machine of bench/README.md,
 * and a push of 4,096 random rows of a 1 GiB table took 125 ms while the
 * writer lived. A second snapshot asked for while one is being written is
 * written by the checkpoint's forked writer (checkpoint.c).
 *
 * The file's keys, rows and clocks of a table lie in three runs; each block
 * goes to its place in each (pwrite), and each run's CRC-32 grows with its
 * blocks in order, combined into the file's at the end (crc32_combine). */
#include "server/report/checkpoint.h"
#include "server/report/ckpt_job.h"
#include "server/update/update.h"
#include "server/update/tapply.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/log.h"
#include "proto/errors.h"

#define TURN_NS 4000000u /* blocks written per turn of the loop: for about this long */
#define SNAP_TEST_VERSIONS 20u /* PSD_TEST_SNAP_BLOCK_MS: updates before each block */
#define SNAP_TEST_TICKS 200u   /* or this many ticks, when no worker pushes */

typedef struct snap_writer {
    psd *s;
    ckpt_job *j;         /* the header, the version, the parameters */
    int fd;              /* the caller's descriptor, dup()ed */
    uint64_t id;         /* the tables' snapshot (srv_tables_snap_begin) */
    uv_idle_t idle;
    uv_timer_t timer;    /* test only: a block every block_ms, once */
    unsigned block_ms;   /* SNAP_TEST_VERSIONS updates were applied since the
                          * last one (or the start), or after SNAP_TEST_TICKS ticks */
    uint64_t last_version; /* the model's version then */
    unsigned waited;     /* ticks since */
    uint64_t start[PS_TABLES_MAX]; /* where table i's keys start in the file */
    uint64_t end;        /* the tail's place */
    uLong crc;           /* of the file's start */
    uLong run[PS_TABLES_MAX][3]; /* each table's keys, rows and clocks */
    void (*done)(psd *s, int rc, uint64_t version, void *arg);
    void *arg;
    int finished;
    int handles;         /* handles not closed yet */
    uint64_t t0;         /* uv_hrtime() at the start */
} snap_writer;

static int put_at(int fd, const void *p, size_t len, uint64_t off)
{
    const uint8_t *b = p;
    while (len > 0) {
        ssize_t n = pwrite(fd, b, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        b += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    snap_writer *w = h->data;
    if (--w->handles > 0)
        return;
    if (w->fd >= 0)
        close(w->fd);
    srv_tables_snap_end(&w->s->tables, w->id);
    srv_ckpt_job_free(w->j);
    free(w);
}

/* Tells the caller (rc 0: written) and lets the handles go. */
static void finish(snap_writer *w, int rc, const char *why)
{
    w->finished = 1;
    if (rc == 0)
        PS_LOG(PS_LOG_INFO, "replication: snapshot of version %" PRIu64 " written in %.3f s from the loop; %" PRIu64
               " rows that pushes changed before it wrote them were kept first", w->j->version,
               (double)(uv_hrtime() - w->t0) / 1e9, srv_tables_snap_kept(&w->s->tables, w->id));
    if (rc != 0)
        PS_LOG(PS_LOG_ERROR, "replication: the snapshot of version %" PRIu64 " failed: %s", w->j->version, why);
    w->done(w->s, rc, w->j->version, w->arg);
    uv_idle_stop(&w->idle);
    uv_close((uv_handle_t *)&w->idle, on_closed);
    if (w->block_ms) {
        uv_timer_stop(&w->timer);
        uv_close((uv_handle_t *)&w->timer, on_closed);
    }
}

/* The CRC-32 of the whole file and its tail, once every block is written. */
static int write_tail(snap_writer *w)
{
    uLong crc = w->crc;
    for (uint32_t i = 0; i < w->j->ntables; i++) {
        uint64_t rows = w->j->tables[i].rows, rb = (uint64_t)w->j->tables[i].floats * sizeof(float);
        crc = crc32_combine(crc, w->run[i][0], (z_off_t)(8 * rows));
        crc = crc32_combine(crc, w->run[i][1], (z_off_t)(rb * rows));
        crc = crc32_combine(crc, w->run[i][2], (z_off_t)(8 * rows));
    }
    uint8_t tail[8];
    srv_ckpt_put_u32(tail, (uint32_t)crc);
    memcpy(tail + 4, CKPT_END, 4);
    return put_at(w->fd, tail, sizeof tail, w->end);
}

/* Writes blocks for about TURN_NS (one with block_ms); finishes at the
 * last one. */
static void write_some(snap_writer *w)
{
    if (w->finished)
        return;
    if (w->s->stopping) {
        finish(w, PS_ESHUTDOWN, "psd is stopping");
        return;
    }
    if (w->block_ms) { /* test only: pushes come between the blocks, whatever the machine's speed */
        if (w->s->model.version < w->last_version + SNAP_TEST_VERSIONS && ++w->waited < SNAP_TEST_TICKS)
            return;
        w->waited = 0;
        w->last_version = w->s->model.version;
    }
    uint64_t t0 = uv_hrtime();
    do {
        srv_tables_block b;
        int rc = srv_tables_snap_next(&w->s->tables, w->id, &b);
        if (rc == 0) {
            if (write_tail(w) != 0) {
                finish(w, PS_EIO, strerror(errno));
                return;
            }
            finish(w, 0, NULL);
            return;
        }
        if (rc < 0) {
            finish(w, PS_EIO, rc == PS_ENOMEM ? "out of memory for the rows pushes changed while it was written"
                                              : "the tables were replaced while it was written");
            return;
        }
        uint64_t rows = w->j->tables[b.table].rows, rb = (uint64_t)w->j->tables[b.table].floats * sizeof(float);
        uint64_t at = w->start[b.table];
        uLong *run = w->run[b.table];
        size_t kb = 8 * (size_t)b.n, vb = (size_t)(rb * b.n);
        if (put_at(w->fd, b.keys, kb, at + 8 * b.first) != 0 ||
            put_at(w->fd, b.rows, vb, at + 8 * rows + rb * b.first) != 0 ||
            put_at(w->fd, b.stamps, kb, at + (8 + rb) * rows + 8 * b.first) != 0) {
            finish(w, PS_EIO, strerror(errno));
            return;
        }
        run[0] = crc32_z(run[0], b.keys, kb);
        run[1] = crc32_z(run[1], (const uint8_t *)b.rows, vb);
        run[2] = crc32_z(run[2], b.stamps, kb);
    } while (!w->block_ms && uv_hrtime() - t0 < TURN_NS);
}

static void on_idle(uv_idle_t *h)
{
    write_some(h->data);
}

static void on_timer(uv_timer_t *h)
{
    write_some(h->data);
}

/* The forked writer's snapshot (checkpoint.c): a second one while the
 * tables' is being read. */
static int snapshot_forked(psd *s, int fd, void (*done)(psd *s, int rc, uint64_t version, void *arg), void *arg,
                           char *err, size_t errlen)
{
    ckpt_job *j = srv_ckpt_job_new(s);
    if (!j)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a snapshot");
    j->out_fd = fd;
    j->snap_done = done;
    j->snap_arg = arg;
    if (srv_ckpt_job_fork(s, j) != 0) {
        int rc = ps_fail(err, errlen, PS_EIO, "%s", j->err);
        srv_ckpt_job_free(j);
        return rc;
    }
    return 0;
}

int srv_checkpoint_snapshot(psd *s, int fd, void (*done)(psd *s, int rc, uint64_t version, void *arg), void *arg,
                            char *err, size_t errlen)
{
    if (srv_update_busy(s) || srv_ckpt_mid_round(s))
        return ps_fail(err, errlen, PS_ENOT_READY, "an update is being applied: ask again");
    srv_tapply_drain(s->tapply);
    if (s->tables.snap)
        return snapshot_forked(s, fd, done, arg, err, errlen);
    snap_writer *w = calloc(1, sizeof *w);
    ckpt_job *j = w ? srv_ckpt_job_new(s) : NULL;
    if (!j) {
        free(w);
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a snapshot");
    }
    w->s = s;
    w->j = j;
    w->done = done;
    w->arg = arg;
    w->t0 = uv_hrtime();
    const char *slow = getenv("PSD_TEST_SNAP_BLOCK_MS");
    w->block_ms = slow ? (unsigned)strtoul(slow, NULL, 10) : 0;
    w->last_version = s->model.version;
    w->fd = dup(fd);
    uLong crc = crc32_z(0L, Z_NULL, 0);
    int rc = 0;
    if (w->fd < 0 || srv_ckpt_write_start(j, w->fd, &crc) != 0)
        rc = ps_fail(err, errlen, PS_EIO, "writing the snapshot's start: %s", strerror(errno));
    else if (srv_tables_snap_begin(&s->tables, &w->id) != 0)
        rc = ps_fail(err, errlen, PS_ENOMEM, "no memory for a snapshot of the tables");
    if (rc != 0) {
        if (w->fd >= 0)
            close(w->fd);
        srv_ckpt_job_free(j);
        free(w);
        return rc;
    }
    w->crc = crc;
    off_t at = lseek(w->fd, 0, SEEK_CUR);
    uint64_t off = at > 0 ? (uint64_t)at : 0;
    for (uint32_t i = 0; i < j->ntables; i++) {
        w->start[i] = off;
        w->run[i][0] = w->run[i][1] = w->run[i][2] = crc32_z(0L, Z_NULL, 0);
        off += (16 + (uint64_t)j->tables[i].floats * sizeof(float)) * j->tables[i].rows;
    }
    w->end = off;
    uv_idle_init(s->loop, &w->idle);
    w->idle.data = w;
    w->handles = 1;
    if (w->block_ms) {
        w->handles = 2;
        uv_timer_init(s->loop, &w->timer);
        w->timer.data = w;
        uv_timer_start(&w->timer, on_timer, w->block_ms, w->block_ms);
    } else {
        uv_idle_start(&w->idle, on_idle);
    }
    return 0;
}
