/* hogwild.c - libpsclient: Hogwild! (PROTOCOL.md section 8). When psd's
 * WELCOME names its model segment ("hogwild": [pid, fd]), the worker maps
 * /proc/<pid>/fd/<fd> read-write and a step is w -= lr * g applied straight
 * into psd's model, without locks and without a message, followed by one
 * atomic add to the segment's step counter (psd's model version). The
 * mapping keeps its address for the client's life: a reconnect to a psd
 * that names another segment (a restarted one) maps that one in its place,
 * so a caller whose parameters are that memory (psc_hogwild_params, bound
 * with psc_bind) never holds a stale pointer. A step first asks whether
 * psd closed the connection (psc__hogwild_gone), and step.c reconnects. */
#define _GNU_SOURCE
#include "internal.h"

#include <stdatomic.h>
#include <sys/stat.h>

/* Byte offset of the step counter: the values rounded up to 64 bytes; the
 * segment is that plus 64 (psd's server/model/hogwild.h says the same). */
static size_t counter_at(uint64_t n)
{
    return (size_t)((n * sizeof(float) + 63) / 64 * 64);
}

static _Atomic uint64_t *steps(const psc_client *c)
{
    return (_Atomic uint64_t *)(void *)((char *)c->hw + counter_at(c->layout.total));
}

int psc__hogwild_map(psc_client *c, uint32_t pid, uint32_t fd)
{
    size_t bytes = counter_at(c->layout.total) + 64;
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return psc__fail(c, PSC_EINVAL, "Hogwild!: cannot open psd's model segment %s: %s", path, strerror(errno));
    struct stat st;
    int seals = fcntl(f, F_GET_SEALS);
    if (fstat(f, &st) != 0 || (size_t)st.st_size != bytes || seals < 0 ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        close(f);
        return psc__fail(c, PSC_EINVAL, "Hogwild!: psd's model segment %s is not a sealed memfd of %zu bytes (%llu "
                                        "values and the step counter)",
                         path, bytes, (unsigned long long)c->layout.total);
    }
    /* in place of the old mapping, at its address, when there is one */
    void *p = mmap(c->hw ? (void *)c->hw : NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (c->hw ? MAP_FIXED : 0),
                   f, 0);
    close(f);
    if (p == MAP_FAILED)
        return psc__fail(c, PSC_ENOMEM, "Hogwild!: cannot map psd's model segment: %s", strerror(errno));
    c->hw = p;
    c->hw_len = bytes;
    return 0;
}

void psc__hogwild_unmap(psc_client *c)
{
    if (c->hw)
        munmap(c->hw, c->hw_len);
    c->hw = NULL;
    c->hw_len = 0;
    c->hw_on = 0;
}

uint64_t psc__hogwild_version(const psc_client *c)
{
    return atomic_load_explicit(steps(c), memory_order_acquire);
}

/* Whether psd closed the connection (or said something: it says nothing
 * unasked in a Hogwild! job but an ERROR before it closes); looked at
 * every 100 ms at most, so a step costs no system call. */
int psc__hogwild_gone(psc_client *c)
{
    int64_t now = psc__mono_ms();
    if (now - c->hw_checked_ms < 100)
        return 0;
    c->hw_checked_ms = now;
    psc_link *ln = &c->links[0];
    if (ln->cl.fd < 0)
        return 1;
    struct pollfd pfd = {.fd = ln->cl.fd, .events = POLLIN};
    return poll(&pfd, 1, 0) > 0;
}

int psc__hogwild_step(psc_client *c, enum op op, uint64_t off, uint64_t len)
{
    float *w = c->hw;
    if (op != OP_PULL) {
        const float lr = (float)c->hw_lr;
        const float *g = c->grads;
        for (uint32_t t = 0; t < c->layout.ntensors; t++) {
            const ps_tensor_desc *d = &c->layout.t[t];
            uint64_t lo = d->offset > off ? d->offset : off;
            uint64_t hi = d->offset + d->count < off + len ? d->offset + d->count : off + len;
            if (lo >= hi)
                continue;
            if (d->buf == PS_BUF_NONE) {
                for (uint64_t i = lo; i < hi; i++)
                    w[i] -= lr * g[i];
            } else if (d->buf == PS_BUF_MEAN) {
                /* each worker moves the shared values 1/workers of the way
                 * to its own, as psd does with an asgd push */
                const float k = 1.0f / (float)(c->hw_workers ? c->hw_workers : 1);
                for (uint64_t i = lo; i < hi; i++)
                    w[i] += k * (g[i] - w[i]);
            } else if (c->shard == 0) {
                memcpy(w + lo, g + lo, (hi - lo) * sizeof(float));
            }
        }
        c->version = atomic_fetch_add_explicit(steps(c), 1, memory_order_release) + 1;
    } else {
        c->version = psc__hogwild_version(c);
    }
    if (op != OP_PUSH && c->params != w)
        memcpy(c->params + off, w + off, len * sizeof(float));
    return 0;
}

float *psc_hogwild_params(psc_client *c)
{
    return c && c->hw_on ? c->hw : NULL;
}

int psc_hogwild(const psc_client *c)
{
    return c && c->hw_on;
}
