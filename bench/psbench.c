/* psbench.c - how close psd's push and pull come to the wire.
 *
 * For each (mode, S, K) cell psbench starts a fresh psd as a child process
 * (127.0.0.1, port 0, --port-file), connects K simulated workers (threads,
 * one libpsclient client each, through the public API of
 * include/psd/client.h only: shards 0..K-1 of K with a layout of one
 * tensor "w" of S floats; the first worker's values become the model),
 * and then times round trips: push S floats + pull S floats with
 * psc_pushpull, as psworker does: one PUSHPULL for S <= 2^20, otherwise
 * PUSH chunks of 2^20 floats (fin on the last) sent back to back, then PULL
 * chunks with 2 requests in flight (the library's defaults). With --wire
 * bf16 the workers ask for bfloat16 tensors, as psworker --wire bf16 does:
 * psd must offer them in its welcome, and then pushes and pulls carry 2
 * bytes a value instead of 4 (the client library converts).
 *
 * Next to it, and with the same K client threads, it times the same bytes
 * over plain TCP: a one-thread epoll server (a child process, like psd) that
 * reads S values from each client and writes S values back (4 bytes each,
 * 2 with --wire bf16), with no framing, no msgpack, no conversion and no
 * optimizer. That is the ceiling psd is compared with.
 *
 * It prints and writes (CSV, gnuplot PNG) per cell: payload GB/s (tensor
 * bytes pushed + pulled per second as sent on the wire, all workers
 * together), round trips/s, p50 and p99 round-trip latency, the CPU psd
 * used, psd's peak RSS (VmHWM) against the memory bound of the issue, the
 * ratio psd/ceiling, and how long psd took to answer a probe's heartbeats
 * meanwhile (its loop's stalls). --chunk and --pull-window (the library's
 * options chunk and pull_window) depart from psworker's behaviour, to
 * measure what a change of the worker would gain. When
 * bench/mpi_allreduce was built (Open MPI found), it also times
 * MPI_Allreduce of S floats on 2 ranks over TCP and shared memory (float32
 * whatever --wire says: MPI has no bfloat16 sum) and sets BSP rounds of 2
 * workers beside it: with one psd, and with the model split over 2 psd
 * instances (the library's split), each worker reaching them through
 * shared memory (libpsclient offers its segment to every psd of the
 * list, so on this one machine both parts go through it).
 *
 * --table times rows by key instead (psc_table_pushpull through an
 * embedding table, against the plain-TCP ceiling of the same bytes), and
 * --ckpt-stall G the checkpoint stall: psd with a state dir, a table of G GB
 * filled by pushes, then pull latency (p50, p99, max) of K workers without a
 * checkpoint and while psctl checkpoint runs (psd forks; its writer writes
 * the file), with the checkpoint's time and file and psd's memory (the
 * section "the checkpoint stall" below).
 *
 * A benchmark, not a test: it reports figures and fails only when it cannot
 * measure. See bench/README.md. */
#define _GNU_SOURCE /* memfd_create */
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

static const char *wire_name(int wire)
{
    return wire == WIRE_BF16 ? "bf16" : "f32";
}

static size_t wire_size(int wire)
{
    return wire == WIRE_BF16 ? 2 : 4;
}
#define CALL_TIMEOUT_MS (600 * 1000) /* one request; 100M floats stay far below it */
#define CELL_GRACE_S 300.0           /* a cell this much over --seconds is stopped */
#define MAX_LIST 16

enum { MODE_ASGD, MODE_BSP, MODE_BSP_ARRIVAL, MODE_COUNT };
static const char *const mode_names[MODE_COUNT] = {"asgd", "bsp", "bsp-arrival"};

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
} opts;

/* ---- small helpers ------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psbench: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Directory of this executable (for the default --psd and mpi_allreduce). */
static void exe_dir(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out, len, ".");
        return;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    if (strlen(self) >= len)
        snprintf(out, len, ".");
    else
        memcpy(out, self, strlen(self) + 1);
}

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* A "VmHWM:" style line of /proc/PID/status, in MiB; -1 if unknown. */
static double proc_status_mib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double v = -1;
    size_t kl = strlen(key);
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtod(line + kl + 1, NULL) / 1024.0; /* kB */
            break;
        }
    }
    fclose(f);
    return v;
}

/* CPU seconds (user + system) a process has used so far; -1 if unknown. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return sorted[i < n ? i : n - 1];
}

/* ---- one cell: K workers against psd or the plain-TCP server ------------- */

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
    bworker *w;
};

/* Records the worker's first failure: rc, a PSC_E* code, and the reason
 * from its client (psd) or errno (the plain-TCP ceiling). */
static int wfail(bworker *w, int rc, const char *what)
{
    if (w->rc == 0) {
        w->rc = rc ? rc : PSC_EIO;
        snprintf(w->err, sizeof w->err, "worker %d: %s: %s", w->k, what,
                 w->b->sys == SYS_PSD ? psc_errmsg(w->pc) : strerror(errno));
    }
    atomic_store(&w->b->failed, 1);
    return w->rc;
}

/* The same with a reason of psbench's own. */
__attribute__((format(printf, 3, 4)))
static int wfailf(bworker *w, int rc, const char *fmt, ...)
{
    if (w->rc == 0) {
        va_list ap;
        int n = snprintf(w->err, sizeof w->err, "worker %d: ", w->k);
        va_start(ap, fmt);
        vsnprintf(w->err + n, sizeof w->err - (size_t)n, fmt, ap);
        va_end(ap);
        w->rc = rc;
    }
    atomic_store(&w->b->failed, 1);
    return w->rc;
}

static int lat_push(bworker *w, double dt)
{
    if (w->nlat == w->lat_cap) {
        size_t cap = w->lat_cap ? w->lat_cap * 2 : 1024;
        double *p = realloc(w->lat, cap * sizeof *p);
        if (!p)
            return -1;
        w->lat = p;
        w->lat_cap = cap;
    }
    w->lat[w->nlat++] = dt;
    return 0;
}

/* One psd round trip: push S floats and pull S floats, as psworker does:
 * psc_pushpull, which sends one PUSHPULL for a part of at most the chunk
 * size (or through the shared segment), else PUSH chunks back to back and
 * then PULL chunks with the pull window in flight; with a model in 2
 * parts the request to each psd goes out before either answer is read. */
static int psd_round_trip(bworker *w)
{
    int rc = psc_pushpull(w->pc);
    return rc == 0 ? 0 : wfail(w, rc, "pushpull");
}

/* The worker's client: a layout of one tensor "w" of S floats, shard k of
 * K, the wire type, shared memory and the chunking of the cell, and no
 * reconnects (a lost psd fails the cell); its gradient vector holds the
 * cell's gradient (in the shared segment when there is one: psworker
 * computes it there, nothing to copy per round trip). It connects (the
 * first worker's 0.01s become the model, the others pull it) and checks
 * that psd gave the wire type and the shared memory asked for: figures of
 * another kind would be mislabelled. */
static int psd_open(bworker *w)
{
    bench *b = w->b;
    char v[160];
    w->pc = psc_new();
    if (!w->pc)
        return wfailf(w, PSC_ENOMEM, "out of memory");
    if (b->nparts == 1)
        snprintf(v, sizeof v, "%s", b->addr[0]);
    else
        snprintf(v, sizeof v, "%s,%s", b->addr[0], b->addr[1]);
    int rc = psc_set(w->pc, "server", v);
    if (rc == 0)
        rc = psc_set(w->pc, "log", b->verbose ? "info" : "warn");
    snprintf(v, sizeof v, "%d/%d", w->k, b->K);
    if (rc == 0)
        rc = psc_set(w->pc, "shard", v);
    snprintf(v, sizeof v, "%" PRIu64, b->chunk);
    if (rc == 0)
        rc = psc_set(w->pc, "chunk", v);
    snprintf(v, sizeof v, "%d", b->window);
    if (rc == 0)
        rc = psc_set(w->pc, "pull_window", v);
    if (rc == 0)
        rc = psc_set(w->pc, "wire", wire_name(b->wire));
    if (rc == 0)
        rc = psc_set(w->pc, "shm", b->shm ? "on" : "off");
    if (rc == 0)
        rc = psc_set(w->pc, "reconnect", "off");
    if (rc == 0)
        rc = psc_set(w->pc, "connect_s", "10");
    snprintf(v, sizeof v, "%d", CALL_TIMEOUT_MS);
    if (rc == 0)
        rc = psc_set(w->pc, "timeout_ms", v);
    snprintf(v, sizeof v, "%d", b->client_spin);
    if (rc == 0)
        rc = psc_set(w->pc, "spin_us", v);
    uint64_t dims[1] = {b->S};
    if (rc == 0)
        rc = psc_add_tensor(w->pc, "w", 1, dims);
    if (rc != 0)
        return wfail(w, rc, "options");
    float *params = psc_params(w->pc), *grads = psc_grads(w->pc);
    if (!params || !grads)
        return wfail(w, PSC_ENOMEM, "vectors");
    for (uint64_t i = 0; i < b->S; i++)
        params[i] = 0.01f;
    memcpy(grads, b->grad, b->S * sizeof(float));
    if ((rc = psc_connect(w->pc)) != 0)
        return wfail(w, rc, "connect");
    if (b->shm && !psc_shm(w->pc))
        return wfailf(w, PSC_EINVAL, "psd did not map our shared memory (its log says why)");
    if (strcmp(psc_wire(w->pc), wire_name(b->wire)) != 0) {
        atomic_store(&b->wire_refused, 1);
        return wfailf(w, PSC_EINVAL,
                      "psd does not offer %s tensors on the wire (wire_bf16 = no, or a psd older than the "
                      "bfloat16 wire)", wire_name(b->wire));
    }
    return 0;
}

/* The table mode's worker: shard k of K with a dense layout of 4 floats
 * (a job always has one; it is not pushed), table "emb" of dim values per
 * row (uniform init, AdaGrad), no reconnects. */
static int table_open(bworker *w)
{
    bench *b = w->b;
    char v[160];
    w->pc = psc_new();
    w->rows = malloc((size_t)b->nkeys * b->dim * sizeof(float));
    if (!w->pc || !w->rows)
        return wfailf(w, PSC_ENOMEM, "out of memory");
    int rc = psc_set(w->pc, "server", b->addr[0]);
    if (rc == 0)
        rc = psc_set(w->pc, "log", b->verbose ? "info" : "warn");
    snprintf(v, sizeof v, "%d/%d", w->k, b->K);
    if (rc == 0)
        rc = psc_set(w->pc, "shard", v);
    if (rc == 0)
        rc = psc_set(w->pc, "reconnect", "off");
    if (rc == 0)
        rc = psc_set(w->pc, "connect_s", "10");
    if (rc == 0 && b->table_tcp)
        rc = psc_set(w->pc, "shm", "off");
    snprintf(v, sizeof v, "%d", CALL_TIMEOUT_MS);
    if (rc == 0)
        rc = psc_set(w->pc, "timeout_ms", v);
    snprintf(v, sizeof v, "%d", b->client_spin);
    if (rc == 0)
        rc = psc_set(w->pc, "spin_us", v);
    uint64_t dims[1] = {4};
    if (rc == 0)
        rc = psc_add_tensor(w->pc, "w", 1, dims);
    if (rc != 0)
        return wfail(w, rc, "options");
    if ((rc = psc_connect(w->pc)) != 0)
        return wfail(w, rc, "connect");
    if ((rc = psc_table(w->pc, "emb", b->dim, "uniform", 0.01, 1, "adagrad", "lr=0.05")) != 0)
        return wfail(w, rc, "table");
    if (psc_table_shm(w->pc))
        atomic_fetch_add(&b->table_shm, 1);
    return 0;
}

/* One table round trip: push the row gradients of this batch's keys and
 * pull the next batch's rows (psc_table_pushpull), batches in turn. */
static int table_round_trip(bworker *w)
{
    bench *b = w->b;
    const uint64_t *mine = b->batches + (size_t)w->k * (size_t)b->nbatch * b->nkeys;
    const uint64_t *keys = mine + (size_t)(w->step % (uint64_t)b->nbatch) * b->nkeys;
    const uint64_t *next = mine + (size_t)((w->step + 1) % (uint64_t)b->nbatch) * b->nkeys;
    w->step++;
    int rc = psc_table_pushpull(w->pc, "emb", keys, b->nkeys, b->grad, next, b->nkeys, w->rows);
    return rc == 0 ? 0 : wfail(w, rc, "table pushpull");
}

