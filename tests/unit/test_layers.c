/* test_layers.c - the dense and relu layers, the softmax head and the
 * softmax and mlp models against central finite differences; model specs and
 * their options, layout and initialisation; and a tiny training run that
 * must reach 100% accuracy. Convolution, pooling, dropout, least squares and
 * the cnn and linear models are in test_conv.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/layout.h"
#include "worker/layer.h"
#include "worker/model.h"
#include "worker/rng.h"

#include "gradcheck.h"

#define IN 7
#define HID 5
#define CLASSES 4
#define BATCH 3

static void test_dense_grad(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 1);
    ps_layer *l;
    assert_int_equal(ps_layer_dense_create("fc1", ps_shape_flat(IN), HID, BATCH, &l), 0);
    assert_int_equal(l->nparams, HID * IN + HID);
    assert_int_equal(l->ntensors, 2);
    assert_string_equal(l->tensors[0].name, "fc1.weight");
    assert_string_equal(l->tensors[1].name, "fc1.bias");

    float x[BATCH * IN];
    fill_normal(&rng, x, BATCH * IN, 1.0);
    check_stats st = {0};
    check_layer(l, x, BATCH, &rng, &st);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(st.checked, HID * IN + HID + BATCH * IN);

    /* A batch smaller than the maximum works too. */
    st = (check_stats){0};
    check_layer(l, x, 1, &rng, &st);
    assert_int_equal(st.skipped, 0);
    ps_layer_free(l);
}

static void test_dense_forward_values(void **state)
{
    (void)state;
    ps_layer *l;
    assert_int_equal(ps_layer_dense_create("fc", ps_shape_flat(2), 3, 2, &l), 0);
    /* W [3,2] row-major, then b [3]. */
    float p[9] = {1, 2, 3, 4, 5, 6, 0.5f, -1, 2}, g[9];
    ps_layer_bind(l, p, g);
    const float x[4] = {1, 1, 2, -1};
    float y[6];
    l->ops->forward(l, x, y, 2, 0);
    const float want[6] = {1 + 2 + 0.5f, 3 + 4 - 1, 5 + 6 + 2, 2 - 2 + 0.5f, 6 - 4 - 1, 10 - 6 + 2};
    for (int i = 0; i < 6; i++)
        assert_float_equal(y[i], want[i], 1e-6);
    ps_layer_free(l);
}

static void test_relu_grad(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 2);
    ps_layer *l;
    assert_int_equal(ps_layer_relu_create("relu1", ps_shape_flat(HID), BATCH, &l), 0);
    assert_int_equal(l->nparams, 0);
    assert_int_equal(l->ntensors, 0);
    /* Inputs at least 0.1 away from the kink, both signs. */
    float x[BATCH * HID];
    for (int i = 0; i < BATCH * HID; i++) {
        float v = 0.1f + (float)ps_rng_uniform(&rng);
        x[i] = (i % 3 == 0) ? -v : v;
    }
    check_stats st = {0};
    check_layer(l, x, BATCH, &rng, &st);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(st.checked, BATCH * HID);
    ps_layer_free(l);
}

typedef struct head_ctx {
    ps_head *h;
    const float *z;
    const ps_targets *t;
    int batch;
} head_ctx;

static double head_objective(void *p)
{
    head_ctx *c = p;
    return c->h->ops->loss(c->h, c->z, c->t, c->batch, 1.0f, NULL, NULL) / c->batch;
}

