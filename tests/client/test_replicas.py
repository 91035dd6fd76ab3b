"""test_replicas.py - pushes applied once and a part's replicas (PROTOCOL.md
section 15) against real psd processes.

Run by ctest (client_replicas) with Debian's pytest:

    PSD_CLIENT_LIBRARY=build/client/libpsclient.so.1 PYTHONPATH=python \\
        /usr/bin/python3 -m pytest -q tests/client/test_replicas.py

psd runs plain SGD at lr 0.5 without momentum, so expected values are
exact. A reply is lost with psd's test fault PSD_TEST_CUT_PUSH=N: every
N-th push with an id is applied and its connection then shut down instead
of answered.

- psd's side, frame by frame: a push sent again with its id on a new
  connection of the same cid is answered (OK, or a PUSHPULL's PARAMS) and
  not applied; a lower id neither; a higher one is. Without cid (an old
  client) every push is applied, ids or not.
- libpsclient: pushpulls, pushes in chunks and pushes through the shared
  segment, with every few replies lost: each reconnect sends the step's
  pushes again and psd's model is exactly the sum of the steps, applied once.
- NOT_LEADER: a stand-in follower refuses the hello naming the leader;
  the client, given the follower alone, goes to the leader. A stand-in
  whose WELCOME lists the replicas and then closes: the client goes on
  with the replica it learnt.
- failover without replication: psd B started from psd A's checkpoint, a
  psworker given A/B; A killed; the worker goes on with B by itself and
  finishes.
"""

import os
import re
import shutil
import signal
import socket
import struct
import sys
import threading

import msgpack
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

import psd  # noqa: E402

SGD = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "warmup_versions=0",
       "--log-level", "info")
LAYOUT = [("w", (300, 4)), ("b", (4,))]
N = 300 * 4 + 4
APPLIED_ALREADY = re.compile(r"push \d+ applied already: answered, not applied again")
CUT = "PSD_TEST_CUT_PUSH: push applied, connection cut"


@pytest.fixture
def cluster():
    with harness.Cluster("psd-replicas") as cl:
        yield cl


def start(cl, cut=0, name="psd", workers=1, args=(), mode="asgd"):
    env = dict(os.environ)
    env.pop("PSD_TEST_CUT_PUSH", None)
    if cut:
        env["PSD_TEST_CUT_PUSH"] = str(cut)
    return cl.psd(mode=mode, workers=workers, name=name, args=SGD + tuple(args), env=env)


# ---- psd's side, frame by frame -------------------------------------------

RAW_LAYOUT = [["w", [8]]]
ONES = harness.floats([1.0] * 8)


def raw_hello(addr, **extra):
    """A worker 0/1 on a new connection; retried while psd has not yet
    noticed the connection before it gone (SHARD)."""
    def attempt():
        c = harness.RawClient(addr, 10)
        r = c.hello_worker(RAW_LAYOUT, 0, 1, **extra)
        if r.get("t") == harness.T_WELCOME:
            return c, r
        c.close()
        assert r.get("t") == harness.T_ERROR and r.get("code") == 12, r  # SHARD: the old one not gone yet
        return None
    return harness.wait_until(attempt, 10, "psd to take worker 0/1 again")


def push(c, pid=None, pull=False):
    m = {"t": harness.T_PUSHPULL if pull else harness.T_PUSH, "base": 0, "off": 0, "data": ONES}
    if pull:
        m.update(poff=0, plen=8)
    if pid is not None:
        m["pid"] = pid
    return c.request(m)


def model(addr):
    with harness.RawClient(addr, 10) as a:
        a.hello_admin()
        r = a.request({"t": harness.T_PULL, "off": 0, "len": 8})
        assert r.get("t") == harness.T_PARAMS, r
        return r["ver"], np.frombuffer(r["data"], dtype="<f4")


