/* gradcheck.h - finite-difference gradient checks shared by the layer and
 * model tests (test_layers, test_conv). Failures go through cmocka. */
#ifndef PS_TEST_GRADCHECK_H
#define PS_TEST_GRADCHECK_H

#include <stddef.h>
#include <string.h>

#include "worker/layer.h"
#include "worker/rng.h"

#define assert_msg_has(msg, needle)                                                                                \
    do {                                                                                                           \
        if (strstr((msg), (needle)) == NULL)                                                                       \
            fail_msg("message \"%s\" lacks \"%s\"", (msg), (needle));                                             \
    } while (0)

/* A scalar function of the float vector under test, evaluated in float by
 * the code under test and summed in double. */
typedef double (*scalar_fn)(void *ctx);

typedef struct check_stats {
    int tolerant;      /* set by the caller: count mismatches instead of failing */
    float eps1, eps2;  /* set by the caller: the two steps; 0 for EPS1 and EPS2 */
    size_t checked;    /* elements compared (not skipped) */
    size_t skipped;    /* elements whose two numeric estimates disagreed */
    size_t mismatched; /* tolerant only: checked elements outside the tolerance */
    double max_err;    /* largest |analytic - numeric| / (ATOL + RTOL * scale) seen */
    double sq_diff;    /* sum over checked elements of (analytic - numeric)^2 */
    double sq_ref;     /* sum over checked elements of analytic^2 + numeric^2 */
} check_stats;

/* sqrt(sq_diff / sq_ref): 0 when the gradients agree, about 1.4 when they
 * are unrelated. */
double check_rel_err(const check_stats *st);

#define RTOL 1e-2
#define ATOL 2e-4
#define EPS1 1e-2f
#define EPS2 5e-3f

/* Compares analytic[k] with the numerical derivative of f with respect to
 * v[k] for every k < n. Float central differences are exact up to rounding
 * for smooth functions; where a perturbation crosses a ReLU or max-pooling
 * kink the two step sizes disagree with each other, and such elements are
 * skipped and counted (the caller bounds how many may be). A wrong gradient
 * agrees with neither step, so it fails.
 *
 * A whole CNN has so many max-pooling and ReLU kinks that a step in a
 * first-layer weight crosses several of them, by both step sizes alike;
 * there st->tolerant lets the caller bound the mismatches and the overall
 * relative error (check_rel_err) instead, as the layers themselves are
 * checked exactly. */
void gradcheck(const char *what, float *v, const float *analytic, size_t n, scalar_fn f, void *ctx,
               check_stats *st);

/* As gradcheck for the elements idx[0..n) of v only. */
void gradcheck_some(const char *what, float *v, const float *analytic, const size_t *idx, size_t n, scalar_fn f,
                    void *ctx, check_stats *st);

/* v[i] = scale * N(0, 1) draws. */
void fill_normal(ps_rng *r, float *v, size_t n, double scale);

/* Binds l to fresh parameters N(0, 0.7^2), runs forward (training on) and
 * backward once on x with dL/dout = r (random), then checks the parameter and
 * input gradients numerically against L = sum r * out; and that backward
 * with din NULL gives the same parameter gradients. */
void check_layer(ps_layer *l, float *x, int batch, ps_rng *rng, check_stats *st);

#endif
