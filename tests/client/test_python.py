"""test_python.py - the Python package psd (python/psd) against a real psd.

Run by ctest (client_python) with Debian's pytest:

    PSD_CLIENT_LIBRARY=build/client/libpsclient.so.1 PYTHONPATH=python \\
        /usr/bin/python3 -m pytest -q tests/client/test_python.py

psd runs plain SGD at lr 0.5 without momentum, so expected values are exact.
"""

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

import psd  # noqa: E402

SGD = ("--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0", "--set", "warmup_versions=0",
       "--log-level", "warn")
LAYOUT = [("w", (300, 4)), ("b", (4,))]
N = 300 * 4 + 4


@pytest.fixture
def cluster():
    with harness.Cluster("psd-python") as cl:
        yield cl


def start(cl, mode="asgd", workers=2, name="psd", args=()):
    return cl.psd(mode=mode, workers=workers, name=name, args=SGD + tuple(args))


def client(addr, shard="0/2", layout=LAYOUT, **kw):
    kw.setdefault("connect_s", 5)
    kw.setdefault("timeout_ms", 20000)
    return psd.Client(layout, server=addr, shard=shard, **kw)


def test_init_pushpull_and_views(cluster):
    p = start(cluster)
    a = client(p.addr, "0/2")
    init = (np.arange(N) % 7).astype(np.float32)
    a.params[:] = init
    params = a.params
    a.connect()
    assert a.mode == "asgd" and a.shm and a.servers == 1 and a.shard == (0, 2)
    b = client(p.addr, "1/2", connect=True)
    assert np.array_equal(b.params, init)            # the first worker's values won
    a.grads[:] = 1.0
    a.pushpull()
    assert a.params is params                        # the same array, filled in place
    assert np.array_equal(a.params, init - 0.5)
    assert a.version == 1
    w = a.tensor("w")
    assert w.shape == (300, 4) and np.shares_memory(w, a.params)
    # the library's vector is the array's memory: no copy anywhere
    assert a.params.ctypes.data == psd._lib.lib.psc_params(a._c)
    b.pull_tensor("b")
    assert np.array_equal(b.tensor("b"), init[-4:] - 0.5)
    assert np.array_equal(b.tensor("w"), init[:-4].reshape(300, 4))  # not pulled yet
    b.pull()
    assert np.array_equal(b.params, a.params)
    b.grad("w")[:] = 2.0
    b.grad("b")[:] = 0.0
    b.push_range(0, 8)
    a.pull_range(0, 10)
    assert np.array_equal(a.params[:8], init[:8] - 1.5) and a.params[8] == init[8] - 0.5
    a.report(1, 0.25, accuracy=0.9, samples=100, rate=50.0)
    assert b.live_shards() == (1, 2)
    a.close()
    b.close()


def test_bind_own_arrays_tcp_bf16(cluster):
    p = start(cluster)
    a = client(p.addr, "0/2", shm=False)
    mine = np.full((N,), 2.0, dtype=np.float32)
    g = np.zeros((N,), dtype=np.float32)
    a.bind(mine, g)
    a.connect()
    assert not a.shm
    b = client(p.addr, "1/2", wire="bf16", connect=True)
    assert b.wire == "bf16" and np.array_equal(b.params, mine)
    g[:] = 1.0
    a.pushpull()
    assert np.all(mine == 1.5)                       # pulled straight into our array
    assert a.params is mine


def test_compress_rests_when_it_does_not_pay(cluster, capfd):
    # compress on: pushes of random bits (which zstd cannot shrink by a
    # sixteenth) go uncompressed, and libpsclient tries the compressor only
    # on the first of every 33 (it rests 32); values that do shrink then go
    # compressed again
    p = start(cluster, workers=1)
    a = client(p.addr, "0/1", shm=False, compress=True, log="debug")
    a.connect()
    rng = np.random.default_rng(5)
    for _ in range(40):
        # random signs, mantissas and exponents over a wide range, all finite
        bits = rng.integers(0, 1 << 32, N, dtype=np.uint64).astype(np.uint32) & np.uint32(0x807FFFFF)
        bits |= rng.integers(64, 190, N, dtype=np.uint32) << np.uint32(23)
        a.grads[:] = bits.view(np.float32)
        a.push()
    tried = capfd.readouterr().err.count("the next 32 pushes go uncompressed")
    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
    # the initial values (zeros) went compressed; no push did
    assert harness.metric(samples, "psd_wire_zstd_float_bytes_total") == 4 * N
    assert tried == 2                                # pushes 1 and 34
    for _ in range(40):
        a.grads[:] = 0.25
        a.push()
    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
    assert harness.metric(samples, "psd_wire_zstd_float_bytes_total") >= 4 * N * (1 + 40 - 32)
    a.close()


