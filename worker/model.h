/* model.h - a trainable model: a list of layers ending in a loss head, whose
 * parameters live in ONE flat float vector and whose gradients live in ONE
 * flat float vector of the same length, so a push sends one contiguous buffer
 * and a pull fills one.
 *
 * Models are built from a spec string:
 *   "softmax"          softmax regression: dense in_dim -> n_classes
 *   "mlp:H1,H2,...,Hn" dense+relu per hidden size, then dense -> n_classes
 * Dense layers are named fc1, fc2, ... and their tensors fc1.weight [out,in]
 * and fc1.bias [out] (PyTorch's naming and shapes), in that order in the flat
 * vector. Everything a step needs is allocated by ps_model_create for at most
 * max_batch samples; steps and evaluation allocate nothing. The number of
 * OpenBLAS threads is the caller's choice (openblas_set_num_threads). A model
 * is not thread-safe: one thread at a time may call into it. */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include "proto/layout.h"

#include <stddef.h>
#include <stdint.h>

#define PS_MODEL_MAX_HIDDEN 32        /* most hidden layers in an "mlp:" spec */
#define PS_MODEL_MAX_WIDTH 65536      /* widest hidden layer */
#define PS_MODEL_MAX_BATCH 65536      /* largest max_batch */
#define PS_MODEL_MAX_IN (1 << 24)     /* largest input size */
#define PS_MODEL_MAX_PARAMS (1u << 30) /* most parameters in one model */

typedef struct ps_model ps_model;

/* Builds the model described by spec for inputs of in_dim features and
 * n_classes classes (2..256), for batches of up to max_batch samples. The
 * parameters start at zero: call ps_model_init_params, or copy pulled values
 * into ps_model_params. Returns 0 and sets *out, or a negative code with one
 * line in err (if not NULL):
 *   PS_EINVAL  unknown spec, bad hidden sizes, or sizes out of range
 *   PS_ENOMEM  out of memory
 * e.g. "unknown model 'xyz': expected softmax or mlp:H1,H2,...". */
int ps_model_create(const char *spec, int in_dim, int n_classes, int max_batch, ps_model **out, char *err,
                    size_t errlen);

/* Frees the model and everything it owns; NULL-safe. */
void ps_model_free(ps_model *m);

/* Number of floats in the parameter vector (and in the gradient vector). */
size_t ps_model_nparams(const ps_model *m);

/* The flat parameter vector, nparams floats, 64-byte aligned. The caller may
 * read and write it freely between steps (pulls land here). */
float *ps_model_params(ps_model *m);

/* The flat gradient vector, nparams floats, 64-byte aligned, written by each
 * ps_model_train_step. */
float *ps_model_grads(ps_model *m);

/* Largest batch the model was created for. */
int ps_model_max_batch(const ps_model *m);

/* Fills *out with the model's tensors (names, shapes, offsets) in flat-vector
 * order. Returns 0, or the negative code from ps_layout_add (e.g. more tensors
 * than a layout holds). */
int ps_model_layout(const ps_model *m, ps_layout *out);

/* Writes e.g. "mlp:256,128 784-256-128-10, 235146 params" into buf; always
 * NUL-terminates. */
void ps_model_describe(const ps_model *m, char *buf, size_t len);

/* Sets every parameter to its initial value: He-normal weights (std
 * sqrt(2/fan_in)), zero biases, drawn from xoshiro256** seeded by seed, so
 * the same seed gives bit-identical parameters on every machine. */
void ps_model_init_params(ps_model *m, uint64_t seed);

/* Reseeds stochastic layers (dropout, when there is one); no-op otherwise. */
void ps_model_reseed(ps_model *m, uint64_t seed);

/* One forward and backward pass on a batch: x is batch * in_dim floats,
 * row-major; y batch labels, each < n_classes. Overwrites the gradient vector
 * with the MEAN gradient over the batch and returns the mean loss. The
 * parameters are not changed: applying the gradient is the caller's (or the
 * server's) business. 1 <= batch <= max_batch. */
float ps_model_train_step(ps_model *m, const float *x, const uint8_t *y, int batch);

/* Forward only (training off) over n samples, in chunks of max_batch. Sets
 * *loss to the mean loss and *acc to the fraction predicted right (both 0
 * when n is 0). Touches neither parameters nor gradients. */
void ps_model_evaluate(ps_model *m, const float *x, const uint8_t *y, size_t n, double *loss, double *acc);

#endif
