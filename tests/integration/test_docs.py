#!/usr/bin/python3
"""test_docs.py - the documentation says what the programs do, and holds together.

- docs/configuration.md's reference is exactly `psd --config-reference`
  (the option table in server/config/config.c), and lists every key
  `psd --print-config` prints, so no key, default or meaning can drift;
- every metric family psd exports appears in docs/metrics.md's table;
- every key of the option table appears in conf/psd.conf with its default
  (the unit test test_config checks the same from C; this checks the file a
  user reads against the binary a user runs);
- every place psd answers LIMIT is named in PROTOCOL.md's row for LIMIT;
- every range of message types PROTOCOL.md gives ("outside 1..N is
  BAD_TYPE") ends at the last type of proto/messages.def, and psd answers
  type N otherwise than type N + 1 (BAD_TYPE);
- PROTOCOL.md section 5's table of message types (number, name, sender,
  required fields) is proto/messages.def, the one declaration of them.
- every relative link in README.md, CONTRIBUTING.md and docs/*.md resolves:
  the file exists and a #anchor names a heading of it (GitHub's rule for
  heading anchors); the checker is itself tested on planted broken links;
- README.md is a guide (at most 300 lines) that links every page of docs/.
"""

import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def read(*path):
    with open(os.path.join(harness.ROOT, *path)) as f:
        return f.read()


README_MAX_LINES = 300
CONFIG_PAGE = os.path.join("docs", "configuration.md")
METRICS_PAGE = os.path.join("docs", "metrics.md")


