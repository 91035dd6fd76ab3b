"""harness.py - shared helpers for psd's integration tests.

Every test starts the real programs: psd on port 0 (it writes the port it
bound to a port file, which the harness waits for), psworker processes and
psctl. A Cluster owns every process it starts and kills whatever is still
running when the test leaves it, pass or fail; every wait has a deadline and
waits for an event (a file, a reply, an exit), never a fixed sleep.

RawClient is a small psd client written from the protocol's description
(proto/PROTOCOL.md, the message numbers from proto/messages.def) with Python's msgpack, so hostile tests build
frames with an encoder other than the one under test.

Paths to the programs and the data come from the command line (ctest passes
them), from the environment, or default to build/ and data/ beside this
repository:

    --psd PATH --psworker PATH --psctl PATH --data DIR
    PSD_BIN, PSWORKER_BIN, PSCTL_BIN, PSD_DATA_DIR

PSD_TEST_KEEP=1 keeps each test's directory (logs, port file) for a look
afterwards. Test scripts call harness.parse_args() first; the options it does not know
are left for unittest, which harness.main() runs.

A test that needs what the machine cannot give (root, network namespaces,
tc, a browser, a tool) skips with a reason that names it. harness.main()
prints each skip as `SKIPPED script: test: reason`, appends it to the file
PSD_TEST_SKIPS names (scripts/test.sh lists them in its last lines), and
exits 77 when every test of the script skipped, which ctest counts as a
skipped test (SKIP_RETURN_CODE). A check skipped inside a test that
otherwise runs is recorded with note_skip().
"""

import argparse
import fcntl
import hashlib
import hmac
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
import threading
import time
import unittest

import msgpack

from suite import SKIP_EXIT, record_skip, wait_until  # noqa: F401 (wait_until: for the tests)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# the binaries under test are the AddressSanitizer + UBSan build's
# (tests/integration/CMakeLists.txt sets it): a test that repeats a job
# with several seeds for its statistics may run one seed there
SANITIZED = os.environ.get("PSD_SANITIZE") == "1"

# ---- protocol constants (proto/msg.h, proto/errors.h, proto/ps_limits.h) ----

PROTO_VERSION = 1
FRAME_MAX_PREAUTH = 512 * 1024


def message_types(path=os.path.join(ROOT, "proto", "messages.def")):
    """The message types of proto/messages.def, psd's one declaration of
    them, as (NAME, name, t, dir, required) tuples in the file's order:
    NAME as in PS_MSG_NAME, t the number on the wire, dir C, W, A or S,
    required the PS_F_* names of the fields it must carry."""
    row = re.compile(r"^PS_MSG\((\w+), (\w+), (\d+), ([CWAS]), ([\w |]+)\)", re.M)
    with open(path) as f:
        text = f.read()
    return [(NAME, name, int(t), d, [r.strip() for r in req.split("|") if r.strip() != "0"])
            for NAME, name, t, d, req in row.findall(text)]


# T_HELLO = 1, T_WELCOME = 2, ...: one per row of messages.def (numbers only:
# the frames themselves are packed with Python's msgpack, not our encoder)
MESSAGE_TYPES = message_types()
globals().update(("T_" + NAME, t) for NAME, _, t, _, _ in MESSAGE_TYPES)

# ERROR codes, as they travel (positive)
E_MALFORMED = 1
E_TOO_BIG = 2
E_UNSUPPORTED = 3
E_BAD_TYPE = 4
E_BAD_FIELD = 5
E_STATE = 6
E_LAYOUT = 7
E_RANGE = 8
E_NONFINITE = 9
E_STALE = 10
E_DUPLICATE = 11
E_SHARD = 12
E_NOT_READY = 13
E_AUTH = 14
E_FORBIDDEN = 15
E_LIMIT = 16
E_SHUTDOWN = 17
E_NOMEM = 18

