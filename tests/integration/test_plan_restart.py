#!/usr/bin/python3
"""test_plan_restart.py - a planned BSP job through a kill -9 of psd.

    test_plan_restart.py [harness options] [unittest options]

Two BSP workers train by psd's plan; psd writes a checkpoint every 0.3 s.
Both workers are frozen (SIGSTOP) for a moment so that the round psd has
reached is known, psd is killed with SIGKILL and started again on the same
state dir and port, and the workers are let go: they reconnect by
themselves.

The rule checked (PROTOCOL.md 8, "The plan"): the checkpoint holds the
plan, so the restarted psd has it before any worker says hello again, and
the job goes on from the checkpoint's version c. The rounds c..k-1 that the
killed psd closed after its last checkpoint (k: its version at the kill)
are lost and trained again; nothing else is. So the restarted psd closes
exactly R - c rounds (R: the plan's), the job ends at version R and not
later, the rounds trained in all are k + R - c, and the samples the workers
trained are those rounds' (plus at most the round k each had in hand at
the kill, whose push was dropped).
"""

import contextlib
import glob
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# 8 epochs of 60,000 samples: 15,000 rounds of 2 workers (10,000 of 3), of
# which psd is killed after its first checkpoint, some hundreds of rounds in.
# Under the sanitizers (the build-asan pass), where a round takes about three
# times as long, 3 epochs: still thousands of rounds past the kill.
EPOCHS = 3 if harness.SANITIZED else 8
LIMIT = 60000
BATCH = 16          # per worker: the plan's global batch is 2 x 16
MODEL = "mlp:64"
INTERVAL = 0.3      # checkpoint_interval, seconds


