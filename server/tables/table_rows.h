/* table_rows.h - private to tables/: the layout of one table (its slots,
 * blocks of rows and their clocks) that table.c (the row store: declare,
 * pull, push, pin), table_mem.c (a table's memory: growing, trimming,
 * removing a row), bounds.c (what bounds a table's rows: admission,
 * expiry, eviction, making room), table_whole.c (a table read or loaded
 * whole) and table_snap.c (a snapshot read while pushes go on) share.
 * Nothing outside tables/ includes it: the others see the tables through
 * table.h. */
#ifndef SRV_TABLES_TABLE_ROWS_H
#define SRV_TABLES_TABLE_ROWS_H

#include <stdint.h>
#include <string.h>

#include "proto/errors.h"
#include "server/config/config.h"
#include "server/tables/sparse_optim.h"
#include "server/tables/table.h"

#define SLOTS_MIN 1024u             /* a table's first slot array */
#define SLOTS_MAX (1ull << 32)      /* the most slots a table has: a slot holds a row + 1 in 32 bits */
#define BLOCK_BYTES_MAX (256u << 10) /* rows per block: as many as fit, a power of two, at least 1 */
/* at most 5/8 of the slots in use: linear probing stays short */
#define LOAD_NUM 5u
#define LOAD_DEN 8u
/* A hash slot is 4 bytes: the row index + 1 in its low log2(cap) bits (0:
 * the slot is empty; rows < 5/8 cap, so it fits) and, in the bits left
 * over, a tag: as many high bits of the key's hash (8 at 2^24 slots, none
 * at 2^32). A probe compares tags; only a slot whose tag matches has its
 * row's key compared, which a push or a pull reads anyway, so a match costs
 * no extra cache miss and a key not stored rarely reads a row. */
typedef uint32_t slot;
#define SLOT_BYTES sizeof(slot)
/* a row in its block: its key (2 floats' room), then its row_floats values */
#define HEAD 2u
/* admission's count-min sketch: SKETCH_D rows of SKETCH_W 8-bit counters */
#define SKETCH_D 4u
#define SKETCH_W 262144u
#define SKETCH_BYTES (SKETCH_D * SKETCH_W)
/* admission's ageing (TinyLFU's reset): every SKETCH_AGE counted pushes
 * each counter halves, so the counts are of the recent stream and the
 * counters never all fill up (without it, once a few hundred thousand
 * keys were counted, every key was admitted at its first push) */
#define SKETCH_AGE SKETCH_W
/* expiry: rows a push's scan looks at, at least */
#define EXPIRE_WINDOW 1024u
/* eviction: rows drawn to find one of the least recently pushed */
#define EVICT_SAMPLE 8u

struct srv_table {
    ps_table_def def;
    uint32_t row_floats;   /* weights, state, step: srv_sparse_row_floats */
    uint32_t stride;       /* floats of one row in a block: HEAD and row_floats */
    slot *slots;           /* the hash table: cap slots */
    uint64_t cap;          /* slots: 0 or a power of two, at most SLOTS_MAX */
    uint32_t rmask;        /* cap - 1: a slot's bits that hold its row + 1; the others hold its tag */
    uint64_t rows;         /* rows stored, rows 0..rows-1 */
    float **blocks;        /* row r lies in blocks[r >> shift], at (r & mask) x stride */
    uint64_t **stamps;     /* row r's clock at its last push: stamps[r >> shift][r & mask]; NULL while no
                            * bound reads it (expiry, eviction), else one array per block */
    uint32_t nblocks, blocks_cap;
    uint32_t shift;        /* rows per block: 1 << shift */
    uint64_t bytes;        /* what this table takes: itself, slots, blocks, stamps, the block lists */
    uint64_t pulled, pushed;
    uint64_t last_pulled, last_pushed; /* at the last srv_tables_rates */
    uint64_t clock;        /* pushes applied to the table; a row keeps the clock of its last */
    uint8_t *sketch;       /* admission's counters (SKETCH_BYTES); NULL until admission is on */
    uint32_t sketch_adds;  /* pushes counted since the counters last halved */
    uint64_t scan;         /* expiry: the row the next scan starts at */
    uint64_t rng;          /* eviction's draws (xorshift64) */
    uint64_t admitted, filtered, expired, evicted;
    double pull_rate, push_rate;
    struct tbl_snap *snap; /* a snapshot being read (srv_tables_snap_begin); NULL: none */
    srv_tables *mv;        /* the tables, while rows move to other parts (table_move.c); NULL: none */
};

