/* parts.c - the job's part map and a move of parts under way (PROTOCOL.md
 * 18): the verdict on each key of a table request, and the map WELCOME and
 * ERROR carry. Reads psd.parts; dispatch/move.c and connection/move.c
 * write it. */
#include "server/store/parts.h"

#include <stdio.h>
#include <string.h>

#include "proto/errors.h"
#include "proto/table.h"

static int bit(uint64_t set, int32_t i)
{
    return i >= 0 && i < 64 && (set >> i) & 1;
}

int srv_parts_key(const srv_parts *p, uint32_t part, uint32_t nparts, uint64_t key)
{
    if (!p->moving) {
        if (p->epoch == 0)
            return nparts <= 1 || ps_table_part(key, nparts) == part ? SRV_KEY_OWN : SRV_KEY_RANGE;
        return (int32_t)ps_table_part(key, p->n) == p->self ? SRV_KEY_OWN : SRV_KEY_MOVED;
    }
    int32_t was = (int32_t)ps_table_part(key, p->old_n), will = (int32_t)ps_table_part(key, p->new_n);
    if (will == p->new_self && p->new_self >= 0) {
        if (was == p->old_self)
            return SRV_KEY_OWN; /* it stays */
        return bit(p->handed, was) ? SRV_KEY_OWN : SRV_KEY_WAIT;
    }
    if (was == p->old_self && p->old_self >= 0)
        return bit(p->switched, will) ? SRV_KEY_MOVED : SRV_KEY_OWN; /* it leaves */
    return SRV_KEY_MOVED;
}

/* The parts this psd gives rows to: growing, the parts added; shrinking,
 * every part left, when this one goes. */
static uint64_t dests(const srv_parts *p)
{
    uint64_t b = 0;
    for (uint32_t d = 0; d < p->new_n && d < 64; d++)
        if (p->old_self >= 0 && (p->new_n > p->old_n ? d >= p->old_n : p->old_self >= (int32_t)p->new_n))
            b |= 1ull << d;
    return b;
}

/* Every destination of this source's rows took them over. */
static int all_switched(const srv_parts *p)
{
    return (p->switched & dests(p)) == dests(p);
}

/* The map a move goes to is the one psd serves under: it is a part the
 * move added, or every destination of its rows took them, or it took rows
 * from every source. */
static int serves_new(const srv_parts *p)
{
    if (!p->moving)
        return 0;
    if (p->old_self < 0)
        return 1;
    if (p->new_self < 0)
        return all_switched(p);
    return p->want ? p->handed == p->want : all_switched(p);
}

void srv_parts_put(const srv_parts *p, ps_msg *m, int moved)
{
    int fresh = serves_new(p) || (moved && p->moving); /* a key moved under the new map */
    uint64_t epoch = fresh ? p->mv_epoch : p->epoch;
    if (epoch == 0)
        return; /* the workers' own list: nothing to tell */
    const char (*addrs)[PS_ADDR_MAX + 1] = fresh ? p->new_addrs : p->addrs;
    m->pmap.epoch = epoch;
    m->pmap.dense = fresh ? p->new_dense : p->dense;
    m->pmap.n = fresh ? p->new_n : p->n;
    for (uint32_t i = 0; i < m->pmap.n; i++) {
        m->pmap.addrs[i].p = addrs[i];
        m->pmap.addrs[i].len = (uint32_t)strlen(addrs[i]);
    }
    m->has2 |= PS_F2_PMAP;
}

int srv_parts_table_only(const srv_parts *p)
{
    if (serves_new(p) || (p->moving && p->old_self < 0))
        return p->new_self >= (int32_t)p->new_dense;
    return p->epoch > 0 && p->self >= (int32_t)p->dense;
}

int srv_parts_declared(const srv_parts *p, uint32_t part, uint32_t nparts)
{
    if (!srv_parts_known(p))
        return 0;
    if (p->n > 0 && nparts == (p->n > 1 ? p->n : 1) && (int32_t)(p->n > 1 ? part : 0) == p->self && p->self >= 0)
        return 1;
    if (p->moving && p->new_self >= 0 && nparts == p->new_n && (int32_t)part == p->new_self)
        return 1;
    if (p->moving && p->old_self >= 0 && nparts == p->old_n && (int32_t)part == p->old_self)
        return 1;
    return 0;
}

void srv_parts_pack(msgpack_packer *pk, const srv_parts *p)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint64(pk, p->epoch);
    msgpack_pack_uint32(pk, p->dense);
    msgpack_pack_int32(pk, p->self);
    msgpack_pack_array(pk, p->n);
    for (uint32_t i = 0; i < p->n; i++) {
        msgpack_pack_str(pk, strlen(p->addrs[i]));
        msgpack_pack_str_body(pk, p->addrs[i], strlen(p->addrs[i]));
    }
}

int srv_parts_restore(srv_parts *p, const msgpack_object *o)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4)
        return -1;
    const msgpack_object *e = o->via.array.ptr, *a = &o->via.array.ptr[3];
    if (e[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || e[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        (e[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER && e[2].type != MSGPACK_OBJECT_NEGATIVE_INTEGER) ||
        a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size == 0 || a->via.array.size > PS_PARTS_MAX ||
        e[0].via.u64 == 0 || e[1].via.u64 == 0 || e[1].via.u64 > a->via.array.size ||
        e[2].via.i64 < -1 || e[2].via.i64 >= (int64_t)a->via.array.size)
        return -1;
    for (uint32_t i = 0; i < a->via.array.size; i++)
        if (a->via.array.ptr[i].type != MSGPACK_OBJECT_STR || a->via.array.ptr[i].via.str.size == 0 ||
            a->via.array.ptr[i].via.str.size > PS_ADDR_MAX)
            return -1;
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        memcpy(p->addrs[i], a->via.array.ptr[i].via.str.ptr, a->via.array.ptr[i].via.str.size);
        p->addrs[i][a->via.array.ptr[i].via.str.size] = '\0';
    }
    p->epoch = e[0].via.u64;
    p->dense = (uint32_t)e[1].via.u64;
    p->self = (int32_t)e[2].via.i64;
    p->n = a->via.array.size;
    return 0;
}

int srv_parts_new_index(const srv_parts *p, const char *addr)
{
    for (uint32_t i = 0; i < p->new_n; i++)
        if (strcmp(p->new_addrs[i], addr) == 0)
            return (int)i;
    return -1;
}

int srv_parts_parse(srv_parts *p, const char *list, char *err, size_t errlen)
{
    uint32_t n = 0;
    for (const char *q = list; *q;) {
        size_t len = strcspn(q, ",");
        if (len == 0 || len > PS_ADDR_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "the part list \"%.200s\" has an empty or too long address",
                           list);
        if (n == PS_PARTS_MAX)
            return ps_fail(err, errlen, PS_EBAD_FIELD, "the part list holds more than %u parts", PS_PARTS_MAX);
        memcpy(p->new_addrs[n], q, len);
        p->new_addrs[n][len] = '\0';
        for (uint32_t j = 0; j < n; j++)
            if (strcmp(p->new_addrs[j], p->new_addrs[n]) == 0)
                return ps_fail(err, errlen, PS_EBAD_FIELD, "the part list names %s twice", p->new_addrs[n]);
        n++;
        q += len + (q[len] == ',');
    }
    if (n == 0)
        return ps_fail(err, errlen, PS_EBAD_FIELD, "the part list is empty");
    p->new_n = n;
    return 0;
}
