/* table_mark.c - while rows leave this psd for other parts (a move of
 * parts, PROTOCOL.md 18; table_move.c gives them), every change of a
 * moving row marks its key for its destination here: a push or a new row,
 * a removal, and a removal moving the last row into the removed one's
 * place. table.c and table_mem.c call it from their changes; it calls
 * nothing of theirs. Owns psd.tables.mv's marks. */
#include "server/tables/table_rows.h"

#include <stdlib.h>
#include <string.h>

uint32_t tbl_move_dest(const struct srv_tables_move *mv, uint64_t key)
{
    return ps_table_part(key, mv->new_n);
}

static int dirty_grow(struct tbl_dirty *s)
{
    struct tbl_dirty old = *s;
    uint64_t cap = old.cap ? old.cap * 2 : 1024;
    s->keys = malloc(cap * sizeof *s->keys);
    s->tab = calloc(cap, sizeof *s->tab);
    if (!s->keys || !s->tab) {
        free(s->keys);
        free(s->tab);
        *s = old;
        return -1;
    }
    s->cap = cap;
    s->n = 0;
    for (uint64_t i = 0; i < old.cap; i++)
        if (old.tab[i])
            tbl_dirty_put(s, old.tab[i] - 1, old.keys[i]);
    free(old.keys);
    free(old.tab);
    return 0;
}

int tbl_dirty_put(struct tbl_dirty *s, uint32_t table, uint64_t key)
{
    if ((s->n + 1) * 2 > s->cap && dirty_grow(s) != 0)
        return -1;
    uint64_t m = s->cap - 1, i = ps_mix64(key ^ ((uint64_t)table << 56)) & m;
    for (; s->tab[i]; i = (i + 1) & m)
        if (s->tab[i] == table + 1 && s->keys[i] == key)
            return 0;
    s->tab[i] = table + 1;
    s->keys[i] = key;
    s->n++;
    return 0;
}

void tbl_move_touch(srv_tables *ts, const srv_table *t, uint64_t key)
{
    struct srv_tables_move *mv = ts->mv;
    uint32_t dest = tbl_move_dest(mv, key);
    if ((int32_t)dest == mv->self)
        return;
    uint32_t ti = 0; /* at most 64 tables, most jobs one or a few */
    while (ti < ts->n && ts->t[ti] != t)
        ti++;
    /* out of memory: the key is not given again, and the handover would
     * lose its change; the move fails instead (srv_tables_move_failed) */
    if (tbl_dirty_put(&mv->d[dest], ti, key) != 0)
        ts->mv_failed = 1;
}

int srv_tables_move_begin(srv_tables *ts, uint32_t new_n, int32_t self)
{
    if (ts->mv)
        return PS_ESTATE;
    struct srv_tables_move *mv = calloc(1, sizeof *mv);
    if (!mv)
        return PS_ENOMEM;
    mv->new_n = new_n;
    mv->self = self;
    ts->mv = mv;
    ts->mv_failed = 0;
    for (uint32_t i = 0; i < ts->n; i++)
        ts->t[i]->mv = ts;
    return 0;
}

void srv_tables_move_end(srv_tables *ts)
{
    struct srv_tables_move *mv = ts->mv;
    if (!mv)
        return;
    for (uint32_t d = 0; d < PS_PARTS_MAX; d++) {
        free(mv->d[d].keys);
        free(mv->d[d].tab);
    }
    free(mv);
    ts->mv = NULL;
    for (uint32_t i = 0; i < ts->n; i++)
        ts->t[i]->mv = NULL;
}

void srv_tables_move_restart(srv_tables *ts, uint32_t d)
{
    if (ts->mv && d < PS_PARTS_MAX) {
        memset(ts->mv->cur[d], 0, sizeof ts->mv->cur[d]);
        ts->mv->at[d] = 0;
    }
}

int srv_tables_move_pass_done(const srv_tables *ts, uint32_t d)
{
    return ts->mv && d < PS_PARTS_MAX && ts->mv->at[d] >= ts->n;
}

int srv_tables_move_failed(const srv_tables *ts)
{
    return ts->mv_failed;
}

uint64_t srv_tables_move_pending(const srv_tables *ts, uint32_t d)
{
    return ts->mv && d < PS_PARTS_MAX ? ts->mv->d[d].n : 0;
}

void tbl_move_rebuild(srv_tables *ts, struct tbl_dirty *s)
{
    struct tbl_dirty keep = *s;
    memset(s, 0, sizeof *s);
    for (uint64_t i = 0; i < keep.cap; i++)
        if (keep.tab[i] && tbl_dirty_put(s, keep.tab[i] - 1, keep.keys[i]) != 0)
            ts->mv_failed = 1;
    free(keep.keys);
    free(keep.tab);
}
