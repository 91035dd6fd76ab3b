"""test_coord.py - leaders elected through etcd (issue 44; docs/fault-tolerance.md,
"Elections through etcd").

A part of two psd, both with `coordinator` set against a real etcd the test
starts (tests/integration/etcd.py), the second started as a follower of
the first; two workers (test_tables_kill.py's click-through model, asgd,
replication = sync) are given both addresses (A/B):

- kill -9 of the leader: the follower takes the part's key and leads
  within about lease_ttl, with no `psctl promote`; the workers finish with
  every step's push applied once (the final model version is exactly one
  per step: no acknowledged push lost, none applied twice); the old leader,
  started again with no --replica-of, finds the new leader in etcd and
  follows it. One of etcd's three members is killed mid-job first: nothing
  changes.
- SIGSTOP of the leader past lease_ttl: the follower is elected; after
  SIGCONT the old leader, past its lease's fence, acknowledges a push only
  once its follower has fetched past it (a fetch sent before the stop and
  read after SIGCONT may release a few: psd_fenced_replies_sent_total at
  most 4; the final version shows that no push it acknowledged was lost),
  steps down and follows the new leader.

- SIGTERM of the leader (lease_ttl 10 s here): it hands the part back
  (server/coord/handback.c): its workers go, its follower fetches its
  whole log, it deletes the key naming the follower, which campaigns at
  once. The longest time without a step acknowledged (the workers' step
  times, on the machine's monotonic clock) stays under half of lease_ttl,
  which a lapse alone would take; every step's push is applied once. A
  leader with no follower in sync stops as before, its key left to lapse.

- Two followers, one held behind while still in sync (PSD_TEST_FOLLOW_HOLD),
  kill -9 of the leader: the held one, first allowed to campaign, defers
  to the other, which holds more of the log (its /psd/JOB/part/N/pos/ADDR
  key; server/coord/elect.c), and that one is elected.

- A psd of another job (mode ssp) given a running job's name stops at
  start, exit status 1, naming the job's record (/psd/JOB/job) and the
  key its leader holds; once that job's leases lapse it takes the name.
  A psd started while etcd is down logs an ERROR at once, shows it in its
  status, refuses a worker's hello with NOT_LEADER until it knows whether
  it leads, and leads once etcd is started.

Skips when etcd is not installed (Debian package etcd-server).
"""

import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import etcd  # noqa: E402
import test_replica as tr  # noqa: E402  (its workers and status readers)
import test_tables_kill as tk  # noqa: E402

TTL = 3  # lease_ttl, seconds

pytestmark = pytest.mark.skipif(etcd.why_no_etcd() is not None, reason=etcd.why_no_etcd() or "")


def coord(addr):
    return harness.status(addr)["coordinator"]


def start(cl, e, i, addrs, n, leader=None, ttl=TTL, more=(), env=None):
    """psd i on addrs[i] (its n-th start), with the coordinator; a follower
    of leader when given."""
    extra = ("--listen", addrs[i], "--set", "coordinator=" + e.urls, "--set", "job=coordtest",
             "--set", "lease_ttl=%ds" % ttl) + tuple(more)
    if leader:
        extra += ("--replica-of", leader)
    return cl.psd(workers=2, name="psd%d-%d" % (i, n), args=tr.leader_args(cl, "psd%d" % i, extra), env=env)


def two_replicas(cl, e, ttl=TTL, n=2, more=()):
    addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(n)]
    procs = [start(cl, e, 0, addrs, 0, ttl=ttl, more=more)]
    harness.wait_until(lambda: coord(addrs[0])["role"] == "leader", 30, "psd0 to lead")
    for i in range(1, n):
        procs.append(start(cl, e, i, addrs, 0, leader=addrs[0], ttl=ttl, more=more))
    return addrs, procs


# test_tables_kill's worker, each step's end stamped with the machine's monotonic clock
TIMED_WORKER = tk.WORKER.replace('print("step", step + 1, flush=True)',
                                 'print("step", step + 1, time.monotonic(), flush=True)')
assert TIMED_WORKER != tk.WORKER


