/* bsp_tround.c - a BSP round's table pushes, summed in shard order (see
 * bsp_tround.h). */
#include "server/policy/bsp_tround.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"

struct srv_tround_push {
    uint32_t shard, table, n, dim;
    uint8_t *keys;  /* n little-endian uint64 */
    float *g;       /* n x dim */
};

static uint64_t tag_of(uint32_t ti, uint32_t shard)
{
    return ((uint64_t)ti << 32 | shard) + 1;
}

/* The set's slot for (key, tag): where it is, or the empty slot it goes in. */
static size_t set_find(const srv_tround *r, uint64_t key, uint64_t tag)
{
    size_t s = (size_t)(ps_mix64(key ^ ps_mix64(tag)) & (r->set_cap - 1));
    while (r->set[2 * s + 1] != 0 && (r->set[2 * s] != key || r->set[2 * s + 1] != tag))
        s = (s + 1) & (r->set_cap - 1);
    return s;
}

/* Room for `more` entries in the set at most half full; 0 or PS_ENOMEM. */
static int set_room(srv_tround *r, size_t more)
{
    if (2 * (r->set_n + more) <= r->set_cap)
        return 0;
    size_t cap = r->set_cap ? r->set_cap : 1024;
    while (2 * (r->set_n + more) > cap)
        cap *= 2;
    uint64_t *old = r->set;
    size_t ocap = r->set_cap;
    uint64_t *set = calloc(2 * cap, sizeof *set);
    if (!set)
        return PS_ENOMEM;
    r->set = set;
    r->set_cap = cap;
    for (size_t i = 0; i < ocap; i++)
        if (old[2 * i + 1]) {
            size_t s = set_find(r, old[2 * i], old[2 * i + 1]);
            r->set[2 * s] = old[2 * i];
            r->set[2 * s + 1] = old[2 * i + 1];
        }
    free(old);
    return 0;
}

int srv_tround_keep(srv_tround *r, uint32_t shard, uint32_t ti, const uint8_t *keys, uint32_t n, const float *g,
                    uint32_t dim, uint64_t *dup_key)
{
    uint64_t tag = tag_of(ti, shard);
    if (set_room(r, n) != 0)
        return PS_ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, k);
        if (r->set[2 * set_find(r, key, tag) + 1]) {
            *dup_key = key;
            return PS_EDUPLICATE;
        }
    }
    if (r->np == r->pcap) {
        size_t cap = r->pcap ? 2 * r->pcap : 16;
        srv_tround_push *p = realloc(r->p, cap * sizeof *p);
        if (!p)
            return PS_ENOMEM;
        r->p = p;
        r->pcap = cap;
    }
    srv_tround_push *p = &r->p[r->np];
    p->keys = malloc((size_t)n * 8);
    p->g = malloc((size_t)n * dim * sizeof(float));
    if (!p->keys || !p->g) {
        free(p->keys);
        free(p->g);
        return PS_ENOMEM;
    }
    memcpy(p->keys, keys, (size_t)n * 8);
    memcpy(p->g, g, (size_t)n * dim * sizeof(float));
    p->shard = shard;
    p->table = ti;
    p->n = n;
    p->dim = dim;
    r->np++;
    r->bytes += (uint64_t)n * (8 + dim * sizeof(float));
    for (uint32_t k = 0; k < n; k++) {
        uint64_t key = ps_key_at(keys, k);
        size_t s = set_find(r, key, tag);
        r->set[2 * s] = key;
        r->set[2 * s + 1] = tag;
        r->set_n++;
    }
    return 0;
}

static void push_free(srv_tround_push *p)
{
    free(p->keys);
    free(p->g);
}

void srv_tround_drop(srv_tround *r, uint32_t shard)
{
    size_t kept = 0;
    for (size_t i = 0; i < r->np; i++) {
        if (r->p[i].shard == shard) {
            r->bytes -= (uint64_t)r->p[i].n * (8 + r->p[i].dim * sizeof(float));
            push_free(&r->p[i]);
        } else {
            r->p[kept++] = r->p[i];
        }
    }
    if (kept == r->np)
        return;
    r->np = kept;
    /* the set anew, from what stays */
    if (r->set)
        memset(r->set, 0, 2 * r->set_cap * sizeof *r->set);
    r->set_n = 0;
    for (size_t i = 0; i < r->np; i++)
        for (uint32_t k = 0; k < r->p[i].n; k++) {
            uint64_t key = ps_key_at(r->p[i].keys, k), tag = tag_of(r->p[i].table, r->p[i].shard);
            size_t s = set_find(r, key, tag);
            r->set[2 * s] = key;
            r->set[2 * s + 1] = tag;
            r->set_n++;
        }
}

void srv_tround_clear(srv_tround *r)
{
    for (size_t i = 0; i < r->np; i++)
        push_free(&r->p[i]);
    r->np = 0;
    r->bytes = 0;
    if (r->set)
        memset(r->set, 0, 2 * r->set_cap * sizeof *r->set);
    r->set_n = 0;
}

void srv_tround_free(srv_tround *r)
{
    srv_tround_clear(r);
    free(r->p);
    free(r->set);
    memset(r, 0, sizeof *r);
}

/* One table's sums: keys in first-seen order (shard order, then arrival
 * order), each with its row of sums. */
