#!/usr/bin/python3
"""test_tables.py - embedding tables (proto/PROTOCOL.md, section 13).

Raw clients, written from the protocol with Python's msgpack and NumPy,
against the real psd:

- Rows: a TPULL of keys no push reached answers each key's initial row,
  which this test computes from section 13.3's formula on its own (splitmix64
  in Python integers), bit for bit for uniform and zeros; a pull stores
  nothing. TPUSH applies AdaGrad as section 13.4 gives it (checked against
  NumPy) to exactly the keys pushed; TPUSHPULL pushes and answers the rows of
  other keys; keys 0 and 2^64-1 are keys like others.
- Declarations: the same TABLE again is OK, from another worker too; a
  different one is LAYOUT and leaves the connection open; bad ones (dim 0,
  an unknown optimizer, a hyper-parameter the optimizer does not take, ftrl
  with a uniform init, a scale whose rows could overflow float32: uniform
  1e39, normal 1e38) are BAD_FIELD; an admin's TABLE or TPUSH is
  FORBIDDEN, its TPULL is answered; the 65th table is LIMIT.
- Bad input changes nothing and psd goes on (a pull after each shows the
  rows as they were): an unknown table (RANGE), a wrong row dimension, a key
  twice in one push, a base ahead of the model (BAD_FIELD), a NaN row
  gradient (NONFINITE), new rows past max_table_memory (LIMIT, naming the
  table and the setting; a push of stored rows still goes through), and
  frames the decoder refuses: keys of a length that is no multiple of 8,
  empty, or over 65,536 keys, an unknown or non-numeric hyper-parameter, a
  TPUSHPULL without pkeys, bfloat16 rows or rdt 3 (UNSUPPORTED), more than
  2^22 row values, a ROWS from a client (BAD_TYPE).
- A TPULL for a version not reached yet is parked and answered when a dense
  push makes it.
- Durability: tables and their optimizer state are in psd's checkpoints:
  after kill -9 and a restart on the state dir the rows are there before any
  declaration, bit for bit, and pushing on gives the rows a psd that never
  stopped gives (adam's moments and per-row steps, ftrl's z and n).
- psctl save writes each table's rows and keys as safetensors tensors with
  the declarations in the metadata, which NumPy and PyTorch read; psd
  --init-from that file starts with the same tables and rows; a file whose
  table tensors do not match its metadata is refused.
- BSP: a round's table pushes are kept and applied as it closes, each
  key's rows summed over the workers in shard order and divided by the
  round's pushes: the same rows bit for bit whatever the arrival order
  (three orders, against NumPy's float32 sums in shard order); a pull for
  the next version waits for the round; a key twice from one worker in a
  round, or a table push after the worker's step, is DUPLICATE; a push for
  a closed round is STALE (a TPUSHPULL's rows still come). Two pushes of
  -3.4e38 for a key, whose float32 sum overflows, apply their finite mean.
- A table-only job (version 0 throughout) keeps checkpoint_keep
  checkpoints, and a spoiled newest one falls back to the one before.
"""

import csv
import io
import json
import os
import struct
import sys
import unittest
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_BAD_FIELD, E_BAD_TYPE, E_FORBIDDEN, E_LAYOUT, E_LIMIT, E_NONFINITE, E_RANGE,  # noqa: E402
                     E_UNSUPPORTED, T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_ROWS, T_TABLE, T_TPULL, T_TPUSH,
                     T_TPUSHPULL, RawClient, expect_error)

LAYOUT = [["w", [4]]]
TIMEOUT = 10.0
M64 = (1 << 64) - 1


def keys(*k):
    return struct.pack("<%dQ" % len(k), *k)


def floats(*v):
    return struct.pack("<%df" % len(v), *v)


def mix(z):
    """splitmix64's finaliser (PROTOCOL.md 13.3)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def init_row(seed, key, rinit, scale, dim):
    """A row's initial values, as section 13.3 defines them."""
    x = mix(seed ^ mix(key))
    u = [(mix((x + i * 0x9E3779B97F4A7C15) & M64) >> 11) * 2.0 ** -53 for i in range(1, dim + 1)]
    if rinit == "zeros":
        return np.zeros(dim, np.float32)
    return np.array([scale * (2.0 * v - 1.0) for v in u], np.float32)


TABLE = {"t": T_TABLE, "tab": "user_id", "dim": 3, "rinit": "uniform", "scale": 0.05, "seed": 7,
         "opt": "adagrad", "hp": {"lr": 0.5, "iacc": 0.1}}


