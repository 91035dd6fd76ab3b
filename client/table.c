/* table.c - libpsclient: embedding tables (PROTOCOL.md 13), all on the first psd: declaring a
 * table (declared again after a reconnect or to a psd that lost it), pulling and pushing rows
 * by key with each call's keys made distinct first (a key's gradients summed) and sent in
 * messages that fit the limits. This file owns the client's tables and their scratch. */
#define _GNU_SOURCE
#include "internal.h"

void psc__tables_free(psc_client *c)
{
    free(c->tabs);
    free(c->tk);
    free(c->tidx);
    free(c->tmap);
    free(c->trows);
}

static int tab_find(const psc_client *c, const char *name)
{
    for (uint32_t i = 0; i < c->ntabs; i++)
        if (strcmp(c->tabs[i].def.name, name) == 0)
            return (int)i;
    return -1;
}

/* Sends one table message to the first psd and reads its reply into r:
 * 0, or a library code with the error kept for psc_errmsg. */
static int tab_call(psc_client *c, ps_msg *m, ps_msg *r)
{
    int rc = ps_client_call(&c->links[0].cl, m, r, c->timeout_ms);
    return rc ? psc__lfail(c, 0, rc) : 0;
}

static int tab_declare(psc_client *c, const struct psc_tab *t)
{
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_TABLE);
    m.has = PS_F_TAB | PS_F_DIM | PS_F_RINIT | PS_F_SEED | PS_F_OPT | PS_F_HP;
    snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
    m.dim = t->def.dim;
    snprintf(m.rinit, sizeof m.rinit, "%s", ps_rinit_name(t->def.rinit));
    if (t->def.rinit != PS_RINIT_ZEROS) {
        m.has |= PS_F_SCALE;
        m.scale = t->def.scale;
    }
    m.seed = t->def.seed;
    snprintf(m.opt, sizeof m.opt, "%s", ps_topt_name(t->def.opt));
    m.hp = t->hp;
    return tab_call(c, &m, &r);
}

/* After a reconnect, or when psd says it does not know a table (it
 * restarted without its state): every table declared again. */
