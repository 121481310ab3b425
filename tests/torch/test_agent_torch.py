"""zb.torch.attach end to end (docs/pytorch.md, Attaching a torchrun job):
a real zb-coordinator with mutual TLS, a torch job submitted with zbctl,
and examples/torch_agent/train.py under torchrun with 2 and then 4 CPU
processes on gloo. Mid-run `zbctl update-schedule` switches 1f1b to zb-h1;
the reports' schedule and the agents' plan_version change at the
iteration it names, `zbctl watch` shows every iteration's loss and bubble,
and each rank's final stage weights equal a non-pipelined run of the same
model on the same batches (float64, |diff| <= 1e-9). Attached throughout
and given nothing: a plain zb-worker (it hears of no torch job), two
agents bound to another run that offer sim too (a sim job submitted
beside them runs on the zb-worker) and a plain worker that offers torch.
Last, `zbctl cancel` of a 2-process run mid-way: every rank stops at the
same iteration boundary and torchrun exits within a bounded wait.

Needs the service tests' stubs and binaries (tests/torch/CMakeLists.txt
passes them); exits 77 where torch or they are missing."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading

import torchtest

torchtest.need_torch()  # imports zb first: zbsvc's `from zb.v1 import ...` then finds the package's stubs

for var in ("ZB_COORDINATOR_BIN", "ZB_WORKER_BIN", "ZBCTL_BIN", "ZB_PY_STUBS", "ZB_PY_HEALTH_PB2"):
    if not os.path.exists(os.environ.get(var, "")):
        print("SKIP: %s is not set to an existing path (the service tests' build)" % var)
        sys.exit(77)

import torch  # noqa: E402

sys.path.insert(0, os.path.join(torchtest.SRC, "tests", "service"))
import zbsvc  # noqa: E402
from zb.v1 import zb_pb2  # noqa: E402

EXAMPLE = os.path.join(torchtest.SRC, "examples", "torch_agent", "train.py")
ITERATIONS = 24
TOLERANCE = 1e-9
CANCEL_ITERATIONS = 1000  # far more than run before the cancel lands


def load_example():
    spec = importlib.util.spec_from_file_location("torch_agent_train", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(ex, stages, iterations):
    """The same model trained without a pipeline: whole batch, SGD."""
    mods = [ex.make_stage(s) for s in range(stages)]
    model = torch.nn.Sequential(*mods)
    opt = torch.optim.SGD(model.parameters(), lr=ex.LR)
    for it in range(iterations):
        x, y = ex.batch(it)
        opt.zero_grad()
        ex.mse(model(x), y).backward()
        opt.step()
    return mods


class Decoy:
    """A raw Attach from this process that must never be given a job:
    bound=True, agents of another run offering sim as well as torch (so a
    sim job could go to them if binding were ignored), one per rank of
    `ranks`; bound=False, a plain worker offering torch (so a torch job
    could go to it). All share hostname decoyhost: two idle candidates on
    one host come first in placement, so a coordinator that let them run
    the job would pick them. Records every Command received."""

    def __init__(self, c, wid, bound):
        self.channel, stub = c.stub_as("worker-decoy")
        self.commands = []
        extra = dict(torch_run="another-run", torch_rank=int(wid.split("/")[1])) if bound else {}
        self.stream = stub.Attach(zb_pb2.AttachRequest(
            worker_id=wid, data_address="decoy:0", hostname="decoyhost",
            backends=["sim", "torch"] if bound else ["torch"], transports=["tcp", "torch"] if bound else ["torch"],
            **extra))
        self.wid = wid
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.beats = threading.Thread(target=self._beat, args=(stub,), daemon=True)
        self.thread.start()
        self.beats.start()

    def _beat(self, stub):
        while not self.stop.wait(0.2):
            try:
                stub.Report(zb_pb2.ReportRequest(worker_id=self.wid), timeout=5)
            except Exception:
                pass

    def _read(self):
        try:
            for cmd in self.stream:
                self.commands.append(cmd.WhichOneof("kind"))
        except Exception:
            pass

    def close(self):
        self.stop.set()
        self.stream.cancel()
        self.thread.join(10)
        self.beats.join(10)
        self.channel.close()


def job_yaml(p, run, iterations=ITERATIONS):
    return "\n".join(["name: torch-agent-%d" % p, "ranks: %d" % p, "microbatches: %d" % (2 * p),
                      "schedule: 1f1b", "iterations: %d" % iterations, "backend: torch", "transport: torch",
                      "torch_run: %s" % run, "trace_every: 4", ""])


def attach_refused(stub, **fields):
    """(code, details) of an Attach the coordinator must refuse."""
    req = zb_pb2.AttachRequest(data_address="x:0", backends=["torch"], transports=["torch"], **fields)
    return zbsvc.rpc_error(lambda: next(iter(stub.Attach(req, timeout=10))))


def check_attach_refusals(c):
    """Bad bindings: each refused with a message naming the field, and the
    coordinator serves on."""
    ch, stub = c.stub_as("worker-trun")
    try:
        code, msg = attach_refused(stub, worker_id="trun/1", torch_run="r", torch_rank=0)
        assert code == zbsvc.grpc.StatusCode.PERMISSION_DENIED and "torch_rank 1" in msg, (code, msg)
        code, msg = attach_refused(stub, worker_id="trun", torch_rank=3)
        assert code == zbsvc.grpc.StatusCode.INVALID_ARGUMENT and "torch_rank" in msg, (code, msg)
        code, msg = attach_refused(stub, worker_id="trun/0", torch_run="bad run", torch_rank=0)
        assert code == zbsvc.grpc.StatusCode.INVALID_ARGUMENT and "torch_run" in msg, (code, msg)
        code, msg = attach_refused(stub, worker_id="trun/0", torch_run="another-run", torch_rank=0)
        assert code == zbsvc.grpc.StatusCode.ALREADY_EXISTS and "decoy/0" in msg, (code, msg)
        code, msg = attach_refused(c.stub_as("worker-decoy")[1], worker_id="decoy/00", torch_run="another-run",
                                   torch_rank=0)
        assert code == zbsvc.grpc.StatusCode.PERMISSION_DENIED, (code, msg)
    finally:
        ch.close()
    cp = c.zbctl("submit", "-", input=job_yaml(2, "r") + "data_parallel: 2\n")
    assert cp.returncode != 0 and "data_parallel" in cp.stderr and "one pipeline" in cp.stderr, cp.stderr
    c.assert_serving()


def check_sim_job(c):
    """A sim job while the decoys are idle: it runs on the plain zb-worker
    w0, never on an agent bound to a run (which offers sim too)."""
    cp = c.zbctl("submit", "-", input=zbsvc.job_yaml(name="sim-beside", ranks=1, microbatches=2, iterations=2))
    assert cp.returncode == 0, cp.stderr
    job = c.wait_state(cp.stdout.strip(), zbsvc.STATE.JOB_STATE_SUCCEEDED, timeout=60)
    assert list(job.rank_workers) == ["w0"], list(job.rank_workers)


def run_case(p, ex, cancel=False):
    run = "run-p%d%s" % (p, "-cancel" if cancel else "")
    with zbsvc.Cluster(workers=1, tls=True, name="torch-agent-%d" % p) as c:
        c.make_certs(workers=["trun", "decoy"])
        decoys = [Decoy(c, "decoy/0", True), Decoy(c, "decoy/1", True), Decoy(c, "decoy", False)]
        try:
            if cancel:
                check_cancel(c, p, run)
            else:
                if p == 2:
                    check_attach_refusals(c)
                    check_sim_job(c)
                check_case(c, p, run, ex)
        finally:
            for d in decoys:
                d.close()
        for d in decoys:
            assert d.commands and set(d.commands) == {"ping_unix_ms"}, (d.wid, d.commands)


def start_torchrun(c, p, run, iterations=ITERATIONS, pause_s=0.1, pause_rank=-1):
    """(job id, out dir, torchrun Popen, its log file) of a submitted job."""
    cp = c.zbctl("submit", "-", input=job_yaml(p, run, iterations))
    assert cp.returncode == 0, cp.stderr
    out = os.path.join(c.dir, "out-" + run)
    ca, cert, key = c.cert_paths("worker-trun")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(p), EXAMPLE,
            "--coordinator", c.address, "--torch-run", run, "--out", out, "--ca", ca, "--cert", cert,
            "--key", key, "--worker", "trun", "--pause-s", str(pause_s), "--pause-rank", str(pause_rank),
            "--pg-timeout-s", "60"]
    log = open(os.path.join(c.dir, "torchrun-%s.log" % run), "w")
    return cp.stdout.strip(), out, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log


def finish(proc, log, timeout):
    """torchrun's exit status and log; killed if still running at timeout
    (then the assertion says so)."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = "still running after %d s (killed)" % timeout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    with open(log.name) as f:
        return rc, f.read()


