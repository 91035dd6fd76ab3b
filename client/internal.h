/* internal.h - what libpsclient's files share and nobody else sees: the
 * client and link structures, and the functions one file gives the others
 * (psc__ names: hidden in the shared library, distinct in the static one).
 * The public API is include/psd/client.h. */
#ifndef PS_CLIENT_INTERNAL_H
#define PS_CLIENT_INTERNAL_H

#include "psd/client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "common/auth.h"
#include "common/clock.h"
#include "common/conn.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/parse.h"
#include "proto/vec.h"
#include "proto/errors.h"
#include "proto/layout.h"
#include "proto/ps_limits.h"
#include "topk.h"

/* largest tensor chunk in one frame, in floats (4 MiB) */
#define CHUNK_FLOATS PS_CHUNK_FLOATS

/* A table segment (PROTOCOL.md 13.9): requests from byte 0, the rows psd
 * answers from PSC_TSEG_ROWS, each half room for the largest message
 * (2 x 65,536 keys and 2^22 values; 2^22 values back). */
#define PSC_TSEG_ROWS ((size_t)2 * 8 * PS_TABLE_KEYS_MAX + (size_t)4 * PS_TABLE_VALUES_MAX)
#define PSC_TSEG_BYTES (2 * PSC_TSEG_ROWS)

/* Addresses one part may have: the user's and those psd tells */
#define PSC_ADDRS_MAX (2 * PS_REPLICAS_MAX)
/* One connection: to psd, or with a model split over several psd, to the
 * one holding part [lo, hi) of the flat vector (links[i] holds part i). A
 * table-only part (PROTOCOL.md 18: index >= the map's dense) holds no
 * values: its layout is empty, lo == hi == 0, and its HELLO carries the
 * part map in place of a layout. */
typedef struct psc_link {
    ps_conn cl;
    pthread_mutex_t lock;    /* the client's send lock */
    pthread_cond_t wake;     /* wakes the heartbeat thread */
    pthread_t hb_thread;
    int hb_running, hb_stop;
    uint64_t hb_interval_ms; /* a third of this psd's heartbeat_timeout */
    char server[300];        /* "host:port": the address now used, one of addrs */
    char addrs[PSC_ADDRS_MAX][PS_ADDR_MAX + 1]; /* the part's replicas: the user's
                              * ("A/B"), then those psd named (WELCOME "replicas",
                              * ERROR "leader") */
    uint32_t naddrs, cur;    /* addrs in use; the one in server */
    uint64_t pid_base;       /* the call's push ids on this link: pid_base, pid_base + 1, ... */
    uint64_t step_ver;       /* version at the call's start: a resend's base and min */
    int reopened;            /* connected anew by the reconnect of this call: its
                              * pushes go again */
    uint64_t lo, hi;         /* this part: values [lo, hi) of the flat vector */
    ps_layout layout;        /* its layout (the model's own with one psd) */
    char mode[16];
    uint64_t version;        /* version of this part's parameters we hold */
    int shm_ok;              /* this psd mapped our segment */
    uint8_t *tseg;           /* the table segment offered to a psd on this machine
                              * (PROTOCOL.md 13.9), PSC_TSEG_BYTES; NULL: none */
    int tseg_fd;             /* its sealed memfd */
    int tseg_ok;             /* this psd mapped it: table requests go through it */
    int hw;                  /* its WELCOME named its Hogwild! segment: */
    uint32_t hw_pid, hw_fd;
    double hw_lr;
    uint32_t workers;        /* its WELCOME's "workers" */
    int remote;              /* this psd is on another machine (ps_sock_same_host) */
    int has_plan;            /* its WELCOME told the job's plan: */
    ps_plan plan;
    int has_first;           /* ... and the first round it counts us in (WELCOME "base"): */
    uint64_t first;
    uint64_t piece;          /* its BSP rounds close in pieces of this many values
                              * (WELCOME "piece"); 0: whole */
    uint32_t local;          /* WELCOME "local": local SGD's H; 0: off */
    double alpha;            /* WELCOME "alpha": elastic averaging's; 0: off */
    uint32_t tau;            /* WELCOME "tau" */
} psc_link;

