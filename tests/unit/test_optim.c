/* test_optim.c - the server-side optimizers (server/optim.c): each kind
 * against a double-precision textbook reference and against values of
 * PyTorch's formulas (in PyTorch's order of operations, float32, computed
 * with numpy) pasted as constants; clipping; every schedule at its
 * boundary versions; reloads; state accounting; ranges. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/config/config.h"
#include "proto/errors.h"
#include "server/model/optim.h"

/* Vector length for the reference runs: two whole blocks of the
 * vectorised loops and a remainder, so both paths are checked. */
#define N 37

/* ---- inputs, the same formulas as the numpy script's ---------------------- */

static void init_w(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = (float)(0.5 - 0.05 * (double)i);
}

/* The gradient of step t: values in -0.5..0.5, varying with i and t. */
static void make_grad(float *g, size_t n, int t)
{
    for (size_t i = 0; i < n; i++)
        g[i] = (float)((double)((int)((i * 7 + (size_t)t * 3) % 11) - 5) * 0.1);
}

static ps_config cfg_for(int kind)
{
    ps_config c;
    ps_config_defaults(&c);
    c.optimizer = kind;
    c.lr = 0.1;
    c.momentum = 0;
    c.weight_decay = 0;
    c.nesterov = false;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.clip_norm = 0;
    c.lr_schedule = PS_LR_CONSTANT;
    c.warmup_versions = 0;
    return c;
}

/* |got - want| <= atol + rtol*|want| for each element. */
static void assert_near(const float *got, const double *want, size_t n, double rtol, double atol,
                        const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= atol + rtol * fabs(want[i])))
            fail_msg("%s[%zu] = %.9g, want %.9g (error %.3g)", what, i, (double)got[i], want[i], err);
    }
}

static void assert_near_f(const float *got, const float *want, size_t n, double rtol, const char *what)
{
    double w[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        w[i] = want[i];
    assert_near(got, w, n, rtol, 0, what);
}

/* ---- the textbook reference, in double ------------------------------------ */

typedef struct ref {
    int kind;
    double lr, mu, wd, b1, b2, eps;
    int nesterov;
    double w[N], s1[N], s2[N]; /* s1: momentum / m / sum; s2: v */
} ref;

static void ref_init(ref *r, const ps_config *c)
{
    memset(r, 0, sizeof *r);
    r->kind = c->optimizer;
    r->lr = c->lr;
    r->mu = c->momentum;
    r->wd = c->weight_decay;
    r->b1 = c->beta1;
    r->b2 = c->beta2;
    r->eps = c->eps;
    r->nesterov = c->nesterov;
    float w[N];
    init_w(w, N);
    for (size_t i = 0; i < N; i++)
        r->w[i] = w[i];
}

/* One step with learning rate lr at bias-correction step t, gradient g
 * already clipped. Formulas as in the papers and torch.optim's docs. */
static void ref_step(ref *r, const float *g, double lr, double t)
{
    for (size_t i = 0; i < N; i++) {
        double d = g[i], w = r->w[i];
        switch (r->kind) {
        case PS_OPTIMIZER_SGD:
            d += r->wd * w;
            if (r->mu > 0) {
                r->s1[i] = r->mu * r->s1[i] + d;
                d = r->nesterov ? d + r->mu * r->s1[i] : r->s1[i];
            }
            w -= lr * d;
            break;
        case PS_OPTIMIZER_ADAM:
        case PS_OPTIMIZER_ADAMW: {
            if (r->kind == PS_OPTIMIZER_ADAMW)
                w *= 1 - lr * r->wd;
            else
                d += r->wd * w;
            r->s1[i] = r->b1 * r->s1[i] + (1 - r->b1) * d;
            r->s2[i] = r->b2 * r->s2[i] + (1 - r->b2) * d * d;
            double mhat = r->s1[i] / (1 - pow(r->b1, t));
            double vhat = r->s2[i] / (1 - pow(r->b2, t));
            w -= lr * mhat / (sqrt(vhat) + r->eps);
            break;
        }
        case PS_OPTIMIZER_ADAGRAD:
            d += r->wd * w;
            r->s1[i] += d * d;
            w -= lr * d / (sqrt(r->s1[i]) + r->eps);
            break;
        }
        r->w[i] = w;
    }
}

/* Runs `steps` updates (versions 0..steps-1) through srv_optim_apply and the
 * reference, and compares parameters and state. */
static void run_against_reference(const ps_config *c, int steps)
{
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, c, N), 0);
    ref r;
    ref_init(&r, c);
    float w[N], g[N];
    init_w(w, N);
    for (int t = 0; t < steps; t++) {
        make_grad(g, N, t);
        srv_optim_apply(&o, w, g, 0, N, (uint64_t)t);
        ref_step(&r, g, c->lr, t + 1);
    }
    assert_near(w, r.w, N, 1e-5, 1e-6, "w");
    float *bufs[2];
    const char *names[2];
    size_t nb = srv_optim_state_buffers(&o, bufs, names, 2);
    if (nb >= 1)
        assert_near(bufs[0], r.s1, N, 1e-5, 1e-7, names[0]);
    if (nb >= 2)
        assert_near(bufs[1], r.s2, N, 1e-4, 1e-9, names[1]);
    srv_optim_free(&o);
}

/* ---- names and state accounting ------------------------------------------ */