def test_psd_answers_a_resent_push_without_applying_it(cluster):
    p = start(cluster, cut=2)
    cid = 0x5EED5EED12345678
    c, r = raw_hello(p.addr, cid=cid)
    assert r.get("init") is True
    assert c.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0.0] * 8)})["t"] == harness.T_OK
    assert push(c, pid=1)["t"] == harness.T_OK               # applied: version 1
    c.send_frame({"t": harness.T_PUSH, "id": 99, "base": 0, "off": 0, "data": ONES, "pid": 2})
    assert c.expect_closed() == []                           # applied, and its reply lost
    c.close()
    assert model(p.addr)[0] == 2
    c, r = raw_hello(p.addr, cid=cid)                        # the same client again
    assert r.get("init") is not True
    ok = push(c, pid=2)                                      # sent again: answered, not applied
    assert ok["t"] == harness.T_OK and ok["ver"] == 2, ok
    assert push(c, pid=1)["t"] == harness.T_OK               # older still: nothing
    params = push(c, pid=2, pull=True)                       # a pushpull: its pull answered
    assert params["t"] == harness.T_PARAMS and params["ver"] == 2, params
    assert np.array_equal(np.frombuffer(params["data"], dtype="<f4"), np.full(8, -1.0, np.float32))
    assert push(c, pid=3)["t"] == harness.T_OK               # a new one is applied
    ver, w = model(p.addr)
    assert ver == 3 and np.array_equal(w, np.full(8, -1.5, np.float32)), (ver, w)
    assert len(APPLIED_ALREADY.findall(p.stderr())) == 3
    assert c.request({"t": harness.T_BYE})["t"] == harness.T_OK
    c.close()
    # an old client (no cid): every push applied, with a pid or without,
    # and psd's test fault leaves it alone
    c, _ = raw_hello(p.addr)
    for pid in (None, None, 7, 7, 1):
        assert push(c, pid=pid)["t"] == harness.T_OK
    c.close()
    ver, w = model(p.addr)
    assert ver == 8 and np.array_equal(w, np.full(8, -4.0, np.float32)), (ver, w)
    # cid and pid 0 are refused
    c, _ = raw_hello(p.addr)
    harness.expect_error(_Asserts(), push(c, pid=0), 5, "pid 0")
    c.close()
    with harness.RawClient(p.addr, 10) as c:
        harness.expect_error(_Asserts(), c.hello_worker(RAW_LAYOUT, 0, 1, cid=0), 5, "cid 0")
    p.stop()


def test_psd_answers_a_resent_table_push_without_applying_it(cluster):
    # asgd, rows stepped by sgd at lr 0.5 from zeros: a TPUSH and a
    # TPUSHPULL sent again with their ids change the row once. The reply
    # is lost by closing our end before reading it.
    p = start(cluster)
    c, _ = raw_hello(p.addr, cid=77)
    assert c.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0.0] * 8)})["t"] == harness.T_OK
    table = {"t": harness.T_TABLE, "tab": "t", "dim": 2, "rinit": "zeros", "opt": "sgd", "hp": {"lr": 0.5}}
    assert c.request(table)["t"] == harness.T_OK
    key = np.array([5], "<u8").tobytes()
    tpush = {"t": harness.T_TPUSH, "tab": "t", "keys": key, "base": 0, "data": harness.floats([1.0, 2.0])}
    assert c.request(dict(tpush, pid=1))["t"] == harness.T_OK
    c.send_frame(dict(tpush, pid=2, id=50))
    c.close()                                               # its reply lost

    def row():
        with harness.RawClient(p.addr, 10) as a:
            a.hello_admin()
            r = a.request({"t": harness.T_TPULL, "tab": "t", "keys": key})
            return np.frombuffer(r["data"], "<f4").tolist() if r.get("t") == harness.T_ROWS else r
    harness.wait_until(lambda: row() == [-1.0, -2.0], 10, "psd to apply the push whose reply was lost")
    c, _ = raw_hello(p.addr, cid=77)
    assert c.request(table)["t"] == harness.T_OK             # declared again, as libpsclient does
    assert c.request(dict(tpush, pid=2))["t"] == harness.T_OK   # sent again: not applied
    r = c.request({"t": harness.T_TPUSHPULL, "tab": "t", "keys": key, "base": 0, "data": harness.floats([1.0, 2.0]),
                   "pkeys": key, "pid": 1})                 # an older id, its pull answered
    assert r["t"] == harness.T_ROWS, r
    assert np.array_equal(np.frombuffer(r["data"], "<f4"), np.array([-1.0, -2.0], np.float32)), r
    assert c.request(dict(tpush, pid=3))["t"] == harness.T_OK   # a new one is applied
    c.close()
    assert row() == [-1.5, -3.0]
    p.stop()


class _Asserts:
    """unittest's assertions for harness.expect_error under pytest."""

    def assertIsInstance(self, a, b, msg=None):
        assert isinstance(a, b), msg

    def assertEqual(self, a, b, msg=None):
        assert a == b, msg

    def assertTrue(self, a, msg=None):
        assert a, msg

    def assertIsNotNone(self, a, msg=None):
        assert a is not None, msg


