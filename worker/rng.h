/* rng.h - the worker's small seeded pseudo-random generator.
 *
 * xoshiro256** (Blackman and Vigna) seeded through splitmix64, so a 64-bit seed
 * (and optional stream numbers such as shard and epoch) gives the same sequence
 * on every machine. Used for the per-epoch shuffle, weight initialisation and,
 * later, dropout masks. Not for anything that needs to be unpredictable. */
#ifndef PS_RNG_H
#define PS_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_rng {
    uint64_t s[4]; /* xoshiro256** state; never all zero */
} ps_rng;

/* One step of splitmix64: advances *x and returns a well-mixed 64-bit value. */
uint64_t ps_splitmix64(uint64_t *x);

/* Seeds r from seed alone. */
void ps_rng_seed(ps_rng *r, uint64_t seed);

/* Seeds r from (seed, a, b), e.g. (job seed, shard, epoch). Different triples
 * give unrelated streams; the same triple always gives the same stream. */
void ps_rng_seed3(ps_rng *r, uint64_t seed, uint64_t a, uint64_t b);

/* Next 64 random bits. */
uint64_t ps_rng_next(ps_rng *r);

/* Uniform integer in [0, n), without modulo bias; n must be >= 1. */
uint64_t ps_rng_below(ps_rng *r, uint64_t n);

/* Uniform double in [0, 1), 53 random bits. */
double ps_rng_uniform(ps_rng *r);

/* Standard normal deviate (Box-Muller; the spare value is discarded so the
 * stream position depends only on the number of calls). */
double ps_rng_normal(ps_rng *r);

/* Fills perm[0..n) with a uniformly random permutation of 0..n-1
 * (Fisher-Yates driven by r). */
void ps_rng_permutation(ps_rng *r, size_t *perm, size_t n);

#endif
