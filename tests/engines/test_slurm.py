#!/usr/bin/python3
"""test_slurm.py - deploy/slurm/psd-job.sbatch on a real one-machine Slurm cluster.

    test_slurm.py --build-dir BUILD --data DATA

Installs slurm-wlm and munge (Debian packages) if missing, and starts a
cluster of its own in a scratch directory: munged with a fresh key and its
own socket, slurmctld and slurmd in the foreground (children of this test,
on free ports, no systemd needed), one node (this host at 127.0.0.1) in one
partition with this machine's cores. psd, psworker and psctl come from the
build directory through PATH (sbatch passes the environment on).

1. The job as the README gives it (`sbatch --nodes=1 psd-job.sbatch`, W1 for
   4 epochs in BSP): psd runs as job step 0 and psworker as step 1
   (`scontrol listpids` while it trains), the job completes, the worker
   reaches the accuracy docs/operations-engines.md gives (at least 97%),
   and the model is in psd-job-JOBID/model.safetensors where sbatch ran,
   with W1's 235146 parameters.
2. The same job with a fixed PSD_JOB_DIR, stopped with `scancel
   --signal=TERM` after its first epoch: the worker finishes its step and
   leaves (exit 143), psd (stop_grace) shows it as left "stopped by
   SIGTERM", writes a checkpoint and exits; the job ends FAILED, exit 143.
   Resubmitted, it resumes that checkpoint, and a plain `scancel` in its
   second epoch (srun then kills the steps with SIGKILL) leaves the job's
   checkpoints usable.
3. Resubmitted again with the same PSD_JOB_DIR: psd resumes the last
   checkpoint, the worker trains only the rounds left of psd's plan and ends
   with the same model as the uncancelled job (the same test accuracy and
   loss).

The daemons, the jobs and every psd they started are stopped at the end,
pass or fail, and the scratch directory is removed.
"""

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import engines
from engines import Failure, check, log, run, wait_for

ARGS = engines.parse_args()
SCRATCH = None
DAEMONS = []  # (name, Popen)
ENV = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm(*cmd, timeout=60, check_rc=True):
    return run(list(cmd), timeout, check=check_rc, env=ENV, quiet=True)


def start(name, cmd):
    log("start %s: %s" % (name, " ".join(cmd)))
    out = open(os.path.join(SCRATCH, name + ".out"), "w")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    DAEMONS.append((name, p))
    return p


def write_config(hostname, cpus):
    d = SCRATCH
    conf = os.path.join(d, "slurm.conf")
    with open(conf, "w") as f:
        f.write("""# a one-machine cluster for psd's engine test
ClusterName=psdtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=10
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=psd Nodes={host} Default=YES MaxTime=INFINITE State=UP
""".format(host=hostname, d=d, cpus=cpus, ctld_port=free_port(), slurmd_port=free_port()))
    return conf


def job_state(jobid):
    r = slurm("scontrol", "show", "job", str(jobid), check_rc=False)
    m = re.search(r"JobState=(\S+)", r.stdout)
    e = re.search(r"ExitCode=(\S+)", r.stdout)
    return (m.group(1) if m else "?"), (e.group(1) if e else "?")


def wait_job(jobid, states, timeout):
    def done():
        st, ex = job_state(jobid)
        return (st, ex) if st in states else None
    return wait_for(done, timeout, "job %s in state %s" % (jobid, "/".join(states)), interval=0.5)


def submit(cwd, extra_env, name):
    env = dict(ENV, **extra_env)
    out = os.path.join(cwd, "slurm-%j.out")
    r = run(["sbatch", "--parsable", "--nodes=1", "--job-name=" + name, "--output=" + out,
             os.path.join(engines.ROOT, "deploy", "slurm", "psd-job.sbatch")], 60, env=env, cwd=cwd)
    jobid = int(r.stdout.strip().split(";")[0])
    log("submitted job %d (%s)" % (jobid, name))
    return jobid, os.path.join(cwd, "slurm-%d.out" % jobid)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def step_programs(jobid, outfile, timeout):
    """Waits until psworker runs in the job; returns {step: set(programs)}."""
    def both():
        st, _ = job_state(jobid)
        if st not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise Failure("job %d ended %s before psd and psworker ran:\n%s" % (jobid, st, read(outfile)))
        r = slurm("scontrol", "listpids", str(jobid), check_rc=False)
        steps = {}
        for ln in r.stdout.splitlines()[1:]:
            f = ln.split()
            if len(f) < 3:
                continue
            try:
                with open("/proc/%s/comm" % f[0]) as c:
                    steps.setdefault(f[2], set()).add(c.read().strip())
            except OSError:
                pass
        progs = set().union(*steps.values()) if steps else set()
        return steps if {"psd", "psworker"} <= progs else None
    return wait_for(both, timeout, "psd and psworker running in job %d" % jobid, interval=0.2)


def summary(out):
    lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    check(len(lines) == 1, "not one worker summary in the job's output:\n" + out)
    return lines[0]


