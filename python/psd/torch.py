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
named_parameters(), in order: every worker of a job must build the same
module. Heartbeats go on from the library's own thread while the model
computes.

CUDA: a module on a GPU keeps its parameters there; the flat vectors stay
in host memory, pinned when CUDA is available, and step() copies the
gradients down and the parameters back up (asynchronous copies from pinned
memory). Tested on CPU only in this project's suite.

ASGD, BSP and SSP, one psd or a model split over several
(server="host:port,host:port"), the wire type and every other option are
those of psd.Client (docs/client.md).
"""

import torch

import psd as _psd


class Worker:
    """Binds module's parameters and gradients to a psd.Client and connects.

    The module's current parameters are this worker's initial model: if it
    is the first to reach psd they become the job's model, otherwise psd's
    values replace them. options go to psd.Client (server, shard,
    token_file, wire, shm, timeout_ms, reconnect_s, connect_s, ...).
    """

    def __init__(self, module, connect=True, **options):
        if not isinstance(module, torch.nn.Module):
            raise TypeError("psd.torch.Worker wraps a torch.nn.Module, not %s" % type(module).__name__)
        self.module = module
        self._params = [(n, p) for n, p in module.named_parameters()]
        if not self._params:
            raise ValueError("the module has no parameters to train")
        for n, p in self._params:
            if p.dtype != torch.float32:
                raise TypeError("parameter %s is %s: psd trains float32 parameters (module.float())" % (n, p.dtype))
        layout = [(n, tuple(p.shape) if p.dim() else (1,)) for n, p in self._params]
        self.client = _psd.Client(layout, **options)
        # the library's vectors, as tensors sharing their memory
        self.flat_params = torch.from_numpy(self.client.params)
        self.flat_grads = torch.from_numpy(self.client.grads)
        self.device = self._params[0][1].device
        self.cuda = self.device.type == "cuda"
        if any(p.device != self.device for _, p in self._params):
            raise ValueError("all parameters must be on one device")
        with torch.no_grad():
            for n, p in self._params:
                off, cnt = self.client.offset(n)
                self.flat_params[off:off + cnt].copy_(p.detach().reshape(-1).cpu())
        if self.cuda:
            # device copies of the flat vectors; host ones pinned for fast copies
            self._dev_params = self.flat_params.to(self.device)
            self._dev_grads = torch.zeros_like(self._dev_params)
            self._host_pinned = torch.cuda.is_available()
        self._views()
        if connect:
            self.connect()

    def _views(self):
        """Points every parameter's .data and .grad at its slice of the flat
        vectors (on the device for CUDA)."""
        params = self._dev_params if self.cuda else self.flat_params
        grads = self._dev_grads if self.cuda else self.flat_grads
        self._grad_views = []
        for n, p in self._params:
            off, cnt = self.client.offset(n)
            p.data = params[off:off + cnt].view(p.shape)
            g = grads[off:off + cnt].view(p.shape)
            p.grad = g
            self._grad_views.append(g)

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
        """Connects and gets the model (our parameters if psd has none)."""
        self.client.connect()
        self._after_pull()

    def _after_pull(self):
        if self.cuda:
            self._dev_params.copy_(self.flat_params, non_blocking=self._host_pinned)

    def _before_push(self):
        self._gather_stray_grads()
        if self.cuda:
            self.flat_grads.copy_(self._dev_grads)

    def zero_grad(self):
        """Zeroes the gradients in place (they stay views)."""
        (self._dev_grads if self.cuda else self.flat_grads).zero_()
        self._gather_stray_grads()

    def step(self):
        """After loss.backward(): pushes the gradients and brings psd's new
        parameters into the module (bsp: after the round closes)."""
        self._before_push()
        self.client.pushpull()
        self._after_pull()

    def step_start(self):
        """step() on the library's thread: returns at once. Until
        step_wait() the module's parameters and gradients must not be used."""
        self._before_push()
        self.client.pushpull_start()

    def step_wait(self):
        self.client.wait()
        self._after_pull()

    def pull(self):
        """Brings psd's newest parameters (e.g. before evaluating)."""
        self.client.pull()
        self._after_pull()

    def progress(self, epoch, loss_sum, n):
        """After a step: see psd.Client.progress (psd hears of the loss every report_s seconds)."""
        self.client.progress(epoch, loss_sum, n)

    def report(self, epoch, loss, accuracy=None, test_loss=0.0, samples=0, rate=0.0):
        self.client.report(epoch, loss, accuracy, test_loss, samples, rate)

    @property
    def version(self):
        return self.client.version

    @property
    def mode(self):
        return self.client.mode

    def close(self):
        self.client.close()
