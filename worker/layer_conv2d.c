/* layer_conv2d.c - 2-D convolution as im2col + OpenBLAS sgemm.
 *
 * For one sample with input (C, H, W) and K = C*kh*kw, P = OH*OW, im2col
 * unrolls the input into col [K, P]: row (c, i, j) holds, for every output
 * position, the input pixel the kernel tap (c, i, j) reads there (zero where
 * it falls in the padding). Then, with W [OC, K] row-major (PyTorch's
 * [OC, C, kh, kw] read flat):
 *   forward   Y[OC,P]   = W[OC,K] * col[K,P]          (+ b broadcast first)
 *   backward  dW[OC,K] += dY[OC,P] * col^T[P,K]       (summed over samples)
 *             dcol[K,P] = W^T[K,OC] * dY[OC,P], then col2im adds dcol back
 *             onto the input positions it came from: dX
 *             db[OC]   += dY[OC,P] * ones[P]
 * When K > P (the reference CNN's conv2: K 250, P 64) dW is formed
 * transposed instead, dW^T[K,OC] += col[K,P] * dY^T[P,OC] with dY^T copied
 * out per sample and dW^T transposed once per batch: OpenBLAS 0.3.21 runs that
 * shape about 1.6 times as fast as the one above.
 *
 * The products go sample by sample: the output of one sample is then already
 * in CHW order, and one im2col buffer of K x P floats, which for the
 * reference CNN fits in L2, serves every sample. (One sgemm over the whole
 * batch would need the output transposed from [OC, B*P] back to CHW, and its
 * column buffer would not fit in cache; measured, it is slower.) The backward
 * recomputes im2col rather than keeping the whole batch's columns from the
 * forward: a column buffer rebuilt in cache was cheaper, measured, than a
 * batch of them streamed through memory. When the input gradient is not
 * wanted (the first layer), the dcol product and col2im are skipped. A 1x1
 * convolution with stride 1 and no padding needs no im2col at all: col is
 * the input itself. */
#include "layer.h"

#include "proto/errors.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

typedef struct conv2d {
    ps_layer base;
    int ic, ih, iw;        /* input channels, height, width */
    int oc, oh, ow;        /* output channels, height, width */
    int kh, kw;            /* kernel height, width */
    int stride, pad;       /* step and zero border, both axes */
    int K;                 /* ic * kh * kw: rows of col, columns of W */
    int P;                 /* oh * ow: output positions */
    float *col;            /* K x P im2col scratch; NULL when col is the input (1x1) */
    float *ones;           /* P ones: db is dY times this */
    float *gt;             /* P x OC: one sample's dY transposed, when dwt is used */
    float *dwt;            /* K x OC: dW transposed, summed over the batch; or NULL */
    int lo[PS_CONV_MAX_K];  /* per kernel column j: first ox whose input column is inside */
    int hi[PS_CONV_MAX_K];  /* per kernel column j: one past the last such ox */
    int ylo[PS_CONV_MAX_K]; /* per kernel row i: first oy whose input row is inside */
    int yhi[PS_CONV_MAX_K]; /* per kernel row i: one past the last such oy */
} conv2d;

static void conv_init(ps_layer *l, ps_rng *rng)
{
    conv2d *cv = (conv2d *)l;
    const size_t nw = (size_t)cv->oc * (size_t)cv->K;
    ps_init_fill(l->init, rng, l->params, nw, l->params + nw, (size_t)cv->oc, cv->K);
}

/* The rows of an im2col block are short runs (8 and 24 floats in the
 * reference CNN). Copied run by run, GCC turns each run into a memcpy call,
 * which costs more than the copy; so blocks go eight (then four) columns at
 * a time down all the rows, each step a fixed-size move the compiler inlines
 * (the adds through a GCC/Clang generic vector, mapped to SSE, NEON or
 * scalars). */
typedef float v4f __attribute__((vector_size(4 * sizeof(float))));

