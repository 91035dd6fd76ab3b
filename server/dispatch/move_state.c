/* move_state.c - what a move of parts (PROTOCOL.md 18) changes on this
 * psd, whoever asks: the commands (move_cmd.c) on a leader, the leader's
 * replication log (record 'M', PROTOCOL.md 17) on its followers. Each
 * change is logged as it is made, so a follower holds the rows, in the
 * same places, and the map as its leader did, and one promoted during a
 * move takes it up (srv_move_resume). Writes psd.parts. */
#define _GNU_SOURCE
#include "server/dispatch/move_state.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/replog/replog.h"
#include "server/report/checkpoint.h"
#include "server/store/parts.h"

/* ---- the move in the replication log ----------------------------------------
 * A part's followers apply what a move changes on their leader, in order
 * with its pushes (PROTOCOL.md 17, record 'M'): what, then a, b and bytes:
 * begun ('b': epoch, rate, and the lists), a destination switched here ('s':
 * d), rows taken ('R', 'D', 'P', 'H': a destination's apply_item kinds,
 * the source, its answer), rows dropped ('x': how many looked at), ended
 * ('e') and called off ('a'). So a follower promoted during a move or after
 * it holds the rows, their places and the map as its leader did. */
enum { MV_HEAD = 13 };

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static void log_move(psd *s, int what, uint32_t a, uint64_t b, const void *data, size_t len)
{
    uint8_t head[MV_HEAD];
    head[0] = (uint8_t)what;
    memcpy(head + 1, &a, 4);
    put64(head + 5, b);
    srv_replog_move(s, head, sizeof head, data, len);
}


/* The old and new lists into q: q's old map in addrs/old_n, its new one
 * in new_addrs/new_n. 0, or PS_EBAD_FIELD with err. */
int srv_move_parse_lists(srv_parts *q, const char *oldl, const char *newl, char *err, size_t errlen)
{
    if (srv_parts_parse(q, oldl, err, errlen) != 0)
        return PS_EBAD_FIELD;
    q->old_n = q->new_n;
    memcpy(q->addrs, q->new_addrs, sizeof q->addrs);
    return srv_parts_parse(q, newl, err, errlen) != 0 ? PS_EBAD_FIELD : 0;
}

/* A source starts marking its moving rows: growing, every old part gives
 * rows; shrinking, those that go. 0 or a PS_E* code. */
int srv_move_mark_begin(psd *s, const srv_parts *q)
{
    if (q->old_self >= 0 && (q->new_n > q->old_n || q->old_self >= (int32_t)q->new_n))
        return srv_tables_move_begin(&s->tables, q->new_n, q->new_self);
    return 0;
}

/* The move to map epoch begins here (checked, marking begun): q holds the
 * lists, this psd's index in each and the dense parts; switched the
 * destinations a restarted source handed its rows to already. Logged for
 * the followers, who begin it as well but do not fetch. */
void srv_move_begin(psd *s, const srv_parts *q, uint64_t epoch, uint64_t rate, uint64_t switched, const char *oldl,
                  const char *newl)
{
    srv_parts *p = &s->parts;
    char err[400];
    /* the map psd held before (the workers' list when none) */
    if (!p->epoch) {
        p->n = q->old_n;
        p->dense = q->dense;
        memcpy(p->addrs, q->addrs, sizeof p->addrs);
    }
    p->self = q->old_self;
    p->mv_epoch = epoch;
    p->old_n = q->old_n;
    p->new_n = q->new_n;
    p->new_dense = p->dense;
    p->old_self = q->old_self;
    p->new_self = q->new_self;
    memcpy(p->new_addrs, q->new_addrs, sizeof p->new_addrs);
    /* growing, the parts added take rows from every old one;
     * shrinking, the parts left take the rows of those that go */
    p->want = q->new_self >= (int32_t)q->old_n ? srv_move_bits(0, q->old_n)
              : q->new_n < q->old_n && q->new_self >= 0 ? srv_move_bits(q->new_n, q->old_n) : 0;
    p->handed = 0;
    p->switched = switched;
    memset(p->park_cid, 0, sizeof p->park_cid);
    p->rate = rate;
    p->rows_out = p->bytes_out = p->rows_in = p->bytes_in = p->pause_ms_max = 0;
    memset(p->src, 0, sizeof p->src);
    p->error[0] = '\0';
    p->started_ms = srv_now_ms();
    p->ended_ms = 0;
    p->moving = 1;
    if (s->replog) {
        size_t lo = strlen(oldl) + 1, ln = strlen(newl) + 1;
        uint8_t *b = malloc(8 + 4 + 4 + 4 + 8 + lo + ln);
        if (b) {
            int32_t os = q->old_self, ns = q->new_self;
            put64(b, rate);
            memcpy(b + 8, &q->dense, 4);
            memcpy(b + 12, &os, 4);
            memcpy(b + 16, &ns, 4);
            put64(b + 20, switched);
            memcpy(b + 28, oldl, lo);
            memcpy(b + 28 + lo, newl, ln);
            log_move(s, 'b', 0, epoch, b, 28 + lo + ln);
            free(b);
        } else {
            PS_LOG(PS_LOG_ERROR, "move of parts: no memory to log the move's beginning: the followers start over");
            srv_replog_free(s);
        }
    }
    if (p->want && !s->follow && (!s->move_start || s->move_start(s, err, sizeof err) != 0)) {
        snprintf(p->error, sizeof p->error, "%.390s", s->move_start ? err : "no fetching here");
        PS_LOG(PS_LOG_ERROR, "move of parts: %s", p->error);
    }
    PS_LOG(PS_LOG_INFO, "move of parts to map %" PRIu64 " begins: %u parts to %u (%s); this psd is part %d of the "
           "old map and %d of the new%s", epoch, q->old_n, q->new_n, newl, q->old_self, q->new_self,
           !p->want ? "" : s->follow ? ", and its leader takes rows from the parts that give them"
                                     : ", and takes rows from the parts that give them");
}

