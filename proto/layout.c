/* layout.c - building, comparing and fingerprinting model layouts. */
#include "layout.h"

#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "ps_limits.h"

void ps_layout_init(ps_layout *l)
{
    l->ntensors = 0;
    l->total = 0;
}

int ps_layout_add(ps_layout *l, const char *name, uint32_t ndim, const uint32_t *dims)
{
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen > PS_NAME_MAX)
        return PS_EINVAL;
    for (size_t i = 0; i < nlen; i++)
        if (name[i] < 0x21 || name[i] > 0x7e)
            return PS_EINVAL;
    if (ndim < 1 || ndim > PS_DIMS_MAX || l->ntensors >= PS_TENSORS_MAX)
        return PS_EINVAL;
    uint64_t count = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (dims[d] == 0 || count > PS_PARAMS_MAX / dims[d])
            return PS_EINVAL;
        count *= dims[d];
    }
    if (count > PS_PARAMS_MAX - l->total)
        return PS_EINVAL;
    ps_tensor_desc *t = &l->t[l->ntensors++];
    memcpy(t->name, name, nlen + 1);
    t->ndim = ndim;
    memset(t->dims, 0, sizeof t->dims);
    memcpy(t->dims, dims, ndim * sizeof *dims);
    t->offset = l->total;
    t->count = count;
    l->total += count;
    return 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t ps_layout_fingerprint(const ps_layout *l)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    char num[24];
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        h = fnv1a(h, t->name, strlen(t->name));
        h = fnv1a(h, ":", 1);
        for (uint32_t d = 0; d < t->ndim; d++) {
            int n = snprintf(num, sizeof num, d ? "x%u" : "%u", t->dims[d]);
            h = fnv1a(h, num, (size_t)n);
        }
        h = fnv1a(h, ";", 1);
    }
    return h;
}

int ps_layout_equal(const ps_layout *a, const ps_layout *b)
{
    if (a->ntensors != b->ntensors || a->total != b->total)
        return 0;
    for (uint32_t i = 0; i < a->ntensors; i++) {
        const ps_tensor_desc *x = &a->t[i], *y = &b->t[i];
        if (x->ndim != y->ndim || strcmp(x->name, y->name) != 0 ||
            memcmp(x->dims, y->dims, x->ndim * sizeof x->dims[0]) != 0)
            return 0;
    }
    return 1;
}

void ps_layout_describe(const ps_layout *l, char *buf, size_t len)
{
    size_t pos = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    for (uint32_t i = 0; i < l->ntensors && pos + 1 < len; i++) {
        const ps_tensor_desc *t = &l->t[i];
        int n = snprintf(buf + pos, len - pos, "%s%s[", i ? " " : "", t->name);
        if (n < 0 || (size_t)n >= len - pos)
            break;
        pos += (size_t)n;
        for (uint32_t d = 0; d < t->ndim && pos + 1 < len; d++) {
            n = snprintf(buf + pos, len - pos, d ? ",%u" : "%u", t->dims[d]);
            if (n < 0 || (size_t)n >= len - pos)
                return;
            pos += (size_t)n;
        }
        n = snprintf(buf + pos, len - pos, "]");
        if (n < 0 || (size_t)n >= len - pos)
            return;
        pos += (size_t)n;
    }
}
