/* test_proto.c - the wire code in proto/: frame header, structure scan,
 * encode/decode of every message (float32 and bfloat16 tensors), decode
 * errors, layouts, error names, and
 * random input fed to the decoder.
 *
 * Hostile and hand-made frames are built with the small msgpack writer below
 * (mp_*), not with msgpack-c's packer, so that the decoder is checked against
 * an encoder other than the one psd uses. Every buffer handed to ps_scan or
 * ps_msg_decode is a heap block of exactly the tested length, so that a read
 * past its end is caught by AddressSanitizer (PSD_SANITIZE=ON). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/frame.h"
#include "proto/layout.h"
#include "proto/msg.h"
#include "proto/ps_limits.h"

#define assert_msg_has(msg, needle)                                                                                \
    do {                                                                                                           \
        if (strstr((msg), (needle)) == NULL)                                                                       \
            fail_msg("message \"%s\" lacks \"%s\"", (msg), (needle));                                             \
    } while (0)

/* ---- a small msgpack writer, independent of msgpack-c -------------------- */

#define MPW_CAP (1u << 17)

typedef struct mpw {
    _Alignas(16) uint8_t b[MPW_CAP];
    size_t n;
} mpw;

static mpw *mpw_new(void)
{
    mpw *w = calloc(1, sizeof *w);
    assert_non_null(w);
    return w;
}

static void mp_raw(mpw *w, const void *p, size_t n)
{
    assert_true(w->n + n <= MPW_CAP);
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void mp_u8(mpw *w, uint8_t v)
{
    mp_raw(w, &v, 1);
}

static void mp_be(mpw *w, uint64_t v, unsigned nbytes)
{
    for (unsigned i = nbytes; i-- > 0;)
        mp_u8(w, (uint8_t)(v >> (8 * i)));
}

static void mp_uint(mpw *w, uint64_t v)
{
    if (v <= 0x7f)
        mp_u8(w, (uint8_t)v);
    else if (v <= 0xff)
        mp_u8(w, 0xcc), mp_be(w, v, 1);
    else if (v <= 0xffff)
        mp_u8(w, 0xcd), mp_be(w, v, 2);
    else if (v <= 0xffffffffu)
        mp_u8(w, 0xce), mp_be(w, v, 4);
    else
        mp_u8(w, 0xcf), mp_be(w, v, 8);
}

static void mp_int(mpw *w, int64_t v)
{
    if (v >= 0)
        mp_uint(w, (uint64_t)v);
    else if (v >= -32)
        mp_u8(w, (uint8_t)(0xe0 | (v & 0x1f)));
    else if (v >= INT8_MIN)
        mp_u8(w, 0xd0), mp_be(w, (uint64_t)v, 1);
    else if (v >= INT16_MIN)
        mp_u8(w, 0xd1), mp_be(w, (uint64_t)v, 2);
    else if (v >= INT32_MIN)
        mp_u8(w, 0xd2), mp_be(w, (uint64_t)v, 4);
    else
        mp_u8(w, 0xd3), mp_be(w, (uint64_t)v, 8);
}

static void mp_f32(mpw *w, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    mp_u8(w, 0xca), mp_be(w, u, 4);
}

static void mp_f64(mpw *w, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    mp_u8(w, 0xcb), mp_be(w, u, 8);
}

static void mp_nil(mpw *w)
{
    mp_u8(w, 0xc0);
}

static void mp_bool(mpw *w, int b)
{
    mp_u8(w, b ? 0xc3 : 0xc2);
}

static void mp_strn(mpw *w, const char *s, size_t n)
{
    if (n <= 31)
        mp_u8(w, (uint8_t)(0xa0 | n));
    else if (n <= 0xff)
        mp_u8(w, 0xd9), mp_be(w, n, 1);
    else if (n <= 0xffff)
        mp_u8(w, 0xda), mp_be(w, n, 2);
    else
        mp_u8(w, 0xdb), mp_be(w, n, 4);
    mp_raw(w, s, n);
}

static void mp_str(mpw *w, const char *s)
{
    mp_strn(w, s, strlen(s));
}

/* bin with the given header: 0 = smallest, 0xc4 / 0xc5 / 0xc6 = forced. */
static void mp_bin(mpw *w, const void *p, size_t n, uint8_t fmt)
{
    if (fmt == 0)
        fmt = n <= 0xff ? 0xc4 : n <= 0xffff ? 0xc5 : 0xc6;
    mp_u8(w, fmt);
    mp_be(w, n, fmt == 0xc4 ? 1 : fmt == 0xc5 ? 2 : 4);
    mp_raw(w, p, n);
}

static void mp_array(mpw *w, uint32_t n)
{
    if (n <= 15)
        mp_u8(w, (uint8_t)(0x90 | n));
    else if (n <= 0xffff)
        mp_u8(w, 0xdc), mp_be(w, n, 2);
    else
        mp_u8(w, 0xdd), mp_be(w, n, 4);
}

static void mp_map(mpw *w, uint32_t n)
{
    if (n <= 15)
        mp_u8(w, (uint8_t)(0x80 | n));
    else if (n <= 0xffff)
        mp_u8(w, 0xde), mp_be(w, n, 2);
    else
        mp_u8(w, 0xdf), mp_be(w, n, 4);
}

/* ---- decoding helpers ------------------------------------------------------ */

static msgpack_zone zone;
static ps_layout lay;
static char err[512];
static const ps_scan_limits default_lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};

/* A heap copy of exactly n bytes, so that ASan sees any read past the end. */
static uint8_t *heapdup(const void *p, size_t n)
{
    uint8_t *q = malloc(n ? n : 1);
    assert_non_null(q);
    if (n)
        memcpy(q, p, n);
    return q;
}

/* Decodes p[0..n) in place with the default limits. */
static int dec_inplace(uint8_t *p, size_t n, ps_msg *m)
{
    msgpack_zone_clear(&zone);
    memset(err, 'X', sizeof err);
    err[sizeof err - 1] = '\0';
    return ps_msg_decode(p, n, &default_lim, &zone, m, &lay, err, sizeof err);
}

/* Decodes a heap copy of w's bytes; the copy is freed (so m's pointers are
 * not used afterwards). */
static int dec_copy(const mpw *w, ps_msg *m)
{
    uint8_t *p = heapdup(w->b, w->n);
    int rc = dec_inplace(p, w->n, m);
    free(p);
    return rc;
}

static int scan_copy(const void *b, size_t n, const ps_scan_limits *lim)
{
    uint8_t *p = heapdup(b, n);
    memset(err, 'X', sizeof err);
    err[sizeof err - 1] = '\0';
    int rc = ps_scan(p, n, lim, err, sizeof err);
    free(p);
    return rc;
}

static int group_setup(void **state)
{
    (void)state;
    return msgpack_zone_init(&zone, 4096) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    msgpack_zone_destroy(&zone);
    return 0;
}

/* A small layout used by several tests: w[2,3] b[3]. */
static void small_layout(ps_layout *l)
{
    ps_layout_init(l);
    assert_int_equal(ps_layout_add(l, "w", 2, (const uint32_t[]){2, 3}), 0);
    assert_int_equal(ps_layout_add(l, "b", 1, (const uint32_t[]){3}), 0);
}

/* ---- frame header ------------------------------------------------------------ */

static void test_frame_header_need_more(void **state)
{
    (void)state;
    static const uint8_t full[4] = {0, 0, 0, 9};
    for (size_t n = 0; n < PS_FRAME_HDR; n++) {
        uint8_t *p = heapdup(full, n);
        uint32_t len = 12345;
        assert_int_equal(ps_frame_header(p, n, 1000, &len), 0);
        assert_int_equal(len, 12345); /* untouched */
        free(p);
    }
    uint8_t *p = heapdup(full, 4);
    uint32_t len = 0;
    assert_int_equal(ps_frame_header(p, 4, 1000, &len), 1);
    assert_int_equal(len, 9);
    free(p);
}

static void test_frame_header_zero_and_limits(void **state)
{
    (void)state;
    uint8_t h[4];
    uint32_t len = 99;

    ps_frame_put_len(h, 0);
    assert_int_equal(ps_frame_header(h, 4, 1000, &len), PS_EMALFORMED);
    assert_int_equal(len, 0);

    ps_frame_put_len(h, 1000); /* exactly the limit */
    assert_int_equal(ps_frame_header(h, 4, 1000, &len), 1);
    assert_int_equal(len, 1000);

    ps_frame_put_len(h, 1001); /* one over */
    assert_int_equal(ps_frame_header(h, 4, 1000, &len), PS_ETOO_BIG);
    assert_int_equal(len, 1001);

    ps_frame_put_len(h, 1);
    assert_int_equal(ps_frame_header(h, 4, 1000, &len), 1);
    assert_int_equal(len, 1);

    /* the pre-hello limit and the hard limit */
    ps_frame_put_len(h, PS_FRAME_MAX_PREAUTH);
    assert_int_equal(ps_frame_header(h, 4, PS_FRAME_MAX_PREAUTH, &len), 1);
    ps_frame_put_len(h, PS_FRAME_MAX_PREAUTH + 1);
    assert_int_equal(ps_frame_header(h, 4, PS_FRAME_MAX_PREAUTH, &len), PS_ETOO_BIG);
    ps_frame_put_len(h, PS_FRAME_MAX_HARD);
    assert_int_equal(ps_frame_header(h, 4, PS_FRAME_MAX_HARD, &len), 1);
    assert_int_equal(len, PS_FRAME_MAX_HARD);
    ps_frame_put_len(h, UINT32_MAX);
    assert_int_equal(ps_frame_header(h, 4, PS_FRAME_MAX_HARD, &len), PS_ETOO_BIG);
    assert_int_equal(len, UINT32_MAX);
}

static void test_frame_put_len_big_endian(void **state)
{
    (void)state;
    uint8_t h[8] = {0};
    ps_frame_put_len(h, 0x01020304u);
    assert_int_equal(h[0], 1);
    assert_int_equal(h[1], 2);
    assert_int_equal(h[2], 3);
    assert_int_equal(h[3], 4);
    assert_int_equal(h[4], 0); /* writes exactly 4 bytes */
    uint32_t len = 0;
    /* bytes after the header are not looked at */
    assert_int_equal(ps_frame_header(h, sizeof h, UINT32_MAX, &len), 1);
    assert_int_equal(len, 0x01020304u);
}

/* ---- ps_scan ------------------------------------------------------------------- */

typedef struct typecase {
    const char *name;
    const uint8_t *b;
    size_t n;
} typecase;

#define TC(name, ...) {name, (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})}

/* One object of every msgpack type family (a table to expand inside a
 * function: compound literals are not constant at file scope). */
#define EVERY_TYPE {                                                                   \
    TC("positive fixint 0", 0x00),                                                     \
    TC("positive fixint 127", 0x7f),                                                   \
    TC("negative fixint -1", 0xff),                                                    \
    TC("negative fixint -32", 0xe0),                                                   \
    TC("int8", 0xd0, 0x80),                                                            \
    TC("int16", 0xd1, 0x80, 0x00),                                                     \
    TC("int32", 0xd2, 0x80, 0x00, 0x00, 0x00),                                         \
    TC("int64", 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0),                                      \
    TC("uint8", 0xcc, 0xff),                                                           \
    TC("uint16", 0xcd, 0xff, 0xff),                                                    \
    TC("uint32", 0xce, 0xff, 0xff, 0xff, 0xff),                                        \
    TC("uint64", 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),                \
    TC("float32", 0xca, 0x3f, 0x80, 0x00, 0x00),                                       \
    TC("float64", 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0),                                 \
    TC("nil", 0xc0),                                                                   \
    TC("false", 0xc2),                                                                 \
    TC("true", 0xc3),                                                                  \
    TC("fixstr empty", 0xa0),                                                          \
    TC("fixstr", 0xa3, 'a', 'b', 'c'),                                                 \
    TC("str8", 0xd9, 0x03, 'a', 'b', 'c'),                                             \
    TC("str16", 0xda, 0x00, 0x03, 'a', 'b', 'c'),                                      \
    TC("str32", 0xdb, 0x00, 0x00, 0x00, 0x03, 'a', 'b', 'c'),                          \
    TC("bin8", 0xc4, 0x02, 0xde, 0xad),                                                \
    TC("bin8 empty", 0xc4, 0x00),                                                      \
    TC("bin16", 0xc5, 0x00, 0x02, 0xde, 0xad),                                         \
    TC("bin32", 0xc6, 0x00, 0x00, 0x00, 0x02, 0xde, 0xad),                             \
    TC("fixext1", 0xd4, 0x01, 0xaa),                                                   \
    TC("fixext2", 0xd5, 0x01, 0xaa, 0xbb),                                             \
    TC("fixext4", 0xd6, 0x01, 1, 2, 3, 4),                                             \
    TC("fixext8", 0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8),                                 \
    TC("fixext16", 0xd8, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), \
    TC("ext8", 0xc7, 0x03, 0x01, 1, 2, 3),                                             \
    TC("ext16", 0xc8, 0x00, 0x03, 0x01, 1, 2, 3),                                      \
    TC("ext32", 0xc9, 0x00, 0x00, 0x00, 0x03, 0x01, 1, 2, 3),                          \
    TC("fixarray empty", 0x90),                                                        \
    TC("fixarray", 0x92, 0x01, 0xa1, 'x'),                                             \
    TC("array16", 0xdc, 0x00, 0x02, 0x01, 0xc0),                                       \
    TC("array32", 0xdd, 0x00, 0x00, 0x00, 0x02, 0x01, 0xc3),                           \
    TC("fixmap empty", 0x80),                                                          \
    TC("fixmap", 0x81, 0xa1, 'a', 0x01),                                               \
    TC("map16", 0xde, 0x00, 0x01, 0xa1, 'a', 0x92, 0x01, 0x02),                        \
    TC("map32", 0xdf, 0x00, 0x00, 0x00, 0x01, 0xa1, 'a', 0x80),                        \
}

static void test_scan_accepts_every_type(void **state)
{
    (void)state;
    const typecase every_type[] = EVERY_TYPE;
    for (size_t i = 0; i < sizeof every_type / sizeof every_type[0]; i++) {
        const typecase *tc = &every_type[i];
        int rc = scan_copy(tc->b, tc->n, &default_lim);
        if (rc != 0)
            fail_msg("%s: ps_scan says %d: %s", tc->name, rc, err);
        assert_string_equal(err, "");
    }
}

/* What ps_scan accepts, msgpack-c must unpack: each type as the value of an
 * unknown key in a heartbeat decodes without error. */
static void test_scan_types_agree_with_unpacker(void **state)
{
    (void)state;
    const typecase every_type[] = EVERY_TYPE;
    for (size_t i = 0; i < sizeof every_type / sizeof every_type[0]; i++) {
        const typecase *tc = &every_type[i];
        mpw *w = mpw_new();
        mp_map(w, 2);
        mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
        mp_str(w, "x"), mp_raw(w, tc->b, tc->n);
        ps_msg m;
        int rc = dec_copy(w, &m);
        if (rc != 0)
            fail_msg("%s: decode says %d: %s", tc->name, rc, err);
        assert_int_equal(m.type, PS_MSG_HEARTBEAT);
        free(w);
    }
}

static void test_scan_rejects_reserved_byte(void **state)
{
    (void)state;
    static const uint8_t alone[] = {0xc1};
    assert_int_equal(scan_copy(alone, sizeof alone, &default_lim), PS_EMALFORMED);
    assert_msg_has(err, "0xc1");
    static const uint8_t inside[] = {0x82, 0xa1, 't', 0x09, 0xa1, 'x', 0xc1};
    assert_int_equal(scan_copy(inside, sizeof inside, &default_lim), PS_EMALFORMED);
    assert_msg_has(err, "at byte 6");
    assert_msg_has(err, "0xc1");
    static const uint8_t in_array[] = {0x93, 0x01, 0xc1, 0x02};
    assert_int_equal(scan_copy(in_array, sizeof in_array, &default_lim), PS_EMALFORMED);
}

/* Every proper prefix of a valid payload is refused, by the scan and by the
 * decoder, without reading past it. */
static void check_every_prefix(const uint8_t *payload, size_t len)
{
    ps_msg m;
    for (size_t n = 0; n < len; n++) {
        int rc = scan_copy(payload, n, &default_lim);
        if (rc != PS_EMALFORMED)
            fail_msg("prefix of %zu/%zu bytes: ps_scan returned %d", n, len, rc);
        assert_true(err[0] != '\0');
        uint8_t *p = heapdup(payload, n);
        rc = dec_inplace(p, n, &m);
        free(p);
        if (rc != PS_EMALFORMED)
            fail_msg("prefix of %zu/%zu bytes: decode returned %d", n, len, rc);
    }
    /* and the whole payload is fine */
    assert_int_equal(scan_copy(payload, len, &default_lim), 0);
    uint8_t *p = heapdup(payload, len);
    assert_int_equal(dec_inplace(p, len, &m), 0);
    free(p);
}

