#!/usr/bin/python3
"""make_corpus.py - writes the seed corpora in fuzz/corpus/, one directory per target.

The seeds are built with Python's msgpack package, an encoder other than the
one under test: every message type, frames laid out the way psd's encoder lays
them out ("pad" then "data" as a bin32, floats 4-aligned) and the way other
encoders do, whole client sessions, checkpoint files, configuration files, tensors
in each wire form (zstd frames from the zstd program), and a few malformed
inputs of each kind. Run it again after a protocol change:

    fuzz/make_corpus.py            # rewrites fuzz/corpus/*/seed-*

Files named seed-* are this script's; other files in corpus/ (reproducers of
past findings) are left alone. Needs python3-msgpack (Debian).
"""
import os
import struct
import zlib

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

(HELLO, WELCOME, INIT, PUSH, PULL, PUSHPULL, PARAMS, OK, HEARTBEAT, STATUS, STATUS_REPLY, METRICS,
 METRICS_REPLY, REPORT, ERROR, BYE, ADMIN, CHALLENGE, AUTH, BARRIER, TABLE, TPULL, TPUSH, TPUSHPULL,
 ROWS) = range(1, 26)

LAYOUT = [["w", [2, 3]], ["b", [3]]]


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def floats(*v):
    return struct.pack("<%df" % len(v), *v)


def fingerprint(layout):
    """64-bit FNV-1a over "name:d0xd1...;" (PROTOCOL.md section 4.1)."""
    h = 0xCBF29CE484222325
    for name, dims in layout:
        for byte in f"{name}:{'x'.join(map(str, dims))};".encode():
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def map_header(n):
    return bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)


def ours(fields, data):
    """A payload laid out as psd's encoder does: the fields, then "pad" (a bin
    of 0..3 zero bytes) and "data" as a bin32, the floats at a frame offset
    (length prefix included) that is a multiple of 4."""
    head = map_header(len(fields) + 2) + b"".join(pack(k) + pack(v) for k, v in fields.items())
    k = -(4 + len(head) + 4 + 2 + 5 + 5) % 4
    return (head + pack("pad") + b"\xc4" + bytes([k]) + b"\0" * k + pack("data") + b"\xc6" +
            struct.pack(">I", len(data)) + data)


def keys(*k):
    """A "keys" bin: little-endian uint64 (PROTOCOL.md section 13.2)."""
    return struct.pack("<%dQ" % len(k), *k)


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def hello_worker(shard=0, nshards=1):
    return pack({"t": HELLO, "id": 1, "v": 1, "role": "worker", "shard": [shard, nshards],
                 "layout": LAYOUT, "fp": fingerprint(LAYOUT)})


def hello_admin():
    return pack({"t": HELLO, "id": 1, "v": 1, "role": "admin"})


BODY = {"mode": "asgd", "version": 12, "params": 9, "paused": False, "lr": 0.05,
        "workers": [{"shard": 0, "state": "connected", "loss": 0.25, "addr": "127.0.0.1:4000"}],
        "layout": LAYOUT, "raw": b"\x01\x02", "none": None, "ext": msgpack.ExtType(5, b"xy")}

# ---- messages: one payload each (fuzz_msg) ---------------------------------

