/* safetensors.c - the safetensors writer and the format's shared names
 * (safetensors.h). Owns nothing but its arguments. */
#include "common/safetensors.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "proto/errors.h"

int ps_st_table_tensor(const char *name, const char *table)
{
    size_t p = strlen(PS_ST_TABLE_PREFIX), n = strlen(table);
    if (strncmp(name, PS_ST_TABLE_PREFIX, p) != 0 || strncmp(name + p, table, n) != 0 || name[p + n] != '/')
        return PS_ST_NOT_TABLE;
    const char *what = name + p + n + 1;
    return strcmp(what, "rows") == 0 ? PS_ST_ROWS : strcmp(what, "keys") == 0 ? PS_ST_KEYS : PS_ST_NOT_TABLE;
}

size_t ps_st_value_size(const ps_tensor_desc *t)
{
    return t->save_dt == PS_SAVE_F64 || t->save_dt == PS_SAVE_I64 ? 8 : 4;
}

int ps_st_write_values(FILE *f, const ps_layout *l, uint64_t pos, const float *v, uint64_t n)
{
    uint32_t i = 0;
    while (i < l->ntensors && l->t[i].offset + l->t[i].count <= pos)
        i++;
    for (uint64_t done = 0; done < n && i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        uint64_t end = t->offset + t->count < pos + n ? t->offset + t->count : pos + n;
        uint64_t len = end - (pos + done);
        const float *x = v + done;
        if (t->save_dt == PS_SAVE_F32) {
            if (fwrite(x, sizeof(float), len, f) != len)
                return -1;
        } else {
            for (uint64_t k = 0; k < len; k++) {
                unsigned char b[8];
                if (t->save_dt == PS_SAVE_F64) {
                    double d = x[k];
                    memcpy(b, &d, 8);
                } else if (t->save_dt == PS_SAVE_I64) {
                    int64_t q = (int64_t)llrintf(x[k]);
                    memcpy(b, &q, 8);
                } else {
                    int32_t q = (int32_t)lrintf(x[k]);
                    memcpy(b, &q, 4);
                }
                if (fwrite(b, ps_st_value_size(t), 1, f) != 1)
                    return -1;
            }
        }
        done += len;
    }
    return 0;
}

static int jstr(ps_buf *b, const char *s)
{
    return ps_json_str(b, s, strlen(s), PS_JSON_UTF8);
}

/* The tables' declarations as one JSON array, NUL-terminated in a. */
static int tables_decl(const ps_st_table *tabs, uint32_t ntabs, ps_buf *a)
{
    int rc = ps_json_raw(a, "[");
    for (uint32_t i = 0; i < ntabs && rc == 0; i++) {
        rc |= ps_json_raw(a, i ? "," : "");
        rc |= ps_buf_reserve(a, tabs[i].decl.len + 1) != 0;
        if (rc == 0) {
            memcpy(a->p + a->len, tabs[i].decl.p, tabs[i].decl.len);
            a->len += tabs[i].decl.len;
        }
    }
    rc |= ps_json_raw(a, "]");
    rc |= ps_buf_reserve(a, 1) != 0;
    if (rc == 0)
        a->p[a->len] = 0;
    return rc;
}