void srv_move_switch(psd *s, int d)
{
    s->parts.switched |= 1ull << d; /* from now on its keys are refused: what follows is the last of them */
    log_move(s, 's', (uint32_t)d, 0, NULL, 0);
}

/* The new map is the map: the rows that left go, a few at a time on a
 * leader (each batch logged: srv_move_drop_more), at its log's pace on a
 * follower. */
void srv_move_end(psd *s)
{
    srv_parts *p = &s->parts;
    log_move(s, 'e', 0, p->mv_epoch, NULL, 0);
    if (s->move_stop)
        s->move_stop(s);
    uint64_t before = 0;
    for (uint32_t i = 0; i < s->tables.n; i++) {
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        before += st.rows;
    }
    srv_tables_move_end(&s->tables);
    if (p->old_self >= 0) {
        /* the rows that left are refused by key from now on, and dropped a
         * few milliseconds a turn of the loop (connection/move_fetch.c):
         * dropped at once, a source's million rows held its workers a
         * second */
        srv_tables_drop_begin(&s->tables, p->new_n, p->new_self);
        if (s->follow) {
            /* a follower drops as its leader's log says */
        } else if (s->move_drop) {
            s->move_drop(s);
        } else {
            srv_move_drop_more(s, UINT64_MAX);
        }
    }
    if (p->new_self >= 0)
        srv_tables_set_part(&s->tables, (uint32_t)p->new_self, p->new_n);

    p->epoch = p->mv_epoch;
    p->n = p->new_n;
    p->dense = p->new_dense;
    p->self = p->new_self;
    memcpy(p->addrs, p->new_addrs, sizeof p->addrs);
    p->moving = 0;
    p->ended_ms = srv_now_ms();
    PS_LOG(PS_LOG_INFO, "move of parts to map %" PRIu64 " is over after %.1f s: %u parts; this psd is part %d; rows "
           "given %" PRIu64 " (%" PRIu64 " bytes), taken %" PRIu64 " (%" PRIu64 " bytes); %" PRIu64 " rows in its "
           "tables%s",
           p->epoch, (double)(p->ended_ms - p->started_ms) / 1e3, p->n, p->self, p->rows_out, p->bytes_out,
           p->rows_in, p->bytes_in, before, p->old_self >= 0 ? ", of which those that left are being dropped" : "");
    /* a new part's rows are written at once (with state_dir): until its
     * first checkpoint they live only in its memory */
    if (p->old_self < 0 && p->self >= 0)
        srv_checkpoint_start(s, 1);
}

int srv_move_drop_more(psd *s, uint64_t budget_us)
{
    int done = 0;
    while (!done) {
        uint64_t steps = 0;
        done = srv_tables_drop_some(&s->tables, budget_us < 1000000 ? budget_us : 1000000, &steps);
        log_move(s, 'x', 0, steps, NULL, 0);
        if (budget_us < 1000000)
            break;
    }
    return done;
}