/* d[r*dld + x] = s[r*sld + x] for r < rows, x < n. */
static inline void block_copy(float *restrict d, int dld, const float *restrict s, int sld, int rows, int n)
{
    int x = 0;
    for (; x + 8 <= n; x += 8)
        for (int r = 0; r < rows; r++)
            memcpy(d + (size_t)r * dld + x, s + (size_t)r * sld + x, 8 * sizeof(float));
    for (; x + 4 <= n; x += 4)
        for (int r = 0; r < rows; r++)
            memcpy(d + (size_t)r * dld + x, s + (size_t)r * sld + x, 4 * sizeof(float));
    for (; x < n; x++)
        for (int r = 0; r < rows; r++)
            d[(size_t)r * dld + x] = s[(size_t)r * sld + x];
}

/* d[r*dld + x] += s[r*sld + x] for r < rows, x < n. */
static inline void block_add(float *restrict d, int dld, const float *restrict s, int sld, int rows, int n)
{
    int x = 0;
    for (; x + 4 <= n; x += 4)
        for (int r = 0; r < rows; r++) {
            float *dp = d + (size_t)r * dld + x;
            v4f a, b;
            memcpy(&a, dp, sizeof(a));
            memcpy(&b, s + (size_t)r * sld + x, sizeof(b));
            a += b;
            memcpy(dp, &a, sizeof(a));
        }
    for (; x < n; x++)
        for (int r = 0; r < rows; r++)
            d[(size_t)r * dld + x] += s[(size_t)r * sld + x];
}

/* Unrolls one sample's input img [ic, ih, iw] into col [K, P]: row (c, i, j)
 * of col is the block of input rows ylo[i]..yhi[i] and columns lo[j]..hi[j]
 * that tap (i, j) reads, zero around it where the tap falls on padding. */
static void im2col(const conv2d *cv, const float *restrict img, float *restrict col)
{
    const int ih = cv->ih, iw = cv->iw, oh = cv->oh, ow = cv->ow, s = cv->stride, pad = cv->pad;
    const size_t P = (size_t)cv->P;
    float *d = col;
    for (int c = 0; c < cv->ic; c++) {
        const float *plane = img + (size_t)c * ih * iw;
        for (int i = 0; i < cv->kh; i++) {
            const int ylo = cv->ylo[i], yhi = cv->yhi[i];
            for (int j = 0; j < cv->kw; j++, d += P) {
                const int lo = cv->lo[j], hi = cv->hi[j];
                if (ylo > 0 || yhi < oh || lo > 0 || hi < ow)
                    memset(d, 0, P * sizeof(float));
                if (ylo >= yhi || lo >= hi)
                    continue;
                const float *src = plane + (size_t)(ylo * s - pad + i) * iw + (lo * s - pad + j);
                float *dst = d + (size_t)ylo * ow + lo;
                if (s == 1) {
                    block_copy(dst, ow, src, iw, yhi - ylo, hi - lo);
                    continue;
                }
                for (int oy = 0; oy < yhi - ylo; oy++)
                    for (int ox = 0; ox < hi - lo; ox++)
                        dst[(size_t)oy * ow + ox] = src[(size_t)oy * s * iw + (size_t)ox * s];
            }
        }
    }
}

/* The adjoint of im2col: img [ic, ih, iw] := the sum, over every col entry,
 * of the entry added onto the input pixel it was copied from. */
static void col2im(const conv2d *cv, const float *restrict col, float *restrict img)
{
    const int ih = cv->ih, iw = cv->iw, ow = cv->ow, s = cv->stride, pad = cv->pad;
    const size_t P = (size_t)cv->P;
    const float *d = col;
    memset(img, 0, (size_t)cv->ic * ih * iw * sizeof(float));
    for (int c = 0; c < cv->ic; c++) {
        float *plane = img + (size_t)c * ih * iw;
        for (int i = 0; i < cv->kh; i++) {
            const int ylo = cv->ylo[i], yhi = cv->yhi[i];
            for (int j = 0; j < cv->kw; j++, d += P) {
                const int lo = cv->lo[j], hi = cv->hi[j];
                if (ylo >= yhi || lo >= hi)
                    continue;
                float *dst = plane + (size_t)(ylo * s - pad + i) * iw + (lo * s - pad + j);
                const float *src = d + (size_t)ylo * ow + lo;
                if (s == 1) {
                    block_add(dst, iw, src, ow, yhi - ylo, hi - lo);
                    continue;
                }
                for (int oy = 0; oy < yhi - ylo; oy++)
                    for (int ox = 0; ox < hi - lo; ox++)
                        dst[(size_t)oy * s * iw + (size_t)ox * s] += src[(size_t)oy * ow + ox];
            }
        }
    }
}

