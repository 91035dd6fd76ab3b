/* link.c - libpsclient: the links to psd: hello and welcome on each, opening them all with
 * backoff and jitter (and, once open, the averaging settings and base: average_opened),
 * reconnecting, opening the links a newer part map added (PROTOCOL.md 18; adopting it is
 * pmap.c's), and psc__ready, which every call passes first (opening the links anew after
 * an interrupted wait). Which errors a reconnect may cure is base.c's. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

/* The longest a handshake may take: resolving the name, the TCP connect,
 * hello and welcome (and AUTH). Shorter than the backoff's cap, so an
 * attempt that meets an address answering nothing (a restarted container's,
 * a firewall that drops, a listener that never accepts or never answers)
 * costs no more than one wait between attempts (psc__open_retry counts it
 * as one): a worker is back within the cap and a second of psd answering
 * again. */
#define HANDSHAKE_MS 4000
#define BACKOFF_CAP_MS 5000
/* The backoff's cap for a part given as its replicas: a new leader is
 * elected within about lease_ttl of a failure, and found within this of
 * its election (an attempt is a refused connect to the dead leader, or a
 * hello a follower answers NOT_LEADER: cheap, a few a second). With 1 s
 * the workers' longest time without an acknowledged push after a kill -9
 * (lease_ttl 2 s) was 3.06-3.30 s in the chaos test (test_chaos.py), of
 * which up to a second was this wait; the test holds it to 3 s. */
#define FAILOVER_CAP_MS 250

static int left_ms(int64_t deadline)
{
    int64_t l = deadline - psc__mono_ms();
    return l < 1 ? 1 : (int)l;
}

/* Adds address a (len bytes) to ln's replicas unless it is there or they
 * are full; returns its index, or -1 when it could not be added. */
static int link_learn(psc_link *ln, const char *a, size_t len)
{
    uint32_t before = ln->naddrs;
    int k = ps_addr_list_add(ln->addrs, &ln->naddrs, PSC_ADDRS_MAX, a, len);
    if (k >= 0 && ln->naddrs > before)
        PS_LOG(PS_LOG_DEBUG, "%s: the part's replicas include %s", ln->server, ln->addrs[k]);
    return k;
}

/* After link i failed with rc: the next attempt goes to the psd its
 * NOT_LEADER named, or, when the connection failed or psd is stopping or
 * follows a leader, to the part's next replica. Other refusals (a shard
 * taken, psd not ready, full) keep the address: another replica would not
 * change them. */
static void link_next_addr(psc_client *c, uint32_t i, int rc)
{
    psc_link *ln = &c->links[i];
    int32_t code = ln->cl.remote_code;
    int not_leader = rc == PS_EREMOTE && code == -PS_ENOT_LEADER;
    int gone = rc == PS_ECLOSED || rc == PS_EIO || rc == PS_ECONNECT || rc == PS_ETIMEOUT ||
               (rc == PS_EREMOTE && code == -PS_ESHUTDOWN);
    if (!not_leader && !gone)
        return;
    int k = -1;
    if (not_leader && ln->cl.remote_leader[0])
        k = link_learn(ln, ln->cl.remote_leader, strlen(ln->cl.remote_leader));
    if (k < 0 && ln->naddrs < 2)
        return;
    uint32_t next = k >= 0 ? (uint32_t)k : (ln->cur + 1) % ln->naddrs;
    if (next == ln->cur)
        return;
    PS_LOG(PS_LOG_INFO, "part %u: %s %s; trying %s", i, ln->server, not_leader ? "follows a leader" : "is gone",
           ln->addrs[next]);
    ln->cur = next;
    snprintf(ln->server, sizeof ln->server, "%s", ln->addrs[next]);
}

/* Connects ln and says hello, offering the segment when there is one;
 * *need_init: this psd asks for initial values. */
