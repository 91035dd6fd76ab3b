/* test_vec.c - the bfloat16 conversions of proto/vec.c (tensors on the
 * wire): ps_bf16_from_f32 against exact bit patterns (ties to even both
 * ways, values either side of a tie, carries into the exponent, +-0,
 * denormals, +-inf, the largest finite values rounding to inf, NaN
 * payloads and signalling NaN made quiet), against an independent scalar
 * reference over many bit patterns and lengths that leave a remainder after
 * the vector loop, and the round trip f32 -> bf16 -> f32; ps_bf16_to_f32 on
 * all 65536 inputs.
 *
 * psd ships these loops compiled three times (PS_MULTIVERSION: SSE2, AVX2,
 * AVX-512), and the CPU picks one at load time, so the shipped functions
 * only ever run one of them on a given machine. This file is therefore
 * built several times (CMakeLists.txt): test_vec links the shipped
 * functions, and test_vec_sse2, test_vec_avx2 and test_vec_avx512f each
 * compile vec.c for that instruction set alone (skipped when the CPU
 * lacks it), so every version is checked against the same bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/vec.h"

#ifdef VEC_ISA
/* This build checks one instruction set (VEC_ISA: "sse2", "avx2" or
 * "avx512f", set by CMakeLists.txt): vec.c itself, every PS_MULTIVERSION
 * loop compiled for that set only (vec.h is included already, so its guard
 * keeps vec.c's inclusion from redefining PS_MULTIVERSION). */
#undef PS_MULTIVERSION
#define PS_MULTIVERSION __attribute__((target(VEC_ISA)))
#include "proto/vec.c"
#define VARIANT VEC_ISA
#define VARIANT_RUNS() __builtin_cpu_supports(VEC_ISA)
#else
/* the shipped functions (pscommon), the version the CPU picks */
#define VARIANT "public"
#define VARIANT_RUNS() 1
#endif

typedef void (*narrow_fn)(uint16_t *restrict, const float *restrict, size_t);
typedef void (*widen_fn)(float *restrict, const uint16_t *restrict, size_t);

typedef struct variant {
    const char *name;
    narrow_fn narrow;
    widen_fn widen;
    int runs; /* this CPU can run it */
} variant;

static variant variants[1];
static size_t nvariants;

static int setup(void **state)
{
    (void)state;
#ifdef VEC_ISA
    __builtin_cpu_init();
#endif
    variants[nvariants++] = (variant){VARIANT, ps_bf16_from_f32, ps_bf16_to_f32, VARIANT_RUNS()};
    if (!variants[0].runs)
        fprintf(stderr, "note: this CPU cannot run %s code; the %s build of test_vec checks nothing\n", VARIANT,
                VARIANT);
    return 0;
}

static float f_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t u_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round to nearest, ties to even, written as the textbook case analysis on
 * the 16 bits that are dropped (not the add-and-shift trick of vec.c).
 * NaN: the top half with the quiet bit set. */
static uint16_t ref_bf16(uint32_t u)
{
    uint32_t mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t hi = u >> 16, rest = u & 0xffffu;
    if (rest > 0x8000u || (rest == 0x8000u && (hi & 1u)))
        hi += 1; /* away from zero in magnitude: the sign bit is untouched (no carry reaches it) */
    return (uint16_t)hi;
}

/* ---- exact bit patterns ----------------------------------------------------- */

typedef struct bcase {
    uint32_t in;
    uint16_t out;
    const char *what;
} bcase;

