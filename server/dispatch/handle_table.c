/* handle_table.c - TABLE, TPULL, TPUSH and TPUSHPULL (PROTOCOL.md 13): the
 * edge where a table message is checked once (role, table, row dimension,
 * distinct keys, base, finite gradients, the mode), before the row store
 * (tables/table.c) declares, applies or reads and the answer layer
 * (pull.c) answers or parks a pull. */
#include "server/dispatch/handle_table.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "proto/vec.h"
#include "proto/errors.h"
#include "server/policy/policy.h"
#include "server/answer/pull.h"
#include "server/answer/reply.h"
#include "server/dispatch/admin.h"
#include "server/store/scratch.h"
#include "server/record/stats.h"
#include "server/session/ledger.h"
#include "server/store/parts.h"
#include "server/replog/pushid.h"
#include "server/update/update.h"

static void handle_declare(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char err[700];
    ps_table_def d;
    int rc = ps_table_def_make(&d, m->tab, m->dim, m->rinit, (m->has & PS_F_SCALE) != 0, m->scale,
                               (m->has & PS_F_SEED) ? m->seed : 0, m->opt, (m->has & PS_F_HP) ? &m->hp : NULL, err,
                               sizeof err);
    if (rc == 0 && (m->has & PS_F_PART)) {
        d.part = m->part;
        d.nparts = m->nparts;
    }
    /* while parts move, a worker of either map declares the table as this
     * psd holds it (PROTOCOL.md 18) */
    int held = srv_tables_find(&s->tables, d.name);
    if (rc == 0 && held >= 0 && srv_parts_declared(&s->parts, d.part, d.nparts)) {
        const ps_table_def *h = srv_tables_def(&s->tables, (uint32_t)held);
        d.part = h->part;
        d.nparts = h->nparts;
    }
    if (rc == 0 && held < 0 && s->policy->rounds && s->replog) {
        snprintf(err, sizeof err, "table '%s' refused: this bsp psd has followers, and replication with mode = bsp "
                                  "takes dense models only (a round keeps its table pushes until it closes, "
                                  "acknowledged before; a leader lost in the round would lose them)",
                 d.name);
        rc = PS_EUNSUPPORTED;
    }
    uint32_t before = s->tables.n, ti;
    srv_tables_configure(&s->tables, &s->cfg); /* table_memory: a cap below the first row is refused */
    if (rc == 0)
        rc = srv_tables_declare(&s->tables, &d, &ti, err, sizeof err);
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return;
    }
    if (s->tables.n > before) {
        char text[300];
        ps_table_def_text(&d, text, sizeof text);
        PS_LOG(PS_LOG_INFO, "table '%s' declared by shard %u: %s", d.name, c->worker ? c->worker->shard : 0, text);
    }
    srv_send_ok(c, m->id);
}

/* The index of m's table, or -1 with the error sent. */
static int table_of(srv_conn *c, const ps_msg *m)
{
    int ti = srv_tables_find(&c->srv->tables, m->tab);
    if (ti < 0)
        srv_send_error(c, m->id, PS_ERANGE, 0,
                       "%s: unknown table '%s' (declare it with a table message first; a psd restarted without "
                       "its state dir holds no tables)",
                       ps_msg_type_name(m->type), m->tab);
    return ti;
}

/* Row gradients in bfloat16 or a packed form (dt 1, 2 or 3) become float32
 * in psd's row scratch, where m then points, so that what follows sees
 * float32 only. Their count is the decoder's (within PS_TABLE_VALUES_MAX),
 * already checked against the keys; a compressed frame must say it holds
 * exactly those values before anything is sized for them. 0, or a code
 * with err. */
