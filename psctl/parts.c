/* parts.c - `psctl parts add HOST:PORT [RATE]` and `psctl parts remove
 * [RATE]`: a move of a running job's parts (PROTOCOL.md 18), run from
 * here as redis-cli runs a cluster's resharding. psctl checks the parts,
 * sends every one `move_begin` (the sources of rows first), waits while
 * the destinations fetch their rows (printing their progress), and sends
 * every one `move_end`. Run again after an interruption with the same
 * arguments, it takes the move up where it is. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/errors.h"
#include "psctl/psctl.h"

#define DEFAULT_RATE (256ull << 20) /* bytes a second a destination fetches */
#define POLL_MS 200

static int status_of(session *s, const char *addr, ps_msg *r, const msgpack_object **parts)
{
    int st = psctl_ask(s, PS_MSG_STATUS, PS_MSG_STATUS_REPLY, "status", r);
    if (st != EXIT_OK)
        return st;
    *parts = ps_map_get(r->body, "parts");
    if (!*parts) {
        fprintf(stderr, "psctl: psd at %s knows nothing of moving parts (an older psd?)\n", addr);
        return EXIT_REMOTE;
    }
    return EXIT_OK;
}

static int open_one(session *s, const char *addr, const ps_token *token, int timeout)
{
    ps_conn_init(&s->c);
    s->timeout = timeout;
    s->token = *token;
    int rc = psctl_open(s, addr);
    return rc ? psctl_report(&s->c, rc, timeout) : EXIT_OK;
}

static int admin(session *s, const char *addr, const char *cmd, char **args, int nargs)
{
    ps_msg r;
    int rc = psctl_admin(s, cmd, args, nargs, &r);
    if (rc != 0) {
        fprintf(stderr, "psctl: %s at %s: %s\n", cmd, addr, ps_conn_error(&s->c));
        return psctl_exit_code(rc);
    }
    return EXIT_OK;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t parse_rate(const char *s, int *bad)
{
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1024, end++;
    else if (*end == 'M')
        mul = 1024 * 1024, end++;
    else if (*end == 'G')
        mul = 1024.0 * 1024 * 1024, end++;
    *bad = !(v >= 0) || *end || !isfinite(v);
    return (uint64_t)(v * mul);
}

/* The map's addresses in status body pm (key "addrs", or the move's
 * under "move"), when it holds want of them, into ids; 1 when it did. */
static int map_ids(const msgpack_object *pm, const char *key, uint32_t want, char (*ids)[300])
{
    const msgpack_object *a = pm ? ps_map_get(pm, key) : NULL;
    if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size != want)
        return 0;
    for (uint32_t i = 0; i < want; i++)
        if (a->via.array.ptr[i].type != MSGPACK_OBJECT_STR || a->via.array.ptr[i].via.str.size >= 300)
            return 0;
    for (uint32_t i = 0; i < want; i++)
        snprintf(ids[i], 300, "%.*s", (int)a->via.array.ptr[i].via.str.size, a->via.array.ptr[i].via.str.ptr);
    return 1;
}

/* list[0..n) as "A,B,C" into out (cap bytes, cut when longer). */
static void join(char *out, size_t cap, char (*list)[300], uint32_t n)
{
    size_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = strlen(list[i]);
        if (at + len + 2 > cap)
            break;
        if (i)
            out[at++] = ',';
        memcpy(out + at, list[i], len);
        at += len;
    }
    out[at] = '\0';
}

int psctl_parts_check(char **args, int nargs)
{
    int bad = 0;
    if (strcmp(args[0], "add") == 0 && (nargs == 2 || nargs == 3)) {
        if (nargs == 3)
            parse_rate(args[2], &bad);
    } else if (strcmp(args[0], "remove") == 0 && (nargs == 1 || nargs == 2)) {
        if (nargs == 2)
            parse_rate(args[1], &bad);
    } else if (strcmp(args[0], "abort") == 0 && nargs <= 2) {
    } else {
        fprintf(stderr, "psctl: parts add HOST:PORT [RATE], parts remove [RATE] or parts abort [HOST:PORT]\n");
        return EXIT_USAGE;
    }
    if (bad) {
        fprintf(stderr, "psctl: RATE is bytes a second, as 64M or 1G (0: no limit)\n");
        return EXIT_USAGE;
    }
    return EXIT_OK;
}

/* parts abort [HOST:PORT]: every part that answers (and the new part
 * HOST:PORT) calls the move off, which each does only while none of its
 * rows was handed over. */
