/* psctl.h - what psctl's files share (psctl.c the options and main, commands.c the commands,
 * session.c talking to psd, print.c the output, save.c the safetensors
 * file): exit codes, the session with one psd, and their functions. */
#ifndef PSCTL_H
#define PSCTL_H

#include <stdint.h>
#include <stdio.h>

#include "common/auth.h"
#include "common/conn.h"

enum { EXIT_OK = 0, EXIT_REMOTE = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_TIMEOUT = 4, EXIT_LOCAL = 5 };

/* ---- commands.c: the command table ---- */

struct session;
struct psctl_command;

/* One command as asked for: its row, the psd it goes to, its arguments and
 * the options that shape its output. */
typedef struct psctl_call {
    const struct psctl_command *cmd;
    const char *server; /* HOST:PORT of this psd */
    char **args;
    int nargs;
    int as_json, csv, force;
} psctl_call;

enum {
    PSCTL_READS = 1 << 0,  /* only reads: psd allows it with the workers' token */
    PSCTL_TEXT = 1 << 1,   /* prints psd's text as it is: no --json */
    PSCTL_CSV = 1 << 2,    /* --csv applies */
    PSCTL_FORCE = 1 << 3,  /* --force applies */
    PSCTL_NO_BYE = 1 << 4, /* psd closes the connection itself after its answer */
    PSCTL_PARTS = 1 << 5,  /* runs through run_parts with one psd too (it talks to several) */
};

typedef struct psctl_command {
    const char *name;
    const char *args;       /* for the usage line: " PATH" */
    int min_args, max_args;
    int flags;              /* PSCTL_* */
    int timeout_ms;         /* its default --timeout; 0: the common default */
    /* Runs the command against one psd (ss opened); an exit code, the
     * reason on stderr. */
    int (*run)(struct session *ss, const psctl_call *k);
    /* Checks the arguments beyond their count (NULL: none); an exit code,
     * the reason on stderr. */
    int (*check)(char **args, int nargs);
    /* For a model split over the n psd at list: runs the command once for
     * them all (sessions ss[0..n) opened here); NULL: run goes to each psd
     * in turn. An exit code. */
    int (*run_parts)(struct session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout,
                     const psctl_call *k);
    const char *help;       /* one paragraph, wrapped by the usage */
    const char *doc;        /* its row of docs/running.md's table (Markdown): psctl --commands-markdown */
} psctl_command;

#define PSCTL_USAGE_WIDTH 80

/* The table, and its row named `name` (NULL: none). */
const psctl_command *psctl_commands(size_t *n);
const psctl_command *psctl_command_find(const char *name);
/* The commands' part of `psctl --help`, from the table. */
void psctl_commands_usage(FILE *f);
/* The table of commands in docs/running.md, from the table (psctl
 * --commands-markdown; test_psctl_commands checks the docs hold it). */
void psctl_commands_markdown(FILE *f);
/* Writes `left`, then `text` wrapped to PSCTL_USAGE_WIDTH columns, every
 * line of it starting at column indent (a new line first when left is
 * longer). */
void psctl_wrap(FILE *f, const char *left, int indent, const char *text);
/* The one-line error for an unknown command name: the near name, if one
 * is, and every command. */
void psctl_unknown_command(FILE *f, const char *name);
/* Checks a call of cmd against its row (argument count and form, options
 * that do not apply); an exit code, the reason on stderr. */
int psctl_command_check(const psctl_command *cmd, char **args, int nargs, int as_json, int csv, int force);
/* Opens ss (ps_conn initialised, timeout and token set) to k->server,
 * runs k->cmd there and says BYE; an exit code. */
int psctl_command_run(const psctl_call *k, struct session *ss);

/* ---- session.c: talking to psd ---- */

typedef struct session {
    ps_conn c;
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
int psctl_report(ps_conn *c, int rc, int timeout);
/* Connects ss->c to server and says hello as an admin (ss->timeout and
 * ss->token set); the layout and mode from the WELCOME. 0 or a PS_E* code. */
int psctl_open(session *ss, const char *server);
/* A part given as its replicas, "HOST:PORT/HOST:PORT/...": asks each in
 * turn for its status and writes the one that leads over entry (len
 * bytes). An entry without '/' is left as it is. An exit code; when none
 * leads, one line on stderr saying what each one is. */
int psctl_pick_leader(session *ss, char *entry, size_t len);
/* Sends ADMIN cmd with args and waits for its OK. 0 or a PS_E* code (the
 * reason in ss->c's error). */
int psctl_admin(session *ss, const char *cmd, char **args, int nargs, ps_msg *r);
/* Sends a request of type `type` (no fields) and checks the reply is of
 * type `want`; an exit code, the reason on stderr. */
int psctl_ask(session *ss, uint32_t type, uint32_t want, const char *what, ps_msg *r);

/* ---- parts.c: moving a job's parts ---- */

/* psctl parts add HOST:PORT [RATE] | remove [RATE] for the job whose parts
 * are list[0..n), in the order of its newest map. An exit code. */
int psctl_parts(session *ss, char (*list)[300], uint32_t n, const ps_token *token, int timeout, const psctl_call *k);
/* Its arguments' check (the command table's). */
int psctl_parts_check(char **args, int nargs);

/* ---- print.c: output ---- */

/* map[key] as a number (NAN when absent or not a number), as text ("-"
 * when absent) into buf, as a flag (1 for true). */
double psctl_num(const msgpack_object *map, const char *key);
const char *psctl_str(const msgpack_object *map, const char *key, char *buf, size_t len);
int psctl_flag(const msgpack_object *map, const char *key);
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