static void test_scan_truncation_push(void **state)
{
    (void)state;
    float g[5] = {1, -2, 3.5f, 0, 1e-3f};
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_FIN;
    m.id = 300;
    m.base = 70000;
    m.off = 12;
    m.data = g;
    m.ndata = 5;
    ps_buf out = {0};
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    check_every_prefix(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    ps_buf_free(&out);
}

/* m: shard 1 of 2's HELLO, as a worker sends it, with layout l. */
static void hello_with(ps_msg *m, ps_layout *l)
{
    ps_msg_init(m, PS_MSG_HELLO);
    m->has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m->id = 1;
    m->proto = PS_PROTO_VERSION;
    m->role = PS_ROLE_WORKER;
    m->shard = 1;
    m->nshards = 2;
    m->layout = l;
    m->fp = ps_layout_fingerprint(l);
}

static void test_scan_truncation_hello(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    ps_msg m;
    hello_with(&m, &l);
    ps_buf out = {0};
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    check_every_prefix(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    ps_buf_free(&out);
}

/* The largest layout the limits allow (PS_TENSORS_MAX tensors, each with a
 * name of PS_NAME_MAX bytes, PS_DIMS_MAX dims and a buffer's
 * rule and dtype): its hello fits the pre-hello frame limit and psd's
 * object limit, and decodes whole. */
static void test_hello_largest_layout(void **state)
{
    (void)state;
    static ps_layout big;
    ps_layout_init(&big);
    /* 2^23 values each, PS_PARAMS_MAX in all */
    const uint32_t dims[PS_DIMS_MAX] = {256, 256, 128, 1, 1, 1};
    char name[PS_NAME_MAX + 1];
    for (int i = 0; i < PS_TENSORS_MAX; i++) {
        memset(name, 'n', PS_NAME_MAX);
        name[PS_NAME_MAX] = '\0';
        snprintf(name, 8, "%06d", i);
        name[6] = 'n'; /* snprintf's NUL */
        assert_int_equal(ps_layout_add(&big, name, PS_DIMS_MAX, dims), 0);
        assert_int_equal(ps_layout_set_buffer(&big, PS_BUF_FIRST, PS_SAVE_I64), 0);
    }
    ps_msg m;
    hello_with(&m, &big);
    ps_buf out = {0};
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    uint32_t plen = 0;
    assert_int_equal(ps_frame_header(out.p, out.len, PS_FRAME_MAX_PREAUTH, &plen), 1);
    assert_true(plen <= PS_FRAME_MAX_PREAUTH);
    ps_msg d;
    uint8_t *p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    assert_int_equal(dec_inplace(p, out.len - PS_FRAME_HDR, &d), 0);
    assert_int_equal(lay.ntensors, PS_TENSORS_MAX);
    assert_true(ps_layout_equal(&lay, &big));
    free(p);
    ps_buf_free(&out);
}

static void test_scan_trailing_bytes(void **state)
{
    (void)state;
    static const uint8_t two[] = {0x81, 0xa1, 't', 0x09, 0x00};
    assert_int_equal(scan_copy(two, sizeof two, &default_lim), PS_EMALFORMED);
    assert_msg_has(err, "1 trailing byte");
    static const uint8_t two_objects[] = {0x01, 0x02};
    assert_int_equal(scan_copy(two_objects, sizeof two_objects, &default_lim), PS_EMALFORMED);
    ps_msg m;
    uint8_t *p = heapdup(two, sizeof two);
    assert_int_equal(dec_inplace(p, sizeof two, &m), PS_EMALFORMED);
    free(p);
}

/* msgpack-c issue #1013: five bytes declaring 2^32-1 elements would make its
 * unpacker allocate ~100 GB. The scan must refuse before any unpacking. */
static void test_scan_huge_declared_counts(void **state)
{
    (void)state;
    static const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t arr16[] = {0xdc, 0xff, 0xff};
    static const uint8_t map16[] = {0xde, 0xff, 0xff};
    assert_int_equal(scan_copy(arr32, sizeof arr32, &default_lim), PS_EMALFORMED);
    assert_msg_has(err, "4294967295 elements");
    assert_int_equal(scan_copy(map32, sizeof map32, &default_lim), PS_EMALFORMED);
    assert_msg_has(err, "8589934590 elements");
    assert_int_equal(scan_copy(arr16, sizeof arr16, &default_lim), PS_EMALFORMED);
    assert_int_equal(scan_copy(map16, sizeof map16, &default_lim), PS_EMALFORMED);

    /* the same inside a message, through the decoder */
    const uint8_t *bodies[] = {arr32, map32};
    for (int i = 0; i < 2; i++) {
        mpw *w = mpw_new();
        mp_map(w, 2);
        mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
        mp_str(w, "x"), mp_raw(w, bodies[i], 5);
        ps_msg m;
        assert_int_equal(dec_copy(w, &m), PS_EMALFORMED);
        free(w);
    }

    /* a count that just fits the remaining bytes passes; one more does not */
    static const uint8_t fits[] = {0xdd, 0x00, 0x00, 0x00, 0x03, 0x01, 0x02, 0x03};
    static const uint8_t over[] = {0xdd, 0x00, 0x00, 0x00, 0x04, 0x01, 0x02, 0x03};
    assert_int_equal(scan_copy(fits, sizeof fits, &default_lim), 0);
    assert_int_equal(scan_copy(over, sizeof over, &default_lim), PS_EMALFORMED);
    static const uint8_t mfits[] = {0x82, 0x01, 0x02, 0x03, 0x04};
    static const uint8_t mover[] = {0x83, 0x01, 0x02, 0x03, 0x04, 0x05};
    assert_int_equal(scan_copy(mfits, sizeof mfits, &default_lim), 0);
    assert_int_equal(scan_copy(mover, sizeof mover, &default_lim), PS_EMALFORMED);
}

static void test_scan_lengths_beyond_the_end(void **state)
{
    (void)state;
    const typecase bad[] = {
        TC("fixstr", 0xa5, 'a', 'b', 'c', 'd'),
        TC("str8", 0xd9, 0x05, 'a', 'b', 'c', 'd'),
        TC("str16", 0xda, 0x00, 0x05, 'a', 'b', 'c', 'd'),
        TC("str32 small", 0xdb, 0x00, 0x00, 0x00, 0x10, 'a', 'b', 'c'),
        TC("str32 huge", 0xdb, 0xff, 0xff, 0xff, 0xff),
        TC("bin8", 0xc4, 0x03, 1, 2),
        TC("bin16", 0xc5, 0x01, 0x00, 1, 2),
        TC("bin32 small", 0xc6, 0x00, 0x00, 0x00, 0x04, 1, 2, 3),
        TC("bin32 huge", 0xc6, 0xff, 0xff, 0xff, 0xff, 1),
        TC("ext8", 0xc7, 0x02, 0x01, 1),
        TC("ext32 huge", 0xc9, 0xff, 0xff, 0xff, 0xff, 0x01),
        TC("ext32 type byte missing", 0xc9, 0x00, 0x00, 0x00, 0x00),
        TC("fixext16", 0xd8, 0x01, 1, 2, 3),
        TC("uint64", 0xcf, 0, 0, 0, 0, 0, 0, 0),
        TC("float64", 0xcb, 0, 0, 0),
        TC("str32 length field cut", 0xdb, 0x00, 0x00),
        TC("map16 length field cut", 0xde, 0x00),
        TC("array32 length field cut", 0xdd, 0x00, 0x00, 0x00),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = scan_copy(bad[i].b, bad[i].n, &default_lim);
        if (rc != PS_EMALFORMED)
            fail_msg("%s: ps_scan returned %d", bad[i].name, rc);
    }
}

/* n nested arrays, the innermost holding `inner` (a fixint, or nothing). */
static void nested_arrays(mpw *w, unsigned n, int inner)
{
    for (unsigned i = 0; i < n; i++)
        mp_array(w, i + 1 < n || inner ? 1 : 0);
    if (inner)
        mp_u8(w, 0x07);
}

static void test_scan_depth(void **state)
{
    (void)state;
    for (uint32_t d = 1; d <= PS_MSG_DEPTH_MAX; d++) {
        ps_scan_limits lim = {d, PS_MSG_OBJECTS_MAX};
        for (int inner = 0; inner <= 1; inner++) {
            mpw *w = mpw_new();
            nested_arrays(w, d, inner); /* exactly the limit */
            int rc = scan_copy(w->b, w->n, &lim);
            if (rc != 0)
                fail_msg("depth %u (inner %d) at limit %u refused: %s", d, inner, d, err);
            w->n = 0;
            nested_arrays(w, d + 1, inner); /* one deeper */
            rc = scan_copy(w->b, w->n, &lim);
            if (rc != PS_EMALFORMED)
                fail_msg("depth %u (inner %d) at limit %u accepted", d + 1, inner, d);
            assert_msg_has(err, "nested deeper");
            free(w);
        }
    }
    /* a limit above the hard one is clamped to it */
    ps_scan_limits big = {1000, PS_MSG_OBJECTS_MAX};
    mpw *w = mpw_new();
    nested_arrays(w, PS_MSG_DEPTH_MAX + 1, 1);
    assert_int_equal(scan_copy(w->b, w->n, &big), PS_EMALFORMED);
    w->n = 0;
    nested_arrays(w, 200, 1);
    assert_int_equal(scan_copy(w->b, w->n, &big), PS_EMALFORMED);

    /* the decoder with the default limits: a message map and five nested
     * arrays below it is the deepest accepted */
    for (unsigned n = PS_MSG_DEPTH_MAX - 1; n <= PS_MSG_DEPTH_MAX; n++) {
        w->n = 0;
        mp_map(w, 2);
        mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
        mp_str(w, "x"), nested_arrays(w, n, 1);
        ps_msg m;
        int rc = dec_copy(w, &m);
        assert_int_equal(rc, n + 1 <= PS_MSG_DEPTH_MAX ? 0 : PS_EMALFORMED);
    }
    free(w);
}

static void test_scan_max_objects(void **state)
{
    (void)state;
    mpw *w = mpw_new();
    mp_array(w, 10);
    for (int i = 0; i < 10; i++)
        mp_u8(w, (uint8_t)i);
    ps_scan_limits lim11 = {4, 11}, lim10 = {4, 10};
    assert_int_equal(scan_copy(w->b, w->n, &lim11), 0);
    assert_int_equal(scan_copy(w->b, w->n, &lim10), PS_EMALFORMED);
    assert_msg_has(err, "more than 10 objects");
    /* map keys count as objects */
    w->n = 0;
    mp_map(w, 1), mp_str(w, "a"), mp_u8(w, 1);
    ps_scan_limits lim3 = {4, 3}, lim2 = {4, 2};
    assert_int_equal(scan_copy(w->b, w->n, &lim3), 0);
    assert_int_equal(scan_copy(w->b, w->n, &lim2), PS_EMALFORMED);

    /* through the decoder: a message of 70,000 nils is refused by the
     * default limit of 65,536 objects */
    w->n = 0;
    mp_map(w, 2);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
    mp_str(w, "x"), mp_array(w, 60000);
    for (int i = 0; i < 60000; i++)
        mp_u8(w, 0xc0);
    ps_msg m;
    assert_int_equal(dec_copy(w, &m), 0);
    w->n = 0;
    mp_map(w, 2);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
    mp_str(w, "x"), mp_array(w, 65533); /* 1 + 4 + 1 + 65533 = 65539 objects */
    for (int i = 0; i < 65533; i++)
        mp_u8(w, 0xc0);
    assert_int_equal(dec_copy(w, &m), PS_EMALFORMED);
    assert_msg_has(err, "objects");
    free(w);
}

static void test_scan_error_buffer(void **state)
{
    (void)state;
    static const uint8_t bad[] = {0xc1};
    char small[8];
    memset(small, 'X', sizeof small);
    assert_int_equal(ps_scan(bad, 1, &default_lim, small, sizeof small), PS_EMALFORMED);
    assert_true(memchr(small, '\0', sizeof small) != NULL);
    assert_int_equal(ps_scan(bad, 1, &default_lim, NULL, 0), PS_EMALFORMED);
    char one[1] = {'X'};
    assert_int_equal(ps_scan(bad, 1, &default_lim, one, 1), PS_EMALFORMED);
    assert_int_equal(one[0], '\0');
}

/* ---- encode / decode round trips -------------------------------------------------- */

static int pack_body(msgpack_packer *pk, void *arg)
{
    (void)arg;
    msgpack_pack_map(pk, 2);
    msgpack_pack_str(pk, 4);
    msgpack_pack_str_body(pk, "mode", 4);
    msgpack_pack_str(pk, 3);
    msgpack_pack_str_body(pk, "bsp", 3);
    msgpack_pack_str(pk, 7);
    msgpack_pack_str_body(pk, "workers", 7);
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_str(pk, 5);
    msgpack_pack_str_body(pk, "shard", 5);
    msgpack_pack_uint32(pk, 3);
    return 0;
}

static int pack_body_fails(msgpack_packer *pk, void *arg)
{
    (void)pk, (void)arg;
    return PS_ENOMEM;
}

static int str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static void check_body(const msgpack_object *body)
{
    assert_non_null(body);
    assert_int_equal(body->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(body->via.map.size, 2);
    assert_true(str_is(&body->via.map.ptr[0].key, "mode"));
    assert_true(str_is(&body->via.map.ptr[0].val, "bsp"));
    assert_true(str_is(&body->via.map.ptr[1].key, "workers"));
    const msgpack_object *ws = &body->via.map.ptr[1].val;
    assert_int_equal(ws->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(ws->via.array.size, 1);
    assert_int_equal(ws->via.array.ptr[0].type, MSGPACK_OBJECT_MAP);
    assert_int_equal(ws->via.array.ptr[0].via.map.ptr[0].val.via.u64, 3);
}

/* Compares every field that a says is present. */
static void check_same(const ps_msg *a, const ps_msg *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->has, b->has);
    uint64_t h = a->has;
    if (h & PS_F_ID)
        assert_int_equal(a->id, b->id);
    if (h & PS_F_VERSION)
        assert_int_equal(a->proto, b->proto);
    if (h & PS_F_ROLE)
        assert_int_equal(a->role, b->role);
    if (h & PS_F_SHARD) {
        assert_int_equal(a->shard, b->shard);
        assert_int_equal(a->nshards, b->nshards);
    }
    if (h & PS_F_LAYOUT)
        assert_true(ps_layout_equal(a->layout, b->layout));
    if (h & PS_F_FP)
        assert_int_equal(a->fp, b->fp);
    if (h & PS_F_MODE)
        assert_string_equal(a->mode, b->mode);
    if (h & PS_F_MVER)
        assert_int_equal(a->mver, b->mver);
    if (h & PS_F_PARAMS)
        assert_int_equal(a->params, b->params);
    if (h & PS_F_WORKERS)
        assert_int_equal(a->workers, b->workers);
    if (h & PS_F_INIT)
        assert_int_equal(a->need_init, b->need_init);
    if (h & PS_F_OFF)
        assert_int_equal(a->off, b->off);
    if (h & PS_F_LEN)
        assert_int_equal(a->len, b->len);
    assert_int_equal(a->dt, b->dt); /* f32 when absent */
    if (h & PS_F_RDT)
        assert_int_equal(a->rdt, b->rdt);
    if (h & PS_F_WIRE)
        assert_int_equal(a->wire, b->wire);
    if (h & PS_F_PLAN)
        assert_memory_equal(&a->plan, &b->plan, sizeof a->plan);
    if (h & PS_F_SLICE)
        assert_memory_equal(&a->slice, &b->slice, sizeof a->slice);
    if (h & PS_F_DONE)
        assert_int_equal(a->done, b->done);
    if (h & PS_F_WAIT)
        assert_int_equal(a->wait, b->wait);
    if (h & PS_F_DATA) {
        assert_int_equal(a->ndata, b->ndata);
        /* through the pointer of the element type only */
        if (b->dt != PS_DT_F32)
            assert_null(b->data);
        if (b->dt != PS_DT_BF16)
            assert_null(b->data16);
        if (!ps_dtype_packed(b->dt))
            assert_null(b->packed);
        assert_int_equal(a->nz, b->nz);
        assert_int_equal(ps_msg_data_len(a), ps_msg_data_len(b));
        if (ps_msg_data_len(a))
            assert_memory_equal(ps_msg_data_bytes(a), ps_msg_data_bytes(b), ps_msg_data_len(a));
    }
    assert_int_equal(a->fin, b->fin); /* 1 when absent */
    if (h & PS_F_MIN)
        assert_int_equal(a->min, b->min);
    if (h & PS_F_BASE)
        assert_int_equal(a->base, b->base);
    if (h & PS_F_POFF)
        assert_int_equal(a->poff, b->poff);
    if (h & PS_F_PLEN)
        assert_int_equal(a->plen, b->plen);
    if (h & PS_F_CODE)
        assert_int_equal(a->code, b->code);
    if (h & PS_F_TEXT) {
        assert_int_equal(a->text_len, b->text_len);
        assert_memory_equal(a->text, b->text, a->text_len);
    }
    if (h & PS_F_EPOCH)
        assert_int_equal(a->epoch, b->epoch);
    if (h & PS_F_LOSS)
        assert_true(a->loss == b->loss);
    if (h & PS_F_ACC)
        assert_true(a->acc == b->acc);
    if (h & PS_F_TLOSS)
        assert_true(a->tloss == b->tloss);
    if (h & PS_F_SAMPLES)
        assert_int_equal(a->samples, b->samples);
    if (h & PS_F_RATE)
        assert_true(a->rate == b->rate);
    if (h & PS_F_HB)
        assert_int_equal(a->hb, b->hb);
    if (h & PS_F_CMD)
        assert_string_equal(a->cmd, b->cmd);
    if (h & PS_F_NONCE)
        assert_memory_equal(a->nonce, b->nonce, PS_AUTH_NONCE_LEN);
    if (h & PS_F_CNONCE)
        assert_memory_equal(a->cnonce, b->cnonce, PS_AUTH_NONCE_LEN);
    if (h & PS_F_PROOF)
        assert_memory_equal(a->proof, b->proof, PS_AUTH_MAC_LEN);
    if (h & PS_F_SPROOF)
        assert_memory_equal(a->sproof, b->sproof, PS_AUTH_MAC_LEN);
    assert_int_equal(a->has2, b->has2);
    if (a->has2 & PS_F2_CID)
        assert_true(a->cid == b->cid);
    if (a->has2 & PS_F2_PID)
        assert_true(a->pid == b->pid);
    if (a->has2 & PS_F2_READER)
        assert_int_equal(a->reader, b->reader);
    if (a->has2 & PS_F2_LAG)
        assert_true(a->lag == b->lag);
    if (a->has2 & PS_F2_LEADER) {
        assert_int_equal(a->leader.len, b->leader.len);
        assert_memory_equal(a->leader.p, b->leader.p, a->leader.len);
    }
    if (a->has2 & PS_F2_REPLICAS) {
        assert_int_equal(a->nreplicas, b->nreplicas);
        for (uint32_t i = 0; i < a->nreplicas; i++) {
            assert_int_equal(a->replicas[i].len, b->replicas[i].len);
            assert_memory_equal(a->replicas[i].p, b->replicas[i].p, a->replicas[i].len);
        }
    }
    if (h & PS_F_ARGS) {
        assert_int_equal(a->nargs, b->nargs);
        for (uint32_t i = 0; i < a->nargs; i++) {
            assert_int_equal(a->args[i].len, b->args[i].len);
            if (a->args[i].len)
                assert_memory_equal(a->args[i].p, b->args[i].p, a->args[i].len);
        }
    }
}

/* Encodes m (with the body callback for status replies), decodes the frame
 * and checks both agree; checks that tensor data is decoded in place, at an
 * aligned address inside the payload. */
static void round_trip(const ps_msg *m)
{
    ps_buf out = {0};
    size_t dlen = 0;
    ps_body_fn body = m->type == PS_MSG_STATUS_REPLY ? pack_body : NULL;
    assert_int_equal(ps_msg_encode(m, &out, &dlen, body, NULL), 0);
    assert_int_equal(dlen, (m->has & PS_F_DATA) ? ps_msg_data_len(m) : 0);
    if (dlen) {
        /* the header ends with a bin32 header for the tensor bytes, at an
         * aligned offset of the frame */
        assert_true(out.len >= 5);
        assert_int_equal(out.p[out.len - 5], 0xc6);
        assert_int_equal(out.len % PS_DATA_ALIGN, 0);
        assert_int_equal(ps_buf_reserve(&out, dlen), 0);
        memcpy(out.p + out.len, ps_msg_data_bytes(m), dlen);
        out.len += dlen;
    }
    uint32_t plen = 0;
    assert_int_equal(ps_frame_header(out.p, out.len, PS_FRAME_MAX_HARD, &plen), 1);
    assert_int_equal(plen, out.len - PS_FRAME_HDR);

    /* the frame from ps_msg_encode_full is the same bytes */
    ps_buf full = {0};
    if (!body) {
        assert_int_equal(ps_msg_encode_full(m, &full), 0);
        assert_int_equal(full.len, out.len);
        assert_memory_equal(full.p, out.p, out.len);
        ps_buf_free(&full);
    }

    uint8_t *payload = out.p + PS_FRAME_HDR;
    uint8_t *copy = heapdup(payload, plen);
    ps_msg d;
    int rc = dec_inplace(payload, plen, &d);
    if (rc != 0)
        fail_msg("%s: decode: %d: %s", ps_msg_type_name(m->type), rc, err);
    ps_msg want = *m;
    if (body)
        want.has |= PS_F_BODY;
    check_same(&want, &d);
    if (body)
        check_body(d.body);
    if (m->has & PS_F_DATA) {
        /* in place, no copy: the tensor is the last dlen bytes of the
         * payload (msgpack-c points an empty bin at its length field) */
        const uint8_t *dd = ps_msg_data_bytes(&d);
        if (dlen)
            assert_ptr_equal(dd, payload + plen - dlen);
        assert_true(dd >= payload && dd <= payload + plen);
        assert_int_equal((uintptr_t)dd % PS_DATA_ALIGN, 0);
    }
    /* an aligned frame is not written to */
    assert_memory_equal(payload, copy, plen);
    free(copy);
    ps_buf_free(&out);
}

static const float tensor[7] = {1.0f, -2.5f, 3.25e-8f, 1e30f, -0.0f, 0.1f, 42.0f};

static void test_round_trip_each_type(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    ps_msg m;
    static const char msg_text[] = "shard 3 is already connected from 10.0.0.7:41234";
    static const char metrics[] = "# HELP psd_pushes_total x\npsd_pushes_total 12\n";

    ps_msg_init(&m, PS_MSG_HELLO); /* worker */
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.id = 1, m.proto = PS_PROTO_VERSION, m.role = PS_ROLE_WORKER, m.shard = 3, m.nshards = 4;
    m.layout = &l, m.fp = ps_layout_fingerprint(&l);
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_HELLO); /* admin */
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE;
    m.id = 1, m.proto = PS_PROTO_VERSION, m.role = PS_ROLE_ADMIN;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_WELCOME);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT | PS_F_FP |
            PS_F_HB;
    m.id = 1, m.proto = PS_PROTO_VERSION, m.mver = 123456789, m.params = 1ULL << 33, m.workers = 4096;
    m.hb = 15000;
    m.need_init = 1, m.fp = 0xfedcba9876543210ULL;
    snprintf(m.mode, sizeof m.mode, "bsp");
    round_trip(&m);
    m.need_init = 0;
    snprintf(m.mode, sizeof m.mode, "%s", "fifteen-chars-x"); /* the longest mode */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_INIT);
    m.has = PS_F_ID | PS_F_OFF | PS_F_DATA | PS_F_FIN;
    m.id = 2, m.off = 5, m.data = tensor, m.ndata = 7, m.fin = 0;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_FIN;
    m.id = UINT64_MAX, m.base = 77, m.off = 0, m.data = tensor, m.ndata = 2, m.fin = 1;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PULL);
    m.has = PS_F_ID | PS_F_OFF | PS_F_LEN | PS_F_MIN;
    m.id = 4, m.off = 1ULL << 32, m.len = 1ULL << 20, m.min = 99;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_FIN | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.id = 5, m.base = 10, m.off = 1, m.data = tensor + 1, m.ndata = 6, m.fin = 1;
    m.poff = 0, m.plen = 7, m.min = 11;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PARAMS);
    m.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    m.id = 6, m.mver = 11, m.off = 0, m.data = tensor, m.ndata = 7;
    round_trip(&m);
    m.ndata = 0; /* an empty tensor is still a tensor */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_OK);
    m.has = PS_F_ID | PS_F_MVER;
    m.id = 7, m.mver = 0;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_HEARTBEAT);
    m.has = PS_F_ID;
    m.id = 8;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_STATUS);
    m.has = PS_F_ID;
    m.id = 9;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_STATUS_REPLY);
    m.has = PS_F_ID;
    m.id = 9;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_METRICS);
    m.has = PS_F_ID;
    m.id = 10;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_METRICS_REPLY);
    m.has = PS_F_ID | PS_F_TEXT;
    m.id = 10, m.text = metrics, m.text_len = (uint32_t)strlen(metrics);
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_REPORT);
    m.has = PS_F_ID | PS_F_EPOCH | PS_F_LOSS | PS_F_ACC | PS_F_TLOSS | PS_F_SAMPLES | PS_F_RATE;
    m.id = 11, m.epoch = 3, m.loss = 0.3141, m.acc = 0.97, m.tloss = 1e-300, m.samples = 180000, m.rate = 12345.5;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_ERROR);
    m.has = PS_F_ID | PS_F_CODE | PS_F_TEXT;
    m.id = 12, m.code = -PS_ESHARD, m.text = msg_text, m.text_len = (uint32_t)strlen(msg_text);
    round_trip(&m);
    m.code = -7; /* negative codes decode too */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_BYE);
    m.has = PS_F_ID;
    m.id = 13;
    round_trip(&m);
    m.has = 0; /* no id at all */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_ADMIN); /* a command without arguments */
    m.has = PS_F_ID | PS_F_CMD;
    m.id = 14;
    snprintf(m.cmd, sizeof m.cmd, "pause");
    round_trip(&m);
    /* with arguments: empty, long, and the most there may be */
    static char long_arg[PS_ARG_MAX + 1];
    memset(long_arg, 'x', PS_ARG_MAX);
    m.has |= PS_F_ARGS;
    snprintf(m.cmd, sizeof m.cmd, "%s", "set-31-chars-long-command-name!"); /* the longest cmd */
    assert_int_equal(strlen(m.cmd), PS_CMD_MAX);
    m.nargs = PS_ARGS_MAX;
    for (uint32_t i = 0; i < PS_ARGS_MAX; i++) {
        m.args[i].p = i == 1 ? "" : i == 2 ? long_arg : "lr=0.01";
        m.args[i].len = (uint32_t)strlen(m.args[i].p);
    }
    round_trip(&m);
    m.nargs = 0; /* an empty array */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_OK); /* an admin command's OK carries text */
    m.has = PS_F_ID | PS_F_MVER | PS_F_TEXT;
    m.id = 14, m.mver = 3, m.text = "lr: 0.05 -> 0.01", m.text_len = 16;
    round_trip(&m);

    /* authentication (PROTOCOL.md 7.1): bins of 32 bytes of any value */
    ps_msg_init(&m, PS_MSG_CHALLENGE);
    m.has = PS_F_ID | PS_F_NONCE;
    m.id = 1;
    for (int i = 0; i < PS_AUTH_NONCE_LEN; i++)
        m.nonce[i] = (uint8_t)(0xff - i);
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_AUTH);
    m.has = PS_F_ID | PS_F_CNONCE | PS_F_PROOF;
    m.id = 2;
    for (int i = 0; i < PS_AUTH_NONCE_LEN; i++)
        m.cnonce[i] = (uint8_t)i, m.proof[i] = (uint8_t)(i * 7 + 0xc1); /* 0xc1 is fine inside a bin */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_WELCOME); /* after an AUTH: with psd's proof */
    m.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT | PS_F_HB |
            PS_F_SPROOF;
    m.id = 2, m.proto = PS_PROTO_VERSION, m.mver = 0, m.params = 0, m.workers = 2, m.hb = 10000;
    memset(m.sproof, 0xa5, sizeof m.sproof);
    snprintf(m.mode, sizeof m.mode, "bsp");
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_WELCOME); /* to an admin: with the layout */
    m.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT | PS_F_FP |
            PS_F_HB | PS_F_LAYOUT;
    m.id = 1, m.proto = PS_PROTO_VERSION, m.mver = 9, m.params = l.total, m.workers = 2, m.hb = 10000;
    m.fp = ps_layout_fingerprint(&l), m.layout = &l;
    snprintf(m.mode, sizeof m.mode, "asgd");
    round_trip(&m);
}

