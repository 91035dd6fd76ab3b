"""test_ckpt_stall.py - a checkpoint of a table does not stop psd answering.

psd holds a table of some tens of MB (dim 64, AdaGrad: 129 floats a row).
With PSD_TEST_CKPT_SLOW_US (test only) its checkpoint pauses 40 ms per MiB
of rows read, so writing it takes seconds. While `psctl checkpoint` waits
for it, a worker pulls rows over and over: every pull is answered within
0.5 s (reading the rows on psd's loop, as psd once did, stalled it for the
whole read). The file is then loaded by a new psd, which answers the same
rows bit for bit. A second slowed checkpoint is cut short by kill -9 of
psd: its writer process dies with psd (no orphan renames a file later) and
the previous checkpoint is the one loaded.
"""

import glob
import os
import re
import signal
import struct
import subprocess
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import T_INIT, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

LAYOUT = [["w", [4]]]
DIM = 64
NKEYS = 80000  # 80000 rows of 129 floats and a key: about 42 MB
BATCH = 4000
SLOW_US = 40000  # per MiB: about 1.6 s for the rows
TABLE = {"t": T_TABLE, "tab": "emb", "dim": DIM, "rinit": "uniform", "scale": 0.05, "seed": 3, "opt": "adagrad",
         "hp": {"lr": 0.1}}


def keys(ks):
    return np.asarray(ks, "<u8").tobytes()


def children(pid):
    out = []
    for t in glob.glob("/proc/%d/task/*/children" % pid):
        with open(t) as f:
            out += [int(x) for x in f.read().split()]
    return out


class CkptStall(unittest.TestCase):
    def pull(self, w, ks):
        t0 = time.monotonic()
        r = w.request({"t": T_TPULL, "tab": "emb", "keys": keys(ks)})
        dt = time.monotonic() - t0
        self.assertEqual(r.get("t"), T_ROWS, r)
        return np.frombuffer(r["data"], np.float32).reshape(len(ks), DIM), dt

    def connect(self, psd):
        w = RawClient(psd.addr, 30.0)
        r = w.hello_worker(LAYOUT, 0, 1)
        self.assertEqual(r.get("t"), harness.T_WELCOME, r)
        if r.get("init"):
            self.assertEqual(w.request({"t": T_INIT, "off": 0, "data": struct.pack("<4f", 1, 2, 3, 4)}).get("t"), T_OK)
        self.assertEqual(w.request(TABLE).get("t"), T_OK)
        return w

    def pulls_during(self, w, proc, tmp):
        """Pulls until proc (psctl checkpoint) exits; returns the latencies
        of the pulls made while tmp (the file being written) existed."""
        lat = []
        deadline = time.monotonic() + 120
        i = 0
        while proc.poll() is None and time.monotonic() < deadline:
            ks = np.arange(i * 500, i * 500 + 500) % NKEYS
            i += 1
            writing = bool(glob.glob(tmp))
            _, dt = self.pull(w, ks)
            if writing and glob.glob(tmp):
                lat.append(dt)
        return lat

    def test_pulls_answered_while_a_table_is_checkpointed(self):
        env = dict(os.environ, PSD_TEST_CKPT_SLOW_US=str(SLOW_US))
        with harness.Cluster("ckpt-stall") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, args=["--state-dir", state], env=env)
            w = self.connect(psd)
            g = np.full((BATCH, DIM), 0.5, np.float32)
            for lo in range(0, NKEYS, BATCH):  # the rows come to be by pushes
                self.assertEqual(w.request({"t": T_TPUSH, "tab": "emb", "keys": keys(np.arange(lo, lo + BATCH)),
                                            "base": 0, "data": g.tobytes()}).get("t"), T_OK)
            sample = np.arange(0, NKEYS, 997)
            before, _ = self.pull(w, sample)

            t0 = time.monotonic()
            ck = subprocess.Popen([harness.Paths.psctl, "--server", psd.addr, "--timeout", "120000", "checkpoint"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lat = self.pulls_during(w, ck, os.path.join(state, "ckpt-*.psdc.tmp"))
            out, err = ck.communicate(timeout=60)
            took = time.monotonic() - t0
            self.assertEqual(ck.returncode, 0, "psctl checkpoint: %s %s" % (out, err))
            self.assertGreater(took, 1.0, "the slowed checkpoint took %.2f s: too fast to show anything" % took)
            self.assertGreaterEqual(len(lat), 10, "only %d pulls while the file was written in %.2f s" %
                                    (len(lat), took))
            self.assertLess(max(lat), 0.5, "a pull took %.3f s while the checkpoint was written (%d pulls, %.2f s)"
                            % (max(lat), len(lat), took))
            files = glob.glob(os.path.join(state, "ckpt-*.psdc"))
            self.assertEqual(len(files), 1, files)
            first = files[0]

            # a second one, cut short by kill -9 of psd: the writer dies too
            self.assertEqual(w.request({"t": T_TPUSH, "tab": "emb", "keys": keys(np.arange(BATCH)), "base": 0,
                                        "data": g.tobytes()}).get("t"), T_OK)
            ck = subprocess.Popen([harness.Paths.psctl, "--server", psd.addr, "--timeout", "120000", "checkpoint"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            harness.wait_until(lambda: glob.glob(os.path.join(state, "*.tmp")), 30, "a second checkpoint's file")
            writers = children(psd.pid)
            self.assertEqual(len(writers), 1, "one writer process: %r" % writers)
            os.kill(psd.pid, signal.SIGKILL)
            psd.wait(10)
            ck.wait(30)
            harness.wait_until(lambda: not os.path.exists("/proc/%d/stat" % writers[0]) or
                               open("/proc/%d/stat" % writers[0]).read().split()[2] == "Z", 10,
                               "the writer to die with psd")
            w.sock.close()

            psd2 = cl.psd(mode="asgd", workers=1, args=["--state-dir", state], name="psd2")
            self.assertRegex(psd2.stderr(), r"loaded checkpoint %s" % re.escape(first))
            self.assertEqual(glob.glob(os.path.join(state, "*.tmp")), [])
            w2 = self.connect(psd2)
            after, _ = self.pull(w2, sample)
            self.assertEqual(after.tobytes(), before.tobytes(), "the rows restored bit for bit")
            self.assertEqual(glob.glob(os.path.join(state, "ckpt-*.psdc")), [first])
            psd2.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
