/* tell.c - a follower promoted by hand (psctl promote, no coordinator)
 * tells the leader it followed to step down. A person may promote while
 * that leader still runs (a switch-over, or a leader only cut off for a
 * while): both would lead, and the old one, its follower gone from the
 * in-sync set, would acknowledge pushes alone. So the promoted follower
 * tells it, for TELL_MS: ADMIN step_down with this psd's address and the
 * history id of the log it followed, which the old leader checks (a psd
 * that has led another log since is not told to step down; see
 * dispatch/repl.c). A detached thread of its own does it, with blocking
 * calls (common/conn.c), and only logs; it owns nothing of struct psd. */
#define _GNU_SOURCE
#include "server/connection/tell.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/conn.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/record/stats.h"
#include "server/store/psd.h"

#define TIMEOUT_MS 10000 /* one connection's attempt */
#define TELL_MS 30000

typedef struct tell {
    char leader[sizeof ((srv_follow *)0)->leader];
    char self[sizeof ((ps_config *)0)->advertise];
    ps_token token;
    uint64_t hist;
} tell;

/* One attempt: 0 told (its answer in text), or an error code. */
static int tell_once(tell *w, char *text, size_t len)
{
    ps_conn c;
    ps_msg m, r;
    char hist[24];
    snprintf(hist, sizeof hist, "%" PRIu64, w->hist);
    const char *args[] = {w->self, hist};
    ps_conn_init(&c);
    int rc = ps_conn_connect(&c, w->leader, TIMEOUT_MS);
    if (rc == 0) {
        ps_msg_init(&m, PS_MSG_HELLO);
        m.has = PS_F_VERSION | PS_F_ROLE;
        m.proto = PS_PROTO_VERSION;
        m.role = PS_ROLE_ADMIN;
        rc = ps_conn_hello(&c, &m, w->token.len ? w->token.b : NULL, w->token.len, &r, TIMEOUT_MS);
    }
    if (rc == 0)
        rc = ps_conn_admin(&c, "step_down", args, 2, &r, TIMEOUT_MS);
    if (rc == 0)
        snprintf(text, len, "%.*s", (int)r.text_len, r.text ? r.text : "");
    else
        snprintf(text, len, "%s", ps_conn_error(&c));
    ps_conn_close(&c);
    ps_conn_free(&c);
    return rc;
}

static void *tell_main(void *arg)
{
    tell *w = arg;
    uint64_t until = srv_now_ms() + TELL_MS;
    char text[400];
    for (useconds_t backoff = 100000;; backoff = backoff < 1000000 ? backoff * 2 : 1000000) {
        int rc = tell_once(w, text, sizeof text);
        if (rc == 0) {
            PS_LOG(PS_LOG_INFO, "replication: the old leader %s: %s", w->leader, text);
            break;
        }
        if (rc == PS_EREMOTE || rc == PS_EAUTH) {
            PS_LOG(PS_LOG_WARN, "replication: the old leader %s refused to step down: %s", w->leader, text);
            break;
        }
        if (srv_now_ms() >= until) {
            PS_LOG(PS_LOG_WARN, "replication: the old leader %s not reached for %d s (%s): if it still runs, stop "
                   "it, or it goes on leading its workers", w->leader, TELL_MS / 1000, text);
            break;
        }
        usleep(backoff);
    }
    free(w);
    return NULL;
}

void srv_tell_step_down(const char *leader, const char *self, const ps_token *token, uint64_t hist)
{
    tell *w = calloc(1, sizeof *w);
    pthread_t th;
    pthread_attr_t at;
    if (!w)
        return;
    snprintf(w->leader, sizeof w->leader, "%s", leader);
    snprintf(w->self, sizeof w->self, "%s", self);
    w->token = *token;
    w->hist = hist;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, tell_main, w) != 0) {
        PS_LOG(PS_LOG_WARN, "replication: cannot tell the old leader %s to step down (no thread): if it still runs, "
               "stop it", leader);
        free(w);
    }
    pthread_attr_destroy(&at);
}
