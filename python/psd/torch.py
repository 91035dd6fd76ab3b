"""psd.torch: train any torch.nn.Module through psd.

    model = Net()
    ps = psd.torch.Worker(model, server="127.0.0.1:7000", shard="auto")
    for x, y in loader:
        ps.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        ps.step()            # push the gradients, bring psd's new parameters

Every parameter of the module becomes a view into one flat float32 vector
that libpsclient pulls into directly, and its .grad a view into one flat
vector the library pushes from: a step copies nothing in Python and nothing
in the library either when psd runs on the same machine (the vectors are
then the shared segment psd reads and writes). psd's server-side optimizer
does the update (choose it in psd's configuration: optimizer, lr, ...), so
no torch.optim optimizer is needed. The layout is the module's
named_parameters(), in order, then its named_buffers() (buffers="mean" or
"first": psd keeps them but does not train them; a step pushes their
values and brings psd's back): every worker of a job must build the same
module. Heartbeats go on from the library's own thread while the model
computes.

Pipelining (Worker(..., pipeline=True), for ASGD and SSP): step() sends
the gradient on the library's thread and returns at once, and the next
batch computes on the parameters of the step before while it travels
(the next step() waits for it first). The step's round trip to psd then
overlaps the next forward and backward pass instead of following it; each
gradient is one step staler than without (psd hears its true base
version). The module's parameters and gradients alternate between two
pairs of flat vectors the worker allocates, bound to the library in
turn, so the library copies (in C, on its own thread, while the module
computes) the gradient into psd's shared segment and the parameters out
of it. finish() waits for the step in flight (pull(), report() and
close() call it), so the module holds the newest parameters there, e.g.
before evaluating.

CUDA: a module on a GPU keeps its parameters there; the flat vectors stay
in host memory, pinned when CUDA is available, and step() copies the
gradients down and the parameters back up (asynchronous copies from pinned
memory). Tested on CPU only in this project's suite.

Local SGD and elastic averaging (psd's local_steps, elastic_alpha;
docs/training.md): each worker trains its own copy of the model with its
own torch optimizer, and step() exchanges it with psd every H (tau) steps
only; give the Worker that optimizer:

    ps = psd.torch.Worker(model, server=..., shard="auto")
    ps.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        ps.zero_grad()
        F.nll_loss(model(x), y).backward()
        ps.step()            # the optimizer's step; every H-th, the exchange

A BSP job by psd's plan (docs/client.md): make the worker with
connect=False, propose the plan through its client, and train the samples
psd hands out until the plan is done:

    ps = psd.torch.Worker(model, connect=False, server=..., shard="auto")
    ps.client.plan_set(epochs=5, samples=len(dataset), batch=192, seed=1)
    ps.connect()
    for idx in ps.client.plan_batches(len(dataset)):   # numpy indices
        ps.zero_grad()
        x, y = collate(dataset, idx)
        F.nll_loss(model(x), y).backward()
        ps.step()

ASGD, BSP and SSP, one psd or a model split over several
(server="host:port,host:port"; a part's replicas "host:port/host:port"),
the wire type and every other option are those of psd.Client
(docs/client.md).

Embedding tables (proto/PROTOCOL.md section 13): psd.torch.Embedding and
psd.torch.EmbeddingBag take nn.Embedding's and nn.EmbeddingBag's arguments
and hold no parameters; their rows live in psd, addressed by 64-bit keys
(ids below num_embeddings, or with num_embeddings=None any key: hashed
raw features, no vocabulary), each with its optimizer state there (the
table's own optimizer, opt=...). A forward pass pulls the rows of the
batch's distinct keys, one request per table; backward keeps their row
gradients, as it adds to a parameter's .grad, and step() pushes them,
summed per key over every backward since zero_grad() (a table used twice
in a pass, or two modules sharing one table=, push once), then the dense
part (so a bsp round applies both). Put them in the module the Worker
wraps: the Worker declares their tables when it connects (named table=,
or by the module's path in the model):

    class CTR(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = psd.torch.EmbeddingBag(None, 16, mode="sum", opt="adagrad", lr=0.05)   # table "emb"
            self.top = torch.nn.Linear(16, 1)
        def forward(self, keys, offsets):
            return self.top(self.emb(keys, offsets))
    ps = psd.torch.Worker(CTR(), server=..., shard="auto")

model.state_dict() has no rows (it warns so); psd.torch.state_dict(model)
adds them as each table's "PATH.weight", which plain PyTorch loads into
the same model built with nn.Embedding/nn.EmbeddingBag.
"""

