#!/usr/bin/python3
"""test_pieces.py - a BSP round that closes piece by piece (bsp_piece;
proto/PROTOCOL.md, section 8).

Raw workers, written from the protocol with Python's msgpack, on a model of
4096 values in pieces of 1024:

- WELCOME says "piece" when psd closes rounds piece by piece, and not when
  bsp_piece is 0 or backup_workers rule it out, nor to a worker whose
  HELLO brings the job's plan (a job with a plan closes its rounds whole;
  issue 32: that WELCOME said piece) or that joins a job with one.
- A piece's mean is applied once every worker's push covers it: a PULL of
  version r + 1 of that piece is answered (ver r + 1, the piece's new
  values) while the round is still open, and one of a piece still open
  waits.
- Meanwhile the version stays r, and a pull of version r (a worker's or an
  admin's) gets version r's values, not the pieces closed since.
- Once the round closes, the whole model is bit for bit the one a psd
  closing rounds whole gives for the same pushes.
- A worker lost in the middle of its push: what it sent is dropped, and
  the pieces and the round close with the others' pushes.

psworker over a model split on 2 psd (libpsclient 1.5, --pieces on: each
piece's PUSH and PULL, every psd's answers read as they come) ends bit for
bit where --pieces off ends, and pieces closed before their rounds did.
"""

import os
import socket
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_WELCOME, RawClient  # noqa: E402

