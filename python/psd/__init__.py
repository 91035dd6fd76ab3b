"""psd: train your own model through the psd parameter server.

A binding over libpsclient (the C client library, include/psd/client.h)
with ctypes: the parameters and gradients are NumPy arrays that are the
library's own vectors (or yours, bound with Client.bind), so a push or a
pull moves no data through Python, and every call that waits on the
network releases the GIL (ctypes does, around each library call).

    import psd
    c = psd.Client([("w", (784, 10)), ("b", (10,))], server="127.0.0.1:7000", shard="0/2")
    c.params[:] = initial_values       # the model, if this worker is the first
    c.connect()
    for x, y in batches:
        c.grads[:] = gradient(c.tensor("w"), c.tensor("b"), x, y)
        c.pushpull()                   # c.params now holds psd's new values

In bsp a worker may follow psd's plan of the job instead of counting its
own epochs and steps (docs/client.md, "A job by psd's plan"):

    c.plan_set(epochs=5, samples=len(x), batch=192, seed=1)  # before connect
    c.connect()
    for idx in c.plan_batches(len(x)):  # this worker's samples of each round
        c.grads[:] = gradient(c.params, x[idx], y[idx])
        c.pushpull()                     # ends after the plan's last round

psd.torch wraps a torch.nn.Module the same way (see psd/torch.py);
psd.mnist loads MNIST and Fashion-MNIST from their IDX files, normalised
as psworker does (see psd/mnist.py).
"""

import collections
import ctypes
import os
import signal
import sys
import threading
import time

try:
    import numpy as np
except ImportError as e:
    raise ImportError("psd needs NumPy, which this Python (%s) cannot import (%s): on Debian install it with "
                      "`apt-get install python3-numpy` and run Debian's /usr/bin/python3, or install numpy into "
                      "this Python's environment" % (sys.executable, e)) from None

from ._lib import lib, PSC_CODES
from .plan import Plan, Slice, epoch_order
from . import mnist
from .wait import WaitNotice

__all__ = ["Client", "PsdError", "Option", "Plan", "Slice", "WaitNotice", "epoch_order", "error_name", "options",
           "strerror", "mnist", "__version__"]

__version__ = lib.psc_version_string().decode()


def strerror(code):
    """A short description of a libpsclient error code."""
    return lib.psc_strerror(int(code)).decode()


def error_name(code):
    """The symbolic name of a libpsclient error code ("ELAYOUT"), or "E?"."""
    return PSC_CODES.get(-abs(int(code)), "E?")


class PsdError(Exception):
    """A libpsclient call failed: .code (negative), .name ("ELAYOUT", ...)
    and the library's one-line message."""

    def __init__(self, code, message):
        self.code = code
        self.name = error_name(code)
        super().__init__("%s [%s]" % (message, self.name))


# One of libpsclient's options: name (the keyword of Client), flag
# (psworker's, without "--"; None: none), arg (the value's form), values
# (what a value may be), default and help, as the library's table holds them.
Option = collections.namedtuple("Option", ("name", "flag", "arg", "values", "default", "help"))


def _read_options():
    out = []
    i = 0
    while True:
        p = lib.psc_option(i)
        if not p:
            return tuple(out)
        o = p.contents
        out.append(Option(*(None if v is None else v.decode() for v in
                            (o.name, o.flag, o.arg, o.values, o.dflt, o.help))))
        i += 1


_OPTION_LIST = _read_options()
# the keyword arguments of Client: the library's options, from its own table
_OPTIONS = tuple(o.name for o in _OPTION_LIST)


def options():
    """libpsclient's options, in its table's order: Option tuples (name,
    flag, arg, values, default, help). Client takes each name as a keyword
    argument; a bool is sent as "on" or "off"."""
    return _OPTION_LIST

_EINTR = -27
_stop_signal = [None]  # the name of the signal that stopped a wait ("SIGTERM"), when ours


def _on_sigterm(signum, frame):
    _stop_signal[0] = "SIGTERM"
    raise KeyboardInterrupt("SIGTERM")


