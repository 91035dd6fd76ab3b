/* http.c - the /metrics endpoint (see http.h): a libuv listener, and per
 * connection nodejs's http-parser fed from a bounded read, one response,
 * then a graceful close.
 *
 * A connection lives through three states: READING (bytes go to the parser;
 * at most SRV_HTTP_REQUEST_MAX of them, within SRV_HTTP_IDLE_MS), WRITING
 * (one response queued) and DRAINING (response written, our side shut down;
 * what the client still sends is read and dropped until it closes or a short
 * timer ends it, so the kernel never answers unread bytes with a reset that
 * could destroy the response). Memory is freed in the close callback of the
 * last of its two handles. */
#include "server/connection/http.h"

#include <arpa/inet.h>
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/report/dashboard.h"
#include "proto/errors.h"
#include "server/report/status.h"

#define DRAIN_MS 2000

enum { HC_READING, HC_WRITING, HC_DRAINING };

typedef struct http_conn {
    uv_tcp_t tcp;                 /* first: the handle is cast back to the conn */
    uv_timer_t timer;             /* idle timeout, then drain timeout */
    struct srv_http *h;
    http_parser parser;
    int state;                    /* HC_* */
    int closing;
    int open_handles;             /* tcp and timer until their close callbacks */
    size_t nread;                 /* request bytes received */
    char url[SRV_HTTP_URL_MAX + 1];
    size_t url_len;
    int url_too_long;
    int headers_done;             /* the parser saw the end of the headers */
    char hname[32];               /* the header being read, lower case ("" past 31 bytes) */
    size_t hname_len;
    int in_value;                 /* the parser is in a header's value */
    char authorization[SRV_HTTP_HEADER_MAX + 1]; /* "" when absent or too long */
    char cookie[SRV_HTTP_HEADER_MAX + 1];
    size_t auth_len, cookie_len;
    int complete;                 /* the parser saw the whole request */
    char peer[64];
    char *wbuf;                   /* the response, until the write callback */
    uv_write_t wreq;
    uv_shutdown_t sreq;
    char rbuf[2048];
    struct http_conn *prev, *next;
} http_conn;

struct srv_http {
    psd *s;
    uv_tcp_t listener;
    int listening;
    int open_handles;             /* listener + connections' handles */
    int stopped;
    char addr[300];               /* bound host:port */
    http_conn *conns;
    unsigned nconns;
    http_parser_settings settings;
};

/* ---- closing -------------------------------------------------------------- */

static void http_maybe_free(struct srv_http *h)
{
    if (h->stopped && h->open_handles == 0)
        free(h);
}

static void on_conn_closed(uv_handle_t *handle)
{
    http_conn *hc = handle->data;
    if (--hc->open_handles > 0)
        return;
    struct srv_http *h = hc->h;
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        h->conns = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    h->nconns--;
    h->open_handles--;
    free(hc->wbuf);
    free(hc);
    http_maybe_free(h);
}

static void conn_close(http_conn *hc)
{
    if (hc->closing)
        return;
    hc->closing = 1;
    uv_close((uv_handle_t *)&hc->tcp, on_conn_closed);
    uv_close((uv_handle_t *)&hc->timer, on_conn_closed);
}

static void on_drain_timeout(uv_timer_t *t)
{
    conn_close(t->data);
}

/* Reads, draining or not, go into the connection's own buffer. */
static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    http_conn *hc = handle->data;
    (void)suggested;
    buf->base = hc->rbuf;
    buf->len = sizeof hc->rbuf;
}

/* DRAINING: what the client still sends is dropped; its close ends it. */
static void on_read_drain(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *hc = st->data;
    (void)buf;
    if (nread < 0 && !hc->closing)
        conn_close(hc);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    http_conn *hc = req->data;
    if (hc->closing)
        return;
    if (status < 0) {
        conn_close(hc);
        return;
    }
    hc->state = HC_DRAINING;
    uv_timer_start(&hc->timer, on_drain_timeout, DRAIN_MS, 0);
    if (uv_read_start((uv_stream_t *)&hc->tcp, on_alloc, on_read_drain) != 0)
        conn_close(hc);
}

