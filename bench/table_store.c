/* table_store.c - the cost of psd's row store alone, in one process: the
 * calls psd makes for one TPUSHPULL of psbench --table
 * (srv_tables_first_dup_hint and srv_tables_push of a batch's keys,
 * srv_tables_pull of the next batch's), with no socket, no codec and no
 * other process, so that the figure moves little with the machine's other
 * load. Batches of distinct
 * keys drawn from Zipf(s) over a key space, each rank scattered over 64 bits
 * as psbench does; one pass over every batch stores their rows first.
 * Prints ns a row (pushed or pulled: a round is 2 x keys rows), the median
 * round of each trial, the best trial; and the ns a key of each of the
 * three calls (each one's median round in that trial). A program that prints figures, not
 * a test.
 *
 * Each push goes through the row hint of the pull before it, as psd's
 * pushes do on a connection (srv_row_hint); `nohint` after the optimizer:
 * without. `peer` after it: a second thread plays the worker of a table
 * segment (PROTOCOL.md 13.9) from another CPU. Before each round it writes
 * the request (the keys to push, their gradients, the keys to pull) into
 * buffers the store then reads, and after it reads the pulled rows, so
 * that the store meets these lines in the other CPU's cache, as psd does;
 * only the store's calls are timed.
 *
 *   build/bench/table_store [dim [keys [key_space [zipf [optimizer [nohint] [peer]]]]]]
 *   build/bench/table_store 16 4096 1000000 1.1 adagrad     (the defaults)
 */
#define _GNU_SOURCE /* sched_setaffinity, pthread_setaffinity_np */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/table.h"
#include "server/tables/table.h"

#define BATCHES 32
#define ROUNDS 200
#define TRIALS 5

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *must(void *p)
{
    if (!p) {
        fprintf(stderr, "table_store: out of memory\n");
        exit(1);
    }
    return p;
}

/* The worker's side of `peer`: the rounds' requests written, their
 * answers read, each in turn with the store's calls (turn: even, the
 * peer's; odd, the store's). */
typedef struct peer {
    pthread_t th;
    atomic_uint turn;
    unsigned nk, dim;
    const uint8_t *keys;   /* every batch's keys */
    const float *g;        /* the gradients the peer writes */
    uint8_t *push, *pull;  /* the request's keys */
    float *grad, *rows;    /* the request's gradients; the answer's rows */
    int rounds;
    volatile float sink;
} peer;