def timed_workers(cl, addr, steps, pace):
    ws = []
    for k in range(2):
        argv = [sys.executable, "-c", TIMED_WORKER, addr, str(k), str(steps), str(tk.BATCH), str(pace)]
        w = harness.Worker("tworker%d-%d" % (k, len(cl.procs)), argv, cl.dir, env=dict(os.environ))
        cl.procs.append(w)
        ws.append(w)
    return ws


def longest_pause(ws, since):
    """The longest time after since (monotonic) in which no worker's step
    ended: no push acknowledged."""
    stamps = sorted(float(l.split()[2]) for w in ws for l in w.stdout().split("\n")[:-1]
                    if l.startswith("step ") and float(l.split()[2]) >= since)
    return max(b - a for a, b in zip(stamps, stamps[1:])), len(stamps)


def metric(addr, name):
    return harness.metric(harness.parse_prometheus(harness.metrics(addr))[0], name)


def test_the_follower_takes_over_when_the_leader_is_killed():
    with harness.Cluster("psd-coord-kill") as cl, etcd.Etcd(cl.dir, members=3) as e:
        addrs, procs = two_replicas(cl, e)
        steps = 1500  # about 20 s: the job outlasts two leases, a kill and an election
        ws = tr.start_workers(cl, "/".join(addrs), steps=steps, pace=0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        harness.wait_until(lambda: coord(addrs[1])["listed"], 30, "the key to name the follower in sync")
        assert e.get("/psd/coordtest/part/0/leader").startswith(addrs[0] + " ")
        # one of etcd's three members lost: nothing changes
        renewals = coord(addrs[0])["renewals"]
        e.members[0].kill()
        at = min(tk.steps_done(w) for w in ws)
        harness.wait_until(lambda: coord(addrs[0])["renewals"] >= renewals + 6, 4 * TTL,
                           "the leader's lease renewed over two lease_ttl with one etcd member lost")
        assert min(tk.steps_done(w) for w in ws) > at
        assert coord(addrs[0])["role"] == "leader" and coord(addrs[1])["role"] == "follower"
        assert tr.repl(addrs[0])["insync"] == 1
        # etcd's own election after losing a member can delay a renewal past the fence on a
        # loaded machine (lease_ttl 3 s here); the leader then goes on under the fence's rule,
        # its follower holding every reply, and nobody steps down
        assert metric(addrs[0], "psd_coordinator_stepdowns_total") == 0
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(10)
        t0 = time.monotonic()
        harness.wait_until(lambda: coord(addrs[1])["role"] == "leader", TTL + 10, "the follower to be elected")
        took = time.monotonic() - t0
        assert tr.repl(addrs[1])["role"] == "leader"
        assert e.get("/psd/coordtest/part/0/leader").startswith(addrs[1] + " ")
        # the old leader comes back, with no --replica-of: it follows the leader etcd names
        procs[0] = start(cl, e, 0, addrs, 1)
        harness.wait_until(lambda: tr.repl(addrs[0])["role"] == "follower"
                           and tr.repl(addrs[0])["leader"] == addrs[1], 30, "the old leader to follow")
        res = tk.finish(ws)
        final = harness.status(addrs[1])["version"]
        assert final == 2 * steps, final  # every step's push applied once
        assert min(res["reconnects_all"]) >= 1, res  # the workers went over to the new leader
        harness.wait_until(lambda: tr.in_sync(procs[1], procs[0]), 60, "the old leader in sync as a follower")
        assert coord(addrs[0])["role"] == "follower" and coord(addrs[1])["elections"] == 1
        text = harness.psctl(addrs[1], "status").stdout
        assert "coordinator: this psd holds /psd/coordtest/part/0/leader" in text, text
        harness.wait_until(lambda: coord(addrs[0])["listed"], 30, "the in-sync key to name the old leader")
        text = harness.psctl(addrs[0], "status").stdout
        assert ("coordinator: follower; /psd/coordtest/part/0/leader names %s; in the in-sync set" % addrs[1]) in text, \
            text
        print("kill -9: the follower led %.2f s later (lease_ttl %d s); final version %d, AUC %.4f"
              % (took, TTL, final, res["auc"]), file=sys.stderr)


def test_a_stopped_leader_is_fenced_and_steps_down():
    with harness.Cluster("psd-coord-stop") as cl, etcd.Etcd(cl.dir, members=1) as e:
        addrs, procs = two_replicas(cl, e)
        steps = 300
        ws = tr.start_workers(cl, "/".join(addrs), steps=steps, pace=0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        harness.wait_until(lambda: coord(addrs[1])["listed"], 30, "the key to name the follower in sync")
        os.kill(procs[0].pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            harness.wait_until(lambda: coord(addrs[1])["role"] == "leader", TTL + 10, "the follower to be elected")
            took = time.monotonic() - t0
            # not before the stopped leader's fence: its last renewal, at most a third of
            # lease_ttl (and a timer step) before the stop, plus 2/3 of lease_ttl
            assert took > TTL / 4, took
        finally:
            os.kill(procs[0].pid, signal.SIGCONT)
        harness.wait_until(lambda: coord(addrs[0])["role"] == "follower", 30, "the old leader to step down")
        # past its fence the old leader answers only what its follower had fetched: a fetch
        # the follower sent before the stop, read after SIGCONT, may still release a reply
        # or two of pushes the follower holds (the final version below shows none was lost)
        sent = metric(addrs[0], "psd_fenced_replies_sent_total")
        assert sent <= 4, sent
        assert "no longer leads part 0" in procs[0].stderr()
        res = tk.finish(ws)
        final = harness.status(addrs[1])["version"]
        # a push the old leader had acknowledged and the new one lacked would
        # not have been sent again: the count would fall short
        assert final == 2 * steps, final
        harness.wait_until(lambda: tr.repl(addrs[0])["role"] == "follower"
                           and tr.in_sync(procs[1], procs[0]), 60, "the old leader in sync as a follower")
        held = metric(addrs[0], "psd_fenced_replies_held_total")
        print("SIGSTOP: the follower led %.2f s later (lease_ttl %d s); the old leader held %d replies past its "
              "fence and sent %d, each of a push its follower held; final version %d" % (took, TTL, held, sent, final),
              file=sys.stderr)


def test_a_follower_out_of_the_in_sync_set_is_not_elected():
    """A follower stopped past max_replica_lag leaves the in-sync set, and the
    leader writes the smaller set to etcd (/psd/JOB/part/N/insync) before it
    acknowledges pushes without it. When the leader then dies, that follower,
    which lacks pushes the leader acknowledged alone, does not take over."""
    with harness.Cluster("psd-coord-stale") as cl, etcd.Etcd(cl.dir, members=1) as e:
        addrs, procs = two_replicas(cl, e)
        ws = tr.start_workers(cl, "/".join(addrs), steps=3000, pace=0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        harness.wait_until(lambda: e.get("/psd/coordtest/part/0/insync") == addrs[1], 30,
                           "etcd's in-sync key to name the follower")
        os.kill(procs[1].pid, signal.SIGSTOP)
        try:
            harness.wait_until(lambda: e.get("/psd/coordtest/part/0/insync") == "", 30,
                               "the leader to write the in-sync set without the stopped follower")
            at = min(tk.steps_done(w) for w in ws)
            harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= at + 10, 60,
                               "pushes acknowledged without the stopped follower")
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
        finally:
            os.kill(procs[1].pid, signal.SIGCONT)
        harness.wait_until(lambda: e.get("/psd/coordtest/part/0/leader") is None, TTL + 10,
                           "the dead leader's lease to lapse")
        # the follower has read the key gone (its status names no leader) and is not listed
        harness.wait_until(lambda: coord(addrs[1])["leader"] == "", 30, "the follower to see no leader")
        c = coord(addrs[1])
        assert c["role"] == "follower" and not c["listed"] and c["elections"] == 0, c
        assert "campaigning" not in procs[1].stderr()
        for w in ws:
            w.kill()


def test_losing_etcds_majority_stops_failover_not_training():
    """Two of etcd's three members killed mid-job: the leader cannot renew
    its lease, passes its fence, and goes on acknowledging pushes because its
    follower is in sync and holds each of them; psd says plainly, in its log,
    status and metrics, that the part cannot fail over. The job ends with
    every step's push applied once."""
    with harness.Cluster("psd-coord-quorum") as cl, etcd.Etcd(cl.dir, members=3) as e:
        addrs, procs = two_replicas(cl, e)
        steps = 1500
        ws = tr.start_workers(cl, "/".join(addrs), steps=steps, pace=0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        harness.wait_until(lambda: coord(addrs[1])["listed"], 30, "the in-sync key to name the follower")
        e.members[1].kill()
        e.members[2].kill()
        harness.wait_until(lambda: coord(addrs[0])["fenced"] and not coord(addrs[0])["can_fail_over"], 4 * TTL,
                           "the leader past its fence, etcd unreachable")
        at = min(tk.steps_done(w) for w in ws)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= at + 50, 60,
                           "the workers going on without etcd's majority")
        assert metric(addrs[0], "psd_fenced_replies_sent_total") > 0
        assert metric(addrs[0], "psd_coordinator_can_fail_over") == 0
        assert coord(addrs[0])["role"] == "leader" and coord(addrs[1])["role"] == "follower"
        assert "this part cannot fail over until it does" in procs[0].stderr()
        assert "CANNOT FAIL OVER" in harness.psctl(addrs[0], "status").stdout
        res = tk.finish(ws)
        final = harness.status(addrs[0])["version"]
        assert final == 2 * steps, final
        print("etcd's majority lost: the leader acknowledged %d replies past its fence, every one held by its "
              "follower; final version %d" % (metric(addrs[0], "psd_fenced_replies_sent_total"), final),
              file=sys.stderr)


def test_a_leader_stopped_by_sigterm_hands_its_part_back():
    """SIGTERM of the leader: the follower leads well before a lapse of the
    leader's lease (lease_ttl 10 s) could have made it, and the workers
    finish with every step's push applied once."""
    ttl = 10
    with harness.Cluster("psd-coord-handback") as cl, etcd.Etcd(cl.dir, members=1) as e:
        addrs, procs = two_replicas(cl, e, ttl=ttl)
        steps = 600
        ws = timed_workers(cl, "/".join(addrs), steps, 0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 1, 60, "the follower in sync")
        harness.wait_until(lambda: coord(addrs[1])["listed"], 30, "the key to name the follower in sync")
        at = min(tk.steps_done(w) for w in ws)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= at + 20, 60, "steps in sync")
        since = time.monotonic()
        os.kill(procs[0].pid, signal.SIGTERM)
        harness.wait_until(lambda: coord(addrs[1])["role"] == "leader", ttl + 20, "the follower to be elected")
        took = time.monotonic() - since
        assert procs[0].wait(30) == 0  # it stopped as psd stops (its last checkpoint written)
        err = procs[0].stderr()
        assert "SIGTERM: this leader hands part 0 of job coordtest back" in err, err[-3000:]
        assert "part 0's key deleted" in err, err[-3000:]
        assert "handed part 0 back naming this follower" in procs[1].stderr()
        assert e.get("/psd/coordtest/part/0/leader").startswith(addrs[1] + " ")
        assert e.get("/psd/coordtest/part/0/handback") is None  # the election deleted it
        res = tk.finish(ws)
        final = harness.status(addrs[1])["version"]
        assert final == 2 * steps, final  # every step's push applied once: none lost, none twice
        assert min(res["reconnects_all"]) >= 1, res
        pause, n = longest_pause(ws, since - 1.0)
        # a lapse alone takes lease_ttl (10 s) and max_replica_lag more
        assert pause < ttl / 2, (pause, n)
        assert coord(addrs[1])["elections"] == 1
        print("SIGTERM: the follower led %.2f s later; the longest time without a step acknowledged was %.2f s "
              "(lease_ttl %d s); final version %d" % (took, pause, ttl, final), file=sys.stderr)


def test_a_leader_without_a_follower_in_sync_stops_as_before():
    """SIGTERM of a leader that has no follower: nothing is handed back,
    psd stops at once and its key is left to lapse."""
    with harness.Cluster("psd-coord-alone") as cl, etcd.Etcd(cl.dir, members=1) as e:
        addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(1)]
        p = start(cl, e, 0, addrs, 0, ttl=10)
        harness.wait_until(lambda: coord(addrs[0])["role"] == "leader", 30, "psd0 to lead")
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(30) == 0
        assert "hands part" not in p.stderr()
        assert e.get("/psd/coordtest/part/0/leader").startswith(addrs[0] + " ")  # its lease lapses later


def test_the_newest_in_sync_follower_is_elected():
    """A leader and two followers in sync. The follower with the lower
    address is held behind (PSD_TEST_FOLLOW_HOLD: it drops the answers and
    fetches nothing while a file exists) for less than max_replica_lag, so
    it stays in the in-sync set while the other fetches the pushes the
    leader applied since. kill -9 of the leader: the held one is first, by
    3 s, to have heard nothing for max_replica_lag, but the other holds more of the
    log (its position key, /psd/JOB/part/N/pos/ADDR), so the held one
    defers to it and the newer one is elected; the job ends with every
    step's push applied once."""
    lag = 8  # max_replica_lag, s: the held follower stays in sync meanwhile
    with harness.Cluster("psd-coord-newest") as cl, etcd.Etcd(cl.dir, members=1) as e:
        hold = os.path.join(cl.dir, "hold")
        addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(3)]
        lo, hi = sorted(addrs[1:])  # held: the one the tie-break (the address's text) would prefer
        more = ("--set", "max_replica_lag=%ds" % lag)
        procs = [start(cl, e, 0, addrs, 0, more=more)]
        harness.wait_until(lambda: coord(addrs[0])["role"] == "leader", 30, "psd0 to lead")
        for i in (1, 2):
            env = dict(os.environ, PSD_TEST_FOLLOW_HOLD=hold) if addrs[i] == lo else None
            procs.append(start(cl, e, i, addrs, 0, leader=addrs[0], more=more, env=env))
        steps = 1200
        ws = tr.start_workers(cl, "/".join(addrs), steps=steps, pace=0.01)
        harness.wait_until(lambda: min(tk.steps_done(w) for w in ws) >= 20, 120, "the workers' first steps")
        harness.wait_until(lambda: tr.repl(addrs[0])["insync"] == 2, 60, "both followers in sync")
        harness.wait_until(lambda: coord(addrs[1])["listed"] and coord(addrs[2])["listed"], 30,
                           "the in-sync key to name both followers")
        open(hold, "w").close()  # lo holds: pushes go on to hi (and wait for lo's fetch)
        try:
            def behind():
                end = tr.repl(addrs[0])["log_end"]
                return tr.repl(hi)["applied"] == end > tr.repl(lo)["applied"]
            harness.wait_until(behind, lag / 2, "the held follower to lack what the other holds")

            def silent(s):  # the leader has heard nothing from lo for s seconds, and both are in sync
                r = tr.repl(addrs[0])
                f = [f for f in r["followers"] if f["addr"] == lo]
                return r["insync"] == 2 and f and f[0]["last_fetch"] >= s
            # lo's silence starts 3 s before the other's: it is first to campaign, by far
            harness.wait_until(lambda: silent(3), lag - 2, "the held follower silent for 3 s, still in sync")
            os.kill(procs[0].pid, signal.SIGKILL)
            procs[0].wait(10)
            harness.wait_until(lambda: coord(hi)["role"] == "leader" or coord(lo)["role"] == "leader",
                               TTL + lag + 20, "a follower to be elected")
        finally:
            os.remove(hold)
        assert coord(hi)["role"] == "leader", (coord(hi), coord(lo))
        assert "lets it campaign first" in procs[addrs.index(lo)].stderr()
        harness.wait_until(lambda: tr.repl(lo)["role"] == "follower" and tr.repl(lo)["leader"] == hi, 30,
                           "the other follower to follow the new leader")
        res = tk.finish(ws)
        final = harness.status(hi)["version"]
        assert final == 2 * steps, final
        print("kill -9 with two followers: %s, newer, was elected over %s, held behind; final version %d, AUC %.4f"
              % (hi, lo, final, res["auc"]), file=sys.stderr)


