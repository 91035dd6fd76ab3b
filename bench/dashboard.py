#!/usr/bin/python3
"""dashboard.py - psd's dashboard: what an open page costs the training,
and a screenshot of the page during a real run (a benchmark; it prints
figures and asserts nothing).

    bench/dashboard.py cost [--epochs N] [--phase P] [--out DIR]
    bench/dashboard.py shot [--png PATH]
                 [--psd PATH --psworker PATH --psctl PATH --data DIR --web-root DIR]

cost: W1 (mlp:256,128, batch 64, the recommended settings of docs/settings.md) with 2
ASGD workers on MNIST for N epochs (default 60) in one run, while headless
Chromium on this machine alternates every P epochs (default 6) of worker 0
between the dashboard (open and refreshing: /api/job every second,
/api/history every two) and about:blank. The first epoch after each switch
is left out. It prints worker 0's seconds per epoch in each phase, the mean
and spread with the page open and closed, psd's CPU time per epoch in
each, and how many /api requests the page made. Note that Chromium itself
(rendering the charts) runs on the same cores as psd and the workers.

shot: W2 (the CNN, 6 epochs, recommended settings) with 2 ASGD workers,
psd writing a checkpoint every 5 s; the page is opened at the start and a
screenshot saved (default bench/out/dashboard.png, scaled to 0.7) once the
model is four fifths through the run.

psd serves the page from its own ../share/psd/web unless --web-root DIR.
"""

import os
import statistics
import time
import urllib.request

import benchlib
import browser  # tests/integration's, on the path benchlib sets
from benchlib import cpu_seconds, harness

HERE = os.path.dirname(os.path.abspath(__file__))

TRAIN_N = 60000