/* ---- table_mark.c and table_move.c: rows leaving for other parts ---- */

/* A set of (table, key) for one destination: open addressing, at most half
 * full. */
struct tbl_dirty {
    uint64_t *keys;
    uint32_t *tab;   /* table + 1; 0: an empty slot */
    uint64_t cap, n;
};

struct srv_tables_move {
    uint32_t new_n;
    int32_t self;                 /* this psd's index in the new map; -1: none */
    uint64_t cur[PS_PARTS_MAX][PS_TABLES_MAX]; /* the pass: each destination's next row per table */
    uint32_t at[PS_PARTS_MAX];    /* the table its pass is in */
    struct tbl_dirty d[PS_PARTS_MAX]; /* keys changed since the move began */
};

/* The part of key under the new map. */
uint32_t tbl_move_dest(const struct srv_tables_move *mv, uint64_t key);
/* Puts (table, key) into s; 0, or -1 out of memory. */
int tbl_dirty_put(struct tbl_dirty *s, uint32_t table, uint64_t key);
/* s again from its keys left, after some were taken out of it (their slots
 * emptied out of probe order); out of memory fails the move. */
void tbl_move_rebuild(srv_tables *ts, struct tbl_dirty *s);

/* Marks key (a row of t that changes, appears, goes or moves) for its
 * destination when it is a moving key: what every change of a row calls
 * while rows move, through move_touch. */
void tbl_move_touch(srv_tables *ts, const srv_table *t, uint64_t key);

static inline void move_touch(const srv_table *t, uint64_t key)
{
    if (__builtin_expect(t->mv != NULL, 0))
        tbl_move_touch(t->mv, t, key);
}

/* ---- table_snap.c: a snapshot read block by block while pushes go on ---- */

/* Keeps row r as the snapshot saw it, when the snapshot has not read it
 * yet: what every write to a row's memory (its values, key or clock) and
 * every free of a block calls first, through snap_touch. */
void tbl_snap_keep(srv_table *t, uint64_t r);

/* Every row the snapshot has not read yet kept: before the rows' clocks
 * are freed. */
void tbl_snap_keep_all(srv_table *t);

/* Frees t's part of a snapshot (the table itself is going). */
void tbl_snap_drop(srv_table *t);

/* Frees the tables' snapshot, each table's part too (the tables are going). */
void tbl_snaps_free(srv_tables *ts);

static inline void snap_touch(srv_table *t, uint64_t r)
{
    if (__builtin_expect(t->snap != NULL, 0))
        tbl_snap_keep(t, r);
}

static inline float *row_at(const srv_table *t, uint64_t r)
{
    return t->blocks[r >> t->shift] + (r & ((1ull << t->shift) - 1)) * t->stride;
}

static inline uint64_t *stamp_at(const srv_table *t, uint64_t r)
{
    return t->stamps[r >> t->shift] + (r & ((1ull << t->shift) - 1));
}

static inline uint64_t row_key(const float *p)
{
    uint64_t k;
    memcpy(&k, p, sizeof k);
    return k;
}

/* The key of row r. */
static inline uint64_t key_of(const srv_table *t, uint64_t r)
{
    return row_key(row_at(t, r));
}

/* A slot's tag for a key of hash h in an array of cap slots (rmask =
 * cap - 1): the high bits of h where the slot holds no row index. */
static inline uint32_t tag_of(uint64_t h, uint32_t rmask)
{
    return (uint32_t)(h >> 32) & ~rmask;
}

/* The row index + 1 of key, or 0 when the table does not hold it: the
 * probe from key's home slot on, comparing the key of each row whose tag
 * matches. */
static inline uint64_t lookup(const srv_table *t, uint64_t key)
{
    if (t->cap == 0)
        return 0;
    const uint64_t h = ps_mix64(key);
    const uint32_t rmask = t->rmask, tag = tag_of(h, rmask);
    for (uint64_t s = h & (t->cap - 1);; s = (s + 1) & (t->cap - 1)) {
        slot v = t->slots[s];
        if (v == 0)
            return 0;
        if ((v & ~rmask) == tag && key_of(t, (v & rmask) - 1) == key)
            return v & rmask;
    }
}

/* Puts key -> row index r into slots (cap of them) that have room (no key
 * twice). */
