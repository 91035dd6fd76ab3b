/* policy.c - consistency modes: when a push is applied and when a round
 * closes. ASGD applies each push as it arrives; BSP sums a round's pushes
 * and applies their mean once every expected worker has pushed. Neither
 * knows about sockets: they change the model and call srv_answer_parked(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "psd.h"

static int check_range(psd *s, uint64_t off, uint64_t n, char *err, size_t errlen)
{
    uint64_t total = s->model.layout.total;
    if (n == 0 || off > total || n > total - off) {
        snprintf(err, errlen, "range [%llu, %llu) is outside the model's %llu parameters",
                 (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)total);
        return PS_ERANGE;
    }
    return 0;
}

/* ---- ASGD ---------------------------------------------------------------- */

static int asgd_push(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                     char *err, size_t errlen)
{
    int rc = check_range(s, off, n, err, errlen);
    if (rc != 0)
        return rc;
    if (base > s->model.version) {
        snprintf(err, errlen, "base version %llu is ahead of the model (%llu)", (unsigned long long)base,
                 (unsigned long long)s->model.version);
        return PS_EBAD_FIELD;
    }
    float *wv = srv_model_writable(&s->model);
    if (!wv) {
        snprintf(err, errlen, "out of memory for a model snapshot");
        return PS_ENOMEM;
    }
    srv_optim_apply(&s->model.opt, wv, g, off, n, s->model.version);
    if (fin) {
        srv_model_bump(&s->model);
        srv_answer_parked(s);
    }
    return 0;
}

static void asgd_noop(psd *s, srv_worker *w)
{
}

static void asgd_destroy(psd *s)
{
}

const srv_policy_ops srv_policy_asgd = {
    .name = "asgd",
    .push = asgd_push,
    .worker_left = asgd_noop,
    .worker_joined = asgd_noop,
    .destroy = asgd_destroy,
};

/* ---- BSP ----------------------------------------------------------------- */

typedef struct bsp_state {
    float *acc;     /* the round's sum (arrival order) or scratch for it (shard order) */
    uint32_t count; /* complete pushes in the current round */
    uint64_t round_start_ms;
} bsp_state;

/* Workers a round waits for: M, less those that joined and are gone now. */
static uint32_t bsp_expected(psd *s)
{
    uint32_t gone = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        srv_worker *w = s->workers[i];
        if (w && w->state != SRV_W_CONNECTED)
            gone++;
    }
    uint32_t m = (uint32_t)s->cfg.workers;
    return gone >= m ? 0 : m - gone;
}

static bsp_state *bsp_get(psd *s, char *err, size_t errlen)
{
    bsp_state *b = s->policy_state;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (b)
            b->acc = calloc(s->model.layout.total, sizeof(float));
        if (!b || !b->acc) {
            if (b)
                free(b);
            snprintf(err, errlen, "out of memory for the BSP accumulator");
            return NULL;
        }
        b->round_start_ms = srv_now_ms();
        s->policy_state = b;
    }
    return b;
}

static void bsp_try_close(psd *s)
{
    bsp_state *b = s->policy_state;
    if (!b || b->count == 0 || b->count < bsp_expected(s))
        return;
    size_t total = s->model.layout.total;
    uint64_t round = s->model.version;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        /* Sum in shard order so the result does not depend on arrival order. */
        int first = 1;
        for (uint32_t i = 0; i < s->nworkers_cap; i++) {
            srv_worker *w = s->workers[i];
            if (!w || w->round != round || !w->round_fin || !w->slot)
                continue;
            if (first)
                memcpy(b->acc, w->slot, total * sizeof(float));
            else
                for (size_t j = 0; j < total; j++)
                    b->acc[j] += w->slot[j];
            first = 0;
        }
    }
    float inv = 1.0f / (float)b->count;
    for (size_t j = 0; j < total; j++)
        b->acc[j] *= inv;
    float *wv = srv_model_writable(&s->model);
    if (!wv) {
        PS_LOG(PS_LOG_ERROR, "out of memory copying the model; round %llu stays open",
               (unsigned long long)round);
        return;
    }
    srv_optim_apply(&s->model.opt, wv, b->acc, 0, total, s->model.version);
    srv_model_bump(&s->model);
    s->stats.rounds++;
    uint64_t now = srv_now_ms();
    PS_LOG(PS_LOG_DEBUG, "round %llu closed with %u pushes in %llu ms", (unsigned long long)round, b->count,
           (unsigned long long)(now - b->round_start_ms));
    b->round_start_ms = now;
    b->count = 0;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_ARRIVAL)
        memset(b->acc, 0, total * sizeof(float));
    srv_answer_parked(s);
}

static int bsp_push(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                    char *err, size_t errlen)
{
    int rc = check_range(s, off, n, err, errlen);
    if (rc != 0)
        return rc;
    uint64_t round = s->model.version;
    if (base < round) {
        snprintf(err, errlen, "push for round %llu, but round %llu is open; dropped", (unsigned long long)base,
                 (unsigned long long)round);
        return PS_ESTALE;
    }
    if (base > round) {
        snprintf(err, errlen, "base version %llu is ahead of the model (%llu)", (unsigned long long)base,
                 (unsigned long long)round);
        return PS_EBAD_FIELD;
    }
    if (w->round == round && w->round_fin) {
        snprintf(err, errlen, "shard %u already pushed for round %llu", w->shard, (unsigned long long)round);
        return PS_EDUPLICATE;
    }
    bsp_state *b = bsp_get(s, err, errlen);
    if (!b)
        return PS_ENOMEM;
    size_t total = s->model.layout.total;
    if (s->cfg.bsp_sum_order == PS_BSP_SUM_SHARD) {
        if (!w->slot && !(w->slot = malloc(total * sizeof(float)))) {
            snprintf(err, errlen, "out of memory for shard %u's gradient", w->shard);
            return PS_ENOMEM;
        }
        if (w->round != round)
            memset(w->slot, 0, total * sizeof(float));
        memcpy(w->slot + off, g, n * sizeof(float));
    } else {
        for (uint64_t j = 0; j < n; j++)
            b->acc[off + j] += g[j];
    }
    w->round = round;
    w->round_fin = 0;
    if (fin) {
        w->round_fin = 1;
        b->count++;
        bsp_try_close(s);
    }
    return 0;
}

static void bsp_membership(psd *s, srv_worker *w)
{
    bsp_try_close(s);
}

static void bsp_destroy(psd *s)
{
    bsp_state *b = s->policy_state;
    if (b) {
        free(b->acc);
        free(b);
        s->policy_state = NULL;
    }
}

const srv_policy_ops srv_policy_bsp = {
    .name = "bsp",
    .push = bsp_push,
    .worker_left = bsp_membership,
    .worker_joined = bsp_membership,
    .destroy = bsp_destroy,
};
