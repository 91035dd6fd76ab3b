/* hostport.c - "host:port" parsing, for psd's listen options and the
 * clients' --connect, and whether a connection's two ends share a
 * machine; see hostport.h. */
#include "hostport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/parse.h"
#include "proto/errors.h"

/* Is s a host name: labels of letters, digits, '-' and '_' separated by
 * dots, each 1..63 long, 253 at most in all? */
static bool valid_hostname(const char *s)
{
    size_t len = strlen(s), label = 0;

    if (len == 0 || len > 253)
        return false;
    for (const char *p = s; *p; p++) {
        if (*p == '.') {
            if (label == 0 || p[-1] == '-')
                return false;
            label = 0;
        } else if (isalnum((unsigned char)*p) || *p == '_' || (*p == '-' && label > 0)) {
            if (++label > 63)
                return false;
        } else {
            return false;
        }
    }
    return label > 0 && s[len - 1] != '-';
}

int ps_hostport_parse(const char *s, char *host, size_t hostlen, int *port, char *err, size_t errlen)
{
    char h[PS_HOSTPORT_HOST_MAX];
    const char *port_s;
    size_t hlen;

    if (!s || !*s) {
        ps_errf(err, errlen, "empty address; write host:port, e.g. 127.0.0.1:7000");
        return PS_EINVAL;
    }
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close) {
            ps_errf(err, errlen, "'%.300s' has no closing ']'", s);
            return PS_EINVAL;
        }
        if (close[1] != ':') {
            ps_errf(err, errlen, "'%.300s' has no port; write [address]:port, e.g. [::1]:7000", s);
            return PS_EINVAL;
        }
        hlen = (size_t)(close - s - 1);
        if (hlen >= sizeof h) {
            ps_errf(err, errlen, "'%.300s': address too long", s);
            return PS_EINVAL;
        }
        memcpy(h, s + 1, hlen);
        h[hlen] = '\0';
        unsigned char buf[16];
        if (inet_pton(AF_INET6, h, buf) != 1) {
            ps_errf(err, errlen, "'%.300s' is not an IPv6 address", h);
            return PS_EINVAL;
        }
        port_s = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon) {
            ps_errf(err, errlen, "'%.300s' has no port; write host:port, e.g. 127.0.0.1:7000", s);
            return PS_EINVAL;
        }
        if (memchr(s, ':', (size_t)(colon - s))) {
            ps_errf(err, errlen,
                    "'%.300s': an IPv6 address needs brackets, e.g. [::1]:7000", s);
            return PS_EINVAL;
        }
        hlen = (size_t)(colon - s);
        if (hlen == 0) {
            ps_errf(err, errlen,
                    "'%.300s' has no host; write e.g. 0.0.0.0:7000 for every interface", s);
            return PS_EINVAL;
        }
        if (hlen >= sizeof h) {
            ps_errf(err, errlen, "'%.300s': host name too long", s);
            return PS_EINVAL;
        }
        memcpy(h, s, hlen);
        h[hlen] = '\0';
        if (strspn(h, "0123456789.") == hlen) {
            unsigned char buf[4];
            if (inet_pton(AF_INET, h, buf) != 1) {
                ps_errf(err, errlen, "'%.300s' is not an IPv4 address", h);
                return PS_EINVAL;
            }
        } else if (!valid_hostname(h)) {
            ps_errf(err, errlen, "'%.300s' is not a valid host name", h);
            return PS_EINVAL;
        }
        port_s = colon + 1;
    }

    uint64_t p;
    if (strlen(port_s) > 5 || ps_parse_u64(port_s, UINT64_MAX, &p) != 0) {
        ps_errf(err, errlen, "'%.300s': port '%.32s' is not a number 0..65535", s, port_s);
        return PS_EINVAL;
    }
    if (p > 65535) {
        ps_errf(err, errlen, "'%.300s': port %llu is out of range 0..65535", s, (unsigned long long)p);
        return PS_EINVAL;
    }
    if (hlen >= hostlen) {
        ps_errf(err, errlen, "'%.300s': host name too long", s);
        return PS_EINVAL;
    }
    memcpy(host, h, hlen + 1);
    *port = (int)p;
    return 0;
}

int ps_host_is_localhost(const char *host)
{
    static const char name[] = "localhost";
    size_t n = strlen(host), k = sizeof name - 1;
    if (n && host[n - 1] == '.')
        n--;
    if (n < k || strncasecmp(host + n - k, name, k) != 0)
        return 0;
    return n == k || host[n - k - 1] == '.';
}

/* The IP address of sa, in a form that compares equal for equal
 * addresses (an IPv4-mapped IPv6 address as IPv4). Returns 0 when sa is
 * neither IPv4 nor IPv6. */
static int ip_of(const struct sockaddr_storage *sa, uint8_t out[16], int *v4)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (sa->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        *v4 = 1;
        return 1;
    }
    if (sa->ss_family != AF_INET6)
        return 0;
    const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
    *v4 = memcmp(a, mapped, sizeof mapped) == 0;
    memcpy(out, *v4 ? a + 12 : a, *v4 ? 4 : 16);
    return 1;
}

int ps_sock_same_host(int fd)
{
    struct sockaddr_storage peer, self;
    socklen_t pl = sizeof peer, sl = sizeof self;
    int pv4, sv4;
    uint8_t pa[16], sa[16];
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0 || getsockname(fd, (struct sockaddr *)&self, &sl) != 0 ||
        !ip_of(&peer, pa, &pv4) || !ip_of(&self, sa, &sv4))
        return 0;
    static const uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (pv4 ? pa[0] == 127 : memcmp(pa, v6_loopback, 16) == 0)
        return 1;
    return pv4 == sv4 && memcmp(pa, sa, pv4 ? 4 : 16) == 0;
}

int ps_addr_list_add(char (*list)[PS_ADDR_MAX + 1], uint32_t *n, uint32_t cap, const char *a, size_t len)
{
    if (len == 0 || len > PS_ADDR_MAX)
        return -1;
    for (uint32_t k = 0; k < *n; k++)
        if (strlen(list[k]) == len && memcmp(list[k], a, len) == 0)
            return (int)k;
    if (*n == cap)
        return -1;
    memcpy(list[*n], a, len);
    list[*n][len] = '\0';
    return (int)(*n)++;
}

void ps_addr_list_add_entry(char (*list)[PS_ADDR_MAX + 1], uint32_t *n, uint32_t cap, const char *e)
{
    for (const char *q = e; *q;) {
        size_t len = strcspn(q, "/");
        ps_addr_list_add(list, n, cap, q, len);
        q += len + (q[len] == '/');
    }
}
