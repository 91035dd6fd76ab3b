/* errors.c - text for the PS_E* codes of errors.h. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

/* |code| without overflow: INT_MIN becomes a value no code has. */
static unsigned magnitude(int code)
{
    return code < 0 ? 0u - (unsigned)code : (unsigned)code;
}

const char *ps_strerror(int code)
{
    switch (magnitude(code)) {
    case 0:
        return "success";
#define PS_X_TEXT(name, num, text) \
    case num:                      \
        return text;
        PS_ERRNO_MAP(PS_X_TEXT)
#undef PS_X_TEXT
    }
    return "unknown error";
}

const char *ps_errname(int code)
{
    switch (magnitude(code)) {
    case 0:
        return "OK";
#define PS_X_NAME(name, num, text) \
    case num:                      \
        return #name;
        PS_ERRNO_MAP(PS_X_NAME)
#undef PS_X_NAME
    }
    return "UNKNOWN";
}

int ps_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
