"""zbsvc: real zb-coordinator / zb-worker / zbctl processes on loopback for
the service tests (run with Debian's /usr/bin/python3, which has grpcio).

ctest passes the binaries and the generated stubs by environment
(tests/service/CMakeLists.txt): ZB_COORDINATOR_BIN, ZB_WORKER_BIN,
ZBCTL_BIN, ZB_PY_STUBS (zb/v1/zb_pb2*.py), ZB_PY_HEALTH_PB2 (the health
messages, loaded by path: their grpc/ directory would shadow grpcio),
ZB_PROMTOOL, ZB_TEST_SANITIZE (1 for the ASan build: waits get longer).

A Cluster is a context manager: a coordinator on 127.0.0.1:0 with a fresh
data dir and N workers, all attached before the body runs; on the way out
every process it started is stopped by PID (SIGTERM, then SIGKILL), each
one's stderr is kept in a log file, and the tails are printed when the
body failed. Processes stopped with SIGTERM must exit 0 and no log may hold
a sanitizer report: a leak or UB at exit fails the test that caused it.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.environ["ZB_PY_STUBS"])

import grpc  # noqa: E402
from zb.v1 import zb_pb2, zb_pb2_grpc  # noqa: E402


def _load_health():
    spec = importlib.util.spec_from_file_location("zb_health_pb2", os.environ["ZB_PY_HEALTH_PB2"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


health_pb2 = _load_health()

COORDINATOR = os.environ["ZB_COORDINATOR_BIN"]
WORKER = os.environ["ZB_WORKER_BIN"]
ZBCTL = os.environ["ZBCTL_BIN"]
MAKE_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make-certs.sh")
PROMTOOL = os.environ.get("ZB_PROMTOOL", "")
SANITIZE = os.environ.get("ZB_TEST_SANITIZE", "0") == "1"
# Upper bounds of waits (never asserted durations) stretch under ASan.
SLOW = 3.0 if SANITIZE else 1.0

SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "SUMMARY: UndefinedBehaviorSanitizer", "WARNING: ThreadSanitizer")

STATE = zb_pb2.JobState
TERMINAL = (STATE.JOB_STATE_SUCCEEDED, STATE.JOB_STATE_FAILED, STATE.JOB_STATE_CANCELLED)


def state_name(s):
    return zb_pb2.JobState.Name(s)


# setpriv --pdeathsig: a child dies with this test even when ctest kills it
# at its timeout, so no daemon outlives the test (preexec_fn is unsafe once
# grpcio's threads exist).
_SETPRIV = shutil.which("setpriv")
_WRAP = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []


def sanitizer_report(text):
    return any(m in text for m in SANITIZER_MARKS)


class Proc:
    """One child process; stdout and stderr go to a log file."""

    def __init__(self, name, argv, log_dir, env=None):
        self.name = name
        self.argv = argv
        self.env = dict(os.environ, **env) if env else None
        self.log_path = os.path.join(log_dir, name + ".log")
        self.expect_clean_exit = True  # False once the test killed it on purpose
        self.rc = None
        self._start()

    def _start(self):
        with open(self.log_path, "ab") as log:
            log.write(("=== start: %s\n" % " ".join(self.argv)).encode())
            log.flush()
            self.p = subprocess.Popen(_WRAP + self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, env=self.env)
        self.rc = None

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.p.pid, sig)

    def kill(self):
        """SIGKILL on purpose (a crash the test simulates)."""
        self.expect_clean_exit = False
        self.signal(signal.SIGKILL)
        self.rc = self.p.wait()
        return self.rc

    def wait(self, timeout):
        try:
            self.rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.rc

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after timeout. Returns (rc, clean)."""
        if not self.alive():
            self.rc = self.p.wait()
            return self.rc, True
        self.signal(signal.SIGTERM)
        rc = self.wait(timeout * SLOW)
        if rc is None:
            self.signal(signal.SIGKILL)
            self.rc = self.p.wait()
            return self.rc, False
        return rc, True

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def tail(self, n=40):
        lines = self.log_text().splitlines()
        return "\n".join(lines[-n:])


