"""ctr_wide.py - the click-through job of the chaos test (test_chaos.py), as
program text the tests run with `python3 -c`.

test_tables_kill.py's model (an embedding table of 4 categorical features,
rows of 4 values, AdaGrad; a dense part of 4 weights and a bias) with a
wide part added: one dense weight per hashed feature bucket (2048 of them),
so that the dense tensors (2053 values) are large enough to be split over
2 psd (PROTOCOL.md 6.2: at least 1024 values a part) and each part holds
dense values as well as table rows.

DATA makes the synthetic clicks (a planted model of the same shape; the
same in every worker, every run and the test's own process, which execs it
to know each step's keys). WORKER trains shard K of 2 for a fixed number of
steps; worker K's step i takes batch (2 i + K) mod the number of batches.
The training set is large enough for the chaos test's steps to be one pass
over it: its AUC still rises slowly at the end rather than falling with
overfitting, so it depends little on how the two workers' steps
interleaved, which asgd leaves to chance. It prints "ready" once it has said
hello, waits for its gate (a FIFO the test opens), then "step N T" after
each step, T the machine's monotonic clock when the step's last push was
acknowledged; a step is not started before gate + N x period (period 0:
as fast as it goes), so that a job of a known number of steps lasts at
least steps x period. At the end it writes the file done-K, and worker 0
waits for done-1, pulls the model and prints a JSON line with the test
AUC (psd.metrics.auc) over held-out clicks.
"""

import test_ledger  # the ledger check's replay program and the table's settings

F, V, D, WIDE = 4, 1500, 4, 2048
LAYOUT = [("w", (WIDE,)), ("u", (D,)), ("b", (1,))]
TABLE = test_ledger.TABLE
N_TRAIN, N_TEST = 1500000, 20000  # one pass of 11,718 steps a worker: the chaos test takes fewer

DATA = r"""
import numpy as np

F, V, D, WIDE = %(F)d, %(V)d, %(D)d, %(WIDE)d
N_TRAIN, N_TEST = %(N_TRAIN)d, %(N_TEST)d
rng = np.random.default_rng(4321)  # the same clicks in every worker, run and test
p = 1.0 / np.arange(1, V + 1) ** 1.1
p /= p.sum()
true_rows = rng.normal(0, 1.0, (F * V, D))
true_u = np.array([1.0, -0.5, 0.75, 0.5])
true_bias = rng.normal(0, 0.5, F * V)  # what the wide part can learn
ids = rng.choice(V, size=(N_TRAIN + N_TEST, F), p=p) + np.arange(F) * V
logit = true_rows[ids].sum(1) @ true_u + true_bias[ids].sum(1) - 0.5
y = (rng.random(N_TRAIN + N_TEST) < 1 / (1 + np.exp(-logit))).astype(np.float64)
keys = (ids.astype(np.uint64) * np.uint64(2654435761)) ^ np.uint64(0x5eed)  # hashed features
buckets = (keys %% np.uint64(WIDE)).astype(np.int64)


def batch_of(k, step, batch):
    nb = N_TRAIN // batch
    lo = ((2 * step + k) %% nb) * batch
    return slice(lo, lo + batch)
""" % dict(F=F, V=V, D=D, WIDE=WIDE, N_TRAIN=N_TRAIN, N_TEST=N_TEST)

WORKER = DATA + r"""
import json, os, sys, time
import psd
import psd.metrics

addr, k, steps, batch, period, gate, done = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                             float(sys.argv[5]), sys.argv[6], sys.argv[7])
c = psd.Client(%(LAYOUT)r, server=addr, shard="%%d/2" %% k, connect_s=30, reconnect_s=120, timeout_ms=60000)
c.params[:] = [0.0] * WIDE + [0.1, 0.1, 0.1, 0.1, 0.0]  # w, u, b: the first worker's values
c.connect()
c.table("emb", D, **%(TABLE)r)
c.pull()
print("ready", flush=True)
with open(gate) as f:  # a FIFO: blocks until the test opens it and closes it
    f.read()
t0 = time.monotonic()
for step in range(steps):
    wait = t0 + step * period - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    sl = batch_of(k, step, batch)
    kb, yb, bk = keys[sl], y[sl], buckets[sl]
    rows = c.pull_rows("emb", kb.reshape(-1)).reshape(batch, F, D).astype(np.float64)
    w = c.params[:WIDE].astype(np.float64)
    u, b = c.params[WIDE:WIDE + D].astype(np.float64), float(c.params[WIDE + D])
    s = rows.sum(1)
    q = 1 / (1 + np.exp(-(s @ u + w[bk].sum(1) + b)))
    g = (q - yb) / batch
    c.push_rows("emb", kb.reshape(-1), np.repeat((g[:, None] * u[None, :])[:, None, :], F, 1).reshape(-1, D))
    gw = np.zeros(WIDE)
    np.add.at(gw, bk.reshape(-1), np.repeat(g, F))
    c.grads[:WIDE] = gw
    c.grads[WIDE:WIDE + D] = (g[:, None] * s).sum(0)
    c.grads[WIDE + D] = g.sum()
    c.pushpull()
    print("step", step + 1, time.monotonic(), flush=True)
open(done %% k, "w").close()
res = {"worker": k, "reconnects": c.reconnects, "seconds": time.monotonic() - t0}
if k == 0:
    deadline = time.monotonic() + 600
    while not os.path.exists(done %% 1):  # the other worker's last push acknowledged
        if time.monotonic() > deadline:
            sys.exit("worker 1 did not finish within 600 s")
        time.sleep(0.05)
    c.pull()
    kt, yt, bt = keys[N_TRAIN:], y[N_TRAIN:], buckets[N_TRAIN:]
    rows = c.pull_rows("emb", kt.reshape(-1)).reshape(N_TEST, F, D).astype(np.float64)
    w = c.params[:WIDE].astype(np.float64)
    score = rows.sum(1) @ c.params[WIDE:WIDE + D].astype(np.float64) + w[bt].sum(1) + float(c.params[WIDE + D])
    res["auc"] = psd.metrics.auc(yt, score)
    res["planted_auc"] = psd.metrics.auc(yt, true_rows[ids[N_TRAIN:]].sum(1) @ true_u
                                         + true_bias[ids[N_TRAIN:]].sum(1))
print(json.dumps(res), flush=True)
c.close()
""" % dict(LAYOUT=LAYOUT, TABLE=TABLE)

# The replay of the chaos test's ledger check (test_ledger.REPLAY, one
# ledger file a part) for this model.
REPLAY = test_ledger.replay_program(LAYOUT, [0.0] * WIDE + [0.1] * D + [0.0], TABLE, D)
