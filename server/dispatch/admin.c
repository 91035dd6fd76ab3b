/* admin.c - run-time control of psd: the ADMIN commands psctl sends (set,
 * pause, resume, pin, unpin, checkpoint, shutdown, history, reset), one
 * table of them with which only read, and the configuration reload that
 * SIGHUP and `psctl set` share (srv_config_apply). */
#include "server/dispatch/admin.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/report/checkpoint.h"
#include "common/log.h"
#include "server/report/dashboard.h"
#include "server/report/notify.h"
#include "server/policy/policy.h"
#include "proto/errors.h"
#include "server/answer/reply.h"
#include "server/dispatch/move_cmd.h"
#include "server/dispatch/repl.h"
#include "server/session/session.h"

/* A `checkpoint` request waiting for its checkpoint. The connection is named
 * by its number, so a connection that closes meanwhile is simply not found. */
typedef struct srv_ckpt_wait {
    uint64_t cid;                 /* srv_conn.cid of the requester */
    uint64_t id;                  /* request id to answer */
    uint64_t version;             /* answered once a checkpoint >= this is written */
    uint64_t failures;            /* checkpoint_failures when it was asked */
    uint64_t tables_stamp;        /* ... and holding the tables as they were then
                                   * (a table push changes no version in asgd) */
    struct srv_ckpt_wait *next;
} srv_ckpt_wait;

static int ckpt_waits_answer(psd *s, int code, const char *why);

/* ---- configuration ---------------------------------------------------------- */

/* Appends "name: was -> now" to the summary, ", "-separated. */
static void append_change(char *buf, size_t len, const char *name, const char *was, const char *now)
{
    if (!buf || len == 0)
        return;
    size_t used = strlen(buf);
    if (used >= len - 1)
        return;
    snprintf(buf + used, len - used, "%s%s: %s -> %s", used ? ", " : "", name, was, now);
}

int srv_config_apply(psd *s, const ps_config *next, const char *origin, char *summary, size_t len)
{
    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    char was[PS_CONFIG_VALUE_MAX], now[PS_CONFIG_VALUE_MAX], err[600] = "";
    ps_config_apply_fn hooks[64];
    size_t nhooks = 0;
    int changed = 0;

    if (summary && len)
        summary[0] = '\0';
    if (s->model.initialized && srv_optim_settings_differ(&s->cfg, next)) {
        char why[96];
        snprintf(why, sizeof why, "before %s changes the optimizer's settings", origin);
        if (!srv_checkpoint_at_rest(s, why))
            PS_LOG(PS_LOG_WARN, "%s: no checkpoint of version %llu before the optimizer's settings change: one is "
                                "being written or an update is running",
                   origin, (unsigned long long)s->model.version);
    }
    ps_config old = s->cfg;
    for (size_t i = 0; i < n; i++) {
        const ps_config_option *o = &opts[i];
        if (!ps_config_differs(&s->cfg, next, o))
            continue;
        ps_config_format(&s->cfg, o, was, sizeof was);
        ps_config_format(next, o, now, sizeof now);
        if (!ps_config_reloadable(o)) {
            PS_LOG(PS_LOG_WARN, "%s: %s: '%s' -> '%s' needs a restart; psd keeps '%s' until then", origin, o->name,
                   was, now, was);
            continue;
        }
        memcpy((char *)&s->cfg + o->offset, (const char *)next + o->offset, o->size);
        changed++;
        size_t k = 0;
        while (k < nhooks && hooks[k] != o->apply)
            k++;
        if (k == nhooks) {
            assert(nhooks < sizeof hooks / sizeof hooks[0]);
            hooks[nhooks++] = o->apply;
        }
    }
    /* each hook once, after every new value is in place */
    int tell_policy = 0;
    for (size_t k = 0; k < nhooks; k++) {
        int rc = hooks[k](s, err, sizeof err);
        if (rc >= 0) {
            tell_policy |= rc == PS_CONFIG_TELL_POLICY;
            continue;
        }
        PS_LOG(PS_LOG_ERROR, "%s refused, psd keeps its settings: %s", origin, err);
        s->cfg = old;
        for (size_t j = 0; j <= k; j++) {
            char ignored[64];
            hooks[j](s, ignored, sizeof ignored);
        }
        if (summary && len)
            snprintf(summary, len, "%s", err);
        return rc;
    }
    if (tell_policy && s->policy && s->policy->reconfigured)
        s->policy->reconfigured(s); /* e.g. DC-ASGD off: its snapshots go */
    for (size_t i = 0; i < n; i++) {
        const ps_config_option *o = &opts[i];
        if (!ps_config_reloadable(o) || !ps_config_differs(&old, &s->cfg, o))
            continue;
        ps_config_format(&old, o, was, sizeof was);
        ps_config_format(&s->cfg, o, now, sizeof now);
        PS_LOG(PS_LOG_INFO, "%s: %s: %s -> %s", origin, o->name, was, now);
        append_change(summary, len, o->name, was, now);
    }
    if (summary && len && !summary[0])
        snprintf(summary, len, "no change");
    return changed;
}

