#!/usr/bin/python3
"""test_ops_metrics.py - psd's Prometheus endpoint (metrics_listen).

- Scraped over HTTP while two workers train (bsp), GET /metrics answers 200
  with Content-Type text/plain; version=0.0.4 and text that passes
  `promtool check metrics` and holds the families an operator needs:
  pushes, pulls, bytes, rounds, rejected messages by reason, workers by
  state, model version, staleness and round-duration histograms,
  checkpoint age, the loss and accuracy the workers report.
- HEAD gets the headers only; / is the dashboard (test_dashboard.py),
  other paths 404; other methods 405 with Allow; a request over 8 KiB 431
  (headers) or 413 (body); a target over 1 KiB 414; garbage 400; a request
  that does not finish within the idle timeout 408; every response closes
  the connection.
- Off by default (status shows no metrics address); a bad metrics_listen
  is refused at start with exit 2.
"""

import os
import socket
import sys
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

FAMILIES = {
    "psd_pushes_total": "counter",
    "psd_pulls_total": "counter",
    "psd_received_bytes_total": "counter",
    "psd_received_frames_total": "counter",
    "psd_sent_bytes_total": "counter",
    "psd_rounds_total": "counter",
    "psd_rejected_messages_total": "counter",
    "psd_workers": "gauge",
    "psd_model_version": "gauge",
    "psd_push_staleness_versions": "histogram",
    "psd_round_duration_seconds": "histogram",
    "psd_checkpoint_age_seconds": "gauge",
    "psd_worker_loss": "gauge",
    "psd_worker_test_accuracy_ratio": "gauge",
    "psd_paused": "gauge",
    "psd_learning_rate": "gauge",
}


