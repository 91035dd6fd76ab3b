/* fuzz_checkpoint.c - libFuzzer target: psd's checkpoint loader.
 *
 * Input: the bytes of a checkpoint file (format in server/checkpoint.h).
 * The CRC-32 stored 8 bytes from the end is recomputed over the input
 * before it is written, so that mutations reach the header parser instead
 * of all stopping at the checksum; everything else (magic, format, header
 * length, end marker) is left as the fuzzer made it.
 *
 * The file is written into a temporary state_dir under the name psd gives
 * checkpoints, and loaded with srv_checkpoint_load, the function psd calls
 * at start-up, into a zeroed psd whose configuration is the defaults with
 * one of two optimizers (sgd with momentum: one state buffer; adam: two),
 * so that both a matching and a mismatching optimizer state are read. A
 * loaded model is checked for consistency and every value read, then
 * freed.
 *
 * Built from psd's core as it is (report/ckpt_load.c, model/model.c,
 * optim.c, table.c, stats.c: srv_now_ms is stats.c's now). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "server/config/config.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "server/report/checkpoint.h"
#include "server/store/psd.h"

static char dir[4096], file[4200];
static ps_config defaults;
static psd srv;

int LLVMFuzzerInitialize(int *argc, char ***argv);
/* srv_tables_each's callback: counts rows and checks each key once. */
static void count_row(uint64_t key, const float *row, void *arg)
{
    uint64_t *n = arg;
    (void)row;
    n[0]++;
    n[1] ^= ps_mix64(key);
}

/* Loaded tables (PROTOCOL.md 13): every stored row found by its key, as
 * many rows as the store counts, within the tables' limit of 64. */
static void check_tables(const psd *s)
{
    FUZZ_CHECK(s->tables.n <= PS_TABLES_MAX, "%u tables", s->tables.n);
    for (uint32_t i = 0; i < s->tables.n; i++) {
        srv_table_stats st;
        srv_tables_stats(&s->tables, i, &st);
        uint64_t n[2] = {0, 0};
        srv_tables_each(&s->tables, i, count_row, n);
        FUZZ_CHECK(n[0] == st.rows, "table %u: %llu rows visited, %llu counted", i, (unsigned long long)n[0],
                   (unsigned long long)st.rows);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cleanup(void)
{
    if (file[0])
        unlink(file);
    if (dir[0])
        rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/psd-fuzz-ckpt.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror(dir);
        abort();
    }
    snprintf(file, sizeof file, "%s/ckpt-%020d.psdc", dir, 1);
    atexit(cleanup);
    ps_log_init("fuzz_checkpoint", PS_LOG_ERROR);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull)
        ps_log_set_file(devnull); /* the loader logs every file it refuses */
    ps_config_defaults(&defaults);
    if (strlen(dir) >= sizeof defaults.state_dir)
        abort();
    strcpy(defaults.state_dir, dir);
    return 0;
}

static void check_loaded(psd *s)
{
    srv_model *m = &s->model;
    FUZZ_CHECK(m->has_layout && m->initialized && m->blk, "loaded model without layout or values");
    size_t n = 0;
    for (size_t i = 0; i < m->nblk; i++) {
        FUZZ_CHECK(m->blk[i]->refs == 1, "block %zu shared after a load", i);
        fuzz_touch(m->blk[i]->w, m->blk[i]->cap * sizeof(float));
        n += m->blk[i]->cap;
    }
    FUZZ_CHECK(n == m->layout.total, "%zu values for a layout of %llu", n, (unsigned long long)m->layout.total);
    float *bufs[4];
    size_t k = srv_optim_state_buffers(&m->opt, bufs, NULL, 4);
    for (size_t i = 0; i < k && i < 4; i++)
        fuzz_touch(bufs[i], m->layout.total * sizeof(float));
    for (uint32_t i = 0; i < s->nrestored; i++)
        fuzz_touch(&s->restored_clocks[i], sizeof s->restored_clocks[i]);
    char desc[512];
    ps_layout_describe(&m->layout, desc, sizeof desc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    if (size >= 8) {
        uint32_t crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), buf, size - 8);
        for (int i = 0; i < 4; i++)
            buf[size - 8 + i] = (uint8_t)(crc >> (8 * i)); /* little-endian */
    }
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(buf, 1, size, f) != size || fclose(f) != 0)
        abort();
    free(buf);

    static const int optimizers[] = {PS_OPTIMIZER_SGD, PS_OPTIMIZER_ADAM};
    for (size_t i = 0; i < sizeof optimizers / sizeof optimizers[0]; i++) {
        memset(&srv, 0, sizeof srv);
        srv.cfg = defaults;
        srv.cfg.optimizer = optimizers[i];
        int rc = srv_checkpoint_load(&srv);
        FUZZ_CHECK(rc == 0 || rc == 1, "srv_checkpoint_load returned %d", rc);
        if (rc == 1) {
            check_loaded(&srv);
            check_tables(&srv);
        }
        srv_model_free(&srv.model);
        srv_tables_free(&srv.tables);
        free(srv.restored_clocks);
    }
    return 0;
}
