/* json.c - JSON text (json.h): the one string escaper of psd and psctl,
 * and psctl's msgpack-to-JSON printer. Owns nothing. */
#include "common/json.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "proto/errors.h"

int ps_json_str(ps_buf *b, const char *s, size_t n, int high)
{
    static const char hex[] = "0123456789abcdef";
    if (ps_buf_reserve(b, n * 6 + 2) != 0)
        return PS_ENOMEM;
    uint8_t *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            *o++ = '\\';
            *o++ = ch;
        } else if (ch < 0x20 || ch == 0x7f) {
            *o++ = '\\', *o++ = 'u', *o++ = '0', *o++ = '0';
            *o++ = (uint8_t)hex[ch >> 4];
            *o++ = (uint8_t)hex[ch & 15];
        } else if (ch >= 0x80 && high == PS_JSON_ASCII) {
            *o++ = '?';
        } else {
            *o++ = ch;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return 0;
}

int ps_json_raw(ps_buf *b, const char *s)
{
    size_t n = strlen(s);
    if (ps_buf_reserve(b, n + 1) != 0)
        return PS_ENOMEM;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

int ps_json_msgpack(ps_buf *b, const msgpack_object *o)
{
    int rc = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return ps_json_raw(b, "null");
    case MSGPACK_OBJECT_BOOLEAN:
        return ps_json_raw(b, o->via.boolean ? "true" : "false");
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return ps_buf_printf(b, "%" PRIu64, o->via.u64) ? PS_ENOMEM : 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return ps_buf_printf(b, "%" PRId64, o->via.i64) ? PS_ENOMEM : 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return ps_json_raw(b, "null");
        return ps_buf_printf(b, "%.17g", o->via.f64) ? PS_ENOMEM : 0;
    case MSGPACK_OBJECT_STR:
        return ps_json_str(b, o->via.str.ptr, o->via.str.size, PS_JSON_UTF8);
    case MSGPACK_OBJECT_ARRAY:
        rc = ps_json_raw(b, "[");
        for (uint32_t i = 0; i < o->via.array.size && rc == 0; i++) {
            if (i)
                rc = ps_json_raw(b, ", ");
            if (rc == 0)
                rc = ps_json_msgpack(b, &o->via.array.ptr[i]);
        }
        return rc ? rc : ps_json_raw(b, "]");
    case MSGPACK_OBJECT_MAP:
        rc = ps_json_raw(b, "{");
        for (uint32_t i = 0; i < o->via.map.size && rc == 0; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (i)
                rc = ps_json_raw(b, ", ");
            if (rc == 0)
                rc = kv->key.type == MSGPACK_OBJECT_STR
                         ? ps_json_str(b, kv->key.via.str.ptr, kv->key.via.str.size, PS_JSON_UTF8)
                         : ps_json_raw(b, "\"?\"");
            if (rc == 0)
                rc = ps_json_raw(b, ": ");
            if (rc == 0)
                rc = ps_json_msgpack(b, &kv->val);
        }
        return rc ? rc : ps_json_raw(b, "}");
    default:
        return ps_json_raw(b, "null");
    }
}
