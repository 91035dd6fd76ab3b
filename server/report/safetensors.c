/* safetensors.c - a model from a safetensors file (safetensors.h). The
 * header's JSON is first scanned from the file in small pieces, counting
 * its entries, values and longest token, and refused beyond what a psd
 * model needs; only then does jansson parse it, read from the file as it
 * goes. So a header of millions of values is refused with memory that
 * does not grow with it (jansson's tree of one costs about 14 times its
 * text), and an accepted one costs about its size. The values are read
 * straight into the model's blocks, so the file is never held in memory
 * whole. */
#include "server/report/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "proto/vec.h"
#include "proto/errors.h"

/* What a header psd takes may hold: JSON values and keys (a tensor's entry
 * is 9 of them and its dimensions; the rest is room for __metadata__) and
 * the length of one string or number (a name is at most PS_NAME_MAX;
 * metadata strings may be longer). Each value costs jansson about 100
 * bytes, a token about twice its length while it is read. */
#define HEADER_TOKENS_MAX (1u << 16)
#define HEADER_TOKEN_LEN_MAX (4u << 20)
#define READ_CHUNK (64u << 10)

/* A tensor as the header describes it. */
typedef struct st_tensor {
    const char *name;      /* points into the parsed header */
    uint32_t ndim;
    uint32_t dims[PS_DIMS_MAX];
    uint64_t begin, end;   /* byte range within the data */
    int sdt;               /* PS_SAVE_*: F32, or a buffer's F64, I64, I32 */
    int rule;              /* PS_BUF_*: a buffer (__metadata__ "buffer:NAME") */
} st_tensor;

