/* psctl.h - what psctl's files share (psctl.c the commands and main,
 * session.c talking to psd, print.c the output, save.c the safetensors
 * file): exit codes, the session with one psd, and their functions. */
#ifndef PSCTL_H
#define PSCTL_H

#include <stdint.h>
#include <stdio.h>

#include "common/auth.h"
#include "common/client.h"

enum { EXIT_OK = 0, EXIT_REMOTE = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_TIMEOUT = 4, EXIT_LOCAL = 5 };

/* ---- session.c: talking to psd ---- */

typedef struct session {
    ps_client c;
    int timeout;
    ps_token token;     /* the secret, when psd requires one (len 0: none) */
    ps_layout layout;   /* from the WELCOME, when psd has one */
    int has_layout;
    char mode[16];
    uint64_t fp;
} session;

/* The exit code for a client error code rc (0: EXIT_OK). */
int psctl_exit_code(int rc);
/* One line on stderr for a failed exchange with psd; returns its exit code. */
int psctl_report(ps_client *c, int rc, int timeout);
/* Connects ss->c to server and says hello as an admin (ss->timeout and
 * ss->token set); the layout and mode from the WELCOME. 0 or a PS_E* code. */
int psctl_open(session *ss, const char *server);
/* Sends ADMIN cmd with args and waits for its OK. 0 or a PS_E* code (the
 * reason in ss->c's error). */
int psctl_admin(session *ss, const char *cmd, char **args, int nargs, ps_msg *r);
/* Sends a request of type `type` (no fields) and checks the reply is of
 * type `want`; an exit code, the reason on stderr. */
int psctl_ask(session *ss, uint32_t type, uint32_t want, const char *what, ps_msg *r);

/* ---- print.c: output ---- */

/* map[key] as a number (NAN when absent or not a number), as text ("-"
 * when absent) into buf, as a flag (1 for true). */
double psctl_num(const msgpack_object *map, const char *key);
const char *psctl_str(const msgpack_object *map, const char *key, char *buf, size_t len);
/* Writes o as JSON (common/json.c), or s[0..n) as a JSON string, to f. */
void psctl_json(FILE *f, const msgpack_object *o);
void psctl_json_string(FILE *f, const char *s, size_t n);
/* `psctl status` and `psctl workers` for people, from STATUS's body. */
void psctl_print_status(const msgpack_object *b);
void psctl_print_workers(const msgpack_object *b);

/* ---- save.c: the model as a safetensors file ---- */

/* psctl save PATH from the one psd of ss (open), which is at server. An
 * exit code; the reason on stderr. */
int psctl_save(session *ss, const char *server, const char *path, int as_json);
/* psctl save PATH from a model split over the n psd at list (sessions ss
 * opened here). An exit code; the reason on stderr. */
int psctl_save_parts(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout, const char *path,
                     int as_json);

#endif
