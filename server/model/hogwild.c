/* hogwild.c - Hogwild!: the model's parameters in a memfd that the workers
 * on psd's machine map read-write and update without locks.
 *
 * With `hogwild = on` the model's one block (the model is at most
 * SRV_BLK_FLOATS values) is this segment's mapping rather than heap memory:
 * checkpoints, status, the dashboard and the pulls of remote workers and
 * admins all read it, remote asgd pushes are applied into it in place, and
 * each local worker applies its own steps w -= lr * g into it. After the
 * values, on a cache line of its own, is a 64-bit step counter that every
 * step (a local worker's, a remote push applied by psd) adds 1 to,
 * atomically; it is the model's version. The block is never copied on
 * write (model.c): a snapshot of it is a copy taken on the loop. The
 * values themselves are written by several processes at once without
 * locks: that is the algorithm; psd's reads of them are plain loads of
 * 4-byte aligned floats, each some worker's whole write. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "server/model/hogwild.h"
#include "server/store/psd.h"

int srv_hogwild_check(const ps_config *c, char *err, size_t len)
{
    if (!c->hogwild) {
        if (c->hogwild_remote != PS_HOGWILD_REMOTE_ASGD) {
            snprintf(err, len, "hogwild_remote is set but hogwild is off: set hogwild = on, or leave "
                               "hogwild_remote out");
            return -1;
        }
        return 0;
    }
    if (c->elastic_alpha > 0) {
        snprintf(err, len, "hogwild and elastic_alpha are two ways to share a model: a Hogwild! worker steps in "
                           "psd's model itself and has no model of its own to pull towards a centre; set one");
        return -1;
    }
    if (c->optimizer != PS_OPTIMIZER_SGD || c->momentum != 0) {
        snprintf(err, len, "hogwild: the workers apply plain SGD steps into the model (psd's optimizer state "
                           "would go stale): set optimizer = sgd and momentum = 0");
        return -1;
    }
    if (c->weight_decay != 0 || c->clip_norm != 0 || c->lr_schedule != PS_LR_CONSTANT || c->warmup_versions != 0) {
        snprintf(err, len, "hogwild: the workers step at psd's lr as it is, w -= lr * g: set weight_decay = 0, "
                           "clip_norm = 0, lr_schedule = constant and warmup_versions = 0");
        return -1;
    }
    if (c->dc_lambda != 0 || c->staleness_scale) {
        snprintf(err, len, "hogwild: the workers' steps have no staleness psd could compensate or scale: set "
                           "dc_lambda = 0 and staleness_scale = no");
        return -1;
    }
    return 0;
}

struct srv_blk *srv_hogwild_block(size_t n)
{
    size_t at = srv_hogwild_counter_at(n), bytes = at + 64;
    int fd = memfd_create("psd-hogwild", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    srv_blk *b = calloc(1, sizeof *b);
    if (!b || ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        int e = errno;
        free(b);
        close(fd);
        errno = e;
        return NULL;
    }
    b->refs = 1;
    b->cap = n;
    b->w = p; /* zeros, as a fresh memfd is */
    b->hw_fd = fd;
    b->hw_len = bytes;
    b->hw_steps = (_Atomic uint64_t *)(void *)((char *)p + at);
    return b;
}

void srv_hogwild_block_free(struct srv_blk *b)
{
    munmap(b->w, b->hw_len);
    close(b->hw_fd);
    free(b);
}

void srv_model_sync(struct srv_model *m)
{
    if (!m->hw)
        return;
    uint64_t v = atomic_load_explicit(m->hw->hw_steps, memory_order_acquire);
    if (v != m->version) {
        m->version = v;
        m->stamp++;       /* the values changed with it */
        m->bound_ok = 0;  /* written by the workers: measured again */
    }
}

void srv_model_set_version(struct srv_model *m, uint64_t v)
{
    m->version = v;
    if (m->hw)
        atomic_store_explicit(m->hw->hw_steps, v, memory_order_release);
}
