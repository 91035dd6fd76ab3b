/* conn.c - a blocking connection to psd, under libpsclient and psctl (see
 * conn.h): connect, frames out and in, replies by id, the hello. The form
 * a tensor travels in (bfloat16, zstd, without zeros) is conn_form.c's. */
#define _GNU_SOURCE /* ppoll, sigisemptyset */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "conn_form.h"
#include "hostport.h"
#include "log.h"
#include "resolve.h"
#include "proto/errors.h"

static int cfail(ps_conn *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}

void ps_conn_init(ps_conn *c)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->wake_fd = -1;
    c->next_id = 1;
    c->max_frame = PS_FRAME_MAX_HARD;
    c->lag = -1;
    msgpack_zone_init(&c->zone, 4096);
}

/* Frees a buffer and forgets its capacity. */
#define DROP(p, cap) (free(p), (p) = NULL, (cap) = 0)

void ps_conn_free(ps_conn *c)
{
    ps_conn_close(c);
    DROP(c->rbuf, c->rcap);
    DROP(c->narrow, c->narrow_cap);
    DROP(c->zbuf, c->zbuf_cap);
    DROP(c->zshuf, c->zshuf_cap);
    DROP(c->zin, c->zin_cap);
    DROP(c->wide, c->wide_cap);
    ps_codec_free(&c->codec);
    ps_buf_free(&c->wbuf);
    msgpack_zone_destroy(&c->zone);
}