static int widen_rows(srv_conn *c, ps_msg *m, char *err, size_t errlen)
{
    psd *s = c->srv;
    const char *t = ps_msg_type_name(m->type);
    if (m->dt == PS_DT_BF16 && !s->cfg.wire_bf16) {
        snprintf(err, errlen, "%s with bfloat16 rows refused: this psd takes float32 only (wire_bf16 = no); its "
                              "welcome did not offer bf16; nothing was changed", t);
        return PS_EUNSUPPORTED;
    }
    uint64_t left_out = m->dt == PS_DT_F32Z ? m->ndata - m->nz : 0;
    uint64_t zin = m->dt == PS_DT_F32ZSTD ? m->packed_len : 0, zout = zin ? m->ndata * sizeof(float) : 0;
    uint8_t *planes = NULL;
    if (m->dt == PS_DT_F32ZSTD) {
        if (ps_codec_zstd_check(m->packed, (size_t)m->packed_len, m->ndata) != 0) {
            snprintf(err, errlen, "%s: compressed rows (dt 3) of %llu bytes are not one zstd frame that says it "
                                  "holds len %llu float32 values; nothing was changed",
                     t, (unsigned long long)m->packed_len, (unsigned long long)m->ndata);
            return PS_EBAD_FIELD;
        }
        planes = srv_planes(s, (size_t)m->ndata * sizeof(float));
    }
    float *dst = srv_rows_wide(s, (size_t)m->ndata);
    if (!dst || (m->dt == PS_DT_F32ZSTD && !planes)) {
        snprintf(err, errlen, "%s: no memory to decode %llu row values", t, (unsigned long long)m->ndata);
        return PS_ENOMEM;
    }
    float mx;
    char cerr[160];
    int rc = ps_codec_decode(srv_codec(s), m, dst, planes, &mx, cerr, sizeof cerr);
    if (rc != 0) {
        snprintf(err, errlen, "%s: %s", t, cerr);
        return rc;
    }
    SRV_COUNT(s, zeros_elided, left_out);
    SRV_COUNT(s, zstd_in, zin);
    SRV_COUNT(s, zstd_out, zout);
    return 0;
}

/* Checks that every one of the n keys belongs to the part of table d this
 * psd holds (PROTOCOL.md 13.7), or, while parts move (section 18), that
 * this psd owns it now: a key that moved away is MOVED (the ERROR carries
 * the map), one being handed over NOT_READY. 0, or the code with the
 * error sent; nothing is changed either way. */
static int check_part(srv_conn *c, const ps_msg *m, const ps_table_def *d, const uint8_t *keys, uint32_t n)
{
    const srv_parts *p = &c->srv->parts;
    if (d->nparts <= 1 && !srv_parts_known(p))
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t k = ps_key_at(keys, i);
        int v = srv_parts_key(p, d->part, d->nparts, k);
        if (v == SRV_KEY_OWN)
            continue;
        if (v == SRV_KEY_MOVED) {
            srv_send_error(c, m->id, PS_EMOVED, 0,
                           "%s: key %llu of table '%s' is no longer held by this psd (its parts moved): the "
                           "ERROR's pmap names the part map; send it to the key's part there; nothing was changed",
                           ps_msg_type_name(m->type), (unsigned long long)k, d->name);
            return PS_EMOVED;
        }
        if (v == SRV_KEY_WAIT) {
            srv_send_error(c, m->id, PS_ENOT_READY, 0,
                           "%s: key %llu of table '%s' is being handed over between parts (a move of parts); "
                           "send it again in a moment; nothing was changed",
                           ps_msg_type_name(m->type), (unsigned long long)k, d->name);
            return PS_ENOT_READY;
        }
        uint32_t part = ps_table_part(k, d->nparts);
        srv_send_error(c, m->id, PS_ERANGE, 0,
                       "%s: key %llu of table '%s' belongs to part %u of %u, and this psd holds part %u "
                       "(a key's part is jump_hash(mix(key), %u)); send it to that part's psd; nothing was "
                       "changed",
                       ps_msg_type_name(m->type), (unsigned long long)k, d->name, part, d->nparts, d->part,
                       d->nparts);
        return PS_ERANGE;
    }
    return 0;
}

/* A request in the worker's table segment ("seg", PROTOCOL.md 13.9): its
 * keys are copied out of the segment (psd checks them, and the worker
 * could change them meanwhile) and m points at them as at a frame's. Row
 * gradients are read in place in asgd and ssp (stepped here, or copied
 * into a Hogwild! apply job: each row's step checks its own result, so a
 * change under psd spoils no more than that worker's own rows) and copied
 * out in bsp (the round sums them with the other workers'). The rows
 * pulled go into the segment from byte *rat. 0, or a code with err. */
