#!/usr/bin/python3
"""parts_move.py - a running job's table grown from 2 psd parts to 3 and 4
and shrunk back to 2 while two workers train (issue 45): what each move
moves, how long it takes, and how long the workers' steps stall.

    bench/parts_move.py [--rows 10000000] [--dim 16] [--keys 4096]
                        [--rate 256M] [--after 3] [--followers]
                        [--psd build/server/psd] [--json FILE] [--workdir DIR]

1. Two psd parts (asgd, AdaGrad tables) and two worker processes
   (psd.Client over both parts, shards 0/2 and 1/2). The workers fill the
   table with --rows rows (keys 0..rows-1; a push makes a row).
2. The workers then train: each step pushes the row gradients of --keys
   random keys and pulls the rows of --keys others; every step's start and
   length are kept.
3. After --after seconds, `psctl parts add` a third psd, then a fourth,
   then `parts remove` twice, --after seconds apart, at --rate bytes a
   second.
4. For each move: its seconds (psctl's run), the rows whose part changed
   against the rows the table held (about 1/(n+1) growing to n+1 parts),
   the rows and bytes the sources gave (their status: the pass and the
   rows pushed again after they were given), the longest
   handover a destination saw (the moving keys' wait), and the workers'
   steps: median before, longest during the move (the longest pause of
   pushes). One JSON line and a table. Issue 45's target: the longest pause
   at a switch at most 1 s on a table of 10^7 rows.

With --followers each part has a follower (replication = sync, the
default), started before the table is filled: the moves go through the
replication log too (PROTOCOL.md 17, record M), and a source answers a
move's fetch only once its follower holds what came before.

Nothing is downloaded; the keys are drawn from a seeded generator.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catchup  # noqa: E402  (its psd starter, status and waits)

WORKER = r"""
import os, sys, time
import numpy as np
import psd

addrs, k, rows, dim, nkeys, out, stop = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                         int(sys.argv[5]), sys.argv[6], sys.argv[7])
c = psd.Client([("b", (2048,))], server=addrs, shard="%d/2" % k, connect_s=30, timeout_ms=120000)
c.connect()
c.table("emb", dim, init="normal", scale=0.01, seed=3, opt="adagrad", lr=0.05)
half = rows // 2
lo, hi = k * half, rows if k == 1 else half
chunk = 1 << 17
zero = np.zeros((chunk, dim), dtype=np.float32)
for a in range(lo, hi, chunk):
    ks = np.arange(a, min(a + chunk, hi), dtype=np.uint64)
    c.push_rows("emb", ks, zero[:len(ks)])
open(out + ".filled", "w").close()
rng = np.random.default_rng(100 + k)
g = np.full((nkeys, dim), 1e-3, dtype=np.float32)
with open(out, "w") as f:
    while not os.path.exists(stop):
        t0 = time.time()
        kp = np.unique(rng.integers(0, rows, nkeys, dtype=np.uint64))
        c.push_rows("emb", kp, g[:len(kp)])
        c.pull_rows("emb", rng.integers(0, rows, nkeys, dtype=np.uint64))
        f.write("%.6f %.6f\n" % (t0, time.time() - t0))
        f.flush()
