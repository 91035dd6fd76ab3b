/* move_cmd.c - a move of parts (PROTOCOL.md 18): the ADMIN commands psctl
 * sends every part (`move_begin`, `move_end`) and the one a destination
 * sends each source of its rows (`move_fetch`). A source answers a fetch
 * with its moving rows (tables/table_move.c); a fetch marked final is the
 * handover: from it on the source refuses that destination's keys
 * (MOVED), and what it answers then is the last of them. The fetching is
 * connection/move_fetch.c's (through psd.move_start). Writes psd.parts. */
#define _GNU_SOURCE
#include "server/dispatch/move_cmd.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/answer/reply.h"
#include "server/policy/policy.h"
#include "server/replog/replog.h"
#include "server/report/checkpoint.h"
#include "server/store/parts.h"

#define ANSWER_BYTES ((size_t)4 << 20) /* a fetch's answer: about 4 MiB of rows at most */

static uint64_t bits(uint32_t from, uint32_t to)
{
    uint64_t b = 0;
    for (uint32_t i = from; i < to && i < 64; i++)
        b |= 1ull << i;
    return b;
}

/* Why this psd cannot take part in a move; NULL when it can. */
static const char *cannot_move(const psd *s)
{
    if (s->policy->rounds)
        return "a move of parts needs mode asgd or ssp: a bsp round keeps table pushes across the parts";
    if (s->cfg.table_apply == PS_TABLE_APPLY_HOGWILD)
        return "a move of parts refuses table_apply = hogwild: rows change off psd's loop, where a move cannot "
               "see them";
    return NULL;
}

/* A follower takes part in a move through its leader's log alone
 * (srv_move_replay): a command sent to it is refused, naming the leader.
 * 1 when refused. */
static int on_follower(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    if (!s->follow)
        return 0;
    srv_send_error(c, m->id, PS_ENOT_LEADER, 0, "%s refused: this psd follows %s, which takes part in the move for "
                   "its part (its followers apply the move from its log)", m->cmd, s->cfg.replica_of);
    return 1;
}

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

static void end(psd *s);
static void call_off(psd *s);

/* The index of addr in a comma-separated list, or -1. */
static int index_in(const char (*addrs)[PS_ADDR_MAX + 1], uint32_t n, const char *addr)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(addrs[i], addr) == 0)
            return (int)i;
    return -1;
}

/* The old and new lists into q: q's old map in addrs/old_n, its new one
 * in new_addrs/new_n. 0, or PS_EBAD_FIELD with err. */
static int parse_lists(srv_parts *q, const char *oldl, const char *newl, char *err, size_t errlen)
{
    if (srv_parts_parse(q, oldl, err, errlen) != 0)
        return PS_EBAD_FIELD;
    q->old_n = q->new_n;
    memcpy(q->addrs, q->new_addrs, sizeof q->addrs);
    return srv_parts_parse(q, newl, err, errlen) != 0 ? PS_EBAD_FIELD : 0;
}

/* A source starts marking its moving rows: growing, every old part gives
 * rows; shrinking, those that go. 0 or a PS_E* code. */
static int mark_begin(psd *s, const srv_parts *q)
{
    if (q->old_self >= 0 && (q->new_n > q->old_n || q->old_self >= (int32_t)q->new_n))
        return srv_tables_move_begin(&s->tables, q->new_n, q->new_self);
    return 0;
}

/* The move to map epoch begins here (checked, marking begun): q holds the
 * lists, this psd's index in each and the dense parts; switched the
 * destinations a restarted source handed its rows to already. Logged for
 * the followers, who begin it as well but do not fetch. */
