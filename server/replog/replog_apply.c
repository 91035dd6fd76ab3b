/* replog_apply.c - a follower's side of the replication log (replog.h,
 * PROTOCOL.md 17): checks a fetch's answer and applies its records, dense
 * values and version to this psd's model and tables, in the leader's
 * order. */
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "proto/msg.h"
#include "proto/vec.h"
#include "server/replog/records.h"
#include "server/replog/replog.h"
#include "server/store/plan.h"
#include "server/tables/sparse_optim.h"

/* ---- a follower applies ---------------------------------------------------- */

void srv_replog_set_aside(psd *s, srv_replog_kept *k)
{
    srv_model_move(&s->model, &k->model);
    srv_tables_move(&s->tables, &k->tables);
    srv_tables_configure(&s->tables, &s->cfg);
}

void srv_replog_take_back(psd *s, srv_replog_kept *k, int ok)
{
    srv_model_move_back(&s->model, &k->model, ok);
    srv_tables_move_back(&s->tables, &k->tables, ok);
}

static int apply_layout(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    uint8_t *copy = malloc(len);
    if (!copy)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for the layout");
    memcpy(copy, p, len);
    msgpack_zone z;
    msgpack_zone_init(&z, 4096);
    ps_msg m;
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, PS_MSG_OBJECTS_MAX};
    int rc = ps_msg_decode(copy, len, &lim, &z, &m, &s->scratch_layout, err, errlen);
    if (rc == 0 && !(m.has & PS_F_LAYOUT))
        rc = ps_fail(err, errlen, PS_EMALFORMED, "a layout record without a layout");
    if (rc == 0) {
        if (s->model.blk && !ps_layout_equal(&s->model.layout, &s->scratch_layout))
            rc = ps_fail(err, errlen, PS_ELAYOUT, "the leader's model layout differs from this psd's");
        else if (!s->model.blk) {
            srv_model_propose(&s->model, &s->scratch_layout);
            rc = srv_model_commit(&s->model, &s->cfg);
            if (rc != 0)
                ps_fail(err, errlen, rc, "no memory for the leader's model (%" PRIu64 " parameters)",
                        s->scratch_layout.total);
        }
    }
    msgpack_zone_destroy(&z);
    free(copy);
    return rc;
}

static int apply_table(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    ps_table_def d;
    memset(&d, 0, sizeof d);
    size_t want = 4 + sizeof d.name + 4 + 4 + 8 + 8 + 4 + 8 * PS_HP_COUNT + 4 + 4;
    if (len != want)
        return ps_fail(err, errlen, PS_EMALFORMED, "a table record of %zu bytes (%zu expected)", len, want);
    uint32_t i = get_u32(p);
    p += 4;
    memcpy(d.name, p, sizeof d.name), p += sizeof d.name;
    d.name[sizeof d.name - 1] = 0;
    d.dim = get_u32(p), p += 4;
    d.rinit = get_u32(p), p += 4;
    d.scale = get_f64(p), p += 8;
    d.seed = get_u64(p), p += 8;
    d.opt = get_u32(p), p += 4;
    for (int k = 0; k < PS_HP_COUNT; k++)
        d.hp[k] = get_f64(p), p += 8;
    d.part = get_u32(p), p += 4;
    d.nparts = get_u32(p);
    uint32_t idx;
    int rc = srv_tables_declare(&s->tables, &d, &idx, err, errlen);
    if (rc == 0 && idx != i)
        rc = ps_fail(err, errlen, PS_ELAYOUT, "table %s is table %u here, %u on the leader", d.name, idx, i);
    return rc;
}

static int apply_bounds(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    if (len != 32)
        return ps_fail(err, errlen, PS_EMALFORMED, "a bounds record of %zu bytes", len);
    srv_table_bounds b = {.admit = get_u32(p), .expire = get_u64(p + 4), .table_bytes = get_u64(p + 12),
                          .full = (int)get_u32(p + 20)};
    srv_tables_set_bounds(&s->tables, &b);
    srv_tables_set_limit(&s->tables, get_u64(p + 24));
    return 0;
}

