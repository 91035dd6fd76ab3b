/* test_table_msg.c - the table messages of proto/ (PROTOCOL.md 13): TABLE,
 * TPULL, TPUSH, TPUSHPULL and ROWS encoded and decoded, the "keys" and "hp"
 * fields and their errors, the float32-only rule, the limits; table
 * declarations (proto/table.c) and a row's initial values from (seed, key).
 *
 * Hand-made frames come from the small growable msgpack writer below, not
 * from msgpack-c's packer or psd's encoder. Every payload handed to the
 * decoder is a heap block of exactly its length (AddressSanitizer sees a
 * read past it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/msg.h"
#include "proto/ps_limits.h"
#include "proto/table.h"

#define assert_has(text, needle)                                                                                   \
    do {                                                                                                           \
        if (strstr((text), (needle)) == NULL)                                                                      \
            fail_msg("\"%s\" lacks \"%s\"", (text), (needle));                                                    \
    } while (0)

/* ---- a growable msgpack writer --------------------------------------------------- */

typedef struct wr {
    uint8_t *p;
    size_t n, cap;
} wr;

static void put(wr *w, const void *p, size_t n)
{
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->n + n)
            cap *= 2;
        w->p = realloc(w->p, cap);
        assert_non_null(w->p);
        w->cap = cap;
    }
    memcpy(w->p + w->n, p, n);
    w->n += n;
}

static void put_be(wr *w, uint8_t tag, uint64_t v, unsigned bytes)
{
    uint8_t b[9] = {tag};
    for (unsigned i = 0; i < bytes; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(w, b, 1 + bytes);
}

static void w_map(wr *w, uint32_t n) { put_be(w, 0xdf, n, 4); }
static void w_uint(wr *w, uint64_t v) { put_be(w, 0xcf, v, 8); }
static void w_str(wr *w, const char *s)
{
    put_be(w, 0xdb, strlen(s), 4);
    put(w, s, strlen(s));
}
static void w_bin(wr *w, const void *p, size_t n)
{
    put_be(w, 0xc6, n, 4);
    put(w, p, n);
}
static void w_f64(wr *w, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    put_be(w, 0xcb, u, 8);
}

static msgpack_zone zone;
static char err[512];

/* Decodes w's bytes from a heap copy of exactly their length. */
static int dec(const wr *w, ps_msg *m, uint8_t **keep)
{
    static const ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    uint8_t *p = malloc(w->n);
    assert_non_null(p);
    memcpy(p, w->p, w->n);
    msgpack_zone_clear(&zone);
    err[0] = '\0';
    int rc = ps_msg_decode(p, w->n, &lim, &zone, m, NULL, err, sizeof err);
    if (keep)
        *keep = p;
    else
        free(p);
    return rc;
}

static void keys_le(uint8_t *out, const uint64_t *k, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++)
            out[8 * i + b] = (uint8_t)(k[i] >> (8 * b));
}

static int setup(void **state)
{
    (void)state;
    return msgpack_zone_init(&zone, 4096) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    msgpack_zone_destroy(&zone);
    return 0;
}

/* ---- encode and decode -------------------------------------------------------- */