def safetensors_params(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    total = 0
    for k, v in head.items():
        if k == "__metadata__":
            continue
        c = 1
        for s in v["shape"]:
            c *= s
        total += c
    return total


def body():
    global SCRATCH, ENV
    engines.need_root()
    engines.need_debian12()
    engines.need_cgroups()
    engines.apt_install(["slurmctld", "slurmd", "slurm-client", "munge"], no_start=True)
    bins = [os.path.abspath(os.path.join(ARGS.build_dir, d)) for d in ("server", "worker", "psctl")]
    for b, prog in ((bins[0], "psd"), (bins[2], "psctl"), (bins[1], "psworker")):
        check(os.access(os.path.join(b, prog), os.X_OK), "no %s in %s: build first" % (prog, b))

    SCRATCH = tempfile.mkdtemp(prefix="psd-engine-slurm-", dir="/var/tmp")
    os.chmod(SCRATCH, 0o755)
    for sub in ("state", "spool", "munge", "jobs"):
        os.mkdir(os.path.join(SCRATCH, sub))
    os.chmod(os.path.join(SCRATCH, "munge"), 0o700)
    key = os.path.join(SCRATCH, "munge", "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    hostname = socket.gethostname().split(".")[0]
    conf = write_config(hostname, os.cpu_count() or 1)
    ENV = dict(os.environ, SLURM_CONF=conf,
               PATH=os.pathsep.join(bins + [os.environ.get("PATH", "/usr/bin:/bin")]),
               PSD_DATA_DIR=os.path.abspath(ARGS.data), PSD_PORT=str(free_port()))
    mdir = os.path.join(SCRATCH, "munge")
    start("munged", ["munged", "--foreground", "--force", "--key-file=" + key,
                     "--socket=" + os.path.join(mdir, "munge.socket"),
                     "--pid-file=" + os.path.join(mdir, "munged.pid"),
                     "--log-file=" + os.path.join(mdir, "munged.log"),
                     "--seed-file=" + os.path.join(mdir, "munged.seed")])
    wait_for(lambda: os.path.exists(os.path.join(mdir, "munge.socket")), 30, "munged's socket")
    start("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
    start("slurmd", ["slurmd", "-D", "-f", conf, "-N", hostname])

    def node_idle():
        for name, p in DAEMONS:
            if p.poll() is not None:
                raise Failure("%s exited %d:\n%s\n%s" % (name, p.returncode, read(os.path.join(SCRATCH, name + ".out")),
                                                         read(os.path.join(SCRATCH, name + ".log"))[-3000:]))
        r = slurm("sinfo", "-h", "-o", "%T", check_rc=False)
        return r.returncode == 0 and r.stdout.strip() == "idle"
    wait_for(node_idle, 60, "the node idle in sinfo")
    log("cluster up: " + slurm("sinfo").stdout.strip().replace("\n", " | "))

    # 1. the job as the README gives it
    t0 = time.monotonic()
    jobs = os.path.join(SCRATCH, "jobs")
    jobid, outfile = submit(jobs, {}, "psd-w1")
    steps = step_programs(jobid, outfile, 120)
    check("psd" in steps.get("0", set()) and "psworker" in steps.get("1", set()),
          "psd is not step 0 or psworker not step 1: %s" % steps)
    st, ex = wait_job(jobid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 300)
    out = read(outfile)
    check(st == "COMPLETED" and ex == "0:0", "job %d ended %s (exit %s):\n%s" % (jobid, st, ex, out))
    s1 = summary(out)
    check(s1["mode"] == "bsp" and s1["epochs"] == 4 and s1["model"] == "mlp:256,128", "summary: %s" % s1)
    check(s1["test_accuracy"] >= 0.97, "job %d reached %.4f, below 97%%" % (jobid, s1["test_accuracy"]))
    model = os.path.join(jobs, "psd-job-%d" % jobid, "model.safetensors")
    check(os.path.exists(model), "no %s:\n%s" % (model, out))
    check(safetensors_params(model) == 235146, "the saved model has %d parameters" % safetensors_params(model))
    log("job %d: steps %s; test accuracy %.4f in %.1f s of training; model at %s (%.0f s)" % (
        jobid, {k: sorted(v) for k, v in steps.items()}, s1["test_accuracy"], s1["seconds"],
        os.path.relpath(model, SCRATCH), time.monotonic() - t0))

    # 2. the same job stopped by scancel --signal=TERM after its first epoch
    t0 = time.monotonic()
    jobdir = os.path.join(SCRATCH, "resume")
    jobid, outfile = submit(jobs, {"PSD_JOB_DIR": jobdir}, "psd-cancel")
    step_programs(jobid, outfile, 120)
    wait_for(lambda: "epoch 1/4" in read(outfile), 120, "job %d's first epoch" % jobid, interval=0.2)
    run(["scancel", "--signal=TERM", str(jobid)], 60, env=ENV)
    st, ex = wait_job(jobid, ("CANCELLED", "COMPLETED", "FAILED"), 120)
    out = read(outfile)
    psdlog = read(os.path.join(jobdir, "psd-0.log"))
    check(st == "FAILED" and ex == "143:0", "job %d ended %s (exit %s), not FAILED with 143:\n%s" % (jobid, st, ex, out))
    check(re.search(r"worker shard 0/1 \([^)]*\) left: stopped by SIGTERM", psdlog),
          "psd does not show the worker as left by SIGTERM:\n%s\n--- job output\n%s" % (psdlog[-3000:], out[-3000:]))
    check(re.search(r"psworker 0/1: stopped by SIGTERM .* exiting with 143", out),
          "the worker did not stop on SIGTERM:\n" + out[-3000:])
    m = re.findall(r"checkpoint of version (\d+) written", psdlog)
    check(m and int(m[-1]) >= 938, "no checkpoint after the first epoch:\n" + psdlog[-3000:])
    check(re.search(r"stopped at model version", psdlog), "psd did not stop cleanly:\n" + psdlog[-3000:])
    cancelled_at = int(m[-1])
    log("job %d stopped by scancel --signal=TERM after epoch 1: worker left by SIGTERM, checkpoint of "
        "version %d (%.0f s)" % (jobid, cancelled_at, time.monotonic() - t0))

    # 2b. resumed, then cancelled by a plain scancel during its next epoch:
    # srun kills the steps; the job's checkpoints stay usable
    t0 = time.monotonic()
    jobid, outfile = submit(jobs, {"PSD_JOB_DIR": jobdir}, "psd-scancel")
    step_programs(jobid, outfile, 120)
    wait_for(lambda: "epoch 2/4" in read(outfile), 120, "job %d's second epoch" % jobid, interval=0.2)
    run(["scancel", str(jobid)], 60, env=ENV)
    st, ex = wait_job(jobid, ("CANCELLED", "COMPLETED", "FAILED"), 120)
    check(st == "CANCELLED", "job %d ended %s, not CANCELLED" % (jobid, st))
    wait_for(lambda: slurm("scontrol", "listpids", str(jobid), check_rc=False).stdout.count("\n") <= 1,
             60, "job %d's processes gone" % jobid, interval=0.5)
    psdlog = read(os.path.join(jobdir, "psd-0.log"))
    check("resuming model version %d" % cancelled_at in psdlog,
          "psd did not resume version %d:\n%s" % (cancelled_at, psdlog[-3000:]))
    ckpts = sorted(f for f in os.listdir(os.path.join(jobdir, "state-0")) if f.endswith(".psdc"))
    check(ckpts, "no checkpoint left in the job directory")
    cancelled_at = int(re.search(r"(\d+)", ckpts[-1]).group(1))
    log("job %d resumed and was cancelled by scancel in epoch 2; last checkpoint %s (%.0f s)" % (
        jobid, ckpts[-1], time.monotonic() - t0))

    # 3. resubmitted: resumes from the checkpoint
    t0 = time.monotonic()
    jobid, outfile = submit(jobs, {"PSD_JOB_DIR": jobdir}, "psd-resume")
    st, ex = wait_job(jobid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), 300)
    out = read(outfile)
    psdlog = read(os.path.join(jobdir, "psd-0.log"))
    check(st == "COMPLETED" and ex == "0:0", "job %d ended %s (exit %s):\n%s" % (jobid, st, ex, out))
    check("resuming model version %d" % cancelled_at in psdlog, "psd did not resume version %d:\n%s" % (
        cancelled_at, psdlog[-3000:]))
    s3 = summary(out)
    check(s3["version"] == 3752 and s3["samples"] < 240000,
          "the resumed job trained %d samples to version %d" % (s3["samples"], s3["version"]))
    check(s3["test_accuracy"] == s1["test_accuracy"] and s3["test_loss"] == s1["test_loss"],
          "the resumed job ended at %.4f (loss %.6f), the whole one at %.4f (loss %.6f)" % (
              s3["test_accuracy"], s3["test_loss"], s1["test_accuracy"], s1["test_loss"]))
    check(os.path.exists(os.path.join(jobdir, "model.safetensors")), "no model saved by the resumed job")
    log("job %d resumed version %d, trained %d samples, ended at %.4f like the whole job (%.0f s)" % (
        jobid, cancelled_at, s3["samples"], s3["test_accuracy"], time.monotonic() - t0))


def cleanup():
    if ENV is not None and any(p.poll() is None for _, p in DAEMONS):
        r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=ENV, timeout=30)
        ids = r.stdout.split()
        if ids:
            subprocess.run(["scancel"] + ids, env=ENV, timeout=30)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=ENV, timeout=30)
                if not r.stdout.split():
                    break
                time.sleep(0.5)
    for name, p in reversed(DAEMONS):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    # anything still running from the scratch directory (a psd of a job
    # whose step outlived its slurmd) goes too
    if SCRATCH:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().decode(errors="replace")
            except OSError:
                continue
            if SCRATCH in cmd and int(pid) != os.getpid():
                log("killing leftover %s: %s" % (pid, cmd.replace("\0", " ")[:200]))
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        if ARGS.keep:
            log("kept " + SCRATCH)
        else:
            shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    engines.main(body, cleanup)