# ---- libpsclient: the step's pushes sent again ------------------------------

def client(addr, layout=LAYOUT, **kw):
    kw.setdefault("connect_s", 10)
    kw.setdefault("timeout_ms", 20000)
    return psd.Client(layout, server=addr, shard="0/1", **kw)


@pytest.mark.parametrize("how", ["pushpull_shm", "pushpull_tcp", "push_chunks", "bsp_pushpull", "bsp_chunks"])
def test_client_sends_again_and_psd_applies_once(cluster, how):
    chunks = how.endswith("chunks")
    p = start(cluster, cut=5 if chunks else 3, mode="bsp" if how.startswith("bsp") else "asgd")
    kw = {"shm": how == "pushpull_shm"}
    layout, n = LAYOUT, N
    if chunks:
        kw["chunk"] = 1024                                  # 12 push messages a step: cuts within steps
        layout, n = [("w", (3000, 4)), ("b", (4,))], 3000 * 4 + 4
    a = client(p.addr, layout, **kw)
    init = (np.arange(n) % 5).astype(np.float32)
    a.params[:] = init
    a.connect()
    assert a.shm == (how == "pushpull_shm")
    steps = 12
    for s in range(steps):
        a.grads[:] = 1.0 + (s % 3)                          # 1, 2, 3, 1, ...: a step twice would show
        if how == "push_chunks":
            a.push()                                        # asgd: each chunk applied on its own
        else:
            a.pushpull()
    a.pull()
    total = sum(1.0 + (s % 3) for s in range(steps))
    assert np.array_equal(a.params, init - np.float32(0.5 * total)), (a.params[:4], init[:4] - 0.5 * total)
    err = p.stderr()
    # the connections cut (one cut may be followed by another on the same
    # connection: the chunks psd had read already are still handled)
    cut = set(re.findall(r"conn (\d+) \(\S+\): " + CUT, err))
    assert len(cut) >= 3, err[-2000:]
    assert a.reconnects == len(cut)                         # one reconnect per connection cut
    assert a.lost_steps == 0
    # each cut reply's push came again and was answered, not applied; in
    # bsp a cut before a step's last chunk drops its chunks, which are then
    # applied again (PROTOCOL.md 15): only the cuts at a last chunk (the
    # 60th and 120th push ids counted, cut every 5th) are answered so
    need = 2 if how == "bsp_chunks" else len(cut)
    assert len(APPLIED_ALREADY.findall(err)) >= need, err[-2000:]
    if how != "push_chunks":
        assert a.version == steps                            # one version per step (bsp: per round)
    a.close()
    p.stop()


# ---- NOT_LEADER: a follower's refusal names the leader ------------------------

class Follower:
    """A stand-in for a follower psd on 127.0.0.1: answers every frame it
    reads with ERROR NOT_LEADER (25) naming leader, and counts them; or,
    given welcome, answers a hello with that WELCOME and closes."""

    def __init__(self, leader, welcome=None):
        self.leader = leader
        self.welcome = welcome
        self.refused = 0
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            with s:
                s.settimeout(10)
                try:
                    head = s.recv(4, socket.MSG_WAITALL)
                    (n,) = struct.unpack(">I", head)
                    msg = msgpack.unpackb(s.recv(n, socket.MSG_WAITALL), raw=False)
                    if self.welcome:
                        s.sendall(harness.frame(harness.pack(dict(self.welcome, id=msg.get("id", 0)))))
                        self.refused += 1
                        continue
                    s.sendall(harness.frame(harness.pack({"t": harness.T_ERROR, "id": msg.get("id", 0), "code": 25,
                                                          "text": "this psd follows a leader",
                                                          "leader": self.leader})))
                    self.refused += 1
                except (OSError, struct.error, ValueError):
                    pass

    def close(self):
        self.lsock.close()


def test_not_leader_sends_the_client_to_the_leader(cluster, capfd):
    p = start(cluster)
    f = Follower(p.addr)
    try:
        a = client(f.addr)                                  # only the follower given
        a.connect()
        assert f.refused == 1
        a.grads[:] = 1.0
        a.pushpull()
        assert a.version == 1
        a.close()
    finally:
        f.close()
    assert "%s follows a leader; trying %s" % (f.addr, p.addr) in capfd.readouterr().err
    p.stop()


