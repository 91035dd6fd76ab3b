/* psbench_cell.c - one cell of psbench: K worker threads against psd (through
 * libpsclient, dense or table round trips) or against the plain-TCP ceiling
 * server, timed together, with the loop-lag probe beside them; the figures of
 * the cell (run_workers). */
#include "psbench.h"

/* (psbench.h) */
int wfail(bworker *w, int rc, const char *what)
{
    if (w->rc == 0) {
        w->rc = rc ? rc : PSC_EIO;
        snprintf(w->err, sizeof w->err, "worker %d: %s: %s", w->k, what,
                 w->b->sys == SYS_PSD ? psc_errmsg(w->pc) : strerror(errno));
    }
    atomic_store(&w->b->failed, 1);
    return w->rc;
}

/* The same with a reason of psbench's own. */
__attribute__((format(printf, 3, 4)))
int wfailf(bworker *w, int rc, const char *fmt, ...)
{
    if (w->rc == 0) {
        va_list ap;
        int n = snprintf(w->err, sizeof w->err, "worker %d: ", w->k);
        va_start(ap, fmt);
        vsnprintf(w->err + n, sizeof w->err - (size_t)n, fmt, ap);
        va_end(ap);
        w->rc = rc;
    }
    atomic_store(&w->b->failed, 1);
    return w->rc;
}

static int lat_push(bworker *w, double dt)
{
    if (w->nlat == w->lat_cap) {
        size_t cap = w->lat_cap ? w->lat_cap * 2 : 1024;
        double *p = realloc(w->lat, cap * sizeof *p);
        if (!p)
            return -1;
        w->lat = p;
        w->lat_cap = cap;
    }
    w->lat[w->nlat++] = dt;
    return 0;
}

/* One psd round trip: push S floats and pull S floats, as psworker does:
 * psc_pushpull, which sends one PUSHPULL for a part of at most the chunk
 * size (or through the shared segment), else PUSH chunks back to back and
 * then PULL chunks with the pull window in flight; with a model in 2
 * parts the request to each psd goes out before either answer is read. */
static int psd_round_trip(bworker *w)
{
    int rc = psc_pushpull(w->pc);
    return rc == 0 ? 0 : wfail(w, rc, "pushpull");
}

/* The worker's client: a layout of one tensor "w" of S floats, shard k of
 * K, the wire type, shared memory and the chunking of the cell, and no
 * reconnects (a lost psd fails the cell); its gradient vector holds the
 * cell's gradient (in the shared segment when there is one: psworker
 * computes it there, nothing to copy per round trip). It connects (the
 * first worker's 0.01s become the model, the others pull it) and checks
 * that psd gave the wire type and the shared memory asked for: figures of
 * another kind would be mislabelled. */
static int psd_open(bworker *w)
{
    bench *b = w->b;
    char v[160];
    w->pc = psc_new();
    if (!w->pc)
        return wfailf(w, PSC_ENOMEM, "out of memory");
    if (b->nparts == 1)
        snprintf(v, sizeof v, "%s", b->addr[0]);
    else
        snprintf(v, sizeof v, "%s,%s", b->addr[0], b->addr[1]);
    int rc = psc_set(w->pc, "server", v);
    if (rc == 0)
        rc = psc_set(w->pc, "log", b->verbose ? "info" : "warn");
    snprintf(v, sizeof v, "%d/%d", w->k, b->K);
    if (rc == 0)
        rc = psc_set(w->pc, "shard", v);
    snprintf(v, sizeof v, "%" PRIu64, b->chunk);
    if (rc == 0)
        rc = psc_set(w->pc, "chunk", v);
    snprintf(v, sizeof v, "%d", b->window);
    if (rc == 0)
        rc = psc_set(w->pc, "pull_window", v);
    if (rc == 0)
        rc = psc_set(w->pc, "wire", wire_name(b->wire));
    if (rc == 0)
        rc = psc_set(w->pc, "shm", b->shm ? "on" : "off");
    if (rc == 0)
        rc = psc_set(w->pc, "reconnect", "off");
    if (rc == 0)
        rc = psc_set(w->pc, "connect_s", "10");
    snprintf(v, sizeof v, "%d", CALL_TIMEOUT_MS);
    if (rc == 0)
        rc = psc_set(w->pc, "timeout_ms", v);
    snprintf(v, sizeof v, "%d", b->client_spin);
    if (rc == 0)
        rc = psc_set(w->pc, "spin_us", v);
    uint64_t dims[1] = {b->S};
    if (rc == 0)
        rc = psc_add_tensor(w->pc, "w", 1, dims);
    if (rc != 0)
        return wfail(w, rc, "options");
    float *params = psc_params(w->pc), *grads = psc_grads(w->pc);
    if (!params || !grads)
        return wfail(w, PSC_ENOMEM, "vectors");
    for (uint64_t i = 0; i < b->S; i++)
        params[i] = 0.01f;
    memcpy(grads, b->grad, b->S * sizeof(float));
    if ((rc = psc_connect(w->pc)) != 0)
        return wfail(w, rc, "connect");
    if (b->shm && !psc_shm(w->pc))
        return wfailf(w, PSC_EINVAL, "psd did not map our shared memory (its log says why)");
    if (strcmp(psc_wire(w->pc), wire_name(b->wire)) != 0) {
        atomic_store(&b->wire_refused, 1);
        return wfailf(w, PSC_EINVAL,
                      "psd does not offer %s tensors on the wire (wire_bf16 = no, or a psd older than the "
                      "bfloat16 wire)", wire_name(b->wire));
    }
    return 0;
}

