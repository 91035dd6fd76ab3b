#!/usr/bin/python3
"""test_parts.py - a model split over several psd instances.

psworker --server A,B,... sends psd i part i of the flat parameter vector
(proto/PROTOCOL.md 6.2); every psd is an ordinary psd whose model is its
part.

- BSP over 2 psd ends bit for bit where the same job on one psd ends, through
  shared memory and over TCP; each psd holds its part (sizes, names of the
  cut tensor), both see both workers, the parts' versions move together.
- ASGD over 3 psd: one is killed and restarted on its address without a
  checkpoint; the workers reconnect to that one only (the others never lose
  them), give it their values of its part, and the job finishes trained.
- Mistakes get one readable line and a non-zero exit: an empty entry in
  the list, a model too small for that many parts, psd in different modes,
  a worker that lists the psd in another order than the job, or leaves one
  out (psd's layout check refuses the foreign part, with a message about
  the parts, not about another model).
- A raw client's segment with offsets ("shm": [pid, fd, goff, poff]): psd
  reads the gradient and writes the parameters where it says; overlapping
  ranges and ranges past the file's end are refused with the reason in the
  log, and the connection works on over TCP.
"""

import fcntl
import json
import mmap
import os
import signal
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import T_BYE, T_INIT, T_OK, T_PARAMS, T_PUSHPULL, T_WELCOME, RawClient  # noqa: E402

MODEL = "mlp:64"  # 50,890 values: parts [0, 24576) and [24576, 50890)
PARTS_2 = (24576, 50890 - 24576)
REPLY_TIMEOUT = 10.0


def read(path):
    with open(path) as f:
        return f.read()