static void begin(psd *s, const srv_parts *q, uint64_t epoch, uint64_t rate, uint64_t switched, const char *oldl,
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
    p->want = q->new_self >= (int32_t)q->old_n ? bits(0, q->old_n)
              : q->new_n < q->old_n && q->new_self >= 0 ? bits(q->new_n, q->old_n) : 0;
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

/* move_begin EPOCH OLD NEW SELF RATE [DENSE [HANDED]]: the map goes from the
 * part list OLD to NEW (grown or shrunk at its end), SELF is this psd's
 * address in them, RATE the bytes a second a destination fetches at most
 * (0: no limit), DENSE the parts that hold the dense model (0 or absent:
 * the map's, or all of OLD), HANDED (a source that restarted during the
 * move) the new parts, comma-separated indices, that took its rows
 * already. Sent to every part
 * of either list; again with the same arguments, it is answered OK. */
static void cmd_move_begin(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    srv_parts *p = &s->parts;
    char self[PS_ADDR_MAX + 1], err[600];
    if (on_follower(c, m))
        return;
    char *oldl = malloc(PS_ARG_MAX + 1), *newl = malloc(PS_ARG_MAX + 1);
    if (!oldl || !newl) {
        free(oldl), free(newl);
        srv_send_error(c, m->id, PS_ENOMEM, 0, "move_begin: out of memory");
        return;
    }
    uint64_t epoch = srv_arg_u64(m, 0), rate = srv_arg_u64(m, 4);
    srv_arg_str(m, 1, oldl, PS_ARG_MAX + 1);
    srv_arg_str(m, 2, newl, PS_ARG_MAX + 1);
    srv_arg_str(m, 3, self, sizeof self);
    srv_parts q = {0};
    int code = 0;
    const char *why = cannot_move(s);
    if (m->nargs < 5 || !epoch || !self[0])
        code = ps_fail(err, sizeof err, PS_EBAD_FIELD, "move_begin: give EPOCH, OLD, NEW, SELF and RATE");
    else if (why)
        code = ps_fail(err, sizeof err, PS_EINVAL, "move_begin refused: %s", why);
    else
        code = parse_lists(&q, oldl, newl, err, sizeof err);
    if (code) {
        free(oldl), free(newl);
        srv_send_error(c, m->id, code, 0, "%s", err);
        return;
    }
    q.old_self = index_in(q.addrs, q.old_n, self);
    q.new_self = index_in(q.new_addrs, q.new_n, self);
    uint32_t shorter = q.old_n < q.new_n ? q.old_n : q.new_n;
    int prefix = q.old_n != q.new_n;
    for (uint32_t i = 0; i < shorter; i++)
        prefix &= strcmp(q.addrs[i], q.new_addrs[i]) == 0;
    /* the parts holding the dense model: the map's, or, from psctl, the
     * job's (a new part holds no map; without one every old part does) */
    uint64_t dense_arg = srv_arg_u64(m, 5);
    q.dense = p->epoch ? p->dense : dense_arg ? (uint32_t)dense_arg : q.old_n;
    if (p->moving) {
        if (p->mv_epoch == epoch && p->old_n == q.old_n && p->new_n == q.new_n && p->old_self == q.old_self &&
            p->new_self == q.new_self) {
            /* a destination whose fetching stopped (a source restarted,
             * say) fetches again from the sources that did not hand over */
            if (p->error[0] && p->want != p->handed && s->move_start) {
                p->error[0] = '\0';
                if (s->move_start(s, err, sizeof err) != 0)
                    snprintf(p->error, sizeof p->error, "%.390s", err);
                PS_LOG(PS_LOG_INFO, "move of parts: fetching again from the parts that did not hand their rows over");
            }
            srv_send_ok_text(c, m->id, "the move is under way already");
        } else
            srv_send_error(c, m->id, PS_ESTATE, 0, "move_begin refused: a move to map %" PRIu64 " is under way (%u "
                           "parts to %u); wait for it (psctl status)", p->mv_epoch, p->old_n, p->new_n);
    } else if (s->tables.drop.on) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_begin refused: this psd still drops the rows the last move took "
                       "away (psctl status); ask again in a moment");
    } else if (dense_arg && (dense_arg != q.dense || dense_arg > q.old_n)) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "move_begin: DENSE %" PRIu64 " is not the %u parts that hold the "
                       "dense model", dense_arg, q.dense);
    } else if (epoch != p->epoch + 1 && !(q.old_self < 0 && !p->epoch)) { /* a new part holds no map yet */
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_begin refused: this psd holds map %" PRIu64 ", so the next is %"
                       PRIu64 ", not %" PRIu64, p->epoch, p->epoch + 1, epoch);
    } else if (p->epoch && (p->n != q.old_n || index_in(p->addrs, p->n, self) != q.old_self)) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_begin refused: OLD is not the map this psd holds (%u parts, "
                       "this psd part %d)", p->n, p->self);
    } else if (!prefix) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "move_begin: NEW must be OLD with parts added or removed at its "
                       "end (a jump hash moves only those keys)");
    } else if (q.old_self < 0 && q.new_self < 0) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "move_begin: %s is in neither list", self);
    } else if (q.new_n < q.dense) {
        srv_send_error(c, m->id, PS_EINVAL, 0, "move_begin refused: part %u holds a part of the dense model, which "
                       "stays where it is: only parts a move added (past the first %u) can be removed online; "
                       "`psd --reshard-from` moves the dense model offline", q.new_n, q.dense);
    } else if (q.old_self < 0 && (s->model.has_layout || s->tables.n)) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_begin refused: %s joins the job as a new part but holds %s "
                       "already; start it fresh (no state_dir of another job)", self,
                       s->model.has_layout ? "a model" : "tables");
    } else {
        const char *bad = NULL;
        for (uint32_t i = 0; q.old_self >= 0 && i < s->tables.n && !bad; i++) {
            const ps_table_def *d = srv_tables_def(&s->tables, i);
            uint32_t want_n = q.old_n > 1 ? q.old_n : 1, want_p = q.old_n > 1 ? (uint32_t)q.old_self : 0;
            if (d->nparts != want_n || d->part != want_p)
                bad = d->name;
        }
        if (bad) {
            srv_send_error(c, m->id, PS_ELAYOUT, 0, "move_begin refused: this psd holds table '%s' as another part "
                           "than part %d of %u, where OLD puts %s", bad, q.old_self, q.old_n, self);
        } else if ((code = mark_begin(s, &q)) != 0) {
            srv_send_error(c, m->id, code, 0, "move_begin: %s", ps_strerror(code));
        }
        if (!bad && !code) {
            /* a source that restarted in the middle of a move: the
             * destinations that took its rows before hold them (psctl
             * tells): their keys stay refused here */
            uint64_t switched = 0;
            if (m->nargs > 6) {
                char h[PS_ARG_MAX + 1];
                srv_arg_str(m, 6, h, sizeof h);
                for (char *at = h; *at;) {
                    char *end;
                    unsigned long d = strtoul(at, &end, 10);
                    if (end == at)
                        break;
                    if (d < 64)
                        switched |= 1ull << d;
                    at = end + (*end == ',');
                }
            }
            begin(s, &q, epoch, rate, switched, oldl, newl);
            srv_send_ok_text(c, m->id, "move begun");
        }
    }
    free(oldl);
    free(newl);
}