def raw_http(addr, data, timeout=15.0, half_close=False):
    """Sends bytes to addr and returns everything psd sends back until it
    closes the connection."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        if data:
            s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        return out


def status_line(resp):
    return resp.split(b"\r\n", 1)[0].decode()


class MetricsTest(unittest.TestCase):
    def test_scrape_while_training(self):
        with harness.Cluster("psd-metrics") as cl:
            # no warm-up: psd_learning_rate is then the lr setting itself, whatever
            # version the scrape comes at (the default warms up over 100)
            psd = cl.psd(mode="bsp", workers=2, args=["--set", "metrics_listen=127.0.0.1:0", "--set",
                                                      "warmup_versions=0"])
            maddr = harness.status(psd.addr)["metrics_listen"]
            self.assertRegex(maddr, r"^127\.0\.0\.1:\d+$")
            url = "http://%s/metrics" % maddr
            # a client that starts a request and never finishes it
            host, port = maddr.rsplit(":", 1)
            idle = socket.create_connection((host, int(port)), timeout=20)
            idle.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            idle_since = time.monotonic()

            workers = [cl.worker(psd, k, 2, epochs=3, limit=12000, test_limit=500, model="mlp:64")
                       for k in range(2)]

            def reported():
                # both shards' first epoch reports: they arrive in either order
                text = urllib.request.urlopen(url, timeout=10).read().decode()
                shards = all('psd_worker_test_accuracy_ratio{shard="%d"}' % k in text for k in (0, 1))
                return text if shards and "psd_rounds_total 0\n" not in text else None

            harness.wait_until(reported, 90, "a scrape showing rounds and both workers' reported accuracy")
            with urllib.request.urlopen(url, timeout=10) as r:
                self.assertEqual(r.status, 200)
                self.assertEqual(r.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
                body = r.read().decode()
                self.assertEqual(int(r.headers["Content-Length"]), len(body.encode()))
            samples, types = harness.parse_prometheus(body)
            for fam, typ in FAMILIES.items():
                self.assertEqual(types.get(fam), typ, "family %s" % fam)
            self.assertGreater(harness.metric(samples, "psd_pushes_total"), 0)
            self.assertGreater(harness.metric(samples, "psd_rounds_total"), 0)
            self.assertGreater(harness.metric(samples, "psd_round_duration_seconds_count"), 0)
            self.assertGreater(harness.metric(samples, "psd_received_bytes_total"), 0)
            self.assertEqual(harness.metric(samples, "psd_workers", state="connected") +
                             harness.metric(samples, "psd_workers", state="left"), 2)
            self.assertIsNotNone(harness.metric(samples, "psd_rejected_messages_total", reason="malformed"))
            for k in ("0", "1"):
                self.assertIsNotNone(harness.metric(samples, "psd_worker_loss", shard=k))
            self.assertEqual(harness.metric(samples, "psd_paused"), 0)
            self.assertEqual(harness.metric(samples, "psd_learning_rate"), 0.02)
            harness.promtool_check(self, body)
            # the same families as psctl metrics
            _, ptypes = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(ptypes, types)

            # HEAD, 404, 405, 431, 400
            r = raw_http(maddr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _, rest = r.partition(b"\r\n\r\n")
            self.assertEqual(status_line(r), "HTTP/1.1 200 OK")
            self.assertEqual(rest, b"", "HEAD has no body")
            self.assertIn(b"Connection: close", head)
            r = raw_http(maddr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
            self.assertEqual(status_line(r), "HTTP/1.1 200 OK", "a query string is fine")
            with urllib.request.urlopen("http://%s/" % maddr, timeout=10) as page:
                self.assertEqual(page.headers["Content-Type"], "text/html; charset=utf-8", "/ is the dashboard")
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen("http://%s/nothing" % maddr, timeout=10)
            self.assertEqual(e.exception.code, 404)
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen("http://%s/metricsx" % maddr, timeout=10)
            self.assertEqual(e.exception.code, 404)
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(urllib.request.Request(url, data=b"x=1", method="POST"), timeout=10)
            self.assertEqual(e.exception.code, 405)
            self.assertEqual(e.exception.headers["Allow"], "GET, HEAD")
            r = raw_http(maddr, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
            self.assertEqual(status_line(r), "HTTP/1.1 431 Request Header Fields Too Large")
            r = raw_http(maddr, b"POST /metrics HTTP/1.1\r\nContent-Length: 20000\r\n\r\n" + b"x" * 20000)
            self.assertEqual(status_line(r), "HTTP/1.1 413 Payload Too Large")
            r = raw_http(maddr, b"GET /" + b"m" * 2000 + b" HTTP/1.1\r\n\r\n")
            self.assertEqual(status_line(r), "HTTP/1.1 414 URI Too Long")
            r = raw_http(maddr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n")
            self.assertEqual(status_line(r), "HTTP/1.1 400 Bad Request")
            r = raw_http(maddr, b"", half_close=True)
            self.assertEqual(r, b"", "a client that says nothing and leaves")

            for k, w in enumerate(workers):
                rc, _ = w.result(timeout=120)
                self.assertEqual(rc, 0, w.stderr())

            # the idle client was cut off with 408 after the idle timeout (10 s)
            idle.settimeout(max(1.0, 15 - (time.monotonic() - idle_since)))
            resp = b""
            try:
                while True:
                    chunk = idle.recv(4096)
                    if not chunk:
                        break
                    resp += chunk
            finally:
                idle.close()
            self.assertEqual(status_line(resp), "HTTP/1.1 408 Request Timeout")
            self.assertGreater(time.monotonic() - idle_since, 9)
            # psd still serves
            self.assertEqual(urllib.request.urlopen(url, timeout=10).status, 200)
            psd.stop()

    def test_off_by_default_and_bad_address(self):
        with harness.Cluster("psd-metrics-off") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            self.assertEqual(harness.status(psd.addr)["metrics_listen"], "")
            psd.stop()
        for bad in ("nonsense", "127.0.0.1:99999", "localhost:9100"):
            r = harness.run([Paths.psd, "--listen", "127.0.0.1:0", "--set", "metrics_listen=" + bad], timeout=30)
            self.assertEqual(r.returncode, 2, bad + ": " + r.stderr)
            self.assertIn("metrics_listen", r.stderr, bad)
        # a port in use: psd does not start
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        try:
            r = harness.run([Paths.psd, "--listen", "127.0.0.1:0", "--set",
                             "metrics_listen=127.0.0.1:%d" % s.getsockname()[1]], timeout=30)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("cannot listen", r.stderr)
        finally:
            s.close()


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
