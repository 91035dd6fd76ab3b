/* msg_decode.c - a frame's payload into a ps_msg (msg.h: ps_msg_decode),
 * checking every field and the fields each type requires, and a layout
 * from the wire (ps_layout_unpack). Driven by the field table
 * (msg_fields.h). Tensors point into the frame. */
#include "msg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "msg_fields.h"

/* ---- decoding --------------------------------------------------------- */

static int get_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    *v = o->via.u64;
    return 0;
}

static int get_f64(const msgpack_object *o, double *v)
{
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *v = o->via.f64;
        return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *v = (double)o->via.u64;
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *v = (double)o->via.i64;
        return 0;
    default:
        return -1;
    }
}

static int get_bool(const msgpack_object *o, int *v)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return -1;
    *v = o->via.boolean ? 1 : 0;
    return 0;
}

static int key_is(const msgpack_object_kv *kv, const char *k)
{
    size_t n = strlen(k);
    return kv->key.via.str.size == n && memcmp(kv->key.via.str.ptr, k, n) == 0;
}


int ps_layout_unpack(const msgpack_object *o, ps_layout *l, char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 || o->via.array.size > PS_TENSORS_MAX)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "layout: expected an array of 1..%d tensors", PS_TENSORS_MAX);
    ps_layout_init(l);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *t = &o->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size < 2 || t->via.array.size > 4 ||
            t->via.array.ptr[0].type != MSGPACK_OBJECT_STR || t->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: expected [name, [dims...]] or, for a buffer, "
                                                    "[name, [dims...], rule] or [name, [dims...], rule, dtype]", i);
        const msgpack_object_str *name = &t->via.array.ptr[0].via.str;
        const msgpack_object_array *dims = &t->via.array.ptr[1].via.array;
        char nbuf[PS_NAME_MAX + 1];
        uint32_t d[PS_DIMS_MAX];
        if (name->size == 0 || name->size > PS_NAME_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: name must have 1..%d bytes", i, PS_NAME_MAX);
        /* a NUL would cut the name short in nbuf: "w\0x" must not pass as "w" */
        if (memchr(name->ptr, '\0', name->size))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: name contains a NUL byte", i);
        if (dims->size == 0 || dims->size > PS_DIMS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: rank must be 1..%d", i, PS_DIMS_MAX);
        memcpy(nbuf, name->ptr, name->size);
        nbuf[name->size] = '\0';
        for (uint32_t j = 0; j < dims->size; j++) {
            uint64_t v;
            if (get_u64(&dims->ptr[j], &v) != 0 || v == 0 || v > UINT32_MAX)
                return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u] (%s): dimension %u is not a positive integer",
                            i, nbuf, j);
            d[j] = (uint32_t)v;
        }
        if (ps_layout_add(l, nbuf, dims->size, d) != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD,
                        "layout[%u] (%s): invalid name (printable ASCII, no spaces) or too many parameters", i,
                        nbuf);
        if (t->via.array.size > 2) {
            const msgpack_object *r = &t->via.array.ptr[2], *dt = t->via.array.size > 3 ? &t->via.array.ptr[3] : NULL;
            int rule = r->type == MSGPACK_OBJECT_STR ? ps_buf_parse(r->via.str.ptr, r->via.str.size) : -1;
            int sdt = !dt ? PS_SAVE_F32 : dt->type == MSGPACK_OBJECT_STR ? ps_save_dt_parse(dt->via.str.ptr, dt->via.str.size) : -1;
            if (rule < 0)
                return ps_fail(err, errlen, PS_EBAD_FIELD, "layout[%u] (%s): a buffer's rule is \"mean\" or \"first\"",
                            i, nbuf);
            if (sdt < 0)
                return ps_fail(err, errlen, PS_EBAD_FIELD,
                            "layout[%u] (%s): a buffer's dtype is \"F32\", \"F64\", \"I64\" or \"I32\"", i, nbuf);
            ps_layout_set_buffer(l, (unsigned)rule, (unsigned)sdt);
        }
    }
    return 0;
}

