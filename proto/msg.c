/* msg.c - encode and decode of every message (see msg.h, PROTOCOL.md). */
#include "msg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* ---- buffers ---------------------------------------------------------- */

void ps_buf_free(ps_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

int ps_buf_reserve(ps_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2)
            return PS_ENOMEM;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return PS_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int ps_buf_printf(ps_buf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf((char *)b->p + b->len, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            return PS_EIO;
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return 0;
        }
        if (ps_buf_reserve(b, (size_t)n + 1) != 0)
            return PS_ENOMEM;
    }
}

int ps_buf_write(void *data, const char *buf, size_t len)
{
    ps_buf *b = data;
    if (ps_buf_reserve(b, len) != 0)
        return -1;
    memcpy(b->p + b->len, buf, len);
    b->len += len;
    return 0;
}

/* ---- names ------------------------------------------------------------ */

static const char *const type_names[PS_MSG_TYPE_MAX + 1] = {
    [PS_MSG_HELLO] = "hello",     [PS_MSG_WELCOME] = "welcome",
    [PS_MSG_INIT] = "init",       [PS_MSG_PUSH] = "push",
    [PS_MSG_PULL] = "pull",       [PS_MSG_PUSHPULL] = "pushpull",
    [PS_MSG_PARAMS] = "params",   [PS_MSG_OK] = "ok",
    [PS_MSG_HEARTBEAT] = "heartbeat", [PS_MSG_STATUS] = "status",
    [PS_MSG_STATUS_REPLY] = "status_reply", [PS_MSG_METRICS] = "metrics",
    [PS_MSG_METRICS_REPLY] = "metrics_reply", [PS_MSG_REPORT] = "report",
    [PS_MSG_ERROR] = "error",     [PS_MSG_BYE] = "bye",
    [PS_MSG_ADMIN] = "admin",     [PS_MSG_CHALLENGE] = "challenge",
    [PS_MSG_AUTH] = "auth", [PS_MSG_BARRIER] = "barrier",
    [PS_MSG_TABLE] = "table",     [PS_MSG_TPULL] = "tpull",
    [PS_MSG_TPUSH] = "tpush",     [PS_MSG_TPUSHPULL] = "tpushpull",
    [PS_MSG_ROWS] = "rows",
};

const char *ps_msg_type_name(uint32_t type)
{
    if (type <= PS_MSG_TYPE_MAX && type_names[type])
        return type_names[type];
    return "?";
}

const char *ps_role_name(uint32_t role)
{
    switch (role) {
    case PS_ROLE_WORKER:
        return "worker";
    case PS_ROLE_ADMIN:
        return "admin";
    default:
        return "none";
    }
}

const char *ps_dtype_name(uint32_t dt)
{
    switch (dt) {
    case PS_DT_F32:
        return "f32";
    case PS_DT_BF16:
        return "bf16";
    case PS_DT_F32Z:
        return "f32z";
    case PS_DT_F32ZSTD:
        return "zstd";
    default:
        return "?";
    }
}

void ps_msg_init(ps_msg *m, uint32_t type)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    m->fin = 1;
}

/* ---- the fields ------------------------------------------------------------ */

/* Every field of every message, once: its key on the wire, its PS_F_* bit,
 * how it is coded and where it lands in ps_msg. The table drives the
 * encoder (in this order, which is the order of the keys on the wire), the
 * decoder and the names in error messages; "t" (the type) and "pad" (which
 * aligns "data") are not fields. */
enum field_kind {
    FK_U64,    /* uint64_t, a non-negative integer */
    FK_U32,    /* uint32_t, an integer 0..2^32-1 */
    FK_F64,    /* double, any number */
    FK_BOOL,   /* int, true/false */
    FK_DTYPE,  /* uint32_t, a ps_dtype */
    FK_NAME,   /* char[size], a string of 1..size-1 bytes without NUL */
    FK_BIN,    /* uint8_t[size], a bin of exactly size bytes */
    FK_ROLE,   /* uint32_t ps_role, as "worker" or "admin" */
    FK_CODE,   /* int32_t, any 32-bit integer */
    FK_TEXT,   /* text and text_len, a string pointing into the frame */
    FK_SHARD,  /* shard and nshards, [k, m] */
    FK_PART,   /* part and nparts, [i, n] with 0 <= i < n <= PS_PARTS_MAX */
    FK_LAYOUT, /* *layout, [[name, [dims...]], ...] (ps_layout_pack) */
    FK_SHM,    /* shm_pid, shm_fd and maybe shm_goff, shm_poff: [pid, fd(, goff, poff)] */
    FK_PLAN,   /* plan, [epochs, samples, batch, seed] */
    FK_SLICE,  /* slice, [epoch, lo, hi, rank, count] */
    FK_ARGS,   /* args and nargs, an array of strings */
    FK_BODY,   /* body, a map (packed by the caller's callback) */
    FK_KEYS,   /* ps_keys, a bin of 1..PS_TABLE_KEYS_MAX little-endian uint64 */
    FK_HP,     /* ps_hp, a map of hyper-parameter names to finite numbers */
    FK_DATA,   /* data or data16 and ndata, a bin after "pad" */
};

