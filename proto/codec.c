/* codec.c - the tensor codec (codec.h): each wire form of a tensor's data
 * encoded and decoded once, for psd and libpsclient alike. The loops are
 * vec.c's kernels (bfloat16, the zeros bitmap, byte planes); the frames are
 * zstd's. Owns nothing but the zstd contexts in a caller's ps_codec. */
#include <math.h>
#include <stdio.h>
#include <zstd.h>

#include "proto/codec.h"
#include "proto/errors.h"
#include "proto/vec.h"

void ps_codec_free(ps_codec *cd)
{
    ZSTD_freeCCtx(cd->cctx);
    ZSTD_freeDCtx(cd->dctx);
    cd->cctx = NULL;
    cd->dctx = NULL;
}

void ps_codec_bf16_encode(uint16_t *dst, const float *src, size_t n)
{
    ps_bf16_from_f32(dst, src, n);
}

void ps_codec_bf16_decode(float *dst, const uint16_t *src, size_t n)
{
    ps_bf16_to_f32(dst, src, n);
}

size_t ps_codec_f32z_size(const float *src, size_t n)
{
    return (size_t)ps_f32z_mask_bytes(n) + (n - ps_f32z_count_zeros(src, n)) * sizeof(float);
}

size_t ps_codec_f32z_encode(uint8_t *dst, const float *src, size_t n, uint64_t *nz)
{
    size_t mb = (size_t)ps_f32z_mask_bytes(n);
    size_t k = ps_f32z_pack(dst, (float *)(void *)(dst + mb), src, n);
    *nz = k;
    return mb + k * sizeof(float);
}

void ps_codec_f32z_decode(float *dst, const uint8_t *src, size_t n)
{
    ps_f32z_expand(dst, src, (const float *)(const void *)(src + ps_f32z_mask_bytes(n)), n);
}

size_t ps_codec_zstd_bound(size_t n)
{
    return ZSTD_compressBound(n * sizeof(float));
}

void ps_codec_planes_put(uint8_t *planes, size_t n, size_t at, const float *src, size_t len)
{
    ps_shuffle4_at(planes, n, at, src, len);
}

int ps_codec_zstd_encode(ps_codec *cd, uint8_t *dst, size_t cap, const uint8_t *planes, size_t n, size_t *len,
                         char *err, size_t errlen)
{
    size_t raw = n * sizeof(float);
    if (!cd->cctx && !(cd->cctx = ZSTD_createCCtx())) {
        snprintf(err, errlen, "out of memory for a compressor");
        return PS_ENOMEM;
    }
    size_t got = ZSTD_compressCCtx(cd->cctx, dst, cap, planes, raw, 1);
    if (ZSTD_isError(got)) {
        snprintf(err, errlen, "cannot compress %zu bytes: %s", raw, ZSTD_getErrorName(got));
        return PS_EIO;
    }
    *len = got;
    return 0;
}

int ps_codec_zstd_check(const uint8_t *src, size_t len, uint64_t n)
{
    unsigned long long fsize = ZSTD_getFrameContentSize(src, len);
    size_t whole = ZSTD_findFrameCompressedSize(src, len);
    return fsize == n * sizeof(float) && !ZSTD_isError(whole) && whole == len ? 0 : PS_EBAD_FIELD;
}

int ps_codec_zstd_decode(ps_codec *cd, float *dst, uint8_t *planes, const uint8_t *src, size_t len, size_t n,
                         char *err, size_t errlen)
{
    size_t want = n * sizeof(float);
    if (!cd->dctx && !(cd->dctx = ZSTD_createDCtx())) {
        snprintf(err, errlen, "out of memory for a decompressor");
        return PS_ENOMEM;
    }
    size_t got = ZSTD_decompressDCtx(cd->dctx, planes, want, src, len);
    if (ZSTD_isError(got) || got != want) {
        snprintf(err, errlen, "compressed data (dt 3) does not decompress to its %zu float32 values: %s", n,
                 ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
        return PS_EBAD_FIELD;
    }
    ps_unshuffle4(dst, planes, n);
    return 0;
}

int ps_codec_decode(ps_codec *cd, ps_msg *m, float *dst, uint8_t *planes, float *maxabs, char *err, size_t errlen)
{
    size_t n = (size_t)m->ndata;
    *maxabs = NAN;
    switch (m->dt) {
    case PS_DT_F32:
        return 0;
    case PS_DT_BF16:
        /* widened and its largest magnitude found in one pass */
        *maxabs = ps_bf16_to_f32_maxabs(dst, m->data16, n);
        m->data16 = NULL;
        break;
    case PS_DT_F32Z:
        ps_codec_f32z_decode(dst, m->packed, n);
        m->nz = 0;
        break;
    case PS_DT_F32ZSTD: {
        int rc = ps_codec_zstd_decode(cd, dst, planes, m->packed, (size_t)m->packed_len, n, err, errlen);
        if (rc != 0)
            return rc;
        break;
    }
    default:
        snprintf(err, errlen, "unknown element type %u", m->dt);
        return PS_EBAD_FIELD;
    }
    m->packed = NULL;
    m->data = dst;
    m->dt = PS_DT_F32;
    return 0;
}
