/* ckpt_load.c - loading the newest checkpoint that reads whole at start
 * (srv_checkpoint_load: its CRC, header, layout, optimizer state, clocks,
 * plan and embedding tables), and setting checkpoints aside (--fresh). Owns nothing past
 * the load. */
#include "server/store/parts.h"
#include "server/report/checkpoint.h"
#include "server/report/ckpt_file.h"
#include "server/policy/policy.h"
#include "server/update/update.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/tables/sparse_optim.h"
#include "server/record/stats.h"
#include "server/replog/pushid.h"

/* ---- loading -------------------------------------------------------------- */


static int get_u64(const msgpack_object *map, const char *key, uint64_t *v)
{
    const msgpack_object *o = ps_map_get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -1;
    *v = o->via.u64;
    return 0;
}

/* Reads a checkpoint's "plan" (pack_plan) into *p and the shards out of
 * the job into out (those below max, at most max of them, *nout). 0, or
 * -1 with err filled when it is not one psd wrote. */
static int read_plan(const msgpack_object *o, ps_plan *p, uint32_t *out, uint32_t max, uint32_t *nout, char *err,
                     size_t errlen)
{
    *nout = 0;
    const msgpack_object *x = o->type == MSGPACK_OBJECT_MAP ? ps_map_get(o, "out") : NULL;
    if (o->type != MSGPACK_OBJECT_MAP || get_u64(o, "epochs", &p->epochs) || get_u64(o, "samples", &p->samples) ||
        get_u64(o, "batch", &p->batch) || get_u64(o, "seed", &p->seed) || !x || x->type != MSGPACK_OBJECT_ARRAY) {
        snprintf(err, errlen, "not a map of epochs, samples, batch, seed and out");
        return -1;
    }
    if (p->epochs < 1 || p->epochs > PS_PLAN_EPOCHS_MAX || p->samples < 1 || p->samples > PS_PLAN_SAMPLES_MAX ||
        p->batch < 1 || p->batch > p->samples) {
        snprintf(err, errlen, "%llu epochs of %llu samples, %llu per round: out of bounds",
                 (unsigned long long)p->epochs, (unsigned long long)p->samples, (unsigned long long)p->batch);
        return -1;
    }
    for (uint32_t i = 0; i < x->via.array.size; i++) {
        const msgpack_object *e = &x->via.array.ptr[i];
        if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
            snprintf(err, errlen, "out holds a %s, not a shard", e->type == MSGPACK_OBJECT_STR ? "string" : "non-integer");
            return -1;
        }
        if (e->via.u64 < max && *nout < max)
            out[(*nout)++] = (uint32_t)e->via.u64;
    }
    return 0;
}

/* The loaded checkpoint held the plan p: fixes it and says where the job
 * stands; keeps the nout shards in out, which had left the job or been
 * lost when it was written, for the session layer to record as lost at
 * start (the next rounds are then shared by the others, as before the
 * restart; each may rejoin). When every shard was out the job had
 * stopped, and all are waited for again. */
static void restore_plan(psd *s, const ps_plan *p, const uint32_t *out, uint32_t nout)
{
    srv_plan_clear(&s->plan);
    const srv_plan *pl = &s->plan;
    uint64_t r = s->model.version;
    uint64_t per_epoch = (p->samples + p->batch - 1) / p->batch;
    int keep = s->policy->plan && nout < (uint32_t)s->cfg.workers && r < p->epochs * per_epoch;
    if (srv_plan_restore(&s->plan, p, out, keep ? nout : 0) != 0)
        PS_LOG(PS_LOG_ERROR, "out of memory keeping the %u shards out of the job: they are waited for", nout);
    PS_LOG(PS_LOG_INFO, "plan restored from the checkpoint: %llu epochs of %llu samples, %llu per round, seed %llu: "
                        "round %llu of %llu%s",
           (unsigned long long)pl->p.epochs, (unsigned long long)pl->p.samples, (unsigned long long)pl->p.batch,
           (unsigned long long)pl->p.seed, (unsigned long long)(r < pl->rounds ? r : pl->rounds),
           (unsigned long long)pl->rounds, r >= pl->rounds ? " (the job is done)" : "");
    if (!s->policy->plan)
        PS_LOG(PS_LOG_INFO, "psd runs %s: the plan is kept (in the next checkpoints) but rules nothing",
               s->policy->name);
}

