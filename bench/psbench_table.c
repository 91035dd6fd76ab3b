/* psbench_table.c - --table: rows by key through psd's embedding tables
 * (psc_table_pushpull) against the plain-TCP ceiling of the same bytes, per
 * worker count, in alternated pairs of cells. */
#include "psbench.h"

/* ---- the table mode --------------------------------------------------------- */

/* splitmix64: the keys' generator (seeded per worker) */
uint64_t sm64(uint64_t *x)
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
    pid_t pid, follower = -1;
    if (sys == SYS_PSD) {
        snprintf(logpath, sizeof logpath, "%s/logs/psd-table-%u-%u-%d.log", o->out, o->dim, o->nkeys, K);
        pid = psd_start(o, MODE_ASGD, K, 4, logpath, err, sizeof err, &port, o->replica ? info_log : NULL);
        if (pid >= 0 && o->replica) {
            follower = follower_start(o, MODE_ASGD, K, 4, logpath, port, err, sizeof err);
            if (follower < 0) {
                child_stop(pid);
                pid = -1;
            }
            b.insync_log = logpath;
        }
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
    if (follower > 0)
        child_stop(follower);
}

/* --table: rows per second through psd's tables against the plain-TCP
 * ceiling of the same bytes, per worker count, in --table-reps pairs of
 * cells (the ceiling, then psd) so that a machine whose speed drifts
 * meets both sides of each ratio alike; table.csv beside the rest. */
void table_inputs_make(const opts *o, table_inputs *ti)
{
    int kmax = 0;
    for (int wi = 0; wi < o->nworkers; wi++)
        kmax = o->workers[wi] > kmax ? o->workers[wi] : kmax;
    size_t nk = o->nkeys, nv = (size_t)o->nkeys * o->dim;
    ti->nbatch = 16;
    ti->batches = malloc((size_t)kmax * (size_t)ti->nbatch * nk * sizeof *ti->batches);
    ti->grad = malloc(nv * sizeof *ti->grad);
    ti->req = malloc(nk * (16 + 4 * (size_t)o->dim));
    if (!ti->batches || !ti->grad || !ti->req)
        die("out of memory");
    for (size_t i = 0; i < nv; i++) /* small, finite, not all equal */
        ti->grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);
    memset(ti->req, 7, nk * (16 + 4 * (size_t)o->dim));
    table_batches(o, kmax, ti->nbatch, ti->batches);
}

void table_inputs_free(table_inputs *ti)
{
    free(ti->batches);
    free(ti->grad);
    free(ti->req);
}

void table_cell(const opts *o, int sys, int K, const table_inputs *ti, cell_result *out)
{
    run_table_cell(o, sys, K, ti->grad, ti->batches, ti->nbatch, ti->req, out);
}

void run_tables(const opts *o)
{
    table_inputs ti;
    table_inputs_make(o, &ti);
    int nbatch = ti.nbatch;
    size_t nk = o->nkeys;
    uint64_t *batches = ti.batches;
    float *grad = ti.grad;
    char *req = ti.req;
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
    table_inputs_free(&ti);
    if (failed)
        exit(1);
}
