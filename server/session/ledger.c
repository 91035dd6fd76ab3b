/* ledger.c - FOR TESTS ONLY: the pushes a psd applied, in its order, written
 * where a test can read them (tests/client/test_ledger.py: a job whose
 * leader is killed ten times must end with the state of one fresh psd fed
 * the leaders' pushes in the order they applied them). With
 * PSD_TEST_LEDGER=DIR in psd's environment each push applied goes to
 * DIR/ledger-PID.bin as a record (host byte order, little-endian on the
 * machines psd runs on):
 *
 *     u8 kind ('D' dense, 'T' table) | u64 cid | u64 pid | u64 log end
 *     (the replication log's end once the push is recorded in it: a
 *     follower that applied that far holds the push) | u64 model version
 *     | 'D': u64 off, u64 n, n f32 gradient
 *     | 'T': 64 bytes table name, u32 dim, u32 n, n u64 keys, n x dim f32
 *
 * flushed to the kernel after each record, so a psd killed with -9 leaves
 * every record of what it applied. Never set in production: it writes
 * every gradient. Owns the file (a static: one per process). */
#include "server/session/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "server/replog/replog.h"
#include "server/tables/table.h"

static FILE *ledger(void)
{
    static int tried;
    static FILE *f;
    if (tried)
        return f;
    tried = 1;
    const char *dir = getenv("PSD_TEST_LEDGER");
    if (!dir || !*dir)
        return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger-%ld.bin", dir, (long)getpid());
    f = fopen(path, "ab");
    if (!f)
        PS_LOG(PS_LOG_ERROR, "PSD_TEST_LEDGER: cannot open %s: the pushes go unrecorded", path);
    else
        PS_LOG(PS_LOG_WARN, "PSD_TEST_LEDGER: every push applied is written to %s (a test's record; never in "
                            "production)", path);
    return f;
}

static void head(FILE *f, psd *s, char kind, uint64_t cid, uint64_t pid)
{
    uint64_t w[4] = {cid, pid, srv_replog_end(s), s->model.version};
    fputc(kind, f);
    fwrite(w, sizeof w, 1, f);
}

void srv_ledger_dense(psd *s, uint64_t cid, uint64_t pid, uint64_t off, uint64_t n, const float *g)
{
    FILE *f = ledger();
    if (!f)
        return;
    head(f, s, 'D', cid, pid);
    uint64_t w[2] = {off, n};
    fwrite(w, sizeof w, 1, f);
    fwrite(g, sizeof *g, (size_t)n, f);
    fflush(f);
}

void srv_ledger_rows(psd *s, uint64_t cid, uint64_t pid, uint32_t ti, const uint8_t *keys, uint32_t n,
                     const float *g)
{
    FILE *f = ledger();
    if (!f)
        return;
    const ps_table_def *d = srv_tables_def(&s->tables, ti);
    char name[64] = {0};
    memcpy(name, d->name, sizeof name);
    head(f, s, 'T', cid, pid);
    uint32_t w[2] = {d->dim, n};
    fwrite(name, sizeof name, 1, f);
    fwrite(w, sizeof w, 1, f);
    fwrite(keys, 8, n, f);
    fwrite(g, sizeof *g, (size_t)n * d->dim, f);
    fflush(f);
}
