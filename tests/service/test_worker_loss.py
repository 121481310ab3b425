"""A worker lost mid-job fails the job, and the coordinator goes on: a
SIGKILLed worker (its connections close) and a SIGSTOPped one (only the
heartbeat timeout can tell) both end the job FAILED within the heartbeat
timeout plus slack, with a reason naming the rank; Health stays SERVING,
ListJobs works and a new job runs on the workers left."""

import signal
import time

import zbsvc
from zbsvc import SLOW, STATE, Cluster, job_spec

HEARTBEAT_TIMEOUT_MS = 1500
SLACK_S = 3.0  # detection runs on a 250 ms tick; under ASan everything is slower


def start_long_job(c, name):
    jid = c.submit(job_spec(name=name, schedule="zb-h1", iterations=500))
    c.wait_iterations(jid, 1)
    return jid


def test_killed_worker_fails_the_job():
    with Cluster(workers=5, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="kill-worker") as c:
        jid = start_long_job(c, "victim")
        wid = c.worker_of_rank(jid, 2)
        t0 = time.monotonic()
        c.workers[wid].kill()
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S)
        elapsed = time.monotonic() - t0
        assert elapsed < (HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S) * SLOW, elapsed
        assert job.reason.startswith("rank 2 "), job.reason  # the lost rank, not a neighbour that saw it go
        print("FAILED after %.2f s: %s" % (elapsed, job.reason))

        c.assert_serving()
        assert [j.id for j in c.list_jobs()] == [jid]
        ws = c.wait_workers(4, idle=True, timeout=10)
        assert wid not in [w.id for w in ws], ws
        nxt = c.submit(job_spec(name="survivors", schedule="zb-v", iterations=3))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        assert wid not in [w.id for w in c.list_workers()]


def test_stopped_worker_times_out():
    with Cluster(workers=4, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="stop-worker") as c:
        jid = start_long_job(c, "frozen")
        wid = c.worker_of_rank(jid, 1)
        w = c.workers[wid]
        t0 = time.monotonic()
        w.signal(signal.SIGSTOP)
        try:
            job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S)
            elapsed = time.monotonic() - t0
            assert elapsed < (HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S) * SLOW, elapsed
            assert elapsed >= HEARTBEAT_TIMEOUT_MS / 1000 * 0.9, "failed before the timeout: %.2f s" % elapsed
            assert job.reason.startswith("rank 1 ") and "heartbeat" in job.reason, job.reason
            print("FAILED after %.2f s: %s" % (elapsed, job.reason))
            c.assert_serving()
            assert wid not in [x.id for x in c.list_workers()]
        finally:
            w.signal(signal.SIGCONT)
        # resumed, it finds its stream ended and attaches again as a new worker
        c.wait_workers(4, idle=True, timeout=15)
        nxt = c.submit(job_spec(name="all-back", schedule="1f1b", iterations=3))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)


def test_worker_restarted_under_the_same_id():
    with Cluster(workers=4, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="same-id") as c:
        jid = start_long_job(c, "restarted")
        wid = c.worker_of_rank(jid, 3)
        c.workers[wid].kill()
        c.start_worker(wid)  # a supervisor brings it straight back
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S)
        assert job.reason.startswith("rank 3 ") and wid in job.reason, job.reason
        ws = c.wait_workers(4, idle=True, timeout=15)
        assert sorted(w.id for w in ws) == ["w0", "w1", "w2", "w3"], ws
        nxt = c.submit(job_spec(name="with-newcomer", schedule="zb-h1", iterations=3))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
