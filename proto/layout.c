/* layout.c - building, comparing and fingerprinting model layouts. */
#include "layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "ps_limits.h"

void ps_layout_init(ps_layout *l)
{
    l->ntensors = 0;
    l->total = 0;
    l->nbuf = 0;
}

static const char *const buf_names[] = {"", "mean", "first"};
static const char *const save_names[] = {"F32", "F64", "I64", "I32"};

const char *ps_buf_name(unsigned buf)
{
    return buf < 3 ? buf_names[buf] : "?";
}

const char *ps_save_dt_name(unsigned save_dt)
{
    return save_dt < 4 ? save_names[save_dt] : "?";
}

static int name_index(const char *const *names, int n, int from, const char *s, size_t len)
{
    for (int i = from; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], s, len) == 0)
            return i;
    return -1;
}

int ps_buf_parse(const char *s, size_t len)
{
    return name_index(buf_names, 3, 1, s, len);
}

int ps_save_dt_parse(const char *s, size_t len)
{
    return name_index(save_names, 4, 0, s, len);
}

int ps_layout_set_buffer(ps_layout *l, unsigned buf, unsigned save_dt)
{
    if (l->ntensors == 0 || (buf != PS_BUF_MEAN && buf != PS_BUF_FIRST) || save_dt > PS_SAVE_I32)
        return PS_EINVAL;
    ps_tensor_desc *t = &l->t[l->ntensors - 1];
    if (!t->buf)
        l->nbuf++;
    t->buf = (uint8_t)buf;
    t->save_dt = (uint8_t)save_dt;
    return 0;
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
    t->buf = PS_BUF_NONE;
    t->save_dt = PS_SAVE_F32;
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
        if (t->buf) {
            int n = snprintf(num, sizeof num, "@%s/%s", ps_buf_name(t->buf), ps_save_dt_name(t->save_dt));
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
            memcmp(x->dims, y->dims, x->ndim * sizeof x->dims[0]) != 0 || x->buf != y->buf ||
            x->save_dt != y->save_dt)
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

int ps_part_bounds(uint64_t P, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi)
{
    if (n == 0 || n > PS_PARTS_MAX || i >= n || P > PS_PARAMS_MAX || (n > 1 && P < (uint64_t)n * PS_PART_ALIGN))
        return PS_EINVAL;
    /* P <= 2^34 and n <= 64: P * i fits in 64 bits */
    uint64_t a = i == 0 ? 0 : P * i / n / PS_PART_ALIGN * PS_PART_ALIGN;
    uint64_t b = i + 1 == n ? P : P * (i + 1) / n / PS_PART_ALIGN * PS_PART_ALIGN;
    *lo = a;
    *hi = b;
    return 0;
}

int ps_layout_part(const ps_layout *l, uint32_t i, uint32_t n, ps_layout *out, uint64_t *lo, uint64_t *hi)
{
    uint64_t a, b;
    int rc = ps_part_bounds(l->total, i, n, &a, &b);
    if (rc != 0)
        return rc;
    ps_layout_init(out);
    for (uint32_t k = 0; k < l->ntensors; k++) {
        const ps_tensor_desc *t = &l->t[k];
        uint64_t x = t->offset > a ? t->offset : a, y = t->offset + t->count < b ? t->offset + t->count : b;
        if (x >= y)
            continue;
        if (x == t->offset && y == t->offset + t->count) {
            rc = ps_layout_add(out, t->name, t->ndim, t->dims);
        } else {
            char name[PS_NAME_MAX + 2];
            uint32_t len = (uint32_t)(y - x);
            size_t w = (size_t)snprintf(name, sizeof name, "%s(", t->name);
            for (uint32_t d = 0; d < t->ndim && w < sizeof name; d++)
                w += (size_t)snprintf(name + w, sizeof name - w, d ? "x%u" : "%u", t->dims[d]);
            if (w < sizeof name)
                w += (size_t)snprintf(name + w, sizeof name - w, ")[%llu:%llu]", (unsigned long long)(x - t->offset),
                                      (unsigned long long)(y - t->offset));
            rc = w > PS_NAME_MAX || y - x > UINT32_MAX ? PS_EINVAL : ps_layout_add(out, name, 1, &len);
        }
        if (rc == 0 && t->buf)
            rc = ps_layout_set_buffer(out, t->buf, t->save_dt);
        if (rc != 0)
            return rc;
    }
    *lo = a;
    *hi = b;
    return 0;
}

/* Reads a piece's name "name(d0xd1...)[x:y]" into base, dims and the
 * range; 0, or -1 when the name is not of that form. */
static int parse_piece(const ps_tensor_desc *t, char *base, uint32_t *ndim, uint32_t *dims, uint64_t *x,
                       uint64_t *y)
{
    const char *s = t->name, *open = strrchr(s, '(');
    if (t->ndim != 1 || !open || open == s)
        return -1;
    const char *p = open + 1;
    char *end;
    *ndim = 0;
    for (;;) {
        if (*p < '0' || *p > '9' || *ndim == PS_DIMS_MAX)
            return -1;
        unsigned long long d = strtoull(p, &end, 10);
        if (d == 0 || d > UINT32_MAX)
            return -1;
        dims[(*ndim)++] = (uint32_t)d;
        p = end;
        if (*p == 'x')
            p++;
        else if (*p == ')')
            break;
        else
            return -1;
    }
    if (p[1] != '[' || p[2] < '0' || p[2] > '9')
        return -1;
    *x = strtoull(p + 2, &end, 10);
    if (*end != ':' || end[1] < '0' || end[1] > '9')
        return -1;
    *y = strtoull(end + 1, &end, 10);
    if (end[0] != ']' || end[1] != '\0' || *y <= *x || *y - *x != t->count)
        return -1;
    memcpy(base, s, (size_t)(open - s));
    base[open - s] = '\0';
    return 0;
}

int ps_layout_first_piece(const ps_layout *l)
{
    char base[PS_NAME_MAX + 1];
    uint32_t ndim, dims[PS_DIMS_MAX];
    uint64_t x, y;
    for (uint32_t k = 0; k < l->ntensors; k++)
        if (parse_piece(&l->t[k], base, &ndim, dims, &x, &y) == 0)
            return (int)k;
    return -1;
}

__attribute__((format(printf, 3, 4)))
static int join_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return PS_EINVAL;
}

