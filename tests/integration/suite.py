"""suite.py - what every Python test suite of psd shares, with no
dependency beyond the standard library: waiting for an event with a
deadline, and the skip list.

harness.py (the integration tests), browser.py, tests/client/conftest.py
(the client tests under pytest) and tests/engines/engines.py (the engine
tests) import it from here; the last two put this folder on sys.path.
"""
import os
import sys
import time

SKIP_EXIT = 77  # ctest's SKIP_RETURN_CODE for the test scripts


def wait_until(pred, timeout, what, interval=0.02, error=AssertionError):
    """Calls pred() until it returns something true and returns that; raises
    error (AssertionError, or the suite's own failure) naming `what` when
    timeout seconds pass first. The short sleep between calls is a polling
    interval, not a wait for the event."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise error("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def record_skip(line):
    """A skipped test or check: the line on stderr, and appended to the file
    PSD_TEST_SKIPS names (scripts/test.sh lists them in its last lines)."""
    sys.stderr.write(line + "\n")
    path = os.environ.get("PSD_TEST_SKIPS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
