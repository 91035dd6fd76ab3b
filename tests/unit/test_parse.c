/* test_parse.c - unit tests for common/parse.c: the one integer parser
 * (psworker's flags, libpsclient's options, psctl, host:port, psd's settings). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/parse.h"

static void test_accepts_digits_up_to_max(void **state)
{
    (void)state;
    uint64_t v = 7;
    assert_int_equal(ps_parse_u64("0", 10, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(ps_parse_u64("10", 10, &v), 0);
    assert_int_equal(v, 10);
    assert_int_equal(ps_parse_u64("0010", 10, &v), 0);
    assert_int_equal(v, 10);
    assert_int_equal(ps_parse_u64("18446744073709551615", UINT64_MAX, &v), 0);
    assert_true(v == UINT64_MAX);
}

static void test_refuses_the_rest(void **state)
{
    (void)state;
    static const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "x", "0x10", "1e3", "18446744073709551616x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 42;
        assert_int_equal(ps_parse_u64(bad[i], 10, &v), PS_PARSE_SYNTAX);
        assert_int_equal(v, 42); /* untouched */
    }
    uint64_t v = 42;
    assert_int_equal(ps_parse_u64(NULL, 10, &v), PS_PARSE_SYNTAX);
    /* a number, but too big: told apart from the rest (psd's settings say
     * "out of range" for it, "not an integer" for the above) */
    assert_int_equal(ps_parse_u64("11", 10, &v), PS_PARSE_RANGE);
    assert_int_equal(ps_parse_u64("18446744073709551616", UINT64_MAX, &v), PS_PARSE_RANGE);
    assert_int_equal(ps_parse_u64("99999999999999999999999", 10, &v), PS_PARSE_RANGE);
    assert_int_equal(v, 42);
}

static void test_head_reads_the_digits_and_stops(void **state)
{
    (void)state;
    uint64_t v = 42;
    const char *end = NULL;
    const char *s = "64mib";
    assert_int_equal(ps_parse_u64_head(s, &v, &end), 0);
    assert_int_equal(v, 64);
    assert_ptr_equal(end, s + 2);
    s = "7";
    assert_int_equal(ps_parse_u64_head(s, &v, &end), 0);
    assert_int_equal(v, 7);
    assert_ptr_equal(end, s + 1);
    s = "18446744073709551616k";
    v = 42;
    assert_int_equal(ps_parse_u64_head(s, &v, &end), PS_PARSE_RANGE);
    assert_ptr_equal(end, s + 20);
    assert_int_equal(v, 42);
    static const char *bad[] = {"", "k", "-1", "+1", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ps_parse_u64_head(bad[i], &v, &end), PS_PARSE_SYNTAX);
    assert_int_equal(ps_parse_u64_head(NULL, &v, &end), PS_PARSE_SYNTAX);
    assert_int_equal(v, 42);
}

static void test_signed(void **state)
{
    (void)state;
    int64_t v = 42;
    assert_int_equal(ps_parse_i64("0", &v), 0);
    assert_true(v == 0);
    assert_int_equal(ps_parse_i64("-0", &v), 0);
    assert_true(v == 0);
    assert_int_equal(ps_parse_i64("+17", &v), 0);
    assert_true(v == 17);
    assert_int_equal(ps_parse_i64("-3", &v), 0);
    assert_true(v == -3);
    assert_int_equal(ps_parse_i64("9223372036854775807", &v), 0);
    assert_true(v == INT64_MAX);
    assert_int_equal(ps_parse_i64("-9223372036854775808", &v), 0);
    assert_true(v == INT64_MIN);
    v = 42;
    assert_int_equal(ps_parse_i64("9223372036854775808", &v), PS_PARSE_RANGE);
    assert_int_equal(ps_parse_i64("-9223372036854775809", &v), PS_PARSE_RANGE);
    assert_int_equal(ps_parse_i64("-99999999999999999999999", &v), PS_PARSE_RANGE);
    static const char *bad[] = {"", "-", "+", "- 1", "+-1", "--1", " 1", "1.5", "12x", "0x10", "abc",
                                "99999999999999999999999x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(ps_parse_i64(bad[i], &v), PS_PARSE_SYNTAX);
    assert_int_equal(ps_parse_i64(NULL, &v), PS_PARSE_SYNTAX);
    assert_true(v == 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_digits_up_to_max),
        cmocka_unit_test(test_refuses_the_rest),
        cmocka_unit_test(test_head_reads_the_digits_and_stops),
        cmocka_unit_test(test_signed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