static int link_hello(psc_client *c, psc_link *ln, int *need_init)
{
    ps_msg m, r;
    psc__hb_stop(ln);
    ln->cl.interrupted = c->interrupt ? &c->intr : NULL;
    ln->cl.wake_fd = c->wakeup_fd;
    int hs = c->timeout_ms < HANDSHAKE_MS ? c->timeout_ms : HANDSHAKE_MS;
    int64_t deadline = psc__mono_ms() + hs;
    pthread_mutex_lock(&ln->lock);
    int rc = ps_conn_connect(&ln->cl, ln->server, c->quick && hs > 1000 ? 1000 : hs);
    pthread_mutex_unlock(&ln->lock);
    if (rc != 0)
        return rc;
    ln->remote = !ps_sock_same_host(ln->cl.fd);
    if (c->send_buffer && setsockopt(ln->cl.fd, SOL_SOCKET, SO_SNDBUF, &c->send_buffer, sizeof c->send_buffer) != 0)
        PS_LOG(PS_LOG_WARN, "%s: cannot set the send buffer to %d bytes: %s", ln->server, c->send_buffer,
               strerror(errno));
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT | PS_F_FP;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_WORKER;
    m.shard = c->shard;
    m.nshards = c->nshards;
    m.layout = &ln->layout;
    m.fp = ps_layout_fingerprint(&ln->layout);
    m.has2 = PS_F2_CID; /* our pushes' ids are recorded (PROTOCOL.md 15) */
    m.cid = c->cid;
    if (c->reader) { /* it pulls only, and a follower answers it (PROTOCOL.md 15) */
        m.has2 |= PS_F2_READER;
        m.reader = 1;
    }
    if (c->want_plan) {
        m.has |= PS_F_PLAN;
        m.plan = c->plan;
    }
    if (ln - c->links >= (ptrdiff_t)c->ndense) {
        /* a part that holds no dense values is told the part map instead
         * of a layout (PROTOCOL.md 18) */
        m.has &= ~(PS_F_LAYOUT | PS_F_FP);
        m.has2 |= PS_F2_PMAP;
        m.pmap.epoch = c->map.epoch;
        m.pmap.dense = c->map.dense;
        m.pmap.n = c->map.n;
        for (uint32_t j = 0; j < c->map.n; j++)
            m.pmap.addrs[j] = (ps_str){c->map.addrs[j], (uint32_t)strlen(c->map.addrs[j])};
    }
    ln->cl.interrupted = c->interrupt ? &c->intr : NULL;
    ln->cl.wake_fd = c->wakeup_fd;
    ln->cl.spin_us = c->spin_us;
    ln->cl.wire_dt = PS_DT_F32; /* until this psd's welcome offers more */
    ln->shm_ok = 0;
    if (ln == &c->links[0])
        c->barrier_in = 0; /* a new connection takes part from its first BARRIER */
    /* the segment holds a part in one PUSHPULL (always so unless a part map
     * split the model over fewer psd); a table-only part holds none */
    if (c->shm && ln->hi > ln->lo && ln->hi - ln->lo <= CHUNK_FLOATS) {
        m.has |= PS_F_SHM;
        m.shm_pid = (uint32_t)getpid();
        m.shm_fd = (uint32_t)c->shm_fd;
        if (c->ndense > 1) {
            /* this part of both halves: [lo, hi) and [n + lo, n + hi) */
            m.shm_at = 1;
            m.shm_goff = ln->lo;
            m.shm_poff = c->layout.total + ln->lo;
        }
    }
    ln->tseg_ok = 0;
    if (c->want_shm && !ln->remote && psc__tseg_create(ln) == 0) {
        m.has |= PS_F_TSHM;
        m.tshm = (ps_pidfd){(uint32_t)getpid(), (uint32_t)ln->tseg_fd};
    }
    rc = ps_conn_hello(&ln->cl, &m, c->token.len ? c->token.b : NULL, c->token.len, &r, left_ms(deadline));
    if (rc == 0 || rc == PS_EREMOTE) /* a WELCOME or an ERROR LAYOUT may carry the part map */
        psc__pmap_note(c, &r);
    if (rc != 0)
        return rc;
    if (r.has2 & PS_F2_REPLICAS)
        for (uint32_t k = 0; k < r.nreplicas; k++)
            link_learn(ln, r.replicas[k].p, r.replicas[k].len);
    ln->shm_ok = c->shm && (r.has & PS_F_INSHM) && r.inshm;
    ln->tseg_ok = (m.has & PS_F_TSHM) && (r.has & PS_F_TINSHM) && r.tinshm;
    ln->hw = ln->shm_ok && (r.has & PS_F_HOGWILD) && (r.has & PS_F_LR);
    ln->hw_pid = r.hw.pid;
    ln->hw_fd = r.hw.fd;
    ln->hw_lr = r.lr;
    ln->workers = (r.has & PS_F_WORKERS) ? r.workers : 1;
    if (c->want_shm && !c->shm_logged) {
        if (ln->shm_ok)
            PS_LOG(PS_LOG_INFO, "tensors through shared memory with psd at %s", ln->server);
        else
            PS_LOG(PS_LOG_DEBUG, "tensors over TCP: psd at %s did not map our shared memory (another machine "
                                 "or user; its log says why)", ln->server);
    }
    if (c->want_dt != PS_DT_F32) {
        if ((r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(c->want_dt)))
            ln->cl.wire_dt = c->want_dt;
        else
            PS_LOG(PS_LOG_WARN, "psd at %s does not offer %s tensors (wire_bf16 = no, or an older psd): "
                                "sending float32", ln->server, ps_dtype_name(c->want_dt));
    }
    /* float32 pushes without their zeros: bit for bit the same values */
    ln->cl.skip_zeros = c->skip_zeros && ln->cl.wire_dt == PS_DT_F32 && (r.has & PS_F_WIRE) &&
                        (r.wire & PS_WIRE_BIT(PS_DT_F32Z));
    /* and compressed, where the link is slower than the compressor: by
     * default only to a psd on another machine */
    ln->cl.compress = (c->compress > 0 || (c->compress < 0 && ln->remote)) && ln->cl.wire_dt == PS_DT_F32 &&
                      (r.has & PS_F_WIRE) && (r.wire & PS_WIRE_BIT(PS_DT_F32ZSTD));
    ln->cl.zrest = 0;
    snprintf(ln->mode, sizeof ln->mode, "%s", r.mode);
    ln->version = r.mver;
    ln->has_plan = (r.has & PS_F_PLAN) != 0;
    ln->plan = r.plan;
    ln->has_first = ln->has_plan && (r.has & PS_F_BASE);
    ln->first = r.base;
    ln->piece = (r.has & PS_F_PIECE) ? r.piece : 0;
    ln->local = (r.has & PS_F_LOCAL) ? r.local : 0;
    ln->alpha = (r.has & PS_F_ALPHA) ? r.alpha : 0;
    ln->tau = (r.has & PS_F_TAU) && r.tau ? r.tau : 1;
    ln->cl.has_slice = ln->cl.done = 0; /* until this connection's first PARAMS */
    *need_init = r.need_init;
    uint64_t hb = (r.has & PS_F_HB) ? r.hb : 0;
    ln->hb_interval_ms = hb ? (hb / 3 > 50 ? hb / 3 : 50) : 0;
    return 0;
}

