#!/usr/bin/python3
"""test_deploy.py - deploy/: the Kubernetes manifests, the container recipe, the Slurm script.

- deploy/k8s (4 parts, BSP) and its replicated variant, deploy/k8s/etcd and
  deploy/k8s/replicas (2 parts of 2 psd each, leaders elected through a
  3-member etcd), each pass `kubectl apply --dry-run=client -f DIR...`
  (kubectl from Debian's kubernetes-client, or any kubectl on PATH;
  skipped without one), with --validate=false: kubectl validates against
  the OpenAPI schema it downloads from the API server, and with no cluster
  there is none to download (the stub cannot serve Kubernetes' schema
  without a copy of it); the test checks the fields that matter itself
  instead. A client-side dry run still asks an API server which kinds
  exist (its discovery documents) and for the live object it would patch,
  so the test answers those from a stub on 127.0.0.1: the discovery of the
  groups the manifests use, and 404 for every object (nothing exists yet).
  No cluster and no other network is involved, and the stub answers
  nothing that changes what kubectl prints.
- Every pod (etcd's too) meets the Pod Security Standard "restricted", as
  a cluster that enforces it checks: runAsNonRoot, a non-root user, the
  RuntimeDefault seccomp profile, no privilege escalation, every
  capability dropped, only the volume types it allows; and every container
  (init containers too) has CPU and memory requests and limits, the image
  pinned to the project's version (not latest) and imagePullPolicy
  IfNotPresent; the token init containers copy without chown.
- What the objects say must agree: the workers' --server list is the psd
  StatefulSets' pod names through the headless Service, in part order, each
  part's replicas with / between; the ports of psd.conf, the containers,
  the Service and the probes; the workers count of psd.conf with the Job's
  completions and PSD_WORKERS; the token Secret of the documented command
  with the volumes; the state volume with state_dir. psd accepts each pod's
  command with the ConfigMap's psd.conf (--print-config, the pod's name put
  in for $(POD_NAME)), and psworker knows every option of the Job's command.
  With replicas: every replica of a part gives the same part and advertises
  its own DNS name, the coordinator is the etcd members' client URLs, and
  etcd's names, URLs and --initial-cluster agree with its StatefulSet and
  Service (and are flags the installed etcd knows).
- deploy/Containerfile's build stage starts from the base mmdebstrap makes
  (no registry) and installs the Debian package of deploy/deb/ with
  apt-get, which brings the libraries the package's Depends name; the image
  is an empty root with only what that stage copies (no RUN after it),
  every program a manifest runs (etcd too) among it; it runs as the user
  and exposes the ports the manifests use. tests/engines/test_image.py
  builds and runs it for real.
- deploy/slurm/psd-job.sbatch runs a whole job on this machine under stand-ins
  for srun and scontrol (one node, 127.0.0.1): psd part up, the worker
  trains, psctl saves the model, psd shuts down. And with PSD_REPLICAS=2
  and the job's own etcd (skipped without etcd, Debian's etcd-server): the
  leader psd killed with SIGKILL while the worker trains, the follower
  elected, the worker finishing with it, the model at exactly one version
  per step; the time from the kill to the election and to the new leader's
  first push is printed.
"""

import base64
import http.server
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import etcd  # noqa: E402
from harness import Paths  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
NAMESPACE = "psd-test"

# Discovery documents of the groups the manifests use: kind, plural name,
# whether namespaced.
RESOURCES = {
    "v1": [("ConfigMap", "configmaps", True), ("Service", "services", True), ("Secret", "secrets", True),
           ("PersistentVolumeClaim", "persistentvolumeclaims", True), ("Pod", "pods", True),
           ("Namespace", "namespaces", False)],
    "apps/v1": [("StatefulSet", "statefulsets", True)],
    "batch/v1": [("Job", "jobs", True)],
    "policy/v1": [("PodDisruptionBudget", "poddisruptionbudgets", True)],
    "networking.k8s.io/v1": [("NetworkPolicy", "networkpolicies", True)],
}


class StubApi(http.server.BaseHTTPRequestHandler):
    """Discovery for RESOURCES; 404 NotFound for everything else."""

    def log_message(self, *args):
        pass

    def reply(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        if path == "/api":
            return self.reply(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        if path == "/apis":
            groups = [{"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": "v1"}],
                       "preferredVersion": {"groupVersion": gv, "version": "v1"}} for gv in RESOURCES if "/" in gv]
            return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for gv, kinds in RESOURCES.items():
            if path == ("/api/" if gv == "v1" else "/apis/") + gv:
                return self.reply(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                                        "resources": [{"name": plural, "singularName": kind.lower(),
                                                       "namespaced": ns, "kind": kind, "verbs": verbs}
                                                      for kind, plural, ns in kinds]})
        self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                         "message": "%s not found" % path, "code": 404})


def read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def find_kubectl():
    return shutil.which("kubectl")


def settings(cmd):
    """The KEY=VALUE of every --set in a command, as a dict."""
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set")