int ps_st_header(const ps_layout *l, const ps_st_meta *meta, const ps_st_table *tabs, uint32_t ntabs,
                 ps_buf *out)
{
    ps_buf j = {0};
    int rc = 0;
    rc |= ps_buf_printf(&j, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"psd\",\"model_version\":\"%" PRIu64
                            "\",\"mode\":",
                        meta->version);
    rc |= jstr(&j, meta->mode);
    rc |= ps_buf_printf(&j, ",\"layout_fingerprint\":\"0x%016" PRIx64 "\",\"server\":", meta->fp);
    rc |= jstr(&j, meta->server);
    if (meta->part_versions) {
        /* a split model: each psd's pinned version, in part order */
        rc |= ps_json_raw(&j, ",\"part_versions\":");
        rc |= jstr(&j, meta->part_versions);
    }
    if (ntabs) {
        /* the tables' declarations, a JSON array as one string (metadata
         * values are strings), for psd's init_from */
        ps_buf a = {0};
        rc |= tables_decl(tabs, ntabs, &a);
        if (rc == 0) {
            rc |= ps_json_raw(&j, ",\"" PS_ST_META_TABLES "\":");
            rc |= jstr(&j, (const char *)a.p);
        }
        ps_buf_free(&a);
    }
    /* the buffers' rules, so that psd --init-from holds them as buffers */
    for (uint32_t i = 0; i < l->ntensors; i++) {
        char key[PS_NAME_MAX + 16];
        if (!l->t[i].buf)
            continue;
        snprintf(key, sizeof key, PS_ST_META_BUFFER "%s", l->t[i].name);
        rc |= ps_json_raw(&j, ",");
        rc |= jstr(&j, key);
        rc |= ps_json_raw(&j, ":");
        rc |= jstr(&j, ps_buf_name(l->t[i].buf));
    }
    rc |= ps_json_raw(&j, "}");
    uint64_t at = 0; /* bytes: a buffer may be 8 a value */
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        rc |= ps_json_raw(&j, ",");
        rc |= jstr(&j, t->name);
        rc |= ps_buf_printf(&j, ":{\"dtype\":\"%s\",\"shape\":[", ps_save_dt_name(t->save_dt));
        for (uint32_t d = 0; d < t->ndim; d++)
            rc |= ps_buf_printf(&j, "%s%" PRIu32, d ? "," : "", t->dims[d]);
        rc |= ps_buf_printf(&j, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at,
                            at + t->count * ps_st_value_size(t));
        at += t->count * ps_st_value_size(t);
    }
    for (uint32_t i = 0; i < ntabs; i++) {
        const ps_st_table *t = &tabs[i];
        char name[PS_NAME_MAX + 32];
        uint64_t rb = t->rows * t->dim * 4;
        snprintf(name, sizeof name, PS_ST_TABLE_PREFIX "%s/rows", t->name);
        rc |= ps_json_raw(&j, ",");
        rc |= jstr(&j, name);
        rc |= ps_buf_printf(&j, ":{\"dtype\":\"F32\",\"shape\":[%" PRIu64 ",%" PRIu32 "],\"data_offsets\":[%" PRIu64
                                ",%" PRIu64 "]}", t->rows, t->dim, at, at + rb);
        at += rb;
        snprintf(name, sizeof name, PS_ST_TABLE_PREFIX "%s/keys", t->name);
        rc |= ps_json_raw(&j, ",");
        rc |= jstr(&j, name);
        rc |= ps_buf_printf(&j, ":{\"dtype\":\"I64\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64
                                "]}", t->rows, at, at + t->rows * 8);
        at += t->rows * 8;
    }
    rc |= ps_json_raw(&j, "}");
    while (rc == 0 && (8 + j.len) % 8 != 0)
        rc |= ps_json_raw(&j, " ");
    if (rc != 0 || ps_buf_reserve(out, 8 + j.len) != 0) {
        ps_buf_free(&j);
        return PS_ENOMEM;
    }
    uint64_t n = j.len;
    for (int i = 0; i < 8; i++)
        out->p[i] = (uint8_t)(n >> (8 * i));
    memcpy(out->p + 8, j.p, j.len);
    out->len = 8 + j.len;
    ps_buf_free(&j);
    return 0;
}

int ps_st_names_ok(const ps_layout *l, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < l->ntensors; i++)
        for (uint32_t k = 0; k < i; k++)
            if (strcmp(l->t[i].name, l->t[k].name) == 0) {
                ps_errf(err, errlen, "the model has two tensors named '%s'; a safetensors file cannot hold that",
                        l->t[i].name);
                return -1;
            }
    return 0;
}