typedef struct field {
    const char *key;
    uint64_t bit;
    enum field_kind kind;
    size_t off;        /* offsetof(ps_msg, ...) of the value, for the plain kinds */
    size_t size;       /* FK_NAME, FK_BIN: bytes of the array */
    const char *bad;   /* FK_NAME: what the error says it must be */
} field;

#define F(key, bit, kind, member) {key, bit, kind, offsetof(ps_msg, member), sizeof(((ps_msg *)0)->member), NULL}
#define FS(key, bit, kind) {key, bit, kind, 0, 0, NULL}

static const field fields[] = {
    F("id", PS_F_ID, FK_U64, id),
    F("v", PS_F_VERSION, FK_U32, proto),
    F("role", PS_F_ROLE, FK_ROLE, role),
    FS("shard", PS_F_SHARD, FK_SHARD),
    FS("layout", PS_F_LAYOUT, FK_LAYOUT),
    F("fp", PS_F_FP, FK_U64, fp),
    {"mode", PS_F_MODE, FK_NAME, offsetof(ps_msg, mode), sizeof(((ps_msg *)0)->mode),
     "mode must be a short string without NUL bytes"},
    F("ver", PS_F_MVER, FK_U64, mver),
    F("params", PS_F_PARAMS, FK_U64, params),
    F("workers", PS_F_WORKERS, FK_U32, workers),
    F("hb", PS_F_HB, FK_U64, hb),
    F("piece", PS_F_PIECE, FK_U64, piece),
    F("local", PS_F_LOCAL, FK_U32, local),
    F("alpha", PS_F_ALPHA, FK_F64, alpha),
    F("tau", PS_F_TAU, FK_U32, tau),
    F("wire", PS_F_WIRE, FK_U64, wire),
    F("dt", PS_F_DT, FK_DTYPE, dt),
    F("rdt", PS_F_RDT, FK_DTYPE, rdt),
    FS("shm", PS_F_SHM, FK_SHM),
    F("inshm", PS_F_INSHM, FK_BOOL, inshm),
    F("init", PS_F_INIT, FK_BOOL, need_init),
    FS("plan", PS_F_PLAN, FK_PLAN),
    FS("slice", PS_F_SLICE, FK_SLICE),
    F("done", PS_F_DONE, FK_BOOL, done),
    F("wait", PS_F_WAIT, FK_BOOL, wait),
    F("base", PS_F_BASE, FK_U64, base),
    F("min", PS_F_MIN, FK_U64, min),
    F("off", PS_F_OFF, FK_U64, off),
    F("len", PS_F_LEN, FK_U64, len),
    F("poff", PS_F_POFF, FK_U64, poff),
    F("plen", PS_F_PLEN, FK_U64, plen),
    F("fin", PS_F_FIN, FK_BOOL, fin),
    F("code", PS_F_CODE, FK_CODE, code),
    FS("text", PS_F_TEXT, FK_TEXT),
    F("epoch", PS_F_EPOCH, FK_U32, epoch),
    F("loss", PS_F_LOSS, FK_F64, loss),
    F("acc", PS_F_ACC, FK_F64, acc),
    F("tloss", PS_F_TLOSS, FK_F64, tloss),
    F("samples", PS_F_SAMPLES, FK_U64, samples),
    F("rate", PS_F_RATE, FK_F64, rate),
    {"cmd", PS_F_CMD, FK_NAME, offsetof(ps_msg, cmd), sizeof(((ps_msg *)0)->cmd),
     "cmd must be a string of 1..31 bytes without NUL bytes"},
    FS("args", PS_F_ARGS, FK_ARGS),
    F("nonce", PS_F_NONCE, FK_BIN, nonce),
    F("cnonce", PS_F_CNONCE, FK_BIN, cnonce),
    F("proof", PS_F_PROOF, FK_BIN, proof),
    F("sproof", PS_F_SPROOF, FK_BIN, sproof),
    FS("body", PS_F_BODY, FK_BODY),
    {"tab", PS_F_TAB, FK_NAME, offsetof(ps_msg, tab), sizeof(((ps_msg *)0)->tab),
     "tab must be a table name of 1..63 bytes without NUL bytes"},
    F("dim", PS_F_DIM, FK_U32, dim),
    {"rinit", PS_F_RINIT, FK_NAME, offsetof(ps_msg, rinit), sizeof(((ps_msg *)0)->rinit),
     "rinit must be \"zeros\", \"uniform\" or \"normal\""},
    F("scale", PS_F_SCALE, FK_F64, scale),
    F("seed", PS_F_SEED, FK_U64, seed),
    {"opt", PS_F_OPT, FK_NAME, offsetof(ps_msg, opt), sizeof(((ps_msg *)0)->opt),
     "opt must be \"sgd\", \"adagrad\", \"adam\" or \"ftrl\""},
    F("hp", PS_F_HP, FK_HP, hp),
    F("keys", PS_F_KEYS, FK_KEYS, keys),
    F("pkeys", PS_F_PKEYS, FK_KEYS, pkeys),
    FS("part", PS_F_PART, FK_PART),
    FS("data", PS_F_DATA, FK_DATA),
};
#define NFIELDS (sizeof fields / sizeof fields[0])
_Static_assert(NFIELDS == PS_F_COUNT, "a row for every PS_F_* bit");
_Static_assert(PS_CMD_MAX == 31, "cmd's error text says 1..31 bytes");