MESSAGES = {
    # every type, well formed
    "hello_worker": hello_worker(),
    "hello_worker_nofp": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [2, 4],
                               "layout": [["conv1.weight", [8, 1, 3, 3]], ["fc.b", [10]]]}),
    "hello_admin": hello_admin(),
    "hello_v2": pack({"t": HELLO, "v": 2, "role": "admin"}),
    "welcome": pack({"t": WELCOME, "id": 1, "v": 1, "mode": "bsp", "ver": 0, "params": 9, "workers": 2,
                     "init": True, "hb": 10000, "fp": fingerprint(LAYOUT), "layout": LAYOUT}),
    "init": ours({"t": INIT, "id": 2, "off": 0, "fin": True}, floats(*range(9))),
    "push": ours({"t": PUSH, "id": 4, "base": 3, "off": 0, "fin": True}, floats(0.5, -1.25)),
    "push_chunk": ours({"t": PUSH, "id": 5, "base": 3, "off": 6, "fin": False}, floats(1, 2, 3)),
    "push_unaligned": pack({"t": PUSH, "data": floats(0.5, -1.25, 3.0), "off": 1, "base": 0}),
    "pull": pack({"t": PULL, "id": 3, "off": 0, "len": 9, "min": 1}),
    "pushpull": ours({"t": PUSHPULL, "id": 6, "base": 1, "off": 0, "poff": 0, "plen": 9, "min": 2},
                     floats(*[0.1] * 9)),
    "params": ours({"t": PARAMS, "id": 8, "ver": 4, "off": 0}, floats(0.125, 2.0)),
    # bfloat16 tensors ("dt": 1, 2 bytes a value) and the reply type ("rdt")
    "push_bf16": ours({"t": PUSH, "id": 10, "base": 3, "off": 0, "dt": 1}, b"\x00\x3f\xa0\xbf\x40\x40"),
    "pushpull_bf16": ours({"t": PUSHPULL, "id": 11, "base": 1, "off": 0, "poff": 0, "plen": 3, "dt": 1, "rdt": 1},
                          b"\xcd\x3d" * 3),
    "params_bf16": ours({"t": PARAMS, "id": 12, "ver": 4, "off": 0, "dt": 1}, b"\x00\x3e\x00\x40"),
    "pull_bf16": pack({"t": PULL, "id": 13, "off": 0, "len": 9, "rdt": 1}),
    # float32 without its zeros ("dt": 2): a bitmap of "len" bits in whole
    # 32-bit words, then the values whose bit is set (here 2 of 9, 1 and 8)
    "push_f32z": ours({"t": PUSH, "id": 14, "base": 3, "off": 0, "len": 9, "dt": 2},
                      b"\x02\x01\x00\x00" + floats(0.5, -2.0)),
    "pushpull_f32z": ours({"t": PUSHPULL, "id": 15, "base": 1, "off": 0, "poff": 0, "plen": 9, "len": 40, "dt": 2},
                          b"\xff\x00\x00\x00\x00\x00\x00\x00" + floats(*[0.25] * 8)),
    "bad_f32z_count": ours({"t": PUSH, "id": 16, "base": 3, "off": 0, "len": 9, "dt": 2},
                           b"\x03\x01\x00\x00" + floats(0.5, -2.0)),
    "bad_f32z_past_len": ours({"t": PUSH, "id": 17, "base": 3, "off": 0, "len": 9, "dt": 2},
                              b"\x00\x06\x00\x00" + floats(0.5, -2.0)),
    # compressed float32 ("dt": 3): one zstd frame of "len" values' byte planes (not
    # checked by the decoder; psd decompresses it)
    "push_zstd": ours({"t": PUSH, "id": 19, "base": 3, "off": 0, "len": 2, "dt": 3},
                      bytes.fromhex("28b52ffd20084100000000000000003fc0")),  # [0.5, -2.0]
    "params_zstd": ours({"t": PARAMS, "id": 21, "ver": 4, "off": 0, "len": 2, "dt": 3},
                        bytes.fromhex("28b52ffd20084100000000000000003fc0")),
    "pull_zstd": pack({"t": PULL, "id": 22, "off": 0, "len": 9, "rdt": 3}),
    "bad_zstd_no_len": ours({"t": PUSH, "id": 20, "base": 3, "off": 0, "dt": 3}, b"\x28\xb5\x2f\xfd"),
    "bad_f32z_no_len": ours({"t": PUSH, "id": 18, "base": 3, "off": 0, "dt": 2}, b"\x01\x00\x00\x00" + floats(1.0)),
    "welcome_wire": pack({"t": WELCOME, "id": 1, "v": 1, "mode": "asgd", "ver": 0, "params": 9, "wire": 14}),
    "ok": pack({"t": OK, "id": 7, "ver": 5, "text": "checkpoint written"}),
    "heartbeat": pack({"t": HEARTBEAT}),
    # a heartbeat asking what the worker's parked pull waits for, and psd's answer
    "heartbeat_wait": pack({"t": HEARTBEAT, "wait": True}),
    "ok_wait": pack({"t": OK, "id": 0, "ver": 3, "wait": True, "text": "round 3 waits for shard 2/3 (never joined)"}),
    "status": pack({"t": STATUS, "id": 9}),
    "status_reply": pack({"t": STATUS_REPLY, "id": 9, "body": BODY}),
    "metrics": pack({"t": METRICS, "id": 10}),
    "metrics_reply": pack({"t": METRICS_REPLY, "id": 10, "text": "# TYPE psd_version gauge\npsd_version 3\n"}),
    "report": pack({"t": REPORT, "id": 11, "epoch": 3, "loss": 0.31, "acc": 0.9, "tloss": 0.35,
                    "samples": 60000, "rate": 5120.5}),
    "report_f32": b"\x84\xa1t\x0e\xa5epoch\x01\xa4loss\xca\x3e\x80\x00\x00\xa3acc\xcb\x7f\xf8\0\0\0\0\0\x01",
    "error": pack({"t": ERROR, "id": 12, "code": 8, "text": "push: range [0, 10) outside the model"}),
    "error_negative": pack({"t": ERROR, "code": -5, "text": ""}),
    "bye": pack({"t": BYE, "id": 13}),
    "admin_set": pack({"t": ADMIN, "id": 14, "cmd": "set", "args": ["lr", "0.01"]}),
    "admin_checkpoint": pack({"t": ADMIN, "id": 15, "cmd": "checkpoint", "args": []}),
    "challenge": pack({"t": CHALLENGE, "id": 1, "nonce": bytes(range(32))}),
    "auth": pack({"t": AUTH, "id": 2, "cnonce": bytes(range(32, 64)), "proof": b"\xa5" * 32}),
    "welcome_sproof": pack({"t": WELCOME, "id": 2, "v": 1, "mode": "asgd", "ver": 3, "params": 9,
                            "sproof": b"\x5a" * 32}),
    # tables (section 13)
    "table": pack({"t": TABLE, "id": 30, "tab": "user_id", "dim": 4, "rinit": "uniform", "scale": 0.05,
                   "seed": 7, "opt": "adagrad", "hp": {"lr": 0.05, "eps": 1e-10, "iacc": 0.1}}),
    "table_ftrl": pack({"t": TABLE, "tab": "ad", "dim": 1, "rinit": "zeros", "opt": "ftrl",
                        "hp": {"lr": 0.1, "beta": 1, "l1": 0.5, "l2": 1.0}}),
    "tpull": pack({"t": TPULL, "id": 31, "tab": "user_id", "keys": keys(0, 42, 2**64 - 1), "min": 2}),
    "tpush": ours({"t": TPUSH, "id": 32, "tab": "user_id", "keys": keys(42, 7), "base": 3},
                  floats(*[0.5] * 8)),
    "tpush_unaligned": pack({"t": TPUSH, "data": floats(1, 2), "tab": "e", "keys": keys(1, 2), "base": 0}),
    "tpushpull": ours({"t": TPUSHPULL, "id": 33, "tab": "user_id", "keys": keys(42), "base": 3,
                       "pkeys": keys(5, 6, 7), "min": 4}, floats(0.25, -1, 2, 0)),
    "rows": ours({"t": ROWS, "id": 33, "ver": 4}, floats(*range(12))),
    "tpushpull_seg": pack({"t": TPUSHPULL, "id": 34, "tab": "user_id", "base": 3, "seg": [0, 2, 3, 1 << 20]}),
    "tpull_seg": pack({"t": TPULL, "tab": "e", "seg": [64, 1, 0, 4096], "min": 1}),
    "bad_seg_and_keys": pack({"t": TPUSH, "tab": "e", "keys": keys(1), "base": 0, "seg": [0, 1, 0, 0]}),
    "hello_tshm": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1], "layout": [["w", [4]]],
                        "tshm": [1234, 5]}),
    "rows_inshm": pack({"t": ROWS, "id": 34, "ver": 3, "inshm": True, "len": 48}),
    "bad_keys_len": pack({"t": TPULL, "tab": "e", "keys": b"\0" * 12}),
    "bad_keys_empty": pack({"t": TPULL, "tab": "e", "keys": b""}),
    "bad_hp_unknown": pack({"t": TABLE, "tab": "e", "dim": 4, "rinit": "zeros", "opt": "sgd", "hp": {"mom": 0.9}}),
    "bad_hp_str": pack({"t": TABLE, "tab": "e", "dim": 4, "rinit": "zeros", "opt": "sgd", "hp": {"lr": "0.1"}}),
    "tpush_bf16": ours({"t": TPUSH, "tab": "e", "keys": keys(1), "base": 0, "dt": 1}, b"\x80\x3f\x00\x40"),
    "tpull_rdt_zstd": pack({"t": TPULL, "tab": "e", "keys": keys(1), "rdt": 3}),
    "rows_bf16": ours({"t": ROWS, "id": 33, "ver": 4, "dt": 1}, b"\x80\x3f\x00\x40"),
    "bad_tpull_rdt_f32z": pack({"t": TPULL, "tab": "e", "keys": keys(1), "rdt": 2}),
    "bad_tpull_at_rdt": pack({"t": TPULL, "tab": "e", "off": 0, "len": 2, "rdt": 1}),
    "bad_tpushpull_no_pkeys": ours({"t": TPUSHPULL, "tab": "e", "keys": keys(1), "base": 0}, floats(1.0)),
    "unknown_keys": pack({"t": PULL, "off": 0, "len": 1, "future": [1, {"a": None}], "pad": 7}),
    # malformed
    "bad_array32": b"\xdd\xff\xff\xff\xff",
    "bad_map32": b"\xdf\xff\xff\xff\xff\xa1t\x05",
    "bad_reserved": b"\x82\xa1t\x05\xa3off\xc1",
    "bad_not_map": pack([HELLO, 1]),
    "bad_int_key": pack({1: 2, "t": 9}),
    "bad_type0": pack({"t": 0}),
    "bad_type26": pack({"t": 26}),
    "bad_nonce_len": pack({"t": CHALLENGE, "nonce": b"\0" * 31}),
    "bad_proof_str": pack({"t": AUTH, "cnonce": b"\0" * 32, "proof": "x" * 32}),
    "bad_auth_no_proof": pack({"t": AUTH, "cnonce": b"\0" * 32}),
    "bad_type_str": pack({"t": "push"}),
    "bad_no_type": pack({"id": 1}),
    "bad_dup_field": b"\x83\xa1t\x09\xa2id\x01\xa2id\x02",
    "bad_data_len": pack({"t": PUSH, "base": 0, "off": 0, "data": b"\0" * 5}),
    "bad_data_str": pack({"t": PUSH, "base": 0, "off": 0, "data": "abcd"}),
    "bad_deep": pack({"t": STATUS_REPLY, "body": {"a": [[[[[1]]]]]}}),
    "bad_fp": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1], "layout": LAYOUT, "fp": 1}),
    "bad_name_space": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1], "layout": [["a b", [1]]]}),
    "bad_rank7": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1], "layout": [["a", [1] * 7]]}),
    "bad_dim0": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1], "layout": [["a", [3, 0]]]}),
    "bad_too_many_params": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1],
                                 "layout": [["a", [1 << 20, 1 << 15]]]}),
    "bad_shard": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [4, 4], "layout": LAYOUT}),
    "bad_worker_no_layout": pack({"t": HELLO, "v": 1, "role": "worker", "shard": [0, 1]}),
    "bad_role": pack({"t": HELLO, "v": 1, "role": "root"}),
    "bad_bool": pack({"t": PUSH, "base": 0, "off": 0, "data": b"", "fin": 1}),
    "bad_code": pack({"t": ERROR, "code": 1 << 40, "text": "x"}),
    "bad_args": pack({"t": ADMIN, "cmd": "set", "args": ["x"] * 17}),
    "bad_cmd_long": pack({"t": ADMIN, "cmd": "c" * 32}),
    "bad_trailing": pack({"t": BYE}) + b"\x00",
    "bad_truncated": hello_worker()[:-3],
    "bad_str_overrun": b"\x82\xa1t\x0d\xa4text\xd9\xff" + b"x" * 10,
    "bad_missing_field": pack({"t": PUSHPULL, "base": 0, "off": 0, "data": b"", "poff": 0}),
}

