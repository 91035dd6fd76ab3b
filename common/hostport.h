/* hostport.h - "host:port" addresses as psd's options and the clients'
 * command lines write them. Parsing only: no name is resolved here.
 *
 * ps_hostport_parse returns 0 or PS_EINVAL (proto/errors.h) with a message
 * for a person in err (which may be NULL). */
#ifndef PS_HOSTPORT_H
#define PS_HOSTPORT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h" /* PS_ADDR_MAX */

#define PS_HOSTPORT_HOST_MAX 256   /* host name or address, NUL included */

/* A parsed "host:port". host is an IPv4 or IPv6 literal (without brackets)
 * or a host name; port 0 asks the kernel for a free port. */
typedef struct ps_hostport {
    char host[PS_HOSTPORT_HOST_MAX];
    int port;                          /* 0..65535 */
} ps_hostport;

/* Parse "host:port": "127.0.0.1:7000", "[::1]:7000", "example.org:7000".
 * host gets the host without brackets (hostlen bytes at most, NUL
 * included). Port must be 0..65535. */
int ps_hostport_parse(const char *s, char *host, size_t hostlen, int *port, char *err, size_t errlen);

/* 1 when host is `localhost` or a name under `.localhost` (any case, a
 * final dot allowed): RFC 6761, section 6.3, makes those loopback, so psd
 * and the clients take them as 127.0.0.1 (and ::1) without asking the
 * resolver, which a machine without /etc/hosts (a minimal container)
 * cannot answer for them. */
int ps_host_is_localhost(const char *host);

/* Whether the peer of connected TCP socket fd runs on this machine: its
 * address is a loopback one, or the very address the socket has here (a
 * connection from this host to one of its own interfaces). 0 also when
 * either address cannot be read. */
int ps_sock_same_host(int fd);

/* A part's replicas as a list of addresses (each at most PS_ADDR_MAX
 * bytes, NUL-terminated, in rows of PS_ADDR_MAX + 1): adds a (len bytes)
 * to list[0..*n) unless it is there or the list holds cap already.
 * Returns its index, or -1 when it could not be added. */
int ps_addr_list_add(char (*list)[PS_ADDR_MAX + 1], uint32_t *n, uint32_t cap, const char *a, size_t len);
/* Adds each address of e, a part as a part map names it (its replicas
 * "A/B", or one address), with ps_addr_list_add. */
void ps_addr_list_add_entry(char (*list)[PS_ADDR_MAX + 1], uint32_t *n, uint32_t cap, const char *e);

#endif
