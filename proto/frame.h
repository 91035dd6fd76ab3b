/* frame.h - length-prefixed framing and the structure scan that runs before
 * any msgpack unpacking.
 *
 * A frame is a 4-byte big-endian payload length followed by that many bytes
 * holding exactly one msgpack object. Readers check the length against their
 * limit before allocating anything, then scan the payload's structure
 * (ps_scan) before msgpack-c's unpacker sees it: msgpack-c sizes allocations
 * from the element counts a peer declares, so a few bytes could otherwise ask
 * for gigabytes (msgpack-c issue #1013). */
#ifndef PS_FRAME_H
#define PS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "ps_limits.h"

/* Writes the 4-byte length prefix for a payload of len bytes. */
void ps_frame_put_len(uint8_t *dst, uint32_t len);

/* Inspects the first bytes of a stream. Returns 0 when fewer than
 * PS_FRAME_HDR bytes are present, 1 with *payload_len set when the header is
 * complete and 0 < length <= max_payload, PS_ETOO_BIG when the length is
 * over max_payload and PS_EMALFORMED when it is zero. Never reads past len. */
int ps_frame_header(const uint8_t *buf, size_t len, uint32_t max_payload, uint32_t *payload_len);

/* Limits applied by ps_scan. */
typedef struct ps_scan_limits {
    uint32_t max_depth;   /* deepest array/map nesting (top level is depth 1) */
    uint32_t max_objects; /* most msgpack objects, containers included */
} ps_scan_limits;

/* Checks that p[0..len) is exactly one well-formed msgpack object: every
 * declared str/bin/ext length and array/map count fits in the bytes that
 * remain, nesting and object count are within lim, no reserved byte (0xc1)
 * and no trailing bytes. Returns 0 or PS_EMALFORMED with a reason in err
 * (always NUL-terminated when errlen > 0). Runs in O(len) with no allocation;
 * after it returns 0, msgpack-c's unpacker allocates at most about
 * max_objects * sizeof(msgpack_object) for this payload. */
int ps_scan(const uint8_t *p, size_t len, const ps_scan_limits *lim, char *err, size_t errlen);

#endif