/* The destinations (new parts, bits) this psd gives rows to: growing,
 * the parts added; shrinking, a part that goes gives to every part left. */
static uint64_t dests(const srv_parts *p)
{
    if (p->old_self < 0)
        return 0;
    uint64_t b = p->new_n > p->old_n ? bits(p->old_n, p->new_n)
                 : p->old_self >= (int32_t)p->new_n ? bits(0, p->new_n) : 0;
    return p->new_self >= 0 ? b & ~(1ull << p->new_self) : b;
}

/* Answers destination d's fetch (request id on c): its next rows; final,
 * the handover: from the first on, its keys are refused here. */
static void give(psd *s, srv_conn *c, uint64_t id, int d, size_t max, int final)
{
    srv_parts *p = &s->parts;
    ps_buf out = {0};
    int pass_done = 0;
    uint64_t rows = 0;
    int first = final && !((p->switched >> d) & 1);
    if (first) {
        p->switched |= 1ull << d; /* from now on its keys are refused: what follows is the last of them */
        log_move(s, 's', (uint32_t)d, 0, NULL, 0);
    }
    int rc = srv_tables_move_gather(&s->tables, (uint32_t)d, max, final, &out, &pass_done, &rows);
    if (rc != 0) {
        ps_buf_free(&out);
        srv_send_error(c, id, rc, 0, "move_fetch: %s", ps_strerror(rc));
        return;
    }
    uint64_t ver = final ? (srv_tables_move_pending(&s->tables, (uint32_t)d) ? 2 : 3) : pass_done ? 1 : 0;
    if (first)
        PS_LOG(PS_LOG_INFO, "move of parts: handing part %d's rows over to %s; its keys are refused here from "
               "now on", d, p->new_addrs[d]);
    p->rows_out += rows;
    p->bytes_out += out.len;
    srv_send_bytes(c, id, ver, out.p, out.len, NULL, NULL);
    ps_buf_free(&out);
}

