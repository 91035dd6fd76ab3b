#!/usr/bin/python3
"""dlrm.py - a DLRM-style click-through-rate model trained (a) by PyTorch
alone, (b) by 2 PyTorch workers through psd (one psd, and the model split
over 2 psd) and (c) by PyTorch DistributedDataParallel over gloo with 2
ranks, on the same synthetic click logs, model and settings; test AUC, log
loss and samples per second of each, beside the planted teacher's AUC and
log loss (the best any model can reach on these logs).

    bench/dlrm.py                       # the default run (about 20 minutes on 2 quiet cores, estimated)
    bench/dlrm.py --ids 2000 --train 12000 --test 4000 --ddp-steps 3   # seconds

Arm be (issue 45) is b2 while the job's parts grow from 2 to 3 and 4 and
shrink back (`psctl parts add`, `remove`, one every --move-every seconds,
as many as the run lasts for): its AUC against b2's is what a move costs
the model.

The model: 13 dense features through a bottom MLP 13-64-16, 26 categorical
features each through an embedding of dimension 16 (one table of 26 x IDS
rows, the key of feature f's id i being f x IDS + i), and a top MLP
512-256-1 over the 26 embeddings and the bottom MLP's output concatenated
(432 inputs). Dense part: Adam, its rate falling from --lr to 0 along a
cosine over the pass (psd: lr_schedule=cosine; --constant-lr keeps it);
the table: AdaGrad (lr --table-lr, its accumulator starting at
--table-iacc, 1e-4: a row's first updates are damped until its squared
gradients outweigh that, so that ids seen a few times add less noise; at
10^5 ids and 300,000 samples it raised arm a1's AUC from 0.8479 to
0.8536), rows initialised from normal(0, 0.01).

The click logs (the default: 2,000,000 training and 50,000 test samples a
table size; one pass over 300,000 ended 0.0136-0.0137 below the teacher's
AUC, over 2,000,000 0.007-0.0085: bench/README.md): for each categorical
feature, ids drawn from a Zipf distribution of exponent --zipf over IDS
ids (truncated; the ranks mapped to ids by a permutation of the feature's
own), dense features from normal(0, 1), and each label drawn with the
click probability of a teacher: a model of the same shape with random
weights: He-scaled layers, each hidden unit's bias set so that it is
active on a share --active of the samples (0.97: a nearly linear
teacher, which one pass can approach), its rows from normal(0, 1) shrunk
by (--tail-rank / rank)^0.5 past rank --tail-rank (20), so that the ids a
pass sees too rarely to learn carry little of the signal, its logit scaled
to a standard deviation of --logit-std and shifted to a mean click rate of
about --ctr. The teacher's rows are a hash of (seed, feature, rank), so
a subset costs only its own. Everything comes from --seed; the teacher's
calibration sample, the training logs and the test logs each from a
generator of their own, so the teacher and the test set do not depend on
--train.

The arms, each one pass over the same --train samples in the same order,
batch 256 per process and step (--batch):
  a       PyTorch alone, one process with --threads threads (default 2):
          nn.EmbeddingBag(sparse=True) with torch.optim.Adagrad, Adam for
          the rest;
  a1      the same with 1 thread (not in the default run);
  b       2 worker processes (1 thread each) through one psd in asgd
          (worker k trains samples k, k+2, ...): the table in psd with
          AdaGrad (psd.torch.EmbeddingBag), the dense part through
          psd.torch.Worker with psd's Adam;
  b2      the same with the model split over 2 psd (--server A,B);
  bh      arm b with psd's table_apply = hogwild (its apply threads step
          the table's rows; not in the default run);
  br      arm b with a follower of its psd (replica_of, replication =
          sync: a push is answered once the follower holds it), the
          workers given both (--server LEADER/FOLLOWER); not in the default
          run;
  c       DistributedDataParallel over gloo, 2 ranks (1 thread each), the
          table as an nn.EmbeddingBag with dense gradients, allreduced and
          updated by a dense Adagrad: --ddp-steps steps (40; 0: a pass,
          which takes long), for its samples per second; its AUC is the
          one after those steps. Run at the table sizes up to
          --ddp-max-ids (10^5: 2.6 M rows of 16 float32 a rank).
(a) and (c) evaluate the model they trained; (b) its worker 0 once both
have trained, with the rows and dense part psd holds. Each arm writes its
test predictions to pred-ARM.npy in the logs' directory (removed before it
starts); the driver computes the arm's figures from that file, stops if
they differ from what the arm printed, and stops if two arms' predictions
are bit-identical (one arm credited with another's model); each result
line carries a digest of its predictions (predictions_sha256). Every process runs
with OMP_WAIT_POLICY=PASSIVE (unless set): PyTorch's OpenMP threads spin
otherwise, which made (a) with 2 threads 7x slower than with 1 on this
shared machine.

Prints one JSON line per arm and table size (prefix '{"arm"'), then the
ratios ('{"ratios"'), and a table. Needs the build tree (build/server/psd,
build/client/libpsclient.so.1) or --psd and PSD_CLIENT_LIBRARY.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = "/usr/bin/python3"
NDENSE, NCAT, DIM = 13, 26, 16


# ---- data ---------------------------------------------------------------------------------------


def splitmix64(x):
    """splitmix64's output function of the uint64 array x (wrapping)."""
    import numpy as np
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_CDF = {}


