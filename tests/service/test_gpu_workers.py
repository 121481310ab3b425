"""GPU workers through the real coordinator (docs/operations.md, GPU
workers; docs/wire.md, NCCL id exchange):

- the job spec's cuda rules over the wire (nccl and tf32/bf16 need backend
  cuda), and a cuda job refused with a message naming the shortage while
  the attached zb-workers have no GPU (none has one on these machines);
- `zbctl workers` shows each worker's GPU column: '-' for a real zb-worker
  here, the reported name for a worker that has one;
- the NCCL id exchange as the coordinator runs it: rank 0's id is sent to
  every rank's Attach stream, and the coordinator refuses an id of the
  wrong length, from a rank other than 0, for a job whose transport is not
  nccl, and a second, different id for the same job (the first stays);
- a stage group's id (data_parallel 2): sent to the group's ranks only,
  refused from replica 1, of the wrong length, twice, or for one replica.

The GPU workers here are this test speaking the worker's side of zb.v1
over gRPC (an Attach stream and Reports), so that the coordinator's
refusals can be provoked; the end-to-end exchange between worker processes
(zb-worker-standin, on the CPU stand-in of CUDA) is test_cuda_standin.py's."""

import queue
import threading
import time

import grpc

import zbsvc
from zbsvc import SLOW, STATE, Cluster, job_spec, rpc_error, wait_until, zb_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
FAKE_GPU = "Test GPU 1 (80.0 GiB, cc 9.0, CUDA driver 13.0)"


class FakeGpuWorker:
    """The worker's side of zb.v1 spoken by this test: an Attach stream
    whose Commands land in a queue, and a heartbeat every 200 ms."""

    def __init__(self, c, wid, gpu=FAKE_GPU, backends=("sim", "cuda"), transports=("tcp", "nccl")):
        self.c, self.id = c, wid
        self.commands = queue.Queue()
        self.assignments = {}  # job id -> Assignment
        req = zb_pb2.AttachRequest(worker_id=wid, data_address="127.0.0.1:1", backends=list(backends),
                                   transports=list(transports), gpu=gpu, hostname="test",
                                   max_receive_bytes=64 << 20)
        self.call = c.stub.Attach(req)
        self.stopping = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.beater = threading.Thread(target=self._beat, daemon=True)
        self.reader.start()
        self.beater.start()

    def _read(self):
        try:
            for cmd in self.call:
                if cmd.WhichOneof("kind") == "assign":
                    self.assignments[cmd.assign.job_id] = cmd.assign
                if cmd.WhichOneof("kind") != "ping_unix_ms":
                    self.commands.put(cmd)
        except grpc.RpcError:
            pass  # cancelled at close

    def _beat(self):
        while not self.stopping.wait(0.2):
            try:
                self.c.stub.Report(zb_pb2.ReportRequest(worker_id=self.id), timeout=5 * SLOW)
            except grpc.RpcError:
                pass

    def report(self, **kw):
        return self.c.stub.Report(zb_pb2.ReportRequest(worker_id=self.id, **kw), timeout=10 * SLOW)

    def next_command(self, kind, timeout=10):
        """The next Command of that kind (others before it are dropped);
        None after timeout."""
        deadline = time.monotonic() + timeout * SLOW
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                cmd = self.commands.get(timeout=left)
            except queue.Empty:
                return None
            if cmd.WhichOneof("kind") == kind:
                return cmd

    def close(self):
        self.stopping.set()
        self.call.cancel()
        self.reader.join(5)
        self.beater.join(5)


def fake_workers(c, n, **kw):
    ws = [FakeGpuWorker(c, "gpu%d" % k, **kw) for k in range(n)]
    c.wait_workers(len(c.workers) + n)
    return ws


def cuda_spec(name, ranks=2, transport="nccl", **kw):
    kw.setdefault("wait_for_workers_s", -1)  # refused at once when too few workers have a GPU
    return job_spec(name=name, ranks=ranks, microbatches=4, t=0.001, iterations=2, backend="cuda",
                    transport=transport, **kw)


def expect(c, code, needles, fn, *args, **kw):
    """fn(*args, **kw) fails with code and a message holding every needle."""
    got, details = rpc_error(fn, *args, **kw)
    assert got == code, "%s (%s), expected %s" % (got, details, code)
    for n in needles:
        assert n in details, "%r not in %r" % (n, details)
    c.assert_serving()
    return details


def submit(c, spec):
    return c.stub.SubmitJob(zb_pb2.SubmitJobRequest(spec=spec), timeout=30 * SLOW)


def ranks_of(ws, jid):
    """{rank: fake worker} once every one of them has its Assignment."""
    def assigned():
        got = {w.assignments[jid].rank: w for w in ws if jid in w.assignments}
        return got if len(got) == len(ws) else None

    return wait_until("the assignments of " + jid, assigned, 15)