static int write_full(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_full(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = recv(fd, c, n, 0);
        if (k == 0)
            errno = ECONNRESET;
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Polls fd until it is readable or us microseconds have passed, yielding
 * the CPU between polls (--client-spin: as libpsclient's spin_us). */
static void spin_readable(int fd, int us)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double end = now_s() + us * 1e-6;
    while (poll(&p, 1, 0) == 0 && now_s() < end)
        sched_yield();
}

/* read_full, each wait for more bytes first polling for up to spin_us
 * microseconds as spin_readable (0: read_full). */
static int read_reply(int fd, void *p, size_t n, int spin_us)
{
    if (spin_us <= 0)
        return read_full(fd, p, n);
    char *c = p;
    while (n > 0) {
        ssize_t k = recv(fd, c, n, MSG_DONTWAIT);
        if (k > 0) {
            c += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            errno = ECONNRESET;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        spin_readable(fd, spin_us);
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, -1) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

/* A TCP connection to "127.0.0.1:port", with TCP_NODELAY; -1 with errno. */
static int tcp_connect(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[64];
    if (!colon || (size_t)(colon - addr) >= sizeof host) {
        errno = EINVAL;
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One plain-TCP round trip: the request's bytes out, the answer's back
 * (dense: S values each way at the size psd's wire gives them, 4 bytes or
 * 2 with --wire bf16; table: the bytes of a TPUSHPULL's keys, gradients and
 * next keys out, of its rows back); they land in the parameters' buffer,
 * unconverted. */
static int tcp_round_trip(bworker *w)
{
    if (write_full(w->fd, w->b->req, w->b->req_bytes) != 0)
        return wfail(w, PSC_EIO, "tcp send");
    if (read_reply(w->fd, w->params, w->b->ans_bytes, w->b->client_spin) != 0)
        return wfail(w, PSC_EIO, "tcp receive");
    return 0;
}

/* Whether worker w should start round r (0-based, timed rounds only). In
 * BSP every worker must do the same rounds or the last one never closes:
 * the first worker to see the time up makes the round it is starting the
 * last for everyone (no worker can be past it, since it has not pushed). */
static int keep_going(bench *b, uint64_t r)
{
    if (atomic_load(&b->failed))
        return 0;
    if (b->max_rounds && r >= b->max_rounds)
        return 0;
    if (!b->sync)
        return !atomic_load(&b->stop);
    uint64_t at = atomic_load(&b->stop_at);
    if (at == UINT64_MAX && atomic_load(&b->stop)) {
        uint64_t want = r + 1;
        if (atomic_compare_exchange_strong(&b->stop_at, &at, want))
            at = want;
    }
    return r < at;
}

static void *worker_main(void *arg)
{
    bworker *w = arg;
    bench *b = w->b;
    int rc = 0;
    if (b->sys == SYS_PSD) {
        rc = b->table ? table_open(w) : psd_open(w);
    } else if ((w->fd = tcp_connect(b->addr[0])) < 0) {
        rc = wfail(w, PSC_ECONNECT, "connect");
    }
    for (int i = 0; rc == 0 && i < b->warmup; i++)
        rc = b->sys != SYS_PSD ? tcp_round_trip(w) : b->table ? table_round_trip(w) : psd_round_trip(w);
    if (rc != 0 && w->pc)
        psc_close(w->pc); /* so psd's BSP rounds go on without us */
    pthread_barrier_wait(&b->gate);
    w->t_end = now_s();
    for (uint64_t r = 0; rc == 0 && keep_going(b, r); r++) {
        double t0 = now_s();
        rc = b->sys != SYS_PSD ? tcp_round_trip(w) : b->table ? table_round_trip(w) : psd_round_trip(w);
        double t1 = now_s();
        if (rc == 0) {
            w->t_end = t1;
            if (lat_push(w, t1 - t0) != 0)
                rc = wfailf(w, PSC_ENOMEM, "out of memory for the latency record");
        }
    }
    if (w->pc)
        psc_close(w->pc); /* a BYE to every psd */
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    atomic_fetch_add(&b->finished, 1);
    return NULL;
}

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

/* The loop-lag probe: an admin connection that sends a HEARTBEAT with an id
 * every 10 ms while the workers are timed and records how long psd takes
 * to answer. psd answers it at once unless its one loop thread is busy
 * (reading, applying, copying), so the delays show how long it stalls.
 * libpsclient speaks for workers only, so the probe writes its three kinds
 * of frame itself, as proto/PROTOCOL.md gives them (sections 1, 3, 5): a
 * 4-byte big-endian length, then a msgpack map whose first key is "t". */
typedef struct probe {
    bench *b;
    pthread_t th;
    double *lat;
    size_t n, cap;
    int rc;
} probe;

enum { PT_HELLO = 1, PT_WELCOME = 2, PT_OK = 8, PT_HEARTBEAT = 9, PT_BYE = 16 };

/* Sends {"t": type, "id": id} (HELLO: {"t": 1, "v": 1, "role": "admin"})
 * and reads the answer, which must be of type `want`: 0 or -1. */
static int probe_call(int fd, int type, uint32_t id, int want)
{
    uint8_t f[32], *q = f + 4;
    if (type == PT_HELLO) {
        static const uint8_t hello[] = {0x83, 0xa1, 't', PT_HELLO, 0xa1, 'v', 1,
                                        0xa4, 'r', 'o', 'l', 'e', 0xa5, 'a', 'd', 'm', 'i', 'n'};
        memcpy(q, hello, sizeof hello);
        q += sizeof hello;
    } else {
        const uint8_t head[] = {0x82, 0xa1, 't', (uint8_t)type, 0xa2, 'i', 'd', 0xce};
        memcpy(q, head, sizeof head);
        q += sizeof head;
        for (int s = 24; s >= 0; s -= 8)
            *q++ = (uint8_t)(id >> s);
    }
    uint32_t len = (uint32_t)(q - f - 4);
    f[0] = 0, f[1] = 0, f[2] = (uint8_t)(len >> 8), f[3] = (uint8_t)len;
    if (write_full(fd, f, (size_t)(q - f)) != 0)
        return -1;
    uint8_t hdr[4], body[4096];
    if (read_full(fd, hdr, 4) != 0)
        return -1;
    uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (n < 4 || n > sizeof body || read_full(fd, body, n) != 0)
        return -1;
    /* psd's encoder writes "t" first: a map header, then a1 74 <type> */
    return (body[0] & 0xf0) == 0x80 && body[1] == 0xa1 && body[2] == 't' && body[3] == want ? 0 : -1;
}

static void *probe_main(void *arg)
{
    probe *p = arg;
    struct timeval tv = {CALL_TIMEOUT_MS / 1000, 0};
    uint32_t id = 1;
    int fd = tcp_connect(p->b->addr[0]);
    p->rc = fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
            probe_call(fd, PT_HELLO, 0, PT_WELCOME) != 0;
    while (p->rc == 0 && !atomic_load(&p->b->probe_stop)) {
        double t0 = now_s();
        p->rc = probe_call(fd, PT_HEARTBEAT, id++, PT_OK);
        double dt = now_s() - t0;
        if (p->rc != 0)
            break;
        if (p->n == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 1024;
            double *q = realloc(p->lat, cap * sizeof *q);
            if (!q)
                break;
            p->lat = q;
            p->cap = cap;
        }
        p->lat[p->n++] = dt;
        sleep_s(0.01);
    }
    if (fd >= 0) {
        probe_call(fd, PT_BYE, id, PT_OK);
        close(fd);
    }
    return NULL;
}

/* CPU seconds the servers pids[0..n) have used so far, together; -1 if unknown. */
static double servers_cpu_s(const pid_t *pids, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double c = proc_cpu_s(pids[i]);
        if (c < 0)
            return -1;
        sum += c;
    }
    return sum;
}

/* Runs K worker threads against b->addr (a model in 2 parts: each worker
 * against both psd); the CPU use of the servers
 * pids[0..npids) is measured, together. */
static void run_workers(bench *b, const opts *o, const pid_t *pids, int npids, cell_result *res)
{
    int K = b->K;
    b->w = calloc((size_t)K, sizeof *b->w);
    if (!b->w)
        die("out of memory");
    pthread_barrier_init(&b->gate, NULL, (unsigned)K + 1);
    atomic_store(&b->stop, 0);
    atomic_store(&b->stop_at, UINT64_MAX);
    atomic_store(&b->finished, 0);
    atomic_store(&b->failed, 0);
    atomic_store(&b->wire_refused, 0);
    int started = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        w->b = b;
        w->k = k;
        w->fd = -1;
        if (b->sys == SYS_PSD)
            continue; /* the library's vectors: psd_open */
        w->params = malloc(b->ans_bytes);
        if (!w->params)
            die("out of memory for %zu bytes", b->ans_bytes);
        memset(w->params, 0, b->ans_bytes); /* fault it in outside the timing */
    }
    for (int k = 0; k < K; k++) {
        if (pthread_create(&b->w[k].th, NULL, worker_main, &b->w[k]) != 0)
            die("cannot start worker threads");
        started++;
    }
    pthread_barrier_wait(&b->gate);
    double t0 = now_s();
    double cpu0 = servers_cpu_s(pids, npids);
    probe pr = {.b = b};
    int probing = b->sys == SYS_PSD && b->nparts == 1 && o->probe;
    atomic_store(&b->probe_stop, 0);
    if (probing && pthread_create(&pr.th, NULL, probe_main, &pr) != 0)
        probing = 0;
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double deadline = t0 + o->seconds + CELL_GRACE_S;
    int killed = 0;
    while (atomic_load(&b->finished) < K) {
        double t = now_s();
        if (t - t0 >= o->seconds)
            atomic_store(&b->stop, 1);
        if (t > deadline && !killed) {
            /* a worker is stuck: kill the server so its calls fail */
            snprintf(res->err, sizeof res->err, "cell ran %.0f s over its time; server killed", CELL_GRACE_S);
            for (int i = 0; i < npids; i++)
                kill(pids[i], SIGKILL);
            killed = 1;
        }
        sleep_s(0.005);
    }
    double cpu1 = servers_cpu_s(pids, npids);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    atomic_store(&b->probe_stop, 1);
    if (probing) {
        pthread_join(pr.th, NULL);
        qsort(pr.lat, pr.n, sizeof *pr.lat, cmp_double);
        res->lag_p50_ms = 1e3 * pct(pr.lat, pr.n, 0.50);
        res->lag_p99_ms = 1e3 * pct(pr.lat, pr.n, 0.99);
        res->lag_max_ms = pr.n ? 1e3 * pr.lat[pr.n - 1] : NAN;
        free(pr.lat);
    } else {
        res->lag_p50_ms = res->lag_p99_ms = res->lag_max_ms = NAN;
    }
    for (int k = 0; k < started; k++)
        pthread_join(b->w[k].th, NULL);
    pthread_barrier_destroy(&b->gate);

    double t_end = t0;
    size_t nlat = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        if (w->rc != 0 && !res->err[0])
            snprintf(res->err, sizeof res->err, "%s", w->err);
        if (w->t_end > t_end)
            t_end = w->t_end;
        nlat += w->nlat;
    }
    double *all = malloc((nlat ? nlat : 1) * sizeof *all);
    if (!all)
        die("out of memory");
    size_t j = 0;
    double sum = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        for (size_t i = 0; i < w->nlat; i++) {
            all[j++] = w->lat[i];
            sum += w->lat[i];
        }
    }
    qsort(all, nlat, sizeof *all, cmp_double);
    res->ok = res->err[0] == 0 && nlat > 0;
    res->rts = nlat;
    res->secs = t_end - t0;
    if (res->secs > 0) {
        res->rt_per_s = (double)nlat / res->secs;
        res->gbps = res->rt_per_s * (double)(b->req_bytes + b->ans_bytes) / 1e9;
        if (cpu0 >= 0 && cpu1 >= 0)
            res->server_cpu = (cpu1 - cpu0) / res->secs;
        double cs = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        res->client_cpu = cs / res->secs;
    }
    res->p50_ms = 1e3 * pct(all, nlat, 0.50);
    res->p99_ms = 1e3 * pct(all, nlat, 0.99);
    res->mean_ms = nlat ? 1e3 * sum / (double)nlat : NAN;
    res->wire_refused = atomic_load(&b->wire_refused);
    free(all);
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        psc_free(w->pc);
        free(w->params);
        free(w->rows);
        free(w->lat);
    }
    free(b->w);
    b->w = NULL;
}

/* ---- psd as a child process ---------------------------------------------- */

/* --server-cpu: the CPU every server psbench starts runs on (psd, the
 * plain-TCP server), -1: wherever the kernel puts it. */
static int server_cpu = -1;

/* Puts the calling process on CPU cpu alone (cpu >= 0), or on every CPU
 * but cpu (cpu < 0: CPU -cpu - 1 left out). */
static void pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < n && c < CPU_SETSIZE; c++)
        if (cpu >= 0 ? c == cpu : c != -cpu - 1)
            CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "psbench: cannot pin to CPU%s %d: %s\n", cpu >= 0 ? "" : "s but", cpu >= 0 ? cpu : -cpu - 1,
                strerror(errno));
}

/* Runs argv[0] with argv in a child whose standard output and error go to
 * log_path (truncated; if it cannot be opened they stay psbench's). With
 * die_with_parent the child gets SIGTERM when psbench dies, so no psd is
 * left behind. Returns the child's pid, or -1 with err when fork fails; a
 * program that cannot be executed exits 127 with a message in its log. */
static pid_t spawn_logged(const char *const *argv, const char *log_path, int die_with_parent, char *err,
                          size_t errlen)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (die_with_parent) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent)
                _exit(1);
        }
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (server_cpu >= 0)
            pin_self(server_cpu);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "psbench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Starts psd for a cell, with a model of S floats; returns its pid and sets
 * *port, or -1 with err. Its port file is named after its log (X.log:
 * X.port), so psd instances running at once, as the parts of a split
 * model do, never share one. extra (NULL, or a NULL-terminated list of at
 * most 16 arguments) goes after psbench's own settings and before
 * --psd-set's. */
static pid_t psd_start(const opts *o, int mode, int K, uint64_t S, const char *logpath, char *err, size_t errlen,
                       int *port, const char *const *extra)
{
    char portfile[PATH_MAX], workers[16], maxp[48], order[48];
    size_t ll = strlen(logpath);
    if (ll > 4 && strcmp(logpath + ll - 4, ".log") == 0)
        ll -= 4;
    if (snprintf(portfile, sizeof portfile, "%.*s.port", (int)ll, logpath) >= (int)sizeof portfile) {
        snprintf(err, errlen, "path too long: %.300s", logpath);
        return -1;
    }
    unlink(portfile);
    snprintf(workers, sizeof workers, "%d", K);
    snprintf(maxp, sizeof maxp, "max_params=%" PRIu64, S > 268435456u ? S : (uint64_t)268435456u);
    snprintf(order, sizeof order, "bsp_sum_order=%s", mode == MODE_BSP_ARRIVAL ? "arrival" : "shard");
    const char *argv[] = {o->psd,
                          "--listen", "127.0.0.1:0",
                          "--port-file", portfile,
                          "--mode", mode == MODE_ASGD ? "asgd" : "bsp",
                          "--workers", workers,
                          "--log-level", o->verbose ? "info" : "warn",
                          "--set", maxp,
                          "--set", "max_frame=64M",
                          "--set", "optimizer=sgd",
                          "--set", "momentum=0.9",
                          "--set", "lr=1e-6",
                          "--set", "heartbeat_timeout=1h",
                          "--set", order,
                          NULL};
    /* --psd-set: the settings given, after psbench's own (a later --set wins) */
    const char *args[sizeof argv / sizeof argv[0] + 16 + 2 * 16];
    size_t na = 0;
    for (; argv[na]; na++)
        args[na] = argv[na];
    for (int i = 0; extra && extra[i] && i < 16; i++)
        args[na++] = extra[i];
    for (int i = 0; i < o->npsd_set; i++) {
        args[na++] = "--set";
        args[na++] = o->psd_set[i];
    }
    args[na] = NULL;
    pid_t pid = spawn_logged(args, logpath, 1, err, errlen); /* no psd left behind if psbench dies */
    if (pid < 0)
        return -1;
    double t0 = now_s();
    for (;;) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            int p = 0;
            int got = fscanf(f, "%d", &p) == 1 && p > 0;
            fclose(f);
            if (got) {
                *port = p;
                unlink(portfile);
                return pid;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            snprintf(err, errlen, "psd exited before listening (see %.300s)", logpath);
            return -1;
        }
        if (now_s() - t0 > 20) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(err, errlen, "psd did not write its port file in 20 s (see %.300s)", logpath);
            return -1;
        }
        sleep_s(0.01);
    }
}

static void child_stop(pid_t pid)
{
    int st;
    kill(pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return;
        sleep_s(0.01);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

/* ---- the plain-TCP ceiling server ------------------------------------------ */

typedef struct tconn {
    int fd;
    int writing;  /* 0: reading S values, 1: writing S values back */
    int parked;   /* star: read all S values, waits for the other clients */
    size_t pos;
    char *buf;    /* where this client's values are read to */
} tconn;

/* Star rounds: when every live client has sent its values, all of them
 * are written back; returns the clients still parked (parked, or 0). */
static int star_release(int ep, tconn *cs, int n, int parked)
{
    int live = 0;
    for (int i = 0; i < n; i++)
        live += cs[i].fd >= 0;
    if (parked < live)
        return parked;
    for (int i = 0; i < n; i++) {
        if (cs[i].fd < 0 || !cs[i].parked)
            continue;
        cs[i].parked = 0;
        cs[i].writing = 1;
        struct epoll_event e = {.events = EPOLLOUT, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_MOD, cs[i].fd, &e);
    }
    return 0;
}

/* The ceiling server: one thread, epoll, nonblocking sockets, as psd's
 * loop; for each client it reads a request of req bytes (dense: S values)
 * into that client's buffer and writes ans bytes of one shared "model"
 * back, forever.
 * With star set it does a BSP round's traffic instead: it writes back only
 * once every connected client has sent its S values (no sum, no update),
 * the least any central server does for a round. Runs in a child process
 * until killed. */
static void tcp_server_main(int lfd, size_t req, size_t ans, int K, int star)
{
    size_t bytes = req > ans ? req : ans;
    char *model = malloc(bytes);
    tconn *cs = calloc((size_t)K + 1, sizeof *cs);
    int ep = epoll_create1(0);
    if (!model || !cs || ep < 0)
        _exit(1);
    memset(model, 1, bytes);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    int n = 0, parked = 0;
    for (;;) {
        struct epoll_event evs[64];
        int ne = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < ne; i++) {
            tconn *c = evs[i].data.ptr;
            if (!c) {
                int fd = accept(lfd, NULL, NULL);
                if (fd >= 0)
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                if (fd < 0 || n > K) {
                    if (fd >= 0)
                        close(fd);
                    continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                c = &cs[n++];
                c->fd = fd;
                if (!(c->buf = malloc(bytes)))
                    _exit(1);
                memset(c->buf, 0, bytes);
                struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                continue;
            }
            if (c->parked) { /* only EPOLLHUP or EPOLLERR come while parked */
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                c->parked = 0;
                parked--;
                if (parked > 0)
                    parked = star_release(ep, cs, n, parked);
                continue;
            }
            for (;;) {
                ssize_t k;
                size_t want = c->writing ? ans : req;
                if (!c->writing)
                    k = recv(c->fd, c->buf + c->pos, want - c->pos, 0);
                else
                    k = send(c->fd, model + c->pos, want - c->pos, MSG_NOSIGNAL);
                if (k == 0 && !c->writing) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                    break;
                }
                if (k < 0) {
                    if (errno == EINTR)
                        continue;
                    if (errno != EAGAIN) {
                        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                        close(c->fd);
                        c->fd = -1;
                    }
                    break;
                }
                c->pos += (size_t)k;
                if (c->pos < want)
                    continue;
                c->pos = 0;
                if (star && !c->writing) {
                    struct epoll_event e = {.events = 0, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
                    c->parked = 1;
                    parked++;
                    break;
                }
                c->writing = !c->writing;
                struct epoll_event e = {.events = c->writing ? EPOLLOUT : EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
            }
            if (star && parked > 0 && n >= K)
                parked = star_release(ep, cs, n, parked);
        }
    }
}

static pid_t tcp_server_start(size_t req, size_t ans, int K, int star, int *port, char *err, size_t errlen)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 64) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &al) != 0) {
        snprintf(err, errlen, "tcp server socket: %s", strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(lfd);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (server_cpu >= 0)
            pin_self(server_cpu);
        tcp_server_main(lfd, req, ans, K, star);
        _exit(0);
    }
    close(lfd);
    return pid;
}

