/* test_auth.c - unit tests for common/auth.c: token files and the HMAC
 * proofs of the challenge-response (proto/PROTOCOL.md section 7.1). The
 * expected MACs were computed with Python's hmac and hashlib, an
 * implementation other than libsodium:
 *
 *   hmac.new(key, b"psd-auth-v1" + nonce + cnonce + b"worker" +
 *            struct.pack("<QII", fp, k, m), hashlib.sha256) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/auth.h"
#include "proto/errors.h"

static const char key[] = "0123456789abcdef-secret";

static void hex(const char *h, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(h + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

static void nonces(uint8_t *nonce, uint8_t *cnonce)
{
    for (int i = 0; i < PS_AUTH_NONCE_LEN; i++)
        nonce[i] = (uint8_t)i, cnonce[i] = (uint8_t)(100 + i);
}

static void test_client_proof_worker(void **state)
{
    (void)state;
    ps_layout l;
    ps_layout_init(&l);
    assert_int_equal(ps_layout_add(&l, "w", 2, (const uint32_t[]){2, 3}), 0);
    assert_int_equal(ps_layout_add(&l, "b", 1, (const uint32_t[]){3}), 0);
    ps_msg hello;
    ps_msg_init(&hello, PS_MSG_HELLO);
    hello.has = PS_F_VERSION | PS_F_ROLE | PS_F_SHARD | PS_F_LAYOUT;
    hello.role = PS_ROLE_WORKER, hello.shard = 3, hello.nshards = 4, hello.layout = &l;
    uint8_t nonce[32], cnonce[32], got[32], want[32];
    nonces(nonce, cnonce);
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, got);
    hex("94439edeba305468b982c4e65c7741e656a39674f2f4460d21db400a14d479ed", want, 32);
    assert_memory_equal(got, want, 32);
    assert_true(ps_auth_mac_equal(got, want));
    /* every claim is bound: another shard, count, layout or role, another MAC */
    uint8_t other[32];
    hello.shard = 2;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    hello.shard = 3, hello.nshards = 5;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    hello.nshards = 4, hello.role = PS_ROLE_ADMIN;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    hello.role = PS_ROLE_WORKER;
    assert_int_equal(ps_layout_add(&l, "c", 1, (const uint32_t[]){1}), 0);
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    /* and so are both nonces and the key */
    l.ntensors--, l.total--;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_true(ps_auth_mac_equal(got, other));
    cnonce[31] ^= 1;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    cnonce[31] ^= 1, nonce[0] ^= 0x80;
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
    nonce[0] ^= 0x80;
    ps_auth_client_proof((const uint8_t *)key, strlen(key) - 1, nonce, cnonce, &hello, other);
    assert_false(ps_auth_mac_equal(got, other));
}

static void test_client_proof_admin(void **state)
{
    (void)state;
    ps_msg hello;
    ps_msg_init(&hello, PS_MSG_HELLO);
    hello.has = PS_F_VERSION | PS_F_ROLE;
    hello.role = PS_ROLE_ADMIN;
    uint8_t nonce[32], cnonce[32], got[32], want[32];
    nonces(nonce, cnonce);
    ps_auth_client_proof((const uint8_t *)key, strlen(key), nonce, cnonce, &hello, got);
    hex("1221c56c1cdf608cd035beee2bffc452f5ef31e73c825e239de1cd84e3168273", want, 32);
    assert_memory_equal(got, want, 32);
}

static void test_server_proof(void **state)
{
    (void)state;
    uint8_t nonce[32], cnonce[32], got[32], want[32];
    nonces(nonce, cnonce);
    ps_auth_server_proof((const uint8_t *)key, strlen(key), cnonce, nonce, got);
    hex("5dc76e2c057ebe60823f80d2fa208455dc39ee1fae09622a6dd369a3a2202bbe", want, 32);
    assert_memory_equal(got, want, 32);
    want[17] ^= 4;
    assert_false(ps_auth_mac_equal(got, want));
}

/* ---- token files ---- */

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/psd-test-auth-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes n bytes of text to a file in dir with the given mode; returns its path. */
static const char *token_file(const char *name, const void *text, size_t n, mode_t mode)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode), 0);
    return path;
}

static void expect_refused(const char *path, int code, const char *needle)
{
    ps_token t;
    char err[512] = "";
    t.len = 99;
    assert_int_equal(ps_token_load(path, &t, err, sizeof err), code);
    assert_int_equal(t.len, 0);
    if (!strstr(err, needle))
        fail_msg("'%s' does not contain '%s'", err, needle);
    if (!strstr(err, path))
        fail_msg("'%s' does not name the file", err);
}

static void test_token_load(void **state)
{
    (void)state;
    ps_token t;
    char err[512];
    const char *p = token_file("ok", "0123456789abcdef\n", 17, 0600);
    assert_int_equal(ps_token_load(p, &t, err, sizeof err), 0);
    assert_int_equal(t.len, 16); /* the newline is not part of it */
    assert_memory_equal(t.b, "0123456789abcdef", 16);
    p = token_file("crlf", "0123456789abcdefXY\r\n\n", 21, 0400);
    assert_int_equal(ps_token_load(p, &t, err, sizeof err), 0);
    assert_int_equal(t.len, 18);
    static const uint8_t bin[20] = {0, 1, 2, 0xff, 0, '\n', 7}; /* any bytes, NULs too */
    p = token_file("binary", bin, sizeof bin, 0600);
    assert_int_equal(ps_token_load(p, &t, err, sizeof err), 0);
    assert_int_equal(t.len, sizeof bin);
    assert_memory_equal(t.b, bin, sizeof bin);
    ps_token_clear(&t);
    assert_int_equal(t.len, 0);

    expect_refused(token_file("open", "0123456789abcdef", 16, 0644), PS_EINVAL, "chmod 600");
    expect_refused(token_file("group", "0123456789abcdef", 16, 0640), PS_EINVAL, "mode 0640");
    expect_refused(token_file("gw", "0123456789abcdef", 16, 0620), PS_EINVAL, "others");
    expect_refused(token_file("empty", "", 0, 0600), PS_EINVAL, "is empty");
    expect_refused(token_file("newline", "\n", 1, 0600), PS_EINVAL, "is empty");
    expect_refused(token_file("short", "0123456789abcde\n", 16, 0600), PS_EINVAL, "at least 16");
    static char big[PS_TOKEN_MAX + 1];
    memset(big, 'k', sizeof big);
    expect_refused(token_file("long", big, sizeof big, 0600), PS_EINVAL, "more than 1024");
    p = token_file("max", big, PS_TOKEN_MAX, 0600);
    assert_int_equal(ps_token_load(p, &t, err, sizeof err), 0);
    assert_int_equal(t.len, PS_TOKEN_MAX);
    expect_refused(dir, PS_EIO, "not a regular file");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    expect_refused(missing, PS_EIO, "cannot open");
}

static void test_random(void **state)
{
    (void)state;
    uint8_t a[32] = {0}, b[32] = {0};
    assert_int_equal(ps_auth_init(), 0);
    ps_auth_random(a, sizeof a);
    ps_auth_random(b, sizeof b);
    assert_false(ps_auth_mac_equal(a, b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_proof_worker),
        cmocka_unit_test(test_client_proof_admin),
        cmocka_unit_test(test_server_proof),
        cmocka_unit_test(test_token_load),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
