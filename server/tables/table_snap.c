/* table_snap.c - a snapshot of the tables read a block at a time while
 * pushes go on (table.h: srv_tables_snap_begin), without fork.
 *
 * Each table remembers how many rows it had, its clock and whether its
 * rows had clocks; a cursor walks its blocks in order. A block before the
 * cursor has been read. Before anything writes a row's memory (a push's
 * step or stamp, a removal moving the last row into it, a new row written
 * over a removed one's memory) or frees its block, snap_touch calls
 * tbl_snap_keep, which copies the row, once, when it lies at or after the
 * cursor and below the rows the snapshot saw: its key, values and clock go
 * into an arena, chained from its block, and a bit marks it kept. Reading a
 * block takes each row live, or from its copy when it was kept. A removed
 * row's memory past the table's rows is left as it was until a new row or
 * a free reaches it, and both keep it first, so a row is read live only
 * while it still holds what the snapshot saw.
 *
 * Owns the snapshot's state: srv_tables.snap (the cursor over the tables,
 * the block handed out) and each srv_table.snap (its rows' copies). */
#include "server/tables/table_rows.h"

#include <stdlib.h>
#include <sys/mman.h>

/* The kept rows lie in chunks of this many bytes, each mapped on its own
 * with transparent huge pages asked for: a first write to a fresh 4 KiB
 * page is a fault (about 17 us on the 2-core machine of bench/README.md,
 * one per 27 kept rows of dim 16); to a 2 MiB page, one per 14,000. */
#define CHUNK_BYTES ((size_t)32 << 20)

/* A kept row: its position, clock and next kept row of its block, then its
 * stride floats (key and values) as they were. */
typedef struct kept_row {
    uint64_t r;
    uint64_t stamp;
    uint32_t next;     /* the next kept row of the block: index + 1; 0: none */
    uint32_t pad;
} kept_row;

struct tbl_snap {
    uint64_t rows;     /* the table's rows at the snapshot */
    uint64_t clock;    /* its clock then */
    int stamped;       /* its rows had clocks then */
    uint32_t cursor;   /* the next block read; those before it are read */
    uint64_t *kept;    /* a bit per row: kept below */
    uint32_t *head;    /* per block: its last kept row's index + 1; 0: none */
    uint8_t **chunk;   /* the kept rows, `entry` bytes each, per_chunk to a chunk */
    size_t nchunks, chunks_cap;
    size_t entry, per_chunk, used;
    int failed;        /* a row could not be kept: the snapshot is of no use */
};

struct srv_tables_snap {
    uint64_t id;
    uint32_t n;        /* tables at the snapshot */
    uint32_t at;       /* the table being read */
    uint8_t *keys, *stamps; /* one block's, as handed out */
    float *rows;
};

static uint64_t next_id = 1;

static kept_row *entry_at(const struct tbl_snap *sn, uint32_t i)
{
    return (kept_row *)(sn->chunk[i / sn->per_chunk] + (size_t)(i % sn->per_chunk) * sn->entry);
}

