/* test_parse.c - unit tests for common/parse.c: the one rule for numbers
 * in options (psworker's flags, libpsclient's options). */
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
    static const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "x", "0x10", "1e3", "11", "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 42;
        assert_int_equal(ps_parse_u64(bad[i], 10, &v), -1);
        assert_int_equal(v, 42); /* untouched */
    }
    uint64_t v = 42;
    assert_int_equal(ps_parse_u64(NULL, 10, &v), -1);
    assert_int_equal(ps_parse_u64("18446744073709551616", UINT64_MAX, &v), -1);
    assert_int_equal(v, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_digits_up_to_max),
        cmocka_unit_test(test_refuses_the_rest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
