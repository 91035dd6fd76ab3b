#!/usr/bin/python3
"""ckpt_stall.py - pull latency while psd checkpoints a large table.

Fills an embedding table in one psd (asgd, AdaGrad, dim 128: 257 floats and
a key a row, about 1 KiB) to --gb gigabytes by pushes, then, in one run:
  1. pulls of --keys random keys for --seconds, no checkpoint: p50/p99/max;
  2. `psctl checkpoint`, and the same pulls while its file is written:
     p50/p99/max, how many pulls, how long the checkpoint took.
psd's RSS before, and the checkpoint file's size, are printed too. The
psd, its state dir and the file are removed at the end.

  /usr/bin/python3 bench/ckpt_stall.py --gb 2
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402
from harness import T_INIT, T_OK, T_ROWS, T_TABLE, T_TPULL, T_TPUSH, RawClient  # noqa: E402

DIM = 128
ROW_BYTES = 8 + 4 * (2 * DIM + 1)


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0, help="table size in GB (10^9 bytes) of rows (default 2)")
    ap.add_argument("--keys", type=int, default=256, help="keys a pull asks for (default 256)")
    ap.add_argument("--seconds", type=float, default=5.0, help="the pulls without a checkpoint (default 5)")
    args = ap.parse_args()
    nrows = int(args.gb * 1e9 / ROW_BYTES)
    tmp = tempfile.mkdtemp(prefix="ckpt-stall-")
    state = os.path.join(tmp, "state")
    psd = None
    try:
        # no timed checkpoint: the one measured is the only one
        psd = harness.Psd(tmp, mode="asgd", workers=1, args=["--state-dir", state, "--set", "heartbeat_timeout=10m",
                                                              "--set", "checkpoint_interval=0"])
        w = RawClient(psd.addr, 120.0)
        r = w.hello_worker([["w", [4]]], 0, 1)
        assert r.get("t") == harness.T_WELCOME, r
        if r.get("init"):
            assert w.request({"t": T_INIT, "off": 0, "data": np.zeros(4, "<f4").tobytes()}).get("t") == T_OK
        r = w.request({"t": T_TABLE, "tab": "emb", "dim": DIM, "rinit": "uniform", "scale": 0.05, "seed": 1,
                       "opt": "adagrad", "hp": {"lr": 0.05}})
        assert r.get("t") == T_OK, r
        batch = 16384
        g = np.full((batch, DIM), 0.01, np.float32).tobytes()
        t0 = time.monotonic()
        for lo in range(0, nrows, batch):
            n = min(batch, nrows - lo)
            ks = np.arange(lo, lo + n, dtype="<u8").tobytes()
            r = w.request({"t": T_TPUSH, "tab": "emb", "keys": ks, "base": 0, "data": g[:n * DIM * 4]})
            assert r.get("t") == T_OK, r
        print("filled %d rows (%.2f GB of rows) in %.1f s; psd RSS %.2f GB" %
              (nrows, nrows * ROW_BYTES / 1e9, time.monotonic() - t0, psd.rss_kb() * 1024 / 1e9), flush=True)
        rng = np.random.default_rng(1)

        def pull():
            ks = rng.integers(0, nrows, args.keys, dtype=np.uint64).astype("<u8").tobytes()
            t = time.monotonic()
            r = w.request({"t": T_TPULL, "tab": "emb", "keys": ks})
            dt = time.monotonic() - t
            assert r.get("t") == T_ROWS, r
            return dt

        quiet = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            quiet.append(pull())
        assert not glob.glob(os.path.join(state, "ckpt-*")), "a checkpoint before the one measured"
        t0 = time.monotonic()
        ck = subprocess.Popen([harness.Paths.psctl, "--server", psd.addr, "--timeout", "600000", "checkpoint"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        busy = []
        while ck.poll() is None:
            dt = pull()
            if glob.glob(os.path.join(state, "*.tmp")):
                busy.append(dt)
        took = time.monotonic() - t0
        out, err = ck.communicate()
        assert ck.returncode == 0, (out, err)
        size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(state, "ckpt-*.psdc")))
        print("checkpoint: %.2f GB written in %.1f s (psctl checkpoint's wait)" % (size / 1e9, took))
        print("psd: %s" % [l for l in psd.stderr().splitlines() if "written to" in l][-1].split(" INFO ")[-1])
        for name, xs in (("no checkpoint", quiet), ("during checkpoint", busy)):
            print("pull of %d keys, %-17s: %6d pulls  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms" %
                  (args.keys, name, len(xs), pct(xs, 50), pct(xs, 99), max(xs) * 1e3), flush=True)
        w.sock.close()
        psd.stop(120)
    except BaseException:
        if psd is not None:
            sys.stderr.write("--- psd's log:\n%s" % harness.tail(psd.err_path, 15))
        raise
    finally:
        if psd is not None:
            psd.kill()
            psd.close_files()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
