/* optim.c - server-side optimizers and the learning-rate schedule (see
 * optim.h for the formulas).
 *
 * Each optimizer is a row of the table `kinds` below: the names of its
 * state buffers (and which of them a square root reads), its constants,
 * its loop and the bound of the values its loop makes. Everything else
 * here (allocating, checkpointing, checking the state; the schedule, the
 * clip scale, the trial on copies) is the same for every kind. Adding an
 * optimizer: its value in optim.h's enum ps_optimizer_kind (and its
 * formula in optim.h's comment), its word in srv_optim_words and its row
 * in kinds, with its element body, LOOPS() and functions.
 *
 * One loop per kind, chosen outside it; inside, float arithmetic on
 * restrict pointers and no branch, so gcc vectorises it.
 * gcc's -O2 only vectorises a loop when no scalar iterations are left
 * over (its "very cheap" cost model), so each kind's body is an inline
 * function of one element that RUN() calls in blocks of BLOCK elements,
 * a trip count the vectoriser accepts, and then on the remainder. Check
 * with -fopt-info-vec-optimized: every *_loop function should report
 * "loop vectorized".
 *
 * The adam and adagrad bodies call sqrtf. Unless this file is compiled
 * with -fno-math-errno, gcc guards every sqrtf with a branch to the libm
 * call (to set errno for a negative argument, which never happens here)
 * and those two loops stay scalar; results are the same either way.
 *
 * The clip scale is a factor in every loop (1 when clipping is off), so
 * the caller's gradient is never copied or written. */
#include "server/model/optim.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/vec.h"
#include "proto/errors.h"

#define BLOCK 16 /* elements per vectorised block: 4 SSE or 2 AVX vectors */

static const double pi = 3.14159265358979323846;


double srv_optim_lr(const srv_optim *o, uint64_t version)
{
    uint64_t warm = o->warmup_versions;
    if (version < warm)
        return o->lr * ((double)(version + 1) / (double)warm);
    uint64_t u = version - warm;
    switch (o->lr_schedule) {
    case PS_LR_STEP:
        return o->lr * pow(o->lr_gamma, (double)(u / o->lr_step_size));
    case PS_LR_COSINE: {
        uint64_t d = o->lr_decay_versions;
        double x = (double)(u < d ? u : d) / (double)d;
        return o->lr_min + (o->lr - o->lr_min) * (1.0 + cos(pi * x)) / 2.0;
    }
    default:
        return o->lr;
    }
}

/* ---- the sum of squares ---------------------------------------------------- */

void srv_sumsq_add(srv_sumsq *s, const float *restrict x, size_t n)
{
    size_t i = 0;
    /* up to a multiple of SRV_SUMSQ_LANES of the stream's index */
    for (; i < n && (s->n + i) % SRV_SUMSQ_LANES; i++)
        s->lane[(s->n + i) % SRV_SUMSQ_LANES] += (double)x[i] * x[i];
    double acc[SRV_SUMSQ_LANES];
    memcpy(acc, s->lane, sizeof acc);
    for (; i + SRV_SUMSQ_LANES <= n; i += SRV_SUMSQ_LANES)
        for (size_t j = 0; j < SRV_SUMSQ_LANES; j++)
            acc[j] += (double)x[i + j] * x[i + j];
    for (size_t j = 0; i < n; i++, j++)
        acc[j] += (double)x[i] * x[i];
    memcpy(s->lane, acc, sizeof acc);
    s->n += n;
}

double srv_sumsq_total(const srv_sumsq *s)
{
    double t = 0;
    for (size_t j = 0; j < SRV_SUMSQ_LANES; j++)
        t += s->lane[j];
    return t;
}

double srv_sumsq_of(const float *x, size_t n)
{
    srv_sumsq s = {{0}, 0};
    srv_sumsq_add(&s, x, n);
    return srv_sumsq_total(&s);
}

/* The factor clipping applies to a gradient g whose sum of squares is ss:
 * min(1, clip_norm/(||g||+1e-6)), as torch.nn.utils.clip_grad_norm_; 1
 * when clipping is off. */
