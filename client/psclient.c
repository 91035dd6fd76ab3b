/* psclient.c - libpsclient: a worker's connection to psd behind the public
 * API of include/psd/client.h (handshake, initial values, pushes and pulls
 * chunked for big models, a model split over several psd, a shared-memory
 * segment, heartbeat threads, an asynchronous step, reconnects with
 * backoff). The wire itself is proto/ and common/client.c. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "psd/client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/auth.h"
#include "common/client.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/parse.h"
#include "proto/errors.h"
#include "proto/layout.h"
#include "proto/ps_limits.h"

/* largest tensor chunk in one frame, in floats (4 MiB) */
#define CHUNK_FLOATS PS_CHUNK_FLOATS

/* One connection: to psd, or with a model split over several psd, to the
 * one holding part [lo, hi) of the flat vector (links[i] holds part i). */
typedef struct psc_link {
    ps_client cl;
    pthread_mutex_t lock;    /* the client's send lock */
    pthread_cond_t wake;     /* wakes the heartbeat thread */
    pthread_t hb_thread;
    int hb_running, hb_stop;
    uint64_t hb_interval_ms; /* a third of this psd's heartbeat_timeout */
    char server[300];        /* "host:port" */
    uint64_t lo, hi;         /* this part: values [lo, hi) of the flat vector */
    ps_layout layout;        /* its layout (the model's own with one psd) */
    char mode[16];
    uint64_t version;        /* version of this part's parameters we hold */
    int shm_ok;              /* this psd mapped our segment */
    int remote;              /* this psd is on another machine (ps_sock_same_host) */
    int has_plan;            /* its WELCOME told the job's plan: */
    ps_plan plan;
    uint64_t piece;          /* its BSP rounds close in pieces of this many values
                              * (WELCOME "piece"); 0: whole */
} psc_link;

struct psc_client {
    /* options */
    char servers[4096];
    uint32_t shard, nshards;
    ps_token token;          /* the secret proved to psd; len 0: none */
    char token_path[1024];
    int timeout_ms, reconnect_ms, connect_ms;
    uint32_t want_dt;        /* wire type asked for; psd's welcome decides */
    int skip_zeros;          /* option skip_zeros: float32 pushes leave +0.0 out
                              * when psd offers it (default on) */
    int compress;            /* option compress: float32 pushes as zstd frames,
                              * auto (-1: to a psd on another machine), on, off */
    int want_shm;            /* offer psd a shared segment */
    int auto_reconnect;
    int interrupt;           /* option interrupt: a signal ends a wait (PSC_EINTR) */
    int intr;                /* a signal interrupted a wait of this call (the links'
                              * `interrupted`); cleared when a call begins */
    int desync;              /* a wait was interrupted: the links may be mid-frame */
    int want_plan;           /* psc_plan_set: the plan the hello proposes */
    ps_plan plan;
    uint64_t chunk;          /* floats per frame of a chunked push or pull */
    unsigned pull_window;    /* chunk pulls in flight; 0: every chunk request waits */
    int send_buffer;         /* SO_SNDBUF of each connection; 0: the kernel's */
    int barrier;             /* option barrier: BSP steps over a split model end
                              * at a BARRIER on part 0's psd: 1 on, 0 off,
                              * -1 auto (when a part is on another machine) */
    int pieces;              /* option pieces: a BSP step sends a part in its psd's
                              * pieces (WELCOME "piece"): 1 on, 0 off, -1 auto (a
                              * part on another machine) */
    int barrier_refused;     /* that psd does not know BARRIER (before 1.4) */
    int step_in;             /* the step's pushes went in before it failed (at its
                              * BARRIER): its gradient is not lost */
    int barrier_in;          /* this connection to part 0 takes part (it sent a
                              * BARRIER for a version, not withdrawn since) */
    /* the model */
    ps_layout layout;        /* the whole model's */
    int fixed;               /* layout fixed: links and buffers made */
    psc_link *links;             /* one per psd, in part order */
    uint32_t nlinks;
    uint32_t err_link;       /* the link whose error psc_errmsg tells */
    float *own;              /* without a segment: parameters then gradients */
    int shm_fd;              /* the sealed memfd; -1: none */
    float *shm;              /* its mapping: n gradient floats, then n parameter floats */
    float *params, *grads;   /* bound vectors: the library's or the caller's */
    /* what psd said */
    int connected, closed;
    char mode[16];
    int bsp;
    uint64_t version;        /* of the parameters we hold (first part's) */
    int pushed;              /* a push went out since the last pull (bsp pulls wait for its round) */
    int has_base;            /* psc_set_base: the next push's base is `base` */
    uint64_t base;
    int shm_ok, shm_logged;
    uint64_t reconnects, lost, dropped;
    /* the asynchronous step */
    pthread_t async_thread;
    pthread_mutex_t async_mu;
    pthread_cond_t async_cv;
    int async_running, async_stop, async_pending, async_rc;
    /* psc_progress: what was trained since the last periodic REPORT */
    int64_t report_ms;       /* option report_s; 0: no periodic reports */
    int64_t prog_last_ms;    /* when the last one went (0: none yet) */
    double prog_loss;        /* sum of the losses since then */
    uint64_t prog_n;         /* samples since then */
    uint64_t prog_total;     /* samples told of in all */
    /* psc_waiting_for: what psd last said the current step waits for,
     * written by the thread that receives (on_wait), read by any */
    pthread_mutex_t wait_mu;
    char waiting[256];       /* "" when psd said nothing since the step began */
    int quick;               /* the first attempt of psc_connect: a TCP connect gives
                              * up after 1 s, so a wrong address is told at once */
    char err[1200];          /* a client-level error; empty: the link's */
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define PSC_STR_(x) #x
#define PSC_STR(x) PSC_STR_(x)
const char *psc_version_string(void)
{
    return PSC_STR(PSC_VERSION_MAJOR) "." PSC_STR(PSC_VERSION_MINOR) "." PSC_STR(PSC_VERSION_PATCH);
}

const char *psc_strerror(int code)
{
    if (code > 0)
        code = -code;
    switch (code) {
    case PSC_OK: return "no error";
    case PSC_EBUSY: return "a psc_pushpull_start is in flight (psc_wait first)";
    case PSC_ENOTFOUND: return "no tensor of that name";
    case PSC_EINTR: return "interrupted by a signal";
    case PSC_ESTATE: return "not allowed in this state (not connected, closed, or the layout already fixed)";
    default: return ps_strerror(code);
    }
}

const char *psc_errmsg(const psc_client *c)
{
    if (!c)
        return "out of memory";
    if (c->err[0] || !c->links)
        return c->err[0] ? c->err : "no error";
    return ps_client_error(&c->links[c->err_link].cl);
}

__attribute__((format(printf, 3, 4)))
static int fail(psc_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}

/* Sets the link whose error is told to i and returns rc. */
static int lfail(psc_client *c, uint32_t i, int rc)
{
    c->err[0] = '\0';
    c->err_link = i;
    return rc;
}

/* ---- creating and configuring -------------------------------------------- */

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_setup(void)
{
    const char *lv = getenv("PSD_LOG_LEVEL");
    int level = lv ? ps_log_level_parse(lv) : -1;
    ps_log_init(program_invocation_short_name, level >= 0 ? level : PS_LOG_INFO);
}

psc_client *psc_new(void)
{
    pthread_once(&log_once, log_setup);
    psc_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    const char *s = getenv("PSD_SERVER");
    snprintf(c->servers, sizeof c->servers, "%s", s && *s ? s : "127.0.0.1:7000");
    s = getenv("PSD_TOKEN_FILE");
    if (s && *s)
        snprintf(c->token_path, sizeof c->token_path, "%s", s);
    c->nshards = 1;
    c->timeout_ms = 600000;
    c->reconnect_ms = 60000;
    c->connect_ms = 30000;
    c->want_dt = PS_DT_F32;
    c->skip_zeros = 1;
    c->compress = -1;
    c->want_shm = 1;
    c->auto_reconnect = 1;
    c->chunk = CHUNK_FLOATS;
    c->pull_window = PS_PULL_WINDOW;
    c->barrier = -1;
    c->pieces = -1;
    c->shm_fd = -1;
    c->report_ms = 1000;
    s = getenv("PSD_REPORT_INTERVAL");
    if (s && *s && psc_set(c, "report_s", s) != 0)
        PS_LOG(PS_LOG_WARN, "PSD_REPORT_INTERVAL='%s' is not 0..86400 seconds; reporting every second", s);
    ps_layout_init(&c->layout);
    pthread_mutex_init(&c->async_mu, NULL);
    pthread_cond_init(&c->async_cv, NULL);
    pthread_mutex_init(&c->wait_mu, NULL);
    return c;
}

/* "auto": the shard from a launcher's environment. */
static int shard_from_env(psc_client *c)
{
    static const struct {
        const char *index, *count, *launcher;
    } launchers[] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
        {"PMI_RANK", "PMI_SIZE", "an MPI launcher (PMI)"},
        {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
        {"RANK", "WORLD_SIZE", "torchrun"},
        {"JOB_COMPLETION_INDEX", "PSD_WORKERS", "a Kubernetes indexed Job"},
    };
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const char *ks = getenv(launchers[i].index), *ms = getenv(launchers[i].count);
        uint64_t a, b;
        if (!ks || !*ks)
            continue;
        if (!ms || !*ms)
            return fail(c, PSC_EINVAL, "shard auto: %s is set (%.40s) but %s is not", launchers[i].index, ks,
                        launchers[i].count);
        if (ps_parse_u64(ks, 65535, &a) || ps_parse_u64(ms, 65536, &b) || b == 0 || a >= b)
            return fail(c, PSC_EINVAL, "shard auto: %s=%.40s and %s=%.40s do not make a shard K of M with 0 <= K < M",
                        launchers[i].index, ks, launchers[i].count, ms);
        c->shard = (uint32_t)a;
        c->nshards = (uint32_t)b;
        PS_LOG(PS_LOG_DEBUG, "shard auto: %u/%u from %s (%s, %s)", c->shard, c->nshards, launchers[i].launcher,
               launchers[i].index, launchers[i].count);
        return 0;
    }
    return fail(c, PSC_EINVAL,
                "shard auto: no launcher told this process its shard: set OMPI_COMM_WORLD_RANK and "
                "OMPI_COMM_WORLD_SIZE (mpirun does), SLURM_PROCID and SLURM_NTASKS (srun does), RANK and "
                "WORLD_SIZE (torchrun does), or JOB_COMPLETION_INDEX and PSD_WORKERS (Kubernetes indexed Job), "
                "or give the shard as K/M");
}

