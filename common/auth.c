/* auth.c - token files and the HMAC challenge-response (see auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "proto/errors.h"

static const char client_label[] = "psd-auth-v1";        /* no NUL on the wire */
static const char server_label[] = "psd-auth-v1-server";

static int afail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int ps_auth_init(void)
{
    /* 0: initialised now, 1: already, -1: failed */
    return sodium_init() < 0 ? PS_EIO : 0;
}

void ps_token_clear(ps_token *t)
{
    sodium_memzero(t->b, sizeof t->b);
    t->len = 0;
}

int ps_token_load(const char *path, ps_token *t, char *err, size_t errlen)
{
    uint8_t buf[PS_TOKEN_MAX + 3]; /* room to see that a file is too long */
    struct stat st;
    size_t n = 0;
    int rc = 0;

    ps_token_clear(t);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return afail(err, errlen, PS_EIO, "token file %s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        rc = afail(err, errlen, PS_EIO, "token file %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = afail(err, errlen, PS_EIO, "token file %s is not a regular file", path);
        goto out;
    }
    if (st.st_mode & 077) {
        rc = afail(err, errlen, PS_EINVAL,
                   "token file %s is open to others (mode %04o): the group or other users may read it; make it "
                   "private with chmod 600 %s",
                   path, (unsigned)(st.st_mode & 07777), path);
        goto out;
    }
    while (n < sizeof buf) {
        ssize_t got = read(fd, buf + n, sizeof buf - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rc = afail(err, errlen, PS_EIO, "token file %s: cannot read: %s", path, strerror(errno));
            goto out;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (n == 0)
        rc = afail(err, errlen, PS_EINVAL, "token file %s is empty; put a secret of at least %d bytes in it, e.g. "
                                           "head -c 32 /dev/urandom | base64 > %s",
                   path, PS_TOKEN_MIN, path);
    else if (n < PS_TOKEN_MIN)
        rc = afail(err, errlen, PS_EINVAL, "token file %s holds a secret of %zu bytes; it must have at least %d",
                   path, n, PS_TOKEN_MIN);
    else if (n > PS_TOKEN_MAX)
        rc = afail(err, errlen, PS_EINVAL, "token file %s holds more than %d bytes; a secret has %d..%d", path,
                   PS_TOKEN_MAX, PS_TOKEN_MIN, PS_TOKEN_MAX);
    if (rc == 0) {
        memcpy(t->b, buf, n);
        t->len = n;
    }
out:
    sodium_memzero(buf, sizeof buf);
    close(fd);
    return rc;
}

void ps_auth_random(uint8_t *buf, size_t n)
{
    randombytes_buf(buf, n);
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void ps_auth_client_proof(const uint8_t *key, size_t keylen, const uint8_t nonce[PS_AUTH_NONCE_LEN],
                          const uint8_t cnonce[PS_AUTH_NONCE_LEN], const ps_msg *hello,
                          uint8_t out[PS_AUTH_MAC_LEN])
{
    crypto_auth_hmacsha256_state st;
    const char *role = ps_role_name(hello->role);
    uint8_t claims[16];
    uint64_t fp = (hello->has & PS_F_LAYOUT) && hello->layout ? ps_layout_fingerprint(hello->layout) : 0;
    int shard = (hello->has & PS_F_SHARD) != 0;
    put_le(claims, fp, 8);
    put_le(claims + 8, shard ? hello->shard : 0, 4);
    put_le(claims + 12, shard ? hello->nshards : 0, 4);

    crypto_auth_hmacsha256_init(&st, key, keylen);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)client_label, sizeof client_label - 1);
    crypto_auth_hmacsha256_update(&st, nonce, PS_AUTH_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, cnonce, PS_AUTH_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)role, strlen(role));
    crypto_auth_hmacsha256_update(&st, claims, sizeof claims);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

void ps_auth_server_proof(const uint8_t *key, size_t keylen, const uint8_t cnonce[PS_AUTH_NONCE_LEN],
                          const uint8_t nonce[PS_AUTH_NONCE_LEN], uint8_t out[PS_AUTH_MAC_LEN])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, keylen);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)server_label, sizeof server_label - 1);
    crypto_auth_hmacsha256_update(&st, cnonce, PS_AUTH_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, nonce, PS_AUTH_NONCE_LEN);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

int ps_auth_mac_equal(const uint8_t a[PS_AUTH_MAC_LEN], const uint8_t b[PS_AUTH_MAC_LEN])
{
    /* crypto_auth_hmacsha256_verify() takes only 32-byte keys, and a secret
     * may be 16..1024 bytes; it computes the MAC and then does exactly this */
    _Static_assert(PS_AUTH_MAC_LEN == crypto_auth_hmacsha256_BYTES, "HMAC-SHA256 is 32 bytes");
    return crypto_verify_32(a, b) == 0;
}
