#!/usr/bin/python3
"""test_plan_split.py - a planned BSP job over a model split on 2 psd, with
one worker's link to one psd cut while the other still sees it.

    test_plan_split.py [harness options] [unittest options]

Three workers train by psd's plan over psd 0 and psd 1 (proto/PROTOCOL.md
6.2). Shard 2 reaches psd c (1, then 0) through a TCP relay of this test's;
a quarter into the job (counted in the bytes psd c sent it) the relay stops
forwarding (both ways, the connection stays open) until psd c declares
shard 2 lost (heartbeat_timeout) while the other psd keeps it (its
heartbeats go on there), and then goes on.

Each psd fixes its own rounds' workers; the client takes the slices from
the first. Before libpsclient left every part when it lost one, this job
stood still once the link was back (PROTOCOL.md 8 tells how); now:

- psd c declares shard 2 lost and goes on without it; the other psd waits
  for its push;
- when the link is back shard 2's step fails on psd c, and the library
  leaves every psd and says hello to each again, so the other psd closes
  its round without it too;
- each psd names in its WELCOME the round it would take shard 2 back at
  (its next), which may differ by one or two; shard 2 tells both the later
  one, and both take it back there (before, each took it back at its own:
  its steps then landed a round apart on the two parts, or, two rounds
  apart, the job stood still);
- the workers end each step with a BARRIER on psd 0 (--barrier on, as
  between machines): shard 2, should its parts' versions differ, withdraws
  from it instead of holding the others back;
- every worker then trains to the plan's last round on both parts; a
  round may count shard 2's push on one part and not on the other only
  where its workers change (the round shard 2 is lost in: each psd
  declares it lost on its own).

test_new_worker_process_rejoins_both_parts_at_one_round: a new process of
shard 2 joins while psd 1 is a round ahead of psd 0 (held so, the other
workers' pushes to psd 0 held back in a relay): each psd alone would take
it back at its next round, a round apart; both take it back at the later.
"""

import os
import re
import select
import selectors
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

EPOCHS = 6
LIMIT = 6000
BATCH = 16          # per worker: a global batch of 3 x 16
MODEL = "mlp:64"    # 50,890 values: parts [0, 24576) and [24576, 50890)
HB = 1.0            # heartbeat_timeout, seconds


class Relay:
    """A TCP relay on 127.0.0.1 to upstream: each accepted connection gets
    its own upstream connection, and bytes are forwarded both ways by one
    thread. It cuts itself (stops forwarding: nothing is read, nothing
    closed, the peers see silence) once cut_after bytes have come from
    upstream, and sets .cut_done; heal() goes on; an end closed on one side
    is closed on the other once forwarding goes on."""

    def __init__(self, upstream, cut_after):
        self.upstream = upstream
        self.cut_after = cut_after
        self.down = 0  # bytes forwarded from upstream
        self.cut_done = threading.Event()
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.peer = {}
        self.upstreams = set()
        self.cutting = threading.Event()
        self.healed = threading.Event()
        self.stopping = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def heal(self):
        self.cutting.clear()
        self.healed.set()

    def _close(self, s):
        for x in (s, self.peer.pop(s, None)):
            if x is None:
                continue
            self.peer.pop(x, None)
            self.upstreams.discard(x)
            try:
                self.sel.unregister(x)
            except (KeyError, ValueError):
                pass
            x.close()

    def _run(self):
        while not self.stopping.is_set():
            if self.cutting.is_set():
                self.healed.wait(0.05)
                continue
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                if s is self.lsock:
                    c, _ = self.lsock.accept()
                    host, port = self.upstream.split(":")
                    u = socket.create_connection((host, int(port)))
                    self.peer[c], self.peer[u] = u, c
                    self.upstreams.add(u)
                    self.sel.register(c, selectors.EVENT_READ, None)
                    self.sel.register(u, selectors.EVENT_READ, None)
                    self.connections += 1
                    continue
                if s not in self.peer:
                    continue
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    self._close(s)
                    continue
                try:
                    self.peer[s].sendall(data)
                except OSError:
                    self._close(s)
                    continue
                if s in self.upstreams:
                    self.down += len(data)
                    if self.down >= self.cut_after and not self.cut_done.is_set():
                        # the cut lands at this point of the job, whatever
                        # the machine's speed (polling psd's version from
                        # here raced the job's end under load)
                        self.cutting.set()
                        self.cut_done.set()
                        break

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        for s in list(self.peer):
            self._close(s)
        self.lsock.close()


