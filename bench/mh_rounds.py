#!/usr/bin/python3
"""mh_rounds.py - one simulated worker's BSP rounds against psd, for bench/multihost.py.

    bench/mh_rounds.py --server A:P[,B:P,...] --shard K/M --size S --rounds R
                       [--warmup W] [--order parts|stagger] [--local I]

A worker written from proto/PROTOCOL.md with Python's msgpack (not psd's
own client library), doing what psworker does each BSP step with a model of
S float32 values split over the listed psd (one psd: the whole model):

- part i of n is [lo_i, lo_i+1) as section 6.2 defines it, and psd i holds a
  model of one tensor "w" of that part's size;
- hello as shard K of M to every psd; the worker psd asks sends the initial
  values (INIT chunks of at most 2^20 values); every worker pulls once;
- a round: a part of at most 2^20 values goes as one PUSHPULL (base v,
  min v + 1); every part's request is sent before any reply is read, the psd
  on other hosts first and the one on this host (--local) last, then the
  replies are read in part order, as psworker's step over several psd did
  up to libpsclient 1.3.0. A bigger part (one central psd at 4M values) goes as
  PUSH chunks of 2^20 values sent back to back, their OKs, then PULL chunks
  with two requests in flight, as psworker's chunked step does.

--order concurrent writes every part's requests at once on non-blocking
sockets and reads each reply as it arrives; with --piece N (psd's
bsp_piece) each part goes as a PUSH and a PULL per piece. --order rr does
what libpsclient 1.5's pieces option does: a sending thread writes piece 0
of parts K+1, K+2, ..., then piece 1 of each, ..., with blocking sends, and
the main thread reads every part's replies as they come.

--order stagger sends worker K's parts starting at part K+1 (wrapping), so
that no psd receives from every worker at once, and reads the replies in
that order: libpsclient's order since 1.3.1 (reading since 1.4;
psworker's). --order pieces:P takes the servers as
hosts of P psd each (host h's at h*P .. h*P+P-1, each a piece of the host's
part that closes its rounds on its own) and sends piece 0 of the other
hosts, from host K+1 on, then piece 1, ..., this host's pieces last: a
what-if for pieces inside one psd.

--order sched moves a round as a ring moves its bytes, one flow per link
direction at a time: the psd on this host first (no link), then a PUSH to
part K+1, K+2, ... in turn, each begun only when the one before has left
this host but for TCP_NOTSENT_LOWAT bytes; then a PULL (min v + 1) from
part K-1, K-2, ... in turn, each sent when the reply before it is in, this
host's last. Every psd closes its round at the end of the push steps (its
last push comes from the worker whose third step it is), and in step s of
either phase every host sends to one host and receives from one.

--order lockstep keeps every flow of a round at the same pace, in the
application, not leaving it to TCP: the gradient goes as PUSH chunks of
--slice values (the last with fin), one chunk to each other host's part in
turn (k+1, k+2, ...; each socket holds at most TCP_NOTSENT_LOWAT unsent
bytes, so a send returns when the chunk is nearly on the wire), this
host's part whole; then PULL chunks (min v + 1), two in flight per part,
read from the parts in turn, so each psd's replies to the workers and each
worker's replies from the psd advance chunk by chunk together.

--barrier DIR (a what-if, not something a worker can do across machines)
starts each round only when every worker has ended the one before, through
files in DIR that all the namespaces see: rounds with the workers' start
skew taken out.

Prints one JSON object on stdout: the round times (seconds) after the
warm-up rounds, and the timestamps (CLOCK_MONOTONIC, shared by every
namespace of the machine) at which each timed round started and each part's
reply arrived, for a per-round trace.
"""

import argparse
import json
import os
import select
import socket
import struct
import sys
import threading
import time

import msgpack
import numpy as np

HELLO, WELCOME, INIT, PUSH, PULL, PUSHPULL, PARAMS, OK, ERROR, BYE, BARRIER = 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 20
CHUNK = 1 << 20  # values per frame, as psworker (PS_CHUNK_FLOATS)
PULL_WINDOW = 2  # chunk pulls in flight (PS_PULL_WINDOW)