def test_cuda_jobs_need_gpu_workers():
    with Cluster(workers=2, name="gpu-refuse") as c:
        ws = c.list_workers()
        assert all(w.gpu == "" and "cuda" not in w.backends and "nccl" not in w.transports for w in ws), ws
        # the spec's rules, over the wire
        expect(c, INVALID, ["transport", "nccl", "needs backend cuda", "'cpu'"], submit, c,
               job_spec(ranks=2, backend="cpu", transport="nccl"))
        expect(c, INVALID, ["precision", "bf16 needs backend cuda", "'sim'"], submit, c,
               job_spec(ranks=2, precision="bf16"))
        expect(c, INVALID, ["precision", "fp32, tf32, bf16", "'fp64'"], submit, c,
               cuda_spec("p", precision="fp64"))
        expect(c, INVALID, ["model", "only a cpu or cuda job", "'sim'"], submit, c,
               job_spec(ranks=2, model=zb_pb2.ModelSpec(hidden=32)))
        # no attached worker has a GPU: the refusal says so and counts them
        d = expect(c, PRECONDITION, ["spec.backend", "backend cuda needs 2 workers with a GPU",
                                     "transport 'nccl'", "0 of the 2 attached workers"], submit, c,
                   cuda_spec("no-gpu"))
        print("refused:", d)
        cp = c.zbctl("submit", "-", input="name: y\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cuda\n"
                                                 "wait_for_workers_s: 0\n")
        assert cp.returncode != 0 and "backend cuda needs 2 workers with a GPU" in cp.stderr, (cp.stdout,
                                                                                              cp.stderr)
        # zbctl workers: a GPU column, '-' for a worker without one
        cp = c.zbctl("workers")
        assert cp.returncode == 0, cp.stderr
        lines = cp.stdout.splitlines()
        assert lines[0].split()[-1] == "GPU", lines
        rows = [ln for ln in lines[1:] if ln.split()[0] in ("w0", "w1")]
        assert len(rows) == 2 and all(ln.split()[-1] == "-" for ln in rows), lines

        # one worker with a GPU (and one that offers cuda without naming a
        # GPU, which does not count): still short, and the message names it
        gpu = FakeGpuWorker(c, "gpu0")
        nameless = FakeGpuWorker(c, "nameless", gpu="")
        try:
            c.wait_workers(4)
            d = expect(c, PRECONDITION, ["backend cuda needs 2 workers with a GPU", "1 of the 4 attached workers",
                                         "has one (gpu0)"], submit, c, cuda_spec("one-gpu"))
            assert "nameless" not in d, d
            print("refused:", d)
            cp = c.zbctl("workers")
            row = [ln for ln in cp.stdout.splitlines() if ln.startswith("gpu0 ")]
            assert row and row[0].rstrip().endswith(FAKE_GPU), cp.stdout
            js = c.zbctl("workers", "--output", "json")
            assert js.returncode == 0 and FAKE_GPU in js.stdout, js.stdout
            assert [w.gpu for w in c.list_workers() if w.id == "gpu0"] == [FAKE_GPU]
            # a cuda job for one rank runs there and nowhere else
            jid = submit(c, cuda_spec("one", ranks=1, transport="tcp")).job_id
            got = gpu.next_command("assign")
            assert got and got.assign.job_id == jid and got.assign.backend == "cuda", got
            assert got.assign.precision == "fp32" and got.assign.model.layers == 1, got.assign
            assert nameless.next_command("assign", timeout=1) is None
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10 * SLOW)
        finally:
            gpu.close()
            nameless.close()


