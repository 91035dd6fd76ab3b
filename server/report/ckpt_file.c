/* ckpt_file.c - the state dir's checkpoint files: their names
 * (ckpt-<version>.psdc, ckpt-<version>_<n>.psdc for the n-th more of one
 * version, and .tmp while written), listing them newest
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

/* n digits at p as a number into *v; 0, or -1 when one is not a digit. */
static int digits(const char *p, int n, uint64_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        *v = *v * 10 + (uint64_t)(p[i] - '0');
    }
    return 0;
}

/* ckpt-<20 digits>.psdc or ckpt-<20 digits>_<10 digits>.psdc, then
 * suffix: 1 with its id, or 0. */
static int is_ckpt_name(const char *name, const char *suffix, srv_ckpt_id *id)
{
    size_t n = strlen(name), sl = strlen(suffix);
    uint64_t v, q = 0;
    if (n < sl || strcmp(name + n - sl, suffix) != 0 || strncmp(name, "ckpt-", 5) != 0)
        return 0;
    n -= sl;
    if (n == 5 + 20 + 5) {
        if (strncmp(name + 25, ".psdc", 5) != 0 || digits(name + 5, 20, &v) != 0)
            return 0;
    } else if (n == 5 + 20 + 11 + 5) {
        if (name[25] != '_' || strncmp(name + 36, ".psdc", 5) != 0 || digits(name + 5, 20, &v) != 0 ||
            digits(name + 26, 10, &q) != 0 || q == 0 || q > UINT32_MAX)
            return 0;
    } else {
        return 0;
    }
    id->version = v;
    id->seq = (uint32_t)q;
    return 1;
}

/* A checkpoint being written: its name and .tmp. */
static int is_ckpt_tmp_name(const char *name)
{
    srv_ckpt_id id;
    return is_ckpt_name(name, ".tmp", &id);
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
    const srv_ckpt_id *x = a, *y = b;
    if (x->version != y->version)
        return x->version < y->version ? 1 : -1;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

size_t srv_ckpt_list(const char *dir, srv_ckpt_id **out)
{
    DIR *d = opendir(dir);
    size_t n = 0, cap = 0;
    srv_ckpt_id *v = NULL;
    *out = NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        srv_ckpt_id id;
        if (!is_ckpt_name(e->d_name, "", &id))
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            srv_ckpt_id *t = realloc(v, nc * sizeof *v);
            if (!t)
                break;
            v = t, cap = nc;
        }
        v[n++] = id;
    }
    closedir(d);
    if (n)
        qsort(v, n, sizeof *v, cmp_desc);
    *out = v;
    return n;
}

void srv_ckpt_path(char *buf, size_t len, const char *dir, srv_ckpt_id id, const char *suffix)
{
    if (id.seq)
        snprintf(buf, len, "%s/ckpt-%020" PRIu64 "_%010" PRIu32 ".psdc%s", dir, id.version, id.seq, suffix);
    else
        snprintf(buf, len, "%s/ckpt-%020" PRIu64 ".psdc%s", dir, id.version, suffix);
}
