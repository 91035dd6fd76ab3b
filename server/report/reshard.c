/* reshard.c - a job's state for a new number of psd parts, offline
 * (psd --reshard-from): from the newest checkpoints of the old parts' state
 * dirs, the state of new part i of n, which psd's caller then writes as the
 * first checkpoint of its own state dir. The dense model is joined from the
 * old parts (ps_layout_join) and cut again (ps_layout_part), values and
 * optimizer state alike; each table row, with its optimizer state, goes to
 * part jump_hash(mix(key), n) (PROTOCOL.md 13.7). Owns the old parts while
 * it runs (all of them in memory at once) and nothing after. */
#include "server/report/reshard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/report/checkpoint.h"
#include "server/model/model.h"
#include "server/model/optim.h"
#include "server/store/plan.h"
#include "server/tables/sparse_optim.h"
#include "server/tables/table.h"

#define STATE_MAX 4 /* optimizer state buffers (as checkpoints allow) */

/* The rows of one new table, gathered from every old part. */
typedef struct gather {
    uint32_t part, nparts;
    uint32_t floats;   /* a row's floats: weights, state, step */
    uint8_t *keys;     /* n little-endian keys */
    float *rows;       /* n x floats */
    uint64_t n, cap;
    int nomem;
} gather;

static void gather_row(uint64_t key, const float *row, void *arg)
{
    gather *g = arg;
    if (g->nomem || ps_table_part(key, g->nparts) != g->part)
        return;
    if (g->n == g->cap) {
        uint64_t cap = g->cap ? 2 * g->cap : 1024;
        uint8_t *k = realloc(g->keys, cap * 8);
        if (k)
            g->keys = k;
        float *r = k ? realloc(g->rows, cap * g->floats * sizeof(float)) : NULL;
        if (!r) {
            g->nomem = 1;
            return;
        }
        g->rows = r;
        g->cap = cap;
    }
    for (int b = 0; b < 8; b++)
        g->keys[8 * g->n + b] = (uint8_t)(key >> (8 * b));
    memcpy(g->rows + g->n * g->floats, row, g->floats * sizeof(float));
    g->n++;
}

static void old_free(psd *o)
{
    if (!o)
        return;
    srv_model_free(&o->model);
    srv_tables_free(&o->tables);
    srv_plan_clear(&o->plan);
    free(o->restored_clocks);
    free(o);
}

/* Loads old part j of m from dir into a psd of its own (*out). 0, or a
 * code with err. */
static int old_load(const psd *s, const char *dir, uint32_t j, uint32_t m, psd **out, char *err, size_t errlen)
{
    psd *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    o->cfg = s->cfg;
    o->policy = s->policy;
    o->clock = s->clock;
    snprintf(o->cfg.state_dir, sizeof o->cfg.state_dir, "%s", dir);
    srv_tables_init(&o->tables, s->cfg.max_table_memory);
    int rc = srv_checkpoint_load(o);
    if (rc != 1) {
        snprintf(err, errlen, "old part %u of %u (%s): %s", j, m, dir,
                 rc == 0 ? "no checkpoint there (a psd writes one into its state dir at every checkpoint_interval "
                           "and when it stops)"
                         : "its state dir cannot be read (see the log above)");
        old_free(o);
        return rc == 0 ? PS_EINVAL : rc;
    }
    *out = o;
    return 0;
}

/* Copies n floats of the new part's parameters, from offset off of old
 * part o (a model of its own) to offset at of s's model. */
static int copy_dense(psd *s, uint64_t at, const psd *o, uint64_t off, uint64_t n)
{
    while (n > 0) {
        size_t got;
        const float *src = srv_model_at(&o->model, off, n, &got);
        srv_wseg seg;
        if (srv_model_write_begin(&s->model, at, got, &seg) != 0)
            return PS_ENOMEM;
        size_t k = seg.len < got ? seg.len : got;
        memcpy(seg.wo, src, k * sizeof(float));
        srv_model_write_end(&s->model, &seg);
        at += k;
        off += k;
        n -= k;
    }
    return 0;
}

/* The dense part: old layouts joined, new part cut, values and optimizer
 * state copied where the old parts overlap it. */