static void test_softmax_head(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 3);
    ps_head *h;
    assert_int_equal(ps_head_softmax_xent_create(ps_shape_flat(CLASSES), BATCH, &h), 0);
    float z[BATCH * CLASSES], dz[BATCH * CLASSES];
    fill_normal(&rng, z, BATCH * CLASSES, 2.0);
    const uint8_t y[BATCH] = {0, 3, 1};
    ps_targets t = {.labels = y, .values = NULL};

    size_t right = 0;
    double sum = h->ops->loss(h, z, &t, BATCH, 1.0f / BATCH, dz, &right);

    /* The loss and the count, recomputed here in double. */
    double want = 0.0;
    size_t want_right = 0;
    for (int r = 0; r < BATCH; r++) {
        const float *zr = z + r * CLASSES;
        double s = 0.0;
        int arg = 0;
        for (int j = 0; j < CLASSES; j++) {
            s += exp((double)zr[j]);
            if (zr[j] > zr[arg])
                arg = j;
        }
        want += log(s) - zr[y[r]];
        want_right += arg == y[r];
    }
    assert_float_equal(sum, want, 1e-5);
    assert_int_equal(right, want_right);

    /* Gradient rows sum to zero (softmax minus one-hot, scaled). */
    for (int r = 0; r < BATCH; r++) {
        double s = 0.0;
        for (int j = 0; j < CLASSES; j++)
            s += dz[r * CLASSES + j];
        assert_float_equal(s, 0.0, 1e-6);
    }

    head_ctx c = {h, z, &t, BATCH};
    check_stats st = {0};
    gradcheck("softmax-xent", z, dz, BATCH * CLASSES, head_objective, &c, &st);
    assert_int_equal(st.skipped, 0);

    /* Huge logits stay finite (stable form). */
    float big[CLASSES] = {1000.0f, -1000.0f, 999.0f, 0.0f};
    uint8_t y0 = 2;
    ps_targets t0 = {.labels = &y0, .values = NULL};
    double l = h->ops->loss(h, big, &t0, 1, 1.0f, dz, NULL);
    assert_true(isfinite(l));
    assert_float_equal(l, 1.0 + log1p(exp(-1.0)), 1e-4);
    ps_head_free(h);
}

/* ---- whole models -------------------------------------------------------- */

typedef struct model_ctx {
    ps_model *m;
    const float *x;
    const uint8_t *y;
    int batch;
} model_ctx;

static double model_objective(void *p)
{
    model_ctx *c = p;
    double loss, acc;
    ps_model_evaluate(c->m, c->x, c->y, (size_t)c->batch, &loss, &acc);
    return loss;
}

/* Gradient check of a whole model; returns the stats. */
static check_stats check_model(const char *spec, uint64_t seed)
{
    ps_rng rng;
    ps_rng_seed(&rng, seed);
    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create(spec, IN, CLASSES, BATCH, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, seed);
    const size_t np = ps_model_nparams(m);
    float *params = ps_model_params(m);
    /* Nonzero biases too, so every term of the gradient is exercised. */
    for (size_t i = 0; i < np; i++)
        if (params[i] == 0.0f)
            params[i] = (float)(0.3 * ps_rng_normal(&rng));

    float x[BATCH * IN];
    fill_normal(&rng, x, BATCH * IN, 1.0);
    const uint8_t y[BATCH] = {2, 0, 3};

    float *before = malloc(np * sizeof(float)), *g = malloc(np * sizeof(float));
    assert_non_null(before);
    assert_non_null(g);
    memcpy(before, params, np * sizeof(float));
    float loss = ps_model_train_step(m, x, y, BATCH);
    assert_memory_equal(params, before, np * sizeof(float)); /* a step leaves params alone */
    memcpy(g, ps_model_grads(m), np * sizeof(float));

    model_ctx c = {m, x, y, BATCH};
    double eval = model_objective(&c);
    assert_float_equal(loss, eval, 1e-5);
    assert_memory_equal(ps_model_grads(m), g, np * sizeof(float)); /* evaluate leaves grads alone */

    check_stats st = {0};
    gradcheck(spec, params, g, np, model_objective, &c, &st);
    assert_memory_equal(params, before, np * sizeof(float));
    if (getenv("PS_TEST_VERBOSE"))
        print_message("%s seed %llu: %zu checked, %zu skipped, worst error %.3f of tolerance\n", spec,
                      (unsigned long long)seed, st.checked, st.skipped, st.max_err);
    free(before);
    free(g);
    ps_model_free(m);
    return st;
}

static void test_softmax_model_grad(void **state)
{
    (void)state;
    check_stats st = check_model("softmax", 11);
    assert_int_equal(st.checked, CLASSES * IN + CLASSES);
    assert_int_equal(st.skipped, 0);
}

static void test_mlp_model_grad(void **state)
{
    (void)state;
    const char *specs[] = {"mlp:5", "mlp:6,5"};
    for (int s = 0; s < 2; s++) {
        for (uint64_t seed = 20; seed < 24; seed++) {
            check_stats st = check_model(specs[s], seed);
            size_t total = st.checked + st.skipped;
            if (st.skipped * 10 > total)
                fail_msg("%s seed %llu: %zu of %zu elements skipped as kinks", specs[s], (unsigned long long)seed,
                         st.skipped, total);
        }
    }
}

/* ---- specs, layout, init -------------------------------------------------- */

