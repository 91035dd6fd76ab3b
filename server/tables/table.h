/* table.h - psd's embedding tables: the row store (PROTOCOL.md 13).
 *
 * Owns every table psd holds, their rows and the rows' optimizer state, and
 * the memory they take. A table is an open-addressing hash table (linear
 * probing, a power-of-two number of 4-byte slots, at most 2^32, at most
 * 5/8 full; a slot holds a row index and a tag of the key's hash, the key
 * itself is compared in the row) from a uint64 key to a row index, and the
 * rows themselves (key, then weights, state and step side by side,
 * sparse_optim.h) in blocks of equal rows, each mapped on its own,
 * allocated as they fill and never moved, so a row pointer stays valid
 * until a row is removed. Each row's clock at its last push is kept, in
 * arrays beside the blocks, only while expiry or eviction reads it. A row is stored when a push first reaches its key; a pull of a key
 * not stored answers the key's initial row and stores nothing.
 *
 * The memory of every table (slots, blocks, the table itself) is counted
 * from its first row; a push whose new rows would take the sum over all
 * tables past max_table_memory, or its table past table_memory, is refused
 * before anything changes, or, with table_full = evict, makes room by
 * evicting that table's least recently pushed rows (approximately: the
 * oldest of 8 rows drawn at random, each time).
 *
 * Bounds (srv_table_bounds, off by default): admission, a key stored only
 * at its admit-th push, counted in a count-min sketch of 4 x 262,144 8-bit
 * counters per table (1 MiB, counted in the table's memory; collisions can
 * only admit a key early) whose counts halve every 262,144 counted pushes
 * (TinyLFU's reset: the counts are of the recent stream); expiry, rows not pushed in the last `expire`
 * pushes to their table dropped by a scan of a window of rows at each push
 * (4 x the push's keys, at least 1024 rows: a stale row goes within
 * rows / window pushes). A row removed (expired, evicted) leaves its place
 * to the last row, so positions are stable only while no row is removed.
 *
 * Callers (the dispatch layer) hand in checked input: a known table, n keys
 * with n x dim finite gradient values, no key twice in one push. The store
 * checks what only it can: memory, and that an update leaves every value
 * finite. A push either applies whole or changes nothing. */
#ifndef SRV_TABLE_H
#define SRV_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"
#include "proto/table.h"
#include "server/config/config.h"

typedef struct srv_table srv_table;

/* The most rows one table holds: its hash has at most 2^32 slots of which
 * at most 5/8 are in use (2,684,354,560 rows). */
#define SRV_TABLE_ROWS_MAX ((UINT64_C(1) << 32) / 8 * 5)

/* Numbers of one table for status, metrics and the dashboard. */
typedef struct srv_table_stats {
    uint64_t rows;          /* rows stored */
    uint64_t bytes;         /* memory the table takes: slots, row blocks, itself */
    uint64_t rows_pulled;   /* rows answered to pulls, since psd started */
    uint64_t rows_pushed;   /* row gradients applied, since psd started */
    uint64_t admitted;      /* rows stored at their admit-th push (admission on) */
    uint64_t filtered;      /* row gradients of keys not admitted yet: counted, not stored */
    uint64_t expired;       /* rows dropped for not being pushed in `expire` pushes */
    uint64_t evicted;       /* rows evicted to make room under a cap */
    uint64_t clock;         /* pushes applied to the table; expiry compares each row's last push to it */
    double pull_rate, push_rate; /* rows pulled and pushed per second, over the last second */
} srv_table_stats;

/* What bounds each table's rows (the settings table_admit, table_expire,
 * table_memory and table_full); zeros: no bound but max_table_memory. */
typedef struct srv_table_bounds {
    uint32_t admit;         /* a key gets a row at its admit-th push; 0 and 1: at its first */
    uint64_t expire;        /* rows not pushed in this many pushes to the table go; 0: never */
    uint64_t table_bytes;   /* the most one table may take; 0: max_table_memory alone */
    int full;               /* enum ps_table_full: at a cap, refuse the push or evict the least
                             * recently pushed rows (tables/bounds.c) */
} srv_table_bounds;

