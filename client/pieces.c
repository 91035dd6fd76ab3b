/* pieces.c - libpsclient: a BSP step in pieces: which parts go so, the thread that sends their
 * pieces, and reading every part's answers as they come. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

/* A part that a step sends in pieces: its psd closes BSP rounds piece by
 * piece (PROTOCOL.md, "Rounds in pieces") and answers over TCP, and option
 * pieces is on, or auto and the psd is on another machine (on this one no
 * link is shared and the pieces only cost). */
int psc__pieced(const psc_client *c, const psc_link *ln)
{
    return c->bsp && c->pieces && (c->pieces > 0 || ln->remote) && ln->piece && !ln->shm_ok && ln->cl.fd >= 0 &&
           ln->piece <= c->chunk && ln->hi - ln->lo > ln->piece;
}

void *psc__pieces_send(void *arg)
{
    pieces_job *j = arg;
    psc_client *c = j->c;
    for (uint64_t q = 0, more = 1; more; q++) {
        more = 0;
        for (uint32_t k = 0; k < c->ndense; k++) {
            uint32_t i = (j->start + k) % c->ndense;
            psc_link *ln = &c->links[i];
            uint64_t n = ln->hi - ln->lo, off = q * ln->piece;
            if (!j->on[i] || j->rc[i] || off >= n)
                continue;
            more = 1;
            uint64_t len = n - off < ln->piece ? n - off : ln->piece;
            ps_msg m;
            ps_msg_init(&m, PS_MSG_PUSH);
            m.has = PS_F_OFF | PS_F_DATA | PS_F_FIN | PS_F_BASE;
            m.off = off;
            m.data = c->grads + ln->lo + off;
            m.ndata = len;
            m.fin = off + len == n;
            m.base = j->ver[i];
            m.has2 = PS_F2_PID; /* applied once (PROTOCOL.md 15) */
            m.pid = psc__pid(ln, q);
            int rc = ps_conn_send(&ln->cl, &m);
            if (rc == 0) {
                ps_msg_init(&m, PS_MSG_PULL);
                m.has = PS_F_OFF | PS_F_LEN | PS_F_MIN;
                m.off = off;
                m.len = len;
                m.min = j->ver[i] + 1;
                rc = ps_conn_send(&ln->cl, &m);
            }
            j->rc[i] = rc;
        }
    }
    return NULL;
}

/* Reads the answers of the pieced parts as they come, whichever part they
 * come from (a part not read would stall its psd's replies on this
 * worker's receive window): each piece's OK and its values, straight into
 * the parameter vector. A part's slice of the plan is the one its last
 * answer that had one said. */
void psc__pieces_recv(psc_client *c, pieces_job *j)
{
    uint64_t acks[PS_PARTS_MAX] = {0}, vals[PS_PARTS_MAX] = {0}, np[PS_PARTS_MAX] = {0};
    uint64_t ver[PS_PARTS_MAX] = {0};
    int has_slice[PS_PARTS_MAX] = {0}, done[PS_PARTS_MAX] = {0}, live[PS_PARTS_MAX] = {0};
    ps_slice slice[PS_PARTS_MAX];
    for (uint32_t i = 0; i < c->ndense; i++)
        if ((live[i] = j->on[i])) {
            uint64_t n = c->links[i].hi - c->links[i].lo;
            np[i] = (n + c->links[i].piece - 1) / c->links[i].piece;
            ver[i] = j->ver[i];
        }
    for (;;) {
        struct pollfd pf[PS_PARTS_MAX];
        uint32_t at[PS_PARTS_MAX], npf = 0;
        for (uint32_t i = 0; i < c->ndense; i++)
            if (live[i] && (acks[i] < np[i] || vals[i] < np[i])) {
                pf[npf] = (struct pollfd){.fd = c->links[i].cl.fd, .events = POLLIN};
                at[npf++] = i;
            }
        if (!npf)
            break;
        int k = poll(pf, npf, c->timeout_ms > 0 ? c->timeout_ms : -1);
        if (k < 0 && errno == EINTR)
            continue;
        for (uint32_t f = 0; f < npf; f++) {
            uint32_t i = at[f];
            psc_link *ln = &c->links[i];
            int rc = 0;
            if (k == 0)
                rc = PS_ETIMEOUT;
            else if (k < 0)
                rc = PS_ECLOSED;
            else if (!pf[f].revents)
                continue;
            ps_msg r;
            if (rc == 0)
                rc = ps_conn_recv(&ln->cl, &r, c->timeout_ms);
            if (rc == PS_EREMOTE && ln->cl.remote_code == -PS_ESTALE) {
                acks[i]++; /* its round closed without this push: dropped, the pull answers */
                c->dropped += i == 0 && acks[i] == np[i]; /* a step counts once, by part 0's fin */
                continue;
            }
            if (rc == 0 && r.type == PS_MSG_OK && acks[i] < np[i]) {
                acks[i]++;
                continue;
            }
            if (rc == 0 && (r.type != PS_MSG_PARAMS || r.off % ln->piece || r.off + r.ndata > ln->hi - ln->lo))
                rc = PS_EMALFORMED;
            if (rc != 0) {
                j->rrc[i] = rc;
                live[i] = 0;
                continue;
            }
            memcpy(c->params + ln->lo + r.off, r.data, r.ndata * sizeof(float));
            vals[i]++;
            ver[i] = r.mver > ver[i] ? r.mver : ver[i];
            if (ln->cl.has_slice) {
                has_slice[i] = 1;
                slice[i] = ln->cl.slice;
            }
            done[i] |= ln->cl.done;
        }
    }
    for (uint32_t i = 0; i < c->ndense; i++)
        if (np[i] && live[i]) {
            psc_link *ln = &c->links[i];
            ln->version = ver[i];
            ln->cl.has_slice = has_slice[i];
            if (has_slice[i])
                ln->cl.slice = slice[i];
            ln->cl.done = done[i];
        }
}
