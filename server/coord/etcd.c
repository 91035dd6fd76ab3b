/* etcd.c - an etcd v3 client on psd's loop: libcurl's multi-socket API
 * (curl_multi_socket_action) fitted to libuv, a uv_poll_t per socket curl
 * opens and one uv_timer_t for curl's timeout, so requests to etcd's JSON
 * gateway run without blocking the loop. Owns the client, its requests and
 * their handles. A request that gets no answer from a member (refused,
 * timed out, an HTTP error other than 4xx) is sent to the next member, each
 * member at most once; the member that answered is tried first next time. */
#include "server/coord/etcd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "common/log.h"
#include "server/record/stats.h"

#define ANSWER_MAX ((size_t)1 << 20) /* etcd's answers here are small: a few keys */

struct srv_etcd {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer;
    char *url[SRV_ETCD_URLS_MAX];
    int nurl, cur;           /* the endpoints; the one tried first */
    uint64_t timeout_ms;
    int inflight;
    int closing;
    int open_handles;        /* the timer and the polls not closed yet */
    struct req *reqs;        /* in flight */
};

typedef struct req {
    struct req *next;
    srv_etcd *e;
    CURL *easy;
    char path[64];
    char *body;
    char *ans;
    size_t len, cap;
    int tries, member;
    uint64_t sent_ms;
    srv_etcd_cb cb;
    void *arg;
    char errbuf[CURL_ERROR_SIZE];
} req;

typedef struct sock {
    uv_poll_t poll;
    srv_etcd *e;
    curl_socket_t fd;
} sock;

static int curl_ready;

static void maybe_free(srv_etcd *e)
{
    if (e->closing && e->open_handles == 0) {
        for (int i = 0; i < e->nurl; i++)
            free(e->url[i]);
        free(e);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    srv_etcd *e = h->data;
    if (h->type == UV_POLL)
        free(h);
    else
        h->data = NULL;
    e->open_handles--;
    maybe_free(e);
}

static void req_free(req *r)
{
    srv_etcd *e = r->e;
    for (req **p = &e->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    if (r->easy) {
        curl_multi_remove_handle(e->multi, r->easy);
        curl_easy_cleanup(r->easy);
    }
    free(r->body);
    free(r->ans);
    free(r);
    e->inflight--;
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    req *r = arg;
    size_t len = size * n;
    if (r->len + len + 1 > ANSWER_MAX)
        return 0; /* curl fails the transfer */
    if (r->len + len + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + len + 1)
            cap *= 2;
        char *nb = realloc(r->ans, cap);
        if (!nb)
            return 0;
        r->ans = nb;
        r->cap = cap;
    }
    memcpy(r->ans + r->len, p, len);
    r->len += len;
    r->ans[r->len] = 0;
    return len;
}

/* Sends r to member r->member. 0 or -1. */
static int req_send(req *r)
{
    srv_etcd *e = r->e;
    char url[512];
    snprintf(url, sizeof url, "%s%s", e->url[r->member], r->path);
    if (r->easy) {
        curl_multi_remove_handle(e->multi, r->easy);
        curl_easy_reset(r->easy);
    } else if (!(r->easy = curl_easy_init())) {
        return -1;
    }
    r->len = 0;
    r->errbuf[0] = 0;
    CURL *c = r->easy;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    r->sent_ms = srv_now_ms();
    return curl_multi_add_handle(e->multi, c) == CURLM_OK ? 0 : -1;
}

/* A transfer ended: the answer, or the next member. */
static void req_done(req *r, CURLcode rc)
{
    srv_etcd *e = r->e;
    long http = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &http);
    char err[400];
    json_t *j = NULL;
    if (rc == CURLE_OK && http == 200) {
        json_error_t je;
        j = json_loadb(r->ans ? r->ans : "", r->len, 0, &je);
        if (!j)
            snprintf(err, sizeof err, "%s answered %s with what is not JSON: %s", e->url[r->member], r->path, je.text);
    } else if (rc == CURLE_OK) {
        snprintf(err, sizeof err, "%s answered %s with HTTP %ld: %.200s", e->url[r->member], r->path, http,
                 r->ans ? r->ans : "");
    } else {
        snprintf(err, sizeof err, "%s: %s", e->url[r->member], r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc));
    }
    if (j) {
        e->cur = r->member;
        if (r->cb)
            r->cb(r->arg, 1, j, NULL, r->sent_ms);
        json_decref(j);
        req_free(r);
        return;
    }
    /* a 4xx is etcd refusing the request itself: another member would too */
    if ((rc != CURLE_OK || http >= 500) && ++r->tries < e->nurl) {
        PS_LOG(PS_LOG_DEBUG, "coordinator: %s; trying the next member", err);
        r->member = (r->member + 1) % e->nurl;
        e->cur = r->member;
        if (req_send(r) == 0)
            return;
    }
    if (r->cb)
        r->cb(r->arg, 0, NULL, err, r->sent_ms);
    req_free(r);
}

static void check_done(srv_etcd *e)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(e->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        req *r = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        req_done(r, m->data.result);
    }
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    sock *sk = (sock *)p;
    srv_etcd *e = sk->e;
    int flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    int running;
    curl_multi_socket_action(e->multi, sk->fd, flags, &running);
    check_done(e);
}

static void on_timer(uv_timer_t *t)
{
    srv_etcd *e = t->data;
    int running;
    curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(e);
}