int srv_reload(psd *s)
{
    char err[1200];
    ps_config next;

    if (!s->config_path[0]) {
        PS_LOG(PS_LOG_WARN, "reload: psd was started without --config; there is no file to read again");
        return PS_EINVAL;
    }
    srv_notify_reloading(s);
    ps_config_defaults(&next);
    int rc = ps_config_load(&next, s->config_path, err, sizeof err);
    for (int i = 0; rc == 0 && i < s->ncli_sets; i++)
        rc = ps_config_set(&next, s->cli_sets[i].key, s->cli_sets[i].value, err, sizeof err);
    if (rc == 0)
        rc = srv_config_check(&next, SRV_CHECK_RUN, NULL, err, sizeof err);
    if (rc != 0) {
        PS_LOG(PS_LOG_ERROR, "reload refused, psd keeps its settings: %s", err);
    } else {
        int changed = srv_config_apply(s, &next, "reload", NULL, 0);
        if (changed >= 0)
            PS_LOG(PS_LOG_INFO, "reload of %s: %d setting%s changed", s->config_path, changed,
                   changed == 1 ? "" : "s");
        else
            rc = changed;
    }
    srv_notify_ready(s);
    return rc;
}

/* ---- commands ------------------------------------------------------------------ */

/* The reloadable option names, ", "-separated, for messages. */
static void reloadable_names(char *buf, size_t len)
{
    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!ps_config_reloadable(&opts[i]))
            continue;
        size_t used = strlen(buf);
        snprintf(buf + used, len - used, "%s%s", used ? ", " : "", opts[i].name);
    }
}

/* set KEY=VALUE...: all or nothing. */
static void cmd_set(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    ps_config next = s->cfg;
    char key[128], value[PS_ARG_MAX + 1], err[600], names[600], summary[1024];

    if (m->nargs == 0) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "set: give at least one KEY=VALUE");
        return;
    }
    for (uint32_t i = 0; i < m->nargs; i++) {
        const ps_str *a = &m->args[i];
        const char *eq = memchr(a->p, '=', a->len);
        size_t klen = eq ? (size_t)(eq - a->p) : 0;
        if (!eq || klen == 0 || klen >= sizeof key) {
            srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "set: '%.*s' is not KEY=VALUE", (int)(a->len > 80 ? 80 : a->len),
                           a->p);
            return;
        }
        memcpy(key, a->p, klen);
        key[klen] = '\0';
        size_t vlen = a->len - klen - 1;
        memcpy(value, eq + 1, vlen);
        value[vlen] = '\0';
        const ps_config_option *o = ps_config_find(key);
        if (o && !ps_config_reloadable(o)) {
            reloadable_names(names, sizeof names);
            srv_send_error(c, m->id, PS_EBAD_FIELD, 0,
                           "set: %s cannot change while psd runs; change it in the configuration file and restart "
                           "psd (run-time settings: %s)",
                           o->name, names);
            return;
        }
        if (ps_config_set(&next, key, value, err, sizeof err) != 0) {
            srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "set: %s", err);
            return;
        }
    }
    if (srv_config_check(&next, SRV_CHECK_RUN, NULL, err, sizeof err) != 0) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "set: %s", err);
        return;
    }
    if (srv_config_apply(s, &next, "psctl set", summary, sizeof summary) < 0) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "set: %s", summary);
        return;
    }
    srv_send_ok_text(c, m->id, summary);
}

