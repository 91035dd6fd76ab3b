"""test_python.py - the Python package psd (python/psd) against a real psd.

Run by ctest (client_python) with Debian's pytest:

    PSD_CLIENT_LIBRARY=build/client/libpsclient.so.1 PYTHONPATH=python \\
        /usr/bin/python3 -m pytest -q tests/client/test_python.py

psd runs plain SGD at lr 0.5 without momentum, so expected values are exact.
"""

import ctypes
import os
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
    a.pushpull()                                     # the step is lost, the connection back
    assert a.reconnects == 1 and a.lost_steps == 1
    assert np.array_equal(a.params, before)          # the new psd took our values
    a.pushpull()
    assert np.array_equal(a.params, before - 0.5)


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