# reason label of psd_rejected_messages_total for each code
REASONS = {
    E_MALFORMED: "malformed",
    E_TOO_BIG: "too_big",
    E_UNSUPPORTED: "unsupported",
    E_BAD_TYPE: "bad_type",
    E_BAD_FIELD: "bad_field",
    E_STATE: "state",
    E_LAYOUT: "layout",
    E_RANGE: "range",
    E_NONFINITE: "nonfinite",
    E_SHARD: "shard",
    E_AUTH: "auth",
    E_FORBIDDEN: "forbidden",
    E_LIMIT: "limit",
}



# psd settings the ASGD tests add to the defaults. None: psd's defaults
# (AdaGrad, lr 0.02) train every model in ASGD (tests/integration/
# test_defaults.py, bench/defaults.py); the earlier default, SGD at lr 0.05
# with momentum 0.9, needed lr 0.02 here.
ASGD_ARGS = ()

# ---- configuration ----------------------------------------------------------


class Paths:
    psd = os.environ.get("PSD_BIN", os.path.join(ROOT, "build", "server", "psd"))
    psworker = os.environ.get("PSWORKER_BIN", os.path.join(ROOT, "build", "worker", "psworker"))
    psctl = os.environ.get("PSCTL_BIN", os.path.join(ROOT, "build", "psctl", "psctl"))
    data = os.environ.get("PSD_DATA_DIR", os.path.join(ROOT, "data"))


