#!/usr/bin/python3
"""tables_drift.py - admission and expiry on a stream whose popular ids drift
(proto/PROTOCOL.md 13.8): the rows a table holds and the test AUC over time,
uncapped against table_admit = 2 with table_expire = T. Prints one JSON line
per evaluation and a summary; writes DIR/tables_drift.csv and, with gnuplot,
DIR/tables_drift.png.

The stream: F categorical features; in phase p (samples [p M, (p + 1) M))
feature f's id is r + p D, r drawn from Zipf(s) over [0, V): the popular ids
slide by D every M samples, those below p D are never drawn again, new ones
come in at the top. The label comes from a planted teacher whose weight for
an id is a function of the id alone, as in tables_scale.py (no memory; an
id keeps its weight as it moves in rank). The model is tables_scale.py's:
one AdaGrad table ("ids", dim --dim, the feature folded into the key), the
logit a sum over features of the row's dot product with a fixed unit vector;
one worker pushes each batch's gradients and pulls the next batch's rows in
one call. Every --eval-every samples it scores --test samples drawn from the
phase the last trained sample came from (pulls only: nothing is pushed, so
the evaluation changes no row) and reads the table's rows from psd's status.

Runs, each on a fresh psd (one worker, so both see the same stream):
  uncapped   no bound: the table keeps every row it ever stored;
  bounded    table_admit = 2 and table_expire = T pushes (default: the
             pushes of one phase, M / batch: a row stays while its id is
             drawn at least once a drift period, and an id that left the
             distribution goes within a period of its last push).

    bench/tables_drift.py [--phases 10 --phase-samples 400000 --ids 200000]

Needs the build tree (build/server/psd, build/psctl/psctl,
build/client/libpsclient.so.1) or PSD_BIN, PSCTL_BIN and PSD_CLIENT_LIBRARY.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from tables_scale import ROOT, auc, c_status, mix, psd, rss_mb, start_psd


class Stream:
    """Draws samples of the drifting Zipf stream."""

    def __init__(self, args):
        self.a = args
        p = np.arange(1, args.ids + 1, dtype=np.float64) ** -args.zipf
        self.cdf = np.cumsum(p / p.sum())

    def draw(self, rng, n, phase):
        a = self.a
        r = np.searchsorted(self.cdf, rng.random((n, a.features)), side="right").astype(np.uint64)
        ids = np.minimum(r, np.uint64(a.ids - 1)) + np.uint64(phase * a.drift)
        keys = ids + (np.arange(a.features, dtype=np.uint64) << np.uint64(40))
        w = (mix(keys ^ np.uint64(a.seed)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # [0, 1)
        logit = ((w - 0.5) * 3.0).sum(1) - 0.2
        y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        return keys, y


def run(name, sets, args, stream):
    d = tempfile.mkdtemp(prefix="tables-drift-")
    proc, addr = start_psd(d, "psd", sets)
    points = []
    try:
        c = psd.Client([("bias", (1024,))], server=addr, shard="0/1", connect=True, timeout_ms=600000)
        c.table("ids", args.dim, init="normal", scale=0.01, seed=1, opt="adagrad", lr=args.lr)
        u = np.random.default_rng(3).normal(size=args.dim).astype(np.float32)
        u /= np.linalg.norm(u)
        F, B, M = args.features, args.batch, args.phase_samples
        total = args.phases * M
        rng = np.random.default_rng(11)   # the training stream: the same in every run
        trng = np.random.default_rng(12)  # the test sets
        t0 = time.monotonic()

        def evaluate(seen):
            phase = (seen - 1) // M  # the phase the last sample trained on came from
            tk, ty = stream.draw(trng, args.test, phase)
            score = (c.pull_rows("ids", tk.reshape(-1)).reshape(-1, F, args.dim) @ u).sum(1)
            t = c_status(addr)["tables"][0]
            pt = {"run": name, "samples": seen, "phase": phase, "rows": t["rows"], "test_auc": round(auc(ty, score), 4),
                  "admitted": t.get("admitted", 0), "filtered": t.get("filtered", 0), "expired": t.get("expired", 0),
                  "rss_mb": round(rss_mb(proc.pid), 1), "seconds": round(time.monotonic() - t0, 1)}
            points.append(pt)
            print(json.dumps(pt), flush=True)

        keys, y = stream.draw(rng, B, 0)
        rows = c.pull_rows("ids", keys.reshape(-1)).reshape(-1, F, args.dim)
        for at in range(0, total, B):
            p = 1 / (1 + np.exp(-((rows @ u).sum(1))))
            g = np.ascontiguousarray(np.broadcast_to(
                ((p - y)[:, None, None] * u[None, None, :]).astype(np.float32), rows.shape)).reshape(-1, args.dim)
            nxt = at + B
            if nxt < total:
                nk, ny = stream.draw(rng, B, nxt // M)
                rows = c.pushpull_rows("ids", keys.reshape(-1), g, nk.reshape(-1)).reshape(-1, F, args.dim)
                keys, y = nk, ny
            else:
                c.push_rows("ids", keys.reshape(-1), g)
            if nxt % args.eval_every == 0 or nxt >= total:
                evaluate(min(nxt, total))
        c.close()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(d, ignore_errors=True)
    return points


def plot(out, csv, args, expire):
    png = os.path.join(out, "tables_drift.png")
    if not shutil.which("gnuplot"):
        print("note: gnuplot not installed (apt-get install gnuplot-nox); no plot", file=sys.stderr)
        return None
    m = args.phase_samples
    cmds = ['set terminal pngcairo size 900,640 font ",10"', 'set output "%s"' % png, 'set datafile separator ","',
            'set multiplot layout 2,1 title "%d ids Zipf(%.2f), +%d every %dk samples; admit 2, expire %d pushes"'
            % (args.ids, args.zipf, args.drift, m // 1000, expire),
            'set key top left', 'set grid', 'set xlabel "samples (millions)"', 'set ylabel "rows held"',
            'set format y "%.1s%c"',
            'plot "%s" using ($2/1e6):(strcol(1) eq "uncapped" ? $4 : NaN) with lines lw 2 title "uncapped", '
            '"" using ($2/1e6):(strcol(1) eq "bounded" ? $4 : NaN) with lines lw 2 title "admit 2 + expire"' % csv,
            'set ylabel "test AUC (current phase)"', 'set format y "%.3f"', 'set key bottom right',
            'plot "%s" using ($2/1e6):(strcol(1) eq "uncapped" ? $5 : NaN) with linespoints pt 7 ps 0.4 title '
            '"uncapped", "" using ($2/1e6):(strcol(1) eq "bounded" ? $5 : NaN) with linespoints pt 7 ps 0.4 '
            'title "admit 2 + expire"' % csv, 'unset multiplot']
    r = subprocess.run(["gnuplot", "-e", "; ".join(cmds)], capture_output=True, text=True)
    if r.returncode != 0:
        print("gnuplot failed: %s" % r.stderr.strip(), file=sys.stderr)
        return None
    return png


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=200000, help="V: ids a feature's Zipf draws over in one phase")
    ap.add_argument("--zipf", type=float, default=1.1, help="s: P(rank r) proportional to r^-s")
    ap.add_argument("--drift", type=int, default=0, help="D: how far the ids slide each phase (default V / 5)")
    ap.add_argument("--phases", type=int, default=10)
    ap.add_argument("--phase-samples", type=int, default=400000, help="M: samples a phase")
    ap.add_argument("--features", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--eval-every", type=int, default=100000, help="samples between evaluations")
    ap.add_argument("--test", type=int, default=50000, help="test samples an evaluation")
    ap.add_argument("--expire", type=int, default=0, help="T in pushes (default: a phase's, M / batch)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--runs", default="uncapped,bounded")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out"), help="where the CSV and PNG go")
    ap.add_argument("--replot", action="store_true", help="only plot OUT/tables_drift.csv again (same options)")
    args = ap.parse_args()
    args.drift = args.drift or args.ids // 5
    if args.eval_every % args.batch or args.phase_samples % args.batch:
        sys.exit("--eval-every and --phase-samples must be multiples of --batch")
    expire = args.expire or args.phase_samples // args.batch
    if args.replot:
        print(plot(args.out, os.path.join(args.out, "tables_drift.csv"), args, expire) or "no plot")
        return
    stream = Stream(args)
    res = {}
    for name in args.runs.split(","):
        sets = ["max_table_memory=8G"]
        if name == "bounded":
            sets += ["table_admit=2", "table_expire=%d" % expire]
        elif name != "uncapped":
            sys.exit("unknown run %s" % name)
        res[name] = run(name, sets, args, stream)
    os.makedirs(args.out, exist_ok=True)
    csv = os.path.join(args.out, "tables_drift.csv")
    with open(csv, "w") as f:
        f.write("run,samples,phase,rows,test_auc,admitted,filtered,expired,rss_mb,seconds\n")
        for pts in res.values():
            for p in pts:
                f.write("%s,%d,%d,%d,%.4f,%d,%d,%d,%.1f,%.1f\n" % (p["run"], p["samples"], p["phase"], p["rows"],
                                                                   p["test_auc"], p["admitted"], p["filtered"],
                                                                   p["expired"], p["rss_mb"], p["seconds"]))
    summary = {"ids": args.ids, "zipf": args.zipf, "drift": args.drift, "phase_samples": args.phase_samples,
               "phases": args.phases, "batch": args.batch, "expire_pushes": expire, "csv": csv}
    for name, pts in res.items():
        summary[name] = {"rows_last": pts[-1]["rows"], "rows_max": max(p["rows"] for p in pts),
                         "auc_last": pts[-1]["test_auc"], "auc_mean": round(float(np.mean([p["test_auc"] for p in pts])), 4),
                         "seconds": pts[-1]["seconds"]}
    if "uncapped" in res and "bounded" in res:
        a, b = res["uncapped"], res["bounded"]
        diff = [q["test_auc"] - p["test_auc"] for p, q in zip(a, b)]
        # from the second phase on: both have seen a whole drift period
        late = [dv for dv, p in zip(diff, a) if p["samples"] > args.phase_samples]
        summary["auc_bounded_minus_uncapped"] = {"mean": round(float(np.mean(diff)), 4),
                                                 "min": round(min(diff), 4),
                                                 "mean_after_phase_1": round(float(np.mean(late)), 4) if late else None}
        half = [p["rows"] for p in b if p["samples"] > args.phases * args.phase_samples // 2]
        summary["bounded_rows_second_half"] = [min(half), max(half)] if half else None
    png = plot(args.out, csv, args, expire)
    if png:
        summary["png"] = png
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
