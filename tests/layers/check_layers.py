#!/usr/bin/env python3
"""check_layers.py - psd's calls go one way: fails when a file of server/
includes the header of a layer above it or calls a function defined in a
layer above it (or in a sibling layer), or when two files call each other
(docs/DESIGN.md, "Layers").

usage: check_layers.py SERVER_DIR LIBPSDCORE.a [NM]
       check_layers.py --markdown SERVER_DIR LIBPSDCORE.a [NM]

A file's layer is the folder it lives in (or the layer of its room:
server/model/model.c is in the room model of the
store layer), server/main.c (directly in server/) in the layer main. ORDER
below gives the layers bottom to top; layers in one row are siblings, which
may not use each other. There is no other list of files: a new file takes
the layer of the folder it is put in, and a folder that is not in ORDER is
refused.

The includes are read from the sources (`#include "server/LAYER/x.h"`), the
calls from the symbols of the core library's objects (`nm`: what each object
defines and what it leaves undefined; object files are named by the source's
base name, so two sources of server/ may not share one). A call through a
function pointer a layer above registered (psd.io, the update engine's done
callback, psd.shutdown) is not a symbol reference, and is allowed: that is
how things travel back up.

With --markdown it prints, instead of the one-line summary, the layer table
and the figures that docs/DESIGN.md quotes (tests/layers/test_check_layers.py
compares them).

It also fails when a file writes state of psd.h another file or layer owns
(OWNED below: psd.stats, written by record/stats.c alone through SRV_COUNT
and the srv_stats_* functions; psd.tables by tables/table.c; psd.model by
model/model.c; the workers by session/hello.c; the connections by the
connection layer; ...). The check reads the text: a write through a
pointer taken elsewhere (srv_model *m = &s->model) is not seen.

And it fails on a read of the consistency mode (ps_config.mode, PS_MODE_*)
outside policy/ (MODE_READ below): the other layers ask the policy's ops
table what the mode needs.

The bottom layer, store, is rooms by what they hold (ROOMS below): config/
(the settings), record/ (the counters, histograms and the dashboard's
series), model/ (the dense model and its optimizer), tables/ (the embedding
tables, their bounds and optimizers) and store/ (psd.h, which every layer
includes, the plan, the shared segments, the codec's scratch). A room calls
the functions of, and includes the headers of, only the rooms ROOMS lets it
use (and store/psd.h and config/config.h, the types every file reads); a
folder of server/ that is neither a layer nor a room is refused.
"""
import os
import re
import subprocess
import sys

# bottom to top; a file may use its own layer and the rows below its own.
# Layers in one row are siblings: neither may use the other.
ORDER = [
    ["store"],
    ["update"],
    ["policy"],
    ["report", "answer"],
    ["session"],
    ["dispatch"],
    ["connection"],
    ["coord"],
    ["main"],
]
MAIN = "main"  # the layer of the files directly in server/

# The rooms of the bottom layer (store), each a folder of server/, and the
# other rooms each may use (call, include). Rooms not named may not be used.
ROOMS = {
    "model": (),                 # the dense model's blocks, snapshots, optimizer, hogwild segment
    "tables": (),                # the embedding tables, their bounds and sparse optimizers
    "record": (),                # stats and histograms, the dashboard's history
    "config": ("model",),        # the settings; their hooks configure the optimizer
    "store": ("config", "model", "tables", "record"),  # psd.h, the plan, shm, scratch
    "replog": ("model", "tables", "record", "store"),  # the replication log: records of the changes (the plan's
                                                        # too), applied on followers
}
FLOOR = "store"  # the layer the rooms make up
# Headers every file may include whatever its room: psd.h holds the types all
# layers share, config.h the settings every room reads.
SHARED = ("store/psd.h", "config/config.h")

RANK = {name: i for i, row in enumerate(ORDER) for name in row}


def psd_writes(*fields):
    """A pattern of a write of psd's fields (through psd's pointer, s->,
    srv-> or c->srv->, then members and indices): an assignment, a compound
    one, ++ or --."""
    alt = "|".join(fields)
    ptr = r"(?:\bs|\bsrv|->srv)->"
    return (ptr + "(?:" + alt + r")\b(?:\.[a-z_]+|\[[^]]*\])*\s*(?:\+\+|--|[-+*/|&^]?=(?!=))"
            r"|(?:\+\+|--)\s*" + ptr + "(?:" + alt + r")\b")