# ---- streams: a selector byte and frames (fuzz_frame) ----------------------
# Selector bits 0-1: max_frame after the hello = 4K, 64K, 64M, 2G-1.


def stream(selector, *payloads, tail=b""):
    return bytes([selector]) + b"".join(frame(p) for p in payloads) + tail


M = MESSAGES
STREAMS = {
    "worker_session": stream(2, M["hello_worker"], M["init"], M["pull"], M["push"], M["push_chunk"],
                             M["pushpull"], M["report"], M["heartbeat"], M["bye"]),
    "admin_session": stream(0, M["hello_admin"], M["status"], M["metrics"], M["admin_set"], M["pull"],
                            M["admin_checkpoint"], M["bye"]),
    "server_replies": stream(3, M["hello_admin"], M["welcome"], M["ok"], M["params"], M["status_reply"],
                             M["metrics_reply"], M["error"]),
    "auth_handshake": stream(2, M["hello_worker"], M["auth"], M["pull"], M["bye"]),
    "bad_after_hello": stream(1, M["hello_worker"], M["bad_dup_field"], M["bad_data_len"], M["pull"]),
    "bad_before_hello": stream(2, M["bad_array32"], M["hello_admin"]),
    "table_session": stream(2, M["hello_worker"], M["table"], M["tpull"], M["tpush"], M["tpushpull"],
                            M["bad_keys_len"], M["tpull"], M["bye"]),
    "push_before_hello": stream(2, M["push"], M["hello_worker"]),
    "unsupported_hello": stream(2, M["hello_v2"], M["status"]),
    "zero_length": stream(2, M["hello_admin"], tail=b"\0\0\0\0" + frame(M["status"])),
    "too_big_prehello": stream(2, tail=struct.pack(">I", 512 * 1024 + 1) + b"\x80"),
    "too_big_posthello": stream(0, M["hello_admin"], tail=struct.pack(">I", 4097) + b"\x80"),
    "partial_frame": stream(2, M["hello_admin"], tail=frame(M["status"])[:-1]),
    "partial_header": stream(2, M["hello_admin"], tail=b"\0\0"),
}