/* One message carrying every field there is. */
static void test_round_trip_all_fields(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP | PS_F_MODE | PS_F_MVER |
            PS_F_PARAMS | PS_F_INIT | PS_F_OFF | PS_F_LEN | PS_F_DATA | PS_F_FIN | PS_F_MIN | PS_F_BASE |
            PS_F_POFF | PS_F_PLEN | PS_F_CODE | PS_F_TEXT | PS_F_EPOCH | PS_F_LOSS | PS_F_ACC | PS_F_SAMPLES |
            PS_F_TLOSS | PS_F_WORKERS | PS_F_RATE | PS_F_HB | PS_F_CMD | PS_F_ARGS | PS_F_NONCE | PS_F_CNONCE |
            PS_F_PROOF | PS_F_SPROOF | PS_F_DT | PS_F_RDT | PS_F_WIRE | PS_F_PLAN | PS_F_SLICE | PS_F_DONE |
            PS_F_WAIT;
    m.plan = (ps_plan){.epochs = PS_PLAN_EPOCHS_MAX, .samples = PS_PLAN_SAMPLES_MAX, .batch = 192, .seed = UINT64_MAX};
    m.slice = (ps_slice){.epoch = UINT64_MAX, .lo = 5, .hi = PS_PLAN_SAMPLES_MAX, .rank = 65535, .count = 65536};
    m.done = 1;
    m.wait = 1;
    m.id = 0x123456789aULL, m.proto = 0xffffffffu, m.role = PS_ROLE_WORKER, m.shard = 65535, m.nshards = 65536;
    m.layout = &l, m.fp = ps_layout_fingerprint(&l);
    snprintf(m.mode, sizeof m.mode, "asgd");
    m.mver = 1, m.params = 2, m.need_init = 1, m.off = 3, m.len = 4, m.data = tensor, m.ndata = 3, m.fin = 0;
    m.min = 5, m.base = 6, m.poff = 7, m.plen = 8, m.code = INT32_MAX, m.text = "", m.text_len = 0;
    m.epoch = UINT32_MAX, m.loss = -1.5, m.acc = 1.0, m.samples = 9, m.tloss = 2.5, m.workers = 10;
    m.rate = 1e9, m.hb = UINT64_MAX;
    snprintf(m.cmd, sizeof m.cmd, "checkpoint");
    m.nargs = 2, m.args[0] = (ps_str){"a", 1}, m.args[1] = (ps_str){"b=c", 3};
    memset(m.nonce, 1, sizeof m.nonce), memset(m.cnonce, 2, sizeof m.cnonce);
    memset(m.proof, 3, sizeof m.proof), memset(m.sproof, 4, sizeof m.sproof);
    static const uint16_t halves[3] = {0x3f80, 0xc020, 0x7fc0};
    m.dt = PS_DT_BF16, m.data = NULL, m.data16 = halves, m.rdt = PS_DT_BF16;
    m.wire = PS_WIRE_BIT(PS_DT_F32) | PS_WIRE_BIT(PS_DT_BF16);
    round_trip(&m);
    /* and the status body next to it all */
    m.type = PS_MSG_STATUS_REPLY;
    round_trip(&m);
}

/* The fields of the second presence word (issue 43: replicas, pushes
 * applied once) round-trip next to the first word's, and a decoder checks
 * them: cid and pid not 0, addresses 1..PS_ADDR_MAX bytes, 1..PS_REPLICAS_MAX
 * of them. */
static void test_round_trip_second_word(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    ps_msg m;
    ps_msg_init(&m, PS_MSG_HELLO);
    hello_with(&m, &l);
    m.has2 = PS_F2_CID;
    m.cid = UINT64_MAX - 5;
    round_trip(&m);
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_POFF | PS_F_PLEN;
    m.data = tensor, m.ndata = 7, m.plen = 7;
    m.has2 = PS_F2_PID;
    m.pid = 1;
    round_trip(&m);
    ps_msg_init(&m, PS_MSG_ERROR);
    m.has = PS_F_CODE | PS_F_TEXT;
    m.code = -PS_ENOT_LEADER, m.text = "follows", m.text_len = 7;
    m.has2 = PS_F2_LEADER;
    m.leader = (ps_str){"10.0.0.1:7000", 13};
    round_trip(&m);
    ps_msg_init(&m, PS_MSG_WELCOME);
    m.has = PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS;
    snprintf(m.mode, sizeof m.mode, "asgd");
    m.has2 = PS_F2_REPLICAS | PS_F2_CID | PS_F2_PID | PS_F2_LEADER;
    m.cid = 3, m.pid = 4, m.leader = (ps_str){"a:1", 3};
    m.nreplicas = PS_REPLICAS_MAX;
    for (uint32_t i = 0; i < PS_REPLICAS_MAX; i++)
        m.replicas[i] = (ps_str){"host-xyz:7001", 6 + i};
    round_trip(&m);
    /* a reader's hello, a read replica's answer (PROTOCOL.md 15) */
    m.has2 = PS_F2_READER | PS_F2_LAG;
    m.reader = 1, m.lag = 0x123456789ull;
    round_trip(&m);

    /* refused: pid 0, cid 0, an empty address, too many replicas */
    mpw *w = mpw_new();
    ps_msg d;
    mp_map(w, 5), mp_str(w, "t"), mp_uint(w, PS_MSG_PUSH), mp_str(w, "base"), mp_uint(w, 0);
    mp_str(w, "off"), mp_uint(w, 0), mp_str(w, "pid"), mp_uint(w, 0), mp_str(w, "data"), mp_bin(w, tensor, 4, 0xc4);
    assert_int_equal(dec_copy(w, &d), PS_EBAD_FIELD);
    assert_non_null(strstr(err, "pid"));
    free(w);
    w = mpw_new();
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "v"), mp_uint(w, 1);
    mp_str(w, "role"), mp_str(w, "admin"), mp_str(w, "cid"), mp_uint(w, 0);
    assert_int_equal(dec_copy(w, &d), PS_EBAD_FIELD);
    assert_non_null(strstr(err, "cid"));
    free(w);
    w = mpw_new();
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_ERROR), mp_str(w, "code"), mp_uint(w, 25);
    mp_str(w, "text"), mp_str(w, "x"), mp_str(w, "leader"), mp_str(w, "");
    assert_int_equal(dec_copy(w, &d), PS_EBAD_FIELD);
    free(w);
    w = mpw_new();
    mp_map(w, 6), mp_str(w, "t"), mp_uint(w, PS_MSG_WELCOME), mp_str(w, "v"), mp_uint(w, 1);
    mp_str(w, "mode"), mp_str(w, "asgd"), mp_str(w, "ver"), mp_uint(w, 0), mp_str(w, "params"), mp_uint(w, 0);
    mp_str(w, "replicas"), mp_array(w, PS_REPLICAS_MAX + 1);
    for (uint32_t i = 0; i <= PS_REPLICAS_MAX; i++)
        mp_str(w, "h:1");
    assert_int_equal(dec_copy(w, &d), PS_EBAD_FIELD);
    assert_non_null(strstr(err, "replicas"));
    free(w);
}

/* Whatever precedes it, our encoder's "pad" puts the tensor at an offset of
 * the frame that is a multiple of PS_DATA_ALIGN. */
static void test_encode_alignment(void **state)
{
    (void)state;
    static const uint64_t ids[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 1ULL << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        for (uint64_t base = 0; base < 300; base += 97) {
            for (int fin = 0; fin <= 1; fin++) {
                ps_msg m;
                ps_msg_init(&m, PS_MSG_PUSH);
                m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | (fin ? PS_F_FIN : 0);
                m.id = ids[i], m.base = base, m.off = ids[i], m.data = tensor, m.ndata = 3;
                round_trip(&m);
            }
        }
    }
}

static void test_encode_header_only(void **state)
{
    (void)state;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PARAMS);
    m.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    m.id = 1, m.mver = 2, m.off = 0, m.data = tensor, m.ndata = 7;
    ps_buf out = {0};
    size_t dlen = 0;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), 0);
    assert_int_equal(dlen, 28);
    uint32_t plen = 0;
    assert_int_equal(ps_frame_header(out.p, out.len, UINT32_MAX, &plen), 1);
    /* the prefix counts the tensor bytes that the caller sends after out */
    assert_int_equal(plen, out.len - PS_FRAME_HDR + 28);
    const uint8_t bin32[5] = {0xc6, 0, 0, 0, 28};
    assert_memory_equal(out.p + out.len - 5, bin32, 5);
    /* a second encode into the same buffer replaces it */
    ps_msg_init(&m, PS_MSG_OK);
    m.has = PS_F_ID;
    m.id = 3;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), 0);
    assert_int_equal(dlen, 0);
    const uint8_t ok[] = {0, 0, 0, 8, 0x82, 0xa1, 't', 8, 0xa2, 'i', 'd', 3};
    assert_int_equal(out.len, sizeof ok);
    assert_memory_equal(out.p, ok, sizeof ok);
    ps_buf_free(&out);
}

static void test_encode_errors(void **state)
{
    (void)state;
    ps_msg m;
    ps_buf out = {0};
    size_t dlen = 0;
    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_DATA;
    m.data = tensor; /* never read: only the header is encoded */
    m.ndata = (PS_FRAME_MAX_HARD / 4) + 1;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), PS_ETOO_BIG);
    m.ndata = PS_FRAME_MAX_HARD / 4; /* the tensor fits, tensor + header does not */
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), PS_ETOO_BIG);
    m.ndata = UINT64_MAX / 4;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), PS_ETOO_BIG);

    ps_msg_init(&m, PS_MSG_STATUS_REPLY);
    m.has = PS_F_ID;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, pack_body_fails, NULL), PS_ENOMEM);
    ps_buf_free(&out);
}

/* A frame built by hand, without "pad": the tensor lands at every possible
 * misalignment; the decoder still gives the right floats at an aligned
 * address inside the payload, and fields after "data" are intact. */
static void test_decode_misaligned_data(void **state)
{
    (void)state;
    static const float vals[3] = {1.5f, -2.25f, 3e-5f};
    int seen[PS_DATA_ALIGN] = {0};
    static const uint8_t fmts[] = {0xc4, 0xc5, 0xc6};
    for (size_t f = 0; f < sizeof fmts; f++) {
        for (size_t k = 0; k < 4; k++) {
            for (int after = 0; after <= 1; after++) {
                mpw *w = mpw_new();
                w->n = PS_FRAME_HDR; /* room for the length prefix */
                mp_map(w, 6 + (uint32_t)after);
                mp_str(w, "t"), mp_uint(w, PS_MSG_PUSH);
                mp_str(w, "id"), mp_uint(w, 300);
                mp_str(w, "base"), mp_uint(w, 2);
                mp_str(w, "off"), mp_uint(w, 1);
                mp_str(w, "x"), mp_strn(w, "abc", k);
                mp_str(w, "data"), mp_bin(w, vals, sizeof vals, fmts[f]);
                size_t data_at = w->n - sizeof vals;
                if (after)
                    mp_str(w, "fin"), mp_bool(w, 0);
                ps_frame_put_len(w->b, (uint32_t)(w->n - PS_FRAME_HDR));
                seen[data_at % PS_DATA_ALIGN] = 1;

                uint32_t plen = 0;
                assert_int_equal(ps_frame_header(w->b, w->n, PS_FRAME_MAX_PREAUTH, &plen), 1);
                uint8_t *payload = heapdup(w->b + PS_FRAME_HDR, plen);
                ps_msg m;
                int rc = dec_inplace(payload, plen, &m);
                if (rc != 0)
                    fail_msg("fmt 0x%02x, k %zu: %s", fmts[f], k, err);
                assert_int_equal(m.type, PS_MSG_PUSH);
                assert_int_equal(m.id, 300);
                assert_int_equal(m.base, 2);
                assert_int_equal(m.off, 1);
                assert_int_equal(m.fin, after ? 0 : 1);
                assert_int_equal(m.ndata, 3);
                assert_int_equal((uintptr_t)m.data % PS_DATA_ALIGN, 0);
                assert_true((const uint8_t *)m.data >= payload);
                assert_true((const uint8_t *)(m.data + 3) <= payload + plen);
                assert_memory_equal(m.data, vals, sizeof vals);
                free(payload);
                free(w);
            }
        }
    }
    for (int i = 0; i < PS_DATA_ALIGN; i++)
        if (!seen[i])
            fail_msg("no case put the tensor at offset %d mod %d", i, PS_DATA_ALIGN);
}

/* Our own aligned frame, received at an odd address (as a second frame in a
 * read buffer would be): moved into alignment, values intact. */
static void test_decode_misaligned_payload(void **state)
{
    (void)state;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PARAMS);
    m.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    m.id = 1, m.mver = 2, m.off = 0, m.data = tensor, m.ndata = 7;
    ps_buf out = {0};
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    size_t plen = out.len - PS_FRAME_HDR;
    for (size_t shift = 1; shift < PS_DATA_ALIGN; shift++) {
        uint8_t *block = malloc(plen + shift);
        assert_non_null(block);
        memcpy(block + shift, out.p + PS_FRAME_HDR, plen);
        ps_msg d;
        assert_int_equal(dec_inplace(block + shift, plen, &d), 0);
        assert_int_equal(d.ndata, 7);
        assert_int_equal((uintptr_t)d.data % PS_DATA_ALIGN, 0);
        assert_true((const uint8_t *)d.data >= block + shift);
        assert_memory_equal(d.data, tensor, sizeof tensor);
        free(block);
    }
    ps_buf_free(&out);
}

/* ---- decode errors ------------------------------------------------------------- */

static const ps_layout *field_layout(void)
{
    static ps_layout l;
    static int done;
    if (!done) {
        ps_layout_init(&l);
        ps_layout_add(&l, "w", 1, (const uint32_t[]){2});
        done = 1;
    }
    return &l;
}

/* Writes field `bit` with a valid value. */
static void mp_field(mpw *w, uint64_t bit)
{
    static const float two[2] = {1, 2};
    static const uint8_t b32[32] = {0xc1, 1, 2, 3};
    if (bit == PS_F_DT || bit == PS_F_RDT || bit == PS_F_WIRE) {
        /* dt 0 (f32) keeps the sample data's meaning */
        mp_str(w, bit == PS_F_DT ? "dt" : bit == PS_F_RDT ? "rdt" : "wire");
        mp_uint(w, bit == PS_F_DT ? PS_DT_F32 : bit == PS_F_RDT ? PS_DT_BF16 : PS_WIRE_BIT(PS_DT_BF16));
        return;
    }
    if (bit == PS_F_NONCE || bit == PS_F_CNONCE || bit == PS_F_PROOF || bit == PS_F_SPROOF) {
        /* 64-bit bits cannot be case labels of this switch on an int */
        mp_str(w, bit == PS_F_NONCE ? "nonce" : bit == PS_F_CNONCE ? "cnonce" : bit == PS_F_PROOF ? "proof" : "sproof");
        mp_bin(w, b32, sizeof b32, 0);
        return;
    }
    if (bit == PS_F_SHM) {
        mp_str(w, "shm"), mp_array(w, 2), mp_uint(w, 4321), mp_uint(w, 5);
        return;
    }
    if (bit == PS_F_HOGWILD || bit == PS_F_TSHM) {
        mp_str(w, bit == PS_F_HOGWILD ? "hogwild" : "tshm"), mp_array(w, 2), mp_uint(w, 4321), mp_uint(w, 6);
        return;
    }
    if (bit == PS_F_TINSHM) {
        mp_str(w, "tinshm"), mp_bool(w, 1);
        return;
    }
    if (bit == PS_F_SEG) {
        mp_str(w, "seg"), mp_array(w, 4), mp_uint(w, 0), mp_uint(w, 2), mp_uint(w, 1), mp_uint(w, 4096);
        return;
    }
    if (bit == PS_F_LR) {
        mp_str(w, "lr"), mp_f64(w, 0.05);
        return;
    }
    if (bit == PS_F_PLAN) {
        mp_str(w, "plan"), mp_array(w, 4), mp_uint(w, 2), mp_uint(w, 600), mp_uint(w, 192), mp_uint(w, 7);
        return;
    }
    if (bit == PS_F_SLICE) {
        mp_str(w, "slice"), mp_array(w, 5), mp_uint(w, 1), mp_uint(w, 192), mp_uint(w, 256), mp_uint(w, 1),
            mp_uint(w, 3);
        return;
    }
    if (bit == PS_F_PIECE) {
        mp_str(w, "piece"), mp_uint(w, 65536);
        return;
    }
    if (bit == PS_F_LOCAL || bit == PS_F_TAU) {
        mp_str(w, bit == PS_F_LOCAL ? "local" : "tau"), mp_uint(w, bit == PS_F_LOCAL ? 8 : 4);
        return;
    }
    if (bit == PS_F_ALPHA) {
        mp_str(w, "alpha"), mp_f64(w, 0.25);
        return;
    }
    if (bit == PS_F_DONE || bit == PS_F_WAIT) {
        mp_str(w, bit == PS_F_DONE ? "done" : "wait"), mp_bool(w, 1);
        return;
    }
    if (bit == PS_F_TAB || bit == PS_F_RINIT || bit == PS_F_OPT) {
        mp_str(w, bit == PS_F_TAB ? "tab" : bit == PS_F_RINIT ? "rinit" : "opt");
        mp_str(w, bit == PS_F_TAB ? "emb" : bit == PS_F_RINIT ? "uniform" : "adagrad");
        return;
    }
    if (bit == PS_F_DIM || bit == PS_F_SEED) {
        mp_str(w, bit == PS_F_DIM ? "dim" : "seed"), mp_uint(w, bit == PS_F_DIM ? 2 : 7);
        return;
    }
    if (bit == PS_F_SCALE) {
        mp_str(w, "scale"), mp_f64(w, 0.05);
        return;
    }
    if (bit == PS_F_HP) {
        mp_str(w, "hp"), mp_map(w, 2), mp_str(w, "lr"), mp_f64(w, 0.1), mp_str(w, "eps"), mp_uint(w, 1);
        return;
    }
    if (bit == PS_F_KEYS || bit == PS_F_PKEYS) {
        static const uint8_t k8[8] = {42};
        mp_str(w, bit == PS_F_KEYS ? "keys" : "pkeys"), mp_bin(w, k8, sizeof k8, 0);
        return;
    }
    if (bit == PS_F_INSHM) {
        /* false: true would stand in for "data" (see below) */
        mp_str(w, "inshm"), mp_bool(w, 0);
        return;
    }
    switch (bit) {
    case PS_F_ID: mp_str(w, "id"), mp_uint(w, 7); break;
    case PS_F_VERSION: mp_str(w, "v"), mp_uint(w, PS_PROTO_VERSION); break;
    case PS_F_ROLE: mp_str(w, "role"), mp_str(w, "admin"); break;
    case PS_F_SHARD: mp_str(w, "shard"), mp_array(w, 2), mp_uint(w, 0), mp_uint(w, 1); break;
    case PS_F_PART: mp_str(w, "part"), mp_array(w, 2), mp_uint(w, 1), mp_uint(w, 2); break;
    case PS_F_LAYOUT:
        mp_str(w, "layout"), mp_array(w, 1), mp_array(w, 2), mp_str(w, "w"), mp_array(w, 1), mp_uint(w, 2);
        break;
    case PS_F_FP: mp_str(w, "fp"), mp_uint(w, ps_layout_fingerprint(field_layout())); break;
    case PS_F_MODE: mp_str(w, "mode"), mp_str(w, "bsp"); break;
    case PS_F_MVER: mp_str(w, "ver"), mp_uint(w, 3); break;
    case PS_F_PARAMS: mp_str(w, "params"), mp_uint(w, 2); break;
    case PS_F_INIT: mp_str(w, "init"), mp_bool(w, 1); break;
    case PS_F_OFF: mp_str(w, "off"), mp_uint(w, 0); break;
    case PS_F_LEN: mp_str(w, "len"), mp_uint(w, 2); break;
    case PS_F_DATA: mp_str(w, "data"), mp_bin(w, two, sizeof two, 0); break;
    case PS_F_FIN: mp_str(w, "fin"), mp_bool(w, 1); break;
    case PS_F_MIN: mp_str(w, "min"), mp_uint(w, 0); break;
    case PS_F_BASE: mp_str(w, "base"), mp_uint(w, 0); break;
    case PS_F_POFF: mp_str(w, "poff"), mp_uint(w, 0); break;
    case PS_F_PLEN: mp_str(w, "plen"), mp_uint(w, 2); break;
    case PS_F_CODE: mp_str(w, "code"), mp_uint(w, 5); break;
    case PS_F_TEXT: mp_str(w, "text"), mp_str(w, "bad"); break;
    case PS_F_BODY: mp_str(w, "body"), mp_map(w, 0); break;
    case PS_F_EPOCH: mp_str(w, "epoch"), mp_uint(w, 1); break;
    case PS_F_LOSS: mp_str(w, "loss"), mp_f64(w, 0.5); break;
    case PS_F_ACC: mp_str(w, "acc"), mp_f32(w, 0.75f); break;
    case PS_F_SAMPLES: mp_str(w, "samples"), mp_uint(w, 64); break;
    case PS_F_TLOSS: mp_str(w, "tloss"), mp_uint(w, 1); break;
    case PS_F_WORKERS: mp_str(w, "workers"), mp_uint(w, 2); break;
    case PS_F_RATE: mp_str(w, "rate"), mp_f64(w, 100.0); break;
    case PS_F_HB: mp_str(w, "hb"), mp_uint(w, 30000); break;
    case PS_F_CMD: mp_str(w, "cmd"), mp_str(w, "pause"); break;
    case PS_F_ARGS: mp_str(w, "args"), mp_array(w, 2), mp_str(w, "lr=0.1"), mp_str(w, ""); break;
    default: fail_msg("no sample for field bit 0x%llx", (unsigned long long)bit);
    }
}

