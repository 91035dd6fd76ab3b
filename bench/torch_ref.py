#!/usr/bin/python3
"""torch_ref.py - the reference: the same workload trained by PyTorch alone,
in one process, for the time-to-accuracy benchmark (bench/tta.py).

    bench/torch_ref.py --workload w1|w2 --dataset mnist|fashion-mnist
                       [--epochs N] [--optimizer adam|sgd] [--lr LR] [--momentum M]
                       [--schedule cosine|constant] [--batch 64] [--threads 2] [--data DIR]

Prints one JSON line per epoch: epoch, train_seconds (training only, the
evaluation excluded), test_accuracy, test_loss, train_loss. Uses Debian's
python3-torch (PyTorch 1.13 on OpenBLAS) and reads the same IDX files as
psworker, normalised the same way, with the package psd's loader (psd.mnist,
from python/ beside this folder: it needs the built libpsclient, which the
package loads).
"""

import argparse
import json
import math
import os
import sys
import time

# Debian's PyTorch runs its intra-op threads (--threads) on top of OpenBLAS,
# which by default starts its own thread per core inside each of them: on 2
# cores W1 then took 5 s per epoch instead of 1. One OpenBLAS thread per
# PyTorch thread is the tuned setting; it must be set before OpenBLAS loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from psd import mnist  # noqa: E402


def load(data, name, split):
    """The data set name's split as tensors: images [N, 1, 28, 28], normalised
    as psworker does (psd.mnist), and labels."""
    try:
        x, y = mnist.load(data, split, dataset=name)
    except mnist.MnistError as e:
        sys.exit("torch_ref: %s (run scripts/setup.sh)" % e)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def evaluate(model, xte, yte):
    """model's test accuracy and mean loss on (xte, yte), in batches of 1000."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(xte[i:i + 1000]) for i in range(0, len(xte), 1000)])
    return (out.argmax(1) == yte).float().mean().item(), F.cross_entropy(out, yte).item()


class W1(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)
        for fc in (self.fc1, self.fc2, self.fc3):  # He initialisation, as psworker's mlp
            nn.init.kaiming_normal_(fc.weight, nonlinearity="relu")
            nn.init.zeros_(fc.bias)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class W2(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
        self.fc1, self.fc2 = nn.Linear(320, 50), nn.Linear(50, 10)
        self.p = dropout

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2)).flatten(1)
        x = F.dropout(x, self.p, self.training)
        x = F.dropout(F.relu(self.fc1(x)), self.p, self.training)
        return self.fc2(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=("w1", "w2"), default="w1")
    ap.add_argument("--dataset", choices=tuple(mnist.STATS), default="mnist")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, a.dataset, "train")
    xte, yte = load(a.data, a.dataset, "t10k")
    model = W1() if a.workload == "w1" else W2(a.dropout)
    if a.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    steps = math.ceil(len(xtr) / a.batch)
    total = steps * a.epochs
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total) if a.schedule == "cosine" else None)
    train_time = 0.0
    for epoch in range(1, a.epochs + 1):
        model.train()
        perm = torch.randperm(len(xtr))
        t0 = time.perf_counter()
        loss_sum = 0.0
        for i in range(steps):
            idxs = perm[i * a.batch:(i + 1) * a.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idxs]), ytr[idxs])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            loss_sum += loss.item() * len(idxs)
        train_time += time.perf_counter() - t0
        acc, tl = evaluate(model, xte, yte)
        print(json.dumps({"epoch": epoch, "train_seconds": round(train_time, 4), "test_accuracy": acc,
                          "test_loss": tl, "train_loss": loss_sum / len(xtr)}), flush=True)


if __name__ == "__main__":
    main()