/* All tables of one psd. */
typedef struct srv_tables {
    srv_table *t[PS_TABLES_MAX]; /* declared tables, in declaration order */
    uint32_t n;
    uint64_t bytes;              /* memory of all tables together */
    uint64_t max_bytes;          /* max_table_memory; 0: no tables may hold rows */
    srv_table_bounds bounds;     /* srv_tables_set_bounds */
    uint64_t stamp;              /* bumped by every change of a row or a declaration */
    float *scratch;              /* a push's new rows, before they are written */
    size_t scratch_floats;
    float *undo;                 /* a push's stored rows as they were (stamp and values), until it applies */
    size_t undo_floats;
    float **found;               /* a push's stored rows (NULL: a new key), one per key */
    uint32_t *found_r;           /* and their row indices */
    float **steprow;             /* the row each key of a push steps (NULL: none) */
    size_t found_cap;
    uint32_t *dupset;            /* srv_tables_first_dup's hash set: position + 1 of a key */
    size_t dupset_cap;           /* entries */
    uint64_t *dupbits;           /* srv_tables_first_dup_hint's bit per row, all clear between calls */
    size_t dupbits_words;
    struct srv_tables_snap *snap; /* a snapshot being read (srv_tables_snap_begin); NULL: none */
    struct srv_tables_move *mv;  /* rows leaving for other parts (srv_tables_move_begin); NULL: none */
    int mv_failed;               /* a change could not be marked (out of memory): the move must fail */
    struct {                     /* rows that left, dropped a few at a time (srv_tables_drop_*) */
        int on;
        uint32_t n, table;
        int32_t self;
        uint64_t r, dropped;
    } drop;
} srv_tables;

/* An empty set of tables holding at most max_bytes of rows. */
void srv_tables_init(srv_tables *ts, uint64_t max_bytes);
/* The most bytes the tables may hold from now on (max_table_memory, which
 * a reload may change); rows already stored stay. */
void srv_tables_set_limit(srv_tables *ts, uint64_t max_bytes);
/* The bounds of every table's rows from now on (settings, which a reload
 * may change); rows already stored stay until a push looks at them. */
void srv_tables_set_bounds(srv_tables *ts, const srv_table_bounds *b);
/* Both of the above from psd's settings (max_table_memory, table_admit,
 * table_expire, table_memory, table_full): what every caller that is about
 * to declare or push calls, so a reload takes effect at once. */
struct ps_config;
void srv_tables_configure(srv_tables *ts, const struct ps_config *cfg);
/* The bounds psd's settings give (table_admit, table_expire, table_memory,
 * table_full). */
srv_table_bounds srv_table_bounds_of(const struct ps_config *cfg);
/* Frees every table and their rows. */
void srv_tables_free(srv_tables *ts);
/* Moves the tables into out, leaving ts empty (its bounds and limit stay). */
void srv_tables_move(srv_tables *ts, srv_tables *out);
/* Ends a srv_tables_move as srv_model_move_back does. */
void srv_tables_move_back(srv_tables *ts, srv_tables *from, int keep);

/* Declares table d. A new name creates the table (index in *idx); a name
 * psd holds must come with the same declaration (ps_table_def_same).
 * Returns 0, PS_ELAYOUT (another declaration of the name; err gives both),
 * PS_ELIMIT (PS_TABLES_MAX tables already, or a table_memory smaller than
 * the table's first row takes; err says which) or PS_ENOMEM. */
int srv_tables_declare(srv_tables *ts, const ps_table_def *d, uint32_t *idx, char *err, size_t errlen);

/* The index of table `name`, or -1. */
int srv_tables_find(const srv_tables *ts, const char *name);

/* Table i's declaration (i < ts->n). */
const ps_table_def *srv_tables_def(const srv_tables *ts, uint32_t i);

/* Writes the rows of the n keys of table i into out (n x dim floats, in the
 * keys' order; keys may repeat): a stored row as it is, another key's
 * initial row. keys is a "keys" bin (little-endian uint64, ps_key_at). */
void srv_tables_pull(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float *out);

