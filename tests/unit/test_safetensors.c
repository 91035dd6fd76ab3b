/* test_safetensors.c - common/safetensors.c, the writer of the safetensors
 * file that `psctl save` makes and psd's init_from reads: the header read
 * back by an independent JSON parser (jansson) with every tensor's dtype,
 * shape and byte range, the metadata (version, mode, fingerprint, server,
 * part versions, buffer rules, the tables' declarations), the data's start
 * on a multiple of 8; values in each tensor's dtype; the table tensors'
 * names as the reader matches them; two tensors of one name refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

static ps_layout layout; /* big: not on the stack */

static void small_layout(ps_layout *l)
{
    ps_layout_init(l);
    uint32_t wd[2] = {2, 3}, bd[1] = {3}, nd[1] = {1};
    assert_int_equal(ps_layout_add(l, "fc.weight", 2, wd), 0);
    assert_int_equal(ps_layout_add(l, "bn.running_mean", 1, bd), 0);
    assert_int_equal(ps_layout_set_buffer(l, PS_BUF_MEAN, PS_SAVE_F32), 0);
    assert_int_equal(ps_layout_add(l, "bn.num_batches_tracked", 1, nd), 0);
    assert_int_equal(ps_layout_set_buffer(l, PS_BUF_FIRST, PS_SAVE_I64), 0);
}

static void expect_tensor(json_t *root, const char *name, const char *dtype, json_int_t d0, json_int_t d1,
                          json_int_t begin, json_int_t end)
{
    json_t *t = json_object_get(root, name);
    assert_non_null(t);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), dtype);
    json_t *shape = json_object_get(t, "shape"), *offs = json_object_get(t, "data_offsets");
    assert_int_equal(json_array_size(shape), d1 < 0 ? 1 : 2);
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), d0);
    if (d1 >= 0)
        assert_int_equal(json_integer_value(json_array_get(shape, 1)), d1);
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), begin);
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), end);
}

static void test_header_reads_back(void **state)
{
    (void)state;
    small_layout(&layout);
    ps_st_table tab = {.name = "emb", .dim = 4, .rows = 5};
    const char *decl = "{\"name\":\"emb\",\"dim\":4}";
    assert_int_equal(ps_buf_reserve(&tab.decl, strlen(decl)), 0);
    memcpy(tab.decl.p, decl, strlen(decl));
    tab.decl.len = strlen(decl);
    ps_st_meta meta = {.version = 42, .mode = "bsp", .fp = 0xabcdef, .server = "h:1,h:2", .part_versions = "42,41"};
    ps_buf out = {0};
    assert_int_equal(ps_st_header(&layout, &meta, &tab, 1, &out), 0);

    uint64_t n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)out.p[i] << (8 * i);
    assert_int_equal(n, out.len - 8);
    assert_int_equal(out.len % 8, 0); /* the data starts on a multiple of 8 */
    json_error_t err;
    json_t *root = json_loadb((const char *)out.p + 8, n, 0, &err);
    assert_non_null(root);
    /* 6 floats, 3 floats, 1 I64; then the table's 5x4 rows and 5 keys */
    expect_tensor(root, "fc.weight", "F32", 2, 3, 0, 24);
    expect_tensor(root, "bn.running_mean", "F32", 3, -1, 24, 36);
    expect_tensor(root, "bn.num_batches_tracked", "I64", 1, -1, 36, 44);
    expect_tensor(root, "tables/emb/rows", "F32", 5, 4, 44, 124);
    expect_tensor(root, "tables/emb/keys", "I64", 5, -1, 124, 164);
    json_t *m = json_object_get(root, "__metadata__");
    assert_string_equal(json_string_value(json_object_get(m, "model_version")), "42");
    assert_string_equal(json_string_value(json_object_get(m, "mode")), "bsp");
    assert_string_equal(json_string_value(json_object_get(m, "layout_fingerprint")), "0x0000000000abcdef");
    assert_string_equal(json_string_value(json_object_get(m, "server")), "h:1,h:2");
    assert_string_equal(json_string_value(json_object_get(m, "part_versions")), "42,41");
    assert_string_equal(json_string_value(json_object_get(m, PS_ST_META_BUFFER "bn.running_mean")), "mean");
    assert_string_equal(json_string_value(json_object_get(m, PS_ST_META_BUFFER "bn.num_batches_tracked")), "first");
    assert_null(json_object_get(m, PS_ST_META_BUFFER "fc.weight"));
    assert_string_equal(json_string_value(json_object_get(m, PS_ST_META_TABLES)), "[{\"name\":\"emb\",\"dim\":4}]");
    json_decref(root);

    /* one psd, no tables: neither key */
    ps_buf one = {0};
    ps_st_meta meta1 = {.version = 1, .mode = "asgd", .fp = 1, .server = "h:1"};
    assert_int_equal(ps_st_header(&layout, &meta1, NULL, 0, &one), 0);
    n = 0;
    for (int i = 0; i < 8; i++)
        n |= (uint64_t)one.p[i] << (8 * i);
    root = json_loadb((const char *)one.p + 8, n, 0, &err);
    assert_non_null(root);
    m = json_object_get(root, "__metadata__");
    assert_null(json_object_get(m, "part_versions"));
    assert_null(json_object_get(m, PS_ST_META_TABLES));
    assert_int_equal(json_object_size(root), 4); /* metadata and three tensors */
    json_decref(root);
    ps_buf_free(&one);
    ps_buf_free(&out);
    ps_buf_free(&tab.decl);
}

