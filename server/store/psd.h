/* psd.h - psd's state: the server, its connections, workers, model and
 * consistency policy, the types every layer shares; and the functions of
 * the bottom layer, the store (stats.c, settings.c, model.c, shm.c). Each
 * layer above declares its own in its header (update.h, policy.h,
 * status.h, reply.h, session.h, handle.h, admin.h, net.h; docs/DESIGN.md).
 * Everything here is owned by the one libuv loop thread; nothing is
 * locked. Most of struct psd's fields are written by one file or layer
 * alone, named at the field; the others read them and call its functions
 * (docs/DESIGN.md lists them; the layers test fails on a write
 * elsewhere). */
#ifndef PSD_H
#define PSD_H

#include <stdint.h>
#include <uv.h>

#include "common/auth.h"
#include "server/config/config.h"
#include "proto/codec.h"
#include "proto/msg.h"
#include "server/model/optim.h"
#include "server/tables/table.h"

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
    /* Hogwild! (hogwild.c): w is a memfd's mapping, shared with workers */
    _Atomic uint64_t *hw_steps; /* the step counter after the values; NULL:
                                 * an ordinary block */
    int hw_fd;              /* the memfd (WELCOME's "hogwild") */
    size_t hw_len;          /* bytes mapped */
    /* A receive buffer the replication log took with a push's gradient in
     * it (srv_blk_adopt; w NULL): kept with the block's last reference for
     * a connection's next receive (srv_rbuf_spare) */
    uint8_t *ext;
    size_t ext_cap;
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
    srv_blk *hw;         /* Hogwild!: blk[0], the shared segment (hogwild.c);
                          * NULL: none. Updated in place, never copied on
                          * write; its counter is the version (srv_model_sync) */
    /* Upper bounds of |value| over the parameters (bound_w) and the
     * optimizer's state buffers 1 and 2 (srv_optim_state_buffers' order),
     * kept by the update engine from what its updates write (update.c).
     * bound_ok: 1 they hold; 0 not measured since values came from
     * elsewhere (set_layout, srv_model_write_end, a checkpoint: whoever
     * writes blocks or state outside the engine clears it); -1 measured and
     * of no use (a negative sum of squares). */
    int bound_ok;
    float bound_w, bound_s1, bound_s2;
    /* The range written since the replication log last shipped it
     * (srv_model_mark; empty when dirty_hi <= dirty_lo). */
    uint64_t dirty_lo, dirty_hi;
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

/* A receive buffer handed between a connection and the BSP policy, which
 * keeps a worker's gradient where it arrived until the round closes. */
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
    int tshm;                /* ... and its table requests may (PROTOCOL.md 13.9) */
    uint64_t pushes;         /* gradient steps pushed (fin chunks) */
    uint64_t joined_ms, last_seen_ms;
    int has_report;
    uint32_t epoch;
    double loss, acc, tloss, rate;
    int has_acc;
    uint64_t samples;
    uint64_t clock;          /* SSP clock: steps pushed, counted from the job's start */
    uint64_t staleness;      /* versions between its last push's base and the model */
    uint64_t plan_from;      /* a plan's rounds before this one go without it: the round it
                              * said it rejoins at (HEARTBEAT base; 0 since its hello) */
    char why[96];            /* why it left or was declared dead */
} srv_worker;

/* ---- the update engine's state (update.c owns it) ------------------------ */

/* What a caller of srv_update_apply() gets back in the done callback of an
 * update that ran off the loop: the policy's own tag. */
typedef struct srv_update_tag {
    srv_worker *w;   /* the worker whose push started it */
    int fin;         /* the push's last chunk: a new version */
    int round;       /* the push closed a BSP round: its mean was applied */
} srv_update_tag;

/* Called on the loop once an update run off the loop is installed; the
 * connection layer registers it (srv_update_init). */
typedef void (*srv_update_done_cb)(psd *s, const srv_update_tag *tag);

typedef struct srv_update_job srv_update_job; /* update.c */

