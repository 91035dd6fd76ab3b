#!/usr/bin/python3
"""test_nomem.py - psd out of memory in the middle of an update changes nothing.

psd runs under failalloc.c, an LD_PRELOAD shim whose aligned_alloc (psd's
parameter blocks, and nothing else) fails on demand while a trigger file
exists. An admin connection pins a snapshot (ADMIN pin), so every update
needs a fresh copy of each block it writes.

- ASGD, a model of two blocks and a push across their edge (applied on the
  loop): with one allocation to spare, the first block's copy is had and
  the second's is not. The push is answered NOMEM and neither block has
  changed (psd reserves every copy before it writes any); the pinned
  snapshot still has its values; once memory is back the same push is
  applied (plain SGD at lr 0.5: exact values).
- BSP: the round whose update cannot get its block stays open, both
  pushpulls wait and psd says why in its log; once memory is back psd's
  tick closes it and both get the same exact result, one version on.
"""

import os
import select
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_NOMEM, T_ADMIN, T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL,  # noqa: E402
                     RawClient, expect_error)

BLK = 1 << 20                   # psd's block, in floats
LAYOUT = [["w", [3000]]]        # one block (BSP)
TOTAL = harness.layout_size(LAYOUT)
LAYOUT2 = [["w", [BLK + 4000]]]  # two blocks (ASGD)
TOTAL2 = BLK + 4000
TIMEOUT = 10.0
FAILALLOC = None  # the shim, from --failalloc


class NomemTest(unittest.TestCase):
    def start(self, cl, mode, workers):
        self.trigger = os.path.join(cl.dir, "no-memory")
        env = dict(os.environ, LD_PRELOAD=FAILALLOC, PSD_FAILALLOC_FILE=self.trigger,
                   ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
        # plain SGD at lr 0.5: w - 0.5 * g is exact in float32 for these values
        return cl.psd(mode=mode, workers=workers, env=env,
                      args=("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0",
                            "--set", "warmup_versions=0", "--set", "checkpoint_interval=0"))

    def memory(self, available, spare=0):
        """available: as usual; else spare more block allocations, then none."""
        if available:
            os.unlink(self.trigger)
        else:
            with open(self.trigger, "w") as f:
                f.write("%d\n" % spare)

    def pull(self, c, off, n):
        r = c.request({"t": T_PULL, "off": off, "len": n})
        self.assertEqual(r.get("t"), T_PARAMS, r)
        return r["ver"], np.frombuffer(r["data"], dtype="<f4")

    def test_asgd_push_refused_whole(self):
        init = np.arange(TOTAL2, dtype="<f4") / 8
        off, n = BLK - 1000, 2000  # across the edge of blocks 0 and 1; under 2^19: on the loop
        g = np.full(n, 2.0, dtype="<f4")
        with harness.Cluster("psd-nomem-asgd") as cl:
            psd = self.start(cl, "asgd", 1)
            with RawClient(psd.addr, TIMEOUT) as w, RawClient(psd.addr, TIMEOUT) as a:
                r = w.hello_worker(LAYOUT2, 0, 1)
                self.assertTrue(r.get("init"), r)
                for o, m, fin in ((0, BLK, False), (BLK, TOTAL2 - BLK, True)):
                    r = w.request({"t": T_INIT, "off": o, "data": init[o:o + m].tobytes(), "fin": fin})
                    self.assertEqual(r.get("t"), T_OK, r)
                a.hello_admin()
                r = a.request({"t": T_ADMIN, "cmd": "pin"})
                self.assertEqual((r.get("t"), r.get("ver")), (T_OK, 0), r)

                self.memory(False, spare=1)  # block 0's copy, not block 1's
                r = w.request({"t": T_PUSH, "base": 0, "off": off, "data": g.tobytes()})
                expect_error(self, r, E_NOMEM, "a push whose second block cannot be copied")
                ver, vals = self.pull(w, off, n)
                self.assertEqual(ver, 0)
                np.testing.assert_array_equal(vals, init[off:off + n], "the refused push changed the model")
                self.assertIn("out of memory for a copy of a model block", psd.stderr())

                self.memory(True)
                r = w.request({"t": T_PUSH, "base": 0, "off": off, "data": g.tobytes()})
                self.assertEqual((r.get("t"), r.get("ver")), (T_OK, 1), r)
                ver, vals = self.pull(w, 0, TOTAL2)
                self.assertEqual(ver, 1)
                want = init.copy()
                want[off:off + n] -= 1.0
                np.testing.assert_array_equal(vals, want)
                # the pinned snapshot kept its values throughout
                ver, vals = self.pull(a, 0, TOTAL2)
                self.assertEqual(ver, 0)
                np.testing.assert_array_equal(vals, init)
            psd.stop()

    def test_bsp_round_waits_for_memory(self):
        init = np.arange(TOTAL, dtype="<f4") / 8
        grads = [np.full(TOTAL, 1.0, dtype="<f4"), np.full(TOTAL, 3.0, dtype="<f4")]
        with harness.Cluster("psd-nomem-bsp") as cl:
            psd = self.start(cl, "bsp", 2)
            with RawClient(psd.addr, TIMEOUT) as w0, RawClient(psd.addr, TIMEOUT) as w1, \
                    RawClient(psd.addr, TIMEOUT) as a:
                r = w0.hello_worker(LAYOUT, 0, 2)
                self.assertTrue(r.get("init"), r)
                self.assertEqual(w0.request({"t": T_INIT, "off": 0, "data": init.tobytes()}).get("t"), T_OK)
                w1.hello_worker(LAYOUT, 1, 2)
                a.hello_admin()
                self.assertEqual(a.request({"t": T_ADMIN, "cmd": "pin"}).get("t"), T_OK)

                self.memory(False)
                for k, c in enumerate((w0, w1)):
                    c.send_frame({"t": T_PUSHPULL, "id": 100 + k, "base": 0, "off": 0, "data": grads[k].tobytes(),
                                  "poff": 0, "plen": TOTAL, "min": 1})
                harness.wait_until(lambda: "it stays open" in psd.stderr(), TIMEOUT,
                                   "psd to log that the round cannot close")
                # a second of psd's ticks: still no answer, the model unchanged
                readable, _, _ = select.select([w0.sock, w1.sock], [], [], 1.0)
                self.assertEqual(readable, [], "a pushpull was answered while the round could not close")
                self.assertEqual(harness.status(psd.addr)["version"], 0)

                self.memory(True)
                want = init - 0.5 * (grads[0] + grads[1]) / 2
                for k, c in enumerate((w0, w1)):
                    r = c.recv_frame(TIMEOUT)
                    self.assertEqual((r.get("t"), r.get("id"), r.get("ver")), (T_PARAMS, 100 + k, 1), r)
                    np.testing.assert_array_equal(np.frombuffer(r["data"], dtype="<f4"), want)
                self.assertEqual(harness.status(psd.addr)["rounds"], 1)
            psd.stop()


if __name__ == "__main__":
    def extra(p):
        p.add_argument("--failalloc", required=True, help="the failalloc.so shim (built with the tests)")
    FAILALLOC = os.path.abspath(harness.parse_args(extra).failalloc)
    harness.main()
