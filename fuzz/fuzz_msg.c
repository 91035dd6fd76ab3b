/* fuzz_msg.c - libFuzzer target: one message payload through the decoder,
 * and every message it accepts through our encoder and back.
 *
 * Input: one frame payload (no length prefix). It is decoded with psd's
 * limits; when that succeeds the message is checked against the spec
 * (fuzz_check.c), encoded again with ps_msg_encode_full (ps_msg_encode with
 * a body writer for STATUS_REPLY, whose "body" the plain encoder does not
 * carry), and the new frame is decoded. The round trip must be stable:
 *   - the frame's length prefix counts its payload, and "data", when
 *     present, starts at a frame offset that is a multiple of 4 (the "pad"
 *     promise), so decoding it moves nothing;
 *   - the second decode succeeds and gives the same type, presence bits,
 *     fields, layout, body and tensor bytes;
 *   - encoding the second message gives the same bytes again.
 * A failure there means encoder and decoder disagree about the wire. And
 * the strings the decoder copies into C strings (mode, cmd, tensor names)
 * must hold exactly the bytes on the wire, which the input unpacked again
 * with msgpack-c shows.
 *
 * Layouts are decoded into ps_layout storage that outlives the message and
 * is reused, as psd's scratch_layout; each decode has its own reused zone,
 * cleared first. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "proto/errors.h"
#include "proto/frame.h"
#include "proto/layout.h"
#include "proto/msg.h"
#include "proto/ps_limits.h"

static msgpack_zone zone1, zone2, zone3;
static ps_layout layout1, layout2;
static ps_buf enc1, enc2, body1, body2;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (!msgpack_zone_init(&zone1, 4096) || !msgpack_zone_init(&zone2, 4096) || !msgpack_zone_init(&zone3, 4096))
        abort();
    return 0;
}

/* ps_body_fn: writes the decoded status map back. */
static int pack_body(msgpack_packer *pk, void *arg)
{
    const ps_msg *m = arg;
    return msgpack_pack_object(pk, *m->body) == 0 ? 0 : PS_ENOMEM;
}

/* msgpack bytes of an object, for comparing two bodies. */
static void pack_object(ps_buf *b, const msgpack_object *o)
{
    msgpack_packer pk;
    b->len = 0;
    msgpack_packer_init(&pk, b, ps_buf_write);
    FUZZ_CHECK(msgpack_pack_object(&pk, *o) == 0, "cannot pack the body");
}

/* Encodes m as a whole frame into out, with its body if it has one. */
static void encode(const ps_msg *m, ps_buf *out)
{
    int rc;
    if (m->has & PS_F_BODY) {
        size_t dlen = 0;
        rc = ps_msg_encode(m, out, &dlen, pack_body, (void *)m);
        if (rc == 0 && dlen > 0) {
            FUZZ_CHECK(ps_buf_reserve(out, dlen) == 0, "out of memory");
            memcpy(out->p + out->len, ps_msg_data_bytes(m), dlen);
            out->len += dlen;
        }
    } else {
        rc = ps_msg_encode_full(m, out);
    }
    FUZZ_CHECK(rc == 0, "encoding a decoded %s failed: %d (%s)", ps_msg_type_name(m->type), rc, ps_errname(rc));
}

static int same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

#define SAME(field) FUZZ_CHECK(a->field == b->field, "field " #field " changed")
#define SAME_IF(bit, field) \
    if (a->has & (bit))     \
        SAME(field)