/* A checkpoint's table, as its header says (checkpoint.c's pack_tables). */
typedef struct ckpt_tdef {
    ps_table_def def;
    uint64_t rows;
    uint32_t floats;
    uint64_t clock;   /* the table's clock (format 3; 0 before) */
} ckpt_tdef;

/* A str field of map m into buf (NUL-terminated, 1..len-1 bytes); -1 when
 * absent, not a str, too long or holding a NUL. */
static int get_str(const msgpack_object *m, const char *key, char *buf, size_t len)
{
    const msgpack_object *o = ps_map_get(m, key);
    if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size >= len ||
        memchr(o->via.str.ptr, 0, o->via.str.size))
        return -1;
    memcpy(buf, o->via.str.ptr, o->via.str.size);
    buf[o->via.str.size] = '\0';
    return 0;
}

static int get_f64(const msgpack_object *m, const char *key, double *v)
{
    const msgpack_object *o = ps_map_get(m, key);
    if (!o || (o->type != MSGPACK_OBJECT_FLOAT64 && o->type != MSGPACK_OBJECT_FLOAT32))
        return -1;
    *v = o->via.f64;
    return 0;
}

/* Reads a checkpoint's "tables" (pack_tables) into t (*nt of them) and the
 * bytes their rows take after the state in *bytes, checked against `room`,
 * the bytes the file has for them; clocks: format 3's, each table with its
 * clock and its rows' clocks after its rows. 0, or -1 with err. */
static int read_tables(const msgpack_object *o, ckpt_tdef *t, uint32_t *nt, uint64_t room, uint64_t *bytes,
                       int clocks, char *err, size_t errlen)
{
    *nt = 0;
    *bytes = 0;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > PS_TABLES_MAX) {
        snprintf(err, errlen, "tables: not an array of at most %d tables", PS_TABLES_MAX);
        return -1;
    }
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        const msgpack_object *m = &o->via.array.ptr[i];
        char name[PS_NAME_MAX + 1], rinit[16], opt[16], derr[300];
        uint64_t dim, seed, floats;
        double scale;
        ps_hp hp = {0};
        const msgpack_object *h = m->type == MSGPACK_OBJECT_MAP ? ps_map_get(m, "hp") : NULL;
        if (m->type != MSGPACK_OBJECT_MAP || get_str(m, "name", name, sizeof name) || get_u64(m, "dim", &dim) ||
            get_str(m, "rinit", rinit, sizeof rinit) || get_f64(m, "scale", &scale) || get_u64(m, "seed", &seed) ||
            get_str(m, "opt", opt, sizeof opt) || get_u64(m, "rows", &t[i].rows) ||
            get_u64(m, "floats", &floats) || !h || h->type != MSGPACK_OBJECT_MAP ||
            h->via.map.size > PS_HP_COUNT) {
            snprintf(err, errlen, "tables[%u]: not a map of name, dim, rinit, scale, seed, opt, hp, rows, floats", i);
            return -1;
        }
        for (uint32_t k = 0; k < h->via.map.size; k++) {
            const msgpack_object_kv *e = &h->via.map.ptr[k];
            int id = e->key.type == MSGPACK_OBJECT_STR ? ps_hp_lookup(e->key.via.str.ptr, e->key.via.str.size) : -1;
            if (id < 0 || (e->val.type != MSGPACK_OBJECT_FLOAT64 && e->val.type != MSGPACK_OBJECT_FLOAT32)) {
                snprintf(err, errlen, "tables[%u] (%s): hp[%u] is not a hyper-parameter and a number", i, name, k);
                return -1;
            }
            hp.has |= 1u << id;
            hp.v[id] = e->val.via.f64;
        }
        int zeros = strcmp(rinit, "zeros") == 0;
        if (ps_table_def_make(&t[i].def, name, dim, rinit, !zeros, scale, seed, opt, &hp, derr, sizeof derr) != 0) {
            snprintf(err, errlen, "tables[%u]: %s", i, derr);
            return -1;
        }
        const msgpack_object *pt = ps_map_get(m, "part");
        if (pt) {
            uint64_t pi, pn;
            if (pt->type != MSGPACK_OBJECT_ARRAY || pt->via.array.size != 2 ||
                pt->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                pt->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                (pi = pt->via.array.ptr[0].via.u64, pn = pt->via.array.ptr[1].via.u64) == 0 || pn > PS_PARTS_MAX ||
                pi >= pn) {
                snprintf(err, errlen, "tables[%u] (%s): part is not [i, n] with 0 <= i < n <= %u", i, name,
                         PS_PARTS_MAX);
                return -1;
            }
            t[i].def.part = (uint32_t)pi;
            t[i].def.nparts = (uint32_t)pn;
        }
        for (uint32_t k = 0; k < i; k++)
            if (strcmp(t[k].def.name, name) == 0) {
                snprintf(err, errlen, "tables[%u]: table '%s' twice", i, name);
                return -1;
            }
        if (floats != srv_sparse_row_floats(&t[i].def)) {
            snprintf(err, errlen, "tables[%u] (%s): %llu floats a row, %u for its optimizer", i, name,
                     (unsigned long long)floats, srv_sparse_row_floats(&t[i].def));
            return -1;
        }
        t[i].floats = (uint32_t)floats;
        t[i].clock = 0;
        if (clocks && get_u64(m, "clock", &t[i].clock)) {
            snprintf(err, errlen, "tables[%u] (%s): no clock (format %d)", i, name, CKPT_FORMAT_CLOCKS);
            return -1;
        }
        uint64_t per = 8 + floats * sizeof(float) + (clocks ? 8 : 0);
        if (t[i].rows > (room - *bytes) / per) {
            snprintf(err, errlen, "tables[%u] (%s): %llu rows do not fit the file", i, name,
                     (unsigned long long)t[i].rows);
            return -1;
        }
        *bytes += t[i].rows * per;
        *nt = i + 1;
    }
    return 0;
}