static void cmd_pause(srv_conn *c, ps_msg *m, int pause)
{
    psd *s = c->srv;
    if (s->paused == pause) {
        srv_send_ok_text(c, m->id, pause ? "already paused" : "not paused");
        return;
    }
    s->paused = pause;
    srv_dash_notice(s); /* a pause and resume within a tick are two events */
    PS_LOG(PS_LOG_INFO, "%s by admin %s at model version %llu%s", pause ? "paused" : "resumed", c->addr,
           (unsigned long long)s->model.version,
           pause ? ": workers' pulls wait until resume; pushes already sent are applied" : "");
    if (!pause)
        srv_answer_parked(s);
    else
        srv_checkpoint_at_rest(s, "psd is paused"); /* pushes applied later: the tick writes them too */
    srv_send_ok_text(c, m->id, pause ? "paused" : "resumed");
}

/* history [json|csv|table]: what the dashboard shows, as text. */
static void cmd_history(srv_conn *c, ps_msg *m)
{
    char err[160];
    ps_buf text = {0};
    int rc = srv_dash_history_text(c->srv, m, &text, err, sizeof err);
    if (rc != 0) {
        srv_send_error(c, m->id, rc, 0, "%s", err);
        return;
    }
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER | PS_F_TEXT;
    r.id = m->id;
    r.mver = c->srv->model.version;
    r.text = (const char *)text.p;
    r.text_len = (uint32_t)text.len;
    srv_send(c, &r, NULL);
    ps_buf_free(&text);
}

/* pin: this connection's pulls are answered from the current snapshot until
 * unpin or the connection closes, so a client can read a big model in
 * chunks that all belong to one version. */
static void cmd_pin(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    char text[64];
    if (!s->model.initialized) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "pin: the model has no values yet");
        return;
    }
    srv_snap *base = s->policy->round_base ? s->policy->round_base(s) : NULL;
    srv_snap *snap = base ? srv_snap_ref(base) : srv_snap_take(&s->model); /* one version, not a round's pieces */
    if (!snap) {
        srv_send_error(c, m->id, PS_ENOMEM, 0, "pin: out of memory");
        return;
    }
    srv_snap_unref(c->pinned);
    c->pinned = snap;
    snprintf(text, sizeof text, "pinned version %llu", (unsigned long long)c->pinned->version);
    ps_msg r;
    ps_msg_init(&r, PS_MSG_OK);
    r.has = PS_F_ID | PS_F_MVER | PS_F_TEXT;
    r.id = m->id;
    r.mver = c->pinned->version; /* the version pulls will get */
    r.text = text;
    r.text_len = (uint32_t)strlen(text);
    srv_send(c, &r, NULL);
}

static void cmd_checkpoint(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    if (!s->cfg.state_dir[0]) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "checkpoint: psd keeps no checkpoints; start it with --state-dir DIR (or state_dir in its "
                       "configuration file)");
        return;
    }
    if (!srv_checkpoint_has_state(s)) {
        srv_send_error(c, m->id, PS_ENOT_READY, 0, "checkpoint: the model has no values yet");
        return;
    }
    srv_ckpt_wait *w = malloc(sizeof *w);
    if (!w) {
        srv_send_error(c, m->id, PS_ENOMEM, 0, "checkpoint: out of memory");
        return;
    }
    *w = (srv_ckpt_wait){.cid = c->cid, .id = m->id, .version = s->model.version,
                         .failures = s->stats.checkpoint_failures, .tables_stamp = s->tables.stamp,
                         .next = s->ckpt_waits};
    s->ckpt_waits = w;
    PS_LOG(PS_LOG_INFO, "checkpoint of version %llu asked for by admin %s", (unsigned long long)w->version, c->addr);
    srv_checkpoint_start(s, 1); /* no-op while one is being written; the tick retries */
}