static int parts_abort(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout,
                       const psctl_call *k)
{
    static session extra;
    uint32_t total = n + (k->nargs == 2);
    uint64_t epoch = 0;
    int status = EXIT_OK, reached = 0;
    for (uint32_t i = 0; i < total; i++) {
        session *s = i < n ? &ss[i] : &extra;
        const char *addr = i < n ? list[i] : k->args[1];
        ps_msg r;
        const msgpack_object *pm;
        if (open_one(s, addr, token, timeout) != EXIT_OK) {
            fprintf(stderr, "psctl: %s does not answer: it is left out (a psd that restarts holds no move)\n", addr);
            continue;
        }
        if (status_of(s, addr, &r, &pm) == EXIT_OK && psctl_flag(pm, "moving"))
            epoch = (uint64_t)psctl_num(ps_map_get(pm, "move"), "epoch");
        ps_conn_free(&s->c);
    }
    if (!epoch) {
        fprintf(stderr, "psctl: no part that answers is in a move\n");
        return EXIT_REMOTE;
    }
    char ep[24];
    snprintf(ep, sizeof ep, "%" PRIu64, epoch);
    for (uint32_t i = 0; i < total; i++) {
        session *s = i < n ? &ss[i] : &extra;
        const char *addr = i < n ? list[i] : k->args[1];
        if (open_one(s, addr, token, timeout) != EXIT_OK)
            continue;
        char *a[] = {ep};
        int st = admin(s, addr, "move_abort", a, 1);
        if (st != EXIT_OK)
            status = st;
        else
            reached++;
        ps_conn_free(&s->c);
    }
    if (status == EXIT_OK)
        printf("the move to map %" PRIu64 " is called off on %d parts: the map stays\n", epoch, reached);
    return status;
}

