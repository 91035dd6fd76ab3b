#!/usr/bin/python3
"""interop_w1.py - a C psworker and a PyTorch worker training W1 together in
one BSP job, against two psworkers on the same job (a benchmark: it prints
figures and asserts nothing).

    bench/interop_w1.py [--epochs 4] [--reps 1] [--psd PATH] [--data DIR]

W1 is psworker's mlp:256,128 (784-256-128-10); the PyTorch side is
examples/torch/mnist_cnn.py --model w1, the same tensor names, shapes and
order. Settings: the recommended ones (docs/settings.md) for W1 on MNIST in BSP (a
round of 2 x 32 samples, Adam lr 2e-3 with a cosine schedule over the run,
on psd). Prints each job's test accuracy after the last epoch (the whole
test set, both workers hold the same model) and the difference.
"""

import os

import benchlib
from benchlib import harness

SCRIPT = os.path.join(benchlib.ROOT, "examples", "torch", "mnist_cnn.py")


def job(epochs, torch_worker):
    with harness.Cluster("psd-interop") as cl:
        versions = epochs * -(-30000 // 32)
        psd = cl.psd(mode="bsp", workers=2, args=benchlib.adam(2e-3, cosine_versions=versions) +
                     ["--log-level", "warn"])
        procs = [cl.worker(psd, 0, 2, epochs=epochs, batch=32, limit=60000, test_limit=10000, model="mlp:256,128")]
        if torch_worker:
            argv = [benchlib.PY, SCRIPT, "--model", "w1", "--server", psd.addr, "--shard", "1/2",
                    "--data", harness.Paths.data, "--epochs", str(epochs), "--batch", "32"]
            procs.append(harness.Proc("torch", argv, cl.dir, env=benchlib.python_env()))
        else:
            procs.append(cl.worker(psd, 1, 2, epochs=epochs, batch=32, limit=60000, test_limit=10000,
                                   model="mlp:256,128"))
        return [benchlib.json_lines(out)[-1] for out in benchlib.wait_all(procs, 1800, "interop_w1")]


def main():
    def options(ap):
        ap.add_argument("--epochs", type=int, default=4)
        ap.add_argument("--reps", type=int, default=1)
    args = harness.parse_args(options, program_doc=__doc__)
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