struct psc_client {
    /* options */
    char servers[4096];
    uint32_t shard, nshards;
    ps_token token;          /* the secret proved to psd; len 0: none */
    char token_path[1024];
    int timeout_ms, reconnect_ms, connect_ms;
    uint32_t want_dt;        /* wire type asked for; psd's welcome decides */
    int skip_zeros;          /* option skip_zeros: float32 pushes leave +0.0 out
                              * when psd offers it (default on) */
    int compress;            /* option compress: float32 pushes as zstd frames,
                              * auto (-1: to a psd on another machine), on, off */
    double topk;             /* option topk: the ratio of each tensor's values a push
                              * sends (the largest of gradient plus residual); 0 off */
    float *resid;            /* topk: the values not sent yet, one per model value;
                              * NULL until the first push */
    float *topk_scratch;     /* topk: the selection's scratch, as many */
    int want_shm;            /* offer psd a shared segment */
    int auto_reconnect;
    int interrupt;           /* option interrupt: a signal ends a wait (PSC_EINTR) */
    int wakeup_fd;           /* option wakeup_fd: a descriptor a signal makes
                              * readable, watched by every wait beside its
                              * socket (ps_conn.wake_fd); -1: none */
    int stop_req;            /* psc_interrupt: every wait ends with PSC_EINTR until psc_leave */
    int intr;                /* a signal interrupted a wait of this call (the links'
                              * `interrupted`); cleared when a call begins */
    int desync;              /* a wait was interrupted: the links may be mid-frame */
    int want_plan;           /* psc_plan_set: the plan the hello proposes */
    ps_plan plan;
    uint64_t chunk;          /* floats per frame of a chunked push or pull */
    unsigned pull_window;    /* chunk pulls in flight; 0: every chunk request waits */
    int send_buffer;         /* SO_SNDBUF of each connection; 0: the kernel's */
    int spin_us;             /* option spin_us: each wait for a reply polls this long before it sleeps */
    int barrier;             /* option barrier: BSP steps over a split model end
                              * at a BARRIER on part 0's psd: 1 on, 0 off,
                              * -1 auto (when a part is on another machine) */
    int pieces;              /* option pieces: a BSP step sends a part in its psd's
                              * pieces (WELCOME "piece"): 1 on, 0 off, -1 auto (a
                              * part on another machine) */
    int barrier_refused;     /* that psd does not know BARRIER (before 1.4) */
    int step_in;             /* the step's pushes went in before it failed (at its
                              * BARRIER): its gradient is not lost */
    int barrier_in;          /* this connection to part 0 takes part (it sent a
                              * BARRIER for a version, not withdrawn since) */
    /* the model */
    ps_layout layout;        /* the whole model's */
    int fixed;               /* layout fixed: links and buffers made */
    psc_link *links;             /* one per psd, in part order; PS_PARTS_MAX of them
                              * allocated once (threads hold pointers into it) */
    uint32_t nlinks;         /* the job's parts: table calls go to all of them */
    uint32_t ndense;         /* the first ndense hold the dense model (dense calls
                              * go to them only); nlinks until a part map says less */
    uint32_t nmade;          /* links[0, nmade) initialised (their locks, buffers) */
    /* the job's part map (PROTOCOL.md 18; pmap.c) */
    uint64_t epoch;          /* of the map the links follow; 0: the server list */
    struct psc_pmap {
        uint64_t epoch;
        uint32_t dense, n;
        char addrs[PS_PARTS_MAX][PS_ADDR_MAX + 1];
    } pm,                    /* the newest map psd sent, newer than epoch, until
                              * it is adopted (epoch 0: none) */
      map;                   /* the map adopted (epoch 0: none): a table-only
                              * part's HELLO carries it instead of a layout */
    int tabs_stale;          /* the map changed since the tables were declared:
                              * each is declared again before the next table call */
    uint32_t err_link;       /* the link whose error psc_errmsg tells */
    float *own;              /* without a segment: parameters then gradients */
    int shm_fd;              /* the sealed memfd; -1: none */
    float *shm;              /* its mapping: n gradient floats, then n parameter floats */
    float *params, *grads;   /* bound vectors: the library's or the caller's */
    /* what psd said */
    int connected, closed;
    char mode[16];
    int bsp;
    uint64_t version;        /* of the parameters we hold (first part's) */
    int pushed;              /* a push went out since the last pull (bsp pulls wait for its round) */
    int has_base;            /* psc_set_base: the next push's base is `base` */
    uint64_t base;
    int shm_ok, shm_logged;
    /* Hogwild! (hogwild.c): psd's model segment, mapped for the client's
     * life once a psd named one */
    float *hw;               /* its values, then (64-byte aligned) the step counter */
    size_t hw_len;           /* bytes mapped */
    int hw_on;               /* the psd now connected runs a Hogwild! job: steps go there */
    double hw_lr;            /* its lr (WELCOME "lr") */
    uint32_t hw_workers;     /* its workers (WELCOME), for buffers' "mean" */
    int64_t hw_checked_ms;   /* when a step last looked whether psd is still there */
    int hw_said;             /* the options it ignores were said */
    uint64_t reconnects, lost, dropped;
    /* local SGD and elastic averaging (average.c), as the first psd said */
    uint32_t local;          /* local SGD: H local steps a round; 0: off */
    double alpha;            /* elastic averaging: alpha; 0: off */
    uint32_t tau;            /* its local steps between exchanges */
    uint32_t local_n;        /* local steps since the last exchange */
    float *avg_base;         /* local SGD: the model pulled last (w_base), each
                              * part refreshed whenever it is pulled anew;
                              * elastic: the local model during an exchange.
                              * NULL in other jobs */
    /* the asynchronous step */
    pthread_t async_thread;
    pthread_mutex_t async_mu;
    pthread_cond_t async_cv;
    int async_running, async_stop, async_pending, async_rc;
    /* psc_progress: what was trained since the last periodic REPORT */
    int64_t report_ms;       /* option report_s; 0: no periodic reports */
    int64_t prog_last_ms;    /* when the last one went (0: none yet) */
    double prog_loss;        /* sum of the losses since then */
    uint64_t prog_n;         /* samples since then */
    uint64_t prog_total;     /* samples told of in all */
    /* psc_waiting_for: what psd last said the current step waits for,
     * written by the thread that receives (on_wait), read by any */
    pthread_mutex_t wait_mu;
    char waiting[256];       /* "" when psd said nothing since the step began */
    /* embedding tables (PROTOCOL.md 13), each row on the psd of its part
     * (13.7; every row on the first with one psd): what this client
     * declared (declared again to a psd that lost them), and the scratch
     * its calls work in; table.c's */
    struct psc_tab {
        ps_table_def def;
        ps_hp hp;            /* the hyper-parameters as given */
    } *tabs;
    uint32_t ntabs;
    /* a call's keys: [0] those of a pull or push (a push-and-pull's
     * pushed ones), [1] the pulled keys of a push-and-pull */
    struct psc_tkeys {
        uint64_t *tk;        /* the distinct keys, in first-seen order */
        uint32_t *tidx;      /* for each key of the call, its distinct key's index */
        uint32_t *tmap;      /* hash set of the distinct keys: index in tk + 1 (0: empty) */
        uint64_t *tg;        /* the distinct keys grouped by part: part 0's first */
        uint32_t *tpos;      /* for each distinct key, its position in tg */
        float *tgrows;       /* the rows of tg, in its order */
        int ident;           /* the call's keys are distinct and go to one psd: sent
                              * as they are, from and into the caller's arrays */
        const uint64_t *sk;  /* the keys sent: tg, or the call's keys (ident) */
        const float *sr;     /* the rows pushed: tgrows, or the call's gradients (ident) */
        float *rr;           /* where pulled rows go: tgrows, or the call's rows (ident) */
        size_t tk_cap, tidx_cap, tmap_cap, tg_cap, tpos_cap, tgrows_cap;
        size_t tfrom[PS_PARTS_MAX + 1]; /* part p's keys are tg[tfrom[p], tfrom[p + 1]) */
        uint32_t nparts;     /* the parts they are grouped for (nlinks then) */
        uint64_t epoch;      /* and the map's epoch then: another now, they are
                              * grouped anew (psc__pmap_regroup) */
    } tks[2];
    /* a table push whose reply a lost connection took, by its part in
     * tks[0]: applied there or not, only that part knows (its push ids).
     * When a part map adopted meanwhile groups the call's keys anew, it
     * goes to that part again first, as it was (table.c, tab_settle) */
    struct psc_unsure {
        int on;
        size_t n;            /* its keys: the next n of its part's, after those done */
        uint64_t pid;
        char addr[300];      /* the link's server then */
    } unsure[PS_PARTS_MAX];
    /* pushes applied once (PROTOCOL.md 15) */
    uint64_t cid;            /* this client's identity, random, never 0 (HELLO "cid") */
    uint64_t next_pid;       /* the next call's first push id */
    int reader;              /* option reader: the hello says "reader" (a read replica's
                              * pulls; no pushes) */
    int resending;           /* a call's pushes go again to the reopened links only */
    uint64_t resent;         /* calls whose pushes went again after a reconnect */
    int quick;               /* the first attempt of psc_connect: a TCP connect gives
                              * up after 1 s, so a wrong address is told at once */
    char err[1200];          /* a client-level error; empty: the link's */
};

