#!/usr/bin/python3
"""test_hostile.py - hostile clients attack psd while a real job trains.

Frames are built with Python's msgpack (not the encoder under test): random
bytes, over-size and zero length prefixes, valid msgpack of the wrong shape,
messages in the wrong state or role, a layout that differs from the job's, a
"worker" on a spare shard that pushes NaN and out-of-range gradients,
truncated frames, frames dripped one byte at a time, many idle connections.

Each case expects an ERROR frame with the right code (and, where the
protocol says so, the connection closed), or a closed connection, and never
a hang: every receive has a timeout. Afterwards the real workers must have
finished as well as a clean run, psd must still answer psctl, its
psd_rejected_messages_total counters must have risen for each reason
exercised, and its RSS must not have grown by more than PSD_TEST_RSS_SLACK_MB
(default 50) MiB during the attack.

ASGD is the mode where a hostile client may join as a worker on a spare
shard (a BSP round would wait for it); the BSP job gets the attacks that do
not join, and must still close exactly the expected number of rounds.
"""

import collections
import os
import re
import socket
import struct
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_BAD_FIELD, E_BAD_TYPE, E_FORBIDDEN, E_LAYOUT, E_LIMIT, E_MALFORMED, E_NONFINITE,  # noqa: E402
                     E_RANGE, E_SHARD, E_STATE, E_TOO_BIG, E_UNSUPPORTED, PROTO_VERSION, T_BYE, T_ERROR,
                     T_HEARTBEAT, T_HELLO, T_INIT, T_OK, T_PARAMS, T_PULL, T_PUSH, T_PUSHPULL, T_REPORT,
                     T_STATUS, T_STATUS_REPLY, T_WELCOME, RawClient, expect_error, floats, frame, pack)

EPOCHS = 4
BATCH = 64
LIMIT = 20000
TEST_LIMIT = 2000
HIDDEN = (256, 128)
MODEL = "mlp:256,128"
LAYOUT = harness.mlp_layout(HIDDEN)
TOTAL = harness.layout_size(LAYOUT)
MIN_ACCURACY = 0.85
RSS_SLACK_KB = int(os.environ.get("PSD_TEST_RSS_SLACK_MB", "50")) * 1024
REPLY_TIMEOUT = 10.0


