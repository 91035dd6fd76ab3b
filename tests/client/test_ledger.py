"""test_ledger.py - the ledger test of replicas (issue 43, proto/PROTOCOL.md 15 and 17).

Two worker processes train a model with an embedding table (AdaGrad rows
of 4) and dense tensors (4 weights and a bias, AdaGrad) through a part of
two psd, a leader and its follower (asgd, replication = sync); the workers
are given both addresses. Ten times in one job, at a random moment (a
random step, then a random fraction of a step; the seed is printed, and
PSD_TEST_SEED replays it), the leader is killed with -9, the follower
promoted with `psctl promote`, and the dead psd started again on its port
as a follower of the new leader.

The job finishes, and its final state equals, bit for bit (dense
parameters and optimizer state, every table row with its optimizer state
and clock, the table's clock, the model version), that of one fresh psd
fed the acknowledged pushes in the order the leaders applied them.

Where the order comes from: psd itself. With PSD_TEST_LEDGER=DIR in its
environment (server/session/ledger.c, for tests only) every psd writes
each push it applies, as it applied it, with its client's cid, push id
and the replication log's end once the push is in the log. A promoted
follower logs how far it had applied its leader's log ("applied the
leader's log up to N"). The pushes the job's final state holds are
therefore the first leader's records up to where its successor had
applied, then that successor's own up to where the next had applied, and
so on, then the last leader's: a leader's pushes past that point died
with it unacknowledged, and their workers sent them again. That sequence
must hold every push of the two workers exactly once (no push lost, none
applied twice: per client, one record per push call, push ids strictly
increasing), and replayed by one client into a fresh psd it must give the
job's final state. The comparison can fail: the same replay with one table
push fed twice must not give it.

The same in bsp: five failovers in a job whose workers' gradients depend
only on the model they pulled and their step end, bit for bit, in the
model of that job on one psd that never failed; and frame by frame, a
worker's push is acknowledged once its round closed, and its id reaches
the follower only with the round; and psworker's job run by its plan
goes on with the promoted follower to the plan's end.
"""

import json
import os
import re
import signal
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_replica as tr  # noqa: E402  (checkpoint readers)
import test_replicas as rs  # noqa: E402  (a model pulled frame by frame)
import test_tables_kill as tk  # noqa: E402

STEPS = 4000  # at most, per worker (a table push and a dense push each): the test stops them before
BATCH = 32
PACE_S = 0.002
FAILOVERS = 10
D = 4

# One worker: shard K of 2 of synthetic clicks (test_tables_kill.py's model,
# smaller batches); prints "step N" after each step; stops after the step
# in which the file `stop` exists, and prints a JSON line with its push calls
# and reconnects.
WORKER = r"""
import json, os, sys, time
import numpy as np
import psd

addr, k, steps, batch, pace, gate, stop = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                           float(sys.argv[5]), sys.argv[6], sys.argv[7])
F, V, D = 4, 1500, 4
rng = np.random.default_rng(1234)
p = 1.0 / np.arange(1, V + 1) ** 1.1
p /= p.sum()
true_rows = rng.normal(0, 1.0, (F * V, D))
true_u = np.array([1.0, -0.5, 0.75, 0.5])
n = 2 * steps * batch
ids = rng.choice(V, size=(n, F), p=p) + np.arange(F) * V
y = (rng.random(n) < 1 / (1 + np.exp(-(true_rows[ids].sum(1) @ true_u - 0.5)))).astype(np.float64)
keys = (ids.astype(np.uint64) * np.uint64(2654435761)) ^ np.uint64(0x5eed)

c = psd.Client([("u", (D,)), ("b", (1,))], server=addr, shard="%d/2" % k, connect_s=30, reconnect_s=120,
               timeout_ms=60000)
c.params[:] = [0.1, 0.1, 0.1, 0.1, 0.0]
c.connect()
c.table("emb", D, init="normal", scale=0.05, seed=9, opt="adagrad", lr=0.1)
c.pull()
print("ready", flush=True)
with open(gate) as f:  # a FIFO: blocks until the test opens it and closes it (the follower is in sync)
    f.read()
calls = 0
for step in range(steps):
    lo = (2 * step + k) * batch
    kb, yb = keys[lo:lo + batch], y[lo:lo + batch]
    rows = c.pull_rows("emb", kb.reshape(-1)).reshape(batch, F, D).astype(np.float64)
    u, b = c.params[:D].astype(np.float64), float(c.params[D])
    s = rows.sum(1)
    g = (1 / (1 + np.exp(-(s @ u + b))) - yb) / batch
    c.push_rows("emb", kb.reshape(-1), np.repeat((g[:, None] * u[None, :])[:, None, :], F, 1).reshape(-1, D))
    c.grads[:D] = (g[:, None] * s).sum(0)
    c.grads[D] = g.sum()
    c.pushpull()
    calls += 2
    print("step", step + 1, flush=True)
    if os.path.exists(stop):  # the test's word: ten failovers are behind
        break
    time.sleep(pace)  # the step's compute
print(json.dumps({"worker": k, "calls": calls, "stopped": os.path.exists(stop), "reconnects": c.reconnects}),
      flush=True)
c.close()
"""