static void test_names(void **state)
{
    const ps_config_option *opt = ps_config_find("optimizer");
    assert_non_null(opt);
    int k = 0;
    for (; opt->words[k]; k++)
        assert_string_equal(srv_optim_kind_name(k), opt->words[k]);
    assert_int_equal(k, 4);
    assert_string_equal(srv_optim_kind_name(k), "unknown");
    assert_string_equal(srv_optim_kind_name(-1), "unknown");

    for (k = 0; k < 4; k++) {
        ps_config c = cfg_for(k);
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, 3), 0);
        assert_string_equal(srv_optim_name(&o), opt->words[k]);
        srv_optim_free(&o);
    }
}

static void test_init_rejects_unknown_kind(void **state)
{
    ps_config c = cfg_for(7);
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, 3), PS_EINVAL);
    assert_int_equal(srv_optim_state_bytes(&o), 0);
    srv_optim_free(&o);
}

static void test_state_per_kind(void **state)
{
    static const struct {
        int kind;
        double momentum;
        size_t nbufs;
        const char *names[2];
    } cases[] = {
        {PS_OPTIMIZER_SGD, 0, 0, {NULL, NULL}},
        {PS_OPTIMIZER_SGD, 0.9, 1, {"momentum", NULL}},
        {PS_OPTIMIZER_ADAM, 0.9, 2, {"exp_avg", "exp_avg_sq"}},
        {PS_OPTIMIZER_ADAMW, 0, 2, {"exp_avg", "exp_avg_sq"}},
        {PS_OPTIMIZER_ADAGRAD, 0.9, 1, {"sum", NULL}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ps_config c = cfg_for(cases[k].kind);
        c.momentum = cases[k].momentum;
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, 1000), 0);
        assert_int_equal(srv_optim_state_bytes(&o), cases[k].nbufs * 1000 * sizeof(float));
        float *bufs[4] = {0};
        const char *names[4] = {0};
        assert_int_equal(srv_optim_state_buffers(&o, NULL, NULL, 0), cases[k].nbufs);
        assert_int_equal(srv_optim_state_buffers(&o, bufs, names, 4), cases[k].nbufs);
        for (size_t i = 0; i < cases[k].nbufs; i++) {
            assert_string_equal(names[i], cases[k].names[i]);
            assert_non_null(bufs[i]);
            for (size_t j = 0; j < 1000; j++)
                assert_true(bufs[i][j] == 0.0f);
        }
        assert_null(bufs[cases[k].nbufs]);
        if (cases[k].nbufs == 2) { /* max below the count: fills max, returns the count */
            float *one[1] = {NULL};
            const char *one_name[1] = {NULL};
            assert_int_equal(srv_optim_state_buffers(&o, one, one_name, 1), 2);
            assert_ptr_equal(one[0], bufs[0]);
            assert_string_equal(one_name[0], cases[k].names[0]);
        }
        srv_optim_free(&o);
    }
}

static void test_zero_parameters(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAM);
    c.clip_norm = 1;
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, 0), 0);
    assert_int_equal(srv_optim_state_bytes(&o), 0);
    float w[1] = {1.0f}, g[1] = {1.0f};
    srv_optim_apply(&o, w, g, 0, 0, 0);
    assert_true(w[0] == 1.0f);
    srv_optim_free(&o);
}

/* ---- each kind against the double reference ------------------------------- */

static void test_sgd_plain(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    run_against_reference(&c, 5);
    c.weight_decay = 0.01;
    run_against_reference(&c, 5);
}

/* local SGD and elastic averaging: the workers push model differences,
 * which psd applies as they are, w - d, bit for bit, whatever lr, its
 * schedule, warm-up, weight decay and clip_norm say (PROTOCOL.md section 8). */
static void test_averaging_as_is(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        ps_config c = cfg_for(PS_OPTIMIZER_SGD);
        c.lr = 0.02;
        c.weight_decay = 0.01;
        c.clip_norm = 0.001;
        c.warmup_versions = 100;
        c.lr_schedule = PS_LR_COSINE;
        if (mode == 0)
            c.local_steps = 4;
        else
            c.elastic_alpha = 0.3;
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, N), 0);
        float w[N], g[N], want[N];
        init_w(w, N);
        for (int t = 0; t < 3; t++) {
            make_grad(g, N, t);
            for (size_t i = 0; i < N; i++)
                want[i] = w[i] - g[i];
            srv_optim_apply(&o, w, g, 0, N, (uint64_t)t);
            assert_memory_equal(w, want, sizeof w);
        }
        assert_int_equal(srv_optim_state_bytes(&o), 0);
        srv_optim_free(&o);
        /* without either, the same settings are psd's optimizer as ever */
        c.local_steps = 0;
        c.elastic_alpha = 0;
        assert_int_equal(srv_optim_init(&o, &c, N), 0);
        init_w(w, N);
        make_grad(g, N, 0);
        for (size_t i = 0; i < N; i++)
            want[i] = w[i] - g[i];
        srv_optim_apply(&o, w, g, 0, N, 0);
        assert_true(memcmp(w, want, sizeof w) != 0);
        srv_optim_free(&o);
    }
}

static void test_sgd_momentum(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.momentum = 0.9;
    run_against_reference(&c, 6);
    c.weight_decay = 0.05;
    run_against_reference(&c, 6);
}

static void test_sgd_nesterov(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.momentum = 0.9;
    c.nesterov = true;
    run_against_reference(&c, 6);
    c.weight_decay = 0.05;
    run_against_reference(&c, 6);

    /* Nesterov differs from plain momentum from the first step on:
     * w -= lr*(1+mu)*g instead of lr*g. */
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, 2), 0);
    c.weight_decay = 0;
    srv_optim_configure(&o, &c);
    float w[2] = {0, 0}, g[2] = {1, -2};
    srv_optim_apply(&o, w, g, 0, 2, 0);
    assert_true(fabsf(w[0] - (-0.19f)) < 1e-6f && fabsf(w[1] - 0.38f) < 1e-6f);
    srv_optim_free(&o);
}

