#!/usr/bin/python3
"""hogwild.py - Hogwild! on one machine: psd's shared model against
PyTorch's own (a benchmark; it prints figures and asserts nothing).

    bench/hogwild.py [--workers 2,4] [--epochs 8] [--lr 0.1] [--batch 64]
                     [--target 0.99] [--only SUBSTRING,...] [--out DIR]
                     [--snap-every 2] [--eval-every 5] [--timeout 300]
                     [--psd PATH --psworker PATH --psctl PATH --data DIR]

The CNN (bench/torch_ref.py's W2, which is psworker's model cnn: two
convolutions, two dense layers, 21840 parameters, the same tensors in the
same layout) on MNIST with M workers, each a process training its 1/M of
the training set, plain SGD at --lr (no momentum), batch --batch, cross
entropy averaged over the batch, in five ways:
- torch:            PyTorch's own Hogwild!, as its mnist_hogwild example:
                    the model in shared memory (share_memory(),
                    torch.multiprocessing), each process stepping it with its
                    own torch.optim.SGD;
- psd-hogwild:      psd with hogwild = on: each worker is a psd.torch.Worker
                    whose parameters are psd's model segment, a step
                    w -= lr*g applied into it by libpsclient;
- psd-asgd:         psd in asgd (optimizer sgd at the same lr) through the
                    workers' shared segments: each step a PUSHPULL;
- psworker-hogwild: psd with hogwild = on, psd's C trainer psworker
                    (--model cnn) as the workers: the same step in the
                    segment, the forward and backward pass psworker's own;
- psworker-asgd:    psd in asgd, psworker as the workers (its default
                    --pipeline auto: on, one step more staleness).
Every PyTorch process runs one torch thread and one OpenBLAS thread: what
PyTorch's multiprocessing notes advise against oversubscription
(floor(cores / processes) threads, at least 1; 2 cores here), and what
psworker runs (--threads 1). Every way starts from the same model: torch's
W2 initialised from --seed, given to psd by --init-from.

The clock and the snapshots are the same for every way. The clock starts
when every worker has loaded its data (psworker: when psd's model version
first moves). Every --snap-every seconds of training the bench stops every
worker process (SIGSTOP), takes the model (a copy of the shared-memory
model; `psctl save` of psd's), evaluates it on the 10000 test images
every --eval-every-th snapshot, and lets the workers go on (SIGCONT): the
pause is left out of the clock. When an evaluated snapshot reaches
--target the run ends, and the snapshots since the last evaluated one are
evaluated too, so the figure is the training time of the first snapshot
at or above --target ("-" when none did within --epochs or --timeout).
Writes DIR/hogwild.json (DIR defaults to bench/out) and prints the
machine's load average (`uptime`) beside the figures: on a shared machine
they are only as good as the load was low; the ratios within one run
count.
"""

import argparse
import json
import multiprocessing as mp
import os
import signal
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import benchlib  # noqa: E402
from benchlib import harness  # noqa: E402

METHODS = ("torch", "psd-hogwild", "psd-asgd", "psworker-hogwild", "psworker-asgd")


# ---- the model as a safetensors file (psd's --init-from, psctl save) ----------


def write_safetensors(path, named):
    """named: (name, float32 numpy array) pairs, written in that order."""
    header, off = {}, 0
    for name, a in named:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, a in named:
            f.write(a.astype("<f4").tobytes())


def read_safetensors(path):
    """(state dict of torch tensors, metadata dict) of a `psctl save` file."""
    import numpy as np
    import torch
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    sd = {k: torch.from_numpy(np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype="<f4")
                              .reshape(v["shape"]).copy()) for k, v in header.items()}
    return sd, meta


# ---- the PyTorch processes (torch, psd-hogwild, psd-asgd) ----------------------


