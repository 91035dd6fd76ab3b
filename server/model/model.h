/* model.h - the parameters in copy-on-write blocks, snapshots, the block
 * pool (model.c); the types are in psd.h. */
#ifndef SRV_MODEL_MODEL_H
#define SRV_MODEL_MODEL_H

#include "server/store/psd.h"

/* Allocates the parameters (zeros; with hogwild on, in the Hogwild!
 * segment, hogwild.c) and the optimizer state of layout l: 0, PS_ENOMEM,
 * or PS_EINVAL for hogwild with a model of more than one block. */
int srv_model_set_layout(srv_model *m, const ps_layout *l, const ps_config *cfg);
void srv_model_free(srv_model *m);

/* A worker's hello proposes l: it becomes the model's layout (has_layout)
 * but nothing is allocated until srv_model_commit(), at the first INIT, so
 * a hello alone commits no memory. */
void srv_model_propose(srv_model *m, const ps_layout *l);
/* Allocates a proposed layout's parameters (zeros) and optimizer state,
 * once: 0, or PS_ENOMEM (nothing allocated). */
int srv_model_commit(srv_model *m, const ps_config *cfg);
/* Forgets a layout that was never initialised (its proposer left before
 * INIT): memory freed, has_layout 0, so the next hello proposes again. */
void srv_model_release(srv_model *m);
/* Moves m's values, optimizer state and layout into out, leaving m as
 * srv_model_release leaves it (its optimizer's settings stay). */
void srv_model_move(srv_model *m, srv_model *out);
/* Ends a srv_model_move: keep, m keeps what it holds now (its stamp moved
 * past from's) and from is freed; else m's is freed and from's is m's
 * again. */
void srv_model_move_back(srv_model *m, srv_model *from, int keep);
/* [off, off+n) is about to be written (an update, an INIT): the
 * replication log ships it at its next flush. */
void srv_model_mark(srv_model *m, uint64_t off, uint64_t n);
/* The log shipped it. */
void srv_model_unmark(srv_model *m);
/* Counts one applied update: version++. */
void srv_model_bump(srv_model *m);
/* The model has its initial values, of model version `version` (a
 * worker's INIT, a checkpoint, a safetensors file). */
void srv_model_set_initialized(srv_model *m, uint64_t version);
/* Its blocks were written from elsewhere than the update engine and
 * srv_model_write_end (memcpy from a file): caches keyed on the stamp are
 * stale, and the engine's bounds unknown until it measures them. */
void srv_model_touched(srv_model *m);
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
/* A block that owns the receive buffer mem (cap bytes, malloc's) rather
 * than values: with its last reference the buffer is kept (two at most)
 * for a connection's next receive (srv_rbuf_spare), or freed. NULL when
 * out of memory (mem is then the caller's still). */
srv_blk *srv_blk_adopt(uint8_t *mem, size_t cap);
/* A receive buffer an adopted block let go, or {NULL, 0}; with need > 0,
 * one of at least need bytes only. */
srv_rbuf srv_rbuf_spare(size_t need);
srv_blk *srv_blk_ref(srv_blk *b);
void srv_blk_unref(srv_blk *b);
/* A snapshot of the current version; NULL when out of memory. */
srv_snap *srv_snap_take(srv_model *m);
srv_snap *srv_snap_ref(srv_snap *s);
void srv_snap_unref(srv_snap *s);
/* As srv_model_at, for a snapshot. */
const float *srv_snap_at(const srv_snap *s, uint64_t off, uint64_t n, size_t *len);

#endif
