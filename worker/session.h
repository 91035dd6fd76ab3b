/* session.h - a worker's connection to psd: handshake, initial values,
 * pushes and pulls (chunked for big models), a heartbeat thread, and
 * reconnecting with exponential backoff and jitter when psd goes away.
 *
 * The training loop calls ps_session_step() once per batch; when it returns
 * an error that ps_session_recoverable() accepts, the loop calls
 * ps_session_reconnect() and carries on with the parameters it gets back. */
#ifndef PS_SESSION_H
#define PS_SESSION_H

#include <pthread.h>
#include <stdint.h>

#include "common/client.h"
#include "model.h"

/* One connection: to psd, or with a model split over several psd
 * instances (--server A,B,...), to the one holding its part [lo, hi)
 * (links[i] holds part i). */
typedef struct ps_link {
    ps_client cl;
    pthread_mutex_t lock;    /* the client's send lock */
    pthread_cond_t wake;     /* wakes the heartbeat thread */
    pthread_t hb_thread;
    int hb_running, hb_stop;
    uint64_t hb_interval_ms; /* a third of this psd's heartbeat_timeout */
    char server[300];        /* "host:port" */
    uint64_t lo, hi;         /* that part: values [lo, hi) of the flat vector */
    ps_layout layout;        /* its layout (the model's own with one psd) */
    char mode[16];
    uint64_t version;        /* version of this part's parameters we hold */
    int shm_ok;              /* this psd mapped our segment */
} ps_link;

typedef struct ps_session {
    ps_link *links;          /* one per psd, in part order */
    uint32_t nlinks;
    uint32_t err_link;       /* the link whose error ps_session_error tells */
    /* what the worker is */
    uint32_t shard, nshards;
    ps_model *model;
    uint64_t seed;
    int timeout_ms;          /* per request */
    const uint8_t *token;    /* the secret proved to psd (--token-file); set
                              * after ps_session_init; NULL: none */
    size_t token_len;
    int reconnect_ms;        /* give up reconnecting after this long */
    /* what psd said */
    char mode[16];
    int bsp;                 /* pulls wait for the round the push went into */
    uint64_t version;        /* model version of the parameters we hold (of
                              * the first part, with several psd) */
    uint64_t reconnects;
    uint64_t dropped;        /* our pushes psd dropped (BSP round closed) */
    int have_params;         /* we hold parameters worth offering as init */
    uint8_t *held;           /* receive buffer the model's parameters point into */
    size_t held_cap;
    float *held_wide;        /* or the widened bfloat16 buffer they point into */
    size_t held_wide_cap;
    uint32_t want_dt;        /* wire type asked for (--wire); psd's welcome decides */
    int want_shm;            /* offer psd a shared segment (--shm on, the default) */
    int shm_fd;              /* the sealed memfd; -1: none yet */
    float *shm;              /* its mapping: n gradient floats, then n parameter floats */
    int shm_ok;              /* some psd mapped it: pushpulls go through it */
    int shm_logged;
    /* pipelining: the comm thread runs one step's push-and-pull while the
     * training thread computes the next gradient */
    int comm_running, comm_stop, comm_pending, comm_done, comm_rc;
    pthread_t comm_thread;
    pthread_mutex_t comm_mu;
    pthread_cond_t comm_cv;
    const float *comm_grads;  /* gradient on its way */
    uint64_t comm_base;       /* the model version it was computed on */
    const float *comm_data;   /* parameters that came back (in the client's buffer) */
    uint64_t comm_version;
    float *gbuf[2];           /* gradients, alternately computed and sent */
    int gcur;
    char err[600];            /* a session-level error (ps_session_init, modes) */
} ps_session;

/* Fills ss from the model and options; no connection yet. server is
 * "host:port", or "host:port,host:port,...": a model split over that many
 * psd instances, part i (proto/layout.h ps_part_bounds) on the i-th.
 * Returns 0, or PS_EINVAL with the reason in ps_session_error() (a bad
 * list, a model too small for the split or whose layout does not fit the
 * protocol). */
int ps_session_init(ps_session *ss, const char *server, uint32_t shard, uint32_t nshards, ps_model *model,
                    uint64_t seed, int timeout_ms, int reconnect_ms);
void ps_session_free(ps_session *ss);

/* Connects, says hello, sends initial values if psd asks (seeded values the
 * first time, the parameters we hold after that), pulls the model and
 * starts the heartbeat thread; with several psd, each of those not
 * connected (all of them the first time), and every psd must run the same
 * mode. Returns 0 or a negative code; the reason is
 * in ps_session_error(). */
int ps_session_open(ps_session *ss);

/* Pushes the model's gradients and pulls the parameters back into the
 * model (BSP: at the version after the round). With several psd, every
 * part's request is sent before any reply is read, so the parts travel
 * and are applied at the same time. */
int ps_session_step(ps_session *ss);

/* Turns pipelining on or off: with it on, ps_session_step hands the
 * gradient to a comm thread and returns at once, so the next gradient is
 * computed while this one travels (on parameters one step stale). Only for
 * asgd and ssp, models of at most 2^20 parameters and one psd (PS_EINVAL
 * otherwise).
 * Call after ps_session_open. */
int ps_session_set_pipeline(ps_session *ss, int on);

/* Waits for the step in flight (pipelining) and takes the parameters it
 * brought; returns its error, if any. A no-op without pipelining. */
int ps_session_flush(ps_session *ss);

/* Reports epoch statistics to psd. */
int ps_session_report(ps_session *ss, uint32_t epoch, double loss, int has_acc, double acc, double tloss,
                      uint64_t samples, double rate);

/* The job's live shards, from psd's STATUS: shards 0..M-1 less those psd
 * declared lost (a worker that died and has not come back; one that said
 * bye or has not joined yet still counts). *rank is this worker's index
 * among them, *count how many there are: taking slice *rank of *count of
 * the data, the survivors of a dead worker share its data between them. */
int ps_session_live_shards(ps_session *ss, uint32_t *rank, uint32_t *count);

/* True when rc means the connection is gone or psd is restarting, so
 * reconnecting may help; false for errors that would repeat (a layout
 * psd does not hold, a bad shard, a protocol version). */
int ps_session_recoverable(const ps_session *ss, int rc);

/* Reconnects with exponential backoff (100 ms doubling to 5 s, with
 * jitter) until it works or reconnect_ms have passed: with several psd,
 * only to the one whose connection failed. */
int ps_session_reconnect(ps_session *ss);

/* Says bye and closes. */
void ps_session_close(ps_session *ss);

const char *ps_session_error(const ps_session *ss);

#endif