# The replay: one client feeds a fresh psd the records of a ledger file
# (the lineage the test wrote) in order; with several files, one per part
# of a job of that many parts (the addresses as workers give them,
# "F0,F1"), each part's in turn. A dense record is a push of its range of
# the part (the model's values from the part's first one on), a table
# record a push of its rows, which all live on that part. replay_program
# fills in the model (the chaos test's, ctr_wide.py, has a wide part).
REPLAY = r"""
import struct, sys
import numpy as np
import psd

addr, paths = sys.argv[1], sys.argv[2:]
D = %(D)d
c = psd.Client(%(LAYOUT)r, server=addr, shard="0/1", connect_s=30)
c.params[:] = %(INIT)r
c.connect()
c.table("emb", D, **%(TABLE)r)
c.pull()
P, n = len(c.params), len(paths)
lo = [0] + [(P * i // n) // 1024 * 1024 for i in range(1, n)]  # PROTOCOL.md 6.2
count = 0
for part, path in enumerate(paths):
    blob = open(path, "rb").read()
    at = 0
    while at < len(blob):
        kind = blob[at:at + 1]
        at += 1
        if kind == b"D":
            (off, m) = struct.unpack_from("<QQ", blob, at)
            at += 16
            c.grads[:] = 0
            c.grads[lo[part] + off:lo[part] + off + m] = np.frombuffer(blob, "<f4", m, at)
            at += 4 * m
            c.push_range(lo[part] + off, m)
        else:
            (m,) = struct.unpack_from("<I", blob, at)
            at += 4
            keys = np.frombuffer(blob, "<u8", m, at)
            at += 8 * m
            g = np.frombuffer(blob, "<f4", m * D, at).reshape(m, D)
            at += 4 * m * D
            c.push_rows("emb", keys, g)
        count += 1
c.close()
print("replayed", count, flush=True)
"""
TABLE = dict(init="normal", scale=0.05, seed=9, opt="adagrad", lr=0.1)


def replay_program(layout, init, table, dim):
    return REPLAY % dict(LAYOUT=layout, INIT=list(init), TABLE=table, D=dim)


