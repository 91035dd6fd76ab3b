/* layer_dropout.c - inverted dropout with the layer's own random stream.
 *
 * While training, element i survives when a 32-bit draw u_i >= p * 2^32
 * (probability 1 - p, up to 2^-32) and is then scaled by 1/(1-p); two draws
 * come from each 64-bit output of the layer's xoshiro256** stream, so a seed
 * fixes every mask that follows. The mask of the last training forward is
 * kept for the backward. At evaluation the layer copies its input. */
#include "layer.h"

#include "proto/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct dropout {
    ps_layer base;
    float p;          /* drop probability, [0, 1) */
    float scale;      /* 1 / (1 - p) */
    uint32_t cut;     /* drop when a 32-bit draw is below this */
    int masked;       /* the last forward applied mask[] (training with p > 0) */
    ps_rng rng;       /* the layer's own stream */
    uint8_t *mask;    /* max_batch x size: 1 where the element survived */
} dropout;

static void drop_reseed(ps_layer *l, uint64_t seed)
{
    dropout *d = (dropout *)l;
    ps_rng_seed(&d->rng, seed);
}

static void drop_forward(ps_layer *l, const float *in, float *out, int batch, int training)
{
    dropout *d = (dropout *)l;
    const size_t n = (size_t)batch * ps_shape_size(l->in);
    d->masked = training && d->p > 0.0f;
    if (!d->masked) {
        memcpy(out, in, n * sizeof(float));
        return;
    }
    const uint32_t cut = d->cut;
    const float scale = d->scale;
    uint8_t *mask = d->mask;
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
        const uint64_t u = ps_rng_next(&d->rng);
        mask[i] = (uint32_t)u >= cut;
        mask[i + 1] = (uint32_t)(u >> 32) >= cut;
    }
    if (i < n)
        mask[i] = (uint32_t)ps_rng_next(&d->rng) >= cut;
    for (i = 0; i < n; i++)
        out[i] = mask[i] ? in[i] * scale : 0.0f;
}

static void drop_backward(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch)
{
    (void)in;
    (void)out;
    if (din == NULL)
        return;
    dropout *d = (dropout *)l;
    const size_t n = (size_t)batch * ps_shape_size(l->in);
    if (!d->masked) {
        memcpy(din, dout, n * sizeof(float));
        return;
    }
    const float scale = d->scale;
    for (size_t i = 0; i < n; i++)
        din[i] = d->mask[i] ? dout[i] * scale : 0.0f;
}

static void drop_destroy(ps_layer *l)
{
    dropout *d = (dropout *)l;
    free(d->mask);
    free(d);
}

static const ps_layer_ops drop_ops = {
    .kind = "dropout",
    .init = NULL,
    .reseed = drop_reseed,
    .forward = drop_forward,
    .backward = drop_backward,
    .destroy = drop_destroy,
};

int ps_layer_dropout_create(const char *name, ps_shape in, float p, uint64_t seed, int max_batch, ps_layer **out)
{
    *out = NULL;
    if (in.c < 1 || in.h < 1 || in.w < 1 || ps_shape_size(in) > ((size_t)1 << 28) || !(p >= 0.0f && p < 1.0f) ||
        max_batch < 1)
        return PS_EINVAL;
    dropout *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return PS_ENOMEM;
    ps_layer_base_init(&d->base, &drop_ops, name, in, in, max_batch);
    d->p = p;
    d->scale = 1.0f / (1.0f - p);
    double cut = ldexp((double)p, 32);
    d->cut = cut >= 4294967295.0 ? UINT32_MAX : (uint32_t)cut;
    ps_rng_seed(&d->rng, seed);
    d->mask = malloc((size_t)max_batch * ps_shape_size(in));
    if (d->mask == NULL) {
        free(d);
        return PS_ENOMEM;
    }
    *out = &d->base;
    return PS_OK;
}
