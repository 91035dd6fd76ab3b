#!/usr/bin/python3
"""test_park_memory.py - the keys of table pulls waiting for a model
version (parked) count against max_receive_memory: psd's peak memory with
several connections parking pulls stays within the bound, and psd keeps
serving the other workers.

    test_park_memory.py [harness options] [unittest options]

Four connections each send 64 table pulls of 65,536 keys (512 KiB of keys
each, 32 MiB a connection, 128 MiB in all) for a model version that never
comes. With max_receive_memory = 16M, the waiting keys may take half of it
(docs/configuration.md): psd parks pulls up to that and refuses the rest
with LIMIT; its peak RSS (VmHWM) grows by less than the bound plus the
test's slack (PSD_TEST_RSS_SLACK_MB), where before it grew by the 128 MiB
of keys. A worker meanwhile pulls and pushes rows as before; once the
parking connections close, their keys are given back and a pull parks
again.
"""

import os
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import E_LIMIT, T_ERROR, T_INIT, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

LAYOUT = [["w", [4]]]
BUDGET_MB = 16
CONNS = 4
PULLS = 64        # a connection's parked pulls at most (SRV_PARKED_MAX)
NKEYS = 65536     # a table pull's keys at most
NEVER = 10 ** 12  # a model version that does not come
RSS_SLACK_KB = int(os.environ.get("PSD_TEST_RSS_SLACK_MB", "50")) * 1024


def keys(ks):
    return struct.pack("<%dQ" % len(ks), *ks)


def hwm_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM for psd")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for psd")


class ParkMemoryTest(unittest.TestCase):
    def hello(self, psd, shard, nshards):
        w = RawClient(psd.addr, 30)
        r = w.hello_worker(LAYOUT, shard, nshards)
        self.assertEqual(r.get("t"), harness.T_WELCOME, r)
        return w

    def park(self, w, first_id, n, base):
        """Sends n pulls of NKEYS keys for version NEVER, then a pull that
        is answered at once; returns the replies before that one's (the
        refused parkings) by id."""
        for i in range(n):
            ks = np.arange(base + i * NKEYS, base + (i + 1) * NKEYS, dtype="<u8").tobytes()
            w.send_frame({"t": T_TPULL, "id": first_id + i, "tab": "emb", "keys": ks, "min": NEVER})
        sync = first_id + n
        w.send_frame({"t": T_TPULL, "id": sync, "tab": "emb", "keys": keys([1])})
        refused = {}
        while True:
            r = w.recv_frame(30)
            if r.get("id") == sync:
                self.assertEqual(r.get("t"), T_ROWS, r)
                return refused
            self.assertEqual(r.get("t"), T_ERROR, r)
            refused[r["id"]] = r

    def test_parked_keys_within_max_receive_memory(self):
        with harness.Cluster("psd-park-memory") as cl:
            psd = cl.psd(mode="asgd", workers=CONNS + 2,
                         args=["--set", "max_receive_memory=%dM" % BUDGET_MB])
            w = self.hello(psd, 0, CONNS + 2)
            self.assertEqual(w.request({"t": T_INIT, "off": 0, "data": np.zeros(4, np.float32).tobytes()}).get("t"),
                             T_OK)
            r = w.request({"t": T_TABLE, "tab": "emb", "dim": 4, "rinit": "uniform", "scale": 0.1, "seed": 3,
                           "opt": "sgd"})
            self.assertEqual(r.get("t"), T_OK, r)
            before = rss_kb(psd.pid)
            hostile = [self.hello(psd, 1 + k, CONNS + 2) for k in range(CONNS)]
            parked = refused = 0
            for k, h in enumerate(hostile):
                ref = self.park(h, 1000, PULLS, (k + 1) << 32)
                for r in ref.values():
                    self.assertEqual(r.get("code"), E_LIMIT, r)
                    self.assertIn("max_receive_memory", r.get("text", ""), r)
                refused += len(ref)
                parked += PULLS - len(ref)
                # the worker is served between the parkings
                r = w.request({"t": T_TPULL, "tab": "emb", "keys": keys([5, 6])})
                self.assertEqual(r.get("t"), T_ROWS, r)
            peak = hwm_kb(psd.pid)
            growth = peak - before
            sys.stderr.write("\n%d connections asked to park %d pulls of %d KiB of keys: %d parked, %d refused; "
                             "psd's peak RSS grew by %d KiB (max_receive_memory %d MiB)\n" %
                             (CONNS, CONNS * PULLS, NKEYS * 8 // 1024, parked, refused, growth, BUDGET_MB))
            # waiting keys may take half the bound: 16 of 512 KiB pulls
            self.assertEqual(parked, BUDGET_MB * 1024 * 1024 // 2 // (NKEYS * 8))
            self.assertGreater(refused, 0)
            self.assertLess(growth, BUDGET_MB * 1024 + RSS_SLACK_KB,
                            "psd's peak RSS grew by %d KiB with %d parked pulls" % (growth, parked))
            # the other workers are served: a push and a pull of rows, and a
            # new worker's pull of as many keys as a pull may have
            r = w.request({"t": T_TPUSH, "tab": "emb", "keys": keys([5, 6]), "base": 0,
                           "data": np.full((2, 4), 0.5, np.float32).tobytes()})
            self.assertEqual(r.get("t"), T_OK, r)
            w2 = self.hello(psd, CONNS + 1, CONNS + 2)
            r = w2.request({"t": T_TPULL, "tab": "emb", "keys": np.arange(NKEYS, dtype="<u8").tobytes()})
            self.assertEqual(r.get("t"), T_ROWS, r)
            self.assertEqual(len(r["data"]), NKEYS * 4 * 4)
            # the parking connections gone, their keys are given back: a
            # pull parks again
            for h in hostile:
                h.close()
            harness.wait_until(lambda: not [x for x in harness.status(psd.addr)["workers"]
                                             if 1 <= x["shard"] <= CONNS and x["state"] == "connected"],
                               10, "psd to see the parking connections closed")
            self.assertEqual(self.park(w2, 5000, 1, 9 << 32), {})
            w.close()
            w2.close()
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
