/* bounds.c - what bounds a table's rows (table.h, srv_table_bounds; the
 * settings table_admit, table_expire, table_memory, table_full): admission
 * (a count-min sketch: a key gets a row at its admit-th push), expiry (rows
 * not pushed in `expire` pushes go, a window scanned per push), room within
 * max_table_memory and table_memory, and what a full table does
 * (enum ps_table_full: refuse the push, or evict the least recently pushed
 * rows of a sample); the rows' clocks these read, held while one does. The
 * two steps of a push that ask them, tbl_push_prepare and tbl_push_room,
 * are called by the row store (table.c). A new eviction policy goes here. */
#include "server/tables/table_rows.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void srv_tables_set_limit(srv_tables *ts, uint64_t max_bytes)
{
    ts->max_bytes = max_bytes;
}

void srv_tables_set_bounds(srv_tables *ts, const srv_table_bounds *b)
{
    ts->bounds = *b;
}

srv_table_bounds srv_table_bounds_of(const ps_config *cfg)
{
    return (srv_table_bounds){.admit = (uint32_t)cfg->table_admit,
                              .expire = cfg->table_expire,
                              .table_bytes = cfg->table_memory,
                              .full = cfg->table_full == PS_TABLE_FULL_EVICT ? PS_TABLE_FULL_EVICT
                                                                               : PS_TABLE_FULL_REFUSE};
}

void srv_tables_configure(srv_tables *ts, const ps_config *cfg)
{
    ts->max_bytes = cfg->max_table_memory;
    ts->bounds = srv_table_bounds_of(cfg);
}

/* Admission: counts one push of key in the table's sketch (conservative
 * update: only the smallest counters grow) and returns 1 when the key has
 * now been pushed `admit` times (or more: collisions overcount), counts
 * halving every SKETCH_AGE counted pushes. */
int tbl_sketch_admit(srv_table *t, uint64_t key, uint32_t admit)
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
void tbl_expire_scan(srv_table *t, uint64_t now, uint64_t expire, uint64_t window)
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
            tbl_row_remove(t, c);
            t->expired++;
        }
    }
    t->scan = c;
}

uint64_t tbl_xorshift(uint64_t *s)
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
void tbl_evict(srv_table *t, uint64_t e, uint64_t now)
{
    for (uint64_t k = 0; k < e; k++) {
        uint64_t best = UINT64_MAX, best_stamp = UINT64_MAX;
        for (uint32_t d = 0; d < EVICT_SAMPLE || best == UINT64_MAX; d++) {
            uint64_t r = tbl_xorshift(&t->rng) % t->rows, st = *stamp_at(t, r);
            if (st < now && st < best_stamp) {
                best = r;
                best_stamp = st;
            }
        }
        tbl_row_remove(t, best);
        t->evicted++;
    }
}

/* The largest number of rows table t may hold within `allowed` bytes, its
 * slots and blocks grown as tbl_reserve() grows them (0 when even its present
 * capacity passes it). */