static int from_tseg(srv_conn *c, ps_msg *m, const ps_table_def *d, uint64_t *rat, char *err, size_t errlen)
{
    psd *s = c->srv;
    const char *t = ps_msg_type_name(m->type);
    if (!c->tseg) {
        snprintf(err, errlen, "%s with 'seg' refused: this connection has no table segment (psd's welcome did not "
                              "say tinshm)", t);
        return PS_ESTATE;
    }
    const ps_seg g = m->seg;
    int push = m->type != PS_MSG_TPULL;
    uint32_t pulled = m->type == PS_MSG_TPULL ? g.n : g.m;
    uint64_t vals = push ? (uint64_t)g.n * d->dim : 0, rvals = (uint64_t)pulled * d->dim;
    if (vals > PS_TABLE_VALUES_MAX || rvals > PS_TABLE_VALUES_MAX) {
        snprintf(err, errlen, "%s: the rows of %u keys of table '%s' (dim %u) are %llu values, more than %u in one "
                              "message; nothing was changed", t, vals > PS_TABLE_VALUES_MAX ? g.n : pulled, d->name,
                 d->dim, (unsigned long long)(vals > rvals ? vals : rvals), PS_TABLE_VALUES_MAX);
        return PS_EBAD_FIELD;
    }
    uint64_t req = 8ull * g.n + 4 * vals + 8ull * g.m, ans = 4 * rvals;
    if (g.at + req > c->tseg_len || (pulled && g.rat + ans > c->tseg_len) ||
        (pulled && g.at < g.rat + ans && g.rat < g.at + req)) {
        snprintf(err, errlen, "%s: seg's request [%llu, %llu) and rows [%llu, %llu) must lie apart in the table "
                              "segment's %zu bytes; nothing was changed", t, (unsigned long long)g.at,
                 (unsigned long long)(g.at + req), (unsigned long long)g.rat, (unsigned long long)(g.rat + ans),
                 c->tseg_len);
        return PS_ERANGE;
    }
    uint8_t *keys = srv_seg_keys(s, 8ull * (g.n + g.m));
    const float *grads = (const float *)(const void *)(c->tseg + g.at + 8ull * g.n);
    float *copy = push && s->policy->rounds ? srv_rows_wide(s, (size_t)vals) : NULL;
    if (!keys || (push && s->policy->rounds && !copy)) {
        snprintf(err, errlen, "%s: no memory for the %u keys of a request in the table segment", t, g.n + g.m);
        return PS_ENOMEM;
    }
    memcpy(keys, c->tseg + g.at, 8ull * g.n);
    memcpy(keys + 8ull * g.n, c->tseg + g.at + 8ull * g.n + 4 * vals, 8ull * g.m);
    m->keys = (ps_keys){keys, g.n};
    if (g.m) {
        m->pkeys = (ps_keys){keys + 8ull * g.n, g.m};
        m->has |= PS_F_PKEYS;
    }
    if (push) {
        if (copy) {
            memcpy(copy, grads, (size_t)vals * sizeof(float));
            grads = copy;
        }
        m->data = grads;
        m->ndata = vals;
        m->has |= PS_F_DATA;
    }
    m->has |= PS_F_KEYS;
    *rat = g.rat;
    return 0;
}

/* The error of a push whose row gradients are not all finite. */
static int nonfinite_grads(const ps_msg *m, const ps_table_def *d, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: row gradients of table '%s' contain NaN or infinity; rejected, the table is "
                          "unchanged",
             ps_msg_type_name(m->type), d->name);
    return PS_ENONFINITE;
}

/* Checks a push's rows: n x dim finite values (unless defer_finite: the
 * caller's push steps every row and checks each result, which is not
 * finite when a gradient is not, and names the gradients then) for n
 * distinct keys, base not ahead of the model; rows in another form than
 * float32 are widened first (m then points at them). 0, or a code with
 * err. */
