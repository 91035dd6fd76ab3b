/* msg_encode.c - every message into msgpack (msg.h: ps_msg_encode), the
 * key helpers the status and checkpoint writers use too, and a layout on
 * the wire (ps_layout_pack). Driven by the field table (msg_fields.h). */
#include "msg.h"

#include <math.h>
#include <string.h>

#include "errors.h"
#include "msg_fields.h"

/* ---- encoding --------------------------------------------------------- */

void ps_pack_key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}

void ps_pack_ku64(msgpack_packer *pk, const char *k, uint64_t v)
{
    ps_pack_key(pk, k);
    msgpack_pack_uint64(pk, v);
}

void ps_pack_kf64(msgpack_packer *pk, const char *k, double v)
{
    ps_pack_key(pk, k);
    msgpack_pack_double(pk, v);
}

void ps_pack_kstr(msgpack_packer *pk, const char *k, const char *v)
{
    size_t n = strlen(v);
    ps_pack_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, v, n);
}

void ps_pack_table_def(msgpack_packer *pk, const ps_table_def *d)
{
    uint32_t hps = ps_topt_hps(d->opt), nhp = 0;
    for (uint32_t b = hps; b; b &= b - 1)
        nhp++;
    ps_pack_kstr(pk, "name", d->name);
    ps_pack_ku64(pk, "dim", d->dim);
    ps_pack_kstr(pk, "rinit", ps_rinit_name(d->rinit));
    ps_pack_kf64(pk, "scale", d->scale);
    ps_pack_ku64(pk, "seed", d->seed);
    ps_pack_kstr(pk, "opt", ps_topt_name(d->opt));
    ps_pack_key(pk, "hp");
    msgpack_pack_map(pk, nhp);
    for (uint32_t h = 0; h < PS_HP_COUNT; h++)
        if (hps & (1u << h))
            ps_pack_kf64(pk, ps_hp_name(h), d->hp[h]);
}

