/* rng.c - splitmix64 and xoshiro256** (public-domain algorithms by Sebastiano
 * Vigna and David Blackman), plus the helpers the worker draws from them. */
#include "rng.h"

#include <assert.h>
#include <math.h>

uint64_t ps_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void ps_rng_seed(ps_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = ps_splitmix64(&x);
    /* splitmix64 is a bijection of its counter, so four consecutive outputs
     * cannot all be zero; keep the invariant visible anyway. */
    assert(r->s[0] | r->s[1] | r->s[2] | r->s[3]);
}

void ps_rng_seed3(ps_rng *r, uint64_t seed, uint64_t a, uint64_t b)
{
    /* Chain the inputs through splitmix64 so that nearby triples such as
     * (s, 0, 1) and (s, 1, 0) land far apart. */
    uint64_t x = seed;
    uint64_t h = ps_splitmix64(&x);
    x = h ^ a;
    h = ps_splitmix64(&x);
    x = h ^ b;
    h = ps_splitmix64(&x);
    ps_rng_seed(r, h);
}

uint64_t ps_rng_next(ps_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t ps_rng_below(ps_rng *r, uint64_t n)
{
    assert(n >= 1);
    /* Reject the top partial block of 2^64 so every residue is equally likely. */
    uint64_t threshold = (0 - n) % n; /* 2^64 mod n */
    for (;;) {
        uint64_t v = ps_rng_next(r);
        if (v >= threshold)
            return v % n;
    }
}

double ps_rng_uniform(ps_rng *r)
{
    return (double)(ps_rng_next(r) >> 11) * 0x1.0p-53;
}

double ps_rng_normal(ps_rng *r)
{
    double u1 = 1.0 - ps_rng_uniform(r); /* (0, 1]: log() stays finite */
    double u2 = ps_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ps_rng_permutation(ps_rng *r, size_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)ps_rng_below(r, i);
        size_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
