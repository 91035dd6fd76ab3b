"""engines.py - shared helpers for the engine tests (tests/engines/).

The engine tests run psd on the engines it ships for: a Debian package in
a clean Debian 12 root, a Slurm cluster on this machine, a container image
built with podman. They run as root on a Debian 12 machine, install what
they need with apt-get, and clean up everything they started, pass or fail.

Where the machine cannot run one, the test prints one line

    SKIP <test>: <reason>

and exits with SKIP_CODE, which ctest counts as skipped (SKIP_RETURN_CODE);
with PSD_TEST_SKIPS set, the line also goes to that file, which
scripts/test.sh lists at the end of the suite.

Every command has a time limit; a step that runs over it fails the test
with the command and its output.
"""

import argparse
import glob
import re
import os
import shutil
import signal
import subprocess
import sys
import time

SKIP_CODE = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from suite import wait_until  # noqa: E402

NAME = os.path.splitext(os.path.basename(sys.argv[0]))[0]
START = time.monotonic()


class Skip(Exception):
    """The machine cannot run this test; the message says why."""


class Failure(Exception):
    """The engine did not do what it should; the message says what."""


def log(msg):
    print("[%s %6.1f s] %s" % (NAME, time.monotonic() - START, msg), flush=True)


def parse_args(extra=None):
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--data", default=os.environ.get("PSD_DATA_DIR", os.path.join(ROOT, "data")))
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--prepared", default=None,
                   help="a directory where prepare.py left psd_*.deb and bookworm.tar (else made here)")
    if extra:
        extra(p)
    return p.parse_args()


def run(cmd, timeout, check=True, input=None, env=None, cwd=None, quiet=False):
    """Runs cmd (a list), returns the CompletedProcess (text, stdout and
    stderr captured). check: a non-zero exit raises Failure with the output."""
    if not quiet:
        log("$ " + " ".join(cmd))
    try:
        # no input: stdin is /dev/null, never the terminal or pipe ctest was given
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input,
                           stdin=subprocess.DEVNULL if input is None else None, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise Failure("%s: no end after %d s\n%s\n%s" % (" ".join(cmd), timeout,
                                                         _text(e.stdout), _text(e.stderr)))
    if check and r.returncode != 0:
        raise Failure("%s: exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
            " ".join(cmd), r.returncode, r.stdout[-6000:], r.stderr[-6000:]))
    return r


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def need_root():
    if os.geteuid() != 0:
        raise Skip("not root: the test installs Debian packages and makes namespaces")


def need_debian12():
    try:
        with open("/etc/os-release") as f:
            text = f.read()
    except OSError:
        raise Skip("no /etc/os-release: not a Debian machine")
    if "ID=debian" not in text or 'VERSION_ID="12"' not in text:
        raise Skip("not Debian 12 (the test installs Debian 12's packages)")


def root_is_mount_point():
    """True when / is a mount point, as on a machine or in a container; in
    a chroot (a debootstrap root) it is a directory of another mount."""
    with open("/proc/self/mountinfo") as f:
        return any(ln.split()[4] == "/" for ln in f if len(ln.split()) > 4)


