#!/usr/bin/python3
"""test_deb.py - the Debian package (deploy/deb/), installed in a clean Debian 12 root.

    test_deb.py --build-dir BUILD --data DATA

1. `cpack -G DEB` in the build directory makes psd_<version>_<arch>.deb: the
   programs, libpsclient with its header and .pc, the Python package, the
   dashboard's files, the units, and /etc/psd/psd.conf and psworker.env as
   conffiles; and psd-dbgsym_<version>_<arch>.ddeb with the binaries' debug
   symbols. lintian finds no error and no warning but those
   docs/operations-engines.md justifies one by one ("What lintian says").
2. mmdebstrap makes a minimal Debian 12 root (variant apt) from Debian's
   mirror; in it, `apt-get install ./psd_*.deb` resolves the package's
   dependencies; postinst creates the system user psd.
3. With systemd installed in that root, `systemd-analyze verify` passes both
   units (what `systemctl start psd` checks first: programs and files where
   the units say); psd then runs as the unit runs it (its ExecStart=, user
   psd, umask 077, state in /var/lib/psd), a worker trains against it, the
   Python package talks to a second psd, /metrics and the dashboard answer,
   SIGTERM leaves a checkpoint.
4. An edited psd.conf survives `apt-get remove`; `apt-get purge` leaves no
   file of the package, no /etc/psd and no /var/lib/psd.

Every command in the root runs in its own mount and PID namespaces (its
/proc and every process it starts go when it ends); the scratch directory
is removed at the end, pass or fail.
"""

import os
import re
import shutil
import subprocess
import tempfile

import engines
from engines import Failure, check, log, run

ARGS = engines.parse_args()
SCRATCH = None


def in_root(root, script, timeout, check_rc=True):
    """Runs a bash script inside root, in new mount and PID namespaces."""
    return run(["unshare", "--mount", "--pid", "--fork", "--kill-child",
                "--mount-proc=" + os.path.join(root, "proc"),
                "chroot", root, "/bin/bash", "-euo", "pipefail", "-c", script],
               timeout, check=check_rc, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive",
                                                  LC_ALL="C.UTF-8"))


