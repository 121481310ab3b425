"""Torch jobs (backend torch) in a real zb-coordinator, their agents played
by raw Attach streams from this process (no torch needed): an attached fake
agent holds its stream and answers nothing, which is enough to be placed,
to be refused, and to see the Commands it receives (docs/pytorch.md,
Attaching a torchrun job; docs/wire.md, Torch agents). A torch job's
UpdateSchedule that would move stages between processes is refused while
one with the same chunks and placement switches; under TLS a second run
sharing the worker certificate cannot take over the first run's NAME/RANK
ids (the first job keeps running); a second job naming a run that a
waiting or running job has is refused at submit; after a coordinator
restart a running torch job's rank goes back only to the agent bound to its
run and rank. Heartbeats are off the table (a long timeout): the fake
agents send none."""

import threading
import time

import zbsvc
from zbsvc import STATE, Cluster, job_spec, rpc_error, wait_until, zb_pb2

import grpc

HB_MS = 600000  # the fake agents send no heartbeats; none may be lost for it


class FakeAgent:
    """An Attach stream as worker_id, bound to torch run/rank when run is
    given (else a plain sim worker), naming running_job_id/running_rank;
    a thread keeps every Command it receives and how the stream ended."""

    def __init__(self, stub, worker_id, run=None, rank=0, running_job_id="", running_rank=0):
        torch = run is not None
        req = zb_pb2.AttachRequest(worker_id=worker_id, data_address="127.0.0.1:0",
                                   backends=["torch" if torch else "sim"], transports=["torch" if torch else "tcp"],
                                   torch_run=run or "", torch_rank=rank if torch else 0,
                                   running_job_id=running_job_id, running_rank=running_rank)
        self.worker_id = worker_id
        self.commands = []
        self.error = None  # (code, details) once the stream ended with one
        self.ended = False
        self.stream = stub.Attach(req)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for cmd in self.stream:
                self.commands.append(cmd)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = (e.code(), e.details() or "")
        self.ended = True

    def wait_attached(self):
        wait_until("%s's first Command (attached)" % self.worker_id,
                   lambda: self.commands or self.error, 10)
        assert not self.error, (self.worker_id, self.error)

    def wait_refused(self):
        wait_until("%s's Attach to end" % self.worker_id, lambda: self.ended, 10)
        assert self.error and not self.commands, (self.worker_id, self.error, self.commands)
        return self.error

    def assignments(self):
        return [c.assign for c in self.commands if c.WhichOneof("kind") == "assign"]

    def releases(self):
        return [c.release_job_id for c in self.commands if c.WhichOneof("kind") == "release_job_id"]

    def close(self):
        self.stream.cancel()
        self.thread.join(10)


def torch_job(run, name="torch", ranks=2, schedule="1f1b", **kw):
    return job_spec(name=name, ranks=ranks, microbatches=8, schedule=schedule, iterations=100000, backend="torch",
                    transport="torch", torch_run=run, **kw)


def attach_run(stub, run, ranks, prefix):
    agents = [FakeAgent(stub, "%s%d" % (prefix, r), run, r) for r in range(ranks)]
    for a in agents:
        a.wait_attached()
    return agents


def worker_row(c, wid):
    return {w.id: w for w in c.list_workers()}.get(wid)


def test_update_that_moves_stages_is_refused():
    """1f1b -> zb-v (2 chunks, V placement) would move stages between the
    run's processes, which every agent refuses at the switch: the RPC
    refuses it and the job runs on its plan; 1f1b -> zb-h1 (same chunks and
    placement) is accepted and each agent receives plan version 2."""
    with Cluster(workers=0, heartbeat_timeout_ms=HB_MS, name="torch-update") as c:
        agents = attach_run(c.stub, "run-u", 2, "ag")
        jid = c.submit(torch_job("run-u"))
        c.wait_state(jid, STATE.JOB_STATE_RUNNING)
        for r, a in enumerate(agents):
            wait_until("rank %d's assignment" % r, a.assignments, 10)
            assert [(x.job_id, x.rank, x.plan_version) for x in a.assignments()] == [(jid, r, 1)]
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"),
                                  timeout=30)
        print("1f1b -> zb-v: %s: %s" % (code.name, details))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        assert "torch job" in details and "zb-v" in details and "same chunks and placement" in details, details
        job = c.get(jid)
        assert job.state == STATE.JOB_STATE_RUNNING and job.schedule == "1f1b", job
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"), timeout=30)
        assert resp.from_iteration >= 2, resp  # three past the latest report (none yet)
        for r, a in enumerate(agents):
            wait_until("rank %d's second assignment" % r, lambda: len(a.assignments()) == 2, 10)
            last = a.assignments()[-1]
            assert (last.plan_version, last.first_iteration) == (2, resp.from_iteration), last
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        for a in agents:
            a.close()


