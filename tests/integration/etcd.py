"""etcd.py - an etcd cluster for the tests of psd's coordinator (issue 44).

Etcd(workdir, members=3) starts that many etcd members (Debian's
etcd-server) on loopback ports picked free (harness.free_port), each with its data
in a directory of workdir, waits until every member answers a read of the
v3 API (a request answered, not a sleep), and stops them (kill) on
close(); a member killed (kill(), SIGKILL) comes back with restart().
.urls is the `coordinator` value psd takes. why_no_etcd() says why a
test must skip (etcd not installed), or None.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.request

from harness import free_ports, tail, wait_until


def why_no_etcd():
    if not shutil.which("etcd"):
        return "etcd not found (Debian package etcd-server)"
    return None


class Member:
    def __init__(self, name, client_port, peer_port, workdir):
        self.name = name
        self.client = "http://127.0.0.1:%d" % client_port
        self.peer = "http://127.0.0.1:%d" % peer_port
        self.data = os.path.join(workdir, name + ".etcd")
        self.log = os.path.join(workdir, name + ".etcd.log")
        self.p = None

    def start(self, cluster):
        self.cluster = cluster
        argv = ["etcd", "--name", self.name, "--data-dir", self.data,
                "--listen-client-urls", self.client, "--advertise-client-urls", self.client,
                "--listen-peer-urls", self.peer, "--initial-advertise-peer-urls", self.peer,
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "psd-test", "--log-level", "warn",
                # fast elections on loopback: a lost member's absence is noticed within a second
                "--heartbeat-interval", "50", "--election-timeout", "500"]
        self._log = open(self.log, "ab")  # a restart's lines after the first run's
        self.p = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def answers(self):
        """Whether the member answers a read of the v3 API (a serializable
        one when its cluster has no leader would still answer: ask for a
        linearizable read, which needs a quorum)."""
        if not self.alive():
            raise AssertionError("etcd %s exited with %s:\n%s" % (self.name, self.p.returncode, tail(self.log)))
        try:
            req = urllib.request.Request(self.client + "/v3/kv/range", data=json.dumps({"key": "AA=="}).encode(),
                                         method="POST")
            with urllib.request.urlopen(req, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def restart(self):
        """Starts the member again on its ports and data (after kill()): it
        rejoins its cluster from its own write-ahead log."""
        assert not self.alive(), self.name
        self.start(self.cluster)

    def kill(self):
        if self.alive():
            self.p.kill()
            self.p.wait(timeout=10)
        if self.p is not None:
            self._log.close()


class Etcd:
    def __init__(self, workdir, members=3, timeout=60):
        self.members = []
        ports = free_ports(2 * members)
        for i in range(members):
            self.members.append(Member("e%d" % i, ports[2 * i], ports[2 * i + 1], workdir))
        cluster = ",".join("%s=%s" % (m.name, m.peer) for m in self.members)
        try:
            for m in self.members:
                m.start(cluster)
            for m in self.members:
                wait_until(m.answers, timeout, "etcd member %s to answer" % m.name)
        except BaseException:
            self.close()
            raise
        self.urls = ",".join(m.client for m in self.members)

    def keys(self, prefix):
        """The keys under prefix (str), through the first live member."""
        import base64
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        for m in self.members:
            if not m.alive():
                continue
            body = {"key": base64.b64encode(prefix.encode()).decode(),
                    "range_end": base64.b64encode(end.encode()).decode(), "keys_only": True}
            req = urllib.request.Request(m.client + "/v3/kv/range", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                return [base64.b64decode(kv["key"]).decode() for kv in json.load(r).get("kvs", [])]
        return []

    def get(self, key):
        """The value of key (str) through the first live member, or None."""
        import base64
        for m in self.members:
            if not m.alive():
                continue
            req = urllib.request.Request(m.client + "/v3/kv/range",
                                         data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
                                         method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                kvs = json.load(r).get("kvs", [])
            return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None  # "" is left out
        return None

    def close(self):
        for m in self.members:
            m.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


if __name__ == "__main__":
    # a look by hand: a 3-member cluster up, then down
    import tempfile
    d = tempfile.mkdtemp(prefix="etcd-")
    t = time.monotonic()
    with Etcd(d) as e:
        print("3 members answer at %s after %.2f s" % (e.urls, time.monotonic() - t))
    shutil.rmtree(d, ignore_errors=True)
