/* test_conv.c - the conv2d, maxpool and dropout layers and the least-squares
 * head against direct computation and central finite differences; the "cnn"
 * and "linear" models: layout, parameter count, initialisation, gradients,
 * and training runs that must fit small synthetic problems. */
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

/* ---- conv2d -------------------------------------------------------------- */

typedef struct conv_case {
    int c, h, w, oc, kh, kw, stride, pad;
} conv_case;

/* Covers: one and several channels in and out, non-square kernels and
 * inputs, padding, strides 2 and 3, the 1x1 path without im2col, and both
 * ways of forming dW (K = c*kh*kw above and below P = out_h*out_w). */
static const conv_case conv_cases[] = {
    {1, 6, 6, 2, 3, 3, 1, 0}, /* K 9 < P 16 */
    {3, 7, 5, 4, 3, 2, 1, 1}, /* padding, kernel 3x2 */
    {2, 9, 8, 3, 3, 3, 2, 1}, /* stride 2 and padding */
    {2, 8, 8, 3, 3, 3, 3, 2}, /* stride 3, padding 2 */
    {4, 4, 4, 3, 3, 3, 1, 0}, /* K 36 > P 4 */
    {2, 3, 4, 3, 3, 3, 1, 2}, /* padding wider than the rows a tap reads */
    {5, 3, 3, 2, 1, 1, 1, 0}, /* pointwise: col is the input */
    {1, 4, 4, 2, 5, 5, 1, 1}, /* kernel larger than the input, fits the padding */
};

static int conv_out(int n, int k, int s, int pad)
{
    return (n + 2 * pad - k) / s + 1;
}

/* The textbook loop nest, PyTorch's definition of nn.Conv2d. */
static void conv_ref(const conv_case *k, const float *x, const float *w, const float *b, float *y)
{
    const int oh = conv_out(k->h, k->kh, k->stride, k->pad), ow = conv_out(k->w, k->kw, k->stride, k->pad);
    for (int o = 0; o < k->oc; o++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                double acc = b[o];
                for (int c = 0; c < k->c; c++)
                    for (int i = 0; i < k->kh; i++)
                        for (int j = 0; j < k->kw; j++) {
                            int yy = oy * k->stride - k->pad + i, xx = ox * k->stride - k->pad + j;
                            if (yy < 0 || yy >= k->h || xx < 0 || xx >= k->w)
                                continue;
                            acc += (double)w[((o * k->c + c) * k->kh + i) * k->kw + j] *
                                   x[(c * k->h + yy) * k->w + xx];
                        }
                y[(o * oh + oy) * ow + ox] = (float)acc;
            }
}

static void test_conv_forward_values(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 101);
    enum { B = 2 };
    for (size_t t = 0; t < sizeof(conv_cases) / sizeof(conv_cases[0]); t++) {
        const conv_case *k = &conv_cases[t];
        ps_layer *l;
        ps_shape in = {k->c, k->h, k->w};
        assert_int_equal(ps_layer_conv2d_create("conv1", in, k->oc, k->kh, k->kw, k->stride, k->pad, B, &l), 0);
        const int oh = conv_out(k->h, k->kh, k->stride, k->pad), ow = conv_out(k->w, k->kw, k->stride, k->pad);
        assert_int_equal(l->out.c, k->oc);
        assert_int_equal(l->out.h, oh);
        assert_int_equal(l->out.w, ow);
        const size_t nin = ps_shape_size(in), nout = ps_shape_size(l->out);
        float *p = ps_falloc(l->nparams), *g = ps_falloc(l->nparams);
        float *x = ps_falloc(B * nin), *y = ps_falloc(B * nout), *want = ps_falloc(nout);
        ps_layer_bind(l, p, g);
        fill_normal(&rng, p, l->nparams, 1.0);
        fill_normal(&rng, x, B * nin, 1.0);
        l->ops->forward(l, x, y, B, 0);
        const float *w = p, *b = p + (size_t)k->oc * k->c * k->kh * k->kw;
        for (int r = 0; r < B; r++) {
            conv_ref(k, x + r * nin, w, b, want);
            for (size_t i = 0; i < nout; i++)
                if (fabsf(y[r * nout + i] - want[i]) > 1e-4f * (1.0f + fabsf(want[i])))
                    fail_msg("case %zu sample %d out[%zu]: %g, want %g", t, r, i, (double)y[r * nout + i],
                             (double)want[i]);
        }
        free(p);
        free(g);
        free(x);
        free(y);
        free(want);
        ps_layer_free(l);
    }
}

static void test_conv_grad(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 102);
    enum { B = 3 };
    for (size_t t = 0; t < sizeof(conv_cases) / sizeof(conv_cases[0]); t++) {
        const conv_case *k = &conv_cases[t];
        ps_layer *l;
        ps_shape in = {k->c, k->h, k->w};
        assert_int_equal(ps_layer_conv2d_create("conv1", in, k->oc, k->kh, k->kw, k->stride, k->pad, B, &l), 0);
        const size_t nin = ps_shape_size(in);
        float *x = ps_falloc(B * nin);
        fill_normal(&rng, x, B * nin, 1.0);
        for (int batch = B; batch >= 1; batch -= B - 1) { /* the maximum, and a smaller batch */
            check_stats st = {0};
            check_layer(l, x, batch, &rng, &st);
            assert_int_equal(st.skipped, 0); /* linear in both: no kinks */
            assert_int_equal(st.checked, l->nparams + batch * nin);
        }
        free(x);
        ps_layer_free(l);
    }
}

static void test_conv_create(void **state)
{
    (void)state;
    ps_layer *l = (ps_layer *)1;
    ps_shape in = {3, 8, 6};
    assert_int_equal(ps_layer_conv2d_create("conv2", in, 4, 3, 2, 1, 0, 5, &l), 0);
    assert_int_equal(l->nparams, 4 * 3 * 3 * 2 + 4);
    assert_int_equal(l->ntensors, 2);
    assert_string_equal(l->tensors[0].name, "conv2.weight");
    assert_int_equal(l->tensors[0].ndim, 4);
    const uint32_t dims[4] = {4, 3, 3, 2};
    for (int i = 0; i < 4; i++)
        assert_int_equal(l->tensors[0].dims[i], dims[i]);
    assert_string_equal(l->tensors[1].name, "conv2.bias");
    assert_int_equal(l->tensors[1].ndim, 1);
    assert_int_equal(l->tensors[1].dims[0], 4);
    assert_int_equal(l->tensors[1].offset, 4 * 3 * 3 * 2);
    assert_string_equal(l->ops->kind, "conv2d");
    ps_layer_free(l);

    struct {
        ps_shape in;
        int oc, kh, kw, stride, pad, batch;
    } bad[] = {
        {{3, 8, 6}, 4, 9, 3, 1, 0, 1},                   /* kernel taller than the input */
        {{3, 8, 6}, 4, 3, 9, 1, 1, 1},                   /* wider than the padded input */
        {{3, 8, 6}, 0, 3, 3, 1, 0, 1},                   /* no filters */
        {{3, 8, 6}, 4, 0, 3, 1, 0, 1},                   /* empty kernel */
        {{3, 8, 6}, 4, 3, 3, 0, 0, 1},                   /* stride 0 */
        {{3, 8, 6}, 4, 3, 3, 1, -1, 1},                  /* negative padding */
        {{3, 8, 6}, 4, 3, 3, 1, 0, 0},                   /* batch 0 */
        {{0, 8, 6}, 4, 3, 3, 1, 0, 1},                   /* no channels */
        {{3, 8, 6}, 4, PS_CONV_MAX_K + 1, 3, 1, 0, 1},   /* kernel over the limit */
        {{3, 8, 6}, 4, 3, 3, 1, PS_CONV_MAX_K, 1},       /* padding over the limit */
        {{1, 100000, 100000}, 4, 3, 3, 1, 0, 1},         /* input too big */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        l = (ps_layer *)1;
        if (ps_layer_conv2d_create("c", bad[i].in, bad[i].oc, bad[i].kh, bad[i].kw, bad[i].stride, bad[i].pad,
                                   bad[i].batch, &l) != PS_EINVAL)
            fail_msg("bad conv case %zu accepted", i);
        assert_null(l);
    }
}