# State written by its owner alone: (what, the owner, a pattern of a write).
# The owner is a file, a layer's folder ("connection/": any file of that
# layer), or a tuple of them. Others read it, and change it through the owner's functions. What
# psd.h holds and is not listed here is not owned yet (docs/DESIGN.md).
OWNED = [
    ("psd.stats", "record/stats.c",
     r"stats\.[a-z_]+(\[[^]]*\])?\s*(\+\+|--|[-+*/|&^]?=(?!=))|(\+\+|--)\s*[a-z_]+(->|\.)stats\."
     r"|srv_hist_(init|observe)\s*\(\s*&[a-z_]+(->[a-z_]+)*->stats\."),
    ("psd.tables", "tables/table.c",
     r"tables\.[a-z_]+(\[[^]]*\])?\s*(\+\+|--|[-+*/|&^]?=(?!=))|(\+\+|--)\s*[a-z_]+(->|\.)tables\."),
    ("psd.model", "model/model.c", psd_writes("model")),
    ("psd.plan", "store/plan.c", psd_writes("plan")),
    ("the codec scratch (psd.codec, planes)", "store/scratch.c", psd_writes("codec", "planes", "planes_cap")),
    ("psd.upd", "update/update.c", psd_writes("upd")),
    ("psd.policy_state", "policy/", psd_writes("policy_state")),
    ("the workers (psd.workers, nshards, init_owner, join_*)", "session/hello.c",
     psd_writes("workers", "nworkers_cap", "nshards", "init_owner", "said_memory_only", "join_since_ms",
                "join_warned_ms")),
    ("where the model came from (psd.resumed_*, restored_clocks, model_file)", "report/",
     psd_writes("resumed_from", "resumed_version", "restored_clocks", "nrestored", "model_file")),
    ("psd.checkpoint_busy", "report/checkpoint.c", psd_writes("checkpoint_busy", "checkpoint_req")),
    ("psd.dash", "report/dashboard.c", psd_writes("dash")),
    ("psd.replog", "replog/replog.c", psd_writes("replog")),
    ("psd.follow, repl_release, promote", "connection/", psd_writes("follow", "follow_retired", "repl_release", "promote")),
    ("psd.coord, coord_state (leadership through etcd)", "coord/", psd_writes("coord", "coord_state")),
    ("psd.parts, move_start, move_stop (the part map, a move of parts)", ("dispatch/move_cmd.c", "dispatch/move_state.c", "connection/"),
     psd_writes("parts", "move_start", "move_stop", "move_apply")),
    ("psd.push_wait", "dispatch/handle_dense.c", psd_writes("push_wait")),
    ("psd.pushids", "replog/pushid.c", psd_writes("pushids")),
    ("psd.paused, ckpt_waits", "dispatch/admin.c", psd_writes("paused", "ckpt_waits")),
    ("the connections and listeners (psd.conns, rbuf_bytes, http, ...)", "connection/",
     psd_writes("conns", "nconns", "rbuf_bytes", "next_cid", "listener", "listening", "port", "stopping", "io",
                "http", "http_addr", "out")),
    ("psd.cfg (the settings)", ("main.c", "dispatch/admin.c"),
     psd_writes("cfg") + r"|(?:\bs|\bsrv|->srv)->cfg\s*\)?\s*\+|&(?:s|srv)->cfg\b\s*\)?\s*\+"),
    ("main's handles and start state (psd.loop, signals, tick, policy, clock, ...)", "main.c",
     psd_writes("loop", "sigint", "sigterm", "sighup", "tick", "cli_sets", "ncli_sets", "shutdown", "clock",
                "policy", "start_ms", "last_rate_ms", "config_path", "token", "admin_token")),
]


# The consistency mode is read in policy/ alone: the setting is ps_config's
# field `mode` (read as s->cfg.mode, cfg->mode, c->mode, ...) with the values
# PS_MODE_ASGD, PS_MODE_BSP, PS_MODE_SSP. The other layers read what the mode
# needs from the policy's ops table (s->policy->rounds, ->barriers, ->plan,
# ->tpush, ->check). MODE_HOME: where the setting itself is declared and parsed.
MODE_READ = re.compile(r"\bPS_MODE_[A-Z]+\b|\benum\s+ps_mode\b"
                       r"|\b(?:cfg|c|conf|config|next|cur|old)\s*(?:\.|->)\s*mode\b")
MODE_HOME = ("policy/", "config/config.h", "config/config.c")


