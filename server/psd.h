/* psd.h - psd's state: the server, its connections, workers, model and
 * consistency policy. Everything here is owned by the one libuv loop thread;
 * nothing is locked. */
#ifndef PSD_H
#define PSD_H

#include <stdint.h>
#include <uv.h>

#include "common/auth.h"
#include "common/config.h"
#include "proto/msg.h"
#include "optim.h"

typedef struct psd psd;
typedef struct srv_conn srv_conn;

/* ---- model: parameters in copy-on-write blocks ------------------------- */

/* The parameters live in blocks of SRV_BLK_FLOATS floats (4 MiB, psworker's
 * chunk size), each reference-counted. A reply that sends parameters holds
 * references to the blocks it covers until its write is done; an update of
 * a block that a reply still holds writes the new values into a fresh
 * block (the optimizer reads the old one and writes the new, so nothing is
 * copied first) and the reply goes on sending the old, consistent values.
 * So no reply copies the model, and an update copies nothing but the part
 * of a shared block outside its range. */
#define SRV_BLK_SHIFT 20
#define SRV_BLK_FLOATS ((uint64_t)1 << SRV_BLK_SHIFT)

typedef struct srv_blk {
    uint32_t refs;          /* the model's own reference counts as one */
    size_t cap;             /* floats in w */
    float *w;               /* 64-byte aligned */
    struct srv_blk *next;   /* in the free pool */
} srv_blk;

/* A whole-model snapshot: references to every block of one version (psctl
 * pin, checkpoints, DC-ASGD's base). Taking one costs a reference per
 * block; the blocks are copied only as updates come. */
typedef struct srv_snap {
    uint32_t refs;
    uint64_t version;   /* model version these values belong to */
    size_t n;           /* floats */
    size_t nblk;
    srv_blk *blk[];
} srv_snap;

typedef struct srv_model {
    int has_layout;      /* layout fixed (by the first worker's hello) */
    int initialized;     /* initial values received */
    ps_layout layout;
    uint64_t fp;         /* fingerprint of layout */
    size_t nblk;         /* blocks; 0 before the layout */
    srv_blk **blk;       /* current parameters: block b holds [b*SRV_BLK_FLOATS, ...) */
    uint64_t version;    /* updates applied */
    uint64_t stamp;      /* bumped by every write to the blocks, a push
                          * chunk without fin (no new version) too: what a
                          * cache of their values is keyed on */
    srv_optim opt;
} srv_model;

/* A piece of an update that lies in one block: srv_model_write_begin()
 * makes it; the update reads wi and writes wo (the same memory unless the
 * block is shared), then srv_model_write_end() drops the old block. */
typedef struct srv_wseg {
    float *wo;
    const float *wi;
    size_t len;      /* floats from the requested offset in this block */
    srv_blk *old;    /* the shared block replaced, or NULL */
} srv_wseg;

/* ---- workers ------------------------------------------------------------ */

enum srv_worker_state { SRV_W_CONNECTED, SRV_W_LEFT, SRV_W_LOST };

/* A receive buffer handed between a connection and a worker's BSP
 * gradient (see srv_worker.kept). */
typedef struct srv_rbuf {
    uint8_t *mem;
    size_t cap;
} srv_rbuf;

/* One per shard ever seen; kept after the worker goes, for psctl. */
typedef struct srv_worker {
    uint32_t shard, nshards;
    int state;               /* enum srv_worker_state */
    srv_conn *conn;          /* NULL unless connected */
    char addr[64];           /* peer address of the last connection */
    int shm;                 /* that connection's tensors go through shared memory */
    uint64_t pushes;         /* gradient steps pushed (fin chunks) */
    uint64_t joined_ms, last_seen_ms;
    int has_report;
    uint32_t epoch;
    double loss, acc, tloss, rate;
    int has_acc;
    uint64_t samples;
    uint64_t clock;          /* SSP clock: steps pushed, counted from the job's start */
    uint64_t staleness;      /* versions between its last push's base and the model */
    char why[96];            /* why it left or was declared dead */
    /* BSP */
    uint64_t round;          /* round this worker last pushed into */
    int round_fin;           /* its push for `round` is complete */
    float *slot;             /* its gradient for the round (shard-order sums):
                              * what arrived in pieces other than whole blocks,
                              * and zeros; NULL until needed */
    int slot_clean;          /* slot holds zeros outside what this round wrote */
    /* The blocks of this round's gradient that arrived each in one float32
     * frame stay where they arrived: the receive buffer holding one is
     * taken from the connection (which gets a spare in exchange), so a
     * push is never copied. kept_at[b] points at block b's values in
     * kept[b] (NULL: block b is in slot); spare holds buffers of rounds
     * gone by, for the connection to read into next. */
    srv_rbuf *kept;
    const float **kept_at;
    size_t nkept;            /* entries of kept and kept_at: the model's blocks */
    srv_rbuf *spare;         /* up to nkept + 1 */
    size_t nspare;
    /* DC-ASGD: the parameters this worker last pulled */
    srv_snap *base_snap;
} srv_worker;

