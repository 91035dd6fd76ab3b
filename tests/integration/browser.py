"""browser.py - headless Chromium driven over the DevTools protocol, for the
tests that look at psd's dashboard as a person would.

Chromium (Debian package chromium) starts with a new, empty profile in a
directory the caller gives (the test's own), no network services of its own
(no sync, component updates, QUIC or background fetches) and a DevTools
port that it picks itself and writes to DevToolsActivePort in the profile.
The protocol runs over a websocket (Debian package python3-websocket):
the test evaluates JavaScript in the page to read the DOM, collects console
messages, exceptions and log entries (errors the page met), records every
URL the page requested, and takes screenshots. Every wait has a deadline.
"""

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request

import websocket

from suite import wait_until

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def chromium_path():
    """The chromium to run ($PSD_CHROMIUM, or chromium on PATH), or None."""
    return os.environ.get("PSD_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


# What chromium answers an evaluation that a navigation cut short (the page
# it ran in went away): the next page is on its way, not an error of the page.
NAVIGATED = ("Inspected target navigated or closed", "Execution context was destroyed",
             "Cannot find context with specified id")


class Navigated(AssertionError):
    """An evaluation cut short by a navigation (NAVIGATED)."""


class Browser:
    def __init__(self, workdir, width=1400, height=1900, start_timeout=30):
        self.profile = os.path.join(workdir, "chromium-profile")
        os.makedirs(self.profile)
        self.log_path = os.path.join(workdir, "chromium.log")
        self._log = open(self.log_path, "w")
        argv = [chromium_path()] + FLAGS + ["--user-data-dir=" + self.profile, "--remote-debugging-port=0",
                                            "--remote-debugging-address=127.0.0.1",
                                            "--window-size=%d,%d" % (width, height), "about:blank"]
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        self.ws = None
        self.next_id = 0
        self.errors = []     # console errors, exceptions, error log entries
        self.requests = []   # URLs the page asked for
        try:
            port = self._wait(self._port, start_timeout, "chromium to open its DevTools port")
            with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10) as r:
                targets = json.load(r)
            page = [t for t in targets if t.get("type") == "page"][0]
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=10, suppress_origin=True)
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(domain + ".enable")
        except Exception:
            self.close()
            raise

    def _wait(self, pred, timeout, what):
        return wait_until(pred, timeout, what, interval=0.05)

    def _port(self):
        if self.p.poll() is not None:
            with open(self.log_path, errors="replace") as f:
                raise AssertionError("chromium exited with %s:\n%s" % (self.p.returncode, f.read()[-3000:]))
        try:
            with open(os.path.join(self.profile, "DevToolsActivePort")) as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return None
        return int(lines[0]) if len(lines) >= 2 and lines[0].isdigit() else None

    def _event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console.%s: %s" % (params["type"], " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args", []))))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.errors.append("exception: %s %s" % (d.get("text", ""), d.get("exception", {}).get("description", "")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            e = params["entry"]
            self.errors.append("log (%s): %s %s" % (e.get("source"), e.get("text"), e.get("url", "")))
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))

    def call(self, method, timeout=30, **params):
        """Sends one command and returns its result; events that arrive
        meanwhile are recorded."""
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no answer from chromium to %s within %.0f s" % (method, timeout))
            self.ws.settimeout(left)
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    cut = any(m in str(msg["error"].get("message", "")) for m in NAVIGATED)
                    raise (Navigated if cut else AssertionError)("%s failed: %s" % (method, msg["error"]))
                return msg.get("result", {})
            self._event(msg)

    def navigate(self, url, timeout=30, lands=None):
        """Opens url and waits until the document at lands (default: url;
        another after a redirect) has loaded."""
        lands = lands or url
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href === %s" % json.dumps(lands), timeout,
                      "the page %s to load" % lands)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (JSON-able)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            cut = any(m in json.dumps(r["exceptionDetails"]) for m in NAVIGATED)
            raise (Navigated if cut else AssertionError)("evaluating %s: %s" % (expression, r["exceptionDetails"]))
        return r.get("result", {}).get("value")

    def wait_for(self, expression, timeout, what):
        """Polls a JavaScript expression until it is truthy; returns it. An
        evaluation that a navigation cuts short (a form submitted, a
        redirect) is polled again in the next page."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
                if last:
                    return last
                # let events arrive meanwhile
                self.call("Runtime.evaluate", expression="0")
            except Navigated as e:
                last = "(%s)" % e
            time.sleep(0.1)
        raise AssertionError("timed out after %.0f s waiting for %s (last value %r)" % (timeout, what, last))

    def screenshot(self, path, scale=1.0):
        """Saves a PNG of the whole page to path, its pixels scaled by
        scale; returns its size in bytes."""
        w, h = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        r = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                      clip={"x": 0, "y": 0, "width": w, "height": h, "scale": scale})
        data = base64.b64decode(r["data"])
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def close(self):
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