import sys
import warnings

import numpy as np
import torch

import psd as _psd

# the dtype `psctl save` writes a buffer as, by the buffer's own (values
# travel as float32: integers exact up to 2^24)
_SAVE_DT = {torch.float32: "F32", torch.float16: "F32", torch.bfloat16: "F32", torch.float64: "F64",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I32", torch.int8: "I32", torch.uint8: "I32",
            torch.bool: "I32"}


class Worker:
    """Binds module's parameters and gradients to a psd.Client and connects.

    The module's current parameters are this worker's initial model: if it
    is the first to reach psd they become the job's model, otherwise psd's
    values replace them. options go to psd.Client (server, shard,
    token_file, wire, shm, timeout_ms, reconnect_s, connect_s, ...).
    pipeline: True overlaps each step's round trip with the next batch's
    computation (ASGD and SSP, parameters on the CPU: see above).
    wait_notice: while a step has waited for psd over 2 s, say on stderr
    how long and for whom, as psworker's progress line does ("worker 0/2:
    waiting 12 s for psd: round 0 waits for shard 1/2 (never joined)",
    psd.WaitNotice); None (the default) does when stderr is a terminal,
    True always, False never.
    buffers: what becomes of the module's buffers (BatchNorm's
    running_mean, running_var, num_batches_tracked, any register_buffer):
    "mean" (the default): psd keeps them with the model, untrained, and
    sets them to the mean of the workers' values (a BSP round's mean; in
    asgd each push moves them 1/workers of the way to its own); "first":
    shard 0's values, as DistributedDataParallel's broadcast_buffers;
    None: each worker keeps its own and psd knows nothing of them. With
    "mean" or "first" psd's checkpoints and `psctl save` hold
    them under the module's names (integers as I64), so the saved file
    loads with load_state_dict(strict=True).
    optimizer: a torch optimizer of the module's parameters, which step()
    runs in a job psd runs with local SGD or elastic averaging (needed
    there, unused otherwise; may be set later as .optimizer).
    """

    def __init__(self, module, connect=True, pipeline=False, wait_notice=None, buffers="mean", optimizer=None,
                 **options):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("psd.torch.Worker wraps a torch.nn.Module, not %s" % type(module).__name__)
        self.module = module
        self.optimizer = optimizer
        self.averaging = False  # psd runs local SGD or elastic averaging (known at connect)
        self._params = [(n, p) for n, p in module.named_parameters()]
        self._has_tables = any(isinstance(m, _Table) for m in module.modules())
        self._row_grads = {}  # the tables' row gradients until step() pushes them (step_tables)
        if not self._params and not self._has_tables:
            raise ValueError("the module has no parameters to train (and no psd.torch tables)")
        for n, p in self._params:
            if p.dtype != torch.float32:
                raise TypeError("parameter %s is %s: psd trains float32 parameters (module.float())" % (n, p.dtype))
        if buffers not in ("mean", "first", None):
            raise ValueError("buffers must be \"mean\" (psd keeps the mean of the workers' buffers), \"first\" "
                             "(shard 0's, as DistributedDataParallel's broadcast_buffers) or None (each worker "
                             "keeps its own), not %r" % (buffers,))
        self.buffers = buffers
        # the module's buffers (BatchNorm's running statistics, ...): psd
        # keeps them beside the parameters, untrained (module's notes)
        self._bufs = _persistent_buffers(module) if buffers else []
        for n, b in self._bufs:
            if _SAVE_DT.get(b.dtype) is None:
                raise TypeError("buffer %s is %s: psd keeps float and integer buffers (or Worker(buffers=None))"
                                % (n, b.dtype))
        layout = [(n, tuple(p.shape) if p.dim() else (1,)) for n, p in self._params]
        if not self._params:
            # a model of tables only: psd's layout needs a tensor, and a bsp
            # round closes on the dense push that follows the rows'; this
            # one holds nothing and its gradient stays 0
            layout.append((_TABLES_ONLY, (1,)))
        layout += [(n, tuple(b.shape) if b.dim() else (1,), buffers, _SAVE_DT[b.dtype]) for n, b in self._bufs]
        self.client = _psd.Client(layout, **options)
        # the library's vectors, as tensors sharing their memory
        self.flat_params = torch.from_numpy(self.client.params)
        self.flat_grads = torch.from_numpy(self.client.grads)
        self.device = self._params[0][1].device if self._params else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        if any(p.device != self.device for _, p in self._params):
            raise ValueError("all parameters must be on one device")
        with torch.no_grad():
            for n, p in self._params + self._bufs:
                off, cnt = self.client.offset(n)
                self.flat_params[off:off + cnt].copy_(p.detach().reshape(-1).cpu().to(torch.float32))
        if self.cuda:
            # device copies of the flat vectors; host ones pinned for fast copies
            self._dev_params = self.flat_params.to(self.device)
            self._dev_grads = torch.zeros_like(self._dev_params)
            self._host_pinned = torch.cuda.is_available()
        self.pipeline = bool(pipeline)
        if self.pipeline and self.cuda:
            raise ValueError("pipeline=True needs the module's parameters on the CPU")
        if self.pipeline and self._has_tables:
            raise ValueError("pipeline=True is not for modules with psd.torch embedding tables: a forward pass "
                             "pulls their rows while the step before would still be in flight")
        # the pairs of flat vectors the module computes on: the library's
        # own, or (pipeline) two pairs of the worker's, bound in turn; not
        # the library's own then, which are psd's shared segment: psd
        # writes a step's answer there while the module computes
        self._pairs = [(self.flat_params, self.flat_grads)]
        if self.pipeline:
            self._pairs = [(self.flat_params.clone(), torch.zeros_like(self.flat_grads)),
                           (torch.empty_like(self.flat_params), torch.zeros_like(self.flat_grads))]
            self._pair_np = [(a.numpy(), g.numpy()) for a, g in self._pairs]
            self.client.bind(*self._pair_np[0])  # connect's initial values and first pull
        self._cur = 0            # the pair the module computes on
        self._cur_version = 0    # the model version of that pair's parameters
        self._inflight = False
        self._views()
        if wait_notice is None:
            wait_notice = sys.stderr is not None and sys.stderr.isatty()
        self._notice = _psd.WaitNotice(self.client) if wait_notice else None
        if connect:
            self.connect()

    def _views(self):
        """Points every parameter's .data and .grad at its slice of the flat
        vectors (on the device for CUDA; of the current pair)."""
        params = self._dev_params if self.cuda else self._pairs[self._cur][0]
        grads = self._dev_grads if self.cuda else self._pairs[self._cur][1]
        self._grad_views = []
        for n, p in self._params:
            off, cnt = self.client.offset(n)
            p.data = params[off:off + cnt].view(p.shape)
            g = grads[off:off + cnt].view(p.shape)
            p.grad = g
            self._grad_views.append(g)
        for n, b in self._bufs:
            if b.dtype == torch.float32:  # others are copied at each step
                off, cnt = self.client.offset(n)
                b.data = params[off:off + cnt].view(b.shape)

    def _buffers_out(self, grads):
        """A push carries the buffers' values in their places of the
        gradient vector (psd combines them, buffers= rule)."""
        with torch.no_grad():
            for n, b in self._bufs:
                off, cnt = self.client.offset(n)
                grads[off:off + cnt].copy_(b.detach().reshape(-1).to(torch.float32))

    def _buffers_in(self):
        """psd's values of the buffers that are not views (integers, or
        all on a GPU) into the module, after a pull."""
        with torch.no_grad():
            for n, b in self._bufs:
                if b.dtype == torch.float32 and not self.cuda:
                    continue  # a view: the pull wrote it
                off, cnt = self.client.offset(n)
                src = self.flat_params if self.cuda else self._pairs[self._cur][0]
                v = src[off:off + cnt].view(b.shape)
                b.copy_(v.round() if not b.dtype.is_floating_point else v)

    def _gather_stray_grads(self):
        """A parameter whose .grad something replaced (set_to_none, a new
        tensor): copy it into the flat vector and view it again."""
        for (n, p), g in zip(self._params, self._grad_views):
            if p.grad is None:
                g.zero_()
                p.grad = g
            elif p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
                p.grad = g

    def connect(self):
        """Connects and gets the model (our parameters if psd has none), and
        declares the module's embedding tables. If that fails (psd refuses
        the layout or a table's declaration, the job's mode does not suit
        the options, ...), the worker says bye and frees its shard before
        the error goes up: a corrected Worker may connect at once."""
        try:
            self._connect()
        except BaseException as e:
            try:
                self.client.close(reason="%s while connecting" % type(e).__name__)
            except Exception:  # noqa: BLE001 (the first error is the one to raise)
                pass
            raise

    def _connect(self):
        self.client.connect()
        if self._has_tables:
            _attach_tables(self.module, self.client, self._row_grads)
        if self.client.hogwild:
            self._hogwild()
        self._after_pull()
        if self.pipeline and self.client.mode == "bsp":
            self.client.close(reason="pipeline=True in a bsp job")
            raise ValueError("pipeline=True is for asgd and ssp: a bsp round wants the gradient of its own "
                             "parameters (psd runs bsp)")
        self._cur_version = self.client.version
        self.averaging = bool(self.client.local_steps or self.client.elastic)
        if self.averaging and self.pipeline:
            self.client.close(reason="pipeline=True in a job averaging models")
            raise ValueError("pipeline=True overlaps pushes of gradients; psd runs %s, whose exchanges are of "
                             "models" % ("local SGD" if self.client.local_steps else "elastic averaging"))
        if self._notice is not None:
            k, m = self.client.shard
            self._notice.prefix = "worker %d/%d: " % (k, m)
            self._notice.start()

    def _hogwild(self):
        """A Hogwild! job: the module's parameters become views of psd's
        model itself, which this process and the other workers update in
        place; a step applies lr * gradient there (in the library, one pass)
        and copies nothing."""
        if self.pipeline:
            self.client.close(reason="pipeline=True in a Hogwild! job")
            raise ValueError("pipeline=True overlaps a step's round trip with the next batch; a Hogwild! step "
                             "(psd runs hogwild = on) has none: leave pipeline off")
        if self._has_tables:
            self.client.close(reason="embedding tables in a Hogwild! job")
            raise ValueError("psd.torch embedding tables push their rows to psd; a Hogwild! job (hogwild = on) "
                             "steps the dense model in place: use a psd without hogwild")
        hw = self.client.hogwild_params()
        self.client.bind(params=hw, grads=self.flat_grads.numpy())
        self.flat_params = torch.from_numpy(hw)
        self._pairs = [(self.flat_params, self.flat_grads)]
        self._views()

    def _after_pull(self):
        if self.cuda:
            self._dev_params.copy_(self.flat_params, non_blocking=self._host_pinned)
        self._buffers_in()

    def _before_push(self):
        self._gather_stray_grads()
        if self.cuda:
            self.flat_grads.copy_(self._dev_grads)
        self._buffers_out(self.flat_grads if self.cuda else self._pairs[self._cur][1])

    def zero_grad(self):
        """Zeroes the gradients in place (they stay views), and drops the
        tables' row gradients kept since the last step."""
        self._row_grads.clear()
        (self._dev_grads if self.cuda else self._pairs[self._cur][1]).zero_()
        self._gather_stray_grads()

    def step(self):
        """After loss.backward(): pushes the gradients (the tables' rows
        first: the row gradients of every backward since zero_grad(), summed
        per key) and brings psd's new parameters into the module (bsp: after
        the round closes). With
        pipeline=True: sends them and returns at once; the module then holds
        the parameters of the step before (see the module's notes)."""
        if self._has_tables:
            # the rows first, so that a bsp round applies them with the dense part
            step_tables(self.client, self._row_grads, [m for _, m in _tables(self.module)])
        if self.pipeline:
            self._pipelined_step()
            return
        if self.averaging:
            self._local_step()
            return
        self._before_push()
        self.client.pushpull()
        self._after_pull()

    def _local_step(self):
        """Local SGD, elastic averaging: the optimizer's step on our own
        model; every H-th (tau-th) the library exchanges it with psd."""
        if self.optimizer is None:
            raise ValueError("psd runs %s: each worker trains its own model with its own optimizer; give the "
                             "Worker one (Worker(..., optimizer=torch.optim.SGD(module.parameters(), lr=0.1)) or "
                             "worker.optimizer = ...)"
                             % ("local SGD" if self.client.local_steps else "elastic averaging"))
        self.optimizer.step()
        with torch.no_grad():
            if self.cuda:
                self.flat_params.copy_(self._dev_params)
            self._buffers_out(self.flat_params)  # the buffers that are no views
        if self.client.local_step():
            self._cur_version = self.client.version
            self._after_pull()

    def _pipelined_step(self):
        self._gather_stray_grads()
        cur, other = self._cur, 1 - self._cur
        self._buffers_out(self._pairs[cur][1])
        if self._inflight:
            # the step before: its answer is in the other pair's parameters
            self._inflight = False
            self.client.wait()
            other_version = self.client.version
        else:
            self._pairs[other][0].copy_(self._pairs[cur][0])
            other_version = self._cur_version
        # the answer lands in the pair this gradient was computed on
        self.client.bind(*self._pair_np[cur])
        self.client.pushpull_start(base=self._cur_version)
        self._inflight = True
        self._cur, self._cur_version = other, other_version
        self._views()

    def finish(self):
        """Waits for a pipelined step in flight and puts its parameters
        (the newest) in the module; nothing to do otherwise."""
        if not self._inflight:
            return
        self._inflight = False
        self.client.wait()
        done = 1 - self._cur
        self._pairs[self._cur][0].copy_(self._pairs[done][0])
        self._cur_version = self.client.version

    def step_start(self):
        """step() on the library's thread: returns at once. Until
        step_wait() the module's parameters and gradients must not be used."""
        self.finish()
        if self._has_tables:
            step_tables(self.client, self._row_grads, [m for _, m in _tables(self.module)])
        self._before_push()
        if self.pipeline:
            self.client.bind(*self._pair_np[self._cur])  # the module's pair, both ways
        self.client.pushpull_start()

    def step_wait(self):
        self.client.wait()
        self._cur_version = self.client.version
        self._after_pull()

    def pull(self):
        """Brings psd's newest parameters (e.g. before evaluating)."""
        self.finish()
        if self.pipeline:
            self.client.bind(*self._pair_np[self._cur])  # pull into the module's pair
        self.client.pull()
        self._cur_version = self.client.version
        self._after_pull()

    def progress(self, epoch, loss_sum, n):
        """After a step: see psd.Client.progress (psd hears of the loss every report_s seconds)."""
        self.client.progress(epoch, loss_sum, n)

    def report(self, epoch, loss, accuracy=None, test_loss=0.0, samples=0, rate=0.0):
        self.finish()
        self.client.report(epoch, loss, accuracy, test_loss, samples, rate)

    @property
    def version(self):
        return self.client.version

    @property
    def mode(self):
        return self.client.mode

    def close(self, reason=None):
        """Says goodbye to psd (after a step in flight); reason, if given,
        is what psd shows for this worker (psctl status)."""
        try:
            self.finish()
        finally:
            if self._notice is not None:
                self._notice.stop()
            self.client.close(reason=reason)


