/* chunks.c - libpsclient: one link's chunked requests: values sent as
 * INIT or PUSH chunks back to back and their OKs read after, a range
 * pulled in chunks, and the base version a push says. Used by opening a
 * link (link.c: initial values, the first pull) and by a step (step.c). */
#include "internal.h"

/* Sends values[0..n) for the link's values [off, off + n) as chunks of type
 * INIT or PUSH (fin on the last), back back, without reading the OKs:
 * *sent counts the chunks that went. */
int psc__chunks_out(psc_client *c, psc_link *ln, uint32_t type, const float *values, uint64_t off, size_t n,
                    uint64_t base, size_t *sent)
{
    *sent = 0;
    for (size_t k = 0; k < n; k += c->chunk) {
        size_t len = n - k < c->chunk ? n - k : c->chunk;
        ps_msg m;
        ps_msg_init(&m, type);
        m.has = PS_F_OFF | PS_F_DATA | PS_F_FIN | (type == PS_MSG_PUSH ? PS_F_BASE : 0);
        m.off = off + k;
        m.data = values + k;
        m.ndata = len;
        m.fin = k + len == n;
        m.base = base;
        if (type == PS_MSG_PUSH) { /* applied once (PROTOCOL.md 15) */
            m.has2 = PS_F2_PID;
            m.pid = psc__pid(ln, k / c->chunk);
        }
        int rc = ps_conn_send(&ln->cl, &m);
        if (rc == 0 && c->pull_window == 0) /* option pull_window 0: each chunk waits for its OK */
            rc = psc__chunks_acks(c, ln, 1, type == PS_MSG_PUSH && ln == c->links);
        else if (rc == 0)
            (*sent)++;
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Reads the OKs of `sent` chunks (psd answers in order). A push psd
 * dropped because its round had closed is counted, not an error. */
int psc__chunks_acks(psc_client *c, psc_link *ln, size_t sent, int count_drops)
{
    for (size_t i = 0; i < sent; i++) {
        ps_msg r;
        int rc = ps_conn_recv(&ln->cl, &r, c->timeout_ms);
        if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_ESTALE) {
            if (count_drops)
                c->dropped += i + 1 == sent; /* the fin chunk's answer counts the step */
            continue;
        }
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_OK)
            return PS_EMALFORMED;
    }
    return 0;
}

/* Pulls the link's values [off, off + n) at version >= min into dst. */
int psc__pull_part(psc_client *c, psc_link *ln, float *dst, uint64_t off, uint64_t n, uint64_t min)
{
    unsigned window = c->pull_window ? c->pull_window : 1;
    return ps_conn_pull_chunks(&ln->cl, dst, off, n, min, c->chunk, window, &ln->version, c->timeout_ms);
}

/* The model version a push to ln says its gradient was computed on. */
uint64_t psc__push_base(const psc_client *c, const psc_link *ln)
{
    return c->has_base && c->ndense == 1 && ln == c->links ? c->base : ln->version;
}