static int by_begin(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Reads n bytes at off; 0, or -1 (errno set; 0 for a short read). */
static int read_at(int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* A non-negative integer that fits; 0 or -1. */
static int json_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* One tensor's entry of the header into t; 0, or -1 with err filled. */
static int parse_tensor(const char *path, const char *name, const json_t *v, st_tensor *t, char *err, size_t errlen)
{
    const json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offs = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2) {
        snprintf(err, errlen, "%s: bad header: tensor '%.80s' lacks a dtype string, a shape array or "
                 "data_offsets [begin, end]", path, name);
        return -1;
    }
    const char *dt = json_string_value(dtype);
    t->sdt = ps_save_dt_parse(dt, strlen(dt));
    if (t->sdt < 0 || (t->sdt != PS_SAVE_F32 && !t->rule)) {
        snprintf(err, errlen, "%s: tensor '%.80s' has dtype %.16s; psd holds float32 only (F32), but for buffers "
                 "(__metadata__ \"buffer:%.80s\": \"mean\" or \"first\", as psctl save writes), which may be F64, "
                 "I64 or I32: convert the file to float32 first", path, name, dt, name);
        return -1;
    }
    size_t esize = t->sdt == PS_SAVE_F64 || t->sdt == PS_SAVE_I64 ? 8 : 4;
    size_t nd = json_array_size(shape);
    if (nd < 1 || nd > PS_DIMS_MAX) {
        snprintf(err, errlen, "%s: tensor '%.80s' has %zu dimensions; psd takes 1 to %d", path, name, nd,
                 PS_DIMS_MAX);
        return -1;
    }
    uint64_t count = 1;
    t->name = name;
    t->ndim = (uint32_t)nd;
    for (size_t d = 0; d < nd; d++) {
        uint64_t x;
        if (json_u64(json_array_get(shape, d), &x) != 0 || x < 1 || x > UINT32_MAX) {
            snprintf(err, errlen, "%s: tensor '%.80s': dimension %zu is not a whole number from 1 to %u", path, name,
                     d, UINT32_MAX);
            return -1;
        }
        t->dims[d] = (uint32_t)x;
        count = count > UINT64_MAX / x ? UINT64_MAX : count * x;
    }
    if (json_u64(json_array_get(offs, 0), &t->begin) != 0 || json_u64(json_array_get(offs, 1), &t->end) != 0 ||
        t->end < t->begin || count > (UINT64_MAX / 8) || t->end - t->begin != count * esize) {
        snprintf(err, errlen, "%s: bad header: tensor '%.80s' has data_offsets that do not hold its %" PRIu64
                 " %s values", path, name, count, dt);
        return -1;
    }
    return 0;
}

/* ---- embedding tables (PROTOCOL.md 13) --------------------------------------- */

/* A table in the file: its declaration (metadata "psd.tables") and its two
 * tensors, "tables/NAME/rows" (F32 [R, dim]) and "tables/NAME/keys" (I64
 * [R], the uint64 keys' bits). */
#define ST_TABLE_ENTRIES 2 /* header entries a table takes: keys and rows */
/* the most top-level entries a header psd takes may hold: the model's
 * tensors, __metadata__, and each table's */
#define ST_ENTRIES_MAX (PS_TENSORS_MAX + 1 + PS_TABLES_MAX * ST_TABLE_ENTRIES)
typedef struct st_table {
    ps_table_def def;
    uint64_t rows;
    uint64_t rbegin, rend, kbegin, kend; /* byte ranges within the data */
    int have_rows, have_keys;
} st_table;

static int by_range(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Reads the metadata's "psd.tables" (a JSON array of declarations, as a
 * string) into t (*nt). 0, or -1 with err. */
static int parse_tables(const char *path, const json_t *meta, st_table *t, size_t *nt, char *err, size_t errlen)
{
    *nt = 0;
    const json_t *v = json_is_object(meta) ? json_object_get(meta, PS_ST_META_TABLES) : NULL;
    if (!v)
        return 0;
    json_error_t jerr;
    json_t *a = json_is_string(v) ? json_loads(json_string_value(v), JSON_REJECT_DUPLICATES, &jerr) : NULL;
    if (!json_is_array(a) || json_array_size(a) > PS_TABLES_MAX) {
        snprintf(err, errlen, "%s: metadata psd.tables is not a JSON array of at most %d table declarations", path,
                 PS_TABLES_MAX);
        json_decref(a);
        return -1;
    }
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *d = json_array_get(a, i), *hp = json_object_get(d, "hp");
        const json_t *name = json_object_get(d, "name"), *rinit = json_object_get(d, "rinit"),
                     *opt = json_object_get(d, "opt"), *scale = json_object_get(d, "scale");
        uint64_t dim, seed;
        ps_hp h = {0};
        char derr[300];
        if (!json_is_object(d) || !json_is_string(name) || !json_is_string(rinit) || !json_is_string(opt) ||
            !json_is_number(scale) || json_u64(json_object_get(d, "dim"), &dim) != 0 ||
            json_u64(json_object_get(d, "seed"), &seed) != 0 || !json_is_object(hp)) {
            snprintf(err, errlen, "%s: metadata psd.tables[%zu] is not a declaration (name, dim, rinit, scale, seed, "
                     "opt, hp)", path, i);
            json_decref(a);
            return -1;
        }
        const char *hk;
        json_t *hv;
        json_object_foreach((json_t *)hp, hk, hv)
        {
            int id = ps_hp_lookup(hk, strlen(hk));
            if (id < 0 || !json_is_number(hv)) {
                snprintf(err, errlen, "%s: metadata psd.tables[%zu]: hp '%.40s' is not a hyper-parameter with a "
                         "number", path, i, hk);
                json_decref(a);
                return -1;
            }
            h.has |= 1u << id;
            h.v[id] = json_number_value(hv);
        }
        int zeros = strcmp(json_string_value(rinit), "zeros") == 0;
        if (ps_table_def_make(&t[i].def, json_string_value(name), dim, json_string_value(rinit), !zeros,
                              json_number_value(scale), seed, json_string_value(opt), &h, derr, sizeof derr) != 0) {
            snprintf(err, errlen, "%s: metadata psd.tables[%zu]: %s", path, i, derr);
            json_decref(a);
            return -1;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(t[k].def.name, t[i].def.name) == 0) {
                snprintf(err, errlen, "%s: metadata psd.tables declares table '%s' twice", path, t[i].def.name);
                json_decref(a);
                return -1;
            }
        *nt = i + 1;
    }
    json_decref(a);
    return 0;
}

