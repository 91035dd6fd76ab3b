/* test_optim_state.c - srv_optim_state_valid (server/model/optim.c): the
 * state of every optimizer as made and after training is accepted, signed
 * state (momentum, first moments) whatever its sign; refused are a negative
 * value where a square root reads (second moments, adagrad's sum) at the
 * first, a middle and the last parameter, NaN and infinity anywhere, a
 * missing or an extra state buffer, an unknown kind. Only the o->n values
 * of each buffer count. The buffers are found by the names
 * srv_optim_state_buffers gives them, as a checkpoint or a copy would. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/config/config.h"
#include "server/model/optim.h"

/* Parameters: two whole blocks of the vectorised loops and a remainder. */
#define N 37

static const int all_kinds[] = {PS_OPTIMIZER_SGD, PS_OPTIMIZER_ADAM, PS_OPTIMIZER_ADAMW, PS_OPTIMIZER_ADAGRAD};
#define NKINDS (sizeof all_kinds / sizeof all_kinds[0])

/* The parameters a value is planted at: the first, one inside the second
 * vector block, the last. */
static const size_t at[] = {0, 17, N - 1};

static ps_config cfg_for(int kind, double momentum)
{
    ps_config c;
    ps_config_defaults(&c);
    c.optimizer = kind;
    c.lr = 0.1;
    c.momentum = momentum;
    c.weight_decay = 0;
    c.nesterov = false;
    c.clip_norm = 0;
    c.lr_schedule = PS_LR_CONSTANT;
    c.warmup_versions = 0;
    return c;
}

static void init(srv_optim *o, int kind, double momentum, size_t n)
{
    ps_config c = cfg_for(kind, momentum);
    assert_int_equal(srv_optim_init(o, &c, n), 0);
}

/* o's state buffer called name (srv_optim_state_buffers' names), or NULL. */
static float *buffer_named(srv_optim *o, const char *name)
{
    float *bufs[SRV_OPTIM_STATE_MAX];
    const char *names[SRV_OPTIM_STATE_MAX];
    size_t nb = srv_optim_state_buffers(o, bufs, names, SRV_OPTIM_STATE_MAX);
    assert_true(nb <= SRV_OPTIM_STATE_MAX);
    for (size_t k = 0; k < nb; k++)
        if (strcmp(names[k], name) == 0)
            return bufs[k];
    return NULL;
}

/* A few steps of gradients of both signs, so that signed state holds
 * negative values and the rest grows above 0. */
static void train(srv_optim *o, float *w)
{
    float g[N];
    for (int t = 0; t < 5; t++) {
        for (size_t i = 0; i < N; i++)
            g[i] = (float)((double)((int)((i * 7 + (size_t)t * 3) % 11) - 5) * 0.1);
        srv_optim_apply(o, w, g, 0, N, (uint64_t)t);
    }
}

static int has_negative(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] < 0)
            return 1;
    return 0;
}

/* ---- accepted ---------------------------------------------------------------- */

static void test_fresh_and_trained_state_accepted(void **state)
{
    (void)state;
    for (size_t k = 0; k < NKINDS; k++)
        for (int mom = 0; mom < 2; mom++) {
            srv_optim o;
            float w[N];
            for (size_t i = 0; i < N; i++)
                w[i] = (float)(0.5 - 0.05 * (double)i);
            init(&o, all_kinds[k], mom ? 0.9 : 0, N);
            assert_int_equal(srv_optim_state_valid(&o), 1);
            train(&o, w);
            assert_int_equal(srv_optim_state_valid(&o), 1);
            srv_optim_free(&o);
        }
}

