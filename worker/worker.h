/* worker.h - psworker's parts, as its files share them: the options and the
 * connection to psd (options.c), the progress line, epoch reports and the
 * summary (report.c), the training loop (train.c), a job by psd's plan
 * (train_plan.c), and the stop signals (stop.c); main() is psworker.c's. Names
 * start with pw_. psworker reaches psd only through libpsclient. */
#ifndef PS_WORKER_WORKER_H
#define PS_WORKER_WORKER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dataset.h"
#include "model.h"
#include "psd/client.h"

/* room for libpsclient's options (psc_option), a few to spare */
#define PW_LIB_OPTIONS_MAX 64

typedef struct wopts {
    const char *lib[PW_LIB_OPTIONS_MAX]; /* libpsclient's options as given, by their
                                          * index in its table (psc_option); NULL: its default */
    int shard, nshards;      /* the shard libpsclient parsed from option shard */
    const char *dataset;
    const char *data_dir;
    const char *model;
    int epochs;
    int batch;
    int eval;
    size_t limit, test_limit;
    uint64_t seed;
    int threads;
    int quiet;               /* only errors and the final JSON */
    int epoch_json;          /* a JSON line per epoch on stdout */
    int no_shuffle;          /* visit samples in order (reproducibility tests) */
    int fixed_shard;         /* --fixed-shard: never take over a dead worker's data */
    int no_plan;             /* --no-plan: in bsp, count epochs and steps ourselves */
    const char *save_params; /* write the final parameters here (raw float32) */
    int pipeline;            /* -1 auto (asgd/ssp on), 0 off, 1 on */
    double lr;               /* local SGD, elastic averaging: our own SGD's step size */
    double momentum;         /* local SGD, elastic averaging: our own SGD's momentum, 0: none */
    int snapshots;           /* --snapshots: model copies a epoch for time to accuracy, 0: none */
    double max_seconds;      /* --max-seconds: training time after which to stop, 0: none */
    int progress;            /* a live progress bar on stderr (a terminal) */
} wopts;

/* ---- options.c ---- */

/* Reads the command line (and the environment's defaults) into *o. Returns
 * -1 to go on, or the exit status to leave with: 0 after --help, 2 for a
 * bad option (said on stderr). */
int pw_options_parse(int argc, char **argv, wopts *o);

/* The connection to psd: a libpsclient client configured from the options
 * (o->shard and o->nshards take the shard it parsed). Returns 0 with *out
 * set, or the exit status to leave with (2: a bad option, said on stderr). */
int pw_client_new(wopts *o, psc_client **out);

/* The psd address(es) the options name, for the log. */
const char *pw_server(const wopts *o);

/* "psworker: " and the message on stderr; returns 2 (a bad option). */
int pw_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- report.c ---- */

double pw_now(void);

/* Starts the thread that adds a long wait for psd to the progress line
 * (when o->progress), asking pc whom psd waits for; pw_progress_stop makes
 * it ask no more, before pc is freed. */
void pw_progress_start(const wopts *o, psc_client *pc);
void pw_progress_stop(void);

/* The live progress line on a terminal, rewritten in place: the epoch's
 * share done, the rate over the job so far and the time the job has left. */
void pw_progress_draw(const wopts *o, int epoch, size_t step, size_t steps, double epoch_loss, double job_s,
                      uint64_t job_samples, size_t job_steps_done, size_t job_steps);

/* Clears the progress line before ordinary output. */
void pw_progress_clear(const wopts *o);

/* A step's exchange with psd begins (1) or ends (0). */
void pw_step_waits(const wopts *o, int begins);

/* What the training leaves for the summary. */
typedef struct pw_result {
    double train_time, last_loss, test_acc, test_loss;
    uint64_t samples;
} pw_result;

/* Epoch epoch (from 1) is over after dt seconds, done samples at a summed
 * loss loss_sum, comm_s of them waiting on psd: adds it to *res, evaluates
 * the model (--eval), prints its line (and --epoch-json's) and reports it
 * to psd. planned: a job by psd's plan. Returns 0, or -1 when the report
 * failed (said on stderr). */
int pw_epoch_done(const wopts *o, psc_client *pc, ps_model *model, const ps_dataset *test, int epoch, double dt,
                  double loss_sum, size_t done, double comm_s, double job_t0, int planned, pw_result *res);

/* The last line on stdout: the JSON summary of the run (see psworker --help). */
void pw_summary(const wopts *o, psc_client *pc, const pw_result *res);

/* ---- stop.c: SIGTERM and SIGINT ---- */

/* The signal received (0: none). The handler only records it; the training
 * looks between steps and calls pw_stop. */
extern volatile sig_atomic_t pw_stop_signal;

void pw_stop_install(psc_client *pc);

/* Leaves psd with the signal as the reason, says so on stderr; returns the
 * exit status, 128 + the signal, as a process killed by it would have. */
int pw_stop(psc_client *pc, int shard, int nshards, int epoch, size_t step);

/* ---- train.c, train_plan.c ---- */

/* The whole run on a configured client: data, model, connect, the epochs
 * (or psd's plan), the summary; frees pc. Returns the exit status: 0, 1 (a
 * failure, said on stderr) or 128 + a stop signal. */
int pw_train(wopts *o, psc_client *pc);

/* A BSP job by psd's plan: every pull that opens a round says which
 * samples of the whole training set (all) this worker trains in it,
 * positions [lo, hi) of the epoch's order, which every worker draws alike
 * from the job's seed; a worker that was cut off and comes back learns the
 * round from its first pull; when psd says done the final model is in psd
 * and the worker stops. o->epochs becomes the job's. Returns 0, 1 (a
 * failure, said on stderr) or 128 + a stop signal. */
int pw_train_planned(wopts *o, psc_client *pc, ps_model *model, const ps_dataset *all, const ps_dataset *test,
                     pw_result *res);

#endif
