/* notify.h - psd and its service manager: systemd's notification protocol
 * (Type=notify units). psd says READY=1 once it listens, keeps a one-line
 * STATUS= current, pets the watchdog (WatchdogSec=) from its tick, and
 * announces RELOADING=1 and STOPPING=1.
 *
 * Built on libsystemd's sd_notify() when psd is built with libsystemd
 * (PSD_HAVE_LIBSYSTEMD); otherwise every function does nothing. Without
 * $NOTIFY_SOCKET (psd not started by systemd) sd_notify() does nothing
 * either, so psd calls these unconditionally. */
#ifndef SRV_NOTIFY_H
#define SRV_NOTIFY_H

#include <stdint.h>

#include "server/store/psd.h"

/* Reads the watchdog interval ($WATCHDOG_USEC, for this pid) and sends
 * READY=1 with the first STATUS=. Call once psd listens (and again after a
 * reload). */
void srv_notify_ready(psd *s);

/* From the tick: WATCHDOG=1 every half watchdog interval, and STATUS= when
 * the status line has changed (at most once a second). */
void srv_notify_tick(psd *s, uint64_t now_ms);

/* RELOADING=1 (a SIGHUP reload starts; srv_notify_ready() ends it). */
void srv_notify_reloading(psd *s);

/* STOPPING=1 with a last STATUS= saying why. */
void srv_notify_stopping(psd *s, const char *why);

#endif
