#!/usr/bin/python3
"""hogwild.py - Hogwild! on one machine: psd's shared model against
PyTorch's own (a benchmark; it prints figures and asserts nothing).

    bench/hogwild.py [--workers 2,4] [--epochs 5] [--lr 0.1] [--batch 64]
                     [--target 0.99] [--only SUBSTRING] [--out DIR]
                     [--psd PATH --data DIR]

The CNN (bench/torch_ref.py's W2: two convolutions, two dense layers,
21840 parameters) on MNIST with M workers, each a process with one torch
thread training its 1/M of the training set, plain SGD at --lr (no
momentum), batch --batch, in three ways:
- torch:       PyTorch's own Hogwild!, as its mnist_hogwild example: the
               model in shared memory (share_memory(), torch.multiprocessing),
               each process stepping it with its own torch.optim.SGD;
- psd-hogwild: psd with hogwild = on: each worker is a psd.torch.Worker
               whose parameters are psd's model segment, a step w -= lr*g
               applied into it by libpsclient;
- psd-asgd:    psd in asgd (optimizer sgd at the same lr) through the
               workers' shared segments: each step a PUSHPULL.
The same seed gives every way the same initial model and order of
batches. Four times an epoch the workers stop together (a barrier) and
worker 0 measures the test accuracy of the model (for psd-asgd after a
pull) on the 10000 test images; that time is left out of the clock. The
figure is the training time until the test accuracy first reached
--target, or "-" when it did not within --epochs. Writes DIR/hogwild.json
(DIR defaults to bench/out) and prints the machine's load average
(`uptime`) beside the figures: on a shared machine they are only as good
as the load was low.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import benchlib  # noqa: E402
from benchlib import harness  # noqa: E402

METHODS = ("torch", "psd-hogwild", "psd-asgd")
EVALS_PER_EPOCH = 4


def worker_main(method, k, m, addr, shared, barrier, stop, results, cfg):
    """One training process: shard k of m; worker 0 also measures."""
    import torch
    import torch.nn.functional as F
    import torch_ref
    torch.set_num_threads(1)
    xtr, ytr = torch_ref.load(cfg["data"], "mnist", "train")
    xs, ys = xtr[k::m], ytr[k::m]
    xte, yte = torch_ref.load(cfg["data"], "mnist", "t10k") if k == 0 else (None, None)
    if method == "torch":
        model = shared
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    else:
        import psd.torch
        torch.manual_seed(cfg["seed"])
        model = torch_ref.W2()
        ps = psd.torch.Worker(model, server=addr, shard="%d/%d" % (k, m), connect_s="30")
        if (method == "psd-hogwild") != ps.client.hogwild:
            raise SystemExit("worker %d: psd %s Hogwild! segment" % (k, "gave no" if ps.client.hogwild is False
                                                                         else "unexpectedly gave a"))
    per_epoch = len(xs) // cfg["batch"]
    every = max(1, per_epoch // EVALS_PER_EPOCH)
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + k)
    t0, paused = time.monotonic(), 0.0
    model.train()
    for epoch in range(cfg["epochs"]):
        order = torch.randperm(len(xs), generator=g)
        for s in range(per_epoch):
            idx = order[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            if method == "torch":
                opt.zero_grad()
                F.cross_entropy(model(xs[idx]), ys[idx]).backward()
                opt.step()
            else:
                ps.zero_grad()
                F.cross_entropy(model(xs[idx]), ys[idx]).backward()
                ps.step()
            if (s + 1) % every and s + 1 != per_epoch:
                continue
            barrier.wait()
            if k == 0:
                t = time.monotonic()
                if method == "psd-asgd":
                    ps.pull()
                acc, _ = torch_ref.evaluate(model, xte, yte)
                model.train()
                results.put({"epoch": round(epoch + (s + 1) / per_epoch, 3), "seconds": t - t0 - paused,
                             "acc": acc})
                if acc >= cfg["target"]:
                    stop.value = 1
                paused += time.monotonic() - t
            barrier.wait()
            if stop.value:
                break
        if stop.value:
            break
    if method != "torch":
        ps.close()


def run(method, m, cfg):
    """One configuration: the records of worker 0's measurements."""
    import torch
    import torch_ref
    ctx = mp.get_context("spawn")
    barrier, stop, results = ctx.Barrier(m), ctx.Value("i", 0), ctx.Queue()
    shared = None
    with harness.Cluster("bench-hogwild") as cl:
        addr = None
        if method != "torch":
            args = ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "warmup_versions=0",
                    "--set", "lr=%g" % cfg["lr"], "--set", "heartbeat_timeout=60s"]
            if method == "psd-hogwild":
                args += ["--set", "hogwild=on"]
            addr = cl.psd(mode="asgd", workers=m, args=args).addr
        else:
            torch.manual_seed(cfg["seed"])
            shared = torch_ref.W2()
            shared.share_memory()
        procs = [ctx.Process(target=worker_main, args=(method, k, m, addr, shared, barrier, stop, results, cfg))
                 for k in range(m)]
        for p in procs:
            p.start()
        recs = []
        deadline = time.monotonic() + cfg["timeout"]
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            try:
                recs.append(results.get(timeout=0.5))
                print("  %s/%d: epoch %.2f, %.1f s, test accuracy %.2f%%" % (
                    method, m, recs[-1]["epoch"], recs[-1]["seconds"], 100 * recs[-1]["acc"]), flush=True)
            except Exception:  # queue.Empty
                pass
        timed_out = False
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()  # past --timeout: the records so far stand, marked so
                p.join()
                timed_out = True
        while not results.empty():
            recs.append(results.get())
        bad = [p.exitcode for p in procs if p.exitcode] if not timed_out else []
        if timed_out:
            print("  %s/%d: stopped at --timeout (%.0f s)" % (method, m, cfg["timeout"]), flush=True)
        if bad:
            sys.exit("hogwild.py: %s with %d workers: a worker exited with %s" % (method, m, bad))
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=400, help="seconds one configuration may take at most")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--psd", default=None)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data"))
    a = ap.parse_args()
    if a.psd:
        harness.Paths.psd = a.psd
    env = benchlib.python_env()
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    os.environ["PSD_CLIENT_LIBRARY"] = env["PSD_CLIENT_LIBRARY"]
    sys.path.insert(0, os.path.join(benchlib.ROOT, "python"))
    cfg = {"epochs": a.epochs, "lr": a.lr, "batch": a.batch, "target": a.target, "seed": a.seed,
           "timeout": a.timeout, "data": os.path.abspath(a.data)}
    rows = []
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    for m in [int(x) for x in a.workers.split(",")]:
        for method in METHODS:
            if a.only and a.only not in "%s/%d" % (method, m):
                continue
            load0 = os.getloadavg()[0]
            recs = run(method, m, cfg)
            hit = next((r for r in recs if r["acc"] >= a.target), None)
            best = max((r["acc"] for r in recs), default=0.0)
            row = {"method": method, "workers": m, "seconds_to_target": hit["seconds"] if hit else None,
                   "epochs_to_target": hit["epoch"] if hit else None, "best_acc": best,
                   "load_before": load0, "load_after": os.getloadavg()[0], "records": recs}
            rows.append(row)
            print("%-12s %d workers: %s to %.1f%% (%s epochs), best %.2f%%, load %.1f..%.1f" % (
                method, m, "%.1f s" % hit["seconds"] if hit else "-", 100 * a.target,
                hit["epoch"] if hit else "-", 100 * best, load0, row["load_after"]), flush=True)
    print("\n| workers | way | time to %.1f%% | epochs | ratio to torch |" % (100 * a.target))
    print("|---|---|---|---|---|")
    for r in rows:
        ref = next((x for x in rows if x["workers"] == r["workers"] and x["method"] == "torch"), None)
        ratio = "-"
        if ref and ref["seconds_to_target"] and r["seconds_to_target"]:
            ratio = "%.2f" % (r["seconds_to_target"] / ref["seconds_to_target"])
        print("| %d | %s | %s | %s | %s |" % (r["workers"], r["method"],
                                             "%.1f s" % r["seconds_to_target"] if r["seconds_to_target"] else "-",
                                             r["epochs_to_target"] or "-", ratio))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "hogwild.json"), "w") as f:
        json.dump({"settings": cfg, "rows": rows}, f, indent=1)
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
