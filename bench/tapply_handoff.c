/* tapply_handoff - what handing a table push to other threads costs psd's
 * loop: table_apply = hogwild's own pool (server/update/tapply.c: a queue,
 * a condition variable, a uv_async_t back) against libuv's uv_queue_work
 * (its shared pool, its own completion), each against stepping the rows on
 * the loop (table_apply = ordered's srv_tables_push), on the same jobs.
 *
 * S streams, each with one push in flight at a time as a connection has in
 * psd (the next one queued when the last is handed back), push K distinct
 * keys of a table of dim D with AdaGrad, drawn from a key space stored
 * before the timing. Prints pushes/s, rows/s and the mean time from
 * queueing a push to its hand-back on the loop, per way, in turns (ABCABC)
 * so that the machine's other load falls on each alike. A program that
 * prints figures, not a test.
 *
 *   tapply_handoff [-s streams] [-k keys] [-d dim] [-t seconds] [-r turns] [-n threads] [-x]
 *
 * -x runs uv_queue_work before the own pool in each turn.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "proto/errors.h"
#include "proto/msg.h"
#include "proto/table.h"
#include "server/tables/sparse_optim.h"
#include "server/tables/table.h"
#include "server/update/tapply.h"

#define MAX_STREAMS 16
#define SPACE 200000

enum { WAY_ORDERED, WAY_POOL, WAY_UVWORK, WAYS };
static const char *const way_name[WAYS] = {"ordered (on the loop)", "own pool + uv_async", "uv_queue_work"};

typedef struct bench bench;

typedef struct stream {
    bench *b;
    uint32_t idx;
    uint64_t n;             /* pushes handed back */
    uint64_t rng;
    uint8_t *keys;
    uv_work_t req;          /* WAY_UVWORK */
    float **rows;
    double t_queued;
} stream;

