/* optim.h - the server-side optimizer: turns a (range, mean gradient) into
 * an update of the parameters, keeping its own state (momentum, moments)
 * for every parameter. It knows nothing of modes, rounds or sockets; the
 * learning-rate schedule reads the model version it is given. */
#ifndef SRV_OPTIM_H
#define SRV_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

typedef struct srv_optim {
    int kind;                 /* enum ps_optimizer_kind */
    double lr, momentum, weight_decay;
    size_t n;                 /* parameters */
    float *velocity;          /* sgd momentum buffer, n floats (NULL when momentum == 0) */
} srv_optim;

/* Sets o up for n parameters with cfg's optimizer settings, allocating its
 * state (zeroed). Returns 0 or PS_ENOMEM (o is then empty). */
int srv_optim_init(srv_optim *o, const ps_config *cfg, size_t n);
void srv_optim_free(srv_optim *o);

/* Takes the run-time settings (lr, momentum, weight decay, schedule, clip)
 * from cfg; the optimizer kind and state stay. */
void srv_optim_configure(srv_optim *o, const ps_config *cfg);

/* Bytes of optimizer state (for status and memory accounting). */
size_t srv_optim_state_bytes(const srv_optim *o);

/* Applies the mean gradient g[0..n) to w[off..off+n) as the update that
 * will become model version `version + 1`. */
void srv_optim_apply(srv_optim *o, float *w, const float *g, uint64_t off, uint64_t n, uint64_t version);

#endif
