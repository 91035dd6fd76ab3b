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
- Pushes during the moves: a pusher speaking the protocol itself (so
  that psd alone is tested here) pushes random keys while the job grows
  from 2 parts to 3 (the rows moving at 1 MiB/s, so that pushes land during
  the pass) and shrinks back; it follows MOVED to the part the map names
  and sends NOT_READY requests again. Every row ends, bit for bit, as one
  psd fed the pushes the parts acknowledged, in the order they
  acknowledged them: no acknowledged push lost, none applied twice.
- A source's leader killed mid-move, with replicas: its follower,
  promoted, takes part as its leader did; the new part reaches it through
  the replicas, and the same `parts add`, each part given as its replicas,
  finishes the move with every row on its part as it was.
- The new part's leader killed mid-move, with replicas: its follower,
  joined before the move from nothing, promoted, takes the move up by
  itself, and the same `parts add` finishes it; a worker given the old
  parts alone finds the follower through the map (A/B entries).
- With leaders elected through etcd: a source's leader killed mid-move,
  its follower elected by itself, and the same `parts add` finishes.
- Parts with followers: the same grow and shrink under pushes; each
  follower ends with its leader's rows bit for bit, in the same places,
  and its map; a follower promoted after its leader is killed holds every
  acknowledged push.
- A part killed mid-move (no replicas): the new part killed during its
  pass leaves every row on its old part as it was; `psctl parts abort`
  calls the move off; started again at its address, the same command run
  again finishes the move.
- The map in checkpoints: a part restarted from its checkpoint after a
  move knows the map (status, MOVED), and a worker given the old list
  finds the new part from its WELCOME.
- Bad input: adding a part that is in the job already, a psd that holds
  another job's model, a second move while one is under way; removing the
  only part, or a part that holds dense values: each refused with the
  reason, and the job goes on.
