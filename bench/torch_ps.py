#!/usr/bin/python3
"""torch_ps.py - PyTorch models trained through psd against PyTorch alone
and against a torch.distributed.rpc parameter server (a benchmark: it prints
figures and asserts nothing).

    bench/torch_ps.py [--epochs 6] [--rpc-limit 6000] [--lr 2e-3] [--batch 64] [--reps 1]
                      [--only alone,alone1,psd,pipe,rpc,w1,w1pipe] [--w1-batch 64]
                      [--psd PATH] [--data DIR]

Rows, all in one run, same model, same settings (Adam, lr --lr falling
along a cosine to 0 over the run's updates, no warm-up, batch --batch
(64) per worker, MNIST normalised alike):
- alone: examples/torch/mnist_cnn.py's CNN trained by PyTorch in one
  process (2 intra-op threads: the machine's two cores); alone1: the same
  with 1 thread (on a loaded machine the faster of the two; the ratio is
  taken to the faster);
- psd: the same script, 2 workers (1 thread each) through psd (asgd,
  Adam on psd, the cosine over epochs x 2 x ceil(30000/64) versions:
  as many updates as alone makes); pipe: the same with --pipeline (each
  step's round trip overlaps the next batch's computation);
- rpc: the parameter server of PyTorch's tutorial "Implementing a Parameter
  Server Using Distributed RPC Framework", written after its structure: a
  parameter-server process holds the model, each of 2 trainers runs the
  model's forward on it through rpc_sync, backward with distributed
  autograd, and a DistributedOptimizer (Adam, lr --lr, constant) steps the
  parameters on the server. It is slow, so it trains --rpc-limit samples
  and its time per epoch is scaled to 60000;
- w1, w1pipe: W1 (psworker's mlp:256,128) with 2 PyTorch workers through
  psd, without and with --pipeline, 2 epochs at batch --w1-batch (64,
  W1's own recommended settings, whatever --batch says): the share of the epoch spent inside
  libpsclient (push, pull, waiting on psd; the script times those calls).
Per row: seconds per epoch (training only), test accuracy after the last
epoch; at the end the ratios the issue asks for. --reps N runs the rows in
turn N times: the table shows medians and each repetition, a ratio is the
median of the repetitions' own ratios (rows run minutes apart at most, so
a load that comes and goes on a shared machine touches both sides).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))
import harness  # noqa: E402
from benchlib import cpu_seconds  # noqa: E402

PY = "/usr/bin/python3"
SCRIPT = os.path.join(ROOT, "examples", "torch", "mnist_cnn.py")


def env():
    e = dict(os.environ)
    e.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    for v in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "JOB_COMPLETION_INDEX"):
        e.pop(v, None)
    return e


def rows_of(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"epoch"')]


# ---- PyTorch alone --------------------------------------------------------


def alone(args, threads=2):
    import torch
    import torch.nn.functional as F
    import mnist_cnn
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = mnist_cnn.Net()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * -(-60000 // args.batch))
    x, y = mnist_cnn.load(args.data, "train", None)
    tx, ty = mnist_cnn.load(args.data, "t10k", None)
    secs = []
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        order = torch.randperm(len(x))
        for s in range(-(-len(x) // args.batch)):
            i = order[s * args.batch:(s + 1) * args.batch]
            opt.zero_grad()
            F.nll_loss(model(x[i]), y[i]).backward()
            opt.step()
            sched.step()
        secs.append(time.monotonic() - t0)
        acc, _ = mnist_cnn.evaluate(model, tx, ty)
        print("  alone (%d threads) epoch %d: %.2f s, test accuracy %.4f" % (threads, epoch + 1, secs[-1], acc),
              flush=True)
    return statistics.mean(secs), acc


# ---- through psd ------------------------------------------------------------


def through_psd(args, model="cnn", epochs=None, limit=None, pipeline=False, batch=None):
    epochs = epochs or args.epochs
    batch = batch or args.batch
    versions = epochs * 2 * -(-30000 // batch)
    with harness.Cluster("psd-torch-bench") as cl:
        psd = cl.psd(mode="asgd", workers=2, args=["--set", "optimizer=adam", "--set", "lr=%g" % args.lr,
                                                   "--set", "lr_schedule=cosine", "--set", "lr_min=0",
                                                   "--set", "lr_decay_versions=%d" % versions,
                                                   "--set", "warmup_versions=0",
                                                   "--set", "heartbeat_timeout=60s", "--log-level", "warn"])
        argv = [PY, SCRIPT, "--server", psd.addr, "--data", args.data, "--epochs", str(epochs), "--batch",
                str(batch), "--model", model]
        if limit:
            argv += ["--limit", str(limit)]
        if pipeline:
            argv += ["--pipeline"]
        procs = [harness.Proc("w%d" % k, argv + ["--shard", "%d/2" % k], cl.dir, env=env()) for k in range(2)]
        out = []
        for p in procs:
            if p.wait(3600) != 0:
                sys.exit("torch_ps: a psd worker failed:\n" + p.stderr())
            out.append(rows_of(p.stdout()))
        psd_cpu = cpu_seconds(psd.p.pid)
    secs = [statistics.mean(r["epoch_seconds"] for r in rows) for rows in out]
    wcpu = statistics.mean(r["cpu_seconds"] for rows in out for r in rows)
    print("  psd (%s%s): per epoch, psd used %.3f CPU s (its whole life / epochs), each worker %.3f CPU s" %
          (model, ", pipeline" if pipeline else "", psd_cpu / epochs, wcpu), flush=True)
    lib = [statistics.mean(r["library_seconds"] for r in rows) for rows in out]
    for e in range(epochs):
        print("  psd (%s%s) epoch %d: %.2f s, library %.2f s, test accuracy %.4f" %
              (model, ", pipeline" if pipeline else "", e + 1, out[0][e]["epoch_seconds"], out[0][e]["library_seconds"], out[0][e]["test_accuracy"]),
              flush=True)
    return statistics.mean(secs), statistics.mean(out[k][-1]["test_accuracy"] for k in range(2)), \
        statistics.mean(lib)


# ---- the torch.distributed.rpc parameter server ----------------------------


RPC_CODE = r'''
import os, sys, time, json
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import DistributedOptimizer
from threading import Lock
sys.path.insert(0, sys.argv[5])
import mnist_cnn

class ParamServer(nn.Module):
    """The model lives here; trainers run its forward remotely. The forward
    reads copies of the parameters: another trainer's optimizer step may
    change them in place before this trainer's backward, which autograd
    refuses (the tutorial's trainers would meet it with two of them). The
    copies pass the gradients on to the parameters."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.model = mnist_cnn.Net()
    def forward(self, x):
        m = self.model
        c1w, c1b, c2w, c2b, f1w, f1b, f2w, f2b = [p.clone() for p in m.parameters()]
        x = F.relu(F.max_pool2d(F.conv2d(x, c1w, c1b), 2))
        x = F.relu(F.max_pool2d(F.dropout2d(F.conv2d(x, c2w, c2b), training=True), 2))
        x = F.dropout(F.relu(F.linear(x.view(-1, 320), f1w, f1b)), training=True)
        return F.log_softmax(F.linear(x, f2w, f2b), dim=1)
    def rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]

