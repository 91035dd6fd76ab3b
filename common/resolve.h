/* resolve.h - a host name resolved within a deadline: getaddrinfo on a
 * thread of its own that the caller may leave behind (the blocking
 * connection's lookup, conn.c). */
#ifndef PS_COMMON_RESOLVE_H
#define PS_COMMON_RESOLVE_H

#include <netdb.h>
#include <stdint.h>

/* getaddrinfo(name, port, hints), given up at deadline (a CLOCK_MONOTONIC
 * time in ms; -1: none) with EAI_AGAIN and *timed_out set. A numeric
 * address needs no resolver and is answered at once. *res is the caller's
 * to freeaddrinfo when 0 is returned. */
int ps_resolve_by(const char *name, const char *port, const struct addrinfo *hints, struct addrinfo **res,
                  int64_t deadline, int *timed_out);

#endif
