#!/usr/bin/python3
"""test_packed.py - float32 packed on the wire: without its zeros ("dt": 2)
and compressed ("dt": 3).

Raw protocol clients (the bitmap built with numpy, not common/vec.c)
against psd:

- psd's WELCOME offers both ("wire" has 1 << 2 and 1 << 3), with or
  without bf16;
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

Compressed, raw clients (zstd through ctypes on Debian's libzstd, not
psd's code):

- an INIT, PUSH and PUSHPULL with "dt": 3 (one zstd frame of the values'
  byte planes) are applied exactly as the float32 values; psd counts the bytes in
  and what they decompressed to;
- a frame that says another size than "len", garbage, a cut frame, two
  frames, "dt": 3 without "len", a NaN, a range past the model's end and
  "rdt": 3 are refused, the model unchanged, the connection going on.

psworker with --compress on and off (BSP, W1's usual batches of 64): the
same model bit for bit, and with it on psd receives about two thirds of
the bytes (the first layer's gradient repeats one value wherever the batch
has a blank pixel).
"""

import contextlib
import ctypes
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (DT_BF16, DT_F32Z, DT_F32ZSTD, E_BAD_FIELD, E_NONFINITE, E_RANGE, E_UNSUPPORTED, T_INIT,  # noqa: E402
                     T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, T_TPUSHPULL,
                     T_WELCOME, RawClient, expect_error)

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


_zstd = ctypes.CDLL("libzstd.so.1")
_zstd.ZSTD_compressBound.restype = ctypes.c_size_t
_zstd.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
_zstd.ZSTD_compress.restype = ctypes.c_size_t
_zstd.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
_zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]


def planes(raw):
    """float32 bytes as byte planes: every value's byte 0, then byte 1, ..."""
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, 4).T.tobytes()


def unplanes(raw):
    return np.frombuffer(raw, dtype=np.uint8).reshape(4, -1).T.tobytes()


def zstd(raw, level=1):
    """The "data" of float32 bytes compressed: one zstd frame of their byte
    planes (its content size in the header)."""
    raw = planes(raw)
    cap = _zstd.ZSTD_compressBound(len(raw))
    out = ctypes.create_string_buffer(cap)
    n = _zstd.ZSTD_compress(out, cap, raw, len(raw), level)
    assert not _zstd.ZSTD_isError(n)
    return out.raw[:n]


_zstd.ZSTD_decompress.restype = ctypes.c_size_t
_zstd.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]


def unzstd(frame, size):
    """The size float32 bytes one zstd frame of byte planes holds (an
    AssertionError otherwise)."""
    out = ctypes.create_string_buffer(size + 1)
    n = _zstd.ZSTD_decompress(out, size + 1, frame, len(frame))
    assert not _zstd.ZSTD_isError(n) and n == size, (n, size)
    return unplanes(out.raw[:n])


def zeros_in(values):
    return int(np.count_nonzero(np.asarray(values, dtype="<f4").view("<u4") == 0))


def elided(addr):
    samples, _ = harness.parse_prometheus(harness.metrics(addr))
    return harness.metric(samples, "psd_wire_zeros_elided_total")


class Raw(unittest.TestCase):
    """What the raw tests share; no tests of its own."""

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


    def refused(self, c, dt, cases):
        """Each case's PUSH of element type dt is refused with its code and a
        text that says so; the connection goes on."""
        for extra, code, needle in cases:
            msg = {"t": T_PUSH, "base": 0, "off": 0, "dt": dt}
            msg.update(extra)
            r = c.request(msg)
            expect_error(self, r, code, "%s: %r" % (needle, {k: v for k, v in extra.items() if k != "data"}))
            self.assertIn(needle, r.get("text", ""))
            self.assertEqual(c.heartbeat().get("t"), T_OK, "the connection goes on")


class ZerosRawTest(Raw):
    def test_welcome_offers_it(self):
        packed = (1 << DT_F32Z) | (1 << DT_F32ZSTD)
        for extra, want in (([], (1 << DT_BF16) | packed), (["--set", "wire_bf16=no"], packed)):
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
            self.refused(c, DT_F32Z, cases)
            r = c.request({"t": T_PULL, "off": 0, "len": 8, "min": 0, "rdt": DT_F32Z})
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


