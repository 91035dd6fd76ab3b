/* bsp.c - the bsp policy: sums a round's pushes (kept per shard until the
 * round closes, bsp_kept.c, or added up in arrival order) and applies
 * their mean once the live workers (less backup_workers) have pushed; with
 * a plan, the round's members are the plan's; a round may close piece by
 * piece (bsp_pieces.c). Owns the round (srv_bsp_state in psd.policy_state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/policy/bsp.h"
#include "server/replog/pushid.h"
#include "server/update/update.h"

static uint64_t now_ms(const psd *s)
{
    return s->clock ? s->clock() : srv_now_ms();
}

/* Pushes that close a round: the workers that are not gone (M less those
 * that joined once and left or died), less the backup workers; at least 1. */
static uint32_t bsp_needed(psd *s)
{
    if (srv_plan_active(s)) {
        /* the round's members still in the job (the plan's), and those
         * gone (or rejoining at a later round) after their push was
         * complete: it counts */
        uint32_t live = srv_plan_needed(s), b = (uint32_t)s->cfg.backup_workers;
        const srv_bsp_state *st = s->policy_state;
        for (uint32_t i = 0; st && i < st->nsh; i++) {
            const srv_bsp_shard *sh = st->sh[i];
            const srv_worker *w = i < s->nworkers_cap ? s->workers[i] : NULL;
            if (sh && sh->round == s->model.version && sh->round_fin && w && !srv_plan_in(s, w))
                live++;
        }
        return live > b ? live - b : 1;
    }
    uint32_t gone = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (w && w->state != SRV_W_CONNECTED)
            gone++;
    }
    uint32_t m = (uint32_t)s->cfg.workers;
    uint32_t live = gone >= m ? 0 : m - gone;
    uint32_t b = (uint32_t)s->cfg.backup_workers;
    return live > b ? live - b : 1;
}

static srv_bsp_state *bsp_get(psd *s, char *err, size_t errlen)
{
    srv_bsp_state *b = s->policy_state;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b && s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL)
            b->acc = calloc(s->model.layout.total, sizeof(float));
        if (!b || (s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL && !b->acc)) {
            free(b);
            snprintf(err, errlen, "out of memory for the BSP accumulator");
            return NULL;
        }
        b->round_start_ms = now_ms(s);
        s->policy_state = b;
    }
    return b;
}

/* The state of shard i, made when it first pushes; NULL when out of memory. */
static srv_bsp_shard *bsp_shard_get(srv_bsp_state *b, uint32_t i)
{
    if (i >= b->nsh) {
        uint32_t cap = b->nsh ? b->nsh : 8;
        while (cap <= i)
            cap *= 2;
        srv_bsp_shard **p = realloc(b->sh, cap * sizeof *p);
        if (!p)
            return NULL;
        memset(p + b->nsh, 0, (cap - b->nsh) * sizeof *p);
        b->sh = p;
        b->nsh = cap;
    }
    if (!b->sh[i] && (b->sh[i] = calloc(1, sizeof(srv_bsp_shard))))
        b->sh[i]->round = UINT64_MAX;
    return b->sh[i];
}

/* Applies the round's table pushes, summed in shard order over the shards
 * whose step the round counted, scaled as the dense mean is (PROTOCOL.md
 * 13.5). A table whose update is refused (memory, overflow) stays as it
 * was: logged and counted. */
static void bsp_tables_apply(psd *s, srv_bsp_state *b, uint64_t round)
{
    if (b->tr.np == 0)
        return;
    uint32_t nin = 0, failed = 0;
    uint32_t *in = malloc((b->nsh ? b->nsh : 1) * sizeof *in);
    char err[700] = "";
    for (uint32_t i = 0; in && i < b->nsh; i++)
        if (b->sh[i] && b->sh[i]->round == round && b->sh[i]->round_fin)
            in[nin++] = i;
    srv_tables_configure(&s->tables, &s->cfg);
    if (!in || srv_tround_apply(&b->tr, &s->tables, in, nin, b->count ? 1.0 / b->count : 1.0, &failed, err,
                                sizeof err) != 0) {
        PS_LOG(PS_LOG_ERROR, "round %llu closed without its table updates: out of memory", (unsigned long long)round);
        srv_tround_clear(&b->tr);
        SRV_COUNT(s, nonfinite_updates, 1);
    } else if (failed) {
        PS_LOG(PS_LOG_ERROR, "round %llu: %u table(s) left without the round's update: %s", (unsigned long long)round,
               failed, err);
        SRV_COUNT(s, nonfinite_updates, failed);
    }
    free(in);
}

