"""Admission before work and planning off the loop (issue 13, Admission):
a job too large to plan is refused from its shape alone, before any
planning, with the coordinator's memory unchanged; a large plan is made
on libuv's thread pool while the loop keeps answering health checks; a
client that leaves while its job is planned leaves nothing behind."""

import threading
import time

import zbsvc
from zbsvc import STATE, Cluster, health_pb2, job_spec, rpc_error, zb_pb2

import grpc


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_oversized_submits_are_refused_before_planning():
    with Cluster(workers=2, name="limits-oom") as c:
        pid = c.coordinator.pid
        before = rss_kb(pid)
        cases = [  # the threat model's shapes: more ranks than workers, and a plan past the budget
            (job_spec(name="huge", ranks=64, microbatches=500000, schedule="1f1b"),
             grpc.StatusCode.FAILED_PRECONDITION, "64 ranks but 2 workers"),
            (job_spec(name="huge", ranks=2, microbatches=1000000, schedule="zb-auto"),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "max_plan_ops"),
            (job_spec(name="huge", ranks=2, microbatches=1000000, schedule="1f1b"),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes"),
        ]
        for spec, code, text in cases:
            t0 = time.monotonic()
            got, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=30)
            took = time.monotonic() - t0
            print("refused in %5.1f ms: %s %s" % (1e3 * took, got.name, details[:110]))
            assert got == code and text in details, (got, details)
        after = rss_kb(pid)
        print("coordinator RSS %d kB -> %d kB" % (before, after))
        assert after - before < 8 * 1024, (before, after)  # nothing planned: a few kB of calls at most
        assert c.list_jobs() == []
        c.assert_serving()


def test_health_is_answered_while_a_large_plan_is_made():
    """Health checks sent while SubmitJob plans a large job complete before
    the submission does: the plan is made off the loop. Planning on the
    loop would hold every one of them until the plan was done."""
    with Cluster(workers=2, name="limits-loop") as c:
        spec = job_spec(name="large", ranks=2, microbatches=400000, schedule="zb-h1", t=0.0001, iterations=1)
        result = {}

        def submit():
            t0 = time.monotonic()
            result["id"] = c.submit(spec)
            result["took"] = time.monotonic() - t0
            result["done_at"] = time.monotonic()

        th = threading.Thread(target=submit)
        th.start()
        answered = []
        while th.is_alive():
            t0 = time.monotonic()
            assert c.health() == health_pb2.HealthCheckResponse.SERVING
            t1 = time.monotonic()
            answered.append((t1, t1 - t0))
            time.sleep(0.01)
        th.join()
        during = [lat for at, lat in answered if at < result["done_at"]]
        print("submission took %.2f s; %d health checks answered meanwhile, slowest %.1f ms" %
              (result["took"], len(during), 1e3 * max(during or [0])))
        assert len(during) >= 3, (result, answered)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=result["id"], reason="measured"), timeout=30)
        c.assert_serving()


def test_client_leaving_during_planning_leaves_no_job():
    with Cluster(workers=2, name="limits-leave") as c:
        spec = job_spec(name="abandoned", ranks=2, microbatches=400000, schedule="zb-h1", t=0.0001, iterations=1)
        code, _ = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=0.05)
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, code
        time.sleep(3 * zbsvc.SLOW)  # the plan finishes and is dropped
        assert c.list_jobs() == [], c.list_jobs()
        jid = c.submit(job_spec(name="next", ranks=2, microbatches=4, iterations=2))
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED)
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
