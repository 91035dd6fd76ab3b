#!/usr/bin/python3
"""catchup.py - a follower that joins a job holding a big table catches up
while the workers train, and what that costs the leader's pulls (issue 43).

    bench/catchup.py [--table-gb 1.0] [--dim 16] [--keys 4096] [--after 5]
                     [--psd build/server/psd] [--json FILE] [--workdir DIR]

1. A leader psd (asgd; replication = sync, the default once a follower
   is in sync) and two worker processes (psd.Client, shards 0/2 and 1/2).
   Each worker fills its half of the key space with rows (pushing a key's
   gradient makes its row), until the table holds --table-gb GiB by psd's own count
   (its status' table bytes: rows and their AdaGrad state).
2. The workers then train: each step pushes the row gradients of --keys
   random keys and pulls the rows of --keys others, and times the pull.
3. After --after seconds of that (the "before" window), a follower starts
   (`psd --replica-of LEADER`): it asks for a snapshot, the leader writes
   one from its loop a block of rows at a time (an older psd, given with
   --psd, forks its checkpoint writer), the follower loads it and fetches
   the log's tail while the workers go on. "During" lasts until the
   leader counts it in sync; "after" is --after seconds more.
4. The figures: the pulls' p50, p99 and max in each window (the leader's
   pull latency as a worker sees it, through the Python package), the
   pushes' p50 and p99 (a sync push waits for the follower once it is in
   sync), the steps per second, the time from the follower's start to its
   snapshot loaded and to in sync, and the peak RSS of both psd. One JSON
   line and a table. Issue 43's target: the pull p99 during catch-up
   under 20 ms.

Nothing is downloaded; the keys are drawn from a seeded generator.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, sys, time
import numpy as np
import psd

addr, k, rows_each, dim, nkeys, out, stop = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                             int(sys.argv[5]), sys.argv[6], sys.argv[7])
c = psd.Client([("b", (1,))], server=addr, shard="%d/2" % k, connect_s=30, timeout_ms=120000)
c.connect()
c.table("emb", dim, init="normal", scale=0.01, seed=3, opt="adagrad", lr=0.05)
lo = k * rows_each
chunk = 65536
zero = np.zeros((chunk, dim), dtype=np.float32)
for a in range(lo, lo + rows_each, chunk):  # filling: a push makes the rows (a pull alone does not keep them)
    ks = np.arange(a, min(a + chunk, lo + rows_each), dtype=np.uint64)
    c.push_rows("emb", ks, zero[:len(ks)])
open(out + ".filled", "w").close()
rng = np.random.default_rng(100 + k)
g = np.full((nkeys, dim), 1e-3, dtype=np.float32)
n = 2 * rows_each
with open(out, "w") as f:
    while not __import__("os").path.exists(stop):
        kp = rng.integers(0, n, nkeys, dtype=np.uint64)
        t0 = time.time()
        c.push_rows("emb", kp, g)
        t1 = time.time()
        c.pull_rows("emb", rng.integers(0, n, nkeys, dtype=np.uint64))
        t2 = time.time()
        f.write("%.6f %.6f %.6f\n" % (t0, t1 - t0, t2 - t1))
c.close()
"""


def harness():
    """The tests' harness (psd's status, the polling wait), imported when
    first needed: it needs msgpack, which --help does not."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import harness as h
    return h


def status(addr):
    return harness().status(addr)


def start_psd(psd_bin, d, name, extra=()):
    port_file = os.path.join(d, name + ".port")
    if os.path.exists(port_file):
        os.unlink(port_file)  # an earlier run's (--workdir)
    argv = [psd_bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--mode", "asgd", "--workers", "2",
            "--set", "checkpoint_interval=0", "--set", "max_table_memory=64GiB", "--log-level", "info"] + list(extra)
    err = open(os.path.join(d, name + ".err"), "wb")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        if os.path.exists(port_file):
            text = open(port_file).read()
            if text.endswith("\n"):
                return p, "127.0.0.1:%d" % int(text)
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit("catchup: %s did not start:\n%s" % (name, open(os.path.join(d, name + ".err")).read()))
        time.sleep(0.01)


def wait(cond, timeout, what):
    """The suite's wait_until, ending the bench with its message."""
    return harness().wait_until(cond, timeout, what, error=lambda m: SystemExit("catchup: " + m))