/* Every field, in the order of its PS_F_* bit. */
#define NFIELDS 63
_Static_assert(NFIELDS == PS_F_COUNT, "a row for every PS_F_* bit");
static const char *const field_names[NFIELDS] = {"id",  "v",     "role",  "shard", "layout", "fp",      "mode",
                                             "ver", "params", "init", "off",   "len",    "data",    "fin",
                                             "min", "base",  "poff",  "plen",  "code",   "text",    "body",
                                             "epoch", "loss", "acc",  "samples", "tloss", "workers", "rate",
                                             "hb", "cmd", "args", "nonce", "cnonce", "proof", "sproof",
                                             "dt", "rdt", "wire", "shm", "inshm", "plan", "slice", "done",
                                             "wait", "piece", "tab", "dim", "rinit", "scale", "seed", "opt",
                                             "hp", "keys", "pkeys", "part", "local", "alpha", "tau",
                                             "hogwild", "lr", "tshm", "tinshm", "seg"};

/* A map of "t": type and the fields in `bits`, each with a valid value. */
static void mp_message(mpw *w, uint64_t type, uint64_t bits)
{
    uint32_t n = 1;
    for (uint64_t b = bits; b; b &= b - 1)
        n++;
    mp_map(w, n);
    mp_str(w, "t"), mp_uint(w, type);
    for (unsigned i = 0; i < NFIELDS; i++)
        if (bits & (1ull << i))
            mp_field(w, 1ull << i);
}

/* The fields each type must carry, as PROTOCOL.md lists them (the types
 * up to ROWS; proto/messages.def declares them, and a later type's fields
 * are taken from there: integration_docs holds it to PROTOCOL.md). */
static const uint64_t required_spec[PS_MSG_ROWS + 1] = {
    [PS_MSG_HELLO] = PS_F_VERSION | PS_F_ROLE,
    [PS_MSG_WELCOME] = PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS,
    [PS_MSG_INIT] = PS_F_OFF | PS_F_DATA,
    [PS_MSG_PUSH] = PS_F_BASE | PS_F_OFF | PS_F_DATA,
    [PS_MSG_PULL] = PS_F_OFF | PS_F_LEN,
    [PS_MSG_PUSHPULL] = PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_POFF | PS_F_PLEN,
    [PS_MSG_PARAMS] = PS_F_MVER | PS_F_OFF | PS_F_DATA,
    [PS_MSG_STATUS_REPLY] = PS_F_BODY,
    [PS_MSG_METRICS_REPLY] = PS_F_TEXT,
    [PS_MSG_REPORT] = PS_F_EPOCH,
    [PS_MSG_ERROR] = PS_F_CODE | PS_F_TEXT,
    [PS_MSG_ADMIN] = PS_F_CMD,
    [PS_MSG_CHALLENGE] = PS_F_NONCE,
    [PS_MSG_AUTH] = PS_F_CNONCE | PS_F_PROOF,
    [PS_MSG_BARRIER] = PS_F_MVER,
    [PS_MSG_TABLE] = PS_F_TAB | PS_F_DIM | PS_F_RINIT | PS_F_OPT,
    [PS_MSG_TPULL] = PS_F_TAB | PS_F_KEYS,
    [PS_MSG_TPUSH] = PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA,
    [PS_MSG_TPUSHPULL] = PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA | PS_F_PKEYS,
    [PS_MSG_ROWS] = PS_F_MVER | PS_F_DATA,
};

static uint64_t required_of(uint32_t type)
{
    return type <= PS_MSG_ROWS ? required_spec[type] : ps_msg_required(type);
}

static void test_decode_every_field_accepted(void **state)
{
    (void)state;
    /* every field's sample value decodes, alone or all together */
    for (unsigned i = 0; i < NFIELDS; i++) {
        mpw *w = mpw_new();
        mp_message(w, PS_MSG_HEARTBEAT, 1ull << i);
        ps_msg m;
        int rc = dec_copy(w, &m);
        if (rc != 0)
            fail_msg("field %s: %s", field_names[i], err);
        assert_int_equal(m.has, 1ull << i);
        free(w);
    }
    mpw *w = mpw_new();
    mp_message(w, PS_MSG_HEARTBEAT, (1ull << NFIELDS) - 1);
    ps_msg m;
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.has, (1ull << NFIELDS) - 1);
    free(w);
}

static void test_decode_missing_required(void **state)
{
    (void)state;
    for (uint32_t type = 1; type <= PS_MSG_TYPE_MAX; type++) {
        mpw *w = mpw_new();
        ps_msg m;
        /* all required fields: fine */
        mp_message(w, type, required_of(type) | PS_F_ID);
        int rc = dec_copy(w, &m);
        if (rc != 0)
            fail_msg("%s with its required fields: %s", ps_msg_type_name(type), err);
        assert_int_equal(m.type, type);
        /* each one left out */
        for (unsigned i = 0; i < NFIELDS; i++) {
            uint64_t bit = 1ull << i;
            if (!(required_of(type) & bit))
                continue;
            w->n = 0;
            mp_message(w, type, (required_of(type) & ~bit) | PS_F_ID);
            rc = dec_copy(w, &m);
            if (rc != PS_EBAD_FIELD)
                fail_msg("%s without %s: %d", ps_msg_type_name(type), field_names[i], rc);
            char want[64];
            snprintf(want, sizeof want, "missing field '%s'", field_names[i]);
            assert_msg_has(err, want);
            assert_msg_has(err, ps_msg_type_name(type));
            /* the id was read before the error: a reply can carry it */
            assert_true(m.has & PS_F_ID);
            assert_int_equal(m.id, 7);
        }
        free(w);
    }
}

typedef struct badcase {
    const char *what;
    int code;
    const char *needle; /* in the error message */
} badcase;

static void expect(mpw *w, const badcase *c)
{
    ps_msg m;
    int rc = dec_copy(w, &m);
    if (rc != c->code)
        fail_msg("%s: decode returned %d (%s), expected %d; message: %s", c->what, rc, ps_errname(rc), c->code,
                 err);
    assert_msg_has(err, c->needle);
    w->n = 0;
}

/* "seg" puts a table request's keys and rows in the worker's table
 * segment (PROTOCOL.md 13.9): a tpull, tpush or tpushpull with it carries
 * neither "keys", "pkeys", "data" nor their forms; a ROWS with "inshm"
 * has "len" for "data". */
static void test_decode_seg(void **state)
{
    (void)state;
    mpw *w = mpw_new();
    ps_msg m;
    uint64_t tpp = PS_F_ID | PS_F_TAB | PS_F_BASE | PS_F_SEG;
    mp_message(w, PS_MSG_TPUSHPULL, tpp);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.seg.at, 0);
    assert_int_equal(m.seg.n, 2);
    assert_int_equal(m.seg.m, 1);
    assert_int_equal(m.seg.rat, 4096);
    assert_int_equal(m.keys.n, 0);
    w->n = 0;
    mp_message(w, PS_MSG_TPUSHPULL, PS_F_ID | PS_F_TAB | PS_F_SEG);
    expect(w, &(badcase){"seg without base", PS_EBAD_FIELD, "missing field 'base'"});
    mp_message(w, PS_MSG_TPUSHPULL, tpp | PS_F_KEYS);
    expect(w, &(badcase){"seg and keys", PS_EBAD_FIELD, "'seg' and 'keys' together"});
    mp_message(w, PS_MSG_TPUSH, tpp | PS_F_RDT);
    expect(w, &(badcase){"seg and rdt", PS_EBAD_FIELD, "'seg' and 'rdt' together"});
    mp_message(w, PS_MSG_TPUSH, tpp);
    expect(w, &(badcase){"tpush with a seg's m", PS_EBAD_FIELD, "0 outside a tpushpull"});
    static const struct {
        uint64_t v[4];
        const char *what;
    } bad[] = {{{4, 2, 1, 4096}, "at not a multiple of 8"},
               {{0, 0, 1, 4096}, "no keys"},
               {{0, PS_TABLE_KEYS_MAX + 1, 1, 4096}, "too many keys"},
               {{0, 2, 1, 1u << 26}, "rat past 2^26"},
               {{0, 2, 1, 4100}, "rat not a multiple of 8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mp_map(w, 5), mp_str(w, "t"), mp_uint(w, PS_MSG_TPUSHPULL), mp_field(w, PS_F_TAB), mp_field(w, PS_F_BASE),
            mp_field(w, PS_F_ID);
        mp_str(w, "seg"), mp_array(w, 4);
        for (int j = 0; j < 4; j++)
            mp_uint(w, bad[i].v[j]);
        expect(w, &(badcase){bad[i].what, PS_EBAD_FIELD, "seg must be [at, n, m, rat]"});
    }
    /* a tpull by key in the segment: neither keys nor len */
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_TPULL), mp_field(w, PS_F_TAB), mp_field(w, PS_F_ID);
    mp_str(w, "seg"), mp_array(w, 4), mp_uint(w, 64), mp_uint(w, 3), mp_uint(w, 0), mp_uint(w, 0);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.seg.n, 3);
    w->n = 0;
    mp_message(w, PS_MSG_ROWS, PS_F_ID | PS_F_MVER | PS_F_LEN), mp_str(w, "inshm"), mp_bool(w, 1);
    w->b[0]++;
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.inshm);
    assert_int_equal(m.ndata, 0);
    w->n = 0;
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "tshm"), mp_array(w, 2), mp_uint(w, 0),
        mp_uint(w, 3);
    expect(w, &(badcase){"tshm pid 0", PS_EBAD_FIELD, "tshm must be [pid, fd]"});
    free(w);
}

/* "inshm": true stands in for "data" in a pushpull or params, which then
 * need "len"; both together, or "shm" that is not [pid, fd], are errors. */
static void test_decode_inshm(void **state)
{
    (void)state;
    mpw *w = mpw_new();
    ps_msg m;
    uint64_t pp = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_POFF | PS_F_PLEN;
    mp_message(w, PS_MSG_PUSHPULL, pp | PS_F_LEN), mp_str(w, "inshm"), mp_bool(w, 1);
    w->b[0]++; /* one more map entry */
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.inshm);
    assert_int_equal(m.len, 2);
    assert_int_equal(m.ndata, 0);
    w->n = 0;
    mp_message(w, PS_MSG_PUSHPULL, pp), mp_str(w, "inshm"), mp_bool(w, 1);
    w->b[0]++;
    expect(w, &(badcase){"inshm without len", PS_EBAD_FIELD, "missing field 'len'"});
    mp_message(w, PS_MSG_PUSHPULL, pp | PS_F_LEN | PS_F_DATA), mp_str(w, "inshm"), mp_bool(w, 1);
    w->b[0]++;
    expect(w, &(badcase){"inshm and data", PS_EBAD_FIELD, "'data' and 'inshm' together"});
    mp_message(w, PS_MSG_PARAMS, PS_F_MVER | PS_F_OFF | PS_F_LEN), mp_str(w, "inshm"), mp_bool(w, 1);
    w->b[0]++;
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.inshm);
    w->n = 0;
    /* inshm false: data is required as ever */
    mp_message(w, PS_MSG_PUSHPULL, pp | PS_F_LEN | PS_F_INSHM);
    expect(w, &(badcase){"inshm false without data", PS_EBAD_FIELD, "missing field 'data'"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "shm"), mp_array(w, 2), mp_uint(w, 0),
        mp_uint(w, 3);
    expect(w, &(badcase){"shm pid 0", PS_EBAD_FIELD, "shm must be [pid, fd]"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "shm"), mp_str(w, "/dev/shm/x");
    expect(w, &(badcase){"shm a path", PS_EBAD_FIELD, "shm must be [pid, fd]"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "shm"), mp_array(w, 3), mp_uint(w, 1),
        mp_uint(w, 3), mp_uint(w, 3);
    expect(w, &(badcase){"shm of 3", PS_EBAD_FIELD, "shm must be [pid, fd]"});
    /* [pid, fd, goff, poff] (test_round_trip_shm): offsets of at most 2^35 */
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "shm"), mp_array(w, 4), mp_uint(w, 77),
        mp_uint(w, 3), mp_uint(w, 0), mp_uint(w, (1ull << 35) + 1);
    expect(w, &(badcase){"shm offset past 2^35", PS_EBAD_FIELD, "[pid, fd, goff, poff]"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "shm"), mp_array(w, 4), mp_uint(w, 77),
        mp_uint(w, 3), mp_int(w, -1), mp_uint(w, 5);
    expect(w, &(badcase){"shm offset negative", PS_EBAD_FIELD, "[pid, fd, goff, poff]"});
    /* the plan: [epochs, samples, batch, seed], each in its bounds */
    static const uint64_t bad_plans[][4] = {
        {0, 600, 64, 1}, {(1ull << 20) + 1, 600, 64, 1}, {1, 0, 1, 1}, {1, (1ull << 40) + 1, 1, 1},
        {1, 600, 0, 1}, {1, 600, 601, 1},
    };
    for (size_t i = 0; i < sizeof bad_plans / sizeof bad_plans[0]; i++) {
        mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "plan"), mp_array(w, 4);
        for (int j = 0; j < 4; j++)
            mp_uint(w, bad_plans[i][j]);
        expect(w, &(badcase){"plan out of bounds", PS_EBAD_FIELD, "plan must be [epochs, samples, batch, seed]"});
    }
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "plan"), mp_array(w, 3), mp_uint(w, 1),
        mp_uint(w, 2), mp_uint(w, 1);
    expect(w, &(badcase){"plan of 3", PS_EBAD_FIELD, "plan must be [epochs, samples, batch, seed]"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "plan"), mp_array(w, 4), mp_uint(w, 1),
        mp_uint(w, 2), mp_uint(w, 1), mp_int(w, -1);
    expect(w, &(badcase){"plan seed negative", PS_EBAD_FIELD, "plan must be [epochs, samples, batch, seed]"});
    /* the slice: [epoch, lo, hi, rank, count], lo <= hi, rank < count */
    static const uint64_t bad_slices[][5] = {
        {0, 5, 4, 0, 1}, {0, 0, (1ull << 40) + 1, 0, 1}, {0, 0, 1, 1, 1}, {0, 0, 1, 0, 0}, {0, 0, 1, 0, 65537},
    };
    for (size_t i = 0; i < sizeof bad_slices / sizeof bad_slices[0]; i++) {
        mp_map(w, 2), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_str(w, "slice"), mp_array(w, 5);
        for (int j = 0; j < 5; j++)
            mp_uint(w, bad_slices[i][j]);
        expect(w, &(badcase){"slice out of bounds", PS_EBAD_FIELD, "slice must be [epoch, lo, hi, rank, count]"});
    }
    free(w);
}

/* Our encoder writes "shm" as [pid, fd], or with the offsets when shm_at,
 * and decodes to the same. */
static void test_round_trip_shm(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    for (int at = 0; at < 2; at++) {
        ps_msg m, d;
        ps_msg_init(&m, PS_MSG_HELLO);
        m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_SHM;
        m.id = 1, m.proto = 1, m.role = PS_ROLE_WORKER, m.shard = 0, m.nshards = 2, m.layout = &l;
        m.shm_pid = 4242, m.shm_fd = 9, m.shm_at = at, m.shm_goff = 1u << 20, m.shm_poff = 3u << 20;
        ps_buf out = {0};
        assert_int_equal(ps_msg_encode_full(&m, &out), 0);
        uint8_t *p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
        assert_int_equal(dec_inplace(p, out.len - PS_FRAME_HDR, &d), 0);
        assert_int_equal(d.shm_pid, 4242);
        assert_int_equal(d.shm_fd, 9);
        assert_int_equal(d.shm_at, at);
        assert_int_equal(d.shm_goff, at ? 1u << 20 : 0);
        assert_int_equal(d.shm_poff, at ? 3u << 20 : 0);
        free(p);
        ps_buf_free(&out);
    }
}

/* "wait" (PROTOCOL.md, HEARTBEAT): a heartbeat asking what its parked pull
 * waits for, and psd's OK that tells it in "text", through our encoder and
 * as another encoder writes them. */
static void test_wait_field(void **state)
{
    (void)state;
    static const char why[] = "round 3 waits for shard 2/3 (never joined)";
    ps_msg m, d;
    ps_buf out = {0};
    /* the heartbeat: no id (no reply unless a pull is parked) */
    ps_msg_init(&m, PS_MSG_HEARTBEAT);
    m.has = PS_F_WAIT;
    m.wait = 1;
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    uint8_t *p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    assert_int_equal(dec_inplace(p, out.len - PS_FRAME_HDR, &d), 0);
    assert_int_equal(d.type, PS_MSG_HEARTBEAT);
    assert_int_equal(d.has, PS_F_WAIT);
    assert_int_equal(d.wait, 1);
    free(p);
    /* psd's answer: OK, id 0, with the text */
    out.len = 0;
    ps_msg_init(&m, PS_MSG_OK);
    m.has = PS_F_ID | PS_F_MVER | PS_F_WAIT | PS_F_TEXT;
    m.id = 0, m.mver = 3, m.wait = 1, m.text = why, m.text_len = (uint32_t)strlen(why);
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    assert_int_equal(dec_inplace(p, out.len - PS_FRAME_HDR, &d), 0);
    assert_int_equal(d.type, PS_MSG_OK);
    assert_int_equal(d.has, PS_F_ID | PS_F_MVER | PS_F_WAIT | PS_F_TEXT);
    assert_int_equal(d.id, 0);
    assert_int_equal(d.wait, 1);
    assert_int_equal(d.text_len, strlen(why));
    assert_memory_equal(d.text, why, strlen(why));
    free(p);
    ps_buf_free(&out);
    /* written by hand, keys in another order, "wait" false */
    mpw *w = mpw_new();
    mp_map(w, 4);
    mp_str(w, "text"), mp_str(w, why);
    mp_str(w, "wait"), mp_bool(w, 0);
    mp_str(w, "t"), mp_uint(w, PS_MSG_OK);
    mp_str(w, "id"), mp_uint(w, 9);
    p = heapdup(w->b, w->n);
    assert_int_equal(dec_inplace(p, w->n, &d), 0);
    assert_int_equal(d.type, PS_MSG_OK);
    assert_true(d.has & PS_F_WAIT);
    assert_int_equal(d.wait, 0);
    assert_int_equal(d.id, 9);
    assert_memory_equal(d.text, why, strlen(why));
    free(p);
    /* twice is refused like any field */
    w->n = 0;
    mp_map(w, 3);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
    mp_str(w, "wait"), mp_bool(w, 1);
    mp_str(w, "wait"), mp_bool(w, 1);
    expect(w, &(badcase){"wait twice", PS_EBAD_FIELD, "field 'wait' appears twice"});
    free(w);
}

static void test_decode_type_errors(void **state)
{
    (void)state;
    mpw *w = mpw_new();

    mp_map(w, 1), mp_str(w, "id"), mp_uint(w, 1);
    expect(w, &(badcase){"no t", PS_EMALFORMED, "'t'"});
    mp_map(w, 1), mp_str(w, "t"), mp_str(w, "push");
    expect(w, &(badcase){"t a string", PS_EMALFORMED, "'t'"});
    mp_map(w, 1), mp_str(w, "t"), mp_int(w, -4);
    expect(w, &(badcase){"t negative", PS_EMALFORMED, "'t'"});
    mp_map(w, 1), mp_str(w, "T"), mp_uint(w, 4);
    expect(w, &(badcase){"T not t", PS_EMALFORMED, "'t'"});
    mp_map(w, 0);
    expect(w, &(badcase){"empty map", PS_EMALFORMED, "'t'"});
    mp_map(w, 1), mp_str(w, "t"), mp_uint(w, 0);
    expect(w, &(badcase){"type 0", PS_EBAD_TYPE, "unknown message type 0"});
    mp_map(w, 1), mp_str(w, "t"), mp_uint(w, PS_MSG_TYPE_MAX + 1);
    char past[48]; /* "unknown message type 26" while ROWS (25) is the last */
    snprintf(past, sizeof past, "unknown message type %d", PS_MSG_TYPE_MAX + 1);
    expect(w, &(badcase){"the type after the last", PS_EBAD_TYPE, past});
    mp_map(w, 1), mp_str(w, "t"), mp_uint(w, UINT64_MAX);
    expect(w, &(badcase){"type 2^64-1", PS_EBAD_TYPE, "18446744073709551615"});

    mp_array(w, 2), mp_str(w, "t"), mp_uint(w, 9);
    expect(w, &(badcase){"array at top", PS_EMALFORMED, "not a map"});
    mp_uint(w, 9);
    expect(w, &(badcase){"int at top", PS_EMALFORMED, "not a map"});
    mp_str(w, "hello");
    expect(w, &(badcase){"string at top", PS_EMALFORMED, "not a map"});

    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, 9), mp_uint(w, 1), mp_uint(w, 2);
    expect(w, &(badcase){"int key", PS_EMALFORMED, "keys must be strings"});
    mp_map(w, 2), mp_u8(w, 0xc4), mp_u8(w, 1), mp_u8(w, 't'), mp_uint(w, 9), mp_str(w, "t"), mp_uint(w, 9);
    expect(w, &(badcase){"bin key", PS_EMALFORMED, "keys must be strings"});
    mp_map(w, 2), mp_str(w, "t"), mp_uint(w, 9), mp_nil(w), mp_nil(w);
    expect(w, &(badcase){"nil key", PS_EMALFORMED, "keys must be strings"});
    free(w);
}

