#!/usr/bin/python3
"""multihost.py - psd across simulated hosts on shaped links, against ring allreduce.

    sudo bench/multihost.py [--quick] [--sizes 235146,4M] [--rates 1000,100]
                            [--placements central,split,stagger,gloo,mpi]
                            [--train split,ddp] [--budget SECONDS] [--out DIR]
    sudo bench/multihost.py --tta w1,cnn [--tta-rates 10,100] [--arms bsp,local,ddp,...]
                            [--arm-seconds 240]      # time to accuracy
    sudo bench/multihost.py --cleanup      # remove namespaces a killed run left behind

Needs root (network namespaces and tc), iproute2, Debian's python3 with
msgpack and numpy, python3-torch for the gloo rows and the DDP baseline,
Open MPI (openmpi-bin, and bench/mpi_allreduce from libopenmpi-dev) for the
MPI rows, and the psd build (psd, psworker) of --build.

The machine: H hosts are network namespaces (4 worker hosts h0..h3 and, for
the central placement, a fifth, h4), each with one veth link to a bridge in
a namespace of its own (the switch). Every link is shaped in both
directions with tbf, once on each end of its veth pair (this needs no
netem), to each --rates value in Mbit/s. All traffic stays inside these
namespaces; the run removes them when it ends, also on Ctrl-C, SIGTERM or
an error (its processes first, each by its own process group).

A cell is a placement, a model of S float32 values and a link rate:

- central: one psd on h4, 4 workers (one per worker host) in BSP.
- split:   the model in 4 parts (PROTOCOL.md 6.2), one psd on each worker
           host; each worker reaches its own host's psd on the host's own
           address (no link) and the 3 others over the links, sending
           every part's request before it reads a reply, in part order
           with its own host's part last (psworker's order up to libpsclient
           1.3.0).
- stagger: split, but worker k sends to parts k+1, k+2, ... first, so no
           psd receives from every worker at once, and reads the replies
           in that order: libpsclient's order since 1.3.1 (the reading
           order since 1.4; psworker's). With --psd-barrier every round
           ends with a BARRIER on part 0's psd, as libpsclient 1.4 does
           (PROTOCOL.md section 5).
- concurrent: split, every part's requests written at once (non-blocking
           sockets) and each reply read as it arrives; with --piece N, psd's
           bsp_piece is N and each part goes as a PUSH and a PULL per piece.
- rr:      split with --piece N as libpsclient's pieces option sends it: a
           sending thread writes piece 0 of parts k+1, k+2, ..., then piece
           1 of each, ..., with blocking sends (the send buffer paces them),
           while the worker reads every part's replies as they come.
- pieces:  a what-if for key-range pieces that close their rounds on their
           own: --pieces psd on each worker host, each holding a piece of
           the host's part; worker k sends piece 0 of hosts k+1, k+2, ...,
           then piece 1, ..., its own host's pieces last.
- gloo:    torch.distributed.all_reduce (gloo, ring) of S floats on 4 ranks.
- mpi:     MPI_Allreduce of S floats, 4 ranks, one orted per host namespace
           (mpirun's rsh agent is `ip netns exec`), TCP only.

The psd rows use bench/mh_rounds.py, a worker written from the protocol
document with Python's msgpack (psbench starts its own psd on 127.0.0.1,
so it cannot be placed in a namespace). It prints per cell the round's p50
and mean over every worker's timed rounds, the bytes/rate limit and the
ratios to gloo and to that limit:

- ring and split: every worker sends 2 (H-1)/H x 4 S bytes and receives as
  many, in two phases that cannot overlap (reduce-scatter then allgather;
  push then the round's reply): limit = 2 (H-1)/H x 4 S / rate;
- central: psd's link carries every worker's push in and every reply out,
  H x 4 S bytes each way: limit = H x 4 S / rate (a round's replies can
  leave while the next round's pushes arrive: the link is full duplex).

The limit is the bytes the busiest link carries each way, over its rate.

Then W1 (psworker --model mlp:256,128, BSP, 4 workers, --batch 64 each,
Adam lr 2e-3, one epoch of MNIST) with the model split over the 4 psd,
against bench/ddp_w1.py (PyTorch DDP over gloo, the same model, batch and
epoch), per rate: seconds of the epoch (the slowest worker) and test
accuracy. --train local and elastic add W1 by local SGD (psd's
local_steps = --local-steps) and elastic averaging (--elastic-alpha,
--elastic-tau), one psd on a fifth host, each worker training its own copy
with psworker's SGD at lr 0.1 (psd's model evaluated).

--tta w1,cnn measures time to accuracy instead (the grid and --train are
left out unless also asked for), per --tta-rates value (default 10,100),
for W1 (target 97.0%, 3 epochs) and the CNN (psworker's cnn, torch_ref.py's
W2; 98.5%, 3 epochs; --tta-epochs), 4 workers each training a quarter of
MNIST at batch 64, in the --arms: psd bsp, asgd and bsp with top-k
(--topk, default 0.01), all Adam --tta-lr (2e-3) in psd; local SGD
(--local-steps, default 16) and EASGD (--elastic-alpha 0.2, --elastic-tau
16), psworker's own SGD at --worker-lr 0.05 (--cnn-worker-lr) with
momentum --worker-momentum 0.9; the model split over 4 psd, one per worker
host, in every psd arm; PyTorch DDP (Adam 2e-3) and DDP with PyTorch's
PowerSGD hook (rank --powersgd-rank 2, plain allreduce for the first 10%
of the run's steps). Worker 0 (rank 0) keeps a copy of the model
--snapshots times an epoch (8) with its training time, all evaluated on
the 10,000 test images after training (psworker --snapshots, ddp_w1.py
--snapshots), so the evaluation is never on the clock and every arm is
measured at the same steps; time to target is the first copy at or above
it. Every arm stops after --arm-seconds of training (240) and then says
"not in N" rather than a time; the load averages before and after each
arm are printed beside it.

Results: a table on stdout, and multihost.json in --out (default
bench/out/ of the repository). Bounded: every process has a time limit
(--budget sets how long each round cell aims to take; at least 3 timed
rounds whatever it costs), and the whole run stops at --deadline seconds.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SUBNET = "10.213.7"
PORT = 7000
RANK_PORT = 29500
PIECE_PORT = 7100  # the pieces placement: psd q of a host on PIECE_PORT + q


class Deadline(Exception):
    pass


def parse_size(s):
    s = s.strip()
    mult = 1
    if s[-1:] in ("k", "K"):
        mult, s = 1 << 10, s[:-1]
    elif s[-1:] in ("m", "M"):
        mult, s = 1 << 20, s[:-1]
    return int(float(s) * mult)


class Machine:
    """The namespaces, links and processes of one run; cleanup() undoes all of it."""

    def __init__(self, nhosts, out, tag=None, verbose=False):
        self.prefix = "psmh%d" % os.getpid() if tag is None else tag
        self.sw = self.prefix + "-sw"
        self.hosts = [self.prefix + "-h%d" % i for i in range(nhosts)]
        self.out = out
        self.procs = []
        self.verbose = verbose
        self.made = []
        self.sysctls = []  # KEY=VALUE set in every host's namespace (--sysctl)

    def ip(self, i):
        return "%s.%d" % (SUBNET, i + 1)

    def sh(self, *argv, check=True):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError("%s failed: %s" % (" ".join(argv), r.stderr.strip()))
        return r

    def create(self):
        for ns in [self.sw] + self.hosts:
            self.sh("ip", "netns", "add", ns)
            self.made.append(ns)
        self.sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            port = "h%d" % i
            self.sh("ip", "-n", self.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.sh("ip", "-n", self.sw, "link", "set", port, "master", "br0")
            self.sh("ip", "-n", self.sw, "link", "set", port, "up")
            self.sh("ip", "-n", ns, "addr", "add", self.ip(i) + "/24", "dev", "eth0")
            self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
            for kv in self.sysctls:
                self.sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", kv)

    def shape(self, mbit):
        """tbf at mbit Mbit/s on both ends of every host's veth pair."""
        rate_bytes = mbit * 1e6 / 8
        # a burst of about 1 ms of the rate (at least 32 KiB, above one
        # 64 KiB GSO packet split by tbf): enough for the timer to keep up,
        # small against a round
        burst = max(32 * 1024, int(rate_bytes / 1000))
        for i, ns in enumerate(self.hosts):
            for where, dev in ((self.sw, "h%d" % i), (ns, "eth0")):
                self.sh("tc", "-n", where, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "%dmbit" % mbit,
                        "burst", str(burst), "latency", "50ms")

    def drops(self):
        """Packets the links' tbf queues have dropped so far (both ends of every link)."""
        n = 0
        for i, ns in enumerate(self.hosts):
            for where, dev in ((self.sw, "h%d" % i), (ns, "eth0")):
                r = self.sh("tc", "-s", "-j", "-n", where, "qdisc", "show", "dev", dev, check=False)
                try:
                    n += sum(q.get("drops", 0) for q in json.loads(r.stdout or "[]"))
                except ValueError:
                    pass
        return n

    def spawn(self, host, argv, name, env=None):
        """Starts argv in host's namespace (its own process group); stdout is
        captured, stderr goes to OUT/name.log."""
        log = open(os.path.join(self.out, name + ".log"), "w")
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.Popen(["ip", "netns", "exec", self.hosts[host]] + argv, stdout=subprocess.PIPE,
                             stderr=log, env=e, start_new_session=True, text=True)
        p.name, p.log = name, log
        self.procs.append(p)
        if self.verbose:
            print("  [%s] %s" % (self.hosts[host], " ".join(argv)), file=sys.stderr)
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=10):
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        p.log.close()
        if p in self.procs:
            self.procs.remove(p)

    def cleanup(self):
        for p in list(self.procs):
            try:
                self.stop(p, signal.SIGKILL, timeout=5)
            except Exception:  # keep going: the namespaces must go
                pass
        self.kill_strays()
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made = []

    def kill_strays(self):
        """Kills what is still inside our namespaces: it was started by this
        run (mpirun's orted daemonize themselves out of their process group)."""
        for ns in self.made:
            r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def wait_all(procs, timeout, what):
    """Waits for every process to exit 0 and returns their stdout JSON."""
    end = time.monotonic() + timeout
    out = []
    for p in procs:
        left = end - time.monotonic()
        try:
            stdout, _ = p.communicate(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            raise Deadline("%s: %s did not finish within %.0f s (log %s)" % (what, p.name, timeout, p.log.name))
        if p.returncode != 0:
            p.log.flush()
            raise RuntimeError("%s: %s exited with %s; its log %s ends:\n%s" %
                               (what, p.name, p.returncode, p.log.name, tail(p.log.name)))
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError("%s: %s printed no result (log %s)" % (what, p.name, p.log.name))
        r = json.loads(lines[-1])
        r["_lines"] = [json.loads(ln) for ln in lines]
        out.append(r)
    return out


def tail(path, n=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def wait_file(path, proc, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s before listening:\n%s" % (proc.name, proc.returncode,
                                                                            tail(proc.log.name)))
        time.sleep(0.05)
    raise Deadline("%s did not listen within %.0f s" % (proc.name, timeout))


class Bench:
    def __init__(self, a, m):
        self.a, self.m = a, m
        self.psd_bin = os.path.join(a.build, "server", "psd")
        self.worker_bin = os.path.join(a.build, "worker", "psworker")
        self.mpi_bin = os.path.join(a.build, "bench", "mpi_allreduce")
        self.workers = 4
        self.t_end = time.monotonic() + a.deadline
        self.n = 0

    def left(self):
        left = self.t_end - time.monotonic()
        if left <= 0:
            raise Deadline("the run's --deadline of %d s is over" % self.a.deadline)
        return left

    def name(self, what):
        self.n += 1
        return "%03d-%s" % (self.n, what)

    def start_psd(self, host, tag, args, port=PORT):
        pf = os.path.join(self.m.out, "%s.port" % tag)
        if os.path.exists(pf):
            os.unlink(pf)
        mode = [] if "--mode" in args else ["--mode", "bsp"]
        argv = [self.psd_bin, "--listen", "%s:%d" % (self.m.ip(host), port), "--port-file", pf,
                "--workers", str(self.workers), "--log-level", "warn"] + mode + [
                "--set", "allow_remote_without_token=yes"] + args
        p = self.m.spawn(host, argv, tag)
        wait_file(pf, p, 20)
        return p

    def link_check(self, mbit):
        """One TCP stream h0 -> h1 for about a second: the goodput the shaping lets through."""
        nbytes = int(mbit * 1e6 / 8 * min(1.0, self.a.budget / 4))
        recv = self.m.spawn(1, [PY, __file__, "--sink", "%s:%d" % (self.m.ip(1), PORT + 1), str(nbytes)],
                            self.name("sink"))
        send = self.m.spawn(0, [PY, __file__, "--source", "%s:%d" % (self.m.ip(1), PORT + 1), str(nbytes)],
                            self.name("source"))
        r = wait_all([recv, send], min(60, self.left()), "link check")[0]
        return r["bytes"] * 8 / r["seconds"] / 1e6

    def rounds_for(self, limit_s):
        """Timed rounds for a cell whose round should take about limit_s."""
        est = max(limit_s * 1.5, 0.002)
        return int(max(3, min(self.a.max_rounds, self.a.budget / est)))

    def piece_for(self, size):
        """--piece's value for a model of size floats (0: none)."""
        spec = self.a.piece
        if ":" not in spec:
            return parse_size(spec)
        for item in spec.split(","):
            s, n = item.split(":")
            if parse_size(s) == size:
                return parse_size(n)
        return 0

    def psd_cell(self, placement, size, mbit):
        h = self.workers
        piece = self.piece_for(size) if placement in ("concurrent", "rr") else 0
        # the pieces' psd close rounds in pieces of that size
        pset = ["--set", "bsp_piece=%d" % piece] if piece else []
        frac = h if placement == "central" else 2 * (h - 1) / h
        limit = frac * 4 * size * 8 / (mbit * 1e6)
        rounds = self.rounds_for(limit)
        warm = 1 if limit > 1 else 2
        psds = []
        try:
            if placement == "central":
                psds.append(self.start_psd(h, self.name("psd-central"), self.psd_args(size)))
                servers, local = "%s:%d" % (self.m.ip(h), PORT), [-1] * h
            elif placement == "pieces":
                p = self.a.pieces
                n = h * p
                bounds = [0] + [(size * i // n) // 1024 * 1024 for i in range(1, n)] + [size]
                for i in range(n):
                    psds.append(self.start_psd(i // p, self.name("psd-piece%d" % i),
                                               self.psd_args(bounds[i + 1] - bounds[i]), PIECE_PORT + i % p))
                servers = ",".join("%s:%d" % (self.m.ip(i // p), PIECE_PORT + i % p) for i in range(n))
                local = [-1] * h
            else:
                bounds = [0] + [(size * i // h) // 1024 * 1024 for i in range(1, h)] + [size]
                for i in range(h):
                    psds.append(self.start_psd(i, self.name("psd-part%d" % i),
                                               self.psd_args(bounds[i + 1] - bounds[i]) + pset))
                servers, local = ",".join("%s:%d" % (self.m.ip(i), PORT) for i in range(h)), list(range(h))
            barrier = []
            if self.a.psd_barrier and placement != "central":
                barrier = ["--psd-barrier"]
            if self.a.ideal_barrier:
                bdir = os.path.join(self.m.out, self.name("barrier"))
                os.makedirs(bdir)
                barrier = ["--barrier", bdir]
            order = {"stagger": "stagger", "concurrent": "concurrent", "rr": "rr", "sched": "sched", "lockstep": "lockstep", "pieces": "pieces:%d" % self.a.pieces}.get(placement, "parts")
            ws = [self.m.spawn(k, [PY, os.path.join(BENCH, "mh_rounds.py"), "--server", servers, "--shard",
                                   "%d/%d" % (k, h), "--size", str(size), "--rounds", str(rounds), "--warmup",
                                   str(warm), "--order", order, "--local", str(local[k])] + barrier
                               + (["--send-buffer", str(self.a.send_buffer)] if self.a.send_buffer else [])
                               + (["--lowat", str(self.a.lowat)] if self.a.lowat else [])
                               + (["--piece", str(piece)] if piece else [])
                               + (["--slice", str(self.a.slice), "--window", str(self.a.window)]
                                  if placement == "lockstep" else []),
                               self.name("rounds-%s-w%d" % (placement, k))) for k in range(h)]
            res = wait_all(ws, min(self.left(), 60 + (rounds + warm) * max(limit, 0.05) * 20), placement)
        finally:
            for p in psds:
                self.m.stop(p)
        with open(os.path.join(self.m.out, self.name("trace-%s-%d-%d" % (placement, size, mbit)) + ".json"), "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "_lines"} for r in res], f)
        times = [t for r in res for t in r["times"]]
        cell = {"placement": placement, "size": size, "mbit": mbit, "rounds": rounds, "limit_ms": limit * 1e3,
                "p50_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3}
        if placement != "central":
            cell["trace"] = trace(res)
        if barrier:
            cell["ideal_barrier" if self.a.ideal_barrier else "psd_barrier"] = True
        return cell

    def psd_args(self, n):
        return ["--set", "optimizer=sgd", "--set", "lr=1e-6", "--set", "momentum=0.9",
                "--set", "heartbeat_timeout=1h", "--set", "max_params=%d" % max(n, 1 << 20)] + self.sndbuf_set()

    def sndbuf_set(self):
        """--send-buffer: psd's send_buffer setting; --psd-set's settings."""
        return (["--set", "send_buffer=%d" % self.a.send_buffer] if self.a.send_buffer else []) + \
            [x for kv in self.a.psd_set for x in ("--set", kv)]

    def gloo_cell(self, size, mbit):
        h = self.workers
        limit = 2 * (h - 1) / h * 4 * size * 8 / (mbit * 1e6)
        rounds = self.rounds_for(limit)
        master = "%s:%d" % (self.m.ip(0), RANK_PORT)
        ps = [self.m.spawn(k, [PY, os.path.join(BENCH, "mh_allreduce.py"), "--master", master, "--rank", str(k),
                               "--world", str(h), "--size", str(size), "--rounds", str(rounds)],
                           self.name("gloo-r%d" % k), env={"GLOO_SOCKET_IFNAME": "eth0"}) for k in range(h)]
        res = wait_all(ps, min(self.left(), 90 + (rounds + 2) * max(limit, 0.05) * 20), "gloo")
        times = [t for r in res for t in r["times"]]
        return {"placement": "gloo", "size": size, "mbit": mbit, "rounds": rounds, "limit_ms": limit * 1e3,
                "p50_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3}

    def mpi_cell(self, size, mbit):
        """MPI_Allreduce on 4 ranks, one per host namespace: mpirun runs in h0
        and starts an orted in each other host through `ip netns exec`."""
        h = self.workers
        if not os.path.exists(self.mpi_bin) or not shutil.which("mpirun"):
            return {"placement": "mpi", "size": size, "mbit": mbit,
                    "skipped": "bench/mpi_allreduce or mpirun missing (libopenmpi-dev, openmpi-bin)"}
        limit = 2 * (h - 1) / h * 4 * size * 8 / (mbit * 1e6)
        agent = os.path.join(self.m.out, "netns-agent.sh")
        with open(agent, "w") as f:
            # mpirun calls its rsh agent as: agent HOST command...; HOST is a namespace
            f.write("#!/bin/sh\nns=\"$1\"; shift\nexec ip netns exec \"$ns\" /bin/sh -c \"$*\"\n")
        os.chmod(agent, 0o755)
        # rank 0 on mpirun's own node (it runs in h0, under the machine's
        # host name), ranks 1..3 each through the agent into its namespace
        hostfile = os.path.join(self.m.out, "hosts")
        with open(hostfile, "w") as f:
            f.write("".join("%s slots=1\n" % ns for ns in [socket.gethostname()] + self.m.hosts[1:h]))
        secs = max(1.0, min(self.a.budget, 3 * limit * 1.5))
        argv = ["mpirun", "--allow-run-as-root", "-np", str(h), "--hostfile", hostfile,
                "--mca", "plm_rsh_agent", agent, "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "%s.0/24" % SUBNET, "--mca", "oob_tcp_if_include", "%s.0/24" % SUBNET,
                "--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "orte_keep_fqdn_hostnames", "1",
                self.mpi_bin, "--seconds", "%.1f" % secs, "--max-iters", str(self.a.max_rounds), str(size)]
        for attempt in (1, 2):  # mpirun has been seen to hang at start-up, once in a few runs
            p = self.m.spawn(0, argv, self.name("mpi"), env={"OMPI_MCA_plm_rsh_agent": agent})
            try:
                stdout, _ = p.communicate(timeout=min(self.left(), 30 + secs * 4))
                self.m.stop(p)
                break
            except subprocess.TimeoutExpired:
                self.m.stop(p, signal.SIGKILL)
                self.m.kill_strays()
                stdout = ""
        if not stdout:
            return {"placement": "mpi", "size": size, "mbit": mbit, "skipped": "mpirun timed out twice"}
        for ln in stdout.splitlines():
            if ln.startswith("allreduce "):
                kv = dict(w.split("=") for w in ln.split()[1:])
                return {"placement": "mpi", "size": size, "mbit": mbit, "rounds": int(kv["iters"]),
                        "limit_ms": limit * 1e3, "p50_ms": float(kv["p50_ms"]), "mean_ms": float(kv["mean_ms"])}
        return {"placement": "mpi", "size": size, "mbit": mbit,
                "skipped": "mpirun failed (exit %s): %s" % (p.returncode, tail(p.log.name, 3).strip())}

    def train_split(self, mbit):
        h = self.workers
        psds = []
        try:
            for i in range(h):
                psds.append(self.start_psd(i, self.name("train-psd%d" % i),
                                           ["--set", "optimizer=adam", "--set", "lr=2e-3",
                                            "--set", "warmup_versions=0", "--set", "heartbeat_timeout=60s"]
                                           + self.sndbuf_set()))
            servers = ",".join("%s:%d" % (self.m.ip(i), PORT) for i in range(h))
            ws = [self.m.spawn(k, [self.worker_bin, "--server", servers, "--shard", "%d/%d" % (k, h),
                                   "--data", self.a.data, "--model", "mlp:256,128", "--epochs", "1",
                                   "--batch", "64", "--eval", "--quiet", "--epoch-json",
                                   "--limit", str(self.a.train_limit)]
                                  + (["--send-buffer", str(self.a.send_buffer)] if self.a.send_buffer else [])
                                  + self.a.worker_arg,
                               self.name("train-w%d" % k)) for k in range(h)]
            res = wait_all(ws, min(self.left(), self.a.train_timeout), "psworker W1")
        finally:
            for p in psds:
                self.m.stop(p)
        # the epoch's training time (psworker --epoch-json), the slowest worker's
        secs = max(ln["train_seconds"] for r in res for ln in r["_lines"] if "train_seconds" in ln)
        return {"trainer": "psd split", "mbit": mbit, "seconds": secs,
                "test_accuracy": res[0]["test_accuracy"], "version": res[0]["version"],
                "shm": [r.get("shm") for r in res]}

    def train_avg(self, mbit, kind):
        """W1 with one psd on its own host (the fifth) and 4 workers training
        their own copies with psworker's SGD at --lr 0.1: kind "local" (BSP,
        local_steps = --local-steps) or "elastic" (ASGD, elastic_alpha =
        --elastic-alpha, elastic_tau = --elastic-tau)."""
        h = self.workers
        if kind == "local":
            mode, sets = "bsp", ["--set", "local_steps=%d" % self.a.local_steps]
        else:
            mode, sets = "asgd", ["--set", "elastic_alpha=%g" % self.a.elastic_alpha,
                                  "--set", "elastic_tau=%d" % self.a.elastic_tau]
        psd = self.start_psd(h, self.name("train-%s-psd" % kind),
                             ["--mode", mode, "--set", "optimizer=sgd", "--set", "momentum=0",
                              "--set", "heartbeat_timeout=60s"] + sets + self.sndbuf_set())
        try:
            server = "%s:%d" % (self.m.ip(h), PORT)
            ws = [self.m.spawn(k, [self.worker_bin, "--server", server, "--shard", "%d/%d" % (k, h),
                                   "--data", self.a.data, "--model", "mlp:256,128", "--epochs", "1",
                                   "--batch", "64", "--lr", "0.1", "--eval", "--quiet", "--epoch-json",
                                   "--limit", str(self.a.train_limit)]
                                  + (["--send-buffer", str(self.a.send_buffer)] if self.a.send_buffer else [])
                                  + self.a.worker_arg,
                               self.name("train-%s-w%d" % (kind, k))) for k in range(h)]
            res = wait_all(ws, min(self.left(), self.a.train_timeout), "psworker W1 %s" % kind)
        finally:
            self.m.stop(psd)
        secs = max(ln["train_seconds"] for r in res for ln in r["_lines"] if "train_seconds" in ln)
        what = ("local SGD H=%d" % self.a.local_steps if kind == "local"
                else "EASGD a=%g tau=%d" % (self.a.elastic_alpha, self.a.elastic_tau))
        return {"trainer": "psd " + what, "mbit": mbit, "seconds": secs,
                "test_accuracy": res[0]["test_accuracy"], "version": res[0]["version"]}

    def train_ddp(self, mbit):
        h = self.workers
        master = "%s:%d" % (self.m.ip(0), RANK_PORT)
        ps = [self.m.spawn(k, [PY, os.path.join(BENCH, "ddp_w1.py"), "--master", master, "--rank", str(k),
                               "--world", str(h), "--epochs", "1", "--batch", "64", "--lr", "2e-3",
                               "--data", self.a.data, "--limit", str(self.a.train_limit)],
                           self.name("ddp-r%d" % k), env={"GLOO_SOCKET_IFNAME": "eth0"}) for k in range(h)]
        res = wait_all(ps, min(self.left(), self.a.train_timeout), "DDP W1")
        return {"trainer": "pytorch ddp (gloo)", "mbit": mbit, "seconds": res[0]["train_seconds"][0],
                "test_accuracy": res[0]["test_accuracy"], "version": res[0]["steps"]}


TTA_MODELS = {"w1": {"psworker": "mlp:256,128", "torch": "w1", "target": 0.970, "epochs": 3},
              "cnn": {"psworker": "cnn", "torch": "w2", "target": 0.985, "epochs": 3}}
TTA_ARMS = ("bsp", "asgd", "local", "easgd", "topk", "ddp", "powersgd")


def uptime():
    """The load averages (1, 5, 15 min) as `uptime` prints them."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


class TTA:
    """Time to accuracy: one model trained by 4 workers (one per worker host,
    each a quarter of MNIST, batch 64) in one arm: a psd mode (the model
    split over 4 psd, one per worker host) or PyTorch DDP (with or without
    PowerSGD). Worker (rank) 0 keeps a copy of the model --snapshots times
    an epoch with its training time and evaluates them afterwards (psworker
    and ddp_w1.py --snapshots), so every arm is measured alike; every
    worker stops after --arm-seconds of training (--max-seconds)."""

    def __init__(self, b):
        self.b, self.a, self.m = b, b.a, b.m

    def psd_sets(self, arm, model):
        """psd's settings and psworker's extra flags for a psd arm."""
        a = self.a
        lr = a.tta_lr
        adam = ["--set", "optimizer=adam", "--set", "lr=%g" % lr, "--set", "warmup_versions=0"]
        own = ["--set", "optimizer=sgd", "--set", "momentum=0"]
        wlr = a.cnn_worker_lr if model == "cnn" else a.worker_lr
        own_sgd = ["--lr", "%g" % wlr, "--momentum", "%g" % a.worker_momentum]
        if arm == "bsp":
            return "bsp", adam, ["--no-plan"]
        if arm == "asgd":
            return "asgd", adam, []
        if arm == "topk":
            return "bsp", adam, ["--no-plan", "--topk", "%g" % a.topk]
        if arm == "local":
            return "bsp", own + ["--set", "local_steps=%d" % a.local_steps], own_sgd
        if arm == "easgd":
            return "asgd", own + ["--set", "elastic_alpha=%g" % a.elastic_alpha,
                                  "--set", "elastic_tau=%d" % a.elastic_tau], own_sgd
        raise ValueError(arm)

    def label(self, arm, model):
        a = self.a
        wlr = a.cnn_worker_lr if model == "cnn" else a.worker_lr
        return {"bsp": "psd bsp (Adam %g)" % a.tta_lr,
                "asgd": "psd asgd (Adam %g)" % a.tta_lr,
                "topk": "psd bsp top-k %g (Adam %g)" % (a.topk, a.tta_lr),
                "local": "psd local SGD H=%d (SGD %g m %g)" % (a.local_steps, wlr, a.worker_momentum),
                "easgd": "psd EASGD a=%g tau=%d (SGD %g m %g)" % (a.elastic_alpha, a.elastic_tau, wlr,
                                                                   a.worker_momentum),
                "ddp": "pytorch DDP (Adam %g)" % a.tta_lr,
                "powersgd": "DDP PowerSGD r=%d (Adam %g)" % (a.powersgd_rank, a.tta_lr)}[arm]

    def run(self, model, arm, mbit, epochs):
        load0 = uptime()
        t0 = time.monotonic()
        if arm in ("ddp", "powersgd"):
            snaps, extra = self.run_ddp(model, arm, epochs)
        else:
            snaps, extra = self.run_psd(model, arm, epochs)
        target = TTA_MODELS[model]["target"]
        spe = -(-(self.a.train_limit or 60000) // (64 * self.b.workers))  # steps an epoch
        hit = next((sn for sn in snaps if sn["test_accuracy"] >= target), None)
        last = snaps[-1] if snaps else None
        done = last is not None and last["steps"] >= epochs * spe
        r = {"model": model, "arm": arm, "trainer": self.label(arm, model), "mbit": mbit, "epochs": epochs,
             "target": target, "tta_seconds": hit["train_seconds"] if hit else None,
             "tta_epochs": (hit["steps"] / spe) if hit else None,
             "final_accuracy": last["test_accuracy"] if done else None,
             "last_accuracy": last["test_accuracy"] if last else None,
             "last_epochs": (last["steps"] / spe) if last else 0,
             "last_seconds": last["train_seconds"] if last else None,
             "cap_seconds": self.a.arm_seconds, "wall_seconds": time.monotonic() - t0,
             "load": [load0, uptime()], "snapshots": snaps}
        r.update(extra)
        return r

    def run_psd(self, model, arm, epochs):
        b, h = self.b, self.b.workers
        mode, sets, wargs = self.psd_sets(arm, model)
        psds, ws = [], []
        try:
            for i in range(h):
                psds.append(b.start_psd(i, b.name("tta-%s-%s-psd%d" % (model, arm, i)),
                                        ["--mode", mode, "--set", "heartbeat_timeout=60s"] + sets + b.sndbuf_set()))
            servers = ",".join("%s:%d" % (self.m.ip(i), PORT) for i in range(h))
            for k in range(h):
                argv = [b.worker_bin, "--server", servers, "--shard", "%d/%d" % (k, h), "--data", self.a.data,
                        "--model", TTA_MODELS[model]["psworker"], "--epochs", str(epochs), "--batch", "64",
                        "--quiet", "--limit", str(self.a.train_limit), "--max-seconds", str(self.a.arm_seconds)]
                if k == 0:
                    argv += ["--snapshots", str(self.a.snapshots)]
                ws.append(self.m.spawn(k, argv + wargs + self.a.worker_arg,
                                       b.name("tta-%s-%s-w%d" % (model, arm, k))))
            # worker 0's copies are the measure; the others may still wait
            # for a round when it stops, and are stopped after it
            res = wait_all(ws[:1], min(b.left(), self.a.arm_seconds * 2 + 120), "psworker %s %s" % (model, arm))
        finally:
            for p in ws[1:] + psds:
                self.m.stop(p)
        snaps = [ln for ln in res[0]["_lines"] if "snapshot" in ln]
        return snaps, {"version": res[0]["version"]}

    def run_ddp(self, model, arm, epochs):
        b, h = self.b, self.b.workers
        master = "%s:%d" % (self.m.ip(0), RANK_PORT)
        extra = ["--powersgd", str(self.a.powersgd_rank)] if arm == "powersgd" else []
        ps = [self.m.spawn(k, [PY, os.path.join(BENCH, "ddp_w1.py"), "--master", master, "--rank", str(k),
                               "--world", str(h), "--model", TTA_MODELS[model]["torch"], "--epochs", str(epochs),
                               "--batch", "64", "--lr", "%g" % self.a.tta_lr, "--data", self.a.data,
                               "--limit", str(self.a.train_limit), "--snapshots", str(self.a.snapshots),
                               "--max-seconds", str(self.a.arm_seconds)] + extra,
                           b.name("tta-%s-%s-r%d" % (model, arm, k)), env={"GLOO_SOCKET_IFNAME": "eth0"})
              for k in range(h)]
        try:
            # the last copy point may come up to an epoch / --snapshots after the cap
            res = wait_all(ps, min(b.left(), self.a.arm_seconds * 3 + 180), "DDP %s %s" % (model, arm))
        finally:
            for p in ps:
                self.m.stop(p)
        snaps = [ln for ln in res[0]["_lines"] if "snapshot" in ln]
        return snaps, {"version": res[0]["run_steps"], "start_powersgd": res[0].get("start_powersgd")}


def tta_report(rows):
    """The time-to-accuracy table, and each psd arm's time over DDP's and
    DDP with PowerSGD's (same model and rate)."""
    lines = []
    keys = []
    for r in rows:
        if (r["model"], r["mbit"]) not in keys:
            keys.append((r["model"], r["mbit"]))
    for model, mbit in keys:
        rs = [r for r in rows if r["model"] == model and r["mbit"] == mbit]
        lines.append("")
        lines.append("%s, 4 workers, %d Mbit/s: time to %.1f%% test accuracy (training seconds, worker 0), and "
                     "accuracy after %d epochs" % (model.upper(), mbit, 100 * rs[0]["target"], rs[0]["epochs"]))
        lines.append("%-34s %12s %7s %9s %8s %8s  %s" % ("arm", "to target s", "epochs", "accuracy", "/DDP",
                                                         "/PowerSGD", "load before / after"))
        ref = {r["arm"]: r for r in rs}

        def ratio(r, other):
            o = ref.get(other)
            if not o or r["tta_seconds"] is None:
                return "-"
            if o["tta_seconds"] is None:  # the other did not get there in its cap
                return "<%.2f" % (r["tta_seconds"] / o["last_seconds"]) if o.get("last_seconds") else "-"
            return "%.2f" % (r["tta_seconds"] / o["tta_seconds"])

        for r in rs:
            tta = ("%.1f" % r["tta_seconds"] if r["tta_seconds"] is not None
                   else "not in %.0f" % (r["last_seconds"] or 0))
            ep = "%.2f" % r["tta_epochs"] if r["tta_epochs"] is not None else "-"
            acc = ("%.2f%%" % (100 * r["final_accuracy"]) if r["final_accuracy"] is not None
                   else "(%.2f%% at %.2f ep)" % (100 * (r["last_accuracy"] or 0), r["last_epochs"]))
            lines.append("%-34s %12s %7s %9s %8s %8s  %s / %s" % (r["trainer"], tta, ep, acc, ratio(r, "ddp"),
                                                                  ratio(r, "powersgd"), r["load"][0], r["load"][1]))
    return "\n".join(lines)


def trace(res):
    """What the workers' timestamps say about a split round: how far apart
    the workers start a round, and how far apart the parts' psd close it
    (a part's first reply to any worker), medians over the rounds, ms."""
    rounds = min(len(r["starts"]) for r in res)
    start_spread, close_spread = [], []
    for j in range(rounds):
        starts = [r["starts"][j] for r in res]
        start_spread.append(max(starts) - min(starts))
        nparts = len(res[0]["replies"][j])
        closes = [min(r["replies"][j][i] for r in res) for i in range(nparts)]
        close_spread.append(max(closes) - min(closes))
    return {"start_spread_ms": statistics.median(start_spread) * 1e3,
            "close_spread_ms": statistics.median(close_spread) * 1e3}


def fmt_size(s):
    return "{:,}".format(s)


def congestion_control():
    """The TCP congestion control a new namespace starts with (the
    machine's default: Debian's is cubic; --sysctl may change it)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            return f.read().strip()
    except OSError:
        return "?"


def report(cells, trains, link, sysctls=()):
    lines = []
    cc = [kv.split("=", 1)[1] for kv in sysctls if kv.startswith("net.ipv4.tcp_congestion_control=")]
    lines.append("TCP congestion control: %s" % (cc[-1] if cc else congestion_control()))
    for mbit, goodput in link.items():
        lines.append("link check at %d Mbit/s: one TCP stream h0 -> h1 moved %.0f Mbit/s" % (mbit, goodput))
    keys = sorted({(c["size"], c["mbit"]) for c in cells}, key=lambda k: (-k[1], k[0]))
    if keys:
        lines.append("")
        lines.append("BSP round of 4 workers, ms (p50 / mean), and p50 ratios")
        lines.append("%-9s %11s %5s %17s %9s %8s %8s  %s" % ("placement", "floats", "Mbit", "p50 / mean ms",
                                                             "limit ms", "/gloo", "/limit", "note"))
    for size, mbit in keys:
        row = {c["placement"]: c for c in cells if c["size"] == size and c["mbit"] == mbit}
        gloo = row.get("gloo", {}).get("p50_ms")
        for pl in ("central", "split", "stagger", "concurrent", "rr", "pieces", "sched", "lockstep", "gloo", "mpi"):
            c = row.get(pl)
            if not c:
                continue
            if "skipped" in c:
                lines.append("%-9s %11s %5d  skipped: %s" % (pl, fmt_size(size), mbit, c["skipped"]))
                continue
            note = "%d drops; " % c["drops"] if "drops" in c else ""
            if c.get("ideal_barrier"):
                note = "ideal barrier; " + note
            if c.get("psd_barrier"):
                note = "psd barrier; " + note
            if "trace" in c:
                note += "workers start %.1f ms apart, parts close %.1f ms apart" % (
                    c["trace"]["start_spread_ms"], c["trace"]["close_spread_ms"])
            lines.append("%-9s %11s %5d %8.1f / %6.1f %9.1f %8s %8s  %s" % (
                pl, fmt_size(size), mbit, c["p50_ms"], c["mean_ms"], c["limit_ms"],
                "%.2fx" % (c["p50_ms"] / gloo) if gloo else "-", "%.2fx" % (c["p50_ms"] / c["limit_ms"]), note))
    if trains:
        lines.append("")
        lines.append("W1, 4 workers, one epoch (batch 64 per worker; Adam 2e-3, local SGD and EASGD: SGD 0.1)")
        lines.append("%-20s %5s %9s %9s %8s" % ("trainer", "Mbit", "seconds", "accuracy", "steps"))
        for t in trains:
            lines.append("%-20s %5d %9.2f %8.2f%% %8d" % (t["trainer"], t["mbit"], t["seconds"],
                                                          100 * (t["test_accuracy"] or 0), t["version"]))
    return "\n".join(lines)


def sink(addr, nbytes):
    host, port = addr.rsplit(":", 1)
    srv = socket.create_server((host, int(port)))
    srv.settimeout(60)
    c, _ = srv.accept()
    buf = bytearray(1 << 20)
    got, t0 = 0, None
    while got < nbytes:
        k = c.recv_into(buf)
        if k == 0:
            break
        if t0 is None:
            t0 = time.monotonic()
        got += k
    print(json.dumps({"bytes": got, "seconds": time.monotonic() - t0}))


def source(addr, nbytes):
    host, port = addr.rsplit(":", 1)
    end = time.monotonic() + 30
    while True:
        try:
            s = socket.create_connection((host, int(port)), timeout=60)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    chunk = b"\0" * (1 << 20)
    sent = 0
    while sent < nbytes:
        sent += s.send(chunk[:min(len(chunk), nbytes - sent)])
    s.close()
    print(json.dumps({"sent": sent}))


def stale_cleanup():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    gone = []
    for line in r.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith("psmh"):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # left by the killed run that made the namespace
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            gone.append(ns)
    print("multihost: removed %d namespaces%s" % (len(gone), (": " + " ".join(gone)) if gone else ""))


def main():
    if len(sys.argv) == 4 and sys.argv[1] in ("--sink", "--source"):
        return (sink if sys.argv[1] == "--sink" else source)(sys.argv[2], int(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="See bench/README.md.")
    ap.add_argument("--quick", action="store_true",
                    help="235,146 floats only, W1 at 1000 Mbit/s only, short cells: a few minutes")
    ap.add_argument("--sizes", default="235146,4M", help="model sizes in floats (k, M: 2^10, 2^20)")
    ap.add_argument("--rates", default="1000,100", help="link rates, Mbit/s")
    ap.add_argument("--placements", default="central,split,stagger,gloo,mpi")
    ap.add_argument("--send-buffer", type=int, default=0,
                    help="bytes: psd's send_buffer setting, psworker's --send-buffer and mh_rounds.py's (SO_SNDBUF)")
    ap.add_argument("--psd-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every psd the bench starts, e.g. pace_replies=yes")
    ap.add_argument("--piece", default="0",
                    help="the concurrent and rr placements: psd's bsp_piece, and their workers push and pull in pieces of "
                         "this many values; N, or SIZE:N,SIZE:N,... for a piece size per model size")
    ap.add_argument("--lowat", type=int, default=0,
                    help="bytes: mh_rounds.py's TCP_NOTSENT_LOWAT on every connection (a send returns when at "
                         "most this much is unsent, so a worker's pushes leave one after another)")
    ap.add_argument("--slice", type=int, default=16384, help="the lockstep placement: values a chunk")
    ap.add_argument("--window", type=int, default=2, help="the lockstep placement: chunk pulls in flight per part")
    ap.add_argument("--psd-barrier", action="store_true",
                    help="the psd placements' workers end each round with a BARRIER on part 0's psd (PROTOCOL.md; "
                         "libpsclient 1.4 does it, so psworker's W1 runs always have it unless --worker-arg "
                         "--barrier=off), counted in the round's time")
    ap.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="an argument for every psworker of the W1 runs, e.g. --barrier=off")
    ap.add_argument("--ideal-barrier", action="store_true",
                    help="what-if: the psd placements' workers start each round together (mh_rounds.py --barrier)")
    ap.add_argument("--pieces", type=int, default=4, help="psd per host in the pieces placement (a what-if)")
    ap.add_argument("--sysctl", action="append", default=[], metavar="KEY=VALUE",
                    help="a sysctl set in every host's namespace, e.g. net.ipv4.tcp_slow_start_after_idle=0; "
                         "net.ipv4.tcp_congestion_control takes only what net.ipv4.tcp_allowed_congestion_control "
                         "lists there (the kernel's rule for namespaces)")
    ap.add_argument("--train", default="split,ddp",
                    help="W1 runs: split, ddp, local (local SGD), elastic (EASGD), or none")
    ap.add_argument("--local-steps", type=int, default=16, help="the local trainer: psd's local_steps")
    ap.add_argument("--elastic-alpha", type=float, default=0.2, help="the elastic trainer: psd's elastic_alpha")
    ap.add_argument("--elastic-tau", type=int, default=16, help="the elastic trainer: psd's elastic_tau")
    ap.add_argument("--tta", default="", metavar="MODELS",
                    help="time to accuracy instead of the grid: w1, cnn or w1,cnn (the round cells and --train are "
                         "left out unless asked for)")
    ap.add_argument("--arms", default=",".join(TTA_ARMS), help="--tta's arms: " + ", ".join(TTA_ARMS))
    ap.add_argument("--tta-rates", default="10,100", help="--tta's link rates, Mbit/s")
    ap.add_argument("--tta-epochs", default="", metavar="MODEL=N,...",
                    help="--tta's fixed epochs (default w1=%d,cnn=%d)" % (TTA_MODELS["w1"]["epochs"],
                                                                        TTA_MODELS["cnn"]["epochs"]))
    ap.add_argument("--arm-seconds", type=float, default=240,
                    help="--tta: every arm's workers stop after this much training time")
    ap.add_argument("--snapshots", type=int, default=8, help="--tta: model copies an epoch (evaluated afterwards)")
    ap.add_argument("--tta-lr", type=float, default=2e-3, help="--tta: Adam's lr (psd bsp, asgd, top-k; DDP)")
    ap.add_argument("--worker-lr", type=float, default=0.05,
                    help="--tta: psworker's own SGD lr in local SGD and EASGD (W1)")
    ap.add_argument("--cnn-worker-lr", type=float, default=0.05, help="the same for the CNN")
    ap.add_argument("--worker-momentum", type=float, default=0.9,
                    help="--tta: psworker's own SGD momentum in local SGD and EASGD")
    ap.add_argument("--topk", type=float, default=0.01, help="--tta's top-k arm: psworker --topk")
    ap.add_argument("--powersgd-rank", type=int, default=2, help="--tta's PowerSGD arm: matrix_approximation_rank")
    ap.add_argument("--train-rates", default=None, help="rates for W1 (default: --rates)")
    ap.add_argument("--train-limit", type=int, default=0, help="W1 on the first N training samples (0: all)")
    ap.add_argument("--train-timeout", type=float, default=300)
    ap.add_argument("--budget", type=float, default=15.0, help="seconds each round cell aims for")
    ap.add_argument("--max-rounds", type=int, default=400)
    ap.add_argument("--deadline", type=float, default=3600, help="the whole run stops after this many seconds")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    ap.add_argument("--out", default=os.path.join(BENCH, "out"))
    ap.add_argument("--cleanup", action="store_true", help="remove namespaces left by a killed run, and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.cleanup:
        stale_cleanup()
        return 0
    tta_models = [x for x in a.tta.split(",") if x]
    tta_arms = [x for x in a.arms.split(",") if x]
    tta_rates = [int(r) for r in a.tta_rates.split(",") if r] if tta_models else []
    tta_epochs = {k: v["epochs"] for k, v in TTA_MODELS.items()}
    for item in [x for x in a.tta_epochs.split(",") if x]:
        k, _, v = item.partition("=")
        if k not in TTA_MODELS or not v.isdigit() or int(v) < 1:
            ap.error("bad --tta-epochs '%s': MODEL=N with MODEL w1 or cnn" % item)
        tta_epochs[k] = int(v)
    for x in tta_models:
        if x not in TTA_MODELS:
            ap.error("unknown --tta model '%s': w1 or cnn" % x)
    for x in tta_arms:
        if x not in TTA_ARMS:
            ap.error("unknown --arms '%s': %s" % (x, ", ".join(TTA_ARMS)))
    if tta_models:
        # the grid and --train only when asked for beside it
        if "--placements" not in sys.argv:
            a.placements = ""
        if "--train" not in sys.argv:
            a.train = "none"
        if "--rates" not in sys.argv:
            a.rates = ""
    if a.quick:
        a.sizes = "235146"
        a.train_rates = a.train_rates or "1000"
        a.budget = min(a.budget, 5.0)
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    rates = [int(r) for r in a.rates.split(",") if r]
    placements = [p for p in a.placements.split(",") if p]
    trainers = [t for t in a.train.split(",") if t and t != "none"]
    train_rates = [int(r) for r in (a.train_rates or a.rates).split(",") if r]
    for p in placements:
        if p not in ("central", "split", "stagger", "concurrent", "rr", "pieces", "sched", "lockstep", "gloo", "mpi"):
            ap.error("unknown placement '%s'" % p)
    for t in trainers:
        if t not in ("split", "ddp", "local", "elastic"):
            ap.error("unknown --train '%s'" % t)
    if os.geteuid() != 0:
        sys.exit("multihost: needs root (network namespaces and tc); run it with sudo")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            sys.exit("multihost: '%s' not found (Debian package iproute2)" % tool)
    for b in ("server/psd", "worker/psworker"):
        if not os.path.exists(os.path.join(a.build, b)):
            sys.exit("multihost: %s not found: build first (scripts/setup.sh) or give --build" %
                     os.path.join(a.build, b))
    needs_torch = "gloo" in placements or "ddp" in trainers or any(x in tta_arms for x in ("ddp", "powersgd"))
    if needs_torch and subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode != 0:
        print("multihost: no PyTorch for %s (Debian python3-torch): leaving out gloo and DDP" % PY, file=sys.stderr)
        placements = [p for p in placements if p != "gloo"]
        trainers = [t for t in trainers if t != "ddp"]
        tta_arms = [x for x in tta_arms if x not in ("ddp", "powersgd")]
    out = os.path.abspath(os.path.join(a.out, "multihost"))
    os.makedirs(out, exist_ok=True)
    nhosts = 5 if "central" in placements or "local" in trainers or "elastic" in trainers else 4
    m = Machine(nhosts, out, verbose=a.verbose)
    m.sysctls = a.sysctl

    def on_term(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_term)
    cells, trains, link, ttas = [], [], {}, []
    status = 0
    try:
        m.create()
        b = Bench(a, m)
        t = TTA(b)
        for mbit in sorted(set(tta_rates), reverse=True):
            m.shape(mbit)
            link[mbit] = b.link_check(mbit)
            print("multihost: links at %d Mbit/s (one stream measured %.0f); load %s" % (mbit, link[mbit], uptime()),
                  file=sys.stderr)
            for model in tta_models:
                for arm in tta_arms:
                    print("multihost: time to accuracy, %s, %s, %d Mbit/s" % (model, arm, mbit), file=sys.stderr)
                    try:
                        ttas.append(t.run(model, arm, mbit, tta_epochs[model]))
                    except (Deadline, RuntimeError) as e:
                        if b.t_end <= time.monotonic():
                            raise
                        print("multihost:   failed: %s" % e, file=sys.stderr)
                        continue
                    r = ttas[-1]
                    print("multihost:   %s s to %.1f%%, %s after %.2f epochs (%.0f s wall)" % (
                        "%.1f" % r["tta_seconds"] if r["tta_seconds"] is not None else "not",
                        100 * r["target"], r["last_accuracy"], r["last_epochs"], r["wall_seconds"]),
                        file=sys.stderr)
        for mbit in sorted(set(rates) | set(train_rates), reverse=True):
            m.shape(mbit)
            link[mbit] = b.link_check(mbit)
            print("multihost: links at %d Mbit/s (one stream measured %.0f)" % (mbit, link[mbit]), file=sys.stderr)
            for size in sizes if mbit in rates else []:
                for pl in placements:
                    print("multihost: %s, %s floats, %d Mbit/s" % (pl, fmt_size(size), mbit), file=sys.stderr)
                    d0 = m.drops()
                    c = (b.gloo_cell(size, mbit) if pl == "gloo" else b.mpi_cell(size, mbit) if pl == "mpi"
                         else b.psd_cell(pl, size, mbit))
                    c["drops"] = m.drops() - d0
                    cells.append(c)
            for t in trainers if mbit in train_rates else []:
                print("multihost: W1 %s, %d Mbit/s" % (t, mbit), file=sys.stderr)
                trains.append(b.train_split(mbit) if t == "split" else b.train_ddp(mbit) if t == "ddp"
                              else b.train_avg(mbit, t))
    except KeyboardInterrupt:
        print("\nmultihost: interrupted; cleaning up", file=sys.stderr)
        status = 130
    except (Deadline, RuntimeError, subprocess.SubprocessError, OSError) as e:
        print("multihost: %s" % e, file=sys.stderr)
        status = 1
    finally:
        m.cleanup()
    if cells or trains or ttas:
        print(report(cells, trains, link, a.sysctl))
        if ttas:
            print(tta_report(ttas))
        with open(os.path.join(out, "multihost.json"), "w") as f:
            json.dump({"cells": cells, "train": trains, "link_mbit": link, "tta": ttas,
                       "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
