/* psbench_dense.c - the dense grid: a cell per (mode, S, K), psd against the
 * ceiling, with a model split over 2 psd where asked; the printed table, the
 * CSV and the gnuplot PNG. */
#include "psbench.h"

/* ---- the grid ------------------------------------------------------------- */

static double bound_mib(int mode, uint64_t S, int K, int replica)
{
    /* 1.1 x (model + SGD momentum) + 64 MiB; BSP may add one model-sized
     * accumulator (bsp-arrival), and deterministic summation (bsp: sums in
     * shard order, whatever the arrival order) one gradient per worker;
     * with a follower (asgd), the replication log holds each worker's last
     * push in the receive buffer it came in until the follower fetched it,
     * and keeps one buffer it let go for the next receive */
    double model = (double)S * sizeof(float) / 1048576.0;
    double extra = mode == MODE_ASGD ? 0.0 : mode == MODE_BSP ? K * model : model;
    if (replica && mode == MODE_ASGD)
        extra += (K + 1) * model;
    return 1.1 * 2.0 * model + 64.0 + extra;
}

/* Part i of n of a model of S values, [*lo, *hi), as the workers split it
 * (proto/PROTOCOL.md 6.2: inner boundaries at multiples of 1024 values);
 * -1 when S is under 1024 x n. */
int part_bounds(uint64_t S, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi)
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
void run_cell_parts(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm,
                    int nparts, row *out)
{
    bench b = {0};
    char err[700] = "";
    char logpath[PATH_MAX];
    int port = 0;
    pid_t pid[MAX_LINKS] = {-1, -1};
    pid_t follower = -1; /* --replica */
    int npid = 0;
    memset(out, 0, sizeof *out);
    out->mode = sys == SYS_PSD ? mode : -1;
    out->S = S;
    out->K = K;
    out->wire = o->wire;
    out->bound_mib = bound_mib(mode, S, K, o->replica);
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
            pid[i] = psd_start(o, mode, K, S, logpath, err, sizeof err, &port, o->replica ? info_log : NULL);
            if (pid[i] >= 0 && o->replica) {
                follower = follower_start(o, mode, K, S, logpath, port, err, sizeof err);
                if (follower < 0) {
                    child_stop(pid[i]);
                    pid[i] = -1;
                }
                b.insync_log = logpath;
            }
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
    if (follower > 0)
        child_stop(follower);
}

void run_cell(const opts *o, int sys, int mode, uint64_t S, int K, const float *grad, int shm, row *out)
{
    run_cell_parts(o, sys, mode, S, K, grad, shm, 1, out);
}

const char *size_label(uint64_t S, char *buf, size_t len)
{
    if (S >= 1000000 && S % 1000000 == 0)
        snprintf(buf, len, "%" PRIu64 "M", S / 1000000);
    else
        snprintf(buf, len, "%" PRIu64, S);
    return buf;
}

void print_header(uint32_t wire)
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

void print_row(const row *p, const row *t)
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

void csv_header(FILE *f)
{
    fprintf(f, "mode,floats,workers,ok,round_trips,seconds,rt_per_s,gb_per_s,p50_ms,p99_ms,mean_ms,psd_cpu,"
               "client_cpu,tcp_rt_per_s,tcp_gb_per_s,tcp_p50_ms,tcp_p99_ms,tcp_mean_ms,tcp_server_cpu,"
               "ratio_gb_per_s,ratio_rt_per_s,psd_peak_rss_mib,psd_rss_end_mib,bound_mib,within_bound,"
               "lag_p50_ms,lag_p99_ms,lag_max_ms,load1,wire\n");
}

void csv_row(FILE *f, const row *p, const row *t)
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

/* ---- plot ------------------------------------------------------------------ */

/* Writes psbench.dat (one gnuplot data block per series) and psbench.gp,
 * and runs gnuplot when it is on PATH. */
void plot(const opts *o, const row *rows, int nrows, const row *tcp, int ntcp)
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
