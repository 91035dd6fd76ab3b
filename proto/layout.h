/* layout.h - the model layout: named tensors laid out in one flat float32 vector.
 *
 * Every push and pull addresses a key range [offset, offset+len) of the flat
 * vector. A layout lists the tensors in order; tensor i occupies the range that
 * starts where tensor i-1 ends. The fingerprint is a 64-bit FNV-1a hash over a
 * canonical text form of the layout, so two programs agree on a layout iff they
 * agree on names, ranks, dimensions and order. */
#ifndef PS_LAYOUT_H
#define PS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* The tensor limits are far above what ordinary models need (ResNet-101:
 * 314 parameters and 310 BatchNorm buffers; ResNet-152: 932 tensors; a
 * 12-layer transformer's nested names reach ~50 bytes) and are bounded by
 * the hello: a layout of PS_TENSORS_MAX tensors of the longest names and
 * highest rank is ~350 KB of msgpack, within PS_FRAME_MAX_PREAUTH, and a
 * ps_layout (held whole by psd and each client link) is ~360 KB. */
#define PS_NAME_MAX 127     /* longest tensor name, in bytes */
#define PS_DIMS_MAX 6       /* highest tensor rank */
#define PS_TENSORS_MAX 2048 /* most tensors in one layout */

/* A buffer: a tensor of the model that the optimizer does not train
 * (BatchNorm's running statistics). A push carries its values, not a
 * gradient, and psd combines the workers' values by its rule. */
enum {
    PS_BUF_NONE = 0,  /* a parameter, trained */
    PS_BUF_MEAN = 1,  /* "mean": the mean of the workers' values */
    PS_BUF_FIRST = 2  /* "first": shard 0's values (a BSP round's lowest shard) */
};

/* The dtype a buffer is saved as (`psctl save`); its values travel and are
 * held as float32 (integers exact up to 2^24). */
enum { PS_SAVE_F32 = 0, PS_SAVE_F64, PS_SAVE_I64, PS_SAVE_I32 };

typedef struct ps_tensor_desc {
    char name[PS_NAME_MAX + 1]; /* NUL-terminated, printable ASCII */
    uint32_t ndim;              /* 1..PS_DIMS_MAX */
    uint32_t dims[PS_DIMS_MAX]; /* each >= 1 */
    uint64_t offset;            /* first element in the flat vector */
    uint64_t count;             /* product of dims */
    uint8_t buf;                /* PS_BUF_*: 0 for a parameter */
    uint8_t save_dt;            /* PS_SAVE_*: a buffer's dtype in a saved file */
} ps_tensor_desc;

typedef struct ps_layout {
    uint32_t ntensors;
    ps_tensor_desc t[PS_TENSORS_MAX];
    uint64_t total; /* elements in the flat vector */
    uint32_t nbuf;  /* tensors that are buffers */
} ps_layout;

/* Resets the layout to empty. */
void ps_layout_init(ps_layout *l);

/* Appends a tensor named `name` with `ndim` dims, computing its offset and
 * count. Returns 0, or a negative PS_E* code when the name is too long or
 * empty, the rank or a dimension is out of range, the layout is full, or the
 * total would exceed PS_PARAMS_MAX. */
int ps_layout_add(ps_layout *l, const char *name, uint32_t ndim, const uint32_t *dims);

/* Makes the last tensor added a buffer with rule `buf` (PS_BUF_MEAN or
 * PS_BUF_FIRST) saved as save_dt (PS_SAVE_*). Returns 0 or PS_EINVAL. */
int ps_layout_set_buffer(ps_layout *l, unsigned buf, unsigned save_dt);

/* The names on the wire: "mean", "first"; "F32", "F64", "I64", "I32".
 * The parsers return the value, or -1 for a name not listed. */
const char *ps_buf_name(unsigned buf);
const char *ps_save_dt_name(unsigned save_dt);
int ps_buf_parse(const char *s, size_t len);
int ps_save_dt_parse(const char *s, size_t len);

/* 64-bit FNV-1a over "name:d0xd1...;" for every tensor, in order (a
 * buffer's adds "@rule/dtype" before the ";"). */
uint64_t ps_layout_fingerprint(const ps_layout *l);

/* Returns 1 when a and b describe the same tensors in the same order
 * (buffers with the same rule and dtype). */
int ps_layout_equal(const ps_layout *a, const ps_layout *b);

/* ---- a model split over several psd instances ------------------------------
 *
 * A model may be served by n psd instances, each holding one contiguous part
 * of the flat vector (proto/PROTOCOL.md 6.2). Part i of n is [lo, hi) with
 * lo = floor(P * i / n) rounded down to a multiple of PS_PART_ALIGN values
 * (hi likewise from i + 1; the last part ends at P), so every boundary falls
 * on a 4 KiB page of float32 values. */
#define PS_PART_ALIGN 1024u
#define PS_PARTS_MAX 64u

/* The range of part i of n of a P-value vector. Returns 0, or PS_EINVAL
 * when n is 0 or over PS_PARTS_MAX, i >= n, or P is below n x
 * PS_PART_ALIGN (n > 1), which every part's size must reach. */
int ps_part_bounds(uint64_t P, uint32_t i, uint32_t n, uint64_t *lo, uint64_t *hi);

/* The layout psd instance i of n holds: the tensors of l that lie inside
 * part i whole, under their own names and dims, and the piece of a tensor
 * the part cuts as a 1-dim tensor named "name(d0xd1...)[x:y]": elements
 * x..y-1, in flat order, of the tensor `name` of dims d0 x d1 x ... (so the
 * parts together tell the whole layout: ps_layout_join). Every instance gets a different layout, so psd's
 * layout check refuses a worker that addresses the wrong part. Returns 0, or
 * PS_EINVAL (ps_part_bounds refuses, or a piece's name would be over
 * PS_NAME_MAX bytes). */
int ps_layout_part(const ps_layout *l, uint32_t i, uint32_t n, ps_layout *out, uint64_t *lo, uint64_t *hi);

/* The whole model's layout from its n parts' layouts, in part order (what
 * ps_layout_part made of it): cut tensors joined again under their names
 * and dims. Returns 0, or PS_EINVAL with the reason in err when the parts
 * do not fit together (a part missing, repeated or out of order, a piece
 * that does not continue the last). */
int ps_layout_join(const ps_layout *const *parts, uint32_t n, ps_layout *out, char *err, size_t errlen);

/* The index of l's first tensor that is a piece of a cut tensor (a name
 * "name(d0xd1...)[x:y]", as ps_layout_part makes them), or -1 when it has
 * none: l is then a whole model, or a part whose bounds cut no tensor. */
int ps_layout_first_piece(const ps_layout *l);

/* Writes "name[d0,d1] ..." into buf for log messages; always NUL-terminates. */
void ps_layout_describe(const ps_layout *l, char *buf, size_t len);

#endif
