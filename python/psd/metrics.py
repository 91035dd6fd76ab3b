"""psd.metrics: measures of a model's predictions that the examples, the
benchmarks and the tests share.

    from psd import metrics
    metrics.auc(labels, scores)     # area under the ROC curve, ties counted half

auc is the rank-sum (Mann-Whitney U) form: sort the scores once, give tied
scores their mean rank, and count the pairs of a positive and a negative
that the scores order right, a tie as half a pair. NumPy only; the order of
the arguments is scikit-learn's roc_auc_score's.
"""

import numpy as np

__all__ = ["auc"]


def auc(labels, scores):
    """The area under the ROC curve of scores for binary labels: the share
    of (positive, negative) pairs whose positive scores higher, a tie
    counting one half. labels are 0/1 (or False/True) and scores any real
    numbers, as arrays, lists or tensors of one value per sample. Returns a
    float in [0, 1]; NaN when labels hold only one class (no pair). Raises
    ValueError when the two differ in length, a label is neither 0 nor 1,
    or a score is NaN."""
    y = np.asarray(labels).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError("auc: %d labels but %d scores" % (y.size, s.size))
    if y.dtype != np.bool_:
        if not np.all((y == 0) | (y == 1)):
            raise ValueError("auc: labels must be 0 or 1")
        y = y == 1
    if np.isnan(s).any():
        raise ValueError("auc: a score is NaN")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    # each distinct score's ranks are last-count+1 .. last (1-based): their mean
    _, inv, cnt = np.unique(s, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(cnt) - (cnt - 1) / 2.0
    rank_sum = mean_rank[inv.reshape(-1)][y].sum()
    return float((rank_sum - pos * (pos + 1) / 2.0) / (pos * neg))
