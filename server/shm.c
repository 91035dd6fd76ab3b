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
 * the connection on TCP, with the reason in the log.
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

int srv_shm_attach(srv_conn *c, uint32_t pid, uint32_t fdnum, uint64_t nparams, char *why, size_t whylen)
{
    char path[64];
    if (nparams == 0 || nparams > SRV_SHM_MAX_PARAMS) {
        snprintf(why, whylen, "the model's %llu parameters are more than shared memory is used for (%llu)",
                 (unsigned long long)nparams, (unsigned long long)SRV_SHM_MAX_PARAMS);
        return -1;
    }
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fdnum);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    struct stat st;
    size_t bytes = (size_t)nparams * 2 * sizeof(float);
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
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != bytes) {
        snprintf(why, whylen, "%s holds %lld bytes, not 2 x %llu floats", path, (long long)st.st_size,
                 (unsigned long long)nparams);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "cannot map %s: %s", path, strerror(errno));
        return -1;
    }
    c->shm = p;
    c->shm_params = nparams;
    return 0;
}

void srv_shm_detach(srv_conn *c)
{
    if (c->shm)
        munmap(c->shm, (size_t)c->shm_params * 2 * sizeof(float));
    c->shm = NULL;
    c->shm_params = 0;
}
