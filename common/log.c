/* log.c - formatting and writing of log records; see log.h. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

atomic_int ps_log__level = PS_LOG_INFO;

static char log_progname[32] = "ps";   /* set once by ps_log_init */
static _Atomic(FILE *) log_file;        /* NULL means stderr */

#define LOG_LINE_MAX 4096               /* one record, newline included */

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

static int clamp_level(int level)
{
    if (level < PS_LOG_DEBUG)
        return PS_LOG_DEBUG;
    if (level > PS_LOG_ERROR)
        return PS_LOG_ERROR;
    return level;
}

void ps_log_init(const char *progname, int level)
{
    if (progname) {
        /* Keep the last path component: "./build/psd" logs as "psd". */
        const char *slash = strrchr(progname, '/');
        if (slash && slash[1])
            progname = slash + 1;
        size_t n = strlen(progname);
        if (n >= sizeof log_progname)
            n = sizeof log_progname - 1;
        memcpy(log_progname, progname, n);
        log_progname[n] = '\0';
    }
    ps_log_set_level(level);
}

void ps_log_set_level(int level)
{
    atomic_store_explicit(&ps_log__level, clamp_level(level), memory_order_relaxed);
}

int ps_log_get_level(void)
{
    return atomic_load_explicit(&ps_log__level, memory_order_relaxed);
}

int ps_log_enabled(int level)
{
    return level >= ps_log_get_level();
}

int ps_log_level_parse(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcasecmp(name, level_names[i]) == 0)
            return i;
    if (strcasecmp(name, "warning") == 0)
        return PS_LOG_WARN;
    return -1;
}

const char *ps_log_level_name(int level)
{
    if (level < PS_LOG_DEBUG || level > PS_LOG_ERROR)
        return "?";
    return level_names[level];
}

void ps_log_set_file(FILE *f)
{
    atomic_store(&log_file, f);
}

/* Write "YYYY-MM-DDTHH:MM:SS.mmmZ" into buf (at least 25 bytes). */
static void format_time(char *buf, size_t len)
{
    struct timespec ts;
    struct tm tm;

    if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || !gmtime_r(&ts.tv_sec, &tm)) {
        snprintf(buf, len, "0000-00-00T00:00:00.000Z");
        return;
    }
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
}

void ps_log_write(int level, const char *fmt, ...)
{
    int saved_errno = errno;
    char line[LOG_LINE_MAX];
    char stamp[32];
    va_list ap;

    format_time(stamp, sizeof stamp);
    int head = snprintf(line, sizeof line, "%s %s[%ld] %s ", stamp, log_progname,
                        (long)getpid(), ps_log_level_name(level));
    if (head < 0 || (size_t)head >= sizeof line)
        head = 0;

    /* Leave room for the newline and the terminating NUL. */
    size_t room = sizeof line - (size_t)head - 1;
    va_start(ap, fmt);
    int n = vsnprintf(line + head, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;

    size_t len;
    if ((size_t)n >= room) {
        /* Cut: mark it so nobody mistakes the line for the whole message. */
        len = sizeof line - 2;
        memcpy(line + len - 3, "...", 3);
    } else {
        len = (size_t)head + (size_t)n;
        while (len > (size_t)head && line[len - 1] == '\n')
            len--;
    }
    line[len++] = '\n';
    line[len] = '\0';

    FILE *f = atomic_load(&log_file);
    if (!f)
        f = stderr;
    /* One call, so stdio's per-stream lock keeps the record whole. */
    fwrite(line, 1, len, f);
    fflush(f);
    errno = saved_errno;
}

void ps_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