/* Decodes kv's value as field f into m. Returns 0 or a code with err. */
static int decode_field(const field *f, const msgpack_object_kv *kv, ps_msg *m, ps_layout *layout_out,
                        const msgpack_object **bin, const char *tname, char *err, size_t errlen)
{
    const msgpack_object *o = &kv->val;
    switch (f->kind) {
    case FK_U64: {
        uint64_t v;
        if (get_u64(o, &v) != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a non-negative integer", tname, f->key);
        *AT(m, f, uint64_t) = v;
        return 0;
    }
    case FK_U32: {
        uint64_t v;
        if (get_u64(o, &v) != 0 || v > UINT32_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be an integer 0..2^32-1", tname, f->key);
        *AT(m, f, uint32_t) = (uint32_t)v;
        return 0;
    }
    case FK_DTYPE: {
        uint64_t v;
        if (get_u64(o, &v) != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a non-negative integer", tname, f->key);
        if (v > PS_DT_MAX)
            return ps_fail(err, errlen, PS_EUNSUPPORTED, "%s: unknown tensor element type %llu in '%s' "
                                                      "(0 float32, 1 bfloat16, 2 float32 without zeros, 3 zstd)",
                        tname, (unsigned long long)v, f->key);
        *AT(m, f, uint32_t) = (uint32_t)v;
        return 0;
    }
    case FK_F64:
        if (get_f64(o, AT(m, f, double)) != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a number", tname, f->key);
        return 0;
    case FK_BOOL:
        if (get_bool(o, AT(m, f, int)) != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a boolean", tname, f->key);
        return 0;
    case FK_NAME:
        if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size >= f->size ||
            memchr(o->via.str.ptr, '\0', o->via.str.size))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s", tname, f->bad);
        memcpy(AT(m, f, char), o->via.str.ptr, o->via.str.size);
        AT(m, f, char)[o->via.str.size] = '\0';
        return 0;
    case FK_BIN:
        /* authentication: bins of exactly 32 bytes, copied out of the frame */
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != f->size)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a bin of %zu bytes", tname, f->key,
                        f->size);
        memcpy(AT(m, f, uint8_t), o->via.bin.ptr, f->size);
        return 0;
    case FK_ROLE:
        if (o->type == MSGPACK_OBJECT_STR && o->via.str.size == 6 && !memcmp(o->via.str.ptr, "worker", 6))
            m->role = PS_ROLE_WORKER;
        else if (o->type == MSGPACK_OBJECT_STR && o->via.str.size == 5 && !memcmp(o->via.str.ptr, "admin", 5))
            m->role = PS_ROLE_ADMIN;
        else
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: role must be \"worker\" or \"admin\"", tname);
        return 0;
    case FK_CODE:
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
            m->code = (int32_t)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            m->code = (int32_t)o->via.i64;
        else
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: code must be a 32-bit integer", tname);
        return 0;
    case FK_TEXT:
        if (o->type != MSGPACK_OBJECT_STR)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: text must be a string", tname);
        m->text = o->via.str.ptr;
        m->text_len = o->via.str.size;
        return 0;
    case FK_SHARD: {
        uint64_t k, n;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || get_u64(&o->via.array.ptr[0], &k) ||
            get_u64(&o->via.array.ptr[1], &n) || n == 0 || n > 65536 || k >= n)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: shard must be [k, m] with 0 <= k < m <= 65536", tname);
        m->shard = (uint32_t)k;
        m->nshards = (uint32_t)n;
        return 0;
    }
    case FK_PART: {
        uint64_t i, n;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || get_u64(&o->via.array.ptr[0], &i) ||
            get_u64(&o->via.array.ptr[1], &n) || n == 0 || n > PS_PARTS_MAX || i >= n)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: part must be [i, n] with 0 <= i < n <= %u", tname,
                           PS_PARTS_MAX);
        m->part = (uint32_t)i;
        m->nparts = (uint32_t)n;
        return 0;
    }
    case FK_LAYOUT: {
        if (!layout_out)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: unexpected field 'layout'", tname);
        int rc = ps_layout_unpack(o, layout_out, err, errlen);
        if (rc != 0)
            return rc;
        m->layout = layout_out;
        return 0;
    }
    case FK_SHM: {
        uint64_t pid, fd, goff = 0, poff = 0;
        uint32_t n = o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size : 0;
        if ((n != 2 && n != 4) || get_u64(&o->via.array.ptr[0], &pid) || get_u64(&o->via.array.ptr[1], &fd) ||
            pid == 0 || pid > INT32_MAX || fd > INT32_MAX ||
            (n == 4 && (get_u64(&o->via.array.ptr[2], &goff) || get_u64(&o->via.array.ptr[3], &poff) ||
                        goff > 2 * PS_PARAMS_MAX || poff > 2 * PS_PARAMS_MAX)))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: shm must be [pid, fd] or [pid, fd, goff, poff] with "
                                                    "0 < pid < 2^31, fd < 2^31 and offsets of at most 2^35",
                        tname);
        m->shm_pid = (uint32_t)pid;
        m->shm_fd = (uint32_t)fd;
        m->shm_at = n == 4;
        m->shm_goff = goff;
        m->shm_poff = poff;
        return 0;
    }
    case FK_PIDFD: {
        uint64_t pid, fd;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || get_u64(&o->via.array.ptr[0], &pid) ||
            get_u64(&o->via.array.ptr[1], &fd) || pid == 0 || pid > INT32_MAX || fd > INT32_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s must be [pid, fd] with 0 < pid < 2^31 and fd < 2^31",
                           tname, f->key);
        *AT(m, f, ps_pidfd) = (ps_pidfd){(uint32_t)pid, (uint32_t)fd};
        return 0;
    }
    case FK_SEG: {
        uint64_t v[4];
        int ok = o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4;
        for (uint32_t j = 0; ok && j < 4; j++)
            ok = get_u64(&o->via.array.ptr[j], &v[j]) == 0;
        if (!ok || v[0] >= PS_TSEG_MAX || v[0] % 8 || v[3] >= PS_TSEG_MAX || v[3] % 8 || v[1] == 0 ||
            v[1] > PS_TABLE_KEYS_MAX || v[2] > PS_TABLE_KEYS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: seg must be [at, n, m, rat]: byte offsets at and rat "
                                                       "multiples of 8 below 2^26, 1 <= n <= %d keys, m <= %d",
                           tname, PS_TABLE_KEYS_MAX, PS_TABLE_KEYS_MAX);
        *AT(m, f, ps_seg) = (ps_seg){.at = v[0], .n = (uint32_t)v[1], .m = (uint32_t)v[2], .rat = v[3]};
        return 0;
    }
    case FK_PLAN: {
        uint64_t v[4];
        int ok = o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4;
        for (uint32_t j = 0; ok && j < 4; j++)
            ok = get_u64(&o->via.array.ptr[j], &v[j]) == 0;
        if (!ok || v[0] == 0 || v[0] > PS_PLAN_EPOCHS_MAX || v[1] == 0 || v[1] > PS_PLAN_SAMPLES_MAX || v[2] == 0 ||
            v[2] > v[1])
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: plan must be [epochs, samples, batch, seed] with 1 <= epochs "
                                                    "<= 2^20, 1 <= samples <= 2^40 and 1 <= batch <= samples",
                        tname);
        m->plan = (ps_plan){.epochs = v[0], .samples = v[1], .batch = v[2], .seed = v[3]};
        return 0;
    }
    case FK_SLICE: {
        uint64_t v[5];
        int ok = o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 5;
        for (uint32_t j = 0; ok && j < 5; j++)
            ok = get_u64(&o->via.array.ptr[j], &v[j]) == 0;
        if (!ok || v[1] > v[2] || v[2] > PS_PLAN_SAMPLES_MAX || v[4] == 0 || v[4] > 65536 || v[3] >= v[4])
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: slice must be [epoch, lo, hi, rank, count] with lo <= hi <= "
                                                    "2^40 and rank < count <= 65536",
                        tname);
        m->slice = (ps_slice){.epoch = v[0], .lo = v[1], .hi = v[2], .rank = (uint32_t)v[3], .count = (uint32_t)v[4]};
        return 0;
    }
    case FK_ADDR:
        if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > PS_ADDR_MAX ||
            memchr(o->via.str.ptr, '\0', o->via.str.size))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s must be a \"HOST:PORT\" string of 1..%d bytes", tname,
                           f->key, PS_ADDR_MAX);
        AT(m, f, ps_str)->p = o->via.str.ptr;
        AT(m, f, ps_str)->len = o->via.str.size;
        return 0;
    case FK_PMAP: {
        const char *shape = "must be [epoch, dense, [\"HOST:PORT\", ...]] with 1 <= dense <= the number of "
                            "addresses <= 64, each address 1..255 bytes";
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 ||
            o->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            o->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
            o->via.array.ptr[2].type != MSGPACK_OBJECT_ARRAY)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s %s", tname, f->key, shape);
        const msgpack_object *as = &o->via.array.ptr[2];
        uint64_t dense = o->via.array.ptr[1].via.u64;
        if (as->via.array.size == 0 || as->via.array.size > PS_PARTS_MAX || dense == 0 || dense > as->via.array.size)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s %s", tname, f->key, shape);
        for (uint32_t j = 0; j < as->via.array.size; j++) {
            const msgpack_object *a = &as->via.array.ptr[j];
            if (a->type != MSGPACK_OBJECT_STR || a->via.str.size == 0 || a->via.str.size > PS_ADDR_MAX ||
                memchr(a->via.str.ptr, '\0', a->via.str.size))
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s %s", tname, f->key, shape);
            m->pmap.addrs[j].p = a->via.str.ptr;
            m->pmap.addrs[j].len = a->via.str.size;
        }
        m->pmap.epoch = o->via.array.ptr[0].via.u64;
        m->pmap.dense = (uint32_t)dense;
        m->pmap.n = as->via.array.size;
        return 0;
    }
    case FK_ADDRS:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 || o->via.array.size > PS_REPLICAS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s must be an array of 1..%d addresses", tname, f->key,
                           PS_REPLICAS_MAX);
        for (uint32_t j = 0; j < o->via.array.size; j++) {
            const msgpack_object *a = &o->via.array.ptr[j];
            if (a->type != MSGPACK_OBJECT_STR || a->via.str.size == 0 || a->via.str.size > PS_ADDR_MAX ||
                memchr(a->via.str.ptr, '\0', a->via.str.size))
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %s[%u] must be a \"HOST:PORT\" string of 1..%d bytes",
                               tname, f->key, j, PS_ADDR_MAX);
            m->replicas[j].p = a->via.str.ptr;
            m->replicas[j].len = a->via.str.size;
        }
        m->nreplicas = o->via.array.size;
        return 0;
    case FK_ARGS:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > PS_ARGS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: args must be an array of at most %d strings", tname,
                        PS_ARGS_MAX);
        for (uint32_t j = 0; j < o->via.array.size; j++) {
            const msgpack_object *a = &o->via.array.ptr[j];
            if (a->type != MSGPACK_OBJECT_STR || a->via.str.size > PS_ARG_MAX)
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: args[%u] must be a string of at most %d bytes", tname,
                            j, PS_ARG_MAX);
            m->args[j].p = a->via.str.ptr;
            m->args[j].len = a->via.str.size;
        }
        m->nargs = o->via.array.size;
        return 0;
    case FK_BODY:
        if (o->type != MSGPACK_OBJECT_MAP)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: body must be a map", tname);
        m->body = o;
        return 0;
    case FK_KEYS: {
        uint32_t n = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.size : 0;
        if (o->type != MSGPACK_OBJECT_BIN || n == 0 || n % 8 != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: '%s' must be a bin of 1..%d little-endian uint64 keys "
                                                    "(8 bytes each), not %s%u bytes",
                        tname, f->key, PS_TABLE_KEYS_MAX, o->type == MSGPACK_OBJECT_BIN ? "" : "a non-bin of ",
                        n);
        if (n / 8 > PS_TABLE_KEYS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: '%s' holds %u keys, more than %d in one message; send "
                                                    "them in several",
                        tname, f->key, n / 8, PS_TABLE_KEYS_MAX);
        *AT(m, f, ps_keys) = (ps_keys){.p = (const uint8_t *)o->via.bin.ptr, .n = n / 8};
        return 0;
    }
    case FK_HP: {
        ps_hp *hp = AT(m, f, ps_hp);
        if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > PS_HP_COUNT)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: hp must be a map of at most %d hyper-parameters", tname,
                        PS_HP_COUNT);
        hp->has = 0;
        for (uint32_t j = 0; j < o->via.map.size; j++) {
            const msgpack_object_kv *e = &o->via.map.ptr[j];
            int id = e->key.type == MSGPACK_OBJECT_STR ? ps_hp_lookup(e->key.via.str.ptr, e->key.via.str.size) : -1;
            if (id < 0)
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: hp[%u]: unknown hyper-parameter (lr, eps, beta1, "
                                                        "beta2, iacc, beta, l1 or l2)",
                            tname, j);
            if (hp->has & (1u << id))
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: hp '%s' appears twice", tname, ps_hp_name((uint32_t)id));
            double v;
            if (get_f64(&e->val, &v) != 0 || !isfinite(v))
                return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: hp '%s' must be a finite number", tname,
                            ps_hp_name((uint32_t)id));
            hp->v[id] = v;
            hp->has |= 1u << id;
        }
        return 0;
    }
    case FK_DATA:
        /* checked and aligned by the caller, once "dt" (anywhere in the
         * map) has told the element size */
        if (o->type != MSGPACK_OBJECT_BIN)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: data must be bin (little-endian float32, bfloat16 or "
                                                    "zero-bitmap bytes)",
                        tname);
        *bin = o;
        return 0;
    }
    return 0;
}

