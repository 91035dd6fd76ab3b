#!/usr/bin/python3
"""test_deps.py - calls and includes outside psd go one way.

(psd's own layers have the `layers` test.) This one reads the source:

- proto/ is the bottom of the tree: its files include no header of another
  folder (common/ builds on proto/, not the other way round), and the
  psproto library refers to no ps_ function it does not define (nm).
- common/ includes only common/ and proto/ headers.
- In psctl/, worker/, bench/, client/, common/ and proto/ no two files call
  each other's functions: a file's functions are called by the files above
  it, never by those it calls (client/internal.h lists its files bottom to
  top).
"""

import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = None

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# a function defined at the start of a line: "type name(args)" then "{"
DEFINE = re.compile(r'^(?!static\b)[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\([^;{]*?\)\s*\{', re.M)
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def sources(folder, exts=(".c", ".h")):
    d = os.path.join(ROOT, folder)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(exts))


def read(path):
    with open(path) as f:
        return f.read()


def code(path):
    """The text of path without comments and string literals."""
    return STRING.sub('""', COMMENT.sub(" ", read(path)))


def mutual_calls(folder):
    """Pairs of .c files of folder that call each other's functions."""
    files = sources(folder, (".c",))
    text = {f: code(f) for f in files}
    defined = {f: set(DEFINE.findall(t)) - {"main"} for f, t in text.items()}
    uses = {}
    for f in files:
        uses[f] = set()
        for g in files:
            if g != f and any(re.search(r"\b%s\s*\(" % re.escape(n), text[f]) for n in defined[g]):
                uses[f].add(g)
    pairs = []
    for f in files:
        for g in uses[f]:
            if f < g and f in uses[g]:
                pairs.append((os.path.relpath(f, ROOT), os.path.relpath(g, ROOT)))
    return pairs


class DepsTest(unittest.TestCase):
    def test_proto_includes_only_proto(self):
        for f in sources("proto"):
            for inc in INCLUDE.findall(read(f)):
                self.assertTrue("/" not in inc or inc.startswith("proto/"),
                                "%s includes %s: proto/ is the bottom, it includes no other folder"
                                % (os.path.relpath(f, ROOT), inc))

    def test_common_includes_common_and_proto(self):
        for f in sources("common"):
            for inc in INCLUDE.findall(read(f)):
                self.assertTrue("/" not in inc or inc.startswith(("common/", "proto/")),
                                "%s includes %s" % (os.path.relpath(f, ROOT), inc))

    def test_psproto_is_whole(self):
        lib = os.path.join(BUILD, "proto", "libpsproto.a")
        if not os.path.exists(lib):
            self.skipTest("no %s" % lib)

        def names(*flags):
            out = subprocess.run(["nm", *flags, lib], capture_output=True, text=True, check=True).stdout
            return {line.split()[-1] for line in out.splitlines() if line.strip() and not line.endswith(":")
                    and len(line.split()) >= 2}
        undefined = {n for n in names("-u") if n.startswith("ps_")}
        missing = undefined - names("--defined-only")
        self.assertEqual(missing, set(), "psproto refers to functions of another folder")

    def test_no_two_files_call_each_other(self):
        for folder in ("proto", "common", "psctl", "worker", "bench", "client"):
            self.assertEqual(mutual_calls(folder), [], folder)

    def test_the_check_sees_a_loop(self):
        # the stop signals called back into main's file would be seen
        import tempfile
        global ROOT
        saved = ROOT
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "w"))
            with open(os.path.join(d, "w", "a.c"), "w") as f:
                f.write("int pw_stop(int x)\n{\n    return pw_train(x);\n}\n")
            with open(os.path.join(d, "w", "b.c"), "w") as f:
                f.write("/* pw_stop( in a comment */\nint pw_train(int x)\n{\n    return x;\n}\n")
            ROOT = d
            try:
                self.assertEqual(mutual_calls("w"), [])
                with open(os.path.join(d, "w", "b.c"), "a") as f:
                    f.write("int pw_loop(int x)\n{\n    return pw_stop(x);\n}\n")
                self.assertEqual(mutual_calls("w"), [("w/a.c", "w/b.c")])
            finally:
                ROOT = saved


if __name__ == "__main__":
    args = [a for a in sys.argv[1:]]
    if "--build-dir" in args:
        i = args.index("--build-dir")
        BUILD = args[i + 1]
        del args[i:i + 2]
    BUILD = BUILD or os.path.join(ROOT, "build")
    # the harness's options (--psd ...) are not needed here
    rest, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
        elif a in ("--psd", "--psctl", "--psworker", "--data"):
            skip = 1
        else:
            rest.append(a)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
