/* fuzz_codec.c - libFuzzer target: the tensor codec (proto/codec.c), alone.
 *
 * Input: one selector byte, then bytes whose meaning it picks (bits 0-1):
 *   0  float32 values (the rest, whole floats): each form encoded and
 *      decoded again must give them back: float32 without zeros and the
 *      zstd frame bit for bit, bfloat16 as its rounding (the top 16 bits
 *      of what it decodes to, for values that are not NaN); the packed
 *      sizes agree with ps_codec_f32z_size and ps_codec_zstd_bound;
 *   1  a dt-3 "data": two bytes n (little-endian), then a frame. It is
 *      decoded only when ps_codec_zstd_check accepts it for n values, as
 *      psd and libpsclient do; then it must decompress to 4 n bytes or be
 *      refused with PS_EBAD_FIELD, and what it decodes to must encode and
 *      decode back to itself;
 *   2  a dt-2 "data": two bytes n, then a bitmap and values; decoded only
 *      when it has exactly as many values as set bits (proto's decoder
 *      checks that before the codec sees it); encoding what it decodes to
 *      must give the bitmap and values back;
 *   3  a dt-1 "data": the rest as bfloat16 values; decoding and encoding
 *      again gives them back (NaN stays NaN).
 * Buffers are heap blocks of exactly the size the codec is promised, so
 * AddressSanitizer sees a byte written or read past them. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "proto/codec.h"
#include "proto/errors.h"

/* every check names the input's meaning in its message */
#define CHECK(cond) FUZZ_CHECK(cond, "fuzz_codec")

static ps_codec codec; /* one, as psd and a client keep theirs */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CHECK(p != NULL);
    return p;
}

static int is_nan_bf16(uint16_t v)
{
    return (v & 0x7f80) == 0x7f80 && (v & 0x007f) != 0;
}

static void round_trip(const uint8_t *d, size_t size)
{
    size_t n = size / sizeof(float);
    float *x = xmalloc(n * sizeof(float));
    memcpy(x, d, n * sizeof(float));
    float *back = xmalloc(n * sizeof(float));

    /* float32 without its zeros */
    uint8_t *z = xmalloc((size_t)ps_f32z_mask_bytes(n) + n * sizeof(float));
    uint64_t nz;
    size_t zb = ps_codec_f32z_encode(z, x, n, &nz);
    CHECK(zb == ps_codec_f32z_size(x, n));
    CHECK(zb == (size_t)ps_f32z_mask_bytes(n) + nz * sizeof(float));
    ps_codec_f32z_decode(back, z, n);
    CHECK(memcmp(back, x, n * sizeof(float)) == 0);
    free(z);

    /* one zstd frame of the byte planes, laid out in two pieces */
    uint8_t *planes = xmalloc(n * sizeof(float));
    size_t half = n / 2;
    ps_codec_planes_put(planes, n, 0, x, half);
    ps_codec_planes_put(planes, n, half, x + half, n - half);
    size_t cap = ps_codec_zstd_bound(n), len = 0;
    uint8_t *frame = xmalloc(cap);
    char err[160];
    CHECK(ps_codec_zstd_encode(&codec, frame, cap, planes, n, &len, err, sizeof err) == 0);
    CHECK(len > 0 && len <= cap);
    CHECK(ps_codec_zstd_check(frame, len, n) == 0);
    CHECK(ps_codec_zstd_check(frame, len, n + 1) == PS_EBAD_FIELD);
    memset(back, 0, n * sizeof(float));
    CHECK(ps_codec_zstd_decode(&codec, back, planes, frame, len, n, err, sizeof err) == 0);
    CHECK(memcmp(back, x, n * sizeof(float)) == 0);
    free(frame);
    free(planes);

    /* bfloat16: decoding gives each rounded value exactly */
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    ps_codec_bf16_encode(h, x, n);
    ps_codec_bf16_decode(back, h, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &back[i], sizeof u);
        CHECK((u & 0xffff) == 0 && (uint16_t)(u >> 16) == h[i]);
        CHECK(isnan(x[i]) == isnan(back[i]));
        if (isnormal(x[i]) && isnormal(back[i])) /* subnormals keep fewer bits */
            CHECK(fabsf(back[i] - x[i]) <= fabsf(x[i]) / 128.0f);
    }
    free(h);
    free(back);
    free(x);
}