def mode_reads(server_dir, files):
    """Reads of the mode outside policy/ (MODE_READ, MODE_HOME)."""
    bad = []
    for f in files:
        if owns(MODE_HOME, f):
            continue
        with open(os.path.join(server_dir, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                code = line.split("//")[0]
                if MODE_READ.search(code):
                    bad.append(f"{f}:{n}: reads the mode, which policy/ alone reads: ask the policy's ops "
                               f"(s->policy->rounds, barriers, plan, tpush, check) ({line.strip()})")
    return bad


def owns(owner, f):
    """owner (a file, a layer's folder ending in /, or a tuple of them)
    covers file f."""
    if isinstance(owner, tuple):
        return any(owns(o, f) for o in owner)
    return f.startswith(owner) if owner.endswith("/") else f == owner


def layer_of(path):
    """path relative to server/ ("model/model.c", "main.c") -> its layer,
    or None for a folder that is not a layer."""
    parts = path.split("/")
    if len(parts) == 1:
        return MAIN
    if parts[0] in ROOMS:
        return FLOOR
    return parts[0] if parts[0] in RANK and parts[0] != MAIN else None


def room_of(path):
    """The room of the bottom layer path is in ("tables/table.c" -> "tables"),
    or None outside it."""
    parts = path.split("/")
    return parts[0] if len(parts) > 1 and parts[0] in ROOMS else None


def room_uses(edges):
    """Uses between rooms of the bottom layer that ROOMS does not allow."""
    bad = []
    for a, b, what in edges:
        ra, rb = room_of(a), room_of(b)
        if ra is None or rb is None or ra == rb or b in SHARED or rb in ROOMS[ra]:
            continue
        may = ", ".join(ROOMS[ra]) or "no other room"
        bad.append(f"{a} (room {ra}) -> {b} (room {rb}): the room {ra} may use {may}: {what}")
    return bad


def may_use(la, lb):
    return la == lb or RANK[lb] < RANK[la]


def upward(edges):
    """edges: (from_path, to_path, what), paths relative to server/.
    Returns the messages of those that go up a layer or sideways to a
    sibling, and of files in a folder that is not a layer."""
    bad = []
    for a, b, what in edges:
        la, lb = layer_of(a), layer_of(b)
        if la is None or lb is None:
            f = a if la is None else b
            bad.append(f"{f}: its folder is not a layer (one of {', '.join(RANK)}); put it in one")
            continue
        if not may_use(la, lb):
            how = "a sibling layer" if RANK[la] == RANK[lb] else "a layer above"
            bad.append(f"{a} ({la}) -> {b} ({lb}): {how}: {what}")
    return bad


def sources(server_dir):
    """Every .c and .h file under server_dir, relative to it."""
    out = []
    for top, dirs, names in os.walk(server_dir):
        dirs.sort()
        for n in sorted(names):
            if n.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(top, n), server_dir).replace(os.sep, "/"))
    return out