/* psd's encoder, our decoder: each table message comes back field for field. */
static void test_round_trip(void **state)
{
    (void)state;
    static const uint64_t k[3] = {0, 42, UINT64_MAX};
    static const uint64_t pk[2] = {7, 1ull << 63};
    uint8_t kb[24], pkb[16];
    keys_le(kb, k, 3);
    keys_le(pkb, pk, 2);
    static const float rows[6] = {1, -2, 0.5f, 3e-8f, -0.0f, 1e30f};
    ps_buf out = {0};
    msgpack_zone_clear(&zone);

    ps_msg m, d;
    ps_msg_init(&m, PS_MSG_TABLE);
    m.has = PS_F_ID | PS_F_TAB | PS_F_DIM | PS_F_RINIT | PS_F_SCALE | PS_F_SEED | PS_F_OPT | PS_F_HP;
    m.id = 9;
    strcpy(m.tab, "user_id");
    m.dim = 16;
    strcpy(m.rinit, "normal");
    m.scale = 0.01;
    m.seed = UINT64_MAX - 1;
    strcpy(m.opt, "adam");
    m.hp.has = 1u << PS_HP_LR | 1u << PS_HP_BETA2;
    m.hp.v[PS_HP_LR] = 0.003;
    m.hp.v[PS_HP_BETA2] = 0.98;
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    static const ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    uint8_t *p = malloc(out.len - 4);
    memcpy(p, out.p + 4, out.len - 4);
    assert_int_equal(ps_msg_decode(p, out.len - 4, &lim, &zone, &d, NULL, err, sizeof err), 0);
    assert_int_equal(d.type, PS_MSG_TABLE);
    assert_int_equal(d.has, m.has);
    assert_string_equal(d.tab, "user_id");
    assert_int_equal(d.dim, 16);
    assert_string_equal(d.rinit, "normal");
    assert_true(d.scale == 0.01);
    assert_true(d.seed == UINT64_MAX - 1);
    assert_string_equal(d.opt, "adam");
    assert_int_equal(d.hp.has, m.hp.has);
    assert_true(d.hp.v[PS_HP_LR] == 0.003 && d.hp.v[PS_HP_BETA2] == 0.98);
    free(p);

    /* tpushpull: keys, pkeys and rows */
    ps_msg_init(&m, PS_MSG_TPUSHPULL);
    m.has = PS_F_ID | PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA | PS_F_PKEYS | PS_F_MIN;
    m.id = 10;
    strcpy(m.tab, "t");
    m.keys = (ps_keys){kb, 3};
    m.pkeys = (ps_keys){pkb, 2};
    m.base = 5;
    m.min = 6;
    m.data = rows;
    m.ndata = 6;
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    p = malloc(out.len - 4);
    memcpy(p, out.p + 4, out.len - 4);
    assert_int_equal(ps_msg_decode(p, out.len - 4, &lim, &zone, &d, NULL, err, sizeof err), 0);
    assert_int_equal(d.type, PS_MSG_TPUSHPULL);
    assert_int_equal(d.has, m.has);
    assert_int_equal(d.keys.n, 3);
    assert_int_equal(d.pkeys.n, 2);
    for (int i = 0; i < 3; i++)
        assert_true(ps_key_at(d.keys.p, (size_t)i) == k[i]);
    for (int i = 0; i < 2; i++)
        assert_true(ps_key_at(d.pkeys.p, (size_t)i) == pk[i]);
    assert_int_equal(d.ndata, 6);
    assert_int_equal((uintptr_t)d.data % PS_DATA_ALIGN, 0);
    assert_memory_equal(d.data, rows, sizeof rows);
    assert_int_equal(d.base, 5);
    assert_int_equal(d.min, 6);
    free(p);

    /* rows: ver and data */
    ps_msg_init(&m, PS_MSG_ROWS);
    m.has = PS_F_ID | PS_F_MVER | PS_F_DATA;
    m.id = 10;
    m.mver = 6;
    m.data = rows;
    m.ndata = 4;
    assert_int_equal(ps_msg_encode_full(&m, &out), 0);
    p = malloc(out.len - 4);
    memcpy(p, out.p + 4, out.len - 4);
    assert_int_equal(ps_msg_decode(p, out.len - 4, &lim, &zone, &d, NULL, err, sizeof err), 0);
    assert_int_equal(d.type, PS_MSG_ROWS);
    assert_int_equal(d.mver, 6);
    assert_memory_equal(d.data, rows, 4 * sizeof(float));
    assert_true(ps_msg_from_server_only(PS_MSG_ROWS));
    assert_false(ps_msg_from_server_only(PS_MSG_TPULL));
    assert_string_equal(ps_msg_type_name(PS_MSG_TPUSHPULL), "tpushpull");
    free(p);
    ps_buf_free(&out);
}

/* A frame from another encoder: keys at an odd offset, data unaligned. */
static void test_decode_foreign_frame(void **state)
{
    (void)state;
    static const uint64_t k[2] = {0x0102030405060708ull, 5};
    uint8_t kb[16];
    keys_le(kb, k, 2);
    float rows[4] = {1, 2, 3, 4};
    wr w = {0};
    w_map(&w, 6);
    w_str(&w, "data"), w_bin(&w, rows, sizeof rows); /* first, not last */
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPUSH);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "x"), w_str(&w, "y"); /* unknown keys are ignored */
    w_str(&w, "keys"), w_bin(&w, kb, sizeof kb);
    w_str(&w, "base"), w_uint(&w, 0);
    ps_msg m;
    uint8_t *p;
    assert_int_equal(dec(&w, &m, &p), 0);
    assert_int_equal(m.keys.n, 2);
    assert_true(ps_key_at(m.keys.p, 0) == k[0]);
    assert_true(ps_key_at(m.keys.p, 1) == 5);
    assert_int_equal(m.ndata, 4);
    assert_true(m.data[3] == 4.0f);
    free(p);
    free(w.p);
}

/* A message with keys, with the bin of keys given (n bytes). */
static void keys_msg(wr *w, uint32_t type, const void *keys, size_t n)
{
    w->n = 0;
    w_map(w, 3);
    w_str(w, "t"), w_uint(w, type);
    w_str(w, "tab"), w_str(w, "e");
    w_str(w, "keys"), w_bin(w, keys, n);
}

static void test_keys_errors(void **state)
{
    (void)state;
    size_t big = (size_t)(PS_TABLE_KEYS_MAX + 1) * 8;
    uint8_t *kb = calloc(1, big);
    assert_non_null(kb);
    wr w = {0};
    ps_msg m;
    static const size_t bad_lengths[] = {0, 1, 7, 9, 15};
    for (size_t i = 0; i < sizeof bad_lengths / sizeof bad_lengths[0]; i++) {
        keys_msg(&w, PS_MSG_TPULL, kb, bad_lengths[i]);
        assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
        assert_has(err, "'keys' must be a bin of 1..65536 little-endian uint64 keys");
    }
    keys_msg(&w, PS_MSG_TPULL, kb, (size_t)PS_TABLE_KEYS_MAX * 8);
    assert_int_equal(dec(&w, &m, NULL), 0);
    assert_int_equal(m.keys.n, PS_TABLE_KEYS_MAX);
    keys_msg(&w, PS_MSG_TPULL, kb, big);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "65537 keys, more than 65536");
    /* keys as a str, not a bin */
    w.n = 0;
    w_map(&w, 3);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "keys"), w_str(&w, "12345678");
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "not a non-bin");
    /* pkeys the same way */
    w.n = 0;
    w_map(&w, 2);
    w_str(&w, "t"), w_uint(&w, PS_MSG_HEARTBEAT);
    w_str(&w, "pkeys"), w_bin(&w, kb, 12);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "'pkeys'");
    free(kb);
    free(w.p);
}