/* Reads and checks one file; on success fills the model and clocks, and
 * the plan with the shards out of it (*nout of them, in out, below max). */
/* The header's "pushids" (checkpoint.c), checked whole before anything is
 * kept: the record then is the checkpoint's, exactly. A checkpoint without
 * them (written before psd kept them, or with no client that names itself)
 * leaves none. */
static int read_pushids(const msgpack_object *o, char *err, size_t errlen)
{
    if (o && (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size % 16 != 0 ||
              o->via.bin.size / 16 > SRV_PUSHIDS_MAX)) {
        snprintf(err, errlen, "bad pushids: not a bin of at most %u 16-byte entries", SRV_PUSHIDS_MAX);
        return PS_EMALFORMED;
    }
    for (uint32_t i = 0; o && i < o->via.bin.size / 16; i++) {
        const uint8_t *e = (const uint8_t *)o->via.bin.ptr + 16 * i;
        uint32_t cid_bits = srv_ckpt_get_u32(e) | srv_ckpt_get_u32(e + 4);
        uint32_t pid_bits = srv_ckpt_get_u32(e + 8) | srv_ckpt_get_u32(e + 12);
        if (cid_bits == 0 || pid_bits == 0) {
            snprintf(err, errlen, "bad pushids: entry %u has a cid or pid of 0", i);
            return PS_EMALFORMED;
        }
    }
    return 0;
}

static void restore_pushids(psd *s, const msgpack_object *o, const char *path)
{
    srv_pushid_free(s);
    for (uint32_t i = 0; o && i < o->via.bin.size / 16; i++) {
        const uint8_t *e = (const uint8_t *)o->via.bin.ptr + 16 * i;
        uint64_t cid = srv_ckpt_get_u32(e) | (uint64_t)srv_ckpt_get_u32(e + 4) << 32;
        uint64_t pid = srv_ckpt_get_u32(e + 8) | (uint64_t)srv_ckpt_get_u32(e + 12) << 32;
        if (srv_pushid_set(s, cid, pid) != 0) {
            PS_LOG(PS_LOG_WARN, "checkpoint %s: no memory for its push ids: a push sent again after this restart may "
                                "be applied twice", path);
            return;
        }
    }
}

