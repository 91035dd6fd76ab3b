/* http.h - psd's Prometheus endpoint: GET /metrics over HTTP/1.1 on the
 * metrics_listen address, serving the same text as `psctl metrics`
 * (srv_metrics_text). One request per connection (Connection: close). */
#ifndef SRV_HTTP_H
#define SRV_HTTP_H

#include "server/store/psd.h"

#define SRV_HTTP_REQUEST_MAX 8192  /* bytes of request line and headers */
#define SRV_HTTP_URL_MAX 1024      /* bytes of request target */
#define SRV_HTTP_IDLE_MS 10000     /* a request must be complete this soon */
#define SRV_HTTP_CONNS_MAX 64      /* HTTP connections open at once */
#define SRV_HTTP_HEADER_MAX 2100   /* bytes of an Authorization or Cookie value kept */

/* Starts listening on s->cfg.metrics_listen ("host:port", IP literals; port
 * 0 picks a free one) unless it is empty. Returns 0 (also when off) or a
 * negative PS_E* code after logging why. */
int srv_http_start(psd *s);

/* The bound address as "host:port", or "" when the endpoint is off. */
const char *srv_http_address(const psd *s);

/* Closes the listener and every HTTP connection; the memory goes with the
 * last close callback. Harmless when off or already stopped. */
void srv_http_stop(psd *s);

#endif