def read_ledger(path):
    """The records of one psd's ledger file (server/session/ledger.c), in
    its order: dicts with kind, cid, pid, lsn, version and the push's bytes
    as the replay wants them (a record of REPLAY's input)."""
    out = []
    with open(path, "rb") as f:
        blob = f.read()
    at = 0
    while at < len(blob):
        kind = blob[at:at + 1]
        cid, pid, lsn, version = struct.unpack_from("<QQQQ", blob, at + 1)
        at += 33
        if kind == b"D":
            off, n = struct.unpack_from("<QQ", blob, at)
            body = blob[at:at + 16 + 4 * n]
        elif kind == b"T":
            name = blob[at:at + 64].rstrip(b"\0").decode()
            assert name == "emb", name
            dim, n = struct.unpack_from("<II", blob, at + 64)
            assert dim == D, dim
            at += 64 + 4
            body = blob[at:at + 4 + 8 * n + 4 * n * dim]
        else:
            raise AssertionError("%s: a record of kind %r at byte %d" % (path, kind, at - 33))
        assert len(body) >= 4, path
        at += len(body)
        assert at <= len(blob), "%s: a record cut short (psd killed while writing it?)" % path
        out.append({"kind": kind, "cid": cid, "pid": pid, "lsn": lsn, "version": version, "body": body})
    return out


def leaders_lineage(leaders, ledgers):
    """The pushes a part's final state holds, in its leaders' order: the
    records of each leader (a Proc, in the order they led) in the ledger
    directory, up to where its successor had applied its log (the
    successor's "promoted: ... applied the leader's log up to N"), then the
    last leader's. Returns (records, how many records past those points:
    applied by a leader that died before its follower had them)."""
    lineage, lost = [], 0
    for i, p in enumerate(leaders):
        recs = read_ledger(os.path.join(ledgers, "ledger-%d.bin" % p.pid))
        if i + 1 < len(leaders):
            m = re.search(r"promoted: .*applied the leader's log up to (\d+)", leaders[i + 1].stderr())
            assert m, "%s: no promotion in its log:\n%s" % (leaders[i + 1].name, harness.tail(leaders[i + 1].err_path))
            upto = int(m.group(1))
            kept = [r for r in recs if r["lsn"] <= upto]
            assert kept == recs[:len(kept)], "leader %d (%s): its log positions go back" % (i, p.name)
            lost += len(recs) - len(kept)
            recs = kept
        lineage += recs
    return lineage, lost


def each_once(lineage):
    """The push ids of each client in a lineage ({cid: [pid, ...]}), after
    checking that none is there twice and that each client's come in the
    order it sent them."""
    by_client = {}
    for r in lineage:
        by_client.setdefault(r["cid"], []).append(r["pid"])
    assert 0 not in by_client, sorted(by_client)
    for cid, pids in by_client.items():
        twice = len(pids) - len(set(pids))
        assert twice == 0, "client %016x: %d pushes applied twice" % (cid, twice)
        assert pids == sorted(pids), "client %016x: pushes applied out of order" % cid
    return by_client


def steps(ws):
    """The fewest steps a worker has done; raises when one has failed."""
    for w in ws:
        if w.p.poll() not in (None, 0):
            raise AssertionError("%s failed:\n%s" % (w.name, harness.tail(w.err_path)))
    return min(tk.steps_done(w) for w in ws)


def write_replay(path, records):
    with open(path, "wb") as f:
        for r in records:
            f.write(r["kind"] + r["body"])


def final_state(cl, p, name):
    """What psd p holds, read back: psctl save's tensors (dense values, table
    rows by key), then, after a clean stop, its checkpoint's dense bytes
    (parameters and optimizer state), its table section by key (weights,
    optimizer state) with the table's header (rows, clock), and the
    version."""
    path = os.path.join(cl.dir, name + ".safetensors")
    r = harness.psctl(p.addr, "save", path)
    assert r.returncode == 0, r.stderr
    meta, tensors = harness.read_safetensors(path)
    dense = sorted(n for n in tensors if not n.startswith("tables/"))  # u and b, or a part's pieces
    saved = {"dense": b"".join(tensors[n].tobytes() for n in dense),
             "rows": tk.by_key(tensors["tables/emb/keys"].view(np.uint64), tensors["tables/emb/rows"])}
    p.stop()
    ck = tr.newest(os.path.join(cl.dir, name))
    fmt, version, tabs = tk.ckpt_tables(ck)
    t, ks, rows = tabs["emb"]
    head, dense = tr.ckpt_dense(ck)
    return {"saved": saved, "version": version, "table": {k: t[k] for k in ("rows", "floats", "clock") if k in t},
            "rows": tk.by_key(ks, rows), "dense": dense}


