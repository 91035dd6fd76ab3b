/* table_move.c - rows leaving this psd for other parts while pushes go on
 * (a move of parts, PROTOCOL.md 18), and rows arriving from them.
 *
 * A source hands each destination d its rows (the keys whose part under
 * the new map is d) in two ways. A pass walks every table's rows by
 * position, one cursor per destination. From the move's start on, every
 * change to a moving row (a push or a new row, a removal, and a removal
 * moving the last row into the removed one's place) marks its key dirty
 * for its destination, so a row the pass already gave, or one the pass
 * will miss because it moved below the cursor, is given again (a removed
 * one as a tombstone). At the handover the source refuses the moving keys
 * first (store/parts.c), so what it then gives of the dirty keys is final.
 * Rows go with their optimizer state; each starts its clock anew on its
 * new part (admission, expiry and eviction count that part's pushes).
 *
 * The bytes a gather writes (little-endian; the destination applies them
 * with srv_tables_move_apply): u32 ntables, then each table's declaration
 * (64 bytes name, u32 dim, u32 rinit, f64 scale, u64 seed, u32 opt, u32 0,
 * PS_HP_COUNT f64 hp), then records: u32 table, u32 present, u64 key and,
 * when present, the row's srv_sparse_row_floats float32 values; present 0
 * is a row the source no longer holds. The marks are table_mark.c's. */
#include "server/tables/table_rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DECL_BYTES (64 + 4 + 4 + 8 + 8 + 4 + 4 + 8 * PS_HP_COUNT)
#define REC_HEAD 16

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static void put_decl(uint8_t *p, const ps_table_def *d)
{
    memset(p, 0, DECL_BYTES);
    memcpy(p, d->name, strnlen(d->name, 63));
    put32(p + 64, d->dim);
    put32(p + 68, d->rinit);
    memcpy(p + 72, &d->scale, 8);
    put64(p + 80, d->seed);
    put32(p + 88, d->opt);
    memcpy(p + 96, d->hp, 8 * PS_HP_COUNT);
}

/* Appends the record of key in table ti (its row when stored). */
static int put_record(srv_tables *ts, uint32_t ti, uint64_t key, ps_buf *out, uint64_t *rows)
{
    const srv_table *t = ts->t[ti];
    uint64_t r = lookup(t, key);
    size_t need = REC_HEAD + (r ? (size_t)t->row_floats * 4 : 0);
    if (ps_buf_reserve(out, need) != 0)
        return PS_ENOMEM;
    uint8_t *p = out->p + out->len;
    put32(p, ti);
    put32(p + 4, r != 0);
    put64(p + 8, key);
    if (r)
        memcpy(p + REC_HEAD, row_at(t, r - 1) + HEAD, (size_t)t->row_floats * 4);
    out->len += need;
    (*rows)++;
    return 0;
}

int srv_tables_move_gather(srv_tables *ts, uint32_t d, size_t max, int dirty_only, ps_buf *out, int *pass_done,
                           uint64_t *rows)
{
    struct srv_tables_move *mv = ts->mv;
    *rows = 0;
    *pass_done = 0;
    if (!mv || d >= mv->new_n || (int32_t)d == mv->self)
        return PS_ESTATE;
    out->len = 0;
    if (ps_buf_reserve(out, 4 + (size_t)ts->n * DECL_BYTES) != 0)
        return PS_ENOMEM;
    put32(out->p, ts->n);
    for (uint32_t i = 0; i < ts->n; i++)
        put_decl(out->p + 4 + (size_t)i * DECL_BYTES, &ts->t[i]->def);
    out->len = 4 + (size_t)ts->n * DECL_BYTES;
    /* the pass */
    while (!dirty_only && mv->at[d] < ts->n && out->len < max) {
        srv_table *t = ts->t[mv->at[d]];
        uint64_t *c = &mv->cur[d][mv->at[d]];
        for (; *c < t->rows && out->len < max; (*c)++) {
            uint64_t key = key_of(t, *c);
            if (tbl_move_dest(mv, key) == d && put_record(ts, mv->at[d], key, out, rows) != 0)
                return PS_ENOMEM;
        }
        if (*c >= t->rows)
            mv->at[d]++;
    }
    if (mv->at[d] < ts->n && !dirty_only)
        return 0;
    /* the dirty keys, once the pass is over */
    struct tbl_dirty *s = &mv->d[d];
    for (uint64_t i = 0; i < s->cap && out->len < max; i++) {
        if (!s->tab[i])
            continue;
        if (put_record(ts, s->tab[i] - 1, s->keys[i], out, rows) != 0)
            return PS_ENOMEM;
        s->tab[i] = 0;
        s->n--;
    }
    if (s->n)
        tbl_move_rebuild(ts, s); /* slots emptied out of their probe order */
    *pass_done = 1;
    return 0;
}

