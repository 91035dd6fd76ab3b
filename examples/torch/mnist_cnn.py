#!/usr/bin/python3
"""mnist_cnn.py - the classic PyTorch MNIST example (conv 1->10 5x5, conv
10->20 5x5 with dropout, fc 320->50, fc 50->10) trained by N workers
through psd with psd.torch.

By hand, one process per worker:
    examples/torch/mnist_cnn.py --server 127.0.0.1:7000 --shard 0/2 &
    examples/torch/mnist_cnn.py --server 127.0.0.1:7000 --shard 1/2
Under a launcher the shard comes from its environment (--shard auto, the
default when one is found): mpirun -n 2 ..., srun -n 2 ..., or
torchrun-style variables (RANK, WORLD_SIZE; torchrun --nproc_per_node 2 ...).

psd holds the model and its optimizer, e.g.
    psd --mode asgd --workers 2 --set optimizer=adam --set lr=0.002
(the recommended settings of docs/settings.md, 99.04-99.11% in 15 epochs: lr 0.001
along a cosine over 56250 versions, no warm-up, --batch 16 --epochs 15)
The last line on stdout is a JSON summary (test accuracy, seconds per epoch).
"""

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import psd.torch  # noqa: E402
from psd import mnist  # noqa: E402

LAUNCHERS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", "JOB_COMPLETION_INDEX")


class Net(nn.Module):
    """The network of PyTorch's examples/mnist (its 2018 form)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class W1(nn.Module):
    """psworker's mlp:256,128 (784-256-128-10), the same tensor names, shapes
    and order (fc1.weight [256, 784], fc1.bias, ...), so a C psworker and
    this script can train one model together."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)
        for fc in (self.fc1, self.fc2, self.fc3):  # He initialisation, as psworker's
            nn.init.kaiming_normal_(fc.weight, nonlinearity="relu")
            nn.init.zeros_(fc.bias)

    def forward(self, x):
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc3(F.relu(self.fc2(x))), dim=1)


def load(data, split, limit):
    """MNIST from data/mnist as tensors: images [N, 1, 28, 28] normalised, labels."""
    try:
        x, y = mnist.load(data, split, limit)
    except mnist.MnistError as e:
        raise SystemExit("mnist_cnn.py: %s" % e)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


def evaluate(model, tx, ty):
    model.eval()
    with torch.no_grad():
        out = model(tx)
        loss = F.nll_loss(out, ty).item()
        acc = (out.argmax(1) == ty).float().mean().item()
    model.train()
    return acc, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=os.environ.get("PSD_SERVER", "127.0.0.1:7000"))
    ap.add_argument("--shard", default=None, help="K/M or auto (default: auto under a launcher, else 0/1)")
    ap.add_argument("--data", default=os.environ.get("PSD_DATA_DIR", "data"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="samples per step on this worker")
    ap.add_argument("--limit", type=int, default=None, help="use the first N training samples")
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wire", default="f32", choices=("f32", "bf16"))
    ap.add_argument("--model", default="cnn", choices=("cnn", "w1"),
                    help="cnn: the network above; w1: psworker's mlp:256,128, to train beside psworkers")
    ap.add_argument("--pipeline", "--overlap", action="store_true",
                    help="asgd, ssp: compute the next batch while the last gradient travels (psd.torch "
                         "pipeline=True: each gradient one step staler)")
    args = ap.parse_args()
    shard = args.shard or ("auto" if any(os.environ.get(v) for v in LAUNCHERS) else "0/1")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)                 # the same initial model on every worker
    model = Net() if args.model == "cnn" else W1()
    # wait_notice: a step that waits for psd over 2 s says so on stderr, and for
    # whom ("worker 0/2: waiting 12 s for psd: round 0 waits for shard 1/2 (never joined)")
    ps = psd.torch.Worker(model, server=args.server, shard=shard, wire=args.wire, pipeline=args.pipeline,
                          wait_notice=True)
    k, m = ps.client.shard
    torch.manual_seed(args.seed * 1000 + k)      # but its own dropout masks
    x, y = load(args.data, "train", args.limit)
    n_all = len(x)
    x, y = x[k::m], y[k::m]
    tx, ty = load(args.data, "t10k", args.test_limit)
    # as psworker: ceil((N / M) / batch) steps, alike on every worker (a bsp
    # round wants a push from each), the last one maybe smaller
    steps = -(-(n_all // m) // args.batch)
    epochs = []
    for epoch in range(1, args.epochs + 1):
        t0, c0 = time.monotonic(), time.process_time()
        order = torch.randperm(len(x))
        loss_sum, comm = 0.0, 0.0             # comm: seconds inside the library (and waiting on psd)
        for s in range(steps):
            i = order[s * args.batch:min((s + 1) * args.batch, n_all // m)]
            xb, yb = x[i], y[i]
            ps.zero_grad()
            loss = F.nll_loss(model(xb), yb)
            loss.backward()
            lv = loss.item()
            tc = time.monotonic()
            ps.step()                            # gradients to psd, its parameters back
            ps.progress(epoch - 1, lv * len(yb), len(yb))  # psd hears of it every second
            comm += time.monotonic() - tc
            loss_sum += lv
        samples = n_all // m
        tc = time.monotonic()
        ps.finish()                              # a pipelined step in flight: the newest parameters
        comm += time.monotonic() - tc
        secs, cpu = time.monotonic() - t0, time.process_time() - c0
        acc, tloss = evaluate(model, tx, ty)
        ps.report(epoch, loss_sum / steps, accuracy=acc, test_loss=tloss, samples=epoch * samples,
                  rate=samples / secs)
        epochs.append(secs)
        print(json.dumps({"epoch": epoch, "epoch_seconds": round(secs, 3), "library_seconds": round(comm, 3),
                          "cpu_seconds": round(cpu, 3),
                          "train_loss": round(loss_sum / steps, 5),
                          "test_accuracy": acc, "version": ps.version}), flush=True)
    print(json.dumps({"shard": "%d/%d" % (k, m), "mode": ps.mode, "epochs": args.epochs, "test_accuracy": acc,
                      "test_loss": tloss, "seconds_per_epoch": round(sum(epochs) / len(epochs), 3),
                      "version": ps.version, "reconnects": ps.client.reconnects}))
    ps.close()


if __name__ == "__main__":
    main()