class HoldRelay:
    """A TCP relay on 127.0.0.1 to upstream, one thread, that can hold
    what its clients send (hold(): bytes from the client side are left
    unread, so they wait in the kernel; psd's replies still reach the
    client) until release(). .held is set once a client's bytes wait."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.addr = "127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.peer = {}
        self.clients = set()
        self.holding = threading.Event()
        self.held = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def hold(self):
        self.holding.set()

    def release(self):
        self.holding.clear()

    def _close(self, s):
        for x in (s, self.peer.pop(s, None)):
            if x is None:
                continue
            self.peer.pop(x, None)
            self.clients.discard(x)
            try:
                self.sel.unregister(x)
            except (KeyError, ValueError):
                pass
            x.close()

    def _run(self):
        watched = True  # the clients' sockets are in the selector
        while not self.stopping.is_set():
            holding = self.holding.is_set()
            if holding == watched:
                # held sockets stay readable: out of the selector while held
                for c in self.clients:
                    if holding:
                        self.sel.unregister(c)
                    else:
                        self.sel.register(c, selectors.EVENT_READ, None)
                watched = not holding
            if holding and not self.held.is_set() and select.select(list(self.clients), [], [], 0)[0]:
                self.held.set()
            for key, _ in self.sel.select(0.05):
                s = key.fileobj
                if s is self.lsock:
                    c, _ = self.lsock.accept()
                    host, port = self.upstream.split(":")
                    u = socket.create_connection((host, int(port)))
                    self.peer[c], self.peer[u] = u, c
                    self.clients.add(c)
                    if watched:
                        self.sel.register(c, selectors.EVENT_READ, None)
                    self.sel.register(u, selectors.EVENT_READ, None)
                    continue
                if s not in self.peer:
                    continue
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    self._close(s)
                    continue
                try:
                    self.peer[s].sendall(data)
                except OSError:
                    self._close(s)

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        for s in list(self.peer):
            self._close(s)
        self.lsock.close()


def rounds_in_plan(epochs, samples, batch):
    return epochs * ((samples + batch - 1) // batch)


def members_log(log):
    """[(round, workers)] from psd's "plan: round R (epoch E) is trained by
    N of 3 workers" lines: the rounds whose members changed."""
    return [(int(r), int(n)) for r, n in re.findall(r"plan: round (\d+) \(epoch \d+\) is trained by (\d+) of 3", log)]


def pushes_log(log):
    """{round: pushes it closed with} from psd's debug lines."""
    return {int(r): int(n) for r, n in re.findall(r"round (\d+) closed with (\d+) pushes", log)}


