#!/usr/bin/env python3
"""The Kubernetes deployment (deploy/k8s) and the Dockerfile, checked offline.

  (a) the committed rendered manifests, deploy/k8s/rendered/<overlay>.yaml
      (scripts/render-k8s.sh writes them with `kubectl kustomize`), one per
      overlay of deploy/k8s/overlays: a missing one, one without its
      generated header and one without an overlay are failures. Where
      kubectl with kustomize v5 is on PATH, each overlay is rendered again
      and must equal its committed file (else: run scripts/render-k8s.sh);
      without it that comparison alone is skipped, and everything below
      runs on the committed files. These checks are shown to report a
      missing, headerless, orphaned and (with kubectl) stale file in a copy.
      Every object validates against the Kubernetes API schema
      (kubernetes-validate, strict, one pinned Kubernetes version; the
      Prometheus Operator's PodMonitor/ServiceMonitor, which it has no schema
      for, are checked structurally here). The validator is first shown to
      reject a broken object.
  (b) a policy over the rendered objects (probes, resources, non-root,
      read-only root, no privilege escalation, capabilities, seccomp, image
      tags, the workers' pod-IP address, GPU limits and /dev/shm, the
      NetworkPolicies, the PodMonitor, the coordinator's config), with a
      mutation pass that breaks each rule in a copy and requires the checker
      to report it. Then the real binaries run with the rendered arguments
      and config in a private network namespace (unshare -rn) and every
      rendered probe is run as the kubelet would: gRPC health with service
      "" in plaintext, TCP connect, or the exec command.
  (c) the Dockerfile: a lint (multi-stage, non-root numeric USER equal to
      the manifests' runAsUser, no ADD of URLs, pinned bases, an ENTRYPOINT
      per role) and its runtime package list against the shared libraries
      the built binaries need (readelf + dpkg -S); with a reachable Docker
      daemon and pullable base images, the image is built and
      `zb-coordinator --version` run in it.

Exit status: 0 pass, 1 failure, 77 skip: only when PyYAML or kubernetes-validate
is missing and scripts/install-py-deps.sh cannot make its venv (offline), and
not with CI=true, where that is a failure. Parts that need what this machine
may lack (kubectl for the re-render, the binaries, unshare, a Docker daemon)
are skipped with a printed reason without turning the result into a skip.

Environment: ZB_COORDINATOR_BIN, ZB_WORKER_BIN (default build/dev/...),
ZB_DEPLOY_VENV (default build/venv-deploy; scripts/install-py-deps.sh makes
it, and this test runs that script once when the venv is missing),
ZB_NO_PY_INSTALL=1 (do not run it), ZB_SKIP_DOCKER_BUILD=1, KUBECTL (the
kubectl to re-render with; default: kubectl on PATH), CI.
"""
import copy
import difflib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
OVERLAYS_DIR = os.path.join(K8S, "overlays")
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
DOCKERIGNORE = os.path.join(ROOT, ".dockerignore")
RENDERED_DIR = os.path.join(K8S, "rendered")
RENDER_SCRIPT = "scripts/render-k8s.sh"  # writes RENDERED_DIR/<overlay>.yaml
HEADER_LINES = 3  # its "# GENERATED ..." header before kubectl kustomize's output
VENV = os.environ.get("ZB_DEPLOY_VENV", os.path.join(ROOT, "build", "venv-deploy"))

