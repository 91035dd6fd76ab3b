/* step.c - libpsclient: the requests of a step: pushes and pulls over every part (each
 * link's chunks are chunks.c's), PUSHPULL over every part in a staggered order, the BARRIER
 * that ends a BSP step over a split model, a Hogwild! step or the reconnect when psd is gone,
 * and the public push and pull calls. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

/* Sends ln's part of the gradient as a PUSHPULL that pulls the part back
 * at version >= min: through the segment when ln's psd mapped it (copying
 * the gradient there unless it is there already), else as data. */
static int pushpull_send(psc_client *c, psc_link *ln, uint64_t min)
{
    size_t n = ln->hi - ln->lo;
    ps_msg m;
    ps_msg_init(&m, PS_MSG_PUSHPULL);
    m.has = PS_F_BASE | PS_F_OFF | PS_F_POFF | PS_F_PLEN | PS_F_MIN;
    m.base = psc__push_base(c, ln);
    m.plen = n;
    m.min = min;
    m.has2 = PS_F2_PID;
    m.pid = psc__pid(ln, 0);
    if (ln->shm_ok) {
        if (c->grads != c->shm)
            memcpy(c->shm + ln->lo, c->grads + ln->lo, n * sizeof(float));
        m.has |= PS_F_LEN | PS_F_INSHM;
        m.len = n;
        m.inshm = 1;
    } else {
        m.has |= PS_F_DATA;
        m.data = c->grads + ln->lo;
        m.ndata = n;
    }
    return ps_conn_send(&ln->cl, &m);
}

/* Reads the answer to pushpull_send into the parameter vector: over TCP
 * straight from the socket, through the segment from its second half
 * (no copy when the library's own vector is bound). */
static int pushpull_recv(psc_client *c, psc_link *ln)
{
    size_t n = ln->hi - ln->lo;
    float *dst = c->params + ln->lo;
    ps_msg r;
    if (ln->shm_ok) {
        int rc = ps_conn_recv(&ln->cl, &r, c->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || !r.inshm || r.off != 0 || r.len != n)
            return PS_EMALFORMED;
        const float *src = c->shm + c->layout.total + ln->lo;
        if (src != dst)
            memcpy(dst, src, n * sizeof(float));
    } else {
        int rc = ps_conn_recv_into(&ln->cl, &r, dst, n, c->timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || r.off != 0 || r.ndata != n)
            return PS_EMALFORMED;
        if (r.data != dst)
            memcpy(dst, r.data, n * sizeof(float));
    }
    ln->version = r.mver;
    return 0;
}

/* Keeps the first error of a step (the one to reconnect for) and closes
 * link i when its stream may be out of step: the step goes on reading the
 * other links' replies, so every link left open has nothing outstanding,
 * and the reconnect opens the closed ones again. */
static void part_fail(psc_client *c, uint32_t i, int rc, int *first)
{
    /* an interrupted wait keeps its links for the bye, the client marked
     * out of step whichever link's error the step reports */
    if (*first == 0)
        *first = psc__lfail(c, i, rc);
    else
        psc__interrupted(c, rc);
    if (rc != PS_CLIENT_EINTR && (rc != PS_EREMOTE || i != c->err_link))
        psc__link_close(&c->links[i]);
}

/* The part a step sends to first: the one after the part whose psd is on
 * this machine (answering through shared memory), or after this worker's
 * shard number when none or several are. Worker k of a model split over
 * psd co-located with the workers so starts at part k+1 and no psd
 * receives every worker's push at once (BytePS's staggered order; measured
 * in bench/README.md, multihost.py). */
static uint32_t first_part(const psc_client *c)
{
    uint32_t local = c->ndense, nlocal = 0;
    for (uint32_t i = 0; i < c->ndense; i++)
        if (c->links[i].shm_ok) {
            local = i;
            nlocal++;
        }
    return nlocal == 1 ? (local + 1) % c->ndense : (c->shard + 1) % c->ndense;
}