def doc_files(root):
    """The documents whose links must resolve: README.md, CONTRIBUTING.md
    and every .md in docs/, as paths relative to root."""
    names = ["README.md", "CONTRIBUTING.md"]
    docs = os.path.join(root, "docs")
    names += [os.path.join("docs", n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return [n for n in names if os.path.exists(os.path.join(root, n))]


FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def strip_code(text):
    """text without fenced blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading, seen):
    """GitHub's anchor for a heading: the rendered text in lower case, every
    character but letters, digits, spaces, hyphens and underscores dropped,
    spaces made hyphens; a repeated anchor gets -1, -2, ..."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    base = "".join(ch for ch in text if ch.isalnum() or ch in " -_").replace(" ", "-")
    n = seen.get(base, 0)
    seen[base] = n + 1
    return base if n == 0 else "%s-%d" % (base, n)


def anchors(text):
    seen = {}
    found = {slug(m.group(2), seen) for m in HEADING.finditer(FENCE.sub("", text))}
    return found | set(EXPLICIT_ANCHOR.findall(text))


def broken_links(root, names):
    """Every relative link of the named documents (paths relative to root)
    that does not resolve, as 'doc: target (why)' strings."""
    bad = []
    cache = {}
    for name in names:
        with open(os.path.join(root, name)) as f:
            text = f.read()
        for m in LINK.finditer(strip_code(text)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):    # http:, https:, mailto:
                continue
            path, _, frag = target.partition("#")
            full = os.path.normpath(os.path.join(root, os.path.dirname(name), path)) if path \
                else os.path.join(root, name)
            if not os.path.exists(full):
                bad.append("%s: %s (no such file)" % (name, target))
                continue
            if frag and full.endswith(".md"):
                if full not in cache:
                    with open(full) as f:
                        cache[full] = anchors(f.read())
                if frag not in cache[full]:
                    bad.append("%s: %s (no heading with anchor #%s)" % (name, target, frag))
    return bad


class DocsTest(unittest.TestCase):
    def test_config_reference_matches(self):
        r = harness.run([harness.Paths.psd, "--config-reference"])
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.search(r"<!-- config-reference:begin -->\n(.*?)<!-- config-reference:end -->", read(CONFIG_PAGE), re.S)
        self.assertIsNotNone(m, "%s lacks the config-reference markers" % CONFIG_PAGE)
        self.assertEqual(m.group(1), r.stdout,
                         "%s's configuration reference differs from `psd --config-reference`; "
                         "paste the program's output between the markers" % CONFIG_PAGE)

    def test_config_reference_has_every_printed_key(self):
        """`psd --print-config` prints the settings psd runs with; each of its
        keys has a row in the reference, and no row names a key it lacks."""
        r = harness.run([harness.Paths.psd, "--print-config"])
        self.assertEqual(r.returncode, 0, r.stderr)
        printed = re.findall(r"^([a-z_0-9]+) =", r.stdout, re.M)
        self.assertGreater(len(printed), 10, r.stdout)
        rows = re.findall(r"^\| `([a-z_0-9]+)` \|", read(CONFIG_PAGE), re.M)
        self.assertEqual(sorted(printed), sorted(rows),
                         "keys of `psd --print-config` and of %s's table differ" % CONFIG_PAGE)

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

    def test_message_type_range(self):
        # proto/messages.def declares the types, 1..N (msg.h's PS_MSG_TYPE_MAX)
        types = harness.MESSAGE_TYPES
        last = max(t for _, _, t, _, _ in types)
        self.assertEqual(sorted(t for _, _, t, _, _ in types), list(range(1, last + 1)))
        # the highest type psd receives (ROWS, the last, only psd sends)
        received = max(t for _, _, t, d, _ in types if d != "S")
        with open(os.path.join(harness.ROOT, "proto", "PROTOCOL.md")) as f:
            doc = f.read()
        ranges = re.findall(r"(?:type|`t`)[^\n|]{0,40}?\b1\.\.(\d+)", doc)
        self.assertGreaterEqual(len(ranges), 3, "sections 3, 4 and 10 give the range of types")
        self.assertEqual(set(int(n) for n in ranges), {last}, "PROTOCOL.md's message type ranges")
        with harness.Cluster("psd-docs-types") as cl:
            psd = cl.psd(mode="asgd", workers=1)
            with harness.RawClient(psd.addr, 10.0) as c:
                self.assertEqual(c.hello_worker([["w", [4]]], 0, 1).get("t"), harness.T_WELCOME)
                r = c.request({"t": last + 1, "id": 1})
                harness.expect_error(self, r, harness.E_BAD_TYPE, "type %d" % (last + 1))
                r = c.request({"t": received, "id": 2, "ver": 0})
                self.assertNotEqual(r.get("code"), harness.E_BAD_TYPE, "type %d: %r" % (received, r))
            psd.stop()

    def test_message_table_is_the_declaration(self):
        """PROTOCOL.md section 5's table of message types (t, name, who
        sends it, required fields) says what proto/messages.def declares,
        from which the decoder, psd's dispatch, the fuzz checks and the
        harness's numbers follow."""
        keys = dict((bit, key) for key, bit in re.findall(r'"(\w+)", (PS_F2?_\w+),', read("proto", "msg.c")))
        self.assertIn("PS_F_VERSION", keys)
        doc = read("proto", "PROTOCOL.md")
        section = doc[doc.index("## 5. Message types"):doc.index("### HELLO (1)")]
        rows = re.findall(r"^\| (\d+) \| (\w+) \| ([CWAS]) → ([CWAS]) \| ([^|]*) \|", section, re.M)
        self.assertGreaterEqual(len(rows), 25, "section 5's table")
        dirs = {"C": "S", "W": "S", "A": "S", "S": "C"}
        documented = {}
        for t, name, frm, to, req in rows:
            self.assertEqual(to, dirs[frm], "type %s: %s → %s" % (t, frm, to))
            # the fields before a ';' (what follows depends on the values)
            fields = sorted(re.findall(r"`(\w+)`", req.split(";")[0]))
            documented[int(t)] = (name, frm, fields)
        declared = {t: (NAME, d, sorted(keys[r] for r in req)) for NAME, _, t, d, req in harness.MESSAGE_TYPES}
        self.assertEqual(documented, declared, "PROTOCOL.md section 5 and proto/messages.def differ")

    def test_every_limit_is_documented(self):
        """Each server file that answers LIMIT has its cause in PROTOCOL.md's
        error table; a new use fails here until it is documented."""
        causes = {"net.c": "max_connections", "hello.c": "max_params", "pull.c": "parked pull",
                  "table.c": "a 65th table", "repl.c": "a ninth follower", "bounds.c": "2,684,354,561st row", "bsp.c": "max_table_memory",
                  "table_move.c": "rows moving to a part"}
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
        text = read(METRICS_PAGE)
        for fam in types:
            self.assertIn("`%s" % fam, text, "metric %s is not in %s's metrics table" % (fam, METRICS_PAGE))


class LinksTest(unittest.TestCase):
    def test_every_relative_link_resolves(self):
        names = doc_files(harness.ROOT)
        self.assertIn("README.md", names)
        self.assertGreater(len(names), 5, names)
        self.assertEqual(broken_links(harness.ROOT, names), [])

    def test_checker_finds_planted_broken_links(self):
        """The checker on a small tree with good links (a file, a heading with
        punctuation, a repeated heading, code and web links it must skip) and
        broken ones (a missing file or image, a missing anchor here and there,
        a repeat too many), so a checker that passes everything fails here."""
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "docs"))
            with open(os.path.join(root, "README.md"), "w") as f:
                f.write("# Top\n\n[ok](docs/a.md#what-the-links-cost-benchmultihostpy) [ok](#top)\n"
                        "[gone](docs/missing.md) [bad anchor](docs/a.md#nowhere) [self](#b-c)\n"
                        "`[in code](docs/none.md)`\n\n```\n[fenced](docs/none.md)\n```\n"
                        "[web](https://example.org/x) ![img](docs/a.png)\n")
            with open(os.path.join(root, "docs", "a.md"), "w") as f:
                f.write("# A\n\n## What the links cost (bench/multihost.py)\n\n## A\n\n[up](../README.md#top) "
                        "[dup](#a-1) [dup2](#a-2)\n")
            bad = broken_links(root, doc_files(root))
            self.assertEqual(sorted(bad), sorted([
                "README.md: docs/missing.md (no such file)",
                "README.md: docs/a.md#nowhere (no heading with anchor #nowhere)",
                "README.md: #b-c (no heading with anchor #b-c)",
                "README.md: docs/a.png (no such file)",
                "docs/a.md: #a-2 (no heading with anchor #a-2)"]))

    def test_readme_is_a_guide_linking_every_page(self):
        text = read("README.md")
        self.assertLessEqual(len(text.splitlines()), README_MAX_LINES,
                             "README.md is a guide; move reference and history to docs/ or bench/README.md")
        linked = {os.path.normpath(m.group(1).partition("#")[0]) for m in LINK.finditer(strip_code(text))}
        for name in doc_files(harness.ROOT):
            if name.startswith("docs" + os.sep):
                self.assertIn(name, linked, "README.md does not link %s" % name)
        for cmd in ("scripts/run-mnist.sh", "scripts/test.sh"):
            self.assertIn(cmd, text)


if __name__ == "__main__":
    harness.parse_args()
    harness.main(verbosity=2)