/* When `name` is a tensor of a declared table, fills that table's range
 * from v and returns 1; 0 when it is no table's; -1 with err when it is
 * one's but not as psctl save writes it. */
static int table_tensor(const char *path, const char *name, const json_t *v, st_table *t, size_t nt, char *err,
                        size_t errlen)
{
    for (size_t i = 0; i < nt; i++) {
        int which = ps_st_table_tensor(name, t[i].def.name);
        if (which == PS_ST_NOT_TABLE)
            continue;
        int rows = which == PS_ST_ROWS;
        const json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                     *offs = json_object_get(v, "data_offsets");
        uint64_t r, d = 0, b, e;
        if (!json_is_object(v) || !json_is_string(dtype) || strcmp(json_string_value(dtype), rows ? "F32" : "I64") ||
            !json_is_array(shape) || json_array_size(shape) != (rows ? 2u : 1u) ||
            json_u64(json_array_get(shape, 0), &r) || (rows && json_u64(json_array_get(shape, 1), &d)) ||
            (rows && d != t[i].def.dim) || !json_is_array(offs) || json_array_size(offs) != 2 ||
            json_u64(json_array_get(offs, 0), &b) || json_u64(json_array_get(offs, 1), &e) || e < b ||
            r > (UINT64_MAX / 8) / PS_TABLE_DIM_MAX || e - b != r * (rows ? 4 * d : 8) ||
            ((rows ? t[i].have_keys : t[i].have_rows) && r != t[i].rows)) {
            snprintf(err, errlen, "%s: tensor '%.80s' is not table '%s''s %s as psctl save writes them (%s, [rows%s], "
                     "data_offsets holding them, the same rows as its %s)", path, name, t[i].def.name,
                     rows ? "rows" : "keys", rows ? "F32" : "I64", rows ? ", dim" : "", rows ? "keys" : "rows");
            return -1;
        }
        t[i].rows = r;
        if (rows) {
            t[i].rbegin = b, t[i].rend = e, t[i].have_rows = 1;
        } else {
            t[i].kbegin = b, t[i].kend = e, t[i].have_keys = 1;
        }
        return 1;
    }
    return 0;
}

/* Reads the tables' rows and keys from the file into s->tables. 0, or a
 * code with err (some tables may then be in: the caller frees them). */
static int load_tables(psd *s, int fd, const char *path, uint64_t base, const st_table *t, size_t nt, char *err,
                       size_t errlen)
{
    srv_tables_free(&s->tables);
    srv_tables_init(&s->tables, s->cfg.max_table_memory);
    for (size_t i = 0; i < nt; i++) {
        uint32_t ti;
        char e[400];
        uint8_t *keys = malloc(t[i].rows ? t[i].rows * 8 : 1), *w = malloc(t[i].rend - t[i].rbegin + 1);
        int rc = !keys || !w ? PS_ENOMEM : 0;
        if (rc == 0 && (read_at(fd, keys, t[i].rows * 8, base + t[i].kbegin) != 0 ||
                        read_at(fd, w, t[i].rend - t[i].rbegin, base + t[i].rbegin) != 0))
            rc = PS_EIO;
        if (rc == 0)
            rc = srv_tables_declare(&s->tables, &t[i].def, &ti, e, sizeof e);
        if (rc == 0)
            rc = srv_tables_load_weights(&s->tables, ti, keys, w, t[i].rows, e, sizeof e);
        free(keys);
        free(w);
        if (rc != 0) {
            snprintf(err, errlen, "%s: table '%s': %s", path, t[i].def.name,
                     rc == PS_ENOMEM ? "out of memory" : rc == PS_EIO ? "cannot read its rows" : e);
            return rc;
        }
    }
    return 0;
}