def test_welcome_replicas_are_learnt(cluster, capfd):
    # a psd whose WELCOME lists the part's replicas, then goes away: the
    # client, given it alone, goes on with the other replica it named
    p = start(cluster)
    f = Follower(None)
    f.welcome = {"t": harness.T_WELCOME, "v": 1, "mode": "asgd", "ver": 0, "params": N, "workers": 1,
                 "init": False, "hb": 3000, "replicas": [f.addr, p.addr]}
    try:
        a = client(f.addr)
        a.connect()
        assert f.refused == 1
        a.grads[:] = 1.0
        a.pushpull()
        assert a.version == 1
        a.close()
    finally:
        f.close()
    assert "%s is gone; trying %s" % (f.addr, p.addr) in capfd.readouterr().err
    p.stop()


# ---- failover to another psd --------------------------------------------------

def need_fashion_mnist():
    """Fashion-MNIST in the data directory or where its Debian package puts
    it (psworker looks there too), or a skip."""
    for d in (os.path.join(harness.Paths.data, "fashion-mnist"), "/usr/share/datasets/fashion-mnist"):
        if any(os.path.exists(os.path.join(d, "train-images-idx3-ubyte" + gz)) for gz in ("", ".gz")):
            return
    pytest.skip("no Fashion-MNIST (Debian package dataset-fashion-mnist)")


@pytest.mark.parametrize("pipeline", ["off", "on"])
def test_worker_given_two_psd_goes_on_with_the_second(cluster, pipeline):
    need_fashion_mnist()
    da = os.path.join(cluster.dir, "state-a")
    db = os.path.join(cluster.dir, "state-b")
    os.mkdir(da)
    a = cluster.psd(mode="asgd", workers=1, name="psd-a", args=("--state-dir", da, "--log-level", "info"))
    # a first run gives A the model; its checkpoint is B's start
    w0 = cluster.worker(a, 0, 1, epochs=1, limit=640, model="mlp:16", evaluate=False, name="worker-init",
                        dataset="fashion-mnist")
    harness.finish(_Asserts(), [w0], timeout=60)
    r = harness.psctl(a.addr, "checkpoint")
    assert r.returncode == 0, r.stderr
    v0 = harness.version(a.addr)
    shutil.copytree(da, db)
    port_b = harness.free_port()
    addr_b = "127.0.0.1:%d" % port_b
    b = cluster.psd(mode="asgd", workers=1, name="psd-b",
                    args=("--listen", addr_b, "--state-dir", db, "--log-level", "info"))
    assert harness.version(b.addr) == v0                     # B holds A's checkpoint
    w = cluster.worker("%s/%s" % (a.addr, addr_b), 0, 1, epochs=60, limit=640, model="mlp:16", evaluate=False,
                       dataset="fashion-mnist", args=["--reconnect-timeout", "60", "--pipeline", pipeline],
                       name="worker")
    harness.wait_until(lambda: harness.version(a.addr) >= v0 + 30, 30, "the worker to train on A")
    os.kill(a.pid, signal.SIGKILL)
    a.wait(10)
    harness.wait_until(lambda: harness.version(b.addr) >= v0 + 30, 60, "the worker to go on with B")
    rc, summary = w.result(120)
    assert rc == 0, harness.tail(w.err_path)
    err = w.stderr()
    assert "trying %s" % addr_b in err, err[-3000:]
    assert re.search(r"reconnected to psd at %s" % re.escape(addr_b), err), err[-3000:]
    assert summary["reconnects"] >= 1
    assert harness.version(b.addr) == summary["version"]     # it finished on B
    b.stop()


def test_replicas_syntax_is_checked():
    for server in ("127.0.0.1:1/", "/127.0.0.1:1", "127.0.0.1:1//127.0.0.1:2", "/,127.0.0.1:1"):
        with pytest.raises(psd.PsdError, match="is empty, or one of its replicas"):
            psd.Client(LAYOUT, server=server, shard="0/1")
    with pytest.raises(psd.PsdError, match="more than 16 replicas"):
        psd.Client(LAYOUT, server="/".join(["127.0.0.1:%d" % (1 + i) for i in range(17)]), shard="0/1")
    # a split model with replicas for each part: its parts counted by ","
    c = psd.Client([("w", (3000, 4))], server="127.0.0.1:1/127.0.0.1:2,127.0.0.1:3/127.0.0.1:4/127.0.0.1:5",
                   shard="0/1")
    assert c.servers == 2
    c.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