def part_bounds(p, n):
    """[lo_0, ..., lo_n] of PROTOCOL.md section 6.2."""
    lo = [0] + [(p * i // n) // 1024 * 1024 for i in range(1, n)] + [p]
    if p < 1024 * n:
        sys.exit("mh_rounds: %d values cannot be split over %d psd" % (p, n))
    return lo


TCP_NOTSENT_LOWAT = 25  # linux/tcp.h
LOWAT = 16 << 10  # --order sched and lockstep: a send returns with at most this much not yet sent


class Link:
    """One connection to the psd of one part."""

    def __init__(self, addr, shard, nshards, n, lowat=0, sndbuf=0):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=600)
        if sndbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if lowat:
            self.sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, lowat)
        self.n = n
        self.buf = bytearray(4 * n + 4096)
        self.next_id = 1
        self.send({"t": HELLO, "v": 1, "role": "worker", "shard": [shard, nshards], "layout": [["w", [n]]]})
        w = self.recv()
        if w["t"] != WELCOME:
            sys.exit("mh_rounds: %s answered hello with type %d" % (addr, w["t"]))
        self.init = w.get("init", False)
        self.version = w["ver"]

    def send(self, msg, data=None):
        """Sends msg, with data (bytes-like) as its "data" bin, without copying data."""
        msg["id"] = self.next_id
        self.next_id += 1
        if data is None:
            body = msgpack.packb(msg, use_bin_type=True)
            self.sock.sendall(struct.pack(">I", len(body)) + body)
            return
        head = msgpack.packb(msg, use_bin_type=True)
        # one more map entry: "data" as a bin32 after the fields packed above
        nkeys = len(msg) + 1
        assert head[0] & 0xF0 == 0x80 and nkeys < 16, "a fixmap of fields"
        data = memoryview(data).cast("B")
        head = bytes([0x80 | nkeys]) + head[1:] + msgpack.packb("data") + b"\xc6" + struct.pack(">I", len(data))
        self.sock.sendall(struct.pack(">I", len(head) + len(data)) + head)
        self.sock.sendall(data)

    def recv_exact(self, n):
        if n > len(self.buf):
            self.buf = bytearray(n)
        view = memoryview(self.buf)[:n]
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("psd closed the connection")
            got += k
        return view

    def recv(self):
        (n,) = struct.unpack(">I", bytes(self.recv_exact(4)))
        msg = msgpack.unpackb(self.recv_exact(n), raw=False)
        if msg["t"] == ERROR:
            sys.exit("mh_rounds: psd refused request %s: [%d] %s" % (msg.get("id"), msg["code"], msg["text"]))
        return msg


def params_into(link, msg, dst):
    """Copies a PARAMS reply's values into dst[msg.off - ...]."""
    vals = np.frombuffer(msg["data"], dtype="<f4")
    dst[msg["off"]:msg["off"] + len(vals)] = vals
    return msg["ver"]


def init_or_wait(links, params, bounds):
    for i, ln in enumerate(links):
        if ln.init:
            part = params[bounds[i]:bounds[i + 1]]
            for off in range(0, ln.n, CHUNK):
                end = min(ln.n, off + CHUNK)
                ln.send({"t": INIT, "off": off, "fin": end == ln.n}, part[off:end])
                if ln.recv()["t"] != OK:
                    sys.exit("mh_rounds: INIT not acknowledged")
    for i, ln in enumerate(links):
        part = params[bounds[i]:bounds[i + 1]]
        for off in range(0, ln.n, CHUNK):
            ln.send({"t": PULL, "off": off, "len": min(CHUNK, ln.n - off)})
            ln.version = params_into(ln, ln.recv(), part)


def chunked_send(ln, grad):
    for off in range(0, ln.n, CHUNK):
        end = min(ln.n, off + CHUNK)
        ln.send({"t": PUSH, "base": ln.version, "off": off, "fin": end == ln.n}, grad[off:end])


def chunked_finish(ln, part):
    for _ in range(0, ln.n, CHUNK):
        if ln.recv()["t"] != OK:
            sys.exit("mh_rounds: PUSH not acknowledged")
    offs = list(range(0, ln.n, CHUNK))
    sent = 0
    for k in range(len(offs)):
        while sent < len(offs) and sent < k + PULL_WINDOW:
            ln.send({"t": PULL, "off": offs[sent], "len": min(CHUNK, ln.n - offs[sent]), "min": ln.version + 1})
            sent += 1
        v = params_into(ln, ln.recv(), part)
    ln.version = v


def frame_bytes(msg, data):
    """The frame Link.send would write for msg and data, as (head, data)."""
    head = msgpack.packb(msg, use_bin_type=True)
    nkeys = len(msg) + 1
    data = memoryview(data).cast("B")
    head = bytes([0x80 | nkeys]) + head[1:] + msgpack.packb("data") + b"\xc6" + struct.pack(">I", len(data))
    return struct.pack(">I", len(head) + len(data)) + head, data