# ---- checkpoint files (fuzz_checkpoint), format of server/checkpoint.h -----


def checkpoint(layout, optimizer="sgd", state=("momentum",), clocks=((0, 5), (1, 4)), version=7,
               values=None, header=None, magic=b"PSDCKPT1", fmt=1, end=b"PSDE", extra=b"", tables=None):
    """tables: [(declaration map without rows/floats, floats a row, [keys])]:
    format 2, the tables' keys and rows after the state; fmt=3 adds each
    table's clock (10) and its rows' last-push clocks after its rows."""
    n = 0
    for _, dims in layout:
        c = 1
        for d in dims:
            c *= d
        n += c
    if header is None:
        header = pack({"version": version, "created": 1.7e9, "params": n, "layout": layout,
                       "optimizer": optimizer,
                       "settings": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "beta1": 0.9,
                                    "beta2": 0.999, "mode": "asgd"},
                       "state": list(state), "clocks": [list(c) for c in clocks]})
        if tables is not None:
            h = msgpack.unpackb(header, raw=False)
            h["tables"] = [dict(d, rows=len(ks), floats=f, **({"clock": 10} if fmt == 3 else {}))
                           for d, f, ks in tables]
            header = pack(h)
            fmt = 3 if fmt == 3 else 2
    body = magic + struct.pack("<II", fmt, len(header)) + header
    vals = values if values is not None else [0.01 * i for i in range(n)]
    body += floats(*vals) + b"".join(floats(*[0.5] * n) for _ in state)
    for _, f, ks in tables or ():
        body += keys(*ks) + floats(*[0.25 * i for i in range(len(ks) * f)])
        if fmt == 3:
            body += keys(*[min(i, 10) for i in range(len(ks))])
    body += extra
    return body + struct.pack("<I", zlib.crc32(body)) + end


