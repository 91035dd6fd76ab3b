/* shm.c - a worker's shared-memory segment: the tensors of its pushpulls
 * without the loopback copies.
 *
 * A psworker on psd's machine creates a memfd sealed against shrinking and
 * growing, of 2 x P floats (P: the model's parameters): [0, P) for its
 * gradient, [P, 2P) for the parameters psd answers with. Its hello names
 * the memfd as [pid, fd]; psd opens /proc/<pid>/fd/<fd> and maps it when
 * pid is the process at the other end of the connection (its file table
 * holds the connection's peer socket: a client cannot name another
 * process's memfd), the file is a memfd, with those seals and of that
 * size, and says so in the welcome ("inshm"). Anything else (another machine, another user, a
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
 * direction at the same time: the worker waits for the reply.
 *
 * A worker may also offer a table segment ("tshm", PROTOCOL.md 13.9): a
 * memfd with the same seals, mapped whole, where its table requests' keys
 * and rows lie (dispatch/handle_table.c reads them, answer/pull.c writes
 * the rows pulled). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/store/shm.h"
#include "common/log.h"
#include "server/store/psd.h"

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

/* ---- is pid the peer? ------------------------------------------------------ */

/* An address as /proc/net/tcp{,6} prints it ("0100007F:1F90": the address's
 * 32-bit words in host order, then the port); an IPv4-mapped IPv6 address
 * as IPv4 (*v6 0). 0 when sa is neither family. */
static int proc_net_addr(const struct sockaddr_storage *sa, char *out, size_t len, int *v6)
{
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        snprintf(out, len, "%08X:%04X", (unsigned)a->sin_addr.s_addr, (unsigned)ntohs(a->sin_port));
        *v6 = 0;
        return 1;
    }
    if (sa->ss_family != AF_INET6)
        return 0;
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    uint32_t w[4];
    memcpy(w, &a->sin6_addr, sizeof w);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
        snprintf(out, len, "%08X:%04X", (unsigned)w[3], (unsigned)ntohs(a->sin6_port));
        *v6 = 0;
    } else {
        snprintf(out, len, "%08X%08X%08X%08X:%04X", (unsigned)w[0], (unsigned)w[1], (unsigned)w[2], (unsigned)w[3],
                 (unsigned)ntohs(a->sin6_port));
        *v6 = 1;
    }
    return 1;
}

/* The inode of the socket at the other end of c (on this machine: its
 * local address is c's peer address and the other way round), from
 * /proc/net/tcp or tcp6; 0 when not found. */
static unsigned long peer_socket_inode(srv_conn *c)
{
    struct sockaddr_storage self, peer;
    int sl = sizeof self, pl = sizeof peer, v6a, v6b;
    char want_local[64], want_rem[64];
    if (uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&self, &sl) != 0 ||
        uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &pl) != 0 ||
        !proc_net_addr(&peer, want_local, sizeof want_local, &v6a) ||
        !proc_net_addr(&self, want_rem, sizeof want_rem, &v6b) || v6a != v6b)
        return 0;
    FILE *f = fopen(v6a ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
    if (!f)
        return 0;
    char line[512];
    unsigned long found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char local[64], rem[64];
        unsigned long inode;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %*s %*s %*s %*s %*s %*s %lu", local, rem, &inode) == 3 &&
            strcmp(local, want_local) == 0 && strcmp(rem, want_rem) == 0)
            found = inode;
    }
    fclose(f);
    return found;
}

/* 0 when process pid holds the socket at the other end of c (the
 * connection comes from that process), else -1 with the reason. SO_PEERCRED
 * tells nothing on TCP, so the peer's socket is looked up by its addresses
 * and pid's file table searched for it. */
