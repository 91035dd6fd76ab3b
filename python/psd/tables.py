"""Embedding tables from Python (proto/PROTOCOL.md section 13): the methods
psd.Client has for them, declaring a table and moving its rows by key."""

import numpy as np

from ._lib import lib


class TableCalls:
    """psd.Client's table methods (a mixin: it uses the client's _check and
    _handle, and its _tables: name -> dim)."""

    def table(self, name, dim, init="uniform", scale=None, seed=0, opt="adagrad", **hp):
        """Declares embedding table name after connect(): rows of dim float32
        values addressed by 64-bit keys, starting as "uniform"
        (uniform(-scale, scale), scale 1/sqrt(dim) by default: the default,
        as psd.torch.Embedding's), "normal" (normal(0, scale), scale 1 by
        default) or "zeros", a function of (seed, key) alone, updated by opt
        ("sgd", "adagrad", "adam": lazy, per-row steps, "ftrl") with its
        hyper-parameters as keywords (lr, eps, beta1, beta2, iacc, beta, l1,
        l2). Every worker declares it alike."""
        if scale is None:
            scale = 1.0 / int(dim) ** 0.5 if init == "uniform" and int(dim) > 0 else 1.0 if init == "normal" else 0.0
        text = ",".join("%s=%r" % (k, float(v)) for k, v in hp.items())
        self._check(lib.psc_table(self._handle(), str(name).encode(), int(dim), str(init).encode(), float(scale),
                                  int(seed), str(opt).encode(), text.encode()))
        self._tables[str(name)] = int(dim)

    def _table_dim(self, name):
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError("no table called %r (declare it with table() first)" % (name,)) from None

    @staticmethod
    def _keys(keys):
        k = np.asarray(keys)
        if k.dtype.kind not in "iu":
            raise TypeError("keys must be integers, not %s" % k.dtype)
        # aligned too: the library reads them as uint64_t (a view into a
        # bytes buffer at an odd offset is copied)
        return np.require(k.reshape(-1).astype(np.uint64, copy=False), np.uint64, ("C", "A"))

    def _rows(self, a, n, dim, what):
        a = np.require(a, np.float32, ("C", "A"))
        if a.size != n * dim:
            raise ValueError("%s has %d values for %d keys of dim %d" % (what, a.size, n, dim))
        return a

    def pull_rows(self, name, keys, out=None):
        """The rows of keys (any integer array; repeats allowed) of table
        name, as a float32 array of shape (len(keys), dim); into out when given."""
        dim = self._table_dim(name)
        k = self._keys(keys)
        rows = np.empty((k.size, dim), np.float32) if out is None else out
        self._rows(rows, k.size, dim, "out")
        if not rows.flags.c_contiguous or not rows.flags.aligned or rows.dtype != np.float32:
            raise ValueError("out must be a C-contiguous, aligned float32 array")
        self._check(lib.psc_table_pull(self._handle(), name.encode(), k.ctypes.data, k.size, rows.ctypes.data))
        return rows

    def push_rows(self, name, keys, grads):
        """Pushes the row gradients grads ((len(keys), dim) float32) of keys
        of table name; a key that repeats has its gradients summed."""
        dim = self._table_dim(name)
        k = self._keys(keys)
        g = self._rows(grads, k.size, dim, "grads")
        self._check(lib.psc_table_push(self._handle(), name.encode(), k.ctypes.data, k.size, g.ctypes.data))

    def pushpull_rows(self, name, keys, grads, next_keys):
        """push_rows(name, keys, grads), then pull_rows(name, next_keys)."""
        dim = self._table_dim(name)
        k, nk = self._keys(keys), self._keys(next_keys)
        g = self._rows(grads, k.size, dim, "grads")
        rows = np.empty((nk.size, dim), np.float32)
        self._check(lib.psc_table_pushpull(self._handle(), name.encode(), k.ctypes.data, k.size, g.ctypes.data,
                                           nk.ctypes.data, nk.size, rows.ctypes.data))
        return rows