static void on_written(uv_write_t *req, int status)
{
    http_conn *hc = req->data;
    free(hc->wbuf);
    hc->wbuf = NULL;
    if (hc->closing)
        return;
    hc->sreq.data = hc;
    if (status < 0 || uv_shutdown(&hc->sreq, (uv_stream_t *)&hc->tcp, on_shutdown) != 0)
        conn_close(hc);
}

/* ---- responding ------------------------------------------------------------- */

/* Queues one response and stops parsing. body may be NULL (HEAD, or none);
 * content_length is sent either way. extra is more header lines ("" or
 * lines ending in \r\n). */
static void respond(http_conn *hc, int code, const char *reason, const char *ctype, const char *extra,
                    const char *body, size_t body_len, int send_body)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n"
                     "Cache-Control: no-store\r\n\r\n",
                     code, reason, ctype, body_len, extra);
    size_t blen = send_body && body ? body_len : 0;
    PS_LOG(PS_LOG_DEBUG, "http %s: %s %.*s -> %d", hc->peer,
           hc->complete ? http_method_str((enum http_method)hc->parser.method) : "-", (int)hc->url_len, hc->url,
           code);
    hc->state = HC_WRITING;
    uv_timer_stop(&hc->timer);
    uv_read_stop((uv_stream_t *)&hc->tcp);
    hc->wbuf = malloc((size_t)n + blen);
    if (!hc->wbuf) {
        conn_close(hc);
        return;
    }
    memcpy(hc->wbuf, head, (size_t)n);
    if (blen)
        memcpy(hc->wbuf + n, body, blen);
    uv_buf_t b = uv_buf_init(hc->wbuf, (unsigned)((size_t)n + blen));
    hc->wreq.data = hc;
    if (uv_write(&hc->wreq, (uv_stream_t *)&hc->tcp, &b, 1, on_written) != 0) {
        free(hc->wbuf);
        hc->wbuf = NULL;
        conn_close(hc);
        return;
    }
    /* reading resumes in DRAINING after the shutdown */
}

static void respond_text(http_conn *hc, int code, const char *reason, const char *extra, const char *text)
{
    int head = hc->complete && hc->parser.method == HTTP_HEAD;
    respond(hc, code, reason, "text/plain; charset=utf-8", extra, text, strlen(text), !head);
}

/* The whole request is in: route it. /metrics is answered here, anything
 * else by the dashboard (dashboard.c); with a token configured, every path
 * needs it. */
static void serve(http_conn *hc)
{
    struct srv_http *h = hc->h;
    struct http_parser_url u;
    char path[SRV_HTTP_URL_MAX + 1] = "/", query[SRV_HTTP_URL_MAX + 1] = "";

    http_parser_url_init(&u);
    if (http_parser_parse_url(hc->url, hc->url_len, 0, &u) == 0) {
        if (u.field_set & (1 << UF_PATH))
            snprintf(path, sizeof path, "%.*s", (int)u.field_data[UF_PATH].len, hc->url + u.field_data[UF_PATH].off);
        if (u.field_set & (1 << UF_QUERY))
            snprintf(query, sizeof query, "%.*s", (int)u.field_data[UF_QUERY].len,
                     hc->url + u.field_data[UF_QUERY].off);
    }
    if (hc->parser.method != HTTP_GET && hc->parser.method != HTTP_HEAD) {
        respond_text(hc, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
                     "method not allowed: psd's HTTP endpoints are read-only; use GET\n");
        return;
    }
    int head = hc->parser.method == HTTP_HEAD;
    srv_http_req q = {.path = path, .query = query, .authorization = hc->authorization, .cookie = hc->cookie,
                      .head = head};
    srv_http_resp r = {.code = 500, .reason = "Internal Server Error", .ctype = "text/plain; charset=utf-8"};
    if (!srv_dash_authorized(h->s, &q, &r)) {
        respond(hc, r.code, r.reason, r.ctype, r.extra, (const char *)r.body.p, r.body.len, !head);
        ps_buf_free(&r.body);
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        ps_buf text = {0};
        if (srv_metrics_text(h->s, &text) != 0) {
            ps_buf_free(&text);
            respond_text(hc, 500, "Internal Server Error", "", "out of memory\n");
            return;
        }
        respond(hc, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", r.extra, (const char *)text.p,
                text.len, !head);
        ps_buf_free(&text);
        return;
    }
    srv_dash_serve(h->s, &q, &r);
    respond(hc, r.code, r.reason, r.ctype, r.extra, (const char *)r.body.p, r.body.len, !head);
    ps_buf_free(&r.body);
}

