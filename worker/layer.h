/* layer.h - the interface every layer and every loss head implements.
 *
 * This header is for code that adds layers (conv2d, maxpool, dropout, ...) or
 * heads (least-squares regression, ...); code that only trains a model needs
 * model.h alone.
 *
 * Data layout. A batch is row-major and contiguous: sample r of a layer's
 * input is in[r * in_size .. (r+1) * in_size), where in_size is the product of
 * the layer's per-sample input shape (c, h, w), itself stored C-major
 * ("CHW", as PyTorch and IDX images are). A dense layer sees the same bytes as
 * a flat vector.
 *
 * Parameters. The model owns ONE flat parameter vector and ONE flat gradient
 * vector. Each layer owns the slice [offset, offset + nparams) of both; the
 * model points l->params and l->grads at that slice (ps_layer_bind) before
 * any call to init, forward or backward. Inside its slice a layer lays out its
 * tensors as described in l->tensors, in order and without gaps; those are
 * the names and shapes the model reports in its ps_layout.
 *
 * Scratch. A layer is created for a maximum batch and allocates at creation
 * every scratch buffer it will need (im2col columns, dropout masks, pooling
 * argmax, ...): forward and backward never allocate.
 *
 * Gradient convention. The head receives a scale (1/batch for a mean) and
 * writes dz = scale * d(sum of per-sample losses)/dz, so each layer's
 * backward just sums over the batch and the grads come out as the mean
 * gradient. backward OVERWRITES the layer's grads (it does not accumulate). */
#ifndef PS_LAYER_H
#define PS_LAYER_H

#include "proto/layout.h"
#include "rng.h"

#include <stddef.h>
#include <stdint.h>

#define PS_LAYER_NAME_MAX 31  /* longest layer name, e.g. "fc1" */
#define PS_LAYER_TENSORS_MAX 4 /* most parameter tensors in one layer */
#define PS_CONV_MAX_K 64       /* largest conv2d kernel side, and pad below it */

/* Per-sample shape; a flat feature vector of n is {n, 1, 1}. */
typedef struct ps_shape {
    int c, h, w;
} ps_shape;

static inline size_t ps_shape_size(ps_shape s)
{
    return (size_t)s.c * (size_t)s.h * (size_t)s.w;
}

static inline ps_shape ps_shape_flat(int n)
{
    ps_shape s = {n, 1, 1};
    return s;
}

/* One named parameter tensor inside a layer's slice. */
typedef struct ps_layer_tensor {
    char name[PS_NAME_MAX + 1]; /* full name, "fc1.weight" */
    uint32_t ndim;              /* 1..PS_DIMS_MAX */
    uint32_t dims[PS_DIMS_MAX]; /* PyTorch order: weight [out, in], bias [out] */
    size_t offset;              /* first element, relative to the layer's slice */
    size_t count;               /* product of dims */
} ps_layer_tensor;

typedef struct ps_layer ps_layer;

/* How a layer with weights draws its initial parameters. fan_in is the
 * inputs one output sums over: in features (dense), in_c*kh*kw (conv). */
typedef enum ps_init {
    PS_INIT_HE = 0, /* weights N(0, 2/fan_in) (PyTorch's kaiming_normal_, relu gain, mode fan_in); biases 0 */
    PS_INIT_TORCH   /* PyTorch's own default for nn.Linear and nn.Conv2d: weights U(-1/sqrt(fan_in),
                     * 1/sqrt(fan_in)) (kaiming_uniform_ with a = sqrt(5)) and biases likewise */
} ps_init;