class PlanSplitTest(unittest.TestCase):
    def cut_one_part(self, c):
        """Shard 2's link to psd c (0 or 1) is cut; the other psd, o, keeps
        it. Asserts that the job goes on and how it ends."""
        o = 1 - c
        gb = 3 * BATCH
        rounds = rounds_in_plan(EPOCHS, LIMIT, gb)
        with harness.Cluster("psd-plan-split") as cl:
            # debug: psd logs how many pushes each round closed with
            args = ["--set", "heartbeat_timeout=%gs" % HB, "--log-level", "debug"]
            psds = [cl.psd(mode="bsp", workers=3, name="psd%d" % i, args=args) for i in range(2)]
            # cut a quarter into the job: the replies of psd c to shard 2
            # (PARAMS of its part, as float32 over TCP) for that many rounds
            part = [24576, 50890 - 24576][c]
            relay = Relay(psds[c].addr, (rounds // 4) * part * 4)
            try:
                direct = [p.addr for p in psds]
                via = list(direct)
                via[c] = relay.addr
                servers = [",".join(direct)] * 2 + [",".join(via)]
                ws = [cl.worker(servers[k], k, 3, epochs=EPOCHS, batch=BATCH, limit=LIMIT, model=MODEL,
                                evaluate=False, args=["--reconnect-timeout", "60", "--barrier", "on"])
                  for k in range(3)]
                harness.wait_until(relay.cut_done.is_set, 60, "shard 2's link to be cut a quarter into the job")
                self.assertTrue(all(w.alive() for w in ws), "the job ended before the cut")
                try:
                    harness.wait_until(lambda: re.search(r"worker shard 2/3 \S+ lost", psds[c].stderr()),
                                       10 + HB, "psd %d to declare shard 2 lost" % c)
                    sto = harness.status(psds[o].addr)
                    self.assertEqual([w["state"] for w in sto["workers"] if w["shard"] == 2], ["connected"],
                                     "psd %d lost shard 2 too" % o)
                finally:
                    relay.heal()
                back = harness.wait_until(
                    lambda: re.search(r"worker shard 2/3 rejoined from \S+ at model version (\d+)",
                                      psds[c].stderr()), 30, "shard 2 to rejoin psd %d" % c)
                # shard 2 left psd o too and said hello again: both parts take
                # it back at their next round, and the job goes on
                harness.wait_until(lambda: re.search(r"worker shard 2/3 rejoined", psds[o].stderr()), 30,
                                   "shard 2 to leave and rejoin psd %d" % o)
                results = harness.finish(self, ws, 180)
                sts = [harness.status(p.addr) for p in psds]
                logs = [p.stderr() for p in psds]
            finally:
                relay.close()
            changes = [members_log(log) for log in logs]
            counted = [pushes_log(log) for log in logs]
            differ = [r for r in range(rounds) if counted[0].get(r) != counted[1].get(r)]
            sys.stderr.write("\nshard 2 cut from psd %d: plan of %d rounds; workers per part (from round, "
                             "workers): psd 0 %r, psd 1 %r; rounds closed with another number of pushes on each "
                             "part (round, psd 0's, psd 1's): %r\n" %
                             (c, rounds, changes[0], changes[1],
                              [(r, counted[0].get(r), counted[1].get(r)) for r in differ]))
            self.assertEqual(sorted(counted[0]), list(range(rounds)))
            self.assertEqual(sorted(counted[1]), list(range(rounds)))
            # the job ends at the plan's last round on both parts, every worker with it
            for st in sts:
                self.assertEqual(st["version"], rounds)
                self.assertTrue(st["plan"]["done"], st["plan"])
            for r in results:
                self.assertEqual(r["version"], rounds)
            # both parts went on without shard 2 (which said hello to both
            # again, above; whether it trains again before the job's end
            # depends on how fast the others finish it); a round
            # counts another number of pushes on the two parts only beside
            # a change of its workers (the round shard 2 was lost in, or
            # rejoined at, whose membership each psd fixes on its own)
            for ch in changes:
                self.assertIn(2, [n for _, n in ch], changes)
            moves = {r for ch in changes for r, _ in ch[1:]}
            # both parts take shard 2 back at one round, the later of the
            # two their WELCOMEs named (it tells both: PROTOCOL.md 8), when
            # it trains again before the job's end
            # (the round after each part's last round of 2 pushes; a part
            # that named the earlier round logs it trained by 3, then
            # leaves shard 2 out when told the later)
            backs = [max(r for r in range(rounds) if cnt[r] == 2) + 1 for cnt in counted]
            self.assertEqual(backs[0], backs[1], (changes, differ))
            self.assertTrue(all(r in moves or r + 1 in moves for r in differ), (differ, changes))
            self.assertLessEqual(len(differ), len(moves), (differ, changes))
            for p in psds:
                p.stop()

    def test_new_worker_process_rejoins_both_parts_at_one_round(self):
        """Shard 2's process dies and a new one joins the running job while
        psd 1 is a round ahead of psd 0 (the others' pushes to psd 0 held
        back): each psd alone would take it back at its next round, a round
        apart (its steps then land a round apart on the two parts, or, two
        rounds apart, the job stands still); it tells both the later
        round, and both take it back there (PROTOCOL.md 8, "The plan")."""
        epochs = 3
        gb = 3 * BATCH
        rounds = rounds_in_plan(epochs, LIMIT, gb)
        with harness.Cluster("psd-plan-rejoin") as cl:
            # the hold lasts seconds: nobody is declared lost meanwhile
            args = ["--set", "heartbeat_timeout=60s", "--log-level", "debug"]
            psds = [cl.psd(mode="bsp", workers=3, name="psd%d" % i, args=args) for i in range(2)]
            relays = [HoldRelay(psds[0].addr) for _ in range(2)]
            try:
                def worker(k, servers, name=None):
                    return cl.worker(",".join(servers), k, 3, epochs=epochs, batch=BATCH, limit=LIMIT, model=MODEL,
                                     evaluate=False, args=["--reconnect-timeout", "60"], name=name)

                # shards 0 and 1 reach psd 0 through a relay each
                ws = [worker(k, [relays[k].addr, psds[1].addr]) for k in range(2)]
                old = worker(2, [psds[0].addr, psds[1].addr], name="shard2-old")
                harness.wait_until(lambda: harness.version(psds[0].addr) >= 5, 60, "the job to train 5 rounds")
                old.kill()
                for p in psds:
                    harness.wait_until(lambda: re.search(r"worker shard 2/3 \S+ lost", p.stderr()), 10,
                                       "%s to lose shard 2" % p.name)
                # the others' pushes to psd 0 wait in the relays: psd 1
                # closes the round they pushed, psd 0 does not
                for r in relays:
                    r.hold()

                def apart():
                    # held: a worker's step sent bytes after the hold, and
                    # psd 0 lacks that worker's last push, which psd 1 has
                    sts = [harness.status(p.addr) for p in psds]
                    v = [st["version"] for st in sts]
                    pushes = [[(harness.worker_row(st, k) or {}).get("pushes", 0) for k in range(2)] for st in sts]
                    if v[1] != v[0] + 1 or not any(relays[k].held.is_set() and pushes[0][k] < pushes[1][k]
                                                   for k in range(2)):
                        return None
                    return v if [harness.version(p.addr) for p in psds] == v else None

                v = harness.wait_until(apart, 30, "psd 1 to be a round ahead of psd 0, held back")
                self.assertLess(v[1], rounds - 10, "the job is nearly over: %r of %d rounds" % (v, rounds))
                new = worker(2, [psds[0].addr, psds[1].addr], name="shard2-new")
                for p in psds:
                    harness.wait_until(lambda: re.search(r"worker shard 2/3 rejoined", p.stderr()), 30,
                                       "the new shard 2 to say hello to %s" % p.name)
                self.assertEqual([harness.version(p.addr) for p in psds], v, "a part moved while held")
                for r in relays:
                    r.release()
                results = harness.finish(self, ws + [new], 180)
                sts = [harness.status(p.addr) for p in psds]
                logs = [p.stderr() for p in psds]
            finally:
                for r in relays:
                    r.close()
            counted = [pushes_log(log) for log in logs]
            sys.stderr.write("\nparts %r when the new shard 2 said hello; rounds %d..%d closed with pushes: psd 0 %r, "
                             "psd 1 %r\n" % (v, v[0], v[1] + 3, [counted[0].get(r) for r in range(v[0], v[1] + 4)],
                                              [counted[1].get(r) for r in range(v[0], v[1] + 4)]))
            for st in sts:
                self.assertEqual(st["version"], rounds)
                self.assertTrue(st["plan"]["done"], st["plan"])
            for r in results:
                self.assertEqual(r["version"], rounds)
            # psd 0 named round v0 + 1 in its WELCOME, psd 1 round v1 + 1 =
            # v0 + 2: both take shard 2 back at v0 + 2, the later; the
            # rounds between go without it on both
            back = v[1] + 1
            for c in counted:
                self.assertEqual(sorted(c), list(range(rounds)))
            # from the hold on, every round counts the same pushes on both
            # parts, shard 2's among them from round `back` to the last
            self.assertEqual([counted[0][r] for r in range(v[0], rounds)], [counted[1][r] for r in range(v[0], rounds)],
                             "the parts counted other pushes from round %d on" % v[0])
            # (round v0 may count the dead process's push: it made its step)
            self.assertEqual([counted[0][r] for r in range(v[1], back + 1)], [2] * (back - v[1]) + [3])
            self.assertEqual({counted[0][r] for r in range(back, rounds)}, {3})
            self.assertTrue(re.search(r"plan: shard 2 rejoins at round %d " % back, logs[0]),
                            "psd 0 does not say it takes shard 2 back at round %d" % back)
            for p in psds:
                p.stop()

    def test_worker_cut_from_the_second_part(self):
        self.cut_one_part(1)

    def test_worker_cut_from_the_first_part(self):
        self.cut_one_part(0)


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