static int tab_redeclare(psc_client *c)
{
    for (uint32_t i = 0; i < c->ntabs; i++) {
        int rc = tab_declare(c, &c->tabs[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int psc_table(psc_client *c, const char *name, uint32_t dim, const char *init, double scale, uint64_t seed,
              const char *opt, const char *hp)
{
    int rc = psc__ready(c, "psc_table");
    if (rc != 0)
        return rc;
    struct psc_tab t;
    memset(&t, 0, sizeof t);
    /* hp: "key=value,key=value" */
    for (const char *p = hp ? hp : ""; *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        int id = eq && eq < end ? ps_hp_lookup(p, (size_t)(eq - p)) : -1;
        char *stop;
        double v = id >= 0 ? strtod(eq + 1, &stop) : 0;
        if (id < 0 || stop != end)
            return psc__fail(c, PSC_EINVAL, "psc_table: hyper-parameters are key=value,... with keys lr, eps, beta1, "
                                       "beta2, iacc, beta, l1, l2, not '%.*s'", (int)(end - p), p);
        t.hp.has |= 1u << id;
        t.hp.v[id] = v;
        p = *end ? end + 1 : end;
    }
    char err[300];
    if (ps_table_def_make(&t.def, name ? name : "", dim, init ? init : "", 1, scale, seed, opt ? opt : "", &t.hp,
                          err, sizeof err) != 0)
        return psc__fail(c, PSC_EINVAL, "psc_table: %s", err);
    psc__waiting_clear(c);
    rc = tab_declare(c, &t);
    if (rc != 0 && c->auto_reconnect && psc__recoverable(c, rc) && (rc = psc__reconnect(c)) == 0 &&
        (rc = tab_redeclare(c)) == 0)
        rc = tab_declare(c, &t);
    if (rc != 0)
        return psc__public_code(c, rc);
    int i = tab_find(c, t.def.name);
    if (i < 0) {
        struct psc_tab *n = realloc(c->tabs, (c->ntabs + 1) * sizeof *n);
        if (!n)
            return psc__fail(c, PSC_ENOMEM, "psc_table: out of memory");
        c->tabs = n;
        i = (int)c->ntabs++;
    }
    c->tabs[i] = t;
    return 0;
}

static int grow(void **p, size_t *cap, size_t want, size_t size)
{
    if (want <= *cap)
        return 0;
    size_t n = *cap ? *cap : 256;
    while (n < want)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* The distinct keys of keys[0..n) in c->tk (first-seen order, *nu of
 * them) and, for each key, its distinct key's index in c->tidx; room for
 * their rows (dim floats each) in c->trows. 0 or PSC_ENOMEM. */
static int tab_distinct(psc_client *c, const uint64_t *keys, size_t n, uint32_t dim, size_t *nu)
{
    size_t mcap = 16;
    while (mcap < 2 * n)
        mcap *= 2;
    if (grow((void **)&c->tk, &c->tk_cap, n ? n : 1, sizeof *c->tk) ||
        grow((void **)&c->tidx, &c->tidx_cap, n ? n : 1, sizeof *c->tidx) ||
        grow((void **)&c->tmap, &c->tmap_cap, 2 * mcap, sizeof *c->tmap) ||
        grow((void **)&c->trows, &c->trows_cap, (n ? n : 1) * dim, sizeof *c->trows))
        return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", n);
    memset(c->tmap, 0, 2 * mcap * sizeof *c->tmap);
    *nu = 0;
    for (size_t i = 0; i < n; i++) {
        size_t s = (size_t)(ps_mix64(keys[i]) & (mcap - 1));
        while (c->tmap[2 * s + 1] && c->tmap[2 * s] != keys[i])
            s = (s + 1) & (mcap - 1);
        if (!c->tmap[2 * s + 1]) {
            c->tmap[2 * s] = keys[i];
            c->tmap[2 * s + 1] = ++*nu;
            c->tk[*nu - 1] = keys[i];
        }
        c->tidx[i] = (uint32_t)(c->tmap[2 * s + 1] - 1);
    }
    return 0;
}

/* Keys a message of a table of dim values may carry. */
static size_t tab_chunk(uint32_t dim)
{
    size_t k = PS_TABLE_VALUES_MAX / dim;
    return k < PS_TABLE_KEYS_MAX ? k : PS_TABLE_KEYS_MAX;
}

/* Pulls the rows of the nu distinct keys c->tk into c->trows; 0 or a code. */
static int tab_pull_distinct(psc_client *c, const struct psc_tab *t, size_t nu)
{
    uint32_t dim = t->def.dim;
    for (size_t at = 0; at < nu;) {
        size_t k = nu - at < tab_chunk(dim) ? nu - at : tab_chunk(dim);
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_TPULL);
        m.has = PS_F_TAB | PS_F_KEYS;
        snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
        m.keys = (ps_keys){(const uint8_t *)(c->tk + at), (uint32_t)k}; /* the host is little-endian */
        int rc = tab_call(c, &m, &r);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_ROWS || r.ndata != k * dim)
            return psc__fail(c, PSC_EMALFORMED, "table '%s': psd answered a pull of %zu rows with %s of %llu values",
                        t->def.name, k, ps_msg_type_name(r.type), (unsigned long long)r.ndata);
        memcpy(c->trows + at * dim, r.data, k * dim * sizeof(float));
        at += k;
    }
    return 0;
}

/* Pushes the rows c->trows of the nu distinct keys c->tk; 0 or a code. */
static int tab_push_distinct(psc_client *c, const struct psc_tab *t, size_t nu)
{
    uint32_t dim = t->def.dim;
    for (size_t at = 0; at < nu;) {
        size_t k = nu - at < tab_chunk(dim) ? nu - at : tab_chunk(dim);
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_TPUSH);
        m.has = PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA;
        snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
        m.keys = (ps_keys){(const uint8_t *)(c->tk + at), (uint32_t)k};
        m.base = psc__push_base(c, &c->links[0]);
        m.data = c->trows + at * dim;
        m.ndata = k * dim;
        int rc = tab_call(c, &m, &r);
        if (rc != 0)
            return rc;
        at += k;
    }
    return 0;
}

/* Runs op once more after a reconnect, or after declaring the tables
 * again to a psd that does not know them. */
static int tab_retry(psc_client *c, int rc)
{
    if (c->auto_reconnect && psc__recoverable(c, rc)) {
        int r2 = psc__reconnect(c);
        return r2 ? r2 : tab_redeclare(c);
    }
    if (rc == PS_EREMOTE && c->links[0].cl.remote_code == -PS_ERANGE &&
        strstr(ps_client_error(&c->links[0].cl), "unknown table"))
        return tab_redeclare(c);
    return rc;
}

static int tab_ready(psc_client *c, const char *what, const char *name, const void *keys, size_t n, const void *v,
                     const struct psc_tab **t)
{
    int rc = psc__ready(c, what);
    if (rc != 0)
        return rc;
    int i = name ? tab_find(c, name) : -1;
    if (i < 0)
        return psc__fail(c, PSC_ENOTFOUND, "%s: no table '%s' (declare it with psc_table first)", what, name ? name : "");
    if (n && (!keys || !v))
        return psc__fail(c, PSC_EINVAL, "%s: NULL keys or rows", what);
    if (n > UINT32_MAX)
        return psc__fail(c, PSC_EINVAL, "%s: %zu keys in one call; at most 2^32 - 1", what, n);
    *t = &c->tabs[i];
    return 0;
}

int psc_table_pull(psc_client *c, const char *name, const uint64_t *keys, size_t n, float *rows)
{
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_pull", name, keys, n, rows, &t);
    size_t nu = 0;
    if (rc == 0)
        rc = tab_distinct(c, keys, n, t->def.dim, &nu);
    if (rc != 0 || n == 0)
        return rc;
    psc__waiting_clear(c);
    rc = tab_pull_distinct(c, t, nu);
    if (rc != 0 && (rc = tab_retry(c, rc)) == 0)
        rc = tab_pull_distinct(c, t, nu);
    if (rc != 0)
        return psc__public_code(c, rc);
    uint32_t dim = t->def.dim;
    for (size_t i = 0; i < n; i++)
        memcpy(rows + i * dim, c->trows + (size_t)c->tidx[i] * dim, dim * sizeof(float));
    return 0;
}

int psc_table_push(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads)
{
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_push", name, keys, n, grads, &t);
    size_t nu = 0;
    if (rc == 0)
        rc = tab_distinct(c, keys, n, t->def.dim, &nu);
    if (rc != 0 || n == 0)
        return rc;
    /* a key's rows summed, in the order they come */
    uint32_t dim = t->def.dim;
    memset(c->trows, 0, nu * dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *dst = c->trows + (size_t)c->tidx[i] * dim;
        for (uint32_t j = 0; j < dim; j++)
            dst[j] += grads[i * dim + j];
    }
    for (size_t i = 0; i < nu * dim; i++)
        if (!isfinite(c->trows[i]))
            return psc__fail(c, PSC_ENONFINITE, "psc_table_push: table '%s': the gradient of key %llu is not finite",
                        t->def.name, (unsigned long long)c->tk[i / dim]);
    psc__waiting_clear(c);
    rc = tab_push_distinct(c, t, nu);
    if (rc != 0 && (rc = tab_retry(c, rc)) == 0)
        rc = tab_push_distinct(c, t, nu); /* after a reconnect: psd never had it */
    return rc ? psc__public_code(c, rc) : 0;
}

int psc_table_pushpull(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads,
                       const uint64_t *next, size_t m, float *rows)
{
    int rc = psc_table_push(c, name, keys, n, grads);
    return rc ? rc : psc_table_pull(c, name, next, m, rows);
}
