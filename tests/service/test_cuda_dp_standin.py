"""Data-parallel cuda jobs over NCCL, on the CPU stand-in (docs/model.md,
Data parallelism; Collectives (nccl)): real zb-coordinator and four
zb-worker-standin processes, backend cuda, transport nccl, data_parallel
d = 2 of a p = 2 pipeline. The p2p communicator spans all four ranks; each
stage group {r, 2 + r} has its own communicator, whose id replica 0's
rank r makes and the coordinator hands to the group; each stage's device
gradients are all-reduced over it and scaled by 1/d on the device.

- With model.dump_dir: zb-gradcheck passes (replica 0's gradients equal,
  within GRAD_TOL per tensor, those of one process on the global batch of
  d x m microbatches, replica k's microbatch j being the batch's k*m + j)
  and every replica's dumps are bit-identical to replica 0's (gradcheck's
  replica check, and this test compares the arrays again); each replica
  read its own microbatches (their losses differ).
- A lost replica rank: SIGKILL (or SIGSTOP, which only the heartbeats
  tell) of rank 3 (replica 1, stage 1) mid-run,
  with the stand-in's NCCL silent about lost peers (as NCCL over shared
  memory) and its own unmatched-op check off, fails the job naming
  "rank 3 (replica 1, stage 1, worker ...)" within heartbeat timeout + 2 s,
  and every survivor's rank ends within that bound too, its stage group
  aborted (its log says so): the coordinator's release raises the stop
  flag, which the group's watchdog turns into an abort, so no member
  stays blocked in a collective. transfer_timeout_s is 60 s, far beyond
  the bound, so the timeout cannot be what ends them.
"""

import os
import signal
import time

import zbsvc
from zbsvc import SLOW, STATE, Cluster, zb_pb2

GRAD_TOL = 1e-5  # zb-gradcheck's bound, as test_grads_dp's
ITERATIONS = 3
M = 3  # microbatches per replica
P = 2
D = 2
GRADCHECK = os.environ["ZB_GRADCHECK_BIN"]
HEARTBEAT_TIMEOUT_MS = 2000
BOUND_S = HEARTBEAT_TIMEOUT_MS / 1000 + 2.0


def spec(name, family, dump_dir="", iterations=ITERATIONS, **kw):
    model = zb_pb2.ModelSpec(hidden=16, heads=2, layers=4, seq_len=8, batch=2, seed=11, lr=1e-2,
                             dump_dir=dump_dir)
    return zb_pb2.JobSpec(name=name, ranks=P, microbatches=M, schedule=family, iterations=iterations,
                          backend="cuda", transport="nccl", data_parallel=D, model=model, **kw)


