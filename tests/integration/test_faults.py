#!/usr/bin/python3
"""test_faults.py - psd keeps training through dead workers, stragglers and
its own crash, and never loses the model.

    test_faults.py [harness options] [unittest options]

- A worker killed with kill -9 in mid-round: the BSP rounds go on with the
  others, psd records the death (with shard and address) well within
  heartbeat_timeout, and the others finish, sharing its data: by psd's
  plan from the next round, or (psworker --no-plan) from the next epoch.
- A SIGSTOPped straggler: with a backup worker, BSP rounds keep closing
  without it; under SSP the others run at most staleness+1 clocks ahead of
  it and then wait; a straggler silent past heartbeat_timeout is declared
  dead, and rejoins at the current version when it resumes.
- psd's own stall (SIGSTOP) is not its workers' silence: none is declared
  dead for the time psd did not read their heartbeats, and a connection
  accepted before it is not closed for a hello psd did not read.
- psd killed with kill -9 and started again on the same state directory:
  it loads its newest checkpoint, the workers reconnect by themselves and
  finish, the model version continues from the checkpoint, and at most one
  checkpoint interval of updates is lost.
- A truncated or corrupted newest checkpoint is reported and skipped for
  the previous one.
"""

import glob
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODEL = "mlp:64"
LIMIT = 12000
TEST_LIMIT = 2000
MIN_ACCURACY = 0.85
# The straggler tests stop a worker once the job is under way and then need
# the others to go on for dozens of rounds: a job of 3 epochs (about 190
# rounds, half a second here) could end before the stop took effect.
STRAGGLER_EPOCHS = 20


