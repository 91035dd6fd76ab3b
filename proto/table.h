/* table.h - embedding tables as the protocol defines them (PROTOCOL.md 13):
 * a table's declaration, its limits, its optimizers' hyper-parameters and
 * the function that gives a row its initial values from (seed, key) alone.
 *
 * No I/O and no allocation: psd, libpsclient, the fuzz targets and the unit
 * tests use it unchanged. The store that holds rows is psd's
 * (server/tables/table.h); this file only says what a row is. */
#ifndef PS_TABLE_H
#define PS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define PS_TABLES_MAX 64            /* tables on one psd */
#define PS_TABLE_DIM_MAX 1024       /* values in one row */
#define PS_TABLE_KEYS_MAX 65536     /* keys in one message's "keys" (and in "pkeys") */
#define PS_TABLE_VALUES_MAX (1u << 22) /* row values in one message's "data" */
#define PS_TSEG_MIN (1u << 16)      /* bytes of a table segment psd maps (PROTOCOL.md 13.9) */
#define PS_TSEG_MAX (1u << 26)

/* How a row starts ("rinit"). */
typedef enum ps_rinit { PS_RINIT_ZEROS = 0, PS_RINIT_UNIFORM = 1, PS_RINIT_NORMAL = 2, PS_RINIT_COUNT } ps_rinit;

/* A table's optimizer ("opt"). */
typedef enum ps_topt { PS_TOPT_SGD = 0, PS_TOPT_ADAGRAD = 1, PS_TOPT_ADAM = 2, PS_TOPT_FTRL = 3, PS_TOPT_COUNT } ps_topt;

/* The hyper-parameters a TABLE's "hp" may name, as indexes into ps_hp.v. */
typedef enum ps_hp_id {
    PS_HP_LR = 0,    /* every optimizer; ftrl's alpha */
    PS_HP_EPS = 1,   /* adagrad, adam */
    PS_HP_BETA1 = 2, /* adam */
    PS_HP_BETA2 = 3, /* adam */
    PS_HP_IACC = 4,  /* adagrad: the accumulator's initial value */
    PS_HP_BETA = 5,  /* ftrl */
    PS_HP_L1 = 6,    /* ftrl */
    PS_HP_L2 = 7,    /* ftrl */
    PS_HP_COUNT = 8
} ps_hp_id;

/* "hp" as decoded: the values present (bit i of has: v[i] was sent). */
typedef struct ps_hp {
    uint32_t has;
    double v[PS_HP_COUNT];
} ps_hp;

/* A table's declaration, checked and with every default filled in. Two
 * declarations are the same table iff ps_table_def_same() says so. */
typedef struct ps_table_def {
    char name[64];      /* 1..63 printable ASCII bytes without space */
    uint32_t dim;       /* 1..PS_TABLE_DIM_MAX */
    uint32_t rinit;     /* ps_rinit */
    double scale;       /* uniform bound or normal std (> 0); 0 for zeros */
    uint64_t seed;
    uint32_t opt;       /* ps_topt */
    double hp[PS_HP_COUNT]; /* every hyper-parameter of opt, defaults filled; 0 for the others */
    uint32_t part, nparts; /* the part of the table this psd holds: the keys k with
                            * ps_table_part(k, nparts) == part; 0 and 1 (every key)
                            * unless a TABLE's "part" said otherwise */
} ps_table_def;

const char *ps_rinit_name(uint32_t r);   /* "zeros", ...; "?" when unknown */
const char *ps_topt_name(uint32_t o);    /* "sgd", ...; "?" when unknown */
const char *ps_hp_name(uint32_t id);     /* "lr", ...; "?" when unknown */
/* The ps_hp_id of a hyper-parameter's name of len bytes, or -1. */
int ps_hp_lookup(const char *name, size_t len);

/* Float32 values of optimizer state per row value for opt (0 sgd, 1 adagrad,
 * 2 adam and ftrl), and whether the row also keeps a step count (adam). */
uint32_t ps_topt_state_per_value(uint32_t opt);
/* The hyper-parameters opt takes, as bits (1 << ps_hp_id); 0 when unknown. */
uint32_t ps_topt_hps(uint32_t opt);
int ps_topt_has_step(uint32_t opt);

/* The largest magnitude rinit's values reach before they are multiplied
 * by scale (13.3): 1 for uniform, sqrt(-2 ln 2^-53) = 8.5716743... for
 * normal, 0 for zeros. */
double ps_rinit_reach(uint32_t rinit);
/* 1 when scale x ps_rinit_reach(rinit) rounds to a finite float32 (is
 * below 2^128 - 2^103), so that every initial row is finite. */
int ps_rinit_scale_ok(uint32_t rinit, double scale);

/* Builds a checked declaration from a TABLE's fields: name, dim, the rinit
 * and opt names (NUL-terminated), scale (has_scale: it was sent), seed and
 * hp. Returns 0, or PS_EBAD_FIELD with the reason in err (an unknown rinit
 * or opt, a bad name or dim, scale missing or not > 0 where rinit needs
 * it, or so large that a row's values could overflow float32, a
 * hyper-parameter opt does not take or out of its bounds, ftrl with
 * another rinit than zeros). */
int ps_table_def_make(ps_table_def *d, const char *name, uint64_t dim, const char *rinit, int has_scale,
                      double scale, uint64_t seed, const char *opt, const ps_hp *hp, char *err, size_t errlen);

/* 1 when a and b declare the same table (names, dim, rinit, scale, seed,
 * opt, hyper-parameters and part all equal, doubles compared bit for bit). */
int ps_table_def_same(const ps_table_def *a, const ps_table_def *b);

/* Writes d as text ("dim 16, uniform(0.05), seed 7, adagrad lr 0.01 eps
 * 1e-10 iacc 0") into buf, for error messages and logs. */
void ps_table_def_text(const ps_table_def *d, char *buf, size_t len);

/* The splitmix64 finaliser (PROTOCOL.md 13.3). */
static inline uint64_t ps_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Lamping and Veach's jump consistent hash (2014): a bucket in [0, n) for
 * key, n >= 1. Going from n to n + 1 buckets moves a key only to the new
 * bucket n, and about 1/(n + 1) of the keys move. */
static inline uint32_t ps_jump_hash(uint64_t key, uint32_t n)
{
    int64_t b = -1, j = 0;
    while (j < (int64_t)n) {
        b = j;
        key = key * 2862933555777941757ull + 1;
        j = (int64_t)((double)(b + 1) * ((double)(1ll << 31) / (double)((key >> 33) + 1)));
    }
    return (uint32_t)b;
}

/* The part (0..n-1) that holds key of a table split over n psd
 * (PROTOCOL.md 13.7): jump_hash(mix(key), n). */
static inline uint32_t ps_table_part(uint64_t key, uint32_t n)
{
    return n <= 1 ? 0 : ps_jump_hash(ps_mix64(key), n);
}

/* Writes the d->dim initial values of key's row into row (PROTOCOL.md 13.3):
 * a function of d's rinit, scale and seed and of key alone. */
void ps_table_row_init(const ps_table_def *d, uint64_t key, float *row);

/* Key i of a "keys" bin (little-endian uint64, maybe unaligned). */
static inline uint64_t ps_key_at(const uint8_t *keys, size_t i)
{
    const uint8_t *p = keys + 8 * i;
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}

#endif