def concurrent_round(links, order, grad, params, bounds, piece=0, rr=False):
    """--order concurrent: every part's requests written at once, each socket
    taking what it can when it can (non-blocking, poll), and each reply read
    as its bytes arrive, whichever part they come from: no part's flow waits
    for another's. With piece > 0 (psd's bsp_piece), a part's gradient goes
    as PUSH chunks of piece values and its values come back as PULLs of the
    same ranges (min v + 1), which psd answers as each piece closes.
    rr (--order rr, libpsclient's way): a sending thread writes piece 0 of
    every part in the order, then piece 1 of every part, ..., each with
    blocking sends (the send buffer paces them), so every psd receives a
    worker's pieces at the same pace, while this thread reads the replies.
    Returns each part's reply time."""
    n = len(links)
    out, inb, want, got, newv = {}, {}, {}, [0.0] * n, {}
    units = {}  # rr: each part's sends, a piece's PUSH and PULL (or a PUSHPULL) apiece
    for i in order:
        ln = links[i]
        g = grad[bounds[i]:bounds[i + 1]]
        frames = []
        if not piece or piece >= ln.n:
            frames.append(({"t": PUSHPULL, "base": ln.version, "off": 0, "poff": 0, "plen": ln.n,
                            "min": ln.version + 1}, g))
        else:
            # each piece's PULL right behind its PUSH: psd parks it until
            # the piece closes, while the next pieces arrive
            for off in range(0, ln.n, piece):
                end = min(ln.n, off + piece)
                frames.append(({"t": PUSH, "base": ln.version, "off": off, "fin": end == ln.n}, g[off:end]))
                frames.append(({"t": PULL, "off": off, "len": end - off, "min": ln.version + 1}, None))
        out[i], units[i] = [], []
        for msg, data in frames:
            msg["id"] = ln.next_id
            ln.next_id += 1
            if data is None:
                body = msgpack.packb(msg, use_bin_type=True)
                out[i].append(memoryview(struct.pack(">I", len(body)) + body))
                units[i][-1].append(out[i][-1])
            else:
                head, data = frame_bytes(msg, data)
                out[i] += [memoryview(head), data]
                units[i].append([out[i][-2], out[i][-1]])
        want[i] = len(frames)
        inb[i] = [bytearray(4), 0, None]  # buffer, bytes in, frame length
        if not rr:
            ln.sock.setblocking(False)
    sender = None
    if rr:
        seq = [(i, units[i][q]) for q in range(max(len(units[i]) for i in order))
               for i in order if q < len(units[i])]
        failed = []

        def send_all():
            try:
                for i, bufs in seq:
                    for b in bufs:
                        links[i].sock.sendall(b)
            except OSError as e:
                failed.append(e)

        for i in order:
            out[i] = []
        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
    poll = select.poll()
    fd = {links[i].sock.fileno(): i for i in order}
    for i in order:
        poll.register(links[i].sock, select.POLLIN | (0 if rr else select.POLLOUT))
    left = set(order)
    while left:
        for f, ev in poll.poll(600000):
            i = fd[f]
            ln = links[i]
            if ev & select.POLLOUT and out[i]:
                while out[i]:
                    try:
                        k = ln.sock.send(out[i][0])
                    except BlockingIOError:
                        break
                    out[i][0] = out[i][0][k:]
                    if not len(out[i][0]):
                        out[i].pop(0)
                if not out[i]:
                    poll.modify(ln.sock, select.POLLIN)
            if ev & (select.POLLIN | select.POLLERR | select.POLLHUP):
                b = inb[i]
                while i in left:
                    need = (4 if b[2] is None else b[2]) - b[1]
                    try:
                        k = ln.sock.recv_into(memoryview(b[0])[b[1]:], need)
                    except BlockingIOError:
                        break
                    if k == 0:
                        raise ConnectionError("psd closed the connection")
                    b[1] += k
                    if b[2] is None and b[1] == 4:
                        (b[2],) = struct.unpack(">I", bytes(b[0]))
                        b[0], b[1] = bytearray(b[2]), 0
                    elif b[2] is not None and b[1] == b[2]:
                        msg = msgpack.unpackb(b[0], raw=False)
                        b[0], b[1], b[2] = bytearray(4), 0, None
                        if msg["t"] == ERROR:
                            sys.exit("mh_rounds: psd refused: [%d] %s" % (msg["code"], msg["text"]))
                        if msg["t"] == PARAMS:
                            newv[i] = params_into(ln, msg, params[bounds[i]:bounds[i + 1]])
                        want[i] -= 1
                        if not want[i]:
                            ln.version = newv[i]
                            got[i] = time.monotonic()
                            left.discard(i)
                            poll.unregister(ln.sock)
                    if rr:
                        break  # a blocking socket: one read per POLLIN, which comes again while bytes wait
    if sender:
        sender.join()
        if failed:
            raise failed[0]
    for i in order:
        links[i].sock.setblocking(True)
        links[i].sock.settimeout(600)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--shard", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--order", default="parts", help="parts, stagger, pieces:P or sched")
    ap.add_argument("--local", type=int, default=-1, help="the part whose psd is on this host")
    ap.add_argument("--psd-barrier", action="store_true",
                    help="end each round with a BARRIER on part 0's psd (PROTOCOL.md), as libpsclient does since "
                         "1.4: the next round starts when every worker has its replies (counted in the round's time)")
    ap.add_argument("--barrier", help="what-if: a directory the workers share; a round starts when every worker has "
                    "ended the one before (files in it: an ideal barrier outside the links)")
    ap.add_argument("--send-buffer", type=int, default=0, help="SO_SNDBUF of each connection (0: the kernel's)")
    ap.add_argument("--lowat", type=int, default=0, help="TCP_NOTSENT_LOWAT of each connection (0: the order's "
                    "default): a send returns when at most this much is unsent, so the pushes leave one by one")
    ap.add_argument("--piece", type=int, default=0, help="--order concurrent: psd's bsp_piece; push and pull each "
                    "part in pieces of this many values")
    ap.add_argument("--window", type=int, default=PULL_WINDOW, help="--order lockstep: chunk pulls in flight per part")
    ap.add_argument("--slice", type=int, default=16384, help="--order lockstep: values per chunk")
    a = ap.parse_args()
    k, m = (int(x) for x in a.shard.split("/"))
    addrs = a.server.split(",")
    bounds = part_bounds(a.size, len(addrs))
    sched = a.order == "sched"
    lockstep = a.order == "lockstep"
    lowat = a.lowat or (LOWAT if sched or lockstep else 0)
    links = [Link(addr, k, m, bounds[i + 1] - bounds[i], lowat, a.send_buffer) for i, addr in enumerate(addrs)]
    rng = np.random.default_rng(k + 1)
    params = rng.standard_normal(a.size, dtype=np.float32) * np.float32(0.01)
    grad = rng.standard_normal(a.size, dtype=np.float32) * np.float32(0.001)
    init_or_wait(links, params, bounds)
    n = len(links)
    order = list(range(n))
    if a.order == "stagger":
        order = [(k + 1 + j) % n for j in range(n)]
    if a.order.startswith("pieces:"):
        # P psd per host, host h's pieces at h*P .. h*P+P-1: piece q of the
        # hosts k+1, k+2, ... before piece q+1 of any, this host's last
        p = int(a.order.split(":")[1])
        h = n // p
        if p < 1 or h * p != n:
            sys.exit("mh_rounds: %d servers are not hosts of %d pieces" % (n, p))
        order = [((k + j) % h) * p + q for q in range(p) for j in range(1, h)] + [k * p + q for q in range(p)]
    elif a.order in ("concurrent", "rr"):
        order = [(k + 1 + j) % n for j in range(n)]
    elif a.order not in ("parts", "stagger", "sched", "lockstep", "rr"):
        sys.exit("mh_rounds: bad --order '%s'" % a.order)
    if 0 <= a.local < n:  # the psd on this host last: the remote bytes go out first
        order.remove(a.local)
        order.append(a.local)
    if sched:
        if a.local < 0 or n != m or bounds[-1] // n > CHUNK:
            sys.exit("mh_rounds: --order sched takes one part of at most 2^20 values per worker host")
        push_order = [a.local] + [(a.local + j) % n for j in range(1, n)]
        pull_order = [(a.local - j) % n for j in range(1, n)] + [a.local]
    if lockstep:
        if a.local < 0 or n != m:
            sys.exit("mh_rounds: --order lockstep takes one part per worker host")
        remote = [(a.local + j) % n for j in range(1, n)]
        sl = a.slice
    times, starts, replies = [], [], []
    for r in range(a.warmup + a.rounds):
        if a.barrier:
            open(os.path.join(a.barrier, "r%d-w%d" % (r, k)), "w").close()
            while sum(os.path.exists(os.path.join(a.barrier, "r%d-w%d" % (r, j))) for j in range(m)) < m:
                time.sleep(0.0002)
        t0 = time.monotonic()
        got = [0.0] * n
        if sched:
            for i in push_order:
                ln = links[i]
                ln.send({"t": PUSH, "base": ln.version, "off": 0, "fin": True}, grad[bounds[i]:bounds[i + 1]])
            for i in pull_order:
                ln = links[i]
                if ln.recv()["t"] != OK:
                    sys.exit("mh_rounds: PUSH not acknowledged")
                ln.send({"t": PULL, "off": 0, "len": ln.n, "min": ln.version + 1})
                ln.version = params_into(ln, ln.recv(), params[bounds[i]:bounds[i + 1]])
                got[i] = time.monotonic()
        if lockstep:
            loc = links[a.local]
            loc.send({"t": PUSH, "base": loc.version, "off": 0, "fin": True},
                     grad[bounds[a.local]:bounds[a.local + 1]])
            nok = [0] * n
            nok[a.local] = 1
            top = max(links[i].n for i in remote)
            for off in range(0, top, sl):
                for i in remote:
                    ln = links[i]
                    if off < ln.n:
                        end = min(ln.n, off + sl)
                        ln.send({"t": PUSH, "base": ln.version, "off": off, "fin": end == ln.n},
                                grad[bounds[i] + off:bounds[i] + end])
                        nok[i] += 1
            for i in range(n):
                for _ in range(nok[i]):
                    if links[i].recv()["t"] != OK:
                        sys.exit("mh_rounds: PUSH not acknowledged")
            nxt = [0] * n   # next offset to ask for, per part
            left = [0] * n  # chunks asked for, not yet read
            for i in remote + [a.local]:
                ln = links[i]
                while left[i] < a.window and nxt[i] < ln.n:
                    ln.send({"t": PULL, "off": nxt[i], "len": min(sl, ln.n - nxt[i]), "min": ln.version + 1})
                    nxt[i] += sl
                    left[i] += 1
            newv = [links[i].version for i in range(n)]
            while any(left):
                for i in remote + [a.local]:
                    if not left[i]:
                        continue
                    ln = links[i]
                    newv[i] = params_into(ln, ln.recv(), params[bounds[i]:bounds[i + 1]])
                    left[i] -= 1
                    if nxt[i] < ln.n:
                        ln.send({"t": PULL, "off": nxt[i], "len": min(sl, ln.n - nxt[i]), "min": ln.version + 1})
                        nxt[i] += sl
                        left[i] += 1
                    elif not left[i]:
                        got[i] = time.monotonic()
            for i in range(n):
                links[i].version = newv[i]
        if a.order in ("concurrent", "rr"):
            got = concurrent_round(links, order, grad, params, bounds, a.piece, a.order == "rr")
        for i in [] if sched or lockstep or a.order in ("concurrent", "rr") else order:
            ln = links[i]
            g = grad[bounds[i]:bounds[i + 1]]
            if ln.n <= CHUNK:
                ln.send({"t": PUSHPULL, "base": ln.version, "off": 0, "poff": 0, "plen": ln.n,
                         "min": ln.version + 1}, g)
            else:
                chunked_send(ln, g)
        for i in [] if sched or lockstep or a.order in ("concurrent", "rr") else (order if a.order == "stagger" or a.order.startswith("pieces:") else range(n)):
            ln = links[i]
            part = params[bounds[i]:bounds[i + 1]]
            if ln.n <= CHUNK:
                ln.version = params_into(ln, ln.recv(), part)
            else:
                chunked_finish(ln, part)
            got[i] = time.monotonic()
        end = got[-1] if n == 1 else max(got)
        if a.psd_barrier:
            links[0].send({"t": BARRIER, "ver": links[0].version})
            if links[0].recv()["t"] != OK:
                sys.exit("mh_rounds: BARRIER not answered with OK")
            end = time.monotonic()
        if r >= a.warmup:
            times.append(end - t0)
            starts.append(t0)
            replies.append(got)
    for ln in links:
        ln.send({"t": BYE})
        ln.sock.close()
    print(json.dumps({"shard": k, "times": times, "starts": starts, "replies": replies,
                      "versions": [ln.version for ln in links]}))


if __name__ == "__main__":
    main()
