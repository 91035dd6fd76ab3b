/* layer.c - the parts of the layer interface shared by every layer: naming,
 * the tensor table, binding to the flat vectors, aligned buffers. */
#include "layer.h"

#include "proto/errors.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *ps_falloc(size_t n)
{
    size_t bytes = n * sizeof(float);
    if (n != 0 && bytes / sizeof(float) != n)
        return NULL;
    bytes = (bytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
    if (bytes == 0)
        bytes = 64;
    float *p = aligned_alloc(64, bytes);
    if (p != NULL)
        memset(p, 0, bytes);
    return p;
}

void ps_init_fill(ps_init how, ps_rng *rng, float *w, size_t nw, float *b, size_t nb, int fan_in)
{
    assert(fan_in >= 1);
    if (how == PS_INIT_TORCH) {
        const double bound = 1.0 / sqrt((double)fan_in);
        for (size_t i = 0; i < nw; i++)
            w[i] = (float)(bound * (2.0 * ps_rng_uniform(rng) - 1.0));
        for (size_t i = 0; i < nb; i++)
            b[i] = (float)(bound * (2.0 * ps_rng_uniform(rng) - 1.0));
        return;
    }
    const double std = sqrt(2.0 / fan_in);
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)(std * ps_rng_normal(rng));
    memset(b, 0, nb * sizeof(float));
}

void ps_layer_base_init(ps_layer *l, const ps_layer_ops *ops, const char *name, ps_shape in, ps_shape out,
                        int max_batch)
{
    memset(l, 0, sizeof(*l));
    l->ops = ops;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->in = in;
    l->out = out;
    l->max_batch = max_batch;
}

int ps_layer_add_tensor(ps_layer *l, const char *suffix, uint32_t ndim, const uint32_t *dims)
{
    if (l->ntensors >= PS_LAYER_TENSORS_MAX || ndim < 1 || ndim > PS_DIMS_MAX)
        return PS_EINVAL;
    ps_layer_tensor *t = &l->tensors[l->ntensors];
    int n = snprintf(t->name, sizeof(t->name), "%s.%s", l->name, suffix);
    if (n < 0 || (size_t)n >= sizeof(t->name))
        return PS_EINVAL;
    size_t count = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] < 1)
            return PS_EINVAL;
        t->dims[i] = dims[i];
        count *= dims[i];
    }
    t->ndim = ndim;
    t->offset = l->nparams;
    t->count = count;
    l->nparams += count;
    l->ntensors++;
    return PS_OK;
}

void ps_layer_bind(ps_layer *l, float *params, float *grads)
{
    assert(l->nparams == 0 || (params != NULL && grads != NULL));
    l->params = l->nparams ? params : NULL;
    l->grads = l->nparams ? grads : NULL;
}

void ps_layer_free(ps_layer *l)
{
    if (l != NULL)
        l->ops->destroy(l);
}

void ps_head_free(ps_head *h)
{
    if (h != NULL)
        h->ops->destroy(h);
}