/* ---- parsing ----------------------------------------------------------------- */

static int on_url(http_parser *p, const char *at, size_t len)
{
    http_conn *hc = p->data;
    if (hc->url_len + len > SRV_HTTP_URL_MAX) {
        hc->url_too_long = 1;
        return 1; /* stops the parser with HPE_CB_url */
    }
    memcpy(hc->url + hc->url_len, at, len);
    hc->url_len += len;
    hc->url[hc->url_len] = '\0';
    return 0;
}

/* Keeps the Authorization and Cookie headers (others are ignored); a value
 * longer than SRV_HTTP_HEADER_MAX is dropped whole. */
static int on_header_field(http_parser *p, const char *at, size_t len)
{
    http_conn *hc = p->data;
    if (hc->in_value) {
        hc->in_value = 0;
        hc->hname_len = 0;
    }
    for (size_t i = 0; i < len; i++) {
        if (hc->hname_len < sizeof hc->hname - 1) {
            char ch = at[i];
            hc->hname[hc->hname_len] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
        }
        hc->hname_len++;
    }
    hc->hname[hc->hname_len < sizeof hc->hname ? hc->hname_len : 0] = '\0';
    return 0;
}

static void header_append(char *buf, size_t *blen, const char *at, size_t len)
{
    if (*blen > SRV_HTTP_HEADER_MAX)
        return; /* already too long */
    if (*blen + len > SRV_HTTP_HEADER_MAX) {
        *blen = SRV_HTTP_HEADER_MAX + 1;
        buf[0] = '\0';
        return;
    }
    memcpy(buf + *blen, at, len);
    *blen += len;
    buf[*blen] = '\0';
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    http_conn *hc = p->data;
    if (!hc->in_value) {
        hc->in_value = 1;
        if (hc->hname_len >= sizeof hc->hname)
            hc->hname[0] = '\0';
    }
    if (strcmp(hc->hname, "authorization") == 0)
        header_append(hc->authorization, &hc->auth_len, at, len);
    else if (strcmp(hc->hname, "cookie") == 0)
        header_append(hc->cookie, &hc->cookie_len, at, len);
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    ((http_conn *)p->data)->headers_done = 1;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    http_conn *hc = p->data;
    hc->complete = 1;
    http_parser_pause(p, 1); /* one request per connection: ignore what follows */
    return 0;
}

static void on_idle_timeout(uv_timer_t *t)
{
    http_conn *hc = t->data;
    respond_text(hc, 408, "Request Timeout", "", "request timeout\n");
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *hc = st->data;
    if (hc->closing)
        return;
    if (nread < 0) {
        conn_close(hc);
        return;
    }
    if (nread == 0 || hc->state != HC_READING)
        return;
    size_t n = (size_t)nread;
    if (hc->nread + n > SRV_HTTP_REQUEST_MAX) {
        if (hc->headers_done)
            respond_text(hc, 413, "Payload Too Large", "", "request too large: psd reads at most 8192 bytes\n");
        else
            respond_text(hc, 431, "Request Header Fields Too Large", "",
                         "request headers too large: psd reads at most 8192 bytes\n");
        return;
    }
    hc->nread += n;
    http_parser_execute(&hc->parser, &hc->h->settings, buf->base, n);
    if (hc->complete) {
        serve(hc);
        return;
    }
    enum http_errno e = HTTP_PARSER_ERRNO(&hc->parser);
    if (hc->url_too_long)
        respond_text(hc, 414, "URI Too Long", "", "request target too long\n");
    else if (e != HPE_OK)
        respond_text(hc, 400, "Bad Request", "", http_errno_description(e));
}

