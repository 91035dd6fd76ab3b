#!/usr/bin/python3
"""test_lifecycle.py - psd and its workers as launchers start and stop them.

- SIGTERM or SIGINT to a psworker (systemctl stop, scancel, pod deletion,
  Ctrl-C) makes it finish its step, say bye with the reason and exit with
  128 + the signal; psd shows the worker as left ("stopped by SIGTERM" in
  psctl status and its log), not lost. In bsp two workers stopped together
  both leave cleanly (the round of one does not wait for the other).
- psctl: a mistyped command gets "did you mean"; --json with metrics is a
  usage error, not text; a failed `psctl checkpoint` says why (the
  checkpoint writer's error), not only that psd's log does.
- psd refuses at start what it would otherwise find late: a state_dir it
  cannot write (a file, below a file, a directory it may not write in);
  nesterov with momentum 0 is refused at start, by --print-config and on
  `psctl set`; --print-config refuses protected mode as a start does (the
  machine's files, token files and state_dir, only a start checks).
- A psd that takes its model from a checkpoint says so (log and psctl
  status: "resuming model version N from FILE"); --fresh moves the
  checkpoints into a dated subfolder (deleting nothing) and starts anew.
"""

import glob
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def shard_row(st, k):
    rows = [w for w in st["workers"] if w["shard"] == k]
    return rows[0] if rows else None


