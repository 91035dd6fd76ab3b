/* vec.h - small float32 vector kernels: the conversions of a tensor's wire
 * forms (bfloat16, zero-packing, byte shuffle) that proto/codec.c runs, and
 * the checks and sums psd, psworker and libpsclient share. In proto/, the
 * bottom of the tree, because the codec needs them.
 * Plain loops the compiler vectorises; inputs need only float alignment. */
#ifndef PS_VEC_H
#define PS_VEC_H

#include <stddef.h>
#include <stdint.h>

/* Marks a hot loop to be compiled three times, for x86-64's baseline
 * (SSE2), AVX2 and AVX-512, with the version picked once at load time (an
 * ifunc) by what the CPU has. Element-wise float arithmetic gives the same
 * bits in all three (no FMA contraction under -std=c11). gcc on x86-64
 * Linux only. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
/* (not under ThreadSanitizer: its instrumented ifunc resolver runs before
 * the sanitizer's runtime is set up, and crashes the program at load) */
#define PS_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PS_MULTIVERSION
#endif

/* 1 when every x[i] is finite (no NaN, no infinity), else 0. */
int ps_vec_all_finite(const float *x, size_t n);

/* The largest |x[i]| (0 for n = 0): +inf when some x[i] is infinite and
 * NaN when some is NaN, so the result is finite exactly when every x[i]
 * is. One branch-free pass (the maximum of the magnitudes' bits). */
float ps_vec_maxabs(const float *x, size_t n);

/* y[i] += a * x[i] */
void ps_vec_axpy(float *restrict y, float a, const float *restrict x, size_t n);

/* x[i] *= a */
void ps_vec_scale(float *x, float a, size_t n);

/* sum of x[i]^2, accumulated in double */
double ps_vec_sumsq(const float *x, size_t n);

/* bfloat16 (the top 16 bits of a float32) for tensors on the wire.
 * ps_bf16_from_f32 rounds to nearest, ties to even; NaN stays NaN (quiet),
 * infinities stay infinite, and a finite value that rounds past the
 * largest bfloat16 becomes infinite, as in every bfloat16 conversion.
 * ps_bf16_to_f32 is exact. */
void ps_bf16_from_f32(uint16_t *restrict dst, const float *restrict src, size_t n);
void ps_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n);
/* ps_bf16_to_f32, returning the largest |value| as ps_vec_maxabs does
 * (finite exactly when every value is), in one pass. */
float ps_bf16_to_f32_maxabs(float *restrict dst, const uint16_t *restrict src, size_t n);

/* ps_bf16_to_f32, and 1 when every value is finite (else 0), in one pass. */
int ps_bf16_to_f32_finite(float *restrict dst, const uint16_t *restrict src, size_t n);

/* float32 with its zeros left out (PS_DT_F32Z on the wire): a bitmap of
 * n bits (bit i of mask[i / 8]: src[i] is not +0.0), padded with zero
 * bytes to a multiple of 4, then the values whose bit is set, in order.
 * ps_f32z_pack writes both and returns how many values it stored; vals
 * must have room for n. Only the bits of +0.0 are left out: -0.0, NaN and
 * everything else travel, so expanding gives back src bit for bit.
 * ps_f32z_expand writes all n values; mask must count as many set bits
 * as vals holds (proto's decoder checks a received one). */
size_t ps_f32z_count_zeros(const float *x, size_t n); /* the values ps_f32z_pack leaves out */
size_t ps_f32z_pack(uint8_t *restrict mask, float *restrict vals, const float *restrict src, size_t n);
void ps_f32z_expand(float *restrict dst, const uint8_t *restrict mask, const float *restrict vals, size_t n);

/* float32 values as byte planes (compressed tensors on the wire, PS_DT_F32ZSTD):
 * byte 0 (the lowest of the little-endian float) of every value, then byte 1
 * of every value, then bytes 2, then bytes 3; 4 n bytes for n values.
 * ps_shuffle4_at writes src's len values as values [at, at + len) of such
 * a layout of n values (so a range can be laid out block by block);
 * ps_unshuffle4 gives the n values back. */
void ps_shuffle4_at(uint8_t *restrict dst, size_t n, size_t at, const float *restrict src, size_t len);
void ps_unshuffle4(float *restrict dst, const uint8_t *restrict src, size_t n);

#endif