c.close()
"""


def steps(outs):
    s = []
    for o in outs:
        with open(o) as f:
            for line in f:
                p = line.split()
                if len(p) == 2:
                    s.append((float(p[0]), float(p[1])))
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows the table holds before the moves")
    ap.add_argument("--dim", type=int, default=16, help="the rows' floats")
    ap.add_argument("--keys", type=int, default=4096, help="keys a worker pushes and pulls a step")
    ap.add_argument("--rate", default="256M", help="psctl parts' RATE (bytes a second)")
    ap.add_argument("--after", type=float, default=3.0, help="seconds of training between moves")
    ap.add_argument("--psd", default=os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd")))
    ap.add_argument("--psctl", default=os.environ.get("PSCTL_BIN", os.path.join(ROOT, "build", "psctl", "psctl")))
    ap.add_argument("--followers", action="store_true", help="a follower for each part")
    ap.add_argument("--workdir", help="keep the logs here")
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args()
    d = a.workdir or tempfile.mkdtemp(prefix="psd-parts-move-")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                                       os.environ.get("PYTHONPATH", "")]))
    procs, addrs = [], []
    try:
        for i in range(4):
            p, addr = catchup.start_psd(a.psd, d, "part%d" % i)
            procs.append(p)
            addrs.append(addr)
            if a.followers:
                procs.append(catchup.start_psd(a.psd, d, "part%df" % i, ["--replica-of", addr])[0])
        stop = os.path.join(d, "stop")
        outs = [os.path.join(d, "worker%d.txt" % k) for k in range(2)]
        for f in outs + [stop] + [o + ".filled" for o in outs]:
            if os.path.exists(f):
                os.unlink(f)
        t_fill = time.time()
        ws = [subprocess.Popen([sys.executable, "-c", WORKER, ",".join(addrs[:2]), str(k), str(a.rows), str(a.dim),
                                str(a.keys), outs[k], stop], env=env, stdin=subprocess.DEVNULL,
                               stderr=open(os.path.join(d, "worker%d.err" % k), "wb"))
              for k in range(2)]
        procs += ws
        catchup.wait(lambda: all(os.path.exists(o + ".filled") for o in outs) or any(w.poll() is not None for w in ws),
                     1800, "the workers to fill the table")
        if any(w.poll() is not None for w in ws):
            sys.exit("parts_move: a worker ended:\n" + open(os.path.join(d, "worker0.err")).read()[-2000:])
        print("parts_move: %d rows filled in %.1f s" % (a.rows, time.time() - t_fill), flush=True)
        moves = []
        plan = [("add", 2, 3), ("add", 3, 4), ("remove", 4, 3), ("remove", 3, 2)]
        for verb, n, m in plan:
            time.sleep(a.after)
            held = [catchup.status(x)["tables"] for x in addrs[:n]]
            rows = sum(t[0]["rows"] for t in held if t)
            tbytes = sum(t[0]["bytes"] for t in held if t)
            gone = held[n - 1][0]["rows"] if verb == "remove" else 0
            argv = [a.psctl, "--server", ",".join(addrs[:n]), "--timeout", "60000", "parts", verb]
            argv += [addrs[n]] if verb == "add" else []
            t0 = time.time()
            r = subprocess.run(argv + [a.rate], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=3600)
            t1 = time.time()
            if r.returncode != 0:
                sys.exit("parts_move: psctl parts %s failed:\n%s%s" % (verb, r.stdout, r.stderr))
            sts = [catchup.status(x)["parts"]["move"] for x in addrs[:max(n, m)]]
            given = sum(s["rows_given"] for s in sts)
            # the rows whose part changed: those the part added holds, or
            # those the part removed held
            changed = catchup.status(addrs[n])["tables"][0]["rows"] if verb == "add" else gone
            bgiven = sum(s["bytes_given"] for s in sts)
            hand = max(s["handover_ms_max"] for s in sts)
            s = steps(outs)
            before = sorted(x[1] for x in s if t0 - a.after <= x[0] < t0)
            during = [x[1] for x in s if t0 <= x[0] < t1]
            mv = dict(move="%d->%d" % (n, m), seconds=round(t1 - t0, 2), rows=rows, rows_changed_part=changed,
                      fraction=round(changed / rows, 4) if rows else None, rows_given=given,
                      table_bytes=tbytes, bytes_moved=bgiven,
                      bytes_per_changed_row=round(bgiven / changed, 1) if changed else None,
                      handover_ms=hand, step_p50_before_ms=round(1e3 * before[len(before) // 2], 1) if before else None,
                      step_max_during_ms=round(1e3 * max(during), 1) if during else None, steps_during=len(during))
            moves.append(mv)
            print("parts_move: %s" % json.dumps(mv), flush=True)
        open(stop, "w").close()
        for w in ws:
            w.wait(60)
        res = dict(rows=a.rows, dim=a.dim, keys=a.keys, rate=a.rate, followers=a.followers, moves=moves)
        print(json.dumps(res))
        print("%-6s %8s %12s %9s %11s %10s %9s %12s %12s %12s" % (
            "move", "seconds", "rows moved", "fraction", "rows given", "MiB given", "B/row", "handover ms",
            "step p50 ms", "step max ms"))
        for mv in moves:
            print("%-6s %8.2f %12d %9.4f %11d %10.1f %9s %12d %12s %12s" % (
                mv["move"], mv["seconds"], mv["rows_changed_part"], mv["fraction"] or 0, mv["rows_given"],
                mv["bytes_moved"] / 1048576.0, mv["bytes_per_changed_row"], mv["handover_ms"],
                mv["step_p50_before_ms"], mv["step_max_during_ms"]))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
