/* session.c - psctl's exchanges with one psd (psctl.h): the admin
 * hello, ADMIN commands, single requests, and what a failure means for the
 * exit code. Owns nothing but the session it is given. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/errors.h"
#include "psctl/psctl.h"

int psctl_exit_code(int rc)
{
    switch (rc) {
    case 0:
        return EXIT_OK;
    case PS_ETIMEOUT:
        return EXIT_TIMEOUT;
    case PS_ECONNECT:
    case PS_ECLOSED:
    case PS_EINVAL:
        return EXIT_UNREACHABLE;
    default:
        return EXIT_REMOTE;
    }
}

/* One line on stderr for a failed exchange with psd. */
int psctl_report(ps_conn *c, int rc, int timeout)
{
    if (rc == PS_ETIMEOUT)
        fprintf(stderr, "psctl: %s (nothing within %d ms; see --timeout)\n", ps_conn_error(c), timeout);
    else if (rc == PS_ECONNECT)
        fprintf(stderr, "psctl: %s (is psd running there? see --server)\n", ps_conn_error(c));
    else
        fprintf(stderr, "psctl: %s\n", ps_conn_error(c));
    return psctl_exit_code(rc);
}

int psctl_open(session *ss, const char *server)
{
    ps_msg m, r;
    int rc = ps_conn_connect(&ss->c, server, ss->timeout);
    if (rc != 0)
        return rc;
    ps_msg_init(&m, PS_MSG_HELLO);
    m.has = PS_F_VERSION | PS_F_ROLE;
    m.proto = PS_PROTO_VERSION;
    m.role = PS_ROLE_ADMIN;
    rc = ps_conn_hello(&ss->c, &m, ss->token.b, ss->token.len, &r, ss->timeout);
    if (rc != 0)
        return rc;
    snprintf(ss->mode, sizeof ss->mode, "%s", r.mode);
    if ((r.has & PS_F_LAYOUT) && r.layout) {
        ss->layout = *r.layout;
        ss->has_layout = 1;
        ss->fp = r.fp;
    }
    return 0;
}

/* Sends ADMIN cmd with args and waits for its OK. */
int psctl_admin(session *ss, const char *cmd, char **args, int nargs, ps_msg *r)
{
    int rc = ps_conn_admin(&ss->c, cmd, (const char *const *)args, (unsigned)nargs, r, ss->timeout);
    if (rc == 0 && r->type != PS_MSG_OK) {
        snprintf(ss->c.err, sizeof ss->c.err, "psd answered %s with %s", cmd, ps_msg_type_name(r->type));
        return PS_EMALFORMED;
    }
    return rc;
}

/* Sends a request of type `type` (no fields) and checks the reply is of
 * type `want`; an exit code, the reason on stderr. */
int psctl_ask(session *ss, uint32_t type, uint32_t want, const char *what, ps_msg *r)
{
    ps_msg m;
    ps_msg_init(&m, type);
    int rc = ps_conn_call(&ss->c, &m, r, ss->timeout);
    if (rc != 0)
        return psctl_report(&ss->c, rc, ss->timeout);
    if (r->type != want) {
        fprintf(stderr, "psctl: psd answered %s with %s\n", what, ps_msg_type_name(r->type));
        return EXIT_REMOTE;
    }
    return EXIT_OK;
}

/* Asks the psd at addr for its status: 1 when it leads its part (or has no
 * replicas), 0 when it follows (its leader in leader), or a PS_E* code. */
static int leads(session *ss, const char *addr, char *leader, size_t len)
{
    ps_msg m, r;
    ps_conn_init(&ss->c);
    int rc = psctl_open(ss, addr);
    if (rc == 0) {
        ps_msg_init(&m, PS_MSG_STATUS);
        rc = ps_conn_call(&ss->c, &m, &r, ss->timeout);
    }
    if (rc == 0 && r.type != PS_MSG_STATUS_REPLY)
        rc = PS_EMALFORMED;
    if (rc == 0) {
        const msgpack_object *repl = r.body ? ps_map_get(r.body, "replication") : NULL;
        char role[16];
        rc = strcmp(repl ? psctl_str(repl, "role", role, sizeof role) : "leader", "follower") != 0;
        if (!rc)
            psctl_str(repl, "leader", leader, len);
        ps_msg_init(&m, PS_MSG_BYE);
        ps_conn_send(&ss->c, &m);
    }
    return rc;
}

int psctl_pick_leader(session *ss, char *entry, size_t len)
{
    if (!strchr(entry, '/'))
        return EXIT_OK;
    char all[300], why[900] = "", leader[300];
    snprintf(all, sizeof all, "%s", entry);
    size_t used = 0;
    int reached = 0, rc = 0;
    char *save = NULL;
    for (char *addr = strtok_r(all, "/", &save); addr; addr = strtok_r(NULL, "/", &save)) {
        rc = leads(ss, addr, leader, sizeof leader);
        if (rc == 1)
            snprintf(entry, len, "%s", addr);
        else if (used < sizeof why)
            used += (size_t)snprintf(why + used, sizeof why - used, "%s%s: %s%s", used ? "; " : "", addr,
                                     rc == 0 ? "follows " : ps_conn_error(&ss->c), rc == 0 ? leader : "");
        reached += rc >= 0;
        ps_conn_close(&ss->c);
        ps_conn_free(&ss->c);
        if (rc == 1)
            return EXIT_OK;
    }
    fprintf(stderr, "psctl: none of %s leads its part (%s)\n", entry, why);
    return reached ? EXIT_REMOTE : psctl_exit_code(rc);
}