static inline void slot_put(slot *slots, uint64_t cap, uint64_t key, uint64_t r)
{
    uint64_t h = ps_mix64(key), s = h & (cap - 1);
    while (slots[s] != 0)
        s = (s + 1) & (cap - 1);
    slots[s] = tag_of(h, (uint32_t)(cap - 1)) | (uint32_t)(r + 1);
}

/* Appends key's row (values: row_floats) as row t->rows, pushed at clock
 * `stamp`; tbl_reserve() made room. */
static inline void append(srv_table *t, uint64_t key, uint64_t stamp, const void *values)
{
    snap_touch(t, t->rows);
    move_touch(t, key);
    uint64_t r = t->rows++;
    float *p = row_at(t, r);
    memcpy(p, &key, sizeof key);
    memcpy(p + HEAD, values, sizeof(float) * t->row_floats);
    if (t->stamps)
        *stamp_at(t, r) = stamp;
    slot_put(t->slots, t->cap, key, r);
}

int tbl_room_grow(float **p, size_t *have, size_t floats);

static inline int room(float **p, size_t *have, size_t floats)
{
    return floats <= *have ? 0 : tbl_room_grow(p, have, floats);
}

/* Whether the bounds read the rows' clocks: expiry and eviction do. */
static inline int need_stamps(const srv_table_bounds *b)
{
    return b->expire != 0 || b->full == PS_TABLE_FULL_EVICT;
}

/* ---- table_mem.c: a table's memory ---- */

size_t page_bytes(void);

/* A block as it is mapped: its rows rounded up to whole pages (a block is
 * mapped on its own, so that no allocator header pushes it one page past
 * its rows). */
uint64_t tbl_block_bytes(const srv_table *t);

/* One block's stamps. */
uint64_t tbl_stamp_block_bytes(const srv_table *t);

float *tbl_block_new(const srv_table *t);

void tbl_block_free(const srv_table *t, float *b);

/* What holding `rows` rows takes: slots, blocks and the block list, in the
 * sizes srv_table grows them to. */
void tbl_plan_size(const srv_table *t, uint64_t rows, uint64_t *cap, uint32_t *nblocks, uint32_t *blocks_cap);

/* What the table takes with cap slots, nblocks blocks (and as many stamp
 * arrays when `stamped`) and block lists of blocks_cap. */
uint64_t tbl_size_of(const srv_table *t, uint64_t cap, uint32_t nblocks, uint32_t blocks_cap, int stamped);

/* What a new table takes with its first row (and admission's counters, and
 * the row's stamp). */
uint64_t tbl_first_row_bytes(const srv_table *t, int sketch, int stamped);

void tbl_count_bytes(srv_tables *ts, srv_table *t);

/* Makes room for `rows` rows: slots (rehashed into a larger array), blocks
 * (and their stamps while the table holds stamps) and the block lists.
 * Returns 0 or PS_ENOMEM, the table then unchanged but for capacity it
 * kept. Updates t->bytes and ts->bytes. */
int tbl_reserve(srv_tables *ts, srv_table *t, uint64_t rows);

/* Frees the blocks (and stamps) past those `rows` rows need: after rows
 * were removed to make room. */
void tbl_trim(srv_tables *ts, srv_table *t, uint64_t rows);

/* The slot that holds row r, whose key is key. */
uint64_t tbl_slot_find(const srv_table *t, uint64_t key, uint64_t r);

/* Removes row r: its key leaves the slots (the probe chain after it shifted
 * back, so every key stays reachable) and the last row (and its stamp)
 * moves into its place. */
void tbl_row_remove(srv_table *t, uint64_t r);

/* Room for `floats` floats in *p (*have of them now), at least doubled
 * when it grows, so that a push grows it a few times at most. */
int tbl_room_grow(float **p, size_t *have, size_t floats);

/* Room for the found rows of a push of n keys (scratch grows as the push
 * finds new rows; undo takes n rows at the push's start, so that its loop
 * does not ask for room at every row: the two take one to two copies of
 * the push's rows). */
int tbl_grow_scratch(srv_tables *ts, size_t n);

/* ts->found's mark of a key skipped by admission (tbl_push_room, the push) */
extern float tbl_not_admitted;

/* ---- bounds.c: admission, expiry, eviction, room ---- */

void srv_tables_set_limit(srv_tables *ts, uint64_t max_bytes);

void srv_tables_set_bounds(srv_tables *ts, const srv_table_bounds *b);

void srv_tables_configure(srv_tables *ts, const ps_config *cfg);

