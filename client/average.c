/* average.c - local SGD and elastic averaging on the client's side
 * (PROTOCOL.md section 8, "Talking less"). The caller's own optimizer
 * takes steps on the parameter vector; psc_local_step counts them and,
 * every H (local SGD) or tau (elastic averaging) of them, exchanges with
 * psd: local SGD pushes w_base - w as the round's push and pulls the
 * round's mean model; elastic averaging pulls the centre c, moves the
 * local model by e = alpha (w - c) towards it and pushes -e. Owns
 * psc_client.avg_base (which link.c's average_opened sets at each open,
 * with the settings psd's WELCOME gave). A buffer (psc_add_buffer) is no trained value: it
 * goes as its value, as in any push, and keeps the local one. */
#include "internal.h"

/* 1 when value i of the flat vector belongs to a buffer; *end is where
 * the tensor holding it ends. */
static int is_buffer(const ps_layout *l, uint64_t i, uint64_t *end)
{
    for (uint32_t k = 0; k < l->ntensors; k++) {
        const ps_tensor_desc *t = &l->t[k];
        if (i >= t->offset && i < t->offset + t->count) {
            *end = t->offset + t->count;
            return t->buf != 0;
        }
    }
    *end = l->total;
    return 0;
}

uint32_t psc_local_steps(const psc_client *c)
{
    return c->local;
}

int psc_elastic(const psc_client *c, double *alpha, uint32_t *tau)
{
    if (!(c->alpha > 0))
        return 0;
    if (alpha)
        *alpha = c->alpha;
    if (tau)
        *tau = c->tau;
    return 1;
}

/* Local SGD's exchange: the difference between the model pulled last and
 * the local one goes as this worker's push of the round (its base the
 * version pulled last), and the round's mean model comes back; it is the
 * next base (a reconnect's pull too: average_opened in link.c). */
static int local_sync(psc_client *c)
{
    const ps_layout *l = &c->layout;
    const float *w = c->params, *b = c->avg_base;
    float *d = c->grads;
    for (uint64_t i = 0, end; i < l->total; i = end) {
        if (is_buffer(l, i, &end))
            memcpy(d + i, w + i, (size_t)(end - i) * sizeof(float));
        else
            for (uint64_t k = i; k < end; k++)
                d[k] = b[k] - w[k];
    }
    int rc = psc__run(c, OP_PUSHPULL, 0, l->total);
    if (rc != 0)
        return rc;
    memcpy(c->avg_base, c->params, (size_t)l->total * sizeof(float));
    return 1;
}

/* Elastic averaging's exchange: the centre is pulled into the parameter
 * vector (the local model waits in avg_base meanwhile), e = alpha (w - c)
 * is taken from the local model, and -e goes to psd, which adds e to the
 * centre. A pull that fails leaves the local model as it was. */
static int elastic_sync(psc_client *c)
{
    const ps_layout *l = &c->layout;
    size_t bytes = (size_t)l->total * sizeof(float);
    float *w = c->params, *save = c->avg_base, *g = c->grads;
    memcpy(save, w, bytes);
    int rc = psc__run(c, OP_PULL, 0, l->total);
    if (rc != 0) {
        memcpy(w, save, bytes);
        return rc;
    }
    const float a = (float)c->alpha;
    for (uint64_t i = 0, end; i < l->total; i = end) {
        if (is_buffer(l, i, &end)) {
            memcpy(g + i, save + i, (size_t)(end - i) * sizeof(float));
            memcpy(w + i, save + i, (size_t)(end - i) * sizeof(float));
            continue;
        }
        for (uint64_t k = i; k < end; k++) {
            float e = a * (save[k] - w[k]);
            g[k] = -e;
            w[k] = save[k] - e;
        }
    }
    rc = psc__run(c, OP_PUSH, 0, l->total);
    return rc != 0 ? rc : 1;
}

int psc_local_step(psc_client *c)
{
    int rc = psc__ready(c, "psc_local_step");
    if (rc != 0)
        return rc;
    if (!c->local && !(c->alpha > 0))
        return psc__fail(c, PSC_ESTATE, "psc_local_step: psd runs neither local SGD (local_steps) nor elastic averaging "
                                        "(elastic_alpha): push gradients instead (psc_pushpull)");
    uint32_t every = c->local ? c->local : c->tau;
    if (++c->local_n < every)
        return 0;
    c->local_n = 0;
    return c->local ? local_sync(c) : elastic_sync(c);
}