/* ---- the grid ------------------------------------------------------------- */

typedef struct row {
    int mode;               /* -1: the TCP ceiling */
    uint64_t S;
    int K;
    int wire;               /* WIRE_* on the wire (the ceiling: of the same size) */
    cell_result r;
    double bound_mib;       /* the issue's bound, plus what BSP may add */
} row;

static double bound_mib(int mode, uint64_t S, int K)
{
    /* 1.1 x (model + SGD momentum) + 64 MiB; BSP may add one model-sized
     * accumulator (bsp-arrival), and deterministic summation (bsp: sums in
     * shard order, whatever the arrival order) one gradient per worker */
    double model = (double)S * sizeof(float) / 1048576.0;
    double extra = mode == MODE_ASGD ? 0.0 : mode == MODE_BSP ? K * model : model;
    return 1.1 * 2.0 * model + 64.0 + extra;
}

/* Part i of n of a model of S values, [*lo, *hi), as the workers split it
 * (proto/PROTOCOL.md 6.2: inner boundaries at multiples of 1024 values);
 * -1 when S is under 1024 x n. */
static int part_bounds(uint64_t S, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi)
{
    if (n == 0 || i >= n || S < (uint64_t)n * 1024)
        return -1;
    *lo = i == 0 ? 0 : S * i / n / 1024 * 1024;
    *hi = i + 1 == n ? S : S * (i + 1) / n / 1024 * 1024;
    return 0;
}

/* One cell. nparts 2 (psd only): the model is split over 2 psd instances,
 * each started for its part, and each worker's client lists both (through
 * shared memory with both when shm is set). */
static void run_cell_parts(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm,
                           int nparts, row *out)
{
    bench b = {0};
    char err[700] = "";
    char logpath[PATH_MAX];
    int port = 0;
    pid_t pid[MAX_LINKS] = {-1, -1};
    int npid = 0;
    memset(out, 0, sizeof *out);
    out->mode = sys == SYS_PSD ? mode : -1;
    out->S = S;
    out->K = K;
    out->wire = o->wire;
    out->bound_mib = bound_mib(mode, S, K);
    out->r.load = load1();
    b.sys = sys;
    b.mode = mode;
    b.sync = (sys == SYS_PSD && mode != MODE_ASGD) || sys == SYS_TCP_STAR;
    b.shm = shm && sys == SYS_PSD;
    b.client_spin = o->client_spin;
    b.S = S;
    b.K = K;
    b.nparts = sys == SYS_PSD ? nparts : 1;
    uint64_t part_lo[MAX_LINKS] = {0}, part_hi[MAX_LINKS] = {S};
    for (int i = 0; i < b.nparts && b.nparts > 1; i++) {
        if (part_bounds(S, (uint32_t)i, (uint32_t)b.nparts, &part_lo[i], &part_hi[i]) != 0) {
            snprintf(out->r.err, sizeof out->r.err, "%" PRIu64 " floats do not split into %d parts", S, b.nparts);
            return;
        }
    }
    b.grad = grad;
    b.max_rounds = o->max_rounds;
    b.warmup = o->warmup;
    b.chunk = o->chunk;
    b.window = o->window;
    b.wire = o->wire;
    b.verbose = o->verbose;
    b.vbytes = wire_size(o->wire);
    b.req = grad;
    b.req_bytes = b.ans_bytes = S * b.vbytes;
    for (int i = 0; i < b.nparts; i++) {
        char part[32] = "";
        if (b.nparts > 1)
            snprintf(part, sizeof part, " part %d of %d", i, b.nparts);
        if (sys == SYS_PSD && b.nparts == 1) {
            snprintf(logpath, sizeof logpath, "%s/logs/psd-%s-%" PRIu64 "-%d.log", o->out, mode_names[mode], S, K);
            pid[i] = psd_start(o, mode, K, S, logpath, err, sizeof err, &port, NULL);
        } else if (sys == SYS_PSD) {
            snprintf(logpath, sizeof logpath, "%s/logs/psd-%s-%" PRIu64 "-%d-part%dof%d.log", o->out,
                     mode_names[mode], S, K, i, b.nparts);
            pid[i] = psd_start(o, mode, K, part_hi[i] - part_lo[i], logpath, err, sizeof err, &port, NULL);
        } else {
            pid[i] = tcp_server_start(b.req_bytes, b.ans_bytes, K, sys == SYS_TCP_STAR, &port, err, sizeof err);
        }
        if (pid[i] < 0) {
            if (b.nparts > 1)
                snprintf(out->r.err, sizeof out->r.err, "psd of%s: %.600s", part, err);
            else
                snprintf(out->r.err, sizeof out->r.err, "%s", err);
            while (npid > 0)
                child_stop(pid[--npid]);
            return;
        }
        npid++;
        if (o->verbose || getenv("PSBENCH_SHOW_PID"))
            fprintf(stderr, "psbench: %s %s S=%" PRIu64 " K=%d%s: server pid %d\n", sys == SYS_PSD ? "psd" : "tcp",
                    sys == SYS_PSD ? mode_names[mode] : sys == SYS_TCP ? "ceiling" : "star round", S, K, part,
                    (int)pid[i]);
        snprintf(b.addr[i], sizeof b.addr[i], "127.0.0.1:%d", port);
    }
    run_workers(&b, o, pid, npid, &out->r);
    if (sys == SYS_PSD && b.nparts == 1) {
        out->r.hwm_mib = proc_status_mib(pid[0], "VmHWM");
        out->r.rss_mib = proc_status_mib(pid[0], "VmRSS");
    }
    for (int i = 0; i < npid; i++)
        child_stop(pid[i]);
}

static void run_cell(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm, row *out)
{
    run_cell_parts(o, sys, mode, S, K, grad, shm, 1, out);
}

static const char *size_label(uint64_t S, char *buf, size_t len)
{
    if (S >= 1000000 && S % 1000000 == 0)
        snprintf(buf, len, "%" PRIu64 "M", S / 1000000);
    else
        snprintf(buf, len, "%" PRIu64, S);
    return buf;
}

static void print_header(uint32_t wire)
{
    char psd_label[48], tcp_label[48];
    snprintf(psd_label, sizeof psd_label, "psd, %s on the wire", wire_name(wire));
    snprintf(tcp_label, sizeof tcp_label, "plain TCP (ceiling), %zu B a value", wire_size(wire));
    printf("\n%-11s %6s %2s | %8s %7s %8s %8s %4s | %8s %7s %8s %8s | %5s %5s | %6s %6s | %7s %7s | %4s\n", "mode",
           "floats", "K", "rt/s", "GB/s", "p50 ms", "p99 ms", "cpu", "rt/s", "GB/s", "p50 ms", "p99 ms", "GB/s",
           "rt/s", "peak", "bound", "p99", "max", "load");
    printf("%-11s %6s %2s | %-41s | %-35s | %-11s | %-13s | %-15s |\n", "", "", "", psd_label, tcp_label,
           "psd/ceiling", "psd MiB", "psd lag ms");
}

static void print_row(const row *p, const row *t)
{
    char sl[32];
    const cell_result *r = &p->r;
    printf("%-11s %6s %2d | ", mode_names[p->mode], size_label(p->S, sl, sizeof sl), p->K);
    if (r->ok)
        printf("%8.1f %7.3f %8.2f %8.2f %4.2f | ", r->rt_per_s, r->gbps, r->p50_ms, r->p99_ms, r->server_cpu);
    else
        printf("%-41s | ", "failed");
    if (t && t->r.ok)
        printf("%8.1f %7.3f %8.2f %8.2f | ", t->r.rt_per_s, t->r.gbps, t->r.p50_ms, t->r.p99_ms);
    else
        printf("%-35s | ", t ? "failed" : "-");
    if (r->ok && t && t->r.ok)
        printf("%4.0f%% %4.0f%% | ", 100 * r->gbps / t->r.gbps, 100 * r->rt_per_s / t->r.rt_per_s);
    else
        printf("%11s | ", "-");
    printf("%6.0f %6.0f%s| %7.1f %7.1f | %4.2f\n", r->hwm_mib, p->bound_mib, r->ok && r->hwm_mib > p->bound_mib ? "!" : " ",
           r->lag_p99_ms, r->lag_max_ms, r->load);
    if (!r->ok && r->err[0])
        printf("    psd: %s\n", r->err);
    if (t && !t->r.ok && t->r.err[0])
        printf("    tcp: %s\n", t->r.err);
    fflush(stdout);
}

static void csv_header(FILE *f)
{
    fprintf(f, "mode,floats,workers,ok,round_trips,seconds,rt_per_s,gb_per_s,p50_ms,p99_ms,mean_ms,psd_cpu,"
               "client_cpu,tcp_rt_per_s,tcp_gb_per_s,tcp_p50_ms,tcp_p99_ms,tcp_mean_ms,tcp_server_cpu,"
               "ratio_gb_per_s,ratio_rt_per_s,psd_peak_rss_mib,psd_rss_end_mib,bound_mib,within_bound,"
               "lag_p50_ms,lag_p99_ms,lag_max_ms,load1,wire\n");
}

static void csv_row(FILE *f, const row *p, const row *t)
{
    const cell_result *r = &p->r;
    int tok = t && t->r.ok;
    fprintf(f, "%s,%" PRIu64 ",%d,%d,%" PRIu64 ",%.4f,%.3f,%.5f,%.4f,%.4f,%.4f,%.3f,%.3f,", mode_names[p->mode], p->S,
            p->K, r->ok, r->rts, r->secs, r->rt_per_s, r->gbps, r->p50_ms, r->p99_ms, r->mean_ms, r->server_cpu,
            r->client_cpu);
    if (tok)
        fprintf(f, "%.3f,%.5f,%.4f,%.4f,%.4f,%.3f,%.4f,%.4f,", t->r.rt_per_s, t->r.gbps, t->r.p50_ms, t->r.p99_ms,
                t->r.mean_ms, t->r.server_cpu, r->ok ? r->gbps / t->r.gbps : NAN,
                r->ok ? r->rt_per_s / t->r.rt_per_s : NAN);
    else
        fprintf(f, ",,,,,,,,");
    fprintf(f, "%.1f,%.1f,%.1f,%d,%.3f,%.3f,%.3f,%.2f,%s\n", r->hwm_mib, r->rss_mib, p->bound_mib,
            r->ok && r->hwm_mib <= p->bound_mib, r->lag_p50_ms, r->lag_p99_ms, r->lag_max_ms, r->load,
            wire_name(p->wire));
    fflush(f);
}

/* ---- MPI_Allreduce --------------------------------------------------------- */

typedef struct mpi_res {
    uint64_t S;
    double mean_ms[2], p50_ms[2]; /* [0] tcp, [1] shared memory; NAN if not measured */
} mpi_res;

static void run_mpi(const opts *o, mpi_res *res, int n)
{
    static const char *const btl[2] = {"tcp,self", "vader,self"};
    for (int i = 0; i < n; i++)
        for (int t = 0; t < 2; t++)
            res[i].mean_ms[t] = res[i].p50_ms[t] = NAN;
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    for (int t = 0; t < 2; t++) {
        char cmd[4096];
        int len = snprintf(cmd, sizeof cmd,
                           "mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl %s "
                           "--mca btl_tcp_if_include lo '%s' --seconds %g",
                           btl[t], o->mpi_prog, o->seconds);
        for (int i = 0; i < n && len < (int)sizeof cmd - 32; i++)
            len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %" PRIu64, res[i].S);
        snprintf(cmd + len, sizeof cmd - (size_t)len, " 2>&1");
        fprintf(stderr, "psbench: MPI_Allreduce over %s\n", t == 0 ? "TCP" : "shared memory");
        FILE *p = popen(cmd, "r");
        if (!p) {
            fprintf(stderr, "psbench: cannot run mpirun: %s\n", strerror(errno));
            return;
        }
        char line[1024];
        while (fgets(line, sizeof line, p)) {
            uint64_t S;
            int iters;
            double mean, p50, p99;
            if (sscanf(line, "allreduce floats=%" SCNu64 " iters=%d mean_ms=%lf p50_ms=%lf p99_ms=%lf", &S, &iters,
                       &mean, &p50, &p99) == 5) {
                for (int i = 0; i < n; i++)
                    if (res[i].S == S) {
                        res[i].mean_ms[t] = mean;
                        res[i].p50_ms[t] = p50;
                    }
            } else if (o->verbose || strstr(line, "rror")) {
                fprintf(stderr, "mpirun: %s", line);
            }
        }
        int st = pclose(p);
        if (st != 0)
            fprintf(stderr, "psbench: mpirun (%s) exited with status %d\n", btl[t], st);
    }
}

/* ---- plot ------------------------------------------------------------------ */

/* Writes psbench.dat (one gnuplot data block per series) and psbench.gp,
 * and runs gnuplot when it is on PATH. */
