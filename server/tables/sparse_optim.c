/* sparse_optim.c - one optimizer step on one table row (see sparse_optim.h,
 * PROTOCOL.md 13.4). */
#include "server/tables/sparse_optim.h"

#include <math.h>
#include <string.h>

#include "proto/vec.h"

uint32_t srv_sparse_row_floats(const ps_table_def *d)
{
    return d->dim * (1 + ps_topt_state_per_value(d->opt)) + (ps_topt_has_step(d->opt) ? 1 : 0);
}

uint32_t srv_sparse_row_step(const ps_table_def *d, const float *row)
{
    if (!ps_topt_has_step(d->opt))
        return 0;
    uint32_t t;
    memcpy(&t, row + d->dim * 3, sizeof t);
    return t;
}

void srv_sparse_row_new(const ps_table_def *d, uint64_t key, float *row)
{
    uint32_t dim = d->dim, nf = srv_sparse_row_floats(d);
    if (d->opt == PS_TOPT_FTRL)
        memset(row, 0, sizeof(float) * dim);
    else
        ps_table_row_init(d, key, row);
    memset(row + dim, 0, sizeof(float) * (nf - dim)); /* state and step: all bits 0 */
    if (d->opt == PS_TOPT_ADAGRAD)
        for (uint32_t j = 0; j < dim; j++)
            row[dim + j] = (float)d->hp[PS_HP_IACC];
}

/* A row is stepped through locals: every new value is computed from the
 * row and the gradient into out (at most CHUNK values of each of the
 * row's parts), checked, and only then written into the row, so that a
 * step whose result is not finite leaves the row as it was. A row longer
 * than CHUNK is computed twice, chunk by chunk: once to check, once to
 * write. */
#define CHUNK 128u

/* bad[j] set (all bits) when v[j] is a NaN or an infinity, for j < n:
 * each value's own flag, so that the compiler keeps them in vectors. */
static inline __attribute__((always_inline)) void flag_bad(uint32_t *restrict bad, const float *restrict v,
                                                            uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, &v[j], sizeof b);
        bad[j] |= 0u - (uint32_t)((b & 0x7f800000u) == 0x7f800000u); /* all ones: the compare's own mask */
    }
}

/* 1 when the n values hold no NaN and no infinity: the exponent bits of
 * each, ORed without branches, so that the compiler vectorises it. */
static inline int finite_all(const float *restrict v, uint32_t n)
{
    uint32_t bad = 0;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t b;
        memcpy(&b, &v[j], sizeof b);
        bad |= (b & 0x7f800000u) == 0x7f800000u;
    }
    return !bad;
}

/* What one step reads besides the row and the gradient. */
typedef struct step_hp {
    double lr, scale, eps, b1, b2, beta, l1, l2, step; /* step: adam's lr at the row's next step */
    float flr, fscale, feps; /* AdaGrad's, in float32: converted once, not at every row */
} step_hp;

static step_hp hp_of(const ps_table_def *d, double scale)
{
    double lr = d->hp[PS_HP_LR], eps = d->hp[PS_HP_EPS];
    return (step_hp){
        .lr = lr, .scale = scale, .eps = eps, .flr = (float)lr, .fscale = (float)scale, .feps = (float)eps};
}

/* The kernels: the new values of the row's values off..off+len-1 (of dim)
 * into out, weights at out[0..len), the state parts after them at out[len],
 * out[2 len]. row and g are read, never written. Each is inlined into its
 * callers with len a constant where one is known, so that the compiler
 * unrolls and vectorises it; they compute exactly as the scalar formulas. */
static inline __attribute__((always_inline)) void k_sgd(const step_hp *h, const float *restrict row,
                                                         const float *restrict g, uint32_t dim, uint32_t off,
                                                         uint32_t len, float *restrict out)
{
    (void)dim;
    const double lr = h->lr, scale = h->scale;
    const float *restrict w = row + off;
    g += off;
    for (uint32_t j = 0; j < len; j++)
        out[j] = (float)((double)w[j] - lr * (scale * g[j]));
}

/* AdaGrad in float32, as PyTorch's sparse Adagrad computes it (a += g^2;
 * w += -lr (g / (sqrt(a) + eps))): its square root and division in double
 * took most of a push's time. */
