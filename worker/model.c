/* model.c - building a model from its spec, the flat parameter and gradient
 * vectors, and the train step and evaluation loops over the layer list. */
#include "model.h"

#include "layer.h"
#include "common/log.h"
#include "proto/errors.h"
#include "model_spec.h"
#include "rng.h"

#include <cblas.h>

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 128

struct ps_model {
    char spec[PS_MODEL_SPEC_MAX + 1]; /* as given, for describe */
    ps_shape in;                      /* per-sample input shape */
    int in_dim;                       /* features per sample: ps_shape_size(in) */
    int n_out;                        /* head input size: classes or targets */
    int regression;                   /* the head is least squares */
    ps_init init;                     /* given to every layer */
    int max_batch;                    /* largest batch */
    int nlayers;                      /* entries used in layers[] */
    int first;                        /* first layer with parameters: no backward before it */
    int fc, conv, other;              /* layers named so far, per name family */
    ps_layer *layers[MAX_LAYERS];     /* in forward order; owned */
    ps_head *head;                    /* loss on the last layer's output; owned */
    size_t nparams;                   /* length of params and grads */
    float *params;                    /* flat parameters; layers point into it */
    float *bound;                     /* parameters the layers use instead, owned by the caller
                                       * (ps_model_bind_params); NULL: params */
    float *gbound;                    /* gradient vector the layers write instead
                                       * (ps_model_bind_grads); NULL: grads */
    float *grads;                     /* flat gradients; layers point into it */
    float *act[MAX_LAYERS];           /* act[i]: output of layer i, max_batch rows */
    float *dbuf[2];                   /* ping-pong dL/d(activation), max_batch x widest */
};

void ps_model_free(ps_model *m)
{
    if (m == NULL)
        return;
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer_free(m->layers[i]);
        free(m->act[i]);
    }
    ps_head_free(m->head);
    free(m->params);
    free(m->grads);
    free(m->dbuf[0]);
    free(m->dbuf[1]);
    free(m);
}

/* ---- building ------------------------------------------------------------ */

/* Appends a layer the model then owns, or passes rc on from its constructor;
 * frees it and returns PS_EINVAL when the list is full. */
static int push_layer(ps_model *m, int rc, ps_layer *l)
{
    if (rc != PS_OK)
        return rc;
    if (m->nlayers >= MAX_LAYERS) {
        ps_layer_free(l);
        return PS_EINVAL;
    }
    m->layers[m->nlayers++] = l;
    return PS_OK;
}

/* Output shape of the last layer so far (the input shape when none). */
static ps_shape cur_shape(const ps_model *m)
{
    return m->nlayers ? m->layers[m->nlayers - 1]->out : m->in;
}

static int add_dense(ps_model *m, int out_features)
{
    char name[16];
    ps_layer *l = NULL;
    snprintf(name, sizeof(name), "fc%d", ++m->fc);
    int rc = ps_layer_dense_create(name, cur_shape(m), out_features, m->max_batch, &l);
    return push_layer(m, rc, l);
}

static int add_conv(ps_model *m, int out_c, int k)
{
    char name[16];
    ps_layer *l = NULL;
    snprintf(name, sizeof(name), "conv%d", ++m->conv);
    int rc = ps_layer_conv2d_create(name, cur_shape(m), out_c, k, k, 1, 0, m->max_batch, &l);
    return push_layer(m, rc, l);
}

static int add_relu(ps_model *m)
{
    char name[16];
    ps_layer *l = NULL;
    snprintf(name, sizeof(name), "relu%d", ++m->other);
    int rc = ps_layer_relu_create(name, cur_shape(m), m->max_batch, &l);
    return push_layer(m, rc, l);
}

static int add_pool(ps_model *m, int size)
{
    char name[16];
    ps_layer *l = NULL;
    snprintf(name, sizeof(name), "pool%d", ++m->other);
    int rc = ps_layer_maxpool_create(name, cur_shape(m), size, m->max_batch, &l);
    return push_layer(m, rc, l);
}

/* A dropout layer when p > 0, nothing otherwise. Seeds are set for all
 * dropout layers at once by ps_model_reseed. */