static int reshard_dense(psd *s, psd **old, uint32_t m, uint32_t part, uint32_t nparts, char *err, size_t errlen)
{
    /* a job grown online holds its dense model on its first parts only:
     * those a move added hold table rows (PROTOCOL.md 18) */
    uint32_t md = 0;
    while (md < m && old[md]->model.has_layout)
        md++;
    if (md == 0) {
        snprintf(err, errlen, "no old part holds a dense model (old part 0 holds table rows only): list the old "
                              "parts' state dirs in part order");
        return PS_EINVAL;
    }
    for (uint32_t j = md; j < m; j++)
        if (old[j]->model.has_layout) {
            snprintf(err, errlen, "old part %u holds a dense model, and old part %u none: the parts holding it come "
                                  "first (list the old parts' state dirs in part order)", j, md);
            return PS_EINVAL;
        }
    m = md;
    const ps_layout *ls[PS_PARTS_MAX];
    for (uint32_t j = 0; j < m; j++)
        ls[j] = &old[j]->model.layout;
    static ps_layout whole, mine; /* large: at start only, on the loop */
    char jerr[300];
    if (ps_layout_join(ls, m, &whole, jerr, sizeof jerr) != 0) {
        snprintf(err, errlen, "the old parts' models do not fit together: %s (list the old parts' state dirs in "
                              "part order, every one of them)",
                 jerr);
        return PS_EINVAL;
    }
    uint64_t P = whole.total, lo, hi;
    if (ps_layout_part(&whole, part, nparts, &mine, &lo, &hi) != 0) {
        snprintf(err, errlen, "a model of %llu values cannot be cut into %u parts (each needs %u values or more)",
                 (unsigned long long)P, nparts, PS_PART_ALIGN);
        return PS_EINVAL;
    }
    if (srv_model_set_layout(&s->model, &mine, &s->cfg) != 0) {
        snprintf(err, errlen, "out of memory for %llu parameters", (unsigned long long)(hi - lo));
        return PS_ENOMEM;
    }
    float *nb[STATE_MAX];
    const char *nn[STATE_MAX];
    size_t ns = srv_optim_state_buffers(&s->model.opt, nb, nn, STATE_MAX);
    uint64_t version = 0;
    for (uint32_t j = 0; j < m; j++) {
        uint64_t olo, ohi;
        if (ps_part_bounds(P, j, m, &olo, &ohi) != 0 || ohi - olo != old[j]->model.layout.total) {
            snprintf(err, errlen, "old part %u of %u holds %llu values, not part %u of %u of a %llu-value model", j,
                     m, (unsigned long long)old[j]->model.layout.total, j, m, (unsigned long long)P);
            return PS_EINVAL;
        }
        float *ob[STATE_MAX];
        const char *on[STATE_MAX];
        size_t os = srv_optim_state_buffers(&old[j]->model.opt, ob, on, STATE_MAX);
        if (os != ns) {
            snprintf(err, errlen, "old part %u has %zu optimizer state buffers, psd's optimizer %zu: run the "
                                  "reshard with the old psd's settings",
                     j, os, ns);
            return PS_EINVAL;
        }
        uint64_t a = olo > lo ? olo : lo, b = ohi < hi ? ohi : hi;
        if (a < b) {
            if (copy_dense(s, a - lo, old[j], a - olo, b - a) != 0) {
                snprintf(err, errlen, "out of memory copying parameters");
                return PS_ENOMEM;
            }
            for (size_t i = 0; i < ns; i++)
                memcpy(nb[i] + (a - lo), ob[i] + (a - olo), (b - a) * sizeof(float));
        }
        if (old[j]->model.version > version)
            version = old[j]->model.version;
    }
    srv_model_set_initialized(&s->model, version);
    srv_model_touched(&s->model); /* values copied in: bounds unknown */
    return 0;
}

/* 1 when a and b declare the same table, their parts aside. */
static int same_but_part(const ps_table_def *a, const ps_table_def *b)
{
    ps_table_def x = *a;
    x.part = b->part;
    x.nparts = b->nparts;
    return ps_table_def_same(&x, b);
}

/* The tables: every old part must hold the same tables, each its own part
 * of them; each row of the new part's keys comes over with its state. */
