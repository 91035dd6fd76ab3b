/* vec.h - small float32 vector kernels shared by psd and psworker.
 * Plain loops the compiler vectorises; inputs need only float alignment. */
#ifndef PS_VEC_H
#define PS_VEC_H

#include <stddef.h>

/* 1 when every x[i] is finite (no NaN, no infinity), else 0. */
int ps_vec_all_finite(const float *x, size_t n);

/* y[i] += a * x[i] */
void ps_vec_axpy(float *restrict y, float a, const float *restrict x, size_t n);

/* x[i] *= a */
void ps_vec_scale(float *x, float a, size_t n);

/* sum of x[i]^2, accumulated in double */
double ps_vec_sumsq(const float *x, size_t n);

#endif