class FaultTest(unittest.TestCase):
    def finish(self, workers, timeout=120):
        return harness.finish(self, workers, timeout)

    def test_worker_killed_in_bsp(self):
        self.worker_killed_in_bsp(plan=True)

    def test_worker_killed_in_bsp_without_plan(self):
        self.worker_killed_in_bsp(plan=False)

    def worker_killed_in_bsp(self, plan):
        with harness.Cluster("psd-kill-worker") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=["--set", "heartbeat_timeout=3s"])
            ws = [cl.worker(psd, k, 3, epochs=4, limit=LIMIT, model=MODEL, args=[] if plan else ["--no-plan"])
                  for k in range(3)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 30, 60, "30 BSP rounds")
            victim = ws[2]
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            victim.wait(10)
            # psd notices the death and says so with shard and address
            row = harness.wait_until(
                lambda: (lambda r: r if r and r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 2)),
                3, "psd to record shard 2 as lost")
            noticed = time.monotonic() - killed_at
            self.assertLess(noticed, 3.0, "death noticed after %.1f s, beyond heartbeat_timeout" % noticed)
            self.assertRegex(row["address"], r"^127\.0\.0\.1:\d+$")
            self.assertNotEqual(row["why"], "")
            v = harness.version(psd.addr)
            # (on a loaded machine this poll can come late enough that the
            # survivors have already finished the job: that counts too, and
            # the log checks below still want rounds closed without shard 2)
            harness.wait_until(lambda: not any(w.alive() for w in ws[:2]) or harness.version(psd.addr) > v + 5, 30,
                               "rounds to close without the dead worker")
            results = self.finish(ws[:2])
            for r in results:
                self.assertGreater(r["test_accuracy"], MIN_ACCURACY)
            log = psd.stderr()
            if plan:
                # from the next round on, psd's plan gives the two survivors
                # halves of each round's global batch instead of thirds
                self.assertRegex(log, r"plan: round \d+ \(epoch \d+\) is trained by 2 of 3 workers, 96 samples each")
            else:
                # from the next epoch on, the two survivors share the dead
                # worker's data: halves of the set instead of thirds
                for k, w in enumerate(ws[:2]):
                    self.assertRegex(w.stderr(),
                                     r"shard %d/3: 2 of 3 shards are live: training on part %d of 2" % (k, k))
            self.assertRegex(log, r"worker shard 2/3 \(127\.0\.0\.1:\d+\) lost")
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertGreaterEqual(harness.metric(samples, "psd_worker_deaths_total"), 1)
            psd.stop()

    def test_straggler_bsp_with_backup_worker(self):
        with harness.Cluster("psd-backup") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=["--set", "backup_workers=1", "--set", "heartbeat_timeout=30s"])
            ws = [cl.worker(psd, k, 3, epochs=STRAGGLER_EPOCHS, limit=LIMIT, model=MODEL) for k in range(3)]
            harness.wait_until(lambda: harness.version(psd.addr) >= 20, 60, "20 BSP rounds")
            os.kill(ws[2].pid, signal.SIGSTOP)
            try:
                v0, t0 = harness.version(psd.addr), time.monotonic()
                # rounds keep closing with two of three pushes
                harness.wait_until(lambda: harness.version(psd.addr) >= v0 + 50, 20,
                                   "50 rounds to close while shard 2 is stopped")
                rate = (harness.version(psd.addr) - v0) / (time.monotonic() - t0)
                self.assertGreater(rate, 10, "rounds per second with a stopped straggler")
            finally:
                os.kill(ws[2].pid, signal.SIGCONT)
            self.finish(ws)
            st = harness.status(psd.addr)
            self.assertGreater(st["dropped_pushes"], 0, "the straggler's late pushes are dropped and counted")
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_dropped_pushes_total"), st["dropped_pushes"])
            psd.stop()

    def test_straggler_ssp_bound_and_heartbeat(self):
        s_bound = 3
        with harness.Cluster("psd-ssp") as cl:
            psd = cl.psd(mode="ssp", workers=3,
                         args=["--set", "staleness=%d" % s_bound, "--set", "heartbeat_timeout=4s"])
            ws = [cl.worker(psd, k, 3, epochs=STRAGGLER_EPOCHS, limit=LIMIT, model=MODEL) for k in range(3)]
            harness.wait_until(lambda: all(harness.worker_row(harness.status(psd.addr), k) for k in range(3)), 60,
                               "all three workers to join")
            harness.wait_until(lambda: harness.version(psd.addr) >= 20, 60, "20 updates")
            os.kill(ws[2].pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                # while shard 2 is stopped and still counted live, the others
                # may run at most staleness+1 clocks ahead of it, then wait
                last = {}

                def held():
                    st = harness.status(psd.addr)
                    last["st"] = st
                    row = harness.worker_row(st, 2)
                    if row["state"] != "connected":
                        return None
                    others = [harness.worker_row(st, k)["clock"] for k in (0, 1)]
                    lead = max(others) - row["clock"]
                    self.assertLessEqual(lead, s_bound + 1, "SSP bound broken: %r" % st["workers"])
                    return st if all(c - row["clock"] == s_bound + 1 for c in others) else None

                try:
                    harness.wait_until(held, 3.5, "the others to wait at the staleness bound")
                except AssertionError as e:
                    raise AssertionError("%s; last status: %r" % (e, last.get("st", {}).get("workers")))
                # silent past heartbeat_timeout: declared dead, the others go on
                lost = harness.wait_until(
                    lambda: (lambda r: r if r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 2)),
                    8, "the stopped worker to be declared dead")
                self.assertIn("silent", lost["why"])
                self.assertLess(time.monotonic() - stopped_at, 4 + 3, "declared dead too late")
                v = harness.version(psd.addr)
                harness.wait_until(lambda: harness.version(psd.addr) > v + 20, 20, "the others to go on")
            finally:
                os.kill(ws[2].pid, signal.SIGCONT)
            results = self.finish(ws)
            self.assertGreaterEqual(results[2]["reconnects"], 1, "the resumed straggler rejoins")
            self.assertRegex(psd.stderr(), r"worker shard 2/3 rejoined")
            psd.stop()

    def test_psd_stalled_loses_no_worker(self):
        """psd's own stall (its loop held; here a SIGSTOP of 2.5 s) is not
        its workers' silence: a worker that sent a heartbeat just before
        stays connected with heartbeat_timeout 2 s, and psd logs the stall.
        Before, the first tick after the stall declared it dead ("silent
        for 2.6 s"): its heartbeats were still unread in the socket. A
        worker that is really silent is still declared dead afterwards."""
        with harness.Cluster("psd-stall") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=["--set", "heartbeat_timeout=2s"])
            w = harness.RawClient(psd.addr, 10.0)
            quiet = harness.RawClient(psd.addr, 10.0)
            for k, c in enumerate((w, quiet)):
                r = c.hello_worker([["w", [4]]], k, 2)
                self.assertEqual(r.get("t"), harness.T_WELCOME, r)
            self.assertEqual(w.heartbeat().get("t"), harness.T_OK)
            os.kill(psd.pid, signal.SIGSTOP)
            try:
                time.sleep(2.5)
            finally:
                os.kill(psd.pid, signal.SIGCONT)
            time.sleep(0.6)  # a few ticks of psd after the stall
            r = w.heartbeat()
            self.assertEqual(r.get("t"), harness.T_OK, r)
            self.assertEqual(harness.worker_row(harness.status(psd.addr), 0)["state"], "connected")
            harness.wait_until(lambda: "loop was held for" in psd.stderr(), 5, "psd to log its stall")
            # the other one says nothing from now on: dead within its 2 s of psd's time
            lost = harness.wait_until(
                lambda: (lambda r: r if r["state"] == "lost" else None)(harness.worker_row(harness.status(psd.addr), 1)),
                6, "the silent worker to be declared dead")
            self.assertIn("silent", lost["why"])
            w.close()
            quiet.close()

    def test_psd_stalled_keeps_a_handshake(self):
        """psd's own stall is not counted against handshake_timeout either: a
        connection psd accepted just before a stall of 2.5 s that says HELLO
        right after it gets WELCOME with handshake_timeout 1.5 s. Before, the
        first tick after the stall closed it ("no hello within
        handshake_timeout"): psd, not the client, had not read."""
        with harness.Cluster("psd-stall-hello") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=["--set", "handshake_timeout=1.5s"])
            # a connected worker, so that psd logs the stall it credits
            w = harness.RawClient(psd.addr, 10.0)
            self.assertEqual(w.hello_worker([["w", [4]]], 0, 2).get("t"), harness.T_WELCOME)
            pending = harness.RawClient(psd.addr, 10.0)
            # psd accepts in order: once this later admin connection is
            # answered, the pending one was accepted, and its clock runs
            with harness.RawClient(psd.addr, 10.0) as admin:
                admin.hello_admin()
                st = admin.request({"t": harness.T_STATUS})
                self.assertEqual(st.get("t"), harness.T_STATUS_REPLY, st)
                self.assertEqual(st["body"]["connections"], 3, st["body"])
            os.kill(psd.pid, signal.SIGSTOP)
            try:
                time.sleep(2.5)  # the stall itself: psd cannot be waited on while stopped
            finally:
                os.kill(psd.pid, signal.SIGCONT)
            # the first tick after the stall has run (and credited it) ...
            harness.wait_until(lambda: "loop was held for" in psd.stderr(), 5, "psd to log its stall")
            # ... and the pending connection is still open for its hello
            r = pending.hello_worker([["w", [4]]], 1, 2)
            self.assertEqual(r.get("t"), harness.T_WELCOME, r)
            self.assertNotIn("within handshake_timeout", psd.stderr())
            self.assertEqual(pending.heartbeat().get("t"), harness.T_OK)
            w.close()
            pending.close()
            psd.stop()

    def test_psd_killed_and_restarted(self):
        port = harness.free_port()
        interval = 1.0
        with harness.Cluster("psd-crash") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--listen", "127.0.0.1:%d" % port, "--state-dir", state, "--set",
                    "checkpoint_interval=%gs" % interval]
            psd = cl.psd(mode="bsp", workers=2, args=args)
            # long enough to outlast a checkpoint interval and the restart
            # on a fast machine (through shared memory this job closes
            # several thousand rounds a second on 2 cores)
            ws = [cl.worker(psd, k, 2, epochs=200, limit=LIMIT, model=MODEL, evaluate=False,
                            args=["--reconnect-timeout", "60"]) for k in range(2)]
            harness.wait_until(lambda: glob.glob(os.path.join(state, "ckpt-*.psdc")), 30, "a first checkpoint")
            harness.wait_until(lambda: harness.version(psd.addr) >= 100, 60, "100 rounds")
            t0, v0 = time.monotonic(), harness.version(psd.addr)
            time.sleep(0.5)
            before = harness.version(psd.addr)
            rps = (before - v0) / (time.monotonic() - t0)  # this job's rounds per second, here and now
            self.assertTrue(all(w.alive() for w in ws), "the job ended before psd could be killed")
            os.kill(psd.pid, signal.SIGKILL)
            psd.wait(10)
            psd2 = cl.psd(mode="bsp", workers=2, args=args, name="psd2")
            log = harness.wait_until(lambda: re.search(r"loaded checkpoint \S+: model version (\d+)", psd2.stderr()),
                                     10, "psd to report the checkpoint it loaded")
            loaded = int(log.group(1))
            # rounds close between the last status and the kill
            self.assertLessEqual(loaded, before + rps * 0.5 + 60)
            lost = before - loaded
            self.assertLess(lost, rps * interval * 1.5 + 60,
                            "lost %d versions, more than one interval at %.0f rounds/s" % (lost, rps))
            harness.wait_until(lambda: harness.version(psd2.addr) > loaded, 30, "training to resume after the restart")
            results = self.finish(ws)
            for r in results:
                self.assertGreaterEqual(r["reconnects"], 1)
                self.assertGreater(r["version"], loaded)
                self.assertLess(r["train_loss"], 0.3)
            psd2.stop()

    def test_corrupt_checkpoints_are_skipped(self):
        with harness.Cluster("psd-ckpt") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--state-dir", state, "--set", "checkpoint_interval=0"]
            # three sessions, each ends with a checkpoint at shutdown
            for i in range(3):
                psd = cl.psd(mode="asgd", workers=1, args=args, name="psd%d" % i)
                w = cl.worker(psd, 0, 1, epochs=1, limit=2000 * (i + 1), model=MODEL, evaluate=False)
                self.finish([w])
                psd.stop()
            files = sorted(glob.glob(os.path.join(state, "ckpt-*.psdc")))
            self.assertEqual(len(files), 3, files)
            # truncate the newest, flip a byte in the middle one
            with open(files[2], "r+b") as f:
                f.truncate(os.path.getsize(files[2]) // 2)
            with open(files[1], "r+b") as f:
                f.seek(os.path.getsize(files[1]) // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0x40]))
            psd = cl.psd(mode="asgd", workers=1, args=args, name="psd-load")
            log = psd.stderr()
            self.assertRegex(log, re.escape(os.path.basename(files[2])) + r" is unusable: truncated")
            self.assertRegex(log, re.escape(os.path.basename(files[1])) + r" is unusable: checksum mismatch")
            m = re.search(r"loaded checkpoint (\S+): model version (\d+)", log)
            self.assertIsNotNone(m, log)
            self.assertEqual(os.path.basename(m.group(1)), os.path.basename(files[0]))
            st = harness.status(psd.addr)
            self.assertEqual(st["version"], int(m.group(2)))
            self.assertTrue(st["initialized"])
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