/* reset [force]: start fresh. The state dir's checkpoints are set aside (as
 * psd --fresh does) and the model dropped with everything that belongs to
 * its job (the policy's state, the workers' records, where the model came
 * from), so the next worker to connect proposes the layout and
 * initialises it. Refused while workers are connected (they would go on
 * training a model psd no longer holds) unless forced: then each is told
 * with an ERROR (STATE: not one to retry) and disconnected. Refused while
 * a checkpoint is being written, which would put the old model back. */
static void cmd_reset(srv_conn *c, ps_msg *m)
{
    psd *s = c->srv;
    int force = m->nargs == 1 && m->args[0].len == 5 && memcmp(m->args[0].p, "force", 5) == 0;
    if (m->nargs > 1 || (m->nargs == 1 && !force)) {
        srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "reset takes no argument, or \"force\"");
        return;
    }
    char names[256] = "";
    uint32_t connected = 0;
    size_t used = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++) {
        const srv_worker *w = s->workers[i];
        if (!w || w->state != SRV_W_CONNECTED)
            continue;
        if (connected++ < 8 && used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%u/%u", used ? ", " : "", w->shard,
                                     w->nshards);
    }
    if (connected && !force) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "reset refused: %u worker%s connected (shard%s %s%s), which would go on training a model "
                       "psd no longer holds; stop %s first, or `psctl reset --force` to disconnect %s",
                       connected, connected == 1 ? " is" : "s are", connected == 1 ? "" : "s", names,
                       connected > 8 ? ", ..." : "", connected == 1 ? "it" : "them", connected == 1 ? "it" : "them");
        return;
    }
    if (s->checkpoint_busy) {
        srv_send_error(c, m->id, PS_ESTATE, 0,
                       "reset refused: a checkpoint is being written (it would put the model back in the state "
                       "dir); try again in a moment");
        return;
    }
    char aside[PS_CONFIG_PATH_MAX + 64] = "", err[PS_CONFIG_PATH_MAX * 2 + 400];
    int moved = 0;
    if (s->cfg.state_dir[0] &&
        (moved = srv_checkpoint_set_aside(s->cfg.state_dir, aside, sizeof aside, err, sizeof err)) < 0) {
        srv_send_error(c, m->id, PS_EIO, 0, "reset refused, nothing changed: %s", err);
        return;
    }
    uint64_t version = s->model.version;
    int had = s->model.has_layout;
    char why[96];
    snprintf(why, sizeof why, "model reset by admin %.60s", c->addr);
    /* each `checkpoint` request waiting gets its answer now: the written
     * ones OK (the reset has just set their file aside), the others an
     * ERROR; after the reset, a checkpoint of the next model's version
     * would answer them wrongly, or none ever would */
    char ckwhy[160];
    snprintf(ckwhy, sizeof ckwhy, "the model was reset by admin %.60s before it was written", c->addr);
    ckpt_waits_answer(s, PS_ESTATE, ckwhy);
    /* forced: the workers go, their pulls first, so that nothing answers
     * them; the model before them, so that the last one's leaving writes
     * no checkpoint of it */
    for (srv_conn *o = s->conns; o; o = o->next)
        if (o->worker && !o->closing)
            srv_pulls_drop(o);
        else if (!o->closing && o->parked) /* an admin's: answered, it waits for a version of no model */
            srv_pulls_refuse(o, PS_ESTATE, "pull not answered: the model was reset by an admin (psctl reset); "
                                           "its versions start again from 0");
    s->policy->destroy(s); /* rounds, kept gradients, DC-ASGD's snapshots: made anew */
    srv_model_release(&s->model);
    srv_plan_clear(&s->plan); /* the job's: the next worker's hello proposes one again */
    for (srv_conn *o = s->conns, *next; o; o = next) {
        next = o->next;
        if (!o->worker || o->closing)
            continue;
        srv_conn_detach(o, SRV_W_LEFT, why);
        srv_send_error(o, 0, PS_ESTATE, 1, "the model was reset by an admin (psctl reset --force): psd starts "
                                           "fresh; start the job again");
    }
    srv_workers_forget(s);
    srv_checkpoint_forget_origin(s);
    srv_stats_model_reset(s); /* the new model's first checkpoint is written */
    srv_dash_notice(s);
    char text[PS_CONFIG_PATH_MAX + 300], was[64] = "no model to drop", ckpts[PS_CONFIG_PATH_MAX + 120] = "",
                                         gone[64] = "";
    if (had)
        snprintf(was, sizeof was, "model version %llu dropped", (unsigned long long)version);
    if (moved > 0)
        snprintf(ckpts, sizeof ckpts, "; %d checkpoint file%s set aside in %s", moved, moved == 1 ? "" : "s",
                 aside);
    if (connected)
        snprintf(gone, sizeof gone, "; %u worker%s disconnected", connected, connected == 1 ? "" : "s");
    snprintf(text, sizeof text, "%s%s%s; the next worker to connect initialises the model", was, ckpts, gone);
    PS_LOG(PS_LOG_INFO, "reset by admin %s: %s", c->addr, text);
    srv_send_ok_text(c, m->id, text);
}

