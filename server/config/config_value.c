/* config_value.c - what the option table (config.c) drives: parsing values
 * (integers, sizes, durations, booleans, words, host:port), validating and
 * setting them, formatting them back, and loading a configuration file;
 * "did you mean" for an unknown key. Owns nothing but its arguments. */
#include "server/config/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "common/log.h"
#include "common/parse.h"
#include "proto/errors.h"

/* Levenshtein distance, for "did you mean"; long strings count as far. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t row[65];

    if (la > 64 || lb > 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static void unknown_key(const char *key, char *err, size_t errlen)
{
    size_t n_opt;
    const ps_config_option *options = ps_config_options(&n_opt);
    const char *best = NULL;
    char lower[65];
    size_t n = strlen(key);

    /* Suggest the nearest name if it is at most 2 edits away (ignoring
     * case) and the key is not so short that anything would be near. */
    if (n < sizeof lower) {
        size_t best_d = n < 2 ? n : 2;
        for (size_t i = 0; i <= n; i++)
            lower[i] = (char)tolower((unsigned char)key[i]);
        for (size_t i = 0; i < n_opt; i++) {
            size_t d = edit_distance(lower, options[i].name);
            if (d <= best_d && d < n && (!best || d < best_d)) {
                best_d = d;
                best = options[i].name;
            }
        }
    }
    if (best)
        ps_errf(err, errlen, "unknown key '%.64s' (did you mean '%s'?)", key, best);
    else
        ps_errf(err, errlen, "unknown key '%.64s'", key);
}

/* ---- value parsers: text -> number, 0 or PS_EINVAL, no messages ----
 * (integers: common/parse.c's, the one integer parser) */

static int parse_double(const char *s, double *out)
{
    char *end;

    if (!*s)
        return PS_EINVAL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end)
        return PS_EINVAL;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1"};
    static const char *const no[] = {"no", "false", "off", "0"};

    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return PS_EINVAL;
}

int ps_config_parse_size(const char *s, uint64_t *bytes)
{
    const char *end;
    uint64_t v;
    unsigned shift = 0;

    if (ps_parse_u64_head(s, &v, &end) != 0)
        return PS_EINVAL;
    switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: break;
    }
    if (!(*end == '\0' || strcasecmp(end, "b") == 0 || (shift && strcasecmp(end, "ib") == 0)))
        return PS_EINVAL;
    if (shift && v > (UINT64_MAX >> shift))
        return PS_EINVAL;
    *bytes = (uint64_t)v << shift;
    return 0;
}

int ps_config_parse_duration(const char *s, uint64_t *ms)
{
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    char *end;

    if (!s || !(isdigit((unsigned char)*s) || (*s == '.' && isdigit((unsigned char)s[1]))))
        return PS_EINVAL;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return PS_EINVAL;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0) {
            double r = round(v * units[i].ms);
            if (r >= 18446744073709551616.0) /* 2^64 */
                return PS_EINVAL;
            *ms = (uint64_t)r;
            return 0;
        }
    }
    return PS_EINVAL;
}

/* ---- formatting ---- */

/* Shortest %g text that reads back as exactly v, without an exponent for
 * numbers of ordinary size ("1000", not "1e+03"). */
static int format_double(double v, char *buf, size_t len)
{
    char tmp[64];
    bool plain = v == 0 || (fabs(v) >= 1e-4 && fabs(v) < 1e15);

    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v && (!plain || !strchr(tmp, 'e')))
            break;
    }
    return snprintf(buf, len, "%s", tmp);
}

static int format_size(uint64_t v, char *buf, size_t len)
{
    static const char units[] = "KMGT";

    if (v != 0) {
        for (int i = 3; i >= 0; i--) {
            unsigned shift = 10u * (unsigned)(i + 1);
            if ((v & ((UINT64_C(1) << shift) - 1)) == 0)
                return snprintf(buf, len, "%llu%c", (unsigned long long)(v >> shift), units[i]);
        }
    }
    return snprintf(buf, len, "%llu", (unsigned long long)v);
}

static int format_duration(uint64_t ms, char *buf, size_t len)
{
    if (ms != 0 && ms % 3600000 == 0)
        return snprintf(buf, len, "%lluh", (unsigned long long)(ms / 3600000));
    if (ms != 0 && ms % 60000 == 0)
        return snprintf(buf, len, "%llum", (unsigned long long)(ms / 60000));
    if (ms % 1000 == 0)
        return snprintf(buf, len, "%llus", (unsigned long long)(ms / 1000));
    return snprintf(buf, len, "%llums", (unsigned long long)ms);
}

