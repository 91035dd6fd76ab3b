/* msg.h - every psd message as a plain struct, and its encoding.
 *
 * A message is a msgpack map with short string keys ("t" type, "id" request
 * id, ...), described field by field in proto/PROTOCOL.md. Tensor data
 * travels as float32 (or, when both ends agreed to, bfloat16) little-endian
 * bytes in a msgpack bin under the key "data",
 * always the last key of the map, so that:
 *   - a sender writes the header it encoded here and then the float array
 *     itself (scatter/gather), with no copy of the tensor;
 *   - a receiver decodes the tensor in place: ps_msg.data points into the
 *     frame buffer.
 * Our encoder adds a "pad" bin before "data" so the tensor starts at an offset
 * of the frame that is a multiple of PS_DATA_ALIGN; when a frame from another
 * encoder leaves it misaligned, the decoder moves it back by < PS_DATA_ALIGN
 * bytes inside the frame buffer (over bytes it has already parsed). */
#ifndef PS_MSG_H
#define PS_MSG_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "frame.h"
#include "layout.h"
#include "table.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "psd's wire format carries little-endian float32 in place; this host is big-endian"
#endif

/* The message types, numbered as on the wire: one row each in
 * messages.def, from which their names, directions, required fields and
 * psd's handlers follow too. */
typedef enum ps_msg_type {
#define PS_MSG(NAME, name, t, dir, required) PS_MSG_##NAME = t,
#include "messages.def"
#undef PS_MSG
} ps_msg_type;
/* The highest type: the number of rows, as the types run 1..N without a
 * gap (msg.c checks that each row's t is in 1..N and no two share one). */
enum {
    PS_MSG_TYPE_MAX = 0
#define PS_MSG(NAME, name, t, dir, required) + 1
#include "messages.def"
#undef PS_MSG
};

/* Who sends a message type (messages.def's dir). */
typedef enum ps_msg_dir {
    PS_DIR_NONE = 0, /* not a type */
    PS_DIR_C = 'C',  /* any client -> psd */
    PS_DIR_W = 'W',  /* a worker -> psd */
    PS_DIR_A = 'A',  /* an admin -> psd */
    PS_DIR_S = 'S',  /* psd -> a client */
} ps_msg_dir;

typedef enum ps_role { PS_ROLE_NONE = 0, PS_ROLE_WORKER = 1, PS_ROLE_ADMIN = 2 } ps_role;

/* Presence bits for optional fields (ps_msg.has, 64 bits wide). */
enum {
    PS_F_ID = 1u << 0,
    PS_F_VERSION = 1u << 1,  /* "v": protocol version (hello, welcome) */
    PS_F_ROLE = 1u << 2,
    PS_F_SHARD = 1u << 3,
    PS_F_LAYOUT = 1u << 4,
    PS_F_FP = 1u << 5,
    PS_F_MODE = 1u << 6,
    PS_F_MVER = 1u << 7,     /* "ver": model version */
    PS_F_PARAMS = 1u << 8,
    PS_F_INIT = 1u << 9,
    PS_F_OFF = 1u << 10,
    PS_F_LEN = 1u << 11,
    PS_F_DATA = 1u << 12,
    PS_F_FIN = 1u << 13,
    PS_F_MIN = 1u << 14,
    PS_F_BASE = 1u << 15,
    PS_F_POFF = 1u << 16,
    PS_F_PLEN = 1u << 17,
    PS_F_CODE = 1u << 18,
    PS_F_TEXT = 1u << 19,
    PS_F_BODY = 1u << 20,    /* status map */
    PS_F_EPOCH = 1u << 21,
    PS_F_LOSS = 1u << 22,
    PS_F_ACC = 1u << 23,
    PS_F_SAMPLES = 1u << 24,
    PS_F_TLOSS = 1u << 25,
    PS_F_WORKERS = 1u << 26,
    PS_F_RATE = 1u << 27,
    PS_F_HB = 1u << 28,      /* "hb": heartbeat timeout, ms (welcome) */
    PS_F_CMD = 1u << 29,     /* "cmd": admin command name */
    PS_F_ARGS = 1u << 30,    /* "args": admin command arguments */
};
/* Bits 31 and up do not fit an enum constant (an int): plain macros. */
#define PS_F_NONCE (1ull << 31)  /* "nonce": psd's challenge, PS_AUTH_NONCE_LEN bytes */
#define PS_F_CNONCE (1ull << 32) /* "cnonce": the client's nonce (AUTH) */
#define PS_F_PROOF (1ull << 33)  /* "proof": the client's HMAC (AUTH) */
#define PS_F_SPROOF (1ull << 34) /* "sproof": psd's HMAC (WELCOME after AUTH) */
#define PS_F_DT (1ull << 35)     /* "dt": element type of "data" (ps_dtype; absent: f32) */
#define PS_F_RDT (1ull << 36)    /* "rdt": element type wanted in the reply's data (pull, pushpull) */
#define PS_F_WIRE (1ull << 37)   /* "wire": bit set of the ps_dtype values psd accepts (welcome) */
#define PS_F_SHM (1ull << 38)    /* "shm": [pid, fd] of the worker's shared-memory segment (hello) */
#define PS_F_INSHM (1ull << 39)  /* "inshm": the tensor is in that segment, not in "data"
                                  * (welcome: psd mapped it; pushpull, params) */