static inline __attribute__((always_inline)) void k_adagrad(const step_hp *h, const float *restrict row,
                                                             const float *restrict g, uint32_t dim, uint32_t off,
                                                             uint32_t len, float *restrict out)
{
    const float lr = h->flr, scale = h->fscale, eps = h->feps;
    const float *restrict w = row + off, *restrict a = row + dim + off;
    g += off;
    float *restrict nw = out, *restrict na = out + len;
    for (uint32_t j = 0; j < len; j++) {
        float gj = scale * g[j];
        float aj = a[j] + gj * gj;
        na[j] = aj;
        nw[j] = w[j] - lr * (gj / (sqrtf(aj) + eps));
    }
}

static inline __attribute__((always_inline)) void k_adam(const step_hp *h, const float *restrict row,
                                                          const float *restrict g, uint32_t dim, uint32_t off,
                                                          uint32_t len, float *restrict out)
{
    const double scale = h->scale, b1 = h->b1, b2 = h->b2, eps = h->eps, step = h->step;
    const float *restrict w = row + off, *restrict m = row + dim + off, *restrict v = row + 2 * dim + off;
    g += off;
    float *restrict nw = out, *restrict nm = out + len, *restrict nv = out + 2 * len;
    for (uint32_t j = 0; j < len; j++) {
        double gj = scale * g[j];
        float mj = (float)(b1 * m[j] + (1.0 - b1) * gj);
        float vj = (float)(b2 * v[j] + (1.0 - b2) * gj * gj);
        nm[j] = mj;
        nv[j] = vj;
        nw[j] = (float)((double)w[j] - step * (double)mj / (sqrt((double)vj) + eps));
    }
}

static inline __attribute__((always_inline)) void k_ftrl(const step_hp *h, const float *restrict row,
                                                          const float *restrict g, uint32_t dim, uint32_t off,
                                                          uint32_t len, float *restrict out)
{
    const double lr = h->lr, scale = h->scale, beta = h->beta, l1 = h->l1, l2 = h->l2;
    const float *restrict w = row + off, *restrict z = row + dim + off, *restrict n = row + 2 * dim + off;
    g += off;
    float *restrict nw = out, *restrict nz = out + len, *restrict nn = out + 2 * len;
    for (uint32_t j = 0; j < len; j++) {
        double gj = scale * g[j], nj = n[j];
        double sigma = (sqrt(nj + gj * gj) - sqrt(nj)) / lr;
        double zj = (double)z[j] + gj - sigma * (double)w[j];
        nj += gj * gj;
        float zf = (float)zj, nf = (float)nj;
        nz[j] = zf;
        nn[j] = nf;
        if (fabs(zj) <= l1)
            nw[j] = 0.0f;
        else
            nw[j] = (float)(-(zj - copysign(l1, zj)) / ((beta + sqrt((double)nf)) / lr + l2));
    }
}

/* Writes the parts of out (the kernel's len values of each of `parts`)
 * into the row at off. */
static inline __attribute__((always_inline)) void commit(float *restrict row, const float *restrict out,
                                                          uint32_t dim, uint32_t off, uint32_t len, uint32_t parts)
{
    for (uint32_t p = 0; p < parts; p++)
        for (uint32_t j = 0; j < len; j++) /* not memcpy: its copy of 64 bytes went through 8-byte registers */
            row[(size_t)p * dim + off + j] = out[(size_t)p * len + j];
}

/* One optimizer's step of a row of any dim, through the locals: check all,
 * then write. */
#define STEP_ANY(kernel, parts)                                                                                  \
    do {                                                                                                         \
        float out[(parts) * CHUNK];                                                                              \
        if (dim <= CHUNK) {                                                                                      \
            kernel(h, row, g, dim, 0, dim, out);                                                                 \
            if (!finite_all(out, (parts) * dim))                                                                 \
                return 0;                                                                                        \
            commit(row, out, dim, 0, dim, (parts));                                                              \
            return 1;                                                                                            \
        }                                                                                                        \
        for (uint32_t off = 0; off < dim; off += CHUNK) {                                                        \
            uint32_t len = dim - off < CHUNK ? dim - off : CHUNK;                                                \
            kernel(h, row, g, dim, off, len, out);                                                               \
            if (!finite_all(out, (parts) * len))                                                                 \
                return 0;                                                                                        \
        }                                                                                                        \
        for (uint32_t off = 0; off < dim; off += CHUNK) {                                                        \
            uint32_t len = dim - off < CHUNK ? dim - off : CHUNK;                                                \
            kernel(h, row, g, dim, off, len, out);                                                               \
            commit(row, out, dim, off, len, (parts));                                                            \
        }                                                                                                        \
        return 1;                                                                                                \
    } while (0)