def include_edges(server_dir, files):
    edges = []
    for f in files:
        with open(os.path.join(server_dir, f), encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                if inc.startswith("server/"):
                    target = inc[len("server/"):]
                else:  # relative to the including file
                    target = os.path.normpath(os.path.join(os.path.dirname(f), inc)).replace(os.sep, "/")
                if os.path.exists(os.path.join(server_dir, target)):
                    edges.append((f, target, f'#include "{inc}"'))
    return edges


def foreign_writes(server_dir, files):
    """Writes of owned state (OWNED) outside its owner's file."""
    bad = []
    for what, owner, pattern in OWNED:
        rx = re.compile(pattern)
        for f in files:
            if owns(owner, f) or not f.endswith(".c"):
                continue
            with open(os.path.join(server_dir, f), encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    code = line.split("//")[0]
                    if rx.search(code):
                        name = " and ".join(owner) if isinstance(owner, tuple) else owner
                        bad.append(f"{f}:{n}: writes {what}, which {name} owns: call its functions "
                                   f"({line.strip()})")
    return bad


def mutual(edges):
    """Two files of one layer that call each other: one of them belongs a
    layer below the other."""
    pairs = {(a, b) for a, b, _ in edges}
    return [f"{a} <-> {b}: call each other; put one a layer below the other"
            for a, b in sorted(pairs) if a < b and (b, a) in pairs]


def symbol_edges(lib, nm, by_base):
    out = subprocess.run([nm, "-A", lib], capture_output=True, text=True, check=True).stdout
    defs, undef = {}, []
    for line in out.splitlines():
        # libpsdcore.a:net.c.o:0000000000000000 T srv_listen   /   ...:         U srv_handle
        head, _, rest = line.rpartition(":")
        obj = os.path.basename(head.split(":")[-1])
        src = by_base.get(re.sub(r"\.o(bj)?$", "", obj))
        if src is None:
            continue
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
    """The rules themselves: upward, sideways and unknown are caught."""
    assert upward([("policy/policy.c", "connection/net.c", "calls srv_send")]), "policy -> connection not caught"
    assert upward([("update/update.c", "policy/policy.h", "#include")]), "update including policy.h not caught"
    assert upward([("report/status.c", "answer/reply.h", "#include")]), "report -> answer (siblings) not caught"
    assert upward([("misc/new.c", "model/model.c", "calls x")]), "a file outside the layers not caught"
    assert not upward([("connection/net.c", "dispatch/handle.c", "calls"), ("dispatch/handle.c", "session/auth.c", "calls"),
                       ("main.c", "connection/net.h", "#include"), ("answer/pull.c", "answer/reply.h", "#include")]), \
        "a downward or same-layer use was refused"
    assert room_uses([("tables/table.c", "model/optim.h", "#include")]), "tables -> model not caught"
    assert not room_uses([("config/settings.c", "model/optim.c", "calls"), ("model/model.c", "store/psd.h", "#include"),
                          ("tables/table.c", "config/config.h", "#include")]), "an allowed room use was refused"
    assert mutual([("report/status.c", "connection/http.c", "calls"), ("connection/http.c", "report/status.c", "calls")])
    assert not mutual([("connection/http.c", "report/status.c", "calls")]), "a one-way call was refused"


def analyse(server_dir, lib, nm):
    """-> (bad messages, files, include edges, call edges)"""
    files = sources(server_dir)
    bad = [f"{f}: its folder is not a layer (one of {', '.join(RANK)}); put it in one"
           for f in files if layer_of(f) is None]
    by_base = {}
    for f in files:
        if f.endswith(".c"):
            base = os.path.basename(f)
            if base in by_base:
                bad.append(f"{f} and {by_base[base]}: two sources of one name; the library's objects "
                           "cannot tell them apart: rename one")
            by_base[base] = f
    inc, sym = include_edges(server_dir, files), symbol_edges(lib, nm, by_base)
    bad += upward(inc) + upward(sym) + mutual(sym) + room_uses(inc) + room_uses(sym)
    bad += foreign_writes(server_dir, files) + mode_reads(server_dir, files)
    return bad, files, inc, sym


def markdown(files, inc, sym):
    """The layer table and figures docs/DESIGN.md quotes, from the tree."""
    lines = ["| layer | folder | files |", "|---|---|---|"]
    for row in reversed(ORDER):
        for name in row:
            sib = f" (sibling of {', '.join(n for n in row if n != name)})" if len(row) > 1 else ""
            if name == FLOOR:
                for room in sorted(ROOMS, key=lambda r: (-len(ROOMS[r]), r)):
                    own = [os.path.basename(f) for f in files if room_of(f) == room and f.endswith(".c")]
                    uses = ", ".join(ROOMS[room]) or "no other room"
                    lines.append(f"| {name}: room {room} (uses {uses}) | `server/{room}/` | "
                                 f"{', '.join(f'`{f}`' for f in own)} |")
                continue
            folder = "server/" if name == MAIN else f"server/{name}/"
            own = [os.path.basename(f) for f in files if layer_of(f) == name and f.endswith(".c")]
            lines.append(f"| {name}{sib} | `{folder}` | {', '.join(f'`{f}`' for f in own)} |")
    lines.append("")
    lines.append(f"{len(inc)} includes and {len(sym)} file-to-file calls, all one way down.")
    return "\n".join(lines)


def main(argv):
    md = False
    if argv and argv[0] == "--markdown":
        md, argv = True, argv[1:]
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    server_dir, lib = argv[0], argv[1]
    nm = argv[2] if len(argv) > 2 else "nm"
    self_test()
    bad, files, inc, sym = analyse(server_dir, lib, nm)
    for b in bad:
        print("layers: " + b, file=sys.stderr)
    if bad:
        print(f"layers: {len(bad)} call(s) or include(s) against the layer order (docs/DESIGN.md)",
              file=sys.stderr)
        return 1
    if md:
        print(markdown(files, inc, sym))
    else:
        print(f"layers: {len(inc)} includes and {len(sym)} file-to-file calls, all one way down "
              f"({' < '.join('{' + ', '.join(r) + '}' if len(r) > 1 else r[0] for r in ORDER)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