/* ---- options: one table row each ----
 * The table below is the one list of libpsclient's options: psc_set looks a
 * key up in it and lets its row check and store the value; psc_option hands
 * the rows out, so the Python package takes its keyword arguments and
 * psworker its flags and their help from it (tests/client/test_options.py
 * checks both against it and against docs/client.md). */

/* when an option may be set */
enum { OPT_BEFORE_CONNECT, OPT_BEFORE_LAYOUT, OPT_ANY_TIME };
/* how a number is stored */
enum { OPT_INT, OPT_UNSIGNED, OPT_U64 };

typedef struct opt_row opt_row;
struct opt_row {
    psc_option_info info;
    int when;
    int (*set)(psc_client *c, const opt_row *r, const char *value);
    uint64_t lo, hi;  /* a number's bounds (set_uint); zero_ok: 0 too */
    int zero_ok;
    int scale;        /* stored value = value * scale */
    size_t off;       /* the field in psc_client (set_uint, set_onoff, set_auto) */
    int type;         /* OPT_INT ... (set_uint) */
};

static int bad_value(psc_client *c, const opt_row *r, const char *value)
{
    return fail(c, PSC_EINVAL, "bad %s '%.100s': %s", r->info.name, value, r->info.values);
}

static int set_uint(psc_client *c, const opt_row *r, const char *value)
{
    uint64_t v;
    if (ps_parse_u64(value, r->hi, &v) || (v < r->lo && !(r->zero_ok && v == 0)))
        return bad_value(c, r, value);
    v *= (uint64_t)r->scale;
    char *field = (char *)c + r->off;
    if (r->type == OPT_INT)
        *(int *)(void *)field = (int)v;
    else if (r->type == OPT_UNSIGNED)
        *(unsigned *)(void *)field = (unsigned)v;
    else
        *(uint64_t *)(void *)field = v;
    return 0;
}

/* "on" (1) or "off" (0) */
static int set_onoff(psc_client *c, const opt_row *r, const char *value)
{
    int *field = (int *)(void *)((char *)c + r->off);
    if (strcmp(value, "on") == 0)
        *field = 1;
    else if (strcmp(value, "off") == 0)
        *field = 0;
    else
        return bad_value(c, r, value);
    return 0;
}

/* "auto" (-1), "on" (1) or "off" (0) */
static int set_auto(psc_client *c, const opt_row *r, const char *value)
{
    if (strcmp(value, "auto") == 0) {
        *(int *)(void *)((char *)c + r->off) = -1;
        return 0;
    }
    return set_onoff(c, r, value);
}

static int set_server(psc_client *c, const opt_row *r, const char *value)
{
    if (!*value || strlen(value) >= sizeof c->servers)
        return bad_value(c, r, value);
    snprintf(c->servers, sizeof c->servers, "%s", value);
    return 0;
}

static int set_shard(psc_client *c, const opt_row *r, const char *value)
{
    if (strcmp(value, "auto") == 0)
        return shard_from_env(c);
    const char *slash = strchr(value, '/');
    char k[32];
    uint64_t a, b;
    if (!slash || (size_t)(slash - value) >= sizeof k)
        return bad_value(c, r, value);
    memcpy(k, value, (size_t)(slash - value));
    k[slash - value] = '\0';
    if (ps_parse_u64(k, 65535, &a) || ps_parse_u64(slash + 1, 65536, &b) || b == 0 || a >= b)
        return bad_value(c, r, value);
    c->shard = (uint32_t)a;
    c->nshards = (uint32_t)b;
    return 0;
}

/* read now, so a bad file is told at once */
static int set_token_file(psc_client *c, const opt_row *r, const char *value)
{
    (void)r;
    char err[512];
    ps_token_clear(&c->token);
    c->token_path[0] = '\0';
    if (*value && ps_token_load(value, &c->token, err, sizeof err) != 0)
        return fail(c, PSC_EINVAL, "%s", err);
    return 0;
}

static int set_wire(psc_client *c, const opt_row *r, const char *value)
{
    if (strcmp(value, "f32") == 0)
        c->want_dt = PS_DT_F32;
    else if (strcmp(value, "bf16") == 0)
        c->want_dt = PS_DT_BF16;
    else
        return bad_value(c, r, value);
    return 0;
}

static int set_report_s(psc_client *c, const opt_row *r, const char *value)
{
    char *end = NULL;
    double s = strtod(value, &end);
    if (!*value || *end || !(s >= 0 && s <= 86400))
        return bad_value(c, r, value);
    c->report_ms = (int64_t)(s * 1000.0 + 0.5);
    return 0;
}

static int set_log(psc_client *c, const opt_row *r, const char *value)
{
    int level = ps_log_level_parse(value);
    if (level < 0)
        return bad_value(c, r, value);
    ps_log_set_level(level);
    return 0;
}

#define OPT_FIELD(f) offsetof(psc_client, f)
static const opt_row options[] = {
    {{"server", "server", "HOST:PORT", "host:port or host:port,host:port,...", "$PSD_SERVER, else 127.0.0.1:7000",
      "psd's address; HOST:PORT,HOST:PORT,...: a model split over that many psd, one part each, in order (every "
      "worker lists them alike)"},
     OPT_BEFORE_LAYOUT, set_server, 0, 0, 0, 1, 0, 0},
    {{"shard", "shard", "K/M", "K/M with 0 <= K < M, e.g. 0/2, or auto", "0/1",
      "this worker's shard, or auto: K and M from the launcher: OMPI_COMM_WORLD_RANK and _SIZE (mpirun), PMI_RANK "
      "and PMI_SIZE, SLURM_PROCID and SLURM_NTASKS (srun), RANK and WORLD_SIZE (torchrun), or JOB_COMPLETION_INDEX "
      "and PSD_WORKERS (a Kubernetes indexed Job)"},
     OPT_BEFORE_CONNECT, set_shard, 0, 0, 0, 1, 0, 0},
    {{"token_file", "token-file", "PATH", "a file of 16..1024 bytes that only its owner may read", "$PSD_TOKEN_FILE",
      "the secret to prove to psd when it requires one (its token_file), read at once; mode 600; empty: none"},
     OPT_BEFORE_CONNECT, set_token_file, 0, 0, 0, 1, 0, 0},
    {{"timeout_ms", "timeout", "MS", "1..86400000 milliseconds", "600000",
      "give up on a reply after this many milliseconds"},
     OPT_BEFORE_CONNECT, set_uint, 1, 86400000, 0, 1, OPT_FIELD(timeout_ms), OPT_INT},
    {{"reconnect_s", "reconnect-timeout", "S", "0..86400 seconds", "60",
      "when psd goes away, keep trying to reconnect for this many seconds, with exponential backoff and jitter"},
     OPT_BEFORE_CONNECT, set_uint, 0, 86400, 0, 1000, OPT_FIELD(reconnect_ms), OPT_INT},
    {{"connect_s", "connect-timeout", "S", "0..86400 seconds", "30",
      "at the start, wait up to this many seconds for psd to come up, with the same backoff"},
     OPT_BEFORE_CONNECT, set_uint, 0, 86400, 0, 1000, OPT_FIELD(connect_ms), OPT_INT},
    {{"report_s", NULL, "S", "0..86400 seconds (0: no periodic reports)", "$PSD_REPORT_INTERVAL, else 1",
      "seconds between the progress reports psc_progress sends psd (mean loss since the last one, samples, rate); "
      "0: none; may change at any time"},
     OPT_ANY_TIME, set_report_s, 0, 0, 0, 1, 0, 0},
    {{"wire", "wire", "f32|bf16", "f32 or bf16", "f32",
      "tensors on the wire: f32, or bf16 to push gradients and receive parameters at 2 bytes a value (half the "
      "bytes, about 3 significant digits; psd keeps float32) when psd offers it (wire_bf16), else f32 with a "
      "warning"},
     OPT_BEFORE_CONNECT, set_wire, 0, 0, 0, 1, 0, 0},
    {{"skip_zeros", "skip-zeros", "on|off", "on or off", "on",
      "float32 pushes leave their zeros out (a bitmap marks the values sent) when psd offers it and that saves a "
      "sixteenth of the bytes or more; psd gets the same values bit for bit"},
     OPT_BEFORE_CONNECT, set_onoff, 0, 0, 0, 1, OPT_FIELD(skip_zeros), 0},
    {{"compress", "compress", "auto|on|off", "auto, on or off", "auto",
      "float32 pushes and pulled parameters as zstd frames (lossless) when psd offers it and that saves a "
      "sixteenth of the bytes or more; auto: with a psd on another machine"},
     OPT_BEFORE_CONNECT, set_auto, 0, 0, 0, 1, OPT_FIELD(compress), 0},
    {{"shm", "shm", "on|off", "on or off", "on",
      "offer psd a shared-memory segment for the tensors: a psd on this machine, of the same user, maps it and "
      "pushes and pulls skip the TCP copies (models of at most 2^20 values, or 2^20 per psd; not with a step in "
      "flight, psc_pushpull_start); elsewhere they go over TCP as ever"},
     OPT_BEFORE_LAYOUT, set_onoff, 0, 0, 0, 1, OPT_FIELD(want_shm), 0},
    {{"reconnect", NULL, "on|off", "on or off", "on",
      "push and pull reconnect to a psd that went away by themselves"},
     OPT_BEFORE_CONNECT, set_onoff, 0, 0, 0, 1, OPT_FIELD(auto_reconnect), 0},
    {{"chunk", NULL, "N", "1024..16777216 floats a frame", "1048576",
      "floats a frame of a chunked push or pull; a part of the model up to this size goes as one PUSHPULL; psd "
      "refuses a frame over its max_frame"},
     OPT_BEFORE_CONNECT, set_uint, 1024, 1u << 24, 0, 1, OPT_FIELD(chunk), OPT_U64},
    {{"pull_window", NULL, "N", "0..64 chunk requests in flight", "2",
      "chunk pulls in flight; 0: every chunk request, push or pull, waits for its reply"},
     OPT_BEFORE_CONNECT, set_uint, 0, 64, 0, 1, OPT_FIELD(pull_window), OPT_UNSIGNED},
    {{"send_buffer", "send-buffer", "BYTES", "0 (the kernel sizes it) or 4096..268435456 bytes", "0",
      "each connection's kernel send buffer (SO_SNDBUF); 0: the kernel sizes it. A cap such as 65536 keeps a "
      "step's pushes to several psd from overflowing short link queues"},
     OPT_BEFORE_CONNECT, set_uint, 4096, 1u << 28, 1, 1, OPT_FIELD(send_buffer), OPT_INT},
    {{"interrupt", NULL, "on|off", "on or off", "off",
      "a signal handled while a call waits for psd ends the call with PSC_EINTR (the connection reconnects at "
      "the next call); off: waits go on through signals; psc_wait is not interrupted"},
     OPT_BEFORE_CONNECT, set_onoff, 0, 0, 0, 1, OPT_FIELD(interrupt), 0},
    {{"barrier", "barrier", "auto|on|off", "auto, on or off", "auto",
      "a bsp step over a split model ends at a barrier on the first psd, so that every worker starts its next "
      "round together; auto: when a psd is on another machine"},
     OPT_BEFORE_CONNECT, set_auto, 0, 0, 0, 1, OPT_FIELD(barrier), 0},
    {{"pieces", "pieces", "auto|on|off", "auto, on or off", "auto",
      "a bsp step sends a part whose psd closes rounds in pieces (bsp_piece) piece by piece, and reads every "
      "psd's answers as they come; auto: when that psd is on another machine"},
     OPT_BEFORE_CONNECT, set_auto, 0, 0, 0, 1, OPT_FIELD(pieces), 0},
    {{"log", NULL, "LEVEL", "debug, info, warn or error", "$PSD_LOG_LEVEL, else info",
      "the library's log lines on stderr (process-wide); may change at any time"},
     OPT_ANY_TIME, set_log, 0, 0, 0, 1, 0, 0},
};
#define NOPTIONS (sizeof options / sizeof options[0])

