#!/usr/bin/python3
"""test_reconnect.py - a worker reconnects to a restarted psd within the
backoff's cap (5 s) plus 1 s of psd being back, whatever the address
answered while psd was away.

    test_reconnect.py [harness options] [unittest options]

- psd killed and started again on the same port: the worker, whose
  attempts were refused meanwhile, is back within 6 s of psd listening.
- psd killed, and for a while its port held by a listener that accepts
  and never answers (an address that answers nothing, as a restarting
  container's may: the worker's attempt connects and then waits for a
  welcome that never comes), then psd started on that port while the
  silent connections stay open: the attempt under way gives up within
  libpsclient's handshake bound, and the worker is back within 6 s of psd
  listening. Before that bound the hello waited for timeout_ms (10 min).
- A name the resolver never answers for (a private mount namespace whose
  resolv.conf names a nameserver that reads and never answers; root):
  psworker's first attempt gives up on it within its 1 s, where
  getaddrinfo alone waited the resolver's timeout times its attempts.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CAP_S = 5.0  # libpsclient's backoff cap
RECONNECTED = re.compile(r"reconnected to psd at \S+ after")


# Run by test_resolver_that_never_answers in a private mount namespace:
# resolv.conf names a nameserver on 127.0.0.9:53 that reads every query and
# answers none, and psworker is started for a name only DNS could give.
# argv: psworker, the data directory, the resolv.conf to mount.
MUTE_DNS = r"""
import socket, subprocess, sys, time
psworker, data, conf = sys.argv[1:4]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.bind(("127.0.0.9", 53))
except OSError as e:
    print("SKIP: cannot hold 127.0.0.9:53 for a silent nameserver: %s" % e)
    sys.exit(0)
subprocess.run(["mount", "--bind", conf, "/etc/resolv.conf"], check=True)
t0 = time.monotonic()
p = subprocess.Popen([psworker, "--server", "psd-restarting.example:7000", "--shard", "0/1", "--data", data,
                      "--epochs", "1", "--limit", "100", "--model", "linear", "--connect-timeout", "1"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
err = p.communicate(timeout=60)[1]
print("took %.2f exit %d" % (time.monotonic() - t0, p.returncode))
print(err.strip()[-600:])
"""


class SilentListener:
    """Listens on 127.0.0.1:port, accepts every connection and never
    answers nor closes one until close_all()."""

    def __init__(self, port):
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", port))
        self.lsock.listen(8)
        self.held = []
        self.accepted = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return  # the listening socket was closed
            c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.held.append(c)
            self.accepted.set()

    def stop_listening(self):
        """Closes the listening socket; the accepted connections stay open."""
        self.lsock.shutdown(socket.SHUT_RDWR)
        self.lsock.close()
        self.thread.join(5)

    def close_all(self):
        for c in self.held:
            c.close()


class ReconnectTest(unittest.TestCase):
    def restart(self, silent):
        port = harness.free_port()
        with harness.Cluster("psd-reconnect") as cl:
            args = ["--listen", "127.0.0.1:%d" % port]
            psd = cl.psd(mode="asgd", workers=1, args=args)
            w = cl.worker(psd, 0, 1, epochs=500, limit=2000, model="mlp:16", evaluate=False,
                          args=["--reconnect-timeout", "60"])
            harness.wait_until(lambda: harness.version(psd.addr) >= 20, 30, "the worker to train")
            os.kill(psd.pid, signal.SIGKILL)
            psd.wait(10)
            harness.wait_until(lambda: "reconnecting for up to" in w.stderr(), 10, "the worker to notice")
            holder = None
            try:
                if silent:
                    holder = SilentListener(port)
                    # an attempt is under way on a connection that answers nothing
                    harness.wait_until(holder.accepted.is_set, 10, "the worker to connect to the silent port")
                    holder.stop_listening()
                else:
                    # refused attempts for about as long as psd took to come
                    # back in its container, the backoff grown meanwhile
                    time.sleep(4.0)
                self.assertTrue(w.alive(), "the worker gave up:\n" + harness.tail(w.err_path))
                self.assertIsNone(RECONNECTED.search(w.stderr()))
                psd2 = cl.psd(mode="asgd", workers=1, args=args, name="psd2")
                up = time.monotonic()
                harness.wait_until(lambda: RECONNECTED.search(w.stderr()), 30 if silent else 15,
                                   "the worker to reconnect")
                took = time.monotonic() - up
            finally:
                if holder:
                    holder.close_all()
            sys.stderr.write("\nworker back %.2f s after psd listened again (%s)\n" %
                             (took, "its port silent meanwhile" if silent else "refused meanwhile"))
            self.assertLessEqual(took, CAP_S + 1.0, harness.tail(w.err_path))
            v = harness.version(psd2.addr)
            harness.wait_until(lambda: harness.version(psd2.addr) > v, 30, "training to go on")
            w.kill()
            psd2.stop()

    def test_resolver_that_never_answers(self):
        if os.geteuid() != 0:
            self.skipTest("not root: a resolver that never answers needs a private mount namespace (root)")
        if not shutil.which("unshare"):
            self.skipTest("no unshare (Debian package util-linux)")
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0:
            self.skipTest("cannot make a private mount namespace here (`unshare -m`: %s)" % r.stderr.strip())
        with harness.Cluster("psd-mute-dns") as cl:
            conf = os.path.join(cl.dir, "resolv.conf")
            with open(conf, "w") as f:
                f.write("nameserver 127.0.0.9\noptions timeout:5 attempts:2\n")
            r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", MUTE_DNS,
                                harness.Paths.psworker, harness.Paths.data, conf],
                               capture_output=True, text=True, timeout=90)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            if r.stdout.startswith("SKIP: "):
                self.skipTest(r.stdout[6:].strip())
            sys.stderr.write("\n" + r.stdout)
            took = float(re.search(r"took (\S+)", r.stdout).group(1))
            # each attempt gives up on the name within its handshake bound
            # (1 s for psc_connect's first), then connect_s ends the wait
            self.assertIn("no answer within 1000 ms", r.stdout)
            self.assertNotIn("exit 0", r.stdout)
            self.assertLess(took, 8.0, "psworker waited %.1f s for a name: the resolver's timeouts" % took)

    def test_restart_refused_meanwhile(self):
        self.restart(False)

    def test_restart_silent_meanwhile(self):
        self.restart(True)


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
