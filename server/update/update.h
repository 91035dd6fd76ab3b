/* update.h - the update engine (update.c): applies a gradient to a range of
 * the model through the optimizer, all or nothing, on the loop or on
 * libuv's thread pool. It owns the update running off the loop
 * (psd.upd); it calls nothing above it, and hands an update run off the
 * loop back through the done callback the connection layer registered. */
#ifndef SRV_UPDATE_H
#define SRV_UPDATE_H

#include "server/store/psd.h"
#include "server/tables/table.h"
#include "server/update/tapply.h"

/* The gradient of an update of [off, off+n): a push's floats, g[i] for
 * parameter off+i; or, when nsrc > 0, a BSP round's mean, inv times the sum
 * of the nsrc sources in that order, source k's value of parameter j being
 * blk[k][j's block][j's offset in it] where blk[k] and that entry are set,
 * else src[k][j] (a whole-model array); zero_src clears src[0] where it was
 * read (the arrival-order sum, ready for the next round). The sum of a
 * round is always taken in this one order (first source, + each next,
 * times inv), whatever piece size the engine works in. */
typedef struct srv_grad {
    const float *g;
    float **src;
    const float *const *const *blk; /* per source, NULL or per block: where
                                     * that block's values are instead of src */
    const float **xs;               /* room for nsrc pointers (many sources) */
    unsigned nsrc;
    float inv;
    int zero_src;
    /* An upper bound of every |g[i]| (or of every value of every source),
     * when has_gmax: with it the engine may know the update stays finite
     * without trying it first. Without it the update is tried. */
    int has_gmax;
    float gmax;
    /* Buffers (layout tensors with a rule, PS_BUF_*): the optimizer leaves
     * them, and they take the workers' values instead. A push's values as
     * they came (before the policy scaled g; NULL: g itself), and whether
     * it came from shard 0, whose values a "first" buffer takes; a round
     * gives its mean to "mean" buffers, and its first source (the lowest
     * shard, when the sources are kept in shard order) to "first" ones. */
    const float *raw;
    int from_first;
    /* g is a push's floats as the worker sent them, applied by the
     * optimizer alone (no scaling, no correction, raw == g): with
     * followers the log may carry the update as this gradient, for them
     * to apply as the leader did, instead of the values it makes
     * (srv_replog_grad_ok). */
    int as_sent;
    srv_conn *conn;  /* with as_sent: g lies in conn's receive buffer (NULL: not) */
    /* 0: the update follows psd's `nonfinite`; else 1 + enum ps_nonfinite
     * (a follower replaying its leader's update follows its leader's) */
    int nonfinite;
} srv_grad;

/* srv_update_apply() returns this when the update goes on off the loop. */
#define SRV_PENDING 1

/* Registers the callback told of each update run off the loop, once it is
 * installed (with the tag its caller gave); psd's connection layer does,
 * at start. Without one every update runs on the loop. */
void srv_update_init(psd *s, srv_update_done_cb done);

/* The one entry point: applies gr to [off, off+n) of s's model (a range
 * inside the model, checked by the caller; a gradient of finite values),
 * the optimizer's step and, with clip_norm, its clipping included; the
 * caller counts the version. With tag non-NULL, a done callback registered
 * and n large enough for the memory traffic to matter (2^19 floats), it
 * runs on libuv's thread pool and returns SRV_PENDING: gr's arrays must
 * stay until the done callback is called with *tag; until then
 * srv_update_busy() is 1 and psd must handle no message. Otherwise it is
 * applied now: returns 0, or PS_ENOMEM when a shared block could not be
 * copied (nothing changed). An update whose result would not be finite
 * (a parameter or a value of the optimizer's state overflowing, though the
 * gradient is finite) is refused with PS_ENONFINITE, nothing changed, or
 * with nonfinite = clip applied on the loop with those values made finite;
 * either is logged and counted (psd.stats). To know, the engine keeps
 * bounds of the model's magnitudes (srv_model.bound_*), widened by each
 * update's own pass (on the pool for a big one) and measured once after
 * values come from elsewhere; with gr's gmax they show most updates cannot
 * overflow (srv_optim_surely_finite), and only the others are first tried
 * on copies, on the loop. Must not be called while busy. */
int srv_update_apply(psd *s, const srv_grad *gr, uint64_t off, uint64_t n, const srv_update_tag *tag);

/* A follower applies its leader's update rp (psd.grad_apply, registered by
 * srv_update_init): at the leader's version (its optimizer's settings came
 * before, an `O` record), on the loop. 0, or a negative PS_E* code with err (the update did
 * not apply here as it did on the leader: the follower must stop). */
int srv_update_replay(psd *s, const srv_replay *rp, char *err, size_t errlen);

/* 1 while an update runs off the loop. */
int srv_update_busy(const psd *s);

/* Frees what updates keep between them (at exit). */
void srv_update_free(psd *s);

/* Steps the rows g (n x dim floats) of the n distinct keys of table ti,
 * pushed by a worker whose last pull found its rows as hint says (NULL:
 * unknown): on the loop now (table_apply = ordered: srv_tables_push_hint),
 * or queued to the apply threads (hogwild, s->tapply: srv_tapply_push, with
 * tag and the pull keys pkeys handed back to the done callback). Returns 0
 * (applied), SRV_PENDING (queued), or a negative PS_E* code with err
 * (nothing queued; PS_ENONFINITE: a row's step was not finite, nothing
 * changed). */
int srv_update_rows(psd *s, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g, const srv_row_hint *hint,
                    const srv_tapply_tag *tag, const uint8_t *pkeys, uint32_t npk, char *err, size_t errlen);
/* 1 when srv_update_rows steps every row on the loop now and checks each
 * result finite (ordered, with no admission filter holding keys back):
 * the gradients need no check of their own first. */
int srv_update_rows_checked(const psd *s);

#endif