const psc_option_info *psc_option(unsigned i)
{
    return i < NOPTIONS ? &options[i].info : NULL;
}

int psc_set(psc_client *c, const char *key, const char *value)
{
    if (!c || !key || !value)
        return c ? fail(c, PSC_EINVAL, "psc_set: key and value must not be NULL") : PSC_EINVAL;
    const opt_row *r = NULL;
    for (size_t i = 0; i < NOPTIONS && !r; i++)
        if (strcmp(key, options[i].info.name) == 0)
            r = &options[i];
    if (!r) {
        char names[512] = "";
        size_t n = 0;
        for (size_t i = 0; i < NOPTIONS && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", options[i].info.name);
        return fail(c, PSC_EINVAL, "unknown option '%.100s' (%s)", key, names);
    }
    if (r->when != OPT_ANY_TIME && (c->connected || c->closed))
        return fail(c, PSC_ESTATE, "psc_set %.60s: only before psc_connect", key);
    if (r->when == OPT_BEFORE_LAYOUT && c->fixed)
        return fail(c, PSC_ESTATE, "psc_set %s: only before the layout is fixed (psc_params, psc_grads, psc_bind, "
                                   "psc_connect)", r->info.name);
    return r->set(c, r, value);
}

int psc_add_tensor(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims)
{
    uint32_t d[PS_DIMS_MAX];
    if (c->fixed)
        return fail(c, PSC_ESTATE, "psc_add_tensor: the layout is fixed already (psc_params, psc_grads, psc_bind "
                                   "or psc_connect was called)");
    if (!name || !dims || ndim < 1 || ndim > PS_DIMS_MAX)
        return fail(c, PSC_EINVAL, "psc_add_tensor: a tensor needs a name and 1..%d dims", PS_DIMS_MAX);
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] < 1 || dims[i] > UINT32_MAX)
            return fail(c, PSC_EINVAL, "tensor '%.63s': dimension %u is %" PRIu64 " (1..%u)", name, i, dims[i],
                        UINT32_MAX);
        d[i] = (uint32_t)dims[i];
    }
    for (uint32_t i = 0; i < c->layout.ntensors; i++)
        if (strcmp(c->layout.t[i].name, name) == 0)
            return fail(c, PSC_EINVAL, "tensor '%.63s' declared twice", name);
    int rc = ps_layout_add(&c->layout, name, ndim, d);
    if (rc != 0)
        return fail(c, PSC_EINVAL, "tensor '%.80s': %s (names of 1..%d printable bytes, at most %d tensors and "
                                   "2^34 values)", name, ps_strerror(rc), PS_NAME_MAX, PS_TENSORS_MAX);
    return 0;
}

int psc_add_buffer(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims, const char *rule,
                   const char *dtype)
{
    int buf = rule ? ps_buf_parse(rule, strlen(rule)) : -1;
    int sdt = dtype ? ps_save_dt_parse(dtype, strlen(dtype)) : PS_SAVE_F32;
    if (buf < 0)
        return fail(c, PSC_EINVAL, "buffer '%.63s': rule '%.40s': \"mean\" (psd keeps the mean of the workers' "
                                   "values) or \"first\" (shard 0's)", name ? name : "", rule ? rule : "(null)");
    if (sdt < 0)
        return fail(c, PSC_EINVAL, "buffer '%.63s': dtype '%.40s': \"F32\", \"F64\", \"I64\" or \"I32\"",
                    name ? name : "", dtype);
    int rc = psc_add_tensor(c, name, ndim, dims);
    if (rc != 0)
        return rc;
    ps_layout_set_buffer(&c->layout, (unsigned)buf, (unsigned)sdt);
    return 0;
}

uint64_t psc_size(const psc_client *c)
{
    return c->layout.total;
}

uint32_t psc_tensor_count(const psc_client *c)
{
    return c->layout.ntensors;
}

int psc_tensor_info(const psc_client *c, uint32_t i, const char **name, uint32_t *ndim, uint64_t *dims,
                    uint64_t *offset, uint64_t *count)
{
    if (i >= c->layout.ntensors)
        return PSC_ERANGE;
    const ps_tensor_desc *t = &c->layout.t[i];
    if (name)
        *name = t->name;
    if (ndim)
        *ndim = t->ndim;
    if (dims)
        for (uint32_t k = 0; k < t->ndim; k++)
            dims[k] = t->dims[k];
    if (offset)
        *offset = t->offset;
    if (count)
        *count = t->count;
    return 0;
}

int psc_tensor_find(const psc_client *c, const char *name, uint64_t *offset, uint64_t *count)
{
    for (uint32_t i = 0; name && i < c->layout.ntensors; i++)
        if (strcmp(c->layout.t[i].name, name) == 0)
            return psc_tensor_info(c, i, NULL, NULL, NULL, offset, count);
    return PSC_ENOTFOUND;
}

/* ---- fixing the layout: links and buffers --------------------------------- */

/* The segment a psd on this machine can map instead of sending the tensors
 * over loopback TCP (PROTOCOL.md 6.1): a memfd of 2 x n floats, gradient
 * then parameters, sealed so that it can neither shrink (psd would fault
 * on the missing pages) nor grow. Every connection offers the same one; a
 * psd holding one part maps that part of both halves. */
static int shm_create(psc_client *c)
{
    size_t bytes = (size_t)c->layout.total * 2 * sizeof(float);
    int fd = memfd_create("psclient", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return -1;
    }
    c->shm_fd = fd;
    c->shm = p;
    return 0;
}

static void on_wait(void *arg, const char *text, size_t len);

/* Splits the server list into links, part i on the i-th, each with the
 * layout of its part; makes the vectors (in a segment when every part fits
 * one PUSHPULL). */
static int make_links(psc_client *c);

/* Frees the links and vectors make_links made (the connections closed). */
static void unmake_links(psc_client *c)
{
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        ln->cl.send_lock = NULL;
        ps_client_free(&ln->cl);
        pthread_mutex_destroy(&ln->lock);
        pthread_cond_destroy(&ln->wake);
    }
    free(c->links);
    c->links = NULL;
    c->nlinks = 0;
    c->err_link = 0;
    if (c->shm) {
        munmap(c->shm, (size_t)c->layout.total * 2 * sizeof(float));
        close(c->shm_fd);
        c->shm = NULL;
        c->shm_fd = -1;
    }
    free(c->own);
    c->own = NULL;
    c->params = c->grads = NULL;
}

/* Fixes the layout; a failure leaves nothing made, so the caller may
 * change the option at fault and try again. */
static int fix_layout(psc_client *c)
{
    if (c->fixed)
        return 0;
    if (c->layout.ntensors == 0)
        return fail(c, PSC_ESTATE, "no tensors declared: psc_add_tensor first");
    int rc = make_links(c);
    if (rc != 0)
        unmake_links(c);
    return rc;
}

static int make_links(psc_client *c)
{
    uint32_t n = 1;
    for (const char *p = c->servers; *p; p++)
        n += *p == ',';
    if (n > PS_PARTS_MAX)
        return fail(c, PSC_EINVAL, "server lists %u psd; at most %u may share a model", n, PS_PARTS_MAX);
    c->links = calloc(n, sizeof *c->links);
    if (!c->links)
        return fail(c, PSC_ENOMEM, "out of memory");
    const char *p = c->servers;
    int small = 1;
    for (uint32_t i = 0; i < n; i++) {
        psc_link *ln = &c->links[i];
        size_t len = strcspn(p, ",");
        ps_client_init(&ln->cl);
        pthread_mutex_init(&ln->lock, NULL);
        pthread_cond_init(&ln->wake, NULL);
        ln->cl.send_lock = &ln->lock;
        ln->cl.on_wait = on_wait;
        ln->cl.on_wait_arg = c;
        c->nlinks = i + 1;
        if (len == 0 || len >= sizeof ln->server)
            return fail(c, PSC_EINVAL, "server: psd %u of %u in \"%.200s\" is %s", i + 1, n, c->servers,
                        len ? "too long" : "empty");
        memcpy(ln->server, p, len);
        ln->server[len] = '\0';
        p += len + (p[len] == ',');
        if (ps_layout_part(&c->layout, i, n, &ln->layout, &ln->lo, &ln->hi) != 0)
            return fail(c, PSC_EINVAL, "the model's %llu values cannot be split over %u psd (a part needs at least "
                                       "%u values, and the name of a cut tensor with its range must fit in %d bytes)",
                        (unsigned long long)c->layout.total, n, PS_PART_ALIGN, PS_NAME_MAX);
        small &= ln->hi - ln->lo <= CHUNK_FLOATS;
    }
    size_t total = (size_t)c->layout.total;
    if (c->want_shm && small && shm_create(c) != 0)
        PS_LOG(PS_LOG_DEBUG, "no shared-memory segment (%s): tensors over TCP", strerror(errno));
    if (c->shm) {
        c->grads = c->shm;
        c->params = c->shm + total;
    } else {
        size_t bytes = (total * 2 * sizeof(float) + 63) / 64 * 64;
        c->own = aligned_alloc(64, bytes);
        if (!c->own)
            return fail(c, PSC_ENOMEM, "out of memory for %zu parameters", total);
        memset(c->own, 0, bytes);
        c->params = c->own;
        c->grads = c->own + total;
    }
    if (c->token_path[0] && c->token.len == 0) {
        char err[512];
        if (ps_token_load(c->token_path, &c->token, err, sizeof err) != 0)
            return fail(c, PSC_EINVAL, "%s", err);
    }
    c->fixed = 1;
    return 0;
}

