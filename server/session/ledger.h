/* ledger.h - FOR TESTS ONLY (ledger.c): with PSD_TEST_LEDGER=DIR in psd's
 * environment, every push psd applies is appended, in the order it applied
 * them, to DIR/ledger-PID.bin, for tests/client/test_ledger.py to replay
 * into a fresh psd. Without it each call is one test of a flag. */
#ifndef SRV_SESSION_LEDGER_H
#define SRV_SESSION_LEDGER_H

#include <stdint.h>

#include "server/store/psd.h"

/* A dense push applied: client cid's push pid (0 and 0 without ids), its
 * range [off, off + n) and gradient g, as psd applied it. */
void srv_ledger_dense(psd *s, uint64_t cid, uint64_t pid, uint64_t off, uint64_t n, const float *g);

/* A table push applied (or handed to the apply threads): table ti's n keys
 * (a "keys" bin) and their row gradients (n x dim floats). */
void srv_ledger_rows(psd *s, uint64_t cid, uint64_t pid, uint32_t ti, const uint8_t *keys, uint32_t n,
                     const float *g);

#endif
