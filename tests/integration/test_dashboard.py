"""test_dashboard.py - psd's dashboard in a real browser, its JSON and
`psctl history`.

- psd with two workers reporting every 0.2 s (PSD_REPORT_INTERVAL), the
  page opened in headless Chromium (browser.py): both workers' rows, a loss
  chart given more than 10 points per worker, the model version shown and
  then changing without a reload; no console error, exception or failed
  load; every request went to psd's own address; a screenshot saved. After
  the workers have finished, a reload shows the whole run again (rows
  `left`, the charts' points, the join and leave events).
- /api/job and /api/history hold what the page shows (valid JSON), and
  psctl history prints the same history as a table, CSV and JSON.
- With a token_file: the page, its files, its JSON and /metrics answer 401
  without the token; the bearer token is accepted, ?token= sets a read
  cookie (not the secret) with which the page works in the browser; psctl
  history works for a read-only admin (the workers' token).
- Protected mode: psd refuses a non-loopback metrics_listen without a
  token.
- Replicas: a leader's page lists its part's replicas (itself and its
  follower, in sync, with its lag in bytes and versions), a follower's
  page its leader and its lag; the JSON and psctl status agree.
- Embedding tables: a worker pulling and pushing rows of two tables; the
  page shows, per table, a chart of rows held and memory and one of rows
  pulled and pushed per second, with points; /api/history's table series
  hold the rows psctl status counts, the memory, and the rates of what the
  worker sent (and nothing for a table left idle); psctl history --csv
  has the table rows.
- Parts: a table grown from 2 psd parts to 3 (psctl parts add); the added
  part's page shows the part map and the move (rows taken, both sources
  handed over), as its /api/job does.

Skipped, with a note, when chromium or python3-websocket is missing (both
are installed by scripts/setup.sh).
"""

import json
import os
import shutil
import struct
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Cluster, Paths  # noqa: E402

ARGS = None

try:
    import browser
    HAVE_BROWSER = browser.chromium_path() is not None
except ImportError:  # python3-websocket missing
    HAVE_BROWSER = False

# The page's state as the test reads it from the DOM.
DOM_STATE = """(() => {
  const rows = [...document.querySelectorAll('#workers tbody tr')].map(tr => ({
    shard: Number(tr.dataset.shard), state: tr.className,
    cells: [...tr.children].map(td => td.textContent)}));
  const points = (id) => JSON.parse(document.getElementById(id).dataset.points || '{}');
  return {rows, version: document.getElementById('version').textContent,
          status: document.getElementById('status').textContent,
          loss: points('chart-loss-time'), lossv: points('chart-loss-version'),
          acc: points('chart-acc-time'), pushes: points('chart-pushes'),
          canvases: document.querySelectorAll('.chart canvas').length,
          events: [...document.querySelectorAll('#events tbody tr')].map(tr => tr.children[2].textContent)};
})()"""


# The page's table charts: per chart its table, title and points.
TABLE_CHARTS = """(() => [...document.querySelectorAll('#tables .chart')].map(el => ({
  id: el.id, table: el.dataset.table, title: el.querySelector('h3').textContent,
  points: JSON.parse(el.dataset.points || '{}'), canvas: el.querySelectorAll('canvas').length,
  hidden: document.getElementById('tables-section').hidden})))()"""


