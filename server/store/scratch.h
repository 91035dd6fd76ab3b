/* scratch.h - psd's tensor codec state (scratch.c): the zstd contexts,
 * the byte-plane scratch that decoding a compressed push (dispatch) and
 * encoding a compressed reply (connection) use, on the loop, one at a
 * time, and the float32 buffer a table push's packed rows widen into. The store layer owns them; the others get them through these
 * functions and pass them to proto's codec (proto/codec.h). */
#ifndef SRV_STORE_SCRATCH_H
#define SRV_STORE_SCRATCH_H

#include "proto/codec.h"
#include "server/store/psd.h"

/* psd's zstd contexts (made on first use by the codec). */
ps_codec *srv_codec(psd *s);
/* Byte-plane scratch with room for bytes (grown, kept), or NULL when out
 * of memory. */
uint8_t *srv_planes(psd *s, size_t bytes);
/* Room for n float32 values of a table push's row gradients widened from
 * bfloat16 or a packed form (dispatch, on the loop; used before the
 * handler returns), or NULL when out of memory. */
float *srv_rows_wide(psd *s, size_t n);
/* Room for the keys of a table request in a worker's table segment,
 * copied out of it (dispatch, on the loop; used before the handler
 * returns), or NULL when out of memory. */
uint8_t *srv_seg_keys(psd *s, size_t bytes);
/* Frees them all (at exit). */
void srv_codec_free(psd *s);

#endif
