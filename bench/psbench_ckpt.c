/* psbench_ckpt.c - --ckpt-stall G: pull latency of K workers while psd writes
 * a checkpoint of a table of G GB, against the same pulls without one, with
 * the checkpoint's time, file and psd's memory. */
#include "psbench.h"

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

void run_ckpt_stall(const opts *o)
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