def differences(a, b):
    out = []
    for k in ("version", "table", "dense"):
        if a[k] != b[k]:
            out.append(k)
    if a["saved"] != b["saved"]:
        out.append("saved tensors")
    if a["rows"].keys() != b["rows"].keys():
        out.append("table keys (%d against %d)" % (len(a["rows"]), len(b["rows"])))
    else:
        diff = [k for k in a["rows"] if a["rows"][k] != b["rows"][k]]
        if diff:
            out.append("%d of %d rows" % (len(diff), len(a["rows"])))
    return out


def psd_args(cl, name, extra=()):
    return ("--state-dir", os.path.join(cl.dir, name), "--set", "checkpoint_interval=0", "--log-level", "info",
            "--set", "max_replica_lag=2s") + tuple(extra)


def replay(cl, records, name):
    path = os.path.join(cl.dir, name + ".bin")
    write_replay(path, records)
    fresh = cl.psd(workers=1, name=name, args=psd_args(cl, name))
    program = replay_program([("u", (D,)), ("b", (1,))], [0.1] * D + [0.0], TABLE, D)
    r = harness.run([sys.executable, "-c", program, fresh.addr, path], timeout=120, env=dict(os.environ))
    assert r.returncode == 0 and ("replayed %d" % len(records)) in r.stdout, r.stderr
    return final_state(cl, fresh, name)


