#!/usr/bin/python3
"""test_wire.py - bfloat16 tensors on the wire ("dt", "rdt", "wire").

Raw protocol clients (Python's msgpack, bfloat16 made with numpy: round to
nearest even of a float32's top half) against psd:

- psd's WELCOME offers bf16 ("wire": 1 << 1) unless wire_bf16 = no;
- a PULL with "rdt": 1 gets PARAMS with "dt": 1 and 2 bytes a value, the
  model rounded to bfloat16, also across a block edge and for a reply that
  waited (a parked BSP pull, a push applied off psd's loop);
- a PUSH, PUSHPULL or INIT with "dt": 1 is widened to float32 and applied
  exactly as that float32 push would be (SGD at lr 0.5: numpy computes the
  same float32 values);
- a bf16 push with NaN or infinity gets NONFINITE and leaves the model as it
  was; an odd byte count gets BAD_FIELD, an unknown element type
  UNSUPPORTED, and the connection keeps working;
- with wire_bf16 = no, bf16 data and "rdt": 1 get UNSUPPORTED, the model is
  unchanged and the connection keeps working.

psworker --wire bf16 (W1's model, Adam with a cosine schedule, a MNIST
subset) in ASGD and in BSP: it trains to an accuracy within 1.5 points of the
same job in float32, while psd receives and sends about half the bytes per
push; against a psd with wire_bf16 = no it warns and trains in float32.
"""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (DT_BF16, E_BAD_FIELD, E_NONFINITE, E_RANGE, E_STATE, E_UNSUPPORTED,  # noqa: E402
                     T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL, T_WELCOME, RawClient, bf16_bits,
                     bf16_bytes, bf16_widen, expect_error)

TIMEOUT = 30.0
BLK = 1 << 20  # psd's block, psworker's chunk (floats)
LR = np.float32(0.5)
SMALL = [["fc.weight", [10, 77]], ["fc.bias", [10]]]  # 780 values: no multiple of any vector width
SGD = ["--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "weight_decay=0",
       "--set", "warmup_versions=0", "--set", "heartbeat_timeout=600s"]


class Job:
    """psd with plain SGD at lr 0.5 and a raw worker on shard 0 of 2 that
    initialised the model in float32 (unless init is false); the
    expected model is kept in numpy float32."""

    def __init__(self, cl, test, layout=SMALL, mode="asgd", extra=(), seed=1, init=True, w=None):
        self.t = test
        self.layout = layout
        self.total = harness.layout_size(layout)
        self.psd = cl.psd(mode=mode, workers=2, args=SGD + list(extra))
        self.rng = np.random.default_rng(seed)
        self.w = self.rng.standard_normal(self.total).astype("<f4") if w is None else w.astype("<f4")
        self.a = RawClient(self.psd.addr, TIMEOUT)
        self.welcome = self.a.hello_worker(layout, 0, 2)
        test.assertEqual(self.welcome.get("t"), T_WELCOME, self.welcome)
        if init:
            for off in range(0, self.total, BLK):
                n = min(BLK, self.total - off)
                r = self.a.request({"t": T_INIT, "off": off, "data": self.w[off:off + n].tobytes(),
                                    "fin": off + n == self.total})
                test.assertEqual(r.get("t"), T_OK, r)

    def join(self, shard):
        c = RawClient(self.psd.addr, TIMEOUT)
        r = c.hello_worker(self.layout, shard, 2)
        self.t.assertEqual(r.get("t"), T_WELCOME, r)
        return c

    def grad(self, n):
        """A float32 gradient of ordinary values (not bfloat16 already)."""
        return (self.rng.standard_normal(n) * 0.1).astype("<f4")

    def apply(self, off, g16):
        """The expected model after psd applied the bf16 bits g16 at off."""
        self.w[off:off + len(g16)] -= LR * bf16_widen(g16)

    def pull_f32(self, c=None, off=0, n=None):
        c = c or self.a
        n = self.total - off if n is None else n
        r = c.request({"t": T_PULL, "off": off, "len": n, "min": 0})
        self.t.assertEqual(r.get("t"), T_PARAMS, r)
        self.t.assertEqual(r.get("dt", 0), 0, "a pull without rdt is answered in float32")
        self.t.assertEqual(len(r["data"]), 4 * n)
        return np.frombuffer(r["data"], dtype="<f4").copy()

    def check_bf16_params(self, r, off, n, want_f32, what):
        """r is PARAMS of [off, off+n) in bfloat16: the bits of want_f32
        rounded to nearest even."""
        self.t.assertEqual(r.get("t"), T_PARAMS, "%s: %r" % (what, r))
        self.t.assertEqual(r.get("dt"), DT_BF16, "%s: PARAMS without dt 1: %r" % (what, {k: v for k, v in r.items()
                                                                                           if k != "data"}))
        self.t.assertEqual(r["off"], off, what)
        self.t.assertEqual(len(r["data"]), 2 * n, "%s: %d bytes for %d bfloat16 values" % (what, len(r["data"]), n))
        got = np.frombuffer(r["data"], dtype="<u2")
        want = bf16_bits(want_f32)
        bad = np.flatnonzero(got != want)
        self.t.assertEqual(bad.size, 0, "%s: %d values differ, first at %s: got 0x%04x, want 0x%04x (of %r)" % (
            what, bad.size, bad[:1], got[bad[0]] if bad.size else 0, want[bad[0]] if bad.size else 0,
            want_f32[bad[0]] if bad.size else 0))

    def version_now(self):
        return harness.status(self.psd.addr)["version"]

    def close(self):
        self.a.close()