"""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import etcd  # noqa: E402
import harness  # noqa: E402
from harness import M64, part_of  # noqa: E402
from harness import T_ERROR, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, T_WELCOME, RawClient  # noqa: E402

import psd  # noqa: E402

ARGS = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--log-level", "info")
LAYOUT = [("w", (1024, 4))]  # 4096 values: at least 1024 a part
DIM = 8
E_MOVED = 26
E_LAYOUT = 7
E_NOT_READY = 13
DECL = {"t": T_TABLE, "tab": "emb", "dim": DIM, "rinit": "uniform", "scale": 0.05, "seed": 3,
        "opt": "adagrad", "hp": {"lr": 0.1}}


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

    # the parts out of the map's order: each psd knows its place
    r = psctl_parts([parts[1], parts[0], new], "remove")
    assert r.returncode != 0 and "is part 1 of the job's map, not part 0" in r.stderr, r.stderr
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


class Pusher:
    """One worker written from PROTOCOL.md alone: pushes random keys of
    table emb to their parts, one part after another; follows MOVED (the
    map it carries) and sends a NOT_READY request again. Keeps every
    acknowledged push (keys, gradients) in the order acknowledged."""

    def __init__(self, addrs, seed):
        self.rng = np.random.default_rng(seed)
        self.links = {}
        self.addrs, self.dense, self.epoch = list(addrs), len(addrs), 0
        self.acked, self.moved, self.waited = [], 0, 0
        self.stop = threading.Event()
        self.error = None

    def link(self, i):
        addr = self.addrs[i]
        if addr not in self.links:
            w = RawClient(addr, 30.0)
            if i < self.dense:
                lo, hi = 4096 * i // self.dense // 1024 * 1024, 4096 * (i + 1) // self.dense // 1024 * 1024
                if i + 1 == self.dense:
                    hi = 4096
                r = w.hello_worker([["w(1024x4)[%d:%d]" % (lo, hi), [hi - lo]]], 0, 1)
            else:
                r = w.request({"t": 1, "v": 1, "role": "worker", "shard": [0, 1],
                               "pmap": [self.epoch, self.dense, self.addrs]})
            assert r.get("t") == T_WELCOME, r
            self.links[addr] = w
            self.declare(i)
        return self.links[addr]

    def declare(self, i):
        n = len(self.addrs)
        r = self.links[self.addrs[i]].request(dict(DECL, part=[i, n]) if n > 1 else DECL)
        assert r.get("t") == T_OK, r

    def adopt(self, pmap):
        epoch, dense, addrs = pmap
        if epoch <= self.epoch:
            return
        for a in list(self.links):
            if a not in addrs:
                self.links.pop(a).close()
        self.epoch, self.dense, self.addrs = epoch, dense, list(addrs)
        for i, a in enumerate(self.addrs):
            if a in self.links:
                self.declare(i)

    def push(self, keys, grads):
        """Sends keys (and their gradients) until every one is acknowledged."""
        todo = list(zip(keys.tolist(), grads))
        while todo:
            n = len(self.addrs)
            part = {}
            for k, g in todo:
                part.setdefault(part_of(k, n), []).append((k, g))
            todo = []
            for i in sorted(part):
                ks = np.array([k for k, _ in part[i]], "<u8")
                gs = np.array([g for _, g in part[i]], np.float32)
                msg = {"t": T_TPUSH, "tab": "emb", "keys": ks.tobytes(), "base": 0, "data": gs.tobytes()}
                while True:
                    r = self.link(i).request(msg)
                    if r.get("t") == T_ERROR and r["code"] == E_NOT_READY:
                        self.waited += 1
                        time.sleep(0.002)
                        continue
                    break
                if r.get("t") == T_OK:
                    self.acked.append((ks, gs))
                elif r.get("t") == T_ERROR and r["code"] == E_MOVED:
                    self.moved += 1
                    self.adopt(r["pmap"])
                    todo += part[i]  # the whole message again, grouped by the new map
                else:
                    raise AssertionError("push refused: %r" % (r,))

    def run(self):
        try:
            while not self.stop.is_set():
                k = np.unique(self.rng.integers(0, 20000, 300).astype(np.uint64))
                self.push(k, self.rng.standard_normal((k.size, DIM)).astype(np.float32))
        except Exception as e:  # reported by the test
            self.error = e


def grow_and_shrink_under_pushes(cl, parts, prefix, seed, grown=None):
    """A Pusher pushes while parts grow by one new psd (1 MiB/s) and shrink
    back; grown(new) runs once the job has 3 parts. Returns the pusher and
    the new part."""
    pusher = Pusher([p.addr for p in parts], seed=seed)
    th = threading.Thread(target=pusher.run)
    th.start()
    try:
        harness.wait_until(lambda: len(pusher.acked) >= 20 or pusher.error, 60, "pushes before the move")
        new = start(cl, 1, prefix, first=2)[0]
        r = psctl_parts(parts, "add", new.addr, "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        if grown:
            grown(new)
        at = len(pusher.acked)
        harness.wait_until(lambda: len(pusher.acked) >= at + 20 or pusher.error, 60, "pushes after growing")
        r = psctl_parts(parts + [new], "remove", "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = len(pusher.acked)
        harness.wait_until(lambda: len(pusher.acked) >= at + 20 or pusher.error, 60, "pushes after shrinking")
    finally:
        pusher.stop.set()
        th.join(60)
    assert pusher.error is None, repr(pusher.error)
    print("acked %d, moved %d, waited %d" % (len(pusher.acked), pusher.moved, pusher.waited))
    assert pusher.moved >= 2, "no push was refused as moved: the moves did not happen under pushes"
    return pusher, new


def feed(ref, pusher):
    """One psd (ref) fed what the parts acknowledged, in that order."""
    c = psd.Client(LAYOUT, server=ref.addr, shard="0/1", connect=True, connect_s=5, timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    for ks, gs in pusher.acked:
        c.push_rows("emb", ks.astype(np.uint64), gs)
    c.close()
    return stored(ref.addr)


def test_moves_under_pushes(cluster):
    parts = start(cluster, 2, "u")
    ref = start(cluster, 1, "ref")
    train(parts)
    train(ref)  # the same rows on one psd
    same(check_placed(holdings(parts), 2), stored(ref[0].addr))
    pusher, new = grow_and_shrink_under_pushes(cluster, parts, "u", 11)
    same(check_placed(holdings(parts), 2), feed(ref[0], pusher))
    assert holdings([new])[0] == {}


def test_client_follows_moves(cluster):
    """libpsclient (through the Python package) pulls and pushes rows while
    the job grows to 3 parts, then 4, and back to 3 and 2: it follows MOVED
    and NOT_READY by itself, pulls rows from the parts added, and every row
    ends as one psd fed its pushes in the order its calls returned."""
    parts = start(cluster, 2, "c")
    ref = start(cluster, 1, "cref")
    train(parts)
    train(ref)
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    rng = np.random.default_rng(21)
    done, stop, errors = [], threading.Event(), []

    def work():
        try:
            while not stop.is_set():
                k = np.unique(rng.integers(0, 20000, 500).astype(np.uint64))
                rows = c.pull_rows("emb", k)
                assert rows.shape == (k.size, DIM) and np.isfinite(rows).all()
                g = rng.standard_normal((k.size, DIM)).astype(np.float32)
                c.push_rows("emb", k, g)
                done.append((k, g))
        except Exception as e:  # reported below
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    try:
        harness.wait_until(lambda: len(done) >= 10 or errors, 60, "steps before the move")
        new = start(cluster, 1, "c", first=2)[0]
        r = psctl_parts(parts, "add", new.addr, "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = len(done)
        harness.wait_until(lambda: len(done) >= at + 10 or errors, 60, "steps on 3 parts")
        pulled = [t["rows_pulled"] for t in harness.status(new.addr)["tables"]]
        fourth = start(cluster, 1, "c", first=3)[0]
        r = psctl_parts(parts + [new], "add", fourth.addr, "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = len(done)
        harness.wait_until(lambda: len(done) >= at + 10 or errors, 60, "steps on 4 parts")
        r = psctl_parts(parts + [new, fourth], "remove", "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        r = psctl_parts(parts + [new], "remove", "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = len(done)
        harness.wait_until(lambda: len(done) >= at + 10 or errors, 60, "steps on 2 parts again")
    finally:
        stop.set()
        th.join(60)
    assert not errors, repr(errors)
    c.close()
    assert pulled and pulled[0] > 0, "the worker never pulled from the part added"
    r = psd.Client(LAYOUT, server=ref[0].addr, shard="0/1", connect=True, connect_s=5, timeout_ms=20000)
    r.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    for k, g in done:
        r.push_rows("emb", k, g)
    r.close()
    same(check_placed(holdings(parts), 2), stored(ref[0].addr))


def test_ssp_job_grows_and_shrinks(cluster):
    """Mode ssp: a worker's dense steps (its clock) and table calls go on
    while the job grows to 3 parts and back to 2; the part added holds no
    dense values, so no clock of its gates anything."""
    parts = [cluster.psd(mode="ssp", workers=1, name="s%d" % i, args=ARGS) for i in range(2)]
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    rng = np.random.default_rng(31)
    steps, stop, errors = [0], threading.Event(), []

    def work():
        try:
            while not stop.is_set():
                k = np.unique(rng.integers(0, 20000, 500).astype(np.uint64))
                c.pull_rows("emb", k)
                c.push_rows("emb", k, rng.standard_normal((k.size, DIM)).astype(np.float32))
                c.grads[:] = 0.001
                c.pushpull()
                steps[0] += 1
        except Exception as e:  # reported below
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    try:
        harness.wait_until(lambda: steps[0] >= 10 or errors, 60, "steps before the move")
        new = cluster.psd(mode="ssp", workers=1, name="s2", args=ARGS)
        r = psctl_parts(parts, "add", new.addr, "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = steps[0]
        harness.wait_until(lambda: steps[0] >= at + 10 or errors, 60, "steps on 3 parts")
        r = psctl_parts(parts + [new], "remove", "1M")
        assert r.returncode == 0, r.stdout + r.stderr
        at = steps[0]
        harness.wait_until(lambda: steps[0] >= at + 10 or errors, 60, "steps on 2 parts again")
    finally:
        stop.set()
        th.join(60)
    assert not errors, repr(errors)
    version = harness.status(parts[0].addr)["version"]
    c.close()
    assert version >= steps[0]
    check_placed(holdings(parts), 2)
    assert holdings([new])[0] == {}


def move_in_background(psds, *args):
    return subprocess.Popen([harness.Paths.psctl, "--server", ",".join(p.addr for p in psds), "--timeout", "10000",
                             "parts"] + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def taking(p):
    """The new part is taking rows (its pass is under way)."""
    mv = harness.status(p.addr)["parts"]["move"]
    return mv is not None and mv["rows_taken"] > 0


def test_part_killed_mid_move(cluster):
    """Without replicas, a part killed during a move leaves a consistent
    job: the new part killed in its pass, psctl stops saying which part does
    not answer, every row is still on its old part as it was, and `psctl
    parts abort` calls the move off (the job trains on); killed again in
    the next move and started again at its address, the same psctl command
    run again finishes the move, every row on its part under 3 as it was."""
    parts = start(cluster, 2, "k")
    train(parts, steps=20)
    before = check_placed(holdings(parts), 2)
    new = start(cluster, 1, "k", first=2)[0]
    mv = move_in_background(parts, "add", new.addr, "64K")  # about 4 s a source
    harness.wait_until(lambda: taking(new), 60, "the new part's pass")
    new.kill()
    out, err = mv.communicate(timeout=60)
    assert mv.returncode != 0 and "part 2 at %s does not answer" % new.addr in err, out + err
    # consistent: every row on its old part, as it was; the sources in the move, nothing handed over
    same(check_placed(holdings(parts), 2), before)
    for p in parts:
        st = harness.status(p.addr)["parts"]
        assert st["moving"] is True and st["move"]["switched"] == 0, st
    r = psctl_parts(parts, "abort", new.addr)
    assert r.returncode == 0 and "called off on 2 parts" in r.stdout, r.stdout + r.stderr
    for p in parts:
        assert harness.status(p.addr)["parts"]["moving"] is False
    train(parts, steps=2, seed=8)
    before = check_placed(holdings(parts), 2)

    # again, and this time the new part comes back at its address
    new = start(cluster, 1, "k", first=3)[0]
    port = new.port
    mv = move_in_background(parts, "add", new.addr, "64K")
    harness.wait_until(lambda: taking(new), 60, "the new part's pass")
    new.kill()
    out, err = mv.communicate(timeout=60)
    assert mv.returncode != 0, out + err
    again = cluster.psd(mode="asgd", workers=1, name="k3again", args=ARGS + ("--listen", "127.0.0.1:%d" % port))
    assert again.addr == new.addr
    r = psctl_parts(parts, "add", again.addr, "1M")
    assert r.returncode == 0, r.stdout + r.stderr
    same(check_placed(holdings(parts + [again]), 3), before)


def in_sync(leader, follower):
    ld, fl = harness.status(leader.addr)["replication"], harness.status(follower.addr)["replication"]
    return ld["insync"] == 1 and fl["applied"] == ld["log_end"] and fl["lag_bytes"] == 0


def follower_of(cl, leader):
    f = cl.psd(mode="asgd", workers=1, name=leader.name + "f", args=ARGS + ("--replica-of", leader.addr))
    harness.wait_until(lambda: in_sync(leader, f), 60, "%s's follower in sync" % leader.name)
    return f


def same_as_leader(pairs):
    """Each follower holds its leader's rows bit for bit, in the same
    places (eviction draws rows by place), and its map."""
    for leader, f in pairs:
        harness.wait_until(lambda: in_sync(leader, f), 60, "%s's follower to apply its log" % leader.name)
        a, b = stored(leader.addr), stored(f.addr)
        assert list(a) == list(b), "%s's follower holds other rows or places" % leader.name
        same(a, b)
        sl, sf = harness.status(leader.addr)["parts"], harness.status(f.addr)["parts"]
        assert (sf["epoch"], sf["addrs"], sf["self"], sf["moving"]) == (sl["epoch"], sl["addrs"], sl["self"],
                                                                      sl["moving"]), (sl, sf)


def test_moves_with_followers(cluster):
    """Parts with followers (replication = sync) grow 2 -> 3 and shrink back
    while a pusher pushes: each follower applies its leader's move from the
    log (begun, handed over, rows taken, rows dropped, ended), so after
    each move it holds its leader's rows bit for bit in the same places,
    and its map. A part the move added gets its follower after the move's
    end (a snapshot of its rows and map). The leader of part 0 is then
    killed and its follower promoted: it holds every row the pusher's
    acknowledged pushes made, as one psd fed them."""
    parts = start(cluster, 2, "r")
    ref = start(cluster, 1, "rref")
    train(parts)
    train(ref)
    fs = [follower_of(cluster, p) for p in parts]
    nf = []
    pusher, new = grow_and_shrink_under_pushes(cluster, parts, "r", 13,
                                               grown=lambda new: nf.append(follower_of(cluster, new)))
    nf = nf[0]  # its follower took a snapshot of the rows the part took, and its map
    same_as_leader(list(zip(parts, fs)) + [(new, nf)])
    assert stored(nf.addr) == {}  # the part removed dropped its rows, and so did its follower
    for f in fs:
        assert "move of parts to map 2 is over" in f.stderr(), f.stderr()[-2000:]

    # part 0's leader dies; its follower, promoted, holds what was acknowledged
    parts[0].kill()
    r = harness.psctl(fs[0].addr, "promote")
    assert r.returncode == 0, r.stderr
    same(check_placed([stored(fs[0].addr), stored(parts[1].addr)], 2), feed(ref[0], pusher))


def test_source_leader_killed_mid_move(cluster):
    """With replicas, a source's leader killed during the new part's pass:
    its follower, promoted, holds the move as its leader did (from the
    log), the new part's fetching finds it through the replicas the
    source's WELCOME named, and `psctl parts add` run again with each part
    given as its replicas (A/A',B/B') takes the move up: the map keeps the
    dead leader's address as the part's name, psctl reaches the follower.
    Every row ends on its part under 3 as it was, and the job trains on
    through libpsclient given the replicas."""
    parts = start(cluster, 2, "s")
    train(parts, steps=20)
    before = check_placed(holdings(parts), 2)
    fs = [follower_of(cluster, p) for p in parts]
    given = ",".join("%s/%s" % (p.addr, f.addr) for p, f in zip(parts, fs))
    new = start(cluster, 1, "s", first=2)[0]
    mv = subprocess.Popen([harness.Paths.psctl, "--server", given, "--timeout", "10000", "parts", "add", new.addr,
                           "64K"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # about 4 s a source
    harness.wait_until(lambda: taking(new), 60, "the new part's pass")
    parts[0].kill()
    out, err = mv.communicate(timeout=60)
    assert mv.returncode != 0 and "part 0 at %s does not answer" % parts[0].addr in err, out + err
    r = harness.psctl(fs[0].addr, "promote")
    assert r.returncode == 0, r.stderr
    st = harness.status(fs[0].addr)["parts"]
    named = given.split(",") + [new.addr]  # the map names a part as it was given: its replicas
    assert st["moving"] is True and st["move"]["addrs"] == named, st
    r = harness.run([harness.Paths.psctl, "--server", given, "--timeout", "10000", "parts", "add", new.addr, "1M"],
                    timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "part 0: %s in the map, reached at %s" % (named[0], fs[0].addr) in r.stdout, r.stdout
    assert "follows a leader" in new.stderr() or "does not answer" in new.stderr(), new.stderr()[-3000:]
    three = [fs[0], parts[1], new]
    same(check_placed(holdings(three), 3), before)
    for p in three:
        assert harness.status(p.addr)["parts"]["addrs"] == named
    same_as_leader([(parts[1], fs[1])])
    # libpsclient given the parts as the map names them: it reaches part 0's
    # promoted follower, and the part added
    c = psd.Client(LAYOUT, server=given, shard="0/1", connect=True, connect_s=5, timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    keys = np.array(sorted(before)[:500], np.uint64)
    c.push_rows("emb", keys, np.ones((keys.size, DIM), np.float32))
    rows = c.pull_rows("emb", keys)
    c.close()
    assert not np.array_equal(rows, np.stack([before[int(k)] for k in keys])), "the push changed nothing"


def test_new_part_leader_killed_mid_move(cluster):
    """With replicas, the new part's leader killed during its pass: its
    follower (joined before the move, from nothing) holds what the leader
    had taken, from the log; promoted, it fetches again from the sources
    by itself, and `psctl parts add N/N'` run again finishes the move. The
    map names the part as its replicas, so a worker given only the old
    parts finds the promoted follower."""
    parts = start(cluster, 2, "d")
    train(parts, steps=20)
    before = check_placed(holdings(parts), 2)
    new = start(cluster, 1, "d", first=2)[0]
    nf = follower_of(cluster, new)  # from nothing: the new part holds nothing yet
    entry = "%s/%s" % (new.addr, nf.addr)
    mv = move_in_background(parts, "add", entry, "64K")
    harness.wait_until(lambda: taking(new), 60, "the new part's pass")
    harness.wait_until(lambda: harness.status(nf.addr)["parts"]["move"] is not None and
                       harness.status(nf.addr)["parts"]["move"]["rows_taken"] > 0, 60, "the follower to take rows")
    new.kill()
    out, err = mv.communicate(timeout=60)
    assert mv.returncode != 0 and "part 2 at %s does not answer" % new.addr in err, out + err
    r = harness.psctl(nf.addr, "promote")
    assert r.returncode == 0, r.stderr
    harness.wait_until(lambda: "fetches the rows of the parts that did not hand them over" in nf.stderr(), 30,
                       "the promoted follower to take the move up")
    r = psctl_parts(parts, "add", entry, "1M")
    assert r.returncode == 0, r.stdout + r.stderr
    three = parts + [nf]
    same(check_placed(holdings(three), 3), before)
    for p in three:
        assert harness.status(p.addr)["parts"]["addrs"] == [parts[0].addr, parts[1].addr, entry]
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    keys = np.array([k for k in sorted(before) if part_of(k, 3) == 2][:300], np.uint64)
    assert np.array_equal(c.pull_rows("emb", keys), np.stack([before[int(k)] for k in keys]))
    c.close()


@pytest.mark.skipif(etcd.why_no_etcd() is not None, reason=etcd.why_no_etcd() or "")
def test_source_leader_elected_mid_move(cluster):
    """With leaders elected through etcd (a 3-member cluster), a source's
    leader killed during the move: its follower is elected within about
    lease_ttl, with no `psctl promote`, the new part's fetching goes on
    from it, and `psctl parts add` run again finishes the move; the new
    part has a follower from the start. Every row ends on its part under 3
    as it was, and the new map is in etcd (/psd/JOB/map)."""
    with etcd.Etcd(cluster.dir, members=3) as e:
        addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(6)]

        def elected(i, part, leader=None):
            extra = ("--listen", addrs[i], "--set", "coordinator=" + e.urls, "--set", "job=movetest",
                     "--set", "part=%d" % part, "--set", "lease_ttl=3s")
            p = cluster.psd(mode="asgd", workers=1, name="e%d" % i,
                            args=ARGS + extra + (("--replica-of", leader.addr) if leader else ()))
            if leader:
                harness.wait_until(lambda: in_sync(leader, p), 60, "e%d in sync" % i)
            else:
                harness.wait_until(lambda: harness.status(p.addr)["coordinator"]["role"] == "leader", 30,
                                   "e%d to lead part %d" % (i, part))
            return p

        a, b = elected(0, 0), elected(2, 1)
        train([a, b], steps=20)
        before = check_placed(holdings([a, b]), 2)
        af, bf = elected(1, 0, a), elected(3, 1, b)
        new = elected(4, 2)
        nf = elected(5, 2, new)
        given = "%s/%s,%s/%s" % (a.addr, af.addr, b.addr, bf.addr)
        entry = "%s/%s" % (new.addr, nf.addr)
        argv = [harness.Paths.psctl, "--server", given, "--timeout", "10000", "parts", "add", entry]
        mv = subprocess.Popen(argv + ["64K"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        harness.wait_until(lambda: taking(new), 60, "the new part's pass")
        a.kill()
        harness.wait_until(lambda: harness.status(af.addr)["coordinator"]["role"] == "leader", 30,
                           "a's follower to be elected")
        out, err = mv.communicate(timeout=60)
        assert mv.returncode != 0 and "part 0 at %s does not answer" % a.addr in err, out + err
        r = harness.run(argv + ["1M"], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        three = [af, b, new]
        same(check_placed(holdings(three), 3), before)
        same_as_leader([(b, bf), (new, nf)])
        # the job's map in etcd, put by the parts' leaders once they serve under it
        harness.wait_until(lambda: all(harness.status(p.addr)["coordinator"]["map_epoch"] == 1 for p in three), 30,
                           "the leaders to put the map in etcd")
        assert e.get("/psd/movetest/map") == "1 2 %s,%s" % (given, entry)


def test_new_part_out_of_table_memory(cluster):
    """A new part whose max_table_memory cannot hold the rows moving to it
    stops the move in its pass, with an error naming the bound: nothing was
    handed over, so every row is still on its old part as it was and the
    job trains on; raised (psctl set), the same psctl command run again
    finishes the move."""
    parts = start(cluster, 2, "l")
    train(parts, steps=20)
    before = check_placed(holdings(parts), 2)
    new = cluster.psd(mode="asgd", workers=1, name="l2", args=ARGS + ("--set", "max_table_memory=64K"))
    r = psctl_parts(parts, "add", new.addr)
    assert r.returncode != 0 and "the move stopped at %s" % new.addr in r.stderr, r.stdout + r.stderr
    assert "max_table_memory" in r.stderr, r.stderr
    assert "its fetching stops (the source keeps its rows)" in new.stderr()
    same(check_placed(holdings(parts), 2), before)
    for p in parts:
        st = harness.status(p.addr)["parts"]
        assert st["moving"] is True and st["move"]["switched"] == 0, st
    train(parts, steps=2, seed=8)  # no key is refused: they stay where they were
    before = check_placed(holdings(parts), 2)
    r = harness.psctl(new.addr, "set", "max_table_memory=64M")
    assert r.returncode == 0, r.stdout + r.stderr
    r = psctl_parts(parts, "add", new.addr)
    assert r.returncode == 0, r.stdout + r.stderr
    same(check_placed(holdings(parts + [new]), 3), before)


def test_new_part_checkpoints_its_rows(cluster):
    """A part a move added holds no dense values, yet writes checkpoints of
    its rows: one as the move ends, and others as they change. Killed and
    started again from its state_dir, it holds every row it held, as it
    was, knows the map, and workers train on through it."""
    parts = start(cluster, 2, "c")
    train(parts)
    state = os.path.join(cluster.dir, "c2state")
    new = cluster.psd(mode="asgd", workers=1, name="c2", args=ARGS + ("--state-dir", state))
    r = psctl_parts(parts, "add", new.addr)
    assert r.returncode == 0, r.stdout + r.stderr
    harness.wait_until(lambda: any(f.endswith(".psdc") for f in os.listdir(state)), 30, "the new part's checkpoint")
    train(parts + [new], steps=3, seed=11)  # rows change after the first checkpoint
    r = harness.psctl(new.addr, "checkpoint")
    assert r.returncode == 0, r.stdout + r.stderr
    held = stored(new.addr)
    assert len(held) > 1000
    port = new.port
    new.kill()
    again = cluster.psd(mode="asgd", workers=1, name="c2again",
                        args=ARGS + ("--state-dir", state, "--listen", "127.0.0.1:%d" % port))
    assert "loaded checkpoint" in again.stderr(), again.stderr()
    same(stored(again.addr), held)
    st = harness.status(again.addr)
    assert st["parts"]["epoch"] == 1 and st["parts"]["self"] == 2 and st["parameters"] == 0, st["parts"]
    every = check_placed(holdings(parts + [again]), 3)
    train(parts + [again], steps=2, seed=12)
    after = check_placed(holdings(parts + [again]), 3)
    assert len(after) >= len(every)


def test_grown_job_resharded_offline(cluster):
    """A job grown online (its third part holds table rows only) resharded
    offline into 2 parts (psd --reshard-from): the dense model is joined
    from the parts that hold it, every row lands on its part under 2, as it
    was."""
    dirs = [os.path.join(cluster.dir, "g%d" % i) for i in range(3)]
    parts = [cluster.psd(mode="asgd", workers=1, name="g%d" % i, args=ARGS + ("--state-dir", dirs[i]))
             for i in range(3)]
    train(parts[:2])
    r = psctl_parts(parts[:2], "add", parts[2].addr)
    assert r.returncode == 0, r.stdout + r.stderr
    train(parts, steps=3, seed=13)
    every = check_placed(holdings(parts), 3)
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    dense = c.params.copy()
    c.close()
    for p in parts:
        r = harness.psctl(p.addr, "checkpoint")
        assert r.returncode == 0, r.stdout + r.stderr
        p.stop()
    new = []
    for i in range(2):
        dest = os.path.join(cluster.dir, "r%d" % i)
        r = harness.run([harness.Paths.psd, "--reshard-from", ",".join(dirs), "--part", "%d/2" % i,
                         "--state-dir", dest] + list(ARGS), timeout=60)
        assert r.returncode == 0, r.stderr
        new.append(cluster.psd(mode="asgd", workers=1, name="r%d" % i, args=ARGS + ("--state-dir", dest)))
    same(check_placed(holdings(new), 2), every)
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in new), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    assert np.array_equal(c.params, dense)
    c.close()
    # listed out of order, the table-only part first: refused, saying why
    r = harness.run([harness.Paths.psd, "--reshard-from", ",".join([dirs[2], dirs[0], dirs[1]]), "--part", "0/2",
                     "--state-dir", os.path.join(cluster.dir, "bad")] + list(ARGS), timeout=60)
    assert r.returncode != 0 and "old part 0 holds table rows only" in r.stderr, r.stderr


def test_map_kept_in_checkpoints(cluster):
    """A part restarted from its checkpoint after a move knows the map: its
    status says so, it refuses a key that moved (MOVED, with the map), and
    a worker given the old list finds the new part from its WELCOME."""
    dirs = [os.path.join(cluster.dir, "state%d" % i) for i in range(2)]
    parts = [cluster.psd(mode="asgd", workers=1, name="m%d" % i, args=ARGS + ("--state-dir", dirs[i]))
             for i in range(2)]
    touched = train(parts)
    new = start(cluster, 1, "m", first=2)[0]
    r = psctl_parts(parts, "add", new.addr)
    assert r.returncode == 0, r.stdout + r.stderr
    every = check_placed(holdings(parts + [new]), 3)
    r = harness.psctl(parts[0].addr, "checkpoint")
    assert r.returncode == 0, r.stderr
    port = parts[0].port
    parts[0].kill()
    parts[0] = cluster.psd(mode="asgd", workers=1, name="m0again",
                           args=ARGS + ("--state-dir", dirs[0], "--listen", "127.0.0.1:%d" % port))
    st = harness.status(parts[0].addr)["parts"]
    assert st["epoch"] == 1 and st["self"] == 0 and st["addrs"] == [p.addr for p in parts + [new]], st
    k = next(k for k in sorted(touched) if part_of(k, 2) == 0 and part_of(k, 3) == 2)
    with RawClient(parts[0].addr, 10.0) as a:
        a.hello_admin()
        e = a.request({"t": T_TPULL, "tab": "emb", "keys": np.array([k], "<u8").tobytes()})
        assert e["t"] == T_ERROR and e["code"] == E_MOVED and e["pmap"][0] == 1, e
    # a worker given the old list: every row as it was, from its part under 3
    c = psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", connect=True, connect_s=5,
                   timeout_ms=20000)
    c.table("emb", DIM, init="uniform", scale=0.05, seed=3, opt="adagrad", lr=0.1)
    keys = np.array(sorted(every), np.uint64)
    got = c.pull_rows("emb", keys)
    c.close()
    for i, key in enumerate(keys.tolist()):
        assert np.array_equal(got[i].view(np.uint32), every[key].view(np.uint32)), key
