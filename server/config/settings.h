/* settings.h - the settings' cross-check and the checks at start (settings.c);
 * the option table's own hooks are in config.h. */
#ifndef SRV_CONFIG_SETTINGS_H
#define SRV_CONFIG_SETTINGS_H

#include "server/store/psd.h"

/* When srv_config_check (policy.h) runs: what it may look at beyond the settings. */
typedef enum srv_check_when {
    SRV_CHECK_START,  /* psd starting: listen's host name must resolve */
    SRV_CHECK_PRINT,  /* --print-config: a host name that does not resolve here passes
                       * (it may be meant for another machine) */
    SRV_CHECK_RUN,    /* a reload or `psctl set` while psd runs: listen is not
                       * resolved again (it cannot change at run time) */
} srv_check_when;

/* The settings' cross-check below the mode: what depends on more than one
 * option or on more than an option's syntax, whatever the mode (what the
 * mode needs is its policy's check; srv_config_check, policy.h, runs both).
 * metrics_listen an IPv4 or IPv6 address (parsed here, handed back in out);
 * nonfinite = clip needs clip_norm > 0; nesterov needs momentum >
 * 0 with sgd; admin_token_file needs token_file; protected mode: without
 * token_file and allow_remote_without_token, listen and metrics_listen
 * must be loopback addresses. The same at start, by --print-config, at a
 * reload and on `psctl set` (when says which). Looks at no file: the token
 * files and state_dir are read at start only (srv_auth_load,
 * srv_state_dir_check). Returns 0, filling out (may be NULL), or PS_EINVAL
 * with a message in err and out untouched. */
int srv_settings_check(const ps_config *c, srv_check_when when, srv_settings *out, char *err, size_t len);

/* Checks that psd can write checkpoints to dir ("" passes): a directory
 * it can create a file in, created when missing. At start, before anything
 * else, so that a bad state_dir stops psd at once and not at its first
 * checkpoint (not by --print-config, which checks settings, not this
 * machine's files). Returns 0 or PS_EIO with a message in err. */
int srv_state_dir_check(const char *dir, char *err, size_t len);

/* The address to listen on for host (an IPv4 or IPv6 literal, or a host
 * name resolved with getaddrinfo: its first IPv4 address, else its first
 * IPv6 one) and port: 0, or PS_EINVAL with the reason in err. */
int srv_listen_resolve(const char *host, int port, struct sockaddr_storage *out, char *err, size_t len);

/* 1 when a is an address of this machine only: 127.0.0.0/8, ::1,
 * ::ffff:127.x.y.z. */
int srv_addr_is_loopback(const struct sockaddr_storage *a);

/* a's address as text (no port). */
void srv_addr_name(const struct sockaddr_storage *a, char *buf, size_t len);

#endif