class ZstdRawTest(Raw):
    def test_applied_as_float32(self):
        rng = np.random.default_rng(9)
        n = harness.layout_size(LAYOUT)
        with self.worker("psd-zstd-raw") as (psd, c):
            w = rng.standard_normal(n).astype("<f4")
            w[::4] = np.float32(-0.4242)  # a repeated value, as standardised blank pixels give
            w[1] = np.float32(-0.0)
            r = c.request({"t": T_INIT, "off": 0, "len": n, "dt": DT_F32ZSTD, "data": zstd(w.tobytes())})
            self.assertEqual(r.get("t"), T_OK, r)
            self.assertEqual(self.pull(c, n).tobytes(), w.tobytes(), "initial values, bit for bit")
            sent, raw = len(zstd(w.tobytes())), 4 * n
            g = (rng.standard_normal(300) * 0.1).astype("<f4")
            g[::3] = np.float32(0.125)
            r = c.request({"t": T_PUSH, "base": 0, "off": 11, "len": 300, "dt": DT_F32ZSTD,
                           "data": zstd(g.tobytes())})
            self.assertEqual(r.get("t"), T_OK, r)
            w[11:311] -= LR * g
            sent, raw = sent + len(zstd(g.tobytes())), raw + 4 * 300
            g = (rng.standard_normal(n) * 0.1).astype("<f4")
            r = c.request({"t": T_PUSHPULL, "base": 1, "off": 0, "len": n, "dt": DT_F32ZSTD,
                           "data": zstd(g.tobytes(), 3), "poff": 0, "plen": n, "min": 2})
            self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, 2), r.get("text"))
            w -= LR * g
            sent, raw = sent + len(zstd(g.tobytes(), 3)), raw + 4 * n
            self.assertEqual(np.frombuffer(r["data"], dtype="<f4").tobytes(), w.tobytes())
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_wire_zstd_received_bytes_total"), sent)
            self.assertEqual(harness.metric(samples, "psd_wire_zstd_float_bytes_total"), raw)

    def test_parameters_compressed(self):
        """A PULL or PUSHPULL with "rdt": 3 gets PARAMS with "dt": 3, "len"
        and one zstd frame of the float32 values, when that saves a
        sixteenth; values that do not compress come as float32."""
        rng = np.random.default_rng(11)
        n = harness.layout_size(LAYOUT)
        with self.worker("psd-zstd-params") as (psd, c):
            w = rng.standard_normal(n).astype("<f4")
            w[::2] = np.float32(0.5)  # half the values one value: compresses
            self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": w.tobytes()}).get("t"), T_OK)
            sent = 0
            for off, cnt in ((0, n), (3, 401)):
                r = c.request({"t": T_PULL, "off": off, "len": cnt, "min": 0, "rdt": DT_F32ZSTD})
                self.assertEqual((r.get("t"), r.get("dt"), r.get("len"), r.get("off")),
                                 (T_PARAMS, DT_F32ZSTD, cnt, off), {k: v for k, v in r.items() if k != "data"})
                self.assertLess(len(r["data"]), 4 * cnt * 15 / 16)
                self.assertEqual(unzstd(r["data"], 4 * cnt), w[off:off + cnt].tobytes())
                sent += len(r["data"])
            # a pushpull answered so
            g = (rng.standard_normal(n) * 0.1).astype("<f4")
            r = c.request({"t": T_PUSHPULL, "base": 0, "off": 0, "data": g.tobytes(), "poff": 0, "plen": n,
                           "min": 1, "rdt": DT_F32ZSTD})
            w -= LR * g
            self.assertEqual((r.get("t"), r.get("dt"), r.get("ver")), (T_PARAMS, DT_F32ZSTD, 1))
            self.assertEqual(unzstd(r["data"], 4 * n), w.tobytes())
            sent += len(r["data"])
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_wire_zstd_sent_bytes_total"), sent)
            self.assertEqual(harness.metric(samples, "psd_wire_zstd_sent_float_bytes_total"), 4 * (2 * n + 401))
        # values that do not compress (random signs, exponents in a wide
        # range and mantissas, all finite) come as float32
        with self.worker("psd-zstd-params-raw") as (psd, c):
            bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32) & np.uint32(0x807FFFFF)
            bits |= rng.integers(64, 190, n, dtype=np.uint32) << np.uint32(23)
            w = bits.view("<f4")
            self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": w.tobytes()}).get("t"), T_OK)
            r = c.request({"t": T_PULL, "off": 0, "len": n, "min": 0, "rdt": DT_F32ZSTD})
            self.assertEqual((r.get("t"), r.get("dt", 0)), (T_PARAMS, 0))
            self.assertEqual(r["data"], w.tobytes())

    def test_bad_ones_are_refused(self):
        rng = np.random.default_rng(10)
        n = harness.layout_size(LAYOUT)
        with self.worker("psd-zstd-bad") as (psd, c):
            w = rng.standard_normal(n).astype("<f4")
            self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": w.tobytes()}).get("t"), T_OK)
            g = (rng.standard_normal(64) * 0.1).astype("<f4")
            good = zstd(g.tobytes())
            nan = g.copy()
            nan[3] = np.nan
            cases = [
                ({"len": 63, "data": good}, E_BAD_FIELD, "not one zstd frame"),     # says 64 values
                ({"len": 64, "data": b"\x28\xb5\x2f\xfd" + bytes(40)}, E_BAD_FIELD, "zstd"),  # garbage
                ({"len": 64, "data": good[:-5]}, E_BAD_FIELD, "zstd"),             # cut
                ({"len": 64, "data": good + good}, E_BAD_FIELD, "not one zstd frame"),  # two frames
                ({"len": 64, "data": b""}, E_BAD_FIELD, "zstd"),
                ({"data": good}, E_BAD_FIELD, "needs 'len'"),
                ({"len": 64, "data": zstd(nan.tobytes())}, E_NONFINITE, "NaN"),
                ({"len": 64, "data": good, "off": n - 10}, E_RANGE, "outside"),
                ({"len": 1 << 40, "data": good}, E_RANGE, "outside"),              # never decompressed
            ]
            self.refused(c, DT_F32ZSTD, cases)
            r = c.request({"t": T_PULL, "off": 0, "len": 8, "min": 0, "rdt": 4})
            expect_error(self, r, E_UNSUPPORTED, "parameters as dt 4")
            np.testing.assert_array_equal(self.pull(c, n), w, "the model after the refused pushes")
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            r = c.request({"t": T_PUSH, "base": 0, "off": 0, "len": 64, "dt": DT_F32ZSTD, "data": good})
            self.assertEqual(r.get("t"), T_OK, r)
            w[:64] -= LR * g
            np.testing.assert_array_equal(self.pull(c, n), w)


