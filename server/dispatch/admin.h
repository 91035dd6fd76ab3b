/* admin.h - psd under an operator's hand while it runs: the ADMIN message
 * (psctl set, pause, resume, pin, unpin, checkpoint, shutdown) and the
 * configuration reload that SIGHUP and `psctl set` share. */
#ifndef SRV_ADMIN_H
#define SRV_ADMIN_H

#include <stddef.h>

#include "server/store/psd.h"
#include "server/dispatch/repl.h"

/* Handles one ADMIN message from an admin connection c: queues exactly one
 * reply (OK with a `text` for people, or ERROR), except for `checkpoint`,
 * whose reply is queued by srv_admin_tick() once the checkpoint is written
 * or has failed, or by a `reset` (ERROR STATE when it comes first) or
 * srv_admin_stop(). The caller has checked that c is an admin. */
void srv_handle_admin(srv_conn *c, ps_msg *m);

/* 1 when the ADMIN command named cmd only reads (its row in admin.c's
 * table says so), so that an admin which proved the workers' token may
 * send it; 0 for the others and for names that are no command. */
int srv_admin_reads(const char *cmd);

/* What an admin that proved only the workers' token may still do, for its
 * refusals: "status, metrics and the admin commands history, ..." (the
 * commands whose row says they only read). */
const char *srv_admin_readable(void);

/* Answers `checkpoint` requests whose checkpoint is now written (or
 * failed), and starts the one they wait for when the pool was busy with an
 * older one. Called from psd's 250 ms tick. */
void srv_admin_tick(psd *s);

/* psd stops: every `checkpoint` request still waiting is answered now, OK
 * when its checkpoint is written, else ERROR SHUTDOWN (the connections
 * close next). Called before the connections are shut. */
void srv_admin_stop(psd *s);

/* 1 when the connection numbered cid waits for a `checkpoint` reply. */
int srv_admin_waiting(psd *s, uint64_t cid);

/* Drops every pending `checkpoint` request without a reply (at exit). */
void srv_admin_free(psd *s);

/* Makes next the running configuration, as far as it may change at run
 * time. next must have passed srv_config_check (SRV_CHECK_RUN). Every
 * option with an apply hook (config.h) that differs is copied into s->cfg;
 * then each distinct hook of those options runs once (the optimizer takes
 * its settings again, the policy is told, the log level is set; options
 * read where they are used need nothing) and the changes are logged
 * ("<origin>: lr: 0.05 -> 0.01"). An option that differs and has no apply
 * hook is only logged as needing a restart, and s->cfg keeps its value.
 * summary (may be NULL) receives the changes as "lr: 0.05 -> 0.01,
 * clip_norm: 0 -> 5", or "no change". Returns the number of options
 * changed; or, when a hook refuses, a negative PS_E* code with the reason
 * in summary, s->cfg back as it was and the hooks that ran run again on
 * it. */
int srv_config_apply(psd *s, const ps_config *next, const char *origin, char *summary, size_t len);

/* SIGHUP: reads the configuration file again (defaults, then the file, then
 * the command line's settings, which still win) and applies it with
 * srv_config_apply(). A file that cannot be read, has a bad line or fails
 * the cross-check (srv_config_check) is logged and nothing changes.
 * Returns 0 or a negative PS_E* code. */
int srv_reload(psd *s);

#endif
