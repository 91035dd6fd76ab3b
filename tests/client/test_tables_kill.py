"""test_tables_kill.py - kill -9 of psd in the middle of a table training job.

Two worker processes train a small click-through-rate model through psd
(ssp, staleness 3, so both are mid-run together): an embedding table of 4 categorical features (rows of 4 values,
AdaGrad) and a dense part (4 weights and a bias), on synthetic clicks drawn
from a planted model of the same shape. Mid-run the workers are stopped
(SIGSTOP), psd is killed with SIGKILL and restarted on its port from its
state dir. Before any worker pushes again:

- the tables psd restored (psctl save) equal the weights of the checkpoint
  it loaded, read from the checkpoint file itself, bit for bit, key by key;
- a checkpoint psd then writes holds the same table section (keys,
  weights, optimizer state) as the one it loaded, byte for byte.

Then the workers go on (SIGCONT): they reconnect by themselves, declare the
table again and finish their pass; the job's test AUC is within 0.01 of an
uninterrupted run's with the same seed, and both are well above chance.
"""

import json
import os
import re
import signal
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

STEPS = 300  # per worker: one pass over its shard
BATCH = 128
CKPT_EVERY = "100ms"
PACE_S = 0.005  # a worker's step takes at least this long, so the test finds it mid-run

# One worker: shard K of 2 of the synthetic clicks, a pass of STEPS batches;
# prints "step N" as it goes and, worker 0, a JSON line with the test AUC.
WORKER = r"""
import json, sys, time
import numpy as np
import psd

addr, k, steps, batch, pace = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
F, V, D = 4, 1500, 4
rng = np.random.default_rng(1234)  # the same data in every worker and run
p = 1.0 / np.arange(1, V + 1) ** 1.1
p /= p.sum()
true_rows = rng.normal(0, 1.0, (F * V, D))
true_u = np.array([1.0, -0.5, 0.75, 0.5])
n_train, n_test = 2 * steps * batch, 8000
ids = rng.choice(V, size=(n_train + n_test, F), p=p) + np.arange(F) * V
logit = true_rows[ids].sum(1) @ true_u - 0.5
y = (rng.random(n_train + n_test) < 1 / (1 + np.exp(-logit))).astype(np.float64)
keys = (ids.astype(np.uint64) * np.uint64(2654435761)) ^ np.uint64(0x5eed)  # hashed features

c = psd.Client([("u", (D,)), ("b", (1,))], server=addr, shard="%d/2" % k, connect_s=30, reconnect_s=120,
               timeout_ms=60000)
c.params[:] = [0.1, 0.1, 0.1, 0.1, 0.0]  # the first worker's values start the model
c.connect()
c.table("emb", D, init="normal", scale=0.05, seed=9, opt="adagrad", lr=0.1)
c.pull()
for step in range(steps):
    lo = (2 * step + k) * batch
    kb, yb = keys[lo:lo + batch], y[lo:lo + batch]
    rows = c.pull_rows("emb", kb.reshape(-1)).reshape(batch, F, D).astype(np.float64)
    u, b = c.params[:D].astype(np.float64), float(c.params[D])
    s = rows.sum(1)
    q = 1 / (1 + np.exp(-(s @ u + b)))
    g = (q - yb) / batch
    c.push_rows("emb", kb.reshape(-1), np.repeat((g[:, None] * u[None, :])[:, None, :], F, 1).reshape(-1, D))
    c.grads[:D] = (g[:, None] * s).sum(0)
    c.grads[D] = g.sum()
    c.pushpull()
    print("step", step + 1, flush=True)
    time.sleep(pace)
print(json.dumps({"worker": k, "reconnects": c.reconnects}), flush=True)
if k == 0:
    kt, yt = keys[n_train:], y[n_train:]
    rows = c.pull_rows("emb", kt.reshape(-1)).reshape(n_test, F, D).astype(np.float64)
    score = rows.sum(1) @ c.params[:D].astype(np.float64) + float(c.params[D])
    order = np.argsort(score, kind="stable")
    ranks = np.empty(n_test)
    ranks[order] = np.arange(1, n_test + 1)
    npos = yt.sum()
    auc = (ranks[yt == 1].sum() - npos * (npos + 1) / 2) / (npos * (n_test - npos))
    best = true_rows[ids[n_train:]].sum(1) @ true_u
    order = np.argsort(best, kind="stable")
    ranks[order] = np.arange(1, n_test + 1)
    planted = (ranks[yt == 1].sum() - npos * (npos + 1) / 2) / (npos * (n_test - npos))
    print(json.dumps({"auc": auc, "planted_auc": planted, "reconnects": c.reconnects}), flush=True)
c.close()
"""


def start_workers(cl, addr):
    env = dict(os.environ)
    ws = []
    for k in range(2):
        argv = [sys.executable, "-c", WORKER, addr, str(k), str(STEPS), str(BATCH), str(PACE_S)]
        w = harness.Worker("worker%d-%d" % (k, len(cl.procs)), argv, cl.dir, env=env)
        cl.procs.append(w)
        ws.append(w)
    return ws


def steps_done(w):
    # whole lines only: the test may read the file while the worker writes
    # a line ("step " alone would be an IndexError)
    lines = [l for l in w.stdout().split("\n")[:-1] if l.startswith("step ")]
    return int(lines[-1].split()[1]) if lines else 0


def finish(ws):
    """Worker 0's result, with each worker's reconnects in "reconnects_all"."""
    out = []
    for w in ws:
        rc = w.wait(300)
        assert rc == 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path))
        out.append([json.loads(l) for l in w.stdout().splitlines() if l.startswith("{")])
    res = out[0][-1]
    res["reconnects_all"] = [o[0]["reconnects"] for o in out]
    return res