class SignalTest(unittest.TestCase):
    def stop_worker(self, mode, sig, args=()):
        nw = 2 if mode == "bsp" else 1
        with harness.Cluster("psd-signal") as cl:
            psd = cl.psd(mode=mode, workers=nw)
            ws = [cl.worker(psd, k, nw, epochs=200, limit=3000, test_limit=200, model="mlp:32", args=args)
                  for k in range(nw)]

            def pushing():
                st = harness.status(psd.addr)
                return all((shard_row(st, k) or {}).get("pushes", 0) >= 5 for k in range(nw))

            harness.wait_until(pushing, 60, "the workers to push")
            for w in ws:
                w.p.send_signal(sig)
            name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
            for w in ws:
                rc = w.wait(30)
                self.assertEqual(rc, 128 + sig, "%s exit status\n%s" % (w.name, w.stderr()))
                self.assertIn("stopped by %s" % name, w.stderr())
            st = harness.status(psd.addr)
            for k in range(nw):
                row = shard_row(st, k)
                self.assertEqual(row["state"], "left", row)
                self.assertEqual(row["why"], "stopped by %s" % name, row)
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_worker_leaves_total"), nw)
            self.assertEqual(harness.metric(samples, "psd_worker_deaths_total"), 0)
            r = harness.psctl(psd.addr, "workers")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("stopped by %s" % name, r.stdout)
            psd.stop()
            log = psd.stderr()
            for k in range(nw):
                self.assertIn("worker shard %d/%d" % (k, nw), log)
            self.assertEqual(log.count("left: stopped by %s" % name), nw, log)
            self.assertNotIn(" lost: ", log)

    def test_sigterm_asgd(self):
        self.stop_worker("asgd", signal.SIGTERM)

    def test_sigint_asgd_pipelined(self):
        self.stop_worker("asgd", signal.SIGINT, args=("--pipeline", "on"))

    def test_sigterm_bsp(self):
        self.stop_worker("bsp", signal.SIGTERM)

    def test_signal_ends_a_round_that_waits_for_ever(self):
        """A BSP round waits for a shard that never joins (join_timeout 0:
        for ever): SIGTERM ends psworker's wait at once (the library's
        interrupt option), and it leaves with the signal as its reason."""
        with harness.Cluster("psd-signal-wait") as cl:
            psd = cl.psd(mode="bsp", workers=2, args=("--set", "join_timeout=0", "--set", "heartbeat_timeout=1s"))
            w = cl.worker(psd, 0, 2, epochs=1, limit=600, test_limit=100, model="mlp:16")

            def waiting():
                row = shard_row(harness.status(psd.addr), 0)
                return row is not None and row.get("pushes", 0) >= 1

            harness.wait_until(waiting, 60, "shard 0's first push (its round then waits for shard 1)")
            t0 = time.monotonic()
            w.p.send_signal(signal.SIGTERM)
            rc = w.wait(30)
            took = time.monotonic() - t0
            self.assertEqual(rc, 128 + signal.SIGTERM, w.stderr())
            self.assertLess(took, 1.0, "psworker took %.2f s after SIGTERM\n%s" % (took, w.stderr()))
            self.assertIn("stopped by SIGTERM", w.stderr())
            row = shard_row(harness.status(psd.addr), 0)
            self.assertEqual((row["state"], row["why"]), ("left", "stopped by SIGTERM"), row)


    def signal_while_held(self, name, mode, psd_args, t, skip, what, check_held=None):
        """Starts psd (mode, psd_args) and one psworker (3 epochs of 640
        examples, mlp:16) connected through a FrameHold relay that holds
        the worker's (skip + 1)-th frame of type t (what names it for a
        failure); once it is held (and check_held(relay) has run) sends the
        worker SIGTERM and checks that it stops as in a step: exit 128 +
        SIGTERM, "stopped by SIGTERM", not "interrupted by a signal"."""
        with harness.Cluster(name) as cl:
            psd = cl.psd(mode=mode, workers=1, args=psd_args)
            relay = FrameHold(psd.addr, t, skip=skip)
            try:
                w = cl.worker(relay.addr, 0, 1, epochs=3, limit=640, test_limit=100, model="mlp:16")
                self.assertTrue(relay.held.wait(60), "the worker's %s\n%s" % (what, w.stderr()))
                if check_held:
                    check_held(relay)
                time.sleep(0.2)  # psworker is in the held message's wait (nothing reaches psd)
                self.assertIsNone(w.p.poll(), w.stderr())
                w.p.send_signal(signal.SIGTERM)
                rc = w.wait(30)
                err = w.stderr()
                self.assertEqual(rc, 128 + signal.SIGTERM, err)
                self.assertIn("stopped by SIGTERM", err)
                self.assertNotIn("interrupted by a signal", err)
            finally:
                relay.close()

    def test_signal_during_the_epoch_report(self):
        """SIGTERM while psworker waits for the answer to its epoch's
        REPORT (a relay between it and psd holds the REPORT frame): it
        stops as it does in a step, exit 128 + SIGTERM and "stopped by
        SIGTERM", not "reporting epoch 1: interrupted by a signal" and
        exit 1 (what a signal landing there did, seen where an epoch
        takes 20 ms)."""
        self.signal_while_held("psd-signal-report", "asgd", [], harness.T_REPORT, 0, "first REPORT")

    def test_signal_during_the_epoch_end_pull(self):
        """SIGTERM while a local SGD worker with --eval waits for psd's
        model at its epoch's end (its second PULL, the first being the
        connect's, held by a relay): it stops as in a step, exit 128 +
        SIGTERM and "stopped by SIGTERM" (it exited 1 with "interrupted
        by a signal")."""
        def a_round_came_first(relay):
            self.assertIn(harness.T_PUSHPULL, relay.seen, "a round came before the held PULL")

        self.signal_while_held("psd-signal-pull", "bsp",
                               ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "local_steps=4"],
                               harness.T_PULL, 1, "epoch-end PULL", check_held=a_round_came_first)


class FrameHold:
    """A TCP relay on 127.0.0.1 for one connection to upstream that
    forwards frames both ways until the client sends its (skip + 1)-th
    frame of type t, and from then on forwards nothing more from the
    client (held is set). seen: the types of the frames forwarded."""

    def __init__(self, upstream, t, skip=0):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.upstream = upstream
        self.held = threading.Event()
        self.t, self.skip, self.seen = t, skip, []
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            c, _ = self.lsock.accept()
        except OSError:
            return
        host, port = self.upstream.split(":")
        u = socket.create_connection((host, int(port)))
        self.socks += [c, u]
        threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()
        self._frames(c, u)

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass

    def _frames(self, c, u):
        buf = b""
        try:
            while True:
                data = c.recv(1 << 16)
                if not data:
                    return
                buf += data
                while len(buf) >= 4:
                    (n,) = struct.unpack(">I", buf[:4])
                    if len(buf) < 4 + n:
                        break
                    msg = msgpack.unpackb(buf[4:4 + n], raw=False)
                    t = msg.get("t") if isinstance(msg, dict) else None
                    if t == self.t and self.seen.count(t) == self.skip:
                        self.held.set()
                        while c.recv(1 << 16):  # from now on nothing goes to psd
                            pass
                        return
                    u.sendall(buf[:4 + n])
                    self.seen.append(t)
                    buf = buf[4 + n:]
        except OSError:
            pass

    def close(self):
        for sk in self.socks + [self.lsock]:
            sk.close()


