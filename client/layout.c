/* layout.c - libpsclient: the model's layout and vectors: tensors declared, the layout fixed
 * into one link per psd part, a link's own resources (closing its connection, its table
 * segment, the sealed memfds the segments are), the shared segment, the library's or the
 * caller's parameter and gradient vectors. */
#define _GNU_SOURCE /* memfd_create, F_ADD_SEALS, program_invocation_short_name */
#include "internal.h"

void psc__link_close(psc_link *ln)
{
    psc__hb_stop(ln);
    pthread_mutex_lock(&ln->lock);
    ps_conn_close(&ln->cl);
    pthread_mutex_unlock(&ln->lock);
}

void *psc__memfd_map(const char *name, size_t bytes, int *fd_out)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        (p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return p;
}

/* The table segment ln offers a psd on this machine (PROTOCOL.md 13.9): a
 * memfd of PSC_TSEG_BYTES, made at the first hello and kept across
 * reconnects. Its pages take memory only as requests touch them. 0, or -1
 * (rows then go in frames). */
int psc__tseg_create(psc_link *ln)
{
    if (!ln->tseg)
        ln->tseg = psc__memfd_map("psclient-tables", PSC_TSEG_BYTES, &ln->tseg_fd);
    return ln->tseg ? 0 : -1;
}

void psc__tseg_free(psc_link *ln)
{
    if (!ln->tseg)
        return;
    munmap(ln->tseg, PSC_TSEG_BYTES);
    close(ln->tseg_fd);
    ln->tseg = NULL;
    ln->tseg_ok = 0;
}

int psc_add_tensor(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims)
{
    uint32_t d[PS_DIMS_MAX];
    if (c->fixed)
        return psc__fail(c, PSC_ESTATE, "psc_add_tensor: the layout is fixed already (psc_params, psc_grads, psc_bind "
                                   "or psc_connect was called)");
    if (!name || !dims || ndim < 1 || ndim > PS_DIMS_MAX)
        return psc__fail(c, PSC_EINVAL, "psc_add_tensor: a tensor needs a name and 1..%d dims", PS_DIMS_MAX);
    for (uint32_t i = 0; i < ndim; i++) {
        if (dims[i] < 1 || dims[i] > UINT32_MAX)
            return psc__fail(c, PSC_EINVAL, "tensor '%.80s': dimension %u is %" PRIu64 " (1..%u)", name, i, dims[i],
                        UINT32_MAX);
        d[i] = (uint32_t)dims[i];
    }
    for (uint32_t i = 0; i < c->layout.ntensors; i++)
        if (strcmp(c->layout.t[i].name, name) == 0)
            return psc__fail(c, PSC_EINVAL, "tensor '%.80s' declared twice", name);
    /* say which limit refuses the tensor */
    size_t nlen = strlen(name);
    if (c->layout.ntensors >= PS_TENSORS_MAX)
        return psc__fail(c, PSC_EINVAL, "the layout has %d tensors already, the most psd takes (PS_TENSORS_MAX): "
                                   "tensor '%.80s' is one too many", PS_TENSORS_MAX, name);
    if (nlen == 0 || nlen > PS_NAME_MAX)
        return psc__fail(c, PSC_EINVAL, "tensor name '%.*s%s' has %zu bytes: a name has 1..%d (PS_NAME_MAX)",
                         nlen > 80 ? 80 : (int)nlen, name, nlen > 80 ? "..." : "", nlen, PS_NAME_MAX);
    for (size_t i = 0; i < nlen; i++)
        if (name[i] < 0x21 || name[i] > 0x7e)
            return psc__fail(c, PSC_EINVAL, "tensor name '%.80s': byte %zu is not printable ASCII without space "
                                       "(0x21..0x7e)", name, i);
    int rc = ps_layout_add(&c->layout, name, ndim, d);
    if (rc != 0)
        return psc__fail(c, PSC_EINVAL, "tensor '%.80s': %s (the model would have over 2^34 values, PS_PARAMS_MAX)",
                         name, ps_strerror(rc));
    return 0;
}

int psc_add_buffer(psc_client *c, const char *name, uint32_t ndim, const uint64_t *dims, const char *rule,
                   const char *dtype)
{
    int buf = rule ? ps_buf_parse(rule, strlen(rule)) : -1;
    int sdt = dtype ? ps_save_dt_parse(dtype, strlen(dtype)) : PS_SAVE_F32;
    if (buf < 0)
        return psc__fail(c, PSC_EINVAL, "buffer '%.80s': rule '%.40s': \"mean\" (psd keeps the mean of the workers' "
                                   "values) or \"first\" (shard 0's)", name ? name : "", rule ? rule : "(null)");
    if (sdt < 0)
        return psc__fail(c, PSC_EINVAL, "buffer '%.80s': dtype '%.40s': \"F32\", \"F64\", \"I64\" or \"I32\"",
                    name ? name : "", dtype);
    int rc = psc_add_tensor(c, name, ndim, dims);
    if (rc != 0)
        return rc;
    ps_layout_set_buffer(&c->layout, (unsigned)buf, (unsigned)sdt);
    return 0;
}

