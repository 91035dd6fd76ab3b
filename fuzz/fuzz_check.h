/* fuzz_check.h - what the fuzz targets assert about a decoded message.
 *
 * The checks come from proto/PROTOCOL.md (the spec), not from msg.c, so that
 * a decoder that accepts what the spec forbids is a finding. A failed check
 * prints what it found and aborts, which libFuzzer reports as a crash with
 * the input saved. FUZZ_CHECK works whatever NDEBUG says (RelWithDebInfo
 * defines it and would turn assert() into nothing). */
#ifndef PS_FUZZ_CHECK_H
#define PS_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/msg.h"

#define FUZZ_CHECK(cond, ...)                                                     \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* Reads every byte of p[0..n) into a sink, so that a pointer or length the
 * decoder got wrong is a read AddressSanitizer sees. */
void fuzz_touch(const void *p, size_t n);

/* Checks a return code of ps_msg_decode that is not 0: one of the codes
 * msg.h promises, with a NUL-terminated, non-empty reason in err. */
void fuzz_check_decode_error(int rc, const char *err, size_t errlen);

/* Checks a message that ps_msg_decode accepted from payload[0..len) against
 * the spec: type, required fields, value ranges, layout, and that the
 * tensor data is 4-byte aligned and lies inside the payload. Touches every
 * byte the message points at. */
void fuzz_check_msg(const ps_msg *m, const uint8_t *payload, size_t len);

#endif