static void test_decode_field_errors(void **state)
{
    (void)state;
    mpw *w = mpw_new();
    static const float two[2] = {1, 2};

#define FIELD_IS(key, ...)                                                                                        \
    do {                                                                                                           \
        mp_map(w, 3);                                                                                              \
        mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);                                                             \
        mp_str(w, "id"), mp_uint(w, 1);                                                                           \
        mp_str(w, key);                                                                                            \
        __VA_ARGS__;                                                                                               \
    } while (0)

    FIELD_IS("off", mp_str(w, "0"));
    expect(w, &(badcase){"off a string", PS_EBAD_FIELD, "field 'off' must be a non-negative integer"});
    FIELD_IS("off", mp_int(w, -1));
    expect(w, &(badcase){"off negative", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("off", mp_int(w, INT64_MIN));
    expect(w, &(badcase){"off int64 min", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("off", mp_f64(w, 1.0));
    expect(w, &(badcase){"off a float", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("off", mp_f32(w, 1.0f));
    expect(w, &(badcase){"off a float32", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("off", mp_bool(w, 1));
    expect(w, &(badcase){"off a bool", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("off", mp_nil(w));
    expect(w, &(badcase){"off nil", PS_EBAD_FIELD, "'off'"});
    FIELD_IS("len", mp_str(w, "1"));
    expect(w, &(badcase){"len a string", PS_EBAD_FIELD, "'len'"});
    FIELD_IS("min", mp_int(w, -5));
    expect(w, &(badcase){"min negative", PS_EBAD_FIELD, "'min'"});
    FIELD_IS("ver", mp_f64(w, 2.5));
    expect(w, &(badcase){"ver a float", PS_EBAD_FIELD, "'ver'"});
    FIELD_IS("v", mp_uint(w, 1ULL << 32));
    expect(w, &(badcase){"v over 32 bits", PS_EBAD_FIELD, "'v' must be an integer 0..2^32-1"});
    FIELD_IS("epoch", mp_int(w, -1));
    expect(w, &(badcase){"epoch negative", PS_EBAD_FIELD, "'epoch'"});
    FIELD_IS("workers", mp_str(w, "2"));
    expect(w, &(badcase){"workers a string", PS_EBAD_FIELD, "'workers'"});
    FIELD_IS("wait", mp_uint(w, 1));
    expect(w, &(badcase){"wait an int", PS_EBAD_FIELD, "'wait' must be a boolean"});
    FIELD_IS("wait", mp_str(w, "yes"));
    expect(w, &(badcase){"wait a string", PS_EBAD_FIELD, "'wait'"});
    FIELD_IS("fin", mp_uint(w, 1));
    expect(w, &(badcase){"fin an int", PS_EBAD_FIELD, "'fin' must be a boolean"});
    FIELD_IS("init", mp_nil(w));
    expect(w, &(badcase){"init nil", PS_EBAD_FIELD, "'init'"});
    FIELD_IS("loss", mp_str(w, "0.5"));
    expect(w, &(badcase){"loss a string", PS_EBAD_FIELD, "field 'loss' must be a number"});
    FIELD_IS("rate", mp_nil(w));
    expect(w, &(badcase){"rate nil", PS_EBAD_FIELD, "'rate'"});
    FIELD_IS("role", mp_str(w, "boss"));
    expect(w, &(badcase){"role unknown", PS_EBAD_FIELD, "role must be"});
    FIELD_IS("role", mp_uint(w, 1));
    expect(w, &(badcase){"role an int", PS_EBAD_FIELD, "role must be"});
    FIELD_IS("mode", mp_str(w, "sixteen-chars-xx"));
    expect(w, &(badcase){"mode too long", PS_EBAD_FIELD, "mode"});
    FIELD_IS("mode", mp_str(w, ""));
    expect(w, &(badcase){"mode empty", PS_EBAD_FIELD, "mode"});
    FIELD_IS("text", mp_uint(w, 3));
    expect(w, &(badcase){"text an int", PS_EBAD_FIELD, "text must be a string"});
    FIELD_IS("body", mp_array(w, 0));
    expect(w, &(badcase){"body an array", PS_EBAD_FIELD, "body must be a map"});
    FIELD_IS("cmd", mp_str(w, ""));
    expect(w, &(badcase){"cmd empty", PS_EBAD_FIELD, "cmd must be a string of 1..31 bytes"});
    FIELD_IS("cmd", mp_str(w, "set-32-chars-long-command-name!!"));
    expect(w, &(badcase){"cmd too long", PS_EBAD_FIELD, "cmd must be"});
    FIELD_IS("cmd", mp_uint(w, 1));
    expect(w, &(badcase){"cmd an int", PS_EBAD_FIELD, "cmd must be"});
    FIELD_IS("cmd", mp_bin(w, "pause", 5, 0xc4));
    expect(w, &(badcase){"cmd a bin", PS_EBAD_FIELD, "cmd must be"});
    FIELD_IS("args", mp_str(w, "lr=0.1"));
    expect(w, &(badcase){"args a string", PS_EBAD_FIELD, "args must be an array of at most 16 strings"});
    FIELD_IS("args", mp_array(w, 2), mp_str(w, "a"), mp_uint(w, 1));
    expect(w, &(badcase){"args with an int", PS_EBAD_FIELD, "args[1] must be a string"});
    FIELD_IS("args", mp_array(w, 1), mp_nil(w));
    expect(w, &(badcase){"args with nil", PS_EBAD_FIELD, "args[0]"});
    FIELD_IS("args", mp_array(w, PS_ARGS_MAX + 1); for (int i = 0; i <= PS_ARGS_MAX; i++) mp_str(w, "a"));
    expect(w, &(badcase){"17 args", PS_EBAD_FIELD, "at most 16"});
    {
        static char big[PS_ARG_MAX + 2];
        memset(big, 'y', PS_ARG_MAX + 1);
        FIELD_IS("args", mp_array(w, 1), mp_str(w, big));
        expect(w, &(badcase){"an argument of 1025 bytes", PS_EBAD_FIELD, "at most 1024 bytes"});
    }
    FIELD_IS("code", mp_str(w, "5"));
    expect(w, &(badcase){"code a string", PS_EBAD_FIELD, "code must be"});
    FIELD_IS("code", mp_uint(w, 1ULL << 31));
    expect(w, &(badcase){"code over int32", PS_EBAD_FIELD, "code must be"});
    FIELD_IS("code", mp_int(w, -(INT64_C(1) << 40)));
    expect(w, &(badcase){"code under int32", PS_EBAD_FIELD, "code must be"});
    FIELD_IS("data", mp_str(w, "abcd"));
    expect(w, &(badcase){"data a string", PS_EBAD_FIELD, "data must be bin"});
    FIELD_IS("data", mp_bin(w, two, 7, 0));
    expect(w, &(badcase){"data 7 bytes", PS_EBAD_FIELD, "data has 7 bytes, not a multiple of 4"});
    FIELD_IS("data", mp_bin(w, two, 1, 0xc6));
    expect(w, &(badcase){"data 1 byte", PS_EBAD_FIELD, "not a multiple of 4"});
    {
        static const uint8_t b33[33];
        FIELD_IS("nonce", mp_bin(w, b33, 31, 0));
        expect(w, &(badcase){"nonce of 31 bytes", PS_EBAD_FIELD, "field 'nonce' must be a bin of 32 bytes"});
        FIELD_IS("cnonce", mp_bin(w, b33, 33, 0));
        expect(w, &(badcase){"cnonce of 33 bytes", PS_EBAD_FIELD, "'cnonce'"});
        FIELD_IS("proof", mp_str(w, "0123456789abcdef0123456789abcdef"));
        expect(w, &(badcase){"proof a string", PS_EBAD_FIELD, "'proof' must be a bin"});
        FIELD_IS("sproof", mp_nil(w));
        expect(w, &(badcase){"sproof nil", PS_EBAD_FIELD, "'sproof'"});
    }
    FIELD_IS("shard", mp_array(w, 2), mp_uint(w, 2), mp_uint(w, 2));
    expect(w, &(badcase){"shard k == m", PS_EBAD_FIELD, "shard must be [k, m]"});
    FIELD_IS("shard", mp_array(w, 2), mp_uint(w, 5), mp_uint(w, 2));
    expect(w, &(badcase){"shard k > m", PS_EBAD_FIELD, "shard"});
    FIELD_IS("shard", mp_array(w, 2), mp_uint(w, 0), mp_uint(w, 0));
    expect(w, &(badcase){"shard m == 0", PS_EBAD_FIELD, "shard"});
    FIELD_IS("shard", mp_array(w, 2), mp_uint(w, 0), mp_uint(w, 65537));
    expect(w, &(badcase){"shard m too big", PS_EBAD_FIELD, "shard"});
    FIELD_IS("shard", mp_array(w, 1), mp_uint(w, 0));
    expect(w, &(badcase){"shard one number", PS_EBAD_FIELD, "shard"});
    FIELD_IS("shard", mp_array(w, 2), mp_int(w, -1), mp_uint(w, 2));
    expect(w, &(badcase){"shard negative", PS_EBAD_FIELD, "shard"});
    FIELD_IS("shard", mp_str(w, "0/2"));
    expect(w, &(badcase){"shard a string", PS_EBAD_FIELD, "shard"});

    /* the largest values that fit are fine */
    ps_msg m;
    FIELD_IS("shard", mp_array(w, 2), mp_uint(w, 65535), mp_uint(w, 65536));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.shard, 65535);
    assert_int_equal(m.nshards, 65536);
    w->n = 0;
    FIELD_IS("code", mp_int(w, INT32_MIN));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.code, INT32_MIN);
    w->n = 0;
    FIELD_IS("loss", mp_int(w, -3));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.loss == -3.0);
    w->n = 0;
    FIELD_IS("acc", mp_f32(w, 0.25f));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.acc == 0.25);
    w->n = 0;
    FIELD_IS("v", mp_uint(w, UINT32_MAX));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.proto, UINT32_MAX);
    w->n = 0;
    /* a non-negative value in a signed format is an unsigned integer too */
    FIELD_IS("off", mp_u8(w, 0xd0), mp_u8(w, 5));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.off, 5);
    w->n = 0;
    FIELD_IS("off", mp_u8(w, 0xd3), mp_be(w, 1ULL << 40, 8));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.off, 1ULL << 40);
    w->n = 0;
#undef FIELD_IS

    /* duplicated fields */
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_PULL), mp_field(w, PS_F_OFF), mp_field(w, PS_F_LEN);
    mp_field(w, PS_F_OFF);
    expect(w, &(badcase){"off twice", PS_EBAD_FIELD, "field 'off' appears twice"});
    mp_map(w, 5), mp_str(w, "t"), mp_uint(w, PS_MSG_PUSH), mp_field(w, PS_F_BASE), mp_field(w, PS_F_OFF);
    mp_field(w, PS_F_DATA), mp_field(w, PS_F_DATA);
    expect(w, &(badcase){"data twice", PS_EBAD_FIELD, "field 'data' appears twice"});
    mp_map(w, 3), mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT), mp_field(w, PS_F_RATE), mp_field(w, PS_F_RATE);
    expect(w, &(badcase){"rate twice", PS_EBAD_FIELD, "field 'rate' appears twice"});

    /* unknown keys are ignored, whatever their value */
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT), mp_str(w, "future"), mp_array(w, 1), mp_map(w, 0);
    mp_str(w, "pad"), mp_bin(w, two, 3, 0), mp_str(w, "tt"), mp_nil(w);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.type, PS_MSG_HEARTBEAT);
    assert_int_equal(m.has, 0);
    free(w);
}

/* A worker hello carrying `layout_bytes` as its layout (raw msgpack). */
static void worker_hello(mpw *w, const void *layout_bytes, size_t n)
{
    mp_map(w, 5);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO);
    mp_str(w, "v"), mp_uint(w, PS_PROTO_VERSION);
    mp_str(w, "role"), mp_str(w, "worker");
    mp_str(w, "shard"), mp_array(w, 2), mp_uint(w, 0), mp_uint(w, 1);
    mp_str(w, "layout"), mp_raw(w, layout_bytes, n);
}

static void test_decode_hello_errors(void **state)
{
    (void)state;
    mpw *w = mpw_new(), *l = mpw_new();
    ps_msg m;

    /* a worker hello needs both shard and layout; an admin needs neither */
    mp_map(w, 4), mp_field(w, PS_F_VERSION), mp_str(w, "role"), mp_str(w, "worker"), mp_field(w, PS_F_SHARD);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO);
    expect(w, &(badcase){"worker hello without layout", PS_EBAD_FIELD, "'shard' and 'layout'"});
    mp_map(w, 4), mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO), mp_field(w, PS_F_VERSION), mp_str(w, "role");
    mp_str(w, "worker"), mp_field(w, PS_F_LAYOUT);
    expect(w, &(badcase){"worker hello without shard", PS_EBAD_FIELD, "'shard' and 'layout'"});
    mp_message(w, PS_MSG_HELLO, PS_F_VERSION | PS_F_ROLE);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.role, PS_ROLE_ADMIN);
    w->n = 0;

    /* a good worker hello */
    mp_array(l, 2);
    mp_array(l, 2), mp_str(l, "w"), mp_array(l, 2), mp_uint(l, 2), mp_uint(l, 3);
    mp_array(l, 2), mp_str(l, "b"), mp_array(l, 1), mp_uint(l, 3);
    worker_hello(w, l->b, l->n);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_ptr_equal(m.layout, &lay);
    ps_layout want;
    small_layout(&want);
    assert_true(ps_layout_equal(&lay, &want));
    assert_int_equal(lay.t[1].offset, 6);
    assert_int_equal(lay.total, 9);
    w->n = 0;

    /* the fingerprint, when sent, must match the layout */
    w->n = 0;
    mp_map(w, 6);
    mp_str(w, "t"), mp_uint(w, PS_MSG_HELLO);
    mp_str(w, "v"), mp_uint(w, PS_PROTO_VERSION);
    mp_str(w, "role"), mp_str(w, "worker");
    mp_str(w, "shard"), mp_array(w, 2), mp_uint(w, 0), mp_uint(w, 1);
    mp_str(w, "layout"), mp_raw(w, l->b, l->n);
    size_t fp_at = w->n;
    mp_str(w, "fp"), mp_uint(w, ps_layout_fingerprint(&want));
    assert_int_equal(dec_copy(w, &m), 0);
    assert_true(m.has & PS_F_FP);
    w->n = fp_at;
    mp_str(w, "fp"), mp_uint(w, ps_layout_fingerprint(&want) ^ 1);
    expect(w, &(badcase){"fingerprint mismatch", PS_EBAD_FIELD, "fingerprint does not match"});

    /* a layout where the decoder was given nowhere to put it */
    worker_hello(w, l->b, l->n);
    uint8_t *p = heapdup(w->b, w->n);
    msgpack_zone_clear(&zone);
    assert_int_equal(ps_msg_decode(p, w->n, &default_lim, &zone, &m, NULL, err, sizeof err), PS_EBAD_FIELD);
    assert_msg_has(err, "unexpected field 'layout'");
    free(p);
    w->n = 0;

    /* each bad layout, written straight into l */