#define AT(m, f, type) ((type *)(void *)((char *)(m) + (f)->off))
#define AT_C(m, f, type) ((const type *)(const void *)((const char *)(m) + (f)->off))

static const char *field_name(uint64_t bit)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (fields[i].bit == bit)
            return fields[i].key;
    return "?";
}

/* ---- encoding --------------------------------------------------------- */

void ps_pack_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}

void ps_pack_ku64(msgpack_packer *pk, const char *k, uint64_t v)
{
    ps_pack_key(pk, k);
    msgpack_pack_uint64(pk, v);
}

void ps_pack_kf64(msgpack_packer *pk, const char *k, double v)
{
    ps_pack_key(pk, k);
    msgpack_pack_double(pk, v);
}

void ps_pack_kstr(msgpack_packer *pk, const char *k, const char *v)
{
    size_t n = strlen(v);
    ps_pack_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, v, n);
}

static void pack_strn(msgpack_packer *pk, const char *k, const char *s, size_t n)
{
    ps_pack_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_binn(msgpack_packer *pk, const char *k, const uint8_t *p, size_t n)
{
    ps_pack_key(pk, k);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, p, n);
}

static unsigned popcount64(uint64_t x)
{
    unsigned n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

int ps_msg_encode(const ps_msg *m, ps_buf *out, size_t *data_len, ps_body_fn body, void *body_arg)
{
    msgpack_packer pk;
    uint64_t has = m->has & ~(uint64_t)PS_F_BODY;
    if (body)
        has |= PS_F_BODY;
    uint64_t dbytes = (has & PS_F_DATA) ? ps_msg_data_len(m) : 0;
    if (dbytes > PS_FRAME_MAX_HARD)
        return PS_ETOO_BIG;

    out->len = 0;
    if (ps_buf_reserve(out, 256) != 0)
        return PS_ENOMEM;
    out->len = PS_FRAME_HDR;
    msgpack_packer_init(&pk, out, ps_buf_write);

    /* "t" always; "pad" goes with "data" */
    unsigned nfields = 1 + popcount64(has) + ((has & PS_F_DATA) ? 1 : 0);
    msgpack_pack_map(&pk, nfields);
    ps_pack_ku64(&pk, "t", m->type);
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        if (!(has & f->bit) || f->kind == FK_DATA)
            continue; /* data goes last, below */
        switch (f->kind) {
        case FK_U64:
            ps_pack_ku64(&pk, f->key, *AT_C(m, f, uint64_t));
            break;
        case FK_U32:
        case FK_DTYPE:
            ps_pack_ku64(&pk, f->key, *AT_C(m, f, uint32_t));
            break;
        case FK_F64:
            ps_pack_kf64(&pk, f->key, *AT_C(m, f, double));
            break;
        case FK_BOOL:
            ps_pack_key(&pk, f->key);
            if (*AT_C(m, f, int))
                msgpack_pack_true(&pk);
            else
                msgpack_pack_false(&pk);
            break;
        case FK_NAME:
            pack_strn(&pk, f->key, AT_C(m, f, char), strlen(AT_C(m, f, char)));
            break;
        case FK_BIN:
            pack_binn(&pk, f->key, AT_C(m, f, uint8_t), f->size);
            break;
        case FK_ROLE: {
            const char *r = ps_role_name(m->role);
            pack_strn(&pk, f->key, r, strlen(r));
            break;
        }
        case FK_CODE:
            ps_pack_key(&pk, f->key);
            msgpack_pack_int32(&pk, m->code);
            break;
        case FK_TEXT:
            pack_strn(&pk, f->key, m->text ? m->text : "", m->text ? m->text_len : 0);
            break;
        case FK_SHARD:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 2);
            msgpack_pack_uint32(&pk, m->shard);
            msgpack_pack_uint32(&pk, m->nshards);
            break;
        case FK_PART:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 2);
            msgpack_pack_uint32(&pk, m->part);
            msgpack_pack_uint32(&pk, m->nparts);
            break;
        case FK_LAYOUT:
            ps_pack_key(&pk, f->key);
            ps_layout_pack(&pk, m->layout);
            break;
        case FK_SHM:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, m->shm_at ? 4 : 2);
            msgpack_pack_uint32(&pk, m->shm_pid);
            msgpack_pack_uint32(&pk, m->shm_fd);
            if (m->shm_at) {
                msgpack_pack_uint64(&pk, m->shm_goff);
                msgpack_pack_uint64(&pk, m->shm_poff);
            }
            break;
        case FK_PLAN:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 4);
            msgpack_pack_uint64(&pk, m->plan.epochs);
            msgpack_pack_uint64(&pk, m->plan.samples);
            msgpack_pack_uint64(&pk, m->plan.batch);
            msgpack_pack_uint64(&pk, m->plan.seed);
            break;
        case FK_SLICE:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 5);
            msgpack_pack_uint64(&pk, m->slice.epoch);
            msgpack_pack_uint64(&pk, m->slice.lo);
            msgpack_pack_uint64(&pk, m->slice.hi);
            msgpack_pack_uint32(&pk, m->slice.rank);
            msgpack_pack_uint32(&pk, m->slice.count);
            break;
        case FK_ARGS:
            if (m->nargs > PS_ARGS_MAX)
                return PS_ETOO_BIG;
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, m->nargs);
            for (uint32_t j = 0; j < m->nargs; j++) {
                msgpack_pack_str(&pk, m->args[j].len);
                msgpack_pack_str_body(&pk, m->args[j].p, m->args[j].len);
            }
            break;
        case FK_BODY: {
            ps_pack_key(&pk, f->key);
            int rc = body(&pk, body_arg);
            if (rc != 0)
                return rc;
            break;
        }
        case FK_KEYS: {
            const ps_keys *k = AT_C(m, f, ps_keys);
            pack_binn(&pk, f->key, k->p, (size_t)k->n * 8);
            break;
        }
        case FK_HP: {
            const ps_hp *hp = AT_C(m, f, ps_hp);
            ps_pack_key(&pk, f->key);
            msgpack_pack_map(&pk, popcount64(hp->has & ((1u << PS_HP_COUNT) - 1)));
            for (uint32_t j = 0; j < PS_HP_COUNT; j++)
                if (hp->has & (1u << j))
                    ps_pack_kf64(&pk, ps_hp_name(j), hp->v[j]);
            break;
        }
        case FK_DATA:
            break;
        }
    }
    if (has & PS_F_DATA) {
        /* "pad" (4 bytes) + bin8 (2 + k bytes) + "data" (5) + bin32 header (5) */
        size_t start = out->len + 4 + 2 + 5 + 5;
        size_t k = (PS_DATA_ALIGN - start % PS_DATA_ALIGN) % PS_DATA_ALIGN;
        static const char zeros[PS_DATA_ALIGN] = {0};
        ps_pack_key(&pk, "pad");
        msgpack_pack_bin(&pk, k);
        msgpack_pack_bin_body(&pk, zeros, k);
        ps_pack_key(&pk, "data");
        uint8_t h[5] = {0xc6, (uint8_t)(dbytes >> 24), (uint8_t)(dbytes >> 16), (uint8_t)(dbytes >> 8),
                        (uint8_t)dbytes};
        if (ps_buf_write(out, (const char *)h, 5) != 0)
            return PS_ENOMEM;
    }
    if (out->len < PS_FRAME_HDR + 1 || out->len > out->cap)
        return PS_ENOMEM; /* a failed write inside the packer */
    uint64_t payload = out->len - PS_FRAME_HDR + dbytes;
    if (payload > PS_FRAME_MAX_HARD)
        return PS_ETOO_BIG;
    ps_frame_put_len(out->p, (uint32_t)payload);
    if (data_len)
        *data_len = (size_t)dbytes;
    return 0;
}