def rounds_in_plan(epochs, samples, batch):
    return epochs * ((samples + batch - 1) // batch)


def round_size(r, samples, batch):
    """Samples of round r: the global batch, less in an epoch's last round."""
    i = r % ((samples + batch - 1) // batch)
    return min(samples, (i + 1) * batch) - i * batch


def samples_of(lo, hi, samples, batch):
    return sum(round_size(r, samples, batch) for r in range(lo, hi))


def version(addr):
    return harness.status(addr)["version"]


def steady_version(addr, timeout=5.0):
    """psd's version once two reads 0.2 s apart agree (a push already in
    psd's socket may still close a round after the workers froze)."""
    deadline, prev = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        v = version(addr)
        if v == prev:
            return v
        prev = v
        time.sleep(0.2)
    raise AssertionError("psd's version did not stand still within %g s" % timeout)


class PlanRestartTest(unittest.TestCase):
    @contextlib.contextmanager
    def frozen(self, ws):
        """The workers stopped (SIGSTOP) within the block, so the version
        psd has reached is known; let go (SIGCONT) at its end."""
        for w in ws:
            os.kill(w.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for w in ws:
                os.kill(w.pid, signal.SIGCONT)

    def kill_at_rest(self, psd, rounds):
        """kill -9 of psd once its version stands still (below the plan's
        end); returns that version."""
        k = steady_version(psd.addr)
        self.assertLess(k, rounds, "the job reached its end before psd could be killed")
        os.kill(psd.pid, signal.SIGKILL)
        psd.wait(10)
        return k

    def test_planned_job_survives_kill_of_psd(self):
        port = harness.free_port()
        gb = 2 * BATCH
        rounds = rounds_in_plan(EPOCHS, LIMIT, gb)
        with harness.Cluster("psd-plan-restart") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--listen", "127.0.0.1:%d" % port, "--state-dir", state, "--set",
                    "checkpoint_interval=%gs" % INTERVAL]
            psd = cl.psd(mode="bsp", workers=2, args=args)
            ws = [cl.worker(psd, k, 2, epochs=EPOCHS, batch=BATCH, limit=LIMIT, model=MODEL, evaluate=False,
                            args=["--reconnect-timeout", "60"]) for k in range(2)]

            def ckpt_versions():
                return sorted(int(re.search(r"ckpt-(\d+)\.psdc$", f).group(1))
                              for f in glob.glob(os.path.join(state, "ckpt-*.psdc")))

            harness.wait_until(lambda: [v for v in ckpt_versions() if v > 0], 60, "a checkpoint of a trained round")
            self.assertTrue(all(w.alive() for w in ws), "the job ended before psd could be killed")
            # freeze the job, so that the version psd has reached at the kill is known
            with self.frozen(ws):
                k = self.kill_at_rest(psd, rounds)
                psd2 = cl.psd(mode="bsp", workers=2, args=args, name="psd2")
                loaded = harness.wait_until(
                    lambda: re.search(r"loaded checkpoint \S+: model version (\d+)", psd2.stderr()), 10,
                    "psd to report the checkpoint it loaded")
                c = int(loaded.group(1))
                self.assertTrue(0 < c <= k, "loaded version %d, killed at %d" % (c, k))
                # the checkpoint brought the plan back: no worker has said hello yet
                st = harness.status(psd2.addr)
                plan = st["plan"]
                self.assertIsNotNone(plan, "the restarted psd has no plan before the workers come back")
                self.assertEqual((plan["epochs"], plan["samples"], plan["batch"], plan["rounds"]),
                                 (EPOCHS, LIMIT, gb, rounds), plan)
                self.assertEqual(plan["epoch"], c // ((LIMIT + gb - 1) // gb), plan)
                self.assertFalse(plan["done"])
                self.assertRegex(psd2.stderr(), r"plan restored from the checkpoint: %d epochs of %d samples, %d per "
                                                r"round, seed \d+: round %d of %d" % (EPOCHS, LIMIT, gb, c, rounds))
            results = harness.finish(self, ws, 240)
            st = harness.status(psd2.addr)
            log = psd2.stderr()
            lost = k - c
            sys.stderr.write("\nplan of %d rounds; psd killed at version %d, restarted from the checkpoint of version "
                             "%d (%d rounds lost and trained again); the restarted psd closed %d rounds, ended at "
                             "version %d; workers' reconnects %r\n" %
                             (rounds, k, c, lost, st["rounds"], st["version"], [r["reconnects"] for r in results]))
            for r in results:
                self.assertGreaterEqual(r["reconnects"], 1)
                self.assertEqual(r["version"], rounds, "a worker stopped at version %d, not the plan's end" %
                                 r["version"])
            self.assertEqual(st["version"], rounds)
            self.assertEqual(st["rounds"], rounds - c, "the restarted psd closed %d rounds, not R - c = %d" %
                             (st["rounds"], rounds - c))
            self.assertTrue(st["plan"]["done"])
            self.assertIn("the job is done (model version %d)" % rounds, log)
            late = [int(m) for m in re.findall(r"plan: round (\d+) ", log) if int(m) >= rounds]
            self.assertEqual(late, [], "rounds past the plan's end")
            # k + R - c rounds were trained: their samples, and at most the
            # round each worker had in hand when psd was killed
            want = samples_of(0, k, LIMIT, gb) + samples_of(c, rounds, LIMIT, gb)
            got = sum(r["samples"] for r in results)
            self.assertGreaterEqual(got, want, "the workers trained %d samples, the rounds %d" % (got, want))
            self.assertLessEqual(got, want + round_size(k, LIMIT, gb),
                                 "the workers trained %d samples, the rounds %d" % (got, want))
            psd2.stop()

    def test_worker_lost_before_the_kill_is_not_waited_for(self):
        """3 workers; shard 2 is killed and declared lost, a checkpoint is
        written after that, then psd is killed and restarted with a long
        join_timeout: the checkpoint says shard 2 was out of the job, so
        the restarted psd's rounds are shared by the 2 others from the
        first, not held join_timeout for shard 2."""
        port = harness.free_port()
        gb = 3 * BATCH
        rounds = rounds_in_plan(EPOCHS, LIMIT, gb)
        with harness.Cluster("psd-plan-restart-out") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--listen", "127.0.0.1:%d" % port, "--state-dir", state, "--set",
                    "checkpoint_interval=%gs" % INTERVAL, "--set", "heartbeat_timeout=1s", "--set",
                    "join_timeout=120s"]
            psd = cl.psd(mode="bsp", workers=3, args=args)
            ws = [cl.worker(psd, k, 3, epochs=EPOCHS, batch=BATCH, limit=LIMIT, model=MODEL, evaluate=False,
                            args=["--reconnect-timeout", "60"]) for k in range(3)]
            harness.wait_until(lambda: version(psd.addr) > 0, 60, "a first round")
            ws[2].kill()
            harness.wait_until(lambda: re.search(r"worker shard 2/3 \S+ (lost|left)", psd.stderr()), 30,
                               "shard 2 to be declared lost")
            v = version(psd.addr)
            harness.wait_until(lambda: re.search(r"checkpoint of version (\d+) written", psd.stderr()) and
                               max(int(x) for x in re.findall(r"checkpoint of version (\d+) written",
                                                              psd.stderr())) > v, 30,
                               "a checkpoint after shard 2 was lost")
            live = ws[:2]
            self.assertTrue(all(w.alive() for w in live), "the job ended before psd could be killed")
            with self.frozen(live):
                k = self.kill_at_rest(psd, rounds)
                psd2 = cl.psd(mode="bsp", workers=3, args=args, name="psd2")
                self.assertRegex(psd2.stderr(), r"worker shard 2/3 is not waited for: out of the job at the "
                                                r"checkpoint of version \d+")
                shard2 = [w for w in harness.status(psd2.addr)["workers"] if w["shard"] == 2]
                self.assertEqual([w["state"] for w in shard2], ["lost"], shard2)
            t0 = time.monotonic()
            for summary in harness.finish(self, live, 240):
                self.assertEqual(summary["version"], rounds)
            took = time.monotonic() - t0
            log = psd2.stderr()
            first = re.search(r"plan: round (\d+) \(epoch \d+\) is trained by (\d+) of 3 workers", log)
            sys.stderr.write("\nrestarted at version %d, killed at %d; the restarted psd's first round: %s; the "
                             "job's rest took %.1f s\n" % (harness.status(psd2.addr)["resumed_version"], k,
                                                           first.group(0) if first else None, took))
            self.assertIsNotNone(first, "psd2 logged no round's workers")
            self.assertEqual(first.group(2), "2", "the restarted psd's first round waited for shard 2")
            self.assertNotIn("waits for shard 2/3", log)
            self.assertEqual(harness.status(psd2.addr)["version"], rounds)
            psd2.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
