"""test_read_replica.py - a follower answers readers (proto/PROTOCOL.md 15, 17).

A leader and its follower hold test_tables_kill.py's model (an AdaGrad
table and a dense part) after two workers trained it. Then:

- a client that says hello as a reader (HELLO "reader", libpsclient's
  option `reader`) is welcome on the follower, where a worker is refused
  with NOT_LEADER; its pulls and table pulls answer what the leader holds,
  bit for bit, and every answer carries "lag" (the bytes of the leader's
  log the follower has not applied: 0 once in sync); a leader's answers
  carry none;
- the follower refuses the reader's pushes, table pushes, initial values
  and a new table with NOT_LEADER naming the leader, and applies nothing;
  a leader refuses a reader's push with FORBIDDEN;
- a reader takes no shard: the job's workers still join both shards, and
  a reader before the follower has a snapshot is told NOT_READY;
- a reader's pull for a version the follower has not applied yet is
  answered once the follower has applied it;
- libpsclient: Client(reader=True) pulls from the follower, `lag` says 0
  (-1 from a leader), and its push fails with the follower's refusal.

The messages are built with Python's msgpack (harness.RawClient), not with
psd's encoder.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_replica as tr  # noqa: E402
import test_tables_kill as tk  # noqa: E402

import psd  # noqa: E402

LAYOUT = [["u", [4]], ["b", [1]]]
E_NOT_LEADER = 25
E_FORBIDDEN = 15
E_NOT_READY = 13
TABLE = {"tab": "emb", "dim": 4, "rinit": "normal", "scale": 0.05, "seed": 9, "opt": "adagrad", "hp": {"lr": 0.1}}


def reader(addr, **kw):
    c = harness.RawClient(addr, 10)
    c.__enter__()
    r = c.hello_worker(LAYOUT, 0, 1, reader=True, **kw)
    return c, r


def test_a_follower_answers_readers():
    with harness.Cluster("psd-read-replica") as cl:
        leader = cl.psd(workers=2, name="leader", args=tr.leader_args(cl, "leader"))
        follower = tr.follow(cl, leader)
        # no snapshot yet (the model has no values): a reader is told to ask again
        c, r = reader(follower.addr)
        assert r["t"] == harness.T_ERROR and r["code"] == E_NOT_READY, r
        assert "no snapshot" in r["text"], r
        c.close()
        ws = tr.start_workers(cl, leader.addr, steps=40)
        tk.finish(ws)
        harness.wait_until(lambda: tr.in_sync(leader, follower), 60, "the follower in sync")
        saved = os.path.join(cl.dir, "leader.safetensors")
        rr = harness.psctl(leader.addr, "save", saved)
        assert rr.returncode == 0, rr.stderr
        meta, tensors = harness.read_safetensors(saved)
        keys = tensors["tables/emb/keys"].view(np.uint64)[:500].copy()
        want_rows = tensors["tables/emb/rows"][:500].tobytes()
        want_dense = np.concatenate([tensors["u"], tensors["b"]]).astype("<f4").tobytes()
        version = harness.status(leader.addr)["version"]

        # a worker is refused by the follower, a reader welcome
        with harness.RawClient(follower.addr, 10) as w:
            r = w.hello_worker(LAYOUT, 0, 2)
            assert r["t"] == harness.T_ERROR and r["code"] == E_NOT_LEADER and r.get("leader") == leader.addr, r
        c, r = reader(follower.addr)
        assert r["t"] == harness.T_WELCOME and not r.get("init"), r
        p = c.request({"t": harness.T_PULL, "off": 0, "len": 5})
        assert p["t"] == harness.T_PARAMS and p["ver"] == version and p.get("lag") == 0, \
            {k: v for k, v in p.items() if k != "data"}
        assert bytes(p["data"]) == want_dense, "the follower's dense values differ from the leader's"
        t = c.request(dict(TABLE, t=harness.T_TABLE))
        assert t["t"] == harness.T_OK, t  # the table it has: declared as the workers did
        rows = c.request({"t": harness.T_TPULL, "tab": "emb", "keys": keys.astype("<u8").tobytes()})
        assert rows["t"] == harness.T_ROWS and rows.get("lag") == 0, {k: v for k, v in rows.items() if k != "data"}
        assert bytes(rows["data"]) == want_rows, "the follower's rows differ from the leader's"
        # its writes are refused, naming the leader, and change nothing
        g = np.ones(5, "<f4").tobytes()
        for msg in ({"t": harness.T_PUSH, "off": 0, "base": version, "data": g, "fin": True},
                    {"t": harness.T_PUSHPULL, "off": 0, "base": version, "data": g, "fin": True, "poff": 0,
                     "plen": 5},
                    {"t": harness.T_INIT, "off": 0, "data": g, "fin": True},
                    {"t": harness.T_TPUSH, "tab": "emb", "base": version, "keys": keys[:2].astype("<u8").tobytes(),
                     "data": np.ones(8, "<f4").tobytes()},
                    dict(TABLE, t=harness.T_TABLE, tab="other")):
            e = c.request(msg)
            assert e["t"] == harness.T_ERROR and e["code"] == E_NOT_LEADER and e.get("leader") == leader.addr, e
            assert "reader" in e["text"] and leader.addr in e["text"], e["text"]
        assert harness.status(follower.addr)["version"] == version
        p = c.request({"t": harness.T_PULL, "off": 0, "len": 5})
        assert bytes(p["data"]) == want_dense
        c.close()
        # on the leader: answers without "lag"; a reader's push FORBIDDEN; it takes no shard
        c, r = reader(leader.addr)
        assert r["t"] == harness.T_WELCOME, r
        p = c.request({"t": harness.T_PULL, "off": 0, "len": 5})
        assert p["t"] == harness.T_PARAMS and "lag" not in p and bytes(p["data"]) == want_dense, p.keys()
        e = c.request({"t": harness.T_PUSH, "off": 0, "base": version, "data": g, "fin": True})
        assert e["t"] == harness.T_ERROR and e["code"] == E_FORBIDDEN and "reader" in e["text"], e
        with harness.RawClient(leader.addr, 10) as w:
            r = w.hello_worker(LAYOUT, 0, 2)
            assert r["t"] == harness.T_WELCOME, r  # shard 0 is free: the reader did not take it
        c.close()
        assert harness.status(leader.addr)["version"] == version

        # libpsclient's option
        cr = psd.Client([("u", (4,)), ("b", (1,))], server=follower.addr, shard="0/1", reader=True, connect_s=10,
                        reconnect=False, timeout_ms=10000)
        cr.connect()
        assert cr.lag == 0  # connect pulled the model from the follower, in sync
        cr.table("emb", 4, init="normal", scale=0.05, seed=9, opt="adagrad", lr=0.1)
        cr.pull()
        assert cr.params.astype("<f4").tobytes() == want_dense and cr.lag == 0
        m = harness.psctl(follower.addr, "metrics").stdout
        assert "\npsd_readers 1\n" in m, [l for l in m.splitlines() if "readers" in l]
        got = cr.pull_rows("emb", keys)
        assert got.astype("<f4").tobytes() == want_rows and cr.lag == 0
        with pytest.raises(psd.PsdError) as err:
            cr.push_rows("emb", keys[:2], np.ones((2, 4), np.float32))
        assert "reader" in str(err.value) or "follows a leader" in str(err.value), str(err.value)
        cr.close()
        cl_leader = psd.Client([("u", (4,)), ("b", (1,))], server=leader.addr, shard="0/1", reader=True,
                               connect_s=10)
        cl_leader.connect()
        cl_leader.pull()
        assert cl_leader.lag == -1 and cl_leader.params.astype("<f4").tobytes() == want_dense
        cl_leader.close()
        assert "reader joined from" in follower.stderr()

        # a reader's pull for a version the follower has not applied yet is
        # answered once it has (a worker pushes to the leader meanwhile)
        c, r = reader(follower.addr)
        assert r["t"] == harness.T_WELCOME, r
        c.send_frame({"t": harness.T_PULL, "id": 77, "off": 0, "len": 5, "min": version + 1})
        with harness.RawClient(leader.addr, 10) as w:
            r = w.hello_worker(LAYOUT, 0, 2)
            assert r["t"] == harness.T_WELCOME, r
            r = w.request({"t": harness.T_PUSH, "off": 0, "base": version, "data": g, "fin": True})
            assert r["t"] == harness.T_OK, r
        p = c.recv_frame(30)
        assert p["t"] == harness.T_PARAMS and p["id"] == 77 and p["ver"] == version + 1 and "lag" in p, \
            {k: v for k, v in p.items() if k != "data"}
        assert bytes(p["data"]) != want_dense
        c.close()