/* y[OC, P] := b broadcast along each row. */
static void fill_bias(float *restrict y, const float *restrict b, int OC, int P)
{
    for (int o = 0; o < OC; o++, y += P) {
        const v4f bo = {b[o], b[o], b[o], b[o]};
        int p = 0;
        for (; p + 4 <= P; p += 4)
            memcpy(y + p, &bo, sizeof(bo));
        for (; p < P; p++)
            y[p] = b[o];
    }
}

static void conv_forward(ps_layer *l, const float *in, float *out, int batch, int training)
{
    (void)training;
    conv2d *cv = (conv2d *)l;
    const int K = cv->K, P = cv->P, OC = cv->oc;
    const size_t in_n = ps_shape_size(l->in), out_n = (size_t)OC * P;
    const float *w = l->params, *b = l->params + (size_t)OC * K;
    for (int r = 0; r < batch; r++) {
        const float *x = in + (size_t)r * in_n;
        float *y = out + (size_t)r * out_n;
        const float *col = x;
        if (cv->col != NULL) {
            im2col(cv, x, cv->col);
            col = cv->col;
        }
        fill_bias(y, b, OC, P);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, P, K, 1.0f, w, K, col, P, 1.0f, y, P);
    }
}

static void conv_backward(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch)
{
    (void)out;
    conv2d *cv = (conv2d *)l;
    const int K = cv->K, P = cv->P, OC = cv->oc;
    const size_t in_n = ps_shape_size(l->in), out_n = (size_t)OC * P;
    const float *w = l->params;
    float *dw = l->grads, *db = l->grads + (size_t)OC * K;

    memset(db, 0, (size_t)OC * sizeof(float));
    for (int r = 0; r < batch; r++) {
        const float *x = in + (size_t)r * in_n;
        const float *g = dout + (size_t)r * out_n;
        const float *col = x;
        if (cv->col != NULL) {
            im2col(cv, x, cv->col);
            col = cv->col;
        }
        if (cv->dwt != NULL) {
            /* dW^T[K,OC] += col[K,P] * dY^T[P,OC], dY^T made explicit. */
            for (int o = 0; o < OC; o++)
                for (int p = 0; p < P; p++)
                    cv->gt[(size_t)p * OC + o] = g[(size_t)o * P + p];
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, K, OC, P, 1.0f, col, P, cv->gt, OC,
                        r ? 1.0f : 0.0f, cv->dwt, OC);
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, K, P, 1.0f, g, P, col, P, r ? 1.0f : 0.0f, dw,
                        K);
        }
        cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, P, 1.0f, g, P, cv->ones, 1, 1.0f, db, 1);
        if (din == NULL)
            continue;
        float *dx = din + (size_t)r * in_n;
        if (cv->col == NULL) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, P, OC, 1.0f, w, K, g, P, 0.0f, dx, P);
        } else {
            /* col has served dW; it now takes dcol. */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, P, OC, 1.0f, w, K, g, P, 0.0f, cv->col, P);
            col2im(cv, cv->col, dx);
        }
    }
    if (cv->dwt != NULL)
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < K; k++)
                dw[(size_t)o * K + k] = cv->dwt[(size_t)k * OC + o];
}

static void conv_destroy(ps_layer *l)
{
    conv2d *cv = (conv2d *)l;
    free(cv->col);
    free(cv->ones);
    free(cv->gt);
    free(cv->dwt);
    free(cv);
}

