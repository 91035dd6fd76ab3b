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
#include "server/config/settings.h"
#include "server/tables/table.h"
#include "server/update/tapply.h"

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

/* A table push as dispatch hands it on, checked: the n distinct keys (a
 * "keys" bin) of table ti and their finite rows g (n x dim floats; or, when
 * the policy's tpush_checks says so, rows whose step checks each result),
 * computed on version base. */
typedef struct srv_tpush {
    uint64_t base;
    uint32_t ti;
    const uint8_t *keys;
    uint32_t n;
    const float *g;
    const srv_row_hint *hint; /* where the pusher's last pull found its rows (NULL: none) */
    srv_tapply_tag tag;       /* whom the reply goes to when the rows are stepped
                               * off the loop (SRV_PENDING) */
    const uint8_t *pkeys;     /* a TPUSHPULL's pull keys, handed back with the
                               * tag (NULL: a TPUSH) */
    uint32_t npk;
} srv_tpush;

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
    /* A table push from worker w (PROTOCOL.md 13.5), checked at dispatch
     * (see srv_tpush). Returns 0 (applied, or kept for the round: bsp
     * applies it as the round closes, in shard order), SRV_PENDING (its
     * rows are stepped off the loop, table_apply = hogwild: the connection
     * layer's done callback finishes it with p->tag), or a negative PS_E*
     * code with err (PS_ESTALE: its round closed; PS_EDUPLICATE: w
     * completed its step, or pushed one of the keys already in the round;
     * PS_ENONFINITE: a row's step was not finite). Every policy has it. */
    int (*tpush)(psd *s, srv_worker *w, const srv_tpush *p, char *err, size_t errlen);
    /* Whether tpush steps every row on the loop at once and checks each
     * result finite (so that dispatch need not check the gradients first).
     * NULL: it does not. */
    int (*tpush_checks)(const psd *s);
    /* Checks the settings against what the mode needs (local_steps needs
     * rounds, elastic averaging and hogwild need no rounds and no clocks,
     * ...). 0, or PS_EINVAL with err. NULL: nothing to check. Called by
     * srv_config_check. */
    int (*check)(const ps_config *c, char *err, size_t errlen);

    /* What the mode needs of the other layers, read by them instead of the
     * mode's name (no file outside policy/ reads ps_config.mode): */
    int rounds;   /* pushes wait for a round of every shard: a worker's hello
                   * must name the job's shard count (--shard K/workers), and
                   * a table push's rows read from a worker's segment are
                   * copied before the round keeps them */
    int barriers; /* a BARRIER parks until every worker taking part has
                   * reached its version (otherwise it is answered at once) */
    int plan;     /* a job's plan (PROTOCOL.md) rules the rounds: a worker's
                   * proposed plan is fixed, kept, restored and shown */
} srv_policy_ops;

extern const srv_policy_ops srv_policy_asgd;
extern const srv_policy_ops srv_policy_bsp;
extern const srv_policy_ops srv_policy_ssp;

/* The policy for the settings' mode (the one reader of ps_config.mode
 * besides the policies themselves). */
const srv_policy_ops *srv_policy_for(const ps_config *cfg);

/* The one cross-check of psd's settings: srv_settings_check (store), then
 * the checks of the mode's policy (its check op). At start, by
 * --print-config, at a reload and at psctl set. 0, or PS_EINVAL with err
 * filled (out is filled when not NULL and the check passed). */
int srv_config_check(const ps_config *c, srv_check_when when, srv_settings *out, char *err, size_t len);

/* BSP's plan rules the rounds: a plan is set, the mode's policy has a plan,
 * the model is initialised. */
int srv_plan_active(const psd *s);
/* ... and its last round is applied. */
int srv_plan_done(const psd *s);
/* While a plan rules the rounds and is not done: the first round
 * connected worker w trains, in *round (its WELCOME's `base`), and 1;
 * else 0. */
int srv_plan_first_round(psd *s, const srv_worker *w, uint64_t *round);
/* Worker w says it rejoins at round `round` (a HEARTBEAT's `base`): while
 * a plan rules the rounds and round is after the current one, the rounds
 * before it go without w (its unfinished push of the current round is
 * dropped). Returns the policy's worker_left answer (SRV_WAKE: the current
 * round closed, answer the parked pulls), or 0 when nothing changed. */
int srv_plan_rejoin(psd *s, srv_worker *w, uint64_t round);

#endif