/* ---- consistency policies ----------------------------------------------- */

/* A consistency mode. It decides when pushes are applied and rounds close;
 * it knows nothing of sockets. */
typedef struct srv_policy_ops {
    const char *name;
    /* A push chunk from worker w for range [off, off+n) against version base.
     * Returns 0 when accepted (applied or kept for the round), or a negative
     * PS_E* code (nothing was changed) with err filled. */
    int (*push)(psd *s, srv_worker *w, uint64_t base, uint64_t off, const float *g, uint64_t n, int fin,
                char *err, size_t errlen);
    /* w left (bye, closed, declared dead). */
    void (*worker_left)(psd *s, srv_worker *w);
    /* w (re)joined. */
    void (*worker_joined)(psd *s, srv_worker *w);
    /* May a pull from c for version >= min be answered now? NULL: when the
     * model is initialised and at version >= min. */
    int (*pull_ready)(psd *s, srv_conn *c, uint64_t min);
    /* psd's periodic tick (every 250 ms): retries what memory stopped.
     * NULL: nothing to do. */
    void (*tick)(psd *s);
    void (*destroy)(psd *s);
} srv_policy_ops;

extern const srv_policy_ops srv_policy_asgd;
extern const srv_policy_ops srv_policy_bsp;
extern const srv_policy_ops srv_policy_ssp;

/* ---- connections --------------------------------------------------------- */

#define SRV_PARKED_MAX 64 /* pulls one connection may have waiting */

/* A pull waiting for a model version (BSP) or for the initial values. */
typedef struct srv_parked {
    uint64_t id, min, off, len;
    uint32_t rdt;            /* ps_dtype of the reply's data */
    struct srv_parked *next;
} srv_parked;

struct srv_auth; /* a hello waiting for the answer to its challenge (auth.c) */

struct srv_conn {
    uv_tcp_t tcp;            /* must stay first: handle->data is not used */
    psd *srv;
    uint64_t cid;            /* connection number, for logs */
    char addr[64];
    int same_host;           /* the peer is on psd's machine: a loopback
                              * address, or the connection's own local one */
    int role;                /* ps_role; PS_ROLE_NONE until WELCOME */
    struct srv_auth *auth;   /* CHALLENGE sent, AUTH awaited; NULL otherwise */
    int admin_readonly;      /* admin that proved the workers' token (no
                              * admin_token_file): status and metrics only */
    srv_worker *worker;      /* set for a worker after hello */
    uint8_t *rbuf;           /* read buffer: frames accumulate here */
    size_t rpos, rlen, rcap; /* unprocessed bytes are rbuf[rpos..rlen) */
    size_t want_end;         /* a big frame is incomplete: it ends at rbuf[want_end]
                              * and reads stop there (0: none) */
    size_t frame_end;        /* the frame being handled ends at rbuf[frame_end] */
    int rbuf_given;          /* its handler took rbuf (srv_conn_give_rbuf) */
    msgpack_zone zone;       /* unpack zone, cleared per message */
    float *wide;             /* bfloat16 data of its last push, as float32, or a
                              * copy of one from shm (kept, so neither allocates
                              * in steady state) */
    size_t wide_cap;         /* floats */
    float *shm;              /* the worker's shared segment (shm.c): its
                              * gradient's shm_params floats; NULL: none */
    float *shm_out;          /* where psd writes the parameters it answers with */
    uint64_t shm_params;
    void *shm_map[2];        /* the two mappings they lie in */
    size_t shm_maplen[2];
    srv_parked *parked;      /* pulls waiting for a version */
    srv_snap *pinned;        /* admin: the snapshot its pulls are answered from
                              * (ADMIN pin, psctl save); NULL = the current one */
    uint32_t nparked;        /* entries in parked, at most SRV_PARKED_MAX */
    int closing;             /* uv_close called or about to be */
    int held;                /* frames wait while an update is applied off the loop */
    int free_later;          /* closed while its push is applied off the loop:
                              * freed when that is done */
    int close_after_write;   /* close once queued writes are flushed */
    char close_reason[96];   /* why psd closes it, for the worker's record */
    uint64_t connected_ms;
    uint64_t last_msg_ms;    /* when its last message arrived (idle_timeout) */
    srv_conn *prev, *next;   /* psd.conns list */
};

