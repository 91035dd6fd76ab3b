/* table.c - table declarations and row initial values (see table.h,
 * PROTOCOL.md 13). */
#include "table.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"

static const char *const rinit_names[PS_RINIT_COUNT] = {"zeros", "uniform", "normal"};
static const char *const topt_names[PS_TOPT_COUNT] = {"sgd", "adagrad", "adam", "ftrl"};
static const char *const hp_names[PS_HP_COUNT] = {"lr", "eps", "beta1", "beta2", "iacc", "beta", "l1", "l2"};

/* Per optimizer: the hyper-parameters it takes (bits of ps_hp_id) and their
 * defaults (PROTOCOL.md 13.4). */
#define HPB(id) (1u << (id))
static const uint32_t topt_hps[PS_TOPT_COUNT] = {
    [PS_TOPT_SGD] = HPB(PS_HP_LR),
    [PS_TOPT_ADAGRAD] = HPB(PS_HP_LR) | HPB(PS_HP_EPS) | HPB(PS_HP_IACC),
    [PS_TOPT_ADAM] = HPB(PS_HP_LR) | HPB(PS_HP_BETA1) | HPB(PS_HP_BETA2) | HPB(PS_HP_EPS),
    [PS_TOPT_FTRL] = HPB(PS_HP_LR) | HPB(PS_HP_BETA) | HPB(PS_HP_L1) | HPB(PS_HP_L2),
};
static const double topt_defaults[PS_TOPT_COUNT][PS_HP_COUNT] = {
    [PS_TOPT_SGD] = {[PS_HP_LR] = 0.01},
    [PS_TOPT_ADAGRAD] = {[PS_HP_LR] = 0.01, [PS_HP_EPS] = 1e-10, [PS_HP_IACC] = 0.0},
    [PS_TOPT_ADAM] = {[PS_HP_LR] = 0.001, [PS_HP_BETA1] = 0.9, [PS_HP_BETA2] = 0.999, [PS_HP_EPS] = 1e-8},
    [PS_TOPT_FTRL] = {[PS_HP_LR] = 0.05, [PS_HP_BETA] = 1.0, [PS_HP_L1] = 0.0, [PS_HP_L2] = 0.0},
};

const char *ps_rinit_name(uint32_t r)
{
    return r < PS_RINIT_COUNT ? rinit_names[r] : "?";
}

const char *ps_topt_name(uint32_t o)
{
    return o < PS_TOPT_COUNT ? topt_names[o] : "?";
}

const char *ps_hp_name(uint32_t id)
{
    return id < PS_HP_COUNT ? hp_names[id] : "?";
}

int ps_hp_lookup(const char *name, size_t len)
{
    for (int i = 0; i < PS_HP_COUNT; i++)
        if (strlen(hp_names[i]) == len && memcmp(hp_names[i], name, len) == 0)
            return i;
    return -1;
}

uint32_t ps_topt_state_per_value(uint32_t opt)
{
    switch (opt) {
    case PS_TOPT_ADAGRAD:
        return 1;
    case PS_TOPT_ADAM:
    case PS_TOPT_FTRL:
        return 2;
    default:
        return 0;
    }
}

uint32_t ps_topt_hps(uint32_t opt)
{
    return opt < PS_TOPT_COUNT ? topt_hps[opt] : 0;
}

int ps_topt_has_step(uint32_t opt)
{
    return opt == PS_TOPT_ADAM;
}

static int lookup(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0)
            return i;
    return -1;
}

/* The names of the hyper-parameters in bits, ", "-separated, into buf. */
static void hp_list(uint32_t bits, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < PS_HP_COUNT && at < len; i++)
        if (bits & HPB(i)) {
            int k = snprintf(buf + at, len - at, "%s%s", at ? ", " : "", hp_names[i]);
            if (k < 0)
                return;
            at += (size_t)k;
        }
}

/* Bounds of one hyper-parameter (PROTOCOL.md 13.4); NULL when v is inside. */
static const char *hp_bad(int id, double v)
{
    if (!isfinite(v))
        return "a finite number";
    switch (id) {
    case PS_HP_LR:
    case PS_HP_EPS:
        return v > 0 ? NULL : "> 0";
    case PS_HP_BETA1:
    case PS_HP_BETA2:
        return v >= 0 && v < 1 ? NULL : "in [0, 1)";
    default:
        return v >= 0 ? NULL : ">= 0";
    }
}

/* The least double that rounds to infinity as a float32: 2^128 - 2^103,
 * halfway between FLT_MAX and 2^128 (a tie, rounded to the even 2^128). */
#define FLOAT32_INF_FROM (0x1p128 - 0x1p103)

double ps_rinit_reach(uint32_t rinit)
{
    switch (rinit) {
    case PS_RINIT_UNIFORM:
        return 1.0; /* |2u - 1| for u in [0, 1): 1 at u = 0 */
    case PS_RINIT_NORMAL:
        /* Box-Muller's radius at the largest u, 1 - 2^-53 (1 - u is then
         * 2^-53 exactly), times |cos| at most 1: sqrt(106 ln 2) */
        return sqrt(-2.0 * log(0x1p-53));
    default:
        return 0.0;
    }
}

int ps_rinit_scale_ok(uint32_t rinit, double scale)
{
    return scale * ps_rinit_reach(rinit) < FLOAT32_INF_FROM;
}

