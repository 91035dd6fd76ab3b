/* test_codec.c - the tensor codec of proto/codec.c, which psd and
 * libpsclient share: the one rule for when a packed form is worth sending
 * (a sixteenth saved), zstd frames of byte planes laid out in pieces and
 * decoded whole, frames refused before anything is sized for them (a
 * wrong count, two frames, trailing bytes, a body that does not
 * decompress), and ps_codec_decode turning each dt into float32. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"
#include "proto/errors.h"

#define N 3000

static void test_worth(void **state)
{
    (void)state;
    assert_true(ps_codec_worth(15, 16));
    assert_false(ps_codec_worth(16, 16));
    assert_true(ps_codec_worth(3750, 4000));  /* exactly a sixteenth saved */
    assert_false(ps_codec_worth(3751, 4000));
    assert_true(ps_codec_worth(0, 0));
    /* no overflow for sizes past 4 GiB */
    assert_true(ps_codec_worth((size_t)15 << 32, (size_t)16 << 32));
    assert_false(ps_codec_worth(((size_t)15 << 32) + 1, (size_t)16 << 32));
}

static float *ramp(void)
{
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    for (int i = 0; i < N; i++)
        x[i] = i % 7 ? (float)(i % 50) / 8.0f : 0.0f;
    return x;
}

/* A frame of x made in three pieces, into *len bytes (the caller frees). */
static uint8_t *frame_of(ps_codec *cd, const float *x, size_t *len)
{
    uint8_t *planes = malloc(N * sizeof(float));
    size_t cap = ps_codec_zstd_bound(N);
    uint8_t *f = malloc(cap + 8);
    char err[128];
    assert_non_null(planes);
    assert_non_null(f);
    ps_codec_planes_put(planes, N, 0, x, 1000);
    ps_codec_planes_put(planes, N, 1000, x + 1000, 1500);
    ps_codec_planes_put(planes, N, 2500, x + 2500, N - 2500);
    assert_int_equal(ps_codec_zstd_encode(cd, f, cap, planes, N, len, err, sizeof err), 0);
    free(planes);
    return f;
}

static void test_zstd(void **state)
{
    (void)state;
    ps_codec cd = {0};
    float *x = ramp(), *back = calloc(N, sizeof(float));
    uint8_t *planes = malloc(N * sizeof(float));
    size_t len;
    uint8_t *f = frame_of(&cd, x, &len);
    char err[160];
    assert_true(ps_codec_worth(len, N * sizeof(float))); /* it repeats: worth it */
    assert_int_equal(ps_codec_zstd_check(f, len, N), 0);
    assert_int_equal(ps_codec_zstd_check(f, len, N - 1), PS_EBAD_FIELD);
    assert_int_equal(ps_codec_zstd_check(f, len, N + 1), PS_EBAD_FIELD);
    assert_int_equal(ps_codec_zstd_check(f, len - 1, N), PS_EBAD_FIELD); /* cut short */
    f[len] = 0;
    assert_int_equal(ps_codec_zstd_check(f, len + 1, N), PS_EBAD_FIELD); /* a byte after it */
    assert_int_equal(ps_codec_zstd_decode(&cd, back, planes, f, len, N, err, sizeof err), 0);
    assert_memory_equal(back, x, N * sizeof(float));

    /* the same frame through ps_codec_decode, as psd and libpsclient call it */
    memset(back, 0, N * sizeof(float));
    ps_msg m = {.dt = PS_DT_F32ZSTD, .ndata = N, .packed = f, .packed_len = len};
    float mx;
    assert_int_equal(ps_codec_decode(&cd, &m, back, planes, &mx, err, sizeof err), 0);
    assert_int_equal(m.dt, PS_DT_F32);
    assert_ptr_equal(m.data, back);
    assert_null(m.packed);
    assert_true(isnan(mx)); /* not found on the way for this form */
    assert_memory_equal(back, x, N * sizeof(float));

    /* a body that does not decompress: refused, m left as it was */
    f[len / 2] ^= 0xff;
    f[len / 2 + 1] ^= 0x5a;
    ps_msg bad = {.dt = PS_DT_F32ZSTD, .ndata = N, .packed = f, .packed_len = len};
    int rc = ps_codec_decode(&cd, &bad, back, planes, &mx, err, sizeof err);
    if (rc != 0) { /* a flipped byte may still decode (a literal); then nothing to check */
        assert_int_equal(rc, PS_EBAD_FIELD);
        assert_int_equal(bad.dt, PS_DT_F32ZSTD);
        assert_ptr_equal(bad.packed, f);
        assert_non_null(strstr(err, "does not decompress"));
    }
    ps_codec_free(&cd);
    ps_codec_free(&cd); /* twice is harmless */
    free(f);
    free(planes);
    free(back);
    free(x);
}

static void test_f32z_and_bf16(void **state)
{
    (void)state;
    ps_codec cd = {0};
    float *x = ramp(), *back = calloc(N, sizeof(float));
    uint8_t *z = malloc(ps_f32z_mask_bytes(N) + N * sizeof(float));
    uint64_t nz;
    size_t bytes = ps_codec_f32z_encode(z, x, N, &nz);
    size_t zeros = 0;
    for (int i = 0; i < N; i++)
        zeros += x[i] == 0.0f;
    assert_int_equal(nz, N - zeros);
    assert_int_equal(bytes, ps_codec_f32z_size(x, N));
    assert_int_equal(bytes, ps_f32z_mask_bytes(N) + nz * sizeof(float));
    ps_msg m = {.dt = PS_DT_F32Z, .ndata = N, .packed = z, .packed_len = bytes, .nz = nz};
    float mx;
    char err[128];
    assert_int_equal(ps_codec_decode(&cd, &m, back, NULL, &mx, err, sizeof err), 0);
    assert_int_equal(m.dt, PS_DT_F32);
    assert_int_equal(m.nz, 0);
    assert_memory_equal(back, x, N * sizeof(float));

    uint16_t h[4];
    const float v[4] = {1.0f, -2.5f, 1.00390625f /* a tie: to even, 1.0 */, 65536.0f};
    ps_codec_bf16_encode(h, v, 4);
    assert_int_equal(h[0], 0x3f80);
    assert_int_equal(h[2], 0x3f80);
    ps_msg b = {.dt = PS_DT_BF16, .ndata = 4, .data16 = h};
    assert_int_equal(ps_codec_decode(&cd, &b, back, NULL, &mx, err, sizeof err), 0);
    assert_int_equal(b.dt, PS_DT_F32);
    assert_null(b.data16);
    assert_true(back[1] == -2.5f && back[2] == 1.0f && back[3] == 65536.0f);
    assert_true(mx == 65536.0f); /* the largest magnitude, found on the way */
    float plain[4];
    ps_codec_bf16_decode(plain, h, 4);
    assert_memory_equal(plain, back, sizeof plain);

    ps_msg f = {.dt = PS_DT_F32, .ndata = 4, .data = v};
    assert_int_equal(ps_codec_decode(&cd, &f, back, NULL, &mx, err, sizeof err), 0);
    assert_ptr_equal(f.data, v); /* float32 stays where it is */
    free(z);
    free(back);
    free(x);
    ps_codec_free(&cd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worth),
        cmocka_unit_test(test_zstd),
        cmocka_unit_test(test_f32z_and_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
