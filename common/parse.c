/* parse.c - integers from text (parse.h): the project's one integer
 * parser. */
#include "parse.h"

#include <errno.h>
#include <stdlib.h>

int ps_parse_u64_head(const char *s, uint64_t *out, const char **end)
{
    if (!s || *s < '0' || *s > '9')
        return PS_PARSE_SYNTAX;
    char *e;
    errno = 0;
    /* s starts with a digit, so strtoull skips no space and reads no sign */
    unsigned long long v = strtoull(s, &e, 10);
    *end = e;
    if (errno == ERANGE)
        return PS_PARSE_RANGE;
    *out = v;
    return 0;
}

int ps_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    const char *end;
    int rc = ps_parse_u64_head(s, &v, &end);
    if (rc == PS_PARSE_SYNTAX || *end)
        return PS_PARSE_SYNTAX;
    if (rc == PS_PARSE_RANGE || v > max)
        return PS_PARSE_RANGE;
    *out = v;
    return 0;
}

int ps_parse_i64(const char *s, int64_t *out)
{
    if (!s)
        return PS_PARSE_SYNTAX;
    int neg = *s == '-';
    uint64_t mag;
    int rc = ps_parse_u64(s + (neg || *s == '+'), UINT64_MAX, &mag);
    if (rc)
        return rc;
    if (neg ? mag > (uint64_t)INT64_MAX + 1 : mag > (uint64_t)INT64_MAX)
        return PS_PARSE_RANGE;
    /* -(INT64_MAX + 1) without overflowing on the way */
    *out = neg ? (mag ? -(int64_t)(mag - 1) - 1 : 0) : (int64_t)mag;
    return 0;
}
