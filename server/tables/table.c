/* table.c - the row store of psd's embedding tables (see table.h). */
#include "server/tables/table.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/errors.h"
#include "server/config/config.h"
#include "server/tables/sparse_optim.h"

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
};

static size_t page_bytes(void)
{
    static size_t page;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (size_t)p : 4096;
    }
    return page;
}

/* A block as it is mapped: its rows rounded up to whole pages (a block is
 * mapped on its own, so that no allocator header pushes it one page past
 * its rows). */
static uint64_t block_bytes(const srv_table *t)
{
    uint64_t b = ((uint64_t)t->stride << t->shift) * sizeof(float), pg = page_bytes();
    return (b + pg - 1) / pg * pg;
}

/* One block's stamps. */
static uint64_t stamp_block_bytes(const srv_table *t)
{
    return (sizeof(uint64_t) << t->shift);
}

static float *block_new(const srv_table *t)
{
    void *p = mmap(NULL, block_bytes(t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void block_free(const srv_table *t, float *b)
{
    if (b)
        munmap(b, block_bytes(t));
}

uint64_t srv_table_row_bytes(const ps_table_def *d)
{
    /* the row with its key, and its slots at the highest load */
    return (uint64_t)(srv_sparse_row_floats(d) + HEAD) * sizeof(float) + (SLOT_BYTES * LOAD_DEN + LOAD_NUM - 1) / LOAD_NUM;
}

/* Whether the bounds read the rows' clocks: expiry and eviction do. */
static int need_stamps(const srv_table_bounds *b)
{
    return b->expire != 0 || b->evict;
}

void srv_tables_init(srv_tables *ts, uint64_t max_bytes)
{
    memset(ts, 0, sizeof *ts);
    ts->max_bytes = max_bytes;
}

void srv_tables_set_limit(srv_tables *ts, uint64_t max_bytes)
{
    ts->max_bytes = max_bytes;
}

void srv_tables_set_bounds(srv_tables *ts, const srv_table_bounds *b)
{
    ts->bounds = *b;
}

void srv_tables_configure(srv_tables *ts, const ps_config *cfg)
{
    ts->max_bytes = cfg->max_table_memory;
    ts->bounds = (srv_table_bounds){.admit = (uint32_t)cfg->table_admit,
                                    .expire = cfg->table_expire,
                                    .table_bytes = cfg->table_memory,
                                    .evict = cfg->table_full == 1};
}

static void table_free(srv_table *t)
{
    if (!t)
        return;
    for (uint32_t b = 0; b < t->nblocks; b++) {
        block_free(t, t->blocks[b]);
        if (t->stamps)
            free(t->stamps[b]);
    }
    free(t->blocks);
    free(t->stamps);
    free(t->slots);
    free(t->sketch);
    free(t);
}

void srv_tables_free(srv_tables *ts)
{
    for (uint32_t i = 0; i < ts->n; i++)
        table_free(ts->t[i]);
    free(ts->scratch);
    free(ts->undo);
    free(ts->found);
    free(ts->found_r);
    free(ts->steprow);
    free(ts->dupset);
    free(ts->dupbits);
    memset(ts, 0, sizeof *ts);
}

int srv_tables_find(const srv_tables *ts, const char *name)
{
    for (uint32_t i = 0; i < ts->n; i++)
        if (strcmp(ts->t[i]->def.name, name) == 0)
            return (int)i;
    return -1;
}

const ps_table_def *srv_tables_def(const srv_tables *ts, uint32_t i)
{
    return &ts->t[i]->def;
}

static uint64_t first_row_bytes(const srv_table *t, int sketch, int stamped);

int srv_tables_declare(srv_tables *ts, const ps_table_def *d, uint32_t *idx, char *err, size_t errlen)
{
    int at = srv_tables_find(ts, d->name);
    if (at >= 0) {
        const ps_table_def *held = &ts->t[at]->def;
        if (!ps_table_def_same(held, d)) {
            char a[256], b[256];
            ps_table_def_text(d, a, sizeof a);
            ps_table_def_text(held, b, sizeof b);
            return ps_fail(err, errlen, PS_ELAYOUT, "table '%s' declared as %s, but psd holds it as %s", d->name, a, b);
        }
        *idx = (uint32_t)at;
        return 0;
    }
    if (ts->n >= PS_TABLES_MAX)
        return ps_fail(err, errlen, PS_ELIMIT, "table '%s': psd holds %d tables already, the most it takes", d->name,
                    PS_TABLES_MAX);
    srv_table *t = calloc(1, sizeof *t);
    if (!t)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory", d->name);
    t->def = *d;
    t->row_floats = srv_sparse_row_floats(d);
    t->stride = t->row_floats + HEAD;
    while (t->shift < 20 && ((uint64_t)t->stride << (t->shift + 1)) * sizeof(float) <= BLOCK_BYTES_MAX)
        t->shift++;
    t->rng = ps_mix64((uint64_t)ts->n + 1) | 1;
    uint64_t first = first_row_bytes(t, ts->bounds.admit > 1, need_stamps(&ts->bounds));
    if (ts->bounds.table_bytes && ts->bounds.table_bytes < first) {
        ps_fail(err, errlen, PS_ELIMIT,
             "table '%s': table_memory (%llu bytes) is smaller than the table's first row takes (%llu bytes: a "
             "block of %u rows of %u floats, %u hash slots%s%s); raise table_memory",
             d->name, (unsigned long long)ts->bounds.table_bytes, (unsigned long long)first, 1u << t->shift,
             t->stride, SLOTS_MIN, need_stamps(&ts->bounds) ? ", the rows' clocks" : "",
             ts->bounds.admit > 1 ? ", admission's counters" : "");
        free(t);
        return PS_ELIMIT;
    }
    t->bytes = sizeof *t;
    ts->bytes += t->bytes;
    *idx = ts->n;
    ts->t[ts->n++] = t;
    ts->stamp++;
    return 0;
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

/* A request's keys are looked up in a pipeline (finder): while key k is
 * used, key k + ROW_AHEAD's slots are read, the row of the first slot whose
 * tag matches prefetched (its key is compared when key k + ROW_AHEAD is
 * used, from the cache), and the slot of key k + ROW_AHEAD + SLOT_AHEAD is
 * prefetched, so that the cache misses of many keys overlap instead of
 * coming one by one, with no pause at the start of a batch.
 *
 * The store is bound by the instructions it runs more than by memory
 * (callgrind: about 380 a key pushed and pulled in bench/table_store, more
 * than 3 a cycle), so the finder keeps its own copy of the table fields it
 * reads for every key: a store through the callers' pointers (rows, row
 * indices) could change the table's as far as the compiler knows, and it
 * read them again for each key. */
#define ROW_AHEAD 16
#define SLOT_AHEAD 16
/* a key's hash is computed once, when its slot is prefetched, and kept
 * until its slots are read ROW_AHEAD keys later */
#define HASH_RING (ROW_AHEAD + SLOT_AHEAD)

/* A key ROW_AHEAD ahead: the row of the first slot whose tag matches (its
 * key not compared yet), or no match (row 0: not stored). */
typedef struct candidate {
    uint64_t row; /* its row + 1; 0: the probe met an empty slot first */
    float *p;     /* where that row lies (its key first) */
} candidate;

/* The pipeline over the n keys of a request: finder_start, then
 * finder_next n times, which returns the stored row (its values) of key 0,
 * 1, ... in turn, its index in f->r, or NULL (not stored). [from, to): the
 * bytes of each row the caller uses, relative to its values, prefetched (the
 * same to finder_start and each finder_next: constants, where they can be,
 * so that the prefetches are unrolled); they must take in the row's key
 * (from <= -HEAD floats). The caller may change
 * the rows' values between the calls, not the table's slots or rows. With
 * hint (a row + 1 per key, 0: none; srv_row_hint), key k's row is first
 * looked for at its hint, without the slots. */
typedef struct finder {
    const srv_table *t;
    const uint8_t *keys;
    const uint32_t *hint;         /* NULL: none */
    uint32_t n, k;                /* keys; the next one finder_next returns */
    uint64_t r;                   /* the index of the row finder_next returned last */
    /* the table's, as finder_start found them */
    float *const *blocks;
    uint64_t *const *stamps;
    const slot *slots;
    uint64_t rows, capm, bmask;   /* rows stored, cap - 1, rows a block - 1 */
    uint32_t shift, stride, rmask;
    candidate ring[ROW_AHEAD];    /* keys k .. k + ROW_AHEAD - 1 */
    uint64_t hash[HASH_RING];     /* key j's hash at j % HASH_RING, from its slot's prefetch */
} finder;

/* Row r (its key first), as row_at. */
static inline __attribute__((always_inline)) float *finder_row(const finder *f, uint64_t r)
{
    return f->blocks[r >> f->shift] + (r & f->bmask) * f->stride;
}

/* Row r as a candidate: its key, bytes [from, to) of its values and its
 * stamp prefetched. */
static inline __attribute__((always_inline)) candidate finder_candidate(const finder *f, uint64_t r,
                                                                       const ptrdiff_t from, const ptrdiff_t to)
{
    float *p = finder_row(f, r);
    const char *at = (const char *)(p + HEAD) + from, *end = (const char *)(p + HEAD) + to;
    __builtin_prefetch(at);
    for (at += 64; at < end; at += 64)
        __builtin_prefetch(at);
    __builtin_prefetch(end - 1);
    if (f->stamps)
        __builtin_prefetch(f->stamps[r >> f->shift] + (r & f->bmask));
    return (candidate){r + 1, p};
}

/* Key j's hinted row, when it has one that is stored. */
static inline __attribute__((always_inline)) int hinted(const finder *f, uint32_t j)
{
    return (uint32_t)(f->hint[j] - 1u) < f->rows; /* 0: none */
}

/* hinting: whether f has a hint, a constant where the functions are
 * inlined, so that a finder without one runs no code of the hints. */
static inline __attribute__((always_inline)) void finder_prefetch_slot(finder *f, uint32_t j, const int hinting)
{
    if (!hinting || !hinted(f, j)) {
        uint64_t h = f->hash[j % HASH_RING] = ps_mix64(ps_key_at(f->keys, j));
        __builtin_prefetch(&f->slots[h & f->capm]);
    }
}

/* Key j's candidate: its hinted row, or the probe of its key as far as the
 * first tag match (finder_prefetch_slot(f, j) came first). */
static inline __attribute__((always_inline)) candidate finder_find(const finder *f, uint32_t j, const int hinting,
                                                                  const ptrdiff_t from, const ptrdiff_t to)
{
    if (hinting && hinted(f, j))
        return finder_candidate(f, f->hint[j] - 1, from, to);
    const uint64_t h = f->hash[j % HASH_RING];
    const uint32_t rmask = f->rmask, tag = tag_of(h, rmask);
    for (uint64_t s = h & f->capm;; s = (s + 1) & f->capm) {
        slot v = f->slots[s];
        if (v == 0)
            return (candidate){0, NULL};
        if ((v & ~rmask) == tag)
            return finder_candidate(f, (v & rmask) - 1, from, to);
    }
}

static inline __attribute__((always_inline)) void finder_start(finder *f, const srv_table *t, const uint8_t *keys,
                                                              uint32_t n, ptrdiff_t from, ptrdiff_t to,
                                                              const uint32_t *hint)
{
    f->t = t;
    f->keys = keys;
    f->hint = hint;
    f->n = t->cap ? n : 0; /* no slots: every key is not stored */
    f->k = 0;
    f->blocks = t->blocks;
    f->stamps = t->stamps;
    f->slots = t->slots;
    f->rows = t->rows;
    f->capm = t->cap - 1;
    f->bmask = (1ull << t->shift) - 1;
    f->shift = t->shift;
    f->stride = t->stride;
    f->rmask = t->rmask;
    for (uint32_t k = 0; k < f->n && k < HASH_RING; k++)
        finder_prefetch_slot(f, k, hint != NULL);
    for (uint32_t k = 0; k < f->n && k < ROW_AHEAD; k++)
        f->ring[k] = finder_find(f, k, hint != NULL, from, to);
}

static inline __attribute__((always_inline)) float *finder_next(finder *f, const int hinting, const ptrdiff_t from,
                                                                const ptrdiff_t to)
{
    uint32_t k = f->k++;
    if (k >= f->n)
        return NULL;
    candidate c = f->ring[k % ROW_AHEAD];
    uint32_t j = k + ROW_AHEAD;
    if (j < f->n) {
        if (j + SLOT_AHEAD < f->n)
            finder_prefetch_slot(f, j + SLOT_AHEAD, hinting);
        f->ring[j % ROW_AHEAD] = finder_find(f, j, hinting, from, to);
    }
    if (c.row == 0)
        return NULL;
    uint64_t key = ps_key_at(f->keys, k);
    if (row_key(c.p) == key) {
        f->r = c.row - 1;
        return c.p + HEAD;
    }
    /* a hint whose row holds another key now, or tags equal and keys not
     * (one probe in 2^(32 - log2 slots) at most): the key looked up */
    uint64_t r = lookup(f->t, key);
    if (!r)
        return NULL;
    f->r = r - 1;
    return finder_row(f, r - 1) + HEAD;
}

/* Puts key -> row index r into slots (cap of them) that have room (no key
 * twice). */
static void slot_put(slot *slots, uint64_t cap, uint64_t key, uint64_t r)
{
    uint64_t h = ps_mix64(key), s = h & (cap - 1);
    while (slots[s] != 0)
        s = (s + 1) & (cap - 1);
    slots[s] = tag_of(h, (uint32_t)(cap - 1)) | (uint32_t)(r + 1);
}

/* What holding `rows` rows takes: slots, blocks and the block list, in the
 * sizes srv_table grows them to. */
static void plan_size(const srv_table *t, uint64_t rows, uint64_t *cap, uint32_t *nblocks, uint32_t *blocks_cap)
{
    uint64_t c = t->cap;
    while (rows * LOAD_DEN > c * LOAD_NUM)
        c = c ? 2 * c : SLOTS_MIN;
    *cap = c;
    uint64_t nb = (rows + (1ull << t->shift) - 1) >> t->shift;
    *nblocks = (uint32_t)nb;
    uint32_t bc = t->blocks_cap;
    while (bc < nb)
        bc = bc ? 2 * bc : 16;
    *blocks_cap = bc;
}

/* What the table takes with cap slots, nblocks blocks (and as many stamp
 * arrays when `stamped`) and block lists of blocks_cap. */
static uint64_t size_of(const srv_table *t, uint64_t cap, uint32_t nblocks, uint32_t blocks_cap, int stamped)
{
    uint64_t per_block = block_bytes(t) + (stamped ? stamp_block_bytes(t) : 0);
    return sizeof *t + cap * SLOT_BYTES + (uint64_t)nblocks * per_block +
           (uint64_t)blocks_cap * sizeof(float *) * (stamped ? 2 : 1);
}

/* What a new table takes with its first row (and admission's counters, and
 * the row's stamp). */
static uint64_t first_row_bytes(const srv_table *t, int sketch, int stamped)
{
    uint64_t cap;
    uint32_t nb, bc;
    plan_size(t, 1, &cap, &nb, &bc);
    return size_of(t, cap, nb, bc, stamped) + (sketch ? SKETCH_BYTES : 0);
}

static void count_bytes(srv_tables *ts, srv_table *t)
{
    uint64_t now = size_of(t, t->cap, t->nblocks, t->blocks_cap, t->stamps != NULL) + (t->sketch ? SKETCH_BYTES : 0);
    ts->bytes = ts->bytes - t->bytes + now;
    t->bytes = now;
}

/* Makes room for `rows` rows: slots (rehashed into a larger array), blocks
 * (and their stamps while the table holds stamps) and the block lists.
 * Returns 0 or PS_ENOMEM, the table then unchanged but for capacity it
 * kept. Updates t->bytes and ts->bytes. */
static int reserve(srv_tables *ts, srv_table *t, uint64_t rows)
{
    uint64_t cap;
    uint32_t nb, bc;
    plan_size(t, rows, &cap, &nb, &bc);
    int rc = PS_ENOMEM;
    if (cap > SLOTS_MAX)
        return PS_ENOMEM; /* room_for and srv_tables_load refuse so many rows first */
    if (bc > t->blocks_cap) {
        float **b = realloc(t->blocks, sizeof *b * bc);
        if (!b)
            goto out;
        t->blocks = b;
        if (t->stamps) {
            uint64_t **s = realloc(t->stamps, sizeof *s * bc);
            if (!s)
                goto out;
            t->stamps = s;
        }
        t->blocks_cap = bc;
    }
    while (t->nblocks < nb) {
        float *b = block_new(t);
        if (!b)
            goto out;
        if (t->stamps) {
            uint64_t *s = malloc(stamp_block_bytes(t));
            if (!s) {
                block_free(t, b);
                goto out;
            }
            t->stamps[t->nblocks] = s;
        }
        t->blocks[t->nblocks++] = b;
    }
    if (cap > t->cap) {
        slot *sl = calloc(cap, sizeof *sl);
        if (!sl)
            goto out;
        /* the rows in order: each key read from its row, one pass */
        for (uint64_t r = 0; r < t->rows; r++)
            slot_put(sl, cap, key_of(t, r), r);
        free(t->slots);
        t->slots = sl;
        t->cap = cap;
        t->rmask = (uint32_t)(cap - 1);
    }
    rc = 0;
out:
    count_bytes(ts, t);
    return rc;
}

/* Frees the blocks (and stamps) past those `rows` rows need: after rows
 * were removed to make room. */
static void trim(srv_tables *ts, srv_table *t, uint64_t rows)
{
    uint64_t nb = (rows + (1ull << t->shift) - 1) >> t->shift;
    while (t->nblocks > nb) {
        t->nblocks--;
        block_free(t, t->blocks[t->nblocks]);
        if (t->stamps)
            free(t->stamps[t->nblocks]);
    }
    count_bytes(ts, t);
}

/* Appends key's row (values: row_floats) as row t->rows, pushed at clock
 * `stamp`; reserve() made room. */
static void append(srv_table *t, uint64_t key, uint64_t stamp, const void *values)
{
    uint64_t r = t->rows++;
    float *p = row_at(t, r);
    memcpy(p, &key, sizeof key);
    memcpy(p + HEAD, values, sizeof(float) * t->row_floats);
    if (t->stamps)
        *stamp_at(t, r) = stamp;
    slot_put(t->slots, t->cap, key, r);
}

/* The slot that holds row r, whose key is key. */
static uint64_t slot_find(const srv_table *t, uint64_t key, uint64_t r)
{
    uint64_t s = ps_mix64(key) & (t->cap - 1);
    while ((t->slots[s] & t->rmask) != r + 1)
        s = (s + 1) & (t->cap - 1);
    return s;
}

/* Removes row r: its key leaves the slots (the probe chain after it shifted
 * back, so every key stays reachable) and the last row (and its stamp)
 * moves into its place. */
static void row_remove(srv_table *t, uint64_t r)
{
    float *p = row_at(t, r);
    uint64_t m = t->cap - 1, i = slot_find(t, row_key(p), r);
    for (uint64_t j = (i + 1) & m; t->slots[j] != 0; j = (j + 1) & m) {
        uint64_t h = ps_mix64(key_of(t, (t->slots[j] & t->rmask) - 1)) & m;
        /* the key at j stays when its home h lies cyclically in (i, j] */
        if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
            continue;
        t->slots[i] = t->slots[j];
        i = j;
    }
    t->slots[i] = 0;
    uint64_t last = t->rows - 1;
    if (r != last) {
        const float *q = row_at(t, last);
        memcpy(p, q, sizeof(float) * t->stride);
        if (t->stamps)
            *stamp_at(t, r) = *stamp_at(t, last);
        uint64_t s = slot_find(t, row_key(p), last);
        t->slots[s] = (t->slots[s] & ~t->rmask) | (uint32_t)(r + 1);
    }
    t->rows--;
}

/* Admission: counts one push of key in the table's sketch (conservative
 * update: only the smallest counters grow) and returns 1 when the key has
 * now been pushed `admit` times (or more: collisions overcount), counts
 * halving every SKETCH_AGE counted pushes. */
static int sketch_admit(srv_table *t, uint64_t key, uint32_t admit)
{
    uint8_t *c[SKETCH_D];
    uint8_t low = 255;
    for (uint32_t d = 0; d < SKETCH_D; d++) {
        uint64_t h = ps_mix64(key ^ (0x9e3779b97f4a7c15ull * (d + 1)));
        c[d] = t->sketch + d * SKETCH_W + (h & (SKETCH_W - 1));
        if (*c[d] < low)
            low = *c[d];
    }
    if (low < 255) {
        for (uint32_t d = 0; d < SKETCH_D; d++)
            if (*c[d] == low)
                (*c[d])++;
        low++;
    }
    if (++t->sketch_adds >= SKETCH_AGE) {
        for (uint32_t i = 0; i < SKETCH_BYTES; i++)
            t->sketch[i] >>= 1;
        t->sketch_adds = 0;
    }
    return low >= admit;
}

/* Expiry: looks at `window` rows, downward from the scan's place (wrapping
 * to the last row), and removes those not pushed in the last `expire`
 * pushes. Going down, the last row that moves into a removed one's place
 * was looked at already in this pass (or was added since, so is fresh). A
 * window of every row is one exact pass from the last row down. */
static void expire_scan(srv_table *t, uint64_t now, uint64_t expire, uint64_t window)
{
    if (t->rows == 0 || now <= expire)
        return;
    uint64_t c = t->scan < t->rows ? t->scan : t->rows;
    if (window >= t->rows) {
        window = t->rows;
        c = t->rows;
    }
    for (uint64_t k = 0; k < window && t->rows > 0; k++) {
        if (c == 0)
            c = t->rows;
        c--;
        if (now - *stamp_at(t, c) > expire) {
            row_remove(t, c);
            t->expired++;
        }
    }
    t->scan = c;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Eviction: removes e rows, each the least recently pushed of EVICT_SAMPLE
 * drawn at random, never one pushed at clock `now` (this push's). The
 * caller checked that e rows older than now exist. */
static void evict(srv_table *t, uint64_t e, uint64_t now)
{
    for (uint64_t k = 0; k < e; k++) {
        uint64_t best = UINT64_MAX, best_stamp = UINT64_MAX;
        for (uint32_t d = 0; d < EVICT_SAMPLE || best == UINT64_MAX; d++) {
            uint64_t r = xorshift(&t->rng) % t->rows, st = *stamp_at(t, r);
            if (st < now && st < best_stamp) {
                best = r;
                best_stamp = st;
            }
        }
        row_remove(t, best);
        t->evicted++;
    }
}

/* Room for `floats` floats in *p (*have of them now), at least doubled
 * when it grows, so that a push grows it a few times at most. */
static int room_grow(float **p, size_t *have, size_t floats)
{
    size_t want = floats > 2 * *have ? floats : 2 * *have;
    float *q = realloc(*p, sizeof *q * want);
    if (!q)
        return PS_ENOMEM;
    *p = q;
    *have = want;
    return 0;
}

static inline int room(float **p, size_t *have, size_t floats)
{
    return floats <= *have ? 0 : room_grow(p, have, floats);
}

/* Room for the found rows of a push of n keys (scratch grows as the push
 * finds new rows; undo takes n rows at the push's start, so that its loop
 * does not ask for room at every row: the two take one to two copies of
 * the push's rows). */
static int grow_scratch(srv_tables *ts, size_t n)
{
    if (n > ts->found_cap) {
        float **f = realloc(ts->found, sizeof *f * n);
        if (!f)
            return PS_ENOMEM;
        ts->found = f;
        uint32_t *r = realloc(ts->found_r, sizeof *r * n);
        if (!r)
            return PS_ENOMEM;
        ts->found_r = r;
        float **sr = realloc(ts->steprow, sizeof *sr * n);
        if (!sr)
            return PS_ENOMEM;
        ts->steprow = sr;
        ts->found_cap = n;
    }
    return 0;
}

void srv_row_hint_free(srv_row_hint *h)
{
    free(h->keys);
    free(h->at);
    memset(h, 0, sizeof *h);
}

/* Whether h holds a pull of the n keys `keys` (n > 0) from table i. */
static int hint_holds(const srv_row_hint *h, uint32_t i, const uint8_t *keys, uint32_t n)
{
    return h && h->n == n && h->table == i && n && memcmp(h->keys, keys, (size_t)n * 8) == 0;
}

/* Room in h for n keys; 0, or -1 with h emptied (a pull without a hint). */
static int hint_room(srv_row_hint *h, uint32_t n)
{
    h->n = 0;
    if (n <= h->cap)
        return 0;
    uint8_t *k = realloc(h->keys, (size_t)n * 8);
    if (k)
        h->keys = k;
    uint32_t *a = realloc(h->at, sizeof *a * n);
    if (a)
        h->at = a;
    if (!k || !a)
        return -1;
    h->cap = n;
    return 0;
}

void srv_tables_pull(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float *out)
{
    srv_tables_pull_hint(ts, i, keys, n, out, NULL);
}

/* srv_tables_pull_hint's loop, for rows of dim floats: inlined with dim a
 * constant for the usual sizes, so that each row is copied in a few
 * instructions, with no call and no test of its size, and the lines to
 * prefetch are known (the store is bound by its instructions: see the
 * finder) */
static inline __attribute__((always_inline)) void pull_rows(const srv_table *t, const uint8_t *keys, uint32_t n,
                                                           float *out, srv_row_hint *h, const uint32_t dim)
{
    finder f; /* on the stack: a pull shares no scratch with a push */
    const ptrdiff_t from = -(ptrdiff_t)(sizeof(float) * HEAD), to = (ptrdiff_t)(sizeof(float) * dim); /* key, weights */
    finder_start(&f, t, keys, n, from, to, NULL);
    for (uint32_t k = 0; k < n; k++) {
        const float *row = finder_next(&f, 0, from, to);
        float *dst = out + (size_t)k * dim;
        if (h)
            h->at[k] = row ? (uint32_t)(f.r + 1) : 0;
        if (row)
            memcpy(dst, row, sizeof(float) * dim);
        else if (t->def.opt == PS_TOPT_FTRL)
            memset(dst, 0, sizeof(float) * dim);
        else
            ps_table_row_init(&t->def, ps_key_at(keys, k), dst);
    }
}

void srv_tables_pull_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float *out, srv_row_hint *h)
{
    const srv_table *t = ts->t[i];
    if (h && hint_room(h, n) != 0)
        h = NULL;
    switch (t->def.dim) {
    case 8: pull_rows(t, keys, n, out, h, 8); break;
    case 16: pull_rows(t, keys, n, out, h, 16); break;
    case 32: pull_rows(t, keys, n, out, h, 32); break;
    case 64: pull_rows(t, keys, n, out, h, 64); break;
    default: pull_rows(t, keys, n, out, h, t->def.dim); break;
    }
    ts->t[i]->pulled += n;
    if (h) {
        memcpy(h->keys, keys, (size_t)n * 8);
        h->n = n;
        h->table = i;
    }
}

/* The largest number of rows table t may hold within `allowed` bytes, its
 * slots and blocks grown as reserve() grows them (0 when even its present
 * capacity passes it). */
static uint64_t rows_within(const srv_table *t, uint64_t allowed, uint64_t upto, int stamped)
{
    uint64_t lo = 0, hi = upto;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2, cap;
        uint32_t nb, bc;
        plan_size(t, mid, &cap, &nb, &bc);
        if (size_of(t, cap, nb, bc, stamped) <= allowed)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The bytes table t may take within max_table_memory (beside the other
 * tables) and table_memory; *by_table: table_memory is the tighter. */
static uint64_t allowed_bytes(const srv_tables *ts, const srv_table *t, int *by_table)
{
    uint64_t others = ts->bytes - t->bytes;
    uint64_t allowed = ts->max_bytes > others ? ts->max_bytes - others : 0;
    *by_table = ts->bounds.table_bytes && ts->bounds.table_bytes < allowed;
    return *by_table ? ts->bounds.table_bytes : allowed;
}

/* Room for `fresh` new rows of a push of n keys (`skipped` of them not
 * admitted), within max_table_memory and table_memory: 0 with *evict the
 * rows to evict first (0: none needed), or PS_ELIMIT with err. */
static int room_for(srv_tables *ts, srv_table *t, uint32_t n, uint64_t fresh, uint64_t skipped, uint64_t *evict_n,
                    char *err, size_t errlen)
{
    const ps_table_def *d = &t->def;
    const srv_table_bounds *bd = &ts->bounds;
    *evict_n = 0;
    if (!fresh)
        return 0;
    if (t->rows + fresh > SRV_TABLE_ROWS_MAX)
        return ps_fail(err, errlen, PS_ELIMIT, "table '%s': %llu rows would pass the most one table holds (%llu)",
                    d->name, (unsigned long long)(t->rows + fresh), (unsigned long long)SRV_TABLE_ROWS_MAX);
    int by_table;
    uint64_t allowed = allowed_bytes(ts, t, &by_table), sketch = t->sketch ? SKETCH_BYTES : 0;
    allowed = allowed > sketch ? allowed - sketch : 0;
    uint64_t cap;
    uint32_t nb, bc;
    plan_size(t, t->rows + fresh, &cap, &nb, &bc);
    uint64_t need = size_of(t, cap, nb, bc, t->stamps != NULL), others = ts->bytes - t->bytes;
    if (need > allowed) {
        uint64_t fit = rows_within(t, allowed, t->rows + fresh, t->stamps != NULL),
                 touched = (uint64_t)n - fresh - skipped;
        if (!bd->evict || fit < fresh + touched)
            return ps_fail(err, errlen, PS_ELIMIT,
                        "table '%s': %llu new rows would take %s to %llu bytes, past %s (%llu bytes; the table "
                        "holds %llu rows in %llu bytes)%s; raise it or spread the table over more psd",
                        d->name, (unsigned long long)fresh, by_table ? "the table" : "psd's tables",
                        (unsigned long long)(need + sketch + (by_table ? 0 : others)),
                        by_table ? "table_memory" : "max_table_memory",
                        (unsigned long long)(by_table ? bd->table_bytes : ts->max_bytes),
                        (unsigned long long)t->rows, (unsigned long long)t->bytes,
                        bd->evict ? ", and evicting every row this push does not touch would not make room"
                                  : " (table_full = refuse)");
        *evict_n = t->rows + fresh - fit;
    }
    return 0;
}

static float not_admitted; /* ts->found's mark of a key skipped by admission */

/* Puts the stored rows among the first n keys of a push back as they were
 * (undo holds each one's stamp and values, 2 + rf floats, in the order of
 * the keys). */
static void push_undo(srv_tables *ts, const srv_table *t, uint32_t n, uint32_t rf)
{
    size_t j = 0;
    for (uint32_t k = 0; k < n; k++)
        if (ts->found[k] && ts->found[k] != &not_admitted) {
            const float *u = ts->undo + (j++) * (rf + 2);
            if (t->stamps)
                memcpy(stamp_at(t, ts->found_r[k]), u, sizeof(uint64_t));
            memcpy(ts->found[k], u + 2, sizeof(float) * rf);
        }
}

/* The new rows of a push of n keys made again in scratch, in the order of
 * their keys (as push_find made them). */
static void push_remake(srv_tables *ts, const srv_table *t, const uint8_t *keys, uint32_t n)
{
    size_t j = 0;
    for (uint32_t k = 0; k < n; k++)
        if (!ts->found[k])
            srv_sparse_row_new(&t->def, ps_key_at(keys, k), ts->scratch + (j++) * t->row_floats);
}

/* Gives table t its stamps, every row's at the table's clock. Returns 0 or
 * PS_ENOMEM (the table unchanged). */
static int stamps_alloc(srv_tables *ts, srv_table *t)
{
    uint64_t **s = calloc(t->blocks_cap ? t->blocks_cap : 1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    for (uint32_t b = 0; b < t->nblocks; b++) {
        if (!(s[b] = malloc(stamp_block_bytes(t)))) {
            while (b--)
                free(s[b]);
            free(s);
            return PS_ENOMEM;
        }
        for (uint64_t r = 0; r < (1ull << t->shift); r++)
            s[b][r] = t->clock;
    }
    t->stamps = s;
    count_bytes(ts, t);
    return 0;
}

/* The rows' clocks held exactly while a bound reads them (expiry,
 * eviction): freed when none does; when one starts to (a reload), every
 * row's clock starts at the table's clock, as if pushed last just now.
 * Holding them takes 8 bytes a row; a table whose rows and clocks would
 * not fit its caps evicts rows drawn at random first (table_full = evict:
 * their clocks are all one), or refuses: PS_ELIMIT with err. Returns 0,
 * that, or PS_ENOMEM. */
static int ensure_stamps(srv_tables *ts, srv_table *t, char *err, size_t errlen)
{
    int want = need_stamps(&ts->bounds);
    if (!want && t->stamps) {
        for (uint32_t b = 0; b < t->nblocks; b++)
            free(t->stamps[b]);
        free(t->stamps);
        t->stamps = NULL;
        count_bytes(ts, t);
        return 0;
    }
    if (!want || t->stamps)
        return 0;
    int by_table;
    uint64_t allowed = allowed_bytes(ts, t, &by_table), sketch = t->sketch ? SKETCH_BYTES : 0;
    allowed = allowed > sketch ? allowed - sketch : 0;
    if (t->rows && size_of(t, t->cap, t->nblocks, t->blocks_cap, 1) > allowed) {
        uint64_t fit = rows_within(t, allowed, t->rows, 1);
        if (!ts->bounds.evict || fit == 0)
            return ps_fail(err, errlen, PS_ELIMIT,
                           "table '%s': its %llu rows and their clocks (8 bytes a row, which expiry and eviction "
                           "read) would pass %s (%llu bytes)%s; raise it or spread the table over more psd",
                           t->def.name, (unsigned long long)t->rows, by_table ? "table_memory" : "max_table_memory",
                           (unsigned long long)(by_table ? ts->bounds.table_bytes : ts->max_bytes),
                           ts->bounds.evict ? "" : " (table_full = refuse)");
        while (t->rows > fit) {
            row_remove(t, xorshift(&t->rng) % t->rows);
            t->evicted++;
        }
        trim(ts, t, t->rows);
    }
    if (stamps_alloc(ts, t) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for its rows' clocks", t->def.name);
    return 0;
}

/* Whether expire_scan(t, now, expire, window) would remove a row: the same
 * walk, reading the rows' stamps (written on the loop alone). */
static int expire_due(const srv_table *t, uint64_t now, uint64_t expire, uint64_t window)
{
    if (t->rows == 0 || now <= expire)
        return 0;
    uint64_t c = t->scan < t->rows ? t->scan : t->rows;
    if (window >= t->rows) {
        window = t->rows;
        c = t->rows;
    }
    for (uint64_t k = 0; k < window; k++) {
        if (c == 0)
            c = t->rows;
        c--;
        if (now - *stamp_at(t, c) > expire)
            return 1;
    }
    return 0;
}

/* The first step of a push, shared by srv_tables_push and srv_tables_pin:
 * room for a push of n keys in psd's scratch, admission's counters made,
 * the rows' clocks made or freed (ensure_stamps), expiry's window scanned.
 * quiesce(arg), when given, is called before a row is removed. Returns 0,
 * or PS_ENOMEM or PS_ELIMIT (ensure_stamps) with err, no row created. */
static int push_prepare(srv_tables *ts, srv_table *t, uint32_t n, uint64_t now, void (*quiesce)(void *arg), void *arg,
                        char *err, size_t errlen)
{
    const srv_table_bounds *bd = &ts->bounds;
    const char *name = t->def.name;
    if (room(&ts->scratch, &ts->scratch_floats, t->row_floats) != 0 || grow_scratch(ts, n) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", name, n);
    if (bd->admit > 1 && !t->sketch) {
        t->sketch = calloc(1, SKETCH_BYTES);
        if (!t->sketch)
            return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for admission's counters", name);
        count_bytes(ts, t);
    }
    if (quiesce && need_stamps(bd) && !t->stamps)
        quiesce(arg); /* making room for the clocks may evict rows */
    int rc = ensure_stamps(ts, t, err, errlen);
    if (rc != 0)
        return rc;
    if (bd->expire) {
        uint64_t window = (uint64_t)n * 4 > EXPIRE_WINDOW ? (uint64_t)n * 4 : EXPIRE_WINDOW;
        if (quiesce && expire_due(t, now, bd->expire, window))
            quiesce(arg);
        expire_scan(t, now, bd->expire, window);
    }
    return 0;
}

/* The step after a push found its rows, shared by srv_tables_push and
 * srv_tables_pin: room for its `fresh` new rows (`skipped` keys not
 * admitted), within max_table_memory and table_memory, refused or made by
 * evicting rows the push does not carry; then the slots and blocks for
 * them. rows[k]: key k's stored row (NULL: new; &not_admitted: skipped),
 * at[k] its index; both found again when eviction moved rows. quiesce(arg),
 * when given, is called before a row is removed. Returns 0, or PS_ELIMIT
 * or PS_ENOMEM with err, no row created (rows may have been evicted). */
static int push_room(srv_tables *ts, srv_table *t, const uint8_t *keys, uint32_t n, uint64_t fresh,
                     uint64_t skipped, float **rows, uint32_t *at, uint64_t now, void (*quiesce)(void *arg),
                     void *arg, char *err, size_t errlen)
{
    uint64_t evicted = 0;
    int rc = room_for(ts, t, n, fresh, skipped, &evicted, err, errlen);
    if (rc != 0)
        return rc;
    if (evicted) {
        if (quiesce)
            quiesce(arg);
        for (uint32_t k = 0; k < n; k++) /* this push's rows stay (eviction holds stamps) */
            if (rows[k] && rows[k] != &not_admitted)
                *stamp_at(t, at[k]) = now;
        evict(t, evicted, now);
        for (uint32_t k = 0; k < n; k++) /* rows moved: found again */
            if (rows[k] && rows[k] != &not_admitted) {
                uint64_t r = lookup(t, ps_key_at(keys, k));
                rows[k] = row_at(t, r - 1) + HEAD;
                at[k] = (uint32_t)(r - 1);
            }
    }
    if (fresh && reserve(ts, t, t->rows + fresh) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu new rows; nothing was changed",
                       t->def.name, (unsigned long long)fresh);
    return 0;
}

/* The last step of a push: the table's clock and counts. */
static void push_count(srv_tables *ts, srv_table *t, uint32_t n, uint64_t fresh, uint64_t skipped, uint64_t now)
{
    t->clock = now;
    t->pushed += n - skipped;
    t->filtered += skipped;
    if (ts->bounds.admit > 1)
        t->admitted += fresh;
    ts->stamp++;
}

/* The first pass of a push (srv_tables_push_hint): each stored row found
 * (through hint when hinting) and kept in undo, each new one made in
 * scratch; *fresh and *skipped count the new rows and the keys admission
 * skipped. 0 or PS_ENOMEM, nothing stepped yet. rf: t->row_floats (a
 * constant where the caller can make it one, as pull_rows' dim). */
static inline __attribute__((always_inline)) int push_find(srv_tables *ts, srv_table *t, const uint8_t *keys,
                                                          uint32_t n, const uint32_t *hint, const int hinting,
                                                          const uint32_t rf, uint64_t *fresh, uint64_t *skipped,
                                                          char *err, size_t errlen)
{
    const ps_table_def *d = &t->def;
    const srv_table_bounds *bd = &ts->bounds;
    finder f; /* key and values of each row (and its stamp) */
    const ptrdiff_t from = -(ptrdiff_t)(sizeof(float) * HEAD), to = (ptrdiff_t)(sizeof(float) * rf);
    if (room(&ts->undo, &ts->undo_floats, (size_t)n * (rf + 2)) != 0) /* every key's row may be stored */
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", d->name, n);
    float *u = ts->undo;
    const int stamped = t->stamps != NULL;
    finder_start(&f, t, keys, n, from, to, hint);
    for (uint32_t k = 0; k < n; k++) {
        float *row = ts->found[k] = finder_next(&f, hinting, from, to);
        if (row) {
            ts->found_r[k] = (uint32_t)f.r;
            if (stamped)
                memcpy(u, stamp_at(t, f.r), sizeof(uint64_t));
            memcpy(u + 2, row, sizeof(float) * rf);
            u += rf + 2;
            continue;
        }
        uint64_t key = ps_key_at(keys, k);
        if (bd->admit > 1 && !sketch_admit(t, key, bd->admit)) {
            ts->found[k] = &not_admitted; /* counted, not stored */
            (*skipped)++;
            continue;
        }
        if (room(&ts->scratch, &ts->scratch_floats, (size_t)(*fresh + 1) * rf) != 0)
            return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", d->name, n);
        srv_sparse_row_new(d, key, ts->scratch + (size_t)((*fresh)++) * rf);
    }
    return 0;
}

/* A push in two passes over its keys: the first finds each stored row and
 * keeps it in undo (stamp and values, from the cache lines just loaded),
 * and makes each new row in scratch; the second steps them all in one loop
 * (srv_sparse_step_all: the steps of different rows overlap in the CPU,
 * which one step between two lookups did not let them do) and stamps the
 * stored ones. If a step is not finite, or the new rows do not fit, the
 * rows stepped are put back from undo, so the push changes nothing.
 * Each stored row is read from memory once. */
int srv_tables_push(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g, double scale,
                    char *err, size_t errlen)
{
    return srv_tables_push_hint(ts, i, keys, n, g, scale, NULL, err, errlen);
}

int srv_tables_push_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g, double scale,
                         const srv_row_hint *h, char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    const ps_table_def *d = &t->def;
    const uint32_t rf = t->row_floats;
    const uint64_t now = t->clock + 1;

    /* 0. scratch, counters, clocks; expiry's window of rows */
    int rc = push_prepare(ts, t, n, now, NULL, NULL, err, errlen);
    if (rc != 0)
        return rc;

    /* 1. stored rows found and kept in undo, new rows made in scratch */
    uint64_t fresh = 0, skipped = 0;
    const uint32_t *hint = hint_holds(h, i, keys, n) ? h->at : NULL;
    if (hint && rf == 32) /* rows of 32 floats: dim 16 with AdaGrad, the most usual table */
        rc = push_find(ts, t, keys, n, hint, 1, 32, &fresh, &skipped, err, errlen);
    else if (hint)
        rc = push_find(ts, t, keys, n, hint, 1, rf, &fresh, &skipped, err, errlen);
    else
        rc = push_find(ts, t, keys, n, NULL, 0, rf, &fresh, &skipped, err, errlen);
    if (rc != 0)
        return rc;

    /* 2. every row stepped: stored ones in place, new ones in scratch */
    uint64_t nf = 0;
    for (uint32_t k = 0; k < n; k++) {
        float *row = ts->found[k];
        ts->steprow[k] = row == &not_admitted ? NULL : row ? row : ts->scratch + (size_t)(nf++) * rf;
    }
    if (!srv_sparse_step_all(d, ts->steprow, g, n, scale)) {
        /* a row not finite: every row back as it was, the new ones made
         * again, and the first such row found by stepping them once more,
         * each checked before it is written */
        push_undo(ts, t, n, rf);
        push_remake(ts, t, keys, n);
        uint32_t bad = srv_sparse_step_rows(d, ts->steprow, g, n, scale);
        push_undo(ts, t, bad, rf); /* row `bad` itself was left as it was */
        return ps_fail(err, errlen, PS_ENONFINITE,
                       "table '%s': the update of key %llu would make its row or its optimizer state not finite; "
                       "nothing was changed",
                       d->name, (unsigned long long)ps_key_at(keys, bad));
    }
    if (t->stamps) /* this push's rows stay, whatever eviction does */
        for (uint32_t k = 0; k < n; k++)
            if (ts->found[k] && ts->found[k] != &not_admitted)
                *stamp_at(t, ts->found_r[k]) = now;

    /* 3. room for the new rows, within max_table_memory and table_memory:
     * refused, or made by evicting rows this push does not touch */
    rc = push_room(ts, t, keys, n, fresh, skipped, ts->found, ts->found_r, now, NULL, NULL, err, errlen);
    if (rc != 0) {
        push_undo(ts, t, n, rf);
        return rc;
    }

    /* 4. the new rows, in the order of their keys */
    if (fresh) {
        nf = 0;
        for (uint32_t k = 0; k < n; k++)
            if (!ts->found[k])
                append(t, ps_key_at(keys, k), now, ts->scratch + (size_t)(nf++) * rf);
    }
    push_count(ts, t, n, fresh, skipped, now);
    return 0;
}

int srv_tables_first_dup(srv_tables *ts, const uint8_t *keys, uint32_t n, uint32_t *a, uint32_t *b)
{
    size_t cap = 16;
    while (cap < 4 * (size_t)n) /* a quarter full at most: probes stay short */
        cap *= 2;
    if (cap > ts->dupset_cap) {
        uint32_t *p = realloc(ts->dupset, sizeof *p * cap);
        if (!p)
            return PS_ENOMEM;
        ts->dupset = p;
        ts->dupset_cap = cap;
    }
    /* position + 1 of a key seen (0: empty), the key read back from keys:
     * 4 bytes an entry, so the set of a push of 4,096 keys is 64 KiB (at
     * half full instead, 32 KiB, the check took twice as long: 6.6 ns a
     * key against 3.2 in bench/table_store) */
    uint32_t *set = ts->dupset;
    memset(set, 0, sizeof *set * cap);
    for (uint32_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, k);
        size_t s = (size_t)(ps_mix64(key) & (cap - 1));
        for (; set[s] != 0; s = (s + 1) & (cap - 1))
            if (ps_key_at(keys, set[s] - 1) == key) {
                *a = set[s] - 1;
                *b = k;
                return 1;
            }
        set[s] = k + 1;
    }
    return 0;
}

int srv_tables_first_dup_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const srv_row_hint *h,
                              uint32_t *a, uint32_t *b)
{
    const srv_table *t = ts->t[i];
    if (t->rows > SRV_DUP_BITS_ROWS || !hint_holds(h, i, keys, n))
        return srv_tables_first_dup(ts, keys, n, a, b);
    size_t words = (size_t)((t->rows + 63) / 64);
    if (words > ts->dupbits_words) {
        uint64_t *p = realloc(ts->dupbits, sizeof *p * words);
        if (!p)
            return srv_tables_first_dup(ts, keys, n, a, b);
        memset(p + ts->dupbits_words, 0, sizeof *p * (words - ts->dupbits_words));
        ts->dupbits = p;
        ts->dupbits_words = words;
    }
    /* a bit per row the pull found, set in turn: the first one found set
     * is the first repeat; a key the pull did not find (0), or a row past
     * the bits (rows removed since), sends the keys to the hash set */
    uint64_t *bits = ts->dupbits;
    const uint32_t *at = h->at;
    uint32_t k = 0;
    int dup = 0;
    for (; k < n; k++) {
        uint32_t r = at[k];
        if (r == 0 || (uint64_t)r > (uint64_t)words * 64) /* row + 1, 0: not stored */
            break;
        uint64_t *w = bits + ((r - 1) >> 6), m = 1ull << ((r - 1) & 63);
        if (*w & m) {
            dup = 1;
            break;
        }
        *w |= m;
    }
    for (uint32_t j = 0; j < k; j++)
        bits[(at[j] - 1) >> 6] = 0; /* all clear again: only these words had bits set */
    if (k == n)
        return 0;
    if (!dup)
        return srv_tables_first_dup(ts, keys, n, a, b);
    for (uint32_t j = 0; j < k; j++)
        if (at[j] == at[k]) {
            *a = j;
            *b = k;
            break;
        }
    return 1;
}

void srv_tables_set_clock(srv_tables *ts, uint32_t i, uint64_t clock)
{
    ts->t[i]->clock = clock;
}

int srv_tables_load(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *rows, const uint8_t *stamps,
                    uint64_t n, char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    if (n > SRV_TABLE_ROWS_MAX - t->rows)
        return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': %llu rows, more than a table holds (%llu)",
                    t->def.name, (unsigned long long)n, (unsigned long long)SRV_TABLE_ROWS_MAX);
    /* the checkpoint's clocks kept while a bound reads them */
    if (stamps && need_stamps(&ts->bounds) && !t->stamps && stamps_alloc(ts, t) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for its rows' clocks", t->def.name);
    if (n && reserve(ts, t, t->rows + n) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu rows", t->def.name,
                    (unsigned long long)n);
    size_t rb = (size_t)t->row_floats * sizeof(float);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, (size_t)k);
        if (lookup(t, key))
            return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': key %llu appears twice", t->def.name,
                        (unsigned long long)key);
        uint64_t stamp = stamps ? ps_key_at(stamps, (size_t)k) : 0; /* 0: before any push since */
        if (stamp > t->clock)
            return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': key %llu last pushed at clock %llu, past the "
                           "table's clock %llu", t->def.name, (unsigned long long)key, (unsigned long long)stamp,
                           (unsigned long long)t->clock);
        append(t, key, stamp, rows + (size_t)k * rb);
    }
    return 0;
}

void srv_tables_rows_at(const srv_tables *ts, uint32_t i, uint64_t off, uint32_t len, uint8_t *keys, float *w)
{
    const srv_table *t = ts->t[i];
    for (uint32_t k = 0; k < len; k++) {
        const float *p = row_at(t, off + k);
        memcpy(keys + 8 * (size_t)k, p, 8); /* stored little-endian, as the host */
        memcpy(w + (size_t)k * t->def.dim, p + HEAD, t->def.dim * sizeof(float));
    }
}

int srv_tables_load_weights(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *w, uint64_t n,
                            char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    const ps_table_def *d = &t->def;
    const uint32_t dim = d->dim, rf = t->row_floats;
    float *rows = malloc((size_t)(n ? n : 1) * rf * sizeof(float));
    if (!rows)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu rows", d->name, (unsigned long long)n);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, (size_t)k);
        float *row = rows + (size_t)k * rf;
        srv_sparse_row_new(d, key, row);
        memcpy(row, w + (size_t)k * dim * sizeof(float), dim * sizeof(float));
        for (uint32_t j = 0; j < dim; j++) {
            if (!isfinite(row[j])) {
                free(rows);
                return ps_fail(err, errlen, PS_ENONFINITE, "table '%s': the row of key %llu holds NaN or infinity",
                            d->name, (unsigned long long)key);
            }
            if (d->opt == PS_TOPT_FTRL && row[j] != 0.0f) {
                /* with n = 0 the weight is -(z - sign(z) l1) / (beta / alpha + l2) */
                double s = d->hp[PS_HP_BETA] / d->hp[PS_HP_LR] + d->hp[PS_HP_L2];
                row[dim + j] = (float)(-(double)row[j] * s - copysign(d->hp[PS_HP_L1], row[j]));
            }
        }
    }
    int rc = srv_tables_load(ts, i, keys, (const uint8_t *)rows, NULL, n, err, errlen);
    free(rows);
    return rc;
}

void srv_tables_rates(srv_tables *ts)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        srv_table *t = ts->t[i];
        t->pull_rate = (double)(t->pulled - t->last_pulled);
        t->push_rate = (double)(t->pushed - t->last_pushed);
        t->last_pulled = t->pulled;
        t->last_pushed = t->pushed;
    }
}