/* Ends a whole-model BSP step over a split model: a BARRIER on part 0's
 * psd, answered once every worker has this version, so that all start
 * their next round together (PROTOCOL.md, BARRIER; measured in
 * bench/README.md). When the parts' versions differ (a part closed a round
 * without this worker, around a loss or a rejoin) the worker withdraws
 * instead (version 0): its next step may wait for a part whose round needs
 * the others' next pushes, so they must not wait for it. A psd that does
 * not know BARRIER is not asked again. By default (auto) only when a part
 * is on another machine: on one machine no link is shared, and the round
 * trip would cost (W1 over 2 psd on loopback: 0.41-0.43 s an epoch
 * against 0.34-0.39 s without). */
static int barrier(psc_client *c)
{
    int remote = 0;
    for (uint32_t i = 0; i < c->ndense; i++)
        remote |= c->links[i].remote;
    if (!c->barrier || (c->barrier < 0 && !remote) || c->barrier_refused || !c->bsp || c->ndense < 2)
        return 0;
    psc_link *ln = &c->links[0];
    int in_step = 1;
    for (uint32_t i = 1; i < c->ndense; i++)
        in_step &= c->links[i].version == ln->version;
    if (!in_step && !c->barrier_in)
        return 0; /* not taking part: nothing to say */
    ps_msg m, r;
    ps_msg_init(&m, PS_MSG_BARRIER);
    m.has = PS_F_MVER;
    m.mver = in_step ? ln->version : 0;
    int rc = ps_conn_call(&ln->cl, &m, &r, c->timeout_ms);
    if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_EBAD_TYPE) {
        PS_LOG(PS_LOG_INFO, "%s: psd does not know barrier (an older psd); steps go on without it", ln->server);
        c->barrier_refused = 1;
        return 0;
    }
    if (rc == 0 && r.type != PS_MSG_OK)
        rc = PS_EMALFORMED;
    if (rc != 0) {
        int first = 0;
        part_fail(c, 0, rc, &first);
        return first;
    }
    c->barrier_in = in_step;
    return 0;
}

/* A whole-model step: every part's push goes out before any answer is
 * read, from first_part on, the psd on other machines (TCP) first, so
 * their bytes are on the wire while a psd on this machine handles its
 * part; parts of at most 2^20 values as one PUSHPULL each, answered
 * straight into the parameter vector; bigger ones as chunked pushes, then
 * chunked pulls. */
