/* test_idx.c - the IDX reader on small files written to a temporary
 * directory: valid plain and gzip files, and each way a file can be wrong. */
#define _XOPEN_SOURCE 700 /* nftw */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "proto/errors.h"
#include "worker/idx.h"

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

static int setup(void **state)
{
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof(tmpdir), "%s/ps_test_idx.XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Writes tmpdir/name: magic, ndim dims, then payload_len bytes (i*7+1 mod 256),
 * gzip-compressed when gz. Returns the path in a static buffer. */
static const char *write_idx(const char *name, int gz, uint32_t magic, int ndim, const uint32_t *dims,
                             size_t payload_len)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    size_t len = 4 + 4 * (size_t)ndim + payload_len;
    uint8_t *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    put_be32(buf, magic);
    for (int i = 0; i < ndim; i++)
        put_be32(buf + 4 + 4 * i, dims[i]);
    for (size_t i = 0; i < payload_len; i++)
        buf[4 + 4 * ndim + i] = (uint8_t)(i * 7 + 1);
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
    return path;
}

static const char *write_raw(const char *name, const void *data, size_t len)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    return path;
}

static void check_images(int gz)
{
    const uint32_t dims[3] = {3, 2, 4};
    const char *path = write_idx(gz ? "img.gz" : "img", gz, 0x803, 3, dims, 24);
    ps_idx x;
    char err[512] = "";
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), 0);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.dims[0], 3);
    assert_int_equal(x.dims[1], 2);
    assert_int_equal(x.dims[2], 4);
    assert_int_equal(x.size, 24);
    for (size_t i = 0; i < 24; i++)
        assert_int_equal(x.data[i], (uint8_t)(i * 7 + 1));
    ps_idx_free(&x);
    assert_null(x.data);
    ps_idx_free(&x); /* idempotent */
}

static void test_images_plain(void **state)
{
    (void)state;
    check_images(0);
}

static void test_images_gz(void **state)
{
    (void)state;
    check_images(1);
}

static void test_labels_plain_and_gz(void **state)
{
    (void)state;
    const uint32_t dims[1] = {300};
    for (int gz = 0; gz <= 1; gz++) {
        const char *path = write_idx(gz ? "lab.gz" : "lab", gz, 0x801, 1, dims, 300);
        ps_idx x;
        char err[512] = "";
        assert_int_equal(ps_idx_read(path, 1, &x, err, sizeof(err)), 0);
        assert_int_equal(x.ndim, 1);
        assert_int_equal(x.dims[0], 300);
        assert_int_equal(x.size, 300);
        assert_int_equal(x.data[299], (uint8_t)(299 * 7 + 1));
        ps_idx_free(&x);
    }
}

static void check_truncated(int gz)
{
    const uint32_t dims[3] = {3, 2, 4};
    const char *path = write_idx(gz ? "trunc.gz" : "trunc", gz, 0x803, 3, dims, 10);
    ps_idx x;
    char err[512] = "";
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_null(x.data);
    assert_msg_has(err, path);
    assert_msg_has(err, "truncated");
    assert_msg_has(err, "3 images of 2x4");
    assert_msg_has(err, "holds 10 bytes of pixels");
}

static void test_truncated_plain(void **state)
{
    (void)state;
    check_truncated(0);
}

static void test_truncated_gz(void **state)
{
    (void)state;
    check_truncated(1);
}

static void test_truncated_labels(void **state)
{
    (void)state;
    const uint32_t dims[1] = {100};
    const char *path = write_idx("trunc-lab", 0, 0x801, 1, dims, 99);
    ps_idx x;
    char err[512] = "";
    assert_int_equal(ps_idx_read(path, 1, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "truncated: header declares 100 labels but file holds 99 bytes of labels");
}

static void test_truncated_header(void **state)
{
    (void)state;
    ps_idx x;
    char err[512] = "";
    const uint8_t two[2] = {0, 0};
    const char *path = write_raw("tiny", two, sizeof(two));
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "truncated");
    assert_msg_has(err, "too short for an IDX header");

    const uint8_t half[8] = {0, 0, 8, 3, 0, 0, 0, 5};
    path = write_raw("halfhdr", half, sizeof(half));
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "header cut short after 8 of 16 bytes");

    path = write_raw("empty", "", 0);
    assert_int_equal(ps_idx_read(path, 1, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "holds 0 bytes");
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    const uint32_t dims[3] = {3, 2, 4};
    for (int gz = 0; gz <= 1; gz++) {
        const char *path = write_idx(gz ? "long.gz" : "long", gz, 0x803, 3, dims, 24 + 5);
        ps_idx x;
        char err[512] = "";
        assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
        assert_msg_has(err, "5 unexpected bytes after the 3 images of 2x4");
    }
}

