#!/usr/bin/python3
"""test_tables.py - embedding tables on the wire (proto/PROTOCOL.md, section 13).

Raw clients, written from the protocol with Python's msgpack, against the
real psd:

- Bad table messages are refused by the decoder with the code section 13
  gives, and the connection goes on: "keys" of a length that is no multiple
  of 8, empty, or over 65,536 keys (BAD_FIELD); an unknown or repeated
  hyper-parameter, or one that is no number (BAD_FIELD); a TPUSHPULL
  without "pkeys" (BAD_FIELD); bfloat16 rows or "rdt" other than 0
  (UNSUPPORTED); more than 2^22 row values in one message (BAD_FIELD); a
  ROWS from a client (BAD_TYPE).
- This psd decodes well-formed TABLE, TPULL, TPUSH and TPUSHPULL but does
  not serve tables yet: each gets UNSUPPORTED naming that, from a worker and
  from an admin, the connection stays usable and the dense model is
  untouched (a pull after them returns the values of before).
"""

import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import (E_BAD_FIELD, E_BAD_TYPE, E_UNSUPPORTED, T_INIT, T_OK, T_PARAMS, T_PULL, T_ROWS,  # noqa: E402
                     T_TABLE, T_TPULL, T_TPUSH, T_TPUSHPULL, RawClient, expect_error)

LAYOUT = [["w", [4]]]
TIMEOUT = 10.0


def keys(*k):
    return struct.pack("<%dQ" % len(k), *k)


def floats(*v):
    return struct.pack("<%df" % len(v), *v)


TABLE = {"t": T_TABLE, "tab": "user_id", "dim": 2, "rinit": "uniform", "scale": 0.05, "seed": 7,
         "opt": "adagrad", "hp": {"lr": 0.05}}


class TablesOnTheWire(unittest.TestCase):
    def alive(self, c, values, what):
        """The connection still works and the dense model is as it was."""
        r = c.request({"t": T_PULL, "off": 0, "len": 4})
        self.assertEqual(r.get("t"), T_PARAMS, "%s: %r" % (what, r))
        self.assertEqual(struct.unpack("<4f", r["data"]), values, what)

    def refused(self, c, code, msg, what, needle):
        r = c.request(msg)
        expect_error(self, r, code, what)
        self.assertIn(needle, r["text"], what)

    def test_bad_input_and_not_served(self):
        with harness.Cluster("test-tables") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            with RawClient(psd.addr, TIMEOUT) as w:
                r = w.hello_worker(LAYOUT, 0, 1)
                self.assertEqual(r.get("t"), harness.T_WELCOME, r)
                values = (0.5, -1.0, 2.0, 0.25)
                r = w.request({"t": T_INIT, "off": 0, "data": floats(*values)})
                self.assertEqual(r.get("t"), T_OK, r)

                bad = [
                    (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b"\0" * 12}, "12-byte keys",
                     "'keys' must be a bin of 1..65536 little-endian uint64 keys"),
                    (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b""}, "no keys", "'keys' must be a bin"),
                    (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": b"\0" * 8 * 65537}, "65537 keys",
                     "65537 keys, more than 65536"),
                    (E_BAD_FIELD, {"t": T_TPULL, "tab": "user_id", "keys": "12345678"}, "keys as a str",
                     "'keys' must be a bin"),
                    (E_BAD_FIELD, dict(TABLE, hp={"momentum": 0.9}), "unknown hp", "unknown hyper-parameter"),
                    (E_BAD_FIELD, dict(TABLE, hp={"lr": "0.1"}), "hp a str", "hp 'lr' must be a finite number"),
                    (E_BAD_FIELD, dict(TABLE, hp={"lr": float("nan")}), "hp NaN", "hp 'lr' must be a finite number"),
                    (E_BAD_FIELD, {k: v for k, v in TABLE.items() if k != "opt"}, "table without opt",
                     "table: missing field 'opt'"),
                    (E_BAD_FIELD, {"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(1), "base": 0,
                                   "data": floats(1, 2)}, "tpushpull without pkeys", "missing field 'pkeys'"),
                    (E_UNSUPPORTED, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1), "base": 0, "dt": 1,
                                     "data": b"\x80\x3f\x00\x40"}, "bf16 rows", "float32 only"),
                    (E_UNSUPPORTED, {"t": T_TPULL, "tab": "user_id", "keys": keys(1), "rdt": 3}, "rdt 3",
                     "float32 only"),
                    (E_BAD_FIELD, {"t": T_TPUSH, "tab": "user_id", "keys": keys(1), "base": 0,
                                   "data": b"\0" * 4 * ((1 << 22) + 1)}, "2^22 + 1 values",
                     "4194305 row values in one message"),
                    (E_BAD_TYPE, {"t": T_ROWS, "ver": 0, "data": floats(1)}, "rows from a client", "rows"),
                ]
                for code, msg, what, needle in bad:
                    self.refused(w, code, msg, what, needle)
                    self.alive(w, values, "after " + what)

                # well formed: not served yet
                for msg in (TABLE, {"t": T_TPULL, "tab": "user_id", "keys": keys(1, 2)},
                            {"t": T_TPUSH, "tab": "user_id", "keys": keys(1), "base": 0, "data": floats(1, 2)},
                            {"t": T_TPUSHPULL, "tab": "user_id", "keys": keys(1), "base": 0, "data": floats(1, 2),
                             "pkeys": keys(3)}):
                    what = "type %d" % msg["t"]
                    self.refused(w, E_UNSUPPORTED, msg, what, "tables are not served by this psd yet")
                    self.alive(w, values, "after " + what)
            with RawClient(psd.addr, TIMEOUT) as a:
                a.hello_admin()
                self.refused(a, E_UNSUPPORTED, {"t": T_TPULL, "tab": "user_id", "keys": keys(9)}, "admin tpull",
                             "tables are not served by this psd yet")
                self.alive(a, values, "admin after a tpull")


if __name__ == "__main__":
    harness.parse_args()
    unittest.main()