static void compare(const ps_msg *a, const ps_msg *b)
{
    SAME(type);
    FUZZ_CHECK(a->has == b->has, "presence bits %#llx became %#llx", (unsigned long long)a->has,
               (unsigned long long)b->has);
    SAME_IF(PS_F_ID, id);
    SAME_IF(PS_F_VERSION, proto);
    SAME_IF(PS_F_ROLE, role);
    if (a->has & PS_F_SHARD) {
        SAME(shard);
        SAME(nshards);
    }
    if (a->has & PS_F_LAYOUT)
        FUZZ_CHECK(ps_layout_equal(a->layout, b->layout) &&
                       ps_layout_fingerprint(a->layout) == ps_layout_fingerprint(b->layout),
                   "layout changed");
    SAME_IF(PS_F_FP, fp);
    if (a->has & PS_F_MODE)
        FUZZ_CHECK(strcmp(a->mode, b->mode) == 0, "mode \"%s\" became \"%s\"", a->mode, b->mode);
    SAME_IF(PS_F_MVER, mver);
    SAME_IF(PS_F_PARAMS, params);
    SAME_IF(PS_F_WORKERS, workers);
    SAME(need_init);
    SAME_IF(PS_F_OFF, off);
    SAME_IF(PS_F_LEN, len);
    SAME(fin);
    SAME_IF(PS_F_MIN, min);
    SAME_IF(PS_F_BASE, base);
    SAME_IF(PS_F_POFF, poff);
    SAME_IF(PS_F_PLEN, plen);
    SAME_IF(PS_F_CODE, code);
    if (a->has & PS_F_TEXT)
        FUZZ_CHECK(a->text_len == b->text_len && (a->text_len == 0 || memcmp(a->text, b->text, a->text_len) == 0),
                   "text changed");
    SAME_IF(PS_F_EPOCH, epoch);
    if (a->has & PS_F_LOSS)
        FUZZ_CHECK(same_double(a->loss, b->loss), "loss changed");
    if (a->has & PS_F_ACC)
        FUZZ_CHECK(same_double(a->acc, b->acc), "acc changed");
    if (a->has & PS_F_TLOSS)
        FUZZ_CHECK(same_double(a->tloss, b->tloss), "tloss changed");
    if (a->has & PS_F_RATE)
        FUZZ_CHECK(same_double(a->rate, b->rate), "rate changed");
    SAME_IF(PS_F_SAMPLES, samples);
    SAME_IF(PS_F_HB, hb);
    SAME_IF(PS_F_WIRE, wire);
    SAME(dt);
    SAME(rdt);
    if (a->has & PS_F_CMD)
        FUZZ_CHECK(strcmp(a->cmd, b->cmd) == 0, "cmd \"%s\" became \"%s\"", a->cmd, b->cmd);
    SAME(nargs);
    for (uint32_t i = 0; i < a->nargs; i++)
        FUZZ_CHECK(a->args[i].len == b->args[i].len &&
                       (a->args[i].len == 0 || memcmp(a->args[i].p, b->args[i].p, a->args[i].len) == 0),
                   "args[%u] changed", i);
    if (a->has & PS_F_NONCE)
        FUZZ_CHECK(memcmp(a->nonce, b->nonce, sizeof a->nonce) == 0, "nonce changed");
    if (a->has & PS_F_CNONCE)
        FUZZ_CHECK(memcmp(a->cnonce, b->cnonce, sizeof a->cnonce) == 0, "cnonce changed");
    if (a->has & PS_F_PROOF)
        FUZZ_CHECK(memcmp(a->proof, b->proof, sizeof a->proof) == 0, "proof changed");
    if (a->has & PS_F_SPROOF)
        FUZZ_CHECK(memcmp(a->sproof, b->sproof, sizeof a->sproof) == 0, "sproof changed");
    if (a->has & PS_F_BODY) {
        pack_object(&body1, a->body);
        pack_object(&body2, b->body);
        FUZZ_CHECK(body1.len == body2.len && memcmp(body1.p, body2.p, body1.len) == 0, "body changed");
    }
    if (a->has & PS_F_DATA)
        FUZZ_CHECK(a->ndata == b->ndata && a->nz == b->nz &&
                       (ps_msg_data_len(a) == 0 ||
                        memcmp(ps_msg_data_bytes(a), ps_msg_data_bytes(b), ps_msg_data_len(a)) == 0),
                   "data changed (%llu floats, then %llu)", (unsigned long long)a->ndata,
                   (unsigned long long)b->ndata);
}

