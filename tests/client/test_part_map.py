"""test_part_map.py - libpsclient under a job whose parts move (proto/PROTOCOL.md
18): a part map in a WELCOME, an ERROR LAYOUT or an ERROR MOVED is adopted,
table calls follow it, NOT_READY is asked again.

Run by ctest (client_part_map) with Debian's pytest, as test_python.py:

    PSD_CLIENT_LIBRARY=build/client/libpsclient.so.1 PYTHONPATH=python \\
        /usr/bin/python3 -m pytest -q tests/client/test_part_map.py

The psd here are stand-ins written in Python from the protocol's text (one
per part, speaking msgpack frames), so that a move can be made to happen at
an exact moment: each holds its part's dense values and its table rows
(zeros stepped by sgd at the table's lr), answers a table message holding a
key that is not its own under the map of its move with ERROR MOVED carrying
that map, and can answer the next table messages NOT_READY. The test moves
the rows between them as a move's handover would, and checks what the
client sent where:

- two parts, one answering MOVED with a map adding a third: the client
  declares its tables to all three with [i, 3], sends each key not yet
  answered to its part under 3 (the third gets exactly its keys), sends
  nothing again to the part that answered, and every row ends as one psd
  holding them all would hold it; the third part's HELLO carries the part
  map in place of a layout, it gets heartbeats and no dense request;
- a WELCOME's map adding a part, then a MOVED's map dropping it again: the
  dropped part is told BYE, its rows go back and are found there;
- a client started with three addresses while the map holds the dense
  model on two: ERROR LAYOUT with the map at the first hello, the dense
  model split anew over two, the values pulled from both; addresses given
  in another order than the map's: each link goes to its address's part;
  a map whose dense parts the model cannot be split over: refused (EINVAL);
- one part moving to two, for a pull, a push and a push-and-pull: the
  call's keys, sent as the caller gave them to one psd, grouped anew;
- NOT_READY: the same message again after a wait, applied once; a part
  that stays not ready fails the call after the timeout, without a
  reconnect.
"""

import os
import socket
import struct
import sys
import threading
import time

import msgpack
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
from harness import part_of  # noqa: E402
from harness import (T_BYE, T_ERROR, T_HEARTBEAT, T_HELLO, T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL,  # noqa: E402
                     T_REPORT, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, T_TPUSHPULL, T_WELCOME)

import psd  # noqa: E402

LAYOUT = [("w", (1024, 4))]  # 4096 values: 1024 a part at least for 3 parts
P = 4096
DIM = 4
LR = 0.5
E_LAYOUT, E_NOT_READY, E_MOVED = 7, 13, 26


def bounds(i, n):
    """Part i of n of the P values (PROTOCOL.md 6.2: boundaries rounded
    down to 1024 values, the last part to the end)."""
    def cut(k):
        return P if k == n else P * k // n // 1024 * 1024
    return cut(i), cut(i + 1)


def part_layout(i, n):
    """The layout psd holding part i of n holds (proto/layout.h,
    ps_layout_part): the model's one tensor, or its cut piece."""
    if n == 1:
        return [[name, list(dims)] for name, dims in LAYOUT]
    lo, hi = bounds(i, n)
    return [["w(1024x4)[%d:%d]" % (lo, hi), [hi - lo]]]