static void test_signed_state_accepted_whatever_its_sign(void **state)
{
    (void)state;
    srv_optim o;
    float w[N] = {0};
    init(&o, PS_OPTIMIZER_SGD, 0.9, N);
    train(&o, w);
    float *v = buffer_named(&o, "momentum");
    assert_non_null(v);
    assert_true(has_negative(v, N)); /* training made some negative */
    v[0] = -FLT_MAX;
    v[N - 1] = FLT_MAX;
    assert_int_equal(srv_optim_state_valid(&o), 1);
    srv_optim_free(&o);

    int adams[] = {PS_OPTIMIZER_ADAM, PS_OPTIMIZER_ADAMW};
    for (size_t k = 0; k < 2; k++) {
        memset(w, 0, sizeof w);
        init(&o, adams[k], 0, N);
        train(&o, w);
        float *m = buffer_named(&o, "exp_avg");
        assert_non_null(m);
        assert_true(has_negative(m, N));
        m[17] = -1e30f;
        assert_int_equal(srv_optim_state_valid(&o), 1);
        srv_optim_free(&o);
    }
}

static void test_zero_values_and_zero_parameters_accepted(void **state)
{
    (void)state;
    for (size_t k = 1; k < NKINDS; k++) { /* the kinds with a square-rooted buffer */
        srv_optim o;
        init(&o, all_kinds[k], 0, N);
        float *sq = buffer_named(&o, all_kinds[k] == PS_OPTIMIZER_ADAGRAD ? "sum" : "exp_avg_sq");
        assert_non_null(sq);
        for (size_t i = 0; i < N; i++)
            sq[i] = -0.0f; /* not negative: sqrt(-0) is -0 */
        assert_int_equal(srv_optim_state_valid(&o), 1);
        sq[5] = FLT_MAX;
        sq[6] = FLT_TRUE_MIN;
        assert_int_equal(srv_optim_state_valid(&o), 1);
        srv_optim_free(&o);

        init(&o, all_kinds[k], 0, 0); /* a model of no parameters */
        assert_int_equal(srv_optim_state_valid(&o), 1);
        srv_optim_free(&o);
    }
}

/* Only o->n values are the state: a value past them is not read. */
static void test_only_n_values_count(void **state)
{
    (void)state;
    srv_optim o;
    init(&o, PS_OPTIMIZER_ADAGRAD, 0, N);
    float *sum = buffer_named(&o, "sum");
    float *big = calloc(N + 1, sizeof(float));
    assert_non_null(big);
    big[N] = -1.0f;
    float *mine = o.state[0];
    assert_ptr_equal(mine, sum);
    o.state[0] = big;
    assert_int_equal(srv_optim_state_valid(&o), 1);
    big[N - 1] = -1.0f;
    assert_int_equal(srv_optim_state_valid(&o), 0);
    o.state[0] = mine;
    free(big);
    srv_optim_free(&o);
}

/* ---- refused ----------------------------------------------------------------- */

static void test_negative_where_a_square_root_reads_refused(void **state)
{
    (void)state;
    const float negs[] = {-1.0f, -FLT_TRUE_MIN, -FLT_MAX};
    for (size_t k = 1; k < NKINDS; k++)
        for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
            for (size_t v = 0; v < sizeof negs / sizeof negs[0]; v++) {
                srv_optim o;
                float w[N] = {0};
                init(&o, all_kinds[k], 0, N);
                train(&o, w);
                float *sq = buffer_named(&o, all_kinds[k] == PS_OPTIMIZER_ADAGRAD ? "sum" : "exp_avg_sq");
                assert_non_null(sq);
                float keep = sq[at[a]];
                sq[at[a]] = negs[v];
                if (srv_optim_state_valid(&o) != 0)
                    fail_msg("%s: %g at %zu accepted", srv_optim_kind_name(all_kinds[k]), (double)negs[v], at[a]);
                sq[at[a]] = keep;
                assert_int_equal(srv_optim_state_valid(&o), 1);
                srv_optim_free(&o);
            }
}

