/* dashboard.h - the run as a page: what psd records of it over time (a
 * srv_history filled from psd's state), the read-only JSON endpoints and
 * the page's files that the HTTP listener serves, the access rule for
 * them (in dash_access.c), and the ADMIN `history` command behind
 * `psctl history`.
 *
 * Owned by the loop thread (psd.dash). Events are noticed by comparing
 * psd's state on every 250 ms tick with what the last tick saw (worker
 * joins, leaves and losses, checkpoints, pause and resume, settings), so
 * the code that makes them needs no hook but where a state can flip and
 * flip back within a tick (pause and resume: srv_dash_notice); reports are
 * recorded as they arrive (srv_dash_report). */
#ifndef SRV_DASHBOARD_H
#define SRV_DASHBOARD_H

#include "server/store/psd.h"

/* One HTTP request as http.c read it. Strings are NUL-terminated; header
 * values are "" when absent. */
typedef struct srv_http_req {
    const char *path;         /* without the query */
    const char *query;        /* after '?', or "" */
    const char *authorization;
    const char *cookie;
    int head;                 /* HEAD: the same headers, no body */
} srv_http_req;

/* The response to send. body is owned by the response (ps_buf_free). */
typedef struct srv_http_resp {
    int code;
    const char *reason;
    const char *ctype;
    char extra[512];          /* more header lines, each ending in \r\n */
    ps_buf body;
} srv_http_resp;

/* Called from psd's 250 ms tick: notes events, and once a second samples
 * psd's rates, learning rate and round durations. Allocates the history
 * on first use (a failure is logged once and the dashboard stays empty). */
void srv_dash_tick(psd *s, uint64_t now);

/* Notes events now rather than at the next tick: for a state that may
 * change and change back within one (ADMIN pause, resume). */
void srv_dash_notice(psd *s);

/* Worker w's REPORT was just taken into w (loss, samples, rate, and with
 * has_acc its test accuracy and loss): records it. epoch_end: the report
 * of an epoch (its loss is the epoch's mean), not one within it (the mean
 * since the previous report). A worker's epoch reports go into its loss
 * series only while it sends no others, which would say the same at a
 * finer grain (an epoch's mean beside them draws a step at every epoch's
 * end). */
void srv_dash_report(psd *s, const srv_worker *w, int has_acc, int epoch_end);

/* Frees the history (at exit). */
void srv_dash_free(psd *s);

/* A leader: how many model versions a follower that has fetched the log up
 * to pos may be behind, at most (from positions sampled each tick): 0 at
 * the log's end; -1 when pos is older than the samples kept (a minute). */
int64_t srv_dash_versions_behind(psd *s, uint64_t pos);

/* May this request read psd over HTTP? Always when psd has no token_file;
 * else it must show the workers' or the admins' secret (Authorization:
 * Bearer SECRET, or ?token=SECRET) or the read cookie psd derives from a
 * secret (HMAC-SHA256(secret, "psd-http-read-v1") in hex), which a
 * ?token= sets. Returns 1 (r may then hold a Set-Cookie line in extra), or
 * 0 after filling r with the response to send instead: 401 (an HTML form
 * asking for the token when the page was asked for), or 303 to / after a
 * page request with ?token=, so the secret leaves the address bar. */
int srv_dash_authorized(psd *s, const srv_http_req *q, srv_http_resp *r);

/* Answers a GET or HEAD of any path but /metrics: the page and its files
 * from web_root, /api/job, /api/history, or 404. Fills r (never fails: an
 * error is a response too). */
void srv_dash_serve(psd *s, const srv_http_req *q, srv_http_resp *r);

/* ADMIN history [json|csv|table]: fills text (the caller frees it with
 * ps_buf_free) with the history in that form (default table). Returns 0,
 * or PS_EBAD_FIELD / PS_ENOMEM with err filled and text empty. */
int srv_dash_history_text(psd *s, const ps_msg *m, ps_buf *text, char *err, size_t errlen);

#endif
