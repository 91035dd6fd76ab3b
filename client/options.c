/* options.c - libpsclient: the options: one table row each (psc_option), psc_set looking keys
 * up in it, and shard auto from a launcher's environment. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

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
            return psc__fail(c, PSC_EINVAL, "shard auto: %s is set (%.40s) but %s is not", launchers[i].index, ks,
                        launchers[i].count);
        if (ps_parse_u64(ks, 65535, &a) || ps_parse_u64(ms, 65536, &b) || b == 0 || a >= b)
            return psc__fail(c, PSC_EINVAL, "shard auto: %s=%.40s and %s=%.40s do not make a shard K of M with 0 <= K < M",
                        launchers[i].index, ks, launchers[i].count, ms);
        c->shard = (uint32_t)a;
        c->nshards = (uint32_t)b;
        PS_LOG(PS_LOG_DEBUG, "shard auto: %u/%u from %s (%s, %s)", c->shard, c->nshards, launchers[i].launcher,
               launchers[i].index, launchers[i].count);
        return 0;
    }
    return psc__fail(c, PSC_EINVAL,
                "shard auto: no launcher told this process its shard: set OMPI_COMM_WORLD_RANK and "
                "OMPI_COMM_WORLD_SIZE (mpirun does), SLURM_PROCID and SLURM_NTASKS (srun does), RANK and "
                "WORLD_SIZE (torchrun does), or JOB_COMPLETION_INDEX and PSD_WORKERS (Kubernetes indexed Job), "
                "or give the shard as K/M");
}

/* The table below is the one list of libpsclient's options: psc_set looks a
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
    return psc__fail(c, PSC_EINVAL, "bad %s '%.100s': %s", r->info.name, value, r->info.values);
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

/* "off" (-1) or a descriptor open for reading without blocking */
static int set_fd(psc_client *c, const opt_row *r, const char *value)
{
    uint64_t v;
    if (strcmp(value, "off") == 0) {
        c->wakeup_fd = -1;
        return 0;
    }
    if (ps_parse_u64(value, INT_MAX, &v))
        return bad_value(c, r, value);
    int fl = fcntl((int)v, F_GETFL);
    if (fl < 0 || !(fl & O_NONBLOCK) || (fl & O_ACCMODE) == O_WRONLY)
        return psc__fail(c, PSC_EINVAL, "bad %s '%.100s': %s", r->info.name, value,
                         fl < 0 ? "not an open descriptor" : "it must be open for reading and non-blocking (O_NONBLOCK)");
    c->wakeup_fd = (int)v;
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
        return psc__fail(c, PSC_EINVAL, "%s", err);
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

static int set_topk(psc_client *c, const opt_row *r, const char *value)
{
    char *end = NULL;
    double v = strtod(value, &end);
    if (!*value || *end || !(v == 0 || (v >= 1e-5 && v <= 1)))
        return bad_value(c, r, value);
    c->topk = v;
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
    {{"server", "server", "HOST:PORT", "host:port, host:port,host:port,..., each part maybe host:port/host:port",
      "$PSD_SERVER, else 127.0.0.1:7000",
      "psd's address; HOST:PORT,HOST:PORT,...: a model split over that many psd, one part each, in order (every "
      "worker lists them alike); HOST:PORT/HOST:PORT: a part's replicas, the worker going on with the next when "
      "one is lost or follows a leader"},
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
    {{"topk", "topk", "RATIO", "0 (off) or 0.00001..1", "0",
      "top-k with error feedback: a push sends, of each tensor, only this ratio of its values (the largest of "
      "gradient plus residual, as float32 without zeros) and keeps the rest in a residual the next push adds in, "
      "so nothing is lost; e.g. 0.01. After a push the gradient vector holds what was sent. Not with wire bf16 or "
      "skip_zeros off"},
     OPT_BEFORE_CONNECT, set_topk, 0, 0, 0, 1, 0, 0},
    {{"shm", "shm", "on|off", "on or off", "on",
      "offer psd a shared-memory segment for the tensors: a psd on this machine, of the same user, maps it and "
      "pushes and pulls skip the TCP copies (models of at most 2^20 values, or 2^20 per psd; not with a step in "
      "flight, psc_pushpull_start); and a table segment, through which table pulls and pushes go as float32; "
      "elsewhere they go over TCP as ever"},
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
    {{"spin_us", "spin", "US", "0..1000000 microseconds", "0",
      "each wait for psd's reply first polls the connection this many microseconds, yielding the CPU between "
      "polls, and only then sleeps, so that psd need not wake a sleeping thread (on a virtual machine whose idle "
      "CPUs halt that costs psd an interrupt between CPUs each reply); for workers on psd's machine that have "
      "cores psd does not use (not the waits of option pieces); 0: sleep at once"},
     OPT_BEFORE_CONNECT, set_uint, 0, 1000000, 0, 1, OPT_FIELD(spin_us), OPT_INT},
    {{"interrupt", NULL, "on|off", "on or off", "off",
      "a signal handled while a call waits for psd ends the call with PSC_EINTR (the connection reconnects at "
      "the next call); off: waits go on through signals; psc_wait is not interrupted"},
     OPT_BEFORE_CONNECT, set_onoff, 0, 0, 0, 1, OPT_FIELD(interrupt), 0},
    {{"wakeup_fd", NULL, "FD|off", "off or a descriptor open for reading, non-blocking", "off",
      "with interrupt on, a descriptor that a signal makes readable (a self-pipe, as Python's "
      "signal.set_wakeup_fd makes; the Python package sets one up): every wait watches it beside its "
      "connection, so a signal that lands just before the wait sleeps, or on another thread, still ends the "
      "call with PSC_EINTR; each call empties it when it begins"},
     OPT_BEFORE_CONNECT, set_fd, 0, 0, 0, 1, 0, 0},
    {{"barrier", "barrier", "auto|on|off", "auto, on or off", "auto",
      "a bsp step over a split model ends at a barrier on the first psd, so that every worker starts its next "
      "round together; auto: when a psd is on another machine"},
     OPT_BEFORE_CONNECT, set_auto, 0, 0, 0, 1, OPT_FIELD(barrier), 0},
    {{"pieces", "pieces", "auto|on|off", "auto, on or off", "auto",
      "a bsp step sends a part whose psd closes rounds in pieces (bsp_piece) piece by piece, and reads every "
      "psd's answers as they come; auto: when that psd is on another machine"},
     OPT_BEFORE_CONNECT, set_auto, 0, 0, 0, 1, OPT_FIELD(pieces), 0},
    {{"reader", NULL, "on|off", "on or off", "off",
      "a reader: the hello says so, and a follower of a part (a read replica) then answers this client's pulls and "
      "table pulls, each saying how far behind its leader it is (psc_lag); it pushes nothing (a follower refuses "
      "a push with NOT_LEADER, a leader with FORBIDDEN) and takes no shard of the job"},
     OPT_BEFORE_CONNECT, set_onoff, 0, 0, 0, 1, OPT_FIELD(reader), 0},
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
        return c ? psc__fail(c, PSC_EINVAL, "psc_set: key and value must not be NULL") : PSC_EINVAL;
    const opt_row *r = NULL;
    for (size_t i = 0; i < NOPTIONS && !r; i++)
        if (strcmp(key, options[i].info.name) == 0)
            r = &options[i];
    if (!r) {
        char names[512] = "";
        size_t n = 0;
        for (size_t i = 0; i < NOPTIONS && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", options[i].info.name);
        return psc__fail(c, PSC_EINVAL, "unknown option '%.100s' (%s)", key, names);
    }
    if (r->when != OPT_ANY_TIME && (c->connected || c->closed))
        return psc__fail(c, PSC_ESTATE, "psc_set %.60s: only before psc_connect", key);
    if (r->when == OPT_BEFORE_LAYOUT && c->fixed)
        return psc__fail(c, PSC_ESTATE, "psc_set %s: only before the layout is fixed (psc_params, psc_grads, psc_bind, "
                                   "psc_connect)", r->info.name);
    return r->set(c, r, value);
}