/* A tensor's rule from the file's __metadata__ ("buffer:NAME": "mean" or
 * "first", as psctl save writes a buffer's): PS_BUF_NONE without one, -1
 * for another value (err filled). */
static int buffer_rule(const char *path, const json_t *meta, const char *name, char *err, size_t errlen)
{
    char key[PS_NAME_MAX + 16];
    if (!json_is_object(meta) || strlen(name) > PS_NAME_MAX)
        return PS_BUF_NONE;
    snprintf(key, sizeof key, PS_ST_META_BUFFER "%s", name);
    const json_t *v = json_object_get(meta, key);
    if (!v)
        return PS_BUF_NONE;
    int rule = json_is_string(v) ? ps_buf_parse(json_string_value(v), strlen(json_string_value(v))) : -1;
    if (rule < 0)
        snprintf(err, errlen, "%s: __metadata__ \"%s\" is not \"mean\" or \"first\"", path, key);
    return rule;
}

/* Reads tensor t's values, of its dtype, from the file at base into the
 * model's values [off, off + count) as float32. 0, or -1 (errno set). */
static int read_converted(int fd, uint64_t base, const st_tensor *t, srv_model *m, uint64_t off, uint64_t count)
{
    enum { CHUNK = 8192 };
    unsigned char raw[CHUNK * 8];
    size_t esize = t->sdt == PS_SAVE_F64 || t->sdt == PS_SAVE_I64 ? 8 : 4;
    for (uint64_t done = 0; done < count;) {
        size_t n = count - done < CHUNK ? (size_t)(count - done) : CHUNK;
        if (read_at(fd, raw, n * esize, base + t->begin + done * esize) != 0)
            return -1;
        for (size_t i = 0; i < n; i++) {
            uint64_t at = off + done + i;
            float *w = &m->blk[at >> SRV_BLK_SHIFT]->w[at & (SRV_BLK_FLOATS - 1)];
            const unsigned char *b = raw + i * esize;
            if (t->sdt == PS_SAVE_F32) {
                memcpy(w, b, 4);
            } else if (t->sdt == PS_SAVE_F64) {
                double d;
                memcpy(&d, b, 8);
                *w = (float)d;
            } else if (t->sdt == PS_SAVE_I64) {
                int64_t q;
                memcpy(&q, b, 8);
                *w = (float)q;
            } else {
                int32_t q;
                memcpy(&q, b, 4);
                *w = (float)q;
            }
        }
        done += n;
    }
    return 0;
}

/* What scan_header counts. */
typedef struct st_count {
    uint64_t entries; /* keys of the top-level object */
    uint64_t tokens;  /* strings (keys too), numbers, literals, objects, arrays */
    uint64_t longest; /* bytes of the longest string or number */
} st_count;

/* Counts the header's [8, 8 + hlen) of fd in READ_CHUNK pieces, stopping
 * as soon as a count passes its limit (entries: max_entries). Counting
 * only: whether it is JSON is jansson's to say. 0, or -1 (errno set; 0
 * for a short read). */
