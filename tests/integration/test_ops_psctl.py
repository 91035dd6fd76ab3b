#!/usr/bin/python3
"""test_ops_psctl.py - every psctl command against a real psd.

- pause / resume: workers started while psd is paused connect and wait
  (connected, not lost, even past heartbeat_timeout), then train to the end
  after resume; a raw worker's push sent while paused is applied at once
  and only its pull waits.
- set KEY=VALUE: run-time settings change (and show in status); unknown
  keys, settings that need a restart and malformed arguments are refused.
- checkpoint: returns once the checkpoint is in state_dir; refused without
  a state_dir.
- save PATH: a safetensors file readable with nothing but NumPy, whose
  tensors have the workers' names and shapes and equal a pull of the same
  version; for a model of more than 2^20 values, saved while pushes keep
  coming, every chunk belongs to the one version in the metadata.
- workers: one row per worker seen, with why it left; --json.
- every reading command of psctl's table answers, and its --json is JSON
  (or refused in one line where the output is a text format).
- shutdown: psd exits 0.
- exit codes and one-line messages: psd not running (3), a psd that never
  answers (4), unknown command (2), refused (1); an ADMIN message from a
  worker connection is FORBIDDEN.
"""

import json
import os
import socket
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths, read_safetensors  # noqa: E402

T_ADMIN = 17
HIDDEN = (32,)
MODEL = "mlp:32"


def pull_all(c, total, chunk=1 << 20):
    """The whole model through an admin RawClient; returns (version, array)."""
    parts, versions = [], set()
    for off in range(0, total, chunk):
        r = c.request({"t": harness.T_PULL, "off": off, "len": min(chunk, total - off)}, timeout=30)
        assert r["t"] == harness.T_PARAMS, r
        parts.append(np.frombuffer(r["data"], dtype="<f4"))
        versions.add(r["ver"])
    assert len(versions) == 1, versions
    return versions.pop(), np.concatenate(parts)


