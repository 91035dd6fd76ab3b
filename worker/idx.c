/* idx.c - IDX reading through zlib's gz* interface, which passes plain files
 * through unchanged, so one path reads both "x-ubyte" and "x-ubyte.gz". */
#include "idx.h"

#include "common/log.h"
#include "proto/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define READ_CHUNK ((size_t)1 << 30) /* gzread takes an unsigned int length */
#define FIRST_ALLOC ((size_t)1 << 20)

/* "60000 images of 28x28" or "60000 labels", for messages. */
static void describe(const uint32_t *dims, uint32_t ndim, char *buf, size_t len)
{
    if (ndim == 3)
        snprintf(buf, len, "%u images of %ux%u", dims[0], dims[1], dims[2]);
    else
        snprintf(buf, len, "%u labels", dims[0]);
}

static const char *kind(uint32_t ndim)
{
    return ndim == 3 ? "pixels" : "labels";
}

/* Reads up to n bytes; returns the count read (short only at end of file) or
 * -1 on a read or decompression error. */
static long long read_full(gzFile gz, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        size_t want = n - got < READ_CHUNK ? n - got : READ_CHUNK;
        int r = gzread(gz, buf + got, (unsigned)want);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (long long)got;
}

static const char *gz_message(gzFile gz)
{
    int zerr = 0;
    const char *m = gzerror(gz, &zerr);
    if (zerr == Z_ERRNO)
        return strerror(errno);
    return (m && *m) ? m : "unknown error";
}

void ps_idx_free(ps_idx *x)
{
    if (x == NULL)
        return;
    free(x->data);
    memset(x, 0, sizeof(*x));
}