static float *own_params(psc_client *c)
{
    return c->shm ? c->shm + c->layout.total : c->own;
}

static float *own_grads(psc_client *c)
{
    return c->shm ? c->shm : c->own + c->layout.total;
}

float *psc_params(psc_client *c)
{
    return fix_layout(c) == 0 ? own_params(c) : NULL;
}

float *psc_grads(psc_client *c)
{
    return fix_layout(c) == 0 ? own_grads(c) : NULL;
}

static int busy(psc_client *c)
{
    if (!c->async_running)
        return 0;
    pthread_mutex_lock(&c->async_mu);
    int b = c->async_pending;
    pthread_mutex_unlock(&c->async_mu);
    return b;
}

int psc_bind(psc_client *c, float *params, float *grads)
{
    int rc = fix_layout(c);
    if (rc != 0)
        return rc;
    if (busy(c))
        return fail(c, PSC_EBUSY, "psc_bind: a step is in flight (psc_wait first)");
    if (params && params == grads)
        return fail(c, PSC_EINVAL, "psc_bind: parameters and gradients must be different vectors");
    c->params = params ? params : own_params(c);
    c->grads = grads ? grads : own_grads(c);
    return 0;
}

/* ---- what a step waits for --------------------------------------------------- */

/* ps_client's on_wait: psd told, answering a heartbeat, what a parked
 * pull of ours waits for. Runs on the thread receiving the step's reply. */
static void on_wait(void *arg, const char *text, size_t len)
{
    psc_client *c = arg;
    pthread_mutex_lock(&c->wait_mu);
    if (len >= sizeof c->waiting)
        len = sizeof c->waiting - 1;
    memcpy(c->waiting, text, len);
    c->waiting[len] = '\0';
    /* a peer's text is for people: no control characters on a terminal */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)c->waiting[i] < 0x20 || c->waiting[i] == 0x7f)
            c->waiting[i] = ' ';
    pthread_mutex_unlock(&c->wait_mu);
}

/* A step begins or ends: what psd said of the last one no longer holds. */
static void waiting_clear(psc_client *c)
{
    pthread_mutex_lock(&c->wait_mu);
    c->waiting[0] = '\0';
    pthread_mutex_unlock(&c->wait_mu);
}

size_t psc_waiting_for(psc_client *c, char *buf, size_t len)
{
    if (!c) {
        if (len)
            buf[0] = '\0';
        return 0;
    }
    pthread_mutex_lock(&c->wait_mu);
    size_t n = strlen(c->waiting);
    if (len)
        snprintf(buf, len, "%s", c->waiting);
    pthread_mutex_unlock(&c->wait_mu);
    return n;
}

/* A library thread: it blocks every signal, so that a process-directed
 * one (SIGINT, SIGTERM) is handled by the caller's threads, whose waits
 * it can end (option interrupt). */
static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* ---- heartbeats ----------------------------------------------------------- */

static void *hb_main(void *arg)
{
    psc_link *ln = arg;
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
            /* psd answers this only while one of our pulls is parked,
             * telling what it waits for (on_wait) */
            m.has = PS_F_WAIT;
            m.wait = 1;
            /* the send lock is held (the condition wait returned with it), so
             * no other frame can be half written: send without taking it */
            ps_client_send_noreply_held(&ln->cl, &m);
        }
    }
    pthread_mutex_unlock(&ln->lock);
    return NULL;
}

static void hb_stop(psc_link *ln)
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

static void hb_start(psc_link *ln)
{
    if (ln->hb_running || ln->hb_interval_ms == 0)
        return;
    if (start_thread(&ln->hb_thread, hb_main, ln) == 0)
        ln->hb_running = 1;
    else
        PS_LOG(PS_LOG_WARN, "cannot start the heartbeat thread; psd may declare this worker dead when it is idle");
}

static void link_close(psc_link *ln)
{
    hb_stop(ln);
    pthread_mutex_lock(&ln->lock);
    ps_client_close(&ln->cl);
    pthread_mutex_unlock(&ln->lock);
}

/* ---- requests ------------------------------------------------------------- */

/* Sends values[0..n) for the link's values [off, off + n) as chunks of type
 * INIT or PUSH (fin on the last), back back, without reading the OKs:
 * *sent counts the chunks that went. */
static int chunks_acks(psc_client *c, psc_link *ln, size_t sent, int count_drops);

static int chunks_out(psc_client *c, psc_link *ln, uint32_t type, const float *values, uint64_t off, size_t n,
                      uint64_t base, size_t *sent)
{
    *sent = 0;
    for (size_t k = 0; k < n; k += c->chunk) {
        size_t len = n - k < c->chunk ? n - k : c->chunk;
        ps_msg m;
        ps_msg_init(&m, type);
        m.has = PS_F_OFF | PS_F_DATA | PS_F_FIN | (type == PS_MSG_PUSH ? PS_F_BASE : 0);
        m.off = off + k;
        m.data = values + k;
        m.ndata = len;
        m.fin = k + len == n;
        m.base = base;
        int rc = ps_client_send(&ln->cl, &m);
        if (rc == 0 && c->pull_window == 0) /* option pull_window 0: each chunk waits for its OK */
            rc = chunks_acks(c, ln, 1, type == PS_MSG_PUSH && ln == c->links);
        else if (rc == 0)
            (*sent)++;
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Reads the OKs of `sent` chunks (psd answers in order). A push psd
 * dropped because its round had closed is counted, not an error. */
static int chunks_acks(psc_client *c, psc_link *ln, size_t sent, int count_drops)
{
    for (size_t i = 0; i < sent; i++) {
        ps_msg r;
        int rc = ps_client_recv(&ln->cl, &r, c->timeout_ms);
        if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_ESTALE) {
            if (count_drops)
                c->dropped += i + 1 == sent; /* the fin chunk's answer counts the step */
            continue;
        }
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_OK)
            return PS_EMALFORMED;
    }
    return 0;
}

/* Pulls the link's values [off, off + n) at version >= min into dst. */
static int pull_part(psc_client *c, psc_link *ln, float *dst, uint64_t off, uint64_t n, uint64_t min)
{
    unsigned window = c->pull_window ? c->pull_window : 1;
    return ps_client_pull_chunks(&ln->cl, dst, off, n, min, c->chunk, window, &ln->version, c->timeout_ms);
}

/* The model version a push to ln says its gradient was computed on. */
static uint64_t push_base(const psc_client *c, const psc_link *ln)
{
    return c->has_base && c->nlinks == 1 ? c->base : ln->version;
}

/* Sends ln's part of the gradient as a PUSHPULL that pulls the part back
 * at version >= min: through the segment when ln's psd mapped it (copying
 * the gradient there unless it is there already), else as data. */
static int pushpull_send(psc_client *c, psc_link *ln, uint64_t min)
{
    size_t n = ln->hi - ln->lo;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.base = push_base(c, ln);
    m.plen = n;
    m.min = min;
    if (ln->shm_ok) {
        if (c->grads != c->shm)
            memcpy(c->shm + ln->lo, c->grads + ln->lo, n * sizeof(float));
        m.has |= PS_F_LEN | PS_F_INSHM;
        m.len = n;
        m.inshm = 1;
    } else {
        m.has |= PS_F_DATA;
        m.data = c->grads + ln->lo;
        m.ndata = n;
    }
    return ps_client_send(&ln->cl, &m);
}

/* Reads the answer to pushpull_send into the parameter vector: over TCP
 * straight from the socket, through the segment from its second half
 * (no copy when the library's own vector is bound). */
static int pushpull_recv(psc_client *c, psc_link *ln)
{
    size_t n = ln->hi - ln->lo;
    float *dst = c->params + ln->lo;
    ps_msg r;
    if (ln->shm_ok) {
        int rc = ps_client_recv(&ln->cl, &r, c->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || !r.inshm || r.off != 0 || r.len != n)
            return PS_EMALFORMED;
        const float *src = c->shm + c->layout.total + ln->lo;
        if (src != dst)
            memcpy(dst, src, n * sizeof(float));
    } else {
        int rc = ps_client_recv_into(&ln->cl, &r, dst, n, c->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || r.off != 0 || r.ndata != n)
            return PS_EMALFORMED;
        if (r.data != dst)
            memcpy(dst, r.data, n * sizeof(float));
    }
    ln->version = r.mver;
    return 0;
}

/* Keeps the first error of a step (the one to reconnect for) and closes
 * link i when its stream may be out of step: the step goes on reading the
 * other links' replies, so every link left open has nothing outstanding,
 * and the reconnect opens the closed ones again. */
static void part_fail(psc_client *c, uint32_t i, int rc, int *first)
{
    if (*first == 0) {
        *first = rc;
        c->err[0] = '\0';
        c->err_link = i;
    }
    /* an interrupted wait keeps its links for the bye (c->desync) */
    if ((rc != PS_EREMOTE || i != c->err_link) && rc != PS_CLIENT_EINTR)
        link_close(&c->links[i]);
}

/* The part a step sends to first: the one after the part whose psd is on
 * this machine (answering through shared memory), or after this worker's
 * shard number when none or several are. Worker k of a model split over
 * psd co-located with the workers so starts at part k+1 and no psd
 * receives every worker's push at once (BytePS's staggered order; measured
 * in bench/README.md, multihost.py). */
static uint32_t first_part(const psc_client *c)
{
    uint32_t local = c->nlinks, nlocal = 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        if (c->links[i].shm_ok) {
            local = i;
            nlocal++;
        }
    return nlocal == 1 ? (local + 1) % c->nlinks : (c->shard + 1) % c->nlinks;
}

/* Ends a whole-model BSP step over a split model: a BARRIER on part 0's
 * psd, answered once every worker has this version, so that all start
 * their next round together (PROTOCOL.md, BARRIER; measured in
 * bench/README.md). When the parts' versions differ (a part closed a round
 * without this worker, around a loss or a rejoin) the worker withdraws
 * instead (version 0): its next step may wait for a part whose round needs
 * the others' next pushes, so they must not wait for it. A psd that does
 * not know BARRIER is not asked again. By default (auto) only when a part
 * is on another machine: on one machine no link is shared, and the round
 * trip would cost (W1 over 2 psd on loopback: 0.41-0.43 s an epoch
 * against 0.34-0.39 s without). */