void srv_move_call_off(psd *s)
{
    srv_parts *p = &s->parts;
    uint64_t epoch = p->mv_epoch;
    log_move(s, 'a', 0, epoch, NULL, 0);
    if (s->move_stop)
        s->move_stop(s);
    srv_tables_move_end(&s->tables);
    if (p->old_self < 0) { /* a new part: as fresh as it came */
        srv_tables_free(&s->tables);
        srv_tables_init(&s->tables, 0);
        srv_tables_configure(&s->tables, &s->cfg);
    } else if (p->want) { /* the rows taken go: their part is still the old one */
        srv_tables_move_drop(&s->tables, p->old_n, p->old_self);
    }
    p->moving = 0;
    p->error[0] = '\0';
    PS_LOG(PS_LOG_INFO, "move of parts to map %" PRIu64 " called off: the map stays", epoch);
}


/* What a destination's fetching brought, applied in order (kind: 'D' a
 * session with source src_i begins: what it gave before goes; 'R' rows,
 * b[0..len) its answer; 'P' its pass is over; 'H' it handed over, its keys
 * waited pause_ms): the leader's through connection/move_fetch.c, logged
 * for its followers, a follower's from that log. 0, or the code of rows
 * that did not apply, with err. */
static int take(psd *s, int kind, uint32_t src_i, const uint8_t *b, size_t len, uint64_t pause_ms, char *err,
                size_t errlen)
{
    srv_parts *p = &s->parts;
    srv_move_src *src = &p->src[src_i];
    int rc = 0;
    switch (kind) {
    case 'R': {
        uint64_t rows = 0;
        srv_tables_configure(&s->tables, &s->cfg);
        rc = srv_tables_move_apply(&s->tables, b, len, (uint32_t)p->new_self, p->new_n, &rows, err, errlen);
        src->rows += rows;
        src->bytes += len;
        p->rows_in += rows;
        p->bytes_in += len;
        if (rc != 0 && !src->failed) {
            /* its fetching stops before the handover (which waits for
             * every answer to be applied), so the source keeps every row
             * until a session fetches them anew */
            src->failed = 1;
            if (!p->error[0])
                snprintf(p->error, sizeof p->error, "rows from part %u: %.300s", src_i, err);
            PS_LOG(PS_LOG_ERROR, "move of parts: rows from part %u: %s; its fetching stops (the source keeps its "
                   "rows): mend that and run the command again, or call the move off", src_i, err);
        }
        break;
    }
    case 'D':
        if (src->rows) {
            PS_LOG(PS_LOG_INFO, "move of parts: fetching part %u's rows from the start: the %" PRIu64 " taken "
                   "before are dropped", src_i, src->rows);
            srv_tables_move_drop_from(&s->tables, p->old_n, src_i);
        }
        src->rows = src->bytes = 0;
        src->state = 0;
        src->failed = 0;
        break;
    case 'P':
        src->state = 1;
        PS_LOG(PS_LOG_INFO, "move of parts: part %u's pass is over (%" PRIu64 " rows taken); its rows changed since "
               "follow, then the handover", src_i, src->rows);
        break;
    case 'H':
        if (src->failed) {
            PS_LOG(PS_LOG_ERROR, "move of parts: part %u handed its rows over, but some could not be applied here: "
                   "not taken (they are fetched anew when the move is run again)", src_i);
            break;
        }
        src->state = 2;
        p->handed |= 1ull << src_i;
        if (pause_ms > p->pause_ms_max)
            p->pause_ms_max = pause_ms;
        PS_LOG(PS_LOG_INFO, "move of parts: took part %u's rows over (%" PRIu64 " rows, %" PRIu64 " bytes; its "
               "keys waited %" PRIu64 " ms for the handover)", src_i, src->rows, src->bytes, pause_ms);
        break;
    default:
        snprintf(p->error, sizeof p->error, "part %u refused: %.300s", src_i, b ? (const char *)b : "?");
        PS_LOG(PS_LOG_ERROR, "move of parts: %s", p->error);
        return 0;
    }
    return rc;
}


int srv_move_take(psd *s, int kind, uint32_t src, const uint8_t *b, size_t len, uint64_t pause_ms)
{
    char err[400];
    int rc = take(s, kind, src, b, len, pause_ms, err, sizeof err);
    if (kind == 'R' || kind == 'D' || kind == 'P' || kind == 'H')
        log_move(s, kind, src, kind == 'R' ? (uint64_t)(rc != 0) : pause_ms, b, kind == 'R' ? len : 0);
    return rc;
}