def test_bad_calls_raise(cluster):
    with pytest.raises(TypeError, match="colour"):
        psd.Client(LAYOUT, colour="blue")
    with pytest.raises(psd.PsdError, match="wire"):
        psd.Client(LAYOUT, wire="f64")
    with pytest.raises(psd.PsdError) as e:
        psd.Client(LAYOUT, shard="5/2")
    assert e.value.name == "EINVAL" and "5/2" in str(e.value)
    with pytest.raises(psd.PsdError):
        psd.Client([("w", (0, 3))])
    with pytest.raises(TypeError):
        psd.Client(["w"])
    c = psd.Client(LAYOUT, connect_s=0)
    with pytest.raises(TypeError, match="float32"):
        c.bind(np.zeros(N, dtype=np.float64))
    with pytest.raises(TypeError, match="float32"):
        c.bind(np.zeros(N, dtype=np.int32))
    with pytest.raises(TypeError, match="numpy"):
        c.bind([0.0] * N)
    with pytest.raises(ValueError, match="C-contiguous"):
        c.bind(np.zeros(2 * N, dtype=np.float32)[::2])
    with pytest.raises(ValueError, match="values"):
        c.bind(np.zeros((N + 1,), dtype=np.float32))
    ro = np.zeros(N, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        c.bind(ro)
    same = np.zeros(N, dtype=np.float32)
    with pytest.raises(ValueError):
        c.bind(same, same)
    with pytest.raises(KeyError):
        c.tensor("nope")
    with pytest.raises(psd.PsdError) as e:
        c.pushpull()                                 # not connected
    assert e.value.name == "ESTATE"
    with pytest.raises(psd.PsdError) as e:
        c.connect()                                  # nothing listens there
    assert e.value.name == "ECONNECT"
    p = start(cluster)
    a = client(p.addr, "0/2", connect=True)
    other = client(p.addr, "1/2", layout=[("w", (4, 300)), ("b", (4,))])
    with pytest.raises(psd.PsdError) as e:
        other.connect()
    assert e.value.name == "ELAYOUT"
    with pytest.raises(ValueError):
        a.push_range(-1, 3)
    with pytest.raises(psd.PsdError) as e:
        a.pull_range(N - 2, 5)
    assert e.value.name == "ERANGE"
    with pytest.raises(KeyError):
        a.push_tensor("nope")
    a.grads[:] = np.nan
    with pytest.raises(psd.PsdError) as e:
        a.pushpull()
    assert e.value.name == "ENONFINITE"
    a.grads[:] = 0.0
    a.pushpull()                                     # still works
    a.close()
    with pytest.raises(psd.PsdError, match="closed"):
        a.pull()
    assert a.params.shape == (N,)                    # still readable


def test_gil_released_while_waiting(cluster):
    """A BSP step waits for the other worker: meanwhile Python runs."""
    p = start(cluster, mode="bsp")
    a = client(p.addr, "0/2", connect=True)
    b = client(p.addr, "1/2", connect=True)
    a.grads[:] = 1.0
    b.grads[:] = 3.0
    done = []
    t = threading.Thread(target=lambda: (a.pushpull(), done.append(1)))
    t.start()
    spins, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.3:
        spins += 1
    assert not done and spins > 10000                # a blocked a without holding the GIL
    b.pushpull_start()
    assert not b.poll() or b.version == 1
    b.wait()
    t.join(10)
    assert done and a.version == b.version == 1
    assert np.all(a.params == -1.0) and np.all(b.params == -1.0)


def send_buffers(port):
    """{(local port, peer port): the kernel's send buffer in bytes} of the
    established TCP connections to or from `port` (ss's skmem `tb`)."""
    r = subprocess.run(["ss", "-tmnH", "state", "established", "( sport = :%d or dport = :%d )" % (port, port)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    out, key = {}, None
    for line in r.stdout.splitlines():
        m = re.search(r"(\S+):(\d+)\s+(\S+):(\d+)", line)
        if m:
            key = (int(m.group(2)), int(m.group(4)))
        t = re.search(r"skmem:\(.*\btb(\d+)", line)
        if t and key:
            out[key] = int(t.group(1))
    return out


def test_send_buffer_caps_both_ends(cluster):
    # psd's send_buffer and the library's option set SO_SNDBUF, which the
    # kernel doubles for its bookkeeping; without them it autotunes from
    # tcp_wmem's default (16 KiB, growing)
    p = start(cluster, args=("--set", "send_buffer=96K"))
    port = int(p.addr.rsplit(":", 1)[1])
    a = client(p.addr, "0/2", shm=False, send_buffer=65536, connect=True)
    a.grads[:] = 1.0
    a.pushpull()
    bufs = send_buffers(port)
    assert sorted(bufs.values()) == [2 * 65536, 2 * 96 * 1024], bufs
    with pytest.raises(psd.PsdError, match="send_buffer"):
        client(p.addr, "1/2", send_buffer=100)
    a.close()


def test_split_model(cluster):
    p1, p2 = start(cluster, name="psd1"), start(cluster, name="psd2")
    servers = "%s,%s" % (p1.addr, p2.addr)
    layout = [("v", (5000,))]
    a = psd.Client(layout, server=servers, shard="0/2", init=np.arange(5000, dtype=np.float32), connect=True)
    assert a.servers == 2
    a.grads[:] = 2.0
    a.pushpull()
    b = psd.Client(layout, server=servers, shard="1/2", connect=True)
    assert np.array_equal(b.params, np.arange(5000, dtype=np.float32) - 1.0)


def test_reconnect_after_kill(cluster):
    p = start(cluster, workers=1)
    port = p.port
    a = client(p.addr, "0/1", reconnect_s=20, connect=True)
    a.params[:]  # noqa: B018
    a.grads[:] = 1.0
    a.pushpull()
    before = a.params.copy()
    p.kill()
    start(cluster, workers=1, name="psd-again", args=("--listen", "127.0.0.1:%d" % port))
    a.pushpull()                                     # the connection back, the step's push sent again
    assert a.reconnects == 1 and a.lost_steps == 0
    assert np.array_equal(a.params, before - 0.5)    # the new psd took our values, then the push
    a.pushpull()
    assert np.array_equal(a.params, before - 1.0)


def test_progress_reports_every_report_s(cluster):
    """progress() sends psd the mean loss of the samples since its last
    report once report_s has passed, and nothing before."""
    p = start(cluster, workers=1)
    a = client(p.addr, "0/1", report_s="0.3", connect=True)

    def row():
        return [w for w in harness.status(p.addr)["workers"] if w["shard"] == 0][0]

    a.progress(0, 2.0 * 10, 10)            # starts the interval: nothing is due
    a.pushpull()
    a.progress(0, 4.0 * 10, 10)
    assert row()["loss"] is None, "no report before report_s has passed"
    time.sleep(0.35)
    a.progress(0, 6.0 * 10, 10)            # due: the mean of the 30 samples
    assert row()["loss"] == pytest.approx(4.0)
    a.progress(0, 9.0 * 5, 5)              # a new interval
    time.sleep(0.35)
    a.progress(0, 1.0 * 5, 5)
    assert row()["loss"] == pytest.approx(5.0)
    with pytest.raises(psd.PsdError, match="not a finite number"):
        a.progress(0, float("nan"), 1)
    with pytest.raises(psd.PsdError, match="report_s"):
        client(p.addr, "0/1", report_s="-1")
    a.close()


def test_close_reason_reaches_psd(cluster):
    """close(reason=...) sends the reason in BYE's text: psd shows it as the
    worker's why (psctl status), printable ASCII, cut at 95 bytes; without
    one psd says "said bye"; a worker leaving a `with` block on an
    exception names it."""
    p = start(cluster, workers=4)
    a = client(p.addr, "0/4", connect=True)
    b = client(p.addr, "1/4", connect=True)
    c = client(p.addr, "2/4", connect=True)
    with pytest.raises(TypeError, match="str"):
        a.close(reason=b"bytes")
    with pytest.raises(ValueError, match="NUL"):
        a.close(reason="a\0b")
    a.pushpull()                                   # still open after the refusals
    a.close(reason="finished: 3 epochs, accuracy 0.97")
    a.close(reason="twice")                        # nothing more goes out
    b.close(reason="caf\u00e9 " + "x" * 300)       # not ASCII, and too long
    c.close()
    with pytest.raises(RuntimeError):
        with client(p.addr, "3/4", connect=True):
            raise RuntimeError("the model failed")
    rows = {w["shard"]: w for w in harness.status(p.addr)["workers"]}
    assert rows[0]["state"] == "left" and rows[0]["why"] == "finished: 3 epochs, accuracy 0.97", rows[0]
    assert rows[1]["why"].startswith("caf?? xxx") and len(rows[1]["why"]) == 95, rows[1]
    assert rows[2]["why"] == "said bye", rows[2]
    assert rows[3]["why"] == "RuntimeError in the worker", rows[3]
    with pytest.raises(psd.PsdError, match="closed") as e:
        a.pushpull()
    assert e.value.name == "ESTATE"


# ---- a BSP job by psd's plan --------------------------------------------------

PLAN_LAYOUT = [("w", (5,)), ("b", (1,))]
PLAN_N = 6


def regression(samples, seed=3):
    """A small synthetic linear regression: x (samples, 5), y = x w* + b*."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (samples, 5)).astype(np.float32)
    y = (x @ np.array([1, -2, 0.5, 3, -1], dtype=np.float32) + 0.25).astype(np.float32)
    return x, y


def slice_gradient(params, x, y, idx):
    """The mean gradient of 0.5 (x w + b - y)^2 over the samples idx; zero
    when idx is empty (a round too small to share)."""
    g = np.zeros(PLAN_N, dtype=np.float32)
    if len(idx):
        r = x[idx] @ params[:5] + params[5] - y[idx]
        g[:5] = x[idx].T @ r / len(idx)
        g[5] = r.mean()
    return g


def planned_worker(c, x, y, log):
    """Trains c by the job's plan to its end, logging (version, slice,
    indices) of every round; the worker's thread."""
    for idx in c.plan_batches(len(x)):
        log.append((c.version, c.plan_slice(), idx.copy()))
        c.grads[:] = slice_gradient(c.params, x, y, idx)
        c.pushpull()


def run_threads(*targets, timeout=60):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: B902 (reported below)
            errors.append(e)
    ts = [threading.Thread(target=wrap, args=(fn,), daemon=True) for fn in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread did not finish in %d s" % timeout
    if errors:
        raise errors[0]


def test_epoch_order_is_psworkers_permutation():
    # psworker's orders (its C shuffle, ps_dataset_epoch_order with shard 0)
    # for (samples, seed, epoch) = (10, 1, 0), (1000, 7, 3) and (60000, 42, 2), pinned
    assert list(psd.epoch_order(10, 1, 0)) == [9, 2, 3, 1, 8, 0, 4, 5, 7, 6]
    o = psd.epoch_order(1000, 7, 3)
    assert list(o[:8]) == [968, 914, 220, 114, 229, 757, 626, 832]
    assert list(psd.epoch_order(60000, 42, 2)[-5:]) == [8160, 49807, 7981, 12849, 42387]
    assert o.dtype == np.int64 and sorted(o) == list(range(1000))
    assert not np.array_equal(o, psd.epoch_order(1000, 7, 4))    # another epoch, another order
    assert not np.array_equal(o, psd.epoch_order(1000, 8, 3))    # another seed
    assert list(psd.epoch_order(0, 1, 0)) == [] and list(psd.epoch_order(1, 1, 0)) == [0]
    with pytest.raises(ValueError, match="samples"):
        psd.epoch_order(-1, 1, 0)


def test_plan_bad_calls_raise():
    c = psd.Client(PLAN_LAYOUT, connect_s=0)
    assert c.plan() is None and c.plan_slice() is None and not c.plan_done()   # not connected
    with pytest.raises(psd.PsdError) as e:
        c.plan_set(0, 10, 5)
    assert e.value.name == "EINVAL" and "epochs" in str(e.value)
    with pytest.raises(psd.PsdError, match="batch"):
        c.plan_set(1, 10, 11)                     # a global batch larger than the training set
    with pytest.raises(TypeError, match="samples must be an int"):
        c.plan_set(1, 10.0, 5)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        c.plan_set(1, 10, 5, -1)
    with pytest.raises(psd.PsdError, match="no plan"):
        next(c.plan_batches())


def test_plan_two_workers_end_at_the_last_round(cluster):
    samples, batch, epochs, seed = 49, 8, 2, 11   # 7 rounds an epoch, the last of 1 sample
    rounds = epochs * -(-samples // batch)
    p = start(cluster, mode="bsp", workers=2)
    x, y = regression(samples)
    a = client(p.addr, "0/2", layout=PLAN_LAYOUT)
    b = client(p.addr, "1/2", layout=PLAN_LAYOUT)
    with pytest.raises(psd.PsdError, match="no plan"):
        next(a.plan_batches())                    # not connected: no plan yet
    st = harness.psctl(p.addr, "status")
    assert st.returncode == 0 and "workers: 0 seen" in st.stdout and "plan:" not in st.stdout, st.stdout
    a.plan_set(epochs, samples, batch, seed)
    b.plan_set(9, samples, 4, 99)                 # the first worker's plan wins
    init = np.zeros(PLAN_N, dtype=np.float32)
    a.params[:] = init
    logs = ([], [])
    run_threads(lambda: (a.connect(), planned_worker(a, x, y, logs[0])),
                lambda: (time.sleep(0.2), b.connect(), planned_worker(b, x, y, logs[1])))
    job = psd.Plan(epochs, samples, batch, seed)
    assert a.plan() == job and b.plan() == job and job.rounds == rounds
    for c in (a, b):
        assert c.plan_done() and c.plan_slice() is None and c.version == rounds
    # both trained every round, their slices disjoint and together the round's global batch
    assert [v for v, _, _ in logs[0]] == list(range(rounds)) == [v for v, _, _ in logs[1]]
    model = init.copy()
    for (v, s0, i0), (_, s1, i1) in zip(*logs):
        e, i = divmod(v, job.rounds_per_epoch)
        lo, hi = i * batch, min(samples, (i + 1) * batch)
        assert (s0.epoch, s0.rank, s0.count, s1.epoch, s1.rank, s1.count) == (e, 0, 2, e, 1, 2)
        assert (s0.lo, s0.hi, s1.lo, s1.hi) == (lo, lo + (hi - lo) // 2, lo + (hi - lo) // 2, hi)
        order = psd.epoch_order(samples, seed, e)
        assert not set(i0) & set(i1)
        assert sorted(np.concatenate([i0, i1])) == sorted(order[lo:hi])
        # psd's BSP round: the mean of the two pushes, SGD at lr 0.5
        model -= 0.5 * (slice_gradient(model, x, y, i0) + slice_gradient(model, x, y, i1)) / 2
    assert len(logs[0][-1][2]) == 0 and len(logs[1][-1][2]) == 1   # one sample for two workers
    assert np.allclose(a.params, model, atol=1e-5) and np.array_equal(a.params, b.params)
    loss = lambda w: float(np.mean((x @ w[:5] + w[5] - y) ** 2))  # noqa: E731
    assert loss(model) < 0.2 * loss(init)
    # after the end a pushpull answers at once, done, and the push is dropped
    a.grads[:] = 1.0
    a.pushpull()
    assert a.plan_done() and a.version == rounds and a.dropped >= 1
    assert list(a.plan_batches()) == []
    with pytest.raises(psd.PsdError) as e:
        a.plan_set(1, 10, 5)                      # connected: too late to propose one
    assert e.value.name == "ESTATE"
    st = harness.psctl(p.addr, "status")
    assert st.returncode == 0 and "plan: done at round %d " % rounds in st.stdout, st.stdout


def test_plan_late_worker_gets_the_current_round(cluster):
    samples, batch, epochs, seed = 40, 8, 3, 5    # 5 rounds an epoch
    rounds = epochs * 5
    p = start(cluster, mode="bsp", workers=2)
    x, y = regression(samples)
    a, b = client(p.addr, "0/2", layout=PLAN_LAYOUT), client(p.addr, "1/2", layout=PLAN_LAYOUT)
    for c in (a, b):
        c.plan_set(epochs, samples, batch, seed)
    run_threads(a.connect, lambda: (time.sleep(0.2), b.connect()))
    ia, ib = a.plan_batches(samples), b.plan_batches(samples)
    for _ in range(3):                            # rounds 0..2 together
        for it, c in ((ia, a), (ib, b)):
            idx = next(it)
            c.grads[:] = slice_gradient(c.params, x, y, idx)
        run_threads(a.pushpull, b.pushpull)
    assert a.version == 3 and a.plan_slice().count == 2
    b.close()                                     # round 3 is a's alone now
    a.grads[:] = slice_gradient(a.params, x, y, next(ia))
    a.pushpull()
    assert a.version == 4 and a.plan_slice() == psd.Slice(0, 32, 40, 0, 1)  # the whole batch
    st = harness.psctl(p.addr, "status")
    assert "plan: epoch 1/3, round 5 of 15, 1 worker a round (8 samples each)" in st.stdout, st.stdout
    # shard 1 comes back (restarted, with a plan of its own): its first pull
    # waits for the next round, and then it learns where the job stands
    late = client(p.addr, "1/2", layout=PLAN_LAYOUT)
    late.plan_set(1, 10, 10, 0)
    idx = next(ia)
    with pytest.raises(psd.PsdError, match="round 4 is still open"):
        next(ia)                                  # a second batch, round 4 not pushed yet
    ia = a.plan_batches(samples)                  # the generator ended with the error
    assert np.array_equal(next(ia), idx)
    a.grads[:] = slice_gradient(a.params, x, y, idx)
    run_threads(late.connect, lambda: (time.sleep(0.3), a.pushpull()))
    assert late.version == a.version == 5
    assert late.plan() == psd.Plan(epochs, samples, batch, seed)    # the job's, not its own
    assert late.plan_slice() == psd.Slice(1, 4, 8, 1, 2)          # epoch 1's first round, its half
    assert a.plan_slice() == psd.Slice(1, 0, 4, 0, 2)
    logs = ([], [])
    run_threads(lambda: planned_worker(a, x, y, logs[0]), lambda: planned_worker(late, x, y, logs[1]))
    assert a.version == late.version == rounds and a.plan_done() and late.plan_done()
    assert [v for v, _, _ in logs[0]] == [v for v, _, _ in logs[1]] == list(range(5, rounds))


def test_waiting_for_names_the_shard_a_round_waits_for(cluster):
    """A BSP step of shard 0 waits for shard 1, which has not joined: the
    client hears from psd whom the round waits for, WaitNotice writes it as
    psworker's progress line does, and both are quiet once the round closed."""
    p = start(cluster, mode="bsp", args=("--set", "heartbeat_timeout=1s", "--set", "join_timeout=60s"))
    a = client(p.addr, "0/2", connect=True)
    assert a.waiting_for() is None and a.waited() == 0.0  # no step in flight
    a.grads[:] = 1.0
    out = harness.LineStream()
    notice = psd.WaitNotice(a, prefix="worker 0/2: ", after=0.5, stream=out, tick=0.1)
    with notice:
        t = threading.Thread(target=a.pushpull)
        t.start()
        try:
            want = "round 0 waits for shard 1/2 (never joined)"
            deadline = time.monotonic() + 10
            while a.waiting_for() != want and time.monotonic() < deadline:
                time.sleep(0.02)
            assert a.waiting_for() == want
            assert a.waited() > 0
            deadline = time.monotonic() + 10
            while "waits for" not in out.text and time.monotonic() < deadline:
                time.sleep(0.02)
            assert "worker 0/2: waiting " in out.text
            assert " s for psd: " + want + "\n" in out.text, out.text
            assert notice.line().startswith("worker 0/2: waiting ")
        finally:
            b = client(p.addr, "1/2", connect=True)
            b.grads[:] = 3.0
            b.pushpull()
            t.join(10)
    assert not t.is_alive() and a.version == 1
    assert a.waiting_for() is None and a.waited() == 0.0 and notice.line() is None
    lines = out.text.splitlines()
    assert lines and all(line.startswith("worker 0/2: waiting ") for line in lines), lines


def test_tables_numpy_keys_and_rows(cluster):
    """psd.Client's tables (proto/PROTOCOL.md section 13): NumPy keys of any
    integer type (int64 keys are the uint64 keys' bits), rows as float32
    arrays; repeats pulled once and summed on push; the initial rows are
    the same for two workers; AdaGrad as section 13.4 gives it."""
    p = start(cluster)
    a = client(p.addr, "0/2", connect=True)
    b = client(p.addr, "1/2", connect=True)
    with pytest.raises(KeyError):
        a.pull_rows("emb", [1])
    for c in (a, b):
        c.table("emb", 4, init="uniform", scale=0.05, seed=11, opt="adagrad", lr=0.1)
    with pytest.raises(psd.PsdError) as e:
        b.table("emb", 4, init="uniform", scale=0.05, seed=11, opt="adagrad", lr=0.2)
    assert e.value.code == -7 and "but psd holds it as" in str(e.value)  # ELAYOUT
    with pytest.raises(psd.PsdError) as e:
        a.table("x", 4, opt="adagrad", momentum=0.9)
    assert "momentum" in str(e.value)
    keys = np.array([3, -1, 3, 2**40], np.int64)  # -1: the key 2^64 - 1
    r0 = a.pull_rows("emb", keys)
    assert r0.shape == (4, 4) and r0.dtype == np.float32
    assert np.array_equal(r0[0], r0[2]) and np.all(np.abs(r0) < 0.05)
    assert np.array_equal(b.pull_rows("emb", np.array([2**64 - 1], np.uint64))[0], r0[1])
    g = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    a.push_rows("emb", keys, g)
    got = b.pull_rows("emb", [3, 2**40, 7])
    sum3 = g[0] + g[2]  # key 3 twice: summed
    want3 = r0[0] - 0.1 * sum3 / (np.sqrt(sum3.astype(np.float64) ** 2) + 1e-10)
    np.testing.assert_allclose(got[0], want3, rtol=1e-6)
    np.testing.assert_allclose(got[1], r0[3] - 0.1 * np.sign(g[3]) * (g[3] != 0), rtol=1e-6)
    nxt = a.pushpull_rows("emb", [7], np.ones((1, 4), np.float32), [7, 3])
    assert nxt.shape == (2, 4) and np.array_equal(nxt[1], got[0])
    assert not np.array_equal(nxt[0], got[2])
    out = np.empty((2, 4), np.float32)
    assert a.pull_rows("emb", [7, 3], out=out) is out and np.array_equal(out, nxt)
    with pytest.raises(ValueError):
        a.push_rows("emb", [1, 2], np.ones((3, 4), np.float32))
    with pytest.raises(TypeError):
        a.pull_rows("emb", [1.5])
    a.close()
    b.close()


def test_tables_rows_packed_on_the_wire(cluster):
    """A client with wire "bf16" pushes row gradients and pulls rows as
    bfloat16 (PROTOCOL.md 13.2): the rows it gets are psd's float32 rows
    rounded to bfloat16, and what it pushed applied as its bfloat16 values;
    one with compress on sends them compressed and gets them back
    compressed, exactly (psd counts the compressed bytes both ways)."""
    p = start(cluster, workers=3)
    f = client(p.addr, "0/3", shm=False)
    h = client(p.addr, "1/3", shm=False, wire="bf16")
    z = client(p.addr, "2/3", shm=False, compress=True)
    for c in (f, h, z):
        c.connect()
        c.table("emb", 16, init="zeros", opt="sgd", lr=1.0)
    keys = np.arange(1000, 3000, dtype=np.uint64)
    g = np.zeros((keys.size, 16), np.float32)
    g[:, :4] = np.random.default_rng(3).standard_normal((keys.size, 4)) / 3
    h.push_rows("emb", keys, g)
    wide = harness.bf16_widen(harness.bf16_bits(g)).reshape(g.shape)
    rows = f.pull_rows("emb", keys)
    assert np.array_equal(rows, -wide)  # lr 1 from zeros: minus what went on the wire
    got = h.pull_rows("emb", keys)
    assert np.array_equal(got, harness.bf16_widen(harness.bf16_bits(rows)).reshape(rows.shape))
    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
    before = harness.metric(samples, "psd_wire_zstd_received_bytes_total")
    sent_before = harness.metric(samples, "psd_wire_zstd_sent_bytes_total")
    nxt = z.pushpull_rows("emb", keys, g, keys)
    assert np.array_equal(nxt, rows - g)  # bit for bit: lossless both ways
    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
    assert 0 < harness.metric(samples, "psd_wire_zstd_received_bytes_total") - before < g.nbytes / 2
    assert 0 < harness.metric(samples, "psd_wire_zstd_sent_bytes_total") - sent_before < g.nbytes / 2
    for c in (f, h, z):
        c.close()


def test_tables_through_the_segment(cluster):
    """On psd's machine a client's table calls go through its table
    segment (PROTOCOL.md 13.9) unless shm is off: the same pushes and
    pulls, bit for bit, either way, and the segment used again after a
    reconnect."""
    p = start(cluster, workers=2)
    s = client(p.addr, "0/2")
    t = client(p.addr, "1/2", shm=False)
    rng = np.random.default_rng(11)
    keys = rng.integers(0, 1 << 62, 3000, dtype=np.int64).astype(np.uint64)
    for c, name in ((s, "a"), (t, "b")):
        c.connect()
        c.table(name, 8, init="uniform", scale=0.1, seed=4, opt="adagrad", lr=0.2)
    assert s.table_shm and not t.table_shm
    for step in range(4):
        ks = keys[rng.choice(keys.size, 700)]  # repeats: summed by the client
        nxt = keys[rng.choice(keys.size, 900)]
        g = rng.standard_normal((ks.size, 8)).astype(np.float32)
        a = s.pushpull_rows("a", ks, g, nxt)
        b = t.pushpull_rows("b", ks, g, nxt)
        assert a.tobytes() == b.tobytes(), step
        if step == 1:
            s.reconnect()
            assert s.table_shm
    assert s.pull_rows("a", keys).tobytes() == t.pull_rows("b", keys).tobytes()
    s.close()
    t.close()


# ---- signals, and what a first job meets -----------------------------------

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

STEP_CHILD = r"""
import sys, threading, time
import psd
c = psd.Client([("w", (4,))], server=sys.argv[1], shard="0/2", connect_s=5)
c.connect()
def watch():
    while c.waited() < 0.3:
        time.sleep(0.01)
    print("waiting", flush=True)
threading.Thread(target=watch, daemon=True).start()
try:
    c.pushpull()
except KeyboardInterrupt as e:
    print("KeyboardInterrupt %s" % e, flush=True)
    sys.exit(3)
print("step returned", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_a_bsp_wait_and_the_worker_says_bye(cluster, sig):
    """Ctrl-C (SIGINT) or SIGTERM while a BSP step waits for a shard that
    never joins (join_timeout 0: for ever) ends the step within a second
    with KeyboardInterrupt, and the client says bye: psd shows the worker
    as left, with the signal as the reason, not lost."""
    p = start(cluster, mode="bsp", args=("--set", "join_timeout=0", "--set", "heartbeat_timeout=1s"))
    w = harness.Proc("sig-child", [PY, "-c", STEP_CHILD, p.addr], cluster.dir, env=dict(os.environ))
    harness.wait_until(lambda: "waiting" in w.stdout() or not w.alive(), 20, "the child's step to wait")
    assert w.alive(), w.stderr()
    t0 = time.monotonic()
    w.p.send_signal(sig)
    rc = w.wait(20)
    took = time.monotonic() - t0
    name = "SIGTERM" if sig == signal.SIGTERM else "SIGINT"
    assert rc == 3, (rc, w.stdout(), w.stderr())
    assert "KeyboardInterrupt" in w.stdout()
    assert took < 1.0, "the step ended %.2f s after %s" % (took, name)
    st = harness.status(p.addr)
    row = [r for r in st["workers"] if r["shard"] == 0][0]
    assert row["state"] == "left" and row["why"] == "stopped by %s" % name, row


STEP_CHILD_OTHER_THREAD = """
import signal, sys, threading, time
import psd
class Stop(Exception):
    pass
def on_usr1(signum, frame):
    raise Stop("SIGUSR1")
signal.signal(signal.SIGUSR1, on_usr1)
c = psd.Client([("w", (4,))], server=sys.argv[1], shard="0/2", connect_s=5)
c.connect()
def watch():
    while c.waited() < 0.3:
        time.sleep(0.01)
    print("waiting", flush=True)
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # on this thread, not the waiting one
    print("sent", flush=True)
threading.Thread(target=watch, daemon=True).start()
try:
    c.pushpull()
except Stop as e:
    print("Stop %s" % e, flush=True)
    sys.exit(3)
print("step returned", flush=True)
"""


def test_a_signal_on_another_thread_ends_a_bsp_wait(cluster):
    """A signal that lands on another thread than the waiting one (as in a
    program with threads of its own, PyTorch's among them), or on the
    waiting thread just before its wait sleeps, interrupts no poll: the
    wake-up descriptor the package sets (signal.set_wakeup_fd, libpsclient's
    option wakeup_fd) ends the wait all the same, and the handler runs.
    Without it this step waits for a shard that never joins, for ever."""
    p = start(cluster, mode="bsp", args=("--set", "join_timeout=0", "--set", "heartbeat_timeout=1s"))
    w = harness.Proc("sig-thread-child", [PY, "-c", STEP_CHILD_OTHER_THREAD, p.addr], cluster.dir,
                     env=dict(os.environ))
    try:
        harness.wait_until(lambda: "sent" in w.stdout() or not w.alive(), 20, "the child's signal to its thread")
        rc = w.wait(10)
        assert rc == 3, (rc, w.stdout(), w.stderr())
        assert "Stop SIGUSR1" in w.stdout(), w.stdout()
    finally:
        w.kill()


def test_wakeup_fd_is_checked(cluster):
    """The option takes a descriptor open for reading without blocking, or
    off; anything else is refused with what it must be."""
    r, wr = os.pipe()
    try:
        for bad, why in (("x", "off or a descriptor"), (str(wr), "open for reading"), (str(r), "non-blocking"),
                         ("99999", "not an open descriptor")):
            with pytest.raises(psd.PsdError, match=why):
                psd.Client([("w", (4,))], interrupt=True, wakeup_fd=bad)
        os.set_blocking(r, False)
        psd.Client([("w", (4,))], interrupt=True, wakeup_fd=r).close()
        psd.Client([("w", (4,))], interrupt=True, wakeup_fd="off").close()
    finally:
        os.close(r)
        os.close(wr)


def test_a_wrong_address_is_said_at_once(cluster):
    """psd not there: the client says on stderr at once that it waits for
    psd at that address and for how long, not only after connect_s."""
    port = harness.free_port()
    child = "import psd\npsd.Client([('w', (4,))], server='127.0.0.1:%d', connect_s=20).connect()\n" % port
    w = harness.Proc("addr-child", [PY, "-c", child], cluster.dir, env=dict(os.environ))
    try:
        t0 = time.monotonic()
        line = harness.wait_until(lambda: [ln for ln in w.stderr().splitlines() if "waiting for psd" in ln], 5,
                                  "the waiting line")
        assert time.monotonic() - t0 < 3
        assert "waiting for psd at 127.0.0.1:%d" % port in line[0], line
        assert "trying for up to 20 s (connect_s)" in line[0], line
        assert "Connection refused" in line[0], line
    finally:
        w.kill()


def test_a_shard_taken_is_refused_at_once(cluster):
    p = start(cluster)
    a = client(p.addr, "0/2", connect=True)
    t0 = time.monotonic()
    with pytest.raises(psd.PsdError, match="shard 0 is already connected") as e:
        client(p.addr, "0/2", connect_s=30, connect=True)
    assert time.monotonic() - t0 < 3
    assert e.value.name == "ESHARD" and "a shard of its own" in str(e.value) and "unreachable" not in str(e.value)
    a.close()


def test_params_and_grads_cannot_be_replaced():
    """Assigning Client.params or .grads would leave the library's vectors
    behind (psd's initial model zeros, every push zeros): it is refused
    with what to do, and copying into them works."""
    c = psd.Client(LAYOUT, connect_s=1)
    before = c.params
    with pytest.raises(AttributeError, match=r"c\.params\[:\] = values.*c\.bind\(params=array\)"):
        c.params = np.ones(N, dtype=np.float32)
    with pytest.raises(AttributeError, match=r"c\.grads\[:\] = gradient.*c\.bind\(grads=array\)"):
        c.grads = np.ones(N, dtype=np.float32)
    assert c.params is before
    c.params[:] = 2.0
    assert float(c.tensor("b")[0]) == 2.0
    mine = np.zeros(N, dtype=np.float32)
    c.bind(params=mine)
    assert c.params is mine
    c.bind()
    assert c.params is before


def test_import_without_numpy_says_what_to_install():
    child = "import sys\nsys.modules['numpy'] = None\nimport psd\n"
    r = subprocess.run([PY, "-c", child], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: psd needs NumPy"), r.stderr
    assert "apt-get install python3-numpy" in last, last


def test_layout_mismatch_names_the_first_difference_whole(cluster):
    """A worker whose model differs from psd's in one tensor deep in a long
    layout hears which (place, name, both shapes), both parameter counts and
    that `psctl reset` starts a new job, in a message that is not cut."""
    p = start(cluster)
    names = ["encoder.layers.%02d.self_attention.in_proj_weight" % i for i in range(30)]
    mine = [(n, (8, 8)) for n in names]
    theirs = list(mine)
    theirs[17] = (names[17], (8, 9))
    a = client(p.addr, "0/2", layout=mine, connect=True)
    with pytest.raises(psd.PsdError) as e:
        client(p.addr, "1/2", layout=theirs, connect=True)
    msg = str(e.value)
    assert e.value.name == "ELAYOUT"
    assert ("model layout mismatch at tensor 17: psd holds %s[8,8], this worker has %s[8,9]" % (names[17], names[17])
            in msg), msg
    assert "psd: 1920 parameters in 30 tensors" in msg and "this worker: 1928 in 30" in msg, msg
    assert "`psctl reset`" in msg and msg.endswith("psd's) [LAYOUT] [ELAYOUT]"), msg
    a.close()


# ---- buffers: tensors psd keeps but does not train --------------------------

BUF_LAYOUT = [("w", (4,)), ("m", (3,), "mean"), ("f", (2,), "first", "I64")]


def test_buffers_asgd_mean_and_first_saved_in_their_dtype(cluster):
    """asgd: the optimizer leaves buffers alone; a "mean" buffer moves
    1/workers of the way to each push's values, a "first" one takes shard
    0's and ignores the others'; psctl save writes them under their names,
    "first" as I64; a worker with another rule is another layout."""
    p = start(cluster)
    a = client(p.addr, "0/2", layout=BUF_LAYOUT)
    assert a.buffers == {"m": ("mean", "F32"), "f": ("first", "I64")}
    a.params[:] = [1, 1, 1, 1, 0, 0, 0, 5, 5]
    a.connect()
    b = client(p.addr, "1/2", layout=BUF_LAYOUT, connect=True)
    a.grads[:] = [1, 1, 1, 1, 2, 2, 2, 9, 9]          # gradient, then the buffers' values
    a.pushpull()
    assert a.params.tolist() == [0.5] * 4 + [1.0] * 3 + [9.0] * 2
    b.grads[:] = [1, 1, 1, 1, 4, 4, 4, 100, 100]
    b.pushpull()
    assert b.params.tolist() == [0.0] * 4 + [2.5] * 3 + [9.0] * 2
    path = os.path.join(cluster.dir, "buf.safetensors")
    r = harness.psctl(p.addr, "save", path)
    assert r.returncode == 0, r.stderr
    meta, t = harness.read_safetensors(path)
    assert list(t) == ["w", "m", "f"]
    assert t["f"].dtype == np.int64 and t["f"].tolist() == [9, 9]
    assert t["m"].dtype == np.float32 and t["m"].tolist() == [2.5] * 3
    assert meta["buffer:m"] == "mean" and meta["buffer:f"] == "first" and "buffer:w" not in meta
    # psd --init-from takes the file back: the same values, buffers as buffers
    q = start(cluster, name="psd-from", args=("--init-from", path))
    c = client(q.addr, "0/2", layout=BUF_LAYOUT, connect=True)
    assert c.params.tolist() == [0.0] * 4 + [2.5] * 3 + [9.0] * 2
    with pytest.raises(psd.PsdError, match="at tensor 1: psd holds m\\[3\\] \\(a buffer: mean, F32\\), this worker has m\\[3\\]"):
        client(q.addr, "1/2", layout=[("w", (4,)), ("m", (3,)), ("f", (2,))], connect=True)
    c.close()
    b.close()
    with pytest.raises(psd.PsdError) as e:
        client(p.addr, "1/2", layout=BUF_LAYOUT[:2] + [("f", (2,), "mean", "I64")], connect=True)
    assert ("layout mismatch at tensor 2: psd holds f[2] (a buffer: first, I64), this worker has f[2] (a buffer: "
            "mean, I64)") in str(e.value)


def test_buffers_and_tables_saved_together(cluster):
    """A model with buffers and an embedding table: psctl save writes the
    buffers in their dtypes with their "buffer:NAME" rules and the table's
    rows and keys with its "psd.tables" declaration, in one file; psd
    --init-from takes back both (buffers as buffers, the same rows)."""
    p = start(cluster, workers=1)
    a = client(p.addr, "0/1", layout=BUF_LAYOUT)
    a.params[:] = [1, 1, 1, 1, 2, 2, 2, 7, 7]
    a.connect()
    a.table("emb", 3, init="uniform", scale=0.5, seed=5, opt="adagrad", lr=0.1)
    keys = np.array([4, 2**63 + 1, 9], np.uint64)
    a.push_rows("emb", keys, np.arange(9, dtype=np.float32).reshape(3, 3) - 4)
    rows = a.pull_rows("emb", keys)
    path = os.path.join(cluster.dir, "buf-tab.safetensors")
    r = harness.psctl(p.addr, "save", path)
    assert r.returncode == 0, r.stderr
    meta, t = harness.read_safetensors(path)
    assert list(t) == ["w", "m", "f", "tables/emb/rows", "tables/emb/keys"]
    assert t["f"].dtype == np.int64 and t["f"].tolist() == [7, 7]
    assert meta["buffer:m"] == "mean" and meta["buffer:f"] == "first"
    assert [d["name"] for d in json.loads(meta["psd.tables"])] == ["emb"]
    assert sorted(t["tables/emb/keys"].view(np.uint64).tolist()) == sorted(keys.tolist())
    q = start(cluster, workers=1, name="psd-from", args=("--init-from", path))
    c = client(q.addr, "0/1", layout=BUF_LAYOUT, connect=True)
    assert c.params.tolist() == [1.0] * 4 + [2.0] * 3 + [7.0] * 2
    c.table("emb", 3, init="uniform", scale=0.5, seed=5, opt="adagrad", lr=0.1)  # the file's declaration
    assert c.pull_rows("emb", keys).tobytes() == rows.tobytes()
    c.close()
    with pytest.raises(psd.PsdError, match="a buffer: first, I64"):  # held as the file's buffer
        client(q.addr, "0/1", layout=BUF_LAYOUT[:2] + [("f", (2,), "first")], connect=True)
    a.close()


def test_buffers_bsp_mean_and_first_of_the_round(cluster):
    p = start(cluster, mode="bsp")
    a = client(p.addr, "0/2", layout=BUF_LAYOUT)
    a.params[:] = [1, 1, 1, 1, 0, 0, 0, 5, 5]
    a.connect()
    b = client(p.addr, "1/2", layout=BUF_LAYOUT, connect=True)
    a.grads[:] = [1, 1, 1, 1, 2, 2, 2, 7, 7]
    b.grads[:] = [3, 3, 3, 3, 4, 4, 4, 100, 100]
    run_threads(a.pushpull, b.pushpull)
    for c in (a, b):   # w - 0.5 * mean(1, 3); m the mean; f shard 0's
        assert c.params.tolist() == [0.0] * 4 + [3.0] * 3 + [7.0] * 2, c.params


def topk_grad(rng):
    """A gradient of multiples of 1/64: its sums, halved by lr 0.5, are
    exact in float32, so the model can be compared bit for bit."""
    return (rng.integers(-256, 257, N) / 64.0).astype(np.float32)


def drain(c, pushes=5):
    """Pushes zero gradients until the residual is all sent: with topk 0.25
    a push sends 300 of w's 1,200 values and 1 of b's 4, so 4 pushes."""
    for _ in range(pushes):
        c.grads[:] = 0.0
        c.pushpull()
    assert not c.grads.any(), "the residual was empty before the last push"


def test_topk_sends_k_per_tensor_and_loses_nothing(cluster):
    p = start(cluster, workers=1)
    a = client(p.addr, "0/1", topk=0.25, shm=False)
    a.params[:] = 0.0
    a.connect()
    rng = np.random.default_rng(5)
    total = np.zeros(N, dtype=np.float64)
    for _ in range(8):
        g = topk_grad(rng)
        total += g
        a.grads[:] = g
        a.pushpull()
        # after a push the gradient vector holds what was sent: 300 of w,
        # 1 of b, the largest of gradient plus residual
        assert np.count_nonzero(a.grad("w")) <= 300 and np.count_nonzero(a.grad("b")) <= 1
    assert not np.array_equal(a.params, (-0.5 * total).astype(np.float32))  # some still held back
    drain(a)
    assert np.array_equal(a.params, (-0.5 * total).astype(np.float32))   # all of it, bit for bit
    a.close()


def test_topk_step_sent_again_after_a_restart(cluster):
    p = start(cluster, workers=1)
    port = p.port
    a = client(p.addr, "0/1", topk=0.25, shm=False, reconnect_s=20)
    a.params[:] = 0.0
    a.connect()
    rng = np.random.default_rng(6)
    g1, g2 = topk_grad(rng), topk_grad(rng)
    a.grads[:] = g1
    a.pushpull()
    p.kill()
    start(cluster, workers=1, name="psd-again", args=("--listen", "127.0.0.1:%d" % port))
    a.grads[:] = g2
    a.pushpull()                                     # the new psd takes our values, then the push again
    assert a.reconnects == 1 and a.lost_steps == 0
    drain(a)
    want = (-0.5 * (g1.astype(np.float64) + g2)).astype(np.float32)
    assert np.array_equal(a.params, want)            # what was sent again counted once, the rest later
    a.close()


def test_topk_refusals(cluster):
    p = start(cluster, workers=1)
    with pytest.raises(psd.PsdError, match="bad topk '1.5'"):
        client(p.addr, "0/1", topk=1.5)
    with pytest.raises(psd.PsdError, match="topk needs skip_zeros on"):
        client(p.addr, "0/1", topk=0.01, skip_zeros=False, connect=True)


def test_layout_limits_are_named():
    """A layout of 2,048 tensors with 127-byte names is taken (ResNet-152
    has 932 tensors); the 2,049th tensor, or a 128-byte name, is refused
    by an error that names the limit, not the tensor as if it were wrong."""
    long = "model.transformer_backbone.language_model.encoder.layers.11.self_attn.out_proj."
    c = psd.Client([("%s%04d" % ((long * 2)[:123], i), (2,)) for i in range(2048)])
    assert len(c.tensors) == 2048 and max(len(n) for n in c.tensors) == 127
    with pytest.raises(psd.PsdError, match=r"the layout has 2048 tensors already, the most psd takes "
                                           r"\(PS_TENSORS_MAX\)"):
        psd.Client([("t%d" % i, (1,)) for i in range(2049)])
    with pytest.raises(psd.PsdError, match=r"has 128 bytes: a name has 1\.\.127 \(PS_NAME_MAX\)"):
        psd.Client([("n" * 128, (1,))])
