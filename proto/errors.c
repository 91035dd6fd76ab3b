/* errors.c - text for the PS_E* codes of errors.h. */
#include "errors.h"

const char *ps_strerror(int code)
{
    if (code < 0)
        code = -code;
    switch (code) {
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
    if (code < 0)
        code = -code;
    switch (code) {
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
