/* dataset.h - the training and test data a worker holds in memory.
 *
 * A ps_dataset is n samples of dim float features, normalised, stored
 * row-major, with one u8 label each. It is loaded by name from a data
 * directory, optionally cut to its first N samples, sharded k of m, and read
 * in a seeded per-epoch order. */
#ifndef PS_DATASET_H
#define PS_DATASET_H

#include <stddef.h>
#include <stdint.h>

typedef enum ps_split {
    PS_SPLIT_TRAIN, /* train-*-ubyte */
    PS_SPLIT_TEST   /* t10k-*-ubyte */
} ps_split;

typedef struct ps_dataset {
    size_t n;      /* samples */
    int dim;       /* features per sample: rows * cols */
    int rows;      /* image height */
    int cols;      /* image width */
    int n_classes; /* every label is < n_classes */
    float *x;      /* n * dim floats, sample i at x + i*dim; owned */
    uint8_t *y;    /* n labels; owned */
} ps_dataset;

/* Loads split of the data set called name ("mnist" or "fashion-mnist") from
 * <dir>/<name>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, taking each file
 * under its plain name if it exists and else with ".gz" appended. Pixels
 * become (x/255 - mean)/std with the set's usual constants (MNIST 0.1307 and
 * 0.3081, Fashion-MNIST 0.2860 and 0.3530). When limit > 0 only the first
 * limit samples are kept (the whole files are still validated). Every label
 * must be below 10 and the two files must agree on the count.
 * Returns 0 and fills *out (release with ps_dataset_free), or a negative PS_E*
 * code with one readable line in err; *out is then empty. Codes are those of
 * ps_idx_read, plus PS_EINVAL for an unknown name and PS_EMALFORMED for bad
 * labels or mismatched files.
 * When <dir>/<name>/ holds neither form of a file, the set is taken from
 * the system's directory of data sets instead, <fallback>/<name>/ (Debian's
 * dataset-fashion-mnist installs /usr/share/datasets/fashion-mnist), so a
 * packaged psworker finds Fashion-MNIST without a data directory of its
 * own; both files of a split come from the same directory. */
int ps_dataset_load(const char *dir, const char *name, ps_split split, size_t limit, ps_dataset *out, char *err,
                    size_t errlen);

/* The system's directory of data sets ps_dataset_load falls back to:
 * PS_DATASETS_DIR, "/usr/share/datasets" unless the build says otherwise.
 * dir NULL restores it, "" turns the fallback off (for tests). */
void ps_dataset_set_fallback_dir(const char *dir);

/* Releases a data set's memory and empties it; NULL-safe, idempotent. */
void ps_dataset_free(ps_dataset *d);

/* Fills *out with shard k of m of src: a COPY of the samples at positions
 * k, k + m, k + 2m, ... of a fixed permutation of 0..n-1 (drawn from one
 * constant seed and n, so every worker draws the same one whatever its
 * --seed), in that order. Shard sizes differ by at most one (shard k holds
 * ceil((n - k) / m)), and every shard's mix is the whole set's even when the
 * file is sorted by class or alternates between sources: MNIST's training
 * file alternates its two writer populations, so shard 1 of 2 of a plain
 * i % m split held only one of them. Since the permutation does not depend
 * on m, step i of the M shards at batch B/M visits, together, exactly the
 * samples that step i of shard 0 of 1 at batch B visits (when neither
 * shuffles). A copy rather than a view so the shard owns contiguous rows and
 * src can be freed. Returns 0, PS_EINVAL (with a message) when m < 1, k is
 * outside [0, m) or the shard would be empty, or PS_ENOMEM. */
int ps_dataset_shard(const ps_dataset *src, int k, int m, ps_dataset *out, char *err, size_t errlen);

/* Fills perm[0..n) with the order in which to visit n samples in one epoch:
 * a permutation drawn from xoshiro256** seeded by (seed, shard, epoch), so a
 * restarted worker repeats its order exactly and shards differ. */
void ps_dataset_epoch_order(size_t *perm, size_t n, uint64_t seed, uint32_t shard, uint64_t epoch);

/* Copies samples idx[0..count) of d into the contiguous batch x (count * dim
 * floats) and y (count labels). Every idx[i] must be < d->n. */
void ps_dataset_gather(const ps_dataset *d, const size_t *idx, size_t count, float *x, uint8_t *y);

#endif
