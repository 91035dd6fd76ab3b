/* psbench_rounds.c - BSP rounds of 2 workers against MPI_Allreduce of the
 * same floats (bench/mpi_allreduce, over TCP and shared memory), with psd
 * over TCP, through shared memory and in 2 parts, repeated and alternated
 * (--round-reps). */
#include "psbench.h"

/* ---- MPI_Allreduce --------------------------------------------------------- */

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
void compare_rounds(const opts *o, const float *grad)
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