static int add_dropout(ps_model *m, float p)
{
    char name[16];
    ps_layer *l = NULL;
    if (p <= 0.0f)
        return PS_OK;
    snprintf(name, sizeof(name), "drop%d", ++m->other);
    int rc = ps_layer_dropout_create(name, cur_shape(m), p, 0, m->max_batch, &l);
    return push_layer(m, rc, l);
}

/* ---- assembly ------------------------------------------------------------ */

/* Appends the layers and head of the parsed spec s. */
static int build(ps_model *m, const model_spec *s)
{
    int rc = PS_OK;
    switch (s->kind) {
    case KIND_SOFTMAX:
    case KIND_LINEAR:
        break;
    case KIND_MLP:
        for (int i = 0; i < s->nhidden && rc == PS_OK; i++) {
            rc = add_dense(m, s->hidden[i]);
            if (rc == PS_OK)
                rc = add_relu(m);
            if (rc == PS_OK)
                rc = add_dropout(m, s->dropout);
        }
        break;
    case KIND_CNN:
        rc = add_conv(m, 10, 5);
        if (rc == PS_OK)
            rc = add_pool(m, 2);
        if (rc == PS_OK)
            rc = add_relu(m);
        if (rc == PS_OK)
            rc = add_conv(m, 20, 5);
        if (rc == PS_OK)
            rc = add_pool(m, 2);
        if (rc == PS_OK)
            rc = add_relu(m);
        if (rc == PS_OK)
            rc = add_dropout(m, s->dropout);
        if (rc == PS_OK)
            rc = add_dense(m, 50);
        if (rc == PS_OK)
            rc = add_relu(m);
        if (rc == PS_OK)
            rc = add_dropout(m, s->dropout);
        break;
    }
    if (rc == PS_OK)
        rc = add_dense(m, m->n_out);
    if (rc == PS_OK)
        rc = m->regression ? ps_head_lsq_create(cur_shape(m), m->max_batch, &m->head)
                           : ps_head_softmax_xent_create(cur_shape(m), m->max_batch, &m->head);
    return rc;
}

/* Lays the layers' slices end to end, allocates the flat vectors and every
 * activation buffer, and binds the layers. */
static int finish(ps_model *m, char *err, size_t errlen)
{
    /* dbuf holds dL/d(output) of every layer; the model's own input needs no
     * gradient, so the widest output sets the size. */
    size_t total = 0, widest = 0;
    m->first = m->nlayers;
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer *l = m->layers[i];
        l->offset = total;
        total += l->nparams;
        if (l->nparams > 0 && m->first == m->nlayers)
            m->first = i;
        if (total > PS_MODEL_MAX_PARAMS) {
            ps_errf(err, errlen, "model '%s' is too big: more than %u parameters", m->spec, PS_MODEL_MAX_PARAMS);
            return PS_EINVAL;
        }
        size_t w = ps_shape_size(l->out);
        if (w > widest)
            widest = w;
    }
    m->nparams = total;
    m->params = ps_falloc(total);
    m->grads = ps_falloc(total);
    m->dbuf[0] = ps_falloc((size_t)m->max_batch * widest);
    m->dbuf[1] = ps_falloc((size_t)m->max_batch * widest);
    if (!m->params || !m->grads || !m->dbuf[0] || !m->dbuf[1])
        goto nomem;
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer *l = m->layers[i];
        ps_layer_bind(l, m->params + l->offset, m->grads + l->offset);
        l->init = m->init;
        m->act[i] = ps_falloc((size_t)m->max_batch * ps_shape_size(l->out));
        if (m->act[i] == NULL)
            goto nomem;
    }
    ps_model_reseed(m, 0);
    return PS_OK;
nomem:
    ps_errf(err, errlen, "out of memory building model '%s' (%zu parameters, batch %d)", m->spec, total, m->max_batch);
    return PS_ENOMEM;
}

/* Checks the sizes against the parsed spec; returns 0 or PS_EINVAL with a
 * message. */
