/* frame.c - frame header and msgpack structure scan (see frame.h). */
#include "frame.h"

#include <stdarg.h>
#include <stdio.h>

#include "errors.h"

void ps_frame_put_len(uint8_t *dst, uint32_t len)
{
    dst[0] = (uint8_t)(len >> 24);
    dst[1] = (uint8_t)(len >> 16);
    dst[2] = (uint8_t)(len >> 8);
    dst[3] = (uint8_t)len;
}

int ps_frame_header(const uint8_t *buf, size_t len, uint32_t max_payload, uint32_t *payload_len)
{
    if (len < PS_FRAME_HDR)
        return 0;
    uint32_t n = ((uint32_t)buf[0] << 24) | ((uint32_t)buf[1] << 16) | ((uint32_t)buf[2] << 8) | buf[3];
    *payload_len = n;
    if (n == 0)
        return PS_EMALFORMED;
    if (n > max_payload)
        return PS_ETOO_BIG;
    return 1;
}

__attribute__((format(printf, 4, 5))) static int scan_fail(char *err, size_t errlen, size_t pos, const char *fmt,
                                                            ...)
{
    if (errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(err, errlen, "at byte %zu: ", pos);
        if (n >= 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return PS_EMALFORMED;
}

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

int ps_scan(const uint8_t *p, size_t len, const ps_scan_limits *lim, char *err, size_t errlen)
{
    uint64_t left[PS_MSG_DEPTH_MAX + 1]; /* objects still to read at each level */
    uint32_t max_depth = lim->max_depth;
    if (max_depth > PS_MSG_DEPTH_MAX)
        max_depth = PS_MSG_DEPTH_MAX;
    unsigned depth = 1;
    uint64_t objects = 0;
    size_t pos = 0;

    if (errlen > 0)
        err[0] = '\0';
    left[0] = 1;
    while (depth > 0) {
        if (left[depth - 1] == 0) {
            depth--;
            continue;
        }
        left[depth - 1]--;
        if (pos >= len)
            return scan_fail(err, errlen, pos, "truncated: %llu more object(s) declared",
                             (unsigned long long)left[depth - 1] + 1);
        if (++objects > lim->max_objects)
            return scan_fail(err, errlen, pos, "more than %u objects", lim->max_objects);

        uint8_t b = p[pos];
        size_t rest = len - pos;
        uint64_t skip = 0;  /* bytes of this object, when it is no container */
        uint64_t count = 0; /* elements to read below it, when it is one */
        int container = 0;
        unsigned hdr = 1, lenbytes = 0, extra = 0;

        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            skip = 1;
        } else if (b >= 0x80 && b <= 0x8f) {
            container = 1, count = 2ULL * (b & 0x0f);
        } else if (b >= 0x90 && b <= 0x9f) {
            container = 1, count = b & 0x0f;
        } else if (b >= 0xa0 && b <= 0xbf) {
            skip = 1 + (uint64_t)(b & 0x1f);
        } else {
            switch (b) {
            case 0xc4: case 0xd9: lenbytes = 1; break;            /* bin8, str8 */
            case 0xc5: case 0xda: lenbytes = 2; break;            /* bin16, str16 */
            case 0xc6: case 0xdb: lenbytes = 4; break;            /* bin32, str32 */
            case 0xc7: lenbytes = 1, extra = 1; break;            /* ext8 */
            case 0xc8: lenbytes = 2, extra = 1; break;            /* ext16 */
            case 0xc9: lenbytes = 4, extra = 1; break;            /* ext32 */
            case 0xca: skip = 5; break;                           /* float32 */
            case 0xcb: skip = 9; break;                           /* float64 */
            case 0xcc: case 0xd0: skip = 2; break;                /* (u)int8 */
            case 0xcd: case 0xd1: skip = 3; break;                /* (u)int16 */
            case 0xce: case 0xd2: skip = 5; break;                /* (u)int32 */
            case 0xcf: case 0xd3: skip = 9; break;                /* (u)int64 */
            case 0xd4: skip = 3; break;                           /* fixext1 */
            case 0xd5: skip = 4; break;                           /* fixext2 */
            case 0xd6: skip = 6; break;                           /* fixext4 */
            case 0xd7: skip = 10; break;                          /* fixext8 */
            case 0xd8: skip = 18; break;                          /* fixext16 */
            case 0xdc: container = 1, lenbytes = 2; break;        /* array16 */
            case 0xdd: container = 1, lenbytes = 4; break;        /* array32 */
            case 0xde: container = 2, lenbytes = 2; break;        /* map16 */
            case 0xdf: container = 2, lenbytes = 4; break;        /* map32 */
            default:
                return scan_fail(err, errlen, pos, "reserved type byte 0x%02x", b);
            }
            if (lenbytes) {
                if (rest < 1u + lenbytes)
                    return scan_fail(err, errlen, pos, "truncated length field");
                uint64_t n = be(p + pos + 1, lenbytes);
                hdr = 1 + lenbytes;
                if (container)
                    count = container == 2 ? 2 * n : n;
                else
                    skip = hdr + extra + n;
            }
        }

        if (container) {
            /* this container sits at nesting level `depth` */
            if (depth > max_depth)
                return scan_fail(err, errlen, pos, "nested deeper than %u", max_depth);
            /* every element needs at least one byte */
            if (count > rest - hdr)
                return scan_fail(err, errlen, pos, "declares %llu elements in %zu remaining bytes",
                                 (unsigned long long)count, rest - hdr);
            pos += hdr;
            if (count > 0)
                left[depth++] = count; /* depth <= max_depth <= PS_MSG_DEPTH_MAX */
        } else {
            if (skip > rest)
                return scan_fail(err, errlen, pos, "object of %llu bytes in %zu remaining",
                                 (unsigned long long)skip, rest);
            pos += (size_t)skip;
        }
    }
    if (pos != len)
        return scan_fail(err, errlen, pos, "%zu trailing bytes after the message", len - pos);
    return 0;
}
