/* psbench_pairs.c - --replica-pairs N: what a sync follower costs, measured
 * in one run: N pairs of psd cells, the first without a follower and the
 * second with one (--replica's), one after the other, so that a machine
 * whose speed drifts meets both sides of each ratio alike. The table cell
 * with --table, else the dense cell of each size and worker count (the
 * first of --modes). Prints each pair and the ratios' median and range;
 * writes replica_pairs.csv. */
#include "psbench.h"

/* One cell's figure: rows/s (table: pushed + pulled) or GB/s (dense). */
static double figure(const opts *o, const cell_result *r)
{
    return o->table ? r->rt_per_s * 2.0 * o->nkeys : r->gbps;
}

/* n pairs of (S, K): without, then with a follower, printed and in csv; 1 when a cell failed. */
static int pairs(const opts *o, const table_inputs *ti, const float *grad, uint64_t S, int K, FILE *csv)
{
    opts plain = *o, repl = *o;
    plain.replica = 0;
    repl.replica = 1;
    int n = o->replica_pairs, failed = 0;
    double without[64], with[64], ratio[64];
    const char *unit = o->table ? "M rows/s" : "GB/s";
    double scale = o->table ? 1e-6 : 1.0;
    for (int i = 0; i < n; i++) {
        cell_result c[2];
        for (int k = 0; k < 2; k++) {
            if (o->table) {
                table_cell(k ? &repl : &plain, SYS_PSD, K, ti, &c[k]);
            } else {
                row r;
                run_cell(k ? &repl : &plain, SYS_PSD, o->modes[0], S, K, grad, 0, &r);
                c[k] = r.r;
            }
        }
        without[i] = c[0].ok ? figure(o, &c[0]) : NAN;
        with[i] = c[1].ok ? figure(o, &c[1]) : NAN;
        ratio[i] = c[0].ok && c[1].ok ? with[i] / without[i] : NAN;
        printf("%s K=%d", o->table ? "table" : mode_names[o->modes[0]], K);
        if (!o->table)
            printf(" S=%" PRIu64, S);
        printf(" pair %d: without a follower %.3f %s (p99 %.2f ms), with one %.3f (p99 %.2f ms): %.3f  load %.2f\n",
               i + 1, without[i] * scale, unit, c[0].p99_ms, with[i] * scale, c[1].p99_ms, ratio[i], c[1].load);
        for (int k = 0; k < 2; k++)
            if (!c[k].ok)
                printf("    %s: %s\n", k ? "with a follower" : "without", c[k].err), failed = 1;
        fprintf(csv, "%s,%" PRIu64 ",%d,%d,%.6g,%.6g,%.4f,%.4f,%.4f,%.2f\n", o->table ? "table" : mode_names[o->modes[0]],
                o->table ? 0 : S, K, i + 1, without[i], with[i], ratio[i], c[0].p99_ms, c[1].p99_ms, c[1].load);
        fflush(stdout);
    }
    double lo, hi;
    range_of(ratio, n, &lo, &hi);
    printf("  median of %d pairs: with/without %.3f (%.3f..%.3f); without %.3f %s, with %.3f\n\n", n,
           median_of(ratio, n), lo, hi, median_of(without, n) * scale, unit, median_of(with, n) * scale);
    return failed;
}

void run_replica_pairs(const opts *o)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/replica_pairs.csv", o->out);
    FILE *csv = fopen(path, "w");
    if (!csv)
        die("cannot write %s: %s", path, strerror(errno));
    fprintf(csv, "cell,floats,workers,pair,without,with,ratio,p99_ms_without,p99_ms_with,load1\n");
    printf("psbench --replica-pairs %d: psd %s, %ld CPUs, %.1f s per cell; each pair: psd without a follower, then\n"
           "with one (--replica-of, replication sync, the timing once it is in sync)%s\n\n",
           o->replica_pairs, o->psd, sysconf(_SC_NPROCESSORS_ONLN), o->seconds,
           follower_cpu >= 0 ? "; the follower alone on its CPU (--follower-cpu)" : "");
    int failed = 0;
    if (o->table) {
        table_inputs ti;
        table_inputs_make(o, &ti);
        for (int wi = 0; wi < o->nworkers; wi++)
            failed |= pairs(o, &ti, NULL, 0, o->workers[wi], csv);
        table_inputs_free(&ti);
    } else {
        uint64_t smax = 0;
        for (int i = 0; i < o->nsizes; i++)
            smax = o->sizes[i] > smax ? o->sizes[i] : smax;
        float *grad = malloc(smax * sizeof(float));
        if (!grad)
            die("out of memory for %" PRIu64 " floats", smax);
        for (uint64_t i = 0; i < smax; i++) /* small, finite, not all equal */
            grad[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);
        for (int si = 0; si < o->nsizes; si++)
            for (int wi = 0; wi < o->nworkers; wi++)
                failed |= pairs(o, NULL, grad, o->sizes[si], o->workers[wi], csv);
        free(grad);
    }
    fclose(csv);
    printf("CSV: %s, psd logs: %s/logs/\n", path, o->out);
    if (failed)
        exit(1);
}