static int open_fail(psc_client *c, const int *fresh, uint32_t i, int rc);

/* A planned BSP job over several psd, every part opened anew (a worker
 * that left every part, or a new process in a running job): each psd
 * counts this worker in from its next round, and the parts' rounds are not
 * in step (one may be a round or two ahead), so they could take it back at
 * different rounds; one would then wait for its push of a round while its
 * step waits for another's later round, which waits for the others, who
 * wait for the first: a standstill. Every psd is told the latest of the
 * rounds their WELCOMEs named (a HEARTBEAT with base), so all take it back
 * at that one: a psd that named an earlier round holds it there as a
 * member until told, so cannot have opened that round without it
 * (PROTOCOL.md 8, "The plan"). A psd that named none (an older one, a job
 * not under a plan yet) leaves it as it was. */
static int plan_rejoin(psc_client *c, const int *fresh)
{
    uint64_t r = 0;
    uint32_t apart = 0;
    if (c->ndense < 2 || !c->bsp)
        return 0;
    for (uint32_t i = 0; i < c->ndense; i++) {
        const psc_link *ln = &c->links[i];
        if (!fresh[i] || !ln->has_first)
            return 0;
        apart += i && ln->first != c->links[0].first;
        r = ln->first > r ? ln->first : r;
    }
    if (!apart)
        return 0;
    PS_LOG(PS_LOG_INFO, "a planned bsp job over %u psd: they would take this worker back at different rounds; "
                        "rejoining each at round %llu", c->ndense, (unsigned long long)r);
    for (uint32_t i = 0; i < c->ndense; i++) {
        ps_msg m, rep;
        ps_msg_init(&m, PS_MSG_HEARTBEAT);
        m.has = PS_F_BASE;
        m.base = r;
        int rc = ps_conn_call(&c->links[i].cl, &m, &rep, c->timeout_ms);
        if (rc != 0)
            return open_fail(c, fresh, i, rc);
    }
    return 0;
}