/* Where a pull found its keys' rows, kept for the push of the same keys
 * that usually comes next on that connection (a worker pushes the
 * gradients of the rows it pulled): that push goes straight to each row
 * instead of through the hash slots. A hint is only ever a guess: the
 * push takes row r for key k only when r is stored and holds k, and looks
 * k up otherwise, so rows removed, moved or made since cannot mislead it.
 * One per connection, zeroed at first; srv_row_hint_free frees it. */
typedef struct srv_row_hint {
    uint8_t *keys;  /* the pulled keys, as they came */
    uint32_t *at;   /* each one's row + 1 at the pull; 0: not stored */
    uint32_t n, cap, table;
} srv_row_hint;

void srv_row_hint_free(srv_row_hint *h);

/* srv_tables_pull, keeping in h (when not NULL) where it found each row. */
void srv_tables_pull_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float *out, srv_row_hint *h);

/* Applies the row gradients g (n x dim floats) of the n distinct keys of
 * table i, each multiplied by scale, with the table's optimizer: rows not
 * stored are created from their initial values first. Under the bounds:
 * expiry first scans its window; a key not stored and not admitted yet is
 * counted and skipped; at a cap with evict, the table's least recently
 * pushed rows (none of this push's) make room. Returns 0, or, with no
 * row's values changed: PS_ELIMIT (the new rows would pass
 * max_table_memory or table_memory, refused or more than eviction can
 * free; err names the table, the bytes and the setting), PS_ENONFINITE (an
 * update would make a row or its state not finite; err names the key) or
 * PS_ENOMEM. */
int srv_tables_push(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g, double scale,
                    char *err, size_t errlen);

/* srv_tables_push, its rows found through h when h holds a pull of table i
 * with these very keys (NULL or another pull: as srv_tables_push). */
int srv_tables_push_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g, double scale,
                         const srv_row_hint *h, char *err, size_t errlen);

/* The loop's half of a push applied Hogwild! (table_apply = hogwild): finds
 * the stored rows of the n distinct keys of table i, stores those not
 * stored at their initial values, and writes into rows[k] where key k's
 * row lies (its srv_sparse_row_floats values: weights, state, step), or
 * NULL for a key admission skipped; the rows count as pushed (clock,
 * stamps, stats) but no optimizer step is taken: the caller steps each
 * rows[k] with g afterwards, from any thread, while psd goes on. Under the
 * bounds as srv_tables_push (expiry, admission, room, eviction). A row
 * stays where it is until a row of the table is removed (expiry,
 * eviction); before removing one this calls quiesce(arg), which must
 * return only once no other thread steps or reads a row of the tables.
 * Adding rows, growing the slots and declaring tables move no row.
 * Returns 0, or, with no row created or counted (expired rows may have
 * gone): PS_ELIMIT (as srv_tables_push) or PS_ENOMEM. */
int srv_tables_pin(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, float **rows,
                   void (*quiesce)(void *arg), void *arg, char *err, size_t errlen);

/* Finds a key that appears twice among the n keys (a push must not carry
 * one: the dispatch layer checks with this). Returns 1 and the two
 * positions (*a < *b) of the first repeat, 0 when all are distinct, or
 * PS_ENOMEM. */
int srv_tables_first_dup(srv_tables *ts, const uint8_t *keys, uint32_t n, uint32_t *a, uint32_t *b);

/* srv_tables_first_dup of a push to table i, with the same result, through
 * h when h holds a pull of the same keys from table i that found every one
 * stored: two of those keys are equal exactly when the pull found them in
 * the same row (h is a snapshot of that pull; rows moved since do not
 * matter), so a bit per row replaces the hash set. Otherwise, or for a
 * table of more than SRV_DUP_BITS_ROWS rows, srv_tables_first_dup. */
#define SRV_DUP_BITS_ROWS (1u << 23)
int srv_tables_first_dup_hint(srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const srv_row_hint *h,
                              uint32_t *a, uint32_t *b);

/* Writes the keys (a "keys" bin, 8 bytes each) and weights (dim floats
 * each) of the len stored rows of table i from position off on (rows in
 * the order they were created); the caller checked off + len <= rows. */
void srv_tables_rows_at(const srv_tables *ts, uint32_t i, uint64_t off, uint32_t len, uint8_t *keys, float *w);