static int check_sizes(const char *spec, const model_spec *s, int c, int h, int w, int n_out, int max_batch,
                       char *err, size_t errlen)
{
    const int shape_ok = c >= 1 && h >= 1 && w >= 1 && c <= PS_MODEL_MAX_IN && h <= PS_MODEL_MAX_IN &&
                         w <= PS_MODEL_MAX_IN && (long)c * h <= PS_MODEL_MAX_IN && (long)c * h * w <= PS_MODEL_MAX_IN;
    if (!shape_ok || max_batch < 1 || max_batch > PS_MODEL_MAX_BATCH) {
        char shape[48];
        if (h == 1 && w == 1)
            snprintf(shape, sizeof(shape), "%d", c);
        else
            snprintf(shape, sizeof(shape), "%dx%dx%d", c, h, w);
        ps_errf(err, errlen, "bad model sizes: %s inputs, batch %d (expected 1..%d inputs, batch 1..%d)", shape,
               max_batch, PS_MODEL_MAX_IN, PS_MODEL_MAX_BATCH);
        return PS_EINVAL;
    }
    if (s->kind == KIND_LINEAR) {
        if (n_out < 1 || n_out > PS_MODEL_MAX_WIDTH) {
            ps_errf(err, errlen, "bad model sizes: %d outputs for model '%s' (expected 1..%d)", n_out, spec,
                   PS_MODEL_MAX_WIDTH);
            return PS_EINVAL;
        }
    } else if (n_out < 2 || n_out > 256) {
        ps_errf(err, errlen, "bad model sizes: %d classes for model '%s' (expected 2..256)", n_out, spec);
        return PS_EINVAL;
    }
    if (s->kind == KIND_CNN && (h < 16 || w < 16)) {
        ps_errf(err, errlen, "model '%s' needs images of at least 16x16 pixels, not %dx%d", spec, h, w);
        return PS_EINVAL;
    }
    return PS_OK;
}

static int create(const char *spec, const model_spec *s, ps_shape in, int n_out, int max_batch, ps_model **out,
                  char *err, size_t errlen)
{
    int rc = check_sizes(spec, s, in.c, in.h, in.w, n_out, max_batch, err, errlen);
    if (rc != PS_OK)
        return rc;
    ps_model *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        ps_errf(err, errlen, "out of memory building model '%s'", spec);
        return PS_ENOMEM;
    }
    snprintf(m->spec, sizeof(m->spec), "%s", spec);
    m->in = in;
    m->in_dim = (int)ps_shape_size(in);
    m->n_out = n_out;
    m->regression = s->kind == KIND_LINEAR;
    m->init = s->init;
    m->max_batch = max_batch;
    rc = build(m, s);
    if (rc != PS_OK) {
        ps_errf(err, errlen, "cannot build model '%s': %s", spec,
               rc == PS_ENOMEM ? "out of memory" : "a layer rejected its sizes");
        goto out;
    }
    rc = finish(m, err, errlen);
out:
    if (rc != PS_OK) {
        ps_model_free(m);
        return rc;
    }
    *out = m;
    return PS_OK;
}

int ps_model_create_chw(const char *spec, int c, int h, int w, int n_out, int max_batch, ps_model **out, char *err,
                        size_t errlen)
{
    model_spec s;
    *out = NULL;
    int rc = ps_model_spec_parse(spec, &s, err, errlen);
    if (rc != PS_OK)
        return rc;
    ps_shape in = {c, h, w};
    return create(spec, &s, in, n_out, max_batch, out, err, errlen);
}

int ps_model_create(const char *spec, int in_dim, int n_classes, int max_batch, ps_model **out, char *err,
                    size_t errlen)
{
    model_spec s;
    *out = NULL;
    int rc = ps_model_spec_parse(spec, &s, err, errlen);
    if (rc != PS_OK)
        return rc;
    ps_shape in = ps_shape_flat(in_dim);
    if (s.kind == KIND_CNN && in_dim >= 1) {
        int side = 0;
        while ((long)(side + 1) * (side + 1) <= in_dim)
            side++;
        if ((long)side * side != in_dim) {
            ps_errf(err, errlen, "model '%s' needs square one-channel images, and %d inputs is not n*n pixels", spec,
                   in_dim);
            return PS_EINVAL;
        }
        in = (ps_shape){1, side, side};
    }
    return create(spec, &s, in, n_classes, max_batch, out, err, errlen);
}

size_t ps_model_nparams(const ps_model *m)
{
    return m->nparams;
}

float *ps_model_params(ps_model *m)
{
    return m->bound ? m->bound : m->params;
}

