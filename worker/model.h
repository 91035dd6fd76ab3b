/* model.h - a trainable model: a list of layers ending in a loss head, whose
 * parameters live in ONE flat float vector and whose gradients live in ONE
 * flat float vector of the same length, so a push sends one contiguous buffer
 * and a pull fills one.
 *
 * Models are built from a spec string:
 *
 *   spec    = kind [":" sizes] [":" options]
 *   sizes   = N {"," N}                    (mlp only, and required there)
 *   options = name "=" value {"," name "=" value}
 *
 *   "softmax"          softmax regression: dense in -> n_out, cross-entropy
 *   "linear"           least-squares regression: dense in -> n_out, loss
 *                      0.5 * ||y_hat - y||^2 per sample (see ps_head_lsq_create)
 *   "mlp:H1,...,Hn"    dense+relu per hidden size, then dense -> n_out,
 *                      cross-entropy
 *   "cnn"              the PyTorch MNIST example's network: conv5x5(c->10) -
 *                      maxpool2 - relu - conv5x5(10->20) - maxpool2 - relu -
 *                      flatten - fc(->50) - relu - fc(50->n_out),
 *                      cross-entropy; 21,840 parameters on 1x28x28 images
 *                      with 10 classes. Needs images of at least 16x16.
 *
 * Options (each at most once, comma-separated):
 *   dropout=P   mlp and cnn: inverted dropout with drop probability P,
 *               0 <= P < 1, while training. mlp: after every hidden relu;
 *               cnn: after the second conv block (on the 320 flattened
 *               features) and after fc1's relu. Default 0 (no dropout
 *               layers at all).
 *   init=he|torch  how ps_model_init_params draws (see ps_init in layer.h):
 *               he = He-normal weights, zero biases; torch = PyTorch's
 *               default for nn.Linear/nn.Conv2d, weights and biases
 *               U(+-1/sqrt(fan_in)). Default he, except torch for cnn, which
 *               then starts as the PyTorch example does (and trains far
 *               better with SGD at lr 0.05, momentum 0.9).
 * e.g. "cnn:dropout=0.5", "mlp:256,128:dropout=0.2,init=torch",
 * "softmax:init=torch". A malformed spec is rejected with one line naming the
 * bad part.
 *
 * Layers are named fc1, fc2, ... (dense; tensors fc1.weight [out,in] and
 * fc1.bias [out]) and conv1, conv2 (tensors conv1.weight [out_c,in_c,kh,kw]
 * and conv1.bias [out_c]) - PyTorch's names and shapes - and their tensors
 * lie in forward order in the flat vector. Everything a step needs is
 * allocated by ps_model_create for at most max_batch samples; steps and
 * evaluation allocate nothing. The number of OpenBLAS threads is the caller's
 * choice (openblas_set_num_threads). A model is not thread-safe: one thread
 * at a time may call into it. */
#ifndef PS_MODEL_H
#define PS_MODEL_H

#include "proto/layout.h"

#include <stddef.h>
#include <stdint.h>

#define PS_MODEL_MAX_HIDDEN 32        /* most hidden layers in an "mlp:" spec */
#define PS_MODEL_SPEC_MAX 255         /* longest spec string */
#define PS_MODEL_MAX_WIDTH 65536      /* widest hidden layer */
#define PS_MODEL_MAX_BATCH 65536      /* largest max_batch */
#define PS_MODEL_MAX_IN (1 << 24)     /* largest input size */
#define PS_MODEL_MAX_PARAMS (1u << 30) /* most parameters in one model */

typedef struct ps_model ps_model;

/* Builds the model described by spec for inputs of in_dim features and
 * n_classes outputs, for batches of up to max_batch samples. Classifiers
 * (softmax, mlp, cnn) take 2..256 classes; "linear" takes 1..PS_MODEL_MAX_WIDTH
 * outputs. Inputs are flat vectors, except that a model with convolutions
 * ("cnn") reads in_dim = n*n as one-channel n x n images (784 = 1x28x28);
 * for other image shapes use ps_model_create_chw. The parameters start at
 * zero: call ps_model_init_params, or copy pulled values into
 * ps_model_params. Returns 0 and sets *out, or a negative code with one line
 * in err (if not NULL):
 *   PS_EINVAL  unknown or malformed spec, or sizes out of range
 *   PS_ENOMEM  out of memory
 * e.g. "unknown model 'xyz': expected softmax, linear, mlp:H1,H2,... or cnn". */
int ps_model_create(const char *spec, int in_dim, int n_classes, int max_batch, ps_model **out, char *err,
                    size_t errlen);

/* As ps_model_create for inputs that are c x h x w images (CHW order, as
 * PyTorch and IDX store them; a flat vector of n is n x 1 x 1). Dense models
 * see the same c*h*w features flat. */
int ps_model_create_chw(const char *spec, int c, int h, int w, int n_out, int max_batch, ps_model **out, char *err,
                        size_t errlen);

/* Frees the model and everything it owns; NULL-safe. */
void ps_model_free(ps_model *m);

/* Number of floats in the parameter vector (and in the gradient vector). */
size_t ps_model_nparams(const ps_model *m);

/* The flat parameter vector, nparams floats, 64-byte aligned. The caller may
 * read and write it freely between steps (pulls land here). */
float *ps_model_params(ps_model *m);

