/* fuzz_frame.c - libFuzzer target: a connection's byte stream, framed and
 * decoded the way psd's server/net.c does it.
 *
 * Input: one selector byte, then the bytes a peer sends. The selector picks
 * psd's max_frame setting for after the hello (bits 0-1: 4 KiB, the
 * smallest allowed; 64 KiB; 64 MiB, the default; 2 GiB - 1, the hard limit).
 * The stream is cut into frames with ps_frame_header, using the pre-hello
 * limit (PS_FRAME_MAX_PREAUTH) until a HELLO of protocol version 1 has
 * decoded. Each complete frame is decoded with ps_msg_decode and psd's scan
 * limits into one msgpack_zone that lives as long as the connection and is
 * cleared before every message, as psd does. As psd, a bad frame header
 * ends the stream, and so does anything but a version 1 HELLO before the
 * hello; after it a bad message costs only itself. This is psd without a
 * token_file: with one, the pre-hello limit would last until the AUTH.
 *
 * Every payload is copied into a heap block that ends exactly where the
 * payload ends, at the same offset modulo 4 as in the stream (so the
 * decoder's data alignment sees the misalignments a real read buffer has),
 * and AddressSanitizer sees any read past the frame. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "proto/errors.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/ps_limits.h"

static const uint32_t max_frames[4] = {4096, 64u << 10, 64u << 20, PS_FRAME_MAX_HARD};

static msgpack_zone zone;   /* the connection's zone, as srv_conn.zone */
static ps_layout layout;    /* where a hello's layout lands, as psd.scratch_layout */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (!msgpack_zone_init(&zone, 4096))
        abort();
    return 0;
}

/* ps_frame_header on a heap copy of exactly the bytes available when fewer
 * than a header remain, so that a read past them is caught. */
static int header(const uint8_t *p, size_t avail, uint32_t limit, uint32_t *plen)
{
    if (avail >= PS_FRAME_HDR)
        return ps_frame_header(p, avail, limit, plen);
    uint8_t *copy = malloc(avail ? avail : 1);
    if (!copy)
        abort();
    memcpy(copy, p, avail);
    int rc = ps_frame_header(copy, avail, limit, plen);
    free(copy);
    FUZZ_CHECK(rc == 0, "header of %zu bytes gave %d", avail, rc);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t max_frame = max_frames[data[0] & 3];
    const uint8_t *s = data + 1;
    size_t n = size - 1, pos = 0;
    int hello = 0;

    for (;;) {
        uint32_t limit = hello ? max_frame : PS_FRAME_MAX_PREAUTH;
        uint32_t plen = 0;
        int rc = header(s + pos, n - pos, limit, &plen);
        if (rc == 0)
            break; /* wait for more bytes: the stream ends here */
        if (rc < 0) {
            FUZZ_CHECK((rc == PS_EMALFORMED && plen == 0) || (rc == PS_ETOO_BIG && plen > limit),
                       "header code %d for length %u (limit %u)", rc, plen, limit);
            break; /* psd answers with an ERROR and closes */
        }
        FUZZ_CHECK(rc == 1 && plen >= 1 && plen <= limit, "header 1 for length %u (limit %u)", plen, limit);
        if (n - pos - PS_FRAME_HDR < plen)
            break; /* incomplete frame */

        size_t at = pos + PS_FRAME_HDR, shift = (at + 1) % 4; /* +1: the selector byte */
        uint8_t *block = malloc(shift + plen);
        if (!block)
            abort();
        uint8_t *payload = block + shift;
        memcpy(payload, s + at, plen);

        ps_msg m;
        char err[256];
        msgpack_zone_clear(&zone);
        ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
        rc = ps_msg_decode(payload, plen, &lim, &zone, &m, &layout, err, sizeof err);
        if (rc != 0) {
            fuzz_check_decode_error(rc, err, sizeof err);
            free(block);
            if (!hello)
                break; /* before the hello a bad message ends the connection */
        } else {
            fuzz_check_msg(&m, payload, plen);
            if (m.has & PS_F_LAYOUT) {
                char desc[512];
                ps_layout_describe(m.layout, desc, sizeof desc); /* psd logs it */
                FUZZ_CHECK(memchr(desc, '\0', sizeof desc) != NULL, "describe did not terminate");
            }
            int ok = m.type == PS_MSG_HELLO && m.proto == PS_PROTO_VERSION;
            free(block);
            if (!hello && !ok)
                break; /* psd answers STATE or UNSUPPORTED and closes */
            hello = 1;
        }
        pos = at + plen;
    }
    return 0;
}
