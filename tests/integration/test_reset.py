#!/usr/bin/python3
"""test_reset.py - `psctl reset`: start fresh without restarting psd.

- refused while a worker is connected, naming it, with the model unchanged;
- `--force`: the worker gets an error and exits non-zero, the checkpoints
  are set aside into a dated subfolder of the state dir (nothing deleted),
  the model is dropped, and the next worker initialises a new one;
- a BSP job's plan goes with the model: the next job's worker fixes its own;
- with nothing connected and no model it says there was none; --force with
  another command is a usage error;
- every ADMIN `checkpoint` gets exactly one answer whatever comes between
  (issue 32): a reset --force as soon as its file appears (it was left
  unanswered), a reset while it waits for a BSP round closing piece by
  piece (ERROR STATE), a shutdown while it waits (ERROR SHUTDOWN before the
  connection closes); an admin's parked pull gets ERROR STATE at a reset,
  and a pinned admin's pulls are bounded by the pinned version's size, not
  by the bigger model a reset let in (they read past the snapshot).
"""

import glob
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_RANGE, E_SHUTDOWN, E_STATE, T_ADMIN, T_ERROR, T_INIT, T_OK, T_PARAMS, T_PULL,  # noqa: E402
                     T_PUSH, RawClient, expect_error)

N, PIECE = 4096, 1024


def admin(addr):
    c = RawClient(addr, 10.0)
    r = c.hello_admin()
    assert r.get("t") == harness.T_WELCOME, r
    return c


def one_answer(test, c, id_, what):
    """c's answer to request id_, and no second frame after it."""
    r = c.recv_frame(10.0)
    test.assertEqual(r.get("id"), id_, "%s: %r" % (what, r))
    test.assertIn(r.get("t"), (T_OK, T_ERROR), "%s: %r" % (what, r))
    with test.assertRaises((socket.timeout, harness.Closed), msg=what + ": a second answer"):
        extra = c.recv_frame(0.3)
        raise AssertionError("%s: a second frame %r" % (what, extra))
    return r