/* move_fetch DEST EPOCH FINAL [START [MAX]]: the destination at DEST asks
 * for its rows; FINAL 1 is the handover; START 1 (a destination's first
 * fetch) starts its pass over, so that one that restarted empty gets every
 * row again (after a handover too: those keys stay refused until it has
 * them); MAX bounds the answer's bytes (about: one row more), at most 4 MiB. Answered with PARAMS whose data is
 * srv_tables_move_gather's bytes and whose `ver` says: 0 the pass goes on,
 * 1 the pass is over (what follows is rows changed since), 2 handed over,
 * more to come, 3 handed over, all given. */
static void cmd_move_fetch(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    srv_parts *p = &s->parts;
    char dest[PS_ADDR_MAX + 1];
    if (on_follower(c, m))
        return;
    c->mover = 1; /* its answers wait for the followers, as a worker's replies (connection/write.c) */
    srv_arg_str(m, 0, dest, sizeof dest);
    uint64_t epoch = srv_arg_u64(m, 1), final = srv_arg_u64(m, 2), first_fetch = srv_arg_u64(m, 3), most = srv_arg_u64(m, 4);
    size_t max = most && most < ANSWER_BYTES ? (size_t)most : ANSWER_BYTES;
    int d = p->moving ? srv_parts_new_index(p, dest) : -1;
    if (!p->moving || epoch != p->mv_epoch || p->old_self < 0 || d < 0 || d == p->new_self) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_fetch: this psd gives %s no rows (no move to map %" PRIu64
                       " under way here, or %s is not one of its destinations)", dest, epoch, dest);
        return;
    }
    if (srv_tables_move_failed(&s->tables)) {
        srv_send_error(c, m->id, PS_ENOMEM, 0, "move_fetch: this psd ran out of memory marking the rows that "
                       "changed: what it gave is not its rows; stop the move (restart the new part)");
        return;
    }
    if (first_fetch) {
        srv_tables_move_restart(&s->tables, (uint32_t)d);
        PS_LOG(PS_LOG_INFO, "move of parts: %s fetches its rows from the start", dest);
    }
    if (final && !srv_tables_move_pass_done(&s->tables, (uint32_t)d)) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_fetch: the handover before %s has every row of the pass (this "
                       "psd restarted?): fetch from the start", dest);
        return;
    }
    if (first_fetch)
        p->park_cid[d] = 0; /* a final fetch held for a session that ended */
    uint64_t due = dests(p) & ~p->switched;
    if (final && ((due >> d) & 1) && __builtin_popcountll(due) > 1) {
        /* several destinations (a part removed: every part left takes
         * some of its rows): each one's final fetch waits for the others',
         * so that they all hand over at once. A worker's step sends keys
         * to every destination, and one not handed over yet holds it
         * (NOT_READY): handovers apart held steps the time between them */
        p->park_cid[d] = c->cid;
        p->park_id[d] = m->id;
        p->park_max[d] = max;
        for (uint32_t e = 0; e < PS_PARTS_MAX; e++)
            if (((due >> e) & 1) && (!p->park_cid[e] || !srv_conn_by_cid(s, p->park_cid[e])))
                return; /* answered when the last one asks */
        PS_LOG(PS_LOG_INFO, "move of parts: every destination asked for its handover: all at once");
        for (uint32_t e = 0; e < PS_PARTS_MAX; e++)
            if ((due >> e) & 1) {
                srv_conn *pc = srv_conn_by_cid(s, p->park_cid[e]);
                p->park_cid[e] = 0;
                if (pc) /* (gone meanwhile: it asks again, alone then) */
                    give(s, pc, p->park_id[e], (int)e, p->park_max[e], 1);
            }
        return;
    }
    give(s, c, m->id, d, max, final != 0);
}