static void test_adam(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAM);
    c.lr = 0.01;
    run_against_reference(&c, 7);
    c.weight_decay = 0.1;
    run_against_reference(&c, 7);
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    c.eps = 1e-3;
    run_against_reference(&c, 7);
}

static void test_adamw(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAMW);
    c.lr = 0.01;
    c.weight_decay = 0.1;
    run_against_reference(&c, 7);
    c.weight_decay = 0.5;
    c.lr = 0.05;
    run_against_reference(&c, 7);
}

static void test_adagrad(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAGRAD);
    run_against_reference(&c, 6);
    c.weight_decay = 0.05;
    c.eps = 1e-10;
    run_against_reference(&c, 6);
    c.eps = 0.5; /* large enough to tell sqrt(sum) + eps from sqrt(sum + eps) */
    run_against_reference(&c, 6);
}

/* Adam's bias correction uses t = version + 1, whatever came before. */
static void test_adam_step_is_version(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAM);
    c.lr = 0.01;
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, N), 0);
    ref r;
    ref_init(&r, &c);
    float w[N], g[N];
    init_w(w, N);
    make_grad(g, N, 0);
    srv_optim_apply(&o, w, g, 0, N, 99);
    ref_step(&r, g, c.lr, 100);
    assert_near(w, r.w, N, 1e-5, 1e-7, "w");
    srv_optim_free(&o);
}

/* ---- values of PyTorch's formulas ---------------------------------------- */

/* torch.optim.SGD/Adam/AdamW/Adagrad in their operation order (lerp for the
 * first moment, mul_+addcmul_ for the second, addcdiv_ for the step, clone
 * of the first d_p as momentum buffer), in float32 with numpy, for 18
 * parameters w[i] = 0.5 - 0.05*i and gradients of make_grad(), 3 steps. */
#define PT_N 18

static const float pt_sgd_nesterov_wd[PT_N] = {
    0.702545643f,  0.299490541f,  0.362296224f,  0.256943971f,  0.231046796f,  0.293852478f,
    0.188500226f,  0.162603036f,  0.225408748f,  0.12005648f,   -0.114840709f, 0.156964988f,
    -0.246090159f, -0.183284461f, -0.288636714f, -0.314533919f, -0.251728237f, -0.35708043f};
static const float pt_adam_l2[PT_N] = {
    0.523154378f,  0.426222563f,  0.40438804f,   0.334882319f,    0.27962485f,     0.264068872f,
    0.190973476f,  0.134364814f,  0.120790161f,  0.0469419062f,   -0.000672316644f, -0.0252693407f,
    -0.122315757f, -0.14065212f,  -0.212302357f, -0.268283665f,   -0.282350212f,   -0.356049448f};
static const float pt_adam_l2_exp_avg_sq[PT_N] = {
    0.000247338525f, 0.000421570265f, 0.000239900197f, 0.000357475976f, 0.000339037622f, 0.000182814765f,
    0.000327623595f, 0.000335672114f, 0.000204576296f, 0.000376914133f, 0.000300973043f, 0.000305479218f,
    0.000372213952f, 0.000202784155f, 0.000333324453f, 0.000327560498f, 0.000183361117f, 0.000341322331f};
static const float pt_adamw[PT_N] = {
    0.523119986f,  0.426049024f,  0.406868607f,  0.335577697f,  0.279829949f,    0.265065968f,
    0.191459835f,  0.144636646f,  0.120963499f,  0.0470229127f, -0.000664251857f, -0.0252316818f,
    -0.122302629f, -0.141483054f, -0.212773964f, -0.268521756f, -0.283285707f,   -0.356891811f};
static const float pt_adamw_exp_avg[PT_N] = {
    -0.0484999977f, 0.0311999992f, 0.0328000002f,  0.0134999976f,  0.00410000235f, 0.00570000149f,
    -0.0135999974f, -0.0229999982f, -0.0214000028f, -0.0406999961f, 0.0599000007f,  -0.0484999977f,
    0.0311999992f,  0.0328000002f,  0.0134999976f,  0.00410000235f, 0.00570000149f, -0.0135999974f};
static const float pt_adagrad[PT_N] = {
    0.618881643f, 0.305818737f, 0.367991477f, 0.301449567f, 0.172616825f,  0.279289305f,
    0.188118443f, 0.135749295f, 0.180610001f, 0.0681935772f, -0.0807298049f, 0.0688816458f,
    -0.24418126f, -0.18200852f, -0.24855043f, -0.377383173f, -0.270710707f, -0.361881524f};
static const float pt_adagrad_sum[PT_N] = {
    0.299999982f, 0.379999995f, 0.210000008f, 0.340000004f, 0.330000043f, 0.180000007f,
    0.330000013f, 0.340000004f, 0.210000023f, 0.379999995f, 0.300000012f, 0.299999982f,
    0.379999995f, 0.210000008f, 0.340000004f, 0.330000043f, 0.180000007f, 0.330000013f};

/* Sets o up with c and runs three steps on the PT_N-parameter problem. */
static void run_pt(const ps_config *c, srv_optim *o, float *w)
{
    assert_int_equal(srv_optim_init(o, c, PT_N), 0);
    init_w(w, PT_N);
    float g[PT_N];
    for (int t = 0; t < 3; t++) {
        make_grad(g, PT_N, t);
        srv_optim_apply(o, w, g, 0, PT_N, (uint64_t)t);
    }
}