static void test_nonfinite_state_refused(void **state)
{
    (void)state;
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < NKINDS; k++) {
        srv_optim o;
        float w[N] = {0};
        init(&o, all_kinds[k], 0.9, N);
        train(&o, w);
        float *bufs[SRV_OPTIM_STATE_MAX];
        const char *names[SRV_OPTIM_STATE_MAX];
        size_t nb = srv_optim_state_buffers(&o, bufs, names, SRV_OPTIM_STATE_MAX);
        assert_true(nb >= 1); /* sgd with momentum too */
        for (size_t b = 0; b < nb; b++)
            for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
                for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
                    float keep = bufs[b][at[a]];
                    bufs[b][at[a]] = bad[v];
                    if (srv_optim_state_valid(&o) != 0)
                        fail_msg("%s: %s[%zu] = %g accepted", srv_optim_kind_name(all_kinds[k]), names[b], at[a],
                                 (double)bad[v]);
                    bufs[b][at[a]] = keep;
                }
        assert_int_equal(srv_optim_state_valid(&o), 1);
        srv_optim_free(&o);
    }
}

/* The buffers a kind keeps, all of them and no other. */
static void test_missing_or_extra_buffer_refused(void **state)
{
    (void)state;
    int adams[] = {PS_OPTIMIZER_ADAM, PS_OPTIMIZER_ADAMW};
    for (size_t k = 0; k < 2; k++)
        for (size_t drop = 0; drop < 2; drop++) {
            srv_optim o;
            init(&o, adams[k], 0, N);
            assert_int_equal(srv_optim_state_buffers(&o, NULL, NULL, 0), 2);
            float *kept = o.state[drop];
            o.state[drop] = NULL; /* exp_avg, then exp_avg_sq, missing */
            assert_int_equal(srv_optim_state_valid(&o), 0);
            o.state[drop] = kept;
            assert_int_equal(srv_optim_state_valid(&o), 1);
            srv_optim_free(&o);
        }

    /* adagrad keeps one buffer: a second one is not its state */
    srv_optim o;
    float extra[N] = {0};
    init(&o, PS_OPTIMIZER_ADAGRAD, 0, N);
    float *sum = o.state[0];
    o.state[0] = NULL;
    assert_int_equal(srv_optim_state_valid(&o), 0); /* no sum */
    o.state[0] = sum;
    o.state[1] = extra;
    assert_int_equal(srv_optim_state_valid(&o), 0);
    o.state[1] = NULL;
    assert_int_equal(srv_optim_state_valid(&o), 1);
    srv_optim_free(&o);

    /* sgd: its momentum buffer or none (no momentum yet, or no memory for
     * it), never a second one */
    init(&o, PS_OPTIMIZER_SGD, 0, N);
    assert_int_equal(srv_optim_state_buffers(&o, NULL, NULL, 0), 0);
    assert_int_equal(srv_optim_state_valid(&o), 1);
    o.state[1] = extra;
    assert_int_equal(srv_optim_state_valid(&o), 0);
    o.state[1] = NULL;
    srv_optim_free(&o);
    init(&o, PS_OPTIMIZER_SGD, 0.9, N);
    float *v = o.state[0];
    assert_non_null(v);
    o.state[0] = NULL; /* as when its allocation failed: sgd goes on without */
    assert_int_equal(srv_optim_state_valid(&o), 1);
    o.state[0] = v;
    o.state[1] = extra;
    assert_int_equal(srv_optim_state_valid(&o), 0);
    o.state[1] = NULL;
    srv_optim_free(&o);
}

static void test_unknown_kind_refused(void **state)
{
    (void)state;
    srv_optim o;
    init(&o, PS_OPTIMIZER_SGD, 0, N);
    int kinds_bad[] = {-1, (int)NKINDS, 1000};
    for (size_t k = 0; k < 3; k++) {
        o.kind = kinds_bad[k];
        assert_int_equal(srv_optim_state_valid(&o), 0);
    }
    o.kind = PS_OPTIMIZER_SGD;
    srv_optim_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_and_trained_state_accepted),
        cmocka_unit_test(test_signed_state_accepted_whatever_its_sign),
        cmocka_unit_test(test_zero_values_and_zero_parameters_accepted),
        cmocka_unit_test(test_only_n_values_count),
        cmocka_unit_test(test_negative_where_a_square_root_reads_refused),
        cmocka_unit_test(test_nonfinite_state_refused),
        cmocka_unit_test(test_missing_or_extra_buffer_refused),
        cmocka_unit_test(test_unknown_kind_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
