#!/usr/bin/python3
"""test_local.py - local SGD (psd's setting local_steps = H, PROTOCOL.md
section 8, "Talking less"): every worker trains its own copy of the model
with its own SGD and pushes, every H steps, the difference between the
model it pulled and its own; psd applies the round's mean as is.

- Raw clients: WELCOME says local: H; a round's model is exactly the mean
  of the workers' models (w0 - mean of the differences), whatever psd's lr
  and warm-up say, and plainly not what psd's optimizer would make.
- psworker, BSP, 2 workers, W1's network: the stated accuracy, one round
  (one push and one pull a worker) every H steps and none between.
- 3 workers, one killed with kill -9 mid-job: psd declares it lost and the
  two others finish with the stated accuracy.
- 3 workers, shard 2 joining late (after psd gave up waiting for it and
  rounds went on with two): all three finish with the stated accuracy.
- A model split over 2 psd: each part averages its values; a client given
  psd that differ in local_steps refuses them.
- psd refuses to start with local_steps in asgd, with an optimizer other
  than sgd, with momentum, and with elastic_alpha too, each with its
  message; psworker refuses --pipeline on in such a job, and an --lr that
  is not a number above 0.
"""

import os
import signal
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_WELCOME, RawClient  # noqa: E402

H = 4
MODEL = "mlp:256,128"  # W1
LIMIT = 20000
EPOCHS = 3
# 2 workers, H 4, psworker's SGD at lr 0.1, 3 epochs of 20,000 samples: a
# clean run reached 0.93 (chance: 0.10)
MIN_ACCURACY = 0.90
LOCAL = ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "local_steps=%d" % H]


def f32(a):
    return np.asarray(a, dtype="<f4").tobytes()


