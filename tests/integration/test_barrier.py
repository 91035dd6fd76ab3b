#!/usr/bin/python3
"""test_barrier.py - BARRIER (proto/PROTOCOL.md, section 5).

Raw workers, written from the protocol with Python's msgpack:

- BSP: a BARRIER waits until every worker taking part (every connection
  that has sent one) has sent one for the same version or a later one; the
  first one to take part waits for nobody; a worker that never sends one
  is not waited for; a barrier for a later
  version waits while one for an earlier one goes.
- A worker that goes away (its connection closed, or BYE) stops holding
  the others back; a worker that comes back takes part from its own first
  BARRIER on.
- ver 0 withdraws (a worker whose parts are out of step): answered at
  once, and the others no longer wait for it until its next BARRIER.
- Mistakes cost only themselves: a second BARRIER while one waits (STATE,
  the first still answered), a missing ver (BAD_FIELD), an admin's
  (FORBIDDEN), a ver above the model's version plus one (BAD_FIELD, not
  parked).
- A connection stands at its latest BARRIER, not the highest it sent: a
  worker that goes back from 20 to 14 is released when the others reach
  14 (issue 32: it waited for ever).
- With backup_workers = b, a barrier does not wait for the slowest b.
- A HEARTBEAT with wait, while a BARRIER waits, is told whom it waits for.
- ASGD and SSP answer at once.

psworker over a model split on 2 psd in BSP (libpsclient 1.4): with
--barrier on every step ends at a BARRIER on the first psd
(psd_barriers_total = workers x steps there, 0 on the second), none with
--barrier off, nor with auto (the default) when every psd is on this
machine, and the job trains the same either way (the same final version,
both workers exit 0).
"""

import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_BAD_FIELD, E_FORBIDDEN, E_STATE, T_BARRIER, T_BYE, T_HEARTBEAT, T_INIT, T_OK,  # noqa: E402
                     T_PARAMS, T_PULL, T_PUSH, RawClient, expect_error)

LAYOUT = [["w", [1024]]]
QUIET = 0.4  # seconds in which a parked BARRIER must not be answered


def hello(addr, shard, nshards):
    c = RawClient(addr, 10.0)
    r = c.hello_worker(LAYOUT, shard, nshards)
    if r.get("t") != harness.T_WELCOME:
        raise AssertionError("hello answered with %r" % (r,))
    return c


def barrier(c, ver, id_):
    c.send_frame({"t": T_BARRIER, "id": id_, "ver": ver})


def rounds(ws, n):
    """ws[0] initialises the model and the BSP workers ws (all of the job)
    push n rounds of zeros: the model is then at version n, so barriers up
    to n + 1 are ones psd takes."""
    size = LAYOUT[0][1][0]
    r = ws[0].request({"t": T_INIT, "off": 0, "fin": True, "data": bytes(4 * size)})
    assert r.get("t") == T_OK, r
    for v in range(n):
        for w in ws:
            r = w.request({"t": T_PUSH, "base": v, "off": 0, "fin": True, "data": bytes(4 * size)})
            assert r.get("t") == T_OK, r
        r = ws[0].request({"t": T_PULL, "off": 0, "len": size, "min": v + 1})
        assert (r.get("t"), r.get("ver")) == (T_PARAMS, v + 1), r