typedef struct sums {
    uint64_t *mkey;   /* map slots: key */
    uint32_t *midx;   /* map slots: index + 1 (0: empty) */
    size_t mcap;
    uint8_t *keys;    /* the keys, as a "keys" bin */
    float *rows;      /* their sums, n x dim */
    uint32_t n;
} sums;

static void sums_free(sums *u)
{
    free(u->mkey);
    free(u->midx);
    free(u->keys);
    free(u->rows);
}

/* Sums for table ti over the shards given: 0 or PS_ENOMEM. With wide 0,
 * float32 sums; else each sum is made in double and its row holds it times
 * wide, rounded to float32 once (for sums past float32's range whose
 * mean is not). */
static int sums_make(const srv_tround *r, uint32_t ti, uint32_t dim, const uint32_t *shards, uint32_t nshards,
                     double wide, sums *u)
{
    double *acc = NULL; /* the double sums (wide), n x dim */
    memset(u, 0, sizeof *u);
    uint64_t total = 0;
    for (size_t i = 0; i < r->np; i++)
        if (r->p[i].table == ti)
            total += r->p[i].n;
    if (total == 0)
        return 0;
    u->mcap = 16;
    while (u->mcap < 2 * total)
        u->mcap *= 2;
    u->mkey = malloc(u->mcap * sizeof *u->mkey);
    u->midx = calloc(u->mcap, sizeof *u->midx);
    u->keys = malloc((size_t)total * 8);
    u->rows = malloc((size_t)total * dim * sizeof(float));
    if (wide != 0)
        acc = malloc((size_t)total * dim * sizeof *acc);
    if (!u->mkey || !u->midx || !u->keys || !u->rows || (wide != 0 && !acc)) {
        sums_free(u);
        free(acc);
        return PS_ENOMEM;
    }
    for (uint32_t si = 0; si < nshards; si++)
        for (size_t i = 0; i < r->np; i++) {
            const srv_tround_push *p = &r->p[i];
            if (p->table != ti || p->shard != shards[si])
                continue;
            for (uint32_t k = 0; k < p->n; k++) {
                uint64_t key = ps_key_at(p->keys, k);
                size_t s = (size_t)(ps_mix64(key) & (u->mcap - 1));
                while (u->midx[s] && u->mkey[s] != key)
                    s = (s + 1) & (u->mcap - 1);
                int fresh = !u->midx[s];
                if (fresh) {
                    u->mkey[s] = key;
                    u->midx[s] = ++u->n;
                    memcpy(u->keys + 8 * (size_t)(u->n - 1), p->keys + 8 * (size_t)k, 8);
                }
                size_t at = (size_t)(u->midx[s] - 1) * dim;
                const float *g = p->g + (size_t)k * dim;
                if (acc) {
                    double *row = acc + at;
                    if (fresh)
                        memset(row, 0, dim * sizeof *row);
                    for (uint32_t j = 0; j < dim; j++)
                        row[j] += g[j];
                } else {
                    float *row = u->rows + at;
                    if (fresh)
                        memset(row, 0, dim * sizeof *row);
                    for (uint32_t j = 0; j < dim; j++)
                        row[j] += g[j];
                }
            }
        }
    if (acc) {
        for (size_t i = 0; i < (size_t)u->n * dim; i++)
            u->rows[i] = (float)(acc[i] * wide);
        free(acc);
    }
    return 0;
}

/* 1 when every value of u's sums is finite. */
static int sums_finite(const sums *u, uint32_t dim)
{
    for (size_t i = 0; i < (size_t)u->n * dim; i++)
        if (!isfinite(u->rows[i]))
            return 0;
    return 1;
}

int srv_tround_apply(srv_tround *r, srv_tables *ts, const uint32_t *shards, uint32_t nshards, double scale,
                     uint32_t *failed, char *err, size_t errlen)
{
    *failed = 0;
    if (r->np == 0)
        return 0;
    sums u[PS_TABLES_MAX];
    double tscale[PS_TABLES_MAX]; /* the scale each table's sums take */
    uint32_t made = 0;
    for (; made < ts->n; made++) {
        uint32_t dim = srv_tables_def(ts, made)->dim;
        tscale[made] = scale;
        int rc = sums_make(r, made, dim, shards, nshards, 0, &u[made]);
        if (rc == 0 && !sums_finite(&u[made], dim)) {
            /* a float32 sum overflowed (the pushes are finite): the sums
             * again in double, each times scale before it is rounded, so
             * a finite mean is not lost */
            sums_free(&u[made]);
            tscale[made] = 1.0;
            rc = sums_make(r, made, dim, shards, nshards, scale, &u[made]);
        }
        if (rc != 0) {
            for (uint32_t i = 0; i < made; i++)
                sums_free(&u[i]);
            snprintf(err, errlen, "out of memory summing the round's table pushes");
            return PS_ENOMEM;
        }
    }
    for (uint32_t ti = 0; ti < ts->n; ti++) {
        if (u[ti].n) {
            char e[600];
            if (srv_tables_push(ts, ti, u[ti].keys, u[ti].n, u[ti].rows, tscale[ti], e, sizeof e) != 0) {
                if (!*failed)
                    snprintf(err, errlen, "%s", e);
                (*failed)++;
            }
        }
        sums_free(&u[ti]);
    }
    srv_tround_clear(r);
    return 0;
}
