"""Waiting jobs and planning under load (issue 28, items 1 and 4): a job
that waits PENDING holds no plan (its plan is made again when its workers
are there), so submits within the planning budget that wait for workers
cannot exhaust the coordinator's memory; planning is queued per identity
and served round-robin (max_concurrent_plans_per_identity), so one
caller's flood of large Plan calls does not delay another caller's
submit; a job whose plan was dropped runs to SUCCEEDED with its own
schedule once workers come."""

import threading
import time

import zbsvc
from zbsvc import STATE, Cluster, job_spec, zb_pb2

import grpc

# the largest 1f1b shape the default planning budget admits (max_plan_ops
# 2^24 >= 32 x 174762 x 3): its plan takes about 250 MB
BUDGET_SIZED = dict(name="budget", ranks=32, microbatches=174762, schedule="1f1b", wait_for_workers_s=600)


def vm_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def test_budget_sized_submits_that_wait_hold_no_plans():
    """16 submits of the largest admitted shape, with no worker attached:
    each is planned (one at a time: one identity), admitted and queued;
    none keeps its plan, so the coordinator's peak RSS stays under 1 GiB
    (it was OOM-killed after twelve in a 3 GiB cgroup)."""
    n = 4 if zbsvc.SANITIZE else 16  # ASan plans several times slower
    with Cluster(workers=0, name="queues-mem") as c:
        pid = c.coordinator.pid
        ids, errors = [], []

        def submit():
            try:
                ids.append(c.stub.SubmitJob(zb_pb2.SubmitJobRequest(spec=job_spec(**BUDGET_SIZED)),
                                            timeout=600 * zbsvc.SLOW).job_id)
            except grpc.RpcError as e:
                errors.append((e.code(), e.details()))

        threads = [threading.Thread(target=submit) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(ids) == n, errors
        peak, now = vm_kb(pid, "VmHWM"), vm_kb(pid, "VmRSS")
        print("%d budget-sized jobs waiting; coordinator RSS %d kB, peak %d kB" % (n, now, peak))
        assert all(c.get(j).state == STATE.JOB_STATE_PENDING for j in ids)
        if not zbsvc.SANITIZE:  # ASan's shadow and quarantine are not the coordinator's
            assert peak < 1024 * 1024, peak
        c.assert_serving()


def test_a_waiting_job_is_planned_again_and_runs_its_own_schedule():
    """A job admitted while too few workers are attached drops its plan;
    when they come it is planned again from its spec and runs to
    SUCCEEDED with the schedule it was submitted with."""
    with Cluster(workers=1, name="queues-replan") as c:
        jid = c.submit(job_spec(name="later", ranks=2, schedule="zb-h2", iterations=3, wait_for_workers_s=600))
        assert c.get(jid).state == STATE.JOB_STATE_PENDING
        c.start_worker("w1")
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert job.schedule == "zb-h2" and job.iterations_done == 3, job
        assert any("making its plan again" in line for line in c.coordinator.log_text().splitlines())
        c.assert_serving()


def test_another_users_submit_is_planned_during_a_plan_flood():
    """alice opens 100 Plan calls of a large shape (about a second each;
    queued first-come, bob would wait for 50 of them); bob's 1-rank submit
    is still planned at once (within 2 s): alice's calls wait for her one
    planner, and bob's plan takes the other."""
    with Cluster(workers=1, tls=True, name="queues-flood") as c:
        flood = job_spec(name="flood", ranks=32, microbatches=40000, schedule="1f1b")
        futures = [c.stub.Plan.future(zb_pb2.PlanRequest(spec=flood), timeout=600) for _ in range(100)]
        time.sleep(1)  # alice's first plan is being made, the rest queued behind it
        ch, bob = c.stub_as("user-bob")
        try:
            t0 = time.monotonic()
            jid = bob.SubmitJob(zb_pb2.SubmitJobRequest(spec=job_spec(name="bob", ranks=1, iterations=2)),
                                timeout=60).job_id
            took = time.monotonic() - t0
            print("bob's submit answered in %.2f s during alice's flood of 100 Plan calls" % took)
            assert took < 2.0 * zbsvc.SLOW, took
            zbsvc.wait_until("bob's job to succeed", lambda: bob.GetJob(
                zb_pb2.GetJobRequest(job_id=jid), timeout=10).state == STATE.JOB_STATE_SUCCEEDED, 60 * zbsvc.SLOW)
        finally:
            ch.close()
        for f in futures:
            f.cancel()  # her queued plans leave the queue with her calls
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