/* The sending half of a step in pieces, on a thread of its own while the
 * caller reads: piece q of every pieced part (from first_part on), each
 * PUSH followed by the PULL of its range, then piece q + 1, so each psd
 * answers a piece as soon as every worker has pushed it. */
typedef struct pieces_job {
    psc_client *c;
    uint32_t start;
    int on[PS_PARTS_MAX];       /* the part goes in pieces (pieced at the start) */
    uint64_t ver[PS_PARTS_MAX]; /* each part's version at the step's start */
    int rc[PS_PARTS_MAX];       /* a part's send error */
    int rrc[PS_PARTS_MAX];      /* a part's receive error (its link is closed only
                                 * once the sending thread is done) */
} pieces_job;

enum op { OP_PUSHPULL, OP_PUSH, OP_PULL };

/* The files stand on each other one way, from the bottom (base.c) up:
 * each calls only files listed before it (test integration_deps). */

/* ---- base.c ---- */
int64_t psc__mono_ms(void);
__attribute__((format(printf, 3, 4)))
int psc__fail(psc_client *c, int code, const char *fmt, ...);
int psc__lfail(psc_client *c, uint32_t i, int rc);
int psc__interrupted(psc_client *c, int rc);
/* A call begins: a signal before it is not its own. Empties the wake-up
 * descriptor (option wakeup_fd). */
