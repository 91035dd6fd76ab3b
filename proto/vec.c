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

PS_MULTIVERSION size_t ps_f32z_count_zeros(const float *x, size_t n)
{
    size_t z = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        z += u == 0;
    }
    return z;
}

/* Branch-free: every value is written at vals[nz] and kept by counting
 * it (vals has room for n). Expanding goes a byte of the bitmap at a
 * time: a byte of zeros (8 zero values) or of ones (8 stored values) is
 * the common case in gradients, and is one store or one copy. */
size_t ps_f32z_pack(uint8_t *restrict mask, float *restrict vals, const float *restrict src, size_t n)
{
    size_t nz = 0;
    memset(mask, 0, (n + 31) / 32 * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        uint32_t keep = u != 0;
        vals[nz] = src[i];
        nz += keep;
        mask[i / 8] |= (uint8_t)(keep << (i % 8));
    }
    return nz;
}

void ps_f32z_expand(float *restrict dst, const uint8_t *restrict mask, const float *restrict vals, size_t n)
{
    size_t k = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned b = mask[i / 8];
        if (b == 0) {
            memset(dst + i, 0, 8 * sizeof(float));
        } else if (b == 0xffu) {
            memcpy(dst + i, vals + k, 8 * sizeof(float));
            k += 8;
        } else {
            for (unsigned j = 0; j < 8; j++)
                dst[i + j] = (b >> j) & 1u ? vals[k++] : 0.0f;
        }
    }
    for (; i < n; i++)
        dst[i] = (mask[i / 8] >> (i % 8)) & 1u ? vals[k++] : 0.0f;
}

/* Byte planes, as HDF5's and Blosc's shuffle filters lay floats out for a
 * compressor: the exponents' bytes, which repeat, end up side by side. */
void ps_shuffle4_at(uint8_t *restrict dst, size_t n, size_t at, const float *restrict src, size_t len)
{
    const uint8_t *s = (const uint8_t *)src;
    for (size_t i = 0; i < len; i++) {
        dst[at + i] = s[4 * i];
        dst[n + at + i] = s[4 * i + 1];
        dst[2 * n + at + i] = s[4 * i + 2];
        dst[3 * n + at + i] = s[4 * i + 3];
    }
}

void ps_unshuffle4(float *restrict dst, const uint8_t *restrict src, size_t n)
{
    uint8_t *d = (uint8_t *)dst;
    for (size_t i = 0; i < n; i++) {
        d[4 * i] = src[i];
        d[4 * i + 1] = src[n + i];
        d[4 * i + 2] = src[2 * n + i];
        d[4 * i + 3] = src[3 * n + i];
    }
}
