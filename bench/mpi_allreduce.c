/* mpi_allreduce.c - times MPI_Allreduce (sum) of S floats, the yardstick
 * for a BSP round of psd (bench/README.md).
 *
 * Run under mpirun with 2 ranks; the transport is mpirun's choice:
 *   mpirun -np 2 --mca pml ob1 --mca btl tcp,self mpi_allreduce 235146 10000000
 *   mpirun -np 2 --mca pml ob1 --mca btl vader,self mpi_allreduce ...
 * Options: --seconds T (time per size, default 2), --max-iters N (1000).
 *
 * For each size rank 0 times one warm-up call, picks the number of calls
 * that fits in T seconds (at least 3); every rank then times each of that
 * many back-to-back calls, and a call's time is the largest over
 * the ranks. Rank 0 prints one line per size:
 *   allreduce floats=S iters=N mean_ms=... p50_ms=... p99_ms=...
 * which psbench reads. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double p)
{
    int i = (int)(p * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* Times MPI_Allreduce of n floats; rank 0 prints the line. Returns 0 or -1
 * when out of memory (on any rank: all ranks then stop together). */
static int time_size(long n, double seconds, int max_iters, int rank)
{
    float *in = malloc((size_t)n * sizeof(float));
    float *out = malloc((size_t)n * sizeof(float));
    double *t = malloc((size_t)max_iters * sizeof(double));
    int ok = in && out && t, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all_ok) {
        if (rank == 0)
            fprintf(stderr, "mpi_allreduce: out of memory for %ld floats\n", n);
        free(in);
        free(out);
        free(t);
        return -1;
    }
    for (long i = 0; i < n; i++)
        in[i] = 1e-3f * (float)(i % 1000);
    memset(out, 0, (size_t)n * sizeof(float)); /* fault the pages in before timing */

    /* warm-up: connections, registration, page faults */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&one, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = slowest > 0 ? (int)(seconds / slowest) : max_iters;
    if (iters < 3)
        iters = 3;
    if (iters > max_iters)
        iters = max_iters;
    MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int k = 0; k < iters; k++) {
        double a = MPI_Wtime();
        MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        t[k] = MPI_Wtime() - a;
    }
    double total = MPI_Wtime() - start;
    /* a call took as long as its slowest rank */
    MPI_Allreduce(MPI_IN_PLACE, t, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        printf("allreduce floats=%ld iters=%d mean_ms=%.4f p50_ms=%.4f p99_ms=%.4f\n", n, iters,
               1e3 * total / iters, 1e3 * pct(t, iters, 0.50), 1e3 * pct(t, iters, 0.99));
        fflush(stdout);
    }
    free(in);
    free(out);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    int rank = 0, size = 0;
    double seconds = 2.0;
    int max_iters = 1000;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (strcmp(argv[i], "--max-iters") == 0 && i + 1 < argc) {
            max_iters = atoi(argv[++i]);
            if (max_iters < 3)
                max_iters = 3;
        } else {
            char *end;
            long n = strtol(argv[i], &end, 10);
            if (*end || n < 1 || n > 0x7fffffffL) {
                if (rank == 0)
                    fprintf(stderr, "mpi_allreduce: bad size '%s' (floats, 1..2^31-1)\n", argv[i]);
                rc = 2;
                break;
            }
            if (time_size(n, seconds, max_iters, rank) != 0) {
                rc = 1;
                break;
            }
        }
    }
    if (rank == 0 && size != 2)
        fprintf(stderr, "mpi_allreduce: note: %d ranks (psbench compares with 2)\n", size);
    MPI_Finalize();
    return rc;
}
