/* records.h - the replication log's records and a fetch's answer as bytes
 * (PROTOCOL.md 17), for the files of replog/ alone: the kinds, the sizes,
 * little-endian integers in and out. */
#ifndef SRV_REPLOG_RECORDS_H
#define SRV_REPLOG_RECORDS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "server/model/optim.h"

/* Record kinds (the byte after a record's length). */
enum {
    REC_LAYOUT = 'L', /* the dense layout: a HELLO message's msgpack bytes with "layout" */
    REC_DENSE = 'D',  /* a mark (never shipped): version, initialised, off, n */
    REC_ROWS = 'T',   /* table, n, scale, keys, row gradients */
    REC_TABLE = 'N',  /* a table declared */
    REC_BOUNDS = 'B', /* the tables' bounds and memory cap */
    REC_PUSHID = 'P', /* a client's push id applied: cid, pid */
    REC_MOVE = 'M',   /* a move of parts' change here: what, a, b, bytes (dispatch/move_state.c) */
    REC_PLAN = 'Q',   /* a bsp job's plan fixed: epochs, samples, batch, seed */
    REC_GRAD = 'G',   /* a dense push's gradient: version, off, n, flags, gmax, n floats */
    REC_OPTIM = 'O',  /* the dense optimizer's settings and psd's release, before a gradient when they changed */
};
#define GRAD_HEAD (8 + 8 + 8 + 4 + 4) /* a gradient record's bytes before its floats */
#define RELEASE_BYTES 16 /* an `O` record's psd release after the settings (NUL-padded) */
#ifndef PSD_VERSION
#define PSD_VERSION "unknown"
#endif
#define GRAD_HAS_GMAX 1u   /* flags: gmax bounds every |g[i]| */
#define GRAD_FROM_FIRST 2u /* the push came from shard 0 ("first" buffers take it) */
#define GRAD_CLIP 4u       /* nonfinite = clip on the leader */
#define STATE_MAX 4
#define DENSE_MARK 28 /* a dense mark's bytes after its kind: version, initialised, off, n */
#define ANSWER_BLOCKS 16 /* dense blocks a fetch's answer carries at most (64 MiB of parameters) */
#define DENSE_PIECE (ANSWER_BLOCKS * SRV_BLK_FLOATS) /* values a dense mark covers at most */
#define HEAD_FIXED 36 /* an answer's head before its block indices (PROTOCOL.md 17) */
#define LOG_MAX_DEFAULT ((size_t)1 << 30) /* 1 GiB of records kept for a follower behind */
#define PIECE_MAX ((size_t)1 << 20) /* a piece's room at most (a bigger record gets a piece of its own) */

struct srv_replog;
/* The bytes at offset off of the log (position base + off, a record's
 * start or inside one, before the log's end); replog.c. */
const uint8_t *srv_replog_at(const struct srv_replog *r, size_t off);
/* The block the bytes at offset off lie in (its piece's), and the bytes
 * of that piece from there on. */
struct srv_blk *srv_replog_owner(const struct srv_replog *r, size_t off, size_t *left);

static inline void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void put_f64(uint8_t *p, double v) { memcpy(p, &v, 8); }
static inline uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline double get_f64(const uint8_t *p) { double v; memcpy(&v, p, 8); return v; }

#endif