#define PS_F_PLAN (1ull << 40)   /* "plan": the job's plan (hello, welcome; ps_plan) */
#define PS_F_SLICE (1ull << 41)  /* "slice": the samples of the round a PARAMS opens (ps_slice) */
#define PS_F_DONE (1ull << 42)   /* "done": the plan's last round is over (params) */
#define PS_F_WAIT (1ull << 43)   /* "wait": heartbeat: tell me what my parked pull waits for;
                                  * OK: this one tells it, in "text" (PROTOCOL.md HEARTBEAT) */
#define PS_F_PIECE (1ull << 44)  /* "piece": values a piece of a BSP round that closes piece
                                  * by piece (welcome; PROTOCOL.md section 8) */
/* tables (PROTOCOL.md 13) */
#define PS_F_TAB (1ull << 45)    /* "tab": a table's name */
#define PS_F_DIM (1ull << 46)    /* "dim": values per row (table) */
#define PS_F_RINIT (1ull << 47)  /* "rinit": row initializer name (table) */
#define PS_F_SCALE (1ull << 48)  /* "scale": the initializer's bound or std (table) */
#define PS_F_SEED (1ull << 49)   /* "seed": the table's seed (table) */
#define PS_F_OPT (1ull << 50)    /* "opt": the table's optimizer name (table) */
#define PS_F_HP (1ull << 51)     /* "hp": its hyper-parameters (table; ps_hp) */
#define PS_F_KEYS (1ull << 52)   /* "keys": uint64 keys (tpull, tpush, tpushpull) */
#define PS_F_PKEYS (1ull << 53)  /* "pkeys": the keys a tpushpull pulls */
#define PS_F_PART (1ull << 54)   /* "part": [i, n], the table's part this psd holds (table) */
#define PS_F_LOCAL (1ull << 55)  /* "local": local SGD's steps between rounds (welcome) */
#define PS_F_ALPHA (1ull << 56)  /* "alpha": elastic averaging's alpha (welcome) */
#define PS_F_TAU (1ull << 57)    /* "tau": local steps between elastic exchanges (welcome) */
/* Hogwild! (PROTOCOL.md section 8) */
#define PS_F_HOGWILD (1ull << 58) /* "hogwild": [pid, fd] of psd's model segment (welcome) */
#define PS_F_LR (1ull << 59)     /* "lr": the step size a Hogwild! worker applies (welcome) */
/* tables through shared memory (PROTOCOL.md 13.9) */
#define PS_F_TSHM (1ull << 60)   /* "tshm": [pid, fd] of the worker's table segment (hello) */
#define PS_F_TINSHM (1ull << 61) /* "tinshm": psd mapped that segment (welcome) */
#define PS_F_SEG (1ull << 62)    /* "seg": [at, n, m, rat], a table request in that segment
                                  * (tpull, tpush, tpushpull) */
#define PS_F_COUNT 63            /* fields in all: bits 0..PS_F_COUNT-1 */

/* Presence bits of the second word (ps_msg.has2): replicas and pushes
 * applied once (PROTOCOL.md 15). */
#define PS_F2_CID (1ull << 0)      /* "cid": the client's identity, not 0 (hello) */
#define PS_F2_PID (1ull << 1)      /* "pid": the push's number, not 0 (push, pushpull,
                                    * tpush, tpushpull) */
#define PS_F2_LEADER (1ull << 2)   /* "leader": "HOST:PORT" of the leader (error
                                    * NOT_LEADER) */
#define PS_F2_REPLICAS (1ull << 3) /* "replicas": the part's "HOST:PORT"s, leader first
                                    * (welcome) */