def job_spec(name="t", ranks=4, microbatches=16, schedule="1f1b", t=0.01, iterations=4, **kw):
    """A JobSpec with T_F = T_B = T_W = t seconds (one rank's share)."""
    costs = zb_pb2.RankCosts(t_f=kw.pop("t_f", t), t_b=kw.pop("t_b", t), t_w=kw.pop("t_w", t),
                             t_comm=kw.pop("t_comm", 0.0))
    return zb_pb2.JobSpec(name=name, ranks=ranks, microbatches=microbatches, schedule=schedule, costs=costs,
                          iterations=iterations, **kw)


def job_yaml(name="t", ranks=4, microbatches=16, schedule="1f1b", t=0.01, iterations=4):
    return ("name: %s\nranks: %d\nmicrobatches: %d\nschedule: %s\niterations: %d\n"
            "costs:\n  f: %g\n  b: %g\n  w: %g\n" % (name, ranks, microbatches, schedule, iterations, t, t, t))


def wait_until(what, fn, timeout, interval=0.05):
    """Polls fn until it returns something true; fails after timeout * SLOW."""
    deadline = time.monotonic() + timeout * SLOW
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s (last: %r)" % (timeout * SLOW, what,
                                                                                      last))
        time.sleep(interval)


class Cluster:
    """zb-coordinator plus N zb-workers on loopback (see the module doc)."""

    def __init__(self, workers=4, heartbeat_timeout_ms=1500, max_message_bytes=None, coordinator_args=(),
                 name=None, worker_args=None, tls=False, data_dir=None):
        self.tls = tls  # mutual TLS: certificates from scripts/make-certs.sh in DIR/certs
        self.data_dir_arg = data_dir  # the coordinator's data_dir (default DIR/data)
        self.identity = "user-alice"  # whose certificate self.stub and zbctl present (tls only)
        self.n_workers = workers
        self.worker_args = worker_args  # k -> extra flags of worker k (e.g. its --gpu), or None
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.max_message_bytes = max_message_bytes
        self.coordinator_args = list(coordinator_args)
        self.name = name or "cluster"
        self.dir = None
        self.coordinator = None
        self.workers = {}  # id -> Proc
        self.procs = []  # every Proc ever started, for the teardown checks
        self.channel = None
        self.stub = None
        self.port = self.metrics_port = None

    # ---- lifetime ----

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="zbsvc-%s-" % self.name)
        self.data_dir = self.data_dir_arg or os.path.join(self.dir, "data")
        try:
            if self.tls:
                self.make_certs(workers=["w%d" % k for k in range(self.n_workers)], users=["alice", "bob"],
                                admins=["root"])
            self.start_coordinator()
            for k in range(self.n_workers):
                self.start_worker("w%d" % k, extra=self.worker_args(k) if self.worker_args else ())
            self.wait_workers(self.n_workers)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, et, ev, tb):
        problems = []
        if self.channel:
            self.channel.close()
            self.channel = None
        # workers first: a worker that outlives its coordinator only retries
        live = [p for p in self.procs if p.alive()]
        for p in live:
            p.signal(signal.SIGTERM)
        for p in live:
            rc = p.wait(10 * SLOW)
            if rc is None:
                p.signal(signal.SIGKILL)
                p.rc = p.p.wait()
                problems.append("%s did not exit within %.0f s of SIGTERM (killed)" % (p.name, 10 * SLOW))
            elif p.expect_clean_exit and rc != 0:
                problems.append("%s exited %d after SIGTERM" % (p.name, rc))
        for p in self.procs:
            if sanitizer_report(p.log_text()):
                problems.append("%s: sanitizer report in %s" % (p.name, p.log_path))
        if et is not None or problems:
            for p in self.procs:
                print("----- %s (pid %d, rc %s): last lines of %s" % (p.name, p.pid, p.rc, p.log_path))
                print(p.tail(60 if sanitizer_report(p.log_text()) else 30))
            sys.stdout.flush()
        if self.dir and not os.environ.get("ZB_TEST_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
        if et is None and problems:
            raise AssertionError("; ".join(problems))
        return False

    def start_coordinator(self, port=0, extra=()):
        """Starts zb-coordinator (port 0: any) on the cluster's data dir and
        waits for its --port-file; (re)connects self.stub."""
        port_file = os.path.join(self.dir, "ports")
        if os.path.exists(port_file):
            os.unlink(port_file)
        argv = [COORDINATOR, "--listen", "127.0.0.1:%d" % port, "--metrics-listen", "127.0.0.1:0",
                "--data-dir", self.data_dir, "--port-file", port_file, "--heartbeat-timeout-ms",
                str(self.heartbeat_timeout_ms)]
        if self.max_message_bytes:
            argv += ["--max-message-bytes", str(self.max_message_bytes)]
        if self.tls:
            argv += self.tls_flags("coordinator")
        argv += self.coordinator_args + list(extra)
        if self.coordinator is None:
            self.coordinator = Proc("coordinator", argv, self.dir)
            self.procs.append(self.coordinator)
        else:
            self.coordinator.argv = argv
            self.coordinator.expect_clean_exit = True
            self.coordinator._start()

        def ready():
            if not self.coordinator.alive():
                raise AssertionError("zb-coordinator exited %s at start:\n%s" %
                                     (self.coordinator.p.poll(), self.coordinator.tail()))
            return os.path.exists(port_file)

        wait_until("the coordinator's port file", ready, 15)
        with open(port_file) as f:
            self.port, self.metrics_port = (int(x) for x in f.read().split())
        self.connect()
        return self.coordinator

    def connect(self):
        if self.channel:
            self.channel.close()
        self.channel = self.open_channel(self.identity if self.tls else None)
        self.stub = zb_pb2_grpc.ZbStub(self.channel)

    # ---- mutual TLS ----

    def make_certs(self, workers=(), users=(), admins=(), days=None, ca_dir=None):
        """scripts/make-certs.sh into DIR/certs (or ca_dir: another CA)."""
        argv = ["bash", MAKE_CERTS, ca_dir or os.path.join(self.dir, "certs")]
        for flag, names in (("--worker", workers), ("--user", users), ("--admin", admins)):
            for n in names:
                argv += [flag, n]
        if days is not None:
            argv += ["--days", str(days)]
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, "make-certs.sh: %s" % cp.stderr

    def cert_paths(self, who, ca_dir=None):
        """(ca, cert, key) paths of identity who ("user-alice", "worker-w0",
        "coordinator") in DIR/certs or ca_dir."""
        d = ca_dir or os.path.join(self.dir, "certs")
        return os.path.join(d, "ca.pem"), os.path.join(d, who + ".pem"), os.path.join(d, who + ".key")

    def tls_flags(self, who):
        ca, cert, key = self.cert_paths(who)
        return ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key]

    def open_channel(self, who, ca_dir=None, trust_dir=None):
        """A channel presenting who's certificate (None on a tls cluster: TLS
        without a client certificate; plaintext otherwise); trust_dir: the
        CA to check the coordinator against (default the cluster's)."""
        target = "127.0.0.1:%d" % self.port
        opts = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 500)]
        if not self.tls:
            return grpc.insecure_channel(target, options=opts)
        read = lambda path: open(path, "rb").read()
        ca = read(self.cert_paths("coordinator", trust_dir)[0])
        if who is None:
            creds = grpc.ssl_channel_credentials(root_certificates=ca)
        else:
            _, cert, key = self.cert_paths(who, ca_dir)
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=read(key),
                                                 certificate_chain=read(cert))
        return grpc.secure_channel(target, creds, options=opts)

    def stub_as(self, who, **kw):
        """(channel, stub) presenting who's certificate (open_channel)."""
        ch = self.open_channel(who, **kw)
        return ch, zb_pb2_grpc.ZbStub(ch)

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start_worker(self, wid, port=None, extra=(), env=None):
        """Starts zb-worker --id wid against the current coordinator address
        (env: variables added to the test's own)."""
        argv = [WORKER, "--coordinator", "127.0.0.1:%d" % (port or self.port), "--id", wid, "--heartbeat-ms",
                "200"]
        if self.tls:
            if not os.path.exists(self.cert_paths("worker-" + wid)[1]):
                self.make_certs(workers=[wid])
            argv += self.tls_flags("worker-" + wid)
        argv += list(extra)
        p = Proc("worker-" + wid, argv, self.dir, env=env)
        self.workers[wid] = p
        self.procs.append(p)
        return p

    # ---- RPCs ----

    def health(self, service="", timeout=5, channel=None):
        check = (channel or self.channel).unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                         response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return check(health_pb2.HealthCheckRequest(service=service), timeout=timeout * SLOW).status

    def assert_serving(self):
        st = self.health()
        assert st == health_pb2.HealthCheckResponse.SERVING, "Health/Check: %s" % st
        assert self.coordinator.alive(), "zb-coordinator died"

    def list_workers(self):
        return list(self.stub.ListWorkers(zb_pb2.ListWorkersRequest(), timeout=10 * SLOW).workers)

    def wait_workers(self, n, idle=True, timeout=20):
        """Waits until n workers are attached (and idle)."""

        def ok():
            try:
                ws = self.list_workers()
            except grpc.RpcError as e:  # the channel's first connect may race the listener: poll again
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return None
            good = [w for w in ws if not idle or w.state == "idle"]
            return (ws,) if len(good) >= n else None

        return wait_until("%d %sworkers" % (n, "idle " if idle else ""), ok, timeout)[0]

    def worker_of_rank(self, job_id, rank):
        for w in self.list_workers():
            if w.job_id == job_id and w.rank == rank:
                return w.id
        raise AssertionError("no worker runs rank %d of %s" % (rank, job_id))

    def submit(self, spec):
        return self.stub.SubmitJob(zb_pb2.SubmitJobRequest(spec=spec), timeout=30 * SLOW).job_id

    def get(self, job_id):
        return self.stub.GetJob(zb_pb2.GetJobRequest(job_id=job_id), timeout=10 * SLOW)

    def list_jobs(self, page_size=0):
        """Every job the caller may see, page after page."""
        jobs, token = [], ""
        while True:
            r = self.stub.ListJobs(zb_pb2.ListJobsRequest(page_size=page_size, page_token=token), timeout=10 * SLOW)
            jobs += r.jobs
            token = r.next_page_token
            if not token:
                return jobs

    def wait_state(self, job_id, states, timeout=60):
        """Waits for the job to be in one of states; fails at once if it
        ends in another."""
        if isinstance(states, int):
            states = (states,)

        def ok():
            j = self.get(job_id)
            if j.state in states:
                return j
            if j.state in TERMINAL:
                raise AssertionError("job %s ended %s (%s), waiting for %s" %
                                     (job_id, state_name(j.state), j.reason,
                                      "/".join(state_name(s) for s in states)))
            return None

        return wait_until("job %s in %s" % (job_id, "/".join(state_name(s) for s in states)), ok, timeout)

    def wait_iterations(self, job_id, n, timeout=60):
        """Waits until the job has completed n iterations while running."""

        def ok():
            j = self.get(job_id)
            if j.state in TERMINAL:
                raise AssertionError("job %s ended %s (%s) before %d iterations" %
                                     (job_id, state_name(j.state), j.reason, n))
            return j if j.iterations_done >= n else None

        return wait_until("job %s at %d iterations" % (job_id, n), ok, timeout)

    def events(self, job_id, timeout=30):
        """Every event of a job through WatchJob (the job must end for the
        stream to end)."""
        return list(self.stub.WatchJob(zb_pb2.WatchJobRequest(job_id=job_id), timeout=timeout * SLOW))

    # ---- zbctl, metrics ----

    def zbctl(self, *args, timeout=60, input=None):
        """Runs zbctl ARGS --coordinator ADDR; returns the CompletedProcess
        (text). A sanitizer report on its stderr fails the test."""
        argv = [ZBCTL] + list(args) + ["--coordinator", self.address]
        env = None
        if self.tls:
            ca, cert, key = self.cert_paths(self.identity)
            env = dict(os.environ, ZBCTL_TLS_CA=ca, ZBCTL_TLS_CERT=cert, ZBCTL_TLS_KEY=key)
        cp = subprocess.run(_WRAP + argv, input=input, capture_output=True, text=True, timeout=timeout * SLOW,
                            env=env)
        assert not sanitizer_report(cp.stderr), "zbctl %s: sanitizer report:\n%s" % (args, cp.stderr)
        return cp

    def metrics(self, path="/metrics"):
        """(status, content type, body) of GET path on the metrics port."""
        url = "http://127.0.0.1:%d%s" % (self.metrics_port, path)
        try:
            with urllib.request.urlopen(url, timeout=10 * SLOW) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def run_zbctl(*args, timeout=60):
    argv = [ZBCTL] + list(args)
    cp = subprocess.run(_WRAP + argv, capture_output=True, text=True, timeout=timeout * SLOW)
    assert not sanitizer_report(cp.stderr), "zbctl %s: sanitizer report:\n%s" % (args, cp.stderr)
    return cp