static void plot(const opts *o, const row *rows, int nrows, const row *tcp, int ntcp)
{
    char dat[PATH_MAX], gp[PATH_MAX], png[PATH_MAX];
    snprintf(dat, sizeof dat, "%s/psbench.dat", o->out);
    snprintf(gp, sizeof gp, "%s/psbench.gp", o->out);
    snprintf(png, sizeof png, "%s/psbench.png", o->out);
    FILE *d = fopen(dat, "w"), *g = fopen(gp, "w");
    if (!d || !g) {
        fprintf(stderr, "psbench: cannot write %s or %s\n", dat, gp);
        if (d)
            fclose(d);
        if (g)
            fclose(g);
        return;
    }
    /* blocks: for each K, the ceiling, then each mode: floats gb_per_s ratio */
    int block = 0;
    int nrow = ntcp > 0 ? 2 : 1;
    fprintf(g, "set terminal pngcairo size %d,%d font 'sans,10'\nset output '%s'\n", 80 + 520 * o->nmodes,
            60 + 440 * nrow, png);
    fprintf(g, "set datafile missing 'NaN'\nset logscale x\nset grid\nset key top right opaque font 'sans,8'\n");
    uint64_t smin = UINT64_MAX, smax = 0;
    for (int i = 0; i < o->nsizes; i++) {
        smin = o->sizes[i] < smin ? o->sizes[i] : smin;
        smax = o->sizes[i] > smax ? o->sizes[i] : smax;
    }
    fprintf(g, "set xlabel 'model size S (values)'\nset format x '10^{%%L}'\nset xrange [%g:%g]\n",
            (double)smin / 2, (double)smax * 2);
    fprintf(g, "set multiplot layout %d,%d title 'psbench: push+pull payload throughput (%s, %zu bytes a value), "
               "psd against plain TCP (same machine, same run)'\n",
            nrow, o->nmodes, wire_name(o->wire), wire_size(o->wire));
    /* plots[mi]: GB/s of mode mi; plots[MODE_COUNT + mi]: its ratio */
    char plots[2 * MODE_COUNT][8192];
    int plen[2 * MODE_COUNT] = {0};
    memset(plots, 0, sizeof plots);
    static const int colors[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0x9467bd, 0xff7f0e, 0x8c564b, 0xe377c2, 0x7f7f7f};
    for (int wi = 0; wi < o->nworkers; wi++) {
        int K = o->workers[wi];
        int color = colors[wi % 8];
        /* the ceiling */
        fprintf(d, "# tcp K=%d\n", K);
        int tpoints = 0;
        for (int i = 0; i < ntcp; i++)
            if (tcp[i].K == K && tcp[i].r.ok) {
                fprintf(d, "%" PRIu64 " %.5f\n", tcp[i].S, tcp[i].r.gbps);
                tpoints++;
            }
        if (!tpoints)
            fprintf(d, "1 NaN\n"); /* keeps gnuplot's block numbering */
        fprintf(d, "\n\n");
        int tblock = block++;
        for (int mi = 0; mi < o->nmodes; mi++) {
            int mode = o->modes[mi];
            fprintf(d, "# %s K=%d\n", mode_names[mode], K);
            fprintf(d, "1 NaN NaN\n");
            for (int i = 0; i < nrows; i++) {
                const row *p = &rows[i];
                if (p->mode != mode || p->K != K || !p->r.ok)
                    continue;
                double ratio = NAN;
                for (int j = 0; j < ntcp; j++)
                    if (tcp[j].S == p->S && tcp[j].K == K && tcp[j].r.ok)
                        ratio = p->r.gbps / tcp[j].r.gbps;
                if (isnan(ratio))
                    fprintf(d, "%" PRIu64 " %.5f NaN\n", p->S, p->r.gbps);
                else
                    fprintf(d, "%" PRIu64 " %.5f %.4f\n", p->S, p->r.gbps, ratio);
            }
            fprintf(d, "\n\n");
            int pb = block++;
            plen[mi] += snprintf(plots[mi] + plen[mi], sizeof plots[mi] - (size_t)plen[mi],
                                 "%s'%s' index %d using 1:2 with linespoints lw 2 pt 7 lc rgb '#%06x' title 'psd K=%d'",
                                 plen[mi] ? ", " : "", dat, pb, color, K);
            if (tpoints)
                plen[mi] += snprintf(plots[mi] + plen[mi], sizeof plots[mi] - (size_t)plen[mi],
                                     ", '%s' index %d using 1:2 with linespoints dt 2 pt 6 lc rgb '#%06x' "
                                     "title 'TCP K=%d'",
                                     dat, tblock, color, K);
            int ri = MODE_COUNT + mi;
            plen[ri] += snprintf(plots[ri] + plen[ri], sizeof plots[ri] - (size_t)plen[ri],
                                 "%s'%s' index %d using 1:(100*$3) with linespoints lw 2 pt 7 lc rgb '#%06x' "
                                 "title 'K=%d'",
                                 plen[ri] ? ", " : "", dat, pb, color, K);
        }
    }
    for (int mi = 0; mi < o->nmodes; mi++) {
        fprintf(g, "set title '%s, %s on the wire'\nset ylabel 'GB/s on the wire (pushed + pulled)'\n"
                   "set yrange [0:*]\nset key top right\n",
                mode_names[o->modes[mi]], wire_name(o->wire));
        fprintf(g, "plot %s\n", plen[mi] ? plots[mi] : "NaN notitle");
    }
    for (int mi = 0; ntcp > 0 && mi < o->nmodes; mi++) {
        fprintf(g, "set title '%s: psd / plain TCP'\nset ylabel 'percent of the ceiling (GB/s)'\n"
                   "set yrange [0:105<*]\nset key bottom right\n",
                mode_names[o->modes[mi]]);
        fprintf(g, "plot %s\n", plen[MODE_COUNT + mi] ? plots[MODE_COUNT + mi] : "NaN notitle");
    }
    fprintf(g, "unset multiplot\n");
    fclose(d);
    fclose(g);
    if (o->no_plot)
        return;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "psbench: gnuplot not found; the plot script is %s\n", gp);
        return;
    }
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
    if (system(cmd) != 0)
        fprintf(stderr, "psbench: gnuplot failed on %s\n", gp);
    else
        printf("plot: %s\n", png);
}

/* ---- the table mode --------------------------------------------------------- */

/* splitmix64: the keys' generator (seeded per worker) */
static uint64_t sm64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Fills out[0..K x nbatch x nkeys) with each worker's batches of nkeys
 * distinct keys: ranks drawn from Zipf(o->zipf) over 0..key_space-1 (rank
 * 0 the most frequent; uniform when zipf is 0), seeded by the worker's
 * shard, each rank then scattered over 64 bits (a hashed feature, as a
 * real job's keys are). */
static void table_batches(const opts *o, int K, int nbatch, uint64_t *out)
{
    uint64_t N = o->key_space, n = o->nkeys;
    double *cdf = NULL;
    if (o->zipf > 0) {
        cdf = malloc(N * sizeof *cdf);
        if (!cdf)
            die("out of memory for a Zipf table of %" PRIu64 " keys", N);
        double sum = 0;
        for (uint64_t r = 0; r < N; r++)
            cdf[r] = (sum += pow((double)(r + 1), -o->zipf));
        for (uint64_t r = 0; r < N; r++)
            cdf[r] /= sum;
    }
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *set = malloc(cap * sizeof *set); /* ranks + 1 in this batch; 0: empty */
    if (!set)
        die("out of memory");
    for (int k = 0; k < K; k++) {
        uint64_t rng = 0x5eed0000u + (uint64_t)k;
        for (int bi = 0; bi < nbatch; bi++) {
            uint64_t *keys = out + ((size_t)k * (size_t)nbatch + (size_t)bi) * n;
            memset(set, 0, cap * sizeof *set);
            for (uint64_t got = 0; got < n;) {
                double u = (double)(sm64(&rng) >> 11) * 0x1p-53;
                uint64_t r;
                if (cdf) {
                    uint64_t lo = 0, hi = N - 1; /* the first rank whose cdf >= u */
                    while (lo < hi) {
                        uint64_t mid = lo + (hi - lo) / 2;
                        if (cdf[mid] < u)
                            lo = mid + 1;
                        else
                            hi = mid;
                    }
                    r = lo;
                } else {
                    r = (uint64_t)(u * (double)N);
                }
                uint64_t x = r, h = sm64(&x); /* the rank's key, scattered */
                size_t s = (size_t)(h & (cap - 1));
                while (set[s] && set[s] != r + 1)
                    s = (s + 1) & (cap - 1);
                if (set[s])
                    continue; /* a key already in this batch: draw again */
                set[s] = r + 1;
                keys[got++] = h;
            }
        }
    }
    free(set);
    free(cdf);
}

typedef struct trow {
    int K;
    cell_result psd, tcp;
    int tcp_run;
} trow;

/* One table cell: K workers pushing nkeys row gradients and pulling nkeys
 * rows per round trip, against psd (ASGD) or the plain-TCP server moving
 * the same bytes. */
static void run_table_cell(const opts *o, int sys, int K, const float *grad, const uint64_t *batches, int nbatch,
                           const void *req, cell_result *out)
{
    bench b = {0};
    char err[700] = "", logpath[PATH_MAX];
    int port = 0;
    memset(out, 0, sizeof *out);
    out->load = load1();
    b.sys = sys;
    b.mode = MODE_ASGD;
    b.K = K;
    b.nparts = 1;
    b.grad = grad;
    b.max_rounds = o->max_rounds;
    b.warmup = o->warmup > nbatch ? o->warmup : nbatch; /* every batch's rows stored before the timing */
    b.verbose = o->verbose;
    b.vbytes = 4;
    b.table = 1;
    b.table_tcp = o->table_tcp;
    b.client_spin = o->client_spin;
    b.dim = o->dim;
    b.nkeys = o->nkeys;
    b.nbatch = nbatch;
    b.batches = batches;
    /* a TPUSHPULL's keys, row gradients and next keys; a ROWS's rows */
    b.req = req;
    b.req_bytes = (size_t)o->nkeys * (16 + 4 * (size_t)o->dim);
    b.ans_bytes = (size_t)o->nkeys * 4 * (size_t)o->dim;
    pid_t pid;
    if (sys == SYS_PSD) {
        snprintf(logpath, sizeof logpath, "%s/logs/psd-table-%u-%u-%d.log", o->out, o->dim, o->nkeys, K);
        pid = psd_start(o, MODE_ASGD, K, 4, logpath, err, sizeof err, &port, NULL);
    } else {
        pid = tcp_server_start(b.req_bytes, b.ans_bytes, K, 0, &port, err, sizeof err);
    }
    if (pid < 0) {
        snprintf(out->err, sizeof out->err, "%s", err);
        return;
    }
    if (o->verbose || getenv("PSBENCH_SHOW_PID"))
        fprintf(stderr, "psbench: %s table K=%d: server pid %d\n", sys == SYS_PSD ? "psd" : "tcp", K, (int)pid);
    snprintf(b.addr[0], sizeof b.addr[0], "127.0.0.1:%d", port);
    run_workers(&b, o, &pid, 1, out);
    if (sys == SYS_PSD) {
        out->hwm_mib = proc_status_mib(pid, "VmHWM");
        out->rss_mib = proc_status_mib(pid, "VmRSS");
        out->table_shm = atomic_load(&b.table_shm);
    }
    child_stop(pid);
}

static void range_of(const double *v, int n, double *lo, double *hi);

/* The median of v's n values but NaN (the mean of the middle two when
 * their count is even), NaN when all are. */
static double median_of(const double *v, int n)
{
    double tmp[64];
    int k = 0;
    for (int i = 0; i < n && k < 64; i++)
        if (!isnan(v[i]))
            tmp[k++] = v[i];
    if (k == 0)
        return NAN;
    qsort(tmp, (size_t)k, sizeof *tmp, cmp_double);
    return k % 2 ? tmp[k / 2] : (tmp[k / 2 - 1] + tmp[k / 2]) / 2;
}

/* --table: rows per second through psd's tables against the plain-TCP
 * ceiling of the same bytes, per worker count, in --table-reps pairs of
 * cells (the ceiling, then psd) so that a machine whose speed drifts
 * meets both sides of each ratio alike; table.csv beside the rest. */
static void run_tables(const opts *o)
{
    int nbatch = 16;
    int kmax = 0;
    for (int wi = 0; wi < o->nworkers; wi++)
        kmax = o->workers[wi] > kmax ? o->workers[wi] : kmax;
    size_t nk = o->nkeys, nv = (size_t)o->nkeys * o->dim;
    uint64_t *batches = malloc((size_t)kmax * (size_t)nbatch * nk * sizeof *batches);
    float *grad = malloc(nv * sizeof *grad);
    char *req = malloc(nk * (16 + 4 * (size_t)o->dim));
    if (!batches || !grad || !req)
        die("out of memory");
    for (size_t i = 0; i < nv; i++) /* small, finite, not all equal */
        grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);
    memset(req, 7, nk * (16 + 4 * (size_t)o->dim));
    table_batches(o, kmax, nbatch, batches);
    char dist[64];
    if (o->zipf > 0)
        snprintf(dist, sizeof dist, "Zipf %.2f", o->zipf);
    else
        snprintf(dist, sizeof dist, "uniform");
    size_t req_b = nk * (16 + 4 * (size_t)o->dim), ans_b = nk * 4 * (size_t)o->dim;
    printf("psbench --table: psd %s, %ld CPUs, %.1f s per cell; table of dim %u (AdaGrad, asgd), %u distinct keys\n"
           "a request (%s over %" PRIu64 " keys, %d batches per worker in turn, every batch's rows stored\n"
           "before the timing). A round trip: psc_table_pushpull: push %u row gradients, pull the next\n"
           "batch's %u rows, %s. rows/s: rows pushed + pulled per second, all workers together; the plain-TCP\n"
           "ceiling sends the same request (%zu bytes: keys, gradients, next keys) and reads the same\n"
           "answer (%zu bytes: rows) per round trip, one thread and epoll as psd; per psd core: rows/s\n"
           "divided by psd's CPU seconds per second (/proc); clients: the workers' CPU seconds per second.\n",
           o->psd, sysconf(_SC_NPROCESSORS_ONLN), o->seconds, o->dim, o->nkeys, dist, o->key_space, nbatch, o->nkeys,
           o->nkeys,
           o->table_tcp ? "in frames over loopback TCP (--table-tcp)"
                        : "through each worker's table segment (shared memory; PROTOCOL.md 13.9)",
           req_b, ans_b);
    for (int i = 0; i < o->npsd_set; i++)
        printf("%s%s%s", i ? ", " : "psd settings (--psd-set): ", o->psd_set[i], i + 1 == o->npsd_set ? "\n" : "");
    if (server_cpu >= 0)
        printf("psd and the plain-TCP server on CPU %d, the workers on the other CPUs (--server-cpu)\n", server_cpu);
    if (o->client_spin)
        printf("every worker polls up to %d us for each reply before it sleeps (--client-spin)\n", o->client_spin);
    printf("\n%5s | %10s %8s %8s %8s %5s %7s | %10s %8s %8s %8s | %6s | %14s | %6s %4s\n", "K  #", "rows/s", "MB/s",
           "p50 ms", "p99 ms", "cpu", "clients", "rows/s", "MB/s", "p50 ms", "p99 ms", "psd/", "rows/s", "peak",
           "load");
    printf("%5s | %-54s | %-38s | %6s | %14s | %6s %4s\n", "",
           o->table_tcp ? "psd (tables, float32, TCP)" : "psd (tables, float32, table segment)",
           "plain TCP (ceiling)", "TCP", "per psd core", "MiB", "");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/table.csv", o->out);
    FILE *csv = fopen(path, "w");
    if (!csv)
        die("cannot write %s: %s", path, strerror(errno));
    fprintf(csv, "workers,dim,keys,key_space,zipf,ok,round_trips,seconds,rows_per_s,mb_per_s,p50_ms,p99_ms,psd_cpu,"
                 "rows_per_s_per_psd_core,tcp_rows_per_s,tcp_mb_per_s,tcp_p50_ms,tcp_p99_ms,ratio,psd_peak_rss_mib,"
                 "load1,client_cpu,table_segment_workers,rep\n");
    int failed = 0;
    for (int wi = 0; wi < o->nworkers; wi++) {
        int K = o->workers[wi], R = o->table_reps;
        double prs[64], trs[64], ratios[64], cores[64];
        for (int rep = 0; rep < R; rep++) {
            cell_result t = {0}, p;
            int tok = 0;
            if (!o->no_tcp) {
                run_table_cell(o, SYS_TCP, K, grad, batches, nbatch, req, &t);
                tok = t.ok;
            }
            run_table_cell(o, SYS_PSD, K, grad, batches, nbatch, req, &p);
            double rows_rt = 2.0 * o->nkeys; /* pushed + pulled */
            double pr = p.rt_per_s * rows_rt, tr = t.rt_per_s * rows_rt;
            double per_core = p.server_cpu > 0 ? pr / p.server_cpu : NAN;
            prs[rep] = p.ok ? pr : NAN;
            trs[rep] = tok ? tr : NAN;
            ratios[rep] = p.ok && tok ? pr / tr : NAN;
            cores[rep] = p.ok ? per_core : NAN;
            printf("%2d %2d | ", K, rep + 1);
            if (p.ok)
                printf("%10.0f %8.1f %8.3f %8.3f %5.2f %7.2f | ", pr, p.gbps * 1e3, p.p50_ms, p.p99_ms, p.server_cpu,
                       p.client_cpu);
            else
                printf("%-54s | ", "failed");
            if (tok)
                printf("%10.0f %8.1f %8.3f %8.3f | ", tr, t.gbps * 1e3, t.p50_ms, t.p99_ms);
            else
                printf("%-38s | ", o->no_tcp ? "-" : "failed");
            if (p.ok && tok)
                printf("%5.2fx | ", pr / tr);
            else
                printf("%6s | ", "-");
            printf("%14.0f | %6.0f %4.2f\n", p.ok ? per_core : NAN, p.hwm_mib, p.load);
            if (p.ok && !o->table_tcp && p.table_shm != K)
                printf("    psd: %d of %d workers had no table segment (their requests went in frames; psd's log "
                       "says why)\n", K - p.table_shm, K);
            if (!p.ok)
                printf("    psd: %s\n", p.err), failed = 1;
            if (!o->no_tcp && !tok)
                printf("    tcp: %s\n", t.err), failed = 1;
            fprintf(csv, "%d,%u,%u,%" PRIu64 ",%.3f,%d,%" PRIu64 ",%.4f,%.1f,%.3f,%.4f,%.4f,%.3f,%.1f,", K, o->dim,
                    o->nkeys, o->key_space, o->zipf, p.ok, p.rts, p.secs, p.ok ? pr : NAN, p.gbps * 1e3, p.p50_ms,
                    p.p99_ms, p.server_cpu, p.ok ? per_core : NAN);
            if (tok)
                fprintf(csv, "%.1f,%.3f,%.4f,%.4f,%.4f,", tr, t.gbps * 1e3, t.p50_ms, t.p99_ms, p.ok ? pr / tr : NAN);
            else
                fprintf(csv, ",,,,,");
            fprintf(csv, "%.1f,%.2f,%.3f,%d,%d\n", p.hwm_mib, p.load, p.client_cpu, p.table_shm, rep + 1);
            fflush(stdout);
        }
        if (R > 1) {
            /* each figure's median over the pairs, and its range */
            const double *col[4] = {prs, trs, ratios, cores};
            double med[4], lo[4], hi[4];
            for (int c = 0; c < 4; c++) {
                med[c] = median_of(col[c], R);
                range_of(col[c], R, &lo[c], &hi[c]);
            }
            printf("%2d  ~ | median of %d pairs (min..max): psd %.1f M rows/s (%.1f..%.1f), ceiling %.1f M (%.1f..%.1f), "
                   "psd/TCP %.2fx (%.2f..%.2f), per psd core %.1f M (%.1f..%.1f)\n",
                   K, R, med[0] / 1e6, lo[0] / 1e6, hi[0] / 1e6, med[1] / 1e6, lo[1] / 1e6, hi[1] / 1e6, med[2], lo[2],
                   hi[2], med[3] / 1e6, lo[3] / 1e6, hi[3] / 1e6);
            fflush(stdout);
        }
    }
    fclose(csv);
    printf("CSV: %s/table.csv, psd logs: %s/logs/\n", o->out, o->out);
    free(batches);
    free(grad);
    free(req);
    if (failed)
        exit(1);
}