N, PIECE = 4096, 1024
LAYOUT = [["w", [N]]]
SGD = ["--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "warmup_versions=0"]
QUIET = 0.4  # seconds in which a parked pull must not be answered


def f32(a):
    return np.asarray(a, dtype="<f4").tobytes()


class PiecesTest(unittest.TestCase):
    def hello(self, psd, shard, piece=PIECE):
        c = RawClient(psd.addr, 10.0)
        r = c.hello_worker(LAYOUT, shard, 2)
        self.assertEqual(r.get("t"), T_WELCOME, r)
        self.assertEqual(r.get("piece"), piece, "WELCOME's piece: %r" % (r,))
        return c, r

    def ok(self, c, what):
        r = c.recv_frame(10.0)
        self.assertEqual(r.get("t"), T_OK, "%s: %r" % (what, r))
        return r

    def push(self, c, base, off, g, fin):
        r = c.request({"t": T_PUSH, "base": base, "off": off, "fin": fin, "data": f32(g)})
        self.assertEqual(r.get("t"), T_OK, "push [%d, %d): %r" % (off, off + len(g), r))

    def params(self, c, what, ver, off=None):
        r = c.recv_frame(10.0)
        self.assertEqual(r.get("t"), T_PARAMS, "%s: %r" % (what, r))
        self.assertEqual(r.get("ver"), ver, what)
        if off is not None:
            self.assertEqual(r.get("off"), off, what)
        return np.frombuffer(r["data"], dtype="<f4")

    def quiet(self, c, what):
        with self.assertRaises(socket.timeout, msg="%s: answered too early" % what):
            r = c.recv_frame(QUIET)
            raise AssertionError("%s: got %r" % (what, r))

    def start(self, cl, name, extra=()):
        psd = cl.psd(name=name, mode="bsp", workers=2, args=SGD + list(extra))
        return psd

    def init(self, c, w0):
        r = c.request({"t": T_INIT, "off": 0, "fin": True, "data": f32(w0)})
        self.assertEqual(r.get("t"), T_OK, r)

    def test_plan_has_no_pieces(self):
        with harness.Cluster("test-pieces-plan") as cl:
            psd = self.start(cl, "plan", ["--set", "bsp_piece=%d" % PIECE])
            a = RawClient(psd.addr, 10.0)
            r = a.hello_worker(LAYOUT, 0, 2, plan=[1, 10, 2, 0])
            self.assertEqual((r.get("t"), r.get("init")), (T_WELCOME, True), r)
            self.assertEqual(r.get("plan"), [1, 10, 2, 0], r)
            self.assertNotIn("piece", r, "a worker bringing the plan is told no piece")
            b = RawClient(psd.addr, 10.0)
            r = b.hello_worker(LAYOUT, 1, 2)  # without a plan: the job's stands
            self.assertEqual(r.get("plan"), [1, 10, 2, 0], r)
            self.assertNotIn("piece", r, "a worker of a job with a plan is told no piece")
            # and the rounds do close whole: round 0's pull of piece 0
            # waits until both pushes are in whole
            self.init(a, np.zeros(N, dtype="<f4"))
            g = np.ones(N, dtype="<f4")
            self.push(a, 0, 0, g, True)
            self.push(b, 0, 0, g[:PIECE], False)
            a.send_frame({"t": T_PULL, "id": 70, "off": 0, "len": PIECE, "min": 1})
            with self.assertRaises(socket.timeout):
                r = a.recv_frame(QUIET)
                raise AssertionError("piece 0 answered before the round closed: %r" % (r,))
            self.push(b, 0, PIECE, g[PIECE:], True)
            self.params(a, "round 0 closed whole", 1, off=0)
            a.close()
            b.close()
            psd.stop()

    def test_pieces(self):
        rng = np.random.default_rng(7)
        w0 = rng.standard_normal(N).astype("<f4")
        ga, gb, ga2 = (rng.standard_normal(N).astype("<f4") for _ in range(3))
        with harness.Cluster("test-pieces") as cl:
            # a psd closing rounds whole: the reference
            whole = self.start(cl, "whole")
            a, r = self.hello(whole, 0, piece=None)
            b, _ = self.hello(whole, 1, piece=None)
            self.assertTrue(r.get("init"), r)
            self.init(a, w0)
            self.push(a, 0, 0, ga, True)
            self.push(b, 0, 0, gb, True)
            a.send_frame({"t": T_PULL, "id": 50, "off": 0, "len": N, "min": 1})
            ref1 = self.params(a, "whole: round 0's model", 1)
            a.close()
            b.close()

            # backup workers rule the pieces out: no "piece"
            bk = self.start(cl, "backup", ["--set", "bsp_piece=%d" % PIECE, "--set", "backup_workers=1"])
            c, _ = self.hello(bk, 0, piece=None)
            c.close()

            psd = self.start(cl, "pieces", ["--set", "bsp_piece=%d" % PIECE])
            a, r = self.hello(psd, 0)
            b, _ = self.hello(psd, 1)
            self.assertTrue(r.get("init"), r)
            self.init(a, w0)
            # round 0: piece 0 from a, then from b: it closes alone
            self.push(a, 0, 0, ga[:PIECE], False)
            a.send_frame({"t": T_PULL, "id": 60, "off": 0, "len": PIECE, "min": 1})
            self.quiet(a, "piece 0 before b's push")
            self.push(b, 0, 0, gb[:PIECE], False)
            got = self.params(a, "piece 0 once both pushed it", 1, off=0)
            np.testing.assert_array_equal(got, ref1[:PIECE], "piece 0 is round 0's")
            # piece 1 is open: its pull waits
            a.send_frame({"t": T_PULL, "id": 61, "off": PIECE, "len": PIECE, "min": 1})
            self.quiet(a, "piece 1, which only a pushed part of")
            # version 0 is still the model's, with piece 0's old values
            b.send_frame({"t": T_PULL, "id": 70, "off": 0, "len": N, "min": 0})
            np.testing.assert_array_equal(self.params(b, "version 0 mid-round", 0), w0)
            with RawClient(psd.addr, 10.0) as adm:
                adm.hello_admin()
                r = adm.request({"t": T_PULL, "off": 0, "len": 2 * PIECE})
                self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, 0), "admin's pull")
                np.testing.assert_array_equal(np.frombuffer(r["data"], dtype="<f4"), w0[:2 * PIECE])
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            # the rest closes the round
            self.push(a, 0, PIECE, ga[PIECE:], True)
            self.quiet(a, "piece 1 before b's rest")
            self.push(b, 0, PIECE, gb[PIECE:], True)
            got = self.params(a, "piece 1 at the round's close", 1, off=PIECE)
            np.testing.assert_array_equal(got, ref1[PIECE:2 * PIECE])
            a.send_frame({"t": T_PULL, "id": 62, "off": 0, "len": N, "min": 1})
            np.testing.assert_array_equal(self.params(a, "round 0's model", 1), ref1,
                                          "piece by piece = whole, bit for bit")
            # round 1: b pushes piece 1 and half of piece 2, then is lost
            self.push(a, 1, 0, ga2[:PIECE], False)
            self.push(b, 1, PIECE, gb[PIECE:PIECE + PIECE + PIECE // 2], False)
            b.close()
            a.send_frame({"t": T_PULL, "id": 63, "off": 0, "len": PIECE, "min": 2})
            want = ref1 - np.float32(0.5) * ga2
            # b's leaving leaves a alone: piece 0 (a's) closes without it
            got = self.params(a, "piece 0 once b is gone", 2, off=0)
            np.testing.assert_allclose(got, want[:PIECE], rtol=0, atol=1e-6)
            self.push(a, 1, PIECE, ga2[PIECE:], True)
            a.send_frame({"t": T_PULL, "id": 64, "off": 0, "len": N, "min": 2})
            got = self.params(a, "round 1 with a alone", 2)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
            a.close()
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_rounds_total"), 2)
            # piece 0 of each round, before its round closed
            self.assertEqual(harness.metric(samples, "psd_bsp_early_pieces_total"), 2)

    def test_psworker_pieces(self):
        # psworker over a model split on 2 psd (libpsclient's pieces option:
        # auto takes pieces only from a psd on another machine) ends bit for
        # bit where it ends without them, with its pieces compressed or not
        models, early, zstd = {}, {}, {}
        for flag in ("on", "off"):
            with harness.Cluster("test-pieces-split") as cl:
                psds = [cl.psd(mode="bsp", workers=2, name="psd%d" % i, args=["--set", "bsp_piece=4096"])
                        for i in range(2)]
                ws = [cl.worker(psds, k, 2, epochs=1, limit=2000, test_limit=500, model="mlp:64",
                                args=["--pieces", flag, "--shm", "off", "--seed", "3", "--no-plan",
                                      # each piece compressed (dt 3) with pieces on: the same values
                                      "--compress", flag])
                      for k in range(2)]
                steps = harness.finish(self, ws)[0]["version"]
                self.assertEqual(steps, harness.steps_per_epoch(2000, 2, 64, True))
                parts, early[flag], zstd[flag] = [], 0, 0
                for p in psds:
                    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
                    early[flag] += harness.metric(samples, "psd_bsp_early_pieces_total")
                    zstd[flag] += harness.metric(samples, "psd_wire_zstd_received_bytes_total")
                    with RawClient(p.addr, 10.0) as adm:
                        st = adm.hello_admin()
                        r = adm.request({"t": T_PULL, "off": 0, "len": st["params"]})
                        self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, steps), r.get("text"))
                        parts.append(np.frombuffer(r["data"], dtype="<f4"))
                    p.stop()
                models[flag] = np.concatenate(parts)
        self.assertGreater(early["on"], steps, "pieces closed before their rounds")
        self.assertGreater(zstd["on"], 0, "the pieces went compressed")
        self.assertEqual(zstd["off"], 0)
        self.assertEqual(early["off"], 0)
        np.testing.assert_array_equal(models["on"], models["off"])


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
