/* settings.c - psd's settings beyond one value's syntax: the hooks of
 * config.c's table that need psd (metrics_listen's validation, what a
 * change at run time does), and the cross-check of the settings whatever
 * the mode (srv_settings_check; srv_config_check, policy/, runs it after the
 * mode's own checks), used at start, by --print-config, at a SIGHUP reload
 * and on `psctl set`, so that psd refuses the same settings wherever they
 * come from. metrics_listen is parsed by one function here
 * (parse_metrics_listen); what the cross-check parses it hands back, so
 * nothing parses it again. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/config/settings.h"
#include "common/log.h"
#include "proto/errors.h"
#include "server/store/psd.h"

/* ---- the table's hooks ---------------------------------------------------- */

/* metrics_listen's text: "" (off), or host:port with an IPv4 or IPv6
 * literal. Fills host, port and addr (may be NULL). The one parser of it. */
static int parse_metrics_listen(const char *text, char *host, size_t hostlen, int *port,
                                struct sockaddr_storage *addr, char *err, size_t len)
{
    char perr[512], h[PS_CONFIG_HOST_MAX];
    int p;
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    if (!text[0]) {
        if (host && hostlen)
            host[0] = '\0';
        return 0;
    }
    if (ps_hostport_parse(text, h, sizeof h, &p, perr, sizeof perr) != 0) {
        snprintf(err, len, "metrics_listen: %s", perr);
        return PS_EINVAL;
    }
    if (uv_ip4_addr(h, p, (struct sockaddr_in *)&a) != 0 && uv_ip6_addr(h, p, (struct sockaddr_in6 *)&a) != 0) {
        snprintf(err, len, "metrics_listen: '%s' is not an IPv4 or IPv6 address", h);
        return PS_EINVAL;
    }
    if (host)
        snprintf(host, hostlen, "%s", h);
    if (port)
        *port = p;
    if (addr)
        *addr = a;
    return 0;
}

int srv_validate_metrics_listen(const ps_config_option *o, const char *text, void *field, char *err, size_t errlen)
{
    size_t n = strlen(text);
    if (n >= o->size) {
        snprintf(err, errlen, "%s: value is %zu bytes long, the limit is %zu", o->name, n, o->size - 1);
        return PS_EINVAL;
    }
    int rc = parse_metrics_listen(text, NULL, 0, NULL, NULL, err, errlen);
    if (rc != 0)
        return rc;
    memset(field, 0, o->size);
    memcpy(field, text, n);
    return 0;
}

int srv_apply_optimizer(psd *s, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    if (s->model.nblk) /* the optimizer exists once the model is committed */
        srv_optim_configure(&s->model.opt, &s->cfg);
    return 0;
}

int srv_apply_policy(psd *s, char *err, size_t errlen)
{
    (void)s, (void)err, (void)errlen;
    return PS_CONFIG_TELL_POLICY; /* the policy is a layer above: its caller tells it */
}

int srv_apply_log_level(psd *s, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    ps_log_set_level(s->cfg.log_level);
    return 0;
}

int srv_apply_read_when_used(psd *s, char *err, size_t errlen)
{
    (void)s, (void)err, (void)errlen;
    return 0;
}

/* ---- the cross-check --------------------------------------------------------- */

/* local SGD and elastic averaging (PROTOCOL.md section 8, "Talking less"):
 * psd applies the workers' model differences as they are, so its own
 * optimizer must be the plain arithmetic it then runs. 0, or PS_EINVAL
 * with err filled. */
static int averaging_check(const ps_config *c, char *err, size_t len)
{
    int local = c->local_steps > 0, elastic = c->elastic_alpha > 0;
    if (local && elastic) {
        snprintf(err, len, "local_steps and elastic_alpha are two ways to average: set one");
        return PS_EINVAL;
    }
    if ((local || elastic) && (c->optimizer != PS_OPTIMIZER_SGD || c->momentum > 0)) {
        snprintf(err, len, "%s averages the workers' models; psd's optimizer (%s%s) would not run: set optimizer = "
                           "sgd without momentum",
                 local ? "local_steps" : "elastic_alpha", srv_optim_kind_name(c->optimizer),
                 c->optimizer == PS_OPTIMIZER_SGD ? " with momentum" : "");
        return PS_EINVAL;
    }
    if (elastic && (c->staleness_scale || c->dc_lambda > 0)) {
        snprintf(err, len, "elastic averaging pushes model differences, not gradients: staleness_scale and dc_lambda "
                           "do not apply to them; turn them off");
        return PS_EINVAL;
    }
    return 0;
}