/* ---- the checkpoint stall (--ckpt-stall) ------------------------------------ */

/* --ckpt-stall G: pull latency while psd writes a checkpoint of a table of
 * G GB, against the same pulls without one, in one run of one psd:
 *
 *  1. psd starts with a state dir (OUT/ckpt-state, emptied of earlier
 *     checkpoints first), checkpoint_interval = 0 (no timed checkpoint: the
 *     one asked for is the only one), an hour's heartbeat_timeout and
 *     max_table_memory of at least twice the table;
 *  2. K workers (libpsclient, one client and thread each, shard k of K)
 *     declare table "emb" (dim values a row, uniform init, AdaGrad) and
 *     fill it with pushes of fresh keys, worker k pushing ranks
 *     [k N/K, (k+1) N/K) in messages of as many keys as one message holds
 *     (at most 65,536 keys and 2^22 values), each rank scattered over 64
 *     bits (splitmix64, a bijection) as a hashed feature is; N rows of
 *     key + row + AdaGrad accumulator make G x 10^9 bytes;
 *  3. the workers pull --keys random stored keys a request (psc_table_pull),
 *     back to back, for --seconds: no checkpoint;
 *  4. psctl (next to psd) sends ADMIN checkpoint, which psd answers once the
 *     file is written; the workers go on pulling until psctl exits. A
 *     request counts in the checkpoint's phase when it overlaps the time
 *     from psctl's start to its exit (so one slowed by the fork, sent just
 *     before psd saw the request, counts there), in the quiet phase when
 *     it ended before psctl started;
 *  5. with --ckpt-push, the same two phases again with push-and-pulls
 *     (psc_table_pushpull: the last request's keys' gradients pushed, fresh
 *     random keys' rows pulled), which make psd copy the pages it writes
 *     while the writer holds them.
 * psd's VmRSS and VmHWM are read before each checkpoint, and every 0.25 s
 * while it is written VmRSS and the Pss of psd and its writer process
 * together (/proc/PID/smaps_rollup: memory the two hold between them,
 * shared pages counted once). Then psd is killed (SIGKILL: a throwaway psd
 * with nothing more to save) and the checkpoint files are left in the
 * state dir. It fails, exit 1 with the reason, when a phase has no
 * request, psctl fails, or the checkpoint file is missing. */

enum { CK_PULL, CK_PUSHPULL };

typedef struct ckpt_run {
    bench b;                      /* first: a worker's b is this */
    const opts *o;
    uint64_t nrows;               /* rows the table is filled with */
    uint32_t fill_keys;           /* keys a fill push carries */
    const float *fill_grad;       /* fill_keys x dim gradients */
    const float *grad;            /* nkeys x dim gradients (push-and-pull) */
    double origin;                /* now_s() at the start */
    _Atomic uint64_t filled;      /* rows pushed so far */
    atomic_int fill_done;         /* workers done filling (or failed) */
    atomic_int op;                /* CK_*: what the workers do now */
    atomic_int loops_done;        /* workers out of their timed loop */
    pthread_barrier_t close_gate; /* main has killed psd: close the clients */
} ckpt_run;

/* The key of rank r: splitmix64's mix of r, a bijection of 64 bits, so
 * distinct ranks are distinct keys spread over the whole key space. */
static uint64_t ckpt_key(uint64_t r)
{
    return sm64(&r);
}

static int ck_sample(bworker *w, double t0, double t1, int op)
{
    if (w->ncs == w->cs_cap) {
        size_t cap = w->cs_cap ? 2 * w->cs_cap : 4096;
        csample *p = realloc(w->cs, cap * sizeof *p);
        if (!p)
            return -1;
        w->cs = p;
        w->cs_cap = cap;
    }
    w->cs[w->ncs++] = (csample){t0, t1, op};
    return 0;
}

static void *ckpt_worker(void *arg)
{
    bworker *w = arg;
    ckpt_run *c = (ckpt_run *)w->b;
    bench *b = &c->b;
    uint32_t n = b->nkeys, fk = c->fill_keys;
    uint64_t *keys = malloc((size_t)(fk > n ? fk : n) * sizeof *keys);
    uint64_t *next = malloc((size_t)n * sizeof *next);
    uint64_t rng = 0xc4e7u + (uint64_t)w->k;
    int rc = keys && next ? table_open(w) : wfailf(w, PSC_ENOMEM, "out of memory");
    /* the fill: this worker's ranks, fresh keys, as large pushes */
    uint64_t lo = c->nrows * (uint64_t)w->k / (uint64_t)b->K, hi = c->nrows * (uint64_t)(w->k + 1) / (uint64_t)b->K;
    for (uint64_t r = lo; rc == 0 && r < hi && !atomic_load(&b->failed);) {
        uint32_t m = hi - r < fk ? (uint32_t)(hi - r) : fk;
        for (uint32_t i = 0; i < m; i++)
            keys[i] = ckpt_key(r + i);
        if ((rc = psc_table_push(w->pc, "emb", keys, m, c->fill_grad)) != 0)
            rc = wfail(w, rc, "filling the table");
        r += m;
        atomic_fetch_add(&c->filled, m);
    }
    for (uint32_t i = 0; i < n; i++)
        keys[i] = ckpt_key(sm64(&rng) % c->nrows);
    for (int i = 0; rc == 0 && i < (b->warmup > 0 ? b->warmup : 1); i++)
        if ((rc = psc_table_pull(w->pc, "emb", keys, n, w->rows)) != 0)
            rc = wfail(w, rc, "table pull");
    atomic_fetch_add(&c->fill_done, 1);
    pthread_barrier_wait(&b->gate);
    while (rc == 0 && !atomic_load(&b->stop) && !atomic_load(&b->failed)) {
        int op = atomic_load(&c->op);
        for (uint32_t i = 0; i < n; i++)
            next[i] = ckpt_key(sm64(&rng) % c->nrows);
        double t0 = now_s();
        if (op == CK_PULL)
            rc = psc_table_pull(w->pc, "emb", next, n, w->rows);
        else
            rc = psc_table_pushpull(w->pc, "emb", keys, n, c->grad, next, n, w->rows);
        double t1 = now_s();
        if (rc != 0) {
            rc = wfail(w, rc, op == CK_PULL ? "table pull" : "table pushpull");
            break;
        }
        memcpy(keys, next, (size_t)n * sizeof *keys);
        if (ck_sample(w, t0 - c->origin, t1 - c->origin, op) != 0)
            rc = wfailf(w, PSC_ENOMEM, "out of memory for the latency record");
    }
    atomic_fetch_add(&c->loops_done, 1);
    pthread_barrier_wait(&c->close_gate);
    if (w->pc)
        psc_close(w->pc);
    free(keys);
    free(next);
    return NULL;
}

/* A "Key:  N kB" line of /proc/PID/FILE, in MiB; -1 if unknown. */
static double proc_kb_mib(pid_t pid, const char *file, const char *key)
{
    char path[80], line[256];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "r");
    double v = -1;
    size_t kl = strlen(key);
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtod(line + kl + 1, NULL) / 1024.0;
            break;
        }
    fclose(f);
    return v;
}

/* The Pss of psd and its child processes (the checkpoint's writer)
 * together, MiB: the memory they hold between them, a page they share
 * counted once; sets *children to how many children were counted. */
static double psd_family_pss(pid_t pid, int *children)
{
    double sum = proc_kb_mib(pid, "smaps_rollup", "Pss");
    char path[80], buf[512];
    *children = 0;
    if (sum < 0)
        return -1;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return sum;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (char *p = buf, *e; *p; p = e) {
        long child = strtol(p, &e, 10);
        if (e == p)
            break;
        double c = proc_kb_mib((pid_t)child, "smaps_rollup", "Pss");
        if (c >= 0) {
            sum += c;
            (*children)++;
        }
    }
    return sum;
}

/* Total bytes of the checkpoint files in dir (ckpt-V.psdc); *count is set
 * to how many there are; newest (if not NULL) gets the name of the one of
 * the highest version. */
static uint64_t ckpt_files(const char *dir, int *count, char *newest, size_t nlen)
{
    char cmdpath[PATH_MAX + 32];
    uint64_t total = 0;
    *count = 0;
    if (newest)
        newest[0] = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (!(strncmp(e->d_name, "ckpt-", 5) == 0 && l > 5 && strcmp(e->d_name + l - 5, ".psdc") == 0))
            continue;
        struct stat st;
        snprintf(cmdpath, sizeof cmdpath, "%s/%s", dir, e->d_name);
        if (stat(cmdpath, &st) != 0)
            continue;
        total += (uint64_t)st.st_size;
        (*count)++;
        if (newest && strcmp(e->d_name, newest) > 0 && strlen(e->d_name) < nlen)
            snprintf(newest, nlen, "%s", e->d_name); /* ckpt-%020V: names sort as versions */
    }
    closedir(d);
    return total;
}

/* One phase's figures */
typedef struct ck_phase {
    const char *name, *csv; /* printed; the CSV's phase: without, during, after */
    int op;
    int ckpt;               /* a checkpoint was written meanwhile */
    double w0, w1;          /* its window (seconds since the origin) */
    size_t n;
    double per_s, p50_ms, p99_ms, max_ms, mean_ms;
    /* with ckpt: */
    double ckpt_s;          /* psctl's start to its exit */
    double psd_s, fork_ms;  /* psd's log: the writer's time and the fork's */
    uint64_t file_bytes;
    char file[96];
    double rss_before, hwm_before, pss_before; /* MiB */
    double rss_max, hwm_after, pss_max;        /* MiB, while it was written */
    int pss_samples;        /* samples that saw the writer */
    double load;
} ck_phase;

/* Latency of the samples of op in the phase: quiet, those that ended
 * before w1 and started at w0 or later; ckpt, those that overlap
 * [w0, w1]. */
static void ck_figures(bench *b, ck_phase *ph)
{
    size_t cap = 0;
    for (int k = 0; k < b->K; k++)
        cap += b->w[k].ncs;
    double *lat = malloc((cap ? cap : 1) * sizeof *lat), sum = 0;
    if (!lat)
        die("out of memory");
    size_t n = 0;
    for (int k = 0; k < b->K; k++)
        for (size_t i = 0; i < b->w[k].ncs; i++) {
            const csample *s = &b->w[k].cs[i];
            int in = s->op == ph->op &&
                     (ph->ckpt ? s->t1 >= ph->w0 && s->t0 <= ph->w1 : s->t0 >= ph->w0 && s->t1 < ph->w1);
            if (in) {
                lat[n++] = s->t1 - s->t0;
                sum += s->t1 - s->t0;
            }
        }
    qsort(lat, n, sizeof *lat, cmp_double);
    ph->n = n;
    ph->per_s = ph->w1 > ph->w0 ? (double)n / (ph->w1 - ph->w0) : NAN;
    ph->p50_ms = 1e3 * pct(lat, n, 0.50);
    ph->p99_ms = 1e3 * pct(lat, n, 0.99);
    ph->max_ms = n ? 1e3 * lat[n - 1] : NAN;
    ph->mean_ms = n ? 1e3 * sum / (double)n : NAN;
    free(lat);
}

/* Reads psd's log for the last "checkpoint of version V written to PATH in
 * S s (fork F ms)" line: the writer's time and the fork's; NAN if none. */
static void ck_log_times(const char *logpath, double *secs, double *fork_ms)
{
    *secs = *fork_ms = NAN;
    FILE *f = fopen(logpath, "r");
    char line[1024];
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "checkpoint of version ");
        const char *in = p ? strstr(p, " written to ") : NULL;
        in = in ? strstr(in, " in ") : NULL;
        double s, fm;
        if (in && sscanf(in, " in %lf s (fork %lf ms)", &s, &fm) == 2)
            *secs = s, *fork_ms = fm;
    }
    fclose(f);
}

/* Runs psctl checkpoint against psd while the workers go on, sampling psd's
 * memory; fills ph's window and checkpoint figures. 0, or -1 with err. */
static int ck_checkpoint(ckpt_run *c, pid_t psd, const char *state, const char *logpath, int nth, ck_phase *ph,
                         char *err, size_t errlen)
{
    const opts *o = c->o;
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s/logs/psctl-checkpoint-%d.log", o->out, nth);
    /* the newest file before, by inode: in asgd a table push changes no
     * model version, so the next checkpoint may have the same name */
    char newest_before[96];
    struct stat sb;
    char path[PATH_MAX + 100];
    int before;
    ino_t ino_before = 0;
    ckpt_files(state, &before, newest_before, sizeof newest_before);
    snprintf(path, sizeof path, "%s/%s", state, newest_before);
    if (before > 0 && stat(path, &sb) == 0)
        ino_before = sb.st_ino;
    ph->rss_before = proc_status_mib(psd, "VmRSS");
    ph->hwm_before = proc_status_mib(psd, "VmHWM");
    int nch;
    ph->pss_before = psd_family_pss(psd, &nch);
    ph->rss_max = ph->rss_before;
    ph->pss_max = NAN;
    ph->pss_samples = 0;
    ph->load = load1();
    const char *argv[] = {o->psctl, "--server", c->b.addr[0], "--timeout", "3600000", "checkpoint", NULL};
    double t0 = now_s();
    pid_t pid = spawn_logged(argv, out, 0, err, errlen);
    if (pid < 0)
        return -1;
    int st = 0;
    double next_sample = t0;
    for (;;) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        double t = now_s();
        if (t >= next_sample) {
            double r = proc_status_mib(psd, "VmRSS");
            double p = psd_family_pss(psd, &nch);
            if (r > ph->rss_max)
                ph->rss_max = r;
            if (nch > 0 && p >= 0) {
                if (isnan(ph->pss_max) || p > ph->pss_max)
                    ph->pss_max = p;
                ph->pss_samples++;
            }
            next_sample = t + 0.25;
        }
        if (atomic_load(&c->b.failed) || t - t0 > 7200) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(err, errlen, "%s", atomic_load(&c->b.failed) ? "a worker failed during the checkpoint"
                                                                 : "the checkpoint took over 2 hours: stopped");
            return -1;
        }
        sleep_s(0.002);
    }
    double t1 = now_s();
    ph->w0 = t0 - c->origin;
    ph->w1 = t1 - c->origin;
    ph->ckpt_s = t1 - t0;
    ph->hwm_after = proc_status_mib(psd, "VmHWM");
    char text[600] = "";
    FILE *f = fopen(out, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
        for (char *p = text + strlen(text); p > text && (p[-1] == '\n' || p[-1] == ' '); p--)
            p[-1] = 0;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(err, errlen, "psctl checkpoint failed (status %d): %.400s", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                 text[0] ? text : "(no output)");
        return -1;
    }
    int after;
    ckpt_files(state, &after, ph->file, sizeof ph->file);
    snprintf(path, sizeof path, "%s/%s", state, ph->file);
    if (after == 0 || stat(path, &sb) != 0 || sb.st_size <= 0 ||
        (strcmp(ph->file, newest_before) == 0 && sb.st_ino == ino_before)) {
        snprintf(err, errlen, "psctl said '%.300s' but no new checkpoint file is in %.200s", text, state);
        return -1;
    }
    ph->file_bytes = (uint64_t)sb.st_size;
    ck_log_times(logpath, &ph->psd_s, &ph->fork_ms);
    return 0;
}