class StandIn:
    """A stand-in psd for one part on 127.0.0.1: a thread per connection,
    every request answered in order. `values` is the whole dense model; the
    part holds its slice under `expect` = (index, dense) (None: a
    table-only part, which expects an empty layout)."""

    def __init__(self, index, values, expect, hb=300):
        self.index = index
        self.all_values = values.copy()
        self.expect = expect
        self.hb = hb
        self.pmap = None          # [epoch, dense, [addr, ...]]: in WELCOME, LAYOUT and MOVED
        self.moved_n = None       # a table message with a key whose part of moved_n is not index: MOVED
        self.not_ready = 0        # the next this many table messages: NOT_READY
        self.cut_next = None      # f: the next table push is applied, then f() runs and the connection is cut
        self.cutting = None
        self.pids = set()         # push ids applied: one sent again is answered as then (PROTOCOL.md 15)
        self.rows = {}            # (tab, key) -> row
        self.applied = {}         # (tab, key) -> gradients applied
        self.tables = []          # (tab, part) of each TABLE
        self.hellos = []          # (layout, fp, pmap) of each HELLO
        self.table_msgs = []      # (t, pid, keys) of each table message, answered or not
        self.answers = []         # ("ok" | "moved" | "not_ready") for each
        self.dense = 0            # dense requests (PULL, PUSH, PUSHPULL)
        self.heartbeats = 0
        self.byes = []            # their texts
        self.version = 0
        self.lock = threading.Lock()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def values(self):
        lo, hi = bounds(*self.expect)
        return self.all_values[lo:hi]

    def _accept(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        with s:
            s.settimeout(30)
            try:
                while True:
                    head = s.recv(4, socket.MSG_WAITALL)
                    if len(head) < 4:
                        return
                    (n,) = struct.unpack(">I", head)
                    m = msgpack.unpackb(s.recv(n, socket.MSG_WAITALL), raw=False)
                    with self.lock:
                        r = self._answer(m)
                        f, self.cutting = self.cutting, None
                    if f:  # applied, the reply lost
                        f()
                        return
                    if r is not None:
                        r["id"] = m.get("id", 0)
                        s.sendall(harness.frame(harness.pack(r)))
                    if m.get("t") == T_BYE:
                        return
            except (OSError, struct.error, ValueError):
                return

    def _error(self, code, text):
        r = {"t": T_ERROR, "code": code, "text": text}
        if self.pmap:
            r["pmap"] = self.pmap
        return r

    def _answer(self, m):
        t = m.get("t")
        if t == T_HELLO:
            layout = m.get("layout")
            self.hellos.append((layout, m.get("fp"), m.get("pmap")))
            if self.expect is None:
                # a part holding no dense values: the part map in place of a layout
                want = 0
                if layout is not None or m.get("pmap") != self.pmap:
                    return self._error(E_LAYOUT, "this psd holds no dense values: send the part map, not a layout")
            else:
                want = bounds(*self.expect)[1] - bounds(*self.expect)[0]
                if layout != part_layout(*self.expect):
                    return self._error(E_LAYOUT, "this psd holds another part of the model")
            w = {"t": T_WELCOME, "v": 1, "mode": "asgd", "ver": self.version,
                 "params": want, "workers": 1, "init": False, "hb": self.hb}
            if self.pmap:
                w["pmap"] = self.pmap
            return w
        if t == T_HEARTBEAT:
            self.heartbeats += 1
            return None
        if t == T_BYE:
            self.byes.append(m.get("text", ""))
            return {"t": T_OK}
        if t == T_REPORT:
            return {"t": T_OK}
        if t in (T_PULL, T_PUSH, T_PUSHPULL):
            self.dense += 1
            if self.expect is None:
                return self._error(E_LAYOUT, "a table-only part holds no dense values")
            v = self.values()
            if t != T_PULL:
                g = np.frombuffer(m["data"], "<f4")
                v[m["off"]:m["off"] + g.size] -= np.float32(LR) * g
                self.version += 1
            if t == T_PUSH:
                return {"t": T_OK, "ver": self.version}
            off, n = (m["off"], m["len"]) if t == T_PULL else (m["poff"], m["plen"])
            return {"t": T_PARAMS, "ver": self.version, "off": off, "data": v[off:off + n].tobytes()}
        if t == T_TABLE:
            self.tables.append((m["tab"], tuple(m["part"]) if "part" in m else None))
            return {"t": T_OK}
        if t in (T_TPULL, T_TPUSH, T_TPUSHPULL):
            keys = np.frombuffer(m["keys"], "<u8").tolist()
            pkeys = np.frombuffer(m["pkeys"], "<u8").tolist() if "pkeys" in m else []
            self.table_msgs.append((t, m.get("pid"), keys, pkeys))
            if t == T_TPUSH and m.get("pid") in self.pids:
                self.answers.append("again")
                return {"t": T_OK, "ver": self.version}
            if self.not_ready:
                self.not_ready -= 1
                self.answers.append("not_ready")
                return self._error(E_NOT_READY, "the key's new owner does not hold it yet")
            if self.moved_n and any(part_of(k, self.moved_n) != self.index for k in keys + pkeys):
                self.answers.append("moved")
                return self._error(E_MOVED, "the key's part moved")
            self.answers.append("ok")
            tab = m["tab"]
            if t != T_TPULL:
                g = np.frombuffer(m["data"], "<f4").reshape(-1, DIM)
                for k, row in zip(keys, g):
                    self.rows[(tab, k)] = self.rows.get((tab, k), np.zeros(DIM, np.float32)) - np.float32(LR) * row
                    self.applied[(tab, k)] = self.applied.get((tab, k), 0) + 1
                if m.get("pid"):
                    self.pids.add(m["pid"])
                if self.cut_next:
                    self.cutting, self.cut_next = self.cut_next, None
                    return None
                if t == T_TPUSH:
                    return {"t": T_OK, "ver": self.version}
                keys = pkeys
            out = np.stack([self.rows.get((tab, k), np.zeros(DIM, np.float32)) for k in keys])
            return {"t": T_ROWS, "ver": self.version, "data": out.astype("<f4").tobytes()}
        return self._error(4, "the stand-in does not take type %s" % t)

    def keys(self, tab="emb"):
        with self.lock:
            return sorted(k for (t, k) in self.rows if t == tab)

    def close(self):
        self.lsock.close()


def handover(parts, n):
    """A move's handover: every row to the part of its key under n."""
    rows = {}
    for p in parts:
        with p.lock:
            rows.update(p.rows)
            p.rows = {}
    for (tab, k), row in rows.items():
        owner = parts[part_of(k, n)]
        with owner.lock:
            owner.rows[(tab, k)] = row


def client(parts, **kw):
    kw.setdefault("connect_s", 5)
    kw.setdefault("timeout_ms", 5000)
    return psd.Client(LAYOUT, server=",".join(p.addr for p in parts), shard="0/1", **kw)


def grads(keys, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 8, size=(len(keys), DIM)).astype(np.float32)


def pick(n_old, n_new, old, new, count, start=0):
    """count keys whose part is `old` of n_old and `new` of n_new."""
    out, k = [], start
    while len(out) < count:
        if part_of(k, n_old) == old and part_of(k, n_new) == new:
            out.append(k)
        k += 1
    return out


@pytest.fixture
def values():
    return (np.arange(P) % 97).astype(np.float32)


def test_moved_adds_a_part(values):
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    c3 = StandIn(2, values, None)
    try:
        cl = client([a, b])
        cl.connect()
        assert np.array_equal(cl.params, values)
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        assert a.tables == [("emb", (0, 2))] and b.tables == [("emb", (1, 2))]
        keys = list(range(300))
        g1 = grads(keys, 1)
        cl.push_rows("emb", keys, g1)
        assert a.keys() == [k for k in keys if part_of(k, 2) == 0]
        assert b.keys() == [k for k in keys if part_of(k, 2) == 1]

        # the move: a third part, the rows of its keys handed over; a and b
        # now refuse a key that is not theirs under 3, naming the map
        pmap = [1, 2, [a.addr, b.addr, c3.addr]]
        for p in (a, b, c3):
            p.pmap = pmap
            p.moved_n = 3
        handover([a, b, c3], 3)

        # one call: a holds a moved key (MOVED), b's keys all stay on b (it
        # answers, and must not see them again)
        moved_a = pick(2, 3, 0, 2, 1, 1000)
        stay_a = pick(2, 3, 0, 0, 3, 1000)
        stay_b = pick(2, 3, 1, 1, 4, 1000)
        call = stay_a + moved_a + stay_b + stay_a[:1]  # a repeat: summed
        g2 = grads(call, 2)
        cl.push_rows("emb", call, g2)
        assert a.answers[-2:] == ["moved", "ok"], a.answers
        assert [m[2] for m in b.table_msgs[-1:]] == [stay_b] and b.answers[-1] == "ok"
        assert all(set(m[2]) != set(stay_b) for m in b.table_msgs[:-1])  # b got them once
        assert c3.table_msgs[-1][2] == moved_a
        # tables declared again to every part with the new [i, n]
        assert a.tables[-1] == ("emb", (0, 3)) and b.tables[-1] == ("emb", (1, 3))
        assert c3.tables == [("emb", (2, 3))]
        # the added part: the map in place of a layout, heartbeats, no dense request
        assert c3.hellos == [(None, None, pmap)]
        assert cl.servers == 3
        harness.wait_until(lambda: c3.heartbeats >= 2, 10, "heartbeats on the added part's link")

        # a pushpull of all the keys and more: each to its part under 3
        more = list(range(300, 420))
        g3 = grads(keys + more, 3)
        rows = cl.pushpull_rows("emb", keys + more, g3, keys + more)
        want = {}
        for ks, g in ((keys, g1), (call, g2), (keys + more, g3)):
            for k, row in zip(ks, g):
                want[k] = want.get(k, np.zeros(DIM, np.float32)) - np.float32(LR) * row
        assert np.array_equal(rows, np.stack([want[k] for k in keys + more]))
        assert np.array_equal(cl.pull_rows("emb", keys + call), np.stack([want[k] for k in keys + call]))
        for i, p in enumerate((a, b, c3)):
            assert p.keys() == sorted(k for k in want if part_of(k, 3) == i), i
        assert c3.keys() and all(part_of(k, 3) == 2 for k in c3.keys())
        # every gradient applied once: a key's count of applications is the
        # number of calls that pushed it
        counts = {}
        for ks in (keys, sorted(set(call)), keys + more):
            for k in ks:
                counts[k] = counts.get(k, 0) + 1
        applied = {}
        for p in (a, b, c3):
            for (_, k), n in p.applied.items():
                applied[k] = applied.get(k, 0) + n
        assert applied == counts

        # dense calls to the first `dense` parts only
        d0 = c3.dense
        cl.grads[:] = 1.0
        cl.pushpull()
        assert c3.dense == d0 == 0
        assert np.array_equal(cl.params, values - np.float32(LR))
        cl.close()
        assert c3.byes == [""]  # the plain bye of a client leaving
    finally:
        for p in (a, b, c3):
            p.close()


def test_welcome_adds_then_moved_drops_a_part(values):
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    c3 = StandIn(2, values, None)
    try:
        for p in (a, b, c3):
            p.pmap = [1, 2, [a.addr, b.addr, c3.addr]]
        cl = client([a, b])  # the old list: the WELCOME names the third
        cl.connect()
        assert cl.servers == 3 and c3.hellos == [(None, None, c3.pmap)]
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        assert [p.tables for p in (a, b, c3)] == [[("emb", (i, 3))] for i in range(3)]
        keys = list(range(500))
        g1 = grads(keys, 4)
        cl.push_rows("emb", keys, g1)
        assert c3.keys() == [k for k in keys if part_of(k, 3) == 2]

        # back to two parts: the third's rows handed back; a and b refuse
        # keys not theirs under 2
        for p in (a, b, c3):
            p.pmap = [2, 2, [a.addr, b.addr]]
            p.moved_n = 2
        handover([a, b, c3], 2)
        rows = cl.pull_rows("emb", keys)
        assert np.array_equal(rows, -np.float32(LR) * g1)
        assert cl.servers == 2
        assert len(c3.byes) == 1 and "part map" in c3.byes[0]
        assert a.tables[-1] == ("emb", (0, 2)) and b.tables[-1] == ("emb", (1, 2))
        g2 = grads(keys, 5)
        cl.push_rows("emb", keys, g2)
        assert np.array_equal(cl.pull_rows("emb", keys), -np.float32(LR) * (g1 + g2))
        assert a.keys() == [k for k in keys if part_of(k, 2) == 0]
        cl.close()
    finally:
        for p in (a, b, c3):
            p.close()


def test_lost_reply_as_the_map_changes(values):
    """A push part a applied and whose reply was lost, its rows handed over
    to a third part before the worker reconnected: the WELCOME's map would
    send some of its keys to the third part, which holds their rows with
    the push applied. The client sends that push to a again first, as it
    was (same push id): a answers it as then, and no key is applied twice."""
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    c3 = StandIn(2, values, None)
    try:
        cl = client([a, b])
        cl.connect()
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        keys = list(range(400))
        g1 = grads(keys, 7)
        cl.push_rows("emb", keys, g1)

        def move():
            for p in (a, b, c3):
                p.pmap = [1, 2, [a.addr, b.addr, c3.addr]]
                p.moved_n = 3
            handover([a, b, c3], 3)
        a.cut_next = move
        g2 = grads(keys, 8)
        cl.push_rows("emb", keys, g2)
        assert a.answers[-1] == "again" and a.table_msgs[-1][1] == a.table_msgs[-2][1], a.answers
        assert cl.servers == 3
        applied = {}
        for p in (a, b, c3):
            for (_, k), n in p.applied.items():
                applied[k] = applied.get(k, 0) + n
        assert applied == {k: 2 for k in keys}
        assert np.array_equal(cl.pull_rows("emb", keys), -np.float32(LR) * (g1 + g2))
        moved = [k for k in keys if part_of(k, 3) == 2]
        assert moved and c3.keys() == sorted(moved)
        # none of a's keys applied on the third part (b may have refused some
        # of its own, arriving after the move: those the third part applied once)
        assert all(part_of(k, 2) == 1 for (_, k) in c3.applied), sorted(c3.applied)
        cl.close()
    finally:
        for p in (a, b, c3):
            p.close()


def test_layout_with_pmap_at_first_hello_splits_anew(values):
    # the job's map: three parts, the dense model on the first two; the
    # worker is given all three, so it first splits the model over three
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    c3 = StandIn(2, values, None)
    try:
        for p in (a, b, c3):
            p.pmap = [4, 2, [a.addr, b.addr, c3.addr]]
        cl = client([a, b, c3])
        cl.connect()
        assert [h[0] for h in a.hellos] == [part_layout(0, 3), part_layout(0, 2)]
        assert a.hellos[1][0] == [["w(1024x4)[0:2048]", [2048]]]
        assert b.hellos == [([["w(1024x4)[2048:4096]", [2048]]], harness.layout_fingerprint(
            [("w(1024x4)[2048:4096]", (2048,))]), None)]
        assert c3.hellos == [(None, None, [4, 2, [a.addr, b.addr, c3.addr]])]
        assert np.array_equal(cl.params, values)
        cl.grads[:] = np.arange(P, dtype=np.float32) % 3
        cl.pushpull()
        assert np.array_equal(cl.params, values - np.float32(LR) * (np.arange(P, dtype=np.float32) % 3))
        assert c3.dense == 0 and a.dense >= 2 and b.dense >= 2
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        keys = list(range(200))
        g = grads(keys, 6)
        cl.push_rows("emb", keys, g)
        assert np.array_equal(cl.pull_rows("emb", keys), -np.float32(LR) * g)
        for i, p in enumerate((a, b, c3)):
            assert p.keys() == [k for k in keys if part_of(k, 3) == i]
        cl.close()
    finally:
        for p in (a, b, c3):
            p.close()


@pytest.mark.parametrize("op", ["pull", "push", "pushpull"])
def test_one_part_moves_to_two(values, op):
    # with one psd a call's distinct keys go as the caller gave them, from
    # and into its arrays; the MOVED call's are grouped anew from there
    a, b = StandIn(0, values, (0, 1)), StandIn(1, values, None)
    try:
        cl = client([a])
        cl.connect()
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        keys = list(range(40, 0, -1))  # distinct, not in order
        g1 = grads(keys, 8)
        cl.push_rows("emb", keys, g1)
        assert a.table_msgs[-1][2] == keys  # as given
        for p in (a, b):
            p.pmap = [1, 1, [a.addr, b.addr]]
            p.moved_n = 2
        handover([a, b], 2)
        g2 = grads(keys, 9)
        if op == "pull":
            rows = cl.pull_rows("emb", keys)
            want = -np.float32(LR) * g1
        elif op == "push":
            cl.push_rows("emb", keys, g2)
            rows = cl.pull_rows("emb", keys)
            want = -np.float32(LR) * (g1 + g2)
        else:
            nxt = list(range(60, 20, -1))
            rows = cl.pushpull_rows("emb", keys, g2, nxt)
            byk = {k: -np.float32(LR) * (g1[i] + g2[i]) for i, k in enumerate(keys)}
            want = np.stack([byk.get(k, np.zeros(DIM, np.float32)) for k in nxt])
        assert np.array_equal(rows, want)
        assert a.answers.count("moved") == 1 and b.answers and "moved" not in b.answers
        assert b.tables == [("emb", (1, 2))] and a.tables[-1] == ("emb", (0, 2))
        assert b.table_msgs[0][2] == [k for k in keys if part_of(k, 2) == 1]
        assert a.keys() == sorted(k for k in keys if part_of(k, 2) == 0)
        assert b.keys() == sorted(k for k in keys if part_of(k, 2) == 1)
        applied = {}
        for p in (a, b):
            for (_, k), n in p.applied.items():
                applied[k] = applied.get(k, 0) + n
        assert applied == {k: 1 if op == "pull" else 2 for k in keys}
        cl.close()
    finally:
        a.close()
        b.close()


def test_parts_given_out_of_order_are_matched_by_address(values):
    # the worker lists b before a: each link goes to the part of its address
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    c3 = StandIn(2, values, None)
    try:
        for p in (a, b, c3):
            p.pmap = [2, 2, [a.addr, b.addr, c3.addr]]
        cl = client([b, a])
        cl.connect()
        assert b.hellos[0][0] == part_layout(0, 2) and b.hellos[-1][0] == part_layout(1, 2)
        assert a.hellos[-1][0] == part_layout(0, 2) and c3.hellos[-1][0] is None
        assert np.array_equal(cl.params, values)
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        assert [p.tables for p in (a, b, c3)] == [[("emb", (i, 3))] for i in range(3)]
        keys = list(range(100))
        g = grads(keys, 10)
        cl.push_rows("emb", keys, g)
        assert np.array_equal(cl.pull_rows("emb", keys), -np.float32(LR) * g)
        for i, p in enumerate((a, b, c3)):
            assert p.keys() == [k for k in keys if part_of(k, 3) == i]
        cl.close()
    finally:
        for p in (a, b, c3):
            p.close()


def test_a_map_the_model_cannot_be_split_by_is_refused(values):
    # dense 5: 4096 values cannot be split into parts of 1024 or more
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    try:
        for p in (a, b):
            p.pmap = [1, 5, [a.addr, b.addr] + ["127.0.0.1:%d" % (1 + i) for i in range(3)]]
        cl = client([a, b])
        with pytest.raises(psd.PsdError, match="cannot be") as e:
            cl.connect()
        assert e.value.name == "EINVAL"
        cl.close()
    finally:
        a.close()
        b.close()


def test_not_ready_is_asked_again(values):
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    try:
        cl = client([a, b])
        cl.connect()
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        keys = list(range(100))
        g = grads(keys, 7)
        a.not_ready = 4
        t0 = time.monotonic()
        cl.push_rows("emb", keys, g)
        took = time.monotonic() - t0
        assert a.answers == ["not_ready"] * 4 + ["ok"]
        assert took >= (1 + 2 + 4 + 8) / 1000.0
        # the same message each time: its keys and its push id
        assert len({(m[1], tuple(m[2])) for m in a.table_msgs}) == 1
        assert len(b.table_msgs) == 1  # b answered the first time
        assert np.array_equal(cl.pull_rows("emb", keys), -np.float32(LR) * g)
        assert all(n == 1 for n in a.applied.values())
        assert cl.reconnects == 0 and len(a.hellos) == 1
        cl.close()
    finally:
        a.close()
        b.close()


def test_not_ready_past_the_timeout_fails_the_call(values):
    a, b = StandIn(0, values, (0, 2)), StandIn(1, values, (1, 2))
    try:
        cl = client([a, b], timeout_ms=400)
        cl.connect()
        cl.table("emb", DIM, init="zeros", opt="sgd", lr=LR)
        a.not_ready = 10 ** 6
        t0 = time.monotonic()
        with pytest.raises(psd.PsdError, match="does not hold it yet") as e:
            cl.pull_rows("emb", list(range(50)))
        took = time.monotonic() - t0
        assert e.value.code == -E_NOT_READY
        assert 0.4 <= took < 3.0, took
        assert cl.reconnects == 0 and len(a.hellos) == 1
        # waits doubling to at most 50 ms: about 13 tries in 400 ms (fewer on
        # a loaded machine), neither a busy loop nor a second's backoff
        assert 5 <= len(a.table_msgs) <= 40, len(a.table_msgs)
        a.not_ready = 0
        assert np.array_equal(cl.pull_rows("emb", [1, 2]), np.zeros((2, DIM), np.float32))
        cl.close()
    finally:
        a.close()
        b.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
