/* psctl.c - the operator's view of a running psd. It speaks the same
 * protocol as the workers, with the admin role.
 *
 * Exit codes: 0 success, 1 psd answered with an error, 2 bad usage,
 * 3 psd not reachable (refused, unresolvable), 4 timed out. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/client.h"
#include "proto/errors.h"

enum { EXIT_OK = 0, EXIT_REMOTE = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3, EXIT_TIMEOUT = 4 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: psctl [--server HOST:PORT] [--timeout MS] COMMAND [--json]\n"
            "\n"
            "Commands:\n"
            "  status [--json]   mode, model version, rates and one row per worker\n"
            "  metrics           Prometheus text exposition of psd's counters\n"
            "\n"
            "Options:\n"
            "  -s, --server HOST:PORT  psd's address (default $PSD_SERVER or 127.0.0.1:7000)\n"
            "  -t, --timeout MS        give up after MS milliseconds (default 5000)\n"
            "  -j, --json              machine-readable output (status)\n"
            "  -h, --help              this help\n"
            "\n"
            "Exit codes: 0 ok, 1 psd refused the request, 2 usage error,\n"
            "3 psd not reachable, 4 timed out.\n");
}

static int exit_code(int rc)
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

/* ---- msgpack object helpers ----------------------------------------------- */

static const msgpack_object *get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n && !memcmp(kv->key.via.str.ptr, key, n))
            return &kv->val;
    }
    return NULL;
}

static double num(const msgpack_object *map, const char *key)
{
    const msgpack_object *o = get(map, key);
    if (!o)
        return NAN;
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return (double)o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (double)o->via.i64;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return o->via.f64;
    default:
        return NAN;
    }
}

static const char *str(const msgpack_object *map, const char *key, char *buf, size_t len)
{
    const msgpack_object *o = get(map, key);
    if (!o || o->type != MSGPACK_OBJECT_STR) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%.*s", (int)o->via.str.size, o->via.str.ptr);
    }
    return buf;
}

static void json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* Writes o as JSON. Maps with non-string keys do not occur in psd's replies;
 * their keys are written as strings anyway. */
static void json(FILE *f, const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        fputs("null", f);
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        fputs(o->via.boolean ? "true" : "false", f);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%" PRIu64, o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        fprintf(f, "%" PRId64, o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isfinite(o->via.f64))
            fprintf(f, "%.17g", o->via.f64);
        else
            fputs("null", f);
        break;
    case MSGPACK_OBJECT_STR:
        json_string(f, o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputs(", ", f);
            json(f, &o->via.array.ptr[i]);
        }
        fputc(']', f);
        break;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (i)
                fputs(", ", f);
            if (kv->key.type == MSGPACK_OBJECT_STR)
                json_string(f, kv->key.via.str.ptr, kv->key.via.str.size);
            else
                fputs("\"?\"", f);
            fputs(": ", f);
            json(f, &kv->val);
        }
        fputc('}', f);
        break;
    default:
        fputs("null", f);
        break;
    }
}

/* ---- commands --------------------------------------------------------------- */

static void print_status(const msgpack_object *b)
{
    char mode[32], listen[300], state[32], addr[80];
    double params = num(b, "parameters");
    printf("psd %s  mode %s  model version %.0f  uptime %.1f s\n", str(b, "listen", listen, sizeof listen),
           str(b, "mode", mode, sizeof mode), num(b, "version"), num(b, "uptime"));
    printf("parameters %.0f (%.2f MB), optimizer state %.2f MB\n", params, num(b, "bytes") / 1e6,
           num(b, "optimizer_state_bytes") / 1e6);
    printf("pushes %.0f (%.1f/s)  pulls %.0f (%.1f/s)  rounds %.0f  connections %.0f\n", num(b, "pushes"),
           num(b, "push_rate"), num(b, "pulls"), num(b, "pull_rate"), num(b, "rounds"), num(b, "connections"));
    const msgpack_object *ws = get(b, "workers");
    uint32_t n = ws && ws->type == MSGPACK_OBJECT_ARRAY ? ws->via.array.size : 0;
    printf("workers: %u seen, %.0f expected\n", n, num(b, "workers_expected"));
    if (n == 0)
        return;
    printf("  %-7s %-10s %-22s %8s %9s %5s %8s %8s %10s\n", "SHARD", "STATE", "ADDRESS", "PUSHES", "LAST SEEN",
           "EPOCH", "LOSS", "ACCURACY", "SAMPLES/S");
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *w = &ws->via.array.ptr[i];
        char shard[24], loss[16] = "-", acc[16] = "-";
        snprintf(shard, sizeof shard, "%.0f/%.0f", num(w, "shard"), num(w, "shards"));
        if (!isnan(num(w, "loss")))
            snprintf(loss, sizeof loss, "%.4f", num(w, "loss"));
        if (!isnan(num(w, "accuracy")))
            snprintf(acc, sizeof acc, "%.2f%%", 100 * num(w, "accuracy"));
        printf("  %-7s %-10s %-22s %8.0f %7.1f s %5.0f %8s %8s %10.0f\n", shard, str(w, "state", state, sizeof state),
               str(w, "address", addr, sizeof addr), num(w, "pushes"), num(w, "last_seen"), num(w, "epoch"), loss,
               acc, num(w, "samples_per_second"));
    }
}