int ps_table_def_make(ps_table_def *d, const char *name, uint64_t dim, const char *rinit, int has_scale,
                      double scale, uint64_t seed, const char *opt, const ps_hp *hp, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->nparts = 1;
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen >= sizeof d->name)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "table: name must have 1..63 bytes");
    for (size_t i = 0; i < nlen; i++)
        if (name[i] < 0x21 || name[i] > 0x7e)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "table: name must be printable ASCII without space");
    memcpy(d->name, name, nlen + 1);
    if (dim == 0 || dim > PS_TABLE_DIM_MAX)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': dim %llu is not in 1..%d", name, (unsigned long long)dim,
                    PS_TABLE_DIM_MAX);
    d->dim = (uint32_t)dim;
    int r = lookup(rinit_names, PS_RINIT_COUNT, rinit);
    if (r < 0)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': unknown rinit '%s' (zeros, uniform or normal)", name, rinit);
    d->rinit = (uint32_t)r;
    if (r != PS_RINIT_ZEROS) {
        if (!has_scale || !isfinite(scale) || !(scale > 0))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': rinit %s needs 'scale', a finite number > 0 (%s)", name, rinit,
                        r == PS_RINIT_UNIFORM ? "values from uniform(-scale, scale)" : "the standard deviation");
        if (!ps_rinit_scale_ok((uint32_t)r, scale))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': scale %g is too large for rinit %s: its values reach "
                           "scale x %.9g, which must stay a finite float32, so scale must be below %.8g", name, scale,
                           rinit, ps_rinit_reach((uint32_t)r), FLOAT32_INF_FROM / ps_rinit_reach((uint32_t)r));
        d->scale = scale;
    }
    d->seed = seed;
    int o = lookup(topt_names, PS_TOPT_COUNT, opt);
    if (o < 0)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': unknown opt '%s' (sgd, adagrad, adam or ftrl)", name, opt);
    d->opt = (uint32_t)o;
    if (o == PS_TOPT_FTRL && r != PS_RINIT_ZEROS)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': ftrl computes a row's weights from its state alone, so its rinit "
                                 "must be zeros, not %s",
                    name, rinit);
    memcpy(d->hp, topt_defaults[o], sizeof d->hp);
    uint32_t sent = hp ? hp->has : 0;
    for (int i = 0; i < PS_HP_COUNT; i++) {
        if (!(sent & HPB(i)))
            continue;
        if (!(topt_hps[o] & HPB(i))) {
            char list[80];
            hp_list(topt_hps[o], list, sizeof list);
            return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': hp '%s' is not a hyper-parameter of %s (it takes %s)", name,
                        hp_names[i], opt, list);
        }
        const char *bad = hp_bad(i, hp->v[i]);
        if (bad)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "table '%s': hp '%s' is %g; it must be %s", name, hp_names[i], hp->v[i], bad);
        d->hp[i] = hp->v[i];
    }
    return 0;
}

int ps_table_def_same(const ps_table_def *a, const ps_table_def *b)
{
    return strcmp(a->name, b->name) == 0 && a->dim == b->dim && a->rinit == b->rinit &&
           memcmp(&a->scale, &b->scale, sizeof a->scale) == 0 && a->seed == b->seed && a->opt == b->opt &&
           memcmp(a->hp, b->hp, sizeof a->hp) == 0 && a->part == b->part && a->nparts == b->nparts;
}

void ps_table_def_text(const ps_table_def *d, char *buf, size_t len)
{
    size_t at = 0;
    int k;
    if (d->rinit == PS_RINIT_ZEROS)
        k = snprintf(buf, len, "dim %u, zeros, seed %llu, %s", d->dim, (unsigned long long)d->seed,
                     ps_topt_name(d->opt));
    else
        k = snprintf(buf, len, "dim %u, %s(%.9g), seed %llu, %s", d->dim, ps_rinit_name(d->rinit), d->scale,
                     (unsigned long long)d->seed, ps_topt_name(d->opt));
    if (k < 0 || (size_t)k >= len)
        return;
    at = (size_t)k;
    for (int i = 0; i < PS_HP_COUNT && d->opt < PS_TOPT_COUNT; i++) {
        if (!(topt_hps[d->opt] & HPB(i)))
            continue;
        k = snprintf(buf + at, len - at, " %s %.9g", hp_names[i], d->hp[i]);
        if (k < 0 || (size_t)k >= len - at)
            return;
        at += (size_t)k;
    }
    if (d->nparts > 1)
        snprintf(buf + at, len - at, ", part %u of %u", d->part, d->nparts);
}

/* The splitmix64 generator of PROTOCOL.md 13.3: draw i (from 1) of state x,
 * as a double in [0, 1). */
static double draw(uint64_t x, uint64_t i)
{
    return (double)(ps_mix64(x + i * 0x9e3779b97f4a7c15ull) >> 11) * 0x1p-53;
}

void ps_table_row_init(const ps_table_def *d, uint64_t key, float *row)
{
    uint64_t x = ps_mix64(d->seed ^ ps_mix64(key));
    switch (d->rinit) {
    case PS_RINIT_UNIFORM:
        for (uint32_t j = 0; j < d->dim; j++)
            row[j] = (float)(d->scale * (2.0 * draw(x, j + 1) - 1.0));
        break;
    case PS_RINIT_NORMAL:
        for (uint32_t j = 0; j < d->dim; j++) {
            double u1 = draw(x, 2 * (uint64_t)j + 1), u2 = draw(x, 2 * (uint64_t)j + 2);
            row[j] = (float)(d->scale * sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
        }
        break;
    default:
        memset(row, 0, sizeof(float) * d->dim);
        break;
    }
}
