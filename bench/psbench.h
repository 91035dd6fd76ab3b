/* psbench.h - what psbench's files share: the options, one cell's
 * workers and results, a grid row, and the functions one file calls in
 * another. psbench.c holds the options and main(); a mode lives in a file
 * of its own (see each section below). */
#ifndef PSBENCH_H
#define PSBENCH_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <sys/time.h>

#include "psd/client.h"

/* the largest tensor chunk psworker puts in one frame, in floats (4 MiB);
 * --chunk changes it */
#define CHUNK_FLOATS ((uint64_t)1 << 20)
#define PULL_WINDOW 2                /* libpsclient's default pull_window */

/* tensors on psd's wire (option wire) */
enum { WIRE_F32, WIRE_BF16 };

static inline const char *wire_name(int wire)
{
    return wire == WIRE_BF16 ? "bf16" : "f32";
}

static inline size_t wire_size(int wire)
{
    return wire == WIRE_BF16 ? 2 : 4;
}
#define CALL_TIMEOUT_MS (600 * 1000) /* one request; 100M floats stay far below it */
#define CELL_GRACE_S 300.0           /* a cell this much over --seconds is stopped */
#define MAX_LIST 16

enum { MODE_ASGD, MODE_BSP, MODE_BSP_ARRIVAL, MODE_COUNT };

typedef struct opts {
    char psd[PATH_MAX];          /* psd binary */
    char mpi_prog[PATH_MAX];     /* mpi_allreduce binary; "" when not built */
    uint64_t sizes[MAX_LIST];    /* S, floats */
    int nsizes;
    int workers[MAX_LIST];       /* K */
    int nworkers;
    int modes[MODE_COUNT];
    int nmodes;
    double seconds;              /* timed part of a cell */
    uint64_t max_rounds;         /* per worker; 0 = no limit */
    int warmup;                  /* untimed round trips per worker first */
    uint64_t chunk;              /* floats per frame (psworker: CHUNK_FLOATS) */
    int window;                  /* chunk pulls in flight (psworker: PULL_WINDOW);
                                  * 0: every chunk request waits for its reply */
    const char *out;             /* output directory */
    int no_mpi, no_tcp, no_plot;
    int client_spin;             /* --client-spin: microseconds each worker polls before it sleeps */
    int table_tcp;               /* --table-tcp: psd's workers send table requests in frames
                                  * (libpsclient option shm off), not through the table segment */
    int probe;                   /* measure psd's loop lag (admin heartbeats) */
    int wire;                    /* --wire: WIRE_* of tensors on psd's wire */
    int verbose;
    int round_reps;              /* repetitions of the BSP round comparison */
    int table_reps;              /* --table: alternated pairs of cells (ceiling, psd) per K */
    int table;                   /* --table: rows by key instead of the dense grid */
    uint32_t dim;                /* table: values per row */
    uint32_t nkeys;              /* table: distinct keys a request pushes and pulls */
    uint64_t key_space;          /* table: keys drawn from ranks 0..key_space-1 */
    double zipf;                 /* table: Zipf exponent; 0: uniform keys */
    int workers_given;           /* --workers was given */
    const char *psd_set[16];     /* --psd-set KEY=VALUE: passed to every psd as --set */
    int npsd_set;
    double ckpt_gb;              /* --ckpt-stall G: table of G GB; 0: not this mode */
    int ckpt_push;               /* --ckpt-push: a second pair of phases, push-and-pull */
    char psctl[PATH_MAX];        /* psctl binary (--ckpt-stall asks it for the checkpoint) */
    int dim_given, keys_given, seconds_given;
    int replica;                 /* --replica: each psd cell's psd has a sync follower */
    int replica_pairs;           /* --replica-pairs N: N pairs of psd cells, without a follower then
                                  * with one, alternating in one run, instead of the ceiling and psd */
} opts;

enum { SYS_PSD, SYS_TCP, SYS_TCP_STAR }; /* psd, the plain-TCP ceiling, its BSP round */

typedef struct bench bench;

#define MAX_LINKS 2

/* --ckpt-stall: one timed request, its start and end (seconds since the
 * run's origin) and what it was (CK_PULL or CK_PUSHPULL) */
typedef struct csample {
    double t0, t1;
    int op;
} csample;

typedef struct bworker {
    bench *b;
    int k;                  /* shard */
    pthread_t th;
    psc_client *pc;         /* psd: the worker's libpsclient client (NULL: ceiling) */
    int fd;                 /* the plain-TCP ceiling: its socket; -1: none */
    float *params;          /* the ceiling: where the values sent back land */
    double *lat;            /* seconds per timed round trip */
    size_t nlat, lat_cap;
    float *rows;            /* table: the rows a round trip pulls (nkeys x dim) */
    uint64_t step;          /* table: round trips done (which batch is next) */
    double t_end;           /* when its last timed round trip finished */
    csample *cs;            /* --ckpt-stall: every timed request */
    size_t ncs, cs_cap;
    int rc;
    char err[600];
} bworker;

struct bench {
    int sys;                /* SYS_PSD or SYS_TCP */
    int mode;               /* MODE_* (psd) */
    int sync;               /* BSP: all workers stop after the same round */
    int shm;                /* psd cells: the workers share memory with psd, as
                             * psworker does on psd's machine (S <= 2^20) */
    uint64_t S;
    int K;
    int nparts;             /* psd instances the model is split over: 1, or 2
                             * (the round comparison's "2 parts" rows) */
    char addr[MAX_LINKS][64]; /* 127.0.0.1:port of the server, or of part i's psd */
    const float *grad;      /* shared, read-only gradient of S floats */
    uint64_t max_rounds;
    int warmup;
    uint64_t chunk;         /* floats per frame */
    int window;             /* chunk pulls in flight; 0: each request waits */
    int wire;               /* WIRE_* asked for on the wire (psd); the
                             * ceiling moves values of its size */
    int verbose;            /* the library logs at info level (else warn) */
    size_t vbytes;          /* bytes per value on the wire: 4, or 2 for bf16 */
    atomic_int wire_refused; /* psd's welcome did not offer `wire` */
    int table;              /* rows by key (psc_table_pushpull), not the dense model */
    int table_tcp;          /* table: libpsclient's shm off (requests in frames) */
    int client_spin;        /* microseconds a worker's wait for a reply polls before it sleeps (libpsclient's
                             * spin_us; the ceiling's clients likewise) */
    atomic_int table_shm;   /* table: workers whose every psd mapped their table segment */
    uint32_t dim;           /* table: values per row */
    uint32_t nkeys;         /* table: distinct keys per request */
    int nbatch;             /* table: batches per worker, used in turn */
    const uint64_t *batches; /* table: K x nbatch x nkeys keys (worker k's from
                             * k x nbatch x nkeys) */
    const void *req;        /* the ceiling: what a client sends (req_bytes) */
    size_t req_bytes, ans_bytes; /* the ceiling: request and answer bytes; the
                             * payload of a round trip is their sum */
    pthread_barrier_t gate; /* K workers + main: set-up done, timing starts */
    atomic_int stop;        /* main: the time is up */
    _Atomic uint64_t stop_at; /* BSP: first round no worker starts */
    atomic_int finished;    /* workers done */
    atomic_int failed;
    atomic_int probe_stop;  /* main: stop the loop-lag probe */
    const char *insync_log; /* --replica: the leader's log, where worker 0 waits after its
                             * warmup for the follower to be in sync; NULL: none */
    bworker *w;
};

typedef struct cell_result {
    int ok;
    uint64_t rts;           /* timed round trips, all workers */
    double secs;            /* timed window */
    double rt_per_s, gbps;  /* payload on the wire: req_bytes + ans_bytes per round trip
                             * (dense: 2 * S * vbytes) */
    double p50_ms, p99_ms, mean_ms;
    double server_cpu;      /* CPU seconds of the server per second of the window */
    double client_cpu;      /* the same for psbench's worker threads */
    double hwm_mib, rss_mib; /* psd only */
    double load;            /* 1-minute load average at the start */
    double lag_p50_ms, lag_p99_ms, lag_max_ms; /* psd's answer to an admin heartbeat
                                                * during the window: how long its
                                                * loop is busy elsewhere */
    int wire_refused;       /* psd did not offer the wire type asked for */
    int table_shm;          /* table: workers whose requests went through the table segment */
    char err[700];
} cell_result;

