#!/usr/bin/python3
"""test_hogwild.py - Hogwild! jobs (PROTOCOL.md section 8): psd keeps the
model in a memfd the workers on its machine map and step in.

- Settings: hogwild with another mode, another optimizer, momentum, weight
  decay, a schedule, warm-up, DC-ASGD, or hogwild_remote without hogwild:
  psd refuses to start, saying what to set.
- The contract, from a client of our own (Python's msgpack, os.memfd): the
  WELCOME names psd's segment and lr; mapped, it holds the initial values;
  steps written into it (values, then the counter) are psd's model and
  version (a pull, psctl status); a worker without a segment pushes over
  TCP into it (hogwild_remote = asgd, the counter counts its step) or is
  refused (refuse); a model over 2^20 values is refused.
- Real workers (psworker): two train W1 through the segment to the usual
  accuracy, the version their steps' count, psd hearing no push; one that
  joins late; one killed by SIGKILL mid-job (the other and psd go on, the
  model stays finite, the shard rejoins); a worker with shared memory off
  beside a local one (asgd) or refused (refuse); a model split over two
  psd refused by the client; a checkpoint written while workers step,
  and psd restarted from it (version and values resume; a worker then
  trains on).
"""

import fcntl
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_FORBIDDEN, E_LIMIT, T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, RawClient,  # noqa: E402
                     expect_error)

LAYOUT = [["w", [1000]], ["b", [24]]]
TOTAL = harness.layout_size(LAYOUT)
HW = ("--set", "hogwild=on", "--set", "optimizer=sgd", "--set", "momentum=0", "--set", "warmup_versions=0")
REPLY_TIMEOUT = 10.0


def hw_args(lr=0.05, *more):
    return HW + ("--set", "lr=%g" % lr) + tuple(more)


def counter_at(n):
    return (n * 4 + 63) // 64 * 64


def own_memfd():
    """A worker's segment of 2 x TOTAL floats, sealed as psd wants it."""
    fd = os.memfd_create("test-hogwild", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 2 * TOTAL * 4)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def save(test, addr, path):
    r = harness.psctl(addr, "save", path)
    test.assertEqual(r.returncode, 0, r.stderr)
    return harness.read_safetensors(path)[1]