/* The table mode's worker: shard k of K with a dense layout of 4 floats
 * (a job always has one; it is not pushed), table "emb" of dim values per
 * row (uniform init, AdaGrad), no reconnects. */
int table_open(bworker *w)
{
    bench *b = w->b;
    char v[160];
    w->pc = psc_new();
    w->rows = malloc((size_t)b->nkeys * b->dim * sizeof(float));
    if (!w->pc || !w->rows)
        return wfailf(w, PSC_ENOMEM, "out of memory");
    int rc = psc_set(w->pc, "server", b->addr[0]);
    if (rc == 0)
        rc = psc_set(w->pc, "log", b->verbose ? "info" : "warn");
    snprintf(v, sizeof v, "%d/%d", w->k, b->K);
    if (rc == 0)
        rc = psc_set(w->pc, "shard", v);
    if (rc == 0)
        rc = psc_set(w->pc, "reconnect", "off");
    if (rc == 0)
        rc = psc_set(w->pc, "connect_s", "10");
    if (rc == 0 && b->table_tcp)
        rc = psc_set(w->pc, "shm", "off");
    snprintf(v, sizeof v, "%d", CALL_TIMEOUT_MS);
    if (rc == 0)
        rc = psc_set(w->pc, "timeout_ms", v);
    snprintf(v, sizeof v, "%d", b->client_spin);
    if (rc == 0)
        rc = psc_set(w->pc, "spin_us", v);
    uint64_t dims[1] = {4};
    if (rc == 0)
        rc = psc_add_tensor(w->pc, "w", 1, dims);
    if (rc != 0)
        return wfail(w, rc, "options");
    if ((rc = psc_connect(w->pc)) != 0)
        return wfail(w, rc, "connect");
    if ((rc = psc_table(w->pc, "emb", b->dim, "uniform", 0.01, 1, "adagrad", "lr=0.05")) != 0)
        return wfail(w, rc, "table");
    if (psc_table_shm(w->pc))
        atomic_fetch_add(&b->table_shm, 1);
    return 0;
}

/* One table round trip: push the row gradients of this batch's keys and
 * pull the next batch's rows (psc_table_pushpull), batches in turn. */
static int table_round_trip(bworker *w)
{
    bench *b = w->b;
    const uint64_t *mine = b->batches + (size_t)w->k * (size_t)b->nbatch * b->nkeys;
    const uint64_t *keys = mine + (size_t)(w->step % (uint64_t)b->nbatch) * b->nkeys;
    const uint64_t *next = mine + (size_t)((w->step + 1) % (uint64_t)b->nbatch) * b->nkeys;
    w->step++;
    int rc = psc_table_pushpull(w->pc, "emb", keys, b->nkeys, b->grad, next, b->nkeys, w->rows);
    return rc == 0 ? 0 : wfail(w, rc, "table pushpull");
}