void srv_tables_stats(const srv_tables *ts, uint32_t i, srv_table_stats *st)
{
    const srv_table *t = ts->t[i];
    st->pull_rate = t->pull_rate;
    st->push_rate = t->push_rate;
    st->rows = t->rows;
    st->bytes = t->bytes;
    st->rows_pulled = t->pulled;
    st->rows_pushed = t->pushed;
    st->admitted = t->admitted;
    st->filtered = t->filtered;
    st->expired = t->expired;
    st->evicted = t->evicted;
    st->clock = t->clock;
}

const float *srv_tables_row(const srv_tables *ts, uint32_t i, uint64_t key)
{
    uint64_t r = lookup(ts->t[i], key);
    return r ? row_at(ts->t[i], r - 1) + HEAD : NULL;
}

void srv_tables_each(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t key, const float *row, void *arg),
                     void *arg)
{
    const srv_table *t = ts->t[i];
    for (uint64_t r = 0; r < t->rows; r++) {
        const float *p = row_at(t, r);
        fn(row_key(p), p + HEAD, arg);
    }
}

int srv_tables_pin(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float **rows,
                   void (*quiesce)(void *arg), void *arg, char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    const ps_table_def *d = &t->def;
    const srv_table_bounds *bd = &ts->bounds;
    const uint64_t now = t->clock + 1;

    /* 0. as srv_tables_push; rows move only once no thread steps one */
    int rc = push_prepare(ts, t, n, now, quiesce, arg, err, errlen);
    if (rc != 0)
        return rc;

    /* 1. the stored rows; a key not stored is new (NULL) or not admitted */
    uint64_t fresh = 0, skipped = 0;
    finder f; /* the keys and stamps alone: the threads step the values */
    const ptrdiff_t from = -(ptrdiff_t)(sizeof(float) * HEAD), to = 0;
    finder_start(&f, t, keys, n, from, to, NULL);
    uint32_t *at = ts->found_r;
    for (uint32_t k = 0; k < n; k++) {
        if ((rows[k] = finder_next(&f, 0, from, to))) {
            at[k] = (uint32_t)f.r;
            continue;
        }
        rows[k] = NULL;
        if (bd->admit > 1 && !sketch_admit(t, ps_key_at(keys, k), bd->admit)) {
            rows[k] = &not_admitted;
            skipped++;
        } else {
            fresh++;
        }
    }

    /* 2. room for the new rows, as srv_tables_push */
    rc = push_room(ts, t, keys, n, fresh, skipped, rows, at, now, quiesce, arg, err, errlen);
    if (rc != 0)
        return rc;

    /* 3. new rows at their initial values; every row stamped with this push */
    for (uint32_t k = 0; k < n; k++) {
        if (rows[k] == &not_admitted) {
            rows[k] = NULL;
        } else if (rows[k]) {
            if (t->stamps)
                *stamp_at(t, at[k]) = now;
        } else {
            uint64_t key = ps_key_at(keys, k);
            srv_sparse_row_new(d, key, ts->scratch);
            append(t, key, now, ts->scratch);
            rows[k] = row_at(t, t->rows - 1) + HEAD;
        }
    }
    push_count(ts, t, n, fresh, skipped, now);
    return 0;
}

void srv_tables_each_stamp(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t stamp, void *arg), void *arg)
{
    const srv_table *t = ts->t[i];
    for (uint64_t r = 0; r < t->rows; r++)
        fn(t->stamps ? *stamp_at(t, r) : t->clock, arg);
}