uint64_t psc_size(const psc_client *c)
{
    return c->layout.total;
}

uint32_t psc_tensor_count(const psc_client *c)
{
    return c->layout.ntensors;
}

int psc_tensor_info(const psc_client *c, uint32_t i, const char **name, uint32_t *ndim, uint64_t *dims,
                    uint64_t *offset, uint64_t *count)
{
    if (i >= c->layout.ntensors)
        return PSC_ERANGE;
    const ps_tensor_desc *t = &c->layout.t[i];
    if (name)
        *name = t->name;
    if (ndim)
        *ndim = t->ndim;
    if (dims)
        for (uint32_t k = 0; k < t->ndim; k++)
            dims[k] = t->dims[k];
    if (offset)
        *offset = t->offset;
    if (count)
        *count = t->count;
    return 0;
}

int psc_tensor_find(const psc_client *c, const char *name, uint64_t *offset, uint64_t *count)
{
    for (uint32_t i = 0; name && i < c->layout.ntensors; i++)
        if (strcmp(c->layout.t[i].name, name) == 0)
            return psc_tensor_info(c, i, NULL, NULL, NULL, offset, count);
    return PSC_ENOTFOUND;
}

/* The segment a psd on this machine can map instead of sending the tensors
 * over loopback TCP (PROTOCOL.md 6.1): a memfd of 2 x n floats, gradient
 * then parameters, sealed so that it can neither shrink (psd would fault
 * on the missing pages) nor grow. Every connection offers the same one; a
 * psd holding one part maps that part of both halves. */
static int shm_create(psc_client *c)
{
    void *p = psc__memfd_map("psclient", (size_t)c->layout.total * 2 * sizeof(float), &c->shm_fd);
    if (!p)
        return -1;
    c->shm = p;
    return 0;
}

/* Splits the server list into links, part i on the i-th, each with the
 * layout of its part; makes the vectors (in a segment when every part fits
 * one PUSHPULL). */
static int make_links(psc_client *c);

void psc__link_make(psc_client *c, uint32_t i)
{
    psc_link *ln = &c->links[i];
    ps_conn_init(&ln->cl);
    pthread_mutex_init(&ln->lock, NULL);
    pthread_cond_init(&ln->wake, NULL);
    ln->cl.send_lock = &ln->lock;
    ln->cl.on_wait = psc__on_wait;
    ln->cl.on_wait_arg = c;
    c->nmade = i + 1;
}

/* Frees the links and vectors make_links made (the connections closed). */
void psc__unmake_links(psc_client *c)
{
    for (uint32_t i = 0; i < c->nmade; i++) {
        psc_link *ln = &c->links[i];
        ln->cl.send_lock = NULL;
        ps_conn_free(&ln->cl);
        psc__tseg_free(ln);
        pthread_mutex_destroy(&ln->lock);
        pthread_cond_destroy(&ln->wake);
    }
    free(c->links);
    c->links = NULL;
    c->nlinks = c->ndense = c->nmade = 0;
    c->err_link = 0;
    if (c->shm) {
        munmap(c->shm, (size_t)c->layout.total * 2 * sizeof(float));
        close(c->shm_fd);
        c->shm = NULL;
        c->shm_fd = -1;
    }
    psc__hogwild_unmap(c);
    free(c->own);
    c->own = NULL;
    c->params = c->grads = NULL;
    free(c->resid);
    free(c->topk_scratch);
    c->resid = c->topk_scratch = NULL;
    free(c->avg_base);
    c->avg_base = NULL;
}

/* Fixes the layout; a failure leaves nothing made, so the caller may
 * change the option at fault and try again. */
int psc__fix_layout(psc_client *c)
{
    if (c->fixed)
        return 0;
    if (c->layout.ntensors == 0)
        return psc__fail(c, PSC_ESTATE, "no tensors declared: psc_add_tensor first");
    int rc = make_links(c);
    if (rc != 0)
        psc__unmake_links(c);
    return rc;
}

