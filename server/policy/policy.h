/* policy.h - consistency policies (asgd.c, ssp.c, bsp.c; policy.c picks one): asgd, bsp and ssp decide when
 * a push is applied, when a round closes and when a pull may be answered.
 * They decide only: the input they get is checked at dispatch (range
 * within the model, float32, finite or sanitised, base version not ahead of
 * the model), their clock is psd.clock, they change the model only through
 * the update engine (update.h), and what must travel back up (answer the
 * parked pulls) is their return value. They know nothing of connections
 * and replies.
 *
 * Each policy owns its state (psd.policy_state): BSP its round and the
 * gradients kept for it, ASGD (DC-ASGD) the snapshot each worker last
 * pulled. A worker's clock (srv_worker.clock) is counted by the policies. */
#ifndef SRV_POLICY_H
#define SRV_POLICY_H

#include "server/store/psd.h"

/* A policy's hooks return, besides 0 and negative PS_E* codes: */
#define SRV_WAKE 2 /* a new version, or a change of who counts: parked pulls may
                    * now be answerable (the caller answers them) */
/* ... and push also SRV_PENDING (update.h): the update runs off the loop,
 * finished by applied() */

/* A push chunk as dispatch hands it on, checked. */
typedef struct srv_push {
    uint64_t base;     /* the version its gradient was computed against */
    uint64_t off, n;   /* the range, inside the model */
    const float *g;    /* n float32 values */
    int fin;           /* the step's last chunk */
    int has_gmax;      /* gmax is known */
    float gmax;        /* the largest |g[i]| (dispatch finds it with finiteness) */
    /* Where g lies, for a policy that keeps it until a round closes (BSP in
     * shard order) instead of copying it: */
    float **own;       /* g is *own, a buffer of *own_cap floats the policy may
                        * take, putting another (or NULL, cap 0) there; NULL:
                        * not offered */
    size_t *own_cap;
    srv_conn *conn;    /* g lies in conn's receive buffer, which the policy may
                        * take through psd.io->give_rbuf; NULL: not offered */
    int may_defer;     /* the update may run off the loop (SRV_PENDING): the
                        * caller holds the pusher until it is done */
} srv_push;

typedef struct srv_policy_ops {
    const char *name;
    /* A push chunk from worker w. Returns 0 (accepted: applied, or kept for
     * the round), SRV_WAKE (applied, and a new version), SRV_PENDING (its
     * update runs off the loop; applied() finishes it), or a negative PS_E*
     * code with err filled (nothing was changed; PS_ESTALE: a push for a
     * BSP round that closed without it). */
    int (*push)(psd *s, srv_worker *w, const srv_push *p, char *err, size_t errlen);
    /* The update a push started off the loop is installed. SRV_WAKE or 0. */
    int (*applied)(psd *s, const srv_update_tag *tag);
    /* w left (bye, closed, declared dead). SRV_WAKE or 0. */
    int (*worker_left)(psd *s, srv_worker *w);
    /* w (re)joined. SRV_WAKE or 0. */
    int (*worker_joined)(psd *s, srv_worker *w);
    /* May a pull by worker w (NULL: an admin) for version >= min be
     * answered now? NULL: when the model is initialised and at version >= min. */
    int (*pull_ready)(psd *s, const srv_worker *w, uint64_t min);
    /* The version values [off, off+len) are at when it is above the
     * model's: a BSP round closing piece by piece (bsp_piece) has applied
     * its mean to every piece the range touches, so a pull for version + 1
     * of that range may be answered before the round closes. 0 otherwise.
     * NULL: never. */
    uint64_t (*range_version)(psd *s, uint64_t off, uint64_t len);
    /* While such a round has applied some of its pieces (the model's values
     * are then of two versions): the snapshot of the version before them,
     * what a pull of the current version, a pin and a checkpoint read.
     * NULL otherwise. NULL: never. */
    srv_snap *(*round_base)(psd *s);
    /* Values a piece of a round closing piece by piece (WELCOME "piece"),
     * 0 when rounds close whole. NULL: never. */
    uint64_t (*piece)(const psd *s);
    /* w is sent the current parameters, of version ver. NULL: nothing. */
    void (*pulled)(psd *s, srv_worker *w, uint64_t ver);
    /* The settings changed (reload, psctl set). NULL: nothing. */
    void (*reconfigured)(psd *s);
    /* psd's periodic tick (every 250 ms): retries what memory stopped.
     * SRV_WAKE or 0. NULL: nothing to do. */
    int (*tick)(psd *s);
    /* The shards whose push the current round still waits for (bsp: the
     * connected workers, with a plan the round's members, without a
     * complete push for it): fills out with the first max, in shard
     * order, and returns how many there are. NULL: the policy has no
     * rounds. */
    uint32_t (*unpushed)(psd *s, uint32_t *out, uint32_t max);
    /* Frees the policy's state (at exit). */
    void (*destroy)(psd *s);
} srv_policy_ops;

extern const srv_policy_ops srv_policy_asgd;
extern const srv_policy_ops srv_policy_bsp;
extern const srv_policy_ops srv_policy_ssp;

/* The policy for s->cfg.mode. */
const srv_policy_ops *srv_policy_for(const ps_config *cfg);

#endif
