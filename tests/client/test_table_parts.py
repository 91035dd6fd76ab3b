"""test_table_parts.py - embedding tables over several psd (proto/PROTOCOL.md
13.7): each row lives on part jump_hash(mix(key), n), and libpsclient routes
every key there, one message to each part at once.

Run by ctest (client_table_parts) with Debian's pytest, as test_python.py.

- A table job (one worker: exact, whatever the order) over 2 and 3 psd ends
  with every row equal, bit for bit, to the same job on one psd; every
  stored row is on exactly one psd, the one of its key's part as this file
  computes it from the protocol's formula on its own; each psd's status
  gives its part.
- A psd refuses a key of another part (RANGE, naming both parts) and a
  declaration of the table with another part (LAYOUT), and goes on serving.
- A job whose rows pass one psd's max_table_memory is refused there (LIMIT)
  and trains when its table is split over 2 psd with the same cap each.
"""

import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
from harness import E_LAYOUT, E_RANGE, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

import psd  # noqa: E402

ARGS = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--log-level", "warn")
LAYOUT = [("w", (1024, 4))]  # 4096 values: at least 1024 a part for 3 parts
DIM = 8
M64 = (1 << 64) - 1


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def jump(key, n):
    """Lamping and Veach's jump consistent hash, in Python integers and
    doubles (PROTOCOL.md 13.7)."""
    b, j = -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) & M64
        j = int(float(b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def part_of(key, n):
    return 0 if n == 1 else jump(mix(key), n)


@pytest.fixture
def cluster():
    with harness.Cluster("psd-table-parts") as cl:
        yield cl


def start(cl, n, prefix, args=()):
    return [cl.psd(mode="asgd", workers=1, name="%s%d" % (prefix, i), args=ARGS + tuple(args)) for i in range(n)]


def client(psds):
    return psd.Client(LAYOUT, server=",".join(p.addr for p in psds), shard="0/1", connect=True, connect_s=5,
                      timeout_ms=20000)


def batches(steps=12):
    """A deterministic stream: keys with repeats, keys near 0 and 2^64, and
    their gradients."""
    rng = np.random.default_rng(27)
    for s in range(steps):
        k = rng.integers(0, 3000, 400).astype(np.uint64)
        k[:3] = [0, M64, M64 - s]
        g = rng.standard_normal((k.size, DIM)).astype(np.float32)
        nxt = rng.integers(0, 3000, 300).astype(np.uint64)
        yield k, g, nxt


def run_job(psds):
    """The job: pull, push, pushpull through psd.Client; returns the rows of
    every key it touched (sorted) and those keys."""
    c = client(psds)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    c.table("side", 2, init="zeros", opt="sgd", lr=0.2)
    touched = set()
    for k, g, nxt in batches():
        rows = c.pull_rows("emb", k)
        assert rows.shape == (k.size, DIM)
        c.push_rows("emb", k, g * 0.5 + rows[:, :1])
        c.push_rows("side", k[:50], g[:50, :2])
        got = c.pushpull_rows("emb", k[:100], g[:100], nxt)
        assert got.shape == (nxt.size, DIM)
        touched.update(int(x) for x in k)
    keys = np.array(sorted(touched), np.uint64)
    out = c.pull_rows("emb", keys), c.pull_rows("side", keys)
    c.close()
    return keys, out


def stored(addr, tab, dim):
    """Every row psd holds of table tab, by position (an admin's TPULL with
    off and len): keys and rows."""
    t = [x for x in harness.status(addr)["tables"] if x["name"] == tab][0]
    with RawClient(addr, 10.0) as a:
        a.hello_admin()
        if t["rows"] == 0:
            return np.zeros(0, np.uint64), np.zeros((0, dim), np.float32), t
        r = a.request({"t": T_TPULL, "tab": tab, "off": 0, "len": t["rows"]})
        assert r.get("t") == T_ROWS, r
        return (np.frombuffer(r["keys"], "<u8").copy(), np.frombuffer(r["data"], np.float32).reshape(-1, dim), t)


@pytest.mark.parametrize("nparts", [2, 3])
def test_split_equals_one_psd(cluster, nparts):
    one = start(cluster, 1, "one")
    keys, (want_emb, want_side) = run_job(one)
    parts = start(cluster, nparts, "part")
    keys2, (emb, side) = run_job(parts)
    assert np.array_equal(keys, keys2)
    assert np.array_equal(emb.view(np.uint32), want_emb.view(np.uint32))  # bit for bit
    assert np.array_equal(side.view(np.uint32), want_side.view(np.uint32))
    # every row on exactly one psd, the one of its part
    ref_keys, ref_rows, _ = stored(one[0].addr, "emb", DIM)
    seen = {}
    for i, p in enumerate(parts):
        ks, rows, t = stored(p.addr, "emb", DIM)
        assert t["part"] == [i, nparts]
        assert len(ks) > 0
        for k, row in zip(ks.tolist(), rows):
            assert part_of(k, nparts) == i, (k, i)
            assert k not in seen, k
            seen[k] = row
    assert sorted(seen) == sorted(ref_keys.tolist())
    for k, row in zip(ref_keys.tolist(), ref_rows):
        assert np.array_equal(seen[k].view(np.uint32), row.view(np.uint32)), k
    assert harness.status(one[0].addr)["tables"][0]["part"] == [0, 1]


def test_wrong_part_refused(cluster):
    parts = start(cluster, 2, "p")
    c = client(parts)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad")
    c.push_rows("emb", np.arange(20, dtype=np.uint64), np.ones((20, DIM), np.float32))
    c.close()
    mine = [k for k in range(1, 50) if part_of(k, 2) == 0][:3]
    other = [k for k in range(1, 50) if part_of(k, 2) == 1][0]
    w = RawClient(parts[0].addr, 10.0)
    r = w.hello_worker([["w(1024x4)[0:2048]", [2048]]], 0, 1)  # part 0 of the model (PROTOCOL.md 6.2)
    assert r.get("t") == harness.T_WELCOME, r
    decl = {"t": T_TABLE, "tab": "emb", "dim": DIM, "rinit": "uniform", "scale": 0.05, "seed": 3, "opt": "adagrad"}
    r = w.request(dict(decl, part=[1, 2]))
    assert r.get("t") == harness.T_ERROR and r["code"] == E_LAYOUT, r
    assert "part 0 of 2" in r["text"] and "part 1 of 2" in r["text"], r
    r = w.request(dict(decl, part=[0, 2]))
    assert r.get("t") == T_OK, r
    before = stored(parts[0].addr, "emb", DIM)
    ks = struct.pack("<4Q", *(mine + [other]))
    r = w.request({"t": T_TPUSH, "tab": "emb", "keys": ks, "base": 0,
                   "data": np.ones(4 * DIM, np.float32).tobytes()})
    assert r.get("t") == harness.T_ERROR and r["code"] == E_RANGE, r
    assert ("key %d of table 'emb' belongs to part 1 of 2, and this psd holds part 0" % other) in r["text"], r
    r = w.request({"t": T_TPULL, "tab": "emb", "keys": struct.pack("<Q", other)})
    assert r.get("t") == harness.T_ERROR and r["code"] == E_RANGE, r
    after = stored(parts[0].addr, "emb", DIM)
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])  # nothing changed
    r = w.request({"t": T_TPULL, "tab": "emb", "keys": struct.pack("<3Q", *mine)})  # psd goes on
    assert r.get("t") == T_ROWS, r
    w.close()


def test_table_bigger_than_one_part(cluster):
    """50 steps of 400 new keys each (20,000 rows of dim 8 with AdaGrad's
    state: about 1.4 MB) against a cap of 1 MB: one psd refuses the rows past
    it; split over 2 psd with the same cap each, the job trains."""
    cap = ("--set", "max_table_memory=1M")

    def job(psds):
        c = client(psds)
        c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad")
        g = np.full((400, DIM), 0.1, np.float32)
        try:
            for s in range(50):
                c.push_rows("emb", np.arange(400 * s, 400 * (s + 1), dtype=np.uint64), g)
            return None
        except psd.PsdError as e:
            return e
        finally:
            c.close()

    e = job(start(cluster, 1, "one", cap))
    assert e is not None and e.code == -16 and "max_table_memory" in str(e), e  # PSC_ELIMIT
    parts = start(cluster, 2, "two", cap)
    assert job(parts) is None
    rows = [harness.status(p.addr)["tables"][0] for p in parts]
    assert sum(t["rows"] for t in rows) == 20000
    assert all(t["bytes"] <= 1 << 20 for t in rows)