K8S_VERSION = "1.30.0"  # the Kubernetes API the manifests are validated against
IMAGE_UID = 10001  # the Dockerfile's user zb; the manifests' runAsUser
GRPC_PORT, METRICS_PORT, DATA_PORT = 7070, 9464, 29500
MONITORING_NS = "monitoring"
CRD_KINDS = {"PodMonitor", "ServiceMonitor"}
WORKLOAD_KINDS = {"StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "Job"}
# Containers allowed a writable root file system, with the reason. None.
WRITABLE_ROOT_ALLOW = {}
# The coordinator's config keys (docs/operations.md, Configuration).
COORD_KEYS = {
    "listen", "metrics_listen", "data_dir", "heartbeat_timeout_ms", "log_level", "max_message_bytes",
    "max_plan_ops", "retain_finished_jobs", "retain_finished_s", "tls_ca", "tls_cert", "tls_key",
}

FAILS, SKIPS, HARD_SKIPS = [], [], []


def log(msg):
    print(msg, flush=True)


def fail(msg):
    FAILS.append(msg)
    log("FAIL " + msg)


def skip(msg, hard=False):
    (HARD_SKIPS if hard else SKIPS).append(msg)
    log("SKIP " + msg)


def kv_pinned_version():
    """KV_VERSION= in scripts/install-py-deps.sh: the one place it is pinned."""
    with open(os.path.join(ROOT, "scripts", "install-py-deps.sh")) as f:
        m = re.search(r"^KV_VERSION=(\S+)", f.read(), re.M)
    return m.group(1) if m else None


# ---------------------------------------------------------------- YAML ----

def import_yaml():
    try:
        import yaml  # noqa: F401
        return yaml
    except ImportError:
        pass
    v = "python%d.%d" % sys.version_info[:2]
    site = os.path.join(VENV, "lib", v, "site-packages")
    if os.path.isdir(site):
        sys.path.append(site)
        try:
            import yaml  # noqa: F401
            return yaml
        except ImportError:
            pass
    return None


# ------------------------------------------------------------- helpers ----

def pod_specs(objs):
    """(object, pod spec) of every workload's pod template and every Pod."""
    for o in objs:
        if o.get("kind") in WORKLOAD_KINDS:
            yield o, o["spec"]["template"]["spec"]
        elif o.get("kind") == "Pod":
            yield o, o["spec"]


def containers(spec):
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def component(o):
    return ((o.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")


def find(objs, kind, name):
    for o in objs:
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            return o
    return None


def find_component(objs, comp):
    for o, spec in pod_specs(objs):
        if component(o) == comp:
            return o, spec
    return None, None


def env_value_from(c, name):
    for e in c.get("env") or []:
        if e.get("name") == name:
            return e.get("valueFrom"), e.get("value")
    return None, None


def flag(args, name):
    """The values of --name=V or --name V in args."""
    out = []
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            out.append(a[len(name) + 1:])
        elif a == name and i + 1 < len(args):
            out.append(args[i + 1])
    return out


def port_of(addr):
    try:
        return int(addr.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def eff(spec, c, key):
    """A securityContext field as it takes effect: the container's, else the pod's."""
    csc, psc = c.get("securityContext") or {}, spec.get("securityContext") or {}
    return csc[key] if key in csc else psc.get(key)


def probes(c):
    return {k: c.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe") if c.get(k)}


def has_tls(args):
    return any(a.startswith("--tls-") for a in args)


def labels_match(selector, labels):
    ml = (selector or {}).get("matchLabels") or {}
    return bool(ml) and all(labels.get(k) == v for k, v in ml.items())


def quantity_positive(q):
    try:
        return float(str(q).rstrip("KMGTPEi").rstrip("m")) > 0
    except ValueError:
        return False


# --------------------------------------------------------- (b) policy ----

def check_policy(objs, overlay):
    """[(rule, message)] for every violation in one overlay's objects."""
    v = []

    def bad(rule, msg):
        v.append((rule, msg))

    services = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Service"}
    for o, spec in pod_specs(objs):
        where = "%s/%s" % (o["kind"], o["metadata"]["name"])
        for c in containers(spec):
            cw = "%s container %s" % (where, c["name"])
            # probes
            if not c.get("readinessProbe"):
                bad("probes", cw + ": no readinessProbe")
            if not c.get("livenessProbe"):
                bad("probes", cw + ": no livenessProbe")
            # resources
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if not (res.get(part) or {}).get(r):
                        bad("resources", "%s: no resources.%s.%s" % (cw, part, r))
            # security context
            if eff(spec, c, "runAsNonRoot") is not True:
                bad("run-as-non-root", cw + ": runAsNonRoot is not true")
            uid = eff(spec, c, "runAsUser")
            if uid != IMAGE_UID:
                bad("run-as-non-root", "%s: runAsUser %r, not the image's user %d" % (cw, uid, IMAGE_UID))
            csc = c.get("securityContext") or {}
            if csc.get("readOnlyRootFilesystem") is not True and c["name"] not in WRITABLE_ROOT_ALLOW:
                bad("read-only-root", cw + ": readOnlyRootFilesystem is not true")
            if csc.get("allowPrivilegeEscalation") is not False:
                bad("no-privilege-escalation", cw + ": allowPrivilegeEscalation is not false")
            if csc.get("privileged"):
                bad("no-privilege-escalation", cw + ": privileged")
            caps = csc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []) or caps.get("add"):
                bad("capabilities", cw + ": capabilities must drop ALL and add none")
            sp = eff(spec, c, "seccompProfile") or {}
            if sp.get("type") not in ("RuntimeDefault", "Localhost"):
                bad("seccomp", cw + ": seccompProfile is %r, not RuntimeDefault" % sp.get("type"))
            # image
            img = c.get("image") or ""
            last = img.rsplit("/", 1)[-1]
            if "@sha256:" not in img and (":" not in last or last.endswith(":latest")):
                bad("image-tag", "%s: image %r has no pinned tag" % (cw, img))
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            bad("no-privilege-escalation", where + ": host namespaces")

    coord, cspec = find_component(objs, "coordinator")
    worker, wspec = find_component(objs, "worker")
    if not coord or not worker:
        bad("wiring", "no coordinator or no worker workload")
        return v

    # --- the coordinator: replicas, PVC, config, probes -----------------
    cc = cspec["containers"][0]
    cargs = cc.get("args") or []
    if coord["kind"] != "StatefulSet" or coord["spec"].get("replicas", 1) != 1:
        bad("coordinator", "the coordinator must be a StatefulSet of 1 replica")
    cports = {p.get("name"): p["containerPort"] for p in cc.get("ports") or []}
    if cports.get("grpc") != GRPC_PORT or cports.get("metrics") != METRICS_PORT:
        bad("coordinator", "coordinator ports %r, want grpc %d, metrics %d" % (cports, GRPC_PORT, METRICS_PORT))
    mounts = {m["mountPath"]: m["name"] for m in cc.get("volumeMounts") or []}
    vcts = [t["metadata"]["name"] for t in coord["spec"].get("volumeClaimTemplates") or []]
    cfg_paths = flag(cargs, "--config")
    cfg = None
    if len(cfg_paths) != 1:
        bad("config", "the coordinator needs exactly one --config, has %r" % cfg_paths)
    else:
        d, base = os.path.dirname(cfg_paths[0]), os.path.basename(cfg_paths[0])
        vol = next((x for x in cspec.get("volumes") or [] if x["name"] == mounts.get(d)), None)
        cm = find(objs, "ConfigMap", ((vol or {}).get("configMap") or {}).get("name", ""))
        if not cm or base not in (cm.get("data") or {}):
            bad("config", "--config %s is not a key of a mounted ConfigMap" % cfg_paths[0])
        else:
            import yaml
            cfg = yaml.safe_load(cm["data"][base]) or {}
    if cfg is not None:
        unknown = set(cfg) - COORD_KEYS
        if unknown:
            bad("config", "unknown config keys %s (the coordinator exits 2)" % sorted(unknown))
        if cfg.get("listen") != "0.0.0.0:%d" % GRPC_PORT:
            bad("config", "listen is %r, not 0.0.0.0:%d" % (cfg.get("listen"), GRPC_PORT))
        if cfg.get("metrics_listen") != "0.0.0.0:%d" % METRICS_PORT:
            bad("config", "metrics_listen is %r, not 0.0.0.0:%d" % (cfg.get("metrics_listen"), METRICS_PORT))
        dd = cfg.get("data_dir", "/var/lib/zb")
        if mounts.get(dd) not in vcts:
            bad("config", "data_dir %s is not the mount of a volumeClaimTemplate (%r)" % (dd, vcts))
    tls = has_tls(cargs)
    for kind, p in probes(cc).items():
        if "grpc" in p:
            if p["grpc"].get("port") != GRPC_PORT or p["grpc"].get("service", ""):
                bad("coordinator-probes",
                    "%s: gRPC probe %r, want port %d, service \"\"" % (kind, p["grpc"], GRPC_PORT))
            if tls:
                bad("coordinator-probes",
                    "%s: the kubelet's gRPC probe is plaintext; with --tls-* use tcpSocket" % kind)
        elif "tcpSocket" in p:
            if not tls:
                bad("coordinator-probes", "%s: tcpSocket without TLS: use the gRPC health probe" % kind)
            if p["tcpSocket"].get("port") not in (GRPC_PORT, "grpc"):
                bad("coordinator-probes",
                    "%s: tcpSocket port %r, want %d" % (kind, p["tcpSocket"].get("port"), GRPC_PORT))
        else:
            bad("coordinator-probes", "%s: neither gRPC nor tcpSocket" % kind)
    if set(probes(cc)) != {"startupProbe", "readinessProbe", "livenessProbe"}:
        bad("coordinator-probes", "the coordinator needs startup, readiness and liveness probes")

    # --- the workers: arguments, pod IP, probes, /dev/shm, GPUs ----------
    wc = wspec["containers"][0]
    wargs = wc.get("args") or []
    if worker["kind"] != "StatefulSet" or worker["spec"].get("podManagementPolicy") != "Parallel":
        bad("worker", "workers must be a StatefulSet with podManagementPolicy Parallel")
    adv = flag(wargs, "--advertise-address")
    vf, _ = env_value_from(wc, "POD_IP")
    if adv != ["$(POD_IP)"] or ((vf or {}).get("fieldRef") or {}).get("fieldPath") != "status.podIP":
        bad("advertise-pod-ip", "--advertise-address %r; POD_IP from %r: want $(POD_IP) from status.podIP" % (adv, vf))
    vf, _ = env_value_from(wc, "POD_NAME")
    if flag(wargs, "--id") != ["$(POD_NAME)"] or ((vf or {}).get("fieldRef") or {}).get("fieldPath") != "metadata.name":
        bad("worker", "--id must be $(POD_NAME) from metadata.name")
    listen = flag(wargs, "--listen")
    if listen != ["0.0.0.0:%d" % DATA_PORT]:
        bad("worker", "--listen %r, want 0.0.0.0:%d" % (listen, DATA_PORT))
    lport = port_of(listen[0]) if listen else None
    coord_addr = flag(wargs, "--coordinator")
    chost, cport = (coord_addr[0].rsplit(":", 1) + [""])[:2] if coord_addr else ("", "")
    svc = services.get(chost)
    if not svc or not labels_match({"matchLabels": svc["spec"].get("selector") or {}},
                                   coord["spec"]["template"]["metadata"]["labels"]) \
            or not any(str(p["port"]) == cport for p in svc["spec"].get("ports") or []):
        bad("worker", "--coordinator %r is not a Service port of the coordinator" % coord_addr)
    if not flag(wargs, "--path-root"):
        bad("worker", "no --path-root: a job could name any path")
    if flag(wargs, "--memory-bytes"):
        bad("worker", "--memory-bytes is set: leave it to the cgroup limit")
    wprobes = probes(wc)
    for kind, p in wprobes.items():
        tcp = p.get("tcpSocket") or {}
        if tcp.get("port") in (lport, "data"):
            bad("worker-probes", "%s: a TCP probe of the data port fills its listen backlog" % kind)
        if "exec" in p:
            cmd = " ".join(p["exec"].get("command") or [])
            if lport is not None and (":%04X " % lport) not in cmd:
                bad("worker-probes", "%s: does not look for the data port %s (%04X)" % (kind, lport, lport or 0))
            if kind == "readinessProbe" and cport.isdigit() and (":%04X 01 " % int(cport)) not in cmd:
                bad("worker-probes", "%s: does not look for the connection to the coordinator port %s" % (kind, cport))
    vols = {x["name"]: x for x in wspec.get("volumes") or []}
    shm = next((m for m in wc.get("volumeMounts") or [] if m["mountPath"] == "/dev/shm"), None)
    if not shm or ((vols.get(shm["name"]) or {}).get("emptyDir") or {}).get("medium") != "Memory":
        bad("dev-shm", "the worker has no memory-backed emptyDir at /dev/shm")
    if "gpu" in overlay:
        lim = (wc.get("resources") or {}).get("limits") or {}
        if not quantity_positive(lim.get("nvidia.com/gpu", 0)):
            bad("gpu", "gpu overlay: the worker has no nvidia.com/gpu limit")
        if has_tls(wargs) != tls:
            bad("gpu", "TLS on one side only")

    # --- NetworkPolicies ------------------------------------------------
    pols = [o for o in objs if o.get("kind") == "NetworkPolicy"]
    clabels = coord["spec"]["template"]["metadata"]["labels"]
    wlabels = worker["spec"]["template"]["metadata"]["labels"]
    cpols = [p for p in pols if labels_match(p["spec"].get("podSelector"), clabels)]
    wpols = [p for p in pols if labels_match(p["spec"].get("podSelector"), wlabels)]
    if not cpols:
        bad("networkpolicy", "no NetworkPolicy selects the coordinator")
    for p in cpols:
        for rule in p["spec"].get("ingress") or []:
            ports = {x.get("port") for x in rule.get("ports") or []}
            froms = rule.get("from") or []
            if not froms or not ports:
                bad("networkpolicy", "coordinator: an ingress rule from anywhere or to any port")
                continue
            if ports - {GRPC_PORT, METRICS_PORT}:
                bad("networkpolicy", "coordinator: ingress to ports %s" % sorted(ports - {GRPC_PORT, METRICS_PORT}))
            for f in froms:
                if METRICS_PORT in ports:
                    nsl = (f.get("namespaceSelector") or {}).get("matchLabels") or {}
                    ns = nsl.get("kubernetes.io/metadata.name")
                    if ns != MONITORING_NS or "podSelector" in f or GRPC_PORT in ports:
                        bad("networkpolicy", "coordinator: %d must be admitted from namespace %s only"
                            % (METRICS_PORT, MONITORING_NS))
                if GRPC_PORT in ports and ("namespaceSelector" in f or "ipBlock" in f or "podSelector" not in f):
                    bad("networkpolicy",
                        "coordinator: %d must be admitted from this namespace's pods only" % GRPC_PORT)
    if not wpols:
        bad("networkpolicy", "no NetworkPolicy selects the workers")
    for p in wpols:
        for rule in p["spec"].get("ingress") or []:
            froms = rule.get("from") or []
            if not froms or any(not labels_match(f.get("podSelector"), wlabels) or "namespaceSelector" in f
                                or "ipBlock" in f for f in froms):
                bad("networkpolicy", "workers: ingress admitted from other than workers")
            ports = {x.get("port") for x in rule.get("ports") or []}
            if ports and ports != {DATA_PORT}:
                bad("networkpolicy", "workers: ingress to ports %s" % sorted(ports))
            if not ports and "gpu" not in overlay:
                bad("networkpolicy", "workers: every port open without NCCL (only the gpu overlays need it)")

    # --- the PodMonitor / ServiceMonitor -------------------------------
    mons = [o for o in objs if o.get("kind") in CRD_KINDS]
    if "gpu" in overlay and not mons:
        bad("monitor", "gpu overlay without a PodMonitor/ServiceMonitor")
    for m in mons:
        eps = m["spec"].get("podMetricsEndpoints") or m["spec"].get("endpoints") or []
        if not eps:
            bad("monitor", "%s: no endpoints" % m["kind"])
        for ep in eps:
            if ep.get("honorLabels") is not True:
                bad("monitor", "%s: honorLabels is not true (zb's `job` label would become exported_job)" % m["kind"])
            if ep.get("port") != "metrics" or ep.get("path", "/metrics") != "/metrics":
                bad("monitor", "%s: scrapes %r%r, not metrics /metrics" % (m["kind"], ep.get("port"), ep.get("path")))
        svc_labels = ((services.get("zb-coordinator") or {}).get("metadata") or {}).get("labels") or {}
        target = clabels if m["kind"] == "PodMonitor" else svc_labels
        if not labels_match(m["spec"].get("selector"), target):
            bad("monitor", "%s: its selector does not select the coordinator" % m["kind"])
    return v


# --- the mutation pass: each rule broken once in a copy ------------------

def _c(objs, comp):
    return find_component(objs, comp)[1]["containers"][0]


def _p(objs, comp):
    return find_component(objs, comp)[1]


def _set(d, path, value):
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def _del(d, path):
    for k in path[:-1]:
        d = d[k]
    d.pop(path[-1], None)


def _args(objs, comp, fn):
    c = _c(objs, comp)
    c["args"] = fn(c.get("args") or [])


def _cfg(objs, fn):
    import yaml
    cm = next(o for o in objs if o.get("kind") == "ConfigMap")
    key = next(iter(cm["data"]))
    d = yaml.safe_load(cm["data"][key])
    fn(d)
    cm["data"][key] = yaml.safe_dump(d)


def _netpol(objs, comp):
    return find(objs, "NetworkPolicy", "zb-" + comp)


def _mon(objs):
    return next(o for o in objs if o.get("kind") in CRD_KINDS)


MUTATIONS = [
    # (rule, overlay or None for every overlay, what, mutate(objs))
    ("probes", None, "coordinator without livenessProbe", lambda o: _del(_c(o, "coordinator"), ["livenessProbe"])),
    ("probes", None, "worker without readinessProbe", lambda o: _del(_c(o, "worker"), ["readinessProbe"])),
    ("resources", None, "worker without limits", lambda o: _del(_c(o, "worker"), ["resources", "limits"])),
    ("resources", None, "coordinator without requests.memory",
     lambda o: _del(_c(o, "coordinator"), ["resources", "requests", "memory"])),
    ("run-as-non-root", None, "runAsNonRoot false on the worker pod",
     lambda o: (_set(_p(o, "worker"), ["securityContext", "runAsNonRoot"], False),
                _del(_c(o, "worker"), ["securityContext", "runAsNonRoot"]))),
    ("run-as-non-root", None, "coordinator container runAsUser 0",
     lambda o: _set(_c(o, "coordinator"), ["securityContext", "runAsUser"], 0)),
    ("read-only-root", None, "writable root on the coordinator",
     lambda o: _set(_c(o, "coordinator"), ["securityContext", "readOnlyRootFilesystem"], False)),
    ("no-privilege-escalation", None, "allowPrivilegeEscalation true on the worker",
     lambda o: _set(_c(o, "worker"), ["securityContext", "allowPrivilegeEscalation"], True)),
    ("capabilities", None, "the worker adds NET_ADMIN",
     lambda o: _set(_c(o, "worker"), ["securityContext", "capabilities", "add"], ["NET_ADMIN"])),
    ("seccomp", None, "seccomp Unconfined on the coordinator",
     lambda o: _set(_c(o, "coordinator"), ["securityContext", "seccompProfile", "type"], "Unconfined")),
    ("image-tag", None, "worker image :latest",
     lambda o: _set(_c(o, "worker"), ["image"], _c(o, "worker")["image"].rsplit(":", 1)[0] + ":latest")),
    ("image-tag", None, "coordinator image untagged",
     lambda o: _set(_c(o, "coordinator"), ["image"], "registry.example.com:5000/zb/zb-coordinator")),
    ("advertise-pod-ip", None, "POD_IP from spec.nodeName",
     lambda o: _set(next(e for e in _c(o, "worker")["env"] if e["name"] == "POD_IP"),
                    ["valueFrom", "fieldRef", "fieldPath"], "spec.nodeName")),
    ("advertise-pod-ip", None, "no --advertise-address",
     lambda o: _args(o, "worker", lambda a: [x for x in a if not x.startswith("--advertise-address")])),
    ("worker", None, "--coordinator at a port the Service lacks",
     lambda o: _args(o, "worker", lambda a: [("--coordinator=zb-coordinator:7071"
                                              if x.startswith("--coordinator") else x) for x in a])),
    ("worker", None, "podManagementPolicy OrderedReady",
     lambda o: _set(find_component(o, "worker")[0], ["spec", "podManagementPolicy"], "OrderedReady")),
    ("worker-probes", None, "worker liveness as a TCP probe of the data port",
     lambda o: _set(_c(o, "worker"), ["livenessProbe"], {"tcpSocket": {"port": DATA_PORT}})),
    ("worker-probes", None, "data port moved, probes not",
     lambda o: _args(o, "worker", lambda a: [("--listen=0.0.0.0:29501" if x.startswith("--listen") else x)
                                             for x in a])),
    ("dev-shm", None, "/dev/shm on disk",
     lambda o: _del(next(v for v in _p(o, "worker")["volumes"] if v["name"] == "dshm")["emptyDir"], ["medium"])),
    ("gpu", "gpu", "no nvidia.com/gpu limit",
     lambda o: _del(_c(o, "worker")["resources"]["limits"], ["nvidia.com/gpu"])),
    ("coordinator-probes", None, "gRPC probe on 7071",
     lambda o: _set(_c(o, "coordinator"), ["readinessProbe"], {"grpc": {"port": 7071}})),
    ("coordinator-probes", "cpu-demo", "TLS flags with plaintext gRPC probes",
     lambda o: _args(o, "coordinator", lambda a: a + ["--tls-ca=/etc/zb/tls/ca.pem"])),
    ("coordinator", None, "2 coordinator replicas",
     lambda o: _set(find_component(o, "coordinator")[0], ["spec", "replicas"], 2)),
    ("config", None, "an unknown config key", lambda o: _cfg(o, lambda d: d.update(listen_port=7070))),
    ("config", None, "data_dir off the claim", lambda o: _cfg(o, lambda d: d.update(data_dir="/tmp/zb"))),
    ("config", None, "metrics on loopback", lambda o: _cfg(o, lambda d: d.update(metrics_listen="127.0.0.1:9464"))),
    ("networkpolicy", None, "metrics from every namespace",
     lambda o: _set(_netpol(o, "coordinator")["spec"]["ingress"][1], ["from"], [{"namespaceSelector": {}}])),
    ("networkpolicy", None, "an extra coordinator port",
     lambda o: _netpol(o, "coordinator")["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 22})),
    ("networkpolicy", None, "workers admit any pod",
     lambda o: _set(_netpol(o, "worker")["spec"]["ingress"][0], ["from"], [{"podSelector": {}}])),
    ("networkpolicy", None, "no policy for the workers",
     lambda o: o.remove(_netpol(o, "worker"))),
    ("monitor", "gpu", "honorLabels false",
     lambda o: _set(_mon(o)["spec"]["podMetricsEndpoints"][0], ["honorLabels"], False)),
    ("monitor", "gpu", "PodMonitor selects nothing",
     lambda o: _set(_mon(o)["spec"], ["selector"], {"matchLabels": {"app": "other"}})),
]


def policy_pass(rendered):
    for overlay, objs in rendered.items():
        viol = check_policy(objs, overlay)
        for rule, msg in viol:
            fail("policy %s [%s]: %s" % (overlay, rule, msg))
        if not viol:
            log("ok   policy: %s passes every rule" % overlay)
    tried = set()
    for rule, only, what, mutate in MUTATIONS:
        for overlay, objs in rendered.items():
            if only and only not in overlay:
                continue
            mutant = copy.deepcopy(objs)
            mutate(mutant)
            found = [m for r, m in check_policy(mutant, overlay) if r == rule]
            if not found:
                fail("mutation %s [%s] '%s': the checker did not report it" % (overlay, rule, what))
            tried.add(rule)
    rules = {r for r, *_ in MUTATIONS}
    log("ok   mutation pass: %d mutations over %d rules, each reported" % (len(MUTATIONS), len(rules)))


# ----------------------------------------------- (a) schema validation ----

def ensure_venv():
    """Runs scripts/install-py-deps.sh once when its venv lacks kubernetes-validate
    (not with ZB_NO_PY_INSTALL=1)."""
    kv = os.path.join(VENV, "bin", "kubernetes-validate")
    if not os.access(kv, os.X_OK) and os.environ.get("ZB_NO_PY_INSTALL") != "1" and not ensure_venv.tried:
        ensure_venv.tried = True
        log("info kubernetes-validate missing: running scripts/install-py-deps.sh")
        subprocess.run([os.path.join(ROOT, "scripts", "install-py-deps.sh")], timeout=300)
    return kv


ensure_venv.tried = False


def validate_schemas(rendered, files, yaml):
    kv = ensure_venv()
    pinned = kv_pinned_version()
    if not os.access(kv, os.X_OK):
        venv_missing("schema validation")
        return
    have = subprocess.run([kv, "--version"], capture_output=True, text=True).stdout.strip().split()[-1:]
    if have != [pinned]:
        fail("kubernetes-validate is %r, the pin (scripts/install-py-deps.sh) is %s" % (have, pinned))

    def run(path):
        r = subprocess.run([kv, "--strict", "-k", K8S_VERSION, path], capture_output=True, text=True, timeout=120)
        return r.returncode, (r.stdout + r.stderr).splitlines()

    # The validator must reject a broken object: an unknown field (strict)
    # and a wrong type.
    sample = copy.deepcopy(next(o for o in rendered["cpu-demo"] if o["kind"] == "StatefulSet"))
    sample["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    sample2 = copy.deepcopy(sample)
    del sample2["spec"]["template"]["spec"]["containers"][0]["readinessProbes"]
    sample2["spec"]["replicas"] = "two"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all([sample, sample2], f)
    rc, out = run(f.name)
    os.unlink(f.name)
    if rc == 0 or sum(1 for line in out if line.startswith("ERROR")) != 2:
        fail("kubernetes-validate did not reject both broken objects: %s" % out)
    for overlay, path in files.items():
        rc, out = run(path)
        passed = [line for line in out if line.startswith("INFO") and " passed " in line]
        errors = [line for line in out if line.startswith(("ERROR", "FATAL"))]
        warns = [line for line in out if line.startswith("WARN")]
        objs = rendered[overlay]
        n_core = sum(1 for o in objs if o["kind"] not in CRD_KINDS)
        for line in errors:
            fail("schema %s: %s" % (overlay, line))
        for line in warns:
            if not any("kind %s " % k in line for k in CRD_KINDS):
                fail("schema %s: %s" % (overlay, line))
        if rc != 0 or len(passed) != n_core:
            fail("schema %s: %d of %d objects passed (rc %d)" % (overlay, len(passed), n_core, rc))
        else:
            log("ok   schema %s: %d objects valid against Kubernetes %s (strict, kubernetes-validate %s)"
                % (overlay, n_core, K8S_VERSION, pinned))


DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
POD_EP_KEYS = {"port", "portNumber", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "honorLabels",
               "honorTimestamps", "relabelings", "metricRelabelings", "params", "tlsConfig", "basicAuth",
               "bearerTokenSecret", "authorization", "oauth2", "followRedirects", "enableHttp2", "filterRunning",
               "proxyUrl"}
MON_SPEC_KEYS = {"selector", "namespaceSelector", "jobLabel", "podTargetLabels", "targetLabels", "sampleLimit",
                 "targetLimit", "labelLimit", "labelNameLengthLimit", "labelValueLengthLimit", "attachMetadata",
                 "podMetricsEndpoints", "endpoints"}


def check_crd(o):
    """Structural errors of a PodMonitor/ServiceMonitor (monitoring.coreos.com/v1)."""
    errs = []
    if o.get("apiVersion") != "monitoring.coreos.com/v1":
        errs.append("apiVersion %r" % o.get("apiVersion"))
    if set(o) - {"apiVersion", "kind", "metadata", "spec"}:
        errs.append("unknown top-level fields %s" % sorted(set(o) - {"apiVersion", "kind", "metadata", "spec"}))
    if not (o.get("metadata") or {}).get("name"):
        errs.append("no metadata.name")
    spec = o.get("spec") or {}
    if set(spec) - MON_SPEC_KEYS:
        errs.append("unknown spec fields %s" % sorted(set(spec) - MON_SPEC_KEYS))
    epkey = "podMetricsEndpoints" if o["kind"] == "PodMonitor" else "endpoints"
    sel = spec.get("selector")
    if not isinstance(sel, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in (sel.get("matchLabels") or {}).items()):
        errs.append("selector is not a label selector")
    eps = spec.get(epkey)
    if not isinstance(eps, list) or not eps:
        errs.append("%s is not a non-empty list" % epkey)
    for ep in eps or []:
        if not isinstance(ep, dict):
            errs.append("endpoint %r is not a mapping" % (ep,))
            continue
        if set(ep) - POD_EP_KEYS:
            errs.append("unknown endpoint fields %s" % sorted(set(ep) - POD_EP_KEYS))
        if "port" in ep and not isinstance(ep["port"], str):
            errs.append("endpoint port must be a port name (string)")
        if "path" in ep and not str(ep["path"]).startswith("/"):
            errs.append("endpoint path %r" % ep["path"])
        if ep.get("scheme", "http") not in ("http", "https"):
            errs.append("endpoint scheme %r" % ep.get("scheme"))
        for k in ("interval", "scrapeTimeout"):
            if k in ep and not DURATION.match(str(ep[k])):
                errs.append("endpoint %s %r is not a duration" % (k, ep[k]))
        for k in ("honorLabels", "honorTimestamps"):
            if k in ep and not isinstance(ep[k], bool):
                errs.append("endpoint %s is not a boolean" % k)
    return errs


def crd_pass(rendered):
    n = 0
    for overlay, objs in rendered.items():
        for o in objs:
            if o.get("kind") in CRD_KINDS:
                n += 1
                for e in check_crd(o):
                    fail("crd %s %s/%s: %s" % (overlay, o["kind"], o["metadata"].get("name"), e))
    # and the structural check itself rejects a broken one
    probe = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
             "spec": {"selector": {"matchLabels": {"a": "b"}},
                      "podMetricsEndpoints": [{"port": 9464, "interval": "15 seconds", "honorLabel": True}]}}
    if len(check_crd(probe)) < 3:
        fail("crd: the structural check missed errors in a broken PodMonitor: %s" % check_crd(probe))
    log("ok   crd: %d PodMonitor/ServiceMonitor objects structurally valid (monitoring.coreos.com/v1)" % n)


# ------------------------------------------- (b) the real binaries ----

def find_bin(env, rel):
    p = os.environ.get(env) or os.path.join(ROOT, "build", "dev", rel)
    return p if os.access(p, os.X_OK) else None


def grpc_python():
    """An interpreter with grpcio: this one, else Debian's."""
    for py in (sys.executable, "/usr/bin/python3"):
        if py and os.access(py, os.X_OK) and subprocess.run(
                [py, "-c", "import grpc"], capture_output=True).returncode == 0:
            return py
    return None


def binaries_pass(rendered):
    coord_bin = find_bin("ZB_COORDINATOR_BIN", "daemon/zb-coordinator")
    worker_bin = find_bin("ZB_WORKER_BIN", "worker/zb-worker")
    if not coord_bin or not worker_bin:
        skip("binaries: zb-coordinator/zb-worker not built (build/dev, or ZB_COORDINATOR_BIN/ZB_WORKER_BIN)")
        return
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "-rn", "true"], capture_output=True).returncode != 0:
        skip("binaries: 'unshare -rn' (a private network namespace) is not available here")
        return
    py = grpc_python() or sys.executable
    for overlay, objs in rendered.items():
        with tempfile.TemporaryDirectory(prefix="zb-k8s-") as tmp:
            spec = os.path.join(tmp, "spec.json")
            with open(spec, "w") as f:
                json.dump({"overlay": overlay, "objs": objs, "tmp": tmp, "coord_bin": coord_bin,
                           "worker_bin": worker_bin}, f)
            r = subprocess.run([unshare, "-rn", py, os.path.abspath(__file__), "--netns-check", spec],
                               capture_output=True, text=True, timeout=120)
            for line in r.stdout.splitlines():
                if line.startswith("FAIL "):
                    fail("binaries %s: %s" % (overlay, line[5:]))
                elif line.startswith("SKIP "):
                    skip("binaries %s: %s" % (overlay, line[5:]))
                else:
                    log("%s (%s)" % (line, overlay))
            if r.returncode not in (0, 1):
                fail("binaries %s: the check exited %d: %s" % (overlay, r.returncode, r.stderr[-2000:]))


def wait_for(pred, timeout, step=0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def kubelet_grpc_probe(port, service, tls_ca=None):
    """grpc.health.v1.Health/Check as the kubelet sends it: plaintext, no
    credentials (or, with tls_ca, TLS without a client certificate, as
    Kubernetes 1.37's grpc.mode TLS). True when SERVING; None without grpcio."""
    try:
        import grpc
    except ImportError:
        return None
    if tls_ca:
        with open(tls_ca, "rb") as f:
            ch = grpc.secure_channel("127.0.0.1:%d" % port, grpc.ssl_channel_credentials(root_certificates=f.read()))
    else:
        ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    try:
        req = (b"\x0a" + bytes([len(service)]) + service.encode()) if service else b""
        call = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        return call(req, timeout=2) == b"\x08\x01"
    except grpc.RpcError:
        return False
    finally:
        ch.close()


def tcp_probe(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def exec_probe(p):
    return subprocess.run(p["exec"]["command"], capture_output=True, timeout=10).returncode == 0


def run_probe(p, default_port):
    if "grpc" in p:
        return kubelet_grpc_probe(p["grpc"].get("port", default_port), p["grpc"].get("service", ""))
    if "tcpSocket" in p:
        port = p["tcpSocket"]["port"]
        return tcp_probe(port if isinstance(port, int) else default_port)
    if "exec" in p:
        return exec_probe(p)
    return False


def netns_check(spec_path):
    """Runs inside `unshare -rn`: loopback only, nothing else listening."""
    with open(spec_path) as f:
        s = json.load(f)
    objs, tmp = s["objs"], s["tmp"]
    if subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True).returncode != 0:
        print("SKIP 'ip link set lo up' failed (iproute2) in the private namespace")
        return 0
    ok = True

    def bad(msg):
        nonlocal ok
        ok = False
        print("FAIL " + msg, flush=True)

    coord, cspec = find_component(objs, "coordinator")
    worker, wspec = find_component(objs, "worker")
    cc, wc = cspec["containers"][0], wspec["containers"][0]
    paths = {"/etc/zb/tls": os.path.join(tmp, "tls"), "/data": os.path.join(tmp, "data"),
             "/etc/zb/config": os.path.join(tmp, "config")}
    for d in paths.values():
        os.makedirs(d, exist_ok=True)
    # the ConfigMap's file where --config names it
    cfg_arg = flag(cc["args"], "--config")[0]
    vol = next(v for v in cspec["volumes"] if v["name"] == next(
        m["name"] for m in cc["volumeMounts"] if m["mountPath"] == os.path.dirname(cfg_arg)))
    cm = find(objs, "ConfigMap", vol["configMap"]["name"])
    with open(os.path.join(paths["/etc/zb/config"], os.path.basename(cfg_arg)), "w") as f:
        f.write(cm["data"][os.path.basename(cfg_arg)])
    tls = has_tls(cc["args"])
    if tls:
        r = subprocess.run([os.path.join(ROOT, "scripts", "make-certs.sh"), paths["/etc/zb/tls"], "--host",
                            "zb-coordinator", "--worker", "zb-worker-0"], capture_output=True, text=True)
        if r.returncode != 0:
            print("SKIP make-certs.sh failed: %s" % r.stderr.strip())
            return 0
        os.chmod(paths["/etc/zb/tls"], 0o755)

    def subst(a, env):
        """$(VAR) as the kubelet expands it; mounted paths moved under tmp."""
        for k, val in env.items():
            a = a.replace("$(%s)" % k, val)
        for k, val in paths.items():
            a = re.sub(r"(?<==)" + re.escape(k) + r"(?=/|$)", lambda _m, val=val: val, a)
        return a

    env = {"POD_NAME": "zb-worker-0", "POD_IP": "127.0.0.1"}
    # The coordinator: the rendered arguments, data_dir moved off /var/lib/zb.
    cargs = [subst(a, env) for a in cc["args"]] + ["--data-dir=" + os.path.join(tmp, "zbdata")]
    clog = open(os.path.join(tmp, "coordinator.log"), "w+")
    cp = subprocess.Popen([s["coord_bin"]] + cargs, stdout=clog, stderr=subprocess.STDOUT)
    wp = None
    try:
        if not wait_for(lambda: tcp_probe(GRPC_PORT) or cp.poll() is not None, 10) or cp.poll() is not None:
            clog.seek(0)
            bad("zb-coordinator %s did not start: %s" % (" ".join(cargs), clog.read()[-1500:]))
            return 1
        for kind, p in probes(cc).items():
            res = run_probe(p, GRPC_PORT)
            if res is None:
                print("SKIP %s of the coordinator: no grpcio here to speak gRPC health" % kind)
            elif not wait_for(lambda: run_probe(p, GRPC_PORT), 5, 0.25):
                bad("coordinator %s (%s) fails against the running coordinator"
                    % (kind, sorted(set(p) & {"grpc", "tcpSocket", "exec"})))
            else:
                how = "gRPC health, service \"\", plaintext" if "grpc" in p else "TCP connect to %d" % GRPC_PORT
                print("ok   coordinator %s passes (%s)" % (kind, how))
        if tls:
            plain = kubelet_grpc_probe(GRPC_PORT, "")
            if plain is True:
                bad("with TLS on, a plaintext gRPC health check still passes")
            elif plain is False:
                print("ok   with TLS on, the kubelet-style plaintext gRPC probe fails (hence tcpSocket)")
            if kubelet_grpc_probe(GRPC_PORT, "", os.path.join(paths["/etc/zb/tls"], "ca.pem")) is False:
                bad("with TLS on, gRPC health over TLS without a client certificate is not SERVING")
            else:
                print("ok   with TLS on, gRPC health over TLS without a client certificate is SERVING")
        try:
            body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % METRICS_PORT, timeout=3).read().decode()
            if "zb_build_info" not in body:
                bad("/metrics on %d lacks zb_build_info" % METRICS_PORT)
            else:
                print("ok   /metrics on port %d answers (the PodMonitor's target)" % METRICS_PORT)
        except OSError as e:
            bad("/metrics on %d: %s" % (METRICS_PORT, e))
        # The worker: rendered arguments, the coordinator's Service name
        # pointed at loopback.
        wprobes = probes(wc)
        for kind, p in wprobes.items():
            if run_probe(p, DATA_PORT):
                bad("worker %s passes before the worker runs" % kind)
        wargs = [subst(a, env) for a in wc["args"]]
        wargs = [re.sub(r"^--coordinator=[^:]+:", "--coordinator=127.0.0.1:", a) for a in wargs]
        wenv = dict(os.environ)
        for e in wc.get("env") or []:
            if "value" in e:
                wenv[e["name"]] = e["value"]
        wenv.update(env)
        wlog = open(os.path.join(tmp, "worker.log"), "w+")
        wp = subprocess.Popen([s["worker_bin"]] + wargs, stdout=wlog, stderr=subprocess.STDOUT, env=wenv)
        for kind, p in wprobes.items():
            if not wait_for(lambda: run_probe(p, DATA_PORT) or wp.poll() is not None, 10, 0.2) or wp.poll() is not None:
                wlog.seek(0)
                bad("worker %s never passed (worker %s): %s" % (kind, "exited %s" % wp.poll() if wp.poll() is not None
                                                                else "running", wlog.read()[-1500:]))
            else:
                print("ok   worker %s passes once it runs" % kind)
        clog.seek(0)
        if not wait_for(lambda: "zb-worker-0" in open(clog.name).read(), 5):
            bad("the coordinator's log never names worker zb-worker-0 (attach)")
        else:
            print("ok   worker zb-worker-0 attached%s" % (" over mutual TLS" if tls else ""))
        # readiness follows the coordinator connection; liveness the process
        cp.send_signal(signal.SIGTERM)
        cp.wait(timeout=10)
        rp = wprobes.get("readinessProbe")
        if rp and not wait_for(lambda: not run_probe(rp, DATA_PORT), 5, 0.2):
            bad("worker readiness still passes with the coordinator gone")
        elif rp:
            print("ok   worker readiness fails once the coordinator is gone")
        lp = wprobes.get("livenessProbe")
        if lp and not run_probe(lp, DATA_PORT):
            bad("worker liveness fails while the worker runs")
        wp.send_signal(signal.SIGTERM)
        wp.wait(timeout=10)
        if lp and run_probe(lp, DATA_PORT):
            bad("worker liveness passes after the worker exited")
        elif lp:
            print("ok   worker liveness fails once the worker is gone")
    finally:
        for p in (cp, wp):
            if p and p.poll() is None:
                p.kill()
                p.wait()
    return 0 if ok else 1


# ------------------------------------------------- (c) the Dockerfile ----

def parse_dockerfile(text):
    """[(INSTRUCTION, arguments)] with continuations joined, comments dropped."""
    out, cur = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if cur and s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        ins, _, rest = cur.partition(" ")
        out.append((ins.upper(), rest.strip()))
        cur = ""
    return out


def lint_dockerfile(text, ignore_text):
    """[(rule, message)]; and the stages: {name: {from, user, entrypoint, apt}}."""
    v, stages, cur = [], {}, None
    for ins, rest in parse_dockerfile(text):
        if ins == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            if not m:
                v.append(("docker-from", "FROM %r" % rest))
                continue
            image, name = m.group(1), (m.group(2) or "stage%d" % len(stages)).lower()
            parent = stages.get(image.lower())
            cur = {"from": image, "user": parent["user"] if parent else None,
                   "entrypoint": parent["entrypoint"] if parent else None, "apt": [], "run": []}
            if not parent:
                tag = image.rsplit("/", 1)[-1]
                if ":" not in tag and "@" not in image or tag.endswith(":latest"):
                    v.append(("docker-base-pinned", "base image %s has no pinned tag" % image))
            stages[name] = cur
        elif cur is None:
            if ins != "ARG":
                v.append(("docker-from", "%s before FROM" % ins))
        elif ins == "USER":
            cur["user"] = rest
        elif ins == "ENTRYPOINT":
            cur["entrypoint"] = rest
        elif ins == "ADD" and re.search(r"(https?|ftp)://|git@", rest):
            v.append(("docker-add-url", "ADD of a URL: %s" % rest))
        elif ins == "RUN":
            cur["run"].append(rest)
            m = re.search(r"apt-get install ([^&;|]*)", rest)
            if m:
                cur["apt"] += [w for w in m.group(1).split() if not w.startswith("-")]
    if sum(1 for s in stages.values() if s["from"].lower() not in stages) < 2:
        v.append(("docker-multistage", "not a multi-stage build (a build and a runtime base)"))
    if not any("install-deps.sh" in r for s in stages.values() for r in s["run"]):
        v.append(("docker-build", "the build stage does not use scripts/install-deps.sh"))
    if not any(re.search(r"cmake --preset \S+.*-DZB_CUDA=OFF", r) for s in stages.values() for r in s["run"]):
        v.append(("docker-build", "no 'cmake --preset ... -DZB_CUDA=OFF' build"))
    roles = {"coordinator": "zb-coordinator", "worker": "zb-worker", "zbctl": "zbctl"}
    for role, binary in roles.items():
        st = stages.get(role)
        if not st:
            v.append(("docker-entrypoint", "no stage '%s'" % role))
            continue
        try:
            ep = json.loads(st["entrypoint"] or "null")
        except ValueError:
            ep = None
        if not isinstance(ep, list) or not ep or ep[0] != "/usr/local/bin/" + binary:
            v.append(("docker-entrypoint", "stage %s: ENTRYPOINT %r, want exec form /usr/local/bin/%s"
                      % (role, st["entrypoint"], binary)))
        user = (st["user"] or "").split(":")[0]
        if not user.isdigit() or int(user) == 0:
            v.append(("docker-user", "stage %s runs as %r: want a numeric non-root UID" % (role, st["user"])))
        elif int(user) != IMAGE_UID:
            v.append(("docker-user", "stage %s: UID %s, the manifests run as %d" % (role, user, IMAGE_UID)))
    ign = {line.strip().rstrip("/") for line in ignore_text.splitlines() if line.strip() and not line.startswith("#")}
    for need in ("build", ".git"):
        if need not in ign and "/" + need not in ign:
            v.append(("dockerignore", ".dockerignore does not exclude %s" % need))
    return v, stages


DOCKER_MUTATIONS = [
    ("docker-user", "USER root", lambda t: t.replace("USER 10001:10001", "USER root")),
    ("docker-user", "USER 0", lambda t: t.replace("USER 10001:10001", "USER 0")),
    ("docker-add-url", "ADD of a URL",
     lambda t: t.replace("COPY . /src", "ADD https://example.com/zb.tar.gz /src\nCOPY . /src")),
    ("docker-multistage", "one stage", lambda t: re.sub(r"(?ms)^FROM debian:12-slim AS runtime.*", "", t)),
    ("docker-base-pinned", "debian:latest",
     lambda t: t.replace("FROM debian:12 AS build", "FROM debian:latest AS build")),
    ("docker-entrypoint", "shell-form ENTRYPOINT",
     lambda t: t.replace('ENTRYPOINT ["/usr/local/bin/zb-worker"]', "ENTRYPOINT zb-worker")),
]


def needed_libs(binary):
    r = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)


def runtime_libs_check(stages):
    """Every shared library the binaries need comes from a package the
    runtime stage installs, or one debian:12-slim has."""
    slim = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}
    runtime = stages.get("runtime")
    if not runtime:
        return
    bins = []
    for rel in ("daemon/zb-coordinator", "worker/zb-worker", "client/zbctl"):
        for tree in ("release", "nocuda", "dev"):
            p = os.path.join(ROOT, "build", tree, rel)
            if os.access(p, os.X_OK):
                bins.append(p)
                break
    if len(bins) < 3 or not shutil.which("readelf") or not shutil.which("dpkg"):
        skip("Dockerfile runtime libraries: needs the three binaries built, readelf and dpkg")
        return
    apt = set(runtime["apt"])
    gpu_only = []
    for b in bins:
        for lib in needed_libs(b):
            if re.match(r"lib(cudart|cublas|cublasLt|nccl|cuda)\.so", lib):
                gpu_only.append(lib)
                continue
            r = subprocess.run(["dpkg", "-S", "*/" + lib], capture_output=True, text=True)
            pkgs = {line.split(":")[0] for line in r.stdout.splitlines() if not line.split(":")[0].endswith("-dev")}
            if not pkgs:
                fail("Dockerfile: %s needs %s, which no Debian package provides here" % (os.path.basename(b), lib))
            elif not pkgs & (apt | slim):
                fail("Dockerfile: %s needs %s (%s), not installed in the runtime stage"
                     % (os.path.basename(b), lib, ", ".join(sorted(pkgs))))
    log("ok   Dockerfile runtime stage provides every library %s need%s" % (
        ", ".join(os.path.basename(b) for b in bins),
        " (CUDA libraries of this CUDA build left to a GPU image: %s)" % ", ".join(sorted(set(gpu_only)))
        if gpu_only else ""))


def docker_build():
    if os.environ.get("ZB_SKIP_DOCKER_BUILD") == "1":
        skip("docker build: ZB_SKIP_DOCKER_BUILD=1")
        return
    docker = shutil.which("docker")
    if not docker:
        skip("docker build: no docker client")
        return
    r = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or "Cannot connect" in r.stderr + r.stdout:
        why = (r.stderr.strip().splitlines() or ["docker info failed"])[-1]
        skip("docker build: no Docker daemon reachable (%s)" % why)
        return
    for base in ("debian:12", "debian:12-slim"):
        r = subprocess.run([docker, "pull", "-q", base], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            skip("docker build: cannot pull %s (%s)" % (base, r.stderr.strip()[-300:]))
            return
    tag = "zb-coordinator:k8s-test"
    t0 = time.monotonic()
    r = subprocess.run([docker, "build", "--target", "coordinator", "-t", tag, ROOT], capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        fail("docker build failed: %s" % (r.stdout + r.stderr)[-3000:])
        return
    r = subprocess.run([docker, "run", "--rm", "--read-only", tag, "--version"], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0 or not r.stdout.startswith("zb-coordinator "):
        fail("zb-coordinator --version in the image: rc %d, %r" % (r.returncode, r.stdout + r.stderr))
    else:
        log("ok   docker build --target coordinator (%.0f s); in it: %s" % (time.monotonic() - t0, r.stdout.strip()))
    r = subprocess.run([docker, "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True, text=True,
                       timeout=60)
    if r.stdout.strip() != str(IMAGE_UID):
        fail("the image runs as UID %r, not %d" % (r.stdout.strip(), IMAGE_UID))


def dockerfile_pass():
    if not os.path.exists(DOCKERFILE):
        fail("no Dockerfile at the repository root")
        return
    text = open(DOCKERFILE).read()
    ign = open(DOCKERIGNORE).read() if os.path.exists(DOCKERIGNORE) else ""
    viol, stages = lint_dockerfile(text, ign)
    for rule, msg in viol:
        fail("Dockerfile [%s]: %s" % (rule, msg))
    if not viol:
        log("ok   Dockerfile lint: %d stages (%s), USER %d, no ADD of URLs, pinned bases, .dockerignore"
            % (len(stages), ", ".join(stages), IMAGE_UID))
    for rule, what, mutate in DOCKER_MUTATIONS:
        if rule not in {r for r, _ in lint_dockerfile(mutate(text), ign)[0]}:
            fail("Dockerfile mutation '%s' [%s]: the lint did not report it" % (what, rule))
    if "dockerignore" not in {r for r, _ in lint_dockerfile(text, "")[0]}:
        fail("Dockerfile mutation 'empty .dockerignore': the lint did not report it")
    log("ok   Dockerfile lint mutation pass: %d mutations, each reported" % (len(DOCKER_MUTATIONS) + 1))
    runtime_libs_check(stages)
    docker_build()


# ------------------------------------------------------------------ main ----

def overlay_names(overlays_dir=OVERLAYS_DIR):
    return sorted(d for d in os.listdir(overlays_dir)
                  if os.path.isfile(os.path.join(overlays_dir, d, "kustomization.yaml")))


def load_rendered(yaml, rendered_dir=RENDERED_DIR, overlays_dir=OVERLAYS_DIR):
    """The committed rendered manifests, one file per overlay:
    (problems, {overlay: objects}, {overlay: path}, {overlay: body after the header})."""
    problems, rendered, files, bodies = [], {}, {}, {}
    overlays = overlay_names(overlays_dir)
    if not overlays:
        problems.append("no overlays in %s" % overlays_dir)
    for o in overlays:
        rel = "deploy/k8s/rendered/%s.yaml" % o
        path = os.path.join(rendered_dir, o + ".yaml")
        if not os.path.isfile(path):
            problems.append("overlay %s: %s is missing; run %s and commit it" % (o, rel, RENDER_SCRIPT))
            continue
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
        header, body = lines[:HEADER_LINES], "".join(lines[HEADER_LINES:])
        if len(header) < HEADER_LINES or not header[0].startswith("# GENERATED by " + RENDER_SCRIPT) \
                or "kubectl kustomize deploy/k8s/overlays/%s " % o not in header[1]:
            problems.append("overlay %s: %s lacks the generated header naming %s and its kubectl command; "
                            "run %s" % (o, rel, RENDER_SCRIPT, RENDER_SCRIPT))
            continue
        try:
            objs = [x for x in yaml.safe_load_all(body) if x]
        except yaml.YAMLError as e:
            problems.append("overlay %s: %s is not YAML: %s" % (o, rel, e))
            continue
        rendered[o], files[o], bodies[o] = objs, path, body
    if os.path.isdir(rendered_dir):
        for f in sorted(os.listdir(rendered_dir)):
            if f.endswith(".yaml") and f[:-5] not in overlays:
                problems.append("deploy/k8s/rendered/%s has no overlay in deploy/k8s/overlays; run %s"
                                % (f, RENDER_SCRIPT))
    return problems, rendered, files, bodies


def find_kubectl():
    """(kubectl, kustomize version) with kustomize v5 or newer, else (None, why)."""
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not kubectl:
        return None, "kubectl not found on PATH"
    ver = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    log("info kubectl: %s" % ver.strip().replace("\n", "; "))
    # components and `labels:` in the kustomizations; Debian 12's own
    # kubernetes-client (1.20) embeds kustomize 2.
    m = re.search(r"Kustomize Version: v((\d+)\S*)", ver)
    if not m or int(m.group(2)) < 5:
        return None, "kubectl's kustomize is older than v5 (kubectl >= 1.27 needed): %s" % ver.strip()
    return kubectl, m.group(1)


def rerender_diffs(kubectl, kver, bodies, overlays_dir=OVERLAYS_DIR, only=None):
    """[problem] for each overlay (of only, default all) whose `kubectl kustomize`
    output differs from its committed rendered body (bodies: {overlay: text})."""
    problems = []
    for o in only or overlay_names(overlays_dir):
        r = subprocess.run([kubectl, "kustomize", os.path.join(overlays_dir, o)], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            problems.append("overlay %s: kubectl kustomize failed: %s" % (o, r.stderr.strip()))
        elif o in bodies and r.stdout != bodies[o]:
            diff = list(difflib.unified_diff(bodies[o].splitlines(), r.stdout.splitlines(),
                                             "deploy/k8s/rendered/%s.yaml" % o, "kubectl kustomize", lineterm="", n=1))
            problems.append("overlay %s: deploy/k8s/rendered/%s.yaml differs from `kubectl kustomize "
                            "deploy/k8s/overlays/%s` (kustomize v%s); run %s and commit the result:\n    %s"
                            % (o, o, o, kver, RENDER_SCRIPT, "\n    ".join(diff[:30])))
        elif o in bodies:
            log("ok   overlay %s re-renders to deploy/k8s/rendered/%s.yaml (kustomize v%s)" % (o, o, kver))
    return problems


def stale_selftest(yaml, bodies, kubectl, kver):
    """The freshness checks report what they are for: in a copy of
    deploy/k8s, a missing rendered file, one without its header and one
    without an overlay; with kubectl, an overlay edited but not re-rendered."""
    with tempfile.TemporaryDirectory(prefix="zb-k8s-stale-") as tmp:
        k8s = os.path.join(tmp, "k8s")
        shutil.copytree(K8S, k8s)
        rdir, odir = os.path.join(k8s, "rendered"), os.path.join(k8s, "overlays")
        os.unlink(os.path.join(rdir, "gpu.yaml"))
        with open(os.path.join(rdir, "cpu-demo.yaml"), "w") as f:
            f.write(bodies.get("cpu-demo", ""))
        with open(os.path.join(rdir, "gone.yaml"), "w") as f:
            f.write(bodies.get("cpu-demo", ""))
        problems = load_rendered(yaml, rdir, odir)[0]
        for what, want in (("missing file", "overlay gpu: deploy/k8s/rendered/gpu.yaml is missing"),
                           ("no header", "overlay cpu-demo: deploy/k8s/rendered/cpu-demo.yaml lacks the generated"),
                           ("no overlay", "deploy/k8s/rendered/gone.yaml has no overlay")):
            if not any(p.startswith(want) for p in problems):
                fail("freshness self-test (%s): not reported; got %s" % (what, problems))
        if len(problems) != 3:
            fail("freshness self-test: want 3 problems, got %s" % problems)
        if not kubectl:
            log("ok   freshness self-test: a missing, a headerless and an orphaned rendered file each reported")
            return
        # the edit: one more annotation on every object of cpu-demo
        kfile = os.path.join(odir, "cpu-demo", "kustomization.yaml")
        with open(kfile) as f:
            kust = yaml.safe_load(f)
        kust.setdefault("commonAnnotations", {})["zb.example.com/freshness-self-test"] = "edited"
        with open(kfile, "w") as f:
            yaml.safe_dump(kust, f)
        problems = rerender_diffs(kubectl, kver, bodies, odir, only=["cpu-demo"])
        if len(problems) != 1 or not problems[0].startswith("overlay cpu-demo: ") \
                or RENDER_SCRIPT not in problems[0]:
            fail("freshness self-test (cpu-demo edited, not re-rendered): want one problem naming cpu-demo and "
                 "%s, got %s" % (RENDER_SCRIPT, problems))
        else:
            log("ok   freshness self-test: a missing, a headerless and an orphaned rendered file, and an overlay "
                "edited without re-rendering, each reported")


def venv_missing(what):
    """kubernetes-validate's venv cannot be made: a failure with CI=true, else a skip."""
    if os.environ.get("CI") == "true":
        fail("%s: %s missing (scripts/install-py-deps.sh makes it; it failed or ZB_NO_PY_INSTALL=1); "
             "CI=true needs it" % (what, VENV))
    else:
        skip("%s: %s missing; scripts/install-py-deps.sh makes it (pip, needs network to PyPI)" % (what, VENV),
             hard=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--netns-check":
        return netns_check(sys.argv[2])
    t0 = time.monotonic()
    yaml = import_yaml()
    if not yaml:
        ensure_venv()
        yaml = import_yaml()
    if not yaml:
        venv_missing("PyYAML (Debian package python3-yaml, or the venv's)")
        if FAILS:
            log("FAILED: %d problem(s)" % len(FAILS))
            return 1
        log("SKIPPED: " + "; ".join(HARD_SKIPS))
        return 77
    # (a) the committed rendered manifests; where kubectl is, they must be
    # what the overlays render to now
    problems, rendered, files, bodies = load_rendered(yaml)
    for p in problems:
        fail(p)
    for need in ("cpu-demo", "gpu"):
        if need not in rendered:
            fail("overlay %s: no usable deploy/k8s/rendered/%s.yaml" % (need, need))
    for o, objs in sorted(rendered.items()):
        log("ok   deploy/k8s/rendered/%s.yaml: %d objects (%s)"
            % (o, len(objs), ", ".join(sorted({x["kind"] for x in objs}))))
    kubectl, kver = find_kubectl()
    if kubectl:
        for p in rerender_diffs(kubectl, kver, bodies):
            fail(p)
    else:
        skip("re-rendering the overlays to compare with deploy/k8s/rendered: %s" % kver)
        kver = None
    stale_selftest(yaml, bodies, kubectl, kver)
    if "cpu-demo" in rendered and "gpu" in rendered:
        validate_schemas(rendered, files, yaml)
        crd_pass(rendered)
        policy_pass(rendered)
        binaries_pass(rendered)
    dockerfile_pass()
    log("info %.1f s" % (time.monotonic() - t0))
    for s in SKIPS:
        log("note skipped: " + s)
    if FAILS:
        log("FAILED: %d problem(s)" % len(FAILS))
        return 1
    if HARD_SKIPS:
        log("SKIPPED: " + "; ".join(HARD_SKIPS))
        return 77
    log("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
