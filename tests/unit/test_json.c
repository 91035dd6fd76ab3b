/* test_json.c - common/json.c, the one JSON string escaper of psd and
 * psctl: quotes and backslashes escaped, control characters and DEL as
 * \u00XX, bytes of 0x80 and above kept (UTF-8 text) or shown as '?'
 * (ASCII texts), embedded NULs of a counted string kept, and the result
 * read back by an independent JSON parser (jansson) as the same string. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_high_bytes),
        cmocka_unit_test(test_parses_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
