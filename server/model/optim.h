/* optim.h - the server-side optimizer: turns a (range, mean gradient) into
 * an update of the parameters, keeping its own state (momentum, moments)
 * for every parameter. It knows nothing of modes, rounds or sockets; the
 * learning-rate schedule reads the model version it is given.
 *
 * Every optimizer is one row of the table in optim.c (its state buffers'
 * names and which of them a square root reads, its constants, its loop and
 * the bound of its values), its word in srv_optim_words beside it, and one
 * value of enum ps_optimizer_kind below; the configuration, the status,
 * the checkpoints and the update engine read them through the functions of
 * this header.
 *
 * The four optimizers follow PyTorch's torch.optim formulas (dampening 0,
 * no amsgrad, no maximize), so a run moved from PyTorch gets the same
 * numbers up to float rounding. With d = s*g + wd*w, where s is the clip
 * scale below and lr the scheduled rate at the update's version:
 *
 *   sgd       v = mu*v + d;  w -= lr*v            (momentum mu > 0)
 *             w -= lr*(d + mu*v)                  (nesterov, after v's update)
 *             w -= lr*d                           (mu == 0)
 *   adam      m += (1-b1)*(d - m);  v = b2*v + (1-b2)*d*d
 *             w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 *   adamw     as adam with d = s*g, after w *= 1 - lr*wd (decoupled decay)
 *   adagrad   sum += d*d;  w -= lr * d / (sqrt(sum) + eps)
 *
 * Adam's bias-correction step is t = version + 1, the version the update
 * will make. Every chunk of one chunked push is applied with the same
 * version, so all chunks of one step share t. t counts model versions,
 * not updates of each range: for pushes of the whole model (the usual
 * case) the two are the same; a range that is pushed less often than the
 * model advances is corrected as if it had been updated at every version.
 *
 * Clipping (clip_norm > 0) scales the gradient by
 * min(1, clip_norm / (||g|| + 1e-6)), which is PyTorch's
 * clip_grad_norm_. ||g|| is the norm of the gradient passed to one
 * srv_optim_apply() call: one call per push chunk, so a push split into
 * chunks is clipped chunk by chunk. Pushes of models under 1M parameters
 * are a single chunk and are clipped as a whole.
 *
 * State buffers hold n floats each, zeroed when allocated (PyTorch's
 * initial values: momentum buffer created on first use, moments 0, AdaGrad
 * accumulator 0). */
#ifndef SRV_OPTIM_H
#define SRV_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "server/config/config.h"

/* Values of ps_config.optimizer: the index of the optimizer's row in
 * optim.c's table and of its word in srv_optim_words. */
enum ps_optimizer_kind {
    PS_OPTIMIZER_SGD = 0,
    PS_OPTIMIZER_ADAM = 1,
    PS_OPTIMIZER_ADAMW = 2,
    PS_OPTIMIZER_ADAGRAD = 3,
};

/* The optimizers' names as the configuration takes them, by kind; NULL
 * ends the list (the optimizer option's words). */
extern const char *const srv_optim_words[];

/* Most state buffers an optimizer keeps. */
#define SRV_OPTIM_STATE_MAX 2

typedef struct srv_optim {
    int kind;                   /* enum ps_optimizer_kind; fixed at init */
    size_t n;                   /* parameters */
    /* Settings fixed at init (not reloadable). */
    int nesterov;               /* sgd: Nesterov momentum */
    double beta1, beta2;        /* adam, adamw: moment decay rates */
    double eps;                 /* adam, adamw, adagrad: denominator term */
    /* Run-time settings, taken again by srv_optim_configure(). */
    double lr;                  /* base learning rate (before the schedule) */
    double momentum;            /* sgd momentum; 0 = off */
    double weight_decay;        /* L2 (sgd, adam, adagrad) or decoupled (adamw) */
    double clip_norm;           /* gradient norm limit per call; 0 = off */
    int lr_schedule;            /* enum ps_lr_schedule */
    uint64_t lr_step_size;      /* step: versions between decays (>= 1) */
    double lr_gamma;            /* step: factor per decay */
    uint64_t lr_decay_versions; /* cosine: versions from lr to lr_min (>= 1) */
    double lr_min;              /* cosine: floor */
    uint64_t warmup_versions;   /* linear warm-up; 0 = off */
    /* State, n floats each, in the order of srv_optim_state_buffers(); NULL
     * when the kind (or setting) needs none. The names below are the
     * kinds' for the same slots (velocity, exp_avg and sum are all
     * state[0]): read those of o's kind only. */
    union {
        float *state[SRV_OPTIM_STATE_MAX];
        struct {
            float *velocity;    /* sgd: momentum buffer, allocated once momentum > 0 */
        };
        struct {
            float *exp_avg;     /* adam, adamw: first moment m */
            float *exp_avg_sq;  /* adam, adamw: second moment v */
        };
        struct {
            float *sum;         /* adagrad: sum of squared gradients */
        };
    };
} srv_optim;

