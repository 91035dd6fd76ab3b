/* settings.c - the checks of psd's settings that look at more than one
 * option, or at more than an option's syntax: one function, used at
 * start, by --print-config, at a SIGHUP reload and on `psctl set`, so that
 * psd refuses the same settings wherever they come from. What it parses
 * (the metrics endpoint's address) it hands back, so nothing parses it
 * again. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/errors.h"
#include "psd.h"

int srv_config_check(const ps_config *c, srv_settings *out, char *err, size_t len)
{
    srv_settings parsed;
    memset(&parsed, 0, sizeof parsed);
    if (c->metrics_listen[0]) {
        char perr[512];
        if (ps_hostport_parse(c->metrics_listen, parsed.metrics_host, sizeof parsed.metrics_host,
                                     &parsed.metrics_port, perr, sizeof perr) != 0) {
            snprintf(err, len, "metrics_listen: %s", perr);
            return PS_EINVAL;
        }
        if (uv_ip4_addr(parsed.metrics_host, parsed.metrics_port, (struct sockaddr_in *)&parsed.metrics_addr) != 0 &&
            uv_ip6_addr(parsed.metrics_host, parsed.metrics_port, (struct sockaddr_in6 *)&parsed.metrics_addr) != 0) {
            snprintf(err, len, "metrics_listen: '%s' is not an IPv4 or IPv6 address", parsed.metrics_host);
            return PS_EINVAL;
        }
    }
    if (c->mode == PS_MODE_BSP && c->backup_workers >= c->workers) {
        snprintf(err, len, "backup_workers (%d) must be less than workers (%d)", c->backup_workers, c->workers);
        return PS_EINVAL;
    }
    if (c->nonfinite == PS_NONFINITE_CLIP && !(c->clip_norm > 0)) {
        snprintf(err, len, "nonfinite = clip needs clip_norm above 0: a sanitised push is scaled down to that "
                           "norm (its infinities became +-FLT_MAX)");
        return PS_EINVAL;
    }
    if (c->optimizer == PS_OPTIMIZER_SGD && c->nesterov && !(c->momentum > 0)) {
        snprintf(err, len, "nesterov = yes needs momentum above 0 (Nesterov momentum with none is plain sgd): set "
                           "momentum, or nesterov = no");
        return PS_EINVAL;
    }
    if (out)
        *out = parsed;
    return 0;
}

int srv_state_dir_check(const char *dir, char *err, size_t len)
{
    if (!dir[0])
        return 0;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) {
            snprintf(err, len, "state_dir %s: %s", dir, strerror(errno));
            return PS_EIO;
        }
        if (mkdir(dir, 0750) != 0) {
            snprintf(err, len, "cannot create state_dir %s: %s", dir, strerror(errno));
            return PS_EIO;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, len, "state_dir %s is not a directory", dir);
        return PS_EIO;
    }
    /* write access is what checkpoints need: try it, as they will */
    char probe[PS_CONFIG_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.psd-write-test-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, len, "state_dir %s cannot be written (checkpoints would fail): %s", dir, strerror(errno));
        return PS_EIO;
    }
    close(fd);
    unlink(probe);
    return 0;
}

int srv_listen_resolve(const char *host, int port, struct sockaddr_storage *out, char *err, size_t len)
{
    memset(out, 0, sizeof *out);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0)
        return 0;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(err, len, "listen: cannot resolve '%s': %s", host, gai_strerror(rc));
        return PS_EINVAL;
    }
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if ((a->ai_family == AF_INET && (!pick || pick->ai_family != AF_INET)) ||
            (a->ai_family == AF_INET6 && !pick))
            pick = a;
    if (!pick) {
        freeaddrinfo(res);
        snprintf(err, len, "listen: '%s' has no IPv4 or IPv6 address", host);
        return PS_EINVAL;
    }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    if (pick->ai_family == AF_INET)
        ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

int srv_addr_is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family != AF_INET6)
        return 0;
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
}

void srv_addr_name(const struct sockaddr_storage *a, char *buf, size_t len)
{
    if (a->ss_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)a, buf, len);
    else if (a->ss_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)a, buf, len);
    else
        snprintf(buf, len, "?");
}
