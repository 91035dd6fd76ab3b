/* table.c - the row store of psd's embedding tables (see table.h):
 * declaring a table, finding rows (the finder, with its prefetches and the
 * connection's row hint), pulls, pushes in two passes, duplicate keys, and
 * the loop's half of a Hogwild! push (srv_tables_pin). A table's memory is
 * table_mem.c's, what bounds its rows bounds.c's, a table read or loaded
 * whole table_whole.c's; table_rows.h is the layout they share. */
#include "server/tables/table_rows.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

uint64_t srv_table_row_bytes(const ps_table_def *d)
{
    /* the row with its key, and its slots at the highest load */
    return (uint64_t)(srv_sparse_row_floats(d) + HEAD) * sizeof(float) + (SLOT_BYTES * LOAD_DEN + LOAD_NUM - 1) / LOAD_NUM;
}

void srv_tables_init(srv_tables *ts, uint64_t max_bytes)
{
    memset(ts, 0, sizeof *ts);
    ts->max_bytes = max_bytes;
}

void srv_tables_move(srv_tables *ts, srv_tables *out)
{
    *out = *ts;
    srv_tables_init(ts, out->max_bytes);
    ts->bounds = out->bounds;
}

void srv_tables_move_back(srv_tables *ts, srv_tables *from, int keep)
{
    if (keep) {
        if (ts->stamp <= from->stamp)
            ts->stamp = from->stamp + 1;
        srv_tables_free(from);
        return;
    }
    srv_tables_free(ts);
    *ts = *from;
}

static void table_free(srv_table *t)
{
    if (!t)
        return;
    tbl_snap_drop(t);
    for (uint32_t b = 0; b < t->nblocks; b++) {
        tbl_block_free(t, t->blocks[b]);
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
    tbl_snaps_free(ts);
    srv_tables_move_end(ts);
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
    uint64_t first = tbl_first_row_bytes(t, ts->bounds.admit > 1, need_stamps(&ts->bounds));
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
    t->mv = ts->mv ? ts : NULL; /* rows leaving for other parts: its too */
    *idx = ts->n;
    ts->t[ts->n++] = t;
    ts->stamp++;
    return 0;
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

/* Puts the stored rows among the first n keys of a push back as they were
 * (undo holds each one's stamp and values, 2 + rf floats, in the order of
 * the keys). */
static void push_undo(srv_tables *ts, const srv_table *t, uint32_t n, uint32_t rf)
{
    size_t j = 0;
    for (uint32_t k = 0; k < n; k++)
        if (ts->found[k] && ts->found[k] != &tbl_not_admitted) {
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
    const int stamped = t->stamps != NULL, snapping = t->snap != NULL;
    finder_start(&f, t, keys, n, from, to, hint);
    for (uint32_t k = 0; k < n; k++) {
        float *row = ts->found[k] = finder_next(&f, hinting, from, to);
        if (row) {
            ts->found_r[k] = (uint32_t)f.r;
            if (snapping) /* a snapshot not past it keeps it as it is */
                tbl_snap_keep(t, f.r);
            move_touch(t, ps_key_at(keys, k));
            if (stamped)
                memcpy(u, stamp_at(t, f.r), sizeof(uint64_t));
            memcpy(u + 2, row, sizeof(float) * rf);
            u += rf + 2;
            continue;
        }
        uint64_t key = ps_key_at(keys, k);
        if (bd->admit > 1 && !tbl_sketch_admit(t, key, bd->admit)) {
            ts->found[k] = &tbl_not_admitted; /* counted, not stored */
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
    int rc = tbl_push_prepare(ts, t, n, now, NULL, NULL, err, errlen);
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
        ts->steprow[k] = row == &tbl_not_admitted ? NULL : row ? row : ts->scratch + (size_t)(nf++) * rf;
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
            if (ts->found[k] && ts->found[k] != &tbl_not_admitted)
                *stamp_at(t, ts->found_r[k]) = now;

    /* 3. room for the new rows, within max_table_memory and table_memory:
     * refused, or made by evicting rows this push does not touch */
    rc = tbl_push_room(ts, t, keys, n, fresh, skipped, ts->found, ts->found_r, now, NULL, NULL, err, errlen);
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

int srv_tables_pin(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float **rows,
                   void (*quiesce)(void *arg), void *arg, char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    const ps_table_def *d = &t->def;
    const srv_table_bounds *bd = &ts->bounds;
    const uint64_t now = t->clock + 1;

    /* 0. as srv_tables_push; rows move only once no thread steps one */
    int rc = tbl_push_prepare(ts, t, n, now, quiesce, arg, err, errlen);
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
            snap_touch(t, f.r);
            move_touch(t, ps_key_at(keys, k));
            continue;
        }
        rows[k] = NULL;
        if (bd->admit > 1 && !tbl_sketch_admit(t, ps_key_at(keys, k), bd->admit)) {
            rows[k] = &tbl_not_admitted;
            skipped++;
        } else {
            fresh++;
        }
    }

    /* 2. room for the new rows, as srv_tables_push */
    rc = tbl_push_room(ts, t, keys, n, fresh, skipped, rows, at, now, quiesce, arg, err, errlen);
    if (rc != 0)
        return rc;

    /* 3. new rows at their initial values; every row stamped with this push */
    for (uint32_t k = 0; k < n; k++) {
        if (rows[k] == &tbl_not_admitted) {
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