static void pack_strn(msgpack_packer *pk, const char *k, const char *s, size_t n)
{
    ps_pack_key(pk, k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_binn(msgpack_packer *pk, const char *k, const uint8_t *p, size_t n)
{
    ps_pack_key(pk, k);
    msgpack_pack_bin(pk, n);
    msgpack_pack_bin_body(pk, p, n);
}

static unsigned popcount64(uint64_t x)
{
    unsigned n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

int ps_msg_encode(const ps_msg *m, ps_buf *out, size_t *data_len, ps_body_fn body, void *body_arg)
{
    msgpack_packer pk;
    uint64_t has = m->has & ~(uint64_t)PS_F_BODY;
    if (body)
        has |= PS_F_BODY;
    uint64_t dbytes = (has & PS_F_DATA) ? ps_msg_data_len(m) : 0;
    if (dbytes > PS_FRAME_MAX_HARD)
        return PS_ETOO_BIG;

    out->len = 0;
    if (ps_buf_reserve(out, 256) != 0)
        return PS_ENOMEM;
    out->len = PS_FRAME_HDR;
    msgpack_packer_init(&pk, out, ps_buf_write);

    /* "t" always; "pad" goes with "data" */
    uint64_t has2 = m->has2 & ((1ull << PS_F2_COUNT) - 1);
    unsigned nfields = 1 + popcount64(has) + popcount64(has2) + ((has & PS_F_DATA) ? 1 : 0);
    msgpack_pack_map(&pk, nfields);
    ps_pack_ku64(&pk, "t", m->type);
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &ps_msg_fields[i];
        if (!((f->word ? has2 : has) & f->bit) || f->kind == FK_DATA)
            continue; /* data goes last, below */
        switch (f->kind) {
        case FK_U64:
            ps_pack_ku64(&pk, f->key, *AT_C(m, f, uint64_t));
            break;
        case FK_U32:
        case FK_DTYPE:
            ps_pack_ku64(&pk, f->key, *AT_C(m, f, uint32_t));
            break;
        case FK_F64:
            ps_pack_kf64(&pk, f->key, *AT_C(m, f, double));
            break;
        case FK_BOOL:
            ps_pack_key(&pk, f->key);
            if (*AT_C(m, f, int))
                msgpack_pack_true(&pk);
            else
                msgpack_pack_false(&pk);
            break;
        case FK_NAME:
            pack_strn(&pk, f->key, AT_C(m, f, char), strlen(AT_C(m, f, char)));
            break;
        case FK_BIN:
            pack_binn(&pk, f->key, AT_C(m, f, uint8_t), f->size);
            break;
        case FK_ROLE: {
            const char *r = ps_role_name(m->role);
            pack_strn(&pk, f->key, r, strlen(r));
            break;
        }
        case FK_CODE:
            ps_pack_key(&pk, f->key);
            msgpack_pack_int32(&pk, m->code);
            break;
        case FK_TEXT:
            pack_strn(&pk, f->key, m->text ? m->text : "", m->text ? m->text_len : 0);
            break;
        case FK_SHARD:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 2);
            msgpack_pack_uint32(&pk, m->shard);
            msgpack_pack_uint32(&pk, m->nshards);
            break;
        case FK_PART:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 2);
            msgpack_pack_uint32(&pk, m->part);
            msgpack_pack_uint32(&pk, m->nparts);
            break;
        case FK_LAYOUT:
            ps_pack_key(&pk, f->key);
            ps_layout_pack(&pk, m->layout);
            break;
        case FK_SHM:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, m->shm_at ? 4 : 2);
            msgpack_pack_uint32(&pk, m->shm_pid);
            msgpack_pack_uint32(&pk, m->shm_fd);
            if (m->shm_at) {
                msgpack_pack_uint64(&pk, m->shm_goff);
                msgpack_pack_uint64(&pk, m->shm_poff);
            }
            break;
        case FK_PIDFD:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 2);
            msgpack_pack_uint32(&pk, AT_C(m, f, ps_pidfd)->pid);
            msgpack_pack_uint32(&pk, AT_C(m, f, ps_pidfd)->fd);
            break;
        case FK_SEG: {
            const ps_seg *g = AT_C(m, f, ps_seg);
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 4);
            msgpack_pack_uint64(&pk, g->at);
            msgpack_pack_uint32(&pk, g->n);
            msgpack_pack_uint32(&pk, g->m);
            msgpack_pack_uint64(&pk, g->rat);
            break;
        }
        case FK_PLAN:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 4);
            msgpack_pack_uint64(&pk, m->plan.epochs);
            msgpack_pack_uint64(&pk, m->plan.samples);
            msgpack_pack_uint64(&pk, m->plan.batch);
            msgpack_pack_uint64(&pk, m->plan.seed);
            break;
        case FK_SLICE:
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 5);
            msgpack_pack_uint64(&pk, m->slice.epoch);
            msgpack_pack_uint64(&pk, m->slice.lo);
            msgpack_pack_uint64(&pk, m->slice.hi);
            msgpack_pack_uint32(&pk, m->slice.rank);
            msgpack_pack_uint32(&pk, m->slice.count);
            break;
        case FK_ADDR: {
            const ps_str *a = AT_C(m, f, ps_str);
            pack_strn(&pk, f->key, a->p ? a->p : "", a->p ? a->len : 0);
            break;
        }
        case FK_PMAP:
            if (m->pmap.n == 0 || m->pmap.n > PS_PARTS_MAX || m->pmap.dense == 0 || m->pmap.dense > m->pmap.n)
                return PS_EINVAL;
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, 3);
            msgpack_pack_uint64(&pk, m->pmap.epoch);
            msgpack_pack_uint32(&pk, m->pmap.dense);
            msgpack_pack_array(&pk, m->pmap.n);
            for (uint32_t j = 0; j < m->pmap.n; j++) {
                msgpack_pack_str(&pk, m->pmap.addrs[j].len);
                msgpack_pack_str_body(&pk, m->pmap.addrs[j].p, m->pmap.addrs[j].len);
            }
            break;
        case FK_ADDRS:
            if (m->nreplicas > PS_REPLICAS_MAX)
                return PS_ETOO_BIG;
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, m->nreplicas);
            for (uint32_t j = 0; j < m->nreplicas; j++) {
                msgpack_pack_str(&pk, m->replicas[j].len);
                msgpack_pack_str_body(&pk, m->replicas[j].p, m->replicas[j].len);
            }
            break;
        case FK_ARGS:
            if (m->nargs > PS_ARGS_MAX)
                return PS_ETOO_BIG;
            ps_pack_key(&pk, f->key);
            msgpack_pack_array(&pk, m->nargs);
            for (uint32_t j = 0; j < m->nargs; j++) {
                msgpack_pack_str(&pk, m->args[j].len);
                msgpack_pack_str_body(&pk, m->args[j].p, m->args[j].len);
            }
            break;
        case FK_BODY: {
            ps_pack_key(&pk, f->key);
            int rc = body(&pk, body_arg);
            if (rc != 0)
                return rc;
            break;
        }
        case FK_KEYS: {
            const ps_keys *k = AT_C(m, f, ps_keys);
            pack_binn(&pk, f->key, k->p, (size_t)k->n * 8);
            break;
        }
        case FK_HP: {
            const ps_hp *hp = AT_C(m, f, ps_hp);
            ps_pack_key(&pk, f->key);
            msgpack_pack_map(&pk, popcount64(hp->has & ((1u << PS_HP_COUNT) - 1)));
            for (uint32_t j = 0; j < PS_HP_COUNT; j++)
                if (hp->has & (1u << j))
                    ps_pack_kf64(&pk, ps_hp_name(j), hp->v[j]);
            break;
        }
        case FK_DATA:
            break;
        }
    }
    if (has & PS_F_DATA) {
        /* "pad" (4 bytes) + bin8 (2 + k bytes) + "data" (5) + bin32 header (5) */
        size_t start = out->len + 4 + 2 + 5 + 5;
        size_t k = (PS_DATA_ALIGN - start % PS_DATA_ALIGN) % PS_DATA_ALIGN;
        static const char zeros[PS_DATA_ALIGN] = {0};
        ps_pack_key(&pk, "pad");
        msgpack_pack_bin(&pk, k);
        msgpack_pack_bin_body(&pk, zeros, k);
        ps_pack_key(&pk, "data");
        uint8_t h[5] = {0xc6, (uint8_t)(dbytes >> 24), (uint8_t)(dbytes >> 16), (uint8_t)(dbytes >> 8),
                        (uint8_t)dbytes};
        if (ps_buf_write(out, (const char *)h, 5) != 0)
            return PS_ENOMEM;
    }
    if (out->len < PS_FRAME_HDR + 1 || out->len > out->cap)
        return PS_ENOMEM; /* a failed write inside the packer */
    uint64_t payload = out->len - PS_FRAME_HDR + dbytes;
    if (payload > PS_FRAME_MAX_HARD)
        return PS_ETOO_BIG;
    ps_frame_put_len(out->p, (uint32_t)payload);
    if (data_len)
        *data_len = (size_t)dbytes;
    return 0;
}

