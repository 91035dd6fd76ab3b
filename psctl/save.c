/* save.c - psctl save (psctl.h): the model, pinned at one version, and
 * its embedding tables pulled from psd (or from each psd of a split model)
 * and written as a safetensors file through common/safetensors.c, the
 * format psd's init_from reads. Owns the file while it writes it
 * (PATH.tmp, renamed once whole). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "common/safetensors.h"
#include "proto/errors.h"
#include "psctl/psctl.h"

#define SAVE_CHUNK (1u << 20) /* floats per pull, as psworker pulls */

/* Appends the text s to b as a JSON string (UTF-8 kept). */
static int json_str_buf(ps_buf *b, const char *s)
{
    return ps_json_str(b, s, strlen(s), PS_JSON_UTF8);
}

/* Checks that a safetensors file can hold layout l; the reason on stderr. */
static int save_names_ok(const ps_layout *l)
{
    char err[PS_NAME_MAX + 128];
    if (ps_st_names_ok(l, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: %s\n", err);
        return -1;
    }
    return 0;
}

/* Pulls rows [0, rows) of table t from one psd by position (PROTOCOL.md
 * 13.2), writing the rows to f and their keys to keys (rows x 8 bytes).
 * An exit code; the reason is on stderr. */
static int save_rows(session *ss, const ps_st_table *t, uint64_t rows, uint8_t *keys, FILE *f)
{
    uint64_t page = PS_TABLE_VALUES_MAX / t->dim < PS_TABLE_KEYS_MAX ? PS_TABLE_VALUES_MAX / t->dim
                                                                      : PS_TABLE_KEYS_MAX;
    for (uint64_t off = 0; off < rows; off += page) {
        uint64_t len = rows - off < page ? rows - off : page;
        ps_msg m, r;
        ps_msg_init(&m, PS_MSG_TPULL);
        m.has = PS_F_TAB | PS_F_OFF | PS_F_LEN;
        snprintf(m.tab, sizeof m.tab, "%s", t->name);
        m.off = off;
        m.len = len;
        int rc = ps_conn_call(&ss->c, &m, &r, ss->timeout);
        if (rc != 0)
            return psctl_report(&ss->c, rc, ss->timeout);
        if (r.type != PS_MSG_ROWS || !(r.has & PS_F_KEYS) || r.keys.n != len || r.ndata != len * t->dim) {
            fprintf(stderr, "psctl: psd answered the pull of rows [%" PRIu64 ", %" PRIu64 ") of table '%s' with %s\n",
                    off, off + len, t->name, ps_msg_type_name(r.type));
            return EXIT_REMOTE;
        }
        memcpy(keys + off * 8, r.keys.p, len * 8);
        if (fwrite(r.data, sizeof(float), len * t->dim, f) != len * t->dim)
            return EXIT_LOCAL;
    }
    return EXIT_OK;
}

/* Writes the rows of each table, then its keys, to f: from each of the n
 * psd in turn, prows[i][j] rows of table i from psd j (n == 1 and prows
 * NULL: tabs[i].rows from the one psd), so a split table's parts come out
 * as one tensor of rows and one of keys. An exit code; the reason is on
 * stderr. */
static int save_tables(session *ss, uint32_t n, const ps_st_table *tabs, uint64_t (*prows)[PS_PARTS_MAX],
                       uint32_t ntabs, FILE *f)
{
    for (uint32_t i = 0; i < ntabs; i++) {
        const ps_st_table *t = &tabs[i];
        uint8_t *keys = malloc(t->rows ? t->rows * 8 : 1);
        if (!keys) {
            fprintf(stderr, "psctl: out of memory for the keys of table '%s'\n", t->name);
            return EXIT_LOCAL;
        }
        int status = EXIT_OK;
        uint64_t at = 0;
        for (uint32_t j = 0; j < n && status == EXIT_OK; j++) {
            uint64_t rows = prows ? prows[i][j] : t->rows;
            status = save_rows(&ss[j], t, rows, keys + at * 8, f);
            at += rows;
        }
        size_t nk = (size_t)t->rows * 8;
        if (status == EXIT_OK && fwrite(keys, 1, nk, f) != nk)
            status = EXIT_LOCAL;
        free(keys);
        if (status != EXIT_OK)
            return status;
    }
    return EXIT_OK;
}

/* The tables psd holds (STATUS "tables"), copied into *out (*n of them),
 * each with its declaration as JSON. An exit code. */
static int save_tables_list(session *ss, ps_st_table **out, uint32_t *n)
{
    ps_msg m, r;
    *out = NULL;
    *n = 0;
    ps_msg_init(&m, PS_MSG_STATUS);
    int rc = ps_conn_call(&ss->c, &m, &r, ss->timeout);
    if (rc != 0)
        return psctl_report(&ss->c, rc, ss->timeout);
    const msgpack_object *tl = r.type == PS_MSG_STATUS_REPLY ? ps_map_get(r.body, "tables") : NULL;
    if (!tl || tl->type != MSGPACK_OBJECT_ARRAY || tl->via.array.size == 0)
        return EXIT_OK; /* no tables, or a psd from before them */
    ps_st_table *t = calloc(tl->via.array.size, sizeof *t);
    if (!t) {
        fprintf(stderr, "psctl: out of memory\n");
        return EXIT_LOCAL;
    }
    int bad = 0;
    for (uint32_t i = 0; i < tl->via.array.size && !bad; i++) {
        const msgpack_object *e = &tl->via.array.ptr[i], *hp = ps_map_get(e, "hp");
        char rinit[32], opt[32];
        double dim = psctl_num(e, "dim"), rows = psctl_num(e, "rows"), seed = psctl_num(e, "seed"), scale = psctl_num(e, "scale");
        const msgpack_object *seedo = ps_map_get(e, "seed");
        psctl_str(e, "name", t[i].name, sizeof t[i].name);
        psctl_str(e, "rinit", rinit, sizeof rinit);
        psctl_str(e, "opt", opt, sizeof opt);
        if (!(dim >= 1 && dim <= PS_TABLE_DIM_MAX) || !(rows >= 0) || isnan(seed) || !seedo ||
            seedo->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !hp || hp->type != MSGPACK_OBJECT_MAP) {
            fprintf(stderr, "psctl: psd's status describes table %u in a way this psctl does not know\n", i);
            bad = 1;
            break;
        }
        t[i].dim = (uint32_t)dim;
        t[i].rows = (uint64_t)rows;
        ps_buf *b = &t[i].decl;
        bad |= ps_buf_printf(b, "{\"name\":");
        bad |= json_str_buf(b, t[i].name);
        bad |= ps_buf_printf(b, ",\"dim\":%u,\"rinit\":", t[i].dim);
        bad |= json_str_buf(b, rinit);
        bad |= ps_buf_printf(b, ",\"scale\":%.17g,\"seed\":%" PRIu64 ",\"opt\":", scale, seedo->via.u64);
        bad |= json_str_buf(b, opt);
        bad |= ps_buf_printf(b, ",\"hp\":{");
        for (uint32_t k = 0; k < hp->via.map.size; k++) {
            const msgpack_object_kv *kv = &hp->via.map.ptr[k];
            char hn[32];
            double v = kv->val.type == MSGPACK_OBJECT_FLOAT64 || kv->val.type == MSGPACK_OBJECT_FLOAT32 ? kv->val.via.f64
                                                                                                       : NAN;
            if (kv->key.type != MSGPACK_OBJECT_STR || !isfinite(v)) {
                bad = 1;
                break;
            }
            snprintf(hn, sizeof hn, "%.*s", (int)kv->key.via.str.size, kv->key.via.str.ptr);
            bad |= ps_buf_printf(b, k ? "," : "");
            bad |= json_str_buf(b, hn);
            bad |= ps_buf_printf(b, ":%.17g", v);
        }
        bad |= ps_buf_printf(b, "}}");
        *n = i + 1;
    }
    *out = t;
    if (bad) {
        fprintf(stderr, "psctl: cannot describe psd's tables\n");
        return EXIT_REMOTE;
    }
    return EXIT_OK;
}

static void save_tables_free(ps_st_table *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ps_buf_free(&t[i].decl);
    free(t);
}

/* The tables of the n psd of a split model (list names them), merged by
 * name into *out (*nt of them, in the order the psd list them; each with
 * the rows of all parts and its declaration without the part, which every
 * psd must give alike) and the rows of table i on psd j in prows[i][j]. An
 * exit code; the reason on stderr. */
static int save_tables_merge(session *ss, char (*list)[300], uint32_t n, ps_st_table **out, uint32_t *nt,
                             uint64_t (*prows)[PS_PARTS_MAX])
{
    ps_st_table *m = calloc(PS_TABLES_MAX, sizeof *m);
    *out = m;
    *nt = 0;
    if (!m) {
        fprintf(stderr, "psctl: out of memory\n");
        return EXIT_LOCAL;
    }
    memset(prows, 0, sizeof(uint64_t) * PS_PARTS_MAX * PS_TABLES_MAX);
    int status = EXIT_OK;
    for (uint32_t j = 0; j < n && status == EXIT_OK; j++) {
        ps_st_table *pt;
        uint32_t npt;
        status = save_tables_list(&ss[j], &pt, &npt);
        for (uint32_t e = 0; e < npt && status == EXIT_OK; e++) {
            uint32_t k = 0;
            while (k < *nt && strcmp(m[k].name, pt[e].name) != 0)
                k++;
            if (k == *nt) { /* first seen: the entry moves over, declaration and all */
                if (*nt == PS_TABLES_MAX) {
                    fprintf(stderr, "psctl: the psd hold more than %d tables between them\n", PS_TABLES_MAX);
                    status = EXIT_REMOTE;
                    break;
                }
                m[k] = pt[e];
                m[k].rows = 0;
                memset(&pt[e].decl, 0, sizeof pt[e].decl);
                (*nt)++;
            } else if (m[k].decl.len != pt[e].decl.len || memcmp(m[k].decl.p, pt[e].decl.p, m[k].decl.len) != 0) {
                fprintf(stderr, "psctl: psd at %s declares table '%s' as %.*s, an earlier psd as %.*s: not parts of "
                                "one job\n", list[j], m[k].name, (int)pt[e].decl.len, (const char *)pt[e].decl.p,
                        (int)m[k].decl.len, (const char *)m[k].decl.p);
                status = EXIT_REMOTE;
                break;
            }
            prows[k][j] = pt[e].rows;
            m[k].rows += pt[e].rows;
        }
        save_tables_free(pt, npt);
    }
    return status;
}

/* Writes head and then the values of every session's model, in order (the
 * parts of a split model, or the one model), pulled from their pinned
 * snapshots at versions[i], to path (through path.tmp, renamed once whole).
 * Returns an exit code; the reason is on stderr. */
static int save_write(session *ss, uint32_t n, const uint64_t *versions, const ps_buf *head, const char *path,
                      const ps_layout *whole, const ps_st_table *tabs, uint64_t (*prows)[PS_PARTS_MAX],
                      uint32_t ntabs)
{
    uint64_t pos = 0; /* in the whole model */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fprintf(stderr, "psctl: path too long: %s\n", path);
        return EXIT_USAGE;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "psctl: cannot create %s: %s\n", tmp, strerror(errno));
        return EXIT_LOCAL;
    }
    int status = EXIT_OK;
    if (fwrite(head->p, 1, head->len, f) != head->len)
        status = EXIT_LOCAL;
    for (uint32_t i = 0; i < n && status == EXIT_OK; i++) {
        const ps_layout *l = &ss[i].layout;
        for (uint64_t off = 0; status == EXIT_OK && off < l->total; off += SAVE_CHUNK) {
            uint64_t len = l->total - off < SAVE_CHUNK ? l->total - off : SAVE_CHUNK;
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_PULL);
            m.has = PS_F_OFF | PS_F_LEN;
            m.off = off;
            m.len = len;
            int rc = ps_conn_call(&ss[i].c, &m, &r, ss[i].timeout);
            if (rc != 0) {
                status = psctl_report(&ss[i].c, rc, ss[i].timeout);
                break;
            }
            if (r.type != PS_MSG_PARAMS || r.off != off || r.ndata != len || r.mver != versions[i]) {
                fprintf(stderr,
                        "psctl: psd answered the pull of [%" PRIu64 ", %" PRIu64 ") with %s of %" PRIu64
                        " values at version %" PRIu64 " (expected version %" PRIu64 ")\n",
                        off, off + len, ps_msg_type_name(r.type), r.ndata, r.mver, versions[i]);
                status = EXIT_REMOTE;
                break;
            }
            if (ps_st_write_values(f, whole, pos, r.data, len) != 0)
                status = EXIT_LOCAL;
            pos += len;
        }
    }
    if (status == EXIT_OK && ntabs)
        status = save_tables(ss, n, tabs, prows, ntabs, f);
    if (status == EXIT_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        status = EXIT_LOCAL;
    if (fclose(f) != 0 && status == EXIT_OK)
        status = EXIT_LOCAL;
    if (status == EXIT_OK && rename(tmp, path) != 0)
        status = EXIT_LOCAL;
    if (status == EXIT_LOCAL)
        fprintf(stderr, "psctl: cannot write %s: %s\n", path, strerror(errno));
    if (status != EXIT_OK)
        unlink(tmp);
    return status;
}

