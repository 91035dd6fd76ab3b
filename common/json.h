/* json.h - JSON text shared by psd (the dashboard's JSON, history.c) and
 * psctl (--json output, the safetensors header it writes): a string,
 * escaped once (json.c). */
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

#endif
