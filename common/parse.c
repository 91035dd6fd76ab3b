/* parse.c - numbers from text (parse.h). */
#include "parse.h"

#include <errno.h>
#include <stdlib.h>

int ps_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}