/* ---- counters ----------------------------------------------------------- */

#define SRV_HIST_MAX 16

/* A Prometheus-style histogram: cumulative buckets at fixed upper bounds. */
typedef struct srv_hist {
    unsigned n;                       /* bounds in use */
    double bounds[SRV_HIST_MAX];      /* upper bounds, ascending */
    uint64_t counts[SRV_HIST_MAX + 1]; /* per bucket (not cumulative); last = +Inf */
    uint64_t total;
    double sum;
} srv_hist;

void srv_hist_init(srv_hist *h, const double *bounds, unsigned n);
void srv_hist_observe(srv_hist *h, double v);

typedef struct srv_stats {
    uint64_t pushes, pulls, bytes_in, bytes_out, rounds, connections;
    uint64_t rejected[32];   /* by error code (index = -PS_E*) */
    uint64_t init_ms;        /* when the model got its initial values */
    uint64_t dropped_pushes; /* pushes for a BSP round already closed */
    uint64_t worker_joins, worker_leaves, worker_deaths;
    srv_hist staleness;      /* versions between a push's base and the model */
    srv_hist round_seconds;  /* BSP round durations */
    uint64_t checkpoints, checkpoint_failures;
    uint64_t checkpoint_ms;  /* when the last checkpoint was written (0: never) */
    uint64_t checkpoint_version;
    uint64_t sanitized_pushes;    /* non-finite pushes sanitised (nonfinite = clip) */
    uint64_t disconnects_output;  /* connections cut over max_output_buffer */
    uint64_t disconnects_idle;    /* admin connections closed by idle_timeout */
    /* rates, recomputed by the 1 s timer */
    uint64_t last_pushes, last_pulls;
    double push_rate, pull_rate;
} srv_stats;

/* A setting from psd's command line (--listen, --set, ...); kept so that a
 * reload applies them again over the file. key and value point into argv. */
typedef struct srv_setting {
    const char *key, *value;
} srv_setting;

struct srv_http;
struct srv_ckpt_wait;

/* The gradient of an update of [off, off+n): a push's floats, g[i] for
 * parameter off+i; or, when nsrc > 0, a BSP round's mean, inv times the sum
 * of the nsrc sources in that order, source k's value of parameter j being
 * blk[k][j's block][j's offset in it] where blk[k] and that entry are set,
 * else src[k][j] (a whole-model array); zero_src
 * clears src[0] where it was read (the arrival-order sum, ready for the
 * next round). */
typedef struct srv_grad {
    const float *g;
    float **src;
    const float *const *const *blk; /* per source, NULL or per block: where
                                     * that block's values are instead of src */
    const float **xs;               /* room for nsrc pointers (many sources) */
    unsigned nsrc;
    float inv;
    int zero_src;
} srv_grad;

/* A push being applied off the loop thread (policy.c): while one is, psd
 * goes on reading and writing every connection but handles no message, so
 * nothing else touches the model or the optimizer; pulls answered meanwhile
 * were queued before and send the blocks of the version before it. */
typedef struct srv_apply {
    uv_work_t req;           /* [off, split) */
    uv_work_t req2;          /* [split, off+n), when the update is split */
    uint64_t split;
    int parts;               /* halves still running */
    psd *s;
    srv_conn *c;             /* the pushing connection; its reads stop */
    srv_worker *w;
    srv_optim_step st;
    srv_grad grad;           /* a push's floats (in c's receive buffer) or a round's mean */
    uint64_t off, n;
    int fin;                 /* the push's last chunk (asgd, ssp: a new version) */
    int round;               /* the push closed a BSP round: its mean is applied */
    size_t first, nblk;      /* blocks touched */
    srv_blk **old, **fresh;  /* the model's blocks and their new values (NULL:
                              * updated in place); room for cap of each */
    size_t cap;
    /* the reply, filled in by handle.c */
    uint64_t id, poff, plen, min;
    uint32_t type;
    uint32_t rdt;
} srv_apply;

/* Frees what updates off the loop keep between them (at exit). */
void srv_apply_free(psd *s);
/* Frees what a worker keeps of its BSP gradients (at exit). */
void srv_worker_free_round(srv_worker *w);

/* A policy's push returns this when the update goes on off the loop: the
 * reply is sent by srv_push_done(). */
#define SRV_PENDING 1