#define PS_F2_READER (1ull << 4)   /* "reader": the client only pulls, from any replica
                                    * (hello) */
#define PS_F2_LAG (1ull << 5)      /* "lag": bytes of its leader's log a follower has not
                                    * applied (params, rows) */
#define PS_F2_PMAP (1ull << 6)     /* "pmap": [epoch, dense, [HOST:PORT, ...]], the job's
                                    * part map (welcome; error MOVED; PROTOCOL.md 18) */
#define PS_F2_COUNT 7

/* Element types of tensor data on the wire. f32 is always understood; a
 * client uses another only after psd's WELCOME listed it in "wire". */
typedef enum ps_dtype {
    PS_DT_F32 = 0,  /* float32, little-endian */
    PS_DT_BF16 = 1, /* bfloat16 (a float32's top 16 bits), little-endian */
    PS_DT_F32Z = 2, /* float32 with its zeros left out: a bitmap of the "len"
                     * values, then the ones that are not +0.0 (sent to psd
                     * only; PROTOCOL.md section 3) */
    PS_DT_F32ZSTD = 3, /* float32 compressed: one zstd frame of the "len" values'
                        * bytes (sent to psd only; section 3) */
    PS_DT_MAX = 3
} ps_dtype;
#define PS_WIRE_BIT(dt) (1ull << (dt))

/* Bytes per element of dtype dt (per stored value for PS_DT_F32Z). */
static inline size_t ps_dtype_size(uint32_t dt)
{
    return dt == PS_DT_BF16 ? 2 : 4;
}

/* Bytes of the bitmap of n values in PS_DT_F32Z data: a bit per value,
 * rounded up to whole 32-bit words so that the values after it stay
 * aligned to 4. */
static inline uint64_t ps_f32z_mask_bytes(uint64_t n)
{
    return (n + 31) / 32 * 4;
}
const char *ps_dtype_name(uint32_t dt);

#define PS_AUTH_NONCE_LEN 32 /* bytes of "nonce" and "cnonce" */
#define PS_AUTH_MAC_LEN 32   /* bytes of "proof" and "sproof" (HMAC-SHA256) */

#define PS_CMD_MAX 31        /* bytes in an admin command name */
#define PS_ARGS_MAX 16       /* arguments of one admin command */
#define PS_ARG_MAX 1024      /* bytes in one argument */

#define PS_REPLICAS_MAX 8    /* addresses in "replicas" (a part's leader and followers) */
#define PS_ADDR_MAX 255      /* bytes in one "HOST:PORT" ("leader", "replicas") */

/* A BSP job's plan (PROTOCOL.md 8, "The plan"): `epochs` passes over
 * `samples` training samples, `batch` of them (the global batch) per
 * round, in an order seeded by `seed` and the epoch. */
typedef struct ps_plan {
    uint64_t epochs;   /* 1..PS_PLAN_EPOCHS_MAX */
    uint64_t samples;  /* 1..PS_PLAN_SAMPLES_MAX */
    uint64_t batch;    /* 1..samples */
    uint64_t seed;     /* any */
} ps_plan;
#define PS_PLAN_EPOCHS_MAX (1ull << 20)
#define PS_PLAN_SAMPLES_MAX (1ull << 40)

/* The samples a worker trains in the round a PARAMS opens: positions
 * [lo, hi) of epoch `epoch`'s order, its part `rank` of `count`. */
typedef struct ps_slice {
    uint64_t epoch;    /* from 0 */
    uint64_t lo, hi;   /* lo <= hi <= the plan's samples */
    uint32_t rank, count; /* rank < count <= 65536 */
} ps_slice;

/* "keys" or "pkeys": n little-endian uint64 keys, 8 bytes each, maybe
 * unaligned (read them with ps_key_at()); 1..PS_TABLE_KEYS_MAX of them. */
typedef struct ps_keys {
    const uint8_t *p;
    uint32_t n;
} ps_keys;

/* A process's file, as /proc/<pid>/fd/<fd> ("hogwild", "tshm"):
 * 0 < pid < 2^31, fd < 2^31. */
typedef struct ps_pidfd {
    uint32_t pid, fd;
} ps_pidfd;

/* "seg": a table request in the worker's table segment (PROTOCOL.md
 * 13.9), byte offsets at and rat multiples of 8 below PS_TSEG_MAX: from
 * at, the n keys (8 bytes each), for a push their n x dim float32 row
 * gradients, for a tpushpull then the m keys it pulls; the rows pulled
 * written from rat. 1 <= n, m <= PS_TABLE_KEYS_MAX; m 0 but in a tpushpull. */
