"""Cancelling a running job: it ends CANCELLED with the reason given, its
watchers end (zbctl watch exits 1), no event follows the final one, its
workers go idle and the next job runs on them."""

import subprocess
import time

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, job_spec, rpc_error

import grpc


def test_cancel_mid_run_frees_the_workers():
    with Cluster(workers=4, name="cancel") as c:
        jid = c.submit(job_spec(name="long", schedule="zb-h1", iterations=200))
        watch = subprocess.Popen(zbsvc._WRAP + [zbsvc.ZBCTL, "watch", jid, "--coordinator", c.address],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        c.wait_iterations(jid, 2)
        busy = [w for w in c.list_workers() if w.state == "busy"]
        assert sorted(w.rank for w in busy) == [0, 1, 2, 3] and all(w.job_id == jid for w in busy), busy

        cp = c.zbctl("cancel", jid, "--reason", "the test is done with it")
        assert cp.returncode == 0, cp.stderr
        assert "CANCELLED" in cp.stdout and "the test is done with it" in cp.stdout, cp.stdout
        job = c.get(jid)
        assert job.state == STATE.JOB_STATE_CANCELLED, job
        assert "the test is done with it" in job.reason, job.reason
        assert job.iterations_done < 200

        out, err = watch.communicate(timeout=30 * zbsvc.SLOW)
        assert watch.returncode == 1, "watch of a cancelled job exited %d: %s" % (watch.returncode, err)
        assert "CANCELLED" in out.splitlines()[-1], out

        c.wait_workers(4, idle=True, timeout=10)
        for w in c.list_workers():
            assert w.job_id == "" and w.rank == -1, w

        # late reports of the cancelled ranks change nothing
        time.sleep(0.5)
        events = c.events(jid)
        assert events[-1].state == STATE.JOB_STATE_CANCELLED, events[-1]
        assert all(e.state != STATE.JOB_STATE_CANCELLED for e in events[:-1])
        n_its = len(iteration_events(events))
        assert c.get(jid).iterations_done == n_its

        # cancelling again is refused, and names the state
        code, details = rpc_error(c.stub.CancelJob, zbsvc.zb_pb2.CancelJobRequest(job_id=jid))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "CANCELLED" in details, (code, details)
        cp = c.zbctl("cancel", jid)
        assert cp.returncode == 1 and "FAILED_PRECONDITION" in cp.stderr, (cp.returncode, cp.stderr)

        # the next job runs on the same workers
        nxt = c.submit(job_spec(name="after", schedule="zb-v", iterations=3))
        c.wait_state(nxt, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        c.wait_workers(4, idle=True, timeout=10)


def test_cancel_pending_job():
    with Cluster(workers=2, name="cancel-pending") as c:
        first = c.submit(job_spec(name="holds", ranks=2, microbatches=4, iterations=500))
        c.wait_state(first, STATE.JOB_STATE_RUNNING)
        queued = c.submit(job_spec(name="queued", ranks=2, microbatches=4, iterations=2))
        assert c.get(queued).state == STATE.JOB_STATE_PENDING
        job = c.stub.CancelJob(zbsvc.zb_pb2.CancelJobRequest(job_id=queued, reason="no longer needed"),
                               timeout=10)
        assert job.state == STATE.JOB_STATE_CANCELLED and "no longer needed" in job.reason, job
        c.stub.CancelJob(zbsvc.zb_pb2.CancelJobRequest(job_id=first), timeout=10)
        c.wait_workers(2, idle=True, timeout=10)
        assert c.get(queued).state == STATE.JOB_STATE_CANCELLED  # never started afterwards
        assert c.get(first).state == STATE.JOB_STATE_CANCELLED


if __name__ == "__main__":
    zbsvc.run_tests(globals())
