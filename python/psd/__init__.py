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
as psworker does (see psd/mnist.py); psd.metrics measures predictions
(metrics.auc(labels, scores), see psd/metrics.py).

The modules: client.py (Client: layout, vectors, steps, what psd said),
tables.py (its embedding-table calls), planning.py (its BSP plan calls),
plan.py (the plan's sample order), errors.py (PsdError), options.py
(libpsclient's option table), signals.py (Ctrl-C and SIGTERM during a
wait), wait.py (WaitNotice), _lib.py (loading the library).
"""

import sys

try:
    import numpy as np  # noqa: F401 (the message below when it is missing)
except ImportError as e:
    raise ImportError("psd needs NumPy, which this Python (%s) cannot import (%s): on Debian install it with "
                      "`apt-get install python3-numpy` and run Debian's /usr/bin/python3, or install numpy into "
                      "this Python's environment" % (sys.executable, e)) from None

from ._lib import lib
from .client import Client
from .errors import PsdError, error_name, strerror
from .options import Option, options
from .plan import Plan, Slice, epoch_order
from . import metrics, mnist
from .wait import WaitNotice

__all__ = ["Client", "PsdError", "Option", "Plan", "Slice", "WaitNotice", "epoch_order", "error_name", "options",
           "strerror", "metrics", "mnist", "__version__"]

__version__ = lib.psc_version_string().decode()