/* After the hellos: a psd that named its Hogwild! segment is mapped (in
 * place of the one before, PROTOCOL.md section 8), unless the model is
 * split, which a Hogwild! job cannot be. */
static int hogwild_open(psc_client *c, const int *fresh)
{
    uint32_t named = 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        named += c->links[i].hw;
    if (named && c->nlinks > 1) {
        psc__fail(c, PSC_EINVAL, "a Hogwild! job keeps the whole model in one psd; this worker was given %u",
                  c->nlinks);
        return open_fail(c, fresh, 0, PSC_EINVAL);
    }
    if (!fresh[0])
        return 0;
    c->hw_on = 0;
    if (!named)
        return 0;
    psc_link *ln = &c->links[0];
    int rc = psc__hogwild_map(c, ln->hw_pid, ln->hw_fd);
    if (rc != 0)
        return open_fail(c, fresh, 0, rc);
    c->hw_on = 1;
    c->hw_lr = ln->hw_lr;
    c->hw_workers = ln->workers;
    c->hw_checked_ms = psc__mono_ms();
    if (!c->hw_said) {
        c->hw_said = 1;
        PS_LOG(PS_LOG_INFO, "Hogwild!: steps go straight into psd's model (lr %g)", c->hw_lr);
        if (c->topk > 0 || c->want_dt != PS_DT_F32 || c->compress > 0)
            PS_LOG(PS_LOG_INFO, "Hogwild!: this worker pushes nothing: topk, wire and compress do not apply");
    }
    return 0;
}

/* A failed open closes every link it connected (fresh[i]), so the next
 * attempt says hello, sends initial values and pulls on each again. */
static int open_fail(psc_client *c, const int *fresh, uint32_t i, int rc)
{
    for (uint32_t k = 0; k < c->nlinks; k++)
        if (fresh[k])
            psc__link_close(&c->links[k]);
    if (c->err[0])
        return rc;
    return psc__lfail(c, i, rc);
}

/* After do_open: the averaging settings from the first psd's WELCOME and,
 * for each part just pulled (fresh[i]), the base its local steps start
 * from (local SGD, elastic averaging: average.c). 0 or a code. */
static int average_opened(psc_client *c, const int *fresh)
{
    const psc_link *first = &c->links[0];
    c->local = first->local;
    c->alpha = first->alpha;
    c->tau = first->tau ? first->tau : 1;
    if (!c->local && !(c->alpha > 0))
        return 0;
    uint64_t n = c->layout.total;
    if (!c->avg_base && !(c->avg_base = malloc((n ? n : 1) * sizeof(float))))
        return psc__fail(c, PSC_ENOMEM, "out of memory for a copy of the model (%" PRIu64 " values), which %s keeps",
                         n, c->local ? "local SGD" : "elastic averaging");
    /* a part pulled anew is the base its local steps start from */
    for (uint32_t i = 0; i < c->ndense; i++)
        if (fresh[i])
            memcpy(c->avg_base + c->links[i].lo, c->params + c->links[i].lo,
                   (size_t)(c->links[i].hi - c->links[i].lo) * sizeof(float));
    return 0;
}

/* Connects every link not connected, says hello, gives initial values to
 * a psd that asks (the parameter vector as it is), pulls each fresh part
 * and starts its heartbeats. */
