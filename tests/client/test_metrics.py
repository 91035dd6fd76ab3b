"""test_metrics.py - psd.metrics.auc, the AUC the examples, the benchmarks
and the tests share (ctest: client_python_metrics): a case worked by hand
with ties, the edges (perfect, reversed, all tied, one class), the inputs
it takes and refuses, and random cases with many ties against a count of
every (positive, negative) pair.
"""

import math

import numpy as np
import pytest

from psd import metrics


def test_hand_computed_case_with_ties():
    # positives score 0.9, 0.5, 0.3; negatives 0.9, 0.3, 0.1. Of the 9
    # pairs, 0.9 beats 0.3 and 0.1 and ties 0.9 (2.5), 0.5 beats 0.3 and
    # 0.1 (2), 0.3 ties 0.3 and beats 0.1 (1.5): 6 / 9. In ranks: 0.1 is
    # 1, 0.3 2.5 (2 and 3), 0.5 4, 0.9 5.5 (5 and 6); the positives' sum
    # 5.5 + 4 + 2.5 = 12, less 3 * 4 / 2 = 6, over 3 * 3.
    labels = [1, 0, 1, 0, 1, 0]
    scores = [0.9, 0.9, 0.5, 0.3, 0.3, 0.1]
    assert metrics.auc(labels, scores) == pytest.approx(2 / 3, abs=1e-15)
    # the samples' order does not matter
    p = [5, 3, 0, 4, 1, 2]
    assert metrics.auc([labels[i] for i in p], [scores[i] for i in p]) == pytest.approx(2 / 3, abs=1e-15)


def test_edges():
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.2, 0.7, 0.8, 0.3, 0.9])
    assert metrics.auc(y, s) == 1.0
    assert metrics.auc(y, -s) == 0.0
    assert metrics.auc(y, np.full(6, 0.25)) == 0.5  # every pair a tie
    assert math.isnan(metrics.auc([1, 1, 1], [0.1, 0.2, 0.3]))
    assert math.isnan(metrics.auc([0, 0], [0.1, 0.2]))


def test_inputs_it_takes():
    want = metrics.auc([1, 0, 1, 0], [0.8, 0.4, 0.4, 0.1])
    assert want == pytest.approx(0.875)  # 4 pairs: 1 + 1 + 0.5 + 1
    assert metrics.auc(np.array([True, False, True, False]), np.array([0.8, 0.4, 0.4, 0.1], np.float32)) == want
    assert metrics.auc(np.array([1.0, 0.0, 1.0, 0.0], np.float32), [8, 4, 4, 1]) == want
    assert metrics.auc(np.array([[1], [0], [1], [0]]), np.array([[0.8], [0.4], [0.4], [0.1]])) == want


def test_inputs_it_refuses():
    with pytest.raises(ValueError, match="3 labels but 2 scores"):
        metrics.auc([1, 0, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match="0 or 1"):
        metrics.auc([1, 0, 2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="0 or 1"):
        metrics.auc([1, 0, 0.5], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="NaN"):
        metrics.auc([1, 0, 1], [0.1, float("nan"), 0.3])


def pairs_auc(y, s):
    """Every (positive, negative) pair counted: 1 when the positive scores
    higher, 1/2 for a tie."""
    pos, neg = s[y == 1], s[y == 0]
    right = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return right / (len(pos) * len(neg))


def test_random_cases_with_many_ties_against_every_pair():
    rng = np.random.default_rng(7)
    for n in (2, 3, 10, 101, 1000):
        for _ in range(20):
            y = rng.integers(0, 2, n)
            if y.min() == y.max():
                y[0] = 1 - y[0]
            s = rng.integers(0, 5, n) * 0.25  # few distinct scores: ties everywhere
            assert metrics.auc(y, s) == pytest.approx(pairs_auc(y, s), abs=1e-12)
            u = rng.random(n)  # distinct scores
            assert metrics.auc(y, u) == pytest.approx(pairs_auc(y, u), abs=1e-12)
