/* test_log.c - unit tests for common/log.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static int calls;

static int counted(int v)
{
    calls++;
    return v;
}

/* Read everything written to f since it was opened (at most len-1 bytes). */
static size_t slurp(FILE *f, char *buf, size_t len)
{
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    return n;
}

static void assert_matches(const char *text, const char *pattern)
{
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        fail_msg("'%s' does not match /%s/", text, pattern);
}

static int teardown(void **state)
{
    ps_log_set_file(NULL);
    ps_log_set_level(PS_LOG_INFO);
    return 0;
}

static void test_level_parse(void **state)
{
    assert_int_equal(ps_log_level_parse("debug"), PS_LOG_DEBUG);
    assert_int_equal(ps_log_level_parse("info"), PS_LOG_INFO);
    assert_int_equal(ps_log_level_parse("warn"), PS_LOG_WARN);
    assert_int_equal(ps_log_level_parse("warning"), PS_LOG_WARN);
    assert_int_equal(ps_log_level_parse("error"), PS_LOG_ERROR);
    assert_int_equal(ps_log_level_parse("INFO"), PS_LOG_INFO);
    assert_int_equal(ps_log_level_parse("Error"), PS_LOG_ERROR);
    assert_int_equal(ps_log_level_parse("verbose"), -1);
    assert_int_equal(ps_log_level_parse("info "), -1);
    assert_int_equal(ps_log_level_parse(""), -1);
    assert_int_equal(ps_log_level_parse(NULL), -1);

    assert_string_equal(ps_log_level_name(PS_LOG_DEBUG), "DEBUG");
    assert_string_equal(ps_log_level_name(PS_LOG_WARN), "WARN");
    assert_string_equal(ps_log_level_name(42), "?");
}

static void test_set_level(void **state)
{
    ps_log_set_level(PS_LOG_WARN);
    assert_int_equal(ps_log_get_level(), PS_LOG_WARN);
    assert_false(ps_log_enabled(PS_LOG_INFO));
    assert_true(ps_log_enabled(PS_LOG_WARN));
    assert_true(ps_log_enabled(PS_LOG_ERROR));
    ps_log_set_level(99);
    assert_int_equal(ps_log_get_level(), PS_LOG_ERROR);
    ps_log_set_level(-5);
    assert_int_equal(ps_log_get_level(), PS_LOG_DEBUG);
}

/* A record below the threshold neither formats nor evaluates its
 * arguments; the level expression itself is evaluated exactly once. */
static void test_suppressed_not_evaluated(void **state)
{
    FILE *f = tmpfile();
    char buf[1024];

    assert_non_null(f);
    ps_log_set_file(f);
    ps_log_set_level(PS_LOG_WARN);

    calls = 0;
    PS_LOG(PS_LOG_DEBUG, "value %d", counted(1));
    PS_LOG(PS_LOG_INFO, "value %d %d", counted(2), counted(3));
    assert_int_equal(calls, 0);
    assert_int_equal(slurp(f, buf, sizeof buf), 0);

    PS_LOG(PS_LOG_WARN, "value %d", counted(4));
    PS_LOG(PS_LOG_ERROR, "value %d", counted(5));
    assert_int_equal(calls, 2);

    int level_evals = 0;
    PS_LOG((level_evals++, PS_LOG_ERROR), "once");
    PS_LOG((level_evals++, PS_LOG_DEBUG), "never");
    assert_int_equal(level_evals, 2);

    slurp(f, buf, sizeof buf);
    assert_non_null(strstr(buf, " WARN value 4\n"));
    assert_non_null(strstr(buf, " ERROR value 5\n"));
    assert_non_null(strstr(buf, " ERROR once\n"));
    assert_null(strstr(buf, "never"));
    fclose(f);
}

