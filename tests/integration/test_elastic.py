#!/usr/bin/python3
"""test_elastic.py - elastic averaging SGD (psd's settings elastic_alpha and
elastic_tau, PROTOCOL.md section 8, "Talking less"): psd's model is the
centre; every tau local steps a worker pulls it, moves its own model by
e = alpha (w - c) towards it and pushes -e, which psd adds to the centre.

- Raw clients: WELCOME says alpha and tau; a push -e moves the centre by
  +e exactly, whatever psd's lr and warm-up say.
- psworker, ASGD, 2 workers, W1's network: the centre reaches the stated
  accuracy, with one push and one pull every tau steps and none between.
- 3 workers, one killed with kill -9 mid-job: the two others finish with
  the stated accuracy.
- 2 workers, a third joining once the centre has taken 30 updates: all
  three finish with the stated accuracy, the late one having done its
  whole share.
- psd refuses to start with elastic_alpha in bsp, with an optimizer other
  than sgd, with dc_lambda, each with its message.
"""

import os
import signal
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_WELCOME, RawClient  # noqa: E402

ALPHA, TAU = 0.2, 4
MODEL = "mlp:256,128"  # W1
LIMIT = 20000
EPOCHS = 3
# 2 workers, alpha 0.2, tau 4, psworker's SGD at lr 0.1, 3 epochs of 20,000
# samples: a clean run's centre reached 0.93 (chance: 0.10)
MIN_ACCURACY = 0.90
ELASTIC = ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "elastic_alpha=%g" % ALPHA,
           "--set", "elastic_tau=%d" % TAU]


def f32(a):
    return np.asarray(a, dtype="<f4").tobytes()


class ElasticTest(unittest.TestCase):
    def check_accuracy(self, results):
        for r in results:
            self.assertGreater(r["test_accuracy"], MIN_ACCURACY, "test accuracy %.4f" % r["test_accuracy"])

    def test_push_moves_the_centre(self):
        n = 1000
        layout = [["w", [n]]]
        rng = np.random.default_rng(5)
        c0 = rng.standard_normal(n).astype("<f4")
        e = rng.standard_normal(n).astype("<f4")
        with harness.Cluster("psd-elastic-raw") as cl:
            psd = cl.psd(mode="asgd", workers=1,
                         args=ELASTIC + ["--set", "lr=0.5", "--set", "warmup_versions=100"])
            a = RawClient(psd.addr, 10.0)
            r = a.hello_worker(layout, 0, 1)
            self.assertEqual(r.get("t"), T_WELCOME, r)
            self.assertEqual((r.get("alpha"), r.get("tau")), (ALPHA, TAU), r)
            self.assertNotIn("local", r)
            self.assertEqual(a.request({"t": T_INIT, "off": 0, "fin": True, "data": f32(c0)}).get("t"), T_OK)
            r = a.request({"t": T_PUSH, "base": 0, "off": 0, "fin": True, "data": f32(-e)})
            self.assertEqual(r.get("t"), T_OK, r)
            r = a.request({"t": T_PULL, "off": 0, "len": n})
            self.assertEqual((r.get("t"), r.get("ver")), (T_PARAMS, 1), r)
            np.testing.assert_array_equal(np.frombuffer(r["data"], dtype="<f4"), c0 - (-e))
            a.close()
            psd.stop()

    def test_asgd_trains(self):
        with harness.Cluster("psd-elastic-asgd") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=ELASTIC)
            ws = [cl.worker(psd, k, 2, epochs=EPOCHS, limit=LIMIT, model=MODEL) for k in range(2)]
            results = harness.finish(self, ws)
            self.check_accuracy(results)
            for w in ws:
                self.assertIn("elastic averaging: alpha %g every %d steps of our own SGD at lr 0.1" % (ALPHA, TAU),
                              w.stderr())
            st = harness.status(psd.addr)
            steps = harness.steps_per_epoch(LIMIT, 2, 64, bsp=False)
            sys.stderr.write("elastic alpha %g tau %d: steps %s, %d updates, accuracy %.4f %.4f\n" % (
                ALPHA, TAU, steps, st["version"], results[0]["test_accuracy"], results[1]["test_accuracy"]))
            # an exchange every tau steps and none between: one push and one
            # pull each, besides the connect's and the epochs' pulls
            # (psworker evaluates the centre)
            exchanges = [s * EPOCHS // TAU for s in steps]
            self.assertEqual(st["version"], sum(exchanges))
            for k in range(2):
                self.assertEqual(harness.worker_row(st, k)["pushes"], exchanges[k])
            self.assertEqual(st["pulls"], sum(exchanges) + 2 + 2 * EPOCHS)
            psd.stop()

    def test_worker_dies(self):
        with harness.Cluster("psd-elastic-kill") as cl:
            psd = cl.psd(mode="asgd", workers=3, args=ELASTIC + ["--set", "heartbeat_timeout=3s"])
            # the victim trains for far longer than the others, so that it is
            # surely mid-job when it is killed (on a quiet machine the others'
            # 3 epochs take half a second, and may end before it has joined)
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS if k < 2 else 1000, limit=LIMIT, model=MODEL)
                  for k in range(3)]

            def victim_pushed():
                r = harness.worker_row(harness.status(psd.addr), 2)
                return r and r["state"] == "connected" and r["pushes"] >= 2
            harness.wait_until(victim_pushed, 60, "shard 2 to join and push twice")
            victim = ws[2]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            harness.wait_until(
                lambda: (lambda r: r if r and r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 2)),
                10, "psd to record shard 2 as lost")
            results = harness.finish(self, ws[:2], timeout=180)
            self.check_accuracy(results)
            psd.stop()

    def test_worker_joins_late(self):
        with harness.Cluster("psd-elastic-join") as cl:
            psd = cl.psd(mode="asgd", workers=3, args=ELASTIC)
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL) for k in range(2)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 30, 60, "30 updates before the third worker")
            late = cl.worker(psd, 2, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL, name="late")
            results = harness.finish(self, ws + [late], timeout=180)
            self.check_accuracy(results)
            st = harness.status(psd.addr)
            steps = harness.steps_per_epoch(LIMIT, 3, 64, bsp=False)
            self.assertEqual(harness.worker_row(st, 2)["pushes"], steps[2] * EPOCHS // TAU,
                             "the late worker did its whole share")
            psd.stop()

    def test_refusals(self):
        base = [harness.Paths.psd, "--listen", "127.0.0.1:0", "--workers", "2"]
        cases = [
            (["--mode", "bsp"] + ELASTIC, "elastic averaging is asynchronous: it needs mode = asgd"),
            (["--mode", "ssp"] + ELASTIC, "elastic averaging is asynchronous: it needs mode = asgd"),
            (["--mode", "asgd", "--set", "elastic_alpha=0.2"],
             "elastic_alpha averages the workers' models; psd's optimizer (adagrad) would not run: set optimizer = "
             "sgd without momentum"),
            (["--mode", "asgd"] + ELASTIC + ["--set", "dc_lambda=0.1"],
             "elastic averaging pushes model differences, not gradients: staleness_scale and dc_lambda do not "
             "apply to them"),
            (["--mode", "asgd", "--set", "elastic_alpha=1"], "elastic_alpha"),
        ]
        for args, text in cases:
            r = harness.run(base + args, timeout=20)
            self.assertNotEqual(r.returncode, 0, "psd %s should not start" % " ".join(args))
            self.assertIn(text, r.stderr)


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
