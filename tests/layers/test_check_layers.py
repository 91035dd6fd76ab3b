#!/usr/bin/env python3
"""test_check_layers.py - the layer check catches what it is for.

usage: test_check_layers.py CC AR NM [SERVER_DIR LIBPSDCORE.a DESIGN.md]

Plants small trees of server/ layer folders in a temporary directory,
compiles them into a static library with CC and AR, and runs
check_layers.py on them: a downward tree passes; an upward include, an
upward call, a call between the sibling layers report and answer, a file in
a folder that is no layer, a room of the bottom layer using a room it may
not, two sources of one name and a write of
psd.stats, psd.tables, psd.model, the workers, the connections, main's
handles or psd.cfg outside their owner, and a read of the mode outside
policy/, each fail with a message naming the files.
With the real tree given, a copy of it with one upward include, and
writes of psd.stats, psd.model, the workers, the connections, the plan
and the model's origin outside their owners planted, fails too, and docs/DESIGN.md's layer table and
figures are what `check_layers.py --markdown` prints.
"""
import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_layers.py")
CC, AR, NM = sys.argv[1:4] if len(sys.argv) >= 4 else ("cc", "ar", "nm")
REAL = sys.argv[4:7] if len(sys.argv) >= 7 else None
TIMEOUT = 60


# Objects compiled for the planted trees, by what they are compiled from:
# the trees are mostly the same few files, and each cc costs about 0.15 s
# (164 of them took 25 s of the test's 65).
OBJ_CACHE = tempfile.mkdtemp(prefix="layers-obj-")
atexit.register(shutil.rmtree, OBJ_CACHE, True)


def obj_key(files, path):
    """What compiling files[path] with -I at the tree's root depends on: its
    path and text, and every header of the tree."""
    h = hashlib.sha256()
    for p in [path] + sorted(q for q in files if q.endswith(".h")):
        h.update(p.encode() + b"\0" + files[p].encode() + b"\0")
    return h.hexdigest()


def run_check(server, lib, *extra):
    return subprocess.run([sys.executable, CHECK, *extra, server, lib, NM],
                          capture_output=True, text=True, timeout=TIMEOUT)


