/* move_cmd.c - a move of parts (PROTOCOL.md 18): the ADMIN commands psctl
 * sends every part (`move_begin`, `move_end`) and the one a destination
 * sends each source of its rows (`move_fetch`). A source answers a fetch
 * with its moving rows (tables/table_move.c); a fetch marked final is the
 * handover: from it on the source refuses that destination's keys
 * (MOVED), and what it answers then is the last of them. The fetching is
 * connection/move_fetch.c's (through psd.move_start); what a move changes
 * here, and its log for the followers, move_state.c's. Writes psd.parts. */
#define _GNU_SOURCE
#include "server/dispatch/move_cmd.h"
#include "server/dispatch/move_state.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "proto/errors.h"
#include "server/answer/reply.h"
#include "server/policy/policy.h"
#include "server/store/parts.h"

#define ANSWER_BYTES ((size_t)4 << 20) /* a fetch's answer: about 4 MiB of rows at most */

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

/* The index of addr in a comma-separated list, or -1. */
static int index_in(const char (*addrs)[PS_ADDR_MAX + 1], uint32_t n, const char *addr)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(addrs[i], addr) == 0)
            return (int)i;
    return -1;
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
        code = srv_move_parse_lists(&q, oldl, newl, err, sizeof err);
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
        } else if ((code = srv_move_mark_begin(s, &q)) != 0) {
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
            srv_move_begin(s, &q, epoch, rate, switched, oldl, newl);
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
    uint64_t b = p->new_n > p->old_n ? srv_move_bits(p->old_n, p->new_n)
                 : p->old_self >= (int32_t)p->new_n ? srv_move_bits(0, p->new_n) : 0;
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
        srv_move_switch(s, d); /* from now on its keys are refused: what follows is the last of them */
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
    srv_move_end(s);
    srv_send_ok_text(c, m->id, s->parts.self >= 0 ? "the new map holds" : "this psd is no longer a part of the job");
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
    srv_move_call_off(s);
    srv_send_ok_text(c, m->id, "move called off");
}

const srv_move_command srv_move_commands[] = {
    {"move_abort", cmd_move_abort},
    {"move_begin", cmd_move_begin},
    {"move_fetch", cmd_move_fetch},
    {"move_end", cmd_move_end},
    {NULL, NULL},
};
