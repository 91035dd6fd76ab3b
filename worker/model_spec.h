/* model_spec.h - a model spec ("mlp:256,128:dropout=0.2", see the grammar
 * in model.h) taken apart, for model.c to build from; model_spec.c parses. */
#ifndef PS_WORKER_MODEL_SPEC_H
#define PS_WORKER_MODEL_SPEC_H

#include <stddef.h>

#include "layer.h"
#include "model.h"

typedef enum model_kind { KIND_SOFTMAX, KIND_LINEAR, KIND_MLP, KIND_CNN } model_kind;

/* A spec taken apart; see the grammar in model.h. */
typedef struct model_spec {
    model_kind kind;
    int nhidden;                     /* mlp: entries used in hidden[] */
    int hidden[PS_MODEL_MAX_HIDDEN]; /* mlp: hidden sizes */
    float dropout;                   /* drop probability; 0 = no dropout layers */
    ps_init init;                    /* how ps_model_init_params draws */
} model_spec;

/* Takes spec apart into *s; returns 0 or PS_EINVAL with one line in err. */
int ps_model_spec_parse(const char *spec, model_spec *s, char *err, size_t errlen);

#endif