def psworker_run(test, name, flag_args, batch, limit):
    """2 psworkers in BSP over TCP on one psd: their steps, psd's received
    bytes, pushes and packing counters, and the final model."""
    with harness.Cluster(name) as cl:
        psd = cl.psd(mode="bsp", workers=2)
        ws = [cl.worker(psd, k, 2, epochs=1, batch=batch, limit=limit, test_limit=200, model="mlp:64",
                        args=flag_args + ["--shm", "off", "--seed", "3"]) for k in range(2)]
        steps = harness.finish(test, ws)[0]["version"]
        samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
        run = {"steps": steps, "in": harness.metric(samples, "psd_received_bytes_total"),
               "elided": harness.metric(samples, "psd_wire_zeros_elided_total"),
               "zin": harness.metric(samples, "psd_wire_zstd_received_bytes_total"),
               "out": harness.metric(samples, "psd_sent_bytes_total"),
               "zsent": harness.metric(samples, "psd_wire_zstd_sent_bytes_total"),
               "zsent_raw": harness.metric(samples, "psd_wire_zstd_sent_float_bytes_total"),
               "zout": harness.metric(samples, "psd_wire_zstd_float_bytes_total"),
               "pushes": harness.status(psd.addr)["pushes"]}
        with RawClient(psd.addr, 10.0) as adm:
            st = adm.hello_admin()
            run["params"] = st["params"]
            r = adm.request({"t": T_PULL, "off": 0, "len": st["params"]})
            test.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, steps), r.get("text"))
            run["model"] = np.frombuffer(r["data"], dtype="<f4")
        psd.stop()
    return run