static float clip_scale(const srv_optim *o, double ss)
{
    if (!(o->clip_norm > 0))
        return 1.0f;
    double c = o->clip_norm / (sqrt(ss) + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

/* Per-update constants, in float as the loops use them. */
typedef srv_optim_step coef;

/* The loop bodies, one element each, written in PyTorch's order of
 * operations: they read parameter i from wi and write it to wo (the same
 * array for an update in place). Arrays start at the range's offset. */

static inline void sgd_at(float *wo, const float *wi, const float *restrict g, coef c, size_t i)
{
    wo[i] = wi[i] - c.lr * (c.s * g[i] + c.wd * wi[i]);
}

static inline void sgd_momentum_at(float *wo, const float *wi, const float *restrict g, float *restrict v, coef c,
                                   size_t i)
{
    float d = c.s * g[i] + c.wd * wi[i];
    float vi = c.mu * v[i] + d;
    v[i] = vi;
    wo[i] = wi[i] - c.lr * vi;
}

static inline void sgd_nesterov_at(float *wo, const float *wi, const float *restrict g, float *restrict v, coef c,
                                   size_t i)
{
    float d = c.s * g[i] + c.wd * wi[i];
    float vi = c.mu * v[i] + d;
    v[i] = vi;
    wo[i] = wi[i] - c.lr * (d + c.mu * vi);
}

/* adam and adamw: c.wd is 0 for adamw and c.decay 1 for adam, so one body
 * serves both (multiplying by 1 and adding 0 are exact). m moves towards d
 * as torch.lerp does for a weight 1-beta1 below 0.5. */
static inline void adam_at(float *wo, const float *wi, const float *restrict g, float *restrict m,
                           float *restrict v, coef c, size_t i)
{
    float w = wi[i] * c.decay;
    float d = c.s * g[i] + c.wd * w;
    float mi = m[i] + c.c1 * (d - m[i]);
    float vi = c.b2 * v[i] + c.c2 * d * d;
    m[i] = mi;
    v[i] = vi;
    wo[i] = w - c.lr * mi / (sqrtf(vi) / c.bc2s + c.eps);
}

static inline void adagrad_at(float *wo, const float *wi, const float *restrict g, float *restrict sum, coef c,
                              size_t i)
{
    float d = c.s * g[i] + c.wd * wi[i];
    float si = sum[i] + d * d;
    sum[i] = si;
    wo[i] = wi[i] - c.lr * d / (sqrtf(si) + c.eps);
}

/* Calls body(args..., i) for i in [0, len): whole blocks first, through an
 * inner loop of constant trip count BLOCK that the vectoriser takes, then
 * the elements left over. At -O3 gcc would otherwise unroll the inner loop
 * completely before vectorising and leave it scalar (4x slower for SGD):
 * "GCC unroll 1" keeps it a loop. */
#define RUN(len, body, ...)                                                                        \
    do {                                                                                           \
        size_t i_ = 0;                                                                             \
        for (; i_ + BLOCK <= (len); i_ += BLOCK)                                                   \
            _Pragma("GCC unroll 1") for (size_t j_ = i_; j_ < i_ + BLOCK; j_++)                    \
                body(__VA_ARGS__, j_);                                                             \
        for (; i_ < (len); i_++)                                                                   \
            body(__VA_ARGS__, i_);                                                                 \
    } while (0)

/* The loops, two per kind: in place (w read and written) and out of place
 * (wi read, wo written). Their restrict parameters are what tells gcc that
 * the arrays do not overlap; gcc 12 forgets that when it inlines them into
 * srv_optim_run() and then leaves them scalar, hence NOINLINE (one call
 * per update: the call costs nothing). */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* Each loop is also compiled for AVX2 (PS_MULTIVERSION, common/vec.h):
 * twice the vector width, Adam's update about 1.7x faster, same bits. */
#define MULTIVERSION PS_MULTIVERSION

#define UNPAREN(...) __VA_ARGS__
#define LOOPS(kind, params, args)                                                                   \
    NOINLINE MULTIVERSION static void kind##_in(float *restrict w, UNPAREN params)                  \
    {                                                                                               \
        RUN(n, kind##_at, w, w, UNPAREN args);                                                      \
    }                                                                                               \
    NOINLINE MULTIVERSION static void kind##_oop(float *restrict wo, const float *restrict wi,     \
                                                 UNPAREN params)                                \
    {                                                                                               \
        RUN(n, kind##_at, wo, wi, UNPAREN args);                                                    \
    }

LOOPS(sgd, (const float *restrict g, size_t n, coef c), (g, c))
LOOPS(sgd_momentum, (const float *restrict g, float *restrict v, size_t n, coef c), (g, v, c))
LOOPS(sgd_nesterov, (const float *restrict g, float *restrict v, size_t n, coef c), (g, v, c))
LOOPS(adam, (const float *restrict g, float *restrict m, float *restrict v, size_t n, coef c), (g, m, v, c))
LOOPS(adagrad, (const float *restrict g, float *restrict sum, size_t n, coef c), (g, sum, c))

/* kind's loop over wo/wi, in place when they are the same array */
#define LOOP(kind, wo, wi, ...) ((wo) == (wi) ? kind##_in(wo, __VA_ARGS__) : kind##_oop(wo, wi, __VA_ARGS__))

/* ---- the optimizers --------------------------------------------------------- */

/* A kind's loop over [0, len): wo/wi as srv_optim_run's, s[k] the kind's
 * state buffer k at the range's start (NULL when it has none). */
typedef void kind_run(const srv_optim *o, coef c, float *wo, const float *wi, const float *g, size_t len,
                      float *const *s);
/* A kind's constants, set on top of the common ones (c->s, lr, wd, mu,
 * decay 1, eps) from the scheduled rate lr of the update making version + 1. */
typedef void kind_begin(const srv_optim *o, coef *c, double lr, uint64_t version);
/* The largest magnitude any value of the kind's loop can take for
 * gradients within [-gmax, gmax], parameters within [-wmax, wmax] and state
 * buffer k within [-smax[k], smax[k]] (all at most SURE_MAX), in double;
 * INFINITY when it cannot tell. */
typedef double kind_top(const coef *c, double gmax, double wmax, const double *smax);

static void sgd_run(const srv_optim *o, coef c, float *wo, const float *wi, const float *g, size_t len,
                    float *const *s)
{
    if (s[0] && o->momentum > 0 && o->nesterov)
        LOOP(sgd_nesterov, wo, wi, g, s[0], len, c);
    else if (s[0] && o->momentum > 0)
        LOOP(sgd_momentum, wo, wi, g, s[0], len, c);
    else
        LOOP(sgd, wo, wi, g, len, c);
}

/* d = s*g + wd*w; v = mu*v + d; w - lr*v or w - lr*(d + mu*v) */
static double sgd_top(const coef *c, double gmax, double wmax, const double *smax)
{
    double s = fabs((double)c->s), lr = fabs((double)c->lr), wd = fabs((double)c->wd), mu = fabs((double)c->mu);
    double d = s * gmax + wd * wmax, v = mu * smax[0] + d;
    return fmax(v, wmax + lr * (d + mu * v));
}

static void adam_begin(const srv_optim *o, coef *c, double lr, uint64_t version)
{
    double t = (double)version + 1.0;
    c->lr = (float)(lr / (1.0 - pow(o->beta1, t)));
    c->bc2s = (float)sqrt(1.0 - pow(o->beta2, t));
    c->c1 = (float)(1.0 - o->beta1);
    c->b2 = (float)o->beta2;
    c->c2 = (float)(1.0 - o->beta2);
}

/* adam's constants, the weight decay decoupled: w *= 1 - lr*wd first */
static void adamw_begin(const srv_optim *o, coef *c, double lr, uint64_t version)
{
    adam_begin(o, c, lr, version);
    c->decay = (float)(1.0 - lr * o->weight_decay);
    c->wd = 0.0f;
}

static void adam_run(const srv_optim *o, coef c, float *wo, const float *wi, const float *g, size_t len,
                     float *const *s)
{
    (void)o;
    LOOP(adam, wo, wi, g, s[0], s[1], len, c);
}

/* w = w*decay; d = s*g + wd*w; m += c1*(d - m); v = b2*v + c2*d*d;
 * w - lr*m/(sqrt(v)/bc2s + eps), that quotient at most |m|/eps */
static double adam_top(const coef *c, double gmax, double wmax, const double *smax)
{
    double s = fabs((double)c->s), lr = fabs((double)c->lr), wd = fabs((double)c->wd), eps = (double)c->eps;
    if (!(eps > 0) || !(c->bc2s > 0))
        return INFINITY;
    double w = wmax * fabs((double)c->decay), d = s * gmax + wd * w;
    if (d > 1e15)
        return INFINITY; /* d*d */
    double m = smax[0] + fabs((double)c->c1) * (d + smax[0]);
    double v = fabs((double)c->b2) * smax[1] + fabs((double)c->c2) * d * d;
    return fmax(fmax(m, v), fmax(sqrt(v) / (double)c->bc2s, w + lr * m / eps));
}

static void adagrad_run(const srv_optim *o, coef c, float *wo, const float *wi, const float *g, size_t len,
                        float *const *s)
{
    (void)o;
    LOOP(adagrad, wo, wi, g, s[0], len, c);
}

/* d = s*g + wd*w; sum += d*d; w - lr*d/(sqrt(sum) + eps), that quotient
 * below 1 since sum >= d*d (and at most |d|/eps) */
static double adagrad_top(const coef *c, double gmax, double wmax, const double *smax)
{
    double s = fabs((double)c->s), lr = fabs((double)c->lr), wd = fabs((double)c->wd), eps = (double)c->eps;
    if (!(eps > 0))
        return INFINITY;
    double d = s * gmax + wd * wmax;
    if (d > 1e15)
        return INFINITY;
    return fmax(smax[0] + d * d, wmax + lr * fmin(2.0, d / eps));
}

/* What psd knows of an optimizer, one row per enum ps_optimizer_kind value. */
typedef struct optim_kind {
    const char *state[SRV_OPTIM_STATE_MAX]; /* its state buffers' names (checkpoints), in order; NULL: no more */
    unsigned sqrt_reads;                    /* bit k: a square root reads buffer k, which is never negative */
    int lazy;        /* its state exists only once momentum > 0 (PyTorch's sgd makes it on first use) */
    kind_begin *begin; /* NULL: the common constants only */
    kind_run *run;
    kind_top *top;
} optim_kind;

const char *const srv_optim_words[] = {
    [PS_OPTIMIZER_SGD] = "sgd",
    [PS_OPTIMIZER_ADAM] = "adam",
    [PS_OPTIMIZER_ADAMW] = "adamw",
    [PS_OPTIMIZER_ADAGRAD] = "adagrad",
    NULL,
};

static const optim_kind kinds[] = {
    [PS_OPTIMIZER_SGD] = {.state = {"momentum"}, .lazy = 1, .run = sgd_run, .top = sgd_top},
    [PS_OPTIMIZER_ADAM] = {.state = {"exp_avg", "exp_avg_sq"}, .sqrt_reads = 1u << 1, .begin = adam_begin,
                           .run = adam_run, .top = adam_top},
    [PS_OPTIMIZER_ADAMW] = {.state = {"exp_avg", "exp_avg_sq"}, .sqrt_reads = 1u << 1, .begin = adamw_begin,
                            .run = adam_run, .top = adam_top},
    [PS_OPTIMIZER_ADAGRAD] = {.state = {"sum"}, .sqrt_reads = 1u << 0, .run = adagrad_run, .top = adagrad_top},
};

#define NKINDS (sizeof kinds / sizeof kinds[0])
_Static_assert(sizeof srv_optim_words / sizeof srv_optim_words[0] == NKINDS + 1,
               "srv_optim_words and kinds must have a line per optimizer, in the same order");

/* ---- what every kind shares -------------------------------------------------- */

static int kind_known(int kind)
{
    return kind >= 0 && (size_t)kind < NKINDS && kinds[kind].run;
}

/* o's row; o was initialised (its kind is known). */
static const optim_kind *kind_of(const srv_optim *o)
{
    assert(kind_known(o->kind));
    return &kinds[o->kind];
}

/* The count of state buffers kind k keeps when it keeps any. */
static size_t kind_nstate(const optim_kind *k)
{
    size_t n = 0;
    while (n < SRV_OPTIM_STATE_MAX && k->state[n])
        n++;
    return n;
}

const char *srv_optim_kind_name(int kind)
{
    return kind_known(kind) ? srv_optim_words[kind] : "unknown";
}

const char *srv_optim_name(const srv_optim *o)
{
    return srv_optim_kind_name(o->kind);
}

/* Allocates o's state buffers that are not yet there, zeroed: 0, or -1
 * with none of them allocated by this call left. */
static int state_alloc(srv_optim *o)
{
    size_t ns = kind_nstate(kind_of(o));
    float *made[SRV_OPTIM_STATE_MAX] = {NULL};
    for (size_t k = 0; k < ns; k++) {
        if (o->state[k])
            continue;
        made[k] = calloc(o->n ? o->n : 1, sizeof(float));
        if (!made[k]) {
            for (size_t j = 0; j < k; j++)
                free(made[j]);
            return -1;
        }
    }
    for (size_t k = 0; k < ns; k++)
        if (made[k])
            o->state[k] = made[k];
    return 0;
}

int srv_optim_init(srv_optim *o, const ps_config *cfg, size_t n)
{
    memset(o, 0, sizeof *o);
    if (!kind_known(cfg->optimizer))
        return PS_EINVAL;
    o->kind = cfg->optimizer;
    o->n = n;
    o->nesterov = cfg->nesterov;
    o->beta1 = cfg->beta1;
    o->beta2 = cfg->beta2;
    o->eps = cfg->eps;
    if ((!kinds[o->kind].lazy || cfg->momentum > 0) && state_alloc(o) != 0) {
        memset(o, 0, sizeof *o);
        return PS_ENOMEM;
    }
    srv_optim_configure(o, cfg);
    return 0;
}

void srv_optim_free(srv_optim *o)
{
    for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++) {
        free(o->state[k]);
        o->state[k] = NULL;
    }
}

void srv_optim_configure(srv_optim *o, const ps_config *cfg)
{
    assert(cfg->lr_step_size >= 1 && cfg->lr_decay_versions >= 1); /* config.c's bounds */
    o->lr = cfg->lr;
    o->momentum = cfg->momentum;
    o->weight_decay = cfg->weight_decay;
    o->clip_norm = cfg->clip_norm;
    o->lr_schedule = cfg->lr_schedule;
    o->lr_step_size = cfg->lr_step_size;
    o->lr_gamma = cfg->lr_gamma;
    o->lr_decay_versions = cfg->lr_decay_versions;
    o->lr_min = cfg->lr_min;
    o->warmup_versions = cfg->warmup_versions;
    if (cfg->local_steps > 0 || cfg->elastic_alpha > 0) {
        /* local SGD, elastic averaging: the workers push model differences,
         * applied as they are (w - d: sgd at lr 1, nothing else; settings.c
         * refuses another optimizer or momentum) */
        o->lr = 1;
        o->momentum = 0;
        o->weight_decay = 0;
        o->clip_norm = 0;
        o->lr_schedule = PS_LR_CONSTANT;
        o->warmup_versions = 0;
    }
    if (kind_of(o)->lazy && o->momentum > 0 && !o->state[0] && state_alloc(o) != 0)
        PS_LOG(PS_LOG_WARN, "out of memory for the momentum buffer (%zu parameters); "
                            "sgd goes on without momentum", o->n);
}

int srv_optim_settings_differ(const ps_config *a, const ps_config *b)
{
    return a->lr != b->lr || a->momentum != b->momentum || a->weight_decay != b->weight_decay ||
           a->clip_norm != b->clip_norm || a->lr_schedule != b->lr_schedule || a->lr_step_size != b->lr_step_size ||
           a->lr_gamma != b->lr_gamma || a->lr_decay_versions != b->lr_decay_versions || a->lr_min != b->lr_min ||
           a->warmup_versions != b->warmup_versions;
}


/* The settings' bytes: u32 kind, u32 nesterov, f64 beta1, beta2, eps, lr,
 * momentum, weight_decay, clip_norm, u32 lr_schedule, u32 zero, u64
 * lr_step_size, f64 lr_gamma, u64 lr_decay_versions, f64 lr_min, u64
 * warmup_versions: 112 bytes (SRV_OPTIM_SETTINGS_BYTES). */
static void put32(unsigned char **b, uint32_t v) { memcpy(*b, &v, 4), *b += 4; }
static void put64(unsigned char **b, uint64_t v) { memcpy(*b, &v, 8), *b += 8; }
static void putd(unsigned char **b, double v) { memcpy(*b, &v, 8), *b += 8; }
static uint32_t get32(const unsigned char **b) { uint32_t v; memcpy(&v, *b, 4), *b += 4; return v; }
static uint64_t get64(const unsigned char **b) { uint64_t v; memcpy(&v, *b, 8), *b += 8; return v; }
static double getd(const unsigned char **b) { double v; memcpy(&v, *b, 8), *b += 8; return v; }

void srv_optim_settings_pack(const srv_optim *o, unsigned char *b)
{
    put32(&b, (uint32_t)o->kind), put32(&b, (uint32_t)o->nesterov);
    putd(&b, o->beta1), putd(&b, o->beta2), putd(&b, o->eps), putd(&b, o->lr), putd(&b, o->momentum);
    putd(&b, o->weight_decay), putd(&b, o->clip_norm);
    put32(&b, (uint32_t)o->lr_schedule), put32(&b, 0);
    put64(&b, o->lr_step_size), putd(&b, o->lr_gamma), put64(&b, o->lr_decay_versions), putd(&b, o->lr_min);
    put64(&b, o->warmup_versions);
}

int srv_optim_settings_take(srv_optim *o, const unsigned char *b)
{
    srv_optim t = *o;
    if (get32(&b) != (uint32_t)o->kind)
        return -1;
    t.nesterov = (int)get32(&b);
    t.beta1 = getd(&b), t.beta2 = getd(&b), t.eps = getd(&b), t.lr = getd(&b), t.momentum = getd(&b);
    t.weight_decay = getd(&b), t.clip_norm = getd(&b);
    t.lr_schedule = (int)get32(&b);
    (void)get32(&b);
    t.lr_step_size = get64(&b), t.lr_gamma = getd(&b), t.lr_decay_versions = get64(&b), t.lr_min = getd(&b);
    t.warmup_versions = get64(&b);
    if (t.nesterov < 0 || t.nesterov > 1 || t.lr_step_size < 1 || t.lr_decay_versions < 1 ||
        t.lr_schedule < 0 || t.lr_schedule > PS_LR_COSINE || !(t.lr == t.lr) || !(t.momentum == t.momentum))
        return -1;
    if (kind_of(&t)->lazy && t.momentum > 0 && !t.state[0] && state_alloc(&t) != 0)
        return -1;
    *o = t;
    return 0;
}

size_t srv_optim_state_bytes(const srv_optim *o)
{
    size_t bufs = 0;
    for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++)
        bufs += o->state[k] != NULL;
    return bufs * o->n * sizeof(float);
}

int srv_optim_state_valid(const srv_optim *o)
{
    if (!kind_known(o->kind))
        return 0;
    const optim_kind *K = &kinds[o->kind];
    size_t ns = kind_nstate(K), have = 0;
    for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++) {
        const float *b = o->state[k];
        if (!b)
            continue;
        if (k >= ns)
            return 0; /* a buffer the kind does not keep */
        have++;
        if (K->sqrt_reads >> k & 1) {
            for (size_t i = 0; i < o->n; i++)
                if (!(b[i] >= 0 && b[i] <= FLT_MAX))
                    return 0;
        } else if (!ps_vec_all_finite(b, o->n)) {
            return 0;
        }
    }
    return have == ns || (K->lazy && have == 0);
}