# Runs inside the root after the install: psd as psd.service runs it.
RUN_SCRIPT = r"""
unit=/lib/systemd/system/psd.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
grep -qx 'User=psd' "$unit"
state=/var/lib/psd
mkdir -p "$state" && chown psd:psd "$state" && chmod 750 "$state"
cmd=${exec_start//'${STATE_DIRECTORY}'/$state}
echo "unit: $cmd"
umask 077
setpriv --reuid=psd --regid=psd --init-groups -- $cmd --workers 1 \
    --set listen=127.0.0.1:0 --set port_file=/tmp/psd.port --set metrics_listen=127.0.0.1:0 \
    2>/tmp/psd.log &
PSD=$!
for _ in $(seq 200); do [ -s /tmp/psd.port ] && break; kill -0 $PSD; sleep 0.1; done
port=$(cat /tmp/psd.port)
echo "PORT $port"
echo "PSD_USER $(ps -o user= -p $PSD 2>/dev/null || stat -c %U /proc/$PSD)"
psworker --server 127.0.0.1:$port --data /srv/data --epochs 2 --limit 10000 --test-limit 2000 \
    --model mlp:64 --eval -q | sed 's/^/WORKER /'
psctl --server 127.0.0.1:$port status | sed 's/^/STATUS /'
mport=$(psctl --server 127.0.0.1:$port status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["metrics_listen"].rsplit(":", 1)[1])')
python3 - "$mport" <<'EOF'
import sys, urllib.request
base = "http://127.0.0.1:%s" % sys.argv[1]
m = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
print("METRICS_LINES", len(m.splitlines()))
for ln in m.splitlines():
    if ln.startswith("psd_model_version") or ln.startswith("psd_version"):
        print("METRIC", ln)
page = urllib.request.urlopen(base + "/", timeout=10).read().decode()
print("DASHBOARD", "app.js" in page)
js = urllib.request.urlopen(base + "/uplot/uPlot.iife.min.js", timeout=10)
print("UPLOT", js.status, len(js.read()))
EOF
# the Python package, against a second psd of its own
psd --listen 127.0.0.1:0 --set port_file=/tmp/psd2.port 2>/tmp/psd2.log &
PSD2=$!
for _ in $(seq 200); do [ -s /tmp/psd2.port ] && break; sleep 0.1; done
python3 - "$(cat /tmp/psd2.port)" <<'EOF'
import sys, numpy as np, psd
c = psd.Client([("w", (4, 3)), ("b", (3,))], server="127.0.0.1:" + sys.argv[1])
c.params[:] = 1.0
c.connect()
c.grads[:] = 0.5
c.pushpull()
print("PYTHON", psd.__file__, c.version, float(np.abs(c.params - 1.0).max()) > 0)
c.close()
EOF
kill -TERM $PSD2; wait $PSD2 || true
# the packaged settings, sourced as psworker.env's comment says: a worker
# on Fashion-MNIST from Debian's dataset-fashion-mnist (a Recommends),
# which psworker finds without data of its own in PSD_DATA_DIR
psd --listen 127.0.0.1:0 --set port_file=/tmp/psd3.port 2>/tmp/psd3.log &
PSD3=$!
for _ in $(seq 200); do [ -s /tmp/psd3.port ] && break; sleep 0.1; done
(set -a; . /etc/psd/psworker.env; set +a; echo "DATA_DIR $PSD_DATA_DIR $(test -d "$PSD_DATA_DIR" && echo exists)";
 psworker --server 127.0.0.1:$(cat /tmp/psd3.port) --dataset fashion-mnist --epochs 1 --limit 3000 \
    --test-limit 1000 --model mlp:32 --eval -q) | sed 's/^/FASHION /'
kill -TERM $PSD3; wait $PSD3 || true
kill -TERM $PSD
rc=0; wait $PSD || rc=$?
echo "PSD_EXIT $rc"
ls -ln "$state" | sed 's/^/STATE /'
"""


def justified_tags():
    """The lintian tags docs/operations-engines.md justifies, one per row of
    its table under "What lintian says"."""
    with open(os.path.join(engines.ROOT, "docs", "operations-engines.md")) as f:
        text = f.read()
    m = re.search(r"^### What lintian says\n(.*?)(?=^#)", text, re.M | re.S)
    check(m, "docs/operations-engines.md has no section \"What lintian says\"")
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", m.group(1), re.M))


def lintian(deb):
    """lintian on the package: no error, and no warning but those the docs
    justify; the package carries its copyright file, changelog, man pages,
    ldconfig trigger and stripped binaries, with their symbols in the
    -dbgsym package beside it."""
    engines.apt_install(["lintian"])
    r = run(["lintian", "--tag-display-limit", "0", "--allow-root", deb], 600, check=False)
    found = re.findall(r"^([EW]): psd(?: [a-z]+)?: (\S+)(.*)$", r.stdout, re.M)
    ok = justified_tags()
    new = ["%s: %s%s" % f for f in found if f[1] not in ok]
    check(not new, "lintian findings that docs/operations-engines.md does not justify:\n" + "\n".join(new)
          + "\n--- all of lintian's output\n" + r.stdout + r.stderr)
    check(r.returncode in (0, 1, 2), "lintian failed (exit %d): %s" % (r.returncode, r.stderr))
    files = run(["dpkg-deb", "-c", deb], 60, quiet=True).stdout
    for p in ("/usr/share/doc/psd/copyright", "/usr/share/doc/psd/changelog.gz", "/usr/share/man/man1/psd.1.gz",
              "/usr/share/man/man1/psworker.1.gz", "/usr/share/man/man1/psctl.1.gz", "/usr/share/psd/get-mnist.sh"):
        check("." + p in files, "%s is not in the package" % p)
    ddebs = [f for f in os.listdir(os.path.dirname(deb)) if f.startswith("psd-dbgsym_") and f.endswith(".ddeb")]
    check(len(ddebs) == 1, "no psd-dbgsym package beside %s" % deb)
    dbg = run(["dpkg-deb", "-c", os.path.join(os.path.dirname(deb), ddebs[0])], 60, quiet=True).stdout
    check(len(re.findall(r"/usr/lib/debug/\.build-id/\S+\.debug", dbg)) >= 4,
          "the -dbgsym package lacks the symbols of psd, psworker, psctl and libpsclient:\n" + dbg)
    log("lintian: %d finding(s), each justified in the docs (%s); -dbgsym beside it" % (
        len(found), ", ".join(sorted({f[1] for f in found})) or "none"))


