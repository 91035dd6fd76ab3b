/* head_lsq.c - the least-squares loss head for regression.
 *
 * Per sample, loss = 0.5 * sum_j (z_j - y_j)^2 and dloss/dz_j = z_j - y_j,
 * with y the sample's target row, or the one-hot vector of its label when the
 * targets carry labels only. */
#include "layer.h"

#include "proto/errors.h"

#include <assert.h>
#include <stdlib.h>

static double lsq_loss(ps_head *h, const float *z, const ps_targets *t, int batch, float scale, float *dz,
                       size_t *correct)
{
    const int K = (int)ps_shape_size(h->in);
    double total = 0.0;
    size_t right = 0;
    assert(t != NULL && (t->values != NULL || t->labels != NULL));
    for (int r = 0; r < batch; r++) {
        const float *zr = z + (size_t)r * K;
        float *dr = dz != NULL ? dz + (size_t)r * K : NULL;
        double s = 0.0;
        if (t->values != NULL) {
            const float *yr = t->values + (size_t)r * K;
            for (int j = 0; j < K; j++) {
                const float e = zr[j] - yr[j];
                s += (double)e * e;
                if (dr != NULL)
                    dr[j] = scale * e;
            }
        } else {
            const int y = t->labels[r];
            assert(y < K); /* precondition: the loader checked every label */
            int arg = 0;
            for (int j = 0; j < K; j++) {
                const float e = zr[j] - (j == y ? 1.0f : 0.0f);
                s += (double)e * e;
                if (dr != NULL)
                    dr[j] = scale * e;
                if (zr[j] > zr[arg])
                    arg = j;
            }
            right += arg == y;
        }
        total += 0.5 * s;
    }
    if (correct != NULL)
        *correct += right;
    return total;
}

static void lsq_destroy(ps_head *h)
{
    free(h);
}

static const ps_head_ops lsq_ops = {
    .kind = "least-squares",
    .loss = lsq_loss,
    .destroy = lsq_destroy,
};

int ps_head_lsq_create(ps_shape in, int max_batch, ps_head **out)
{
    *out = NULL;
    if (in.c < 1 || in.h < 1 || in.w < 1 || max_batch < 1)
        return PS_EINVAL;
    ps_head *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return PS_ENOMEM;
    h->ops = &lsq_ops;
    h->in = in;
    h->max_batch = max_batch;
    *out = h;
    return PS_OK;
}