def check_cancel(c, p, run):
    """`zbctl cancel` mid-run: every rank leaves iterations() cancelled at
    the same boundary (the same iterations run), and torchrun exits 0
    within a bounded wait: no rank is left inside step() waiting on a peer
    that stopped (which would last the process group's timeout, 60 s).
    The last rank sleeps after each iteration, the others not: when the
    cancel lands they are inside the next step(), waiting on it, while it
    hears the cancel between iterations (what the boundary vote settles)."""
    jid, out, proc, log = start_torchrun(c, p, run, iterations=CANCEL_ITERATIONS, pause_s=0.2, pause_rank=p - 1)
    try:
        c.wait_iterations(jid, 3, timeout=180)
        cp = c.zbctl("cancel", jid)
        assert cp.returncode == 0, cp.stderr
    finally:
        rc, text = finish(proc, log, 50)
    assert rc == 0, "torchrun after cancel: %s:\n%s" % (rc, text[-4000:])
    c.wait_state(jid, zbsvc.STATE.JOB_STATE_CANCELLED, timeout=30)
    got = []
    for r in range(p):
        with open(os.path.join(out, "rank%d.json" % r)) as f:
            got.append(json.load(f))
    assert all(g["cancelled"] for g in got), got
    ran = [len(g["plan_versions"]) for g in got]
    assert len(set(ran)) == 1 and 3 <= ran[0] < CANCEL_ITERATIONS, ran
    print("cancel: every rank stopped after %d iterations" % ran[0])


