/* psclient.c - libpsclient: a worker's connection to psd behind the public
 * API of include/psd/client.h (handshake, initial values, pushes and pulls
 * chunked for big models, a model split over several psd, a shared-memory
 * segment, heartbeat threads, an asynchronous step, reconnects with
 * backoff); the wire itself is proto/ and common/conn.c. This file owns
 * the client object: creating it, the public error texts, what psd said
 * (getters), closing and freeing. The rest, by concern: base.c (the
 * client's error and its message, which errors a reconnect may cure, push
 * ids), options.c (the table of options), layout.c (tensors, links,
 * vectors, the segments), pmap.c (the job's part map after psd moved its
 * parts), link.c (hello, opening, reconnecting), chunks.c
 * (one link's chunked pushes and pulls), step.c (pushes, pulls, PUSHPULL,
 * BARRIER), pieces.c (a BSP step in pieces), threads.c (heartbeat threads,
 * what a step waits for), async.c (the asynchronous step), hogwild.c
 * (Hogwild!), average.c (local SGD, elastic averaging), job.c (reports,
 * live shards, the plan), table.c (embedding tables); internal.h is what
 * they share, and says which file stands on which (calls go one way:
 * base.c at the bottom, this file at the top). */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

#define PSC_STR_(x) #x

#define PSC_STR(x) PSC_STR_(x)

const char *psc_version_string(void)
{
    return PSC_STR(PSC_VERSION_MAJOR) "." PSC_STR(PSC_VERSION_MINOR) "." PSC_STR(PSC_VERSION_PATCH);
}

const char *psc_strerror(int code)
{
    if (code > 0)
        code = -code;
    switch (code) {
    case PSC_OK: return "no error";
    case PSC_EBUSY: return "a psc_pushpull_start is in flight (psc_wait first)";
    case PSC_ENOTFOUND: return "no tensor of that name";
    case PSC_EINTR: return "interrupted by a signal";
    case PSC_ESTATE: return "not allowed in this state (not connected, closed, or the layout already fixed)";
    default: return ps_strerror(code);
    }
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_setup(void)
{
    const char *lv = getenv("PSD_LOG_LEVEL");
    int level = lv ? ps_log_level_parse(lv) : -1;
    ps_log_init(program_invocation_short_name, level >= 0 ? level : PS_LOG_INFO);
}

psc_client *psc_new(void)
{
    pthread_once(&log_once, log_setup);
    psc_client *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    const char *s = getenv("PSD_SERVER");
    snprintf(c->servers, sizeof c->servers, "%s", s && *s ? s : "127.0.0.1:7000");
    s = getenv("PSD_TOKEN_FILE");
    if (s && *s)
        snprintf(c->token_path, sizeof c->token_path, "%s", s);
    c->nshards = 1;
    /* the client's identity for its whole life (PROTOCOL.md 15): random,
     * so that no two clients of a psd share one */
    while (c->cid == 0)
        if (getrandom(&c->cid, sizeof c->cid, 0) != sizeof c->cid)
            c->cid = ((uint64_t)getpid() << 32) ^ (uint64_t)psc__mono_ms() ^ (uint64_t)(uintptr_t)c;
    c->next_pid = 1;
    c->timeout_ms = 600000;
    c->reconnect_ms = 60000;
    c->connect_ms = 30000;
    c->want_dt = PS_DT_F32;
    c->skip_zeros = 1;
    c->compress = -1;
    c->wakeup_fd = -1;
    c->want_shm = 1;
    c->auto_reconnect = 1;
    c->chunk = CHUNK_FLOATS;
    c->pull_window = PS_PULL_WINDOW;
    c->barrier = -1;
    c->pieces = -1;
    c->shm_fd = -1;
    c->report_ms = 1000;
    s = getenv("PSD_REPORT_INTERVAL");
    if (s && *s && psc_set(c, "report_s", s) != 0)
        PS_LOG(PS_LOG_WARN, "PSD_REPORT_INTERVAL='%s' is not 0..86400 seconds; reporting every second", s);
    ps_layout_init(&c->layout);
    pthread_mutex_init(&c->async_mu, NULL);
    pthread_cond_init(&c->async_cv, NULL);
    pthread_mutex_init(&c->wait_mu, NULL);
    return c;
}

const char *psc_mode(const psc_client *c)
{
    return c->mode;
}

uint64_t psc_model_version(const psc_client *c)
{
    return c->version;
}

void psc_shard(const psc_client *c, uint32_t *k, uint32_t *m)
{
    if (k)
        *k = c->shard;
    if (m)
        *m = c->nshards;
}

uint32_t psc_servers(const psc_client *c)
{
    if (c->nlinks)
        return c->nlinks;
    uint32_t n = 1;
    for (const char *p = c->servers; *p; p++)
        n += *p == ',';
    return n;
}

const char *psc_wire(const psc_client *c)
{
    return c->links && c->links[0].cl.wire_dt == PS_DT_BF16 ? "bf16" : "f32";
}

int psc_shm(const psc_client *c)
{
    return c->shm_ok;
}

int psc_table_shm(const psc_client *c)
{
    int all = c->nlinks > 0;
    for (uint32_t i = 0; i < c->nlinks; i++)
        all &= c->links[i].tseg_ok;
    return all;
}

uint64_t psc_reconnects(const psc_client *c)
{
    return c->reconnects;
}

int64_t psc_lag(const psc_client *c)
{
    int64_t lag = -1;
    for (uint32_t i = 0; i < c->nlinks; i++)
        if (c->links[i].cl.lag > lag)
            lag = c->links[i].cl.lag;
    return lag;
}

uint64_t psc_lost_steps(const psc_client *c)
{
    return c->lost;
}

uint64_t psc_dropped(const psc_client *c)
{
    return c->dropped;
}

void psc_close(psc_client *c)
{
    psc_leave(c, NULL);
}

int psc_interrupt(psc_client *c)
{
    if (!c)
        return PSC_EINVAL;
    __atomic_store_n(&c->stop_req, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&c->intr, 1, __ATOMIC_RELAXED);
    return 0;
}

void psc_leave(psc_client *c, const char *reason)
{
    if (!c || c->closed)
        return;
    psc__async_stop(c);
    size_t rlen = reason ? strlen(reason) : 0;
    if (rlen > 200)
        rlen = 200; /* psd keeps a line; the rest would be cut there */
    c->intr = 0; /* the bye goes after an interrupted wait too, and after psc_interrupt */
    __atomic_store_n(&c->stop_req, 0, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < c->nlinks; i++) {
        psc_link *ln = &c->links[i];
        psc__hb_stop(ln);
        if (ln->cl.fd >= 0) {
            ps_msg m, r;
            ps_msg_init(&m, PS_MSG_BYE);
            if (rlen) {
                m.has |= PS_F_TEXT;
                m.text = reason;
                m.text_len = (uint32_t)rlen;
            }
            /* after an interrupted wait the reply may never be read
             * (the connection is mid-frame): psd acts on the bye anyway */
            ps_conn_call(&ln->cl, &m, &r, c->desync ? 1000 : 5000);
        }
        psc__link_close(ln);
    }
    c->closed = 1;
    c->connected = 0;
}

void psc_free(psc_client *c)
{
    if (!c)
        return;
    psc_close(c);
    psc__unmake_links(c);
    ps_token_clear(&c->token);
    pthread_mutex_destroy(&c->async_mu);
    pthread_cond_destroy(&c->async_cv);
    pthread_mutex_destroy(&c->wait_mu);
    psc__tables_free(c);
    free(c);
}