def parse_args(extra=None, program_doc=None):
    """Reads the harness's options (and those extra(parser) adds) from
    sys.argv, leaves the rest in sys.argv for unittest, and returns the
    parsed namespace. A program that is not a unittest (a benchmark) passes
    its docstring as program_doc: then --help prints it and an unknown
    option is an error."""
    p = argparse.ArgumentParser(add_help=program_doc is not None, description=program_doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--psd", help="the psd to run (default: the build's)")
    p.add_argument("--psworker", help="the psworker to run")
    p.add_argument("--psctl", help="the psctl to run")
    p.add_argument("--data", help="the data directory (default: the project's data/)")
    if extra:
        extra(p)
    if program_doc is not None:
        args, rest = p.parse_args(sys.argv[1:]), []
    else:
        args, rest = p.parse_known_args(sys.argv[1:])
    for name in ("psd", "psworker", "psctl", "data"):
        if getattr(args, name):
            setattr(Paths, name, os.path.abspath(getattr(args, name)))
    sys.argv[1:] = rest
    for prog in (Paths.psd, Paths.psworker, Paths.psctl):
        if not os.access(prog, os.X_OK):
            sys.exit("harness: %s is not an executable; build first or pass its path" % prog)
    return args


# ---- skips ------------------------------------------------------------------------

# SKIP_EXIT (ctest's SKIP_RETURN_CODE for these scripts, tests/integration/CMakeLists.txt)
# and record_skip: suite.py's, imported above


def _test_name(test):
    return test.id().split(".", 1)[-1]


def note_skip(test, reason):
    """A check inside test that cannot run here, for reason (naming what is
    missing): recorded as a skip, while the rest of the test runs."""
    record_skip("SKIPPED %s: %s (part): %s" % (os.path.basename(sys.argv[0]), _test_name(test), reason))


def main(verbosity=1, argv=None):
    """Runs the script's tests (unittest, with what parse_args left in
    sys.argv) and exits: 1 when one failed, SKIP_EXIT when every one was
    skipped, else 0. Each skip is recorded with its reason."""
    prog = unittest.main(argv=argv, verbosity=verbosity, exit=False)
    r = prog.result
    for test, reason in r.skipped:
        record_skip("SKIPPED %s: %s: %s" % (os.path.basename(sys.argv[0]), _test_name(test), reason))
    if not r.wasSuccessful():
        sys.exit(1)
    sys.exit(SKIP_EXIT if r.testsRun and len(r.skipped) == r.testsRun else 0)


def why_no_netns():
    """None when this process may make a network namespace and run in it
    (it makes one, runs `ip -n NAME link set lo up` there and removes it),
    else the reason, naming what is missing. In a chroot `ip netns add`
    works, but entering the namespace does not: ip remounts / as a slave,
    which the kernel refuses where / is not a mount point."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    if not shutil.which("ip"):
        return "no ip (Debian package iproute2)"
    name = "psdprobe%d" % os.getpid()
    try:
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "`ip netns add` did not finish in 10 s"
    if r.returncode != 0:
        return "cannot make a network namespace here (`ip netns add`: %s)" % (r.stderr.strip() or r.returncode)
    try:
        r = subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True, text=True,
                           timeout=10)
    except subprocess.TimeoutExpired:
        r = None
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    if r is None:
        return "`ip -n NAME link set lo up` did not finish in 10 s"
    if r.returncode != 0:
        return "cannot run in a network namespace here (`ip -n NAME link set lo up`: %s)" % (
            r.stderr.strip() or r.returncode)
    return None


# ---- waiting ------------------------------------------------------------------


# wait_until(pred, timeout, what): suite.py's, imported above


class LineStream:
    """A text stream for a test to hand out as stdout or stderr: not a
    terminal (so what writes progress writes whole lines), thread-safe,
    everything written kept in .text."""

    def __init__(self):
        self.text = ""
        self.lock = threading.Lock()

    def write(self, s):
        with self.lock:
            self.text += s

    def flush(self):
        pass

    def isatty(self):
        return False


def tail(path, lines=40, skip=None):
    """The last lines of a file; skip: a regular expression whose lines are
    left out (progress lines that would push the telling ones out)."""
    try:
        with open(path, "r", errors="replace") as f:
            kept = [l for l in f if skip is None or not re.search(skip, l)]
            return "".join(kept[-lines:])
    except OSError:
        return "(no %s)" % path


# a worker's per-epoch progress line, in its own log and in psd's
PROGRESS_LINE = r" epoch \d+: loss "


# ---- processes ------------------------------------------------------------------


class Proc:
    """A started program with its output in files under the cluster's dir."""

    def __init__(self, name, argv, workdir, env=None):
        self.name = name
        self.argv = argv
        self.out_path = os.path.join(workdir, name + ".out")
        self.err_path = os.path.join(workdir, name + ".err")
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.p = subprocess.Popen(argv, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                  cwd=workdir, env=env)
        self.pid = self.p.pid

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        """Waits for the exit; raises AssertionError (after killing it) when
        it takes longer than timeout seconds."""
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %.0f s\n--- stderr:\n%s" %
                                 (self.name, timeout, tail(self.err_path)))

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close_files(self):
        self._out.close()
        self._err.close()

    def stdout(self):
        with open(self.out_path, "r", errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.err_path, "r", errors="replace") as f:
            return f.read()

    def rss_kb(self):
        """Resident set size from /proc/PID/status, in KiB."""
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS for %s" % self.name)


class Psd(Proc):
    """psd on 127.0.0.1, port 0; .addr is "127.0.0.1:PORT" once started."""

    def __init__(self, workdir, name="psd", mode="asgd", workers=2, args=(), start_timeout=15, token=None,
                 env=None):
        self.port_file = os.path.join(workdir, name + ".port")
        argv = [Paths.psd, "--listen", "127.0.0.1:0", "--port-file", self.port_file, "--mode", mode,
                "--workers", str(workers)]
        argv += list(args)
        super().__init__(name, argv, workdir, env=env)
        port = wait_until(self._port, start_timeout, "%s to write its port file" % name)
        self.port = port
        self.addr = "127.0.0.1:%d" % port
        # one answered hello shows psd is up and serving (with token: the
        # bytes of a secret psd requires, for the challenge)
        with RawClient(self.addr, start_timeout) as c:
            c.hello_admin(token=token)
            c.request({"t": T_BYE})
            c.expect_closed()

    def _port(self):
        if self.p.poll() is not None:
            raise AssertionError("%s exited with %s before listening\n--- stderr:\n%s" %
                                 (self.name, self.p.returncode, tail(self.err_path)))
        try:
            with open(self.port_file) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        if not text.endswith("\n"):
            return None  # psd writes the file whole (rename), but be safe
        return int(text)

    def stop(self, timeout=30):
        """SIGTERM; returns psd's exit status, which must be 0."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if rc != 0:
            raise AssertionError("%s exited with %s after SIGTERM (expected 0)\n--- stderr:\n%s" %
                                 (self.name, rc, tail(self.err_path)))
        return rc


class Worker(Proc):
    def result(self, timeout):
        """Waits for the exit and returns (returncode, JSON summary or None)."""
        rc = self.wait(timeout)
        lines = [l for l in self.stdout().splitlines() if l.strip()]
        summary = None
        if lines:
            try:
                summary = json.loads(lines[-1])
            except ValueError:
                summary = None
        return rc, summary


class Cluster:
    """Owns a temporary directory and every process started through it.
    Leaving the with-block kills whatever still runs; when the block raised,
    the tails of every process's stderr are printed to help the diagnosis."""

    def __init__(self, name="psd-test"):
        self.name = name
        self.procs = []
        self.dir = None
        self.nworkers = 0

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix=self.name + "-")
        return self

    def __exit__(self, exc_type, exc, tb):
        for p in self.procs:
            p.kill()
            p.close_files()
        if exc_type is not None:
            # what failed first: a log keeps only the start and the end of a
            # long output, and unittest prints its report after every test
            sys.stderr.write("\n--- %s failed: %s: %.3000s\n%s" % (self.name, exc_type.__name__, exc,
                                                                      "".join(traceback.format_list(
                [f for f in traceback.extract_tb(tb) if "unittest" not in f.filename][-2:]))))
            for p in self.procs:
                sys.stderr.write("\n--- %s (exit %s): %s\n--- stderr tail, without progress lines:\n%s" %
                                 (p.name, p.p.returncode, " ".join(p.argv), tail(p.err_path, 15, PROGRESS_LINE)))
        if os.environ.get("PSD_TEST_KEEP"):
            sys.stderr.write("%s: kept %s (PSD_TEST_KEEP)\n" % (self.name, self.dir))
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def psd(self, **kw):
        p = Psd(self.dir, **kw)
        self.procs.append(p)
        return p

    def worker(self, psd, shard, nshards, epochs=2, batch=64, limit=6000, test_limit=2000, model="mlp:64",
               dataset="mnist", evaluate=True, args=(), name=None):
        """A psworker of shard/nshards. psd: a Psd, a list of them (a model
        split over several psd, in part order) or an address as given to
        --server."""
        if isinstance(psd, str):
            addr = psd
        elif isinstance(psd, (list, tuple)):
            addr = ",".join(p.addr for p in psd)
        else:
            addr = psd.addr
        argv = [Paths.psworker, "--server", addr, "--shard", "%d/%d" % (shard, nshards), "--epochs",
                str(epochs), "--batch", str(batch), "--limit", str(limit), "--test-limit", str(test_limit),
                "--data", Paths.data, "--dataset", dataset, "--model", model] + list(args)
        if evaluate:
            argv.append("--eval")
        self.nworkers += 1
        w = Worker(name or "worker%d" % self.nworkers, argv, self.dir)
        self.procs.append(w)
        return w


