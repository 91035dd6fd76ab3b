#!/usr/bin/python3
"""test_ops_systemd.py - psd as a systemd service, without systemd running.

- The units (systemd/psd.service.in, psworker@.service.in), with their
  paths pointed at this build, pass `systemd-analyze verify` without a
  warning, and `systemd-analyze security --offline` rates them OK.
- psd started with NOTIFY_SOCKET (a unix datagram socket this test reads)
  and WATCHDOG_USEC sends READY=1 with a STATUS= line once it listens, new
  STATUS= lines when its state changes, WATCHDOG=1 every half interval, and
  STOPPING=1 on SIGTERM. WATCHDOG_PID is left unset: sd_watchdog_enabled()
  then accepts the variable for any process.
- SIGHUP re-reads the configuration file: a changed lr is logged
  ("lr: 0.05 -> 0.01") and shows in `psctl status --json`, with RELOADING=1
  and READY=1 around it; the command line's settings still win over the
  file; a file with a bad line is refused and psd keeps its settings; a
  changed setting that is not reloadable is logged as needing a restart.
"""

import os
import re
import shutil
import signal
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

UNITS = ("psd.service", "psworker@.service")


def units_for_this_build(workdir):
    """Copies of the unit templates whose programs are this build's and whose
    configuration directory is a copy of conf/; returns the unit directory."""
    bindir = os.path.join(workdir, "bin")
    confdir = os.path.join(workdir, "etc", "psd")
    unitdir = os.path.join(workdir, "units")
    for d in (bindir, confdir, unitdir):
        os.makedirs(d, exist_ok=True)
    os.symlink(Paths.psd, os.path.join(bindir, "psd"))
    os.symlink(Paths.psworker, os.path.join(bindir, "psworker"))
    for f in ("psd.conf", "psworker.env"):
        shutil.copy(os.path.join(harness.ROOT, "conf", f), confdir)
    for unit in UNITS:
        with open(os.path.join(harness.ROOT, "systemd", unit + ".in")) as f:
            text = f.read()
        text = text.replace("@PSD_BINDIR@", bindir).replace("@PSD_CONFDIR@", confdir)
        if re.search(r"@[A-Z_]+@", text):
            raise AssertionError("%s has a placeholder left: %r" % (unit, text))
        with open(os.path.join(unitdir, unit), "w") as f:
            f.write(text)
    # an instance of the template, as `systemctl start psworker@3` makes
    shutil.copy(os.path.join(unitdir, "psworker@.service"), os.path.join(unitdir, "psworker@3.service"))
    return unitdir


