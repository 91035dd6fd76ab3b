/* table.c - libpsclient: embedding tables (PROTOCOL.md 13): declaring a
 * table to every psd (declared again after a reconnect or to a psd that lost
 * it), pulling and pushing rows by key with each call's keys made distinct
 * first (a key's gradients summed), each key sent to the psd of its part
 * (13.7: jump_hash(mix(key), parts); every key to the first with one psd),
 * one message to each part at once, in messages that fit the limits. This
 * file owns the client's tables and their scratch. */
#define _GNU_SOURCE
#include "internal.h"

void psc__tables_free(psc_client *c)
{
    free(c->tabs);
    free(c->tk);
    free(c->tidx);
    free(c->tmap);
    free(c->tg);
    free(c->tpos);
    free(c->tgrows);
}

static int tab_find(const psc_client *c, const char *name)
{
    for (uint32_t i = 0; i < c->ntabs; i++)
        if (strcmp(c->tabs[i].def.name, name) == 0)
            return (int)i;
    return -1;
}

/* Sends one table message to psd i and reads its reply into r:
 * 0, or a library code with the error kept for psc_errmsg. */
static int tab_call(psc_client *c, uint32_t i, ps_msg *m, ps_msg *r)
{
    int rc = ps_client_call(&c->links[i].cl, m, r, c->timeout_ms);
    return rc ? psc__lfail(c, i, rc) : 0;
}

/* Declares t to every psd; with several, each is told the part it holds. */
static int tab_declare(psc_client *c, const struct psc_tab *t)
{
    for (uint32_t i = 0; i < c->nlinks; i++) {
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
        if (c->nlinks > 1) {
            m.has |= PS_F_PART;
            m.part = i;
            m.nparts = c->nlinks;
        }
        int rc = tab_call(c, i, &m, &r);
        if (rc != 0)
            return rc;
    }
    return 0;
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
 * them) and, for each key, its distinct key's index in c->tidx. 0 or
 * PSC_ENOMEM. */