static int apply_rows(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    if (len < 16)
        return ps_fail(err, errlen, PS_EMALFORMED, "a rows record of %zu bytes", len);
    uint32_t ti = get_u32(p), n = get_u32(p + 4);
    double scale = get_f64(p + 8);
    if (ti >= s->tables.n)
        return ps_fail(err, errlen, PS_ELAYOUT, "a push to table %u, which this psd does not have", ti);
    uint32_t dim = srv_tables_def(&s->tables, ti)->dim;
    if (len - 16 != (size_t)n * 8 + (size_t)n * dim * 4)
        return ps_fail(err, errlen, PS_EMALFORMED, "a rows record of %zu bytes for %u rows of %u", len, n, dim);
    const uint8_t *keys = p + 16;
    /* the gradients follow the keys, maybe unaligned: copied, into memory
     * kept for the next record (a fresh allocation of this size is fresh
     * pages, each faulted in by the copy: a third of a follower's time) */
    s->apply_scratch.len = 0;
    if (ps_buf_reserve(&s->apply_scratch, (size_t)n * dim * 4 + 1) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a push of %u rows", n);
    float *g = (float *)(void *)s->apply_scratch.p;
    memcpy(g, keys + (size_t)n * 8, (size_t)n * dim * 4);
    char why[256] = "";
    int rc = srv_tables_push(&s->tables, ti, keys, n, g, scale, why, sizeof why);
    if (rc != 0)
        return ps_fail(err, errlen, rc, "the leader's push to table %s does not apply here: %s",
                       srv_tables_def(&s->tables, ti)->name, why);
    return 0;
}

/* The leader's plan (a bsp job's, fixed by a worker's hello), checked as
 * a hello's is (PROTOCOL.md 4, `plan`). */
static int apply_plan(psd *s, const uint8_t *b, size_t bl, char *err, size_t errlen)
{
    if (bl != 32)
        return ps_fail(err, errlen, PS_EMALFORMED, "a plan record of %zu bytes", bl);
    ps_plan p = {.epochs = get_u64(b), .samples = get_u64(b + 8), .batch = get_u64(b + 16), .seed = get_u64(b + 24)};
    if (p.epochs < 1 || p.epochs > PS_PLAN_EPOCHS_MAX || p.samples < 1 || p.samples > PS_PLAN_SAMPLES_MAX ||
        p.batch < 1 || p.batch > p.samples)
        return ps_fail(err, errlen, PS_EMALFORMED, "a plan of %llu epochs of %llu samples, %llu a round: out of range",
                       (unsigned long long)p.epochs, (unsigned long long)p.samples, (unsigned long long)p.batch);
    if (!s->plan.set || memcmp(&s->plan.p, &p, sizeof p) != 0)
        srv_plan_fix(&s->plan, &p);
    return 0;
}

/* A dense update the leader applied as its gradient: applied here by
 * psd's update engine (psd.grad_apply) with the leader's settings. */
static int apply_grad(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    if (len < GRAD_HEAD)
        return ps_fail(err, errlen, PS_EMALFORMED, "a gradient record of %zu bytes", len);
    srv_replay rp = {.version = get_u64(p), .off = get_u64(p + 8), .n = get_u64(p + 16)};
    uint32_t flags = get_u32(p + 24);
    memcpy(&rp.gmax, p + 28, 4);
    rp.has_gmax = (flags & GRAD_HAS_GMAX) != 0;
    rp.from_first = (flags & GRAD_FROM_FIRST) != 0;
    rp.clip = (flags & GRAD_CLIP) != 0;
    if ((len - GRAD_HEAD) / 4 != rp.n || (len - GRAD_HEAD) % 4)
        return ps_fail(err, errlen, PS_EMALFORMED, "a gradient record of %zu bytes for %" PRIu64 " values", len,
                       rp.n);
    if (!m->blk || !m->initialized || rp.n == 0 || rp.off > m->layout.total || rp.n > m->layout.total - rp.off)
        return ps_fail(err, errlen, PS_ELAYOUT, "a gradient of [%" PRIu64 ", +%" PRIu64 ") for a model of %" PRIu64
                       " values%s", rp.off, rp.n, m->blk ? m->layout.total : 0,
                       m->blk && !m->initialized ? " not initialised yet" : "");
    if (rp.version < m->version)
        return ps_fail(err, errlen, PS_EMALFORMED, "a gradient applied at version %" PRIu64 ", behind this "
                       "follower's %" PRIu64, rp.version, m->version);
    if (!s->grad_apply)
        return ps_fail(err, errlen, PS_ESTATE, "a gradient record, which this psd cannot apply");
    /* the floats follow the head, maybe unaligned: copied, into memory kept
     * for the next record (apply_rows says why) */
    s->apply_scratch.len = 0;
    if (ps_buf_reserve(&s->apply_scratch, (size_t)rp.n * 4 + 1) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory for a gradient of %" PRIu64 " values", rp.n);
    memcpy(s->apply_scratch.p, p + GRAD_HEAD, (size_t)rp.n * 4);
    rp.g = (const float *)(const void *)s->apply_scratch.p;
    float mx = ps_vec_maxabs(rp.g, (size_t)rp.n); /* NaN or inf when one is */
    if (!(mx <= FLT_MAX) || (rp.has_gmax && !(mx <= rp.gmax)))
        return ps_fail(err, errlen, PS_EMALFORMED, "a gradient record whose values are not finite or past its bound");
    return s->grad_apply(s, &rp, err, errlen);
}

/* The leader's dense optimizer settings, which its gradients that follow
 * are applied with. */
static int apply_optim(psd *s, const uint8_t *p, size_t len, char *err, size_t errlen)
{
    if (len != SRV_OPTIM_SETTINGS_BYTES + RELEASE_BYTES)
        return ps_fail(err, errlen, PS_EMALFORMED, "an optimizer record of %zu bytes", len);
    char release[RELEASE_BYTES];
    memcpy(release, p + SRV_OPTIM_SETTINGS_BYTES, RELEASE_BYTES);
    release[RELEASE_BYTES - 1] = 0;
    if (strncmp(release, PSD_VERSION, RELEASE_BYTES - 1) != 0)
        return ps_fail(err, errlen, PS_ELAYOUT, "the leader runs psd %s and this follower psd %s: a follower applies "
                       "its leader's gradients bit for bit only with the same release", release, PSD_VERSION);
    if (!s->model.blk)
        return ps_fail(err, errlen, PS_ELAYOUT, "optimizer settings before the model's layout");
    if (srv_optim_settings_take(&s->model.opt, p) != 0)
        return ps_fail(err, errlen, PS_ELAYOUT, "the leader's optimizer settings do not apply to this psd's "
                       "optimizer (%s): give the follower the leader's optimizer", srv_optim_name(&s->model.opt));
    return 0;
}

int srv_replog_apply(psd *s, const uint8_t *p, size_t len,
                     int (*pushid)(psd *s, uint64_t cid, uint64_t pid), char *err, size_t errlen)
{
    size_t at = 0;
    while (at + 4 <= len) {
        uint32_t l = get_u32(p + at);
        if (l == 0)
            break; /* padding */
        if (l > len - at - 4)
            return ps_fail(err, errlen, PS_EMALFORMED, "a record of %u bytes where %zu are left", l, len - at - 4);
        const uint8_t *b = p + at + 5;
        size_t bl = l - 1;
        int rc;
        switch (p[at + 4]) {
        case REC_LAYOUT: rc = apply_layout(s, b, bl, err, errlen); break;
        case REC_ROWS: rc = apply_rows(s, b, bl, err, errlen); break;
        case REC_TABLE: rc = apply_table(s, b, bl, err, errlen); break;
        case REC_BOUNDS: rc = apply_bounds(s, b, bl, err, errlen); break;
        case REC_MOVE:
            rc = s->move_apply ? s->move_apply(s, b, bl, err, errlen)
                               : ps_fail(err, errlen, PS_ESTATE, "a move of parts' record, which this psd cannot apply");
            break;
        case REC_PLAN: rc = apply_plan(s, b, bl, err, errlen); break;
        case REC_GRAD: rc = apply_grad(s, b, bl, err, errlen); break;
        case REC_OPTIM: rc = apply_optim(s, b, bl, err, errlen); break;
        case REC_PUSHID:
            if (bl != 16)
                rc = ps_fail(err, errlen, PS_EMALFORMED, "a push id record of %zu bytes", bl);
            else
                rc = pushid && pushid(s, get_u64(b), get_u64(b + 8)) == PS_ENOMEM
                         ? ps_fail(err, errlen, PS_ENOMEM, "no memory for a push id") : 0;
            break;
        default: rc = ps_fail(err, errlen, PS_EMALFORMED, "a record of unknown kind %u", p[at + 4]); break;
        }
        if (rc != 0)
            return rc;
        at += 4 + (size_t)l;
    }
    return 0;
}

/* Checks the records in p[0..len) without applying them: each one's length
 * inside the bytes, a known kind, the size of the fixed-size ones. */
static int records_check(const uint8_t *p, size_t len, char *err, size_t errlen)
{
    size_t at = 0;
    while (at + 4 <= len) {
        uint32_t l = get_u32(p + at);
        if (l == 0)
            break; /* padding: zeros to the end */
        if (l > len - at - 4)
            return ps_fail(err, errlen, PS_EMALFORMED, "a record of %u bytes where %zu are left", l, len - at - 4);
        size_t bl = l - 1, want = 0;
        switch (p[at + 4]) {
        case REC_LAYOUT: break;
        case REC_ROWS: want = bl < 16 ? 16 : 0; break;
        case REC_TABLE: want = 4 + 64 + 4 + 4 + 8 + 8 + 4 + 8 * PS_HP_COUNT + 4 + 4; break;
        case REC_BOUNDS: want = 32; break;
        case REC_PUSHID: want = 16; break;
        case REC_PLAN: want = 32; break;
        case REC_MOVE: want = bl < 13 ? 13 : 0; break;
        case REC_GRAD: /* its head, then as many floats as it says */
            want = bl < GRAD_HEAD || get_u64(p + at + 5 + 16) > (bl - GRAD_HEAD) / 4 ? GRAD_HEAD
                                                                                   : GRAD_HEAD + get_u64(p + at + 5 + 16) * 4;
            break;
        case REC_OPTIM: want = SRV_OPTIM_SETTINGS_BYTES + RELEASE_BYTES; break;
        default: return ps_fail(err, errlen, PS_EMALFORMED, "a record of unknown kind %u", p[at + 4]);
        }
        if (want && bl != want)
            return ps_fail(err, errlen, PS_EMALFORMED, "a record of kind %c of %zu bytes (%zu expected)", p[at + 4],
                           bl, want);
        at += 4 + (size_t)l;
    }
    for (; at < len; at++)
        if (p[at])
            return ps_fail(err, errlen, PS_EMALFORMED, "bytes after the records' padding");
    return 0;
}

/* The values an answer's blocks idx[0..nbi) carry on model m: each block's
 * values (the last one may be shorter) and its state's; 0 when a block is
 * outside the model (refused apart). */
static uint64_t answer_values(const srv_model *m, const uint8_t *idx, uint32_t nbi, uint32_t nst)
{
    uint64_t v = 0;
    for (uint32_t i = 0; i < nbi; i++) {
        uint32_t b = get_u32(idx + 4 * (size_t)i);
        if (b >= m->nblk)
            return 0;
        v += (uint64_t)m->blk[b]->cap * (1 + nst);
    }
    return v;
}

int srv_replog_apply_answer(psd *s, const uint8_t *p, size_t len, uint64_t from, uint64_t end, uint64_t *next,
                            int (*pushid)(psd *s, uint64_t cid, uint64_t pid), char *err, size_t errlen)
{
    srv_model *m = &s->model;
    if (len < HEAD_FIXED)
        return ps_fail(err, errlen, PS_EMALFORMED, "a replication answer of %zu bytes (its head alone is %d)", len,
                       HEAD_FIXED);
    uint32_t head = get_u32(p), dense = get_u32(p + 24), nst = get_u32(p + 28), nbi = get_u32(p + 32);
    uint64_t pos = get_u64(p + 4), ver = get_u64(p + 12);
    int init = (int)get_u32(p + 20);
    if (head < HEAD_FIXED || head % 4 || head > len || (head - HEAD_FIXED) / 4 < nbi)
        return ps_fail(err, errlen, PS_EMALFORMED, "a replication answer whose head says %u bytes (%u blocks) in %zu",
                       head, nbi, len);
    if (nst > STATE_MAX)
        return ps_fail(err, errlen, PS_EMALFORMED, "a replication answer of %u state buffers", nst);
    const uint8_t *idx = p + HEAD_FIXED, *rec = idx + 4 * (size_t)nbi;
    float *st[STATE_MAX];
    const char *names[STATE_MAX];
    if (nbi) {
        size_t have = m->blk ? srv_optim_state_buffers(&m->opt, st, names, STATE_MAX) : 0;
        if (m->blk && nst != have)
            return ps_fail(err, errlen, PS_ELAYOUT,
                           "the leader's optimizer keeps %u state buffers, this psd's (%s) %zu: give the follower the "
                           "leader's optimizer settings", nst, srv_optim_name(&m->opt), have);
        for (uint32_t i = 0; i < nbi; i++) {
            uint32_t b = get_u32(idx + 4 * (size_t)i);
            if ((i && b <= get_u32(idx + 4 * (size_t)(i - 1))) || (m->blk && b >= m->nblk))
                return ps_fail(err, errlen, PS_EMALFORMED, "a replication answer with block %u of the model (%s %zu)",
                               b, i ? "after" : "of", i ? (size_t)get_u32(idx + 4 * (size_t)(i - 1)) : m->nblk);
        }
    }
    if (nst > STATE_MAX || len - head > (uint64_t)nbi * (1 + nst) * SRV_BLK_FLOATS * 4 ||
        (m->blk && len - head != answer_values(m, p + HEAD_FIXED, nbi, nst) * 4))
        return ps_fail(err, errlen, PS_EMALFORMED,
                       "a replication answer of %zu bytes, where its head (%u bytes, %u blocks of %u buffers) says %"
                       PRIu64, len, head, nbi, 1 + nst,
                       (uint64_t)head + (m->blk ? answer_values(m, p + HEAD_FIXED, nbi, nst) * 4 : 0));
    if (pos < from || pos > end)
        return ps_fail(err, errlen, PS_EMALFORMED,
                       "a replication answer that moves this follower to position %" PRIu64 ", outside the %" PRIu64
                       "..%" PRIu64 " it asked for", pos, from, end);
    if (dense && (ver < m->version || (m->initialized && !init)))
        return ps_fail(err, errlen, PS_EMALFORMED,
                       "a replication answer of model version %" PRIu64 "%s, behind this follower's %" PRIu64,
                       ver, init ? "" : " (no values)", m->version);
    int rc = records_check(rec, (size_t)(p + head - rec), err, errlen);
    if (rc == 0)
        rc = srv_replog_apply(s, rec, (size_t)(p + head - rec), pushid, err, errlen);
    if (rc != 0)
        return rc;
    if (nbi) { /* a layout record came first: the model has it now */
        size_t have = m->blk ? srv_optim_state_buffers(&m->opt, st, names, STATE_MAX) : 0;
        if (!m->blk || nst != have || get_u32(idx + 4 * (size_t)(nbi - 1)) >= m->nblk ||
            len - head != answer_values(m, idx, nbi, nst) * 4)
            return ps_fail(err, errlen, PS_ELAYOUT, "dense values for a model this follower does not have");
    }
    const uint8_t *v = p + head;
    for (uint32_t i = 0; i < nbi; i++) {
        uint64_t b0 = (uint64_t)get_u32(idx + 4 * (size_t)i) << SRV_BLK_SHIFT;
        uint64_t cnt = m->blk[b0 >> SRV_BLK_SHIFT]->cap;
        for (uint64_t done = 0; done < cnt;) {
            srv_wseg seg;
            if (srv_model_write_begin(m, b0 + done, cnt - done, &seg) != 0)
                return ps_fail(err, errlen, PS_ENOMEM, "no memory to apply dense values");
            memcpy(seg.wo, v + done * 4, seg.len * 4);
            srv_model_write_end(m, &seg);
            done += seg.len;
        }
        v += cnt * 4;
        for (uint32_t k = 0; k < nst; k++, v += cnt * 4)
            memcpy(st[k] + b0, v, cnt * 4);
    }
    if (dense) {
        if (init)
            srv_model_set_initialized(m, ver);
        if (nbi)
            srv_model_touched(m); /* values from elsewhere (a version alone is not) */
    }
    *next = pos;
    return 0;
}
