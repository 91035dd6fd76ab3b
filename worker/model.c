/* model.c - building a model from its spec, the flat parameter and gradient
 * vectors, and the train step and evaluation loops over the layer list. */
#include "model.h"

#include "layer.h"
#include "proto/errors.h"
#include "rng.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LAYERS 128

struct ps_model {
    char spec[128];               /* as given, for describe */
    int in_dim;                   /* features per sample */
    int n_classes;                /* head input size */
    int max_batch;                /* largest batch */
    int nlayers;                  /* entries used in layers[] */
    ps_layer *layers[MAX_LAYERS]; /* in forward order; owned */
    ps_head *head;                /* loss on the last layer's output; owned */
    size_t nparams;               /* length of params and grads */
    float *params;                /* flat parameters; layers point into it */
    float *grads;                 /* flat gradients; layers point into it */
    float *act[MAX_LAYERS];       /* act[i]: output of layer i, max_batch rows */
    float *dbuf[2];               /* ping-pong dL/d(activation), max_batch x widest */
};

__attribute__((format(printf, 3, 4)))
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

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

/* Appends a layer the model then owns; frees it and returns PS_EINVAL when the
 * list is full. */
static int push_layer(ps_model *m, ps_layer *l)
{
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
    return m->nlayers ? m->layers[m->nlayers - 1]->out : ps_shape_flat(m->in_dim);
}

static int add_dense(ps_model *m, int *fc, int out_features)
{
    char name[16];
    ps_layer *l;
    snprintf(name, sizeof(name), "fc%d", ++*fc);
    int rc = ps_layer_dense_create(name, cur_shape(m), out_features, m->max_batch, &l);
    return rc ? rc : push_layer(m, l);
}

static int add_relu(ps_model *m)
{
    char name[16];
    ps_layer *l;
    snprintf(name, sizeof(name), "relu%d", m->nlayers + 1);
    int rc = ps_layer_relu_create(name, cur_shape(m), m->max_batch, &l);
    return rc ? rc : push_layer(m, l);
}

/* Parses "H1,H2,..." into hidden[]; returns the count or a negative code with
 * a message. */
static int parse_hidden(const char *spec, const char *list, int *hidden, char *err, size_t errlen)
{
    int n = 0;
    const char *p = list;
    if (*p == '\0') {
        seterr(err, errlen, "bad model '%s': expected mlp:H1,H2,... with at least one hidden size", spec);
        return PS_EINVAL;
    }
    for (;;) {
        const char *start = p;
        long v = 0;
        while (*p >= '0' && *p <= '9') {
            if (v <= PS_MODEL_MAX_WIDTH)
                v = v * 10 + (*p - '0');
            p++;
        }
        if (p == start || (*p != ',' && *p != '\0') || v < 1 || v > PS_MODEL_MAX_WIDTH) {
            const char *end = start;
            while (*end && *end != ',')
                end++;
            seterr(err, errlen, "bad hidden size '%.*s' in model '%s': expected a whole number from 1 to %d",
                   (int)(end - start), start, spec, PS_MODEL_MAX_WIDTH);
            return PS_EINVAL;
        }
        if (n == PS_MODEL_MAX_HIDDEN) {
            seterr(err, errlen, "bad model '%s': more than %d hidden layers", spec, PS_MODEL_MAX_HIDDEN);
            return PS_EINVAL;
        }
        hidden[n++] = (int)v;
        if (*p == '\0')
            return n;
        p++; /* past ',' */
    }
}

/* Lays the layers' slices end to end, allocates the flat vectors and every
 * activation buffer, and binds the layers. */