int ps_layout_join(const ps_layout *const *parts, uint32_t n, ps_layout *out, char *err, size_t errlen)
{
    char base[PS_NAME_MAX + 1] = "", pbase[PS_NAME_MAX + 1];
    uint32_t dims[PS_DIMS_MAX], pdims[PS_DIMS_MAX], ndim = 0, pndim;
    uint64_t count = 0, have = 0, x, y;
    int open = 0;
    ps_layout_init(out);
    if (n == 0 || n > PS_PARTS_MAX)
        return join_fail(err, errlen, "%u parts: 1 to %u may hold a model", n, PS_PARTS_MAX);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < parts[i]->ntensors; k++) {
            const ps_tensor_desc *t = &parts[i]->t[k];
            int rc;
            if (parse_piece(t, pbase, &pndim, pdims, &x, &y) == 0) {
                uint64_t c = 1;
                for (uint32_t d = 0; d < pndim; d++)
                    c *= pdims[d];
                if (!open) {
                    if (x != 0)
                        return join_fail(err, errlen, "part %u begins with %s, whose values before %llu no part "
                                                      "holds", i + 1, t->name, (unsigned long long)x);
                    memcpy(base, pbase, sizeof base);
                    memcpy(dims, pdims, sizeof dims);
                    ndim = pndim;
                    count = c;
                    open = 1;
                } else if (strcmp(base, pbase) != 0 || ndim != pndim ||
                           memcmp(dims, pdims, ndim * sizeof dims[0]) != 0 || x != have) {
                    return join_fail(err, errlen, "part %u goes on with %s where the rest of %s from value %llu "
                                                  "should be", i + 1, t->name, base, (unsigned long long)have);
                }
                if (y > count)
                    return join_fail(err, errlen, "%s ends past its tensor's %llu values", t->name,
                                     (unsigned long long)count);
                have = y;
                if (have < count)
                    continue;
                open = 0;
                rc = ps_layout_add(out, base, ndim, dims);
                if (rc == 0 && t->buf)
                    rc = ps_layout_set_buffer(out, t->buf, t->save_dt);
            } else {
                if (open)
                    return join_fail(err, errlen, "part %u goes on with %s where the rest of %s from value %llu "
                                                  "should be", i + 1, t->name, base, (unsigned long long)have);
                rc = ps_layout_add(out, t->name, t->ndim, t->dims);
                if (rc == 0 && t->buf)
                    rc = ps_layout_set_buffer(out, t->buf, t->save_dt);
            }
            if (rc != 0)
                return join_fail(err, errlen, "the joined layout does not fit the protocol's limits");
        }
    if (open)
        return join_fail(err, errlen, "no part holds the rest of %s from value %llu", base, (unsigned long long)have);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t lo, hi;
        if (ps_part_bounds(out->total, i, n, &lo, &hi) != 0 || hi - lo != parts[i]->total)
            return join_fail(err, errlen, "part %u holds %llu values, not part %u of %u of a model of %llu values",
                             i + 1, (unsigned long long)parts[i]->total, i + 1, n, (unsigned long long)out->total);
    }
    return 0;
}
