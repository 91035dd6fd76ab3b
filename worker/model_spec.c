/* model_spec.c - parsing a model spec: the kind, an MLP's hidden sizes and
 * the options after a colon (dropout, init), each mistake told in one line. */
#include "model_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"

/* Parses the hidden sizes "H1,H2,..." (list, NUL-terminated) into s. */
static int parse_hidden(const char *spec, const char *list, model_spec *s, char *err, size_t errlen)
{
    const char *p = list;
    s->nhidden = 0;
    if (*p == '\0') {
        ps_errf(err, errlen, "bad model '%s': expected mlp:H1,H2,... with at least one hidden size", spec);
        return PS_EINVAL;
    }
    for (;;) {
        const char *start = p;
        long v = 0;
        while (*p >= '0' && *p <= '9') {
            if (v <= PS_MODEL_MAX_WIDTH)
                v = v * 10 + (*p - '0');
            p++;
        }
        if (p == start || (*p != ',' && *p != '\0') || v < 1 || v > PS_MODEL_MAX_WIDTH) {
            const char *end = start;
            while (*end && *end != ',')
                end++;
            ps_errf(err, errlen, "bad hidden size '%.*s' in model '%s': expected a whole number from 1 to %d",
                   (int)(end - start), start, spec, PS_MODEL_MAX_WIDTH);
            return PS_EINVAL;
        }
        if (s->nhidden == PS_MODEL_MAX_HIDDEN) {
            ps_errf(err, errlen, "bad model '%s': more than %d hidden layers", spec, PS_MODEL_MAX_HIDDEN);
            return PS_EINVAL;
        }
        s->hidden[s->nhidden++] = (int)v;
        if (*p == '\0')
            return PS_OK;
        p++; /* past ',' */
    }
}

/* Parses a probability 0 <= p < 1 written as a plain decimal ("0.5", ".25",
 * "0"); returns 0 or -1. */
static int parse_prob(const char *v, float *out)
{
    if (!((*v >= '0' && *v <= '9') || *v == '.'))
        return -1; /* no sign, space, "nan", "inf" */
    for (const char *c = v; *c; c++)
        if (!((*c >= '0' && *c <= '9') || *c == '.'))
            return -1; /* no exponent or hex either: keep specs plain */
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end != '\0' || !(d >= 0.0 && d < 1.0))
        return -1;
    *out = (float)d;
    if (*out >= 1.0f) /* 0.99999999 rounds to 1 in float */
        return -1;
    return 0;
}

/* Parses the options "name=value,..." (opts, NUL-terminated, may be written
 * to) for a model of kind s->kind. */
static int parse_options(const char *spec, char *opts, model_spec *s, char *err, size_t errlen)
{
    int seen_dropout = 0, seen_init = 0;
    if (*opts == '\0') {
        ps_errf(err, errlen, "bad model '%s': empty options after ':' (expected e.g. init=torch)", spec);
        return PS_EINVAL;
    }
    for (char *item = opts; item != NULL;) {
        char *next = strchr(item, ',');
        if (next != NULL)
            *next++ = '\0';
        char *eq = strchr(item, '=');
        if (eq == NULL || eq == item) {
            ps_errf(err, errlen, "bad option '%s' in model '%s': expected name=value, e.g. init=torch", item, spec);
            return PS_EINVAL;
        }
        *eq = '\0';
        const char *name = item, *value = eq + 1;
        if (strcmp(name, "dropout") == 0) {
            if (s->kind != KIND_MLP && s->kind != KIND_CNN) {
                ps_errf(err, errlen, "bad model '%s': dropout applies to mlp and cnn models only", spec);
                return PS_EINVAL;
            }
            if (seen_dropout++) {
                ps_errf(err, errlen, "bad model '%s': dropout given twice", spec);
                return PS_EINVAL;
            }
            if (parse_prob(value, &s->dropout) != 0) {
                ps_errf(err, errlen, "bad dropout '%s' in model '%s': expected a probability from 0 to below 1, e.g. 0.5",
                       value, spec);
                return PS_EINVAL;
            }
        } else if (strcmp(name, "init") == 0) {
            if (seen_init++) {
                ps_errf(err, errlen, "bad model '%s': init given twice", spec);
                return PS_EINVAL;
            }
            if (strcmp(value, "he") == 0) {
                s->init = PS_INIT_HE;
            } else if (strcmp(value, "torch") == 0) {
                s->init = PS_INIT_TORCH;
            } else {
                ps_errf(err, errlen, "bad init '%s' in model '%s': expected he or torch", value, spec);
                return PS_EINVAL;
            }
        } else {
            ps_errf(err, errlen, "unknown option '%s' in model '%s': expected dropout=P or init=he|torch", name, spec);
            return PS_EINVAL;
        }
        item = next;
    }
    return PS_OK;
}

int ps_model_spec_parse(const char *spec, model_spec *s, char *err, size_t errlen)
{
    static const char expected[] = "expected softmax, linear, mlp:H1,H2,... or cnn";
    char buf[PS_MODEL_SPEC_MAX + 1];
    memset(s, 0, sizeof(*s));
    if (spec == NULL) {
        ps_errf(err, errlen, "no model given: %s", expected);
        return PS_EINVAL;
    }
    size_t n = strlen(spec);
    if (n > PS_MODEL_SPEC_MAX) {
        ps_errf(err, errlen, "model spec too long: %zu characters, at most %d", n, PS_MODEL_SPEC_MAX);
        return PS_EINVAL;
    }
    memcpy(buf, spec, n + 1);

    /* Up to three ':'-separated sections: kind, then sizes and/or options. */
    char *sect[3] = {buf, NULL, NULL};
    int nsect = 1;
    for (char *c = buf; *c; c++) {
        if (*c != ':')
            continue;
        if (nsect == 3) {
            ps_errf(err, errlen, "bad model '%s': too many ':' sections (expected kind[:sizes][:options])", spec);
            return PS_EINVAL;
        }
        *c = '\0';
        sect[nsect++] = c + 1;
    }
    const char *kind = sect[0];
    if (strcmp(kind, "softmax") == 0) {
        s->kind = KIND_SOFTMAX;
    } else if (strcmp(kind, "linear") == 0) {
        s->kind = KIND_LINEAR;
    } else if (strcmp(kind, "mlp") == 0) {
        s->kind = KIND_MLP;
    } else if (strcmp(kind, "cnn") == 0) {
        s->kind = KIND_CNN;
    } else {
        ps_errf(err, errlen, "unknown model '%s': %s", spec, expected);
        return PS_EINVAL;
    }

    int next = 1;
    if (s->kind == KIND_MLP) {
        if (nsect < 2) {
            ps_errf(err, errlen, "bad model '%s': expected mlp:H1,H2,... with at least one hidden size", spec);
            return PS_EINVAL;
        }
        int rc = parse_hidden(spec, sect[1], s, err, errlen);
        if (rc != PS_OK)
            return rc;
        next = 2;
    }
    if (nsect > next + 1) {
        ps_errf(err, errlen, "bad model '%s': too many ':' sections (expected %s)", spec,
               s->kind == KIND_MLP ? "mlp:H1,H2,...[:options]" : "kind[:options]");
        return PS_EINVAL;
    }
    /* The PyTorch example's network starts as PyTorch would start it. */
    s->init = s->kind == KIND_CNN ? PS_INIT_TORCH : PS_INIT_HE;
    if (nsect == next + 1)
        return parse_options(spec, sect[next], s, err, errlen);
    return PS_OK;
}
