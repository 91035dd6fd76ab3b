/* job.c - libpsclient: the job: progress and epoch reports to every psd, the live shards, and a
 * BSP job's plan. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

/* Every psd keeps the workers' reports, so each one's status shows the
 * job's progress. */
int psc_report(psc_client *c, uint32_t epoch, double loss, double acc, double test_loss, uint64_t samples,
               double rate)
{
    int rc = psc__ready(c, "psc_report");
    for (uint32_t i = 0; rc == 0 && i < c->nlinks; i++) {
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_REPORT);
        m.has = PS_F_EPOCH | PS_F_LOSS | PS_F_SAMPLES | PS_F_RATE;
        m.epoch = epoch;
        m.loss = loss;
        m.samples = samples;
        m.rate = rate;
        if (acc >= 0) {
            m.has |= PS_F_ACC | PS_F_TLOSS;
            m.acc = acc;
            m.tloss = test_loss;
        }
        rc = ps_conn_call(&c->links[i].cl, &m, &r, c->timeout_ms);
        if (rc != 0) {
            psc__lfail(c, i, rc);
            if (c->auto_reconnect && psc__recoverable(c, rc) && (rc = psc__reconnect(c, rc)) == 0)
                i--; /* and report to it again */
            else
                rc = psc__public_code(c, rc);
        }
    }
    return rc;
}

int psc_progress(psc_client *c, uint32_t epoch, double loss_sum, uint64_t n)
{
    if (!isfinite(loss_sum))
        return psc__fail(c, PSC_EINVAL, "psc_progress: the loss sum is %g, not a finite number", loss_sum);
    c->prog_loss += loss_sum;
    c->prog_n += n;
    c->prog_total += n;
    int64_t now = psc__mono_ms();
    if (!c->prog_last_ms)
        c->prog_last_ms = now; /* the first interval starts with the first step told of */
    if (!c->report_ms || now - c->prog_last_ms < c->report_ms || !c->prog_n)
        return 0;
    int rc = psc_wait(c); /* a step in flight shares the connection */
    if (rc != 0)
        return rc;
    double loss = c->prog_loss / (double)c->prog_n;
    double rate = (double)c->prog_n * 1000.0 / (double)(now - c->prog_last_ms);
    c->prog_last_ms = now;
    c->prog_loss = 0;
    c->prog_n = 0;
    return psc_report(c, epoch, loss, -1, 0, c->prog_total, rate);
}

/* From the first psd: every psd sees the same workers come and go. */
int psc_live_shards(psc_client *c, uint32_t *rank, uint32_t *count)
{
    int rc = psc__ready(c, "psc_live_shards");
    if (rc != 0)
        return rc;
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_STATUS);
    rc = ps_conn_call(&c->links[0].cl, &m, &r, c->timeout_ms);
    if (rc != 0)
        return psc__public_code(c, psc__lfail(c, 0, rc));
    const msgpack_object *ws = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "workers") : NULL;
    if (!ws || ws->type != MSGPACK_OBJECT_ARRAY)
        return psc__fail(c, PSC_EMALFORMED, "psd's status has no list of workers");
    uint32_t lost = 0, lost_below = 0;
    for (uint32_t i = 0; i < ws->via.array.size; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        const msgpack_object *sh = ps_map_get(w, "shard"), *st = ps_map_get(w, "state");
        if (!sh || sh->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !st || st->type != MSGPACK_OBJECT_STR)
            return psc__fail(c, PSC_EMALFORMED, "psd's status lists a worker without shard or state");
        if (sh->via.u64 >= c->nshards || sh->via.u64 == c->shard || st->via.str.size != 4 ||
            memcmp(st->via.str.ptr, "lost", 4) != 0)
            continue;
        lost++; /* psd keeps one entry per shard */
        lost_below += sh->via.u64 < c->shard;
    }
    *count = c->nshards - lost;
    *rank = c->shard - lost_below;
    return 0;
}

int psc_plan_set(psc_client *c, uint64_t epochs, uint64_t samples, uint64_t batch, uint64_t seed)
{
    if (c->connected || c->closed)
        return psc__fail(c, PSC_ESTATE, "psc_plan_set: only before psc_connect");
    if (epochs < 1 || epochs > PS_PLAN_EPOCHS_MAX || samples < 1 || samples > PS_PLAN_SAMPLES_MAX || batch < 1 ||
        batch > samples)
        return psc__fail(c, PSC_EINVAL, "psc_plan_set: need 1 <= epochs <= 2^20, 1 <= samples <= 2^40 and 1 <= batch <= "
                                   "samples (got %llu, %llu, %llu)",
                    (unsigned long long)epochs, (unsigned long long)samples, (unsigned long long)batch);
    c->plan = (ps_plan){.epochs = epochs, .samples = samples, .batch = batch, .seed = seed};
    c->want_plan = 1;
    return 0;
}

/* The plan and the slices are the first psd's: with a model split over
 * several, each counts the same rounds. */
int psc_plan(const psc_client *c, uint64_t *epochs, uint64_t *samples, uint64_t *batch, uint64_t *seed)
{
    if (!c->links || !c->links[0].has_plan)
        return 0;
    const ps_plan *p = &c->links[0].plan;
    if (epochs)
        *epochs = p->epochs;
    if (samples)
        *samples = p->samples;
    if (batch)
        *batch = p->batch;
    if (seed)
        *seed = p->seed;
    return 1;
}

int psc_plan_slice(const psc_client *c, uint64_t *epoch, uint64_t *lo, uint64_t *hi, uint32_t *rank,
                   uint32_t *count)
{
    if (!c->links || !c->links[0].has_plan || !c->links[0].cl.has_slice)
        return 0;
    const ps_slice *s = &c->links[0].cl.slice;
    if (epoch)
        *epoch = s->epoch;
    if (lo)
        *lo = s->lo;
    if (hi)
        *hi = s->hi;
    if (rank)
        *rank = s->rank;
    if (count)
        *count = s->count;
    return 1;
}

int psc_plan_done(const psc_client *c)
{
    return c->links && c->links[0].has_plan && c->links[0].cl.done;
}
