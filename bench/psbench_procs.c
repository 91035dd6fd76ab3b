/* psbench_procs.c - the servers psbench times, as child processes: psd
 * (started on port 0, its port read back from a file) and the plain-TCP
 * ceiling server (one epoll thread reading each client's request and writing
 * its answer), pinned to --server-cpu when asked. */
#include "psbench.h"

/* ---- psd as a child process ---------------------------------------------- */

/* --server-cpu, --follower-cpu (psbench.h) */
int server_cpu = -1;
int follower_cpu = -1;
static int spawning_follower; /* follower_start's child goes to follower_cpu */

/* Puts the calling process on CPU cpu alone (cpu >= 0), or on every CPU
 * but cpu (cpu < 0: CPU -cpu - 1 left out). */
void pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < n && c < CPU_SETSIZE; c++)
        if (cpu >= 0 ? c == cpu : c != -cpu - 1)
            CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "psbench: cannot pin to CPU%s %d: %s\n", cpu >= 0 ? "" : "s but", cpu >= 0 ? cpu : -cpu - 1,
                strerror(errno));
}

/* Runs argv[0] with argv in a child whose standard output and error go to
 * log_path (truncated; if it cannot be opened they stay psbench's). With
 * die_with_parent the child gets SIGTERM when psbench dies, so no psd is
 * left behind. Returns the child's pid, or -1 with err when fork fails; a
 * program that cannot be executed exits 127 with a message in its log. */
pid_t spawn_logged(const char *const *argv, const char *log_path, int die_with_parent, char *err,
                   size_t errlen)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (die_with_parent) {
            prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (getppid() != parent)
                _exit(1);
        }
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (server_cpu >= 0)
            pin_self(server_cpu);
        if (follower_cpu >= 0 && spawning_follower)
            pin_self(follower_cpu);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "psbench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

/* Starts psd for a cell, with a model of S floats; returns its pid and sets
 * *port, or -1 with err. Its port file is named after its log (X.log:
 * X.port), so psd instances running at once, as the parts of a split
 * model do, never share one. extra (NULL, or a NULL-terminated list of at
 * most 16 arguments) goes after psbench's own settings and before
 * --psd-set's. */
pid_t psd_start(const opts *o, int mode, int K, uint64_t S, const char *logpath, char *err, size_t errlen,
                int *port, const char *const *extra)
{
    char portfile[PATH_MAX], workers[16], maxp[48], order[48];
    size_t ll = strlen(logpath);
    if (ll > 4 && strcmp(logpath + ll - 4, ".log") == 0)
        ll -= 4;
    if (snprintf(portfile, sizeof portfile, "%.*s.port", (int)ll, logpath) >= (int)sizeof portfile) {
        snprintf(err, errlen, "path too long: %.300s", logpath);
        return -1;
    }
    unlink(portfile);
    snprintf(workers, sizeof workers, "%d", K);
    snprintf(maxp, sizeof maxp, "max_params=%" PRIu64, S > 268435456u ? S : (uint64_t)268435456u);
    snprintf(order, sizeof order, "bsp_sum_order=%s", mode == MODE_BSP_ARRIVAL ? "arrival" : "shard");
    const char *argv[] = {o->psd,
                          "--listen", "127.0.0.1:0",
                          "--port-file", portfile,
                          "--mode", mode == MODE_ASGD ? "asgd" : "bsp",
                          "--workers", workers,
                          "--log-level", o->verbose ? "info" : "warn",
                          "--set", maxp,
                          "--set", "max_frame=64M",
                          "--set", "optimizer=sgd",
                          "--set", "momentum=0.9",
                          "--set", "lr=1e-6",
                          "--set", "heartbeat_timeout=1h",
                          "--set", order,
                          NULL};
    /* --psd-set: the settings given, after psbench's own (a later --set wins) */
    const char *args[sizeof argv / sizeof argv[0] + 16 + 2 * 16];
    size_t na = 0;
    for (; argv[na]; na++)
        args[na] = argv[na];
    for (int i = 0; extra && extra[i] && i < 16; i++)
        args[na++] = extra[i];
    for (int i = 0; i < o->npsd_set; i++) {
        args[na++] = "--set";
        args[na++] = o->psd_set[i];
    }
    args[na] = NULL;
    pid_t pid = spawn_logged(args, logpath, 1, err, errlen); /* no psd left behind if psbench dies */
    if (pid < 0)
        return -1;
    double t0 = now_s();
    for (;;) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            int p = 0;
            int got = fscanf(f, "%d", &p) == 1 && p > 0;
            fclose(f);
            if (got) {
                *port = p;
                unlink(portfile);
                return pid;
            }
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            snprintf(err, errlen, "psd exited before listening (see %.300s)", logpath);
            return -1;
        }
        if (now_s() - t0 > 20) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(err, errlen, "psd did not write its port file in 20 s (see %.300s)", logpath);
            return -1;
        }
        sleep_s(0.01);
    }
}

pid_t follower_start(const opts *o, int mode, int K, uint64_t S, const char *leaderlog, int port, char *err,
                     size_t errlen)
{
    char log[PATH_MAX], leader[64];
    size_t ll = strlen(leaderlog);
    if (ll > 4 && strcmp(leaderlog + ll - 4, ".log") == 0)
        ll -= 4;
    snprintf(log, sizeof log, "%.*s.follower.log", (int)ll, leaderlog);
    snprintf(leader, sizeof leader, "127.0.0.1:%d", port);
    const char *extra[] = {"--replica-of", leader, "--log-level", "info", NULL};
    int fport;
    spawning_follower = 1;
    pid_t pid = psd_start(o, mode, K, S, log, err, errlen, &fport, extra);
    spawning_follower = 0;
    return pid;
}

