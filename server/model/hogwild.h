/* hogwild.h - Hogwild! (hogwild.c): the model segment the workers on
 * psd's machine map and step in, its step counter, and the settings'
 * check. PROTOCOL.md section 8 is the contract. */
#ifndef SRV_MODEL_HOGWILD_H
#define SRV_MODEL_HOGWILD_H

#include <stddef.h>
#include <stdint.h>

#include "server/config/config.h"

struct srv_blk;
struct srv_model;

/* The settings a Hogwild! job needs (plain sgd at a constant lr; that it
 * needs mode asgd is the policies' check): 0, or -1 with the message in
 * err. Called by srv_settings_check. */
int srv_hogwild_check(const ps_config *c, char *err, size_t len);

/* Byte offset of the step counter in a segment of n values: the values,
 * rounded up to 64 bytes (the counter on a cache line of its own). The
 * segment is that plus 64 bytes. */
static inline size_t srv_hogwild_counter_at(uint64_t n)
{
    return (size_t)((n * sizeof(float) + 63) / 64 * 64);
}

/* A block of n floats (n <= SRV_BLK_FLOATS) whose memory is a new sealed
 * memfd's mapping, the step counter after it at 0: its fd (hw_fd) is what
 * WELCOME names. The block owns the mapping and the fd; its last
 * srv_blk_unref unmaps and closes them. NULL, with errno, on failure. */
struct srv_blk *srv_hogwild_block(size_t n);
/* Unmaps and closes a block made by srv_hogwild_block (srv_blk_unref's). */
void srv_hogwild_block_free(struct srv_blk *b);

/* The model's version from its segment's counter (a no-op without one):
 * psd calls it before it reads the version (each message, each tick). */
void srv_model_sync(struct srv_model *m);
/* Sets the version, and the segment's counter with it (a checkpoint's). */
void srv_model_set_version(struct srv_model *m, uint64_t v);

#endif