static int check_push(srv_conn *c, ps_msg *m, uint32_t ti, int defer_finite, char *err, size_t errlen)
{
    psd *s = c->srv;
    const ps_table_def *d = srv_tables_def(&s->tables, ti);
    const char *t = ps_msg_type_name(m->type);
    uint64_t want = (uint64_t)m->keys.n * d->dim;
    if (m->ndata != want) {
        snprintf(err, errlen, "%s: 'data' holds %llu values for %u keys of table '%s' (dim %u): %llu expected; "
                              "nothing was changed",
                 t, (unsigned long long)m->ndata, m->keys.n, d->name, d->dim, (unsigned long long)want);
        return PS_EBAD_FIELD;
    }
    if (m->dt != PS_DT_F32) {
        int rc = widen_rows(c, m, err, errlen);
        if (rc != 0)
            return rc;
    }
    if (m->base > s->model.version) {
        snprintf(err, errlen, "%s: base %llu is ahead of the model (version %llu)", t, (unsigned long long)m->base,
                 (unsigned long long)s->model.version);
        return PS_EBAD_FIELD;
    }
    if (!defer_finite && !ps_vec_all_finite(m->data, (size_t)m->ndata))
        return nonfinite_grads(m, d, err, errlen);
    uint32_t a, b;
    /* through the connection's row hint when its last pull had these keys */
    int dup = srv_tables_first_dup_hint(&s->tables, ti, m->keys.p, m->keys.n, &c->row_hint, &a, &b);
    if (dup < 0) {
        snprintf(err, errlen, "%s: out of memory checking %u keys", t, m->keys.n);
        return PS_ENOMEM;
    }
    if (dup) {
        snprintf(err, errlen, "%s: key %llu appears twice (keys %u and %u); sum a key's gradients before "
                              "sending; nothing was changed",
                 t, (unsigned long long)ps_key_at(m->keys.p, a), a, b);
        return PS_EBAD_FIELD;
    }
    return 0;
}

static void handle_push(srv_conn *c, ps_msg *m, uint32_t ti, uint64_t rat)
{
    psd *s = c->srv;
    char err[700];
    /* a policy that steps every row of a push at once (asgd and ssp with
     * table_apply = ordered, but for keys an admission filter holds back)
     * checks each result finite before it is stored: a separate pass over
     * the gradients first would only repeat that check */
    srv_tables_configure(&s->tables, &s->cfg);
    int defer = s->policy->tpush_checks && s->policy->tpush_checks(s);
    uint64_t pid = (m->has2 & PS_F2_PID) ? m->pid : 0;
    /* sent again after a lost connection: applied already, answered as
     * then (PROTOCOL.md 15) */
    int done = srv_pushid_done(s, c->client_id, pid);
    int rc = done ? 0 : check_push(c, m, ti, defer, err, sizeof err);
    if (rc == 0 && !done) {
        /* the policy applies it, keeps it for its round, or hands its rows
         * to the apply threads (SRV_PENDING): the reply (and a TPUSHPULL's
         * pull) then comes when they are done (srv_tpush_finished), the
         * connection's next frames held until then */
        int pull = m->type == PS_MSG_TPUSHPULL;
        srv_tpush tp = {.base = m->base, .ti = ti, .keys = m->keys.p, .n = m->keys.n, .g = m->data,
                        .hint = &c->row_hint,
                        .tag = {.c = c, .id = m->id, .type = m->type, .ti = ti, .min = m->min, .rdt = m->rdt,
                                .rat = rat},
                        .pkeys = pull ? m->pkeys.p : NULL, .npk = pull ? m->pkeys.n : 0};
        rc = s->policy->tpush(s, c->worker, &tp, err, sizeof err);
        /* with rounds (bsp) a table push goes with its worker's step,
         * dropped when the worker leaves before the step's last push: not
         * recorded, so one sent again is applied again */
        if ((rc == SRV_PENDING || rc == 0) && !s->policy->rounds)
            srv_pushid_mark(s, c->client_id, pid);
        if (rc == SRV_PENDING || rc == 0) /* tests only (PSD_TEST_LEDGER) */
            srv_ledger_rows(s, c->client_id, pid, ti, m->keys.p, m->keys.n, m->data);
        if (rc == SRV_PENDING) {
            c->tapply_busy = 1;
            return;
        }
        if (rc == PS_ENONFINITE && !ps_vec_all_finite(m->data, (size_t)m->ndata))
            rc = nonfinite_grads(m, srv_tables_def(&s->tables, ti), err, sizeof err);
    }
    if (rc == PS_ESTALE && m->type == PS_MSG_TPUSHPULL) {
        /* dropped, and the rows answered so the worker catches up */
        SRV_COUNT(s, dropped_pushes, 1);
        rc = 0;
    } else if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return;
    }
    if (m->type == PS_MSG_TPUSH) {
        srv_send_ok(c, m->id);
        return;
    }
    rc = srv_tpull(c, m->id, ti, m->pkeys.p, m->pkeys.n, m->min, m->rdt, rat, err, sizeof err);
    if (rc != 0)
        srv_send_error(c, m->id, rc, 0, "%s", err);
}

