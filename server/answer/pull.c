/* pull.c - pulls: answering one from the model's blocks (or a pinned
 * snapshot, or into a worker's shared segment), parking one until the
 * version it asks for is there, and answering the parked ones when the
 * policy says a new version or a change of members may allow it. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/store/parts.h"
#include "server/answer/pull.h"
#include "server/policy/policy.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/update/update.h"

/* ---- pulls ---------------------------------------------------------------- */

/* On a follower (a read replica), a pull's answer says how far behind the
 * leader it may be: "lag", the bytes of the leader's log, as its last
 * answer said, that this psd has not applied (PROTOCOL.md 15, 17). */
static void say_lag(const psd *s, ps_msg *r)
{
    const srv_follow *f = s->follow;
    if (!f)
        return;
    r->has2 |= PS_F2_LAG;
    r->lag = f->leader_end > f->applied ? f->leader_end - f->applied : 0;
}

/* Answers a pull with [off, off+len) of blocks blk at model version ver:
 * the model's current blocks, or a pinned snapshot's. */
static void send_params(srv_conn *c, srv_blk *const *blk, uint64_t ver, uint64_t id, uint64_t off, uint64_t len,
                        uint32_t rdt)
{
    psd *s = c->srv;
    ps_msg r;
    ps_msg_init(&r, PS_MSG_PARAMS);
    r.has = PS_F_ID | PS_F_MVER | PS_F_OFF | PS_F_DATA;
    if (rdt != PS_DT_F32 && rdt != SRV_RDT_SHM) {
        r.has |= PS_F_DT; /* srv_send converts from the blocks */
        r.dt = rdt;
    }
    r.id = id;
    r.mver = ver;
    r.off = off;
    r.ndata = len;
    if (c->worker && blk == s->model.blk && ver == s->model.version && srv_plan_active(s)) {
        /* the reply that opens a round tells the worker its part of it */
        if (srv_plan_done(s)) {
            r.has |= PS_F_DONE;
            r.done = 1;
        } else if (srv_plan_slice(s, c->worker, ver, &r.slice)) {
            r.has |= PS_F_SLICE;
        }
    }
    SRV_COUNT(s, pulls, 1);
    say_lag(s, &r);
    if (rdt == SRV_RDT_SHM) {
        /* into the worker's segment, after its gradient half; the reply
         * only says where */
        float *dst = c->shm_out + off;
        for (uint64_t done = 0; done < len;) {
            size_t n;
            const float *src = srv_blocks_at(blk, off + done, len - done, &n);
            memcpy(dst + done, src, n * sizeof(float));
            done += n;
        }
        r.has = (r.has & ~(uint64_t)(PS_F_DATA | PS_F_DT)) | PS_F_LEN | PS_F_INSHM;
        r.len = len;
        r.inshm = 1;
        r.ndata = 0;
    }
    if (c->worker && blk == s->model.blk && s->policy->pulled)
        s->policy->pulled(s, c->worker, ver); /* DC-ASGD keeps what it was sent */
    srv_send(c, &r, rdt == SRV_RDT_SHM ? NULL : blk);
}

/* Answers with the model's current values, of version ver: the model's, or
 * above it for a range whose pieces of a BSP round are all closed. */
static void send_current(srv_conn *c, uint64_t ver, uint64_t id, uint64_t off, uint64_t len, uint32_t rdt)
{
    psd *s = c->srv;
    srv_snap *base = s->policy->round_base ? s->policy->round_base(s) : NULL;
    if (base && ver == base->version)
        send_params(c, base->blk, ver, id, off, len, rdt); /* not the pieces closed since */
    else
        send_params(c, s->model.blk, ver, id, off, len, rdt);
}

/* ---- table pulls (PROTOCOL.md 13) ------------------------------------------- */

/* Answers a table pull: the rows of the n keys of table ti, at model
 * version ver, as a ROWS. The rows are written into fresh blocks that the
 * reply holds until it is sent, or (rdt SRV_RDT_SHM) into the worker's
 * table segment from byte rat, the reply only saying so. */