static void test_specs(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    struct {
        const char *spec, *msg;
    } bad[] = {
        {"xyz", "unknown model 'xyz': expected softmax, linear, mlp:H1,H2,... or cnn"},
        {"", "unknown model '': expected softmax, linear, mlp:H1,H2,... or cnn"},
        {"softmax2", "unknown model 'softmax2'"},
        {"MLP:5", "unknown model 'MLP:5'"},
        {"CNN", "unknown model 'CNN'"},
        {":dropout=0.5", "unknown model ':dropout=0.5'"},
        {"mlp", "bad model 'mlp': expected mlp:H1,H2,... with at least one hidden size"},
        {"mlp:", "expected mlp:H1,H2,... with at least one hidden size"},
        {"mlp:0", "bad hidden size '0' in model 'mlp:0'"},
        {"mlp:abc", "bad hidden size 'abc' in model 'mlp:abc'"},
        {"mlp:5,", "bad hidden size '' in model 'mlp:5,'"},
        {"mlp:5,,3", "bad hidden size '' in model 'mlp:5,,3'"},
        {"mlp:-3", "bad hidden size '-3'"},
        {"mlp: 5", "bad hidden size ' 5'"},
        {"mlp:5x", "bad hidden size '5x'"},
        {"mlp:65537", "bad hidden size '65537'"},
        {"mlp:99999999999999999999", "bad hidden size '99999999999999999999'"},
        /* options */
        {"mlp:5:", "bad model 'mlp:5:': empty options after ':'"},
        {"cnn:", "bad model 'cnn:': empty options after ':'"},
        {"mlp:5:dropout=0.5:x", "bad model 'mlp:5:dropout=0.5:x': too many ':' sections"},
        {"cnn:dropout=0.5:init=he", "too many ':' sections (expected kind[:options])"},
        {"softmax:5", "bad option '5' in model 'softmax:5': expected name=value"},
        {"cnn:dropout", "bad option 'dropout' in model 'cnn:dropout': expected name=value"},
        {"cnn:=0.5", "bad option '=0.5'"},
        {"cnn:dropout=0.5,", "bad option '' in model 'cnn:dropout=0.5,'"},
        {"cnn:dropout=1", "bad dropout '1' in model 'cnn:dropout=1': expected a probability from 0 to below 1"},
        {"cnn:dropout=", "bad dropout ''"},
        {"cnn:dropout=-0.1", "bad dropout '-0.1'"},
        {"cnn:dropout=0.5x", "bad dropout '0.5x'"},
        {"cnn:dropout=nan", "bad dropout 'nan'"},
        {"cnn:dropout=1e-1", "bad dropout '1e-1'"},
        {"cnn:dropout= 0.5", "bad dropout ' 0.5'"},
        {"cnn:dropout=0.99999999", "bad dropout '0.99999999'"},
        {"cnn:dropout=0.5,dropout=0.2", "bad model 'cnn:dropout=0.5,dropout=0.2': dropout given twice"},
        {"softmax:dropout=0.5", "bad model 'softmax:dropout=0.5': dropout applies to mlp and cnn models only"},
        {"linear:dropout=0.1", "dropout applies to mlp and cnn models only"},
        {"cnn:init=xavier", "bad init 'xavier' in model 'cnn:init=xavier': expected he or torch"},
        {"cnn:init=he,init=torch", "init given twice"},
        {"cnn:foo=1", "unknown option 'foo' in model 'cnn:foo=1': expected dropout=P or init=he|torch"},
        {"mlp:5:Dropout=0.5", "unknown option 'Dropout'"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        m = (ps_model *)1;
        assert_int_equal(ps_model_create(bad[i].spec, IN, CLASSES, BATCH, &m, err, sizeof(err)), PS_EINVAL);
        assert_null(m);
        assert_msg_has(err, bad[i].msg);
    }
    char many[256] = "mlp:1";
    for (int i = 0; i < PS_MODEL_MAX_HIDDEN; i++)
        strcat(many, ",1");
    assert_int_equal(ps_model_create(many, IN, CLASSES, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "more than 32 hidden layers");

    assert_int_equal(ps_model_create("softmax", 0, CLASSES, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "bad model sizes");
    assert_int_equal(ps_model_create("softmax", IN, 1, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_int_equal(ps_model_create("softmax", IN, 257, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_int_equal(ps_model_create("softmax", IN, CLASSES, 0, &m, err, sizeof(err)), PS_EINVAL);
    assert_int_equal(ps_model_create("xyz", IN, CLASSES, BATCH, &m, NULL, 0), PS_EINVAL);

    char longspec[PS_MODEL_SPEC_MAX + 2];
    memset(longspec, '1', sizeof(longspec));
    memcpy(longspec, "mlp:", 4);
    longspec[sizeof(longspec) - 1] = '\0';
    assert_int_equal(ps_model_create(longspec, IN, CLASSES, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "model spec too long: 256 characters, at most 255");
    assert_int_equal(ps_model_create(NULL, IN, CLASSES, BATCH, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "no model given");

    assert_int_equal(ps_model_create("mlp:65536", IN, CLASSES, 1, &m, err, sizeof(err)), 0);
    ps_model_free(m);
    ps_model_free(NULL);

    /* Well-formed options; dropout adds no parameters, dropout=0 no layers. */
    const char *good[] = {"mlp:6,5:dropout=0.2", "mlp:6,5:dropout=0", "mlp:6,5:init=torch,dropout=.5",
                          "mlp:6,5:dropout=0.25,init=he", "softmax:init=torch", "softmax:init=he"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        if (ps_model_create(good[i], IN, CLASSES, BATCH, &m, err, sizeof(err)) != 0)
            fail_msg("%s: %s", good[i], err);
        size_t want = strncmp(good[i], "mlp", 3) == 0 ? (size_t)(6 * IN + 6 + 5 * 6 + 5 + CLASSES * 5 + CLASSES)
                                                      : (size_t)(CLASSES * IN + CLASSES);
        assert_int_equal(ps_model_nparams(m), want);
        ps_model_free(m);
    }
}

static void test_layout(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("mlp:5,6", IN, CLASSES, BATCH, &m, err, sizeof(err)), 0);
    const size_t want = 5 * IN + 5 + 6 * 5 + 6 + CLASSES * 6 + CLASSES;
    assert_int_equal(ps_model_nparams(m), want);
    assert_int_equal(ps_model_max_batch(m), BATCH);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    assert_int_equal(lay.ntensors, 6);
    assert_int_equal(lay.total, want);
    const char *names[6] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
    const uint32_t d0[6] = {5, 5, 6, 6, CLASSES, CLASSES}, d1[6] = {IN, 0, 5, 0, 6, 0};
    uint64_t off = 0;
    for (int i = 0; i < 6; i++) {
        assert_string_equal(lay.t[i].name, names[i]);
        assert_int_equal(lay.t[i].ndim, d1[i] ? 2 : 1);
        assert_int_equal(lay.t[i].dims[0], d0[i]);
        if (d1[i])
            assert_int_equal(lay.t[i].dims[1], d1[i]);
        assert_int_equal(lay.t[i].offset, off);
        off += lay.t[i].count;
    }
    char buf[128];
    ps_model_describe(m, buf, sizeof(buf));
    assert_string_equal(buf, "mlp:5,6 7-5-6-4, 104 params");
    char tiny[5];
    ps_model_describe(m, tiny, sizeof(tiny));
    assert_string_equal(tiny, "mlp:");
    ps_model_free(m);

    assert_int_equal(ps_model_create("softmax", 784, 10, 64, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    assert_int_equal(lay.ntensors, 2);
    assert_string_equal(lay.t[0].name, "fc1.weight");
    assert_int_equal(lay.t[0].dims[0], 10);
    assert_int_equal(lay.t[0].dims[1], 784);
    assert_int_equal(ps_model_nparams(m), 7850);
    ps_model_free(m);
}

static void test_init(void **state)
{
    (void)state;
    ps_model *a, *b;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("mlp:256", 784, 10, 8, &a, err, sizeof(err)), 0);
    assert_int_equal(ps_model_create("mlp:256", 784, 10, 8, &b, err, sizeof(err)), 0);
    const size_t np = ps_model_nparams(a);
    for (size_t i = 0; i < np; i++) /* created at zero */
        assert_true(ps_model_params(a)[i] == 0.0f);
    ps_model_init_params(a, 5);
    ps_model_init_params(b, 5);
    assert_memory_equal(ps_model_params(a), ps_model_params(b), np * sizeof(float));
    ps_model_init_params(b, 6);
    assert_memory_not_equal(ps_model_params(a), ps_model_params(b), np * sizeof(float));

    assert_int_equal(ps_model_layout(a, &lay), 0);
    const float *p = ps_model_params(a);
    for (uint32_t t = 0; t < lay.ntensors; t++) {
        const ps_tensor_desc *d = &lay.t[t];
        if (d->ndim == 1) {
            for (uint64_t i = 0; i < d->count; i++)
                assert_true(p[d->offset + i] == 0.0f);
            continue;
        }
        double s = 0, sq = 0;
        for (uint64_t i = 0; i < d->count; i++) {
            s += p[d->offset + i];
            sq += (double)p[d->offset + i] * p[d->offset + i];
        }
        double mean = s / (double)d->count, sd = sqrt(sq / (double)d->count - mean * mean);
        double want = sqrt(2.0 / d->dims[1]);
        /* 200704 and 2560 draws: a few standard errors of the estimate. */
        double tol = d->count > 100000 ? 0.01 : 0.05;
        if (fabs(sd / want - 1.0) > tol || fabs(mean) > 4 * want / sqrt((double)d->count))
            fail_msg("%s: mean %g sd %g, want sd %g", d->name, mean, sd, want);
    }
    ps_model_free(a);
    ps_model_free(b);
}

/* init=torch: weights and biases uniform in +-1/sqrt(fan_in), as PyTorch's
 * nn.Linear starts. */
static void test_init_torch(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("mlp:256:init=torch", 784, 10, 8, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 5);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    const float *p = ps_model_params(m);
    for (uint32_t t = 0; t < lay.ntensors; t++) {
        const ps_tensor_desc *d = &lay.t[t];
        const uint32_t fan_in = d->ndim == 2 ? d->dims[1] : (t == 1 ? 784 : 256); /* a bias follows its weight */
        const double bound = 1.0 / sqrt((double)fan_in);
        double s = 0, sq = 0, big = 0;
        for (uint64_t i = 0; i < d->count; i++) {
            const double v = p[d->offset + i];
            s += v;
            sq += v * v;
            big = fmax(big, fabs(v));
        }
        const double mean = s / (double)d->count, sd = sqrt(sq / (double)d->count - mean * mean);
        if (big > bound)
            fail_msg("%s: |value| %g above the bound %g", d->name, big, bound);
        if (d->count >= 256 && (fabs(sd / (bound / sqrt(3.0)) - 1.0) > 0.1 || big < 0.9 * bound))
            fail_msg("%s: sd %g, max %g; want sd %g, max near %g", d->name, sd, big, bound / sqrt(3.0), bound);
        if (d->count < 256 && big == 0.0)
            fail_msg("%s: all zero", d->name);
    }
    ps_model_free(m);
}

static void test_evaluate_chunks(void **state)
{
    (void)state;
    ps_model *small, *big;
    char err[256];
    enum { NS = 10 };
    assert_int_equal(ps_model_create("mlp:6", IN, CLASSES, 4, &small, err, sizeof(err)), 0);
    assert_int_equal(ps_model_create("mlp:6", IN, CLASSES, 16, &big, err, sizeof(err)), 0);
    ps_model_init_params(small, 9);
    ps_model_init_params(big, 9);
    ps_rng rng;
    ps_rng_seed(&rng, 10);
    float x[NS * IN];
    uint8_t y[NS];
    fill_normal(&rng, x, NS * IN, 1.0);
    for (int i = 0; i < NS; i++)
        y[i] = (uint8_t)ps_rng_below(&rng, CLASSES);
    double l1, a1, l2, a2;
    ps_model_evaluate(small, x, y, NS, &l1, &a1); /* chunks of 4, 4, 2 */
    ps_model_evaluate(big, x, y, NS, &l2, &a2);   /* one chunk */
    assert_float_equal(l1, l2, 1e-5);
    assert_float_equal(a1, a2, 1e-12);
    ps_model_evaluate(small, x, y, 0, &l1, &a1);
    assert_true(l1 == 0.0 && a1 == 0.0);
    ps_model_free(small);
    ps_model_free(big);
}

/* ---- learning ------------------------------------------------------------- */

/* A linearly separable problem: labels from a random linear teacher, keeping
 * only points whose top score beats the runner-up by a margin. */
static void make_separable(ps_rng *rng, float *x, uint8_t *y, int n)
{
    float w[CLASSES * IN];
    fill_normal(rng, w, CLASSES * IN, 1.0);
    for (int i = 0; i < n;) {
        float *xi = x + (size_t)i * IN;
        fill_normal(rng, xi, IN, 1.0);
        double s[CLASSES];
        int best = 0;
        for (int c = 0; c < CLASSES; c++) {
            s[c] = 0;
            for (int j = 0; j < IN; j++)
                s[c] += (double)w[c * IN + j] * xi[j];
            if (s[c] > s[best])
                best = c;
        }
        double second = -INFINITY;
        for (int c = 0; c < CLASSES; c++)
            if (c != best && s[c] > second)
                second = s[c];
        if (s[best] - second < 0.5)
            continue;
        y[i++] = (uint8_t)best;
    }
}

static void check_learns(const char *spec, float lr, int steps)
{
    enum { NS = 64, B = 16 };
    ps_rng rng;
    ps_rng_seed(&rng, 77);
    float x[NS * IN];
    uint8_t y[NS];
    make_separable(&rng, x, y, NS);

    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create(spec, IN, CLASSES, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 3);
    const size_t np = ps_model_nparams(m);
    float *p = ps_model_params(m), *g = ps_model_grads(m);

    double loss0, acc0, loss, acc;
    ps_model_evaluate(m, x, y, NS, &loss0, &acc0);
    for (int s = 0; s < steps; s++) {
        int off = (s * B) % NS;
        ps_model_train_step(m, x + (size_t)off * IN, y + off, B);
        for (size_t i = 0; i < np; i++)
            p[i] -= lr * g[i];
    }
    ps_model_evaluate(m, x, y, NS, &loss, &acc);
    print_message("%s: loss %.4f -> %.4f, accuracy %.3f -> %.3f after %d steps\n", spec, loss0, loss, acc0, acc,
                  steps);
    assert_true(loss < 0.1 * loss0);
    assert_true(acc == 1.0);
    ps_model_free(m);
}

static void test_sgd_learns(void **state)
{
    (void)state;
    check_learns("softmax", 0.5f, 300);
    check_learns("mlp:16", 0.2f, 300);
    check_learns("mlp:16,8", 0.2f, 400);
}

/* psworker's own SGD step (local SGD, elastic averaging): without a
 * velocity w -= lr g; with one, heavy ball as PyTorch's SGD: after steps
 * with gradients g1, g2 the parameters are w - lr g1 - lr (m g1 + g2). */
static void test_sgd_step_momentum(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create("mlp:5", IN, CLASSES, BATCH, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 3);
    const size_t np = ps_model_nparams(m);
    float *w = ps_model_params(m), *g = ps_model_grads(m);
    float *w0 = malloc(np * sizeof *w0), *vel = calloc(np, sizeof *vel);
    assert_non_null(w0);
    assert_non_null(vel);
    memcpy(w0, w, np * sizeof *w0);
    const float lr = 0.5f, mom = 0.9f;

    for (size_t i = 0; i < np; i++)
        g[i] = (float)(i % 7) - 3.0f; /* g1 */
    ps_model_sgd_step(m, NULL, lr, mom); /* no velocity: momentum unused */
    for (size_t i = 0; i < np; i++)
        assert_float_equal(w[i], w0[i] - lr * g[i], 1e-6);

    memcpy(w, w0, np * sizeof *w0);
    ps_model_sgd_step(m, vel, lr, mom); /* v = g1 */
    for (size_t i = 0; i < np; i++)
        g[i] = 0.25f * (float)(i % 5); /* g2 */
    ps_model_sgd_step(m, vel, lr, mom); /* v = m g1 + g2 */
    for (size_t i = 0; i < np; i++) {
        const float g1 = (float)(i % 7) - 3.0f, g2 = 0.25f * (float)(i % 5);
        assert_float_equal(vel[i], mom * g1 + g2, 1e-6);
        assert_float_equal(w[i], w0[i] - lr * g1 - lr * (mom * g1 + g2), 1e-5);
    }
    free(w0);
    free(vel);
    ps_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_forward_values),
        cmocka_unit_test(test_sgd_step_momentum),
        cmocka_unit_test(test_dense_grad),
        cmocka_unit_test(test_relu_grad),
        cmocka_unit_test(test_softmax_head),
        cmocka_unit_test(test_softmax_model_grad),
        cmocka_unit_test(test_mlp_model_grad),
        cmocka_unit_test(test_specs),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_init_torch),
        cmocka_unit_test(test_evaluate_chunks),
        cmocka_unit_test(test_sgd_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