/* Called once a second (psd's tick): each table's rows pulled and pushed
 * in the second gone by become its rates. */
void srv_tables_rates(srv_tables *ts);

/* Table i's numbers. */
void srv_tables_stats(const srv_tables *ts, uint32_t i, srv_table_stats *st);

/* The stored row of key in table i (weights, state and step as
 * sparse_optim.h lays them out), or NULL. For checkpoints and tests. */
const float *srv_tables_row(const srv_tables *ts, uint32_t i, uint64_t key);

/* Calls fn(key, row, arg) for every stored row of table i, in the order of
 * their creation (row 0 first). For checkpoints and `psctl save`. */
void srv_tables_each(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t key, const float *row, void *arg),
                     void *arg);

/* Calls fn(stamp, arg) for every stored row of table i in the same order:
 * the table's clock at the row's last push (expiry's measure), or, when
 * the table holds no clocks (no expiry, no eviction), the table's clock.
 * For checkpoints. */
void srv_tables_each_stamp(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t stamp, void *arg), void *arg);

/* A snapshot of every table's rows, read a block at a time while pushes,
 * expiry, eviction and new rows go on (a follower's snapshot, written from
 * psd's loop without fork: report/snapshot.c). srv_tables_snap_begin
 * takes it: from then on each block's rows come out of srv_tables_snap_next
 * as they were at that moment, in the order srv_tables_each gives them,
 * with their keys and clocks (srv_tables_each_stamp's). A row the tables
 * are about to change (a push, a removal moving another row into its
 * place, a new row written over a removed one's memory, a block freed)
 * before its block was read is copied first, once: what the snapshot costs
 * a push is that copy, and its memory is the rows so copied, at most the
 * tables' size. Tables declared since are not in it. One at a time. */
typedef struct srv_tables_block {
    uint32_t table;        /* the table's index */
    uint64_t first;        /* the first row's position among the table's rows at the snapshot */
    uint32_t n;            /* rows */
    const uint8_t *keys;   /* n keys, 8 bytes each, little-endian */
    const float *rows;     /* n rows of srv_sparse_row_floats values */
    const uint8_t *stamps; /* n clocks, 8 bytes each, little-endian */
} srv_tables_block;

/* Takes the snapshot; *id names it for the calls below. Returns 0,
 * PS_ESTATE (one is being read) or PS_ENOMEM. */
int srv_tables_snap_begin(srv_tables *ts, uint64_t *id);
/* The next block of snapshot id into *b (valid until the next call):
 * returns 1, 0 when every table's rows were given, PS_ESTATE when the
 * snapshot is gone (the tables were freed, moved or loaded anew) or
 * PS_ENOMEM when a row could not be copied before a change (the snapshot
 * is then of no use). */
int srv_tables_snap_next(srv_tables *ts, uint64_t id, srv_tables_block *b);
/* Rows of snapshot id kept before a change so far (0 when it is gone). */
uint64_t srv_tables_snap_kept(const srv_tables *ts, uint64_t id);
/* Ends snapshot id (nothing when it is gone). */
void srv_tables_snap_end(srv_tables *ts, uint64_t id);

/* Puts n rows read back from a checkpoint into table i, which must hold
 * none of their keys: keys a "keys" bin, rows n x row floats (weights,
 * state and step as sparse_optim.h lays them out; bytes, maybe unaligned),
 * in the order they were created, so the table is laid out as it was;
 * stamps n little-endian uint64, each row's clock at its last push (none
 * past the table's clock, srv_tables_set_clock first), or NULL: every row
 * pushed at clock 0; they are kept only when the bounds set before
 * (srv_tables_set_bounds) have expiry or eviction, which read them. Counts
 * their memory but does not refuse it (they were
 * psd's rows). Returns 0, PS_EMALFORMED (a key twice, a stamp past the
 * table's clock; err names it) or PS_ENOMEM; on failure some rows may be
 * in: the caller frees the tables. */
int srv_tables_load(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *rows, const uint8_t *stamps,
                    uint64_t n, char *err, size_t errlen);

/* Sets table i's clock (pushes applied to it), as a checkpoint saved it;
 * before its rows are loaded. */