/* Makes the layers read their parameters from p (nparams floats, at least
 * float-aligned, owned by the caller, unchanged while the model computes)
 * instead of the model's own vector: a worker points the model straight at
 * the parameters it just received, without a copy. ps_model_params then
 * returns p. Passing the model's own vector (or calling
 * ps_model_unbind_params, which first copies p into it) goes back. */
void ps_model_bind_params(ps_model *m, float *p);
void ps_model_unbind_params(ps_model *m);

/* Makes train steps write their gradient to g (nparams floats, owned by the
 * caller) instead of the model's own gradient vector, so the previous
 * gradient can still be on its way to psd while the next one is computed.
 * NULL goes back to the model's own vector. */
void ps_model_bind_grads(ps_model *m, float *g);

/* The flat gradient vector, nparams floats, 64-byte aligned, written by each
 * ps_model_train_step. */
float *ps_model_grads(ps_model *m);

/* Largest batch the model was created for. */
int ps_model_max_batch(const ps_model *m);

/* Fills *out with the model's tensors (names, shapes, offsets) in flat-vector
 * order. Returns 0, or the negative code from ps_layout_add (e.g. more tensors
 * than a layout holds). */
int ps_model_layout(const ps_model *m, ps_layout *out);

/* Writes e.g. "mlp:256,128 784-256-128-10, 235146 params" or "cnn
 * 1x28x28-10x24x24-20x8x8-50-10, 21840 params" (the input and the output
 * of every layer with parameters) into buf; always NUL-terminates. */
void ps_model_describe(const ps_model *m, char *buf, size_t len);

/* Sets every parameter to its initial value as the spec's init option says
 * (he: He-normal weights, std sqrt(2/fan_in), zero biases; torch: weights and
 * biases uniform in +-1/sqrt(fan_in); fan_in = in features for dense and
 * in_c*kh*kw for conv), drawn layer by layer from xoshiro256** seeded by
 * seed, so the same seed gives bit-identical parameters on every machine. */
void ps_model_init_params(ps_model *m, uint64_t seed);

/* Reseeds stochastic layers (dropout masks); each dropout layer gets its own
 * stream derived from seed and its position, so workers that should draw
 * different masks pass different seeds (e.g. the job seed mixed with the
 * shard). A new model behaves as if reseeded with 0. No-op without dropout. */
void ps_model_reseed(ps_model *m, uint64_t seed);

/* Number of outputs: classes for a classifier, targets per sample for a
 * regression model. */
int ps_model_outputs(const ps_model *m);

/* 1 for a least-squares regression model ("linear"), 0 for a classifier. */
int ps_model_is_regression(const ps_model *m);

/* One forward and backward pass on a batch: x is batch * in_dim floats,
 * row-major; y batch labels, each < n_classes. Overwrites the gradient vector
 * with the MEAN gradient over the batch and returns the mean loss. The
 * parameters are not changed: applying the gradient is the caller's (or the
 * server's) business. 1 <= batch <= max_batch. A regression model trained on
 * labels fits the one-hot vector of each label (least-squares
 * classification). Dropout draws new masks on every step. */
float ps_model_train_step(ps_model *m, const float *x, const uint8_t *y, int batch);

/* As ps_model_train_step for a batch of any n >= 1 samples: above
 * max_batch it runs in pieces of max_batch and sets the gradient to their
 * mean weighted by size, the whole batch's gradient up to rounding; acc is
 * scratch of ps_model_nparams() floats, used only then. (psworker, when
 * survivors of a lost worker take larger steps.) Returns the mean loss. */
float ps_model_train_step_pieces(ps_model *m, const float *x, const uint8_t *y, size_t n, float *acc);

/* A plain SGD step of the model's gradient into its parameters, the
 * worker's own (psworker in local SGD and elastic averaging jobs): with
 * vel NULL, w -= lr * g; else heavy-ball momentum as PyTorch's SGD
 * (dampening 0): vel = momentum * vel + g, then w -= lr * vel. vel holds
 * ps_model_nparams() floats, zero before the first step. */
void ps_model_sgd_step(ps_model *m, float *vel, float lr, float momentum);

/* As ps_model_train_step for a regression model, with y batch * outputs
 * target values, row-major. Returns the mean over the batch of
 * 0.5 * ||y_hat - y||^2. Only for regression models. */
float ps_model_train_step_values(ps_model *m, const float *x, const float *y, int batch);

/* Forward only (training off) over n samples, in chunks of max_batch. Sets
 * *loss to the mean loss and *acc to the fraction predicted right, by argmax
 * of the outputs (both 0 when n is 0). Touches neither parameters nor
 * gradients. A regression model given labels is scored against their one-hot
 * vectors, as in training. */
void ps_model_evaluate(ps_model *m, const float *x, const uint8_t *y, size_t n, double *loss, double *acc);

/* As ps_model_evaluate for a regression model with n * outputs target values.
 * Sets *loss to the mean of 0.5 * ||y_hat - y||^2 and *r2 to the coefficient
 * of determination 1 - SSE/SST over all outputs pooled (SST around each
 * output's mean over the n samples); *r2 is 0 when SST is 0 or n is 0. Only
 * for regression models. */
void ps_model_evaluate_values(ps_model *m, const float *x, const float *y, size_t n, double *loss, double *r2);

#endif