SMALL = [["w", [2, 2]], ["b", [2]]]
EMB = {"name": "emb", "dim": 2, "rinit": "uniform", "scale": 0.05, "seed": 7, "opt": "adagrad",
       "hp": {"lr": 0.01, "eps": 1e-10, "iacc": 0.0}}
LIN = {"name": "lin", "dim": 1, "rinit": "zeros", "scale": 0.0, "seed": 0, "opt": "ftrl",
       "hp": {"lr": 0.05, "beta": 1.0, "l1": 0.0, "l2": 0.0}}
CHECKPOINTS = {
    "tables": checkpoint(SMALL, tables=[(EMB, 4, [0, 42, 2**64 - 1]), (LIN, 3, [5])]),
    "tables_empty": checkpoint(SMALL, tables=[(EMB, 4, [])]),
    "tables_clocks": checkpoint(SMALL, tables=[(EMB, 4, [0, 42, 2**64 - 1]), (LIN, 3, [5])], fmt=3),
    "bad_tables_dup_key": checkpoint(SMALL, tables=[(EMB, 4, [42, 42])]),
    "bad_tables_floats": checkpoint(SMALL, tables=[(EMB, 5, [1])]),
    "bad_tables_def": checkpoint(SMALL, tables=[(dict(EMB, dim=0), 0, [])]),
    "sgd_momentum": checkpoint(LAYOUT),
    "adam": checkpoint(SMALL, "adam", ("exp_avg", "exp_avg_sq")),
    "adagrad": checkpoint(SMALL, "adagrad", ("sum",), clocks=()),
    "no_state": checkpoint([["x", [3]]], "sgd", (), clocks=((65535, 1),)),
    "many_tensors": checkpoint([[f"t{i}", [1, 1]] for i in range(20)], clocks=((3, 2), (0, 9), (7, 1))),
    "bad_magic": checkpoint(SMALL, magic=b"PSDCKPT0"),
    "bad_format": checkpoint(SMALL, fmt=2),
    "bad_end": checkpoint(SMALL, end=b"PSDX"),
    "bad_padded": checkpoint(SMALL, extra=b"\0\0\0\0"),
    "bad_header": checkpoint(SMALL, header=pack([1, 2, 3])),
    "bad_layout": checkpoint(SMALL, header=pack({"version": 1, "layout": [["w", [0]]], "optimizer": "sgd",
                                                 "state": []})),
    "bad_clocks": checkpoint(SMALL, clocks=((70000, 1), ("x", 2))),
    "bad_truncated": checkpoint(SMALL)[:40],
}