void srv_tables_set_clock(srv_tables *ts, uint32_t i, uint64_t clock);

/* Puts n rows given by their weights alone (a file psctl save wrote, read
 * by init_from) into table i, which holds none of their keys: each row's
 * optimizer state starts as a new row's (adagrad's iacc, adam's zeros and
 * step 0), except ftrl's z, set so that its weights are the ones given.
 * keys a "keys" bin, w n x dim float32 (bytes, maybe unaligned). Returns
 * 0, PS_ENONFINITE (a weight is NaN or infinite; err names the key),
 * PS_EMALFORMED (a key twice) or PS_ENOMEM. */
int srv_tables_load_weights(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *w, uint64_t n,
                            char *err, size_t errlen);

/* ---- a move of parts (PROTOCOL.md 18; table_move.c) ----
 *
 * A source: srv_tables_move_begin(new_n, self) starts marking every change
 * of a row whose key's part under new_n parts is not self (this psd's index
 * in the new map, -1 for a part that goes); srv_tables_move_gather gives
 * destination d, up to about max bytes at a time, first its rows by
 * position (the pass), then, once the pass is over (*pass_done), the
 * rows of its keys marked since they were given (dirty_only: those alone),
 * each as it is now or as a tombstone; srv_tables_move_end stops; at the
 * move's end srv_tables_move_drop removes the rows that left. A
 * destination applies a gather's bytes with srv_tables_move_apply. */
int srv_tables_move_begin(srv_tables *ts, uint32_t new_n, int32_t self);
int srv_tables_move_gather(srv_tables *ts, uint32_t d, size_t max, int dirty_only, ps_buf *out, int *pass_done,
                           uint64_t *rows);
/* Destination d's pass starts over (a destination that restarted). */
void srv_tables_move_restart(srv_tables *ts, uint32_t d);
/* Whether destination d's pass is over. */
int srv_tables_move_pass_done(const srv_tables *ts, uint32_t d);
/* Keys marked for d and not given since. */
uint64_t srv_tables_move_pending(const srv_tables *ts, uint32_t d);
/* A change could not be marked (memory): what was given is not the rows. */
int srv_tables_move_failed(const srv_tables *ts);
void srv_tables_move_end(srv_tables *ts);
void srv_tables_move_drop(srv_tables *ts, uint32_t new_n, int32_t self);

/* The rows whose part under new_n is not self are dropped a few at a time
 * from now on: srv_tables_drop_some drops until about budget_us have gone
 * (the rows are refused by key meanwhile), counting the rows it looked at
 * in *steps, and returns 1 once all are gone (0: more to do).
 * srv_tables_drop_steps looks at that many rows (a follower doing what its
 * leader did: the rows' places, which eviction draws from, stay the
 * leader's). */
void srv_tables_drop_begin(srv_tables *ts, uint32_t new_n, int32_t self);
int srv_tables_drop_some(srv_tables *ts, uint64_t budget_us, uint64_t *steps);
int srv_tables_drop_steps(srv_tables *ts, uint64_t steps);
/* A destination forgets the rows it took from part src of old_n (their
 * source restarted: it gives them all again). */
void srv_tables_move_drop_from(srv_tables *ts, uint32_t old_n, uint32_t src);
/* Applies a gather's bytes: the tables it declares declared here as part
 * part of nparts, its rows written (made, overwritten, or removed for a
 * tombstone). 0, or PS_EMALFORMED, PS_ELAYOUT (a table declared otherwise
 * here), PS_ENOMEM, with err; rows applied before a failure stay. */
int srv_tables_move_apply(srv_tables *ts, const uint8_t *b, size_t len, uint32_t part, uint32_t nparts,
                          uint64_t *rows, char *err, size_t errlen);
/* Every table declared as part part of nparts from now on (a move's end). */
void srv_tables_set_part(srv_tables *ts, uint32_t part, uint32_t nparts);

/* Bytes one row of d takes in the store (its key, its floats and its slot
 * share at the highest load; 8 more with expiry or eviction on, its
 * clock), for error messages and the docs. */
uint64_t srv_table_row_bytes(const ps_table_def *d);

#endif
