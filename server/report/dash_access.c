/* dash_access.c - who may read psd over HTTP (the page, its JSON,
 * /metrics): a secret shown as a Bearer header or a ?token=, or the read
 * cookie derived from one (srv_dash_authorized, declared in dashboard.h).
 * Holds no state: a cookie is derived from the secrets psd holds when it
 * is checked. */
#include "server/report/dashboard.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/record/history.h"

/* HMAC-SHA256(secret, "psd-http-read-v1"): the cookie that stands for a
 * secret shown once, so the secret itself is not kept by the browser. */
static void read_cookie(const ps_token *t, uint8_t out[32])
{
    static const char label[] = "psd-http-read-v1";
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, t->b, t->len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, sizeof label - 1);
    crypto_auth_hmacsha256_final(&st, out);
}

/* Constant-time equality of a[0..alen) and b[0..blen). */
static int secret_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    if (alen != blen)
        return 0;
    return sodium_memcmp(a, b, alen) == 0;
}

/* Which secret p[0..n) is: 0 the workers', 1 the admins' (the order of
 * srv_dash.cookie), -1 neither. */
static int which_secret(const psd *s, const uint8_t *p, size_t n)
{
    if (s->token.len && secret_equal(p, n, s->token.b, s->token.len))
        return 0;
    if (s->admin_token.len && secret_equal(p, n, s->admin_token.b, s->admin_token.len))
        return 1;
    return -1;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The value of key in a query string, percent-decoded into out (at most
 * outlen bytes); its length, or -1 when absent or too long. */
static long query_param(const char *query, const char *key, uint8_t *out, size_t outlen)
{
    size_t klen = strlen(key);
    for (const char *p = query; *p;) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > klen && memcmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t n = 0;
            for (size_t i = klen + 1; i < len; i++) {
                int c = (unsigned char)p[i];
                if (c == '%' && i + 2 < len && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
                    c = hexval(p[i + 1]) * 16 + hexval(p[i + 2]);
                    i += 2;
                } else if (c == '+') {
                    c = ' ';
                }
                if (n == outlen)
                    return -1;
                out[n++] = (uint8_t)c;
            }
            return (long)n;
        }
        p += len + (amp != NULL);
    }
    return -1;
}

/* The value of cookie name in a Cookie header, or NULL; *len its length. */
static const char *cookie_value(const char *header, const char *name, size_t *len)
{
    size_t nlen = strlen(name);
    for (const char *p = header; *p;) {
        while (*p == ' ' || *p == ';')
            p++;
        const char *end = strchr(p, ';');
        size_t l = end ? (size_t)(end - p) : strlen(p);
        if (l > nlen && memcmp(p, name, nlen) == 0 && p[nlen] == '=') {
            *len = l - nlen - 1;
            return p + nlen + 1;
        }
        p += l;
    }
    return NULL;
}

int srv_dash_authorized(psd *s, const srv_http_req *q, srv_http_resp *r)
{
    if (!s->token.len)
        return 1;
    const char *a = q->authorization;
    if (strncasecmp(a, "Bearer ", 7) == 0 && which_secret(s, (const uint8_t *)a + 7, strlen(a + 7)) >= 0)
        return 1;
    uint8_t tok[PS_TOKEN_MAX];
    long n = query_param(q->query, "token", tok, sizeof tok);
    int which = n > 0 ? which_secret(s, tok, (size_t)n) : -1;
    sodium_memzero(tok, sizeof tok);
    if (which >= 0) {
        /* the page's own requests then carry this cookie, not the secret */
        uint8_t c[32];
        char hex[65];
        read_cookie(which ? &s->admin_token : &s->token, c);
        sodium_bin2hex(hex, sizeof hex, c, 32);
        snprintf(r->extra, sizeof r->extra, "Set-Cookie: psd_read=%s; Path=/; HttpOnly; SameSite=Strict\r\n", hex);
        if (strcmp(q->path, "/") == 0 || strcmp(q->path, "/index.html") == 0) {
            /* the page again without the secret in the address bar (and history) */
            size_t used = strlen(r->extra);
            snprintf(r->extra + used, sizeof r->extra - used, "Location: /\r\n");
            r->code = 303;
            r->reason = "See Other";
            r->ctype = "text/plain; charset=utf-8";
            r->body.len = 0;
            srv_json_raw(&r->body, "see /\n");
            return 0;
        }
        return 1;
    }
    size_t clen;
    const char *cv = cookie_value(q->cookie, "psd_read", &clen);
    if (cv && clen == 64) {
        uint8_t bin[32], c[32];
        if (sodium_hex2bin(bin, sizeof bin, cv, clen, NULL, NULL, NULL) == 0)
            for (int i = 0; i < 2; i++) {
                const ps_token *t = i ? &s->admin_token : &s->token;
                if (!t->len)
                    continue;
                read_cookie(t, c);
                if (sodium_memcmp(bin, c, 32) == 0)
                    return 1;
            }
    }
    static const char msg[] =
        "401 unauthorized: psd requires its token for HTTP too. Open the page as http://ADDRESS/?token=SECRET "
        "(SECRET: the contents of psd's token_file), or send the header Authorization: Bearer SECRET.\n";
    /* a browser asking for the page gets a form that asks for the token */
    static const char page[] =
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>psd: token needed</title>"
        "<link rel=\"icon\" href=\"data:,\"></head><body style=\"font-family:sans-serif;margin:2em\">"
        "<h1>401: psd needs its token</h1><p>This psd has a token_file: show its contents (the workers' or the "
        "admins' secret) to see the dashboard. The page then keeps a cookie derived from it, not the secret.</p>"
        "<form method=\"get\" action=\"/\"><input type=\"password\" name=\"token\" size=\"40\" "
        "autocomplete=\"off\"> <button>open</button></form></body></html>\n";
    int html = strcmp(q->path, "/") == 0 || strcmp(q->path, "/index.html") == 0;
    r->code = 401;
    r->reason = "Unauthorized";
    r->ctype = html ? "text/html; charset=utf-8" : "text/plain; charset=utf-8";
    snprintf(r->extra, sizeof r->extra, "WWW-Authenticate: Bearer realm=\"psd\"\r\n");
    r->body.len = 0;
    srv_json_raw(&r->body, html ? page : msg);
    return 0;
}

