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
- psctl save of a job split over 3 psd writes every part's rows of every
  table, merged into one tables/NAME/rows and tables/NAME/keys: read back
  with this harness's own safetensors reader, every key once, each row
  equal to its part's, the declarations unsplit; one psd started with
  --init-from that file answers those rows.
"""

import json
import os
import struct
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
from harness import M64, part_of  # noqa: E402
from harness import E_LAYOUT, E_RANGE, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

import psd  # noqa: E402

ARGS = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--log-level", "warn")
LAYOUT = [("w", (1024, 4))]  # 4096 values: at least 1024 a part for 3 parts
DIM = 8


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


def test_save_split(cluster):
    parts = start(cluster, 3, "sv")
    run_job(parts)
    path = os.path.join(cluster.dir, "split.safetensors")
    r = harness.psctl(",".join(p.addr for p in parts), "save", path)
    assert r.returncode == 0, r.stderr
    meta, tensors = harness.read_safetensors(path)
    decls = {d["name"]: d for d in json.loads(meta["psd.tables"])}
    assert sorted(decls) == ["emb", "side"] and "part" not in decls["emb"]
    total = 0
    for tab, dim in (("emb", DIM), ("side", 2)):
        keys = tensors["tables/%s/keys" % tab].view(np.uint64)
        rows = tensors["tables/%s/rows" % tab]
        assert rows.shape == (keys.size, dim) and decls[tab]["dim"] == dim
        assert np.unique(keys).size == keys.size, "a key twice"
        saved = dict(zip(keys.tolist(), rows))
        held = 0
        for i, p in enumerate(parts):
            ks, want, t = stored(p.addr, tab, dim)
            assert t["part"] == [i, 3] and len(ks) > 0
            held += len(ks)
            for k, row in zip(ks.tolist(), want):
                assert np.array_equal(saved[k].view(np.uint32), row.view(np.uint32)), (tab, k)
        assert held == keys.size, "rows saved that no part holds"
        total += keys.size
    assert "2 tables, %d rows" % total in r.stdout, r.stdout
    # one psd from the file holds every part's rows
    one = cluster.psd(mode="asgd", workers=1, name="from", args=ARGS + ("--init-from", path))
    c = psd.Client(LAYOUT, server=one.addr, shard="0/1", connect=True, connect_s=5, timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    keys = tensors["tables/emb/keys"].view(np.uint64)
    assert np.array_equal(c.pull_rows("emb", keys).view(np.uint32), tensors["tables/emb/rows"].view(np.uint32))
    c.close()


def frames_in(addr):
    samples, _ = harness.parse_prometheus(harness.metrics(addr))
    return harness.metric(samples, "psd_received_frames_total")


def test_pushpull_one_message_a_part(cluster):
    """psc_table_pushpull is one round trip to each part: a TPUSHPULL (push,
    then pull of the next keys), not a TPUSH and then a TPULL; rows as
    push-then-pull gives them."""
    parts = start(cluster, 2, "rt")
    c = client(parts)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    ref = client(start(cluster, 1, "ref"))
    ref.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    steps = list(batches(20))
    k0 = steps[0][0]
    c.pull_rows("emb", k0)  # both parts hold keys of the stream from now on
    ref.pull_rows("emb", k0)
    # what one scrape itself sends: psctl's own frames
    before = [frames_in(p.addr) for p in parts]
    scrape = [frames_in(p.addr) - b for p, b in zip(parts, before)]
    before = [frames_in(p.addr) for p in parts]
    for k, g, nxt in steps:
        got = c.pushpull_rows("emb", k, g, nxt)
        ref.push_rows("emb", k, g)
        want = ref.pull_rows("emb", nxt)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    for p, b, s in zip(parts, before, scrape):
        sent = frames_in(p.addr) - b - s
        # one frame a call; a heartbeat or two may come in between (not 2 a call)
        assert len(steps) <= sent <= len(steps) + 2, (p.addr, sent, len(steps))
    c.close()
    ref.close()


def test_pushpull_past_one_message(cluster):
    """A push-and-pull whose keys take several messages (dim 1024: 4,096 keys
    a message): its pulls go only with or after its last push, so rows it
    pushed come back pushed; 3 frames for 4,200 pushed and 4,500 pulled keys
    (TPUSH, TPUSHPULL, TPULL)."""
    dim = 1024
    p = start(cluster, 1, "big")[0]
    ref = start(cluster, 1, "bigref")[0]
    c, r = client([p]), client([ref])
    for x in (c, r):
        x.table("big", dim, init="uniform", scale=0.05, seed=5, opt="sgd", lr=0.5)
    rng = np.random.default_rng(9)
    keys = rng.permutation(np.arange(1, 20001, dtype=np.uint64))
    k, nxt = keys[:4200], np.concatenate([keys[:4200][::-1], keys[4200:4500]])
    g = rng.standard_normal((k.size, dim)).astype(np.float32)
    before = frames_in(p.addr)
    scrape = frames_in(p.addr) - before
    before = frames_in(p.addr)
    got = c.pushpull_rows("big", k, g, nxt)
    sent = frames_in(p.addr) - before - scrape
    r.push_rows("big", k, g)
    want = r.pull_rows("big", nxt)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    assert 3 <= sent <= 5, sent
    c.close()
    r.close()


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
            e.reconnects = c.reconnects
            return e
        finally:
            c.close()

    e = job(start(cluster, 1, "one", cap))
    assert e is not None and e.code == -16 and "max_table_memory" in str(e), e  # PSC_ELIMIT
    assert e.reconnects == 0  # refused at once: no reconnect waits out a memory cap
    parts = start(cluster, 2, "two", cap)
    assert job(parts) is None
    rows = [harness.status(p.addr)["tables"][0] for p in parts]
    assert sum(t["rows"] for t in rows) == 20000
    assert all(t["bytes"] <= 1 << 20 for t in rows)


# ---- resharding offline: psd --reshard-from (PROTOCOL.md 13.7) -------------

RESHARD_ARGS = ("--mode", "asgd", "--set", "optimizer=sgd", "--set", "lr=0.1", "--set", "momentum=0.9")


def read_ckpt(path):
    """The newest checkpoint in state dir path, read from its format (a
    magic, format, header length, a msgpack header, the parameters, each
    optimizer state buffer, then per table its keys, its rows and (format 3)
    its rows' last-push clocks): the header, the dense values and state
    ((1 + state) x P float32) and per table {key: the row's bytes, weights
    and state}. A table's clock is left out of its declaration: a reshard
    starts it afresh."""
    import msgpack
    names = sorted(f for f in os.listdir(path) if f.startswith("ckpt-") and f.endswith(".psdc"))
    assert names, "no checkpoint in %s" % path
    with open(os.path.join(path, names[-1]), "rb") as f:
        data = f.read()
    assert data[:8] == b"PSDCKPT1" and data[-4:] == b"PSDE"
    fmt, hlen = struct.unpack_from("<II", data, 8)
    h = msgpack.unpackb(data[16:16 + hlen], raw=False)
    P, ns = h["params"], len(h["state"])
    at = 16 + hlen
    dense = np.frombuffer(data, np.float32, (1 + ns) * P, at).reshape(1 + ns, P)
    at += (1 + ns) * P * 4
    tables = {}
    for t in h.get("tables", []):
        n, fl = t["rows"], t["floats"]
        keys = np.frombuffer(data, "<u8", n, at)
        at += 8 * n
        rows = np.frombuffer(data, np.float32, n * fl, at).reshape(n, fl)
        at += 4 * n * fl
        if fmt == 3:
            at += 8 * n
            t.pop("clock")
        tables[t["name"]] = (t, dict(zip(keys.tolist(), (r.tobytes() for r in rows))))
    assert at == len(data) - 8
    return h, dense, tables


def reshard(cl, sources, part, nparts, dest, expect_ok=True):
    os.makedirs(dest, exist_ok=True)
    r = harness.run([harness.Paths.psd, "--reshard-from", ",".join(sources), "--part", "%d/%d" % (part, nparts),
                     "--state-dir", dest, "--log-level", "warn"] + list(RESHARD_ARGS), timeout=60)
    if expect_ok:
        assert r.returncode == 0, r.stderr
    return r


def union(parts, nparts):
    """Every table's rows over the parts' checkpoints: each key on exactly
    one part, the one of its hash."""
    out = {}
    for i, (_, _, tables) in enumerate(parts):
        for name, (t, rows) in tables.items():
            assert t.get("part", [0, 1]) == ([i, nparts] if nparts > 1 else [0, 1]), t
            u = out.setdefault(name, {})
            for k, row in rows.items():
                assert part_of(k, nparts) == i, (name, k, i)
                assert k not in u, (name, k)
                u[k] = row
    return out


def test_reshard_2_to_4_to_2(cluster):
    d = cluster.dir
    old = [os.path.join(d, "old%d" % i) for i in range(2)]
    psds = [cluster.psd(name="old%d" % i, workers=1, args=RESHARD_ARGS + ("--state-dir", old[i], "--log-level",
                                                                         "warn")) for i in range(2)]
    c = client(psds)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    c.table("adm", 3, init="normal", scale=0.1, seed=9, opt="adam")
    rng = np.random.default_rng(5)
    for step in range(4):
        c.grads[:] = rng.standard_normal(4096).astype(np.float32)
        c.push()  # the dense part: parameters and momentum
        k = rng.integers(0, 5000, 500).astype(np.uint64)
        c.push_rows("emb", k, rng.standard_normal((500, DIM)).astype(np.float32))
        c.push_rows("adm", k[:100], rng.standard_normal((100, 3)).astype(np.float32))
    keys = np.arange(5000, dtype=np.uint64)
    want_emb, want_adm = c.pull_rows("emb", keys), c.pull_rows("adm", keys)
    c.pull()
    want_dense = c.params.copy()
    c.close()
    for p in psds:
        p.stop()  # a last checkpoint each
    orig = [read_ckpt(p) for p in old]
    orig_rows = union(orig, 2)
    assert len(orig_rows["emb"]) > 1000 and len(orig_rows["adm"]) > 100
    assert orig[0][1].shape[0] == 2  # parameters and momentum

    four = [os.path.join(d, "four%d" % i) for i in range(4)]
    for i in range(4):
        reshard(cluster, old, i, 4, four[i])
    got4 = [read_ckpt(p) for p in four]
    assert union(got4, 4) == orig_rows  # every row and its state, bit for bit, none lost or doubled
    dense4 = np.concatenate([g[1] for g in got4], axis=1)
    assert np.array_equal(dense4.view(np.uint32), np.concatenate([o[1] for o in orig], axis=1).view(np.uint32))
    assert all(g[0]["version"] == orig[0][0]["version"] for g in got4)

    # the 4 new parts serve the job: the same rows and values
    psds = [cluster.psd(name="four%d" % i, workers=1, args=RESHARD_ARGS + ("--state-dir", four[i], "--log-level",
                                                                          "warn")) for i in range(4)]
    c = client(psds)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    c.table("adm", 3, init="normal", scale=0.1, seed=9, opt="adam")
    assert np.array_equal(c.pull_rows("emb", keys).view(np.uint32), want_emb.view(np.uint32))
    assert np.array_equal(c.pull_rows("adm", keys).view(np.uint32), want_adm.view(np.uint32))
    c.pull()
    assert np.array_equal(c.params.view(np.uint32), want_dense.view(np.uint32))
    c.close()
    for p in psds:
        p.stop()

    back = [os.path.join(d, "back%d" % i) for i in range(2)]
    for i in range(2):
        reshard(cluster, four, i, 2, back[i])
    got2 = [read_ckpt(p) for p in back]
    for o, g in zip(orig, got2):
        assert np.array_equal(o[1].view(np.uint32), g[1].view(np.uint32))
        assert o[2] == g[2]  # each part's tables: declarations, keys, rows and state
        assert (o[0]["version"], o[0]["layout"], o[0]["state"]) == (g[0]["version"], g[0]["layout"], g[0]["state"])

    # mistakes: one readable line, nothing written
    empty = os.path.join(d, "empty")
    os.makedirs(empty)
    r = reshard(cluster, [old[0], empty], 0, 3, os.path.join(d, "x0"), expect_ok=False)
    assert r.returncode == 1 and "old part 1 of 2 (%s): no checkpoint there" % empty in r.stderr, r.stderr
    r = reshard(cluster, [old[0]], 0, 3, os.path.join(d, "x1"), expect_ok=False)  # a part missing
    assert r.returncode == 1 and "list the old parts' state dirs in part order" in r.stderr, r.stderr
    r = reshard(cluster, [old[1], old[0]], 0, 3, os.path.join(d, "x2"), expect_ok=False)  # out of order
    assert r.returncode == 1 and "part order" in r.stderr, r.stderr
    r = reshard(cluster, old, 0, 2, back[0], expect_ok=False)  # the new dir holds a checkpoint
    assert r.returncode == 1 and "holds a checkpoint already" in r.stderr, r.stderr
    r = reshard(cluster, old, 2, 2, os.path.join(d, "x3"), expect_ok=False)
    assert r.returncode == 2 and "--part 2/2: I/N with 0 <= I < N" in r.stderr, r.stderr
    for x in ("x0", "x1", "x2", "x3"):
        assert not [f for f in os.listdir(os.path.join(d, x)) if f.startswith("ckpt-")], x
