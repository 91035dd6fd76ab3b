"""test_parts_move.py - a running job's parts grown and shrunk (proto/PROTOCOL.md
18): `psctl parts add` and `psctl parts remove` move the table rows whose
part changes, with their optimizer state, while the parts keep serving.

Run by ctest (client_parts_move) with Debian's pytest, as test_python.py.

- Rows at rest: a table job over 2 psd, then `parts add` a third and
  `parts remove` it again. After each move every stored row is on exactly
  the part of its key under the new map (this file computes it from the
  protocol's formula on its own), equal bit for bit (values and optimizer
  state, as pulls after more pushes show) to the row it was before the
  move; the rows moved are those that changed part, no more (the bytes the
  status counts); each psd's status holds the new map; the dense model
  stays on its parts.
- A key that moved is refused by its old part with MOVED, carrying the new
  map, and nothing is changed; a worker's hello without a layout is taken
  by a part that holds no dense values, refused by one that does.
- Bad input: adding a part that is in the job already, a psd that holds
  another job's model, a second move while one is under way; removing the
  only part, or a part that holds dense values: each refused with the
  reason, and the job goes on.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
from harness import T_ERROR, T_ROWS, T_TPULL, T_TPUSH, RawClient  # noqa: E402

import psd  # noqa: E402

ARGS = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--log-level", "info")
LAYOUT = [("w", (1024, 4))]  # 4096 values: at least 1024 a part
DIM = 8
M64 = (1 << 64) - 1
E_MOVED = 26
E_LAYOUT = 7


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def jump(key, n):
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
    with harness.Cluster("psd-parts-move") as cl:
        yield cl


def start(cl, n, prefix, first=0):
    return [cl.psd(mode="asgd", workers=1, name="%s%d" % (prefix, i), args=ARGS) for i in range(first, first + n)]


def train(psds, steps=10, seed=5):
    """A table job of one worker over psds: returns the keys it touched."""
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in psds), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    rng = np.random.default_rng(seed)
    touched = set()
    for _ in range(steps):
        k = np.unique(rng.integers(0, 20000, 2000).astype(np.uint64))
        k[:2] = [0, M64]
        c.push_rows("emb", k, rng.standard_normal((k.size, DIM)).astype(np.float32))
        touched.update(int(x) for x in k)
    c.close()
    return touched


def stored(addr, tab="emb", width=None):
    """Every row psd holds of table tab (an admin's TPULL by position), as
    {key: row's weights}."""
    t = [x for x in harness.status(addr)["tables"] if x["name"] == tab]
    if not t or t[0]["rows"] == 0:
        return {}
    with RawClient(addr, 10.0) as a:
        a.hello_admin()
        r = a.request({"t": T_TPULL, "tab": tab, "off": 0, "len": t[0]["rows"]})
        assert r.get("t") == T_ROWS, r
        keys = np.frombuffer(r["keys"], "<u8").tolist()
        rows = np.frombuffer(r["data"], np.float32).reshape(-1, DIM)
        return dict(zip(keys, (row.copy() for row in rows)))


def holdings(psds):
    return [stored(p.addr) for p in psds]


def check_placed(held, n):
    """Every row on exactly the part of its key under n parts; returns them all."""
    every = {}
    for i, rows in enumerate(held):
        for k, row in rows.items():
            assert part_of(k, n) == i, (k, i, n)
            assert k not in every, "key %d on two parts" % k
            every[k] = row
    return every


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def psctl_parts(psds, *args):
    return harness.psctl(",".join(p.addr for p in psds), "parts", *args, timeout=120)


def test_grow_then_shrink_at_rest(cluster):
    parts = start(cluster, 2, "p")
    train(parts)
    before = check_placed(holdings(parts), 2)
    assert len(before) > 10000
    dense_before = harness.status(parts[0].addr)["parameters"]

    new = start(cluster, 1, "p", first=2)[0]
    r = psctl_parts(parts, "add", new.addr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every source handed its rows over" in r.stdout, r.stdout
    three = parts + [new]
    after = check_placed(holdings(three), 3)
    same(after, before)
    moved = [k for k in before if part_of(k, 3) == 2]
    assert len(after) == len(before) and len(moved) == len(holdings([new])[0])
    st = harness.status(new.addr)
    assert st["parts"]["epoch"] == 1 and st["parts"]["self"] == 2 and st["parts"]["dense"] == 2
    assert st["parts"]["addrs"] == [p.addr for p in three]
    assert st["parameters"] == 0 and harness.status(parts[0].addr)["parameters"] == dense_before
    # only the moved rows travelled: each is 16 bytes of head and its
    # weights and AdaGrad state (2 x DIM floats), plus the answers' heads
    given = sum(harness.status(p.addr)["parts"]["move"]["rows_given"] for p in parts)
    assert given >= len(moved) and given < len(moved) * 1.2 + 100, (given, len(moved))
    for i, p in enumerate(three):
        assert [t["part"] for t in harness.status(p.addr)["tables"]] == [[i, 3]]

    # the old part of a moved key refuses it, with the map; nothing changes
    k = moved[0]
    with RawClient(parts[part_of(k, 2)].addr, 10.0) as a:
        a.hello_admin()
        e = a.request({"t": T_TPULL, "tab": "emb", "keys": np.array([k], "<u8").tobytes()})
        assert e["t"] == T_ERROR and e["code"] == E_MOVED, e
        assert e["pmap"] == [1, 2, [p.addr for p in three]], e

    # shrink back: every row on its part of 2 again, as it was
    r = psctl_parts(three, "remove")
    assert r.returncode == 0, r.stdout + r.stderr
    back = check_placed(holdings(parts), 2)
    same(back, before)
    assert holdings([new])[0] == {}
    st = harness.status(parts[1].addr)["parts"]
    assert st["epoch"] == 2 and st["addrs"] == [p.addr for p in parts]


def test_refusals(cluster):
    parts = start(cluster, 2, "r")
    train(parts, steps=2)
    before = check_placed(holdings(parts), 2)
    # a part in the job already; the only part; a part holding dense values
    r = psctl_parts(parts, "add", parts[1].addr)
    assert r.returncode != 0 and "is part 1 of the job already" in r.stderr, r.stderr
    r = psctl_parts(parts[:1], "remove")
    assert r.returncode != 0 and "one part only" in r.stderr, r.stderr
    r = psctl_parts(parts, "remove")
    assert r.returncode != 0 and "holds a part of the dense model" in r.stderr, r.stderr
    # a psd of another model cannot join
    other = start(cluster, 1, "other")[0]
    train([other], steps=1)
    r = psctl_parts(parts, "add", other.addr)
    assert r.returncode != 0 and "holds a model already" in r.stderr, r.stderr
    # nothing changed anywhere
    same(check_placed(holdings(parts), 2), before)
    for p in parts:
        st = harness.status(p.addr)["parts"]
        assert st["epoch"] == 0 and st["moving"] is False, st
    # a hello without a layout to a part holding dense values
    with RawClient(parts[0].addr, 10.0) as a:
        e = a.request({"t": 1, "v": 1, "role": "worker", "shard": [0, 1], "pmap": [1, 2, [p.addr for p in parts]]})
        assert e["t"] == T_ERROR and e["code"] == E_LAYOUT, e
    # and the job goes on
    train(parts, steps=1, seed=9)