def test_a_job_name_held_by_another_job_is_refused():
    """/psd/JOB/job (server/coord/jobkey.c) holds the settings of the job
    that named it. A psd of another job (mode ssp, not asgd) given the same
    name while that job's leader holds its lease stops at start, exit
    status 1, saying which settings differ and who holds the keys; the
    leader goes on leading. Once that job is over (its leader killed, its
    lease lapsed), a psd of the other job takes the name and leads."""
    with harness.Cluster("psd-coord-jobname") as cl, etcd.Etcd(cl.dir, members=1) as e:
        addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(3)]
        a = start(cl, e, 0, addrs, 0)
        harness.wait_until(lambda: coord(addrs[0])["role"] == "leader", 30, "psd0 to lead")
        assert e.get("/psd/coordtest/job") == "mode=asgd workers=2 optimizer=adagrad replication=sync hogwild=no " \
                                              "table_apply=ordered by %s" % addrs[0]

        def other(i, n):
            return cl.psd(workers=2, mode="ssp", name="other%d-%d" % (i, n), args=tr.leader_args(
                cl, "other%d" % i, ("--listen", addrs[i], "--set", "coordinator=" + e.urls, "--set", "job=coordtest",
                                    "--set", "lease_ttl=%ds" % TTL)))
        b = other(1, 0)
        assert b.wait(30) == 1, b.stderr()
        err = b.stderr()
        assert 'job "coordtest" is held by another job: etcd\'s /psd/coordtest/job says mode=asgd' in err, err
        assert "this psd's settings are mode=ssp workers=2" in err, err
        assert "/psd/coordtest/part/0/leader: %s " % addrs[0] in err, err
        assert coord(addrs[0])["role"] == "leader"
        # a psd of the job itself goes on
        c = start(cl, e, 2, addrs, 0, leader=addrs[0])
        harness.wait_until(lambda: coord(addrs[2])["role"] == "follower", 30, "psd2 to follow")
        assert "held by another job" not in c.stderr()
        for p in (a, c):
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        harness.wait_until(lambda: e.get("/psd/coordtest/part/0/leader") is None, 3 * TTL + 10,
                           "the old job's lease to lapse")
        harness.wait_until(lambda: not any(k.startswith("/psd/coordtest/part/0/pos/") for k in e.keys("/psd/")),
                           3 * TTL + 10, "the old follower's lease to lapse")
        b = other(1, 1)
        harness.wait_until(lambda: coord(addrs[1])["role"] == "leader", 30, "the other job's psd to lead")
        assert "is of a job with no psd left" in b.stderr()
        assert e.get("/psd/coordtest/job").startswith("mode=ssp ")