def finish(test, workers, timeout=120):
    """Waits for every worker; asserts each exited 0 with a JSON summary
    (the worker's stderr tail in the message otherwise) and returns the
    summaries in order."""
    results = []
    for w in workers:
        rc, summary = w.result(timeout)
        test.assertEqual(rc, 0, "%s failed:\n%s" % (w.name, tail(w.err_path)))
        test.assertIsNotNone(summary, "%s printed no JSON summary" % w.name)
        results.append(summary)
    return results


def run(argv, timeout=30, **kw):
    """Runs a short program to completion with a time limit; returns the
    CompletedProcess with text stdout and stderr."""
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, text=True, errors="replace", **kw)


def psctl(addr, *args, timeout=30):
    return run([Paths.psctl, "--server", addr, "--timeout", "10000"] + list(args), timeout=timeout)


def psctl_commands():
    """The command names `psctl --help` lists under Reading and under
    Controlling (psctl's command table, psctl/commands.c, makes that text)."""
    r = run([Paths.psctl, "--help"])
    groups, cur = {}, None
    for line in r.stdout.splitlines():
        if line and not line.startswith(" "):
            cur = groups.setdefault(line.split()[0].rstrip(":"), [])
        elif cur is not None and line.startswith("  ") and not line.startswith("   "):
            cur.append(line.split()[0])
    return groups["Reading"], groups["Controlling"]