/* CURLMOPT_SOCKETFUNCTION: watch fd for what curl waits for. */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)easy;
    srv_etcd *e = userp;
    sock *sk = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (sk) {
            uv_poll_stop(&sk->poll);
            uv_close((uv_handle_t *)&sk->poll, on_handle_closed);
            curl_multi_assign(e->multi, fd, NULL);
        }
        return 0;
    }
    if (!sk) {
        if (!(sk = calloc(1, sizeof *sk)))
            return -1;
        sk->e = e;
        sk->fd = fd;
        if (uv_poll_init_socket(e->loop, &sk->poll, fd) != 0) {
            free(sk);
            return -1;
        }
        sk->poll.data = e;
        e->open_handles++;
        curl_multi_assign(e->multi, fd, sk);
    }
    int ev = (what & CURL_POLL_IN ? UV_READABLE : 0) | (what & CURL_POLL_OUT ? UV_WRITABLE : 0);
    uv_poll_start(&sk->poll, ev, on_poll);
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: curl's one timeout. */
static int on_curl_timer(CURLM *multi, long ms, void *userp)
{
    (void)multi;
    srv_etcd *e = userp;
    if (ms < 0)
        uv_timer_stop(&e->timer);
    else
        uv_timer_start(&e->timer, on_timer, (uint64_t)ms, 0);
    return 0;
}

srv_etcd *srv_etcd_new(uv_loop_t *loop, const char *urls, uint64_t timeout_ms, char *err, size_t errlen)
{
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            snprintf(err, errlen, "libcurl does not start");
            return NULL;
        }
        curl_ready = 1;
    }
    srv_etcd *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "no memory for the coordinator's client");
        return NULL;
    }
    const char *p = urls;
    while (*p) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t n = strcspn(p, ", ");
        if (!n)
            break;
        if (e->nurl == SRV_ETCD_URLS_MAX || n > 255) {
            snprintf(err, errlen, "coordinator: at most %d URLs of 255 characters each", SRV_ETCD_URLS_MAX);
            goto fail;
        }
        if (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0) {
            snprintf(err, errlen, "coordinator: \"%.*s\" is not an http:// or https:// URL of an etcd member",
                     (int)n, p);
            goto fail;
        }
        size_t len = n;
        while (len > 8 && p[len - 1] == '/')
            len--;
        e->url[e->nurl++] = strndup(p, len);
        p += n;
    }
    if (!e->nurl) {
        snprintf(err, errlen, "coordinator: no URL given");
        goto fail;
    }
    if (!(e->multi = curl_multi_init())) {
        snprintf(err, errlen, "coordinator: libcurl's multi handle does not start");
        goto fail;
    }
    e->loop = loop;
    e->timeout_ms = timeout_ms;
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(e->multi, CURLMOPT_SOCKETDATA, e);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(e->multi, CURLMOPT_TIMERDATA, e);
    uv_timer_init(loop, &e->timer);
    e->timer.data = e;
    e->open_handles = 1;
    return e;
fail:
    for (int i = 0; i < e->nurl; i++)
        free(e->url[i]);
    free(e);
    return NULL;
}

int srv_etcd_call(srv_etcd *e, const char *path, const char *body, srv_etcd_cb cb, void *arg)
{
    if (e->closing)
        return -1;
    req *r = calloc(1, sizeof *r);
    if (!r || !(r->body = strdup(body))) {
        free(r);
        return -1;
    }
    r->e = e;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->cb = cb;
    r->arg = arg;
    r->member = e->cur;
    r->next = e->reqs;
    e->reqs = r;
    e->inflight++;
    if (req_send(r) != 0) {
        req_free(r);
        return -1;
    }
    return 0;
}

int srv_etcd_busy(const srv_etcd *e)
{
    return e->inflight;
}

const char *srv_etcd_member(const srv_etcd *e)
{
    return e->url[e->cur];
}

void srv_etcd_close(srv_etcd *e)
{
    if (!e || e->closing)
        return;
    while (e->reqs)
        req_free(e->reqs); /* removing a handle closes its sockets: CURL_POLL_REMOVE */
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    e->closing = 1;
    uv_timer_stop(&e->timer);
    uv_close((uv_handle_t *)&e->timer, on_handle_closed);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void srv_b64_encode(const void *p, size_t n, char *out)
{
    const unsigned char *b = p;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)b[i] << 16 | (i + 1 < n ? (unsigned)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        out[o++] = B64[v >> 18 & 63];
        out[o++] = B64[v >> 12 & 63];
        out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[o] = 0;
}

long srv_b64_decode(const char *text, char *out, size_t outcap)
{
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;
    for (const char *p = text; *p && *p != '='; p++) {
        const char *at = strchr(B64, *p);
        if (!at || !*p)
            return -1;
        v = v << 6 | (unsigned)(at - B64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 >= outcap)
                return -1;
            out[o++] = (char)(v >> bits & 0xff);
        }
    }
    out[o] = 0;
    return (long)o;
}

const char *srv_etcd_str(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int64_t srv_etcd_int(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return json_integer_value(v);
    return json_is_string(v) ? strtoll(json_string_value(v), NULL, 10) : 0;
}

void srv_etcd_kv_value(json_t *kv, char *val, size_t len)
{
    const char *v = srv_etcd_str(kv, "value");
    if (!v || srv_b64_decode(v, val, len) < 0)
        val[0] = 0;
}