static int do_open(psc_client *c)
{
    int need_init[PS_PARTS_MAX] = {0}, fresh[PS_PARTS_MAX] = {0};
    c->err[0] = '\0';
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        if (ln->cl.fd >= 0)
            continue;
        fresh[i] = 1;
        int rc = link_hello(c, ln, &need_init[i]);
        if (rc != 0)
            return open_fail(c, fresh, i, rc);
    }
    c->shm_logged |= c->want_shm;
    c->shm_ok = 0;
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        c->shm_ok |= ln->shm_ok;
        if (ln->local != c->links[0].local || ln->alpha != c->links[0].alpha || ln->tau != c->links[0].tau) {
            psc__fail(c, PSC_EINVAL, "psd at %s and psd at %s differ in local_steps, elastic_alpha or elastic_tau: "
                                "every psd holding a part of the model must have the same", c->links[0].server,
                      ln->server);
            return open_fail(c, fresh, i, PSC_EINVAL);
        }
        if (strcmp(ln->mode, c->links[0].mode) != 0) {
            psc__fail(c, PSC_EINVAL, "psd at %s runs %s but psd at %s runs %s: every psd holding a part of the model "
                                "must run the same mode", c->links[0].server, c->links[0].mode, ln->server, ln->mode);
            return open_fail(c, fresh, i, PSC_EINVAL);
        }
    }
    snprintf(c->mode, sizeof c->mode, "%s", c->links[0].mode);
    c->bsp = strcmp(c->mode, "bsp") == 0;
    int hrc = hogwild_open(c, fresh);
    if (hrc != 0)
        return hrc;
    hrc = plan_rejoin(c, fresh);
    if (hrc != 0)
        return hrc;
    for (uint32_t i = 0; i < c->ndense; i++) { /* a table-only part holds no values */
        psc_link *ln = &c->links[i];
        if (!fresh[i])
            continue;
        if (need_init[i] && c->connected)
            PS_LOG(PS_LOG_WARN, "psd at %s has no model (restarted without its state?): giving it ours", ln->server);
        size_t sent = 0;
        int rc = need_init[i] ? psc__chunks_out(c, ln, PS_MSG_INIT, c->params + ln->lo, 0, ln->hi - ln->lo, 0, &sent) : 0;
        if (rc == 0)
            rc = psc__chunks_acks(c, ln, sent, 0);
        if (rc == 0)
            rc = psc__pull_part(c, ln, c->params + ln->lo, 0, ln->hi - ln->lo, 0);
        if (rc != 0)
            return open_fail(c, fresh, i, rc);
    }
    int rc = average_opened(c, fresh);
    if (rc != 0)
        return open_fail(c, fresh, 0, rc);
    c->version = c->links[0].version;
    c->pushed = 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        if (fresh[i])
            psc__hb_start(&c->links[i]);
    return 0;
}

/* A refusal that trying again cannot change: said at once, in words that
 * say what to do. Returns the public code. */
static int refused(psc_client *c, int rc)
{
    int code = psc__public_code(c, rc);
    if (code == PSC_ESHARD && !c->connected) {
        char why[600];
        snprintf(why, sizeof why, "%.590s", psc_errmsg(c));
        return psc__fail(c, code, "psd at %.280s refused shard %u/%u (%s); every worker of a job needs a shard of its "
                             "own (--shard K/M, or auto under a launcher), and a worker that was just stopped holds "
                             "its shard until psd notices (heartbeat_timeout); not retried",
                    c->links[c->err_link].server, c->shard, c->nshards, why);
    }
    return code;
}

/* Sleeps ms; returns PS_CLIENT_EINTR when a signal ends it early and the
 * option interrupt is on, else 0. */
static int sleep_ms(psc_client *c, uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    if (c->interrupt && __atomic_load_n(&c->stop_req, __ATOMIC_RELAXED))
        return PS_CLIENT_EINTR; /* psc_interrupt came first */
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        if (c->interrupt) {
            c->intr = 1;
            return PS_CLIENT_EINTR;
        }
    return 0;
}

