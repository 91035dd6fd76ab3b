/* auth.h - the shared secret and the challenge-response that proves it
 * (proto/PROTOCOL.md section 7.1), for psd, psworker and psctl.
 *
 * The secret never crosses the wire. psd answers a HELLO with a CHALLENGE
 * carrying a random nonce; the client answers AUTH with its own nonce and
 * proof = HMAC-SHA256(secret, "psd-auth-v1" || nonce || cnonce || role ||
 * fp as 8 bytes LE || k as 4 bytes LE || m as 4 bytes LE), which binds what
 * its HELLO claimed; psd answers WELCOME with sproof =
 * HMAC-SHA256(secret, "psd-auth-v1-server" || cnonce || nonce), so the
 * client knows psd holds the secret too. libsodium supplies the HMAC, the
 * random bytes and the constant-time comparison.
 *
 * Functions return 0 or a negative PS_E* code and write a message for a
 * person into err. */
#ifndef PS_AUTH_H
#define PS_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

#define PS_TOKEN_MIN 16   /* shortest secret accepted, in bytes */
#define PS_TOKEN_MAX 1024 /* longest */

/* A secret as read from a token file: len bytes, any values. */
typedef struct ps_token {
    uint8_t b[PS_TOKEN_MAX];
    size_t len; /* 0: no token */
} ps_token;

/* Prepares libsodium (sodium_init). Safe to call more than once and from
 * several threads. Returns 0 or PS_EIO when libsodium cannot start. */
int ps_auth_init(void);

/* Reads the secret in the file at path into t, without its trailing
 * newline ("\n" or "\r\n", any number of them). Refuses, with a message
 * naming the file and the fix: a file that cannot be opened or is not a
 * regular file (PS_EIO); one the group or others may read or write (mode &
 * 077, PS_EINVAL); one whose secret is empty, shorter than PS_TOKEN_MIN or
 * longer than PS_TOKEN_MAX bytes (PS_EINVAL). On error t is left empty. */
int ps_token_load(const char *path, ps_token *t, char *err, size_t errlen);

/* Wipes the secret (sodium_memzero) and marks t empty. */
void ps_token_clear(ps_token *t);

/* Fills buf with n random bytes (randombytes_buf). ps_auth_init first. */
void ps_auth_random(uint8_t *buf, size_t n);

/* The client's proof for a HELLO, keyed with the secret key[0..keylen):
 * role, the fingerprint of its layout (0 without one) and its shard k and m
 * (0 and 0 without one) are read from hello. out receives PS_AUTH_MAC_LEN
 * bytes. */
void ps_auth_client_proof(const uint8_t *key, size_t keylen, const uint8_t nonce[PS_AUTH_NONCE_LEN],
                          const uint8_t cnonce[PS_AUTH_NONCE_LEN], const ps_msg *hello,
                          uint8_t out[PS_AUTH_MAC_LEN]);

/* psd's proof in its WELCOME. */
void ps_auth_server_proof(const uint8_t *key, size_t keylen, const uint8_t cnonce[PS_AUTH_NONCE_LEN],
                          const uint8_t nonce[PS_AUTH_NONCE_LEN], uint8_t out[PS_AUTH_MAC_LEN]);

/* 1 when the two MACs are equal, compared in constant time; else 0. */
int ps_auth_mac_equal(const uint8_t a[PS_AUTH_MAC_LEN], const uint8_t b[PS_AUTH_MAC_LEN]);

#endif
