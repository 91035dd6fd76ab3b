/* psworker.c - one training worker: reads shard K of M of a data set,
 * computes gradients on OpenBLAS and trains against psd with push-and-pull
 * steps through libpsclient (include/psd/client.h), as any other program
 * would. Progress goes to stderr; the last line on stdout is a JSON summary. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "dataset.h"
#include "layer.h"
#include "model.h"
#include "psd/client.h"


typedef struct wopts {
    const char *server;
    int shard, nshards;
    const char *dataset;
    const char *data_dir;
    const char *model;
    int epochs;
    int batch;
    int eval;
    size_t limit, test_limit;
    uint64_t seed;
    int threads;
    int timeout_ms;
    int reconnect_ms;
    int connect_ms;          /* --connect-timeout: wait this long for psd at the start */
    const char *shard_arg;   /* --shard as given: K/M or auto (libpsclient parses it) */
    int quiet;               /* only errors and the final JSON */
    int epoch_json;          /* a JSON line per epoch on stdout */
    int no_shuffle;          /* visit samples in order (reproducibility tests) */
    int fixed_shard;         /* --fixed-shard: never take over a dead worker's data */
    int no_plan;             /* --no-plan: in bsp, count epochs and steps ourselves */
    const char *save_params; /* write the final parameters here (raw float32) */
    const char *token_file;  /* the secret psd asks for (--token-file, $PSD_TOKEN_FILE) */
    int pipeline;            /* -1 auto (asgd/ssp on), 0 off, 1 on */
    const char *wire;        /* --wire: f32 or bf16 */
    int shm;                 /* --shm: offer psd shared memory */
    const char *send_buffer; /* --send-buffer: each connection's SO_SNDBUF (libpsclient's option) */
    const char *barrier;     /* --barrier on|off (libpsclient's option) */
    const char *pieces;      /* --pieces auto|on|off (libpsclient's option) */
    const char *skip_zeros;  /* --skip-zeros on|off (libpsclient's option) */
    const char *compress;    /* --compress auto|on|off (libpsclient's option) */
    int progress;            /* a live progress bar on stderr (a terminal) */
} wopts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psworker [options]\n"
            "\n"
            "Trains shard K of M of a data set against psd.\n"
            "\n"
            "  -S, --server HOST:PORT  psd's address (default $PSD_SERVER or 127.0.0.1:7000);\n"
            "                          HOST:PORT,HOST:PORT,...: a model split over that many psd,\n"
            "                          one part each, in order (every worker lists them alike)\n"
            "      --token-file PATH   the secret to prove to psd when it requires one (its\n"
            "                          token_file; default $PSD_TOKEN_FILE); mode 600\n"
            "  -k, --shard K/M         this worker's shard (default 0/1), or `auto`: K and M\n"
            "                          from the launcher: OMPI_COMM_WORLD_RANK and _SIZE\n"
            "                          (mpirun), SLURM_PROCID and SLURM_NTASKS (srun), RANK and\n"
            "                          WORLD_SIZE (torchrun), or JOB_COMPLETION_INDEX and\n"
            "                          PSD_WORKERS (a Kubernetes indexed Job)\n"
            "  -d, --dataset NAME      mnist or fashion-mnist (default mnist)\n"
            "  -D, --data DIR          data directory (default $PSD_DATA_DIR or ./data)\n"
            "  -M, --model SPEC        softmax, linear, mlp:H1,H2,... or cnn, with options after a\n"
            "                          colon: mlp:256,128:dropout=0.2, cnn:dropout=0.5,init=he\n"
            "                          (default mlp:256,128)\n"
            "  -e, --epochs N          epochs (default 5)\n"
            "  -b, --batch B           samples per step on this worker (default 64)\n"
            "  -E, --eval              test-set accuracy after every epoch\n"
            "      --limit N           use only the first N training samples\n"
            "      --test-limit N      use only the first N test samples\n"
            "      --seed S            seed for initial values and shuffling (default 1)\n"
            "      --threads T         OpenBLAS threads (default 1)\n"
            "      --timeout MS        give up on a reply after MS milliseconds (default 600000)\n"
            "      --reconnect-timeout S  when psd goes away, keep trying to reconnect for S\n"
            "                          seconds (default 60), with exponential backoff\n"
            "      --connect-timeout S  at the start, wait up to S seconds for psd to come up\n"
            "                          (default 10), with the same backoff\n"
            "  -q, --quiet             print only errors and the final JSON line\n"
            "      --epoch-json        also print one JSON line per epoch on stdout (epoch,\n"
            "                          train_seconds, wall_seconds, comm_wait_seconds: time spent\n"
            "                          waiting on psd, train_loss, test_accuracy, ...)\n"
            "      --no-shuffle        visit the shard in order every epoch (for reproducibility tests)\n"
            "      --fixed-shard       keep shard K of M for the whole run; by default, at the start of\n"
            "                          each epoch the workers that psd still counts share the data of\n"
            "                          those it declared lost (died and not back)\n"
            "      --no-plan           in bsp, count epochs and steps on this worker as psd version 1\n"
            "                          did; by default the workers propose psd a plan (the epochs,\n"
            "                          the training set's size, B x M samples a round, the seed) and\n"
            "                          psd tells each worker which samples to train every round, and\n"
            "                          when the job is done (see docs/running.md, \"A job by psd's plan\")\n"
            "      --save-params PATH  write the final parameters to PATH as raw little-endian float32\n"
            "      --pipeline on|off|auto  compute the next gradient while the last one travels\n"
            "                          (one step more staleness; default off); auto: on in asgd\n"
            "                          and ssp for models of at most 2^20 parameters on one psd,\n"
            "                          off in bsp\n"
            "      --wire f32|bf16     tensors on the wire: f32 (default), or bf16 to push gradients\n"
            "                          and receive parameters at 2 bytes a value (half the bytes,\n"
            "                          about 3 significant digits; psd keeps float32) when psd\n"
            "                          offers it (wire_bf16), else f32 with a warning\n"
            "      --send-buffer BYTES each connection's kernel send buffer (SO_SNDBUF); default:\n"
            "                          the kernel sizes it. A cap such as 65536 keeps a step's\n"
            "                          pushes to several psd from overflowing short link queues\n"
            "      --barrier auto|on|off  a bsp step over a split model ends at a barrier on\n"
            "                          the first psd, so that every worker starts its next round\n"
            "                          together; auto (default): when a psd is on another machine\n"
            "                          (libpsclient's barrier option)\n"
            "      --pieces auto|on|off  a bsp step sends a part whose psd closes rounds in\n"
            "                          pieces (bsp_piece) piece by piece, and reads every psd's\n"
            "                          answers as they come; auto (default): when that psd is on\n"
            "                          another machine (libpsclient's pieces option)\n"
            "      --skip-zeros on|off on (default): float32 pushes leave their zeros out (a\n"
            "                          bitmap marks the values sent) when psd offers it and it\n"
            "                          saves bytes; psd gets the same values bit for bit\n"
            "      --compress auto|on|off  float32 pushes and pulled parameters as zstd frames\n"
            "                          (lossless) when psd offers it and it saves bytes; auto\n"
            "                          (default): with a psd on another machine (libpsclient's\n"
            "                          compress option)\n"
            "      --shm on|off        on (default): offer psd a shared-memory segment for the\n"
            "                          tensors; a psd on this machine, of the same user, maps it\n"
            "                          and pushes and pulls skip the TCP copies (models of at\n"
            "                          most 2^20 parameters, or 2^20 per psd, not with --pipeline\n"
            "                          on); elsewhere\n"
            "                          they go over TCP as ever\n"
            "  -h, --help              this help\n"
            "\n"
            "Progress goes to stderr: a live bar with the rate and the time left when\n"
            "stderr is a terminal (with \"waiting N s for psd: round 3 waits for shard 2/3\n"
            "(never joined)\" while a step waits for psd longer than 2 s: a BSP round\n"
            "waiting for a worker, a pause; as psd tells it, or until it has, \"psctl\n"
            "status says for whom\"), one line per epoch otherwise. psd hears of it after\n"
            "every epoch and every $PSD_REPORT_INTERVAL seconds (default 1; 0: epochs only).\n"
            "\n"
            "Exit status: 0 when every epoch is done; 1 when training fails (psd\n"
            "unreachable past --reconnect-timeout, refused, missing data); 2 for a bad\n"
            "option; 143 (130) after SIGTERM (SIGINT): the worker finishes its step\n"
            "(a wait for psd ends at once), says bye to psd (which shows it as left,\n"
            "not lost) and exits.\n"
            "\n"
            "The last line on stdout is a JSON object: epochs, train_loss,\n"
            "test_accuracy (null without --eval), test_loss, seconds, samples,\n"
            "samples_per_second, version, mode, shard, model, reconnects,\n"
            "dropped_pushes, wire (the tensor type psd agreed to: f32 or bf16), shm\n"
            "(true when the last connection's pushes and pulls went through shared memory).\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The live progress line, shared with the thread that adds a long wait
 * for psd to it (wait_watch). */