def body():
    global SCRATCH
    engines.need_root()
    engines.need_debian12()
    engines.need_namespaces("--mount", "--pid")
    mnist = os.path.join(ARGS.data, "mnist")
    if not os.path.exists(os.path.join(mnist, "train-images-idx3-ubyte")):
        raise Failure("no MNIST in %s (scripts/setup.sh puts it there)" % mnist)

    SCRATCH = tempfile.mkdtemp(prefix="psd-engine-deb-", dir="/var/tmp")
    deb = engines.package(ARGS, os.path.join(SCRATCH, "pkg"))
    lintian(deb)
    root = os.path.join(SCRATCH, "root")
    engines.debian_root(ARGS, root)
    shutil.copy("/etc/resolv.conf", os.path.join(root, "etc", "resolv.conf"))
    shutil.copy(deb, os.path.join(root, "tmp"))
    os.makedirs(os.path.join(root, "srv", "data", "mnist"))
    for f in os.listdir(mnist):
        if "idx" in f:
            shutil.copy(os.path.join(mnist, f), os.path.join(root, "srv", "data", "mnist", f))

    # the install: apt resolves the dependencies from the mirror
    debname = os.path.basename(deb)
    in_root(root, "cd /tmp && apt-get update -q && apt-get install -y -q ./%s" % debname, 600)
    r = in_root(root, "getent passwd psd; dpkg-query -W -f='${Status}|${Conffiles}\n' psd; "
                      "python3 -c 'import psd; print(psd.__file__)'; "
                      "pkg-config --modversion psclient 2>/dev/null || echo no-pkg-config; "
                      "echo PYC $(ls /usr/lib/python3/dist-packages/psd/__pycache__/ 2>/dev/null | grep -c pyc)", 120)
    out = r.stdout
    m = re.search(r"^psd:x:(\d+):(\d+):[^:]*:(/var/lib/psd):(\S+)$", out, re.M)
    check(m, "no system user psd after the install:\n" + out)
    check(int(m.group(1)) < 1000 and m.group(4).endswith("nologin"),
          "psd is not a system user without a shell: " + m.group(0))
    check("install ok installed|" in out and "/etc/psd/psd.conf" in out, "dpkg's view of psd:\n" + out)
    check("/usr/lib/python3/dist-packages/psd/__init__.py" in out, "python3 does not find psd:\n" + out)
    check(re.search(r"^PYC [1-9]", out, re.M), "py3compile did not compile the Python package:\n" + out)
    log("installed: user psd uid %s; conffiles registered; python3 imports psd; byte code compiled" % m.group(1))

    # systemd's own check of the units, as systemctl start would load them
    in_root(root, "apt-get install -y -q --no-install-recommends systemd >/dev/null", 600)
    r = in_root(root, "systemd-analyze verify /lib/systemd/system/psd.service "
                      "/lib/systemd/system/psworker@.service 2>&1", 120, check_rc=False)
    check(r.returncode == 0 and not r.stdout.strip(),
          "systemd-analyze verify (exit %d):\n%s" % (r.returncode, r.stdout))
    r = in_root(root, "systemd-analyze security --offline=yes /lib/systemd/system/psd.service | tail -n 1", 120)
    log("systemd-analyze verify: clean; " + r.stdout.strip())

    r = in_root(root, RUN_SCRIPT, 300, check_rc=False)
    out = r.stdout
    if r.returncode != 0:
        logs = in_root(root, "tail -n 30 /tmp/psd.log /tmp/psd2.log 2>&1 || true", 60, check_rc=False).stdout
        raise Failure("the run in the root failed (exit %d):\n%s\n%s\n%s" % (r.returncode, out, r.stderr, logs))
    log("run:\n" + out)
    check(re.search(r"^PSD_USER psd$", out, re.M), "psd did not run as the user psd")
    import json
    worker = [json.loads(ln[len("WORKER "):]) for ln in out.splitlines() if ln.startswith("WORKER {")]
    check(len(worker) == 1, "no worker summary")
    check(worker[0]["test_accuracy"] > 0.8, "the worker reached %.3f, not above 0.8" % worker[0]["test_accuracy"])
    check(re.search(r"^STATUS .*\bleft\b", out, re.M), "psctl status does not show the worker as left")
    check(re.search(r"^METRICS_LINES (\d+)", out, re.M) and int(re.search(r"^METRICS_LINES (\d+)", out, re.M).group(1)) > 20,
          "/metrics answered too little")
    check("DASHBOARD True" in out, "the dashboard page is not psd's")
    check(re.search(r"^UPLOT 200 \d{4,}", out, re.M), "uPlot is not served from the package's files")
    check(re.search(r"^PYTHON /usr/lib/python3/dist-packages/psd/__init__.py [1-9]\d* True$", out, re.M),
          "the Python package did not train against psd")
    check("PSD_EXIT 0" in out, "psd did not exit 0 on SIGTERM")
    check("FASHION DATA_DIR /srv/psd/data exists" in out, "the packaged PSD_DATA_DIR does not exist:\n" + out)
    fashion = [json.loads(ln[len("FASHION "):]) for ln in out.splitlines() if ln.startswith("FASHION {")]
    check(len(fashion) == 1 and fashion[0]["test_accuracy"] > 0.5,
          "no worker trained on Debian's Fashion-MNIST with the packaged settings:\n" + out)
    check(re.search(r"^STATE -rw------- +1 +%s +%s .* ckpt-\d+\.psdc$" % (m.group(1), m.group(2)), out, re.M),
          "no checkpoint owned by psd in /var/lib/psd after SIGTERM")

    # remove keeps the administrator's psd.conf; purge removes everything
    in_root(root, "echo '# edited' >> /etc/psd/psd.conf && apt-get remove -y -q psd", 300)
    r = in_root(root, "ls /etc/psd; ls /usr/bin/psd 2>&1 || true; dpkg-query -W -f='${Status}\n' psd", 60)
    check("psd.conf" in r.stdout and "No such file" in r.stdout and "config-files" in r.stdout,
          "after apt-get remove:\n" + r.stdout)
    in_root(root, "apt-get purge -y -q psd", 300)
    r = in_root(root, "for p in /usr/bin/psd /usr/bin/psworker /usr/bin/psctl /etc/psd /var/lib/psd "
                      "/lib/systemd/system/psd.service /usr/share/psd /usr/lib/python3/dist-packages/psd "
                      "/usr/include/psd /srv/psd; do if [ -e $p ]; then echo LEFT $p; fi; done; "
                      "find / -xdev -name __pycache__ -path '*/psd/*' | sed 's/^/LEFT /'; "
                      "for p in /usr/lib/libpsclient* /usr/lib/*/libpsclient*; do "
                      "if [ -e $p ]; then echo LEFT $p; fi; done; "
                      "dpkg-query -W -f='${Status}\n' psd 2>&1 || true", 60)
    check("LEFT" not in r.stdout, "apt-get purge left files:\n" + r.stdout)
    log("remove kept the edited psd.conf; purge left nothing")


def cleanup():
    if SCRATCH and os.path.isdir(SCRATCH):
        with open("/proc/self/mountinfo") as f:
            mounted = [ln.split()[4] for ln in f if ln.split()[4].startswith(SCRATCH)]
        for mp in sorted(mounted, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False)
        if ARGS.keep:
            log("kept " + SCRATCH)
        else:
            shutil.rmtree(SCRATCH)


if __name__ == "__main__":
    engines.main(body, cleanup)