/* Points every layer at the current parameter and gradient vectors. */
static void rebind(ps_model *m)
{
    float *p = ps_model_params(m), *g = ps_model_grads(m);
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer *l = m->layers[i];
        ps_layer_bind(l, p + l->offset, g + l->offset);
    }
}

void ps_model_bind_params(ps_model *m, float *p)
{
    m->bound = p == m->params ? NULL : p;
    rebind(m);
}

void ps_model_bind_grads(ps_model *m, float *g)
{
    m->gbound = g == m->grads ? NULL : g; /* NULL: the model's own */
    rebind(m);
}

void ps_model_unbind_params(ps_model *m)
{
    if (m->bound) {
        memcpy(m->params, m->bound, m->nparams * sizeof(float));
        ps_model_bind_params(m, m->params);
    }
}

float *ps_model_grads(ps_model *m)
{
    return m->gbound ? m->gbound : m->grads;
}

int ps_model_max_batch(const ps_model *m)
{
    return m->max_batch;
}

int ps_model_layout(const ps_model *m, ps_layout *out)
{
    ps_layout_init(out);
    for (int i = 0; i < m->nlayers; i++) {
        const ps_layer *l = m->layers[i];
        for (int t = 0; t < l->ntensors; t++) {
            const ps_layer_tensor *tt = &l->tensors[t];
            int rc = ps_layout_add(out, tt->name, tt->ndim, tt->dims);
            if (rc != PS_OK)
                return rc;
            /* The layout packs tensors end to end, and so do we. */
            assert(out->t[out->ntensors - 1].offset == l->offset + tt->offset);
        }
    }
    assert(out->total == m->nparams);
    return PS_OK;
}

/* Appends to buf at *used like snprintf; once full, later calls do nothing. */
__attribute__((format(printf, 4, 5)))
static void append(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
    if (*used >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (n > 0)
        *used += (size_t)n;
}

static void append_shape(char *buf, size_t len, size_t *used, ps_shape sh)
{
    if (sh.h == 1 && sh.w == 1)
        append(buf, len, used, "%d", sh.c);
    else
        append(buf, len, used, "%dx%dx%d", sh.c, sh.h, sh.w);
}

void ps_model_describe(const ps_model *m, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    append(buf, len, &used, "%s ", m->spec);
    append_shape(buf, len, &used, m->in);
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i]->nparams > 0) {
            append(buf, len, &used, "-");
            append_shape(buf, len, &used, m->layers[i]->out);
        }
    append(buf, len, &used, ", %zu params", m->nparams);
}

void ps_model_init_params(ps_model *m, uint64_t seed)
{
    ps_rng rng;
    ps_rng_seed(&rng, seed);
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i]->ops->init != NULL)
            m->layers[i]->ops->init(m->layers[i], &rng);
}

void ps_model_reseed(ps_model *m, uint64_t seed)
{
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i]->ops->reseed != NULL)
            m->layers[i]->ops->reseed(m->layers[i], seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1)));
}

/* Runs the layers forward on batch rows of x; returns the last output. */
static const float *forward(ps_model *m, const float *x, int batch, int training)
{
    const float *in = x;
    for (int i = 0; i < m->nlayers; i++) {
        m->layers[i]->ops->forward(m->layers[i], in, m->act[i], batch, training);
        in = m->act[i];
    }
    return in;
}

/* One step for any head: forward, loss, backward. Returns the mean loss.
 * Layers before the first one with parameters get no backward at all, and
 * that one gets din NULL: nobody needs the gradient of the model's input. */
static double train_step_targets(ps_model *m, const float *x, const ps_targets *t, int batch)
{
    assert(batch >= 1 && batch <= m->max_batch);
    const float *z = forward(m, x, batch, 1);
    int cur = 0;
    double sum = m->head->ops->loss(m->head, z, t, batch, 1.0f / (float)batch, m->dbuf[cur], NULL);
    for (int i = m->nlayers - 1; i >= m->first; i--) {
        ps_layer *l = m->layers[i];
        const float *in = i > 0 ? m->act[i - 1] : x;
        float *din = i > m->first ? m->dbuf[1 - cur] : NULL;
        l->ops->backward(l, in, m->act[i], m->dbuf[cur], din, batch);
        cur = 1 - cur;
    }
    return sum / batch;
}

