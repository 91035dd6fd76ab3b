#!/usr/bin/python3
"""test_ckpt_end.py - a finished job's model is never lost: psd writes a
checkpoint as soon as the work stops, not only on its timer.

    test_ckpt_end.py [harness options] [unittest options]

Each test runs with the default checkpoint_interval (30 s), longer than
the job, so the timer never fires:

- Three BSP workers train and leave. psd writes a checkpoint when the last
  one has gone; killed with kill -9 and started again on the same state
  dir, it starts at the final model version, and `psctl save` gives the
  same bytes as one taken before the kill.
- The same with `psctl pause` instead of the workers leaving (the pushes
  that were under way when the pause came are in the checkpoint too); a
  `psctl set` of the learning rate before it is preceded by a checkpoint.
- Without a state dir, psd says once, when the last worker leaves, that the
  model exists only in memory and how to keep it.
- `psctl status` shows the newest checkpoint's version and age beside the
  model's version.
- A push applied before a checkpoint, sent again (its push id kept) to the
  psd restarted from it, is answered and not applied twice.
- The ckpt-N.psdc.tmp files a kill -9 during a write leaves are removed at
  start, each with a log line.
"""

import os
import re
import signal
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MODEL = "mlp:64"
LIMIT = 6000


def saved(addr, path):
    r = harness.psctl(addr, "save", path, timeout=60)
    if r.returncode != 0:
        raise AssertionError("psctl save failed (%d): %s" % (r.returncode, r.stderr))
    return harness.read_safetensors(path)[1]


def same_tensors(test, a, b):
    """Bit for bit: the same names, shapes and float32 bytes."""
    test.assertEqual(sorted(a), sorted(b))
    for name in a:
        test.assertEqual(a[name].shape, b[name].shape, "shape of %s" % name)
        test.assertEqual(a[name].tobytes(), b[name].tobytes(), "values of %s differ" % name)


