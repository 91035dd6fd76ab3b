/* log.h - one-line log records on stderr for psd, psworker and psctl.
 *
 * Every record is one line:
 *
 *     2026-11-22T02:19:14.123Z psd[4711] INFO listening on 127.0.0.1:7000
 *
 * with the time in UTC, the program name given to ps_log_init() and the pid.
 * Timestamps are written whether or not stderr is a terminal; under systemd
 * the journal keeps its own as well, which does no harm.
 *
 * PS_LOG() tests the level before it evaluates its arguments, so a debug
 * line costs one comparison when debug logging is off. A record is built in
 * a buffer and written with a single stdio call, so lines from two threads
 * (a worker's compute and comm threads) never interleave within a line. */
#ifndef PS_LOG_H
#define PS_LOG_H

#include <stdatomic.h>
#include <stdio.h>

enum ps_log_level {
    PS_LOG_DEBUG = 0,
    PS_LOG_INFO = 1,
    PS_LOG_WARN = 2,
    PS_LOG_ERROR = 3,
};

/* The current threshold; read it through PS_LOG, set it with
 * ps_log_set_level(). Internal, hence the double underscore. */
extern atomic_int ps_log__level;

/* Log a printf-style message at level if level is enabled. The arguments
 * after level are not evaluated when it is not. A trailing newline in the
 * message is dropped; the record always ends with exactly one. */
#define PS_LOG(level, ...)                                                              \
    do {                                                                                \
        int ps_log__l = (level);                                                        \
        if (ps_log__l >= atomic_load_explicit(&ps_log__level, memory_order_relaxed))    \
            ps_log_write(ps_log__l, __VA_ARGS__);                                       \
    } while (0)

/* Set the program name shown in every record (the string is copied, at most
 * 31 bytes kept; NULL keeps the previous name, initially "ps") and the
 * threshold. Call once at start-up, before other threads exist. */
void ps_log_init(const char *progname, int level);

/* Change or read the threshold; safe from any thread (a SIGHUP reload runs
 * on the loop thread while a worker's comm thread may be logging). A level
 * outside debug..error is clamped. */
void ps_log_set_level(int level);
int ps_log_get_level(void);

/* True when a record at level would be written; for work that prepares a
 * log line in several steps. */
int ps_log_enabled(int level);

/* "debug", "info", "warn" or "error" (any case) -> PS_LOG_*; anything else
 * -> -1. "warning" is accepted as a synonym of "warn". */
int ps_log_level_parse(const char *name);

/* "DEBUG", "INFO", "WARN", "ERROR"; "?" for anything else. */
const char *ps_log_level_name(int level);

/* Send records to f instead of stderr (NULL: back to stderr). For tests;
 * the caller keeps f open while it is in use. */
void ps_log_set_file(FILE *f);

/* Write one record unconditionally (PS_LOG has done the level test).
 * Preserves errno. Messages longer than about 4 KiB are cut and end in
 * "...". */
void ps_log_write(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The message of a refusal, into the caller's buffer (the one error
 * convention: a PS_E* code returned with its text in err); nothing when
 * err is NULL or errlen is 0. */
void ps_errf(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