int srv_settings_check(const ps_config *c, srv_check_when when, srv_settings *out, char *err, size_t len)
{
    srv_settings parsed;
    memset(&parsed, 0, sizeof parsed);
    if (parse_metrics_listen(c->metrics_listen, parsed.metrics_host, sizeof parsed.metrics_host,
                             &parsed.metrics_port, &parsed.metrics_addr, err, len) != 0)
        return PS_EINVAL;
    if (c->nonfinite == PS_NONFINITE_CLIP && !(c->clip_norm > 0)) {
        snprintf(err, len, "nonfinite = clip needs clip_norm above 0: a sanitised push is scaled down to that "
                           "norm (its infinities became +-FLT_MAX)");
        return PS_EINVAL;
    }
    if (c->optimizer == PS_OPTIMIZER_SGD && c->nesterov && !(c->momentum > 0)) {
        snprintf(err, len, "nesterov = yes needs momentum above 0 (Nesterov momentum with none is plain sgd): set "
                           "momentum, or nesterov = no");
        return PS_EINVAL;
    }
    if (srv_hogwild_check(c, err, len) != 0)
        return PS_EINVAL;
    if (averaging_check(c, err, len) != 0)
        return PS_EINVAL;
    if (c->table_threads > 0 && c->table_apply != PS_TABLE_APPLY_HOGWILD) {
        snprintf(err, len, "table_threads = %d is set but table_apply = ordered applies every table push on psd's "
                           "loop, without threads: set table_apply = hogwild, or leave table_threads out",
                 c->table_threads);
        return PS_EINVAL;
    }
    if (c->admin_token_file[0] && !c->token_file[0]) {
        snprintf(err, len, "admin_token_file is set but token_file is not: set token_file too (the workers' "
                           "secret); authentication is on only with it");
        return PS_EINVAL;
    }
    /* protected mode, as Redis's: no open door without a token */
    if (parsed.metrics_host[0] && !c->token_file[0] && !c->allow_remote_without_token &&
        !srv_addr_is_loopback(&parsed.metrics_addr)) {
        snprintf(err, len,
                 "refusing to serve HTTP on %s without a token (protected mode): anyone who can reach that address "
                 "could watch the job. Set token_file, use a loopback address (127.0.0.1, [::1]), or set "
                 "allow_remote_without_token = yes on a network you trust",
                 c->metrics_listen);
        return PS_EINVAL;
    }
    /* listen: a host name is resolved at start and by --print-config; one
     * that does not resolve here may be meant for another machine, which
     * only a start refuses. While psd runs (listen cannot change then) only
     * an address literal is looked at: no DNS lookup on the loop. */
    struct sockaddr_storage la;
    char rerr[512];
    int resolved;
    if (when == SRV_CHECK_RUN) {
        memset(&la, 0, sizeof la);
        resolved = uv_ip4_addr(c->listen.host, c->listen.port, (struct sockaddr_in *)&la) == 0 ||
                   uv_ip6_addr(c->listen.host, c->listen.port, (struct sockaddr_in6 *)&la) == 0;
    } else {
        resolved = srv_listen_resolve(c->listen.host, c->listen.port, &la, rerr, sizeof rerr) == 0;
        if (!resolved && when == SRV_CHECK_START) {
            snprintf(err, len, "%s", rerr);
            return PS_EINVAL;
        }
    }
    if (resolved && !c->token_file[0] && !c->allow_remote_without_token && !srv_addr_is_loopback(&la)) {
        char meant[INET6_ADDRSTRLEN + 320] = "", ip[INET6_ADDRSTRLEN];
        srv_addr_name(&la, ip, sizeof ip);
        if (strcmp(ip, c->listen.host) != 0)
            snprintf(meant, sizeof meant, " (%.255s resolves to %s, not a loopback address)", c->listen.host, ip);
        snprintf(err, len,
                 "refusing to listen on %s:%d%s without a token (protected mode): anyone who can reach that "
                 "address could read and change the model. Set token_file (see conf/psd.conf), listen on a "
                 "loopback address (127.0.0.1, [::1], localhost), or set allow_remote_without_token = yes on a "
                 "network you trust",
                 c->listen.host, c->listen.port, meant);
        return PS_EINVAL;
    }
    if (resolved)
        parsed.listen_addr = la;
    if (out)
        *out = parsed;
    return 0;
}

int srv_state_dir_check(const char *dir, char *err, size_t len)
{
    if (!dir[0])
        return 0;
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) {
            snprintf(err, len, "state_dir %s: %s", dir, strerror(errno));
            return PS_EIO;
        }
        if (mkdir(dir, 0750) != 0) {
            snprintf(err, len, "cannot create state_dir %s: %s", dir, strerror(errno));
            return PS_EIO;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, len, "state_dir %s is not a directory", dir);
        return PS_EIO;
    }
    /* write access is what checkpoints need: try it, as they will */
    char probe[PS_CONFIG_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.psd-write-test-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, len, "state_dir %s cannot be written (checkpoints would fail): %s", dir, strerror(errno));
        return PS_EIO;
    }
    close(fd);
    unlink(probe);
    return 0;
}

int srv_listen_resolve(const char *host, int port, struct sockaddr_storage *out, char *err, size_t len)
{
    memset(out, 0, sizeof *out);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)out) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)out) == 0)
        return 0;
    if (ps_host_is_localhost(host)) /* loopback without the resolver (RFC 6761) */
        return uv_ip4_addr("127.0.0.1", port, (struct sockaddr_in *)out) == 0 ? 0 : PS_EINVAL;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        snprintf(err, len, "listen: cannot resolve '%s': %s", host, gai_strerror(rc));
        return PS_EINVAL;
    }
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if ((a->ai_family == AF_INET && (!pick || pick->ai_family != AF_INET)) ||
            (a->ai_family == AF_INET6 && !pick))
            pick = a;
    if (!pick) {
        freeaddrinfo(res);
        snprintf(err, len, "listen: '%s' has no IPv4 or IPv6 address", host);
        return PS_EINVAL;
    }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    if (pick->ai_family == AF_INET)
        ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

int srv_addr_is_loopback(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family != AF_INET6)
        return 0;
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
}

void srv_addr_name(const struct sockaddr_storage *a, char *buf, size_t len)
{
    if (a->ss_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)a, buf, len);
    else if (a->ss_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)a, buf, len);
    else
        snprintf(buf, len, "?");
}