float ps_model_train_step(ps_model *m, const float *x, const uint8_t *y, int batch)
{
    ps_targets t = {.labels = y, .values = NULL};
    return (float)train_step_targets(m, x, &t, batch);
}

float ps_model_train_step_pieces(ps_model *m, const float *x, const uint8_t *y, size_t n, float *acc)
{
    size_t maxb = (size_t)m->max_batch;
    if (n <= maxb)
        return ps_model_train_step(m, x, y, (int)n);
    size_t np = ps_model_nparams(m);
    double loss = 0;
    for (size_t s = 0; s < n; s += maxb) {
        size_t k = n - s < maxb ? n - s : maxb;
        float l = ps_model_train_step(m, x + s * (size_t)m->in_dim, y + s, (int)k);
        loss += (double)l * (double)k;
        const float *g = ps_model_grads(m);
        float wgt = (float)k / (float)n;
        if (s == 0)
            for (size_t i = 0; i < np; i++)
                acc[i] = wgt * g[i];
        else
            for (size_t i = 0; i < np; i++)
                acc[i] += wgt * g[i];
    }
    memcpy(ps_model_grads(m), acc, np * sizeof(float));
    return (float)(loss / (double)n);
}

float ps_model_train_step_values(ps_model *m, const float *x, const float *y, int batch)
{
    assert(m->regression);
    ps_targets t = {.labels = NULL, .values = y};
    return (float)train_step_targets(m, x, &t, batch);
}

int ps_model_outputs(const ps_model *m)
{
    return m->n_out;
}

int ps_model_is_regression(const ps_model *m)
{
    return m->regression;
}

/* Sums the head's loss over n samples in chunks; adds to *right what the head
 * counts right. Exactly one of labels and values is not NULL. */
static double eval_sum(ps_model *m, const float *x, const uint8_t *labels, const float *values, size_t n,
                       size_t *right)
{
    double sum = 0.0;
    for (size_t done = 0; done < n;) {
        int b = n - done < (size_t)m->max_batch ? (int)(n - done) : m->max_batch;
        ps_targets t = {.labels = labels ? labels + done : NULL,
                        .values = values ? values + done * (size_t)m->n_out : NULL};
        const float *z = forward(m, x + done * (size_t)m->in_dim, b, 0);
        sum += m->head->ops->loss(m->head, z, &t, b, 1.0f, NULL, right);
        done += (size_t)b;
    }
    return sum;
}

void ps_model_evaluate(ps_model *m, const float *x, const uint8_t *y, size_t n, double *loss, double *acc)
{
    size_t right = 0;
    double sum = eval_sum(m, x, y, NULL, n, &right);
    *loss = n ? sum / (double)n : 0.0;
    *acc = n ? (double)right / (double)n : 0.0;
}

void ps_model_evaluate_values(ps_model *m, const float *x, const float *y, size_t n, double *loss, double *r2)
{
    assert(m->regression);
    size_t right = 0;
    double sum = eval_sum(m, x, NULL, y, n, &right);
    *loss = n ? sum / (double)n : 0.0;
    *r2 = 0.0;
    if (n == 0)
        return;
    /* SST around each output's mean; two passes for accuracy. */
    const int K = m->n_out;
    double sst = 0.0;
    for (int j = 0; j < K; j++) {
        double mean = 0.0;
        for (size_t i = 0; i < n; i++)
            mean += y[i * (size_t)K + (size_t)j];
        mean /= (double)n;
        for (size_t i = 0; i < n; i++) {
            double d = y[i * (size_t)K + (size_t)j] - mean;
            sst += d * d;
        }
    }
    if (sst > 0.0)
        *r2 = 1.0 - 2.0 * sum / sst; /* the head's sum is half the SSE */
}

void ps_model_sgd_step(ps_model *m, float *vel, float lr, float momentum)
{
    const blasint n = (blasint)ps_model_nparams(m);
    const float *g = ps_model_grads(m);
    if (vel) {
        cblas_sscal(n, momentum, vel, 1);
        cblas_saxpy(n, 1.0f, g, 1, vel, 1);
        g = vel;
    }
    cblas_saxpy(n, -lr, g, 1, ps_model_params(m), 1);
}