static int do_pushpull(psc_client *c)
{
    uint64_t v0 = c->links[0].version;
    size_t sent[PS_PARTS_MAX] = {0};
    int first = 0, small = 1, npieced = 0;
    for (uint32_t i = 0; i < c->ndense; i++) {
        int p = psc__pieced(c, &c->links[i]);
        npieced += p;
        small &= p || c->links[i].shm_ok || c->links[i].hi - c->links[i].lo <= c->chunk; /* the segment holds a part */
    }
    uint32_t start = first_part(c);
    /* the parts in pieces first: their sends on a thread, read below */
    pieces_job pj = {.c = c, .start = start};
    pthread_t sender;
    int sending = 0;
    if (npieced) {
        for (uint32_t i = 0; i < c->ndense; i++) {
            pj.on[i] = psc__pieced(c, &c->links[i]) && psc__sends_to(c, i);
            pj.ver[i] = c->links[i].version;
        }
        if (psc__start_thread(&sender, psc__pieces_send, &pj) != 0)
            return psc__lfail(c, 0, PS_ENOMEM);
        sending = 1;
    }
    for (int shm = 0; shm < 2; shm++)
        for (uint32_t j = 0; j < c->ndense && !first; j++) {
            uint32_t i = (start + j) % c->ndense;
            psc_link *ln = &c->links[i];
            if (pj.on[i] || !psc__sends_to(c, i))
                continue;
            if (small && ln->shm_ok != shm)
                continue;
            if (!small && shm)
                break;
            int rc = small ? pushpull_send(c, ln, c->bsp ? ln->version + 1 : 0)
                           : psc__chunks_out(c, ln, PS_MSG_PUSH, c->grads + ln->lo, 0, ln->hi - ln->lo, psc__push_base(c, ln),
                                        &sent[i]);
            if (rc != 0)
                part_fail(c, i, rc, &first);
            else if (small)
                sent[i] = 1;
        }
    if (sending) {
        psc__pieces_recv(c, &pj);
        pthread_join(sender, NULL);
        for (uint32_t i = 0; i < c->ndense; i++)
            if (pj.rc[i] != 0 || pj.rrc[i] != 0)
                part_fail(c, i, pj.rc[i] ? pj.rc[i] : pj.rrc[i], &first);
    }
    /* the replies in the same order: psd p's replies then go to its
     * workers one after another (each worker reads a different part
     * first), not all at once to the one every worker reads first (a
     * reply not being read stalls on the worker's receive window) */
    for (uint32_t j = 0; j < c->ndense; j++) {
        uint32_t i = (start + j) % c->ndense;
        if (!sent[i])
            continue;
        int rc = small ? pushpull_recv(c, &c->links[i]) : psc__chunks_acks(c, &c->links[i], sent[i], i == 0);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    for (uint32_t j = 0; j < c->ndense && !small && !first; j++) {
        uint32_t i = (start + j) % c->ndense;
        psc_link *ln = &c->links[i];
        if (pj.on[i] || !psc__sends_to(c, i))
            continue;
        int rc = psc__pull_part(c, ln, c->params + ln->lo, 0, ln->hi - ln->lo, c->bsp ? ln->version + 1 : 0);
        if (rc != 0) {
            part_fail(c, i, rc, &first);
            if (rc != PS_CLIENT_EINTR)
                psc__link_close(ln); /* chunk pulls of its window may be outstanding */
        }
    }
    if (first)
        return first;
    if (small && c->bsp && c->links[0].version > v0 + 1)
        c->dropped++; /* the round closed without our push */
    else if (small && c->bsp && c->links[0].cl.done && c->links[0].version == v0)
        c->dropped++; /* a push after the plan's last round */
    c->version = c->links[0].version;
    c->pushed = 0;
    c->step_in = 1;
    return barrier(c);
}

/* The values [*a, *b) of [off, off + len) that link ln's part holds;
 * 0 when there are none. */
static int part_range(const psc_link *ln, uint64_t off, uint64_t len, uint64_t *a, uint64_t *b)
{
    *a = off > ln->lo ? off : ln->lo;
    *b = off + len < ln->hi ? off + len : ln->hi;
    return *a < *b;
}

/* Pushes values [off, off + len) of the gradient to every psd whose part
 * they touch: all chunks out first, then the OKs. */
static int do_push(psc_client *c, uint64_t off, uint64_t len)
{
    size_t sent[PS_PARTS_MAX] = {0};
    int first = 0;
    for (uint32_t i = 0; i < c->ndense && !first; i++) {
        psc_link *ln = &c->links[i];
        uint64_t a, b;
        if (!part_range(ln, off, len, &a, &b) || !psc__sends_to(c, i))
            continue;
        int rc = psc__chunks_out(c, ln, PS_MSG_PUSH, c->grads + a, a - ln->lo, (size_t)(b - a), psc__push_base(c, ln), &sent[i]);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    for (uint32_t i = 0; i < c->ndense; i++) {
        if (!sent[i])
            continue;
        int rc = psc__chunks_acks(c, &c->links[i], sent[i], i == 0);
        if (rc != 0)
            part_fail(c, i, rc, &first);
    }
    if (first)
        return first;
    c->pushed = 1;
    return 0;
}

/* Pulls values [off, off + len) into the parameter vector. */
static int do_pull(psc_client *c, uint64_t off, uint64_t len)
{
    int first = 0;
    for (uint32_t i = 0; i < c->ndense && !first; i++) {
        psc_link *ln = &c->links[i];
        uint64_t a, b;
        if (!part_range(ln, off, len, &a, &b))
            continue;
        int rc = psc__pull_part(c, ln, c->params + a, a - ln->lo, b - a, c->bsp && c->pushed ? ln->version + 1 : 0);
        if (rc != 0) {
            part_fail(c, i, rc, &first);
            if (rc != PS_CLIENT_EINTR)
                psc__link_close(ln);
        }
    }
    if (first)
        return first;
    c->version = c->links[0].version;
    if (off == 0 && len == c->layout.total)
        c->pushed = 0;
    return 0;
}

/* Runs one operation; a lost connection is reconnected (the step is then
 * lost) when the option says so. */
static int run_step(psc_client *c, enum op op, uint64_t off, uint64_t len);
static int run(psc_client *c, enum op op, uint64_t off, uint64_t len);

/* Option topk: each tensor's values of the gradient in [off, off + len)
 * are cut down to the largest of gradient plus residual (topk.c), in
 * place, the rest kept in c->resid. */
static int topk_apply(psc_client *c, uint64_t off, uint64_t len)
{
    if (!c->resid) {
        size_t n = (size_t)c->layout.total;
        c->resid = calloc(n, sizeof(float));
        c->topk_scratch = malloc(n * sizeof(float));
        if (!c->resid || !c->topk_scratch) {
            free(c->resid);
            free(c->topk_scratch);
            c->resid = c->topk_scratch = NULL;
            return psc__fail(c, PSC_ENOMEM, "topk: out of memory for the residual (%" PRIu64 " values)",
                             c->layout.total);
        }
    }
    for (uint32_t t = 0; t < c->layout.ntensors; t++) {
        const ps_tensor_desc *d = &c->layout.t[t];
        uint64_t a = off > d->offset ? off : d->offset;
        uint64_t b = off + len < d->offset + d->count ? off + len : d->offset + d->count;
        if (a >= b)
            continue;
        size_t n = (size_t)(b - a);
        psc__topk_select(c->grads + a, c->resid + a, n, psc__topk_k(c->topk, n), c->topk_scratch);
    }
    return 0;
}

/* Option topk: a step whose push did not count (lost with a reconnect, or
 * dropped by a BSP round that had closed) gives what it sent back to the
 * residual, so error feedback still loses nothing. */
static void topk_unsend(psc_client *c, uint64_t off, uint64_t len)
{
    for (uint64_t i = off; i < off + len; i++)
        c->resid[i] += c->grads[i];
}

int psc__run(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    int topk = c->topk > 0 && op != OP_PULL && !c->hw_on;
    if (topk) {
        int rc = topk_apply(c, off, len);
        if (rc != 0)
            return rc;
    }
    uint64_t lost0 = c->lost, dropped0 = c->dropped;
    int rc = run(c, op, off, len);
    if (topk && (rc != 0 || c->lost != lost0 || c->dropped != dropped0))
        topk_unsend(c, off, len);
    return rc;
}

static int run(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    /* every caller passed psc__ready first, which opened the links anew
     * after an interrupted wait (c->desync is 0 here) */
    if (c->hw_on) {
        if (psc__hogwild_gone(c)) {
            psc__fail(c, PSC_ECLOSED, "psd at %s closed the connection", c->links[0].server);
            int rc = c->auto_reconnect ? psc__reconnect(c, PS_ECLOSED) : PSC_ECLOSED;
            if (rc != 0)
                return rc;
            if (op != OP_PULL)
                c->lost++; /* as with any reconnect: the open pulled the model anew */
            return 0;
        }
        return psc__hogwild_step(c, op, off, len);
    }
    psc__waiting_clear(c);
    c->intr = __atomic_load_n(&c->stop_req, __ATOMIC_RELAXED); /* psc_interrupt's stays */
    int rc = psc__interrupted(c, run_step(c, op, off, len)); /* or a reconnect's wait */
    psc__waiting_clear(c);
    return rc;
}

/* The most push messages a step may send one link: its part in chunks,
 * or in pieces. */
static uint64_t step_most(const psc_client *c)
{
    uint64_t most = 1;
    for (uint32_t i = 0; i < c->ndense; i++) {
        const psc_link *ln = &c->links[i];
        uint64_t unit = ln->piece && ln->piece < c->chunk ? ln->piece : c->chunk;
        uint64_t k = (ln->hi - ln->lo + unit - 1) / unit;
        most = k > most ? k : most;
    }
    return most;
}

/* After a reconnect: the step's pushes go again to the links opened anew,
 * with their push ids, so a psd that applied one already answers it
 * without applying it again (PROTOCOL.md 15), and one that never had it
 * (the reply lost with it, or another replica) applies it. Its base and a
 * BSP pull's min are the step's, or the version the new connection found
 * when that is lower (a replica behind the psd that was lost). */
static int resend(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->ndense; i++) {
        psc_link *ln = &c->links[i];
        if (!ln->reopened)
            continue;
        n++;
        if (ln->step_ver < ln->version)
            ln->version = ln->step_ver;
    }
    if (n == 0)
        return 0;
    if (c->has_base && c->base > c->links[0].version)
        c->base = c->links[0].version; /* psc_set_base's, never ahead of the psd now reached */
    c->resending = 1;
    int rc = op == OP_PUSHPULL ? do_pushpull(c) : do_push(c, off, len);
    c->resending = 0;
    if (rc == 0) {
        c->resent++;
        PS_LOG(PS_LOG_INFO, "the step's pushes went again to %u psd after the reconnect, with their ids: each "
                            "is applied once", n);
    }
    return rc;
}

/* Reconnects this many times at most within one step (each reconnect
 * itself tries for up to reconnect_s) */
#define STEP_RECONNECTS 8

static int run_step(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    c->step_in = 0;
    if (op != OP_PULL)
        psc__pids_begin(c, step_most(c));
    int rc = op == OP_PUSHPULL ? do_pushpull(c) : op == OP_PUSH ? do_push(c, off, len) : do_pull(c, off, len);
    for (int k = 0; rc != 0 && k < STEP_RECONNECTS && c->auto_reconnect && psc__recoverable(c, rc); k++) {
        rc = psc__reconnect(c, rc);
        if (rc != 0) {
            if (op != OP_PULL)
                c->has_base = 0;
            return rc;
        }
        if (op == OP_PULL)
            rc = do_pull(c, off, len); /* the open pulled the parts it reconnected; this is the rest */
        else if (!c->step_in)
            rc = resend(c, op, off, len);
    }
    if (op != OP_PULL)
        c->has_base = 0;
    if (rc == 0)
        return 0;
    if (op != OP_PULL && !c->step_in && psc__recoverable(c, rc))
        c->lost++;
    return psc__public_code(c, rc);
}

static int range_ok(psc_client *c, const char *what, uint64_t off, uint64_t len)
{
    if (len == 0 || off > c->layout.total || len > c->layout.total - off)
        return psc__fail(c, PSC_ERANGE, "%s: [%" PRIu64 ", %" PRIu64 "+%" PRIu64 ") is not inside the model's %" PRIu64
                                   " values", what, off, off, len, c->layout.total);
    return 0;
}

int psc_pushpull(psc_client *c)
{
    int rc = psc__ready(c, "psc_pushpull");
    return rc ? rc : psc__run(c, OP_PUSHPULL, 0, c->layout.total);
}

int psc_push(psc_client *c)
{
    int rc = psc__ready(c, "psc_push");
    return rc ? rc : psc__run(c, OP_PUSH, 0, c->layout.total);
}

int psc_pull(psc_client *c)
{
    int rc = psc__ready(c, "psc_pull");
    return rc ? rc : psc__run(c, OP_PULL, 0, c->layout.total);
}

int psc_push_range(psc_client *c, uint64_t off, uint64_t len)
{
    int rc = psc__ready(c, "psc_push_range");
    if (rc == 0)
        rc = range_ok(c, "psc_push_range", off, len);
    return rc ? rc : psc__run(c, OP_PUSH, off, len);
}

int psc_pull_range(psc_client *c, uint64_t off, uint64_t len)
{
    int rc = psc__ready(c, "psc_pull_range");
    if (rc == 0)
        rc = range_ok(c, "psc_pull_range", off, len);
    return rc ? rc : psc__run(c, OP_PULL, off, len);
}

int psc_push_tensor(psc_client *c, const char *name)
{
    uint64_t off, len;
    if (psc_tensor_find(c, name, &off, &len) != 0)
        return psc__fail(c, PSC_ENOTFOUND, "psc_push_tensor: no tensor called '%.80s'", name ? name : "(null)");
    return psc_push_range(c, off, len);
}

int psc_pull_tensor(psc_client *c, const char *name)
{
    uint64_t off, len;
    if (psc_tensor_find(c, name, &off, &len) != 0)
        return psc__fail(c, PSC_ENOTFOUND, "psc_pull_tensor: no tensor called '%.80s'", name ? name : "(null)");
    return psc_pull_range(c, off, len);
}

int psc_set_base(psc_client *c, uint64_t version)
{
    int rc = psc__ready(c, "psc_set_base");
    if (rc != 0)
        return rc;
    /* never ahead of the model (psd refuses that): after a reconnect to a
     * psd restarted from an older checkpoint the version may have gone back */
    c->has_base = 1;
    c->base = version < c->version ? version : c->version;
    return 0;
}
