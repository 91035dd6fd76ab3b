/* head_softmax.c - the softmax + cross-entropy loss head for classifiers.
 *
 * Computed in the stable form: with m = max_j z_j and s = sum_j exp(z_j - m),
 * loss = m + log s - z_y and dloss/dz_j = exp(z_j - m)/s - [j == y]. */
#include "layer.h"

#include "proto/errors.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

static double softmax_loss(ps_head *h, const float *z, const ps_targets *t, int batch, float scale, float *dz,
                           size_t *correct)
{
    const int K = (int)ps_shape_size(h->in);
    double total = 0.0;
    size_t right = 0;
    assert(t != NULL && t->labels != NULL);
    for (int r = 0; r < batch; r++) {
        const float *zr = z + (size_t)r * K;
        const int y = t->labels[r];
        assert(y < K); /* precondition: the loader checked every label */
        int arg = 0;
        float m = zr[0];
        for (int j = 1; j < K; j++)
            if (zr[j] > m) {
                m = zr[j];
                arg = j;
            }
        right += arg == y;
        double s = 0.0;
        if (dz != NULL) {
            float *dr = dz + (size_t)r * K;
            for (int j = 0; j < K; j++) {
                dr[j] = expf(zr[j] - m);
                s += dr[j];
            }
            const float inv = (float)(scale / s);
            for (int j = 0; j < K; j++)
                dr[j] *= inv;
            dr[y] -= scale;
        } else {
            for (int j = 0; j < K; j++)
                s += expf(zr[j] - m);
        }
        total += (double)m + log(s) - (double)zr[y];
    }
    if (correct != NULL)
        *correct += right;
    return total;
}

static void softmax_destroy(ps_head *h)
{
    free(h);
}

static const ps_head_ops softmax_ops = {
    .kind = "softmax-xent",
    .loss = softmax_loss,
    .destroy = softmax_destroy,
};

int ps_head_softmax_xent_create(ps_shape in, int max_batch, ps_head **out)
{
    *out = NULL;
    if (in.c < 1 || in.h < 1 || in.w < 1 || ps_shape_size(in) < 2 || max_batch < 1)
        return PS_EINVAL;
    ps_head *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return PS_ENOMEM;
    h->ops = &softmax_ops;
    h->in = in;
    h->max_batch = max_batch;
    *out = h;
    return PS_OK;
}
