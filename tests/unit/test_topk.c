/* test_topk.c - client/topk.c: top-k sparsification with error feedback.
 * Over many steps, what a worker sent plus its residual is the sum of its
 * gradients (nothing lost); each push holds k values, the largest of
 * gradient plus residual. */
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client/topk.h"

static uint32_t rng_state = 12345;
static uint32_t next_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_k(void **state)
{
    (void)state;
    assert_int_equal(psc__topk_k(0.01, 0), 0);
    assert_int_equal(psc__topk_k(0.01, 10), 1);   /* at least one */
    assert_int_equal(psc__topk_k(0.01, 1000), 10);
    assert_int_equal(psc__topk_k(0.01, 1001), 11); /* rounded up */
    assert_int_equal(psc__topk_k(1.0, 7), 7);
    assert_int_equal(psc__topk_k(0.5, 7), 4);
}

/* Gradients that are multiples of 1/64 in [-4, 4]: every sum below is
 * exact in float32, so sent + residual must equal the gradients' sum bit
 * for bit, not just closely. */
static void test_nothing_lost_exact(void **state)
{
    (void)state;
    enum { N = 1000, STEPS = 200 };
    float *g = malloc(N * sizeof *g), *resid = calloc(N, sizeof *resid), *scratch = malloc(N * sizeof *scratch);
    double *sent = calloc(N, sizeof *sent), *sum = calloc(N, sizeof *sum);
    assert_non_null(g);
    assert_non_null(resid);
    assert_non_null(scratch);
    assert_non_null(sent);
    assert_non_null(sum);
    size_t k = psc__topk_k(0.01, N);
    for (int s = 0; s < STEPS; s++) {
        for (size_t i = 0; i < N; i++) {
            g[i] = (float)((int)(next_u32() % 513) - 256) / 64.0f;
            if (next_u32() % 4 == 0)
                g[i] = 0.0f; /* some zeros, as a ReLU network's */
            sum[i] += g[i];
        }
        size_t kept = psc__topk_select(g, resid, N, k, scratch);
        assert_int_equal(kept, k);
        size_t nonzero = 0;
        for (size_t i = 0; i < N; i++) {
            nonzero += g[i] != 0.0f;
            sent[i] += g[i];
        }
        assert_true(nonzero <= k);
    }
    for (size_t i = 0; i < N; i++)
        assert_true(sent[i] + resid[i] == sum[i]);
    free(g);
    free(resid);
    free(scratch);
    free(sent);
    free(sum);
}

/* Arbitrary floats: sent + residual equals the sum within float32
 * rounding of the residual's running additions. */
static void test_nothing_lost_random(void **state)
{
    (void)state;
    enum { N = 4096, STEPS = 100 };
    float *g = malloc(N * sizeof *g), *resid = calloc(N, sizeof *resid), *scratch = malloc(N * sizeof *scratch);
    double *sent = calloc(N, sizeof *sent), *sum = calloc(N, sizeof *sum);
    assert_non_null(g);
    assert_non_null(resid);
    assert_non_null(scratch);
    assert_non_null(sent);
    assert_non_null(sum);
    size_t k = psc__topk_k(0.05, N);
    double total = 0;
    for (int s = 0; s < STEPS; s++) {
        for (size_t i = 0; i < N; i++) {
            g[i] = ((float)next_u32() / 4294967296.0f - 0.5f) * 1e-2f;
            sum[i] += g[i];
            total += fabs(g[i]);
        }
        psc__topk_select(g, resid, N, k, scratch);
        for (size_t i = 0; i < N; i++)
            sent[i] += g[i];
    }
    double worst = 0;
    for (size_t i = 0; i < N; i++) {
        double d = fabs(sent[i] + resid[i] - sum[i]);
        worst = d > worst ? d : worst;
    }
    assert_true(worst < 1e-6);
    /* and the residual really carried something: most was not sent at once */
    double held = 0;
    for (size_t i = 0; i < N; i++)
        held += fabs(resid[i]);
    assert_true(held > total / STEPS);
    free(g);
    free(resid);
    free(scratch);
    free(sent);
    free(sum);
}

/* The values sent are the k largest in magnitude of gradient plus
 * residual; ties are taken in index order; NaN counts as largest. */
static void test_selects_largest(void **state)
{
    (void)state;
    float g[8] = {0.1f, -5.0f, 2.0f, 0.0f, 2.0f, -2.0f, 0.3f, 4.0f};
    float resid[8] = {0, 0, 0, 0, 0, 0, 0, -3.5f}; /* 4 + -3.5 = 0.5 */
    float scratch[8];
    size_t kept = psc__topk_select(g, resid, 8, 3, scratch);
    assert_int_equal(kept, 3);
    float want_g[8] = {0, -5.0f, 2.0f, 0, 2.0f, 0, 0, 0};
    float want_r[8] = {0.1f, 0, 0, 0, 0, -2.0f, 0.3f, 0.5f};
    for (int i = 0; i < 8; i++) {
        assert_true(g[i] == want_g[i]);
        assert_true(resid[i] == want_r[i]);
    }
    float h[4] = {1.0f, NAN, -1.0f, 0.5f}, r[4] = {0}, sc[4];
    assert_int_equal(psc__topk_select(h, r, 4, 1, sc), 1);
    assert_true(isnan(h[1]));
    assert_true(h[0] == 0.0f && h[2] == 0.0f && h[3] == 0.0f);
    assert_true(r[0] == 1.0f && r[1] == 0.0f && r[2] == -1.0f && r[3] == 0.5f);
    /* all equal: exactly k of them, the first ones */
    float e[6] = {1, 1, 1, 1, 1, 1}, er[6] = {0}, es[6];
    assert_int_equal(psc__topk_select(e, er, 6, 2, es), 2);
    assert_true(e[0] == 1 && e[1] == 1 && e[2] == 0 && e[5] == 0);
    assert_true(er[0] == 0 && er[2] == 1 && er[5] == 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k),
        cmocka_unit_test(test_nothing_lost_exact),
        cmocka_unit_test(test_nothing_lost_random),
        cmocka_unit_test(test_selects_largest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