class Attack:
    """Runs hostile cases against one psd and counts the ERROR codes psd
    sent, so the metrics can be checked against them afterwards."""

    def __init__(self, test, psd):
        self.t = test
        self.psd = psd
        self.addr = psd.addr
        self.errors = collections.Counter()
        self.rss_before = self.rss_max = psd.rss_kb()
        self.rnd = harness.seeded_random(test.id())

    def sample_rss(self):
        self.rss_max = max(self.rss_max, self.psd.rss_kb())

    def note(self, frames):
        for f in frames:
            if isinstance(f, dict) and f.get("t") == T_ERROR:
                self.errors[f.get("code")] += 1

    def error(self, c, code, what, obj=None, raw=None):
        """Sends obj (or raw bytes) and expects ERROR code on c, which stays
        open."""
        if raw is not None:
            c.send_raw(raw)
        else:
            c.send_frame(obj)
        r = c.recv_frame(REPLY_TIMEOUT)
        expect_error(self.t, r, code, what)
        self.errors[code] += 1
        return r

    def fatal(self, code, what, obj=None, raw=None, before=None):
        """On a new connection (after sending the frames in before), sends
        obj or raw and expects ERROR code followed by psd closing it."""
        with RawClient(self.addr, REPLY_TIMEOUT) as c:
            for b in before or ():
                b(c)
            if raw is not None:
                c.send_raw(raw)
            else:
                c.send_frame(obj)
            frames = c.expect_closed(REPLY_TIMEOUT)
            self.t.assertTrue(frames, "%s: psd closed without an ERROR" % what)
            expect_error(self.t, frames[0], code, what)
            self.t.assertEqual(len(frames), 1, "%s: more than one reply: %r" % (what, frames))
            self.errors[code] += 1

    def alive(self, c, what):
        r = c.heartbeat()
        self.t.assertEqual(r.get("t"), T_OK, "%s: heartbeat answered with %r" % (what, r))
        return r

    # ---- the cases ------------------------------------------------------------

    def random_bytes(self, rounds=60):
        """Random payloads behind a correct length prefix (psd must decode
        and refuse them), then fully random bytes followed by a half-close
        (psd must answer or close; it may wait for the rest of a frame whose
        random length is within its limit, so we end our side)."""
        for i in range(rounds):
            payload = bytes(self.rnd.getrandbits(8) for _ in range(self.rnd.randint(1, 2000)))
            with RawClient(self.addr, REPLY_TIMEOUT) as c:
                c.send_raw(frame(payload))
                frames = c.expect_closed(REPLY_TIMEOUT)
                self.t.assertEqual(len(frames), 1, "random frame %d: %r" % (i, frames))
                self.t.assertEqual(frames[0].get("t"), T_ERROR, "random frame %d: %r" % (i, frames))
                self.note(frames)
        for i in range(rounds):
            data = bytes(self.rnd.getrandbits(8) for _ in range(self.rnd.randint(1, 3000)))
            with RawClient(self.addr, REPLY_TIMEOUT) as c:
                try:
                    c.send_raw(data)
                    c.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    continue  # psd refused it already (broken pipe, reset)
                frames = c.expect_closed(REPLY_TIMEOUT)
                self.t.assertLessEqual(len(frames), 1, "random bytes %d: %r" % (i, frames))
                for f in frames:
                    self.t.assertEqual(f.get("t"), T_ERROR, "random bytes %d: %r" % (i, f))
                self.note(frames)
        self.sample_rss()

    def bad_lengths(self):
        big = struct.pack(">I", 0x7FFFFFFF)
        self.fatal(E_TOO_BIG, "0x7fffffff length before hello", raw=big)
        self.fatal(E_TOO_BIG, "0xffffffff length before hello", raw=b"\xff\xff\xff\xff")
        self.fatal(E_TOO_BIG, "512 KiB + 1 before hello", raw=struct.pack(">I", harness.FRAME_MAX_PREAUTH + 1))
        self.fatal(E_TOO_BIG, "0x7fffffff length after hello", raw=big + b"\x00" * 64,
                   before=[lambda c: c.hello_admin()])
        self.fatal(E_MALFORMED, "zero length", raw=b"\x00\x00\x00\x00")
        self.sample_rss()

    def wrong_shape_before_hello(self):
        cases = [
            (E_MALFORMED, "a list", [1, 2, 3]),
            (E_MALFORMED, "a bare integer", 9),
            (E_MALFORMED, "a map without t", {"x": 1}),
            (E_MALFORMED, "t as a string", {"t": "hello"}),
            (E_MALFORMED, "negative t", {"t": -1}),
            (E_BAD_TYPE, "unknown type 99", {"t": 99}),
            (E_BAD_TYPE, "type 0", {"t": 0}),
            (E_STATE, "push before hello", {"t": T_PUSH, "id": 5, "base": 0, "off": 0, "data": floats([1.0])}),
            (E_STATE, "heartbeat before hello", {"t": T_HEARTBEAT, "id": 6}),
            (E_STATE, "auth before hello (psd sent no challenge)",
             {"t": harness.T_AUTH, "id": 7, "cnonce": bytes(32), "proof": bytes(32)}),
            (E_UNSUPPORTED, "protocol version 2", {"t": T_HELLO, "v": 2, "role": "admin"}),
            (E_BAD_FIELD, "role root", {"t": T_HELLO, "v": PROTO_VERSION, "role": "root"}),
            (E_BAD_FIELD, "hello without role", {"t": T_HELLO, "v": PROTO_VERSION}),
            (E_BAD_FIELD, "worker hello without layout",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8]}),
            (E_BAD_FIELD, "shard k >= m",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [8, 8], "layout": LAYOUT}),
            (E_BAD_FIELD, "layout fingerprint that does not match",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": LAYOUT,
              "fp": harness.layout_fingerprint(LAYOUT) ^ 1}),
            (E_BAD_FIELD, "a zero dimension",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": [["w", [0]]]}),
            (E_BAD_FIELD, "a tensor name with a space",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": [["a b", [3]]]}),
            (E_BAD_FIELD, "more parameters than the protocol allows",
             {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8],
              "layout": [["w", [1 << 20, 1 << 20]]]}),
        ]
        for code, what, obj in cases:
            self.fatal(code, what, obj=obj)
        raw_cases = [
            (b"\xdd\xff\xff\xff\xff", "array32 declaring 2^32-1 elements"),
            (b"\xdf\xff\xff\xff\xff", "map32 declaring 2^32-1 pairs"),
            (b"\x81\xa1t\xdb\xff\xff\xff\xff", "str32 declaring 4 GiB"),
            (b"\x81\xa1t\xc6\x7f\xff\xff\xff", "bin32 declaring 2 GiB"),
            (b"\x81\xa1t" + b"\x91" * 40 + b"\x01", "arrays nested 40 deep"),
            (b"\x81\xa1t\xc1", "the reserved byte 0xc1"),
            (pack({"t": T_HEARTBEAT}) + b"\x00", "a trailing byte"),
            (b"\x82\xa1t\x09\x01\x02", "an integer map key"),
            (b"\x81\xa1t", "a map missing its last value"),
        ]
        for payload, what in raw_cases:
            self.fatal(E_MALFORMED, what, raw=frame(payload))
        self.sample_rss()

    def wrong_shape_after_hello(self):
        """An established connection survives bad messages: each costs only
        itself."""
        with RawClient(self.addr, REPLY_TIMEOUT) as c:
            c.hello_admin()
            self.error(c, E_MALFORMED, "a list", [1, 2, 3])
            self.alive(c, "after a list")
            self.error(c, E_MALFORMED, "a map without t", {"id": 3})
            self.error(c, E_MALFORMED, "a reserved byte", raw=frame(b"\xc1"))
            self.error(c, E_MALFORMED, "arrays nested 40 deep", raw=frame(b"\x81\xa1t" + b"\x91" * 40 + b"\x01"))
            self.error(c, E_BAD_TYPE, "unknown type", {"t": 99, "id": 4})
            self.error(c, E_BAD_TYPE, "an OK from a client", {"t": T_OK, "id": 5})
            self.error(c, E_BAD_TYPE, "an ERROR from a client", {"t": T_ERROR, "id": 6, "code": 1, "text": "x"})
            # server-only types are BAD_TYPE whatever their fields (issue 15, 11)
            self.error(c, E_BAD_TYPE, "a WELCOME from a client", {"t": T_WELCOME, "id": 7})
            self.error(c, E_BAD_TYPE, "a STATUS_REPLY from a client", {"t": T_STATUS_REPLY, "id": 8})
            self.error(c, E_BAD_TYPE, "a STATUS_REPLY with a body", {"t": T_STATUS_REPLY, "id": 9, "body": {}})
            self.error(c, E_BAD_TYPE, "a PARAMS without fields", {"t": harness.T_PARAMS, "id": 10})
            self.error(c, E_BAD_TYPE, "a METRICS_REPLY without text", {"t": harness.T_METRICS_REPLY, "id": 11})
            self.error(c, E_STATE, "a second hello", {"t": T_HELLO, "id": 8, "v": PROTO_VERSION, "role": "admin"})
            # this psd requires no token: it never challenges, and takes no answer
            self.error(c, E_STATE, "an auth without a challenge",
                       {"t": harness.T_AUTH, "id": 20, "cnonce": os.urandom(32), "proof": os.urandom(32)})
            self.error(c, E_BAD_TYPE, "a challenge from a client", {"t": harness.T_CHALLENGE, "id": 21,
                                                                   "nonce": bytes(32)})
            self.error(c, E_BAD_FIELD, "an auth with a short proof",
                       {"t": harness.T_AUTH, "id": 22, "cnonce": bytes(32), "proof": bytes(16)})
            self.error(c, E_FORBIDDEN, "a push from an admin",
                       {"t": T_PUSH, "id": 9, "base": 0, "off": 0, "data": floats([0.0])})
            self.error(c, E_FORBIDDEN, "an init from an admin",
                       {"t": T_INIT, "id": 10, "off": 0, "data": floats([0.0])})
            self.error(c, E_FORBIDDEN, "a report from an admin", {"t": T_REPORT, "id": 11, "epoch": 1})
            self.error(c, E_BAD_FIELD, "data as a string",
                       {"t": T_PUSH, "id": 12, "base": 0, "off": 0, "data": "abcd"})
            self.error(c, E_BAD_FIELD, "data of 3 bytes",
                       {"t": T_PUSH, "id": 13, "base": 0, "off": 0, "data": b"abc"})
            self.error(c, E_BAD_FIELD, "a negative offset", {"t": T_PULL, "id": 14, "off": -1, "len": 1})
            self.error(c, E_BAD_FIELD, "a pull without len", {"t": T_PULL, "id": 15, "off": 0})
            # "id" twice in one map (a dict cannot say it; write the bytes)
            self.error(c, E_BAD_FIELD, "a field twice", raw=frame(b"\x83\xa1t\x09\xa2id\x01\xa2id\x02"))
            r = self.error(c, E_RANGE, "a pull past the end", {"t": T_PULL, "id": 16, "off": TOTAL - 1, "len": 2})
            self.t.assertEqual(r.get("id"), 16, "the ERROR echoes the request id")
            self.error(c, E_RANGE, "a pull of nothing", {"t": T_PULL, "id": 17, "off": 0, "len": 0})
            self.error(c, E_RANGE, "a pull at 2^63", {"t": T_PULL, "id": 18, "off": 1 << 63, "len": 1})
            # unknown keys are ignored
            r = c.request({"t": T_HEARTBEAT, "zzz": [1, {"a": None}], "id": 19})
            self.t.assertEqual((r.get("t"), r.get("id")), (T_OK, 19))
            # the model, whole, as an admin may pull it
            r = c.request({"t": T_PULL, "off": 0, "len": TOTAL})
            self.t.assertEqual(r.get("t"), T_PARAMS, r)
            w = np.frombuffer(r["data"], dtype="<f4")
            self.t.assertEqual(w.size, TOTAL)
            self.t.assertTrue(np.isfinite(w).all(), "the model holds NaN or infinity")
            # 50 requests in one write: 50 replies, in order
            c.send_raw(b"".join(frame(pack({"t": T_HEARTBEAT, "id": 1000 + i})) for i in range(50)))
            ids = [c.recv_frame(REPLY_TIMEOUT).get("id") for _ in range(50)]
            self.t.assertEqual(ids, list(range(1000, 1050)))
            # a request dripped one byte at a time
            for b in frame(pack({"t": T_STATUS, "id": 2000})):
                c.send_raw(bytes([b]))
            r = c.recv_frame(REPLY_TIMEOUT)
            self.t.assertEqual((r.get("t"), r.get("id")), (T_STATUS_REPLY, 2000))
            self.alive(c, "after the bad messages")
        self.sample_rss()

    def layout_mismatch(self):
        other = harness.mlp_layout((128,))
        self.fatal(E_LAYOUT, "a smaller model",
                   obj={"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": other})
        transposed = [[n, list(reversed(d))] for n, d in LAYOUT]
        self.fatal(E_LAYOUT, "the same sizes, transposed",
                   obj={"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": transposed})
        renamed = [["x" + n, d] for n, d in LAYOUT]
        self.fatal(E_LAYOUT, "the same shapes, other names",
                   obj={"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [6, 8], "layout": renamed})
        self.sample_rss()

    def rogue_worker(self, shard=5, nshards=8):
        """Joins as a worker on a spare shard with the job's layout and pushes
        only gradients psd must refuse, so the model is never touched."""
        with RawClient(self.addr, REPLY_TIMEOUT) as c:
            r = c.hello_worker(LAYOUT, shard, nshards)
            self.t.assertEqual(r.get("t"), T_WELCOME, r)
            self.t.assertEqual(r.get("mode"), "asgd")
            self.t.assertEqual(r.get("params"), TOTAL)
            self.t.assertIs(r.get("init"), False, "the model already has its values")
            self.t.assertEqual(r.get("fp"), harness.layout_fingerprint(LAYOUT))
            base = r["ver"]
            g = np.zeros(TOTAL, dtype="<f4")
            g[TOTAL // 2] = np.nan
            self.error(c, E_NONFINITE, "a NaN gradient", {"t": T_PUSH, "id": 1, "base": base, "off": 0,
                                                         "data": g.tobytes()})
            self.alive(c, "after the NaN push")
            self.error(c, E_NONFINITE, "an infinite gradient chunk",
                       {"t": T_PUSH, "id": 2, "base": base, "off": 10, "data": floats([0, np.inf, 0, 0])})
            self.error(c, E_NONFINITE, "a NaN pushpull",
                       {"t": T_PUSHPULL, "id": 3, "base": base, "off": 0, "data": g.tobytes(), "poff": 0,
                        "plen": TOTAL})
            self.error(c, E_RANGE, "a push past the end",
                       {"t": T_PUSH, "id": 4, "base": base, "off": TOTAL, "data": floats([0, 0, 0, 0])})
            self.error(c, E_RANGE, "a push straddling the end",
                       {"t": T_PUSH, "id": 5, "base": base, "off": TOTAL - 2, "data": floats([0, 0, 0, 0])})
            self.error(c, E_RANGE, "a push at 2^63",
                       {"t": T_PUSH, "id": 6, "base": base, "off": 1 << 63, "data": floats([0])})
            self.error(c, E_RANGE, "an empty push", {"t": T_PUSH, "id": 7, "base": base, "off": 0, "data": b""})
            self.error(c, E_STATE, "an init of a model that has its values",
                       {"t": T_INIT, "id": 9, "off": 0, "data": floats([0.0])})
            self.error(c, E_BAD_FIELD, "a base version from the future",
                       {"t": T_PUSH, "id": 10, "base": 1 << 40, "off": 0, "data": floats([0.0])})
            self.error(c, E_STATE, "a second hello", {"t": T_HELLO, "id": 11, "v": PROTO_VERSION, "role": "admin"})
            # the same shard from a second connection
            self.fatal(E_SHARD, "a shard that is connected",
                       obj={"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "shard": [shard, nshards],
                            "layout": LAYOUT})
            # a report psd takes as it comes: odd numbers must not break psctl
            r = c.request({"t": T_REPORT, "epoch": 7, "loss": float("nan"), "acc": 2.5, "tloss": float("inf"),
                           "samples": 1 << 62, "rate": -1.0})
            self.t.assertEqual(r.get("t"), T_OK, r)
            self.alive(c, "rogue worker at the end")
            r = c.request({"t": T_BYE})
            self.t.assertEqual(r.get("t"), T_OK, r)
            self.t.assertEqual(c.expect_closed(REPLY_TIMEOUT), [], "psd closes after bye")
        self.sample_rss()

    def parked_pulls(self):
        """Pulls for a version that will never come wait in psd, but only so
        many per connection; closing the connection drops them."""
        with RawClient(self.addr, REPLY_TIMEOUT) as c:
            c.hello_admin()
            never = (1 << 64) - 1
            c.send_raw(b"".join(frame(pack({"t": T_PULL, "id": 100 + i, "off": 0, "len": TOTAL, "min": never}))
                                for i in range(80)))
            r = c.heartbeat()
            refused = 0
            while r.get("t") == T_ERROR:  # the refused pulls' errors come first
                expect_error(self.t, r, E_LIMIT, "too many parked pulls")
                self.errors[E_LIMIT] += 1
                refused += 1
                r = c.recv_frame(REPLY_TIMEOUT)
            self.t.assertEqual(r.get("t"), T_OK, r)
            # exactly the documented number was parked (PROTOCOL.md, PULL)
            with open(os.path.join(harness.ROOT, "proto", "PROTOCOL.md")) as f:
                m = re.search(r"may have at most (\d+) pulls parked at once", f.read())
            self.t.assertIsNotNone(m, "PROTOCOL.md does not give the limit of parked pulls per connection")
            self.t.assertEqual(80 - refused, int(m.group(1)), "pulls parked on one connection")
        self.sample_rss()

    def truncated_frames(self, conns=20):
        """Frames that never complete: the peer goes away mid-frame. Some
        declare 32 MiB after an admin hello, all at once."""
        with RawClient(self.addr, REPLY_TIMEOUT) as c:
            c.send_raw(struct.pack(">I", 1000) + pack({"t": T_HELLO})[:5] + b"\x00" * 300)
        clients = []
        try:
            for _ in range(conns):
                c = RawClient(self.addr, REPLY_TIMEOUT)
                clients.append(c)
                c.hello_admin()
                c.send_raw(struct.pack(">I", 32 << 20) + b"\x01" * 65536)
            # psd keeps serving while they hang
            with RawClient(self.addr, REPLY_TIMEOUT) as c:
                c.hello_admin()
                self.alive(c, "with %d frames pending" % conns)
            self.sample_rss()
        finally:
            for c in clients:
                c.close()

    def idle_connections(self, n=200):
        socks = []
        try:
            for _ in range(n):
                socks.append(socket.create_connection(("127.0.0.1", self.psd.port), timeout=REPLY_TIMEOUT))
            with RawClient(self.addr, REPLY_TIMEOUT) as c:
                c.hello_admin()
                self.alive(c, "with %d idle connections" % n)
            self.sample_rss()
        finally:
            for s in socks:
                s.close()


def _metrics_via(c):
    """Metrics text over an open admin connection (psctl would need a slot)."""
    r = c.request({"t": harness.T_METRICS})
    assert r.get("t") == harness.T_METRICS_REPLY, r
    return r["text"]


def rejected(addr):
    samples, _ = harness.parse_prometheus(harness.metrics(addr))
    return {code: harness.metric(samples, "psd_rejected_messages_total", reason=reason)
            for code, reason in harness.REASONS.items()}


class HostileTest(unittest.TestCase):
    def start_job(self, cl, mode):
        psd = cl.psd(mode=mode, workers=2, args=harness.ASGD_ARGS if mode == "asgd" else ())
        workers = [cl.worker(psd, k, 2, epochs=EPOCHS, batch=BATCH, limit=LIMIT, test_limit=TEST_LIMIT,
                             model=MODEL) for k in range(2)]

        def training():
            st = harness.status(psd.addr)
            ws = [w for w in st["workers"] if w["state"] == "connected" and w["pushes"] > 0]
            if st["initialized"] and len(ws) == 2:
                return st
            if not all(w.alive() for w in workers):
                raise AssertionError("a worker ended before the job was under way: %r" % st)
            return None

        harness.wait_until(training, 60, "both workers to be training")
        return psd, workers

    def finish_job(self, psd, workers, overlapped):
        results = [w.result(timeout=240) for w in workers]
        for k, (rc, summary) in enumerate(results):
            self.assertEqual(rc, 0, "worker %d failed:\n%s" % (k, workers[k].stderr()))
            self.assertIsNotNone(summary, "worker %d printed no JSON summary" % k)
            self.assertGreater(summary["test_accuracy"], MIN_ACCURACY,
                               "worker %d: test accuracy %.4f" % (k, summary["test_accuracy"]))
        if not overlapped:
            sys.stderr.write("note: the job ended before the attack did; psd was attacked while idle in part\n")
        return results

    def check_after(self, psd, attack, before):
        st = harness.status(psd.addr)  # psd still answers
        self.assertTrue(st["initialized"])
        text = harness.metrics(psd.addr)
        harness.parse_prometheus(text)
        harness.promtool_check(self, text)
        after = rejected(psd.addr)
        for code, n in sorted(attack.errors.items()):
            self.assertIn(code, harness.REASONS, "unexpected error code %s" % code)
            self.assertGreaterEqual(after[code] - before[code], n,
                                    "psd_rejected_messages_total{reason=\"%s\"} rose by %d, but psd sent %d "
                                    "such errors" % (harness.REASONS[code], after[code] - before[code], n))
        growth = attack.rss_max - attack.rss_before
        self.assertLess(growth, RSS_SLACK_KB, "psd's RSS grew by %d KiB during the attack" % growth)
        sys.stderr.write("%s: errors by code %s; RSS %d -> max %d KiB\n" %
                         (self.id(), dict(sorted(attack.errors.items())), attack.rss_before, attack.rss_max))

    def test_asgd_job_under_attack(self):
        with harness.Cluster("psd-hostile-asgd") as cl:
            psd, workers = self.start_job(cl, "asgd")
            before = rejected(psd.addr)
            attack = Attack(self, psd)
            with RawClient(psd.addr, REPLY_TIMEOUT) as watcher:
                watcher.hello_admin()
                attack.random_bytes()
                attack.bad_lengths()
                attack.wrong_shape_before_hello()
                attack.wrong_shape_after_hello()
                attack.layout_mismatch()
                attack.rogue_worker()
                attack.parked_pulls()
                attack.truncated_frames()
                attack.idle_connections()
                attack.alive(watcher, "a connection opened before the attack")
            overlapped = any(w.alive() for w in workers)
            self.finish_job(psd, workers, overlapped)
            for code in (E_MALFORMED, E_TOO_BIG, E_UNSUPPORTED, E_BAD_TYPE, E_BAD_FIELD, E_STATE, E_LAYOUT,
                         E_RANGE, E_NONFINITE, E_SHARD, E_FORBIDDEN, E_LIMIT):
                self.assertGreater(attack.errors[code], 0, "reason %s was exercised" % harness.REASONS[code])
            self.check_after(psd, attack, before)
            st = harness.status(psd.addr)
            rogue = [w for w in st["workers"] if w["shard"] == 5]
            self.assertEqual(len(rogue), 1, st["workers"])
            self.assertEqual(rogue[0]["pushes"], 0, "no rogue push was applied")
            self.assertIsNone(rogue[0]["loss"], "a NaN loss shows as null in JSON")
            steps = harness.steps_per_epoch(LIMIT, 2, BATCH, bsp=False)
            self.assertEqual(st["version"], sum(steps) * EPOCHS, "only the real workers' pushes were applied")
            psd.stop()

    def test_bsp_job_under_attack(self):
        """BSP rounds need every worker: attacks that do not join must not
        disturb them, and a would-be worker with the wrong shard count or a
        taken shard is refused."""
        with harness.Cluster("psd-hostile-bsp") as cl:
            psd, workers = self.start_job(cl, "bsp")
            before = rejected(psd.addr)
            attack = Attack(self, psd)
            attack.random_bytes(rounds=30)
            attack.bad_lengths()
            attack.wrong_shape_before_hello()
            attack.wrong_shape_after_hello()
            hello = {"t": T_HELLO, "v": PROTO_VERSION, "role": "worker", "layout": LAYOUT}
            attack.fatal(E_SHARD, "a third shard in a job of 2", obj=dict(hello, shard=[2, 3]))
            attack.fatal(E_SHARD, "shard 0/2, which is connected", obj=dict(hello, shard=[0, 2]))
            attack.truncated_frames(conns=5)
            overlapped = any(w.alive() for w in workers)
            results = self.finish_job(psd, workers, overlapped)
            rounds = harness.steps_per_epoch(LIMIT, 2, BATCH, bsp=True) * EPOCHS
            self.assertEqual([s["version"] for _, s in results], [rounds, rounds])
            self.check_after(psd, attack, before)
            st = harness.status(psd.addr)
            self.assertEqual((st["version"], st["rounds"]), (rounds, rounds))
            self.assertEqual(sorted(w["shard"] for w in st["workers"]), [0, 1])
            psd.stop()

    def test_connection_limit(self):
        """Past max_connections a new connection gets ERROR LIMIT and is
        closed; the ones already open keep working, and a slot freed can be
        used again."""
        limit = 6
        with harness.Cluster("psd-hostile-limit") as cl:
            psd = cl.psd(args=("--set", "max_connections=%d" % limit))
            clients = []

            def admitted():
                """A new admin connection, or None when psd refused it (a
                connection closed just before may still hold its slot)."""
                c = RawClient(psd.addr, REPLY_TIMEOUT)
                try:
                    r = c.request({"t": T_HELLO, "v": PROTO_VERSION, "role": "admin"})
                    if r.get("t") == T_WELCOME:
                        return c
                    expect_error(self, r, E_LIMIT, "a refused connection")
                except harness.Closed:
                    pass
                c.close()
                return None

            try:
                for i in range(limit):
                    clients.append(harness.wait_until(admitted, 10, "connection %d of %d" % (i + 1, limit)))
                for extra in range(3):
                    with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                        frames = c.expect_closed(REPLY_TIMEOUT)
                        self.assertEqual(len(frames), 1, frames)
                        expect_error(self, frames[0], E_LIMIT, "connection %d of %d" % (limit + 1 + extra, limit))
                self.assertEqual(clients[0].heartbeat().get("t"), T_OK)
                clients.pop().close()
                clients.append(harness.wait_until(admitted, 10, "a freed connection slot to be usable"))
                samples, _ = harness.parse_prometheus(_metrics_via(clients[0]))
                self.assertGreaterEqual(harness.metric(samples, "psd_rejected_messages_total", reason="limit"), 3)
            finally:
                for c in clients:
                    c.close()
            psd.stop()

    def test_bad_frames_close_the_connection_and_are_not_all_logged(self):
        """A client that sends five-byte bad frames in a loop gets an ERROR
        for each up to the documented number of protocol errors, then psd
        closes the connection; its log holds a bounded number of lines for
        it, saying how many were left out (issue 15, 7)."""
        with open(os.path.join(harness.ROOT, "proto", "PROTOCOL.md")) as f:
            m = re.search(r"after (\d+) protocol errors", f.read())
        self.assertIsNotNone(m, "PROTOCOL.md does not say after how many protocol errors psd closes")
        most = int(m.group(1))
        with harness.Cluster("psd-hostile-errors") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                c.hello_admin()
                c.send_raw(frame(b"\xc1") * (3 * most))
                frames = c.expect_closed(REPLY_TIMEOUT)
            self.assertEqual(len(frames), most, "ERROR replies before psd closed the connection")
            self.assertTrue(all(f.get("code") == E_MALFORMED for f in frames), frames[:3])
            harness.wait_until(lambda: "too many protocol errors" in psd.stderr(), 10,
                               "psd to log why it closed the connection")
            lines = [ln for ln in psd.stderr().splitlines() if "MALFORMED" in ln]
            self.assertLess(len(lines), 20, "psd logged %d lines for %d bad frames" % (len(lines), most))
            self.assertRegex(psd.stderr(), r"\d+ more errors on this connection not logged")
            # and psd serves on
            self.assertTrue(harness.status(psd.addr)["version"] == 0)
            psd.stop()

    def test_unfinished_frames_are_bounded_in_total(self):
        """Connections that each announce a big frame and send all but its
        last byte pin a receive buffer each; together they may hold at most
        max_receive_memory: the connection that would pass it gets LIMIT and
        is closed, the others are untouched, and psd serves on (issue 15, 5)."""
        with harness.Cluster("psd-hostile-frames") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "max_receive_memory=8M", "--set", "max_frame=4M"))
            rss0 = psd.rss_kb()
            size = 3 << 20
            body = b"\x81\xa1t\x05" + b"\x00" * (size - 4)  # never completed
            held, refused = [], []
            for i in range(4):
                c = RawClient(psd.addr, REPLY_TIMEOUT)
                c.hello_admin()
                c.send_raw(struct.pack(">I", size) + body[:-1])
                held.append(c)
            # each hello's reply was read; what psd says now is about the frames
            for i, c in enumerate(held):
                try:
                    frames = c.expect_closed(1.0)
                except socket.timeout:
                    continue  # still open: its frame is held
                refused.append(i)
                self.assertEqual([f.get("code") for f in frames], [E_LIMIT], frames)
                self.assertIn("max_receive_memory", frames[0].get("text", ""))
            self.assertEqual(refused, [2, 3], "connections refused for their unfinished frames")
            growth = psd.rss_kb() - rss0
            self.assertLess(growth, 8 * 1024 + RSS_SLACK_KB, "psd's RSS grew by %d KiB" % growth)
            self.assertIn("version", harness.status(psd.addr))
            for c in held:
                c.close()
            # the memory is free again once they are gone
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                c.hello_admin()
                c.send_raw(struct.pack(">I", size) + body[:-1])
                with self.assertRaises(socket.timeout):
                    c.expect_closed(1.0)
            psd.stop()

    def test_silent_connections_cannot_keep_workers_out(self):
        """Connections that never say hello hold at most max_handshakes
        slots: past it the oldest is closed with LIMIT, so with every
        connection slot once taken by silent ones a worker still joins
        (issue 15, 6)."""
        with harness.Cluster("psd-hostile-handshakes") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "max_connections=10", "--set", "max_handshakes=3"))
            silent = []
            try:
                for i in range(10):
                    c = RawClient(psd.addr, REPLY_TIMEOUT)
                    silent.append(c)  # accepted in the order they connect
                # the oldest seven were closed to make room, with LIMIT
                for i, c in enumerate(silent[:7]):
                    frames = c.expect_closed(REPLY_TIMEOUT)
                    self.assertEqual([f.get("code") for f in frames], [E_LIMIT], "silent connection %d" % i)
                    self.assertIn("max_handshakes", frames[0].get("text", ""))
                # a worker joins and works
                with RawClient(psd.addr, REPLY_TIMEOUT) as w:
                    r = w.hello_worker(LAYOUT, 0, 1)
                    self.assertEqual(r.get("t"), T_WELCOME, r)
                    self.assertEqual(w.heartbeat().get("t"), T_OK)
            finally:
                for c in silent:
                    c.close()
            psd.stop()

    def test_a_hello_without_init_leaves_nothing(self):
        """A hello proposes the layout but takes no memory, and a client
        that leaves before INIT leaves nothing: psd's RSS does not grow and
        the next worker may bring another layout (issue 15, 4)."""
        with harness.Cluster("psd-hostile-noinit") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            rss0 = psd.rss_kb()
            with RawClient(psd.addr, 60) as c:
                r = c.hello_worker([["w", [1 << 26]]], 0, 1)  # 256 MiB of parameters
                self.assertEqual(r.get("t"), T_WELCOME, r)
                self.assertIs(r.get("init"), True, r)
                growth = psd.rss_kb() - rss0
                self.assertLess(growth, RSS_SLACK_KB, "psd's RSS grew by %d KiB after a hello" % growth)
                self.assertEqual(c.request({"t": harness.T_BYE}).get("t"), T_OK)
            harness.wait_until(lambda: "is released" in psd.stderr(), 10, "psd to release the layout")
            with RawClient(psd.addr, REPLY_TIMEOUT) as c:
                r = c.hello_worker(LAYOUT, 0, 1)
                self.assertEqual(r.get("t"), T_WELCOME, "a worker with another layout: %r" % r)
                self.assertIs(r.get("init"), True, r)
            psd.stop()

    def test_http_request_on_the_protocol_port(self):
        """A browser or curl pointed at psd's protocol port gets an HTTP
        answer saying what the port is and where the metrics are, and psd
        logs the same (it used to log TOO_BIG: frame length 1195725856)."""
        def ask(psd):
            host, port = psd.addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=REPLY_TIMEOUT) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                data = b""
                while True:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return data.decode()
                    data += chunk

        with harness.Cluster("psd-hostile-http") as cl:
            psd = cl.psd(mode="asgd", workers=1, args=("--set", "metrics_listen=127.0.0.1:0"))
            metrics = harness.status(psd.addr)["metrics_listen"]
            text = ask(psd)
            self.assertTrue(text.startswith("HTTP/1.0 400"), text)
            self.assertIn("protocol port", text)
            self.assertIn("http://%s/metrics" % metrics, text)
            harness.wait_until(lambda: "an HTTP request on the protocol port" in psd.stderr(), 10, "psd's log line")
            self.assertNotIn("1195725856", psd.stderr())
            psd.stop()
            psd = cl.psd(mode="asgd", workers=1, name="psd-nometrics")
            text = ask(psd)
            self.assertIn("set metrics_listen", text)
            self.assertIn("version", harness.status(psd.addr))
            psd.stop()

    def test_first_hello_cannot_make_psd_allocate_a_huge_model(self):
        """The first worker's hello fixes the layout, and psd allocates the
        whole model (plus the momentum buffer) for it at once, so a
        100-byte hello could ask for up to 2^34 floats (64 GiB). psd refuses
        a model over max_params (default 2^30) with a LIMIT error, and its
        RSS does not jump. Here: 2^31 floats (8 GiB)."""
        with harness.Cluster("psd-hostile-huge") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            rss0 = psd.rss_kb()
            with RawClient(psd.addr, 60) as c:
                r = c.hello_worker([["w", [1 << 31]]], 0, 1)
                growth = psd.rss_kb() - rss0
                c.close()
            try:
                self.assertEqual(r.get("t"), T_ERROR, "psd accepted an 8 GiB model from one hello")
                self.assertEqual(r.get("code"), harness.E_LIMIT)
                self.assertLess(growth, RSS_SLACK_KB, "psd's RSS grew by %d KiB after one hello" % growth)
            finally:
                psd.stop()


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
