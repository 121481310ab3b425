"""A schedule update mid-run (1f1b -> zb-h1, then zb-h1 -> zb-v): the job
SUCCEEDS, every iteration 0..n-1 is reported exactly once, iterations
before UpdateScheduleResponse.from_iteration name the old schedule and
those from it the new one."""

import json

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, job_spec, rpc_error, zb_pb2

import grpc

ITERATIONS = 12


def test_update_schedule_mid_run():
    with Cluster(workers=4, name="update") as c:
        jid = c.submit(job_spec(name="switching", schedule="1f1b", iterations=ITERATIONS))
        c.wait_iterations(jid, 1)

        # first update through zbctl (JSON output carries from_iteration)
        cp = c.zbctl("update-schedule", jid, "--schedule", "zb-h1", "--output", "json")
        assert cp.returncode == 0, cp.stderr
        first = json.loads(cp.stdout)["from_iteration"]
        assert 1 <= first < ITERATIONS, first

        # a second update while the first waits is refused
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "already" in details, (code, details)

        # once the first took over, a second one to zb-v (two chunks per rank)
        c.wait_iterations(jid, first + 1)
        assert c.get(jid).schedule == "zb-h1"
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"), timeout=10)
        second = resp.from_iteration
        assert first < second < ITERATIONS, (first, second)
        assert resp.job.id == jid

        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=90)
        assert job.iterations_done == ITERATIONS, job
        assert job.schedule == "zb-v", job.schedule
        its = iteration_events(c.events(jid))
        assert [it.iteration for it in its] == list(range(ITERATIONS)), [it.iteration for it in its]
        want = ["1f1b"] * first + ["zb-h1"] * (second - first) + ["zb-v"] * (ITERATIONS - second)
        assert [it.schedule for it in its] == want, ([it.schedule for it in its], first, second)
        # each part is predicted by its own plan
        pred = {it.schedule: it.predicted_bubble_ratio for it in its}
        assert pred["zb-v"] < pred["zb-h1"] < pred["1f1b"], pred
        c.wait_workers(4, idle=True, timeout=10)

        # updates of a finished job and to an unknown schedule are refused
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "SUCCEEDED" in details, (code, details)
        cp = c.zbctl("update-schedule", jid, "--schedule", "zb-h1")
        assert cp.returncode == 1 and "FAILED_PRECONDITION" in cp.stderr, cp.stderr


def test_update_to_unknown_schedule_is_refused():
    with Cluster(workers=2, name="update-bad") as c:
        jid = c.submit(job_spec(name="steady", ranks=2, microbatches=4, iterations=400))
        c.wait_state(jid, STATE.JOB_STATE_RUNNING)
        code, details = rpc_error(c.stub.UpdateSchedule,
                                  zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-zz"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "schedule" in details, (code, details)
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "schedule" in details, (code, details)
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        assert c.get(jid).schedule == "1f1b"
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.assert_serving()


def test_update_over_the_message_limit_is_refused():
    # 1f1b and zb-h1 plans of m=500 fit in 24 KiB per rank; zb-v's (two
    # chunks, W split out) do not, and must not reach the workers either
    with Cluster(workers=4, max_message_bytes=24576, name="update-big") as c:
        jid = c.submit(job_spec(name="near-limit", microbatches=500, t=0.0001, iterations=100000,
                                bytes_per_activation=1024))
        c.wait_iterations(jid, 1)
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "24576" in details, (code, details)
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING and c.get(jid).schedule == "1f1b"
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"), timeout=30)
        c.wait_iterations(jid, resp.from_iteration + 1)
        assert c.get(jid).schedule == "zb-h1"
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.wait_workers(4)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
