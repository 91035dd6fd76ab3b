#!/usr/bin/python3
"""defaults.py - do psd's and psworker's defaults train every built-in model
in every mode? (a benchmark; it prints figures and asserts nothing)

    bench/defaults.py [--quick] [--seeds N] [--models M...] [--modes M...]
                      [--workers N...] [--epochs N] [--set KEY=VALUE]...
                      [--psd PATH --psworker PATH --psctl PATH --data DIR]

For each model x mode x worker count it runs psd and real psworkers on this
machine, N seeds (default 5) of 1 epoch of MNIST each, with no tuning flag:
psd gets only --mode and --workers (and the loopback port the run needs),
each psworker only --server, --shard, --seed, --data, --epochs, --model
(absent for the default model) and, on worker 0, --eval. Whatever psd and
psworker choose by default (optimizer, learning rate, schedule, batch) is
what is measured. --set KEY=VALUE passes a psd setting on top (to measure
other settings the same way, e.g. the defaults of an earlier release).

It prints one line per cell: worker 0's test accuracy after the epoch for
every seed, their min and median, and how many runs diverged (a worker
stopped on a non-finite loss, or no accuracy came back: "NaN"), ended at
chance level (test accuracy below 20%; MNIST has 10 balanced classes) or
below 50% (where every model reaches 85% or more when it trains).
Under the table, the first worker error of each failed run.

--quick runs 2 seeds of 2 workers only, for a check in a few minutes.
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import harness  # noqa: E402

MODELS = ["softmax", "linear", "mlp:256,128", "cnn"]
DEFAULT_MODEL = "mlp:256,128"  # psworker's default: no --model flag for it
MODES = ["asgd", "bsp", "ssp"]
CHANCE = 0.20  # MNIST has 10 balanced classes: chance is 10%
LOW = 0.50      # every model reaches 85% or more in one epoch when it trains


def one_run(model, mode, nworkers, seed, epochs, psd_sets, timeout):
    """Returns (accuracy or None, note) for one run."""
    args = []
    for kv in psd_sets:
        args += ["--set", kv]
    with harness.Cluster("bench-defaults") as cl:
        psd = cl.psd(mode=mode, workers=nworkers, args=args)
        ws = []
        for k in range(nworkers):
            argv = [harness.Paths.psworker, "--server", psd.addr, "--shard", "%d/%d" % (k, nworkers),
                    "--seed", str(seed), "--data", harness.Paths.data, "--epochs", str(epochs), "--quiet"]
            if model != DEFAULT_MODEL:
                argv += ["--model", model]
            if k == 0:
                argv.append("--eval")
            w = harness.Worker("worker%d" % k, argv, cl.dir)
            cl.procs.append(w)
            ws.append(w)
        results = []
        for w in ws:
            try:
                results.append(w.result(timeout))
            except AssertionError:
                results.append((None, None))
        notes = []
        for w, (rc, summary) in zip(ws, results):
            err = w.stderr()
            if "loss became" in err:
                line = [l for l in err.splitlines() if "loss became" in l][0]
                notes.append("%s: %s" % (w.name, line.split("psworker: ", 1)[-1]))
            elif rc != 0:
                notes.append("%s: exit %s: %s" % (w.name, rc, harness.tail(w.err_path, 2).strip()))
        psd.stop()
        rc, summary = results[0]
        acc = summary.get("test_accuracy") if summary else None
        if len(notes) > 1:
            notes = [notes[0] + " (and %d more of %d workers)" % (len(notes) - 1, nworkers)]
        return acc, "; ".join(notes)


def main():
    def extra(p):
        p.add_argument("--quick", action="store_true", help="2 seeds, 2 workers")
        p.add_argument("--seeds", type=int, default=5)
        p.add_argument("--models", nargs="+", default=MODELS, help="(default: %(default)s)")
        p.add_argument("--modes", nargs="+", default=MODES, help="(default: %(default)s)")
        p.add_argument("--workers", nargs="+", type=int, default=[2, 4], help="worker counts (default: %(default)s)")
        p.add_argument("--epochs", type=int, default=1)
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                       help="a psd setting on top of the defaults (repeatable)")
        p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    a = harness.parse_args(extra, program_doc=__doc__)
    if a.quick:
        a.seeds, a.workers = min(a.seeds, 2), [2]
    models, modes, counts = a.models, a.modes, a.workers
    seeds = list(range(1, a.seeds + 1))

    print("defaults.py: %d epoch(s), seeds %s, psd settings: %s" %
          (a.epochs, ",".join(map(str, seeds)), " ".join(a.sets) or "defaults"), flush=True)
    print("%-12s %-5s %2s | %-*s | %6s %6s | %s" % ("model", "mode", "M", 8 * len(seeds), "test accuracy per seed",
                                                  "min", "median", "NaN/<20%/<50%"), flush=True)
    t0 = time.time()
    bad_cells = 0
    for model in models:
        for mode in modes:
            for m in counts:
                accs, notes = [], []
                for s in seeds:
                    acc, note = one_run(model, mode, m, s, a.epochs, a.sets, a.timeout)
                    accs.append(acc)
                    if note:
                        notes.append("seed %d: %s" % (s, note))
                got = [x for x in accs if x is not None]
                diverged = sum(1 for x in accs if x is None or x != x)
                chance = sum(1 for x in got if x == x and x < CHANCE)
                low = sum(1 for x in got if x == x and x < LOW)
                cells = " ".join("%6.2f%%" % (100 * x) if x is not None else "   NaN " for x in accs)
                lo = "%5.2f%%" % (100 * min(got)) if got else "   -  "
                med = "%5.2f%%" % (100 * statistics.median(got)) if got else "   -  "
                print("%-12s %-5s %2d | %s | %6s %6s | %d/%d/%d" % (model, mode, m, cells, lo, med, diverged, chance,
                                                                   low), flush=True)
                for n in notes:
                    print("    %s" % n, flush=True)
                if diverged or low:
                    bad_cells += 1
    print("defaults.py: %d cell(s) with a run that diverged or ended below 50%%; %.0f s" % (bad_cells, time.time() - t0),
          flush=True)


if __name__ == "__main__":
    main()