int ps_msg_encode_full(const ps_msg *m, ps_buf *out)
{
    size_t dlen = 0;
    int rc = ps_msg_encode(m, out, &dlen, NULL, NULL);
    if (rc != 0 || dlen == 0)
        return rc;
    if (ps_buf_reserve(out, dlen) != 0)
        return PS_ENOMEM;
    memcpy(out->p + out->len, ps_msg_data_bytes(m), dlen);
    out->len += dlen;
    return 0;
}


void ps_layout_pack(msgpack_packer *pk, const ps_layout *l)
{
    msgpack_pack_array(pk, l->ntensors);
    for (uint32_t i = 0; i < l->ntensors; i++) {
        const ps_tensor_desc *t = &l->t[i];
        /* a buffer: [name, dims, rule] (+ dtype when not F32) */
        msgpack_pack_array(pk, t->buf ? (t->save_dt ? 4 : 3) : 2);
        msgpack_pack_str(pk, strlen(t->name));
        msgpack_pack_str_body(pk, t->name, strlen(t->name));
        msgpack_pack_array(pk, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            msgpack_pack_uint32(pk, t->dims[d]);
        if (t->buf) {
            const char *r = ps_buf_name(t->buf);
            msgpack_pack_str(pk, strlen(r));
            msgpack_pack_str_body(pk, r, strlen(r));
        }
        if (t->buf && t->save_dt) {
            const char *dt = ps_save_dt_name(t->save_dt);
            msgpack_pack_str(pk, strlen(dt));
            msgpack_pack_str_body(pk, dt, strlen(dt));
        }
    }
}
