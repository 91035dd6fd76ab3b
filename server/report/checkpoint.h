/* checkpoint.h - the model survives psd: atomic, checksummed checkpoints of
 * parameters, optimizer state, model version, worker clocks, optimizer
 * settings and a BSP job's plan in state_dir, and loading the newest valid
 * one at start.
 *
 * File format (versions 1 to 3), all integers little-endian:
 *   0   8 bytes  magic "PSDCKPT1"
 *   8   u32      format version: 1 without tables, 3 with (2: tables
 *                without their clocks, written before them; still read)
 *   12  u32      H, length of the header
 *   16  H bytes  header: one msgpack map (see checkpoint.c: version, layout,
 *                optimizer and its settings, state buffer names, clocks;
 *                "plan" when the job has one, absent in older files;
 *                "tables" in formats 2 and 3: each table's declaration,
 *                rows, floats a row and, in 3, its clock; "parts", the
 *                part map, once psd holds one: a part that holds no dense
 *                values has an empty layout, and P is 0)
 *   ..  P floats parameters, then P floats per optimizer state buffer
 *   ..  per table: rows x u64 keys, rows x floats values (weights, state,
 *       step), and in format 3 rows x u64, each row's table clock at its
 *       last push (expiry's measure); format 2's rows load as pushed at
 *       clock 0 of a table at clock 0
 *   end u32      CRC-32 (zlib) of every byte before it, then "PSDE"
 * Files are named ckpt-<version, 20 digits>.psdc, written to a temporary
 * name, fsynced, renamed into place and the directory fsynced. */
#ifndef SRV_CHECKPOINT_H
#define SRV_CHECKPOINT_H

#include "server/store/psd.h"

/* Starts writing a checkpoint of the current model: psd forks, and the
 * writer process writes its copy-on-write image of the parameters, the
 * optimizer state and the tables and exits, while psd goes on; the loop
 * watches a pipe to it and counts, logs and prunes when it ends. Does
 * nothing when there is no state_dir, no initialised model, one is already
 * being written, or the version is already saved (unless force). The
 * environment variable PSD_TEST_CKPT_SLOW_US (tests only) makes the writer
 * pause that many microseconds per MiB of table rows. */
void srv_checkpoint_start(psd *s, int force);

/* Something to write: the model once it has values, or, on a part a move
 * added, which holds table rows only (PROTOCOL.md 18), its rows once the
 * move is over (in one under way it holds some, and no map yet). */
int srv_checkpoint_has_state(const psd *s);

/* A snapshot for a follower (PROTOCOL.md 17): writes what a checkpoint holds,
 * in the checkpoint's format, into fd (a memory file psd made) from the
 * loop, a block of table rows at a time while pushes go on (snapshot.c;
 * a second one while one is being written: from a forked writer), and
 * calls done on the loop when it is written (rc 0) or failed (rc < 0;
 * version: the model version it holds). Returns 0 (started), or a
 * negative PS_E* code with err (PS_ENOT_READY: an update is being applied,
 * ask again). */
int srv_checkpoint_snapshot(psd *s, int fd, void (*done)(psd *s, int rc, uint64_t version, void *arg), void *arg,
                            char *err, size_t errlen);
/* A follower loads a snapshot file (a checkpoint's bytes) into an empty
 * psd. 0, or a negative PS_E* code with err. */
int srv_checkpoint_load_file(psd *s, const char *path, char *err, size_t errlen);

/* The work has stopped (why: "the last worker left", "psd is paused", or
 * "before psctl set changes the optimizer's settings"): starts a checkpoint
 * of the current version (srv_checkpoint_start) unless that version is already
 * written, with a log line naming why. Returns 1 when one was started or
 * none is needed, 0 when it could not start now (one is being written, or
 * an update runs off the loop): the caller's tick calls again. Without a
 * state_dir it does nothing and returns 1. */
int srv_checkpoint_at_rest(psd *s, const char *why);

/* Called on psd's tick: while the work is at rest (psd paused, or every
 * worker that joined has left or been lost) and the model has changed since
 * the newest checkpoint, writes one (pushes applied after a pause or a
 * last worker's late push are caught too). */
void srv_checkpoint_rest_tick(psd *s);

/* 1 when no worker is connected though some joined (the job's work has
 * stopped), else 0. */
int srv_work_stopped(const psd *s);

/* Writes a checkpoint now, on the calling thread (at shutdown). Returns 0 or
 * a negative PS_E* code (logged). */
int srv_checkpoint_write_now(psd *s);

/* Loads the newest valid checkpoint from state_dir into s->model (layout,
 * parameters, optimizer state, version) and the saved worker clocks, and
 * its plan into s->plan with the shards that were out of its job in
 * s->plan.out, for the caller to record as lost (srv_workers_out_restored,
 * session.h) before any connection; a checkpoint without a plan leaves
 * none, and one with an unusable plan is loaded without it, with a warning;
 * corrupt or truncated files are reported and skipped for older ones.
 * First removes, with a log line each, the ckpt-N.psdc.tmp files a psd
 * killed while writing a checkpoint left behind.
 * Returns 1 when one was loaded, 0 when there was none, negative on a
 * state_dir that cannot be used. */
int srv_checkpoint_load(psd *s);

/* psctl reset: forgets where the model came from at start (the checkpoint
 * and its version, the SSP clocks restored from it, init_from's file). */
void srv_checkpoint_forget_origin(psd *s);

/* --fresh: moves the checkpoints in dir (ckpt-* files) into a new dated
 * subfolder, dir/set-aside-YYYYMMDDTHHMMSSZ, written to aside; nothing is
 * deleted. Returns how many were moved (0: none, aside stays ""), or
 * PS_EIO with a message in err. */
int srv_checkpoint_set_aside(const char *dir, char *aside, size_t asidelen, char *err, size_t errlen);

#endif