/* The round's update is applied: a new version. */
static void bsp_round_closed(psd *s)
{
    srv_bsp_state *b = s->policy_state;
    uint64_t round = s->model.version;
    bsp_tables_apply(s, b, round);
    srv_model_bump(&s->model);
    srv_pushid_round_closed(s); /* its pushes count from now on */
    SRV_COUNT(s, rounds, 1);
    uint64_t now = now_ms(s);
    srv_stats_observe(s, SRV_HIST_ROUND_SECONDS, (double)(now - b->round_start_ms) / 1000.0);
    PS_LOG(PS_LOG_DEBUG, "round %llu closed with %u pushes in %llu ms", (unsigned long long)round, b->count,
           (unsigned long long)(now - b->round_start_ms));
    b->round_start_ms = now;
    b->count = 0;
    srv_snap_unref(b->base);
    b->base = NULL;
    b->gmax = 0;
    b->gmax_unknown = 0;
    if (srv_plan_active(s)) {
        /* who trains the next round is fixed now, as its pulls are answered */
        if (srv_plan_open(s) != 0)
            PS_LOG(PS_LOG_ERROR, "out of memory fixing round %llu's workers; every worker trains it",
                   (unsigned long long)s->model.version);
        if (srv_plan_done(s) && srv_plan_say_done(&s->plan)) {
            PS_LOG(PS_LOG_INFO, "plan: round %llu, the last of %llu epochs, closed: the job is done (model version "
                                "%llu); pushes from now on are dropped",
                   (unsigned long long)round, (unsigned long long)s->plan.p.epochs,
                   (unsigned long long)s->model.version);
        }
    }
}

/* Closes the round when enough pushes are in: applies their mean, made
 * piece by piece from the shards' gradients in shard order (or from the
 * arrival-order sum), never as a model-sized array. closer is the worker
 * whose push completed the round, and may_defer whether its reply may wait
 * (NULL, 0 when a membership change or the tick closes it): for a big
 * model the update then runs off the loop and this returns SRV_PENDING.
 * Returns SRV_WAKE when the round closed, 0 when it stays open (not
 * enough pushes yet, or out of memory: logged, tried again on the tick). */
static int bsp_try_close(psd *s, srv_worker *closer, int may_defer)
{
    srv_bsp_state *b = s->policy_state;
    if (!b || b->count == 0 || b->count < bsp_needed(s) || srv_update_busy(s))
        return 0;
    size_t total = s->model.layout.total;
    uint64_t round = s->model.version;
    srv_grad gr = {.inv = 1.0f / (float)b->count};
    if (srv_bsp_sources_room(b) != 0) {
        PS_LOG(PS_LOG_ERROR, "out of memory closing round %llu; it stays open", (unsigned long long)round);
        return 0;
    }
    gr.src = b->src;
    gr.blk = b->blk;
    gr.xs = b->xs;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        /* in shard order, so the result does not depend on arrival order */
        for (uint32_t i = 0; i < b->nsh; i++) {
            srv_bsp_shard *w = b->sh[i];
            if (!w || w->round != round || !w->round_fin)
                continue;
            if (srv_bsp_source_ready(w, total) != 0) {
                PS_LOG(PS_LOG_ERROR, "out of memory closing round %llu; it stays open", (unsigned long long)round);
                return 0;
            }
            b->blk[gr.nsrc] = w->nkept ? w->kept_at : NULL;
            gr.src[gr.nsrc++] = w->slot;
        }
    } else {
        b->blk[gr.nsrc] = NULL;
        gr.src[gr.nsrc++] = b->acc;
        gr.zero_src = 1;
    }
    /* the mean's values lie within its sources' */
    gr.has_gmax = !b->gmax_unknown;
    gr.gmax = b->gmax;
    if (b->npieces && b->pround == round && b->nclosed) {
        /* closing piece by piece: the pieces still open, with every push */
        for (size_t p = 0; p < b->npieces; p++) {
            if (b->pclosed[p])
                continue;
            uint64_t lo = (uint64_t)p * b->piece, hi = srv_bsp_piece_hi(b, p, total);
            int rc = srv_update_apply(s, &gr, lo, hi - lo, NULL);
            if (rc != 0 && rc != PS_ENONFINITE) {
                PS_LOG(PS_LOG_ERROR, "out of memory copying a model block closing round %llu; it stays open",
                       (unsigned long long)round);
                return 0;
            }
            b->pclosed[p] = 1;
            b->nclosed++;
        }
        bsp_round_closed(s);
        return SRV_WAKE;
    }
    srv_update_tag tag = {.w = closer, .fin = 1, .round = 1};
    int rc = srv_update_apply(s, &gr, 0, total, closer && may_defer ? &tag : NULL);
    if (rc == SRV_PENDING)
        return SRV_PENDING;
    if (rc == PS_ENONFINITE) {
        /* the round's mean would overflow the model: the round closes
         * with the model unchanged (update.c logged and counted it) */
        PS_LOG(PS_LOG_ERROR, "round %llu closed without its update: its mean would make parameters infinite or NaN",
               (unsigned long long)round);
        if (b->acc)
            memset(b->acc, 0, total * sizeof(float));
        bsp_round_closed(s);
        return SRV_WAKE;
    }
    if (rc != 0) {
        /* nothing applied: the round stays open, tried again on psd's tick */
        PS_LOG(PS_LOG_ERROR, "out of memory copying a model block closing round %llu; it stays open",
               (unsigned long long)round);
        return 0;
    }
    bsp_round_closed(s);
    return SRV_WAKE;
}