static void save_done(const char *path, uint64_t version, const ps_layout *l, uint32_t n, const ps_st_table *tabs,
                      uint32_t ntabs, int as_json)
{
    uint64_t rows = 0;
    for (uint32_t i = 0; i < ntabs; i++)
        rows += tabs[i].rows;
    if (as_json) {
        printf("{\"path\": ");
        psctl_json_string(stdout, path, strlen(path));
        printf(", \"version\": %" PRIu64 ", \"parameters\": %" PRIu64 ", \"tensors\": %u, \"format\": "
               "\"safetensors\", \"servers\": %u, \"tables\": %u, \"rows\": %" PRIu64 "}\n",
               version, l->total, l->ntensors, n, ntabs, rows);
    } else {
        printf("saved model version %" PRIu64 " (%u tensors, %" PRIu64 " parameters%s", version, l->ntensors,
               l->total, n > 1 ? ", from its parts" : "");
        if (ntabs)
            printf("; %u tables, %" PRIu64 " rows", ntabs, rows);
        printf(") to %s\n", path);
    }
}

int psctl_save(session *ss, const char *server, const char *path, int as_json)
{
    ps_msg r;
    ps_buf head = {0};
    if (!ss->has_layout) {
        fprintf(stderr, "psctl: psd has no model yet: no worker has connected\n");
        return EXIT_REMOTE;
    }
    const ps_layout *l = &ss->layout;
    if (save_names_ok(l) != 0)
        return EXIT_REMOTE;
    /* the tables and their rows now; a table's rows [0, rows) are saved,
     * each as it is when its page is pulled (pause the job for one state) */
    ps_st_table *tabs;
    uint32_t ntabs;
    int status = save_tables_list(ss, &tabs, &ntabs);
    if (status != EXIT_OK) {
        save_tables_free(tabs, ntabs);
        return status;
    }
    /* pin one version: every chunk comes from the same snapshot */
    int rc = psctl_admin(ss, "pin", NULL, 0, &r);
    if (rc != 0) {
        save_tables_free(tabs, ntabs);
        return psctl_report(&ss->c, rc, ss->timeout);
    }
    uint64_t version = r.mver;
    ps_st_meta meta = {.version = version, .mode = ss->mode, .fp = ss->fp, .server = server};
    if (ps_st_header(l, &meta, tabs, ntabs, &head) != 0) {
        fprintf(stderr, "psctl: out of memory\n");
        save_tables_free(tabs, ntabs);
        return EXIT_LOCAL;
    }
    status = save_write(ss, 1, &version, &head, path, l, tabs, NULL, ntabs);
    ps_buf_free(&head);
    if (status == EXIT_OK) {
        psctl_admin(ss, "unpin", NULL, 0, &r);
        save_done(path, version, l, 1, tabs, ntabs, as_json);
    }
    save_tables_free(tabs, ntabs);
    return status;
}

