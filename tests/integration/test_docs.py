#!/usr/bin/python3
"""test_docs.py - the documentation says what the programs do.

- README.md's configuration reference is exactly `psd --config-reference`
  (the option table in server/config.c), so no key, default or meaning can
  drift;
- every metric family psd exports appears in README.md's metrics table;
- every key of the option table appears in conf/psd.conf with its default
  (the unit test test_config checks the same from C; this checks the file a
  user reads against the binary a user runs);
- every place psd answers LIMIT is named in PROTOCOL.md's row for LIMIT.
"""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def readme():
    with open(os.path.join(harness.ROOT, "README.md")) as f:
        return f.read()


class DocsTest(unittest.TestCase):
    def test_config_reference_matches(self):
        r = harness.run([harness.Paths.psd, "--config-reference"])
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.search(r"<!-- config-reference:begin -->\n(.*?)<!-- config-reference:end -->", readme(), re.S)
        self.assertIsNotNone(m, "README.md lacks the config-reference markers")
        self.assertEqual(m.group(1), r.stdout,
                         "README.md's configuration reference differs from `psd --config-reference`; "
                         "paste the program's output between the markers")

    def test_conf_file_documents_every_key(self):
        r = harness.run([harness.Paths.psd, "--config-reference"])
        with open(os.path.join(harness.ROOT, "conf", "psd.conf")) as f:
            conf = f.read()
        rows = re.findall(r"^\| `([a-z_0-9]+)` \| `([^`]*)` \|", r.stdout, re.M)
        self.assertGreater(len(rows), 10)
        for key, default in rows:
            default = "" if default == "(empty)" else default
            self.assertRegex(conf, r"(?m)^# %s =%s$" % (re.escape(key), (" " + re.escape(default)) if default else ""),
                             "conf/psd.conf lacks '# %s = %s'" % (key, default))

    def test_every_limit_is_documented(self):
        """Each server file that answers LIMIT has its cause in PROTOCOL.md's
        error table; a new use fails here until it is documented."""
        causes = {"net.c": "max_connections", "hello.c": "max_params", "pull.c": "parked pull"}
        also = ["max_receive_memory", "max_handshakes"]  # net.c's other LIMITs
        server = os.path.join(harness.ROOT, "server")
        users = set()
        for top, _, names in os.walk(server):
            for name in sorted(names):
                if name.endswith(".c"):
                    with open(os.path.join(top, name)) as f:
                        if "PS_ELIMIT" in f.read():
                            users.add(name)
        self.assertEqual(users, set(causes), "files answering LIMIT: document the new ones in PROTOCOL.md")
        with open(os.path.join(harness.ROOT, "proto", "PROTOCOL.md")) as f:
            row = re.search(r"^\| 16 \| LIMIT \|.*$", f.read(), re.M)
        self.assertIsNotNone(row)
        for cause in list(causes.values()) + also:
            self.assertIn(cause, row.group(0), "LIMIT for %s is not in PROTOCOL.md's error table" % cause)

    def test_metrics_are_documented(self):
        with harness.Cluster("psd-docs") as cl:
            psd = cl.psd(mode="bsp", workers=1)
            _, types = harness.parse_prometheus(harness.metrics(psd.addr))
            psd.stop()
        text = readme()
        for fam in types:
            self.assertIn("`%s" % fam, text, "metric %s is not in README.md's metrics table" % fam)


if __name__ == "__main__":
    harness.parse_args()
    unittest.main(verbosity=2)