static int barrier(psc_client *c)
{
    int remote = 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        remote |= c->links[i].remote;
    if (!c->barrier || (c->barrier < 0 && !remote) || c->barrier_refused || !c->bsp || c->nlinks < 2)
        return 0;
    psc_link *ln = &c->links[0];
    int in_step = 1;
    for (uint32_t i = 1; i < c->nlinks; i++)
        in_step &= c->links[i].version == ln->version;
    if (!in_step && !c->barrier_in)
        return 0; /* not taking part: nothing to say */
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_BARRIER);
    m.has = PS_F_MVER;
    m.mver = in_step ? ln->version : 0;
    int rc = ps_client_call(&ln->cl, &m, &r, c->timeout_ms);
    if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_EBAD_TYPE) {
        PS_LOG(PS_LOG_INFO, "%s: psd does not know barrier (an older psd); steps go on without it", ln->server);
        c->barrier_refused = 1;
        return 0;
    }
    if (rc == 0 && r.type != PS_MSG_OK)
        rc = PS_EMALFORMED;
    if (rc != 0) {
        int first = 0;
        part_fail(c, 0, rc, &first);
        return first;
    }
    c->barrier_in = in_step;
    return 0;
}

/* ---- a BSP step in pieces ------------------------------------------------- */

/* A part that a step sends in pieces: its psd closes BSP rounds piece by
 * piece (PROTOCOL.md, "Rounds in pieces") and answers over TCP, and option
 * pieces is on, or auto and the psd is on another machine (on this one no
 * link is shared and the pieces only cost). */
static int pieced(const psc_client *c, const psc_link *ln)
{
    return c->bsp && c->pieces && (c->pieces > 0 || ln->remote) && ln->piece && !ln->shm_ok && ln->cl.fd >= 0 &&
           ln->piece <= c->chunk && ln->hi - ln->lo > ln->piece;
}

/* The sending half of a step in pieces, on a thread of its own while the
 * caller reads: piece q of every pieced part (from first_part on), each
 * PUSH followed by the PULL of its range, then piece q + 1, so each psd
 * answers a piece as soon as every worker has pushed it. */
typedef struct pieces_job {
    psc_client *c;
    uint32_t start;
    int on[PS_PARTS_MAX];       /* the part goes in pieces (pieced at the start) */
    uint64_t ver[PS_PARTS_MAX]; /* each part's version at the step's start */
    int rc[PS_PARTS_MAX];       /* a part's send error */
    int rrc[PS_PARTS_MAX];      /* a part's receive error (its link is closed only
                                 * once the sending thread is done) */
} pieces_job;

static void *pieces_send(void *arg)
{
    pieces_job *j = arg;
    psc_client *c = j->c;
    for (uint64_t q = 0, more = 1; more; q++) {
        more = 0;
        for (uint32_t k = 0; k < c->nlinks; k++) {
            uint32_t i = (j->start + k) % c->nlinks;
            psc_link *ln = &c->links[i];
            uint64_t n = ln->hi - ln->lo, off = q * ln->piece;
            if (!j->on[i] || j->rc[i] || off >= n)
                continue;
            more = 1;
            uint64_t len = n - off < ln->piece ? n - off : ln->piece;
            ps_msg m;
            ps_msg_init(&m, PS_MSG_PUSH);
            m.has = PS_F_OFF | PS_F_DATA | PS_F_FIN | PS_F_BASE;
            m.off = off;
            m.data = c->grads + ln->lo + off;
            m.ndata = len;
            m.fin = off + len == n;
            m.base = j->ver[i];
            int rc = ps_client_send(&ln->cl, &m);
            if (rc == 0) {
                ps_msg_init(&m, PS_MSG_PULL);
                m.has = PS_F_OFF | PS_F_LEN | PS_F_MIN;
                m.off = off;
                m.len = len;
                m.min = j->ver[i] + 1;
                rc = ps_client_send(&ln->cl, &m);
            }
            j->rc[i] = rc;
        }
    }
    return NULL;
}

/* Reads the answers of the pieced parts as they come, whichever part they
 * come from (a part not read would stall its psd's replies on this
 * worker's receive window): each piece's OK and its values, straight into
 * the parameter vector. A part's slice of the plan is the one its last
 * answer that had one said. */
static void pieces_recv(psc_client *c, pieces_job *j)
{
    uint64_t acks[PS_PARTS_MAX] = {0}, vals[PS_PARTS_MAX] = {0}, np[PS_PARTS_MAX] = {0};
    uint64_t ver[PS_PARTS_MAX] = {0};
    int has_slice[PS_PARTS_MAX] = {0}, done[PS_PARTS_MAX] = {0}, live[PS_PARTS_MAX] = {0};
    ps_slice slice[PS_PARTS_MAX];
    for (uint32_t i = 0; i < c->nlinks; i++)
        if ((live[i] = j->on[i])) {
            uint64_t n = c->links[i].hi - c->links[i].lo;
            np[i] = (n + c->links[i].piece - 1) / c->links[i].piece;
            ver[i] = j->ver[i];
        }
    for (;;) {
        struct pollfd pf[PS_PARTS_MAX];
        uint32_t at[PS_PARTS_MAX], npf = 0;
        for (uint32_t i = 0; i < c->nlinks; i++)
            if (live[i] && (acks[i] < np[i] || vals[i] < np[i])) {
                pf[npf] = (struct pollfd){.fd = c->links[i].cl.fd, .events = POLLIN};
                at[npf++] = i;
            }
        if (!npf)
            break;
        int k = poll(pf, npf, c->timeout_ms > 0 ? c->timeout_ms : -1);
        if (k < 0 && errno == EINTR)
            continue;
        for (uint32_t f = 0; f < npf; f++) {
            uint32_t i = at[f];
            psc_link *ln = &c->links[i];
            int rc = 0;
            if (k == 0)
                rc = PS_ETIMEOUT;
            else if (k < 0)
                rc = PS_ECLOSED;
            else if (!pf[f].revents)
                continue;
            ps_msg r;
            if (rc == 0)
                rc = ps_client_recv(&ln->cl, &r, c->timeout_ms);
            if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_ESTALE) {
                acks[i]++; /* its round closed without this push: dropped, the pull answers */
                c->dropped += i == 0 && acks[i] == np[i]; /* a step counts once, by part 0's fin */
                continue;
            }
            if (rc == 0 && r.type == PS_MSG_OK && acks[i] < np[i]) {
                acks[i]++;
                continue;
            }
            if (rc == 0 && (r.type != PS_MSG_PARAMS || r.off % ln->piece || r.off + r.ndata > ln->hi - ln->lo))
                rc = PS_EMALFORMED;
            if (rc != 0) {
                j->rrc[i] = rc;
                live[i] = 0;
                continue;
            }
            memcpy(c->params + ln->lo + r.off, r.data, r.ndata * sizeof(float));
            vals[i]++;
            ver[i] = r.mver > ver[i] ? r.mver : ver[i];
            if (ln->cl.has_slice) {
                has_slice[i] = 1;
                slice[i] = ln->cl.slice;
            }
            done[i] |= ln->cl.done;
        }
    }
    for (uint32_t i = 0; i < c->nlinks; i++)
        if (np[i] && live[i]) {
            psc_link *ln = &c->links[i];
            ln->version = ver[i];
            ln->cl.has_slice = has_slice[i];
            if (has_slice[i])
                ln->cl.slice = slice[i];
            ln->cl.done = done[i];
        }
}

/* A whole-model step: every part's push goes out before any answer is
 * read, from first_part on, the psd on other machines (TCP) first, so
 * their bytes are on the wire while a psd on this machine handles its
 * part; parts of at most 2^20 values as one PUSHPULL each, answered
 * straight into the parameter vector; bigger ones as chunked pushes, then
 * chunked pulls. */