class ZstdPsworkerTest(unittest.TestCase):
    def test_same_model_fewer_bytes(self):
        on = psworker_run(self, "psd-zstd-on", ["--compress", "on"], 64, 2000)
        off = psworker_run(self, "psd-zstd-off", ["--compress", "off"], 64, 2000)
        sys.stderr.write("zstd: on %d bytes in (%d compressed of %d), off %d bytes in (%d pushes)\n" % (
            on["in"], on["zin"], on["zout"], off["in"], off["pushes"]))
        self.assertEqual((on["steps"], on["pushes"]), (off["steps"], off["pushes"]))
        np.testing.assert_array_equal(on["model"], off["model"], "the same job, bit for bit")
        self.assertEqual(off["zin"], 0)
        # every push went compressed, and the initial values
        self.assertEqual(on["zout"], 4 * on["params"] * (on["pushes"] + 1))
        self.assertLess(on["zin"], 0.8 * on["zout"])
        self.assertLess(on["in"], off["in"] - 0.9 * (on["zout"] - on["zin"]))
        # and the parameters came back compressed, or as float32 where
        # that saved less (the first pulls of the initial values)
        self.assertEqual(off["zsent"], 0)
        self.assertGreater(on["zsent_raw"], 0.5 * 4 * on["params"] * on["pushes"])
        self.assertLess(on["zsent"], 0.97 * on["zsent_raw"])
        self.assertLess(on["out"], off["out"] - 0.9 * (on["zsent_raw"] - on["zsent"]))


class ZerosPsworkerTest(unittest.TestCase):
    def test_same_model_fewer_bytes(self):
        # one sample a step, so that each step's gradient has zeros
        on = psworker_run(self, "psd-zeros-on", ["--skip-zeros", "on", "--compress", "off"], 1, 400)
        off = psworker_run(self, "psd-zeros-off", ["--skip-zeros", "off", "--compress", "off"], 1, 400)
        sys.stderr.write("zeros: on %d bytes in, %d values left out; off %d bytes in (%d pushes)\n" % (
            on["in"], on["elided"], off["in"], off["pushes"]))
        self.assertEqual((on["steps"], on["pushes"]), (off["steps"], off["pushes"]))
        np.testing.assert_array_equal(on["model"], off["model"], "the same job, bit for bit")
        self.assertEqual(off["elided"], 0)
        # the units a sample leaves off give their weights zero gradients:
        # a good share of every push
        params = on["params"]
        self.assertGreater(on["elided"], 0.15 * params * on["pushes"])
        # each value left out saves its 4 bytes; a push's bitmap costs a bit
        # a value (in whole words), and "dt" and "len" about 10 bytes more
        saved = off["in"] - on["in"]
        per_push = (params + 31) // 32 * 4 + 16
        self.assertGreater(saved, 4 * on["elided"] - per_push * on["pushes"])
        self.assertLess(saved, 4 * on["elided"])


def tkeys(ks):
    return np.asarray(ks, dtype="<u8").tobytes()