/* Sets o up for n parameters with cfg's optimizer settings, allocating the
 * state the kind needs (zeroed): sgd a momentum buffer iff momentum > 0,
 * adam and adamw two moment buffers, adagrad one accumulator. Returns 0,
 * PS_ENOMEM, or PS_EINVAL for an unknown cfg->optimizer; on error o is
 * empty and srv_optim_free() on it is harmless. */
int srv_optim_init(srv_optim *o, const ps_config *cfg, size_t n);

/* Frees the state; o may then be initialised again. */
void srv_optim_free(srv_optim *o);

/* Takes the run-time settings (lr, momentum, weight_decay, clip_norm and
 * the schedule: lr_schedule, lr_step_size, lr_gamma, lr_decay_versions,
 * lr_min, warmup_versions) from cfg, as on a SIGHUP reload. The kind, the
 * other settings and all state stay. An sgd optimizer that had no momentum
 * and is given some allocates its (zeroed) momentum buffer here, as
 * PyTorch creates it on first use; if that allocation fails it logs a
 * warning and goes on without momentum. */
void srv_optim_configure(srv_optim *o, const ps_config *cfg);

/* 1 when a and b differ in a setting srv_optim_configure() reads (the
 * rate, its schedule, momentum, weight decay, clipping), else 0. */
int srv_optim_settings_differ(const ps_config *a, const ps_config *b);

/* Every setting an update reads, as one replication record carries them
 * (PROTOCOL.md 17, `G`): srv_optim_settings_pack writes them into
 * SRV_OPTIM_SETTINGS_BYTES bytes (little-endian), srv_optim_settings_take
 * sets o's from such bytes, so that a follower replays its leader's
 * updates with its leader's settings whatever its own configuration says.
 * Take returns 0, or -1 when the bytes name another optimizer kind or a
 * value out of range (o unchanged); an sgd optimizer given momentum
 * allocates its buffer as srv_optim_configure does (-1 when it cannot). */
#define SRV_OPTIM_SETTINGS_BYTES 112
void srv_optim_settings_pack(const srv_optim *o, unsigned char *b);
int srv_optim_settings_take(srv_optim *o, const unsigned char *b);

/* Bytes of optimizer state (for status and memory accounting). */
size_t srv_optim_state_bytes(const srv_optim *o);

/* The state buffers, for checkpoints: stores up to max of them in bufs[]
 * and their names in names[] ("momentum", "exp_avg", "exp_avg_sq", "sum";
 * static strings) and returns how many o holds (0..2), which may be more
 * than max (at most SRV_OPTIM_STATE_MAX). Each buffer holds o->n floats;
 * it may be read, or overwritten to restore a checkpoint, between
 * srv_optim_apply() calls. bufs and names may be NULL when max is 0. The
 * order is fixed per kind. */
size_t srv_optim_state_buffers(srv_optim *o, float **bufs, const char **names, size_t max);

/* The optimizer's name as in the configuration: "sgd", "adam", "adamw" or
 * "adagrad". srv_optim_kind_name() gives the same for an
 * enum ps_optimizer_kind value ("unknown" when out of range). */
const char *srv_optim_name(const srv_optim *o);
/* 1 when o's state is one an update may start from: the kind is known; o
 * holds every state buffer of its kind and no other (sgd: its momentum
 * buffer, or none while it has had no momentum); each of their o->n values
 * is finite, and those a square root reads (adam's and adamw's second
 * moment, adagrad's sum) are not negative (-0 is not). Else 0. The
 * optimizer's own invariant: the update engine asks for it when it
 * measures the state's bounds after values came from outside (a
 * checkpoint), and state received from elsewhere may be checked with it. */
int srv_optim_state_valid(const srv_optim *o);
const char *srv_optim_kind_name(int kind);

/* The learning rate of the update that follows model version `version`:
 * during warm-up (version < warmup_versions) lr*(version+1)/warmup_versions,
 * then, with u = version - warmup_versions,
 *   constant  lr
 *   step      lr * lr_gamma^floor(u / lr_step_size)
 *   cosine    lr_min + (lr - lr_min) * (1 + cos(pi * min(u, D) / D)) / 2
 *             with D = lr_decay_versions (lr_min from u = D on).
 * A pure function of o's settings and version. */
