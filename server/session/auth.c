/* auth.c - psd's side of the token handshake (proto/PROTOCOL.md section
 * 7.1): the secrets from token_file and admin_token_file, a CHALLENGE for
 * every HELLO while a token is configured, and the check of the AUTH that
 * answers it before the hello is accepted.
 *
 * Until its AUTH is verified a connection keeps role PS_ROLE_NONE, so the
 * pre-hello frame limit and handshake_timeout still apply to it, and it
 * may send nothing but that AUTH. */
#include <stdlib.h>
#include <string.h>

#include "server/session/auth.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/store/psd.h"
#include "server/answer/reply.h"
#include "server/session/session.h"

/* A hello waiting for the answer to its challenge. */
typedef struct srv_auth {
    ps_msg hello;                      /* as received; layout points to *layout */
    ps_layout *layout;                 /* a copy of its layout (workers); NULL for admins */
    uint8_t nonce[PS_AUTH_NONCE_LEN];  /* the challenge sent */
} srv_auth;

int srv_auth_load(psd *s, char *err, size_t errlen)
{
    int rc;
    /* admin_token_file without token_file: refused by srv_config_check */
    if (!s->cfg.token_file[0])
        return 0;
    if (ps_auth_init() != 0) {
        snprintf(err, errlen, "libsodium cannot start; no authentication is possible");
        return PS_EIO;
    }
    rc = ps_token_load(s->cfg.token_file, &s->token, err, errlen);
    if (rc == 0 && s->cfg.admin_token_file[0])
        rc = ps_token_load(s->cfg.admin_token_file, &s->admin_token, err, errlen);
    if (rc == 0 && s->admin_token.len == s->token.len && memcmp(s->admin_token.b, s->token.b, s->token.len) == 0) {
        snprintf(err, errlen, "admin_token_file and token_file hold the same secret; give admins their own, or "
                              "leave admin_token_file empty");
        rc = PS_EINVAL;
    }
    if (rc != 0) {
        ps_token_clear(&s->token);
        ps_token_clear(&s->admin_token);
    }
    return rc;
}

void srv_auth_free(srv_conn *c)
{
    if (!c->auth)
        return;
    if (!c->close_after_write && !c->srv->stopping) /* else psd said why it closes */
        PS_LOG(PS_LOG_INFO, "conn %llu (%s): closed without answering psd's challenge (a client without "
                            "--token-file?)",
               (unsigned long long)c->cid, c->addr);
    free(c->auth->layout);
    free(c->auth);
    c->auth = NULL;
}

int srv_auth_challenge(srv_conn *c, ps_msg *m, char *err, size_t errlen)
{
    srv_auth *a = calloc(1, sizeof *a);
    if (a && (m->has & PS_F_LAYOUT)) {
        a->layout = malloc(sizeof *a->layout);
        if (a->layout)
            *a->layout = *m->layout; /* m's points into psd's decode scratch */
        else
            free(a), a = NULL;
    }
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return PS_ENOMEM;
    }
    a->hello = *m;
    a->hello.layout = a->layout;
    /* nothing else of a hello points into the frame, which goes now */
    a->hello.data = NULL, a->hello.ndata = 0, a->hello.text = NULL, a->hello.text_len = 0;
    a->hello.body = NULL, a->hello.nargs = 0;
    a->hello.leader = (ps_str){0}, a->hello.nreplicas = 0, a->hello.has2 &= ~(PS_F2_LEADER | PS_F2_REPLICAS);
    a->hello.pmap.n = 0; /* its addresses point into the frame: that it came is what counts */
    ps_auth_random(a->nonce, sizeof a->nonce);
    c->auth = a;

    ps_msg r;
    ps_msg_init(&r, PS_MSG_CHALLENGE);
    r.has = PS_F_ID | PS_F_NONCE;
    r.id = m->id;
    memcpy(r.nonce, a->nonce, sizeof r.nonce);
    PS_LOG(PS_LOG_DEBUG, "conn %llu (%s): challenge for a %s hello", (unsigned long long)c->cid, c->addr,
           ps_role_name(m->role));
    srv_send(c, &r, NULL);
    return 0;
}

int srv_auth_answer(srv_conn *c, ps_msg *m, char *err, size_t errlen)
{
    psd *s = c->srv;
    srv_auth *a = c->auth;
    const ps_token *key = &s->token;
    int readonly = 0;
    uint8_t want[PS_AUTH_MAC_LEN], sproof[PS_AUTH_MAC_LEN];

    if (a->hello.role == PS_ROLE_ADMIN) {
        if (s->admin_token.len)
            key = &s->admin_token;
        else
            readonly = 1; /* no admin secret: the workers' one, for reading */
    }
    ps_auth_client_proof(key->b, key->len, a->nonce, m->cnonce, &a->hello, want);
    if (!ps_auth_mac_equal(want, m->proof)) {
        snprintf(err, errlen,
                 "authentication failed for role %s: wrong token (the proof does not match psd's %s; check "
                 "--token-file)",
                 ps_role_name(a->hello.role), key == &s->admin_token ? "admin_token_file" : "token_file");
        return PS_EAUTH;
    }
    ps_auth_server_proof(key->b, key->len, m->cnonce, a->nonce, sproof);
    c->admin_readonly = readonly;
    PS_LOG(PS_LOG_DEBUG, "conn %llu (%s): authenticated as %s%s", (unsigned long long)c->cid, c->addr,
           ps_role_name(a->hello.role), readonly ? " (read-only: no admin_token_file)" : "");
    ps_msg hello = a->hello;
    hello.id = m->id; /* WELCOME answers this AUTH */
    c->auth = NULL;   /* a is ours now: accepting may close c */
    int rc = srv_hello_accept(c, &hello, sproof, err, errlen);
    free(a->layout); /* only now: hello.layout is a->layout */
    free(a);
    return rc;
}