static int tab_distinct(psc_client *c, const uint64_t *keys, size_t n, size_t *nu)
{
    size_t mcap = 16;
    while (mcap < 2 * n)
        mcap *= 2;
    if (grow((void **)&c->tk, &c->tk_cap, n ? n : 1, sizeof *c->tk) ||
        grow((void **)&c->tidx, &c->tidx_cap, n ? n : 1, sizeof *c->tidx) ||
        grow((void **)&c->tmap, &c->tmap_cap, 2 * mcap, sizeof *c->tmap))
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

/* Groups the nu distinct keys c->tk by part into c->tg (part p's keys at
 * [c->tfrom[p], c->tfrom[p + 1]), in first-seen order within a part), each
 * key's position there in c->tpos, with room for their rows in c->tgrows.
 * 0 or PSC_ENOMEM. */
static int tab_group(psc_client *c, size_t nu, uint32_t dim)
{
    uint32_t n = c->nlinks;
    if (grow((void **)&c->tg, &c->tg_cap, nu ? nu : 1, sizeof *c->tg) ||
        grow((void **)&c->tpos, &c->tpos_cap, nu ? nu : 1, sizeof *c->tpos) ||
        grow((void **)&c->tgrows, &c->tgrows_cap, (nu ? nu : 1) * dim, sizeof *c->tgrows))
        return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
    size_t at[PS_PARTS_MAX + 1];
    memset(at, 0, sizeof at);
    for (size_t u = 0; u < nu; u++) {
        c->tpos[u] = ps_table_part(c->tk[u], n); /* for now its part */
        at[c->tpos[u] + 1]++;
    }
    for (uint32_t p = 0; p < n; p++)
        at[p + 1] += at[p];
    memcpy(c->tfrom, at, (n + 1) * sizeof at[0]);
    for (size_t u = 0; u < nu; u++) {
        size_t pos = at[c->tpos[u]]++;
        c->tg[pos] = c->tk[u];
        c->tpos[u] = (uint32_t)pos;
    }
    return 0;
}

/* Pulls (push 0) the rows of the grouped keys c->tg into c->tgrows, or
 * pushes (push 1) the rows c->tgrows: each part's keys to its psd, in
 * messages of at most tab_chunk keys. Every part is in flight at once: a
 * round sends one message to each part with keys left, then reads their
 * replies in the same order (all of them, even after one failed, so every
 * connection stays in step). done[p] counts part p's keys answered; a call
 * again after a failure (a retry) goes on from there, so a part that took a
 * push does not take it twice. 0 or a code. */
static int tab_exchange(psc_client *c, const struct psc_tab *t, int push, size_t *done)
{
    uint32_t dim = t->def.dim, n = c->nlinks;
    size_t chunk = tab_chunk(dim), cnt[PS_PARTS_MAX];
    uint64_t ids[PS_PARTS_MAX];
    for (;;) {
        int rc = 0, any = 0;
        memset(cnt, 0, sizeof cnt);
        for (uint32_t p = 0; p < n && rc == 0; p++) {
            size_t from = c->tfrom[p] + done[p], left = c->tfrom[p + 1] - from;
            if (left == 0)
                continue;
            size_t k = left < chunk ? left : chunk;
            ps_msg m;
            ps_msg_init(&m, push ? PS_MSG_TPUSH : PS_MSG_TPULL);
            m.has = PS_F_TAB | PS_F_KEYS;
            snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
            m.keys = (ps_keys){(const uint8_t *)(c->tg + from), (uint32_t)k}; /* the host is little-endian */
            if (push) {
                m.has |= PS_F_BASE | PS_F_DATA;
                m.base = psc__push_base(c, &c->links[p]);
                m.data = c->tgrows + from * dim;
                m.ndata = k * dim;
            }
            int r = ps_client_send(&c->links[p].cl, &m);
            if (r != 0) {
                rc = psc__lfail(c, p, r);
                break;
            }
            ids[p] = m.id;
            cnt[p] = k;
            any = 1;
        }
        for (uint32_t p = 0; p < n; p++) {
            if (cnt[p] == 0)
                continue;
            ps_msg r;
            size_t from = c->tfrom[p] + done[p];
            int r2 = ps_client_recv(&c->links[p].cl, &r, c->timeout_ms);
            if (r2 == 0 && (r.has & PS_F_ID) && r.id != ids[p])
                r2 = psc__fail(c, PSC_EMALFORMED, "table '%s': psd at %s answered request %llu, expected %llu",
                               t->def.name, c->links[p].server, (unsigned long long)r.id,
                               (unsigned long long)ids[p]);
            else if (r2 == 0 && !push && (r.type != PS_MSG_ROWS || r.ndata != cnt[p] * dim))
                r2 = psc__fail(c, PSC_EMALFORMED,
                               "table '%s': psd at %s answered a pull of %zu rows with %s of %llu values",
                               t->def.name, c->links[p].server, cnt[p], ps_msg_type_name(r.type),
                               (unsigned long long)r.ndata);
            else if (r2 != 0)
                r2 = psc__lfail(c, p, r2);
            if (r2 != 0) {
                if (rc == 0)
                    rc = r2;
                continue;
            }
            if (!push)
                memcpy(c->tgrows + from * dim, r.data, cnt[p] * dim * sizeof(float));
            done[p] += cnt[p];
        }
        if (rc != 0 || !any)
            return rc;
    }
}

/* Runs op once more after a reconnect, or after declaring the tables
 * again to a psd that does not know them. */
static int tab_retry(psc_client *c, int rc)
{
    /* a table push past psd's memory caps is refused whatever the
     * connection: LIMIT here is not the connection limit a reconnect waits out */
    int limit = rc == PS_EREMOTE && c->links[c->err_link].cl.remote_code == -PS_ELIMIT;
    if (c->auto_reconnect && !limit && psc__recoverable(c, rc)) {
        int r2 = psc__reconnect(c);
        return r2 ? r2 : tab_redeclare(c);
    }
    if (rc == PS_EREMOTE && c->links[c->err_link].cl.remote_code == -PS_ERANGE &&
        strstr(ps_client_error(&c->links[c->err_link].cl), "unknown table"))
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
        rc = tab_distinct(c, keys, n, &nu);
    if (rc != 0 || n == 0)
        return rc;
    if (rc == 0)
        rc = tab_group(c, nu, t->def.dim);
    if (rc != 0)
        return rc;
    psc__waiting_clear(c);
    size_t done[PS_PARTS_MAX] = {0};
    rc = tab_exchange(c, t, 0, done);
    if (rc != 0 && (rc = tab_retry(c, rc)) == 0)
        rc = tab_exchange(c, t, 0, done);
    if (rc != 0)
        return psc__public_code(c, rc);
    uint32_t dim = t->def.dim;
    for (size_t i = 0; i < n; i++)
        memcpy(rows + i * dim, c->tgrows + (size_t)c->tpos[c->tidx[i]] * dim, dim * sizeof(float));
    return 0;
}

int psc_table_push(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads)
{
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_push", name, keys, n, grads, &t);
    size_t nu = 0;
    if (rc == 0)
        rc = tab_distinct(c, keys, n, &nu);
    if (rc != 0 || n == 0)
        return rc;
    uint32_t dim = t->def.dim;
    if ((rc = tab_group(c, nu, dim)) != 0)
        return rc;
    /* a key's rows summed, in the order they come, at its place in its part */
    memset(c->tgrows, 0, nu * dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *dst = c->tgrows + (size_t)c->tpos[c->tidx[i]] * dim;
        for (uint32_t j = 0; j < dim; j++)
            dst[j] += grads[i * dim + j];
    }
    for (size_t i = 0; i < nu * dim; i++)
        if (!isfinite(c->tgrows[i]))
            return psc__fail(c, PSC_ENONFINITE, "psc_table_push: table '%s': the gradient of key %llu is not finite",
                        t->def.name, (unsigned long long)c->tg[i / dim]);
    psc__waiting_clear(c);
    size_t done[PS_PARTS_MAX] = {0};
    rc = tab_exchange(c, t, 1, done);
    if (rc != 0 && (rc = tab_retry(c, rc)) == 0)
        rc = tab_exchange(c, t, 1, done); /* the parts that did not take it: after a reconnect, psd never had it */
    return rc ? psc__public_code(c, rc) : 0;
}

int psc_table_pushpull(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads,
                       const uint64_t *next, size_t m, float *rows)
{
    int rc = psc_table_push(c, name, keys, n, grads);
    return rc ? rc : psc_table_pull(c, name, next, m, rows);
}