class PsctlTest(unittest.TestCase):
    def test_usage(self):
        r = harness.run([harness.Paths.psctl, "stauts"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("did you mean 'status'?", r.stderr)
        r = harness.run([harness.Paths.psctl, "chekpoint"])
        self.assertIn("did you mean 'checkpoint'?", r.stderr)
        r = harness.run([harness.Paths.psctl, "frobnicate"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn("did you mean", r.stderr)
        with harness.Cluster("psd-psctl") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            for argv in (["--json", "metrics"], ["metrics", "--json"]):
                r = harness.psctl(psd.addr, *argv)
                self.assertEqual(r.returncode, 2, r.stdout)
                self.assertEqual(r.stdout, "")
                self.assertIn("--json does not apply to metrics", r.stderr)
            self.assertEqual(harness.psctl(psd.addr, "metrics").returncode, 0)
            psd.stop()

    def test_checkpoint_failure_says_why(self):
        with harness.Cluster("psd-ckptfail") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, args=("--state-dir", state))
            w = cl.worker(psd, 0, 1, epochs=200, limit=3000, test_limit=200, model="mlp:32")
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 5, 60, "training to start")
            r = harness.psctl(psd.addr, "checkpoint")
            self.assertEqual(r.returncode, 0, r.stderr)
            # the state dir becomes a file: the next checkpoint cannot be written
            os.rename(state, state + ".moved")
            with open(state, "w") as f:
                f.write("not a directory\n")
            r = harness.psctl(psd.addr, "checkpoint")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("failed: cannot create", r.stderr)
            self.assertIn("Not a directory", r.stderr)
            self.assertNotIn("log says why", r.stderr)
            w.kill()
            psd.p.kill()


class StartChecksTest(unittest.TestCase):
    def psd(self, *args, timeout=20):
        return harness.run([harness.Paths.psd, "--listen", "127.0.0.1:0"] + list(args), timeout=timeout)

    def refused(self, args, code, text, print_config=True):
        """psd with args is refused at start, and by --print-config when the
        reason is in the settings (not in this machine's files)."""
        r = self.psd("--print-config", *args)
        if print_config:
            self.assertEqual(r.returncode, code, "--print-config %s: %s%s" % (args, r.stdout, r.stderr))
            self.assertIn(text, r.stderr)
            self.assertEqual(r.stdout, "")
        else:
            self.assertEqual(r.returncode, 0, "--print-config %s: %s" % (args, r.stderr))
        try:
            r = self.psd(*args, timeout=10)
        except subprocess.TimeoutExpired:
            self.fail("psd started with %s" % (args,))
        self.assertEqual(r.returncode, code, "%s: %s" % (args, r.stderr))
        self.assertIn(text, r.stderr)

    def test_state_dir(self):
        with harness.Cluster("psd-startchecks") as cl:
            afile = os.path.join(cl.dir, "afile")
            with open(afile, "w") as f:
                f.write("x\n")
            self.refused(["--state-dir", afile], 1, "is not a directory", print_config=False)
            self.refused(["--state-dir", os.path.join(afile, "state")], 1, "Not a directory", print_config=False)
            if os.geteuid() == 0:
                locked = "/proc"  # no one may create files there, not even root
            else:
                locked = os.path.join(cl.dir, "locked")
                os.mkdir(locked, 0o500)
            self.refused(["--state-dir", locked], 1, "cannot be written (checkpoints would fail)",
                         print_config=False)
            # a missing state dir is fine: a start creates it
            fresh = os.path.join(cl.dir, "fresh")
            psd = cl.psd(args=("--state-dir", fresh))
            self.assertTrue(os.path.isdir(fresh))
            self.assertEqual(os.listdir(fresh), [])
            psd.stop()

    def test_nesterov_without_momentum(self):
        # nesterov is sgd's (psd's default optimizer is adagrad)
        self.refused(["--set", "optimizer=sgd", "--set", "nesterov=yes", "--set", "momentum=0"], 2,
                     "nesterov = yes needs momentum above 0")
        r = self.psd("--print-config", "--set", "nesterov=yes", "--set", "momentum=0", "--set", "optimizer=adam")
        self.assertEqual(r.returncode, 0, r.stderr)
        with harness.Cluster("psd-nesterov") as cl:
            psd = cl.psd(args=("--set", "optimizer=sgd", "--set", "nesterov=yes", "--set", "momentum=0.9"))
            r = harness.psctl(psd.addr, "set", "momentum=0")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("nesterov = yes needs momentum above 0", r.stderr)
            self.assertEqual(harness.psctl(psd.addr, "set", "momentum=0.5").returncode, 0)
            psd.stop()

    def test_print_config_refuses_what_start_refuses(self):
        self.refused(["--listen", "0.0.0.0:0"], 2, "protected mode")
        with harness.Cluster("psd-printcfg") as cl:
            self.refused(["--set", "token_file=" + os.path.join(cl.dir, "missing")], 2, "cannot open: No such file",
                         print_config=False)


class FreshTest(unittest.TestCase):
    def test_resume_is_said_and_fresh_sets_aside(self):
        with harness.Cluster("psd-fresh") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(name="psd1", mode="asgd", workers=1, args=("--state-dir", state))
            self.assertIsNone(harness.status(psd.addr)["resumed_from"])
            w = cl.worker(psd, 0, 1, epochs=1, limit=2000, test_limit=200, model="mlp:16")
            rc, summary = w.result(60)
            self.assertEqual(rc, 0, w.stderr())
            psd.stop()
            self.assertNotIn("resuming model version", psd.stderr())
            ckpts = sorted(glob.glob(os.path.join(state, "ckpt-*.psdc")))
            self.assertTrue(ckpts, os.listdir(state))
            newest = ckpts[-1]
            version = int(os.path.basename(newest)[5:25])

            psd = cl.psd(name="psd2", mode="asgd", workers=1, args=("--state-dir", state))
            st = harness.status(psd.addr)
            self.assertEqual(st["resumed_from"], newest)
            self.assertEqual(st["resumed_version"], version)
            self.assertEqual(st["version"], version)
            r = harness.psctl(psd.addr, "status")
            self.assertIn("model resumed at start from version %d in %s (psd --fresh begins anew)" %
                          (version, newest), r.stdout)
            psd.stop()
            self.assertIn("resuming model version %d from %s; start with --fresh to begin anew" % (version, newest),
                          psd.stderr())

            before = sorted(os.listdir(state))
            psd = cl.psd(name="psd3", mode="asgd", workers=1, args=("--state-dir", state, "--fresh"))
            st = harness.status(psd.addr)
            self.assertIsNone(st["resumed_from"])
            self.assertEqual(st["version"], 0)
            psd.stop()
            log = psd.stderr()
            self.assertNotIn("resuming model version", log)
            asides = glob.glob(os.path.join(state, "set-aside-*"))
            self.assertEqual(len(asides), 1, os.listdir(state))
            self.assertRegex(os.path.basename(asides[0]), r"^set-aside-\d{8}T\d{6}Z$")
            self.assertEqual(sorted(os.listdir(asides[0])), [f for f in before if f.startswith("ckpt-")])
            self.assertEqual(glob.glob(os.path.join(state, "ckpt-*")), [])
            self.assertIn("--fresh: moved %d checkpoint file" % len(ckpts), log)
            self.assertIn("nothing deleted", log)

            # the next start has nothing to resume, and the set-aside files stay
            psd = cl.psd(name="psd4", mode="asgd", workers=1, args=("--state-dir", state))
            self.assertIsNone(harness.status(psd.addr)["resumed_from"])
            psd.stop()
            self.assertEqual(sorted(os.listdir(asides[0])), [f for f in before if f.startswith("ckpt-")])


if __name__ == "__main__":
    harness.parse_args()
    harness.main(argv=sys.argv[:1], verbosity=2)