void srv_tables_move_drop(srv_tables *ts, uint32_t new_n, int32_t self)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        srv_table *t = ts->t[i];
        for (uint64_t r = 0; r < t->rows;) {
            if ((int32_t)ps_table_part(key_of(t, r), new_n) != self)
                tbl_row_remove(t, r); /* the last row comes here: look at r again */
            else
                r++;
        }
        tbl_trim(ts, t, t->rows);
    }
    ts->stamp++;
}

void srv_tables_drop_begin(srv_tables *ts, uint32_t new_n, int32_t self)
{
    ts->drop.on = 1;
    ts->drop.n = new_n;
    ts->drop.self = self;
    ts->drop.table = 0;
    ts->drop.r = 0;
    ts->drop.dropped = 0;
}

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* Drops until end_us (0: no end) or `most` rows looked at, counting them
 * in *steps; 1 once all are gone. */
static int drop_run(srv_tables *ts, uint64_t end_us, uint64_t most, uint64_t *steps)
{
    if (!ts->drop.on)
        return 1;
    while (ts->drop.table < ts->n) {
        srv_table *t = ts->t[ts->drop.table];
        for (uint32_t k = 0; ts->drop.r < t->rows; k++, (*steps)++) {
            if (*steps >= most || (end_us && (k & 1023) == 1023 && now_us() >= end_us))
                return 0;
            if ((int32_t)ps_table_part(key_of(t, ts->drop.r), ts->drop.n) != ts->drop.self) {
                tbl_row_remove(t, ts->drop.r); /* the last row comes here: look at it next */
                ts->drop.dropped++;
            } else {
                ts->drop.r++;
            }
        }
        tbl_trim(ts, t, t->rows);
        ts->drop.table++;
        ts->drop.r = 0;
    }
    ts->drop.on = 0;
    ts->stamp++;
    return 1;
}

int srv_tables_drop_some(srv_tables *ts, uint64_t budget_us, uint64_t *steps)
{
    *steps = 0;
    return drop_run(ts, now_us() + budget_us, UINT64_MAX, steps);
}

int srv_tables_drop_steps(srv_tables *ts, uint64_t steps)
{
    uint64_t done = 0;
    return drop_run(ts, 0, steps, &done);
}

void srv_tables_move_drop_from(srv_tables *ts, uint32_t old_n, uint32_t src)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        srv_table *t = ts->t[i];
        for (uint64_t r = 0; r < t->rows;) {
            if (ps_table_part(key_of(t, r), old_n) == src)
                tbl_row_remove(t, r);
            else
                r++;
        }
        tbl_trim(ts, t, t->rows);
    }
    ts->stamp++;
}