static int reshard_tables(psd *s, psd **old, const char *const *dirs, uint32_t m, uint32_t part, uint32_t nparts,
                          uint64_t *rows, char *err, size_t errlen)
{
    const srv_tables *t0 = &old[0]->tables;
    *rows = 0;
    for (uint32_t j = 0; j < m; j++) {
        const srv_tables *tj = &old[j]->tables;
        if (tj->n != t0->n) {
            snprintf(err, errlen, "old part %u (%s) holds %u tables, old part 0 (%s) %u: not parts of one job", j,
                     dirs[j], tj->n, dirs[0], t0->n);
            return PS_EINVAL;
        }
        for (uint32_t i = 0; i < tj->n; i++) {
            const ps_table_def *d = srv_tables_def(tj, i);
            int k = srv_tables_find(t0, d->name);
            if (k < 0 || !same_but_part(d, srv_tables_def(t0, (uint32_t)k))) {
                snprintf(err, errlen, "old part %u (%s) declares table '%s' otherwise than old part 0 (%s), or old "
                                      "part 0 lacks it: not parts of one job",
                         j, dirs[j], d->name, dirs[0]);
                return PS_EINVAL;
            }
            if (d->part != j || d->nparts != m) {
                snprintf(err, errlen, "%s, listed as old part %u of %u, holds part %u of %u of table '%s': list the "
                                      "old parts' state dirs in part order, all %u of them",
                         dirs[j], j, m, d->part, d->nparts, d->name, d->nparts);
                return PS_EINVAL;
            }
        }
    }
    int rc = 0;
    for (uint32_t i = 0; i < t0->n && rc == 0; i++) {
        ps_table_def d = *srv_tables_def(t0, i);
        d.part = nparts > 1 ? part : 0;
        d.nparts = nparts;
        gather g = {.part = part, .nparts = nparts, .floats = srv_sparse_row_floats(&d)};
        for (uint32_t j = 0; j < m; j++)
            srv_tables_each(&old[j]->tables, (uint32_t)srv_tables_find(&old[j]->tables, d.name), gather_row, &g);
        uint32_t ti;
        char terr[400];
        if (g.nomem) {
            snprintf(err, errlen, "out of memory gathering the rows of table '%s'", d.name);
            rc = PS_ENOMEM;
        } else if (srv_tables_declare(&s->tables, &d, &ti, terr, sizeof terr) != 0 ||
                   srv_tables_load(&s->tables, ti, g.keys, (const uint8_t *)g.rows, NULL, g.n, terr, sizeof terr) != 0) {
            snprintf(err, errlen, "table '%s': %s (a key in two old parts?)", d.name, terr);
            rc = PS_EINVAL;
        }
        *rows += g.n;
        free(g.keys);
        free(g.rows);
    }
    return rc;
}

int srv_reshard(psd *s, const char *from, uint32_t part, uint32_t nparts, char *err, size_t errlen)
{
    char list[PS_PARTS_MAX * 1100];
    const char *dirs[PS_PARTS_MAX];
    uint32_t m = 0;
    if (strlen(from) >= sizeof list) {
        snprintf(err, errlen, "--reshard-from: the list is too long");
        return PS_EINVAL;
    }
    snprintf(list, sizeof list, "%s", from);
    for (char *p = list, *e; p; p = e) {
        e = strchr(p, ',');
        if (e)
            *e++ = '\0';
        if (!*p) {
            snprintf(err, errlen, "--reshard-from: an empty entry in '%s' (DIR0,DIR1,...: the old parts' state "
                                  "dirs, in part order)",
                     from);
            return PS_EINVAL;
        }
        if (m == PS_PARTS_MAX) {
            snprintf(err, errlen, "--reshard-from: more than %u old parts", PS_PARTS_MAX);
            return PS_EINVAL;
        }
        if (strcmp(p, s->cfg.state_dir) == 0) {
            snprintf(err, errlen, "--reshard-from: %s is the new part's state dir too; write the new parts "
                                  "into dirs of their own",
                     p);
            return PS_EINVAL;
        }
        dirs[m++] = p;
    }
    if (nparts == 0 || nparts > PS_PARTS_MAX || part >= nparts) {
        snprintf(err, errlen, "--part %u/%u: I/N with 0 <= I < N <= %u", part, nparts, PS_PARTS_MAX);
        return PS_EINVAL;
    }
    psd *old[PS_PARTS_MAX] = {0};
    int rc = 0;
    srv_tables_free(&s->tables);
    srv_tables_init(&s->tables, s->cfg.max_table_memory);
    for (uint32_t j = 0; j < m && rc == 0; j++)
        rc = old_load(s, dirs[j], j, m, &old[j], err, errlen);
    uint64_t rows = 0;
    if (rc == 0)
        rc = reshard_dense(s, old, m, part, nparts, err, errlen);
    if (rc == 0)
        rc = reshard_tables(s, old, dirs, m, part, nparts, &rows, err, errlen);
    if (rc == 0 && old[0]->plan.set && srv_plan_restore(&s->plan, &old[0]->plan.p, NULL, 0) != 0) {
        snprintf(err, errlen, "out of memory for the plan");
        rc = PS_ENOMEM;
    }
    if (rc == 0)
        PS_LOG(PS_LOG_INFO, "resharded %u old parts into part %u of %u: model version %llu, %llu values, %u tables "
                            "with %llu rows",
               m, part, nparts, (unsigned long long)s->model.version, (unsigned long long)s->model.layout.total,
               s->tables.n, (unsigned long long)rows);
    for (uint32_t j = 0; j < m; j++)
        old_free(old[j]);
    return rc;
}