static int bsp_push(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen)
{
    uint64_t round = s->model.version;
    if (p->base < round) {
        snprintf(err, errlen, "push for round %llu arrived after it closed (round %llu is open); dropped",
                 (unsigned long long)p->base, (unsigned long long)round);
        return PS_ESTALE;
    }
    if (srv_plan_active(s)) {
        if (srv_plan_done(s)) {
            snprintf(err, errlen, "push for round %llu after the plan's last round (%llu) closed: the job is done; "
                     "dropped", (unsigned long long)p->base, (unsigned long long)(s->plan.rounds - 1));
            return PS_ESTALE;
        }
        if (!srv_plan_member(s, w)) {
            snprintf(err, errlen, "shard %u joined after round %llu was handed out; it trains from the next round "
                     "on; dropped", w->shard, (unsigned long long)round);
            return PS_ESTALE;
        }
    }
    srv_bsp_state *b = bsp_get(s, err, errlen);
    if (!b)
        return PS_ENOMEM;
    srv_bsp_shard *sh = bsp_shard_get(b, w->shard);
    if (!sh) {
        snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
        return PS_ENOMEM;
    }
    if (sh->round == round && sh->round_fin) {
        snprintf(err, errlen, "shard %u already pushed for round %llu", w->shard, (unsigned long long)round);
        return PS_EDUPLICATE;
    }
    if (sh->round != round)
        srv_bsp_shard_reset(sh, round); /* the last round's are applied, or were dropped */
    if (srv_bsp_pieces_begin(s, b) != 0)
        PS_LOG(PS_LOG_WARN, "out of memory for round %llu's pieces; it closes whole", (unsigned long long)round);
    struct srv_bsp_range dup;
    if (srv_bsp_range_check(sh, p->off, p->n, &dup) != 0) {
        snprintf(err, errlen,
                 "shard %u pushed [%llu, %llu) twice in round %llu (it already sent [%llu, %llu)); a push counts "
                 "once per round",
                 w->shard, (unsigned long long)p->off, (unsigned long long)(p->off + p->n),
                 (unsigned long long)round, (unsigned long long)dup.lo, (unsigned long long)dup.hi);
        return PS_EDUPLICATE;
    }
    int arrival = s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL;
    if (arrival && p->fin && sh->nrg == 0) {
        /* the whole push in one message: straight into the sum */
        for (uint64_t j = 0; j < p->n; j++)
            b->acc[p->off + j] += p->g[j];
    } else {
        if (srv_bsp_range_add(sh, p->off, p->n) != 0 || srv_bsp_keep(s, sh, p) != 0) {
            snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
            return PS_ENOMEM;
        }
        if (arrival && p->fin) {
            srv_bsp_fold_into(b, sh);
            srv_bsp_kept_release(sh);
        }
    }
    if (!p->has_gmax)
        b->gmax_unknown = 1;
    else if (p->gmax > b->gmax)
        b->gmax = p->gmax;
    srv_bsp_pieces_note(b, sh, p->off, p->n, s->model.layout.total); /* pieces: shard order, so never the arrival path */
    if (p->fin) {
        sh->round_fin = 1;
        w->clock++;
        b->count++;
        int rc = bsp_try_close(s, w, p->may_defer);
        if (rc != 0)
            return rc;
    }
    return srv_bsp_pieces_close(s, b, p->off, p->n, bsp_needed(s));
}

