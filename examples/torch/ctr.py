#!/usr/bin/python3
"""ctr.py - a small click-through-rate model trained by N workers through
psd: its embedding tables (one per categorical feature, rows addressed by
the feature's raw id, no vocabulary) live in psd as psd.torch.Embedding
tables with their own AdaGrad, its dense part (an MLP over the embeddings
and the dense features) goes through psd.torch.Worker, both in one step.

The click logs are synthetic and reproducible from --seed: categorical ids
drawn from Zipf distributions (exponent --zipf) over --ids ids per feature,
dense features from a normal distribution, and labels drawn from a planted
teacher model of the same form (its own embeddings and a linear read-out),
so the best test AUC any model can reach (the teacher's) is known and
printed beside the model's.

One process per worker:
    psd --mode asgd --workers 2 --set optimizer=adam --set lr=0.002 &
    examples/torch/ctr.py --server 127.0.0.1:7000 --shard 0/2 &
    examples/torch/ctr.py --server 127.0.0.1:7000 --shard 1/2
Each worker trains its share of the samples (every M-th, from its K-th);
the last line on stdout is a JSON summary: the test AUC and log loss of the
model (after the worker's last step) and of the teacher, samples per second.
"""

import argparse
import json
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import psd.torch  # noqa: E402
from psd.metrics import auc  # noqa: E402


def click_logs(n, args, seed):
    """n samples: ids [n, F], dense [n, D], labels [n], the teacher's
    click probabilities [n]. The teacher comes from args.seed alone."""
    teacher = np.random.default_rng(args.seed)
    emb = teacher.normal(0, 1.0, (args.features, args.ids, args.dim)).astype(np.float32)
    read = teacher.normal(0, 0.5, (args.features, args.dim)).astype(np.float32)
    wd = teacher.normal(0, 0.5, args.dense).astype(np.float32)
    rng = np.random.default_rng(seed)
    ids = (rng.zipf(args.zipf, (n, args.features)) - 1) % args.ids
    dense = rng.normal(0, 1, (n, args.dense)).astype(np.float32)
    logit = dense @ wd - 0.5
    for f in range(args.features):
        logit += (emb[f, ids[:, f]] * read[f]).sum(1)
    p = 1 / (1 + np.exp(-logit))
    y = (rng.random(n) < p).astype(np.float32)
    return ids.astype(np.int64), dense, y, p


def logloss(p, y):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


class CTR(nn.Module):
    def __init__(self, args):
        super().__init__()
        # one table per feature; the keys are the raw ids
        self.tables = nn.ModuleList(
            psd.torch.Embedding("c%d" % f, args.dim, init="normal", scale=0.01, seed=f, opt="adagrad",
                                lr=args.table_lr) for f in range(args.features))
        torch.manual_seed(args.seed)
        self.mlp = nn.Sequential(nn.Linear(args.features * args.dim + args.dense, 32), nn.ReLU(),
                                 nn.Linear(32, 1))

    def forward(self, ids, dense):
        e = [t(ids[:, f]) for f, t in enumerate(self.tables)]
        return self.mlp(torch.cat(e + [dense], 1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=os.environ.get("PSD_SERVER", "127.0.0.1:7000"))
    ap.add_argument("--shard", default="0/1", help="K/M, or auto (from the launcher's environment)")
    ap.add_argument("--samples", type=int, default=200000, help="training samples in all")
    ap.add_argument("--test", type=int, default=20000, help="test samples")
    ap.add_argument("--features", type=int, default=4, help="categorical features")
    ap.add_argument("--dense", type=int, default=4, help="dense features")
    ap.add_argument("--ids", type=int, default=100000, help="ids per categorical feature")
    ap.add_argument("--zipf", type=float, default=1.1, help="the ids' Zipf exponent")
    ap.add_argument("--dim", type=int, default=8, help="embedding dimension")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--table-lr", type=float, default=0.05, help="the tables' AdaGrad learning rate")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    model = CTR(args)
    ps = psd.torch.Worker(model, server=args.server, shard=args.shard)
    k, m = ps.client.shard
    ids, dense, y, _ = click_logs(args.samples, args, seed=args.seed + 1)
    mine = np.arange(k, args.samples, m)
    loss_fn = nn.BCEWithLogitsLoss()
    t0 = time.monotonic()
    trained = 0
    for at in range(0, len(mine), args.batch):
        idx = mine[at:at + args.batch]
        ps.zero_grad()
        loss = loss_fn(model(torch.from_numpy(ids[idx]), torch.from_numpy(dense[idx])), torch.from_numpy(y[idx]))
        loss.backward()  # the rows' gradients wait for the step
        ps.step()        # pushes them, then the MLP's; its new parameters come back
        trained += len(idx)
        ps.progress(0, loss.item() * len(idx), len(idx))
    seconds = time.monotonic() - t0

    tids, tdense, ty, tp = click_logs(args.test, args, seed=args.seed + 2)
    ps.pull()
    with torch.no_grad():
        score = torch.sigmoid(model(torch.from_numpy(tids), torch.from_numpy(tdense))).numpy()
    summary = {"shard": "%d/%d" % (k, m), "samples": trained, "samples_per_second": round(trained / seconds, 1),
               "test_auc": round(auc(ty, score), 4), "test_logloss": round(logloss(score, ty), 4),
               "teacher_auc": round(auc(ty, tp), 4), "teacher_logloss": round(logloss(tp, ty), 4),
               "version": ps.version}
    ps.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
