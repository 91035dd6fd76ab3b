#!/usr/bin/python3
"""test_ops_install.py - `cmake --install` and the programs' --help.

    test_ops_install.py --build-dir DIR [harness options]

- With --prefix /usr and DESTDIR: psd, psworker and psctl in usr/bin,
  psd.conf and psworker.env in etc/psd, the units in systemd's unit
  directory naming /usr/bin/psd and /etc/psd/psd.conf. A second install
  keeps an administrator's edited psd.conf.
- With --prefix <dir> (and DESTDIR): nothing outside <dir>: the
  configuration under <dir>/etc/psd and the units, naming <dir>/bin/psd,
  under <dir>/lib/systemd/system.
- cpack's check of its staging tree refuses a package without uPlot (and
  says to run `scripts/setup.sh uplot`) or without the man pages.
- conf/psworker.env can be sourced by sh and bash, as its comment says.
- psd, psworker and psctl answer --help with their whole usage, exit 0.
- psd, psworker and psctl answer --version with "NAME X.Y.Z (protocol N)", one version.
"""

import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import Paths  # noqa: E402

ARGS = None


def unit_dir(destdir, prefix):
    """Where the units landed: systemd's own directory or lib/systemd/system
    under the prefix (see systemd/CMakeLists.txt)."""
    for root, _, files in os.walk(destdir):
        if "psd.service" in files:
            return root
    raise AssertionError("no psd.service under %s" % destdir)


