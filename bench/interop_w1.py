#!/usr/bin/python3
"""interop_w1.py - a C psworker and a PyTorch worker training W1 together in
one BSP job, against two psworkers on the same job (a benchmark: it prints
figures and asserts nothing).

    bench/interop_w1.py [--epochs 4] [--reps 1] [--psd PATH] [--data DIR]

W1 is psworker's mlp:256,128 (784-256-128-10); the PyTorch side is
examples/torch/mnist_cnn.py --model w1, the same tensor names, shapes and
order. Settings: the README's recommended ones for W1 on MNIST in BSP (a
round of 2 x 32 samples, Adam lr 2e-3 with a cosine schedule over the run,
on psd). Prints each job's test accuracy after the last epoch (the whole
test set, both workers hold the same model) and the difference.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

PY = "/usr/bin/python3"
SCRIPT = os.path.join(ROOT, "examples", "torch", "mnist_cnn.py")


def last_json(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")][-1]


def job(epochs, torch_worker):
    with harness.Cluster("psd-interop") as cl:
        versions = epochs * -(-30000 // 32)
        psd = cl.psd(mode="bsp", workers=2, args=["--set", "optimizer=adam", "--set", "lr=2e-3",
                                                  "--set", "lr_schedule=cosine",
                                                  "--set", "lr_decay_versions=%d" % versions,
                                                  "--set", "heartbeat_timeout=60s", "--log-level", "warn"])
        procs = [cl.worker(psd, 0, 2, epochs=epochs, batch=32, limit=60000, test_limit=10000, model="mlp:256,128")]
        if torch_worker:
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            env.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))
            procs.append(harness.Proc("torch", [PY, SCRIPT, "--model", "w1", "--server", psd.addr, "--shard", "1/2",
                                                "--data", harness.Paths.data, "--epochs", str(epochs),
                                                "--batch", "32"], cl.dir, env=env))
        else:
            procs.append(cl.worker(psd, 1, 2, epochs=epochs, batch=32, limit=60000, test_limit=10000,
                                   model="mlp:256,128"))
        out = []
        for p in procs:
            if p.wait(1800) != 0:
                sys.exit("interop_w1: %s failed:\n%s" % (p.name, p.stderr()))
            out.append(last_json(p.stdout()))
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--psd")
    ap.add_argument("--data")
    args = ap.parse_args()
    if args.psd:
        harness.Paths.psd = os.path.abspath(args.psd)
    if args.data:
        harness.Paths.data = os.path.abspath(args.data)
    for rep in range(args.reps):
        two_c = job(args.epochs, False)
        mixed = job(args.epochs, True)
        a, b = two_c[0]["test_accuracy"], mixed[0]["test_accuracy"]
        print("rep %d: two psworkers %.4f (version %d); psworker + PyTorch %.4f (PyTorch's own evaluation %.4f, "
              "version %d); difference %+.2f points" % (rep + 1, a, two_c[0]["version"], b,
                                                         mixed[1]["test_accuracy"], mixed[0]["version"],
                                                         100 * (b - a)), flush=True)


if __name__ == "__main__":
    main()