static void send_rows(srv_conn *c, uint64_t ver, uint64_t id, uint32_t ti, const uint8_t *keys, uint32_t n,
                      uint32_t rdt, uint64_t rat)
{
    psd *s = c->srv;
    uint32_t dim = srv_tables_def(&s->tables, ti)->dim;
    uint64_t total = (uint64_t)n * dim; /* at most PS_TABLE_VALUES_MAX */
    size_t nblk = (size_t)((total + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT);
    srv_blk *blk[PS_TABLE_VALUES_MAX / SRV_BLK_FLOATS + 1] = {0};
    assert(nblk <= sizeof blk / sizeof blk[0]); /* the dispatch layer checked n x dim */
    float *flat = NULL;
    /* a worker's pull keeps where it found its rows for its next push, when
     * that push is applied at once and in order (asgd, ssp; table_apply =
     * ordered): an admin pushes nothing, a mode with rounds (BSP, its
     * ops' `rounds`) keeps a push for its round,
     * Hogwild! pins rows its own way (12 bytes a key of its largest pull,
     * until it closes) */
    srv_row_hint *hint = c->worker && !s->policy->rounds && !s->tapply ? &c->row_hint : NULL;
    ps_msg r;
    ps_msg_init(&r, PS_MSG_ROWS);
    r.id = id;
    r.mver = ver;
    say_lag(s, &r);
    if (rdt == SRV_RDT_SHM) {
        /* into the worker's table segment (the dispatch layer checked that
         * [rat, rat + 4 total) lies in it); the reply only says so */
        srv_tables_pull_hint(&s->tables, ti, keys, n, (float *)(void *)(c->tseg + rat), hint);
        r.has = PS_F_ID | PS_F_MVER | PS_F_LEN | PS_F_INSHM;
        r.len = total;
        r.inshm = 1;
        srv_send(c, &r, NULL);
        return;
    }
    for (size_t b = 0; b < nblk; b++) {
        uint64_t want = total - (b << SRV_BLK_SHIFT) < SRV_BLK_FLOATS ? total - (b << SRV_BLK_SHIFT) : SRV_BLK_FLOATS;
        size_t cap = 1024; /* a power of two, so the block pool reuses them */
        while (cap < want)
            cap *= 2;
        if (!(blk[b] = srv_blk_fresh(cap)))
            goto nomem;
    }
    if (nblk == 1) {
        srv_tables_pull_hint(&s->tables, ti, keys, n, blk[0]->w, hint);
    } else {
        /* rows may straddle blocks: through one flat buffer */
        if (!(flat = malloc((size_t)total * sizeof(float))))
            goto nomem;
        srv_tables_pull_hint(&s->tables, ti, keys, n, flat, hint);
        for (size_t b = 0; b < nblk; b++) {
            uint64_t at = (uint64_t)b << SRV_BLK_SHIFT;
            memcpy(blk[b]->w, flat + at, (size_t)(total - at < SRV_BLK_FLOATS ? total - at : SRV_BLK_FLOATS) *
                                             sizeof(float));
        }
        free(flat);
    }
    r.has = PS_F_ID | PS_F_MVER | PS_F_DATA;
    if (rdt == PS_DT_BF16 || rdt == PS_DT_F32ZSTD) {
        r.has |= PS_F_DT; /* srv_send converts from the blocks (zstd: when that saves) */
        r.dt = rdt;
    }
    r.off = 0; /* where the rows lie in blk; not sent */
    r.ndata = total;
    srv_send(c, &r, blk);
    for (size_t b = 0; b < nblk; b++)
        srv_blk_unref(blk[b]);
    return;
nomem:
    for (size_t b = 0; b < nblk; b++)
        srv_blk_unref(blk[b]);
    srv_send_error(c, id, PS_ENOMEM, 0, "out of memory for the rows of %u keys of table '%s'", n,
                   srv_tables_def(&s->tables, ti)->name);
}

int srv_tpull_at(srv_conn *c, uint64_t id, uint32_t ti, uint64_t off, uint64_t len, char *err, size_t errlen)
{
    psd *s = c->srv;
    const ps_table_def *d = srv_tables_def(&s->tables, ti);
    srv_table_stats st;
    srv_tables_stats(&s->tables, ti, &st);
    if (len == 0 || off > st.rows || len > st.rows - off) {
        snprintf(err, errlen, "tpull: rows [%llu, %llu) are outside table '%s''s %llu rows", (unsigned long long)off,
                 (unsigned long long)(off + len), d->name, (unsigned long long)st.rows);
        return PS_ERANGE;
    }
    if (len > PS_TABLE_KEYS_MAX || len * d->dim > PS_TABLE_VALUES_MAX) {
        snprintf(err, errlen, "tpull: %llu rows of table '%s' (dim %u) in one message, more than %d rows or %u "
                              "values; ask for fewer",
                 (unsigned long long)len, d->name, d->dim, PS_TABLE_KEYS_MAX, PS_TABLE_VALUES_MAX);
        return PS_EBAD_FIELD;
    }
    uint64_t total = len * d->dim;
    size_t nblk = (size_t)((total + SRV_BLK_FLOATS - 1) >> SRV_BLK_SHIFT);
    srv_blk *blk[PS_TABLE_VALUES_MAX / SRV_BLK_FLOATS + 1] = {0};
    uint8_t *keys = malloc((size_t)len * 8);
    float *flat = malloc((size_t)total * sizeof(float));
    int ok = keys && flat;
    for (size_t b = 0; ok && b < nblk; b++) {
        uint64_t at = (uint64_t)b << SRV_BLK_SHIFT, want = total - at < SRV_BLK_FLOATS ? total - at : SRV_BLK_FLOATS;
        ok = (blk[b] = srv_blk_fresh((size_t)want)) != NULL;
    }
    if (ok) {
        srv_tables_rows_at(&s->tables, ti, off, (uint32_t)len, keys, flat);
        for (size_t b = 0; b < nblk; b++)
            memcpy(blk[b]->w, flat + ((uint64_t)b << SRV_BLK_SHIFT), blk[b]->cap * sizeof(float));
        ps_msg r;
        ps_msg_init(&r, PS_MSG_ROWS);
        r.has = PS_F_ID | PS_F_MVER | PS_F_KEYS | PS_F_DATA;
        r.id = id;
        r.mver = s->model.version;
        r.keys = (ps_keys){keys, (uint32_t)len};
        say_lag(s, &r);
        r.off = 0;
        r.ndata = total;
        srv_send(c, &r, blk);
    }
    for (size_t b = 0; b < nblk; b++)
        srv_blk_unref(blk[b]);
    free(keys);
    free(flat);
    if (!ok) {
        snprintf(err, errlen, "out of memory for %llu rows of table '%s'", (unsigned long long)len, d->name);
        return PS_ENOMEM;
    }
    return 0;
}

/* Parked pulls come and go every BSP round: freed ones are kept for reuse
 * (at most PARKED_SPARE), so parking allocates nothing in steady state. */
#define PARKED_SPARE 256
static srv_parked *parked_spare;
static unsigned nparked_spare;

static srv_parked *parked_get(void)
{
    srv_parked *p = parked_spare;
    if (!p)
        return malloc(sizeof *p);
    parked_spare = p->next;
    nparked_spare--;
    return p;
}

static void parked_put(psd *s, srv_parked *p)
{
    if (p->keys)
        s->parked_bytes -= (uint64_t)p->nkeys * 8;
    free(p->keys);
    p->keys = NULL;
    if (nparked_spare >= PARKED_SPARE) {
        free(p);
        return;
    }
    p->next = parked_spare;
    parked_spare = p;
    nparked_spare++;
}

/* An entry for one more of c's waiting replies, or NULL with *rc and err
 * (PS_ELIMIT past SRV_PARKED_MAX of them, PS_ENOMEM). */
static srv_parked *parked_new(srv_conn *c, const char *waiting, const char *oom, int *rc, char *err,
                              size_t errlen)
{
    if (c->nparked >= SRV_PARKED_MAX) {
        snprintf(err, errlen, "more than %d %s already waiting on this connection", SRV_PARKED_MAX, waiting);
        *rc = PS_ELIMIT;
        return NULL;
    }
    srv_parked *p = parked_get();
    if (!p) {
        snprintf(err, errlen, "out of memory %s", oom);
        *rc = PS_ENOMEM;
    }
    return p;
}

/* Appends p to c's parked pulls, so that replies leave in request order
 * (the list is short: at most SRV_PARKED_MAX). */
static void park(srv_conn *c, srv_parked *p)
{
    srv_parked **tail = &c->parked;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    c->nparked++;
}

void srv_parked_free_spare(void)
{
    while (parked_spare) {
        srv_parked *p = parked_spare;
        parked_spare = p->next;
        free(p);
    }
    nparked_spare = 0;
}

/* May a pull of [off, off+len) for version >= min be answered now? Then
 * *ver is the version its values are at. */
static int pull_ready(srv_conn *c, uint64_t min, uint64_t off, uint64_t len, uint64_t *ver)
{
    psd *s = c->srv;
    if (s->paused && c->role == PS_ROLE_WORKER)
        return 0; /* ADMIN pause: held until resume */
    *ver = s->model.version;
    /* a part that holds no dense values (PROTOCOL.md 18): its rows are
     * there, and no version is to come */
    if (!s->model.has_layout && srv_parts_table_only(&s->parts))
        return 1;
    if (s->policy->pull_ready ? s->policy->pull_ready(s, c->worker, min)
                              : s->model.initialized && s->model.version >= min)
        return 1;
    if (c->worker && len && s->policy->range_version && min == s->model.version + 1 &&
        s->policy->range_version(s, off, len) >= min) {
        *ver = min; /* a round closing piece by piece has closed these */
        return 1;
    }
    return 0;
}

int srv_pull_check_rdt(const psd *s, uint32_t rdt, char *err, size_t errlen)
{
    if (rdt == PS_DT_F32Z) {
        snprintf(err, errlen, "parameters as f32z refused: that element type is for data sent to psd; ask for f32 "
                              "(rdt 0), bf16 (rdt 1) or zstd (rdt 3); nothing was changed");
        return PS_EUNSUPPORTED;
    }
    if (rdt == PS_DT_F32ZSTD)
        return 0;
    if (rdt == PS_DT_F32 || rdt == SRV_RDT_SHM || s->cfg.wire_bf16)
        return 0;
    snprintf(err, errlen, "parameters as %s refused: this psd sends float32 only (wire_bf16 = no); its welcome "
                          "did not offer %s; nothing was changed",
             ps_dtype_name(rdt), ps_dtype_name(rdt));
    return PS_EUNSUPPORTED;
}

int srv_pull(srv_conn *c, uint64_t id, uint64_t off, uint64_t len, uint64_t min, uint32_t rdt, char *err,
             size_t errlen)
{
    psd *s = c->srv;
    uint64_t total = s->model.layout.total;
    int rc = srv_pull_check_rdt(s, rdt, err, errlen);
    if (rc != 0)
        return rc;
    if (c->pinned) {
        /* ADMIN pin: that version, whatever min says, and its size (a
         * reset may have put a model of another size in its place) */
        if (!srv_range_ok(c->pinned->n, off, len)) {
            snprintf(err, errlen, "pull range [%llu, %llu) is outside the pinned version's %llu parameters",
                     (unsigned long long)off, (unsigned long long)(off + len), (unsigned long long)c->pinned->n);
            return PS_ERANGE;
        }
        send_params(c, c->pinned->blk, c->pinned->version, id, off, len, rdt);
        return 0;
    }
    if (!s->model.has_layout) {
        snprintf(err, errlen, "no model yet: the first worker has not said hello");
        return PS_ENOT_READY;
    }
    if (!srv_range_ok(total, off, len)) {
        snprintf(err, errlen, "pull range [%llu, %llu) is outside the model's %llu parameters",
                 (unsigned long long)off, (unsigned long long)(off + len), (unsigned long long)total);
        return PS_ERANGE;
    }
    /* an earlier pull for this version or an older one still waits: this
     * one waits behind it, so that their replies leave in request order
     * (it may be ready already when the earlier one's version has just
     * come and the waiting pulls are about to be answered) */
    int behind = 0;
    uint64_t ver;
    for (const srv_parked *p = c->parked; p && !behind; p = p->next)
        behind = p->min <= min;
    if (!behind && pull_ready(c, min, off, len, &ver)) {
        send_current(c, ver, id, off, len, rdt);
        return 0;
    }
    srv_parked *p = parked_new(c, "pulls", "parking a pull", &rc, err, errlen);
    if (!p)
        return rc;
    *p = (srv_parked){.id = id, .min = min, .off = off, .len = len, .rdt = rdt};
    park(c, p);
    if (behind && !srv_update_busy(s))
        srv_conn_answer_parked(c);
    return 0;
}

int srv_tpull(srv_conn *c, uint64_t id, uint32_t ti, const uint8_t *keys, uint32_t n, uint64_t min, uint32_t rdt,
              uint64_t rat, char *err, size_t errlen)
{
    /* as srv_pull: behind an earlier parked pull of this version or an
     * older one, or parked until min is there (a pinned snapshot does not
     * hold tables: their rows are the current ones) */
    int behind = 0;
    uint64_t ver;
    for (const srv_parked *p = c->parked; p && !behind; p = p->next)
        behind = p->min <= min;
    if (!behind && (c->pinned || pull_ready(c, min, 0, 0, &ver))) {
        send_rows(c, c->pinned ? c->srv->model.version : ver, id, ti, keys, n, rdt, rat);
        return 0;
    }
    if (c->nparked >= SRV_PARKED_MAX) {
        snprintf(err, errlen, "more than %d pulls already waiting on this connection", SRV_PARKED_MAX);
        return PS_ELIMIT;
    }
    /* its keys wait in psd's memory, within max_receive_memory (one bound
     * for what peers make psd hold), of which waiting keys may take half:
     * the other half stays for the frames of the workers that make the
     * version come */
    psd *s = c->srv;
    uint64_t kb = (uint64_t)n * 8, max = s->cfg.max_receive_memory;
    if (s->parked_bytes + kb > max / 2 || s->rbuf_bytes + s->parked_bytes + kb > max) {
        snprintf(err, errlen, "a pull of %u keys cannot wait for model version %llu: the keys of the pulls waiting in "
                              "psd (%llu bytes) may take half of max_receive_memory (%llu bytes), and with the "
                              "receive buffers (%llu bytes) all of it; pull again once the version is there, or with "
                              "fewer keys",
                 n, (unsigned long long)min, (unsigned long long)s->parked_bytes, (unsigned long long)max,
                 (unsigned long long)s->rbuf_bytes);
        return PS_ELIMIT;
    }
    srv_parked *p = parked_get();
    uint8_t *copy = p ? malloc((size_t)n * 8) : NULL;
    if (!copy) {
        if (p) {
            p->keys = NULL;
            parked_put(c->srv, p);
        }
        snprintf(err, errlen, "out of memory parking a pull of %u rows", n);
        return PS_ENOMEM;
    }
    memcpy(copy, keys, (size_t)n * 8);
    *p = (srv_parked){.id = id, .min = min, .rat = rat, .rdt = rdt, .table = ti, .keys = copy, .nkeys = n};
    s->parked_bytes += kb;
    park(c, p);
    if (behind && !srv_update_busy(c->srv))
        srv_conn_answer_parked(c);
    return 0;
}

int srv_ok_after(srv_conn *c, uint64_t id, uint64_t min, char *err, size_t errlen)
{
    int rc;
    srv_parked *p = parked_new(c, "replies", "keeping a push's reply until its round closes", &rc, err, errlen);
    if (!p)
        return rc;
    *p = (srv_parked){.id = id, .min = min, .ok = 1};
    park(c, p);
    return 0;
}

void srv_conn_answer_parked(srv_conn *c)
{
    srv_parked **pp = &c->parked;
    uint64_t held = UINT64_MAX; /* the lowest min of a pull left waiting */
    while (!c->closing && *pp) { /* closing frees the list: test it first */
        srv_parked *p = *pp;
        uint64_t ver;
        /* a pull behind one for the same version or an older one that
         * waits, waits too: replies leave in request order */
        if (p->min >= held || !pull_ready(c, p->min, p->off, p->len, &ver)) {
            held = p->min < held ? p->min : held;
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        c->nparked--;
        c->last_msg_ms = srv_now_ms(); /* an admin's idleness counts from now */
        if (c->worker)
            c->worker->last_seen_ms = srv_now_ms(); /* its silence counts from now */
        if (p->ok)
            srv_send_ok(c, p->id);
        else if (p->keys)
            send_rows(c, ver, p->id, p->table, p->keys, p->nkeys, p->rdt, p->rat);
        else
            send_current(c, ver, p->id, p->off, p->len, p->rdt);
        parked_put(c->srv, p);
    }
}

void srv_answer_parked(psd *s)
{
    if (srv_update_busy(s))
        return; /* the blocks are being written: the update's end answers them */
    for (srv_conn *c = s->conns; c; c = c->next)
        if (c->parked && !c->closing)
            srv_conn_answer_parked(c);
}

void srv_pulls_refuse(srv_conn *c, int code, const char *text)
{
    /* an error may close c (max_output_buffer), which frees the list */
    while (c->parked && !c->closing) {
        srv_parked *p = c->parked;
        c->parked = p->next;
        c->nparked--;
        uint64_t id = p->id;
        parked_put(c->srv, p);
        srv_send_error(c, id, code, 0, "%s", text);
    }
}

void srv_pulls_drop(srv_conn *c)
{
    while (c->parked) {
        srv_parked *p = c->parked;
        c->parked = p->next;
        parked_put(c->srv, p);
    }
    c->nparked = 0;
    srv_snap_unref(c->pinned);
    c->pinned = NULL;
}