size_t srv_optim_state_buffers(srv_optim *o, float **bufs, const char **names, size_t max)
{
    const optim_kind *K = kind_of(o);
    size_t n = 0;
    for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++) {
        if (!o->state[k])
            continue;
        if (n < max) {
            if (bufs)
                bufs[n] = o->state[k];
            if (names)
                names[n] = K->state[k];
        }
        n++;
    }
    return n;
}

void srv_optim_begin(const srv_optim *o, srv_optim_step *st, const float *g, uint64_t n, uint64_t version)
{
    srv_optim_begin_sumsq(o, st, o->clip_norm > 0 ? srv_sumsq_of(g, (size_t)n) : 0.0, version);
}

void srv_optim_begin_sumsq(const srv_optim *o, srv_optim_step *st, double ss, uint64_t version)
{
    const optim_kind *K = kind_of(o);
    double lr = srv_optim_lr(o, version);
    coef c = {.s = clip_scale(o, ss), .lr = (float)lr, .wd = (float)o->weight_decay,
              .mu = (float)o->momentum, .decay = 1.0f, .eps = (float)o->eps};
    if (K->begin)
        K->begin(o, &c, lr, version);
    *st = c;
}

/* o's state buffers from parameter off on (NULL where it has none). */
static void state_at(const srv_optim *o, uint64_t off, float **s)
{
    for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++)
        s[k] = o->state[k] ? o->state[k] + off : NULL;
}

