"""A BSP job's plan from Python: the methods psd.Client has for it."""

import ctypes

import numpy as np

from ._lib import lib
from .errors import PsdError
from .plan import Plan, Slice, epoch_order


class PlanCalls:
    """psd.Client's plan methods (a mixin: it uses the client's _check,
    _handle and version)."""

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