class LocalSGDTest(unittest.TestCase):
    def check_accuracy(self, results):
        for r in results:
            self.assertGreater(r["test_accuracy"], MIN_ACCURACY, "test accuracy %.4f" % r["test_accuracy"])

    def test_round_is_the_mean_model(self):
        n = 1000
        layout = [["w", [n]]]
        rng = np.random.default_rng(3)
        w0 = rng.standard_normal(n).astype("<f4")
        da, db = (rng.standard_normal(n).astype("<f4") for _ in range(2))
        # psd's lr, warm-up and weight decay would change the step: they do
        # not apply to model differences
        opt = ["--set", "lr=0.5", "--set", "warmup_versions=100", "--set", "weight_decay=0.01"]
        with harness.Cluster("psd-local-mean") as cl:
            for local in (True, False):
                args = LOCAL + opt if local else ["--set", "optimizer=sgd", "--set", "momentum=0"] + opt
                psd = cl.psd(mode="bsp", workers=2, args=args, name="local" if local else "plain")
                a, b = RawClient(psd.addr, 10.0), RawClient(psd.addr, 10.0)
                r = a.hello_worker(layout, 0, 2)
                self.assertEqual(r.get("t"), T_WELCOME, r)
                self.assertEqual(r.get("local"), H if local else None, r)
                self.assertTrue(r.get("init"), r)
                self.assertEqual(b.hello_worker(layout, 1, 2).get("local"), H if local else None)
                self.assertEqual(a.request({"t": T_INIT, "off": 0, "fin": True, "data": f32(w0)}).get("t"), T_OK)
                for c, d in ((a, da), (b, db)):
                    r = c.request({"t": T_PUSH, "base": 0, "off": 0, "fin": True, "data": f32(d)})
                    self.assertEqual(r.get("t"), T_OK, r)
                r = a.request({"t": T_PULL, "off": 0, "len": n, "min": 1})
                self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, 1), r)
                got = np.frombuffer(r["data"], dtype="<f4")
                mean = (da + db) * np.float32(0.5)
                if local:
                    np.testing.assert_array_equal(got, w0 - mean)
                else:
                    self.assertGreater(np.max(np.abs(got - (w0 - mean))), 0.1)
                a.close()
                b.close()
                psd.stop()

    def test_bsp_trains(self):
        with harness.Cluster("psd-local-bsp") as cl:
            psd = cl.psd(mode="bsp", workers=2, args=LOCAL)
            ws = [cl.worker(psd, k, 2, epochs=EPOCHS, limit=LIMIT, model=MODEL) for k in range(2)]
            results = harness.finish(self, ws)
            self.check_accuracy(results)
            for w in ws:
                self.assertIn("local SGD: %d steps of our own SGD at lr 0.1" % H, w.stderr())
            st = harness.status(psd.addr)
            steps = harness.steps_per_epoch(LIMIT, 2, 64, bsp=True) * EPOCHS
            sys.stderr.write("local SGD H=%d: %d steps, %d rounds, accuracy %.4f %.4f\n" % (
                H, steps, st["version"], results[0]["test_accuracy"], results[1]["test_accuracy"]))
            # one round every H steps, and nothing in between: one push a
            # round from each worker, and one pull each besides the
            # connect's and the epochs' (psworker evaluates psd's model)
            self.assertEqual(st["version"], steps // H)
            self.assertEqual(st["pushes"], 2 * (steps // H))
            self.assertEqual(st["pulls"], 2 * (steps // H) + 2 + 2 * EPOCHS)
            for k in range(2):
                self.assertEqual(harness.worker_row(st, k)["pushes"], steps // H)
            self.assertIsNone(st.get("plan"), "a plan is ignored with local_steps")
            psd.stop()

    def test_worker_dies(self):
        with harness.Cluster("psd-local-kill") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=LOCAL + ["--set", "heartbeat_timeout=3s"])
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL) for k in range(3)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 15, 60, "15 rounds")
            victim = ws[2]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            harness.wait_until(
                lambda: (lambda r: r if r and r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 2)),
                10, "psd to record shard 2 as lost")
            results = harness.finish(self, ws[:2], timeout=180)
            sys.stderr.write("kill: %s\n" % [(r["test_accuracy"], r["version"]) for r in results])
            self.check_accuracy(results)
            self.assertEqual(results[0]["version"], results[1]["version"])
            psd.stop()

    def test_worker_joins_late(self):
        with harness.Cluster("psd-local-join") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=LOCAL + ["--set", "join_timeout=2s"])
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL) for k in range(2)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 15, 60, "15 rounds of the two before the third joins")
            row = harness.worker_row(harness.status(psd.addr), 2)
            self.assertEqual(row["state"], "lost", row)
            late = cl.worker(psd, 2, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL, name="late")
            results = harness.finish(self, ws + [late], timeout=180)
            sys.stderr.write("late join: %s\n" % [(r["test_accuracy"], r["version"]) for r in results])
            self.check_accuracy(results)
            st = harness.status(psd.addr)
            self.assertGreater(harness.worker_row(st, 2)["pushes"], 0, "the late worker took part in rounds")
            psd.stop()

    def test_split_model(self):
        # W1 over 2 psd: each part averages its own values; psd that differ
        # in local_steps are refused by the client
        with harness.Cluster("psd-local-split") as cl:
            psds = [cl.psd(mode="bsp", workers=2, args=LOCAL, name="psd%d" % i) for i in range(2)]
            ws = [cl.worker(psds, k, 2, epochs=2, limit=LIMIT, model=MODEL) for k in range(2)]
            results = harness.finish(self, ws)
            self.check_accuracy(results)
            rounds = harness.steps_per_epoch(LIMIT, 2, 64, bsp=True) * 2 // H
            for p in psds:
                st = harness.status(p.addr)
                self.assertEqual((st["version"], st["pushes"]), (rounds, 2 * rounds))
            other = cl.psd(mode="bsp", workers=2, args=LOCAL[:-1] + ["local_steps=%d" % (H + 1)], name="other")
            w = cl.worker([psds[0], other], 0, 2, epochs=1, limit=200, model=MODEL, name="mixed")
            rc, _ = w.result(30)
            self.assertNotEqual(rc, 0)
            self.assertIn("differ in local_steps, elastic_alpha or elastic_tau", w.stderr())

    def test_refusals(self):
        base = [harness.Paths.psd, "--listen", "127.0.0.1:0", "--workers", "2"]
        cases = [
            (["--mode", "asgd"] + LOCAL, "local_steps averages a round of models: it needs mode = bsp"),
            (["--mode", "bsp", "--set", "optimizer=adam", "--set", "local_steps=4"],
             "local_steps averages the workers' models; psd's optimizer (adam) would not run: set optimizer = sgd "
             "without momentum"),
            (["--mode", "bsp", "--set", "optimizer=sgd", "--set", "local_steps=4"],
             "psd's optimizer (sgd with momentum) would not run"),
            (["--mode", "bsp"] + LOCAL + ["--set", "elastic_alpha=0.1"],
             "local_steps and elastic_alpha are two ways to average: set one"),
        ]
        for args, text in cases:
            r = harness.run(base + args, timeout=20)
            self.assertNotEqual(r.returncode, 0, "psd %s should not start" % " ".join(args))
            self.assertIn(text, r.stderr)
        with harness.Cluster("psd-local-pipeline") as cl:
            psd = cl.psd(mode="bsp", workers=1, args=LOCAL)
            w = cl.worker(psd, 0, 1, epochs=1, limit=200, model="softmax", args=["--pipeline", "on"])
            rc, _ = w.result(30)
            self.assertNotEqual(rc, 0)
            self.assertIn("--pipeline on overlaps pushes of gradients; psd runs local SGD", w.stderr())
            for bad in ("0", "-1", "x", "1e9"):
                w = cl.worker(psd, 0, 1, epochs=1, limit=200, model="softmax", args=["--lr", bad], name="lr" + bad)
                rc, _ = w.result(30)
                self.assertEqual(rc, 2)
                self.assertIn("bad --lr '%s': a number above 0, at most 1000" % bad, w.stderr())
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