static int bsp_applied(psd *s, const srv_update_tag *tag)
{
    bsp_round_closed(s);
    return SRV_WAKE;
}

static int bsp_joined(psd *s, srv_worker *w)
{
    return bsp_try_close(s, NULL, 0);
}

/* A worker that leaves or is lost in the middle of its push: what it sent
 * of it is dropped (it never counted), and the round may close without it. */
static int bsp_left(psd *s, srv_worker *w)
{
    srv_bsp_state *b = s->policy_state;
    if (b && w->shard < b->nsh && b->sh[w->shard]) {
        srv_bsp_shard *sh = b->sh[w->shard];
        if (sh->round == s->model.version && !sh->round_fin && sh->nrg) {
            PS_LOG(PS_LOG_INFO, "shard %u's unfinished push for round %llu dropped", w->shard,
                   (unsigned long long)sh->round);
            srv_bsp_shard_reset(sh, UINT64_MAX);
            if (b->npieces && b->pround == s->model.version)
                srv_bsp_pieces_recount(s, b);
        }
        if (!(sh->round == s->model.version && sh->round_fin))
            srv_tround_drop(&b->tr, w->shard); /* its table pushes go with its step */
    }
    int rc = bsp_try_close(s, NULL, 0);
    return rc || !b ? rc : srv_bsp_pieces_close(s, b, 0, s->model.layout.total, bsp_needed(s));
}

/* Without a plan as the default: the model initialised and at min. With
 * one a worker's pull waits while the worker has no part in the current
 * round (it joined after the round was handed out) or has already pushed
 * its part (it reconnected after its push): it is answered with the next
 * round, so a round never gets a share twice. Once the plan is done every
 * pull is answered (its reply says done). */
static int bsp_pull_ready(psd *s, const srv_worker *w, uint64_t min)
{
    if (!s->model.initialized)
        return 0;
    if (w && srv_plan_active(s)) {
        if (srv_plan_done(s))
            return 1;
        if (!srv_plan_member(s, w))
            return 0;
        srv_bsp_state *b = s->policy_state;
        const srv_bsp_shard *sh = b && w->shard < b->nsh ? b->sh[w->shard] : NULL;
        if (sh && sh->round == s->model.version && sh->round_fin)
            return 0;
    }
    return s->model.version >= min;
}

static uint64_t bsp_range_version(psd *s, uint64_t off, uint64_t len)
{
    const srv_bsp_state *b = s->policy_state;
    if (!b || !b->nclosed || b->pround != s->model.version || !len)
        return 0;
    for (size_t p = (size_t)(off / b->piece); p <= (size_t)((off + len - 1) / b->piece); p++)
        if (!b->pclosed[p])
            return 0;
    return s->model.version + 1;
}

static srv_snap *bsp_round_base(psd *s)
{
    const srv_bsp_state *b = s->policy_state;
    return b ? b->base : NULL;
}

static uint64_t bsp_piece(const psd *s)
{
    return srv_bsp_pieces_on(s) ? s->cfg.bsp_piece : 0;
}

static uint32_t bsp_unpushed(psd *s, uint32_t *out, uint32_t max)
{
    const srv_bsp_state *b = s->policy_state;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (!w || w->state != SRV_W_CONNECTED || (srv_plan_active(s) && !srv_plan_member(s, w)))
            continue;
        const srv_bsp_shard *sh = b && i < b->nsh ? b->sh[i] : NULL;
        if (sh && sh->round == s->model.version && sh->round_fin)
            continue;
        if (n < max)
            out[n] = i;
        n++;
    }
    return n;
}

/* A table push from w for round base (PROTOCOL.md 13.5): kept until the
 * round closes, or refused with nothing kept. */
