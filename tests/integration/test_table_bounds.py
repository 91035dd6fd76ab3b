#!/usr/bin/python3
"""test_table_bounds.py - bounded memory per embedding table (proto/PROTOCOL.md
13.8): admission, expiry, a cap per table with eviction or refusal.

Raw clients, written from the protocol with Python's msgpack and NumPy,
against the real psd:

- Admission at the 2nd push and expiry after 5 pushes: a key pushed once
  has no row (its pull answers the initial row, psd's status counts the push
  as filtered); its 2nd push stores it; a row not pushed in 5 pushes to its
  table is dropped and its pull answers the initial row again. Each count is
  in STATUS, in psctl status's line and in the metrics (promtool-checked).
- table_memory 640K with table_full = evict: 150 pushes of 500 new keys each
  all succeed, the table never passes the cap, the evictions are counted
  and the keys of the last push are all there; with refuse the push past
  the cap is LIMIT naming table_memory, nothing changed, the connection
  open.
- A table_memory smaller than a table's first row: its TABLE is LIMIT with
  the reason; psd goes on serving.
- Expiry across a restart: a checkpoint keeps each row's last-push clock and
  the table's clock (format 3), so after kill -9 and a restart a row that
  was already 4 pushes old goes after 2 more pushes, not 6; and the same
  checkpoint rewritten as format 2 (no clocks, as a psd before them wrote)
  still loads, its rows counted as pushed at the restart.
"""

import os
import struct
import sys
import unittest
import zlib

import msgpack
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import E_LIMIT, T_INIT, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

TIMEOUT = 10.0
LAYOUT = [["w", [4]]]


def keys(ks):
    return struct.pack("<%dQ" % len(ks), *ks)