void psc__call_begins(psc_client *c);
int psc__recoverable(const psc_client *c, int rc);
int psc__public_code(const psc_client *c, int rc);
/* A call that pushes begins: each link gets a block of `most` push ids
 * (the most push messages the call may send it), after every id given
 * before (PROTOCOL.md 15). */
void psc__pids_begin(psc_client *c, uint64_t most);
/* The push id of the idx-th push message (from 0, below the block's
 * `most`) of this call on ln. */
static inline uint64_t psc__pid(const psc_link *ln, uint64_t idx)
{
    return ln->pid_base + idx;
}
/* 1: link i takes part in this (re)sending of the call's pushes. */
static inline int psc__sends_to(const psc_client *c, uint32_t i)
{
    return !c->resending || c->links[i].reopened;
}

/* ---- threads.c ---- */
void psc__on_wait(void *arg, const char *text, size_t len);
void psc__waiting_clear(psc_client *c);
int psc__start_thread(pthread_t *t, void *(*fn)(void *), void *arg);
/* Stops a thread of the library that waits on cv under mu until *stop:
 * sets *stop, wakes the thread and joins it; *running and *stop are 0
 * after. Nothing when *running is 0. */
void psc__thread_stop(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop, int *running);
void psc__hb_stop(psc_link *ln);
void psc__hb_start(psc_link *ln);

/* ---- hogwild.c ---- */
int psc__hogwild_map(psc_client *c, uint32_t pid, uint32_t fd);
void psc__hogwild_unmap(psc_client *c);
uint64_t psc__hogwild_version(const psc_client *c);
/* 1 when psd closed link 0's connection (or said something unasked),
 * looked at every 100 ms at most: the caller reconnects (step.c). */