static void test_pytorch_values(void **state)
{
    srv_optim o;
    float w[PT_N];

    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.momentum = 0.9;
    c.nesterov = true;
    c.weight_decay = 0.01;
    run_pt(&c, &o, w);
    assert_near_f(w, pt_sgd_nesterov_wd, PT_N, 1e-6, "sgd nesterov w");
    srv_optim_free(&o);

    c = cfg_for(PS_OPTIMIZER_ADAM);
    c.lr = 0.01;
    c.weight_decay = 0.1;
    run_pt(&c, &o, w);
    assert_near_f(w, pt_adam_l2, PT_N, 1e-6, "adam w");
    assert_near_f(o.exp_avg_sq, pt_adam_l2_exp_avg_sq, PT_N, 1e-6, "adam exp_avg_sq");
    srv_optim_free(&o);

    c.optimizer = PS_OPTIMIZER_ADAMW;
    run_pt(&c, &o, w);
    assert_near_f(w, pt_adamw, PT_N, 1e-6, "adamw w");
    assert_near_f(o.exp_avg, pt_adamw_exp_avg, PT_N, 1e-6, "adamw exp_avg");
    srv_optim_free(&o);

    c = cfg_for(PS_OPTIMIZER_ADAGRAD);
    run_pt(&c, &o, w);
    assert_near_f(w, pt_adagrad, PT_N, 1e-6, "adagrad w");
    assert_near_f(o.sum, pt_adagrad_sum, PT_N, 1e-6, "adagrad sum");
    srv_optim_free(&o);
}

/* ---- weight decay: coupled (L2 in the gradient) vs decoupled -------------- */

static void test_weight_decay_coupled_vs_decoupled(void **state)
{
    /* A zero gradient isolates the decay. Adam with L2 feeds d = wd*w to
     * the moments; after bias correction the first step moves each weight
     * by lr*d/(|d|+eps), about lr towards 0. AdamW shrinks w by the factor
     * 1 - lr*wd and its moments stay 0. */
    const float w0[4] = {2.0f, -1.0f, 0.5f, -4.0f};
    const float g[4] = {0, 0, 0, 0};
    float wa[4], ww[4];
    memcpy(wa, w0, sizeof wa);
    memcpy(ww, w0, sizeof ww);
    ps_config c = cfg_for(PS_OPTIMIZER_ADAM);
    c.lr = 0.01;
    c.weight_decay = 0.1;
    srv_optim a, aw;
    assert_int_equal(srv_optim_init(&a, &c, 4), 0);
    c.optimizer = PS_OPTIMIZER_ADAMW;
    assert_int_equal(srv_optim_init(&aw, &c, 4), 0);
    srv_optim_apply(&a, wa, g, 0, 4, 0);
    srv_optim_apply(&aw, ww, g, 0, 4, 0);
    for (int i = 0; i < 4; i++) {
        double d = 0.1 * w0[i];
        double want_a = w0[i] - 0.01 * d / (fabs(d) + 1e-8);
        double want_w = w0[i] * (1 - 0.01 * 0.1);
        assert_true(fabs(wa[i] - want_a) < 1e-6);
        assert_true(fabs(ww[i] - want_w) < 1e-6);
        assert_true(aw.exp_avg[i] == 0.0f && aw.exp_avg_sq[i] == 0.0f);
        assert_true(a.exp_avg[i] != 0.0f);
    }
    srv_optim_free(&a);
    srv_optim_free(&aw);

    /* Without weight decay the two are the same optimizer, bit for bit. */
    c = cfg_for(PS_OPTIMIZER_ADAM);
    float w1[N], w2[N], gg[N];
    init_w(w1, N);
    init_w(w2, N);
    assert_int_equal(srv_optim_init(&a, &c, N), 0);
    c.optimizer = PS_OPTIMIZER_ADAMW;
    assert_int_equal(srv_optim_init(&aw, &c, N), 0);
    for (int t = 0; t < 4; t++) {
        make_grad(gg, N, t);
        srv_optim_apply(&a, w1, gg, 0, N, (uint64_t)t);
        srv_optim_apply(&aw, w2, gg, 0, N, (uint64_t)t);
    }
    assert_memory_equal(w1, w2, sizeof w1);
    srv_optim_free(&a);
    srv_optim_free(&aw);

    /* SGD's decay is coupled: one step from g = 0 is w -= lr*wd*w. */
    c = cfg_for(PS_OPTIMIZER_SGD);
    c.weight_decay = 0.1;
    memcpy(wa, w0, sizeof wa);
    assert_int_equal(srv_optim_init(&a, &c, 4), 0);
    srv_optim_apply(&a, wa, g, 0, 4, 0);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(wa[i] - w0[i] * (1 - 0.1 * 0.1)) < 1e-6);
    srv_optim_free(&a);
}

/* ---- the sum of squares ----------------------------------------------------- */

/* srv_sumsq: value k into partial sum k mod 16, partial sums added in
 * order; so any split into pieces gives the same bits as one call. */
