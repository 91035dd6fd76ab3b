#!/usr/bin/python3
"""test_plan.py - a BSP job coordinated by psd's plan, through a cut worker.

    test_plan.py [harness options] [--seeds N] [unittest options]

Three BSP workers train MNIST's MLP for a few epochs; psworker proposes
psd the job's plan (the default) and psd hands out each round's samples.

- Undisturbed, the job ends after exactly the plan's rounds: every worker
  exits 0 at the same model version, psd's status says done, and its log
  says the last round closed.
- The issue's fault: one worker is cut off for 6 s (SIGSTOP: its TCP stays
  up, it is silent past heartbeat_timeout), then let go; before that
  another is cut until psd declares it lost and comes back while the job
  runs. The
  others share the cut workers' samples meanwhile; the ones that come back
  learn the round from psd, train their part again or hear that the job is
  done, and exit 0. psd closes no round after the plan's last one, its
  final model is within 0.3 points of test accuracy of the undisturbed
  job's with the same seed, and a short cut's comeback is logged.

Each job prints its test accuracy and seconds per epoch (--seeds N runs the
pair with N seeds; the default, 1, is the test). --no-plan runs the workers
without the plan, as before it existed: the test then fails.
"""

import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

EPOCHS = 5
LIMIT = 60000
BATCH = 64
MODEL = "mlp:256,128"
HB = "2s"           # heartbeat_timeout: a cut worker is declared lost after it
# the cut was 15 s; what it shows holds from heartbeat_timeout on,
# and three of them keep the worker out for many rounds (the test waited
# the 9 s more for nothing)
LONG_CUT_S = 6.0
# The short cut starts at this share of the plan's rounds, the long one at
# this. Lost samples early in the job, when the steps are large, move the
# final model more: with the cuts at rounds 20 and 1/3 the cut job of seed 3
# ended 0.27 points from the undisturbed one once in five runs (within 0.1
# the other four); at 1/3 and 2/3, within 0.07 in four of four.
SHORT_AT = 1 / 3
LONG_AT = 2 / 3
TOLERANCE = 0.003   # 0.3 points of test accuracy
SEEDS = [1]
WORKER_ARGS = []    # --no-plan: the workers count their own steps (shows the issue)


