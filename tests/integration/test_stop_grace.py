#!/usr/bin/python3
"""test_stop_grace.py - psd's stop_grace: SIGTERM to psd and its workers.

A Slurm job cancelled with `scancel --signal=TERM` (or a pod deleted) sends
SIGTERM to psd and to every worker at about the same moment. Here psd gets it
first and the workers once psd says it waits for them, so that which process
handles its signal first is not left to the scheduler (tests/engines/test_slurm
cancels a real job, where the order is whatever it is).

- With stop_grace, psd writes a checkpoint and serves on; the workers finish
  their step and leave "stopped by SIGTERM" (exit 143); psd then stops at
  once (long before stop_grace is over), exit 0, with the model checkpointed
  at the version the workers reached. In bsp too, where a worker mid-round
  needs psd to close that round before it can leave.
- Without it (the default), psd stops at once: the workers (not signalled
  here) are recorded as left because psd shut down.
- With stop_grace and a worker that does not leave (not signalled), psd
  stops when the time is up; a second SIGTERM stops it at once.
"""

import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def log_of(p):
    with open(p.err_path, errors="replace") as f:
        return f.read()


def wait_log(p, pattern, timeout, what):
    return harness.wait_until(lambda: re.search(pattern, log_of(p)), timeout, what)


class StopGraceTest(unittest.TestCase):
    def job(self, c, mode, grace, workers=2):
        state = os.path.join(c.dir, "state")
        args = ["--state-dir", state]
        if grace is not None:
            args += ["--set", "stop_grace=" + grace]
        psd = c.psd(mode=mode, workers=workers, args=args)
        ws = [c.worker(psd, k, workers, epochs=5000, limit=6000, evaluate=False) for k in range(workers)]

        # every worker has joined (and so handles SIGTERM) and trains
        def training():
            st = harness.status(psd.addr)
            joined = [w for w in st["workers"] if w["state"] == "connected"]
            return len(joined) == workers and st["version"] >= 20
        harness.wait_until(training, 60, "both workers training")
        return psd, ws, state

    def check_left_by_sigterm(self, mode):
        with harness.Cluster("psd-grace-" + mode) as c:
            psd, ws, state = self.job(c, mode, "30s")
            t0 = time.monotonic()
            # psd first, the workers once psd has said it waits for them: sent
            # at the same moment, a worker quicker than psd (psd under a
            # sanitizer) may leave before psd sees the signal, and psd then
            # has nobody to wait for
            psd.p.send_signal(signal.SIGTERM)
            wait_log(psd, r"SIGTERM: waiting up to 30\.0 s \(stop_grace\) for 2 connected workers", 20,
                     "psd's stop_grace line")
            for w in ws:
                w.p.send_signal(signal.SIGTERM)
            for w in ws:
                self.assertEqual(w.wait(30), 143, "worker did not exit 143 after SIGTERM:\n" + harness.tail(w.err_path))
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))
            took = time.monotonic() - t0
            self.assertLess(took, 15, "psd waited %.1f s although every worker had left" % took)
            text = log_of(psd)
            left = re.findall(r"worker shard (\d)/2 \([^)]*\) left: stopped by SIGTERM", text)
            self.assertEqual(sorted(left), ["0", "1"], text[-3000:])
            self.assertIn("SIGTERM: every worker has left", text)
            final = re.search(r"stopped at model version (\d+)", text)
            self.assertIsNotNone(final, text[-2000:])
            ckpt = re.findall(r"checkpoint of version (\d+) written", text)
            self.assertTrue(ckpt and ckpt[-1] == final.group(1),
                            "the last checkpoint (%s) is not the final model (%s)" % (ckpt, final.group(1)))
            self.assertTrue(any(f.endswith(".psdc") for f in os.listdir(state)))

    def test_bsp_workers_leave_by_sigterm(self):
        self.check_left_by_sigterm("bsp")

    def test_asgd_workers_leave_by_sigterm(self):
        self.check_left_by_sigterm("asgd")

    def test_default_stops_at_once(self):
        with harness.Cluster("psd-grace-none") as c:
            psd, ws, _ = self.job(c, "bsp", None)
            # psd alone: the workers, not signalled, are still connected when
            # psd stops, so psd records them as left by its shutdown
            psd.p.send_signal(signal.SIGTERM)
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))
            for w in ws:
                w.kill()
            text = log_of(psd)
            self.assertNotIn("stop_grace", text)
            self.assertRegex(text, r"left: psd shutting down")

    def test_grace_runs_out_and_second_signal(self):
        with harness.Cluster("psd-grace-out") as c:
            # the workers are not signalled: they never leave
            psd, ws, _ = self.job(c, "asgd", "2s")
            t0 = time.monotonic()
            psd.p.send_signal(signal.SIGTERM)
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))
            took = time.monotonic() - t0
            self.assertGreaterEqual(took, 1.9)
            self.assertLess(took, 10)
            self.assertRegex(log_of(psd), r"SIGTERM: stop_grace over with 2 workers still connected")
            for w in ws:
                w.kill()
        with harness.Cluster("psd-grace-twice") as c:
            psd, ws, _ = self.job(c, "asgd", "60s")
            psd.p.send_signal(signal.SIGTERM)
            wait_log(psd, r"stop_grace", 10, "psd's stop_grace line")
            t0 = time.monotonic()
            psd.p.send_signal(signal.SIGTERM)
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))
            self.assertLess(time.monotonic() - t0, 10)
            for w in ws:
                w.kill()

    def held_report(self, c, kind):
        """psd holding the first report of kind (epoch or progress) for 3 s
        (PSD_TEST_HOLD_REPORT, test only) with 2 workers training; returns
        psd, the workers and the shard whose report waits."""
        env = dict(os.environ, PSD_TEST_HOLD_REPORT=kind + ":3000")
        psd = c.psd(mode="asgd", workers=2, env=env)
        ws = [c.worker(psd, k, 2, epochs=5000, limit=6000, evaluate=False) for k in range(2)]
        m = wait_log(psd, r"PSD_TEST_HOLD_REPORT: holding the %s report of shard (\d)" % kind, 60,
                     "psd to hold a report")
        return psd, ws, int(m.group(1))

    def test_signal_during_epoch_report_while_psd_stops(self):
        # A stop signal that ends the wait for an epoch's report: the worker
        # says bye and exits 143 at once. It used to go on to the next epoch,
        # whose first call opened the connection anew and, psd having
        # stopped meanwhile, tried for reconnect_s (60 s): the worker that
        # failed integration_stop_grace in CI.
        with harness.Cluster("psd-report-epoch") as c:
            psd, ws, k = self.held_report(c, "epoch")
            psd.p.send_signal(signal.SIGTERM)
            ws[k].p.send_signal(signal.SIGTERM)
            self.assertEqual(ws[k].wait(20), 143, harness.tail(ws[k].err_path))
            self.assertRegex(log_of(ws[k]), r"stopped by SIGTERM at epoch 2 step 0: left psd")
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))
            ws[1 - k].kill()

    def test_signal_during_progress_report(self):
        # the same signal during a progress report (every second): it used
        # to end the worker with "reporting progress: interrupted", exit 1
        with harness.Cluster("psd-report-progress") as c:
            psd, ws, k = self.held_report(c, "progress")
            ws[k].p.send_signal(signal.SIGTERM)
            self.assertEqual(ws[k].wait(20), 143, harness.tail(ws[k].err_path))
            self.assertRegex(log_of(ws[k]), r"stopped by SIGTERM at epoch \d+ step \d+: left psd")
            wait_log(psd, r"worker shard %d/2 \([^)]*\) left: stopped by SIGTERM" % k, 20, "psd to see the bye")
            ws[1 - k].p.send_signal(signal.SIGTERM)
            self.assertEqual(ws[1 - k].wait(20), 143, harness.tail(ws[1 - k].err_path))
            psd.p.send_signal(signal.SIGTERM)
            self.assertEqual(psd.wait(30), 0, harness.tail(psd.err_path))


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
