"""Data-parallel cpu jobs train what one pipeline on the global batch
trains (docs/model.md, Data parallelism).

A cpu job of data_parallel d = 2 runs on real zb-worker processes (each a
replica's pipeline rank, activations over TCP within a replica, each
stage's gradients all-reduced over TCP between its two replicas with the
ring, then scaled by 1/d) with model.dump_dir. Then:

- zb-gradcheck passes: replica 0's gradients equal, within GRAD_TOL per
  tensor, those of one process running the whole model on the global
  batch (d x m microbatches, replica k's microbatch j being the batch's
  k*m + j), and each replica's loss the reference's over its own
  microbatches;
- every replica's dumps (weights before and after the step, gradients,
  grad norm) are bit-identical to replica 0's (zb-gradcheck checks it, and
  this test compares the files' arrays again);
- the final weights equal those of a d = 1 job with 2m microbatches on the
  same data, within FINAL_TOL: the two jobs sum the same gradients in
  another fp32 order (the ring's sum of two replicas' means against one
  pipeline's accumulation), about 1e-7 relative per gradient, but AdamW's
  normalised update m / sqrt(v) amplifies it on elements whose gradient
  is near zero (a bias's), so a tensor's weights drift apart by up to
  about 1e-5 relative over ITERATIONS steps; FINAL_TOL leaves 10x room,
  while a missing 1/d or a replica's data read twice moves them by 1e-3
  and more.

Shapes: (d, p) = (2, 2) and (2, 4), three iterations each.
"""

import os
import struct

import zbsvc
from zbsvc import STATE, Cluster, zb_pb2

GRAD_TOL = 1e-5  # zb-gradcheck's bound, as test_grads_cpu's
FINAL_TOL = 1e-4  # per tensor, ||w_dp - w_one|| / ||w_one|| after the last step (measured: about 1e-5)
ITERATIONS = 3
M = 3  # microbatches per replica
GRADCHECK = os.environ["ZB_GRADCHECK_BIN"]


def spec(name, p, m, dp, family, dump_dir):
    model = zb_pb2.ModelSpec(hidden=16, heads=2, layers=6, seq_len=8, batch=2, seed=11, lr=1e-2,
                             dump_dir=dump_dir)
    return zb_pb2.JobSpec(name=name, ranks=p, microbatches=m, schedule=family, iterations=ITERATIONS,
                          backend="cpu", data_parallel=dp, model=model)


def floats(raw):
    return struct.unpack("=%df" % (len(raw) // 4), raw)


def rel_diff(a, b):
    """||a - b|| / ||b|| of two raw float32 arrays."""
    x, y = floats(a), floats(b)
    num = sum((u - v) ** 2 for u, v in zip(x, y)) ** 0.5
    den = sum(v * v for v in y) ** 0.5
    return num / den if den else num


def tensor_slices(d):
    off = 0
    for name, rows, cols in d["tensors"]:
        n = 4 * rows * cols
        yield name, off, off + n
        off += n


def run_dp(c, p, family, dump_dir):
    """Runs the d = 2 job and its d = 1 twin of 2m microbatches; checks
    gradcheck, bit-identity and the final weights; returns the largest
    final-weight difference."""
    where = "d=2 p=%d %s" % (p, family)
    jid = c.submit(spec("dp2-p%d" % p, p, M, 2, family, dump_dir))
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
    assert job.iterations_done == ITERATIONS, job
    c.wait_workers(len(c.workers))
    stages = p * zbsvc.family_chunks(family)
    results = zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, jid), jid, stages, M, ITERATIONS, GRAD_TOL,
                                    where)
    for r in results:
        assert r["data_parallel"] == 2 and r["replicas_identical"] is True, (where, r)
    assert results[0]["init_identical"] is True, (where, results[0])
    for it in range(ITERATIONS):
        r0 = zbsvc.read_dumps(dump_dir, jid, it, replica=0)
        r1 = zbsvc.read_dumps(dump_dir, jid, it, replica=1)
        for s in r0:
            assert (r1[s]["replica"], r1[s]["data_parallel"], r0[s]["replica"]) == (1, 2, 0), (where, s)
            for which in ("before", "grads", "after"):
                assert r0[s][which] == r1[s][which], (where, it, s, which)
        # each replica read its own microbatches: their losses differ
        last = stages - 1
        assert r0[last]["loss"] != r1[last]["loss"], (where, it)

    one = c.submit(spec("dp1-p%d" % p, p, 2 * M, 1, family, dump_dir))
    c.wait_state(one, STATE.JOB_STATE_SUCCEEDED, timeout=180)
    c.wait_workers(len(c.workers))
    zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, one), one, stages, 2 * M, ITERATIONS, GRAD_TOL,
                          where + " twin")
    final_dp = zbsvc.read_dumps(dump_dir, jid, ITERATIONS - 1)
    final_one = zbsvc.read_dumps(dump_dir, one, ITERATIONS - 1)
    worst = 0.0
    for s in final_one:
        assert final_dp[s]["tensors"] == final_one[s]["tensors"], (where, s)
        for name, a, b in tensor_slices(final_one[s]):
            e = rel_diff(final_dp[s]["after"][a:b], final_one[s]["after"][a:b])
            assert e <= FINAL_TOL, (where, s, name, e)
            worst = max(worst, e)
    return worst


def test_two_replicas_train_the_global_batch():
    with Cluster(workers=8, name="grads-dp") as c:
        dump_dir = os.path.join(c.dir, "dumps")
        worst = [run_dp(c, 2, "zb-h1", dump_dir), run_dp(c, 4, "1f1b", dump_dir)]
        print("d=2 jobs: gradcheck within %g, replicas bit-identical, final weights within %.2e of the d=1 twin "
              "(bound %g)" % (GRAD_TOL, max(worst), FINAL_TOL))


if __name__ == "__main__":
    zbsvc.run_tests(globals())