/* Opens until it works, with exponential backoff (100 ms doubling to 5 s,
 * or to 250 ms when the failing part has replicas; jitter) for up to limit_ms; what: "reconnect" or "connect". The
 * backoff spaces the attempts' starts: an attempt that took long (at most
 * HANDSHAKE_MS before its hello is answered) is followed by a shorter
 * wait, or none. An attempt after which a newer part map is adopted (a
 * WELCOME or an ERROR LAYOUT carried it) is followed by another at once:
 * the links it set up are opened, or said hello to with their new
 * layouts; it does not count as an attempt. */
int psc__open_retry(psc_client *c, int limit_ms, const char *first, int at_once)
{
    int64_t start = psc__mono_ms(), deadline = start + limit_ms, tried = start;
    uint64_t delay = 100;
    unsigned seed = (unsigned)(c->shard * 2654435761u) ^ (unsigned)start ^ (unsigned)getpid();
    int quiet = at_once; /* opening what a part map added is no reconnect */
    for (int attempt = 1;; attempt++) {
        if ((attempt > 1 || c->connected) && !at_once) {
            uint64_t ms = delay / 2 + (uint64_t)rand_r(&seed) % (delay / 2 + 1);
            int64_t now = psc__mono_ms();
            uint64_t took = attempt > 1 && now > tried ? (uint64_t)(now - tried) : 0;
            ms = ms > took ? ms - took : 0;
            if (now + (int64_t)ms > deadline)
                ms = deadline > now ? (uint64_t)(deadline - now) : 0;
            if (sleep_ms(c, ms) != 0)
                return psc__fail(c, PSC_EINTR, "psc_%s: interrupted by a signal while waiting for psd at %.280s",
                            c->connected ? "reconnect" : "connect", c->links[c->err_link].server);
        }
        at_once = 0;
        c->quick = attempt == 1 && !c->connected;
        tried = psc__mono_ms();
        int rc = do_open(c);
        c->quick = 0;
        if (c->pm.epoch > c->epoch) {
            int ad = psc__pmap_adopt(c);
            if (ad < 0)
                return ad;
            at_once = 1;
            attempt--;
            continue;
        }
        if (rc == 0) {
            if (c->connected && !quiet)
                PS_LOG(PS_LOG_INFO, "reconnected to psd at %s after %.1f s (attempt %d): mode %s, model version "
                                    "%" PRIu64, c->links[c->err_link].server, (double)(psc__mono_ms() - start) / 1e3,
                       attempt, c->mode, c->version);
            return 0;
        }
        uint32_t li = c->err_link;
        if (!psc__recoverable(c, rc))
            return refused(c, rc);
        link_next_addr(c, li, rc);
        if (psc__mono_ms() >= deadline) {
            char why[300];
            snprintf(why, sizeof why, "%.290s", first ? first : psc_errmsg(c));
            return psc__fail(c, rc == PS_EREMOTE ? psc__public_code(c, rc) : (c->connected ? PSC_ETIMEOUT : rc),
                        "psd at %.280s unreachable for %.0f s (%.300s); giving up (the %s limit)",
                        c->links[li].server, (double)(psc__mono_ms() - start) / 1e3, why,
                        c->connected ? "reconnect_s" : "connect_s");
        }
        if (attempt == 1 && !c->connected)
            PS_LOG(PS_LOG_INFO, "waiting for psd at %s (%s); trying for up to %d s (connect_s)",
                   c->links[li].server, psc_errmsg(c), limit_ms / 1000);
        uint64_t cap = c->links[li].naddrs > 1 ? FAILOVER_CAP_MS : BACKOFF_CAP_MS;
        delay = delay * 2 > cap ? cap : delay * 2;
    }
}

/* After a wait a signal interrupted (c->desync), the connections may be
 * mid-frame or owe the interrupted call's reply, which the next call would
 * take for its own: they are closed, and opened anew (the model pulled
 * again). */
static int resync(psc_client *c)
{
    for (uint32_t i = 0; i < c->nlinks; i++)
        psc__link_close(&c->links[i]);
    int rc = psc__open_retry(c, c->reconnect_ms, NULL, 0);
    if (rc == 0)
        c->desync = 0;
    return rc;
}

