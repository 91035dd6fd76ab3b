#!/usr/bin/python3
"""test_zeros.py - float32 without its zeros on the wire ("dt": 2).

Raw protocol clients (the bitmap built with numpy, not common/vec.c)
against psd:

- psd's WELCOME offers it ("wire" has 1 << 2), with or without bf16;
- an INIT, PUSH and PUSHPULL with "dt": 2 are applied exactly as the same
  float32 values sent whole (SGD at lr 0.5: numpy computes the same
  float32 model), -0.0 included, and psd counts the values left out in
  psd_wire_zeros_elided_total;
- a bitmap that marks more or fewer values than follow, one with bits past
  "len", "dt": 2 without "len", a NaN among the values, a range past the
  model's end and "rdt": 2 are refused (BAD_FIELD, NONFINITE, RANGE,
  UNSUPPORTED), the model stays as it was and the connection goes on.

psworker with --skip-zeros on and off (BSP, 2 workers over TCP, an MLP
on a MNIST subset, one sample a step: every ReLU unit that sample leaves
off has a gradient row of zeros): both end with the same model bit for
bit, and with it on psd receives fewer bytes a push, the difference being
the zeros it counted. (psworker standardises pixels, so blank ones are not
0 and W1's usual batches of 64 leave hardly any zeros.)
"""

import contextlib
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (DT_BF16, DT_F32Z, E_BAD_FIELD, E_NONFINITE, E_RANGE, E_UNSUPPORTED, T_INIT,  # noqa: E402
                     T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL, T_WELCOME, RawClient, expect_error)

TIMEOUT = 30.0
LR = np.float32(0.5)
LAYOUT = [["fc.weight", [10, 77]], ["fc.bias", [10]]]  # 780 values
SGD = ["--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "weight_decay=0",
       "--set", "warmup_versions=0", "--set", "heartbeat_timeout=600s"]


def f32z(values):
    """The "data" of values without their zeros: a bitmap (bit i of byte
    i / 8: value i is not +0.0) in whole 32-bit words, then the others."""
    v = np.asarray(values, dtype="<f4")
    keep = v.view("<u4") != 0
    mask = np.packbits(keep, bitorder="little").tobytes()
    return mask + b"\0" * (-len(mask) % 4) + v[keep].tobytes()


def zeros_in(values):
    return int(np.count_nonzero(np.asarray(values, dtype="<f4").view("<u4") == 0))


def elided(addr):
    samples, _ = harness.parse_prometheus(harness.metrics(addr))
    return harness.metric(samples, "psd_wire_zeros_elided_total")


