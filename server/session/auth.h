/* auth.h - the token challenge-response (auth.c). */
#ifndef SRV_SESSION_AUTH_H
#define SRV_SESSION_AUTH_H

#include "server/store/psd.h"

/* Reads token_file and admin_token_file into s->token and s->admin_token
 * (that the second needs the first is srv_config_check's). Returns 0, or a
 * negative PS_E* code with a message in err. */
int srv_auth_load(psd *s, char *err, size_t errlen);
/* psd requires a token: keeps hello m and answers CHALLENGE. Returns 0,
 * or PS_ENOMEM with err filled and nothing sent. */
int srv_auth_challenge(srv_conn *c, ps_msg *m, char *err, size_t errlen);
/* AUTH m answers c's challenge: verifies it and accepts the kept hello
 * (srv_hello_accept), returning 0; or returns PS_EAUTH, or the hello's
 * refusal, with err filled and nothing sent (the caller ends the
 * connection with that ERROR). */
int srv_auth_answer(srv_conn *c, ps_msg *m, char *err, size_t errlen);
/* Drops what c keeps for a challenge (when it closes). */
void srv_auth_free(srv_conn *c);

#endif
