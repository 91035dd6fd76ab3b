#!/usr/bin/python3
"""tta.py - time to accuracy: psd against PyTorch alone (a benchmark; it
prints figures and asserts nothing).

    bench/tta.py [--quick] [--only SUBSTRING] [--no-torch] [--out DIR]
                 [--psd PATH --psworker PATH --psctl PATH --data DIR]

For W1 (MLP 784-256-128-10) and W2 (the CNN) on MNIST and Fashion-MNIST,
with 1 and 2 workers in ASGD and BSP (W1 also over TCP, with bfloat16 on
the wire, and with the model split over 2 psd), it runs psd and real psworkers on this
machine and prints, per configuration: seconds per epoch, the part of it
worker 0 spent waiting on psd ("wait": push, pull and, in BSP, the round),
samples/s, test accuracy after every epoch, and the training wall time
until the target accuracy was first reached, with the settings of the
docs/settings.md's "Recommended settings" (SETTINGS below). Training time excludes the test-set evaluation
(worker 0 evaluates after every epoch; the clock stops meanwhile).
PyTorch alone (bench/torch_ref.py, Debian's python3-torch) runs the same
workload with the same optimizer settings in the same run, for the ratio.
It writes DIR/tta.csv and DIR/tta.png (gnuplot), DIR defaulting to
bench/out.
"""

import csv
import os
import shutil
import subprocess

import benchlib
from benchlib import harness

HERE = os.path.dirname(os.path.abspath(__file__))

# The recommended settings (docs/settings.md, "Recommended settings"): Adam with a
# cosine schedule over the run, per workload and data set. batch is the
# samples per model version: each ASGD worker's batch, and a BSP round's
# (split over its M workers).
WORKLOADS = {
    "W1": {"model": "mlp:256,128", "torch": "w1"},
    "W2": {"model": "cnn", "torch": "w2"},
}
SETTINGS = {
    ("W1", "mnist"): {"batch": 64, "lr": 2e-3, "epochs": 4},
    ("W2", "mnist"): {"batch": 64, "lr": 2e-3, "epochs": 6},
    ("W1", "fashion-mnist"): {"batch": 128, "lr": 1e-3, "epochs": 20},
    ("W2", "fashion-mnist"): {"batch": 64, "lr": 2e-3, "epochs": 12},
}
TARGETS = {("W1", "mnist"): 0.980, ("W2", "mnist"): 0.990, ("W1", "fashion-mnist"): 0.895,
           ("W2", "fashion-mnist"): 0.905}
TRAIN_N = 60000


def psd_run(wl, dataset, nworkers, mode, epochs, lr, batch, wire="f32", shm="on", parts=1):
    """One configuration; returns worker 0's per-epoch records. parts > 1:
    the model split over that many psd (psworker --server A,B,...)."""
    versions = epochs * -(-TRAIN_N // batch)
    if mode == "bsp":
        batch //= nworkers
    args = benchlib.adam(lr, cosine_versions=versions, warmup_versions=0)
    with harness.Cluster("bench-tta") as cl:
        psds = [cl.psd(mode=mode, workers=nworkers, args=args, name="psd%d" % i) for i in range(parts)]
        ws = [cl.worker(psds, k, nworkers, epochs=epochs, batch=batch, limit=0, test_limit=0,
                        model=WORKLOADS[wl]["model"], dataset=dataset, evaluate=(k == 0),
                        args=["--epoch-json", "--quiet", "--pipeline", "off", "--wire", wire, "--shm", shm])
              for k in range(nworkers)]
        for w in ws:
            rc, _ = w.result(3600)
            if rc != 0:
                raise SystemExit("tta: %s failed:\n%s" % (w.name, harness.tail(w.err_path)))
        for p in psds:
            p.stop()
        recs = benchlib.json_lines(ws[0].stdout(), '{"epoch"')
        for r in recs:
            r["samples_per_second"] = TRAIN_N / r["epoch_seconds"] if r["epoch_seconds"] > 0 else 0
        return recs


def torch_run(wl, dataset, epochs, lr, batch, data):
    argv = ["/usr/bin/python3", os.path.join(HERE, "torch_ref.py"), "--workload", WORKLOADS[wl]["torch"],
            "--dataset", dataset, "--epochs", str(epochs), "--optimizer", "adam", "--lr", str(lr),
            "--schedule", "cosine", "--batch", str(batch), "--threads", "2", "--data", data]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=7200)
    if r.returncode != 0:
        print("  (PyTorch reference failed: %s)" % r.stderr.strip().splitlines()[-1:], flush=True)
        return None
    recs = benchlib.json_lines(r.stdout)
    prev = 0.0
    for rec in recs:
        rec["epoch_seconds"] = rec["train_seconds"] - prev
        rec["samples_per_second"] = TRAIN_N / rec["epoch_seconds"] if rec["epoch_seconds"] > 0 else 0
        prev = rec["train_seconds"]
    return recs