class ResetTest(unittest.TestCase):
    def test_reset(self):
        with harness.Cluster("psd-reset") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, args=("--state-dir", state))
            w = cl.worker(psd, 0, 1, epochs=500, limit=3000, test_limit=200, model="mlp:32")
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 5, 60, "training to start")
            r = harness.psctl(psd.addr, "checkpoint")
            self.assertEqual(r.returncode, 0, r.stderr)
            ckpts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(state, "ckpt-*")))
            self.assertTrue(ckpts)

            r = harness.psctl(psd.addr, "reset")
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("reset refused: 1 worker is connected (shard 0/1)", r.stderr)
            self.assertIn("psctl reset --force", r.stderr)
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertGreaterEqual(st["version"], 5)
            self.assertTrue(w.alive())

            r = harness.psctl(psd.addr, "reset", "--force")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("dropped; %d checkpoint file" % len(ckpts), r.stdout)
            self.assertIn("the next worker to connect initialises the model", r.stdout)
            rc = w.wait(30)
            self.assertNotEqual(rc, 0, w.stderr())
            self.assertIn("the model was reset by an admin", w.stderr())
            st = harness.status(psd.addr)
            self.assertFalse(st["initialized"])
            self.assertEqual(st["version"], 0)
            self.assertEqual(st["parameters"], 0)
            self.assertEqual(st["workers"], [])
            self.assertIsNone(st["checkpoint_version"])
            # the checkpoints are set aside, not deleted
            self.assertEqual(glob.glob(os.path.join(state, "ckpt-*")), [])
            aside = glob.glob(os.path.join(state, "set-aside-*"))
            self.assertEqual(len(aside), 1)
            self.assertEqual(sorted(os.listdir(aside[0])), ckpts)

            # the next worker, of another layout even, initialises the model
            w2 = cl.worker(psd, 0, 1, epochs=1, limit=500, test_limit=100, model="mlp:16")
            rc, summary = w2.result(120)
            self.assertEqual(rc, 0, w2.stderr())
            st = harness.status(psd.addr)
            self.assertTrue(st["initialized"])
            self.assertEqual(st["parameters"], 784 * 16 + 16 + 16 * 10 + 10)
            psd.stop()
            log = psd.stderr()
            self.assertEqual(log.count("model initialised by shard 0"), 2, log)
            self.assertIn("reset by admin", log)

    def test_checkpoint_answered_across_reset(self):
        """Issue 32's race: a checkpoint of 2^20 values; a reset --force as
        soon as its file appears (refused while it is still being written,
        so tried again at once); the checkpoint's admin gets its answer."""
        n = 1 << 20
        with harness.Cluster("psd-reset-ckpt") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1,
                          args=("--state-dir", state, "--set", "checkpoint_interval=1h"))
            for run in range(3):
                w = RawClient(psd.addr, 10.0)
                r = w.hello_worker([["w", [n]]], 0, 1)
                self.assertTrue(r.get("init"), r)
                self.assertEqual(w.request({"t": T_INIT, "off": 0, "fin": True, "data": bytes(4 * n)}).get("t"),
                                 T_OK)
                self.assertEqual(w.request({"t": T_PUSH, "base": 0, "off": 0, "fin": True,
                                            "data": bytes(4 * n)}).get("t"), T_OK)
                a, b = admin(psd.addr), admin(psd.addr)
                a.send_frame({"t": T_ADMIN, "id": 7, "cmd": "checkpoint"})
                harness.wait_until(lambda: glob.glob(os.path.join(state, "ckpt-*.psdc")), 30,
                                   "run %d: the checkpoint file" % run, interval=0.001)
                harness.wait_until(
                    lambda: b.request({"t": T_ADMIN, "cmd": "reset", "args": ["force"]}).get("t") == T_OK, 30,
                    "run %d: the reset" % run, interval=0.001)
                r = one_answer(self, a, 7, "run %d: the checkpoint's answer" % run)
                if r.get("t") == T_OK:
                    self.assertIn("checkpoint of version 1 written", r.get("text"), r)
                else:
                    expect_error(self, r, E_STATE, "run %d" % run)
                    self.assertIn("the model was reset by admin", r.get("text"), r)
                for c in (a, b, w):
                    c.close()
            psd.stop()

    def mid_round(self, cl, name, state):
        """A BSP psd whose round 0 has closed piece 0 of 4 only: a
        checkpoint waits for the round to close."""
        psd = cl.psd(name=name, mode="bsp", workers=2,
                     args=("--state-dir", state, "--set", "bsp_piece=%d" % PIECE, "--set",
                           "checkpoint_interval=1h"))
        ws = [RawClient(psd.addr, 10.0) for _ in range(2)]
        for k, w in enumerate(ws):
            self.assertEqual(w.hello_worker([["w", [N]]], k, 2).get("piece"), PIECE)
        self.assertEqual(ws[0].request({"t": T_INIT, "off": 0, "fin": True, "data": bytes(4 * N)}).get("t"), T_OK)
        ones = b"\x00\x00\x80\x3f"
        self.assertEqual(ws[0].request({"t": T_PUSH, "base": 0, "off": 0, "fin": True, "data": ones * N}).get("t"),
                         T_OK)
        self.assertEqual(ws[1].request({"t": T_PUSH, "base": 0, "off": 0, "fin": False,
                                        "data": ones * PIECE}).get("t"), T_OK)
        return psd, ws

    def test_checkpoint_waiting_then_reset(self):
        with harness.Cluster("psd-reset-ckpt-wait") as cl:
            state = os.path.join(cl.dir, "state")
            psd, ws = self.mid_round(cl, "psd", state)
            a = admin(psd.addr)
            a.send_frame({"t": T_ADMIN, "id": 3, "cmd": "checkpoint"})
            with self.assertRaises(socket.timeout, msg="the checkpoint waits for the round"):
                a.recv_frame(0.6)  # a few of psd's ticks: it tries, and waits
            with admin(psd.addr) as b:
                r = b.request({"t": T_ADMIN, "cmd": "reset", "args": ["force"]})
                self.assertEqual(r.get("t"), T_OK, r)
            r = one_answer(self, a, 3, "the waiting checkpoint")
            expect_error(self, r, E_STATE, "checkpoint across a reset")
            self.assertIn("checkpoint of version 0 not written: the model was reset by admin", r["text"])
            for c in [a] + ws:
                c.close()
            psd.stop()

    def test_admin_pulls_across_reset(self):
        with harness.Cluster("psd-reset-pulls") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            w = RawClient(psd.addr, 10.0)
            self.assertTrue(w.hello_worker([["w", [N]]], 0, 1).get("init"))
            self.assertEqual(w.request({"t": T_INIT, "off": 0, "fin": True, "data": bytes(4 * N)}).get("t"), T_OK)
            pinned, waiting = admin(psd.addr), admin(psd.addr)
            self.assertEqual(pinned.request({"t": T_ADMIN, "cmd": "pin"}).get("t"), T_OK)
            waiting.send_frame({"t": T_PULL, "id": 9, "off": 0, "len": N, "min": 1000})
            with admin(psd.addr) as b:
                self.assertEqual(b.request({"t": T_ADMIN, "cmd": "reset", "args": ["force"]}).get("t"), T_OK)
            r = one_answer(self, waiting, 9, "the parked pull")
            expect_error(self, r, E_STATE, "parked pull across a reset")
            self.assertIn("the model was reset", r["text"])
            # a model of 3 blocks of psd's (2^20 values each) where one was
            big = 3 << 20
            w.close()
            w = RawClient(psd.addr, 30.0)
            self.assertTrue(w.hello_worker([["w", [big]]], 0, 1).get("init"))
            for off in range(0, big, 1 << 18):
                r = w.request({"t": T_INIT, "off": off, "fin": off + (1 << 18) == big, "data": bytes(4 << 18)})
                self.assertEqual(r.get("t"), T_OK, r)
            r = pinned.request({"t": T_PULL, "off": (1 << 20) + 8, "len": 16})
            expect_error(self, r, E_RANGE, "pinned pull past the pinned version")
            self.assertIn("outside the pinned version's %d parameters" % N, r["text"])
            r = pinned.request({"t": T_PULL, "off": 0, "len": N})
            self.assertEqual((r.get("t"), r.get("ver"), len(r.get("data", b""))), (T_PARAMS, 0, 4 * N), r.get("text"))
            self.assertEqual(pinned.request({"t": T_ADMIN, "cmd": "unpin"}).get("t"), T_OK)
            r = pinned.request({"t": T_PULL, "off": (1 << 20) + 8, "len": 16})
            self.assertEqual((r.get("t"), len(r.get("data", b""))), (T_PARAMS, 64), r.get("text"))
            for c in (pinned, waiting, w):
                c.close()
            psd.stop()

    def test_checkpoint_waiting_then_shutdown(self):
        with harness.Cluster("psd-shutdown-ckpt-wait") as cl:
            state = os.path.join(cl.dir, "state")
            psd, ws = self.mid_round(cl, "psd", state)
            a = admin(psd.addr)
            a.send_frame({"t": T_ADMIN, "id": 4, "cmd": "checkpoint"})
            with self.assertRaises(socket.timeout, msg="the checkpoint waits for the round"):
                a.recv_frame(0.6)
            r = harness.psctl(psd.addr, "shutdown")
            self.assertEqual(r.returncode, 0, r.stderr)
            r = one_answer(self, a, 4, "the waiting checkpoint at shutdown")
            expect_error(self, r, E_SHUTDOWN, "checkpoint at shutdown")
            self.assertIn("psd is shutting down", r["text"])
            for c in [a] + ws:
                c.close()
            self.assertEqual(psd.wait(30), 0, psd.stderr())

    def test_reset_drops_the_plan(self):
        """A BSP job by psd's plan, reset with --force: the plan goes with
        the model, and the next job's first worker fixes its own."""
        with harness.Cluster("psd-reset-plan") as cl:
            psd = cl.psd(mode="bsp", workers=1)
            w = cl.worker(psd, 0, 1, epochs=500, limit=3000, test_limit=200, model="mlp:32")
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 5, 60, "training to start")
            self.assertEqual(harness.status(psd.addr)["plan"]["samples"], 3000)
            r = harness.psctl(psd.addr, "reset", "--force")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotEqual(w.wait(30), 0)
            self.assertIsNone(harness.status(psd.addr)["plan"])
            w2 = cl.worker(psd, 0, 1, epochs=2, limit=500, test_limit=100, model="mlp:16")
            rc, summary = w2.result(120)
            self.assertEqual(rc, 0, w2.stderr())
            plan = harness.status(psd.addr)["plan"]
            self.assertEqual((plan["epochs"], plan["samples"], plan["done"]), (2, 500, True), plan)
            self.assertEqual(summary["version"], plan["rounds"])
            psd.stop()

    def test_nothing_to_drop(self):
        with harness.Cluster("psd-reset-empty") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            r = harness.psctl(psd.addr, "reset")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("no model to drop; the next worker to connect initialises the model", r.stdout)
            r = harness.psctl(psd.addr, "status", "--force")
            self.assertEqual(r.returncode, 2)
            self.assertIn("--force applies to reset only", r.stderr)
            r = harness.run([harness.Paths.psctl, "--help"])
            self.assertIn("reset", r.stdout)
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
