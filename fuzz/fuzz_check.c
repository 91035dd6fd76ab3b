/* fuzz_check.c - spec checks on decoded messages (see fuzz_check.h). */
#include "fuzz_check.h"

#include <math.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/layout.h"
#include "proto/ps_limits.h"

static volatile uint8_t sink;

void fuzz_touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++)
        x ^= b[i];
    sink ^= x;
}

void fuzz_check_decode_error(int rc, const char *err, size_t errlen)
{
    FUZZ_CHECK(rc == PS_EMALFORMED || rc == PS_EBAD_TYPE || rc == PS_EBAD_FIELD || rc == PS_EUNSUPPORTED,
               "unexpected code %d (%s)", rc, ps_errname(rc));
    FUZZ_CHECK(memchr(err, '\0', errlen) != NULL, "reason not NUL-terminated");
    FUZZ_CHECK(err[0] != '\0', "code %s without a reason", ps_errname(rc));
}

/* Fields each type must carry: proto/PROTOCOL.md section 5, as its one
 * declaration, proto/messages.def, says (the test integration_docs holds
 * the two to each other), read here from the file, not through msg.c. */
static uint64_t spec_required(uint32_t type)
{
    switch (type) {
#define PS_MSG(NAME, name, t, dir, required) case t: return required;
#include "proto/messages.def"
#undef PS_MSG
    default: return 0;
    }
}

/* The fingerprint as section 4.1 defines it, written again here. */
static uint64_t spec_fingerprint(const ps_layout *l)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    char text[PS_NAME_MAX + 1 + PS_DIMS_MAX * 11 + 2];
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        size_t n = (size_t)snprintf(text, sizeof text, "%s:", t->name);
        for (uint32_t d = 0; d < t->ndim; d++)
            n += (size_t)snprintf(text + n, sizeof text - n, d ? "x%u" : "%u", t->dims[d]);
        n += (size_t)snprintf(text + n, sizeof text - n, ";");
        for (size_t k = 0; k < n; k++) {
            h ^= (uint8_t)text[k];
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

static void check_layout(const ps_layout *l)
{
    FUZZ_CHECK(l->ntensors >= 1 && l->ntensors <= PS_TENSORS_MAX, "%u tensors", l->ntensors);
    uint64_t off = 0;
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        size_t n = strnlen(t->name, sizeof t->name);
        FUZZ_CHECK(n >= 1 && n <= PS_NAME_MAX, "tensor %u: name of %zu bytes", i, n);
        for (size_t k = 0; k < n; k++)
            FUZZ_CHECK(t->name[k] >= 0x21 && t->name[k] <= 0x7e, "tensor %u: name byte 0x%02x", i,
                       (unsigned)(uint8_t)t->name[k]);
        FUZZ_CHECK(t->ndim >= 1 && t->ndim <= PS_DIMS_MAX, "tensor %u: rank %u", i, t->ndim);
        uint64_t count = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->dims[d] >= 1, "tensor %u: dimension %u is 0", i, d);
            count *= t->dims[d]; /* <= 2^34 * 2^32 never happens: checked below per step */
            FUZZ_CHECK(count <= PS_PARAMS_MAX, "tensor %u: more than 2^34 values", i);
        }
        FUZZ_CHECK(t->count == count && t->offset == off, "tensor %u: count %llu offset %llu", i,
                   (unsigned long long)t->count, (unsigned long long)t->offset);
        off += count;
        FUZZ_CHECK(off <= PS_PARAMS_MAX, "layout of more than 2^34 values");
    }
    FUZZ_CHECK(l->total == off, "total %llu, tensors add up to %llu", (unsigned long long)l->total,
               (unsigned long long)off);
}

