/* replog.h - the replication log (replog.c): every change a leader makes to
 * its model and tables, as records in the order it made them, for its
 * followers to fetch and apply (PROTOCOL.md 17, docs/DESIGN.md
 * "Replicas").
 *
 * What a record carries (docs/DESIGN.md says why):
 *   - the dense model's changed range, as a mark (the range, the version
 *     after); a fetch's answer carries the values of the blocks marked
 *     since the fetch's position as they are when it is made, with every
 *     optimizer state buffer (physical: whatever computed them, BSP's
 *     mean, DC-ASGD, clipping, a follower writes the same bits; pushes
 *     between two fetches go once);
 *   - a table push as its inputs: the keys, their row gradients and the
 *     scale, which the follower's row store applies as the leader's did
 *     (the row store is a deterministic function of its rows, the keys and
 *     the gradients: admission, expiry and eviction count pushes, not
 *     time);
 *   - a table declared, the dense layout fixed, the tables' bounds changed.
 * A position in the log (an LSN) is a byte count since the log started;
 * the log keeps the bytes no follower has fetched yet, up to a bound.
 *
 * The log is off (psd.replog NULL, nothing recorded) until a follower asks
 * for a snapshot; the snapshot (a checkpoint's bytes, report/checkpoint.c)
 * is taken at a position, and the log holds every change after it. */
#ifndef SRV_REPLOG_H
#define SRV_REPLOG_H

#include <stddef.h>
#include <stdint.h>

#include "server/store/psd.h"

#define SRV_FOLLOWERS_MAX 8

/* A follower as its leader knows it. */
typedef struct srv_follower {
    int used;
    char addr[64];        /* where workers reach it (its "advertise") */
    char peer[64];        /* the address it fetches from */
    uint64_t pos;         /* what it has fetched: every byte before this */
    uint64_t last_ms;     /* its last fetch */
    uint64_t joined_ms;
    int insync;           /* sync replies wait for it */
    int caught_up;        /* it has reached the log's end once since its snapshot */
    /* its fetch waiting for records (answered when some come, or on the tick) */
    srv_conn *wait_c;            /* valid only while the connection numbered wait_cid is open */
    uint64_t wait_cid, wait_id, wait_from, wait_until_ms;
    uint64_t sent_next;          /* the position after its last answer */
    char release[16];            /* its psd release, as its last fetch said ("": an older one) */
    /* its snapshot (dispatch/repl.c): a memory file the checkpoint's forked
     * writer fills, read by `repl_chunk`, closed once the follower fetches
     * past it, goes away or stays silent (srv_replog_snap_close) */
    int snap_fd;                 /* -1: none */
    int snap_writing;            /* the writer has not finished: the slot stays */
    int snap_ready;
    uint64_t snap_size, snap_pos;
    uint64_t snap_cid, snap_id;  /* the connection and `replicate` waiting for it */
} srv_follower;

/* A piece of the log: the bytes of positions [base, base + len), whole
 * records (none spans two pieces), in room for cap; a gradient's piece may
 * be the receive buffer it came in (srv_replog_take). */
typedef struct srv_replog_seg {
    uint64_t base;
    size_t len, cap;
    uint8_t *buf;  /* blk's memory: a fetch's answer sends the records from
                    * it, holding a reference while it is written */
    srv_blk *blk;
    int sealed;    /* a gradient's record alone, which takes no other */
} srv_replog_seg;

typedef struct srv_replog {
    /* the records of positions [base, base + len), in pieces one after the
     * other (seg[0] starts at base); records are appended to the last, and
     * trimming frees whole pieces, so no record is ever moved */
    srv_replog_seg *seg;
    size_t nseg, segcap;
    srv_blk *spare;        /* a freed piece's block kept for the next (its pages are mapped) */
    srv_blk *grad_spare;   /* a gradient's freed piece, kept for the next gradient */
    uint8_t sent_optim[SRV_OPTIM_SETTINGS_BYTES]; /* the optimizer's settings last logged (zeros: none) */
    size_t seg_bytes;      /* a new piece's room: max_bytes / 16, 4 KiB to 1 MiB (a multiple of it for a bigger record) */
    size_t len;
    uint64_t base;
    uint64_t history;      /* the leader's history id: a follower of another is refused */
    /* what the followers have been told, so that a flush ships the change */
    int sent_layout;
    uint32_t sent_tables;
    uint64_t sent_version;
    int sent_init;
    srv_table_bounds sent_bounds;
    uint64_t sent_max_bytes;
    ps_plan sent_plan;     /* the plan last logged; zeros: none */
    srv_follower f[SRV_FOLLOWERS_MAX];
    uint64_t records, bytes;     /* appended since the log started */
    uint64_t dense_bytes, dense_records, table_bytes, table_records, grad_bytes, grad_records;
    uint64_t grad_taken;         /* gradients logged in the receive buffer they came in (no copy) */
    uint64_t dropped;            /* followers that left the in-sync set */
    uint64_t values_end;         /* the position after the last mark of dense values */
    uint64_t max_bytes;          /* the log's bound: a follower further behind must snapshot again */
    /* The blocks a fetch's answer copies the dense values into, kept for
     * the next answer (reused once the write of the last one let them go,
     * so that the copy faults no fresh memory in): (1 + state buffers) per
     * model block, by block. */
    srv_blk **shadow;
    size_t nshadow;
    srv_blk *small;              /* a short answer's (or last piece's): 2^18 floats */
} srv_replog;

