#!/usr/bin/python3
"""test_psbench.py - psbench's table mode and its checkpoint stall in small
(bench/psbench.c --table, --ckpt-stall).

psbench --table starts psd and the plain-TCP server itself, times 2
workers pushing and pulling rows by key against each, and writes
table.csv: the smoke test runs it for a fraction of a second with 512 keys
a request, uniform and Zipf keys, and checks that each cell measured
(round trips, rows per second, psd's CPU, the ceiling and the ratio, all
positive and consistent with each other), that --table-reps 2 runs two
pairs of cells per worker count and prints the medians and ranges of
their figures, that --server-cpu says where the servers ran, and that
psd's table really
received the rows (psd's log is clean and the printed table names the
settings). Bad options are refused with a message.

psbench --ckpt-stall G fills a table, times pulls without a checkpoint and
while psctl checkpoint runs (and push-and-pulls with --ckpt-push): the test
runs it on a table of 5 MB whose checkpoint PSD_TEST_CKPT_SLOW_US slows to
about half a second, and checks every phase's figures (finite, ordered,
consistent with the request count), the checkpoint's time and file (there,
of the size printed, holding the table's rows); and that psbench fails
(exit 1, with the reason) when no checkpoint is written or psctl fails.
"""

import csv
import math
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ARGS = None


class PsbenchTable(unittest.TestCase):
    def run_table(self, out, *extra):
        argv = [ARGS.psbench, "--psd", harness.Paths.psd, "--table", "--seconds", "0.3", "--keys", "512",
                "--key-space", "20000", "--no-probe", "--out", out] + list(extra)
        r = harness.run(argv, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(out, "table.csv")) as f:
            rows = list(csv.DictReader(f))
        return r.stdout, rows

    def check_row(self, row, K, segment=True):
        self.assertEqual((int(row["workers"]), int(row["dim"]), int(row["keys"]), int(row["ok"])), (K, 16, 512, 1))
        # psd on this machine maps each worker's table segment unless --table-tcp
        self.assertEqual(int(row["table_segment_workers"]), K if segment else 0)
        self.assertGreater(float(row["client_cpu"]), 0)
        rts, secs = int(row["round_trips"]), float(row["seconds"])
        self.assertGreater(rts, K)
        rows_s = float(row["rows_per_s"])
        # rows/s is 2 x 512 rows a round trip over the timed window
        self.assertAlmostEqual(rows_s, rts * 2 * 512 / secs, delta=rows_s * 0.01)
        self.assertGreater(float(row["psd_cpu"]), 0)
        self.assertAlmostEqual(float(row["rows_per_s_per_psd_core"]), rows_s / float(row["psd_cpu"]),
                               delta=rows_s * 0.01 / float(row["psd_cpu"]))
        tcp = float(row["tcp_rows_per_s"])
        self.assertGreater(tcp, 0)
        self.assertAlmostEqual(float(row["ratio"]), rows_s / tcp, delta=0.01)
        # bytes per round trip: 512 x (8 + 64 + 8) out, 512 x 64 back
        self.assertAlmostEqual(float(row["mb_per_s"]) * 1e6 / (rts / secs), 512 * 80 + 512 * 64, delta=50)

    def test_zipf_and_uniform(self):
        with tempfile.TemporaryDirectory(prefix="psbench-table-") as out:
            text, rows = self.run_table(out, "--workers", "1,2", "--table-reps", "2")
            # two pairs of cells (the ceiling, then psd) per worker count,
            # a row each, then the medians of each K's pairs
            self.assertEqual([(int(r["workers"]), int(r["rep"])) for r in rows], [(1, 1), (1, 2), (2, 1), (2, 2)])
            for r in rows:
                self.check_row(r, int(r["workers"]))
            for K in (1, 2):
                m = re.search(r"(?m)^ *%d +~ \| median of 2 pairs \(min\.\.max\): psd ([\d.]+) M rows/s "
                              r"\(([\d.]+)\.\.([\d.]+)\), ceiling [\d.]+ M .*psd/TCP ([\d.]+)x \(([\d.]+)\.\.([\d.]+)\)"
                              % K, text)
                self.assertTrue(m, text)
                mine = [float(r["rows_per_s"]) / 1e6 for r in rows if int(r["workers"]) == K]
                ratios = [float(r["ratio"]) for r in rows if int(r["workers"]) == K]
                # the median of two is their mean; the range, theirs
                self.assertAlmostEqual(float(m.group(1)), sum(mine) / 2, delta=0.06)
                self.assertAlmostEqual(float(m.group(2)), min(mine), delta=0.06)
                self.assertAlmostEqual(float(m.group(3)), max(mine), delta=0.06)
                self.assertAlmostEqual(float(m.group(4)), sum(ratios) / 2, delta=0.006)
                self.assertAlmostEqual(float(m.group(5)), min(ratios), delta=0.006)
                self.assertAlmostEqual(float(m.group(6)), max(ratios), delta=0.006)
            self.assertEqual(float(rows[0]["zipf"]), 1.1)
            self.assertIn("table of dim 16", text)
            self.assertIn("Zipf 1.10 over 20000 keys", text)
            with open(os.path.join(out, "logs", "psd-table-16-512-2.log")) as f:
                log = f.read()
            self.assertNotIn("error", log.lower(), log)
            self.assertIn("through each worker's table segment", text)
            # one pair, both servers on CPU 0 and the workers on the others
            pin = ["--server-cpu", "0"] if (os.cpu_count() or 1) >= 2 else []
            text, rows = self.run_table(out, "--zipf", "0", "--table-tcp", "--table-reps", "1", *pin)
            self.assertEqual(len(rows), 1)
            self.assertNotIn("median of", text)
            if pin:
                self.assertIn("psd and the plain-TCP server on CPU 0, the workers on the other CPUs", text)
            self.check_row(rows[0], 2, segment=False)
            self.assertIn("uniform over 20000 keys", text)
            self.assertIn("in frames over loopback TCP (--table-tcp)", text)

    def test_bad_options(self):
        for args, says in ((["--keys", "70000"], "bad --keys '70000'"), (["--dim", "0"], "bad --dim '0'"),
                           (["--table-reps", "0"], "bad --table-reps '0'"),
                           (["--server-cpu", "4096"], "bad --server-cpu '4096'"),
                           (["--keys", "4096", "--key-space", "5000"], "--key-space must be at least twice"),
                           (["--dim", "1024", "--keys", "8192"], "over 2^22 values")):
            r = harness.run([ARGS.psbench, "--psd", harness.Paths.psd, "--table"] + args, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)