static const bcase cases[] = {
    {0x3f800000u, 0x3f80, "1.0"},
    {0x3f808000u, 0x3f80, "tie between 1.0 and its successor: to the even one, down"},
    {0x3f818000u, 0x3f82, "tie with an odd lower neighbour: to the even one, up"},
    {0x3f807fffu, 0x3f80, "just below a tie"},
    {0x3f808001u, 0x3f81, "just above a tie"},
    {0x3f817fffu, 0x3f81, "just below an odd tie"},
    {0x3f818001u, 0x3f82, "just above an odd tie"},
    {0x3f80ffffu, 0x3f81, "the top of the interval"},
    {0xbf808000u, 0xbf80, "-tie: to even, toward zero"},
    {0xbf818000u, 0xbf82, "-tie with an odd neighbour: to even, away from zero"},
    {0xbf808001u, 0xbf81, "negative, just above a tie"},
    {0xbf807fffu, 0xbf80, "negative, just below a tie"},
    {0x3fffffffu, 0x4000, "1.99999988: the carry reaches the exponent (2.0)"},
    {0x3fff8000u, 0x4000, "odd tie below 2.0: rounds to 2.0"},
    {0x3f7f8000u, 0x3f80, "odd tie below 1.0: rounds to 1.0"},
    {0x40490fdbu, 0x4049, "pi"},
    {0x3dcccccdu, 0x3dcd, "0.1"},
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x00000001u, 0x0000, "smallest denormal: to +0"},
    {0x80000001u, 0x8000, "smallest negative denormal: to -0"},
    {0x00008000u, 0x0000, "denormal tie: to even (0)"},
    {0x00018000u, 0x0002, "denormal odd tie: up"},
    {0x00008001u, 0x0001, "denormal just above a tie"},
    {0x00010000u, 0x0001, "smallest bfloat16 denormal"},
    {0x007fffffu, 0x0080, "largest denormal: to the smallest normal"},
    {0x807fffffu, 0x8080, "largest negative denormal"},
    {0x00800000u, 0x0080, "smallest normal"},
    {0x7f800000u, 0x7f80, "+inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x7f7f0000u, 0x7f7f, "the largest finite bfloat16"},
    {0x7f7f7fffu, 0x7f7f, "just below the tie above the largest finite"},
    {0x7f7f8000u, 0x7f80, "the tie above the largest finite (odd): to inf"},
    {0x7f7e8000u, 0x7f7e, "an even tie near the top stays finite"},
    {0x7f7fffffu, 0x7f80, "FLT_MAX: to +inf"},
    {0xff7fffffu, 0xff80, "-FLT_MAX: to -inf"},
    {0xff7f8000u, 0xff80, "-(the tie above the largest finite): to -inf"},
    {0x7fc00000u, 0x7fc0, "the default quiet NaN"},
    {0xffc00000u, 0xffc0, "negative quiet NaN"},
    {0x7f800001u, 0x7fc0, "signalling NaN with only low payload bits: quiet NaN, not inf"},
    {0xff800001u, 0xffc0, "negative signalling NaN: quiet, sign kept"},
    {0x7f810000u, 0x7fc1, "signalling NaN: payload kept, quiet bit set"},
    {0x7fa00000u, 0x7fe0, "signalling NaN 0x7fa00000"},
    {0x7fc12345u, 0x7fc1, "quiet NaN: payload truncated, not rounded"},
    {0x7fbf8000u, 0x7fff, "NaN whose rounding would carry: truncated, quiet"},
    {0x7fffffffu, 0x7fff, "all-ones NaN"},
    {0xffffffffu, 0xffff, "negative all-ones NaN (the add would wrap)"},
};

static void test_bit_patterns(void **state)
{
    (void)state;
    size_t n = sizeof cases / sizeof cases[0];
    float in[sizeof cases / sizeof cases[0]];
    uint16_t out[sizeof cases / sizeof cases[0]];
    for (size_t i = 0; i < n; i++)
        in[i] = f_of(cases[i].in);
    for (size_t v = 0; v < nvariants; v++) {
        if (!variants[v].runs)
            continue;
        /* one by one (the scalar path) and all at once (the vector loop) */
        for (size_t i = 0; i < n; i++) {
            uint16_t one = 0xdead;
            variants[v].narrow(&one, &in[i], 1);
            if (one != cases[i].out)
                fail_msg("%s, alone: 0x%08x (%s) -> 0x%04x, expected 0x%04x", variants[v].name, cases[i].in,
                         cases[i].what, one, cases[i].out);
        }
        memset(out, 0xee, sizeof out);
        variants[v].narrow(out, in, n);
        for (size_t i = 0; i < n; i++)
            if (out[i] != cases[i].out)
                fail_msg("%s, in a vector of %zu: 0x%08x (%s) -> 0x%04x, expected 0x%04x", variants[v].name, n,
                         cases[i].in, cases[i].what, out[i], cases[i].out);
        /* and the reference agrees with the table */
        for (size_t i = 0; i < n; i++)
            assert_int_equal(ref_bf16(cases[i].in), cases[i].out);
    }
    /* as values: NaN stays NaN, inf stays inf, FLT_MAX becomes inf */
    float w;
    uint16_t h;
    ps_bf16_from_f32(&h, &(float){FLT_MAX}, 1);
    ps_bf16_to_f32(&w, &h, 1);
    assert_true(isinf(w) && w > 0);
    ps_bf16_from_f32(&h, &(float){NAN}, 1);
    ps_bf16_to_f32(&w, &h, 1);
    assert_true(isnan(w));
}