typedef struct srv_updater {
    srv_update_job *running;  /* an update applied off the loop; NULL: none.
                               * While one runs psd handles no message. */
    srv_update_job *job;      /* kept for the next one: none allocates */
    srv_update_done_cb done;  /* registered by the connection layer */
} srv_updater;

struct srv_policy_ops; /* policy.h */

/* A dense update of the leader's a follower replays: a `G` record of the
 * replication log (PROTOCOL.md 17) as replog_apply.c reads it. */
typedef struct srv_replay {
    uint64_t version;             /* the model's version it was applied at */
    uint64_t off, n;              /* its range */
    const float *g;               /* its gradient, n floats */
    int has_gmax, from_first, clip;
    float gmax;
} srv_replay;

/* ---- the job's plan (plan.c owns it) ------------------------------------ */

/* A BSP job's plan, fixed by the first worker's hello that carries one
 * (PROTOCOL.md 8, "The plan"): from it and the model version psd derives
 * which samples each round trains and who trains them, and when the job is
 * done. Unset (set 0) psd runs BSP as protocol version 1 always did. */
typedef struct srv_plan {
    int set;                 /* a hello fixed it */
    ps_plan p;
    uint64_t per_epoch;      /* rounds in one epoch: ceil(samples / batch) */
    uint64_t rounds;         /* rounds in the plan: epochs * per_epoch */
    uint64_t round;          /* the round `members` belong to; UINT64_MAX: none yet */
    uint32_t *members;       /* the shards that train that round, ascending */
    uint32_t nmembers, cap;
    uint32_t last_nmembers;  /* the round before's, for the log */
    int said_done;           /* the end of the plan was logged */
    uint32_t *out;           /* shards out of the job at the checkpoint the plan
                              * was restored from, to record as lost at start
                              * (srv_workers_out_restored); then NULL */
    uint32_t nout;
} srv_plan;

/* ---- connections --------------------------------------------------------- */

#define SRV_PARKED_MAX 64 /* pulls one connection may have waiting */
/* protocol errors after which psd closes a connection (PROTOCOL.md) */
#define SRV_PROTO_ERRORS_MAX 100
/* how long a connection closed for an error is read (and discarded) after
 * psd's side is shut down, so its ERROR is not lost to a reset */
#define SRV_LINGER_MS 2000
/* error lines logged for one connection before they are rate limited to
 * one a second (with the count of those left out) */
#define SRV_ERR_LINES_FREE 10

/* A pull waiting for a model version (BSP) or for the initial values. */
typedef struct srv_parked {
    uint64_t id, min, off, len;
    uint64_t rat;            /* a table pull into the table segment (rdt
                              * SRV_RDT_SHM): the byte its rows go to */
    uint32_t rdt;            /* ps_dtype of the reply's data */
    uint32_t table;          /* a table pull (TPULL, TPUSHPULL): the table's index */
    uint8_t *keys;           /* ... and a copy of its keys, nkeys of them, owned
                              * here; NULL: a pull of the model's range off, len */
    uint32_t nkeys;
    int ok;                  /* not a pull: a push's OK, sent once min is there */
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
    int mover;               /* a destination fetching a move's rows: its answers wait for the
                              * in-sync followers as a worker's replies do */
    int reader;              /* a worker-role hello with "reader": it pulls from any
                              * replica and never pushes; no worker record
                              * (PROTOCOL.md 15) */
    uint64_t client_id;      /* its hello's "cid" (0: none): its pushes' "pid"s are
                              * recorded and a resent one answered, not applied
                              * (replog/pushid.c) */
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
    uint8_t *tseg;           /* the worker's table segment (PROTOCOL.md 13.9); NULL: none */
    size_t tseg_len;         /* its bytes */
    srv_parked *parked;      /* pulls waiting for a version */
    srv_snap *pinned;        /* admin: the snapshot its pulls are answered from
                              * (ADMIN pin, psctl save); NULL = the current one */
    uint32_t nparked;        /* entries in parked, at most SRV_PARKED_MAX */
    int closing;             /* uv_close called or about to be */
    int held;                /* frames wait while an update is applied off the loop */
    int free_later;          /* closed while its push is applied off the loop:
                              * freed when that is done */
    srv_row_hint row_hint;   /* where its last table pull found its rows, for
                              * the push of the same keys (asgd, ssp) */
    int tapply_busy;         /* its table push is with the apply threads
                              * (table_apply = hogwild): its frames wait */
    int close_after_write;   /* close once queued writes are flushed */
    int linger;              /* closed for an error: psd shuts down its side
                              * and reads (discarding) until the peer closes
                              * or SRV_LINGER_MS pass, so the peer reads the
                              * ERROR instead of a reset (net.c) */
    uint64_t linger_until_ms;
    char close_reason[96];   /* why psd closes it, for the worker's record */
    uint64_t connected_ms;   /* when it was accepted (handshake_timeout); moved on by psd's own stalls (main.c) */
    uint64_t last_msg_ms;    /* when its last message arrived (idle_timeout) */
    uint32_t proto_errors;   /* errors of a broken or hostile client (net.c:
                              * MALFORMED, BAD_TYPE, BAD_FIELD, STATE,
                              * FORBIDDEN); closed at SRV_PROTO_ERRORS_MAX */
    uint32_t err_lines;      /* error log lines written for it */
    uint32_t err_quiet;      /* errors not logged since the last line */
    uint64_t err_line_ms;    /* when the last one was written */
    uint64_t barrier_ver;    /* the highest version its BARRIERs named; 0: it
                              * does not take part (barrier.c) */
    uint64_t barrier_id;     /* the parked BARRIER's id */
    int barrier_parked;      /* a BARRIER waits for the others */
    /* Replies held until the in-sync followers hold what they answer for
     * (replication = sync; connection/write.c), in order: every later
     * reply waits behind them. Freed with the connection. */
    struct srv_held *held_head, *held_tail;
    srv_conn *prev, *next;   /* psd.conns list */
};

/* A reply held for the followers (connection/write.c): sent once the
 * followers' acknowledged position reaches lsn, or dropped. */
typedef struct srv_held {
    struct srv_held *next;
    uint64_t lsn;
    void (*drop)(struct srv_held *h);
} srv_held;

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
    uint64_t frames_in;      /* frames (messages) received */
    uint64_t rejected[32];   /* by error code (index = -PS_E*) */
    uint64_t init_ms;        /* when the model got its initial values */
    uint64_t dropped_pushes; /* pushes for a BSP round already closed */
    uint64_t worker_joins, worker_leaves, worker_deaths;
    srv_hist staleness;      /* versions between a push's base and the model */
    srv_hist round_seconds;  /* BSP round durations */
    uint64_t checkpoints, checkpoint_failures;
    uint64_t checkpoint_ms;  /* when the last checkpoint was written (0: never) */
    uint64_t checkpoint_version;
    uint64_t checkpoint_tables_stamp; /* s->tables.stamp the last checkpoint holds */
    char checkpoint_error[300]; /* why the last failed checkpoint failed ("" after a success) */
    uint64_t sanitized_pushes;    /* non-finite pushes sanitised (nonfinite = clip) */
    uint64_t nonfinite_updates;   /* updates refused: their result was not finite */
    uint64_t clipped_updates;     /* updates whose non-finite results were made finite */
    uint64_t disconnects_output;  /* connections cut over max_output_buffer */
    uint64_t disconnects_idle;    /* admin connections closed by idle_timeout */
    uint64_t fenced_held;         /* worker replies held past the lease's fence (write.c) */
    uint64_t fenced_acks;         /* worker replies sent past the fence: every follower held them (write.c) */
    uint64_t barriers;            /* BARRIERs answered (barrier.c) */
    uint64_t early_pieces;        /* BSP pieces applied before their round closed (policy.c) */
    uint64_t zeros_elided;        /* values received as zeros left out (dt f32z, handle_dense.c) */
    uint64_t zstd_in, zstd_out;   /* compressed bytes received (dt zstd) and their float32 bytes */
    uint64_t zstd_sent, zstd_sent_raw; /* compressed bytes sent (rdt zstd) and their float32 bytes */
    /* rates, recomputed by the 1 s timer */
    uint64_t last_pushes, last_pulls;
    double push_rate, pull_rate;
} srv_stats;

/* What srv_config_check() parses of the settings, kept from the start's
 * check so that nothing parses or resolves it again. */
typedef struct srv_settings {
    char metrics_host[PS_CONFIG_HOST_MAX]; /* metrics_listen's host; "" = off */
    int metrics_port;
    struct sockaddr_storage metrics_addr;  /* and as an address */
    struct sockaddr_storage listen_addr;   /* listen, resolved (ss_family 0: not resolved) */
} srv_settings;

/* A setting from psd's command line (--listen, --set, ...); kept so that a
 * reload applies them again over the file. key and value point into argv. */
typedef struct srv_setting {
    const char *key, *value;
} srv_setting;

struct srv_http;
struct srv_ckpt_wait;

/* The job's part map and a move of parts (PROTOCOL.md 18; store/parts.c
 * reads it, dispatch/move.c and connection/move.c write it). Before any
 * move psd holds no map (epoch 0): the workers' lists are the map. */
typedef struct srv_move_src {
    uint64_t rows, bytes;    /* rows and bytes taken from that source so far */
    int state;               /* 0 copying, 1 its first pass done, 2 handed over */
    int failed;              /* an answer of this session could not be applied: its
                              * handover does not count, and its fetching stops */
} srv_move_src;
typedef struct srv_parts {
    uint64_t epoch;          /* the map's; 0: none held */
    uint32_t dense, n;       /* parts holding the dense model, parts in all */
    int32_t self;            /* this psd's index in it */
    char addrs[PS_PARTS_MAX][PS_ADDR_MAX + 1];
    /* a move under way, move_begin to move_end: to the map below */
    int moving;
    uint64_t mv_epoch;
    uint32_t old_n, new_n, new_dense;
    int32_t old_self, new_self; /* -1: not a part of that map */
    char new_addrs[PS_PARTS_MAX][PS_ADDR_MAX + 1];
    uint64_t want;           /* a destination: the sources (old parts, bits) it takes rows from */
    uint64_t handed;         /* a destination: the sources that handed their rows over */
    uint64_t switched;       /* a source: the destinations (new parts, bits) it handed rows to */
    /* a source with several destinations: each one's final fetch, held
     * until every one has asked (then all hand over at once) */
    uint64_t park_cid[PS_PARTS_MAX], park_id[PS_PARTS_MAX];
    size_t park_max[PS_PARTS_MAX];
    uint64_t rate;           /* bytes/s a destination fetches at most (0: no limit) */
    uint64_t started_ms, ended_ms;
    uint64_t rows_out, bytes_out; /* a source: rows and bytes sent */
    uint64_t rows_in, bytes_in;   /* a destination: rows and bytes taken */
    uint64_t pause_ms_max;   /* a destination: the longest handover (refusing to taking over) */
    srv_move_src src[PS_PARTS_MAX];
    char error[400];         /* why the move stopped; "" none */
    struct srv_move_thread *t; /* a destination's fetching threads (connection/move_fetch.c) */
    struct srv_move_drop *drop; /* the loop's handle that drops the rows a move took away (move_fetch.c) */
} srv_parts;

/* A follower's view of its leader (connection/follow.c owns it; status
 * reads it). */
typedef struct srv_follow_thread srv_follow_thread;
typedef struct srv_follow {
    char leader[300];         /* replica_of */
    uint64_t applied;         /* the leader's log applied up to here */
    uint64_t leader_end;      /* the leader's log end, as its last answer said */
    uint64_t snapshots;       /* snapshots loaded */
    uint64_t records_bytes;   /* records applied, bytes */
    int synced;               /* a snapshot is loaded */
    int failed;               /* a record did not apply: it stopped (error says why) */
    char error[600];
    srv_follow_thread *t;     /* the thread; NULL once stopped */
    srv_follow_thread *retired; /* a stopped one, freed at exit */
} srv_follow;
/* Leadership through a coordinator (etcd; coord/ owns it, issue 44): the
 * connection layer reads fence_ms before it acknowledges a push, status
 * and metrics read the rest. */
