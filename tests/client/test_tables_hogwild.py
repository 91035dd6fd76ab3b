"""test_tables_hogwild.py - table_apply = hogwild (PROTOCOL.md 13.5):
psd's apply threads step the rows of table pushes while its loop goes on.

- examples/torch/ctr.py, two asgd workers, the tables' rows stepped by 2
  apply threads: both reach the AUC the ordered path's test asks for
  (0.78; the teacher's is about 0.91), and psd holds the rows.
- Workers that die with pushes in flight: raw clients pipeline large
  TPUSHes and close at once, or are kill -9'd mid-run, again and again;
  psd applies or drops their pushes, frees the connections, and another
  worker's pushes and pulls go on, exact (its keys are its own).
- A checkpoint taken while pushes are being applied holds no torn row:
  two clients push SGD steps of 1 at lr 0.5 to their own keys (so each
  row, race-free, is -0.5 x its pushes in every value) while an admin asks
  for checkpoints; after kill -9 and a restart on the state dir every
  restored row is a whole number of steps, the same in all its values, at
  most the pushes made. A checkpoint at rest restores bit for bit.
- settings: table_apply = hogwild with mode = bsp, table_threads without
  hogwild, and table_threads out of range are refused at start with a
  message naming the setting.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402
from harness import T_ADMIN, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
HOG = ("--set", "table_apply=hogwild", "--set", "table_threads=2")
ADAM = ("--set", "optimizer=adam", "--set", "lr=0.002", "--set", "warmup_versions=0")
LAYOUT = [["w", [4]]]
DIM = 8
TIMEOUT = 30
TABLE = {"t": T_TABLE, "tab": "emb", "dim": DIM, "rinit": "zeros", "opt": "sgd", "hp": {"lr": 0.5}}


@pytest.fixture
def cluster():
    with harness.Cluster("psd-tables-hogwild") as cl:
        yield cl


def kb(ks):
    return np.asarray(ks, dtype="<u8").tobytes()


def worker(psd, shard=0, nshards=1):
    w = RawClient(psd.addr, TIMEOUT)
    r = w.hello_worker(LAYOUT, shard, nshards)
    assert r.get("t") == harness.T_WELCOME, r
    if r.get("init"):
        assert w.request({"t": harness.T_INIT, "off": 0, "data": np.zeros(4, np.float32).tobytes()})["t"] == T_OK
    assert w.request(dict(TABLE))["t"] == T_OK
    return w


def rows(c, ks):
    r = c.request({"t": T_TPULL, "tab": "emb", "keys": kb(ks)})
    assert r.get("t") == T_ROWS, r
    return np.frombuffer(r["data"], np.float32).reshape(len(ks), DIM).copy()


def push(c, ks, g=1.0):
    r = c.request({"t": T_TPUSH, "tab": "emb", "keys": kb(ks), "base": 0,
                   "data": np.full((len(ks), DIM), g, np.float32).tobytes()})
    assert r.get("t") == T_OK, r


def admin(psd):
    a = RawClient(psd.addr, TIMEOUT)
    a.hello_admin()
    return a


def test_ctr_example_hogwild(cluster):
    pytest.importorskip("torch")
    psd = cluster.psd(mode="asgd", workers=2, args=ADAM + HOG)
    assert "table_apply = hogwild: 2 apply threads" in psd.stderr()
    script = os.path.join(ROOT, "examples", "torch", "ctr.py")
    env = dict(os.environ)
    for v in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX"):
        env.pop(v, None)
    procs = [harness.Proc("w%d" % k, [PY, script, "--server", psd.addr, "--shard", "%d/2" % k, "--samples", "60000",
                                      "--ids", "5000"], cluster.dir, env=env) for k in range(2)]
    outs = []
    for p in procs:
        assert p.wait(240) == 0, p.stdout() + p.stderr()
        outs.append(json.loads([ln for ln in p.stdout().splitlines() if ln.startswith("{")][-1]))
    for o in outs:
        assert o["samples"] == 30000, o
        assert o["test_auc"] >= 0.78, o
        assert o["teacher_auc"] > o["test_auc"], o
    tables = {t["name"]: t for t in harness.status(psd.addr)["tables"]}
    assert sorted(tables) == ["c0", "c1", "c2", "c3"]
    assert all(0 < t["rows"] <= 5000 and t["rows_pushed"] > 0 for t in tables.values()), tables


def test_workers_die_with_pushes_in_flight(cluster):
    psd = cluster.psd(mode="asgd", workers=4, args=HOG)
    steady = worker(psd, 0, 4)
    own = list(range(1, 65))
    big = np.full((4096, DIM), 0.25, np.float32).tobytes()
    done = 0
    for rnd in range(12):
        # a raw client that pipelines 8 pushes of 4096 rows and closes at once
        d = RawClient(psd.addr, TIMEOUT)
        d.hello_worker(LAYOUT, 1 + rnd % 3, 4)
        d.request(dict(TABLE))
        base = 1 << 40 | rnd << 20
        for i in range(8):
            d.send_frame({"t": T_TPUSH, "id": 100 + i, "tab": "emb", "keys": kb(range(base + i * 4096,
                                                                                   base + (i + 1) * 4096)),
                          "base": 0, "data": big})
        d.sock.close()
        push(steady, own)  # the other worker goes on meanwhile
        done += 1
    # a worker process killed (kill -9) while it pushes in a loop
    script = ("import sys, numpy as np\nsys.path.insert(0, %r)\nimport harness\n"
              "from harness import RawClient\n"
              "c = RawClient(%r, 30)\nc.hello_worker([['w', [4]]], 3, 4)\nc.request(%r)\n"
              "k = np.arange(1 << 41, (1 << 41) + 4096, dtype='<u8').tobytes()\n"
              "g = np.full((4096, 8), 0.5, np.float32).tobytes()\nprint('go', flush=True)\n"
              "while True:\n    c.send_frame({'t': %d, 'id': 7, 'tab': 'emb', 'keys': k, 'base': 0, 'data': g})\n"
              % (os.path.join(ROOT, "tests", "integration"), psd.addr, dict(TABLE), T_TPUSH))
    for _ in range(3):
        p = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "go", p.stderr.read()
        push(steady, own)
        time.sleep(0.2)  # psd is busy with its pushes (a bounded pause, not a wait for an event)
        p.kill()
        p.wait(10)
        push(steady, own)
        done += 2
    got = rows(steady, own)
    assert (got == np.float32(-0.5 * done)).all(), got[:, 0]
    st = harness.status(psd.addr)
    assert psd.alive()
    assert st["tables"][0]["rows"] >= 64


def ckpt_rows(a, n):
    """Every stored row of the table, through the admin's TPULL by position."""
    r = a.request({"t": T_TPULL, "tab": "emb", "off": 0, "len": n})
    assert r.get("t") == T_ROWS, r
    keys = np.frombuffer(r["keys"], "<u8")
    return dict(zip(keys.tolist(), np.frombuffer(r["data"], np.float32).reshape(len(keys), DIM)))