/* ---- widening: all 65536 inputs ------------------------------------------------ */

static void test_widen_exhaustive(void **state)
{
    (void)state;
    const size_t n = 65536;
    uint16_t *h = malloc(n * sizeof *h);
    float *f = malloc((n + 1) * sizeof *f);
    uint16_t *back = malloc(n * sizeof *back);
    assert_non_null(h), assert_non_null(f), assert_non_null(back);
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)i;
    for (size_t v = 0; v < nvariants; v++) {
        if (!variants[v].runs)
            continue;
        f[n] = 12345.0f; /* a guard after the end */
        variants[v].widen(f, h, n);
        assert_true(f[n] == 12345.0f);
        for (size_t i = 0; i < n; i++) {
            if (u_of(f[i]) != (uint32_t)i << 16)
                fail_msg("%s: 0x%04zx widened to 0x%08x, expected 0x%08x", variants[v].name, i, u_of(f[i]),
                         (unsigned)(i << 16));
        }
        /* and back: every bfloat16 is exactly representable, so narrowing
         * its float32 gives it back; a NaN comes back quiet */
        variants[v].narrow(back, f, n);
        for (size_t i = 0; i < n; i++) {
            uint16_t want = (uint16_t)i;
            if ((i & 0x7fffu) > 0x7f80u)
                want |= 0x0040u;
            if (back[i] != want)
                fail_msg("%s: 0x%04zx -> f32 -> 0x%04x, expected 0x%04x", variants[v].name, i, back[i], want);
        }
    }
    free(h), free(f), free(back);
}

/* ---- many bit patterns, many lengths ------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A bit pattern: random, or near a tie, or special. */
static uint32_t pattern(void)
{
    uint32_t u = rnd32();
    switch (rnd32() % 6) {
    case 0:
        return u; /* anything, NaN included */
    case 1:
        return (u & 0xffff0000u) | 0x8000u; /* an exact tie */
    case 2:
        return (u & 0xffff0000u) | (0x8000u + (rnd32() % 3) - 1u); /* a tie, or one ulp either side */
    case 3:
        return (u & 0x807fffffu) | (rnd32() % 2 ? 0x7f800000u : 0x7f000000u); /* NaN/inf, or near the top */
    case 4:
        return u & 0x807fffffu; /* +-0 and denormals */
    default:
        return (u & 0x80ffffffu) | 0x3f000000u; /* ordinary values near 1 */
    }
}

static void test_lengths_and_offsets(void **state)
{
    (void)state;
    /* lengths around every vector width (4, 8, 16 floats; the compiler
     * may unroll), with the vector loop and the remainder both run */
    static const size_t lens[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 1023, 4097};
    const size_t max = 4097 + 8;
    float *src = malloc(max * sizeof *src);
    uint16_t *dst = malloc((max + 8) * sizeof *dst);
    uint16_t *want = malloc(max * sizeof *want);
    float *wide = malloc((max + 8) * sizeof *wide);
    assert_non_null(src), assert_non_null(dst), assert_non_null(want), assert_non_null(wide);
    for (size_t i = 0; i < max; i++) {
        src[i] = f_of(pattern());
        want[i] = ref_bf16(u_of(src[i]));
    }
    for (size_t v = 0; v < nvariants; v++) {
        if (!variants[v].runs)
            continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            /* the source and destination at different alignments, so the
             * compiler's peeling and the unaligned paths run too */
            for (size_t so = 0; so < 3; so++) {
                for (size_t d = 0; d < 3; d++) {
                    size_t n = lens[li];
                    for (size_t i = 0; i < max + 8; i++)
                        dst[i] = 0xbeef;
                    variants[v].narrow(dst + d, src + so, n);
                    for (size_t i = 0; i < d; i++)
                        assert_int_equal(dst[i], 0xbeef);
                    for (size_t i = 0; i < n; i++) {
                        if (dst[d + i] != want[so + i])
                            fail_msg("%s: length %zu, src+%zu, dst+%zu: element %zu 0x%08x -> 0x%04x, expected "
                                     "0x%04x",
                                     variants[v].name, n, so, d, i, u_of(src[so + i]), dst[d + i], want[so + i]);
                    }
                    for (size_t i = d + n; i < max + 8; i++)
                        if (dst[i] != 0xbeef)
                            fail_msg("%s: length %zu wrote past its end (index %zu)", variants[v].name, n, i - d);
                    /* widen it again */
                    for (size_t i = 0; i < max + 8; i++)
                        wide[i] = -7.0f;
                    variants[v].widen(wide + so, dst + d, n);
                    for (size_t i = 0; i < n; i++)
                        assert_int_equal(u_of(wide[so + i]), (uint32_t)want[so + i] << 16);
                    for (size_t i = 0; i < max + 8; i++)
                        if ((i < so || i >= so + n) && wide[i] != -7.0f)
                            fail_msg("%s: widening %zu values wrote outside them (index %zu)", variants[v].name, n,
                                     i);
                }
            }
        }
    }
    /* a million more patterns through the public function, against the reference */
    const size_t big = 1u << 20;
    float *bsrc = malloc(big * sizeof *bsrc);
    uint16_t *bdst = malloc(big * sizeof *bdst);
    assert_non_null(bsrc), assert_non_null(bdst);
    for (size_t i = 0; i < big; i++)
        bsrc[i] = f_of(pattern());
    for (size_t v = 0; v < nvariants; v++) {
        if (!variants[v].runs)
            continue;
        variants[v].narrow(bdst, bsrc, big);
        for (size_t i = 0; i < big; i++)
            if (bdst[i] != ref_bf16(u_of(bsrc[i])))
                fail_msg("%s: 0x%08x -> 0x%04x, expected 0x%04x", variants[v].name, u_of(bsrc[i]), bdst[i],
                         ref_bf16(u_of(bsrc[i])));
    }
    free(bsrc), free(bdst);
    free(src), free(dst), free(want), free(wide);
}