# ---- configuration files (fuzz_config) -------------------------------------


def all_defaults():
    """conf/psd.conf's commented defaults, uncommented."""
    lines = []
    with open(os.path.join(HERE, "..", "conf", "psd.conf"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("# ") and " = " in line and line[2].isalpha() and "  " not in line[:40]:
                lines.append(line[2:])
    return "".join(lines).encode()


CONFIGS = {
    "defaults": all_defaults(),
    "small": b"workers = 4\nmode = bsp\n",
    "section": b"; comment\n[psd]\nlisten = [::1]:0\nmax_frame = 1G\nheartbeat_timeout = 1.5s\n"
               b"optimizer = ADAMW\nbeta1 = 0.8\nbeta2 = 0.99\nnesterov = on\n",
    "strings": b"state_dir = /var/lib/psd\nport_file = psd.port\nmetrics_listen = 127.0.0.1:9100\n"
               b"listen = example.org:7000\n",
    "numbers": b"lr = 1e-3\nlr_min = 0.0000001\nclip_norm = 5\nlr_schedule = cosine\nlr_decay_versions = 100000\n"
               b"warmup_versions = 10\nmax_params = 1000000\ncheckpoint_interval = 5m\ncheckpoint_keep = 1\n",
    "crlf_indent": b"  workers = 3\r\n\tmode = ssp\r\nstaleness = 2 \r\n",
    "bad_key": b"lrr = 0.1\n",
    "bad_section": b"[worker]\nworkers = 2\n",
    "bad_range": b"workers = 0\n",
    "bad_size": b"max_frame = 12Q\n",
    "bad_duration": b"heartbeat_timeout = -1s\n",
    "bad_hostport": b"listen = [::1:7000\n",
    "bad_syntax": b"workers\n",
    "bad_long_line": b"state_dir = " + b"x" * 300 + b"\n",
    "bad_enum": b"optimizer = lbfgs\n",
}


# ---- tensors in their wire forms (fuzz_codec): a selector byte, then ------
# float32 values (0), n and a zstd frame of byte planes made by the zstd
# program (1), n and a bitmap with the values that are not +0.0 (2), or
# bfloat16 values (3). -----------------------------------------------------

def planes(vals):
    raw = floats(*vals)
    return bytes(raw[i + 4 * j] for i in range(4) for j in range(len(vals)))


def zstd_frame(data):
    """One zstd frame (level 1) with its content size, from the zstd program."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        return subprocess.run(["zstd", "-1", "-q", "-c", f.name], capture_output=True, check=True).stdout


def f32z(vals):
    n = len(vals)
    mask = bytearray((n + 31) // 32 * 4)
    kept = []
    for i, v in enumerate(vals):
        if struct.pack("<f", v) != b"\0\0\0\0":
            mask[i // 8] |= 1 << (i % 8)
            kept.append(v)
    return struct.pack("<H", n) + bytes(mask) + floats(*kept)


def codec_seeds():
    grad = [0.0] * 40 + [0.5, -0.25, 1e-3, -0.0, float("inf"), float("nan"), 3.4e38, 1e-40] + [0.0] * 16
    ramp = [i / 64.0 for i in range(256)]
    return {
        "floats_grad": b"\0" + floats(*grad),
        "floats_ramp": b"\0" + floats(*ramp),
        "floats_empty": b"\0",
        "zstd_ramp": b"\1" + struct.pack("<H", len(ramp)) + zstd_frame(planes(ramp)),
        "zstd_grad": b"\1" + struct.pack("<H", len(grad)) + zstd_frame(planes(grad)),
        "zstd_wrong_n": b"\1" + struct.pack("<H", 255) + zstd_frame(planes(ramp)),
        "zstd_two_frames": b"\1" + struct.pack("<H", 512) + zstd_frame(planes(ramp)) * 2,
        "f32z_grad": b"\2" + f32z(grad),
        "f32z_all_zero": b"\2" + f32z([0.0] * 70),
        "bf16": b"\3" + struct.pack("<8H", 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8000, 0x7f7f),
    }


def write(target, seeds):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("seed-"):
            os.remove(os.path.join(d, f))
    for name, data in seeds.items():
        assert len(data) < 4096, f"{target}/{name} is {len(data)} bytes"
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
    print(f"{target}: {len(seeds)} seeds")


def main():
    # a table push's row gradients compressed (dt 3): one real frame
    MESSAGES["tpush_zstd"] = ours({"t": TPUSH, "tab": "e", "keys": keys(1), "base": 0, "dt": 3, "len": 2},
                                  zstd_frame(planes([0.5, -2.0])))
    write("fuzz_msg", MESSAGES)
    write("fuzz_frame", STREAMS)
    write("fuzz_checkpoint", CHECKPOINTS)
    write("fuzz_config", CONFIGS)
    write("fuzz_codec", codec_seeds())


if __name__ == "__main__":
    main()
