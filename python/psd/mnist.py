"""psd.mnist: MNIST and Fashion-MNIST from their IDX files, as NumPy arrays.

    from psd import mnist
    x, y = mnist.load("data", "train")             # x float32 [60000, 28, 28], y int64 [60000]
    tx, ty = mnist.load("data", "t10k", limit=1000, dataset="fashion-mnist")

The files are DATA/DATASET/SPLIT-images-idx3-ubyte and
DATA/DATASET/SPLIT-labels-idx1-ubyte (SPLIT "train" or "t10k"), each plain
or gzipped with ".gz" added, as scripts/setup.sh places them. Pixels become
(p / 255 - mean) / std in float32 with the data set's usual constants
(STATS), the normalisation psworker applies, so a model trained in Python
and one trained by psworker see the same inputs.

A file that is missing, truncated or not an IDX file of unsigned bytes
raises MnistError, whose message names the file; nothing here exits the
program (the examples turn the error into their own message).
"""

import gzip
import math
import os
import zlib

import numpy as np

__all__ = ["MnistError", "STATS", "load", "read_idx"]

# the data sets' pixel mean and standard deviation (of p / 255), as
# psworker's (worker/dataset.c)
STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}


class MnistError(Exception):
    """An IDX file is missing, truncated or malformed; the message names it."""


def read_idx(path):
    """The IDX file at path (or path + ".gz" when path itself does not
    exist) as a read-only uint8 array of the shape its header declares.
    Raises MnistError when neither file exists, when the file is not an IDX
    file of unsigned bytes, or when its size differs from what the header
    declares (a truncated download, say)."""
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            break
    else:
        raise MnistError("%s is missing (and so is %s.gz)" % (path, path))
    try:
        with (gzip.open if p.endswith(".gz") else open)(p, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # unreadable, or a broken .gz
        raise MnistError("%s: cannot read it: %s" % (p, e)) from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] == 0:
        raise MnistError("%s is not an IDX file of unsigned bytes (its first 4 bytes are %s)"
                         % (p, data[:4].hex() or "missing"))
    ndim = data[3]
    head = 4 + 4 * ndim
    if len(data) < head:
        raise MnistError("%s is truncated: %d bytes, its header alone takes %d" % (p, len(data), head))
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    want = head + math.prod(dims)
    if len(data) != want:
        raise MnistError("%s is %s: %d bytes where its header (%s) says %d" %
                         (p, "truncated" if len(data) < want else "longer than its header says", len(data),
                          " x ".join(map(str, dims)), want))
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(dims)


def load(data, split, limit=None, dataset="mnist"):
    """(images, labels) of one split ("train" or "t10k") of dataset (a key
    of STATS) under the directory data: images float32 [N, 28, 28],
    normalised as the module's header says; labels int64 [N]. limit keeps
    only the first limit samples (None: all). Raises MnistError (see
    read_idx), and also when the two files hold different numbers of
    samples or the images are not 28 x 28."""
    if dataset not in STATS:
        raise ValueError("psd.mnist: unknown data set %r (known: %s)" % (dataset, ", ".join(STATS)))
    base = os.path.join(data, dataset, split)
    x = read_idx(base + "-images-idx3-ubyte")
    y = read_idx(base + "-labels-idx1-ubyte")
    if x.ndim != 3 or x.shape[1:] != (28, 28):
        raise MnistError("%s-images-idx3-ubyte holds %s, not images of 28 x 28" %
                         (base, " x ".join(map(str, x.shape))))
    if y.ndim != 1 or len(y) != len(x):
        raise MnistError("%s-labels-idx1-ubyte holds %s labels for %d images" %
                         (base, " x ".join(map(str, y.shape)), len(x)))
    mean, std = STATS[dataset]
    x, y = x[:limit], y[:limit]
    return (x.astype(np.float32) / 255.0 - mean) / std, y.astype(np.int64)