def expand(arg, env):
    """arg with Kubernetes' $(VAR) references to env replaced, as the kubelet
    expands a container's command."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


class Manifests:
    """What every variant of deploy/k8s must pass, under kubectl apply
    --dry-run=client of its directories (DIRS): a subclass names them, the
    objects they make (CREATED) and the modes psd may run in them."""

    DIRS = ()
    CREATED = ()
    MODES = ()

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="psd-deploy-")
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubApi)
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()
        cls.kubeconfig = os.path.join(cls.dir, "kubeconfig")
        with open(cls.kubeconfig, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "stub",
                       "clusters": [{"name": "stub", "cluster": {"server": "http://127.0.0.1:%d" %
                                                                 cls.server.server_address[1]}}],
                       "contexts": [{"name": "stub", "context": {"cluster": "stub", "namespace": NAMESPACE}}],
                       "users": []}, f)
        r = cls.kubectl("apply", "--dry-run=client", "--validate=false", *cls.files(), "-o", "json")
        if r.returncode != 0:
            raise AssertionError("kubectl apply --dry-run=client %s failed:\n%s" % (" ".join(cls.files()), r.stderr))
        doc = json.loads(r.stdout)
        cls.objects = doc["items"] if doc.get("kind") == "List" else [doc]

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()
        cls.server.server_close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def files(cls):
        out = []
        for d in cls.DIRS:
            out += ["-f", d]
        return out

    @classmethod
    def kubectl(cls, *args):
        env = dict(os.environ, KUBECONFIG=cls.kubeconfig)
        return subprocess.run([find_kubectl(), "--cache-dir", os.path.join(cls.dir, "cache")] + list(args),
                              capture_output=True, text=True, timeout=60, env=env)

    def obj(self, kind, name):
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, "%s %s in %s (have: %s)" % (
            kind, name, self.DIRS, [(o["kind"], o["metadata"]["name"]) for o in self.objects]))
        return found[0]

    def conf(self):
        text = self.obj("ConfigMap", "psd-config")["data"]["psd.conf"]
        out = {}
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = (x.strip() for x in line.split("=", 1))
                out[k] = v
        return text, out

    def container(self, pod_spec, name):
        return next(c for c in pod_spec["containers"] if c["name"] == name)

    def pods_of(self, name):
        """The pod templates' specs of the objects whose pods are labelled
        app.kubernetes.io/name = name."""
        return [o for o in self.objects if "template" in o.get("spec", {})
                and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == name]

    def psd_sets(self):
        sets = self.pods_of("psd")
        self.assertTrue(sets and all(o["kind"] == "StatefulSet" for o in sets), "psd runs in StatefulSets")
        return sets

    def psd_pods(self):
        """[(part, replica, pod name, StatefulSet)] of every psd pod, by part
        then replica: without --set part=I in its command, pod I of the
        StatefulSet holds part I; with it, its pods are the replicas of part I."""
        out = []
        for sts in self.psd_sets():
            part = settings(self.container(sts["spec"]["template"]["spec"], "psd")["command"]).get("part")
            for i in range(sts["spec"]["replicas"]):
                name = "%s-%d" % (sts["metadata"]["name"], i)
                out.append((i, 0, name, sts) if part is None else (int(part), i, name, sts))
        return sorted(out, key=lambda t: t[:2])

    def pod_env(self, container, pod_name):
        """A container's environment as the kubelet gives it to pod pod_name:
        values, and the pod's name through the downward API."""
        env = {}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = pod_name
        return env

    def test_dry_run_creates_every_object(self):
        r = self.kubectl("apply", "--dry-run=client", "--validate=false", *self.files())
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = sorted(r.stdout.split("\n"))
        self.assertEqual([ln for ln in lines if ln], sorted(self.CREATED))
        for o in self.objects:
            self.assertEqual(o["metadata"]["namespace"], NAMESPACE, "every object is namespaced")
            self.assertEqual(o["metadata"]["labels"].get("app.kubernetes.io/part-of"), "psd")

    def test_restricted_pod_security(self):
        version = re.search(r"project\(psd VERSION (\S+)", read("CMakeLists.txt")).group(1)
        with_pods = [o for o in self.objects if "template" in o.get("spec", {})]
        self.assertEqual(sorted(o["kind"] for o in with_pods),
                         sorted(o["kind"] for o in self.objects if o["kind"] in ("StatefulSet", "Job", "Deployment",
                                                                                "DaemonSet", "Pod")))
        for o in with_pods:
            name = o["metadata"]["name"]
            pod = o["spec"]["template"]["spec"]
            psc = pod.get("securityContext", {})
            self.assertIs(psc.get("runAsNonRoot"), True, "%s: pod runAsNonRoot" % name)
            self.assertEqual(psc.get("seccompProfile", {}).get("type"), "RuntimeDefault", name)
            self.assertNotIn("hostNetwork", pod)
            self.assertNotIn("hostPID", pod)
            for v in pod["volumes"] if "volumes" in pod else []:
                kinds = set(v) - {"name"}
                self.assertLessEqual(kinds, {"configMap", "secret", "emptyDir", "persistentVolumeClaim",
                                             "projected", "downwardAPI", "csi", "ephemeral"},
                                     "%s: volume %s is of a type 'restricted' refuses" % (name, v["name"]))
            every = pod.get("initContainers", []) + pod["containers"]
            for c in every:
                what = "%s/%s" % (name, c["name"])
                sc = c.get("securityContext", {})
                self.assertIs(sc.get("runAsNonRoot", psc.get("runAsNonRoot")), True, what)
                uid = sc.get("runAsUser", psc.get("runAsUser"))
                self.assertIsNotNone(uid, what + ": no runAsUser (the image's USER would decide)")
                self.assertNotEqual(uid, 0, what + " runs as root")
                self.assertIs(sc.get("allowPrivilegeEscalation"), False, what)
                self.assertFalse(sc.get("privileged", False), what)
                self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"], what)
                self.assertLessEqual(set(sc.get("capabilities", {}).get("add", [])), {"NET_BIND_SERVICE"}, what)
                self.assertIs(sc.get("readOnlyRootFilesystem"), True, what)
                self.assertIn(sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type"),
                              ("RuntimeDefault", "Localhost"), what)
                res = c.get("resources", {})
                for kind_ in ("requests", "limits"):
                    for r in ("cpu", "memory"):
                        self.assertIn(r, res.get(kind_, {}), "%s: no %s %s" % (what, r, kind_))
                self.assertEqual(c["image"], "psd:" + version, what + ": the image is pinned to the version")
                self.assertEqual(c.get("imagePullPolicy"), "IfNotPresent", what)
            for c in pod.get("initContainers", []):
                self.assertNotIn("-o", c["command"], "the init container changes no owner (it is not root)")
                self.assertNotIn("chown", " ".join(c["command"]))
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            if "token-secret" in vols:
                self.assertGreaterEqual(len(every), 2, name + ": an init container copies the tokens")
                # fsGroup lets the init container (psd's user) read the Secret
                self.assertEqual(psc.get("fsGroup"), psc.get("runAsGroup"), name)
                self.assertEqual(vols["token-secret"]["secret"].get("defaultMode", 0o644) & 0o040, 0o040, name)
        # psd and psworker get their tokens; the other pods (etcd's) need none
        for o in self.pods_of("psd") + self.pods_of("psworker"):
            self.assertIn("token-secret", [v["name"] for v in o["spec"]["template"]["spec"]["volumes"]])

    def test_workers_list_every_psd_pod_by_part_and_replica(self):
        svc = self.obj("Service", "psd")
        job = self.obj("Job", "psworker")
        _, conf = self.conf()
        self.assertEqual(svc["spec"]["clusterIP"], "None", "a headless Service: one DNS name per psd pod")
        port = int(conf["listen"].rsplit(":", 1)[1])
        for sts in self.psd_sets():
            self.assertEqual(sts["spec"]["serviceName"], svc["metadata"]["name"])
            labels = sts["spec"]["template"]["metadata"]["labels"]
            for k, v in svc["spec"]["selector"].items():
                self.assertEqual(labels.get(k), v, "the Service selects the psd pods")
            self.assertEqual(sts["spec"]["selector"]["matchLabels"].items() <= labels.items(), True)
        pods = self.psd_pods()
        parts = sorted(set(p[0] for p in pods))
        self.assertEqual(parts, list(range(len(parts))), "the parts are 0..P-1: %s" % pods)
        env = {e["name"]: e.get("value") for e in self.container(job["spec"]["template"]["spec"], "psworker")["env"]}
        want = ",".join("/".join("%s.%s:%d" % (name, svc["metadata"]["name"], port)
                                 for part_, _, name, _ in pods if part_ == part) for part in parts)
        self.assertEqual(env["PSD_SERVER"], want, "parts in part order, each one's replicas with / between")
        svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
        self.assertEqual(svc_ports["psd"]["port"], port)

    def test_worker_count_agrees(self):
        job = self.obj("Job", "psworker")
        _, conf = self.conf()
        m = int(conf["workers"])
        self.assertIn(conf["mode"], self.MODES)
        self.assertEqual(job["spec"]["completionMode"], "Indexed", "JOB_COMPLETION_INDEX is set only for indexed Jobs")
        self.assertEqual(job["spec"]["completions"], m)
        self.assertEqual(job["spec"]["parallelism"], m, "a BSP round waits for all M workers")
        c = self.container(job["spec"]["template"]["spec"], "psworker")
        env = {e["name"]: e.get("value") for e in c["env"]}
        self.assertEqual(int(env["PSD_WORKERS"]), m)
        cmd = c["command"]
        self.assertEqual(cmd[cmd.index("--shard") + 1], "auto")

    def test_ports_probes_and_volumes_agree(self):
        svc = self.obj("Service", "psd")
        _, conf = self.conf()
        for sts in self.psd_sets():
            spec = sts["spec"]["template"]["spec"]
            c = self.container(spec, "psd")
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            self.assertEqual(ports["psd"], int(conf["listen"].rsplit(":", 1)[1]))
            self.assertEqual(ports["metrics"], int(conf["metrics_listen"].rsplit(":", 1)[1]))
            for p in svc["spec"]["ports"]:
                self.assertIn(p["targetPort"], ports, "the Service's target port is a named container port")
            # liveness: psctl status through psd's event loop, with the admin
            # token (an httpGet of /metrics would get 401: the probe has no token)
            live = c["livenessProbe"]["exec"]["command"]
            self.assertEqual(live[0], "psctl")
            self.assertEqual(live[live.index("--server") + 1], "127.0.0.1:%d" % ports["psd"])
            self.assertEqual(live[live.index("--token-file") + 1], conf["admin_token_file"])
            self.assertLess(int(live[live.index("--timeout") + 1]), 1000 * c["livenessProbe"]["timeoutSeconds"])
            self.assertEqual(live[-1], "status")
            self.assertIn(c["readinessProbe"]["tcpSocket"]["port"], ports)
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            # psd.conf from the ConfigMap where --config reads it
            cfg = c["command"][c["command"].index("--config") + 1]
            vols = {v["name"]: v for v in spec["volumes"]}
            self.assertEqual(vols["config"]["configMap"]["name"], "psd-config")
            self.assertEqual(os.path.join(mounts["config"], "psd.conf"), cfg)
            # the state directory on the claim template's volume
            claims = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
            self.assertEqual(claims, ["state"])
            self.assertTrue(conf["state_dir"].startswith(mounts["state"]), "state_dir on the PersistentVolume")
            # the token files where the init containers put them: psd gets
            # both, the workers only theirs
            for key in ("token_file", "admin_token_file"):
                self.assertEqual(os.path.dirname(conf[key]), mounts["token"])
            job_spec = self.obj("Job", "psworker")["spec"]["template"]["spec"]
            for pod, keys in ((spec, ("token_file", "admin_token_file")), (job_spec, ("token_file",))):
                cmd = pod["initContainers"][0]["command"]
                self.assertEqual(cmd[:2], ["install", "-m"])
                self.assertEqual(cmd[2], "600", "psd and psworker refuse a token others may read")
                self.assertEqual(cmd[cmd.index("-t") + 1], mounts["token"])
                sources = [os.path.basename(a) for a in cmd[cmd.index("-t") + 2:]]
                self.assertEqual(sources, [os.path.basename(conf[k]) for k in keys])
                self.assertEqual({v["name"]: v for v in pod["volumes"]}["token"]["emptyDir"].get("medium"), "Memory")
        env = {e["name"]: e.get("value") for e in
               self.container(self.obj("Job", "psworker")["spec"]["template"]["spec"], "psworker")["env"]}
        self.assertEqual(env["PSD_TOKEN_FILE"], conf["token_file"])

    def test_token_secret_of_the_readme_command(self):
        readme = read("docs", "operations.md")
        m = re.search(r"kubectl create secret generic (\S+)((?: --from-file=[\w-]+=\S+)+)", readme)
        self.assertIsNotNone(m, "docs/operations.md gives the command that makes the token Secret")
        name = m.group(1)
        keys = re.findall(r"--from-file=([\w-]+)=", m.group(2))
        args = []
        for key in keys:
            path = os.path.join(self.dir, key)
            with open(path, "w") as f:
                f.write(key * 8 + "\n")
            args.append("--from-file=%s=%s" % (key, path))
        r = self.kubectl("create", "secret", "generic", name, *args, "--dry-run=client", "-o", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        secret = json.loads(r.stdout)
        for o in self.pods_of("psd") + self.pods_of("psworker"):
            pod = o["spec"]["template"]["spec"]
            vols = {v["name"]: v for v in pod["volumes"]}
            self.assertEqual(vols["token-secret"]["secret"]["secretName"], name)
            init = pod["initContainers"][0]
            mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["token-secret"]
            cmd = init["command"]
            for src in cmd[cmd.index("-t") + 2:]:
                self.assertEqual(os.path.dirname(src), mount)
                self.assertIn(os.path.basename(src), secret["data"], "the Secret has the key the pod copies")

    def psd_config_of(self, pod_name, sts):
        """psd --print-config of pod pod_name's command, the ConfigMap's
        psd.conf where --config names it: (returncode, stdout, stderr)."""
        text, _ = self.conf()
        path = os.path.join(self.dir, "psd.conf")
        with open(path, "w") as f:
            f.write(text)
        c = self.container(sts["spec"]["template"]["spec"], "psd")
        env = self.pod_env(c, pod_name)
        cmd = [expand(a, env) for a in c["command"]]
        self.assertEqual(cmd[0], "psd")
        cmd[cmd.index("--config") + 1] = path
        r = subprocess.run([Paths.psd] + cmd[1:] + ["--print-config"], capture_output=True, text=True, timeout=30)
        return r, cmd

    def test_psd_accepts_each_pods_config(self):
        _, conf = self.conf()
        for part, replica, name, sts in self.psd_pods():
            r, cmd = self.psd_config_of(name, sts)
            self.assertEqual(r.returncode, 0, "%s: %s" % (name, r.stderr))
            self.assertNotIn("$(", " ".join(cmd), name + ": every $(VAR) of the command is in its env")
            want = {k: conf[k] for k in ("mode", "workers", "listen", "metrics_listen", "state_dir", "token_file",
                                         "admin_token_file", "coordinator", "job", "lease_ttl") if k in conf}
            want.update(settings(cmd))
            for key, value in want.items():
                self.assertRegex(r.stdout, r"(?m)^%s\s*=\s*%s\s*$" % (key, re.escape(value)), name)

    def test_psworker_knows_the_jobs_options(self):
        job = self.obj("Job", "psworker")
        cmd = self.container(job["spec"]["template"]["spec"], "psworker")["command"]
        self.assertEqual(cmd[0], "psworker")
        helptext = subprocess.run([Paths.psworker, "--help"], capture_output=True, text=True, timeout=30).stdout
        for opt in (a for a in cmd[1:] if a.startswith("--")):
            self.assertIn(opt, helptext, "psworker --help lists %s" % opt)
        self.assertIn("JOB_COMPLETION_INDEX", helptext + read("docs", "running.md"))


@unittest.skipUnless(find_kubectl(), "no kubectl (Debian package kubernetes-client): the manifests are not checked")
class KubernetesTest(Manifests, unittest.TestCase):
    """deploy/k8s/: 4 parts, one psd each, in BSP."""

    DIRS = (K8S,)
    CREATED = ("configmap/psd-config created (dry run)", "service/psd created (dry run)",
               "statefulset.apps/psd created (dry run)", "job.batch/psworker created (dry run)")
    MODES = ("bsp",)

    def test_one_statefulset_pod_per_part(self):
        self.assertEqual([o["metadata"]["name"] for o in self.psd_sets()], ["psd"])
        self.assertEqual([p[2] for p in self.psd_pods()], ["psd-%d" % i for i in range(4)])
        self.assertNotIn("coordinator", self.conf()[1])


@unittest.skipUnless(find_kubectl(), "no kubectl (Debian package kubernetes-client): the manifests are not checked")
class ReplicatedKubernetesTest(Manifests, unittest.TestCase):
    """deploy/k8s/etcd/ and deploy/k8s/replicas/: 2 parts of 2 psd each,
    leaders elected through a 3-member etcd, in ASGD."""

    DIRS = (os.path.join(K8S, "etcd"), os.path.join(K8S, "replicas"))
    CREATED = ("configmap/psd-config created (dry run)", "service/psd created (dry run)",
               "service/etcd created (dry run)", "statefulset.apps/etcd created (dry run)",
               "statefulset.apps/psd-0 created (dry run)", "statefulset.apps/psd-1 created (dry run)",
               "poddisruptionbudget.policy/psd created (dry run)", "poddisruptionbudget.policy/etcd created (dry run)",
               "networkpolicy.networking.k8s.io/etcd created (dry run)", "job.batch/psworker created (dry run)")
    MODES = ("asgd", "ssp", "bsp")

    def etcd_members(self):
        """(StatefulSet, Service, pod names, client port, peer port)."""
        sts = self.obj("StatefulSet", "etcd")
        svc = self.obj("Service", "etcd")
        ports = {p["name"]: p["containerPort"] for p in self.container(sts["spec"]["template"]["spec"],
                                                                        "etcd")["ports"]}
        names = ["etcd-%d" % i for i in range(sts["spec"]["replicas"])]
        return sts, svc, names, ports["client"], ports["peer"]

    def test_every_replica_of_a_part_starts_alike_and_advertises_its_name(self):
        _, conf = self.conf()
        svc = self.obj("Service", "psd")["metadata"]["name"]
        port = int(conf["listen"].rsplit(":", 1)[1])
        pods = self.psd_pods()
        self.assertGreaterEqual(min(sum(1 for p in pods if p[0] == part) for part, _, _, _ in pods), 2,
                                "every part has replicas: %s" % [p[:3] for p in pods])
        self.assertNotIn("replica_of", conf, "who leads is etcd's to say, not the configuration's")
        self.assertEqual(conf.get("replication", "sync"), "sync", "a leader's acknowledged push is on its followers")
        self.assertRegex(conf["job"], r"^[A-Za-z0-9_.-]+$")
        for part, replica, name, sts in pods:
            r, cmd = self.psd_config_of(name, sts)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(settings(cmd), {"part": str(part), "advertise": "%s.%s:%d" % (name, svc, port)}, name)
            labels = sts["spec"]["template"]["metadata"]["labels"]
            # the replicas of a part keep off each other's node
            terms = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
                "preferredDuringSchedulingIgnoredDuringExecution"]
            own = [t for t in terms if t["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
                   and not [o for o in self.psd_sets() if o is not sts and
                            t["podAffinityTerm"]["labelSelector"]["matchLabels"].items()
                            <= o["spec"]["template"]["metadata"]["labels"].items()]]
            self.assertEqual([t["podAffinityTerm"]["topologyKey"] for t in own], ["kubernetes.io/hostname"], name)
        pdb = self.obj("PodDisruptionBudget", "psd")
        self.assertEqual(pdb["spec"]["maxUnavailable"], 1)
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], self.obj("Service", "psd")["spec"]["selector"])

    def test_the_coordinator_is_the_etcd_members(self):
        _, conf = self.conf()
        sts, svc, names, client, peer = self.etcd_members()
        self.assertEqual(len(names), 3, "three members: losing one changes nothing")
        self.assertEqual(conf["coordinator"], ",".join("http://%s.%s:%d" % (n, svc["metadata"]["name"], client)
                                                        for n in names))
        self.assertEqual(svc["spec"]["clusterIP"], "None")
        self.assertIs(svc["spec"].get("publishNotReadyAddresses"), True, "members find each other before ready")
        self.assertEqual(sts["spec"]["serviceName"], svc["metadata"]["name"])
        self.assertEqual(sts["spec"].get("podManagementPolicy"), "Parallel", "a majority starts at once")
        self.assertEqual({p["name"]: p["port"] for p in svc["spec"]["ports"]}, {"client": client, "peer": peer})
        spec = sts["spec"]["template"]["spec"]
        self.assertIs(spec.get("enableServiceLinks"), False, "no ETCD_* service variables for etcd to read")
        c = self.container(spec, "etcd")
        self.assertEqual(c["command"][0], "etcd")
        for i, name in enumerate(names):
            env = self.pod_env(c, name)
            cmd = [expand(a, env) for a in c["command"]]
            flags = {cmd[j]: cmd[j + 1] for j in range(1, len(cmd) - 1, 2)}
            self.assertEqual(len(flags) * 2 + 1, len(cmd), "etcd's command is flag value pairs: %s" % cmd)
            self.assertEqual(flags["--name"], name)
            self.assertEqual(flags["--initial-cluster"], ",".join("%s=http://%s.%s:%d" % (
                n, n, svc["metadata"]["name"], peer) for n in names))
            self.assertEqual(flags["--initial-advertise-peer-urls"], "http://%s.%s:%d" % (
                name, svc["metadata"]["name"], peer))
            self.assertEqual(flags["--advertise-client-urls"], "http://%s.%s:%d" % (
                name, svc["metadata"]["name"], client))
            self.assertEqual(flags["--listen-client-urls"], "http://0.0.0.0:%d" % client)
            self.assertEqual(flags["--listen-peer-urls"], "http://0.0.0.0:%d" % peer)
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            self.assertTrue(flags["--data-dir"].startswith(mounts["data"] + "/"), "etcd's data on its volume")
        self.assertEqual([t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]], ["data"])
        self.assertEqual(c["readinessProbe"]["httpGet"]["port"], "client")
        if shutil.which("etcd"):  # the flags are the installed etcd's (Debian's etcd-server, as in the image)
            helptext = subprocess.run(["etcd", "--help"], capture_output=True, text=True, timeout=30)
            for flag in flags:
                self.assertTrue(re.search(r"(?m)^\s+%s(\s|$)" % re.escape(flag), helptext.stdout + helptext.stderr),
                                "etcd --help does not list " + flag)
        # only psd and the members reach etcd
        pol = self.obj("NetworkPolicy", "etcd")
        self.assertEqual(pol["spec"]["podSelector"]["matchLabels"], svc["spec"]["selector"])
        sources = [f["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                   for rule in pol["spec"]["ingress"] for f in rule["from"]]
        self.assertEqual(sorted(sources), ["etcd", "psd"])
        self.assertEqual(self.obj("PodDisruptionBudget", "etcd")["spec"]["maxUnavailable"], 1)


def containerfile():
    return read("deploy", "Containerfile").replace("\\\n", " ")


class ContainerfileTest(unittest.TestCase):
    def test_two_stages_from_mmdebstrap_and_the_package(self):
        text = containerfile()
        froms = re.findall(r"(?m)^FROM (\S+)(?: AS (\S+))?", text)
        self.assertEqual(froms, [("${BASE}", "build"), ("scratch", "")],
                         "a build stage from the base the ARG names, then an empty root")
        base = re.search(r"(?m)^ARG BASE=(\S+)$", text).group(1)
        self.assertTrue(base.startswith("localhost/"), "the base is a local image, not a registry's: " + base)
        self.assertRegex(text, r"mmdebstrap --variant=apt bookworm - \| podman import - %s" % re.escape(base))
        self.assertRegex(text, r"(?m)^COPY psd_\*\.deb /tmp/$")
        self.assertRegex(text, r"apt-get install -y --no-install-recommends\s+/tmp/psd_\*\.deb")
        # the final stage takes only the assembled tree: no RUN (no shell to run it)
        final = text[text.index("\nFROM scratch"):]
        self.assertNotRegex(final, r"(?m)^RUN ")
        self.assertEqual(re.findall(r"(?m)^COPY --from=(\S+)", final), ["build", "build"])
        # the image's tag in the docs and the manifests is the project's version
        version = re.search(r"project\(psd VERSION (\S+)", read("CMakeLists.txt")).group(1)
        self.assertIn("podman build -t psd:%s " % version, text)
        # the package the image installs is the one CPack makes
        self.assertIn("include(deploy/deb/package.cmake)", read("CMakeLists.txt"))
        self.assertIn('set(CPACK_PACKAGE_NAME "psd")', read("deploy", "deb", "package.cmake"))

    def test_user_ports_and_volume_match_the_manifests(self):
        text = containerfile()
        user = re.search(r"(?m)^USER (\d+):(\d+)$", text)
        self.assertIsNotNone(user)
        self.assertRegex(text, r"psd:x:%s:%s:" % (user.group(1), user.group(2)))
        self.assertRegex(text, r"--chown=%s:%s /psd-state/ /var/lib/psd/" % (user.group(1), user.group(2)))
        for name in ("psd-statefulset.yaml", "psworker-job.yaml", "replicas/psd-parts.yaml",
                     "replicas/psworker-job.yaml", "etcd/etcd.yaml"):
            k8s = read("deploy", "k8s", name)
            self.assertEqual(set(re.findall(r"runAsUser: (\d+)", k8s)) - {"0"}, {user.group(1)}, name)
        ports = set(re.search(r"(?m)^EXPOSE (.*)$", text).group(1).split())
        sts = read("deploy", "k8s", "psd-statefulset.yaml")
        self.assertEqual(ports, set(re.findall(r"containerPort: (\d+)", sts)))
        state = re.search(r"state_dir = (\S+)", read("deploy", "k8s", "psd-config.yaml")).group(1)
        self.assertRegex(text, r"(?m)^VOLUME %s$" % re.escape(state))

    def test_the_image_holds_every_program_the_manifests_run(self):
        progs = re.search(r'progs="([^"]*)"', containerfile()).group(1).split()
        names = {os.path.basename(p) for p in progs}
        self.assertIn("etcd", names, "deploy/k8s/etcd/ runs the members from the psd image")
        self.assertRegex(containerfile(), r"apt-get install [^&]*\betcd-server\b", "etcd from Debian's etcd-server")
        for d in ("", "replicas", "etcd"):
            for f in sorted(os.listdir(os.path.join(K8S, d))):
                if f.endswith(".yaml"):
                    for cmd in re.findall(r'command: \["([^"]+)"', read("deploy", "k8s", d, f)):
                        self.assertIn(cmd, names, "%s runs %s, which the image lacks" % (os.path.join(d, f), cmd))


def ports_in_a_row(n):
    """The first of n consecutive ports nothing listens on, on any address
    (psd listens on 0.0.0.0): psd's replicas, etcd's client and peer ports."""
    for _ in range(100):
        base = harness.free_port()
        if base + n > 65536:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no %d free ports in a row" % n)


def pids_of(program, arg):
    """The pids of the processes running program (its name) with arg among
    their arguments."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == program and arg in argv:
            out.append(int(d))
    return out


def etcd_get(url, key):
    """The value of key in the etcd at url, through its JSON gateway, or None."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(url + "/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        kvs = json.load(r).get("kvs", [])
    return base64.b64decode(kvs[0].get("value", "")).decode() if kvs else None


class SlurmTest(unittest.TestCase):
    """The sbatch script end to end, one node, under stand-ins for srun and scontrol."""

    SCRIPT = os.path.join(ROOT, "deploy", "slurm", "psd-job.sbatch")

    def stand_ins(self, d, **env):
        """The environment of a job of one node, 127.0.0.1, with stand-ins
        for srun and scontrol first on PATH."""
        bindir = os.path.join(d, "bin")
        os.mkdir(bindir)
        # srun: runs its command once per task (one node: one task), with
        # the variables Slurm sets; options before the command are skipped
        srun = os.path.join(bindir, "srun")
        with open(srun, "w") as f:
            f.write("#!/bin/bash\nwhile [ $# -gt 0 ] && [ \"${1#-}\" != \"$1\" ]; do shift; done\n"
                    "echo \"srun $*\" >> \"$SRUN_LOG\"\n"
                    "SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_NODEID=0 SLURMD_NODENAME=127.0.0.1 exec \"$@\"\n")
        scontrol = os.path.join(bindir, "scontrol")
        with open(scontrol, "w") as f:
            f.write("#!/bin/sh\n[ \"$1 $2\" = \"show hostnames\" ] && echo 127.0.0.1\n")
        for p in (srun, scontrol):
            os.chmod(p, 0o755)
        out = dict(os.environ, PATH="%s:%s:%s:%s:%s" % (bindir, os.path.dirname(Paths.psd),
                                                         os.path.dirname(Paths.psworker),
                                                         os.path.dirname(Paths.psctl), os.environ["PATH"]),
                   SLURM_JOB_ID="42", SLURM_JOB_NODELIST="127.0.0.1", SLURM_JOB_NUM_NODES="1",
                   SLURM_SUBMIT_DIR=d, SRUN_LOG=os.path.join(d, "srun.log"), PSD_DATA_DIR=Paths.data)
        out.update(env)
        return out

    def test_one_node_job(self):
        r = subprocess.run(["bash", "-n", self.SCRIPT], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = read("deploy", "slurm", "psd-job.sbatch")
        self.assertIn("#SBATCH --ntasks-per-node=1", text)
        with tempfile.TemporaryDirectory(prefix="psd-slurm-") as d:
            env = self.stand_ins(d, PSD_PORT=str(harness.free_port()),
                                 PSD_WORKER_ARGS="--epochs 1 --limit 2000 --test-limit 500 --model mlp:32 --eval")
            r = subprocess.run(["bash", self.SCRIPT], capture_output=True, text=True, timeout=120, env=env, cwd=d)
            self.assertEqual(r.returncode, 0, "sbatch script failed:\n%s\n%s" % (r.stdout, r.stderr))
            job = os.path.join(d, "psd-job-42")
            tok = os.path.join(job, "token")
            self.assertEqual(stat.S_IMODE(os.stat(tok).st_mode), 0o600)
            summary = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
            self.assertEqual(len(summary), 1, r.stdout)
            self.assertEqual(summary[0]["mode"], "bsp")
            self.assertGreater(summary[0]["test_accuracy"], 0.5)
            self.assertTrue(os.path.getsize(os.path.join(job, "model.safetensors")) > 4 * 784 * 32)
            with open(os.path.join(d, "srun.log")) as f:
                log = f.read()
            self.assertIn("psd --listen", log)
            self.assertIn("psworker --shard auto", log)
            self.assertEqual(log.count("exec psd "), 1, "one psd step without replicas")
            with open(os.path.join(job, "psd-0.log")) as f:
                self.assertNotIn("coordinator", f.read(), "no coordinator without replicas")
            self.assertEqual(sorted(f for f in os.listdir(job) if f.startswith(("psd-", "state-"))),
                             ["psd-0.log", "state-0"])

    @unittest.skipIf(etcd.why_no_etcd(), etcd.why_no_etcd() or "")
    def test_replicas_with_the_jobs_etcd_through_a_leader_killed(self):
        """PSD_REPLICAS=2: two psd of the one part, the job's own etcd; the
        leader killed with SIGKILL while the worker trains. The follower is
        elected, the worker goes on with it, and the job ends with the model
        at exactly one version per step of the worker (no acknowledged push
        lost, none applied twice), saved from the new leader."""
        limit, batch, seconds = 2000, 64, 25
        with tempfile.TemporaryDirectory(prefix="psd-slurm-") as d:
            port = ports_in_a_row(4)  # psd's two, then etcd's client and peer ports
            eport = port + 2
            # the worker trains for `seconds` (--max-seconds), however fast
            # the machine: long enough for the kill, the election and its
            # reconnect
            env = self.stand_ins(d, PSD_PORT=str(port), PSD_REPLICAS="2", PSD_ETCD_PORT=str(eport), TMPDIR=d,
                                 PSD_WORKER_ARGS="--epochs 100000 --max-seconds %d --limit %d --batch %d "
                                                 "--test-limit 500 --model mlp:32 --eval" % (seconds, limit, batch))
            addrs = ["127.0.0.1:%d" % (port + r) for r in range(2)]
            job = os.path.join(d, "psd-job-42")
            with open(os.path.join(d, "stdout"), "w+") as out, open(os.path.join(d, "stderr"), "w+") as err:
                p = subprocess.Popen(["bash", self.SCRIPT], stdout=out, stderr=err, env=env, cwd=d,
                                     stdin=subprocess.DEVNULL)
                try:
                    try:
                        took = self.kill_the_leader(p, addrs, job, "http://127.0.0.1:%d" % eport)
                    except AssertionError as e:
                        raise AssertionError("%s\n%s" % (e, "\n".join(
                            "--- %s:\n%s" % (f, harness.tail(os.path.join(job, f), 15))
                            for f in ("psd-0-0.log", "psd-0-1.log", "etcd.log")))) from None
                    rc = p.wait(timeout=120)
                finally:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                    left = self.processes_in(d)  # psd, etcd, psworker left behind by a failed run
                    for pid in left:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                out.seek(0)
                err.seek(0)
                stdout, stderr = out.read(), err.read()
            self.assertEqual(rc, 0, "sbatch script failed:\n%s\n%s" % (stdout, stderr[-4000:]))
            summary = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
            self.assertEqual(len(summary), 1, stdout)
            self.assertEqual(summary[0]["mode"], "asgd")
            self.assertGreaterEqual(summary[0]["reconnects"], 1, "the worker went over to the new leader")
            self.assertGreater(summary[0]["test_accuracy"], 0.5)
            # every step's push applied once, on the psd etcd elected
            m = re.search(r"--max-seconds %d reached at epoch (\d+) step (\d+)" % seconds, stderr)
            self.assertIsNotNone(m, "the worker trained until --max-seconds:\n" + stderr[-2000:])
            steps = (int(m.group(1)) - 1) * harness.steps_per_epoch(limit, 1, batch, False)[0] + int(m.group(2))
            meta, _ = harness.read_safetensors(os.path.join(job, "model.safetensors"))
            self.assertEqual(int(meta["model_version"]), steps, "one model version per step of the worker")
            self.assertEqual(summary[0]["version"], steps)
            # the psd killed did not answer the shutdown; the job's etcd is
            # stopped and its data removed
            self.assertIn("did not answer shutdown", stderr)
            self.assertEqual(left, [], "the job left no process behind (psd, etcd, psworker)")
            self.assertEqual([f for f in os.listdir(d) if f.startswith("psd-etcd-")], [])
            self.assertEqual(sorted(f for f in os.listdir(job) if f.startswith(("psd-", "state-"))),
                             ["psd-0-0.log", "psd-0-1.log", "state-0-0", "state-0-1"])
            with open(os.path.join(d, "srun.log")) as f:
                self.assertEqual(f.read().count("exec psd "), 2, "one psd step per replica")
            print("kill -9 of the leader (lease_ttl 5 s): the follower led %.2f s later, and acknowledged the "
                  "worker's first push %.2f s after the kill; %d steps, version %d" % (took[0], took[1], steps, steps),
                  file=sys.stderr)

    @staticmethod
    def processes_in(d):
        """The pids of the processes with d in one of their arguments (the
        job's psd, etcd and psworker name files in it)."""
        out = []
        for pid in (int(x) for x in os.listdir("/proc") if x.isdigit()):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if pid != os.getpid() and any(d in a for a in argv):
                out.append(pid)
        return out

    def kill_the_leader(self, p, addrs, job, etcd_url):
        """Waits until the worker trains against the part's leader, kills
        that psd with SIGKILL, and waits until the other leads and has
        applied a push of the worker. Returns the seconds from the kill to
        each."""
        def status(addr):
            if p.poll() is not None:
                raise AssertionError("the job ended (exit %s) before the kill" % p.returncode)
            try:
                with open(os.path.join(job, "admin-token"), "rb") as f:
                    token = f.read()
            except OSError:
                return None
            if not token.endswith(b"\n"):
                return None  # not written yet
            try:
                return harness.status(addr, token[:-1])
            except AssertionError:
                return None

        def role(addr):
            st = status(addr)
            return st.get("coordinator", {}).get("role") if st else None

        def training_leader():
            for addr in addrs:
                st = status(addr)
                if st and st.get("coordinator", {}).get("role") == "leader" and st["version"] >= 200:
                    return addr
            return None

        leader = harness.wait_until(training_leader, 90, "a leader elected through the job's etcd, trained on")
        other = addrs[1 - addrs.index(leader)]
        # a follower may take over once the in-sync key in etcd names it
        # (it holds every push the leader acknowledged)
        harness.wait_until(lambda: role(other) == "follower" and status(other)["coordinator"].get("listed"), 30,
                           "the other psd to follow, in the in-sync set etcd holds")
        self.assertEqual(etcd_get(etcd_url, "/psd/psd-42/part/0/leader").split()[0], leader)
        self.assertTrue(pids_of("psworker", "--shard"), "the worker trains")
        pids = pids_of("psd", "0.0.0.0:" + leader.rsplit(":", 1)[1])
        self.assertEqual(len(pids), 1, "the leader's process")
        os.kill(pids[0], signal.SIGKILL)
        t0 = time.monotonic()
        harness.wait_until(lambda: role(other) == "leader", 30, "the follower to be elected", interval=0.01)
        elected = time.monotonic() - t0
        v = status(other)["version"]
        harness.wait_until(lambda: (status(other) or {}).get("version", v) > v, 30,
                           "the worker's first push to the new leader", interval=0.01)
        acked = time.monotonic() - t0
        self.assertEqual(etcd_get(etcd_url, "/psd/psd-42/part/0/leader").split()[0], other)
        self.assertTrue(pids_of("psworker", "--shard"), "the worker still trains after the failover")
        return elected, acked


if __name__ == "__main__":
    harness.parse_args()
    harness.main()