class BF16HelperTest(unittest.TestCase):
    def test_numpy_conversion_matches_known_bits(self):
        """The test's own conversion, against bit patterns worked out by hand
        (from the table of tests/unit/test_vec.c)."""
        cases = [(0x3F800000, 0x3F80), (0x3F808000, 0x3F80), (0x3F818000, 0x3F82), (0x3F807FFF, 0x3F80),
                 (0x3F808001, 0x3F81), (0xBF818000, 0xBF82), (0x3FFFFFFF, 0x4000), (0x00000000, 0x0000),
                 (0x80000000, 0x8000), (0x00008000, 0x0000), (0x00018000, 0x0002), (0x007FFFFF, 0x0080),
                 (0x7F800000, 0x7F80), (0xFF800000, 0xFF80), (0x7F7FFFFF, 0x7F80), (0xFF7FFFFF, 0xFF80),
                 (0x7F7F7FFF, 0x7F7F), (0x7FC00000, 0x7FC0), (0x7F800001, 0x7FC0), (0x7FA00000, 0x7FE0),
                 (0xFFFFFFFF, 0xFFFF)]
        f = np.array([c[0] for c in cases], dtype="<u4").view("<f4")
        got = bf16_bits(f)
        for (src, want), g in zip(cases, got):
            self.assertEqual(int(g), want, "0x%08x -> 0x%04x, want 0x%04x" % (src, g, want))
        h = np.arange(1 << 16, dtype="<u2")
        wide = bf16_widen(h.tobytes())
        self.assertTrue(np.array_equal(wide.view("<u4"), h.astype("<u4") << 16))


