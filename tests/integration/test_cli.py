#!/usr/bin/python3
"""test_cli.py - bad input to psworker, psd and psctl.

Each mistake must end the program with a small positive exit status (not a
signal), one readable line on stderr that says what was wrong, and no
crash report (segfault, AddressSanitizer, UBSan). Also: a worker whose
model layout differs from the one psd holds is refused with a message
about the layout, while the worker that set the layout trains on.
"""

import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

CRASH = re.compile(r"Segmentation|AddressSanitizer|LeakSanitizer|runtime error:|core dumped|Assertion .* failed")


class CliTest(unittest.TestCase):
    def refused(self, argv, rc=None, mentions=(), one_line=True, timeout=60):
        """Runs argv and checks it failed cleanly; returns its stderr."""
        r = harness.run(argv, timeout=timeout)
        what = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
        self.assertNotRegex(r.stderr, CRASH, "%s crashed:\n%s" % (what, r.stderr))
        self.assertGreater(r.returncode, 0, "%s: exit %d (a negative status is a signal)\n%s" %
                           (what, r.returncode, r.stderr))
        self.assertLess(r.returncode, 64, "%s: exit %d\n%s" % (what, r.returncode, r.stderr))
        if rc is not None:
            self.assertEqual(r.returncode, rc, "%s: exit status\n%s" % (what, r.stderr))
        err = r.stderr.strip()
        self.assertTrue(err, "%s: failed without a message" % what)
        if one_line:
            self.assertEqual(len(err.splitlines()), 1, "%s: expected one line on stderr, got:\n%s" % (what, err))
        for m in mentions:
            self.assertIn(m.lower(), err.lower(), "%s: the message should mention %r:\n%s" % (what, m, err))
        return err

    def worker(self, *args):
        return [Paths.psworker, "--data", Paths.data, "--limit", "200", "--test-limit", "100"] + list(args)

    # ---- psworker ------------------------------------------------------------

    def test_worker_bad_shard(self):
        self.refused(self.worker("--shard", "3/2"), rc=2, mentions=["--shard", "3/2"])
        self.refused(self.worker("--shard", "abc"), rc=2, mentions=["--shard", "abc"])
        self.refused(self.worker("--shard", "0/0"), rc=2, mentions=["--shard"])
        self.refused(self.worker("--shard", "-1/2"), rc=2, mentions=["--shard"])

    def test_worker_bad_model(self):
        self.refused(self.worker("--model", "foo"), mentions=["foo"])
        self.refused(self.worker("--model", "mlp:0"), mentions=["mlp:0"])
        self.refused(self.worker("--model", "mlp:"), mentions=["mlp:"])
        self.refused(self.worker("--model", "mlp:64,x"), mentions=["mlp:64,x"])

    def test_worker_bad_numbers(self):
        self.refused(self.worker("--epochs", "0"), rc=2, mentions=["--epochs"])
        self.refused(self.worker("--epochs", "-3"), rc=2, mentions=["--epochs"])
        self.refused(self.worker("--batch", "0"), rc=2, mentions=["--batch"])
        self.refused(self.worker("--limit", "many"), rc=2, mentions=["--limit"])

    def test_worker_missing_data(self):
        with harness.Cluster("psd-cli") as cl:
            missing = os.path.join(cl.dir, "no-such-dir")
            self.refused([Paths.psworker, "--data", missing], mentions=[missing, "train-images"])
            self.refused([Paths.psworker, "--data", Paths.data, "--dataset", "cifar"], mentions=["cifar"])

    def test_worker_unreachable_server(self):
        # the library says at once that it waits, then gives up: two lines
        addr = "127.0.0.1:%d" % harness.free_port()
        err = self.refused(self.worker("--server", addr), mentions=[addr], one_line=False, timeout=60)
        lines = err.splitlines()
        self.assertEqual(len(lines), 2, err)
        self.assertIn("waiting for psd at %s (" % addr, lines[0])
        self.assertRegex(lines[0], r"trying for up to \d+ s \(connect_s\)")
        self.assertIn("unreachable for", lines[1])
        self.refused(self.worker("--server", "nowhere"), mentions=["nowhere"])

    # ---- psd -----------------------------------------------------------------

    def test_psd_bad_config_line(self):
        with harness.Cluster("psd-cli") as cl:
            conf = os.path.join(cl.dir, "bad.conf")
            with open(conf, "w") as f:
                f.write("# a comment\nmode = asgd\nthis line is not a setting\n")
            self.refused([Paths.psd, "--config", conf], rc=2, mentions=[conf + ":3"])
            with open(conf, "w") as f:
                f.write("mode = asgd\nno_such_key = 3\n")
            self.refused([Paths.psd, "--config", conf], rc=2, mentions=[conf + ":2", "no_such_key"])
            with open(conf, "w") as f:
                f.write("lr = fast\n")
            self.refused([Paths.psd, "--config", conf], rc=2, mentions=[conf + ":1", "lr"])
            self.refused([Paths.psd, "--config", os.path.join(cl.dir, "missing.conf")], rc=2,
                         mentions=["missing.conf"])

    def test_psd_bad_options(self):
        self.refused([Paths.psd, "--mode", "foo"], rc=2, mentions=["foo"])
        self.refused([Paths.psd, "--workers", "0"], rc=2, mentions=["workers"])
        self.refused([Paths.psd, "--listen", "127.0.0.1:99999"], rc=2, mentions=["99999"])
        self.refused([Paths.psd, "--set", "nonsense"], rc=2, mentions=["nonsense"])

    def test_psd_port_in_use(self):
        with harness.Cluster("psd-cli") as cl:
            psd = cl.psd()
            self.refused([Paths.psd, "--listen", psd.addr], mentions=[str(psd.port)])
            psd.stop()

    def test_psd_sigterm_as_soon_as_it_is_listening(self):
        """The port file says psd is up; a SIGTERM sent the moment it appears
        must still give the clean shutdown and exit 0. Today psd writes the
        file before uv_signal_start(SIGTERM), so the default action kills
        it (status -15) nearly every time."""
        with harness.Cluster("psd-cli-sigterm") as cl:
            for attempt in range(20):
                port_file = os.path.join(cl.dir, "port%d" % attempt)
                p = harness.Proc("psd%d" % attempt, [Paths.psd, "--listen", "127.0.0.1:0", "--port-file", port_file],
                                 cl.dir)
                cl.procs.append(p)
                deadline = time.monotonic() + 15
                while not os.path.exists(port_file):  # no sleep: the race is the point
                    self.assertIsNone(p.p.poll(), "psd exited before listening")
                    self.assertLess(time.monotonic(), deadline, "psd wrote no port file")
                p.p.send_signal(signal.SIGTERM)
                self.assertEqual(p.wait(15), 0, "attempt %d: psd's exit status after an early SIGTERM" % attempt)

    # ---- psctl ---------------------------------------------------------------

    def test_psctl(self):
        addr = "127.0.0.1:%d" % harness.free_port()
        self.refused([Paths.psctl, "--server", addr, "status"], rc=3, mentions=[addr])
        self.refused([Paths.psctl, "--server", addr, "metrics"], rc=3, mentions=[addr])
        self.refused([Paths.psctl, "--server", addr, "frobnicate"], rc=2, mentions=["frobnicate"])
        self.refused([Paths.psctl], rc=2)
        self.refused([Paths.psctl, "--timeout", "soon", "status"], rc=2, mentions=["soon"])

    # ---- a worker with another model -------------------------------------------

    def test_layout_mismatch(self):
        with harness.Cluster("psd-cli-layout") as cl:
            psd = cl.psd(mode="asgd", workers=2)
            first = cl.worker(psd, 0, 2, epochs=2, limit=6000, model="mlp:32", name="mlp32")
            harness.wait_until(lambda: harness.status(psd.addr)["parameters"] > 0, 60,
                               "the first worker to fix the layout")
            err = self.refused(self.worker("--server", psd.addr, "--shard", "1/2", "--model", "mlp:16"),
                               mentions=["layout"], one_line=False)
            self.assertIn("fc1.weight[16,784]", err, "the message shows the worker's layout")
            self.assertIn("fc1.weight[32,784]", err, "the message shows psd's layout")
            rc, summary = first.result(timeout=120)
            self.assertEqual(rc, 0, first.stderr())
            self.assertEqual(summary["epochs"], 2)
            st = harness.status(psd.addr)
            self.assertEqual([w["shard"] for w in st["workers"]], [0], "the refused worker never joined")
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_rejected_messages_total", reason="layout"), 1)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