static int make_links(psc_client *c)
{
    uint32_t n = 1;
    for (const char *p = c->servers; *p; p++)
        n += *p == ',';
    if (n > PS_PARTS_MAX)
        return psc__fail(c, PSC_EINVAL, "server lists %u psd; at most %u may share a model", n, PS_PARTS_MAX);
    /* room for every part a part map may add (PROTOCOL.md 18), made once:
     * the heartbeat threads hold pointers into it. The pages of the slots
     * not made are never touched. */
    c->links = calloc(PS_PARTS_MAX, sizeof *c->links);
    if (!c->links)
        return psc__fail(c, PSC_ENOMEM, "out of memory");
    const char *p = c->servers;
    int small = 1;
    for (uint32_t i = 0; i < n; i++) {
        psc_link *ln = &c->links[i];
        size_t len = strcspn(p, ",");
        psc__link_make(c, i);
        c->nlinks = c->ndense = i + 1;
        /* the part's replicas: HOST:PORT/HOST:PORT/... */
        for (size_t at = 0; at <= len;) {
            size_t alen = strcspn(p + at, "/,");
            if (alen == 0 || alen > PS_ADDR_MAX)
                return psc__fail(c, PSC_EINVAL, "server: psd %u of %u in \"%.200s\" %s", i + 1, n, c->servers,
                                 alen ? "has an address longer than 255 bytes" : "is empty, or one of its replicas "
                                                                                 "(HOST:PORT/HOST:PORT) is");
            if (ln->naddrs == PSC_ADDRS_MAX)
                return psc__fail(c, PSC_EINVAL, "server: psd %u of %u in \"%.200s\" lists more than %u replicas",
                                 i + 1, n, c->servers, PSC_ADDRS_MAX);
            memcpy(ln->addrs[ln->naddrs], p + at, alen);
            ln->addrs[ln->naddrs++][alen] = '\0';
            at += alen + 1;
        }
        snprintf(ln->server, sizeof ln->server, "%s", ln->addrs[0]);
        p += len + (p[len] == ',');
        if (ps_layout_part(&c->layout, i, n, &ln->layout, &ln->lo, &ln->hi) != 0)
            return psc__fail(c, PSC_EINVAL, "the model's %llu values cannot be split over %u psd (a part needs at least "
                                       "%u values, and the name of a cut tensor with its range must fit in %d bytes)",
                        (unsigned long long)c->layout.total, n, PS_PART_ALIGN, PS_NAME_MAX);
        small &= ln->hi - ln->lo <= CHUNK_FLOATS;
    }
    size_t total = (size_t)c->layout.total;
    if (c->want_shm && small && shm_create(c) != 0)
        PS_LOG(PS_LOG_DEBUG, "no shared-memory segment (%s): tensors over TCP", strerror(errno));
    if (c->shm) {
        c->grads = c->shm;
        c->params = c->shm + total;
    } else {
        size_t bytes = (total * 2 * sizeof(float) + 63) / 64 * 64;
        c->own = aligned_alloc(64, bytes);
        if (!c->own)
            return psc__fail(c, PSC_ENOMEM, "out of memory for %zu parameters", total);
        memset(c->own, 0, bytes);
        c->params = c->own;
        c->grads = c->own + total;
    }
    if (c->token_path[0] && c->token.len == 0) {
        char err[512];
        if (ps_token_load(c->token_path, &c->token, err, sizeof err) != 0)
            return psc__fail(c, PSC_EINVAL, "%s", err);
    }
    c->fixed = 1;
    return 0;
}

static float *own_params(psc_client *c)
{
    return c->shm ? c->shm + c->layout.total : c->own;
}

static float *own_grads(psc_client *c)
{
    return c->shm ? c->shm : c->own + c->layout.total;
}

float *psc_params(psc_client *c)
{
    return psc__fix_layout(c) == 0 ? own_params(c) : NULL;
}

float *psc_grads(psc_client *c)
{
    return psc__fix_layout(c) == 0 ? own_grads(c) : NULL;
}

int psc__busy(psc_client *c)
{
    if (!c->async_running)
        return 0;
    pthread_mutex_lock(&c->async_mu);
    int b = c->async_pending;
    pthread_mutex_unlock(&c->async_mu);
    return b;
}

int psc_bind(psc_client *c, float *params, float *grads)
{
    int rc = psc__fix_layout(c);
    if (rc != 0)
        return rc;
    if (psc__busy(c))
        return psc__fail(c, PSC_EBUSY, "psc_bind: a step is in flight (psc_wait first)");
    if (params && params == grads)
        return psc__fail(c, PSC_EINVAL, "psc_bind: parameters and gradients must be different vectors");
    c->params = params ? params : own_params(c);
    c->grads = grads ? grads : own_grads(c);
    return 0;
}