def _as_psctl_json(o):
    """A STATUS body as `psctl status --json` prints it (common/json.c): a
    non-finite float and a bin become None, a key that is not a str "?"."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, (bytes, bytearray)):
        return None
    if isinstance(o, list):
        return [_as_psctl_json(v) for v in o]
    if isinstance(o, dict):
        return {(k if isinstance(k, str) else "?"): _as_psctl_json(v) for k, v in o.items()}
    return o


def status(addr, token=None):
    """psd's status, as `psctl status --json` gives it: the body of an
    admin's STATUS (what psctl prints), asked here over one connection of
    RawClient's rather than by starting psctl, which the tests poll: a
    sanitizer build's psctl costs about 0.1 s of CPU a start, and the
    waits spent most of a core on it. token: the admin's secret (bytes)
    when psd has one. Raises AssertionError when psd does not answer.
    psctl's own status is tested through psctl()."""
    try:
        with RawClient(addr, 10.0) as c:
            c.hello_admin(token)
            r = c.request({"t": T_STATUS})
            c.send_frame({"t": T_BYE, "id": c.next_id})
    except (OSError, Closed, ValueError) as e:
        raise AssertionError("psd at %s gave no status: %s" % (addr, e))
    if r.get("t") != T_STATUS_REPLY or not isinstance(r.get("body"), dict):
        raise AssertionError("psd at %s answered STATUS with %r" % (addr, r))
    return _as_psctl_json(r["body"])


def version(addr):
    """psd's model version, from its status."""
    return status(addr)["version"]


def worker_row(st, shard):
    """The row of shard in a status's workers, or None."""
    for w in st["workers"]:
        if w["shard"] == shard:
            return w
    return None


def metrics(addr):
    r = psctl(addr, "metrics")
    if r.returncode != 0:
        raise AssertionError("psctl metrics failed (%d): %s" % (r.returncode, r.stderr))
    return r.stdout