int ps_idx_read(const char *path, uint32_t ndim, ps_idx *out, char *err, size_t errlen)
{
    int rc = PS_OK;
    int fd = -1;
    gzFile gz = NULL;
    uint8_t *data = NULL;
    char what[96];

    memset(out, 0, sizeof(*out));
    if (ndim != 1 && ndim != 3) {
        ps_errf(err, errlen, "%s: internal error: asked for an IDX file of %u dimensions", path, ndim);
        return PS_EINVAL;
    }
    const uint32_t want_magic = ndim == 3 ? PS_IDX_MAGIC_IMAGES : PS_IDX_MAGIC_LABELS;
    const char *want_kind = ndim == 3 ? "unsigned-byte images" : "unsigned-byte labels";

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            ps_errf(err, errlen, "%s: missing (no such file); run scripts/setup.sh to download the data sets", path);
        else
            ps_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return PS_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ps_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        rc = PS_EIO;
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        ps_errf(err, errlen, "%s: is a directory, expected an IDX file", path);
        rc = PS_EIO;
        goto out;
    }
    gz = gzdopen(fd, "rb");
    if (gz == NULL) {
        ps_errf(err, errlen, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
        rc = PS_EIO;
        goto out;
    }
    fd = -1; /* gzclose closes it from now on */

    /* Header: magic, then ndim big-endian u32 sizes. */
    uint8_t hdr[4 + 4 * 3];
    const size_t hdr_len = 4 + 4 * (size_t)ndim;
    long long got = read_full(gz, hdr, 4);
    if (got < 0) {
        ps_errf(err, errlen, "%s: read error: %s", path, gz_message(gz));
        rc = PS_EIO;
        goto out;
    }
    if (got < 4) {
        ps_errf(err, errlen, "%s: truncated: file holds %lld bytes, too short for an IDX header", path, got);
        rc = PS_EMALFORMED;
        goto out;
    }
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (magic != want_magic) {
        if (hdr[0] == 0 && hdr[1] == 0 && hdr[2] == 0x08 && hdr[3] >= 1)
            ps_errf(err, errlen, "%s: wrong IDX kind: magic 0x%08x has %u dimensions, expected 0x%08x (%s)",
                   path, magic, hdr[3], want_magic, want_kind);
        else if (hdr[0] == 0 && hdr[1] == 0 && hdr[3] >= 1)
            ps_errf(err, errlen,
                   "%s: unsupported IDX element type 0x%02x (magic 0x%08x); only unsigned bytes (0x08) are read",
                   path, hdr[2], magic);
        else
            ps_errf(err, errlen, "%s: not an IDX file: magic 0x%08x, expected 0x%08x (%s)", path, magic, want_magic,
                   want_kind);
        rc = PS_EMALFORMED;
        goto out;
    }
    got = read_full(gz, hdr + 4, hdr_len - 4);
    if (got < 0) {
        ps_errf(err, errlen, "%s: read error: %s", path, gz_message(gz));
        rc = PS_EIO;
        goto out;
    }
    if ((size_t)got < hdr_len - 4) {
        ps_errf(err, errlen, "%s: truncated: header cut short after %lld of %zu bytes", path, 4 + got, hdr_len);
        rc = PS_EMALFORMED;
        goto out;
    }
    for (uint32_t i = 0; i < ndim; i++) {
        const uint8_t *p = hdr + 4 + 4 * i;
        out->dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    }
    out->ndim = ndim;

    /* Dimensions: nonzero and within the limits; the payload cannot overflow
     * size_t after these checks (2^24 * 2^12 * 2^12 = 2^48). */
    if (out->dims[0] == 0) {
        ps_errf(err, errlen, "%s: bad dimensions: header declares 0 %s", path, ndim == 3 ? "images" : "labels");
        rc = PS_EMALFORMED;
        goto out;
    }
    if (out->dims[0] > PS_IDX_MAX_ITEMS) {
        ps_errf(err, errlen, "%s: bad dimensions: header declares %u items, more than the limit of %u", path,
               out->dims[0], PS_IDX_MAX_ITEMS);
        rc = PS_ETOO_BIG;
        goto out;
    }
    size_t size = out->dims[0];
    if (ndim == 3) {
        if (out->dims[1] == 0 || out->dims[2] == 0) {
            ps_errf(err, errlen, "%s: bad dimensions: header declares images of %ux%u", path, out->dims[1],
                   out->dims[2]);
            rc = PS_EMALFORMED;
            goto out;
        }
        if (out->dims[1] > PS_IDX_MAX_SIDE || out->dims[2] > PS_IDX_MAX_SIDE) {
            ps_errf(err, errlen, "%s: bad dimensions: header declares images of %ux%u, a side is over the limit of %u",
                   path, out->dims[1], out->dims[2], PS_IDX_MAX_SIDE);
            rc = PS_ETOO_BIG;
            goto out;
        }
        size *= (size_t)out->dims[1] * out->dims[2];
    }
    describe(out->dims, ndim, what, sizeof(what));
    if (size > PS_IDX_MAX_BYTES) {
        ps_errf(err, errlen, "%s: bad dimensions: header declares %s, %zu bytes, over the limit of %zu", path, what,
               size, PS_IDX_MAX_BYTES);
        rc = PS_ETOO_BIG;
        goto out;
    }

    /* For an uncompressed regular file the size tells us the answer before we
     * allocate anything. */
    if (gzdirect(gz) && S_ISREG(st.st_mode)) {
        size_t have = (size_t)st.st_size > hdr_len ? (size_t)st.st_size - hdr_len : 0;
        if (have < size) {
            ps_errf(err, errlen, "%s: truncated: header declares %s but file holds %zu bytes of %s", path, what, have,
                   kind(ndim));
            rc = PS_EMALFORMED;
            goto out;
        }
    }

    /* Payload: grow the buffer with what arrives, never past the declared size. */
    size_t cap = size < FIRST_ALLOC ? size : FIRST_ALLOC;
    size_t have = 0;
    data = malloc(cap);
    if (data == NULL) {
        ps_errf(err, errlen, "%s: out of memory reading %s", path, what);
        rc = PS_ENOMEM;
        goto out;
    }
    while (have < size) {
        if (have == cap) {
            size_t ncap = cap * 2 < size ? cap * 2 : size;
            uint8_t *nd = realloc(data, ncap);
            if (nd == NULL) {
                ps_errf(err, errlen, "%s: out of memory reading %s", path, what);
                rc = PS_ENOMEM;
                goto out;
            }
            data = nd;
            cap = ncap;
        }
        size_t want = cap - have;
        long long r = read_full(gz, data + have, want);
        if (r < 0) {
            ps_errf(err, errlen, "%s: read error: %s", path, gz_message(gz));
            rc = PS_EIO;
            goto out;
        }
        have += (size_t)r;
        if ((size_t)r < want) /* short read: end of file */
            break;
    }
    if (have < size) {
        ps_errf(err, errlen, "%s: truncated: header declares %s but file holds %zu bytes of %s", path, what, have,
               kind(ndim));
        rc = PS_EMALFORMED;
        goto out;
    }

    /* Nothing may follow the payload. Count the excess in a small buffer. */
    uint8_t tail[4096];
    size_t extra = 0;
    for (;;) {
        long long r = read_full(gz, tail, sizeof(tail));
        if (r < 0) {
            ps_errf(err, errlen, "%s: read error: %s", path, gz_message(gz));
            rc = PS_EIO;
            goto out;
        }
        extra += (size_t)r;
        if ((size_t)r < sizeof(tail))
            break;
    }
    if (extra > 0) {
        ps_errf(err, errlen, "%s: %zu unexpected bytes after the %s the header declares", path, extra, what);
        rc = PS_EMALFORMED;
        goto out;
    }

    out->size = size;
    out->data = data;
    data = NULL;

out:
    free(data);
    if (gz != NULL)
        gzclose(gz);
    if (fd >= 0)
        close(fd);
    if (rc != PS_OK)
        memset(out, 0, sizeof(*out));
    return rc;
}
