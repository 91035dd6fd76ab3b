#!/usr/bin/python3
"""test_table_shm.py - table requests through a shared segment (PROTOCOL.md 13.9).

A raw client (Python's msgpack, its own memfd) offers psd a table segment
(hello "tshm": [pid, fd]); psd maps it and says "tinshm"; TPULL, TPUSH and
TPUSHPULL then carry "seg": [at, n, m, rat] instead of their keys and rows.

- The same pushes through the segment and in frames, to two tables declared
  alike, leave the two tables bit for bit equal, and the rows a request
  pulls into the segment are the rows a TPULL in a frame answers; a pull
  parked for a version (min) is written when it is answered.
- Segments psd must refuse (not sealed, too small, too big, not a multiple
  of 8, a regular file) leave the connection on frames, with the reason in
  psd's log; "seg" on such a connection is STATE.
- Bad requests on a good segment (rows outside it or over the request, a
  wrong row count, a duplicate key, NaN, "seg" beside "keys") are refused
  with their codes and change nothing; the connection works on.
- BSP through the segment: two workers' pushes summed in shard order give
  the rows the same round gives in frames.
"""

import mmap
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_BAD_FIELD, E_NONFINITE, E_RANGE, E_STATE, T_BYE, T_INIT, T_OK, T_ROWS,  # noqa: E402
                     T_TABLE, T_TPULL, T_TPUSH, T_TPUSHPULL, T_WELCOME, RawClient, expect_error, memfd)

LAYOUT = [["w", [4]]]
TIMEOUT = 10.0
SEG = 1 << 20
RAT = SEG // 2
DIM = 4


def keys(ks):
    return struct.pack("<%dQ" % len(ks), *ks)


def table(name):
    return {"t": T_TABLE, "tab": name, "dim": DIM, "rinit": "uniform", "scale": 0.1, "seed": 3, "opt": "adagrad",
            "hp": {"lr": 0.3}}


class Segment:
    """A mapped table segment and the requests a worker places in it."""

    def __init__(self, nbytes=SEG):
        self.fd = memfd(nbytes)
        self.map = mmap.mmap(self.fd, nbytes)

    def close(self):
        self.map.close()
        os.close(self.fd)

    def put(self, at, ks, grads=None, pks=()):
        b = keys(ks) + (np.asarray(grads, "<f4").tobytes() if grads is not None else b"") + keys(pks)
        self.map[at:at + len(b)] = b

    def rows(self, rat, n):
        return np.frombuffer(self.map, "<f4", count=n * DIM, offset=rat).reshape(n, DIM).copy()


