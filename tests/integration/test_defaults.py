#!/usr/bin/python3
"""test_defaults.py - psd's and psworker's defaults train what used to fail.

    test_defaults.py [--set KEY=VALUE]... [harness options] [unittest options]

Every job here runs with no tuning flag: psd gets only --mode and
--workers, each psworker only what a run needs (--server, --shard, --seed,
--data, --epochs, --model, a subset of the data with --limit and
--test-limit) and worker 0 --eval. The cases are the ones the earlier
defaults (SGD, lr 0.05, momentum 0.9, no warm-up) failed, and the CNN
case also AdaGrad without the warm-up (bench/defaults.py measures the
whole grid):

- 4 ASGD or SSP workers on the default MLP (mlp:256,128): the loss became
  NaN in the first few dozen steps of every run;
- the "linear" model (least squares): the loss became inf within 20 steps
  in every mode, even with one worker;
- the CNN with 2 and 4 ASGD or SSP workers: some runs ended the epoch at
  chance (all five with 4 SSP workers).

Each must end with every worker's exit status 0 (psworker stops with an
error when its loss is not finite) and worker 0's test accuracy far above
chance (10%); worker 0 starts once psd has seen the others, so that it
never trains and evaluates alone. --set passes a psd setting on top of the defaults, to show
that the test fails on other settings: the earlier defaults
(--set optimizer=sgd --set lr=0.05 --set momentum=0.9 --set
warmup_versions=0) fail all three tests; --set warmup_versions=0 alone
failed test_cnn_async in 3 of 6 repetitions.
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ARGS = None

LIMIT = 20000       # a short epoch: 5,000 samples (78 steps) per worker of 4
TEST_LIMIT = 2000


# The seeds of the cases that failed only in some runs. The sanitizer
# build runs the first of each: the repetitions are for the statistics,
# which the plain build's run checks; every job's code is the same.
SEEDS = (1,) if harness.SANITIZED else (1, 2, 3)


class DefaultsTest(unittest.TestCase):
    def job(self, model, mode, nworkers, seed, min_accuracy, limit=LIMIT):
        """One epoch with default settings; asserts that it trained."""
        args = []
        for kv in ARGS.sets:
            args += ["--set", kv]
        with harness.Cluster("psd-defaults") as cl:
            psd = cl.psd(mode=mode, workers=nworkers, args=args)
            ws = [None] * nworkers
            # worker 0, which evaluates at the end of its epoch, starts once
            # psd has seen every other worker: started first, on a slow
            # machine (the sanitizer build) it could finish its epoch alone
            # and evaluate a model that only its own steps trained
            for k in list(range(1, nworkers)) + [0]:
                if k == 0:
                    harness.wait_until(lambda: len(harness.status(psd.addr)["workers"]) >= nworkers - 1, 60,
                                       "the other workers to join")
                argv = [harness.Paths.psworker, "--server", psd.addr, "--shard", "%d/%d" % (k, nworkers),
                        "--seed", str(seed), "--data", harness.Paths.data, "--epochs", "1", "--model", model,
                        "--limit", str(limit), "--test-limit", str(TEST_LIMIT), "--quiet"]
                if k == 0:
                    argv.append("--eval")
                w = harness.Worker("worker%d" % k, argv, cl.dir)
                cl.procs.append(w)
                ws[k] = w
            what = "%s, %d %s worker(s), seed %d" % (model, nworkers, mode, seed)
            for w in ws:
                rc, summary = w.result(120)
                self.assertEqual(rc, 0, "%s: %s failed:\n%s" % (what, w.name, harness.tail(w.err_path, 5)))
                self.assertIsNotNone(summary, "%s: %s printed no summary" % (what, w.name))
                loss = summary["train_loss"]
                self.assertTrue(loss == loss and abs(loss) != float("inf"),
                                "%s: %s ended with loss %r" % (what, w.name, loss))
            acc = ws[0].result(1)[1]["test_accuracy"]
            sys.stderr.write("%s: test accuracy %.4f\n" % (what, acc))
            self.assertGreater(acc, min_accuracy, "%s: test accuracy %.4f (chance is 0.10)" % (what, acc))
            psd.stop()

    def test_mlp_four_workers(self):
        # a clean run ends at 0.73-0.92 on this subset (the lowest with the
        # machine busy); the failure was a loss that became NaN
        for mode in ("asgd", "ssp"):
            for seed in SEEDS[:2]:
                self.job("mlp:256,128", mode, 4, seed, 0.5)

    def test_linear_every_mode(self):
        # least squares on one-hot targets learns slowly, and a BSP round of 4
        # is one version: on the whole training set (a second per run),
        # 0.54-0.76 after the epoch; chance is 0.10
        for mode in ("asgd", "bsp", "ssp"):
            for nworkers in (2, 4):
                self.job("linear", mode, nworkers, 1, 0.3, limit=0)

    def test_cnn_async(self):
        # 0.79-0.96 on this subset; the failure was a run stuck at chance
        # (0.10-0.12), in a few runs of ten, so each case runs with three seeds
        for mode in ("asgd", "ssp"):
            for nworkers in (2, 4):
                for seed in SEEDS:
                    self.job("cnn", mode, nworkers, seed, 0.5)

if __name__ == "__main__":
    ARGS = harness.parse_args(lambda p: p.add_argument("--set", action="append", default=[], dest="sets",
                                                       metavar="KEY=VALUE",
                                                       help="a psd setting on top of the defaults"))
    harness.main(verbosity=2)
