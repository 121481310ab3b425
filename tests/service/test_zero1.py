"""ZeRO-1 optimizer sharding of cpu jobs (`zero: 1`; docs/model.md, Data
parallelism: ZeRO-1), on real zb-worker processes over TCP.

- A job of data_parallel d = 2, ranks p = 2 and zero 1 trains ITERATIONS
  steps with dumps: zb-gradcheck passes (the dumps hold the whole reduced
  gradient, all-gathered from the shards on dump iterations), every
  replica's dumps (weights before and after, gradients) are bit-identical
  to replica 0's, and its final weights equal those of the same job with
  zero 0 bit for bit. Bound: exact. Both reduce the same shard sums in the
  same ring order, and the sharded AdamW is per element the whole one; only
  the global norm is summed in another order (shard by shard, then member
  by member), which moves nothing unless a step clips, so the spec's
  clip_norm (0) is off. test_grads_dp bounds zero 0 against d = 1.
- Each rank logs its optimizer state: with zero 1 it is half (1/d, the
  shards of odd-sized stages one float longer) of the zero 0 job's.
- Checkpoints: every replica writes its own shard file
  (rank<r>-stage<s>-shard<k>of<d>.ckpt); a zero 1 job cancelled mid-run and
  resumed ends with the final weights of an uninterrupted zero 1 run, in
  every bit.
"""

import glob
import os
import re
import tempfile

import zbsvc
from zbsvc import STATE, Cluster

GRAD_TOL = 1e-5  # zb-gradcheck's bound, as test_grads_dp's
ITERATIONS = 3
M = 3
P = 2
D = 2
GRADCHECK = os.environ["ZB_GRADCHECK_BIN"]
STATE_RE = r"job %s rank (\d+):.*optimizer state (\d+) bytes \(zero (\d), replica (\d+) of (\d+)\)"


def spec(name, zero, dump_dir, iterations=ITERATIONS, ckdir="", every=0, dump_every=0):
    model = zbsvc.zb_pb2.ModelSpec(hidden=16, heads=2, layers=6, seq_len=8, batch=2, seed=11, lr=1e-2,
                                   dump_dir=dump_dir, dump_every=dump_every, checkpoint_dir=ckdir,
                                   checkpoint_every=every, clip_norm=zbsvc.zb_pb2.DoubleValue(value=0))
    return zbsvc.zb_pb2.JobSpec(name=name, ranks=P, microbatches=M, schedule="zb-h1", iterations=iterations,
                                backend="cpu", data_parallel=D, zero=zero, model=model)


def optimizer_bytes(c, jid):
    """{(replica, pipeline rank): (bytes, zero)} from the workers' logs."""
    logs = "".join(w.log_text() for w in c.workers.values())
    out = {}
    for m in re.finditer(STATE_RE % jid, logs):
        out[(int(m.group(4)), int(m.group(1)))] = (int(m.group(2)), int(m.group(3)))
    assert len(out) == D * P, (jid, out)
    return out


def run(c, zero, dump_dir):
    jid = c.submit(spec("zero%d" % zero, zero, dump_dir))
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
    assert job.iterations_done == ITERATIONS, job
    c.wait_workers(len(c.workers))
    where = "zero %d" % zero
    results = zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, jid), jid, P, M, ITERATIONS, GRAD_TOL,
                                    where)
    for r in results:
        assert r["data_parallel"] == D and r["replicas_identical"] is True, (where, r)
    for it in range(ITERATIONS):
        r0 = zbsvc.read_dumps(dump_dir, jid, it, replica=0)
        r1 = zbsvc.read_dumps(dump_dir, jid, it, replica=1)
        for s in r0:
            for which in ("before", "grads", "after"):
                assert r0[s][which] == r1[s][which], (where, it, s, which)
            assert not r0[s]["flags"] & zbsvc.DUMP_CLIPPED, (where, it, s)  # clipping is off
    return jid


def test_zero1_trains_as_zero0():
    with Cluster(workers=D * P, name="zero1") as c:
        dump_dir = os.path.join(c.dir, "dumps")
        sharded = run(c, 1, dump_dir)
        whole = run(c, 0, dump_dir)
        differ = zbsvc.weights_differ(zbsvc.read_dumps(dump_dir, sharded, ITERATIONS - 1),
                                      zbsvc.read_dumps(dump_dir, whole, ITERATIONS - 1))
        assert not differ, "zero 1 and zero 0 final weights differ on stages %s" % differ
        b1, b0 = optimizer_bytes(c, sharded), optimizer_bytes(c, whole)
        for key, (n1, z1) in sorted(b1.items()):
            n0, z0 = b0[key]
            assert (z1, z0) == (1, 0), (key, z1, z0)
            # the shards of a stage's n parameters: n // d or n // d + 1 (m and v: 8 bytes each)
            assert abs(n1 - n0 // D) <= 8, (key, n1, n0)
        print("zero 1: final weights bit-identical to zero 0; optimizer state per rank %s bytes against %s" %
              ([b1[k][0] for k in sorted(b1)], [b0[k][0] for k in sorted(b0)]))


RESUME_ITERATIONS = 40


def test_zero1_cancel_resume_matches_uninterrupted():
    ckdir = tempfile.mkdtemp(prefix="zb-zero1-")
    dumps = os.path.join(ckdir, "dumps")
    with Cluster(workers=D * P, name="zero1-ckpt") as c:
        ref = c.submit(spec("reference", 1, dumps, RESUME_ITERATIONS, ckdir, 2, RESUME_ITERATIONS))
        c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        c.wait_workers(D * P)
        jid = c.submit(spec("interrupted", 1, dumps, RESUME_ITERATIONS, ckdir, 2, RESUME_ITERATIONS))
        c.wait_iterations(jid, 5)
        zbsvc.interrupt(c, jid, RESUME_ITERATIONS - 2)
        c.wait_workers(D * P)
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckdir, jid, "*.ckpt")))
        assert files == ["rank%d-stage%d-shard%dof%d.ckpt" % (r, r, k, D) for r in range(P) for k in range(D)], \
            files
        cp = c.zbctl("resume", jid)
        assert cp.returncode == 0, cp.stderr
        new = cp.stdout.strip()
        job = c.wait_state(new, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        assert job.iterations_done == RESUME_ITERATIONS, job
        a, b = (zbsvc.read_dumps(dumps, j, RESUME_ITERATIONS - 1, replica=k) for j, k in ((ref, 0), (new, 1)))
        differ = zbsvc.weights_differ(a, b)
        assert not differ, "resumed zero 1 job's final weights differ on stages %s" % differ
        print("zero 1: cancelled, resumed from per-replica shard checkpoints, final weights bit-identical")


if __name__ == "__main__":
    zbsvc.run_tests(globals())