def memfd(nbytes):
    fd = os.memfd_create("test-parts", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


class PartsTest(unittest.TestCase):
    def run_bsp(self, name, nparts, shm):
        with harness.Cluster(name) as cl:
            psds = [cl.psd(mode="bsp", workers=2, name="psd%d" % i) for i in range(nparts)]
            ws = [cl.worker(psds, k, 2, epochs=2, limit=4000, test_limit=1000, model=MODEL,
                            args=("--shm", shm)) for k in range(2)]
            out = []
            for w in ws:
                rc, summary = w.result(timeout=120)
                self.assertEqual(rc, 0, harness.tail(w.err_path, 5))
                self.assertEqual(summary["servers"], nparts)
                self.assertIs(summary["shm"], shm == "on", summary)
                self.assertEqual(summary["dropped_pushes"], 0)
                out.append((summary["version"], summary["train_loss"], summary["test_loss"],
                            summary["test_accuracy"]))
            sts = [harness.status(p.addr) for p in psds]
            # the whole model, from its parts when split
            path = os.path.join(cl.dir, "model.safetensors")
            r = harness.psctl(",".join(p.addr for p in psds), "save", path, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["servers"], nparts)
            meta, tensors = harness.read_safetensors(path)
            if nparts > 1:
                self.assertEqual(meta["part_versions"], ",".join(str(st["version"]) for st in sts))
            # psctl status of every psd, one after the other
            r = harness.psctl(",".join(p.addr for p in psds), "status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.count("== psd "), nparts if nparts > 1 else 0)
            for p in psds:
                p.stop()
            return out, sts, [p.stderr() for p in psds], tensors

    def test_bsp_split_equals_one_psd(self):
        one, _, _, model = self.run_bsp("psd-parts-one", 1, "on")
        self.assertEqual(sorted(model), ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"])
        self.assertEqual(model["fc1.weight"].shape, (64, 784))
        self.assertGreater(one[0][3], 0.8)
        for shm in ("on", "off"):
            two, sts, logs, saved = self.run_bsp("psd-parts-two-" + shm, 2, shm)
            # BSP sums in shard order and the optimizer works value by value:
            # the split changes nothing, to the last bit
            self.assertEqual(two, one, "2 psd (shm %s) against 1" % shm)
            self.assertEqual(tuple(st["parameters"] for st in sts), PARTS_2)
            self.assertEqual(sts[0]["version"], sts[1]["version"])
            self.assertEqual(sts[0]["version"], one[0][0])
            for st in sts:
                self.assertEqual(sorted(w["shard"] for w in st["workers"]), [0, 1])
                self.assertEqual({w["transport"] for w in st["workers"]}, {"shm" if shm == "on" else "tcp"})
            self.assertIn("fc1.weight(64x784)[0:24576][24576]", logs[0])
            self.assertIn("fc1.weight(64x784)[24576:50176][25600] fc1.bias[64] fc2.weight[10,64] fc2.bias[10]",
                          logs[1])
            # psctl save joins the parts into the model one psd saves
            self.assertEqual(sorted(saved), sorted(model))
            for name in model:
                self.assertEqual(saved[name].shape, model[name].shape, name)
                np.testing.assert_array_equal(saved[name], model[name], name)

    def three_training(self, cl):
        """Three psd in ASGD on fixed ports (a restarted one takes its
        predecessor's) and 2 workers over them, after 200 updates; returns
        start(i, name), which starts psd i again, the psd and the workers."""
        ports = [harness.free_port() for _ in range(3)]

        def start(i, name):
            return cl.psd(mode="asgd", workers=2, name=name,
                          args=["--listen", "127.0.0.1:%d" % ports[i]] + list(harness.ASGD_ARGS))
        psds = [start(i, "psd%d" % i) for i in range(3)]
        # 500 epochs of 16 steps: 8,000 steps a worker, of which about 100
        # come before the kill
        ws = [cl.worker(psds, k, 2, epochs=500, limit=2000, test_limit=1000, model=MODEL,
                        args=("--reconnect-timeout", "60")) for k in range(2)]
        # both workers training on every psd (one alone soon makes the 200
        # updates when the other is slow to start, and would then first meet
        # a psd restarted before it came). Pushes, not only a hello: a worker
        # connected to all three may still be pulling its first model, and a
        # psd lost then is one its connect tries again, not a reconnect.
        def both_training():
            sts = [harness.status(p.addr) for p in psds]
            return sts[0]["version"] >= 200 and all(
                sorted(w["shard"] for w in st["workers"] if w["state"] == "connected" and w["pushes"] >= 2) == [0, 1]
                for st in sts)
        harness.wait_until(both_training, 60, "200 updates with both workers pushing to every psd")
        self.assertTrue(all(w.alive() for w in ws), "the job ended before psd could be killed")
        return start, psds, ws

    def finish(self, ws, restarted):
        """Waits for 100 updates on each restarted psd and for the workers
        to end well (above 80% accuracy); returns their summaries and
        stderr."""
        for p in restarted:
            harness.wait_until(lambda: harness.status(p.addr)["version"] >= 100, 60,
                               "training to go on with the restarted psd")
        ends = []
        for w in ws:
            rc, summary = w.result(timeout=300)
            self.assertEqual(rc, 0, harness.tail(w.err_path, 5))
            self.assertGreater(summary["test_accuracy"], 0.8, summary)
            ends.append((summary, read(w.err_path)))
        return ends

    def test_asgd_one_of_three_restarted(self):
        with harness.Cluster("psd-parts-restart") as cl:
            start, psds, ws = self.three_training(cl)
            os.kill(psds[1].pid, signal.SIGKILL)
            psds[1].wait(10)
            again = start(1, "psd1-again")
            for summary, err in self.finish(ws, [again]):
                self.assertEqual(summary["reconnects"], 1, summary)
                self.assertIn("lost psd at %s" % again.addr, err)
                self.assertNotIn("lost psd at %s" % psds[0].addr, err)
                self.assertNotIn("lost psd at %s" % psds[2].addr, err)
            self.assertRegex(again.stderr(), r"model initialised by shard [01]")
            for p in (psds[0], psds[2]):
                st = harness.status(p.addr)
                self.assertEqual([w["state"] for w in st["workers"]], ["left", "left"], st)
                self.assertNotIn("rejoined", p.stderr())
            for p in (psds[0], again, psds[2]):
                p.stop()

    def test_two_of_three_lost_one_back_late(self):
        """Two psd die together; one comes back at once, the other 2.5 s
        later. A worker's reconnect attempts meanwhile reach the first and
        fail on the second: each such attempt must close the first again,
        so that the attempt that succeeds gives it its initial values and
        pulls its part (a link left open from a failed attempt never would,
        and its psd would wait for initial values for ever)."""
        with harness.Cluster("psd-parts-two-lost") as cl:
            start, psds, ws = self.three_training(cl)
            for p in psds[1:]:
                os.kill(p.pid, signal.SIGKILL)
            for p in psds[1:]:
                p.wait(10)
            first = start(1, "psd1-again")
            time.sleep(2.5)
            self.assertTrue(all(w.alive() for w in ws))
            second = start(2, "psd2-again")
            self.finish(ws, [first, second])
            for p in (first, second):
                self.assertRegex(p.stderr(), r"model initialised by shard [01]")
                # no worker pushed to it while it still waited for them
                self.assertNotIn("before the model has its initial values", p.stderr())
            for p in (psds[0], first, second):
                p.stop()

    def test_mistakes_are_refused(self):
        with harness.Cluster("psd-parts-mistakes") as cl:
            a = cl.psd(mode="asgd", workers=2, name="a")
            b = cl.psd(mode="bsp", workers=2, name="b")
            c = cl.psd(mode="asgd", workers=2, name="c")

            def refused(server, text, model=MODEL):
                w = cl.worker(server, 0, 2, epochs=1, limit=500, model=model)
                rc, _ = w.result(timeout=60)
                err = read(w.err_path)
                self.assertNotEqual(rc, 0, err)
                self.assertIn(text, err)
                self.assertLess(len([l for l in err.splitlines() if l.startswith("psworker:")]), 3, err)
                return err

            refused(a.addr + ",", "is empty")
            refused(",".join([a.addr] * 7), "cannot be split over 7 psd", model="mlp:8")
            refused(",".join([a.addr] * 65), "at most 64 may share a model")
            refused(a.addr + "," + b.addr, "must run the same mode")
            # the job's order is a, c; a worker that lists c first sends a
            # the second part's layout, which psd refuses, and one that
            # lists a alone sends it the whole model: both told about the
            # parts, not about another model
            w = cl.worker([a, c], 0, 2, epochs=1, limit=500, model=MODEL)
            self.assertEqual(w.result(timeout=60)[0], 0, harness.tail(w.err_path, 5))
            parts = ("Every worker of a model split over several psd lists all of the job's psd in the job's order "
                     "(part i on the i-th): this one lists them in another order, or leaves one out or adds one")
            err = refused(c.addr + "," + a.addr, parts)
            self.assertRegex(err, r"this worker sends another part of the model than this psd's: psd holds a part "
                                  r"cut at fc1\.weight\(64x784\)\[(0:24576\] \(24576|24576:50176\] \(26314) "
                                  r"values\), this worker sends a part cut at fc1\.weight\(64x784\)\[")
            err = refused(a.addr, parts)
            self.assertIn("psd holds a part cut at fc1.weight(64x784)[0:24576] (24576 values), this worker sends the "
                          "whole model (50890 values)", err)
            # psctl save from psd that are not the job's parts in its order
            for order in ((c, a), (a, a), (a, c, a)):
                r = harness.psctl(",".join(p.addr for p in order), "save", os.path.join(cl.dir, "m.safetensors"))
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("do not hold the parts of one model in this order", r.stderr)
                self.assertFalse(os.path.exists(os.path.join(cl.dir, "m.safetensors")))
            r = harness.psctl(a.addr + "," + b.addr, "save", os.path.join(cl.dir, "m.safetensors"))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("psctl:", r.stderr)
            r = harness.psctl(a.addr + ",", "status")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("bad --server", r.stderr)
            for p in (a, b, c):
                p.stop()

    def test_segment_with_offsets(self):
        layout = [["w", [1000]], ["b", [24]]]
        total = harness.layout_size(layout)
        with harness.Cluster("psd-parts-shm") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "lr=0.5", "--set", "momentum=0",
                                                        "--set", "optimizer=sgd", "--set", "warmup_versions=0"))
            pid = os.getpid()
            # a worker's segment for a model of 3 x total values: this psd
            # holds the middle part, so its gradient is at [total, 2 total)
            # and its parameters at [3 total + total, ...)
            nvals = 6 * total
            fd = memfd(nvals * 4)
            seg = mmap.mmap(fd, nvals * 4)
            vals = np.frombuffer(seg, dtype="<f4", count=nvals)
            goff, poff = total, 4 * total
            init = np.linspace(-1, 1, total, dtype="<f4")
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker(layout, 0, 1, shm=[pid, fd, goff, poff])
                self.assertEqual(r.get("t"), T_WELCOME, r)
                self.assertIs(r.get("inshm"), True, r)
                self.assertEqual(c.request({"t": T_INIT, "off": 0, "data": init.tobytes()}).get("t"), T_OK)
                vals[:] = 7.0
                vals[goff:goff + total] = 1.0
                r = c.request({"t": T_PUSHPULL, "base": 0, "off": 0, "len": total, "inshm": True, "poff": 0,
                               "plen": total})
                self.assertEqual((r.get("t"), r.get("inshm"), r.get("len")), (T_PARAMS, True, total), r)
                np.testing.assert_array_equal(vals[poff:poff + total], init - np.float32(0.5))
                # nothing else in the segment was touched
                self.assertTrue((vals[:goff] == 7).all() and (vals[goff + total:poff] == 7).all() and
                                (vals[poff + total:] == 7).all())
                self.assertEqual(c.request({"t": T_BYE}).get("t"), T_OK)
                c.expect_closed(REPLY_TIMEOUT)

            def refused(offsets, why):
                with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                    r = c.hello_worker(layout, 0, 1, shm=[pid, fd] + offsets)
                    self.assertEqual(r.get("t"), T_WELCOME, r)
                    self.assertNotIn("inshm", r, why)
                    r = c.request({"t": T_PUSHPULL, "base": r["ver"], "off": 0, "data": np.zeros(total, "<f4")
                                   .tobytes(), "poff": 0, "plen": total})
                    self.assertEqual(r.get("t"), T_PARAMS, "the connection works on over TCP (%s)" % why)
                    self.assertEqual(c.request({"t": T_BYE}).get("t"), T_OK)
                    c.expect_closed(REPLY_TIMEOUT)
                harness.wait_until(lambda: why in psd.stderr(), 10, "psd to log why: %s" % why)

            refused([0, total // 2], "overlap")
            refused([0, nvals - total + 1], "fewer than the %d floats" % (nvals + 1))
            del vals
            seg.close()
            os.close(fd)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