int ps_msg_encode_full(const ps_msg *m, ps_buf *out)
{
    size_t dlen = 0;
    int rc = ps_msg_encode(m, out, &dlen, NULL, NULL);
    if (rc != 0 || dlen == 0)
        return rc;
    if (ps_buf_reserve(out, dlen) != 0)
        return PS_ENOMEM;
    memcpy(out->p + out->len, ps_msg_data_bytes(m), dlen);
    out->len += dlen;
    return 0;
}

const msgpack_object *ps_map_get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n && !memcmp(kv->key.via.str.ptr, key, n))
            return &kv->val;
    }
    return NULL;
}

/* ---- decoding --------------------------------------------------------- */

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

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

void ps_layout_pack(msgpack_packer *pk, const ps_layout *l)
{
    msgpack_pack_array(pk, l->ntensors);
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        /* a buffer: [name, dims, rule] (+ dtype when not F32) */
        msgpack_pack_array(pk, t->buf ? (t->save_dt ? 4 : 3) : 2);
        msgpack_pack_str(pk, strlen(t->name));
        msgpack_pack_str_body(pk, t->name, strlen(t->name));
        msgpack_pack_array(pk, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            msgpack_pack_uint32(pk, t->dims[d]);
        if (t->buf) {
            const char *r = ps_buf_name(t->buf);
            msgpack_pack_str(pk, strlen(r));
            msgpack_pack_str_body(pk, r, strlen(r));
        }
        if (t->buf && t->save_dt) {
            const char *dt = ps_save_dt_name(t->save_dt);
            msgpack_pack_str(pk, strlen(dt));
            msgpack_pack_str_body(pk, dt, strlen(dt));
        }
    }
}

