"""conftest.py - pytest's side of the suite's skip list (the integration
scripts' is harness.main): each test skipped here, for what the machine
lacks (torch, MNIST, ...), is printed as `SKIPPED client/FILE: TEST:
REASON` and appended to the file PSD_TEST_SKIPS names, which
scripts/test.sh lists in its last lines; a run whose every test skipped
exits 77, which ctest counts as skipped (SKIP_RETURN_CODE).

A test marked `plain_build` runs in the plain build only: in the
sanitizer build (PSD_SANITIZE=1) it is deselected, not skipped. Those are
long PyTorch runs whose library calls other tests of the sanitizer pass
make too, and which the sanitizer's malloc under PyTorch makes several
times slower."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from suite import SKIP_EXIT, record_skip  # noqa: E402

_counts = {"run": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _counts["run"] += 1
    if not report.skipped:
        return
    _counts["skipped"] += 1
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: "):]
    path, _, name = report.nodeid.partition("::")
    record_skip("SKIPPED client/%s: %s: %s" % (os.path.basename(path), name, reason))


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _counts["run"] and _counts["skipped"] == _counts["run"]:
        session.exitstatus = SKIP_EXIT


def pytest_configure(config):
    config.addinivalue_line("markers", "plain_build: runs in the plain build only, not under the sanitizers")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PSD_SANITIZE") != "1":
        return
    plain = [i for i in items if i.get_closest_marker("plain_build")]
    if plain:
        config.hook.pytest_deselected(items=plain)
        items[:] = [i for i in items if not i.get_closest_marker("plain_build")]