void srv_tables_set_part(srv_tables *ts, uint32_t part, uint32_t nparts)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        ts->t[i]->def.part = nparts > 1 ? part : 0;
        ts->t[i]->def.nparts = nparts > 1 ? nparts : 1;
    }
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int srv_tables_move_apply(srv_tables *ts, const uint8_t *b, size_t len, uint32_t part, uint32_t nparts,
                          uint64_t *rows, char *err, size_t errlen)
{
    *rows = 0;
    if (len < 4)
        return ps_fail(err, errlen, PS_EMALFORMED, "a move's answer of %zu bytes: shorter than its head", len);
    uint32_t nt = get32(b);
    if (nt > PS_TABLES_MAX || len < 4 + (size_t)nt * DECL_BYTES)
        return ps_fail(err, errlen, PS_EMALFORMED, "a move's answer names %u tables in %zu bytes", nt, len);
    uint32_t idx[PS_TABLES_MAX];
    for (uint32_t i = 0; i < nt; i++) {
        const uint8_t *p = b + 4 + (size_t)i * DECL_BYTES;
        ps_table_def d;
        memset(&d, 0, sizeof d);
        memcpy(d.name, p, 63);
        d.dim = get32(p + 64);
        d.rinit = get32(p + 68);
        memcpy(&d.scale, p + 72, 8);
        d.seed = get64(p + 80);
        d.opt = get32(p + 88);
        memcpy(d.hp, p + 96, 8 * PS_HP_COUNT);
        d.part = nparts > 1 ? part : 0;
        d.nparts = nparts > 1 ? nparts : 1;
        int held = srv_tables_find(ts, d.name);
        if (held >= 0) { /* a part that stays holds it as its part of the old map until the move ends */
            d.part = ts->t[held]->def.part;
            d.nparts = ts->t[held]->def.nparts;
        }
        int rc = srv_tables_declare(ts, &d, &idx[i], err, errlen);
        if (rc != 0)
            return rc;
    }
    size_t at = 4 + (size_t)nt * DECL_BYTES;
    while (at < len) {
        if (len - at < 4)
            break; /* the answer's padding to whole float32 words */
        if (len - at < REC_HEAD)
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's answer ends inside a record's head");
        uint32_t ti = get32(b + at), present = get32(b + at + 4);
        uint64_t key = get64(b + at + 8);
        if (ti >= nt || present > 1)
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's record names table %u of %u (present %u)", ti, nt,
                           present);
        srv_table *t = ts->t[idx[ti]];
        size_t rb = present ? (size_t)t->row_floats * 4 : 0;
        if (len - at - REC_HEAD < rb)
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's answer ends inside the row of key %llu",
                           (unsigned long long)key);
        if (ps_table_part(key, nparts) != part)
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's answer gives key %llu of part %u of %u to part %u",
                           (unsigned long long)key, ps_table_part(key, nparts), nparts, part);
        uint64_t r = lookup(t, key);
        if (present && r) {
            snap_touch(t, r - 1);
            memcpy(row_at(t, r - 1) + HEAD, b + at + REC_HEAD, rb);
            if (t->stamps)
                *stamp_at(t, r - 1) = t->clock;
        } else if (present) {
            uint64_t evict = 0;
            /* max_table_memory and table_memory bound moved rows as pushed
             * ones, checked as a block of rows is added; a moved row is
             * never evicted: past the bound, the move stops here */
            if ((t->rows & (((uint64_t)1 << t->shift) - 1)) == 0 &&
                (tbl_room_for(ts, t, 1u << t->shift, (uint64_t)1 << t->shift, 0, &evict, err, errlen) != 0 || evict))
                return evict ? ps_fail(err, errlen, PS_ELIMIT, "table '%s': the rows moving here would pass "
                                       "max_table_memory or table_memory (it holds %llu rows in %llu bytes); raise "
                                       "it on this psd", t->def.name, (unsigned long long)t->rows,
                                       (unsigned long long)t->bytes)
                             : PS_ELIMIT;
            if (tbl_reserve(ts, t, t->rows + 1) != 0)
                return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a moved row", t->def.name);
            append(t, key, t->clock, b + at + REC_HEAD);
        } else if (r) {
            tbl_row_remove(t, r - 1);
        }
        (*rows)++;
        at += REC_HEAD + rb;
    }
    for (uint32_t i = 0; i < nt; i++)
        tbl_count_bytes(ts, ts->t[idx[i]]);
    ts->stamp++;
    return 0;
}