class BarrierTest(unittest.TestCase):
    def ok(self, c, id_, what):
        r = c.recv_frame(10.0)
        self.assertEqual(r.get("t"), T_OK, "%s: %r" % (what, r))
        self.assertEqual(r.get("id"), id_, what)
        self.assertIn("ver", r, what)

    def quiet(self, c, what):
        with self.assertRaises(socket.timeout, msg="%s: answered too early" % what):
            r = c.recv_frame(QUIET)
            raise AssertionError("%s: got %r" % (what, r))

    def meet(self, first, id1, second, id2, ver, what, notice=None):
        """first's barrier for ver waits until second's comes; then both go.
        notice: what a HEARTBEAT with wait is told meanwhile."""
        barrier(first, ver, id1)
        self.quiet(first, what + ": alone")
        if notice:
            r = first.request({"t": T_HEARTBEAT, "wait": True})
            self.assertEqual((r.get("t"), r.get("wait")), (T_OK, True), r)
            self.assertEqual(r.get("text"), notice)
        barrier(second, ver, id2)
        self.ok(second, id2, what)
        self.ok(first, id1, what)

    def test_bsp_barrier(self):
        with harness.Cluster("test-barrier") as cl:
            psd = cl.psd(mode="bsp", workers=3)
            a, b, c = (hello(psd.addr, k, 3) for k in range(3))
            rounds((a, b, c), 20)
            # the first to take part waits for nobody; c never sends a
            # BARRIER, so it is not waited for
            r = a.request({"t": T_BARRIER, "ver": 1, "id": 100})
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 100), "a alone taking part")
            r = b.request({"t": T_BARRIER, "ver": 1, "id": 100})
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 100), "b like a")
            self.meet(a, 1, b, 1, 5, "a waits for b at 5",
                      notice="barrier at version 5 waits for shard 1/3 (at version 1)")
            # a later version waits while an earlier one goes
            barrier(b, 7, 2)
            barrier(a, 6, 2)
            self.ok(a, 2, "a's 6: b is at 7")
            self.quiet(b, "b's 7 with a at 6")
            barrier(a, 7, 3)
            got = {}
            for who, conn in (("a", a), ("b", b)):
                r = conn.recv_frame(10.0)
                got[who] = (r.get("t"), r.get("id"))
            self.assertEqual(got, {"a": (T_OK, 3), "b": (T_OK, 2)})
            # a second one while one waits: STATE, and the first still goes
            barrier(a, 8, 4)
            self.quiet(a, "a's 8 with b at 7")
            barrier(a, 9, 5)
            expect_error(self, a.recv_frame(10.0), E_STATE, "second barrier")
            # b goes away: a's barrier no longer waits for it
            b.close()
            self.ok(a, 4, "a released when b's connection closed")
            # b's shard back: it takes part from its own first barrier on
            b2 = hello(psd.addr, 1, 3)
            barrier(a, 9, 6)
            self.ok(a, 6, "a alone taking part")
            barrier(b2, 9, 1)
            self.ok(b2, 1, "b2 at 9 like a")
            barrier(b2, 10, 2)
            self.quiet(b2, "b2's 10 with a at 9")
            # ver 0: "do not wait for me" (a worker whose parts are out of step)
            r = a.request({"t": T_BARRIER, "ver": 0, "id": 7})
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 7), "a withdraws")
            self.ok(b2, 2, "b2 released when a withdrew")
            barrier(b2, 11, 3)
            self.ok(b2, 3, "b2 alone taking part")
            self.meet(a, 8, b2, 4, 12, "a back, waits for b2 at 12")
            barrier(b2, 13, 5)
            a.send_frame({"t": T_BYE, "id": 9})
            self.ok(a, 9, "a's bye")
            self.ok(b2, 5, "b2 released when a said bye")
            # mistakes cost only themselves
            expect_error(self, b2.request({"t": T_BARRIER}), E_BAD_FIELD, "no ver")
            with RawClient(psd.addr, 10.0) as adm:
                adm.hello_admin()
                expect_error(self, adm.request({"t": T_BARRIER, "ver": 1}), E_FORBIDDEN, "admin's barrier")
            for ver in (22, 2**64 - 1):
                r = b2.request({"t": T_BARRIER, "ver": ver})
                expect_error(self, r, E_BAD_FIELD, "ver %d with the model at 20" % ver)
                self.assertIn("model is at version 20", r.get("text", ""), r)
            r = b2.request({"t": T_BARRIER, "ver": 14})
            self.assertEqual(r.get("t"), T_OK, "b2 alone after the mistakes: %r" % (r,))
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_barriers_total"), 17)
            for conn in (b2, c):
                conn.close()
            psd.stop()

    def test_latest_barrier_counts(self):
        """Issue 32's sequence: a worker's barrier is its latest request."""
        with harness.Cluster("test-barrier-latest") as cl:
            psd = cl.psd(mode="bsp", workers=2)
            a, b = hello(psd.addr, 0, 2), hello(psd.addr, 1, 2)
            rounds((a, b), 20)
            # a version no reply can have carried is refused, not parked
            r = a.request({"t": T_BARRIER, "ver": 2**64 - 1, "id": 1})
            expect_error(self, r, E_BAD_FIELD, "ver 2^64-1")
            self.assertIn("barrier for version 18446744073709551615", r.get("text", ""), r)
            r = a.request({"t": T_BARRIER, "ver": 21, "id": 2})  # the model's plus one: taken
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 2), "a alone taking part at 21")
            r = b.request({"t": T_BARRIER, "ver": 0, "id": 3})
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 3), "b withdraws")
            r = b.request({"t": T_BARRIER, "ver": 13, "id": 4})
            self.assertEqual((r.get("t"), r.get("id")), (T_OK, 4), "b's 13: a is at 21")
            barrier(a, 14, 5)  # a goes back from 21 to 14
            self.quiet(a, "a's 14 with b at 13")
            barrier(b, 14, 6)
            self.ok(b, 6, "b's 14")
            self.ok(a, 5, "a's 14 once b is at 14")
            a.close()
            b.close()
            psd.stop()

    def test_backup_workers(self):
        # a BSP round does not wait for the slowest backup_workers: nor
        # does a barrier
        with harness.Cluster("test-barrier-backup") as cl:
            psd = cl.psd(mode="bsp", workers=3, args=["--set", "backup_workers=1"])
            ws = [hello(psd.addr, k, 3) for k in range(3)]
            rounds(ws[:2], 1)  # two of three close a round
            for w in ws:
                r = w.request({"t": T_BARRIER, "ver": 1})
                self.assertEqual(r.get("t"), T_OK, r)
            barrier(ws[0], 2, 10)
            self.quiet(ws[0], "two behind")
            barrier(ws[1], 2, 10)
            self.ok(ws[0], 10, "one behind: a backup worker")
            self.ok(ws[1], 10, "one behind: a backup worker")
            barrier(ws[2], 2, 10)
            self.ok(ws[2], 10, "none behind")
            for w in ws:
                w.close()
            psd.stop()

    def test_asgd_ssp_answer_at_once(self):
        with harness.Cluster("test-barrier-asgd") as cl:
            for mode in ("asgd", "ssp"):
                psd = cl.psd(mode=mode, workers=2, name="psd-" + mode)
                a = hello(psd.addr, 0, 2)
                b = hello(psd.addr, 1, 2)  # connected, never sends one
                for ver in (1, 1):
                    r = a.request({"t": T_BARRIER, "ver": ver})
                    self.assertEqual(r.get("t"), T_OK, "%s: %r" % (mode, r))
                # the model is at version 0: no reply can have said 2
                expect_error(self, a.request({"t": T_BARRIER, "ver": 2}), E_BAD_FIELD, mode + " ver 2")
                a.close()
                b.close()
                psd.stop()

    def test_psworker_split(self):
        versions = {}
        for flag in ("on", "off", "auto"):
            with harness.Cluster("test-barrier-split") as cl:
                psds = [cl.psd(mode="bsp", workers=2, name="psd%d" % i) for i in range(2)]
                ws = [cl.worker(psds, k, 2, epochs=1, limit=2000, test_limit=500, model="mlp:64",
                                args=["--barrier", flag, "--shm", "off", "--seed", "3"]) for k in range(2)]
                steps = harness.finish(self, ws)[0]["version"]
                self.assertEqual(steps, harness.steps_per_epoch(2000, 2, 64, True))
                versions[flag] = steps
                counts = []
                for p in psds:
                    samples, _ = harness.parse_prometheus(harness.metrics(p.addr))
                    counts.append(harness.metric(samples, "psd_barriers_total"))
                # auto: every psd here is on this machine, so no barrier
                self.assertEqual(counts, [2 * steps, 0] if flag == "on" else [0, 0], "--barrier %s" % flag)
                for p in psds:
                    p.stop()
        self.assertEqual(versions["on"], versions["off"])
        self.assertEqual(versions["on"], versions["auto"])


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