/* The log's end: the position after its last record (0 when off). */
uint64_t srv_replog_end(const psd *s);
/* Starts the log (at the first follower's snapshot): 0 or PS_ENOMEM. */
int srv_replog_start(psd *s);
/* Frees it (at exit, or a leader's log when it steps down), and a
 * follower's scratch memory for applying. */
void srv_replog_free(psd *s);

/* Ships what changed since the last flush that a record does not carry by
 * itself: the dense model's range touched since (srv_model_mark), its
 * version, a new layout, new tables, the tables' bounds. Cheap when nothing
 * did. A no-op while the log is off. */
void srv_replog_flush(psd *s);
/* A table push applied in order (update/rows.c): its keys, row gradients
 * (n x dim floats) and scale. A no-op while the log is off. */
void srv_replog_rows(psd *s, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g, double scale);

/* Whether a dense update of n values may go into the log as its gradient
 * (srv_replog_grad) rather than as a mark of values: the log is on, the
 * model initialised, the record not too big for the log, and every
 * follower runs this psd's release (it applies the gradient as this psd
 * did) and has fetched past the last mark of values (an answer ships a
 * mark's values as they are when it is made). Flushes what changed before
 * first. 0 also while the log is off. */
int srv_replog_grad_ok(psd *s, uint64_t n);
/* A dense update applied as its gradient (the update engine, after
 * srv_replog_grad_ok said yes and the update was applied): the model's
 * version it was applied at, its range, the gradient g[0..n), the bound
 * gmax when has_gmax, whether it came from shard 0, whether nonfinite =
 * clip, and the optimizer's settings; a follower applies it through its
 * own update engine (psd.grad_apply), bit for bit as the leader did. The
 * optimizer's settings go before it when they changed (an `O` record).
 * With taken (srv_replog_take's block, whose reference it takes over), g
 * lies in a receive buffer the log took: the record's head is written into
 * the bytes before g, so that the gradient is copied neither into the log
 * nor into an answer; otherwise g is copied. */
void srv_replog_grad(psd *s, uint64_t off, uint64_t n, const float *g, int has_gmax, float gmax, int from_first,
                     int clip, srv_blk *taken);
/* This psd's release ("0.1.0"), which a follower tells its leader. */
const char *srv_replog_release(void);
/* Takes conn's receive buffer, which holds g (the frame just handled), for
 * the log's record of g (psd.io->give_rbuf; a spare buffer given to conn
 * in its place), when there is room before g for the record's head: the
 * block that owns it now (g stays valid while it lives), or NULL (not in
 * conn's buffer, or no room: the gradient is then copied). */
srv_blk *srv_replog_take(psd *s, srv_conn *conn, const float *g);

/* A push id applied (replog/pushid.c): client cid's push pid. A no-op
 * while the log is off. */
void srv_replog_pushid(psd *s, uint64_t cid, uint64_t pid);

/* A move of parts' change on this psd (dispatch/move_state.c: begun, a
 * destination switched, rows taken, rows dropped, ended), head then data
 * as one record, in order with the pushes; a follower gives it to
 * psd.move_apply. A no-op while the log is off. */
void srv_replog_move(psd *s, const uint8_t *head, size_t hlen, const uint8_t *data, size_t len);

/* A fetch's answer (PROTOCOL.md 17), made by srv_replog_answer_make: the
 * data of one PARAMS, ndata float32 words from word off of the blocks blk
 * (indexed as srv_send wants them; references held until
 * srv_replog_answer_free). next: the log position after what it carries. */
typedef struct srv_replog_answer {
    srv_blk **blk;         /* its bytes but the gradients' records: head, records, values */
    size_t nblk;
    uint64_t off, ndata;   /* ndata: the whole answer's float32 words */
    uint64_t next;
    srv_piece *pc;         /* the answer's bytes in order: runs of blk and the
                            * gradients' records, from the log's pieces */
    size_t npc;
} srv_replog_answer;