def zipf_ranks(rng, n_ids, s, size):
    """size draws of ranks 0..n_ids-1 with P(r) proportional to (r+1)^-s."""
    import numpy as np
    key = (n_ids, s)
    if key not in _CDF:
        cdf = np.cumsum(np.arange(1, n_ids + 1, dtype=np.float64) ** -s)
        _CDF[key] = cdf / cdf[-1]
    cdf = _CDF[key]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_ids - 1)


class Teacher:
    """The planted model: a DLRM of the student's shape with random
    weights. Its rows are not stored whole: rows(f, ids) makes feature f's
    rows (all ids of the feature from one generator, indexed)."""

    def __init__(self, args, n_ids):
        import torch
        self.args, self.n_ids = args, n_ids
        g = torch.Generator().manual_seed(args.seed)

        def lin(i, o):
            w = torch.randn(o, i, generator=g) * (2.0 / i) ** 0.5
            return w, torch.zeros(o)
        self.bot = [lin(NDENSE, 64), lin(64, DIM)]
        self.top = [lin(DIM * (NCAT + 1), 512), lin(512, 256), lin(256, 1)]
        self.scale, self.shift = 1.0, 0.0

    def rows(self, f, ranks):
        """Feature f's rows of ranks: normal(0, 1) values, each a function
        of (seed, f, rank, position) alone (splitmix64 and Box-Muller), so
        any subset costs only its own; shrunk past the tail rank."""
        import numpy as np
        u, inv = np.unique(ranks, return_inverse=True)
        base = ((np.uint64(self.args.seed) * np.uint64(NCAT) + np.uint64(f)) << np.uint64(40)) + \
            u.astype(np.uint64) * np.uint64(2 * DIM)
        ctr = base[:, None] + np.arange(2 * DIM, dtype=np.uint64)[None, :]
        h = splitmix64(ctr)
        v = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))  # (0, 1)
        u1, u2 = v[:, :DIM], v[:, DIM:]
        normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)
        shrink = np.minimum(1.0, (self.args.tail_rank / (u.astype(np.float64) + 1)) ** 0.5)
        return (normal * (shrink * self.args.emb_scale)[:, None]).astype(np.float32)[inv]

    def logits(self, ranks, dense, chunk=8192):
        import numpy as np
        if len(dense) > chunk:
            return np.concatenate([self.logits(ranks[at:at + chunk], dense[at:at + chunk])
                                   for at in range(0, len(dense), chunk)])
        import torch
        x = torch.from_numpy(dense)
        for i, (w, b) in enumerate(self.bot):
            x = torch.relu(x @ w.T + b)
        e = [torch.from_numpy(self.rows(f, ranks[:, f])) for f in range(NCAT)]
        z = torch.cat([x] + e, 1)
        for i, (w, b) in enumerate(self.top):
            z = z @ w.T + b
            if i < len(self.top) - 1:
                z = torch.relu(z)
        return (z.squeeze(1) * self.scale + self.shift).numpy()

    def calibrate(self, ranks, dense):
        """Sets each hidden unit's bias so that it is active (above 0) on a
        share --active of the samples, then the logit's scale and shift:
        standard deviation --logit-std, mean click rate about --ctr."""
        import numpy as np
        import torch
        x = torch.from_numpy(dense)
        e = [torch.from_numpy(self.rows(f, ranks[:, f])) for f in range(NCAT)]
        for layers in (self.bot, self.top):
            if layers is self.top:
                x = torch.cat([x] + e, 1)
            for i, (w, b) in enumerate(layers):
                pre = x @ w.T
                if layers is self.top and i == len(layers) - 1:
                    break
                b.copy_(-torch.quantile(pre, 1.0 - self.args.active, dim=0))
                x = torch.relu(pre + b)
        z = self.logits(ranks, dense)
        self.scale = self.args.logit_std / float(z.std())
        z = z * self.scale
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (1 / (1 + np.exp(-(z + mid)))).mean() < self.args.ctr:
                lo = mid
            else:
                hi = mid
        self.shift = lo


