/* errors.h - error codes shared by every psd program and the wire.
 *
 * Functions return 0 on success or a negative PS_E* code. The same numbers,
 * made positive, travel in the `code` field of an ERROR message (see
 * proto/PROTOCOL.md), so a code means the same thing in a log line, a return
 * value and a reply. */
#ifndef PS_ERRORS_H
#define PS_ERRORS_H

#include <stddef.h>

#define PS_ERRNO_MAP(X)                                                              \
    X(MALFORMED, 1, "malformed frame or message")                                    \
    X(TOO_BIG, 2, "frame larger than the limit")                                     \
    X(UNSUPPORTED, 3, "unsupported protocol version")                                \
    X(BAD_TYPE, 4, "unknown message type")                                           \
    X(BAD_FIELD, 5, "missing or invalid field")                                      \
    X(STATE, 6, "message not allowed in this connection state")                      \
    X(LAYOUT, 7, "model layout differs from the one the server holds")               \
    X(RANGE, 8, "key range outside the model")                                       \
    X(NONFINITE, 9, "gradient contains NaN or infinity")                             \
    X(STALE, 10, "push for a round that is already closed")                          \
    X(DUPLICATE, 11, "second push for the same round")                               \
    X(SHARD, 12, "shard already taken or out of range")                              \
    X(NOT_READY, 13, "model not initialised yet")                                    \
    X(AUTH, 14, "authentication failed")                                             \
    X(FORBIDDEN, 15, "role may not do this")                                         \
    X(LIMIT, 16, "server limit reached")                                             \
    X(SHUTDOWN, 17, "server shutting down")                                          \
    X(NOMEM, 18, "out of memory")                                                    \
    X(IO, 19, "input/output error")                                                  \
    X(CONNECT, 20, "cannot connect")                                                 \
    X(TIMEOUT, 21, "timed out")                                                      \
    X(CLOSED, 22, "connection closed by peer")                                       \
    X(INVAL, 23, "invalid argument")                                                 \
    X(REMOTE, 24, "error reported by the peer")                                      \
    X(NOT_LEADER, 25, "this psd follows a leader; ask the leader")                  \
    X(MOVED, 26, "the key's part moved; the part map names its owner")

enum {
    PS_OK = 0,
#define PS_X_ENUM(name, num, text) PS_E##name = -(num),
    PS_ERRNO_MAP(PS_X_ENUM)
#undef PS_X_ENUM
};

/* A short English description of code (negative or positive); never NULL. */
const char *ps_strerror(int code);

/* The symbolic name ("MALFORMED") of code; "UNKNOWN" for codes not listed. */
const char *ps_errname(int code);

/* Writes the message fmt, ... into err (errlen bytes; nothing when 0) and
 * returns code: `return ps_fail(err, errlen, PS_EBAD_FIELD, "...", ...);`. */
int ps_fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