static struct {
    pthread_mutex_t lock; /* held around every write of the line */
    char line[256];       /* the line as last drawn; "" after a clear */
    double since;         /* when the current step's exchange with psd began; 0: none */
    psc_client *pc;       /* asked what the step waits for (psc_waiting_for) */
} g_wait = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* h:mm:ss or m:ss */
static void format_eta(double secs, char *buf, size_t len)
{
    if (!(secs >= 0) || secs > 360000)
        snprintf(buf, len, "--:--");
    else if (secs >= 3600)
        snprintf(buf, len, "%d:%02d:%02d", (int)secs / 3600, (int)secs / 60 % 60, (int)secs % 60);
    else
        snprintf(buf, len, "%d:%02d", (int)secs / 60, (int)secs % 60);
}

/* The live progress line on a terminal, rewritten in place: the epoch's
 * share done, the rate over the job so far and the time the job has left. */
static void progress_draw(const wopts *o, int epoch, size_t step, size_t steps, double epoch_loss, double job_s,
                          uint64_t job_samples, size_t job_steps_done, size_t job_steps)
{
    char bar[25], eta[16];
    double frac = steps ? (double)step / (double)steps : 1;
    size_t fill = (size_t)(frac * (sizeof bar - 1) + 0.5);
    for (size_t i = 0; i < sizeof bar - 1; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[sizeof bar - 1] = '\0';
    double rate = job_s > 0 ? (double)job_samples / job_s : 0;
    format_eta(job_steps_done ? job_s / (double)job_steps_done * (double)(job_steps - job_steps_done) : -1, eta,
               sizeof eta);
    char loss[32] = "-"; /* none before the epoch's first step */
    if (!isnan(epoch_loss))
        snprintf(loss, sizeof loss, "%.4f", epoch_loss);
    pthread_mutex_lock(&g_wait.lock);
    snprintf(g_wait.line, sizeof g_wait.line, "%d/%d epoch %d/%d [%s] %3.0f%%  %.0f samples/s  ETA %s  loss %s",
             o->shard, o->nshards, epoch, o->epochs, bar, 100 * frac, rate, eta, loss);
    fprintf(stderr, "\r%s\033[K", g_wait.line);
    fflush(stderr);
    pthread_mutex_unlock(&g_wait.lock);
}

/* Clears the progress line before ordinary output. */
static void progress_clear(const wopts *o)
{
    if (o->progress) {
        pthread_mutex_lock(&g_wait.lock);
        g_wait.line[0] = '\0';
        fputs("\r\033[K", stderr);
        pthread_mutex_unlock(&g_wait.lock);
    }
}

/* A step's exchange with psd begins (1) or ends (0). */
static void step_waits(const wopts *o, int begins)
{
    if (!o->progress)
        return;
    pthread_mutex_lock(&g_wait.lock);
    g_wait.since = begins ? now_s() : 0;
    pthread_mutex_unlock(&g_wait.lock);
}

/* The progress line's watcher: once a second, while one step has waited
 * for psd over WAIT_SHOW_S, the line says so: how long, and for whom as
 * psd told the library (psc_waiting_for: "round 0 waits for shard 2/3
 * (never joined)"), or until psd has said, where to see it (psd's `psctl
 * status` and log name the shards a round waits for). Detached; it only
 * reads the clock and the library's copy of psd's words, and writes the
 * line. */
#define WAIT_SHOW_S 2.0
static void *wait_watch(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_wait.lock);
        double t = now_s() - g_wait.since;
        if (g_wait.since > 0 && t > WAIT_SHOW_S && g_wait.line[0]) {
            char why[256];
            if (g_wait.pc && psc_waiting_for(g_wait.pc, why, sizeof why) > 0)
                fprintf(stderr, "\r%s  waiting %.0f s for psd: %s\033[K", g_wait.line, t, why);
            else
                fprintf(stderr, "\r%s  waiting %.0f s for psd (psctl status says for whom)\033[K", g_wait.line, t);
            fflush(stderr);
        }
        pthread_mutex_unlock(&g_wait.lock);
    }
    return NULL;
}