#define BAD_LAYOUT(needle, ...)                                                                                    \
    do {                                                                                                           \
        l->n = 0;                                                                                                  \
        __VA_ARGS__;                                                                                               \
        worker_hello(w, l->b, l->n);                                                                               \
        expect(w, &(badcase){#__VA_ARGS__, PS_EBAD_FIELD, needle});                                                \
    } while (0)
#define T1(name, d0) mp_array(l, 2), mp_str(l, name), mp_array(l, 1), mp_uint(l, d0)

    BAD_LAYOUT("layout: expected an array", mp_map(l, 0));
    BAD_LAYOUT("layout: expected an array", mp_array(l, 0));
    BAD_LAYOUT("layout: expected an array", mp_str(l, "w:2"));
    BAD_LAYOUT("layout[0]: expected [name, [dims...]]", mp_array(l, 1), mp_str(l, "w"));
    BAD_LAYOUT("layout[0]: expected [name, [dims...]]", mp_array(l, 1), mp_array(l, 1), mp_str(l, "w"));
    BAD_LAYOUT("layout[1]: expected [name, [dims...]]", mp_array(l, 2), T1("a", 1), mp_array(l, 2),
               mp_uint(l, 1), mp_array(l, 1), mp_uint(l, 1));
    BAD_LAYOUT("layout[0]: expected [name, [dims...]]", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"),
               mp_uint(l, 3));
    BAD_LAYOUT("layout[0] (w): a buffer's rule is \"mean\" or \"first\"", mp_array(l, 1), mp_array(l, 3),
               mp_str(l, "w"), mp_array(l, 1), mp_uint(l, 3), mp_nil(l));
    BAD_LAYOUT("layout[0] (w): a buffer's rule is \"mean\" or \"first\"", mp_array(l, 1), mp_array(l, 3),
               mp_str(l, "w"), mp_array(l, 1), mp_uint(l, 3), mp_str(l, "median"));
    BAD_LAYOUT("layout[0] (w): a buffer's dtype is \"F32\", \"F64\", \"I64\" or \"I32\"", mp_array(l, 1),
               mp_array(l, 4), mp_str(l, "w"), mp_array(l, 1), mp_uint(l, 3), mp_str(l, "mean"), mp_str(l, "U8"));
    BAD_LAYOUT("layout[0]: expected [name, [dims...]]", mp_array(l, 1), mp_array(l, 5), mp_str(l, "w"),
               mp_array(l, 1), mp_uint(l, 3), mp_str(l, "mean"), mp_str(l, "I64"), mp_nil(l));
    BAD_LAYOUT("layout[0]: name must have 1..127 bytes", mp_array(l, 1), T1("", 1));
    BAD_LAYOUT("layout[0]: name must have 1..127 bytes", mp_array(l, 1),
               T1("a123456789b123456789c123456789d123456789e123456789f123456789g123456789h123456789i123456789"
                  "j123456789k123456789l123456789xyzwxyzw", 1));
    BAD_LAYOUT("(a b): invalid name", mp_array(l, 1), T1("a b", 1));
    BAD_LAYOUT("invalid name", mp_array(l, 1), T1("tab\there", 1));
    BAD_LAYOUT("invalid name", mp_array(l, 1), T1("caf\xc3\xa9", 1));
    BAD_LAYOUT("invalid name", mp_array(l, 1), T1("del\x7f", 1));
    BAD_LAYOUT("layout[0] (w): dimension 0 is not a positive integer", mp_array(l, 1), T1("w", 0));
    BAD_LAYOUT("layout[0] (w): dimension 1 is not a positive integer", mp_array(l, 1), mp_array(l, 2),
               mp_str(l, "w"), mp_array(l, 2), mp_uint(l, 2), mp_int(l, -2));
    BAD_LAYOUT("dimension 0 is not a positive integer", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"),
               mp_array(l, 1), mp_uint(l, 1ULL << 32));
    BAD_LAYOUT("dimension 0 is not a positive integer", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"),
               mp_array(l, 1), mp_f64(l, 2.0));
    BAD_LAYOUT("layout[0]: rank must be 1..6", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"), mp_array(l, 0));
    BAD_LAYOUT("layout[0]: rank must be 1..6", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"), mp_array(l, 7),
               mp_uint(l, 1), mp_uint(l, 1), mp_uint(l, 1), mp_uint(l, 1), mp_uint(l, 1), mp_uint(l, 1),
               mp_uint(l, 1));
    /* 2^17 * 2^17 = 2^34 parameters is the most; one more is refused */
    BAD_LAYOUT("layout[1] (b): invalid name (printable ASCII, no spaces) or too many parameters", mp_array(l, 2),
               mp_array(l, 2), mp_str(l, "w"), mp_array(l, 2), mp_uint(l, 1u << 17), mp_uint(l, 1u << 17),
               T1("b", 1));
    BAD_LAYOUT("too many parameters", mp_array(l, 1), mp_array(l, 2), mp_str(l, "w"), mp_array(l, 3),
               mp_uint(l, UINT32_MAX), mp_uint(l, UINT32_MAX), mp_uint(l, UINT32_MAX));

    /* PS_TENSORS_MAX tensors is the most; one more is refused */
    l->n = 0;
    mp_array(l, PS_TENSORS_MAX);
    for (int i = 0; i < PS_TENSORS_MAX; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        T1(name, 1);
    }
    worker_hello(w, l->b, l->n);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(lay.ntensors, PS_TENSORS_MAX);
    assert_int_equal(lay.total, PS_TENSORS_MAX);
    w->n = 0;
    l->n = 0;
    mp_array(l, PS_TENSORS_MAX + 1);
    for (int i = 0; i < PS_TENSORS_MAX + 1; i++)
        T1("x", 1);
    worker_hello(w, l->b, l->n);
    expect(w, &(badcase){"PS_TENSORS_MAX + 1 tensors", PS_EBAD_FIELD, "layout: expected an array of 1..2048 tensors"});
#undef T1
#undef BAD_LAYOUT
    free(l);
    free(w);
}

/* When the decode fails, the message is still initialised (psd reads its id
 * to address the error reply). */
static void test_decode_failure_leaves_message_defined(void **state)
{
    (void)state;
    static const uint8_t bad_scan[] = {0xc1};
    static const uint8_t not_map[] = {0x93, 1, 2, 3};
    const uint8_t *inputs[] = {bad_scan, not_map};
    const size_t lens[] = {sizeof bad_scan, sizeof not_map};
    for (int i = 0; i < 2; i++) {
        ps_msg m;
        memset(&m, 0xa5, sizeof m);
        uint8_t *p = heapdup(inputs[i], lens[i]);
        assert_int_equal(dec_inplace(p, lens[i], &m), PS_EMALFORMED);
        assert_int_equal(m.has, 0);
        assert_int_equal(m.id, 0);
        free(p);
    }
}

/* ---- layout ------------------------------------------------------------------ */

static void test_layout_add_limits(void **state)
{
    (void)state;
    ps_layout *l = malloc(sizeof *l);
    assert_non_null(l);
    ps_layout_init(l);
    const uint32_t one[PS_DIMS_MAX] = {1, 1, 1, 1, 1, 1};
    char name[PS_NAME_MAX + 2];

    assert_int_equal(ps_layout_add(l, "", 1, one), PS_EINVAL);
    memset(name, 'n', sizeof name);
    name[PS_NAME_MAX + 1] = '\0'; /* PS_NAME_MAX + 1 bytes */
    assert_int_equal(ps_layout_add(l, name, 1, one), PS_EINVAL);
    name[PS_NAME_MAX] = '\0'; /* PS_NAME_MAX bytes */
    assert_int_equal(ps_layout_add(l, name, 1, one), 0);
    assert_int_equal(ps_layout_add(l, "a b", 1, one), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "a\x7f", 1, one), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "\xc3\xa9", 1, one), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "!~", 1, one), 0); /* printable edges */
    assert_int_equal(ps_layout_add(l, "r0", 0, one), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "r7", PS_DIMS_MAX + 1, one), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "r6", PS_DIMS_MAX, one), 0);
    assert_int_equal(ps_layout_add(l, "d0", 2, (const uint32_t[]){3, 0}), PS_EINVAL);
    assert_int_equal(l->ntensors, 3);
    assert_int_equal(l->total, 3);

    /* offsets follow each other */
    assert_int_equal(ps_layout_add(l, "w", 2, (const uint32_t[]){4, 5}), 0);
    assert_int_equal(l->t[3].offset, 3);
    assert_int_equal(l->t[3].count, 20);
    assert_int_equal(l->t[3].ndim, 2);
    assert_int_equal(l->t[3].dims[1], 5);
    assert_int_equal(l->t[3].dims[2], 0);
    assert_int_equal(l->total, 23);

    /* PS_PARAMS_MAX in all */
    ps_layout_init(l);
    assert_int_equal(ps_layout_add(l, "big", 2, (const uint32_t[]){UINT32_MAX, 5}), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "big", 2, (const uint32_t[]){1u << 17, 1u << 17}), 0);
    assert_int_equal(l->total, PS_PARAMS_MAX);
    assert_int_equal(ps_layout_add(l, "more", 1, one), PS_EINVAL);
    assert_int_equal(l->ntensors, 1);
    ps_layout_init(l);
    assert_int_equal(ps_layout_add(l, "w", 3, (const uint32_t[]){UINT32_MAX, UINT32_MAX, UINT32_MAX}), PS_EINVAL);
    assert_int_equal(ps_layout_add(l, "w", 2, (const uint32_t[]){UINT32_MAX, 4}), 0);

    /* PS_TENSORS_MAX tensors */
    ps_layout_init(l);
    for (int i = 0; i < PS_TENSORS_MAX; i++)
        assert_int_equal(ps_layout_add(l, "t", 1, one), 0);
    assert_int_equal(ps_layout_add(l, "t", 1, one), PS_EINVAL);
    assert_int_equal(l->ntensors, PS_TENSORS_MAX);
    assert_int_equal(l->total, PS_TENSORS_MAX);
    free(l);
}

/* The fingerprint is pinned: a change of the hash or of its canonical text
 * changes the wire and must be noticed. */
/* The layout's msgpack form, shared by the hello and psd's checkpoints:
 * packed and unpacked back it is the same layout; a bad entry is refused. */
static void test_layout_pack_unpack(void **state)
{
    ps_layout l, back;
    ps_layout_init(&l);
    uint32_t d1[2] = {64, 784}, d2[1] = {64};
    assert_int_equal(ps_layout_add(&l, "fc1.weight", 2, d1), 0);
    assert_int_equal(ps_layout_add(&l, "fc1.bias", 1, d2), 0);
    /* buffers: [name, dims, rule] and [name, dims, rule, dtype] */
    assert_int_equal(ps_layout_add(&l, "bn.running_mean", 1, d2), 0);
    assert_int_equal(ps_layout_set_buffer(&l, PS_BUF_MEAN, PS_SAVE_F32), 0);
    uint32_t one[1] = {1};
    assert_int_equal(ps_layout_add(&l, "bn.num_batches_tracked", 1, one), 0);
    assert_int_equal(ps_layout_set_buffer(&l, PS_BUF_FIRST, PS_SAVE_I64), 0);
    assert_int_equal(ps_layout_set_buffer(&l, 7, PS_SAVE_I64), PS_EINVAL);
    assert_int_equal(l.nbuf, 2);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    ps_layout_pack(&pk, &l);
    msgpack_zone z;
    msgpack_zone_init(&z, 1024);
    msgpack_object o;
    size_t off = 0;
    assert_int_equal(msgpack_unpack(sb.data, sb.size, &off, &z, &o), MSGPACK_UNPACK_SUCCESS);
    char lerr[256];
    assert_int_equal(ps_layout_unpack(&o, &back, lerr, sizeof lerr), 0);
    assert_true(ps_layout_equal(&l, &back));
    assert_int_equal(back.total, 64 * 784 + 64 + 64 + 1);
    assert_int_equal(back.nbuf, 2);
    assert_int_equal(back.t[2].buf, PS_BUF_MEAN);
    assert_int_equal(back.t[2].save_dt, PS_SAVE_F32);
    assert_int_equal(back.t[3].buf, PS_BUF_FIRST);
    assert_int_equal(back.t[3].save_dt, PS_SAVE_I64);
    assert_int_equal(o.via.array.ptr[2].via.array.size, 3);
    assert_int_equal(o.via.array.ptr[3].via.array.size, 4);
    /* another rule or dtype is another layout, and another fingerprint */
    ps_layout other = l;
    other.t[3].buf = PS_BUF_MEAN;
    assert_false(ps_layout_equal(&l, &other));
    assert_true(ps_layout_fingerprint(&l) != ps_layout_fingerprint(&other));
    other = l;
    other.t[3].save_dt = PS_SAVE_F32;
    assert_false(ps_layout_equal(&l, &other));
    /* a model split in two keeps the buffers' rules in the parts, and the
     * join gives them back */
    ps_layout parts[2], joined;
    const ps_layout *pp[2] = {&parts[0], &parts[1]};
    uint64_t lo, hi;
    assert_int_equal(ps_layout_part(&l, 0, 2, &parts[0], &lo, &hi), 0);
    assert_int_equal(ps_layout_part(&l, 1, 2, &parts[1], &lo, &hi), 0);
    assert_int_equal(parts[1].t[parts[1].ntensors - 1].buf, PS_BUF_FIRST);
    assert_int_equal(ps_layout_join(pp, 2, &joined, lerr, sizeof lerr), 0);
    assert_true(ps_layout_equal(&l, &joined));
    /* a rank of 0 is refused with the entry named */
    o.via.array.ptr[1].via.array.ptr[1].via.array.size = 0;
    assert_int_equal(ps_layout_unpack(&o, &back, lerr, sizeof lerr), PS_EBAD_FIELD);
    assert_non_null(strstr(lerr, "layout[1]"));
    msgpack_zone_destroy(&z);
    msgpack_sbuffer_destroy(&sb);
}

static void test_layout_fingerprint(void **state)
{
    (void)state;
    ps_layout l, e;
    ps_layout_init(&e);
    assert_int_equal(ps_layout_fingerprint(&e), 0xcbf29ce484222325ULL); /* FNV-1a of "" */
    small_layout(&l);
    assert_int_equal(ps_layout_fingerprint(&l), 0x5206699ee5d2246eULL); /* of "w:2x3;b:3;" */
    ps_layout_init(&l);
    ps_layout_add(&l, "fc1.w", 2, (const uint32_t[]){784, 256});
    ps_layout_add(&l, "fc1.b", 1, (const uint32_t[]){256});
    assert_int_equal(ps_layout_fingerprint(&l), 0x50cfc1fd812d1d27ULL);
    /* stable across calls and copies */
    ps_layout c = l;
    assert_int_equal(ps_layout_fingerprint(&c), ps_layout_fingerprint(&l));
    /* order, shape and rank all matter */
    ps_layout a, b;
    ps_layout_init(&a), ps_layout_init(&b);
    ps_layout_add(&a, "w", 2, (const uint32_t[]){6, 1});
    ps_layout_add(&b, "w", 1, (const uint32_t[]){6});
    assert_true(ps_layout_fingerprint(&a) != ps_layout_fingerprint(&b));
}

static void test_layout_equal(void **state)
{
    (void)state;
    ps_layout a, b;
    small_layout(&a);
    small_layout(&b);
    assert_true(ps_layout_equal(&a, &b));
    b.t[1].dims[3] = 77; /* beyond the rank: ignored */
    assert_true(ps_layout_equal(&a, &b));

    small_layout(&b);
    snprintf(b.t[0].name, sizeof b.t[0].name, "W");
    assert_false(ps_layout_equal(&a, &b));

    ps_layout_init(&b); /* same tensors, other order */
    ps_layout_add(&b, "b", 1, (const uint32_t[]){3});
    ps_layout_add(&b, "w", 2, (const uint32_t[]){2, 3});
    assert_false(ps_layout_equal(&a, &b));

    ps_layout_init(&b); /* same count, other shape */
    ps_layout_add(&b, "w", 2, (const uint32_t[]){3, 2});
    ps_layout_add(&b, "b", 1, (const uint32_t[]){3});
    assert_false(ps_layout_equal(&a, &b));

    ps_layout_init(&b); /* other rank */
    ps_layout_add(&b, "w", 3, (const uint32_t[]){2, 3, 1});
    ps_layout_add(&b, "b", 1, (const uint32_t[]){3});
    assert_false(ps_layout_equal(&a, &b));

    ps_layout_init(&b); /* a prefix */
    ps_layout_add(&b, "w", 2, (const uint32_t[]){2, 3});
    assert_false(ps_layout_equal(&a, &b));
    assert_false(ps_layout_equal(&b, &a));
}

/* The split of a model over n psd: parts tile [0, P) in order, every
 * inner boundary a multiple of PS_PART_ALIGN, sizes within one alignment
 * step of P/n; too small a model or too many parts is refused. */
static void test_part_bounds(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {2048, 50890, 235146, 1u << 20, 3u << 20, 100000000ull, 1ull << 34};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (uint32_t n = 1; n <= 8; n++) {
            uint64_t P = sizes[k], prev = 0;
            if (P / n < PS_PART_ALIGN)
                continue;
            for (uint32_t i = 0; i < n; i++) {
                uint64_t lo, hi;
                assert_int_equal(ps_part_bounds(P, i, n, &lo, &hi), 0);
                assert_int_equal(lo, prev);
                assert_true(hi > lo);
                assert_int_equal(lo % PS_PART_ALIGN, 0);
                assert_true(i + 1 == n ? hi == P : hi % PS_PART_ALIGN == 0);
                assert_true(hi - lo + PS_PART_ALIGN >= P / n && hi - lo <= P / n + 2 * PS_PART_ALIGN);
                prev = hi;
            }
            assert_int_equal(prev, P);
        }
    uint64_t lo = 7, hi = 7;
    assert_int_equal(ps_part_bounds(235146, 0, 1, &lo, &hi), 0);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 235146);
    assert_int_equal(ps_part_bounds(235146, 1, 2, &lo, &hi), 0);
    assert_int_equal(lo, 116736); /* 117573 rounded down to 1024s */
    assert_int_equal(hi, 235146);
    /* under 1024 values a part: refused for every part alike */
    assert_int_equal(ps_part_bounds(2047, 0, 2, &lo, &hi), PS_EINVAL);
    assert_int_equal(ps_part_bounds(2047, 1, 2, &lo, &hi), PS_EINVAL);
    assert_int_equal(ps_part_bounds(2048, 0, 2, &lo, &hi), 0);
    assert_int_equal(hi, 1024);
    assert_int_equal(ps_part_bounds(1 << 20, 2, 2, &lo, &hi), PS_EINVAL);
    assert_int_equal(ps_part_bounds(1 << 20, 0, 0, &lo, &hi), PS_EINVAL);
    assert_int_equal(ps_part_bounds(1ull << 30, 0, PS_PARTS_MAX + 1, &lo, &hi), PS_EINVAL);
}

/* Each part's layout: whole tensors keep name and dims, a cut one becomes
 * "name(dims)[x:y]" of y - x values; the parts' layouts together cover the
 * model and differ from each other (psd's layout check tells parts apart),
 * and ps_layout_join makes the model's layout of them again. */
static void test_layout_part(void **state)
{
    (void)state;
    ps_layout l, a, b;
    ps_layout_init(&l);
    assert_int_equal(ps_layout_add(&l, "fc1.weight", 2, (const uint32_t[]){64, 784}), 0);
    assert_int_equal(ps_layout_add(&l, "fc1.bias", 1, (const uint32_t[]){64}), 0);
    assert_int_equal(ps_layout_add(&l, "fc2.weight", 2, (const uint32_t[]){10, 64}), 0);
    assert_int_equal(ps_layout_add(&l, "fc2.bias", 1, (const uint32_t[]){10}), 0);
    uint64_t lo, hi;
    assert_int_equal(ps_layout_part(&l, 0, 2, &a, &lo, &hi), 0);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 24576);
    assert_int_equal(a.ntensors, 1);
    assert_string_equal(a.t[0].name, "fc1.weight(64x784)[0:24576]");
    assert_int_equal(a.t[0].ndim, 1);
    assert_int_equal(a.total, 24576);
    assert_int_equal(ps_layout_part(&l, 1, 2, &b, &lo, &hi), 0);
    assert_int_equal(lo, 24576);
    assert_int_equal(hi, l.total);
    assert_int_equal(b.ntensors, 4);
    assert_string_equal(b.t[0].name, "fc1.weight(64x784)[24576:50176]");
    assert_int_equal(b.t[0].count, 50176 - 24576);
    assert_string_equal(b.t[1].name, "fc1.bias");
    assert_string_equal(b.t[2].name, "fc2.weight");
    assert_int_equal(b.t[2].ndim, 2);
    assert_int_equal(b.t[2].dims[0], 10);
    assert_int_equal(a.total + b.total, l.total);
    assert_false(ps_layout_equal(&a, &b));
    /* joined again, in part order; refused out of order or with one missing */
    static ps_layout j;
    char jerr[256];
    const ps_layout *ab[2] = {&a, &b}, *ba[2] = {&b, &a}, *aa[2] = {&a, &a};
    assert_int_equal(ps_layout_join(ab, 2, &j, jerr, sizeof jerr), 0);
    assert_true(ps_layout_equal(&j, &l));
    assert_int_equal(ps_layout_join(ba, 2, &j, jerr, sizeof jerr), PS_EINVAL);
    assert_non_null(strstr(jerr, "fc1.weight(64x784)[24576:50176]"));
    assert_int_equal(ps_layout_join(aa, 2, &j, jerr, sizeof jerr), PS_EINVAL);
    assert_non_null(strstr(jerr, "the rest of fc1.weight from value 24576"));
    assert_int_equal(ps_layout_join(ab, 1, &j, jerr, sizeof jerr), PS_EINVAL);
    assert_non_null(strstr(jerr, "no part holds the rest of fc1.weight"));
    assert_int_equal(ps_layout_join(ab + 1, 1, &j, jerr, sizeof jerr), PS_EINVAL);
    assert_non_null(strstr(jerr, "values before 24576"));
    /* many tensors, many parts: every split joins back */
    ps_layout big;
    ps_layout_init(&big);
    for (uint32_t k = 0; k < 40; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer%u.w", k);
        assert_int_equal(ps_layout_add(&big, name, 3, (const uint32_t[]){k % 7 + 1, 33, 2 + k * 13}), 0);
    }
    for (uint32_t n = 1; n <= 9; n++) {
        static ps_layout part[9];
        const ps_layout *pp[9];
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(ps_layout_part(&big, i, n, &part[i], &lo, &hi), 0);
            pp[i] = &part[i];
        }
        assert_int_equal(ps_layout_join(pp, n, &j, jerr, sizeof jerr), 0);
        assert_true(ps_layout_equal(&j, &big));
        if (n > 2) { /* a part left out: the sizes tell */
            pp[1] = &part[2];
            assert_int_equal(ps_layout_join(pp, n - 1, &j, jerr, sizeof jerr), PS_EINVAL);
        }
    }
    /* one part: the model's own layout */
    assert_int_equal(ps_layout_part(&l, 0, 1, &a, &lo, &hi), 0);
    assert_true(ps_layout_equal(&a, &l));
    /* a cut tensor whose name leaves no room for the range */
    char longname[PS_NAME_MAX + 1];
    memset(longname, 'x', PS_NAME_MAX);
    longname[PS_NAME_MAX] = '\0';
    ps_layout_init(&l);
    assert_int_equal(ps_layout_add(&l, longname, 1, (const uint32_t[]){4096}), 0);
    assert_int_equal(ps_layout_part(&l, 0, 2, &a, &lo, &hi), PS_EINVAL);
    /* too small to split */
    assert_int_equal(ps_layout_part(&l, 0, 8, &a, &lo, &hi), PS_EINVAL);
}