/* "data" of dt PS_DT_F32Z (src, size bytes, aligned): "len" values, as a
 * bitmap of ps_f32z_mask_bytes(len) bytes whose bits past len are 0, then
 * one float32 for each bit set. The bitmap is counted here, once, so that
 * whoever expands it may trust it. */
static int check_f32z(ps_msg *m, const uint8_t *src, size_t size, const char *tname, char *err, size_t errlen)
{
    if (!(m->has & PS_F_LEN))
        return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: data without zeros (dt 2) needs 'len', the values it covers",
                    tname);
    uint64_t n = m->len, mb = ps_f32z_mask_bytes(n);
    if (n > PS_FRAME_MAX_HARD * 8ull || size < mb || (size - mb) % 4 != 0)
        return ps_fail(err, errlen, PS_EBAD_FIELD,
                    "%s: data without zeros has %zu bytes: not a bitmap of %llu bytes (len %llu) and whole float32 "
                    "values",
                    tname, size, (unsigned long long)(n > PS_FRAME_MAX_HARD * 8ull ? 0 : mb), (unsigned long long)n);
    /* bits past n: the rest of byte n / 8, then whole bytes */
    int tail = (n % 8 != 0 && (src[n / 8] >> (n % 8)) != 0);
    for (uint64_t i = (n + 7) / 8; i < mb && !tail; i++)
        tail = src[i] != 0;
    if (tail)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: data without zeros: bitmap bits past len %llu are set", tname,
                    (unsigned long long)n);
    uint64_t set = 0; /* a popcount does not care about byte order */
    for (uint64_t i = 0; i < mb; i += 4) {
        uint32_t w;
        memcpy(&w, src + i, 4);
        set += (uint64_t)__builtin_popcount(w);
    }
    uint64_t nz = (size - mb) / 4;
    if (set != nz)
        return ps_fail(err, errlen, PS_EBAD_FIELD,
                    "%s: data without zeros: its bitmap marks %llu values but %llu follow", tname,
                    (unsigned long long)set, (unsigned long long)nz);
    m->packed = src;
    m->packed_len = size;
    m->nz = nz;
    m->ndata = n;
    return 0;
}