int psctl_parts(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout, const psctl_call *k)
{
    if (strcmp(k->args[0], "abort") == 0)
        return parts_abort(ss, list, n, token, timeout, k);
    static session extra;
    /* all: where each part is reached (its leader); ids: its address in
     * the map (a part whose follower was promoted keeps its map address) */
    static char all[PS_PARTS_MAX + 1][300], ids[PS_PARTS_MAX + 1][300];
    static char oldl[PS_PARTS_MAX * 300], newl[PS_PARTS_MAX * 300];
    int adding = strcmp(k->args[0], "add") == 0, bad = 0;
    const char *rarg = adding ? (k->nargs == 3 ? k->args[2] : NULL) : (k->nargs == 2 ? k->args[1] : NULL);
    uint64_t rate = rarg ? parse_rate(rarg, &bad) : DEFAULT_RATE;
    if (!adding && n == 1) {
        fprintf(stderr, "psctl: the job has one part only: there is no part to remove\n");
        return EXIT_USAGE;
    }
    uint32_t total = adding ? n + 1 : n;
    for (uint32_t i = 0; i < n; i++)
        snprintf(all[i], sizeof all[i], "%s", list[i]);
    if (adding) {
        snprintf(all[n], sizeof all[n], "%s", k->args[1]);
        extra.timeout = timeout;
        extra.token = *token;
        int st = psctl_pick_leader(&extra, all[n], sizeof all[n]); /* a part given as its replicas */
        ps_token_clear(&extra.token);
        if (st != EXIT_OK)
            return st;
        for (uint32_t i = 0; i < n; i++)
            if (strcmp(list[i], all[n]) == 0) {
                fprintf(stderr, "psctl: %s is part %u of the job already\n", k->args[1], i);
                return EXIT_USAGE;
            }
    }
    uint32_t new_n = adding ? n + 1 : n - 1;
    /* a job without a map names its parts as given: a part given as its
     * replicas (A/A2) is named so in the map, and workers and the new
     * parts find its followers there */
    memcpy(ids, all, sizeof ids);
    for (uint32_t i = 0, at = 0; k->server && i < n; i++) {
        size_t len = strcspn(k->server + at, ",");
        if (len < sizeof ids[i])
            snprintf(ids[i], sizeof ids[i], "%.*s", (int)len, k->server + at);
        at += len + (k->server[at + len] == ',');
    }
    if (adding)
        snprintf(ids[n], sizeof ids[n], "%s", k->args[1]);
    session *s[PS_PARTS_MAX + 1];
    for (uint32_t i = 0; i < total; i++)
        s[i] = i < n ? &ss[i] : &extra;
    int status = EXIT_OK;
    uint32_t opened = 0;
    for (; opened < total && status == EXIT_OK; opened++)
        status = open_one(s[opened], all[opened], token, timeout);
    /* every part holds the same map; none moves, or all move to this one */
    uint64_t epoch = 0;
    uint32_t dense = n;
    int resume = 0, was_moving[PS_PARTS_MAX + 1] = {0};
    static char handed[PS_PARTS_MAX + 1][PS_PARTS_MAX * 4]; /* a source's: the destinations that took its rows */
    ps_msg r;
    const msgpack_object *pm;
    for (uint32_t i = 0; i < total && status == EXIT_OK; i++) {
        if ((status = status_of(s[i], all[i], &r, &pm)) != EXIT_OK)
            break;
        const char *mode = s[i]->mode;
        if (strcmp(mode, s[0]->mode) != 0) {
            fprintf(stderr, "psctl: psd at %s runs %s, psd at %s %s: not parts of one job\n", all[0], s[0]->mode,
                    all[i], mode);
            status = EXIT_REMOTE;
            break;
        }
        double e = psctl_num(pm, "epoch");
        /* each psd knows its place: the parts are named by the map, so the
         * one reached for part i must be part i (of the old map, or of the
         * new one for the part added) */
        const msgpack_object *mv0 = ps_map_get(pm, "move");
        double place = psctl_flag(pm, "moving") ? psctl_num(mv0, adding && i == n ? "new_self" : "old_self")
                       : e > 0                  ? psctl_num(pm, "self")
                                                : (double)i;
        if (place != (double)i) {
            fprintf(stderr, "psctl: psd at %s is part %.0f of the job's map, not part %u: give the parts in the "
                            "order of the map%s\n", all[i], place, i, adding && i == n ? " (and the part the "
                            "move under way adds)" : "");
            status = EXIT_REMOTE;
            break;
        }
        if (adding && i == n) {
            const msgpack_object *tabs = ps_map_get(r.body, "tables");
            if (!resume && !psctl_flag(pm, "moving") &&
                (e > 0 || psctl_num(r.body, "parameters") > 0 || (tabs && tabs->type == MSGPACK_OBJECT_ARRAY &&
                                                                   tabs->via.array.size > 0))) {
                fprintf(stderr, "psctl: %s holds a model already (a part of a job, or a job of its own): a part "
                                "joins fresh (started without another job's state_dir)\n", all[i]);
                status = EXIT_REMOTE;
            }
            continue;
        }
        if (i == 0) {
            epoch = (uint64_t)e;
            dense = e > 0 ? (uint32_t)psctl_num(pm, "dense") : n; /* before any move every part holds some */
            /* the parts as the map names them: a part whose follower took
             * over is reached at the follower, and named as before */
            if (e > 0)
                map_ids(pm, "addrs", n, ids);
            if (psctl_flag(pm, "moving") && adding) /* the new map: the old one and the part added */
                map_ids(ps_map_get(pm, "move"), "addrs", total, ids);
            for (uint32_t j = 0; j < total; j++)
                if (strcmp(ids[j], all[j]) != 0)
                    printf("part %u: %s in the map, reached at %s\n", j, ids[j], all[j]);
        }
        const msgpack_object *mv = ps_map_get(pm, "move");
        int moving = psctl_flag(pm, "moving");
        was_moving[i] = moving;
        if ((uint64_t)e != epoch) {
            fprintf(stderr, "psctl: psd at %s holds part map %.0f, psd at %s map %" PRIu64 ": give the parts in the "
                            "order of the job's newest map\n", all[i], e, all[0], epoch);
            status = EXIT_REMOTE;
        } else if (moving) {
            double to = psctl_num(mv, "new_n");
            if (to != new_n) {
                fprintf(stderr, "psctl: psd at %s is in a move to %.0f parts already; wait for it (psctl status) or "
                                "run that move again\n", all[i], to);
                status = EXIT_REMOTE;
            }
            resume = 1;
        }
    }
    oldl[0] = newl[0] = '\0';
    join(oldl, sizeof oldl, ids, n);
    join(newl, sizeof newl, ids, new_n);
    if (status == EXIT_OK && (strlen(oldl) >= PS_ARG_MAX || strlen(newl) >= PS_ARG_MAX)) {
        fprintf(stderr, "psctl: the part list is longer than an argument takes (%d bytes)\n", PS_ARG_MAX);
        status = EXIT_USAGE;
    }
    /* a source that restarted during the move (it is not in it while the
     * others are): the destinations that took its rows already say so, and
     * it refuses those keys at once */
    for (uint32_t d = 0; resume && status == EXIT_OK && d < total; d++) {
        int dest = adding ? d >= n : d < new_n;
        if (!dest || !was_moving[d] || status_of(s[d], all[d], &r, &pm) != EXIT_OK)
            continue;
        const msgpack_object *hb = ps_map_get(ps_map_get(pm, "move"), "handed_by");
        for (uint32_t j = 0; hb && hb->type == MSGPACK_OBJECT_ARRAY && j < hb->via.array.size; j++) {
            uint64_t src = hb->via.array.ptr[j].via.u64;
            if (src < n && !was_moving[src])
                snprintf(handed[src] + strlen(handed[src]), sizeof handed[src] - strlen(handed[src]), "%s%u",
                         handed[src][0] ? "," : "", d);
        }
    }
    if (status == EXIT_OK) {
        char ep[24], rt[24], dn[24];
        snprintf(ep, sizeof ep, "%" PRIu64, epoch + 1);
        snprintf(rt, sizeof rt, "%" PRIu64, rate);
        snprintf(dn, sizeof dn, "%u", dense);
        /* the sources first: they know the new map when a destination asks */
        uint32_t begun[PS_PARTS_MAX + 1], nb = 0;
        for (int pass = 0; pass < 2 && status == EXIT_OK; pass++)
            for (uint32_t i = 0; i < total && status == EXIT_OK; i++) {
                int source = adding ? i < n : i == n - 1;
                if (source != (pass == 0))
                    continue;
                char *a[] = {ep, oldl, newl, ids[i], rt, dn, handed[i]};
                if ((status = admin(s[i], all[i], "move_begin", a, handed[i][0] ? 7 : 6)) == EXIT_OK)
                    begun[nb++] = i;
            }
        /* one refused: the others call it off (nothing was handed over) */
        for (uint32_t j = 0; status != EXIT_OK && j < nb; j++) {
            char *a[] = {ep};
            admin(s[begun[j]], all[begun[j]], "move_abort", a, 1);
        }
        if (status == EXIT_OK)
            printf("moving %s: %u parts to %u (map %" PRIu64 "), at most %.0f MiB/s\n", adding ? "in" : "out", n,
                   new_n, epoch + 1, (double)rate / 1048576.0);
    }
    /* the destinations' progress until each took every row */
    uint64_t shown = UINT64_MAX;
    for (int done = 0; status == EXIT_OK && !done;) {
        done = 1;
        uint64_t rows = 0, bytes = 0;
        double secs = 0, pause = 0;
        for (uint32_t i = 0; i < total && status == EXIT_OK; i++) {
            int dest = adding ? i >= n : i < new_n;
            if ((status = status_of(s[i], all[i], &r, &pm)) != EXIT_OK) {
                fprintf(stderr, "psctl: part %u at %s does not answer: the move waits for it; start it again and run "
                                "this command again (with replicas: promote a follower, or let etcd elect one, and "
                                "give each part as its replicas, A/A2)\n", i, all[i]);
                break;
            }
            if (!dest)
                continue;
            char err[400];
            psctl_str(pm, "error", err, sizeof err);
            if (err[0] && strcmp(err, "-") != 0) {
                fprintf(stderr, "psctl: the move stopped at %s: %s\n", all[i], err);
                status = EXIT_REMOTE;
                break;
            }
            const msgpack_object *mv = ps_map_get(pm, "move");
            if (!psctl_flag(pm, "moving"))
                continue; /* over already (a move run again) */
            rows += (uint64_t)psctl_num(mv, "rows_taken");
            bytes += (uint64_t)psctl_num(mv, "bytes_taken");
            secs = psctl_num(mv, "seconds");
            if (psctl_num(mv, "handover_ms_max") > pause)
                pause = psctl_num(mv, "handover_ms_max");
            if (psctl_num(mv, "handed") < psctl_num(mv, "sources"))
                done = 0;
        }
        if (status == EXIT_OK && (rows != shown || done)) {
            printf("  %.1f s: %" PRIu64 " rows taken (%.1f MiB)%s\n", secs, rows, (double)bytes / 1048576.0,
                   done ? ", every source handed its rows over" : "");
            fflush(stdout);
            shown = rows;
        }
        if (!done)
            sleep_ms(POLL_MS);
        else if (status == EXIT_OK)
            printf("longest handover: %.0f ms\n", pause);
    }
    if (status == EXIT_OK) {
        char ep[24];
        snprintf(ep, sizeof ep, "%" PRIu64, epoch + 1);
        for (uint32_t i = 0; i < total && status == EXIT_OK; i++) {
            char *a[] = {ep};
            status = admin(s[i], all[i], "move_end", a, 1);
        }
        /* the rows that left are dropped in the background: done when none drops */
        for (int dropping = 1; status == EXIT_OK && dropping;) {
            dropping = 0;
            for (uint32_t i = 0; i < total && status == EXIT_OK; i++)
                if ((status = status_of(s[i], all[i], &r, &pm)) == EXIT_OK && psctl_flag(pm, "dropping"))
                    dropping = 1;
            if (dropping)
                sleep_ms(POLL_MS / 4);
        }
        if (status == EXIT_OK)
            printf("the job's parts are now %s (map %" PRIu64 ")%s%s\n", newl, epoch + 1,
                   adding ? "" : "; the part removed, ", adding ? "" : ids[n - 1]);
    }
    for (uint32_t i = 0; i < opened; i++) {
        ps_conn_free(&s[i]->c);
        ps_token_clear(&s[i]->token);
    }
    (void)bad;
    return status;
}