class TableRowsTest(unittest.TestCase):
    """Embedding tables' rows packed on the wire (PROTOCOL.md 13.2): row
    gradients of a TPUSH or TPUSHPULL as bfloat16 ("dt": 1), without their
    zeros (2) or compressed (3) apply exactly as the same float32 values;
    rows pulled by key with "rdt": 1 come as bfloat16 (psd's float32 rows
    rounded), with "rdt": 3 as one zstd frame of their byte planes when that
    saves a sixteenth, else as float32; a conversion is never reused for
    rows that changed since; bad forms are refused with every table as it
    was and the connection going on."""

    DIM = 16
    TABLE = {"t": T_TABLE, "tab": "emb", "dim": 16, "rinit": "zeros", "opt": "sgd", "hp": {"lr": 0.5}}

    def open(self, psd):
        c = RawClient(psd.addr, TIMEOUT)
        r = c.hello_worker([["w", [4]]], 0, 1)
        self.assertEqual(r.get("t"), T_WELCOME, r)
        if r.get("init"):
            self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": harness.floats([0, 0, 0, 0])}).get("t"), T_OK)
        self.assertEqual(c.request(self.TABLE).get("t"), T_OK)
        return c

    def rows(self, c, ks, **extra):
        r = c.request(dict({"t": T_TPULL, "tab": "emb", "keys": tkeys(ks)}, **extra))
        self.assertEqual(r.get("t"), T_ROWS, r)
        return r

    def f32(self, c, ks):
        r = self.rows(c, ks)
        self.assertNotIn("dt", r)
        return np.frombuffer(r["data"], "<f4").reshape(len(ks), self.DIM).copy()

    def test_forms(self):
        rng = np.random.default_rng(5)
        n = 512
        ks = [int(k) for k in rng.choice(1 << 40, n, replace=False)]
        # values bfloat16 holds exactly, so that every form carries the same numbers
        g = harness.bf16_widen(harness.bf16_bytes(rng.standard_normal((n, self.DIM)) * 0.25)).reshape(n, self.DIM)
        g[:, 8:] = 0  # half of each row zero: worth leaving out, and compressible
        g[3, 0] = np.float32(-0.0)
        with harness.Cluster("test-packed-tables") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=SGD)
            ref = cl.psd(mode="asgd", workers=1, args=SGD, name="psd-ref")
            c, r = self.open(psd), self.open(ref)
            forms = [(DT_BF16, {"data": harness.bf16_bytes(g)}),
                     (DT_F32Z, {"data": f32z(g.reshape(-1)), "len": g.size}),
                     (DT_F32ZSTD, {"data": zstd(g.tobytes()), "len": g.size})]
            for i, (dt, extra) in enumerate(forms):
                push = dict({"t": T_TPUSH, "tab": "emb", "keys": tkeys(ks), "base": 0, "dt": dt}, **extra)
                self.assertEqual(c.request(push).get("t"), T_OK, "dt %d" % dt)
                want = {"t": T_TPUSH, "tab": "emb", "keys": tkeys(ks), "base": 0, "data": g.tobytes()}
                self.assertEqual(r.request(want).get("t"), T_OK)
                self.assertEqual(self.f32(c, ks).tobytes(), self.f32(r, ks).tobytes(), "after dt %d" % dt)
            # a TPUSHPULL too, whose rows come back compressed
            got = c.request({"t": T_TPUSHPULL, "tab": "emb", "keys": tkeys(ks), "base": 0, "dt": DT_F32ZSTD,
                             "data": zstd(g.tobytes()), "len": g.size, "pkeys": tkeys(ks), "rdt": DT_F32ZSTD})
            r.request({"t": T_TPUSH, "tab": "emb", "keys": tkeys(ks), "base": 0, "data": g.tobytes()})
            now = self.f32(r, ks)
            self.assertEqual(got.get("t"), T_ROWS, got)
            self.assertEqual((got.get("dt"), got.get("len")), (DT_F32ZSTD, now.size))
            self.assertLessEqual(len(got["data"]) * 16, now.nbytes * 15)
            self.assertEqual(unzstd(got["data"], now.nbytes), now.tobytes())
            # bfloat16 rows: psd's float32 rows rounded
            b = self.rows(c, ks, rdt=DT_BF16)
            self.assertEqual(b.get("dt"), DT_BF16)
            self.assertEqual(b["data"], harness.bf16_bytes(now))
            # a push between two bfloat16 pulls: the second has the new rows
            # (psd's rows come in fresh blocks, never a conversion made before)
            one = np.full((1, self.DIM), 0.5, "<f4")
            for p in (c, r):
                p.request({"t": T_TPUSH, "tab": "emb", "keys": tkeys(ks[:1]), "base": 0, "data": one.tobytes()})
            now = self.f32(r, ks)
            for rdt in (DT_BF16, DT_F32ZSTD):
                b = self.rows(c, ks, rdt=rdt)
                data = b["data"] if rdt == DT_BF16 else unzstd(b["data"], now.nbytes)
                self.assertEqual(data, harness.bf16_bytes(now) if rdt == DT_BF16 else now.tobytes(), rdt)
            # rows of random bits, whose frame would not save a sixteenth, come as float32
            bits = rng.integers(0, 1 << 32, (2, self.DIM), dtype=np.uint64)
            bits = (bits & 0x807FFFFF) | (rng.integers(100, 150, (2, self.DIM), dtype=np.uint64) << 23)
            noise = bits.astype("<u4").view("<f4")
            fresh = [1, 2]
            for p in (c, r):
                p.request({"t": T_TPUSH, "tab": "emb", "keys": tkeys(fresh), "base": 0, "data": noise.tobytes()})
            z = self.rows(c, fresh, rdt=DT_F32ZSTD)
            self.assertNotIn("dt", z)
            self.assertEqual(z["data"], self.f32(r, fresh).tobytes())
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertGreater(harness.metric(samples, "psd_wire_zstd_received_bytes_total"), 0)
            self.assertGreater(harness.metric(samples, "psd_wire_zeros_elided_total"), 0)

            # refused, the table as it was, the connection going on
            before = self.f32(c, ks)
            bad = [({"t": T_TPUSH, "dt": DT_F32ZSTD, "data": b"garbage!", "len": g.size}, E_BAD_FIELD,
                    "not one zstd frame"),
                   ({"t": T_TPUSH, "dt": DT_F32ZSTD, "data": zstd(g.tobytes()), "len": g.size - 1}, E_BAD_FIELD,
                    "8191 values for 512 keys"),
                   ({"t": T_TPUSH, "dt": DT_F32ZSTD, "data": zstd(g.tobytes())}, E_BAD_FIELD, "needs 'len'"),
                   ({"t": T_TPUSH, "dt": DT_BF16, "data": harness.bf16_bytes(np.full(g.shape, np.nan))},
                    E_NONFINITE, "NaN or infinity"),
                   ({"t": T_TPULL, "rdt": 2}, E_UNSUPPORTED, "'rdt' 2"),
                   ({"t": T_TPULL, "keys": None, "off": 0, "len": 4, "rdt": DT_BF16}, E_UNSUPPORTED, "'rdt' 1"),
                   ({"t": T_TPUSHPULL, "data": g.tobytes(), "pkeys": tkeys(ks), "rdt": 2}, E_UNSUPPORTED,
                    "'rdt' 2")]
            for extra, code, needle in bad:
                msg = dict({"tab": "emb", "keys": tkeys(ks), "base": 0}, **extra)
                msg = {k: v for k, v in msg.items() if v is not None}
                if msg["t"] == T_TPULL:
                    msg.pop("base")
                got = c.request(msg)
                expect_error(self, got, code, needle)
                self.assertIn(needle, got.get("text", ""))
                self.assertEqual(self.f32(c, ks).tobytes(), before.tobytes(), needle)
            c.close()
            r.close()

        # a psd without bfloat16 refuses it for rows too
        with harness.Cluster("test-packed-tables-nobf16") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=SGD + ["--set", "wire_bf16=no"])
            c = self.open(psd)
            got = c.request({"t": T_TPUSH, "tab": "emb", "keys": tkeys(ks[:1]), "base": 0, "dt": DT_BF16,
                             "data": harness.bf16_bytes(g[:1])})
            expect_error(self, got, E_UNSUPPORTED, "bf16 rows")
            self.assertIn("wire_bf16 = no", got["text"])
            got = c.request({"t": T_TPULL, "tab": "emb", "keys": tkeys(ks[:1]), "rdt": DT_BF16})
            expect_error(self, got, E_UNSUPPORTED, "bf16 rows back")
            self.assertIn("wire_bf16 = no", got["text"])
            c.close()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