def peak_rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return None


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def window(samples, lo, hi):
    """pull and push figures (ms) of the steps that began in [lo, hi)."""
    s = [x for x in samples if lo <= x[0] < hi]
    pulls, pushes = [x[2] * 1e3 for x in s], [x[1] * 1e3 for x in s]
    r = dict(steps=len(s), seconds=round(hi - lo, 2), steps_per_second=round(len(s) / (hi - lo), 1) if hi > lo else 0)
    for name, xs in (("pull", pulls), ("push", pushes)):
        r[name + "_p50_ms"] = round(pct(xs, 0.5), 2) if xs else None
        r[name + "_p99_ms"] = round(pct(xs, 0.99), 2) if xs else None
        r[name + "_max_ms"] = round(max(xs), 2) if xs else None
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table-gb", type=float, default=1.0, help="GiB the table holds before the follower joins")
    ap.add_argument("--dim", type=int, default=16, help="the rows' floats")
    ap.add_argument("--keys", type=int, default=4096, help="keys a worker pushes and pulls a step")
    ap.add_argument("--after", type=float, default=5.0, help="seconds of training before and after the catch-up")
    ap.add_argument("--psd", default=os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd")))
    ap.add_argument("--workdir", help="keep the logs here")
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args()
    d = a.workdir or tempfile.mkdtemp(prefix="psd-catchup-")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    procs = []
    try:
        leader, laddr = start_psd(a.psd, d, "leader")
        procs.append(leader)
        # bytes a row takes by psd's count: its values and AdaGrad's state, and
        # 20 more (148 at dim 16, measured)
        row_bytes = 2 * a.dim * 4 + 20
        rows_each = int(a.table_gb * (1 << 30) / row_bytes / 2)
        stop = os.path.join(d, "stop")
        outs = [os.path.join(d, "worker%d.txt" % k) for k in range(2)]
        for f in outs + [stop] + [o + ".filled" for o in outs]:
            if os.path.exists(f):
                os.unlink(f)
        t_fill = time.time()
        ws = [subprocess.Popen([sys.executable, "-c", WORKER, laddr, str(k), str(rows_each), str(a.dim),
                                str(a.keys), outs[k], stop], env=env, stdin=subprocess.DEVNULL,
                               stderr=open(os.path.join(d, "worker%d.err" % k), "wb"))
              for k in range(2)]
        procs += ws
        wait(lambda: all(os.path.exists(o + ".filled") for o in outs) or any(w.poll() is not None for w in ws),
             1800, "the workers to fill the table")
        if any(w.poll() is not None for w in ws):
            sys.exit("catchup: a worker ended:\n" + open(os.path.join(d, "worker0.err")).read()[-2000:])
        tab = status(laddr)["tables"][0]
        print("catchup: table filled in %.1f s: %d rows, %.2f GiB by psd's count" %
              (time.time() - t_fill, tab["rows"], tab["bytes"] / (1 << 30)), flush=True)
        time.sleep(a.after)  # the window before: the workers train
        t_join = time.time()
        follower, faddr = start_psd(a.psd, d, "follower", ("--replica-of", laddr))
        procs.append(follower)

        def ferr():
            return open(os.path.join(d, "follower.err")).read()
        wait(lambda: "snapshot loaded" in ferr() or follower.poll() is not None, 1800, "the follower's snapshot")
        t_loaded = time.time()
        wait(lambda: status(laddr)["replication"]["insync"] >= 1 or follower.poll() is not None, 600,
             "the follower in sync")
        t_sync = time.time()
        if follower.poll() is not None:
            sys.exit("catchup: the follower ended:\n" + ferr()[-2000:])
        time.sleep(a.after)  # the window after
        t_end = time.time()
        rss = {"leader_peak_rss_mib": peak_rss_mib(leader.pid), "follower_peak_rss_mib": peak_rss_mib(follower.pid)}
        open(stop, "w").close()
        for w in ws:
            w.wait(timeout=120)
        samples = []
        for o in outs:
            with open(o) as f:
                samples += [tuple(float(x) for x in line.split()) for line in f if line.count(" ") == 2]
        r = {"table_rows": tab["rows"], "table_gib": round(tab["bytes"] / (1 << 30), 3), "keys": a.keys,
             "dim": a.dim, "snapshot_loaded_s": round(t_loaded - t_join, 2), "in_sync_s": round(t_sync - t_join, 2),
             "before": window(samples, t_join - a.after, t_join), "during": window(samples, t_join, t_sync),
             "after": window(samples, t_sync, t_end), "load": open("/proc/loadavg").read().split()[:3]}
        r.update(rss)
        print(json.dumps(r), flush=True)
        print("\n| window | steps/s | pull p50 ms | pull p99 ms | pull max ms | push p50 ms | push p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for wname in ("before", "during", "after"):
            x = r[wname]
            print("| %s (%.1f s) | %s | %s | %s | %s | %s | %s |" % (wname, x["seconds"], x["steps_per_second"],
                  x["pull_p50_ms"], x["pull_p99_ms"], x["pull_max_ms"], x["push_p50_ms"], x["push_p99_ms"]))
        print("\nfollower: snapshot loaded %.1f s after it started, in sync after %.1f s; peak RSS leader %s MiB, "
              "follower %s MiB" % (r["snapshot_loaded_s"], r["in_sync_s"], rss["leader_peak_rss_mib"],
                                   rss["follower_peak_rss_mib"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        if not a.workdir:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