class Planted(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="layers-")
        self.server = os.path.join(self.dir, "server")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def tree(self, files):
        """files: {path under server/: text}; compiles every .c but main.c
        into libcore.a and returns its path."""
        objs = []
        for path, text in files.items():
            full = os.path.join(self.server, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        for path in files:
            if path.endswith(".c") and path != "main.c":
                obj = os.path.join(self.dir, "obj", os.path.dirname(path), os.path.basename(path) + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                cached = os.path.join(OBJ_CACHE, obj_key(files, path) + ".o")
                if not os.path.exists(cached):
                    subprocess.run([CC, "-c", "-I", self.dir, "-o", cached, os.path.join(self.server, path)],
                                   check=True, timeout=TIMEOUT)
                shutil.copyfile(cached, obj)
                objs.append(obj)
        lib = os.path.join(self.dir, "libcore.a")
        subprocess.run([AR, "qc", lib, *objs], check=True, timeout=TIMEOUT)
        return lib

    def base(self):
        # store <- update <- policy; dispatch calls policy; all down
        return {
            "store/store.h": "int st_get(void);\n",
            "store/store.c": '#include "server/store/store.h"\nint st_get(void) { return 1; }\n',
            "update/update.h": "int up_run(void);\n",
            "update/update.c": '#include "server/store/store.h"\n#include "server/update/update.h"\n'
                               "int up_run(void) { return st_get(); }\n",
            "policy/policy.h": "int po_push(void);\n",
            "policy/policy.c": '#include "server/update/update.h"\n#include "server/policy/policy.h"\n'
                               "int po_push(void) { return up_run(); }\n",
            "dispatch/handle.h": "int di_handle(void);\n",
            "dispatch/handle.c": '#include "server/policy/policy.h"\n#include "server/dispatch/handle.h"\n'
                                 "int di_handle(void) { return po_push(); }\n",
            "main.c": '#include "server/dispatch/handle.h"\nint main(void) { return di_handle(); }\n',
        }

    def test_downward_tree_passes(self):
        r = run_check(self.server, self.tree(self.base()))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("8 includes", r.stdout)  # every include of a header of server/
        self.assertIn("3 file-to-file calls", r.stdout)

    def test_upward_include_fails(self):
        t = self.base()
        t["update/update.c"] = '#include "server/policy/policy.h"\n' + t["update/update.c"]
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn('update/update.c (update) -> policy/policy.h (policy): a layer above: '
                      '#include "server/policy/policy.h"', r.stderr)

    def test_upward_call_fails(self):
        t = self.base()
        # the store calls the dispatch layer, declaring the function itself:
        # no include shows it, only the object's symbols do
        t["store/store.c"] = "int di_handle(void);\nint st_get(void) { return 1; }\n" \
                             "int st_back(void) { return di_handle(); }\n"
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn("store/store.c (store) -> dispatch/handle.c (dispatch): a layer above: calls di_handle",
                      r.stderr)

    def test_sibling_call_fails(self):
        t = self.base()
        t["answer/reply.c"] = "int re_send(void) { return 0; }\n"
        t["report/status.c"] = "int re_send(void);\nint rp_status(void) { return re_send(); }\n"
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn("report/status.c (report) -> answer/reply.c (answer): a sibling layer", r.stderr)

    def test_unknown_folder_and_same_name_fail(self):
        t = self.base()
        t["misc/extra.c"] = "int ex(void) { return 0; }\n"
        t["policy/store.c"] = "int po_other(void) { return 0; }\n"
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn("misc/extra.c: its folder is not a layer", r.stderr)
        self.assertIn("store/store.c and policy/store.c: two sources of one name", r.stderr)

    def test_write_of_owned_state_fails(self):
        t = self.base()
        t["record/stats.c"] = "struct st { int pushes; } ; void st_count(struct st *s) { s->pushes++; }\n"
        ok = dict(t)
        # reads, comparisons and counting through the owner pass
        ok["dispatch/handle.c"] += ("struct ps { struct { int pushes, rounds; } stats; };\n"
                                    "int di_read(struct ps *s) { int x = s->stats.pushes; "
                                    "return x <= 1 && s->stats.rounds != 2 && s->stats.pushes == 3; }\n")
        self.assertEqual(run_check(self.server, self.tree(ok)).returncode, 0)
        for write in ("s->stats.pushes++;", "s->stats.pushes += 2;", "s->stats.rounds = 0;", "++s->stats.rounds;",
                      "s->stats.rejected[3]++;", "srv_hist_observe(&s->stats.staleness, 1.0);"):
            t["dispatch/handle.c"] = self.base()["dispatch/handle.c"] + \
                ("struct ps { struct { int pushes, rounds, rejected[4]; double staleness; } stats; };"
                 " void srv_hist_observe(double *h, double v);\n"
                 "void di_w(struct ps *s) { %s }\n" % write)
            shutil.rmtree(self.server)
            r = run_check(self.server, self.tree(t))
            self.assertEqual(r.returncode, 1, write)
            self.assertIn("dispatch/handle.c:5: writes psd.stats, which record/stats.c owns", r.stderr)
        # the embedding tables: tables/table.c's
        for write in ("s->tables.max_bytes = 9;", "s->tables.n++;", "s->tables.bytes -= 4;"):
            t["dispatch/handle.c"] = self.base()["dispatch/handle.c"] + \
                ("struct ps { struct { unsigned long max_bytes, bytes; unsigned n; } tables; };\n"
                 "void di_t(struct ps *s) { %s }\n" % write)
            shutil.rmtree(self.server)
            r = run_check(self.server, self.tree(t))
            self.assertEqual(r.returncode, 1, write)
            self.assertIn("dispatch/handle.c:5: writes psd.tables, which tables/table.c owns", r.stderr)
        ok["dispatch/handle.c"] += ("struct pt { struct { unsigned n; } tables; };\n"
                                    "int di_n(struct pt *s) { return s->tables.n == 2; }\n")
        shutil.rmtree(self.server)
        self.assertEqual(run_check(self.server, self.tree(ok)).returncode, 0)

    def test_write_of_psd_fields_fails(self):
        """psd.h's other groups: the model (model/model.c), the workers
        (session/hello.c), the connections (any file of the connection
        layer), main's handles (main.c)."""
        decl = ("struct md { int initialized; unsigned long version; };\n"
                "struct ps { struct md model; unsigned nshards; void *init_owner; unsigned long rbuf_bytes; "
                "int paused; void *loop; struct { int workers; } cfg; };\n")
        cases = [  # (file, write, what, owner)
            ("dispatch/handle.c", "s->model.version = 3;", "psd.model", "model/model.c"),
            ("dispatch/handle.c", "s->model.initialized = 1;", "psd.model", "model/model.c"),
            ("dispatch/handle.c", "s->model.version++;", "psd.model", "model/model.c"),
            ("dispatch/handle.c", "++s->model.version;", "psd.model", "model/model.c"),
            ("dispatch/handle.c", "c->srv->nshards = 0;", "the workers", "session/hello.c"),
            ("dispatch/handle.c", "s->init_owner = 0;", "the workers", "session/hello.c"),
            ("dispatch/handle.c", "s->rbuf_bytes -= 4;", "the connections", "connection/"),
            ("store/store.c", "s->loop = 0;", "main's handles", "main.c"),
            ("store/store.c", "s->paused = 1;", "psd.paused", "dispatch/admin.c"),
            ("dispatch/handle.c", "s->cfg.workers = 2;", "psd.cfg", "main.c and dispatch/admin.c"),
            ("dispatch/handle.c", "*((char *)&s->cfg + 4) = 1;", "psd.cfg", "main.c and dispatch/admin.c"),
        ]
        for f, write, what, owner in cases:
            t = self.base()
            t[f] += decl + "struct cn { struct ps *srv; };\nvoid planted(struct ps *s, struct cn *c) { (void)c; %s }\n" % write
            if os.path.exists(self.server):
                shutil.rmtree(self.server)
            r = run_check(self.server, self.tree(t))
            self.assertEqual(r.returncode, 1, write)
            self.assertRegex(r.stderr, r"%s:\d+: writes %s.*, which %s owns" % (f, what, owner), write)
        # the owner writes; others read, compare and take the address
        t = self.base()
        t["model/model.c"] = decl + "void mo_w(struct ps *s) { s->model.version = 1; s->model.initialized = 1; }\n"
        t["session/hello.c"] = decl + "void he_w(struct ps *s) { s->nshards = 2; s->init_owner = 0; }\n"
        t["connection/net.c"] = decl + "void ne_w(struct ps *s) { s->rbuf_bytes += 1; }\n"
        t["connection/close.c"] = decl + "void cl_w(struct ps *s) { s->rbuf_bytes -= 1; }\n"
        t["dispatch/handle.c"] += decl + ("int di_r(struct ps *s) { struct md *m = &s->model; "
                                          "return s->model.version == 1 && s->nshards != 2 && m && "
                                          "s->rbuf_bytes <= 3 && s->paused >= 0 && s->cfg.workers + 1 > 0; }\n")
        t["dispatch/admin.c"] = decl + "void ad_w(struct ps *s) { s->cfg.workers = 3; }\n"
        t["main.c"] += decl + "void ma_w(struct ps *s) { s->cfg.workers = 1; }\n"
        shutil.rmtree(self.server)
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_rooms_of_the_bottom_layer(self):
        """The store layer's rooms use only the rooms ROOMS names (and
        psd.h, config.h); each is still the store layer for the order."""
        t = self.base()
        t["model/optim.h"] = "int op_step(void);\n"
        t["model/optim.c"] = '#include "server/model/optim.h"\nint op_step(void) { return 2; }\n'
        t["config/config.h"] = "struct cf { int workers; };\n"
        t["config/settings.c"] = ('#include "server/config/config.h"\n#include "server/model/optim.h"\n'
                                  "int se_apply(void) { return op_step(); }\n")
        t["tables/table.c"] = '#include "server/config/config.h"\nint ta_push(void) { return 0; }\n'
        t["store/store.c"] = ('#include "server/store/store.h"\nint ta_push(void);\n'
                              "int st_get(void) { return ta_push(); }\n")
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 0, r.stderr)  # config -> model, store -> tables, shared headers: allowed
        # a call from tables into model, and from model up into config: refused;
        # and a room still may not use a layer above the store
        t["tables/table.c"] += "int op_step(void);\nint ta_step(void) { return op_step(); }\n"
        t["model/optim.c"] += "int se_apply(void);\nint op_more(void) { return se_apply(); }\n"
        t["record/stats.c"] = '#include "server/policy/policy.h"\nint re_x(void) { return po_push(); }\n'
        shutil.rmtree(self.server)
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn("tables/table.c (room tables) -> model/optim.c (room model): the room tables may use no "
                      "other room: calls op_step", r.stderr)
        self.assertIn("model/optim.c (room model) -> config/settings.c (room config): the room model may use no "
                      "other room: calls se_apply", r.stderr)
        self.assertIn("record/stats.c (store) -> policy/policy.c (policy): a layer above: calls po_push", r.stderr)

    def test_read_of_the_mode_fails(self):
        """The mode (ps_config.mode, PS_MODE_*) is read in policy/ alone."""
        decl = ("enum { PS_MODE_ASGD, PS_MODE_BSP };\nstruct cf { int mode; };\n"
                "struct ps { struct cf cfg; };\n")
        reads = [("session/hello.c", "return s->cfg.mode == PS_MODE_BSP;"),
                 ("answer/barrier.c", "return s->cfg.mode != 0;"),
                 ("store/plan.c", "const struct cf *cfg = &s->cfg; return cfg->mode;"),
                 ("dispatch/handle.c", "return PS_MODE_ASGD;")]
        t = self.base()
        for i, (f, read) in enumerate(reads):
            t[f] = t.get(f, "") + decl + "int planted_%d(struct ps *s) { (void)s; %s }\n" % (i, read)
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        for f, read in reads:
            self.assertRegex(r.stderr, r"%s:\d+: reads the mode, which policy/ alone reads" % f, read)
        # the policy reads it; the others read the policy's fields and other fields named like it
        t = self.base()
        t["policy/policy.c"] += decl + "int po_mode(struct ps *s) { return s->cfg.mode == PS_MODE_BSP; }\n"
        t["session/hello.c"] = ("struct ops { int rounds; };\nstruct wl { char mode[8]; };\n"
                                "int he_r(const struct ops *policy, struct wl *r) "
                                "{ r->mode[0] = 0; return policy->rounds; }\n")
        shutil.rmtree(self.server)
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_mutual_calls_fail(self):
        t = self.base()
        t["update/update.c"] += "int up_more(void) { return 2; }\n"
        t["update/other.c"] = "int up_run(void);\nint up_o(void) { return up_run(); }\n" \
                              "int up_back(void) { return 0; }\n"
        t["update/update.c"] += "int up_back(void);\nint up_x(void) { return up_back(); }\n"
        r = run_check(self.server, self.tree(t))
        self.assertEqual(r.returncode, 1)
        self.assertIn("update/other.c <-> update/update.c: call each other", r.stderr)


@unittest.skipIf(REAL is None, "the real tree was not given (SERVER_DIR LIBPSDCORE.a DESIGN.md)")
class RealTree(unittest.TestCase):
    def test_real_tree_passes_and_planted_include_fails(self):
        server, lib, _ = REAL
        self.assertEqual(run_check(server, lib).returncode, 0)
        with tempfile.TemporaryDirectory(prefix="layers-") as d:
            copy = os.path.join(d, "server")
            shutil.copytree(server, copy)
            with open(os.path.join(copy, "model", "model.c"), "a") as f:
                f.write('\n#include "server/dispatch/handle.h"\n')
            # a room of the bottom layer using one it may not, and a read of the mode outside policy/
            with open(os.path.join(copy, "tables", "table.c"), "a") as f:
                f.write('\n#include "server/model/optim.h"\n')
            with open(os.path.join(copy, "answer", "barrier.c"), "a") as fh:
                fh.write("\nstatic int planted_mode(const psd *s) { return s->cfg.mode == PS_MODE_BSP; }\n")
            r = run_check(copy, lib)
            self.assertEqual(r.returncode, 1)
            self.assertIn("model/model.c (store) -> dispatch/handle.h (dispatch): a layer above", r.stderr)
            self.assertIn("tables/table.c (room tables) -> model/optim.h (room model): the room tables may use "
                          "no other room", r.stderr)
            self.assertRegex(r.stderr, r"answer/barrier.c:\d+: reads the mode, which policy/ alone reads")
            with open(os.path.join(copy, "answer", "pull.c"), "a") as f:
                f.write("\nstatic void planted(psd *s) { s->stats.pulls += 1; }\n")
            r = run_check(copy, lib)
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stderr, r"answer/pull.c:\d+: writes psd.stats, which record/stats.c owns")
            # psd.h's other owned groups, planted in files that read them
            for f, write, owner in [("answer/pull.c", "s->model.version = 7;", "model/model.c"),
                                    ("dispatch/admin.c", "s->nshards = 0;", "session/hello.c"),
                                    ("dispatch/handle.c", "s->rbuf_bytes += 1;", "connection/"),
                                    ("report/status.c", "s->plan.said_done = 1;", "store/plan.c"),
                                    ("dispatch/admin.c", "s->resumed_version = 0;", "report/")]:
                with open(os.path.join(copy, *f.split("/")), "a") as fh:
                    fh.write("\nstatic void planted_%d(psd *s) { %s }\n" % (len(write), write))
                r = run_check(copy, lib)
                self.assertEqual(r.returncode, 1, write)
                self.assertRegex(r.stderr, r"%s:\d+: writes .*, which %s owns" % (f, owner), write)

    def test_design_md_states_the_checks_figures(self):
        server, lib, design = REAL
        r = run_check(server, lib, "--markdown")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(design, encoding="utf-8") as f:
            text = f.read()
        begin, end = "<!-- layers: begin -->\n", "<!-- layers: end -->"
        self.assertIn(begin, text, "docs/DESIGN.md lacks the generated layer table")
        got = text[text.index(begin) + len(begin):text.index(end)].strip()
        self.assertEqual(got, r.stdout.strip(),
                         "docs/DESIGN.md's layer table is not the check's output: paste in "
                         "`tests/layers/check_layers.py --markdown server build/server/libpsdcore.a`")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