int main(int argc, char **argv)
{
    const char *server = getenv("PSD_SERVER") ? getenv("PSD_SERVER") : "127.0.0.1:7000";
    int timeout = 5000, as_json = 0;
    static const struct option longopts[] = {
        {"server", required_argument, NULL, 's'}, {"timeout", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},         {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    /* options may come before or after the command ("status --json") */
    while ((opt = getopt_long(argc, argv, "s:t:jh", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            server = optarg;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v <= 0 || v > 3600000) {
                fprintf(stderr, "psctl: bad --timeout '%s': milliseconds, 1..3600000\n", optarg);
                return EXIT_USAGE;
            }
            timeout = (int)v;
            break;
        }
        case 'j':
            as_json = 1;
            break;
        case 'h':
            usage(stdout);
            return EXIT_OK;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, optind >= argc ? "psctl: no command given (try psctl --help)\n"
                                       : "psctl: one command at a time (try psctl --help)\n");
        return EXIT_USAGE;
    }
    const char *cmd = argv[optind];
    uint32_t req_type;
    if (strcmp(cmd, "status") == 0)
        req_type = PS_MSG_STATUS;
    else if (strcmp(cmd, "metrics") == 0)
        req_type = PS_MSG_METRICS;
    else {
        fprintf(stderr, "psctl: unknown command '%s' (commands: status, metrics)\n", cmd);
        return EXIT_USAGE;
    }

    ps_client c;
    ps_msg m, r;
    ps_client_init(&c);
    int rc = ps_client_connect(&c, server, timeout);
    if (rc == 0) {
        ps_msg_init(&m, PS_MSG_HELLO);
        m.has = PS_F_VERSION | PS_F_ROLE;
        m.proto = PS_PROTO_VERSION;
        m.role = PS_ROLE_ADMIN;
        rc = ps_client_call(&c, &m, &r, timeout);
    }
    if (rc == 0) {
        ps_msg_init(&m, req_type);
        rc = ps_client_call(&c, &m, &r, timeout);
    }
    if (rc != 0) {
        fprintf(stderr, "psctl: %s\n", ps_client_error(&c));
        ps_client_free(&c);
        return exit_code(rc);
    }
    if (req_type == PS_MSG_STATUS) {
        if (r.type != PS_MSG_STATUS_REPLY) {
            fprintf(stderr, "psctl: psd answered status with %s\n", ps_msg_type_name(r.type));
            rc = PS_EMALFORMED;
        } else if (as_json) {
            json(stdout, r.body);
            fputc('\n', stdout);
        } else {
            print_status(r.body);
        }
    } else {
        if (r.type != PS_MSG_METRICS_REPLY) {
            fprintf(stderr, "psctl: psd answered metrics with %s\n", ps_msg_type_name(r.type));
            rc = PS_EMALFORMED;
        } else {
            fwrite(r.text, 1, r.text_len, stdout);
        }
    }
    ps_msg_init(&m, PS_MSG_BYE);
    if (rc == 0)
        ps_client_send(&c, &m);
    ps_client_free(&c);
    return exit_code(rc);
}