uint64_t tbl_rows_within(const srv_table *t, uint64_t allowed, uint64_t upto, int stamped)
{
    uint64_t lo = 0, hi = upto;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2, cap;
        uint32_t nb, bc;
        tbl_plan_size(t, mid, &cap, &nb, &bc);
        if (tbl_size_of(t, cap, nb, bc, stamped) <= allowed)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The bytes table t may take within max_table_memory (beside the other
 * tables) and table_memory; *by_table: table_memory is the tighter. */
uint64_t tbl_allowed_bytes(const srv_tables *ts, const srv_table *t, int *by_table)
{
    uint64_t others = ts->bytes - t->bytes;
    uint64_t allowed = ts->max_bytes > others ? ts->max_bytes - others : 0;
    *by_table = ts->bounds.table_bytes && ts->bounds.table_bytes < allowed;
    return *by_table ? ts->bounds.table_bytes : allowed;
}

/* Room for `fresh` new rows of a push of n keys (`skipped` of them not
 * admitted), within max_table_memory and table_memory: 0 with *evict the
 * rows to evict first (0: none needed), or PS_ELIMIT with err. */
int tbl_room_for(srv_tables *ts, srv_table *t, uint32_t n, uint64_t fresh, uint64_t skipped, uint64_t *evict_n,
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
    uint64_t allowed = tbl_allowed_bytes(ts, t, &by_table), sketch = t->sketch ? SKETCH_BYTES : 0;
    allowed = allowed > sketch ? allowed - sketch : 0;
    uint64_t cap;
    uint32_t nb, bc;
    tbl_plan_size(t, t->rows + fresh, &cap, &nb, &bc);
    uint64_t need = tbl_size_of(t, cap, nb, bc, t->stamps != NULL), others = ts->bytes - t->bytes;
    if (need > allowed) {
        uint64_t fit = tbl_rows_within(t, allowed, t->rows + fresh, t->stamps != NULL),
                 touched = (uint64_t)n - fresh - skipped;
        if (bd->full != PS_TABLE_FULL_EVICT || fit < fresh + touched)
            return ps_fail(err, errlen, PS_ELIMIT,
                        "table '%s': %llu new rows would take %s to %llu bytes, past %s (%llu bytes; the table "
                        "holds %llu rows in %llu bytes)%s; raise it or spread the table over more psd",
                        d->name, (unsigned long long)fresh, by_table ? "the table" : "psd's tables",
                        (unsigned long long)(need + sketch + (by_table ? 0 : others)),
                        by_table ? "table_memory" : "max_table_memory",
                        (unsigned long long)(by_table ? bd->table_bytes : ts->max_bytes),
                        (unsigned long long)t->rows, (unsigned long long)t->bytes,
                        bd->full == PS_TABLE_FULL_EVICT ? ", and evicting every row this push does not touch would not make room"
                                  : " (table_full = refuse)");
        *evict_n = t->rows + fresh - fit;
    }
    return 0;
}

/* Gives table t its stamps, every row's at the table's clock. Returns 0 or
 * PS_ENOMEM (the table unchanged). */
int tbl_stamps_alloc(srv_tables *ts, srv_table *t)
{
    uint64_t **s = calloc(t->blocks_cap ? t->blocks_cap : 1, sizeof *s);
    if (!s)
        return PS_ENOMEM;
    for (uint32_t b = 0; b < t->nblocks; b++) {
        if (!(s[b] = malloc(tbl_stamp_block_bytes(t)))) {
            while (b--)
                free(s[b]);
            free(s);
            return PS_ENOMEM;
        }
        for (uint64_t r = 0; r < (1ull << t->shift); r++)
            s[b][r] = t->clock;
    }
    t->stamps = s;
    tbl_count_bytes(ts, t);
    return 0;
}

/* The rows' clocks held exactly while a bound reads them (expiry,
 * eviction): freed when none does; when one starts to (a reload), every
 * row's clock starts at the table's clock, as if pushed last just now.
 * Holding them takes 8 bytes a row; a table whose rows and clocks would
 * not fit its caps evicts rows drawn at random first (table_full = evict:
 * their clocks are all one), or refuses: PS_ELIMIT with err. Returns 0,
 * that, or PS_ENOMEM. */
int tbl_ensure_stamps(srv_tables *ts, srv_table *t, char *err, size_t errlen)
{
    int want = need_stamps(&ts->bounds);
    if (!want && t->stamps) {
        tbl_snap_keep_all(t); /* a snapshot's clocks kept first */
        for (uint32_t b = 0; b < t->nblocks; b++)
            free(t->stamps[b]);
        free(t->stamps);
        t->stamps = NULL;
        tbl_count_bytes(ts, t);
        return 0;
    }
    if (!want || t->stamps)
        return 0;
    int by_table;
    uint64_t allowed = tbl_allowed_bytes(ts, t, &by_table), sketch = t->sketch ? SKETCH_BYTES : 0;
    allowed = allowed > sketch ? allowed - sketch : 0;
    if (t->rows && tbl_size_of(t, t->cap, t->nblocks, t->blocks_cap, 1) > allowed) {
        uint64_t fit = tbl_rows_within(t, allowed, t->rows, 1);
        if (ts->bounds.full != PS_TABLE_FULL_EVICT || fit == 0)
            return ps_fail(err, errlen, PS_ELIMIT,
                           "table '%s': its %llu rows and their clocks (8 bytes a row, which expiry and eviction "
                           "read) would pass %s (%llu bytes)%s; raise it or spread the table over more psd",
                           t->def.name, (unsigned long long)t->rows, by_table ? "table_memory" : "max_table_memory",
                           (unsigned long long)(by_table ? ts->bounds.table_bytes : ts->max_bytes),
                           ts->bounds.full == PS_TABLE_FULL_EVICT ? "" : " (table_full = refuse)");
        while (t->rows > fit) {
            tbl_row_remove(t, tbl_xorshift(&t->rng) % t->rows);
            t->evicted++;
        }
        tbl_trim(ts, t, t->rows);
    }
    if (tbl_stamps_alloc(ts, t) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for its rows' clocks", t->def.name);
    return 0;
}

/* Whether tbl_expire_scan(t, now, expire, window) would remove a row: the same
 * walk, reading the rows' stamps (written on the loop alone). */
int tbl_expire_due(const srv_table *t, uint64_t now, uint64_t expire, uint64_t window)
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
int tbl_push_prepare(srv_tables *ts, srv_table *t, uint32_t n, uint64_t now, void (*quiesce)(void *arg), void *arg,
                        char *err, size_t errlen)
{
    const srv_table_bounds *bd = &ts->bounds;
    const char *name = t->def.name;
    if (room(&ts->scratch, &ts->scratch_floats, t->row_floats) != 0 || tbl_grow_scratch(ts, n) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for a push of %u rows", name, n);
    if (bd->admit > 1 && !t->sketch) {
        t->sketch = calloc(1, SKETCH_BYTES);
        if (!t->sketch)
            return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for admission's counters", name);
        tbl_count_bytes(ts, t);
    }
    if (quiesce && need_stamps(bd) && !t->stamps)
        quiesce(arg); /* making room for the clocks may evict rows */
    int rc = tbl_ensure_stamps(ts, t, err, errlen);
    if (rc != 0)
        return rc;
    if (bd->expire) {
        uint64_t window = (uint64_t)n * 4 > EXPIRE_WINDOW ? (uint64_t)n * 4 : EXPIRE_WINDOW;
        if (quiesce && tbl_expire_due(t, now, bd->expire, window))
            quiesce(arg);
        tbl_expire_scan(t, now, bd->expire, window);
    }
    return 0;
}

/* The step after a push found its rows, shared by srv_tables_push and
 * srv_tables_pin: room for its `fresh` new rows (`skipped` keys not
 * admitted), within max_table_memory and table_memory, refused or made by
 * evicting rows the push does not carry; then the slots and blocks for
 * them. rows[k]: key k's stored row (NULL: new; &tbl_not_admitted: skipped),
 * at[k] its index; both found again when eviction moved rows. quiesce(arg),
 * when given, is called before a row is removed. Returns 0, or PS_ELIMIT
 * or PS_ENOMEM with err, no row created (rows may have been evicted). */
int tbl_push_room(srv_tables *ts, srv_table *t, const uint8_t *keys, uint32_t n, uint64_t fresh,
                     uint64_t skipped, float **rows, uint32_t *at, uint64_t now, void (*quiesce)(void *arg),
                     void *arg, char *err, size_t errlen)
{
    uint64_t evicted = 0;
    int rc = tbl_room_for(ts, t, n, fresh, skipped, &evicted, err, errlen);
    if (rc != 0)
        return rc;
    if (evicted) {
        if (quiesce)
            quiesce(arg);
        for (uint32_t k = 0; k < n; k++) /* this push's rows stay (eviction holds stamps) */
            if (rows[k] && rows[k] != &tbl_not_admitted)
                *stamp_at(t, at[k]) = now;
        tbl_evict(t, evicted, now);
        for (uint32_t k = 0; k < n; k++) /* rows moved: found again */
            if (rows[k] && rows[k] != &tbl_not_admitted) {
                uint64_t r = lookup(t, ps_key_at(keys, k));
                rows[k] = row_at(t, r - 1) + HEAD;
                at[k] = (uint32_t)(r - 1);
            }
    }
    if (fresh && tbl_reserve(ts, t, t->rows + fresh) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu new rows; nothing was changed",
                       t->def.name, (unsigned long long)fresh);
    return 0;
}
