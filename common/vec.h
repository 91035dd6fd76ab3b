/* vec.h - small float32 vector kernels shared by psd and psworker.
 * Plain loops the compiler vectorises; inputs need only float alignment. */
#ifndef PS_VEC_H
#define PS_VEC_H

#include <stddef.h>

/* Marks a hot loop to be compiled twice, for x86-64's baseline (SSE2) and
 * for AVX2, with the version picked once at load time (an ifunc) on CPUs
 * that have AVX2. Element-wise float arithmetic gives the same bits in both
 * (no FMA contraction under -std=c11). gcc on x86-64 Linux only. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
#define PS_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define PS_MULTIVERSION
#endif

/* 1 when every x[i] is finite (no NaN, no infinity), else 0. */
int ps_vec_all_finite(const float *x, size_t n);

/* y[i] += a * x[i] */
void ps_vec_axpy(float *restrict y, float a, const float *restrict x, size_t n);

/* x[i] *= a */
void ps_vec_scale(float *x, float a, size_t n);

/* sum of x[i]^2, accumulated in double */
double ps_vec_sumsq(const float *x, size_t n);

#endif