def make_logs(args, n_ids, out):
    """Writes the train and test logs of table size n_ids under out:
    keys [n, 26] int64 (f x n_ids + id), dense [n, 13] float32, labels [n]
    float32 and, for the test set, the teacher's probabilities. The
    teacher's calibration sample, the training set and the test set each
    come from a generator of their own, so the teacher and the test set
    are the same whatever --train is (runs of different lengths are
    measured against the same teacher on the same test samples)."""
    import numpy as np
    teacher = Teacher(args, n_ids)
    perms = [np.random.default_rng([args.seed, 2, f]).permutation(n_ids) for f in range(NCAT)]

    def draw(stream, n):
        rng = np.random.default_rng([args.seed, 3, n_ids, stream])
        ranks = np.stack([zipf_ranks(rng, n_ids, args.zipf, n) for _ in range(NCAT)], 1)
        return rng, ranks, rng.standard_normal((n, NDENSE), dtype=np.float32)

    _, ranks, dense = draw(2, 20000)
    teacher.calibrate(ranks, dense)
    for name, n, stream in (("train", args.train, 0), ("test", args.test, 1)):
        rng, ranks, dense = draw(stream, n)
        p = 1 / (1 + np.exp(-teacher.logits(ranks, dense).astype(np.float64)))
        y = (rng.random(len(p)) < p).astype(np.float32)
        keys = np.empty(ranks.shape, np.int64)
        for f in range(NCAT):
            keys[:, f] = f * n_ids + perms[f][ranks[:, f]]
        np.save(os.path.join(out, name + "_keys.npy"), keys)
        np.save(os.path.join(out, name + "_dense.npy"), dense)
        np.save(os.path.join(out, name + "_y.npy"), y)
        if name == "test":
            np.save(os.path.join(out, "test_p.npy"), p)


def load(d, name):
    import numpy as np
    return (np.load(os.path.join(d, name + "_keys.npy"), mmap_mode="r"),
            np.load(os.path.join(d, name + "_dense.npy"), mmap_mode="r"),
            np.load(os.path.join(d, name + "_y.npy"), mmap_mode="r"))


def auc(y, score):
    """psd.metrics.auc (the package from this tree): the area under the ROC
    curve, ties counted half; every arm and the driver take it."""
    if os.path.join(ROOT, "python") not in sys.path:
        sys.path.insert(0, os.path.join(ROOT, "python"))
    from psd.metrics import auc as psd_auc
    return psd_auc(y, score)