/* Admission: counts one push of key in the table's sketch (conservative
 * update: only the smallest counters grow) and returns 1 when the key has
 * now been pushed `admit` times (or more: collisions overcount), counts
 * halving every SKETCH_AGE counted pushes. */
int tbl_sketch_admit(srv_table *t, uint64_t key, uint32_t admit);

/* Expiry: looks at `window` rows, downward from the scan's place (wrapping
 * to the last row), and removes those not pushed in the last `expire`
 * pushes. Going down, the last row that moves into a removed one's place
 * was looked at already in this pass (or was added since, so is fresh). A
 * window of every row is one exact pass from the last row down. */
void tbl_expire_scan(srv_table *t, uint64_t now, uint64_t expire, uint64_t window);

uint64_t tbl_xorshift(uint64_t *s);

/* Eviction: removes e rows, each the least recently pushed of EVICT_SAMPLE
 * drawn at random, never one pushed at clock `now` (this push's). The
 * caller checked that e rows older than now exist. */
void tbl_evict(srv_table *t, uint64_t e, uint64_t now);

/* The largest number of rows table t may hold within `allowed` bytes, its
 * slots and blocks grown as reserve() grows them (0 when even its present
 * capacity passes it). */
uint64_t tbl_rows_within(const srv_table *t, uint64_t allowed, uint64_t upto, int stamped);

/* The bytes table t may take within max_table_memory (beside the other
 * tables) and table_memory; *by_table: table_memory is the tighter. */
uint64_t tbl_allowed_bytes(const srv_tables *ts, const srv_table *t, int *by_table);

/* Room for `fresh` new rows of a push of n keys (`skipped` of them not
 * admitted), within max_table_memory and table_memory: 0 with *evict the
 * rows to evict first (0: none needed), or PS_ELIMIT with err. */
int tbl_room_for(srv_tables *ts, srv_table *t, uint32_t n, uint64_t fresh, uint64_t skipped, uint64_t *evict_n,
                    char *err, size_t errlen);

/* Gives table t its stamps, every row's at the table's clock. Returns 0 or
 * PS_ENOMEM (the table unchanged). */
int tbl_stamps_alloc(srv_tables *ts, srv_table *t);

/* The rows' clocks held exactly while a bound reads them (expiry,
 * eviction): freed when none does; when one starts to (a reload), every
 * row's clock starts at the table's clock, as if pushed last just now.
 * Holding them takes 8 bytes a row; a table whose rows and clocks would
 * not fit its caps evicts rows drawn at random first (table_full = evict:
 * their clocks are all one), or refuses: PS_ELIMIT with err. Returns 0,
 * that, or PS_ENOMEM. */
int tbl_ensure_stamps(srv_tables *ts, srv_table *t, char *err, size_t errlen);

/* Whether expire_scan(t, now, expire, window) would remove a row: the same
 * walk, reading the rows' stamps (written on the loop alone). */
int tbl_expire_due(const srv_table *t, uint64_t now, uint64_t expire, uint64_t window);

/* The first step of a push, shared by srv_tables_push and srv_tables_pin:
 * room for a push of n keys in psd's scratch, admission's counters made,
 * the rows' clocks made or freed (ensure_stamps), expiry's window scanned.
 * quiesce(arg), when given, is called before a row is removed. Returns 0,
 * or PS_ENOMEM or PS_ELIMIT (ensure_stamps) with err, no row created. */
int tbl_push_prepare(srv_tables *ts, srv_table *t, uint32_t n, uint64_t now, void (*quiesce)(void *arg), void *arg,
                        char *err, size_t errlen);

/* The step after a push found its rows, shared by srv_tables_push and
 * srv_tables_pin: room for its `fresh` new rows (`skipped` keys not
 * admitted), within max_table_memory and table_memory, refused or made by
 * evicting rows the push does not carry; then the slots and blocks for
 * them. rows[k]: key k's stored row (NULL: new; &not_admitted: skipped),
 * at[k] its index; both found again when eviction moved rows. quiesce(arg),
 * when given, is called before a row is removed. Returns 0, or PS_ELIMIT
 * or PS_ENOMEM with err, no row created (rows may have been evicted). */
int tbl_push_room(srv_tables *ts, srv_table *t, const uint8_t *keys, uint32_t n, uint64_t fresh,
                     uint64_t skipped, float **rows, uint32_t *at, uint64_t now, void (*quiesce)(void *arg),
                     void *arg, char *err, size_t errlen);

#endif
