/* gradcheck.c - finite-difference gradient checks shared by the layer and
 * model tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"

/* Central difference of f with respect to v[k] with step eps, dividing by the
 * step actually taken in float. */
static double central(float *v, size_t k, float eps, scalar_fn f, void *ctx)
{
    const float keep = v[k];
    const float hi = keep + eps, lo = keep - eps;
    v[k] = hi;
    double fp = f(ctx);
    v[k] = lo;
    double fm = f(ctx);
    v[k] = keep;
    return (fp - fm) / ((double)hi - (double)lo);
}

static int close_enough(double a, double b)
{
    return fabs(a - b) <= ATOL + RTOL * fmax(fabs(a), fabs(b));
}

static void check_one(const char *what, float *v, double a, size_t k, scalar_fn f, void *ctx, check_stats *st)
{
    const float eps1 = st->eps1 > 0.0f ? st->eps1 : EPS1, eps2 = st->eps2 > 0.0f ? st->eps2 : EPS2;
    double n1 = central(v, k, eps1, f, ctx);
    double n2 = central(v, k, eps2, f, ctx);
    if (!close_enough(n1, n2)) {
        st->skipped++;
        return;
    }
    double e = fabs(a - n1) / (ATOL + RTOL * fmax(fabs(a), fabs(n1)));
    if (e > st->max_err)
        st->max_err = e;
    st->sq_diff += (a - n1) * (a - n1);
    st->sq_ref += a * a + n1 * n1;
    if (e > 1.0 && st->tolerant) {
        st->mismatched++;
        if (getenv("PS_TEST_VERBOSE"))
            print_message("%s[%zu]: analytic %.6g vs numeric %.6g / %.6g\n", what, k, a, n1, n2);
    }
    else if (e > 1.0)
        fail_msg("%s[%zu]: analytic %.6g vs numeric %.6g (step %g) / %.6g (step %g)", what, k, a, n1, (double)eps1,
                 n2, (double)eps2);
    st->checked++;
}

double check_rel_err(const check_stats *st)
{
    return st->sq_ref > 0.0 ? sqrt(st->sq_diff / st->sq_ref) : 0.0;
}

void gradcheck(const char *what, float *v, const float *analytic, size_t n, scalar_fn f, void *ctx,
               check_stats *st)
{
    for (size_t k = 0; k < n; k++)
        check_one(what, v, analytic[k], k, f, ctx, st);
}

void gradcheck_some(const char *what, float *v, const float *analytic, const size_t *idx, size_t n, scalar_fn f,
                    void *ctx, check_stats *st)
{
    for (size_t i = 0; i < n; i++)
        check_one(what, v, analytic[idx[i]], idx[i], f, ctx, st);
}

void fill_normal(ps_rng *r, float *v, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(scale * ps_rng_normal(r));
}

/* L = sum_i r_i * out_i for a layer's forward: dL/dout = r. */
typedef struct layer_ctx {
    ps_layer *l;
    const float *x; /* may alias the vector being perturbed */
    float *out;
    const float *r;
    int batch;
} layer_ctx;

static double layer_objective(void *p)
{
    layer_ctx *c = p;
    c->l->ops->forward(c->l, c->x, c->out, c->batch, 1);
    size_t n = (size_t)c->batch * ps_shape_size(c->l->out);
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)c->r[i] * c->out[i];
    return s;
}

void check_layer(ps_layer *l, float *x, int batch, ps_rng *rng, check_stats *st)
{
    const size_t nin = (size_t)batch * ps_shape_size(l->in), nout = (size_t)batch * ps_shape_size(l->out);
    float *params = l->nparams ? ps_falloc(l->nparams) : NULL;
    float *grads = l->nparams ? ps_falloc(l->nparams) : NULL;
    float *out = ps_falloc(nout), *r = ps_falloc(nout), *din = ps_falloc(nin);
    float *g_saved = l->nparams ? ps_falloc(l->nparams) : NULL;
    assert_non_null(out);
    assert_non_null(r);
    assert_non_null(din);
    ps_layer_bind(l, params, grads);
    if (l->nparams) {
        fill_normal(rng, params, l->nparams, 0.7);
        memset(grads, 0x7f, l->nparams * sizeof(float)); /* backward must overwrite */
    }
    fill_normal(rng, r, nout, 1.0);

    l->ops->forward(l, x, out, batch, 1);
    l->ops->backward(l, x, out, r, din, batch);
    if (l->nparams)
        memcpy(g_saved, grads, l->nparams * sizeof(float));

    layer_ctx c = {l, x, out, r, batch};
    if (l->nparams)
        gradcheck(l->name, params, g_saved, l->nparams, layer_objective, &c, st);
    gradcheck("input", x, din, nin, layer_objective, &c, st);

    /* din == NULL (first layer) computes the same parameter gradients. */
    if (l->nparams) {
        l->ops->forward(l, x, out, batch, 1);
        l->ops->backward(l, x, out, r, NULL, batch);
        for (size_t i = 0; i < l->nparams; i++)
            assert_float_equal(grads[i], g_saved[i], 1e-6);
    }
    free(params);
    free(grads);
    free(out);
    free(r);
    free(din);
    free(g_saved);
}
