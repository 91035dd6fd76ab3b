#!/usr/bin/python3
"""ab_psworker.py - two psworker binaries timed against each other on the
same job (a benchmark: it prints figures and asserts nothing).

    bench/ab_psworker.py --a OLD_PSWORKER --b NEW_PSWORKER [--reps 3]
                         [--mode asgd|bsp] [--epochs 1] [--shm on|off]
                         [--psd PATH] [--data DIR]

W1 (mlp:256,128) on MNIST with 2 workers and the recommended
settings of docs/settings.md (Adam, lr 2e-3, batch 64), one psd per run, A and B alternating so
that the machine's load falls on both alike (in ABBA order). Per run: the workers' mean
training seconds per epoch, the part of it spent waiting on psd, and the
workers' CPU seconds per epoch; at the end the median of each binary and
the ratios B/A.
"""

import os
import resource
import statistics

import benchlib
from benchlib import harness


def run(psworker, mode, epochs, shm):
    with harness.Cluster("psd-ab") as cl:
        batch = 64 if mode == "asgd" else 32
        psd = cl.psd(mode=mode, workers=2, args=benchlib.adam(2e-3))
        procs = []
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        for k in range(2):
            argv = [psworker, "--server", psd.addr, "--shard", "%d/2" % k, "--data", harness.Paths.data,
                    "--model", "mlp:256,128", "--epochs", str(epochs), "--batch", str(batch), "--quiet",
                    "--epoch-json", "--shm", shm]
            procs.append(harness.Proc("w%d" % k, argv, cl.dir))
        secs, waits = [], []
        for out in benchlib.wait_all(procs, 600, "ab_psworker"):
            rows = benchlib.json_lines(out, '{"epoch"')
            secs.append(sum(r["epoch_seconds"] for r in rows) / len(rows))
            waits.append(sum(r["comm_wait_seconds"] for r in rows) / len(rows))
        # the workers' CPU time (psd, still running, is not counted): far
        # less sensitive than wall time to other load on the machine
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / 2 / epochs
        return statistics.mean(secs), statistics.mean(waits), cpu


def main():
    def options(ap):
        ap.add_argument("--a", required=True, help="psworker A (e.g. the previous build)")
        ap.add_argument("--b", required=True, help="psworker B")
        ap.add_argument("--reps", type=int, default=3)
        ap.add_argument("--mode", default="asgd", choices=("asgd", "bsp"))
        ap.add_argument("--epochs", type=int, default=1)
        ap.add_argument("--shm", default="on", choices=("on", "off"))
    args = harness.parse_args(options, program_doc=__doc__)
    args.a, args.b = os.path.abspath(args.a), os.path.abspath(args.b)
    res = {"A": [], "B": []}
    cpu = {"A": [], "B": []}
    for i in range(args.reps):
        for name, binary in (("A", args.a), ("B", args.b)) if i % 2 == 0 else (("B", args.b), ("A", args.a)):
            s, w, c = run(binary, args.mode, args.epochs, args.shm)
            res[name].append(s)
            cpu[name].append(c)
            print("rep %d %s: %.3f s/epoch (waiting on psd %.3f s), worker CPU %.3f s/epoch" % (i + 1, name, s, w, c),
                  flush=True)
    ma, mb = statistics.median(res["A"]), statistics.median(res["B"])
    ca, cb = statistics.median(cpu["A"]), statistics.median(cpu["B"])
    print("W1 %s shm %s, 2 workers: median A %.3f s/epoch, B %.3f s/epoch, B/A %.3f; worker CPU A %.3f, B %.3f "
          "s/epoch, B/A %.3f" % (args.mode, args.shm, ma, mb, mb / ma, ca, cb, cb / ca))


if __name__ == "__main__":
    main()