def worker_main(method, k, m, addr, shared, ready, stop, steps, cfg):
    """One training process: shard k of m, up to cfg["epochs"] epochs of it,
    until stop is set."""
    import torch
    import torch.nn.functional as F
    import torch_ref
    torch.set_num_threads(1)
    xtr, ytr = torch_ref.load(cfg["data"], "mnist", "train")
    xs, ys = xtr[k::m], ytr[k::m]
    if method == "torch":
        model = shared
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    else:
        import psd.torch
        model = torch_ref.W2()
        ps = psd.torch.Worker(model, server=addr, shard="%d/%d" % (k, m), connect_s="30")
        if (method == "psd-hogwild") != ps.client.hogwild:
            raise SystemExit("worker %d: psd %s Hogwild! segment" % (k, "gave no" if ps.client.hogwild is False
                                                                         else "unexpectedly gave a"))
    per_epoch = len(xs) // cfg["batch"]
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + k)
    model.train()
    ready.wait()
    for epoch in range(cfg["epochs"]):
        order = torch.randperm(len(xs), generator=g)
        for s in range(per_epoch):
            if stop.value:
                break
            idx = order[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            if method == "torch":
                opt.zero_grad()
                F.cross_entropy(model(xs[idx]), ys[idx]).backward()
                opt.step()
            else:
                ps.zero_grad()
                F.cross_entropy(model(xs[idx]), ys[idx]).backward()
                ps.step()
            steps[k] += 1  # this process's own slot: no lock needed
    if method != "torch":
        ps.close()


# ---- one configuration -----------------------------------------------------------


def stopped(pid):
    """True when process pid is stopped (or gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("T", "t", "Z", "X")


def cpu_seconds(pid):
    """Process pid's CPU seconds, 0 when it is gone."""
    try:
        return benchlib.cpu_seconds(pid)
    except (OSError, IndexError):
        return 0.0


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Run:
    """One configuration (method, M workers): starts psd when the method
    needs it and the workers, keeps the clock, takes the snapshots."""

    def __init__(self, method, m, cfg, cl, init_path):
        self.method, self.m, self.cfg, self.cl = method, m, cfg, cl
        self.failed = None  # why a worker failed, if one did
        self.cpu_seen = {}  # pid: the most CPU seconds (user + system) seen of that worker
        self.init_path = init_path
        self.procs, self.addr, self.shared = [], None, None
        self.snaps = []  # {"seconds", "samples", "state"/"path", "acc"}

    def start(self):
        import torch
        import torch_ref
        cfg, m = self.cfg, self.m
        if self.method != "torch":
            args = ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "warmup_versions=0",
                    "--set", "lr=%g" % cfg["lr"], "--set", "heartbeat_timeout=60s", "--init-from", self.init_path]
            if self.method.endswith("-hogwild"):
                args += ["--set", "hogwild=on"]
            self.addr = self.cl.psd(mode="asgd", workers=m, args=args).addr
        if self.method.startswith("psworker"):
            for k in range(m):
                argv = [harness.Paths.psworker, "--server", self.addr, "--shard", "%d/%d" % (k, m), "--model", "cnn",
                        "--epochs", str(cfg["epochs"]), "--batch", str(cfg["batch"]), "--seed", str(cfg["seed"]),
                        "--data", cfg["data"], "--dataset", "mnist", "--threads", "1", "--fixed-shard", "--quiet"]
                self.procs.append(harness.Worker("psworker%d" % k, argv, self.cl.dir))
            self.cl.procs.extend(self.procs)
            self.pids = [p.pid for p in self.procs]
            # the clock starts with psd's first applied step
            harness.wait_until(lambda: harness.version(self.addr) > 0 or self._failed(), 120,
                               "the first step of %s" % self.method, interval=0.1)
            return
        ctx = mp.get_context("spawn")
        self.ready, self.stop, self.steps = ctx.Barrier(m + 1), ctx.Value("i", 0), ctx.Array("q", m, lock=False)
        if self.method == "torch":
            torch.manual_seed(cfg["seed"])
            self.shared = torch_ref.W2()
            self.shared.share_memory()
        self.procs = [ctx.Process(target=worker_main, args=(self.method, k, m, self.addr, self.shared, self.ready,
                                                            self.stop, self.steps, cfg)) for k in range(m)]
        for p in self.procs:
            p.start()
        self.pids = [p.pid for p in self.procs]
        self.ready.wait(timeout=120)

    def _failed(self):
        """True (the reason kept in self.failed) once a psworker exited
        with a status other than 0 (say, its loss became NaN): the cell
        ends there and the bench goes on with the next."""
        bad = [p for p in self.procs if not p.alive() and p.p.returncode not in (0, None)]
        if bad and not self.failed:
            self.failed = "%s exited with %s: %s" % (bad[0].name, bad[0].p.returncode,
                                                     harness.tail(bad[0].err_path, 1).strip())
            print("  %s/%d: %s" % (self.method, self.m, self.failed), flush=True)
        return bool(self.failed)

    def alive(self):
        if self.method.startswith("psworker"):
            return not self._failed() and any(p.alive() for p in self.procs)
        return any(p.is_alive() for p in self.procs)

    def snapshot(self, i):
        """The model now (the workers stopped) and the samples trained."""
        if self.method == "torch":
            return {"state": {k: v.clone() for k, v in self.shared.state_dict().items()},
                    "samples": sum(self.steps) * self.cfg["batch"]}
        path = os.path.join(self.cl.dir, "snap%d.safetensors" % i)
        r = harness.psctl(self.addr, "save", path, timeout=60)
        if r.returncode != 0:
            raise SystemExit("hogwild.py: psctl save failed: %s" % r.stderr)
        _, meta = read_safetensors(path)
        return {"path": path, "samples": int(meta["model_version"]) * self.cfg["batch"]}

    def evaluate(self, snap, model, xte, yte):
        import torch_ref
        if "acc" not in snap:
            sd = snap["state"] if "state" in snap else read_safetensors(snap["path"])[0]
            model.load_state_dict(sd)
            snap["acc"], _ = torch_ref.evaluate(model, xte, yte)
            snap.pop("state", None)
        return snap["acc"]

    def train(self, model, xte, yte):
        """Runs the workers to the target, the epochs or the timeout."""
        cfg = self.cfg
        t0, paused, nxt, hit = time.monotonic(), 0.0, cfg["snap_every"], None
        cpu0 = sum(cpu_seconds(pid) for pid in self.pids)  # loading the data is not training
        while True:
            clock = time.monotonic() - t0 - paused
            done = not self.alive()
            if not done and clock < nxt and clock < cfg["timeout"]:
                time.sleep(min(0.02, nxt - clock))
                continue
            tp = time.monotonic()
            signal_all(self.pids, signal.SIGSTOP)
            harness.wait_until(lambda: all(stopped(p) for p in self.pids), 30, "the workers to stop")
            snap = self.snapshot(len(self.snaps))
            for pid in self.pids:  # of one that exited and was reaped, the last figure stands
                self.cpu_seen[pid] = max(self.cpu_seen.get(pid, 0.0), cpu_seconds(pid))
            snap["cpu"] = sum(self.cpu_seen.values()) - cpu0
            snap["seconds"] = tp - t0 - paused
            self.snaps.append(snap)
            last = done or snap["seconds"] >= cfg["timeout"]
            if len(self.snaps) % cfg["eval_every"] == 0 or last:
                acc = self.evaluate(snap, model, xte, yte)
                print("  %s/%d: %.1f s, epoch %.2f, test accuracy %.2f%%" % (
                    self.method, self.m, snap["seconds"], snap["samples"] / 60000, 100 * acc), flush=True)
                if acc >= cfg["target"]:
                    hit = snap
            signal_all(self.pids, signal.SIGCONT)
            paused += time.monotonic() - tp
            nxt += cfg["snap_every"]
            if hit or last:
                break
        self.finish()
        if hit:  # the first snapshot at or above the target
            i = len(self.snaps) - 1
            while i > 0 and "acc" not in self.snaps[i - 1]:
                i -= 1
            for s in self.snaps[i:]:
                if self.evaluate(s, model, xte, yte) >= cfg["target"]:
                    return s
        return None

    def finish(self):
        if self.method.startswith("psworker"):
            signal_all([p.pid for p in self.procs if p.alive()], signal.SIGTERM)
            signal_all([p.pid for p in self.procs if p.alive()], signal.SIGCONT)
            for p in self.procs:
                p.wait(60)
            return
        self.stop.value = 1
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--snap-every", type=float, default=2.0, help="seconds of training between two snapshots")
    ap.add_argument("--eval-every", type=int, default=5, help="evaluate every Nth snapshot while training")
    ap.add_argument("--timeout", type=float, default=300, help="seconds of training a configuration may take at most")
    ap.add_argument("--only", default="", help="comma-separated substrings of METHOD/M to run")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--psd", default=None)
    ap.add_argument("--psworker", default=None)
    ap.add_argument("--psctl", default=None)
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data"))
    a = ap.parse_args()
    for name in ("psd", "psworker", "psctl"):
        if getattr(a, name):
            setattr(harness.Paths, name, getattr(a, name))
    env = benchlib.python_env()
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    os.environ["PSD_CLIENT_LIBRARY"] = env["PSD_CLIENT_LIBRARY"]
    sys.path.insert(0, os.path.join(benchlib.ROOT, "python"))
    import torch
    import torch_ref
    torch.set_num_threads(2)  # the evaluations, while the workers are stopped
    cfg = {"epochs": a.epochs, "lr": a.lr, "batch": a.batch, "target": a.target, "seed": a.seed,
           "timeout": a.timeout, "snap_every": a.snap_every, "eval_every": a.eval_every,
           "data": os.path.abspath(a.data)}
    xte, yte = torch_ref.load(cfg["data"], "mnist", "t10k")
    torch.manual_seed(a.seed)
    init = torch_ref.W2()
    model = torch_ref.W2()
    only = [s for s in a.only.split(",") if s]
    rows = []
    print("load average at start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    for m in [int(x) for x in a.workers.split(",")]:
        for method in METHODS:
            if only and not any(s in "%s/%d" % (method, m) for s in only):
                continue
            load0 = os.getloadavg()[0]
            with harness.Cluster("bench-hogwild") as cl:
                init_path = os.path.join(cl.dir, "init.safetensors")
                write_safetensors(init_path, [(k, v.detach().numpy()) for k, v in init.state_dict().items()])
                run = Run(method, m, cfg, cl, init_path)
                run.start()
                hit = run.train(model, xte, yte)
            recs = [{"seconds": round(s["seconds"], 2), "epoch": round(s["samples"] / 60000, 3), "acc": s.get("acc"),
                     "cpu": round(s["cpu"], 2)}
                    for s in run.snaps]
            evaluated = [r for r in recs if r["acc"] is not None]
            best = max((r["acc"] for r in evaluated), default=0.0)
            last = recs[-1] if recs else {"seconds": 0, "epoch": 0}
            row = {"method": method, "workers": m, "seconds_to_target": hit["seconds"] if hit else None,
                   "epochs_to_target": round(hit["samples"] / 60000, 3) if hit else None, "best_acc": best,
                   "seconds_per_epoch": last["seconds"] / last["epoch"] if last["epoch"] else None,
                   "worker_cpu_seconds_per_epoch": last["cpu"] / last["epoch"] if last["epoch"] else None,
                   "failed": run.failed, "load_before": load0, "load_after": os.getloadavg()[0], "records": recs}
            rows.append(row)
            print("%-16s %d workers: %s%s to %.1f%% (%s epochs), best %.2f%%, %.1f s and %.1f worker CPU s an epoch, "
                  "load %.1f..%.1f" % (method, m, "failed, " if run.failed else "",
                                       "%.1f s" % hit["seconds"] if hit else "-", 100 * a.target,
                                       row["epochs_to_target"] or "-", 100 * best, row["seconds_per_epoch"] or 0,
                                       row["worker_cpu_seconds_per_epoch"] or 0, load0, row["load_after"]), flush=True)
    print("\n| workers | way | time to %.1f%% | epochs | s an epoch | worker CPU s an epoch | ratio to torch | load |"
          % (100 * a.target))
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ref = next((x for x in rows if x["workers"] == r["workers"] and x["method"] == "torch"), None)
        ratio = "-"
        if ref and ref["seconds_to_target"] and r["seconds_to_target"]:
            ratio = "%.2f" % (r["seconds_to_target"] / ref["seconds_to_target"])
        print("| %d | %s | %s | %s | %.1f | %.1f | %s | %.1f-%.1f |" % (
            r["workers"], r["method"], "%.1f s" % r["seconds_to_target"] if r["seconds_to_target"] else
            "failed" if r["failed"] else "-",
            r["epochs_to_target"] or "-", r["seconds_per_epoch"] or 0, r["worker_cpu_seconds_per_epoch"] or 0, ratio,
            r["load_before"], r["load_after"]))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "hogwild.json"), "w") as f:
        json.dump({"settings": cfg, "rows": rows}, f, indent=1)
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