def rounds_in_plan(epochs, samples, batch):
    return epochs * ((samples + batch - 1) // batch)


def version(addr):
    return harness.status(addr)["version"]


class PlanTest(unittest.TestCase):
    def job(self, seed, cut):
        """Runs one job of three workers; cut: whether to cut two of them.
        Returns (test accuracy of psd's final model, seconds per epoch,
        what happened)."""
        with harness.Cluster("psd-plan") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=["--set", "heartbeat_timeout=" + HB])
            t0 = time.monotonic()
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, batch=BATCH, limit=LIMIT, test_limit=10000, model=MODEL,
                            args=["--seed", str(seed)] + WORKER_ARGS) for k in range(3)]
            rounds = rounds_in_plan(EPOCHS, LIMIT, BATCH * 3)
            notes = []
            if cut:
                # a short cut, early: the job goes on without shard 1, which
                # comes back while it runs and is given its part again
                harness.wait_until(lambda: version(psd.addr) >= int(rounds * SHORT_AT), 120,
                                   "%d%% of the plan's rounds" % (100 * SHORT_AT))
                os.kill(ws[1].pid, signal.SIGSTOP)
                try:
                    harness.wait_until(lambda: re.search(r"worker shard 1/3 \S+ lost", psd.stderr()), 30,
                                       "shard 1 to be declared lost")
                    v = version(psd.addr)
                    harness.wait_until(lambda: version(psd.addr) >= v + 10, 30,
                                       "rounds to close without shard 1")
                finally:
                    os.kill(ws[1].pid, signal.SIGCONT)
                if WORKER_ARGS:
                    harness.wait_until(lambda: "worker shard 1/3 rejoined" in psd.stderr(), 30, "shard 1 to rejoin")
                else:
                    back = harness.wait_until(
                        lambda: re.search(r"worker shard 1/3 rejoined.*?\n(.*\n)*?.*plan: round (\d+) \(epoch \d+\) "
                                          r"is trained by 3 of 3 workers", psd.stderr()),
                        30, "shard 1 to rejoin and train a round")
                    notes.append("shard 1 was back from round %s" % back.group(2))
                # the cut: shard 2 for LONG_CUT_S, from the middle of the job
                harness.wait_until(lambda: version(psd.addr) >= int(rounds * LONG_AT), 120,
                                   "%d%% of the plan's rounds" % (100 * LONG_AT))
                os.kill(ws[2].pid, signal.SIGSTOP)
                cut_at = time.monotonic()
                try:
                    harness.wait_until(lambda: re.search(r"worker shard 2/3 \S+ lost", psd.stderr()), 30,
                                       "shard 2 to be declared lost")
                    # psctl's plan line while shard 2 is out: the other two share the rounds
                    shared = r"plan: (epoch [1-%d]/%d, round \d+ of %d, 2 workers a round \(\d+ samples each\)|done " \
                             r"at round %d )" % (EPOCHS, EPOCHS, rounds, rounds)
                    line = harness.wait_until(lambda: re.search(shared, harness.psctl(psd.addr, "status").stdout), 10,
                                              "psctl status to show the rounds shared by 2 workers")
                    notes.append("psctl status while shard 2 was out: '%s'" % line.group(0))
                    time.sleep(max(0.0, LONG_CUT_S - (time.monotonic() - cut_at)))  # the cut itself
                    done_in_cut = (harness.status(psd.addr)["plan"] or {}).get("done")
                finally:
                    os.kill(ws[2].pid, signal.SIGCONT)
                notes.append("the job %s during the %g s cut" % ("ended" if done_in_cut else "went on", LONG_CUT_S))
            results = harness.finish(self, ws, 300)
            seconds = time.monotonic() - t0
            st = harness.status(psd.addr)
            # the worker that pulled last holds psd's final model
            last = max(results, key=lambda r: r["version"])
            lost = len(re.findall(r"worker shard \d+/3 \S+ lost", psd.stderr()))
            sys.stderr.write("\n%s job, seed %d: psd's model version %d (the plan's rounds: %d), its test accuracy "
                             "%.2f%%, %.2f s/epoch (shard 0 training: %.2f s/epoch), workers declared lost: %d\n" %
                             ("cut" if cut else "undisturbed", seed, st["version"], rounds,
                              100 * last["test_accuracy"], seconds / EPOCHS, results[0]["seconds"] / EPOCHS, lost))
            # nothing after the plan's last round: the version is the plan's
            # rounds, every worker stopped there, psd says done (collected,
            # so that --no-plan still prints both jobs' figures)
            log = psd.stderr()
            plan = st["plan"] or {}

            def check(ok, what):
                if not ok:
                    self.problems.append("%s job, seed %d: %s" % ("cut" if cut else "undisturbed", seed, what))

            check(st["version"] == rounds, "psd's model version %d, not the plan's %d rounds" % (st["version"], rounds))
            text = harness.psctl(psd.addr, "status").stdout
            check("plan: done at round %d (%d epochs of %d samples, %d a round)" % (rounds, EPOCHS, LIMIT, 3 * BATCH)
                  in text, "psctl status shows no plan line for the finished job:\n%s" % text)
            check(st["rounds"] == rounds, "psd closed %d rounds, not %d" % (st["rounds"], rounds))
            check(plan.get("done") is True and plan.get("rounds") == rounds, "psd's status plan: %r" % st["plan"])
            check(all(r["version"] == rounds for r in results),
                  "workers ended at versions %r" % [r["version"] for r in results])
            check("the job is done (model version %d)" % rounds in log, "psd did not log the plan's end")
            late = [int(m) for m in re.findall(r"plan: round (\d+) ", log) if int(m) >= rounds]
            check(late == [], "rounds past the plan's end in psd's log: %r" % late)
            # every worker evaluated psd's final model: the same accuracy
            accs = {round(r["test_accuracy"], 6) for r in results}
            check(len(accs) == 1, "workers saw different final models: %r" % sorted(accs))
            if cut:
                check(results[1]["reconnects"] >= 1 and results[2]["reconnects"] >= 1, "a cut worker did not come back")
                # while shard 1 was out the other two shared the global batch
                check(re.search(r"plan: round \d+ \(epoch \d+\) is trained by 2 of 3 workers, 96 samples each", log),
                      "psd's log shows no round shared by 2 workers")
                check("psd says the plan is done" in ws[1].stderr(), "shard 1 did not hear that the plan is done")
            psd.stop()
            return last["test_accuracy"], seconds / EPOCHS, notes

    def test_cut_worker_ends_near_the_undisturbed_job(self):
        self.problems = []
        for seed in SEEDS:
            acc_u, spe_u, _ = self.job(seed, cut=False)
            acc_c, spe_c, notes = self.job(seed, cut=True)
            sys.stderr.write("\nseed %d: undisturbed %.2f%% (%.2f s/epoch), cut %.2f%% (%.2f s/epoch with the "
                             "cuts); %s\n" % (seed, 100 * acc_u, spe_u, 100 * acc_c, spe_c, "; ".join(notes)))
            if abs(acc_c - acc_u) > TOLERANCE:
                self.problems.append("seed %d: cut job %.4f, undisturbed %.4f: more than %.1f points apart" %
                                     (seed, acc_c, acc_u, 100 * TOLERANCE))
        self.assertEqual(self.problems, [])


if __name__ == "__main__":
    def extra(p):
        p.add_argument("--seeds", type=int, default=1, help="run the pair of jobs with seeds 1..N")
        p.add_argument("--no-plan", action="store_true",
                       help="run psworker --no-plan (each counts its own steps): the test then fails, as the "
                            "job did before psd had a plan")
    args = harness.parse_args(extra)
    SEEDS = list(range(1, args.seeds + 1))
    WORKER_ARGS = ["--no-plan"] if args.no_plan else []
    harness.main()
