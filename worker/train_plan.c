/* train_plan.c - psworker in a BSP job by psd's plan: psd, not the worker,
 * says which samples of the whole training set each round trains and when
 * the job is done (proto/PROTOCOL.md section 8); the worker draws every
 * epoch's order from the job's seed as every other worker does. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker.h"

int pw_train_planned(wopts *o, psc_client *pc, ps_model *model, const ps_dataset *all, const ps_dataset *test,
                     pw_result *res)
{
    uint64_t epochs, samples, gbatch, seed;
    psc_plan(pc, &epochs, &samples, &gbatch, &seed);
    if (samples != all->n) {
        fprintf(stderr, "psworker: psd runs a plan over %" PRIu64 " training samples, this worker holds %zu (another "
                        "--dataset or --limit than the first worker's?)\n",
                samples, all->n);
        return 1;
    }
    o->epochs = (int)epochs;
    PS_LOG(PS_LOG_INFO, "shard %d/%d: psd's plan: %" PRIu64 " epochs of %" PRIu64 " samples, %" PRIu64
                        " a round (seed %" PRIu64 ")",
           o->shard, o->nshards, epochs, samples, gbatch, seed);
    size_t np = ps_model_nparams(model);
    size_t *perm = malloc(all->n * sizeof *perm);
    float *bx = malloc((size_t)gbatch * (size_t)all->dim * sizeof *bx);
    uint8_t *by = malloc((size_t)gbatch);
    float *gacc = malloc(np * sizeof *gacc);
    int status = 1;
    if (!perm || !bx || !by || !gacc) {
        fprintf(stderr, "psworker: out of memory\n");
        goto out;
    }
    double job_t0 = pw_now(), t0 = job_t0, loss_sum = 0, comm_s = 0, last_draw = 0;
    size_t done = 0, steps = 0; /* samples and steps in this epoch */
    uint64_t per_epoch = (samples + gbatch - 1) / gbatch;
    uint64_t cur = 0;
    int in_epoch = 0;
    for (;;) {
        if (pw_stop_signal) {
            pw_progress_clear(o);
            status = pw_stop(pc, o->shard, o->nshards, (int)cur + 1, steps);
            goto out;
        }
        uint64_t e = 0, lo = 0, hi = 0;
        int fin = psc_plan_done(pc);
        if (!fin && !psc_plan_slice(pc, &e, &lo, &hi, NULL, NULL)) {
            fprintf(stderr, "psworker: psd runs a plan but gave this worker no part of round %" PRIu64 "\n",
                    psc_model_version(pc));
            goto out;
        }
        if (in_epoch && (fin || e != cur)) {
            if (pw_epoch_done(o, pc, model, test, (int)cur + 1, pw_now() - t0, loss_sum, done, comm_s, job_t0, 1,
                              res) != 0)
                goto out;
            in_epoch = 0;
            if (pw_stop_signal)
                continue; /* a stop signal during the report: no step more */
        }
        if (fin)
            break;
        if (!in_epoch) {
            if (o->no_shuffle)
                for (size_t i = 0; i < all->n; i++)
                    perm[i] = i;
            else
                ps_dataset_epoch_order(perm, all->n, seed, 0, e); /* the same on every worker */
            cur = e;
            in_epoch = 1;
            t0 = pw_now();
            loss_sum = comm_s = 0;
            done = steps = 0;
        }
        size_t cnt = (size_t)(hi - lo);
        float loss = 0;
        if (cnt) {
            ps_dataset_gather(all, perm + lo, cnt, bx, by);
            loss = ps_model_train_step_pieces(model, bx, by, cnt, gacc);
        } else {
            memset(ps_model_grads(model), 0, np * sizeof(float)); /* a round too small to share */
        }
        if (!isfinite(loss)) {
            pw_progress_clear(o);
            fprintf(stderr, "psworker: loss became %f in round %" PRIu64 "; lower the learning rate\n", (double)loss,
                    psc_model_version(pc));
            goto out;
        }
        loss_sum += (double)loss * (double)cnt;
        done += cnt;
        steps++;
        double tc = pw_now();
        if (o->progress && tc - last_draw >= 0.1) {
            /* the line the wait watcher extends while this round waits */
            last_draw = tc;
            uint64_t v0 = psc_model_version(pc);
            uint64_t at = v0 - cur * per_epoch < per_epoch ? v0 - cur * per_epoch : per_epoch;
            pw_progress_draw(o, (int)cur + 1, (size_t)at, (size_t)per_epoch, loss_sum / (double)(done ? done : 1),
                          tc - job_t0, res->samples + done, (size_t)v0, (size_t)(per_epoch * epochs));
        }
        pw_step_waits(o, 1);
        int prc = psc_pushpull(pc);
        pw_step_waits(o, 0);
        if (prc != 0) {
            pw_progress_clear(o);
            if (prc == PSC_EINTR && pw_stop_signal) { /* the signal ended the round's wait */
                status = pw_stop(pc, o->shard, o->nshards, (int)cur + 1, steps);
                goto out;
            }
            fprintf(stderr, "psworker: round %" PRIu64 ": %s\n", psc_model_version(pc), psc_errmsg(pc));
            goto out;
        }
        double now = pw_now();
        comm_s += now - tc;
        if (cnt && (prc = psc_progress(pc, (uint32_t)cur, (double)loss * (double)cnt, cnt)) != 0) {
            pw_progress_clear(o);
            if (prc == PSC_EINTR && pw_stop_signal) { /* the signal ended the report's wait */
                status = pw_stop(pc, o->shard, o->nshards, (int)cur + 1, steps);
                goto out;
            }
            fprintf(stderr, "psworker: epoch %d: reporting progress: %s\n", (int)cur + 1, psc_errmsg(pc));
            goto out;
        }
    }
    PS_LOG(PS_LOG_INFO, "shard %d/%d: psd says the plan is done at model version %" PRIu64, o->shard, o->nshards,
           psc_model_version(pc));
    status = 0;
out:
    free(perm);
    free(bx);
    free(by);
    free(gacc);
    return status;
}