typedef struct ps_seg {
    uint64_t at, rat;
    uint32_t n, m;
} ps_seg;

/* A string that is not NUL-terminated (admin arguments). */
typedef struct ps_str {
    const char *p;
    uint32_t len;
} ps_str;

/* A job's part map (PROTOCOL.md 18): parts n, in part order, of which the
 * first `dense` hold the dense model's range split (section 6.2 with n =
 * dense) and all hold the tables' rows by key (13.7); epoch 0 is the map
 * the job started with, each move of parts makes the next. */
typedef struct ps_pmap {
    uint64_t epoch;
    uint32_t dense, n;      /* 1 <= dense <= n <= PS_PARTS_MAX */
    ps_str addrs[PS_PARTS_MAX];
} ps_pmap;

/* One decoded (or to-be-encoded) message. Pointers (data, text, body, args)
 * point into the frame buffer or the unpack zone the decoder was given and
 * live as long as those; for encoding they point at the caller's memory. */
typedef struct ps_msg {
    uint32_t type;          /* ps_msg_type */
    uint64_t has;           /* PS_F_* bits of the fields present */
    uint64_t has2;          /* PS_F2_* bits of the fields present */
    uint64_t id;            /* request id, echoed in the reply */
    uint32_t proto;         /* "v": protocol version */
    uint32_t role;          /* "role": ps_role */
    uint32_t shard, nshards; /* "shard": [k, m] */
    ps_layout *layout;      /* "layout": decoded into caller storage (may be NULL) */
    uint64_t fp;            /* "fp": layout fingerprint */
    char mode[16];          /* "mode": "asgd", "bsp", ... (NUL-terminated) */
    uint64_t mver;          /* "ver": model version */
    uint64_t params;        /* "params": elements in the flat vector */
    uint32_t workers;       /* "workers": M */
    int need_init;          /* "init" */
    uint64_t off, len;      /* "off", "len": key range, in elements */
    const float *data;      /* "data": ndata float32 values (dt == PS_DT_F32) */
    const uint16_t *data16; /* "data": ndata bfloat16 values (dt == PS_DT_BF16); data is NULL then */
    const uint8_t *packed;  /* "data" of a packed type, packed_len bytes (data and data16 are
                             * NULL then): dt PS_DT_F32Z, the bitmap of ndata values (bit i of
                             * byte i / 8 set: value i is stored), then nz float32 values;
                             * dt PS_DT_F32ZSTD, one zstd frame of the ndata float32 values */
    uint64_t packed_len;
    uint64_t nz;            /* PS_DT_F32Z: values stored after the bitmap (its bits set) */
    uint64_t ndata;
    uint32_t dt;            /* "dt": ps_dtype of data (PS_DT_F32 when absent) */
    uint32_t rdt;           /* "rdt": ps_dtype wanted for the reply's data */
    uint64_t wire;          /* "wire": PS_WIRE_BIT()s of the dtypes psd accepts */
    uint32_t shm_pid, shm_fd; /* "shm": a sealed memfd, as /proc/<pid>/fd/<fd> */
    int shm_at;             /* "shm" has its 3rd and 4th elements: */
    uint64_t shm_goff, shm_poff; /* where in it (in values) the gradient and the
                             * parameters lie; without them 0 and the model's size */
    int inshm;              /* "inshm" */
    ps_pidfd hw;            /* "hogwild": psd's model segment */
    ps_pidfd tshm;          /* "tshm": the worker's table segment, a sealed memfd */
    int tinshm;             /* "tinshm": psd mapped it */
    ps_seg seg;             /* "seg": the table request lies in that segment */
    double lr;              /* "lr": the Hogwild! workers' step size */
    int fin;                /* "fin": last chunk of this step (default 1) */
    uint64_t min;           /* "min": pull at model version >= min */
    uint64_t base;          /* "base": model version a push was computed on */
    uint64_t poff, plen;    /* "poff", "plen": pull range of a pushpull */
    int32_t code;           /* "code": PS_E* made positive */
    const char *text;       /* "text": error message or metrics text */
    uint32_t text_len;
    const msgpack_object *body; /* "body": status map (decode only) */
    uint32_t epoch;         /* "epoch" */
    double loss, acc, tloss; /* "loss", "acc", "tloss" */
    double rate;            /* "rate": samples per second */
    uint64_t samples;       /* "samples" */
    uint64_t hb;            /* "hb": psd's heartbeat timeout in ms */
    uint64_t piece;         /* "piece": values a piece of a BSP round (welcome) */
    uint32_t local;         /* "local": local SGD's H (welcome; PROTOCOL.md section 8) */
    double alpha;           /* "alpha": elastic averaging's alpha (welcome) */
    uint32_t tau;           /* "tau": its local steps between exchanges (welcome) */
    char cmd[PS_CMD_MAX + 1]; /* "cmd": admin command, 1..PS_CMD_MAX bytes (NUL-terminated) */
    ps_str args[PS_ARGS_MAX]; /* "args": admin arguments, nargs of them, each a
                               * str of 0..PS_ARG_MAX bytes */
    uint32_t nargs;
    uint8_t nonce[PS_AUTH_NONCE_LEN];  /* "nonce": psd's challenge (CHALLENGE) */
    uint8_t cnonce[PS_AUTH_NONCE_LEN]; /* "cnonce": the client's nonce (AUTH) */
    uint8_t proof[PS_AUTH_MAC_LEN];    /* "proof": HMAC by the client (AUTH) */
    uint8_t sproof[PS_AUTH_MAC_LEN];   /* "sproof": HMAC by psd (WELCOME) */
    ps_plan plan;           /* "plan": [epochs, samples, batch, seed] */
    ps_slice slice;         /* "slice": [epoch, lo, hi, rank, count] */
    int done;               /* "done" */
    int wait;               /* "wait" */
    char tab[PS_NAME_MAX + 1]; /* "tab": a table's name, 1..63 bytes (NUL-terminated) */
    uint32_t dim;           /* "dim": values per row */
    char rinit[16];         /* "rinit": "zeros", "uniform" or "normal" (NUL-terminated) */
    double scale;           /* "scale" */
    uint64_t seed;          /* "seed" */
    char opt[16];           /* "opt": "sgd", "adagrad", "adam" or "ftrl" (NUL-terminated) */
    ps_hp hp;               /* "hp": the hyper-parameters sent */
    ps_keys keys;           /* "keys" */
    ps_keys pkeys;          /* "pkeys" */
    uint32_t part, nparts;  /* "part": [i, n], 0 <= i < n <= PS_PARTS_MAX (table) */
    uint64_t cid;           /* "cid": the client's identity (hello), not 0 */
    uint64_t pid;           /* "pid": the push's number (push, pushpull, tpush,
                             * tpushpull), not 0 */
    ps_str leader;          /* "leader": "HOST:PORT", 1..PS_ADDR_MAX bytes */
    ps_str replicas[PS_REPLICAS_MAX]; /* "replicas": nreplicas "HOST:PORT"s */
    uint32_t nreplicas;
    int reader;             /* "reader": a read-only client (hello) */
    uint64_t lag;           /* "lag": bytes of the leader's log not applied (params, rows) */
    ps_pmap pmap;           /* "pmap": the job's part map */
} ps_msg;