int psc__ready(psc_client *c, const char *what)
{
    if (c->closed)
        return psc__fail(c, PSC_ESTATE, "%s: the client is closed", what);
    if (!c->connected)
        return psc__fail(c, PSC_ESTATE, "%s: not connected (psc_connect first)", what);
    if (psc__busy(c))
        return psc__fail(c, PSC_EBUSY, "%s: a step is in flight (psc_wait first)", what);
    psc__call_begins(c);
    if (c->desync) {
        c->intr = __atomic_load_n(&c->stop_req, __ATOMIC_RELAXED);
        return resync(c);
    }
    return 0;
}

int psc_connect(psc_client *c)
{
    if (c->closed)
        return psc__fail(c, PSC_ESTATE, "psc_connect: the client is closed");
    if (c->connected)
        return psc__fail(c, PSC_ESTATE, "psc_connect: already connected");
    if (c->topk > 0 && c->want_dt == PS_DT_BF16)
        return psc__fail(c, PSC_EINVAL, "topk sends float32 without its zeros; wire bf16 would send every value as "
                                        "bfloat16: use one or the other");
    if (c->topk > 0 && !c->skip_zeros)
        return psc__fail(c, PSC_EINVAL, "topk needs skip_zeros on: its pushes are mostly zeros and go without them");
    int rc = psc__fix_layout(c);
    if (rc != 0)
        return rc;
    c->intr = __atomic_load_n(&c->stop_req, __ATOMIC_RELAXED);
    psc__call_begins(c);
    rc = psc__open_retry(c, c->connect_ms, NULL, 0);
    psc__waiting_clear(c); /* its pull may have waited */
    if (rc == 0)
        c->connected = 1;
    return rc;
}

int psc__reconnect(psc_client *c, int rc_lost)
{
    char first[300];
    snprintf(first, sizeof first, "%.290s", psc_errmsg(c));
    PS_LOG(PS_LOG_WARN, "lost psd at %s (%s); reconnecting for up to %d s", c->links[c->err_link].server, first,
           c->reconnect_ms / 1000);
    psc__link_close(&c->links[c->err_link]);
    link_next_addr(c, c->err_link, rc_lost);
    if (c->ndense > 1 && c->bsp && c->links[0].has_plan) {
        /* A planned BSP job over several psd: the psd this worker lost may
         * have declared it lost and gone on without it, while the others
         * kept it and wait for its push, which it would send only after
         * that psd's next round (a worker that comes back waits for one),
         * which waits for the others: a standstill. Leaving every psd and
         * saying hello to all again puts it out of every part's round, and
         * the parts take it back at one round (plan_rejoin; PROTOCOL.md 8,
         * "The plan"). */
        PS_LOG(PS_LOG_INFO, "a planned bsp job over %u psd: leaving every part's round, to rejoin all at one round",
               c->nlinks);
        for (uint32_t i = 0; i < c->nlinks; i++)
            psc__link_close(&c->links[i]);
    }
    /* the links opened anew: the call's pushes go to them again */
    for (uint32_t i = 0; i < c->nlinks; i++)
        c->links[i].reopened |= c->links[i].cl.fd < 0;
    int rc = psc__open_retry(c, c->reconnect_ms, first, 0);
    if (rc == 0)
        c->reconnects++;
    return rc;
}

int psc_reconnect(psc_client *c)
{
    c->desync = 0; /* every link is closed and opened anew below */
    int rc = psc__ready(c, "psc_reconnect");
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < c->nlinks; i++)
        psc__link_close(&c->links[i]);
    c->err_link = 0;
    rc = psc__open_retry(c, c->reconnect_ms, "asked to reconnect", 0);
    if (rc == 0)
        c->reconnects++;
    return rc;
}

int psc__adopt(psc_client *c)
{
    int rc = psc__pmap_adopt(c);
    if (rc <= 0)
        return rc;
    /* the dense links the map kept stay open: what was pushed to them
     * since their last pull still is (a BSP pull waits for its round) */
    int kept = 1, pushed = c->pushed;
    for (uint32_t i = 0; i < c->ndense; i++)
        kept &= c->links[i].cl.fd >= 0;
    rc = psc__open_retry(c, c->reconnect_ms, NULL, 1);
    if (rc == 0 && kept)
        c->pushed = pushed;
    return rc;
}