void ps_conn_close(ps_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

void ps_conn_swap_rbuf(ps_conn *c, uint8_t **buf, size_t *cap)
{
    uint8_t *b = c->rbuf;
    size_t n = c->rcap;
    c->rbuf = *buf;
    c->rcap = *cap;
    *buf = b;
    *cap = n;
}

void ps_conn_swap_wide(ps_conn *c, float **buf, size_t *cap)
{
    float *b = c->wide;
    size_t n = c->wide_cap;
    c->wide = *buf;
    c->wide_cap = *cap;
    *buf = b;
    *cap = n;
}

const char *ps_conn_error(const ps_conn *c)
{
    return c->err[0] ? c->err : "no error";
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A signal made c->wake_fd readable (only when signals end waits). */
static int woken(const ps_conn *c)
{
    if (!c->interrupted || c->wake_fd < 0)
        return 0;
    struct pollfd w = {.fd = c->wake_fd, .events = POLLIN};
    return poll(&w, 1, 0) > 0;
}

/* The first c->spin_us microseconds of a wait for a reply (not past the
 * deadline): polls the socket without sleeping, yielding the CPU between
 * polls, so that psd's reply need not wake a sleeping thread (on a virtual
 * machine whose idle CPUs halt, that wake-up costs the sender an interrupt
 * between CPUs). When signals end waits (c->interrupted), they are blocked
 * meanwhile and the spin ends as soon as one is pending, so that the sleep
 * after it, with the caller's mask back (ppoll), runs its handler and ends
 * with EINTR as a wait that slept from the start would; *blocked is then
 * 1 and *mask the caller's mask, to restore. Returns 1: readable; 0: not
 * yet. */
static int spin_fd(ps_conn *c, int64_t deadline, sigset_t *mask, int *blocked)
{
    sigset_t all, pending;
    *blocked = c->interrupted != NULL;
    if (*blocked) {
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, mask);
    }
    int64_t end = now_us() + c->spin_us;
    if (deadline >= 0 && deadline * 1000 < end)
        end = deadline * 1000;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    do {
        if (poll(&p, 1, 0) > 0) {
            if (*blocked)
                pthread_sigmask(SIG_SETMASK, mask, NULL);
            *blocked = 0;
            return 1;
        }
        if (*blocked && (sigpending(&pending), !sigisemptyset(&pending)))
            break;
        if (woken(c))
            break;
        sched_yield();
    } while (now_us() < end);
    return 0;
}

/* Waits until fd is ready for events or the deadline (-1: none) passes. */
static int wait_fd(ps_conn *c, short events, int64_t deadline)
{
    sigset_t mask;
    int blocked = 0; /* spin_fd blocked signals; mask: the caller's */
    if (events == POLLIN && c->spin_us > 0 && !(c->interrupted && __atomic_load_n(c->interrupted, __ATOMIC_RELAXED)) &&
        spin_fd(c, deadline, &mask, &blocked))
        return 0;
    for (;;) {
        int tmo = -1;
        if (deadline >= 0) {
            int64_t left = deadline - ps_mono_ms();
            if (left <= 0) {
                if (blocked)
                    pthread_sigmask(SIG_SETMASK, &mask, NULL);
                return cfail(c, PS_ETIMEOUT, "%s: timed out waiting for psd", c->server);
            }
            tmo = left > 60000 ? 60000 : (int)left;
        }
        if (c->interrupted && !blocked) {
            /* signals blocked from this check to the sleep, which unblocks
             * them atomically (ppoll): one that comes in between is
             * pending then, and ends the sleep at once; with poll it would
             * run its handler before the sleep and not end it */
            sigset_t all;
            sigfillset(&all);
            pthread_sigmask(SIG_BLOCK, &all, &mask);
            blocked = 1;
        }
        if (c->interrupted && __atomic_load_n(c->interrupted, __ATOMIC_RELAXED)) {
            if (blocked)
                pthread_sigmask(SIG_SETMASK, &mask, NULL);
            return cfail(c, PS_CLIENT_EINTR, "%s: interrupted by a signal while waiting for psd", c->server);
        }
        /* p[1]: the wake-up descriptor, when signals end waits */
        struct pollfd p[2] = {{.fd = c->fd, .events = events}, {.fd = c->wake_fd, .events = POLLIN}};
        nfds_t np = c->interrupted && c->wake_fd >= 0 ? 2 : 1;
        int n;
        if (blocked) { /* the caller's mask while it sleeps: a pending signal's handler runs in it */
            struct timespec ts = {tmo / 1000, (long)(tmo % 1000) * 1000000};
            n = ppoll(p, np, tmo < 0 ? NULL : &ts, &mask);
            int e = errno;
            pthread_sigmask(SIG_SETMASK, &mask, NULL);
            blocked = 0;
            errno = e;
        } else {
            n = poll(p, np, tmo);
        }
        if (n > 0 && p[0].revents)
            return 0; /* a reply first: the signal ends the next wait, or the call's caller sees it */
        if ((n > 0 && p[1].revents) || (n < 0 && errno == EINTR && c->interrupted)) {
            __atomic_store_n(c->interrupted, 1, __ATOMIC_RELAXED);
            return cfail(c, PS_CLIENT_EINTR, "%s: interrupted by a signal while waiting for psd", c->server);
        }
        if (n < 0 && errno != EINTR)
            return cfail(c, PS_EIO, "%s: poll: %s", c->server, strerror(errno));
    }
}

/* Tries each address of res in turn until one connects (c->fd then set,
 * blocking). 0; PS_ECONNECT with *last_errno; or what waiting failed with
 * (the deadline passed), which ends the attempts. */
static int connect_any(ps_conn *c, const struct addrinfo *res, int64_t deadline, int *last_errno)
{
    int rc = PS_ECONNECT;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            *last_errno = errno;
            continue;
        }
        c->fd = fd;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                *last_errno = errno;
                ps_conn_close(c);
                continue;
            }
            rc = wait_fd(c, POLLOUT, deadline);
            if (rc != 0) {
                ps_conn_close(c);
                return rc;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr != 0) {
                *last_errno = soerr;
                rc = PS_ECONNECT;
                ps_conn_close(c);
                continue;
            }
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        return 0;
    }
    return rc;
}

