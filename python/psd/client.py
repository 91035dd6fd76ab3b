"""psd.Client: one worker's connection to psd, over libpsclient with ctypes.
Its table methods are in tables.py, its plan's in planning.py."""

import ctypes
import time

import numpy as np

from ._lib import lib
from .errors import PsdError, _EINTR
from .options import _OPTIONS, _opt_text
from .planning import PlanCalls
from .signals import _run_signal_handlers, _stop_on_sigterm, _stop_signal, _wakeup_fd
from .tables import TableCalls


class Client(TableCalls, PlanCalls):
    """One worker's connection to psd (or to several psd sharing the model).

    tensors: the layout, a list of (name, shape) pairs or a dict of them in
    order; every worker of a job declares the same. (name, shape, rule) or
    (name, shape, rule, dtype) declares a buffer: a tensor psd keeps but
    does not train, whose place in grads holds the worker's values at a
    push, combined by rule "mean" or "first" (shard 0's); dtype ("F32",
    "F64", "I64", "I32") is how `psctl save` writes it (docs/client.md).
    Keyword options are libpsclient's, every one of its table
    (psd.options(), docs/client.md): server ("host:port" or
    "host:port,host:port"; a part's replicas "host:port/host:port"),
    shard ("K/M" or "auto": mpirun, srun, torchrun and Kubernetes
    environments), token_file, timeout_ms, wire
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
        if options.get("interrupt") in (None, True, "on") and options.get("wakeup_fd") is None:
            fd = _wakeup_fd()  # a signal on any thread, or just before a wait, ends the wait
            if fd is not None:
                self._check(lib.psc_set(c, b"wakeup_fd", str(fd).encode()))
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
    def lag(self):
        """How far behind its leader the psd that answered the last pull was,
        in bytes of the leader's log it had not applied (a read replica,
        option reader); -1 from a leader, or before any pull."""
        return int(lib.psc_lag(self._handle()))

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
