#!/usr/bin/python3
"""test_topk.py - psworker with top-k sparsification and error feedback
(libpsclient's option topk, psworker --topk) trains W1's network on MNIST.

- BSP, 2 workers over TCP, --topk 0.01: both reach the stated accuracy, and
  every push carried at most ceil(0.01 x n) values of each tensor: psd counts
  the rest as zeros left out (dt 2), and received a small share of the
  bytes a dense push would take.
- BSP, 3 workers, one killed with kill -9 in mid-job: psd declares it lost
  and the two others finish the job with the stated accuracy.
- ASGD, 2 workers, a third joining once the model has taken 200 updates:
  all three finish with the stated accuracy.
- BSP over a model split on 2 psd: the same, each tensor selected whole.
- The client refuses topk with wire bf16 or skip_zeros off, and a ratio out
  of range, with a message that says so.
"""

import math
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

HIDDEN = (256, 128)
MODEL = "mlp:256,128"  # W1
RATIO = 0.01
LIMIT = 20000
EPOCHS = 3
# psd's defaults, 3 epochs of 20,000 samples, 1% of each tensor a push, 3
# workers: a clean run reaches 0.94 in BSP and 0.94 to 0.95 in ASGD (at 2
# epochs of 10,000 it was 0.75 to 0.91: too close to any bound); chance 0.10
MIN_ACCURACY = 0.90
TOPK = ["--topk", str(RATIO), "--shm", "off"]  # over TCP: the pushes cross the wire


def kept_per_push():
    """Values a push carries at most: ceil(ratio x n) of each tensor."""
    return sum(math.ceil(RATIO * math.prod(dims)) for _, dims in harness.mlp_layout(HIDDEN))


class TopkTest(unittest.TestCase):
    def check_accuracy(self, results):
        for r in results:
            self.assertGreater(r["test_accuracy"], MIN_ACCURACY, "test accuracy %.4f" % r["test_accuracy"])

    def test_bsp_sparse_pushes(self):
        with harness.Cluster("psd-topk-bsp") as cl:
            psd = cl.psd(mode="bsp", workers=2)
            ws = [cl.worker(psd, k, 2, epochs=EPOCHS, limit=LIMIT, model=MODEL, args=TOPK) for k in range(2)]
            results = harness.finish(self, ws)
            self.check_accuracy(results)
            st = harness.status(psd.addr)
            params, pushes = st["parameters"], st["pushes"]
            self.assertEqual(params, harness.layout_size(harness.mlp_layout(HIDDEN)))
            self.assertEqual(pushes, 2 * harness.steps_per_epoch(LIMIT, 2, 64, bsp=True) * EPOCHS)
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            elided = harness.metric(samples, "psd_wire_zeros_elided_total")
            received = harness.metric(samples, "psd_received_bytes_total")
            k = kept_per_push()
            sys.stderr.write("topk %.2f: %d pushes of %d values, at most %d kept each; %d values left out, "
                             "%d bytes received (dense pushes: %d); accuracy %.4f\n" % (
                                 RATIO, pushes, params, k, elided, received, 4 * params * pushes,
                                 results[0]["test_accuracy"]))
            # every push left out all but at most k values (the initial
            # values' zero biases count too)
            self.assertGreaterEqual(elided, pushes * (params - k))
            self.assertLessEqual(elided, (pushes + 1) * params)
            # a push: a bit a value of bitmap and k floats, about 4% of
            # dense; below 6% with the initial values and the frames
            self.assertLess(received, 0.06 * 4 * params * pushes + 4 * params)
            psd.stop()

    def test_bsp_worker_dies(self):
        with harness.Cluster("psd-topk-kill") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=["--set", "heartbeat_timeout=3s"])
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL, args=TOPK) for k in range(3)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 60, 60, "60 BSP rounds")
            victim = ws[2]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            harness.wait_until(
                lambda: (lambda r: r if r and r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 2)),
                10, "psd to record shard 2 as lost")
            results = harness.finish(self, ws[:2], timeout=180)
            self.check_accuracy(results)
            self.assertEqual(results[0]["version"], results[1]["version"])
            psd.stop()

    def test_asgd_worker_joins_late(self):
        with harness.Cluster("psd-topk-join") as cl:
            psd = cl.psd(mode="asgd", workers=3, args=harness.ASGD_ARGS)
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL, args=TOPK) for k in range(2)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 200, 60, "200 updates before the third worker")
            t0 = harness.version(psd.addr)
            late = cl.worker(psd, 2, 3, epochs=EPOCHS, limit=LIMIT, model=MODEL, args=TOPK, name="late")
            results = harness.finish(self, ws + [late], timeout=180)
            self.check_accuracy(results)
            st = harness.status(psd.addr)
            row = harness.worker_row(st, 2)
            steps = harness.steps_per_epoch(LIMIT, 3, 64, bsp=False)
            self.assertEqual(row["pushes"], steps[2] * EPOCHS, "the late worker did its whole share")
            self.assertGreaterEqual(t0, 200)
            self.assertEqual(st["version"], sum(steps) * EPOCHS)
            psd.stop()

    def test_split_model(self):
        # W1 over 2 psd (BSP): a tensor the split cuts is still selected
        # whole, so the two parts of a step hold at most k values together
        with harness.Cluster("psd-topk-split") as cl:
            psds = [cl.psd(mode="bsp", workers=2, name="psd%d" % i) for i in range(2)]
            ws = [cl.worker(psds, k, 2, epochs=EPOCHS, limit=LIMIT, model=MODEL, args=TOPK) for k in range(2)]
            results = harness.finish(self, ws)
            self.check_accuracy(results)
            rounds = harness.steps_per_epoch(LIMIT, 2, 64, bsp=True) * EPOCHS
            elided, params = 0, 0
            for p in psds:
                st = harness.status(p.addr)
                self.assertEqual(st["pushes"], 2 * rounds)
                params += st["parameters"]
                samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
                elided += harness.metric(samples, "psd_wire_zeros_elided_total")
            self.assertEqual(params, harness.layout_size(harness.mlp_layout(HIDDEN)))
            self.assertGreaterEqual(elided, 2 * rounds * (params - kept_per_push()))
            for p in psds:
                p.stop()

    def test_refusals(self):
        with harness.Cluster("psd-topk-refuse") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            cases = [
                (["--topk", "0.01", "--wire", "bf16"], "topk sends float32 without its zeros; wire bf16"),
                (["--topk", "0.01", "--skip-zeros", "off"], "topk needs skip_zeros on"),
                (["--topk", "2"], "bad --topk '2'"),
                (["--topk", "0.000001"], "bad --topk '0.000001'"),
            ]
            for i, (args, text) in enumerate(cases):
                w = cl.worker(psd, 0, 1, epochs=1, limit=200, model="softmax", args=args, name="refused%d" % i)
                rc, _ = w.result(30)
                self.assertNotEqual(rc, 0, "psworker %s should fail" % " ".join(args))
                self.assertIn(text, w.stderr())
            # psd is unharmed: no worker ever joined
            self.assertEqual(harness.status(psd.addr)["version"], 0)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
