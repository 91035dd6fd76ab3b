/* layer_relu.c - the rectified linear unit, max(0, x), elementwise. */
#include "layer.h"

#include "proto/errors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Four floats at a time through a GCC/Clang generic vector (SSE, NEON or
 * scalars): the compare makes a mask, so no branch mispredicts on the sign
 * pattern, which is noise. GCC 12 vectorises the plain loop only from -O3;
 * written out it stays fast in -O2, debug and sanitizer builds too. */
typedef float v4f __attribute__((vector_size(4 * sizeof(float))));
typedef int32_t v4i __attribute__((vector_size(4 * sizeof(int32_t))));

static void relu_forward(ps_layer *l, const float *in, float *out, int batch, int training)
{
    (void)training;
    const size_t n = (size_t)batch * ps_shape_size(l->in);
    const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f x;
        memcpy(&x, in + i, sizeof(x));
        x = (v4f)((v4i)x & (x > zero));
        memcpy(out + i, &x, sizeof(x));
    }
    for (; i < n; i++)
        out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

/* The derivative at 0 is taken as 0, read from the output so the input is not
 * needed: out > 0 exactly where in > 0. */
static void relu_backward(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch)
{
    (void)in;
    if (din == NULL)
        return;
    const size_t n = (size_t)batch * ps_shape_size(l->in);
    const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f o, g;
        memcpy(&o, out + i, sizeof(o));
        memcpy(&g, dout + i, sizeof(g));
        g = (v4f)((v4i)g & (o > zero));
        memcpy(din + i, &g, sizeof(g));
    }
    for (; i < n; i++)
        din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

static void relu_destroy(ps_layer *l)
{
    free(l);
}

static const ps_layer_ops relu_ops = {
    .kind = "relu",
    .init = NULL,
    .reseed = NULL,
    .forward = relu_forward,
    .backward = relu_backward,
    .destroy = relu_destroy,
};

int ps_layer_relu_create(const char *name, ps_shape in, int max_batch, ps_layer **out)
{
    *out = NULL;
    if (in.c < 1 || in.h < 1 || in.w < 1 || max_batch < 1)
        return PS_EINVAL;
    ps_layer *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return PS_ENOMEM;
    ps_layer_base_init(l, &relu_ops, name, in, in, max_batch);
    *out = l;
    return PS_OK;
}
