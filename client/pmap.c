/* pmap.c - libpsclient: the job's part map (PROTOCOL.md 18), once psd has moved the job's
 * tables to more or fewer parts: keeping a newer map a reply carries (WELCOME, ERROR LAYOUT,
 * ERROR MOVED); adopting it into the links (matched to its parts by address; a removed part's
 * link closed with a BYE; an added part's link set up with its layout, or, for a part that
 * holds table rows only, none: its HELLO says the map instead; the dense split made anew when
 * the map's `dense` changed); and a table call's keys grouped anew under it. Opening the links
 * it set up is link.c's, declaring the tables again table.c's (told by tabs_stale). A client
 * that never sees a map never gets here: its calls pay nothing for it. */
#define _GNU_SOURCE
#include "internal.h"

void psc__pmap_note(psc_client *c, const ps_msg *r)
{
    const ps_pmap *p = &r->pmap;
    if (!(r->has2 & PS_F2_PMAP) || p->epoch <= c->epoch || p->epoch <= c->pm.epoch)
        return;
    /* the decoder checked the shape; our own arrays are asserted */
    if (p->n == 0 || p->n > PS_PARTS_MAX || p->dense == 0 || p->dense > p->n)
        return;
    c->pm.epoch = p->epoch;
    c->pm.dense = p->dense;
    c->pm.n = p->n;
    for (uint32_t j = 0; j < p->n; j++) {
        size_t len = p->addrs[j].len > PS_ADDR_MAX ? PS_ADDR_MAX : p->addrs[j].len;
        memcpy(c->pm.addrs[j], p->addrs[j].p, len);
        c->pm.addrs[j][len] = '\0';
    }
}

/* 1 when an address of the map's entry e (a part given as its replicas
 * is "A/B") is one of ln's addresses (the part's replicas). */
static int link_has(const psc_link *ln, const char *e)
{
    for (const char *q = e; *q;) {
        size_t len = strcspn(q, "/");
        for (uint32_t k = 0; k < ln->naddrs; k++)
            if (strlen(ln->addrs[k]) == len && memcmp(ln->addrs[k], q, len) == 0)
                return 1;
        q += len + (q[len] == '/');
    }
    return 0;
}

/* 1 when one of the map's parts is ln's part. */
static int in_map(const struct psc_pmap *pm, const psc_link *ln)
{
    for (uint32_t j = 0; j < pm->n; j++)
        if (link_has(ln, pm->addrs[j]))
            return 1;
    return 0;
}

/* A part the map dropped: its psd is told this worker leaves it (BYE),
 * and the link is closed. */
static void link_bye(psc_client *c, psc_link *ln)
{
    static const char why[] = "the part left the job's part map";
    psc__hb_stop(ln);
    if (ln->cl.fd >= 0) {
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_BYE);
        m.has = PS_F_TEXT;
        m.text = why;
        m.text_len = sizeof why - 1;
        ps_conn_call(&ln->cl, &m, &r, c->timeout_ms < 5000 ? c->timeout_ms : 5000);
    }
    psc__link_close(ln);
}

int psc__pmap_adopt(psc_client *c)
{
    struct psc_pmap *pm = &c->pm;
    if (pm->epoch <= c->epoch) {
        pm->epoch = 0;
        return 0;
    }
    /* the split the map asks for, tried before anything changes (a
     * layout is ~360 KB: not on the stack) */
    ps_layout *trial = malloc(sizeof *trial);
    if (!trial)
        return psc__fail(c, PSC_ENOMEM, "out of memory for a part's layout");
    uint64_t lo, hi;
    for (uint32_t i = 0; i < pm->dense; i++)
        if (ps_layout_part(&c->layout, i, pm->dense, trial, &lo, &hi) != 0) {
            free(trial);
            pm->epoch = 0;
            return psc__fail(c, PSC_EINVAL, "psd's part map (epoch %llu) splits the model over %u psd; its %llu "
                             "values cannot be (a part needs at least %u, and a cut tensor's name with its range "
                             "at most %d bytes)", (unsigned long long)pm->epoch, pm->dense,
                             (unsigned long long)c->layout.total, PS_PART_ALIGN, PS_NAME_MAX);
        }
    free(trial);
    uint32_t oldn = c->nlinks, olddense = c->ndense, added = 0, removed = 0;
    for (uint32_t i = 0; i < oldn; i++)
        if (!in_map(pm, &c->links[i])) {
            PS_LOG(PS_LOG_INFO, "part %u (%s) left the job's part map: bye", i, c->links[i].server);
            link_bye(c, &c->links[i]);
            removed++;
        }
    for (uint32_t j = 0; j < pm->n; j++) {
        while (c->nmade <= j)
            psc__link_make(c, c->nmade);
        psc_link *ln = &c->links[j];
        int same = j < oldn && link_has(ln, pm->addrs[j]);
        if (same) /* replicas the map names that the link did not know */
            ps_addr_list_add_entry(ln->addrs, &ln->naddrs, PSC_ADDRS_MAX, pm->addrs[j]);
        int dense = j < pm->dense, was_dense = j < olddense;
        if (same && dense == was_dense && (!dense || pm->dense == olddense))
            continue; /* the same part, the same values: the link stays as it is */
        /* closed without a BYE: its psd may hold another part of the map,
         * and the next open says hello with the layout it now needs */
        psc__link_close(ln);
        if (!same) {
            ln->naddrs = 0;
            ps_addr_list_add_entry(ln->addrs, &ln->naddrs, PSC_ADDRS_MAX, pm->addrs[j]);
            if (!ln->naddrs) /* an entry of slashes alone: as it is (it will not connect) */
                ps_addr_list_add(ln->addrs, &ln->naddrs, PSC_ADDRS_MAX, pm->addrs[j], strlen(pm->addrs[j]));
            ln->cur = 0;
            snprintf(ln->server, sizeof ln->server, "%s", ln->addrs[0]);
            ln->version = 0;
            added++;
        }
        if (dense) {
            ps_layout_part(&c->layout, j, pm->dense, &ln->layout, &ln->lo, &ln->hi); /* tried above */
        } else {
            ps_layout_init(&ln->layout); /* a table-only part: no layout */
            ln->lo = ln->hi = 0;
        }
    }
    for (uint32_t i = pm->n; i < oldn; i++)
        psc__link_close(&c->links[i]); /* past the map's end: its psd holds another of its parts */
    PS_LOG(PS_LOG_INFO, "part map epoch %llu: %u parts (%u added, %u removed), the dense model on the first %u%s",
           (unsigned long long)pm->epoch, pm->n, added, removed, pm->dense,
           pm->dense != olddense ? " (split anew)" : "");
    c->nlinks = pm->n;
    c->ndense = pm->dense;
    c->epoch = pm->epoch;
    c->map = *pm;
    pm->epoch = 0;
    c->tabs_stale = 1;
    if (c->err_link >= c->nlinks)
        c->err_link = 0;
    return 1;
}