static void ck_print(const ck_phase *ph)
{
    printf("%-28s | %8zu %8.0f %8.2f %8.2f %8.2f |", ph->name, ph->n, ph->per_s, ph->p50_ms, ph->p99_ms, ph->max_ms);
    if (ph->ckpt)
        printf(" %7.1f %7.1f %7.3f %7.1f | %7.0f %7.0f %7.0f %7.0f\n", ph->ckpt_s, ph->psd_s, ph->file_bytes / 1e9,
               ph->fork_ms, ph->rss_before, ph->rss_max, ph->pss_before, ph->pss_max);
    else
        printf(" %7s %7s %7s %7s | %7s %7s %7s %7s\n", "", "", "", "", "", "", "", "");
}

static void ck_csv(FILE *f, const ckpt_run *c, const ck_phase *ph)
{
    const opts *o = c->o;
    fprintf(f, "%s,%s,%d,%d,%u,%u,%" PRIu64 ",%.4f,%zu,%.4f,%.2f,%.4f,%.4f,%.4f,%.4f,", ph->csv,
            ph->op == CK_PULL ? "pull" : "pushpull", ph->ckpt, c->b.K, o->nkeys, o->dim, c->nrows, o->ckpt_gb, ph->n,
            ph->w1 - ph->w0, ph->per_s, ph->p50_ms, ph->p99_ms, ph->max_ms, ph->mean_ms);
    if (ph->ckpt)
        fprintf(f, "%.3f,%.3f,%.2f,%" PRIu64 ",%s,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.2f\n", ph->ckpt_s, ph->psd_s,
                ph->fork_ms, ph->file_bytes, ph->file, ph->rss_before, ph->rss_max, ph->hwm_before, ph->hwm_after,
                ph->pss_before, ph->pss_max, ph->load);
    else
        fprintf(f, ",,,,,,,,,,,%.2f\n", ph->load);
}

/* Removes DIR's checkpoint files (ckpt-*.psdc, *.tmp): the state dir is
 * psbench's own, and psd would start from an old checkpoint. */