static int do_pushpull(psc_client *c)
{
    uint64_t v0 = c->links[0].version;
    size_t sent[PS_PARTS_MAX] = {0};
    int first = 0, small = 1, npieced = 0;
    for (uint32_t i = 0; i < c->nlinks; i++) {
        int p = pieced(c, &c->links[i]);
        npieced += p;
        small &= p || c->links[i].shm_ok || c->links[i].hi - c->links[i].lo <= c->chunk; /* the segment holds a part */
    }
    uint32_t start = first_part(c);
    /* the parts in pieces first: their sends on a thread, read below */
    pieces_job pj = {.c = c, .start = start};
    pthread_t sender;
    int sending = 0;
    if (npieced) {
        for (uint32_t i = 0; i < c->nlinks; i++) {
            pj.on[i] = pieced(c, &c->links[i]);
            pj.ver[i] = c->links[i].version;
        }
        if (start_thread(&sender, pieces_send, &pj) != 0)
            return lfail(c, 0, PS_ENOMEM);
        sending = 1;
    }
    for (int shm = 0; shm < 2; shm++)
        for (uint32_t j = 0; j < c->nlinks && !first; j++) {
            uint32_t i = (start + j) % c->nlinks;
            psc_link *ln = &c->links[i];
            if (pj.on[i])
                continue;
            if (small && ln->shm_ok != shm)
                continue;
            if (!small && shm)
                break;
            int rc = small ? pushpull_send(c, ln, c->bsp ? ln->version + 1 : 0)
                           : chunks_out(c, ln, PS_MSG_PUSH, c->grads + ln->lo, 0, ln->hi - ln->lo, push_base(c, ln),
                                        &sent[i]);
            if (rc != 0)
                part_fail(c, i, rc, &first);
            else if (small)
                sent[i] = 1;
        }
    if (sending) {
        pieces_recv(c, &pj);
        pthread_join(sender, NULL);
        for (uint32_t i = 0; i < c->nlinks; i++)
            if (pj.rc[i] != 0 || pj.rrc[i] != 0)
                part_fail(c, i, pj.rc[i] ? pj.rc[i] : pj.rrc[i], &first);
    }
    /* the replies in the same order: psd p's replies then go to its
     * workers one after another (each worker reads a different part
     * first), not all at once to the one every worker reads first (a
     * reply not being read stalls on the worker's receive window) */
    for (uint32_t j = 0; j < c->nlinks; j++) {
        uint32_t i = (start + j) % c->nlinks;
        if (!sent[i])
            continue;
        int rc = small ? pushpull_recv(c, &c->links[i]) : chunks_acks(c, &c->links[i], sent[i], i == 0);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    for (uint32_t j = 0; j < c->nlinks && !small && !first; j++) {
        uint32_t i = (start + j) % c->nlinks;
        psc_link *ln = &c->links[i];
        if (pj.on[i])
            continue;
        int rc = pull_part(c, ln, c->params + ln->lo, 0, ln->hi - ln->lo, c->bsp ? ln->version + 1 : 0);
        if (rc != 0) {
            part_fail(c, i, rc, &first);
            if (rc != PS_CLIENT_EINTR)
                link_close(ln); /* chunk pulls of its window may be outstanding */
        }
    }
    if (first)
        return first;
    if (small && c->bsp && c->links[0].version > v0 + 1)
        c->dropped++; /* the round closed without our push */
    else if (small && c->bsp && c->links[0].cl.done && c->links[0].version == v0)
        c->dropped++; /* a push after the plan's last round */
    c->version = c->links[0].version;
    c->pushed = 0;
    c->step_in = 1;
    return barrier(c);
}

/* Pushes values [off, off + len) of the gradient to every psd whose part
 * they touch: all chunks out first, then the OKs. */
static int do_push(psc_client *c, uint64_t off, uint64_t len)
{
    size_t sent[PS_PARTS_MAX] = {0};
    int first = 0;
    for (uint32_t i = 0; i < c->nlinks && !first; i++) {
        psc_link *ln = &c->links[i];
        uint64_t a = off > ln->lo ? off : ln->lo, b = off + len < ln->hi ? off + len : ln->hi;
        if (a >= b)
            continue;
        int rc = chunks_out(c, ln, PS_MSG_PUSH, c->grads + a, a - ln->lo, (size_t)(b - a), push_base(c, ln), &sent[i]);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    for (uint32_t i = 0; i < c->nlinks; i++) {
        if (!sent[i])
            continue;
        int rc = chunks_acks(c, &c->links[i], sent[i], i == 0);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    if (first)
        return first;
    c->pushed = 1;
    return 0;
}

/* Pulls values [off, off + len) into the parameter vector. */
static int do_pull(psc_client *c, uint64_t off, uint64_t len)
{
    int first = 0;
    for (uint32_t i = 0; i < c->nlinks && !first; i++) {
        psc_link *ln = &c->links[i];
        uint64_t a = off > ln->lo ? off : ln->lo, b = off + len < ln->hi ? off + len : ln->hi;
        if (a >= b)
            continue;
        int rc = pull_part(c, ln, c->params + a, a - ln->lo, b - a, c->bsp && c->pushed ? ln->version + 1 : 0);
        if (rc != 0) {
            part_fail(c, i, rc, &first);
            if (rc != PS_CLIENT_EINTR)
                link_close(ln);
        }
    }
    if (first)
        return first;
    c->version = c->links[0].version;
    if (off == 0 && len == c->layout.total)
        c->pushed = 0;
    return 0;
}

/* ---- connecting ----------------------------------------------------------- */

/* Connects ln and says hello, offering the segment when there is one;
 * *need_init: this psd asks for initial values. */
static int link_hello(psc_client *c, psc_link *ln, int *need_init)
{
    ps_msg m, r;
    hb_stop(ln);
    ln->cl.interrupted = c->interrupt ? &c->intr : NULL;
    pthread_mutex_lock(&ln->lock);
    int rc = ps_client_connect(&ln->cl, ln->server, c->quick ? 1000 : 10000);
    pthread_mutex_unlock(&ln->lock);
    if (rc != 0)
        return rc;
    ln->remote = !ps_sock_same_host(ln->cl.fd);
    if (c->send_buffer && setsockopt(ln->cl.fd, SOL_SOCKET, SO_SNDBUF, &c->send_buffer, sizeof c->send_buffer) != 0)
        PS_LOG(PS_LOG_WARN, "%s: cannot set the send buffer to %d bytes: %s", ln->server, c->send_buffer,
               strerror(errno));
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_WORKER;
    m.shard = c->shard;
    m.nshards = c->nshards;
    m.layout = &ln->layout;
    m.fp = ps_layout_fingerprint(&ln->layout);
    if (c->want_plan) {
        m.has |= PS_F_PLAN;
        m.plan = c->plan;
    }
    ln->cl.interrupted = c->interrupt ? &c->intr : NULL;
    ln->cl.wire_dt = PS_DT_F32; /* until this psd's welcome offers more */
    ln->shm_ok = 0;
    if (ln == &c->links[0])
        c->barrier_in = 0; /* a new connection takes part from its first BARRIER */
    if (c->shm) {
        m.has |= PS_F_SHM;
        m.shm_pid = (uint32_t)getpid();
        m.shm_fd = (uint32_t)c->shm_fd;
        if (c->nlinks > 1) {
            /* this part of both halves: [lo, hi) and [n + lo, n + hi) */
            m.shm_at = 1;
            m.shm_goff = ln->lo;
            m.shm_poff = c->layout.total + ln->lo;
        }
    }
    rc = ps_client_hello(&ln->cl, &m, c->token.len ? c->token.b : NULL, c->token.len, &r, c->timeout_ms);
    if (rc != 0)
        return rc;
    ln->shm_ok = c->shm && (r.has & PS_F_INSHM) && r.inshm;
    if (c->want_shm && !c->shm_logged) {
        if (ln->shm_ok)
            PS_LOG(PS_LOG_INFO, "tensors through shared memory with psd at %s", ln->server);
        else
            PS_LOG(PS_LOG_DEBUG, "tensors over TCP: psd at %s did not map our shared memory (another machine "
                                 "or user; its log says why)", ln->server);
    }
    if (c->want_dt != PS_DT_F32) {
        if ((r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(c->want_dt)))
            ln->cl.wire_dt = c->want_dt;
        else
            PS_LOG(PS_LOG_WARN, "psd at %s does not offer %s tensors (wire_bf16 = no, or an older psd): "
                                "sending float32", ln->server, ps_dtype_name(c->want_dt));
    }
    /* float32 pushes without their zeros: bit for bit the same values */
    ln->cl.skip_zeros = c->skip_zeros && ln->cl.wire_dt == PS_DT_F32 && (r.has & PS_F_WIRE) &&
                        (r.wire & PS_WIRE_BIT(PS_DT_F32Z));
    /* and compressed, where the link is slower than the compressor: by
     * default only to a psd on another machine */
    ln->cl.compress = (c->compress > 0 || (c->compress < 0 && ln->remote)) && ln->cl.wire_dt == PS_DT_F32 &&
                      (r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(PS_DT_F32ZSTD));
    ln->cl.zrest = 0;
    snprintf(ln->mode, sizeof ln->mode, "%s", r.mode);
    ln->version = r.mver;
    ln->has_plan = (r.has & PS_F_PLAN) != 0;
    ln->plan = r.plan;
    ln->piece = (r.has & PS_F_PIECE) ? r.piece : 0;
    ln->cl.has_slice = ln->cl.done = 0; /* until this connection's first PARAMS */
    *need_init = r.need_init;
    uint64_t hb = (r.has & PS_F_HB) ? r.hb : 0;
    ln->hb_interval_ms = hb ? (hb / 3 > 50 ? hb / 3 : 50) : 0;
    return 0;
}

/* A failed open closes every link it connected (fresh[i]), so the next
 * attempt says hello, sends initial values and pulls on each again. */
static int open_fail(psc_client *c, const int *fresh, uint32_t i, int rc)
{
    for (uint32_t k = 0; k < c->nlinks; k++)
        if (fresh[k])
            link_close(&c->links[k]);
    if (c->err[0])
        return rc;
    return lfail(c, i, rc);
}

/* Connects every link not connected, says hello, gives initial values to
 * a psd that asks (the parameter vector as it is), pulls each fresh part
 * and starts its heartbeats. */
static int do_open(psc_client *c)
{
    int need_init[PS_PARTS_MAX] = {0}, fresh[PS_PARTS_MAX] = {0};
    c->err[0] = '\0';
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        if (ln->cl.fd >= 0)
            continue;
        fresh[i] = 1;
        int rc = link_hello(c, ln, &need_init[i]);
        if (rc != 0)
            return open_fail(c, fresh, i, rc);
    }
    c->shm_logged |= c->want_shm;
    c->shm_ok = 0;
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        c->shm_ok |= ln->shm_ok;
        if (strcmp(ln->mode, c->links[0].mode) != 0) {
            fail(c, PSC_EINVAL, "psd at %s runs %s but psd at %s runs %s: every psd holding a part of the model "
                                "must run the same mode", c->links[0].server, c->links[0].mode, ln->server, ln->mode);
            return open_fail(c, fresh, i, PSC_EINVAL);
        }
    }
    snprintf(c->mode, sizeof c->mode, "%s", c->links[0].mode);
    c->bsp = strcmp(c->mode, "bsp") == 0;
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        if (!fresh[i])
            continue;
        if (need_init[i] && c->connected)
            PS_LOG(PS_LOG_WARN, "psd at %s has no model (restarted without its state?): giving it ours", ln->server);
        size_t sent = 0;
        int rc = need_init[i] ? chunks_out(c, ln, PS_MSG_INIT, c->params + ln->lo, 0, ln->hi - ln->lo, 0, &sent) : 0;
        if (rc == 0)
            rc = chunks_acks(c, ln, sent, 0);
        if (rc == 0)
            rc = pull_part(c, ln, c->params + ln->lo, 0, ln->hi - ln->lo, 0);
        if (rc != 0)
            return open_fail(c, fresh, i, rc);
    }
    c->version = c->links[0].version;
    c->pushed = 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        if (fresh[i])
            hb_start(&c->links[i]);
    return 0;
}

/* rc means the connection is gone, psd is restarting or full, so trying
 * again may help; not errors that would repeat (a layout psd does not
 * hold, a bad shard or token, a protocol version). */
static int recoverable(const psc_client *c, int rc)
{
    const ps_client *cl = &c->links[c->err_link].cl;
    switch (rc) {
    case PS_ECLOSED:
    case PS_EIO:
    case PS_ECONNECT:
    case PS_ETIMEOUT:
        return 1;
    case PS_EREMOTE:
        /* psd shutting down or full; our old connection not yet noticed
         * gone; the worker giving initial values left before finishing */
        /* a shard taken is our own old connection, not yet noticed gone,
         * only when reconnecting: at the first connect it is another
         * worker's, which retrying does not change */
        return cl->remote_code == -PS_ESHUTDOWN || (cl->remote_code == -PS_ESHARD && c->connected) ||
               cl->remote_code == -PS_ENOT_READY || cl->remote_code == -PS_ELIMIT;
    default:
        return 0;
    }
}