def test_ten_failovers_equal_one_psd_fed_the_leaders_pushes():
    t0 = time.monotonic()
    rnd = harness.seeded_random("test_ledger")
    with harness.Cluster("psd-ledger") as cl:
        ledgers = os.path.join(cl.dir, "ledgers")
        os.mkdir(ledgers)
        env = dict(os.environ, PSD_TEST_LEDGER=ledgers)
        addrs = ["127.0.0.1:%d" % harness.free_port() for _ in range(2)]

        def start(i, n, leader_addr):
            extra = ("--listen", addrs[i]) + (("--replica-of", leader_addr) if leader_addr else ())
            name = "psd%d-%d" % (i, n)
            return cl.psd(workers=2, name=name, args=psd_args(cl, name, extra), env=env)

        procs = [start(0, 0, None), None]
        procs[1] = start(1, 0, addrs[0])
        lead = 0
        leaders = [procs[0]]  # the leaders in turn
        ws = []
        stop = os.path.join(cl.dir, "stop")
        for k in range(2):
            gate = os.path.join(cl.dir, "gate%d" % k)
            os.mkfifo(gate)
            argv = [sys.executable, "-c", WORKER, "/".join(addrs), str(k), str(STEPS), str(BATCH), str(PACE_S),
                    gate, stop]
            w = harness.Worker("worker%d" % k, argv, cl.dir, env=dict(os.environ))
            cl.procs.append(w)
            ws.append(w)
        # the model has values once a worker is in; the follower takes its
        # snapshot then; the workers train once it is in sync
        harness.wait_until(lambda: all("ready" in w.stdout() for w in ws), 60, "the workers' hellos")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the first follower in sync")
        for k in range(2):
            with open(os.path.join(cl.dir, "gate%d" % k), "w"):
                pass
        for n in range(1, FAILOVERS + 1):
            fol = 1 - lead
            at = steps(ws)
            harness.wait_until(lambda: steps(ws) > at, 60, "the workers back (failover %d)" % n)
            at, t_at = steps(ws), time.monotonic()
            more = rnd.randint(2, 8)
            harness.wait_until(lambda: steps(ws) >= at + more, 60, "the workers going on (failover %d)" % n)
            harness.wait_until(lambda: tr.repl(addrs[lead])["insync"] == 1, 60, "the follower in sync (%d)" % n)
            # a random moment of a step: the test saw a step end; a step
            # (the pace, the pulls and the pushes) lasted `period` of late
            period = (time.monotonic() - t_at) / max(1, steps(ws) - at)
            time.sleep(rnd.uniform(0, period))
            os.kill(procs[lead].pid, signal.SIGKILL)
            procs[lead].wait(10)
            r = harness.psctl(addrs[fol], "promote")
            assert r.returncode == 0, r.stderr
            leaders.append(procs[fol])
            procs[lead] = start(lead, n, addrs[fol])  # the dead one comes back as a follower
            lead = fol
        at = steps(ws)
        harness.wait_until(lambda: steps(ws) >= at + 10, 60, "the workers going on after the last failover")
        with open(stop, "w"):
            pass
        calls = []
        for w in ws:
            rc = w.wait(120)
            assert rc == 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path))
            res = [l for l in w.stdout().splitlines() if l.startswith("{")]
            calls.append(json.loads(res[-1]))
        assert all(c["stopped"] for c in calls), "a worker ended before the last failover: raise STEPS"
        harness.wait_until(lambda: tr.in_sync(procs[lead], procs[1 - lead]), 60, "the last follower in sync")
        elapsed_job = time.monotonic() - t0

        # the pushes the final state holds, in the leaders' order
        lineage, lost = leaders_lineage(leaders, ledgers)
        by_client = each_once(lineage)
        assert len(by_client) == 2, sorted(by_client)
        kept = sorted(len(pids) for pids in by_client.values())
        assert kept == sorted(c["calls"] for c in calls), \
            "pushes kept per client %s, acknowledged per worker %s" % (kept, sorted(c["calls"] for c in calls))

        final = final_state(cl, procs[lead], procs[lead].name)
        procs[1 - lead].stop()
        fed = replay(cl, lineage, "fresh")
        diff = differences(final, fed)
        assert not diff, "the job's final state differs from one psd fed its pushes: %s" % ", ".join(diff)

        # the comparison can fail: one table push fed twice
        k = next(i for i in range(len(lineage) // 2, len(lineage)) if lineage[i]["kind"] == b"T")
        twice = replay(cl, lineage[:k + 1] + lineage[k:], "fresh-twice")
        assert differences(final, twice), "a push fed twice left the same state: the comparison cannot fail"
        resent = sum(p.stderr().count("applied already: answered, not applied again") for p in leaders)
        print("ledger: %d failovers, %d pushes kept in the leaders' order; %d applied by a leader that died before "
              "its follower had them (sent again); %d sent again answered without being applied; final version "
              "%d, %d rows; reconnects %s; job %.1f s, all %.1f s"
              % (FAILOVERS, len(lineage), lost, resent, final["version"], len(final["rows"]),
                 [c["reconnects"] for c in calls], elapsed_job, time.monotonic() - t0), file=sys.stderr)


# ---- the same in bsp: a round's pushes kept by the follower only once it closed ----

BSP_STEPS = 1500
BSP_FAILOVERS = 5
BSP_N = 8

# One bsp worker: shard K of 2 of a least-squares problem; its gradient is
# a function of the model it pulled and its step only, so the job's every
# round, and its final state, are the same whatever psd failed in between.
# Worker 0 steps with pushpull, worker 1 with push then pull (the push's OK
# comes once its round closed). Prints "step N" after each step.
BSP_WORKER = r"""
import json, sys, time
import numpy as np
import psd

addr, k, steps, pace = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
N = %(N)d
rng = np.random.default_rng(4321 + k)
X = rng.normal(0, 1, (steps, 16, N))
y = X @ np.linspace(-1, 1, N) + 0.3 + rng.normal(0, 0.1, (steps, 16))
c = psd.Client([("w", (N,)), ("b", (1,))], server=addr, shard="%%d/2" %% k, connect_s=30, reconnect_s=120,
               timeout_ms=60000)
c.params[:] = 0.0
c.connect()
c.pull()
for step in range(steps):
    w, b = c.params[:N].astype(np.float64), float(c.params[N])
    e = (X[step] @ w + b - y[step]) / 16
    c.grads[:N] = X[step].T @ e
    c.grads[N] = e.sum()
    if k == 0:
        c.pushpull()
    else:
        c.push()
        c.pull()
    print("step", step + 1, flush=True)
    time.sleep(pace)
print(json.dumps({"worker": k, "version": c.version, "reconnects": c.reconnects}), flush=True)
c.close()
""" % dict(N=BSP_N)


def bsp_args(cl, name, extra=()):
    return psd_args(cl, name, ("--set", "mode=bsp", "--set", "optimizer=sgd", "--set", "lr=0.05") + tuple(extra))


def bsp_workers(cl, addr, tag):
    ws = []
    for k in range(2):
        argv = [sys.executable, "-c", BSP_WORKER, addr, str(k), str(BSP_STEPS), str(PACE_S)]
        w = harness.Worker("%s-worker%d" % (tag, k), argv, cl.dir, env=dict(os.environ))
        cl.procs.append(w)
        ws.append(w)
    return ws


def bsp_end(ws):
    out = []
    for w in ws:
        rc = w.wait(300)
        assert rc == 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path))
        out.append(json.loads([l for l in w.stdout().splitlines() if l.startswith("{")][-1]))
    return out