static void ck_clear_state(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[PATH_MAX + 300];
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if ((strncmp(e->d_name, "ckpt-", 5) == 0 && l > 5 && strcmp(e->d_name + l - 5, ".psdc") == 0) ||
            (l > 4 && strcmp(e->d_name + l - 4, ".tmp") == 0)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

static int ck_wait_s(ckpt_run *c, double s)
{
    double end = now_s() + s;
    while (now_s() < end) {
        if (atomic_load(&c->b.failed))
            return -1;
        sleep_s(0.01);
    }
    return 0;
}

static void run_ckpt_stall(const opts *o)
{
    ckpt_run c = {0};
    bench *b = &c.b;
    const int K = o->workers[0];
    const uint32_t dim = o->dim, n = o->nkeys;
    const double row_bytes = 8.0 + 2.0 * 4.0 * dim; /* key, row, AdaGrad accumulator */
    c.o = o;
    c.nrows = (uint64_t)ceil(o->ckpt_gb * 1e9 / row_bytes);
    if (c.nrows < 2 * (uint64_t)n)
        die("--ckpt-stall %g: %" PRIu64 " rows of dim %u, fewer than twice --keys (%u): a bigger table or fewer keys",
            o->ckpt_gb, c.nrows, dim, n);
    c.fill_keys = (uint32_t)((1u << 22) / dim < 65536 ? (1u << 22) / dim : 65536);
    float *fill_grad = malloc((size_t)c.fill_keys * dim * sizeof *fill_grad);
    float *grad = malloc((size_t)n * dim * sizeof *grad);
    if (!fill_grad || !grad)
        die("out of memory");
    for (size_t i = 0; i < (size_t)c.fill_keys * dim; i++) /* small, finite, not all equal */
        fill_grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);
    memcpy(grad, fill_grad, (size_t)n * dim * sizeof *grad);
    c.fill_grad = fill_grad;
    c.grad = grad;

    char state[PATH_MAX - 300], logpath[PATH_MAX], tabmem[64], err[700] = "";
    snprintf(state, sizeof state, "%s/ckpt-state", o->out);
    if (mkdir_p(state) != 0)
        die("cannot create %s: %s", state, strerror(errno));
    ck_clear_state(state);
    snprintf(logpath, sizeof logpath, "%s/logs/psd-ckpt-stall.log", o->out);
    /* room for the rows, their state and hash slots: twice the table, at least psd's default */
    double want_gb = 2.0 * o->ckpt_gb < 4.0 ? 4.0 : ceil(2.0 * o->ckpt_gb);
    snprintf(tabmem, sizeof tabmem, "max_table_memory=%.0fG", want_gb);
    const char *extra[] = {"--state-dir", state, "--log-level", "info", "--set", "checkpoint_interval=0",
                           "--set", tabmem, NULL};
    double load_start = load1();
    printf("psbench --ckpt-stall %g: psd %s, %ld CPUs, load %.2f (1-min average) at the start\n", o->ckpt_gb, o->psd,
           sysconf(_SC_NPROCESSORS_ONLN), load_start);
    printf("psd: asgd, state dir %s, checkpoint_interval=0 (no timed checkpoint), heartbeat_timeout=1h, %s", state,
           tabmem);
    for (int i = 0; i < o->npsd_set; i++)
        printf(", %s", o->psd_set[i]);
    printf("\n");
    fflush(stdout);
    int port = 0;
    pid_t psd = psd_start(o, MODE_ASGD, K, 4, logpath, err, sizeof err, &port, extra);
    if (psd < 0)
        die("%s", err);
    if (o->verbose || getenv("PSBENCH_SHOW_PID"))
        fprintf(stderr, "psbench: psd ckpt-stall: server pid %d\n", (int)psd);
    b->sys = SYS_PSD;
    b->mode = MODE_ASGD;
    b->K = K;
    b->nparts = 1;
    b->table = 1;
    b->dim = dim;
    b->nkeys = n;
    b->verbose = o->verbose;
    b->warmup = o->warmup;
    snprintf(b->addr[0], sizeof b->addr[0], "127.0.0.1:%d", port);
    b->w = calloc((size_t)K, sizeof *b->w);
    if (!b->w)
        die("out of memory");
    pthread_barrier_init(&b->gate, NULL, (unsigned)K + 1);
    pthread_barrier_init(&c.close_gate, NULL, (unsigned)K + 1);
    atomic_store(&c.op, CK_PULL);
    c.origin = now_s();
    for (int k = 0; k < K; k++) {
        b->w[k].b = b;
        b->w[k].k = k;
        b->w[k].fd = -1;
        if (pthread_create(&b->w[k].th, NULL, ckpt_worker, &b->w[k]) != 0)
            die("cannot start worker threads");
    }
    /* the fill, with its progress every 10 s */
    double tf0 = now_s(), shown = tf0;
    while (atomic_load(&c.fill_done) < K) {
        sleep_s(0.02);
        if (now_s() - shown >= 10) {
            shown = now_s();
            fprintf(stderr, "psbench: filling: %" PRIu64 " of %" PRIu64 " rows, %.0f s\n", atomic_load(&c.filled),
                    c.nrows, shown - tf0);
        }
    }
    double fill_s = now_s() - tf0;
    pthread_barrier_wait(&b->gate);
    int failed = atomic_load(&b->failed);
    double rss_fill = proc_status_mib(psd, "VmRSS");
    printf("table emb: dim %u, uniform init, AdaGrad; %" PRIu64 " rows of %.0f bytes (8-byte key, %u + %u float32 "
           "of row and AdaGrad state) = %.2f GB,\n"
           "filled by %d workers with pushes of %u fresh keys (psc_table_push) in %.1f s (%.0f rows/s); psd RSS %.0f "
           "MiB\n",
           dim, c.nrows, row_bytes, dim, dim, (double)c.nrows * row_bytes / 1e9, K, c.fill_keys, fill_s,
           (double)c.nrows / fill_s, rss_fill);
    printf("then %d workers, back to back, each request %u random stored keys: pulls (psc_table_pull)%s; "
           "%.1f s without a checkpoint,\nthen while psctl checkpoint runs (psd forks; its writer writes the file)\n",
           K, n, o->ckpt_push ? ", then push-and-pulls (psc_table_pushpull)" : "", o->seconds);
    fflush(stdout);

    /* the phases, in order: the quiet ones first, so that no checkpoint
     * came before them; "after": push-and-pulls once the writer has gone */
    static const struct {
        const char *name, *csv; /* printed; the CSV's phase column */
        int op, ckpt;
    } plan[] = {
        {"pull, no checkpoint", "without", CK_PULL, 0},
        {"pushpull, no checkpoint", "without", CK_PUSHPULL, 0},
        {"pull, during checkpoint", "during", CK_PULL, 1},
        {"pushpull, during checkpoint", "during", CK_PUSHPULL, 1},
        {"pushpull, after checkpoint", "after", CK_PUSHPULL, 0},
    };
    ck_phase ph[5];
    int nph = 0, nckpt = 0;
    memset(ph, 0, sizeof ph);
    for (int i = 0; !failed && i < 5; i++) {
        if (plan[i].op == CK_PUSHPULL && !o->ckpt_push)
            continue;
        ck_phase *q = &ph[nph];
        q->name = plan[i].name;
        q->csv = plan[i].csv;
        q->op = plan[i].op;
        q->ckpt = plan[i].ckpt;
        atomic_store(&c.op, q->op);
        if (q->ckpt) {
            if (nckpt == 0) {
                int early;
                ckpt_files(state, &early, NULL, 0);
                if (early > 0) {
                    snprintf(err, sizeof err, "a checkpoint in %.400s before the one measured", state);
                    failed = 1;
                    break;
                }
            }
            if (ck_checkpoint(&c, psd, state, logpath, ++nckpt, q, err, sizeof err) != 0) {
                failed = 1;
                break;
            }
        } else {
            q->load = load1();
            q->w0 = now_s() - c.origin;
            if (ck_wait_s(&c, o->seconds) != 0) {
                failed = 1;
                break;
            }
            q->w1 = now_s() - c.origin;
        }
        nph++;
    }
    atomic_store(&b->stop, 1);
    while (atomic_load(&c.loops_done) < K)
        sleep_s(0.005);
    /* a throwaway psd: no last checkpoint when the workers leave */
    kill(psd, SIGKILL);
    waitpid(psd, NULL, 0);
    pthread_barrier_wait(&c.close_gate);
    for (int k = 0; k < K; k++)
        pthread_join(b->w[k].th, NULL);
    for (int k = 0; k < K; k++)
        if (b->w[k].rc != 0 && !err[0])
            snprintf(err, sizeof err, "%s", b->w[k].err);
    for (int i = 0; i < nph; i++) {
        ck_figures(b, &ph[i]);
        if (ph[i].n == 0 && !err[0])
            snprintf(err, sizeof err, "no %s finished in phase '%s' (%.3f s): nothing measured%s",
                     ph[i].op == CK_PULL ? "pull" : "push-and-pull", ph[i].name, ph[i].w1 - ph[i].w0,
                     ph[i].ckpt ? "; a bigger table (--ckpt-stall G) takes longer to write" : "");
    }
    if (nph > 0) {
        printf("\n%-28s | %8s %8s %8s %8s %8s | %7s %7s %7s %7s | %7s %7s %7s %7s\n", "phase", "requests",
               "req/s", "p50 ms", "p99 ms", "max ms", "ckpt s", "psd s", "file GB", "fork ms", "RSS", "RSS",
               "Pss", "Pss");
        printf("%-28s | %44s | %31s | %7s %7s %7s %7s\n", "", "", "", "before", "max", "before", "max");
        for (int i = 0; i < nph; i++)
            ck_print(&ph[i]);
        printf("(ckpt s: psctl checkpoint's start to its answer; psd s: the writer's time in psd's log; RSS: psd's\n"
               "VmRSS, MiB; Pss: psd and its writer together, MiB, sampled every 0.25 s while it wrote)\n");
        for (int i = 0; i < nph; i++) {
            const ck_phase *q = NULL; /* the quiet phase of the same requests */
            for (int j = 0; j < nph; j++)
                if (ph[j].op == ph[i].op && !ph[j].ckpt && !q)
                    q = &ph[j];
            if (!q || q == &ph[i])
                continue;
            printf("%s: p99 %.2f ms %s against %.2f ms without (%.2fx), p50 %.2fx, max %.0f ms, %.0f%% of the "
                   "requests per second",
                   ph[i].op == CK_PULL ? "pulls" : "push-and-pulls", ph[i].p99_ms,
                   ph[i].ckpt ? "during the checkpoint" : "after it", q->p99_ms, ph[i].p99_ms / q->p99_ms,
                   ph[i].p50_ms / q->p50_ms, ph[i].max_ms, 100 * ph[i].per_s / q->per_s);
            if (ph[i].ckpt)
                printf("; psd's VmHWM %.0f -> %.0f MiB", ph[i].hwm_before, ph[i].hwm_after);
            printf("\n");
        }
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/ckpt_stall.csv", o->out);
    FILE *csv = fopen(path, "w");
    if (!csv)
        die("cannot write %s: %s", path, strerror(errno));
    fprintf(csv, "phase,op,checkpoint,workers,keys,dim,rows,table_gb,requests,seconds,requests_per_s,p50_ms,p99_ms,"
                 "max_ms,mean_ms,ckpt_s,psd_ckpt_s,fork_ms,file_bytes,file,psd_rss_before_mib,psd_rss_max_mib,"
                 "psd_hwm_before_mib,psd_hwm_after_mib,pss_before_mib,pss_max_mib,load1\n");
    for (int i = 0; i < nph; i++)
        ck_csv(csv, &c, &ph[i]);
    fclose(csv);
    printf("load %.2f at the end; CSV: %s, psd's log: %s, checkpoints in %s\n", load1(), path, logpath, state);
    for (int k = 0; k < K; k++) {
        psc_free(b->w[k].pc);
        free(b->w[k].rows);
        free(b->w[k].cs);
    }
    free(b->w);
    pthread_barrier_destroy(&b->gate);
    pthread_barrier_destroy(&c.close_gate);
    free(fill_grad);
    free(grad);
    if (failed || err[0]) {
        fprintf(stderr, "psbench: --ckpt-stall: %s\n", err[0] ? err : "failed");
        exit(1);
    }
}

/* ---- options --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psbench [options]\n"
            "Times push+pull round trips of a dense model between K simulated workers and a real\n"
            "psd, and the same bytes over plain TCP, and prints payload GB/s (tensor bytes as\n"
            "sent on the wire), round trips/s, p50/p99 latency and psd's peak RSS per (mode,\n"
            "model size, workers). --table and --ckpt-stall are modes of their own (below).\n\n"
            "  --psd PATH        psd to run (default: ../server/psd next to psbench)\n"
            "  --sizes LIST      model sizes in floats, comma-separated; k, M suffixes\n"
            "                    (default 235146,1M,10M,100M)\n"
            "  --workers LIST    simulated workers K (default 1,2,4,8)\n"
            "  --modes LIST      asgd, bsp (shard-order sums, psd's default), bsp-arrival\n"
            "                    (default asgd,bsp,bsp-arrival)\n"
            "  --seconds T       timed part of each cell (default 2); a cell runs at least one\n"
            "                    round trip per worker however long it takes\n"
            "  --rounds N        stop each worker after N timed round trips (default: no limit)\n"
            "  --warmup N        untimed round trips per worker first (default 1)\n"
            "  --out DIR         psbench.csv, mpi.csv, the plot and psd logs (default bench/out)\n"
            "  --chunk N         floats per frame (default 1048576 = 2^20, psworker's); a model of\n"
            "                    at most N floats travels as one PUSHPULL\n"
            "  --pull-window N   chunk pulls in flight (default 2, psworker's); 0: every chunk\n"
            "                    request, push or pull, waits for its reply\n"
            "  --wire f32|bf16   tensors on psd's wire (default f32); bf16: the workers ask for\n"
            "                    bfloat16 as psworker --wire bf16 does (psd must offer it, else\n"
            "                    psbench fails), GB/s counts 2 bytes a value and the plain-TCP\n"
            "                    ceiling moves 2 bytes a value too; MPI_Allreduce stays float32\n"
            "  --no-tcp          skip the plain-TCP ceiling\n"
            "  --no-mpi          skip the MPI_Allreduce comparison\n"
            "  --round-reps N    after the grid, BSP rounds of 2 workers (one psd; in float32 up\n"
            "                    to 2^21 floats also the model in 2 parts on 2 psd), the star\n"
            "                    round and MPI_Allreduce are measured back to back N times per size\n"
            "                    (default 3; 0 skips it)\n"
            "  --no-plot         write the gnuplot script but do not run gnuplot\n"
            "  --no-probe        do not measure psd's loop lag (an admin connection sending\n"
            "                    a heartbeat every 10 ms during each psd cell)\n"
            "  --table           the table mode instead of the dense grid: rows per second of\n"
            "                    push-and-pull by key (psc_table_pushpull) through an embedding\n"
            "                    table in psd (asgd) against the plain-TCP ceiling of the same\n"
            "                    request and answer bytes, and per psd core; K from --workers\n"
            "                    (default 2); writes table.csv; exits 1 if a cell failed\n"
            "  --server-cpu C    every server psbench starts (psd, the plain-TCP server) runs on\n"
            "                    CPU C alone, psbench's workers on the other CPUs: machines whose\n"
            "                    CPUs differ in speed compare psd and the ceiling on the same one\n"
            "  --table-reps N    table: per K, N pairs of cells, the ceiling then psd, one after\n"
            "                    the other (default 3), so that both sides of each ratio meet the\n"
            "                    same machine; a line per pair, then each figure's median over\n"
            "                    the N pairs and its range (table.csv: a row per pair, `rep`)\n"
            "  --client-spin US  each worker's wait for a reply polls its socket for up to US\n"
            "                    microseconds, yielding the CPU between polls, before it sleeps:\n"
            "                    psd's workers through libpsclient's spin_us, the plain-TCP\n"
            "                    ceiling's clients likewise (default 0: they sleep at once)\n"
            "  --table-tcp       the table mode's workers send their requests to psd in frames\n"
            "                    over loopback TCP (libpsclient's shm off), not through their\n"
            "                    table segments\n"
            "  --psd-set K=V     a setting for every psd psbench starts (psd --set K=V, after\n"
            "                    psbench's own), e.g. table_apply=hogwild; up to 16\n"
            "  --ckpt-stall G    the checkpoint stall instead of the grid: fill a table of G GB\n"
            "                    (10^9 bytes of keys, rows and AdaGrad state; dim 128) in one\n"
            "                    psd with a state dir (OUT/ckpt-state), then K workers pull --keys\n"
            "                    random stored keys a request (default 256) back to back for\n"
            "                    --seconds (default 5) without a checkpoint, and on while psctl\n"
            "                    checkpoint runs: p50, p99, max, requests/s of both, the\n"
            "                    checkpoint's time and file, psd's memory; writes ckpt_stall.csv;\n"
            "                    exits 1 if it could not measure (see bench/README.md)\n"
            "  --ckpt-push       with --ckpt-stall: push-and-pulls (psc_table_pushpull) too:\n"
            "                    without a checkpoint, during a second one, and after it\n"
            "  --psctl PATH      with --ckpt-stall: psctl to run (default: next to psd, or the\n"
            "                    build tree's psctl/psctl)\n"
            "  --dim N           table: values per row (default 16; --ckpt-stall: 128)\n"
            "  --keys N          table: distinct keys a request pushes and pulls (default 4096;\n"
            "                    --ckpt-stall: keys a request pulls, 256)\n"
            "  --key-space N     table: keys drawn from N distinct ones (default 1M)\n"
            "  --zipf S          table: Zipf exponent of the keys' ranks (default 1.1); 0: uniform\n"
            "  -v, --verbose     psd logs at info level; print server pids\n"
            "  -h, --help        this help\n\n"
            "PSBENCH_SHOW_PID=1 prints each server's pid (to attach perf).\n");
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s)
        die("bad size '%s'", s);
    if (*end == 'k' || *end == 'K')
        v *= 1e3, end++;
    else if (*end == 'm' || *end == 'M')
        v *= 1e6, end++;
    else if (*end == 'g' || *end == 'G')
        v *= 1e9, end++;
    if (*end || v < 1 || v > 4294967295.0)
        die("bad size '%s' (floats, 1 .. 2^32-1)", s);
    return (uint64_t)v;
}

static int split(const char *arg, char items[][32], int max)
{
    int n = 0;
    const char *p = arg;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (n == max)
            die("too many items in '%s' (at most %d)", arg, max);
        if (l == 0 || l >= 32)
            die("bad list '%s'", arg);
        memcpy(items[n], p, l);
        items[n][l] = 0;
        n++;
        p += l;
        if (*p == ',')
            p++;
    }
    return n;
}

static void parse_opts(int argc, char **argv, opts *o)
{
    char items[MAX_LIST][32], dir[PATH_MAX - 64];
    memset(o, 0, sizeof *o);
    exe_dir(dir, sizeof dir);
    snprintf(o->psd, sizeof o->psd, "%s/../server/psd", dir);
    snprintf(o->mpi_prog, sizeof o->mpi_prog, "%s/mpi_allreduce", dir);
    const uint64_t dsizes[] = {235146, 1000000, 10000000, 100000000};
    const int dworkers[] = {1, 2, 4, 8};
    memcpy(o->sizes, dsizes, sizeof dsizes);
    o->nsizes = 4;
    memcpy(o->workers, dworkers, sizeof dworkers);
    o->nworkers = 4;
    for (int m = 0; m < MODE_COUNT; m++)
        o->modes[m] = m;
    o->nmodes = MODE_COUNT;
    o->seconds = 2;
    o->round_reps = 3;
    o->table_reps = 3;
    o->warmup = 1;
    o->chunk = CHUNK_FLOATS;
    o->window = PULL_WINDOW;
    o->probe = 1;
    o->wire = WIRE_F32;
    o->out = "bench/out";
    o->dim = 16;
    o->nkeys = 4096;
    o->key_space = 1000000;
    o->zipf = 1.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV()                                         \
    do {                                                \
        if (!v)                                         \
            die("%s needs a value (see --help)", a);    \
        i++;                                            \
    } while (0)
        if (strcmp(a, "--psd") == 0) {
            NEEDV();
            snprintf(o->psd, sizeof o->psd, "%s", v);
        } else if (strcmp(a, "--sizes") == 0) {
            NEEDV();
            o->nsizes = split(v, items, MAX_LIST);
            for (int k = 0; k < o->nsizes; k++)
                o->sizes[k] = parse_size(items[k]);
        } else if (strcmp(a, "--workers") == 0) {
            NEEDV();
            o->workers_given = 1;
            o->nworkers = split(v, items, MAX_LIST);
            for (int k = 0; k < o->nworkers; k++) {
                char *end;
                long n = strtol(items[k], &end, 10);
                if (*end || n < 1 || n > 256)
                    die("bad worker count '%s' (1..256)", items[k]);
                o->workers[k] = (int)n;
            }
        } else if (strcmp(a, "--modes") == 0) {
            NEEDV();
            int n = split(v, items, MAX_LIST);
            o->nmodes = 0;
            for (int k = 0; k < n; k++) {
                int m = 0;
                while (m < MODE_COUNT && strcmp(items[k], mode_names[m]) != 0)
                    m++;
                if (m == MODE_COUNT)
                    die("unknown mode '%s' (asgd, bsp, bsp-arrival)", items[k]);
                if (o->nmodes == MODE_COUNT)
                    die("a mode named twice in '%s'", v);
                o->modes[o->nmodes++] = m;
            }
        } else if (strcmp(a, "--seconds") == 0) {
            NEEDV();
            o->seconds = atof(v);
            if (!(o->seconds > 0 && o->seconds <= 3600))
                die("bad --seconds '%s' (0 .. 3600)", v);
            o->seconds_given = 1;
        } else if (strcmp(a, "--round-reps") == 0) {
            NEEDV();
            o->round_reps = atoi(v);
            if (o->round_reps < 0 || o->round_reps > 64)
                die("bad --round-reps '%s' (0..64)", v);
        } else if (strcmp(a, "--server-cpu") == 0) {
            NEEDV();
            char *end;
            long c = strtol(v, &end, 10);
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            if (*end || c < 0 || c >= n || n < 2)
                die("bad --server-cpu '%s' (0..%ld, and at least 2 CPUs)", v, n - 1);
            server_cpu = (int)c;
        } else if (strcmp(a, "--table-reps") == 0) {
            NEEDV();
            o->table_reps = atoi(v);
            if (o->table_reps < 1 || o->table_reps > 64)
                die("bad --table-reps '%s' (1..64)", v);
        } else if (strcmp(a, "--rounds") == 0) {
            NEEDV();
            o->max_rounds = strtoull(v, NULL, 10);
        } else if (strcmp(a, "--warmup") == 0) {
            NEEDV();
            o->warmup = atoi(v);
            if (o->warmup < 0)
                die("bad --warmup '%s'", v);
        } else if (strcmp(a, "--chunk") == 0) {
            NEEDV();
            o->chunk = parse_size(v);
            if (o->chunk < 1024 || o->chunk > (1u << 24))
                die("bad --chunk '%s' (1k to 16M floats: the library's bounds; psd's max_frame is set to 64M)", v);
        } else if (strcmp(a, "--pull-window") == 0) {
            NEEDV();
            o->window = atoi(v);
            if (o->window < 0 || o->window > 64)
                die("bad --pull-window '%s' (0..64)", v);
        } else if (strcmp(a, "--wire") == 0) {
            NEEDV();
            if (strcmp(v, "f32") == 0)
                o->wire = WIRE_F32;
            else if (strcmp(v, "bf16") == 0)
                o->wire = WIRE_BF16;
            else
                die("bad --wire '%s' (f32 or bf16)", v);
        } else if (strcmp(a, "--out") == 0) {
            NEEDV();
            o->out = v;
        } else if (strcmp(a, "--psd-set") == 0) {
            NEEDV();
            if (!strchr(v, '=') || o->npsd_set >= 16)
                die("bad --psd-set '%s' (KEY=VALUE, a psd setting; at most 16)", v);
            o->psd_set[o->npsd_set++] = v;
        } else if (strcmp(a, "--table") == 0) {
            o->table = 1;
        } else if (strcmp(a, "--ckpt-stall") == 0) {
            NEEDV();
            char *end;
            o->ckpt_gb = strtod(v, &end);
            if (*end || !(o->ckpt_gb > 0 && o->ckpt_gb <= 1024))
                die("bad --ckpt-stall '%s' (GB of table rows, above 0 and at most 1024)", v);
        } else if (strcmp(a, "--ckpt-push") == 0) {
            o->ckpt_push = 1;
        } else if (strcmp(a, "--psctl") == 0) {
            NEEDV();
            snprintf(o->psctl, sizeof o->psctl, "%s", v);
        } else if (strcmp(a, "--dim") == 0) {
            NEEDV();
            char *end;
            unsigned long d = strtoul(v, &end, 10);
            if (*end || d < 1 || d > 1024)
                die("bad --dim '%s' (1..1024, a table's row)", v);
            o->dim = (uint32_t)d;
            o->dim_given = 1;
        } else if (strcmp(a, "--keys") == 0) {
            NEEDV();
            uint64_t k = parse_size(v);
            if (k > 65536)
                die("bad --keys '%s' (1..65536: one table message)", v);
            o->nkeys = (uint32_t)k;
            o->keys_given = 1;
        } else if (strcmp(a, "--key-space") == 0) {
            NEEDV();
            o->key_space = parse_size(v);
            if (o->key_space > 100000000)
                die("bad --key-space '%s' (at most 100M)", v);
        } else if (strcmp(a, "--zipf") == 0) {
            NEEDV();
            char *end;
            o->zipf = strtod(v, &end);
            if (*end || !(o->zipf >= 0 && o->zipf <= 5))
                die("bad --zipf '%s' (0..5; 0: uniform)", v);
        } else if (strcmp(a, "--no-tcp") == 0) {
            o->no_tcp = 1;
        } else if (strcmp(a, "--table-tcp") == 0) {
            o->table_tcp = 1;
        } else if (strcmp(a, "--client-spin") == 0) {
            NEEDV();
            char *end;
            long us = strtol(v, &end, 10);
            if (*end || us < 0 || us > 1000000)
                die("bad --client-spin '%s' (0..1000000 microseconds)", v);
            o->client_spin = (int)us;
        } else if (strcmp(a, "--no-mpi") == 0) {
            o->no_mpi = 1;
        } else if (strcmp(a, "--no-probe") == 0) {
            o->probe = 0;
        } else if (strcmp(a, "--no-plot") == 0) {
            o->no_plot = 1;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->verbose = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            usage(stderr);
            die("unknown option '%s'", a);
        }
#undef NEEDV
    }
    if (access(o->psd, X_OK) != 0)
        die("no psd at %s (build it, or give --psd PATH)", o->psd);
    if (server_cpu >= 0)
        pin_self(-server_cpu - 1); /* the workers (and psctl, mpirun) on the other CPUs */
    if (o->ckpt_gb > 0) {
        if (o->table)
            die("--ckpt-stall is a mode of its own: not with --table");
        if (!o->dim_given)
            o->dim = 128;
        if (!o->keys_given)
            o->nkeys = 256;
        if (!o->seconds_given)
            o->seconds = 5;
        if (!o->workers_given)
            o->workers[0] = 2, o->nworkers = 1;
        if (o->nworkers != 1)
            die("--ckpt-stall takes one worker count (--workers K)");
        if ((uint64_t)o->nkeys * o->dim > ((uint64_t)1 << 22))
            die("--keys x --dim over 2^22 values: more than one table message");
        if (!o->psctl[0]) { /* beside psd (installed), or in the build tree's psctl/ */
            char d[PATH_MAX - 32];
            snprintf(d, sizeof d, "%.4000s", o->psd);
            char *slash = strrchr(d, '/');
            if (slash)
                *slash = 0;
            else
                snprintf(d, sizeof d, ".");
            snprintf(o->psctl, sizeof o->psctl, "%s/psctl", d);
            if (access(o->psctl, X_OK) != 0)
                snprintf(o->psctl, sizeof o->psctl, "%s/../psctl/psctl", d);
        }
        if (access(o->psctl, X_OK) != 0)
            die("no psctl at %s (build it, or give --psctl PATH): --ckpt-stall asks psd for the checkpoint with it",
                o->psctl);
    } else if (o->ckpt_push) {
        die("--ckpt-push goes with --ckpt-stall G");
    }
    if (o->table && !o->workers_given) {
        o->workers[0] = 2;
        o->nworkers = 1;
    }
    if (o->table && (uint64_t)o->nkeys * o->dim > ((uint64_t)1 << 22))
        die("--keys x --dim over 2^22 values: more than one table message");
    if (o->table && o->key_space < 2 * (uint64_t)o->nkeys)
        die("--key-space must be at least twice --keys (each batch holds distinct keys)");
    if (access(o->mpi_prog, X_OK) != 0)
        o->mpi_prog[0] = 0;
}

/* ---- BSP rounds of 2 workers ------------------------------------------------ */

/* The largest model psd shares memory for (server/psd.h SRV_SHM_MAX_PARAMS). */
#define SHM_MAX_FLOATS ((uint64_t)1 << 20)

/* How psd's rounds run in the round comparison: one psd over TCP, or through
 * shared memory (S <= 2^20); the model in 2 parts on 2 psd instances, each
 * worker reaching both through shared memory (libpsclient offers its
 * segment to every psd; on one machine each maps it), or both over TCP
 * (each part <= 2^20 and the chunk size, so one PUSHPULL per part). The
 * names are the `wire` column's. */
enum { RW_TCP, RW_SHM, RW_2P_SHM, RW_2P_TCP, RW_COUNT };
static const char *const rw_what[RW_COUNT] = {"", " through shared memory",
                                              " of a model in 2 parts (shared memory)",
                                              " of a model in 2 parts (TCP)"};

static const char *rw_name(const opts *o, int t)
{
    static const char *const names[RW_COUNT] = {NULL, "shm", "2p-shm", "2p-tcp"};
    return t == RW_TCP ? wire_name(o->wire) : names[t];
}

/* Whether the rounds of kind t run at S floats. */
static int rw_runs(const opts *o, uint64_t S, int t)
{
    if (t == RW_TCP)
        return 1;
    if (o->wire != WIRE_F32)
        return 0; /* psd shares memory in float32; the split rows are float32 like MPI's */
    if (t == RW_SHM)
        return S <= SHM_MAX_FLOATS; /* psd shares memory for models of one block */
    for (uint32_t i = 0; i < 2; i++) {
        uint64_t lo, hi;
        if (part_bounds(S, i, 2, &lo, &hi) != 0 || hi - lo > SHM_MAX_FLOATS || hi - lo > o->chunk)
            return 0;
    }
    return 1;
}

/* One repetition of the round comparison at one size: psd's BSP rounds
 * (each BSP mode of the grid), the star round and MPI_Allreduce, measured
 * back to back so that they share the machine's state of the moment. */
typedef struct round_rep {
    /* [m][RW_*]; ms, NAN: failed or not run */
    double psd_p50[MODE_COUNT][RW_COUNT], psd_mean[MODE_COUNT][RW_COUNT], psd_cpu[MODE_COUNT][RW_COUNT];
    double star_p50, star_mean, star_cpu;
    double tcp_p50, tcp_mean, shm_p50, shm_mean;
} round_rep;

static void range_of(const double *v, int n, double *lo, double *hi)
{
    *lo = *hi = NAN;
    for (int i = 0; i < n; i++) {
        if (isnan(v[i]))
            continue;
        if (isnan(*lo) || v[i] < *lo)
            *lo = v[i];
        if (isnan(*hi) || v[i] > *hi)
            *hi = v[i];
    }
}

static void round_cells(const opts *o, uint64_t S, const float *grad, int have_mpi, round_rep *rp)
{
    for (int m = 0; m < MODE_COUNT; m++)
        for (int t = 0; t < RW_COUNT; t++)
            rp->psd_p50[m][t] = rp->psd_mean[m][t] = rp->psd_cpu[m][t] = NAN;
    for (int mi = 0; mi < o->nmodes; mi++) {
        int m = o->modes[mi];
        if (m == MODE_ASGD)
            continue;
        for (int t = 0; t < RW_COUNT; t++) {
            if (!rw_runs(o, S, t))
                continue;
            row r;
            run_cell_parts(o, SYS_PSD, m, S, 2, grad, t == RW_SHM || t == RW_2P_SHM,
                           t == RW_2P_SHM || t == RW_2P_TCP ? 2 : 1, &r);
            if (!r.r.ok) {
                fprintf(stderr, "psbench: %s round%s at %" PRIu64 " floats failed: %s\n", mode_names[m], rw_what[t],
                        S, r.r.err);
                continue;
            }
            /* a round: both workers push and pull; round trips/s counts both */
            rp->psd_mean[m][t] = 1e3 * 2.0 / r.r.rt_per_s;
            rp->psd_p50[m][t] = r.r.p50_ms;
            rp->psd_cpu[m][t] = r.r.server_cpu * rp->psd_mean[m][t];
        }
    }
    rp->star_p50 = rp->star_mean = rp->star_cpu = NAN;
    if (!o->no_tcp) {
        row t;
        run_cell(o, SYS_TCP_STAR, MODE_BSP, S, 2, grad, 0, &t);
        if (t.r.ok) {
            rp->star_mean = 1e3 * 2.0 / t.r.rt_per_s;
            rp->star_p50 = t.r.p50_ms;
            rp->star_cpu = t.r.server_cpu * rp->star_mean;
        } else {
            fprintf(stderr, "psbench: star round at %" PRIu64 " floats failed: %s\n", S, t.r.err);
        }
    }
    rp->tcp_p50 = rp->tcp_mean = rp->shm_p50 = rp->shm_mean = NAN;
    if (have_mpi) {
        mpi_res mr = {.S = S};
        run_mpi(o, &mr, 1);
        rp->tcp_mean = mr.mean_ms[0];
        rp->tcp_p50 = mr.p50_ms[0];
        rp->shm_mean = mr.mean_ms[1];
        rp->shm_p50 = mr.p50_ms[1];
    }
}

/* BSP rounds of 2 workers beside the plain-TCP star round of the same size
 * (the server writes back once both clients sent their S values: the
 * traffic of a round with no framing, no sum and no update) and beside
 * MPI_Allreduce of S float32 on 2 ranks, over TCP and over shared memory,
 * where Open MPI is present. This machine's speed drifts over minutes, so
 * the three are measured back to back, --round-reps times per size, and
 * the medians over repetitions are printed, with the range of psd/TCP. */
static void compare_rounds(const opts *o, const float *grad)
{
    int have_mpi = 0;
    if (o->no_mpi) {
    } else if (!o->mpi_prog[0]) {
        printf("\nMPI_Allreduce comparison skipped: no mpi_allreduce next to psbench (it is built where Open "
               "MPI's development files are installed: libopenmpi-dev)\n");
    } else if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("\nMPI_Allreduce comparison skipped: mpirun not on PATH\n");
    } else {
        have_mpi = 1;
    }
    int R = o->round_reps;
    round_rep *reps = calloc((size_t)o->nsizes * (size_t)R, sizeof *reps);
    if (!reps)
        die("out of memory");
    for (int i = 0; i < o->nsizes; i++)
        for (int r = 0; r < R; r++) {
            fprintf(stderr, "psbench: BSP rounds at %" PRIu64 " floats, repetition %d of %d\n", o->sizes[i], r + 1,
                    R);
            round_cells(o, o->sizes[i], grad, have_mpi, &reps[i * R + r]);
        }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/mpi.csv", o->out);
    FILE *mc = fopen(path, "w");
    if (mc)
        fprintf(mc, "floats,mode,rep,wire,bsp_round_mean_ms,bsp_round_p50_ms,psd_cpu_ms_per_round,star_round_mean_ms,"
                    "star_round_p50_ms,star_cpu_ms_per_round,allreduce_tcp_mean_ms,allreduce_tcp_p50_ms,"
                    "allreduce_shm_mean_ms,allreduce_shm_p50_ms,ratio_bsp_to_star_p50,ratio_bsp_to_tcp_mean,"
                    "ratio_bsp_to_tcp_p50,ratio_star_to_tcp_p50,ratio_bsp_to_shm_p50\n");
    size_t vb = wire_size(o->wire);
    printf("\nBSP round of 2 workers (push S + pull S each, %s on psd's wire: %zu bytes a value) against\n"
           "star: the same bytes over plain TCP, the server writing back once both clients sent theirs\n"
           "(no framing, no sum, no update: the least a central server does for a round), and\n"
           "MPI_Allreduce of S float32 on 2 ranks (4 bytes a value: MPI has no bfloat16 sum).\n"
           "The three are measured back to back, %d times per size; figures are medians over the\n"
           "repetitions, ratios the medians of each repetition's ratio (of p50s; psd/TCP also of means),\n"
           "and the psd/TCP range its lowest and highest; cpu: the server's CPU time per round.\n"
           "Rows with wire shm: the workers share memory with psd, as psworker does on psd's machine\n"
           "(models up to 2^20 values): the tensors do not cross the socket, only a small frame does;\n"
           "MPI's counterpart is its shared-memory transport (psd/shm: psd's round over MPI shm's).\n"
           "Rows 2p-shm and 2p-tcp (float32, parts up to 2^20 values): the model in 2 parts on 2 psd\n"
           "instances: each worker reaches both through shared memory (2p-shm: the library offers its\n"
           "segment to every psd, and on this machine each maps it) or both over TCP (2p-tcp: half the\n"
           "model each way to each psd, as MPI's reduce-scatter + allgather); psd cpu: both psd.\n",
           wire_name(o->wire), vb, R);
    printf("%-12s %6s %9s | %9s %9s %9s | %9s %9s %9s | %9s %9s | %9s %9s | %9s %9s %9s %13s %9s %9s\n", "mode", "wire",
           "floats", "round", "round", "psd cpu", "star", "star", "star cpu", "MPI TCP", "MPI TCP", "MPI shm",
           "MPI shm", "psd/", "psd/TCP", "psd/TCP", "psd/TCP p50", "star/", "psd/shm");
    printf("%-12s %6s %9s | %9s %9s %9s | %9s %9s %9s | %9s %9s | %9s %9s | %9s %9s %9s %13s %9s %9s\n", "", "", "",
           "mean ms", "p50 ms", "ms", "mean ms", "p50 ms", "ms", "mean ms", "p50 ms", "mean ms", "p50 ms", "star p50",
           "mean", "p50", "range", "TCP p50", "p50");
    for (int i = 0; i < o->nsizes; i++) {
        for (int m = 0; m < MODE_COUNT; m++) {
            int in_grid = 0;
            for (int mi = 0; mi < o->nmodes; mi++)
                in_grid |= o->modes[mi] == m;
            if (m == MODE_ASGD || !in_grid)
                continue;
            for (int t = 0; t < RW_COUNT; t++) {
                int any = 0;
                for (int r = 0; r < R; r++)
                    any |= !isnan(reps[i * R + r].psd_mean[m][t]);
                if (t != RW_TCP && !any)
                    continue; /* not run at this size, or failed every time */
                const char *wname = rw_name(o, t);
                double v[14][64];
                for (int r = 0; r < R; r++) {
                    const round_rep *x = &reps[i * R + r];
                    double row_v[14] = {x->psd_mean[m][t], x->psd_p50[m][t], x->psd_cpu[m][t], x->star_mean,
                                        x->star_p50, x->star_cpu, x->tcp_mean, x->tcp_p50, x->shm_mean, x->shm_p50,
                                        x->psd_p50[m][t] / x->star_p50, x->psd_mean[m][t] / x->tcp_mean,
                                        x->psd_p50[m][t] / x->tcp_p50, x->psd_p50[m][t] / x->shm_p50};
                    for (int k = 0; k < 14; k++)
                        v[k][r] = row_v[k];
                    if (mc)
                        fprintf(mc, "%" PRIu64 ",%s,%d,%s,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,"
                                    "%.4f,%.4f,%.4f\n",
                                o->sizes[i], mode_names[m], r + 1, wname, row_v[0], row_v[1], row_v[2],
                                row_v[3], row_v[4], row_v[5], row_v[6], row_v[7], row_v[8], row_v[9], row_v[10],
                                row_v[11], row_v[12], x->star_p50 / x->tcp_p50, row_v[13]);
                }
                double md[14], star_tcp[64], lo, hi;
                for (int k = 0; k < 14; k++)
                    md[k] = median_of(v[k], R);
                for (int r = 0; r < R; r++)
                    star_tcp[r] = reps[i * R + r].star_p50 / reps[i * R + r].tcp_p50;
                range_of(v[12], R, &lo, &hi);
                char sl[32], rg[32];
                snprintf(rg, sizeof rg, "%.2f-%.2fx", lo, hi);
                printf("%-12s %6s %9s | %9.3f %9.3f %9.3f | %9.3f %9.3f %9.3f | %9.3f %9.3f | %9.3f %9.3f | %8.2fx "
                       "%8.2fx %8.2fx %13s %8.2fx %8.2fx\n",
                       mode_names[m], wname, size_label(o->sizes[i], sl, sizeof sl), md[0], md[1], md[2],
                       md[3], md[4], md[5], md[6], md[7], md[8], md[9], md[10], md[11], md[12], rg,
                       median_of(star_tcp, R), md[13]);
            }
        }
    }
    if (mc)
        fclose(mc);
    free(reps);
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    opts o;
    parse_opts(argc, argv, &o);
    signal(SIGPIPE, SIG_IGN);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/logs", o.out);
    if (mkdir_p(path) != 0)
        die("cannot create %s: %s", path, strerror(errno));
    if (o.table) {
        run_tables(&o);
        return 0;
    }
    if (o.ckpt_gb > 0) {
        run_ckpt_stall(&o);
        return 0;
    }
    snprintf(path, sizeof path, "%s/psbench.csv", o.out);
    FILE *csv = fopen(path, "w");
    if (!csv)
        die("cannot write %s: %s", path, strerror(errno));
    csv_header(csv);

    uint64_t smax = 0;
    for (int i = 0; i < o.nsizes; i++)
        smax = o.sizes[i] > smax ? o.sizes[i] : smax;
    float *grad = malloc(smax * sizeof(float));
    if (!grad)
        die("out of memory for %" PRIu64 " floats", smax);
    for (uint64_t i = 0; i < smax; i++) /* small, finite, not all equal */
        grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);

    size_t vb = wire_size(o.wire);
    printf("psbench: psd %s, %ld CPUs, %.1f s per cell, warm-up %d, chunks of %" PRIu64 " floats%s, wire %s\n",
           o.psd, sysconf(_SC_NPROCESSORS_ONLN), o.seconds, o.warmup, o.chunk,
           o.window == PULL_WINDOW ? " (as psworker)" : ", another pull window than psworker's",
           wire_name(o.wire));
    printf("GB/s: tensor bytes pushed + pulled as sent on the wire (%s: 2 x S x %zu per round trip) per second,\n"
           "all workers together; the plain-TCP ceiling moves the same bytes (S x %zu each way%s);\n"
           "cpu: psd's CPU seconds per second; peak: psd's VmHWM (! over the bound); lag: how long psd took\n"
           "to answer an admin heartbeat sent every 10 ms (its loop busy elsewhere); load: 1-min load average\n",
           wire_name(o.wire), vb, vb,
           o.wire == WIRE_F32 ? "" : ", no conversion");
    if (o.client_spin)
        printf("every worker polls up to %d us for each reply before it sleeps (--client-spin)\n", o.client_spin);
    print_header(o.wire);
    int ncells = o.nsizes * o.nworkers;
    row *rows = calloc((size_t)ncells * (size_t)o.nmodes, sizeof *rows);
    row *tcp = calloc((size_t)ncells, sizeof *tcp);
    if (!rows || !tcp)
        die("out of memory");
    int nrows = 0, ntcp = 0;
    double t_all = now_s();
    for (int si = 0; si < o.nsizes; si++) {
        for (int wi = 0; wi < o.nworkers; wi++) {
            uint64_t S = o.sizes[si];
            int K = o.workers[wi];
            row *t = NULL;
            if (!o.no_tcp) {
                t = &tcp[ntcp++];
                run_cell(&o, SYS_TCP, MODE_ASGD, S, K, grad, 0, t);
            }
            for (int mi = 0; mi < o.nmodes; mi++) {
                row *p = &rows[nrows++];
                run_cell(&o, SYS_PSD, o.modes[mi], S, K, grad, 0, p);
                print_row(p, t);
                csv_row(csv, p, t);
                if (p->r.wire_refused)
                    die("--wire %s: %s", wire_name(o.wire), p->r.err);
            }
        }
    }
    fclose(csv);
    printf("\n%d cells in %.0f s; CSV: %s/psbench.csv, psd logs: %s/logs/\n", nrows + ntcp, now_s() - t_all, o.out,
           o.out);

    /* BSP rounds of 2 workers against the least any central server does
     * for one (the plain-TCP star round) and against MPI_Allreduce */
    int have_bsp = 0, have_k2 = 0;
    for (int mi = 0; mi < o.nmodes; mi++)
        have_bsp |= o.modes[mi] != MODE_ASGD;
    for (int wi = 0; wi < o.nworkers; wi++)
        have_k2 |= o.workers[wi] == 2;
    if (have_bsp && have_k2 && o.round_reps > 0)
        compare_rounds(&o, grad);
    free(grad);
    plot(&o, rows, nrows, tcp, ntcp);
    free(rows);
    free(tcp);
    return 0;
}