_ps, _lock = None, Lock()

def ps_instance():
    global _ps
    with _lock:
        if _ps is None:
            _ps = ParamServer()
        return _ps

def ps_forward(x):
    return ps_instance()(x)

def ps_rrefs():
    return ps_instance().rrefs()

def ps_eval(tx, ty):
    m = ps_instance().model
    return mnist_cnn.evaluate(m, tx, ty)

def trainer(rank, world, data, epochs, limit, batch, lr):
    torch.set_num_threads(1)
    x, y = mnist_cnn.load(data, "train", limit)
    n_all = len(x)
    k, m = rank - 1, world - 1
    x, y = x[k::m], y[k::m]
    params = rpc.rpc_sync("ps", ps_rrefs)
    opt = DistributedOptimizer(torch.optim.Adam, params, lr=lr)
    steps = -(-(n_all // m) // batch)
    for epoch in range(epochs):
        t0 = time.monotonic()
        order = torch.randperm(len(x))
        for s in range(steps):
            i = order[s * batch:min((s + 1) * batch, n_all // m)]
            with dist_autograd.context() as cid:
                out = rpc.rpc_sync("ps", ps_forward, args=(x[i],))
                loss = F.nll_loss(out, y[i])
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
        secs = time.monotonic() - t0
        print(json.dumps({"epoch": epoch + 1, "epoch_seconds": secs, "samples": n_all // m}), flush=True)
    if rank == 1:
        tx, ty = mnist_cnn.load(data, "t10k", None)
        acc, _ = rpc.rpc_sync("ps", ps_eval, args=(tx, ty))
        print(json.dumps({"test_accuracy": acc}), flush=True)

rank, world = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=600)
rpc.init_rpc("ps" if rank == 0 else "trainer%d" % rank, rank=rank, world_size=world, rpc_backend_options=opts)
if rank != 0:
    trainer(rank, world, sys.argv[3], int(sys.argv[4]), int(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8]))
rpc.shutdown()
'''


def rpc_ps(args):
    with harness.Cluster("rpc-bench") as cl:
        code = os.path.join(cl.dir, "rpc_ps.py")
        with open(code, "w") as f:
            f.write(RPC_CODE)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        e = dict(env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TP_SOCKET_IFNAME="lo",
                 GLOO_SOCKET_IFNAME="lo")
        procs = [harness.Proc("rpc%d" % r, [PY, code, str(r), "3", args.data, str(args.rpc_epochs),
                                             os.path.join(ROOT, "examples", "torch"), str(args.rpc_limit),
                                             str(args.batch), str(args.lr)], cl.dir, env=e) for r in range(3)]
        for p in procs:
            if p.wait(3600) != 0:
                sys.exit("torch_ps: an rpc process failed:\n" + p.stderr())
        out = [[json.loads(line) for line in p.stdout().splitlines() if line.startswith("{")] for p in procs[1:]]
    per_epoch = []
    for rows in out:
        for r in rows:
            if "epoch" in r:
                per_epoch.append(r["epoch_seconds"] * (60000 / 2) / r["samples"])  # scaled to a full epoch
    acc = [r["test_accuracy"] for r in out[0] if "test_accuracy" in r][0]
    print("  rpc: %.2f s per (scaled) epoch, test accuracy %.4f after %d epochs of %d samples" %
          (statistics.mean(per_epoch), acc, args.rpc_epochs, args.rpc_limit), flush=True)
    return statistics.mean(per_epoch), acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rpc-limit", type=int, default=6000)
    ap.add_argument("--rpc-epochs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=1, help="run the rows in turn this many times (medians)")
    ap.add_argument("--batch", type=int, default=64, help="samples a step, per worker (alone: a step)")
    ap.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate, every row (default 2e-3)")
    ap.add_argument("--w1-batch", type=int, default=64, help="the w1 rows' batch per worker (default 64)")
    ap.add_argument("--only", default="alone,alone1,psd,pipe,rpc,w1,w1pipe")
    ap.add_argument("--psd")
    ap.add_argument("--data")
    args = ap.parse_args()
    if args.psd:
        harness.Paths.psd = os.path.abspath(args.psd)
    args.data = os.path.abspath(args.data or harness.Paths.data)
    only = args.only.split(",")
    runs = {"alone": lambda: alone(args), "alone1": lambda: alone(args, threads=1),
            "psd": lambda: through_psd(args), "pipe": lambda: through_psd(args, pipeline=True),
            "rpc": lambda: rpc_ps(args), "w1": lambda: through_psd(args, model="w1", epochs=2, batch=args.w1_batch),
            "w1pipe": lambda: through_psd(args, model="w1", epochs=2, pipeline=True, batch=args.w1_batch)}
    unknown = [k for k in only if k not in runs]
    if unknown:
        sys.exit("torch_ps: unknown rows %s (of %s)" % (", ".join(unknown), ", ".join(runs)))
    order = [k for k in runs if k in only]
    reps = []                                   # one {row: result} per repetition, rows in turn
    for r in range(args.reps):
        if args.reps > 1:
            print("repetition %d of %d" % (r + 1, args.reps), flush=True)
        reps.append({k: runs[k]() for k in order})
    print()
    print("| setup | s/epoch (median) | each repetition | test accuracy (of the median run) |")
    print("|---|---|---|---|")
    res = {}
    for k in order:
        runs_k = sorted((rep[k] for rep in reps), key=lambda v: v[0])
        res[k] = runs_k[(len(runs_k) - 1) // 2]
        print("| %s | %.2f | %s | %.4f |" % (k, res[k][0], ", ".join("%.2f" % rep[k][0] for rep in reps), res[k][1]))

    def ratio(num, den):
        """The median over repetitions of num's time / den's (rows run close together), and each."""
        each = [rep[num][0] / den(rep)[0] for rep in reps]
        return statistics.median(each), ", ".join("%.3f" % x for x in each)

    alones = [k for k in ("alone", "alone1") if k in order]
    for row in ("psd", "pipe"):
        if alones and row in res:
            print("%s (2 workers) / PyTorch alone (the faster row of the repetition), time per epoch: %.3f (%s)" %
                  ((row,) + ratio(row, lambda rep: min((rep[k] for k in alones), key=lambda v: v[0]))))
        if "rpc" in res and row in res:
            print("%s (2 workers) / torch.distributed.rpc PS, time per epoch: %.3f (%s)" %
                  ((row,) + ratio(row, lambda rep: rep["rpc"])))
    for row in ("w1", "w1pipe"):
        if row in res:
            shares = [rep[row][2] / rep[row][0] for rep in reps]
            print("%s, 2 PyTorch workers: %.3f s of %.3f s per epoch inside libpsclient (%.1f%%; each: %s)" %
                  (row, res[row][2], res[row][0], 100 * statistics.median(shares),
                   ", ".join("%.1f%%" % (100 * x) for x in shares)))

if __name__ == "__main__":
    main()