static void test_sumsq_one_order(void **state)
{
    enum { M = 1000 };
    float x[M];
    uint32_t r = 12345;
    for (size_t i = 0; i < M; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)r) / 3.0e8f;
    }
    double lane[SRV_SUMSQ_LANES] = {0}, want = 0;
    for (size_t i = 0; i < M; i++)
        lane[i % SRV_SUMSQ_LANES] += (double)x[i] * x[i];
    for (size_t j = 0; j < SRV_SUMSQ_LANES; j++)
        want += lane[j];
    double one = srv_sumsq_of(x, M);
    assert_memory_equal(&one, &want, sizeof want);
    const size_t pieces[][4] = {{1, 15, 16, 968}, {7, 100, 3, 890}, {999, 1, 0, 0}, {16, 16, 17, 951}};
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        srv_sumsq s = {{0}, 0};
        size_t at = 0;
        for (size_t k = 0; k < 4; k++) {
            srv_sumsq_add(&s, x + at, pieces[p][k]);
            at += pieces[p][k];
        }
        assert_int_equal(at, M);
        double got = srv_sumsq_total(&s);
        assert_memory_equal(&got, &want, sizeof want);
    }
}

/* ---- clipping ------------------------------------------------------------- */

/* Read-only (in .rodata): writing to it would crash the test. */
static const float clip_g[N] = {
    3, -4, 1, 0, 2, -2, 0.5f, 1, -1, 3, 0, 0, 1, 2, -3, 4, 0.25f, -0.5f, 1,
    1, 2, 3, -1, -2, -3, 0, 1, 0, -1, 0.5f, 0.5f, 2, -2, 1, 1, -1, 3};

static double clip_norm_of(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

static void test_clip_above(void **state)
{
    float keep[N];
    memcpy(keep, clip_g, sizeof keep);
    double norm = clip_norm_of(clip_g, N);
    assert_true(norm > 2);
    for (int kind = 0; kind < 4; kind++) {
        ps_config c = cfg_for(kind);
        c.momentum = 0.9;
        c.clip_norm = 2;
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, N), 0);
        float w[N];
        init_w(w, N);
        srv_optim_apply(&o, w, clip_g, 0, N, 0);

        /* The same step without clipping on the scaled gradient. */
        float scaled[N], w2[N];
        double s = 2 / (norm + 1e-6);
        for (size_t i = 0; i < N; i++)
            scaled[i] = (float)(s * clip_g[i]);
        c.clip_norm = 0;
        srv_optim o2;
        assert_int_equal(srv_optim_init(&o2, &c, N), 0);
        init_w(w2, N);
        srv_optim_apply(&o2, w2, scaled, 0, N, 0);
        for (size_t i = 0; i < N; i++)
            if (fabsf(w[i] - w2[i]) > 1e-6f)
                fail_msg("%s: w[%zu] = %.9g, scaled-gradient step gives %.9g", srv_optim_kind_name(kind), i,
                         (double)w[i], (double)w2[i]);
        if (kind == PS_OPTIMIZER_SGD) /* the momentum buffer holds the clipped gradient */
            assert_true(fabs(clip_norm_of(o.velocity, N) - 2) < 1e-5);
        srv_optim_free(&o);
        srv_optim_free(&o2);
    }
    assert_memory_equal(keep, clip_g, sizeof keep);
}

static void test_clip_below(void **state)
{
    double norm = clip_norm_of(clip_g, N);
    for (int kind = 0; kind < 4; kind++) {
        float w1[N], w2[N];
        init_w(w1, N);
        init_w(w2, N);
        ps_config c = cfg_for(kind);
        c.momentum = 0.9;
        c.clip_norm = norm * 1.01; /* above the norm: no change at all */
        srv_optim a, b;
        assert_int_equal(srv_optim_init(&a, &c, N), 0);
        c.clip_norm = 0;
        assert_int_equal(srv_optim_init(&b, &c, N), 0);
        srv_optim_apply(&a, w1, clip_g, 0, N, 0);
        srv_optim_apply(&b, w2, clip_g, 0, N, 0);
        assert_memory_equal(w1, w2, sizeof w1);
        srv_optim_free(&a);
        srv_optim_free(&b);
    }
}

/* The norm is that of each call's gradient: a push in two chunks has each
 * chunk clipped on its own. */
static void test_clip_per_call(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.lr = 1;
    c.clip_norm = 1;
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, 4), 0);
    float w[4] = {0, 0, 0, 0};
    const float g[4] = {3, 4, 0.3f, 0.4f}; /* chunks of norm 5 and 0.5 */
    srv_optim_apply(&o, w, g, 0, 2, 0);
    srv_optim_apply(&o, w, g + 2, 2, 2, 0);
    assert_true(fabsf(w[0] + 0.6f) < 1e-6f && fabsf(w[1] + 0.8f) < 1e-6f); /* clipped to norm 1 */
    assert_true(w[2] == -0.3f && w[3] == -0.4f);                            /* under the limit */
    srv_optim_free(&o);
}

/* ---- schedules ------------------------------------------------------------ */

static double lr_at(const ps_config *c, uint64_t v)
{
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, c, 1), 0);
    double lr = srv_optim_lr(&o, v);
    srv_optim_free(&o);
    return lr;
}

#define assert_lr(c, v, want)                                                                                 \
    do {                                                                                                      \
        double got_ = lr_at((c), (v)), want_ = (want);                                                        \
        if (!(fabs(got_ - want_) <= 1e-12 * fabs(want_) + 1e-15))                                             \
            fail_msg("lr at version %llu = %.17g, want %.17g", (unsigned long long)(v), got_, want_);         \
    } while (0)