static int die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "psworker: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

static int parse_uint(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Elastic data: at the start of an epoch, asks psd which shards are still
 * in the job and, when some were declared lost, takes slice rank of count
 * of the training set instead of shard K of M, so the survivors still
 * cover all of it. *part and *parts are the slice held now; on a change
 * the set is loaded again and cut anew (train and *perm follow). Returns 0
 * (also when psd cannot tell: the slice stays), or -1 with a message in
 * err. */
static int reshard(const wopts *o, psc_client *pc, ps_dataset *train, size_t **perm, int *part, int *parts,
                   char *err, size_t errlen)
{
    uint32_t rank, count;
    if (psc_live_shards(pc, &rank, &count) != 0) {
        PS_LOG(PS_LOG_DEBUG, "cannot ask psd for the live shards (%s); keeping part %d of %d",
               psc_errmsg(pc), *part, *parts);
        return 0;
    }
    if ((int)rank == *part && (int)count == *parts)
        return 0;
    ps_dataset all = {0}, slice = {0};
    if (ps_dataset_load(o->data_dir, o->dataset, PS_SPLIT_TRAIN, o->limit, &all, err, errlen) != 0)
        return -1;
    int rc = ps_dataset_shard(&all, (int)rank, (int)count, &slice, err, errlen);
    ps_dataset_free(&all);
    if (rc != 0)
        return -1;
    size_t *p = realloc(*perm, slice.n * sizeof *p);
    if (!p) {
        ps_dataset_free(&slice);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *perm = p;
    PS_LOG(PS_LOG_INFO, "shard %d/%d: %u of %d shards are live: training on part %u of %u of the data (%zu samples, "
                        "was part %d of %d)",
           o->shard, o->nshards, count, o->nshards, rank, count, slice.n, *part, *parts);
    ps_dataset_free(train);
    *train = slice;
    *part = (int)rank;
    *parts = (int)count;
    return 0;
}

/* SIGTERM or SIGINT received: the handler only records it; the training
 * loop looks between steps, says bye to psd with the reason and exits
 * 128 + the signal (143 for SIGTERM), as a process killed by it would. */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig)
{
    g_stop_signal = sig;
}

static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    /* no SA_RESTART (the library retries its own EINTRs); SA_RESETHAND: a
     * second signal kills at once, for a person who does not want to wait */
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* Leaves psd with the signal as the reason; returns the exit status. */
static int stop_on_signal(psc_client *pc, int shard, int nshards, int epoch, size_t step)
{
    int sig = (int)g_stop_signal;
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
    char why[64];
    snprintf(why, sizeof why, "stopped by %s", name);
    psc_leave(pc, why); /* waits for a pipelined step in flight */
    fprintf(stderr, "psworker %d/%d: %s at epoch %d step %zu: left psd; exiting with %d\n", shard, nshards, why,
            epoch, step, 128 + sig);
    return 128 + sig;
}

/* What a planned job's training leaves for the summary. */
typedef struct plan_result {
    double train_time, last_loss, test_acc, test_loss;
    uint64_t samples;
} plan_result;

/* An epoch of a planned job is over (the next round is another epoch's,
 * or the job is done): evaluates, prints, reports it to psd. */
static int plan_epoch_done(const wopts *o, psc_client *pc, ps_model *model, const ps_dataset *test, uint64_t e,
                           double dt, double loss_sum, size_t done, double comm_s, double job_t0, plan_result *res)
{
    res->train_time += dt;
    res->samples += done;
    res->last_loss = loss_sum / (double)(done ? done : 1);
    double rate = (double)done / (dt > 0 ? dt : 1e-9);
    int epoch = (int)e + 1;
    if (o->eval)
        ps_model_evaluate(model, test->x, test->y, test->n, &res->test_loss, &res->test_acc);
    progress_clear(o);
    if (o->quiet) {
        /* the final JSON line says it all */
    } else if (o->eval) {
        fprintf(stderr,
                "psworker %d/%d: epoch %d/%d  loss %.4f  test accuracy %.2f%%  %.2f s  %.0f samples/s  version %" PRIu64
                " (psd's plan)\n",
                o->shard, o->nshards, epoch, o->epochs, res->last_loss, 100 * res->test_acc, dt, rate,
                psc_model_version(pc));
    } else {
        fprintf(stderr, "psworker %d/%d: epoch %d/%d  loss %.4f  %.2f s  %.0f samples/s  version %" PRIu64
                        " (psd's plan)\n",
                o->shard, o->nshards, epoch, o->epochs, res->last_loss, dt, rate, psc_model_version(pc));
    }
    if (o->epoch_json) {
        printf("{\"epoch\": %d, \"train_seconds\": %.4f, \"epoch_seconds\": %.4f, \"wall_seconds\": %.4f, "
               "\"comm_wait_seconds\": %.4f, \"train_loss\": %.6f, \"samples_per_second\": %.1f, \"version\": %" PRIu64
               ", \"test_accuracy\": ",
               epoch, res->train_time, dt, now_s() - job_t0, comm_s, res->last_loss, rate, psc_model_version(pc));
        if (o->eval)
            printf("%.6f, \"test_loss\": %.6f}\n", res->test_acc, res->test_loss);
        else
            printf("null, \"test_loss\": null}\n");
        fflush(stdout);
    }
    if (psc_report(pc, (uint32_t)epoch, res->last_loss, o->eval ? res->test_acc : -1, res->test_loss, res->samples,
                   rate) != 0) {
        fprintf(stderr, "psworker: reporting epoch %d: %s\n", epoch, psc_errmsg(pc));
        return -1;
    }
    return 0;
}

/* A BSP job by psd's plan: every pull that opens a round says which
 * samples of the whole training set (all) this worker trains in it,
 * positions [lo, hi) of the epoch's order, which every worker draws alike
 * from the job's seed; a worker that was cut off and comes back learns the
 * round from its first pull; when psd says done the final model is in psd
 * and the worker stops. o->epochs becomes the job's. Returns 0, 1 (a
 * failure, said on stderr) or 128 + a stop signal. */
static int train_planned(wopts *o, psc_client *pc, ps_model *model, const ps_dataset *all, const ps_dataset *test,
                         plan_result *res)
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
    double job_t0 = now_s(), t0 = job_t0, loss_sum = 0, comm_s = 0, last_draw = 0;
    size_t done = 0, steps = 0; /* samples and steps in this epoch */
    uint64_t per_epoch = (samples + gbatch - 1) / gbatch;
    uint64_t cur = 0;
    int in_epoch = 0;
    for (;;) {
        if (g_stop_signal) {
            progress_clear(o);
            status = stop_on_signal(pc, o->shard, o->nshards, (int)cur + 1, steps);
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
            if (plan_epoch_done(o, pc, model, test, cur, now_s() - t0, loss_sum, done, comm_s, job_t0, res) != 0)
                goto out;
            in_epoch = 0;
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
            t0 = now_s();
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
            progress_clear(o);
            fprintf(stderr, "psworker: loss became %f in round %" PRIu64 "; lower the learning rate\n", (double)loss,
                    psc_model_version(pc));
            goto out;
        }
        loss_sum += (double)loss * (double)cnt;
        done += cnt;
        steps++;
        double tc = now_s();
        if (o->progress && tc - last_draw >= 0.1) {
            /* the line the wait watcher extends while this round waits */
            last_draw = tc;
            uint64_t v0 = psc_model_version(pc);
            uint64_t at = v0 - cur * per_epoch < per_epoch ? v0 - cur * per_epoch : per_epoch;
            progress_draw(o, (int)cur + 1, (size_t)at, (size_t)per_epoch, loss_sum / (double)(done ? done : 1),
                          tc - job_t0, res->samples + done, (size_t)v0, (size_t)(per_epoch * epochs));
        }
        step_waits(o, 1);
        int prc = psc_pushpull(pc);
        step_waits(o, 0);
        if (prc != 0) {
            progress_clear(o);
            if (prc == PSC_EINTR && g_stop_signal) { /* the signal ended the round's wait */
                status = stop_on_signal(pc, o->shard, o->nshards, (int)cur + 1, steps);
                goto out;
            }
            fprintf(stderr, "psworker: round %" PRIu64 ": %s\n", psc_model_version(pc), psc_errmsg(pc));
            goto out;
        }
        double now = now_s();
        comm_s += now - tc;
        if (cnt && psc_progress(pc, (uint32_t)cur, (double)loss * (double)cnt, cnt) != 0) {
            progress_clear(o);
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

/* Reads the command line (and the environment's defaults) into *o. Returns
 * -1 to go on, or the exit status to leave with: 0 after --help, 2 for a
 * bad option (said on stderr). */
static int parse_options(int argc, char **argv, wopts *o)
{
    *o = (wopts){.server = getenv("PSD_SERVER") && *getenv("PSD_SERVER") ? getenv("PSD_SERVER") : "127.0.0.1:7000",
               .shard = 0, .nshards = 1, .dataset = "mnist",
               .model = "mlp:256,128", .epochs = 5, .batch = 64, .seed = 1, .threads = 1,
               .timeout_ms = 600000, .reconnect_ms = 60000, .connect_ms = 10000, .pipeline = 0, .shm = 1,
               .wire = "f32"};
    enum { O_LIMIT = 1000, O_TEST_LIMIT, O_SEED, O_THREADS, O_TIMEOUT, O_RECONNECT, O_EPOCH_JSON, O_NO_SHUFFLE, O_FIXED_SHARD,
           O_SAVE_PARAMS, O_PIPELINE, O_TOKEN_FILE, O_WIRE, O_SHM, O_CONNECT, O_NO_PLAN, O_SEND_BUFFER,
           O_BARRIER, O_PIECES, O_SKIP_ZEROS, O_COMPRESS };
    static const struct option longopts[] = {
        {"server", required_argument, NULL, 'S'},  {"shard", required_argument, NULL, 'k'},
        {"dataset", required_argument, NULL, 'd'}, {"data", required_argument, NULL, 'D'},
        {"model", required_argument, NULL, 'M'},   {"epochs", required_argument, NULL, 'e'},
        {"batch", required_argument, NULL, 'b'},   {"eval", no_argument, NULL, 'E'},
        {"limit", required_argument, NULL, O_LIMIT}, {"test-limit", required_argument, NULL, O_TEST_LIMIT},
        {"seed", required_argument, NULL, O_SEED}, {"threads", required_argument, NULL, O_THREADS},
        {"timeout", required_argument, NULL, O_TIMEOUT}, {"help", no_argument, NULL, 'h'},
        {"reconnect-timeout", required_argument, NULL, O_RECONNECT},
        {"connect-timeout", required_argument, NULL, O_CONNECT},
        {"quiet", no_argument, NULL, 'q'},
        {"epoch-json", no_argument, NULL, O_EPOCH_JSON},
        {"no-shuffle", no_argument, NULL, O_NO_SHUFFLE},
        {"fixed-shard", no_argument, NULL, O_FIXED_SHARD},
        {"no-plan", no_argument, NULL, O_NO_PLAN},
        {"save-params", required_argument, NULL, O_SAVE_PARAMS},
        {"pipeline", required_argument, NULL, O_PIPELINE},
        {"token-file", required_argument, NULL, O_TOKEN_FILE},
        {"wire", required_argument, NULL, O_WIRE},
        {"shm", required_argument, NULL, O_SHM},
        {"send-buffer", required_argument, NULL, O_SEND_BUFFER},
        {"barrier", required_argument, NULL, O_BARRIER},
        {"pieces", required_argument, NULL, O_PIECES},
        {"skip-zeros", required_argument, NULL, O_SKIP_ZEROS},
        {"compress", required_argument, NULL, O_COMPRESS},
        {NULL, 0, NULL, 0},
    };
    ps_log_init("psworker", PS_LOG_INFO);
    o->data_dir = getenv("PSD_DATA_DIR") ? getenv("PSD_DATA_DIR") : "data";
    o->token_file = getenv("PSD_TOKEN_FILE") && *getenv("PSD_TOKEN_FILE") ? getenv("PSD_TOKEN_FILE") : NULL;
    int opt;
    unsigned long long v;
    while ((opt = getopt_long(argc, argv, "S:k:d:D:M:e:b:Eqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'S': o->server = optarg; break;
        case 'k': o->shard_arg = optarg; break;
        case 'q': o->quiet = 1; break;
        case O_EPOCH_JSON: o->epoch_json = 1; break;
        case O_NO_SHUFFLE: o->no_shuffle = 1; break;
        case O_FIXED_SHARD: o->fixed_shard = 1; break;
        case O_NO_PLAN: o->no_plan = 1; break;
        case O_SAVE_PARAMS: o->save_params = optarg; break;
        case O_TOKEN_FILE: o->token_file = optarg; break;
        case O_PIPELINE:
            if (strcmp(optarg, "on") == 0)
                o->pipeline = 1;
            else if (strcmp(optarg, "off") == 0)
                o->pipeline = 0;
            else if (strcmp(optarg, "auto") == 0)
                o->pipeline = -1;
            else
                return die("bad --pipeline '%s': on, off or auto", optarg);
            break;
        case O_SEND_BUFFER: o->send_buffer = optarg; break;
        case O_BARRIER: o->barrier = optarg; break;
        case O_PIECES: o->pieces = optarg; break;
        case O_SKIP_ZEROS: o->skip_zeros = optarg; break;
        case O_COMPRESS: o->compress = optarg; break;
        case O_WIRE:
            if (strcmp(optarg, "f32") != 0 && strcmp(optarg, "bf16") != 0)
                return die("bad --wire '%s': f32 or bf16", optarg);
            o->wire = optarg;
            break;
        case O_SHM:
            if (strcmp(optarg, "on") == 0)
                o->shm = 1;
            else if (strcmp(optarg, "off") == 0)
                o->shm = 0;
            else
                return die("bad --shm '%s': on or off", optarg);
            break;
        case 'd': o->dataset = optarg; break;
        case 'D': o->data_dir = optarg; break;
        case 'M': o->model = optarg; break;
        case 'e':
            if (parse_uint(optarg, 100000, &v) || v == 0)
                return die("bad --epochs '%s': expected 1..100000", optarg);
            o->epochs = (int)v;
            break;
        case 'b':
            if (parse_uint(optarg, PS_MODEL_MAX_BATCH, &v) || v == 0)
                return die("bad --batch '%s': expected 1..65536", optarg);
            o->batch = (int)v;
            break;
        case 'E': o->eval = 1; break;
        case O_LIMIT:
            if (parse_uint(optarg, SIZE_MAX, &v))
                return die("bad --limit '%s'", optarg);
            o->limit = (size_t)v;
            break;
        case O_TEST_LIMIT:
            if (parse_uint(optarg, SIZE_MAX, &v))
                return die("bad --test-limit '%s'", optarg);
            o->test_limit = (size_t)v;
            break;
        case O_SEED:
            if (parse_uint(optarg, UINT64_MAX, &v))
                return die("bad --seed '%s'", optarg);
            o->seed = v;
            break;
        case O_THREADS:
            if (parse_uint(optarg, 256, &v) || v == 0)
                return die("bad --threads '%s': expected 1..256", optarg);
            o->threads = (int)v;
            break;
        case O_TIMEOUT:
            if (parse_uint(optarg, 86400000, &v) || v == 0)
                return die("bad --timeout '%s': milliseconds", optarg);
            o->timeout_ms = (int)v;
            break;
        case O_RECONNECT:
            if (parse_uint(optarg, 86400, &v))
                return die("bad --reconnect-timeout '%s': seconds, 0..86400", optarg);
            o->reconnect_ms = (int)v * 1000;
            break;
        case O_CONNECT:
            if (parse_uint(optarg, 86400, &v))
                return die("bad --connect-timeout '%s': seconds, 0..86400", optarg);
            o->connect_ms = (int)v * 1000;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc)
        return die("unexpected argument '%s' (see psworker --help)", argv[optind]);
    return -1;
}

/* The connection to psd: a libpsclient client configured from the options
 * (o->shard and o->nshards take the shard it parsed). Returns 0 with *out
 * set, or the exit status to leave with (2: a bad option, said on stderr). */
static int client_new(wopts *o, psc_client **out)
{
    psc_client *pc = psc_new();
    if (!pc)
        return die("out of memory");
    char num[32];
    if (o->shard_arg && psc_set(pc, "shard", o->shard_arg) != 0) {
        if (strcmp(o->shard_arg, "auto") == 0)
            die("--%s", psc_errmsg(pc));
        else
            die("bad --shard '%s': expected K/M with 0 <= K < M, e.g. 0/2, or auto", o->shard_arg);
        psc_free(pc);
        return 2;
    }
    uint32_t shard_k, shard_m;
    psc_shard(pc, &shard_k, &shard_m);
    o->shard = (int)shard_k;
    o->nshards = (int)shard_m;
    if (psc_set(pc, "server", o->server) != 0 || psc_set(pc, "token_file", o->token_file ? o->token_file : "") != 0 ||
        psc_set(pc, "wire", o->wire) != 0 || psc_set(pc, "shm", o->shm ? "on" : "off") != 0 ||
        (snprintf(num, sizeof num, "%d", o->timeout_ms), psc_set(pc, "timeout_ms", num)) != 0 ||
        (snprintf(num, sizeof num, "%d", o->reconnect_ms / 1000), psc_set(pc, "reconnect_s", num)) != 0 ||
        (snprintf(num, sizeof num, "%d", o->connect_ms / 1000), psc_set(pc, "connect_s", num)) != 0 ||
        (o->send_buffer && psc_set(pc, "send_buffer", o->send_buffer) != 0) ||
        (o->barrier && psc_set(pc, "barrier", o->barrier) != 0) ||
        (o->pieces && psc_set(pc, "pieces", o->pieces) != 0) ||
        (o->skip_zeros && psc_set(pc, "skip_zeros", o->skip_zeros) != 0) ||
        (o->compress && psc_set(pc, "compress", o->compress) != 0) ||
        psc_set(pc, "interrupt", "on") != 0) { /* SIGTERM, SIGINT end a wait for psd (stop_on_signal) */
        die("%s", psc_errmsg(pc));
        psc_free(pc);
        return 2;
    }
    if (o->quiet) {
        ps_log_set_level(PS_LOG_ERROR);
        psc_set(pc, "log", "error");
    }
    *out = pc;
    return 0;
}

/* The last line on stdout: the JSON summary of the run (see usage()). */
static void print_summary(const wopts *o, psc_client *pc, double last_loss, double test_acc, double test_loss,
                          double train_time, uint64_t samples)
{
    printf("{\"epochs\": %d, \"train_loss\": %.6f, \"test_accuracy\": ", o->epochs, last_loss);
    if (o->eval)
        printf("%.6f, \"test_loss\": %.6f", test_acc, test_loss);
    else
        printf("null, \"test_loss\": null");
    printf(", \"seconds\": %.3f, \"samples\": %" PRIu64 ", \"samples_per_second\": %.1f, \"version\": %" PRIu64
           ", \"mode\": \"%s\", \"shard\": \"%d/%d\", \"model\": \"%s\", \"reconnects\": %" PRIu64
           ", \"dropped_pushes\": %" PRIu64 ", \"wire\": \"%s\", \"shm\": %s, \"servers\": %u}\n",
           train_time, samples, (double)samples / (train_time > 0 ? train_time : 1e-9), psc_model_version(pc),
           psc_mode(pc), o->shard, o->nshards, o->model, psc_reconnects(pc), psc_dropped(pc), psc_wire(pc),
           psc_shm(pc) ? "true" : "false", psc_servers(pc));
}

int main(int argc, char **argv)
{
    wopts o;
    int status = parse_options(argc, argv, &o);
    if (status >= 0)
        return status;
    char err[1024];
    /* the connection to psd: libpsclient, configured from the options */
    psc_client *pc = NULL;
    status = client_new(&o, &pc);
    if (status != 0)
        return status;
    o.progress = !o.quiet && isatty(STDERR_FILENO);
    g_wait.pc = pc; /* set before the watcher starts, cleared before psc_free */
    pthread_t watcher;
    if (o.progress && pthread_create(&watcher, NULL, wait_watch, NULL) == 0)
        pthread_detach(watcher);
    openblas_set_num_threads(o.threads);

    ps_dataset train_all = {0}, train = {0}, test = {0};
    ps_model *model = NULL;
    status = 1;
    size_t *perm = NULL;
    float *bx = NULL, *gacc = NULL;
    uint8_t *by = NULL;
    float *pbuf[2] = {NULL, NULL}, *gbuf[2] = {NULL, NULL}; /* --pipeline: alternate vectors */
    int cur = 0, inflight = 0;
    uint64_t pver[2] = {0, 0}; /* the model version each of pbuf holds */

    if (ps_dataset_load(o.data_dir, o.dataset, PS_SPLIT_TRAIN, o.limit, &train_all, err, sizeof err) != 0 ||
        (o.eval && ps_dataset_load(o.data_dir, o.dataset, PS_SPLIT_TEST, o.test_limit, &test, err, sizeof err) != 0)) {
        fprintf(stderr, "psworker: %s\n", err);
        goto out;
    }
    if (ps_dataset_shard(&train_all, o.shard, o.nshards, &train, err, sizeof err) != 0) {
        fprintf(stderr, "psworker: %s\n", err);
        goto out;
    }
    if (ps_model_create_chw(o.model, 1, train_all.rows, train_all.cols, train_all.n_classes, o.batch, &model, err,
                            sizeof err) != 0) {
        fprintf(stderr, "psworker: %s\n", err);
        goto out;
    }
    /* every worker draws its own dropout masks */
    ps_model_reseed(model, o.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)o.shard + 1);
    size_t total_n = train_all.n;
    /* the whole training set stays until psd has said whether it runs the
     * job by a plan (which hands out samples from all of it) */
    if (!o.no_plan) {
        uint64_t gb = (uint64_t)o.batch * (uint64_t)o.nshards;
        if (psc_plan_set(pc, (uint64_t)o.epochs, total_n, gb < total_n ? gb : total_n, o.seed) != 0) {
            fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
            goto out;
        }
    }

    char desc[256];
    ps_model_describe(model, desc, sizeof desc);

    /* the model's tensors are the layout; the library's vectors are the
     * model's parameters and gradients (in the segment psd maps, when psd
     * is on this machine), seeded values in them as the initial model */
    ps_layout lay;
    if (ps_model_layout(model, &lay) != 0) {
        fprintf(stderr, "psworker: the model's layout does not fit the protocol's limits\n");
        goto out;
    }
    for (uint32_t i = 0; i < lay.ntensors; i++) {
        uint64_t dims[PS_DIMS_MAX];
        for (uint32_t k = 0; k < lay.t[i].ndim; k++)
            dims[k] = lay.t[i].dims[k];
        if (psc_add_tensor(pc, lay.t[i].name, lay.t[i].ndim, dims) != 0) {
            fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
            goto out;
        }
    }
    size_t np = ps_model_nparams(model);
    ps_model_init_params(model, o.seed);
    float *lib_params = psc_params(pc), *lib_grads = psc_grads(pc);
    if (!lib_params || !lib_grads) {
        fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
        goto out;
    }
    memcpy(lib_params, ps_model_params(model), np * sizeof(float));
    ps_model_bind_params(model, lib_params);
    ps_model_bind_grads(model, lib_grads);
    install_stop_handlers();
    int rc = psc_connect(pc);
    if (rc != 0 && !(rc == PSC_EINTR && g_stop_signal)) {
        fprintf(stderr, "psworker: %s\n", psc_errmsg(pc));
        goto out;
    }
    if (g_stop_signal) {
        status = stop_on_signal(pc, o.shard, o.nshards, 0, 0);
        goto out;
    }
    int bsp = strcmp(psc_mode(pc), "bsp") == 0;
    int planned = bsp && psc_plan(pc, NULL, NULL, NULL, NULL);
    if (!planned)
        ps_dataset_free(&train_all);
    if (o.pipeline == 1 || (o.pipeline == -1 && !bsp && np <= (1u << 20) && psc_servers(pc) == 1)) {
        if (bsp || np > (1u << 20) || psc_servers(pc) != 1) {
            fprintf(stderr, "psworker: --pipeline on needs asgd or ssp, a model of at most 2^20 parameters and one "
                            "psd\n");
            goto out;
        }
        /* two vectors of each, of our own: the model computes on one pair
         * while the library's thread sends the other (and psd's answer
         * lands in it); never the segment, which the library then fills */
        for (int i = 0; i < 2; i++) {
            pbuf[i] = ps_falloc(np);
            gbuf[i] = ps_falloc(np);
            if (!pbuf[i] || !gbuf[i]) {
                fprintf(stderr, "psworker: out of memory\n");
                goto out;
            }
            memcpy(pbuf[i], lib_params, np * sizeof(float));
        }
        ps_model_bind_params(model, pbuf[0]);
        ps_model_bind_grads(model, gbuf[0]);
    }
    PS_LOG(PS_LOG_INFO, "shard %d/%d: %s, %zu training samples, %s at %s, mode %s, model version %" PRIu64
                        ", OpenBLAS %s kernels",
           o.shard, o.nshards, desc, train.n, o.dataset, o.server, psc_mode(pc), psc_model_version(pc),
           openblas_get_corename());

    /* In BSP every worker must take the same number of steps per epoch, or
     * the last rounds would wait for pushes that never come: derive it from
     * the smallest shard (the whole set divided by M, rounded down). */
    int part = o.shard, parts = o.nshards; /* the slice of the data held */
    size_t batch = (size_t)o.batch;        /* samples per step */
    size_t per_shard = bsp ? total_n / (size_t)parts : train.n;
    if (per_shard == 0)
        per_shard = train.n;
    size_t steps = (per_shard + batch - 1) / batch;
    perm = malloc(train.n * sizeof *perm);
    bx = malloc((size_t)o.batch * (size_t)train.dim * sizeof *bx);
    by = malloc((size_t)o.batch);
    if (!perm || !bx || !by) {
        fprintf(stderr, "psworker: out of memory\n");
        goto out;
    }

    double train_time = 0, last_loss = 0, test_acc = -1, test_loss = 0;
    uint64_t samples = 0;
    double job_t0 = now_s(), last_draw = 0;
    if (planned) {
        plan_result res = {.test_acc = -1};
        status = train_planned(&o, pc, model, &train_all, &test, &res);
        if (status != 0)
            goto out;
        status = 1;
        train_time = res.train_time, last_loss = res.last_loss, test_acc = res.test_acc, test_loss = res.test_loss;
        samples = res.samples;
        goto trained;
    }
    for (int epoch = 1; epoch <= o.epochs; epoch++) {
        if (epoch > 1 && !o.fixed_shard && o.nshards > 1) {
            int was = parts;
            if (reshard(&o, pc, &train, &perm, &part, &parts, err, sizeof err) != 0) {
                fprintf(stderr, "psworker: %s\n", err);
                goto out;
            }
            if (parts != was) {
                per_shard = bsp ? total_n / (size_t)parts : train.n;
                if (per_shard == 0)
                    per_shard = train.n;
                if (bsp) {
                    /* the same global batch (B x M) and rounds per epoch as
                     * the job started with: the maths of the undisturbed job */
                    batch = ((size_t)o.batch * (size_t)o.nshards + (size_t)parts - 1) / (size_t)parts;
                    float *nx = realloc(bx, batch * (size_t)train.dim * sizeof *nx);
                    if (nx)
                        bx = nx;
                    uint8_t *ny = realloc(by, batch);
                    if (ny)
                        by = ny;
                    if (!gacc && batch > (size_t)o.batch)
                        gacc = malloc(ps_model_nparams(model) * sizeof *gacc);
                    if (!nx || !ny || (batch > (size_t)o.batch && !gacc)) {
                        fprintf(stderr, "psworker: out of memory\n");
                        goto out;
                    }
                    PS_LOG(PS_LOG_INFO, "shard %d/%d: %zu samples per step, so that rounds still average %d x %d",
                           o.shard, o.nshards, batch, o.nshards, o.batch);
                }
                steps = (per_shard + batch - 1) / batch;
            }
        }
        if (o.no_shuffle)
            for (size_t i = 0; i < train.n; i++)
                perm[i] = i;
        else
            ps_dataset_epoch_order(perm, train.n, o.seed, (uint32_t)o.shard, (uint64_t)epoch);
        double t0 = now_s(), loss_sum = 0, comm_s = 0;
        if (o.progress) /* drawn before the first step, which may wait for psd */
            progress_draw(&o, epoch, 0, steps, NAN, t0 - job_t0, samples, (size_t)(epoch - 1) * steps,
                          steps * (size_t)o.epochs);
        size_t done = 0;
        for (size_t st = 0; st < steps; st++) {
            if (g_stop_signal) {
                progress_clear(&o);
                status = stop_on_signal(pc, o.shard, o.nshards, epoch, st);
                goto out;
            }
            size_t start = st * batch;
            size_t cnt = per_shard - start < batch ? per_shard - start : batch;
            /* the shard may hold one sample more than per_shard: it waits for
             * the next epoch's order */
            ps_dataset_gather(&train, perm + start, cnt, bx, by);
            float loss = ps_model_train_step_pieces(model, bx, by, cnt, gacc);
            if (!isfinite(loss)) {
                progress_clear(&o);
                fprintf(stderr, "psworker: loss became %f at epoch %d step %zu; lower the learning rate\n",
                        (double)loss, epoch, st);
                goto out;
            }
            loss_sum += loss * (double)cnt;
            done += cnt;
            double tc = now_s();
            if (pbuf[0]) {
                /* pipelined: take the last step's parameters, send this
                 * gradient (the answer lands in the vectors the model just
                 * used) and compute the next one on the fresh ones */
                step_waits(&o, 1);
                rc = inflight ? psc_wait(pc) : 0;
                step_waits(&o, 0);
                if (inflight) {
                    pver[cur ^ 1] = psc_model_version(pc);
                } else {
                    memcpy(pbuf[cur ^ 1], pbuf[cur], np * sizeof(float));
                    pver[cur] = pver[cur ^ 1] = psc_model_version(pc);
                }
                /* the gradient's base: the version it was computed on */
                if (rc == 0 && (rc = psc_set_base(pc, pver[cur])) == 0 && (rc = psc_bind(pc, pbuf[cur], gbuf[cur])) == 0 &&
                    (rc = psc_pushpull_start(pc)) == 0) {
                    inflight = 1;
                    cur ^= 1;
                    ps_model_bind_params(model, pbuf[cur]);
                    ps_model_bind_grads(model, gbuf[cur]);
                }
            } else {
                step_waits(&o, 1);
                rc = psc_pushpull(pc);
                step_waits(&o, 0);
            }
            if (rc != 0) {
                progress_clear(&o);
                if (rc == PSC_EINTR && g_stop_signal) { /* the signal ended the step's wait */
                    status = stop_on_signal(pc, o.shard, o.nshards, epoch, st);
                    goto out;
                }
                fprintf(stderr, "psworker: epoch %d step %zu: %s\n", epoch, st, psc_errmsg(pc));
                goto out;
            }
            double now = now_s();
            comm_s += now - tc;
            /* psd hears of the training every report_s seconds
             * ($PSD_REPORT_INTERVAL, default 1), not only at epoch ends */
            if (psc_progress(pc, (uint32_t)(epoch - 1), (double)loss * (double)cnt, cnt) != 0) {
                progress_clear(&o);
                fprintf(stderr, "psworker: epoch %d: reporting progress: %s\n", epoch, psc_errmsg(pc));
                goto out;
            }
            if (o.progress && (now - last_draw >= 0.1 || st + 1 == steps)) {
                last_draw = now;
                progress_draw(&o, epoch, st + 1, steps, loss_sum / (double)done, now - job_t0, samples + done,
                              (size_t)(epoch - 1) * steps + st + 1, steps * (size_t)o.epochs);
            }
        }
        double tf = now_s();
        rc = inflight ? psc_wait(pc) : 0; /* the last step's parameters, for the evaluation */
        comm_s += now_s() - tf;
        if (inflight) {
            inflight = 0;
            cur ^= 1;
            ps_model_bind_params(model, pbuf[cur]);
            ps_model_bind_grads(model, gbuf[cur]);
        }
        if (rc != 0) {
            progress_clear(&o);
            fprintf(stderr, "psworker: epoch %d: %s\n", epoch, psc_errmsg(pc));
            goto out;
        }
        progress_clear(&o);
        double dt = now_s() - t0;
        train_time += dt;
        samples += done;
        last_loss = loss_sum / (double)(done ? done : 1);
        double rate = (double)done / (dt > 0 ? dt : 1e-9);
        if (o.eval)
            ps_model_evaluate(model, test.x, test.y, test.n, &test_loss, &test_acc);
        if (o.quiet) {
            /* nothing: the final JSON line says it all */
        } else if (o.eval) {
            fprintf(stderr,
                    "psworker %d/%d: epoch %d/%d  loss %.4f  test accuracy %.2f%%  %.2f s  %.0f samples/s  "
                    "version %" PRIu64 "\n",
                    o.shard, o.nshards, epoch, o.epochs, last_loss, 100 * test_acc, dt, rate, psc_model_version(pc));
        } else {
            fprintf(stderr, "psworker %d/%d: epoch %d/%d  loss %.4f  %.2f s  %.0f samples/s  version %" PRIu64 "\n",
                    o.shard, o.nshards, epoch, o.epochs, last_loss, dt, rate, psc_model_version(pc));
        }
        if (o.epoch_json) {
            printf("{\"epoch\": %d, \"train_seconds\": %.4f, \"epoch_seconds\": %.4f, \"wall_seconds\": %.4f, "
                   "\"comm_wait_seconds\": %.4f, \"train_loss\": %.6f, \"samples_per_second\": %.1f, \"version\": %" PRIu64
                   ", \"test_accuracy\": ",
                   epoch, train_time, dt, now_s() - job_t0, comm_s, last_loss, rate, psc_model_version(pc));
            if (o.eval)
                printf("%.6f, \"test_loss\": %.6f}\n", test_acc, test_loss);
            else
                printf("null, \"test_loss\": null}\n");
            fflush(stdout);
        }
        rc = psc_report(pc, (uint32_t)epoch, last_loss, o.eval ? test_acc : -1, test_loss, samples, rate);
        if (rc != 0) {
            fprintf(stderr, "psworker: reporting epoch %d: %s\n", epoch, psc_errmsg(pc));
            goto out;
        }
    }
trained:
    psc_close(pc);
    if (o.save_params) {
        FILE *f = fopen(o.save_params, "wb");
        if (!f || fwrite(ps_model_params(model), sizeof(float), np, f) != np || fclose(f) != 0) {
            fprintf(stderr, "psworker: cannot write %s: %s\n", o.save_params, strerror(errno));
            goto out;
        }
    }

    print_summary(&o, pc, last_loss, test_acc, test_loss, train_time, samples);
    fflush(stdout);
    status = 0;
out:
    free(perm);
    free(bx);
    free(gacc);
    free(by);
    pthread_mutex_lock(&g_wait.lock); /* the watcher asks it no more */
    g_wait.pc = NULL;
    pthread_mutex_unlock(&g_wait.lock);
    psc_free(pc); /* before the model: its vectors may be the library's */
    ps_model_free(model);
    for (int i = 0; i < 2; i++) {
        free(pbuf[i]);
        free(gbuf[i]);
    }
    ps_dataset_free(&train_all);
    ps_dataset_free(&train);
    ps_dataset_free(&test);
    return status;
}