int ps_layout_unpack(const msgpack_object *o, ps_layout *l, char *err, size_t errlen)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 || o->via.array.size > PS_TENSORS_MAX)
        return fail(err, errlen, PS_EBAD_FIELD, "layout: expected an array of 1..%d tensors", PS_TENSORS_MAX);
    ps_layout_init(l);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *t = &o->via.array.ptr[i];
        if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size < 2 || t->via.array.size > 4 ||
            t->via.array.ptr[0].type != MSGPACK_OBJECT_STR || t->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
            return fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: expected [name, [dims...]] or, for a buffer, "
                                                    "[name, [dims...], rule] or [name, [dims...], rule, dtype]", i);
        const msgpack_object_str *name = &t->via.array.ptr[0].via.str;
        const msgpack_object_array *dims = &t->via.array.ptr[1].via.array;
        char nbuf[PS_NAME_MAX + 1];
        uint32_t d[PS_DIMS_MAX];
        if (name->size == 0 || name->size > PS_NAME_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: name must have 1..%d bytes", i, PS_NAME_MAX);
        /* a NUL would cut the name short in nbuf: "w\0x" must not pass as "w" */
        if (memchr(name->ptr, '\0', name->size))
            return fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: name contains a NUL byte", i);
        if (dims->size == 0 || dims->size > PS_DIMS_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "layout[%u]: rank must be 1..%d", i, PS_DIMS_MAX);
        memcpy(nbuf, name->ptr, name->size);
        nbuf[name->size] = '\0';
        for (uint32_t j = 0; j < dims->size; j++) {
            uint64_t v;
            if (get_u64(&dims->ptr[j], &v) != 0 || v == 0 || v > UINT32_MAX)
                return fail(err, errlen, PS_EBAD_FIELD, "layout[%u] (%s): dimension %u is not a positive integer",
                            i, nbuf, j);
            d[j] = (uint32_t)v;
        }
        if (ps_layout_add(l, nbuf, dims->size, d) != 0)
            return fail(err, errlen, PS_EBAD_FIELD,
                        "layout[%u] (%s): invalid name (printable ASCII, no spaces) or too many parameters", i,
                        nbuf);
        if (t->via.array.size > 2) {
            const msgpack_object *r = &t->via.array.ptr[2], *dt = t->via.array.size > 3 ? &t->via.array.ptr[3] : NULL;
            int rule = r->type == MSGPACK_OBJECT_STR ? ps_buf_parse(r->via.str.ptr, r->via.str.size) : -1;
            int sdt = !dt ? PS_SAVE_F32 : dt->type == MSGPACK_OBJECT_STR ? ps_save_dt_parse(dt->via.str.ptr, dt->via.str.size) : -1;
            if (rule < 0)
                return fail(err, errlen, PS_EBAD_FIELD, "layout[%u] (%s): a buffer's rule is \"mean\" or \"first\"",
                            i, nbuf);
            if (sdt < 0)
                return fail(err, errlen, PS_EBAD_FIELD,
                            "layout[%u] (%s): a buffer's dtype is \"F32\", \"F64\", \"I64\" or \"I32\"", i, nbuf);
            ps_layout_set_buffer(l, (unsigned)rule, (unsigned)sdt);
        }
    }
    return 0;
}

int ps_msg_from_server_only(uint32_t type)
{
    switch (type) {
    case PS_MSG_WELCOME:
    case PS_MSG_PARAMS:
    case PS_MSG_OK:
    case PS_MSG_STATUS_REPLY:
    case PS_MSG_METRICS_REPLY:
    case PS_MSG_ERROR:
    case PS_MSG_CHALLENGE:
    case PS_MSG_ROWS:
        return 1;
    default:
        return 0;
    }
}