class Tables(unittest.TestCase):
    def ok(self, c, msg, what):
        r = c.request(msg)
        self.assertEqual(r.get("t"), T_OK, "%s: %r" % (what, r))
        return r

    def refused(self, c, code, msg, what, needle):
        r = c.request(msg)
        expect_error(self, r, code, what)
        self.assertIn(needle, r["text"], what)

    def rows(self, c, tab, ks, dim, **extra):
        r = c.request(dict({"t": T_TPULL, "tab": tab, "keys": keys(*ks)}, **extra))
        self.assertEqual(r.get("t"), T_ROWS, r)
        self.assertNotIn("off", r)
        return np.frombuffer(r["data"], np.float32).reshape(len(ks), dim).copy()

    def worker(self, psd, shard=0, nshards=1, init=True):
        w = RawClient(psd.addr, TIMEOUT)
        r = w.hello_worker(LAYOUT, shard, nshards)
        self.assertEqual(r.get("t"), harness.T_WELCOME, r)
        if init and r.get("init"):
            self.ok(w, {"t": T_INIT, "off": 0, "data": floats(0.5, -1.0, 2.0, 0.25)}, "init")
        return w

    def test_rows_pushes_and_bad_input(self):
        with harness.Cluster("test-tables") as cl:
            psd = cl.psd(mode="asgd", workers=2)
            w = self.worker(psd)
            self.ok(w, TABLE, "declare")
            self.ok(w, TABLE, "declare again")
            ks = [0, 42, M64, 1 << 63]
            got = self.rows(w, "user_id", ks, 3)
            for i, k in enumerate(ks):
                self.assertEqual(got[i].tobytes(), init_row(7, k, "uniform", 0.05, 3).tobytes(), "initial row %x" % k)
            self.assertEqual(harness.status(psd.addr).get("version"), 0)

            # adagrad, section 13.4, in float64 then rounded as psd stores
            g = np.array([[0.5, -1.0, 2.0], [0.25, 0.0, -3.0]], np.float32)
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(42, M64), "base": 0, "data": g.tobytes()},
                    "tpush")
            want = got.copy()
            acc = np.full((2, 3), 0.1, np.float64) + g.astype(np.float64) ** 2
            acc = acc.astype(np.float32).astype(np.float64)
            want[1:3] = (got[1:3].astype(np.float64) - 0.5 * g / (np.sqrt(acc) + 1e-10)).astype(np.float32)
            after = self.rows(w, "user_id", ks, 3)
            np.testing.assert_allclose(after, want, rtol=1e-6, atol=1e-7)
            self.assertEqual(after[0].tobytes(), got[0].tobytes(), "key 0 was not pushed")
            self.assertEqual(after[3].tobytes(), got[3].tobytes(), "key 2^63 was not pushed")

            # tpushpull: push key 0, pull keys 5 and 42
            r = w.request({"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(0), "base": 0,
                           "data": floats(1, 1, 1), "pkeys": keys(5, 42)})
            self.assertEqual(r.get("t"), T_ROWS, r)
            pulled = np.frombuffer(r["data"], np.float32).reshape(2, 3)
            self.assertEqual(pulled[0].tobytes(), init_row(7, 5, "uniform", 0.05, 3).tobytes())
            self.assertEqual(pulled[1].tobytes(), after[1].tobytes())
            now = self.rows(w, "user_id", ks, 3)
            self.assertFalse(np.array_equal(now[0], after[0]), "key 0 was pushed")

            # a second worker declares the same table and sees the same rows
            w2 = self.worker(psd, 1, 2)
            self.ok(w2, TABLE, "second worker declares")
            np.testing.assert_array_equal(self.rows(w2, "user_id", ks, 3), now)

            # declarations that differ or are bad
            self.refused(w2, E_LAYOUT, dict(TABLE, dim=4), "another dim",
                         "table 'user_id' declared as dim 4, uniform(0.05), seed 7, adagrad")
            self.refused(w2, E_LAYOUT, dict(TABLE, hp={"lr": 0.25}), "another lr", "but psd holds it as")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", dim=0), "dim 0", "dim 0 is not in 1..1024")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", opt="rmsprop"), "unknown opt", "unknown opt")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", hp={"beta1": 0.9}), "foreign hp",
                         "hp 'beta1' is not a hyper-parameter of adagrad")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", opt="ftrl", hp={}), "ftrl uniform",
                         "must be zeros")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="a b"), "a name with a space", "printable ASCII")
            # initial rows that could overflow float32 (issue 47: accepted,
            # then pulls of inf and every push NONFINITE)
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", scale=1e39), "uniform scale 1e39",
                         "table 'x': scale 1e+39 is too large for rinit uniform: its values reach scale x 1, which "
                         "must stay a finite float32, so scale must be below 3.4028236e+38")
            self.refused(w2, E_BAD_FIELD, dict(TABLE, tab="x", rinit="normal", scale=1e38), "normal scale 1e38",
                         "scale 1e+38 is too large for rinit normal: its values reach scale x 8.57167435")
            self.refused(w2, E_RANGE, {"t": T_TPULL, "tab": "x", "keys": keys(1)}, "refused tables are not declared",
                         "unknown table 'x'")
            self.ok(w2, dict(TABLE, tab="x", scale=3.4e38), "uniform scale 3.4e38")
            big = self.rows(w2, "x", list(range(64)), 3)
            self.assertTrue(np.isfinite(big).all(), big)
            self.assertGreater(np.abs(big).max(), 1e38)

            # bad pushes: each changes nothing
            bad = [
                (E_RANGE, {"t": T_TPUSH, "tab": "item", "keys": keys(1), "base": 0, "data": floats(1, 2, 3)},
                 "unknown table", "unknown table 'item'"),
                (E_RANGE, {"t": T_TPULL, "tab": "item", "keys": keys(1)}, "pull of an unknown table",
                 "unknown table 'item'"),
                (E_BAD_FIELD, {"t": T_TPUSH, "tab": "user_id", "keys": keys(42, 0), "base": 0,
                               "data": floats(1, 2, 3, 4)}, "wrong dim", "'data' holds 4 values for 2 keys"),
                (E_BAD_FIELD, {"t": T_TPUSH, "tab": "user_id", "keys": keys(42, 0, 42), "base": 0,
                               "data": floats(*[1] * 9)}, "a key twice", "key 42 appears twice (keys 0 and 2)"),
                (E_BAD_FIELD, {"t": T_TPUSH, "tab": "user_id", "keys": keys(42), "base": 9,
                               "data": floats(1, 2, 3)}, "base ahead", "base 9 is ahead of the model"),
                (E_NONFINITE, {"t": T_TPUSH, "tab": "user_id", "keys": keys(42, 0), "base": 0,
                               "data": floats(1, 2, 3, 4, float("nan"), 6)}, "NaN", "contain NaN or infinity"),
                (E_NONFINITE, {"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(42), "base": 0,
                               "data": floats(1, float("inf"), 3), "pkeys": keys(42)}, "inf in a tpushpull",
                 "contain NaN or infinity"),
                (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b"\0" * 12}, "12-byte keys",
                 "'keys' must be a bin of 1..65536 little-endian uint64 keys"),
                (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b""}, "no keys", "'keys' must be a bin"),
                (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b"\0" * 8 * 65537}, "65537 keys",
                 "65537 keys, more than 65536"),
                (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": "12345678"}, "keys as a str",
                 "'keys' must be a bin"),
                (E_BAD_FIELD, dict(TABLE, hp={"momentum": 0.9}), "unknown hp", "unknown hyper-parameter"),
                (E_BAD_FIELD, dict(TABLE, hp={"lr": "0.1"}), "hp a str", "hp 'lr' must be a finite number"),
                (E_BAD_FIELD, {k: v for k, v in TABLE.items() if k != "opt"}, "table without opt",
                 "table: missing field 'opt'"),
                (E_BAD_FIELD, {"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(1), "base": 0,
                               "data": floats(1, 2, 3)}, "tpushpull without pkeys", "missing field 'pkeys'"),
                (E_UNSUPPORTED, {"t": T_TPULL, "tab": "user_id", "keys": keys(1), "dt": 1}, "dt in a tpull",
                 "'dt' 1 (bf16) is not supported here"),
                (E_UNSUPPORTED, {"t": T_TPULL, "tab": "user_id", "keys": keys(1), "rdt": 2}, "rdt 2",
                 "'rdt' 2 (f32z) is not supported here"),
                (E_BAD_FIELD, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1), "base": 0,
                               "data": b"\0" * 4 * ((1 << 22) + 1)}, "2^22 + 1 values",
                 "4194305 row values in one message"),
                (E_BAD_TYPE, {"t": T_ROWS, "ver": 0, "data": floats(1)}, "rows from a client", "rows"),
            ]
            for code, msg, what, needle in bad:
                self.refused(w, code, msg, what, needle)
                self.assertEqual(self.rows(w, "user_id", ks, 3).tobytes(), now.tobytes(), "after " + what)
            # a key twice right after a pull of the same keys, all stored
            # (psd checks through that pull's row hint then): the same
            # refusal, in a tpush and in a tpushpull, nothing changed
            twice = [42, M64, 42]
            for t, extra in ((T_TPUSH, {}), (T_TPUSHPULL, {"pkeys": keys(0)})):
                self.rows(w, "user_id", twice, 3)
                self.refused(w, E_BAD_FIELD, dict({"t": t, "tab": "user_id", "keys": keys(*twice), "base": 0,
                                                   "data": floats(*[1] * 9)}, **extra),
                             "a key twice after its pull", "key 42 appears twice (keys 0 and 2)")
                self.assertEqual(self.rows(w, "user_id", ks, 3).tobytes(), now.tobytes(), "after a key twice")

            # admins read rows, and only read
            with RawClient(psd.addr, TIMEOUT) as a:
                a.hello_admin()
                np.testing.assert_array_equal(self.rows(a, "user_id", ks, 3), now)
                self.refused(a, E_FORBIDDEN, TABLE, "admin table", "is for workers")
                self.refused(a, E_FORBIDDEN, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1), "base": 0,
                                              "data": floats(1, 2, 3)}, "admin tpush", "is for workers")

            # a pull's rows fit one message: 65,536 keys of dim 64 are 2^22 values, of dim 65 too many
            self.ok(w, dict(TABLE, tab="wide", dim=65), "wide")
            many = np.arange(65536, dtype=np.uint64).tobytes()
            self.refused(w, E_BAD_FIELD, {"t": T_TPULL, "tab": "wide", "keys": many}, "rows over 2^22 values",
                         "are 4259840 values, more than 4194304 in one message")
            self.refused(w, E_BAD_FIELD, {"t": T_TPUSHPULL, "tab": "wide", "keys": keys(1), "base": 0,
                                          "data": floats(*[0] * 65), "pkeys": many}, "pulled rows over 2^22 values",
                         "more than 4194304 in one message")
            self.assertEqual(self.rows(w, "wide", [1], 65)[0].tobytes(), init_row(7, 1, "uniform", 0.05, 65).tobytes(),
                             "the refused tpushpull pushed nothing")
            self.ok(w, dict(TABLE, tab="w64", dim=64, rinit="zeros"), "w64")
            r = w.request({"t": T_TPULL, "tab": "w64", "keys": many}, timeout=60)
            self.assertEqual((r.get("t"), len(r["data"])), (T_ROWS, 4 << 22))
            # 64 tables at most: user_id, x, wide, w64 and 60 more
            for i in range(60):
                self.ok(w, dict(TABLE, tab="t%d" % i, dim=1), "table %d" % i)
            self.refused(w, E_LIMIT, dict(TABLE, tab="one_more", dim=1), "65th table",
                         "psd holds 64 tables already")
            w.close()
            w2.close()

    def test_status_and_metrics(self):
        """Per table: rows, memory, rows pulled and pushed (and per second)
        in psctl status, its JSON and the metrics."""
        with harness.Cluster("test-tables-obs") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            w = self.worker(psd)
            self.ok(w, TABLE, "declare")
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1, 2, 3), "base": 0,
                        "data": floats(*[0.5] * 9)}, "push")
            self.rows(w, "user_id", [1, 2, 3, 4], 3)
            st = harness.status(psd.addr)["tables"]
            self.assertEqual(len(st), 1)
            t = st[0]
            self.assertEqual((t["name"], t["dim"], t["rows"], t["rows_pulled"], t["rows_pushed"]),
                             ("user_id", 3, 3, 4, 3))
            self.assertEqual((t["rinit"], t["opt"], t["seed"], t["hp"]["lr"]), ("uniform", "adagrad", 7, 0.5))
            self.assertGreater(t["bytes"], 3 * 6 * 4)
            self.assertIn("rows_pulled_rate", t)
            r = harness.psctl(psd.addr, "status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"table user_id: 3 rows, [0-9.]+ MB, pulled 4 \([0-9]+/s\), pushed 3 "
                                       r"\([0-9]+/s\); dim 3, uniform\(0.05\), seed 7, adagrad lr 0.5")
            text = harness.metrics(psd.addr)
            harness.promtool_check(self, text)
            samples, _ = harness.parse_prometheus(text)
            self.assertEqual(harness.metric(samples, "psd_table_rows", table="user_id"), 3)
            self.assertEqual(harness.metric(samples, "psd_table_rows_pushed_total", table="user_id"), 3)
            self.assertEqual(harness.metric(samples, "psd_table_rows_pulled_total", table="user_id"), 4)
            self.assertEqual(harness.metric(samples, "psd_table_bytes", table="user_id"), t["bytes"])
            w.close()

    def test_odd_table_name_in_metrics_and_csv(self):
        """A legal table name (any printable ASCII but space) holding a
        double quote, a comma, a backslash and markup: escaped in the
        metrics' labels, which promtool accepts from psctl metrics and GET
        /metrics alike; quoted in history's CSV (RFC 4180), whose rows all
        parse to 6 fields."""
        odd = 'q",\\x</script>'
        with harness.Cluster("test-tables-names") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "metrics_listen=127.0.0.1:0"))
            w = self.worker(psd)
            self.ok(w, TABLE, "declare")
            self.ok(w, dict(TABLE, tab=odd), "declare the odd name")
            self.ok(w, {"t": T_TPUSH, "tab": odd, "keys": keys(1, 2), "base": 0, "data": floats(*[0.5] * 6)},
                    "push")
            maddr = harness.status(psd.addr)["metrics_listen"]
            with urllib.request.urlopen("http://%s/metrics" % maddr, timeout=TIMEOUT) as r:
                http = r.read().decode()
            for where, text in (("psctl metrics", harness.metrics(psd.addr)), ("GET /metrics", http)):
                self.assertIn('psd_table_rows{table="q\\",\\\\x</script>"} 2\n', text, where)
                self.assertTrue(harness.promtool_check(self, text), "promtool is needed for this test")
                samples, _ = harness.parse_prometheus(text)
                self.assertEqual(harness.metric(samples, "psd_table_rows", table=odd), 2, where)
                self.assertEqual(harness.metric(samples, "psd_table_rows_pushed_total", table=odd), 2, where)

            def history():
                # psd samples its tables once a second
                r = harness.psctl(psd.addr, "history", "--csv")
                self.assertEqual(r.returncode, 0, r.stderr)
                rows = list(csv.reader(io.StringIO(r.stdout)))
                return rows if any(f[:2] == ["table", odd] for f in rows) else None

            rows = harness.wait_until(history, 10, "a history sample of the table", interval=0.2)
            self.assertEqual(rows[0], ["series", "shard", "t", "version", "column", "value"])
            self.assertEqual({len(f) for f in rows}, {6}, [f for f in rows if len(f) != 6][:3])
            mine = [f for f in rows if f[:2] == ["table", odd]]
            self.assertIn("rows", [f[4] for f in mine])
            self.assertEqual([f[5] for f in mine if f[4] == "rows"][-1], "2")
            w.close()

    def test_parked_pull(self):
        """A TPULL for a version not reached yet waits for it."""
        with harness.Cluster("test-tables-park") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            w = self.worker(psd)
            self.ok(w, dict(TABLE, rinit="zeros", opt="sgd", hp={"lr": 1.0}), "declare")
            w.send_frame({"t": T_TPULL, "id": 50, "tab": "user_id", "keys": keys(3), "min": 1})
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(3), "base": 0, "data": floats(1, 2, 3)},
                    "tpush while the pull waits")
            r = w.request({"t": T_PUSH, "off": 0, "base": 0, "data": floats(0, 0, 0, 0), "id": 51})
            self.assertEqual((r.get("t"), r.get("id")), (T_ROWS, 50), "the parked pull comes first: %r" % r)
            self.assertEqual(r.get("ver"), 1)
            self.assertEqual(np.frombuffer(r["data"], np.float32).tolist(), [-1.0, -2.0, -3.0])
            r = w.recv_frame(TIMEOUT)
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 51), r)
            w.close()

    def test_max_table_memory(self):
        """New rows past max_table_memory: LIMIT, nothing changed, stored
        rows still pushed, another worker goes on."""
        with harness.Cluster("test-tables-mem") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=("--set", "max_table_memory=256K"))
            w = self.worker(psd)
            tab = dict(TABLE, dim=16)
            self.ok(w, tab, "declare")
            # dim 16 adagrad: 144-byte rows in blocks of 1024 (147,456 bytes):
            # the first block fits, a second one does not
            first = list(range(1000))
            g = np.full((1000, 16), 0.01, np.float32)
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*first), "base": 0, "data": g.tobytes()},
                    "1000 rows")
            before = self.rows(w, "user_id", first[:5] + [5000], 16)
            more = list(range(1000, 1100))
            self.refused(w, E_LIMIT, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*(first[:5] + more)), "base": 0,
                                      "data": np.full((105, 16), 1.0, np.float32).tobytes()},
                         "past max_table_memory", "table 'user_id': 100 new rows would take psd's tables to")
            np.testing.assert_array_equal(self.rows(w, "user_id", first[:5] + [5000], 16), before)
            w2 = self.worker(psd, 1, 2)
            self.ok(w2, tab, "second worker")
            self.ok(w2, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*first[:5]), "base": 0,
                         "data": np.full((5, 16), 1.0, np.float32).tobytes()}, "stored rows")
            self.assertFalse(np.array_equal(self.rows(w, "user_id", first[:5], 16), before[:5]))
            w.close()
            w2.close()

    def bsp_round(self, order):
        """One BSP round of 3 workers pushing rows of key 7 (and one key
        each), in the given arrival order; returns the rows after it."""
        with harness.Cluster("test-tables-bsp") as cl:
            psd = cl.psd(mode="bsp", workers=3)
            ws = [self.worker(psd, k, 3) for k in range(3)]
            tab = dict(TABLE, rinit="zeros", opt="sgd", hp={"lr": 1.0})
            for w in ws:
                self.ok(w, tab, "declare")
            # a pull for the round's end waits for it
            ws[0].send_frame({"t": T_TPULL, "id": 77, "tab": "user_id", "keys": keys(7, 100, 101, 102), "min": 1})
            for k in order:
                self.ok(ws[k], {"t": T_TPUSH, "tab": "user_id", "keys": keys(7, 100 + k), "base": 0,
                                "data": self.g(k).tobytes()}, "shard %d's rows" % k)
            # kept, not applied: the rows are still the initial ones
            np.testing.assert_array_equal(self.rows(ws[1], "user_id", [7], 3), np.zeros((1, 3), np.float32))
            # a key twice from one shard in a round
            self.refused(ws[1], harness.E_DUPLICATE, {"t": T_TPUSH, "tab": "user_id", "keys": keys(7), "base": 0,
                                                      "data": floats(1, 1, 1)}, "key 7 again",
                         "pushed key 7 of table 'user_id' twice in round 0")
            for k in order:
                ws[k].send_frame({"t": T_PUSH, "id": 90, "off": 0, "base": 0, "data": floats(0, 0, 0, 0)})
            r = ws[0].recv_frame(TIMEOUT)
            while r.get("id") != 77:
                self.assertEqual(r.get("t"), T_OK, r)
                r = ws[0].recv_frame(TIMEOUT)
            self.assertEqual((r.get("t"), r.get("ver")), (T_ROWS, 1), r)
            got = np.frombuffer(r["data"], np.float32).reshape(4, 3).copy()
            for k in (1, 2):
                self.assertEqual(ws[k].recv_frame(TIMEOUT).get("t"), T_OK)
            # a table push for the closed round: STALE; a tpushpull's rows come all the same
            self.refused(ws[1], harness.E_STALE, {"t": T_TPUSH, "tab": "user_id", "keys": keys(7), "base": 0,
                                                  "data": floats(1, 1, 1)}, "stale", "arrived after it closed")
            r = ws[1].request({"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(7), "base": 0,
                               "data": floats(1, 1, 1), "pkeys": keys(7)})
            self.assertEqual(r.get("t"), T_ROWS, r)
            self.assertEqual(r["data"], got[0].tobytes())
            # after its step is complete, a worker's table push is refused
            r = ws[2].request({"t": T_PUSH, "off": 0, "base": 1, "data": floats(0, 0, 0, 0)})
            self.assertEqual(r.get("t"), T_OK, r)
            self.refused(ws[2], harness.E_DUPLICATE, {"t": T_TPUSH, "tab": "user_id", "keys": keys(8), "base": 1,
                                                      "data": floats(1, 1, 1)}, "after its step",
                         "completed its step of round 1 already")
            for w in ws:
                w.close()
            return got

    def test_bsp_sum_past_float32(self):
        """Two workers each push -3.4e38 for a key: the float32 sum
        overflows, the mean does not; the round applies the mean (issue 47:
        the round's table update was dropped as non-finite)."""
        with harness.Cluster("test-tables-bsp-wide") as cl:
            psd = cl.psd(mode="bsp", workers=2)
            ws = [self.worker(psd, k, 2) for k in range(2)]
            tab = dict(TABLE, rinit="zeros", opt="sgd", hp={"lr": 1.0})
            for w in ws:
                self.ok(w, tab, "declare")
            g = [np.array([[-3.4e38, 1.0, 0.5], [0.1, 0.2, 0.3]], np.float32),
                 np.array([[-3.4e38, 3.0, 0.25], [0.1, 0.2, 0.3]], np.float32)]
            for k in (1, 0):
                self.ok(ws[k], {"t": T_TPUSH, "tab": "user_id", "keys": keys(7, 8), "base": 0,
                                "data": g[k].tobytes()}, "shard %d's rows" % k)
            for k in (1, 0):  # the dense pushes that complete the workers' steps
                ws[k].send_frame({"t": T_PUSH, "id": 90, "off": 0, "base": 0, "data": floats(0, 0, 0, 0)})
            for k in (1, 0):
                r = ws[k].recv_frame(TIMEOUT)
                self.assertEqual((r.get("t"), r.get("id")), (T_OK, 90), r)
            got = self.rows(ws[0], "user_id", [7, 8], 3, min=1)
            # the mean of each key's two rows, in double, rounded once; sgd
            # with lr 1 from zeros: its negation
            want = (-((g[0].astype(np.float64) + g[1].astype(np.float64)) * 0.5)).astype(np.float32)
            self.assertTrue(np.isfinite(got).all(), got)
            self.assertEqual(got.tobytes(), want.tobytes(), "%r, want %r" % (got, want))
            self.assertEqual(harness.status(psd.addr)["version"], 1)
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_nonfinite_updates_total"), 0)
            for w in ws:
                w.close()

    def test_bsp_kept_rows_bounded(self):
        """A BSP round's kept table pushes count against max_table_memory: a
        push that would pass it is LIMIT, nothing of it kept."""
        with harness.Cluster("test-tables-bsp-mem") as cl:
            psd = cl.psd(mode="bsp", workers=2, args=("--set", "max_table_memory=64K"))
            w = self.worker(psd, 0, 2)
            self.ok(w, dict(TABLE, dim=16), "declare")
            # a kept row of dim 16: 8 + 64 bytes; 900 of them 64,800 bytes, 910 65,520
            g = np.zeros((900, 16), np.float32)
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*range(900)), "base": 0, "data": g.tobytes()},
                    "900 rows")
            self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*range(900, 910)), "base": 0,
                        "data": g[:10].tobytes()}, "910")
            self.refused(w, E_LIMIT, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*range(910, 920)), "base": 0,
                                      "data": g[:10].tobytes()}, "920", "round 0's kept table pushes would take 66240")
            # nothing of the refused push was kept: its keys may come again
            self.refused(w, E_LIMIT, {"t": T_TPUSH, "tab": "user_id", "keys": keys(*range(910, 920)), "base": 0,
                                      "data": g[:10].tobytes()}, "920 again", "would take 66240")
            w.close()

    @staticmethod
    def g(k):
        """Shard k's rows: for key 7 values whose float32 sum depends on the
        order they are added in; for key 100 + k its own."""
        v = [0.1 * (k + 1) * (1.0, 1 / 3, 1 / 7)[i] + 1e-3 * i for i in range(3)]
        return np.array([v, [k + 1.0, 0.5, -0.5]], np.float32)

    def test_bsp_rows_in_shard_order(self):
        """BSP sums a key's rows over the round's workers in shard order, so
        the rows do not depend on the arrival order, bit for bit."""
        sum7 = np.zeros(3, np.float32)
        for k in range(3):
            sum7 = (sum7 + self.g(k)[0]).astype(np.float32)  # shard order, float32
        want = np.zeros((4, 3), np.float32)
        want[0] = (-(sum7.astype(np.float64) / 3)).astype(np.float32)  # sgd, lr 1, mean of 3
        for k in range(3):
            want[1 + k] = (-(self.g(k)[1].astype(np.float64) / 3)).astype(np.float32)
        # arrival order would change these bits: a check that the test can fail
        rev = np.zeros(3, np.float32)
        for k in (2, 1, 0):
            rev = (rev + self.g(k)[0]).astype(np.float32)
        self.assertNotEqual(rev.tobytes(), sum7.tobytes())
        for order in ((0, 1, 2), (2, 1, 0), (1, 2, 0)):
            got = self.bsp_round(order)
            self.assertEqual(got.tobytes(), want.tobytes(), "arrival order %r: %r, want %r" % (order, got, want))

    PUSHES = [
        ("emb", [1, 2, 3], 4), ("emb", [2, 9, 1 << 63], 4), ("lin", [5, 6], 2), ("emb", [3, 4, 5, 6], 4),
        ("lin", [6, 7, 8], 2), ("emb", [1], 4),
    ]

    @staticmethod
    def gradient(i, n, dim):
        rng = np.random.default_rng(1000 + i)
        return rng.standard_normal((n, dim)).astype(np.float32)

    def push_all(self, w, pushes, first):
        for i, (tab, ks, dim) in enumerate(pushes):
            self.ok(w, {"t": T_TPUSH, "tab": tab, "keys": keys(*ks), "base": 0,
                        "data": self.gradient(first + i, len(ks), dim).tobytes()}, "push %d" % (first + i))

    def declare_both(self, w):
        self.ok(w, dict(TABLE, tab="emb", dim=4, opt="adam", hp={"lr": 0.01}, seed=3), "emb")
        self.ok(w, dict(TABLE, tab="lin", dim=2, rinit="zeros", opt="ftrl", hp={"lr": 0.1, "l1": 0.5}), "lin")

    def test_table_only_job_keeps_checkpoints(self):
        """A job that only pushes rows (its version stays 0) keeps
        checkpoint_keep checkpoints, each its own file; a spoiled newest one
        is skipped at start for the one before, with its rows (issue 47:
        every checkpoint replaced the one file of version 0)."""
        with harness.Cluster("test-tables-ckpt-keep") as cl:
            state = os.path.join(cl.dir, "state")
            args = ("--state-dir", state, "--set", "checkpoint_interval=0", "--set", "checkpoint_keep=3")
            psd = cl.psd(mode="asgd", workers=1, args=args)
            w = self.worker(psd)
            self.ok(w, TABLE, "declare")
            rows = []
            with RawClient(psd.addr, TIMEOUT) as a:
                a.hello_admin()
                for i in range(5):
                    self.ok(w, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1, 2), "base": 0,
                                "data": floats(*[0.5 * (i + 1)] * 6)}, "push %d" % i)
                    rows.append(self.rows(w, "user_id", [1, 2], 3))
                    self.assertEqual(a.request({"t": harness.T_ADMIN, "cmd": "checkpoint"}).get("t"), T_OK)
                    if i == 1:  # nothing changed since: the same file again, not one more
                        self.assertEqual(a.request({"t": harness.T_ADMIN, "cmd": "checkpoint"}).get("t"), T_OK)
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            os.kill(psd.pid, 9)
            psd.wait(10)
            w.close()
            files = sorted(f for f in os.listdir(state) if f.endswith(".psdc"))
            self.assertEqual(files, ["ckpt-%020d_%010d.psdc" % (0, n) for n in (2, 3, 4)])

            # the newest spoiled: psd says so and loads the one before
            newest = os.path.join(state, files[-1])
            with open(newest, "r+b") as f:
                f.seek(os.path.getsize(newest) // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0xff]))
            psd2 = cl.psd(mode="asgd", workers=1, args=args, name="psd2")
            err = psd2.stderr()
            self.assertIn("checkpoint %s is unusable" % newest, err)
            self.assertIn("loaded checkpoint %s: model version 0" % os.path.join(state, files[-2]), err)
            w = self.worker(psd2, init=False)
            self.assertEqual(self.rows(w, "user_id", [1, 2], 3).tobytes(), rows[3].tobytes())
            self.assertNotEqual(rows[3].tobytes(), rows[4].tobytes())
            w.close()
            psd2.stop()

    def test_checkpoint_kill_restart(self):
        """Tables and their optimizer state come back bit for bit after
        kill -9: the restored rows equal those before, and pushing on from
        them gives exactly what a psd that never stopped gives (so adam's
        moments and per-row steps and ftrl's z and n came back too)."""
        first, second = self.PUSHES[:4], self.PUSHES[4:]
        probe = {"emb": [1, 2, 3, 4, 5, 6, 9, 1 << 63, 77], "lin": [5, 6, 7, 8, 77]}
        dims = {"emb": 4, "lin": 2}
        with harness.Cluster("test-tables-ckpt") as cl:
            state = os.path.join(cl.dir, "state")
            args = ("--state-dir", state, "--set", "checkpoint_interval=0")
            psd = cl.psd(mode="asgd", workers=1, args=args)
            w = self.worker(psd)
            self.declare_both(w)
            self.push_all(w, first, 0)
            before = {t: self.rows(w, t, probe[t], dims[t]) for t in probe}
            with RawClient(psd.addr, TIMEOUT) as a:
                a.hello_admin()
                r = a.request({"t": harness.T_ADMIN, "cmd": "checkpoint"})
                self.assertEqual(r.get("t"), T_OK, r)
            os.kill(psd.pid, 9)
            psd.wait(10)
            w.close()

            psd2 = cl.psd(mode="asgd", workers=1, args=args, name="psd2")
            self.assertRegex(psd2.stderr(), r"loaded checkpoint \S+: model version 0, 4 parameters \(.*\), 2 tables")
            w = self.worker(psd2)
            for t in probe:  # restored, before any declaration
                self.assertEqual(self.rows(w, t, probe[t], dims[t]).tobytes(), before[t].tobytes(), t)
            self.declare_both(w)  # the same declarations: OK
            self.refused(w, E_LAYOUT, dict(TABLE, tab="emb", dim=4, opt="adam", hp={"lr": 0.02}, seed=3),
                         "another lr after the restart", "but psd holds it as")
            self.push_all(w, second, len(first))
            after = {t: self.rows(w, t, probe[t], dims[t]) for t in probe}
            w.close()

            ref = cl.psd(mode="asgd", workers=1, name="psd-ref")
            r = self.worker(ref)
            self.declare_both(r)
            self.push_all(r, first, 0)
            self.push_all(r, second, len(first))
            for t in probe:
                self.assertEqual(self.rows(r, t, probe[t], dims[t]).tobytes(), after[t].tobytes(),
                                 "%s after the restart and more pushes" % t)
            r.close()

    def test_save_and_init_from(self):
        """psctl save writes each table as two tensors, tables/NAME/rows
        (F32 [rows, dim]) and tables/NAME/keys (I64, the keys' bits), with
        the declarations in the metadata; NumPy and PyTorch read them; a psd
        started with --init-from that file holds the same tables and rows
        (ftrl's weights included), and a fresh optimizer state."""
        import torch
        with harness.Cluster("test-tables-save") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            w = self.worker(psd)
            self.declare_both(w)
            self.push_all(w, self.PUSHES, 0)
            probe = {"emb": [1, 2, 3, 4, 5, 6, 9, 1 << 63], "lin": [5, 6, 7, 8]}
            dims = {"emb": 4, "lin": 2}
            before = {t: self.rows(w, t, probe[t], dims[t]) for t in probe}
            path = os.path.join(cl.dir, "model.safetensors")
            r = harness.psctl(psd.addr, "save", path)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("2 tables, 12 rows", r.stdout)
            meta, tensors = harness.read_safetensors(path)
            decl = json.loads(meta["psd.tables"])
            self.assertEqual([d["name"] for d in decl], ["emb", "lin"])
            self.assertEqual(decl[0]["hp"], {"lr": 0.01, "eps": 1e-08, "beta1": 0.9, "beta2": 0.999})
            np.testing.assert_array_equal(tensors["w"], [0.5, -1.0, 2.0, 0.25])
            for t in probe:
                ks = tensors["tables/%s/keys" % t].view(np.uint64)
                rows = tensors["tables/%s/rows" % t]
                self.assertEqual(rows.shape, (len(ks), dims[t]))
                self.assertEqual(sorted(ks.tolist()), sorted(k for k in probe[t] if k in ks.tolist()))
                for i, k in enumerate(probe[t]):
                    if k in ks.tolist():
                        j = ks.tolist().index(k)
                        self.assertEqual(rows[j].tobytes(), before[t][i].tobytes(), "%s key %d" % (t, k))
                torch.from_numpy(rows.copy())  # PyTorch takes them as they are
            self.assertEqual(tensors["tables/emb/keys"].dtype, np.int64)
            self.refused(w, E_RANGE, {"t": T_TPULL, "tab": "emb", "off": 7, "len": 2}, "rows past the stored ones",
                         "rows [7, 9) are outside table 'emb''s 8 rows")
            r = w.request({"t": T_TPULL, "tab": "emb", "off": 7, "len": 1})
            self.assertEqual((r.get("t"), r.get("keys")), (T_ROWS, tensors["tables/emb/keys"][7:].tobytes()), r)
            self.assertLess(int(tensors["tables/emb/keys"].min()), 0, "key 2^63 reads negative as I64")
            w.close()

            psd2 = cl.psd(mode="asgd", workers=1, name="psd-from", args=("--init-from", path))
            w = self.worker(psd2)
            for t in probe:
                self.assertEqual(self.rows(w, t, probe[t], dims[t]).tobytes(), before[t].tobytes(), t)
            st = {t["name"]: t for t in harness.status(psd2.addr)["tables"]}
            self.assertEqual((st["emb"]["rows"], st["lin"]["rows"]), (8, 4))
            self.declare_both(w)  # the file's declarations: the same
            # a fresh optimizer state: adam's first step from these rows
            g = self.gradient(99, 1, 4)
            self.ok(w, {"t": T_TPUSH, "tab": "emb", "keys": keys(1), "base": 0, "data": g.tobytes()}, "push")
            got = self.rows(w, "emb", [1], 4)[0]
            want = before["emb"][0].astype(np.float64) - 0.01 * g[0] / (np.abs(g[0]) + 1e-8)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            w.close()

            # a file whose table tensors do not match its metadata is refused
            bad = os.path.join(cl.dir, "bad.safetensors")
            with open(path, "rb") as f:
                blob = bytearray(f.read())
            blob = blob.replace(b'"tables/lin/keys"', b'"tables/lin/kezs"')
            with open(bad, "wb") as f:
                f.write(blob)
            r = harness.run([harness.Paths.psd, "--listen", "127.0.0.1:0", "--init-from", bad], timeout=30)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("lacks its rows or keys tensor", r.stderr)


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