/* psd's own code for a refusal: PSC_EREMOTE becomes the code psd sent
 * when it is one the header lists. */
static int public_code(const psc_client *c, int rc)
{
    if (rc == PS_CLIENT_EINTR)
        return PSC_EINTR;
    if (rc != PS_EREMOTE || !c->links)
        return rc;
    int32_t code = c->links[c->err_link].cl.remote_code; /* positive, as on the wire */
    return code >= 1 && code <= 23 ? -code : rc;
}

/* A refusal that trying again cannot change: said at once, in words that
 * say what to do. Returns the public code. */
static int refused(psc_client *c, int rc)
{
    int code = public_code(c, rc);
    if (code == PSC_ESHARD && !c->connected) {
        char why[600];
        snprintf(why, sizeof why, "%.590s", psc_errmsg(c));
        return fail(c, code, "psd at %.280s refused shard %u/%u (%s); every worker of a job needs a shard of its "
                             "own (--shard K/M, or auto under a launcher), and a worker that was just stopped holds "
                             "its shard until psd notices (heartbeat_timeout); not retried",
                    c->links[c->err_link].server, c->shard, c->nshards, why);
    }
    return code;
}

/* Sleeps ms; returns PS_CLIENT_EINTR when a signal ends it early and the
 * option interrupt is on, else 0. */
static int sleep_ms(psc_client *c, uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        if (c->interrupt) {
            c->intr = 1;
            return PS_CLIENT_EINTR;
        }
    return 0;
}

/* Opens until it works, with exponential backoff (100 ms doubling to 5 s,
 * full jitter) for up to limit_ms; what: "reconnect" or "connect". */
static int open_retry(psc_client *c, int limit_ms, const char *first)
{
    int64_t start = mono_ms(), deadline = start + limit_ms;
    uint64_t delay = 100;
    unsigned seed = (unsigned)(c->shard * 2654435761u) ^ (unsigned)start ^ (unsigned)getpid();
    for (int attempt = 1;; attempt++) {
        if (attempt > 1 || c->connected) {
            uint64_t ms = delay / 2 + (uint64_t)rand_r(&seed) % (delay / 2 + 1);
            int64_t now = mono_ms();
            if (now + (int64_t)ms > deadline)
                ms = deadline > now ? (uint64_t)(deadline - now) : 0;
            if (sleep_ms(c, ms) != 0)
                return fail(c, PSC_EINTR, "psc_%s: interrupted by a signal while waiting for psd at %.280s",
                            c->connected ? "reconnect" : "connect", c->links[c->err_link].server);
        }
        c->quick = attempt == 1 && !c->connected;
        int rc = do_open(c);
        c->quick = 0;
        if (rc == 0) {
            if (c->connected)
                PS_LOG(PS_LOG_INFO, "reconnected to psd at %s after %.1f s (attempt %d): mode %s, model version "
                                    "%" PRIu64, c->links[c->err_link].server, (double)(mono_ms() - start) / 1e3,
                       attempt, c->mode, c->version);
            return 0;
        }
        uint32_t li = c->err_link;
        if (!recoverable(c, rc))
            return refused(c, rc);
        if (mono_ms() >= deadline) {
            char why[300];
            snprintf(why, sizeof why, "%.290s", first ? first : psc_errmsg(c));
            return fail(c, rc == PS_EREMOTE ? public_code(c, rc) : (c->connected ? PSC_ETIMEOUT : rc),
                        "psd at %.280s unreachable for %.0f s (%.300s); giving up (the %s limit)",
                        c->links[li].server, (double)(mono_ms() - start) / 1e3, why,
                        c->connected ? "reconnect_s" : "connect_s");
        }
        if (attempt == 1 && !c->connected)
            PS_LOG(PS_LOG_INFO, "waiting for psd at %s (%s); trying for up to %d s (connect_s)",
                   c->links[li].server, psc_errmsg(c), limit_ms / 1000);
        delay = delay * 2 > 5000 ? 5000 : delay * 2;
    }
}

int psc_connect(psc_client *c)
{
    if (c->closed)
        return fail(c, PSC_ESTATE, "psc_connect: the client is closed");
    if (c->connected)
        return fail(c, PSC_ESTATE, "psc_connect: already connected");
    int rc = fix_layout(c);
    if (rc != 0)
        return rc;
    c->intr = 0;
    rc = open_retry(c, c->connect_ms, NULL);
    waiting_clear(c); /* its pull may have waited */
    if (rc == 0)
        c->connected = 1;
    return rc;
}

static int reconnect(psc_client *c)
{
    char first[300];
    snprintf(first, sizeof first, "%.290s", psc_errmsg(c));
    PS_LOG(PS_LOG_WARN, "lost psd at %s (%s); reconnecting for up to %d s", c->links[c->err_link].server, first,
           c->reconnect_ms / 1000);
    link_close(&c->links[c->err_link]);
    if (c->nlinks > 1 && c->bsp && c->links[0].has_plan) {
        /* A planned BSP job over several psd: the psd this worker lost may
         * have declared it lost and gone on without it, while the others
         * kept it and wait for its push, which it would send only after
         * that psd's next round (a worker that comes back waits for one),
         * which waits for the others: a standstill. Leaving every psd and
         * saying hello to all again puts it out of every part's round, so
         * each takes it back at its next round (PROTOCOL.md 8, "The plan"). */
        PS_LOG(PS_LOG_INFO, "a planned bsp job over %u psd: leaving every part's round, to rejoin each at its next",
               c->nlinks);
        for (uint32_t i = 0; i < c->nlinks; i++)
            link_close(&c->links[i]);
    }
    int rc = open_retry(c, c->reconnect_ms, first);
    if (rc == 0)
        c->reconnects++;
    return rc;
}

/* ---- the public operations ------------------------------------------------ */

static int ready(psc_client *c, const char *what)
{
    if (c->closed)
        return fail(c, PSC_ESTATE, "%s: the client is closed", what);
    if (!c->connected)
        return fail(c, PSC_ESTATE, "%s: not connected (psc_connect first)", what);
    if (busy(c))
        return fail(c, PSC_EBUSY, "%s: a step is in flight (psc_wait first)", what);
    return 0;
}

enum op { OP_PUSHPULL, OP_PUSH, OP_PULL };

/* Runs one operation; a lost connection is reconnected (the step is then
 * lost) when the option says so. */
static int run_step(psc_client *c, enum op op, uint64_t off, uint64_t len);

static int run(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    waiting_clear(c);
    c->intr = 0;
    if (c->desync) {
        /* the last call's wait was interrupted, maybe mid-frame: these
         * connections are unusable; new ones (the model pulled anew) */
        for (uint32_t i = 0; i < c->nlinks; i++)
            link_close(&c->links[i]);
        int rc = open_retry(c, c->reconnect_ms, NULL);
        if (rc != 0)
            return rc;
        c->desync = 0;
    }
    int rc = run_step(c, op, off, len);
    if (rc == PSC_EINTR)
        c->desync = 1;
    waiting_clear(c);
    return rc;
}

static int run_step(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    c->step_in = 0;
    int rc = op == OP_PUSHPULL ? do_pushpull(c) : op == OP_PUSH ? do_push(c, off, len) : do_pull(c, off, len);
    if (op != OP_PULL)
        c->has_base = 0;
    if (rc == 0)
        return 0;
    if (c->auto_reconnect && recoverable(c, rc)) {
        rc = reconnect(c);
        if (rc == 0 && op != OP_PULL && !c->step_in)
            c->lost++;
        if (rc == 0 && op == OP_PULL)
            rc = do_pull(c, off, len); /* the open pulled the parts it reconnected; this is the rest */
        return rc;
    }
    return public_code(c, rc);
}

static int range_ok(psc_client *c, const char *what, uint64_t off, uint64_t len)
{
    if (len == 0 || off > c->layout.total || len > c->layout.total - off)
        return fail(c, PSC_ERANGE, "%s: [%" PRIu64 ", %" PRIu64 "+%" PRIu64 ") is not inside the model's %" PRIu64
                                   " values", what, off, off, len, c->layout.total);
    return 0;
}

int psc_pushpull(psc_client *c)
{
    int rc = ready(c, "psc_pushpull");
    return rc ? rc : run(c, OP_PUSHPULL, 0, c->layout.total);
}

int psc_push(psc_client *c)
{
    int rc = ready(c, "psc_push");
    return rc ? rc : run(c, OP_PUSH, 0, c->layout.total);
}

int psc_pull(psc_client *c)
{
    int rc = ready(c, "psc_pull");
    return rc ? rc : run(c, OP_PULL, 0, c->layout.total);
}

int psc_push_range(psc_client *c, uint64_t off, uint64_t len)
{
    int rc = ready(c, "psc_push_range");
    if (rc == 0)
        rc = range_ok(c, "psc_push_range", off, len);
    return rc ? rc : run(c, OP_PUSH, off, len);
}

int psc_pull_range(psc_client *c, uint64_t off, uint64_t len)
{
    int rc = ready(c, "psc_pull_range");
    if (rc == 0)
        rc = range_ok(c, "psc_pull_range", off, len);
    return rc ? rc : run(c, OP_PULL, off, len);
}

int psc_push_tensor(psc_client *c, const char *name)
{
    uint64_t off, len;
    if (psc_tensor_find(c, name, &off, &len) != 0)
        return fail(c, PSC_ENOTFOUND, "psc_push_tensor: no tensor called '%.80s'", name ? name : "(null)");
    return psc_push_range(c, off, len);
}

int psc_pull_tensor(psc_client *c, const char *name)
{
    uint64_t off, len;
    if (psc_tensor_find(c, name, &off, &len) != 0)
        return fail(c, PSC_ENOTFOUND, "psc_pull_tensor: no tensor called '%.80s'", name ? name : "(null)");
    return psc_pull_range(c, off, len);
}

int psc_set_base(psc_client *c, uint64_t version)
{
    int rc = ready(c, "psc_set_base");
    if (rc != 0)
        return rc;
    /* never ahead of the model (psd refuses that): after a reconnect to a
     * psd restarted from an older checkpoint the version may have gone back */
    c->has_base = 1;
    c->base = version < c->version ? version : c->version;
    return 0;
}

/* ---- the asynchronous step ------------------------------------------------ */