def _persistent_buffers(module):
    """(name, buffer) of module's buffers that are part of its state_dict
    (register_buffer(..., persistent=False) ones are not: a causal mask)."""
    out, seen = [], set()
    for path, m in module.named_modules():
        skip = getattr(m, "_non_persistent_buffers_set", ())
        for n, b in m._buffers.items():
            if b is not None and n not in skip and id(b) not in seen:
                seen.add(id(b))
                out.append(((path + "." if path else "") + n, b))
    return out


# the one tensor of a model of tables only (Worker)
_TABLES_ONLY = "psd.tables_only"


class _Table(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table's declaration, the
    client (set when the Worker connects, or by attach()), and the row
    gradients of the backward passes since the last step, which step()
    pushes, summed per key (as PyTorch sums a sparse gradient's repeats)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, device=None, dtype=None, table=None,
                 init="uniform", scale=None, seed=0, opt="adagrad", kind="Embedding", **hp):
        super().__init__()
        if isinstance(num_embeddings, str):
            # the old form, Embedding("name", dim, ...): the table's name first
            if table is not None:
                raise TypeError("psd.torch.%s(%r, ...): give the table's name once, as table=" % (kind, num_embeddings))
            table, num_embeddings = num_embeddings, None
        if num_embeddings is not None:
            if isinstance(num_embeddings, bool) or not isinstance(num_embeddings, int) or num_embeddings < 1:
                raise TypeError("psd.torch.%s: num_embeddings is a positive int (keys 0..num_embeddings-1, as "
                                "nn.%s's) or None (any 64-bit key: hashed features), not %r"
                                % (kind, kind, num_embeddings))
        if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
            raise TypeError("psd.torch.%s: embedding_dim is a positive int, not %r" % (kind, embedding_dim))
        if _weight is not None:
            raise ValueError("psd.torch.%s: _weight is not taken: the rows live in psd, started by init= (\"uniform\", "
                             "\"normal\", \"zeros\"); to start from given rows, push them (see docs/tables.md)" % kind)
        if dtype is not None and dtype != torch.float32:
            raise ValueError("psd.torch.%s: psd's rows are float32, not %s" % (kind, dtype))
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError("psd.torch.%s: the rows come from psd into host memory (device=None or \"cpu\"); the "
                             "output goes to the input's device" % kind)
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
                raise TypeError("psd.torch.%s: padding_idx is an int key, not %r" % (kind, padding_idx))
            if num_embeddings is not None:
                if not -num_embeddings <= padding_idx < num_embeddings:
                    raise ValueError("psd.torch.%s: padding_idx must be within num_embeddings (%d), not %d"
                                     % (kind, num_embeddings, padding_idx))
                padding_idx %= num_embeddings
        if max_norm is not None and not float(max_norm) > 0:
            raise ValueError("psd.torch.%s: max_norm must be positive, not %r" % (kind, max_norm))
        for k, v in hp.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError("psd.torch.%s: %s=%r: keyword arguments beyond PyTorch's are the table optimizer's "
                                "numeric hyper-parameters (lr, eps, beta1, beta2, iacc, beta, l1, l2)" % (kind, k, v))
        if table is not None:
            table = str(table)
            if not 1 <= len(table) <= 63 or any(not 0x21 <= ord(c) <= 0x7e for c in table):
                raise ValueError("psd.torch.%s: table name %r: 1..63 printable ASCII bytes without space" % (kind, table))
        self.num_embeddings = num_embeddings
        self.embedding_dim = int(embedding_dim)
        self.padding_idx = padding_idx
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)  # psd's rows are always updated sparsely: kept for PyTorch's code
        self.table = table  # None: named after the module's path when the Worker connects
        if scale is None:
            scale = 1.0 / self.embedding_dim ** 0.5 if init == "uniform" else 1.0 if init == "normal" else 0.0
        self._decl = dict(init=init, scale=float(scale), seed=int(seed), opt=opt, **hp)
        self.client = None
        self._grads = None  # {table: [(keys, row grads), ...]} of the backward passes since the last step
        # prefetch(): the next forward's keys, [flat keys, distinct keys,
        # inverse, rows once a step has pulled them]
        self._next = None

    def extra_repr(self):
        s = "%s, %d, table=%r" % (self.num_embeddings, self.embedding_dim, self.table)
        if self.padding_idx is not None:
            s += ", padding_idx=%d" % self.padding_idx
        if self.max_norm is not None:
            s += ", max_norm=%g" % self.max_norm
        return s

    def attach(self, client, name=None, grads=None):
        """Declares the table to psd through client (a connected psd.Client).
        name: the table's name when the module was given none (table=).
        grads: where backward keeps the row gradients until step_tables()
        pushes them (the Worker's, shared by its tables)."""
        if self.table is None:
            if name is None:
                raise ValueError("this %s has no table name: give it table=\"name\"" % type(self).__name__)
            self.table = name
        client.table(self.table, self.embedding_dim, **self._decl)
        self.client = client
        self._grads = {} if grads is None else grads

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        warnings.warn("%s (psd table %r): its rows live in psd and are not in this state_dict; "
                      "psd.torch.state_dict(module) adds them as PyTorch's %s.weight (docs/training.md, "
                      "\"Coming from PyTorch\")" % (prefix.rstrip(".") or type(self).__name__, self.table, prefix),
                      UserWarning, stacklevel=4)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _flat_keys(self, keys):
        if keys.dtype not in (torch.int64, torch.int32):
            raise TypeError("keys must be int64 or int32, not %s" % keys.dtype)
        flat = keys.reshape(-1).to(torch.int64).cpu()
        if self.num_embeddings is not None and flat.numel():
            lo, hi = int(flat.min()), int(flat.max())
            if lo < 0 or hi >= self.num_embeddings:
                raise IndexError("index out of range in self: table %r has num_embeddings=%d, the input holds %d "
                                 "(num_embeddings=None takes any 64-bit key)"
                                 % (self.table, self.num_embeddings, lo if lo < 0 else hi))
        return flat

    def prefetch(self, input):
        """Names the keys of the next forward pass (its input, as that
        forward will take it) before this pass's step: step() then pushes
        this pass's row gradients and pulls those keys' rows in one round
        trip (psd.Client.pushpull_rows) instead of a push now and a pull in
        the next forward, which uses the rows if its input holds the same
        keys (and pulls as usual otherwise). In asgd and ssp; in a bsp job
        step() pushes alone (the round's update comes after it), and the
        next forward pulls."""
        flat = self._flat_keys(input)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        self._next = [flat, uniq, inverse, None]

    def _rows(self, keys):
        """The rows of keys' distinct keys as a tensor whose gradient backward
        keeps for step(), each key's index among them, and the index of
        padding_idx's key among them (None when absent)."""
        if self.client is None:
            raise RuntimeError("table %r has no psd client: wrap the model in psd.torch.Worker (or call attach)"
                               % self.table)
        flat = self._flat_keys(keys)
        nxt, self._next = self._next, None
        if nxt is not None and torch.equal(nxt[0], flat):
            uniq, inverse, rows = nxt[1], nxt[2], nxt[3]
            if rows is None:  # named, but no step pulled them
                rows = self.client.pull_rows(self.table, uniq.numpy())
            rows = torch.from_numpy(rows)
        else:
            uniq, inverse = torch.unique(flat, return_inverse=True)
            rows = torch.from_numpy(self.client.pull_rows(self.table, uniq.numpy()))
            if nxt is not None and nxt[3] is None:
                self._next = nxt  # named for a later pass (prefetch came before this one)
        pad = None
        if self.padding_idx is not None:
            at = (uniq == self.padding_idx).nonzero()
            if at.numel():
                pad = int(at[0, 0])
                rows[pad].zero_()  # as nn.Embedding's zero row at padding_idx
        if not torch.is_grad_enabled():
            return rows.to(keys.device), inverse.to(keys.device), pad
        rows.requires_grad_(True)
        grads, table = self._grads, self.table

        def keep(grad):
            # the gradient waits for step(), as a parameter's .grad does: a
            # second backward before it adds to it (gradient accumulation)
            g = grad.detach().cpu()
            k = uniq
            if pad is not None:
                k = torch.cat([uniq[:pad], uniq[pad + 1:]])
                g = torch.cat([g[:pad], g[pad + 1:]])
            grads.setdefault(table, []).append((k, g))
            return grad

        rows.register_hook(keep)
        return rows.to(keys.device), inverse.to(keys.device), pad


