/* layer_maxpool.c - max pooling over non-overlapping size x size windows.
 *
 * The forward records, for every output element, the index inside the
 * sample's input of the element it took (the first maximum in row-major
 * window order on ties); the backward zeroes the input gradient and routes
 * each output gradient to that one element. The windows do not overlap, so
 * no element receives two gradients. */
#include "layer.h"

#include "proto/errors.h"

#include <stdlib.h>
#include <string.h>

typedef struct maxpool {
    ps_layer base;
    int size;       /* window side and stride */
    int32_t *arg;   /* max_batch x out_size: input index of each output's maximum */
} maxpool;

static void pool_forward(ps_layer *l, const float *in, float *out, int batch, int training)
{
    (void)training;
    maxpool *mp = (maxpool *)l;
    const int C = l->in.c, H = l->in.h, W = l->in.w, OH = l->out.h, OW = l->out.w, k = mp->size;
    const size_t in_n = ps_shape_size(l->in), out_n = ps_shape_size(l->out);
    for (int r = 0; r < batch; r++) {
        const float *x = in + (size_t)r * in_n;
        float *y = out + (size_t)r * out_n;
        int32_t *am = mp->arg + (size_t)r * out_n; /* argmax of each output */
        for (int c = 0; c < C; c++) {
            const int32_t base = (int32_t)c * H * W;
            for (int oy = 0; oy < OH; oy++) {
                const int32_t top = base + (int32_t)(oy * k) * W;
                if (k == 2) {
                    /* Branch-free: which element wins is data, not a
                     * pattern a branch predictor can learn. Strict
                     * comparisons keep the first maximum. */
                    const float *r0 = x + top, *r1 = r0 + W;
                    for (int ox = 0; ox < OW; ox++) {
                        const float v00 = r0[2 * ox], v01 = r0[2 * ox + 1];
                        const float v10 = r1[2 * ox], v11 = r1[2 * ox + 1];
                        const int right0 = v01 > v00, right1 = v11 > v10;
                        const float m0 = right0 ? v01 : v00, m1 = right1 ? v11 : v10;
                        const int low = m1 > m0;
                        y[ox] = m1 > m0 ? m1 : m0;
                        am[ox] = top + 2 * ox + right0 + low * (W + right1 - right0);
                    }
                    y += OW;
                    am += OW;
                    continue;
                }
                for (int ox = 0; ox < OW; ox++) {
                    int32_t best = top + ox * k;
                    float m = x[best];
                    for (int i = 0; i < k; i++)
                        for (int j = 0; j < k; j++) {
                            int32_t at = top + i * W + ox * k + j;
                            if (x[at] > m) {
                                m = x[at];
                                best = at;
                            }
                        }
                    *y++ = m;
                    *am++ = best;
                }
            }
        }
    }
}

static void pool_backward(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch)
{
    (void)in;
    (void)out;
    if (din == NULL)
        return;
    maxpool *mp = (maxpool *)l;
    const size_t in_n = ps_shape_size(l->in), out_n = ps_shape_size(l->out);
    memset(din, 0, (size_t)batch * in_n * sizeof(float));
    for (int r = 0; r < batch; r++) {
        float *dx = din + (size_t)r * in_n;
        const float *g = dout + (size_t)r * out_n;
        const int32_t *a = mp->arg + (size_t)r * out_n;
        for (size_t i = 0; i < out_n; i++)
            dx[a[i]] = g[i];
    }
}

static void pool_destroy(ps_layer *l)
{
    maxpool *mp = (maxpool *)l;
    free(mp->arg);
    free(mp);
}

static const ps_layer_ops pool_ops = {
    .kind = "maxpool",
    .init = NULL,
    .reseed = NULL,
    .forward = pool_forward,
    .backward = pool_backward,
    .destroy = pool_destroy,
};

int ps_layer_maxpool_create(const char *name, ps_shape in, int size, int max_batch, ps_layer **out)
{
    *out = NULL;
    if (in.c < 1 || in.h < 1 || in.w < 1 || ps_shape_size(in) > ((size_t)1 << 28) || size < 1 || size > in.h ||
        size > in.w || max_batch < 1)
        return PS_EINVAL;
    maxpool *mp = calloc(1, sizeof(*mp));
    if (mp == NULL)
        return PS_ENOMEM;
    ps_shape os = {in.c, in.h / size, in.w / size};
    ps_layer_base_init(&mp->base, &pool_ops, name, in, os, max_batch);
    mp->size = size;
    mp->arg = calloc((size_t)max_batch * ps_shape_size(os), sizeof(int32_t));
    if (mp->arg == NULL) {
        free(mp);
        return PS_ENOMEM;
    }
    *out = &mp->base;
    return PS_OK;
}