def test_nccl_id_exchange():
    with Cluster(workers=0, name="nccl-id") as c:
        ws = fake_workers(c, 2)
        try:
            jid = submit(c, cuda_spec("nccl", precision="tf32")).job_id
            by_rank = ranks_of(ws, jid)
            r0, r1 = by_rank[0], by_rank[1]
            a = r0.assignments[jid]
            assert a.transport == "nccl" and a.precision == "tf32" and a.backend == "cuda", a
            id_a, id_b = bytes(range(128)), bytes(255 - k for k in range(128))
            # not rank 0, not 128 bytes: refused, nothing sent
            expect(c, INVALID, ["nccl_unique_id", "only rank 0"], r1.report, job_id=jid, rank=1,
                   plan_version=1, nccl_unique_id=id_a)
            expect(c, INVALID, ["nccl_unique_id", "127 bytes", "128"], r0.report, job_id=jid, rank=0,
                   plan_version=1, nccl_unique_id=id_a[:127])
            expect(c, INVALID, ["nccl_unique_id", "129 bytes"], r0.report, job_id=jid, rank=0, plan_version=1,
                   nccl_unique_id=id_a + b"x")
            assert all(w.next_command("nccl_id", timeout=0.5) is None for w in ws)
            # rank 0's id goes to every rank, rank 0 included
            resp = r0.report(job_id=jid, rank=0, plan_version=1, nccl_unique_id=id_a)
            assert not resp.stop
            for w in ws:
                cmd = w.next_command("nccl_id")
                assert cmd and cmd.nccl_id.job_id == jid and cmd.nccl_id.unique_id == id_a, (w.id, cmd)
            # the same id again (a retried Report) is fine and not sent twice
            r0.report(job_id=jid, rank=0, plan_version=1, nccl_unique_id=id_a)
            # another id for the same job is refused; the job keeps its first
            expect(c, INVALID, ["nccl_unique_id", "already has another id"], r0.report, job_id=jid, rank=0,
                   plan_version=1, nccl_unique_id=id_b)
            assert all(w.next_command("nccl_id", timeout=0.5) is None for w in ws)
            assert c.get(jid).state == STATE.JOB_STATE_RUNNING
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10 * SLOW)
            c.wait_workers(2)

            # a cuda job over tcp has no NCCL id to exchange
            jid = submit(c, cuda_spec("tcp", transport="tcp")).job_id
            by_rank = ranks_of(ws, jid)
            expect(c, INVALID, ["nccl_unique_id", "transport tcp", "not nccl"], by_rank[0].report, job_id=jid,
                   rank=0, plan_version=1, nccl_unique_id=id_a)
            assert all(w.next_command("nccl_id", timeout=0.5) is None for w in ws)
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10 * SLOW)
        finally:
            for w in ws:
                w.close()


def test_stage_group_ids():
    """A cuda job with data_parallel 2 (p = 2): replica 0's rank r reports
    its stage group's id, which goes to the group {r, 2 + r} only, with
    stage_group and pipeline_rank set; the coordinator refuses an id from
    replica 1, of the wrong length, a second one for the same group, and
    one for a job with one replica."""
    with Cluster(workers=0, name="nccl-groups") as c:
        ws = fake_workers(c, 4)
        try:
            jid = submit(c, cuda_spec("groups", data_parallel=2)).job_id

            def assigned():
                got = {w.assignments[jid].replica * 2 + w.assignments[jid].rank: w for w in ws
                       if jid in w.assignments}
                return got if len(got) == 4 else None

            by_rank = wait_until("the assignments of " + jid, assigned, 15)
            id_a, id_b = bytes(range(128)), bytes(255 - k for k in range(128))
            expect(c, INVALID, ["nccl_group_unique_id", "only replica 0"], by_rank[3].report, job_id=jid, rank=3,
                   plan_version=1, nccl_group_unique_id=id_a)
            expect(c, INVALID, ["nccl_group_unique_id", "127 bytes", "128"], by_rank[1].report, job_id=jid,
                   rank=1, plan_version=1, nccl_group_unique_id=id_a[:127])
            assert all(w.next_command("nccl_id", timeout=0.5) is None for w in ws)
            by_rank[1].report(job_id=jid, rank=1, plan_version=1, nccl_group_unique_id=id_a)
            for g in (1, 3):
                cmd = by_rank[g].next_command("nccl_id")
                assert cmd and cmd.nccl_id.unique_id == id_a and cmd.nccl_id.stage_group, (g, cmd)
                assert cmd.nccl_id.pipeline_rank == 1 and cmd.nccl_id.job_id == jid, (g, cmd)
            assert all(by_rank[g].next_command("nccl_id", timeout=0.5) is None for g in (0, 2))
            by_rank[0].report(job_id=jid, rank=0, plan_version=1, nccl_group_unique_id=id_b)
            for g in (0, 2):
                cmd = by_rank[g].next_command("nccl_id")
                assert cmd and cmd.nccl_id.unique_id == id_b and cmd.nccl_id.pipeline_rank == 0, (g, cmd)
            # the same id again is fine and not sent twice; another is refused
            by_rank[1].report(job_id=jid, rank=1, plan_version=1, nccl_group_unique_id=id_a)
            expect(c, INVALID, ["nccl_group_unique_id", "already has another id"], by_rank[1].report,
                   job_id=jid, rank=1, plan_version=1, nccl_group_unique_id=id_b)
            assert all(w.next_command("nccl_id", timeout=0.5) is None for w in ws)
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10 * SLOW)
            c.wait_workers(4)

            jid = submit(c, cuda_spec("one-replica")).job_id
            got = wait_until("an assignment", lambda: [w for w in ws if jid in w.assignments
                                                       and w.assignments[jid].rank == 0], 15)
            expect(c, INVALID, ["nccl_group_unique_id", "one replica"], got[0].report, job_id=jid, rank=0,
                   plan_version=1, nccl_group_unique_id=id_a)
            c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10 * SLOW)
        finally:
            for w in ws:
                w.close()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