int psc__hogwild_gone(psc_client *c);
int psc__hogwild_step(psc_client *c, enum op op, uint64_t off, uint64_t len);

/* ---- chunks.c ---- */
int psc__chunks_out(psc_client *c, psc_link *ln, uint32_t type, const float *values, uint64_t off, size_t n,
                    uint64_t base, size_t *sent);
int psc__chunks_acks(psc_client *c, psc_link *ln, size_t sent, int count_drops);
int psc__pull_part(psc_client *c, psc_link *ln, float *dst, uint64_t off, uint64_t n, uint64_t min);
uint64_t psc__push_base(const psc_client *c, const psc_link *ln);

/* ---- layout.c ---- */
void psc__link_close(psc_link *ln);
/* A memfd of `bytes` sealed against shrinking, growing and more seals
 * (psd would fault on pages cut off under it), mapped shared; its fd in
 * *fd_out. NULL when the kernel refuses. */
void *psc__memfd_map(const char *name, size_t bytes, int *fd_out);
int psc__tseg_create(psc_link *ln);
void psc__tseg_free(psc_link *ln);
/* Initialises links[i] (i == c->nmade: each slot once, in order): its
 * connection, lock and condition; no address yet. */
void psc__link_make(psc_client *c, uint32_t i);
void psc__unmake_links(psc_client *c);
int psc__fix_layout(psc_client *c);
int psc__busy(psc_client *c);

/* ---- pmap.c ---- */
/* Keeps the part map reply r carries (WELCOME, an ERROR) when it is newer
 * than the one followed and the one kept. r must have been decoded (a
 * receive that returned 0 or PS_EREMOTE). */
void psc__pmap_note(psc_client *c, const ps_msg *r);
/* Adopts the kept map when newer than the one followed (PROTOCOL.md 18):
 * links matched to its parts by address, those of parts removed closed
 * with a BYE, those of new parts (or whose part or layout changed) set up
 * closed with their address and layout, for the caller to open; the dense
 * split made anew when `dense` changed; tabs_stale set. Returns 1 when it
 * adopted one, 0 when there was none, or PSC_EINVAL (nothing changed)
 * when the model cannot be split over its dense parts. */
int psc__pmap_adopt(psc_client *c);
/* A table call's keys k (rows of dim values; done[p] of part p's answered;
 * push: its rows are gradients to push, else rows pulled) grouped anew under
 * the map now followed: the answered first, counted as part 0's done, then
 * each part's keys not yet answered, with their rows; done[] (PS_PARTS_MAX)
 * set to match. 0 or PSC_ENOMEM. */
int psc__pmap_regroup(psc_client *c, struct psc_tkeys *k, uint32_t dim, size_t *done, int push);

/* ---- link.c ---- */
/* Opens every link that is closed, trying until it works for up to
 * limit_ms; at_once: the first attempt goes without a wait (the links were
 * not lost: a part map added them). A newer part map a reply carried is
 * adopted on the way. */
int psc__open_retry(psc_client *c, int limit_ms, const char *first, int at_once);
/* Adopts the part map a reply carried (psc__pmap_adopt) and opens the
 * links it added or changed. 0 (also when there was none) or a code. */
int psc__adopt(psc_client *c);
/* After a call failed with rc_lost (recoverable) on link err_link:
 * reconnects, the lost link to its part's next replica when psd is gone or
 * follows a leader; the links connected anew are marked reopened. */
int psc__reconnect(psc_client *c, int rc_lost);
int psc__ready(psc_client *c, const char *what);

/* ---- pieces.c ---- */
int psc__pieced(const psc_client *c, const psc_link *ln);
void *psc__pieces_send(void *arg);
void psc__pieces_recv(psc_client *c, pieces_job *j);

/* ---- step.c ---- */
int psc__run(psc_client *c, enum op op, uint64_t off, uint64_t len);

/* ---- async.c ---- */
void psc__async_stop(psc_client *c);

/* ---- table.c ---- */
void psc__tables_free(psc_client *c);

#endif