def test_an_etcd_that_does_not_answer_at_start():
    """etcd down when psd starts: psd says so at once (an ERROR naming the
    member and what it does meanwhile; status: coordinator unreachable, role
    starting), acknowledges nothing, and leads once etcd answers."""
    with harness.Cluster("psd-coord-noetcd") as cl, etcd.Etcd(cl.dir, members=1) as e:
        e.members[0].kill()
        addrs = ["127.0.0.1:%d" % p for p in harness.free_ports(1)]
        p = start(cl, e, 0, addrs, 0)
        harness.wait_until(lambda: "etcd does not answer" in p.stderr(), 30, "psd to say etcd does not answer")
        line = [l for l in p.stderr().splitlines() if "etcd does not answer" in l][0]
        assert " ERROR " in line and e.members[0].client in line, line
        assert "acknowledges no push before it holds the part's lease" in line, line
        c = coord(addrs[0])
        assert c["role"] == "starting" and not c["can_fail_over"] and c["unreachable"] > 0 and c["error"], c
        # a worker is sent away until psd knows whether it leads (taken now, it
        # would wait on a psd that may turn out to follow)
        with harness.RawClient(addrs[0], 10) as w:
            r = w.hello_worker([["u", [4]], ["b", [1]]], 0, 2)
            assert r["t"] == harness.T_ERROR and r["code"] == 25 and "does not know yet whether it leads" in r["text"], r
        e.members[0].restart()
        harness.wait_until(lambda: coord(addrs[0])["role"] == "leader", 60, "psd to lead once etcd answers")
        assert "etcd answers again" in p.stderr()