def dense_state(cl, p, name):
    """A stopped psd's model version and dense bytes (parameters and
    momentum), from the checkpoint it wrote at its stop."""
    p.stop()
    head, dense = tr.ckpt_dense(tr.newest(os.path.join(cl.dir, name)))
    return head["version"], dense


def test_bsp_failovers_keep_every_round():
    """A bsp job (2 workers, sgd with momentum) through a leader and a sync follower;
    the leader is killed with -9 at random moments, 5 times, the follower
    promoted and the dead psd started again as a follower. Every round
    holds each worker's step once: the final model (parameters and
    momentum, bit for bit) and version are those of the same job on one
    psd that never failed."""
    t0 = time.monotonic()
    rnd = harness.seeded_random("test_ledger_bsp")
    with harness.Cluster("psd-ledger-bsp") as cl:
        ref = cl.psd(workers=2, name="ref", args=bsp_args(cl, "ref"))
        res_ref = bsp_end(bsp_workers(cl, ref.addr, "ref"))
        ref_version, ref_dense = dense_state(cl, ref, "ref")
        assert ref_version >= BSP_STEPS, ref_version
        t_ref = time.monotonic() - t0

        addrs = ["127.0.0.1:%d" % harness.free_port() for _ in range(2)]

        def start(i, n, leader_addr):
            extra = ("--listen", addrs[i]) + (("--replica-of", leader_addr) if leader_addr else ())
            name = "bsp%d-%d" % (i, n)
            return cl.psd(workers=2, name=name, args=bsp_args(cl, name, extra))

        procs = [start(0, 0, None), None]
        ws = bsp_workers(cl, "/".join(addrs), "job")
        harness.wait_until(lambda: steps(ws) >= 5, 60, "the workers' first steps")
        procs[1] = start(1, 0, addrs[0])
        lead = 0
        for n in range(1, BSP_FAILOVERS + 1):
            harness.wait_until(lambda: tr.repl(addrs[lead])["insync"] == 1, 60, "the follower in sync (%d)" % n)
            at, t_at = steps(ws), time.monotonic()
            more = rnd.randint(3, 10)
            harness.wait_until(lambda: steps(ws) >= at + more, 60, "the workers going on (failover %d)" % n)
            period = (time.monotonic() - t_at) / max(1, steps(ws) - at)
            time.sleep(rnd.uniform(0, period))
            assert steps(ws) < BSP_STEPS - 20, "the workers ended before failover %d: raise BSP_STEPS" % n
            os.kill(procs[lead].pid, signal.SIGKILL)
            procs[lead].wait(10)
            r = harness.psctl(addrs[1 - lead], "promote")
            assert r.returncode == 0, r.stderr
            procs[lead] = start(lead, n, addrs[1 - lead])
            lead = 1 - lead
        res = bsp_end(ws)
        harness.wait_until(lambda: tr.in_sync(procs[lead], procs[1 - lead]), 60, "the last follower in sync")
        fol_version, fol_dense = dense_state(cl, procs[1 - lead], procs[1 - lead].name)
        version, dense = dense_state(cl, procs[lead], procs[lead].name)

        assert all(r["reconnects"] >= 1 for r in res), res  # each worker met the failovers
        assert (version, dense) == (fol_version, fol_dense), "the last follower differs from its leader"
        assert version == ref_version, "version %d after the failovers, %d without" % (version, ref_version)
        assert len(dense) == len(ref_dense) and len(dense) >= 2 * 4 * (BSP_N + 1), len(dense)
        assert dense != b"\0" * len(dense)
        assert dense == ref_dense, "the model after %d failovers differs from the job's on one psd" % BSP_FAILOVERS
        print("bsp ledger: %d failovers; version %d as without; reconnects %s; reference %.1f s, all %.1f s"
              % (BSP_FAILOVERS, version, [r["reconnects"] for r in res], t_ref, time.monotonic() - t0),
              file=sys.stderr)


