#!/usr/bin/python3
"""table_rows.py - rows per second through psd's embedding tables
(proto/PROTOCOL.md section 13): W worker processes, each a psd.Client
pushing the row gradients of a batch of distinct keys and pulling the next
batch's rows (psc_table_pushpull) in a loop, against one psd it starts
(ASGD, AdaGrad table). Prints one JSON line: rows per second pushed and
pulled by all workers together, and per psd core (psd runs on one).

    bench/table_rows.py --workers 2 --keys 4096 --dim 16 --steps 300

Needs the build tree (build/server/psd, build/client/libpsclient.so.1) or
PSD_BIN and PSD_CLIENT_LIBRARY. The raw-TCP ceiling of the same bytes is
psbench's (build/bench/psbench --table).
"""

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))


def worker(addr, k, m, args, out):
    import numpy as np

    import psd
    c = psd.Client([("w", (4,))], server=addr, shard="%d/%d" % (k, m), connect=True)
    c.table("emb", args.dim, init="uniform", scale=0.01, opt="adagrad", lr=0.05)
    rng = np.random.default_rng(k)
    batches = [rng.choice(args.ids, args.keys, replace=False).astype(np.uint64) for _ in range(8)]
    grads = np.full((args.keys, args.dim), 0.01, np.float32)
    c.pull_rows("emb", batches[0])
    for i in range(5):  # warm up: rows created
        c.pushpull_rows("emb", batches[i % 8], grads, batches[(i + 1) % 8])
    t0 = time.perf_counter()
    for i in range(args.steps):
        c.pushpull_rows("emb", batches[i % 8], grads, batches[(i + 1) % 8])
    out.put(time.perf_counter() - t0)
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keys", type=int, default=4096, help="distinct keys a step pushes and pulls")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--ids", type=int, default=1000000, help="keys drawn from 0..ids-1")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    psd_bin = os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd"))
    d = tempfile.mkdtemp(prefix="table-rows-")
    port_file = os.path.join(d, "port")
    p = subprocess.Popen([psd_bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--mode", "asgd",
                          "--workers", str(args.workers), "--log-level", "warn"])
    try:
        t0 = time.monotonic()
        while not (os.path.exists(port_file) and open(port_file).read().endswith("\n")):
            if time.monotonic() - t0 > 15 or p.poll() is not None:
                raise SystemExit("psd did not start")
            time.sleep(0.02)
        addr = "127.0.0.1:" + open(port_file).read().strip()
        cpu0 = os.times()
        with open("/proc/%d/stat" % p.pid) as f:
            st0 = f.read().split()
        out = mp.Queue()
        procs = [mp.Process(target=worker, args=(addr, k, args.workers, args, out)) for k in range(args.workers)]
        for q in procs:
            q.start()
        secs = [out.get(timeout=600) for _ in procs]
        for q in procs:
            q.join(60)
        with open("/proc/%d/stat" % p.pid) as f:
            st1 = f.read().split()
        tick = os.sysconf("SC_CLK_TCK")
        psd_cpu = (int(st1[13]) + int(st1[14]) - int(st0[13]) - int(st0[14])) / tick
        del cpu0
        rows = args.workers * args.steps * args.keys
        wall = max(secs)
        print(json.dumps({"workers": args.workers, "keys": args.keys, "dim": args.dim, "steps": args.steps,
                          "seconds": round(wall, 3), "rows_pushed_per_second": round(rows / wall),
                          "rows_pulled_per_second": round(rows / wall),
                          "psd_cpu_seconds": round(psd_cpu, 3),
                          "rows_per_psd_cpu_second": round(2 * rows / psd_cpu) if psd_cpu else None}))
    finally:
        p.terminate()
        p.wait(30)


if __name__ == "__main__":
    main()
