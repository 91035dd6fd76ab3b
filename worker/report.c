/* report.c - what psworker tells: the live progress line on a terminal
 * (with a thread that adds how long a step has waited for psd, and for
 * whom), each epoch's line, JSON line and REPORT to psd, and the summary,
 * the last line on stdout. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "worker.h"

double pw_now(void)
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

void pw_progress_draw(const wopts *o, int epoch, size_t step, size_t steps, double epoch_loss, double job_s,
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

void pw_progress_clear(const wopts *o)
{
    if (o->progress) {
        pthread_mutex_lock(&g_wait.lock);
        g_wait.line[0] = '\0';
        fputs("\r\033[K", stderr);
        pthread_mutex_unlock(&g_wait.lock);
    }
}

void pw_step_waits(const wopts *o, int begins)
{
    if (!o->progress)
        return;
    pthread_mutex_lock(&g_wait.lock);
    g_wait.since = begins ? pw_now() : 0;
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
        double t = pw_now() - g_wait.since;
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

void pw_progress_start(const wopts *o, psc_client *pc)
{
    g_wait.pc = pc; /* set before the watcher starts, cleared before psc_free */
    pthread_t watcher;
    if (o->progress && pthread_create(&watcher, NULL, wait_watch, NULL) == 0)
        pthread_detach(watcher);
}

void pw_progress_stop(void)
{
    pthread_mutex_lock(&g_wait.lock); /* the watcher asks it no more */
    g_wait.pc = NULL;
    pthread_mutex_unlock(&g_wait.lock);
}

int pw_epoch_done(const wopts *o, psc_client *pc, ps_model *model, const ps_dataset *test, int epoch, double dt,
                  double loss_sum, size_t done, double comm_s, double job_t0, int planned, pw_result *res)
{
    res->train_time += dt;
    res->samples += done;
    res->last_loss = loss_sum / (double)(done ? done : 1);
    double rate = (double)done / (dt > 0 ? dt : 1e-9);
    const char *tag = planned ? " (psd's plan)" : "";
    if (o->eval)
        ps_model_evaluate(model, test->x, test->y, test->n, &res->test_loss, &res->test_acc);
    pw_progress_clear(o);
    if (o->quiet) {
        /* the final JSON line says it all */
    } else if (o->eval) {
        fprintf(stderr,
                "psworker %d/%d: epoch %d/%d  loss %.4f  test accuracy %.2f%%  %.2f s  %.0f samples/s  version %" PRIu64
                "%s\n",
                o->shard, o->nshards, epoch, o->epochs, res->last_loss, 100 * res->test_acc, dt, rate,
                psc_model_version(pc), tag);
    } else {
        fprintf(stderr, "psworker %d/%d: epoch %d/%d  loss %.4f  %.2f s  %.0f samples/s  version %" PRIu64 "%s\n",
                o->shard, o->nshards, epoch, o->epochs, res->last_loss, dt, rate, psc_model_version(pc), tag);
    }
    if (o->epoch_json) {
        printf("{\"epoch\": %d, \"train_seconds\": %.4f, \"epoch_seconds\": %.4f, \"wall_seconds\": %.4f, "
               "\"comm_wait_seconds\": %.4f, \"train_loss\": %.6f, \"samples_per_second\": %.1f, \"version\": %" PRIu64
               ", \"test_accuracy\": ",
               epoch, res->train_time, dt, pw_now() - job_t0, comm_s, res->last_loss, rate, psc_model_version(pc));
        if (o->eval)
            printf("%.6f, \"test_loss\": %.6f}\n", res->test_acc, res->test_loss);
        else
            printf("null, \"test_loss\": null}\n");
        fflush(stdout);
    }
    int rc = psc_report(pc, (uint32_t)epoch, res->last_loss, o->eval ? res->test_acc : -1, res->test_loss,
                        res->samples, rate);
    if (rc == PSC_EINTR && pw_stop_signal)
        return 0; /* a stop signal ended the wait: the loop stops at its next step and says why */
    if (rc != 0) {
        fprintf(stderr, "psworker: reporting epoch %d: %s\n", epoch, psc_errmsg(pc));
        return -1;
    }
    return 0;
}

void pw_summary(const wopts *o, psc_client *pc, const pw_result *res)
{
    printf("{\"epochs\": %d, \"train_loss\": %.6f, \"test_accuracy\": ", o->epochs, res->last_loss);
    if (o->eval)
        printf("%.6f, \"test_loss\": %.6f", res->test_acc, res->test_loss);
    else
        printf("null, \"test_loss\": null");
    printf(", \"seconds\": %.3f, \"samples\": %" PRIu64 ", \"samples_per_second\": %.1f, \"version\": %" PRIu64
           ", \"mode\": \"%s\", \"shard\": \"%d/%d\", \"model\": \"%s\", \"reconnects\": %" PRIu64
           ", \"dropped_pushes\": %" PRIu64 ", \"wire\": \"%s\", \"shm\": %s, \"hogwild\": %s, \"servers\": %u}\n",
           res->train_time, res->samples, (double)res->samples / (res->train_time > 0 ? res->train_time : 1e-9),
           psc_model_version(pc), psc_mode(pc), o->shard, o->nshards, o->model, psc_reconnects(pc), psc_dropped(pc),
           psc_wire(pc), psc_shm(pc) ? "true" : "false", psc_hogwild(pc) ? "true" : "false", psc_servers(pc));
}