def test_bsp_push_is_acknowledged_once_its_round_is_kept():
    """Frame by frame, from PROTOCOL.md: in bsp with a follower, a worker's
    PUSH is answered once its round closed (a PULL sent after it is answered
    first), sent again while the round holds it too, and its push id is not
    in the log before: the leader killed in
    the round, the promoted follower applies the push sent again with its
    id (the old leader back as its follower), and the round closes with both
    workers' pushes, exactly. A table declared then is refused."""
    def raw_args(name, extra):
        return psd_args(cl, name, ("--set", "mode=bsp", "--set", "optimizer=sgd", "--set", "lr=0.5", "--set",
                                   "momentum=0", "--set", "warmup_versions=0") + extra)

    def hello(addr, shard, cid):
        c = harness.RawClient(addr, 10)
        r = c.hello_worker([["w", [8]]], shard, 2, cid=cid)
        assert r.get("t") == harness.T_WELCOME, r
        return c, r

    def push(c, g, then_pull, ids=(1, 2)):
        c.send_frame({"t": harness.T_PUSH, "id": ids[0], "base": 0, "off": 0, "data": harness.floats([g] * 8),
                      "pid": 1})
        if then_pull:
            c.send_frame({"t": harness.T_PULL, "id": ids[1], "off": 0, "len": 8})
            r = c.recv_frame()
            assert r.get("t") == harness.T_PARAMS and r.get("id") == ids[1] and r.get("ver") == 0, \
                "the push was answered before its round closed: %r" % r

    with harness.Cluster("psd-bsp-ack") as cl:
        addrs = ["127.0.0.1:%d" % harness.free_port() for _ in range(2)]
        lead = cl.psd(workers=2, name="a", args=raw_args("a", ("--listen", addrs[0])))
        w0, r = hello(lead.addr, 0, 0x0B5B0B5B00000001)
        assert r.get("init") is True, r
        assert w0.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0.0] * 8)})["t"] == harness.T_OK
        w1, _ = hello(lead.addr, 1, 0x0B5B0B5B00000002)
        fol = cl.psd(workers=2, name="b", args=raw_args("b", ("--listen", addrs[1], "--replica-of", addrs[0])))
        harness.wait_until(lambda: tr.in_sync(lead, fol), 60, "the follower in sync")
        push(w0, 1.0, then_pull=True)
        push(w0, 1.0, then_pull=True, ids=(3, 4))  # the same push again: the round has it, its reply waits too
        # the follower holds all of the leader's log: not the push's id
        harness.wait_until(lambda: tr.in_sync(lead, fol), 60, "the follower in sync after the push")
        os.kill(lead.pid, signal.SIGKILL)
        lead.wait(10)
        w0.close()
        w1.close()
        r = harness.psctl(fol.addr, "promote")
        assert r.returncode == 0, r.stderr
        back = cl.psd(workers=2, name="a2", args=raw_args("a2", ("--listen", addrs[0], "--replica-of", addrs[1])))
        harness.wait_until(lambda: tr.in_sync(fol, back), 60, "the old leader following")
        w0, _ = hello(fol.addr, 0, 0x0B5B0B5B00000001)
        push(w0, 1.0, then_pull=True)  # sent again: applied (its round waits), not answered as applied already
        w1, _ = hello(fol.addr, 1, 0x0B5B0B5B00000002)
        push(w1, 3.0, then_pull=False)
        assert w1.recv_frame().get("t") == harness.T_OK  # it closed the round
        ok = w0.recv_frame()
        assert ok.get("t") == harness.T_OK and ok.get("id") == 1, ok
        ver, w = rs.model(fol.addr)
        assert ver == 1 and np.array_equal(w, np.full(8, -1.0, np.float32)), (ver, w)  # -0.5 x the mean, 2
        assert "applied already" not in fol.stderr()
        harness.wait_until(lambda: tr.in_sync(fol, back), 60, "the follower in sync after the round")
        assert rs.model(back.addr)[0] == 1
        # a table in bsp with followers: refused, saying why (its pushes wait for the round acknowledged)
        table = {"t": harness.T_TABLE, "tab": "t", "dim": 2, "rinit": "zeros", "opt": "sgd", "hp": {"lr": 0.5}}
        r = w0.request(table)
        assert r.get("t") == harness.T_ERROR and "takes dense models only" in r.get("text", ""), r
        assert harness.status(fol.addr)["replication"]["insync"] == 1
        w0.close()
        w1.close()


