#!/usr/bin/python3
"""test_shm.py - workers on psd's machine push and pull through shared memory.

A psworker offers psd a memfd sealed against shrinking and growing (hello
"shm": [pid, fd]); psd maps it when it can and says "inshm" in its welcome;
pushpulls then carry the tensors in the segment instead of in the frame.

- Real workers: two of them train through shared memory (their summaries,
  psctl's workers and psd's log say so), and a BSP job with the same seed
  ends bit for bit where the same job over TCP (--shm off) ends.
- A raw client (Python's msgpack, its own memfd): a regular file, a file
  of a tmpfs, another process's good memfd, an unsealed memfd and one of
  the wrong size are refused with the reason in
  psd's log and the connection stays on TCP, where "inshm" is an error; a
  good segment carries a gradient in and the parameters out (equal to a
  TCP pull of the same version); a NaN written there is refused like a NaN
  in a frame; out-of-range and bfloat16 requests are refused; the
  connection keeps working after each.
- A worker on another machine (a network namespace of our own, which sees
  the same processes but reaches psd over a link of its own) cannot have
  psd map a segment: psd refuses before it looks, while the same hello
  from this machine, through the same address, is accepted. Needs root
  and iproute2; skipped otherwise.
"""

import fcntl
import json
import mmap
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_NONFINITE, E_RANGE, E_STATE, E_UNSUPPORTED, T_BYE, T_INIT, T_OK, T_PARAMS,  # noqa: E402
                     T_PULL, T_PUSHPULL, T_WELCOME, RawClient, expect_error, floats, memfd)

LAYOUT = [["w", [1000]], ["b", [24]]]
TOTAL = harness.layout_size(LAYOUT)
REPLY_TIMEOUT = 10.0