static int format_bound(const ps_config_option *o, int64_t v, char *buf, size_t len)
{
    if (o->type == PS_CT_SIZE)
        return format_size((uint64_t)v, buf, len);
    if (o->type == PS_CT_DURATION)
        return format_duration((uint64_t)v, buf, len);
    return snprintf(buf, len, "%lld", (long long)v);
}

int ps_config_format(const ps_config *c, const ps_config_option *o, char *buf, size_t len)
{
    const char *field = (const char *)c + o->offset;

    switch (o->type) {
    case PS_CT_BOOL: {
        bool v;
        memcpy(&v, field, sizeof v);
        return snprintf(buf, len, "%s", v ? "yes" : "no");
    }
    case PS_CT_INT: {
        int v;
        memcpy(&v, field, sizeof v);
        return snprintf(buf, len, "%d", v);
    }
    case PS_CT_U64: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        return snprintf(buf, len, "%llu", (unsigned long long)v);
    }
    case PS_CT_DOUBLE: {
        double v;
        memcpy(&v, field, sizeof v);
        return format_double(v, buf, len);
    }
    case PS_CT_ENUM: {
        int v, n = 0;
        memcpy(&v, field, sizeof v);
        while (o->words[n])
            n++;
        return snprintf(buf, len, "%s", v >= 0 && v < n ? o->words[v] : "?");
    }
    case PS_CT_STRING:
        return snprintf(buf, len, "%s", field);
    case PS_CT_SIZE: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        return format_size(v, buf, len);
    }
    case PS_CT_DURATION: {
        uint64_t v;
        memcpy(&v, field, sizeof v);
        return format_duration(v, buf, len);
    }
    case PS_CT_HOSTPORT: {
        const ps_hostport *hp = (const ps_hostport *)field;
        if (strchr(hp->host, ':'))
            return snprintf(buf, len, "[%s]:%d", hp->host, hp->port);
        return snprintf(buf, len, "%s:%d", hp->host, hp->port);
    }
    }
    return snprintf(buf, len, "?");
}

void ps_config_print(const ps_config *c, FILE *f)
{
    size_t n_opt;
    const ps_config_option *options = ps_config_options(&n_opt);
    char buf[PS_CONFIG_VALUE_MAX];

    for (size_t i = 0; i < n_opt; i++) {
        ps_config_format(c, &options[i], buf, sizeof buf);
        fprintf(f, "%s = %s\n", options[i].name, buf);
    }
}

bool ps_config_differs(const ps_config *a, const ps_config *b, const ps_config_option *o)
{
    char va[PS_CONFIG_VALUE_MAX], vb[PS_CONFIG_VALUE_MAX];

    ps_config_format(a, o, va, sizeof va);
    ps_config_format(b, o, vb, sizeof vb);
    return strcmp(va, vb) != 0;
}

/* ---- setting ---- */

/* The types' validate hooks (see ps_config_validate_fn): text, already
 * trimmed, parsed and checked against the row's bounds, then copied into
 * field. On error the field is untouched. */

