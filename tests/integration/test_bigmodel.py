#!/usr/bin/python3
"""test_bigmodel.py - a model of several 4 MiB blocks, pushed and pulled in
chunks by raw protocol clients, against exact expectations.

psd keeps the parameters in copy-on-write blocks of 2^20 floats and applies
pushes of at least 2^19 floats on its thread pool into fresh blocks. These
tests check that path's arithmetic (SGD at lr 0.5, which float32 computes
exactly like numpy), that a pulled chunk never mixes two versions of a block
while pushes of another worker are applied, that chunks across block edges
land where they belong, that a NaN chunk leaves the model untouched, and
that a worker closing its connection right after a big push neither loses
that push nor upsets psd, and that a worker's chunk pulls are answered in
request order when the first waits for a BSP round and the next arrive while
its update runs.
"""

import os
import re
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_NONFINITE, T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_WELCOME,  # noqa: E402
                     RawClient, expect_error)

BLK = 1 << 20                   # psd's block and psworker's chunk, in floats
TOTAL = 2 * BLK + BLK // 2      # three blocks, the last one short
LAYOUT = [["w", [TOTAL]]]
LR = np.float32(0.5)            # a power of two: lr * g is exact in float32
TIMEOUT = 30.0


def chunks(total, size=BLK, start=0):
    """(offset, length) pieces of [start, total) of at most size floats."""
    off = start
    while off < total:
        n = min(size, total - off)
        yield off, n
        off += n


def grad(rng, n):
    # multiples of 2^-10 in [-1, 1): w - 0.5 * g stays exact for |w| < 2^12
    return (rng.integers(-1024, 1024, size=n) / 1024.0).astype("<f4")


class Job:
    """psd in ASGD with plain SGD at lr 0.5 and a worker that initialised the
    model; expected values are kept in numpy."""

    def __init__(self, cl, test, mode="asgd", extra=()):
        self.t = test
        self.psd = cl.psd(mode=mode, workers=2,
                          args=["--set", "optimizer=sgd", "--set", "lr=0.5", "--set", "momentum=0",
                                "--set", "weight_decay=0", "--set", "warmup_versions=0",
                                "--set", "heartbeat_timeout=600s"] + list(extra))
        self.rng = np.random.default_rng(7)
        self.w = (self.rng.integers(-4096, 4096, size=TOTAL) / 1024.0).astype("<f4")
        self.version = 0
        self.a = self.join(0, init=True)

    def join(self, shard, init=False):
        c = RawClient(self.psd.addr, TIMEOUT)
        r = c.hello_worker(LAYOUT, shard, 2)
        self.t.assertEqual(r.get("t"), T_WELCOME, r)
        self.t.assertEqual(r.get("init"), init, r)
        if init:
            pieces = list(chunks(TOTAL))
            for i, (off, n) in enumerate(pieces):
                r = c.request({"t": T_INIT, "off": off, "data": self.w[off:off + n].tobytes(),
                               "fin": i == len(pieces) - 1})
                self.t.assertEqual(r.get("t"), T_OK, r)
        return c

    def push(self, c, g, off, fin=True):
        r = c.request({"t": T_PUSH, "base": self.version, "off": off, "data": g.tobytes(), "fin": fin})
        self.t.assertEqual(r.get("t"), T_OK, r)
        self.w[off:off + len(g)] -= LR * g
        if fin:
            self.version += 1

    def pull_all(self, c):
        got = np.empty(TOTAL, dtype="<f4")
        for off, n in chunks(TOTAL):
            r = c.request({"t": T_PULL, "off": off, "len": n, "min": 0})
            self.t.assertEqual(r.get("t"), T_PARAMS, r)
            self.t.assertEqual((r["off"], len(r["data"])), (off, 4 * n))
            got[off:off + n] = np.frombuffer(r["data"], dtype="<f4")
        return got