def _stop_on_sigterm():
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, when nobody chose
    what it does (its handler is the default) and we are on the main
    thread (the only one that may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # an embedded interpreter without signals
        pass


def _run_signal_handlers():
    """A library call ended by a signal (EINTR): run Python's handlers now
    (SIGINT's raises KeyboardInterrupt) rather than at some later bytecode."""
    ctypes.pythonapi.PyErr_CheckSignals()


def _opt_text(value):
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class Client:
    """One worker's connection to psd (or to several psd sharing the model).

    tensors: the layout, a list of (name, shape) pairs or a dict of them in
    order; every worker of a job declares the same. (name, shape, rule) or
    (name, shape, rule, dtype) declares a buffer: a tensor psd keeps but
    does not train, whose place in grads holds the worker's values at a
    push, combined by rule "mean" or "first" (shard 0's); dtype ("F32",
    "F64", "I64", "I32") is how `psctl save` writes it (docs/client.md).
    Keyword options are libpsclient's, every one of its table
    (psd.options(), docs/client.md): server ("host:port" or
    "host:port,host:port"), shard ("K/M" or "auto": mpirun, srun, torchrun
    and Kubernetes environments), token_file, timeout_ms, wire
    ("f32"/"bf16"), shm (bool), compress ("auto" or a bool), chunk,
    pull_window, interrupt (bool, default True here: Ctrl-C or SIGTERM
    while a call waits for psd ends it with KeyboardInterrupt and the client
    says bye; False waits through signals), ...; a bool goes as "on" or
    "off", None leaves the library's default.
    connect=True connects at once (after init, when given, was copied into
    the parameters).

    Not thread-safe: one thread at a time per Client (the library's own
    threads send heartbeats while you compute).
    """

    def __init__(self, tensors, connect=False, init=None, **options):
        self._c = None
        self._bound = (None, None)
        self._since = None  # time.monotonic() when the step in flight began (waited())
        self._tables = {}  # declared embedding tables: name -> dim
        c = lib.psc_new()
        if not c:
            raise MemoryError("psc_new: out of memory")
        self._c = c
        for key, value in options.items():
            if key not in _OPTIONS:
                raise TypeError("unknown option %r (one of %s)" % (key, ", ".join(_OPTIONS)))
            if value is None:
                continue
            self._check(lib.psc_set(c, key.encode(), _opt_text(value).encode()))
        if options.get("interrupt") is None:
            self._check(lib.psc_set(c, b"interrupt", b"on"))
        items = tensors.items() if isinstance(tensors, dict) else tensors
        self._buffers = {}
        for item in items:
            try:
                name, shape, *buf = item
                if len(buf) > 2:
                    raise ValueError
            except (TypeError, ValueError):
                raise TypeError("a tensor is a (name, shape) pair, or (name, shape, rule[, dtype]) for a buffer, "
                                "not %r" % (item,)) from None
            if isinstance(shape, int):
                shape = (shape,)
            shape = tuple(int(d) for d in shape)
            dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
            if buf:
                rule, dtype = buf[0], buf[1] if len(buf) > 1 else None
                self._check(lib.psc_add_buffer(c, str(name).encode(), len(shape), dims, str(rule).encode(),
                                               str(dtype).encode() if dtype is not None else None))
                self._buffers[str(name)] = (str(rule), str(dtype or "F32"))
            else:
                self._check(lib.psc_add_tensor(c, str(name).encode(), len(shape), dims))
        self._shapes = {}
        self._offsets = {}
        for i in range(lib.psc_tensor_count(c)):
            name = ctypes.c_char_p()
            ndim = ctypes.c_uint32()
            dims = (ctypes.c_uint64 * 6)()
            off = ctypes.c_uint64()
            cnt = ctypes.c_uint64()
            lib.psc_tensor_info(c, i, ctypes.byref(name), ctypes.byref(ndim), dims, ctypes.byref(off),
                                ctypes.byref(cnt))
            key = name.value.decode()
            self._shapes[key] = tuple(dims[k] for k in range(ndim.value))
            self._offsets[key] = (off.value, cnt.value)
        self.size = int(lib.psc_size(c))
        self._own_params = self._wrap(lib.psc_params(c))
        self._own_grads = self._wrap(lib.psc_grads(c))
        self._params, self._grads = self._own_params, self._own_grads
        if init is not None:
            self.params[:] = np.asarray(init, dtype=np.float32).reshape(-1)
        if connect:
            self.connect()

    # ---- plumbing ---------------------------------------------------------

    def _handle(self):
        if self._c is None:
            raise PsdError(-6, "the client is freed")
        return self._c

    def _check(self, rc):
        if rc == _EINTR:
            _run_signal_handlers()  # raises KeyboardInterrupt for Ctrl-C and SIGTERM
        if rc != 0:
            raise PsdError(rc, lib.psc_errmsg(self._c).decode(errors="replace"))
        return rc

    def _wrap(self, ptr):
        if not ptr:
            self._check(-6 if self.size == 0 else -18)
        buf = (ctypes.c_float * self.size).from_address(ptr)
        buf._owner = self  # the array keeps the client, and so its memory, alive
        return np.frombuffer(buf, dtype=np.float32)

    # ---- layout and buffers ----------------------------------------------

    @property
    def params(self):
        """The parameter vector (size float32 values) that pulls write:
        the library's own, or the array given to bind(). Write into it
        (c.params[:] = values); the attribute itself cannot be replaced."""
        return self._params

    @params.setter
    def params(self, value):
        raise AttributeError("Client.params cannot be replaced: it is the vector the library pulls into and "
                             "psd's initial model comes from; copy into it (c.params[:] = values), or use your own "
                             "array with c.bind(params=array)")

    @property
    def grads(self):
        """The gradient vector (size float32 values) that pushes read:
        the library's own, or the array given to bind(). Write into it
        (c.grads[:] = gradient); the attribute itself cannot be replaced."""
        return self._grads

    @grads.setter
    def grads(self, value):
        raise AttributeError("Client.grads cannot be replaced: it is the vector the library pushes from; copy "
                             "into it (c.grads[:] = gradient), or use your own array with c.bind(grads=array)")

    @property
    def tensors(self):
        """{name: shape} in layout order."""
        return dict(self._shapes)

    @property
    def buffers(self):
        """{name: (rule, dtype)} of the layout's buffers (tensors psd keeps
        but does not train: a push carries their values)."""
        return dict(self._buffers)

    def offset(self, name):
        """(offset, count) of tensor name in the flat vectors."""
        try:
            return self._offsets[name]
        except KeyError:
            raise KeyError("no tensor called %r (the layout has %s)" % (name, ", ".join(self._shapes))) from None

    def tensor(self, name):
        """Tensor name of the parameters: a view, shaped."""
        off, cnt = self.offset(name)
        return self.params[off:off + cnt].reshape(self._shapes[name])

    def grad(self, name):
        """Tensor name of the gradients: a view, shaped (write into it)."""
        off, cnt = self.offset(name)
        return self.grads[off:off + cnt].reshape(self._shapes[name])

    @staticmethod
    def _vector(a, what, n):
        if not isinstance(a, np.ndarray):
            raise TypeError("%s must be a numpy.ndarray, not %s" % (what, type(a).__name__))
        if a.dtype != np.float32:
            raise TypeError("%s must be float32, not %s" % (what, a.dtype))
        if not a.flags.c_contiguous:
            raise ValueError("%s must be C-contiguous (use numpy.ascontiguousarray)" % what)
        if not a.flags.writeable:
            raise ValueError("%s must be writeable" % what)
        if a.size != n:
            raise ValueError("%s has %d values (shape %s), the model %d" % (what, a.size, a.shape, n))
        return a.ctypes.data

    def bind(self, params=None, grads=None):
        """Makes pulls write into params and pushes read from grads (float32,
        C-contiguous arrays of size values, any shape), with no copy; None
        takes the library's own vector again. The arrays are kept alive by
        the client while bound."""
        pp = self._vector(params, "params", self.size) if params is not None else None
        gp = self._vector(grads, "grads", self.size) if grads is not None else None
        if params is not None and grads is not None and pp == gp:
            raise ValueError("params and grads must be different arrays")
        self._check(lib.psc_bind(self._handle(), pp, gp))
        self._bound = (params, grads)
        flat = lambda a: a if a.ndim == 1 else a.reshape(-1)  # noqa: E731 (a view: contiguous)
        self._params = flat(params) if params is not None else self._own_params
        self._grads = flat(grads) if grads is not None else self._own_grads

    # ---- connecting and training -----------------------------------------

    def connect(self):
        """Connects (waiting for psd up to connect_s); the parameters as they
        are become the model when psd has none, else psd's values replace them.
        From here on SIGTERM raises KeyboardInterrupt as Ctrl-C does (when
        its handler was the default), and either one, while a call waits
        for psd, ends the wait at once: the client says bye to psd ("left:
        stopped by SIGINT") and the KeyboardInterrupt goes on up."""
        _stop_on_sigterm()
        self._stopping(lambda: self._check(lib.psc_connect(self._handle())))

    def _stopping(self, call):
        """Runs call(); a KeyboardInterrupt (Ctrl-C, SIGTERM) during it says
        bye to psd, with the signal as the reason, and goes on up."""
        try:
            return call()
        except KeyboardInterrupt:
            sig, _stop_signal[0] = _stop_signal[0] or "SIGINT", None
            self.close(reason="stopped by %s" % sig)
            raise

    def _step(self, fn):
        """Runs a step of the library, timed for waited()."""
        h = self._handle()
        self._since = time.monotonic()
        try:
            self._stopping(lambda: self._check(fn(h)))
        finally:
            self._since = None

    def pushpull(self):
        """Pushes the gradients, pulls the new parameters (bsp: after the round)."""
        self._step(lib.psc_pushpull)

    def push(self):
        self._step(lib.psc_push)

    def pull(self):
        self._step(lib.psc_pull)

    def local_step(self):
        """In a local-SGD or elastic-averaging job (psd's local_steps,
        elastic_alpha): after your own optimizer's step on params, counts
        it and every H-th (tau-th) exchanges the model with psd (the round's
        mean model, or the move towards psd's centre, lands in params).
        Returns True after an exchange, False after a step that sent
        nothing. PsdError (ESTATE) in any other job."""
        h = self._handle()
        self._since = time.monotonic()
        try:
            rc = self._stopping(lambda: (lambda r: r if r >= 0 else self._check(r))(lib.psc_local_step(h)))
        finally:
            self._since = None
        return rc == 1

    @property
    def local_steps(self):
        """H of a local-SGD job (psd's local_steps), 0 in any other."""
        return int(lib.psc_local_steps(self._handle()))

    @property
    def elastic(self):
        """(alpha, tau) of an elastic-averaging job, None in any other."""
        a, t = ctypes.c_double(), ctypes.c_uint32()
        if not lib.psc_elastic(self._handle(), ctypes.byref(a), ctypes.byref(t)):
            return None
        return a.value, t.value

    def _range(self, fn, off, length):
        if int(off) < 0 or int(length) <= 0:
            raise ValueError("a range needs off >= 0 and length >= 1, not (%d, %d)" % (off, length))
        self._check(fn(self._handle(), int(off), int(length)))

    def push_range(self, off, length):
        self._range(lib.psc_push_range, off, length)

    def pull_range(self, off, length):
        self._range(lib.psc_pull_range, off, length)

    def push_tensor(self, name):
        self.offset(name)
        self._check(lib.psc_push_tensor(self._handle(), name.encode()))

    def pull_tensor(self, name):
        self.offset(name)
        self._check(lib.psc_pull_tensor(self._handle(), name.encode()))

    # ---- embedding tables (proto/PROTOCOL.md section 13) -------------------

    def table(self, name, dim, init="zeros", scale=0.0, seed=0, opt="adagrad", **hp):
        """Declares embedding table name after connect(): rows of dim float32
        values addressed by 64-bit keys, starting as "zeros", "uniform"
        (uniform(-scale, scale)) or "normal" (normal(0, scale)), a function of
        (seed, key) alone, updated by opt ("sgd", "adagrad", "adam": lazy,
        per-row steps, "ftrl") with its hyper-parameters as keywords (lr, eps,
        beta1, beta2, iacc, beta, l1, l2). Every worker declares it alike."""
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
        return np.ascontiguousarray(k.reshape(-1).astype(np.uint64, copy=False))

    def _rows(self, a, n, dim, what):
        a = np.ascontiguousarray(a, dtype=np.float32)
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
        if not rows.flags.c_contiguous or rows.dtype != np.float32:
            raise ValueError("out must be a C-contiguous float32 array")
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

    def pushpull_start(self, base=None):
        """pushpull on the library's thread; compute on other memory, then wait().
        base: the model version the gradient was computed on, if older."""
        if base is not None:
            self._check(lib.psc_set_base(self._handle(), int(base)))
        self._check(lib.psc_pushpull_start(self._handle()))
        self._since = time.monotonic()

    def wait(self):
        try:
            self._check(lib.psc_wait(self._handle()))
        finally:
            self._since = None

    def poll(self):
        """True when the step started by pushpull_start is done."""
        done = bool(lib.psc_poll(self._handle()))
        if done:
            self._since = None
        return done

    def waiting_for(self):
        """What psd said the step in flight waits for, e.g. "round 0 waits
        for shard 1/2 (never joined)" or "psd is paused (psctl resume)"
        (proto/PROTOCOL.md, HEARTBEAT), or None: no step in flight, it has
        not waited (psd answers the library's heartbeats a third of its
        heartbeat_timeout or less after the wait began), or an older psd.
        With several psd, the last one that spoke. Unlike the other calls
        it may be made from another thread while one is inside a step
        (psd.WaitNotice does)."""
        h = self._handle()
        buf = ctypes.create_string_buffer(256)
        n = lib.psc_waiting_for(h, buf, len(buf))
        if n == 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            n = lib.psc_waiting_for(h, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") or None

    def waited(self):
        """Seconds the step in flight (pushpull, push, pull, or one started
        by pushpull_start) has been going on; 0.0 without one. May be
        called from another thread, as waiting_for()."""
        since = self._since
        return time.monotonic() - since if since is not None else 0.0

    def report(self, epoch, loss, accuracy=None, test_loss=0.0, samples=0, rate=0.0):
        """Tells psd this worker's progress (psctl status shows it)."""
        acc = -1.0 if accuracy is None else float(accuracy)
        self._check(lib.psc_report(self._handle(), int(epoch), float(loss), acc, float(test_loss), int(samples),
                                   float(rate)))

    def progress(self, epoch, loss_sum, n):
        """After a step: n samples whose losses sum to loss_sum, in epoch
        `epoch` (epochs done). Every report_s seconds (option, default 1)
        the library tells psd the mean loss since its last report, for
        psctl and the dashboard."""
        self._check(lib.psc_progress(self._handle(), int(epoch), float(loss_sum), int(n)))

    def live_shards(self):
        """(rank, count): this worker among the shards psd still counts."""
        r, n = ctypes.c_uint32(), ctypes.c_uint32()
        self._check(lib.psc_live_shards(self._handle(), ctypes.byref(r), ctypes.byref(n)))
        return r.value, n.value

    def reconnect(self):
        self._check(lib.psc_reconnect(self._handle()))

    # ---- a BSP job's plan ----------------------------------------------------

    def plan_set(self, epochs, samples, batch, seed=0):
        """Proposes the job's plan, before connect(): `epochs` passes over
        `samples` training samples, `batch` of them (the global batch, all
        workers together) in each BSP round, in the order epoch_order(
        samples, seed, epoch). psd takes the first worker's plan (plan()
        tells the job's) and tells each worker its part of every round
        (plan_slice()). 1 <= epochs <= 2^20, 1 <= samples <= 2^40,
        1 <= batch <= samples, 0 <= seed < 2^64. psd ignores it in asgd
        and ssp."""
        vals = []
        for what, v in (("epochs", epochs), ("samples", samples), ("batch", batch), ("seed", seed)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError("plan_set: %s must be an int, not %s" % (what, type(v).__name__))
            if not 0 <= int(v) < 1 << 64:
                raise ValueError("plan_set: %s must be >= 0 and < 2^64, not %d" % (what, v))
            vals.append(int(v))
        self._check(lib.psc_plan_set(self._handle(), *vals))

    def plan(self):
        """The job's plan (a Plan: epochs, samples, batch, seed), which may
        be another worker's, or None when psd runs none (not bsp, no worker
        proposed one, or not connected yet)."""
        v = [ctypes.c_uint64() for _ in range(4)]
        if not lib.psc_plan(self._handle(), *[ctypes.byref(x) for x in v]):
            return None
        return Plan(*(x.value for x in v))

    def plan_slice(self):
        """This worker's part of the round the last pull (connect, pull,
        pushpull) opened: a Slice (epoch, lo, hi, rank, count), positions
        [lo, hi) of epoch `epoch`'s order, or None when psd gave no part
        (no plan, or the plan is done)."""
        e, lo, hi = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        rank, count = ctypes.c_uint32(), ctypes.c_uint32()
        if not lib.psc_plan_slice(self._handle(), ctypes.byref(e), ctypes.byref(lo), ctypes.byref(hi),
                                  ctypes.byref(rank), ctypes.byref(count)):
            return None
        return Slice(e.value, lo.value, hi.value, rank.value, count.value)

    def plan_done(self):
        """True once psd said the plan's last round has closed: stop (the
        final model is in psd; a push now is dropped)."""
        return bool(lib.psc_plan_done(self._handle()))

    def plan_batches(self, samples=None, shuffle=True):
        """Yields this worker's sample indices for each round of the job's
        plan, until the plan is done: a numpy int64 array, positions
        [lo, hi) of the round's epoch order, which may be empty (a round
        too small to share: push a zero gradient). After each yield push
        the gradient of those samples with a pull (pushpull(), or push()
        then pull()): that pull opens the next round and says its part.

        samples: the size of your training set; the plan's must not exceed
        it (every worker indexes the same data). shuffle=False trains each
        epoch in index order (psworker --no-shuffle); otherwise the order is
        epoch_order(plan.samples, plan.seed, epoch), the same on every
        worker of the job, Python or psworker. Raises PsdError (ESTATE)
        when psd runs no plan or a round goes by without a pull."""
        plan = self.plan()
        if plan is None:
            raise PsdError(-6, "psd runs no plan for this job (it needs bsp, and plan_set() before connect())")
        if samples is not None and int(samples) < plan.samples:
            raise ValueError("the job's plan has %d samples, this worker's training set %d"
                             % (plan.samples, int(samples)))
        order, order_epoch = None, None
        last = None
        while not self.plan_done():
            sl = self.plan_slice()
            if sl is None:
                raise PsdError(-6, "psd runs a plan but gave this worker no part of round %d" % self.version)
            at = (self.version, sl)
            if at == last:
                raise PsdError(-6, "round %d is still open: push its gradient with a pull (pushpull()) "
                                   "before taking the next batch" % self.version)
            last = at
            if order_epoch != sl.epoch:
                order = epoch_order(plan.samples, plan.seed, sl.epoch) if shuffle else None
                order_epoch = sl.epoch
            if order is None:
                yield np.arange(sl.lo, sl.hi, dtype=np.int64)
            else:
                yield order[sl.lo:sl.hi]

    # ---- what psd said -----------------------------------------------------

    @property
    def mode(self):
        return lib.psc_mode(self._handle()).decode()

    @property
    def version(self):
        return int(lib.psc_model_version(self._handle()))

    @property
    def shard(self):
        k, m = ctypes.c_uint32(), ctypes.c_uint32()
        lib.psc_shard(self._handle(), ctypes.byref(k), ctypes.byref(m))
        return k.value, m.value

    @property
    def servers(self):
        return int(lib.psc_servers(self._handle()))

    @property
    def wire(self):
        return lib.psc_wire(self._handle()).decode()

    @property
    def shm(self):
        return bool(lib.psc_shm(self._handle()))

    @property
    def table_shm(self):
        """True when every psd mapped this worker's table segment: table
        pulls and pushes go through shared memory (PROTOCOL.md 13.9)."""
        return bool(lib.psc_table_shm(self._handle()))

    @property
    def hogwild(self):
        """True when psd runs a Hogwild! job and this worker steps straight
        into psd's model (PROTOCOL.md section 8): a push is w -= lr * g
        applied here, at psd's lr, and sends nothing."""
        return bool(lib.psc_hogwild(self._handle()))

    def hogwild_params(self):
        """psd's model itself (a float32 array of size values that the
        other workers write at the same time) while hogwild is True, else
        None. Its memory stays at one address until the client is freed,
        across reconnects: bind(params=c.hogwild_params()) and pulls copy
        nothing."""
        ptr = lib.psc_hogwild_params(self._handle())
        return self._wrap(ptr) if ptr else None

    @property
    def reconnects(self):
        return int(lib.psc_reconnects(self._handle()))

    @property
    def lost_steps(self):
        return int(lib.psc_lost_steps(self._handle()))

    @property
    def dropped(self):
        return int(lib.psc_dropped(self._handle()))

    # ---- closing -----------------------------------------------------------

    def close(self, reason=None):
        """Says goodbye to psd (BYE). reason, a short text such as "stopped
        by SIGTERM", is what psd shows for this worker: "left: REASON" in
        its log and the WHY column of psctl status (printable ASCII, cut
        at 95 bytes there; without it "said bye"). The arrays stay readable
        until the client is garbage; calls that talk to psd raise PsdError
        ESTATE. A second close does nothing."""
        if reason is not None and not isinstance(reason, str):
            raise TypeError("reason must be a str, not %s" % type(reason).__name__)
        if reason is not None and "\0" in reason:
            raise ValueError("reason must not hold a NUL character")
        if self._c is not None:
            lib.psc_leave(self._c, reason.encode("utf-8", errors="replace") if reason else None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(reason=None if exc[0] is None else "%s in the worker" % exc[0].__name__)
        return False

    def __del__(self):
        c, self._c = getattr(self, "_c", None), None
        if c:
            lib.psc_free(c)
