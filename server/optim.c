/* optim.c - server-side optimizers (see optim.h). */
#include "optim.h"

#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"

int srv_optim_init(srv_optim *o, const ps_config *cfg, size_t n)
{
    memset(o, 0, sizeof *o);
    o->kind = cfg->optimizer;
    o->n = n;
    srv_optim_configure(o, cfg);
    if (cfg->momentum > 0) {
        o->velocity = calloc(n ? n : 1, sizeof(float));
        if (!o->velocity)
            return PS_ENOMEM;
    }
    return 0;
}

void srv_optim_free(srv_optim *o)
{
    free(o->velocity);
    o->velocity = NULL;
}

void srv_optim_configure(srv_optim *o, const ps_config *cfg)
{
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->weight_decay = cfg->weight_decay;
}

size_t srv_optim_state_bytes(const srv_optim *o)
{
    return o->velocity ? o->n * sizeof(float) : 0;
}

/* SGD with momentum and weight decay, in PyTorch's form:
 *   d = g + wd*w;  v = mu*v + d;  w -= lr*v      (mu > 0)
 *   w -= lr*(g + wd*w)                           (mu == 0)          */
void srv_optim_apply(srv_optim *o, float *restrict w, const float *restrict g, uint64_t off, uint64_t n,
                     uint64_t version)
{
    const float lr = (float)o->lr, wd = (float)o->weight_decay, mu = (float)o->momentum;
    (void)version;
    w += off;
    if (o->velocity) {
        float *restrict v = o->velocity + off;
        for (uint64_t i = 0; i < n; i++) {
            float d = g[i] + wd * w[i];
            v[i] = mu * v[i] + d;
            w[i] -= lr * v[i];
        }
    } else {
        for (uint64_t i = 0; i < n; i++)
            w[i] -= lr * (g[i] + wd * w[i]);
    }
}