class BigModelTest(unittest.TestCase):
    def test_chunks_across_block_edges_apply_exactly(self):
        with harness.Cluster("psd-bigmodel") as cl:
            job = Job(cl, self)
            try:
                np.testing.assert_array_equal(job.pull_all(job.a), job.w, "the initial values")
                # chunks that start inside a block and cross into the next,
                # big enough to be applied off psd's loop; fin on the last
                pieces = list(chunks(TOTAL, BLK, start=BLK // 3))
                for i, (off, n) in enumerate(pieces):
                    job.push(job.a, grad(job.rng, n), off, fin=i == len(pieces) - 1)
                # and a small one, applied on the loop
                job.push(job.a, grad(job.rng, 1000), BLK - 500)
                np.testing.assert_array_equal(job.pull_all(job.a), job.w, "after the pushes")
                self.assertEqual(harness.status(job.psd.addr)["version"], job.version)
            finally:
                job.a.close()

    def test_nan_chunk_leaves_the_model_untouched(self):
        with harness.Cluster("psd-bigmodel-nan") as cl:
            job = Job(cl, self)
            try:
                g = grad(job.rng, BLK)
                g[BLK - 1] = np.nan
                r = job.a.request({"t": T_PUSH, "base": 0, "off": BLK, "data": g.tobytes(), "fin": True})
                expect_error(self, r, E_NONFINITE, "a NaN in a 2^20-float chunk")
                np.testing.assert_array_equal(job.pull_all(job.a), job.w, "the model after a refused push")
                self.assertEqual(harness.status(job.psd.addr)["version"], 0)
            finally:
                job.a.close()

    def test_pulls_see_whole_blocks_while_another_worker_pushes(self):
        """Worker A pushes whole-model steps with its chunks back to back
        while worker B keeps two chunk pulls in flight, as psworker does.
        Each chunk B gets is one block, and must hold that block's values
        after some whole number of A's steps: never a block half updated."""
        with harness.Cluster("psd-bigmodel-tear") as cl:
            job = Job(cl, self)
            b = job.join(1)
            try:
                steps = 6
                history = [job.w.copy()]
                gs = [grad(job.rng, TOTAL) for _ in range(steps)]
                for g in gs:
                    history.append(history[-1] - LR * g)
                pieces = list(chunks(TOTAL))
                seen, bad = set(), []

                def puller():
                    # every chunk of a round asked for at once, round after round, until
                    # the last step is seen (or 200 rounds)
                    for _ in range(200):
                        for off, n in pieces:
                            b.send_frame({"t": T_PULL, "id": b.next_id, "off": off, "len": n, "min": 0})
                            b.next_id += 1
                        for off, n in pieces:
                            r = b.recv_frame()
                            if r.get("t") != T_PARAMS:
                                bad.append(r)
                                return
                            got = np.frombuffer(r["data"], dtype="<f4")
                            match = [v for v in range(steps + 1) if np.array_equal(got, history[v][off:off + n])]
                            if not match:
                                bad.append("chunk at %d (version %d) is no whole step of its block" % (off, r["ver"]))
                                return
                            seen.add(match[0])
                        if steps in seen:
                            return

                t = threading.Thread(target=puller)
                t.start()
                for s, g in enumerate(gs):
                    for i, (off, n) in enumerate(pieces):
                        job.a.send_frame({"t": T_PUSH, "id": 1000 + s * 10 + i, "base": s, "off": off,
                                          "data": g[off:off + n].tobytes(), "fin": i == len(pieces) - 1})
                t.join(60)
                self.assertFalse(t.is_alive(), "the pulls did not finish")
                self.assertEqual(bad, [])
                self.assertIn(steps, seen)
                sys.stderr.write("block versions seen by the pulls: %s\n" % sorted(seen))
                for s in range(steps * len(pieces)):
                    r = job.a.recv_frame()
                    self.assertEqual(r.get("t"), T_OK, r)
                np.testing.assert_array_equal(job.pull_all(b), history[-1], "the model after all steps")
                self.assertEqual(harness.status(job.psd.addr)["version"], steps)
            finally:
                job.a.close()
                b.close()

    def bsp_rounds(self, order):
        with harness.Cluster("psd-bigmodel-bsp-" + order) as cl:
            job = Job(cl, self, mode="bsp", extra=["--set", "bsp_sum_order=" + order])
            b = job.join(1)
            try:
                pieces = list(chunks(TOTAL))
                for rnd in range(3):
                    g = [grad(job.rng, TOTAL) for _ in range(2)]
                    # worker 1 first, so arrival order differs from shard order;
                    # the last round in one frame each (the closing push is
                    # then read where it arrived, not copied)
                    frames = [(0, TOTAL)] if rnd == 2 else pieces
                    for c, gk in ((b, g[1]), (job.a, g[0])):
                        for i, (off, n) in enumerate(frames):
                            r = c.request({"t": T_PUSH, "base": rnd, "off": off, "data": gk[off:off + n].tobytes(),
                                           "fin": i == len(frames) - 1})
                            self.assertEqual(r.get("t"), T_OK, r)
                    mean = (g[0] + g[1]) * np.float32(0.5)  # float32, shard order
                    job.w -= LR * mean
                    got = np.empty(TOTAL, dtype="<f4")
                    for off, n in pieces:
                        r = b.request({"t": T_PULL, "off": off, "len": n, "min": rnd + 1})
                        self.assertEqual(r.get("t"), T_PARAMS, r)
                        self.assertEqual(r["ver"], rnd + 1)
                        got[off:off + n] = np.frombuffer(r["data"], dtype="<f4")
                    np.testing.assert_array_equal(got, job.w, "after round %d" % rnd)
                st = harness.status(job.psd.addr)
                self.assertEqual(st["version"], 3)
            finally:
                job.a.close()
                b.close()

    def test_bsp_pushes_again_within_a_round_are_refused(self):
        """psd keeps a block that arrives whole in its own frame where it
        arrived (no copy) and copies anything else into the worker's slot;
        a push may come in pieces of any ranges, in any order, but a range
        pushed again before the round closes is refused with DUPLICATE and
        changes nothing, whichever way either push was kept; a block a
        worker does not push counts as zeros."""
        with harness.Cluster("psd-bigmodel-again") as cl:
            job = Job(cl, self, mode="bsp")
            b = job.join(1)
            try:
                pieces = list(chunks(TOTAL))
                for rnd in range(3):
                    g = [grad(job.rng, TOTAL) for _ in range(2)]
                    got = [np.zeros(TOTAL, dtype="<f4") for _ in range(2)]
                    # worker 1: block 0 whole, a part of it again (refused), block 1
                    # in two pieces (the second last), block 0 whole again in
                    # round 1 (refused); block 2 only in round 2 (else zeros)
                    extra = grad(job.rng, TOTAL)
                    plan1 = [(0, BLK, g[1], False), (1000, 5000, extra, True), (BLK, BLK // 2, g[1], False)]
                    if rnd == 1:
                        plan1.append((0, BLK, extra, True))
                    if rnd == 2:
                        plan1.append((2 * BLK, BLK // 2, g[1], False))
                    plan1.append((BLK + BLK // 2, BLK // 2, g[1], False))
                    plan0 = [(off, n, g[0], False) for off, n in pieces[::-1]]  # last piece first
                    if rnd == 0:
                        plan0.insert(2, (BLK - 10, 20, extra, True))  # across the edge of blocks 0 and 1
                    for c, plan, k in ((b, plan1, 1), (job.a, plan0, 0)):
                        for i, (off, n, src, dup) in enumerate(plan):
                            r = c.request({"t": T_PUSH, "base": rnd, "off": off, "data": src[off:off + n].tobytes(),
                                           "fin": i == len(plan) - 1})
                            if dup:
                                self.assertEqual((r.get("t"), r.get("code")), (harness.T_ERROR, harness.E_DUPLICATE), r)
                            else:
                                self.assertEqual(r.get("t"), T_OK, r)
                                got[k][off:off + n] = src[off:off + n]
                    job.w -= LR * ((got[0] + got[1]) * np.float32(0.5))
                    np.testing.assert_array_equal(job.pull_all(b), job.w, "after round %d" % rnd)
            finally:
                job.a.close()
                b.close()

    def test_bsp_rounds_apply_the_mean_exactly(self):
        """A round's mean is made piece by piece and applied off the loop;
        the result is that of summing whole arrays, in both sum orders (and
        the arrival-order sum starts each round from zero)."""
        self.bsp_rounds("shard")
        self.bsp_rounds("arrival")

    def test_bsp_pulls_answered_in_request_order(self):
        """A worker's chunk pulls are answered in the order it sent them,
        even when the first waits for the round (parked) and the next ones
        arrive while the round's update is applied off the loop (held):
        when the update ends, the parked pull goes first. Worker B pushes,
        asks for chunk 0 of the next version, then worker A's push closes
        the round and B asks for chunks 1 and 2 a moment later, the delay
        varied over rounds so that some land while the update runs."""
        with harness.Cluster("psd-bigmodel-order") as cl:
            job = Job(cl, self, mode="bsp")
            b = job.join(1)
            try:
                pieces = list(chunks(TOTAL))
                for rnd, delay in enumerate((0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012)):
                    g = [grad(job.rng, TOTAL) for _ in range(2)]
                    for i, (off, n) in enumerate(pieces):
                        r = b.request({"t": T_PUSH, "base": rnd, "off": off, "data": g[1][off:off + n].tobytes(),
                                       "fin": i == len(pieces) - 1})
                        self.assertEqual(r.get("t"), T_OK, r)
                    ids = []

                    def pull(k):
                        off, n = pieces[k]
                        ids.append(b.next_id)
                        b.send_frame({"t": T_PULL, "id": b.next_id, "off": off, "len": n, "min": rnd + 1})
                        b.next_id += 1

                    pull(0)
                    for i, (off, n) in enumerate(pieces[:-1]):
                        r = job.a.request({"t": T_PUSH, "base": rnd, "off": off, "data": g[0][off:off + n].tobytes(),
                                           "fin": False})
                        self.assertEqual(r.get("t"), T_OK, r)
                    off, n = pieces[-1]
                    job.a.send_frame({"t": T_PUSH, "id": 9000 + rnd, "base": rnd, "off": off,
                                      "data": g[0][off:off + n].tobytes(), "fin": True})
                    time.sleep(delay)
                    for k in range(1, len(pieces)):
                        pull(k)
                    r = job.a.recv_frame()
                    self.assertEqual((r.get("t"), r.get("id")), (T_OK, 9000 + rnd), r)
                    job.w -= LR * ((g[0] + g[1]) * np.float32(0.5))
                    for k, (off, n) in enumerate(pieces):
                        r = b.recv_frame()
                        self.assertEqual(r.get("t"), T_PARAMS, r)
                        self.assertEqual((r.get("id"), r.get("off"), r.get("ver")), (ids[k], off, rnd + 1),
                                         "round %d (pulls %.1f ms after the closing push): reply %d of %d "
                                         "out of order" % (rnd, delay * 1e3, k + 1, len(pieces)))
                        np.testing.assert_array_equal(np.frombuffer(r["data"], dtype="<f4"), job.w[off:off + n])
                self.assertEqual(harness.status(job.psd.addr)["version"], 8)
            finally:
                job.a.close()
                b.close()

    def test_two_pushers_memory_stays_bounded(self):
        """Two workers push whole-model steps back to back at the same time
        (each update off the loop holds the other's frames): every step is
        applied, and psd's peak memory stays near the model's size."""
        with harness.Cluster("psd-bigmodel-two") as cl:
            job = Job(cl, self)
            b = job.join(1)
            steps, pieces = 12, list(chunks(TOTAL))
            errors = []

            def pusher(c, seed):
                rng = np.random.default_rng(seed)
                try:
                    for st in range(steps):
                        g = grad(rng, TOTAL)
                        for i, (off, n) in enumerate(pieces):
                            c.send_frame({"t": T_PUSH, "id": st * 10 + i, "base": 0, "off": off,
                                          "data": g[off:off + n].tobytes(), "fin": i == len(pieces) - 1})
                    for _ in range(steps * len(pieces)):
                        r = c.recv_frame()
                        if r.get("t") != T_OK:
                            errors.append(r)
                except Exception as e:  # reported below
                    errors.append(repr(e))

            ts = [threading.Thread(target=pusher, args=(c, k)) for k, c in enumerate((job.a, b))]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            try:
                self.assertEqual(errors, [])
                self.assertEqual(harness.status(job.psd.addr)["version"], 2 * steps)
                with open("/proc/%d/status" % job.psd.pid) as f:
                    hwm = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) // 1024
                model = TOTAL * 4 >> 20
                # the model, two receive buffers of a chunk, a few blocks
                # held by replies or waiting in the pool, and the program
                self.assertLess(hwm, model + 4 * 2 + 16 + 16 + 40,
                                "psd's peak memory %d MiB for a %d MiB model" % (hwm, model))
            finally:
                job.a.close()
                b.close()

    def test_psworker_trains_a_chunked_model(self):
        """psworker with a model over 2^20 parameters (mlp:1400, 1.1M): its
        pushes go as chunks back to back, its pulls two chunks in flight
        read straight into the parameters, psd applies them off the loop;
        in ASGD and BSP it trains and every step is counted."""
        for mode in ("asgd", "bsp"):
            with harness.Cluster("psd-bigmodel-psworker-" + mode) as cl:
                psd = cl.psd(mode=mode, workers=2,
                             args=["--set", "optimizer=adam", "--set", "lr=1e-3", "--set", "max_frame=64M"])
                ws = [cl.worker(psd, k, 2, epochs=2, batch=64, limit=1280, test_limit=1000, model="mlp:1400")
                      for k in range(2)]
                results = [w.result(120) for w in ws]
                for w, (rc, summary) in zip(ws, results):
                    self.assertEqual(rc, 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path)))
                    self.assertGreater(summary["test_accuracy"], 0.3, "%s: %r" % (mode, summary))
                # in asgd a worker whose 20 steps all came before the other's
                # joined (a loaded machine) evaluates the model of its own
                # steps alone (59% seen): the model of all 40 steps is held
                # to the bar, by the worker that evaluated last
                best = max(summary["test_accuracy"] for _, summary in results)
                self.assertGreater(best, 0.6, "%s: %r" % (mode, results))
                st = harness.status(psd.addr)
                self.assertEqual(st["parameters"], 784 * 1400 + 1400 + 1400 * 10 + 10)
                steps = 2 * 10  # 2 epochs of 640 samples at batch 64, per worker
                self.assertEqual(st["version"], steps if mode == "bsp" else 2 * steps, mode)
                psd.stop()

    def test_worker_gone_right_after_a_big_push(self):
        with harness.Cluster("psd-bigmodel-gone") as cl:
            job = Job(cl, self)
            g = grad(job.rng, BLK)
            job.a.send_frame({"t": T_PUSH, "id": 77, "base": 0, "off": 0, "data": g.tobytes(), "fin": True})
            job.a.close()
            job.w[:BLK] -= LR * g
            harness.wait_until(lambda: harness.status(job.psd.addr)["version"] == 1, 10, "the push applied")
            with job.join(1) as c:
                np.testing.assert_array_equal(job.pull_all(c), job.w, "the model after the worker left")
            self.assertTrue(job.psd.alive())


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