static int load_one(psd *s, const char *path, uint32_t *out, uint32_t max, uint32_t *nout, char *err, size_t errlen)
{
    int rc = PS_EMALFORMED;
    static ckpt_tdef tdefs[PS_TABLES_MAX]; /* on the loop, at start only */
    uint8_t *data = NULL;
    void *mapped = NULL;
    size_t size = 0;
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        msgpack_zone_destroy(&zone);
        return PS_EIO;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 24) {
        snprintf(err, errlen, "truncated (%lld bytes)", (long long)st.st_size);
        goto out;
    }
    size = (size_t)st.st_size;
    /* mapped, its pages in at once: no copy of the file, and no fault per
     * page (a fresh buffer read into took one per 4 KiB, which perf put
     * among the largest costs of a 1 GiB snapshot's load on the 2-core
     * machine of bench/README.md) */
    mapped = mmap(NULL, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(f), 0);
    if (mapped != MAP_FAILED) {
        data = mapped;
    } else {
        mapped = NULL;
        data = malloc(size);
        if (!data || fread(data, 1, size, f) != size) {
            snprintf(err, errlen, "cannot read %zu bytes", size);
            rc = PS_EIO;
            goto out;
        }
    }
    if (memcmp(data, CKPT_MAGIC, 8) != 0) {
        snprintf(err, errlen, "not a psd checkpoint (bad magic)");
        goto out;
    }
    uint32_t format = srv_ckpt_get_u32(data + 8), hlen = srv_ckpt_get_u32(data + 12);
    if (format != CKPT_FORMAT && format != CKPT_FORMAT_TABLES && format != CKPT_FORMAT_CLOCKS) {
        snprintf(err, errlen, "format version %u, this psd reads %d to %d", format, CKPT_FORMAT, CKPT_FORMAT_CLOCKS);
        goto out;
    }
    if (hlen > CKPT_HEADER_MAX || (size_t)hlen + 24 > size) {
        snprintf(err, errlen, "truncated: header of %u bytes in a %zu-byte file", hlen, size);
        goto out;
    }
    if (memcmp(data + size - 4, CKPT_END, 4) != 0) {
        snprintf(err, errlen, "truncated: no end marker");
        goto out;
    }
    uint32_t want = srv_ckpt_get_u32(data + size - 8);
    uint32_t got = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), data, size - 8);
    if (want != got) {
        snprintf(err, errlen, "checksum mismatch (stored %08x, computed %08x)", want, got);
        goto out;
    }
    char serr[256];
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, 1u << 20};
    if (ps_scan(data + 16, hlen, &lim, serr, sizeof serr) != 0) {
        snprintf(err, errlen, "bad header: %s", serr);
        goto out;
    }
    msgpack_object h;
    size_t off = 0;
    if (msgpack_unpack((const char *)data + 16, hlen, &off, &zone, &h) != MSGPACK_UNPACK_SUCCESS ||
        h.type != MSGPACK_OBJECT_MAP) {
        snprintf(err, errlen, "bad header");
        goto out;
    }
    const msgpack_object *ver = ps_map_get(&h, "version"), *lay = ps_map_get(&h, "layout");
    const msgpack_object *sta = ps_map_get(&h, "state"), *opt = ps_map_get(&h, "optimizer");
    const msgpack_object *clk = ps_map_get(&h, "clocks"), *pids = ps_map_get(&h, "pushids");
    if (!ver || ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !lay || lay->type != MSGPACK_OBJECT_ARRAY || !sta ||
        sta->type != MSGPACK_OBJECT_ARRAY || !opt || opt->type != MSGPACK_OBJECT_STR) {
        snprintf(err, errlen, "header lacks version, layout, optimizer or state");
        goto out;
    }
    ps_layout *l = &s->scratch_layout;
    char lerr[256];
    /* no dense model: a part a move added, which holds table rows only
     * (PROTOCOL.md 18); its map must say so */
    const msgpack_object *pm = ps_map_get(&h, "parts");
    int table_only = lay->via.array.size == 0;
    if (table_only) {
        srv_parts q;
        memset(&q, 0, sizeof q);
        if (!pm || srv_parts_restore(&q, pm) != 0 || !srv_parts_table_only(&q)) {
            snprintf(err, errlen, "no dense model, and no map of a part that holds none");
            goto out;
        }
        ps_layout_init(l);
    } else if (ps_layout_unpack(lay, l, lerr, sizeof lerr) != 0) {
        snprintf(err, errlen, "bad layout: %s", lerr);
        goto out;
    }
    size_t n = l->total, nstate = sta->via.array.size;
    size_t dense = 16 + (size_t)hlen + (1 + nstate) * n * sizeof(float) + 8;
    const msgpack_object *tabs = ps_map_get(&h, "tables");
    uint32_t nt = 0;
    uint64_t tbytes = 0;
    if ((format != CKPT_FORMAT) != (tabs != NULL)) {
        snprintf(err, errlen, "format %u %s tables", format, tabs ? "with" : "without");
        goto out;
    }
    if (nstate <= CKPT_MAX_STATE && dense <= size && tabs &&
        read_tables(tabs, tdefs, &nt, size - dense, &tbytes, format == CKPT_FORMAT_CLOCKS, err, errlen) != 0)
        goto out;
    if (read_pushids(pids, err, errlen) != 0)
        goto out;
    if (nstate > CKPT_MAX_STATE || size != dense + tbytes) {
        snprintf(err, errlen, "truncated or padded: %zu bytes, expected %zu for %zu parameters%s", size,
                 dense + (size_t)tbytes, n, tabs ? " and the tables" : "");
        goto out;
    }
    /* install */
    srv_model_free(&s->model);
    memset(&s->model, 0, sizeof s->model);
    rc = table_only ? 0 : srv_model_set_layout(&s->model, l, &s->cfg);
    if (rc != 0) {
        if (rc == PS_EINVAL)
            snprintf(err, errlen, "the checkpoint's model has %zu parameters; a Hogwild! job's model is at most %llu "
                                  "(hogwild = on)", n, (unsigned long long)SRV_SHM_MAX_PARAMS);
        else
            snprintf(err, errlen, "out of memory for %zu parameters", n);
        goto out;
    }
    const uint8_t *p = data + 16 + hlen;
    for (size_t i = 0; i < s->model.nblk; i++) {
        srv_blk *b = s->model.blk[i];
        memcpy(b->w, p, b->cap * sizeof(float));
        srv_model_touched(&s->model);
        p += b->cap * sizeof(float);
    }
    float *bufs[CKPT_MAX_STATE];
    const char *names[CKPT_MAX_STATE];
    size_t have = srv_optim_state_buffers(&s->model.opt, bufs, names, CKPT_MAX_STATE);
    int match = strlen(srv_optim_name(&s->model.opt)) == opt->via.str.size &&
                !memcmp(srv_optim_name(&s->model.opt), opt->via.str.ptr, opt->via.str.size) && have == nstate;
    for (size_t i = 0; match && i < nstate; i++) {
        const msgpack_object *nm = &sta->via.array.ptr[i];
        match = nm->type == MSGPACK_OBJECT_STR && nm->via.str.size == strlen(names[i]) &&
                !memcmp(nm->via.str.ptr, names[i], nm->via.str.size);
    }
    if (table_only) {
        /* nothing of a dense model to restore */
    } else if (match) {
        for (size_t i = 0; i < nstate; i++, p += n * sizeof(float))
            memcpy(bufs[i], p, n * sizeof(float));
    } else {
        PS_LOG(PS_LOG_WARN, "checkpoint %s holds %.*s optimizer state; psd is configured for %s: starting that "
                            "optimizer's state from zero",
               path, (int)opt->via.str.size, opt->via.str.ptr, srv_optim_name(&s->model.opt));
    }
    /* the tables after the state: per table its keys, its rows, then (format
     * 3) its rows' clocks */
    p = data + 16 + hlen + (1 + nstate) * n * sizeof(float);
    srv_tables_free(&s->tables);
    srv_tables_init(&s->tables, s->cfg.max_table_memory);
    /* the rows' clocks are kept when expiry or eviction will read them */
    srv_table_bounds keep = srv_table_bounds_of(&s->cfg);
    keep.admit = 0;       /* every row of the file is loaded */
    keep.table_bytes = 0; /* ... and checked against max_table_memory alone */
    srv_tables_set_bounds(&s->tables, &keep);
    for (uint32_t i = 0; i < nt; i++) {
        uint32_t ti;
        const uint8_t *keys = p, *rows = p + tdefs[i].rows * 8;
        const uint8_t *stamps = rows + tdefs[i].rows * tdefs[i].floats * sizeof(float);
        int clocks = format == CKPT_FORMAT_CLOCKS;
        int drc = srv_tables_declare(&s->tables, &tdefs[i].def, &ti, err, errlen);
        if (drc == 0)
            srv_tables_set_clock(&s->tables, ti, tdefs[i].clock);
        if (drc != 0 ||
            srv_tables_load(&s->tables, ti, keys, rows, clocks ? stamps : NULL, tdefs[i].rows, err, errlen) != 0) {
            srv_tables_free(&s->tables);
            rc = PS_EMALFORMED;
            goto out;
        }
        p = stamps + (clocks ? tdefs[i].rows * 8 : 0);
    }
    if (s->tables.bytes > s->cfg.max_table_memory)
        PS_LOG(PS_LOG_WARN, "checkpoint %s: its tables take %llu bytes, past max_table_memory (%llu): kept; no new "
                            "rows fit until some memory is freed or the setting raised",
               path, (unsigned long long)s->tables.bytes, (unsigned long long)s->cfg.max_table_memory);
    if (!table_only) /* a table-only part's model stays without values (and at version 0): it holds none */
        srv_model_set_initialized(&s->model, ver->via.u64);
    restore_pushids(s, pids, path);
    srv_plan_clear(&s->plan);
    *nout = 0;
    if (pm && srv_parts_restore(&s->parts, pm) != 0)
        PS_LOG(PS_LOG_WARN, "checkpoint %s: its part map is unusable: loaded without it (the workers' lists are the "
                            "map)", path);
    else if (pm)
        PS_LOG(PS_LOG_INFO, "checkpoint %s: part map %" PRIu64 ", this psd part %d of %u", path, s->parts.epoch,
               s->parts.self, s->parts.n);
    const msgpack_object *plan = ps_map_get(&h, "plan");
    if (plan) {
        ps_plan pp;
        char perr[160];
        if (read_plan(plan, &pp, out, max, nout, perr, sizeof perr) == 0)
            restore_plan(s, &pp, out, *nout);
        else
            PS_LOG(PS_LOG_WARN, "checkpoint %s: its plan is unusable (%s): loaded without it; the next worker's "
                                "hello that carries a plan fixes one",
                   path, perr);
    }
    free(s->restored_clocks);
    s->restored_clocks = NULL;
    s->nrestored = 0;
    if (clk && clk->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < clk->via.array.size; i++) {
            const msgpack_object *e = &clk->via.array.ptr[i];
            if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 ||
                e->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                e->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.array.ptr[0].via.u64 >= 65536)
                continue;
            uint32_t shard = (uint32_t)e->via.array.ptr[0].via.u64;
            if (shard >= s->nrestored) {
                uint64_t *t = realloc(s->restored_clocks, (shard + 1) * sizeof *t);
                if (!t)
                    break;
                memset(t + s->nrestored, 0, (shard + 1 - s->nrestored) * sizeof *t);
                s->restored_clocks = t;
                s->nrestored = shard + 1;
            }
            s->restored_clocks[shard] = e->via.array.ptr[1].via.u64;
        }
    }
    rc = 0;