def ckpt_tables(path):
    """The tables of a checkpoint file (server/report/checkpoint.h): the
    header's "tables" and, per table, the raw bytes of its keys and rows
    (weights, optimizer state) and (format 3) its rows' last-push clocks,
    which come last, before the 8-byte tail."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"PSDCKPT1" and blob[-4:] == b"PSDE", path
    (fmt, hlen) = struct.unpack("<II", blob[8:16])
    head = msgpack.unpackb(blob[16:16 + hlen], raw=False, strict_map_key=False)
    tabs = head.get("tables", [])
    clocks = 8 if fmt == 3 else 0
    size = sum(t["rows"] * (8 + 4 * t["floats"] + clocks) for t in tabs)
    at = len(blob) - 8 - size
    out = {}
    for t in tabs:
        n, nf = t["rows"], t["floats"]
        ks = np.frombuffer(blob[at:at + 8 * n], "<u8")
        at += 8 * n
        rows = np.frombuffer(blob[at:at + 4 * n * nf], "<f4").reshape(n, nf)
        at += 4 * n * nf + clocks * n
        out[t["name"]] = (t, ks, rows)
    return fmt, head["version"], out


def by_key(ks, rows):
    return {int(k): rows[i].tobytes() for i, k in enumerate(ks)}


def run_job(cl, kill):
    state = os.path.join(cl.dir, "state-kill" if kill else "state-ref")
    args = ("--state-dir", state, "--set", "checkpoint_interval=" + CKPT_EVERY, "--set", "optimizer=sgd",
            "--set", "lr=0.2", "--set", "momentum=0", "--set", "warmup_versions=0", "--set", "staleness=3",
            "--log-level", "info")
    psd1 = cl.psd(mode="ssp", workers=2, args=args, name="psd-kill" if kill else "psd-ref")
    ws = start_workers(cl, psd1.addr)
    if not kill:
        return finish(ws), None
    # mid-run, with a checkpoint holding the table on disk
    harness.wait_until(lambda: any(f.endswith(".psdc") for f in os.listdir(state)) and
                       max(steps_done(w) for w in ws) >= STEPS // 4, 240, "a quarter of the pass and a checkpoint")
    for w in ws:
        os.kill(w.pid, signal.SIGSTOP)
    try:
        at_kill = [steps_done(w) for w in ws]
        assert max(at_kill) < STEPS, at_kill  # both mid-run
        os.kill(psd1.pid, signal.SIGKILL)
        psd1.wait(10)
        psd2 = cl.psd(mode="ssp", workers=2, args=args + ("--listen", psd1.addr), name="psd-restarted")
        assert psd2.addr == psd1.addr
        m = re.search(r"loaded checkpoint (\S+): model version (\d+)", psd2.stderr())
        assert m, psd2.stderr()
        path = m.group(1).rstrip(":")
        with open(path, "rb") as f:
            loaded_bytes = f.read()
        fmt, version, tabs = ckpt_tables(path)
        assert fmt == 3 and "emb" in tabs, (fmt, list(tabs))
        t, ks, rows = tabs["emb"]
        assert t["rows"] > 1000, t  # the pass so far touched many rows
        # 1. what psd restored (psctl save, before any push) is the checkpoint's weights
        saved = os.path.join(cl.dir, "restored.safetensors")
        r = harness.psctl(psd2.addr, "save", saved)
        assert r.returncode == 0, r.stderr
        meta, tensors = harness.read_safetensors(saved)
        want = by_key(ks, np.ascontiguousarray(rows[:, :t["dim"]]))
        got = by_key(tensors["tables/emb/keys"].view(np.uint64), tensors["tables/emb/rows"])
        assert got.keys() == want.keys()
        diff = [k for k in want if got[k] != want[k]]
        assert not diff, "%d of %d rows differ from the checkpoint's, e.g. key %d" % (len(diff), len(want), diff[0])
        # 2. the optimizer state too: psd's next checkpoint of the same
        # version holds the same table section, byte for byte
        r = harness.psctl(psd2.addr, "checkpoint")
        assert r.returncode == 0, r.stderr
        fmt2, version2, tabs2 = ckpt_tables(path)
        assert version2 == version
        t2, ks2, rows2 = tabs2["emb"]
        assert t2 == t
        assert by_key(ks2, rows2) == by_key(ks, rows), "the restored optimizer state differs"
        print("killed at steps %s; restored %d rows of checkpoint version %d (%d bytes) bit for bit"
              % (at_kill, t["rows"], version, len(loaded_bytes)), file=sys.stderr)
    finally:
        for w in ws:
            os.kill(w.pid, signal.SIGCONT)
    return finish(ws), psd2


def test_kill_during_table_job():
    with harness.Cluster("psd-tables-kill") as cl:
        ref, _ = run_job(cl, kill=False)
        got, psd2 = run_job(cl, kill=True)
        print("AUC uninterrupted %.4f, killed and restarted %.4f, planted model %.4f; reconnects %s"
              % (ref["auc"], got["auc"], got["planted_auc"], got["reconnects_all"]), file=sys.stderr)
        assert min(got["reconnects_all"]) >= 1, got  # both workers reconnected by themselves
        assert ref["auc"] > 0.7, ref
        assert abs(got["auc"] - ref["auc"]) < 0.01, (got, ref)
        st = harness.status(psd2.addr)
        assert {t["name"] for t in st["tables"]} == {"emb"}