static void test_values_in_their_dtypes(void **state)
{
    (void)state;
    small_layout(&layout);
    float v[10] = {1, 2, 3, 4, 5, 6, 0.5f, 0.25f, -1, 7.0f};
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    assert_non_null(f);
    /* in two pieces, the second starting inside a tensor */
    assert_int_equal(ps_st_write_values(f, &layout, 0, v, 4), 0);
    assert_int_equal(ps_st_write_values(f, &layout, 4, v + 4, 6), 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(len, 9 * 4 + 8);
    assert_memory_equal(mem, v, 9 * 4);
    int64_t q;
    memcpy(&q, mem + 36, 8);
    assert_int_equal(q, 7);
    free(mem);
    assert_int_equal(ps_st_value_size(&layout.t[0]), 4);
    assert_int_equal(ps_st_value_size(&layout.t[2]), 8);
}

static void test_table_tensor_names(void **state)
{
    (void)state;
    assert_int_equal(ps_st_table_tensor("tables/emb/rows", "emb"), PS_ST_ROWS);
    assert_int_equal(ps_st_table_tensor("tables/emb/keys", "emb"), PS_ST_KEYS);
    assert_int_equal(ps_st_table_tensor("tables/emb/rowsx", "emb"), PS_ST_NOT_TABLE);
    assert_int_equal(ps_st_table_tensor("tables/emb2/rows", "emb"), PS_ST_NOT_TABLE);
    assert_int_equal(ps_st_table_tensor("tables/em/rows", "emb"), PS_ST_NOT_TABLE);
    assert_int_equal(ps_st_table_tensor("emb/rows", "emb"), PS_ST_NOT_TABLE);
    assert_int_equal(ps_st_table_tensor("fc.weight", "emb"), PS_ST_NOT_TABLE);
}

static void test_names_twice_refused(void **state)
{
    (void)state;
    char err[200] = "";
    small_layout(&layout);
    assert_int_equal(ps_st_names_ok(&layout, err, sizeof err), 0);
    /* ps_layout_add may take a name twice (the wire allows it); the file cannot */
    uint32_t d[1] = {2};
    assert_int_equal(ps_layout_add(&layout, "fc.weight", 1, d), 0);
    assert_int_equal(ps_st_names_ok(&layout, err, sizeof err), -1);
    assert_non_null(strstr(err, "two tensors named 'fc.weight'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_reads_back),
        cmocka_unit_test(test_values_in_their_dtypes),
        cmocka_unit_test(test_table_tensor_names),
        cmocka_unit_test(test_names_twice_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
