/* test_psctl_commands.c - psctl's command table (psctl/commands.c): the
 * usage lists every command under the right heading and within its width,
 * docs/running.md's table of commands is the one the table makes (every
 * command a row), an unknown
 * command gets one clear line naming them all (and the near one), and a
 * call is checked against its row. */
#define _GNU_SOURCE /* open_memstream */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "psctl/psctl.h"

/* What fn writes to a FILE, as a string (free it). */
static char *capture(void (*fn)(FILE *, const char *), const char *arg)
{
    static char *text; /* static: open_memstream writes it at fclose */
    static size_t len;
    text = NULL;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    fn(f, arg);
    fclose(f);
    return text;
}

static void usage_of(FILE *f, const char *unused)
{
    (void)unused;
    psctl_commands_usage(f);
}

/* The line of text that starts with prefix, or NULL. */
static const char *line_starting(const char *text, const char *prefix)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, strlen(prefix)) == 0)
            return p;
    return NULL;
}

static void test_usage_lists_every_command(void **state)
{
    (void)state;
    size_t n;
    const psctl_command *cmds = psctl_commands(&n);
    assert_true(n >= 11);
    char *u = capture(usage_of, NULL);
    const char *controlling = line_starting(u, "Controlling");
    assert_non_null(line_starting(u, "Reading"));
    assert_non_null(controlling);
    for (size_t i = 0; i < n; i++) {
        char head[64];
        snprintf(head, sizeof head, "  %s%s ", cmds[i].name, cmds[i].args);
        const char *line = line_starting(u, head);
        if (!line) { /* a long name: its help starts on the next line */
            snprintf(head, sizeof head, "  %s%s\n", cmds[i].name, cmds[i].args);
            line = line_starting(u, head);
        }
        assert_non_null(line);
        /* the reading commands under "Reading", the others under "Controlling" */
        assert_int_equal(line < controlling, (cmds[i].flags & PSCTL_READS) != 0);
        assert_non_null(cmds[i].run);
        assert_true(cmds[i].help && cmds[i].help[0]);
        assert_true(cmds[i].min_args <= cmds[i].max_args);
        assert_ptr_equal(psctl_command_find(cmds[i].name), &cmds[i]);
    }
    for (const char *p = u; *p;) {
        size_t len = strcspn(p, "\n");
        assert_true(len <= PSCTL_USAGE_WIDTH);
        p += len + (p[len] == '\n');
    }
    /* every help's words, wrapped, all there in order */
    size_t j = 0;
    for (size_t i = 0; u[i]; i++)
        if (u[i] != ' ' && u[i] != '\n')
            u[j++] = u[i];
        else if (j && u[j - 1] != ' ')
            u[j++] = ' ';
    u[j] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!strstr(u, cmds[i].help))
            fail_msg("the usage lost words of %s's help", cmds[i].name);
    free(u);
}

static void test_every_command_is_documented(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/running.md", PS_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char doc[1 << 20];
    size_t len = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[len] = '\0';
    const char *section = strstr(doc, "\n## psctl\n");
    assert_non_null(section);
    const char *end = strstr(section + 1, "\n## ");
    /* the table of commands is the one the command table makes */
    static const char begin[] = "<!-- psctl commands: begin (psctl --commands-markdown, from psctl/commands.c) -->\n";
    const char *from = strstr(section, begin), *to = from ? strstr(from, "<!-- psctl commands: end -->") : NULL;
    if (!from || !to || (end && to > end))
        fail_msg("docs/running.md's psctl section lacks the table of commands between its markers");
    from += strlen(begin);
    char *made = NULL;
    size_t made_len = 0;
    FILE *m = open_memstream(&made, &made_len);
    assert_non_null(m);
    psctl_commands_markdown(m);
    fclose(m);
    if ((size_t)(to - from) != made_len || memcmp(from, made, made_len) != 0)
        fail_msg("docs/running.md's table of psctl commands is not what psctl/commands.c makes: paste "
                 "`build/psctl/psctl --commands-markdown` between its markers");
    size_t n;
    const psctl_command *cmds = psctl_commands(&n);
    for (size_t i = 0; i < n; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "| `%s", cmds[i].name);
        if (!strstr(made, quoted) || !cmds[i].doc || !cmds[i].doc[0])
            fail_msg("psctl %s has no row of its own in the table of commands", cmds[i].name);
    }
    free(made);
}

static void unknown_of(FILE *f, const char *name)
{
    psctl_unknown_command(f, name);
}

static void test_unknown_command(void **state)
{
    (void)state;
    assert_null(psctl_command_find("frobnicate"));
    assert_null(psctl_command_find(""));
    assert_null(psctl_command_find("Status"));
    char *e = capture(unknown_of, "frobnicate");
    assert_non_null(strstr(e, "psctl: unknown command 'frobnicate' (commands: "));
    assert_null(strstr(e, "did you mean"));
    size_t n;
    const psctl_command *cmds = psctl_commands(&n);
    for (size_t i = 0; i < n; i++) {
        char word[64];
        snprintf(word, sizeof word, " %s%s", cmds[i].name, i + 1 < n ? "," : ")");
        assert_non_null(strstr(e, word));
    }
    assert_int_equal(strchr(e, '\n') - e + 1, (long)strlen(e)); /* one line */
    free(e);
    e = capture(unknown_of, "stauts");
    assert_non_null(strstr(e, "did you mean 'status'? "));
    free(e);
    e = capture(unknown_of, "checkpiont");
    assert_non_null(strstr(e, "did you mean 'checkpoint'? "));
    free(e);
}

static void test_call_checked_against_its_row(void **state)
{
    (void)state;
    char *none[1] = {NULL};
    char *kv[2] = {"lr=0.1", "momentum"};
    char *path[2] = {"model.safetensors", "extra"};
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    assert_non_null(stderr);
    assert_int_equal(psctl_command_check(psctl_command_find("status"), none, 0, 1, 0, 0), EXIT_OK);
    assert_int_equal(psctl_command_check(psctl_command_find("status"), path, 1, 0, 0, 0), EXIT_USAGE);
    assert_int_equal(psctl_command_check(psctl_command_find("metrics"), none, 0, 1, 0, 0), EXIT_USAGE);
    assert_int_equal(psctl_command_check(psctl_command_find("reset"), none, 0, 0, 0, 1), EXIT_OK);
    assert_int_equal(psctl_command_check(psctl_command_find("status"), none, 0, 0, 0, 1), EXIT_USAGE);
    assert_int_equal(psctl_command_check(psctl_command_find("set"), kv, 1, 0, 0, 0), EXIT_OK);
    assert_int_equal(psctl_command_check(psctl_command_find("set"), kv, 2, 0, 0, 0), EXIT_USAGE);
    assert_int_equal(psctl_command_check(psctl_command_find("set"), none, 0, 0, 0, 0), EXIT_USAGE);
    assert_int_equal(psctl_command_check(psctl_command_find("save"), path, 1, 0, 0, 0), EXIT_OK);
    assert_int_equal(psctl_command_check(psctl_command_find("save"), path, 2, 0, 0, 0), EXIT_USAGE);
    fclose(stderr);
    stderr = saved;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_lists_every_command),
        cmocka_unit_test(test_every_command_is_documented),
        cmocka_unit_test(test_unknown_command),
        cmocka_unit_test(test_call_checked_against_its_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