enum srv_coord_role {
    SRV_COORD_OFF = 0,       /* no coordinator: promotion by hand */
    SRV_COORD_STARTING,      /* asking etcd who leads */
    SRV_COORD_LEADING,       /* holds the part's lease */
    SRV_COORD_FOLLOWING,     /* follows the leader the key names */
    SRV_COORD_CAMPAIGNING,   /* the key is gone: taking it */
};
typedef struct srv_coord_view {
    int role;                /* enum srv_coord_role */
    int reachable;           /* etcd answered the last request */
    int listed;              /* a follower: the key's last value named it in sync (it may
                              * take over) */
    uint64_t fence_ms;       /* from this srv_now_ms() on, a reply that acknowledges
                              * a push needs every follower in sync (0: never) */
    uint64_t renewed_ms;     /* the request time of the last renewal that etcd answered */
    uint64_t unreachable_ms; /* since when etcd has not answered (0: it does) */
    uint64_t ttl_ms;         /* lease_ttl */
    int handing_back;        /* a leader stopped by a signal hands its part back
                              * (coord/handback.c): workers' hellos are refused */
    uint32_t published;      /* a leader: the followers (replog slots, as bits) the in-sync
                              * key in etcd names; sync replies wait for them too */
    char key[300];           /* /psd/JOB/part/N/leader */
    char leader[300];        /* the leader the key names, as last read ("" none) */
    char error[300];         /* etcd's last failure */
    uint64_t elections;      /* leaderships taken */
    uint64_t renewals;       /* renewals of this psd's lease that etcd answered */
    uint64_t map_epoch;      /* the part map this psd last put in etcd (/psd/JOB/map; 0: none) */
    uint64_t stepdowns;      /* leaderships lost */
    uint64_t failures;       /* requests no member answered */
} srv_coord_view;

/* Pushes applied once (replog/pushid.c's, PROTOCOL.md 15): for each client
 * that named itself in its hello, the highest push id applied; at most
 * SRV_PUSHIDS_MAX clients, the one that pushed longest ago forgotten for a
 * new one. */
#define SRV_PUSHIDS_MAX 16384u
typedef struct srv_pushid_ent {
    uint64_t cid;            /* the client's identity; 0: an empty slot */
    uint64_t pid;            /* the highest push id of it applied */
    uint64_t used;           /* srv_pushids.clock at its last mark */
} srv_pushid_ent;
typedef struct srv_pushids {
    srv_pushid_ent *slot;    /* open addressing, cap slots (a power of 2), at most half full */
    uint32_t n, cap;
    uint64_t clock;          /* marks so far: orders the entries by age */
    srv_pushid_ent *round;   /* a bsp round's pushes (cid, pid), recorded above once it
                              * closes: nround of them, room for round_cap */
    uint32_t nround, round_cap;
} srv_pushids;

/* The reply a push owes while its update runs off the loop (handle_dense.c owns
 * it): sent by srv_push_finished() once the update is installed. */
typedef struct srv_push_wait {
    srv_conn *c;             /* the pushing connection (its receive buffer
                              * holds the gradient); NULL: none */
    uint64_t id, poff, plen, min;
    uint32_t type;
    uint32_t rdt;
    /* asgd, ssp: the push is recorded (its id, the test ledger) once its
     * update is installed, after its gradient went into the replication log */
    int record;
    uint64_t cid, pid, off, n;
    const float *g;
} srv_push_wait;

/* What the connection layer (net.c) lends the layers below it, registered
 * in psd.io when psd starts (tests register fakes): sending replies and
 * taking a receive buffer off a connection. */
/* A run of a reply's data bytes (srv_send_pieces): len bytes at p, which
 * owner (NULL: none; memory that outlives the write) keeps until the write
 * is done. */
typedef struct srv_piece {
    const void *p;
    size_t len;
    srv_blk *owner;
} srv_piece;

