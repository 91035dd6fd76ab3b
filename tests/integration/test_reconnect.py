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
"""

import os
import re
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CAP_S = 5.0  # libpsclient's backoff cap
RECONNECTED = re.compile(r"reconnected to psd at \S+ after")


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

    def test_restart_refused_meanwhile(self):
        self.restart(False)

    def test_restart_silent_meanwhile(self):
        self.restart(True)


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