/* save from a model split over n psd (proto/PROTOCOL.md 6.2): their part
 * layouts joined into the model's (cut tensors whole again), each psd's
 * snapshot pinned, and the parts' values written one after the other,
 * which is the model's flat vector, then each table's rows from every psd
 * (its parts) as one table. Each psd pins its own version: for one
 * version of the whole model, pause the job first (psctl pause). */
int psctl_save_parts(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout,
                          const char *path, int as_json)
{
    static ps_layout whole;
    static uint64_t prows[PS_TABLES_MAX][PS_PARTS_MAX]; /* rows of table i on psd j */
    ps_st_table *tabs = NULL;
    uint32_t ntabs = 0;
    const ps_layout *parts[PS_PARTS_MAX];
    uint64_t versions[PS_PARTS_MAX];
    char err[512], pv[PS_PARTS_MAX * 21 + 1] = "";
    ps_msg r;
    int status = EXIT_OK;
    uint32_t opened = 0;
    for (; opened < n && status == EXIT_OK; opened++) {
        session *s = &ss[opened];
        ps_conn_init(&s->c);
        s->timeout = timeout;
        s->token = *token;
        int rc = psctl_open(s, list[opened]);
        if (rc != 0) {
            status = psctl_report(&s->c, rc, timeout);
        } else if (!s->has_layout) {
            fprintf(stderr, "psctl: psd at %s has no model yet: no worker has connected\n", list[opened]);
            status = EXIT_REMOTE;
        } else if (opened > 0 && strcmp(s->mode, ss[0].mode) != 0) {
            fprintf(stderr, "psctl: psd at %s runs %s, psd at %s %s: not parts of one job\n", list[0], ss[0].mode,
                    list[opened], s->mode);
            status = EXIT_REMOTE;
        }
        parts[opened] = &s->layout;
    }
    if (status == EXIT_OK && ps_layout_join(parts, n, &whole, err, sizeof err) != 0) {
        fprintf(stderr, "psctl: these psd do not hold the parts of one model in this order (%s); list them as the "
                        "workers' --server does\n", err);
        status = EXIT_REMOTE;
    }
    if (status == EXIT_OK && save_names_ok(&whole) != 0)
        status = EXIT_REMOTE;
    /* the tables: each table's rows on every psd, written as one table
     * (rows and keys), part 0's rows first (each key is on one part) */
    if (status == EXIT_OK)
        status = save_tables_merge(ss, list, n, &tabs, &ntabs, prows);
    uint32_t pinned = 0;
    for (; pinned < n && status == EXIT_OK; pinned++) {
        int rc = psctl_admin(&ss[pinned], "pin", NULL, 0, &r);
        if (rc != 0) {
            status = psctl_report(&ss[pinned].c, rc, timeout);
            break;
        }
        versions[pinned] = r.mver;
        size_t len = strlen(pv);
        snprintf(pv + len, sizeof pv - len, "%s%" PRIu64, pinned ? "," : "", r.mver);
    }
    if (status == EXIT_OK) {
        ps_buf head = {0};
        char servers[PS_PARTS_MAX * 301];
        size_t len = 0;
        for (uint32_t i = 0; i < n; i++)
            len += (size_t)snprintf(servers + len, sizeof servers - len, "%s%s", i ? "," : "", list[i]);
        ps_st_meta meta = {.version = versions[0], .mode = ss[0].mode, .fp = ps_layout_fingerprint(&whole),
                           .server = servers, .part_versions = pv};
        if (ps_st_header(&whole, &meta, tabs, ntabs, &head) != 0) {
            fprintf(stderr, "psctl: out of memory\n");
            status = EXIT_LOCAL;
        } else {
            status = save_write(ss, n, versions, &head, path, &whole, tabs, prows, ntabs);
        }
        ps_buf_free(&head);
    }
    for (uint32_t i = 0; i < opened; i++) {
        if (i < pinned && status == EXIT_OK)
            psctl_admin(&ss[i], "unpin", NULL, 0, &r);
        ps_msg m;
        ps_msg_init(&m, PS_MSG_BYE);
        ps_conn_send(&ss[i].c, &m);
        ps_conn_free(&ss[i].c);
        ps_token_clear(&ss[i].token);
    }
    if (status == EXIT_OK)
        save_done(path, versions[0], &whole, n, tabs, ntabs, as_json);
    if (tabs)
        save_tables_free(tabs, ntabs);
    return status;
}