static void zstd_in(const uint8_t *d, size_t size)
{
    if (size < 2)
        return;
    size_t n = (size_t)d[0] | (size_t)d[1] << 8;
    const uint8_t *src = d + 2;
    size_t len = size - 2;
    uint8_t *copy = xmalloc(len); /* ends where the frame ends */
    memcpy(copy, src, len);
    if (ps_codec_zstd_check(copy, len, n) == 0) {
        float *v = xmalloc(n * sizeof(float));
        uint8_t *planes = xmalloc(n * sizeof(float));
        ps_msg m = {.dt = PS_DT_F32ZSTD, .ndata = n, .packed = copy, .packed_len = len};
        char err[160];
        float mx;
        int rc = ps_codec_decode(&codec, &m, v, planes, &mx, err, sizeof err);
        CHECK(rc == 0 || rc == PS_EBAD_FIELD);
        if (rc == 0) {
            CHECK(m.dt == PS_DT_F32 && m.data == v && m.packed == NULL && isnan(mx));
            round_trip((const uint8_t *)v, n * sizeof(float));
        } else {
            CHECK(err[0] != '\0' && m.dt == PS_DT_F32ZSTD);
        }
        free(planes);
        free(v);
    }
    free(copy);
}

static void f32z_in(const uint8_t *d, size_t size)
{
    if (size < 2)
        return;
    size_t n = (size_t)d[0] | (size_t)d[1] << 8;
    size_t mb = (size_t)ps_f32z_mask_bytes(n), len = size - 2;
    if (len < mb || (len - mb) % sizeof(float))
        return;
    size_t bits = 0;
    for (size_t i = 0; i < n; i++)
        bits += (d[2 + i / 8] >> (i % 8)) & 1;
    for (size_t i = n; i < mb * 8; i++) /* padding bits clear */
        if ((d[2 + i / 8] >> (i % 8)) & 1)
            return;
    if (bits != (len - mb) / sizeof(float))
        return;
    uint8_t *src = xmalloc(len);
    memcpy(src, d + 2, len);
    float *v = xmalloc(n * sizeof(float));
    ps_msg m = {.dt = PS_DT_F32Z, .ndata = n, .packed = src, .packed_len = len, .nz = bits};
    char err[160];
    float mx;
    CHECK(ps_codec_decode(&codec, &m, v, NULL, &mx, err, sizeof err) == 0);
    CHECK(m.dt == PS_DT_F32 && m.data == v && m.nz == 0);
    /* a stored +0.0 is left out when encoded again: compare only without */
    int stored_zero = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        if (u == 0 && ((src[i / 8] >> (i % 8)) & 1))
            stored_zero = 1;
    }
    if (!stored_zero) {
        uint8_t *again = xmalloc(mb + n * sizeof(float));
        uint64_t nz;
        size_t b = ps_codec_f32z_encode(again, v, n, &nz);
        CHECK(b == len && nz == bits && memcmp(again, src, len) == 0);
        free(again);
    }
    free(v);
    free(src);
}

static void bf16_in(const uint8_t *d, size_t size)
{
    size_t n = size / sizeof(uint16_t);
    uint16_t *h = xmalloc(n * sizeof(uint16_t));
    memcpy(h, d, n * sizeof(uint16_t));
    float *v = xmalloc(n * sizeof(float));
    ps_msg m = {.dt = PS_DT_BF16, .ndata = n, .data16 = h};
    char err[160];
    float mx;
    CHECK(ps_codec_decode(&codec, &m, v, NULL, &mx, err, sizeof err) == 0);
    CHECK(m.dt == PS_DT_F32 && m.data == v && m.data16 == NULL);
    int finite = 1;
    uint16_t *again = xmalloc(n * sizeof(uint16_t));
    ps_codec_bf16_encode(again, v, n);
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(v[i]) != 0;
        if (is_nan_bf16(h[i]))
            CHECK(is_nan_bf16(again[i]));
        else
            CHECK(again[i] == h[i]);
    }
    CHECK(finite == (isfinite(mx) != 0));
    free(again);
    free(v);
    free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] & 3) {
    case 0:
        round_trip(data + 1, size - 1);
        break;
    case 1:
        zstd_in(data + 1, size - 1);
        break;
    case 2:
        f32z_in(data + 1, size - 1);
        break;
    default:
        bf16_in(data + 1, size - 1);
        break;
    }
    return 0;
}