/* Room for one more kept row: 0, or -1 (out of memory). */
static int room_for_one(struct tbl_snap *sn)
{
    if (sn->used < sn->nchunks * sn->per_chunk)
        return 0;
    if (sn->used + sn->per_chunk > UINT32_MAX)
        return -1;
    if (sn->nchunks == sn->chunks_cap) {
        size_t cap = sn->chunks_cap ? 2 * sn->chunks_cap : 16;
        uint8_t **c = realloc(sn->chunk, cap * sizeof *c);
        if (!c)
            return -1;
        sn->chunk = c;
        sn->chunks_cap = cap;
    }
    void *p = mmap(NULL, CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    madvise(p, CHUNK_BYTES, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
    sn->chunk[sn->nchunks++] = p;
    return 0;
}

void tbl_snap_keep(srv_table *t, uint64_t r)
{
    struct tbl_snap *sn = t->snap;
    if (r >= sn->rows || (r >> t->shift) < sn->cursor || (sn->kept[r >> 6] >> (r & 63) & 1) || sn->failed)
        return;
    if (room_for_one(sn) != 0) {
        sn->failed = 1;
        return;
    }
    uint32_t i = (uint32_t)sn->used++;
    kept_row *e = entry_at(sn, i);
    uint32_t b = (uint32_t)(r >> t->shift);
    e->r = r;
    e->stamp = sn->stamped && t->stamps ? *stamp_at(t, r) : sn->clock;
    e->next = sn->head[b];
    e->pad = 0;
    memcpy(e + 1, row_at(t, r), sizeof(float) * t->stride);
    sn->head[b] = i + 1;
    sn->kept[r >> 6] |= 1ull << (r & 63);
}

void tbl_snap_keep_all(srv_table *t)
{
    struct tbl_snap *sn = t->snap;
    if (!sn)
        return;
    for (uint64_t r = (uint64_t)sn->cursor << t->shift; r < sn->rows; r++)
        tbl_snap_keep(t, r);
}

void tbl_snap_drop(srv_table *t)
{
    struct tbl_snap *sn = t->snap;
    if (!sn)
        return;
    free(sn->kept);
    free(sn->head);
    for (size_t c = 0; c < sn->nchunks; c++)
        munmap(sn->chunk[c], CHUNK_BYTES);
    free(sn->chunk);
    free(sn);
    t->snap = NULL;
}

static void snap_free(srv_tables *ts)
{
    struct srv_tables_snap *q = ts->snap;
    if (!q)
        return;
    for (uint32_t i = 0; i < q->n && i < ts->n; i++)
        tbl_snap_drop(ts->t[i]);
    free(q->keys);
    free(q->stamps);
    free(q->rows);
    free(q);
    ts->snap = NULL;
}

int srv_tables_snap_begin(srv_tables *ts, uint64_t *id)
{
    if (ts->snap)
        return PS_ESTATE;
    struct srv_tables_snap *q = calloc(1, sizeof *q);
    if (!q)
        return PS_ENOMEM;
    ts->snap = q;
    q->n = ts->n;
    size_t most_rows = 1, most_floats = 1;
    for (uint32_t i = 0; i < ts->n; i++) {
        srv_table *t = ts->t[i];
        struct tbl_snap *sn = calloc(1, sizeof *sn);
        if (!sn)
            goto nomem;
        t->snap = sn;
        sn->rows = t->rows;
        sn->clock = t->clock;
        sn->stamped = t->stamps != NULL;
        sn->entry = (sizeof(kept_row) + sizeof(float) * t->stride + 7) & ~(size_t)7; /* each one aligned */
        sn->per_chunk = CHUNK_BYTES / sn->entry;
        uint64_t nb = (t->rows + (1ull << t->shift) - 1) >> t->shift;
        sn->kept = calloc((size_t)(t->rows / 64 + 1), sizeof *sn->kept);
        sn->head = calloc((size_t)nb + 1, sizeof *sn->head);
        if (!sn->kept || !sn->head)
            goto nomem;
        size_t per = (size_t)1 << t->shift;
        if (per > most_rows)
            most_rows = per;
        if (per * t->row_floats > most_floats)
            most_floats = per * t->row_floats;
    }
    q->keys = malloc(8 * most_rows);
    q->stamps = malloc(8 * most_rows);
    q->rows = malloc(sizeof(float) * most_floats);
    if (!q->keys || !q->stamps || !q->rows)
        goto nomem;
    q->id = *id = next_id++;
    return 0;
nomem:
    snap_free(ts);
    return PS_ENOMEM;
}

static void put_le(uint8_t *p, uint64_t v)
{
    for (int b = 0; b < 8; b++)
        p[b] = (uint8_t)(v >> (8 * b));
}

/* Row k of the block handed out: key, values and clock from p (stride
 * floats: key, then values). */
static void hand_out(struct srv_tables_snap *q, const srv_table *t, uint32_t k, const float *p, uint64_t stamp)
{
    put_le(q->keys + 8 * (size_t)k, row_key(p));
    memcpy(q->rows + (size_t)k * t->row_floats, p + HEAD, sizeof(float) * t->row_floats);
    put_le(q->stamps + 8 * (size_t)k, stamp);
}

int srv_tables_snap_next(srv_tables *ts, uint64_t id, srv_tables_block *b)
{
    struct srv_tables_snap *q = ts->snap;
    if (!q || q->id != id)
        return PS_ESTATE;
    for (; q->at < q->n; q->at++) {
        srv_table *t = ts->t[q->at];
        struct tbl_snap *sn = t->snap;
        if (sn->failed)
            return PS_ENOMEM;
        uint64_t first = (uint64_t)sn->cursor << t->shift;
        if (first >= sn->rows)
            continue;
        uint64_t left = sn->rows - first, per = 1ull << t->shift;
        uint32_t n = (uint32_t)(left < per ? left : per);
        for (uint32_t k = 0; k < n; k++) {
            uint64_t r = first + k;
            if (!(sn->kept[r >> 6] >> (r & 63) & 1))
                hand_out(q, t, k, row_at(t, r), sn->stamped && t->stamps ? *stamp_at(t, r) : sn->clock);
        }
        for (uint32_t i = sn->head[sn->cursor]; i; i = entry_at(sn, i - 1)->next) {
            const kept_row *e = entry_at(sn, i - 1);
            hand_out(q, t, (uint32_t)(e->r - first), (const float *)(e + 1), e->stamp);
        }
        sn->cursor++;
        b->table = q->at;
        b->first = first;
        b->n = n;
        b->keys = q->keys;
        b->rows = q->rows;
        b->stamps = q->stamps;
        return 1;
    }
    return 0;
}

uint64_t srv_tables_snap_kept(const srv_tables *ts, uint64_t id)
{
    const struct srv_tables_snap *q = ts->snap;
    uint64_t n = 0;
    if (q && q->id == id)
        for (uint32_t i = 0; i < q->n; i++)
            n += ts->t[i]->snap->used;
    return n;
}

void srv_tables_snap_end(srv_tables *ts, uint64_t id)
{
    if (ts->snap && ts->snap->id == id)
        snap_free(ts);
}

void tbl_snaps_free(srv_tables *ts)
{
    snap_free(ts);
}
