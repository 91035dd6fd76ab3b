/* etcd.h - an etcd v3 client on psd's loop (etcd.c): JSON requests to
 * etcd's gateway (POST /v3/...), made with libcurl's multi-socket API, whose
 * sockets and timeout libuv watches (uv_poll, uv_timer): nothing blocks the
 * loop. A request that cannot reach one member goes to the next of the
 * endpoints given. Keys and values travel base64-encoded (etcd's JSON). */
#ifndef SRV_COORD_ETCD_H
#define SRV_COORD_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#define SRV_ETCD_URLS_MAX 8

typedef struct srv_etcd srv_etcd;

/* A request's answer: ok 1 with etcd's JSON answer (borrowed: valid during
 * the call), ok 0 with err when no member answered (or answered an error).
 * sent_ms is srv_now_ms() when the request that answered was sent (the
 * last member tried). Not called after srv_etcd_close. */
typedef void (*srv_etcd_cb)(void *arg, int ok, json_t *answer, const char *err, uint64_t sent_ms);

/* A client of the members in urls ("http://HOST:PORT,http://HOST:PORT",
 * commas between), each request bounded by timeout_ms. NULL with err when
 * the list is empty or too long, or curl cannot start. */
srv_etcd *srv_etcd_new(uv_loop_t *loop, const char *urls, uint64_t timeout_ms, char *err, size_t errlen);
/* POST path (e.g. "/v3/kv/range") with body (JSON text) to the current
 * member, then the others in turn while none answers; cb once (NULL:
 * the answer is not wanted). 0, or -1
 * when out of memory (cb is then not called). */
int srv_etcd_call(srv_etcd *e, const char *path, const char *body, srv_etcd_cb cb, void *arg);
/* Requests in flight. */
int srv_etcd_busy(const srv_etcd *e);
/* The member the next request goes to. */
const char *srv_etcd_member(const srv_etcd *e);
/* Cancels what is in flight (no callback) and closes the handles; the
 * memory goes once the loop has run their close callbacks. Not from one
 * of e's own callbacks, whose request it would free under it. */
void srv_etcd_close(srv_etcd *e);

/* Reading etcd's JSON answers: a member's string (NULL when it is not
 * one), an integer given as a number or a string (etcd's gateway writes
 * 64-bit ones as strings; 0 when absent), and a kv's value (base64) decoded
 * into val ("" when it has none or it does not fit). */
const char *srv_etcd_str(json_t *o, const char *k);
int64_t srv_etcd_int(json_t *o, const char *k);
void srv_etcd_kv_value(json_t *kv, char *val, size_t len);

/* base64 of p[0..n) into out (room for 4 * ((n + 2) / 3) + 1 bytes). */
void srv_b64_encode(const void *p, size_t n, char *out);
/* Decodes base64 text into out (room for outcap bytes, NUL-terminated);
 * its length, or -1 when it is not base64 or does not fit. */
long srv_b64_decode(const char *text, char *out, size_t outcap);

#endif
