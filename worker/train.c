/* train.c - psworker's run: loads shard K of M of the data set, builds the
 * model whose tensors are the layout libpsclient sends psd, connects, and
 * trains epoch by epoch with a push-and-pull per batch (or hands a job by
 * psd's plan to train_plan.c); takes over the data of workers psd declared
 * lost (elastic data), and with --pipeline computes the next gradient while
 * the last one travels. Owns the job's data, model and buffers. */
#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "layer.h"
#include "worker.h"

/* One run's state. */
typedef struct job {
    wopts *o;
    psc_client *pc;
    ps_dataset all, train, test; /* all: the whole training set, kept for psd's plan */
    ps_model *model;
    size_t np;                   /* the model's parameters */
    size_t total_n;              /* samples in the whole training set */
    int bsp, planned;
    int averaging;               /* local SGD or elastic averaging: our own SGD steps,
                                  * psc_local_step exchanges the model */
    float *keep;                 /* averaging: our model while psd's is evaluated */
    float *vel;                  /* averaging with --momentum: our SGD's velocity */
    int synced;                  /* local SGD: the last step ended a round (our model is the mean) */
    /* --snapshots: copies of the model for time to accuracy, evaluated after training */
    float *snap;                 /* nsnap copies of np values each, room for maxsnap */
    struct pw_snap {
        int epoch;
        size_t step, steps;      /* steps done in the epoch, in the run */
        uint64_t samples;        /* samples this worker trained in the run */
        double t;                /* training seconds so far */
    } *smeta;
    size_t nsnap, maxsnap;
    /* the unplanned loop's */
    size_t *perm;                /* this epoch's order of train */
    float *bx, *gacc;            /* a batch's inputs; a large batch's gradient in pieces */
    uint8_t *by;                 /* its labels */
    size_t batch;                /* samples per step */
    int part, parts;             /* the slice of the data held */
    size_t per_shard, steps;     /* samples and steps per epoch */
    /* --pipeline: two vectors of each, of our own, alternating */
    float *pbuf[2], *gbuf[2];
    int cur, inflight;
    uint64_t pver[2];            /* the model version each of pbuf holds */
    pw_result res;
} job;

/* Loads the data, makes the model and its layout, connects to psd (which
 * may give the model its values) and sets up --pipeline's vectors. Returns
 * -1 to go on, else the exit status (1, or 128 + a stop signal). */