/* Fields each message type must carry. */
static uint64_t required_fields(uint32_t type)
{
    switch (type) {
    case PS_MSG_HELLO:
        return PS_F_VERSION | PS_F_ROLE;
    case PS_MSG_WELCOME:
        return PS_F_VERSION | PS_F_MODE | PS_F_MVER | PS_F_PARAMS;
    case PS_MSG_INIT:
        return PS_F_OFF | PS_F_DATA;
    case PS_MSG_PUSH:
        return PS_F_BASE | PS_F_OFF | PS_F_DATA;
    case PS_MSG_PULL:
        return PS_F_OFF | PS_F_LEN;
    case PS_MSG_PUSHPULL:
        return PS_F_BASE | PS_F_OFF | PS_F_DATA | PS_F_POFF | PS_F_PLEN;
    case PS_MSG_PARAMS:
        return PS_F_MVER | PS_F_OFF | PS_F_DATA;
    case PS_MSG_STATUS_REPLY:
        return PS_F_BODY;
    case PS_MSG_METRICS_REPLY:
        return PS_F_TEXT;
    case PS_MSG_REPORT:
        return PS_F_EPOCH;
    case PS_MSG_ERROR:
        return PS_F_CODE | PS_F_TEXT;
    case PS_MSG_ADMIN:
        return PS_F_CMD;
    case PS_MSG_CHALLENGE:
        return PS_F_NONCE;
    case PS_MSG_AUTH:
        return PS_F_CNONCE | PS_F_PROOF;
    case PS_MSG_BARRIER:
        return PS_F_MVER;
    case PS_MSG_TABLE:
        return PS_F_TAB | PS_F_DIM | PS_F_RINIT | PS_F_OPT;
    case PS_MSG_TPULL:
        return PS_F_TAB; /* and "keys" or "len": checked below */
    case PS_MSG_TPUSH:
        return PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA;
    case PS_MSG_TPUSHPULL:
        return PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA | PS_F_PKEYS;
    case PS_MSG_ROWS:
        return PS_F_MVER | PS_F_DATA;
    default:
        return 0;
    }
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
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a non-negative integer", tname, f->key);
        *AT(m, f, uint64_t) = v;
        return 0;
    }
    case FK_U32: {
        uint64_t v;
        if (get_u64(o, &v) != 0 || v > UINT32_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be an integer 0..2^32-1", tname, f->key);
        *AT(m, f, uint32_t) = (uint32_t)v;
        return 0;
    }
    case FK_DTYPE: {
        uint64_t v;
        if (get_u64(o, &v) != 0)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a non-negative integer", tname, f->key);
        if (v > PS_DT_MAX)
            return fail(err, errlen, PS_EUNSUPPORTED, "%s: unknown tensor element type %llu in '%s' "
                                                      "(0 float32, 1 bfloat16, 2 float32 without zeros, 3 zstd)",
                        tname, (unsigned long long)v, f->key);
        *AT(m, f, uint32_t) = (uint32_t)v;
        return 0;
    }
    case FK_F64:
        if (get_f64(o, AT(m, f, double)) != 0)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a number", tname, f->key);
        return 0;
    case FK_BOOL:
        if (get_bool(o, AT(m, f, int)) != 0)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a boolean", tname, f->key);
        return 0;
    case FK_NAME:
        if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size >= f->size ||
            memchr(o->via.str.ptr, '\0', o->via.str.size))
            return fail(err, errlen, PS_EBAD_FIELD, "%s: %s", tname, f->bad);
        memcpy(AT(m, f, char), o->via.str.ptr, o->via.str.size);
        AT(m, f, char)[o->via.str.size] = '\0';
        return 0;
    case FK_BIN:
        /* authentication: bins of exactly 32 bytes, copied out of the frame */
        if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != f->size)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' must be a bin of %zu bytes", tname, f->key,
                        f->size);
        memcpy(AT(m, f, uint8_t), o->via.bin.ptr, f->size);
        return 0;
    case FK_ROLE:
        if (o->type == MSGPACK_OBJECT_STR && o->via.str.size == 6 && !memcmp(o->via.str.ptr, "worker", 6))
            m->role = PS_ROLE_WORKER;
        else if (o->type == MSGPACK_OBJECT_STR && o->via.str.size == 5 && !memcmp(o->via.str.ptr, "admin", 5))
            m->role = PS_ROLE_ADMIN;
        else
            return fail(err, errlen, PS_EBAD_FIELD, "%s: role must be \"worker\" or \"admin\"", tname);
        return 0;
    case FK_CODE:
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
            m->code = (int32_t)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            m->code = (int32_t)o->via.i64;
        else
            return fail(err, errlen, PS_EBAD_FIELD, "%s: code must be a 32-bit integer", tname);
        return 0;
    case FK_TEXT:
        if (o->type != MSGPACK_OBJECT_STR)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: text must be a string", tname);
        m->text = o->via.str.ptr;
        m->text_len = o->via.str.size;
        return 0;
    case FK_SHARD: {
        uint64_t k, n;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || get_u64(&o->via.array.ptr[0], &k) ||
            get_u64(&o->via.array.ptr[1], &n) || n == 0 || n > 65536 || k >= n)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: shard must be [k, m] with 0 <= k < m <= 65536", tname);
        m->shard = (uint32_t)k;
        m->nshards = (uint32_t)n;
        return 0;
    }
    case FK_PART: {
        uint64_t i, n;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 || get_u64(&o->via.array.ptr[0], &i) ||
            get_u64(&o->via.array.ptr[1], &n) || n == 0 || n > PS_PARTS_MAX || i >= n)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: part must be [i, n] with 0 <= i < n <= %u", tname,
                        PS_PARTS_MAX);
        m->part = (uint32_t)i;
        m->nparts = (uint32_t)n;
        return 0;
    }
    case FK_LAYOUT: {
        if (!layout_out)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: unexpected field 'layout'", tname);
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
            return fail(err, errlen, PS_EBAD_FIELD, "%s: shm must be [pid, fd] or [pid, fd, goff, poff] with "
                                                    "0 < pid < 2^31, fd < 2^31 and offsets of at most 2^35",
                        tname);
        m->shm_pid = (uint32_t)pid;
        m->shm_fd = (uint32_t)fd;
        m->shm_at = n == 4;
        m->shm_goff = goff;
        m->shm_poff = poff;
        return 0;
    }
    case FK_PLAN: {
        uint64_t v[4];
        int ok = o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 4;
        for (uint32_t j = 0; ok && j < 4; j++)
            ok = get_u64(&o->via.array.ptr[j], &v[j]) == 0;
        if (!ok || v[0] == 0 || v[0] > PS_PLAN_EPOCHS_MAX || v[1] == 0 || v[1] > PS_PLAN_SAMPLES_MAX || v[2] == 0 ||
            v[2] > v[1])
            return fail(err, errlen, PS_EBAD_FIELD, "%s: plan must be [epochs, samples, batch, seed] with 1 <= epochs "
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
            return fail(err, errlen, PS_EBAD_FIELD, "%s: slice must be [epoch, lo, hi, rank, count] with lo <= hi <= "
                                                    "2^40 and rank < count <= 65536",
                        tname);
        m->slice = (ps_slice){.epoch = v[0], .lo = v[1], .hi = v[2], .rank = (uint32_t)v[3], .count = (uint32_t)v[4]};
        return 0;
    }
    case FK_ARGS:
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > PS_ARGS_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: args must be an array of at most %d strings", tname,
                        PS_ARGS_MAX);
        for (uint32_t j = 0; j < o->via.array.size; j++) {
            const msgpack_object *a = &o->via.array.ptr[j];
            if (a->type != MSGPACK_OBJECT_STR || a->via.str.size > PS_ARG_MAX)
                return fail(err, errlen, PS_EBAD_FIELD, "%s: args[%u] must be a string of at most %d bytes", tname,
                            j, PS_ARG_MAX);
            m->args[j].p = a->via.str.ptr;
            m->args[j].len = a->via.str.size;
        }
        m->nargs = o->via.array.size;
        return 0;
    case FK_BODY:
        if (o->type != MSGPACK_OBJECT_MAP)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: body must be a map", tname);
        m->body = o;
        return 0;
    case FK_KEYS: {
        uint32_t n = o->type == MSGPACK_OBJECT_BIN ? o->via.bin.size : 0;
        if (o->type != MSGPACK_OBJECT_BIN || n == 0 || n % 8 != 0)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: '%s' must be a bin of 1..%d little-endian uint64 keys "
                                                    "(8 bytes each), not %s%u bytes",
                        tname, f->key, PS_TABLE_KEYS_MAX, o->type == MSGPACK_OBJECT_BIN ? "" : "a non-bin of ",
                        n);
        if (n / 8 > PS_TABLE_KEYS_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: '%s' holds %u keys, more than %d in one message; send "
                                                    "them in several",
                        tname, f->key, n / 8, PS_TABLE_KEYS_MAX);
        *AT(m, f, ps_keys) = (ps_keys){.p = (const uint8_t *)o->via.bin.ptr, .n = n / 8};
        return 0;
    }
    case FK_HP: {
        ps_hp *hp = AT(m, f, ps_hp);
        if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size > PS_HP_COUNT)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: hp must be a map of at most %d hyper-parameters", tname,
                        PS_HP_COUNT);
        hp->has = 0;
        for (uint32_t j = 0; j < o->via.map.size; j++) {
            const msgpack_object_kv *e = &o->via.map.ptr[j];
            int id = e->key.type == MSGPACK_OBJECT_STR ? ps_hp_lookup(e->key.via.str.ptr, e->key.via.str.size) : -1;
            if (id < 0)
                return fail(err, errlen, PS_EBAD_FIELD, "%s: hp[%u]: unknown hyper-parameter (lr, eps, beta1, "
                                                        "beta2, iacc, beta, l1 or l2)",
                            tname, j);
            if (hp->has & (1u << id))
                return fail(err, errlen, PS_EBAD_FIELD, "%s: hp '%s' appears twice", tname, ps_hp_name((uint32_t)id));
            double v;
            if (get_f64(&e->val, &v) != 0 || !isfinite(v))
                return fail(err, errlen, PS_EBAD_FIELD, "%s: hp '%s' must be a finite number", tname,
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
            return fail(err, errlen, PS_EBAD_FIELD, "%s: data must be bin (little-endian float32, bfloat16 or "
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
        return fail(err, errlen, PS_EBAD_FIELD, "%s: data without zeros (dt 2) needs 'len', the values it covers",
                    tname);
    uint64_t n = m->len, mb = ps_f32z_mask_bytes(n);
    if (n > PS_FRAME_MAX_HARD * 8ull || size < mb || (size - mb) % 4 != 0)
        return fail(err, errlen, PS_EBAD_FIELD,
                    "%s: data without zeros has %zu bytes: not a bitmap of %llu bytes (len %llu) and whole float32 "
                    "values",
                    tname, size, (unsigned long long)(n > PS_FRAME_MAX_HARD * 8ull ? 0 : mb), (unsigned long long)n);
    /* bits past n: the rest of byte n / 8, then whole bytes */
    int tail = (n % 8 != 0 && (src[n / 8] >> (n % 8)) != 0);
    for (uint64_t i = (n + 7) / 8; i < mb && !tail; i++)
        tail = src[i] != 0;
    if (tail)
        return fail(err, errlen, PS_EBAD_FIELD, "%s: data without zeros: bitmap bits past len %llu are set", tname,
                    (unsigned long long)n);
    uint64_t set = 0; /* a popcount does not care about byte order */
    for (uint64_t i = 0; i < mb; i += 4) {
        uint32_t w;
        memcpy(&w, src + i, 4);
        set += (uint64_t)__builtin_popcount(w);
    }
    uint64_t nz = (size - mb) / 4;
    if (set != nz)
        return fail(err, errlen, PS_EBAD_FIELD,
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
        return fail(err, errlen, PS_EMALFORMED, "msgpack unpack failed");
    if (root.type != MSGPACK_OBJECT_MAP)
        return fail(err, errlen, PS_EMALFORMED, "message is not a map");

    const msgpack_object_map *map = &root.via.map;
    const msgpack_object *t = NULL;
    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == 1 && kv->key.via.str.ptr[0] == 't')
            t = &kv->val;
    }
    uint64_t type;
    if (!t || get_u64(t, &type) != 0)
        return fail(err, errlen, PS_EMALFORMED, "message has no integer type field 't'");
    if (type == 0 || type > PS_MSG_TYPE_MAX)
        return fail(err, errlen, PS_EBAD_TYPE, "unknown message type %llu", (unsigned long long)type);
    m->type = (uint32_t)type;
    const char *tname = ps_msg_type_name(m->type);
    const msgpack_object *bin = NULL; /* "data" */

    for (uint32_t i = 0; i < map->size; i++) {
        const msgpack_object_kv *kv = &map->ptr[i];
        uint64_t bit_ = 0;
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return fail(err, errlen, PS_EMALFORMED, "%s: map keys must be strings", tname);
        if (key_is(kv, "t") || key_is(kv, "pad")) {
            continue;
        }
        const field *f = NULL;
        for (size_t j = 0; j < NFIELDS && !f; j++)
            if (key_is(kv, fields[j].key))
                f = &fields[j];
        if (!f)
            continue; /* unknown keys are ignored, for forward compatibility */
        rc = decode_field(f, kv, m, layout_out, &bin, tname, err, errlen);
        if (rc != 0)
            return rc;
        bit_ = f->bit;
        if (m->has & bit_)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: field '%s' appears twice", tname, field_name(bit_));
        m->has |= bit_;
    }

    if (bin) {
        size_t esize = ps_dtype_size(m->dt);
        if (!ps_dtype_packed(m->dt) && bin->via.bin.size % esize != 0)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: data has %u bytes, not a multiple of %zu (%s)", tname,
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
                return fail(err, errlen, PS_EBAD_FIELD,
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
        return fail(err, errlen, PS_EBAD_FIELD, "%s: 'dt' %u (%s) needs 'data'", tname, m->dt,
                    ps_dtype_name(m->dt));
    }

    uint64_t need = required_fields(m->type);
    if ((m->type == PS_MSG_PUSHPULL || m->type == PS_MSG_PARAMS) && m->inshm) {
        /* the tensor is in the shared segment: "len" says how long */
        if (m->has & PS_F_DATA)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: 'data' and 'inshm' together", tname);
        need = (need & ~PS_F_DATA) | PS_F_LEN;
    }
    if ((m->has & need) != need) {
        uint64_t missing = need & ~m->has;
        return fail(err, errlen, PS_EBAD_FIELD, "%s: missing field '%s'", tname, field_name(missing & -missing));
    }
    if (m->type == PS_MSG_HELLO && m->role == PS_ROLE_WORKER && (m->has & (PS_F_SHARD | PS_F_LAYOUT)) !=
                                                                   (PS_F_SHARD | PS_F_LAYOUT))
        return fail(err, errlen, PS_EBAD_FIELD, "hello: a worker must send 'shard' and 'layout'");
    if ((m->has & PS_F_LAYOUT) && (m->has & PS_F_FP) && m->fp != ps_layout_fingerprint(m->layout))
        return fail(err, errlen, PS_EBAD_FIELD, "hello: fingerprint does not match the layout sent");
    if (m->type == PS_MSG_TPULL && !(m->has & PS_F_KEYS) == !(m->has & PS_F_LEN))
        return fail(err, errlen, PS_EBAD_FIELD, "tpull: %s", (m->has & PS_F_KEYS) ? "'keys' and 'len' together: rows "
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
            return fail(err, errlen, PS_EUNSUPPORTED, "%s: '%s' %u (%s) is not supported here (row gradients of "
                                                      "a tpush or tpushpull may come as dt 1, 2 or 3; rows pulled "
                                                      "by key may be asked for as rdt 1 or 3)",
                        tname, m->dt != PS_DT_F32 && !pushes ? "dt" : "rdt",
                        m->dt != PS_DT_F32 && !pushes ? m->dt : m->rdt,
                        ps_dtype_name(m->dt != PS_DT_F32 && !pushes ? m->dt : m->rdt));
        if ((m->has & PS_F_DATA) && m->ndata > PS_TABLE_VALUES_MAX)
            return fail(err, errlen, PS_EBAD_FIELD, "%s: %llu row values in one message, more than %u (16 MiB); "
                                                    "send the keys in several",
                        tname, (unsigned long long)m->ndata, PS_TABLE_VALUES_MAX);
    }
    return 0;
}