def check_replicas(c, family):
    dump_dir = os.path.join(c.dir, "dumps")
    jid = c.submit(spec("cuda-dp-" + family, family, dump_dir))
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=300)
    assert job.iterations_done == ITERATIONS, job
    c.wait_workers(len(c.workers))
    where = "cuda d=%d p=%d %s" % (D, P, family)
    stages = P * zbsvc.family_chunks(family)
    results = zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, jid), jid, stages, M, ITERATIONS, GRAD_TOL,
                                    where)
    for r in results:
        assert r["data_parallel"] == D and r["replicas_identical"] is True, (where, r)
    assert results[0]["init_identical"] is True, (where, results[0])
    for it in range(ITERATIONS):
        r0 = zbsvc.read_dumps(dump_dir, jid, it, replica=0)
        r1 = zbsvc.read_dumps(dump_dir, jid, it, replica=1)
        assert sorted(r0) == sorted(r1) == list(range(stages)), (where, it, sorted(r0), sorted(r1))
        for s in r0:
            assert (r1[s]["replica"], r1[s]["data_parallel"], r0[s]["replica"]) == (1, D, 0), (where, s)
            for which in ("before", "grads", "after"):
                assert r0[s][which] == r1[s][which], (where, it, s, which)
        assert r0[stages - 1]["loss"] != r1[stages - 1]["loss"], (where, it)
    # every rank joined its stage group: "job J rank G: stage R's group (member K of 2, ranks R 2+R) connected"
    lines = [ln for w in c.workers.values() for ln in w.log_text().splitlines()
             if "job %s rank" % jid in ln and ln.endswith('connected"')]
    want = sorted("job %s rank %d: stage %d's group (member %d of %d, ranks %d %d) connected"
                  % (jid, g, g % P, g // P, D, g % P, P + g % P) for g in range(P * D))
    assert sorted(ln[ln.index("msg=") + 5:-1] for ln in lines) == want, (where, lines)
    print("%s: zb-gradcheck within %g over %d iterations, replicas bit-identical" % (where, GRAD_TOL, ITERATIONS))


def test_two_replicas_train_the_global_batch():
    with Cluster(workers=P * D, name="cuda-dp") as c:
        for family in ("1f1b", "zb-h1"):
            check_replicas(c, family)


def with_silent_nccl(fn):
    """Runs fn(cluster) with NCCL silent about lost peers."""
    saved = {k: os.environ.get(k) for k in ("ZB_STANDIN_NCCL_PEER_LOSS", "ZB_STANDIN_NCCL_TIMEOUT_MS")}
    os.environ["ZB_STANDIN_NCCL_PEER_LOSS"] = "hang"  # NCCL reports no lost peer
    os.environ["ZB_STANDIN_NCCL_TIMEOUT_MS"] = "600000"  # nor does the stand-in's own unmatched-op check
    try:
        with Cluster(workers=P * D, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="cuda-dp-loss") as c:
            fn(c)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_killed_replica_rank_fails_the_job_in_seconds():
    with_silent_nccl(lambda c: lose_rank(c, "kill"))


def test_stopped_replica_rank_fails_the_job_in_seconds():
    """SIGSTOP: only the heartbeats tell, so rank 1 (the lost rank's stage
    group partner) has long reached its reduction and waits in the
    group's all-reduce when the coordinator releases it."""
    with_silent_nccl(lambda c: lose_rank(c, "stop"))


def lose_rank(c, how):
    jid = c.submit(spec("cuda-dp-loss", "1f1b", iterations=100000, transfer_timeout_s=60, trace_every=-1))
    c.wait_iterations(jid, 2, timeout=120)
    lost = P * D - 1  # replica 1, stage 1
    wid = c.worker_of_rank(jid, lost)
    survivors = {g: c.worker_of_rank(jid, g) for g in range(P * D) if g != lost}
    t0 = time.monotonic()
    if how == "kill":
        c.workers[wid].kill()
    else:
        c.workers[wid].signal(signal.SIGSTOP)
    try:
        check_loss(c, jid, lost, wid, survivors, t0, how)
    finally:
        if how == "stop":
            c.workers[wid].signal(signal.SIGCONT)
            c.workers[wid].kill()


def check_loss(c, jid, lost, wid, survivors, t0, how):
    job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=BOUND_S * SLOW + 60)
    failed = time.monotonic() - t0
    # each survivor's own log says when its rank really ended ("job J rank
    # R: stopped", R its pipeline rank); the coordinator counts a released
    # worker idle at once
    deadline = time.monotonic() + BOUND_S * SLOW + 60
    ended = {}
    while time.monotonic() < deadline and len(ended) < len(survivors):
        for g, w in survivors.items():
            if g not in ended and "job %s rank %d: stopped" % (jid, g % P) in c.workers[w].log_text():
                ended[g] = time.monotonic() - t0
        time.sleep(0.05)
    print("%s: job FAILED after %.2f s, survivors' ranks ended after %s s (bound %.1f s): %s"
          % (how, failed, ", ".join("%d: %.2f" % kv for kv in sorted(ended.items())), BOUND_S, job.reason))
    want = "rank %d (replica 1, stage 1, worker %s) lost" % (lost, wid)
    assert job.reason.startswith(want), (want, job.reason)
    assert failed < BOUND_S * SLOW, "job failed after %.2f s" % failed
    for g, w in survivors.items():
        log = c.workers[w].log_text()
        assert g in ended, "rank %d's rank never ended: %s" % (g, log[-3000:])
        assert ended[g] < BOUND_S * SLOW, "rank %d ended %.2f s after the loss" % (g, ended[g])
        r = g % P
        group = "stage %d's group (member %d of %d, ranks %d %d) aborted" % (r, g // P, D, r, P + r)
        assert group in log, (group, log[-3000:])
        assert "released from job %s" % jid in log, log[-3000:]
    c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