/* 1 for the table messages (TABLE, TPULL, TPUSH, TPUSHPULL, ROWS). */
static inline int ps_msg_is_table(uint32_t type)
{
    return type >= PS_MSG_TABLE && type <= PS_MSG_ROWS;
}

/* The first byte of m's tensor data, whichever its element type. */
/* 1 for the element types whose data is not one value after another:
 * m->packed holds it, packed_len bytes for ndata values. */
static inline int ps_dtype_packed(uint32_t dt)
{
    return dt == PS_DT_F32Z || dt == PS_DT_F32ZSTD;
}

static inline const void *ps_msg_data_bytes(const ps_msg *m)
{
    if (ps_dtype_packed(m->dt))
        return m->packed;
    return m->dt == PS_DT_BF16 ? (const void *)m->data16 : (const void *)m->data;
}

/* The bytes of m's tensor data on the wire, whichever its element type. */
static inline uint64_t ps_msg_data_len(const ps_msg *m)
{
    if (ps_dtype_packed(m->dt))
        return m->packed_len;
    return m->ndata * ps_dtype_size(m->dt);
}

/* A growable byte buffer, used for encoding. */
typedef struct ps_buf {
    uint8_t *p;
    size_t len, cap;
} ps_buf;

void ps_buf_free(ps_buf *b);
int ps_buf_reserve(ps_buf *b, size_t extra);
/* Appends printf-formatted text (no terminating NUL counted in len),
 * growing the buffer as needed. 0, PS_ENOMEM or PS_EIO (a bad format). */