class TableShm(unittest.TestCase):
    def ok(self, c, msg, what):
        r = c.request(msg)
        self.assertEqual(r.get("t"), T_OK, "%s: %r" % (what, r))
        return r

    def worker(self, psd, shard=0, nshards=1, **hello):
        w = RawClient(psd.addr, TIMEOUT)
        r = w.hello_worker(LAYOUT, shard, nshards, **hello)
        self.assertEqual(r.get("t"), T_WELCOME, r)
        if r.get("init"):
            self.ok(w, {"t": T_INIT, "off": 0, "data": struct.pack("<4f", 1, 2, 3, 4)}, "init")
        return w, r

    def seg_worker(self, psd, *tables):
        """A worker whose table segment psd mapped, with tables declared."""
        seg = Segment()
        w, r = self.worker(psd, tshm=[os.getpid(), seg.fd])
        self.assertIs(r.get("tinshm"), True, r)
        for name in tables:
            self.ok(w, table(name), "declare " + name)
        return seg, w

    def frame_rows(self, c, tab, ks):
        r = c.request({"t": T_TPULL, "tab": tab, "keys": keys(ks)})
        self.assertEqual(r.get("t"), T_ROWS, r)
        return np.frombuffer(r["data"], "<f4").reshape(len(ks), DIM).copy()

    def seg_rows(self, c, seg, msg, n, rat=RAT):
        seg.map[rat:rat + n * DIM * 4] = b"\xff" * (n * DIM * 4)  # NaN until psd writes them
        r = c.request(msg)
        self.assertEqual(r.get("t"), T_ROWS, r)
        self.assertIs(r.get("inshm"), True, r)
        self.assertNotIn("data", r)
        self.assertEqual(r.get("len"), n * DIM, r)
        return seg.rows(rat, n)

    def test_same_rows_as_frames(self):
        with harness.Cluster("test-tshm-same") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            seg, w = self.seg_worker(psd, "a", "b")
            try:
                rng = np.random.default_rng(5)
                pool = [int(k) for k in rng.integers(0, 1 << 63, 64, dtype=np.int64)] + [0, (1 << 64) - 1]
                for step in range(12):
                    ks = [pool[i] for i in rng.choice(len(pool), 20, replace=False)]
                    pks = [pool[i] for i in rng.choice(len(pool), 17, replace=False)]
                    g = rng.standard_normal((len(ks), DIM)).astype("<f4")
                    # a: in the segment, at an offset of its own each time
                    at = 8 * step
                    seg.put(at, ks, g, pks)
                    got = self.seg_rows(w, seg, {"t": T_TPUSHPULL, "tab": "a", "base": 0,
                                                 "seg": [at, len(ks), len(pks), RAT]}, len(pks))
                    # b: the same in a frame
                    r = w.request({"t": T_TPUSHPULL, "tab": "b", "base": 0, "keys": keys(ks), "data": g.tobytes(),
                                   "pkeys": keys(pks)})
                    self.assertEqual(r.get("t"), T_ROWS, r)
                    want = np.frombuffer(r["data"], "<f4").reshape(len(pks), DIM)
                    self.assertEqual(got.tobytes(), want.tobytes(), "step %d: rows pulled" % step)
                # a TPUSH and a TPULL by key through the segment
                seg.put(0, pool[:5], np.ones((5, DIM), "<f4"))
                self.ok(w, {"t": T_TPUSH, "tab": "a", "base": 0, "seg": [0, 5, 0, 0]}, "tpush in the segment")
                r = w.request({"t": T_TPUSH, "tab": "b", "base": 0, "keys": keys(pool[:5]),
                               "data": np.ones((5, DIM), "<f4").tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
                seg.put(64, pool)
                a = self.seg_rows(w, seg, {"t": T_TPULL, "tab": "a", "seg": [64, len(pool), 0, RAT]}, len(pool))
                self.assertEqual(a.tobytes(), self.frame_rows(w, "b", pool).tobytes())
                self.assertEqual(a.tobytes(), self.frame_rows(w, "a", pool).tobytes())
                # a pull parked until version 1: its rows are written when
                # the dense push makes it
                seg.put(0, pool[:3])
                seg.map[RAT:RAT + 48] = b"\0" * 48
                w.send_frame({"t": T_TPULL, "tab": "a", "seg": [0, 3, 0, RAT], "min": 1, "id": 77})
                w.send_frame({"t": harness.T_PUSH, "base": 0, "off": 0, "data": struct.pack("<4f", 0, 0, 0, 0),
                              "id": 78})
                got = {}
                for _ in range(2):
                    r = w.recv_frame()
                    got[r.get("id")] = r
                self.assertEqual(got[78].get("t"), T_OK, got)
                r = got[77]
                self.assertEqual((r.get("t"), r.get("ver"), r.get("inshm"), r.get("len")), (T_ROWS, 1, True, 12), r)
                self.assertEqual(seg.rows(RAT, 3).tobytes(), self.frame_rows(w, "a", pool[:3]).tobytes())
                # psctl status (STATUS) says so per worker: dense tensors in
                # frames (this worker offered no dense segment), table
                # requests in the segment
                self.assertEqual([x["table_transport"] for x in harness.status(psd.addr)["workers"]], ["shm"])
                st = harness.psctl(psd.addr, "status")
                self.assertEqual(st.returncode, 0, st.stderr)
                self.assertRegex(st.stdout, r"(?m)^\s+SHARD\s+STATE\s+ADDRESS\s+VIA\s+TABLES\s")
                self.assertRegex(st.stdout, r"(?m)^\s+\d+/\d+\s+connected\s+\S+\s+tcp\s+shm\s")
                self.assertEqual(w.request({"t": T_BYE}).get("t"), T_OK)
                w.close()
                psd.stop()
                self.assertIn("table rows through shared memory", psd.stderr())
            finally:
                seg.close()

    def test_segments_psd_must_refuse(self):
        with harness.Cluster("test-tshm-refuse") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            pid = os.getpid()

            def refused(fd, why):
                w, r = self.worker(psd, tshm=[pid, fd])
                with w:
                    self.assertNotIn("tinshm", r, "psd mapped a table segment it must refuse (%s)" % why)
                    self.ok(w, table("t"), "declare")
                    r = w.request({"t": T_TPULL, "tab": "t", "seg": [0, 1, 0, 64]})
                    expect_error(self, r, E_STATE, "seg without a table segment")
                    self.assertIn("no table segment", r["text"])
                    self.assertEqual(self.frame_rows(w, "t", [9]).shape, (1, DIM), "frames work on (%s)" % why)
                    self.assertEqual([x["table_transport"] for x in harness.status(psd.addr)["workers"]], ["tcp"])
                harness.wait_until(lambda: why in psd.stderr(), 10, "psd to log why: %s" % why)

            for nbytes, seals, why in ((SEG, 0, "is a memfd not sealed against shrinking and growing"),
                                       (1024, None, "not a multiple of 8 from 65536 to 67108864"),
                                       (SEG + 4, None, "holds %d bytes, not a multiple of 8" % (SEG + 4)),
                                       ((1 << 26) + 8, None, "holds %d bytes, not a multiple of 8" % ((1 << 26) + 8))):
                fd = memfd(nbytes) if seals is None else memfd(nbytes, seals)
                refused(fd, why)
                os.close(fd)
            with tempfile.TemporaryFile(dir=cl.dir) as f:
                f.truncate(SEG)
                refused(f.fileno(), "is not a memfd")
            # no table segment offered at all
            w, r = self.worker(psd)
            with w:
                self.assertNotIn("tinshm", r)
                r = w.request({"t": T_TPULL, "tab": "t", "seg": [0, 1, 0, 64]})
                expect_error(self, r, E_STATE, "seg without an offer")

    def test_bad_requests_change_nothing(self):
        with harness.Cluster("test-tshm-bad") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            seg, w = self.seg_worker(psd, "t")
            try:
                ks = [11, 22, 33]
                seg.put(0, ks, np.ones((3, DIM), "<f4"))
                self.ok(w, {"t": T_TPUSH, "tab": "t", "base": 0, "seg": [0, 3, 0, 0]}, "a good push")
                before = self.frame_rows(w, "t", ks)
                req = 3 * 8 + 3 * DIM * 4 + 8
                cases = [
                    ("request past the segment", {"seg": [SEG - 16, 3, 1, 0]}, E_RANGE, "must lie apart"),
                    ("rows past the segment", {"seg": [0, 3, 1, SEG - 8]}, E_RANGE, "must lie apart"),
                    ("rows over the request", {"seg": [0, 3, 1, req - 8]}, E_RANGE, "must lie apart"),
                    ("seg and keys", {"seg": [0, 3, 1, RAT], "keys": keys(ks)}, E_BAD_FIELD,
                     "'seg' and 'keys' together"),
                    ("a tpushpull without keys to pull", {"seg": [0, 3, 0, RAT]}, E_BAD_FIELD,
                     "must be 1..65536 in a tpushpull"),
                    ("rat not a multiple of 8", {"seg": [0, 3, 1, RAT + 4]}, E_BAD_FIELD,
                     "seg must be [at, n, m, rat]"),
                    ("too many values", {"seg": [0, 65536, 65536, RAT], "tab": "big"}, E_BAD_FIELD,
                     "more than 4194304 in one message"),
                ]
                self.ok(w, dict(table("big"), dim=128), "declare a table of dim 128")
                for what, extra, code, needle in cases:
                    msg = dict({"t": T_TPUSHPULL, "tab": "t", "base": 0}, **extra)
                    r = w.request(msg)
                    expect_error(self, r, code, what)
                    self.assertIn(needle, r["text"], what)
                # a key twice; a NaN among the gradients
                seg.put(0, [11, 22, 11], np.ones((3, DIM), "<f4"), [11])
                r = w.request({"t": T_TPUSHPULL, "tab": "t", "base": 0, "seg": [0, 3, 1, RAT]})
                expect_error(self, r, E_BAD_FIELD, "a key twice")
                self.assertIn("appears twice", r["text"])
                g = np.ones((3, DIM), "<f4")
                g[2, 1] = np.nan
                seg.put(0, ks, g, [11])
                r = w.request({"t": T_TPUSHPULL, "tab": "t", "base": 0, "seg": [0, 3, 1, RAT]})
                expect_error(self, r, E_NONFINITE, "NaN in the segment")
                self.assertIn("contain NaN or infinity", r["text"])
                self.assertEqual(self.frame_rows(w, "t", ks).tobytes(), before.tobytes(), "nothing changed")
                # and the segment works on
                seg.put(0, ks, np.ones((3, DIM), "<f4"), ks)
                got = self.seg_rows(w, seg, {"t": T_TPUSHPULL, "tab": "t", "base": 0, "seg": [0, 3, 3, RAT]}, 3)
                self.assertEqual(got.tobytes(), self.frame_rows(w, "t", ks).tobytes())
                self.assertNotEqual(got.tobytes(), before.tobytes())
                self.assertEqual(w.request({"t": T_BYE}).get("t"), T_OK)
                w.close()
            finally:
                seg.close()

    def bsp_rows(self, through_seg):
        with harness.Cluster("test-tshm-bsp-%d" % through_seg) as cl:
            psd = cl.psd(mode="bsp", workers=2)
            segs = [Segment() for _ in range(2)]
            try:
                ws = []
                for k in range(2):
                    w, r = self.worker(psd, k, 2, **({"tshm": [os.getpid(), segs[k].fd]} if through_seg else {}))
                    self.assertEqual(r.get("tinshm"), True if through_seg else None, r)
                    self.ok(w, table("t"), "declare")
                    ws.append(w)
                ks = [5, 6, 7, 8]
                for k, w in enumerate(ws):
                    g = np.full((4, DIM), 0.25 * (k + 1), "<f4") * np.arange(1, 5, dtype="<f4")[:, None]
                    if through_seg:
                        segs[k].put(0, ks, g)
                        self.ok(w, {"t": T_TPUSH, "tab": "t", "base": 0, "seg": [0, 4, 0, 0]}, "tpush %d" % k)
                    else:
                        self.ok(w, {"t": T_TPUSH, "tab": "t", "base": 0, "keys": keys(ks), "data": g.tobytes()},
                                "tpush %d" % k)
                for w in ws:
                    self.ok(w, {"t": harness.T_PUSH, "base": 0, "off": 0, "data": struct.pack("<4f", 1, 1, 1, 1)},
                            "dense push")
                harness.wait_until(lambda: harness.status(psd.addr)["version"] == 1, 10, "round 0 to close")
                if through_seg:
                    segs[0].put(0, ks)
                    rows = self.seg_rows(ws[0], segs[0], {"t": T_TPULL, "tab": "t", "seg": [0, 4, 0, RAT]}, 4)
                else:
                    rows = self.frame_rows(ws[0], "t", ks)
                for w in ws:
                    w.close()
                return rows
            finally:
                for s in segs:
                    s.close()

    def test_bsp_same_as_frames(self):
        self.assertEqual(self.bsp_rows(True).tobytes(), self.bsp_rows(False).tobytes())


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