int srv_move_replay(psd *s, const uint8_t *r, size_t len, char *err, size_t errlen)
{
    srv_parts *p = &s->parts;
    if (len < MV_HEAD)
        return ps_fail(err, errlen, PS_EMALFORMED, "a move record of %zu bytes", len);
    int what = r[0];
    uint32_t a = get32(r + 1);
    uint64_t v = get64(r + 5);
    const uint8_t *b = r + MV_HEAD;
    size_t n = len - MV_HEAD;
    if (what != 'b' && what != 'x' && !p->moving)
        return ps_fail(err, errlen, PS_ESTATE, "the leader's move record '%c' came with no move under way here", what);
    switch (what) {
    case 'b': {
        if (p->moving)
            return ps_fail(err, errlen, PS_ESTATE, "the leader began a move while one is under way here");
        const char *oldl = (const char *)b + 28, *newl;
        size_t lo = n > 28 ? strnlen(oldl, n - 28) : 0, ln = 0;
        if (n <= 28 || lo == n - 28 || (ln = strnlen(newl = oldl + lo + 1, n - 28 - lo - 1)) == n - 28 - lo - 1)
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's beginning of %zu bytes without its two lists", n);
        srv_parts q = {0};
        int rc = srv_move_parse_lists(&q, oldl, newl, err, errlen);
        if (rc != 0)
            return rc;
        int32_t os, ns;
        memcpy(&q.dense, b + 8, 4);
        memcpy(&os, b + 12, 4);
        memcpy(&ns, b + 16, 4);
        if (os < -1 || ns < -1 || os >= (int32_t)q.old_n || ns >= (int32_t)q.new_n || (os < 0 && ns < 0))
            return ps_fail(err, errlen, PS_EMALFORMED, "a move's beginning puts this part at %d of %u and %d of %u",
                           os, q.old_n, ns, q.new_n);
        q.old_self = os;
        q.new_self = ns;
        if ((rc = srv_move_mark_begin(s, &q)) != 0)
            return ps_fail(err, errlen, rc, "the leader's move does not begin here: %s", ps_strerror(rc));
        srv_move_begin(s, &q, v, get64(b), get64(b + 20), oldl, newl);
        return 0;
    }
    case 's':
        if (a >= PS_PARTS_MAX)
            return ps_fail(err, errlen, PS_EMALFORMED, "a handover to part %u", a);
        p->switched |= 1ull << a;
        return 0;
    case 'R':
    case 'D':
    case 'P':
    case 'H': {
        if (a >= PS_PARTS_MAX)
            return ps_fail(err, errlen, PS_EMALFORMED, "rows taken from part %u", a);
        int rc = take(s, what, a, b, n, what == 'R' ? 0 : v, err, errlen);
        /* rows the leader could not apply either: as it stopped, so does this */
        return what == 'R' && v == 0 ? rc : 0;
    }
    case 'x':
        srv_tables_drop_steps(&s->tables, v);
        return 0;
    case 'e':
    case 'a':
        if (v != p->mv_epoch)
            return ps_fail(err, errlen, PS_ESTATE, "the leader's move to map %" PRIu64 " %s, this psd's is to %"
                           PRIu64, v, what == 'e' ? "ended" : "was called off", p->mv_epoch);
        if (what == 'e')
            srv_move_end(s);
        else
            srv_move_call_off(s);
        return 0;
    default:
        return ps_fail(err, errlen, PS_EMALFORMED, "a move record of unknown kind %u", (unsigned)what);
    }
}

void srv_move_resume(psd *s)
{
    srv_parts *p = &s->parts;
    char err[400];
    if (p->moving && p->want && p->want != p->handed && s->move_start) {
        if (s->move_start(s, err, sizeof err) != 0) {
            snprintf(p->error, sizeof p->error, "%.390s", err);
            PS_LOG(PS_LOG_ERROR, "move of parts: %s", p->error);
        } else {
            PS_LOG(PS_LOG_INFO, "move of parts: this psd, promoted, fetches the rows of the parts that did not hand "
                   "them over yet, from the start");
        }
    }
    if (s->tables.drop.on && s->move_drop)
        s->move_drop(s);
}

void srv_move_forget(psd *s)
{
    srv_parts *p = &s->parts;
    if (s->move_stop)
        s->move_stop(s);
    if (p->moving)
        srv_tables_move_end(&s->tables);
    p->moving = 0;
}