_ports_given = set()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A loopback port nothing listens on, for a program told a fixed port
    (one that restarts on its predecessor's port, or a member of a cluster
    given its peers' ports): bound, then closed again; never one this
    process handed out before. It is taken below the kernel's ephemeral
    range, which the kernel hands out by itself: to a program that listens
    on port 0, and as the local port of any outgoing connection (a
    worker's, while it reconnects), which would take a port between its
    program's two lives. Random in that range, so that tests run side by
    side seldom pick the same one; the bind checks it is free now."""
    low, _ = _ephemeral_range()
    for _ in range(1000):
        if low > 12000:
            port = random.randrange(10000, low)
        else:  # an unusual range: the kernel's own pick
            port = 0
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
            port = s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise AssertionError("no port free that this test has not handed out already")


def free_ports(n):
    """n distinct free_port()s."""
    return [free_port() for _ in range(n)]


# ---- Prometheus text ------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_SAMPLE = re.compile(r"^(%s)(?:\{((?:%s)(?:,(?:%s))*,?)?\})? (\S+)(?: (-?\d+))?$" % (_NAME, _LABEL, _LABEL))
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"')
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def _unescape(value):
    """A label value as written (\\\\, \\" and \\n escaped) back to its text."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_prometheus(text):
    """Parses the Prometheus text exposition format (version 0.0.4) strictly
    enough to catch a malformed line, a sample without its family's TYPE, a
    family declared twice or a value that is not a number. Returns
    {(name, ((label, value), ...)): float} (label values unescaped) and
    {family: type}."""
    samples, types, helps = {}, {}, set()
    if text and not text.endswith("\n"):
        raise AssertionError("metrics text does not end with a newline")
    for n, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "HELP":
                if parts[2] in helps:
                    raise AssertionError("line %d: second HELP for %s" % (n, parts[2]))
                helps.add(parts[2])
            elif len(parts) >= 3 and parts[1] == "TYPE":
                if len(parts) != 4 or parts[3] not in _TYPES:
                    raise AssertionError("line %d: bad TYPE line %r" % (n, line))
                if parts[2] in types:
                    raise AssertionError("line %d: second TYPE for %s" % (n, parts[2]))
                types[parts[2]] = parts[3]
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise AssertionError("line %d is not a Prometheus sample: %r" % (n, line))
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        try:
            v = float(value)
        except ValueError:
            raise AssertionError("line %d: value %r is not a number" % (n, value))
        fam = name
        for suffix in ("_bucket", "_sum", "_count"):
            if fam not in types and fam.endswith(suffix):
                fam = fam[: -len(suffix)]
        if fam not in types:
            raise AssertionError("line %d: sample %s comes before (or without) its # TYPE line" % (n, name))
        key = (name, tuple(sorted((k, _unescape(v)) for k, v in _LABEL_RE.findall(labels))))
        if key in samples:
            raise AssertionError("line %d: sample %s%s appears twice" % (n, name, labels))
        samples[key] = v
    return samples, types


def metric(samples, name, **labels):
    """The value of one sample, or None."""
    return samples.get((name, tuple(sorted(labels.items()))))


def promtool_check(test, text):
    """Runs `promtool check metrics` on text when promtool is installed;
    otherwise records the skip (note_skip) and returns False."""
    promtool = shutil.which("promtool")
    if not promtool:
        note_skip(test, "`promtool check metrics`: promtool not found (Debian package prometheus)")
        return False
    r = subprocess.run([promtool, "check", "metrics"], input=text, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    test.assertEqual(r.returncode, 0, "promtool check metrics failed:\n" + r.stdout)
    return True


# ---- models ---------------------------------------------------------------------


def mlp_layout(hidden, inputs=784, classes=10):
    """The layout psworker sends for --model mlp:H1,H2,... (PyTorch names and
    shapes: fcN.weight [out, in], fcN.bias [out])."""
    layout, prev = [], inputs
    sizes = list(hidden) + [classes]
    for i, out in enumerate(sizes, 1):
        layout.append(["fc%d.weight" % i, [out, prev]])
        layout.append(["fc%d.bias" % i, [out]])
        prev = out
    return layout


def read_safetensors(path):
    """A safetensors reader from the format's description: u64 header length,
    JSON header, raw little-endian data. Returns (metadata, {name: array})."""
    import numpy as np
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert (8 + n) % 8 == 0, "data should start 8-aligned"
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors, end = {}, 0
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4"}  # psctl save writes buffers in their own
    for name, t in header.items():
        assert t["dtype"] in dtypes, t
        b, e = t["data_offsets"]
        tensors[name] = np.frombuffer(data[b:e], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
        end = max(end, e)
    assert end == len(data), "the data is entirely indexed"
    return meta, tensors


def layout_size(layout):
    return sum(math.prod(dims) for _, dims in layout)


def layout_fingerprint(layout):
    """64-bit FNV-1a over "name:d0xd1;" for every tensor (proto/layout.h)."""
    h = 0xCBF29CE484222325
    text = "".join("%s:%s;" % (name, "x".join(str(d) for d in dims)) for name, dims in layout)
    for b in text.encode():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def steps_per_epoch(limit, nshards, batch, bsp):
    """Steps a worker takes per epoch (worker/psworker.c): in BSP every
    worker takes ceil((N div M) / batch); in ASGD ceil(shard size / batch),
    where shard k holds samples k, k+M, ..."""
    def ceil_div(a, b):
        return (a + b - 1) // b
    if bsp:
        return ceil_div(limit // nshards, batch)
    return [ceil_div(ceil_div(limit - k, nshards), batch) for k in range(nshards)]


# ---- authentication (proto/PROTOCOL.md 7.1) with Python's hmac, not libsodium ----


def auth_proof(token, nonce, cnonce, hello):
    """The client's proof for hello (a dict as sent): HMAC-SHA256 keyed with
    the secret over "psd-auth-v1" || nonce || cnonce || role || the layout's
    fingerprint (8 bytes LE, 0 without a layout) || shard k and m (4 bytes
    LE each, 0 without a shard)."""
    fp = layout_fingerprint(hello["layout"]) if "layout" in hello else 0
    k, m = hello.get("shard", (0, 0))
    msg = b"psd-auth-v1" + nonce + cnonce + hello["role"].encode() + struct.pack("<QII", fp, k, m)
    return hmac.new(token, msg, hashlib.sha256).digest()


def server_proof(token, cnonce, nonce):
    """psd's proof in its WELCOME."""
    return hmac.new(token, b"psd-auth-v1-server" + cnonce + nonce, hashlib.sha256).digest()


def write_token(path, secret, mode=0o600):
    """Writes secret (bytes) and a newline to path with mode; returns the
    secret as psd reads it (without the newline)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    os.chmod(path, mode)
    return secret


# ---- a raw protocol client ------------------------------------------------------


class Closed(Exception):
    """psd closed the connection (EOF or reset)."""


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def floats(values):
    """float32 little-endian bytes, as "data" carries them."""
    import numpy as np
    return np.asarray(values, dtype="<f4").tobytes()


# ---- bfloat16 tensors ("dt" 1), computed with numpy, not common/vec.c ----------

DT_F32 = 0
DT_BF16 = 1
DT_F32Z = 2  # float32 without its zeros: a bitmap, then the values (PROTOCOL.md section 3)
DT_F32ZSTD = 3  # float32 compressed: one zstd frame of the values (section 3)


def wire_bit(dt):
    """The bit of element type dt in a WELCOME's "wire"."""
    return 1 << dt


def bf16_bits(values):
    """float32 values as bfloat16 bit patterns (uint16): the top 16 bits of
    each float32, rounded to nearest with ties to even; a NaN keeps its top
    bits with the quiet bit (0x0040) set; infinities stay infinite and a
    finite value that rounds past the largest bfloat16 becomes infinite."""
    import numpy as np
    u = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype("<u2")


def bf16_bytes(values):
    """float32 values as "data" carries them with "dt": 1 (little-endian
    bfloat16, 2 bytes each)."""
    return bf16_bits(values).tobytes()


def bf16_widen(data):
    """bfloat16 bytes (or uint16 bit patterns) as float32: exact."""
    import numpy as np
    h = np.frombuffer(data, dtype="<u2") if isinstance(data, (bytes, bytearray)) else np.asarray(data, "<u2")
    return (h.astype("<u4") << 16).view("<f4")


def memfd(nbytes, seals=fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW):
    """A memfd of nbytes with those seals, as a worker offers psd one
    (PROTOCOL.md 6.1, 13.9); the caller closes it."""
    fd = os.memfd_create("psd-test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


class RawClient:
    """One TCP connection to psd, spoken to frame by frame. Every receive has
    a timeout, so a psd that hangs fails the test instead of stalling it."""

    def __init__(self, addr, timeout=10.0):
        host, port = addr.rsplit(":", 1)
        self.timeout = timeout
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.next_id = 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send_raw(self, data):
        self.sock.sendall(data)

    def send_frame(self, obj):
        """Packs obj with Python's msgpack and sends it as one frame."""
        self.sock.sendall(frame(pack(obj)))

    def request(self, obj, timeout=None):
        """Gives obj the next request id (unless it has one), sends it and
        returns the reply frame."""
        if "id" not in obj:
            obj = dict(obj, id=self.next_id)
            self.next_id += 1
        self.send_frame(obj)
        return self.recv_frame(timeout)

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no complete frame from psd in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                raise Closed("connection reset")
            if not chunk:
                raise Closed("connection closed")
            self.buf += chunk

    def recv_frame(self, timeout=None):
        """Returns the next frame decoded to a dict; raises Closed on EOF or
        reset and socket.timeout when nothing complete arrives in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._fill(4, deadline)
        (n,) = struct.unpack(">I", self.buf[:4])
        if n == 0 or n > (1 << 30):
            raise AssertionError("psd sent a frame length of %d" % n)
        self._fill(4 + n, deadline)
        payload, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)

    def expect_closed(self, timeout=None):
        """Reads until psd closes the connection; frames that come first are
        returned (psd may still send an ERROR before closing)."""
        frames = []
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                frames.append(self.recv_frame(max(0.0, deadline - time.monotonic())))
            except Closed:
                return frames

    def hello_admin(self, token=None):
        msg = {"t": T_HELLO, "v": PROTO_VERSION, "role": "admin"}
        r = self.request(msg)
        if token is not None:
            r = self.authenticate(r, msg, token)
        if r.get("t") != T_WELCOME:
            raise AssertionError("admin hello answered with %r" % (r,))
        return r

    def hello_worker(self, layout, shard, nshards, fp=True, token=None, **extra):
        msg = {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [shard, nshards], "layout": layout}
        msg.update(extra)
        if fp:
            msg["fp"] = layout_fingerprint(layout)
        r = self.request(msg)
        if token is not None:
            r = self.authenticate(r, msg, token)
        return r

    def authenticate(self, challenge, hello, token):
        """Answers psd's CHALLENGE to hello with the proof of token (bytes)
        and returns psd's reply; a WELCOME must carry psd's own proof."""
        if challenge.get("t") != T_CHALLENGE:
            raise AssertionError("hello answered with %r, not a challenge" % (challenge,))
        cnonce = os.urandom(32)
        r = self.request({"t": T_AUTH, "cnonce": cnonce,
                          "proof": auth_proof(token, challenge["nonce"], cnonce, hello)})
        if r.get("t") == T_WELCOME and r.get("sproof") != server_proof(token, cnonce, challenge["nonce"]):
            raise AssertionError("psd's WELCOME does not prove the token: %r" % (r,))
        return r

    def heartbeat(self):
        return self.request({"t": T_HEARTBEAT})


def expect_error(test, reply, code, what=""):
    """Asserts that reply is an ERROR frame with the given code and a
    readable text."""
    test.assertIsInstance(reply, dict, what)
    test.assertEqual(reply.get("t"), T_ERROR, "%s: expected ERROR %d, got %r" % (what, code, reply))
    test.assertEqual(reply.get("code"), code, "%s: expected code %d, got %r" % (what, code, reply))
    test.assertIsInstance(reply.get("text"), str, what)
    test.assertTrue(reply["text"], "%s: ERROR without text" % what)


def seeded_random(name):
    """A random.Random whose seed is printed, so a failure can be replayed
    with PSD_TEST_SEED."""
    seed = int(os.environ.get("PSD_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 1 << 31)
    sys.stderr.write("%s: random seed %d (set PSD_TEST_SEED to replay)\n" % (name, seed))
    return random.Random(seed)


# ---- a key's part (PROTOCOL.md 13.7), computed here from the protocol's formula on its own ----

M64 = (1 << 64) - 1


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def jump(key, n):
    """Lamping and Veach's jump consistent hash, in Python integers and
    doubles (PROTOCOL.md 13.7)."""
    b, j = -1, 0
    while j < n:
        b = j
        key = (key * 2862933555777941757 + 1) & M64
        j = int(float(b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def part_of(key, n):
    """The part of key among n parts."""
    return 0 if n == 1 else jump(mix(key), n)

