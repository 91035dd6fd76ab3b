/* table.c - libpsclient: embedding tables (PROTOCOL.md 13): declaring a
 * table to every psd (declared again after a reconnect, to a psd that lost
 * it, or under a new part map), pulling and pushing rows by key with each
 * call's keys made distinct first (a key's gradients summed), each key sent
 * to the psd of its part (13.7: jump_hash(mix(key), parts); every key to the
 * first with one psd), one message to each part at once, in messages that
 * fit the limits; a message psd answers MOVED sent again under the part map
 * it names (18; the keys grouped anew: pmap.c), one answered NOT_READY sent
 * again after a short wait. This file owns the client's tables and their
 * scratch. */
#define _GNU_SOURCE
#include "internal.h"

void psc__tables_free(psc_client *c)
{
    free(c->tabs);
    for (int g = 0; g < 2; g++) {
        struct psc_tkeys *k = &c->tks[g];
        free(k->tk);
        free(k->tidx);
        free(k->tmap);
        free(k->tg);
        free(k->tpos);
        free(k->tgrows);
    }
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
    int rc = ps_conn_call(&c->links[i].cl, m, r, c->timeout_ms);
    if (rc == PS_EREMOTE)
        psc__pmap_note(c, r);
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

/* After a reconnect, when psd says it does not know a table (it
 * restarted without its state), or under a new part map: every table
 * declared again. */
static int tab_redeclare(psc_client *c)
{
    for (uint32_t i = 0; i < c->ntabs; i++) {
        int rc = tab_declare(c, &c->tabs[i]);
        if (rc != 0)
            return rc;
    }
    c->tabs_stale = 0;
    return 0;
}

/* A reply carried a newer part map: adopted, the links it added opened,
 * every table declared again. 0 (also when there was none) or a code. */
static int tab_adopt(psc_client *c)
{
    int rc = psc__adopt(c);
    if (rc == 0 && c->tabs_stale)
        rc = tab_redeclare(c);
    return rc;
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
    rc = c->tabs_stale ? tab_redeclare(c) : 0; /* a part map was adopted since */
    if (rc == 0)
        rc = tab_declare(c, &t);
    if (rc != 0 && c->pm.epoch > c->epoch && (rc = tab_adopt(c)) == 0) /* a part map psd named */
        rc = tab_declare(c, &t);
    if (rc != 0 && c->auto_reconnect && psc__recoverable(c, rc) && (rc = psc__reconnect(c, rc)) == 0 &&
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

/* The distinct keys of keys[0..n) in g->tk (first-seen order, *nu of
 * them) and, for each key, its distinct key's index in g->tidx. The set
 * holds 4-byte indexes (64 KiB for 4,096 keys). 0 or PSC_ENOMEM. */
static int tab_distinct(psc_client *c, struct psc_tkeys *g, const uint64_t *keys, size_t n, size_t *nu)
{
    size_t mcap = 16;
    while (mcap < 4 * n) /* a quarter full at most: probes stay short */
        mcap *= 2;
    if (grow((void **)&g->tk, &g->tk_cap, n ? n : 1, sizeof *g->tk) ||
        grow((void **)&g->tidx, &g->tidx_cap, n ? n : 1, sizeof *g->tidx) ||
        grow((void **)&g->tmap, &g->tmap_cap, mcap, sizeof *g->tmap))
        return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", n);
    memset(g->tmap, 0, mcap * sizeof *g->tmap);
    uint32_t u = 0;
    for (size_t i = 0; i < n; i++) {
        size_t s = (size_t)(ps_mix64(keys[i]) & (mcap - 1));
        while (g->tmap[s] && g->tk[g->tmap[s] - 1] != keys[i])
            s = (s + 1) & (mcap - 1);
        if (!g->tmap[s]) {
            g->tk[u] = keys[i];
            g->tmap[s] = ++u;
        }
        g->tidx[i] = g->tmap[s] - 1;
    }
    *nu = u;
    return 0;
}

/* Keys a message of a table of dim values may carry. */
static size_t tab_chunk(uint32_t dim)
{
    size_t k = PS_TABLE_VALUES_MAX / dim;
    return k < PS_TABLE_KEYS_MAX ? k : PS_TABLE_KEYS_MAX;
}

/* Groups the nu distinct keys g->tk by part into g->tg (part p's keys at
 * [g->tfrom[p], g->tfrom[p + 1]), in first-seen order within a part), each
 * key's position there in g->tpos, with room for their rows in g->tgrows.
 * 0 or PSC_ENOMEM. */
static int tab_group(psc_client *c, struct psc_tkeys *g, size_t nu, uint32_t dim)
{
    uint32_t n = c->nlinks;
    if (grow((void **)&g->tg, &g->tg_cap, nu ? nu : 1, sizeof *g->tg) ||
        grow((void **)&g->tpos, &g->tpos_cap, nu ? nu : 1, sizeof *g->tpos) ||
        grow((void **)&g->tgrows, &g->tgrows_cap, (nu ? nu : 1) * dim, sizeof *g->tgrows))
        return psc__fail(c, PSC_ENOMEM, "out of memory for %zu keys", nu);
    size_t at[PS_PARTS_MAX + 1];
    memset(at, 0, sizeof at);
    for (size_t u = 0; u < nu; u++) {
        g->tpos[u] = ps_table_part(g->tk[u], n); /* for now its part */
        at[g->tpos[u] + 1]++;
    }
    for (uint32_t p = 0; p < n; p++)
        at[p + 1] += at[p];
    memcpy(g->tfrom, at, (n + 1) * sizeof at[0]);
    g->nparts = n;
    g->epoch = c->epoch;
    for (size_t u = 0; u < nu; u++) {
        size_t pos = at[g->tpos[u]]++;
        g->tg[pos] = g->tk[u];
        g->tpos[u] = (uint32_t)pos;
    }
    return 0;
}

/* Moves table request m's keys and rows into ln's table segment
 * (PROTOCOL.md 13.9): its keys from byte 0, then a push's row gradients,
 * then a TPUSHPULL's keys to pull; "seg" says so, and where psd writes the
 * rows it answers (PSC_TSEG_ROWS). Any message of tab_chunk keys fits. */
static void tab_to_seg(psc_link *ln, ps_msg *m)
{
    uint8_t *at = ln->tseg;
    memcpy(at, m->keys.p, (size_t)m->keys.n * 8);
    at += (size_t)m->keys.n * 8;
    if (m->has & PS_F_DATA) {
        memcpy(at, m->data, (size_t)m->ndata * sizeof(float));
        at += (size_t)m->ndata * sizeof(float);
    }
    if (m->has & PS_F_PKEYS)
        memcpy(at, m->pkeys.p, (size_t)m->pkeys.n * 8);
    m->seg = (ps_seg){.at = 0, .n = m->keys.n, .m = (m->has & PS_F_PKEYS) ? m->pkeys.n : 0, .rat = PSC_TSEG_ROWS};
    m->has = (m->has & ~(PS_F_KEYS | PS_F_PKEYS | PS_F_DATA)) | PS_F_SEG;
}
_Static_assert(PSC_TSEG_BYTES <= PS_TSEG_MAX, "psd maps a table segment of at most PS_TSEG_MAX bytes");

/* What tab_exchange does: pull the keys of c->tks[0], push them, or push
 * them and pull those of c->tks[1]. */
enum { TAB_PULL, TAB_PUSH, TAB_PUSHPULL };

/* NOT_READY's wait before a table message goes again: 1 ms doubling to
 * this (PROTOCOL.md 18, rule 5) */
#define TAB_WAIT_MAX_MS 50

/* Sleeps ms before table messages go again; PSC_EINTR when a signal ends
 * it and the option interrupt is on (no reply is outstanding then), else 0. */
static int tab_sleep(psc_client *c, int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        if (c->interrupt)
            return psc__fail(c, PSC_EINTR, "a table call: interrupted by a signal while waiting to ask psd again");
    return 0;
}

/* The push part of m (a TPUSH or TPUSHPULL to ln): the k keys of g from
 * `from` and their rows, with push id pid. The host is little-endian. */
static void tab_push_part(const psc_client *c, const psc_link *ln, const struct psc_tkeys *g, size_t from, size_t k,
                          uint32_t dim, uint64_t pid, ps_msg *m)
{
    m->has |= PS_F_TAB | PS_F_KEYS | PS_F_BASE | PS_F_DATA;
    m->keys = (ps_keys){(const uint8_t *)(g->sk + from), (uint32_t)k};
    m->base = psc__push_base(c, ln);
    m->data = g->sr + from * dim;
    m->ndata = k * dim;
    m->has2 = PS_F2_PID;
    m->pid = pid;
}

/* A reconnect brought a newer part map: the pushes whose replies the lost
 * connections took go again, as they were (keys, rows, push id), to the
 * parts they went to, before their keys are grouped anew. That part
 * applied one or not; only it knows. Applied, it answers it as then (its
 * push ids are checked before its keys, PROTOCOL.md 15), and those keys
 * count as answered; not applied, their rows may have moved on (MOVED,
 * NOT_READY: nothing changed) and they go with the others to their parts
 * under the new map. Grouped anew without asking, a push a part took just
 * before its rows were handed over would be applied a second time by
 * their new part. 0 or a code. */
static int tab_settle(psc_client *c, const struct psc_tab *t, size_t *done)
{
    struct psc_tkeys *g = &c->tks[0];
    uint32_t dim = t->def.dim;
    for (uint32_t p = 0; p < g->nparts; p++) {
        struct psc_unsure *u = &c->unsure[p];
        if (!u->on)
            continue;
        u->on = 0;
        uint32_t q = 0;
        while (q < c->nlinks && (strcmp(c->links[q].server, u->addr) != 0 || c->links[q].cl.fd < 0))
            q++;
        if (q == c->nlinks) {
            PS_LOG(PS_LOG_WARN, "table '%s': a push to %s lost its reply, and that part left the part map: its %zu "
                   "keys go to their new parts, which may apply a push it applied before handing them over",
                   t->def.name, u->addr, u->n);
            continue;
        }
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_TPUSH);
        snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
        tab_push_part(c, &c->links[q], g, g->tfrom[p] + done[p], u->n, dim, u->pid, &m);
        if (c->links[q].tseg_ok)
            tab_to_seg(&c->links[q], &m);
        int rc = ps_conn_call(&c->links[q].cl, &m, &r, c->timeout_ms);
        int32_t code = c->links[q].cl.remote_code;
        if (rc == 0) {
            done[p] += u->n; /* applied once, there */
        } else if (rc == PS_EREMOTE && (code == -PS_EMOVED || code == -PS_ENOT_READY)) {
            psc__pmap_note(c, &r); /* not applied: grouped with the others */
        } else {
            return psc__lfail(c, q, rc);
        }
    }
    return 0;
}

/* Before a round of tab_exchange: the tables declared again and the
 * call's keys grouped anew when a part map was adopted since (the keys
 * answered stay answered, and a push whose reply was lost is settled
 * first; a push's ids begin anew, its messages being new ones). 0 or a
 * code. */
static int tab_follow_map(psc_client *c, const struct psc_tab *t, int op, size_t *done, size_t *pdone)
{
    if (c->tabs_stale) {
        int rc = tab_redeclare(c);
        if (rc != 0)
            return rc;
    }
    if (c->tks[0].epoch == c->epoch)
        return 0;
    uint32_t dim = t->def.dim;
    int rc = op != TAB_PULL ? tab_settle(c, t, done) : 0;
    if (rc == 0)
        rc = psc__pmap_regroup(c, &c->tks[0], dim, done, op != TAB_PULL);
    if (rc == 0 && op == TAB_PUSHPULL)
        rc = psc__pmap_regroup(c, &c->tks[1], dim, pdone, 0);
    if (rc == 0 && op != TAB_PULL)
        psc__pids_begin(c, c->tks[0].tfrom[c->nlinks] / tab_chunk(dim) + 1);
    return rc;
}

/* Pulls the rows of the grouped keys c->tks[0].tg into its tgrows (op
 * TAB_PULL), pushes the rows there (TAB_PUSH), or pushes them and pulls
 * the rows of c->tks[1].tg into its tgrows (TAB_PUSHPULL): each part's
 * keys to its psd, in messages of at most tab_chunk keys. A push-and-pull
 * sends a part's last pushed keys with its first pulled ones in one
 * TPUSHPULL (PROTOCOL.md 13.2), so it is one round trip when each side
 * fits one message; a part's pulls never go before all its pushes. Every
 * part is in flight at once: a round sends one message to each part with
 * keys left, then reads their replies in the same order (all of them, even
 * after one failed, so every connection stays in step). done[p] and
 * pdone[p] count part p's pushed (or, TAB_PULL, pulled) and pulled keys
 * answered; a call again after a failure (a retry) goes on from there, so
 * a part that took a push does not take it twice. A message psd answered
 * MOVED or NOT_READY changed nothing there (PROTOCOL.md 18): after MOVED
 * the part map it carries is adopted and the keys not yet answered go
 * again grouped under it; after NOT_READY (or a MOVED naming no newer map)
 * the same messages go again after a wait, 1 ms doubling to 50 ms, for up
 * to the call's timeout, after which the call fails with psd's last
 * refusal (*given_up set: no reconnect can cure it). 0 or a code. */
static int tab_exchange(psc_client *c, const struct psc_tab *t, int op, size_t *done, size_t *pdone, int *given_up)
{
    uint32_t dim = t->def.dim;
    struct psc_tkeys *g = &c->tks[0], *pg = op == TAB_PUSHPULL ? &c->tks[1] : &c->tks[0];
    size_t *pd = op == TAB_PUSHPULL ? pdone : done;
    size_t chunk = tab_chunk(dim), cnt[PS_PARTS_MAX], pcnt[PS_PARTS_MAX];
    uint64_t ids[PS_PARTS_MAX], pids[PS_PARTS_MAX];
    int64_t deadline = 0; /* of the waits for psd to be ready; 0: none yet */
    int64_t wait_ms = 1;
    for (;;) {
        int rc = 0, any = 0, again = 0;
        uint32_t again_p = 0;
        if (c->tabs_stale || g->epoch != c->epoch) { /* an integer compare unless a part map came */
            if ((rc = tab_follow_map(c, t, op, done, pdone)) != 0)
                return rc;
        }
        uint32_t n = c->nlinks;
        memset(cnt, 0, sizeof cnt);
        memset(pcnt, 0, sizeof pcnt);
        for (uint32_t p = 0; p < n && rc == 0; p++) {
            size_t from = g->tfrom[p] + done[p], left = op == TAB_PULL ? 0 : g->tfrom[p + 1] - from;
            size_t pfrom = pg->tfrom[p] + pd[p], pleft = op == TAB_PUSH ? 0 : pg->tfrom[p + 1] - pfrom;
            size_t k = left < chunk ? left : chunk, pk = pleft < chunk ? pleft : chunk;
            if (left > chunk)
                pk = 0; /* the part's pulls wait for its last push */
            if (k == 0 && pk == 0)
                continue;
            ps_msg m;
            ps_msg_init(&m, k && pk ? PS_MSG_TPUSHPULL : k ? PS_MSG_TPUSH : PS_MSG_TPULL);
            m.has = PS_F_TAB | PS_F_KEYS;
            snprintf(m.tab, sizeof m.tab, "%s", t->def.name);
            if (k) {
                pids[p] = psc__pid(&c->links[p], done[p] / chunk);
                tab_push_part(c, &c->links[p], g, from, k, dim, pids[p], &m);
                if (pk) {
                    m.has |= PS_F_PKEYS;
                    m.pkeys = (ps_keys){(const uint8_t *)(pg->sk + pfrom), (uint32_t)pk};
                }
            } else {
                m.keys = (ps_keys){(const uint8_t *)(pg->sk + pfrom), (uint32_t)pk};
            }
            if (c->links[p].tseg_ok)
                tab_to_seg(&c->links[p], &m);
            int r = ps_conn_send(&c->links[p].cl, &m);
            if (r != 0) {
                rc = psc__lfail(c, p, r);
                break;
            }
            ids[p] = m.id;
            cnt[p] = k;
            pcnt[p] = pk;
            any = 1;
        }
        for (uint32_t p = 0; p < n; p++) {
            if (cnt[p] == 0 && pcnt[p] == 0)
                continue;
            ps_msg r;
            size_t pfrom = pg->tfrom[p] + pd[p];
            int r2 = ps_conn_recv(&c->links[p].cl, &r, c->timeout_ms);
            int32_t code = c->links[p].cl.remote_code;
            if (r2 == PS_EREMOTE && (code == -PS_EMOVED || code == -PS_ENOT_READY)) {
                /* nothing changed there: the message goes again */
                psc__pmap_note(c, &r);
                again = 1;
                again_p = p;
                continue;
            }
            if (r2 == 0 && (r.has & PS_F_ID) && r.id != ids[p])
                r2 = psc__fail(c, PSC_EMALFORMED, "table '%s': psd at %s answered request %llu, expected %llu",
                               t->def.name, c->links[p].server, (unsigned long long)r.id,
                               (unsigned long long)ids[p]);
            else if (r2 == 0 && pcnt[p] &&
                     (r.type != PS_MSG_ROWS || (r.inshm ? r.len : r.ndata) != pcnt[p] * dim ||
                      (r.inshm && !c->links[p].tseg_ok)))
                r2 = psc__fail(c, PSC_EMALFORMED,
                               "table '%s': psd at %s answered a pull of %zu rows with %s of %llu values%s",
                               t->def.name, c->links[p].server, pcnt[p], ps_msg_type_name(r.type),
                               (unsigned long long)(r.inshm ? r.len : r.ndata), r.inshm ? " in the table segment" : "");
            else if (r2 != 0 && r2 != PS_EREMOTE && cnt[p]) {
                /* a push whose reply was lost: applied or not (tab_settle) */
                struct psc_unsure *u = &c->unsure[p];
                *u = (struct psc_unsure){.on = 1, .n = cnt[p], .pid = pids[p]};
                snprintf(u->addr, sizeof u->addr, "%s", c->links[p].server);
                r2 = psc__lfail(c, p, r2);
            } else if (r2 != 0)
                r2 = psc__lfail(c, p, r2);
            if (r2 != 0) {
                if (rc == 0)
                    rc = r2;
                continue;
            }
            if (pcnt[p])
                memcpy(pg->rr + pfrom * dim, r.inshm ? (const void *)(c->links[p].tseg + PSC_TSEG_ROWS) : r.data,
                       pcnt[p] * dim * sizeof(float));
            done[p] += cnt[p];
            pd[p] += pcnt[p];
            c->unsure[p].on = 0;
        }
        if (rc != 0 || !any)
            return rc;
        if (!again)
            continue;
        if (c->pm.epoch > c->epoch) { /* MOVED with a newer map: regrouped at the next round */
            if ((rc = tab_adopt(c)) != 0)
                return rc;
            deadline = 0;
            wait_ms = 1;
            continue;
        }
        int64_t now = psc__mono_ms();
        if (!deadline)
            deadline = now + c->timeout_ms;
        if (now >= deadline) {
            *given_up = 1;
            return psc__lfail(c, again_p, PS_EREMOTE);
        }
        if ((rc = tab_sleep(c, wait_ms < deadline - now ? wait_ms : deadline - now)) != 0)
            return rc;
        wait_ms = wait_ms * 2 > TAB_WAIT_MAX_MS ? TAB_WAIT_MAX_MS : wait_ms * 2;
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
        int r2 = psc__reconnect(c, rc);
        if (r2 == 0 && c->has_base && c->base > c->links[0].version)
            c->base = c->links[0].version; /* never ahead of the psd now reached (a replica behind) */
        return r2 ? r2 : tab_redeclare(c);
    }
    if (rc == PS_EREMOTE && c->links[c->err_link].cl.remote_code == -PS_ERANGE &&
        strstr(ps_conn_error(&c->links[c->err_link].cl), "unknown table"))
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

/* Makes the n keys distinct and groups them by part in c->tks[g], with
 * room there for their rows. Keys that are distinct already and go to one
 * psd are sent as they are (ident): no copy of them, nor of their rows. */
static int tab_prepare(psc_client *c, int g, const struct psc_tab *t, const uint64_t *keys, size_t n)
{
    struct psc_tkeys *k = &c->tks[g];
    size_t nu = 0;
    int rc = tab_distinct(c, k, keys, n, &nu);
    if (rc != 0)
        return rc;
    k->ident = nu == n && c->nlinks == 1;
    if (k->ident) {
        k->tfrom[0] = 0;
        k->tfrom[1] = n;
        k->nparts = 1;
        k->epoch = c->epoch;
        k->sk = keys;
        return 0;
    }
    if ((rc = tab_group(c, k, nu, t->def.dim)) != 0)
        return rc;
    k->sk = k->tg;
    k->sr = k->rr = k->tgrows;
    return 0;
}

/* PSC_ENONFINITE naming the first of the n keys whose row of rows is not
 * finite. */
static int tab_nonfinite(psc_client *c, const struct psc_tab *t, const uint64_t *keys, size_t n, const float *rows)
{
    uint32_t dim = t->def.dim;
    size_t i = 0;
    while (i + 1 < n && ps_vec_all_finite(rows + i * dim, dim))
        i++;
    return psc__fail(c, PSC_ENONFINITE, "psc_table_push: table '%s': the gradient of key %llu is not finite",
                     t->def.name, (unsigned long long)keys[i]);
}

/* The pushed gradients grads of the n keys of c->tks[0] (prepared) summed
 * per key, in the order they come, at its place in its part (ident: the
 * gradients as they are); 0 or PSC_ENONFINITE. */
static int tab_sum(psc_client *c, const struct psc_tab *t, size_t n, const float *grads)
{
    struct psc_tkeys *g = &c->tks[0];
    uint32_t dim = t->def.dim;
    if (g->ident) {
        if (!ps_vec_all_finite(grads, n * dim))
            return tab_nonfinite(c, t, g->sk, n, grads);
        g->sr = grads;
        return 0;
    }
    size_t nu = g->tfrom[c->nlinks];
    memset(g->tgrows, 0, nu * dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        float *dst = g->tgrows + (size_t)g->tpos[g->tidx[i]] * dim;
        for (uint32_t j = 0; j < dim; j++)
            dst[j] += grads[i * dim + j];
    }
    if (!ps_vec_all_finite(g->tgrows, nu * dim))
        return tab_nonfinite(c, t, g->tg, nu, g->tgrows);
    return 0;
}

/* Where the rows pulled for c->tks[g] go: straight into the caller's rows
 * (ident), or into its scratch for tab_unpack. */
static void tab_pull_into(psc_client *c, int g, float *rows)
{
    if (c->tks[g].ident)
        c->tks[g].rr = rows;
}

/* The pulled rows of the n keys of c->tks[g] into rows, in the call's
 * order (ident: there already). */
static void tab_unpack(const psc_client *c, int g, const struct psc_tab *t, size_t n, float *rows)
{
    const struct psc_tkeys *k = &c->tks[g];
    if (k->ident)
        return;
    uint32_t dim = t->def.dim;
    for (size_t i = 0; i < n; i++)
        memcpy(rows + i * dim, k->tgrows + (size_t)k->tpos[k->tidx[i]] * dim, dim * sizeof(float));
}

/* Runs tab_exchange, and once more after a failure tab_retry recovers. */
static int tab_run(psc_client *c, const struct psc_tab *t, int op)
{
    psc__waiting_clear(c);
    size_t done[PS_PARTS_MAX] = {0}, pdone[PS_PARTS_MAX] = {0};
    int given_up = 0;
    for (uint32_t p = 0; p < PS_PARTS_MAX; p++)
        c->unsure[p].on = 0;
    if (op != TAB_PULL) /* a push message per tab_chunk keys of a part */
        psc__pids_begin(c, c->tks[0].tfrom[c->nlinks] / tab_chunk(t->def.dim) + 1);
    int rc = tab_exchange(c, t, op, done, pdone, &given_up);
    if (rc != 0 && !given_up && (rc = tab_retry(c, rc)) == 0)
        rc = tab_exchange(c, t, op, done, pdone, &given_up); /* the parts that did not answer, their messages
                                                                again with their push ids: psd applies each
                                                                once (PROTOCOL.md 15) */
    return rc ? psc__public_code(c, rc) : 0;
}

int psc_table_pull(psc_client *c, const char *name, const uint64_t *keys, size_t n, float *rows)
{
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_pull", name, keys, n, rows, &t);
    if (rc != 0 || n == 0)
        return rc;
    if ((rc = tab_prepare(c, 0, t, keys, n)) != 0)
        return rc;
    tab_pull_into(c, 0, rows);
    if ((rc = tab_run(c, t, TAB_PULL)) != 0)
        return rc;
    tab_unpack(c, 0, t, n, rows);
    return 0;
}

int psc_table_push(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads)
{
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_push", name, keys, n, grads, &t);
    if (rc != 0 || n == 0)
        return rc;
    if ((rc = tab_prepare(c, 0, t, keys, n)) != 0 || (rc = tab_sum(c, t, n, grads)) != 0)
        return rc;
    return tab_run(c, t, TAB_PUSH);
}

int psc_table_pushpull(psc_client *c, const char *name, const uint64_t *keys, size_t n, const float *grads,
                       const uint64_t *next, size_t m, float *rows)
{
    if (n == 0)
        return psc_table_pull(c, name, next, m, rows);
    if (m == 0)
        return psc_table_push(c, name, keys, n, grads);
    const struct psc_tab *t;
    int rc = tab_ready(c, "psc_table_push", name, keys, n, grads, &t);
    if (rc == 0)
        rc = tab_ready(c, "psc_table_pull", name, next, m, rows, &t);
    if (rc != 0)
        return rc;
    if ((rc = tab_prepare(c, 0, t, keys, n)) != 0 || (rc = tab_sum(c, t, n, grads)) != 0 ||
        (rc = tab_prepare(c, 1, t, next, m)) != 0)
        return rc;
    tab_pull_into(c, 1, rows);
    if ((rc = tab_run(c, t, TAB_PUSHPULL)) != 0)
        return rc;
    tab_unpack(c, 1, t, m, rows);
    return 0;
}
