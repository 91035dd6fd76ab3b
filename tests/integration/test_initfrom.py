#!/usr/bin/python3
"""test_initfrom.py - psd starting from a safetensors file (--init-from, init_from).

- A short job's model, kept with `psctl save`, is the model of a new psd
  started with --init-from: status names the file, the first pull answers
  the saved values exactly, and a worker trains on from them (its first
  epoch's loss is below that of the same worker from scratch).
- A worker whose layout differs is told the layout comes from the file.
- psd refuses to start, naming the file and what is wrong, for a missing
  file, a truncated one, a header that is not safetensors' JSON, a dtype
  other than F32 and a NaN or an infinity among the values; and for a
  state dir holding a checkpoint unless --fresh is given (then it starts
  from the file).
- Headers far beyond any psd model (300,000 tensors in 22 MB, 3 million
  metadata values, one 40 MB string) are refused with a message, and
  psd's peak RSS meanwhile (wait4's ru_maxrss) stays within the header's
  size plus 64 MiB (issue 32: 320 MB for the first); so does one just
  within the counts psd parses (65,400 values).
"""

import json
import os
import struct
import subprocess
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


# Writes a safetensors file (header only) far beyond any psd model: argv
# [1] is the kind, [2] the path.
HUGE_HEADER = r"""
import struct, sys
entry = '"t%d": {"dtype": "F32", "shape": [1], "data_offsets": [%d, %d]}'
kind, path = sys.argv[1], sys.argv[2]
if kind == "tensors":  # issue 32's: 300,000 tensors in 22 MB
    h = "{" + ", ".join(entry % (i, 4 * i, 4 * i + 4) for i in range(300000)) + "}"
elif kind == "values":  # a few tensors, 3 million metadata values
    h = '{"__metadata__": {' + ", ".join('"k%d": "v"' % i for i in range(3000000)) + '}, ' + entry % (0, 0, 4) + "}"
elif kind == "string":  # one metadata string of 40 MiB
    h = '{"__metadata__": {"k": "' + "x" * (40 << 20) + '"}, ' + entry % (0, 0, 4) + "}"
else:  # 65,400 values, the most psd parses, of the kind that costs jansson most
    h = '{"__metadata__": {' + ", ".join('"k%d": {}' % i for i in range(32700)) + '}, ' + entry % (0, 0, 4) + "}}"
h = h.encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
"""


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
            # a NaN or an infinity among the values, in a file as psctl
            # save writes it: psd stops naming the file (issue 47: it
            # started with no model)
            data = header[name]["data_offsets"][0] // 4
            for bad, label in ((np.nan, "nan"), (-np.inf, "neginf"), (np.inf, "inf")):
                vals = np.frombuffer(blob[8 + n:], dtype="<f4").copy()
                vals[data + 5] = bad
                p = write(label + ".safetensors", blob[:8 + n] + vals.tobytes())
                err = self.start_fails("--init-from", p)
                self.assertIn("%s: tensor '%s' holds NaN or infinity (value %d of the model)" % (p, name, data + 5),
                              err)
                self.assertNotIn("(init_from): 0 tensors", err)

    def peak_refusing(self, path):
        """psd --init-from path must refuse it: its stderr and peak RSS
        (bytes), from wait4."""
        p = subprocess.Popen([harness.Paths.psd, "--listen", "127.0.0.1:0", "--init-from", path],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = b""
        try:
            err = p.stderr.read()  # until psd exits and its end closes
        finally:
            p.stderr.close()
            timer = __import__("threading").Timer(60, p.kill)
            timer.start()
            _, status, usage = os.wait4(p.pid, 0)
            timer.cancel()
            p.returncode = os.waitstatus_to_exitcode(status)
        self.assertEqual(p.returncode, 1, err.decode(errors="replace"))
        return err.decode(errors="replace"), usage.ru_maxrss * 1024

    def test_huge_headers(self):
        slack = max(0, int(os.environ.get("PSD_TEST_RSS_SLACK_MB", "50")) - 50)  # sanitizers' own
        cases = {"tensors": "more than 2176 tensors in its header; psd takes 1 to 2048 of the model and 2 per table "
                            "(keys, rows) for up to 64 tables",
                 "values": "bad header: more than 65536 JSON values",
                 "string": "bad header: a string or number over 4 MiB",
                 # just within the counts: jansson builds it all, then meets a stray }
                 "objects": "bad header: not JSON"}
        with harness.Cluster("psd-initfrom-huge") as cl:
            for name, says in cases.items():
                path = os.path.join(cl.dir, name + ".safetensors")
                # written by another process: a child's ru_maxrss counts
                # the memory of the process it was forked from
                r = subprocess.run([sys.executable, "-c", HUGE_HEADER, name, path], capture_output=True, text=True,
                                   timeout=120)
                self.assertEqual(r.returncode, 0, r.stderr)
                err, peak = self.peak_refusing(path)
                size = os.path.getsize(path) - 8
                self.assertLess(peak, size + ((64 + slack) << 20),
                                "%s: %.1f MB header, psd's peak RSS %.1f MB" % (name, size / 1e6, peak / 1e6))
                self.assertIn("%s: %s" % (path, says), err)
                print("%s: %.1f MB header refused at a peak RSS of %.1f MB" % (name, size / 1e6, peak / 1e6),
                      file=sys.stderr)
                os.unlink(path)

    def test_full_layout_with_tables(self):
        """A file of 2048 model tensors (the most a layout holds) and 64
        tables (2 tensors each, as psctl save writes them) has 2177 header
        entries: psd starts from it, with every tensor and table; 2049 model
        tensors are still refused."""
        def write(path, ntensors, ntables):
            header, blob = {}, b""
            for i in range(ntensors):
                v = np.full(2, i, np.float32).tobytes()
                header["t%04d" % i] = {"dtype": "F32", "shape": [2], "data_offsets": [len(blob), len(blob) + 8]}
                blob += v
            decls = []
            for i in range(ntables):
                name = "tab%02d" % i
                decls.append({"name": name, "dim": 2, "rinit": "zeros", "scale": 0.0, "seed": 0, "opt": "sgd",
                              "hp": {"lr": 0.01}})
                rows = np.array([[i, 0.5], [i, -0.5]], np.float32).tobytes()
                ks = np.array([7, 1 << 40], np.uint64).tobytes()
                header["tables/%s/rows" % name] = {"dtype": "F32", "shape": [2, 2],
                                                   "data_offsets": [len(blob), len(blob) + len(rows)]}
                blob += rows
                header["tables/%s/keys" % name] = {"dtype": "I64", "shape": [2],
                                                   "data_offsets": [len(blob), len(blob) + len(ks)]}
                blob += ks
            header["__metadata__"] = {"psd.tables": json.dumps(decls)}
            h = json.dumps(header).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(h)) + h + blob)

        with harness.Cluster("psd-initfrom-entries") as cl:
            path = os.path.join(cl.dir, "full.safetensors")
            write(path, 2048, 64)
            psd = cl.psd(mode="asgd", workers=1, args=("--init-from", path))
            st = harness.status(psd.addr)
            tables = {t["name"]: t["rows"] for t in st["tables"]}
            self.assertEqual(len(tables), 64)
            self.assertEqual(set(tables.values()), {2})
            psd.stop()
            write(path, 2049, 1)
            err = self.start_fails("--init-from", path)
            self.assertIn("2049 tensors; psd takes 1 to 2048", err)

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
    harness.main()