/* What keeps the move from ending here; NULL when nothing does. */
static const char *unfinished(const srv_parts *p, char *buf, size_t len)
{
    if (p->want && p->handed != p->want) {
        snprintf(buf, len, "this psd has not taken every row yet (%d of %d sources handed over)",
                 __builtin_popcountll(p->handed), __builtin_popcountll(p->want));
        return buf;
    }
    uint64_t due = dests(p) & ~p->switched;
    for (uint32_t d = 0; d < p->new_n; d++)
        if ((due >> d) & 1) {
            snprintf(buf, len, "part %u (%s) has not taken its rows from this psd yet", d, p->new_addrs[d]);
            return buf;
        }
    return NULL;
}

/* move_end EPOCH: every part took its rows: the new map is the map. */
static void cmd_move_end(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    srv_parts *p = &s->parts;
    uint64_t epoch = srv_arg_u64(m, 0);
    char why[200];
    if (on_follower(c, m))
        return;
    if (!p->moving && p->epoch == epoch && epoch) {
        srv_send_ok_text(c, m->id, "the move is over already");
        return;
    }
    if (!p->moving || epoch != p->mv_epoch) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_end: no move to map %" PRIu64 " under way here", epoch);
        return;
    }
    if (unfinished(p, why, sizeof why)) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_end: not yet: %s", why);
        return;
    }
    end(s);
    srv_send_ok_text(c, m->id, s->parts.self >= 0 ? "the new map holds" : "this psd is no longer a part of the job");
}

/* The new map is the map: the rows that left go, a few at a time on a
 * leader (each batch logged: srv_move_dropped), at its log's pace on a
 * follower. */
static void end(psd *s)
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

/* move_abort EPOCH: a move none of whose rows was handed over yet is
 * called off: the map stays, a destination forgets the rows it took, a
 * source stops marking its rows. After a handover it is refused: those
 * keys' new part holds them now, so the move is finished instead. */
static void cmd_move_abort(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    srv_parts *p = &s->parts;
    uint64_t epoch = srv_arg_u64(m, 0);
    if (on_follower(c, m))
        return;
    if (!p->moving || epoch != p->mv_epoch) {
        srv_send_ok_text(c, m->id, "no such move under way here");
        return;
    }
    if (p->handed || p->switched) {
        srv_send_error(c, m->id, PS_ESTATE, 0, "move_abort refused: rows were handed over already (their new part "
                       "holds them): finish the move instead (psctl parts ... again)");
        return;
    }
    call_off(s);
    srv_send_ok_text(c, m->id, "move called off");
}

static void call_off(psd *s)
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
        int rc = parse_lists(&q, oldl, newl, err, errlen);
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
        if ((rc = mark_begin(s, &q)) != 0)
            return ps_fail(err, errlen, rc, "the leader's move does not begin here: %s", ps_strerror(rc));
        begin(s, &q, v, get64(b), get64(b + 20), oldl, newl);
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
            end(s);
        else
            call_off(s);
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

const srv_move_command srv_move_commands[] = {
    {"move_abort", cmd_move_abort},
    {"move_begin", cmd_move_begin},
    {"move_fetch", cmd_move_fetch},
    {"move_end", cmd_move_end},
    {NULL, NULL},
};
