#!/usr/bin/python3
"""test_image.py - deploy/Containerfile built with podman and run: psd and two workers.

    test_image.py --build-dir BUILD --data DATA [--prepared DIR]

Installs podman (with netavark, aardvark-dns, iptables and runc) if
missing. Everything podman makes lives in the scratch directory (its own
storage, run and network-configuration directories), so the machine's own
images, containers and networks are neither used nor touched.

1. The base image is the Debian 12 tar mmdebstrap made (prepare.py), imported
   as localhost/psd-base:bookworm: no registry. The image is built from
   deploy/Containerfile with the Debian package as the build context.
2. The image against deploy/k8s: the user (10001), the ports (7000, 9470),
   the state volume (/var/lib/psd/state), PSD_DATA_DIR, and the token
   init container's `install` command exist in it as the manifests say.
   Its files (podman export): the programs, the page, Fashion-MNIST, the
   copyright files; no shell, package manager, apt cache, setuid or setgid
   file; at most 150 MB.
3. On a podman network of its own: psd from the image with the ConfigMap's
   psd.conf (read-only), the tokens the init container would leave in
   /run/psd, a volume for its state, a read-only root file system; two
   workers in their own containers (--shard auto from JOB_COMPLETION_INDEX
   and PSD_WORKERS, as the indexed Job runs them) train on the image's
   Fashion-MNIST. From the host: the readiness probe's TCP port, /metrics
   (the liveness probe's path) and the dashboard.
4. `podman stop` psd mid-run (SIGTERM: exit 0, a checkpoint in the volume),
   `podman start` it again on the same volume: psd resumes that version,
   the workers reconnect and finish the job.
5. docs/operations-engines.md's block of image commands, run as written
   (etc-psd/, tokens/, the network, psd, a worker with --shard, psctl,
   podman stop) with this test's podman storage and a free port.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import engines
from engines import Failure, Skip, check, log, run, wait_for

ARGS = engines.parse_args()
SCRATCH = None
PODMAN = None
TAG = "psdtest%d" % os.getpid()
IMAGE = "localhost/psd:" + TAG
BASE = "localhost/psd-base:bookworm"
NET = TAG + "-net"
VOL = TAG + "-state"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PODMAN_ENV = None


def podman(*args, timeout=120, check_rc=True, quiet=False):
    return run(PODMAN + list(args), timeout, check=check_rc, quiet=quiet, env=PODMAN_ENV)


def ulimits():
    """podman's default limits (nofile 1048576, nproc 4194304) may exceed
    what this machine lets a process raise to: ask for no more than ours."""
    import resource
    out = []
    for name, lim, want in (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 16384)):
        hard = resource.getrlimit(lim)[1]
        n = want if hard == resource.RLIM_INFINITY else min(want, hard)
        out += ["--ulimit", "%s=%d:%d" % (name, n, n)]
    return out


FIREWALL = None  # (iptables-save before, ip_forward before)


def netavark_rules():
    """{table: [rule args]} of the rules netavark added to built-in chains,
    and the NETAVARK chains, from iptables-save."""
    r = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=60)
    table, rules, chains = None, [], []
    for ln in r.stdout.splitlines():
        if ln.startswith("*"):
            table = ln[1:]
        elif ln.startswith(":NETAVARK"):
            chains.append((table, ln[1:].split()[0]))
        elif ln.startswith("-A ") and not ln.split()[1].startswith("NETAVARK") and "NETAVARK" in ln:
            rules.append((table, ln[3:]))
    return rules, chains


def firewall_restore():
    """Removes what netavark left in the firewall (it keeps its chains and
    the jumps to them after the last network goes) where the machine had
    none before, and puts ip_forward back."""
    before, forward = FIREWALL
    if "NETAVARK" not in before:
        import shlex
        rules, chains = netavark_rules()
        for table, rule in rules:
            subprocess.run(["iptables", "-t", table, "-D"] + shlex.split(rule), capture_output=True, timeout=30)
        for table, chain in chains:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True, timeout=30)
        for table, chain in chains:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True, timeout=30)
        left = netavark_rules()
        if left[0] or left[1]:
            raise Failure("netavark's firewall rules could not be removed: %s" % (left,))
    with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
        f.write(forward)


def setup_podman():
    global PODMAN, FIREWALL
    engines.apt_install(["podman", "netavark", "aardvark-dns", "iptables", "runc"])
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        FIREWALL = (subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=60).stdout, f.read())
    storage = os.path.join(SCRATCH, "storage")
    driver = "overlay"
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            driver = "vfs"
    # runc and cgroupfs: crun refuses hosts with cgroups in hybrid mode, and
    # PID 1 need not be systemd
    PODMAN = ["podman", "--root", storage, "--runroot", os.path.join(SCRATCH, "run"),
              "--network-config-dir", os.path.join(SCRATCH, "net"), "--storage-driver", driver,
              "--cgroup-manager", "cgroupfs", "--runtime", "runc", "--events-backend", "file"]
    os.makedirs(os.path.join(SCRATCH, "net"))
    # netavark (with aardvark-dns: the workers find psd by name), whatever
    # CNI files the machine has
    conf = os.path.join(SCRATCH, "containers.conf")
    with open(conf, "w") as f:
        f.write('[network]\nnetwork_backend = "netavark"\n')
    global PODMAN_ENV
    PODMAN_ENV = dict(os.environ, CONTAINERS_CONF=conf)
    log("podman storage driver %s" % driver)


def inspect(name, fmt):
    return podman("inspect", "--format", fmt, name, quiet=True).stdout.strip()


def http_get(url, token=None, timeout=10):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def read_k8s(name):
    with open(os.path.join(engines.ROOT, "deploy", "k8s", name)) as f:
        return f.read()


def check_against_k8s():
    """2. the image as deploy/k8s uses it."""
    user = inspect(IMAGE, "{{.Config.User}}")
    ports = inspect(IMAGE, "{{json .Config.ExposedPorts}}")
    volumes = inspect(IMAGE, "{{json .Config.Volumes}}")
    env = inspect(IMAGE, "{{json .Config.Env}}")
    sts, job, cfg = read_k8s("psd-statefulset.yaml"), read_k8s("psworker-job.yaml"), read_k8s("psd-config.yaml")
    uid = user.split(":")[0]
    for text, name in ((sts, "psd-statefulset.yaml"), (job, "psworker-job.yaml")):
        users = set(re.findall(r"runAsUser: (\d+)", text)) - {"0"}
        check(users == {uid}, "%s runs as %s, the image as %s" % (name, users, user))
        for cmd in re.findall(r'command: (\["install".*?\])', text, re.S):
            cmd = json.loads(cmd.replace("\n", " "))
            r = podman("run", "--rm", *ulimits(), "--user", uid, "--entrypoint", cmd[0], IMAGE, "--version",
                       check_rc=False, quiet=True)
            check(r.returncode == 0, "%s's init container command %s does not run in the image: %s" % (
                name, cmd[0], r.stderr))
    for port in re.findall(r"containerPort: (\d+)", sts):
        check('"%s/tcp"' % port in ports, "port %s of the StatefulSet is not exposed by the image: %s" % (port, ports))
    state = re.search(r"state_dir = (\S+)", cfg).group(1)
    check(re.search(r"mountPath: %s\}" % re.escape(state), sts), "the StatefulSet mounts no volume at " + state)
    check('"%s"' % state in volumes, "the image declares no volume %s: %s" % (state, volumes))
    data = re.search(r"name: PSD_DATA_DIR\s+value: (\S+)", job).group(1)
    check("PSD_DATA_DIR=%s" % data in env, "the image's PSD_DATA_DIR is not %s: %s" % (data, env))
    # every program starts (its libraries are all there)
    for prog in ("psd", "psworker", "psctl", "tar"):
        r = podman("run", "--rm", *ulimits(), "--entrypoint", prog, IMAGE, "--help", check_rc=False, quiet=True)
        check(r.returncode == 0, "%s --help in the image: exit %d: %s" % (prog, r.returncode, r.stderr[-500:]))
    check_contents(uid)
    log("image against deploy/k8s: user %s, ports %s, volume %s, PSD_DATA_DIR %s" % (user, ports, state, data))
    return cfg


def check_contents(uid):
    """The image's files (podman export of a container made from it): what
    the programs need, and no package manager, shell, apt cache, setuid or
    setgid file; its size at most 150 MB."""
    import tarfile
    size = int(inspect(IMAGE, "{{.Size}}"))
    check(size <= 150 * 1000 * 1000, "the image is %d MB, more than 150" % (size // 1000000))
    podman("create", "--name", TAG + "-files", IMAGE)
    out = os.path.join(SCRATCH, "image.tar")
    podman("export", "-o", out, TAG + "-files", timeout=300)
    podman("rm", TAG + "-files")
    names, special = set(), []
    with tarfile.open(out) as t:
        for m in t:
            name = "/" + m.name.lstrip("./")
            names.add(name)
            if m.mode & 0o6000 and not m.isdir():
                special.append("%s %o" % (name, m.mode))
            if name == "/etc/passwd":
                passwd = t.extractfile(m).read().decode()
    os.unlink(out)
    check(not special, "setuid or setgid files in the image: %s" % special)
    for p in ("/usr/bin/psd", "/usr/bin/psworker", "/usr/bin/psctl", "/usr/bin/etcd", "/usr/bin/install",
              "/usr/share/psd/web/index.html",
              "/usr/share/psd/web/uplot/uPlot.iife.min.js", "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
              "/etc/psd/psd.conf", "/usr/share/doc/libopenblas0-pthread/copyright"):
        check(p in names, "%s is not in the image" % p)
    for p in ("/bin/sh", "/usr/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/dash", "/usr/bin/apt-get",
              "/usr/bin/dpkg", "/usr/bin/perl", "/usr/bin/su", "/usr/bin/passwd"):
        check(p not in names, "%s is in the image" % p)
    check(not [n for n in names if n.startswith("/var/cache/apt/") or n.startswith("/var/lib/apt/")],
          "apt's cache or lists are in the image")
    check(re.search(r"^psd:x:%s:%s:" % (uid, uid), passwd, re.M), "no user psd of uid %s in /etc/passwd" % uid)
    log("image: %d MB, %d files, no shell, package manager or setuid file" % (size // 1000000, len(names)))


def docs_commands():
    """docs/operations-engines.md's image block, run as it stands in a
    directory of its own: podman with this test's storage, the image's tag
    this test built, and a free port for the dashboard; the base import and
    the build, which the test did already with the same commands, skipped.
    The worker trains to the end; psctl sees psd; podman stop leaves a
    checkpoint in the volume."""
    import shlex
    with open(os.path.join(engines.ROOT, "docs", "operations-engines.md")) as f:
        text = f.read()
    sec = text[text.index("## The container image"):text.index("## Kubernetes")]
    check('network_backend = "netavark"' in sec, "the docs do not give podman's netavark setting")
    block = [b for b in re.findall(r"```sh\n(.*?)```", sec, re.S) if "podman run -d --name psd" in b]
    check(len(block) == 1, "no run block in the docs' image section")
    lines = block[0].replace("\\\n", " ").splitlines()
    check(any(ln.startswith("mmdebstrap ") for ln in lines) and any(ln.startswith("podman build ") for ln in lines),
          "the docs' block does not build the image")
    tag = re.search(r"podman build -t (\S+) ", block[0]).group(1)
    port = free_port()
    d = os.path.join(SCRATCH, "docs")
    os.makedirs(d)
    prefix = " ".join(shlex.quote(a) for a in PODMAN)
    script = ["set -euxo pipefail"]
    for ln in lines:
        ln = ln.strip()
        if not ln or ln.startswith("#") or ln.startswith("mmdebstrap ") or ln.startswith("podman build "):
            continue
        ln = re.sub(r"^podman ", prefix + " ", ln)
        ln = ln.replace(tag, IMAGE).replace("127.0.0.1:9470:9470", "127.0.0.1:%d:9470" % port)
        # the limits of open files and processes this machine allows (the
        # docs' note below the block)
        ln = ln.replace(" run -d ", " run -d " + " ".join(ulimits()) + " ")
        ln = ln.replace(" run --rm ", " run --rm " + " ".join(ulimits()) + " ")
        script.append(ln)
    r = run(["bash", "-c", "\n".join(script)], 600, check=False, cwd=d, env=PODMAN_ENV)
    check(r.returncode == 0, "the docs' image commands failed (exit %d):\n%s\n%s" % (
        r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    summary = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    check(len(summary) == 1 and summary[0]["test_accuracy"] > 0.6,
          "the docs' worker did not train on Fashion-MNIST:\n" + r.stdout[-3000:])
    check("left" in r.stdout, "psctl status in the docs' block does not show the worker:\n" + r.stdout[-2000:])
    logs = podman("logs", "psd", check_rc=False, quiet=True).stderr
    check(re.search(r"checkpoint of version \d+ written", logs), "podman stop psd left no checkpoint:\n" + logs[-2000:])
    log("the docs' image commands ran as written: worker %.3f on Fashion-MNIST, psd checkpointed on stop" %
        summary[0]["test_accuracy"])


def body():
    global SCRATCH
    engines.need_root()
    engines.need_debian12()
    # podman unpacks an image's layers in a mount namespace of its own,
    # whose mounts it makes private (in a chroot: "remount /, flags:
    # 0x44000: invalid argument"), and runs containers in new namespaces
    engines.need_namespaces("--mount", "--pid", "--net")
    SCRATCH = tempfile.mkdtemp(prefix="psd-engine-image-", dir="/var/tmp")
    os.chmod(SCRATCH, 0o755)
    setup_podman()

    # 1. base and image
    tar = engines.base_tar(ARGS, SCRATCH)
    t0 = time.monotonic()
    podman("import", tar, BASE, timeout=600)
    ctx = os.path.join(SCRATCH, "context")
    os.makedirs(ctx)
    deb = engines.package(ARGS, os.path.join(SCRATCH, "pkg"))
    shutil.copy(deb, ctx)
    r = podman("run", "--rm", *ulimits(), "--network", "none", BASE, "true", check_rc=False)
    if r.returncode != 0:
        raise Skip("podman cannot run a container here: " + r.stderr.strip()[-300:])
    podman("build", "--network", "host", *ulimits(), "-t", IMAGE, "-f",
           os.path.join(engines.ROOT, "deploy", "Containerfile"), ctx, timeout=900)
    size = int(inspect(IMAGE, "{{.Size}}"))
    log("image built in %.0f s, %d MB (%d bytes)" % (time.monotonic() - t0, size // 1000000, size))

    cfg_yaml = check_against_k8s()

    # 3. psd and two workers on a network of their own
    podman("network", "create", NET)
    podman("volume", "create", VOL)
    etc = os.path.join(SCRATCH, "etc-psd")
    os.makedirs(etc)
    conf = re.search(r"psd\.conf: \|\n((?:    .*\n)+)", cfg_yaml).group(1)
    with open(os.path.join(etc, "psd.conf"), "w") as f:
        f.write("".join(ln[4:] + "\n" for ln in conf.splitlines()))
    os.chmod(os.path.join(etc, "psd.conf"), 0o644)
    tok = os.path.join(SCRATCH, "run-psd")  # what the init container leaves
    os.makedirs(tok)
    secrets = {}
    for name in ("token", "admin-token"):
        secrets[name] = os.urandom(24).hex()
        p = os.path.join(tok, name)
        with open(p, "w") as f:
            f.write(secrets[name] + "\n")
        os.chmod(p, 0o600)
        os.chown(p, 10001, 10001)
    wtok = os.path.join(SCRATCH, "run-psd-worker")
    os.makedirs(wtok)
    shutil.copy(os.path.join(tok, "token"), wtok)
    os.chown(os.path.join(wtok, "token"), 10001, 10001)
    pport, mport = free_port(), free_port()
    podman("run", "-d", "--name", TAG + "-psd", "--network", NET, "--network-alias", "psd", "--read-only",
           *ulimits(), "-v", etc + ":/etc/psd:ro", "-v", tok + ":/run/psd:ro",
           "-v", VOL + ":/var/lib/psd/state", "-p", "127.0.0.1:%d:7000" % pport, "-p", "127.0.0.1:%d:9470" % mport,
           IMAGE, "psd", "--config", "/etc/psd/psd.conf", "--workers", "2")

    def psd_log():
        return podman("logs", TAG + "-psd", check_rc=False, quiet=True).stderr

    def ready():
        if inspect(TAG + "-psd", "{{.State.Running}}") != "true":
            raise Failure("psd's container stopped:\n" + psd_log()[-3000:])
        try:
            with socket.create_connection(("127.0.0.1", pport), timeout=2):
                return True
        except OSError:
            return False
    wait_for(ready, 60, "psd's port (the readiness probe)")
    pid = inspect(TAG + "-psd", "{{.State.Pid}}")
    with open("/proc/%s/status" % pid) as f:
        ids = {ln.split(":")[0]: ln.split()[1] for ln in f if ln.startswith(("Uid:", "Gid:"))}
    check(ids == {"Uid": "10001", "Gid": "10001"}, "psd does not run as 10001:10001: %s" % ids)
    r = podman("exec", TAG + "-psd", "install", "-m", "644", "/etc/psd/psd.conf", "/usr/probe", check_rc=False,
               quiet=True)
    check(r.returncode != 0 and "Read-only file system" in r.stderr, "the root file system is writable: " + r.stderr)

    workers = []
    for k in range(2):
        name = "%s-w%d" % (TAG, k)
        podman("run", "-d", "--name", name, "--network", NET, "--read-only", *ulimits(),
               "-v", wtok + ":/run/psd:ro", "-e", "PSD_WORKERS=2", "-e", "PSD_SERVER=psd:7000",
               "-e", "PSD_TOKEN_FILE=/run/psd/token", "-e", "JOB_COMPLETION_INDEX=%d" % k,
               IMAGE, "psworker", "--shard", "auto", "--dataset", "fashion-mnist", "--model", "mlp:256,128",
               "--epochs", "4", "--batch", "64", "--eval", "--limit", "12000", "--test-limit", "2000",
               "--reconnect-timeout", "120")
        workers.append(name)

    def psctl(*args):
        return podman("exec", TAG + "-psd", "psctl", "--server", "127.0.0.1:7000", "--token-file",
                      "/run/psd/admin-token", *args, check_rc=False, quiet=True)

    def version_at_least(v):
        r = psctl("status", "--json")
        if r.returncode != 0:
            return None
        st = json.loads(r.stdout)
        joined = [w for w in st["workers"] if w["state"] == "connected"]
        return st if len(joined) == 2 and st["version"] >= v else None
    st = wait_for(lambda: version_at_least(150), 180, "both workers training in the containers", interval=0.5)
    log("training: version %d, workers %s" % (st["version"], [w["shard"] for w in st["workers"]]))

    code, text = http_get("http://127.0.0.1:%d/metrics" % mport)
    log("GET /metrics without the token: %s" % code)
    unauth = code
    code, text = http_get("http://127.0.0.1:%d/metrics" % mport, secrets["admin-token"])
    check(code == 200 and "psd_model_version" in text, "GET /metrics: %s %s" % (code, text[:300]))
    code, page = http_get("http://127.0.0.1:%d/" % mport, secrets["admin-token"])
    check(code == 200 and "app.js" in page, "GET / (the dashboard): %s %s" % (code, page[:300]))
    code, js = http_get("http://127.0.0.1:%d/uplot/uPlot.iife.min.js" % mport, secrets["admin-token"])
    check(code == 200 and len(js) > 10000, "GET /uplot/uPlot.iife.min.js: %s" % code)
    # the StatefulSet's probes as the kubelet would run them
    sts = read_k8s("psd-statefulset.yaml")
    m = re.search(r"livenessProbe:.*?command: (\[.*?\])", sts, re.S)
    check(m, "the StatefulSet's liveness probe is not an exec probe")
    probe = json.loads(m.group(1).replace("\n", " "))
    r = podman("exec", TAG + "-psd", *probe, check_rc=False, quiet=True)
    check(r.returncode == 0, "the liveness probe %s fails (%d): %s" % (probe, r.returncode, r.stderr))
    check(unauth == 401 and "httpGet" not in sts.split("livenessProbe:")[1].split("volumeMounts:")[0],
          "GET /metrics without the token answered %s; the liveness probe must not need it" % unauth)
    log("liveness probe %s: exit 0; GET /metrics without the token: %s" % (" ".join(probe), unauth))

    # 4. psd stopped (SIGTERM) and started again on the same volume
    podman("stop", "-t", "60", TAG + "-psd", timeout=120)
    check(inspect(TAG + "-psd", "{{.State.ExitCode}}") == "0", "psd did not exit 0 on SIGTERM:\n" + psd_log()[-3000:])
    m = re.findall(r"checkpoint of version (\d+) written", psd_log())
    check(m, "no checkpoint written on SIGTERM:\n" + psd_log()[-3000:])
    stopped_at = int(m[-1])
    log("psd stopped (SIGTERM): checkpoint of version %d in the volume" % stopped_at)
    podman("start", TAG + "-psd")
    wait_for(lambda: "resuming model version %d" % stopped_at in psd_log(), 60,
             "psd resuming version %d" % stopped_at)
    results = []
    for name in workers:
        wait_for(lambda: inspect(name, "{{.State.Running}}") == "false", 300, name + " to finish", interval=1)
        code = inspect(name, "{{.State.ExitCode}}")
        r = podman("logs", name, check_rc=False, quiet=True)
        check(code == "0", "%s exited %s:\n%s" % (name, code, r.stderr[-3000:]))
        summary = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
        check(len(summary) == 1, "%s printed no summary:\n%s" % (name, r.stdout))
        results.append(summary[0])
    for s in results:
        check(s["reconnects"] >= 1, "a worker did not reconnect: %s" % s)
        check(s["test_accuracy"] > 0.7, "a worker reached %.3f on Fashion-MNIST" % s["test_accuracy"])
    log("workers done after the restart: accuracy %s, reconnects %s" % (
        [s["test_accuracy"] for s in results], [s["reconnects"] for s in results]))

    # 5. the docs' commands, as written
    docs_commands()


def cleanup():
    if PODMAN:
        names = [TAG + "-psd", TAG + "-w0", TAG + "-w1", TAG + "-files", "psd"]
        env = PODMAN_ENV
        subprocess.run(PODMAN + ["rm", "-f", "-t", "5"] + names, capture_output=True, timeout=120, env=env)
        for net in (NET, "psd"):
            subprocess.run(PODMAN + ["network", "rm", "-f", net], capture_output=True, timeout=60, env=env)
        for vol in (VOL, "psd-state"):
            subprocess.run(PODMAN + ["volume", "rm", "-f", vol], capture_output=True, timeout=60, env=env)
        r = subprocess.run(PODMAN + ["system", "reset", "--force"], capture_output=True, text=True, timeout=300,
                           env=env)
        if r.returncode != 0:
            log("podman system reset: " + r.stderr.strip()[-300:])
    if FIREWALL:
        firewall_restore()
    if SCRATCH:
        with open("/proc/self/mountinfo") as f:
            mounted = [ln.split()[4] for ln in f if ln.split()[4].startswith(SCRATCH)]
        for mp in sorted(mounted, reverse=True):
            subprocess.run(["umount", "-l", mp], check=False)
        if ARGS.keep:
            log("kept " + SCRATCH)
        else:
            shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    engines.main(body, cleanup)
