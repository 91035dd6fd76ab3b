/* vec.c - vector kernels (see vec.h). */
#include "vec.h"

#include <stdint.h>
#include <string.h>

PS_MULTIVERSION int ps_vec_all_finite(const float *x, size_t n)
{
    /* An IEEE float is NaN or infinite iff its exponent bits are all ones.
     * OR-reducing a mask over blocks keeps the loop branch-free. */
    size_t i = 0;
    while (i < n) {
        size_t end = n - i > 4096 ? i + 4096 : n;
        uint32_t bad = 0;
        for (; i < end; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (bad)
            return 0;
    }
    return 1;
}

/* |x| as the bits of a float: NaN's are above +inf's, which are above
 * every finite magnitude's, so an unsigned maximum orders them as wanted */
static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

PS_MULTIVERSION float ps_vec_maxabs(const float *x, size_t n)
{
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7fffffffu;
        mx = u > mx ? u : mx;
    }
    return from_bits(mx);
}

void ps_vec_axpy(float *restrict y, float a, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void ps_vec_scale(float *x, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

double ps_vec_sumsq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

PS_MULTIVERSION void ps_bf16_from_f32(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
        dst[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : rounded);
    }
}

PS_MULTIVERSION float ps_bf16_to_f32_maxabs(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    uint32_t mx = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        uint32_t a = u & 0x7fffffffu;
        mx = a > mx ? a : mx;
        memcpy(&dst[i], &u, 4);
    }
    return from_bits(mx);
}

PS_MULTIVERSION int ps_bf16_to_f32_finite(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        memcpy(&dst[i], &u, 4);
    }
    return !bad;
}

PS_MULTIVERSION void ps_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}