/* The answer to a fetch from position from: the log's whole records after
 * it (at most max bytes of them, one at least) but its dense marks, and the
 * values and optimizer state of the blocks those marks name, read from the
 * model now (its whole blocks shared, copy-on-write; the state copied): the
 * pushes between two fetches go once. With dense_ok 0 (an update runs off
 * the loop) it stops before the first dense mark. Returns 0, PS_ESTALE when
 * from is not in the log, PS_ENOMEM. */
int srv_replog_answer_make(psd *s, uint64_t from, size_t max, int dense_ok, srv_replog_answer *a);
void srv_replog_answer_free(srv_replog_answer *a);

/* Drops the bytes every follower has fetched (and, past max_bytes, the
 * oldest, leaving their followers to snapshot again). */
void srv_replog_trim(psd *s);
/* The records every follower holds dropped (srv_replog_trim without its
 * bound: that stays the tick's), after a fetch: with the followers at the
 * end, the whole log goes at no cost, and the next records are written
 * where the last ones were, in the cache. */
void srv_replog_trim_held(psd *s);

/* A follower's model and tables, set aside while a snapshot loads. */
typedef struct srv_replog_kept {
    srv_model model;
    srv_tables tables;
} srv_replog_kept;
/* On a follower, before a snapshot loads: sets the model and the tables it
 * holds aside into k, psd left with none (its optimizer's settings stay). */
void srv_replog_set_aside(psd *s, srv_replog_kept *k);
/* After the load: ok, the ones set aside are freed; else what the load
 * left is freed and they are psd's again (a snapshot that does not load
 * leaves the follower as it was). */
void srv_replog_take_back(psd *s, srv_replog_kept *k, int ok);
/* On a follower: applies the records in p[0..len) (whole records; zero
 * bytes after the last one are padding); a push id goes to pushid (the
 * session layer's srv_pushid_set; NULL: dropped). Returns 0, or PS_EMALFORMED /
 * PS_ELAYOUT / PS_ENOMEM with err: the follower must stop following. */
int srv_replog_apply(psd *s, const uint8_t *p, size_t len,
                     int (*pushid)(psd *s, uint64_t cid, uint64_t pid), char *err, size_t errlen);

/* On a follower: applies a fetch's answer p[0..len) to a fetch from
 * position from, the leader's log ending at end (PARAMS' ver). Its head is
 * checked first (its length, its position inside from..end, its version not
 * behind this psd's, its blocks inside the model): a lie is refused with
 * PS_EMALFORMED and nothing applied. Then its records, then its dense
 * values and version. *next: the position to fetch from next. Errors as
 * srv_replog_apply's. */
int srv_replog_apply_answer(psd *s, const uint8_t *p, size_t len, uint64_t from, uint64_t end, uint64_t *next,
                            int (*pushid)(psd *s, uint64_t cid, uint64_t pid), char *err, size_t errlen);

/* The followers (replog.c owns them): their slot by the admin connection's
 * advertised address, made when new; NULL when full (or the log is off). */
srv_follower *srv_replog_follower(psd *s, const char *addr);
/* The slot of the follower at addr; NULL when there is none. */
srv_follower *srv_replog_follower_find(psd *s, const char *addr);
/* Forgets a follower: its snapshot closed, its slot free (the caller has
 * answered its waiting fetch; not while its snapshot is being written). */
void srv_replog_follower_drop(psd *s, srv_follower *f);
/* Closes f's snapshot (its memory goes). */
void srv_replog_snap_close(srv_follower *f);
/* 1 when position pos is in the log, at a record's start (or its end). */
int srv_replog_at_record(const psd *s, uint64_t pos);
/* The smallest position of the in-sync followers, or the log's end when
 * none is in sync: what a sync reply waits for. */
uint64_t srv_replog_acked(const psd *s);
/* In-sync followers. */
uint32_t srv_replog_insync(const psd *s);
/* A follower fetched: from is what it asks for next (so it holds every byte
 * before it); loading: it is still loading its snapshot, and joins the
 * in-sync set only once it is not (its queue of fetched records, which
 * then fills, would make sync replies wait for the load). */
void srv_replog_fetched(psd *s, srv_follower *f, uint64_t from, uint64_t now_ms, int loading);
/* The tick: a follower silent for `timeout_ms` leaves the in-sync set (logged,
 * counted). Returns 1 when the acknowledged position moved (held replies may go). */
int srv_replog_tick(psd *s, uint64_t now_ms, uint64_t timeout_ms);

#endif
