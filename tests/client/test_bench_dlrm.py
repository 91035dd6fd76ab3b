"""test_bench_dlrm.py - bench/dlrm.py in a tiny configuration (ctest:
client_bench_dlrm): every arm runs to its end on the same logs, and what it
prints is sane. The figures themselves are the benchmark's (bench/README.md),
not checked here beyond "learnt something".

- PyTorch alone (a), 2 workers through one psd (b) and through a model split
  over 2 psd (b2), DDP over gloo (c, a few steps): each prints a JSON line
  with its samples, samples per second, test AUC and log loss, and the
  teacher's AUC and log loss beside them;
- a, b and b2 train one pass over every training sample and end well above
  chance, below the teacher (the best reachable) within noise;
- the ratios line and the table are printed, and --json holds the same rows;
- each arm's figures come from its own test predictions (a digest of them
  beside its figures, different for every arm), and the driver stops a run
  in which two arms' predictions are bit-identical or an arm's reported
  figures are not those of its predictions (test_dlrm_arm_figures_check).
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BENCH = os.path.join(ROOT, "bench", "dlrm.py")
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

TRAIN, TEST, DDP_STEPS, IDS = 8000, 2000, 2, 2000


def test_dlrm_tiny_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "dlrm.json"
    argv = [PY, BENCH, "--ids", str(IDS), "--train", str(TRAIN), "--test", str(TEST), "--ddp-steps", str(DDP_STEPS),
            "--json", str(out), "--timeout", "240"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=280, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"arm"')]
    arms = {row["arm"]: row for row in lines}
    assert sorted(arms) == ["a", "b", "b2", "c"], r.stdout
    teacher = arms["a"]["teacher_auc"]
    assert 0.75 < teacher < 1.0, arms["a"]
    assert 0.0 < arms["a"]["teacher_logloss"] < 0.69, arms["a"]
    for name, row in arms.items():
        assert row["ids"] == IDS
        # every arm evaluates on the same test logs: the same teacher beside it
        assert row["teacher_auc"] == teacher and row["teacher_logloss"] == arms["a"]["teacher_logloss"], row
        assert row["samples_per_second"] > 0 and row["seconds"] > 0, row
        assert 0.0 < row["test_logloss"] < 5.0, row
    # distinct models, but b and b2 (one training path through psd) may end
    # alike when their pushes reached psd in the same order
    digests = [arms[name]["predictions_sha256"] for name in ("a", "b", "c")]
    assert len(set(digests)) == len(digests), arms
    assert arms["b2"]["predictions_sha256"] not in (arms["a"]["predictions_sha256"], arms["c"]["predictions_sha256"])
    for name in ("a", "b", "b2"):
        row = arms[name]
        assert row["samples"] == TRAIN, row  # one pass: 2 workers share it
        assert 0.6 < row["test_auc"] <= teacher + 0.01, row
    # DDP: its steps on 2 ranks, batch 256 each
    assert arms["c"]["samples"] == 2 * DDP_STEPS * 256, arms["c"]
    assert 0.3 < arms["c"]["test_auc"] < 1.0, arms["c"]
    ratios = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"ratios"')]
    assert len(ratios) == 1, r.stdout
    for key in ("b/a samples/s at %d" % IDS, "b/c samples/s at %d" % IDS, "b-a AUC at %d" % IDS,
                "b2-a AUC at %d" % IDS, "teacher-b AUC at %d" % IDS):
        assert key in ratios[0]["ratios"], ratios
    want = arms["b"]["samples_per_second"] / arms["a"]["samples_per_second"]
    assert ratios[0]["ratios"]["b/a samples/s at %d" % IDS] == pytest.approx(want, rel=1e-2)
    assert "| %d | b2 |" % IDS in r.stdout
    saved = json.loads(out.read_text())
    assert [row["arm"] for row in saved["rows"]] == [row["arm"] for row in lines]
    assert saved["ratios"] == ratios[0]["ratios"]


def test_dlrm_bad_arm():
    """An arm the bench does not know is refused by name, before any work."""
    r = subprocess.run([PY, BENCH, "--arms", "a,x"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "unknown arm 'x'" in r.stderr, r.stderr


def _bench_module():
    spec = importlib.util.spec_from_file_location("dlrm_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dlrm_arm_figures_check(tmp_path):
    """The driver's check of each arm's figures: taken from the arm's own
    predictions file, refused when they differ from what the arm printed,
    when the file is missing, and when two arms' predictions are identical
    (one arm's figures taken from the other's model)."""
    dlrm = _bench_module()
    rng = np.random.default_rng(5)
    y = (rng.random(1000) < 0.3).astype(np.float32)
    np.save(str(tmp_path / "test_y.npy"), y)
    pa = np.clip(0.3 + 0.4 * (y - 0.3) + 0.2 * rng.standard_normal(1000), 0.01, 0.99).astype(np.float32)
    pb = np.clip(pa + 0.05 * rng.standard_normal(1000), 0.01, 0.99).astype(np.float32)
    d = str(tmp_path)
    want_a = {"test_auc": round(dlrm.auc(y, pa), 5), "test_logloss": round(dlrm.logloss(pa, y), 5)}
    want_b = {"test_auc": round(dlrm.auc(y, pb), 5), "test_logloss": round(dlrm.logloss(pb, y), 5)}
    assert want_a != want_b
    seen = {}
    with pytest.raises(SystemExit, match="wrote no predictions"):
        dlrm.arm_figures(d, "a", want_a, seen)
    np.save(dlrm.pred_file(d, "a"), pa)
    got = dlrm.arm_figures(d, "a", want_a, seen)
    assert {k: got[k] for k in want_a} == want_a and len(got["predictions_sha256"]) == 16
    # arm b printing arm a's figures while its predictions say otherwise
    np.save(dlrm.pred_file(d, "b"), pb)
    with pytest.raises(SystemExit, match="reported"):
        dlrm.arm_figures(d, "b", want_a, dict(seen))
    assert dlrm.arm_figures(d, "b", want_b, dict(seen))["predictions_sha256"] != got["predictions_sha256"]
    # arm b evaluated with arm a's model: the same predictions
    np.save(dlrm.pred_file(d, "b"), pa)
    with pytest.raises(SystemExit, match="arms a and b have bit-identical test predictions"):
        dlrm.arm_figures(d, "b", want_a, dict(seen))
    # arms b and b2, both through psd, may end alike (the same pushes in the
    # same order); arm c may not end as either
    np.save(dlrm.pred_file(d, "b"), pb)
    psd_seen = dict(seen)
    dlrm.arm_figures(d, "b", want_b, psd_seen)
    np.save(dlrm.pred_file(d, "b2"), pb)
    assert dlrm.arm_figures(d, "b2", want_b, psd_seen)["predictions_sha256"] == \
        dlrm.arm_figures(d, "b", want_b, {})["predictions_sha256"]
    np.save(dlrm.pred_file(d, "c"), pb)
    with pytest.raises(SystemExit, match="arms b2 and c have bit-identical test predictions"):
        dlrm.arm_figures(d, "c", want_b, psd_seen)


def test_dlrm_test_set_independent_of_train(tmp_path):
    """The planted teacher and the test logs are the same whatever the
    number of training samples, so runs of different lengths are measured
    on the same test samples against the same teacher; the training logs
    of the longer run differ (not a copy of the shorter one's)."""
    pytest.importorskip("torch")
    dlrm = _bench_module()
    base = dict(seed=1, test=500, zipf=1.1, tail_rank=20.0, emb_scale=1.0, active=0.97, logit_std=2.0, ctr=0.25)
    dirs = []
    for train in (1000, 3000):
        d = tmp_path / ("train-%d" % train)
        d.mkdir()
        dlrm.make_logs(argparse.Namespace(train=train, **base), 300, str(d))
        dirs.append(d)
    for name in ("test_keys", "test_dense", "test_y", "test_p"):
        x, y = (np.load(str(d / (name + ".npy"))) for d in dirs)
        assert x.shape == y.shape and np.array_equal(x, y), name
    short, long = (np.load(str(d / "train_keys.npy")) for d in dirs)
    assert short.shape == (1000, 26) and long.shape == (3000, 26)
    # the training samples are a draw of their own, not the test set's
    assert not np.array_equal(np.load(str(dirs[0] / "test_keys.npy")), short[:500])