struct psd {
    uv_loop_t *loop;
    ps_config cfg;
    char config_path[PS_CONFIG_PATH_MAX];
    ps_token token;          /* the workers' secret (token_file); len 0 = none */
    ps_token admin_token;    /* the admins' secret (admin_token_file); len 0 = none */
    uv_tcp_t listener;
    int listening;
    int port;                /* bound port */
    uv_signal_t sigint, sigterm, sighup;
    const srv_setting *cli_sets; /* the command line's settings, in order */
    int ncli_sets;
    int paused;              /* ADMIN pause: workers' pulls are parked until resume */
    struct srv_http *http;   /* the /metrics HTTP endpoint; NULL when off */
    struct srv_dash *dash;   /* the run's history for the dashboard (dashboard.c) */
    struct srv_ckpt_wait *ckpt_waits; /* ADMIN checkpoint requests not answered yet */
    uv_timer_t tick;         /* 250 ms: liveness, checkpoints, rates */
    uint64_t last_rate_ms;
    int stopping;
    uint64_t start_ms;
    srv_conn *conns;
    uint32_t nconns;
    uint64_t next_cid;
    srv_worker **workers;    /* indexed by shard; size nworkers_cap */
    uint32_t nworkers_cap;
    uint32_t nshards;        /* m announced by workers (0 until the first) */
    srv_conn *init_owner;    /* the worker asked to send initial values */
    srv_model model;
    const srv_policy_ops *policy;
    void *policy_state;
    srv_stats stats;
    float *scratch;          /* model-sized scratch for transformed gradients */
    uint64_t *restored_clocks; /* SSP clocks per shard from a checkpoint */
    uint32_t nrestored;
    int checkpoint_busy;     /* a checkpoint is being written in the pool */
    srv_apply *applying;     /* a push applied off the loop; NULL: none */
    srv_apply *apply_job;    /* kept for the next one: none allocates */
    int reload_pending;      /* SIGHUP came while applying: reload after */
    uv_work_t checkpoint_req;
    ps_buf enc;              /* encode scratch for replies */
    float **push_buf;        /* while a policy handles a push whose data psd
                              * widened from bfloat16: the connection's buffer
                              * holding it, which the policy may take in
                              * exchange for another (or NULL) of at least
                              * *push_buf_cap floats; NULL otherwise */
    size_t *push_buf_cap;
    ps_layout scratch_layout; /* where a hello's layout is decoded */
};

/* ---- functions ----------------------------------------------------------- */

uint64_t srv_now_ms(void);

/* main.c */
/* Stops psd as SIGTERM does: closes the signal handlers, the tick timer and
 * the /metrics endpoint, tells systemd (STOPPING=1) and calls srv_stop();
 * the loop then ends. Does nothing when psd is already stopping. */
void srv_shutdown(psd *s, const char *why);

/* net.c */
int srv_listen(psd *s);
void srv_stop(psd *s);
/* Queues one reply. When m has tensor data (PARAMS), the floats
 * [m->off, m->off + m->ndata) are sent from the blocks blk (the model's or a
 * snapshot's), which keep a reference until the write is done: nothing is
 * copied. blk is NULL for other messages. On failure the connection is
 * closed. */