static void *async_main(void *arg)
{
    psc_client *c = arg;
    pthread_mutex_lock(&c->async_mu);
    for (;;) {
        while (!c->async_pending && !c->async_stop)
            pthread_cond_wait(&c->async_cv, &c->async_mu);
        if (c->async_stop)
            break;
        pthread_mutex_unlock(&c->async_mu);
        int rc = run(c, OP_PUSHPULL, 0, c->layout.total);
        pthread_mutex_lock(&c->async_mu);
        c->async_rc = rc;
        c->async_pending = 0;
        pthread_cond_broadcast(&c->async_cv);
    }
    pthread_mutex_unlock(&c->async_mu);
    return NULL;
}

int psc_pushpull_start(psc_client *c)
{
    int rc = ready(c, "psc_pushpull_start");
    if (rc != 0)
        return rc;
    if (!c->async_running) {
        if (start_thread(&c->async_thread, async_main, c) != 0)
            return fail(c, PSC_ENOMEM, "cannot start the library's step thread");
        c->async_running = 1;
    }
    pthread_mutex_lock(&c->async_mu);
    c->async_rc = 0;
    c->async_pending = 1;
    pthread_cond_broadcast(&c->async_cv);
    pthread_mutex_unlock(&c->async_mu);
    return 0;
}

int psc_wait(psc_client *c)
{
    if (!c->async_running)
        return 0;
    pthread_mutex_lock(&c->async_mu);
    while (c->async_pending)
        pthread_cond_wait(&c->async_cv, &c->async_mu);
    int rc = c->async_rc;
    c->async_rc = 0;
    pthread_mutex_unlock(&c->async_mu);
    return rc;
}

int psc_poll(psc_client *c)
{
    return !busy(c);
}

static void async_stop(psc_client *c)
{
    if (!c->async_running)
        return;
    psc_wait(c);
    pthread_mutex_lock(&c->async_mu);
    c->async_stop = 1;
    pthread_cond_broadcast(&c->async_cv);
    pthread_mutex_unlock(&c->async_mu);
    pthread_join(c->async_thread, NULL);
    c->async_running = 0;
    c->async_stop = 0;
}

/* ---- the job -------------------------------------------------------------- */

/* Every psd keeps the workers' reports, so each one's status shows the
 * job's progress. */
int psc_report(psc_client *c, uint32_t epoch, double loss, double acc, double test_loss, uint64_t samples,
               double rate)
{
    int rc = ready(c, "psc_report");
    for (uint32_t i = 0; rc == 0 && i < c->nlinks; i++) {
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_REPORT);
        m.has = PS_F_EPOCH | PS_F_LOSS | PS_F_SAMPLES | PS_F_RATE;
        m.epoch = epoch;
        m.loss = loss;
        m.samples = samples;
        m.rate = rate;
        if (acc >= 0) {
            m.has |= PS_F_ACC | PS_F_TLOSS;
            m.acc = acc;
            m.tloss = test_loss;
        }
        rc = ps_client_call(&c->links[i].cl, &m, &r, c->timeout_ms);
        if (rc != 0) {
            lfail(c, i, rc);
            if (c->auto_reconnect && recoverable(c, rc) && (rc = reconnect(c)) == 0)
                i--; /* and report to it again */
            else
                rc = public_code(c, rc);
        }
    }
    return rc;
}

int psc_progress(psc_client *c, uint32_t epoch, double loss_sum, uint64_t n)
{
    if (!isfinite(loss_sum))
        return fail(c, PSC_EINVAL, "psc_progress: the loss sum is %g, not a finite number", loss_sum);
    c->prog_loss += loss_sum;
    c->prog_n += n;
    c->prog_total += n;
    int64_t now = mono_ms();
    if (!c->prog_last_ms)
        c->prog_last_ms = now; /* the first interval starts with the first step told of */
    if (!c->report_ms || now - c->prog_last_ms < c->report_ms || !c->prog_n)
        return 0;
    int rc = psc_wait(c); /* a step in flight shares the connection */
    if (rc != 0)
        return rc;
    double loss = c->prog_loss / (double)c->prog_n;
    double rate = (double)c->prog_n * 1000.0 / (double)(now - c->prog_last_ms);
    c->prog_last_ms = now;
    c->prog_loss = 0;
    c->prog_n = 0;
    return psc_report(c, epoch, loss, -1, 0, c->prog_total, rate);
}

/* From the first psd: every psd sees the same workers come and go. */
int psc_live_shards(psc_client *c, uint32_t *rank, uint32_t *count)
{
    int rc = ready(c, "psc_live_shards");
    if (rc != 0)
        return rc;
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_STATUS);
    rc = ps_client_call(&c->links[0].cl, &m, &r, c->timeout_ms);
    if (rc != 0)
        return public_code(c, lfail(c, 0, rc));
    const msgpack_object *ws = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "workers") : NULL;
    if (!ws || ws->type != MSGPACK_OBJECT_ARRAY)
        return fail(c, PSC_EMALFORMED, "psd's status has no list of workers");
    uint32_t lost = 0, lost_below = 0;
    for (uint32_t i = 0; i < ws->via.array.size; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        const msgpack_object *sh = ps_map_get(w, "shard"), *st = ps_map_get(w, "state");
        if (!sh || sh->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !st || st->type != MSGPACK_OBJECT_STR)
            return fail(c, PSC_EMALFORMED, "psd's status lists a worker without shard or state");
        if (sh->via.u64 >= c->nshards || sh->via.u64 == c->shard || st->via.str.size != 4 ||
            memcmp(st->via.str.ptr, "lost", 4) != 0)
            continue;
        lost++; /* psd keeps one entry per shard */
        lost_below += sh->via.u64 < c->shard;
    }
    *count = c->nshards - lost;
    *rank = c->shard - lost_below;
    return 0;
}

/* ---- a BSP job's plan ----------------------------------------------------- */

int psc_plan_set(psc_client *c, uint64_t epochs, uint64_t samples, uint64_t batch, uint64_t seed)
{
    if (c->connected || c->closed)
        return fail(c, PSC_ESTATE, "psc_plan_set: only before psc_connect");
    if (epochs < 1 || epochs > PS_PLAN_EPOCHS_MAX || samples < 1 || samples > PS_PLAN_SAMPLES_MAX || batch < 1 ||
        batch > samples)
        return fail(c, PSC_EINVAL, "psc_plan_set: need 1 <= epochs <= 2^20, 1 <= samples <= 2^40 and 1 <= batch <= "
                                   "samples (got %llu, %llu, %llu)",
                    (unsigned long long)epochs, (unsigned long long)samples, (unsigned long long)batch);
    c->plan = (ps_plan){.epochs = epochs, .samples = samples, .batch = batch, .seed = seed};
    c->want_plan = 1;
    return 0;
}

/* The plan and the slices are the first psd's: with a model split over
 * several, each counts the same rounds. */
int psc_plan(const psc_client *c, uint64_t *epochs, uint64_t *samples, uint64_t *batch, uint64_t *seed)
{
    if (!c->links || !c->links[0].has_plan)
        return 0;
    const ps_plan *p = &c->links[0].plan;
    if (epochs)
        *epochs = p->epochs;
    if (samples)
        *samples = p->samples;
    if (batch)
        *batch = p->batch;
    if (seed)
        *seed = p->seed;
    return 1;
}

int psc_plan_slice(const psc_client *c, uint64_t *epoch, uint64_t *lo, uint64_t *hi, uint32_t *rank,
                   uint32_t *count)
{
    if (!c->links || !c->links[0].has_plan || !c->links[0].cl.has_slice)
        return 0;
    const ps_slice *s = &c->links[0].cl.slice;
    if (epoch)
        *epoch = s->epoch;
    if (lo)
        *lo = s->lo;
    if (hi)
        *hi = s->hi;
    if (rank)
        *rank = s->rank;
    if (count)
        *count = s->count;
    return 1;
}

int psc_plan_done(const psc_client *c)
{
    return c->links && c->links[0].has_plan && c->links[0].cl.done;
}

int psc_reconnect(psc_client *c)
{
    int rc = ready(c, "psc_reconnect");
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < c->nlinks; i++)
        link_close(&c->links[i]);
    c->err_link = 0;
    rc = open_retry(c, c->reconnect_ms, "asked to reconnect");
    if (rc == 0)
        c->reconnects++;
    return rc;
}

/* ---- what psd said -------------------------------------------------------- */

const char *psc_mode(const psc_client *c)
{
    return c->mode;
}

uint64_t psc_model_version(const psc_client *c)
{
    return c->version;
}

void psc_shard(const psc_client *c, uint32_t *k, uint32_t *m)
{
    if (k)
        *k = c->shard;
    if (m)
        *m = c->nshards;
}

uint32_t psc_servers(const psc_client *c)
{
    if (c->nlinks)
        return c->nlinks;
    uint32_t n = 1;
    for (const char *p = c->servers; *p; p++)
        n += *p == ',';
    return n;
}

const char *psc_wire(const psc_client *c)
{
    return c->links && c->links[0].cl.wire_dt == PS_DT_BF16 ? "bf16" : "f32";
}

int psc_shm(const psc_client *c)
{
    return c->shm_ok;
}

uint64_t psc_reconnects(const psc_client *c)
{
    return c->reconnects;
}

uint64_t psc_lost_steps(const psc_client *c)
{
    return c->lost;
}

uint64_t psc_dropped(const psc_client *c)
{
    return c->dropped;
}

/* ---- closing -------------------------------------------------------------- */

void psc_close(psc_client *c)
{
    psc_leave(c, NULL);
}

void psc_leave(psc_client *c, const char *reason)
{
    if (!c || c->closed)
        return;
    async_stop(c);
    size_t rlen = reason ? strlen(reason) : 0;
    if (rlen > 200)
        rlen = 200; /* psd keeps a line; the rest would be cut there */
    c->intr = 0; /* the bye goes after an interrupted wait too */
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        hb_stop(ln);
        if (ln->cl.fd >= 0) {
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_BYE);
            if (rlen) {
                m.has |= PS_F_TEXT;
                m.text = reason;
                m.text_len = (uint32_t)rlen;
            }
            /* after an interrupted wait the reply may never be read
             * (the connection is mid-frame): psd acts on the bye anyway */
            ps_client_call(&ln->cl, &m, &r, c->desync ? 1000 : 5000);
        }
        link_close(ln);
    }
    c->closed = 1;
    c->connected = 0;
}

void psc_free(psc_client *c)
{
    if (!c)
        return;
    psc_close(c);
    unmake_links(c);
    ps_token_clear(&c->token);
    pthread_mutex_destroy(&c->async_mu);
    pthread_cond_destroy(&c->async_cv);
    pthread_mutex_destroy(&c->wait_mu);
    free(c);
}
