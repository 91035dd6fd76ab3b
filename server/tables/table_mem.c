/* table_mem.c - a table's memory (table_rows.h): its blocks of rows and
 * their clocks, its slots, grown for more rows (tbl_reserve), trimmed after
 * rows left (tbl_trim), a row removed (tbl_row_remove), the bytes counted;
 * and the push's scratch. */
#include "server/tables/table_rows.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

size_t page_bytes(void)
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
uint64_t tbl_block_bytes(const srv_table *t)
{
    uint64_t b = ((uint64_t)t->stride << t->shift) * sizeof(float), pg = page_bytes();
    return (b + pg - 1) / pg * pg;
}

/* One block's stamps. */
uint64_t tbl_stamp_block_bytes(const srv_table *t)
{
    return (sizeof(uint64_t) << t->shift);
}

float *tbl_block_new(const srv_table *t)
{
    /* its pages made at once, in one call: a block fills from its first row
     * to its last, and a fault per 4 KiB page cost about 17 us on the 2-core
     * machine of bench/README.md */
    void *p = mmap(NULL, tbl_block_bytes(t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
                   0);
    return p == MAP_FAILED ? NULL : p;
}

void tbl_block_free(const srv_table *t, float *b)
{
    if (b)
        munmap(b, tbl_block_bytes(t));
}

/* What holding `rows` rows takes: slots, blocks and the block list, in the
 * sizes srv_table grows them to. */
void tbl_plan_size(const srv_table *t, uint64_t rows, uint64_t *cap, uint32_t *nblocks, uint32_t *blocks_cap)
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
uint64_t tbl_size_of(const srv_table *t, uint64_t cap, uint32_t nblocks, uint32_t blocks_cap, int stamped)
{
    uint64_t per_block = tbl_block_bytes(t) + (stamped ? tbl_stamp_block_bytes(t) : 0);
    return sizeof *t + cap * SLOT_BYTES + (uint64_t)nblocks * per_block +
           (uint64_t)blocks_cap * sizeof(float *) * (stamped ? 2 : 1);
}

/* What a new table takes with its first row (and admission's counters, and
 * the row's stamp). */
uint64_t tbl_first_row_bytes(const srv_table *t, int sketch, int stamped)
{
    uint64_t cap;
    uint32_t nb, bc;
    tbl_plan_size(t, 1, &cap, &nb, &bc);
    return tbl_size_of(t, cap, nb, bc, stamped) + (sketch ? SKETCH_BYTES : 0);
}

void tbl_count_bytes(srv_tables *ts, srv_table *t)
{
    uint64_t now = tbl_size_of(t, t->cap, t->nblocks, t->blocks_cap, t->stamps != NULL) + (t->sketch ? SKETCH_BYTES : 0);
    ts->bytes = ts->bytes - t->bytes + now;
    t->bytes = now;
}

/* Makes room for `rows` rows: slots (rehashed into a larger array), blocks
 * (and their stamps while the table holds stamps) and the block lists.
 * Returns 0 or PS_ENOMEM, the table then unchanged but for capacity it
 * kept. Updates t->bytes and ts->bytes. */
int tbl_reserve(srv_tables *ts, srv_table *t, uint64_t rows)
{
    uint64_t cap;
    uint32_t nb, bc;
    tbl_plan_size(t, rows, &cap, &nb, &bc);
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
        float *b = tbl_block_new(t);
        if (!b)
            goto out;
        if (t->stamps) {
            uint64_t *s = malloc(tbl_stamp_block_bytes(t));
            if (!s) {
                tbl_block_free(t, b);
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
    tbl_count_bytes(ts, t);
    return rc;
}

/* Frees the blocks (and stamps) past those `rows` rows need: after rows
 * were removed to make room. */
void tbl_trim(srv_tables *ts, srv_table *t, uint64_t rows)
{
    uint64_t nb = (rows + (1ull << t->shift) - 1) >> t->shift;
    while (t->nblocks > nb) {
        t->nblocks--;
        if (t->snap) /* its rows as a snapshot saw them, kept first */
            for (uint64_t r = (uint64_t)t->nblocks << t->shift; r < ((uint64_t)t->nblocks + 1) << t->shift; r++)
                tbl_snap_keep(t, r);
        tbl_block_free(t, t->blocks[t->nblocks]);
        if (t->stamps)
            free(t->stamps[t->nblocks]);
    }
    tbl_count_bytes(ts, t);
}

/* The slot that holds row r, whose key is key. */
uint64_t tbl_slot_find(const srv_table *t, uint64_t key, uint64_t r)
{
    uint64_t s = ps_mix64(key) & (t->cap - 1);
    while ((t->slots[s] & t->rmask) != r + 1)
        s = (s + 1) & (t->cap - 1);
    return s;
}

/* Removes row r: its key leaves the slots (the probe chain after it shifted
 * back, so every key stays reachable) and the last row (and its stamp)
 * moves into its place. */
void tbl_row_remove(srv_table *t, uint64_t r)
{
    snap_touch(t, r);
    float *p = row_at(t, r);
    move_touch(t, row_key(p)); /* it goes, and the last row takes its place */
    if (r != t->rows - 1)
        move_touch(t, key_of(t, t->rows - 1));
    uint64_t m = t->cap - 1, i = tbl_slot_find(t, row_key(p), r);
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
        uint64_t s = tbl_slot_find(t, row_key(p), last);
        t->slots[s] = (t->slots[s] & ~t->rmask) | (uint32_t)(r + 1);
    }
    t->rows--;
}

/* Room for `floats` floats in *p (*have of them now), at least doubled
 * when it grows, so that a push grows it a few times at most. */
int tbl_room_grow(float **p, size_t *have, size_t floats)
{
    size_t want = floats > 2 * *have ? floats : 2 * *have;
    float *q = realloc(*p, sizeof *q * want);
    if (!q)
        return PS_ENOMEM;
    *p = q;
    *have = want;
    return 0;
}

/* Room for the found rows of a push of n keys (scratch grows as the push
 * finds new rows; undo takes n rows at the push's start, so that its loop
 * does not ask for room at every row: the two take one to two copies of
 * the push's rows). */
int tbl_grow_scratch(srv_tables *ts, size_t n)
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

float tbl_not_admitted; /* ts->found's mark of a key skipped by admission */
