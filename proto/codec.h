/* codec.h - the tensor codec: a tensor's float32 values to and from each
 * form "data" takes on the wire (PROTOCOL.md section 3; ps_dtype in
 * msg.h): bfloat16 (dt 1), float32 without its zeros (dt 2) and one zstd
 * frame of the values' byte planes (dt 3). psd and libpsclient both encode
 * and decode through it, so each form and the rule for when a packed form
 * is worth sending exist once.
 *
 * It owns no buffers: every caller passes the output and the scratch it
 * keeps (a connection's widened values, psd's or the client's byte
 * planes), sized as the functions below say. The zstd contexts live in a
 * ps_codec the caller keeps and frees with ps_codec_free; each is made on
 * first use. Nothing here allocates anything from a peer's counts: the
 * decoders check a frame's stated size against the values expected before
 * the caller sizes a buffer (ps_codec_zstd_check). */
#ifndef PS_CODEC_H
#define PS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

/* zstd's contexts, made on first use. Zero-initialise; one thread at a time. */
typedef struct ps_codec {
    struct ZSTD_CCtx_s *cctx; /* compresses (dt 3 out) */
    struct ZSTD_DCtx_s *dctx; /* decompresses (dt 3 in) */
} ps_codec;

void ps_codec_free(ps_codec *cd);

/* The one rule for a packed form (dt 2 or 3) against plain float32: it is
 * sent when it saves a sixteenth of the raw bytes or more. */
static inline int ps_codec_worth(size_t packed_bytes, size_t raw_bytes)
{
    return (uint64_t)packed_bytes * 16 <= (uint64_t)raw_bytes * 15;
}

/* ---- bfloat16 (dt 1) ---- */

/* n values as bfloat16 into dst (2 n bytes): round to nearest, ties to even. */
void ps_codec_bf16_encode(uint16_t *dst, const float *src, size_t n);
/* n bfloat16 values as float32 into dst (exact). */
void ps_codec_bf16_decode(float *dst, const uint16_t *src, size_t n);

/* ---- float32 without its zeros (dt 2) ---- */

/* The bytes n values take in this form (bitmap and non-zero values),
 * counted without writing anything. */
size_t ps_codec_f32z_size(const float *src, size_t n);
/* Writes the form into dst (room for ps_f32z_mask_bytes(n) + 4 n bytes);
 * returns its bytes, with the count of values stored in *nz. */
size_t ps_codec_f32z_encode(uint8_t *dst, const float *src, size_t n, uint64_t *nz);
/* The n values back into dst; src is a bitmap and values that proto's
 * decoder checked (ps_msg_decode: as many set bits as values). */
void ps_codec_f32z_decode(float *dst, const uint8_t *src, size_t n);

/* ---- zstd frames of byte planes (dt 3) ---- */

/* Bytes a frame of n values may take: the room ps_codec_zstd_encode needs. */
size_t ps_codec_zstd_bound(size_t n);
/* Lays src's len values out as values [at, at + len) of the byte planes of
 * n values in planes (4 n bytes), so a range held in pieces (psd's model
 * blocks) is laid out piece by piece before one ps_codec_zstd_encode. */
void ps_codec_planes_put(uint8_t *planes, size_t n, size_t at, const float *src, size_t len);
/* Compresses the byte planes of n values (level 1) into dst of cap bytes
 * (ps_codec_zstd_bound(n)). 0 with the frame's bytes in *len, PS_ENOMEM
 * (no context) or PS_EIO (zstd failed) with err filled. */
int ps_codec_zstd_encode(ps_codec *cd, uint8_t *dst, size_t cap, const uint8_t *planes, size_t n, size_t *len,
                         char *err, size_t errlen);
/* 0 when src (len bytes) is one whole zstd frame whose header says it
 * holds exactly n float32 values (4 n bytes), else PS_EBAD_FIELD. Reads
 * the frame's header only: call it before sizing buffers for n values. */
int ps_codec_zstd_check(const uint8_t *src, size_t len, uint64_t n);
/* Decompresses a frame ps_codec_zstd_check accepted into planes (4 n
 * bytes of scratch) and puts the n values back together in dst. 0,
 * PS_ENOMEM (no context) or PS_EBAD_FIELD (the frame does not decompress
 * to that) with err filled. */
int ps_codec_zstd_decode(ps_codec *cd, float *dst, uint8_t *planes, const uint8_t *src, size_t len, size_t n,
                         char *err, size_t errlen);

/* ---- any form ---- */

/* m's data, of any dt, as float32 in dst (room for m->ndata values);
 * planes: 4 m->ndata bytes of scratch for dt 3 (else unused, may be NULL).
 * For dt 3 the caller has run ps_codec_zstd_check first. On return m
 * points at dst as float32 (dt 0, no packed bytes). *maxabs gets the
 * largest |value| when the decoding found it on the way (bfloat16), else
 * NAN. 0, or a negative PS_E* code with err filled (m unchanged). */
int ps_codec_decode(ps_codec *cd, ps_msg *m, float *dst, uint8_t *planes, float *maxabs, char *err,
                    size_t errlen);

#endif