typedef struct srv_io {
    /* Queues one reply (see srv_send). */
    void (*send)(srv_conn *c, const ps_msg *m, srv_blk *const *blk);
    /* The same, its data from pieces (see srv_send_pieces). */
    void (*send_pieces)(srv_conn *c, const ps_msg *m, const srv_piece *pc, size_t npc);
    /* Queues an ERROR reply with text; fatal closes after it is sent. */
    void (*send_error)(srv_conn *c, uint64_t id, int code, int fatal, const char *text);
    /* See srv_conn_give_rbuf. */
    int (*give_rbuf)(srv_conn *c, const void *data, srv_rbuf repl, srv_rbuf *out);
} srv_io;

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
    int said_memory_only;    /* the "model exists only in memory" warning was logged */
    struct srv_http *http;   /* the /metrics HTTP endpoint; NULL when off */
    char http_addr[300];     /* its bound "host:port", "" when off: written by the
                              * connection layer (http.c), read by status.c */
    srv_settings settings;   /* what the start's srv_config_check parsed */
    struct srv_dash *dash;   /* the run's history for the dashboard (dashboard.c) */
    struct srv_ckpt_wait *ckpt_waits; /* ADMIN checkpoint requests not answered yet */
    uv_timer_t tick;         /* 250 ms: liveness, checkpoints, rates */
    struct srv_outbufs *out; /* the connection layer's pools (connection/encode.h):
                              * spare write requests, reply tensors converted */
    /* owned by store/scratch.c (srv_codec, srv_planes): */
    ps_codec codec;          /* zstd's contexts: dt-3 pushes (dispatch) and rdt-3
                              * replies (connection), on the loop; made at first use */
    uint8_t *planes;         /* byte planes of the values those two work on */
    size_t planes_cap;       /* bytes */
    float *rows_wide;        /* a table push's row gradients widened to float32 */
    size_t rows_wide_cap;    /* floats */
    uint8_t *seg_keys;       /* a table request's keys copied out of a table segment */
    size_t seg_keys_cap;     /* bytes */
    uint64_t last_rate_ms;
    uint64_t last_tick_ms;   /* the last tick's time (main.c: psd's own stalls) */
    int stopping;
    uint64_t join_since_ms;  /* since when psd waits for shards that never
                              * joined (srv_join_tick, hello.c); 0: none */
    uint64_t join_warned_ms; /* its last "waits for" log line (hello.c) */
    uint64_t start_ms;
    srv_conn *conns;
    uint32_t nconns;
    uint64_t rbuf_bytes;     /* connections' receive buffers together (net.c;
                              * bounded by max_receive_memory) */
    uint64_t parked_bytes;   /* the keys of all parked table pulls (answer/pull.c);
                              * with rbuf_bytes, bounded by max_receive_memory */
    uint64_t next_cid;
    srv_worker **workers;    /* indexed by shard; size nworkers_cap (this and the
                              * four below: session/hello.c's) */
    uint32_t nworkers_cap;
    uint32_t nshards;        /* m announced by workers (0 until the first) */
    srv_conn *init_owner;    /* the worker asked to send initial values */
    srv_model model;         /* model/model.c's: srv_model_* */
    srv_tables tables;       /* embedding tables (tables/table.c) */
    srv_plan plan;           /* the job's plan (BSP; plan.c's) */
    const struct srv_policy_ops *policy;
    void *policy_state;      /* the policy's own (policy.c): BSP rounds and
                              * kept gradients, DC-ASGD's base snapshots */
    uint64_t (*clock)(void); /* the policies' clock, milliseconds: srv_now_ms
                              * (a test's fake); NULL = srv_now_ms */
    const srv_io *io;        /* the connection layer's send and receive-buffer
                              * functions (net.c's, or a test's) */
    srv_stats stats;
    uint64_t *restored_clocks; /* SSP clocks per shard from a checkpoint */
    char resumed_from[PS_CONFIG_PATH_MAX + 64]; /* the checkpoint the model came from at start; "" = none */
    uint64_t resumed_version; /* its model version */
    char model_file[PS_CONFIG_PATH_MAX]; /* the safetensors file the model came
                              * from at start (init_from); "" = none */
    uint32_t nrestored;
    int checkpoint_busy;     /* a checkpoint's writer process is running */
    srv_updater upd;         /* the update engine (update.c) */
    struct srv_tapply *tapply; /* table_apply = hogwild: the apply threads
                              * (update/tapply.c); NULL: ordered */
    srv_push_wait push_wait; /* the reply a push owes while its update runs off
                              * the loop (handle_dense.c) */
    srv_pushids pushids;     /* the push ids applied per client (replog/pushid.c) */
    int reload_pending;      /* SIGHUP came while applying: reload after */
    ps_buf enc;              /* encode scratch for replies */
    ps_buf apply_scratch;    /* a follower's aligned copy of a rows record's gradients
                              * (replog/replog_apply.c), kept from one record to the next */
    ps_layout scratch_layout; /* where a hello's layout is decoded */
    /* Registered by main(): stops psd as SIGTERM does (closes the signal
     * handlers, the tick timer and the /metrics endpoint, tells systemd and
     * stops the connections; the loop then ends). ADMIN shutdown calls it,
     * so that no file below main() calls up into it. */
    void (*shutdown)(psd *s, const char *why);
    int refused;             /* a check after start (coord/jobkey.c) refused to go on and
                              * called shutdown: psd exits with status 1 */
    /* Replication (PROTOCOL.md 17): a leader's log and its followers
     * (replog/replog.c; NULL until a follower asks), and on a follower,
     * the leader it follows (connection/follow.c). */
    struct srv_replog *replog;
    struct srv_follow *follow; /* NULL: this psd leads (or stands alone) */
    struct srv_follow *follow_retired; /* a promoted follower's, freed at exit */
    /* Registered by the connection layer: a sync reply held for the
     * followers may go (the acknowledged position moved). */
    void (*repl_release)(psd *s);
    /* Registered by the connection layer on a follower: psctl promote.
     * 0, or a negative PS_E* code with err. */
    int (*promote)(psd *s, char *err, size_t errlen);
    /* Registered by the connection layer: this leader gives its part up
     * to leader (ADMIN step_down, from a follower promoted by hand): its
     * workers' connections close with why (they find the new leader and
     * send again what was not answered), its log goes, and it follows
     * leader. 0, or a negative PS_E* code with err. */
    int (*step_down)(psd *s, const char *leader, const char *why, char *err, size_t errlen);
    srv_parts parts;         /* the part map and a move of parts (PROTOCOL.md 18) */
    /* Registered by the connection layer: a destination starts fetching
     * its rows from the sources psd.parts names (move_begin), and stops
     * (move_end, exit). 0, or a negative PS_E* code with err. */
    int (*move_start)(psd *s, char *err, size_t errlen);
    void (*move_stop)(psd *s);
    /* Registered by the connection layer: drops the rows a move took away,
     * a few milliseconds a turn of the loop (srv_tables_drop_some). */
    void (*move_drop)(psd *s);
    /* Registered by the connection layer: a follower applies a move's
     * record of its leader's log (dispatch/move_state.c, srv_move_replay).
     * 0, or a negative PS_E* code with err. */
    int (*move_apply)(psd *s, const uint8_t *b, size_t len, char *err, size_t errlen);
    /* Registered by the update engine (srv_update_init): a follower applies
     * its leader's dense update, a `G` record of its log (srv_update_replay).
     * 0, or a negative PS_E* code with err. */
    int (*grad_apply)(psd *s, const struct srv_replay *rp, char *err, size_t errlen);
    srv_coord_view coord;    /* coord/'s: leadership through etcd */
    struct srv_coord *coord_state; /* coord/'s own; NULL without coordinator */
};

/* ---- functions ----------------------------------------------------------- */

/* The one range check of a message: [off, off+n) non-empty and inside a
 * model of total parameters. */
static inline int srv_range_ok(uint64_t total, uint64_t off, uint64_t n)
{
    return n > 0 && off <= total && n <= total - off;
}

/* Each store file's functions, in its own header (they need the types
 * above, so they come last). */
#include "server/model/hogwild.h"
#include "server/model/model.h"
#include "server/store/plan.h"
#include "server/config/settings.h"
#include "server/store/shm.h"
#include "server/record/stats.h"

#endif