def http_get(url, headers=None, timeout=10):
    """(status, headers, body) of a GET; an HTTP error is a status too."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def version_of(text):
    return int(text.replace(",", ""))


class Dashboard(unittest.TestCase):
    def start(self, cl, token_file=None, secret=None):
        """psd in asgd for 2 workers with the dashboard on a loopback port
        and a state_dir; returns it and the dashboard's base URL."""
        os.makedirs(os.path.join(cl.dir, "state"), exist_ok=True)
        args = ["--set", "metrics_listen=127.0.0.1:0", "--set", "lr=0.02", "--state-dir",
                os.path.join(cl.dir, "state")]
        if ARGS.web_root:
            args += ["--set", "web_root=" + ARGS.web_root]
        if token_file:
            args += ["--set", "token_file=" + token_file]
        psd = cl.psd(mode="asgd", workers=2, args=args, token=secret)
        st = harness.psctl(psd.addr, "status", "--json", *(["--token-file", token_file] if token_file else []))
        self.assertEqual(st.returncode, 0, st.stderr)
        maddr = json.loads(st.stdout)["metrics_listen"]
        self.assertTrue(maddr.startswith("127.0.0.1:"), maddr)
        return psd, "http://" + maddr

    def workers(self, cl, psd, epochs, token_file=None):
        os.environ["PSD_REPORT_INTERVAL"] = "0.2"
        try:
            extra = ["--token-file", token_file] if token_file else []
            return [cl.worker(psd, k, 2, epochs=epochs, limit=4000, test_limit=500, model="mlp:128", args=extra)
                    for k in range(2)]
        finally:
            del os.environ["PSD_REPORT_INTERVAL"]

    @unittest.skipUnless(HAVE_BROWSER, "chromium or python3-websocket missing (scripts/setup.sh installs both)")
    def test_page_in_browser(self):
        with Cluster("psd-dashboard") as cl:
            psd, base = self.start(cl)
            # workers that would train far longer than the test looks: it
            # ends them itself once it has seen the page at work
            ws = self.workers(cl, psd, epochs=100000)
            # train until each worker has reported a good many times
            harness.wait_until(lambda: all(w["samples"] > 0 for w in harness.status(psd.addr)["workers"])
                               and len(harness.status(psd.addr)["workers"]) == 2, 60, "both workers to report")
            with browser.Browser(cl.dir) as b:
                b.navigate(base + "/")
                st = b.wait_for("(() => { const s = %s; return s.rows.length === 2 && "
                                "Object.values(s.loss).length === 2 && "
                                "Object.values(s.loss).every(n => n > 10) && s.version !== '\u2013' && s })()"
                                % DOM_STATE, 90, "both rows and more than 10 loss points per worker")
                self.assertEqual(sorted(r["shard"] for r in st["rows"]), [0, 1])
                self.assertEqual(sorted(st["loss"]), ["worker 0", "worker 1"])
                self.assertGreaterEqual(st["canvases"], 9, "one uPlot canvas per chart")
                v1 = version_of(st["version"])
                # the page updates itself: a newer version without a reload
                st2 = b.wait_for("(() => { const s = %s; return Number(s.version.replace(/,/g, '')) > %d && s })()"
                                 % (DOM_STATE, v1), 30, "the model version to change on the page")
                self.assertGreater(version_of(st2["version"]), v1)
                # the version shown is psd's (it only grows: at most what psd says now)
                self.assertLessEqual(version_of(st2["version"]), harness.status(psd.addr)["version"])
                self.assertTrue(all(r["state"] == "connected" for r in st2["rows"]), st2["rows"])
                # transport and tables via: psworker's tensors and its table
                # segment (libpsclient offers both on psd's machine)
                self.assertEqual([r["cells"][2:4] for r in st2["rows"]], [["shm", "shm"]] * 2, st2["rows"])
                shot = os.path.join(ARGS.out, "dashboard-test.png")
                os.makedirs(ARGS.out, exist_ok=True)
                size = b.screenshot(shot)
                self.assertGreater(size, 20000, "a screenshot of a page with charts")
                with open(shot, "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

                # events: a setting, a pause and resume within one tick, a checkpoint
                for cmd in (["set", "lr=0.015"], ["pause"], ["resume"], ["checkpoint"]):
                    r = harness.psctl(psd.addr, *cmd)
                    self.assertEqual(r.returncode, 0, r.stderr)
                for w in ws:
                    w.kill()
                # the job is over: a reload shows the whole run
                harness.wait_until(lambda: all(w["state"] == "lost" for w in harness.status(psd.addr)["workers"]),
                                   30, "psd to see both workers gone")
                b.navigate(base + "/?reload")
                end = b.wait_for("(() => { const s = %s; return s.rows.length === 2 && "
                                 "s.rows.every(r => r.state === 'lost') && "
                                 "Object.values(s.loss).every(n => n > 10) && s.events.length >= 8 && s })()"
                                 % DOM_STATE, 30, "the finished run after a reload")
                self.assertEqual(end["events"].count("joined"), 2, end["events"])
                self.assertEqual(end["events"].count("lost"), 2, end["events"])
                for kind in ("settings", "paused", "resumed", "checkpoint"):
                    self.assertIn(kind, end["events"])
                self.assertIn("lr: 0.02 -> 0.015", b.evaluate("document.getElementById('events').innerText"))
                self.assertEqual(sorted(end["acc"]), ["worker 0", "worker 1"])
                self.assertTrue(all(n >= 1 for n in end["acc"].values()), end["acc"])  # an evaluation per epoch
                b.call("Runtime.evaluate", expression="0")  # collect the last events
                self.assertEqual(b.errors, [], "the page met errors")
                self.assertTrue(b.requests, "the page made requests")
                foreign = [u for u in b.requests if not u.startswith(base + "/") and not u.startswith("data:")]
                self.assertEqual(foreign, [], "the page asked for something other than psd")
            sys.stderr.write("screenshot: %s\n" % shot)

            # the JSON the page reads, and psctl history
            code, hdrs, body = http_get(base + "/api/job")
            self.assertEqual(code, 200)
            self.assertEqual(hdrs["Content-Type"], "application/json")
            job = json.loads(body)
            self.assertEqual(job["mode"], "asgd")
            self.assertEqual([w["state"] for w in job["workers"]], ["lost", "lost"])
            self.assertEqual(len(job["lr_curve"]["version"]), len(job["lr_curve"]["lr"]))
            self.assertEqual(sum(job["staleness"]["counts"]), job["pushes"])
            code, _, body = http_get(base + "/api/history")
            self.assertEqual(code, 200)
            hist = json.loads(body)
            self.assertEqual([w["shard"] for w in hist["workers"]], [0, 1])
            for w in hist["workers"]:
                tr = w["train"]
                self.assertGreater(len(tr["t"]), 10)
                self.assertEqual(len(tr["t"]), len(tr["loss"]))
                self.assertEqual(tr["t"], sorted(tr["t"]))
                self.assertEqual(tr["version"], sorted(tr["version"]))
                self.assertEqual(len(w["eval"]["accuracy"]), len(w["eval"]["t"]))
                self.assertGreater(w["eval"]["accuracy"][-1], 0.8)
            self.assertGreater(max(hist["psd"]["pushes_per_second"]), 0)

            r = harness.psctl(psd.addr, "history", "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            ph = json.loads(r.stdout)
            # fetched after /api/history: the same events, and perhaps the
            # checkpoint psd writes once the last worker has left, which may
            # be recorded between the two
            kinds = [e["kind"] for e in hist["events"]]
            self.assertEqual([e["kind"] for e in ph["events"]][:len(kinds)], kinds)
            self.assertLessEqual(len(ph["events"]) - len(kinds), 1, ph["events"][len(kinds):])
            r = harness.psctl(psd.addr, "history", "--csv")
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            self.assertEqual(lines[0], "series,shard,t,version,column,value")
            loss_rows = [l for l in lines if l.startswith("train,1,") and ",loss," in l]
            self.assertGreater(len(loss_rows), 10)
            r = harness.psctl(psd.addr, "history")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("joined", r.stdout)
            code, _, _ = http_get(base + "/nothing-here")
            self.assertEqual(code, 404)
            psd.stop()

    def test_token(self):
        with Cluster("psd-dashboard-token") as cl:
            secret = "dashboard-secret-0123456789abcdef"
            tf = os.path.join(cl.dir, "token")
            harness.write_token(tf, secret.encode())
            psd, base = self.start(cl, token_file=tf, secret=secret.encode())
            for path in ("/", "/app.js", "/api/job", "/api/history", "/metrics"):
                code, hdrs, body = http_get(base + path)
                self.assertEqual(code, 401, path)
                self.assertIn("Bearer", hdrs.get("WWW-Authenticate", ""))
                self.assertIn(b"token", body)
                code, _, _ = http_get(base + path, {"Authorization": "Bearer wrong-secret-0123456789"})
                self.assertEqual(code, 401, path)
            code, _, body = http_get(base + "/api/job", {"Authorization": "Bearer " + secret})
            self.assertEqual(code, 200)
            json.loads(body)
            code, _, _ = http_get(base + "/metrics", {"Authorization": "Bearer " + secret})
            self.assertEqual(code, 200)
            code, hdrs, _ = http_get(base + "/api/job?token=" + secret)
            self.assertEqual(code, 200)
            cookie = hdrs["Set-Cookie"].split(";")[0]
            self.assertTrue(cookie.startswith("psd_read="), cookie)
            self.assertNotIn(secret, cookie)
            code, _, _ = http_get(base + "/api/history", {"Cookie": cookie})
            self.assertEqual(code, 200)
            code, _, _ = http_get(base + "/api/history", {"Cookie": "psd_read=" + "0" * 64})
            self.assertEqual(code, 401)
            # a read-only admin (the workers' token) may read the history
            r = harness.psctl(psd.addr, "history", "--token-file", tf)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = harness.psctl(psd.addr, "history")
            self.assertNotEqual(r.returncode, 0)

            if not HAVE_BROWSER:
                return
            ws = self.workers(cl, psd, epochs=2, token_file=tf)
            with browser.Browser(cl.dir) as b:
                # without the token: a form asking for it; filled in, the
                # page comes back without the secret in its address
                b.navigate(base + "/")
                self.assertIn("401", b.evaluate("document.body.innerText"))
                b.evaluate("document.querySelector('input[name=token]').value = %s" % json.dumps(secret))
                b.evaluate("document.querySelector('form').submit(), 1")
                b.wait_for("location.href === %s && document.readyState === 'complete' && "
                           "document.getElementById('workers') !== null" % json.dumps(base + "/"), 30,
                           "the page after the form")
                b.wait_for("(() => { const s = %s; return s.rows.length === 2 && s.version !== '\u2013' && s })()"
                           % DOM_STATE, 60, "the page with the token")
                cookies = b.call("Network.getCookies", urls=[base + "/"])["cookies"]
                self.assertEqual([c["name"] for c in cookies], ["psd_read"])
                self.assertNotIn(secret, cookies[0]["value"])
                self.assertTrue(cookies[0]["httpOnly"])
                # the one error: the 401 of the first visit
                others = [e for e in b.errors if not ("401" in e and e.endswith(base + "/"))]
                self.assertEqual(others, [])
                self.assertFalse(any(secret in u for u in b.requests if "token=" not in u))
            for w in ws:
                rc, _ = w.result(120)
                self.assertEqual(rc, 0, w.stderr())
            psd.stop()

    def test_protected_mode(self):
        with Cluster("psd-dashboard-protected") as cl:
            r = harness.run([Paths.psd, "--listen", "127.0.0.1:0", "--set", "metrics_listen=0.0.0.0:0"], timeout=30,
                            cwd=cl.dir)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("protected mode", r.stderr)


class DashboardTables(unittest.TestCase):
    @unittest.skipUnless(HAVE_BROWSER, "chromium or python3-websocket missing (scripts/setup.sh installs both)")
    def test_tables_in_browser(self):
        with Cluster("psd-dashboard-tables") as cl:
            psd, base = Dashboard.start(self, cl)
            w = harness.RawClient(psd.addr, 10)
            r = w.hello_worker([["w", [4]]], 0, 1)
            self.assertEqual(r.get("t"), harness.T_WELCOME, r)
            if r.get("init"):
                w.request({"t": harness.T_INIT, "off": 0, "data": struct.pack("<4f", 0, 0, 0, 0)})
            for name in ("emb", "idle"):
                r = w.request({"t": harness.T_TABLE, "tab": name, "dim": 8, "rinit": "zeros", "opt": "sgd",
                               "hp": {"lr": 0.1}})
                self.assertEqual(r.get("t"), harness.T_OK, r)
            r = w.request({"t": harness.T_TPULL, "tab": "idle", "keys": struct.pack("<Q", 5)})
            self.assertEqual(r.get("t"), harness.T_ROWS, r)  # pulling stores nothing: idle holds no rows
            stop = threading.Event()
            sent = {"pushed": 0, "pulled": 0, "err": None}

            def train():
                # 64 new keys pushed and 128 rows pulled a step, 20 steps a second
                step = 0
                try:
                    while not stop.is_set():
                        ks = struct.pack("<64Q", *range(64 * step, 64 * step + 64))
                        r = w.request({"t": harness.T_TPUSHPULL, "tab": "emb", "keys": ks, "base": 0,
                                       "data": struct.pack("<512f", *([0.5] * 512)), "pkeys": ks + ks})
                        if r.get("t") != harness.T_ROWS:
                            raise AssertionError(r)
                        sent["pushed"] += 64
                        sent["pulled"] += 128
                        step += 1
                        stop.wait(0.05)
                except Exception as e:  # noqa: BLE001 - reported by the test
                    sent["err"] = e

            th = threading.Thread(target=train)
            th.start()
            try:
                with browser.Browser(cl.dir) as b:
                    b.navigate(base + "/")
                    got = b.wait_for("(() => { const c = %s; return c.length === 4 && "
                                     "c.every(x => Object.values(x.points).every(n => n >= 3)) && c })()"
                                     % TABLE_CHARTS, 60, "two charts per table with 3 points each")
                    self.assertEqual([c["table"] for c in got], ["emb", "emb", "idle", "idle"])
                    self.assertEqual([c["title"] for c in got[:2]],
                                     ["table emb: rows held and memory", "table emb: rows pulled and pushed per second"])
                    self.assertEqual(sorted(got[0]["points"]), ["memory", "rows"])
                    self.assertEqual(sorted(got[1]["points"]), ["pulled/s", "pushed/s"])
                    self.assertTrue(all(c["canvas"] >= 1 and not c["hidden"] for c in got), got)
                    b.call("Runtime.evaluate", expression="0")
                    self.assertEqual(b.errors, [], "the page met errors")
            finally:
                stop.set()
                th.join(10)
            self.assertIsNone(sent["err"])
            st = {t["name"]: t for t in harness.status(psd.addr)["tables"]}

            def settled():
                # psd samples once a second: a sample after the worker stopped
                code, _, body = http_get(base + "/api/history")
                self.assertEqual(code, 200)
                h = json.loads(body)
                e = [t["series"] for t in h["tables"] if t["name"] == "emb"]
                return h if e and e[0]["rows"] and e[0]["rows"][-1] == st["emb"]["rows"] else None

            hist = harness.wait_until(settled, 10, "a history sample holding every row pushed")
            tabs = {t["name"]: t["series"] for t in hist["tables"]}
            self.assertEqual(sorted(tabs), ["emb", "idle"])
            emb, idle = tabs["emb"], tabs["idle"]
            for col in ("rows", "bytes", "rows_pulled_per_second", "rows_pushed_per_second"):
                self.assertEqual(len(emb[col]), len(emb["t"]), col)
            self.assertEqual(emb["rows"][-1], st["emb"]["rows"])
            self.assertEqual(st["emb"]["rows"], sent["pushed"])  # every pushed key was new
            self.assertEqual(emb["rows"], sorted(emb["rows"]))
            self.assertGreater(emb["bytes"][-1], 8 * 4 * emb["rows"][-1])
            # rates: what the worker sent, about 20 steps a second (the machine may be slower)
            peak_push = max(v for v in emb["rows_pushed_per_second"] if v is not None)
            self.assertGreater(peak_push, 64 * 3)
            self.assertLessEqual(peak_push, 64 * 21 * 1.5)
            peak_pull = max(v for v in emb["rows_pulled_per_second"] if v is not None)
            self.assertAlmostEqual(peak_pull / peak_push, 2.0, delta=0.6)
            # over the run the rates add up to what was sent (each point a second's mean)
            self.assertAlmostEqual(sum(v for v in emb["rows_pushed_per_second"] if v is not None),
                                   sent["pushed"], delta=sent["pushed"] * 0.35)
            self.assertEqual(set(idle["rows"]), {0})
            self.assertEqual(set(idle["rows_pushed_per_second"]), {0})
            r = harness.psctl(psd.addr, "history", "--csv")
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = [l for l in r.stdout.splitlines() if l.startswith("table,emb,") and ",rows," in l]
            self.assertGreaterEqual(len(rows), 3)
            w.close()

    @unittest.skipUnless(HAVE_BROWSER, "chromium or python3-websocket missing (scripts/setup.sh installs both)")
    def test_replicas_in_browser(self):
        """A leader and its follower, each with its page: the leader's shows
        its part's replicas (itself, and the follower in sync, 0 bytes and 0
        versions behind), the follower's its leader and its lag; the JSON
        and psctl status say the same."""
        with Cluster("psd-dashboard-replicas") as cl:
            web = ["--set", "web_root=" + ARGS.web_root] if ARGS.web_root else []
            leader = cl.psd(mode="asgd", workers=1, name="leader",
                            args=["--set", "metrics_listen=127.0.0.1:0"] + web)
            w = harness.RawClient(leader.addr, 10)
            r = w.hello_worker([["w", [4]]], 0, 1)
            self.assertEqual(r.get("t"), harness.T_WELCOME, r)
            w.request({"t": harness.T_INIT, "off": 0, "data": struct.pack("<4f", 1, 2, 3, 4)})
            follower = cl.psd(mode="asgd", workers=1, name="follower",
                              args=["--set", "metrics_listen=127.0.0.1:0", "--replica-of", leader.addr] + web)
            harness.wait_until(lambda: harness.status(leader.addr)["replication"]["insync"] == 1, 60,
                               "the follower in sync")
            for v in range(5):  # pushes the follower gets as it goes
                r = w.request({"t": harness.T_PUSH, "off": 0, "base": v, "data": struct.pack("<4f", 1, 1, 1, 1)})
                self.assertEqual(r.get("t"), harness.T_OK, r)
            w.close()

            def in_sync():
                st = harness.status(leader.addr)["replication"]
                fl = harness.status(follower.addr)["replication"]
                return st["insync"] == 1 and st["followers"][0]["lag_bytes"] == 0 and fl["lag_bytes"] == 0 and st
            st = harness.wait_until(in_sync, 60, "the follower to apply the whole log")
            self.assertEqual(st["followers"][0]["lag_versions"], 0, st)
            text = harness.psctl(leader.addr, "status").stdout
            self.assertIn("follower %s: in sync, 0 bytes behind (0 versions at most)" % follower.addr, text)
            r = harness.psctl(leader.addr, "metrics")
            self.assertEqual(r.returncode, 0, r.stderr)
            for fam, v in (("insync", 1), ("lag_bytes", 0), ("lag_versions", 0)):
                self.assertIn('psd_replication_follower_%s{follower="%s"} %d\n' % (fam, follower.addr, v), r.stdout)
            harness.promtool_check(self, r.stdout)

            def page(p):
                return "http://" + harness.status(p.addr)["metrics_listen"]
            code, _, body = http_get(page(leader) + "/api/job")
            self.assertEqual(code, 200)
            rep = json.loads(body)["replication"]
            self.assertEqual((rep["role"], rep["insync"], rep["followers"][0]["addr"]), ("leader", 1, follower.addr))
            code, _, body = http_get(page(follower) + "/api/job")
            rep = json.loads(body)["replication"]
            self.assertEqual((rep["role"], rep["leader"], rep["lag_bytes"]), ("follower", leader.addr, 0))
            rows = """(() => { const s = document.getElementById('replicas-section');
              const r = [...document.querySelectorAll('#replicas tbody tr')].map(tr =>
                [...tr.children].map(td => td.textContent));
              return !s.hidden && r.length === 2 && r[1][2] !== '' &&
                {rows: r, summary: document.getElementById('replicas-summary').textContent}; })()"""
            with browser.Browser(cl.dir) as b:
                b.navigate(page(leader) + "/")
                got = b.wait_for(rows, 30, "the leader's replicas")
                self.assertEqual(got["rows"][0][:2], ["this psd", "leader"])
                self.assertEqual(got["rows"][1][:5], [follower.addr, "follower", "yes", "0", "≤ 0"])
                self.assertIn("1 of 1 followers in sync", got["summary"])
                b.navigate(page(follower) + "/")
                got = b.wait_for(rows, 30, "the follower's replicas")
                self.assertEqual(got["rows"][0][:4], ["this psd", "follower", "–", "0"])
                self.assertEqual(got["rows"][1][:2], [leader.addr, "leader"])
                self.assertIn("this psd follows %s" % leader.addr, got["summary"])
                b.call("Runtime.evaluate", expression="0")
                self.assertEqual(b.errors, [], "the page met errors")

    @unittest.skipUnless(HAVE_BROWSER, "chromium or python3-websocket missing (scripts/setup.sh installs both)")
    def test_parts_in_browser(self):
        """A job's table grown from 2 parts to 3 (psctl parts add): the added
        part's page shows the part map and the move that brought its rows
        (rows taken, both sources handed over); its JSON says the same."""
        with Cluster("psd-dashboard-parts") as cl:
            web = ["--set", "web_root=" + ARGS.web_root] if ARGS.web_root else []
            parts = [cl.psd(mode="asgd", workers=1, name="p%d" % i,
                            args=["--set", "metrics_listen=127.0.0.1:0"] + web) for i in range(3)]
            keys = np.arange(2000, dtype="<u8")
            for i in range(2):  # a table with its rows on the first two parts
                w = harness.RawClient(parts[i].addr, 10)
                r = w.hello_worker([["w", [4]]], 0, 1)
                self.assertEqual(r.get("t"), harness.T_WELCOME, r)
                w.request({"t": harness.T_INIT, "off": 0, "data": struct.pack("<4f", 1, 2, 3, 4)})
                r = w.request({"t": harness.T_TABLE, "tab": "emb", "dim": 4, "rinit": "zeros", "opt": "sgd",
                               "hp": {"lr": 0.1}, "part": [i, 2]})
                self.assertEqual(r.get("t"), harness.T_OK, r)
                mine = np.array([k for k in keys.tolist() if harness.part_of(k, 2) == i], "<u8")
                r = w.request({"t": harness.T_TPUSH, "tab": "emb", "keys": mine.tobytes(), "base": 0,
                               "data": np.ones((mine.size, 4), "<f4").tobytes()})
                self.assertEqual(r.get("t"), harness.T_OK, r)
                w.close()
            r = harness.psctl(",".join(p.addr for p in parts[:2]), "parts", "add", parts[2].addr)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            taken = sum(1 for k in keys.tolist() if harness.part_of(k, 3) == 2)
            url = "http://" + harness.status(parts[2].addr)["metrics_listen"]
            code, _, body = http_get(url + "/api/job")
            self.assertEqual(code, 200)
            pm = json.loads(body)["parts"]
            self.assertEqual((pm["epoch"], pm["self"], pm["dense"], pm["moving"]), (1, 2, 2, False), pm)
            self.assertEqual((pm["move"]["rows_taken"], pm["move"]["handed"], pm["move"]["sources"]), (taken, 2, 2))
            shown = """(() => { const s = document.getElementById('parts-section');
              return !s.hidden && document.getElementById('parts-summary').textContent; })()"""
            with browser.Browser(cl.dir) as b:
                b.navigate(url + "/")
                text = b.wait_for(shown, 30, "the added part's Parts section")
                self.assertIn("part map 1: this psd is part 2 of 3 (the dense model on the first 2)", text)
                self.assertIn("the last move, to map 1 (2 parts to 3", text)
                self.assertIn("rows given 0, taken %s" % format(taken, ","), text)
                self.assertIn("2 of 2 sources handed over", text)
                b.call("Runtime.evaluate", expression="0")
                self.assertEqual(b.errors, [], "the page met errors")


def extra_args(p):
    p.add_argument("--web-root", help="the dashboard's files (default: psd's own, ../share/psd/web from it)")
    p.add_argument("--out", required=True, help="where to save the screenshot")


if __name__ == "__main__":
    ARGS = harness.parse_args(extra_args)
    harness.main()