static void test_layout_describe(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    const char *full = "w[2,3] b[3]";
    char buf[64];
    ps_layout_describe(&l, buf, sizeof buf);
    assert_string_equal(buf, full);

    /* every size: a NUL-terminated prefix, nothing written past len */
    for (size_t len = 1; len <= strlen(full) + 2; len++) {
        memset(buf, '#', sizeof buf);
        ps_layout_describe(&l, buf, len);
        size_t want = len - 1 < strlen(full) ? len - 1 : strlen(full);
        assert_int_equal(strlen(buf), want);
        assert_memory_equal(buf, full, want);
        for (size_t i = len; i < sizeof buf; i++)
            assert_int_equal(buf[i], '#');
    }
    buf[0] = '#';
    ps_layout_describe(&l, buf, 0);
    assert_int_equal(buf[0], '#');

    ps_layout_init(&l);
    ps_layout_describe(&l, buf, sizeof buf);
    assert_string_equal(buf, "");
}

/* ---- error codes and names -------------------------------------------------------- */

static void test_error_names(void **state)
{
    (void)state;
    static const struct {
        int code;
        const char *name;
    } codes[] = {
        {PS_EMALFORMED, "MALFORMED"}, {PS_ETOO_BIG, "TOO_BIG"},   {PS_EUNSUPPORTED, "UNSUPPORTED"},
        {PS_EBAD_TYPE, "BAD_TYPE"},   {PS_EBAD_FIELD, "BAD_FIELD"}, {PS_ESTATE, "STATE"},
        {PS_ELAYOUT, "LAYOUT"},       {PS_ERANGE, "RANGE"},       {PS_ENONFINITE, "NONFINITE"},
        {PS_ESTALE, "STALE"},         {PS_EDUPLICATE, "DUPLICATE"}, {PS_ESHARD, "SHARD"},
        {PS_ENOT_READY, "NOT_READY"}, {PS_EAUTH, "AUTH"},         {PS_EFORBIDDEN, "FORBIDDEN"},
        {PS_ELIMIT, "LIMIT"},         {PS_ESHUTDOWN, "SHUTDOWN"}, {PS_ENOMEM, "NOMEM"},
        {PS_EIO, "IO"},               {PS_ECONNECT, "CONNECT"},   {PS_ETIMEOUT, "TIMEOUT"},
        {PS_ECLOSED, "CLOSED"},       {PS_EINVAL, "INVAL"},       {PS_EREMOTE, "REMOTE"},
        {PS_ENOT_LEADER, "NOT_LEADER"},
        {PS_EMOVED, "MOVED"},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        int c = codes[i].code;
        assert_int_equal(c, -(int)(i + 1)); /* the numbers are the wire's */
        assert_string_equal(ps_errname(c), codes[i].name);
        assert_string_equal(ps_errname(-c), codes[i].name); /* as it travels */
        const char *text = ps_strerror(c);
        assert_non_null(text);
        assert_true(strlen(text) > 5);
        assert_string_not_equal(text, "unknown error");
        assert_string_equal(ps_strerror(-c), text);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(ps_strerror(codes[j].code), text);
    }
    assert_string_equal(ps_errname(0), "OK");
    assert_string_equal(ps_strerror(0), "success");
    static const int unknown[] = {27, -27, 1000, -1000, INT_MAX, INT_MIN, INT_MIN + 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(ps_errname(unknown[i]), "UNKNOWN");
        assert_string_equal(ps_strerror(unknown[i]), "unknown error");
    }
}

static void test_type_and_role_names(void **state)
{
    (void)state;
    static const char *const names[] = {"?",      "hello",  "welcome",      "init",    "push",
                                        "pull",   "pushpull", "params",     "ok",      "heartbeat",
                                        "status", "status_reply", "metrics", "metrics_reply", "report",
                                        "error",  "bye",    "admin", "challenge", "auth", "barrier",
                                        "table", "tpull", "tpush", "tpushpull", "rows"};
    for (uint32_t t = 0; t < sizeof names / sizeof names[0]; t++)
        assert_string_equal(ps_msg_type_name(t), names[t]);
    for (uint32_t t = PS_MSG_ROWS + 1; t <= PS_MSG_TYPE_MAX; t++) /* types declared since */
        assert_string_not_equal(ps_msg_type_name(t), "?");
    /* messages.def says what PROTOCOL.md section 5 says of these */
    for (uint32_t t = 1; t <= PS_MSG_ROWS; t++)
        assert_int_equal(ps_msg_required(t), required_spec[t]);
    assert_int_equal(ps_msg_required(0), 0);
    assert_int_equal(ps_msg_required(PS_MSG_TYPE_MAX + 1), 0);
    assert_int_equal(ps_msg_type_dir(PS_MSG_HELLO), PS_DIR_C);
    assert_int_equal(ps_msg_type_dir(PS_MSG_PUSH), PS_DIR_W);
    assert_int_equal(ps_msg_type_dir(PS_MSG_ADMIN), PS_DIR_A);
    assert_int_equal(ps_msg_type_dir(PS_MSG_ROWS), PS_DIR_S);
    assert_int_equal(ps_msg_type_dir(0), PS_DIR_NONE);
    assert_int_equal(ps_msg_type_dir(PS_MSG_TYPE_MAX + 1), PS_DIR_NONE);
    assert_string_equal(ps_msg_type_name(PS_MSG_TYPE_MAX + 1), "?");
    assert_string_equal(ps_msg_type_name(UINT32_MAX), "?");
    assert_string_equal(ps_role_name(PS_ROLE_WORKER), "worker");
    assert_string_equal(ps_role_name(PS_ROLE_ADMIN), "admin");
    assert_string_equal(ps_role_name(PS_ROLE_NONE), "none");
    assert_string_equal(ps_role_name(99), "none");
}

/* ---- random input ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

/* Decodes p[0..n) and checks the outcome is sane. Returns rc. */
static int decode_sane(uint8_t *p, size_t n)
{
    ps_msg m;
    memset(&m, 0, sizeof m);
    int rc = dec_inplace(p, n, &m);
    if (rc != 0 && rc != PS_EMALFORMED && rc != PS_EBAD_TYPE && rc != PS_EBAD_FIELD && rc != PS_EUNSUPPORTED)
        fail_msg("decode returned %d on %zu bytes", rc, n);
    if (memchr(err, '\0', sizeof err) == NULL)
        fail_msg("error message not terminated");
    if (rc != 0)
        assert_true(err[0] != '\0');
    if (rc == 0) {
        assert_true(m.type >= 1 && m.type <= PS_MSG_TYPE_MAX);
        uint64_t need = required_of(m.type);
        assert_int_equal(m.has & need, need);
        if (m.has & PS_F_DATA) {
            assert_true((const uint8_t *)m.data >= p);
            assert_true((const uint8_t *)m.data + m.ndata * 4 <= p + n);
            assert_int_equal((uintptr_t)m.data % PS_DATA_ALIGN, 0);
        }
        if (m.has & PS_F_TEXT)
            assert_true((const uint8_t *)m.text >= p && (const uint8_t *)m.text + m.text_len <= p + n);
        if (m.has & PS_F_LAYOUT) {
            assert_true(m.layout->ntensors >= 1 && m.layout->ntensors <= PS_TENSORS_MAX);
            assert_true(m.layout->total <= PS_PARAMS_MAX);
        }
        if (m.has & PS_F_MODE)
            assert_true(strlen(m.mode) < sizeof m.mode);
    }
    return rc;
}

static void test_random_garbage(void **state)
{
    (void)state;
    rng_state = 0x9e3779b97f4a7c15ULL;
    unsigned ok = 0;
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(rnd() % 300);
        uint8_t *p = malloc(n ? n : 1);
        assert_non_null(p);
        for (size_t j = 0; j < n; j++)
            p[j] = (uint8_t)rnd();
        /* half of them start like a message, to get past the first byte */
        if (n > 0 && (i & 1))
            p[0] = (uint8_t)(0x80 | (rnd() % 16));
        if (decode_sane(p, n) == 0)
            ok++;
        free(p);
    }
    (void)ok; /* random bytes hardly ever form a message */
}

/* Valid frames with a few bytes changed, cut or extended. */
static void test_mutated_frames(void **state)
{
    (void)state;
    ps_layout l;
    small_layout(&l);
    ps_buf frames[6] = {{0}};
    ps_msg m;

    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_FIN | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.id = 5, m.base = 10, m.off = 1, m.data = tensor, m.ndata = 7, m.poff = 0, m.plen = 7, m.min = 11;
    assert_int_equal(ps_msg_encode_full(&m, &frames[0]), 0);
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.id = 1, m.proto = 1, m.role = PS_ROLE_WORKER, m.shard = 0, m.nshards = 2, m.layout = &l;
    m.fp = ps_layout_fingerprint(&l);
    assert_int_equal(ps_msg_encode_full(&m, &frames[1]), 0);
    ps_msg_init(&m, PS_MSG_ERROR);
    m.has = PS_F_ID | PS_F_CODE | PS_F_TEXT;
    m.id = 3, m.code = 8, m.text = "range [0, 10) is outside", m.text_len = 24;
    assert_int_equal(ps_msg_encode_full(&m, &frames[2]), 0);
    ps_msg_init(&m, PS_MSG_STATUS_REPLY);
    m.has = PS_F_ID;
    size_t dlen;
    assert_int_equal(ps_msg_encode(&m, &frames[3], &dlen, pack_body, NULL), 0);
    ps_msg_init(&m, PS_MSG_REPORT);
    m.has = PS_F_ID | PS_F_EPOCH | PS_F_LOSS | PS_F_ACC | PS_F_SAMPLES | PS_F_RATE;
    m.epoch = 2, m.loss = 0.5, m.acc = 0.9, m.samples = 100, m.rate = 50;
    assert_int_equal(ps_msg_encode_full(&m, &frames[4]), 0);
    ps_msg_init(&m, PS_MSG_WELCOME);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT | PS_F_FP;
    snprintf(m.mode, sizeof m.mode, "asgd");
    assert_int_equal(ps_msg_encode_full(&m, &frames[5]), 0);

    rng_state = 12345;
    unsigned ok = 0;
    for (int i = 0; i < 20000; i++) {
        const ps_buf *f = &frames[rnd() % 6];
        size_t plen = f->len - PS_FRAME_HDR;
        size_t n = plen;
        int how = (int)(rnd() % 4);
        if (how == 1)
            n = (size_t)(rnd() % plen); /* cut */
        else if (how == 2)
            n = plen + 1 + (size_t)(rnd() % 8); /* extended */
        uint8_t *p = malloc(n);
        assert_non_null(p);
        memcpy(p, f->p + PS_FRAME_HDR, n < plen ? n : plen);
        for (size_t j = plen; j < n; j++)
            p[j] = (uint8_t)rnd();
        int flips = how == 3 ? 0 : 1 + (int)(rnd() % 4);
        for (int k = 0; k < flips && n > 0; k++) {
            size_t at = (size_t)(rnd() % n);
            uint64_t r = rnd();
            if (r & 1)
                p[at] ^= (uint8_t)(1u << ((r >> 1) % 8)); /* one bit */
            else
                p[at] = (uint8_t)(r >> 8); /* one byte */
        }
        if (how == 3) {
            /* an interesting byte at a random place */
            static const uint8_t special[] = {0xc1, 0xdd, 0xdf, 0xdb, 0xc6, 0xc9, 0xff, 0x00, 0x7f, 0x80, 0x9f};
            p[rnd() % n] = special[rnd() % sizeof special];
        }
        if (decode_sane(p, n) == 0)
            ok++;
        free(p);
    }
    assert_true(ok > 0); /* some single-bit changes leave a valid message */
    for (int i = 0; i < 6; i++)
        ps_buf_free(&frames[i]);
}

/* Random well-formed maps of known keys with values of random types: exercise
 * every field's type check. */
static void mp_random_value(mpw *w, int depth)
{
    static const float f4[4] = {1, 2, 3, 4};
    switch (rnd() % (depth < 3 ? 14 : 12)) {
    case 0: mp_uint(w, rnd() % 200); break;
    case 1: mp_uint(w, rnd()); break;
    case 2: mp_int(w, -(int64_t)(rnd() % 1000) - 1); break;
    case 3: mp_f64(w, (double)(rnd() % 100) / 7.0); break;
    case 4: mp_f32(w, 0.5f); break;
    case 5: mp_nil(w); break;
    case 6: mp_bool(w, (int)(rnd() & 1)); break;
    case 7: mp_str(w, (const char *[]){"worker", "admin", "asgd", "x", "", "sixteen-chars-xx"}[rnd() % 6]); break;
    case 8: mp_bin(w, f4, (size_t)(rnd() % 17), (uint8_t)(0xc4 + rnd() % 3)); break;
    case 9: mp_u8(w, 0xd4), mp_u8(w, 1), mp_u8(w, 2); break;
    case 10: mp_array(w, 2), mp_uint(w, rnd() % 4), mp_uint(w, rnd() % 4); break;
    case 11: mp_uint(w, rnd() % 17); break;
    case 12: {
        uint32_t k = (uint32_t)(rnd() % 4);
        mp_array(w, k);
        for (uint32_t i = 0; i < k; i++)
            mp_random_value(w, depth + 1);
        break;
    }
    default: {
        uint32_t k = (uint32_t)(rnd() % 3);
        mp_map(w, k);
        for (uint32_t i = 0; i < k; i++)
            mp_str(w, "k"), mp_random_value(w, depth + 1);
        break;
    }
    }
}

static void test_random_messages(void **state)
{
    (void)state;
    rng_state = 777;
    mpw *w = mpw_new();
    unsigned ok = 0;
    for (int i = 0; i < 20000; i++) {
        w->n = 0;
        uint32_t n = 1 + (uint32_t)(rnd() % 8);
        mp_map(w, n);
        mp_str(w, "t"), mp_uint(w, rnd() % (PS_MSG_TYPE_MAX + 1));
        for (uint32_t k = 1; k < n; k++) {
            if (rnd() % 3 == 0)
                mp_field(w, 1ull << (rnd() % NFIELDS)); /* a valid field */
            else {
                mp_str(w, field_names[rnd() % NFIELDS]);
                mp_random_value(w, 1);
            }
        }
        uint8_t *p = heapdup(w->b, w->n);
        if (decode_sane(p, w->n) == 0)
            ok++;
        free(p);
    }
    assert_true(ok > 0);
    free(w);
}

/* ---- bfloat16 tensors ("dt", "rdt", "wire") -------------------------------------- */

/* bfloat16 bit patterns: 1.0, -2.5, a tie's result, 0x7fc0 (NaN), -0, a
 * denormal, the largest finite, inf; 7 of them, 14 bytes (not a multiple of
 * 4, so a decoder that assumed float32 would refuse them). */
static const uint16_t half[7] = {0x3f80, 0xc020, 0x3f82, 0x7fc0, 0x8000, 0x0001, 0x7f7f};

static void test_round_trip_bf16(void **state)
{
    (void)state;
    ps_msg m;

    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_FIN | PS_F_DT;
    m.id = 3, m.base = 9, m.off = 11, m.dt = PS_DT_BF16, m.data16 = half, m.ndata = 7, m.fin = 0;
    round_trip(&m);
    m.ndata = 1; /* 2 bytes */
    round_trip(&m);
    m.ndata = 0;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_INIT);
    m.has = PS_F_ID | PS_F_OFF | PS_F_DATA | PS_F_DT;
    m.id = 1, m.off = 0, m.dt = PS_DT_BF16, m.data16 = half + 1, m.ndata = 6;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_DT | PS_F_RDT | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.id = 5, m.base = 10, m.off = 1, m.dt = PS_DT_BF16, m.data16 = half, m.ndata = 5;
    m.rdt = PS_DT_BF16, m.poff = 0, m.plen = 7, m.min = 11;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PULL);
    m.has = PS_F_ID | PS_F_OFF | PS_F_LEN | PS_F_MIN | PS_F_RDT;
    m.id = 4, m.off = 2, m.len = 1ULL << 20, m.min = 1, m.rdt = PS_DT_BF16;
    round_trip(&m);
    m.rdt = PS_DT_F32; /* said explicitly */
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_PARAMS);
    m.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA | PS_F_DT;
    m.id = 6, m.mver = 12, m.off = 0, m.dt = PS_DT_BF16, m.data16 = half, m.ndata = 7;
    round_trip(&m);

    /* "dt": 0 said explicitly is float32 */
    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_DT;
    m.id = 7, m.base = 0, m.off = 0, m.dt = PS_DT_F32, m.data = tensor, m.ndata = 7;
    round_trip(&m);

    ps_msg_init(&m, PS_MSG_WELCOME);
    m.has = PS_F_ID | PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS | PS_F_WORKERS | PS_F_INIT | PS_F_HB |
            PS_F_WIRE;
    m.id = 1, m.proto = PS_PROTO_VERSION, m.mver = 0, m.params = 10, m.workers = 2, m.hb = 10000;
    m.wire = PS_WIRE_BIT(PS_DT_BF16);
    snprintf(m.mode, sizeof m.mode, "asgd");
    round_trip(&m);
    m.wire = UINT64_MAX; /* bits of element types not known yet travel too */
    round_trip(&m);

    /* ids and bases of every length before the tensor: it lands aligned */
    static const uint64_t ids[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 1ULL << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        for (uint64_t base = 0; base < 300; base += 97) {
            for (uint64_t n = 1; n <= 7; n += 3) {
                ps_msg_init(&m, PS_MSG_PUSH);
                m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_DT;
                m.id = ids[i], m.base = base, m.off = ids[i], m.dt = PS_DT_BF16, m.data16 = half, m.ndata = n;
                round_trip(&m);
            }
        }
    }
}

/* The bytes of a bfloat16 PUSH: "dt": 1 in the map, the tensor in a bin32 of
 * 2 bytes a value at the end, counted by the length prefix; decoded in
 * place, data16 points at them. */
static void test_encode_bf16_bytes(void **state)
{
    (void)state;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_DT;
    m.id = 1, m.base = 2, m.off = 3, m.dt = PS_DT_BF16, m.data16 = half, m.ndata = 3;
    ps_buf out = {0};
    size_t dlen = 0;
    assert_int_equal(ps_msg_encode(&m, &out, &dlen, NULL, NULL), 0);
    assert_int_equal(dlen, 6);
    uint32_t plen = 0;
    assert_int_equal(ps_frame_header(out.p, out.len, UINT32_MAX, &plen), 1);
    assert_int_equal(plen, out.len - PS_FRAME_HDR + 6);
    const uint8_t bin32[5] = {0xc6, 0, 0, 0, 6};
    assert_memory_equal(out.p + out.len - 5, bin32, 5);
    const uint8_t dt1[4] = {0xa2, 'd', 't', 1};
    int found = 0;
    for (size_t i = 0; i + sizeof dt1 <= out.len; i++)
        found |= memcmp(out.p + i, dt1, sizeof dt1) == 0;
    assert_true(found);
    /* the whole frame, from ps_msg_encode_full: the values little-endian */
    ps_buf full = {0};
    assert_int_equal(ps_msg_encode_full(&m, &full), 0);
    assert_int_equal(full.len, out.len + 6);
    const uint8_t le[6] = {0x80, 0x3f, 0x20, 0xc0, 0x82, 0x3f};
    assert_memory_equal(full.p + out.len, le, 6);
    ps_msg d;
    uint8_t *payload = full.p + PS_FRAME_HDR;
    assert_int_equal(dec_inplace(payload, plen, &d), 0);
    assert_int_equal(d.dt, PS_DT_BF16);
    assert_true(d.has & PS_F_DT);
    assert_int_equal(d.ndata, 3);
    assert_null(d.data);
    assert_ptr_equal((const uint8_t *)d.data16, payload + plen - 6);
    assert_int_equal((uintptr_t)d.data16 % PS_DATA_ALIGN, 0);
    assert_int_equal(d.data16[0], 0x3f80);
    assert_int_equal(d.data16[1], 0xc020);
    assert_int_equal(d.data16[2], 0x3f82);
    assert_ptr_equal(ps_msg_data_bytes(&d), d.data16);
    ps_buf_free(&full);
    ps_buf_free(&out);
    /* the element sizes and names */
    assert_int_equal(ps_dtype_size(PS_DT_F32), 4);
    assert_int_equal(ps_dtype_size(PS_DT_BF16), 2);
    assert_string_equal(ps_dtype_name(PS_DT_F32), "f32");
    assert_string_equal(ps_dtype_name(PS_DT_BF16), "bf16");
    assert_int_equal(PS_WIRE_BIT(PS_DT_BF16), 2);
}