static int same_str(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

/* The accepted input's C strings against its bytes, unpacked again. */
static void check_strings(const ps_msg *m, const uint8_t *data, size_t size)
{
    msgpack_object root;
    size_t off = 0;
    msgpack_zone_clear(&zone3);
    FUZZ_CHECK(msgpack_unpack((const char *)data, size, &off, &zone3, &root) == MSGPACK_UNPACK_SUCCESS &&
                   root.type == MSGPACK_OBJECT_MAP,
               "accepted input does not unpack to a map");
    for (uint32_t i = 0; i < root.via.map.size; i++) {
        const msgpack_object *k = &root.via.map.ptr[i].key, *v = &root.via.map.ptr[i].val;
        if (same_str(k, "mode"))
            FUZZ_CHECK(same_str(v, m->mode), "mode decoded as \"%s\" is other bytes on the wire", m->mode);
        else if (same_str(k, "cmd"))
            FUZZ_CHECK(same_str(v, m->cmd), "cmd decoded as \"%s\" is other bytes on the wire", m->cmd);
        else if (same_str(k, "layout") && m->layout) {
            FUZZ_CHECK(v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == m->layout->ntensors,
                       "layout of %u tensors", m->layout->ntensors);
            for (uint32_t j = 0; j < v->via.array.size; j++)
                FUZZ_CHECK(same_str(&v->via.array.ptr[j].via.array.ptr[0], m->layout->t[j].name),
                           "tensor name decoded as \"%s\" is other bytes on the wire", m->layout->t[j].name);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    /* exactly the input's bytes, on the heap: reads past them are caught */
    uint8_t *p1 = malloc(size);
    if (!p1)
        abort();
    memcpy(p1, data, size);

    ps_msg m1, m2;
    char err[256];
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    msgpack_zone_clear(&zone1);
    int rc = ps_msg_decode(p1, size, &lim, &zone1, &m1, &layout1, err, sizeof err);
    if (rc != 0) {
        fuzz_check_decode_error(rc, err, sizeof err);
        free(p1);
        return 0;
    }
    fuzz_check_msg(&m1, p1, size);
    check_strings(&m1, data, size);

    /* encode it again */
    encode(&m1, &enc1);
    uint32_t plen = 0;
    FUZZ_CHECK(enc1.len > PS_FRAME_HDR && ps_frame_header(enc1.p, enc1.len, PS_FRAME_MAX_HARD, &plen) == 1 &&
                   plen == enc1.len - PS_FRAME_HDR,
               "frame of %zu bytes with length prefix %u", enc1.len, plen);
    size_t data_at = 0; /* frame offset of the tensor bytes */
    if (m1.has & PS_F_DATA) {
        data_at = enc1.len - ps_msg_data_len(&m1);
        FUZZ_CHECK(data_at % PS_DATA_ALIGN == 0, "our encoder put data at frame offset %zu", data_at);
    }

    /* decode the new payload; its block starts 4-aligned like a frame read
     * into an aligned buffer would, so data must be decoded where it lies */
    uint8_t *p2 = malloc(plen);
    if (!p2)
        abort();
    memcpy(p2, enc1.p + PS_FRAME_HDR, plen);
    /* "pad" adds a key and a value that the input may not have had */
    ps_scan_limits lim2 = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX + 2};
    msgpack_zone_clear(&zone2);
    rc = ps_msg_decode(p2, plen, &lim2, &zone2, &m2, &layout2, err, sizeof err);
    FUZZ_CHECK(rc == 0, "our own encoding of a %s does not decode: %s (%s)", ps_msg_type_name(m1.type), err,
               ps_errname(rc));
    fuzz_check_msg(&m2, p2, plen);
    if ((m2.has & PS_F_DATA) && ps_msg_data_len(&m2) > 0)
        FUZZ_CHECK((const uint8_t *)ps_msg_data_bytes(&m2) == p2 + (data_at - PS_FRAME_HDR), "aligned data was moved");
    compare(&m1, &m2);

    /* and the same bytes once more */
    encode(&m2, &enc2);
    FUZZ_CHECK(enc1.len == enc2.len && memcmp(enc1.p, enc2.p, enc1.len) == 0,
               "encoding the decoded encoding gave other bytes");

    free(p2);
    free(p1);
    return 0;
}
