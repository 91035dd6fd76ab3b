#!/usr/bin/python3
"""tables_scale.py - a table larger than one psd's max_table_memory, split
over several psd (proto/PROTOCOL.md 13.7). Prints one JSON line per run and
a summary.

A click-through-rate model on synthetic logs: F categorical features, each
id of each feature a row of --dim floats with AdaGrad in one table
("ids", the feature folded into the key), ids uniform over --rows / F per
feature so every row is touched; the label comes from a planted teacher
whose weight for an id is a function of the id alone (no table), so the
logs need no memory. The model's logit is the sum over features of its
row's dot product with a fixed unit vector, plus a bias; one worker (a
psd.Client in this process) pulls a batch's rows, computes the gradient
with NumPy and pushes it, for --epochs epochs; then the test AUC.

Each psd runs with heartbeat_timeout 300 s: growing a hash table of 2^26
slots holds psd's loop for more than the default 10 s on a loaded 2-core
machine, and the worker would be declared lost mid-run. Each run's JSON
line has the psd's warnings and errors, and per psd its rows, table bytes,
the rows' weights and AdaGrad state alone (rows x 2 x dim x 4 bytes), its
RSS now and at its peak, and 1.1 x either of them + 64 MiB.

Runs, each on fresh psd:
  one        one psd, max_table_memory large enough: the reference;
  one-capped one psd with max_table_memory = what the table needs / parts
             (rounded up), table_full = refuse: where it stops, and psd's error;
  one-evict  the same cap with table_full = evict: AUC with rows evicted;
  split      --parts psd with that cap each: AUC and each psd's RSS against
             its rows and state.
With one worker every run applies the same updates in the same order, so
`split` ends with the rows `one` ends with, and the same AUC.

    bench/tables_scale.py --rows 4000000 --parts 4

Needs the build tree (build/server/psd, build/client/libpsclient.so.1) or
PSD_BIN and PSD_CLIENT_LIBRARY.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))

import psd  # noqa: E402
from psd.metrics import auc  # noqa: E402

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(z):
    """splitmix64's finaliser over a uint64 array."""
    with np.errstate(over="ignore"):
        z = z.astype(np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def logs(n, args, seed):
    """n samples: keys [n, F] (feature f's id i is key f * 2^40 + i), labels."""
    rng = np.random.default_rng(seed)
    per = args.rows // args.features
    ids = rng.integers(0, per, (n, args.features)).astype(np.uint64)
    keys = ids + (np.arange(args.features, dtype=np.uint64) << np.uint64(40))
    w = (mix(keys ^ np.uint64(args.seed)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # [0, 1)
    logit = ((w - 0.5) * 3.0).sum(1) - 0.2
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return keys, y


def start_psd(d, name, sets):
    port_file = os.path.join(d, name + ".port")
    err = open(os.path.join(d, name + ".log"), "w")
    argv = [os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd")), "--listen", "127.0.0.1:0",
            "--port-file", port_file, "--mode", "asgd", "--workers", "1", "--log-level", "warn"]
    for s in sets:
        argv += ["--set", s]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(port_file):
            with open(port_file) as f:
                text = f.read()
            if text.endswith("\n"):
                return p, "127.0.0.1:%d" % int(text)
        if p.poll() is not None:
            sys.exit("psd exited: %s" % open(os.path.join(d, name + ".log")).read())
        time.sleep(0.05)
    sys.exit("psd did not start")


def rss_mb(pid, field="VmRSS:"):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def run(name, nparts, sets, args, train, test):
    d = tempfile.mkdtemp(prefix="tables-scale-" + name + "-")
    procs = [start_psd(d, "psd%d" % i, sets) for i in range(nparts)]
    out = {"run": name, "parts": nparts, "settings": sets}
    try:
        c = psd.Client([("bias", (1024 * nparts,))], server=",".join(a for _, a in procs), shard="0/1",
                       connect=True, timeout_ms=600000)
        c.table("ids", args.dim, init="normal", scale=0.01, seed=1, opt="adagrad", lr=args.lr)
        u = np.random.default_rng(3).normal(size=args.dim).astype(np.float32)
        u /= np.linalg.norm(u)
        keys, y = train
        F, B = args.features, args.batch
        t0 = time.monotonic()
        steps = 0
        try:
            # pull batch 0; then each step pushes batch b's gradients and
            # pulls batch b+1's rows in one call (psd applies the push
            # first: the same order as pull, push, pull, ...)
            starts = [at for _ in range(args.epochs) for at in range(0, len(y), B)]
            rows = c.pull_rows("ids", keys[0:B].reshape(-1)).reshape(-1, F, args.dim)
            for i, at in enumerate(starts):
                k = keys[at:at + B].reshape(-1)
                p = 1 / (1 + np.exp(-((rows @ u).sum(1))))
                g = np.ascontiguousarray(np.broadcast_to(
                    ((p - y[at:at + B])[:, None, None] * u[None, None, :]).astype(np.float32), rows.shape))
                if i + 1 < len(starts):
                    nk = keys[starts[i + 1]:starts[i + 1] + B].reshape(-1)
                    rows = c.pushpull_rows("ids", k, g.reshape(-1, args.dim), nk).reshape(-1, F, args.dim)
                else:
                    c.push_rows("ids", k, g.reshape(-1, args.dim))
                steps += 1
                if args.progress and steps % args.progress == 0:
                    print("  %s: step %d of %d, %.0f s" % (name, steps, len(starts), time.monotonic() - t0),
                          file=sys.stderr, flush=True)
        except psd.PsdError as e:
            out["stopped"] = {"step": steps, "of": len(starts), "error": str(e)[:400]}
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["rows_per_second"] = round(steps * B * F * 2 / out["seconds"]) if out["seconds"] else 0
        if "stopped" not in out:
            tk, ty = test
            score = np.empty(len(ty))
            for at in range(0, len(ty), 8192):
                rows = c.pull_rows("ids", tk[at:at + 8192].reshape(-1)).reshape(-1, F, args.dim)
                score[at:at + 8192] = (rows @ u).sum(1)
            out["test_auc"] = round(auc(ty, score), 4)
        parts = []
        for p, a in procs:
            st = [t for t in c_status(a)["tables"]]
            t = st[0] if st else {"rows": 0, "bytes": 0, "evicted": 0}
            state = t["rows"] * 2 * args.dim * 4  # the rows' weights and AdaGrad state
            parts.append({"rows": t["rows"], "table_mb": round(t["bytes"] / 2**20, 1),
                          "rows_state_mb": round(state / 2**20, 1),
                          "evicted": t.get("evicted", 0), "rss_mb": round(rss_mb(p.pid), 1),
                          "rss_peak_mb": round(rss_mb(p.pid, "VmHWM:"), 1),
                          "rss_limit_mb": round(1.1 * t["bytes"] / 2**20 + 64, 1),
                          "rss_limit_state_mb": round(1.1 * state / 2**20 + 64, 1)})
        out["psd"] = parts
        c.close()
    finally:
        for p, _ in procs:
            p.terminate()
            try:
                p.wait(300)  # a psd of gigabytes on a loaded machine took more than 30 s
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(60)
        for i in range(nparts):  # what psd said (a refusal, a lost worker), before the dir goes
            with open(os.path.join(d, "psd%d.log" % i)) as f:
                said = [line.strip() for line in f if (" WARN " in line or " ERROR " in line) and
                        "every worker has left" not in line]
            if said:
                out.setdefault("psd_said", {})[i] = said[-5:]
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return out


def c_status(addr):
    r = subprocess.run([os.environ.get("PSCTL_BIN", os.path.join(ROOT, "build", "psctl", "psctl")), "--server",
                        addr, "--json", "status"], capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4000000, help="rows in all (ids over all features)")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--features", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--samples", type=int, default=0, help="training samples (default: 2 x rows / features)")
    ap.add_argument("--test", type=int, default=100000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--runs", default="one,one-capped,one-evict,split")
    ap.add_argument("--progress", type=int, default=0, help="print a line every this many steps (stderr)")
    args = ap.parse_args()
    n = args.samples or 2 * args.rows // args.features
    train, test = logs(n, args, 11), logs(args.test, args, 12)
    row = (args.dim * 2 + 4) * 4 + 20  # bytes a row takes (PROTOCOL.md 13.4), slots at the highest load
    need = args.rows * row
    cap = -(-need // args.parts)
    cap = -(-cap // (1 << 20)) << 20  # whole MiB
    big = "max_table_memory=%d" % (4 * need + (1 << 30))
    res = {}
    for name in args.runs.split(","):
        if name == "one":
            res[name] = run(name, 1, [big], args, train, test)
        elif name == "one-capped":
            res[name] = run(name, 1, ["max_table_memory=%d" % cap], args, train, test)
        elif name == "one-evict":
            res[name] = run(name, 1, ["max_table_memory=%d" % cap, "table_full=evict"], args, train, test)
        elif name == "split":
            res[name] = run(name, args.parts, ["max_table_memory=%d" % cap], args, train, test)
    summary = {"rows": args.rows, "dim": args.dim, "cap_mb": cap >> 20, "parts": args.parts,
               "auc": {k: v.get("test_auc") for k, v in res.items()}}
    if "one" in res and "split" in res and res["one"].get("test_auc") is not None:
        summary["split_minus_one_auc"] = round(res["split"].get("test_auc", 0) - res["one"]["test_auc"], 4)
        summary["rss_within_limit"] = all(p["rss_mb"] <= p["rss_limit_mb"] for p in res["split"]["psd"])
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
