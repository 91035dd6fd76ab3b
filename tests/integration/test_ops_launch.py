#!/usr/bin/python3
"""test_ops_launch.py - psworker started by launchers, and for people.

- `mpirun -np 2 psworker --shard auto ...` trains against a bsp psd of 2
  workers: mpirun's OMPI_COMM_WORLD_RANK/SIZE become the shards 0/2, 1/2.
- --shard auto reads SLURM_PROCID/SLURM_NTASKS and JOB_COMPLETION_INDEX
  with PSD_WORKERS too, and says clearly when no launcher set anything.
- PSD_SERVER gives the default --server.
- --quiet prints nothing on stderr and the JSON line on stdout.
- On a terminal (a pty here) stderr shows a live progress bar with the rate
  and the time left; elsewhere plain lines (as every other test sees).
"""

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

JOB = ["--epochs", "2", "--batch", "64", "--limit", "3000", "--test-limit", "500", "--model", "mlp:32"]


def worker_argv(*args):
    return [Paths.psworker, "--data", Paths.data] + JOB + list(args)


def summaries(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


class LaunchTest(unittest.TestCase):
    def test_mpirun(self):
        mpirun = shutil.which("mpirun")
        if not mpirun:
            self.skipTest("mpirun not installed (Debian package openmpi-bin)")
        with harness.Cluster("psd-mpirun") as cl:
            psd = cl.psd(mode="bsp", workers=2)
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_plm_rsh_agent="")
            argv = [mpirun, "--oversubscribe", "-np", "2"]
            if os.geteuid() == 0:
                argv.append("--allow-run-as-root")
            argv += worker_argv("--shard", "auto", "--server", psd.addr)
            r = harness.run(argv, timeout=180, env=env)
            self.assertEqual(r.returncode, 0, "mpirun: %s\n%s" % (r.stdout, r.stderr))
            got = sorted(summaries(r.stdout), key=lambda s: s["shard"])
            self.assertEqual([s["shard"] for s in got], ["0/2", "1/2"], r.stdout)
            self.assertEqual(got[0]["version"], got[1]["version"], "bsp: both end at the same version")
            st = harness.status(psd.addr)
            self.assertEqual([(w["shard"], w["shards"], w["state"]) for w in st["workers"]],
                             [(0, 2, "left"), (1, 2, "left")])
            self.assertEqual(st["rounds"], got[0]["version"])
            psd.stop()

    def test_shard_auto_env(self):
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                              "JOB_COMPLETION_INDEX", "PSD_WORKERS", "PSD_SERVER")}
        r = harness.run(worker_argv("--shard", "auto"), env=clean)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        for word in ("--shard auto", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "JOB_COMPLETION_INDEX", "PSD_WORKERS"):
            self.assertIn(word, r.stderr)
        r = harness.run(worker_argv("--shard", "auto"), env=dict(clean, SLURM_PROCID="2", SLURM_NTASKS="2"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("SLURM_PROCID=2 and SLURM_NTASKS=2", r.stderr)
        r = harness.run(worker_argv("--shard", "auto"), env=dict(clean, JOB_COMPLETION_INDEX="0"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("PSD_WORKERS is not", r.stderr)

        with harness.Cluster("psd-shard-auto") as cl:
            psd = cl.psd(mode="asgd", workers=3)
            # PSD_SERVER instead of --server; shards from Slurm and from a Kubernetes indexed Job
            for env in ({"SLURM_PROCID": "2", "SLURM_NTASKS": "3"},
                        {"JOB_COMPLETION_INDEX": "1", "PSD_WORKERS": "3"}):
                r = harness.run(worker_argv("--shard", "auto", "--quiet"), timeout=120,
                                env=dict(clean, PSD_SERVER=psd.addr, **env))
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stderr, "", "--quiet prints nothing on stderr")
                self.assertEqual(len(r.stdout.strip().splitlines()), 1, r.stdout)
                s = json.loads(r.stdout)
                self.assertEqual(s["epochs"], 2)
            st = harness.status(psd.addr)
            self.assertEqual([(w["shard"], w["shards"]) for w in st["workers"]], [(1, 3), (2, 3)])
            psd.stop()

    def test_progress_bar_on_a_terminal(self):
        with harness.Cluster("psd-progress") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            master, slave = pty.openpty()
            try:
                p = subprocess.Popen(worker_argv("--server", psd.addr, "--epochs", "3"), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=slave, cwd=cl.dir)
                os.close(slave)
                slave = -1
                err = b""
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    ready, _, _ = select.select([master], [], [], 1.0)
                    if master in ready:
                        try:
                            chunk = os.read(master, 65536)
                        except OSError:  # EIO: the worker closed its end
                            break
                        if not chunk:
                            break
                        err += chunk
                    elif p.poll() is not None:
                        break
                out, _ = p.communicate(timeout=60)
            finally:
                os.close(master)
                if slave >= 0:
                    os.close(slave)
            self.assertEqual(p.returncode, 0, err.decode(errors="replace"))
            text = err.decode(errors="replace")
            self.assertIn("\r", text, "the bar is redrawn in place")
            self.assertRegex(text, r"0/1 epoch \d/3 \[[#.]+\] +\d+%  \d+ samples/s  ETA \d+:\d\d  loss \d")
            self.assertIn("\x1b[K", text, "each redraw clears the rest of the line")
            self.assertRegex(text, r"psworker 0/1: epoch 3/3  loss", "the per-epoch lines are still there")
            self.assertEqual(summaries(out.decode())[0]["epochs"], 3)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
