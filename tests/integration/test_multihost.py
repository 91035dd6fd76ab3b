#!/usr/bin/python3
"""test_multihost.py - a short run of bench/multihost.py, and that it leaves nothing behind.

Needs root, tc and a network namespace it can make (iproute2): skipped otherwise,
naming what is missing (harness.main lists the skip).

- A small grid (16,384 floats, links at 100 Mbit/s, central psd, split psd
  and, with python3-torch, gloo; no training) runs to the end: every row is
  printed and written to multihost.json, every psd worker took the rounds
  asked, the link check moves no more than the shaped rate (tbf is in place
  in both directions) and a good part of it, and the run's namespaces are
  gone afterwards.
- Time to accuracy (--tta) of W1 on 2,560 samples, 2 epochs, in BSP,
  local SGD and (with python3-torch) DDP: worker 0's copies of the model
  are at the same steps in every arm (local SGD: at its rounds), evaluated,
  and the last one is the accuracy after the epochs.
- Interrupted by SIGINT while its psd and workers run, it exits 130 and
  removes its namespaces and every process it started in them.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "multihost.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def why_not():
    """Why this machine cannot run the grid (None when it can): it needs
    root, tc and a network namespace actually made and entered (where /
    is not a mount point, as in a chroot or some containers, ip cannot
    remount it on the way in)."""
    if os.geteuid() == 0 and not shutil.which("tc"):
        return "no tc (Debian package iproute2)"
    return harness.why_no_netns()


WHY_NOT = why_not()


def namespaces(prefix):
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith(prefix)]


def has_torch():
    return subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode == 0


@unittest.skipIf(WHY_NOT, WHY_NOT)
class MultihostTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="psd-multihost-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def argv(self, *extra):
        build = os.path.dirname(os.path.dirname(Paths.psd))
        return [PY, BENCH, "--build", build, "--data", Paths.data, "--out", self.dir] + list(extra)

    def test_small_grid(self):
        placements = "central,split,gloo" if has_torch() else "central,split"
        p = subprocess.Popen(self.argv("--sizes", "16384", "--rates", "100", "--placements", placements,
                                       "--train", "none", "--budget", "1", "--max-rounds", "20", "--deadline", "120"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=150)
        self.assertEqual(p.returncode, 0, "multihost.py failed:\n%s\n%s" % (out, err))
        self.assertEqual(namespaces("psmh%d-" % p.pid), [], "the run removed its namespaces")
        with open(os.path.join(self.dir, "multihost", "multihost.json")) as f:
            res = json.load(f)
        cells = {c["placement"]: c for c in res["cells"]}
        self.assertEqual(sorted(cells), sorted(placements.split(",")))
        for name, c in cells.items():
            self.assertEqual((c["size"], c["mbit"]), (16384, 100))
            self.assertGreaterEqual(c["rounds"], 3)
            self.assertGreater(c["p50_ms"], 0)
            self.assertRegex(out, r"(?m)^%s\s+16,384\s+100\s" % name)
        # split and ring move 1.5 x 64 KiB each way per worker, central 4 x
        self.assertAlmostEqual(cells["split"]["limit_ms"], 2 * 3 / 4 * 4 * 16384 * 8 / 100e6 * 1e3, places=3)
        self.assertAlmostEqual(cells["central"]["limit_ms"], 4 * 4 * 16384 * 8 / 100e6 * 1e3, places=3)
        self.assertIn("trace", cells["split"])
        goodput = res["link_mbit"]["100"]
        self.assertLessEqual(goodput, 110, "tbf holds a stream to its 100 Mbit/s")
        self.assertGreater(goodput, 20, "a shaped link still carries a stream")

    def test_time_to_accuracy(self):
        """--tta: every arm's worker 0 (rank 0) keeps copies of the model at
        the same steps, evaluated afterwards; the table and the JSON have
        time to target, accuracy after the fixed epochs and the ratios."""
        arms = "bsp,local,ddp" if has_torch() else "bsp,local"
        p = subprocess.Popen(self.argv("--tta", "w1", "--tta-rates", "100", "--arms", arms, "--train-limit", "2560",
                                       "--tta-epochs", "w1=2", "--snapshots", "2", "--arm-seconds", "60",
                                       "--deadline", "200"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=240)
        self.assertEqual(p.returncode, 0, "multihost.py --tta failed:\n%s\n%s" % (out, err))
        self.assertEqual(namespaces("psmh%d-" % p.pid), [], "the run removed its namespaces")
        with open(os.path.join(self.dir, "multihost", "multihost.json")) as f:
            rows = {r["arm"]: r for r in json.load(f)["tta"]}
        self.assertEqual(sorted(rows), sorted(arms.split(",")))
        for arm, r in rows.items():
            snaps = r["snapshots"]
            # 2560 samples over 4 workers at batch 64: 10 steps an epoch
            steps = [sn["steps"] for sn in snaps]
            self.assertEqual(steps[-1], 20, "%s: the last copy is after the 2 epochs" % arm)
            self.assertEqual(steps, sorted(set(steps)), "%s: copies at growing steps" % arm)
            if arm == "local":
                # H = 16: the copies wait for a round (step 16) and psd's model ends the run
                self.assertEqual(steps, [16, 20])
            else:
                self.assertEqual(steps, [5, 10, 15, 20], "%s: copies at ceil(k x 10 / 2) steps an epoch" % arm)
            times = [sn["train_seconds"] for sn in snaps]
            self.assertEqual(times, sorted(times), arm)
            self.assertGreater(times[0], 0, arm)
            for sn in snaps:
                self.assertGreater(sn["test_accuracy"], 0.3, "%s: a model trained on 320+ samples" % arm)
                self.assertLessEqual(sn["test_accuracy"], 1.0)
            self.assertEqual(r["final_accuracy"], snaps[-1]["test_accuracy"])
            self.assertIsNone(r["tta_seconds"], "%s: 97%% is out of reach of 640 samples a worker" % arm)
        self.assertRegex(out, r"W1, 4 workers, 100 Mbit/s: time to 97.0% test accuracy")
        self.assertRegex(out, r"(?m)^psd local SGD H=16 \(SGD 0.05 m 0.9\)\s+not in ")

    def test_interrupted_run_cleans_up(self):
        p = subprocess.Popen(self.argv("--sizes", "1M", "--rates", "100", "--placements", "split",
                                       "--train", "none", "--budget", "60", "--deadline", "120"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        prefix = "psmh%d-" % p.pid
        try:
            # wait until the split cell runs: 4 psd and 4 workers in the namespaces
            def busy():
                pids = []
                for ns in namespaces(prefix):
                    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
                    pids += r.stdout.split()
                return pids if len(pids) >= 8 else None

            pids = harness.wait_until(busy, 60, "psd and the workers running in the run's namespaces", interval=0.2)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 130, err)
        self.assertIn("interrupted; cleaning up", err)
        self.assertEqual(namespaces(prefix), [])
        for pid in pids:
            self.assertFalse(self.pid_in_run(pid), "process %s of the run still runs" % pid)

    def pid_in_run(self, pid):
        """True when process pid is still one of the run's (its command line
        names the round driver or a port file in our directory), not a new
        process that reused the number."""
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            return False
        return "mh_rounds.py" in cmd or self.dir in cmd


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
