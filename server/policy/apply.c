/* apply.c - a push applied as it arrives (ASGD and SSP): staleness
 * scaling and DC-ASGD's correction into ASGD's scratch, then the update
 * engine; a fin chunk makes a new version and counts the pusher's clock.
 * Owns ASGD's state (srv_asgd_state, in psd.policy_state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "server/policy/apply.h"
#include "server/replog/replog.h"
#include "server/update/update.h"

/* A fin chunk's update is in: a new version, and the pusher's clock. */
static void step_done(psd *s, srv_worker *w)
{
    srv_model_bump(&s->model);
    w->clock++;
}

srv_asgd_state *srv_asgd_get(psd *s)
{
    if (!s->policy_state)
        s->policy_state = calloc(1, sizeof(srv_asgd_state));
    return s->policy_state;
}

srv_snap *srv_asgd_base(psd *s, const srv_worker *w)
{
    srv_asgd_state *a = s->policy_state;
    return a && w->shard < a->nbase ? a->base[w->shard] : NULL;
}

void srv_asgd_drop_base(psd *s, const srv_worker *w)
{
    srv_asgd_state *a = s->policy_state;
    if (a && w->shard < a->nbase) {
        srv_snap_unref(a->base[w->shard]);
        a->base[w->shard] = NULL;
    }
}

/* Applies p's gradient to its range now, as ASGD and SSP do; a fin chunk
 * completes the step and makes a new version. Staleness scaling and
 * DC-ASGD (asgd only, compensate) transform g into the scratch buffer
 * first. */
int srv_apply_now(psd *s, srv_worker *w, const srv_push *p, int compensate, char *err, size_t errlen)
{
    srv_model *m = &s->model;
    uint64_t off = p->off, n = p->n;
    const float *g = p->g;
    uint64_t stale = m->version - p->base;
    srv_snap *base = compensate ? srv_asgd_base(s, w) : NULL;
    int scale = compensate && s->cfg.staleness_scale && stale > 0;
    int dc = compensate && s->cfg.dc_lambda > 0 && base && stale > 0;
    if (scale || dc) {
        srv_asgd_state *a = srv_asgd_get(s);
        if (a && !a->scratch)
            a->scratch = malloc(m->layout.total * sizeof(float));
        float *t = a ? a->scratch : NULL;
        if (!t) {
            snprintf(err, errlen, "out of memory for a gradient scratch buffer");
            return PS_ENOMEM;
        }
        float k = scale ? 1.0f / (1.0f + (float)stale) : 1.0f;
        const float lam = (float)s->cfg.dc_lambda;
        for (uint64_t done = 0; done < n;) {
            size_t len;
            const float *wn = srv_model_at(m, off + done, n - done, &len);
            const float *gi = g + done;
            float *ti = t + off + done;
            if (dc) {
                /* g + lambda * g * g * (w_now - w_base): a first-order Taylor
                 * correction of the gradient for the updates it missed */
                size_t blen;
                const float *wb = srv_snap_at(base, off + done, n - done, &blen);
                for (size_t i = 0; i < len; i++)
                    ti[i] = k * (gi[i] + lam * gi[i] * gi[i] * (wn[i] - wb[i]));
            } else {
                for (size_t i = 0; i < len; i++)
                    ti[i] = k * gi[i];
            }
            done += len;
        }
        g = t + off;
    }
    /* scaling by k <= 1 keeps the push's bound; DC-ASGD's correction has none */
    srv_grad gr = {.g = g, .has_gmax = p->has_gmax && !dc, .gmax = p->gmax};
    /* buffers take the push's own values, unscaled (update.h) */
    gr.raw = p->g;
    gr.from_first = w && w->shard == 0;
    gr.as_sent = g == p->g; /* neither scaled nor corrected: a follower can apply it as it came */
    gr.conn = p->conn;
    srv_update_tag tag = {.w = w, .fin = p->fin};
    int rc = srv_update_apply(s, &gr, off, n, p->may_defer ? &tag : NULL);
    if (rc == SRV_PENDING)
        return SRV_PENDING;
    if (rc == PS_ENONFINITE) {
        snprintf(err, errlen, "applying this gradient to [%llu, %llu) would make parameters infinite or NaN; "
                 "refused, the model unchanged", (unsigned long long)off, (unsigned long long)(off + n));
        return rc;
    }
    if (rc != 0) {
        snprintf(err, errlen, "out of memory for a copy of a model block");
        return PS_ENOMEM;
    }
    if (p->fin)
        step_done(s, w);
    /* its values' mark (when it did not go as its gradient) and the version
     * into the replication log before the caller records the push's id: a
     * follower that holds the id holds the push */
    srv_replog_flush(s);
    return p->fin ? SRV_WAKE : 0;
}

/* An update a push started off the loop is in (asgd, ssp). */
int srv_step_applied(psd *s, const srv_update_tag *tag)
{
    if (!tag->fin)
        return 0;
    step_done(s, tag->w);
    return SRV_WAKE;
}

int srv_apply_table(psd *s, srv_worker *w, const srv_tpush *p, char *err, size_t errlen)
{
    (void)w;
    return srv_update_rows(s, p->ti, p->keys, p->n, p->g, p->hint, &p->tag, p->pkeys, p->npk, err, errlen);
}

int srv_apply_table_checks(const psd *s)
{
    return srv_update_rows_checked(s);
}

int srv_apply_check(const ps_config *c, int clocks, char *err, size_t errlen)
{
    if (c->local_steps > 0 && !(c->elastic_alpha > 0)) {
        snprintf(err, errlen, "local_steps averages a round of models: it needs mode = bsp");
        return PS_EINVAL;
    }
    if (clocks && c->elastic_alpha > 0 && !(c->local_steps > 0)) {
        snprintf(err, errlen, "elastic averaging is asynchronous: it needs mode = asgd");
        return PS_EINVAL;
    }
    if (clocks && c->hogwild) {
        snprintf(err, errlen, "hogwild updates the model without rounds or clocks: it needs mode = asgd");
        return PS_EINVAL;
    }
    return 0;
}