int ps_conn_connect(ps_conn *c, const char *hostport, int timeout_ms)
{
    char host[PS_HOSTPORT_HOST_MAX], perr[256], port_s[16];
    int port;
    struct addrinfo hints = {0}, *res = NULL;
    int64_t deadline = timeout_ms < 0 ? -1 : ps_mono_ms() + timeout_ms;

    ps_conn_close(c);
    snprintf(c->server, sizeof c->server, "%s", hostport);
    if (ps_hostport_parse(hostport, host, sizeof host, &port, perr, sizeof perr) != 0)
        return cfail(c, PS_EINVAL, "bad server address '%s': %s", hostport, perr);
    if (port == 0)
        return cfail(c, PS_EINVAL, "bad server address '%s': port 0", hostport);
    snprintf(port_s, sizeof port_s, "%d", port);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    /* localhost is loopback without the resolver (RFC 6761): 127.0.0.1,
     * then ::1, as a resolver with the usual /etc/hosts answers */
    const char *names[2] = {host, NULL};
    if (ps_host_is_localhost(host)) {
        names[0] = "127.0.0.1", names[1] = "::1";
        hints.ai_flags = AI_NUMERICHOST;
    }
    int rc = PS_ECONNECT, last_errno = 0, resolved = 0, gai = 0, timed_out = 0;
    for (int i = 0; i < 2 && names[i] && rc == PS_ECONNECT; i++) {
        gai = ps_resolve_by(names[i], port_s, &hints, &res, deadline, &timed_out);
        if (timed_out)
            return cfail(c, PS_ETIMEOUT, "cannot resolve '%s': no answer within %d ms", host, timeout_ms);
        if (gai != 0)
            continue;
        resolved = 1;
        rc = connect_any(c, res, deadline, &last_errno);
        freeaddrinfo(res);
    }
    if (!resolved)
        return cfail(c, PS_ECONNECT, "cannot resolve '%s': %s", host, gai_strerror(gai));
    if (rc == PS_ECONNECT)
        return cfail(c, rc, "cannot connect to psd at %s: %s", hostport,
                     last_errno ? strerror(last_errno) : "no address");
    return rc;
}

