#!/usr/bin/python3
"""ddp_w1.py - one rank of W1 trained with PyTorch DistributedDataParallel over gloo, for bench/multihost.py.

    bench/ddp_w1.py --master HOST:PORT --rank K --world M [--epochs 1] [--batch 64]
                    [--lr 2e-3] [--limit N] [--data DIR]

The reference for psworker --model mlp:256,128 in BSP with M workers: the
same model (bench/torch_ref.py's W1: 784-256-128-10, ReLU, He
initialisation), the same MNIST files and normalisation, rank K training on
samples K, K+M, ... of one shuffle shared by all ranks, a batch of B per rank
per step (psworker --batch B: M x B samples per model version), Adam with a
constant lr (psd: optimizer = adam). DDP averages the gradients with gloo's
allreduce after every backward pass, the same once-per-step exchange as a
BSP round. One thread per rank, as psworker's one OpenBLAS thread.

Prints one JSON object on stdout: train_seconds per epoch (the training
loop only, between barriers, so the slowest rank's time) and, from rank 0,
the test accuracy after the last epoch.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from torch_ref import W1, evaluate, load  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--master", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
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
    model = DistributedDataParallel(W1())
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    g = torch.Generator().manual_seed(a.seed)
    seconds = []
    for epoch in range(a.epochs):
        mine = torch.randperm(len(xtr), generator=g)[a.rank::a.world]
        steps = -(-len(xtr) // (a.batch * a.world))  # every rank the same number of steps
        model.train()
        dist.barrier()
        t0 = time.monotonic()
        for i in range(steps):
            idx = mine[i * a.batch:(i + 1) * a.batch]
            opt.zero_grad()
            F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        dist.barrier()
        seconds.append(time.monotonic() - t0)
    acc = None
    if a.rank == 0:
        acc = evaluate(model, xte, yte)[0]
    dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "train_seconds": seconds, "test_accuracy": acc, "steps": steps}))


if __name__ == "__main__":
    main()