class Embedding(_Table):
    """torch.nn.Embedding with its rows in psd: Embedding(num_embeddings,
    embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
    scale_grad_by_freq=False, sparse=False, ...), PyTorch's signature.
    num_embeddings: keys 0..num_embeddings-1 (IndexError otherwise, as
    PyTorch's), or None: any int64 key (hashed features, no vocabulary).
    The output is the keys' rows, shape input.shape + (embedding_dim,).
    padding_idx: that key's row is zeros and gets no gradient; max_norm:
    rows are renormalized at each lookup (psd's stored rows are not
    rewritten); sparse: accepted, psd's rows are always updated sparsely.
    psd's own keywords: table= (the table's name; by default the module's
    path in the model the Worker wraps, e.g. "encoder.items"; modules given
    the same name share one table), init "uniform" (scale: the bound,
    default 1/sqrt(dim)), "normal" (scale: the std, default 1) or "zeros",
    seed, opt and its hyper-parameters (lr=..., ...) as psd.Client.table.
    Embedding("name", dim, ...), the old form, still names the table."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None,
                 **psd_kw):
        if _freeze:
            raise ValueError("psd.torch.Embedding: _freeze=True is not taken: psd trains the rows of every table "
                             "it holds (to use fixed rows, call it under torch.no_grad())")
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                         sparse, _weight, device, dtype, kind="Embedding", **psd_kw)

    def forward(self, input):
        rows, inverse, pad = self._rows(input)
        return torch.nn.functional.embedding(inverse.view(input.shape), rows, pad, self.max_norm, self.norm_type,
                                             self.scale_grad_by_freq)


class EmbeddingBag(_Table):
    """torch.nn.EmbeddingBag with its rows in psd: EmbeddingBag(
    num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
    scale_grad_by_freq=False, mode="mean", sparse=False,
    include_last_offset=False, padding_idx=None, ...), PyTorch's
    signature; forward(input, offsets=None, per_sample_weights=None) as
    PyTorch's: mode "sum", "mean" or "max" over each bag, input a 2-D
    tensor of keys (one bag a row) or a 1-D tensor with offsets,
    per_sample_weights with mode "sum", padding_idx's key left out of its
    bag. num_embeddings, max_norm, sparse and psd's own keywords (table=,
    init, scale, seed, opt, lr, ...) as Embedding's."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=False, _weight=None, include_last_offset=False, padding_idx=None, device=None,
                 dtype=None, **psd_kw):
        if mode not in ("sum", "mean", "max"):
            raise ValueError("mode must be 'sum', 'mean' or 'max', not %r" % (mode,))
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                         sparse, _weight, device, dtype, kind="EmbeddingBag", **psd_kw)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def forward(self, input, offsets=None, per_sample_weights=None):
        if input.dim() == 2 and offsets is not None:
            raise ValueError("offsets go with a 1-D input only")
        if input.dim() == 1 and offsets is None:
            raise ValueError("a 1-D input needs offsets (the start of each bag)")
        if per_sample_weights is not None and self.mode != "sum":
            raise NotImplementedError("embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                      "supported for mode='sum' (got mode='%s'), as PyTorch's" % self.mode)
        rows, inverse, pad = self._rows(input)
        if offsets is not None:
            offsets = offsets.to(inverse.device)
        return torch.nn.functional.embedding_bag(inverse.view(input.shape), rows, offsets, self.max_norm,
                                                 self.norm_type, self.scale_grad_by_freq, self.mode, False,
                                                 per_sample_weights, self.include_last_offset, pad)


def _tables(module):
    """(path, table module) of every psd.torch table in module."""
    return [(n, m) for n, m in module.named_modules() if isinstance(m, _Table)]


def _attach_tables(module, client, grads):
    """Declares module's tables, once per name; modules with the same
    table= share it, and must declare it alike."""
    seen = {}
    for path, m in _tables(module):
        name = m.table if m.table is not None else (path or type(m).__name__.lower())
        decl = (m.embedding_dim, m._decl)
        if name in seen:
            if seen[name] != decl:
                raise ValueError("modules sharing table %r declare it differently: %r and %r"
                                 % (name, seen[name], decl))
            if m.table is None:
                m.table = name
            m.client, m._grads = client, grads
            continue
        if len(name) > 63:
            raise ValueError("table %r (the module's path) is over 63 bytes, psd's limit for a table name: give the "
                             "module a shorter one with table=" % name)
        m.attach(client, name, grads)
        seen[name] = decl


def step_tables(client, grads, prefetchers=()):
    """Pushes the row gradients the backward passes kept (grads: {table:
    [(keys, row grads), ...]}), summed per key, one push per table, and
    empties grads. prefetchers: table modules whose prefetch() named the
    next forward's keys: their table's push brings those rows too (not in
    bsp)."""
    want = {}
    if client.mode != "bsp":
        for m in prefetchers:
            if m._next is not None and m._next[3] is None and m.table not in want:
                want[m.table] = m
    for table, parts in list(grads.items()):
        if not parts:
            continue
        keys = torch.cat([k for k, _ in parts]) if len(parts) > 1 else parts[0][0]
        g = torch.cat([g for _, g in parts]) if len(parts) > 1 else parts[0][1]
        if len(parts) > 1:
            keys, inv = torch.unique(keys, return_inverse=True)
            g = torch.zeros(keys.numel(), g.shape[1], dtype=g.dtype).index_add_(0, inv, g)
        g = np.ascontiguousarray(g.numpy(), dtype=np.float32)
        m = want.pop(table, None)
        if m is not None:
            m._next[3] = client.pushpull_rows(table, keys.numpy(), g, m._next[1].numpy())
        else:
            client.push_rows(table, keys.numpy(), g)
    grads.clear()


def state_dict(module, keys=None):
    """module.state_dict() with each psd.torch table's rows added under the
    name PyTorch gives a weight ("PATH.weight"), as a float32 tensor of
    shape (rows, embedding_dim): a file of it (torch.save) loads into the
    same model built with nn.Embedding / nn.EmbeddingBag
    (load_state_dict(strict=True)). A table with num_embeddings gives the
    rows of keys 0..num_embeddings-1; keys={path or table name: keys}
    chooses the keys (any table; required for one with
    num_embeddings=None), row i being keys[i]'s. Needs the connected
    Worker's client (it pulls the rows)."""
    keys = dict(keys or {})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rows live in psd", category=UserWarning)
        out = module.state_dict()
    for path, m in _tables(module):
        k = keys.get(path, keys.get(m.table))
        if k is None:
            if m.num_embeddings is None:
                raise ValueError("table %r (%s) takes any 64-bit key (num_embeddings=None): say which rows to save, "
                                 "state_dict(module, keys={%r: keys})" % (m.table, path or "the module", path))
            k = np.arange(m.num_embeddings, dtype=np.int64)
        if m.client is None:
            raise RuntimeError("table %r has no psd client: wrap the model in psd.torch.Worker first" % m.table)
        k = np.asarray(torch.as_tensor(k).cpu().numpy() if not isinstance(k, np.ndarray) else k)
        out[(path + "." if path else "") + "weight"] = torch.from_numpy(m.client.pull_rows(m.table, k))
    return out