def need_namespaces(*kinds):
    """kinds: unshare's flags ('--mount', '--pid', '--net', '--user')."""
    if not shutil.which("unshare"):
        raise Skip("no unshare (util-linux)")
    if "--mount" in kinds and not root_is_mount_point():
        # unshare --mount (and podman's storage, which does the same) makes
        # every mount private from / down, which the kernel refuses where /
        # is not a mount point
        raise Skip("/ is not a mount point (a chroot): a new mount namespace cannot make its "
                   "mounts private")
    flags = list(kinds)
    if "--pid" in flags:
        flags.append("--fork")
    r = subprocess.run(["unshare"] + flags + ["true"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise Skip("the kernel or the sandbox refuses namespaces %s: %s" % (
            " ".join(kinds), r.stderr.strip()))


def need_cgroups():
    """A cgroup file system at /sys/fs/cgroup (v1 or v2), which slurmd
    needs: a minimal root or a container may have none."""
    with open("/proc/self/mountinfo") as f:
        for ln in f:
            left, _, right = ln.partition(" - ")
            mp, fstype = left.split()[4], right.split()[0] if right else ""
            if fstype in ("cgroup", "cgroup2") and (mp == "/sys/fs/cgroup" or mp.startswith("/sys/fs/cgroup/")):
                return
    raise Skip("no cgroup file system mounted on /sys/fs/cgroup (a minimal root or a container): "
               "slurmd cannot run without one")


_apt_updated = False


def apt_install(packages, timeout=600, no_start=False):
    """Installs the Debian packages that are missing. A mirror that cannot
    be reached is a Skip; any other apt failure is a Failure. no_start: the
    packages' services are not started at install (a policy-rc.d that says
    no, for the time of the install, where the machine has none)."""
    global _apt_updated
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            missing.append(p)
    if not missing:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    if not _apt_updated:
        r = run(["apt-get"] + lock + ["update", "-q"], timeout, check=False, env=env)
        if r.returncode != 0:
            raise Skip("apt-get update failed (no Debian mirror reachable?): %s" % r.stderr.strip()[-300:])
        _apt_updated = True
    policy = "/usr/sbin/policy-rc.d"
    own_policy = no_start and not os.path.exists(policy)
    if own_policy:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\n# written by psd's engine test during an install\nexit 101\n")
        os.chmod(policy, 0o755)
    try:
        r = run(["apt-get"] + lock + ["install", "-y", "-q", "--no-install-recommends"] + missing,
                timeout, check=False, env=env)
    finally:
        if own_policy:
            os.unlink(policy)
    if r.returncode != 0:
        if "Unable to fetch" in r.stderr or "Could not resolve" in r.stderr or "Temporary failure" in r.stderr:
            raise Skip("cannot fetch %s from the Debian mirror: %s" % (" ".join(missing), r.stderr.strip()[-300:]))
        raise Failure("apt-get install %s failed:\n%s\n%s" % (" ".join(missing), r.stdout[-3000:], r.stderr[-3000:]))


def wait_for(pred, timeout, what, interval=0.2):
    """Polls pred() until it returns something true (returned), else Failure
    (suite.py's wait_until)."""
    return wait_until(pred, timeout, what, interval, error=Failure)


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def main(body, cleanup):
    """Runs body(); then cleanup() whatever happened. Exit 0 on success, 77
    on Skip (with the SKIP line), 1 on failure."""
    code = 1

    def on_term(signum, frame):
        raise Failure("stopped by signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        body()
        code = 0
    except Skip as e:
        print("SKIP %s: %s" % (NAME, e), flush=True)
        # scripts/test.sh lists these in its last lines
        path = os.environ.get("PSD_TEST_SKIPS")
        if path:
            with open(path, "a") as f:
                f.write("SKIPPED %s.py: %s\n" % (NAME, e))
        code = SKIP_CODE
    except Failure as e:
        print("FAIL %s: %s" % (NAME, e), flush=True)
    except Exception:
        import traceback
        traceback.print_exc()
    finally:
        try:
            cleanup()
        except Exception as e:  # a failed cleanup fails the test
            print("FAIL %s: cleanup: %s" % (NAME, e), flush=True)
            code = 1
    log("%s in %.0f s" % ({0: "passed", SKIP_CODE: "skipped"}.get(code, "failed"), time.monotonic() - START))
    sys.exit(code)


# ---- the Debian package and a Debian 12 root, shared by the tests --------

def make_package(build_dir, out):
    cpack = shutil.which("cpack")
    if not cpack:
        raise Skip("no cpack (Debian package cmake)")
    config = os.path.join(build_dir, "CPackConfig.cmake")
    if not os.path.exists(config):
        raise Failure("no %s: configure the build first" % config)
    # dpkg-shlibdeps (dpkg-dev) computes the package's library dependencies;
    # the DEB generator runs file(1) on what it packs (a minimal root has none)
    apt_install(["dpkg-dev", "file"])
    run([cpack, "--config", config, "-G", "DEB", "-B", out], 300, cwd=build_dir)
    debs = glob.glob(os.path.join(out, "psd_*.deb"))
    check(len(debs) == 1, "cpack made %s, not one psd_*.deb" % debs)
    deb = debs[0]
    files = run(["dpkg-deb", "-c", deb], 60, quiet=True).stdout
    paths = {ln.split()[5].lstrip(".") for ln in files.splitlines()}
    for p in ["/usr/bin/psd", "/usr/bin/psworker", "/usr/bin/psctl", "/usr/include/psd/client.h",
              "/etc/psd/psd.conf", "/etc/psd/psworker.env", "/lib/systemd/system/psd.service",
              "/lib/systemd/system/psworker@.service", "/usr/share/psd/web/index.html",
              "/usr/share/psd/web/uplot/uPlot.iife.min.js",
              "/usr/lib/python3/dist-packages/psd/__init__.py"]:
        check(p in paths, "%s is not in the package; it holds:\n%s" % (p, "\n".join(sorted(paths))))
    check(any(re.search(r"/libpsclient\.so\.\d+$", p) for p in paths), "no libpsclient.so.N in the package")
    check(any(p.endswith("/pkgconfig/psclient.pc") for p in paths), "no psclient.pc in the package")
    check(not any(p.startswith("/usr/local") for p in paths), "files under /usr/local in the package")
    control = run(["dpkg-deb", "-I", deb], 60, quiet=True).stdout
    check(re.search(r"^ Depends:.*\badduser\b.*\blibuv1\b", control, re.M),
          "Depends lacks adduser or libuv1:\n" + control)
    r = subprocess.run(["dpkg-deb", "-e", deb, os.path.join(out, "control")], capture_output=True, text=True)
    check(r.returncode == 0, r.stderr)
    with open(os.path.join(out, "control", "conffiles")) as f:
        cf = f.read().split()
    check(cf == ["/etc/psd/psd.conf", "/etc/psd/psworker.env"], "conffiles: %s" % cf)
    log("package %s (%d bytes, %d files)" % (os.path.basename(deb), os.path.getsize(deb), len(paths)))
    return deb




def package(args, out):
    """The package prepare.py made (args.prepared), else one made now."""
    if args.prepared:
        debs = glob.glob(os.path.join(args.prepared, "pkg", "psd_*.deb"))
        if len(debs) == 1:
            log("package from prepare.py: " + debs[0])
            return debs[0]
    return make_package(args.build_dir, out)


def mmdebstrap(target):
    """A minimal Debian 12 (variant apt) at target: a directory or a .tar."""
    apt_install(["mmdebstrap"])
    r = run(["mmdebstrap", "--variant=apt", "--mode=root", "bookworm", target], 900, check=False)
    if r.returncode != 0:
        if "Temporary failure" in r.stderr or "Could not resolve" in r.stderr or "Unable to fetch" in r.stderr:
            raise Skip("mmdebstrap cannot reach Debian's mirror: " + r.stderr.strip()[-300:])
        raise Failure("mmdebstrap failed:\n" + r.stderr[-4000:])


def base_tar(args, scratch):
    """prepare.py's bookworm.tar, else one made now in scratch."""
    if args.prepared and os.path.exists(os.path.join(args.prepared, "bookworm.tar")):
        return os.path.join(args.prepared, "bookworm.tar")
    tar = os.path.join(scratch, "bookworm.tar")
    mmdebstrap(tar)
    return tar


def debian_root(args, root):
    """A clean Debian 12 root directory at root."""
    if args.prepared and os.path.exists(os.path.join(args.prepared, "bookworm.tar")):
        os.makedirs(root)
        run(["tar", "-C", root, "-xf", os.path.join(args.prepared, "bookworm.tar")], 300)
    else:
        mmdebstrap(root)
