#!/usr/bin/python3
"""faults.py - what stragglers, dead workers and a psd crash cost (a
benchmark: it prints figures, it asserts nothing).

    bench/faults.py [--psd PATH --psworker PATH --psctl PATH --data DIR] [--quick]

1. Stragglers: 3 workers train mlp:256,128 on MNIST; after a warm-up one is
   SIGSTOPped for 10 s. Printed: samples/s of the two others during the
   stop, under plain BSP, BSP with one backup worker, SSP with s=3 and
   ASGD (heartbeat_timeout is 60 s here, so the stopped worker is not
   declared dead and each mode's own answer is measured), all with Adam,
   lr 1e-3.
2. A dead worker: 3 BSP workers, one killed with kill -9; printed: the time
   from the kill to the first round closed without it, and the final test
   accuracy of the survivors against an undisturbed 3-worker run, for three
   seeds (the seed alone moves the final accuracy by more than half a
   point) and their means.
3. psd killed with kill -9 mid-training, half a checkpoint interval (5 s)
   after its first checkpoint, and restarted: versions lost, seconds until
   training resumed, final accuracy.
"""

import os
import re
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402

MODEL = "mlp:256,128"


def pushes_of(st, shards):
    return sum(w["pushes"] for w in st["workers"] if w["shard"] in shards)


def straggler(mode, extra, epochs, batch=64):
    with harness.Cluster("bench-straggler") as cl:
        # Adam at 1e-3 trains in every mode; SGD at lr 0.05 and momentum 0.9
        # (psd's defaults until the AdaGrad ones) diverges when 3 workers apply
        # their pushes one by one. No warm-up, as when the figures were taken.
        psd = cl.psd(mode=mode, workers=3, args=["--set", "heartbeat_timeout=60s", "--set", "optimizer=adam",
                                                 "--set", "lr=0.001", "--set", "warmup_versions=0"] + extra)
        ws = [cl.worker(psd, k, 3, epochs=epochs, batch=batch, limit=0, model=MODEL, evaluate=False,
                        test_limit=0) for k in range(3)]
        harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 200, 120, "warm-up")
        st0 = harness.status(psd.addr)
        t0 = time.monotonic()
        os.kill(ws[2].pid, signal.SIGSTOP)
        time.sleep(10)
        st1 = harness.status(psd.addr)
        t1 = time.monotonic()
        os.kill(ws[2].pid, signal.SIGCONT)
        rate = (pushes_of(st1, (0, 1)) - pushes_of(st0, (0, 1))) * batch / (t1 - t0)
        for w in ws:
            w.kill()
        return rate


def dead_worker(epochs, kill, seed=1):
    with harness.Cluster("bench-dead") as cl:
        psd = cl.psd(mode="bsp", workers=3)
        ws = [cl.worker(psd, k, 3, epochs=epochs, limit=0, model=MODEL, test_limit=0, args=["--seed", str(seed)])
              for k in range(3)]
        gap = None
        if kill:
            harness.wait_until(lambda: harness.status(psd.addr)["version"] >= 300, 120, "300 rounds")
            v = harness.status(psd.addr)["version"]
            os.kill(ws[2].pid, signal.SIGKILL)
            t0 = time.monotonic()
            # the round open at the kill may need the dead worker: the first
            # version after it is the first round closed without it
            harness.wait_until(lambda: harness.status(psd.addr)["version"] > v, 30, "a round without the dead worker",
                               interval=0.002)
            gap = time.monotonic() - t0
            ws = ws[:2]
        accs = []
        for w in ws:
            rc, summary = w.result(600)
            accs.append(summary["test_accuracy"] if rc == 0 and summary else float("nan"))
        psd.stop()
        return gap, accs


def psd_crash(epochs, interval=5.0):
    port = harness.free_port()
    with harness.Cluster("bench-crash") as cl:
        state = os.path.join(cl.dir, "state")
        args = ["--listen", "127.0.0.1:%d" % port, "--state-dir", state,
                "--set", "checkpoint_interval=%gs" % interval]
        psd = cl.psd(mode="bsp", workers=2, args=args)
        ws = [cl.worker(psd, k, 2, epochs=epochs, limit=0, model=MODEL, test_limit=0) for k in range(2)]
        # the first checkpoint, then 2.5 s of training (half an interval) on
        # top of it: what a crash in mid-interval costs
        harness.wait_until(lambda: os.path.isdir(state) and any(f.endswith(".psdc") for f in os.listdir(state)),
                           60, "the first checkpoint")
        time.sleep(interval / 2)
        # the version at the kill: poll until just before it
        before = harness.status(psd.addr)["version"]
        os.kill(psd.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        psd.wait(10)
        psd2 = cl.psd(mode="bsp", workers=2, args=args, name="psd2")
        m = harness.wait_until(lambda: re.search(r"model version (\d+), ", psd2.stderr()), 10, "checkpoint load")
        loaded = int(m.group(1))
        harness.wait_until(lambda: harness.status(psd2.addr)["version"] > loaded, 60, "training to resume",
                           interval=0.005)
        resumed = time.monotonic() - t_kill
        accs = []
        for w in ws:
            rc, summary = w.result(600)
            accs.append(summary["test_accuracy"] if rc == 0 and summary else float("nan"))
        psd2.stop()
        return before, loaded, resumed, accs


def main():
    quick = harness.parse_args(lambda ap: ap.add_argument("--quick", action="store_true", help="fewer epochs"),
                               program_doc=__doc__).quick
    epochs = 2 if quick else 5
    print("== 1. one of 3 workers SIGSTOPped for 10 s: samples/s of the other two")
    for name, mode, extra in (("bsp", "bsp", []), ("bsp, 1 backup worker", "bsp", ["--set", "backup_workers=1"]),
                              ("ssp, s=3", "ssp", ["--set", "staleness=3"]), ("asgd", "asgd", [])):
        print("  %-22s %8.0f samples/s" % (name, straggler(mode, extra, 30)), flush=True)
    print("== 2. 3 BSP workers, mlp:256,128, %d epochs; one killed with kill -9 after 300 rounds, seeds 1-3"
          % epochs)
    cleans, killeds = [], []
    for seed in (1, 2, 3):
        _, clean = dead_worker(epochs, kill=False, seed=seed)
        gap, accs = dead_worker(epochs, kill=True, seed=seed)
        cleans.append(clean[0])
        killeds.append(accs[0])
        print("  seed %d: kill -9 to first round closed without it %.3f s; test accuracy undisturbed %.4f, "
              "after the kill %s (the two survivors)" % (seed, gap, clean[0], " ".join("%.4f" % a for a in accs)),
              flush=True)
    print("  mean test accuracy: undisturbed %.4f, after a kill %.4f (difference %+.2f points)"
          % (sum(cleans) / 3, sum(killeds) / 3, 100 * (sum(killeds) - sum(cleans)) / 3))
    print("== 3. psd killed with kill -9 2.5 s after its first checkpoint (one every 5 s), restarted; "
          "2 BSP workers, %d epochs" % (2 * epochs))
    before, loaded, resumed, accs = psd_crash(2 * epochs)
    print("  version at the last status before the kill: %d; checkpoint loaded: %d; lost: %d versions"
          % (before, loaded, before - loaded))
    print("  kill to first new version on the restarted psd: %.2f s" % resumed)
    print("  final test accuracy: %s" % " ".join("%.4f" % a for a in accs))


if __name__ == "__main__":
    main()