/* ---- the round trip's error -------------------------------------------------- */

/* For normal values whose rounding stays below the largest finite
 * bfloat16, |bf16(x) - x| <= 2^-8 |x| / (1 + 2^-8) (8 significant bits: half
 * an ulp of 2^-7 relative to the binade's bottom). The bound is reached:
 * x = 1 + 2^-8 is a tie that goes down to 1. So the error must stay at most
 * 2^-8 and, over enough values near ties, exceed 2^-9 (a conversion that
 * truncated would exceed 2^-8; one that kept more bits would stay below 2^-9). */
static void test_round_trip_error(void **state)
{
    (void)state;
    const size_t n = 1u << 18;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(x), assert_non_null(y), assert_non_null(h);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        do {
            /* exponents of normal values below the top binade, either sign */
            u = (rnd32() & 0x807fffffu) | ((1u + rnd32() % 253u) << 23);
            if (i % 4 == 0)
                u = (u & 0xffff0000u) | (0x8000u + (rnd32() % 5) - 2u); /* near a tie */
        } while (((u >> 23) & 0xffu) == 0 || ((u >> 23) & 0xffu) >= 0xfe);
        x[i] = f_of(u);
    }
    x[0] = 1.0f + 0x1p-8f; /* the worst case, exactly */
    const double bound = 0x1p-8 / (1 + 0x1p-8);
    for (size_t v = 0; v < nvariants; v++) {
        if (!variants[v].runs)
            continue;
        variants[v].narrow(h, x, n);
        variants[v].widen(y, h, n);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            assert_true(isfinite(y[i]));
            assert_true(signbit(y[i]) == signbit(x[i]));
            double rel = fabs((double)y[i] - (double)x[i]) / fabs((double)x[i]);
            if (rel > bound * (1 + 1e-12))
                fail_msg("%s: %a -> %a: relative error %g > 2^-8/(1+2^-8)", variants[v].name, (double)x[i],
                         (double)y[i], rel);
            if (rel > worst)
                worst = rel;
        }
        assert_true(y[0] == 1.0f);
        assert_true(worst > 0x1p-9);
    }
    /* values that are bfloat16 already come back exactly */
    for (size_t i = 0; i < n; i++)
        x[i] = f_of(u_of(x[i]) & 0xffff0000u);
    ps_bf16_from_f32(h, x, n);
    ps_bf16_to_f32(y, h, n);
    assert_memory_equal(x, y, n * sizeof *x);
    free(x), free(y), free(h);
}

/* ps_vec_maxabs and ps_bf16_to_f32_maxabs: the largest magnitude, +inf
 * when a value is infinite, NaN when one is NaN (whichever comes first),
 * at every position of a vector long enough for the vectorised loop. */