void fuzz_check_msg(const ps_msg *m, const uint8_t *payload, size_t len)
{
    FUZZ_CHECK(m->type >= 1 && m->type <= PS_MSG_TYPE_MAX, "type %u", m->type);
    FUZZ_CHECK((m->has >> PS_F_COUNT) == 0, "undefined presence bit");
    uint64_t need = spec_required(m->type);
    if (m->type == PS_MSG_TPULL)
        need &= ~(uint64_t)PS_F_KEYS; /* section 13.2: "keys", or "len" for rows by position (below) */
    if ((m->type == PS_MSG_PUSHPULL || m->type == PS_MSG_PARAMS || m->type == PS_MSG_ROWS) && m->inshm) {
        /* section 6.1, 13.9: the tensor in the shared segment, "len" for "data" */
        FUZZ_CHECK(!(m->has & PS_F_DATA), "data and inshm together");
        need = (need & ~(uint64_t)PS_F_DATA) | PS_F_LEN;
    }
    int seg = (m->has & PS_F_SEG) &&
              (m->type == PS_MSG_TPULL || m->type == PS_MSG_TPUSH || m->type == PS_MSG_TPUSHPULL);
    if (seg) {
        /* section 13.9: keys and rows in the table segment, nothing of them
         * in the frame; offsets multiples of 8 below 2^26; 1..65536 keys,
         * and keys to pull in a tpushpull only */
        need &= ~(uint64_t)(PS_F_KEYS | PS_F_PKEYS | PS_F_DATA);
        FUZZ_CHECK(!(m->has & (PS_F_KEYS | PS_F_PKEYS | PS_F_DATA | PS_F_LEN | PS_F_OFF | PS_F_DT | PS_F_RDT)),
                   "seg beside keys or rows in the frame");
        FUZZ_CHECK(m->seg.at % 8 == 0 && m->seg.at < PS_TSEG_MAX && m->seg.rat % 8 == 0 && m->seg.rat < PS_TSEG_MAX,
                   "seg offsets %llu, %llu", (unsigned long long)m->seg.at, (unsigned long long)m->seg.rat);
        FUZZ_CHECK(m->seg.n >= 1 && m->seg.n <= PS_TABLE_KEYS_MAX && m->seg.m <= PS_TABLE_KEYS_MAX &&
                       (m->seg.m != 0) == (m->type == PS_MSG_TPUSHPULL),
                   "seg of %u and %u keys in a %s", m->seg.n, m->seg.m, ps_msg_type_name(m->type));
    }
    FUZZ_CHECK((m->has & need) == need, "%s without required fields (has %#llx, needs %#llx)",
               ps_msg_type_name(m->type), (unsigned long long)m->has, (unsigned long long)need);
    if (m->type == PS_MSG_HELLO && m->role == PS_ROLE_WORKER)
        FUZZ_CHECK((m->has & (PS_F_SHARD | PS_F_LAYOUT)) == (PS_F_SHARD | PS_F_LAYOUT),
                   "worker hello without shard and layout");

    /* absent fields keep their defaults */
    if (!(m->has & PS_F_ID))
        FUZZ_CHECK(m->id == 0, "id without the field");
    if (!(m->has & PS_F_FIN))
        FUZZ_CHECK(m->fin == 1, "fin defaults to true");
    if (!(m->has & PS_F_DATA))
        FUZZ_CHECK(m->data == NULL && m->data16 == NULL && m->packed == NULL && m->ndata == 0,
                   "data without the field");
    FUZZ_CHECK(m->dt <= PS_DT_MAX && m->rdt <= PS_DT_MAX, "element types %u, %u", m->dt, m->rdt);
    if (!(m->has & PS_F_DT))
        FUZZ_CHECK(m->dt == PS_DT_F32, "dt %u without the field", m->dt);
    FUZZ_CHECK(m->fin == 0 || m->fin == 1, "fin %d", m->fin);
    FUZZ_CHECK(m->need_init == 0 || m->need_init == 1, "init %d", m->need_init);

    if (m->has & PS_F_ROLE)
        FUZZ_CHECK(m->role == PS_ROLE_WORKER || m->role == PS_ROLE_ADMIN, "role %u", m->role);
    if (m->has & PS_F_SHARD)
        FUZZ_CHECK(m->nshards >= 1 && m->nshards <= 65536 && m->shard < m->nshards, "shard [%u, %u]", m->shard,
                   m->nshards);
    if (m->has & PS_F_LAYOUT) {
        FUZZ_CHECK(m->layout != NULL, "layout bit without a layout");
        check_layout(m->layout);
        if (m->has & PS_F_FP)
            FUZZ_CHECK(m->fp == spec_fingerprint(m->layout), "fingerprint %#llx does not match the layout",
                       (unsigned long long)m->fp);
    }
    if (m->has & PS_F_MODE) {
        size_t n = strnlen(m->mode, sizeof m->mode);
        FUZZ_CHECK(n >= 1 && n <= 15, "mode of %zu bytes", n);
    }
    if (m->has & PS_F_CMD) {
        size_t n = strnlen(m->cmd, sizeof m->cmd);
        FUZZ_CHECK(n >= 1 && n <= PS_CMD_MAX, "cmd of %zu bytes", n);
    }
    if (m->has & PS_F_ARGS) {
        FUZZ_CHECK(m->nargs <= PS_ARGS_MAX, "%u args", m->nargs);
        for (uint32_t i = 0; i < m->nargs; i++) {
            FUZZ_CHECK(m->args[i].len <= PS_ARG_MAX, "args[%u] of %u bytes", i, m->args[i].len);
            fuzz_touch(m->args[i].p, m->args[i].len);
        }
    } else {
        FUZZ_CHECK(m->nargs == 0, "args without the field");
    }
    if (m->has & PS_F_TEXT)
        fuzz_touch(m->text, m->text_len);
    /* tables (section 13): keys inside the payload, 1..65536 of them; hp
     * names only known, finite values; rows float32 and within the limit */
    const ps_keys *ks[2] = {(m->has & PS_F_KEYS) ? &m->keys : NULL, (m->has & PS_F_PKEYS) ? &m->pkeys : NULL};
    for (int i = 0; i < 2; i++) {
        if (!ks[i])
            continue;
        FUZZ_CHECK(ks[i]->n >= 1 && ks[i]->n <= PS_TABLE_KEYS_MAX, "%u keys", ks[i]->n);
        FUZZ_CHECK(ks[i]->p >= payload && ks[i]->p + (size_t)ks[i]->n * 8 <= payload + len,
                   "keys are not inside the payload");
        fuzz_touch(ks[i]->p, (size_t)ks[i]->n * 8);
    }
    if (!(m->has & PS_F_KEYS))
        FUZZ_CHECK(m->keys.n == 0 && m->keys.p == NULL, "keys without the field");
    if (m->has & PS_F_HP) {
        FUZZ_CHECK((m->hp.has >> PS_HP_COUNT) == 0, "hp bits %#x", m->hp.has);
        for (int i = 0; i < PS_HP_COUNT; i++)
            if (m->hp.has & (1u << i))
                FUZZ_CHECK(isfinite(m->hp.v[i]), "hp %d not finite", i);
    }
    if (m->has & PS_F_TAB) {
        size_t n = strnlen(m->tab, sizeof m->tab);
        FUZZ_CHECK(n >= 1 && n <= PS_NAME_MAX, "tab of %zu bytes", n);
    }
    if (m->type == PS_MSG_TPULL && !seg)
        FUZZ_CHECK(!(m->has & PS_F_KEYS) != !(m->has & PS_F_LEN), "tpull with keys and len, or neither");
    if (ps_msg_is_table(m->type)) {
        /* PROTOCOL.md 13.2: row gradients of a tpush or tpushpull (and rows
         * of a ROWS answer) in any form but rows never as f32z; rows pulled
         * by key asked for as f32, bf16 or zstd; everything else f32 */
        int pushes = m->type == PS_MSG_TPUSH || m->type == PS_MSG_TPUSHPULL ||
                     (m->type == PS_MSG_ROWS && m->dt != PS_DT_F32Z);
        int pulls = (m->type == PS_MSG_TPULL && (m->has & PS_F_KEYS)) || m->type == PS_MSG_TPUSHPULL;
        FUZZ_CHECK((m->dt == PS_DT_F32 || pushes) && (m->rdt == PS_DT_F32 || (pulls && m->rdt != PS_DT_F32Z)),
                   "table message %u with dt %u rdt %u", m->type, m->dt, m->rdt);
        FUZZ_CHECK(m->ndata <= PS_TABLE_VALUES_MAX, "table message with %llu values",
                   (unsigned long long)m->ndata);
    }
    if (m->has & PS_F_BODY)
        FUZZ_CHECK(m->body != NULL && m->body->type == MSGPACK_OBJECT_MAP, "body is not a map");
    if (m->has & PS_F_DATA) {
        /* section 3: aligned, in place (inside the frame), ndata elements
         * of dt's size (f32z: the bitmap and its values), through the
         * pointer of dt's type only */
        uint64_t dl = ps_msg_data_len(m);
        const uint8_t *d = ps_msg_data_bytes(m);
        FUZZ_CHECK((m->dt == PS_DT_F32 || m->data == NULL) && (m->dt == PS_DT_BF16 || m->data16 == NULL) &&
                       ps_dtype_packed(m->dt) == (m->packed != NULL),
                   "data through the wrong pointer");
        FUZZ_CHECK(dl <= len, "%llu data bytes in a %zu-byte payload", (unsigned long long)dl, len);
        if (m->dt == PS_DT_F32Z) {
            /* the decoder counted the bitmap: as many bits set as values
             * follow, none past ndata */
            uint64_t set = 0, past = 0;
            for (uint64_t i = 0; i < ps_f32z_mask_bytes(m->ndata) * 8; i++) {
                unsigned bit = (m->packed[i / 8] >> (i % 8)) & 1u;
                set += bit;
                past += i >= m->ndata ? bit : 0;
            }
            FUZZ_CHECK(set == m->nz && past == 0 && m->nz <= m->ndata, "f32z: %llu bits set (%llu past %llu) for %llu values",
                       (unsigned long long)set, (unsigned long long)past, (unsigned long long)m->ndata,
                       (unsigned long long)m->nz);
        }
        if (dl > 0) {
            FUZZ_CHECK((uintptr_t)d % PS_DATA_ALIGN == 0, "data at %p is not aligned", (const void *)d);
            FUZZ_CHECK(d >= payload && d + dl <= payload + len, "data is not inside the payload");
            fuzz_touch(d, dl);
        }
    }
    (void)ps_msg_type_name(m->type);
}