/* SGD's and AdaGrad's step of one row of a dim without a case of its own
 * in STEP_ROWS_DIMS (a row at a time goes through rows_sgd and
 * rows_adagrad too, with n = 1). */
PS_MULTIVERSION static int step_sgd(const step_hp *h, float *restrict row, const float *restrict g, uint32_t dim)
{
    STEP_ANY(k_sgd, 1);
}

PS_MULTIVERSION static int step_adagrad(const step_hp *h, float *restrict row, const float *restrict g, uint32_t dim)
{
    STEP_ANY(k_adagrad, 2);
}

PS_MULTIVERSION static int step_adam(const step_hp *h, float *restrict row, const float *restrict g, uint32_t dim)
{
    STEP_ANY(k_adam, 3);
}

PS_MULTIVERSION static int step_ftrl(const step_hp *h, float *restrict row, const float *restrict g, uint32_t dim)
{
    STEP_ANY(k_ftrl, 3);
}

/* Many rows of a dim known at compile time (D <= CHUNK), from row k on. */
#define STEP_ROWS_FIXED(kernel, parts, D)                                                                        \
    do {                                                                                                         \
        for (; k < n; k++) {                                                                                     \
            float *row = rows[k], out[(parts) * (D)];                                                            \
            if (!row)                                                                                            \
                continue;                                                                                        \
            kernel(h, row, g + (size_t)k * (D), (D), 0, (D), out);                                               \
            if (!finite_all(out, (parts) * (D)))                                                                 \
                return k;                                                                                        \
            commit(row, out, (D), 0, (D), (parts));                                                              \
        }                                                                                                        \
        return n;                                                                                                \
    } while (0)

/* Many rows of a dim known at compile time (D <= CHUNK), every one
 * written: whether each new value is finite is ORed into bad, a flag per
 * value of a row, over all the rows, and tested once at the end. A test at
 * every row (STEP_ROWS_FIXED) reduces the row's flags across the vector,
 * about ten instructions a row; AdaGrad's step of dim 16 takes 23
 * instructions a row with AVX-512 this way. */
#define STEP_ALL_FIXED(kernel, parts, D)                                                                         \
    do {                                                                                                         \
        uint32_t bad[(parts) * (D)] = {0}, any = 0;                                                              \
        for (uint32_t k = 0; k < n; k++) {                                                                       \
            float *row = rows[k], out[(parts) * (D)];                                                            \
            if (!row)                                                                                            \
                continue;                                                                                        \
            kernel(h, row, g + (size_t)k * (D), (D), 0, (D), out);                                               \
            flag_bad(bad, out, (parts) * (D));                                                                   \
            commit(row, out, (D), 0, (D), (parts));                                                              \
        }                                                                                                        \
        for (uint32_t j = 0; j < (parts) * (D); j++)                                                             \
            any |= bad[j];                                                                                       \
        return !any;                                                                                             \
    } while (0)

#define STEP_ROWS_DIMS(kernel, parts, one)                                                                       \
    do {                                                                                                         \
        uint32_t k = 0;                                                                                          \
        switch (dim) {                                                                                           \
        case 8: STEP_ROWS_FIXED(kernel, parts, 8);                                                               \
        case 16: STEP_ROWS_FIXED(kernel, parts, 16);                                                             \
        case 32: STEP_ROWS_FIXED(kernel, parts, 32);                                                             \
        case 64: STEP_ROWS_FIXED(kernel, parts, 64);                                                             \
        default:                                                                                                 \
            for (; k < n; k++)                                                                                   \
                if (rows[k] && !one(h, rows[k], g + (size_t)k * dim, dim))                                       \
                    return k;                                                                                    \
            return n;                                                                                            \
        }                                                                                                        \
    } while (0)

/* STEP_ALL_FIXED for the usual dims; any other a row at a time, checked
 * (so a row not finite is not written, which srv_sparse_step_all allows). */