static int peer_is(srv_conn *c, unsigned pid, char *why, size_t whylen)
{
    unsigned long ino = peer_socket_inode(c);
    if (!ino) {
        snprintf(why, whylen, "the socket at the other end of this connection is not found on psd's machine");
        return -1;
    }
    char dir[64], want[64];
    snprintf(dir, sizeof dir, "/proc/%u/fd", pid);
    snprintf(want, sizeof want, "socket:[%lu]", ino);
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, whylen, "cannot read %s: %s", dir, strerror(errno));
        return -1;
    }
    int ok = 0;
    for (struct dirent *e; !ok && (e = readdir(d));) {
        char path[320], link[64];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            ok = strcmp(link, want) == 0;
        }
    }
    closedir(d);
    if (!ok)
        snprintf(why, whylen, "pid %u named in the hello is not the process at the other end of the connection", pid);
    return ok ? 0 : -1;
}

/* Opens path, /proc/<pid>/fd/<fd> (filled in here), read-write when pid
 * is the process at the other end of c and the file is a memfd sealed
 * against shrinking and growing; its size in *size. The fd, or -1 with the
 * reason in why. */
static int open_memfd(srv_conn *c, ps_pidfd pf, char path[64], uint64_t *size, char *why, size_t whylen)
{
    snprintf(path, 64, "/proc/%u/fd/%u", pf.pid, pf.fd);
    if (peer_is(c, pf.pid, why, whylen) != 0)
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    /* what the file is, before its seals: a tmpfs or hugetlbfs file has
     * seals too (F_SEAL_SEAL), and is still no memfd. The link of a memfd
     * reads "/memfd:NAME (deleted)". */
    char target[80];
    ssize_t tl = readlink(path, target, sizeof target - 1);
    target[tl > 0 ? tl : 0] = 0;
    int seals = strncmp(target, "/memfd:", 7) == 0 ? fcntl(fd, F_GET_SEALS) : -1;
    struct stat st;
    if (strncmp(target, "/memfd:", 7) != 0)
        snprintf(why, whylen, "%s is not a memfd (%s)", path, tl > 0 ? target : strerror(errno));
    else if (seals < 0)
        snprintf(why, whylen, "%s is not a memfd (%s)", path, strerror(errno));
    else if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        snprintf(why, whylen, "%s is a memfd not sealed against shrinking and growing", path);
    else if (fstat(fd, &st) != 0)
        snprintf(why, whylen, "cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        snprintf(why, whylen, "%s is not a regular file", path);
    else {
        *size = (uint64_t)st.st_size;
        return fd;
    }
    close(fd);
    return -1;
}

int srv_shm_attach(srv_conn *c, const ps_msg *m, uint64_t nparams, char *why, size_t whylen)
{
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
    char path[64];
    uint64_t size, end = (goff > poff ? goff : poff) + nparams;
    int fd = open_memfd(c, (ps_pidfd){m->shm_pid, m->shm_fd}, path, &size, why, whylen);
    if (fd < 0)
        return -1;
    if (m->shm_at ? size < end * sizeof(float) : size != end * sizeof(float)) {
        if (m->shm_at)
            snprintf(why, whylen, "%s holds %llu bytes, fewer than the %llu floats the hello places in it", path,
                     (unsigned long long)size, (unsigned long long)end);
        else
            snprintf(why, whylen, "%s holds %llu bytes, not 2 x %llu floats", path, (unsigned long long)size,
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

int srv_tshm_attach(srv_conn *c, const ps_msg *m, char *why, size_t whylen)
{
    char path[64];
    uint64_t size;
    int fd = open_memfd(c, m->tshm, path, &size, why, whylen);
    if (fd < 0)
        return -1;
    if (size < PS_TSEG_MIN || size > PS_TSEG_MAX || size % 8) {
        snprintf(why, whylen, "the table segment %s holds %llu bytes, not a multiple of 8 from %u to %u", path,
                 (unsigned long long)size, PS_TSEG_MIN, PS_TSEG_MAX);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "cannot map the table segment %s: %s", path, strerror(err));
        return -1;
    }
    c->tseg = p;
    c->tseg_len = (size_t)size;
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
    if (c->tseg)
        munmap(c->tseg, c->tseg_len);
    c->tseg = NULL;
    c->tseg_len = 0;
}