int ps_msg_decode(uint8_t *payload, size_t len, const ps_scan_limits *lim, msgpack_zone *zone, ps_msg *m,
                  ps_layout *layout_out, char *err, size_t errlen)
{
    msgpack_object root;
    size_t off = 0;
    ps_msg_init(m, 0); /* defined (has == 0) even when decoding fails early */
    int rc = ps_scan(payload, len, lim, err, errlen);
    if (rc != 0)
        return rc;
    if (msgpack_unpack((const char *)payload, len, &off, zone, &root) != MSGPACK_UNPACK_SUCCESS || off != len)
        return ps_fail(err, errlen, PS_EMALFORMED, "msgpack unpack failed");
    if (root.type != MSGPACK_OBJECT_MAP)
        return ps_fail(err, errlen, PS_EMALFORMED, "message is not a map");

    const msgpack_object_map *map = &root.via.map;
    const msgpack_object *t = NULL;
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == 1 && kv->key.via.str.ptr[0] == 't')
            t = &kv->val;
    }
    uint64_t type;
    if (!t || get_u64(t, &type) != 0)
        return ps_fail(err, errlen, PS_EMALFORMED, "message has no integer type field 't'");
    if (type == 0 || type > PS_MSG_TYPE_MAX)
        return ps_fail(err, errlen, PS_EBAD_TYPE, "unknown message type %llu", (unsigned long long)type);
    m->type = (uint32_t)type;
    const char *tname = ps_msg_type_name(m->type);
    const msgpack_object *bin = NULL; /* "data" */

    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        uint64_t bit_ = 0;
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return ps_fail(err, errlen, PS_EMALFORMED, "%s: map keys must be strings", tname);
        if (key_is(kv, "t") || key_is(kv, "pad")) {
            continue;
        }
        const field *f = NULL;
        for (size_t j = 0; j < NFIELDS && !f; j++)
            if (key_is(kv, ps_msg_fields[j].key))
                f = &ps_msg_fields[j];
        if (!f)
            continue; /* unknown keys are ignored, for forward compatibility */
        rc = decode_field(f, kv, m, layout_out, &bin, tname, err, errlen);
        if (rc != 0)
            return rc;
        bit_ = f->bit;
        if (HAS_FIELD(m, f))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' appears twice", tname, f->key);
        if (f->word)
            m->has2 |= bit_;
        else
            m->has |= bit_;
    }

    if (bin) {
        size_t esize = ps_dtype_size(m->dt);
        if (!ps_dtype_packed(m->dt) && bin->via.bin.size % esize != 0)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: data has %u bytes, not a multiple of %zu (%s)", tname,
                        bin->via.bin.size, esize, ps_dtype_name(m->dt));
        uint8_t *src = (uint8_t *)(uintptr_t)bin->via.bin.ptr;
        size_t mis = (uintptr_t)src % PS_DATA_ALIGN;
        if (mis != 0) {
            /* src - mis lies inside this bin's header and the key "data",
             * which are already parsed and referenced by nothing else. */
            memmove(src - mis, src, bin->via.bin.size);
            src -= mis;
        }
        if (m->dt == PS_DT_F32Z) {
            rc = check_f32z(m, src, bin->via.bin.size, tname, err, errlen);
            if (rc != 0)
                return rc;
        } else if (m->dt == PS_DT_F32ZSTD) {
            /* the frame is psd's to check as it decompresses it (handle.c);
             * here only that it says how many values it holds */
            if (!(m->has & PS_F_LEN))
                return ps_fail(err, errlen, PS_EBAD_FIELD,
                            "%s: compressed data (dt 3) needs 'len', the values it holds", tname);
            m->packed = src;
            m->packed_len = bin->via.bin.size;
            m->ndata = m->len;
        } else if (m->dt == PS_DT_BF16) {
            m->data16 = (const uint16_t *)(const void *)src;
        } else {
            m->data = (const float *)(const void *)src;
        }
        if (!ps_dtype_packed(m->dt))
            m->ndata = bin->via.bin.size / esize;
    } else if ((m->has & PS_F_DT) && ps_dtype_packed(m->dt)) {
        return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: 'dt' %u (%s) needs 'data'", tname, m->dt,
                    ps_dtype_name(m->dt));
    }

    if (((m->has2 & PS_F2_CID) && m->cid == 0) || ((m->has2 & PS_F2_PID) && m->pid == 0))
        return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: '%s' must not be 0", tname,
                       (m->has2 & PS_F2_CID) && m->cid == 0 ? "cid" : "pid");
    uint64_t need = ps_msg_required(m->type);
    if (m->type == PS_MSG_TPULL)
        need &= ~PS_F_KEYS; /* "keys", or "len" for rows by position: checked below */
    if ((m->type == PS_MSG_PUSHPULL || m->type == PS_MSG_PARAMS || m->type == PS_MSG_ROWS) && m->inshm) {
        /* the tensor is in the shared segment: "len" says how long */
        if (m->has & PS_F_DATA)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: 'data' and 'inshm' together", tname);
        need = (need & ~PS_F_DATA) | PS_F_LEN;
    }
    if ((m->has & PS_F_SEG) &&
        (m->type == PS_MSG_TPULL || m->type == PS_MSG_TPUSH || m->type == PS_MSG_TPUSHPULL)) {
        /* a table request in the table segment (PROTOCOL.md 13.9): its
         * keys and rows are there, in float32 */
        const uint64_t inseg = PS_F_KEYS | PS_F_PKEYS | PS_F_DATA | PS_F_LEN | PS_F_OFF | PS_F_DT | PS_F_RDT;
        if (m->has & inseg)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: 'seg' and '%s' together: the keys and rows are in the "
                                                       "segment, in float32", tname,
                           ps_msg_field_name((m->has & inseg) & -(m->has & inseg)));
        if ((m->seg.m != 0) != (m->type == PS_MSG_TPUSHPULL))
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: seg's m (keys pulled after the push) must be %s", tname,
                           m->type == PS_MSG_TPUSHPULL ? "1..65536 in a tpushpull" : "0 outside a tpushpull");
        need &= ~(PS_F_KEYS | PS_F_PKEYS | PS_F_DATA);
    }
    if ((m->has & need) != need) {
        uint64_t missing = need & ~m->has;
        return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: missing field '%s'", tname, ps_msg_field_name(missing & -missing));
    }
    /* a worker's hello to a part that holds no dense values sends its part
     * map instead of a layout (PROTOCOL.md 18) */
    if (m->type == PS_MSG_HELLO && m->role == PS_ROLE_WORKER &&
        (!(m->has & PS_F_SHARD) || (!(m->has & PS_F_LAYOUT) && !(m->has2 & PS_F2_PMAP))))
        return ps_fail(err, errlen, PS_EBAD_FIELD, "hello: a worker must send 'shard' and 'layout' (or, to a part "
                                                   "that holds no dense values, 'pmap')");
    if ((m->has & PS_F_LAYOUT) && (m->has & PS_F_FP) && m->fp != ps_layout_fingerprint(m->layout))
        return ps_fail(err, errlen, PS_EBAD_FIELD, "hello: fingerprint does not match the layout sent");
    if (m->type == PS_MSG_TPULL && !(m->has & PS_F_SEG) && !(m->has & PS_F_KEYS) == !(m->has & PS_F_LEN))
        return ps_fail(err, errlen, PS_EBAD_FIELD, "tpull: %s", (m->has & PS_F_KEYS) ? "'keys' and 'len' together: rows "
                                                                                  "by key or by position, not both"
                                                                                : "missing field 'keys'");
    if (ps_msg_is_table(m->type)) {
        /* row gradients in any form a push takes; rows back as float32,
         * bfloat16 or compressed, by key only (PROTOCOL.md 13.2) */
        /* ROWS: psd's answer in the form asked for (1 or 3; never 2) */
        int pushes = m->type == PS_MSG_TPUSH || m->type == PS_MSG_TPUSHPULL ||
                     (m->type == PS_MSG_ROWS && m->dt != PS_DT_F32Z);
        int pulls = (m->type == PS_MSG_TPULL && (m->has & PS_F_KEYS)) || m->type == PS_MSG_TPUSHPULL;
        if ((m->dt != PS_DT_F32 && !pushes) || (m->rdt != PS_DT_F32 && (!pulls || m->rdt == PS_DT_F32Z)))
            return ps_fail(err, errlen, PS_EUNSUPPORTED, "%s: '%s' %u (%s) is not supported here (row gradients of "
                                                         "a tpush or tpushpull may come as dt 1, 2 or 3; rows pulled "
                                                         "by key may be asked for as rdt 1 or 3)",
                           tname, m->dt != PS_DT_F32 && !pushes ? "dt" : "rdt",
                           m->dt != PS_DT_F32 && !pushes ? m->dt : m->rdt,
                           ps_dtype_name(m->dt != PS_DT_F32 && !pushes ? m->dt : m->rdt));
        if ((m->has & PS_F_DATA) && m->ndata > PS_TABLE_VALUES_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "%s: %llu row values in one message, more than %u (16 MiB); "
                                                    "send the keys in several",
                        tname, (unsigned long long)m->ndata, PS_TABLE_VALUES_MAX);
    }
    return 0;
}