static void test_schedule_constant(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.lr = 0.1;
    assert_lr(&c, 0, 0.1);
    assert_lr(&c, 1, 0.1);
    assert_lr(&c, UINT64_MAX, 0.1);
    c.warmup_versions = 4;
    assert_lr(&c, 0, 0.025);        /* lr/warmup */
    assert_lr(&c, 1, 0.05);
    assert_lr(&c, 3, 0.1);          /* warmup-1: full rate */
    assert_true(lr_at(&c, 3) == 0.1); /* exactly */
    assert_lr(&c, 4, 0.1);
    assert_lr(&c, 1000000, 0.1);
    c.warmup_versions = 1; /* one version of warm-up is no warm-up */
    assert_lr(&c, 0, 0.1);
}

static void test_schedule_step(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.lr = 0.8;
    c.lr_schedule = PS_LR_STEP;
    c.lr_step_size = 3;
    c.lr_gamma = 0.5;
    assert_lr(&c, 0, 0.8);
    assert_lr(&c, 2, 0.8);
    assert_lr(&c, 3, 0.4);
    assert_lr(&c, 5, 0.4);
    assert_lr(&c, 6, 0.2);
    assert_lr(&c, 30, 0.8 / 1024);
    c.warmup_versions = 2;
    assert_lr(&c, 0, 0.4);          /* warm-up: lr*(v+1)/warmup */
    assert_lr(&c, 1, 0.8);          /* warmup-1 */
    assert_lr(&c, 2, 0.8);          /* warmup: u = 0 */
    assert_lr(&c, 4, 0.8);          /* u = 2, last of the first step */
    assert_lr(&c, 5, 0.4);          /* u = 3 */
    assert_lr(&c, 7, 0.4);
    assert_lr(&c, 8, 0.2);          /* u = 6 */
    double far = lr_at(&c, UINT64_MAX);
    assert_true(far >= 0 && far < 1e-300);
    c.lr_gamma = 1;
    assert_lr(&c, 1000, 0.8);
}

static void test_schedule_cosine(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.lr = 0.1;
    c.lr_min = 0.01;
    c.lr_schedule = PS_LR_COSINE;
    c.lr_decay_versions = 10;
    assert_lr(&c, 0, 0.1);
    assert_lr(&c, 5, 0.055);        /* half way: the mean of lr and lr_min */
    assert_lr(&c, 9, 0.01 + 0.09 * (1 + cos(acos(-1.0) * 0.9)) / 2);
    assert_lr(&c, 10, 0.01);        /* end of the decay */
    assert_true(lr_at(&c, 10) == 0.01);
    assert_lr(&c, 11, 0.01);        /* past the end: stays at lr_min */
    assert_lr(&c, UINT64_MAX, 0.01);
    c.warmup_versions = 5;
    assert_lr(&c, 0, 0.02);
    assert_lr(&c, 4, 0.1);          /* warmup-1 */
    assert_lr(&c, 5, 0.1);          /* warmup: u = 0, start of the cosine */
    assert_lr(&c, 10, 0.055);
    assert_lr(&c, 15, 0.01);        /* u = decay */
    assert_lr(&c, 16, 0.01);
    assert_lr(&c, 1000000, 0.01);
    c.lr_min = 0;
    assert_lr(&c, 10, 0.05);
    assert_lr(&c, 15, 0);
}

/* apply() takes its rate from the schedule at the version it is given. */
static void test_apply_uses_schedule(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_SGD);
    c.lr = 0.4;
    c.warmup_versions = 4;
    c.lr_schedule = PS_LR_STEP;
    c.lr_step_size = 2;
    c.lr_gamma = 0.5;
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, 1), 0);
    const float g[1] = {1};
    static const struct {
        uint64_t version;
        float lr;
    } steps[] = {{0, 0.1f}, {3, 0.4f}, {4, 0.4f}, {6, 0.2f}, {9, 0.1f}};
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        float w[1] = {0};
        srv_optim_apply(&o, w, g, 0, 1, steps[k].version);
        assert_true(fabsf(w[0] + steps[k].lr) < 1e-7f);
    }
    srv_optim_free(&o);
}

/* ---- reloads -------------------------------------------------------------- */

static void test_configure_keeps_state(void **state)
{
    ps_config c = cfg_for(PS_OPTIMIZER_ADAM);
    c.lr = 0.01;
    srv_optim o;
    assert_int_equal(srv_optim_init(&o, &c, N), 0);
    float *m = o.exp_avg, *v = o.exp_avg_sq;
    ref r;
    ref_init(&r, &c);
    float w[N], g[N];
    init_w(w, N);
    for (int t = 0; t < 3; t++) {
        make_grad(g, N, t);
        srv_optim_apply(&o, w, g, 0, N, (uint64_t)t);
        ref_step(&r, g, 0.01, t + 1);
    }
    /* A reload: new lr; the kind and the settings fixed at init stay. */
    ps_config c2 = c;
    c2.lr = 0.003;
    c2.optimizer = PS_OPTIMIZER_SGD;
    c2.beta1 = 0.5;
    c2.eps = 0.1;
    srv_optim_configure(&o, &c2);
    assert_int_equal(o.kind, PS_OPTIMIZER_ADAM);
    assert_string_equal(srv_optim_name(&o), "adam");
    assert_true(o.beta1 == 0.9 && o.eps == 1e-8 && o.lr == 0.003);
    assert_ptr_equal(o.exp_avg, m);
    assert_ptr_equal(o.exp_avg_sq, v);
    for (int t = 3; t < 6; t++) {
        make_grad(g, N, t);
        srv_optim_apply(&o, w, g, 0, N, (uint64_t)t);
        ref_step(&r, g, 0.003, t + 1);
    }
    assert_near(w, r.w, N, 1e-5, 1e-6, "w");
    assert_near(o.exp_avg, r.s1, N, 1e-5, 1e-7, "exp_avg");
    srv_optim_free(&o);
}

