/* parse.h - numbers from text, as the programs' options and settings take
 * them: one rule for psworker's flags and libpsclient's options. */
#ifndef PS_COMMON_PARSE_H
#define PS_COMMON_PARSE_H

#include <stdint.h>

/* Parses s, decimal digits only (no sign, no spaces, nothing after them),
 * as a value of 0..max into *out. Returns 0, or -1 (and leaves *out alone)
 * for NULL, empty, anything but digits, or a value over max. */
int ps_parse_u64(const char *s, uint64_t max, uint64_t *out);

#endif