static int validate_bool(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    bool v;
    if (parse_bool(text, &v) != 0) {
        ps_errf(err, errlen, "%s: '%.64s' is not a boolean (use yes or no)", o->name, text);
        return PS_EINVAL;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

static int validate_int(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    int64_t v = 0;
    int rc = ps_parse_i64(text, &v);
    if (rc == PS_PARSE_SYNTAX) {
        ps_errf(err, errlen, "%s: '%.64s' is not an integer", o->name, text);
        return PS_EINVAL;
    }
    if (rc == PS_PARSE_RANGE || v < o->lo || v > o->hi) {
        ps_errf(err, errlen, "%s: %.64s is out of range %lld..%lld", o->name, text, (long long)o->lo,
                (long long)o->hi);
        return PS_EINVAL;
    }
    int iv = (int)v;
    memcpy(field, &iv, sizeof iv);
    return 0;
}

static int validate_u64(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    uint64_t v = 0;
    int rc = ps_parse_u64(text, UINT64_MAX, &v);
    if (rc == PS_PARSE_SYNTAX) {
        ps_errf(err, errlen, "%s: '%.64s' is not a non-negative integer", o->name, text);
        return PS_EINVAL;
    }
    if (rc == PS_PARSE_RANGE || v < (uint64_t)o->lo || v > (uint64_t)o->hi) {
        ps_errf(err, errlen, "%s: %.64s is out of range %lld..%lld", o->name, text, (long long)o->lo,
                (long long)o->hi);
        return PS_EINVAL;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

static int validate_double(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    double v;
    char lo[32], hi[32];
    if (parse_double(text, &v) != 0) {
        ps_errf(err, errlen, "%s: '%.64s' is not a number", o->name, text);
        return PS_EINVAL;
    }
    if (!isfinite(v)) {
        ps_errf(err, errlen, "%s: '%.64s' is not a finite number", o->name, text);
        return PS_EINVAL;
    }
    if (v < o->dmin || v > o->dmax) {
        format_double(o->dmin, lo, sizeof lo);
        format_double(o->dmax, hi, sizeof hi);
        ps_errf(err, errlen, "%s: %.64s is out of range %s..%s", o->name, text, lo, hi);
        return PS_EINVAL;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

static int validate_enum(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    for (int i = 0; o->words[i]; i++) {
        if (strcasecmp(text, o->words[i]) == 0) {
            memcpy(field, &i, sizeof i);
            return 0;
        }
    }
    char list[256] = "";
    for (int i = 0; o->words[i]; i++) {
        if (i > 0)
            strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, o->words[i], sizeof list - strlen(list) - 1);
    }
    ps_errf(err, errlen, "%s: '%.64s' is not one of %s", o->name, text, list);
    return PS_EINVAL;
}

static int validate_string(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    size_t n = strlen(text);
    if (n >= o->size) {
        ps_errf(err, errlen, "%s: value is %zu bytes long, the limit is %zu", o->name, n, o->size - 1);
        return PS_EINVAL;
    }
    memset(field, 0, o->size);
    memcpy(field, text, n);
    return 0;
}

/* SIZE and DURATION: a number with a unit, in lo..hi. */
static int validate_units(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    uint64_t v;
    char lo[32], hi[32];
    int rc = o->type == PS_CT_SIZE ? ps_config_parse_size(text, &v) : ps_config_parse_duration(text, &v);
    if (rc != 0) {
        if (o->type == PS_CT_SIZE)
            ps_errf(err, errlen,
                    "%s: '%.64s' is not a size (a whole number of bytes with an "
                    "optional unit K, M, G or T)", o->name, text);
        else
            ps_errf(err, errlen, "%s: '%.64s' is not a duration (a number with a unit ms, s, m or h)", o->name,
                    text);
        return PS_EINVAL;
    }
    if (v < (uint64_t)o->lo || v > (uint64_t)o->hi) {
        format_bound(o, o->lo, lo, sizeof lo);
        format_bound(o, o->hi, hi, sizeof hi);
        ps_errf(err, errlen, "%s: %.64s is out of range %s..%s", o->name, text, lo, hi);
        return PS_EINVAL;
    }
    memcpy(field, &v, sizeof v);
    return 0;
}

static int validate_hostport(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    ps_hostport hp;
    char msg[512];
    memset(&hp, 0, sizeof hp);
    if (ps_hostport_parse(text, hp.host, sizeof hp.host, &hp.port, msg, sizeof msg) != 0) {
        ps_errf(err, errlen, "%s: %s", o->name, msg);
        return PS_EINVAL;
    }
    memcpy(field, &hp, sizeof hp);
    return 0;
}

ps_config_validate_fn ps_config_validator(const ps_config_option *o)
{
    if (o->validate)
        return o->validate;
    switch (o->type) {
    case PS_CT_BOOL: return validate_bool;
    case PS_CT_INT: return validate_int;
    case PS_CT_U64: return validate_u64;
    case PS_CT_DOUBLE: return validate_double;
    case PS_CT_ENUM: return validate_enum;
    case PS_CT_STRING: return validate_string;
    case PS_CT_SIZE:
    case PS_CT_DURATION: return validate_units;
    case PS_CT_HOSTPORT: return validate_hostport;
    }
    return NULL;
}

int ps_config_reloadable(const ps_config_option *o)
{
    return o->apply != NULL;
}

int ps_config_set(ps_config *c, const char *key, const char *value, char *err, size_t errlen)
{
    char text[PS_CONFIG_PATH_MAX + 64];

    if (!key) {
        ps_errf(err, errlen, "missing key");
        return PS_EINVAL;
    }
    const ps_config_option *o = ps_config_find(key);
    if (!o) {
        unknown_key(key, err, errlen);
        return PS_EINVAL;
    }
    if (!value)
        value = "";

    /* Trim blanks at both ends. */
    while (isspace((unsigned char)*value))
        value++;
    size_t n = strlen(value);
    while (n > 0 && isspace((unsigned char)value[n - 1]))
        n--;
    if (n >= sizeof text) {
        ps_errf(err, errlen, "%s: value is %zu bytes long, the limit is %zu", o->name, n,
                sizeof text - 1);
        return PS_EINVAL;
    }
    memcpy(text, value, n);
    text[n] = '\0';
    ps_config_validate_fn validate = ps_config_validator(o);
    if (!validate) {
        ps_errf(err, errlen, "%s: option of unknown type", o->name);
        return PS_EINVAL;
    }
    return validate(o, text, (char *)c + o->offset, err, errlen);
}

void ps_config_defaults(ps_config *c)
{
    size_t n_opt;
    const ps_config_option *options = ps_config_options(&n_opt);
    char err[256];

    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < n_opt; i++) {
        if (ps_config_set(c, options[i].name, options[i].def, err, sizeof err) != 0) {
            /* A default that does not parse is a bug in the table. */
            fprintf(stderr, "config: bad default for %s: %s\n", options[i].name, err);
            abort();
        }
    }
}

/* ---- loading a file ---- */

struct load_ctx {
    FILE *f;
    const char *path;
    ps_config cfg;         /* the copy the file is applied to */
    int lineno;            /* line last handed to inih */
    int max_line;          /* inih's buffer size, for the message */
    bool too_long;         /* a line did not fit inih's buffer */
    int err_line;          /* first line a value was rejected on, 0 = none */
    char err[512];         /* its message */
};

/* inih's line reader (fgets-like). Counts lines so the handler knows where
 * it is, drops leading blanks (so an indented line is an ordinary one, not
 * inih's continuation of the previous value), and stops at a line longer
 * than inih's buffer instead of letting inih read it as two lines. */
static char *load_read_line(char *str, int num, void *stream)
{
    struct load_ctx *lc = stream;

    if (lc->too_long || !fgets(str, num, lc->f))
        return NULL;
    lc->lineno++;
    lc->max_line = num;
    size_t n = strlen(str);
    if (n == 0 || str[n - 1] != '\n') {
        int ch = getc(lc->f);
        if (ch == '\r')
            ch = getc(lc->f);
        if (ch != EOF && ch != '\n') {
            lc->too_long = true;
            return NULL;
        }
    }
    size_t skip = strspn(str, " \t");
    if (skip)
        memmove(str, str + skip, n - skip + 1);
    return str;
}

static int load_handler(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *lc = user;
    char msg[sizeof lc->err];

    if (lc->err_line)
        return 0; /* report the first error only */
    if (section[0] && strcasecmp(section, "psd") != 0) {
        snprintf(lc->err, sizeof lc->err,
                 "unknown section [%.64s]; options go at the top of the file or under [psd]",
                 section);
        lc->err_line = lc->lineno;
        return 0;
    }
    if (ps_config_set(&lc->cfg, name, value, msg, sizeof msg) != 0) {
        snprintf(lc->err, sizeof lc->err, "%s", msg);
        lc->err_line = lc->lineno;
        return 0;
    }
    return 1;
}

int ps_config_load(ps_config *c, const char *path, char *err, size_t errlen)
{
    struct load_ctx *lc;
    int rc = 0;

    lc = calloc(1, sizeof *lc);
    if (!lc) {
        ps_errf(err, errlen, "%s: out of memory", path);
        return PS_ENOMEM;
    }
    lc->path = path;
    lc->cfg = *c;
    lc->f = fopen(path, "r");
    if (!lc->f) {
        ps_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        rc = PS_EIO;
        goto out;
    }

    int syntax_line = ini_parse_stream(load_read_line, lc, load_handler, lc);
    if (ferror(lc->f)) {
        ps_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        rc = PS_EIO;
        goto out;
    }
    if (syntax_line < 0) {
        ps_errf(err, errlen, "%s: cannot parse (inih error %d)", path, syntax_line);
        rc = PS_EIO;
        goto out;
    }
    if (syntax_line > 0 && (lc->err_line == 0 || syntax_line < lc->err_line)) {
        ps_errf(err, errlen,
                "%s:%d: syntax error: expected 'key = value', '[section]' or a comment", path,
                syntax_line);
        rc = PS_EINVAL;
        goto out;
    }
    if (lc->err_line) {
        ps_errf(err, errlen, "%s:%d: %s", path, lc->err_line, lc->err);
        rc = PS_EINVAL;
        goto out;
    }
    if (lc->too_long) {
        ps_errf(err, errlen, "%s:%d: line too long (at most %d characters)", path,
                lc->lineno, lc->max_line - 2);
        rc = PS_EINVAL;
        goto out;
    }
    *c = lc->cfg;

out:
    if (lc->f)
        fclose(lc->f);
    free(lc);
    return rc;
}
