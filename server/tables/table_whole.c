/* table_whole.c - a table read or loaded whole, and its counters: rows
 * loaded from a checkpoint or a safetensors file, read for a checkpoint or
 * a pull by range, every row visited, the rates and counts status shows. */
#include "server/tables/table_rows.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void srv_tables_set_clock(srv_tables *ts, uint32_t i, uint64_t clock)
{
    ts->t[i]->clock = clock;
}

int srv_tables_load(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *rows, const uint8_t *stamps,
                    uint64_t n, char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    if (n > SRV_TABLE_ROWS_MAX - t->rows)
        return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': %llu rows, more than a table holds (%llu)",
                    t->def.name, (unsigned long long)n, (unsigned long long)SRV_TABLE_ROWS_MAX);
    /* the checkpoint's clocks kept while a bound reads them */
    if (stamps && need_stamps(&ts->bounds) && !t->stamps && tbl_stamps_alloc(ts, t) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for its rows' clocks", t->def.name);
    if (n && tbl_reserve(ts, t, t->rows + n) != 0)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu rows", t->def.name,
                    (unsigned long long)n);
    size_t rb = (size_t)t->row_floats * sizeof(float);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, (size_t)k);
        if (lookup(t, key))
            return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': key %llu appears twice", t->def.name,
                        (unsigned long long)key);
        uint64_t stamp = stamps ? ps_key_at(stamps, (size_t)k) : 0; /* 0: before any push since */
        if (stamp > t->clock)
            return ps_fail(err, errlen, PS_EMALFORMED, "table '%s': key %llu last pushed at clock %llu, past the "
                           "table's clock %llu", t->def.name, (unsigned long long)key, (unsigned long long)stamp,
                           (unsigned long long)t->clock);
        append(t, key, stamp, rows + (size_t)k * rb);
    }
    return 0;
}

void srv_tables_rows_at(const srv_tables *ts, uint32_t i, uint64_t off, uint32_t len, uint8_t *keys, float *w)
{
    const srv_table *t = ts->t[i];
    for (uint32_t k = 0; k < len; k++) {
        const float *p = row_at(t, off + k);
        memcpy(keys + 8 * (size_t)k, p, 8); /* stored little-endian, as the host */
        memcpy(w + (size_t)k * t->def.dim, p + HEAD, t->def.dim * sizeof(float));
    }
}

int srv_tables_load_weights(srv_tables *ts, uint32_t i, const uint8_t *keys, const uint8_t *w, uint64_t n,
                            char *err, size_t errlen)
{
    srv_table *t = ts->t[i];
    const ps_table_def *d = &t->def;
    const uint32_t dim = d->dim, rf = t->row_floats;
    float *rows = malloc((size_t)(n ? n : 1) * rf * sizeof(float));
    if (!rows)
        return ps_fail(err, errlen, PS_ENOMEM, "table '%s': out of memory for %llu rows", d->name, (unsigned long long)n);
    for (uint64_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, (size_t)k);
        float *row = rows + (size_t)k * rf;
        srv_sparse_row_new(d, key, row);
        memcpy(row, w + (size_t)k * dim * sizeof(float), dim * sizeof(float));
        for (uint32_t j = 0; j < dim; j++) {
            if (!isfinite(row[j])) {
                free(rows);
                return ps_fail(err, errlen, PS_ENONFINITE, "table '%s': the row of key %llu holds NaN or infinity",
                            d->name, (unsigned long long)key);
            }
            if (d->opt == PS_TOPT_FTRL && row[j] != 0.0f) {
                /* with n = 0 the weight is -(z - sign(z) l1) / (beta / alpha + l2) */
                double s = d->hp[PS_HP_BETA] / d->hp[PS_HP_LR] + d->hp[PS_HP_L2];
                row[dim + j] = (float)(-(double)row[j] * s - copysign(d->hp[PS_HP_L1], row[j]));
            }
        }
    }
    int rc = srv_tables_load(ts, i, keys, (const uint8_t *)rows, NULL, n, err, errlen);
    free(rows);
    return rc;
}

void srv_tables_rates(srv_tables *ts)
{
    for (uint32_t i = 0; i < ts->n; i++) {
        srv_table *t = ts->t[i];
        t->pull_rate = (double)(t->pulled - t->last_pulled);
        t->push_rate = (double)(t->pushed - t->last_pushed);
        t->last_pulled = t->pulled;
        t->last_pushed = t->pushed;
    }
}

void srv_tables_stats(const srv_tables *ts, uint32_t i, srv_table_stats *st)
{
    const srv_table *t = ts->t[i];
    st->pull_rate = t->pull_rate;
    st->push_rate = t->push_rate;
    st->rows = t->rows;
    st->bytes = t->bytes;
    st->rows_pulled = t->pulled;
    st->rows_pushed = t->pushed;
    st->admitted = t->admitted;
    st->filtered = t->filtered;
    st->expired = t->expired;
    st->evicted = t->evicted;
    st->clock = t->clock;
}

const float *srv_tables_row(const srv_tables *ts, uint32_t i, uint64_t key)
{
    uint64_t r = lookup(ts->t[i], key);
    return r ? row_at(ts->t[i], r - 1) + HEAD : NULL;
}

void srv_tables_each(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t key, const float *row, void *arg),
                     void *arg)
{
    const srv_table *t = ts->t[i];
    for (uint64_t r = 0; r < t->rows; r++) {
        const float *p = row_at(t, r);
        fn(row_key(p), p + HEAD, arg);
    }
}

void srv_tables_each_stamp(const srv_tables *ts, uint32_t i, void (*fn)(uint64_t stamp, void *arg), void *arg)
{
    const srv_table *t = ts->t[i];
    for (uint64_t r = 0; r < t->rows; r++)
        fn(t->stamps ? *stamp_at(t, r) : t->clock, arg);
}