class Settings(unittest.TestCase):
    def test_refused_combinations(self):
        base = [harness.Paths.psd, "--print-config", "--listen", "127.0.0.1:0"]
        good = list(HW)
        r = harness.run(base + good)
        self.assertEqual(r.returncode, 0, r.stderr)
        for extra, says in [
                (["--mode", "bsp"], "hogwild updates the model without rounds or clocks: it needs mode = asgd"),
                (["--mode", "ssp"], "it needs mode = asgd"),
                (["--set", "optimizer=adam"], "set optimizer = sgd and momentum = 0"),
                (["--set", "momentum=0.9"], "set optimizer = sgd and momentum = 0"),
                (["--set", "weight_decay=0.01"], "set weight_decay = 0"),
                (["--set", "lr_schedule=cosine"], "lr_schedule = constant"),
                (["--set", "warmup_versions=10"], "warmup_versions = 0"),
                (["--set", "clip_norm=1"], "clip_norm = 0"),
                (["--set", "dc_lambda=0.1"], "dc_lambda = 0"),
                (["--set", "hogwild=off", "--set", "hogwild_remote=refuse"], "hogwild_remote is set but hogwild is off"),
                (["--set", "hogwild_remote=maybe"], "hogwild_remote")]:
            r = harness.run(base + good + extra)
            self.assertNotEqual(r.returncode, 0, "%s accepted" % extra)
            self.assertIn(says, r.stderr, extra)
        # a model over the segment's 2^20 values from init_from
        with harness.Cluster("psd-hogwild-initfrom") as cl:
            path = os.path.join(cl.dir, "big.safetensors")
            n = (1 << 20) + 1
            head = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
            head += b" " * (-len(head) % 8)
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(head)) + head + bytes(4 * n))
            r = harness.run([harness.Paths.psd, "--listen", "127.0.0.1:0", "--init-from", path] + good)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("a Hogwild! job's model is at most 1048576", r.stderr)
        # psd's defaults (adagrad, momentum 0.9) with hogwild alone
        r = harness.run(base + ["--set", "hogwild=on"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("set optimizer = sgd", r.stderr)


class Contract(unittest.TestCase):
    """What an outside client written from PROTOCOL.md alone does."""

    def test_segment_welcome_steps_and_remote(self):
        with harness.Cluster("psd-hogwild-raw") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.5))
            init = np.arange(TOTAL, dtype="<f4") / 100
            fd = own_memfd()
            c = RawClient(psd.addr, REPLY_TIMEOUT)
            r = c.hello_worker(LAYOUT, 0, 2, shm=[os.getpid(), fd])
            self.assertIs(r.get("inshm"), True, r)
            self.assertEqual(r.get("lr"), 0.5, r)
            pid, hfd = r["hogwild"]
            self.assertEqual(pid, psd.p.pid)
            self.assertIs(r.get("init"), True, r)
            self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": init.tobytes()}).get("t"), T_OK)
            f = os.open("/proc/%d/fd/%d" % (pid, hfd), os.O_RDWR)
            self.assertEqual(os.fstat(f).st_size, counter_at(TOTAL) + 64)
            seg = mmap.mmap(f, counter_at(TOTAL) + 64)
            os.close(f)
            w = np.frombuffer(seg, dtype="<f4", count=TOTAL)
            np.testing.assert_array_equal(w, init)
            # one step as a worker takes it: w -= lr * g, then the counter
            g = np.linspace(-1, 1, TOTAL, dtype="<f4")
            w -= np.float32(0.5) * g
            struct.pack_into("<Q", seg, counter_at(TOTAL), struct.unpack_from("<Q", seg, counter_at(TOTAL))[0] + 1)
            after = w.copy()
            st = harness.status(psd.addr)
            self.assertEqual(st["version"], 1)
            self.assertEqual(st["pushes"], 0)
            self.assertEqual([x["transport"] for x in st["workers"]], ["hogwild"])
            r = c.request({"t": T_PULL, "off": 0, "len": TOTAL})
            self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, 1), r)
            self.assertEqual(r["data"], after.tobytes())
            # a worker without a segment (hogwild_remote = asgd): its push
            # is applied into the segment and counted by the counter
            with RawClient(psd.addr, REPLY_TIMEOUT) as tcp:
                r = tcp.hello_worker(LAYOUT, 1, 2)
                self.assertNotIn("hogwild", r)
                self.assertNotIn("inshm", r)
                g2 = np.full(TOTAL, 2.0, dtype="<f4")
                r = tcp.request({"t": T_PUSH, "base": 1, "off": 0, "data": g2.tobytes()})
                self.assertEqual(r.get("t"), T_OK, r)
            np.testing.assert_array_equal(w, after - np.float32(1.0))
            self.assertEqual(struct.unpack_from("<Q", seg, counter_at(TOTAL))[0], 2)
            self.assertEqual(harness.status(psd.addr)["version"], 2)
            # a checkpoint-like snapshot: psctl save holds the segment's values
            t = save(self, psd.addr, os.path.join(cl.dir, "m.safetensors"))
            np.testing.assert_array_equal(np.concatenate([t["w"].reshape(-1), t["b"].reshape(-1)]), w)
            del w
            seg.close()
            c.close()
            os.close(fd)

    def test_refuse_remote_and_big_model(self):
        with harness.Cluster("psd-hogwild-refuse") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.1, "--set", "hogwild_remote=refuse"))
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker(LAYOUT, 0, 2)
                expect_error(self, r, E_FORBIDDEN, "a worker without a segment")
                self.assertIn("this Hogwild! job takes only workers on psd's machine", r.get("text", ""))
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker([["w", [1 << 20]], ["b", [1]]], 0, 2)
                expect_error(self, r, E_LIMIT, "a model over 2^20 values")
                self.assertIn("at most 1048576", r.get("text", ""))
            # psd goes on: a worker with a segment is welcome
            fd = own_memfd()
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker(LAYOUT, 0, 2, shm=[os.getpid(), fd])
                self.assertIn("hogwild", r)
            os.close(fd)


