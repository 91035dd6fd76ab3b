#!/usr/bin/env python3
"""check_layers.py - psd's calls go one way: fails when a file of server/
includes the header of a layer above it or calls a function defined in a
layer above it, or when two files call each other (docs/DESIGN.md,
"Layers").

usage: check_layers.py SERVER_DIR LIBPSDCORE.a [NM]

The includes are read from the sources in SERVER_DIR, the calls from the
symbols of the core library's objects (`nm`: what each object defines and
what it leaves undefined). A call through a function pointer a layer above
registered (psd.io, the update engine's done callback, psd.shutdown) is
not a symbol reference, and is allowed: that is how things travel back up.
Every .c file of server/ but psctl.c (a client program of its own) must be
in LAYERS: a new file has to be given its place.
"""
import os
import re
import subprocess
import sys

# bottom to top; a file may use its own layer and those below it
LAYERS = [
    ("store", ["config.c", "stats.c", "settings.c", "history.c", "model.c", "optim.c", "shm.c", "plan.c",
               "table.c", "table_round.c", "sparse_optim.c"]),
    ("update", ["update.c"]),
    ("policy", ["policy.c", "join.c"]),
    ("report", ["status.c", "dashboard.c", "notify.c", "checkpoint.c", "safetensors.c"]),
    ("answer", ["reply.c", "pull.c", "barrier.c"]),
    ("session", ["hello.c", "auth.c"]),
    ("dispatch", ["handle.c", "admin.c", "handle_table.c"]),
    ("connection", ["net.c", "http.c"]),
    ("main", ["main.c"]),
]
# headers: the layer whose functions they declare. psd.h holds the types
# every layer shares and the store layer's functions: anyone may include it.
HEADERS = {
    "psd.h": "store",
    "config.h": "store",
    "optim.h": "store",
    "history.h": "store",
    "update.h": "update",
    "policy.h": "policy",
    "join.h": "policy",
    "status.h": "report",
    "checkpoint.h": "report",
    "safetensors.h": "report",
    "notify.h": "report",
    "http.h": "connection",
    "dashboard.h": "report",
    "reply.h": "answer",
    "session.h": "session",
    "handle.h": "dispatch",
    "admin.h": "dispatch",
    "net.h": "connection",
}
NOT_IN_PSD = {"psctl.c"}

RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
LAYER_OF = {f: name for name, files in LAYERS for f in files}


def layer_of_file(f):
    if f in LAYER_OF:
        return LAYER_OF[f]
    if f.endswith(".h"):
        return HEADERS.get(f)
    return None


def upward(edges):
    """edges: (from_file, to_file, what). Returns the messages of those that
    go up a layer, and of files that have no layer."""
    bad = []
    for a, b, what in edges:
        la, lb = layer_of_file(a), layer_of_file(b)
        if la is None or lb is None:
            bad.append(f"{a if la is None else b}: not in the layer table of {sys.argv[0]}: give it a layer")
            continue
        if RANK[lb] > RANK[la]:
            bad.append(f"{a} ({la}) -> {b} ({lb}): {what}")
    return bad


def include_edges(server_dir):
    edges = []
    for f in sorted(os.listdir(server_dir)):
        if not f.endswith((".c", ".h")) or f in NOT_IN_PSD:
            continue
        with open(os.path.join(server_dir, f), encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r'\s*#\s*include\s+"([^"/]+)"', line)
                if m and os.path.exists(os.path.join(server_dir, m.group(1))):
                    edges.append((f, m.group(1), f'#include "{m.group(1)}"'))
    return edges


def mutual(edges):
    """Two files of one layer that call each other: one of them belongs a
    layer below the other."""
    pairs = {(a, b) for a, b, _ in edges}
    return [f"{a} <-> {b}: call each other; put one a layer below the other"
            for a, b in sorted(pairs) if a < b and (b, a) in pairs]


def symbol_edges(lib, nm):
    out = subprocess.run([nm, "-A", lib], capture_output=True, text=True, check=True).stdout
    defs, undef = {}, []
    for line in out.splitlines():
        # libpsdcore.a:net.c.o:0000000000000000 T srv_listen   /   ...:         U srv_handle
        head, _, rest = line.rpartition(":")
        obj = os.path.basename(head.split(":")[-1])
        src = re.sub(r"\.o(bj)?$", "", obj)
        parts = rest.split()
        if len(parts) == 3 and parts[1] in "TDBRC":
            defs[parts[2]] = src
        elif len(parts) == 2 and parts[0] == "U":
            undef.append((src, parts[1]))
    edges = {}
    for src, sym in undef:
        if sym in defs and defs[sym] != src:
            edges.setdefault((src, defs[sym]), []).append(sym)
    return [(a, b, "calls " + " ".join(sorted(set(s)))) for (a, b), s in sorted(edges.items())]


def self_test():
    """The check itself: an upward call and an unknown file are caught."""
    assert upward([("policy.c", "net.c", "calls srv_send")]), "policy -> net not caught"
    assert upward([("update.c", "policy.h", "#include")]), "update including policy.h not caught"
    assert upward([("new.c", "model.c", "calls x")]), "a file without a layer not caught"
    assert not upward([("net.c", "handle.c", "calls srv_handle"), ("handle.c", "auth.c", "calls")]), \
        "a downward or same-layer call was refused"
    assert mutual([("status.c", "http.c", "calls"), ("http.c", "status.c", "calls")]), "a call pair not caught"
    assert not mutual([("http.c", "status.c", "calls")]), "a one-way call was refused"


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    server_dir, lib = sys.argv[1], sys.argv[2]
    nm = sys.argv[3] if len(sys.argv) > 3 else "nm"
    self_test()
    missing = [f for f in sorted(os.listdir(server_dir))
               if f.endswith(".c") and f not in NOT_IN_PSD and f not in LAYER_OF]
    bad = [f"{f}: not in the layer table of {sys.argv[0]}: give it a layer" for f in missing]
    inc, sym = include_edges(server_dir), symbol_edges(lib, nm)
    bad += upward(inc) + upward(sym) + mutual(sym)
    for b in bad:
        print("layers: " + b, file=sys.stderr)
    if bad:
        print(f"layers: {len(bad)} call(s) or include(s) against the layer order (docs/DESIGN.md)",
              file=sys.stderr)
        return 1
    print(f"layers: {len(inc)} includes and {len(sym)} file-to-file calls, all one way down "
          f"({' < '.join(n for n, _ in LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