class PsbenchCkptStall(unittest.TestCase):
    GB = 0.005          # a table of 5 MB: 4,845 rows of dim 128 (1032 bytes of key, row and AdaGrad state)
    SLOW_US = 100000    # the writer pauses 0.1 s per MiB of rows: the checkpoint takes about 0.5 s

    def run_ckpt(self, out, *extra, env=None):
        argv = [ARGS.psbench, "--psd", harness.Paths.psd, "--psctl", harness.Paths.psctl, "--ckpt-stall", str(self.GB),
                "--seconds", "0.5", "--out", out] + list(extra)
        return harness.run(argv, timeout=60, env=dict(os.environ, PSD_TEST_CKPT_SLOW_US=str(self.SLOW_US),
                                                      **(env or {})))

    def test_phases_with_push(self):
        with tempfile.TemporaryDirectory(prefix="psbench-ckpt-") as out:
            r = self.run_ckpt(out, "--ckpt-push")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(out, "ckpt_stall.csv")) as f:
                phases = list(csv.DictReader(f))
            rows = {(row["op"], row["phase"]): row for row in phases}
            self.assertEqual([(row["op"], row["phase"]) for row in phases],
                             [("pull", "without"), ("pushpull", "without"), ("pull", "during"),
                              ("pushpull", "during"), ("pushpull", "after")])
            nrows = math.ceil(self.GB * 1e9 / 1032)
            for name, row in rows.items():
                self.assertEqual((int(row["workers"]), int(row["keys"]), int(row["dim"]), int(row["rows"])),
                                 (2, 256, 128, nrows), name)
                n, secs = int(row["requests"]), float(row["seconds"])
                self.assertGreater(n, 0, name)
                p50, p99, mx = float(row["p50_ms"]), float(row["p99_ms"]), float(row["max_ms"])
                self.assertTrue(all(math.isfinite(v) for v in (p50, p99, mx, secs)), row)
                self.assertTrue(0 < p50 <= p99 <= mx, row)
                self.assertAlmostEqual(float(row["requests_per_s"]), n / secs, delta=0.01 * n / secs + 0.01)
                # each request is timed within its phase: the phase holds them
                self.assertLessEqual(mx / 1e3, secs + 1.0, row)
                if int(row["checkpoint"]):
                    self.assertEqual(name[1], "during")
                    ck, psd_s = float(row["ckpt_s"]), float(row["psd_ckpt_s"])
                    self.assertAlmostEqual(secs, ck, delta=0.01)
                    # psd's writer paused 0.1 s per MiB of its 4.9 MiB of rows; psctl waited for it
                    self.assertGreaterEqual(psd_s, 0.4, row)
                    self.assertLessEqual(psd_s, ck, row)
                    self.assertTrue(math.isfinite(float(row["fork_ms"])), row)
                    path = os.path.join(out, "ckpt-state", row["file"])
                    self.assertTrue(os.path.exists(path), path)
                    # the file holds each row's key, values and AdaGrad state, and more
                    self.assertGreaterEqual(int(row["file_bytes"]), nrows * 1032)
                    self.assertGreater(float(row["psd_rss_before_mib"]), 5)
                    self.assertGreaterEqual(float(row["psd_hwm_after_mib"]), float(row["psd_hwm_before_mib"]))
                else:
                    self.assertEqual(row["file"], "")
            # the printed rows and ratios
            self.assertIn("pulls: p99", r.stdout)
            self.assertIn("during the checkpoint against", r.stdout)
            self.assertIn("push-and-pulls: p99", r.stdout)
            self.assertIn("%d rows of 1032 bytes" % nrows, r.stdout)
            with open(os.path.join(out, "logs", "psd-ckpt-stall.log")) as f:
                log = f.read()
            self.assertEqual(log.count(" written to "), 2, log)
            # a second run starts from an empty state dir, not from the last run's checkpoint
            r = self.run_ckpt(out)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(out, "ckpt_stall.csv")) as f:
                self.assertEqual([(row["op"], row["phase"]) for row in csv.DictReader(f)],
                                 [("pull", "without"), ("pull", "during")])
            with open(os.path.join(out, "logs", "psd-ckpt-stall.log")) as f:
                log = f.read()
            self.assertEqual(log.count(" written to "), 1, log)
            self.assertNotIn("loaded checkpoint", log)

    def test_no_checkpoint_no_figures(self):
        with tempfile.TemporaryDirectory(prefix="psbench-ckpt-") as out:
            # a "psctl" that answers 0 and asks for nothing: no file, so no figure
            fake = os.path.join(out, "fake-psctl")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho checkpoint of version 0 written\nexit 0\n")
            os.chmod(fake, 0o755)
            r = self.run_ckpt(out, "--psctl", fake)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("no new checkpoint file", r.stderr)
            self.assertNotIn("pull, during checkpoint", r.stdout)
            # psctl failing: its message is passed on
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho 'psctl: psd answered IO: disk full' >&2\nexit 3\n")
            r = self.run_ckpt(out, "--psctl", fake)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("psctl checkpoint failed (status 3): psctl: psd answered IO: disk full", r.stderr)

    def test_bad_options(self):
        for args, says in ((["--ckpt-stall", "0"], "bad --ckpt-stall '0'"),
                           (["--ckpt-stall", "x"], "bad --ckpt-stall 'x'"),
                           (["--ckpt-push"], "--ckpt-push goes with --ckpt-stall"),
                           (["--ckpt-stall", "1", "--table"], "--ckpt-stall is a mode of its own"),
                           (["--ckpt-stall", "1", "--workers", "1,2"], "one worker count"),
                           (["--ckpt-stall", "1", "--psctl", "/nonexistent/psctl"], "no psctl at /nonexistent/psctl"),
                           (["--ckpt-stall", "0.0001"], "fewer than twice --keys")):
            with tempfile.TemporaryDirectory(prefix="psbench-ckpt-") as out:
                r = harness.run([ARGS.psbench, "--psd", harness.Paths.psd, "--out", out] + args, timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(says, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(out, "ckpt-state")), args)


def extra_args(p):
    p.add_argument("--psbench", required=True, help="the psbench to run")


if __name__ == "__main__":
    ARGS = harness.parse_args(extra_args)
    harness.main()
