#!/usr/bin/python3
"""test_join.py - a BSP job whose expected worker never joins.

psd runs bsp rounds of 3 workers and only shards 0 and 1 start:
- while it waits psd names the missing shard: a repeated WARN line ("BSP
  round R waits for shard 2/3 (never joined): 2 of 3 workers present"),
  `waiting_for` in psctl status (and its text), /api/job's fields;
- join_timeout_action = continue: after join_timeout shard 2 is declared
  lost, the rounds close with the two, the two share its data from their
  second epoch, and both finish;
- join_timeout_action = stop: both workers get an ERROR naming shard 2/3
  and exit non-zero with it; psd logs it, stays up and keeps the model.
- psworker on a terminal (a pty here) shows on its progress line that its
  step waits for psd, and for how long.
"""

import os
import pty
import select
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def shard_row(st, k):
    rows = [w for w in st["workers"] if w["shard"] == k]
    return rows[0] if rows else None


class JoinTimeoutTest(unittest.TestCase):
    def start(self, cl, action, timeout="4s", wargs=()):
        psd = cl.psd(mode="bsp", workers=3,
                     args=("--set", "join_timeout=" + timeout, "--set", "join_timeout_action=" + action))
        ws = [cl.worker(psd, k, 3, epochs=2, limit=1500, test_limit=200, model="mlp:32", args=wargs)
              for k in (0, 1)]
        # both present, the round waits for shard 2: psd says so
        def waiting():
            st = harness.status(psd.addr)
            present = [w for w in st["workers"] if w["state"] == "connected"]
            return st if len(present) == 2 and st["waiting_for"] == [2] else None

        st = harness.wait_until(waiting, 30, "psd to wait for shard 2 with 2 workers present")
        self.assertEqual(st["version"], 0)
        self.assertIsNone(shard_row(st, 2))
        r = harness.psctl(psd.addr, "status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("waiting for shard 2/3 (never joined)", r.stdout)
        return psd, ws

    def test_continue(self):
        """psd's plan (psworker's default in bsp): once shard 2 is declared
        lost, each round's global batch goes to the two present."""
        self.check_continue(planned=True)

    def test_continue_without_plan(self):
        """Workers that count their own epochs (--no-plan): from their next
        epoch the two share shard 2's data."""
        self.check_continue(planned=False)

    def check_continue(self, planned):
        with harness.Cluster("psd-join-continue") as cl:
            psd, ws = self.start(cl, "continue", wargs=() if planned else ("--no-plan",))
            for w in ws:
                rc, summary = w.result(120)
                self.assertEqual(rc, 0, w.stderr())
                self.assertEqual(summary["epochs"], 2)
                if not planned:
                    self.assertIn("2 of 3 shards are live", w.stderr())
            if planned:
                harness.wait_until(lambda: "is trained by 2 of 3 workers, 96 samples each" in psd.stderr(), 10,
                                   "psd's plan to give the rounds after the timeout to the 2 present")
            st = harness.status(psd.addr)
            row = shard_row(st, 2)
            self.assertEqual(row["state"], "lost", row)
            self.assertIn("never joined within join_timeout", row["why"])
            self.assertEqual(st["waiting_for"], [])
            self.assertGreater(st["rounds"], 0)
            psd.stop()
            log = psd.stderr()
            self.assertIn("BSP round 0 waits for shard 2/3 (never joined): 2 of 3 workers present", log)
            self.assertIn("join_timeout (4 s): shard 2/3 never joined; going on with 2 of 3 workers", log)

    def test_stop(self):
        with harness.Cluster("psd-join-stop") as cl:
            psd, ws = self.start(cl, "stop")
            for w in ws:
                rc = w.wait(60)
                self.assertNotEqual(rc, 0, w.stderr())
                self.assertIn("the job stopped: shard 2/3 never joined within join_timeout (4 s)", w.stderr())
                self.assertIn("[TIMEOUT]", w.stderr())
            # psd stays up with the model
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertEqual(st["waiting_for"], [])
            for k in (0, 1):
                row = shard_row(st, k)
                self.assertEqual(row["state"], "left", row)
                self.assertIn("job stopped: shard 2/3 never joined", row["why"])
            saved = os.path.join(cl.dir, "kept.safetensors")
            r = harness.psctl(psd.addr, "save", saved)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(harness.read_safetensors(saved))
            psd.stop()
            self.assertIn("join_timeout (4 s): shard 2/3 never joined; stopping the job", psd.stderr())

    def test_progress_line_shows_the_wait(self):
        with harness.Cluster("psd-join-tty") as cl:
            psd = cl.psd(mode="bsp", workers=2, args=("--set", "join_timeout=60s"))
            master, slave = pty.openpty()
            argv = [harness.Paths.psworker, "--server", psd.addr, "--shard", "0/2", "--epochs", "1", "--limit",
                    "1000", "--data", harness.Paths.data, "--model", "mlp:32"]
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
            os.close(slave)
            seen = b""
            try:
                deadline = time.monotonic() + 30
                # psd tells the worker whom its round waits for in answer to
                # a heartbeat (every third of heartbeat_timeout, 10 s here)
                while b"waits for shard 1/2" not in seen and time.monotonic() < deadline:
                    ready, _, _ = select.select([master], [], [], 1.0)
                    if ready:
                        try:
                            seen += os.read(master, 4096)
                        except OSError:
                            break
                # psd names the shard the worker's round waits for
                self.assertEqual(harness.status(psd.addr)["waiting_for"], [1])
            finally:
                p.kill()
                p.wait(10)
                os.close(master)
            text = seen.decode(errors="replace")
            self.assertIn("0/2 epoch 1/1 [", text)
            self.assertRegex(text, r"waiting [0-9]+ s for psd: round 0 waits for shard 1/2 \(never joined\)")
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
