/* msg_fields.h - inside proto/: the table of every message field, which
 * drives the encoder (msg_encode.c), the decoder (msg_decode.c) and the
 * names in error messages (msg.c defines it). Not for use outside proto/. */
#ifndef PS_MSG_FIELDS_H
#define PS_MSG_FIELDS_H

#include <stddef.h>

#include "msg.h"

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
    FK_PIDFD,  /* ps_pidfd, [pid, fd] */
    FK_SEG,    /* ps_seg, [at, n, m, rat] */
    FK_PLAN,   /* plan, [epochs, samples, batch, seed] */
    FK_SLICE,  /* slice, [epoch, lo, hi, rank, count] */
    FK_ARGS,   /* args and nargs, an array of strings */
    FK_BODY,   /* body, a map (packed by the caller's callback) */
    FK_KEYS,   /* ps_keys, a bin of 1..PS_TABLE_KEYS_MAX little-endian uint64 */
    FK_HP,     /* ps_hp, a map of hyper-parameter names to finite numbers */
    FK_DATA,   /* data or data16 and ndata, a bin after "pad" */
    FK_ADDR,   /* ps_str, a string of 1..PS_ADDR_MAX bytes */
    FK_PMAP,   /* pmap: [epoch, dense, [1..PS_PARTS_MAX FK_ADDR strings]] */
    FK_ADDRS,  /* replicas and nreplicas, an array of 1..PS_REPLICAS_MAX FK_ADDR strings */
};

typedef struct field {
    const char *key;
    uint64_t bit;
    enum field_kind kind;
    size_t off;        /* offsetof(ps_msg, ...) of the value, for the plain kinds */
    size_t size;       /* FK_NAME, FK_BIN: bytes of the array */
    const char *bad;   /* FK_NAME: what the error says it must be */
    int word;          /* bit is in has (0) or has2 (1) */
} field;

extern const field ps_msg_fields[];
#define NFIELDS ((size_t)PS_F_COUNT + PS_F2_COUNT)

/* m has field f. */
#define HAS_FIELD(m, f) ((((f)->word ? (m)->has2 : (m)->has) & (f)->bit) != 0)

#define AT(m, f, type) ((type *)(void *)((char *)(m) + (f)->off))
#define AT_C(m, f, type) ((const type *)(const void *)((const char *)(m) + (f)->off))

/* The key of field bit on the wire, "?" for none. */
const char *ps_msg_field_name(uint64_t bit);

#endif