static void cmd_shutdown(srv_conn *c, ps_msg *m)
{
    char why[96];
    srv_send_ok_text(c, m->id, "shutting down");
    c->close_after_write = 1; /* read nothing more from it */
    snprintf(why, sizeof why, "shutdown asked for by admin %s", c->addr);
    c->srv->shutdown(c->srv, why);
}

static void cmd_pause_on(srv_conn *c, ps_msg *m)
{
    cmd_pause(c, m, 1);
}

static void cmd_resume(srv_conn *c, ps_msg *m)
{
    cmd_pause(c, m, 0);
}

static void cmd_unpin(srv_conn *c, ps_msg *m)
{
    srv_snap_unref(c->pinned);
    c->pinned = NULL;
    srv_send_ok_text(c, m->id, "unpinned");
}

/* The ADMIN commands, each declared once: its name, whether it only reads
 * (then an admin that proved the workers' token may send it, see
 * srv_admin_reads) and the function that answers it. A new command is a
 * row here (and, for psctl, one in psctl's table). */
static const struct srv_admin_command {
    const char *name;
    int reads;                              /* changes nothing in psd */
    void (*run)(srv_conn *c, ps_msg *m);    /* as srv_handle_admin */
} admin_commands[] = {
    {"set", 0, cmd_set},
    {"pause", 0, cmd_pause_on},
    {"resume", 0, cmd_resume},
    {"pin", 0, cmd_pin},
    {"unpin", 0, cmd_unpin},
    {"checkpoint", 0, cmd_checkpoint},
    {"shutdown", 0, cmd_shutdown},
    {"history", 1, cmd_history},
    {"reset", 0, cmd_reset},
};
#define NADMIN_COMMANDS (sizeof admin_commands / sizeof admin_commands[0])

static const struct srv_admin_command *admin_find(const char *name)
{
    for (size_t i = 0; i < NADMIN_COMMANDS; i++)
        if (strcmp(name, admin_commands[i].name) == 0)
            return &admin_commands[i];
    return NULL;
}

int srv_admin_reads(const char *cmd)
{
    const struct srv_admin_command *a = admin_find(cmd);
    return a && a->reads;
}