def time_to(recs, target):
    for r in recs:
        if r["test_accuracy"] is not None and r["test_accuracy"] >= target:
            return r["train_seconds"], r["epoch"]
    return None, None


def main():
    def options(ap):
        ap.add_argument("--quick", action="store_true", help="W1 on MNIST only")
        ap.add_argument("--only", default="", help="only the configurations whose name contains this")
        ap.add_argument("--no-torch", action="store_true", help="no PyTorch column")
        ap.add_argument("--out", default=os.path.join(HERE, "out"), help="where tta.csv and tta.png go")

    a = harness.parse_args(options, program_doc=__doc__)
    os.makedirs(a.out, exist_ok=True)
    have_torch = not a.no_torch and subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                                                    capture_output=True).returncode == 0
    if not have_torch and not a.no_torch:
        print("note: python3-torch is not installed (apt-get install python3-torch); no PyTorch column")
    rows, series = [], []
    # PyTorch and psworker load the same OpenBLAS, which takes its kernels
    # from OPENBLAS_CORETYPE when set (see the recommended settings in docs/settings.md)
    print("OpenBLAS kernels: %s" % (os.environ.get("OPENBLAS_CORETYPE") or "the CPU's own choice"))
    header = "%-44s %7s %6s %10s %s" % ("configuration", "s/epoch", "wait", "samples/s",
                                        "test accuracy per epoch -> time to target")
    print(header)
    print("-" * len(header))
    for dataset in ("mnist", "fashion-mnist"):
        for wl in ("W1", "W2"):
            if a.quick and (wl, dataset) != ("W1", "mnist"):
                continue
            spec = SETTINGS[(wl, dataset)]
            target = TARGETS[(wl, dataset)]
            # (name, workers, mode, wire, shm[, psd]): the workers share memory
            # with psd (the default on one machine) unless the name says tcp;
            # "2 psd": the model split over two psd instances
            configs = [("psd asgd 1 worker", 1, "asgd", "f32", "on"), ("psd asgd 2 workers", 2, "asgd", "f32", "on"),
                       ("psd bsp 1 worker", 1, "bsp", "f32", "on"), ("psd bsp 2 workers", 2, "bsp", "f32", "on")]
            if wl == "W1":
                # the same over loopback TCP (psworker --shm off), and the
                # accuracy effect of bfloat16 on that wire (--wire bf16)
                configs += [("psd asgd 2 workers tcp", 2, "asgd", "f32", "off"),
                            ("psd bsp 2 workers tcp", 2, "bsp", "f32", "off"),
                            ("psd asgd 2 workers tcp bf16", 2, "asgd", "bf16", "off"),
                            ("psd bsp 2 workers tcp bf16", 2, "bsp", "bf16", "off"),
                            ("psd asgd 2 workers 2 psd", 2, "asgd", "f32", "on", 2),
                            ("psd bsp 2 workers 2 psd", 2, "bsp", "f32", "on", 2)]
            results = []
            if have_torch:
                results.append(("pytorch alone", torch_run(wl, dataset, spec["epochs"], spec["lr"], spec["batch"],
                                                          harness.Paths.data)))
            for name, n, mode, wire, shm, *parts in configs:
                label = "%s %s %s" % (wl, dataset, name)
                if a.only and a.only not in label:
                    continue
                results.append((name, psd_run(wl, dataset, n, mode, spec["epochs"], spec["lr"], spec["batch"], wire,
                                              shm, parts[0] if parts else 1)))
            for name, recs in results:
                if not recs:
                    continue
                label = "%s %s %s" % (wl, dataset, name)
                t, e = time_to(recs, target)
                mean_epoch = sum(r["epoch_seconds"] for r in recs) / len(recs)
                waits = [r["comm_wait_seconds"] for r in recs if "comm_wait_seconds" in r]
                wait = "%6.2f" % (sum(waits) / len(waits)) if waits else "%6s" % "-"
                accs = " ".join("%.2f" % (100 * r["test_accuracy"]) for r in recs)
                tt = "%.1f s (epoch %d)" % (t, e) if t is not None else "not reached"
                print("%-44s %7.2f %s %10.0f %s -> %.1f%%: %s" % (label, mean_epoch, wait, TRAIN_N / mean_epoch,
                                                                 accs, 100 * target, tt), flush=True)
                for r in recs:
                    rows.append({"workload": wl, "dataset": dataset, "config": name, "epoch": r["epoch"],
                                 "train_seconds": r["train_seconds"], "epoch_seconds": r["epoch_seconds"],
                                 "samples_per_second": round(r["samples_per_second"], 1),
                                 "comm_wait_seconds": r.get("comm_wait_seconds", ""),
                                 "test_accuracy": r["test_accuracy"], "target": target,
                                 "time_to_target": t if t is not None else ""})
                series.append(("%s %s" % (wl, dataset), name, [(r["train_seconds"], r["test_accuracy"]) for r in recs]))
            times = {name: time_to(recs, target)[0] for name, recs in results if recs}
            if times.get("pytorch alone") and times.get("psd asgd 2 workers"):
                print("%-44s psd asgd 2 workers reach %.1f%% in %.2f of PyTorch's time" %
                      ("%s %s" % (wl, dataset), 100 * target, times["psd asgd 2 workers"] / times["pytorch alone"]),
                      flush=True)
    csv_path = os.path.join(a.out, "tta.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print("wrote %s" % csv_path)
    plot(series, a.out)


def plot(series, out):
    """tta.png: one panel per workload and data set, accuracy against
    training time, a line per configuration. series: (panel, name, points)."""
    if not shutil.which("gnuplot"):
        print("note: gnuplot not installed (apt-get install gnuplot-nox); no plot")
        return
    panels = []
    for panel, _, _ in series:
        if panel not in panels:
            panels.append(panel)
    dat = os.path.join(out, "tta.dat")
    cmds = ['set terminal pngcairo size 1600,1100', 'set output "%s"' % os.path.join(out, "tta.png"),
            # a ninth and tenth colour: past the default eight (the eighth is black) they repeat
            'set linetype 9 lc rgb "#a0522d" pt 9', 'set linetype 10 lc rgb "#808080" pt 11',
            'set multiplot layout %d,%d title "psd time to accuracy (2-core machine)"'
            % ((len(panels) + 1) // 2, 2 if len(panels) > 1 else 1)]
    index = 0
    with open(dat, "w") as f:
        for panel in panels:
            first = index
            for p, name, pts in series:
                if p != panel:
                    continue
                f.write('"%s"\n' % name)
                for t, acc in pts:
                    f.write("%g %g\n" % (t, 100 * acc))
                f.write("\n\n")
                index += 1
            cmds += ['set title "%s"' % panel, 'set key bottom right', 'set xlabel "training wall time (s)"',
                     'set ylabel "test accuracy (%)"', 'set logscale x', 'set grid',
                     'plot for [i=%d:%d] "%s" index i using 1:2 with linespoints lw 2 title columnheader(1)'
                     % (first, index - 1, dat)]
    cmds.append("unset multiplot")
    r = subprocess.run(["gnuplot", "-e", "; ".join(cmds)], capture_output=True, text=True)
    if r.returncode == 0:
        print("wrote %s" % os.path.join(out, "tta.png"))
    else:
        print("gnuplot failed: %s" % r.stderr.strip())


if __name__ == "__main__":
    main()