static void *peer_run(void *arg)
{
    peer *p = arg;
    const size_t kb = (size_t)p->nk * 8, gf = (size_t)p->nk * p->dim;
    for (int r = 0; r < p->rounds; r++) {
        while (atomic_load_explicit(&p->turn, memory_order_acquire) != 2u * (unsigned)r)
            ;
        if (r > 0) { /* the answer before */
            float s = 0;
            for (size_t i = 0; i < gf; i++)
                s += p->rows[i];
            p->sink = s;
        }
        memcpy(p->push, p->keys + (size_t)(r % BATCHES) * kb, kb);
        memcpy(p->pull, p->keys + (size_t)((r + 1) % BATCHES) * kb, kb);
        memcpy(p->grad, p->g, sizeof(float) * gf);
        atomic_store_explicit(&p->turn, 2u * (unsigned)r + 1u, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned dim = argc > 1 ? (unsigned)atoi(argv[1]) : 16, nk = argc > 2 ? (unsigned)atoi(argv[2]) : 4096;
    uint64_t space = argc > 3 ? strtoull(argv[3], NULL, 10) : 1000000;
    double s = argc > 4 ? atof(argv[4]) : 1.1;
    const char *opt = argc > 5 ? argv[5] : "adagrad";
    int use_hint = 1, use_peer = 0;
    for (int a = 6; a < argc; a++)
        if (strcmp(argv[a], "nohint") == 0)
            use_hint = 0;
        else if (strcmp(argv[a], "peer") == 0)
            use_peer = 1;
        else {
            fprintf(stderr, "table_store: '%s': nohint or peer\n", argv[a]);
            return 2;
        }
    srv_row_hint hint = {0};
    if (dim < 1 || dim > PS_TABLE_DIM_MAX || nk < 1 || space < nk || s < 0) {
        fprintf(stderr, "usage: table_store [dim (1..%d) [keys [key_space (>= keys) [zipf (>= 0) [optimizer [nohint] [peer]]]]]]\n",
                PS_TABLE_DIM_MAX);
        return 2;
    }
    /* batches of nk distinct ranks by Zipf(s): the inverse of the CDF */
    double *cdf = must(malloc(space * sizeof *cdf)), total = 0;
    for (uint64_t i = 0; i < space; i++)
        cdf[i] = total += s > 0 ? pow((double)(i + 1), -s) : 1.0;
    uint32_t *seen = must(calloc(space, sizeof *seen));
    uint8_t *keys = must(malloc((size_t)BATCHES * nk * 8));
    uint64_t rng = 88172645463325252ull;
    for (uint32_t b = 0; b < BATCHES; b++)
        for (unsigned n = 0; n < nk;) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            double u = (double)(rng >> 11) * 0x1p-53 * total;
            uint64_t lo = 0, hi = space - 1;
            while (lo < hi) {
                uint64_t m = lo + (hi - lo) / 2;
                if (cdf[m] < u)
                    lo = m + 1;
                else
                    hi = m;
            }
            if (seen[lo] == b + 1)
                continue;
            seen[lo] = b + 1;
            uint64_t key = ps_mix64(lo + 1);
            for (int i = 0; i < 8; i++)
                keys[((size_t)b * nk + n) * 8 + i] = (uint8_t)(key >> (8 * i));
            n++;
        }
    free(cdf);
    free(seen);

    char err[512];
    ps_table_def d;
    ps_hp hp = {0};
    srv_tables ts;
    uint32_t ti;
    srv_tables_init(&ts, UINT64_MAX);
    if (ps_table_def_make(&d, "emb", dim, "uniform", 1, 0.05, 1, opt, &hp, err, sizeof err) != 0 ||
        srv_tables_declare(&ts, &d, &ti, err, sizeof err) != 0) {
        fprintf(stderr, "table_store: %s\n", err);
        return 2;
    }
    float *g = must(malloc(sizeof(float) * nk * dim)), *rows = must(malloc(sizeof(float) * nk * dim));
    for (size_t i = 0; i < (size_t)nk * dim; i++) /* small, finite, not all equal: psbench's */
        g[i] = 1e-3f * ((float)((i * 2654435761u >> 16) & 1023) / 1023.0f - 0.5f);
    for (uint32_t b = 0; b < BATCHES; b++)
        if (srv_tables_push(&ts, ti, keys + (size_t)b * nk * 8, nk, g, 1.0, err, sizeof err) != 0) {
            fprintf(stderr, "table_store: %s\n", err);
            return 1;
        }
    /* each phase's median over the rounds of the best trial, too */
    double t[ROUNDS], ph[3][ROUNDS], best = INFINITY, best_ph[3] = {0, 0, 0};
    /* peer: this thread on the lowest CPU it may run on, the peer on the next */
    peer pr = {.nk = nk, .dim = dim, .keys = keys, .g = g, .rounds = ROUNDS};
    cpu_set_t main_cpu, peer_cpu;
    if (use_peer) {
        cpu_set_t may;
        int c0 = -1, c1 = -1;
        if (sched_getaffinity(0, sizeof may, &may) == 0)
            for (int c = 0; c < CPU_SETSIZE && c1 < 0; c++)
                if (CPU_ISSET(c, &may))
                    *(c0 < 0 ? &c0 : &c1) = c;
        if (c1 < 0) {
            fprintf(stderr, "table_store: peer needs two CPUs (taskset -c A,B: the store on the lower, the peer on "
                            "the higher)\n");
            return 2;
        }
        CPU_ZERO(&main_cpu);
        CPU_SET(c0, &main_cpu);
        CPU_ZERO(&peer_cpu);
        CPU_SET(c1, &peer_cpu);
        sched_setaffinity(0, sizeof main_cpu, &main_cpu);
        pr.push = must(malloc((size_t)nk * 8));
        pr.pull = must(malloc((size_t)nk * 8));
        pr.grad = must(malloc(sizeof(float) * nk * dim));
        pr.rows = rows;
    }
    for (int trial = 0; trial < TRIALS; trial++) {
        if (use_peer) {
            atomic_store(&pr.turn, 0u);
            if (pthread_create(&pr.th, NULL, peer_run, &pr) != 0) {
                fprintf(stderr, "table_store: no thread for the peer\n");
                return 1;
            }
            pthread_setaffinity_np(pr.th, sizeof peer_cpu, &peer_cpu);
        }
        for (int r = 0; r < ROUNDS; r++) {
            const uint8_t *push = keys + (size_t)(r % BATCHES) * nk * 8, *pull = keys + (size_t)((r + 1) % BATCHES) * nk * 8;
            const float *grad = g;
            if (use_peer) {
                while (atomic_load_explicit(&pr.turn, memory_order_acquire) != 2u * (unsigned)r + 1u)
                    ;
                push = pr.push, pull = pr.pull, grad = pr.grad;
            }
            uint32_t a, b;
            double t0 = now();
            if (srv_tables_first_dup_hint(&ts, ti, push, nk, use_hint ? &hint : NULL, &a, &b) != 0) {
                fprintf(stderr, "table_store: round %d: a key twice\n", r);
                return 1;
            }
            double t1 = now();
            if (srv_tables_push_hint(&ts, ti, push, nk, grad, 1.0, use_hint ? &hint : NULL, err, sizeof err) != 0) {
                fprintf(stderr, "table_store: round %d: %s\n", r, err);
                return 1;
            }
            double t2 = now();
            srv_tables_pull_hint(&ts, ti, pull, nk, rows, use_hint ? &hint : NULL);
            double t3 = now();
            t[r] = t3 - t0;
            ph[0][r] = t1 - t0;
            ph[1][r] = t2 - t1;
            ph[2][r] = t3 - t2;
            if (use_peer)
                atomic_store_explicit(&pr.turn, 2u * (unsigned)r + 2u, memory_order_release);
        }
        if (use_peer)
            pthread_join(pr.th, NULL);
        qsort(t, ROUNDS, sizeof t[0], by_value);
        if (t[ROUNDS / 2] < best) {
            best = t[ROUNDS / 2];
            for (int p = 0; p < 3; p++) {
                qsort(ph[p], ROUNDS, sizeof ph[p][0], by_value);
                best_ph[p] = ph[p][ROUNDS / 2];
            }
        }
    }
    srv_table_stats st;
    srv_tables_stats(&ts, ti, &st);
    printf("table_store: dim %u, %s, %u keys a batch (Zipf %.2f over %llu), %llu rows stored: %.1f ns a row "
           "(push + pull of %u rows each, median round of %d, best of %d trials): %.1f M rows/s on one core\n",
           dim, opt, nk, s, (unsigned long long)space, (unsigned long long)st.rows, best * 1e9 / (2.0 * nk), nk,
           ROUNDS, TRIALS, 2.0 * nk / best / 1e6);
    printf("table_store: ns a key of a round (medians): duplicate check %.1f, push %.1f, pull %.1f%s\n",
           best_ph[0] * 1e9 / nk, best_ph[1] * 1e9 / nk, best_ph[2] * 1e9 / nk,
           use_peer ? " (requests and answers through a peer on another CPU)" : "");
    srv_row_hint_free(&hint);
    srv_tables_free(&ts);
    free(keys);
    free(g);
    free(rows);
    free(pr.push);
    free(pr.pull);
    free(pr.grad);
    return 0;
}