const char *srv_admin_readable(void)
{
    static char text[256];
    if (!text[0]) {
        size_t used = (size_t)snprintf(text, sizeof text, "status, metrics and the admin commands");
        const char *sep = " ";
        for (size_t i = 0; i < NADMIN_COMMANDS && used < sizeof text; i++)
            if (admin_commands[i].reads) {
                used += (size_t)snprintf(text + used, sizeof text - used, "%s%s", sep, admin_commands[i].name);
                sep = ", ";
            }
    }
    return text;
}

void srv_handle_admin(srv_conn *c, ps_msg *m)
{
    const struct srv_admin_command *a = admin_find(m->cmd);
    if (a) {
        a->run(c, m);
        return;
    }
    for (const srv_repl_command *r = srv_repl_commands; r->name; r++)
        if (strcmp(m->cmd, r->name) == 0) {
            r->run(c, m);
            return;
        }
    for (const srv_move_command *r = srv_move_commands; r->name; r++)
        if (strcmp(m->cmd, r->name) == 0) {
            r->run(c, m);
            return;
        }
    char known[256] = "";
    for (size_t i = 0, used = 0; i < NADMIN_COMMANDS && used < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", admin_commands[i].name);
    srv_send_error(c, m->id, PS_EBAD_FIELD, 0, "unknown admin command '%s' (known: %s)", m->cmd, known);
}

/* ---- checkpoint requests ------------------------------------------------------- */

/* Answers the `checkpoint` requests whose checkpoint is written (OK) or
 * has failed (ERROR IO) and forgets them; with code != 0 it answers every
 * other one too, with an ERROR code saying why (a reset, a shutdown), so
 * that none is left without its one answer. Returns 1 when requests still
 * wait (code 0 only). */
static int ckpt_waits_answer(psd *s, int code, const char *why)
{
    srv_ckpt_wait **pp = &s->ckpt_waits;
    int waiting = 0;
    while (*pp) {
        srv_ckpt_wait *w = *pp;
        srv_conn *c = srv_conn_by_cid(s, w->cid);
        int done = s->stats.checkpoint_ms && s->stats.checkpoint_version >= w->version &&
                   s->stats.checkpoint_tables_stamp >= w->tables_stamp;
        int failed = !done && s->stats.checkpoint_failures > w->failures && !s->checkpoint_busy;
        if (c && !done && !failed && !code) {
            waiting = 1;
            pp = &w->next;
            continue;
        }
        if (c)
            c->last_msg_ms = srv_now_ms(); /* its idleness counts from the answer */
        if (c && done) {
            char text[PS_CONFIG_PATH_MAX + 64];
            snprintf(text, sizeof text, "checkpoint of version %llu written to %s",
                     (unsigned long long)s->stats.checkpoint_version, s->cfg.state_dir);
            srv_send_ok_text(c, w->id, text);
        } else if (c && failed) {
            srv_send_error(c, w->id, PS_EIO, 0, "checkpoint of version %llu failed: %s",
                           (unsigned long long)w->version,
                           s->stats.checkpoint_error[0] ? s->stats.checkpoint_error : "see psd's log");
        } else if (c) {
            srv_send_error(c, w->id, code, 0, "checkpoint of version %llu not written: %s",
                           (unsigned long long)w->version, why);
        }
        *pp = w->next;
        free(w);
    }
    return waiting;
}

void srv_admin_tick(psd *s)
{
    if (ckpt_waits_answer(s, 0, NULL) && !s->checkpoint_busy)
        srv_checkpoint_start(s, 1);
}

void srv_admin_stop(psd *s)
{
    ckpt_waits_answer(s, PS_ESHUTDOWN, "psd is shutting down (it writes a last checkpoint as it exits)");
}

int srv_admin_waiting(psd *s, uint64_t cid)
{
    for (srv_ckpt_wait *w = s->ckpt_waits; w; w = w->next)
        if (w->cid == cid)
            return 1;
    return 0;
}

void srv_admin_free(psd *s)
{
    while (s->ckpt_waits) {
        srv_ckpt_wait *w = s->ckpt_waits;
        s->ckpt_waits = w->next;
        free(w);
    }
}