def test_second_run_sharing_a_certificate_is_refused():
    """Under TLS a run's agents are NAME/RANK under the certificate
    zb://worker/NAME: a second run launched with it names the same ids.
    Its rank 0 is refused ALREADY_EXISTS (naming the id and both runs) and
    the first run's job keeps running on its rank 0 (it was taken for a
    restart of that worker and failed the job)."""
    with Cluster(workers=0, tls=True, heartbeat_timeout_ms=HB_MS, name="torch-cert") as c:
        c.make_certs(workers=["tr"])
        ch, stub = c.stub_as("worker-tr")
        try:
            agents = attach_run(stub, "run-a", 2, "tr/")
            jid = c.submit(torch_job("run-a"))
            c.wait_state(jid, STATE.JOB_STATE_RUNNING)
            second = FakeAgent(stub, "tr/0", "run-b", 0)
            code, details = second.wait_refused()
            print("second run's tr/0: %s: %s" % (code.name, details))
            assert code == grpc.StatusCode.ALREADY_EXISTS, (code, details)
            assert "tr/0" in details and "run-a" in details and "run-b" in details, details
            job = c.get(jid)
            assert job.state == STATE.JOB_STATE_RUNNING, (job.state, job.reason)
            row = worker_row(c, "tr/0")
            assert row and row.state == "busy" and row.job_id == jid and row.rank == 0, row
            assert not agents[0].ended, agents[0].error  # its stream was not replaced
            # a rank past the largest an agent may bind to is not a NAME/RANK id
            code, details = FakeAgent(stub, "tr/1024", "run-a", 1024).wait_refused()
            assert code == grpc.StatusCode.PERMISSION_DENIED and "tr/1024" in details, (code, details)
            for a in agents:
                a.close()
        finally:
            ch.close()


def test_duplicate_torch_run_refused_at_submit():
    """A torch job naming the run of a PENDING job is refused
    ALREADY_EXISTS naming that job; another run is accepted; once the
    first is cancelled its run is free again."""
    with Cluster(workers=0, heartbeat_timeout_ms=HB_MS, name="torch-dup") as c:
        first = c.submit(torch_job("run-d", wait_for_workers_s=600))
        assert c.get(first).state == STATE.JOB_STATE_PENDING
        code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=torch_job("run-d", name="again")),
                                  timeout=30)
        print("same run: %s: %s" % (code.name, details))
        assert code == grpc.StatusCode.ALREADY_EXISTS, (code, details)
        assert "torch_run" in details and "run-d" in details and first in details, details
        other = c.submit(torch_job("run-e", wait_for_workers_s=600))
        assert c.get(other).state == STATE.JOB_STATE_PENDING
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=first, reason="free the run"), timeout=10)
        c.wait_state(first, STATE.JOB_STATE_CANCELLED)
        again = c.submit(torch_job("run-d", wait_for_workers_s=600))
        assert c.get(again).state == STATE.JOB_STATE_PENDING


def test_restart_gives_a_torch_rank_only_to_its_bound_agent():
    """After a coordinator restart a running torch job's rank is not taken
    back by a plain worker of the same id (without TLS the store's owner is
    the id), nor by an agent bound to another run: each is released and the
    rank waits; the agent bound to the job's run and rank takes it back."""
    with Cluster(workers=0, heartbeat_timeout_ms=HB_MS, name="torch-restart") as c:
        agents = attach_run(c.stub, "run-r", 2, "ag")
        jid = c.submit(torch_job("run-r"))
        c.wait_state(jid, STATE.JOB_STATE_RUNNING)
        for a in agents:
            wait_until("%s's assignment" % a.worker_id, a.assignments, 10)
        port = c.port
        c.coordinator.kill()
        for a in agents:
            wait_until("%s's stream to end" % a.worker_id, lambda: a.ended, 20)
        c.start_coordinator(port=port)
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING

        plain = FakeAgent(c.stub, "ag0", running_job_id=jid, running_rank=0)
        wait_until("the plain worker's release", plain.releases, 10)
        assert plain.releases() == [jid] and not plain.assignments(), plain.commands
        row = worker_row(c, "ag0")
        assert row and row.state == "idle" and row.rank == -1, row
        plain.close()
        wait_until("the plain worker to detach", lambda: worker_row(c, "ag0") is None, 10)

        stray = FakeAgent(c.stub, "ag1", "run-other", 1, running_job_id=jid, running_rank=1)
        wait_until("the other run's agent's release", stray.releases, 10)
        row = worker_row(c, "ag1")
        assert row and row.state == "idle", row
        stray.close()
        wait_until("the other run's agent to detach", lambda: worker_row(c, "ag1") is None, 10)

        job = c.get(jid)
        assert job.state == STATE.JOB_STATE_RUNNING and "waiting for its 2 ranks" in job.reason, job.reason
        back = [FakeAgent(c.stub, "ag%d" % r, "run-r", r, running_job_id=jid, running_rank=r) for r in range(2)]
        for r, a in enumerate(back):
            wait_until("ag%d to hold rank %d again" % (r, r),
                       lambda: (worker_row(c, a.worker_id) or zb_pb2.Worker()).job_id == jid, 10)
            assert worker_row(c, a.worker_id).rank == r and not a.releases(), a.commands
        wait_until("every rank back", lambda: "every rank back" in c.get(jid).reason, 10)
        for a in back:
            a.close()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