class ZerosRawTest(unittest.TestCase):
    @contextlib.contextmanager
    def worker(self, name):
        """psd (ASGD, plain SGD) and a raw worker on shard 0 of 2 that has
        not sent the initial values yet."""
        with harness.Cluster(name) as cl:
            psd = cl.psd(mode="asgd", workers=2, args=SGD)
            with RawClient(psd.addr, TIMEOUT) as c:
                self.assertEqual(c.hello_worker(LAYOUT, 0, 2).get("t"), T_WELCOME)
                yield psd, c

    def sparse(self, rng, n):
        """A gradient about half zeros, with a long run of them and a -0.0."""
        g = (rng.standard_normal(n) * 0.1).astype("<f4")
        g[rng.random(n) < 0.4] = 0
        g[100:300] = 0
        g[5] = np.float32(-0.0)
        return g

    def pull(self, c, n):
        r = c.request({"t": T_PULL, "off": 0, "len": n, "min": 0})
        self.assertEqual(r.get("t"), T_PARAMS, r)
        return np.frombuffer(r["data"], dtype="<f4").copy()

    def test_welcome_offers_it(self):
        for extra, want in (([], (1 << DT_BF16) | (1 << DT_F32Z)), (["--set", "wire_bf16=no"], 1 << DT_F32Z)):
            with harness.Cluster("psd-zeros-welcome") as cl:
                psd = cl.psd(mode="asgd", workers=1, args=SGD + extra)
                with RawClient(psd.addr, TIMEOUT) as c:
                    r = c.hello_worker(LAYOUT, 0, 1)
                    self.assertEqual(r.get("t"), T_WELCOME, r)
                    self.assertEqual(r.get("wire"), want, "%s: %r" % (extra, r))

    def test_applied_as_float32(self):
        rng = np.random.default_rng(7)
        n = harness.layout_size(LAYOUT)
        with self.worker("psd-zeros-raw") as (psd, c):
            # initial values a third zeros, one -0.0, in two chunks
            w = rng.standard_normal(n).astype("<f4")
            w[::3] = 0
            w[1] = np.float32(-0.0)
            for off, cnt, fin in ((0, 500, False), (500, n - 500, True)):
                r = c.request({"t": T_INIT, "off": off, "len": cnt, "dt": DT_F32Z,
                               "data": f32z(w[off:off + cnt]), "fin": fin})
                self.assertEqual(r.get("t"), T_OK, r)
            got = self.pull(c, n)
            self.assertEqual(got.tobytes(), w.tobytes(), "the initial values, bit for bit")
            left_out = zeros_in(w)

            # a push of [7, 507): w -= lr g
            g = self.sparse(rng, 500)
            r = c.request({"t": T_PUSH, "base": 0, "off": 7, "len": 500, "dt": DT_F32Z, "data": f32z(g)})
            self.assertEqual(r.get("t"), T_OK, r)
            w[7:507] -= LR * g
            left_out += zeros_in(g)
            np.testing.assert_array_equal(self.pull(c, n), w, "after a push without zeros")

            # a pushpull of the whole model, answered in float32
            g = self.sparse(rng, n)
            r = c.request({"t": T_PUSHPULL, "base": 1, "off": 0, "len": n, "dt": DT_F32Z, "data": f32z(g),
                           "poff": 0, "plen": n, "min": 2})
            self.assertEqual((r.get("t"), r.get("ver"), r.get("dt", 0)), (T_PARAMS, 2, 0), r.get("text"))
            w -= LR * g
            left_out += zeros_in(g)
            self.assertEqual(np.frombuffer(r["data"], dtype="<f4").tobytes(), w.tobytes())
            # the bitmap and the values were a fraction of float32's bytes
            self.assertLess(len(f32z(g)), 0.7 * 4 * n)
            self.assertEqual(elided(psd.addr), left_out)

    def test_bad_ones_are_refused(self):
        rng = np.random.default_rng(8)
        n = harness.layout_size(LAYOUT)
        with self.worker("psd-zeros-bad") as (psd, c):
            w = rng.standard_normal(n).astype("<f4")
            r = c.request({"t": T_INIT, "off": 0, "data": w.tobytes()})
            self.assertEqual(r.get("t"), T_OK, r)
            g = self.sparse(rng, 64)
            g[63] = 0.25  # so that len 63 leaves a bit set past it
            good = f32z(g)
            nan = g.copy()
            nan[10] = np.nan
            cases = [
                ({"len": 64, "data": good + b"\0\0\0\0"}, E_BAD_FIELD, "marks"),       # a value too many
                ({"len": 64, "data": good[:-4]}, E_BAD_FIELD, "marks"),                # one too few
                ({"len": 63, "data": good}, E_BAD_FIELD, "past len"),
                ({"len": 200, "data": good}, E_BAD_FIELD, "bitmap"),                   # too short a bitmap
                ({"data": good}, E_BAD_FIELD, "needs 'len'"),
                ({"len": 64, "data": f32z(nan)}, E_NONFINITE, "NaN"),
                ({"len": 64, "data": good, "off": n - 10}, E_RANGE, "outside"),
            ]
            for extra, code, needle in cases:
                msg = {"t": T_PUSH, "base": 0, "off": 0, "dt": DT_F32Z}
                msg.update(extra)
                r = c.request(msg)
                expect_error(self, r, code, "%s: %r" % (needle, {k: v for k, v in extra.items() if k != "data"}))
                self.assertIn(needle, r.get("text", ""))
                self.assertEqual(c.heartbeat().get("t"), T_OK, "the connection goes on")
            r = c.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_F32Z})
            expect_error(self, r, E_UNSUPPORTED, "parameters without zeros")
            self.assertIn("f32z", r.get("text", ""))
            np.testing.assert_array_equal(self.pull(c, n), w, "the model after the refused pushes")
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            self.assertEqual(elided(psd.addr), 0, "nothing refused was counted")
            # and a good one still applies
            r = c.request({"t": T_PUSH, "base": 0, "off": 0, "len": 64, "dt": DT_F32Z, "data": good})
            self.assertEqual(r.get("t"), T_OK, r)
            w[:64] -= LR * g
            np.testing.assert_array_equal(self.pull(c, n), w)


class ZerosPsworkerTest(unittest.TestCase):
    def test_same_model_fewer_bytes(self):
        runs = {}
        for flag in ("on", "off"):
            with harness.Cluster("psd-zeros-psworker-" + flag) as cl:
                psd = cl.psd(mode="bsp", workers=2)
                ws = [cl.worker(psd, k, 2, epochs=1, batch=1, limit=400, test_limit=200, model="mlp:64",
                                args=["--skip-zeros", flag, "--shm", "off", "--seed", "3"]) for k in range(2)]
                steps = harness.finish(self, ws)[0]["version"]
                samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
                run = {"steps": steps, "in": harness.metric(samples, "psd_received_bytes_total"),
                       "elided": harness.metric(samples, "psd_wire_zeros_elided_total"),
                       "pushes": harness.status(psd.addr)["pushes"]}
                with RawClient(psd.addr, 10.0) as adm:
                    st = adm.hello_admin()
                    r = adm.request({"t": T_PULL, "off": 0, "len": st["params"]})
                    self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, steps), r.get("text"))
                    run["model"] = np.frombuffer(r["data"], dtype="<f4")
                psd.stop()
            runs[flag] = run
        on, off = runs["on"], runs["off"]
        sys.stderr.write("zeros: on %d bytes in, %d values left out; off %d bytes in (%d pushes)\n" % (
            on["in"], on["elided"], off["in"], off["pushes"]))
        self.assertEqual(on["steps"], off["steps"])
        self.assertEqual(on["pushes"], off["pushes"])
        np.testing.assert_array_equal(on["model"], off["model"], "the same job, bit for bit")
        self.assertEqual(off["elided"], 0)
        # the units a sample leaves off give their weights zero gradients:
        # a good share of every push
        params = st["params"]
        self.assertGreater(on["elided"], 0.15 * params * on["pushes"])
        # each value left out saves its 4 bytes; a push's bitmap costs a bit
        # a value (in whole words), and "dt" and "len" about 10 bytes more
        saved = off["in"] - on["in"]
        per_push = (params + 31) // 32 * 4 + 16
        self.assertGreater(saved, 4 * on["elided"] - per_push * on["pushes"])
        self.assertLess(saved, 4 * on["elided"])


if __name__ == "__main__":
    harness.parse_args()
    unittest.main(verbosity=2)