def parse_metrics(text):
    """{(name, ((label, value), ...)): value} of a Prometheus text body."""
    out = {}
    rx = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    lrx = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = rx.match(line)
        assert m, "not a sample line: %r" % line
        labels = tuple(sorted(lrx.findall(m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def series(samples, name, **labels):
    """The samples of one metric whose labels include `labels`."""
    want = set((k, str(v)) for k, v in labels.items())
    return {lab: v for (n, lab), v in samples.items() if n == name and want <= set(lab)}


# ---- gradient dumps (train/zb_dump.h; a cpu job's model.dump_dir) ----

_DUMP_HEAD = struct.Struct("=8sII64s12iQdd512s")  # 664 bytes, the layout zb_dump.h documents (version 1)
_DUMP_REPLICA = struct.Struct("=ii")  # version 2: replica, data_parallel (672 bytes in all)
_DUMP_TENSOR = struct.Struct("=48sii")
_DUMP_FIELDS = ("iteration", "stage", "n_stages", "rank", "microbatches", "vocab", "hidden", "heads", "layers",
                "seq_len", "batch", "flags")
DUMP_HAS_LOSS, DUMP_CLIPPED, DUMP_SKIPPED = 1, 2, 4


def gradcheck(binary, job_dir, tolerance):
    """Runs zb-gradcheck --json on a job's dumps: (exit status, its result
    lines, stderr)."""
    cp = subprocess.run(_WRAP + [binary, "--json", "--tolerance", repr(tolerance), job_dir], capture_output=True,
                        text=True, timeout=120 * SLOW)
    assert not sanitizer_report(cp.stderr), cp.stderr
    lines = [json.loads(line) for line in cp.stdout.splitlines() if line.startswith("{")]
    return cp.returncode, lines, cp.stderr


def check_gradcheck(binary, job_dir, job_id, stages, microbatches, iterations, tolerance, where):
    """zb-gradcheck passes on every dumped iteration of the job within
    tolerance (gradients per tensor and the loss, relative); its results."""
    rc, results, err = gradcheck(binary, job_dir, tolerance)
    assert rc == 0, "%s: zb-gradcheck exit %d\n%s" % (where, rc, err)
    assert [r["iteration"] for r in results] == list(range(iterations)), (where, results)
    for r in results:
        assert r["ok"] and r["job_id"] == job_id, (where, r)
        assert r["stages"] == stages and r["microbatches"] == microbatches, (where, r)
        assert r["max_rel_err"] <= tolerance and r["loss_rel_err"] <= tolerance, (where, r)
    return results


def interrupt(c, job_id, max_done):
    """Cancels a running 2-rank job with rank 1's worker frozen (so it
    cannot race to its end; fewer than max_done iterations done), and waits
    until both ranks ended (their cancel-time checkpoints are written).
    Returns the iterations done when it was frozen."""
    frozen = c.workers[c.worker_of_rank(job_id, 1)]
    frozen.signal(signal.SIGSTOP)
    try:
        done = c.get(job_id).iterations_done
        assert done < max_done, done  # the freeze came in time
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=job_id, reason="interrupted"), timeout=10 * SLOW)
    finally:
        frozen.signal(signal.SIGCONT)
    c.wait_state(job_id, STATE.JOB_STATE_CANCELLED, timeout=30)
    c.wait_workers(2)

    # stopped, or failed when its peer had gone first: it saves either way
    def ended():
        logs = "".join(w.log_text() for w in c.workers.values())
        return all(re.search(r"job %s rank %d(: stopped| failed)" % (job_id, r), logs) for r in (0, 1))

    wait_until("both ranks of %s ended" % job_id, ended, 30)
    return done


def read_dump(path):
    """One dump file as a dict: the header's fields, "tensors" [(name,
    rows, cols)], and "before", "grads", "after" as raw float32 bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    h = _DUMP_HEAD.unpack_from(raw, 0)
    assert h[0] == b"ZBDUMP\0\1" and h[1] in (1, 2), "%s: not a version-1 or 2 dump" % path
    d = dict(zip(_DUMP_FIELDS, h[4:16]))
    d.update(job_id=h[3].rstrip(b"\0").decode(), seed=h[16], loss=h[17], grad_norm=h[18],
             data=h[19].rstrip(b"\0").decode(), tensors=[], replica=0, data_parallel=1)
    off = _DUMP_HEAD.size
    if h[1] == 2:
        d["replica"], d["data_parallel"] = _DUMP_REPLICA.unpack_from(raw, off)
        off += _DUMP_REPLICA.size
    for _ in range(h[2]):
        name, rows, cols = _DUMP_TENSOR.unpack_from(raw, off)
        d["tensors"].append((name.rstrip(b"\0").decode(), rows, cols))
        off += _DUMP_TENSOR.size
    n = 4 * sum(r * c for _, r, c in d["tensors"])
    assert len(raw) == off + 3 * n + 8, "%s: %d bytes, the table says %d" % (path, len(raw), off + 3 * n + 8)
    d["before"], d["grads"], d["after"] = raw[off:off + n], raw[off + n:off + 2 * n], raw[off + 2 * n:off + 3 * n]
    return d


def read_dumps(dump_dir, job_id, iteration, replica=0):
    """{stage: dump} of one iteration of a job (of one data-parallel
    replica: replica 0's are it<N>-stage<S>.dump, replica K's
    it<N>-stage<S>-replica<K>.dump)."""
    out = {}
    tail = "-replica%d" % replica if replica else ""
    for name in os.listdir(os.path.join(dump_dir, job_id)):
        m = re.match(r"it(\d+)-stage(\d+)%s\.dump$" % tail, name)
        if m and int(m.group(1)) == iteration:
            out[int(m.group(2))] = read_dump(os.path.join(dump_dir, job_id, name))
    assert out and sorted(out) == list(range(next(iter(out.values()))["n_stages"])), \
        "%s/%s iteration %d: stages %s" % (dump_dir, job_id, iteration, sorted(out))
    return out


def weights_differ(a, b, which="after"):
    """The stages whose `which` weights differ in any bit between two
    {stage: dump} maps (a list, empty when every bit agrees)."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return [s for s in sorted(a) if a[s]["tensors"] != b[s]["tensors"] or a[s][which] != b[s][which]]


def family_chunks(family):
    """The chunks per rank a family plans with by default."""
    return 2 if family in ("interleaved-1f1b", "zb-v", "v-half", "v-min", "zb-interleaved", "dualpipe-v") else 1


def job_stages(family, p, dump_dir, job_id):
    """A job's stage count: zb-auto searches every placement, so its plan
    has p x (1..4) stages, whatever its dumps show; the rest have their
    family's chunks."""
    if family != "zb-auto":
        return p * family_chunks(family)
    n = len(read_dumps(dump_dir, job_id, 0))
    assert n % p == 0 and 1 <= n // p <= 4, (family, p, n)
    return n


def iteration_events(events):
    return [e.iteration for e in events if e.HasField("iteration")]


def rpc_error(fn, *args, **kw):
    """Calls fn expecting a grpc.RpcError; returns (code, details)."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    raise AssertionError("%s succeeded; expected an error" % getattr(fn, "_method", fn))


# ---- the runner ----


class _Terminated(BaseException):
    pass


def _on_term(sig, frame):
    raise _Terminated("signal %d" % sig)


def run_tests(module_globals):
    """Runs the module's test_* functions in file order (or those named on
    the command line); exit status 1 if any failed."""
    signal.signal(signal.SIGTERM, _on_term)
    tests = [(n, f) for n, f in module_globals.items() if n.startswith("test_") and callable(f)]
    if len(sys.argv) > 1:
        tests = [(n, f) for n, f in tests if n in sys.argv[1:]]
    failed = []
    t_all = time.monotonic()
    for name, fn in tests:
        print("=== %s" % name)
        sys.stdout.flush()
        t0 = time.monotonic()
        try:
            fn()
        except Exception:
            traceback.print_exc(file=sys.stdout)
            print("--- FAIL %s (%.1f s)" % (name, time.monotonic() - t0))
            failed.append(name)
        else:
            print("--- ok   %s (%.1f s)" % (name, time.monotonic() - t0))
        sys.stdout.flush()
    print("%d/%d passed in %.1f s%s" % (len(tests) - len(failed), len(tests), time.monotonic() - t_all,
                                        (": failed " + ", ".join(failed)) if failed else ""))
    sys.exit(1 if failed or not tests else 0)