static void test_maxabs(void **state)
{
    enum { L = 77 };
    float x[L] = {0}, y[L];
    uint16_t h[L];
    assert_true(ps_vec_maxabs(x, 0) == 0.0f);
    for (size_t at = 0; at < L; at++) {
        for (size_t i = 0; i < L; i++)
            x[i] = (float)((int)(i % 7) - 3) * 0.25f; /* |x| <= 0.75 */
        x[at] = -2.5f;
        assert_true(ps_vec_maxabs(x, L) == 2.5f);
        ps_bf16_from_f32(h, x, L);
        assert_true(ps_bf16_to_f32_maxabs(y, h, L) == 2.5f);
        assert_memory_equal(x, y, sizeof x); /* these values are exact in bfloat16 */
        x[(at * 5) % L] = -INFINITY;
        assert_true(isinf(ps_vec_maxabs(x, L)));
        x[(at * 3) % L] = NAN;
        assert_true(isnan(ps_vec_maxabs(x, L))); /* a NaN's bits lie above inf's */
        ps_bf16_from_f32(h, x, L);
        assert_false(isfinite(ps_bf16_to_f32_maxabs(y, h, L)));
    }
}

/* float32 without its zeros: pack then expand gives the values back bit
 * for bit, at every length around the bitmap's bytes and words, with runs
 * of zeros and of values (whole bitmap bytes of each), -0.0 and NaN (which
 * travel), and the bitmap counts exactly the values stored, its padding 0. */
static void test_f32z(void **state)
{
    (void)state;
    enum { L = 300 };
    static float x[L], y[L], vals[L];
    static uint8_t mask[(L + 31) / 32 * 4];
    uint32_t seed = 12345;
    for (size_t n = 0; n <= L; n += n < 80 ? 1 : 37) {
        for (int pattern = 0; pattern < 4; pattern++) {
            for (size_t i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                int zero = pattern == 0 ? 1 : pattern == 1 ? 0 : pattern == 2 ? (seed >> 16) % 3 != 0 : (i / 19) % 2;
                x[i] = zero ? 0.0f : (float)((int)(seed >> 20) % 200 - 100) / 7.0f;
            }
            if (n > 5) {
                x[n / 2] = -0.0f;
                x[n - 1] = NAN;
            }
            memset(mask, 0xa5, sizeof mask);
            memset(y, 0x5a, sizeof y);
            size_t nz = ps_f32z_pack(mask, vals, x, n);
            assert_int_equal(ps_f32z_count_zeros(x, n), n - nz);
            size_t want = 0, bits = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &x[i], 4);
                want += u != 0;
            }
            for (size_t i = 0; i < (n + 31) / 32 * 32; i++)
                bits += (mask[i / 8] >> (i % 8)) & 1u;
            assert_int_equal(nz, want);
            assert_int_equal(bits, want); /* none past n */
            ps_f32z_expand(y, mask, vals, n);
            if (n)
                assert_memory_equal(x, y, n * sizeof(float));
            if (n > 5)
                assert_true(signbit(y[n / 2]) && y[n / 2] == 0.0f);
        }
    }
}

/* Byte planes: byte k of value i at k n + i, laid out range by range,
 * and back, bit for bit. */
static void test_shuffle4(void **state)
{
    (void)state;
    enum { N = 37 };
    float x[N], y[N];
    uint8_t planes[4 * N];
    for (size_t i = 0; i < N; i++)
        x[i] = (float)i * -1.75f + 0.3f;
    x[5] = NAN;
    x[6] = -0.0f;
    ps_shuffle4_at(planes, N, 0, x, 10);
    ps_shuffle4_at(planes, N, 10, x + 10, N - 10);
    for (size_t i = 0; i < N; i++) {
        uint8_t b[4];
        memcpy(b, &x[i], 4);
        for (size_t k = 0; k < 4; k++)
            assert_int_equal(planes[k * N + i], b[k]);
    }
    ps_unshuffle4(y, planes, N);
    assert_memory_equal(x, y, sizeof x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bit_patterns),
        cmocka_unit_test(test_widen_exhaustive),
        cmocka_unit_test(test_lengths_and_offsets),
        cmocka_unit_test(test_round_trip_error),
        cmocka_unit_test(test_maxabs),
        cmocka_unit_test(test_f32z),
        cmocka_unit_test(test_shuffle4),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