static int job_setup(job *j)
{
    wopts *o = j->o;
    psc_client *pc = j->pc;
    char err[1024];
    if (ps_dataset_load(o->data_dir, o->dataset, PS_SPLIT_TRAIN, o->limit, &j->all, err, sizeof err) != 0 ||
        ((o->eval || o->snapshots) && ps_dataset_load(o->data_dir, o->dataset, PS_SPLIT_TEST, o->test_limit, &j->test, err, sizeof err) !=
                        0) ||
        ps_dataset_shard(&j->all, o->shard, o->nshards, &j->train, err, sizeof err) != 0 ||
        ps_model_create_chw(o->model, 1, j->all.rows, j->all.cols, j->all.n_classes, o->batch, &j->model, err,
                            sizeof err) != 0) {
        fprintf(stderr, "psworker: %s\n", err);
        return 1;
    }
    /* every worker draws its own dropout masks */
    ps_model_reseed(j->model, o->seed * 0x9e3779b97f4a7c15ULL + (uint64_t)o->shard + 1);
    /* the whole training set stays until psd has said whether it runs the
     * job by a plan (which hands out samples from all of it) */
    if (!o->no_plan) {
        uint64_t gb = (uint64_t)o->batch * (uint64_t)o->nshards;
        if (psc_plan_set(pc, (uint64_t)o->epochs, j->all.n, gb < j->all.n ? gb : j->all.n, o->seed) != 0) {
            fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
            return 1;
        }
    }
    /* the model's tensors are the layout; the library's vectors are the
     * model's parameters and gradients (in the segment psd maps, when psd
     * is on this machine), seeded values in them as the initial model */
    ps_layout lay;
    if (ps_model_layout(j->model, &lay) != 0) {
        fprintf(stderr, "psworker: the model's layout does not fit the protocol's limits\n");
        return 1;
    }
    for (uint32_t i = 0; i < lay.ntensors; i++) {
        uint64_t dims[PS_DIMS_MAX];
        for (uint32_t k = 0; k < lay.t[i].ndim; k++)
            dims[k] = lay.t[i].dims[k];
        if (psc_add_tensor(pc, lay.t[i].name, lay.t[i].ndim, dims) != 0) {
            fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
            return 1;
        }
    }
    j->np = ps_model_nparams(j->model);
    j->total_n = j->all.n;
    ps_model_init_params(j->model, o->seed);
    float *lib_params = psc_params(pc), *lib_grads = psc_grads(pc);
    if (!lib_params || !lib_grads) {
        fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
        return 1;
    }
    memcpy(lib_params, ps_model_params(j->model), j->np * sizeof(float));
    ps_model_bind_params(j->model, lib_params);
    ps_model_bind_grads(j->model, lib_grads);
    pw_stop_install(pc);
    int crc = psc_connect(pc);
    if (crc != 0 && !(crc == PSC_EINTR && pw_stop_signal)) {
        fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
        return 1;
    }
    if (pw_stop_signal)
        return pw_stop(pc, o->shard, o->nshards, 0, 0);
    j->bsp = strcmp(psc_mode(pc), "bsp") == 0;
    double alpha;
    uint32_t tau;
    uint32_t h = psc_local_steps(pc);
    j->averaging = h > 0 || psc_elastic(pc, &alpha, &tau);
    /* a job averaging models counts its own epochs: its rounds are of H
     * local steps, not the plan's global batches */
    j->planned = j->bsp && !j->averaging && psc_plan(pc, NULL, NULL, NULL, NULL);
    if (j->planned && (o->snapshots || o->max_seconds > 0)) {
        fprintf(stderr, "psworker: %s: this bsp job runs by psd's plan, whose rounds the worker does not count; add "
                        "--no-plan\n",
                o->snapshots ? "--snapshots" : "--max-seconds");
        return 1;
    }
    if (o->snapshots) {
        /* a copy at each point of every epoch, and one more at a stop or
         * a round that comes after the last point */
        j->maxsnap = (size_t)o->snapshots * (size_t)o->epochs + 1;
        j->snap = malloc(j->maxsnap * j->np * sizeof(float));
        j->smeta = calloc(j->maxsnap, sizeof *j->smeta);
        if (!j->snap || !j->smeta) {
            fprintf(stderr, "psworker: out of memory for %zu copies of the model (--snapshots)\n", j->maxsnap);
            return 1;
        }
    }
    if (j->averaging) {
        if (o->pipeline == 1) {
            fprintf(stderr, "psworker: --pipeline on overlaps pushes of gradients; psd runs %s, whose exchanges "
                            "are of models: leave --pipeline off\n",
                    h ? "local SGD" : "elastic averaging");
            return 1;
        }
        o->pipeline = 0;
        if ((o->eval && !(j->keep = ps_falloc(j->np))) || (o->momentum > 0 && !(j->vel = ps_falloc(j->np)))) {
            fprintf(stderr, "psworker: out of memory\n");
            return 1;
        }
        if (j->vel)
            memset(j->vel, 0, j->np * sizeof(float));
        if (h)
            PS_LOG(PS_LOG_INFO,
                   "shard %d/%d: local SGD: %u steps of our own SGD at lr %g, momentum %g between two rounds",
                   o->shard, o->nshards, h, o->lr, o->momentum);
        else
            PS_LOG(PS_LOG_INFO,
                   "shard %d/%d: elastic averaging: alpha %g every %u steps of our own SGD at lr %g, momentum %g",
                   o->shard, o->nshards, alpha, tau, o->lr, o->momentum);
    }
    int hogwild = psc_hogwild(pc);
    if (hogwild) {
        /* Hogwild!: the model computes on psd's model itself, which its
         * steps (and the other workers') update in place: nothing to copy,
         * and no round trip to overlap */
        float *hw = psc_hogwild_params(pc);
        if (psc_bind(pc, hw, lib_grads) == 0)
            ps_model_bind_params(j->model, hw);
        if (o->pipeline == 1)
            PS_LOG(PS_LOG_INFO, "--pipeline on: a Hogwild! step sends nothing; not pipelined");
    }
    if (!hogwild &&
        (o->pipeline == 1 || (o->pipeline == -1 && !j->bsp && j->np <= (1u << 20) && psc_servers(pc) == 1))) {
        if (j->bsp || j->np > (1u << 20) || psc_servers(pc) != 1) {
            fprintf(stderr, "psworker: --pipeline on needs asgd or ssp, a model of at most 2^20 parameters and one "
                            "psd\n");
            return 1;
        }
        /* two vectors of each, of our own: the model computes on one pair
         * while the library's thread sends the other (and psd's answer
         * lands in it); never the segment, which the library then fills */
        for (int i = 0; i < 2; i++) {
            j->pbuf[i] = ps_falloc(j->np);
            j->gbuf[i] = ps_falloc(j->np);
            if (!j->pbuf[i] || !j->gbuf[i]) {
                fprintf(stderr, "psworker: out of memory\n");
                return 1;
            }
            memcpy(j->pbuf[i], lib_params, j->np * sizeof(float));
        }
        ps_model_bind_params(j->model, j->pbuf[0]);
        ps_model_bind_grads(j->model, j->gbuf[0]);
    }
    char desc[256];
    ps_model_describe(j->model, desc, sizeof desc);
    PS_LOG(PS_LOG_INFO, "shard %d/%d: %s, %zu training samples, %s at %s, mode %s, model version %" PRIu64
                        ", OpenBLAS %s kernels",
           o->shard, o->nshards, desc, j->train.n, o->dataset, pw_server(o), psc_mode(pc), psc_model_version(pc),
           openblas_get_corename());
    return -1;
}