/* ---- maxpool -------------------------------------------------------------- */

static void test_maxpool_values(void **state)
{
    (void)state;
    ps_layer *l;
    ps_shape in = {2, 5, 5};
    assert_int_equal(ps_layer_maxpool_create("pool1", in, 2, 2, &l), 0);
    assert_int_equal(l->nparams, 0);
    assert_int_equal(l->out.c, 2);
    assert_int_equal(l->out.h, 2); /* the fifth row and column are dropped */
    assert_int_equal(l->out.w, 2);
    float x[50];
    for (int i = 0; i < 25; i++)
        x[i] = (float)((i * 7) % 25); /* distinct values */
    for (int i = 0; i < 25; i++)
        x[25 + i] = 1.0f; /* all ties: the first element of each window wins */
    x[25 + 6] = -1.0f;    /* ... also when a later one is smaller */
    x[25 + 24] = 99.0f;   /* outside every window */
    float y[8];
    l->ops->forward(l, x, y, 1, 1);
    /* Channel 0 is (7i mod 25) row-major: the windows hold {0, 7, 10, 17},
     * {14, 21, 24, 6}, {20, 2, 5, 12} and {9, 16, 19, 1}. */
    const float want[8] = {17, 24, 20, 19, 1, 1, 1, 1};
    for (int i = 0; i < 8; i++)
        assert_float_equal(y[i], want[i], 0);
    const float dout[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float din[50];
    memset(din, 0x7f, sizeof(din)); /* backward must overwrite all of it */
    l->ops->backward(l, x, y, dout, din, 1);
    float dwant[50] = {0};
    dwant[6] = 1;  /* 17 */
    dwant[7] = 2;  /* 24 */
    dwant[10] = 3; /* 20 */
    dwant[17] = 4; /* 19 */
    dwant[25 + 0] = 5; /* ties: the first of each window */
    dwant[25 + 2] = 6;
    dwant[25 + 10] = 7;
    dwant[25 + 12] = 8;
    for (int i = 0; i < 50; i++)
        if (din[i] != dwant[i])
            fail_msg("din[%d] = %g, want %g", i, (double)din[i], (double)dwant[i]);
    l->ops->backward(l, x, y, dout, NULL, 1); /* first layer: nothing to do */
    ps_layer_free(l);

    l = (ps_layer *)1;
    ps_shape tiny = {1, 1, 4};
    assert_int_equal(ps_layer_maxpool_create("p", tiny, 2, 1, &l), PS_EINVAL);
    assert_null(l);
    assert_int_equal(ps_layer_maxpool_create("p", in, 0, 1, &l), PS_EINVAL);
}

static void test_maxpool_grad(void **state)
{
    (void)state;
    ps_rng rng;
    ps_rng_seed(&rng, 103);
    enum { B = 2 };
    ps_shape in = {3, 6, 7};
    const size_t n = B * ps_shape_size(in);
    /* Distinct values 0.05 apart in random order: a step of EPS1 never
     * changes a window's winner, so there are no kinks to skip. */
    size_t *perm = malloc(n * sizeof(size_t));
    float *x = ps_falloc(n);
    ps_rng_permutation(&rng, perm, n);
    for (int size = 2; size <= 3; size++) {
        for (size_t i = 0; i < n; i++)
            x[i] = 0.05f * (float)perm[i] - 3.0f;
        ps_layer *l;
        assert_int_equal(ps_layer_maxpool_create("pool", in, size, B, &l), 0);
        assert_int_equal(l->out.h, 6 / size);
        assert_int_equal(l->out.w, 7 / size);
        check_stats st = {0};
        check_layer(l, x, B, &rng, &st);
        assert_int_equal(st.skipped, 0);
        assert_int_equal(st.checked, n);
        ps_layer_free(l);
    }
    free(perm);
    free(x);
}

/* ---- dropout -------------------------------------------------------------- */

static void test_dropout_statistics(void **state)
{
    (void)state;
    enum { N = 200000 };
    const float p = 0.3f;
    ps_layer *l;
    assert_int_equal(ps_layer_dropout_create("drop1", ps_shape_flat(N / 2), p, 7, 2, &l), 0);
    assert_int_equal(l->nparams, 0);
    assert_string_equal(l->ops->kind, "dropout");
    float *x = ps_falloc(N), *y = ps_falloc(N);
    ps_rng rng;
    ps_rng_seed(&rng, 104);
    for (size_t i = 0; i < N; i++)
        x[i] = 1.0f + (float)ps_rng_uniform(&rng); /* never zero */

    l->ops->forward(l, x, y, 2, 1);
    size_t zeros = 0;
    for (size_t i = 0; i < N; i++) {
        if (y[i] == 0.0f)
            zeros++;
        else if (y[i] != x[i] * (1.0f / (1.0f - p)))
            fail_msg("y[%zu] = %g, want %g scaled by 1/(1-p)", i, (double)y[i], (double)x[i]);
    }
    /* sd of the fraction: sqrt(0.21 / N) ~ 0.001 */
    const double frac = (double)zeros / N;
    if (fabs(frac - p) > 0.006)
        fail_msg("dropped fraction %g, want %g", frac, (double)p);
    /* Both halves of a 64-bit draw decide: no pairing pattern. */
    size_t both = 0;
    for (size_t i = 0; i + 1 < N; i += 2)
        both += y[i] == 0.0f && y[i + 1] == 0.0f;
    if (fabs((double)both / (N / 2) - (double)(p * p)) > 0.01)
        fail_msg("pairs dropped together: %g, want %g", (double)both / (N / 2), (double)(p * p));

    /* Evaluation is the identity. */
    l->ops->forward(l, x, y, 2, 0);
    assert_memory_equal(x, y, N * sizeof(float));
    ps_layer_free(l);

    /* p = 0 is the identity even while training. */
    assert_int_equal(ps_layer_dropout_create("drop0", ps_shape_flat(N), 0.0f, 7, 1, &l), 0);
    l->ops->forward(l, x, y, 1, 1);
    assert_memory_equal(x, y, N * sizeof(float));
    ps_layer_free(l);

    l = (ps_layer *)1;
    assert_int_equal(ps_layer_dropout_create("d", ps_shape_flat(4), 1.0f, 7, 1, &l), PS_EINVAL);
    assert_null(l);
    assert_int_equal(ps_layer_dropout_create("d", ps_shape_flat(4), -0.1f, 7, 1, &l), PS_EINVAL);
    assert_int_equal(ps_layer_dropout_create("d", ps_shape_flat(4), NAN, 7, 1, &l), PS_EINVAL);
    free(x);
    free(y);
}

static void test_dropout_mask(void **state)
{
    (void)state;
    enum { N = 64, B = 3 };
    const float p = 0.5f, scale = 2.0f;
    ps_layer *l;
    ps_shape in = {4, 4, 4};
    assert_int_equal(ps_layer_dropout_create("drop", in, p, 1, B, &l), 0);
    float x[B * N], y[B * N], y2[B * N], g[B * N], din[B * N];
    ps_rng rng;
    ps_rng_seed(&rng, 105);
    for (int i = 0; i < B * N; i++)
        x[i] = 0.5f + (float)ps_rng_uniform(&rng);
    fill_normal(&rng, g, B * N, 1.0);

    /* The backward applies the mask of the forward before it. */
    l->ops->forward(l, x, y, B, 1);
    l->ops->backward(l, x, y, g, din, B);
    int dropped = 0;
    for (int i = 0; i < B * N; i++) {
        dropped += y[i] == 0.0f;
        assert_true(din[i] == (y[i] != 0.0f ? g[i] * scale : 0.0f));
    }
    assert_true(dropped > 0 && dropped < B * N);

    /* Each training forward draws a new mask; a reseed replays the stream. */
    l->ops->reseed(l, 9);
    l->ops->forward(l, x, y, B, 1);
    l->ops->forward(l, x, y2, B, 1);
    assert_memory_not_equal(y, y2, sizeof(y));
    l->ops->reseed(l, 9);
    l->ops->forward(l, x, y2, B, 1);
    assert_memory_equal(y, y2, sizeof(y));
    l->ops->reseed(l, 10);
    l->ops->forward(l, x, y2, B, 1);
    assert_memory_not_equal(y, y2, sizeof(y));

    /* After an evaluation forward the backward passes dout through. */
    l->ops->forward(l, x, y, B, 0);
    l->ops->backward(l, x, y, g, din, B);
    assert_memory_equal(din, g, sizeof(g));
    l->ops->backward(l, x, y, g, NULL, B);
    ps_layer_free(l);
}

/* L = sum r * dropout(x) with the mask fixed by reseeding before each
 * forward. */
typedef struct drop_ctx {
    ps_layer *l;
    const float *x;
    float *out;
    const float *r;
    int batch;
} drop_ctx;

static double drop_objective(void *p)
{
    drop_ctx *c = p;
    c->l->ops->reseed(c->l, 42);
    c->l->ops->forward(c->l, c->x, c->out, c->batch, 1);
    double s = 0.0;
    for (size_t i = 0; i < (size_t)c->batch * ps_shape_size(c->l->in); i++)
        s += (double)c->r[i] * c->out[i];
    return s;
}

static void test_dropout_grad(void **state)
{
    (void)state;
    enum { N = 30, B = 2 };
    ps_layer *l;
    assert_int_equal(ps_layer_dropout_create("drop", ps_shape_flat(N), 0.4f, 1, B, &l), 0);
    float x[B * N], out[B * N], r[B * N], din[B * N];
    ps_rng rng;
    ps_rng_seed(&rng, 106);
    fill_normal(&rng, x, B * N, 1.0);
    fill_normal(&rng, r, B * N, 1.0);
    drop_ctx c = {l, x, out, r, B};
    drop_objective(&c);
    l->ops->backward(l, x, out, r, din, B);
    check_stats st = {0};
    gradcheck("dropout input", x, din, B * N, drop_objective, &c, &st);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(st.checked, B * N);
    ps_layer_free(l);
}

/* ---- least-squares head ----------------------------------------------------- */

typedef struct head_ctx {
    ps_head *h;
    const float *z;
    const ps_targets *t;
    int batch;
} head_ctx;

static double head_objective(void *p)
{
    head_ctx *c = p;
    return c->h->ops->loss(c->h, c->z, c->t, c->batch, 1.0f, NULL, NULL);
}

static void test_lsq_head(void **state)
{
    (void)state;
    enum { K = 3, B = 4 };
    ps_head *h;
    assert_int_equal(ps_head_lsq_create(ps_shape_flat(K), B, &h), 0);
    assert_string_equal(h->ops->kind, "least-squares");
    ps_rng rng;
    ps_rng_seed(&rng, 107);
    float z[B * K], yv[B * K], dz[B * K];
    fill_normal(&rng, z, B * K, 1.0);
    fill_normal(&rng, yv, B * K, 1.0);

    /* Values: 0.5 * ||z - y||^2 per sample, gradient scale * (z - y). */
    ps_targets tv = {.labels = NULL, .values = yv};
    size_t right = 0;
    double sum = h->ops->loss(h, z, &tv, B, 0.25f, dz, &right);
    double want = 0.0;
    for (int i = 0; i < B * K; i++) {
        want += 0.5 * ((double)z[i] - yv[i]) * ((double)z[i] - yv[i]);
        assert_float_equal(dz[i], 0.25f * (z[i] - yv[i]), 1e-6);
    }
    assert_float_equal(sum, want, 1e-5);
    assert_int_equal(right, 0); /* nothing is "right" in regression */
    h->ops->loss(h, z, &tv, B, 1.0f, dz, NULL);
    head_ctx c = {h, z, &tv, B};
    check_stats st = {0};
    gradcheck("lsq values", z, dz, B * K, head_objective, &c, &st);
    assert_int_equal(st.skipped, 0);

    /* Labels: targets are one-hot; right counts argmax == label. */
    const uint8_t lab[B] = {0, 2, 1, 2};
    const float zl[B * K] = {0.9f, 0.1f, 0.0f, 0.2f, 0.3f, 0.4f, 0.5f, 0.2f, 0.1f, 0.0f, 1.0f, -1.0f};
    ps_targets tl = {.labels = lab, .values = NULL};
    right = 0;
    sum = h->ops->loss(h, zl, &tl, B, 1.0f, dz, &right);
    want = 0.0;
    for (int r = 0; r < B; r++)
        for (int j = 0; j < K; j++) {
            double e = zl[r * K + j] - (j == lab[r] ? 1.0 : 0.0);
            want += 0.5 * e * e;
            assert_float_equal(dz[r * K + j], e, 1e-6);
        }
    assert_float_equal(sum, want, 1e-6);
    assert_int_equal(right, 2); /* samples 0 and 1 */
    ps_head_free(h);
}

/* ---- whole models ----------------------------------------------------------- */

typedef struct model_ctx {
    ps_model *m;
    const float *x;
    const uint8_t *labels; /* or */
    const float *values;
    int batch;
    int train;     /* loss from a train step (dropout on, mask fixed by reseeding) */
    uint64_t seed; /* reseed before a train step */
    int tolerant;  /* kink-dense (cnn): bound mismatches, see gradcheck.h */
} model_ctx;

static double model_objective(void *p)
{
    model_ctx *c = p;
    double loss, acc;
    if (c->train) {
        ps_model_reseed(c->m, c->seed);
        return c->values ? ps_model_train_step_values(c->m, c->x, c->values, c->batch)
                         : ps_model_train_step(c->m, c->x, c->labels, c->batch);
    }
    if (c->values)
        ps_model_evaluate_values(c->m, c->x, c->values, (size_t)c->batch, &loss, &acc);
    else
        ps_model_evaluate(c->m, c->x, c->labels, (size_t)c->batch, &loss, &acc);
    return loss;
}

/* One train step on c's batch, then the gradient of the parameters idx[0..n)
 * (all when idx is NULL) against finite differences of c's objective. Biases
 * that start at zero get random values so every term is exercised. */
static check_stats check_model_grad(model_ctx *c, const size_t *idx, size_t n, uint64_t seed)
{
    ps_rng rng;
    ps_rng_seed(&rng, seed);
    const size_t np = ps_model_nparams(c->m);
    float *params = ps_model_params(c->m);
    for (size_t i = 0; i < np; i++)
        if (params[i] == 0.0f)
            params[i] = (float)(0.1 * ps_rng_normal(&rng));
    float *before = malloc(np * sizeof(float)), *g = malloc(np * sizeof(float));
    assert_non_null(before);
    assert_non_null(g);
    memcpy(before, params, np * sizeof(float));

    ps_model_reseed(c->m, c->seed);
    float loss = c->values ? ps_model_train_step_values(c->m, c->x, c->values, c->batch)
                           : ps_model_train_step(c->m, c->x, c->labels, c->batch);
    assert_memory_equal(params, before, np * sizeof(float));
    memcpy(g, ps_model_grads(c->m), np * sizeof(float));
    assert_float_equal(loss, model_objective(c), 1e-5 * (1.0 + fabs(loss)));

    /* Kink-dense models: smaller steps cross fewer kinks (float rounding
     * still well below the tolerance at these sizes). */
    check_stats st = {.tolerant = c->tolerant, .eps1 = c->tolerant ? 5e-4f : 0.0f, .eps2 = c->tolerant ? 2.5e-4f : 0.0f};
    if (idx == NULL)
        gradcheck("model", params, g, np, model_objective, c, &st);
    else
        gradcheck_some("model", params, g, idx, n, model_objective, c, &st);
    assert_memory_equal(params, before, np * sizeof(float));
    if (getenv("PS_TEST_VERBOSE"))
        print_message("%zu checked, %zu skipped, %zu mismatched, worst error %.3f of tolerance, relative error "
                      "%.2g\n",
                      st.checked, st.skipped, st.mismatched, st.max_err, check_rel_err(&st));
    free(before);
    free(g);
    return st;
}

/* At most 10% skipped as kinks; and, for a tolerant check, at most 5% of
 * the checked elements off and the gradient as a whole within 1%. (A
 * near-tie in a max-pooling window, closer than any step, puts a kink at the
 * point itself: both steps then agree on the average of two slopes, and the
 * analytic gradient takes one. The exact comparison is test_cnn_reference.) */
static void assert_few_kinks(const char *what, check_stats st)
{
    const size_t total = st.checked + st.skipped;
    if (st.skipped * 10 > total)
        fail_msg("%s: %zu of %zu elements skipped as kinks", what, st.skipped, total);
    if (st.mismatched * 20 > st.checked)
        fail_msg("%s: %zu of %zu elements off the numerical gradient", what, st.mismatched, st.checked);
    if (check_rel_err(&st) > 0.01)
        fail_msg("%s: relative error %g", what, check_rel_err(&st));
}

static void test_linear_model(void **state)
{
    (void)state;
    enum { IN = 7, OUT = 3, B = 4 };
    ps_model *m;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("linear", IN, OUT, B, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_nparams(m), OUT * IN + OUT);
    assert_int_equal(ps_model_outputs(m), OUT);
    assert_true(ps_model_is_regression(m));
    assert_int_equal(ps_model_layout(m, &lay), 0);
    assert_int_equal(lay.ntensors, 2);
    assert_string_equal(lay.t[0].name, "fc1.weight");
    assert_int_equal(lay.t[0].dims[0], OUT);
    assert_int_equal(lay.t[0].dims[1], IN);
    assert_string_equal(lay.t[1].name, "fc1.bias");
    char buf[128];
    ps_model_describe(m, buf, sizeof(buf));
    assert_string_equal(buf, "linear 7-3, 24 params");
    ps_model_init_params(m, 1);

    ps_rng rng;
    ps_rng_seed(&rng, 108);
    float x[B * IN], y[B * OUT];
    fill_normal(&rng, x, B * IN, 1.0);
    fill_normal(&rng, y, B * OUT, 1.0);
    model_ctx c = {.m = m, .x = x, .values = y, .batch = B};
    check_stats st = check_model_grad(&c, NULL, 0, 1);
    assert_int_equal(st.skipped, 0);
    assert_int_equal(st.checked, OUT * IN + OUT);

    /* Trained on labels it fits their one-hot vectors. */
    const uint8_t lab[B] = {2, 0, 1, 1};
    model_ctx cl = {.m = m, .x = x, .labels = lab, .batch = B};
    st = check_model_grad(&cl, NULL, 0, 2);
    assert_int_equal(st.skipped, 0);
    ps_model_free(m);

    /* One output is a regression; a classifier needs two classes. */
    assert_int_equal(ps_model_create("linear", IN, 1, B, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_outputs(m), 1);
    ps_model_free(m);
    assert_int_equal(ps_model_create("linear", IN, 0, B, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "bad model sizes: 0 outputs for model 'linear'");
    assert_int_equal(ps_model_create("softmax", IN, 1, B, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "bad model sizes: 1 classes for model 'softmax' (expected 2..256)");
    assert_int_equal(ps_model_create("softmax", IN, 4, B, &m, err, sizeof(err)), 0);
    assert_false(ps_model_is_regression(m));
    ps_model_free(m);
}

static void test_linear_r2(void **state)
{
    (void)state;
    enum { IN = 3, OUT = 2, N = 10 };
    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create("linear", IN, OUT, 4, &m, err, sizeof(err)), 0);
    float *p = ps_model_params(m);
    const float W[OUT * IN] = {1, -2, 0.5f, 0, 3, -1}, b[OUT] = {0.25f, -4};
    memcpy(p, W, sizeof(W));
    memcpy(p + OUT * IN, b, sizeof(b));
    ps_rng rng;
    ps_rng_seed(&rng, 109);
    float x[N * IN], y[N * OUT];
    fill_normal(&rng, x, N * IN, 1.0);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double s = b[o];
            for (int j = 0; j < IN; j++)
                s += (double)W[o * IN + j] * x[i * IN + j];
            y[i * OUT + o] = (float)s;
        }
    double loss, r2;
    ps_model_evaluate_values(m, x, y, N, &loss, &r2);
    assert_true(loss < 1e-10);
    assert_float_equal(r2, 1.0, 1e-6);

    /* Predicting each output's mean scores 0; doing worse scores below 0. */
    memset(p, 0, ps_model_nparams(m) * sizeof(float));
    for (int o = 0; o < OUT; o++) {
        double mean = 0;
        for (int i = 0; i < N; i++)
            mean += y[i * OUT + o];
        p[OUT * IN + o] = (float)(mean / N);
    }
    ps_model_evaluate_values(m, x, y, N, &loss, &r2);
    assert_float_equal(r2, 0.0, 1e-5);
    p[OUT * IN] += 10.0f;
    ps_model_evaluate_values(m, x, y, N, &loss, &r2);
    assert_true(r2 < -1.0);

    /* Constant targets: no variance to explain, r2 is 0. */
    for (int i = 0; i < N * OUT; i++)
        y[i] = 2.0f;
    ps_model_evaluate_values(m, x, y, N, &loss, &r2);
    assert_true(r2 == 0.0);
    ps_model_evaluate_values(m, x, y, 0, &loss, &r2);
    assert_true(loss == 0.0 && r2 == 0.0);
    ps_model_free(m);
}

/* "linear" on y = A x + b reaches near-zero loss with plain SGD. */
static void test_linear_learns(void **state)
{
    (void)state;
    enum { IN = 7, OUT = 3, N = 128, B = 16, STEPS = 600 };
    ps_rng rng;
    ps_rng_seed(&rng, 110);
    float A[OUT * IN], bb[OUT], x[N * IN], y[N * OUT];
    fill_normal(&rng, A, OUT * IN, 1.0);
    fill_normal(&rng, bb, OUT, 1.0);
    fill_normal(&rng, x, N * IN, 1.0);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double s = bb[o];
            for (int j = 0; j < IN; j++)
                s += (double)A[o * IN + j] * x[i * IN + j];
            y[i * OUT + o] = (float)s;
        }
    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create("linear", IN, OUT, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 3);
    const size_t np = ps_model_nparams(m);
    float *p = ps_model_params(m), *g = ps_model_grads(m);
    double loss0, r20, loss, r2;
    ps_model_evaluate_values(m, x, y, N, &loss0, &r20);
    for (int s = 0; s < STEPS; s++) {
        int off = (s * B) % N;
        ps_model_train_step_values(m, x + (size_t)off * IN, y + (size_t)off * OUT, B);
        for (size_t i = 0; i < np; i++)
            p[i] -= 0.1f * g[i];
    }
    ps_model_evaluate_values(m, x, y, N, &loss, &r2);
    print_message("linear: loss %.3g -> %.3g, R^2 %.4f -> %.6f after %d steps\n", loss0, loss, r20, r2, STEPS);
    assert_true(loss < 1e-6 * loss0);
    assert_true(r2 > 0.99999);
    for (int i = 0; i < OUT * IN; i++)
        assert_float_equal(p[i], A[i], 1e-3);
    ps_model_free(m);
}

static void test_cnn_layout(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("cnn", 784, 10, 64, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_nparams(m), 21840);
    assert_false(ps_model_is_regression(m));
    assert_int_equal(ps_model_outputs(m), 10);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    struct {
        const char *name;
        uint32_t ndim, dims[4];
    } want[] = {
        {"conv1.weight", 4, {10, 1, 5, 5}}, {"conv1.bias", 1, {10}},  {"conv2.weight", 4, {20, 10, 5, 5}},
        {"conv2.bias", 1, {20}},            {"fc1.weight", 2, {50, 320}}, {"fc1.bias", 1, {50}},
        {"fc2.weight", 2, {10, 50}},        {"fc2.bias", 1, {10}},
    };
    assert_int_equal(lay.ntensors, 8);
    uint64_t off = 0;
    for (int t = 0; t < 8; t++) {
        assert_string_equal(lay.t[t].name, want[t].name);
        assert_int_equal(lay.t[t].ndim, want[t].ndim);
        for (uint32_t d = 0; d < want[t].ndim; d++)
            assert_int_equal(lay.t[t].dims[d], want[t].dims[d]);
        assert_int_equal(lay.t[t].offset, off);
        off += lay.t[t].count;
    }
    assert_int_equal(off, 21840);
    char buf[128];
    ps_model_describe(m, buf, sizeof(buf));
    assert_string_equal(buf, "cnn 1x28x28-10x24x24-20x8x8-50-10, 21840 params");
    ps_model_free(m);

    /* Dropout has no parameters: the same layout. */
    assert_int_equal(ps_model_create("cnn:dropout=0.5", 784, 10, 64, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_nparams(m), 21840);
    ps_model_free(m);

    /* Other image shapes through ps_model_create_chw. */
    assert_int_equal(ps_model_create_chw("cnn", 3, 32, 32, 10, 8, &m, err, sizeof(err)), 0);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    assert_int_equal(lay.t[0].dims[1], 3);
    assert_int_equal(lay.t[4].dims[1], 20 * 5 * 5); /* 32 -conv-> 28 -pool-> 14 -conv-> 10 -pool-> 5 */
    ps_model_describe(m, buf, sizeof(buf));
    assert_string_equal(buf, "cnn 3x32x32-10x28x28-20x10x10-50-10, 31340 params");
    ps_model_free(m);
    assert_int_equal(ps_model_create_chw("mlp:5", 1, 4, 4, 3, 8, &m, err, sizeof(err)), 0);
    ps_model_describe(m, buf, sizeof(buf));
    assert_string_equal(buf, "mlp:5 1x4x4-5-3, 103 params");
    ps_model_free(m);

    /* What does not fit. */
    assert_int_equal(ps_model_create("cnn", 100, 10, 8, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "model 'cnn' needs images of at least 16x16 pixels, not 10x10");
    assert_int_equal(ps_model_create("cnn", 300, 10, 8, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "model 'cnn' needs square one-channel images, and 300 inputs is not n*n pixels");
    assert_int_equal(ps_model_create_chw("cnn", 1, 15, 40, 10, 8, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "not 15x40");
    assert_int_equal(ps_model_create_chw("cnn", 0, 28, 28, 10, 8, &m, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "bad model sizes: 0x28x28 inputs");
    assert_int_equal(ps_model_create_chw("cnn", 1 << 20, 1 << 20, 1 << 20, 10, 8, &m, err, sizeof(err)),
                     PS_EINVAL);
    assert_msg_has(err, "bad model sizes");
    assert_null(m);
}

static void test_cnn_init(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    static ps_layout lay;
    /* Default: PyTorch's init, uniform in +-1/sqrt(fan_in), biases too. */
    assert_int_equal(ps_model_create("cnn", 784, 10, 4, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 11);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    const double fan_in[8] = {25, 25, 250, 250, 320, 320, 50, 50};
    const float *p = ps_model_params(m);
    for (int t = 0; t < 8; t++) {
        const double bound = 1.0 / sqrt(fan_in[t]);
        double big = 0;
        for (uint64_t i = 0; i < lay.t[t].count; i++)
            big = fmax(big, fabs(p[lay.t[t].offset + i]));
        if (big > bound || big < 0.5 * bound)
            fail_msg("%s: largest |value| %g, bound %g", lay.t[t].name, big, bound);
    }
    ps_model_free(m);

    /* init=he: normal weights with std sqrt(2/fan_in), zero biases. */
    assert_int_equal(ps_model_create("cnn:init=he", 784, 10, 4, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 11);
    p = ps_model_params(m);
    for (int t = 0; t < 8; t++) {
        double sq = 0;
        for (uint64_t i = 0; i < lay.t[t].count; i++)
            sq += (double)p[lay.t[t].offset + i] * p[lay.t[t].offset + i];
        const double sd = sqrt(sq / (double)lay.t[t].count);
        if (lay.t[t].ndim == 1)
            assert_true(sd == 0.0);
        else if (fabs(sd / sqrt(2.0 / fan_in[t]) - 1.0) > (lay.t[t].count > 1000 ? 0.05 : 0.2))
            fail_msg("%s: sd %g, want %g", lay.t[t].name, sd, sqrt(2.0 / fan_in[t]));
    }
    ps_model_free(m);
}

static void test_cnn_grad_small(void **state)
{
    (void)state;
    enum { C = 4, B = 3, S = 16 };
    for (uint64_t seed = 30; seed < 32; seed++) {
        ps_model *m;
        char err[256];
        assert_int_equal(ps_model_create_chw("cnn", 1, S, S, C, B, &m, err, sizeof(err)), 0);
        assert_int_equal(ps_model_nparams(m), 260 + 5020 + (20 * 50 + 50) + (50 * C + C));
        ps_model_init_params(m, seed);
        ps_rng rng;
        ps_rng_seed(&rng, seed);
        float x[B * S * S];
        fill_normal(&rng, x, B * S * S, 1.0);
        const uint8_t y[B] = {3, 0, 1};
        model_ctx c = {.m = m, .x = x, .labels = y, .batch = B, .tolerant = 1};
        check_stats st = check_model_grad(&c, NULL, 0, seed);
        assert_few_kinks("cnn 1x16x16", st);
        ps_model_free(m);
    }
}

/* The full-size network: every bias and 150 weights of each weight tensor. */
static void test_cnn_grad_mnist_shape(void **state)
{
    (void)state;
    enum { B = 2 };
    ps_model *m;
    char err[256];
    static ps_layout lay;
    assert_int_equal(ps_model_create("cnn", 784, 10, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 40);
    assert_int_equal(ps_model_layout(m, &lay), 0);
    ps_rng rng;
    ps_rng_seed(&rng, 41);
    size_t idx[2000], n = 0;
    for (uint32_t t = 0; t < lay.ntensors; t++) {
        const ps_tensor_desc *d = &lay.t[t];
        if (d->ndim == 1)
            for (uint64_t i = 0; i < d->count; i++)
                idx[n++] = d->offset + i;
        else
            for (int k = 0; k < 150; k++)
                idx[n++] = d->offset + ps_rng_below(&rng, d->count);
    }
    float x[B * 784];
    fill_normal(&rng, x, B * 784, 1.0);
    const uint8_t y[B] = {7, 2};
    model_ctx c = {.m = m, .x = x, .labels = y, .batch = B, .tolerant = 1};
    check_stats st = check_model_grad(&c, idx, n, 42);
    assert_few_kinks("cnn 1x28x28", st);
    ps_model_free(m);
}

/* ---- the cnn against an independent double-precision reference -------- */

/* PyTorch's semantics written out as loops in double: valid 5x5
 * convolution, 2x2 max pooling (first maximum), relu, CHW flattening,
 * linear layers, softmax cross-entropy, the mean over the batch. Forward
 * and backward, one sample at a time, gradients summed into g. */
typedef struct ref_conv {
    int c, h, w, oc, k; /* input shape, filters, kernel side */
} ref_conv;

static void ref_conv_fwd(const ref_conv *d, const double *x, const double *w, const double *b, double *y)
{
    const int oh = d->h - d->k + 1, ow = d->w - d->k + 1;
    for (int o = 0; o < d->oc; o++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++) {
                double acc = b[o];
                for (int c = 0; c < d->c; c++)
                    for (int i = 0; i < d->k; i++)
                        for (int j = 0; j < d->k; j++)
                            acc += w[((o * d->c + c) * d->k + i) * d->k + j] * x[(c * d->h + p + i) * d->w + q + j];
                y[(o * oh + p) * ow + q] = acc;
            }
}

/* Adds dL/dw and dL/db to gw, gb and, when gx is not NULL, sets dL/dx. */
static void ref_conv_bwd(const ref_conv *d, const double *x, const double *w, const double *gy, double *gw,
                         double *gb, double *gx)
{
    const int oh = d->h - d->k + 1, ow = d->w - d->k + 1;
    if (gx != NULL)
        memset(gx, 0, (size_t)d->c * d->h * d->w * sizeof(double));
    for (int o = 0; o < d->oc; o++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++) {
                const double g = gy[(o * oh + p) * ow + q];
                gb[o] += g;
                for (int c = 0; c < d->c; c++)
                    for (int i = 0; i < d->k; i++)
                        for (int j = 0; j < d->k; j++) {
                            const size_t wi = ((size_t)(o * d->c + c) * d->k + i) * d->k + j;
                            const size_t xi = (size_t)(c * d->h + p + i) * d->w + q + j;
                            gw[wi] += g * x[xi];
                            if (gx != NULL)
                                gx[xi] += g * w[wi];
                        }
            }
}

/* 2x2 max pooling then relu: y = max(0, max of the window); arg the input
 * index of the window's (first) maximum. */
static void ref_pool_relu_fwd(int c, int h, int w, const double *x, double *y, int *arg)
{
    const int oh = h / 2, ow = w / 2;
    for (int ch = 0; ch < c; ch++)
        for (int p = 0; p < oh; p++)
            for (int q = 0; q < ow; q++) {
                int best = (ch * h + 2 * p) * w + 2 * q;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++) {
                        const int at = (ch * h + 2 * p + i) * w + 2 * q + j;
                        if (x[at] > x[best])
                            best = at;
                    }
                const int o = (ch * oh + p) * ow + q;
                arg[o] = best;
                y[o] = x[best] > 0 ? x[best] : 0;
            }
}

static void ref_pool_relu_bwd(int n_in, int n_out, const double *y, const int *arg, const double *gy, double *gx)
{
    memset(gx, 0, (size_t)n_in * sizeof(double));
    for (int o = 0; o < n_out; o++)
        if (y[o] > 0)
            gx[arg[o]] = gy[o];
}

/* The reference cnn on one 1 x s x s image with n classes: adds the loss
 * gradient times scale to g (in the model's flat layout) and returns the
 * loss. */
static double ref_cnn_sample(const double *prm, double *g, const float *img, int s, int n, int label, double scale)
{
    const ref_conv c1 = {1, s, s, 10, 5};
    const int h1 = s - 4, q1 = h1 / 2;
    const ref_conv c2 = {10, q1, q1, 20, 5};
    const int h2 = q1 - 4, q2 = h2 / 2, nf = 20 * q2 * q2;
    const double *w1 = prm, *b1 = w1 + 250, *w2 = b1 + 10, *b2 = w2 + 5000, *w3 = b2 + 20, *b3 = w3 + 50 * nf,
                 *w4 = b3 + 50, *b4 = w4 + 50 * n;
    double *gw1 = g, *gb1 = gw1 + 250, *gw2 = gb1 + 10, *gb2 = gw2 + 5000, *gw3 = gb2 + 20, *gb3 = gw3 + 50 * nf,
           *gw4 = gb3 + 50, *gb4 = gw4 + 50 * n;
    double x[28 * 28], a1[10 * 24 * 24], r1[10 * 12 * 12], a2[20 * 8 * 8], r2[320], f1[50], r3[50], z[10] = {0};
    int arg1[10 * 12 * 12], arg2[320];
    double ga1[10 * 24 * 24], gr1[10 * 12 * 12], ga2[20 * 8 * 8], gr2[320], gr3[50], gz[10];
    assert_true(s <= 28 && nf <= 320 && n <= 10);
    for (int i = 0; i < s * s; i++)
        x[i] = img[i];
    ref_conv_fwd(&c1, x, w1, b1, a1);
    ref_pool_relu_fwd(10, h1, h1, a1, r1, arg1);
    ref_conv_fwd(&c2, r1, w2, b2, a2);
    ref_pool_relu_fwd(20, h2, h2, a2, r2, arg2);
    for (int o = 0; o < 50; o++) {
        f1[o] = b3[o];
        for (int i = 0; i < nf; i++)
            f1[o] += w3[o * nf + i] * r2[i];
        r3[o] = f1[o] > 0 ? f1[o] : 0;
    }
    double zmax = -INFINITY, se = 0;
    for (int o = 0; o < n; o++) {
        z[o] = b4[o];
        for (int i = 0; i < 50; i++)
            z[o] += w4[o * 50 + i] * r3[i];
        zmax = fmax(zmax, z[o]);
    }
    for (int o = 0; o < n; o++)
        se += exp(z[o] - zmax);
    const double loss = zmax + log(se) - z[label];

    for (int o = 0; o < n; o++)
        gz[o] = scale * (exp(z[o] - zmax) / se - (o == label));
    memset(gr3, 0, sizeof(gr3));
    for (int o = 0; o < n; o++) {
        gb4[o] += gz[o];
        for (int i = 0; i < 50; i++) {
            gw4[o * 50 + i] += gz[o] * r3[i];
            gr3[i] += gz[o] * w4[o * 50 + i];
        }
    }
    memset(gr2, 0, sizeof(gr2));
    for (int o = 0; o < 50; o++) {
        const double gf = f1[o] > 0 ? gr3[o] : 0;
        gb3[o] += gf;
        for (int i = 0; i < nf; i++) {
            gw3[o * nf + i] += gf * r2[i];
            gr2[i] += gf * w3[o * nf + i];
        }
    }
    ref_pool_relu_bwd(20 * h2 * h2, nf, r2, arg2, gr2, ga2);
    ref_conv_bwd(&c2, r1, w2, ga2, gw2, gb2, gr1);
    ref_pool_relu_bwd(10 * h1 * h1, 10 * q1 * q1, r1, arg1, gr1, ga1);
    ref_conv_bwd(&c1, x, w1, ga1, gw1, gb1, NULL);
    return loss;
}

static void test_cnn_reference(void **state)
{
    (void)state;
    enum { B = 4 };
    const int sides[2] = {28, 16}, classes[2] = {10, 3};
    for (int t = 0; t < 2; t++) {
        const int S = sides[t], n = classes[t];
        ps_model *m;
        char err[256];
        assert_int_equal(ps_model_create_chw("cnn", 1, S, S, n, B, &m, err, sizeof(err)), 0);
        ps_model_init_params(m, 80 + t);
        const size_t np = ps_model_nparams(m);
        ps_rng rng;
        ps_rng_seed(&rng, 90 + t);
        float *x = malloc((size_t)B * S * S * sizeof(float));
        fill_normal(&rng, x, (size_t)B * S * S, 1.0);
        uint8_t y[B];
        for (int i = 0; i < B; i++)
            y[i] = (uint8_t)ps_rng_below(&rng, (uint64_t)n);
        double *prm = malloc(np * sizeof(double)), *g = calloc(np, sizeof(double));
        for (size_t i = 0; i < np; i++)
            prm[i] = ps_model_params(m)[i];

        const float loss = ps_model_train_step(m, x, y, B);
        double want = 0;
        for (int i = 0; i < B; i++)
            want += ref_cnn_sample(prm, g, x + (size_t)i * S * S, S, n, y[i], 1.0 / B) / B;
        assert_float_equal(loss, want, 1e-5);
        const float *got = ps_model_grads(m);
        double worst = 0;
        for (size_t i = 0; i < np; i++) {
            const double e = fabs(got[i] - g[i]) / (1e-5 + 1e-3 * fabs(g[i]));
            worst = fmax(worst, e);
            if (e > 1.0)
                fail_msg("cnn %dx%d: grad[%zu] = %.8g, reference %.8g", S, S, i, (double)got[i], g[i]);
        }
        if (getenv("PS_TEST_VERBOSE"))
            print_message("cnn %dx%d: loss %.6f, reference %.6f; worst gradient error %.3f of tolerance\n", S, S,
                          (double)loss, want, worst);
        free(prm);
        free(g);
        free(x);
        ps_model_free(m);
    }
}

/* With dropout the loss comes from train steps, the mask fixed by reseeding
 * before each. */
static void test_dropout_model_grad(void **state)
{
    (void)state;
    ps_model *m;
    char err[256];
    enum { B = 3, S = 16, IN = 7 };
    ps_rng rng;
    ps_rng_seed(&rng, 57);
    float x[B * S * S];
    fill_normal(&rng, x, B * S * S, 1.0);
    const uint8_t y[B] = {1, 0, 2};

    assert_int_equal(ps_model_create_chw("cnn:dropout=0.5", 1, S, S, 3, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 51);
    model_ctx c = {.m = m, .x = x, .labels = y, .batch = B, .train = 1, .seed = 52, .tolerant = 1};
    assert_few_kinks("cnn:dropout=0.5", check_model_grad(&c, NULL, 0, 53));
    ps_model_free(m);

    assert_int_equal(ps_model_create("mlp:6,5:dropout=0.3", IN, 3, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 54);
    c = (model_ctx){.m = m, .x = x, .labels = y, .batch = B, .train = 1, .seed = 55};
    assert_few_kinks("mlp:6,5:dropout=0.3", check_model_grad(&c, NULL, 0, 56));
    ps_model_free(m);
}

/* Dropout changes training only: evaluation matches the model without it,
 * and a reseed replays the same masks. */
static void test_dropout_model(void **state)
{
    (void)state;
    enum { IN = 7, B = 4 };
    ps_model *a, *b;
    char err[256];
    assert_int_equal(ps_model_create("mlp:16:dropout=0.5", IN, 3, B, &a, err, sizeof(err)), 0);
    assert_int_equal(ps_model_create("mlp:16", IN, 3, B, &b, err, sizeof(err)), 0);
    assert_int_equal(ps_model_nparams(a), ps_model_nparams(b));
    ps_model_init_params(a, 60);
    ps_model_init_params(b, 60);
    ps_rng rng;
    ps_rng_seed(&rng, 61);
    float x[B * IN];
    fill_normal(&rng, x, B * IN, 1.0);
    const uint8_t y[B] = {0, 1, 2, 1};
    double la, aa, lb, ab;
    ps_model_evaluate(a, x, y, B, &la, &aa);
    ps_model_evaluate(b, x, y, B, &lb, &ab);
    assert_true(la == lb && aa == ab);

    ps_model_reseed(a, 1);
    float l1 = ps_model_train_step(a, x, y, B);
    float l2 = ps_model_train_step(a, x, y, B);
    ps_model_reseed(a, 1);
    float l3 = ps_model_train_step(a, x, y, B);
    ps_model_reseed(a, 2);
    float l4 = ps_model_train_step(a, x, y, B);
    float l0 = ps_model_train_step(b, x, y, B);
    assert_true(l1 == l3);
    assert_true(l1 != l2 && l1 != l4 && l1 != l0);
    ps_model_free(a);
    ps_model_free(b);
}

/* Two classes of 28x28 images: the top half brighter, or the bottom half. */
/* A batch larger than the model was made for, in pieces: the gradient of
 * 96 samples as pieces of 64 and 32 equals (up to rounding) the gradient a
 * model made for 96 computes in one pass, and so does the loss. */
static void test_train_step_pieces(void **state)
{
    (void)state;
    enum { N = 96, D = 20, C = 5 };
    ps_rng rng;
    ps_rng_seed(&rng, 80);
    float x[N * D];
    uint8_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = (uint8_t)(i % C);
        for (int j = 0; j < D; j++)
            x[i * D + j] = (float)ps_rng_normal(&rng);
    }
    ps_model *whole, *pieces;
    char err[256];
    assert_int_equal(ps_model_create("mlp:16", D, C, N, &whole, err, sizeof(err)), 0);
    assert_int_equal(ps_model_create("mlp:16", D, C, 64, &pieces, err, sizeof(err)), 0);
    ps_model_init_params(whole, 81);
    const size_t np = ps_model_nparams(whole);
    assert_int_equal(ps_model_nparams(pieces), np);
    memcpy(ps_model_params(pieces), ps_model_params(whole), np * sizeof(float));
    float *acc = malloc(np * sizeof(float));
    float lw = ps_model_train_step(whole, x, y, N);
    float lp = ps_model_train_step_pieces(pieces, x, y, N, acc);
    assert_float_equal(lp, lw, 1e-5 * fabsf(lw) + 1e-6);
    const float *gw = ps_model_grads(whole), *gp = ps_model_grads(pieces);
    double gmax = 0;
    for (size_t i = 0; i < np; i++)
        gmax = fmax(gmax, fabs(gw[i]));
    assert_true(gmax > 0);
    for (size_t i = 0; i < np; i++)
        assert_float_equal(gp[i], gw[i], 1e-5 * gmax);
    /* and at or under max_batch it is the plain step */
    float l64 = ps_model_train_step_pieces(pieces, x, y, 64, acc);
    assert_float_equal(l64, ps_model_train_step(whole, x, y, 64), 1e-6);
    free(acc);
    ps_model_free(whole);
    ps_model_free(pieces);
}

static void test_cnn_learns(void **state)
{
    (void)state;
    enum { N = 32, B = 8, S = 28, STEPS = 60 };
    ps_rng rng;
    ps_rng_seed(&rng, 70);
    float *x = malloc((size_t)N * S * S * sizeof(float));
    uint8_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = (uint8_t)(i % 2);
        for (int r = 0; r < S; r++)
            for (int c = 0; c < S; c++) {
                const int bright = (r < S / 2) == (y[i] == 0);
                x[((size_t)i * S + r) * S + c] = (float)((bright ? 1.0 : -0.5) + 0.5 * ps_rng_normal(&rng));
            }
    }
    ps_model *m;
    char err[256];
    assert_int_equal(ps_model_create("cnn", S * S, 2, B, &m, err, sizeof(err)), 0);
    ps_model_init_params(m, 71);
    const size_t np = ps_model_nparams(m);
    float *p = ps_model_params(m), *g = ps_model_grads(m);
    double loss0, acc0, loss, acc;
    ps_model_evaluate(m, x, y, N, &loss0, &acc0);
    for (int s = 0; s < STEPS; s++) {
        const int off = (s * B) % N;
        ps_model_train_step(m, x + (size_t)off * S * S, y + off, B);
        for (size_t i = 0; i < np; i++)
            p[i] -= 0.05f * g[i];
    }
    ps_model_evaluate(m, x, y, N, &loss, &acc);
    print_message("cnn: loss %.4f -> %.4f, accuracy %.3f -> %.3f after %d steps\n", loss0, loss, acc0, acc, STEPS);
    assert_true(acc == 1.0);
    assert_true(loss < 0.2 * loss0);
    ps_model_free(m);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_forward_values),
        cmocka_unit_test(test_conv_grad),
        cmocka_unit_test(test_conv_create),
        cmocka_unit_test(test_maxpool_values),
        cmocka_unit_test(test_maxpool_grad),
        cmocka_unit_test(test_dropout_statistics),
        cmocka_unit_test(test_dropout_mask),
        cmocka_unit_test(test_dropout_grad),
        cmocka_unit_test(test_lsq_head),
        cmocka_unit_test(test_linear_model),
        cmocka_unit_test(test_linear_r2),
        cmocka_unit_test(test_linear_learns),
        cmocka_unit_test(test_cnn_layout),
        cmocka_unit_test(test_cnn_init),
        cmocka_unit_test(test_cnn_grad_small),
        cmocka_unit_test(test_cnn_grad_mnist_shape),
        cmocka_unit_test(test_cnn_reference),
        cmocka_unit_test(test_dropout_model_grad),
        cmocka_unit_test(test_dropout_model),
        cmocka_unit_test(test_cnn_learns),
        cmocka_unit_test(test_train_step_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