def steps(limit, nshards, epochs, shards, batch=64):
    """The steps psworkers of these shards take in `epochs` epochs."""
    per = harness.steps_per_epoch(limit, nshards, batch, False)
    return epochs * sum(per[k] for k in shards)


class Workers(unittest.TestCase):
    def test_two_workers_train_w1(self):
        with harness.Cluster("psd-hogwild-train") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.05))
            ws = [cl.worker(psd, k, 2, epochs=2, limit=12000, model="mlp:256,128") for k in range(2)]
            out = harness.finish(self, ws, timeout=240)
            for s in out:
                self.assertIs(s["hogwild"], True, s)
                self.assertGreater(s["test_accuracy"], 0.85, s)  # test_train's MIN_ACCURACY
            st = harness.status(psd.addr)
            self.assertEqual(st["version"], steps(12000, 2, 2, (0, 1)))
            self.assertEqual(st["pushes"], 0)
            self.assertEqual(sorted(w["transport"] for w in st["workers"]), ["hogwild", "hogwild"])
            psd.stop()

    def test_late_join_and_killed_worker(self):
        with harness.Cluster("psd-hogwild-faults") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.05))
            # Hogwild! workers take a few hundred milliseconds for six epochs
            # here: each trains for a set time instead, so that both are
            # still stepping while the test watches them
            w0 = cl.worker(psd, 0, 2, epochs=100000, limit=12000, model="mlp:64", args=("--max-seconds", "6"))
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 100, 60, "worker 0's first steps")
            # joins late: it takes the model trained so far
            w1 = cl.worker(psd, 1, 2, epochs=100000, limit=12000, model="mlp:64", name="late",
                           args=("--max-seconds", "120"))
            harness.wait_until(lambda: any(x["shard"] == 1 and x["state"] == "connected"
                                           for x in harness.status(psd.addr)["workers"]), 60, "worker 1 to join")
            v = harness.status(psd.addr)["version"]
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= v + 50, 120, "both stepping")
            w1.p.send_signal(signal.SIGKILL)
            w1.wait(10)
            harness.wait_until(lambda: any(x["shard"] == 1 and x["state"] != "connected"
                                           for x in harness.status(psd.addr)["workers"]), 30, "psd to see it go")
            # psd and worker 0 go on; the model is intact
            s0 = harness.finish(self, [w0], timeout=240)[0]
            self.assertGreater(s0["test_accuracy"], 0.85, s0)
            t = save(self, psd.addr, os.path.join(cl.dir, "m.safetensors"))
            self.assertTrue(all(np.all(np.isfinite(a)) for a in t.values()))
            # the shard comes back and trains on
            again = cl.worker(psd, 1, 2, epochs=1, limit=12000, model="mlp:64", name="again")
            s1 = harness.finish(self, [again], timeout=120)[0]
            self.assertIs(s1["hogwild"], True)
            self.assertGreater(s1["test_accuracy"], 0.85, s1)
            psd.stop()

    def test_remote_worker_asgd_or_refused(self):
        with harness.Cluster("psd-hogwild-remote") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.05))
            ws = [cl.worker(psd, k, 2, epochs=2, limit=6000, model="mlp:64", args=("--shm", ("on", "off")[k]))
                  for k in range(2)]
            out = harness.finish(self, ws, timeout=180)
            self.assertEqual([s["hogwild"] for s in out], [True, False])
            st = harness.status(psd.addr)
            self.assertEqual(st["pushes"], steps(6000, 2, 2, (1,)))       # worker 1's, over TCP
            self.assertEqual(st["version"], steps(6000, 2, 2, (0, 1)))  # and worker 0's, in the segment
            self.assertEqual(sorted(w["transport"] for w in st["workers"]), ["hogwild", "tcp"])
            for s in out:
                self.assertGreater(s["test_accuracy"], 0.8, s)
            psd.stop()
        with harness.Cluster("psd-hogwild-remote-refused") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=hw_args(0.05, "--set", "hogwild_remote=refuse"))
            w = cl.worker(psd, 1, 2, epochs=1, limit=2000, model="mlp:64", args=("--shm", "off"))
            rc, _ = w.result(timeout=60)
            self.assertNotEqual(rc, 0)
            self.assertIn("this Hogwild! job takes only workers on psd's machine", w.stderr())

    def test_split_model_refused(self):
        with harness.Cluster("psd-hogwild-split") as cl:
            psds = [cl.psd(mode="asgd", workers=1, args=hw_args(0.05), name="psd%d" % i) for i in range(2)]
            w = cl.worker(psds, 0, 1, epochs=1, limit=2000, model="mlp:64")
            rc, _ = w.result(timeout=60)
            self.assertNotEqual(rc, 0)
            self.assertIn("a Hogwild! job keeps the whole model in one psd; this worker was given 2", w.stderr())

    def test_checkpoint_and_restart(self):
        with harness.Cluster("psd-hogwild-ckpt") as cl:
            state = os.path.join(cl.dir, "state")
            args = hw_args(0.05, "--set", "checkpoint_interval=500ms", "--state-dir", state)
            psd = cl.psd(mode="asgd", workers=2, args=args)
            w = cl.worker(psd, 0, 2, epochs=3, limit=12000, model="mlp:64")
            # checkpoints are written while the worker steps
            harness.wait_until(lambda: (harness.status(psd.addr).get("checkpoint_version") or 0) > 0, 60,
                               "a checkpoint while training")
            harness.finish(self, [w], timeout=180)
            before = save(self, psd.addr, os.path.join(cl.dir, "before.safetensors"))
            v = harness.status(psd.addr)["version"]
            psd.stop()  # writes a last checkpoint
            psd2 = cl.psd(mode="asgd", workers=2, args=args, name="psd2")
            st = harness.status(psd2.addr)
            self.assertEqual(st["version"], v)
            after = save(self, psd2.addr, os.path.join(cl.dir, "after.safetensors"))
            for k in before:
                np.testing.assert_array_equal(before[k], after[k], k)
            w2 = cl.worker(psd2, 1, 2, epochs=1, limit=12000, model="mlp:64", name="resumed")
            s = harness.finish(self, [w2], timeout=120)[0]
            self.assertIs(s["hogwild"], True)
            self.assertGreater(s["test_accuracy"], 0.85, s)
            self.assertEqual(harness.status(psd2.addr)["version"], v + steps(12000, 2, 1, (1,)))
            psd2.stop()

    def test_worker_follows_psd_restart(self):
        """psd stopped and started again on its address while a worker
        steps: the worker sees the connection go, reconnects, maps the new
        psd's segment at the same address and trains on from the
        checkpoint."""
        with harness.Cluster("psd-hogwild-restart") as cl:
            state = os.path.join(cl.dir, "state")
            port = harness.free_port()
            args = hw_args(0.05, "--state-dir", state, "--listen", "127.0.0.1:%d" % port)
            psd = cl.psd(mode="asgd", workers=1, args=args)
            # a set training time, not a number of epochs: the worker is
            # still stepping when psd stops
            w = cl.worker(psd, 0, 1, epochs=100000, limit=12000, model="mlp:64",
                          args=("--reconnect-timeout", "60", "--max-seconds", "10"))
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 200, 60, "the worker's steps")
            psd.stop()  # a last checkpoint
            psd2 = cl.psd(mode="asgd", workers=1, args=args, name="psd2")
            v = harness.status(psd2.addr)["version"]
            self.assertGreaterEqual(v, 200)
            s = harness.finish(self, [w], timeout=240)[0]
            self.assertEqual(s["reconnects"], 1, s)
            self.assertIs(s["hogwild"], True, s)
            self.assertGreater(s["test_accuracy"], 0.85, s)
            # its steps after the restart went into psd2's segment
            self.assertGreater(harness.status(psd2.addr)["version"], v)
            psd2.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