/* Elastic data: at the start of an epoch, asks psd which shards are still
 * in the job and, when some were declared lost, takes slice rank of count
 * of the training set instead of shard K of M, so the survivors still
 * cover all of it. j->part and j->parts are the slice held now; on a
 * change the set is loaded again and cut anew (train and perm follow).
 * Returns 0 (also when psd cannot tell: the slice stays), or -1 with a
 * message in err. */
static int reshard(job *j, char *err, size_t errlen)
{
    const wopts *o = j->o;
    uint32_t rank, count;
    if (psc_live_shards(j->pc, &rank, &count) != 0) {
        PS_LOG(PS_LOG_DEBUG, "cannot ask psd for the live shards (%s); keeping part %d of %d",
               psc_errmsg(j->pc), j->part, j->parts);
        return 0;
    }
    if ((int)rank == j->part && (int)count == j->parts)
        return 0;
    ps_dataset all = {0}, slice = {0};
    if (ps_dataset_load(o->data_dir, o->dataset, PS_SPLIT_TRAIN, o->limit, &all, err, errlen) != 0)
        return -1;
    int rc = ps_dataset_shard(&all, (int)rank, (int)count, &slice, err, errlen);
    ps_dataset_free(&all);
    if (rc != 0)
        return -1;
    size_t *p = realloc(j->perm, slice.n * sizeof *p);
    if (!p) {
        ps_dataset_free(&slice);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    j->perm = p;
    PS_LOG(PS_LOG_INFO, "shard %d/%d: %u of %d shards are live: training on part %u of %u of the data (%zu samples, "
                        "was part %d of %d)",
           o->shard, o->nshards, count, o->nshards, rank, count, slice.n, j->part, j->parts);
    ps_dataset_free(&j->train);
    j->train = slice;
    j->part = (int)rank;
    j->parts = (int)count;
    return 0;
}

/* In BSP every worker must take the same number of steps per epoch, or the
 * last rounds would wait for pushes that never come: derive it from the
 * smallest shard (the whole set divided by the parts, rounded down). */
static void count_steps(job *j)
{
    j->per_shard = j->bsp ? j->total_n / (size_t)j->parts : j->train.n;
    if (j->per_shard == 0)
        j->per_shard = j->train.n;
    j->steps = (j->per_shard + j->batch - 1) / j->batch;
}

/* After the live shards changed: in bsp the same global batch (B x M) and
 * rounds per epoch as the job started with, the maths of the undisturbed
 * job. Returns 0 or -1 (out of memory, said). */
static int rebatch(job *j)
{
    const wopts *o = j->o;
    count_steps(j);
    if (!j->bsp)
        return 0;
    j->batch = ((size_t)o->batch * (size_t)o->nshards + (size_t)j->parts - 1) / (size_t)j->parts;
    float *nx = realloc(j->bx, j->batch * (size_t)j->train.dim * sizeof *nx);
    if (nx)
        j->bx = nx;
    uint8_t *ny = realloc(j->by, j->batch);
    if (ny)
        j->by = ny;
    if (!j->gacc && j->batch > (size_t)o->batch)
        j->gacc = malloc(j->np * sizeof *j->gacc);
    if (!nx || !ny || (j->batch > (size_t)o->batch && !j->gacc)) {
        fprintf(stderr, "psworker: out of memory\n");
        return -1;
    }
    PS_LOG(PS_LOG_INFO, "shard %d/%d: %zu samples per step, so that rounds still average %d x %d", o->shard,
           o->nshards, j->batch, o->nshards, o->batch);
    count_steps(j);
    return 0;
}

/* The step's exchange with psd: the gradient in the model's vector goes,
 * psd's new parameters come. Pipelined: takes the last step's parameters,
 * sends this gradient (the answer lands in the vectors the model just
 * used) and lets the model compute the next one on the fresh ones. Returns
 * 0 or a libpsclient error. */
static int exchange(job *j)
{
    psc_client *pc = j->pc;
    int rc;
    if (j->averaging) {
        /* our own SGD step on our copy of the model; every H-th (tau-th)
         * the library exchanges it with psd */
        ps_model_sgd_step(j->model, j->vel, (float)j->o->lr, (float)j->o->momentum);
        pw_step_waits(j->o, 1);
        rc = psc_local_step(pc);
        pw_step_waits(j->o, 0);
        j->synced = rc == 1 && psc_local_steps(pc) > 0;
        return rc < 0 ? rc : 0;
    }
    pw_step_waits(j->o, 1);
    if (!j->pbuf[0]) {
        rc = psc_pushpull(pc);
        pw_step_waits(j->o, 0);
        return rc;
    }
    rc = j->inflight ? psc_wait(pc) : 0;
    pw_step_waits(j->o, 0);
    int cur = j->cur;
    if (j->inflight) {
        j->pver[cur ^ 1] = psc_model_version(pc);
    } else {
        memcpy(j->pbuf[cur ^ 1], j->pbuf[cur], j->np * sizeof(float));
        j->pver[cur] = j->pver[cur ^ 1] = psc_model_version(pc);
    }
    /* the gradient's base: the version it was computed on */
    if (rc == 0 && (rc = psc_set_base(pc, j->pver[cur])) == 0 && (rc = psc_bind(pc, j->pbuf[cur], j->gbuf[cur])) == 0 &&
        (rc = psc_pushpull_start(pc)) == 0) {
        j->inflight = 1;
        j->cur ^= 1;
        ps_model_bind_params(j->model, j->pbuf[j->cur]);
        ps_model_bind_grads(j->model, j->gbuf[j->cur]);
    }
    return rc;
}

/* The pipelined step in flight, if any, comes back, and the model takes
 * the newest parameters (for the evaluation). Returns 0 or an error. */
static int exchange_finish(job *j)
{
    if (!j->inflight)
        return 0;
    int rc = psc_wait(j->pc);
    j->inflight = 0;
    j->cur ^= 1;
    ps_model_bind_params(j->model, j->pbuf[j->cur]);
    ps_model_bind_grads(j->model, j->gbuf[j->cur]);
    return rc;
}

/* A pull of psd's model at an epoch's end failed with rc: a stop signal
 * that ended its wait stops the worker as one during a step does (exit
 * 128 + signal); anything else is an error (1). */
static int pull_failed(job *j, int rc, int epoch, size_t step)
{
    pw_progress_clear(j->o);
    if (rc == PSC_EINTR && pw_stop_signal)
        return pw_stop(j->pc, j->o->shard, j->o->nshards, epoch, step);
    fprintf(stderr, "psworker: epoch %d: %s\n", epoch, psc_errmsg(j->pc));
    return 1;
}

/* --snapshots: keeps a copy of the model's parameters as they are now,
 * with where the run is and its training time t. The caller makes sure
 * there is room (maxsnap). */
static void snapshot(job *j, int epoch, size_t step, size_t steps, uint64_t samples, double t)
{
    if (j->nsnap >= j->maxsnap)
        return;
    memcpy(j->snap + j->nsnap * j->np, ps_model_params(j->model), j->np * sizeof(float));
    j->smeta[j->nsnap] = (struct pw_snap){epoch, step, steps, samples, t};
    j->nsnap++;
}

/* After training: evaluates every copy --snapshots kept on the test set,
 * one JSON line each on stdout, and binds the model to its own parameters
 * again. */
static void snapshots_report(job *j)
{
    float *own = ps_model_params(j->model);
    for (size_t i = 0; i < j->nsnap; i++) {
        const struct pw_snap *m = &j->smeta[i];
        double loss = 0, acc = 0;
        ps_model_bind_params(j->model, j->snap + i * j->np);
        ps_model_evaluate(j->model, j->test.x, j->test.y, j->test.n, &loss, &acc);
        printf("{\"snapshot\": %zu, \"epoch\": %d, \"step\": %zu, \"steps\": %zu, \"samples\": %" PRIu64
               ", \"train_seconds\": %.4f, \"test_accuracy\": %.6f, \"test_loss\": %.6f}\n",
               i + 1, m->epoch, m->step, m->steps, m->samples, m->t, acc, loss);
    }
    fflush(stdout);
    ps_model_bind_params(j->model, own);
}

/* The job counted by the worker: --no-plan in bsp, and asgd and ssp.
 * Returns 0, 1 (a failure, said) or 128 + a stop signal. */
static int train_epochs(job *j, double job_t0)
{
    wopts *o = j->o;
    psc_client *pc = j->pc;
    char err[1024];
    double last_draw = 0;
    j->part = o->shard;
    j->parts = o->nshards;
    j->batch = (size_t)o->batch;
    count_steps(j);
    j->perm = malloc(j->train.n * sizeof *j->perm);
    j->bx = malloc((size_t)o->batch * (size_t)j->train.dim * sizeof *j->bx);
    j->by = malloc((size_t)o->batch);
    if (!j->perm || !j->bx || !j->by) {
        fprintf(stderr, "psworker: out of memory\n");
        return 1;
    }
    /* --snapshots: the next point (steps into the epoch) and whether a
     * local-SGD copy waits for its round; --max-seconds: stopped early */
    int stopped = 0, snap_due = 0;
    size_t run_steps = 0;
    for (int epoch = 1; epoch <= o->epochs && !stopped; epoch++) {
        /* a stop signal that ended the last epoch's report: no call to psd
         * but the bye (the next call would open the connections anew, and
         * try for reconnect_s when psd stops too) */
        if (pw_stop_signal)
            return pw_stop(pc, o->shard, o->nshards, epoch, 0);
        if (epoch > 1 && !o->fixed_shard && o->nshards > 1) {
            int was = j->parts;
            if (reshard(j, err, sizeof err) != 0) {
                fprintf(stderr, "psworker: %s\n", err);
                return 1;
            }
            if (j->parts != was && rebatch(j) != 0)
                return 1;
        }
        if (o->no_shuffle)
            for (size_t i = 0; i < j->train.n; i++)
                j->perm[i] = i;
        else
            ps_dataset_epoch_order(j->perm, j->train.n, o->seed, (uint32_t)o->shard, (uint64_t)epoch);
        double t0 = pw_now(), loss_sum = 0, comm_s = 0;
        size_t steps = j->steps;
        if (o->progress) /* drawn before the first step, which may wait for psd */
            pw_progress_draw(o, epoch, 0, steps, NAN, t0 - job_t0, j->res.samples, (size_t)(epoch - 1) * steps,
                             steps * (size_t)o->epochs);
        size_t done = 0, point = 1, st_done = 0;
        for (size_t st = 0; st < steps; st++) {
            if (pw_stop_signal) {
                pw_progress_clear(o);
                return pw_stop(pc, o->shard, o->nshards, epoch, st);
            }
            size_t start = st * j->batch;
            size_t cnt = j->per_shard - start < j->batch ? j->per_shard - start : j->batch;
            /* the shard may hold one sample more than per_shard: it waits for
             * the next epoch's order */
            ps_dataset_gather(&j->train, j->perm + start, cnt, j->bx, j->by);
            float loss = ps_model_train_step_pieces(j->model, j->bx, j->by, cnt, j->gacc);
            if (!isfinite(loss)) {
                pw_progress_clear(o);
                fprintf(stderr, "psworker: loss became %f at epoch %d step %zu; lower the learning rate\n",
                        (double)loss, epoch, st);
                return 1;
            }
            loss_sum += loss * (double)cnt;
            done += cnt;
            double tc = pw_now();
            int xrc = exchange(j);
            if (xrc != 0) {
                pw_progress_clear(o);
                if (xrc == PSC_EINTR && pw_stop_signal) /* the signal ended the step's wait */
                    return pw_stop(pc, o->shard, o->nshards, epoch, st);
                fprintf(stderr, "psworker: epoch %d step %zu: %s\n", epoch, st, psc_errmsg(pc));
                return 1;
            }
            double now = pw_now();
            comm_s += now - tc;
            run_steps++;
            st_done = st + 1;
            if (o->snapshots) {
                /* point k of N: after ceil(k x steps / N) steps */
                while (point <= (size_t)o->snapshots && st + 1 >= (point * steps + (size_t)o->snapshots - 1) /
                                                                       (size_t)o->snapshots) {
                    point++;
                    snap_due = 1;
                }
                /* local SGD: the copy is the workers' mean right after a round */
                if (snap_due && (!psc_local_steps(pc) || j->synced)) {
                    snapshot(j, epoch, st + 1, run_steps, j->res.samples + done, j->res.train_time + (now - t0));
                    snap_due = 0;
                    double after = pw_now(); /* the copy's time is not training */
                    t0 += after - now;
                    now = after;
                }
            }
            if (o->max_seconds > 0 && j->res.train_time + (now - t0) >= o->max_seconds) {
                stopped = 1;
                PS_LOG(PS_LOG_INFO, "shard %d/%d: --max-seconds %g reached at epoch %d step %zu", o->shard,
                       o->nshards, o->max_seconds, epoch, st + 1);
            }
            /* psd hears of the training every report_s seconds
             * ($PSD_REPORT_INTERVAL, default 1), not only at epoch ends */
            int prc = psc_progress(pc, (uint32_t)(epoch - 1), (double)loss * (double)cnt, cnt);
            if (prc != 0) {
                pw_progress_clear(o);
                if (prc == PSC_EINTR && pw_stop_signal) /* the signal ended the report's wait */
                    return pw_stop(pc, o->shard, o->nshards, epoch, st + 1);
                fprintf(stderr, "psworker: epoch %d: reporting progress: %s\n", epoch, psc_errmsg(pc));
                return 1;
            }
            if (o->progress && (now - last_draw >= 0.1 || st + 1 == steps)) {
                last_draw = now;
                pw_progress_draw(o, epoch, st + 1, steps, loss_sum / (double)done, now - job_t0,
                                 j->res.samples + done, (size_t)(epoch - 1) * steps + st + 1,
                                 steps * (size_t)o->epochs);
            }
            if (stopped)
                break;
        }
        double tf = pw_now();
        int rc = exchange_finish(j); /* the last step's parameters, for the evaluation */
        comm_s += pw_now() - tf;
        if (rc == PSC_EINTR && pw_stop_signal) { /* the signal ended the wait */
            pw_progress_clear(o);
            return pw_stop(pc, o->shard, o->nshards, epoch, st_done);
        }
        if (rc != 0) {
            pw_progress_clear(o);
            fprintf(stderr, "psworker: epoch %d: %s\n", epoch, psc_errmsg(pc));
            return 1;
        }
        /* averaging models: the job's model is psd's (the workers' mean, the
         * centre), which the epoch's figures are of; ours comes back after */
        uint64_t reconnects = psc_reconnects(pc);
        int psd_model = j->averaging && o->eval && j->keep;
        if (psd_model) {
            memcpy(j->keep, ps_model_params(j->model), j->np * sizeof(float));
            if ((rc = psc_pull(pc)) != 0)
                return pull_failed(j, rc, epoch, st_done);
        }
        double dt = pw_now() - t0;
        /* the run's end: a last copy unless one was just taken; averaging
         * models, psd's (pulled above with --eval, else here) */
        int last = stopped || epoch == o->epochs;
        if (last && o->snapshots &&
            (j->averaging || snap_due || j->nsnap == 0 || j->smeta[j->nsnap - 1].steps != run_steps)) {
            if (j->averaging && !psd_model && (rc = psc_pull(pc)) != 0)
                return pull_failed(j, rc, epoch, st_done);
            if (j->nsnap > 0 && j->smeta[j->nsnap - 1].steps == run_steps)
                j->nsnap--; /* psd's model replaces ours of the same step */
            snapshot(j, epoch, st_done, run_steps, j->res.samples + done, j->res.train_time + dt);
        }
        rc = pw_epoch_done(o, pc, j->model, &j->test, epoch, dt, loss_sum, done, comm_s, job_t0, 0, &j->res);
        /* (after a reconnect the local model is psd's anyway) */
        if (psd_model && psc_reconnects(pc) == reconnects)
            memcpy(ps_model_params(j->model), j->keep, j->np * sizeof(float));
        if (rc != 0)
            return 1;
    }
    if (o->snapshots)
        snapshots_report(j);
    return 0;
}

static void job_free(job *j)
{
    free(j->perm);
    free(j->bx);
    free(j->gacc);
    free(j->by);
    free(j->keep);
    free(j->snap);
    free(j->vel);
    free(j->smeta);
    pw_progress_stop();
    psc_free(j->pc); /* before the model: its vectors may be the library's */
    ps_model_free(j->model);
    for (int i = 0; i < 2; i++) {
        free(j->pbuf[i]);
        free(j->gbuf[i]);
    }
    ps_dataset_free(&j->all);
    ps_dataset_free(&j->train);
    ps_dataset_free(&j->test);
}

int pw_train(wopts *o, psc_client *pc)
{
    job j = {.o = o, .pc = pc, .res = {.test_acc = -1}};
    o->progress = !o->quiet && isatty(STDERR_FILENO);
    pw_progress_start(o, pc);
    openblas_set_num_threads(o->threads);
    int status = job_setup(&j);
    if (status < 0) {
        if (j.planned) {
            status = pw_train_planned(o, pc, j.model, &j.all, &j.test, &j.res);
        } else {
            ps_dataset_free(&j.all); /* only its size is needed now */
            status = train_epochs(&j, pw_now());
        }
    }
    if (status == 0) {
        psc_close(pc);
        if (o->save_params) {
            FILE *f = fopen(o->save_params, "wb");
            if (!f || fwrite(ps_model_params(j.model), sizeof(float), j.np, f) != j.np || fclose(f) != 0) {
                fprintf(stderr, "psworker: cannot write %s: %s\n", o->save_params, strerror(errno));
                status = 1;
            }
        }
    }
    if (status == 0) {
        pw_summary(o, pc, &j.res);
        fflush(stdout);
    }
    job_free(&j);
    return status;
}
