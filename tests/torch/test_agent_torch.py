"""zb.torch.attach end to end (docs/pytorch.md, Attaching a torchrun job):
a real zb-coordinator with mutual TLS, a torch job submitted with zbctl,
and examples/torch_agent/train.py under torchrun with 2 and then 4 CPU
processes on gloo. Mid-run `zbctl update-schedule` switches 1f1b to zb-h1;
the reports' schedule and the agents' plan_version change at the
iteration it names, `zbctl watch` shows every iteration's loss and bubble,
and each rank's final stage weights equal a non-pipelined run of the same
model on the same batches (float64, |diff| <= 1e-9). A plain zb-worker and
an agent bound to another run are attached throughout and get nothing.

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
    """An agent bound to another run (raw Attach from this process): it
    must never be given a job. Records every Command it receives."""

    def __init__(self, c):
        self.channel, stub = c.stub_as("worker-decoy")
        self.commands = []
        self.stream = stub.Attach(zb_pb2.AttachRequest(worker_id="decoy/0", data_address="decoy:0",
                                                       backends=["torch"], transports=["torch"],
                                                       torch_run="another-run", torch_rank=0))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.beats = threading.Thread(target=self._beat, args=(stub,), daemon=True)
        self.thread.start()
        self.beats.start()

    def _beat(self, stub):
        while not self.stop.wait(0.2):
            try:
                stub.Report(zb_pb2.ReportRequest(worker_id="decoy/0"), timeout=5)
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


def job_yaml(p, run):
    return "\n".join(["name: torch-agent-%d" % p, "ranks: %d" % p, "microbatches: %d" % (2 * p),
                      "schedule: 1f1b", "iterations: %d" % ITERATIONS, "backend: torch", "transport: torch",
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


def run_case(p, ex):
    run = "run-p%d" % p
    with zbsvc.Cluster(workers=1, tls=True, name="torch-agent-%d" % p) as c:
        c.make_certs(workers=["trun", "decoy"])
        decoy = Decoy(c)
        try:
            if p == 2:
                check_attach_refusals(c)
            check_case(c, p, run, ex, decoy)
        finally:
            decoy.close()
        assert decoy.commands and set(decoy.commands) == {"ping_unix_ms"}, decoy.commands


def check_case(c, p, run, ex, decoy):
    spec = os.path.join(c.dir, "job.yaml")
    with open(spec, "w") as f:
        f.write(job_yaml(p, run))
    cp = c.zbctl("submit", spec)
    assert cp.returncode == 0, cp.stderr
    jid = cp.stdout.strip()
    out = os.path.join(c.dir, "out")
    ca, cert, key = c.cert_paths("worker-trun")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(p), EXAMPLE,
            "--coordinator", c.address, "--torch-run", run, "--out", out, "--ca", ca, "--cert", cert,
            "--key", key, "--worker", "trun", "--pause-s", "0.1"]
    log = open(os.path.join(c.dir, "torchrun.log"), "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        c.wait_iterations(jid, 2, timeout=180)
        cp = c.zbctl("update-schedule", jid, "--schedule", "zb-h1", "--output", "json")
        assert cp.returncode == 0, cp.stderr
        first = json.loads(cp.stdout)["from_iteration"]
        assert 2 < first < ITERATIONS, first
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    with open(log.name) as f:
        text = f.read()
    assert rc == 0, "torchrun exited %d:\n%s" % (rc, text[-4000:])

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
    print("ok")


if __name__ == "__main__":
    main()