class WireRawTest(unittest.TestCase):
    def test_welcome_offers_bf16(self):
        with harness.Cluster("psd-wire-welcome") as cl:
            job = Job(cl, self)
            job.close()
            self.assertEqual(job.welcome.get("wire"), harness.wire_bit(DT_BF16) | harness.wire_bit(harness.DT_F32Z) |
                             harness.wire_bit(harness.DT_F32ZSTD), job.welcome)
        with harness.Cluster("psd-wire-welcome-off") as cl:
            job = Job(cl, self, extra=["--set", "wire_bf16=no"])
            job.close()
            self.assertFalse(job.welcome.get("wire", 0) & harness.wire_bit(DT_BF16),
                             "wire_bf16 = no, yet the welcome offers bf16: %r" % job.welcome)

    def test_pull_push_and_pushpull_in_bf16(self):
        with harness.Cluster("psd-wire-raw") as cl:
            job = Job(cl, self)
            n = job.total
            try:
                # the whole model, and a range in the middle of odd length
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_BF16})
                job.check_bf16_params(r, 0, n, job.w, "pull of the initial values")
                r = job.a.request({"t": T_PULL, "off": 3, "len": 101, "min": 0, "rdt": DT_BF16})
                job.check_bf16_params(r, 3, 101, job.w[3:104], "pull of [3, 104)")

                # PUSHPULL in bf16 both ways: applied as its widened values
                g = bf16_bits(job.grad(n))
                r = job.a.request({"t": T_PUSHPULL, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes(),
                                   "poff": 0, "plen": n, "min": 0, "rdt": DT_BF16})
                job.apply(0, g)
                self.assertEqual(r.get("ver"), 1, r.get("ver"))
                model = job.pull_f32()
                np.testing.assert_array_equal(model, job.w, "the model after a bf16 pushpull")
                job.check_bf16_params(r, 0, n, model, "the pushpull's reply")

                # a PUSH of a sub-range, odd length
                g = bf16_bits(job.grad(199))
                r = job.a.request({"t": T_PUSH, "base": 1, "off": 5, "dt": DT_BF16, "data": g.tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
                job.apply(5, g)
                np.testing.assert_array_equal(job.pull_f32(), job.w, "the model after a bf16 push of [5, 204)")

                # mixed: bf16 data with a float32 reply, float32 data with a bf16 reply
                g = bf16_bits(job.grad(n))
                r = job.a.request({"t": T_PUSHPULL, "base": 2, "off": 0, "dt": DT_BF16, "data": g.tobytes(),
                                   "poff": 10, "plen": 20, "min": 0})
                job.apply(0, g)
                self.assertEqual(r.get("t"), T_PARAMS, r)
                self.assertEqual(r.get("dt", 0), 0, "no rdt, yet the reply came as dt %r" % r.get("dt"))
                np.testing.assert_array_equal(np.frombuffer(r["data"], dtype="<f4"), job.w[10:30])
                g32 = job.grad(n)
                r = job.a.request({"t": T_PUSHPULL, "base": 3, "off": 0, "data": g32.tobytes(),
                                   "poff": 0, "plen": n, "min": 0, "rdt": DT_BF16})
                job.w -= LR * g32
                job.check_bf16_params(r, 0, n, job.w, "a float32 pushpull's bf16 reply")
                np.testing.assert_array_equal(job.pull_f32(), job.w)
                self.assertEqual(job.version_now(), 4)

                # a second connection sees the same bf16 values
                with job.join(1) as b:
                    r = b.request({"t": T_PULL, "off": 0, "len": n, "min": 4, "rdt": DT_BF16})
                    job.check_bf16_params(r, 0, n, job.w, "another worker's pull")
            finally:
                job.close()

    def test_bad_bf16_pushes_leave_the_model_unchanged(self):
        with harness.Cluster("psd-wire-bad") as cl:
            job = Job(cl, self)
            n = job.total
            try:
                before = job.pull_f32()
                bad = [
                    (0x7FC0, "quiet NaN"),
                    (0xFFC0, "negative NaN"),
                    (0x7F81, "signalling NaN"),
                    (0x7F80, "+inf"),
                    (0xFF80, "-inf"),
                ]
                for i, (bits, what) in enumerate(bad):
                    g = bf16_bits(job.grad(n))
                    g[(i * 131) % n] = bits
                    r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes()})
                    expect_error(self, r, E_NONFINITE, "a bf16 push holding %s" % what)
                    r = job.a.request({"t": T_PUSHPULL, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes(),
                                       "poff": 0, "plen": n, "min": 0, "rdt": DT_BF16})
                    expect_error(self, r, E_NONFINITE, "a bf16 pushpull holding %s" % what)
                np.testing.assert_array_equal(job.pull_f32(), before, "the model after refused NaN/inf pushes")
                self.assertEqual(job.version_now(), 0)

                # an odd number of bytes: BAD_FIELD naming the size, and the
                # connection goes on
                g = bf16_bytes(job.grad(n))
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g[:-1]})
                expect_error(self, r, E_BAD_FIELD, "a bf16 push of %d bytes" % (len(g) - 1))
                self.assertIn("%d bytes" % (len(g) - 1), r["text"])
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": b"\x80"})
                expect_error(self, r, E_BAD_FIELD, "a bf16 push of 1 byte")
                self.assertEqual(job.a.heartbeat().get("t"), T_OK)
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_BF16})
                job.check_bf16_params(r, 0, n, before, "a pull after the odd-length push")

                # an element type psd does not know: UNSUPPORTED, not fatal
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": 4, "data": g})
                expect_error(self, r, E_UNSUPPORTED, "dt 4")
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": 7})
                expect_error(self, r, E_UNSUPPORTED, "rdt 7")
                # out of range, once widened
                r = job.a.request({"t": T_PUSH, "base": 0, "off": n - 5, "dt": DT_BF16,
                                   "data": bf16_bytes(job.grad(10))})
                expect_error(self, r, E_RANGE, "a bf16 push past the model's end")
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": b""})
                expect_error(self, r, E_RANGE, "an empty bf16 push")
                np.testing.assert_array_equal(job.pull_f32(), before, "the model after the refused pushes")
                self.assertEqual(job.version_now(), 0)

                # and a good one still applies
                g = bf16_bits(job.grad(n))
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
                job.apply(0, g)
                np.testing.assert_array_equal(job.pull_f32(), job.w)

                samples, _ = harness.parse_prometheus(harness.metrics(job.psd.addr))
                rejected = {reason: harness.metric(samples, "psd_rejected_messages_total", reason=reason)
                            for reason in ("nonfinite", "bad_field", "unsupported", "range")}
                self.assertEqual(rejected, {"nonfinite": 2 * len(bad), "bad_field": 2, "unsupported": 2, "range": 2})
            finally:
                job.close()

    def test_nonfinite_clip_sanitises_bf16(self):
        """nonfinite = clip sees the widened values: a bf16 NaN becomes 0,
        +-inf +-FLT_MAX, and the step is clipped to clip_norm."""
        clip = 1.0
        with harness.Cluster("psd-wire-clip") as cl:
            job = Job(cl, self, extra=["--set", "nonfinite=clip", "--set", "clip_norm=%g" % clip])
            n = job.total
            try:
                g = bf16_bits(np.full(n, 1e-3, dtype="<f4"))
                g[0], g[1], g[2], g[3] = 0x7FC0, 0x7F80, 0xFF80, 0x7F81
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes()})
                self.assertEqual((r.get("t"), r.get("ver")), (T_OK, 1), r)
                w1 = job.pull_f32()
            finally:
                job.close()
            samples, _ = harness.parse_prometheus(harness.metrics(job.psd.addr))
            self.assertEqual(harness.metric(samples, "psd_sanitized_pushes_total"), 1)
        self.assertTrue(np.isfinite(w1).all(), "the model holds NaN or infinity")
        step = w1.astype(np.float64) - job.w.astype(np.float64)
        self.assertEqual(step[0], 0, "NaN became 0")
        self.assertEqual(step[3], 0, "a signalling NaN became 0")
        self.assertLess(step[1], 0)
        self.assertGreater(step[2], 0)
        self.assertLessEqual(np.linalg.norm(step), float(LR) * clip * 1.001)
        self.assertGreater(np.linalg.norm(step), float(LR) * clip * 0.99, "the push was applied, at norm clip")

    def test_bf16_init(self):
        """The initial values in bfloat16: a NaN is refused, the model stays
        without values; then they are taken, widened exactly."""
        with harness.Cluster("psd-wire-init") as cl:
            job = Job(cl, self, init=False)
            n = job.total
            try:
                self.assertIs(job.welcome.get("init"), True)
                w16 = bf16_bits(job.w)
                nan = w16.copy()
                nan[n - 1] = 0x7FC0
                r = job.a.request({"t": T_INIT, "off": 0, "dt": DT_BF16, "data": nan.tobytes()})
                expect_error(self, r, E_NONFINITE, "a bf16 init holding NaN")
                r = job.a.request({"t": T_INIT, "off": 0, "dt": DT_BF16, "data": w16.tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
                got = job.pull_f32()
                np.testing.assert_array_equal(got, bf16_widen(w16), "the model initialised from bf16")
                r = job.a.request({"t": T_INIT, "off": 0, "dt": DT_BF16, "data": w16.tobytes()})
                expect_error(self, r, E_STATE, "a second init")
            finally:
                job.close()

    def test_wire_bf16_no_refuses_bf16(self):
        with harness.Cluster("psd-wire-off") as cl:
            job = Job(cl, self, extra=["--set", "wire_bf16=no"])
            n = job.total
            try:
                before = job.pull_f32()
                g = bf16_bytes(job.grad(n))
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g})
                expect_error(self, r, E_UNSUPPORTED, "a bf16 push to a psd with wire_bf16 = no")
                r = job.a.request({"t": T_PUSHPULL, "base": 0, "off": 0, "dt": DT_BF16, "data": g,
                                   "poff": 0, "plen": n, "min": 0})
                expect_error(self, r, E_UNSUPPORTED, "a bf16 pushpull to a psd with wire_bf16 = no")
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_BF16})
                expect_error(self, r, E_UNSUPPORTED, "a bf16 pull from a psd with wire_bf16 = no")
                self.assertEqual(job.a.heartbeat().get("t"), T_OK)
                np.testing.assert_array_equal(job.pull_f32(), before, "the model after refused bf16 pushes")
                self.assertEqual(job.version_now(), 0)
                # float32 goes on as before
                g32 = job.grad(n)
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "data": g32.tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
                job.w -= LR * g32
                np.testing.assert_array_equal(job.pull_f32(), job.w)
                samples, _ = harness.parse_prometheus(harness.metrics(job.psd.addr))
                self.assertEqual(harness.metric(samples, "psd_rejected_messages_total", reason="unsupported"), 3)
            finally:
                job.close()

    # A PUSHPULL whose reply type psd refuses is refused whole: its push is
    # not applied either (a client that sends it again must not apply it twice).
    def test_wire_bf16_no_refused_pushpull_applies_nothing(self):
        with harness.Cluster("psd-wire-off-pushpull") as cl:
            job = Job(cl, self, extra=["--set", "wire_bf16=no"])
            n = job.total
            try:
                before = job.pull_f32()
                r = job.a.request({"t": T_PUSHPULL, "base": 0, "off": 0, "data": job.grad(n).tobytes(),
                                   "poff": 0, "plen": n, "min": 0, "rdt": DT_BF16})
                after = job.pull_f32()
                version = job.version_now()
            finally:
                job.close()
        # checked outside the cluster, which would print every log on a failure
        expect_error(self, r, E_UNSUPPORTED, "a pushpull asking for bf16 from a psd with wire_bf16 = no")
        np.testing.assert_array_equal(after, before, "the model after a refused pushpull")
        self.assertEqual(version, 0)

    # psd reuses the bfloat16 conversion of the previous reply only while
    # nothing was written to the model: a push chunk without fin changes the
    # values in place without a new version, and a bf16 pull after it must
    # see them (psworker pushes models over 2^20 parameters in such chunks).
    def test_bf16_pull_after_a_push_chunk_without_fin(self):
        with harness.Cluster("psd-wire-chunk") as cl:
            job = Job(cl, self)
            n = job.total
            try:
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_BF16})
                job.check_bf16_params(r, 0, n, job.w, "the first pull")
                g = bf16_bits(job.grad(n))
                r = job.a.request({"t": T_PUSH, "base": 0, "off": 0, "dt": DT_BF16, "data": g.tobytes(),
                                   "fin": False})
                self.assertEqual(r.get("t"), T_OK, r)
                job.apply(0, g)
                model = job.pull_f32()
                np.testing.assert_array_equal(model, job.w, "the model after a chunk without fin")
                r = job.a.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_BF16})
                self.assertEqual(r.get("ver"), 0, "a chunk without fin makes no version")
                got = np.frombuffer(r["data"], dtype="<u2").copy()
            finally:
                job.close()
        # checked outside the cluster, which would print every log on a failure
        self.assertEqual(np.count_nonzero(got != bf16_bits(model)), 0,
                         "a bf16 pull after the chunk differs from the model it changed")

    def test_bf16_across_blocks_and_off_the_loop(self):
        """A model of two blocks: bf16 pulls across the block edge and of
        the whole model; a bf16 pushpull of 2^20 values (applied on psd's
        thread pool, its reply sent when that is done) answered in bf16."""
        with harness.Cluster("psd-wire-big") as cl:
            layout = [["w", [BLK + BLK // 2 + 3]]]
            job = Job(cl, self, layout=layout)
            n = job.total
            try:
                r = job.a.request({"t": T_PULL, "off": BLK - 501, "len": 1001, "min": 0, "rdt": DT_BF16})
                job.check_bf16_params(r, BLK - 501, 1001, job.w[BLK - 501:BLK + 500], "a pull across the block edge")
                g = bf16_bits(job.grad(BLK))
                r = job.a.request({"t": T_PUSHPULL, "base": 0, "off": BLK // 2, "dt": DT_BF16, "data": g.tobytes(),
                                   "poff": 0, "plen": n, "min": 0, "rdt": DT_BF16})
                job.apply(BLK // 2, g)
                self.assertEqual(r.get("ver"), 1)
                model = job.pull_f32()
                np.testing.assert_array_equal(model, job.w, "the model after a 2^20-value bf16 pushpull")
                job.check_bf16_params(r, 0, n, model, "the big pushpull's reply (two blocks)")
            finally:
                job.close()

    def test_bsp_round_answers_in_bf16(self):
        """BSP, a model of 2^19 values (its round is applied off psd's
        loop): worker A's bf16 pushpull waits for the round (a parked pull),
        worker B's closes it; both replies are the new model in bf16."""
        with harness.Cluster("psd-wire-bsp") as cl:
            n = BLK // 2 + 77
            rng = np.random.default_rng(5)
            # a model of multiples of 2^-10 and gradients of multiples of 2^-8
            # (exact in bfloat16): the mean and the update are exact in float32
            w = rng.integers(-4096, 4096, size=n) / 1024.0
            job = Job(cl, self, layout=[["w", [n]]], mode="bsp", w=w)
            b = job.join(1)
            try:
                g = [(rng.integers(-256, 256, size=n) / 256.0).astype("<f4") for _ in range(2)]
                for gk in g:
                    np.testing.assert_array_equal(bf16_widen(bf16_bits(gk)), gk)
                # whichever arrives first waits for the round (a parked pull);
                # the other closes it, and its reply waits for the update
                job.a.send_frame({"t": T_PUSHPULL, "id": 500, "base": 0, "off": 0, "dt": DT_BF16,
                                  "data": bf16_bytes(g[0]), "poff": 0, "plen": n, "min": 1, "rdt": DT_BF16})
                rb = b.request({"t": T_PUSHPULL, "base": 0, "off": 0, "dt": DT_BF16, "data": bf16_bytes(g[1]),
                                "poff": 0, "plen": n, "min": 1, "rdt": DT_BF16})
                ra = job.a.recv_frame(TIMEOUT)
                self.assertEqual(ra.get("id"), 500, ra.get("id"))
                job.w -= LR * ((g[0] + g[1]) * np.float32(0.5))
                model = job.pull_f32(b)
                np.testing.assert_array_equal(model, job.w, "the model after the bf16 round")
                for r, who in ((ra, "worker A's pushpull"), (rb, "worker B's pushpull")):
                    self.assertEqual(r.get("ver"), 1, who)
                    job.check_bf16_params(r, 0, n, model, who)
                self.assertEqual(job.version_now(), 1)
            finally:
                job.close()
                b.close()


# ---- psworker --wire bf16 -----------------------------------------------------------

LIMIT = 30000
TEST_LIMIT = 10000
# Under the sanitizers (the build-asan pass: its memory checks, not the
# accuracy the plain build asserts) the job trains half as long.
EPOCHS = 2 if harness.SANITIZED else 4
BATCH = 128
MODEL = "mlp:256,128"
PARAMS = harness.layout_size(harness.mlp_layout((256, 128)))
# a clean run of this job reaches about 0.97 in either wire type (0.96 in 2 epochs)
MIN_ACCURACY = 0.93 if harness.SANITIZED else 0.95
MAX_GAP = 0.015      # bf16 may trail float32 by at most 1.5 points


def w1_psd_args(mode, limit, epochs):
    """W1's psd settings (docs/settings.md), the cosine over this job's versions."""
    steps = (limit // 2 + BATCH - 1) // BATCH * epochs
    versions = steps if mode == "bsp" else 2 * steps
    return ["--set", "optimizer=adam", "--set", "lr=2e-3", "--set", "lr_schedule=cosine",
            "--set", "lr_decay_versions=%d" % versions, "--set", "warmup_versions=0"]


class WireTrainTest(unittest.TestCase):
    def train(self, mode, wire, psd_args=(), worker_args=(), limit=LIMIT, epochs=EPOCHS):
        """Two psworkers with --wire wire over TCP (--shm off: the wire is
        what these tests measure; --skip-zeros and --compress off: float32 is
        every value's 4 bytes, test_packed.py measures packing it); returns their
        results and psd's counters afterwards."""
        with harness.Cluster("psd-wire-%s-%s" % (mode, wire)) as cl:
            psd = cl.psd(mode=mode, workers=2, args=w1_psd_args(mode, limit, epochs) + list(psd_args))
            ws = [cl.worker(psd, k, 2, epochs=epochs, batch=BATCH, limit=limit, test_limit=TEST_LIMIT, model=MODEL,
                            args=["--wire", wire, "--shm", "off", "--skip-zeros", "off", "--compress", "off"] + list(worker_args))
                  for k in range(2)]
            out = {"acc": [], "stderr": [], "wire": []}
            for w in ws:
                rc, summary = w.result(120)
                self.assertEqual(rc, 0, "%s %s: %s failed:\n%s" % (mode, wire, w.name, harness.tail(w.err_path)))
                self.assertIsNotNone(summary, "%s printed no summary" % w.name)
                self.assertEqual(summary["epochs"], epochs)
                out["acc"].append(summary["test_accuracy"])
                out["wire"].append(summary["wire"])
                out["stderr"].append(w.stderr())
            st = harness.status(psd.addr)
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            out["pushes"] = st["pushes"]
            out["version"] = st["version"]
            out["in"] = harness.metric(samples, "psd_received_bytes_total")
            out["out"] = harness.metric(samples, "psd_sent_bytes_total")
            out["rejected"] = {reason: harness.metric(samples, "psd_rejected_messages_total", reason=reason)
                               for reason in harness.REASONS.values()}
            psd.stop()
        sys.stderr.write("%s %s: accuracy %s, %d pushes, %.0f bytes in, %.0f out\n" % (
            mode, wire, out["acc"], out["pushes"], out["in"], out["out"]))
        return out

    def compare(self, mode, worker_args=(), floor=MIN_ACCURACY):
        f32 = self.train(mode, "f32", worker_args=worker_args)
        bf16 = self.train(mode, "bf16", worker_args=worker_args)
        for run, name in ((f32, "f32"), (bf16, "bf16")):
            for acc in run["acc"]:
                self.assertGreater(acc, floor, "%s %s: accuracy %s" % (mode, name, run["acc"]))
            self.assertEqual(set(run["rejected"].values()), {0}, "%s %s: %r" % (mode, name, run["rejected"]))
        for err in bf16["stderr"]:
            self.assertNotIn("does not offer", err, "psd offers bf16, yet psworker fell back")
        # each summary says what the wire carried
        self.assertEqual(f32["wire"], ["f32", "f32"])
        self.assertEqual(bf16["wire"], ["bf16", "bf16"])
        # the same job: as many pushes
        self.assertEqual(bf16["pushes"], f32["pushes"], mode)
        if mode == "bsp":
            # one model per round: both workers end with the same accuracy
            self.assertEqual(bf16["acc"][0], bf16["acc"][1])
        gap = np.mean(f32["acc"]) - np.mean(bf16["acc"])
        self.assertLessEqual(gap, MAX_GAP, "%s: bf16 %s trails f32 %s by %.4f" % (mode, bf16["acc"], f32["acc"], gap))
        # bytes: each push carries 2 bytes a parameter instead of 4, and so
        # does each reply of parameters; the initial values (float32), hellos
        # and reports are the rest
        for key in ("in", "out"):
            ratio = (bf16[key] / bf16["pushes"]) / (f32[key] / f32["pushes"])
            self.assertGreater(ratio, 0.45, "%s: bytes %s per push, bf16/f32 = %.3f" % (mode, key, ratio))
            self.assertLess(ratio, 0.56, "%s: bytes %s per push, bf16/f32 = %.3f" % (mode, key, ratio))
            self.assertGreaterEqual(f32[key], 4 * PARAMS * f32["pushes"], "f32 moves 4 bytes a parameter")
            self.assertGreaterEqual(bf16[key], 2 * PARAMS * bf16["pushes"], "bf16 moves 2 bytes a parameter")

    def test_bf16_trains_like_f32_asgd(self):
        self.compare("asgd")

    def test_bf16_trains_like_f32_bsp(self):
        self.compare("bsp")

    def test_bf16_pipelined(self):
        """--pipeline on: the next gradient is computed while the last one
        travels as bf16, and the parameters come back into a buffer the
        model does not read. One step more staleness costs both wire types
        about a point (about 0.96), so the floor is lower."""
        self.compare("asgd", worker_args=["--pipeline", "on"], floor=MIN_ACCURACY - 0.02)

    def test_fallback_when_psd_does_not_offer_bf16(self):
        limit, epochs = 6000, 2
        run = self.train("asgd", "bf16", psd_args=["--set", "wire_bf16=no"], limit=limit, epochs=epochs)
        for acc, err in zip(run["acc"], run["stderr"]):
            self.assertGreater(acc, 0.85, "fallen back to f32: accuracy %s" % run["acc"])
            self.assertRegex(err, r"WARN.*does not offer bf16", "psworker's stderr lacks the warning:\n" + err)
        self.assertEqual(run["wire"], ["f32", "f32"], "the summaries say float32 after the fallback")
        # psworker never sent bf16 (nothing refused) and pushed float32
        self.assertEqual(set(run["rejected"].values()), {0}, run["rejected"])
        self.assertGreaterEqual(run["in"], 4 * PARAMS * run["pushes"])


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
