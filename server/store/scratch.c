/* scratch.c - psd's tensor codec state (scratch.h): owns psd.codec (the
 * zstd contexts) and psd.planes (the byte-plane scratch). */
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

void srv_codec_free(psd *s)
{
    ps_codec_free(&s->codec);
    free(s->planes);
    s->planes = NULL;
    s->planes_cap = 0;
}
