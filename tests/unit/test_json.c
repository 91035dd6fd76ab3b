/* test_json.c - common/json.c, the one JSON string escaper of psd and
 * psctl: quotes and backslashes escaped, control characters and DEL as
 * \u00XX, bytes of 0x80 and above kept (UTF-8 text) or shown as '?'
 * (ASCII texts), embedded NULs of a counted string kept, and the result
 * read back by an independent JSON parser (jansson) as the same string;
 * and a msgpack object as JSON (psctl's --json output). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <string.h>

#include "common/json.h"

static char *as_text(ps_buf *b)
{
    assert_int_equal(ps_buf_reserve(b, 1), 0);
    b->p[b->len] = 0;
    return (char *)b->p;
}

static void test_escapes(void **state)
{
    (void)state;
    ps_buf b = {0};
    assert_int_equal(ps_json_str(&b, "a\"b\\c\n\x01\x7f", 8, PS_JSON_UTF8), 0);
    assert_string_equal(as_text(&b), "\"a\\\"b\\\\c\\u000a\\u0001\\u007f\"");
    b.len = 0;
    assert_int_equal(ps_json_str(&b, "", 0, PS_JSON_UTF8), 0);
    assert_string_equal(as_text(&b), "\"\"");
    ps_buf_free(&b);
}

static void test_high_bytes(void **state)
{
    (void)state;
    ps_buf b = {0};
    const char *s = "caf\xc3\xa9";
    assert_int_equal(ps_json_str(&b, s, strlen(s), PS_JSON_UTF8), 0);
    assert_string_equal(as_text(&b), "\"caf\xc3\xa9\"");
    b.len = 0;
    assert_int_equal(ps_json_str(&b, s, strlen(s), PS_JSON_ASCII), 0);
    assert_string_equal(as_text(&b), "\"caf??\"");
    ps_buf_free(&b);
}

static void test_parses_back(void **state)
{
    (void)state;
    /* every byte below 0x80, a NUL among them, through a JSON array */
    char s[128];
    for (int i = 0; i < 128; i++)
        s[i] = (char)i;
    ps_buf b = {0};
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len++] = '[';
    assert_int_equal(ps_json_str(&b, s, sizeof s, PS_JSON_ASCII), 0);
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len++] = ']';
    json_error_t err;
    json_t *j = json_loadb((const char *)b.p, b.len, JSON_ALLOW_NUL, &err);
    assert_non_null(j);
    json_t *v = json_array_get(j, 0);
    assert_int_equal(json_string_length(v), sizeof s);
    assert_memory_equal(json_string_value(v), s, sizeof s);
    json_decref(j);
    ps_buf_free(&b);
}

/* psctl's --json output: a msgpack object (as psd's STATUS body) as JSON,
 * read back by jansson */
static void test_msgpack_as_json(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 8);
    msgpack_pack_str_with_body(&pk, "n", 1);
    msgpack_pack_uint64(&pk, 9007199254740993ull); /* 2^53 + 1: not a double */
    msgpack_pack_str_with_body(&pk, "neg", 3);
    msgpack_pack_int64(&pk, -5);
    msgpack_pack_str_with_body(&pk, "x", 1);
    msgpack_pack_double(&pk, 0.1);
    msgpack_pack_str_with_body(&pk, "inf", 3);
    msgpack_pack_double(&pk, 1.0 / 0.0);
    msgpack_pack_str_with_body(&pk, "s", 1);
    msgpack_pack_str_with_body(&pk, "a\"b\xc3\xa9", 5);
    msgpack_pack_str_with_body(&pk, "list", 4);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_true(&pk);
    msgpack_pack_nil(&pk);
    msgpack_pack_array(&pk, 0);
    msgpack_pack_str_with_body(&pk, "map", 3);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_uint64(&pk, 7); /* a key that is not a string */
    msgpack_pack_false(&pk);
    msgpack_pack_str_with_body(&pk, "bin", 3);
    msgpack_pack_bin_with_body(&pk, "zz", 2);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 1024);
    msgpack_object o;
    assert_int_equal(msgpack_unpack(sb.data, sb.size, NULL, &zone, &o), MSGPACK_UNPACK_SUCCESS);
    ps_buf b = {0};
    assert_int_equal(ps_json_msgpack(&b, &o), 0);
    json_error_t err;
    json_t *j = json_loadb((const char *)b.p, b.len, 0, &err);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "neg")), -5);
    assert_true(json_real_value(json_object_get(j, "x")) == 0.1); /* %.17g: exact */
    assert_true(json_is_null(json_object_get(j, "inf")));
    assert_string_equal(json_string_value(json_object_get(j, "s")), "a\"b\xc3\xa9");
    json_t *l = json_object_get(j, "list");
    assert_int_equal(json_array_size(l), 3);
    assert_true(json_is_true(json_array_get(l, 0)));
    assert_true(json_is_null(json_array_get(l, 1)));
    assert_int_equal(json_array_size(json_array_get(l, 2)), 0);
    assert_true(json_is_false(json_object_get(json_object_get(j, "map"), "?")));
    assert_true(json_is_null(json_object_get(j, "bin")));
    json_decref(j);
    /* the big unsigned integer is written in full */
    assert_int_equal(ps_buf_reserve(&b, 1), 0);
    b.p[b.len] = 0;
    assert_non_null(strstr((const char *)b.p, "\"n\": 9007199254740993, \"neg\": -5"));
    ps_buf_free(&b);
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_high_bytes),
        cmocka_unit_test(test_parses_back),
        cmocka_unit_test(test_msgpack_as_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