def test_checkpoint_during_applies(cluster):
    state = os.path.join(cluster.dir, "state")
    args = HOG + ("--state-dir", state, "--set", "checkpoint_interval=0")
    psd = cluster.psd(mode="asgd", workers=2, args=args)
    ws = [worker(psd, k, 2) for k in range(2)]
    keys = [list(range((k + 1) << 32, ((k + 1) << 32) + 2048)) for k in range(2)]
    made = [0, 0]
    stop = threading.Event()
    errors = []

    def pusher(k):
        try:
            while not stop.is_set():
                push(ws[k], keys[k])
                made[k] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ths = [threading.Thread(target=pusher, args=(k,)) for k in range(2)]
    for t in ths:
        t.start()
    a = admin(psd)
    ckpts = 0
    deadline = time.monotonic() + 60
    while ckpts < 5 and time.monotonic() < deadline:
        if min(made) > 3 * (ckpts + 1):
            r = a.request({"t": T_ADMIN, "cmd": "checkpoint"})
            assert r.get("t") == T_OK, r
            ckpts += 1
        else:
            time.sleep(0.01)
    stop.set()
    for t in ths:
        t.join(30)
    assert not errors, errors
    assert ckpts == 5, made
    os.kill(psd.pid, 9)
    psd.wait(10)
    for w in ws:
        w.close()
    a.close()

    psd2 = cluster.psd(mode="asgd", workers=2, args=args, name="psd2")
    a = admin(psd2)
    got = ckpt_rows(a, 4096)
    assert len(got) == 4096
    for k in range(2):
        vals = np.stack([got[key] for key in keys[k]])
        steps = vals / np.float32(-0.5)
        assert (steps == steps[:, :1]).all(), "a torn row in the checkpoint"
        assert (steps == np.round(steps)).all() and (steps >= 1).all() and (steps <= made[k]).all(), steps[:, 0]
    # at rest: bit for bit
    w = worker(psd2, 0, 2)
    push(w, keys[0][:100])
    before = ckpt_rows(a, 4096)
    assert a.request({"t": T_ADMIN, "cmd": "checkpoint"}).get("t") == T_OK
    os.kill(psd2.pid, 9)
    psd2.wait(10)
    w.close()
    a.close()
    psd3 = cluster.psd(mode="asgd", workers=2, args=args, name="psd3")
    with admin(psd3) as a:
        after = ckpt_rows(a, 4096)
    assert sorted(before) == sorted(after)
    diff = [k for k in before if before[k].tobytes() != after[k].tobytes()]
    assert not diff, (len(diff), [(k, before[k][:2], after[k][:2]) for k in diff[:3]])


@pytest.mark.parametrize("sets,needle", [
    (("--set", "table_apply=hogwild", "--mode", "bsp"), "use mode = asgd or ssp"),
    (("--set", "table_threads=2",), "table_threads = 2 is set but table_apply = ordered"),
    (("--set", "table_apply=hogwild", "--set", "table_threads=65"), "table_threads: 65 is out of range 0..64"),
    (("--set", "table_apply=sometimes",), "table_apply: 'sometimes' is not one of ordered, hogwild"),
])
def test_settings_refused(sets, needle):
    r = subprocess.run([harness.Paths.psd, "--print-config"] + list(sets), capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr
