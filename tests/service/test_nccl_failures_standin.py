"""A lost rank of an nccl job fails the job within the heartbeat timeout
plus 2 s, on the CPU stand-in with NCCL's real blocking behaviour
(docs/model.md, Transports; The CPU stand-in): real zb-coordinator and two
zb-worker-standin processes, backend cuda, transport nccl, a 2 s heartbeat
timeout. ZB_STANDIN_NCCL_PEER_LOSS=hang makes the stand-in's NCCL say
nothing when a peer dies (as NCCL over shared memory or NVLink), and its
blocked ops wait for their own rank's ncclCommAbort, so only the
coordinator's release of the survivor (its stop flag, which the
communicator's watchdog turns into an abort) ends the survivor's rank; the
job's transfer_timeout_s is 60 s, far beyond the bound.

- SIGKILL of rank 1 mid-run (its Attach stream closes): the job fails
  naming rank 1 and its worker, and the survivor's rank ends, both
  within heartbeat timeout + 2 s of the kill;
- SIGSTOP of rank 1 (only the heartbeats can tell; its sockets stay open):
  the same bound.
"""

import os
import signal
import time

import zbsvc
from zbsvc import SLOW, STATE, zb_pb2

HEARTBEAT_TIMEOUT_MS = 2000
BOUND_S = HEARTBEAT_TIMEOUT_MS / 1000 + 2.0

os.environ["ZB_STANDIN_NCCL_PEER_LOSS"] = "hang"  # NCCL reports no lost peer
os.environ["ZB_STANDIN_NCCL_TIMEOUT_MS"] = "600000"  # nor does the stand-in's own unmatched-op check


def spec():
    model = zb_pb2.ModelSpec(hidden=16, heads=2, layers=4, seq_len=8, batch=2, seed=3, lr=1e-2)
    return zb_pb2.JobSpec(name="nccl-loss", ranks=2, microbatches=4, schedule="1f1b", iterations=100000,
                          backend="cuda", transport="nccl", model=model, transfer_timeout_s=60, trace_every=-1)


def lose_rank(how):
    with zbsvc.Cluster(workers=2, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="nccl-" + how) as c:
        jid = c.submit(spec())
        c.wait_iterations(jid, 2, timeout=120)
        wid = c.worker_of_rank(jid, 1)
        survivor = c.worker_of_rank(jid, 0)
        w = c.workers[wid]
        t0 = time.monotonic()
        if how == "kill":
            w.kill()
        else:
            w.signal(signal.SIGSTOP)
        try:
            job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=BOUND_S * SLOW + 60)
            failed = time.monotonic() - t0
            # The coordinator counts a released worker idle at once; the
            # survivor's own log says when its rank really ended (its
            # communicator aborted, the blocked group returned).
            stopped = "job %s rank 0: stopped" % jid
            deadline = time.monotonic() + BOUND_S * SLOW + 60
            while time.monotonic() < deadline and stopped not in c.workers[survivor].log_text():
                time.sleep(0.05)
            freed = time.monotonic() - t0
            log = c.workers[survivor].log_text()
            print("%s: job FAILED after %.2f s, survivor's rank ended after %.2f s (bound %.1f s): %s"
                  % (how, failed, freed, BOUND_S, job.reason))
            assert job.reason.startswith("rank 1 (worker %s) lost" % wid), job.reason
            assert failed < BOUND_S * SLOW, "job failed after %.2f s" % failed
            assert stopped in log, "the survivor's rank never ended: " + log[-3000:]
            assert freed < BOUND_S * SLOW, "survivor %s ended its rank %.2f s after the loss" % (survivor, freed)
            assert "released from job %s" % jid in log, log[-3000:]
            c.assert_serving()
        finally:
            if how == "stop":
                w.signal(signal.SIGCONT)
                w.kill()


def test_killed_rank_fails_the_job_in_seconds():
    lose_rank("kill")


def test_stopped_rank_fails_the_job_in_seconds():
    lose_rank("stop")


if __name__ == "__main__":
    zbsvc.run_tests(globals())