typedef struct ps_layer_ops {
    const char *kind; /* "dense", "relu", ... */

    /* Sets the layer's parameters to their initial values drawing from rng
     * as l->init says. NULL for layers without parameters. */
    void (*init)(ps_layer *l, ps_rng *rng);

    /* Reseeds the layer's own randomness (dropout masks). NULL for
     * deterministic layers. */
    void (*reseed)(ps_layer *l, uint64_t seed);

    /* out[batch x out_size] := f(in[batch x in_size]). training is 1 during a
     * train step and 0 during evaluation (dropout is the identity then). A
     * layer may keep in its scratch whatever backward needs from this call;
     * backward is always called after the forward of the same batch. */
    void (*forward)(ps_layer *l, const float *in, float *out, int batch, int training);

    /* Given the forward's in and out and dout = dL/dout, writes the layer's
     * grads slice (overwriting it) and, when din is not NULL, din = dL/din.
     * din is NULL for the first layer, whose input gradient nobody needs.
     * in, out, dout and din never alias. */
    void (*backward)(ps_layer *l, const float *in, const float *out, const float *dout, float *din, int batch);

    /* Frees the layer and its scratch (not the params/grads slice). */
    void (*destroy)(ps_layer *l);
} ps_layer_ops;

/* The common part of every layer; concrete layers embed it as their first
 * member and cast. */
struct ps_layer {
    const ps_layer_ops *ops;
    char name[PS_LAYER_NAME_MAX + 1]; /* unique in the model; prefixes tensor names */
    ps_shape in, out;                 /* per-sample shapes */
    int max_batch;                    /* largest batch forward/backward accept */
    ps_init init;                     /* how ops->init draws; PS_INIT_HE unless set */
    size_t nparams;                   /* length of the layer's slice; 0 if none */
    size_t offset;                    /* slice start in the model's flat vectors */
    float *params;                    /* = model params + offset; NULL if nparams == 0 */
    float *grads;                     /* = model grads + offset; NULL if nparams == 0 */
    int ntensors;                     /* entries used in tensors[] */
    ps_layer_tensor tensors[PS_LAYER_TENSORS_MAX];
};

/* Points the layer at its slice of a flat parameter and gradient vector. */
void ps_layer_bind(ps_layer *l, float *params, float *grads);

/* Destroys a layer created by any ps_layer_*_create; NULL-safe. */
void ps_layer_free(ps_layer *l);

/* Fills the common part of a new layer. Used by the constructors. */
void ps_layer_base_init(ps_layer *l, const ps_layer_ops *ops, const char *name, ps_shape in, ps_shape out,
                        int max_batch);

/* Appends a parameter tensor "<layer name>.<suffix>" of the given shape at
 * the end of the layer's slice and grows nparams. Used by the constructors;
 * returns 0 or PS_EINVAL when the tensor does not fit the table or the name
 * is too long. */
int ps_layer_add_tensor(ps_layer *l, const char *suffix, uint32_t ndim, const uint32_t *dims);

/* Fills nw weights w and nb biases b (in that order from rng) as how says,
 * for outputs that sum over fan_in inputs. Used by the init hooks. */
void ps_init_fill(ps_init how, ps_rng *rng, float *w, size_t nw, float *b, size_t nb, int fan_in);

/* Allocates n floats aligned to 64 bytes, zeroed; NULL when out of memory.
 * Release with free(). */
float *ps_falloc(size_t n);

/* Layers available now. Each returns 0 and sets *out, or PS_EINVAL for bad
 * sizes, or PS_ENOMEM. */

/* Fully connected: y = x W^T + b with W [out_features, in_size] row-major
 * (PyTorch's nn.Linear convention) and b [out_features]. Tensors
 * "<name>.weight" then "<name>.bias". Init per l->init with fan_in in_size
 * (by default W He-normal, std sqrt(2/in_size); b zero). */
int ps_layer_dense_create(const char *name, ps_shape in, int out_features, int max_batch, ps_layer **out);

/* Elementwise max(0, x); no parameters; output shape equals input shape. */
int ps_layer_relu_create(const char *name, ps_shape in, int max_batch, ps_layer **out);

