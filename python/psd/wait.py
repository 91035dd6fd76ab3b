"""psd.WaitNotice: says on a progress stream why a step waits for psd.

A BSP round waits for every worker, so a worker whose step hangs is usually
waiting for another one: psd tells whom (Client.waiting_for(): "round 0
waits for shard 1/2 (never joined)"). WaitNotice writes it as psworker's
progress line does:

    worker 0/2: waiting 12 s for psd: round 0 waits for shard 1/2 (never joined)

    c = psd.Client(layout, server=..., shard="0/2", connect=True)
    with psd.WaitNotice(c, prefix="worker 0/2: "):
        for x, y in batches:
            ...
            c.pushpull()
"""

import sys
import threading


class WaitNotice:
    """While a step of client (pushpull, push, pull, or one started by
    pushpull_start) has waited for psd more than `after` seconds, a thread
    of its own writes to stream (default sys.stderr) how long, and what
    psd said the step waits for (Client.waiting_for()), or, before psd has
    said, where to look: "waiting 3 s for psd (psctl status says for
    whom)". On a terminal the line is rewritten in place once a second
    (and cleared when the step is over); elsewhere a line is written when
    psd's words change and every `every` seconds while they do not.

    start() and stop(), or use it as a context manager. The thread is a
    daemon and only reads the client (waited(), waiting_for()), which the
    library allows while another thread is inside a step."""

    def __init__(self, client, prefix="", after=2.0, stream=None, every=10.0, tick=1.0):
        self.client = client
        self.prefix = prefix
        self.after = float(after)
        self.stream = stream
        self.every = float(every)
        self.tick = float(tick)
        self._stop = threading.Event()
        self._thread = None

    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def _text(self, t, why):
        if why:
            return "%swaiting %.0f s for psd: %s" % (self.prefix, t, why)
        return "%swaiting %.0f s for psd (psctl status says for whom)" % (self.prefix, t)

    def line(self):
        """The notice for the step in flight now, or None when it has not
        waited longer than `after` seconds."""
        t = self.client.waited()
        return self._text(t, self.client.waiting_for()) if t > self.after else None

    def _run(self):
        from . import PsdError  # here: the package imports this module
        out = self._out()
        tty = hasattr(out, "isatty") and out.isatty()
        shown, said, said_at = False, None, 0.0
        while not self._stop.wait(self.tick):
            try:
                t = self.client.waited()
                why = self.client.waiting_for() if t > self.after else None
            except PsdError:  # the client is freed: the notice ends (the worker hears of it itself)
                return
            if t <= self.after:
                if shown and tty:
                    out.write("\r\033[K")
                    out.flush()
                shown, said = False, None
                continue
            if tty:
                out.write("\r%s\033[K" % self._text(t, why))
            elif not shown or why != said or t - said_at >= self.every:
                out.write(self._text(t, why) + "\n")
                said, said_at = why, t
            else:
                continue
            out.flush()
            shown = True

    def start(self):
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="psd-wait-notice", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