static int write_full(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_full(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = recv(fd, c, n, 0);
        if (k == 0)
            errno = ECONNRESET;
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Polls fd until it is readable or us microseconds have passed, yielding
 * the CPU between polls (--client-spin: as libpsclient's spin_us). */
static void spin_readable(int fd, int us)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double end = now_s() + us * 1e-6;
    while (poll(&p, 1, 0) == 0 && now_s() < end)
        sched_yield();
}

/* read_full, each wait for more bytes first polling for up to spin_us
 * microseconds as spin_readable (0: read_full). */
static int read_reply(int fd, void *p, size_t n, int spin_us)
{
    if (spin_us <= 0)
        return read_full(fd, p, n);
    char *c = p;
    while (n > 0) {
        ssize_t k = recv(fd, c, n, MSG_DONTWAIT);
        if (k > 0) {
            c += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            errno = ECONNRESET;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        spin_readable(fd, spin_us);
        struct pollfd q = {.fd = fd, .events = POLLIN};
        if (poll(&q, 1, -1) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

/* A TCP connection to "127.0.0.1:port", with TCP_NODELAY; -1 with errno. */
static int tcp_connect(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[64];
    if (!colon || (size_t)(colon - addr) >= sizeof host) {
        errno = EINVAL;
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One plain-TCP round trip: the request's bytes out, the answer's back
 * (dense: S values each way at the size psd's wire gives them, 4 bytes or
 * 2 with --wire bf16; table: the bytes of a TPUSHPULL's keys, gradients and
 * next keys out, of its rows back); they land in the parameters' buffer,
 * unconverted. */
static int tcp_round_trip(bworker *w)
{
    if (write_full(w->fd, w->b->req, w->b->req_bytes) != 0)
        return wfail(w, PSC_EIO, "tcp send");
    if (read_reply(w->fd, w->params, w->b->ans_bytes, w->b->client_spin) != 0)
        return wfail(w, PSC_EIO, "tcp receive");
    return 0;
}

/* Whether worker w should start round r (0-based, timed rounds only). In
 * BSP every worker must do the same rounds or the last one never closes:
 * the first worker to see the time up makes the round it is starting the
 * last for everyone (no worker can be past it, since it has not pushed). */
static int keep_going(bench *b, uint64_t r)
{
    if (atomic_load(&b->failed))
        return 0;
    if (b->max_rounds && r >= b->max_rounds)
        return 0;
    if (!b->sync)
        return !atomic_load(&b->stop);
    uint64_t at = atomic_load(&b->stop_at);
    if (at == UINT64_MAX && atomic_load(&b->stop)) {
        uint64_t want = r + 1;
        if (atomic_compare_exchange_strong(&b->stop_at, &at, want))
            at = want;
    }
    return r < at;
}

static void *worker_main(void *arg)
{
    bworker *w = arg;
    bench *b = w->b;
    int rc = 0;
    if (b->sys == SYS_PSD) {
        rc = b->table ? table_open(w) : psd_open(w);
    } else if ((w->fd = tcp_connect(b->addr[0])) < 0) {
        rc = wfail(w, PSC_ECONNECT, "connect");
    }
    for (int i = 0; rc == 0 && i < b->warmup; i++)
        rc = b->sys != SYS_PSD ? tcp_round_trip(w) : b->table ? table_round_trip(w) : psd_round_trip(w);
    if (rc == 0 && w->k == 0 && b->insync_log && wait_in_sync(b->insync_log) != 0)
        rc = wfailf(w, PSC_ETIMEOUT, "the follower was not in sync within 60 s (see %s)", b->insync_log);
    if (rc != 0 && w->pc)
        psc_close(w->pc); /* so psd's BSP rounds go on without us */
    pthread_barrier_wait(&b->gate);
    w->t_end = now_s();
    for (uint64_t r = 0; rc == 0 && keep_going(b, r); r++) {
        double t0 = now_s();
        rc = b->sys != SYS_PSD ? tcp_round_trip(w) : b->table ? table_round_trip(w) : psd_round_trip(w);
        double t1 = now_s();
        if (rc == 0) {
            w->t_end = t1;
            if (lat_push(w, t1 - t0) != 0)
                rc = wfailf(w, PSC_ENOMEM, "out of memory for the latency record");
        }
    }
    if (w->pc)
        psc_close(w->pc); /* a BYE to every psd */
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    atomic_fetch_add(&b->finished, 1);
    return NULL;
}

/* The loop-lag probe: an admin connection that sends a HEARTBEAT with an id
 * every 10 ms while the workers are timed and records how long psd takes
 * to answer. psd answers it at once unless its one loop thread is busy
 * (reading, applying, copying), so the delays show how long it stalls.
 * libpsclient speaks for workers only, so the probe writes its three kinds
 * of frame itself, as proto/PROTOCOL.md gives them (sections 1, 3, 5): a
 * 4-byte big-endian length, then a msgpack map whose first key is "t". */
typedef struct probe {
    bench *b;
    pthread_t th;
    double *lat;
    size_t n, cap;
    int rc;
} probe;

enum { PT_HELLO = 1, PT_WELCOME = 2, PT_OK = 8, PT_HEARTBEAT = 9, PT_BYE = 16 };

/* Sends {"t": type, "id": id} (HELLO: {"t": 1, "v": 1, "role": "admin"})
 * and reads the answer, which must be of type `want`: 0 or -1. */
static int probe_call(int fd, int type, uint32_t id, int want)
{
    uint8_t f[32], *q = f + 4;
    if (type == PT_HELLO) {
        static const uint8_t hello[] = {0x83, 0xa1, 't', PT_HELLO, 0xa1, 'v', 1,
                                        0xa4, 'r', 'o', 'l', 'e', 0xa5, 'a', 'd', 'm', 'i', 'n'};
        memcpy(q, hello, sizeof hello);
        q += sizeof hello;
    } else {
        const uint8_t head[] = {0x82, 0xa1, 't', (uint8_t)type, 0xa2, 'i', 'd', 0xce};
        memcpy(q, head, sizeof head);
        q += sizeof head;
        for (int s = 24; s >= 0; s -= 8)
            *q++ = (uint8_t)(id >> s);
    }
    uint32_t len = (uint32_t)(q - f - 4);
    f[0] = 0, f[1] = 0, f[2] = (uint8_t)(len >> 8), f[3] = (uint8_t)len;
    if (write_full(fd, f, (size_t)(q - f)) != 0)
        return -1;
    uint8_t hdr[4], body[4096];
    if (read_full(fd, hdr, 4) != 0)
        return -1;
    uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (n < 4 || n > sizeof body || read_full(fd, body, n) != 0)
        return -1;
    /* psd's encoder writes "t" first: a map header, then a1 74 <type> */
    return (body[0] & 0xf0) == 0x80 && body[1] == 0xa1 && body[2] == 't' && body[3] == want ? 0 : -1;
}

static void *probe_main(void *arg)
{
    probe *p = arg;
    struct timeval tv = {CALL_TIMEOUT_MS / 1000, 0};
    uint32_t id = 1;
    int fd = tcp_connect(p->b->addr[0]);
    p->rc = fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
            probe_call(fd, PT_HELLO, 0, PT_WELCOME) != 0;
    while (p->rc == 0 && !atomic_load(&p->b->probe_stop)) {
        double t0 = now_s();
        p->rc = probe_call(fd, PT_HEARTBEAT, id++, PT_OK);
        double dt = now_s() - t0;
        if (p->rc != 0)
            break;
        if (p->n == p->cap) {
            size_t cap = p->cap ? 2 * p->cap : 1024;
            double *q = realloc(p->lat, cap * sizeof *q);
            if (!q)
                break;
            p->lat = q;
            p->cap = cap;
        }
        p->lat[p->n++] = dt;
        sleep_s(0.01);
    }
    if (fd >= 0) {
        probe_call(fd, PT_BYE, id, PT_OK);
        close(fd);
    }
    return NULL;
}

/* CPU seconds the servers pids[0..n) have used so far, together; -1 if unknown. */
static double servers_cpu_s(const pid_t *pids, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double c = proc_cpu_s(pids[i]);
        if (c < 0)
            return -1;
        sum += c;
    }
    return sum;
}

/* Runs K worker threads against b->addr (a model in 2 parts: each worker
 * against both psd); the CPU use of the servers
 * pids[0..npids) is measured, together. */
void run_workers(bench *b, const opts *o, const pid_t *pids, int npids, cell_result *res)
{
    int K = b->K;
    b->w = calloc((size_t)K, sizeof *b->w);
    if (!b->w)
        die("out of memory");
    pthread_barrier_init(&b->gate, NULL, (unsigned)K + 1);
    atomic_store(&b->stop, 0);
    atomic_store(&b->stop_at, UINT64_MAX);
    atomic_store(&b->finished, 0);
    atomic_store(&b->failed, 0);
    atomic_store(&b->wire_refused, 0);
    int started = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        w->b = b;
        w->k = k;
        w->fd = -1;
        if (b->sys == SYS_PSD)
            continue; /* the library's vectors: psd_open */
        w->params = malloc(b->ans_bytes);
        if (!w->params)
            die("out of memory for %zu bytes", b->ans_bytes);
        memset(w->params, 0, b->ans_bytes); /* fault it in outside the timing */
    }
    for (int k = 0; k < K; k++) {
        if (pthread_create(&b->w[k].th, NULL, worker_main, &b->w[k]) != 0)
            die("cannot start worker threads");
        started++;
    }
    pthread_barrier_wait(&b->gate);
    double t0 = now_s();
    double cpu0 = servers_cpu_s(pids, npids);
    probe pr = {.b = b};
    int probing = b->sys == SYS_PSD && b->nparts == 1 && o->probe;
    atomic_store(&b->probe_stop, 0);
    if (probing && pthread_create(&pr.th, NULL, probe_main, &pr) != 0)
        probing = 0;
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    double deadline = t0 + o->seconds + CELL_GRACE_S;
    int killed = 0;
    while (atomic_load(&b->finished) < K) {
        double t = now_s();
        if (t - t0 >= o->seconds)
            atomic_store(&b->stop, 1);
        if (t > deadline && !killed) {
            /* a worker is stuck: kill the server so its calls fail */
            snprintf(res->err, sizeof res->err, "cell ran %.0f s over its time; server killed", CELL_GRACE_S);
            for (int i = 0; i < npids; i++)
                kill(pids[i], SIGKILL);
            killed = 1;
        }
        sleep_s(0.005);
    }
    double cpu1 = servers_cpu_s(pids, npids);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    atomic_store(&b->probe_stop, 1);
    if (probing) {
        pthread_join(pr.th, NULL);
        qsort(pr.lat, pr.n, sizeof *pr.lat, cmp_double);
        res->lag_p50_ms = 1e3 * pct(pr.lat, pr.n, 0.50);
        res->lag_p99_ms = 1e3 * pct(pr.lat, pr.n, 0.99);
        res->lag_max_ms = pr.n ? 1e3 * pr.lat[pr.n - 1] : NAN;
        free(pr.lat);
    } else {
        res->lag_p50_ms = res->lag_p99_ms = res->lag_max_ms = NAN;
    }
    for (int k = 0; k < started; k++)
        pthread_join(b->w[k].th, NULL);
    pthread_barrier_destroy(&b->gate);

    double t_end = t0;
    size_t nlat = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        if (w->rc != 0 && !res->err[0])
            snprintf(res->err, sizeof res->err, "%s", w->err);
        if (w->t_end > t_end)
            t_end = w->t_end;
        nlat += w->nlat;
    }
    double *all = malloc((nlat ? nlat : 1) * sizeof *all);
    if (!all)
        die("out of memory");
    size_t j = 0;
    double sum = 0;
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        for (size_t i = 0; i < w->nlat; i++) {
            all[j++] = w->lat[i];
            sum += w->lat[i];
        }
    }
    qsort(all, nlat, sizeof *all, cmp_double);
    res->ok = res->err[0] == 0 && nlat > 0;
    res->rts = nlat;
    res->secs = t_end - t0;
    if (res->secs > 0) {
        res->rt_per_s = (double)nlat / res->secs;
        res->gbps = res->rt_per_s * (double)(b->req_bytes + b->ans_bytes) / 1e9;
        if (cpu0 >= 0 && cpu1 >= 0)
            res->server_cpu = (cpu1 - cpu0) / res->secs;
        double cs = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        res->client_cpu = cs / res->secs;
    }
    res->p50_ms = 1e3 * pct(all, nlat, 0.50);
    res->p99_ms = 1e3 * pct(all, nlat, 0.99);
    res->mean_ms = nlat ? 1e3 * sum / (double)nlat : NAN;
    res->wire_refused = atomic_load(&b->wire_refused);
    free(all);
    for (int k = 0; k < K; k++) {
        bworker *w = &b->w[k];
        psc_free(w->pc);
        free(w->params);
        free(w->rows);
        free(w->lat);
    }
    free(b->w);
    b->w = NULL;
}
