#!/usr/bin/python3
"""test_psbench.py - psbench's table mode in small (bench/psbench.c --table).

psbench --table starts psd and the plain-TCP server itself, times 2
workers pushing and pulling rows by key against each, and writes
table.csv: the smoke test runs it for a fraction of a second with 512 keys
a request, uniform and Zipf keys, and checks that each cell measured
(round trips, rows per second, psd's CPU, the ceiling and the ratio, all
positive and consistent with each other) and that psd's table really
received the rows (psd's log is clean and the printed table names the
settings). Bad options are refused with a message.
"""

import csv
import os
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

    def check_row(self, row, K):
        self.assertEqual((int(row["workers"]), int(row["dim"]), int(row["keys"]), int(row["ok"])), (K, 16, 512, 1))
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
            text, rows = self.run_table(out, "--workers", "1,2")
            self.assertEqual(len(rows), 2)
            self.check_row(rows[0], 1)
            self.check_row(rows[1], 2)
            self.assertEqual(float(rows[0]["zipf"]), 1.1)
            self.assertIn("table of dim 16", text)
            self.assertIn("Zipf 1.10 over 20000 keys", text)
            log = open(os.path.join(out, "logs", "psd-table-16-512-2.log")).read()
            self.assertNotIn("error", log.lower(), log)
            text, rows = self.run_table(out, "--zipf", "0")
            self.assertEqual(len(rows), 1)
            self.check_row(rows[0], 2)
            self.assertIn("uniform over 20000 keys", text)

    def test_bad_options(self):
        for args, says in ((["--keys", "70000"], "bad --keys '70000'"), (["--dim", "0"], "bad --dim '0'"),
                           (["--keys", "4096", "--key-space", "5000"], "--key-space must be at least twice"),
                           (["--dim", "1024", "--keys", "8192"], "over 2^22 values")):
            r = harness.run([ARGS.psbench, "--psd", harness.Paths.psd, "--table"] + args, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(says, r.stderr)


def extra_args(p):
    p.add_argument("--psbench", required=True, help="the psbench to run")


if __name__ == "__main__":
    ARGS = harness.parse_args(extra_args)
    harness.main()
