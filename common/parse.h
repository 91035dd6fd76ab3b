/* parse.h - integers from text, as the programs' options and settings take
 * them: the one rule for psworker's flags, libpsclient's options, psctl's
 * flags, host:port and psd's settings (server/config/config_value.c). */
#ifndef PS_COMMON_PARSE_H
#define PS_COMMON_PARSE_H

#include <stdint.h>

/* What the parsers return besides 0. */
#define PS_PARSE_SYNTAX (-1) /* not a number of the form asked for */
#define PS_PARSE_RANGE (-2)  /* a number, but over the bound (or over 64 bits) */

/* Reads the decimal digits at the start of s (one at least; no sign, no
 * spaces) and sets *end just past them, however many there are. Returns 0
 * with the value in *out; PS_PARSE_SYNTAX (nothing set) when s is NULL or
 * does not start with a digit; PS_PARSE_RANGE when the digits are over
 * UINT64_MAX (*end set, *out untouched). For a number with a suffix
 * ("64m"): the caller reads on from *end. */
int ps_parse_u64_head(const char *s, uint64_t *out, const char **end);

/* Parses s, decimal digits only (no sign, no spaces, nothing after them),
 * as a value of 0..max into *out. Returns 0; PS_PARSE_SYNTAX for NULL,
 * empty or anything but digits; PS_PARSE_RANGE for digits whose value is
 * over max. *out is left alone unless 0 is returned. */
int ps_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* As ps_parse_u64 for a signed value: an optional '+' or '-' directly
 * before the digits. PS_PARSE_RANGE for a value outside int64_t. */
int ps_parse_i64(const char *s, int64_t *out);

#endif