int psc__pmap_regroup(psc_client *c, struct psc_tkeys *k, uint32_t dim, size_t *done, int push)
{
    uint32_t oldn = k->nparts, n = c->nlinks;
    size_t nu = k->tfrom[oldn], m = nu ? nu : 1;
    if (k->ident) {
        /* the caller's keys and rows as they were sent, into the scratch:
         * one part's grouping (the keys distinct, in their order) */
        if (m > k->tg_cap) {
            uint64_t *tg = realloc(k->tg, m * sizeof *tg);
            if (!tg)
                return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
            k->tg = tg, k->tg_cap = m;
        }
        if (m > k->tpos_cap) {
            uint32_t *tpos = realloc(k->tpos, m * sizeof *tpos);
            if (!tpos)
                return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
            k->tpos = tpos, k->tpos_cap = m;
        }
        if (m * dim > k->tgrows_cap) {
            float *rows = realloc(k->tgrows, m * dim * sizeof *rows);
            if (!rows)
                return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
            k->tgrows = rows, k->tgrows_cap = m * dim;
        }
        memcpy(k->tg, k->sk, nu * sizeof *k->tg);
        for (size_t u = 0; u < nu; u++)
            k->tpos[u] = (uint32_t)u;
        /* a push's gradients, or the rows a pull was answered already */
        memcpy(k->tgrows, push ? k->sr : k->rr, (push ? nu : done[0]) * dim * sizeof(float));
        k->ident = 0;
        k->sk = k->tg;
        k->sr = k->rr = k->tgrows;
    }
    uint32_t *to = malloc(m * sizeof *to);
    uint64_t *tg = malloc(m * sizeof *tg);
    float *rows = malloc(m * dim * sizeof *rows);
    if (!to || !tg || !rows) {
        free(to);
        free(tg);
        free(rows);
        return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
    }
    /* where each key goes: the answered ones first, in their order ... */
    size_t old[PS_PARTS_MAX + 1], next[PS_PARTS_MAX], cnt[PS_PARTS_MAX], at = 0;
    memcpy(old, k->tfrom, (oldn + 1) * sizeof old[0]);
    memset(cnt, 0, sizeof cnt);
    for (uint32_t p = 0; p < oldn; p++)
        for (size_t x = old[p]; x < old[p] + done[p]; x++)
            to[x] = (uint32_t)at++;
    /* ... then the others, grouped by their part in the new map */
    for (uint32_t p = 0; p < oldn; p++)
        for (size_t x = old[p] + done[p]; x < old[p + 1]; x++) {
            to[x] = ps_table_part(k->tg[x], n); /* for now its part */
            cnt[to[x]]++;
        }
    k->tfrom[0] = 0; /* part 0's range begins with the answered keys, counted done */
    for (uint32_t q = 0; q < n; q++) {
        next[q] = q ? k->tfrom[q] : at;
        k->tfrom[q + 1] = next[q] + cnt[q];
    }
    for (uint32_t p = 0; p < oldn; p++)
        for (size_t x = old[p] + done[p]; x < old[p + 1]; x++)
            to[x] = (uint32_t)next[to[x]]++;
    for (size_t x = 0; x < nu; x++) {
        tg[to[x]] = k->tg[x];
        memcpy(rows + (size_t)to[x] * dim, k->tgrows + x * dim, dim * sizeof(float));
    }
    for (size_t u = 0; u < nu; u++)
        k->tpos[u] = to[k->tpos[u]];
    memcpy(k->tg, tg, nu * sizeof *tg);
    memcpy(k->tgrows, rows, nu * dim * sizeof *rows);
    free(to);
    free(tg);
    free(rows);
    memset(done, 0, PS_PARTS_MAX * sizeof *done);
    done[0] = at;
    k->nparts = n;
    k->epoch = c->epoch;
    return 0;
}
