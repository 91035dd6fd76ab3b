/* ckpt_file.h - a checkpoint's file format and the state dir's checkpoint
 * files (ckpt_file.c), shared by writing (checkpoint.c) and loading
 * (ckpt_load.c). Private to the report layer; the format is in
 * checkpoint.h. */
#ifndef SRV_REPORT_CKPT_FILE_H
#define SRV_REPORT_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_MAGIC "PSDCKPT1"
#define CKPT_END "PSDE"
#define CKPT_FORMAT 1        /* a checkpoint without tables */
#define CKPT_FORMAT_TABLES 2 /* one with tables: "tables" in the header, their rows after the state */
#define CKPT_FORMAT_CLOCKS 3 /* as 2, and each table's clock in the header and its rows' last-push clocks
                              * after its rows (format 2 loads with every row pushed at clock 0) */
#define CKPT_MAX_STATE 4
#define CKPT_HEADER_MAX (4u << 20)


void srv_ckpt_put_u32(uint8_t *p, uint32_t v);   /* little-endian */
uint32_t srv_ckpt_get_u32(const uint8_t *p);
/* Removes the checkpoints a psd killed while writing them left behind
 * (at start, before any write of this psd's own), each with a log line. */
void srv_ckpt_remove_leftovers(const char *dir);
/* A checkpoint file's place among the others: the model version it
 * holds, and its number among the checkpoints of that version (0 for the
 * first; a job whose tables change while its version does not, as a
 * table-only one, writes several of one version). */
typedef struct srv_ckpt_id {
    uint64_t version;
    uint32_t seq;
} srv_ckpt_id;

/* Lists the checkpoints in dir, newest first (by version, then seq).
 * *out is malloc'd. */
size_t srv_ckpt_list(const char *dir, srv_ckpt_id **out);
/* dir/ckpt-<version, 20 digits>.psdc<suffix> into buf (seq 0), or
 * dir/ckpt-<version>_<seq, 10 digits>.psdc<suffix>: names sort as the
 * checkpoints do. */
void srv_ckpt_path(char *buf, size_t len, const char *dir, srv_ckpt_id id, const char *suffix);

#endif
