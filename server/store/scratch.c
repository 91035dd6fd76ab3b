/* scratch.c - psd's tensor codec state (scratch.h): owns psd.codec (the
 * zstd contexts), psd.planes (the byte-plane scratch), psd.rows_wide and
 * psd.seg_keys. */
#include <stdlib.h>

#include "server/store/scratch.h"

ps_codec *srv_codec(psd *s)
{
    return &s->codec;
}

uint8_t *srv_planes(psd *s, size_t bytes)
{
    if (s->planes_cap < bytes) {
        uint8_t *p = realloc(s->planes, bytes);
        if (!p)
            return NULL;
        s->planes = p;
        s->planes_cap = bytes;
    }
    return s->planes;
}

float *srv_rows_wide(psd *s, size_t n)
{
    if (s->rows_wide_cap < n) {
        float *p = realloc(s->rows_wide, n * sizeof *p);
        if (!p)
            return NULL;
        s->rows_wide = p;
        s->rows_wide_cap = n;
    }
    return s->rows_wide;
}

uint8_t *srv_seg_keys(psd *s, size_t bytes)
{
    if (s->seg_keys_cap < bytes) {
        uint8_t *p = realloc(s->seg_keys, bytes);
        if (!p)
            return NULL;
        s->seg_keys = p;
        s->seg_keys_cap = bytes;
    }
    return s->seg_keys;
}

void srv_codec_free(psd *s)
{
    free(s->seg_keys);
    s->seg_keys = NULL;
    s->seg_keys_cap = 0;
    free(s->rows_wide);
    s->rows_wide = NULL;
    s->rows_wide_cap = 0;
    ps_codec_free(&s->codec);
    free(s->planes);
    s->planes = NULL;
    s->planes_cap = 0;
}