void srv_optim_run(srv_optim *o, const srv_optim_step *st, float *wo, const float *wi, const float *g,
                   uint64_t off, uint64_t n)
{
    assert(off <= o->n && n <= o->n - off);
    float *s[SRV_OPTIM_STATE_MAX];
    state_at(o, off, s);
    kind_of(o)->run(o, *st, wo, wi, g, (size_t)n, s);
}

/* floats srv_optim_finite() works on at a time, on its stack */
#define TRIAL_PIECE 1024

int srv_optim_finite(const srv_optim *o, const srv_optim_step *st, const float *wi, const float *g, uint64_t off,
                     uint64_t n)
{
    assert(off <= o->n && n <= o->n - off);
    const optim_kind *K = kind_of(o);
    float tw[TRIAL_PIECE], t[SRV_OPTIM_STATE_MAX][TRIAL_PIECE];
    float *s[SRV_OPTIM_STATE_MAX], *ts[SRV_OPTIM_STATE_MAX];
    state_at(o, off, s);
    for (uint64_t x = 0; x < n;) {
        size_t l = n - x < TRIAL_PIECE ? (size_t)(n - x) : TRIAL_PIECE;
        for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++) {
            ts[k] = s[k] ? t[k] : NULL;
            if (s[k])
                memcpy(t[k], s[k] + x, l * sizeof(float));
        }
        /* the same loop the update runs, writing to the copies */
        K->run(o, *st, tw, wi + x, g + x, l, ts);
        if (!ps_vec_all_finite(tw, l))
            return 0;
        for (size_t k = 0; k < SRV_OPTIM_STATE_MAX; k++)
            if (ts[k] && !ps_vec_all_finite(ts[k], l))
                return 0;
        x += l;
    }
    return 1;
}