static int scan_header(int fd, uint64_t hlen, uint64_t max_entries, st_count *n)
{
    char *buf = malloc(READ_CHUNK);
    int depth = 0, in_str = 0, esc = 0, in_scalar = 0, rc = 0;
    uint64_t run = 0;
    *n = (st_count){0};
    if (!buf) {
        errno = ENOMEM;
        return -1;
    }
    for (uint64_t off = 0; off < hlen && n->entries <= max_entries && n->tokens <= HEADER_TOKENS_MAX &&
                           n->longest <= HEADER_TOKEN_LEN_MAX;) {
        size_t len = hlen - off < READ_CHUNK ? (size_t)(hlen - off) : READ_CHUNK;
        if (read_at(fd, buf, len, 8 + off) != 0) {
            rc = -1;
            break;
        }
        off += len;
        for (size_t i = 0; i < len; i++) {
            char ch = buf[i];
            if (in_str) {
                if (esc)
                    esc = 0;
                else if (ch == '\\')
                    esc = 1;
                else if (ch == '"')
                    in_str = 0;
                if (in_str && ++run > n->longest)
                    n->longest = run;
                continue;
            }
            if (in_scalar) {
                if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '-' ||
                    ch == '+' || ch == '.') {
                    if (++run > n->longest)
                        n->longest = run;
                    continue;
                }
                in_scalar = 0;
            }
            switch (ch) {
            case '"':
                in_str = 1, run = 0, n->tokens++;
                break;
            case '{':
            case '[':
                depth++, n->tokens++;
                break;
            case '}':
            case ']':
                depth--;
                break;
            case ':':
                n->entries += depth == 1;
                break;
            case ' ':
            case '\t':
            case '\n':
            case '\r':
            case ',':
                break;
            default:
                in_scalar = 1, run = 1, n->tokens++;
                if (run > n->longest)
                    n->longest = run;
            }
        }
    }
    free(buf);
    return rc;
}

/* jansson reads the header from the file through this. */
typedef struct st_reader {
    int fd;
    uint64_t off, end; /* the next byte to read; the header's end */
} st_reader;

static size_t read_header(void *buffer, size_t buflen, void *data)
{
    st_reader *r = data;
    size_t n = r->end - r->off < buflen ? (size_t)(r->end - r->off) : buflen;
    if (n && read_at(r->fd, buffer, n, r->off) != 0)
        return (size_t)-1;
    r->off += n;
    return n;
}