int srv_handle_table(srv_conn *c, ps_msg *m)
{
    if (c->admin_readonly) {
        srv_send_error(c, m->id, PS_EFORBIDDEN, 0,
                       "pulling rows refused: this admin connection proved the workers' token and may only read "
                       "(%s), because admin_token_file is not configured", srv_admin_readable());
        return 0;
    }
    if (m->type == PS_MSG_TABLE) {
        handle_declare(c, m);
        return 0;
    }
    int ti = table_of(c, m);
    if (ti < 0)
        return 0;
    const ps_table_def *d = srv_tables_def(&c->srv->tables, (uint32_t)ti);
    uint64_t rat = 0;
    if (m->has & PS_F_SEG) {
        char err[400];
        int rc = from_tseg(c, m, d, &rat, err, sizeof err);
        if (rc != 0) {
            srv_send_error(c, m->id, rc, 0, "%s", err);
            return 0;
        }
    }
    /* the rows a pull answers fit one message (PROTOCOL.md 13.2) */
    const ps_keys *pk = m->type == PS_MSG_TPUSHPULL ? &m->pkeys : m->type == PS_MSG_TPULL ? &m->keys : NULL;
    if (pk && (uint64_t)pk->n * d->dim > PS_TABLE_VALUES_MAX) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0,
                       "%s: the rows of %u keys of table '%s' (dim %u) are %llu values, more than %u in one "
                       "message; ask for fewer keys; nothing was changed",
                       ps_msg_type_name(m->type), pk->n, d->name, d->dim, (unsigned long long)pk->n * d->dim,
                       PS_TABLE_VALUES_MAX);
        return 0;
    }
    if (pk && m->rdt != PS_DT_F32) {
        /* the rows' form, before a push of a TPUSHPULL changes anything */
        char err[300];
        int rc = srv_pull_check_rdt(c->srv, m->rdt, err, sizeof err);
        if (rc != 0) {
            srv_send_error(c, m->id, rc, 0, "%s: %s", ps_msg_type_name(m->type), err);
            return 0;
        }
    }
    if (!(m->type == PS_MSG_TPULL && (m->has & PS_F_LEN)) &&
        (check_part(c, m, d, m->keys.p, m->keys.n) != 0 ||
         (m->type == PS_MSG_TPUSHPULL && check_part(c, m, d, m->pkeys.p, m->pkeys.n) != 0)))
        return 0;
    if (m->has & PS_F_SEG)
        m->rdt = SRV_RDT_SHM; /* the rows answered into the segment, from rat */
    if (m->type == PS_MSG_TPULL) {
        char err[300];
        int rc = (m->has & PS_F_LEN) ? srv_tpull_at(c, m->id, (uint32_t)ti, m->off, m->len, err, sizeof err)
                                     : srv_tpull(c, m->id, (uint32_t)ti, m->keys.p, m->keys.n,
                                                 (m->has & PS_F_MIN) ? m->min : 0, m->rdt, rat, err, sizeof err);
        if (rc != 0)
            srv_send_error(c, m->id, rc, 0, "%s", err);
        return 0;
    }
    handle_push(c, m, (uint32_t)ti, rat);
    return 0;
}

void srv_tpush_finished(const srv_tapply_tag *tag, const srv_tapply_result *r)
{
    srv_conn *c = tag->c;
    c->tapply_busy = 0;
    if (c->closing)
        return;
    const char *t = ps_msg_type_name((uint32_t)tag->type);
    const ps_table_def *d = srv_tables_def(&c->srv->tables, tag->ti);
    if (r->rc == PS_ENONFINITE) {
        srv_send_error(c, tag->id, r->rc, 0,
                       "%s: the update of key %llu of table '%s' (and of %u more) would make its row or its "
                       "optimizer state not finite: those rows were left as they were, the push's %u other rows "
                       "were applied (table_apply = hogwild applies a push row by row)",
                       t, (unsigned long long)r->bad_key, d->name, r->refused - 1, r->rows);
        return;
    }
    if (r->rc != 0) {
        srv_send_error(c, tag->id, r->rc, 0, "%s: table '%s': out of memory applying the push", t, d->name);
        return;
    }
    if (tag->type == PS_MSG_TPUSH) {
        srv_send_ok(c, tag->id);
        return;
    }
    char err[700];
    int rc = srv_tpull(c, tag->id, tag->ti, r->pkeys, r->npk, tag->min, tag->rdt, tag->rat, err, sizeof err);
    if (rc != 0)
        srv_send_error(c, tag->id, rc, 0, "%s", err);
}