/* 2-D convolution (cross-correlation, as PyTorch's nn.Conv2d) of an input of
 * shape (c, h, w) with out_c filters of kh x kw, moving by stride and reading
 * pad zeros beyond each border: output (out_c, (h + 2 pad - kh) / stride + 1,
 * (w + 2 pad - kw) / stride + 1). Tensors "<name>.weight" [out_c, c, kh, kw]
 * then "<name>.bias" [out_c]. Computed per sample as im2col + sgemm; its
 * scratch, allocated here, is one im2col buffer (c*kh*kw x out_h*out_w
 * floats) and a few buffers of the size of one sample's output or of W.
 * Init per l->init with fan_in = c*kh*kw (by default He-normal weights, as
 * PyTorch's kaiming_normal_(mode="fan_in", nonlinearity="relu"), zero
 * biases).
 * PS_EINVAL when the kernel does not fit the padded input, for sizes below 1
 * (pad below 0), or kernel sides or pad beyond PS_CONV_MAX_K. */
int ps_layer_conv2d_create(const char *name, ps_shape in, int out_c, int kh, int kw, int stride, int pad,
                           int max_batch, ps_layer **out);

/* Max pooling over size x size windows with stride size (PyTorch's
 * max_pool2d(x, size)), per channel; a remainder row or column that does not
 * fill a window is dropped. Remembers the position of each window's maximum
 * (the first one on ties) for backward, which routes the gradient there. No
 * parameters. PS_EINVAL when a window does not fit the input. */
int ps_layer_maxpool_create(const char *name, ps_shape in, int size, int max_batch, ps_layer **out);

/* Inverted dropout: while training, each element is zeroed with probability
 * p and the survivors are scaled by 1/(1-p), so evaluation (training 0) is the
 * identity. The mask comes from the layer's own xoshiro256** stream, seeded by
 * seed here and by ops->reseed later; backward reuses the mask of the last
 * forward. 0 <= p < 1; p = 0 is the identity. No parameters. */
int ps_layer_dropout_create(const char *name, ps_shape in, float p, uint64_t seed, int max_batch, ps_layer **out);

/* What a head compares its input with. Classification heads read labels,
 * regression heads read values; a head ignores the other field. */
typedef struct ps_targets {
    const uint8_t *labels; /* batch class indices, each < the head's input size */
    const float *values;   /* batch x in_size targets, row-major, or NULL */
} ps_targets;

typedef struct ps_head ps_head;

typedef struct ps_head_ops {
    const char *kind; /* "softmax-xent", ... */

    /* Reads z [batch x in_size] and returns the SUM over the batch of the
     * per-sample losses. When dz is not NULL, writes
     * dz = scale * d(sum loss)/dz. When correct is not NULL, adds the number of
     * samples the head counts as right (argmax == label for classifiers). */
    double (*loss)(ps_head *h, const float *z, const ps_targets *t, int batch, float scale, float *dz,
                   size_t *correct);

    void (*destroy)(ps_head *h);
} ps_head_ops;

struct ps_head {
    const ps_head_ops *ops;
    ps_shape in;   /* per-sample input shape */
    int max_batch; /* largest batch */
};

/* Destroys a head; NULL-safe. */
void ps_head_free(ps_head *h);

/* Softmax over the in_size logits followed by cross-entropy with the label.
 * Per-sample loss log(sum_j exp z_j) - z_y; gradient softmax(z) - onehot(y).
 * Labels must be < in_size (the data set loader guarantees it). */
int ps_head_softmax_xent_create(ps_shape in, int max_batch, ps_head **out);

/* Least squares for regression. Per-sample loss 0.5 * ||z - y||^2 summed over
 * the in_size outputs (so the model's "loss" is the batch mean of that: half
 * the sum of squared errors per sample, which is 0.5 * MSE for one output);
 * gradient z - y. y is the sample's row of t->values; when t->values is NULL
 * it is the one-hot vector of t->labels (each label < in_size), and then a
 * sample counts as right when argmax z == label, so a least-squares
 * classifier reports an accuracy. With values nothing is counted right. */
int ps_head_lsq_create(ps_shape in, int max_batch, ps_head **out);

#endif
