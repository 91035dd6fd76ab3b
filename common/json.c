/* json.c - a JSON string, escaped (json.h): the one escaper of psd and
 * psctl. Owns nothing. */
#include "common/json.h"

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
