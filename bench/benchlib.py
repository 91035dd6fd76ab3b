"""benchlib.py - what the benchmarks of bench/ share to set up a job and
read its results, on top of the tests' harness (tests/integration/
harness.py: Cluster, Psd, Proc, Paths and parse_args for --psd, --psworker,
--psctl and --data).

    import benchlib
    from benchlib import harness
    args = harness.parse_args(options, program_doc=__doc__)
    with harness.Cluster("bench-x") as cl:
        psd = cl.psd(mode="bsp", workers=2, args=benchlib.adam(2e-3, cosine_versions=v))
        ...
        outs = benchlib.wait_all(procs, 600, "bench-x")

A benchmark prints figures and asserts nothing: a worker that fails ends
the run with its stderr (wait_all) rather than raising.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

__all__ = ["PY", "ROOT", "adam", "cpu_seconds", "harness", "json_lines", "python_env", "wait_all"]


def adam(lr, cosine_versions=None, warmup_versions=None):
    """psd's options for the recommended optimizer (docs/settings.md): Adam at lr,
    falling along a cosine over cosine_versions versions when given, with
    warmup_versions of warm-up when given (psd's default otherwise), and a
    heartbeat timeout of 60 s, so that a worker slowed by a loaded machine
    is not taken for dead."""
    args = ["--set", "optimizer=adam", "--set", "lr=%g" % lr]
    if cosine_versions is not None:
        args += ["--set", "lr_schedule=cosine", "--set", "lr_decay_versions=%d" % cosine_versions]
    if warmup_versions is not None:
        args += ["--set", "warmup_versions=%d" % warmup_versions]
    return args + ["--set", "heartbeat_timeout=60s"]


def python_env():
    """The environment for a Python worker from this source tree: the
    package psd from python/ (ahead of any other), over the built
    libpsclient unless PSD_CLIENT_LIBRARY names another."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "python"), env.get("PYTHONPATH")) if p)
    env.setdefault("PSD_CLIENT_LIBRARY", os.path.join(ROOT, "build", "client", "libpsclient.so.1"))
    return env


def json_lines(text, prefix="{"):
    """The JSON objects of the lines of text that start with prefix (psworker
    --epoch-json and the examples print one per epoch, '{"epoch"', and a
    summary last)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith(prefix)]


def wait_all(procs, timeout, program):
    """Waits for each harness.Proc in turn; returns their stdouts. When one
    exits with a status other than 0, ends the program with its name and
    stderr ("program: NAME failed: ...")."""
    out = []
    for p in procs:
        if p.wait(timeout) != 0:
            sys.exit("%s: %s failed:\n%s" % (program, p.name, p.stderr()))
        out.append(p.stdout())
    return out


def cpu_seconds(pid):
    """User + system CPU seconds process pid has used (Linux /proc)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
