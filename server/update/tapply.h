/* tapply.h - Hogwild! apply of table rows (tapply.c; table_apply =
 * hogwild, PROTOCOL.md 13.5): a small fixed pool of threads that step the
 * rows of table pushes into the tables without locks, while psd's loop
 * goes on with everything else.
 *
 * The loop finds or creates a push's rows (srv_tables_pin: the table's
 * structure, its slots, row creation, expiry and eviction, stays the
 * loop's), copies the push's keys and gradients into a job and queues it;
 * a pool thread takes one optimizer step per row, straight into the row.
 * Rows of different jobs are stepped at once and may race: that is the
 * algorithm. Before a row is removed (expiry, eviction) and before a
 * checkpoint's fork the loop waits until no job runs (srv_tapply_drain).
 * A finished job is handed back on the loop through a uv_async_t to the
 * done callback its owner gave (the connection layer's, in psd), in the
 * order the jobs finished. */
#ifndef SRV_TAPPLY_H
#define SRV_TAPPLY_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "server/store/psd.h"
#include "server/tables/table.h"

/* Who a job's reply goes to: the caller's, handed back as it was given. */
typedef struct srv_tapply_tag {
    srv_conn *c;        /* the connection that pushed */
    uint64_t id;        /* the message's id */
    int type;           /* PS_MSG_TPUSH or PS_MSG_TPUSHPULL */
    uint32_t ti;        /* the table */
    uint64_t min;       /* TPUSHPULL: the pull's "min" */
    int rdt;            /* TPUSHPULL: the form its rows are asked for in */
    uint64_t rat;       /* ... SRV_RDT_SHM: where in the table segment they go */
} srv_tapply_tag;

/* What a finished job did. */
typedef struct srv_tapply_result {
    int rc;             /* 0, or PS_ENONFINITE: `refused` rows were left as they were */
    uint32_t rows;      /* rows stepped */
    uint32_t refused;   /* rows whose step would not have been finite (left as they were) */
    uint64_t bad_key;   /* the first of them */
    const uint8_t *pkeys; /* the pull keys given with the job (a "keys" bin), valid during the callback */
    uint32_t npk;
} srv_tapply_result;

/* Called on the loop for each finished job. */
typedef void (*srv_tapply_done_cb)(void *arg, const srv_tapply_tag *tag, const srv_tapply_result *r);

typedef struct srv_tapply srv_tapply;

/* The threads table_threads asks for: the setting, or for 0 the machine's
 * CPUs, at most 8. */
int srv_tapply_threads(int setting);

/* Starts a pool of `threads` (1..PS_TABLE_THREADS_MAX) apply threads whose
 * finished jobs go to done(arg, ...) on loop. NULL with err on failure. */
srv_tapply *srv_tapply_new(uv_loop_t *loop, int threads, srv_tapply_done_cb done, void *arg, char *err,
                           size_t errlen);

/* Queues a push of the n distinct keys of table i with the row gradients g
 * (n x dim finite floats, checked by the caller): pins its rows
 * (srv_tables_pin, on the calling loop thread; it may drain the pool),
 * copies keys, g and the npk pull keys pkeys into a job and hands it to a
 * thread. Returns 1 (queued: done is called with *tag once its rows are
 * stepped), or, nothing queued and no row changed, PS_ELIMIT or PS_ENOMEM
 * with err. */
int srv_tapply_push(srv_tapply *p, srv_tables *ts, uint32_t i, const uint8_t *keys, uint32_t n, const float *g,
                    const srv_tapply_tag *tag, const uint8_t *pkeys, uint32_t npk, char *err, size_t errlen);

/* Waits until no job is queued or running (their done callbacks may still
 * be to come). A no-op for p NULL. For the loop alone. */
void srv_tapply_drain(srv_tapply *p);

/* Jobs queued and not handed back yet (0 for p NULL). */
uint32_t srv_tapply_pending(const srv_tapply *p);

/* Stops the pool: waits for every job, hands each back (done), joins the
 * threads, closes the async handle and runs the loop once for its close
 * callback, which frees p. A no-op for NULL. */
void srv_tapply_free(srv_tapply *p);

#endif
