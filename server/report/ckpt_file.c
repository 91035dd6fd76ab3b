/* ckpt_file.c - the state dir's checkpoint files: their names
 * (ckpt-<version>.psdc, and .tmp while written), listing them newest
 * first, removing what an interrupted write left; the format's integers.
 * Owns nothing. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "server/report/ckpt_file.h"
#include "server/config/config.h"

void srv_ckpt_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

uint32_t srv_ckpt_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int is_ckpt_name(const char *name, uint64_t *version)
{
    size_t n = strlen(name);
    if (n != 5 + 20 + 5 || strncmp(name, "ckpt-", 5) != 0 || strcmp(name + 25, ".psdc") != 0)
        return 0;
    uint64_t v = 0;
    for (int i = 5; i < 25; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *version = v;
    return 1;
}

/* A checkpoint being written: ckpt-<20 digits>.psdc.tmp. */
static int is_ckpt_tmp_name(const char *name)
{
    uint64_t v;
    char base[32];
    size_t n = strlen(name);
    if (n != 5 + 20 + 5 + 4 || strcmp(name + 30, ".tmp") != 0)
        return 0;
    memcpy(base, name, 30);
    base[30] = 0;
    return is_ckpt_name(base, &v);
}

/* Removes the checkpoints a psd killed while writing them left behind
 * (at start, before any write of this psd's own), each with a log line. */
void srv_ckpt_remove_leftovers(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_ckpt_tmp_name(e->d_name))
            continue;
        char path[PS_CONFIG_PATH_MAX + 64];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        if (unlink(path) == 0)
            PS_LOG(PS_LOG_INFO, "removed %s (%lld bytes): a checkpoint whose writing was interrupted", path, size);
        else
            PS_LOG(PS_LOG_WARN, "cannot remove %s, a checkpoint whose writing was interrupted: %s", path,
                   strerror(errno));
    }
    closedir(d);
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Lists checkpoint versions in dir, newest first. *out is malloc'd. */
size_t srv_ckpt_list_versions(const char *dir, uint64_t **out)
{
    DIR *d = opendir(dir);
    size_t n = 0, cap = 0;
    uint64_t *v = NULL;
    *out = NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t ver;
        if (!is_ckpt_name(e->d_name, &ver))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *t = realloc(v, nc * sizeof *v);
            if (!t)
                break;
            v = t, cap = nc;
        }
        v[n++] = ver;
    }
    closedir(d);
    if (n)
        qsort(v, n, sizeof *v, cmp_desc);
    *out = v;
    return n;
}

void srv_ckpt_path(char *buf, size_t len, const char *dir, uint64_t version, const char *suffix)
{
    snprintf(buf, len, "%s/ckpt-%020" PRIu64 ".psdc%s", dir, version, suffix);
}