/* TPULL: by key or by position (len, maybe off), not both, not neither. */
static void test_tpull_by_position(void **state)
{
    (void)state;
    uint8_t kb[8] = {1};
    wr w = {0};
    ps_msg m;
    w_map(&w, 4);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "off"), w_uint(&w, 100);
    w_str(&w, "len"), w_uint(&w, 7);
    assert_int_equal(dec(&w, &m, NULL), 0);
    assert_true(m.off == 100 && m.len == 7 && !(m.has & PS_F_KEYS));
    w.n = 0;
    w_map(&w, 4);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "keys"), w_bin(&w, kb, 8);
    w_str(&w, "len"), w_uint(&w, 7);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "'keys' and 'len' together");
    w.n = 0;
    w_map(&w, 3);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "off"), w_uint(&w, 0);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "tpull: missing field 'keys'");
    free(w.p);
}

/* A TABLE with the given hp map writer. */
static void table_msg(wr *w, void (*hp)(wr *))
{
    w->n = 0;
    w_map(w, hp ? 6 : 5);
    w_str(w, "t"), w_uint(w, PS_MSG_TABLE);
    w_str(w, "tab"), w_str(w, "e");
    w_str(w, "dim"), w_uint(w, 8);
    w_str(w, "rinit"), w_str(w, "zeros");
    w_str(w, "opt"), w_str(w, "ftrl");
    if (hp) {
        w_str(w, "hp");
        hp(w);
    }
}

static void hp_good(wr *w)
{
    w_map(w, 4);
    w_str(w, "l1"), w_f64(w, 1.0);
    w_str(w, "l2"), w_uint(w, 2);
    w_str(w, "beta"), put_be(w, 0xd0, 0xff, 1); /* int8 -1: a number, the decoder takes it */
    w_str(w, "lr"), put_be(w, 0xca, 0x3f000000, 4); /* float32 0.5 */
}
static void hp_unknown(wr *w)
{
    w_map(w, 1);
    w_str(w, "momentum"), w_f64(w, 0.9);
}
static void hp_twice(wr *w)
{
    w_map(w, 2);
    w_str(w, "lr"), w_f64(w, 0.1);
    w_str(w, "lr"), w_f64(w, 0.2);
}
static void hp_nan(wr *w)
{
    w_map(w, 1);
    w_str(w, "eps"), w_f64(w, NAN);
}
static void hp_str(wr *w)
{
    w_map(w, 1);
    w_str(w, "eps"), w_str(w, "0.1");
}
static void hp_not_map(wr *w) { w_str(w, "lr=0.1"); }
static void hp_too_many(wr *w)
{
    w_map(w, 9);
    for (int i = 0; i < 9; i++)
        w_str(w, "lr"), w_f64(w, 0.1);
}

static void test_hp(void **state)
{
    (void)state;
    wr w = {0};
    ps_msg m;
    table_msg(&w, hp_good);
    assert_int_equal(dec(&w, &m, NULL), 0);
    assert_int_equal(m.hp.has, 1u << PS_HP_L1 | 1u << PS_HP_L2 | 1u << PS_HP_BETA | 1u << PS_HP_LR);
    assert_true(m.hp.v[PS_HP_L1] == 1.0 && m.hp.v[PS_HP_L2] == 2.0 && m.hp.v[PS_HP_BETA] == -1.0 &&
                m.hp.v[PS_HP_LR] == 0.5);
    static const struct {
        void (*hp)(wr *);
        const char *why;
    } bad[] = {
        {hp_unknown, "unknown hyper-parameter"}, {hp_twice, "hp 'lr' appears twice"},
        {hp_nan, "hp 'eps' must be a finite number"}, {hp_str, "hp 'eps' must be a finite number"},
        {hp_not_map, "hp must be a map"}, {hp_too_many, "at most 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        table_msg(&w, bad[i].hp);
        assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
        assert_has(err, bad[i].why);
    }
    /* TABLE without one of its required fields */
    w.n = 0;
    w_map(&w, 4);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TABLE);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "dim"), w_uint(&w, 8);
    w_str(&w, "opt"), w_str(&w, "sgd");
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "table: missing field 'rinit'");
    free(w.p);
}

/* Row gradients may come in any form a push takes (PROTOCOL.md 13.2),
 * rows be asked for by key as bfloat16 or compressed; a TPULL carries no
 * data to type, rows by position are float32, and f32z never comes back. */
