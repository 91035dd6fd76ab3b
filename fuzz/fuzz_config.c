/* fuzz_config.c - libFuzzer target: psd's configuration file parser.
 *
 * Input: the contents of a configuration file. It is written to a temporary
 * file (the loader reads a path) and loaded with ps_config_load over the
 * defaults. On success every option must survive a round trip through its
 * text form: ps_config_format's text is accepted by ps_config_set, and
 * formats to the same text again (what psd --print-config and a SIGHUP
 * reload rely on). On failure the configuration must be unchanged and the
 * message non-empty, as config.h promises. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/config/config.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "proto/errors.h"

static char path[4096];
static ps_config defaults;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cleanup(void)
{
    if (path[0])
        unlink(path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/psd-fuzz-config.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        perror(path);
        abort();
    }
    close(fd);
    atexit(cleanup);
    ps_log_init("fuzz_config", PS_LOG_ERROR);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull)
        ps_log_set_file(devnull);
    ps_config_defaults(&defaults);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();

    ps_config c = defaults;
    char err[1024];
    err[0] = '\0';
    int rc = ps_config_load(&c, path, err, sizeof err);
    if (rc != 0) {
        FUZZ_CHECK(rc == PS_EINVAL || rc == PS_EIO || rc == PS_ENOMEM, "code %d (%s)", rc, ps_errname(rc));
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0', "error without a message");
        FUZZ_CHECK(memcmp(&c, &defaults, sizeof c) == 0, "a failed load changed the configuration");
        return 0;
    }

    size_t n;
    const ps_config_option *opts = ps_config_options(&n);
    for (size_t i = 0; i < n; i++) {
        char text[PS_CONFIG_VALUE_MAX], again[PS_CONFIG_VALUE_MAX];
        const ps_config_option *o = &opts[i];
        int len = ps_config_format(&c, o, text, sizeof text);
        FUZZ_CHECK(len >= 0 && (size_t)len < sizeof text, "%s: formatted value of %d bytes", o->name, len);
        ps_config d = defaults;
        rc = ps_config_set(&d, o->name, text, err, sizeof err);
        FUZZ_CHECK(rc == 0, "%s: its own text '%s' is refused: %s", o->name, text, err);
        ps_config_format(&d, o, again, sizeof again);
        FUZZ_CHECK(strcmp(text, again) == 0, "%s: '%s' reads back as '%s'", o->name, text, again);
        FUZZ_CHECK(!ps_config_differs(&c, &d, o), "%s: differs after a round trip", o->name);
    }
    return 0;
}