/* What srv_optim_surely_finite() lets magnitudes reach: 8 orders of
 * magnitude below FLT_MAX (3.4e38), far more than float rounding of a few
 * operations can add. */
#define SURE_MAX 1e30

int srv_optim_surely_finite(const srv_optim *o, const srv_optim_step *c, double gmax, double wmax, double s1max,
                            double s2max)
{
    if (!(gmax >= 0 && gmax <= SURE_MAX && wmax >= 0 && wmax <= SURE_MAX && s1max >= 0 && s1max <= SURE_MAX &&
          s2max >= 0 && s2max <= SURE_MAX))
        return 0;
    if (!kind_known(o->kind))
        return 0;
    const double smax[SRV_OPTIM_STATE_MAX] = {s1max, s2max};
    double top = kinds[o->kind].top(c, gmax, wmax, smax); /* the largest magnitude of any value the loop makes */
    return top * 1.01 < SURE_MAX;
}

/* x[0..n) made finite: NaN 0, +-inf +-FLT_MAX; the count changed. */
static size_t make_finite(float *x, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            x[i] = isnan(x[i]) ? 0.0f : x[i] > 0 ? FLT_MAX : -FLT_MAX;
            k++;
        }
    return k;
}

size_t srv_optim_make_finite(srv_optim *o, float *w, uint64_t off, uint64_t n)
{
    assert(off <= o->n && n <= o->n - off);
    float *s[SRV_OPTIM_STATE_MAX];
    state_at(o, off, s);
    size_t k = make_finite(w, (size_t)n);
    for (size_t j = 0; j < SRV_OPTIM_STATE_MAX; j++)
        if (s[j])
            k += make_finite(s[j], (size_t)n);
    return k;
}

void srv_optim_apply(srv_optim *o, float *w, const float *g, uint64_t off, uint64_t n, uint64_t version)
{
    srv_optim_step st;
    srv_optim_begin(o, &st, g, n, version);
    srv_optim_run(o, &st, w + off, w + off, g, off, n);
}