static int finish(ps_model *m, char *err, size_t errlen)
{
    /* dbuf holds dL/d(output) of every layer; the model's own input needs no
     * gradient, so the widest output sets the size. */
    size_t total = 0, widest = 0;
    for (int i = 0; i < m->nlayers; i++) {
        ps_layer *l = m->layers[i];
        l->offset = total;
        total += l->nparams;
        if (total > PS_MODEL_MAX_PARAMS) {
            seterr(err, errlen, "model '%s' is too big: more than %u parameters", m->spec, PS_MODEL_MAX_PARAMS);
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
        m->act[i] = ps_falloc((size_t)m->max_batch * ps_shape_size(l->out));
        if (m->act[i] == NULL)
            goto nomem;
    }
    return PS_OK;
nomem:
    seterr(err, errlen, "out of memory building model '%s' (%zu parameters, batch %d)", m->spec, total, m->max_batch);
    return PS_ENOMEM;
}

int ps_model_create(const char *spec, int in_dim, int n_classes, int max_batch, ps_model **out, char *err,
                    size_t errlen)
{
    int rc = PS_OK;
    int hidden[PS_MODEL_MAX_HIDDEN];
    int nhidden = 0;
    ps_model *m = NULL;

    *out = NULL;
    if (in_dim < 1 || in_dim > PS_MODEL_MAX_IN || n_classes < 2 || n_classes > 256 || max_batch < 1 ||
        max_batch > PS_MODEL_MAX_BATCH) {
        seterr(err, errlen,
               "bad model sizes: %d inputs, %d classes, batch %d (expected 1..%d inputs, 2..256 classes, batch 1..%d)",
               in_dim, n_classes, max_batch, PS_MODEL_MAX_IN, PS_MODEL_MAX_BATCH);
        return PS_EINVAL;
    }
    if (strcmp(spec, "softmax") == 0) {
        nhidden = 0;
    } else if (strncmp(spec, "mlp:", 4) == 0) {
        nhidden = parse_hidden(spec, spec + 4, hidden, err, errlen);
        if (nhidden < 0)
            return nhidden;
    } else {
        seterr(err, errlen, "unknown model '%s': expected softmax or mlp:H1,H2,...", spec);
        return PS_EINVAL;
    }

    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        seterr(err, errlen, "out of memory building model '%s'", spec);
        return PS_ENOMEM;
    }
    snprintf(m->spec, sizeof(m->spec), "%s", spec);
    m->in_dim = in_dim;
    m->n_classes = n_classes;
    m->max_batch = max_batch;

    int fc = 0;
    for (int i = 0; i < nhidden && rc == PS_OK; i++) {
        rc = add_dense(m, &fc, hidden[i]);
        if (rc == PS_OK)
            rc = add_relu(m);
    }
    if (rc == PS_OK)
        rc = add_dense(m, &fc, n_classes);
    if (rc == PS_OK)
        rc = ps_head_softmax_xent_create(cur_shape(m), max_batch, &m->head);
    if (rc != PS_OK) {
        seterr(err, errlen, "cannot build model '%s': %s", spec,
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

size_t ps_model_nparams(const ps_model *m)
{
    return m->nparams;
}

float *ps_model_params(ps_model *m)
{
    return m->params;
}

float *ps_model_grads(ps_model *m)
{
    return m->grads;
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

void ps_model_describe(const ps_model *m, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    append(buf, len, &used, "%s %d", m->spec, m->in_dim);
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i]->nparams > 0)
            append(buf, len, &used, "-%zu", ps_shape_size(m->layers[i]->out));
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

/* One step for any head: forward, loss, backward. Returns the mean loss. */
static double train_step_targets(ps_model *m, const float *x, const ps_targets *t, int batch)
{
    assert(batch >= 1 && batch <= m->max_batch);
    const float *z = forward(m, x, batch, 1);
    int cur = 0;
    double sum = m->head->ops->loss(m->head, z, t, batch, 1.0f / (float)batch, m->dbuf[cur], NULL);
    for (int i = m->nlayers - 1; i >= 0; i--) {
        ps_layer *l = m->layers[i];
        const float *in = i > 0 ? m->act[i - 1] : x;
        float *din = i > 0 ? m->dbuf[1 - cur] : NULL;
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

void ps_model_evaluate(ps_model *m, const float *x, const uint8_t *y, size_t n, double *loss, double *acc)
{
    double sum = 0.0;
    size_t right = 0;
    for (size_t done = 0; done < n;) {
        int b = n - done < (size_t)m->max_batch ? (int)(n - done) : m->max_batch;
        ps_targets t = {.labels = y + done, .values = NULL};
        const float *z = forward(m, x + done * (size_t)m->in_dim, b, 0);
        sum += m->head->ops->loss(m->head, z, &t, b, 1.0f, NULL, &right);
        done += (size_t)b;
    }
    *loss = n ? sum / (double)n : 0.0;
    *acc = n ? (double)right / (double)n : 0.0;
}
