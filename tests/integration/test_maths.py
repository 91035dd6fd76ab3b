#!/usr/bin/python3
"""test_maths.py - BSP with M workers is the same maths as one process.

With the samples visited in order (--no-shuffle), worker k of M at batch
B/M sees, at step i, exactly the samples of global batch i that are dealt
to shard k (every M-th of the one fixed dealing order, which does not depend
on M), so the mean of the M pushes is the mean gradient of the global
batch of B. A BSP job of 2 workers at batch 32 must therefore follow the
trajectory of 1 worker at batch 64 up to float rounding; and since BSP sums
in shard order, running the 2-worker job twice gives bit-for-bit the same
model.
"""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LIMIT = 6400  # 100 steps of 64
MODEL = "mlp:64"


def train(cl, name, nworkers, batch, extra=()):
    psd = cl.psd(mode="bsp", workers=nworkers, name=name, args=list(extra))
    paths = [os.path.join(cl.dir, "%s-w%d.f32" % (name, k)) for k in range(nworkers)]
    ws = [cl.worker(psd, k, nworkers, epochs=2, batch=batch, limit=LIMIT, model=MODEL, evaluate=False,
                    args=["--no-shuffle", "--save-params", paths[k]], name="%s-worker%d" % (name, k))
          for k in range(nworkers)]
    versions = []
    for w in ws:
        rc, summary = w.result(120)
        if rc != 0:
            raise AssertionError("%s failed:\n%s" % (w.name, harness.tail(w.err_path)))
        versions.append(summary["version"])
    psd.stop()
    params = [np.fromfile(p, dtype="<f4") for p in paths]
    return params, versions


class MathsTest(unittest.TestCase):
    def test_bsp_two_workers_equal_one_worker_at_twice_the_batch(self):
        with harness.Cluster("psd-maths") as cl:
            (one,), v1 = train(cl, "one", 1, 64)
            two, v2 = train(cl, "two", 2, 32)
            again, v3 = train(cl, "again", 2, 32, extra=("--set", "bsp_sum_order=shard"))
        self.assertEqual(v1, [200])
        self.assertEqual(v2, [200, 200])
        # both workers of a BSP job hold the same final model
        np.testing.assert_array_equal(two[0], two[1])
        # same trajectory as one process, up to float rounding
        scale = float(np.max(np.abs(one)))
        diff = float(np.max(np.abs(one - two[0])))
        self.assertLess(diff, 1e-5 * scale, "max |one - two| = %g (max |w| = %g)" % (diff, scale))
        # and bit-for-bit reproducible
        np.testing.assert_array_equal(two[0], again[0])
        print("max |w_1worker - w_2workers| = %.3g, max |w| = %.3g" % (diff, scale))


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