int srv_safetensors_load(psd *s, const char *path, char *err, size_t errlen)
{
    int rc = PS_EINVAL;
    json_t *root = NULL;
    st_tensor *ts = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "init_from: cannot open %s: %s", path, strerror(errno));
        return PS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "init_from: %s is not a regular file", path);
        goto out;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint8_t len8[8];
    if (size < 8 || read_at(fd, len8, 8, 0) != 0) {
        snprintf(err, errlen, "%s is truncated: %" PRIu64 " bytes, too short for a safetensors file (8 bytes of "
                 "header length, the header, the data)", path, size);
        goto out;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen < 2 || hlen > PS_ST_HEADER_MAX || hlen > size - 8) {
        snprintf(err, errlen, "%s: bad header: its length field says %" PRIu64 " bytes, the file holds %" PRIu64
                 " after it%s: truncated, or not a safetensors file", path, hlen, size - 8,
                 hlen > PS_ST_HEADER_MAX ? " (and safetensors allows 100 MiB)" : "");
        goto out;
    }
    /* counted before anything is built of it: the tensors psd takes, one
     * entry for __metadata__, and each table's tensors */
    st_count cnt;
    if (scan_header(fd, hlen, ST_ENTRIES_MAX, &cnt) != 0) {
        snprintf(err, errlen, "%s: cannot read its header: %s", path, errno ? strerror(errno) : "file shrank");
        rc = errno == ENOMEM ? PS_ENOMEM : PS_EIO;
        goto out;
    }
    if (cnt.entries > ST_ENTRIES_MAX) {
        snprintf(err, errlen, "%s: more than %d tensors in its header; psd takes 1 to %d of the model and %d per "
                 "table (keys, rows) for up to %d tables", path, ST_ENTRIES_MAX - 1, PS_TENSORS_MAX,
                 ST_TABLE_ENTRIES, PS_TABLES_MAX);
        goto out;
    }
    if (cnt.tokens > HEADER_TOKENS_MAX || cnt.longest > HEADER_TOKEN_LEN_MAX) {
        snprintf(err, errlen, "%s: bad header: %s (psd's model has at most %d tensors of %d dimensions "
                 "and names of %d bytes): not a model psd can hold", path,
                 cnt.tokens > HEADER_TOKENS_MAX ? "more than 65536 JSON values" : "a string or number over 4 MiB",
                 PS_TENSORS_MAX, PS_DIMS_MAX, PS_NAME_MAX);
        goto out;
    }
    json_error_t jerr;
    st_reader reader = {.fd = fd, .off = 8, .end = 8 + hlen};
    root = json_load_callback(read_header, &reader, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        snprintf(err, errlen, "%s: bad header: %s%s (at byte %d of %" PRIu64 "): not a safetensors file", path,
                 root ? "not a JSON object" : "not JSON: ", root ? "" : jerr.text, root ? 0 : jerr.position, hlen);
        goto out;
    }
    static st_table tabs[PS_TABLES_MAX]; /* at start only, on the loop */
    size_t ntabs = 0;
    memset(tabs, 0, sizeof tabs);
    if (parse_tables(path, json_object_get(root, "__metadata__"), tabs, &ntabs, err, errlen) != 0)
        goto out;
    size_t nt = json_object_size(root) - (json_object_get(root, "__metadata__") != NULL) - 2 * ntabs;
    if (json_object_size(root) < 2 * ntabs + 1 || nt == 0 || nt > PS_TENSORS_MAX) {
        snprintf(err, errlen, "%s: %zu tensors; psd takes 1 to %d", path, nt, PS_TENSORS_MAX);
        goto out;
    }
    if (!(ts = calloc(nt, sizeof *ts))) {
        snprintf(err, errlen, "%s: out of memory for its header", path);
        rc = PS_ENOMEM;
        goto out;
    }
    size_t k = 0;
    const char *key;
    json_t *val;
    const json_t *meta = json_object_get(root, "__metadata__");
    int converted = 0; /* a buffer of another dtype than F32 */
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        int tab = table_tensor(path, key, val, tabs, ntabs, err, errlen);
        if (tab < 0)
            goto out;
        if (tab)
            continue;
        if (k == nt) {
            snprintf(err, errlen, "%s: a table declared in its metadata lacks its rows or keys tensor", path);
            goto out;
        }
        if ((ts[k].rule = buffer_rule(path, meta, key, err, errlen)) < 0 ||
            parse_tensor(path, key, val, &ts[k], err, errlen) != 0)
            goto out;
        converted |= ts[k++].sdt != PS_SAVE_F32;
    }
    if (k != nt) {
        snprintf(err, errlen, "%s: a table declared in its metadata lacks its rows or keys tensor", path);
        goto out;
    }
    /* the flat vector is the tensors in the order of their data, which
     * must cover it exactly */
    qsort(ts, nt, sizeof *ts, by_begin);
    ps_layout l;
    ps_layout_init(&l);
    for (size_t i = 0; i < nt; i++) {
        uint64_t want = i ? ts[i - 1].end : 0;
        if (ts[i].begin != want) {
            snprintf(err, errlen, "%s: tensor '%.80s' starts at byte %" PRIu64 " of the data, not at %" PRIu64
                     " where the one before ends: a gap or an overlap, not a file psctl save wrote", path,
                     ts[i].name, ts[i].begin, want);
            goto out;
        }
        if (ps_layout_add(&l, ts[i].name, ts[i].ndim, ts[i].dims) != 0 ||
            (ts[i].rule && ps_layout_set_buffer(&l, (unsigned)ts[i].rule, (unsigned)ts[i].sdt) != 0)) {
            snprintf(err, errlen, "%s: tensor '%.80s' cannot be part of a psd layout (a name of 1 to %d printable "
                     "bytes, at most %d tensors, %d dimensions)", path, ts[i].name, PS_NAME_MAX, PS_TENSORS_MAX,
                     PS_DIMS_MAX);
            goto out;
        }
    }
    uint64_t data = ts[nt - 1].end, have = size - 8 - hlen;
    /* the tables' tensors after the model's, covering the rest exactly */
    uint64_t ranges[2 * PS_TABLES_MAX][2];
    for (size_t i = 0; i < ntabs; i++) {
        ranges[2 * i][0] = tabs[i].rbegin, ranges[2 * i][1] = tabs[i].rend;
        ranges[2 * i + 1][0] = tabs[i].kbegin, ranges[2 * i + 1][1] = tabs[i].kend;
    }
    qsort(ranges, 2 * ntabs, sizeof ranges[0], by_range);
    for (size_t i = 0; i < 2 * ntabs; i++) {
        if (ranges[i][0] != data) {
            snprintf(err, errlen, "%s: the tables' tensors do not follow the model's values back to back (a gap or "
                     "an overlap at byte %" PRIu64 " of the data): not a file psctl save wrote", path, data);
            goto out;
        }
        data = ranges[i][1];
    }
    if (have < data) {
        snprintf(err, errlen, "%s is truncated: its header describes %" PRIu64 " bytes of tensor data, the file "
                 "holds %" PRIu64, path, data, have);
        goto out;
    }
    if (have > data) {
        snprintf(err, errlen, "%s has %" PRIu64 " bytes after its tensors' data: damaged, or not a file psctl "
                 "save wrote", path, have - data);
        goto out;
    }
    if (l.total > s->cfg.max_params) {
        snprintf(err, errlen, "%s holds %" PRIu64 " parameters, over this psd's max_params (%" PRIu64 ")", path,
                 l.total, s->cfg.max_params);
        goto out;
    }
    if ((rc = srv_model_set_layout(&s->model, &l, &s->cfg)) != 0) {
        if (rc == PS_EINVAL)
            snprintf(err, errlen, "%s holds %" PRIu64 " parameters; a Hogwild! job's model is at most %" PRIu64
                                  " (hogwild = on)", path, l.total, (uint64_t)SRV_SHM_MAX_PARAMS);
        else
            snprintf(err, errlen, "%s: out of memory for a model of %" PRIu64 " parameters", path, l.total);
        goto out;
    }
    uint64_t base = 8 + hlen;
    /* buffers of other dtypes: every tensor converted into the blocks */
    for (size_t i = 0; converted && i < nt; i++)
        if (read_converted(fd, base, &ts[i], &s->model, l.t[i].offset, l.t[i].count) != 0) {
            snprintf(err, errlen, "%s: cannot read its data: %s", path, errno ? strerror(errno) : "file shrank");
            rc = PS_EIO;
            goto undo;
        }
    for (size_t b = 0; b < s->model.nblk; b++) {
        srv_blk *blk = s->model.blk[b];
        uint64_t first = (uint64_t)b << SRV_BLK_SHIFT;
        if (!converted && read_at(fd, blk->w, blk->cap * sizeof(float), base + first * 4) != 0) {
            snprintf(err, errlen, "%s: cannot read its data: %s", path, errno ? strerror(errno) : "file shrank");
            rc = PS_EIO;
            goto undo;
        }
        if (!isfinite(ps_vec_maxabs(blk->w, blk->cap))) {
            size_t i = 0;
            while (i < blk->cap && isfinite(blk->w[i]))
                i++;
            uint64_t at = first + i;
            const char *name = "?";
            for (uint32_t t = 0; t < l.ntensors; t++)
                if (at >= l.t[t].offset && at < l.t[t].offset + l.t[t].count)
                    name = l.t[t].name;
            snprintf(err, errlen, "%s: tensor '%s' holds NaN or infinity (value %" PRIu64 " of the model); psd "
                     "starts from finite values only", path, name, at);
            rc = PS_EINVAL;
            goto undo;
        }
    }
    if (ntabs && (rc = load_tables(s, fd, path, base, tabs, ntabs, err, errlen)) != 0) {
        srv_tables_free(&s->tables);
        goto undo;
    }
    srv_model_set_initialized(&s->model, 0);
    srv_model_touched(&s->model);
    snprintf(s->model_file, sizeof s->model_file, "%s", path);
    rc = 0;
    goto out;
undo:
    srv_model_release(&s->model);
out:
    free(ts);
    json_decref(root);
    close(fd);
    return rc;
}
