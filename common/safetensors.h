/* safetensors.h - the safetensors file as psd's tools write it and psd
 * reads it (safetensors.c): one place for the format's names and limits,
 * which `psctl save` (the writer) and psd's init_from
 * (server/report/safetensors.c, the reader) share, and the writer itself.
 *
 * The file: 8 bytes of little-endian header length N, N bytes of JSON
 * (padded with spaces so the data starts at a multiple of 8), then the
 * tensors' bytes back to back. The JSON names each tensor's dtype, shape
 * and byte range; its "__metadata__" holds strings: the model's version,
 * mode, layout fingerprint and server, each buffer's rule
 * ("buffer:NAME": "mean" or "first") and the embedding tables'
 * declarations ("psd.tables", a JSON array as one string). A table's rows
 * and keys follow the model's values as tensors "tables/NAME/rows" (F32
 * [rows, dim]) and "tables/NAME/keys" (I64 [rows]). */
#ifndef PS_COMMON_SAFETENSORS_H
#define PS_COMMON_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "proto/layout.h"
#include "proto/msg.h"

/* safetensors' own limit on a header (its reference implementation's) */
#define PS_ST_HEADER_MAX (100u << 20)
/* __metadata__ keys: the tables' declarations; a buffer's rule is under
 * PS_ST_META_BUFFER followed by the tensor's name */
#define PS_ST_META_TABLES "psd.tables"
#define PS_ST_META_BUFFER "buffer:"
/* a table's tensors: PS_ST_TABLE_PREFIX NAME "/rows" and ... "/keys" */
#define PS_ST_TABLE_PREFIX "tables/"

enum { PS_ST_NOT_TABLE = 0, PS_ST_ROWS = 1, PS_ST_KEYS = 2 };

/* Which of table `table`'s tensors `name` is: PS_ST_ROWS, PS_ST_KEYS, or
 * PS_ST_NOT_TABLE when it is neither. */
int ps_st_table_tensor(const char *name, const char *table);

/* Bytes one value of tensor t takes in the file: 4 for float32 (and I32),
 * 8 for a buffer saved as F64 or I64 (num_batches_tracked, which
 * load_state_dict(strict) wants back as I64). */
size_t ps_st_value_size(const ps_tensor_desc *t);

/* Writes values [pos, pos+n) of the model of layout l (the whole layout)
 * to f, each in its tensor's dtype, little-endian as safetensors is (the
 * machines psd runs on are). 0, or -1 when a write fails (errno set). */
int ps_st_write_values(FILE *f, const ps_layout *l, uint64_t pos, const float *v, uint64_t n);

/* An embedding table as the file holds it: rows [0, rows) of dim floats,
 * then their keys, after the model's values. */
typedef struct ps_st_table {
    char name[PS_NAME_MAX + 1];
    uint32_t dim;
    uint64_t rows;
    ps_buf decl;     /* its declaration as JSON (PROTOCOL.md 13), for the metadata */
} ps_st_table;

/* What the metadata says of the model. */
typedef struct ps_st_meta {
    uint64_t version;          /* model version of the values */
    const char *mode;          /* asgd, bsp, ... */
    uint64_t fp;               /* layout fingerprint */
    const char *server;        /* where it came from: "host:port" or a list */
    const char *part_versions; /* a split model: each part's version, "v1,v2,..."; NULL: one psd */
} ps_st_meta;

/* Builds the whole header (length and padded JSON) for layout l's tensors
 * followed by tabs' rows and keys, into out (appended to an empty ps_buf).
 * 0, or PS_ENOMEM. */
int ps_st_header(const ps_layout *l, const ps_st_meta *meta, const ps_st_table *tabs, uint32_t ntabs,
                 ps_buf *out);

/* Checks that a safetensors file can hold layout l: no name twice (the
 * header is a JSON object). 0, or -1 with the reason in err. */
int ps_st_names_ok(const ps_layout *l, char *err, size_t errlen);

#endif