const char *const info_log[] = {"--log-level", "info", NULL};

/* Whether the file at path has a line holding both a and b. */
static int log_has(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return found;
}

int wait_in_sync(const char *path)
{
    /* the leader's follower in sync, and the follower done loading its
     * snapshot (its loop busy with that would be timed too) */
    char flog[PATH_MAX];
    size_t ll = strlen(path);
    if (ll > 4 && strcmp(path + ll - 4, ".log") == 0)
        ll -= 4;
    snprintf(flog, sizeof flog, "%.*s.follower.log", (int)ll, path);
    double t0 = now_s();
    while (now_s() - t0 < 60) {
        if (log_has(path, "replication: follower", "is in sync") &&
            log_has(flog, "replication: snapshot loaded", "following"))
            return 0;
        sleep_s(0.02);
    }
    return -1;
}

void child_stop(pid_t pid)
{
    int st;
    kill(pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return;
        sleep_s(0.01);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

/* ---- the plain-TCP ceiling server ------------------------------------------ */

typedef struct tconn {
    int fd;
    int writing;  /* 0: reading S values, 1: writing S values back */
    int parked;   /* star: read all S values, waits for the other clients */
    size_t pos;
    char *buf;    /* where this client's values are read to */
} tconn;

/* Star rounds: when every live client has sent its values, all of them
 * are written back; returns the clients still parked (parked, or 0). */
static int star_release(int ep, tconn *cs, int n, int parked)
{
    int live = 0;
    for (int i = 0; i < n; i++)
        live += cs[i].fd >= 0;
    if (parked < live)
        return parked;
    for (int i = 0; i < n; i++) {
        if (cs[i].fd < 0 || !cs[i].parked)
            continue;
        cs[i].parked = 0;
        cs[i].writing = 1;
        struct epoll_event e = {.events = EPOLLOUT, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_MOD, cs[i].fd, &e);
    }
    return 0;
}

/* The ceiling server: one thread, epoll, nonblocking sockets, as psd's
 * loop; for each client it reads a request of req bytes (dense: S values)
 * into that client's buffer and writes ans bytes of one shared "model"
 * back, forever.
 * With star set it does a BSP round's traffic instead: it writes back only
 * once every connected client has sent its S values (no sum, no update),
 * the least any central server does for a round. Runs in a child process
 * until killed. */
static void tcp_server_main(int lfd, size_t req, size_t ans, int K, int star)
{
    size_t bytes = req > ans ? req : ans;
    char *model = malloc(bytes);
    tconn *cs = calloc((size_t)K + 1, sizeof *cs);
    int ep = epoll_create1(0);
    if (!model || !cs || ep < 0)
        _exit(1);
    memset(model, 1, bytes);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    int n = 0, parked = 0;
    for (;;) {
        struct epoll_event evs[64];
        int ne = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < ne; i++) {
            tconn *c = evs[i].data.ptr;
            if (!c) {
                int fd = accept(lfd, NULL, NULL);
                if (fd >= 0)
                    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                if (fd < 0 || n > K) {
                    if (fd >= 0)
                        close(fd);
                    continue;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                c = &cs[n++];
                c->fd = fd;
                if (!(c->buf = malloc(bytes)))
                    _exit(1);
                memset(c->buf, 0, bytes);
                struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                continue;
            }
            if (c->parked) { /* only EPOLLHUP or EPOLLERR come while parked */
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                c->parked = 0;
                parked--;
                if (parked > 0)
                    parked = star_release(ep, cs, n, parked);
                continue;
            }
            for (;;) {
                ssize_t k;
                size_t want = c->writing ? ans : req;
                if (!c->writing)
                    k = recv(c->fd, c->buf + c->pos, want - c->pos, 0);
                else
                    k = send(c->fd, model + c->pos, want - c->pos, MSG_NOSIGNAL);
                if (k == 0 && !c->writing) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                    break;
                }
                if (k < 0) {
                    if (errno == EINTR)
                        continue;
                    if (errno != EAGAIN) {
                        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                        close(c->fd);
                        c->fd = -1;
                    }
                    break;
                }
                c->pos += (size_t)k;
                if (c->pos < want)
                    continue;
                c->pos = 0;
                if (star && !c->writing) {
                    struct epoll_event e = {.events = 0, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
                    c->parked = 1;
                    parked++;
                    break;
                }
                c->writing = !c->writing;
                struct epoll_event e = {.events = c->writing ? EPOLLOUT : EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
            }
            if (star && parked > 0 && n >= K)
                parked = star_release(ep, cs, n, parked);
        }
    }
}

pid_t tcp_server_start(size_t req, size_t ans, int K, int star, int *port, char *err, size_t errlen)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 64) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &al) != 0) {
        snprintf(err, errlen, "tcp server socket: %s", strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        close(lfd);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        if (server_cpu >= 0)
            pin_self(server_cpu);
        tcp_server_main(lfd, req, ans, K, star);
        _exit(0);
    }
    close(lfd);
    return pid;
}