static int write_all(ps_conn *c, struct iovec *iov, int iovcnt)
{
    while (iovcnt > 0) {
        /* MSG_NOSIGNAL: a peer that went away is an error to handle, not
         * a SIGPIPE that kills the process */
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
        ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return cfail(c, errno == EPIPE || errno == ECONNRESET ? PS_ECLOSED : PS_EIO, "%s: send: %s",
                         c->server, strerror(errno));
        }
        while (iovcnt > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++, iovcnt--;
        }
        if (iovcnt > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

static int send_locked(ps_conn *c, ps_msg *m)
{
    size_t dlen = 0;
    if (c->fd < 0)
        return cfail(c, PS_ECLOSED, "not connected");
    ps_msg nm;
    int rc = ps_conn_form(c, &m, &nm);
    if (rc != 0)
        return rc;
    rc = ps_msg_encode(m, &c->wbuf, &dlen, NULL, NULL);
    if (rc != 0)
        return cfail(c, rc, "cannot encode %s: %s", ps_msg_type_name(m->type), ps_strerror(rc));
    struct iovec iov[2] = {{c->wbuf.p, c->wbuf.len}, {(void *)(uintptr_t)ps_msg_data_bytes(m), dlen}};
    return write_all(c, iov, dlen ? 2 : 1);
}

static int send_msg(ps_conn *c, ps_msg *m)
{
    if (c->send_lock)
        pthread_mutex_lock(c->send_lock);
    int rc = send_locked(c, m);
    if (c->send_lock)
        pthread_mutex_unlock(c->send_lock);
    return rc;
}

int ps_conn_send(ps_conn *c, ps_msg *m)
{
    if (!(m->has & PS_F_ID)) {
        m->id = c->next_id++;
        m->has |= PS_F_ID;
    }
    return send_msg(c, m);
}

int ps_conn_send_noreply(ps_conn *c, ps_msg *m)
{
    m->has &= ~PS_F_ID;
    return send_msg(c, m);
}

int ps_conn_send_noreply_held(ps_conn *c, ps_msg *m)
{
    m->has &= ~PS_F_ID;
    return send_locked(c, m);
}

static int read_full(ps_conn *c, uint8_t *dst, size_t len, int64_t deadline)
{
    size_t got = 0;
    while (got < len) {
        int rc = wait_fd(c, POLLIN, deadline);
        if (rc != 0)
            return rc;
        ssize_t n = recv(c->fd, dst + got, len - got, 0);
        if (n == 0)
            return cfail(c, PS_ECLOSED, "%s: psd closed the connection", c->server);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return cfail(c, errno == ECONNRESET ? PS_ECLOSED : PS_EIO, "%s: receive: %s", c->server,
                         strerror(errno));
        }
        got += (size_t)n;
    }
    return 0;
}

/* Room for len bytes in c->rbuf. */
static int rbuf_reserve(ps_conn *c, size_t len)
{
    if (len <= c->rcap)
        return 0;
    uint8_t *p = realloc(c->rbuf, len);
    if (!p)
        return cfail(c, PS_ENOMEM, "out of memory for a %zu-byte frame", len);
    c->rbuf = p;
    c->rcap = len;
    return 0;
}

/* Decodes c->rbuf[0..len) into out; an ERROR becomes PS_EREMOTE.
 * bfloat16 data is widened into c->wide when `widen` is set. */
static int decode_reply(ps_conn *c, size_t len, ps_msg *out, int widen)
{
    char derr[256];
    msgpack_zone_clear(&c->zone);
    ps_scan_limits lim = {PS_MSG_DEPTH_MAX, 1u << 22};
    int rc = ps_msg_decode(c->rbuf, len, &lim, &c->zone, out, &c->scratch_layout, derr, sizeof derr);
    if (rc != 0)
        return cfail(c, rc, "%s: undecodable reply from psd: %s", c->server, derr);
    if (out->type == PS_MSG_PARAMS) {
        c->has_slice = (out->has & PS_F_SLICE) != 0;
        c->slice = out->slice;
        c->done = (out->has & PS_F_DONE) && out->done;
    }
    if (out->type == PS_MSG_PARAMS || out->type == PS_MSG_ROWS) /* a read replica says how far behind it is */
        c->lag = (out->has2 & PS_F2_LAG) ? (int64_t)(out->lag > INT64_MAX ? INT64_MAX : out->lag) : -1;
    if (widen && (out->has & PS_F_DATA) && (out->dt == PS_DT_F32ZSTD || out->dt == PS_DT_BF16)) {
        /* compressed parameters (asked for with rdt 3: exactly ndata
         * float32 values as byte planes in one frame) or bfloat16 ones,
         * into the wide buffer as float32. A frame's own size first:
         * nothing is allocated for a len that the frame does not hold. */
        int zstd = out->dt == PS_DT_F32ZSTD;
        size_t want = (size_t)out->ndata * sizeof(float);
        if (zstd && ps_codec_zstd_check(out->packed, (size_t)out->packed_len, out->ndata) != 0)
            return cfail(c, PS_EMALFORMED, "%s: compressed parameters that are not one zstd frame of %llu float32 "
                         "values", c->server, (unsigned long long)out->ndata);
        if ((rc = ps_conn_grow(c, (void **)&c->wide, &c->wide_cap, (size_t)out->ndata, sizeof(float))) != 0 ||
            (zstd && (rc = ps_conn_grow(c, (void **)&c->zin, &c->zin_cap, want, 1)) != 0))
            return rc;
        float mx;
        char zerr[160];
        if ((rc = ps_codec_decode(&c->codec, out, c->wide, c->zin, &mx, zerr, sizeof zerr)) != 0)
            return cfail(c, rc == PS_ENOMEM ? rc : PS_EMALFORMED, "%s: parameters: %s", c->server, zerr);
    }
    if (out->type == PS_MSG_ERROR) {
        c->remote_code = out->code;
        c->remote_leader[0] = '\0';
        if (out->has2 & PS_F2_LEADER) /* 1..PS_ADDR_MAX bytes without NUL (the decoder checked) */
            snprintf(c->remote_leader, sizeof c->remote_leader, "%.*s", (int)out->leader.len, out->leader.p);
        /* codes travel positive; ps_errname takes either sign, so no negation
         * (a peer's INT32_MIN must not overflow) */
        if (out->text_len)
            return cfail(c, PS_EREMOTE, "psd refused: %.*s [%s]", (int)out->text_len, out->text,
                         ps_errname(out->code));
        return cfail(c, PS_EREMOTE, "psd refused: %s [%s]", ps_strerror(out->code), ps_errname(out->code));
    }
    return 0;
}

/* One frame of ps_conn_recv_into, by deadline. */
static int recv_one(ps_conn *c, ps_msg *out, float *dst, size_t n, int64_t deadline)
{
    uint8_t hdr[PS_FRAME_HDR];
    uint32_t plen = 0;
    if (c->fd < 0)
        return cfail(c, PS_ECLOSED, "not connected");
    int rc = read_full(c, hdr, sizeof hdr, deadline);
    if (rc != 0)
        return rc;
    rc = ps_frame_header(hdr, sizeof hdr, c->max_frame, &plen);
    if (rc < 0)
        return cfail(c, rc, "%s: bad frame from psd (length %u): %s", c->server, plen, ps_strerror(rc));
    /* a PARAMS reply of n values comes in the connection's wire type */
    size_t esize = ps_dtype_size(c->wire_dt);
    size_t dbytes = dst ? n * esize : 0;
    size_t pre = plen; /* bytes read into rbuf first */
    if (dbytes && plen > dbytes + 5)
        pre = plen - dbytes;
    if ((rc = rbuf_reserve(c, pre)) != 0 || (rc = read_full(c, c->rbuf, pre, deadline)) != 0)
        return rc;
    if (pre == plen)
        return decode_reply(c, plen, out, 1);
    /* Is the frame n floats of "data" at its end (psd's PARAMS: "data" is
     * the last field, a bin 32)? Then they go straight to dst, and the rest
     * is decoded as if "data" were empty. */
    uint8_t *t = c->rbuf + pre - 5;
    uint32_t blen = (uint32_t)t[1] << 24 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 8 | t[4];
    if (t[0] != 0xc6 || blen != dbytes) {
        /* something else: read it all and decode it as usual */
        if ((rc = rbuf_reserve(c, plen)) != 0 || (rc = read_full(c, c->rbuf + pre, plen - pre, deadline)) != 0)
            return rc;
        return decode_reply(c, plen, out, 1);
    }
    if (esize == sizeof(float)) {
        if ((rc = read_full(c, (uint8_t *)dst, dbytes, deadline)) != 0)
            return rc;
    } else {
        if ((rc = ps_conn_grow(c, (void **)&c->narrow, &c->narrow_cap, n, sizeof(uint16_t))) != 0 ||
            (rc = read_full(c, (uint8_t *)c->narrow, dbytes, deadline)) != 0)
            return rc;
    }
    memset(t + 1, 0, 4);
    if ((rc = decode_reply(c, pre, out, 0)) != 0)
        return rc;
    if (!(out->has & PS_F_DATA) || out->ndata != 0)
        return cfail(c, PS_EMALFORMED, "%s: reply with a tensor that is not its last field", c->server);
    if (out->dt != c->wire_dt)
        return cfail(c, PS_EMALFORMED, "%s: parameters came as %s, asked for %s", c->server,
                     ps_dtype_name(out->dt), ps_dtype_name(c->wire_dt));
    if (esize != sizeof(float))
        ps_codec_bf16_decode(dst, c->narrow, n);
    out->data = dst;
    out->data16 = NULL;
    out->dt = PS_DT_F32;
    out->ndata = n;
    return 0;
}

/* A wait notice: psd's OK to a heartbeat that asked "wait" (PROTOCOL.md,
 * HEARTBEAT). No reply to a request of ours carries "wait". */
static int is_wait_notice(const ps_msg *m)
{
    return m->type == PS_MSG_OK && (m->has & PS_F_WAIT) && m->wait;
}

int ps_conn_recv_into(ps_conn *c, ps_msg *out, float *dst, size_t n, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ps_mono_ms() + timeout_ms;
    for (;;) {
        int rc = recv_one(c, out, dst, n, deadline);
        if (rc != 0 || !is_wait_notice(out))
            return rc;
        if (c->on_wait)
            c->on_wait(c->on_wait_arg, out->text ? out->text : "", out->text ? out->text_len : 0);
    }
}

int ps_conn_recv(ps_conn *c, ps_msg *out, int timeout_ms)
{
    return ps_conn_recv_into(c, out, NULL, 0, timeout_ms);
}

int ps_conn_pull_chunks(ps_conn *c, float *dst, uint64_t base, uint64_t n, uint64_t min, uint64_t chunk,
                          unsigned window, uint64_t *version, int timeout_ms)
{
    if (window < 1)
        window = 1;
    uint64_t asked = 0; /* floats asked for */
    for (uint64_t off = 0; off < n;) {
        while (asked < n && asked < off + (uint64_t)window * chunk) {
            ps_msg m;
            ps_msg_init(&m, PS_MSG_PULL);
            m.has = PS_F_OFF | PS_F_LEN | PS_F_MIN;
            m.off = base + asked;
            m.len = n - asked < chunk ? n - asked : chunk;
            m.min = min;
            int rc = ps_conn_send(c, &m);
            if (rc != 0)
                return rc;
            asked += m.len;
        }
        uint64_t len = n - off < chunk ? n - off : chunk;
        ps_msg r;
        int rc = ps_conn_recv_into(c, &r, dst + off, (size_t)len, timeout_ms);
        if (rc != 0)
            return rc;
        if (r.type != PS_MSG_PARAMS || r.off != base + off || r.ndata != len)
            return cfail(c, PS_EMALFORMED, "%s: pull of [%llu, %llu): unexpected %s reply", c->server,
                         (unsigned long long)(base + off), (unsigned long long)(base + off + len),
                         ps_msg_type_name(r.type));
        if (r.data != dst + off) /* not read in place */
            memcpy(dst + off, r.data, len * sizeof(float));
        *version = r.mver;
        off += len;
    }
    return 0;
}

int ps_conn_call(ps_conn *c, ps_msg *req, ps_msg *reply, int timeout_ms)
{
    int rc = ps_conn_send(c, req);
    if (rc != 0)
        return rc;
    rc = ps_conn_recv(c, reply, timeout_ms);
    if (rc != 0 && rc != PS_EREMOTE)
        return rc;
    if ((reply->has & PS_F_ID) && reply->id != req->id && reply->id != 0)
        return cfail(c, PS_EMALFORMED, "%s: reply to request %llu, expected %llu", c->server,
                     (unsigned long long)reply->id, (unsigned long long)req->id);
    return rc;
}

int ps_conn_admin(ps_conn *c, const char *cmd, const char *const *args, unsigned n, ps_msg *r, int timeout_ms)
{
    if (n > PS_ARGS_MAX)
        return cfail(c, PS_EINVAL, "%s: %u arguments, at most %d", cmd, n, PS_ARGS_MAX);
    ps_msg m;
    ps_msg_init(&m, PS_MSG_ADMIN);
    m.has = PS_F_CMD | (n ? PS_F_ARGS : 0);
    snprintf(m.cmd, sizeof m.cmd, "%s", cmd);
    for (unsigned i = 0; i < n; i++)
        m.args[i] = (ps_str){args[i], (uint32_t)strlen(args[i])};
    m.nargs = n;
    return ps_conn_call(c, &m, r, timeout_ms);
}

/* ---- the handshake ------------------------------------------------------ */

int ps_conn_hello(ps_conn *c, ps_msg *hello, const uint8_t *token, size_t token_len, ps_msg *welcome,
                    int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ps_mono_ms() + timeout_ms;
    int rc = ps_conn_call(c, hello, welcome, timeout_ms);
    if (rc != 0)
        return rc;
    if (welcome->type == PS_MSG_WELCOME) {
        if (token_len)
            PS_LOG(PS_LOG_DEBUG, "%s: psd requires no token; the one given is not used", c->server);
        return 0;
    }
    if (welcome->type != PS_MSG_CHALLENGE)
        return cfail(c, PS_EMALFORMED, "%s: psd answered hello with %s", c->server,
                     ps_msg_type_name(welcome->type));
    if (!token_len)
        return cfail(c, PS_EAUTH, "%s: psd requires a token: pass --token-file (or set PSD_TOKEN_FILE)",
                     c->server);
    if (ps_auth_init() != 0)
        return cfail(c, PS_EIO, "libsodium cannot start; cannot authenticate");

    /* AUTH: our nonce and the proof, which binds what the hello claimed */
    uint8_t nonce[PS_AUTH_NONCE_LEN], want[PS_AUTH_MAC_LEN];
    memcpy(nonce, welcome->nonce, sizeof nonce); /* welcome is overwritten below */
    ps_msg a;
    ps_msg_init(&a, PS_MSG_AUTH);
    a.has = PS_F_CNONCE | PS_F_PROOF;
    ps_auth_random(a.cnonce, sizeof a.cnonce);
    ps_auth_client_proof(token, token_len, nonce, a.cnonce, hello, a.proof);
    int left = -1;
    if (deadline >= 0) {
        int64_t l = deadline - ps_mono_ms();
        left = l < 1 ? 1 : (int)l;
    }
    rc = ps_conn_call(c, &a, welcome, left);
    if (rc != 0)
        return rc;
    if (welcome->type != PS_MSG_WELCOME)
        return cfail(c, PS_EMALFORMED, "%s: psd answered auth with %s", c->server, ps_msg_type_name(welcome->type));
    /* psd must prove the secret too, or we talk to an impostor */
    ps_auth_server_proof(token, token_len, a.cnonce, nonce, want);
    if (!(welcome->has & PS_F_SPROOF) || !ps_auth_mac_equal(want, welcome->sproof))
        return cfail(c, PS_EAUTH, "%s: psd accepted our token but could not prove it holds it: not the psd "
                                  "we trust, or a different token",
                     c->server);
    return 0;
}