def check_case(c, p, run, ex):
    jid, out, proc, log = start_torchrun(c, p, run)
    try:
        c.wait_iterations(jid, 2, timeout=180)
        cp = c.zbctl("update-schedule", jid, "--schedule", "zb-h1", "--output", "json")
        assert cp.returncode == 0, cp.stderr
        first = json.loads(cp.stdout)["from_iteration"]
        assert 2 < first < ITERATIONS, first
    finally:
        rc, text = finish(proc, log, 300)
    assert rc == 0, "torchrun exited %s:\n%s" % (rc, text[-4000:])

    job = c.wait_state(jid, zbsvc.STATE.JOB_STATE_SUCCEEDED, timeout=30)
    assert job.schedule == "zb-h1", job.schedule
    assert list(job.rank_workers) == ["trun/%d" % r for r in range(p)], list(job.rank_workers)
    assert jid not in c.workers["w0"].log_text(), "the plain zb-worker heard of the torch job"

    its = zbsvc.iteration_events(c.events(jid))
    assert [it.iteration for it in its] == list(range(ITERATIONS))
    want = ["1f1b"] * first + ["zb-h1"] * (ITERATIONS - first)
    assert [it.schedule for it in its] == want, ([it.schedule for it in its], first)
    assert all(it.has_loss and 0 < it.loss < 10 and 0 <= it.bubble_ratio < 1 for it in its)
    assert any(it.aligned for it in its), "no sampled iteration had every rank's timeline"
    for r in range(p):
        with open(os.path.join(out, "rank%d.json" % r)) as f:
            got = json.load(f)
        assert got["plan_versions"] == [1] * first + [2] * (ITERATIONS - first), (r, got["plan_versions"])

    cp = c.zbctl("watch", jid)
    assert cp.returncode == 0, cp.stderr
    lines = [ln for ln in cp.stdout.splitlines() if " iter " in ln]
    assert len(lines) == ITERATIONS and all("loss " in ln and "bubble " in ln for ln in lines), cp.stdout
    assert "zb-h1" in lines[-1] and "1f1b" in lines[0], (lines[0], lines[-1])
    _, _, metrics = c.metrics()
    assert 'job_id="%s"' % jid in metrics

    ref = reference(ex, p, ITERATIONS)
    worst = 0.0
    for s in range(p):
        got = torch.load(os.path.join(out, "stage%d.pt" % s))
        for name, want_t in ref[s].state_dict().items():
            worst = max(worst, (got[name] - want_t).abs().max().item())
    assert worst <= TOLERANCE, "stage weights differ from the non-pipelined run by %g" % worst
    print("p=%d: switched at %d, weights within %.3g of the reference" % (p, first, worst))


def main():
    ex = load_example()
    for p in (2, 4):
        run_case(p, ex)
    run_case(2, ex, cancel=True)
    print("ok")


if __name__ == "__main__":
    main()
