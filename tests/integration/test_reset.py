#!/usr/bin/python3
"""test_reset.py - `psctl reset`: start fresh without restarting psd.

- refused while a worker is connected, naming it, with the model unchanged;
- `--force`: the worker gets an error and exits non-zero, the checkpoints
  are set aside into a dated subfolder of the state dir (nothing deleted),
  the model is dropped, and the next worker initialises a new one;
- a BSP job's plan goes with the model: the next job's worker fixes its own;
- with nothing connected and no model it says there was none; --force with
  another command is a usage error.
"""

import glob
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


class ResetTest(unittest.TestCase):
    def test_reset(self):
        with harness.Cluster("psd-reset") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, args=("--state-dir", state))
            w = cl.worker(psd, 0, 1, epochs=500, limit=3000, test_limit=200, model="mlp:32")
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 5, 60, "training to start")
            r = harness.psctl(psd.addr, "checkpoint")
            self.assertEqual(r.returncode, 0, r.stderr)
            ckpts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(state, "ckpt-*")))
            self.assertTrue(ckpts)

            r = harness.psctl(psd.addr, "reset")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("reset refused: 1 worker is connected (shard 0/1)", r.stderr)
            self.assertIn("psctl reset --force", r.stderr)
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertGreaterEqual(st["version"], 5)
            self.assertTrue(w.alive())

            r = harness.psctl(psd.addr, "reset", "--force")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("dropped; %d checkpoint file" % len(ckpts), r.stdout)
            self.assertIn("the next worker to connect initialises the model", r.stdout)
            rc = w.wait(30)
            self.assertNotEqual(rc, 0, w.stderr())
            self.assertIn("the model was reset by an admin", w.stderr())
            st = harness.status(psd.addr)
            self.assertFalse(st["initialized"])
            self.assertEqual(st["version"], 0)
            self.assertEqual(st["parameters"], 0)
            self.assertEqual(st["workers"], [])
            self.assertIsNone(st["checkpoint_version"])
            # the checkpoints are set aside, not deleted
            self.assertEqual(glob.glob(os.path.join(state, "ckpt-*")), [])
            aside = glob.glob(os.path.join(state, "set-aside-*"))
            self.assertEqual(len(aside), 1)
            self.assertEqual(sorted(os.listdir(aside[0])), ckpts)

            # the next worker, of another layout even, initialises the model
            w2 = cl.worker(psd, 0, 1, epochs=1, limit=500, test_limit=100, model="mlp:16")
            rc, summary = w2.result(120)
            self.assertEqual(rc, 0, w2.stderr())
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertEqual(st["parameters"], 784 * 16 + 16 + 16 * 10 + 10)
            psd.stop()
            log = psd.stderr()
            self.assertEqual(log.count("model initialised by shard 0"), 2, log)
            self.assertIn("reset by admin", log)

    def test_reset_drops_the_plan(self):
        """A BSP job by psd's plan, reset with --force: the plan goes with
        the model, and the next job's first worker fixes its own."""
        with harness.Cluster("psd-reset-plan") as cl:
            psd = cl.psd(mode="bsp", workers=1)
            w = cl.worker(psd, 0, 1, epochs=500, limit=3000, test_limit=200, model="mlp:32")
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 5, 60, "training to start")
            self.assertEqual(harness.status(psd.addr)["plan"]["samples"], 3000)
            r = harness.psctl(psd.addr, "reset", "--force")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotEqual(w.wait(30), 0)
            self.assertIsNone(harness.status(psd.addr)["plan"])
            w2 = cl.worker(psd, 0, 1, epochs=2, limit=500, test_limit=100, model="mlp:16")
            rc, summary = w2.result(120)
            self.assertEqual(rc, 0, w2.stderr())
            plan = harness.status(psd.addr)["plan"]
            self.assertEqual((plan["epochs"], plan["samples"], plan["done"]), (2, 500, True), plan)
            self.assertEqual(summary["version"], plan["rounds"])
            psd.stop()

    def test_nothing_to_drop(self):
        with harness.Cluster("psd-reset-empty") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            r = harness.psctl(psd.addr, "reset")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("no model to drop; the next worker to connect initialises the model", r.stdout)
            r = harness.psctl(psd.addr, "status", "--force")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--force applies to reset only", r.stderr)
            r = harness.run([harness.Paths.psctl, "--help"])
            self.assertIn("reset", r.stdout)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
