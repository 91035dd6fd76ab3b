/* notify.c - systemd's notification protocol for psd (see notify.h). The
 * little state it keeps (watchdog interval, last status line) is static:
 * there is one psd per process and it runs on the loop thread. */
#include "server/report/notify.h"
#include "server/policy/policy.h"

#include <stdio.h>
#include <string.h>

#ifdef PSD_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>

#include "common/log.h"

static uint64_t watchdog_ms;    /* half of WATCHDOG_USEC; 0 = no watchdog */
static uint64_t last_watchdog_ms;
static uint64_t last_status_ms;
static char last_status[160];

/* One line: "asgd, model version 1234, 2/2 workers connected, 210 pushes/s". */
static void status_line(psd *s, char *buf, size_t len)
{
    uint32_t connected = 0;
    for (uint32_t i = 0; i < s->nworkers_cap; i++)
        connected += s->workers[i] && s->workers[i]->state == SRV_W_CONNECTED;
    snprintf(buf, len, "%s, model version %llu, %u/%d workers connected, %.0f pushes/s%s%s", s->policy->name,
             (unsigned long long)s->model.version, connected, s->cfg.workers, s->stats.push_rate,
             s->model.has_layout && !s->model.initialized ? ", waiting for initial values" : "",
             s->paused ? ", paused" : "");
}

void srv_notify_ready(psd *s)
{
    uint64_t usec = 0;
    char line[sizeof last_status];
    /* 0: keep $NOTIFY_SOCKET and $WATCHDOG_USEC for the next calls */
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        watchdog_ms = usec / 2000; /* ping at half the interval, as sd_watchdog_enabled(3) advises */
        if (watchdog_ms == 0)
            watchdog_ms = 1;
        PS_LOG(PS_LOG_DEBUG, "systemd watchdog: %llu ms; pinging every %llu ms", (unsigned long long)(usec / 1000),
               (unsigned long long)watchdog_ms);
    }
    status_line(s, line, sizeof line);
    snprintf(last_status, sizeof last_status, "%s", line);
    last_status_ms = last_watchdog_ms = srv_now_ms();
    int rc = sd_notifyf(0, "READY=1\nSTATUS=%s%s", line, watchdog_ms ? "\nWATCHDOG=1" : "");
    if (rc < 0)
        PS_LOG(PS_LOG_WARN, "cannot notify systemd ($NOTIFY_SOCKET): %s", strerror(-rc));
}

void srv_notify_tick(psd *s, uint64_t now_ms)
{
    if (watchdog_ms && now_ms - last_watchdog_ms >= watchdog_ms) {
        sd_notify(0, "WATCHDOG=1");
        last_watchdog_ms = now_ms;
    }
    if (now_ms - last_status_ms < 1000)
        return;
    char line[sizeof last_status];
    status_line(s, line, sizeof line);
    if (strcmp(line, last_status) != 0) {
        /* formatted here: sd_notifyf would allocate, every second of a job */
        char msg[sizeof "STATUS=" + sizeof line];
        snprintf(msg, sizeof msg, "STATUS=%s", line);
        sd_notify(0, msg);
        snprintf(last_status, sizeof last_status, "%s", line);
        last_status_ms = now_ms;
    }
}

void srv_notify_reloading(psd *s)
{
    (void)s;
    sd_notify(0, "RELOADING=1\nSTATUS=reloading the configuration");
}

void srv_notify_stopping(psd *s, const char *why)
{
    (void)s;
    sd_notifyf(0, "STOPPING=1\nSTATUS=stopping: %s", why);
}

#else /* no libsystemd: psd runs the same, without telling anyone */

void srv_notify_ready(psd *s)
{
    (void)s;
}

void srv_notify_tick(psd *s, uint64_t now_ms)
{
    (void)s, (void)now_ms;
}

void srv_notify_reloading(psd *s)
{
    (void)s;
}

void srv_notify_stopping(psd *s, const char *why)
{
    (void)s, (void)why;
}

#endif