/* float32 without its zeros (dt 2): a PUSH of 40 values, 3 of them stored,
 * round-trips with its bitmap and values in place (aligned, the bitmap two
 * whole words); a bitmap that counts another number of values than follow,
 * one with bits past len, one too short, and dt 2 without len or without
 * data are BAD_FIELD; dt 3 is UNSUPPORTED. */
static void test_f32z(void **state)
{
    (void)state;
    static const float three[3] = {1.5f, -0.0f, 3.0f};
    union {
        uint8_t b[8 + 12];
        uint32_t align;
    } z = {{0}};
    z.b[0] = 0x01, z.b[2] = 0x10, z.b[4] = 0x80; /* values 0, 20 and 39 */
    memcpy(z.b + 8, three, sizeof three);
    assert_int_equal(ps_f32z_mask_bytes(40), 8);
    assert_int_equal(ps_f32z_mask_bytes(32), 4);
    assert_int_equal(ps_f32z_mask_bytes(0), 0);
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSH);
    m.has = PS_F_ID | PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_DT | PS_F_LEN;
    m.id = 7, m.base = 2, m.off = 5, m.dt = PS_DT_F32Z, m.len = 40, m.ndata = 40, m.packed = z.b, m.packed_len = 20, m.nz = 3;
    assert_int_equal(ps_msg_data_len(&m), 20);
    assert_ptr_equal(ps_msg_data_bytes(&m), z.b);
    round_trip(&m);
    ps_buf full = {0};
    assert_int_equal(ps_msg_encode_full(&m, &full), 0);
    uint32_t plen = full.len - PS_FRAME_HDR;
    uint8_t *payload = heapdup(full.p + PS_FRAME_HDR, plen);
    ps_msg d;
    assert_int_equal(dec_inplace(payload, plen, &d), 0);
    assert_int_equal(d.dt, PS_DT_F32Z);
    assert_int_equal(d.ndata, 40);
    assert_int_equal(d.nz, 3);
    assert_null(d.data);
    assert_null(d.data16);
    assert_ptr_equal(d.packed, payload + plen - 20);
    assert_memory_equal(d.packed + 8, three, sizeof three);
    free(payload);
    assert_string_equal(ps_dtype_name(PS_DT_F32Z), "f32z");
    assert_string_equal(ps_dtype_name(PS_DT_F32ZSTD), "zstd");
    assert_int_equal(PS_WIRE_BIT(PS_DT_F32ZSTD), 8);
    /* compressed (dt 3): any bytes, "len" values; the frame is psd's to
     * check, so it round-trips as it is, in place */
    {
        static const uint8_t frame[7] = {0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3};
        ps_msg zm = m;
        zm.dt = PS_DT_F32ZSTD, zm.len = zm.ndata = 1000, zm.packed = frame, zm.packed_len = 7, zm.nz = 0;
        assert_int_equal(ps_msg_data_len(&zm), 7);
        round_trip(&zm);
    }
    assert_int_equal(PS_WIRE_BIT(PS_DT_F32Z), 4);

    /* the faults, each from the good frame: the count, bits past len, a
     * short bitmap, no len, no data */
    struct {
        uint64_t len;
        uint8_t b2, b4;
        size_t nbytes;
        uint64_t drop;
    } bad[] = {
        {40, 0x30, 0x80, 20, 0},         /* 4 bits set, 3 values */
        {39, 0x10, 0x80, 20, 0},         /* bit 39 past len 39 */
        {40, 0x10, 0x00, 20, 0},         /* 2 bits set, 3 values */
        {200, 0x10, 0x80, 20, 0},        /* len 200 needs a 28-byte bitmap */
        {40, 0x10, 0x80, 20, PS_F_LEN},  /* no len */
        {40, 0x10, 0x80, 20, PS_F_DATA}, /* dt 2 but no data */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_msg b = m;
        z.b[2] = bad[i].b2, z.b[4] = bad[i].b4;
        b.len = bad[i].len;
        b.has &= ~bad[i].drop;
        /* encoded with the good count, so that the bytes are what is wrong */
        ps_buf out = {0};
        assert_int_equal(ps_msg_encode_full(&b, &out), 0);
        uint8_t *p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
        int rc = dec_inplace(p, out.len - PS_FRAME_HDR, &d);
        if (rc != PS_EBAD_FIELD)
            fail_msg("case %zu: %d: %s", i, rc, err);
        assert_non_null(strstr(err, "push"));
        free(p);
        ps_buf_free(&out);
    }
    z.b[2] = 0x10, z.b[4] = 0x80;
    m.dt = 4; /* unknown */
    ps_buf out = {0};
    m.has &= ~(uint64_t)PS_F_DATA;
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    uint8_t *p = heapdup(out.p + PS_FRAME_HDR, out.len - PS_FRAME_HDR);
    assert_int_equal(dec_inplace(p, out.len - PS_FRAME_HDR, &d), PS_EUNSUPPORTED);
    free(p);
    ps_buf_free(&out);
    ps_buf_free(&full);
}

/* A PUSH map built by hand: "dt" (value written by dt_fn, or none) before
 * or after "data" (nbytes of bytes, bin format fmt), and a field "x" of k
 * bytes to move the tensor to every alignment. */
static void bf16_push(mpw *w, int dt, int dt_after, const void *bytes, size_t nbytes, uint8_t fmt, size_t k)
{
    w->n = PS_FRAME_HDR;
    mp_map(w, 6 + (dt >= 0));
    mp_str(w, "t"), mp_uint(w, PS_MSG_PUSH);
    mp_str(w, "id"), mp_uint(w, 300);
    mp_str(w, "base"), mp_uint(w, 2);
    mp_str(w, "off"), mp_uint(w, 1);
    mp_str(w, "x"), mp_strn(w, "abc", k);
    if (dt >= 0 && !dt_after)
        mp_str(w, "dt"), mp_uint(w, (uint64_t)dt);
    mp_str(w, "data"), mp_bin(w, bytes, nbytes, fmt);
    if (dt >= 0 && dt_after)
        mp_str(w, "dt"), mp_uint(w, (uint64_t)dt);
    ps_frame_put_len(w->b, (uint32_t)(w->n - PS_FRAME_HDR));
}

/* Decodes the frame in w (in a heap block of exactly its payload). */
static int dec_frame(const mpw *w, ps_msg *m, uint8_t **payload)
{
    *payload = heapdup(w->b + PS_FRAME_HDR, w->n - PS_FRAME_HDR);
    return dec_inplace(*payload, w->n - PS_FRAME_HDR, m);
}

/* bfloat16 data at every misalignment, "dt" before or after it: aligned
 * in place, the right count, the values intact, through data16 only. */
static void test_decode_bf16_data(void **state)
{
    (void)state;
    int seen[PS_DATA_ALIGN] = {0};
    static const uint8_t fmts[] = {0xc4, 0xc5, 0xc6};
    for (size_t f = 0; f < sizeof fmts; f++) {
        for (size_t k = 0; k < 4; k++) {
            for (int after = 0; after <= 1; after++) {
                for (size_t n = 1; n <= 7; n += 2) {
                    mpw *w = mpw_new();
                    bf16_push(w, PS_DT_BF16, after, half, n * 2, fmts[f], k);
                    size_t data_at = after ? w->n - 4 - n * 2 : w->n - n * 2; /* "dt": 1 is 4 bytes */
                    seen[data_at % PS_DATA_ALIGN] = 1;
                    ps_msg m;
                    uint8_t *payload;
                    int rc = dec_frame(w, &m, &payload);
                    if (rc != 0)
                        fail_msg("fmt 0x%02x, k %zu, dt after %d, n %zu: %s", fmts[f], k, after, n, err);
                    assert_int_equal(m.type, PS_MSG_PUSH);
                    assert_int_equal(m.dt, PS_DT_BF16);
                    assert_true(m.has & PS_F_DT);
                    assert_true(m.has & PS_F_DATA);
                    assert_int_equal(m.ndata, n);
                    assert_null(m.data);
                    assert_non_null(m.data16);
                    assert_int_equal((uintptr_t)m.data16 % PS_DATA_ALIGN, 0);
                    assert_true((const uint8_t *)m.data16 >= payload);
                    assert_true((const uint8_t *)(m.data16 + n) <= payload + (w->n - PS_FRAME_HDR));
                    assert_memory_equal(m.data16, half, n * 2);
                    assert_int_equal(m.base, 2);
                    assert_int_equal(m.off, 1);
                    free(payload);
                    free(w);
                }
            }
        }
    }
    for (int i = 0; i < PS_DATA_ALIGN; i++)
        if (!seen[i])
            fail_msg("no case put the tensor at offset %d mod %d", i, PS_DATA_ALIGN);
}

static void expect_frame(mpw *w, const badcase *c)
{
    ps_msg m;
    uint8_t *payload;
    int rc = dec_frame(w, &m, &payload);
    free(payload);
    if (rc != c->code)
        fail_msg("%s: decode returned %d (%s), expected %d; message: %s", c->what, rc, ps_errname(rc), c->code,
                 err);
    assert_msg_has(err, c->needle);
}

static void test_decode_bf16_errors(void **state)
{
    (void)state;
    mpw *w = mpw_new();
    static const uint8_t bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};

    /* a byte count that is no whole number of elements */
    bf16_push(w, PS_DT_BF16, 0, bytes, 7, 0, 0);
    expect_frame(w, &(badcase){"bf16, 7 bytes", PS_EBAD_FIELD, "data has 7 bytes, not a multiple of 2"});
    assert_msg_has(err, "bf16");
    bf16_push(w, PS_DT_BF16, 1, bytes, 7, 0xc6, 1);
    expect_frame(w, &(badcase){"bf16 (dt after data), 7 bytes", PS_EBAD_FIELD, "data has 7 bytes"});
    bf16_push(w, PS_DT_BF16, 0, bytes, 1, 0, 2);
    expect_frame(w, &(badcase){"bf16, 1 byte", PS_EBAD_FIELD, "data has 1 bytes, not a multiple of 2"});
    /* 6 bytes are 3 bfloat16 but no whole float32 */
    bf16_push(w, PS_DT_F32, 0, bytes, 6, 0, 0);
    expect_frame(w, &(badcase){"explicit f32, 6 bytes", PS_EBAD_FIELD, "data has 6 bytes, not a multiple of 4"});
    bf16_push(w, -1, 0, bytes, 6, 0, 0);
    expect_frame(w, &(badcase){"no dt, 6 bytes", PS_EBAD_FIELD, "not a multiple of 4"});
    /* element types this protocol does not know */
    bf16_push(w, 4, 0, bytes, 8, 0, 0);
    expect_frame(w, &(badcase){"dt 4", PS_EUNSUPPORTED, "unknown tensor element type 4 in 'dt'"});
    bf16_push(w, 4, 1, bytes, 8, 0, 0);
    expect_frame(w, &(badcase){"dt 4 after data", PS_EUNSUPPORTED, "'dt'"});
    bf16_push(w, PS_DT_F32ZSTD, 0, bytes, 8, 0, 0);
    expect_frame(w, &(badcase){"dt 3 without len", PS_EBAD_FIELD, "needs 'len'"});
    /* float32 without zeros says in len how many values its bitmap covers */
    bf16_push(w, PS_DT_F32Z, 0, bytes, 8, 0, 0);
    expect_frame(w, &(badcase){"dt 2 without len", PS_EBAD_FIELD, "needs 'len'"});
    bf16_push(w, 255, 0, bytes, 8, 0, 0);
    expect_frame(w, &(badcase){"dt 255", PS_EUNSUPPORTED, "255"});
    w->n = 0;

#define FIELD_IS(type, key, ...)                                                                                  \
    do {                                                                                                           \
        mp_map(w, 3);                                                                                              \
        mp_str(w, "t"), mp_uint(w, type);                                                                         \
        mp_str(w, "id"), mp_uint(w, 1);                                                                           \
        mp_str(w, key);                                                                                            \
        __VA_ARGS__;                                                                                               \
    } while (0)

    FIELD_IS(PS_MSG_PULL, "rdt", mp_uint(w, 4));
    expect(w, &(badcase){"rdt 4", PS_EUNSUPPORTED, "unknown tensor element type 4 in 'rdt'"});
    FIELD_IS(PS_MSG_HEARTBEAT, "dt", mp_uint(w, UINT64_MAX));
    expect(w, &(badcase){"dt 2^64-1", PS_EUNSUPPORTED, "18446744073709551615"});
    FIELD_IS(PS_MSG_HEARTBEAT, "dt", mp_int(w, -1));
    expect(w, &(badcase){"dt negative", PS_EBAD_FIELD, "field 'dt' must be a non-negative integer"});
    FIELD_IS(PS_MSG_HEARTBEAT, "dt", mp_str(w, "bf16"));
    expect(w, &(badcase){"dt a string", PS_EBAD_FIELD, "'dt'"});
    FIELD_IS(PS_MSG_HEARTBEAT, "dt", mp_f64(w, 1.0));
    expect(w, &(badcase){"dt a float", PS_EBAD_FIELD, "'dt'"});
    FIELD_IS(PS_MSG_HEARTBEAT, "rdt", mp_bool(w, 1));
    expect(w, &(badcase){"rdt a bool", PS_EBAD_FIELD, "field 'rdt' must be a non-negative integer"});
    FIELD_IS(PS_MSG_HEARTBEAT, "rdt", mp_nil(w));
    expect(w, &(badcase){"rdt nil", PS_EBAD_FIELD, "'rdt'"});
    FIELD_IS(PS_MSG_HEARTBEAT, "wire", mp_str(w, "bf16"));
    expect(w, &(badcase){"wire a string", PS_EBAD_FIELD, "'wire'"});
    FIELD_IS(PS_MSG_HEARTBEAT, "wire", mp_int(w, -2));
    expect(w, &(badcase){"wire negative", PS_EBAD_FIELD, "'wire'"});
#undef FIELD_IS

    mp_map(w, 3), mp_str(w, "t"), mp_uint(w, PS_MSG_PULL), mp_field(w, PS_F_DT), mp_field(w, PS_F_DT);
    expect(w, &(badcase){"dt twice", PS_EBAD_FIELD, "field 'dt' appears twice"});
    mp_map(w, 3), mp_str(w, "t"), mp_uint(w, PS_MSG_PULL), mp_field(w, PS_F_RDT), mp_field(w, PS_F_RDT);
    expect(w, &(badcase){"rdt twice", PS_EBAD_FIELD, "field 'rdt' appears twice"});
    mp_map(w, 3), mp_str(w, "t"), mp_uint(w, PS_MSG_WELCOME), mp_field(w, PS_F_WIRE), mp_field(w, PS_F_WIRE);
    expect(w, &(badcase){"wire twice", PS_EBAD_FIELD, "field 'wire' appears twice"});

    /* "dt" and "rdt" side by side are two fields, not one twice */
    ps_msg m;
    mp_map(w, 3), mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT), mp_field(w, PS_F_DT), mp_field(w, PS_F_RDT);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.dt, PS_DT_F32);
    assert_int_equal(m.rdt, PS_DT_BF16);
    assert_int_equal(m.has & (PS_F_DT | PS_F_RDT), PS_F_DT | PS_F_RDT);
    w->n = 0;
    /* absent, they are float32 */
    mp_map(w, 1), mp_str(w, "t"), mp_uint(w, PS_MSG_HEARTBEAT);
    assert_int_equal(dec_copy(w, &m), 0);
    assert_int_equal(m.dt, PS_DT_F32);
    assert_int_equal(m.rdt, PS_DT_F32);
    assert_int_equal(m.has & (PS_F_DT | PS_F_RDT | PS_F_WIRE), 0);
    free(w);
}

/* ps_fail: the one "write the message, return the code" of the decoders
 * (msg_decode.c, table.c) */
static void test_fail_writes_and_returns(void **state)
{
    (void)state;
    char msg[16] = "untouched";
    assert_int_equal(ps_fail(msg, sizeof msg, PS_EBAD_FIELD, "field '%s' is %d", "x", 7), PS_EBAD_FIELD);
    assert_string_equal(msg, "field 'x' is 7");
    assert_int_equal(ps_fail(msg, sizeof msg, PS_EMALFORMED, "%s", "a message longer than msg"), PS_EMALFORMED);
    assert_string_equal(msg, "a message longe"); /* cut to 15 bytes and a NUL */
    char none[1] = {'z'};
    assert_int_equal(ps_fail(none, 0, PS_ESTATE, "nothing written"), PS_ESTATE);
    assert_int_equal(none[0], 'z');
}

/* ps_pack_table_def: a table's declaration as STATUS and a checkpoint
 * write it: PS_TABLE_DEF_KEYS entries, hp holding the optimizer's
 * hyper-parameters only, read back with msgpack-c's unpacker */
static void test_pack_table_def(void **state)
{
    (void)state;
    ps_table_def d;
    char msg[200];
    ps_hp hp = {.has = 1u << PS_HP_LR, .v = {[PS_HP_LR] = 0.05}};
    assert_int_equal(ps_table_def_make(&d, "emb", 8, "normal", 1, 0.01, 7, "adam", &hp, msg, sizeof msg), 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, PS_TABLE_DEF_KEYS + 1);
    ps_pack_table_def(&pk, &d);
    ps_pack_ku64(&pk, "rows", 3);
    msgpack_zone tz;
    msgpack_zone_init(&tz, 2048);
    msgpack_object o;
    assert_int_equal(msgpack_unpack(sb.data, sb.size, NULL, &tz, &o), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, PS_TABLE_DEF_KEYS + 1);
    const msgpack_object *v = ps_map_get(&o, "name");
    assert_non_null(v);
    assert_int_equal(v->via.str.size, 3);
    assert_memory_equal(v->via.str.ptr, "emb", 3);
    assert_int_equal(ps_map_get(&o, "dim")->via.u64, 8);
    assert_memory_equal(ps_map_get(&o, "rinit")->via.str.ptr, "normal", 6);
    assert_true(ps_map_get(&o, "scale")->via.f64 == d.scale);
    assert_int_equal(ps_map_get(&o, "seed")->via.u64, 7);
    assert_memory_equal(ps_map_get(&o, "opt")->via.str.ptr, "adam", 4);
    assert_int_equal(ps_map_get(&o, "rows")->via.u64, 3);
    const msgpack_object *h = ps_map_get(&o, "hp");
    assert_non_null(h);
    assert_int_equal(h->via.map.size, 4); /* adam: lr, eps, beta1, beta2 */
    assert_true(ps_map_get(h, "lr")->via.f64 == 0.05);
    assert_true(ps_map_get(h, "beta1")->via.f64 == d.hp[PS_HP_BETA1]);
    assert_null(ps_map_get(h, "l1"));
    msgpack_zone_destroy(&tz);
    msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_header_need_more),
        cmocka_unit_test(test_fail_writes_and_returns),
        cmocka_unit_test(test_pack_table_def),
        cmocka_unit_test(test_frame_header_zero_and_limits),
        cmocka_unit_test(test_frame_put_len_big_endian),
        cmocka_unit_test(test_scan_accepts_every_type),
        cmocka_unit_test(test_scan_types_agree_with_unpacker),
        cmocka_unit_test(test_scan_rejects_reserved_byte),
        cmocka_unit_test(test_scan_truncation_push),
        cmocka_unit_test(test_scan_truncation_hello),
        cmocka_unit_test(test_hello_largest_layout),
        cmocka_unit_test(test_scan_trailing_bytes),
        cmocka_unit_test(test_scan_huge_declared_counts),
        cmocka_unit_test(test_scan_lengths_beyond_the_end),
        cmocka_unit_test(test_scan_depth),
        cmocka_unit_test(test_scan_max_objects),
        cmocka_unit_test(test_scan_error_buffer),
        cmocka_unit_test(test_round_trip_each_type),
        cmocka_unit_test(test_round_trip_all_fields),
        cmocka_unit_test(test_round_trip_second_word),
        cmocka_unit_test(test_encode_alignment),
        cmocka_unit_test(test_encode_header_only),
        cmocka_unit_test(test_encode_errors),
        cmocka_unit_test(test_decode_misaligned_data),
        cmocka_unit_test(test_decode_misaligned_payload),
        cmocka_unit_test(test_decode_every_field_accepted),
        cmocka_unit_test(test_decode_missing_required),
        cmocka_unit_test(test_decode_inshm),
        cmocka_unit_test(test_decode_seg),
        cmocka_unit_test(test_wait_field),
        cmocka_unit_test(test_decode_type_errors),
        cmocka_unit_test(test_decode_field_errors),
        cmocka_unit_test(test_decode_hello_errors),
        cmocka_unit_test(test_decode_failure_leaves_message_defined),
        cmocka_unit_test(test_layout_add_limits),
        cmocka_unit_test(test_layout_pack_unpack),
        cmocka_unit_test(test_layout_fingerprint),
        cmocka_unit_test(test_layout_equal),
        cmocka_unit_test(test_layout_describe),
        cmocka_unit_test(test_part_bounds),
        cmocka_unit_test(test_layout_part),
        cmocka_unit_test(test_round_trip_shm),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_type_and_role_names),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_mutated_frames),
        cmocka_unit_test(test_random_messages),
        cmocka_unit_test(test_round_trip_bf16),
        cmocka_unit_test(test_encode_bf16_bytes),
        cmocka_unit_test(test_f32z),
        cmocka_unit_test(test_decode_bf16_data),
        cmocka_unit_test(test_decode_bf16_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
