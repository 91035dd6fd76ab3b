"""test_mnist.py - psd.mnist, the IDX loader the examples and benchmarks
share (ctest: client_python_mnist): small IDX files written here, plain and
gzipped, good, missing, truncated and malformed; the project's MNIST when
data/ has it; and the NumPy example's message when its data is missing.
"""

import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from psd import mnist

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
N = 5


def idx_bytes(arr):
    """arr (uint8) as an IDX file, written from the format's description
    (magic 0 0 8 ndim, then each dimension as a big-endian uint32)."""
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    return head + arr.tobytes()


def write_set(root, dataset="mnist", split="train", gz=False, images=None, labels=None):
    """Writes SPLIT-images-idx3-ubyte and SPLIT-labels-idx1-ubyte under
    root/dataset; returns (images, labels, images' path, labels' path)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (N, 28, 28), dtype=np.uint8) if images is None else images
    y = rng.integers(0, 10, N, dtype=np.uint8) if labels is None else labels
    d = os.path.join(str(root), dataset)
    os.makedirs(d, exist_ok=True)
    paths = []
    for name, arr in (("images-idx3", x), ("labels-idx1", y)):
        p = os.path.join(d, "%s-%s-ubyte" % (split, name)) + (".gz" if gz else "")
        with (gzip.open if gz else open)(p, "wb") as f:
            f.write(idx_bytes(arr))
        paths.append(p)
    return x, y, paths[0], paths[1]


def normalised(x, mean, std):
    return (x.astype(np.float32) / np.float32(255) - np.float32(mean)) / np.float32(std)


@pytest.mark.parametrize("gz", [False, True])
def test_good_files(tmp_path, gz):
    x, y, _, _ = write_set(tmp_path, gz=gz)
    gx, gy = mnist.load(str(tmp_path), "train")
    assert gx.dtype == np.float32 and gx.shape == (N, 28, 28)
    assert gy.dtype == np.int64 and gy.tolist() == y.tolist()
    assert np.array_equal(gx, normalised(x, 0.1307, 0.3081))
    lx, ly = mnist.load(str(tmp_path), "train", limit=2)
    assert np.array_equal(lx, gx[:2]) and ly.tolist() == y[:2].tolist()
    assert mnist.read_idx(os.path.join(str(tmp_path), "mnist", "train-labels-idx1-ubyte")).tolist() == y.tolist()


def test_fashion_stats_and_plain_file_first(tmp_path):
    x, y, _, _ = write_set(tmp_path, dataset="fashion-mnist", split="t10k")
    # a stale .gz beside the plain file: the plain one is read
    write_set(tmp_path, dataset="fashion-mnist", split="t10k", gz=True,
              images=np.zeros((N, 28, 28), np.uint8), labels=np.zeros(N, np.uint8))
    gx, gy = mnist.load(str(tmp_path), "t10k", dataset="fashion-mnist")
    assert np.array_equal(gx, normalised(x, 0.2860, 0.3530)) and gy.tolist() == y.tolist()
    with pytest.raises(ValueError, match="unknown data set 'kmnist'"):
        mnist.load(str(tmp_path), "t10k", dataset="kmnist")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(mnist.MnistError) as e:
        mnist.load(str(tmp_path), "train")
    want = os.path.join(str(tmp_path), "mnist", "train-images-idx3-ubyte")
    assert str(e.value) == "%s is missing (and so is %s.gz)" % (want, want)
    _, _, _, labels = write_set(tmp_path)
    os.unlink(labels)
    with pytest.raises(mnist.MnistError, match="train-labels-idx1-ubyte is missing"):
        mnist.load(str(tmp_path), "train")


@pytest.mark.parametrize("cut", [1, 28 * 28, 28 * 28 * N, 28 * 28 * N + 10])
def test_truncated_file_is_named(tmp_path, cut):
    _, _, images, _ = write_set(tmp_path)
    with open(images, "rb") as f:
        data = f.read()
    with open(images, "wb") as f:
        f.write(data[:-cut])
    with pytest.raises(mnist.MnistError) as e:
        mnist.load(str(tmp_path), "train")
    assert str(e.value).startswith(images + " is truncated: %d bytes" % (len(data) - cut)), str(e.value)


def test_truncated_gz_is_named(tmp_path):
    _, _, images, _ = write_set(tmp_path, gz=True)
    with open(images, "rb") as f:
        data = f.read()
    with open(images, "wb") as f:
        f.write(data[:len(data) // 2])
    with pytest.raises(mnist.MnistError, match="^%s: cannot read it: " % images):
        mnist.load(str(tmp_path), "train")


def test_longer_than_header_and_not_idx(tmp_path):
    _, _, images, labels = write_set(tmp_path)
    with open(labels, "ab") as f:
        f.write(b"\0")
    with pytest.raises(mnist.MnistError, match="labels-idx1-ubyte is longer than its header says: %d bytes "
                                               "where its header \\(%d\\) says %d" % (8 + N + 1, N, 8 + N)):
        mnist.load(str(tmp_path), "train")
    with open(images, "r+b") as f:
        f.write(b"\0\0\x0d\x03")                 # float32 elements: not ours
    with pytest.raises(mnist.MnistError, match="images-idx3-ubyte is not an IDX file of unsigned bytes "
                                               "\\(its first 4 bytes are 00000d03\\)"):
        mnist.load(str(tmp_path), "train")
    open(images, "wb").close()
    with pytest.raises(mnist.MnistError, match="first 4 bytes are missing"):
        mnist.load(str(tmp_path), "train")


def test_images_and_labels_must_agree(tmp_path):
    write_set(tmp_path, labels=np.zeros(N - 1, np.uint8))
    with pytest.raises(mnist.MnistError, match="train-labels-idx1-ubyte holds %d labels for %d images" % (N - 1, N)):
        mnist.load(str(tmp_path), "train")
    write_set(tmp_path, images=np.zeros((N, 14, 56), np.uint8), labels=np.zeros(N, np.uint8))
    with pytest.raises(mnist.MnistError, match="holds %d x 14 x 56, not images of 28 x 28" % N):
        mnist.load(str(tmp_path), "train")


def test_the_projects_mnist():
    data = os.environ.get("PSD_DATA_DIR", os.path.join(ROOT, "data"))
    if not os.path.exists(os.path.join(data, "mnist", "t10k-labels-idx1-ubyte")):
        pytest.skip("no MNIST under %s (scripts/setup.sh fetches it)" % data)
    x, y = mnist.load(data, "t10k", limit=100)
    assert x.shape == (100, 28, 28) and y.shape == (100,)
    assert y[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]       # the test set's well-known first labels
    assert x.min() == np.float32(-0.1307) / np.float32(0.3081)      # a black pixel
    full, _ = mnist.load(data, "t10k")
    assert len(full) == 10000 and np.array_equal(full[:100], x)


def test_numpy_example_names_the_missing_file(tmp_path):
    """softmax.py without its data says which file and exits 1, before
    connecting anywhere."""
    r = subprocess.run([PY, os.path.join(ROOT, "examples", "numpy", "softmax.py"), "--data", str(tmp_path),
                        "--server", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    want = os.path.join(str(tmp_path), "mnist", "train-images-idx3-ubyte")
    assert r.returncode == 1 and r.stderr == "softmax.py: %s is missing (and so is %s.gz)\n" % (want, want), \
        (r.returncode, r.stderr)
