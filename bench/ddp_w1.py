#!/usr/bin/python3
"""ddp_w1.py - one rank of W1 (or the CNN) trained with PyTorch DistributedDataParallel over gloo, for bench/multihost.py.

    bench/ddp_w1.py --master HOST:PORT --rank K --world M [--model w1|w2] [--epochs 1]
                    [--batch 64] [--lr 2e-3] [--powersgd RANK [--start-powersgd STEP]]
                    [--snapshots N] [--max-seconds S] [--limit N] [--data DIR]

The reference for psworker --model mlp:256,128 (w1; w2: psworker's cnn) in
BSP with M workers: the same model (bench/torch_ref.py's W1: 784-256-128-10,
ReLU, He initialisation; W2: conv 5x5 x10, pool, conv 5x5 x20, pool,
320-50-10, psworker's cnn shape), the same MNIST files and normalisation,
rank K training on samples K, K+M, ... of one shuffle shared by all ranks,
a batch of B per rank per step (psworker --batch B: M x B samples per model
version), Adam with a constant lr (psd: optimizer = adam). DDP averages the
gradients with gloo's allreduce after every backward pass, the same
once-per-step exchange as a BSP round. One thread per rank, as psworker's
one OpenBLAS thread.

--powersgd RANK registers PyTorch's PowerSGD communication hook
(torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook, error feedback
and warm start on, its defaults) with matrix_approximation_rank RANK; it
runs plain allreduce for the first --start-powersgd steps (default: 10% of
the run's steps, at least 2), as PyTorch's documentation advises (the start
of training is the part most hurt by a compressed gradient).

--snapshots N: as psworker's, N times an epoch (after ceil(k x steps / N)
steps) rank 0 keeps a copy of the model with the training time so far;
after training it evaluates each on the test images and prints one JSON
line per copy (snapshot, epoch, step, steps, samples, train_seconds,
test_accuracy, test_loss). --max-seconds S: the ranks stop at the first
copy point after S seconds of training (rank 0's clock, which all ranks
learn by a small allreduce at each point), and take a last copy there.

Prints one JSON object on stdout: train_seconds per epoch (the training
loop only, between barriers, so the slowest rank's time) and, from rank 0,
the test accuracy after the last epoch.
"""

import argparse
import copy
import json
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from torch_ref import W1, W2, evaluate, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--model", choices=("w1", "w2"), default="w1")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--powersgd", type=int, default=0, metavar="RANK",
                    help="PyTorch's PowerSGD hook with this matrix approximation rank (0: plain allreduce)")
    ap.add_argument("--start-powersgd", type=int, default=0, metavar="STEP",
                    help="plain allreduce before this step (default: 10%% of the run's steps, at least 2)")
    ap.add_argument("--snapshots", type=int, default=0, help="model copies per epoch for time to accuracy")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this much training time")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N training samples")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    xtr, ytr = load(a.data, "mnist", "train")
    xte, yte = load(a.data, "mnist", "t10k")
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    dist.init_process_group("gloo", init_method="tcp://" + a.master, rank=a.rank, world_size=a.world)
    model = DistributedDataParallel(W1() if a.model == "w1" else W2())
    steps = -(-len(xtr) // (a.batch * a.world))  # every rank the same number of steps
    start_psgd = None
    if a.powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        start_psgd = a.start_powersgd or max(2, math.ceil(0.1 * steps * a.epochs))
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.powersgd,
                                       start_powerSGD_iter=start_psgd)
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    g = torch.Generator().manual_seed(a.seed)
    points = [math.ceil(k * steps / a.snapshots) for k in range(1, a.snapshots + 1)] if a.snapshots else []
    snaps, seconds, train_t, run_steps, stopped = [], [], 0.0, 0, False
    for epoch in range(1, a.epochs + 1):
        mine = torch.randperm(len(xtr), generator=g)[a.rank::a.world]
        model.train()
        dist.barrier()
        t0 = time.monotonic()
        for i in range(steps):
            idx = mine[i * a.batch:(i + 1) * a.batch]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
            run_steps += 1
            if i + 1 in points:
                now = time.monotonic()
                t = train_t + now - t0
                if a.rank == 0:
                    snaps.append({"epoch": epoch, "step": i + 1, "steps": run_steps,
                                  "samples": run_steps * a.batch, "train_seconds": round(t, 4),
                                  "state": copy.deepcopy(model.module.state_dict())})
                if a.max_seconds:
                    flag = torch.tensor([1.0 if a.rank == 0 and t >= a.max_seconds else 0.0])
                    dist.all_reduce(flag)
                    stopped = flag.item() > 0
                t0 += time.monotonic() - now  # the copy and the check are not training
                if stopped:
                    break
        dist.barrier()
        seconds.append(time.monotonic() - t0)
        train_t += seconds[-1]
        if stopped:
            break
    acc = None
    if a.rank == 0:
        acc = evaluate(model, xte, yte)[0]
        for n, s in enumerate(snaps, 1):
            m = W1() if a.model == "w1" else W2()
            m.load_state_dict(s.pop("state"))
            s["test_accuracy"], s["test_loss"] = evaluate(m, xte, yte)
            print(json.dumps(dict(snapshot=n, **s)), flush=True)
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "train_seconds": seconds, "test_accuracy": acc, "steps": steps,
                      "run_steps": run_steps, "stopped": stopped, "start_powersgd": start_psgd}))


if __name__ == "__main__":
    main()