static int bsp_tpush(psd *s, srv_worker *w, const srv_tpush *p, char *err, size_t errlen)
{
    uint64_t base = p->base;
    uint32_t ti = p->ti, n = p->n;
    const uint8_t *keys = p->keys;
    const float *g = p->g;
    uint64_t round = s->model.version;
    if (base < round) {
        snprintf(err, errlen, "table push for round %llu arrived after it closed (round %llu is open); dropped",
                 (unsigned long long)base, (unsigned long long)round);
        return PS_ESTALE;
    }
    if (srv_plan_active(s) && (srv_plan_done(s) || !srv_plan_member(s, w))) {
        snprintf(err, errlen, "table push for round %llu: %s; dropped", (unsigned long long)round,
                 srv_plan_done(s) ? "the plan's last round closed" : "this shard trains from the next round on");
        return PS_ESTALE;
    }
    srv_bsp_state *b = bsp_get(s, err, errlen);
    if (!b)
        return PS_ENOMEM;
    const srv_bsp_shard *sh = w->shard < b->nsh ? b->sh[w->shard] : NULL;
    if (sh && sh->round == round && sh->round_fin) {
        snprintf(err, errlen, "shard %u completed its step of round %llu already: its table pushes must come "
                              "before its last dense push; dropped",
                 w->shard, (unsigned long long)round);
        return PS_EDUPLICATE;
    }
    const ps_table_def *d = srv_tables_def(&s->tables, ti);
    uint64_t more = (uint64_t)n * (8 + d->dim * sizeof(float));
    if (b->tr.bytes + more > s->cfg.max_table_memory) {
        snprintf(err, errlen, "table '%s': round %llu's kept table pushes would take %llu bytes, past "
                              "max_table_memory (%llu bytes); nothing was kept",
                 d->name, (unsigned long long)round, (unsigned long long)(b->tr.bytes + more),
                 (unsigned long long)s->cfg.max_table_memory);
        return PS_ELIMIT;
    }
    uint64_t dup = 0;
    int rc = srv_tround_keep(&b->tr, w->shard, ti, keys, n, g, d->dim, &dup);
    if (rc == PS_EDUPLICATE)
        snprintf(err, errlen, "shard %u pushed key %llu of table '%s' twice in round %llu; a row counts once per "
                              "round; nothing was kept",
                 w->shard, (unsigned long long)dup, d->name, (unsigned long long)round);
    else if (rc != 0)
        snprintf(err, errlen, "out of memory keeping shard %u's table push", w->shard);
    return rc;
}

/* What rounds of every shard, summed in shard order, cannot have. */
static int bsp_check(const ps_config *c, char *err, size_t errlen)
{
    if (c->backup_workers >= c->workers) {
        snprintf(err, errlen, "backup_workers (%d) must be less than workers (%d)", c->backup_workers, c->workers);
        return PS_EINVAL;
    }
    if (c->hogwild) {
        snprintf(err, errlen, "hogwild updates the model without rounds or clocks: it needs mode = asgd");
        return PS_EINVAL;
    }
    if (c->elastic_alpha > 0 && !(c->local_steps > 0)) {
        snprintf(err, errlen, "elastic averaging is asynchronous: it needs mode = asgd");
        return PS_EINVAL;
    }
    if (c->table_apply == PS_TABLE_APPLY_HOGWILD) {
        snprintf(err, errlen, "table_apply = hogwild applies table pushes as they come, from several threads; mode = "
                              "bsp sums a round's table pushes in shard order, bit for bit the same whatever order "
                              "they arrive in, and applies them once as the round closes: use mode = asgd or ssp "
                              "with table_apply = hogwild, or table_apply = ordered with bsp");
        return PS_EINVAL;
    }
    return 0;
}

/* A round that memory kept from closing (every push is in) closes here. */
static int bsp_tick(psd *s)
{
    return bsp_try_close(s, NULL, 0);
}

static void bsp_destroy(psd *s)
{
    srv_bsp_state *b = s->policy_state;
    srv_pushid_round_drop(s); /* the open round's pushes go with it */
    if (b) {
        for (uint32_t i = 0; i < b->nsh; i++)
            srv_bsp_shard_free(b->sh[i]);
        free(b->sh);
        free(b->acc);
        free(b->src);
        free(b->blk);
        free(b->xs);
        free(b->pcount);
        free(b->pclosed);
        srv_snap_unref(b->base);
        srv_tround_free(&b->tr);
        free(b);
        s->policy_state = NULL;
    }
}

const srv_policy_ops srv_policy_bsp = {
    .name = "bsp",
    .push = bsp_push,
    .applied = bsp_applied,
    .worker_left = bsp_left,
    .worker_joined = bsp_joined,
    .pull_ready = bsp_pull_ready,
    .range_version = bsp_range_version,
    .round_base = bsp_round_base,
    .piece = bsp_piece,
    .unpushed = bsp_unpushed,
    .tick = bsp_tick,
    .destroy = bsp_destroy,
    .tpush = bsp_tpush,
    .check = bsp_check,
    .rounds = 1,
    .barriers = 1,
    .plan = 1,
};