typedef struct row {
    int mode;               /* -1: the TCP ceiling */
    uint64_t S;
    int K;
    int wire;               /* WIRE_* on the wire (the ceiling: of the same size) */
    cell_result r;
    double bound_mib;       /* the bound, plus what BSP may add */
} row;

typedef struct mpi_res {
    uint64_t S;
    double mean_ms[2], p50_ms[2]; /* [0] tcp, [1] shared memory; NAN if not measured */
} mpi_res;

extern const char *const mode_names[MODE_COUNT];
/* --server-cpu: the CPU every server psbench starts runs on (psd, the
 * plain-TCP server), -1: wherever the kernel puts it. */
extern int server_cpu;
extern int follower_cpu; /* --follower-cpu: the follower's CPU, -1: none */

/* ---- psbench_util.c: helpers */
double now_s(void);
void sleep_s(double s);
/* Prints "psbench: " and the message on stderr and exits 2. */
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...);
int mkdir_p(const char *path);
void exe_dir(char *out, size_t len);
double load1(void);
double proc_status_mib(pid_t pid, const char *key);
double proc_cpu_s(pid_t pid);
int cmp_double(const void *a, const void *b);
double pct(const double *sorted, size_t n, double p);
void range_of(const double *v, int n, double *lo, double *hi);
double median_of(const double *v, int n);

/* ---- psbench_cell.c: one cell of K workers */
/* Records the worker's first failure: rc, a PSC_E* code, and the reason
 * from its client (psd) or errno (the plain-TCP ceiling). Returns rc. */
int wfail(bworker *w, int rc, const char *what);
int wfailf(bworker *w, int rc, const char *fmt, ...);
int table_open(bworker *w);
void run_workers(bench *b, const opts *o, const pid_t *pids, int npids, cell_result *res);

/* ---- psbench_procs.c: psd and the ceiling server as child processes */
void pin_self(int cpu);
pid_t spawn_logged(const char *const *argv, const char *log_path, int die_with_parent, char *err,
                   size_t errlen);
pid_t psd_start(const opts *o, int mode, int K, uint64_t S, const char *logpath, char *err, size_t errlen,
                int *port, const char *const *extra);
void child_stop(pid_t pid);
/* --replica: starts a follower of the psd at 127.0.0.1:port (psd --replica-of, the same
 * settings), logging to leaderlog's name with ".follower" inserted; its pid, or -1 with err. */
pid_t follower_start(const opts *o, int mode, int K, uint64_t S, const char *leaderlog, int port, char *err,
                     size_t errlen);
/* Waits until the log at path says a follower is in sync (60 s at most): 0, or -1. */
int wait_in_sync(const char *path);
/* --replica: the leader logs at info level, which its "in sync" line is */
extern const char *const info_log[];
pid_t tcp_server_start(size_t req, size_t ans, int K, int star, int *port, char *err, size_t errlen);

/* ---- psbench_dense.c: the dense grid, its table, CSV and plot */
int part_bounds(uint64_t S, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi);
void run_cell_parts(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm,
                    int nparts, row *out);
void run_cell(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm, row *out);
const char *size_label(uint64_t S, char *buf, size_t len);
void print_header(uint32_t wire);
void print_row(const row *p, const row *t);
void csv_header(FILE *f);
void csv_row(FILE *f, const row *p, const row *t);
void plot(const opts *o, const row *rows, int nrows, const row *tcp, int ntcp);

/* ---- psbench_rounds.c: BSP rounds against MPI_Allreduce */
void compare_rounds(const opts *o, const float *grad);

/* ---- psbench_table.c: --table */
uint64_t sm64(uint64_t *x);
void run_tables(const opts *o);
/* The table cell's inputs (its keys in batches, its gradients, a request's
 * bytes for the ceiling), for every worker count of o; and one cell. */
typedef struct table_inputs {
    int nbatch;
    uint64_t *batches;
    float *grad;
    char *req;
} table_inputs;
void table_inputs_make(const opts *o, table_inputs *ti);
void table_inputs_free(table_inputs *ti);
void table_cell(const opts *o, int sys, int K, const table_inputs *ti, cell_result *out);

/* ---- psbench_pairs.c: --replica-pairs */
void run_replica_pairs(const opts *o);

/* ---- psbench_ckpt.c: --ckpt-stall */
void run_ckpt_stall(const opts *o);

#endif