class InstallTest(unittest.TestCase):
    def install(self, destdir, prefix):
        cmake = shutil.which("cmake")
        env = dict(os.environ, DESTDIR=destdir)
        r = harness.run([cmake, "--install", ARGS.build_dir, "--prefix", prefix], timeout=120, env=env)
        self.assertEqual(r.returncode, 0, "cmake --install:\n%s%s" % (r.stdout, r.stderr))
        return r.stdout

    def test_install_usr(self):
        with harness.Cluster("psd-install") as cl:
            dest = os.path.join(cl.dir, "root")
            self.install(dest, "/usr")
            for prog in ("psd", "psworker", "psctl"):
                path = os.path.join(dest, "usr", "bin", prog)
                self.assertTrue(os.access(path, os.X_OK), path)
            conf = os.path.join(dest, "etc", "psd", "psd.conf")
            env = os.path.join(dest, "etc", "psd", "psworker.env")
            with open(os.path.join(harness.ROOT, "conf", "psd.conf")) as f:
                shipped = f.read()
            with open(conf) as f:
                self.assertEqual(f.read(), shipped)
            self.assertTrue(os.path.isfile(env))
            # the dashboard's page and uPlot, where psd looks: ../share/psd/web from /usr/bin
            for f in ("index.html", "app.js", "style.css", "uplot/uPlot.iife.min.js", "uplot/uPlot.min.css"):
                self.assertTrue(os.path.isfile(os.path.join(dest, "usr", "share", "psd", "web", f)), f)
            units = unit_dir(dest, "/usr")
            with open(os.path.join(units, "psd.service")) as f:
                text = f.read()
            self.assertIn("ExecStart=/usr/bin/psd --config /etc/psd/psd.conf --state-dir ${STATE_DIRECTORY}", text)
            with open(os.path.join(units, "psworker@.service")) as f:
                text = f.read()
            self.assertIn("EnvironmentFile=/etc/psd/psworker.env", text)
            self.assertIn("ExecStart=/usr/bin/psworker --server ${PSD_SERVER} --shard %i/${PSD_WORKERS}", text)
            self.assertNotRegex(text, r"@[A-Z_]+@")

            # an administrator's settings survive the next install
            with open(conf, "a") as f:
                f.write("lr = 0.01\n")
            out = self.install(dest, "/usr")
            self.assertIn("Keeping", out)
            with open(conf) as f:
                self.assertTrue(f.read().endswith("lr = 0.01\n"))

    def test_install_prefix(self):
        with harness.Cluster("psd-install-prefix") as cl:
            dest = os.path.join(cl.dir, "root")
            prefix = os.path.join(cl.dir, "opt-psd")
            self.install(dest, prefix)
            self.assertTrue(os.access(os.path.join(dest + prefix, "bin", "psd"), os.X_OK))
            self.assertTrue(os.path.isfile(os.path.join(dest + prefix, "etc", "psd", "psd.conf")))
            # nothing outside the prefix: the units too go under it
            self.assertEqual(unit_dir(dest, prefix), os.path.join(dest + prefix, "lib", "systemd", "system"))
            outside = [os.path.join(r, f) for r, _, fs in os.walk(dest) for f in fs
                       if not os.path.join(r, f).startswith(dest + prefix + os.sep)]
            self.assertEqual(outside, [], "cmake --install --prefix wrote outside the prefix")
            with open(os.path.join(unit_dir(dest, prefix), "psd.service")) as f:
                text = f.read()
            self.assertIn("ExecStart=%s/bin/psd --config %s/etc/psd/psd.conf" % (prefix, prefix), text)

    def test_package_refused_without_uplot_or_man_pages(self):
        # cpack runs deploy/deb/check-staging.cmake on its staging tree
        # before it makes the package (CPACK_PRE_BUILD_SCRIPTS)
        script = os.path.join(harness.ROOT, "deploy", "deb", "check-staging.cmake")
        cmake = shutil.which("cmake")
        with harness.Cluster("psd-staging") as cl:
            stage = os.path.join(cl.dir, "stage")
            web = os.path.join(stage, "usr", "share", "psd", "web", "uplot")
            man = os.path.join(stage, "usr", "share", "man", "man1")

            def check_stage():
                return harness.run([cmake, "-DCPACK_TEMPORARY_DIRECTORY=" + stage, "-P", script], timeout=60)
            os.makedirs(man)
            for prog in ("psd", "psworker", "psctl"):
                open(os.path.join(man, prog + ".1.gz"), "wb").close()
            r = check_stage()
            self.assertNotEqual(r.returncode, 0, "a package without uPlot was accepted")
            self.assertIn("scripts/setup.sh uplot", r.stderr)
            os.makedirs(web)
            open(os.path.join(web, "uPlot.iife.min.js"), "w").close()
            r = check_stage()
            self.assertEqual(r.returncode, 0, r.stderr)
            os.unlink(os.path.join(man, "psworker.1.gz"))
            r = check_stage()
            self.assertNotEqual(r.returncode, 0, "a package without psworker.1 was accepted")
            self.assertIn("psworker.1", r.stderr)
            self.assertIn("help2man", r.stderr)

    def test_env_file_sources(self):
        # psworker.env's own comment: `set -a; . /etc/psd/psworker.env; set +a`
        env = os.path.join(harness.ROOT, "conf", "psworker.env")
        for shell in ("sh", "bash"):
            r = harness.run([shell, "-euc", 'set -a; . "$1"; set +a; printf "%s|%s|%s|%s" "$PSD_SERVER" '
                             '"$PSD_WORKERS" "$PSD_DATA_DIR" "$PSWORKER_ARGS"', shell, env])
            self.assertEqual(r.returncode, 0, "%s cannot source psworker.env: %s" % (shell, r.stderr))
            self.assertEqual(r.stderr, "")
            server, workers, data, args = r.stdout.split("|")
            self.assertRegex(server, r"^\S+:\d+$")
            self.assertRegex(workers, r"^\d+$")
            self.assertEqual(data, "/srv/psd/data")
            self.assertTrue(args.startswith("--") and " --model " in args, args)

    def test_help(self):
        expect = {
            Paths.psd: ("--config", "--listen", "--state-dir", "--set", "--print-config", "SIGHUP", "SIGTERM",
                        "Exit status", "systemd"),
            Paths.psworker: ("--server", "--shard", "auto", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                             "JOB_COMPLETION_INDEX", "--quiet", "--eval", "--reconnect-timeout", "Exit status",
                             "PSD_SERVER", "JSON"),
            Paths.psctl: ("status", "workers", "metrics", "set KEY=VALUE", "pause", "resume", "checkpoint",
                          "save PATH", "shutdown", "--json", "--timeout", "Exit codes"),
        }
        for prog, words in expect.items():
            r = harness.run([prog, "--help"])
            self.assertEqual(r.returncode, 0, prog)
            self.assertEqual(r.stderr, "", prog)
            self.assertTrue(r.stdout.startswith("usage: " + os.path.basename(prog)), r.stdout)
            for w in words:
                self.assertIn(w, r.stdout, "%s --help should mention %s" % (os.path.basename(prog), w))
            for line in r.stdout.splitlines():
                self.assertLessEqual(len(line), 100, "%s --help: long line %r" % (prog, line))
            self.assertIsNone(re.search(r"\t", r.stdout))

    def test_version(self):
        # every program says its version in one form, the project's version from CMake
        seen = set()
        for prog in (Paths.psd, Paths.psctl, Paths.psworker):
            r = harness.run([prog, "--version"])
            self.assertEqual(r.returncode, 0, prog)
            self.assertEqual(r.stderr, "", prog)
            name = os.path.basename(prog)
            m = re.fullmatch(name + r" (\d+\.\d+\.\d+) \(protocol (\d+)\)\n", r.stdout)
            self.assertIsNotNone(m, "%s --version: %r" % (name, r.stdout))
            seen.add(m.groups())
        self.assertEqual(len(seen), 1, seen)


if __name__ == "__main__":
    ARGS = harness.parse_args(lambda p: p.add_argument("--build-dir", required=True))
    harness.main(verbosity=2)
