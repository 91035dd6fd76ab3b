"""Signals while a call waits for psd: Ctrl-C (SIGINT) and SIGTERM end the
wait with KeyboardInterrupt, and a process that SIGTERM stopped that way
ends with SIGTERM's status, as an uncaught SIGTERM would."""

import ctypes
import os
import signal
import socket
import sys
import threading


_stop_signal = [None]  # the name of the signal that stopped a wait ("SIGTERM"), when ours


class Terminated(KeyboardInterrupt):
    """SIGTERM during a wait (or while the main thread runs Python), raised
    as Ctrl-C's KeyboardInterrupt is: `except KeyboardInterrupt` catches
    both. Left uncaught, the process ends with SIGTERM's status."""


def _on_sigterm(signum, frame):
    _stop_signal[0] = "SIGTERM"
    raise Terminated("SIGTERM")


def _excepthook(tp, value, tb, _prev=[None]):  # noqa: B006 (the hook before ours)
    """An uncaught Terminated: the traceback as usual, then the process ends
    by SIGTERM itself (status -15, 143 in a shell), not by SIGINT as
    Python ends after an uncaught KeyboardInterrupt."""
    (_prev[0] or sys.__excepthook__)(tp, value, tb)
    if isinstance(value, Terminated):
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001 (a closed stream: nothing to flush)
                pass
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _stop_on_sigterm():
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, when nobody chose
    what it does (its handler is the default) and we are on the main
    thread (the only one that may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
            if sys.excepthook is not _excepthook:
                _excepthook.__defaults__[0][0] = sys.excepthook
                sys.excepthook = _excepthook
    except (ValueError, OSError):  # an embedded interpreter without signals
        pass


_wake = []  # (reader, writer): the socket pair whose writer is Python's signal wake-up fd, once set


def _wakeup_fd():
    """The descriptor a signal makes readable, for libpsclient's option
    wakeup_fd, or None. Python's C-level handler writes to the wake-up fd
    (signal.set_wakeup_fd) whatever thread the signal lands on and whenever
    it lands, where a wait's poll sees EINTR only when the signal reaches
    the waiting thread while it sleeps. Set once, from the main thread
    (the only one that may), unless somebody else set one (asyncio does),
    which stays theirs."""
    if _wake:
        return _wake[0].fileno()
    if threading.current_thread() is not threading.main_thread():
        return None
    r, w = socket.socketpair()
    r.setblocking(False)
    w.setblocking(False)
    try:
        old = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):  # an embedded interpreter without signals
        old = None
    if old != -1:
        if old is not None:
            signal.set_wakeup_fd(old)
        r.close()
        w.close()
        return None
    _wake.extend((r, w))
    return r.fileno()


def _run_signal_handlers():
    """A library call ended by a signal (EINTR): run Python's handlers now
    (SIGINT's raises KeyboardInterrupt) rather than at some later bytecode."""
    ctypes.pythonapi.PyErr_CheckSignals()