class ShmTest(unittest.TestCase):
    def test_real_workers_share_memory(self):
        with harness.Cluster("psd-shm-train") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=harness.ASGD_ARGS)
            # --wire bf16 is for tensors on the wire; through shared memory
            # they stay float32, and the pushpulls must not ask for bf16
            # 5 epochs: on a quiet machine one worker may finish before the
            # other has joined, and 2 epochs alone (94 steps) gave 74%. A
            # worker's last evaluation is of the model at that moment: the
            # first to finish may evaluate it just as the other's first pushes
            # of its own shard land (71.6% once, after 89.1% an epoch before),
            # so the model is judged by the last evaluation, of the model
            # both trained, and each worker by having trained at all
            ws = [cl.worker(psd, k, 2, epochs=5, limit=6000, test_limit=1000, args=("--wire", ("f32", "bf16")[k]))
                  for k in range(2)]
            last = []
            for w in ws:
                rc, summary = w.result(timeout=120)
                self.assertEqual(rc, 0, harness.tail(w.err_path, 5))
                self.assertIs(summary["shm"], True, summary)
                self.assertGreater(summary["test_accuracy"], 0.5, summary)
                last.append((summary["version"], summary["test_accuracy"]))
            self.assertGreater(max(last)[1], 0.8, last)
            st = harness.status(psd.addr)
            self.assertEqual(sorted(w["transport"] for w in st["workers"]), ["shm", "shm"])
            self.assertEqual(st["version"], st["pushes"])
            psd.stop()
            self.assertEqual(psd.stderr().count("tensors through shared memory"), 2, psd.stderr())

    def test_bsp_same_result_as_tcp(self):
        """BSP sums in shard order, so the same job gives the same model
        whichever way the tensors travel."""
        results = {}
        for shm in ("on", "off"):
            with harness.Cluster("psd-shm-bsp-" + shm) as cl:
                psd = cl.psd(mode="bsp", workers=2)
                ws = [cl.worker(psd, k, 2, epochs=2, limit=4000, test_limit=1000, args=("--shm", shm))
                      for k in range(2)]
                out = []
                for w in ws:
                    rc, summary = w.result(timeout=120)
                    self.assertEqual(rc, 0, harness.tail(w.err_path, 5))
                    self.assertIs(summary["shm"], shm == "on", summary)
                    out.append((summary["version"], summary["test_loss"], summary["test_accuracy"]))
                st = harness.status(psd.addr)
                self.assertEqual({w["transport"] for w in st["workers"]}, {"shm" if shm == "on" else "tcp"})
                psd.stop()
                results[shm] = out
        self.assertEqual(results["on"], results["off"])

    def test_segments_psd_must_refuse(self):
        with harness.Cluster("psd-shm-hostile") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "optimizer=sgd", "--set", "lr=0.5",
                                                       "--set", "momentum=0", "--set", "warmup_versions=0"))
            pid = os.getpid()
            nbytes = TOTAL * 2 * 4
            init = np.linspace(-1, 1, TOTAL, dtype="<f4")

            def refused(fd, why):
                with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                    r = c.hello_worker(LAYOUT, 0, 1, shm=[pid, fd])
                    self.assertEqual(r.get("t"), T_WELCOME, r)
                    self.assertNotIn("inshm", r, "psd mapped a segment it must refuse (%s)" % why)
                    if r.get("init"):
                        r = c.request({"t": T_INIT, "off": 0, "data": init.tobytes()})
                        self.assertEqual(r.get("t"), T_OK, r)
                    # "inshm" on a connection without a segment
                    r = c.request({"t": T_PUSHPULL, "base": 0, "off": 0, "len": TOTAL, "inshm": True, "poff": 0,
                                   "plen": TOTAL})
                    expect_error(self, r, E_STATE, "inshm without a segment")
                    r = c.request({"t": T_PULL, "off": 0, "len": TOTAL})
                    self.assertEqual(r.get("t"), T_PARAMS, "the connection works on (%s)" % why)
                    self.assertEqual(c.request({"t": T_BYE}).get("t"), T_OK)
                    c.expect_closed(REPLY_TIMEOUT)
                harness.wait_until(lambda: why in psd.stderr(), 10, "psd to log why: %s" % why)

            with tempfile.TemporaryFile(dir=cl.dir) as f:
                f.truncate(nbytes)
                refused(f.fileno(), "is not a memfd")
            # a file of a tmpfs (seals of its own: F_SEAL_SEAL) is no memfd
            # either, whatever the file system of the test's directory
            if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
                with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="psd-test-shm-") as f:
                    f.truncate(nbytes)
                    refused(f.fileno(), "/dev/shm/psd-test-shm-")
                    self.assertNotIn("%d/fd/%d is a memfd not sealed" % (pid, f.fileno()), psd.stderr())
            # another process's memfd, good in every other way: psd maps
            # only a segment of the process at the other end of the
            # connection (issue 15, 8)
            other = subprocess.Popen(
                [sys.executable, "-c",
                 "import os, fcntl, sys\n"
                 "fd = os.memfd_create('victim', os.MFD_ALLOW_SEALING)\n"
                 "os.ftruncate(fd, %d)\n"
                 "fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)\n"
                 "print(os.getpid(), fd, flush=True)\n"
                 "sys.stdin.read()\n" % nbytes],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                opid, ofd = map(int, other.stdout.readline().split())
                with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                    r = c.hello_worker(LAYOUT, 0, 1, shm=[opid, ofd])
                    self.assertEqual(r.get("t"), T_WELCOME, r)
                    self.assertNotIn("inshm", r, "psd mapped another process's memfd")
                    if r.get("init"):
                        r = c.request({"t": T_INIT, "off": 0, "data": init.tobytes()})
                        self.assertEqual(r.get("t"), T_OK, r)
                    self.assertEqual(c.request({"t": T_BYE}).get("t"), T_OK)
                why = "pid %d named in the hello is not the process at the other end of the connection" % opid
                harness.wait_until(lambda: why in psd.stderr(), 10, "psd to log why: %s" % why)
            finally:
                other.stdin.close()
                other.stdout.close()
                other.wait(10)
            fd = memfd(nbytes, seals=0)
            refused(fd, "is a memfd not sealed against shrinking and growing")
            os.close(fd)
            fd = memfd(nbytes, seals=fcntl.F_SEAL_SHRINK)
            refused(fd, "is a memfd not sealed against shrinking and growing")
            os.close(fd)
            fd = memfd(nbytes - 4)
            refused(fd, "not 2 x %d floats" % TOTAL)
            os.close(fd)
            refused(987654, "cannot open /proc/%d/fd/987654" % pid)

            fd = memfd(nbytes)
            seg = mmap.mmap(fd, nbytes)
            grad = np.frombuffer(seg, dtype="<f4", count=TOTAL)
            params = np.frombuffer(seg, dtype="<f4", count=TOTAL, offset=TOTAL * 4)
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker(LAYOUT, 0, 1, shm=[pid, fd])
                self.assertEqual(r.get("t"), T_WELCOME, r)
                self.assertIs(r.get("inshm"), True, r)
                ver = r["ver"]
                grad[:] = 1.0
                params[:] = 0.0
                r = c.request({"t": T_PUSHPULL, "base": ver, "off": 0, "len": TOTAL, "inshm": True, "poff": 0,
                               "plen": TOTAL})
                self.assertEqual(r.get("t"), T_PARAMS, r)
                self.assertIs(r.get("inshm"), True, r)
                self.assertNotIn("data", r)
                self.assertEqual((r.get("off"), r.get("len"), r.get("ver")), (0, TOTAL, ver + 1))
                # plain SGD, lr 0.5: every value moved by -0.5, and the
                # segment holds what a TCP pull of the same version gives
                np.testing.assert_allclose(params, init - 0.5, rtol=0, atol=1e-6)
                r = c.request({"t": T_PULL, "off": 0, "len": TOTAL})
                self.assertEqual(r.get("ver"), ver + 1)
                self.assertEqual(bytes(params), r["data"])
                # a NaN in the segment is refused as in a frame; the
                # segment's parameters are not touched
                grad[7] = np.nan
                params[:] = 42.0
                r = c.request({"t": T_PUSHPULL, "base": ver + 1, "off": 0, "len": TOTAL, "inshm": True,
                               "poff": 0, "plen": TOTAL})
                expect_error(self, r, E_NONFINITE, "a NaN in the segment")
                self.assertTrue(np.all(params == 42.0))
                grad[7] = 0.0
                r = c.request({"t": T_PUSHPULL, "base": ver + 1, "off": 1, "len": TOTAL, "inshm": True,
                               "poff": 0, "plen": TOTAL})
                expect_error(self, r, E_RANGE, "a push past the segment's end")
                r = c.request({"t": T_PUSHPULL, "base": ver + 1, "off": 0, "len": 10, "inshm": True,
                               "poff": TOTAL - 5, "plen": 10})
                expect_error(self, r, E_RANGE, "a pull past the segment's end")
                r = c.request({"t": T_PUSHPULL, "base": ver + 1, "off": 0, "len": 10, "inshm": True,
                               "poff": 0, "plen": 10, "rdt": 1})
                expect_error(self, r, E_UNSUPPORTED, "bfloat16 through the segment")
                # none of them was applied; a partial one is
                grad[:] = 0.0
                grad[:10] = 2.0
                r = c.request({"t": T_PUSHPULL, "base": ver + 1, "off": 0, "len": 10, "inshm": True,
                               "poff": 0, "plen": 10})
                self.assertEqual((r.get("t"), r.get("ver"), r.get("len")), (T_PARAMS, ver + 2, 10), r)
                np.testing.assert_allclose(params[:10], init[:10] - 1.5, rtol=0, atol=1e-6)
                self.assertTrue(np.all(params[10:] == 42.0), "only the range asked for is written")
                # a TCP pushpull on the same connection still works
                r = c.request({"t": T_PUSHPULL, "base": ver + 2, "off": 0, "data": floats([0.0] * 4), "poff": 0,
                               "plen": 4})
                self.assertEqual(r.get("t"), T_PARAMS, r)
                self.assertEqual(len(r["data"]), 16)
                self.assertEqual(c.request({"t": T_BYE}).get("t"), T_OK)
                c.expect_closed(REPLY_TIMEOUT)
            del grad, params
            seg.close()
            os.close(fd)
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertGreater(harness.metric(samples, "psd_rejected_messages_total", reason="nonfinite"), 0)
            psd.stop()


# Run by /usr/bin/python3 in the namespace or here: says hello to psd at
# argv[1] offering a good segment, prints whether psd took it.
HELLO_FROM = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
import harness, test_shm
fd = test_shm.memfd(test_shm.TOTAL * 2 * 4)
with harness.RawClient(sys.argv[1], test_shm.REPLY_TIMEOUT) as c:
    r = c.hello_worker(test_shm.LAYOUT, 0, 1, shm=[os.getpid(), fd])
    if r.get("init"):
        c.request({"t": harness.T_INIT, "off": 0, "data": bytes(test_shm.TOTAL * 4)})
    c.request({"t": harness.T_BYE})
print(json.dumps({"welcome": r.get("t") == harness.T_WELCOME, "inshm": r.get("inshm", False)}))
"""


class OtherHostTest(unittest.TestCase):
    def setUp(self):
        why = harness.why_no_netns()
        if why:
            self.skipTest(why)
        self.ns = "psdshm%d" % os.getpid()
        self.veth = "psv%d" % (os.getpid() % 100000)
        self.here, self.there = "10.213.7.1", "10.213.7.2"
        steps = [["ip", "netns", "add", self.ns],
                 ["ip", "link", "add", self.veth + "a", "type", "veth", "peer", "name", self.veth + "b"],
                 ["ip", "link", "set", self.veth + "b", "netns", self.ns],
                 ["ip", "addr", "add", self.here + "/30", "dev", self.veth + "a"],
                 ["ip", "link", "set", self.veth + "a", "up"],
                 ["ip", "netns", "exec", self.ns, "ip", "addr", "add", self.there + "/30", "dev", self.veth + "b"],
                 ["ip", "netns", "exec", self.ns, "ip", "link", "set", self.veth + "b", "up"],
                 ["ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up"]]
        self.addCleanup(self._teardown)
        for cmd in steps:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            if r.returncode != 0:
                self.skipTest("cannot make a network namespace here: %s: %s" % (" ".join(cmd), r.stderr.strip()))

    def _teardown(self):
        subprocess.run(["ip", "link", "del", self.veth + "a"], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)

    def hello(self, addr, netns=None):
        cmd = ["/usr/bin/python3", "-c", HELLO_FROM, addr, os.path.dirname(os.path.abspath(__file__))]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_no_segment_from_another_machine(self):
        with harness.Cluster("psd-shm-remote") as cl:
            psd = cl.psd(mode="asgd", workers=1,
                         args=("--listen", "0.0.0.0:0", "--set", "allow_remote_without_token=yes"))
            addr = "%s:%d" % (self.here, psd.port)
            # from this machine, through the link's address: psd maps it
            self.assertEqual(self.hello(addr), {"welcome": True, "inshm": True})
            # from the namespace: the same process table, another host to psd
            self.assertEqual(self.hello(addr, netns=self.ns), {"welcome": True, "inshm": False})
            harness.wait_until(lambda: "the worker is not on psd's machine" in psd.stderr(), 10,
                               "psd to log why it refused the segment")
            self.assertIn("(%s:" % self.there, psd.stderr())
            self.assertEqual(psd.stderr().count("tensors through shared memory"), 1, psd.stderr())
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
