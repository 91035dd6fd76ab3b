/* ckpt_job.h - a checkpoint's write as a job (checkpoint.c), for the files
 * of report/ that start one: a checkpoint into state_dir (checkpoint.c) or
 * a follower's snapshot into a descriptor (snapshot.c). */
#ifndef SRV_CKPT_JOB_H
#define SRV_CKPT_JOB_H

#include <sys/types.h>
#include <uv.h>

#include "proto/msg.h"
#include "server/report/ckpt_file.h"
#include "server/store/psd.h"

/* Everything a write needs. The parameters are a snapshot reference; the
 * optimizer state and the tables' rows are read where they live, in the
 * writer process fork() made (a frozen copy-on-write image of psd's memory)
 * or, at shutdown, in psd itself once its loop has stopped. */
typedef struct ckpt_job {
    psd *s;
    char dir[PS_CONFIG_PATH_MAX];
    char path[PS_CONFIG_PATH_MAX + 64], tmp[PS_CONFIG_PATH_MAX + 64];
    int keep;
    uint64_t version;
    srv_snap *snap;           /* parameters (a reference, not a copy) */
    size_t n;
    const float *state[CKPT_MAX_STATE]; /* the optimizer's state buffers */
    size_t nstate;
    struct ckpt_table {
        uint64_t rows;
        uint32_t floats;
        uint64_t clock;       /* the table's clock (expiry's) */
    } tables[PS_TABLES_MAX];
    uint32_t ntables;
    uint64_t tables_stamp;    /* s->tables.stamp at the snapshot */
    ps_buf header;
    uint8_t *wbuf;            /* rows staged for write(), CKPT_WBUF bytes */
    unsigned slow_us;         /* test only: pause per MiB of rows read */
    /* the outcome, filled by the writer (sent over the pipe from a child) */
    struct ckpt_result {
        int rc;               /* 0 or PS_EIO */
        int stage;            /* CKPT_AT_*: what failed */
        int err;              /* its errno */
        double seconds;
    } res;
    size_t got;               /* bytes of res read from the pipe */
    double fork_ms;           /* how long fork() held the loop */
    pid_t pid;                /* the writer process, 0: none */
    uv_pipe_t pipe;           /* its end of the pipe, EOF when it exits */
    int out_fd;               /* a snapshot for a follower: the writer writes into
                               * this descriptor (no file, no rename); -1 otherwise */
    void (*snap_done)(psd *s, int rc, uint64_t version, void *arg);
    void *snap_arg;
    char err[PS_CONFIG_PATH_MAX * 2 + 256];
} ckpt_job;

/* Prepares a job on the loop thread (nothing of the model is copied: the
 * header with the tables' row counts, the paths, a staging buffer); NULL
 * when out of memory. */
ckpt_job *srv_ckpt_job_new(psd *s);
void srv_ckpt_job_free(ckpt_job *j);
/* Writes the file's start into fd: its magic, format and header, the
 * parameters and the optimizer's state (all but the tables' rows and the
 * tail), *crc running over them. 0, or -1 with errno. */
int srv_ckpt_write_start(ckpt_job *j, int fd, unsigned long *crc);
/* Forks the writer and watches its pipe; 0, or -1 with j->err set. Once
 * forked, the job is the loop's: freed when the writer has exited (after
 * j->snap_done, when set). */
int srv_ckpt_job_fork(psd *s, ckpt_job *j);
/* A BSP round closing piece by piece has applied some of its pieces: the
 * parameters and the optimizer's state are then of two versions, and a
 * checkpoint waits for the round to close. */
int srv_ckpt_mid_round(psd *s);

#endif