/* The outputs o in [*lo, *hi) whose input o*stride + off lies in [0, n),
 * clipped to [0, out). */
static void inside(int off, int stride, int n, int out, int *lo, int *hi)
{
    int a = off < 0 ? (-off + stride - 1) / stride : 0;
    int b = n - 1 - off >= 0 ? (n - 1 - off) / stride + 1 : 0;
    if (b > out)
        b = out;
    if (a > b)
        a = b;
    *lo = a;
    *hi = b;
}

static const ps_layer_ops conv_ops = {
    .kind = "conv2d",
    .init = conv_init,
    .reseed = NULL,
    .forward = conv_forward,
    .backward = conv_backward,
    .destroy = conv_destroy,
};

int ps_layer_conv2d_create(const char *name, ps_shape in, int out_c, int kh, int kw, int stride, int pad,
                           int max_batch, ps_layer **out)
{
    *out = NULL;
    const long lim = 1L << 24;
    if (in.c < 1 || in.h < 1 || in.w < 1 || (long)ps_shape_size(in) > lim || out_c < 1 || out_c > lim || kh < 1 ||
        kw < 1 || kw > PS_CONV_MAX_K || kh > PS_CONV_MAX_K || stride < 1 || pad < 0 || pad >= PS_CONV_MAX_K ||
        max_batch < 1)
        return PS_EINVAL;
    const int ph = in.h + 2 * pad, pw = in.w + 2 * pad;
    if (kh > ph || kw > pw)
        return PS_EINVAL;
    const int oh = (ph - kh) / stride + 1, ow = (pw - kw) / stride + 1;
    const long K = (long)in.c * kh * kw, P = (long)oh * ow;
    if (K > lim || P > lim || (long)out_c * P > lim || (long)out_c * K > lim || K * P > (1L << 28))
        return PS_EINVAL;

    conv2d *cv = calloc(1, sizeof(*cv));
    if (cv == NULL)
        return PS_ENOMEM;
    ps_shape os = {out_c, oh, ow};
    ps_layer_base_init(&cv->base, &conv_ops, name, in, os, max_batch);
    cv->ic = in.c;
    cv->ih = in.h;
    cv->iw = in.w;
    cv->oc = out_c;
    cv->oh = oh;
    cv->ow = ow;
    cv->kh = kh;
    cv->kw = kw;
    cv->stride = stride;
    cv->pad = pad;
    cv->K = (int)K;
    cv->P = (int)P;
    for (int j = 0; j < kw; j++)
        inside(j - pad, stride, in.w, ow, &cv->lo[j], &cv->hi[j]);
    for (int i = 0; i < kh; i++)
        inside(i - pad, stride, in.h, oh, &cv->ylo[i], &cv->yhi[i]);
    uint32_t wdims[4] = {(uint32_t)out_c, (uint32_t)in.c, (uint32_t)kh, (uint32_t)kw};
    uint32_t bdims[1] = {(uint32_t)out_c};
    if (ps_layer_add_tensor(&cv->base, "weight", 4, wdims) != PS_OK ||
        ps_layer_add_tensor(&cv->base, "bias", 1, bdims) != PS_OK) {
        free(cv);
        return PS_EINVAL;
    }
    const int pointwise = kh == 1 && kw == 1 && stride == 1 && pad == 0;
    cv->ones = ps_falloc((size_t)P);
    if (!pointwise)
        cv->col = ps_falloc((size_t)K * (size_t)P);
    if (K > P) {
        cv->gt = ps_falloc((size_t)P * (size_t)out_c);
        cv->dwt = ps_falloc((size_t)K * (size_t)out_c);
    }
    if (cv->ones == NULL || (!pointwise && cv->col == NULL) || (K > P && (cv->gt == NULL || cv->dwt == NULL))) {
        conv_destroy(&cv->base);
        return PS_ENOMEM;
    }
    for (long p = 0; p < P; p++)
        cv->ones[p] = 1.0f;
    *out = &cv->base;
    return PS_OK;
}
