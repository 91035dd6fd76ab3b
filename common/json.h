/* json.h - JSON text shared by psd (the dashboard's JSON, history.c) and
 * psctl (--json output, the safetensors header it writes, safetensors.c):
 * a string escaped once, raw text, and a msgpack object as JSON
 * (json.c). Each appends to a ps_buf and returns 0 or PS_ENOMEM. */
#ifndef PS_JSON_H
#define PS_JSON_H

#include <stddef.h>

#include "proto/msg.h"

/* What ps_json_str does with bytes of 0x80 and above: */
#define PS_JSON_UTF8 0  /* kept as they are (text that is UTF-8) */
#define PS_JSON_ASCII 1 /* each shown as '?' (texts meant to be ASCII) */

/* Appends s[0..n) to b as a JSON string: quotes, '"' and '\' escaped,
 * control characters and DEL as \u00XX. 0, or PS_ENOMEM (b then holds a
 * part of it). */
int ps_json_str(ps_buf *b, const char *s, size_t n, int high);

/* Appends the text s as it is (punctuation, a literal). */
int ps_json_raw(ps_buf *b, const char *s);

/* Appends o as JSON: nil null, booleans, integers, floats (%.17g; null
 * when not finite), strings (UTF-8 kept), arrays, maps (", " and ": "
 * between items); a map key that is not a string is written "?", any
 * other type (bin, ext) null. Nesting is the caller's to bound (psd's
 * frames are scanned before they are unpacked). */
int ps_json_msgpack(ps_buf *b, const msgpack_object *o);

#endif