def psd_args(web_root, batch, lr, epochs):
    versions = epochs * -(-TRAIN_N // batch)
    return ["--set", "optimizer=adam", "--set", "lr=%g" % lr, "--set", "lr_schedule=cosine",
            "--set", "lr_decay_versions=%d" % versions, "--set", "metrics_listen=127.0.0.1:0"] + \
        (["--set", "web_root=" + os.path.abspath(web_root)] if web_root else [])


def dashboard_url(psd):
    return "http://" + harness.status(psd.addr)["metrics_listen"] + "/"


def epoch_records(w):
    return benchlib.json_lines(w.stdout(), '{"epoch"')


def tree_cpu(root):
    """CPU seconds of a process and all its descendants (Chromium's
    renderer, GPU and utility processes)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    total, todo = 0.0, [root]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
        except (OSError, IndexError, ValueError):
            pass
        todo += [c for c, pp in parent.items() if pp == p]
    return total


def cost(a):
    with harness.Cluster("bench-dashboard") as cl:
        psd = cl.psd(mode="asgd", workers=2, args=psd_args(a.web_root, 64, 2e-3, a.epochs))
        url = dashboard_url(psd)
        with browser.Browser(cl.dir) as b:
            b.navigate("about:blank")
            ws = [cl.worker(psd, k, 2, epochs=a.epochs, batch=64, limit=0, test_limit=0, model="mlp:256,128",
                            evaluate=False, args=["--epoch-json", "--quiet", "--pipeline", "off"])
                  for k in range(2)]
            page_open = False
            state = {}          # epoch -> page open during it
            skip = {1}          # epochs left out: the first, and the first after each switch
            cpu_at = {0: cpu_seconds(psd.pid)}
            chrome_at = {0: (time.monotonic(), tree_cpu(b.p.pid))}
            api = {True: 0, False: 0}
            seen = 0
            while True:
                recs = epoch_records(ws[0])
                for r in recs[seen:]:
                    e = r["epoch"]
                    state[e] = page_open
                    cpu_at[e] = cpu_seconds(psd.pid)
                    chrome_at[e] = (time.monotonic(), tree_cpu(b.p.pid))
                    if e % a.phase == 0 and e < a.epochs:
                        before = len(b.requests)
                        b.call("Runtime.evaluate", expression="0")  # collect the page's requests so far
                        api[page_open] += sum(1 for u in b.requests[before:] if "/api/" in u)
                        page_open = not page_open
                        b.navigate(url if page_open else "about:blank")
                        skip.add(e + 1)
                seen = len(recs)
                if seen >= a.epochs or ws[0].p.poll() is not None:
                    break
                time.sleep(0.05)
            b.call("Runtime.evaluate", expression="0")
            api_total = sum(1 for u in b.requests if "/api/" in u)
        for w in ws:
            rc, summary = w.result(600)
            if rc != 0:
                raise SystemExit("dashboard: %s failed:\n%s" % (w.name, harness.tail(w.err_path)))
        # what one request of the page costs psd, on this run's whole history
        per_req = {}
        for path in ("api/job", "api/history"):
            n, size = 200, 0
            c0 = cpu_seconds(psd.pid)
            for _ in range(n):
                with urllib.request.urlopen(url + path, timeout=10) as r:
                    size = len(r.read())
            per_req[path] = ((cpu_seconds(psd.pid) - c0) / n, size)
        psd.stop()
        recs = {r["epoch"]: r for r in epoch_records(ws[0])}
    print("W1, 2 ASGD workers, %d epochs; the page switches every %d epochs of worker 0" % (a.epochs, a.phase))
    print("%-6s %-6s %9s %12s" % ("epoch", "page", "s/epoch", "psd CPU s"))
    by = {True: [], False: []}
    cpu = {True: [], False: []}
    for e in sorted(recs):
        r = recs[e]
        pcpu = cpu_at.get(e, 0) - cpu_at.get(e - 1, 0) if e in cpu_at and e - 1 in cpu_at else float("nan")
        left_out = e in skip
        print("%-6d %-6s %9.3f %12.3f%s" % (e, "open" if state.get(e) else "closed", r["epoch_seconds"], pcpu,
                                           "  (left out: switch)" if left_out else ""))
        if not left_out and e in state:
            by[state[e]].append(r["epoch_seconds"])
            cpu[state[e]].append(pcpu)
    for st in (False, True):
        v = by[st]
        if len(v) >= 2:
            q = statistics.quantiles(v, n=4)
            print("page %-6s: %2d epochs, s/epoch mean %.3f, median %.3f, lower quartile %.3f, sd %.3f, %.3f-%.3f; "
                  "psd CPU %.3f s/epoch" % ("open" if st else "closed", len(v), statistics.mean(v),
                                             statistics.median(v), q[0], statistics.stdev(v), min(v), max(v),
                                             statistics.mean(cpu[st])))
    if len(by[True]) >= 2 and len(by[False]) >= 2:
        d = statistics.mean(by[True]) / statistics.mean(by[False]) - 1
        print("open vs closed: %+.1f%% seconds per epoch (medians %+.1f%%, lower quartiles %+.1f%%); psd CPU %+.1f%%"
              % (100 * d, 100 * (statistics.median(by[True]) / statistics.median(by[False]) - 1),
                 100 * (statistics.quantiles(by[True], n=4)[0] / statistics.quantiles(by[False], n=4)[0] - 1),
                 100 * (statistics.mean(cpu[True]) / statistics.mean(cpu[False]) - 1)))
    print("requests to /api/ while open: %d in all" % api_total)
    for st in (False, True):
        # Chromium's CPU over the epochs of each state, as a share of one core
        es = [e for e in state if state[e] == st and e - 1 in chrome_at and e in chrome_at]
        wall = sum(chrome_at[e][0] - chrome_at[e - 1][0] for e in es)
        c = sum(chrome_at[e][1] - chrome_at[e - 1][1] for e in es)
        if wall > 0:
            print("Chromium with the page %s: %.1f%% of a core" % ("open" if st else "closed", 100 * c / wall))
    for path, (c, size) in per_req.items():
        print("GET /%s after the run: %d bytes, %.3f ms of psd's CPU each (200 requests)" % (path, size, 1e3 * c))


def shot(a):
    epochs = 6
    with harness.Cluster("bench-dashboard-shot") as cl:
        args = psd_args(a.web_root, 64, 2e-3, epochs) + ["--set", "checkpoint_interval=5s", "--state-dir",
                                                          os.path.join(cl.dir, "state")]
        os.makedirs(os.path.join(cl.dir, "state"))
        psd = cl.psd(mode="asgd", workers=2, args=args)
        url = dashboard_url(psd)
        with browser.Browser(cl.dir, width=1400, height=1800) as b:
            b.navigate(url)
            ws = [cl.worker(psd, k, 2, epochs=epochs, batch=64, limit=0, test_limit=0, model="cnn",
                            args=["--pipeline", "off"]) for k in range(2)]
            total = 2 * epochs * -(-TRAIN_N // 2 // 64)
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 0.8 * total, 900,
                               "four fifths of the run", interval=0.5)
            time.sleep(2.5)  # the page's next history refresh
            size = b.screenshot(a.png, scale=0.7)
            print("screenshot: %s (%d bytes); page errors: %s" % (a.png, size, b.errors or "none"))
        for w in ws:
            rc, summary = w.result(900)
            print("%s: exit %d, test accuracy %s" % (w.name, rc, summary and summary.get("test_accuracy")))
        psd.stop()


def main():
    def options(ap):
        ap.add_argument("what", choices=["cost", "shot"])
        ap.add_argument("--epochs", type=int, default=60)
        ap.add_argument("--phase", type=int, default=6)
        ap.add_argument("--png", default=os.path.join(HERE, "out", "dashboard.png"))
        ap.add_argument("--web-root", help="the page's files (default: psd's own)")

    a = harness.parse_args(options, program_doc=__doc__)
    os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
    if a.what == "cost":
        cost(a)
    else:
        shot(a)


if __name__ == "__main__":
    main()