class NotifySocket:
    """A unix datagram socket in the role of systemd's $NOTIFY_SOCKET."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages = []  # every datagram, as a list of "KEY=value" lines

    def close(self):
        self.sock.close()

    def wait_for(self, pred, timeout, what):
        """Receives datagrams until pred(message lines) holds for one; returns
        those lines."""
        deadline = time.monotonic() + timeout
        for msg in self.messages:
            if pred(msg):
                return msg
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out after %.0f s waiting for %s; got %r" % (timeout, what, self.messages))
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            msg = data.decode().split("\n")
            self.messages.append(msg)
            if pred(msg):
                return msg

    def count(self, line):
        return sum(1 for m in self.messages if line in m)


def start_psd(cl, name, args, env_extra):
    """psd on port 0 with extra arguments and environment; waits for its port
    file and returns (proc, addr)."""
    port_file = os.path.join(cl.dir, name + ".port")
    env = dict(os.environ, **env_extra)
    argv = [Paths.psd, "--listen", "127.0.0.1:0", "--port-file", port_file] + list(args)
    p = harness.Proc(name, argv, cl.dir, env=env)
    cl.procs.append(p)

    def port():
        if not p.alive():
            raise AssertionError("%s exited with %s\n%s" % (name, p.p.returncode, harness.tail(p.err_path)))
        try:
            with open(port_file) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text.endswith("\n") else None

    return p, "127.0.0.1:%d" % harness.wait_until(port, 20, name + " to listen")


def stop_psd(p):
    p.p.send_signal(signal.SIGTERM)
    rc = p.wait(60)
    if rc != 0:
        raise AssertionError("psd exited with %s after SIGTERM\n%s" % (rc, harness.tail(p.err_path)))


class SystemdTest(unittest.TestCase):
    def test_units_verify(self):
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            self.skipTest("systemd-analyze not installed")
        with harness.Cluster("psd-units") as cl:
            unitdir = units_for_this_build(cl.dir)
            for unit in ("psd.service", "psworker@.service", "psworker@3.service"):
                r = harness.run([analyze, "verify", "--man=no", os.path.join(unitdir, unit)], timeout=60)
                self.assertEqual(r.returncode, 0, "systemd-analyze verify %s:\n%s%s" % (unit, r.stdout, r.stderr))
                self.assertEqual(r.stderr.strip(), "", "systemd-analyze verify %s warns:\n%s" % (unit, r.stderr))
            # a unit with a mistake fails, so the check above means something
            bad = os.path.join(unitdir, "bad.service")
            with open(os.path.join(unitdir, "psd.service")) as f:
                text = f.read()
            with open(bad, "w") as f:
                f.write(text.replace(os.path.join(cl.dir, "bin", "psd"), os.path.join(cl.dir, "bin", "nope")))
            r = harness.run([analyze, "verify", "--man=no", bad], timeout=60)
            self.assertNotEqual(r.returncode, 0, "verify should fail for a missing program")
            for unit in ("psd.service", "psworker@3.service"):
                r = harness.run([analyze, "security", "--offline=true", os.path.join(unitdir, unit)], timeout=60)
                m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
                if not m:
                    sys.stderr.write("note: systemd-analyze security --offline gave no rating:\n%s%s\n" %
                                     (r.stdout[-500:], r.stderr[-500:]))
                    continue
                self.assertLess(float(m.group(1)), 2.5, "%s is not hardened enough:\n%s" % (unit, r.stdout))
            with open(os.path.join(unitdir, "psd.service")) as f:
                text = f.read()
            for line in ("Type=notify", "WatchdogSec=", "ExecReload=/bin/kill -HUP $MAINPID", "Restart=on-failure",
                         "StateDirectory=psd", "ConfigurationDirectory=psd", "DynamicUser=yes",
                         "CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
                         "--state-dir ${STATE_DIRECTORY}"):
                self.assertIn(line, text)

    def test_notify_and_watchdog(self):
        with harness.Cluster("psd-notify") as cl:
            ns = NotifySocket(os.path.join(cl.dir, "notify.sock"))
            try:
                p, addr = start_psd(cl, "psd", ["--workers", "1"],
                                    {"NOTIFY_SOCKET": ns.path, "WATCHDOG_USEC": "1000000"})
                ready = ns.wait_for(lambda m: "READY=1" in m, 20, "READY=1")
                status = [l for l in ready if l.startswith("STATUS=")]
                self.assertEqual(len(status), 1, ready)
                self.assertRegex(status[0], r"^STATUS=asgd, model version 0, 0/1 workers connected")
                # WATCHDOG=1 every half second (half of WATCHDOG_USEC), from the loop
                ns.wait_for(lambda m: "WATCHDOG=1" in m, 10, "a first WATCHDOG=1")
                t0 = time.monotonic()
                n0 = ns.count("WATCHDOG=1")
                ns.wait_for(lambda m: ns.count("WATCHDOG=1") >= n0 + 3, 10, "three more WATCHDOG=1")
                self.assertLess(time.monotonic() - t0, 4.0, "watchdog pings should come every ~0.5 s")
                # a new STATUS= when the state changes
                r = harness.psctl(addr, "pause")
                self.assertEqual(r.returncode, 0, r.stderr)
                ns.wait_for(lambda m: any(l.startswith("STATUS=") and l.endswith(", paused") for l in m), 10,
                            "STATUS= saying paused")
                p.p.send_signal(signal.SIGTERM)
                stop = ns.wait_for(lambda m: "STOPPING=1" in m, 20, "STOPPING=1")
                self.assertTrue(any(l.startswith("STATUS=stopping: SIGTERM") for l in stop), stop)
                self.assertEqual(p.wait(30), 0)
            finally:
                ns.close()

    def test_sighup_reload(self):
        with harness.Cluster("psd-reload") as cl:
            conf = os.path.join(cl.dir, "psd.conf")

            def write_conf(text):
                with open(conf + ".new", "w") as f:
                    f.write(text)
                os.rename(conf + ".new", conf)

            write_conf("# psd.conf\nmode = asgd\nlr = 0.05\nmomentum = 0.7\n")
            ns = NotifySocket(os.path.join(cl.dir, "notify.sock"))
            try:
                p, addr = start_psd(cl, "psd", ["--config", conf, "--set", "momentum=0.5"],
                                    {"NOTIFY_SOCKET": ns.path})
                ns.wait_for(lambda m: "READY=1" in m, 20, "READY=1")
                st = harness.status(addr)
                self.assertEqual((st["lr"], st["mode"]), (0.05, "asgd"))

                # a reloadable change
                write_conf("mode = asgd\nlr = 0.01\nmomentum = 0.7\nclip_norm = 5\n")
                nready = ns.count("READY=1")
                p.p.send_signal(signal.SIGHUP)
                harness.wait_until(lambda: "reload: lr: 0.05 -> 0.01" in p.stderr(), 20, "the lr change in the log")
                self.assertIn("reload: clip_norm: 0 -> 5", p.stderr())
                self.assertNotIn("reload: momentum", p.stderr(), "--set momentum=0.5 wins over the file")
                ns.wait_for(lambda m: ns.count("READY=1") > nready, 10, "READY=1 after the reload")
                self.assertGreaterEqual(ns.count("RELOADING=1"), 1)
                st = harness.status(addr)
                self.assertEqual(st["lr"], 0.01)

                # a bad line: refused, nothing changes
                write_conf("mode = asgd\nlr = 0.2\nthis is not a setting\n")
                p.p.send_signal(signal.SIGHUP)
                harness.wait_until(lambda: "reload refused" in p.stderr(), 20, "the refusal in the log")
                line = [l for l in p.stderr().splitlines() if "reload refused" in l][0]
                self.assertIn(conf + ":3", line)
                self.assertEqual(harness.status(addr)["lr"], 0.01)
                self.assertTrue(p.alive())

                # not reloadable: logged, kept
                write_conf("mode = bsp\nlr = 0.01\n")
                p.p.send_signal(signal.SIGHUP)
                harness.wait_until(lambda: "mode: 'asgd' -> 'bsp' needs a restart" in p.stderr(), 20,
                                   "the restart note in the log")
                st = harness.status(addr)
                self.assertEqual((st["mode"], st["lr"]), ("asgd", 0.01))
                stop_psd(p)
            finally:
                ns.close()

    def test_sighup_without_config(self):
        with harness.Cluster("psd-reload-none") as cl:
            p, addr = start_psd(cl, "psd", [], {})
            p.p.send_signal(signal.SIGHUP)
            harness.wait_until(lambda: "without --config" in p.stderr(), 20, "the note in the log")
            self.assertTrue(p.alive(), "SIGHUP must not kill psd")
            harness.status(addr)
            stop_psd(p)


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