/* ---- accepting ----------------------------------------------------------------- */

static void on_connection(uv_stream_t *server, int status)
{
    struct srv_http *h = server->data;
    if (status < 0) {
        PS_LOG(PS_LOG_WARN, "metrics endpoint: accept: %s", uv_strerror(status));
        return;
    }
    http_conn *hc = calloc(1, sizeof *hc);
    if (!hc)
        return;
    hc->h = h;
    uv_tcp_init(h->s->loop, &hc->tcp);
    uv_timer_init(h->s->loop, &hc->timer);
    hc->tcp.data = hc->timer.data = hc;
    hc->open_handles = 2;
    h->open_handles++;
    hc->next = h->conns;
    if (h->conns)
        h->conns->prev = hc;
    h->conns = hc;
    h->nconns++;
    if (uv_accept(server, (uv_stream_t *)&hc->tcp) != 0) {
        conn_close(hc);
        return;
    }
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&hc->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof host);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(hc->peer, sizeof hc->peer, "%s:%d", host, port);
    http_parser_init(&hc->parser, HTTP_REQUEST);
    hc->parser.data = hc;
    if (h->nconns > SRV_HTTP_CONNS_MAX) {
        respond_text(hc, 503, "Service Unavailable", "", "too many connections\n");
        return;
    }
    uv_timer_start(&hc->timer, on_idle_timeout, SRV_HTTP_IDLE_MS, 0);
    uv_read_start((uv_stream_t *)&hc->tcp, on_alloc, on_read);
}

static void on_listener_closed(uv_handle_t *handle)
{
    struct srv_http *h = handle->data;
    h->open_handles--;
    http_maybe_free(h);
}

int srv_http_start(psd *s)
{
    /* metrics_listen as srv_config_check parsed and checked it at start */
    const char *host = s->settings.metrics_host;
    int port;
    struct sockaddr_storage addr = s->settings.metrics_addr;

    if (!s->cfg.metrics_listen[0] || !host[0])
        return 0;
    /* protected mode (no token: loopback only) is srv_config_check's */
    struct srv_http *h = calloc(1, sizeof *h);
    if (!h)
        return PS_ENOMEM;
    h->s = s;
    http_parser_settings_init(&h->settings);
    h->settings.on_url = on_url;
    h->settings.on_header_field = on_header_field;
    h->settings.on_header_value = on_header_value;
    h->settings.on_headers_complete = on_headers_complete;
    h->settings.on_message_complete = on_message_complete;
    uv_tcp_init(s->loop, &h->listener);
    h->listener.data = h;
    h->open_handles = 1;
    int rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 64, on_connection);
    if (rc != 0) {
        PS_LOG(PS_LOG_ERROR, "metrics endpoint: cannot listen on %s: %s", s->cfg.metrics_listen, uv_strerror(rc));
        h->stopped = 1;
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
        return PS_EIO;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &bl);
    port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                            : ((struct sockaddr_in6 *)&bound)->sin6_port);
    snprintf(h->addr, sizeof h->addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    snprintf(s->http_addr, sizeof s->http_addr, "%s", h->addr);
    h->listening = 1;
    s->http = h;
    PS_LOG(PS_LOG_INFO, "metrics at http://%s/metrics", h->addr);
    return 0;
}

const char *srv_http_address(const psd *s)
{
    return s->http_addr;
}

void srv_http_stop(psd *s)
{
    struct srv_http *h = s->http;
    if (!h)
        return;
    s->http = NULL;
    s->http_addr[0] = '\0';
    h->stopped = 1;
    for (http_conn *hc = h->conns; hc; hc = hc->next)
        conn_close(hc);
    if (h->listening) {
        h->listening = 0;
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
    }
}