struct bench {
    uv_loop_t loop;
    uv_timer_t stop;
    srv_tables ts;
    uint32_t ti;
    ps_table_def def;
    uint32_t S, K, D;
    float *g;
    int way;
    int stopping;
    srv_tapply *pool;
    stream st[MAX_STREAMS];
    double lat_sum;
    uint64_t lat_n;
    uint32_t inflight;      /* pushes queued and not handed back */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t xs(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* K distinct keys of the stream's, from the key space (a random start,
 * stepping by a stride coprime to it). */
static void draw(bench *b, stream *s)
{
    uint64_t start = xs(&s->rng) % SPACE, stride = 7919;
    for (uint32_t i = 0; i < b->K; i++) {
        uint64_t k = (start + (uint64_t)i * stride) % SPACE * 0x9e3779b97f4a7c15ull + 1;
        memcpy(s->keys + 8 * (size_t)i, &k, 8);
    }
}

static void next(bench *b, stream *s);

static void handed_back(bench *b, stream *s)
{
    b->lat_sum += now_s() - s->t_queued;
    b->lat_n++;
    b->inflight--;
    s->n++;
    if (!b->stopping)
        next(b, s);
}

static void on_pool_done(void *arg, const srv_tapply_tag *tag, const srv_tapply_result *r)
{
    bench *b = arg;
    (void)r;
    handed_back(b, &b->st[tag->id]);
}

static void uv_step(uv_work_t *req)
{
    stream *s = req->data;
    bench *b = s->b;
    const uint32_t rf = srv_sparse_row_floats(&b->def);
    float tmp[3 * PS_TABLE_DIM_MAX + 1];
    for (uint32_t k = 0; k < b->K; k++) {
        float *row = s->rows[k];
        memcpy(tmp, row, sizeof(float) * rf);
        if (srv_sparse_step(&b->def, tmp, b->g + (size_t)k * b->D, 1.0))
            memcpy(row, tmp, sizeof(float) * rf);
    }
}

static void uv_after(uv_work_t *req, int status)
{
    (void)status;
    stream *s = req->data;
    handed_back(s->b, s);
}

static void drain_uv(void *arg)
{
    (void)arg; /* the key space is stored before the timing: no row is removed */
}

static void next(bench *b, stream *s)
{
    char err[512];
    draw(b, s);
    s->t_queued = now_s();
    b->inflight++;
    if (b->way == WAY_POOL) {
        srv_tapply_tag tag = {.id = s->idx, .type = PS_MSG_TPUSH, .ti = b->ti};
        if (srv_tapply_push(b->pool, &b->ts, b->ti, s->keys, b->K, b->g, &tag, NULL, 0, err, sizeof err) != 1) {
            fprintf(stderr, "tapply_handoff: %s\n", err);
            exit(1);
        }
    } else if (b->way == WAY_UVWORK) {
        if (srv_tables_pin(&b->ts, b->ti, s->keys, b->K, s->rows, drain_uv, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "tapply_handoff: %s\n", err);
            exit(1);
        }
        s->req.data = s;
        uv_queue_work(&b->loop, &s->req, uv_step, uv_after);
    }
}

static void on_stop(uv_timer_t *t)
{
    bench *b = t->data;
    b->stopping = 1; /* then every ms, until every push is back */
    if (b->inflight == 0)
        uv_timer_stop(t);
}

/* ordered: the streams' pushes one after the other on the loop, round robin */
static double run_ordered(bench *b, double secs)
{
    char err[512];
    double t0 = now_s(), end = t0 + secs;
    uint64_t n = 0;
    while (now_s() < end) {
        stream *s = &b->st[n % b->S];
        draw(b, s);
        if (srv_tables_push(&b->ts, b->ti, s->keys, b->K, b->g, 1.0, err, sizeof err) != 0) {
            fprintf(stderr, "tapply_handoff: %s\n", err);
            exit(1);
        }
        n++;
    }
    b->lat_n = n;
    b->lat_sum = 0;
    return now_s() - t0;
}

static double run_way(bench *b, int way, double secs, int threads)
{
    b->way = way;
    b->stopping = 0;
    b->lat_sum = 0;
    b->lat_n = 0;
    if (way == WAY_ORDERED)
        return run_ordered(b, secs);
    char err[256];
    if (way == WAY_POOL && !(b->pool = srv_tapply_new(&b->loop, threads, on_pool_done, b, err, sizeof err))) {
        fprintf(stderr, "tapply_handoff: %s\n", err);
        exit(1);
    }
    uv_timer_start(&b->stop, on_stop, (uint64_t)(secs * 1e3), 1);
    double t0 = now_s();
    for (uint32_t i = 0; i < b->S; i++)
        next(b, &b->st[i]);
    uv_run(&b->loop, UV_RUN_DEFAULT); /* ends when the timer has fired and every push is back */
    if (way == WAY_POOL) {
        srv_tapply_free(b->pool);
        b->pool = NULL;
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    static bench b;
    uint32_t S = 2, K = 512, D = 16;
    double secs = 2;
    int turns = 3, threads = 2, swap = 0, opt;
    while ((opt = getopt(argc, argv, "s:k:d:t:r:n:x")) != -1) {
        switch (opt) {
        case 's': S = (uint32_t)atoi(optarg); break;
        case 'k': K = (uint32_t)atoi(optarg); break;
        case 'd': D = (uint32_t)atoi(optarg); break;
        case 't': secs = atof(optarg); break;
        case 'r': turns = atoi(optarg); break;
        case 'n': threads = atoi(optarg); break;
        case 'x': swap = 1; break;
        default:
            fprintf(stderr, "usage: tapply_handoff [-s streams] [-k keys] [-d dim] [-t seconds] [-r turns] "
                            "[-n threads] [-x]\n");
            return 2;
        }
    }
    if (S < 1 || S > MAX_STREAMS || K < 1 || K > 65536 || D < 1 || D > 1024 || (uint64_t)K * D > (1u << 22)) {
        fprintf(stderr, "tapply_handoff: 1..%d streams, 1..65536 keys, dim 1..1024, keys x dim <= 2^22\n",
                MAX_STREAMS);
        return 2;
    }
    b.S = S;
    b.K = K;
    b.D = D;
    char err[512];
    ps_hp hp = {0};
    hp.has = 1u << PS_HP_LR;
    hp.v[PS_HP_LR] = 0.05;
    if (ps_table_def_make(&b.def, "emb", D, "uniform", 1, 0.05, 1, "adagrad", &hp, err, sizeof err) != 0 ||
        (srv_tables_init(&b.ts, 1ull << 34), srv_tables_declare(&b.ts, &b.def, &b.ti, err, sizeof err)) != 0) {
        fprintf(stderr, "tapply_handoff: %s\n", err);
        return 1;
    }
    b.def = *srv_tables_def(&b.ts, b.ti);
    b.g = malloc(sizeof(float) * K * D);
    for (size_t i = 0; i < (size_t)K * D; i++)
        b.g[i] = 1e-3f * (float)((i * 2654435761u >> 16) & 1023) / 1023.0f;
    uv_loop_init(&b.loop);
    uv_timer_init(&b.loop, &b.stop);
    b.stop.data = &b;
    for (uint32_t i = 0; i < S; i++) {
        b.st[i] = (stream){.b = &b, .idx = i, .rng = 0x1234567ull * (i + 1) | 1};
        b.st[i].keys = malloc(8 * (size_t)K);
        b.st[i].rows = malloc(sizeof(float *) * K);
    }
    /* the key space stored first: no push in the timing makes a row */
    for (uint64_t k0 = 0; k0 < SPACE; k0 += K) {
        uint8_t *kb = b.st[0].keys;
        uint32_t n = 0;
        for (; n < K && k0 + n < SPACE; n++) {
            uint64_t k = (k0 + n) * 0x9e3779b97f4a7c15ull + 1;
            memcpy(kb + 8 * (size_t)n, &k, 8);
        }
        if (srv_tables_push(&b.ts, b.ti, kb, n, b.g, 1.0, err, sizeof err) != 0) {
            fprintf(stderr, "tapply_handoff: %s\n", err);
            return 1;
        }
    }
    printf("tapply_handoff: %u streams (one push in flight each), %u keys a push, dim %u, AdaGrad, %d apply "
           "threads, %.1f s a cell, %d turns, %ld CPUs\n",
           S, K, D, threads, secs, turns, sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-24s %5s %12s %14s %16s\n", "way", "turn", "pushes/s", "rows/s", "queue->back us");
    for (int r = 0; r < turns; r++)
        for (int wi = 0; wi < WAYS; wi++) {
            int w = swap && wi ? WAYS - wi : wi;
            double el = run_way(&b, w, secs, threads);
            double ps = (double)b.lat_n / el;
            printf("%-24s %5d %12.0f %14.0f ", way_name[w], r + 1, ps, ps * K);
            if (w == WAY_ORDERED)
                printf("%16s\n", "-");
            else
                printf("%16.1f\n", b.lat_n ? b.lat_sum / (double)b.lat_n * 1e6 : NAN);
            fflush(stdout);
        }
    uv_close((uv_handle_t *)&b.stop, NULL);
    uv_run(&b.loop, UV_RUN_DEFAULT);
    uv_loop_close(&b.loop);
    for (uint32_t i = 0; i < S; i++) {
        free(b.st[i].keys);
        free(b.st[i].rows);
    }
    free(b.g);
    srv_tables_free(&b.ts);
    return 0;
}