static void test_line_format(void **state)
{
    FILE *f = tmpfile();
    char buf[1024], pattern[256];

    assert_non_null(f);
    ps_log_init("/usr/local/bin/psd", PS_LOG_DEBUG);
    ps_log_set_file(f);
    PS_LOG(PS_LOG_INFO, "listening on %s:%d", "127.0.0.1", 7000);
    slurp(f, buf, sizeof buf);
    snprintf(pattern, sizeof pattern,
             "^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\\.[0-9]{3}Z "
             "psd\\[%ld\\] INFO listening on 127\\.0\\.0\\.1:7000\n$",
             (long)getpid());
    assert_matches(buf, pattern);
    fclose(f);

    /* A trailing newline in the message is not doubled; levels print. */
    f = tmpfile();
    assert_non_null(f);
    ps_log_set_file(f);
    PS_LOG(PS_LOG_DEBUG, "one\n");
    PS_LOG(PS_LOG_ERROR, "two");
    slurp(f, buf, sizeof buf);
    assert_matches(buf, "^[^\n]* psd\\[[0-9]+\\] DEBUG one\n[^\n]* psd\\[[0-9]+\\] ERROR two\n$");
    fclose(f);
}

static void test_long_message_cut(void **state)
{
    FILE *f = tmpfile();
    size_t big = 10000;
    char *msg = malloc(big + 1), *buf = malloc(2 * big);

    assert_non_null(f);
    assert_non_null(msg);
    assert_non_null(buf);
    memset(msg, 'x', big);
    msg[big] = '\0';
    ps_log_set_file(f);
    PS_LOG(PS_LOG_ERROR, "%s", msg);
    size_t n = slurp(f, buf, 2 * big);
    assert_true(n > 1000 && n <= 4096);
    assert_int_equal(buf[n - 1], '\n');
    assert_memory_equal(buf + n - 4, "...", 3);
    assert_null(memchr(buf, '\n', n - 1));
    fclose(f);
    free(msg);
    free(buf);
}

static void test_errno_preserved(void **state)
{
    FILE *f = tmpfile();

    assert_non_null(f);
    ps_log_set_file(f);
    errno = EPIPE;
    PS_LOG(PS_LOG_ERROR, "write failed: %s", strerror(errno));
    assert_int_equal(errno, EPIPE);
    fclose(f);
}

/* Two or more threads logging at once produce whole lines. */
#define N_THREADS 4
#define N_LINES 300

static void *log_thread(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < N_LINES; i++)
        PS_LOG(PS_LOG_INFO, "thread %d line %d %s", id, i,
               "padding-padding-padding-padding-padding-padding-padding-padding");
    return NULL;
}

static void test_threads_whole_lines(void **state)
{
    FILE *f = tmpfile();
    pthread_t t[N_THREADS];
    char line[512];
    int count[N_THREADS] = {0};

    assert_non_null(f);
    ps_log_set_file(f);
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, log_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    fflush(f);
    rewind(f);

    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^[0-9T:.Z-]{24} psd\\[[0-9]+\\] INFO thread ([0-9]) line [0-9]+ "
                             "(padding-){7}padding\n$",
                             REG_EXTENDED),
                     0);
    int total = 0;
    while (fgets(line, sizeof line, f)) {
        regmatch_t m[2];
        if (regexec(&re, line, 2, m, 0) != 0)
            fail_msg("torn line: '%s'", line);
        count[line[m[1].rm_so] - '0']++;
        total++;
    }
    regfree(&re);
    fclose(f);
    assert_int_equal(total, N_THREADS * N_LINES);
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(count[i], N_LINES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_level_parse, teardown),
        cmocka_unit_test_teardown(test_set_level, teardown),
        cmocka_unit_test_teardown(test_suppressed_not_evaluated, teardown),
        cmocka_unit_test_teardown(test_line_format, teardown),
        cmocka_unit_test_teardown(test_long_message_cut, teardown),
        cmocka_unit_test_teardown(test_errno_preserved, teardown),
        cmocka_unit_test_teardown(test_threads_whole_lines, teardown),
    };
    ps_log_init("psd", PS_LOG_INFO);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