class PsctlTest(unittest.TestCase):
    def psctl_ok(self, addr, *args):
        r = harness.psctl(addr, *args)
        self.assertEqual(r.returncode, 0, "psctl %s: %s" % (" ".join(args), r.stderr))
        return r.stdout

    def psctl_fails(self, addr, rc, *args, mentions=()):
        r = harness.psctl(addr, *args)
        self.assertEqual(r.returncode, rc, "psctl %s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout,
                                                                         r.stderr))
        err = r.stderr.strip()
        self.assertEqual(len(err.splitlines()), 1, "one line on stderr, got:\n" + err)
        self.assertTrue(err.startswith("psctl: "), err)
        for m in mentions:
            self.assertIn(m, err)
        return err

    def test_pause_resume_checkpoint_save_shutdown(self):
        with harness.Cluster("psd-psctl") as cl:
            state = os.path.join(cl.dir, "state")
            os.mkdir(state)
            psd = cl.psd(mode="asgd", workers=2, args=["--state-dir", state, "--set", "heartbeat_timeout=1s",
                                                       "--set", "checkpoint_interval=0"])
            self.assertIn("paused", self.psctl_ok(psd.addr, "pause"))
            self.assertIn("already paused", self.psctl_ok(psd.addr, "pause"))
            workers = [cl.worker(psd, k, 2, epochs=2, limit=4000, test_limit=500, model=MODEL) for k in range(2)]

            def both_waiting():
                st = harness.status(psd.addr)
                ws = [w for w in st["workers"] if w["state"] == "connected"]
                return st if len(ws) == 2 and st["initialized"] else None

            st = harness.wait_until(both_waiting, 60, "both workers to connect while paused")
            self.assertTrue(st["paused"])
            self.assertEqual(st["version"], 0)
            time.sleep(2.5)  # past heartbeat_timeout (1 s): parked workers are waiting, not dead
            st = harness.status(psd.addr)
            self.assertEqual([w["state"] for w in st["workers"]], ["connected", "connected"], st["workers"])
            self.assertEqual((st["version"], st["pushes"]), (0, 0))
            samples, _ = harness.parse_prometheus(harness.metrics(psd.addr))
            self.assertEqual(harness.metric(samples, "psd_paused"), 1)
            self.assertTrue(all(w.alive() for w in workers))

            self.assertIn("resumed", self.psctl_ok(psd.addr, "resume"))
            for k, w in enumerate(workers):
                rc, summary = w.result(timeout=120)
                self.assertEqual(rc, 0, w.stderr())
                self.assertEqual(summary["epochs"], 2)
            st = harness.status(psd.addr)
            self.assertFalse(st["paused"])
            self.assertGreater(st["version"], 0)

            # workers: every worker seen, how its tensors and its table
            # requests travelled (shared memory: libpsclient's default on
            # psd's machine), why it left
            text = self.psctl_ok(psd.addr, "workers")
            self.assertRegex(text, r"(?m)^\s+SHARD\s+STATE\s+ADDRESS\s+VIA\s+TABLES\s")
            self.assertRegex(text, r"(?m)^\s+0/2\s+left\s+127\.0\.0\.1:\d+\s+shm\s+shm\s.*said bye$")
            self.assertRegex(text, r"(?m)^\s+1/2\s+left\s+127\.0\.0\.1:\d+\s+shm\s+shm\s.*said bye$")
            rows = json.loads(self.psctl_ok(psd.addr, "workers", "--json"))
            self.assertEqual([(w["shard"], w["state"], w["why"]) for w in rows],
                             [(0, "left", "said bye"), (1, "left", "said bye")])

            # checkpoint: written when psctl returns
            out = self.psctl_ok(psd.addr, "checkpoint")
            self.assertIn("checkpoint of version %d written" % st["version"], out)
            self.assertIn("ckpt-%020d.psdc" % st["version"], os.listdir(state))
            self.assertEqual(harness.status(psd.addr)["checkpoint_version"], st["version"])
            out = json.loads(self.psctl_ok(psd.addr, "checkpoint", "--json"))
            self.assertEqual((out["ok"], out["command"], out["version"]), (True, "checkpoint", st["version"]))

            # save: the model as safetensors, equal to a pull of the same version
            path = os.path.join(cl.dir, "model.safetensors")
            out = self.psctl_ok(psd.addr, "save", path)
            self.assertIn("saved model version %d" % st["version"], out)
            meta, tensors = read_safetensors(path)
            layout = harness.mlp_layout(HIDDEN)
            self.assertEqual([(n, list(t.shape)) for n, t in tensors.items()], [(n, d) for n, d in layout])
            self.assertEqual(meta["model_version"], str(st["version"]))
            self.assertEqual(meta["mode"], "asgd")
            self.assertEqual(int(meta["layout_fingerprint"], 16), harness.layout_fingerprint(layout))
            with harness.RawClient(psd.addr) as c:
                c.hello_admin()
                ver, flat = pull_all(c, harness.layout_size(layout))
            self.assertEqual(ver, st["version"])
            self.assertTrue(np.array_equal(np.concatenate([t.ravel() for t in tensors.values()]), flat))
            self.assertFalse(os.path.exists(path + ".tmp"))
            out = json.loads(self.psctl_ok(psd.addr, "save", path, "--json"))
            self.assertEqual((out["path"], out["version"], out["tensors"]), (path, st["version"], 4))
            # a directory that does not exist: a local error, exit 5
            self.psctl_fails(psd.addr, 5, "save", os.path.join(cl.dir, "no", "such", "dir", "m.safetensors"),
                             mentions=["no/such/dir"])

            # shutdown
            self.assertIn("shutting down", self.psctl_ok(psd.addr, "shutdown"))
            self.assertEqual(psd.wait(30), 0, psd.stderr())
            self.assertIn("shutdown asked for by admin", psd.stderr())
            self.psctl_fails(psd.addr, 3, "status", mentions=["is psd running"])

    def test_push_applied_while_paused(self):
        layout = [["w", [4]]]
        with harness.Cluster("psd-psctl-pause") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=["--set", "optimizer=sgd", "--set", "momentum=0",
                                                       "--set", "lr=0.5", "--set", "warmup_versions=0"])
            with harness.RawClient(psd.addr) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1)["t"], harness.T_WELCOME)
                self.assertEqual(w.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0] * 4)})["t"],
                                 harness.T_OK)
                self.psctl_ok(psd.addr, "pause")
                w.send_frame({"t": harness.T_PUSHPULL, "id": 50, "base": 0, "off": 0, "poff": 0, "plen": 4,
                              "data": harness.floats([1] * 4)})
                w.send_frame({"t": harness.T_HEARTBEAT, "id": 51})
                ok = w.recv_frame()
                self.assertEqual((ok["t"], ok["id"]), (harness.T_OK, 51), "the pull waits; the heartbeat does not")
                self.assertEqual(ok["ver"], 1, "the push was applied while paused")
                with self.assertRaises(socket.timeout):
                    w.recv_frame(timeout=0.5)
                self.psctl_ok(psd.addr, "resume")
                p = w.recv_frame()
                self.assertEqual((p["t"], p["id"], p["ver"]), (harness.T_PARAMS, 50, 1))
                self.assertEqual(list(np.frombuffer(p["data"], dtype="<f4")), [-0.5] * 4)
                # an ADMIN message from a worker connection is refused
                r = w.request({"t": T_ADMIN, "cmd": "pause"})
                harness.expect_error(self, r, harness.E_FORBIDDEN, "admin from a worker")
            with harness.RawClient(psd.addr) as a:
                a.hello_admin()
                harness.expect_error(self, a.request({"t": T_ADMIN, "cmd": "frobnicate"}), harness.E_BAD_FIELD,
                                     "unknown admin command")
                harness.expect_error(self, a.request({"t": T_ADMIN}), harness.E_BAD_FIELD, "admin without cmd")
                r = a.request({"t": T_ADMIN, "cmd": "set", "args": ["lr=0.25", "clip_norm=2"]})
                self.assertEqual(r["t"], harness.T_OK, r)
                self.assertEqual(r["text"], "lr: 0.5 -> 0.25, clip_norm: 0 -> 2")
            psd.stop()

    def test_every_reading_command_answers(self):
        """Every command psctl's table marks as reading (`psctl --help`
        lists it under Reading) answers a psd that holds a model and a
        worker: exit 0 and some output; with --json one JSON document, or,
        for a command whose output is a text format, the one-line usage
        error naming it. A new read-only command is run here by its row
        alone; what it prints is its own test's business."""
        reading, _ = harness.psctl_commands()
        self.assertLessEqual({"status", "workers", "metrics", "history"}, set(reading))
        layout = [["w", [4]]]
        with harness.Cluster("psd-psctl-reading") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            with harness.RawClient(psd.addr) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1)["t"], harness.T_WELCOME)
                self.assertEqual(w.request({"t": harness.T_INIT, "off": 0, "data": harness.floats([0] * 4)})["t"],
                                 harness.T_OK)
                for cmd in reading:
                    self.assertTrue(self.psctl_ok(psd.addr, cmd).strip(), "psctl %s printed nothing" % cmd)
                    r = harness.psctl(psd.addr, cmd, "--json")
                    if r.returncode == 2:
                        self.psctl_fails(psd.addr, 2, cmd, "--json", mentions=["--json does not apply to " + cmd])
                        continue
                    self.assertEqual(r.returncode, 0, "psctl %s --json: %s" % (cmd, r.stderr))
                    try:
                        json.loads(r.stdout)
                    except ValueError as e:
                        self.fail("psctl %s --json printed no JSON document (%s):\n%s" % (cmd, e, r.stdout[:400]))
            psd.stop()

    def test_set(self):
        with harness.Cluster("psd-psctl-set") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            self.assertEqual(self.psctl_ok(psd.addr, "set", "lr=0.01").strip(), "lr: 0.02 -> 0.01")
            self.assertEqual(harness.status(psd.addr)["lr"], 0.01)
            out = json.loads(self.psctl_ok(psd.addr, "set", "lr=0.01", "--json"))
            self.assertEqual(out["message"], "no change")
            self.psctl_ok(psd.addr, "set", "lr_schedule=step", "lr_gamma=0.5", "log_level=debug")
            st = harness.status(psd.addr)
            self.assertEqual(st["lr"], 0.01)
            self.assertIn("psctl set: lr_schedule: constant -> step", psd.stderr())
            self.psctl_fails(psd.addr, 1, "set", "lrr=0.1", mentions=["lrr", "did you mean 'lr'"])
            self.psctl_fails(psd.addr, 1, "set", "mode=bsp", mentions=["mode cannot change while psd runs",
                                                                         "restart"])
            self.psctl_fails(psd.addr, 1, "set", "lr=fast", mentions=["lr", "not a number"])
            self.psctl_fails(psd.addr, 1, "set", "lr=0.1", "momentum=2", mentions=["momentum"])
            self.assertEqual(harness.status(psd.addr)["lr"], 0.01, "all or nothing")
            self.psctl_fails(psd.addr, 2, "set", "lr", mentions=["KEY=VALUE"])
            self.psctl_fails(psd.addr, 2, "set", mentions=["set"])
            # without a state_dir there are no checkpoints; without a model nothing to save
            self.psctl_fails(psd.addr, 1, "checkpoint", mentions=["state-dir"])
            self.psctl_fails(psd.addr, 1, "save", os.path.join(cl.dir, "m.safetensors"), mentions=["no model"])
            psd.stop()

    def test_save_big_model_while_training(self):
        n = (1 << 20) + 123456  # two pulls of at most 2^20 values
        layout = [["big.weight", [n - 10]], ["big.bias", [10]]]
        with harness.Cluster("psd-psctl-save") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=["--set", "optimizer=sgd", "--set", "momentum=0",
                                                       "--set", "lr=0.001", "--set", "warmup_versions=0"])
            stop = threading.Event()
            pushes = [0]
            with harness.RawClient(psd.addr, timeout=30) as w:
                self.assertEqual(w.hello_worker(layout, 0, 1)["t"], harness.T_WELCOME)
                self.assertEqual(w.request({"t": harness.T_INIT, "off": 0,
                                            "data": harness.floats(np.zeros(n))})["t"], harness.T_OK)
                ones = harness.floats(np.ones(n))

                def pusher():
                    # every push subtracts lr*1 = 0.001 from every value
                    while not stop.is_set():
                        r = w.request({"t": harness.T_PUSH, "base": 0, "off": 0, "data": ones})
                        assert r["t"] == harness.T_OK, r
                        pushes[0] += 1

                t = threading.Thread(target=pusher)
                t.start()
                try:
                    harness.wait_until(lambda: pushes[0] >= 3, 60, "pushes to start")
                    path = os.path.join(cl.dir, "big.safetensors")
                    self.psctl_ok(psd.addr, "--timeout", "60000", "save", path)
                    seen = pushes[0]
                finally:
                    stop.set()
                    t.join(60)
            self.assertGreater(seen, 3)
            meta, tensors = read_safetensors(path)
            v = int(meta["model_version"])
            self.assertGreaterEqual(v, 3)
            flat = np.concatenate([tensors["big.weight"], tensors["big.bias"]])
            self.assertEqual(flat.shape, (n,))
            # all of one version: every value is -0.001 * v (float32 rounding aside)
            self.assertLess(float(np.max(np.abs(flat + 0.001 * v))), 2e-4,
                            "values from more than one version (metadata says %d): %s .. %s" %
                            (v, flat.min(), flat.max()))
            self.assertLess(float(flat.max() - flat.min()), 2e-4)
            psd.stop()

    def test_errors(self):
        addr = "127.0.0.1:%d" % harness.free_port()
        self.psctl_fails(addr, 3, "status", mentions=[addr, "is psd running"])
        self.psctl_fails(addr, 3, "pause", mentions=[addr])
        self.psctl_fails(addr, 2, "frobnicate", mentions=["unknown command 'frobnicate'", "save"])
        self.psctl_fails(addr, 2, "status", "extra", mentions=["status takes no arguments"])
        self.psctl_fails(addr, 2, "save", mentions=["save PATH"])
        # a psd that accepts but never answers: exit 4
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        try:
            silent = "127.0.0.1:%d" % s.getsockname()[1]
            r = harness.run([Paths.psctl, "--server", silent, "--timeout", "300", "status"], timeout=30)
            self.assertEqual(r.returncode, 4, r.stderr)
            self.assertIn("timed out", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        finally:
            s.close()
        r = harness.run([Paths.psctl, "--help"])
        self.assertEqual(r.returncode, 0)
        for word in ("status", "workers", "metrics", "set KEY=VALUE", "pause", "resume", "checkpoint", "save PATH",
                     "shutdown", "--json", "Exit codes"):
            self.assertIn(word, r.stdout)


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