/* momentum 0 -> 0.9 by reload: the buffer appears then, zeroed (PyTorch
 * starts it at the first d); 0.9 -> 0: plain SGD, the buffer is kept and
 * left alone. With and without Nesterov. */
static void test_configure_momentum(void **state)
{
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        ps_config c = cfg_for(PS_OPTIMIZER_SGD);
        c.nesterov = nesterov;
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, N), 0);
        assert_int_equal(srv_optim_state_bytes(&o), 0);
        ref r;
        ref_init(&r, &c);
        float w[N], g[N];
        init_w(w, N);
        make_grad(g, N, 0);
        srv_optim_apply(&o, w, g, 0, N, 0);
        ref_step(&r, g, c.lr, 1);

        c.momentum = 0.9;
        srv_optim_configure(&o, &c);
        assert_int_equal(srv_optim_state_bytes(&o), N * sizeof(float));
        r.mu = 0.9;
        for (int t = 1; t < 4; t++) {
            make_grad(g, N, t);
            srv_optim_apply(&o, w, g, 0, N, (uint64_t)t);
            ref_step(&r, g, c.lr, t + 1);
        }
        assert_near(w, r.w, N, 1e-5, 1e-6, "w");

        c.momentum = 0;
        srv_optim_configure(&o, &c);
        float keep[N];
        memcpy(keep, o.velocity, sizeof keep);
        r.mu = 0;
        make_grad(g, N, 4);
        srv_optim_apply(&o, w, g, 0, N, 4);
        ref_step(&r, g, c.lr, 5);
        assert_near(w, r.w, N, 1e-5, 1e-6, "w");
        assert_memory_equal(o.velocity, keep, sizeof keep);
        srv_optim_free(&o);
    }
}

/* ---- ranges --------------------------------------------------------------- */

/* Applying to [off, off+len) of a 64-parameter model touches that range of
 * w and of the state only, and does there exactly what an optimizer of
 * len parameters does. */
static void test_range_offsets(void **state)
{
    enum { TOTAL = 64, OFF = 13, LEN = 35 };
    for (int kind = 0; kind < 4; kind++) {
        for (int clip = 0; clip < 2; clip++) {
            ps_config c = cfg_for(kind);
            c.momentum = 0.9;
            c.weight_decay = 0.01;
            c.clip_norm = clip ? 0.5 : 0;
            srv_optim big, small;
            assert_int_equal(srv_optim_init(&big, &c, TOTAL), 0);
            assert_int_equal(srv_optim_init(&small, &c, LEN), 0);
            float w[TOTAL], keep[TOTAL], ws[LEN], g[LEN];
            init_w(w, TOTAL);
            memcpy(keep, w, sizeof w);
            memcpy(ws, w + OFF, sizeof ws);
            for (int t = 0; t < 3; t++) {
                make_grad(g, LEN, t);
                srv_optim_apply(&big, w, g, OFF, LEN, (uint64_t)t);
                srv_optim_apply(&small, ws, g, 0, LEN, (uint64_t)t);
            }
            assert_memory_equal(w, keep, OFF * sizeof(float));
            assert_memory_equal(w + OFF + LEN, keep + OFF + LEN, (TOTAL - OFF - LEN) * sizeof(float));
            assert_memory_equal(w + OFF, ws, sizeof ws);
            float *bb[2], *sb[2];
            size_t nb = srv_optim_state_buffers(&big, bb, NULL, 2);
            assert_int_equal(srv_optim_state_buffers(&small, sb, NULL, 2), nb);
            assert_true(nb >= 1);
            for (size_t k = 0; k < nb; k++) {
                for (size_t i = 0; i < TOTAL; i++)
                    if ((i < OFF || i >= OFF + LEN) && bb[k][i] != 0.0f)
                        fail_msg("%s: state %zu touched at %zu outside the range", srv_optim_kind_name(kind), k,
                                 i);
                assert_memory_equal(bb[k] + OFF, sb[k], LEN * sizeof(float));
            }
            srv_optim_free(&big);
            srv_optim_free(&small);
        }
    }
}

/* A push in chunks: every chunk is applied at the same version (so Adam's
 * t is shared), and without clipping the result is that of one call. */
static void test_chunks_share_step(void **state)
{
    for (int kind = 0; kind < 4; kind++) {
        ps_config c = cfg_for(kind);
        c.momentum = 0.9;
        srv_optim a, b;
        assert_int_equal(srv_optim_init(&a, &c, N), 0);
        assert_int_equal(srv_optim_init(&b, &c, N), 0);
        float w1[N], w2[N], g[N];
        init_w(w1, N);
        init_w(w2, N);
        for (int t = 0; t < 3; t++) {
            make_grad(g, N, t);
            srv_optim_apply(&a, w1, g, 0, N, (uint64_t)t);
            srv_optim_apply(&b, w2, g, 0, 20, (uint64_t)t);
            srv_optim_apply(&b, w2, g + 20, 20, N - 20, (uint64_t)t);
        }
        assert_memory_equal(w1, w2, sizeof w1);
        srv_optim_free(&a);
        srv_optim_free(&b);
    }
}


/* ---- knowing an update stays finite without trying it --------------------- */

/* srv_optim_surely_finite() never answers 1 where srv_optim_finite() (the
 * update tried on copies) finds a result that is not finite: over every
 * kind, magnitudes of the gradient, parameters and state from 1e-3 to
 * 3e38, rates, weight decay, momentum and eps (0 too). And it answers 1
 * for the magnitudes training has, so the engine can skip the trial. */
