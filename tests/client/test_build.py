"""test_build.py - a program built against libpsclient each way
docs/client.md says, with its commands as written there (each is looked
up in the page verbatim, then run): from the build tree with
PKG_CONFIG_PATH=build/client; installed under a prefix the loader does not
search, found through an rpath or LD_LIBRARY_PATH (and not found without
either, with the loader's message); and with libpsclient.a linked in
through psclient-static. Each program is examples/c/linreg.c, and each
trains against a real psd. (ctest: client_build)
"""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import harness  # noqa: E402

BUILD = os.environ.get("PSD_BUILD_DIR", os.path.join(ROOT, "build"))
SGD = ("--set", "optimizer=sgd", "--set", "lr=0.05", "--set", "momentum=0", "--set", "warmup_versions=0")

with open(os.path.join(ROOT, "docs", "client.md")) as f:
    DOC = f.read()

# docs/client.md's lines, as written
BUILD_TREE = "cc myworker.c $(PKG_CONFIG_PATH=build/client pkg-config --cflags --libs psclient) -o myworker"
INSTALL = 'cmake --install build --prefix "$PREFIX"'
PC_PATH = 'export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"'
SHARED = "cc myworker.c $(pkg-config --cflags --libs psclient) -o myworker"
RPATH = ('cc myworker.c $(pkg-config --cflags --libs psclient) -Wl,-rpath,"$(pkg-config --variable=libdir psclient)" '
         '-o myworker')
LD_PATH = 'LD_LIBRARY_PATH="$(pkg-config --variable=libdir psclient)" ./myworker'
STATIC = "cc myworker.c $(pkg-config --cflags --libs psclient-static) -o myworker"


@pytest.fixture
def cluster():
    with harness.Cluster("psd-build") as cl:
        yield cl


def sh(line, cwd, env, expect=0, args=""):
    """Runs a line of the page (with args after it) with bash in cwd; a
    sanitizer build's objects want the sanitizer runtimes on the link line
    too."""
    assert line.startswith("./") or line in DOC, "docs/client.md no longer says: " + line
    line += args
    if os.environ.get("PSD_SANITIZE") == "1" and line.startswith("cc "):
        line += " -fsanitize=address,undefined"
    r = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if expect is not None:
        assert r.returncode == expect, "%s\nexit %d\n%s%s" % (line, r.returncode, r.stdout, r.stderr)
    return r


def workdir(cl, name):
    d = os.path.join(cl.dir, name)
    os.makedirs(d)
    shutil.copy(os.path.join(ROOT, "examples", "c", "linreg.c"), os.path.join(d, "myworker.c"))
    os.symlink(BUILD, os.path.join(d, "build"))
    return d


def trains(cl, prog_line, cwd, env):
    """The program trains against a psd of its own (linreg wants its loss
    cut tenfold from where it starts)."""
    psd = cl.psd(mode="asgd", workers=1, args=SGD, name="psd%d" % len(cl.procs))
    r = sh(prog_line, cwd, env, expect=None, args=" %s 0/1 100" % psd.addr)
    psd.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mode asgd" in r.stdout, r.stdout


def plain_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PKG_CONFIG_PATH")}
    env.update(kw)
    return env


def needed(path):
    return subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout


def test_build_tree(cluster):
    d = workdir(cluster, "tree")
    env = plain_env()
    sh(BUILD_TREE, d, env)
    dyn = needed(os.path.join(d, "myworker"))
    assert "[libpsclient.so.1]" in dyn and os.path.join(BUILD, "client") in dyn, dyn
    trains(cluster, "./myworker", d, env)


def test_installed_outside_the_loader_path_and_static(cluster):
    d = workdir(cluster, "prefix")
    prefix = os.path.join(cluster.dir, "opt-psd")
    env = plain_env(PREFIX=prefix, PKG_CONFIG_PATH=os.path.join(prefix, "lib", "pkgconfig"))
    sh(INSTALL, d, env)
    assert PC_PATH in DOC
    assert os.path.exists(os.path.join(prefix, "lib", "pkgconfig", "psclient.pc"))
    # without an rpath the loader does not find it, and says so
    sh(SHARED, d, env)
    r = sh("./myworker", d, env, expect=None)
    assert r.returncode != 0 and "libpsclient.so.1: cannot open shared object file" in r.stderr, r.stderr
    trains(cluster, LD_PATH, d, env)
    # with the rpath it runs as it is
    sh(RPATH, d, env)
    assert os.path.join(prefix, "lib") in needed(os.path.join(d, "myworker"))
    trains(cluster, "./myworker", d, env)
    # the archive linked in: no libpsclient.so needed at all
    sh(STATIC, d, env)
    dyn = needed(os.path.join(d, "myworker"))
    assert "libpsclient" not in dyn and "[libzstd.so" in dyn, dyn
    trains(cluster, "./myworker", d, env)
