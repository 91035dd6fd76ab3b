/* layer_dense.c - the fully connected layer, y = x W^T + b, on OpenBLAS sgemm.
 *
 * W is [out, in] row-major, as PyTorch's nn.Linear stores it, so a checkpoint
 * or a layout printed by psd reads the same as the PyTorch model. All three
 * products are single sgemm calls over the whole batch:
 *   forward   Y[B,out]  = X[B,in] * W^T          (+ b broadcast first, beta 1)
 *   backward  dW[out,in] = dY^T[out,B] * X[B,in]
 *             dX[B,in]   = dY[B,out] * W[out,in]
 *             db[out]    = column sums of dY */
#include "layer.h"

#include "proto/errors.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

typedef struct dense {
    ps_layer base;
    int in_n, out_n; /* flat input and output sizes */
} dense;

static void dense_init(ps_layer *l, ps_rng *rng)
{
    dense *d = (dense *)l;
    const size_t nw = (size_t)d->out_n * (size_t)d->in_n;
    ps_init_fill(l->init, rng, l->params, nw, l->params + nw, (size_t)d->out_n, d->in_n);
}

static void dense_forward(ps_layer *l, const float *in, float *out, int batch, int training)
{
    (void)training;
    dense *d = (dense *)l;
    const int nin = d->in_n, nout = d->out_n;
    const float *w = l->params, *b = l->params + (size_t)nout * nin;
    for (int r = 0; r < batch; r++)
        memcpy(out + (size_t)r * nout, b, (size_t)nout * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, nout, nin, 1.0f, in, nin, w, nin, 1.0f, out, nout);
}

static void dense_backward(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch)
{
    (void)out;
    dense *d = (dense *)l;
    const int nin = d->in_n, nout = d->out_n;
    const float *w = l->params;
    float *dw = l->grads, *db = l->grads + (size_t)nout * nin;

    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nout, nin, batch, 1.0f, dout, nout, in, nin, 0.0f, dw, nin);
    memset(db, 0, (size_t)nout * sizeof(float));
    for (int r = 0; r < batch; r++) {
        const float *g = dout + (size_t)r * nout;
        for (int j = 0; j < nout; j++)
            db[j] += g[j];
    }
    if (din != NULL)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, nin, nout, 1.0f, dout, nout, w, nin, 0.0f, din,
                    nin);
}

static void dense_destroy(ps_layer *l)
{
    free(l);
}

static const ps_layer_ops dense_ops = {
    .kind = "dense",
    .init = dense_init,
    .reseed = NULL,
    .forward = dense_forward,
    .backward = dense_backward,
    .destroy = dense_destroy,
};

int ps_layer_dense_create(const char *name, ps_shape in, int out_features, int max_batch, ps_layer **out)
{
    *out = NULL;
    size_t in_n = ps_shape_size(in);
    if (in.c < 1 || in.h < 1 || in.w < 1 || in_n > (size_t)1 << 24 || out_features < 1 ||
        out_features > (1 << 24) || max_batch < 1)
        return PS_EINVAL;
    dense *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return PS_ENOMEM;
    ps_layer_base_init(&d->base, &dense_ops, name, in, ps_shape_flat(out_features), max_batch);
    d->in_n = (int)in_n;
    d->out_n = out_features;
    uint32_t wdims[2] = {(uint32_t)out_features, (uint32_t)in_n};
    uint32_t bdims[1] = {(uint32_t)out_features};
    if (ps_layer_add_tensor(&d->base, "weight", 2, wdims) != PS_OK ||
        ps_layer_add_tensor(&d->base, "bias", 1, bdims) != PS_OK) {
        free(d);
        return PS_EINVAL;
    }
    *out = &d->base;
    return PS_OK;
}