static void test_row_forms(void **state)
{
    (void)state;
    uint8_t kb[8] = {1};
    uint16_t h[2] = {0x3f80, 0x4000};
    wr w = {0};
    ps_msg m;
    w_map(&w, 6);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPUSH);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "keys"), w_bin(&w, kb, 8);
    w_str(&w, "base"), w_uint(&w, 0);
    w_str(&w, "dt"), w_uint(&w, PS_DT_BF16);
    w_str(&w, "data"), w_bin(&w, h, sizeof h);
    uint8_t *buf = NULL; /* the frame the decoded data points into */
    assert_int_equal(dec(&w, &m, &buf), 0);
    assert_int_equal(m.ndata, 2);
    assert_non_null(m.data16);
    assert_int_equal(m.data16[1], 0x4000);
    free(buf);

    /* compressed: "len" says how many values, before anything is sized */
    uint8_t frame[16] = {0x28, 0xb5, 0x2f, 0xfd};
    w.n = 0;
    w_map(&w, 6);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPUSHPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "keys"), w_bin(&w, kb, 8);
    w_str(&w, "pkeys"), w_bin(&w, kb, 8);
    w_str(&w, "dt"), w_uint(&w, PS_DT_F32ZSTD);
    w_str(&w, "data"), w_bin(&w, frame, sizeof frame);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD);
    assert_has(err, "needs 'len'");
    w.n = 0;
    w_map(&w, 8);
    w_str(&w, "t"), w_uint(&w, PS_MSG_TPUSHPULL);
    w_str(&w, "tab"), w_str(&w, "e");
    w_str(&w, "keys"), w_bin(&w, kb, 8);
    w_str(&w, "pkeys"), w_bin(&w, kb, 8);
    w_str(&w, "base"), w_uint(&w, 0);
    w_str(&w, "dt"), w_uint(&w, PS_DT_F32ZSTD);
    w_str(&w, "len"), w_uint(&w, (uint64_t)PS_TABLE_VALUES_MAX + 1);
    w_str(&w, "data"), w_bin(&w, frame, sizeof frame);
    assert_int_equal(dec(&w, &m, NULL), PS_EBAD_FIELD); /* its values over the limit, from len alone */
    assert_has(err, "4194305 row values in one message");

    struct {
        uint32_t type;
        const char *field;
        uint32_t dt;
        int by_position;
        int rc;
        const char *says;
    } cases[] = {
        {PS_MSG_TPULL, "rdt", PS_DT_BF16, 0, 0, NULL},
        {PS_MSG_TPULL, "rdt", PS_DT_F32ZSTD, 0, 0, NULL},
        {PS_MSG_TPULL, "rdt", PS_DT_F32Z, 0, PS_EUNSUPPORTED, "'rdt' 2 (f32z) is not supported here"},
        {PS_MSG_TPULL, "rdt", PS_DT_BF16, 1, PS_EUNSUPPORTED, "'rdt' 1 (bf16) is not supported here"},
        {PS_MSG_TPULL, "dt", PS_DT_BF16, 0, PS_EUNSUPPORTED, "'dt' 1 (bf16) is not supported here"},
        {PS_MSG_TABLE, "dt", PS_DT_BF16, 0, PS_EUNSUPPORTED, "'dt' 1 (bf16)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        w.n = 0;
        if (cases[i].type == PS_MSG_TABLE) {
            w_map(&w, 6);
            w_str(&w, "t"), w_uint(&w, PS_MSG_TABLE);
            w_str(&w, "tab"), w_str(&w, "e");
            w_str(&w, "dim"), w_uint(&w, 2);
            w_str(&w, "rinit"), w_str(&w, "zeros");
            w_str(&w, "opt"), w_str(&w, "sgd");
        } else {
            w_map(&w, cases[i].by_position ? 5 : 4);
            w_str(&w, "t"), w_uint(&w, cases[i].type);
            w_str(&w, "tab"), w_str(&w, "e");
            if (cases[i].by_position) {
                w_str(&w, "off"), w_uint(&w, 0);
                w_str(&w, "len"), w_uint(&w, 2);
            } else {
                w_str(&w, "keys"), w_bin(&w, kb, 8);
            }
        }
        w_str(&w, cases[i].field), w_uint(&w, cases[i].dt);
        int rc = dec(&w, &m, NULL);
        assert_int_equal(rc, cases[i].rc);
        if (cases[i].says)
            assert_has(err, cases[i].says);
        else
            assert_int_equal(m.rdt, cases[i].dt);
    }

    /* psd's answer: ROWS in bfloat16 or compressed, never without zeros */
    w.n = 0;
    w_map(&w, 4);
    w_str(&w, "t"), w_uint(&w, PS_MSG_ROWS);
    w_str(&w, "ver"), w_uint(&w, 3);
    w_str(&w, "dt"), w_uint(&w, PS_DT_BF16);
    w_str(&w, "data"), w_bin(&w, h, sizeof h);
    assert_int_equal(dec(&w, &m, NULL), 0);
    assert_int_equal(m.ndata, 2);
    w.n = 0;
    w_map(&w, 5);
    w_str(&w, "t"), w_uint(&w, PS_MSG_ROWS);
    w_str(&w, "ver"), w_uint(&w, 3);
    w_str(&w, "dt"), w_uint(&w, PS_DT_F32Z);
    w_str(&w, "len"), w_uint(&w, 2);
    uint8_t z[12] = {3, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
    w_str(&w, "data"), w_bin(&w, z, sizeof z);
    assert_int_equal(dec(&w, &m, NULL), PS_EUNSUPPORTED);
    free(w.p);
}

/* At most PS_TABLE_VALUES_MAX row values in one table message. */
static void test_values_limit(void **state)
{
    (void)state;
    size_t nb = ((size_t)PS_TABLE_VALUES_MAX + 1) * 4;
    float *rows = calloc(1, nb);
    assert_non_null(rows);
    uint8_t kb[8] = {1};
    wr w = {0};
    ps_msg m;
    for (int over = 0; over <= 1; over++) {
        w.n = 0;
        w_map(&w, 5);
        w_str(&w, "t"), w_uint(&w, PS_MSG_TPUSH);
        w_str(&w, "tab"), w_str(&w, "e");
        w_str(&w, "keys"), w_bin(&w, kb, 8);
        w_str(&w, "base"), w_uint(&w, 0);
        w_str(&w, "data"), w_bin(&w, rows, over ? nb : nb - 4);
        int rc = dec(&w, &m, NULL);
        if (over) {
            assert_int_equal(rc, PS_EBAD_FIELD);
            assert_has(err, "4194305 row values in one message, more than 4194304");
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(m.ndata, PS_TABLE_VALUES_MAX);
        }
    }
    free(rows);
    free(w.p);
}

/* ---- declarations ------------------------------------------------------------------ */

static void test_def_defaults_and_same(void **state)
{
    (void)state;
    ps_table_def a, b;
    ps_hp hp = {0};
    assert_int_equal(ps_table_def_make(&a, "emb", 16, "uniform", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_int_equal(a.dim, 16);
    assert_int_equal(a.rinit, PS_RINIT_UNIFORM);
    assert_int_equal(a.opt, PS_TOPT_ADAGRAD);
    assert_true(a.hp[PS_HP_LR] == 0.01 && a.hp[PS_HP_EPS] == 1e-10 && a.hp[PS_HP_IACC] == 0.0);
    assert_true(a.hp[PS_HP_BETA1] == 0.0); /* not adagrad's */
    /* the defaults sent explicitly: the same table */
    hp.has = 1u << PS_HP_LR | 1u << PS_HP_EPS;
    hp.v[PS_HP_LR] = 0.01;
    hp.v[PS_HP_EPS] = 1e-10;
    assert_int_equal(ps_table_def_make(&b, "emb", 16, "uniform", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_true(ps_table_def_same(&a, &b));
    /* each difference counts */
    hp.v[PS_HP_LR] = 0.02;
    assert_int_equal(ps_table_def_make(&b, "emb", 16, "uniform", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    hp.v[PS_HP_LR] = 0.01;
    assert_int_equal(ps_table_def_make(&b, "emb", 16, "uniform", 1, 0.05, 8, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    assert_int_equal(ps_table_def_make(&b, "emb", 8, "uniform", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    assert_int_equal(ps_table_def_make(&b, "emb", 16, "normal", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    assert_int_equal(ps_table_def_make(&b, "emb", 16, "uniform", 1, 0.06, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    assert_int_equal(ps_table_def_make(&b, "emb2", 16, "uniform", 1, 0.05, 7, "adagrad", &hp, err, sizeof err), 0);
    assert_false(ps_table_def_same(&a, &b));
    /* zeros ignores scale */
    assert_int_equal(ps_table_def_make(&a, "z", 4, "zeros", 1, 3.0, 0, "sgd", NULL, err, sizeof err), 0);
    assert_int_equal(ps_table_def_make(&b, "z", 4, "zeros", 0, 0.0, 0, "sgd", NULL, err, sizeof err), 0);
    assert_true(ps_table_def_same(&a, &b));
    char text[200];
    ps_table_def_text(&a, text, sizeof text);
    assert_string_equal(text, "dim 4, zeros, seed 0, sgd lr 0.01");
    assert_int_equal(ps_table_def_make(&a, "a", 16, "uniform", 1, 0.05, 7, "adam", NULL, err, sizeof err), 0);
    ps_table_def_text(&a, text, sizeof text);
    assert_string_equal(text, "dim 16, uniform(0.05), seed 7, adam lr 0.001 eps 1e-08 beta1 0.9 beta2 0.999");
    assert_int_equal(ps_topt_state_per_value(PS_TOPT_SGD), 0);
    assert_int_equal(ps_topt_state_per_value(PS_TOPT_ADAGRAD), 1);
    assert_int_equal(ps_topt_state_per_value(PS_TOPT_ADAM), 2);
    assert_int_equal(ps_topt_state_per_value(PS_TOPT_FTRL), 2);
    assert_true(ps_topt_has_step(PS_TOPT_ADAM) && !ps_topt_has_step(PS_TOPT_ADAGRAD));
}

static void test_def_errors(void **state)
{
    (void)state;
    ps_table_def d;
    ps_hp hp = {0};
    static const struct {
        const char *name;
        uint64_t dim;
        const char *rinit;
        int has_scale;
        double scale;
        const char *opt;
        int hp_id;
        double hp_v;
        const char *why;
    } bad[] = {
        {"", 4, "zeros", 0, 0, "sgd", -1, 0, "name must have 1..63 bytes"},
        {"a b", 4, "zeros", 0, 0, "sgd", -1, 0, "printable ASCII without space"},
        {"e", 0, "zeros", 0, 0, "sgd", -1, 0, "dim 0 is not in 1..1024"},
        {"e", 1025, "zeros", 0, 0, "sgd", -1, 0, "dim 1025 is not in 1..1024"},
        {"e", 4, "ones", 0, 0, "sgd", -1, 0, "unknown rinit 'ones'"},
        {"e", 4, "uniform", 0, 0, "sgd", -1, 0, "rinit uniform needs 'scale'"},
        {"e", 4, "normal", 1, 0.0, "sgd", -1, 0, "rinit normal needs 'scale'"},
        {"e", 4, "uniform", 1, -1.0, "sgd", -1, 0, "needs 'scale', a finite number > 0"},
        {"e", 4, "uniform", 1, INFINITY, "sgd", -1, 0, "needs 'scale'"},
        {"e", 4, "uniform", 1, 1e39, "sgd", -1, 0, "scale 1e+39 is too large for rinit uniform: its values reach "
                                                "scale x 1, which must stay a finite float32, so scale must be below "
                                                "3.4028236e+38"},
        {"e", 4, "normal", 1, 1e38, "sgd", -1, 0, "scale 1e+38 is too large for rinit normal: its values reach scale "
                                               "x 8.57167435, which must stay a finite float32, so scale must be "
                                               "below 3.969847e+37"},
        {"e", 4, "zeros", 0, 0, "rmsprop", -1, 0, "unknown opt 'rmsprop'"},
        {"e", 4, "uniform", 1, 0.1, "ftrl", -1, 0, "its rinit must be zeros, not uniform"},
        {"e", 4, "zeros", 0, 0, "adagrad", PS_HP_BETA1, 0.9, "hp 'beta1' is not a hyper-parameter of adagrad (it "
                                                            "takes lr, eps, iacc)"},
        {"e", 4, "zeros", 0, 0, "sgd", PS_HP_LR, 0.0, "hp 'lr' is 0; it must be > 0"},
        {"e", 4, "zeros", 0, 0, "adam", PS_HP_BETA1, 1.0, "hp 'beta1' is 1; it must be in [0, 1)"},
        {"e", 4, "zeros", 0, 0, "adam", PS_HP_EPS, -1e-8, "hp 'eps' is -1e-08; it must be > 0"},
        {"e", 4, "zeros", 0, 0, "ftrl", PS_HP_L1, -0.5, "hp 'l1' is -0.5; it must be >= 0"},
        {"e", 4, "zeros", 0, 0, "adagrad", PS_HP_IACC, -1, "hp 'iacc' is -1; it must be >= 0"},
        {"e", 4, "zeros", 0, 0, "ftrl", PS_HP_BETA, NAN, "hp 'beta' is nan; it must be a finite number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hp.has = 0;
        if (bad[i].hp_id >= 0) {
            hp.has = 1u << bad[i].hp_id;
            hp.v[bad[i].hp_id] = bad[i].hp_v;
        }
        int rc = ps_table_def_make(&d, bad[i].name, bad[i].dim, bad[i].rinit, bad[i].has_scale, bad[i].scale, 0,
                                   bad[i].opt, &hp, err, sizeof err);
        if (rc != PS_EBAD_FIELD)
            fail_msg("case %zu (%s): %d", i, bad[i].why, rc);
        assert_has(err, bad[i].why);
    }
}

/* ---- a row's initial values ---------------------------------------------------------- */

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The values PROTOCOL.md 13.3 gives, computed by a separate implementation
 * of its formula (Python integers and math). */
static void test_row_init_pinned(void **state)
{
    (void)state;
    assert_true(ps_mix64(1) == 0x5692161d100b05e5ull);
    ps_table_def d;
    float row[4];
    assert_int_equal(ps_table_def_make(&d, "e", 4, "uniform", 1, 0.05, 7, "sgd", NULL, err, sizeof err), 0);
    ps_table_row_init(&d, 42, row);
    static const uint32_t uni[4] = {0x3d482aff, 0xbd21463f, 0xbc0b4c8c, 0x3d245d79};
    for (int j = 0; j < 4; j++)
        assert_int_equal(bits(row[j]), uni[j]);
    assert_int_equal(ps_table_def_make(&d, "e", 3, "normal", 1, 1.0, 7, "sgd", NULL, err, sizeof err), 0);
    ps_table_row_init(&d, 42, row);
    static const uint32_t nor[3] = {0x401678ca, 0x3f57b446, 0xbfbaaaec};
    for (int j = 0; j < 3; j++)
        assert_int_equal(bits(row[j]), nor[j]);
    assert_int_equal(ps_table_def_make(&d, "e", 2, "uniform", 1, 1.0, 0, "sgd", NULL, err, sizeof err), 0);
    ps_table_row_init(&d, UINT64_MAX, row);
    assert_int_equal(bits(row[0]), 0xbf6b7114);
    assert_int_equal(bits(row[1]), 0xbe59c8ce);
}

/* A row is a function of (seed, key) alone: the name and the optimizer do not
 * matter, value j does not depend on dim, another seed or key gives another
 * row; uniform values lie in (-a, a) with the mean and variance of
 * uniform(-a, a), normal ones have the std asked for; zeros are zeros. */
static void test_row_init_properties(void **state)
{
    (void)state;
    ps_table_def a, b;
    float ra[64], rb[64];
    assert_int_equal(ps_table_def_make(&a, "x", 64, "uniform", 1, 0.5, 3, "sgd", NULL, err, sizeof err), 0);
    assert_int_equal(ps_table_def_make(&b, "other", 8, "uniform", 1, 0.5, 3, "adam", NULL, err, sizeof err), 0);
    ps_table_row_init(&a, 123456789, ra);
    ps_table_row_init(&b, 123456789, rb);
    assert_memory_equal(ra, rb, 8 * sizeof(float));
    ps_table_row_init(&a, 123456790, rb);
    assert_memory_not_equal(ra, rb, 64 * sizeof(float));
    b = a;
    b.seed = 4;
    ps_table_row_init(&b, 123456789, rb);
    assert_memory_not_equal(ra, rb, 64 * sizeof(float));

    double sum = 0, sq = 0;
    size_t n = 0;
    for (uint64_t key = 0; key < 4000; key++) {
        ps_table_row_init(&a, key * 0x9e3779b97f4a7c15ull, ra);
        for (int j = 0; j < 64; j++) {
            assert_true(ra[j] > -0.5f && ra[j] < 0.5f);
            sum += ra[j];
            sq += (double)ra[j] * ra[j];
            n++;
        }
    }
    double mean = sum / (double)n, var = sq / (double)n - mean * mean;
    assert_true(fabs(mean) < 0.003);              /* sd of the mean: 0.29 / sqrt(256000) = 0.0006 */
    assert_true(fabs(var - 0.25 / 3) < 0.001);   /* (2a)^2 / 12 */

    assert_int_equal(ps_table_def_make(&a, "x", 64, "normal", 1, 0.1, 3, "sgd", NULL, err, sizeof err), 0);
    sum = sq = 0;
    n = 0;
    for (uint64_t key = 0; key < 4000; key++) {
        ps_table_row_init(&a, key, ra);
        for (int j = 0; j < 64; j++) {
            assert_true(isfinite(ra[j]));
            sum += ra[j];
            sq += (double)ra[j] * ra[j];
            n++;
        }
    }
    mean = sum / (double)n;
    var = sq / (double)n - mean * mean;
    assert_true(fabs(mean) < 0.001);
    assert_true(fabs(sqrt(var) - 0.1) < 0.001);

    assert_int_equal(ps_table_def_make(&a, "x", 64, "zeros", 0, 0, 3, "sgd", NULL, err, sizeof err), 0);
    memset(ra, 0xff, sizeof ra);
    ps_table_row_init(&a, 77, ra);
    for (int j = 0; j < 64; j++)
        assert_int_equal(bits(ra[j]), 0);
}

/* The largest scale each initializer takes (PROTOCOL.md 13.1): its values'
 * largest magnitude times scale must round to a finite float32, that is stay
 * below 2^128 - 2^103. uniform reaches 1 x scale (at u = 0), normal
 * sqrt(-2 ln 2^-53) x scale (at u = 1 - 2^-53 and cos = +-1); the largest
 * accepted scales give finite rows, the next doubles up are refused. */
static void test_rinit_scale_bound(void **state)
{
    (void)state;
    ps_table_def d;
    const double inf_from = 0x1p128 - 0x1p103; /* float32 rounds this up to infinity */
    volatile float f = (float)nextafter(inf_from, 0);
    assert_true(isfinite(f) && f == FLT_MAX);
    assert_true(ps_rinit_reach(PS_RINIT_UNIFORM) == 1.0);
    double u1 = (double)((UINT64_MAX >> 11)) * 0x1p-53; /* the largest draw, 1 - 2^-53 */
    assert_true(ps_rinit_reach(PS_RINIT_NORMAL) == sqrt(-2.0 * log(1.0 - u1)));
    assert_true(fabs(ps_rinit_reach(PS_RINIT_NORMAL) - 8.571674348652905) < 1e-12);

    const double uni_max = nextafter(inf_from, 0), nor_max = 3.9698469976663453e37;
    const struct {
        const char *rinit;
        double ok, refused;
    } cases[] = {
        {"uniform", FLT_MAX, inf_from},
        {"uniform", uni_max, inf_from},
        {"normal", nor_max, nextafter(nor_max, INFINITY)},
        {"normal", 3.9e37, 4e37},
    };
    float row[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(ps_table_def_make(&d, "e", 64, cases[i].rinit, 1, cases[i].ok, 5, "sgd", NULL, err, sizeof err),
                         0);
        for (uint64_t key = 0; key < 200; key++) {
            ps_table_row_init(&d, key, row);
            for (int j = 0; j < 64; j++)
                assert_true(isfinite(row[j]));
        }
        assert_int_equal(ps_table_def_make(&d, "e", 64, cases[i].rinit, 1, cases[i].refused, 5, "sgd", NULL, err,
                                           sizeof err),
                         PS_EBAD_FIELD);
        assert_has(err, "is too large for rinit");
    }
    /* the bound is the exact one: just below it, the largest value normal
     * can reach rounds to FLT_MAX; just above, to infinity */
    f = (float)(nor_max * ps_rinit_reach(PS_RINIT_NORMAL));
    assert_true(isfinite(f));
    f = (float)(nextafter(nor_max, INFINITY) * ps_rinit_reach(PS_RINIT_NORMAL));
    assert_true(isinf(f));
}

/* ---- parts (PROTOCOL.md 13.7) ------------------------------------------------ */

/* The jump hash over mix(key): values pinned from the protocol's formula
 * (computed apart from this code, in Python integers and doubles); every
 * key in range; near-equal parts; and from n to n + 1 parts a key moves
 * only to the new part, about 1/(n + 1) of them. */
static void test_part_of_key(void **state)
{
    (void)state;
    static const uint32_t p3[10] = {0, 2, 0, 1, 0, 2, 2, 0, 1, 2}, p2[10] = {0, 0, 0, 1, 0, 1, 1, 0, 1, 0};
    for (uint64_t k = 1; k <= 10; k++) {
        assert_int_equal(ps_table_part(k, 3), p3[k - 1]);
        assert_int_equal(ps_table_part(k, 2), p2[k - 1]);
        assert_int_equal(ps_table_part(k, 1), 0);
    }
    assert_int_equal(ps_table_part(1, 64), 41);
    assert_int_equal(ps_table_part(42, 64), 42);
    assert_int_equal(ps_table_part(123456789, 64), 61);
    assert_int_equal(ps_table_part(UINT64_MAX, 4), 3);
    assert_int_equal(ps_table_part(UINT64_MAX, 64), 60);
    enum { N = 40000 };
    for (uint32_t n = 1; n < 9; n++) {
        uint32_t count[10] = {0}, moved = 0;
        for (uint64_t k = 0; k < N; k++) {
            uint32_t a = ps_table_part(k * 7919, n), b = ps_table_part(k * 7919, n + 1);
            assert_true(a < n && b <= n);
            if (a != b) {
                assert_int_equal(b, n); /* moved only to the new part */
                moved++;
            }
            count[b]++;
        }
        double want = (double)N / (n + 1);
        assert_true(fabs(moved - want) < 0.05 * want);
        for (uint32_t p = 0; p <= n; p++)
            assert_true(fabs(count[p] - want) < 0.05 * want);
    }
}

/* TABLE's "part": [i, n] decoded; out of range refused; part of the
 * declaration (another part is another table) and of its text. */
static void test_part_field(void **state)
{
    (void)state;
    static const struct {
        int len;
        uint64_t i, n;
        int ok;
    } cases[] = {{2, 1, 3, 1}, {2, 0, 1, 1}, {2, 63, 64, 1}, {2, 3, 3, 0}, {2, 0, 65, 0}, {2, 0, 0, 0}, {1, 0, 0, 0}};
    wr w = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        table_msg(&w, NULL);
        w.p[4]++; /* the map's count (w_map writes 0xdf and 4 bytes): one field more */
        w_str(&w, "part");
        put_be(&w, 0xdd, (uint64_t)cases[c].len, 4);
        w_uint(&w, cases[c].i);
        if (cases[c].len == 2)
            w_uint(&w, cases[c].n);
        ps_msg m;
        int rc = dec(&w, &m, NULL);
        if (cases[c].ok) {
            assert_int_equal(rc, 0);
            assert_true(m.has & PS_F_PART);
            assert_int_equal(m.part, cases[c].i);
            assert_int_equal(m.nparts, cases[c].n);
        } else {
            assert_int_equal(rc, PS_EBAD_FIELD);
            assert_has(err, "part must be [i, n] with 0 <= i < n <= 64");
        }
    }
    free(w.p);
    ps_table_def a, b;
    assert_int_equal(ps_table_def_make(&a, "e", 8, "zeros", 0, 0, 0, "sgd", NULL, err, sizeof err), 0);
    assert_int_equal(a.part, 0);
    assert_int_equal(a.nparts, 1);
    b = a;
    b.part = 1;
    b.nparts = 3;
    assert_false(ps_table_def_same(&a, &b));
    a.nparts = 3;
    assert_false(ps_table_def_same(&a, &b));
    a.part = 1;
    assert_true(ps_table_def_same(&a, &b));
    char text[200];
    ps_table_def_text(&a, text, sizeof text);
    assert_string_equal(text, "dim 8, zeros, seed 0, sgd lr 0.01, part 1 of 3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_decode_foreign_frame),
        cmocka_unit_test(test_keys_errors),
        cmocka_unit_test(test_tpull_by_position),
        cmocka_unit_test(test_hp),
        cmocka_unit_test(test_row_forms),
        cmocka_unit_test(test_values_limit),
        cmocka_unit_test(test_def_defaults_and_same),
        cmocka_unit_test(test_def_errors),
        cmocka_unit_test(test_row_init_pinned),
        cmocka_unit_test(test_row_init_properties),
        cmocka_unit_test(test_rinit_scale_bound),
        cmocka_unit_test(test_part_of_key),
        cmocka_unit_test(test_part_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