class BoundsTest(unittest.TestCase):
    def worker(self, psd, init=True):
        w = RawClient(psd.addr, TIMEOUT)
        r = w.hello_worker(LAYOUT, 0, 1)
        self.assertEqual(r.get("t"), harness.T_WELCOME, r)
        if not init:  # a psd that resumed a checkpoint has the model's values
            return w
        self.assertEqual(w.request({"t": T_INIT, "off": 0, "data": np.zeros(4, np.float32).tobytes()}).get("t"),
                         T_OK)
        return w

    def ok(self, w, msg):
        r = w.request(msg)
        self.assertEqual(r.get("t"), T_OK, r)

    def push(self, w, ks, dim, v=0.5):
        self.ok(w, {"t": T_TPUSH, "tab": "emb", "keys": keys(ks), "base": 0,
                    "data": np.full((len(ks), dim), v, np.float32).tobytes()})

    def pull(self, w, ks, dim):
        r = w.request({"t": T_TPULL, "tab": "emb", "keys": keys(ks)})
        self.assertEqual(r.get("t"), T_ROWS, r)
        return np.frombuffer(r["data"], np.float32).reshape(len(ks), dim).copy()

    def table(self, psd, admin=None):
        """Table emb's row of psd's status: psctl status --json's, or the
        STATUS reply's body on an admin connection (no psctl started)."""
        if admin is None:
            st = harness.status(psd.addr)
        else:
            r = admin.request({"t": harness.T_STATUS})
            self.assertEqual(r.get("t"), harness.T_STATUS_REPLY, r)
            st = r["body"]
        return [t for t in st["tables"] if t["name"] == "emb"][0]

    def test_admission_and_expiry(self):
        with harness.Cluster("test-bounds-admit") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "table_admit=2", "--set", "table_expire=5"))
            w = self.worker(psd)
            self.ok(w, {"t": T_TABLE, "tab": "emb", "dim": 2, "rinit": "uniform", "scale": 0.1, "seed": 4,
                        "opt": "sgd"})
            init = self.pull(w, [1, 2, 3], 2)
            self.push(w, [1, 2], 2)                     # clock 1: counted, not stored
            np.testing.assert_array_equal(self.pull(w, [1, 2], 2), init[:2])
            t = self.table(psd)
            self.assertEqual((t["rows"], t["filtered"], t["admitted"], t["rows_pushed"]), (0, 2, 0, 0))
            self.push(w, [1], 2)                        # clock 2: key 1 stored, its 2nd push applied
            got = self.pull(w, [1, 2], 2)
            np.testing.assert_allclose(got[0], init[0] - 0.01 * 0.5, rtol=1e-6)
            np.testing.assert_array_equal(got[1], init[1])
            t = self.table(psd)
            self.assertEqual((t["rows"], t["filtered"], t["admitted"], t["rows_pushed"]), (1, 2, 1, 1))
            for _ in range(2):
                self.push(w, [3], 2)                    # clocks 3, 4: key 3 stored at its 2nd
            for _ in range(3):
                self.push(w, [3], 2)                    # clocks 5..7: key 1 untouched for 5 pushes
            self.assertEqual(self.table(psd)["rows"], 2)
            self.push(w, [3], 2)                        # clock 8: untouched for 6, past 5: dropped
            t = self.table(psd)
            self.assertEqual((t["rows"], t["expired"]), (1, 1))
            np.testing.assert_array_equal(self.pull(w, [1], 2)[0], init[0])
            r = harness.psctl(psd.addr, "status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("rows admitted 2 (pushes filtered 3), expired 1, evicted 0", r.stdout)
            text = harness.metrics(psd.addr)
            harness.promtool_check(self, text)
            samples, _ = harness.parse_prometheus(text)
            self.assertEqual(harness.metric(samples, "psd_table_rows_admitted_total", table="emb"), 2)
            self.assertEqual(harness.metric(samples, "psd_table_pushes_filtered_total", table="emb"), 3)
            self.assertEqual(harness.metric(samples, "psd_table_rows_expired_total", table="emb"), 1)
            self.assertEqual(harness.metric(samples, "psd_table_rows_evicted_total", table="emb"), 0)
            w.close()
            psd.stop()

    def test_cap_with_eviction_and_refusal(self):
        cap = 640 << 10
        for full in ("evict", "refuse"):
            with harness.Cluster("test-bounds-" + full) as cl:
                psd = cl.psd(mode="asgd", workers=1,
                             args=("--set", "table_memory=640K", "--set", "table_full=" + full))
                w = self.worker(psd)
                self.ok(w, {"t": T_TABLE, "tab": "emb", "dim": 8, "rinit": "zeros", "opt": "sgd"})
                # the table's bytes after every push, from an admin
                # connection: 150 psctl runs took 15 s under the sanitizers
                admin = RawClient(psd.addr, TIMEOUT)
                admin.hello_admin()
                refused = None
                for p in range(150):
                    ks = list(range(500 * p, 500 * (p + 1)))
                    r = w.request({"t": T_TPUSH, "tab": "emb", "keys": keys(ks), "base": 0,
                                   "data": np.full((500, 8), 1.0, np.float32).tobytes()})
                    t = self.table(psd, admin)
                    self.assertLessEqual(t["bytes"], cap)
                    if r.get("t") != T_OK:
                        refused = (p, r, t)
                        break
                if full == "evict":
                    self.assertIsNone(refused)
                    t = self.table(psd)
                    self.assertEqual(t["evicted"] + t["rows"], 75000)
                    self.assertGreater(t["evicted"], 50000)
                    rows = self.pull(w, list(range(74500, 75000)), 8)
                    np.testing.assert_allclose(rows, -0.01)  # the last push's rows, all stored
                    self.assertIn("evicted %d" % t["evicted"], harness.psctl(psd.addr, "status").stdout)
                else:
                    self.assertIsNotNone(refused)
                    p, r, t = refused
                    harness.expect_error(self, r, E_LIMIT, "past the cap")
                    self.assertIn("past table_memory (655360 bytes", r["text"])
                    self.assertEqual(t["evicted"], 0)
                    self.assertEqual(t["rows"], 500 * p)  # nothing of the refused push
                    np.testing.assert_array_equal(self.pull(w, [500 * p], 8), 0)
                    self.push(w, [0], 8)  # stored rows still take pushes: the connection is open
                admin.close()
                w.close()
                psd.stop()

    def test_cap_smaller_than_a_row(self):
        with harness.Cluster("test-bounds-small") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "table_memory=1K"))
            w = self.worker(psd)
            r = w.request({"t": T_TABLE, "tab": "emb", "dim": 8, "rinit": "zeros", "opt": "sgd"})
            harness.expect_error(self, r, E_LIMIT, "cap below a row")
            self.assertIn("table 'emb': table_memory (1024 bytes) is smaller than the table's first row takes",
                          r["text"])
            self.assertEqual(harness.status(psd.addr)["tables"], [])
            r = w.request({"t": harness.T_PULL, "off": 0, "len": 4})  # psd goes on
            self.assertEqual(r.get("t"), harness.T_PARAMS, r)
            w.close()
            psd.stop()

    def ckpt_as_format2(self, path):
        """Rewrites checkpoint `path` (format 3) as format 2: the tables'
        clocks out of the header, each table's row clocks out of the body."""
        with open(path, "rb") as f:
            data = f.read()
        magic, fmt, hlen = data[:8], *struct.unpack("<II", data[8:16])
        self.assertEqual(fmt, 3)
        head = msgpack.unpackb(data[16:16 + hlen], raw=False, strict_map_key=False)
        n = sum(int(np.prod(shape)) for _, shape in head["layout"])
        at = 16 + hlen + (1 + len(head["state"])) * n * 4
        body = data[16 + hlen:at]
        for t in head["tables"]:
            self.assertIn("clock", t)
            del t["clock"]
            rows = t["rows"] * (8 + 4 * t["floats"])
            body += data[at:at + rows]
            at += rows + 8 * t["rows"]
        self.assertEqual(at, len(data) - 8)
        h = msgpack.packb(head, use_bin_type=True)
        out = magic + struct.pack("<II", 2, len(h)) + h + body
        out += struct.pack("<I", zlib.crc32(out)) + data[-4:]
        with open(path, "wb") as f:
            f.write(out)

    def test_expiry_after_restart(self):
        with harness.Cluster("test-bounds-restart") as cl:
            state = os.path.join(cl.dir, "state")
            args = ("--state-dir", state, "--set", "checkpoint_interval=0", "--set", "table_expire=5")
            psd = cl.psd(mode="asgd", workers=1, args=args)
            w = self.worker(psd)
            decl = {"t": T_TABLE, "tab": "emb", "dim": 2, "rinit": "uniform", "scale": 0.1, "seed": 4,
                    "opt": "sgd"}
            self.ok(w, decl)
            init = self.pull(w, [1], 2)
            self.push(w, [1], 2)                        # clock 1: key 1's last push
            for _ in range(3):
                self.push(w, [2], 2)                    # clocks 2..4
            with RawClient(psd.addr, TIMEOUT) as a:
                a.hello_admin()
                self.assertEqual(a.request({"t": harness.T_ADMIN, "cmd": "checkpoint"}).get("t"), T_OK)
            os.kill(psd.pid, 9)
            psd.wait(10)
            w.close()
            ckpt = [f for f in os.listdir(state) if f.endswith(".psdc")]
            self.assertEqual(len(ckpt), 1, ckpt)

            psd = cl.psd(mode="asgd", workers=1, args=args, name="psd2")
            w = self.worker(psd, init=False)
            self.ok(w, decl)
            self.assertEqual(self.table(psd)["rows"], 2)
            self.push(w, [2], 2)                        # clock 5: key 1 untouched for 4 pushes
            self.assertEqual(self.table(psd)["rows"], 2)
            self.push(w, [2], 2)                        # clock 6: for 5: kept
            self.assertEqual(self.table(psd)["rows"], 2)
            self.push(w, [2], 2)                        # clock 7: for 6, past 5: dropped
            t = self.table(psd)
            self.assertEqual((t["rows"], t["expired"]), (1, 1), "key 1 counted fresh after the restart")
            np.testing.assert_array_equal(self.pull(w, [1], 2)[0], init[0])
            w.close()
            os.kill(psd.pid, 9)
            psd.wait(10)

            # the first checkpoint as a psd before the clocks wrote it: it
            # loads, the rows as they were, each counted as pushed at clock 0
            self.ckpt_as_format2(os.path.join(state, ckpt[0]))
            for f in os.listdir(state):
                if f.endswith(".psdc") and f != ckpt[0]:
                    os.unlink(os.path.join(state, f))
            psd = cl.psd(mode="asgd", workers=1, args=args, name="psd3")
            self.assertRegex(psd.stderr(), r"loaded checkpoint \S+%s" % ckpt[0])
            w = self.worker(psd, init=False)
            self.ok(w, decl)
            self.assertEqual(self.table(psd)["rows"], 2)
            np.testing.assert_allclose(self.pull(w, [1], 2)[0], init[0] - 0.01 * 0.5, rtol=1e-6)
            for _ in range(5):
                self.push(w, [2], 2)                    # clocks 1..5: key 1 at clock 0, untouched for 5
            self.assertEqual(self.table(psd)["rows"], 2)
            self.push(w, [2], 2)                        # clock 6: past 5: dropped
            self.assertEqual(self.table(psd)["rows"], 1)
            w.close()
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