#define STEP_ALL_DIMS(kernel, parts, one)                                                                        \
    do {                                                                                                         \
        switch (dim) {                                                                                           \
        case 8: STEP_ALL_FIXED(kernel, parts, 8);                                                                \
        case 16: STEP_ALL_FIXED(kernel, parts, 16);                                                              \
        case 32: STEP_ALL_FIXED(kernel, parts, 32);                                                              \
        case 64: STEP_ALL_FIXED(kernel, parts, 64);                                                              \
        default:                                                                                                 \
            for (uint32_t k = 0; k < n; k++)                                                                     \
                if (rows[k] && !one(h, rows[k], g + (size_t)k * dim, dim))                                       \
                    return 0;                                                                                    \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

PS_MULTIVERSION static uint32_t rows_sgd(const step_hp *h, float *const *rows, const float *g, uint32_t n,
                                         uint32_t dim)
{
    STEP_ROWS_DIMS(k_sgd, 1, step_sgd);
}

PS_MULTIVERSION static uint32_t rows_adagrad(const step_hp *h, float *const *rows, const float *g, uint32_t n,
                                             uint32_t dim)
{
    STEP_ROWS_DIMS(k_adagrad, 2, step_adagrad);
}

PS_MULTIVERSION static int all_sgd(const step_hp *hp, float *const *rows, const float *g, uint32_t n, uint32_t dim)
{
    const step_hp hl = *hp, *h = &hl; /* a local: the rows' stores cannot change it, so it is read once */
    STEP_ALL_DIMS(k_sgd, 1, step_sgd);
}

PS_MULTIVERSION static int all_adagrad(const step_hp *hp, float *const *rows, const float *g, uint32_t n,
                                       uint32_t dim)
{
    const step_hp hl = *hp, *h = &hl;
    STEP_ALL_DIMS(k_adagrad, 2, step_adagrad);
}

int srv_sparse_step_all(const ps_table_def *d, float *const *rows, const float *g, uint32_t n, double scale)
{
    step_hp h = hp_of(d, scale);
    switch (d->opt) {
    case PS_TOPT_SGD:
        return all_sgd(&h, rows, g, n, d->dim);
    case PS_TOPT_ADAGRAD:
        return all_adagrad(&h, rows, g, n, d->dim);
    default:
        return srv_sparse_step_rows(d, rows, g, n, scale) == n;
    }
}

uint32_t srv_sparse_step_rows(const ps_table_def *d, float *const *rows, const float *g, uint32_t n, double scale)
{
    step_hp h = hp_of(d, scale);
    switch (d->opt) {
    case PS_TOPT_SGD:
        return rows_sgd(&h, rows, g, n, d->dim);
    case PS_TOPT_ADAGRAD:
        return rows_adagrad(&h, rows, g, n, d->dim);
    default: /* adam's step differs by row, ftrl is branchy: one call a row */
        for (uint32_t k = 0; k < n; k++)
            if (rows[k] && !srv_sparse_step(d, rows[k], g + (size_t)k * d->dim, scale))
                return k;
        return n;
    }
}

int srv_sparse_step(const ps_table_def *d, float *row, const float *g, double scale)
{
    const uint32_t dim = d->dim;
    step_hp h = hp_of(d, scale);
    switch (d->opt) {
    case PS_TOPT_SGD:
        return rows_sgd(&h, &row, g, 1, dim) == 1;
    case PS_TOPT_ADAGRAD:
        return rows_adagrad(&h, &row, g, 1, dim) == 1;
    case PS_TOPT_ADAM: {
        uint32_t t;
        memcpy(&t, row + 3 * dim, sizeof t);
        if (t < UINT32_MAX)
            t++;
        h.b1 = d->hp[PS_HP_BETA1];
        h.b2 = d->hp[PS_HP_BETA2];
        h.step = h.lr * sqrt(1.0 - pow(h.b2, (double)t)) / (1.0 - pow(h.b1, (double)t));
        if (!step_adam(&h, row, g, dim))
            return 0;
        memcpy(row + 3 * dim, &t, sizeof t);
        return 1;
    }
    case PS_TOPT_FTRL:
        h.beta = d->hp[PS_HP_BETA];
        h.l1 = d->hp[PS_HP_L1];
        h.l2 = d->hp[PS_HP_L2];
        return step_ftrl(&h, row, g, dim);
    default:
        return 0;
    }
}