double srv_optim_lr(const srv_optim *o, uint64_t version);

/* Applies the mean gradient g[0..n) to w[off..off+n) (and the same range of
 * the state) as the update that will become model version `version + 1`.
 * g is only read (it may point into a receive buffer) and must not overlap
 * w or the state. off + n must not exceed the n given to init. */
void srv_optim_apply(srv_optim *o, float *w, const float *g, uint64_t off, uint64_t n, uint64_t version);

/* The same update in pieces, for parameters that are not one array (psd
 * keeps them in blocks, see server/model.c): srv_optim_begin() fixes the
 * update's constants (rate, clip factor over all of g[0..n)), then
 * srv_optim_run() applies pieces of it. srv_optim_apply() is begin plus one
 * run. */
typedef struct srv_optim_step {
    float s;       /* clip scale */
    float lr;      /* scheduled rate (adam: lr / bias correction 1) */
    float wd;      /* coupled weight decay (0 for adamw) */
    float mu;      /* sgd momentum */
    float c1;      /* adam: 1 - beta1 */
    float b2, c2;  /* adam: beta2, 1 - beta2 */
    float bc2s;    /* adam: sqrt(1 - beta2^t) */
    float decay;   /* adamw: 1 - lr*wd */
    float eps;
} srv_optim_step;

void srv_optim_begin(const srv_optim *o, srv_optim_step *st, const float *g, uint64_t n, uint64_t version);
/* As srv_optim_begin, given the gradient's sum of squares (clipping) rather
 * than the gradient. */
void srv_optim_begin_sumsq(const srv_optim *o, srv_optim_step *st, double sumsq, uint64_t version);
/* Applies g[0..n) to parameters [off, off+n): reads them from wi and writes
 * the new values to wo. wi == wo updates in place; otherwise the two must
 * not overlap (psd writes a fresh copy of a block that a reply still
 * sends, without copying it first). wi and wo point at parameter off. */
void srv_optim_run(srv_optim *o, const srv_optim_step *st, float *wo, const float *wi, const float *g,
                   uint64_t off, uint64_t n);

/* 1 when applying g[0..n) to parameters [off, off+n) (read from wi) would
 * leave every parameter and every value of the optimizer's state finite,
 * else 0: the same loop as srv_optim_run() on copies of the state, so the
 * answer holds bit for bit. Writes nothing. */
int srv_optim_finite(const srv_optim *o, const srv_optim_step *st, const float *wi, const float *g, uint64_t off,
                     uint64_t n);

/* 1 when applying st with any gradient of values within [-gmax, gmax] to
 * parameters within [-wmax, wmax] and state buffers (as
 * srv_optim_state_buffers orders them) within [-s1max, s1max] and
 * [-s2max, s2max] surely leaves every result finite: bounds of every
 * intermediate value of the kind's formula, taken in double with room for
 * float rounding, stay far below FLT_MAX. 0 when it cannot tell (huge
 * magnitudes, eps 0, whose 0/0 is NaN): then ask srv_optim_finite(). A
 * few operations, no pass over memory. */
int srv_optim_surely_finite(const srv_optim *o, const srv_optim_step *st, double gmax, double wmax, double s1max,
                            double s2max);
/* After an update that srv_optim_finite() found would not be finite, under
 * nonfinite = clip: makes w[0..n) (parameters off..off+n) and the same
 * range of the state finite again, NaN becoming 0 and +-inf +-FLT_MAX.
 * Returns the count of values changed. */
size_t srv_optim_make_finite(srv_optim *o, float *w, uint64_t off, uint64_t n);

/* The one sum of squares psd takes (a push's norm for clipping, a BSP
 * round's mean, a sanitised push): in double, value k of the stream added
 * to partial sum k mod SRV_SUMSQ_LANES (in the order the values come),
 * the partial sums then added in order 0, 1, ..., 15. So the result does
 * not depend on the pieces the values come in (a round's mean is made
 * piece by piece) nor on the instruction set, and the loop vectorises. */
#define SRV_SUMSQ_LANES 16
typedef struct srv_sumsq {
    double lane[SRV_SUMSQ_LANES];
    size_t n; /* values added so far */
} srv_sumsq;
void srv_sumsq_add(srv_sumsq *s, const float *x, size_t n);
double srv_sumsq_total(const srv_sumsq *s);
/* The sum of squares of x[0..n) alone. */
double srv_sumsq_of(const float *x, size_t n);

#endif