def test_bsp_plan_goes_on_after_a_failover():
    """psworker's bsp job, run by its plan, through a leader and a sync
    follower that joined before the workers (an empty snapshot): the
    follower takes the plan from the log; the leader killed with -9 in
    the job, the follower promoted and the dead psd back as its follower,
    the workers go on with the new leader and the job ends where the plan
    ends, on both psd."""
    with harness.Cluster("psd-ledger-plan") as cl:
        addrs = ["127.0.0.1:%d" % harness.free_port() for _ in range(2)]

        def start(i, name, leader=None):
            extra = ("--listen", addrs[i]) + (("--replica-of", leader) if leader else ())
            return cl.psd(mode="bsp", workers=2, name=name, args=psd_args(cl, name, extra))

        lead = start(0, "a")
        fol = start(1, "b", addrs[0])
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync before the workers")
        epochs, batch, limit = 4, 16, 20000
        rounds = epochs * -(-limit // (2 * batch))
        ws = [cl.worker("/".join(addrs), k, 2, epochs=epochs, batch=batch, limit=limit, model="mlp:32",
                        evaluate=False, args=["--reconnect-timeout", "60"]) for k in range(2)]
        harness.wait_until(lambda: harness.status(addrs[0])["version"] >= 300, 120, "the job's first rounds")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        plan = harness.status(addrs[1])["plan"]  # the follower's, from the log
        assert plan and (plan["epochs"], plan["samples"], plan["rounds"]) == (epochs, limit, rounds), plan
        os.kill(lead.pid, signal.SIGKILL)
        lead.wait(10)
        killed_at = harness.status(addrs[1])["version"]
        r = harness.psctl(addrs[1], "promote")
        assert r.returncode == 0, r.stderr
        back = start(0, "a2", addrs[1])
        for w in ws:
            rc, summary = w.result(240)
            assert rc == 0 and summary, "%s failed:\n%s" % (w.name, harness.tail(w.err_path))
        st = harness.status(addrs[1])
        assert st["plan"]["done"] and st["version"] == rounds, (st["version"], st["plan"])
        assert killed_at < rounds - 100, "the job was nearly over at the kill (version %d of %d)" % (killed_at, rounds)
        harness.wait_until(lambda: tr.in_sync(fol, back), 60, "the old leader following")
        assert harness.status(addrs[0])["version"] == rounds