class CheckpointAtEndTest(unittest.TestCase):
    def checkpointed(self, addr, timeout=20):
        """Waits until psd's newest checkpoint holds its model version; returns that version."""
        def caught_up():
            st = harness.status(addr)
            return st["version"] if st.get("checkpoint_version") == st["version"] else None
        return harness.wait_until(caught_up, timeout, "a checkpoint of the model's version")

    def restart_and_compare(self, cl, psd, args, state, before, version):
        os.kill(psd.pid, signal.SIGKILL)
        psd.wait(10)
        psd2 = cl.psd(mode="bsp", workers=3, args=args, name="psd2")
        m = harness.wait_until(lambda: re.search(r"loaded checkpoint \S+: model version (\d+)", psd2.stderr()),
                               10, "psd to report the checkpoint it loaded")
        self.assertEqual(int(m.group(1)), version)
        self.assertEqual(harness.status(psd2.addr)["version"], version)
        after = saved(psd2.addr, os.path.join(cl.dir, "after.safetensors"))
        same_tensors(self, before, after)
        psd2.stop()

    def test_last_worker_leaves(self):
        with harness.Cluster("psd-ckpt-end") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--state-dir", state]
            psd = cl.psd(mode="bsp", workers=3, args=args)
            ws = [cl.worker(psd, k, 3, epochs=2, limit=LIMIT, model=MODEL, evaluate=False) for k in range(3)]
            for w in ws:
                rc, summary = w.result(120)
                self.assertEqual(rc, 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path)))
            st = harness.status(psd.addr)
            self.assertGreater(st["version"], 50)
            version = self.checkpointed(psd.addr)
            self.assertRegex(psd.stderr(), r"checkpoint .*the last worker left")
            r = harness.psctl(psd.addr, "status")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"model version %d \(checkpoint: version %d, [0-9.]+ s ago\)" %
                             (version, version))
            before = saved(psd.addr, os.path.join(cl.dir, "before.safetensors"))
            self.restart_and_compare(cl, psd, args, state, before, version)

    def test_pause(self):
        with harness.Cluster("psd-ckpt-pause") as cl:
            state = os.path.join(cl.dir, "state")
            args = ["--state-dir", state]
            psd = cl.psd(mode="bsp", workers=3, args=args)
            ws = [cl.worker(psd, k, 3, epochs=200, limit=LIMIT, model=MODEL, evaluate=False) for k in range(3)]
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 50, 60, "50 rounds")
            # a change of the optimizer's settings is preceded by a checkpoint
            r = harness.psctl(psd.addr, "set", "lr=0.0123")
            self.assertEqual(r.returncode, 0, r.stderr)
            harness.wait_until(lambda: re.search(r"checkpoint of version \d+: before psctl set changes the "
                                                 r"optimizer's settings", psd.stderr()), 10,
                               "a checkpoint before the lr changes")
            r = harness.psctl(psd.addr, "pause")
            self.assertEqual(r.returncode, 0, r.stderr)
            version = self.checkpointed(psd.addr)
            self.assertTrue(all(w.alive() for w in ws), "the job ended before the pause")
            self.assertRegex(psd.stderr(), r"checkpoint .*paused")
            before = saved(psd.addr, os.path.join(cl.dir, "before.safetensors"))
            self.assertEqual(harness.status(psd.addr)["version"], version, "no round closes while paused")
            for w in ws:
                w.kill()
            self.restart_and_compare(cl, psd, args, state, before, version)

    def test_push_ids_survive_a_restart(self):
        """A push applied and checkpointed whose answer was lost is sent
        again, with its push id, to the psd restarted from that checkpoint:
        psd answers it and applies nothing (the checkpoint keeps each
        client's highest push id applied), and applies the client's next
        push."""
        layout = [["w", [4]]]
        args = ["--set", "optimizer=sgd", "--set", "momentum=0", "--set", "lr=0.5", "--set", "warmup_versions=0"]
        cid = 0x5EED0000C0FFEE

        def push(w, pid):
            return w.request({"t": harness.T_PUSH, "base": 0, "off": 0, "pid": pid, "data": harness.floats([1] * 4)})

        def values(addr):
            with harness.RawClient(addr) as a:
                a.hello_admin()
                r = a.request({"t": harness.T_PULL, "off": 0, "len": 4})
                self.assertEqual(r["t"], harness.T_PARAMS, r)
                return r["ver"], list(np.frombuffer(r["data"], dtype="<f4"))

        with harness.Cluster("psd-ckpt-pushids") as cl:
            state = os.path.join(cl.dir, "state")
            psd = cl.psd(mode="asgd", workers=1, args=["--state-dir", state] + args)
            with harness.RawClient(psd.addr) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1, cid=cid)["t"], harness.T_WELCOME)
                self.assertEqual(w.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0] * 4)})["t"],
                                 harness.T_OK)
                for pid in (1, 2):
                    self.assertEqual(push(w, pid)["t"], harness.T_OK)
                self.assertEqual(push(w, 2)["t"], harness.T_OK, "a push sent again is answered")
                self.assertEqual(values(psd.addr), (2, [-1.0] * 4), "and not applied again")
                r = harness.psctl(psd.addr, "checkpoint")
                self.assertEqual(r.returncode, 0, r.stderr)
            os.kill(psd.pid, signal.SIGKILL)
            psd.wait(10)
            psd2 = cl.psd(mode="asgd", workers=1, args=["--state-dir", state] + args, name="psd2")
            harness.wait_until(lambda: "loaded checkpoint" in psd2.stderr(), 10, "psd to load its checkpoint")
            with harness.RawClient(psd2.addr) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1, cid=cid)["t"], harness.T_WELCOME)
                for pid in (1, 2):
                    self.assertEqual(push(w, pid)["t"], harness.T_OK, "push %d sent again" % pid)
                self.assertEqual(values(psd2.addr), (2, [-1.0] * 4), "pushes 1 and 2 applied once, before the kill")
                self.assertEqual(push(w, 3)["t"], harness.T_OK)
                self.assertEqual(values(psd2.addr), (3, [-1.5] * 4), "push 3 is new")
            # another client's push with the same numbers is its own
            with harness.RawClient(psd2.addr) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1, cid=cid + 1)["t"], harness.T_WELCOME)
                self.assertEqual(push(w, 2)["t"], harness.T_OK)
                self.assertEqual(values(psd2.addr)[0], 4)
            psd2.stop()

    def test_no_state_dir_says_so_once(self):
        with harness.Cluster("psd-ckpt-none") as cl:
            psd = cl.psd(mode="asgd", workers=2, args=harness.ASGD_ARGS)
            for round_ in range(2):
                ws = [cl.worker(psd, k, 2, epochs=1, limit=2000, model=MODEL, evaluate=False) for k in range(2)]
                for w in ws:
                    rc, _ = w.result(120)
                    self.assertEqual(rc, 0, "%s failed:\n%s" % (w.name, harness.tail(w.err_path)))
                harness.wait_until(lambda: all(w["state"] != "connected" for w in harness.status(psd.addr)["workers"]),
                                   10, "psd to see both workers leave")
                harness.wait_until(lambda: "exists only in memory" in psd.stderr(), 10,
                                   "psd to say the model exists only in memory")
            log = psd.stderr()
            self.assertEqual(log.count("exists only in memory"), 1, log)
            self.assertRegex(log, r"exists only in memory.*psctl save.*state.dir")
            r = harness.psctl(psd.addr, "status")
            self.assertRegex(r.stdout, r"model version \d+ \(no checkpoints: no state dir\)")
            psd.stop()

    def test_interrupted_writes_are_removed_at_start(self):
        """What a kill -9 during a checkpoint write leaves (ckpt-N.psdc.tmp)
        is removed when psd starts on that state dir, with a log line per
        file; files that are not psd's own stay (issue 15, 9)."""
        with harness.Cluster("psd-ckpt-tmp") as cl:
            state = os.path.join(cl.dir, "state")
            os.mkdir(state)
            left = ["ckpt-%020d.psdc.tmp" % v for v in (7, 12, 13)]
            for name in left:
                with open(os.path.join(state, name), "wb") as f:
                    f.write(b"PSDC" + b"\0" * 4096)
            keep = ["notes.tmp", "ckpt-12.psdc.tmp", "ckpt-%020d.psdc.tmp.old" % 5]
            for name in keep:
                with open(os.path.join(state, name), "wb") as f:
                    f.write(b"x")
            psd = cl.psd(mode="asgd", workers=1, args=["--state-dir", state] + list(harness.ASGD_ARGS))
            for name in left:
                harness.wait_until(lambda: re.search(r"removed \S*%s \(4100 bytes\): a checkpoint whose writing "
                                                     r"was interrupted" % re.escape(name), psd.stderr()),
                                   10, "psd to log the removal of %s" % name)
            self.assertEqual(sorted(os.listdir(state)), sorted(keep))
            self.assertIn("version", harness.status(psd.addr))
            psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