int ps_buf_printf(ps_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A msgpack_packer's write callback appending to the ps_buf in data: 0, or
 * -1 when out of memory. */
int ps_buf_write(void *data, const char *p, size_t len);

/* Map entries for the encoders of psd's replies, checkpoints and the like:
 * a key, and a key with its value. */
void ps_pack_key(msgpack_packer *pk, const char *k);
void ps_pack_kstr(msgpack_packer *pk, const char *k, const char *v);
/* A table's declaration as PS_TABLE_DEF_KEYS entries of a map the caller
 * opened (name, dim, rinit, scale, seed, opt, and hp: a map of the
 * optimizer's hyper-parameters): how STATUS and a checkpoint state it. */
#define PS_TABLE_DEF_KEYS 7
void ps_pack_table_def(msgpack_packer *pk, const ps_table_def *d);
void ps_pack_ku64(msgpack_packer *pk, const char *k, uint64_t v);
void ps_pack_kf64(msgpack_packer *pk, const char *k, double v);

/* 1 when only psd sends messages of this type (dir S in messages.def:
 * WELCOME, PARAMS, OK, STATUS_REPLY, METRICS_REPLY, ERROR, CHALLENGE,
 * ROWS): psd answers one from a client with BAD_TYPE, whatever its fields. */
int ps_msg_from_server_only(uint32_t type);
/* Who sends messages of this type (messages.def); PS_DIR_NONE for a
 * number that is no type. */
ps_msg_dir ps_msg_type_dir(uint32_t type);
/* The PS_F_* fields a message of this type must carry (messages.def); 0
 * for a number that is no type. */
uint64_t ps_msg_required(uint32_t type);

/* Name of a message type for logs ("push"); "?" if unknown. */
const char *ps_msg_type_name(uint32_t type);
const char *ps_role_name(uint32_t role);

/* Resets m to an empty message of the given type (fin = 1, everything else 0). */
void ps_msg_init(ps_msg *m, uint32_t type);

/* Encodes m as one frame into out (replacing its contents): the length prefix
 * and the msgpack map, EXCEPT the tensor bytes when m has PS_F_DATA: then
 * out ends with the bin header and the caller must send the m->ndata
 * elements of m->data (m->data16 when m->dt is PS_DT_BF16) right after it.
 * The length prefix already counts them.
 * *data_len (if not NULL) receives the number of tensor bytes to follow.
 * If `body` is given (status replies), it is called to pack the body map.
 * Returns 0 or PS_ENOMEM / PS_ETOO_BIG. */
typedef int (*ps_body_fn)(msgpack_packer *pk, void *arg);
int ps_msg_encode(const ps_msg *m, ps_buf *out, size_t *data_len, ps_body_fn body, void *body_arg);

/* Encodes m as one frame with the tensor bytes included (a whole frame in
 * out). For clients and tests; servers use ps_msg_encode and scatter/gather. */
int ps_msg_encode_full(const ps_msg *m, ps_buf *out);

/* A layout in msgpack, as a hello's "layout" and psd's checkpoint header
 * carry it (PROTOCOL.md): an array of [name, [dims...]], one per tensor.
 * ps_layout_unpack checks every entry (1..PS_TENSORS_MAX tensors, a name of
 * 1..PS_NAME_MAX bytes without NUL, rank 1..PS_DIMS_MAX, positive
 * dimensions) and returns 0 or PS_EBAD_FIELD with the reason in err. */
void ps_layout_pack(msgpack_packer *pk, const ps_layout *l);
int ps_layout_unpack(const msgpack_object *o, ps_layout *l, char *err, size_t errlen);

/* The value of string key `key` in msgpack map `map`, or NULL (also when
 * map is NULL or not a map). For reading status bodies and checkpoint
 * headers. */
const msgpack_object *ps_map_get(const msgpack_object *map, const char *key);

/* Decodes one frame payload (without the 4-byte prefix). Runs ps_scan with
 * lim first, then unpacks into zone (which the caller clears between
 * messages) and checks every field's type and the fields the message type
 * requires. layout_out receives a HELLO's layout (may be NULL otherwise).
 * payload is written to only to align tensor data (see top of file).
 * Returns 0 or PS_EMALFORMED / PS_EBAD_TYPE / PS_EBAD_FIELD / PS_EUNSUPPORTED
 * with a readable reason in err. */
int ps_msg_decode(uint8_t *payload, size_t len, const ps_scan_limits *lim, msgpack_zone *zone,
                  ps_msg *out, ps_layout *layout_out, char *err, size_t errlen);

#endif