void srv_send(srv_conn *c, const ps_msg *m, srv_blk *const *blk);
/* Queues an ERROR reply for request id; fatal closes after it is sent. */
void srv_send_error(srv_conn *c, uint64_t id, int code, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void srv_conn_close(srv_conn *c);
/* For the handler of a frame that ends the bytes read so far: hands the
 * receive buffer holding it to the caller (*out) and gives the connection
 * repl instead (mem NULL: it allocates when it reads next). data is where
 * the handler will read the frame's contents (it must lie in the buffer).
 * Returns 0, or -1 when more bytes follow the frame in the buffer or data
 * lies elsewhere (nothing changes). */
int srv_conn_give_rbuf(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out);
/* Handles what held connections received while an update was applied off
 * the loop, and lets them read again. */
void srv_resume_held(psd *s);
/* Frees a connection closed while its push was applied off the loop. */
void srv_conn_free(srv_conn *c);

/* handle.c */
/* Handles one decoded message from c. */
void srv_handle(srv_conn *c, ps_msg *m);
/* Accepts hello m on c (checked against the job: shard, layout, ...) and
 * answers WELCOME, with sproof (PS_AUTH_MAC_LEN bytes) when it is not NULL,
 * or a fatal ERROR. For a hello that needed no authentication, or whose
 * AUTH has been verified. */
void srv_hello_accept(srv_conn *c, ps_msg *m, const uint8_t *sproof);
/* The push of a applied off the loop is done: replies to it. */
void srv_push_done(psd *s, const srv_apply *a);
/* Frees the parked-pull entries kept for reuse (at exit). */
void srv_parked_free_spare(void);
void srv_narrow_free_spare(void); /* net.c: spare bfloat16 reply buffers */
/* Answers every parked pull whose version is now available. */
void srv_answer_parked(psd *s);
/* Answers c's parked pulls that can be answered. */
void srv_conn_answer_parked(srv_conn *c);
/* A connection is going away: detach it from its worker, drop its pulls. */
void srv_conn_detach(srv_conn *c, int state, const char *why);

/* auth.c */
/* Reads token_file and admin_token_file into s->token and s->admin_token.
 * Returns 0, or a negative PS_E* code with a message in err. */
int srv_auth_load(psd *s, char *err, size_t errlen);
/* psd requires a token: keeps hello m and answers CHALLENGE. */
void srv_auth_challenge(srv_conn *c, ps_msg *m);
/* AUTH m answers c's challenge: verifies it and accepts the kept hello, or
 * sends a fatal ERROR AUTH. */
void srv_auth_answer(srv_conn *c, ps_msg *m);
/* Drops what c keeps for a challenge (when it closes). */
void srv_auth_free(srv_conn *c);

/* model.c */
int srv_model_set_layout(srv_model *m, const ps_layout *l, const ps_config *cfg);
void srv_model_free(srv_model *m);
/* Counts one applied update: version++. */
void srv_model_bump(srv_model *m);
/* The current values from parameter off on: a pointer and, in *len, how
 * many of the n wanted follow it in the same block (at least 1). */
const float *srv_model_at(const srv_model *m, uint64_t off, uint64_t n, size_t *len);
/* Starts writing [off, off+n): fills seg for the part in off's block
 * (seg->len floats), giving that block a fresh copy when a reply or a
 * snapshot holds it. Returns 0 or PS_ENOMEM (nothing changed). */
int srv_model_write_begin(srv_model *m, uint64_t off, uint64_t n, srv_wseg *seg);
void srv_model_write_end(srv_model *m, srv_wseg *seg);
/* An update of blocks [first, first+nblk) in three steps, so that running
 * out of memory changes nothing. srv_model_reserve() fills old[i] with the
 * model's block first+i and fresh[i] with a new block for it when a reply
 * or a snapshot shares it (NULL: the update may write it in place), and
 * returns 0, or PS_ENOMEM with nothing held. The update then reads old and
 * writes fresh (or old), copying what it leaves alone of a fresh block
 * from old; srv_model_install() puts the fresh blocks in the model. */
int srv_model_reserve(const srv_model *m, size_t first, size_t nblk, srv_blk **old, srv_blk **fresh);
void srv_model_install(srv_model *m, size_t first, size_t nblk, srv_blk *const *old, srv_blk *const *fresh);

/* As srv_model_at, for any block array (the model's or a snapshot's). */
const float *srv_blocks_at(srv_blk *const *blk, uint64_t off, uint64_t n, size_t *len);
/* Frees the pool of free blocks (at exit). */
void srv_blk_pool_free(void);
/* A block of cap floats, uninitialised, from the pool when it has one. */
srv_blk *srv_blk_fresh(size_t cap);
srv_blk *srv_blk_ref(srv_blk *b);
void srv_blk_unref(srv_blk *b);
/* A snapshot of the current version; NULL when out of memory. */
srv_snap *srv_snap_take(srv_model *m);
srv_snap *srv_snap_ref(srv_snap *s);
void srv_snap_unref(srv_snap *s);
/* As srv_model_at, for a snapshot. */
const float *srv_snap_at(const srv_snap *s, uint64_t off, uint64_t n, size_t *len);

/* status.c */
int srv_pack_status(msgpack_packer *pk, void *arg);
int srv_metrics_text(psd *s, ps_buf *out);

/* ---- shared memory with a local worker (shm.c) --------------------------- */

/* Models up to this size may use it: one block, so a reply's copy into the
 * segment is at most 4 MiB on the event loop. */
#define SRV_SHM_MAX_PARAMS SRV_BLK_FLOATS
/* An rdt value that never comes off the wire: answer into the segment. */
#define SRV_RDT_SHM 0x100u

/* Maps the segment a worker's hello offers (m's "shm": /proc/<pid>/fd/<fd>)
 * when it is a memfd sealed against shrinking and growing that holds the
 * gradient and the parameters, nparams floats each, where the hello says
 * (by default [0, nparams) and [nparams, 2 nparams) of a memfd of exactly
 * that size). 0, or -1 with the reason in why. */
int srv_shm_attach(srv_conn *c, const ps_msg *m, uint64_t nparams, char *why, size_t whylen);
void srv_shm_detach(srv_conn *c);

#endif
