/* linreg.c - the smallest complete psd worker: least-squares regression of
 * y = x . w_true + 0.5 on synthetic data, trained through psd with
 * libpsclient. Build it against the installed library:
 *
 *   cc linreg.c $(pkg-config --cflags --libs psclient) -o linreg
 *   ./linreg 127.0.0.1:7000 0/1 200      # server, shard K/M, steps
 *
 * against psd with plain SGD (psd --set optimizer=sgd --set lr=0.05
 * --set momentum=0 --set warmup_versions=0): psd's default, AdaGrad, moves
 * each weight by at most about lr a step, too slowly for these few steps.
 *
 * It prints the loss before and after, and exits 1 unless training cut it
 * by at least 10x. */
#include <psd/client.h>
#include <stdio.h>
#include <stdlib.h>

#define DIM 16
#define BATCH 32

/* uniform in [-1, 1) from a xorshift32 state */
static double rnd(unsigned *s)
{
    *s ^= *s << 13, *s ^= *s >> 17, *s ^= *s << 5;
    return *s / 2147483648.0 - 1;
}

/* mean squared error of the batch, and its gradient into g */
static double step(const float *w, float *g, unsigned *seed)
{
    double loss = 0;
    for (int j = 0; j <= DIM; j++)
        g[j] = 0;
    for (int i = 0; i < BATCH; i++) {
        float x[DIM];
        double y = 0.5, p = w[DIM];
        for (int j = 0; j < DIM; j++) {
            x[j] = (float)rnd(seed);
            y += x[j] * (j % 4 - 1.5); /* w_true */
            p += x[j] * w[j];
        }
        double e = p - y;
        loss += e * e / BATCH;
        for (int j = 0; j < DIM; j++)
            g[j] += (float)(2 * e * x[j] / BATCH);
        g[DIM] += (float)(2 * e / BATCH);
    }
    return loss;
}

static int die(psc_client *c, const char *what)
{
    fprintf(stderr, "linreg: %s: %s\n", what, psc_errmsg(c));
    psc_free(c);
    return 1;
}

int main(int argc, char **argv)
{
    int steps = argc > 3 ? atoi(argv[3]) : 200;
    psc_client *c = psc_new();
    if (!c)
        return 1;
    uint64_t wdim[1] = {DIM}, bdim[1] = {1};
    if ((argc > 1 && psc_set(c, "server", argv[1]) != 0) || (argc > 2 && psc_set(c, "shard", argv[2]) != 0) ||
        psc_add_tensor(c, "w", 1, wdim) != 0 || psc_add_tensor(c, "b", 1, bdim) != 0)
        return die(c, "options");
    float *w = psc_params(c), *g = psc_grads(c); /* zeros: our initial model */
    if (psc_connect(c) != 0)
        return die(c, "connect");
    unsigned seed = 42;
    uint32_t k, m;
    psc_shard(c, &k, &m);
    seed += 7919 * k;
    double first = step(w, g, &seed), last = first;
    for (int s = 0; s < steps; s++) {
        last = step(w, g, &seed);
        if (psc_pushpull(c) != 0)
            return die(c, "pushpull");
    }
    if (psc_report(c, 1, last, -1, 0, (uint64_t)steps * BATCH, 0) != 0)
        return die(c, "report");
    printf("mode %s, version %llu: loss %.4f -> %.4f\n", psc_mode(c), (unsigned long long)psc_model_version(c),
           first, last);
    psc_close(c);
    psc_free(c);
    return last * 10 < first ? 0 : 1;
}