static void test_wrong_magic(void **state)
{
    (void)state;
    const uint32_t dims[3] = {3, 2, 4};
    ps_idx x;
    char err[512] = "";

    const char *path = write_idx("magic", 0, 0x12345678, 3, dims, 24);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, path);
    assert_msg_has(err, "not an IDX file: magic 0x12345678, expected 0x00000803");

    /* A labels file where images are expected, and the reverse. */
    path = write_idx("lab-as-img", 0, 0x801, 1, dims, 3);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "wrong IDX kind: magic 0x00000801 has 1 dimensions, expected 0x00000803");
    path = write_idx("img-as-lab", 0, 0x803, 3, dims, 24);
    assert_int_equal(ps_idx_read(path, 1, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "expected 0x00000801");

    /* IDX, but floats rather than bytes. */
    path = write_idx("float", 0, 0x00000d03, 3, dims, 96);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "unsupported IDX element type 0x0d");
}

static void test_wrong_dims(void **state)
{
    (void)state;
    ps_idx x;
    char err[512] = "";

    const uint32_t zero_n[3] = {0, 28, 28};
    const char *path = write_idx("zero-n", 0, 0x803, 3, zero_n, 0);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "bad dimensions: header declares 0 images");

    const uint32_t zero_side[3] = {2, 0, 28};
    path = write_idx("zero-side", 0, 0x803, 3, zero_side, 0);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "bad dimensions: header declares images of 0x28");

    const uint32_t big_side[3] = {1, 5000, 28};
    path = write_idx("big-side", 0, 0x803, 3, big_side, 0);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_ETOO_BIG);
    assert_msg_has(err, "over the limit");

    const uint32_t many[1] = {PS_IDX_MAX_ITEMS + 1};
    path = write_idx("many", 0, 0x801, 1, many, 0);
    assert_int_equal(ps_idx_read(path, 1, &x, err, sizeof(err)), PS_ETOO_BIG);
    assert_msg_has(err, "more than the limit");

    const uint32_t huge[3] = {PS_IDX_MAX_ITEMS, 4096, 4096};
    path = write_idx("huge", 0, 0x803, 3, huge, 0);
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_ETOO_BIG);
    assert_msg_has(err, "bytes, over the limit");
}

/* A gzip file declaring 1.5 GB of pixels but holding a few bytes: rejected as
 * truncated (the reader's buffer grows with the bytes that arrive, so this
 * costs a megabyte, not what the header asks for). */
static void test_lying_header_gz(void **state)
{
    (void)state;
    const uint32_t dims[3] = {2000000, 28, 28};
    const char *path = write_idx("liar.gz", 1, 0x803, 3, dims, 100);
    ps_idx x;
    char err[512] = "";
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EMALFORMED);
    assert_msg_has(err, "truncated: header declares 2000000 images of 28x28 but file holds 100 bytes of pixels");
}

static void test_corrupt_gz(void **state)
{
    (void)state;
    /* A gzip header followed by bytes that are not a deflate stream. */
    const uint8_t bad[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                           0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const char *path = write_raw("corrupt.gz", bad, sizeof(bad));
    ps_idx x;
    char err[512] = "";
    int rc = ps_idx_read(path, 3, &x, err, sizeof(err));
    assert_true(rc == PS_EIO || rc == PS_EMALFORMED);
    assert_msg_has(err, path);
}

static void test_missing(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/no-such-file-idx3-ubyte", tmpdir);
    ps_idx x;
    char err[512] = "";
    assert_int_equal(ps_idx_read(path, 3, &x, err, sizeof(err)), PS_EIO);
    assert_null(x.data);
    assert_msg_has(err, path);
    assert_msg_has(err, "missing");
    assert_msg_has(err, "scripts/setup.sh");

    assert_int_equal(ps_idx_read(tmpdir, 3, &x, err, sizeof(err)), PS_EIO);
    assert_msg_has(err, "is a directory");
}

static void test_err_optional(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof(path), "%s/absent", tmpdir);
    ps_idx x;
    assert_int_equal(ps_idx_read(path, 1, &x, NULL, 0), PS_EIO);
    char small[8];
    assert_int_equal(ps_idx_read(path, 1, &x, small, sizeof(small)), PS_EIO);
    assert_int_equal(strlen(small), sizeof(small) - 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_images_plain),
        cmocka_unit_test(test_images_gz),
        cmocka_unit_test(test_labels_plain_and_gz),
        cmocka_unit_test(test_truncated_plain),
        cmocka_unit_test(test_truncated_gz),
        cmocka_unit_test(test_truncated_labels),
        cmocka_unit_test(test_truncated_header),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_wrong_magic),
        cmocka_unit_test(test_wrong_dims),
        cmocka_unit_test(test_lying_header_gz),
        cmocka_unit_test(test_corrupt_gz),
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_err_optional),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
