/* shm.c - a worker's shared-memory segment: the tensors of its pushpulls
 * without the loopback copies.
 *
 * A psworker on psd's machine creates a memfd sealed against shrinking and
 * growing, of 2 x P floats (P: the model's parameters): [0, P) for its
 * gradient, [P, 2P) for the parameters psd answers with. Its hello names
 * the memfd as [pid, fd]; psd opens /proc/<pid>/fd/<fd> and maps it when
 * it is a memfd with those seals and of that size, and says so in the
 * welcome ("inshm"). Anything else (another machine, another user, a
 * regular file, a segment that could shrink under psd and fault it) leaves
 * the connection on TCP, with the reason in the log. A hello may also
 * place the two halves elsewhere in a larger segment ("shm": [pid, fd,
 * goff, poff]: a worker whose model is split over several psd gives each
 * its part of one segment); psd then maps just those two ranges.
 *
 * The worker writes its gradient there and sends a pushpull with "inshm";
 * psd copies the gradient out before it checks it (the worker could change
 * it meanwhile), applies it, writes the parameters it answers with into the
 * second half and replies "inshm". Nothing is in flight in the other
 * direction at the same time: the worker waits for the reply. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "psd.h"

/* Maps floats [off, off + n) of fd read-write: the mapping starts on the
 * page boundary below. */
static float *map_range(int fd, uint64_t off, uint64_t n, void **map, size_t *maplen)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = off * sizeof(float) / page * page;
    size_t len = (size_t)((off + n) * sizeof(float) - start);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (p == MAP_FAILED)
        return NULL;
    *map = p;
    *maplen = len;
    return (float *)(void *)((char *)p + (off * sizeof(float) - start));
}

int srv_shm_attach(srv_conn *c, const ps_msg *m, uint64_t nparams, char *why, size_t whylen)
{
    char path[64];
    if (nparams == 0 || nparams > SRV_SHM_MAX_PARAMS) {
        snprintf(why, whylen, "the model's %llu parameters are more than shared memory is used for (%llu)",
                 (unsigned long long)nparams, (unsigned long long)SRV_SHM_MAX_PARAMS);
        return -1;
    }
    uint64_t goff = m->shm_at ? m->shm_goff : 0, poff = m->shm_at ? m->shm_poff : nparams;
    if (goff < poff + nparams && poff < goff + nparams) {
        snprintf(why, whylen, "the segment's gradient [%llu, +%llu) and parameters [%llu, +%llu) overlap",
                 (unsigned long long)goff, (unsigned long long)nparams, (unsigned long long)poff,
                 (unsigned long long)nparams);
        return -1;
    }
    snprintf(path, sizeof path, "/proc/%u/fd/%u", m->shm_pid, m->shm_fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    uint64_t end = (goff > poff ? goff : poff) + nparams;
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        if (seals < 0)
            snprintf(why, whylen, "%s is not a memfd (%s)", path, strerror(errno));
        else
            snprintf(why, whylen, "%s is a memfd not sealed against shrinking and growing", path);
        close(fd);
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, whylen, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (m->shm_at ? (uint64_t)st.st_size < end * sizeof(float)
                                           : (uint64_t)st.st_size != end * sizeof(float))) {
        if (m->shm_at)
            snprintf(why, whylen, "%s holds %lld bytes, fewer than the %llu floats the hello places in it", path,
                     (long long)st.st_size, (unsigned long long)end);
        else
            snprintf(why, whylen, "%s holds %lld bytes, not 2 x %llu floats", path, (long long)st.st_size,
                     (unsigned long long)nparams);
        close(fd);
        return -1;
    }
    c->shm = map_range(fd, goff, nparams, &c->shm_map[0], &c->shm_maplen[0]);
    c->shm_out = c->shm ? map_range(fd, poff, nparams, &c->shm_map[1], &c->shm_maplen[1]) : NULL;
    int err = errno;
    close(fd);
    if (!c->shm_out) {
        srv_shm_detach(c);
        snprintf(why, whylen, "cannot map %s: %s", path, strerror(err));
        return -1;
    }
    c->shm_params = nparams;
    return 0;
}

void srv_shm_detach(srv_conn *c)
{
    for (int i = 0; i < 2; i++)
        if (c->shm_map[i])
            munmap(c->shm_map[i], c->shm_maplen[i]);
    memset(c->shm_map, 0, sizeof c->shm_map);
    c->shm = c->shm_out = NULL;
    c->shm_params = 0;
}