out:
    if (mapped)
        munmap(mapped, size);
    else
        free(data);
    fclose(f);
    msgpack_zone_destroy(&zone);
    return rc;
}

int srv_checkpoint_load(psd *s)
{
    if (!s->cfg.state_dir[0])
        return 0;
    struct stat st;
    if (stat(s->cfg.state_dir, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        PS_LOG(PS_LOG_ERROR, "state_dir %s: %s", s->cfg.state_dir, strerror(errno));
        return PS_EIO;
    }
    if (!S_ISDIR(st.st_mode)) {
        PS_LOG(PS_LOG_ERROR, "state_dir %s is not a directory", s->cfg.state_dir);
        return PS_EIO;
    }
    srv_ckpt_remove_leftovers(s->cfg.state_dir);
    srv_ckpt_id *vers;
    size_t nv = srv_ckpt_list(s->cfg.state_dir, &vers);
    int loaded = 0;
    uint32_t m = (uint32_t)s->cfg.workers, nout = 0;
    uint32_t *out = malloc((m ? m : 1) * sizeof *out);
    if (!out) {
        free(vers);
        PS_LOG(PS_LOG_ERROR, "out of memory loading a checkpoint");
        return PS_ENOMEM;
    }
    for (size_t i = 0; i < nv && !loaded; i++) {
        char path[PS_CONFIG_PATH_MAX + 64], err[512];
        srv_ckpt_path(path, sizeof path, s->cfg.state_dir, vers[i], "");
        if (load_one(s, path, out, m, &nout, err, sizeof err) == 0) {
            char desc[512];
            ps_layout_describe(&s->model.layout, desc, sizeof desc);
            PS_LOG(PS_LOG_INFO, "loaded checkpoint %s: model version %" PRIu64 ", %" PRIu64 " parameters (%s), %u tables",
                   path, s->model.version, s->model.layout.total, desc, s->tables.n);
            srv_stats_checkpoint_loaded(s, s->model.version, s->tables.stamp);
            snprintf(s->resumed_from, sizeof s->resumed_from, "%s", path);
            s->resumed_version = s->model.version;
            loaded = 1;
        } else {
            PS_LOG(PS_LOG_ERROR, "checkpoint %s is unusable: %s; trying an older one", path, err);
        }
    }
    if (nv > 0 && !loaded)
        PS_LOG(PS_LOG_WARN, "no valid checkpoint in %s: starting without a model", s->cfg.state_dir);
    free(out);
    free(vers);
    return loaded;
}

int srv_checkpoint_load_file(psd *s, const char *path, char *err, size_t errlen)
{
    uint32_t m = (uint32_t)s->cfg.workers, nout = 0;
    uint32_t *out = malloc((m ? m : 1) * sizeof *out);
    if (!out)
        return ps_fail(err, errlen, PS_ENOMEM, "no memory to load a snapshot");
    int rc = load_one(s, path, out, m, &nout, err, errlen);
    free(out);
    return rc;
}

void srv_checkpoint_forget_origin(psd *s)
{
    free(s->restored_clocks);
    s->restored_clocks = NULL;
    s->nrestored = 0;
    s->resumed_from[0] = '\0';
    s->resumed_version = 0;
    s->model_file[0] = '\0';
}

int srv_checkpoint_set_aside(const char *dir, char *aside, size_t asidelen, char *err, size_t errlen)
{
    char sub[PS_CONFIG_PATH_MAX + 64] = ""; /* the dated subfolder, once made */
    if (asidelen)
        aside[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot read state_dir %s: %s", dir, strerror(errno));
        return PS_EIO;
    }
    int moved = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue; /* checkpoints and their unfinished .tmp files only */
        if (!sub[0]) {
            /* one dated subfolder per start, never one that exists */
            time_t now = time(NULL);
            struct tm tm;
            char stamp[32];
            gmtime_r(&now, &tm);
            strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
            for (int i = 0; i < 100; i++) {
                if (i == 0)
                    snprintf(sub, sizeof sub, "%s/set-aside-%s", dir, stamp);
                else
                    snprintf(sub, sizeof sub, "%s/set-aside-%s-%d", dir, stamp, i);
                if (mkdir(sub, 0750) == 0 || errno != EEXIST)
                    break;
            }
            struct stat st;
            if (stat(sub, &st) != 0 || !S_ISDIR(st.st_mode)) {
                snprintf(err, errlen, "cannot create %s: %s", sub, strerror(errno));
                closedir(d);
                return PS_EIO;
            }
        }
        char from[PS_CONFIG_PATH_MAX + 300], to[PS_CONFIG_PATH_MAX + 400];
        snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", sub, e->d_name);
        if (rename(from, to) != 0) {
            snprintf(err, errlen, "cannot move %s to %s: %s", from, sub, strerror(errno));
            closedir(d);
            return PS_EIO;
        }
        moved++;
    }
    closedir(d);
    if (asidelen) {
        size_t n = strnlen(sub, asidelen - 1);
        memcpy(aside, sub, n);
        aside[n] = '\0';
    }
    return moved;
}