static void test_surely_finite(void **state)
{
    const double mags[] = {0, 1e-3, 1, 1e3, 1e12, 1e15, 1e18, 1e25, 1e29, 1e30, 1e31, 1e36, 3.4e38};
    const size_t nm = sizeof mags / sizeof mags[0];
    struct {
        int kind;
        double lr, wd, mu, eps;
        int nesterov;
    } cases[] = {
        {PS_OPTIMIZER_SGD, 0.5, 0, 0, 1e-8, 0},       {PS_OPTIMIZER_SGD, 1000, 1, 0, 1e-8, 0},
        {PS_OPTIMIZER_SGD, 0.1, 1e-4, 0.9, 1e-8, 0},  {PS_OPTIMIZER_SGD, 10, 0.5, 0.99, 1e-8, 1},
        {PS_OPTIMIZER_ADAM, 1e-3, 0, 0, 1e-8, 0},     {PS_OPTIMIZER_ADAM, 10, 0.1, 0, 1e-12, 0},
        {PS_OPTIMIZER_ADAM, 1e-3, 0, 0, 0, 0},        {PS_OPTIMIZER_ADAMW, 0.1, 0.5, 0, 1e-8, 0},
        {PS_OPTIMIZER_ADAGRAD, 0.02, 0, 0, 1e-8, 0},  {PS_OPTIMIZER_ADAGRAD, 100, 2, 0, 1e-10, 0},
        {PS_OPTIMIZER_ADAGRAD, 0.02, 0, 0, 0, 0},
    };
    int said_sure = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ps_config c = cfg_for(cases[k].kind);
        c.lr = cases[k].lr;
        c.weight_decay = cases[k].wd;
        c.momentum = cases[k].mu;
        c.nesterov = cases[k].nesterov;
        c.eps = cases[k].eps;
        srv_optim o;
        assert_int_equal(srv_optim_init(&o, &c, 4), 0);
        float *bufs[2] = {NULL, NULL};
        size_t nb = srv_optim_state_buffers(&o, bufs, NULL, 2);
        for (size_t gi = 0; gi < nm; gi++)
            for (size_t wi = 0; wi < nm; wi++)
                for (size_t si = 0; si < nm; si++)
                    for (int version = 0; version < 100; version += 99) {
                        /* both signs, and the largest magnitudes where they count */
                        float g[4] = {(float)mags[gi], -(float)mags[gi], (float)mags[gi], 0};
                        float w[4] = {(float)mags[wi], -(float)mags[wi], -(float)mags[wi], (float)mags[wi]};
                        /* momentum and a first moment take either sign; what goes
                         * under a square root (adagrad's sum, adam's second
                         * moment) is never negative (the engine checks a
                         * checkpoint's) */
                        int signed1 = cases[k].kind == PS_OPTIMIZER_SGD || cases[k].kind == PS_OPTIMIZER_ADAM ||
                                      cases[k].kind == PS_OPTIMIZER_ADAMW;
                        for (size_t b = 0; b < nb; b++)
                            for (int i = 0; i < 4; i++)
                                bufs[b][i] = (float)mags[si] * (b == 0 && signed1 && i % 2 ? -1.0f : 1.0f);
                        srv_optim_step st;
                        srv_optim_begin(&o, &st, g, 4, (uint64_t)version);
                        int sure = srv_optim_surely_finite(&o, &st, mags[gi], mags[wi], nb > 0 ? mags[si] : 0,
                                                           nb > 1 ? mags[si] : 0);
                        int finite = srv_optim_finite(&o, &st, w, g, 0, 4);
                        if (sure && !finite)
                            fail_msg("kind %d case %zu: |g| %g, |w| %g, |state| %g, version %d: surely finite, "
                                     "but the trial is not", cases[k].kind, k, mags[gi], mags[wi], mags[si],
                                     version);
                        said_sure += sure;
                        if (cases[k].eps > 0 && mags[gi] <= 1e3 && mags[wi] <= 1e3 && mags[si] <= 1e3)
                            assert_true(sure); /* what training has: no trial */
                        if (cases[k].eps == 0 && cases[k].kind != PS_OPTIMIZER_SGD)
                            assert_false(sure); /* 0/0 is NaN: only the trial can tell */
                    }
        srv_optim_free(&o);
    }
    assert_true(said_sure > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_init_rejects_unknown_kind),
        cmocka_unit_test(test_state_per_kind),
        cmocka_unit_test(test_zero_parameters),
        cmocka_unit_test(test_sgd_plain),
        cmocka_unit_test(test_averaging_as_is),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_adam_step_is_version),
        cmocka_unit_test(test_pytorch_values),
        cmocka_unit_test(test_weight_decay_coupled_vs_decoupled),
        cmocka_unit_test(test_sumsq_one_order),
        cmocka_unit_test(test_clip_above),
        cmocka_unit_test(test_clip_below),
        cmocka_unit_test(test_clip_per_call),
        cmocka_unit_test(test_schedule_constant),
        cmocka_unit_test(test_schedule_step),
        cmocka_unit_test(test_schedule_cosine),
        cmocka_unit_test(test_apply_uses_schedule),
        cmocka_unit_test(test_configure_keeps_state),
        cmocka_unit_test(test_configure_momentum),
        cmocka_unit_test(test_range_offsets),
        cmocka_unit_test(test_chunks_share_step),
        cmocka_unit_test(test_surely_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
