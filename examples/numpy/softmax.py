#!/usr/bin/python3
"""softmax.py - softmax regression on MNIST written in plain NumPy, trained
through psd with the Python package psd.

    examples/numpy/softmax.py --server 127.0.0.1:7000 --shard 0/2 [--epochs 3]
                              [--data data] [--limit N] [--test-limit N] [--batch 64]
                              [--plan [--seed S]]

Every worker of the job runs this with its own --shard K/M (or --shard auto
under mpirun, srun or torchrun). psd applies the updates with its own
optimizer (psd --set optimizer=adam --set lr=0.002, say). The last line on
stdout is a JSON summary with the test accuracy.

--plan (psd in bsp): the job follows psd's plan instead of each worker
counting its own steps: --epochs passes over the whole training set, a
global batch of --batch samples per worker in each round, in an order drawn
from --seed. psd tells each worker its samples of every round, shares a
lost worker's among the others, lets a restarted one pick up where the job
stands, and ends every worker at the plan's last round.
"""

import argparse
import json
import os
import time

import numpy as np

import psd
from psd import mnist


def load(data, split, limit):
    """MNIST from data/mnist: rows of 784 normalised pixels, and the labels."""
    try:
        x, y = mnist.load(data, split, limit)
    except mnist.MnistError as e:
        raise SystemExit("softmax.py: %s" % e)
    return x.reshape(len(x), -1), y


def softmax_step(W, b, gW, gb, x, y):
    """Writes the mean gradient of the cross-entropy over (x, y) into gW and
    gb (the pushed vector's views) and returns the summed loss."""
    z = x @ W + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(y))
    loss_sum = float(-np.log(p[rows, y] + 1e-12).sum())
    p[rows, y] -= 1.0
    p /= len(y)
    np.matmul(x.T, p, out=gW)                   # the gradient, straight into the pushed vector
    gb[:] = p.sum(axis=0)
    return loss_sum


def planned(ps, args, x, y, tx, ty):
    """Trains by psd's plan to its end; returns the last test accuracy."""
    W, b = ps.tensor("W"), ps.tensor("b")
    gW, gb = ps.grad("W"), ps.grad("b")
    k, m = ps.shard
    epoch, loss_sum, n, acc = None, 0.0, 0, float("nan")

    def epoch_done():
        acc = float(((tx @ W + b).argmax(axis=1) == ty).mean())
        ps.report(epoch + 1, loss_sum / max(n, 1), accuracy=acc, samples=n)
        print("worker %d/%d: epoch %d loss %.4f test accuracy %.4f (planned rounds)"
              % (k, m, epoch + 1, loss_sum / max(n, 1), acc), flush=True)
        return acc

    for idx in ps.plan_batches(len(x)):        # this worker's samples of the round
        e = ps.plan_slice().epoch
        if epoch is not None and e != epoch:
            acc = epoch_done()
            loss_sum, n = 0.0, 0
        epoch = e
        if len(idx):
            step_loss = softmax_step(W, b, gW, gb, x[idx], y[idx])
        else:                                   # a round too small to share
            step_loss = 0.0
            ps.grads[:] = 0.0
        loss_sum += step_loss
        n += len(idx)
        ps.pushpull()                           # the reply says the next round's samples
        if len(idx):
            ps.progress(epoch, step_loss, len(idx))
    if epoch is not None and n:
        acc = epoch_done()
    return acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=os.environ.get("PSD_SERVER", "127.0.0.1:7000"))
    ap.add_argument("--shard", default="0/1", help="K/M, or auto (from mpirun, srun or torchrun)")
    ap.add_argument("--data", default=os.environ.get("PSD_DATA_DIR", "data"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--test-limit", type=int, default=None)
    ap.add_argument("--plan", action="store_true", help="bsp: follow psd's plan of the job (see above)")
    ap.add_argument("--seed", type=int, default=1, help="the plan's order of the samples (with --plan)")
    args = ap.parse_args()

    ps = psd.Client([("W", (784, 10)), ("b", (10,))], server=args.server, shard=args.shard)
    k, m = ps.shard
    x, y = load(args.data, "train", args.limit)
    n_all = len(x)
    tx, ty = load(args.data, "t10k", args.test_limit)
    rng = np.random.default_rng(1)
    ps.tensor("W")[:] = rng.normal(0, 0.01, (784, 10))  # the initial model, if we are first
    # a step that waits for psd over 2 s says so on stderr, and for whom
    # ("worker 0/2: waiting 12 s for psd: round 0 waits for shard 1/2 (never joined)")
    notice = psd.WaitNotice(ps, prefix="worker %d/%d: " % (k, m))
    if args.plan:
        # the whole training set on every worker: psd says which samples
        ps.plan_set(args.epochs, n_all, args.batch * m, args.seed)
        ps.connect()
        if ps.plan() is None:
            raise SystemExit("softmax.py: --plan needs psd in bsp (psd runs %s)" % ps.mode)
        t0 = time.monotonic()
        with notice:
            acc = planned(ps, args, x, y, tx, ty)
        print(json.dumps({"shard": "%d/%d" % (k, m), "epochs": ps.plan().epochs, "test_accuracy": acc,
                          "version": ps.version, "mode": ps.mode, "plan_done": ps.plan_done(),
                          "seconds": round(time.monotonic() - t0, 3)}))
        ps.close()
        return
    x, y = x[k::m], y[k::m]                      # this worker's shard
    ps.connect()
    W, b = ps.tensor("W"), ps.tensor("b")        # views: psd's values land in them
    gW, gb = ps.grad("W"), ps.grad("b")
    steps = (n_all // m) // args.batch          # alike on every worker (a bsp round wants each)
    t0 = time.monotonic()
    notice.start()
    for epoch in range(1, args.epochs + 1):
        order = np.random.default_rng(epoch * 1000 + k).permutation(len(x))
        loss_sum = 0.0
        for s in range(steps):
            i = order[s * args.batch:(s + 1) * args.batch]
            step_loss = softmax_step(W, b, gW, gb, x[i], y[i]) / len(i)
            loss_sum += step_loss
            ps.pushpull()
            ps.progress(epoch - 1, step_loss * len(i), len(i))  # psd hears of it every second
        acc = float(((tx @ W + b).argmax(axis=1) == ty).mean())
        ps.report(epoch, loss_sum / steps, accuracy=acc, samples=epoch * steps * args.batch)
        print("worker %d/%d: epoch %d loss %.4f test accuracy %.4f" % (k, m, epoch, loss_sum / steps, acc),
              flush=True)
    notice.stop()
    print(json.dumps({"shard": "%d/%d" % (k, m), "epochs": args.epochs, "test_accuracy": acc,
                      "version": ps.version, "mode": ps.mode, "seconds": round(time.monotonic() - t0, 3)}))
    ps.close()


if __name__ == "__main__":
    main()
