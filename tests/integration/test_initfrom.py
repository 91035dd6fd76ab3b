#!/usr/bin/python3
"""test_initfrom.py - psd starting from a safetensors file (--init-from, init_from).

- A short job's model, kept with `psctl save`, is the model of a new psd
  started with --init-from: status names the file, the first pull answers
  the saved values exactly, and a worker trains on from them (its first
  epoch's loss is below that of the same worker from scratch).
- A worker whose layout differs is told the layout comes from the file.
- psd refuses to start, naming the file and what is wrong, for a missing
  file, a truncated one, a header that is not safetensors' JSON and a
  dtype other than F32; and for a state dir holding a checkpoint unless
  --fresh is given (then it starts from the file).
"""

import json
import os
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import E_LAYOUT, T_PARAMS, T_PULL  # noqa: E402

MODEL = "mlp:32"
LAYOUT_TOTAL = 784 * 32 + 32 + 32 * 10 + 10


def saved_vector(path):
    """The saved tensors as the flat vector, in the order of their data."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return np.frombuffer(blob[8 + n:], dtype="<f4")


def first_loss(w):
    rc, summary = w.result(120)
    if rc != 0:
        raise AssertionError("%s exited %d\n%s" % (w.name, rc, w.stderr()))
    lines = [json.loads(l) for l in w.stdout().splitlines() if l.startswith("{\"epoch\": 1,")]
    return lines[0]["train_loss"]


class InitFromTest(unittest.TestCase):
    def save_job(self, cl):
        psd = cl.psd(mode="asgd", workers=1, name="psd-first")
        w = cl.worker(psd, 0, 1, epochs=2, limit=3000, test_limit=200, model=MODEL)
        rc, _ = w.result(120)
        self.assertEqual(rc, 0, w.stderr())
        path = os.path.join(cl.dir, "trained.safetensors")
        r = harness.psctl(psd.addr, "save", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        psd.stop()
        return path

    def start_fails(self, *args):
        r = harness.run([harness.Paths.psd, "--listen", "127.0.0.1:0"] + list(args), timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        return r.stderr

    def test_trains_on_from_the_file(self):
        with harness.Cluster("psd-initfrom") as cl:
            path = self.save_job(cl)
            saved = saved_vector(path)
            self.assertEqual(saved.size, LAYOUT_TOTAL)
            psd = cl.psd(mode="asgd", workers=1, name="psd-from", args=("--init-from", path))
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertEqual(st["init_from"], path)
            self.assertEqual(st["version"], 0)
            r = harness.psctl(psd.addr, "status")
            self.assertIn("model from %s at start (init_from)" % path, r.stdout)
            self.assertIn("model from %s (init_from): 4 tensors, %d parameters" % (path, LAYOUT_TOTAL),
                          psd.stderr())
            with harness.RawClient(psd.addr) as c:
                c.hello_admin()
                p = c.request({"t": T_PULL, "id": 2, "off": 0, "len": LAYOUT_TOTAL})
                self.assertEqual(p.get("t"), T_PARAMS, p)
                np.testing.assert_array_equal(np.frombuffer(p["data"], dtype="<f4"), saved)
            # a worker of another layout is told where psd's comes from
            with harness.RawClient(psd.addr) as c:
                r = c.hello_worker([["w", [3, 3]]], 0, 1)
                harness.expect_error(self, r, E_LAYOUT, "a hello of another layout")
                self.assertIn("from %s (init_from" % path, r["text"])
            # training goes on from the saved model: its first epoch's loss
            # is below the same worker's from scratch
            args = ("--epoch-json", "--seed", "7", "--no-shuffle")
            w = cl.worker(psd, 0, 1, epochs=1, limit=1000, test_limit=200, model=MODEL, args=args)
            on = first_loss(w)
            scratch = cl.psd(mode="asgd", workers=1, name="psd-scratch")
            w2 = cl.worker(scratch, 0, 1, epochs=1, limit=1000, test_limit=200, model=MODEL, args=args)
            fresh = first_loss(w2)
            self.assertLess(on, fresh * 0.8, "loss from the saved model %g, from scratch %g" % (on, fresh))
            self.assertIn("model initialised by", scratch.stderr())
            self.assertNotIn("model initialised by", psd.stderr())
            psd.stop()
            scratch.stop()

    def test_bad_files(self):
        with harness.Cluster("psd-initfrom-bad") as cl:
            path = self.save_job(cl)
            with open(path, "rb") as f:
                blob = f.read()
            (n,) = struct.unpack("<Q", blob[:8])

            def write(name, data):
                p = os.path.join(cl.dir, name)
                with open(p, "wb") as f:
                    f.write(data)
                return p

            missing = os.path.join(cl.dir, "nothing.safetensors")
            err = self.start_fails("--init-from", missing)
            self.assertIn("cannot open %s: No such file or directory" % missing, err)
            p = write("cut.safetensors", blob[:len(blob) - 100])
            err = self.start_fails("--init-from", p)
            self.assertIn("%s is truncated: its header describes %d bytes of tensor data, the file holds %d"
                          % (p, len(blob) - 8 - n, len(blob) - 8 - n - 100), err)
            p = write("short.safetensors", blob[:5])
            self.assertIn("%s is truncated" % p, self.start_fails("--init-from", p))
            p = write("json.safetensors", struct.pack("<Q", 16) + b"{\"a\": [1, 2,   " + b"\0" * 64)
            self.assertIn("%s: bad header: not JSON" % p, self.start_fails("--init-from", p))
            p = write("huge.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
            self.assertIn("%s: bad header: its length field says" % p, self.start_fails("--init-from", p))
            header = json.loads(blob[8:8 + n])
            name = [k for k in header if k != "__metadata__"][0]
            header[name]["dtype"] = "F16"
            h = json.dumps(header).encode()
            p = write("f16.safetensors", struct.pack("<Q", len(h)) + h + blob[8 + n:])
            err = self.start_fails("--init-from", p)
            self.assertIn("%s: tensor '%s' has dtype F16; psd holds float32 only (F32)" % (p, name), err)

    def test_checkpoint_conflicts(self):
        with harness.Cluster("psd-initfrom-ckpt") as cl:
            path = self.save_job(cl)
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, name="psd-ckpt", args=("--state-dir", state))
            w = cl.worker(psd, 0, 1, epochs=1, limit=500, test_limit=100, model=MODEL)
            self.assertEqual(w.result(120)[0], 0, w.stderr())
            psd.stop()  # a checkpoint at the end
            err = self.start_fails("--state-dir", state, "--init-from", path)
            self.assertIn("init_from %s, but the state dir %s holds a checkpoint" % (path, state), err)
            self.assertIn("start with --fresh", err)
            psd = cl.psd(mode="asgd", workers=1, name="psd-fresh",
                         args=("--state-dir", state, "--init-from", path, "--fresh"))
            st = harness.status(psd.addr)
            self.assertEqual(st["init_from"], path)
            self.assertIsNone(st["resumed_from"])
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
