/* idx.h - reader for IDX files, the format MNIST and Fashion-MNIST ship in.
 *
 * An IDX file is a big-endian header (magic 0x000008NN: unsigned bytes, NN
 * dimensions, then NN 32-bit sizes) followed by exactly the product of the
 * sizes in bytes. We read the two kinds the data sets use: images, magic
 * 0x00000803, u8 [n][rows][cols]; and labels, magic 0x00000801, u8 [n]. Files
 * may be plain or gzip-compressed (zlib detects which). Everything in a file
 * is checked: the magic, every dimension against the limits below, and that
 * the payload holds exactly the declared bytes, no fewer and no more. */
#ifndef PS_IDX_H
#define PS_IDX_H

#include <stddef.h>
#include <stdint.h>

#define PS_IDX_MAGIC_LABELS 0x00000801u
#define PS_IDX_MAGIC_IMAGES 0x00000803u

#define PS_IDX_MAX_ITEMS (1u << 24)         /* most images or labels in a file */
#define PS_IDX_MAX_SIDE 4096u               /* most rows or columns of an image */
#define PS_IDX_MAX_BYTES ((size_t)1 << 31)  /* largest payload we will hold */

typedef struct ps_idx {
    uint32_t ndim;    /* 1 for labels, 3 for images */
    uint32_t dims[3]; /* dims[0] items; for images dims[1] rows, dims[2] cols */
    size_t size;      /* bytes in data: the product of the dims */
    uint8_t *data;    /* owned; release with ps_idx_free() */
} ps_idx;

/* Reads the IDX file at path, which must have ndim dimensions (1 = labels,
 * 3 = images) of unsigned bytes. On success returns 0 and fills *out, which the
 * caller releases with ps_idx_free(). On failure returns a negative code,
 * leaves *out empty (safe to ps_idx_free) and writes one line naming the file
 * and the problem into err (if err is not NULL):
 *   PS_EIO        the file is missing or cannot be read or decompressed
 *   PS_EMALFORMED wrong magic, a zero dimension, truncated, or trailing bytes
 *   PS_ETOO_BIG   a dimension or the payload is over the PS_IDX_MAX_* limits
 *   PS_ENOMEM     out of memory
 *   PS_EINVAL     ndim is neither 1 nor 3
 * Memory is never sized from the header alone: the buffer grows with the bytes
 * actually read, so a short file that declares a huge payload costs little. */
int ps_idx_read(const char *path, uint32_t ndim, ps_idx *out, char *err, size_t errlen);

/* Releases what ps_idx_read() allocated and empties *x; NULL-safe, idempotent. */
void ps_idx_free(ps_idx *x);

#endif
