/* msg.c - the messages' common parts (msg.h, PROTOCOL.md): buffers, the
 * table of message types (messages.def: names, directions, required
 * fields), the names of roles and dtypes, the table of every field
 * (msg_fields.h), a map lookup. Encoding is msg_encode.c's, decoding
 * msg_decode.c's. */
#include "msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "msg_fields.h"

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

/* messages.def's rows, by type: name, direction, required fields. A
 * number twice would be a second initializer of one element (-Wextra's
 * -Woverride-init warns); a number outside 1..PS_MSG_TYPE_MAX fails here. */
typedef struct msg_type_row {
    const char *name;
    uint64_t required;
    ps_msg_dir dir;
} msg_type_row;

#define PS_MSG(NAME, name, t, dir, required)                                                            \
    _Static_assert((t) >= 1 && (t) <= PS_MSG_TYPE_MAX, "messages.def: " #NAME "'s t is not in 1..N, the " \
                                                       "number of rows (types run 1..N without a gap)");
#include "messages.def"
#undef PS_MSG

static const msg_type_row msg_types[PS_MSG_TYPE_MAX + 1] = {
#define PS_MSG(NAME, name, t, dir, required) [t] = {#name, required, PS_DIR_##dir},
#include "messages.def"
#undef PS_MSG
};

const char *ps_msg_type_name(uint32_t type)
{
    if (type >= 1 && type <= PS_MSG_TYPE_MAX)
        return msg_types[type].name;
    return "?";
}

ps_msg_dir ps_msg_type_dir(uint32_t type)
{
    return type >= 1 && type <= PS_MSG_TYPE_MAX ? msg_types[type].dir : PS_DIR_NONE;
}

int ps_msg_from_server_only(uint32_t type)
{
    return ps_msg_type_dir(type) == PS_DIR_S;
}

uint64_t ps_msg_required(uint32_t type)
{
    return type >= 1 && type <= PS_MSG_TYPE_MAX ? msg_types[type].required : 0;
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

#define F(key, bit, kind, member) {key, bit, kind, offsetof(ps_msg, member), sizeof(((ps_msg *)0)->member), NULL, 0}
#define FS(key, bit, kind) {key, bit, kind, 0, 0, NULL, 0}


const field ps_msg_fields[] = {
    F("id", PS_F_ID, FK_U64, id),
    F("v", PS_F_VERSION, FK_U32, proto),
    F("role", PS_F_ROLE, FK_ROLE, role),
    FS("shard", PS_F_SHARD, FK_SHARD),
    FS("layout", PS_F_LAYOUT, FK_LAYOUT),
    F("fp", PS_F_FP, FK_U64, fp),
    {"mode", PS_F_MODE, FK_NAME, offsetof(ps_msg, mode), sizeof(((ps_msg *)0)->mode),
     "mode must be a short string without NUL bytes", 0},
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
    F("hogwild", PS_F_HOGWILD, FK_PIDFD, hw),
    F("lr", PS_F_LR, FK_F64, lr),
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
     "cmd must be a string of 1..31 bytes without NUL bytes", 0},
    FS("args", PS_F_ARGS, FK_ARGS),
    F("nonce", PS_F_NONCE, FK_BIN, nonce),
    F("cnonce", PS_F_CNONCE, FK_BIN, cnonce),
    F("proof", PS_F_PROOF, FK_BIN, proof),
    F("sproof", PS_F_SPROOF, FK_BIN, sproof),
    FS("body", PS_F_BODY, FK_BODY),
    {"tab", PS_F_TAB, FK_NAME, offsetof(ps_msg, tab), sizeof(((ps_msg *)0)->tab),
     "tab must be a table name of 1..63 bytes without NUL bytes", 0},
    F("dim", PS_F_DIM, FK_U32, dim),
    {"rinit", PS_F_RINIT, FK_NAME, offsetof(ps_msg, rinit), sizeof(((ps_msg *)0)->rinit),
     "rinit must be \"zeros\", \"uniform\" or \"normal\"", 0},
    F("scale", PS_F_SCALE, FK_F64, scale),
    F("seed", PS_F_SEED, FK_U64, seed),
    {"opt", PS_F_OPT, FK_NAME, offsetof(ps_msg, opt), sizeof(((ps_msg *)0)->opt),
     "opt must be \"sgd\", \"adagrad\", \"adam\" or \"ftrl\"", 0},
    F("hp", PS_F_HP, FK_HP, hp),
    F("keys", PS_F_KEYS, FK_KEYS, keys),
    F("pkeys", PS_F_PKEYS, FK_KEYS, pkeys),
    FS("part", PS_F_PART, FK_PART),
    F("tshm", PS_F_TSHM, FK_PIDFD, tshm),
    F("tinshm", PS_F_TINSHM, FK_BOOL, tinshm),
    F("seg", PS_F_SEG, FK_SEG, seg),
    FS("data", PS_F_DATA, FK_DATA),
    /* the second word (has2) */
    {"cid", PS_F2_CID, FK_U64, offsetof(ps_msg, cid), sizeof(uint64_t), NULL, 1},
    {"pid", PS_F2_PID, FK_U64, offsetof(ps_msg, pid), sizeof(uint64_t), NULL, 1},
    {"leader", PS_F2_LEADER, FK_ADDR, offsetof(ps_msg, leader), sizeof(ps_str), NULL, 1},
    {"replicas", PS_F2_REPLICAS, FK_ADDRS, 0, 0, NULL, 1},
    {"reader", PS_F2_READER, FK_BOOL, offsetof(ps_msg, reader), sizeof(int), NULL, 1},
    {"lag", PS_F2_LAG, FK_U64, offsetof(ps_msg, lag), sizeof(uint64_t), NULL, 1},
    {"pmap", PS_F2_PMAP, FK_PMAP, 0, 0, NULL, 1},
};
_Static_assert(sizeof ps_msg_fields / sizeof ps_msg_fields[0] == PS_F_COUNT + PS_F2_COUNT,
               "a row for every PS_F_* and PS_F2_* bit");
_Static_assert(PS_CMD_MAX == 31, "cmd's error text says 1..31 bytes");


const char *ps_msg_field_name(uint64_t bit)
{
    for (size_t i = 0; i < NFIELDS; i++)
        if (ps_msg_fields[i].bit == bit && !ps_msg_fields[i].word)
            return ps_msg_fields[i].key;
    return "?";
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