def logloss(p, y):
    import numpy as np
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(y, np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


# ---- the model ----------------------------------------------------------------------------------


def dlrm(emb, seed):
    """The student: emb maps a flat key tensor (B x 26) with offsets to
    rows [B x 26, 16]."""
    import torch
    import torch.nn as nn

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb
            torch.manual_seed(seed)
            self.bot = nn.Sequential(nn.Linear(NDENSE, 64), nn.ReLU(), nn.Linear(64, DIM), nn.ReLU())
            self.top = nn.Sequential(nn.Linear(DIM * (NCAT + 1), 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                     nn.Linear(256, 1))

        def forward(self, keys, dense):
            b = keys.shape[0]
            flat = keys.reshape(-1)
            offsets = torch.arange(0, flat.numel(), dtype=torch.int64)
            e = self.emb(flat, offsets).view(b, NCAT * DIM)
            return self.top(torch.cat([self.bot(dense), e], 1)).squeeze(1)

    return DLRM()


def pred_file(d, arm):
    return os.path.join(d, "pred-%s.npy" % arm)


def evaluate(model, d, arm=None, batch=4096):
    """The model's test AUC and log loss; with arm, its test predictions
    also go to pred_file(d, arm), from which the driver takes the arm's
    figures (so that no arm can be credited with another's model)."""
    import numpy as np
    import torch
    keys, dense, y = load(d, "test")
    out = []
    with torch.no_grad():
        for at in range(0, len(y), batch):
            k = torch.from_numpy(np.ascontiguousarray(keys[at:at + batch]))
            x = torch.from_numpy(np.ascontiguousarray(dense[at:at + batch]))
            out.append(torch.sigmoid(model(k, x)).numpy())
    p = np.concatenate(out)
    if arm:
        np.save(pred_file(d, arm) + ".tmp.npy", p)
        os.rename(pred_file(d, arm) + ".tmp.npy", pred_file(d, arm))
    return {"test_auc": round(auc(y, p), 5), "test_logloss": round(logloss(p, y), 5)}


# the arms whose workers train through psd: one training path (arm_figures)
PSD_ARMS = {"b", "b2", "bh", "br", "be"}


def arm_figures(d, arm, reported, seen):
    """The test figures of arm from its own predictions file (written by
    its process during this run; the driver removed any earlier one),
    checked against what the process reported. seen maps the digest of
    each earlier arm's predictions to that arm: two different training
    paths cannot give bit-identical predictions, so a repeat means one arm's
    figures were taken from another's model, and the run stops. The arms
    through psd (b, b2, bh) are one training path, the same arithmetic on
    a model placed differently: ASGD there is deterministic given the
    order the pushes arrive in, and a short run can meet the same order in
    two of them, so a repeat among them is only said."""
    import hashlib
    import numpy as np
    f = pred_file(d, arm)
    if not os.path.exists(f):
        sys.exit("dlrm: arm %s wrote no predictions (%s)" % (arm, f))
    p = np.load(f)
    y = np.load(os.path.join(d, "test_y.npy"))
    if p.shape != y.shape:
        sys.exit("dlrm: arm %s: %d predictions for %d test samples" % (arm, len(p), len(y)))
    figs = {"test_auc": round(auc(y, p), 5), "test_logloss": round(logloss(p, y), 5)}
    if figs != {k: reported.get(k) for k in figs}:
        sys.exit("dlrm: arm %s reported %s but its predictions give %s" % (arm, reported, figs))
    digest = hashlib.sha256(np.ascontiguousarray(p).tobytes()).hexdigest()
    if digest in seen and {seen[digest], arm} <= PSD_ARMS:
        print("dlrm: arms %s and %s ended bit for bit alike (their pushes reached psd in the same order)"
              % (seen[digest], arm), file=sys.stderr)
    elif digest in seen:
        sys.exit("dlrm: arms %s and %s have bit-identical test predictions: one's figures come from the other's model"
                 % (seen[digest], arm))
    seen[digest] = arm
    return dict(figs, predictions_sha256=digest[:16])


def batches(d, k, m, batch, steps=0):
    """Worker k of m: its batches (samples k, k+m, ...) in order, as tensors."""
    import numpy as np
    import torch
    keys, dense, y = load(d, "train")
    mine = np.arange(k, len(y), m)
    n = 0
    for at in range(0, len(mine), batch):
        if steps and n == steps:
            return
        idx = mine[at:at + batch]
        yield (torch.from_numpy(keys[idx]), torch.from_numpy(dense[idx]), torch.from_numpy(y[idx]))
        n += 1


def pass_steps(a, m, together):
    """Model updates in one pass over the training logs by m processes of
    a.batch samples a step: every process's steps added (together: psd's
    asgd, a version per push) or one process's (DDP's steps are in step)."""
    import numpy as np
    n = int(np.load(os.path.join(a.data, "train_y.npy"), mmap_mode="r").shape[0])
    steps = [(len(range(k, n, m)) + a.batch - 1) // a.batch for k in range(m)]
    return sum(steps) if together else steps[0]


def cosine(opt, a, m):
    """The dense part's rate from --lr down to 0 along a cosine over a pass
    (psd's lr_schedule=cosine), or None with --constant-lr."""
    import torch
    if a.constant_lr:
        return None
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=pass_steps(a, m, False))


# ---- the arms (each a process of its own) -------------------------------------------------------


def arm_torch(a):
    import torch
    torch.set_num_threads(a.threads)
    n_rows = NCAT * a.n_ids
    emb = torch.nn.EmbeddingBag(n_rows, DIM, mode="sum", sparse=True)
    torch.nn.init.normal_(emb.weight, 0, 0.01)
    model = dlrm(emb, a.seed)
    sparse = torch.optim.Adagrad(emb.parameters(), lr=a.table_lr, initial_accumulator_value=a.table_iacc)
    dense = torch.optim.Adam([p for n, p in model.named_parameters() if not n.startswith("emb.")], lr=a.lr)
    sched = cosine(dense, a, 1)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    t0, n = time.monotonic(), 0
    for keys, x, y in batches(a.data, 0, 1, a.batch):
        sparse.zero_grad()
        dense.zero_grad()
        loss_fn(model(keys, x), y).backward()
        sparse.step()
        dense.step()
        if sched:
            sched.step()
        n += len(y)
        if a.curve and (n // a.batch) % a.curve == 0:
            print("after %d samples: %s" % (n, evaluate(model, a.data)), file=sys.stderr, flush=True)
    secs = time.monotonic() - t0
    return dict(arm=a.arm, samples=n, seconds=round(secs, 3), samples_per_second=round(n / secs, 1),
                **evaluate(model, a.data, a.arm))


def arm_psd(a):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import psd.torch
    torch.set_num_threads(1)
    emb = psd.torch.EmbeddingBag("cat", DIM, mode="sum", init="normal", scale=0.01, seed=a.seed, opt="adagrad",
                                 lr=a.table_lr, iacc=a.table_iacc)
    model = dlrm(emb, a.seed)
    k, m = [int(v) for v in a.shard.split("/")]
    ps = psd.torch.Worker(model, server=a.server, shard=a.shard, wait_notice=False)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    t0, n = time.time(), 0
    it = batches(a.data, k, m, a.batch)
    nxt = next(it, None)
    while nxt is not None:
        keys, x, y = nxt
        nxt = next(it, None)
        ps.zero_grad()
        loss = loss_fn(model(keys, x), y)
        if nxt is not None and not a.no_prefetch:
            emb.prefetch(nxt[0].reshape(-1))  # the step pulls the next batch's rows as it pushes
        loss.backward()  # the rows' gradients wait for the step
        ps.step()
        n += len(y)
    t1 = time.time()
    out = dict(arm=a.arm, samples=n, start=t0, end=t1)
    if k == 0:
        # evaluate once every worker has trained (their done files)
        for j in range(1, m):
            done = os.path.join(a.data, "done.%d" % j)
            deadline = time.monotonic() + 3600
            while not os.path.exists(done):
                if time.monotonic() > deadline:
                    raise SystemExit("worker %d/%d never finished" % (j, m))
                time.sleep(0.01)
        ps.pull()
        out.update(evaluate(model, a.data, a.arm))
    ps.close()
    if k != 0:
        with open(os.path.join(a.data, "done.%d.tmp" % k), "w") as f:
            f.write("done\n")
        os.rename(os.path.join(a.data, "done.%d.tmp" % k), os.path.join(a.data, "done.%d" % k))
    return out


def arm_ddp(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    k, m = [int(v) for v in a.shard.split("/")]
    dist.init_process_group("gloo", init_method="tcp://" + a.server, rank=k, world_size=m)
    emb = torch.nn.EmbeddingBag(NCAT * a.n_ids, DIM, mode="sum", sparse=False)
    torch.manual_seed(a.seed)
    torch.nn.init.normal_(emb.weight, 0, 0.01)
    model = DDP(dlrm(emb, a.seed))
    sparse = torch.optim.Adagrad(model.module.emb.parameters(), lr=a.table_lr, initial_accumulator_value=a.table_iacc)
    dense = torch.optim.Adam([p for n, p in model.module.named_parameters() if not n.startswith("emb.")], lr=a.lr)
    sched = cosine(dense, a, m)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    dist.barrier()
    t0, n = time.time(), 0
    for keys, x, y in batches(a.data, k, m, a.batch, a.ddp_steps):
        sparse.zero_grad()
        dense.zero_grad()
        loss_fn(model(keys, x), y).backward()  # allreduces every gradient, the table's whole
        sparse.step()
        dense.step()
        if sched:
            sched.step()
        n += len(y)
    t1 = time.time()
    out = dict(arm=a.arm, samples=n, start=t0, end=t1)
    if k == 0:
        out.update(evaluate(model.module, a.data, a.arm))
    dist.barrier()
    dist.destroy_process_group()
    return out


# ---- the driver ---------------------------------------------------------------------------------


def start_psd(psd_bin, d, name, a, steps, extra=(), cpus=None):
    port_file = os.path.join(d, name + ".port")
    if os.path.exists(port_file):
        os.unlink(port_file)  # a run's before (--workdir)
    argv = [psd_bin, "--listen", "127.0.0.1:0", "--port-file", port_file, "--mode", "asgd", "--workers", "2",
            "--set", "optimizer=adam", "--set", "lr=%g" % a.lr, "--set", "warmup_versions=0",
            "--set", "heartbeat_timeout=60s"]
    if not a.constant_lr:
        argv += ["--set", "lr_schedule=cosine", "--set", "lr_decay_versions=%d" % steps]
    argv += list(extra)
    err = open(os.path.join(d, name + ".err"), "wb")
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=pin)
    deadline = time.monotonic() + 20
    while True:
        try:
            with open(port_file) as f:
                text = f.read()
            if text.endswith("\n"):
                return p, "127.0.0.1:%d" % int(text)
        except FileNotFoundError:
            pass
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit("dlrm: psd did not start:\n" + open(os.path.join(d, name + ".err")).read())
        time.sleep(0.01)


def run_procs(argvs, d, tag, timeout):
    """Runs the processes together; returns their JSON results (the last
    line of each stdout); ends the program with the stderr of one that fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
    env.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))
    # PyTorch's OpenMP threads spin while they wait for work: on a machine
    # with other work running, arm a with 2 threads was 7x slower than with
    # 1 thread that way (and 1.5x faster with the threads waiting passively)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    procs = []
    for i, argv in enumerate(argvs):
        out = open(os.path.join(d, "%s.%d.out" % (tag, i)), "w+")
        err = open(os.path.join(d, "%s.%d.err" % (tag, i)), "w+")
        procs.append((subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env), out, err))
    results = []
    deadline = time.monotonic() + timeout
    try:
        for p, out, err in procs:
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                sys.exit("dlrm: %s did not finish within %d s" % (tag, timeout))
            err.seek(0)
            out.seek(0)
            if rc != 0:
                sys.exit("dlrm: %s failed (exit %d):\n%s" % (tag, rc, err.read()[-4000:]))
            lines = [ln for ln in out.read().splitlines() if ln.startswith("{")]
            if not lines:
                sys.exit("dlrm: %s printed no result" % tag)
            r = json.loads(lines[-1])
            if r.get("arm") != tag:
                sys.exit("dlrm: %s's process printed the result of arm %r" % (tag, r.get("arm")))
            results.append(r)
    finally:
        for p, out, err in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()
    return results


class Mover(threading.Thread):
    """Arm be: psctl parts add, add, remove, remove, every `every`
    seconds, while the workers train (as many as fit in the run)."""

    def __init__(self, addrs, every, d):
        super().__init__(daemon=True)
        self.addrs, self.every, self.d = addrs, every, d
        self.stop = threading.Event()
        self.done, self.error = [], None

    def run(self):
        psctl = os.environ.get("PSCTL_BIN", os.path.join(ROOT, "build", "psctl", "psctl"))
        for verb, n in (("add", 2), ("add", 3), ("remove", 4), ("remove", 3)):
            if self.stop.wait(self.every):
                return
            argv = [psctl, "--server", ",".join(self.addrs[:n]), "--timeout", "60000", "parts", verb]
            argv += [self.addrs[n]] if verb == "add" else []
            t = time.monotonic()
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
            if r.returncode != 0:
                self.error = "psctl parts %s: %s%s" % (verb, r.stdout, r.stderr)
                return
            self.done.append("%s %d->%d %.1f s" % (verb, n, n + 1 if verb == "add" else n - 1, time.monotonic() - t))


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def combine(results):
    """One arm's figure from its processes' results: samples over the
    time from the first start to the last end."""
    n = sum(r["samples"] for r in results)
    secs = max(r["end"] for r in results) - min(r["start"] for r in results)
    out = dict(samples=n, seconds=round(secs, 3), samples_per_second=round(n / secs, 1))
    out.update({k: v for k, v in results[0].items() if k.startswith("test_")})
    return out


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", default="100000,1000000", help="ids per feature: the table sizes, comma-separated")
    ap.add_argument("--train", type=int, default=2000000, help="training samples (one pass)")
    ap.add_argument("--test", type=int, default=50000, help="test samples")
    ap.add_argument("--arms", default="a,b,b2,c", help="which of a, b, b2, c to run; bh: b with psd's table_apply = hogwild; br: b with a sync "
                    "follower; be: b2 while its parts grow 2 -> 3 -> 4 and shrink back (--move-every)")
    ap.add_argument("--batch", type=int, default=256, help="samples per process and step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (the dense part)")
    ap.add_argument("--table-lr", type=float, default=0.05, help="AdaGrad's learning rate (the table)")
    ap.add_argument("--table-iacc", type=float, default=1e-4,
                    help="AdaGrad's accumulator start (the table; PyTorch's initial_accumulator_value, psd's iacc)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of arm a")
    ap.add_argument("--constant-lr", action="store_true", help="the dense part's rate constant (not a cosine)")
    ap.add_argument("--no-prefetch", action="store_true", help="arms b, b2: backward pushes rows, forward pulls")
    ap.add_argument("--ddp-steps", type=int, default=40, help="steps of arm c (0: a whole pass)")
    ap.add_argument("--ddp-max-ids", type=int, default=100000, help="the largest table size arm c runs at")
    ap.add_argument("--zipf", type=float, default=1.1, help="the ids' Zipf exponent")
    ap.add_argument("--tail-rank", type=float, default=20, help="the teacher's rows shrink past this rank")
    ap.add_argument("--emb-scale", type=float, default=1.0, help="the teacher's rows' standard deviation")
    ap.add_argument("--active", type=float, default=0.97,
                    help="the share of samples a teacher's hidden unit is active on")
    ap.add_argument("--logit-std", type=float, default=2.0, help="the teacher's logit standard deviation")
    ap.add_argument("--ctr", type=float, default=0.25, help="the teacher's mean click rate (about)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--move-every", type=float, default=10.0,
                    help="arm be: seconds between its moves of parts (2 -> 3 -> 4 -> 3 -> 2)")
    ap.add_argument("--psd", default=os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd")))
    ap.add_argument("--curve", type=int, default=0, help="arm a: evaluate every CURVE steps (stderr; slows it)")
    ap.add_argument("--workdir", help="keep the logs and the processes' output here (reused when the same)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds an arm may take")
    ap.add_argument("--follower-cpu", type=int, help="arm br's follower on this CPU alone, and everything else "
                    "(the workers, every psd of every arm) on the other CPUs: the follower as on a machine of its own")
    # a process of one arm (the driver starts them)
    ap.add_argument("--role", choices=("torch", "psd", "ddp"), help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--n-ids", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.role:
        r = {"torch": arm_torch, "psd": arm_psd, "ddp": arm_ddp}[a.role](a)
        print(json.dumps(r), flush=True)
        return

    if a.follower_cpu is not None:
        cpus = os.sched_getaffinity(0)
        if a.follower_cpu not in cpus or len(cpus) < 2:
            sys.exit("dlrm: --follower-cpu %d: not one of this process's CPUs %s, or it has one only"
                     % (a.follower_cpu, sorted(cpus)))
        os.sched_setaffinity(0, cpus - {a.follower_cpu})  # inherited by every other process started here
    arms = [s for s in a.arms.split(",") if s]
    for s in arms:
        if s not in ("a", "a1", "b", "b2", "bh", "br", "be", "c"):
            sys.exit("dlrm: unknown arm %r (a, a1, b, b2, bh, br, c)" % s)
    if any(s in ("b", "b2", "bh", "br", "be") for s in arms) and not os.access(a.psd, os.X_OK):
        sys.exit("dlrm: %s is not an executable psd (build first, or --psd)" % a.psd)
    sizes = [int(v) for v in a.ids.split(",") if v]
    common = (["--no-prefetch"] if a.no_prefetch else []) + (["--constant-lr"] if a.constant_lr else []) + \
        ["--batch", str(a.batch), "--lr", str(a.lr), "--table-lr", str(a.table_lr),
         "--table-iacc", str(a.table_iacc), "--seed", str(a.seed)]
    me = [PY, os.path.abspath(__file__)]
    rows = []
    print("dlrm: %d training and %d test samples, batch %d, load average %s" % (a.train, a.test, a.batch, loadavg()),
          flush=True)
    for n_ids in sizes:
        with tempfile.TemporaryDirectory(prefix="dlrm-") as tmp:
            d = os.path.join(a.workdir, "ids-%d" % n_ids) if a.workdir else tmp
            t = time.monotonic()
            stamp = json.dumps([a.train, a.test, a.zipf, a.tail_rank, a.emb_scale, a.active, a.logit_std, a.ctr,
                                a.seed, n_ids])
            if not a.workdir or not os.path.exists(os.path.join(d, "stamp")) or \
                    open(os.path.join(d, "stamp")).read() != stamp:
                os.makedirs(d, exist_ok=True)
                make_logs(a, n_ids, d)
                with open(os.path.join(d, "stamp"), "w") as f:
                    f.write(stamp)
            import numpy as np
            ty, tp = np.load(os.path.join(d, "test_y.npy")), np.load(os.path.join(d, "test_p.npy"))
            teacher = {"teacher_auc": round(auc(ty, tp), 5), "teacher_logloss": round(logloss(tp, ty), 5),
                       "click_rate": round(float(ty.mean()), 4)}
            print("dlrm: %d ids per feature: logs made in %.1f s; teacher %s" % (n_ids, time.monotonic() - t, teacher),
                  flush=True)
            base = me + ["--data", d, "--n-ids", str(n_ids)] + common
            seen = {}  # digest of an arm's test predictions -> the arm
            for arm in arms:
                la = loadavg()
                if os.path.exists(pred_file(d, arm)):
                    os.unlink(pred_file(d, arm))  # a run's before (--workdir)
                base_arm = base + ["--arm", arm]
                if arm in ("a", "a1"):
                    threads = a.threads if arm == "a" else 1
                    r = run_procs([base_arm + ["--role", "torch", "--threads", str(threads), "--curve", str(a.curve)]],
                                  d, arm, a.timeout)[0]
                elif arm in ("b", "b2", "bh", "br", "be"):
                    for j in range(1, 2):
                        if os.path.exists(os.path.join(d, "done.%d" % j)):
                            os.unlink(os.path.join(d, "done.%d" % j))
                    a.data = d
                    steps = pass_steps(a, 2, True)
                    # bh: arm b with psd's table_apply = hogwild (its apply threads)
                    extra = ("--set", "table_apply=hogwild") if arm == "bh" else ()
                    servers = [start_psd(a.psd, d, "psd%s.%d" % (arm, i), a, steps, extra)
                               for i in range({"b2": 2, "be": 4}.get(arm, 1))]
                    addr = ",".join(s[1] for s in servers[:2])
                    mover = None
                    if arm == "be":  # b2 while its parts grow 2 -> 3 -> 4 and shrink back (issue 45)
                        mover = Mover([s[1] for s in servers], a.move_every, d)
                        mover.start()
                    if arm == "br":  # the follower, which the workers are given after the leader
                        servers.append(start_psd(a.psd, d, "psdbr.follower", a, steps,
                                                 ("--replica-of", servers[0][1]),
                                                 cpus={a.follower_cpu} if a.follower_cpu is not None else None))
                        addr += "/" + servers[1][1]
                    try:
                        r = combine(run_procs([base_arm + ["--role", "psd", "--server", addr, "--shard", "%d/2" % k]
                                               for k in range(2)], d, arm, a.timeout))
                        if mover:
                            mover.stop.set()
                            mover.join()
                            r["moves"] = mover.done
                            if mover.error:
                                raise SystemExit("dlrm: arm be: " + mover.error)
                    finally:
                        for p, _ in servers:
                            p.terminate()
                            p.wait(timeout=30)
                else:
                    if n_ids > a.ddp_max_ids:
                        continue
                    master = "127.0.0.1:%d" % free_port()
                    r = combine(run_procs([base_arm + ["--role", "ddp", "--server", master, "--shard", "%d/2" % k,
                                                   "--ddp-steps", str(a.ddp_steps)] for k in range(2)], d, arm,
                                          a.timeout))
                r.update(arm_figures(d, arm, r, seen))
                r = dict(arm=arm, ids=n_ids, **{k: v for k, v in r.items() if k != "arm"}, **teacher, load=la)
                rows.append(r)
                print(json.dumps(r), flush=True)

    def get(arm, n_ids):
        return next((r for r in rows if r["arm"] == arm and r["ids"] == n_ids), None)

    ratios = {}
    for n_ids in sizes:
        ra, rb, rb2, rbh, rbr, rc = (get(s, n_ids) for s in ("a", "b", "b2", "bh", "br", "c"))
        for name, x, y in (("b/a", rb, ra), ("b2/a", rb2, ra), ("b/c", rb, rc), ("b2/c", rb2, rc), ("bh/b", rbh, rb),
                        ("br/b", rbr, rb), ("be/b2", get("be", n_ids), rb2)):
            if x and y:
                ratios["%s samples/s at %d" % (name, n_ids)] = round(x["samples_per_second"] / y["samples_per_second"],
                                                                    3)
        rbe = get("be", n_ids)
        for name, x, y in (("b-a", rb, ra), ("b2-a", rb2, ra), ("bh-b", rbh, rb), ("br-b", rbr, rb), ("be-b2", rbe, rb2)):
            if x and y:
                ratios["%s AUC at %d" % (name, n_ids)] = round(x["test_auc"] - y["test_auc"], 5)
        for r in (ra, rb, rb2, rbh, rbr):
            if r:
                ratios["teacher-%s AUC at %d" % (r["arm"], n_ids)] = round(r["teacher_auc"] - r["test_auc"], 5)
    print(json.dumps({"ratios": ratios}), flush=True)
    print("\n| ids | arm | samples | samples/s | test AUC | log loss | teacher AUC | teacher log loss | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %s | %d | %.0f | %.4f | %.4f | %.4f | %.4f | %s |" % (
            r["ids"], r["arm"], r["samples"], r["samples_per_second"], r["test_auc"], r["test_logloss"],
            r["teacher_auc"], r["teacher_logloss"], r["load"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
