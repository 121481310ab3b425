"""The optimizer step of cpu jobs: global gradient-norm clipping and the
NaN/Inf check, post-validated (each rank steps at once, the global check
follows, a failed check rolls back) or synchronous (check first). Real
processes, p = 4, zb-v, a tiny model, 10 iterations.

- inject_nan at iteration 3 (a testing aid: the last stage's loss gradient
  of one microbatch becomes NaN and flows through every B and W): that
  iteration is reported skipped by every rank, every other one is not; the
  losses up to and including iteration 3 equal a clean run's (a loss is
  computed before its step); after it, the post-validated run (stepped,
  then rolled back) traces the synchronous run (never stepped) bit for bit,
  so its weights are those of a run that skipped the step; and it differs
  from the clean run, so the step really was left out.
- clip_norm small enough that every step clips: post-validated and
  synchronous report the same gradient norms and losses, bit for bit
  (tolerance 0: a rollback restores every bit and the redone step is the
  synchronous one).
- The weights themselves, from the jobs' gradient dumps (model.dump_dir,
  train/zb_dump.h: every stage's parameters before and after each step):
  at the NaN iteration every stage of the post-validated run ends with the
  weights it started from, in every bit (the rollback is exact on every
  rank); the final weights of the post-validated and synchronous NaN runs
  are bit-identical (a run that skipped the step), and differ from the
  clean run's; under clipping the final weights of both step modes are
  bit-identical.
- zbctl watch says "skipped (non-finite)" and "clipped".
"""

import math
import os

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, zb_pb2

ITERATIONS = 10
RANKS = 4
M = 4
NAN_AT = 3


def spec(name, step, clip_norm, dump_dir, inject_nan=False):
    model = zb_pb2.ModelSpec(hidden=32, heads=2, layers=4, seq_len=16, batch=2, seed=5, lr=1e-2, step=step,
                             clip_norm=zb_pb2.DoubleValue(value=clip_norm), dump_dir=dump_dir)
    if inject_nan:
        model.inject_nan.CopyFrom(zb_pb2.NanInjection(iteration=NAN_AT, microbatch=1))
    return zb_pb2.JobSpec(name=name, ranks=RANKS, microbatches=M, schedule="zb-v", iterations=ITERATIONS,
                          backend="cpu", model=model)


def run(c, s):
    jid = c.submit(s)
    job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    assert job.iterations_done == ITERATIONS, job
    its = iteration_events(c.events(jid))[:ITERATIONS]
    assert [it.iteration for it in its] == list(range(ITERATIONS)), its
    for it in its:
        assert it.has_loss and it.has_grad_norm, it
        # every rank reduced the same values and decided alike
        assert len(it.ranks) == RANKS, it
        for r in it.ranks:
            assert r.has_grad_norm and (r.clipped, r.skipped) == (it.clipped, it.skipped), (it.iteration, r)
            assert r.grad_norm == it.grad_norm or (math.isnan(r.grad_norm) and math.isnan(it.grad_norm)), r
        c.wait_workers(RANKS)
    return jid, its


def test_nan_skips_and_clipping_agrees():
    with Cluster(workers=RANKS, name="train-step") as c:
        dumps = os.path.join(c.dir, "dumps")
        jid_clean, clean = run(c, spec("clean", "post-validated", 0, dumps))
        jid_pv, nan_pv = run(c, spec("nan-pv", "post-validated", 0, dumps, inject_nan=True))
        jid_sy, nan_sy = run(c, spec("nan-sync", "synchronous", 0, dumps, inject_nan=True))

        assert not any(it.skipped or it.clipped for it in clean), clean
        for its in (nan_pv, nan_sy):
            assert [it.skipped for it in its] == [i == NAN_AT for i in range(ITERATIONS)], its
            assert not math.isfinite(its[NAN_AT].grad_norm), its[NAN_AT]
            assert not any(it.clipped for it in its), its
        loss = lambda its: [it.loss for it in its]  # noqa: E731
        assert loss(nan_pv)[:NAN_AT + 1] == loss(clean)[:NAN_AT + 1], (loss(nan_pv), loss(clean))
        assert loss(nan_pv) == loss(nan_sy), (loss(nan_pv), loss(nan_sy))
        assert [it.grad_norm for it in nan_pv][NAN_AT + 1:] == [it.grad_norm for it in nan_sy][NAN_AT + 1:]
        assert loss(nan_pv)[NAN_AT + 1] != loss(clean)[NAN_AT + 1], "the NaN step was not left out"
        print("inject_nan at %d: post-validated == synchronous (skipped), losses %s" % (NAN_AT, loss(nan_pv)))

        # the weights: rolled back exactly on every rank, then those of the run that never stepped
        at_nan = zbsvc.read_dumps(dumps, jid_pv, NAN_AT)
        for stage, d in at_nan.items():
            assert d["flags"] & zbsvc.DUMP_SKIPPED, (stage, d["flags"])
            assert d["after"] == d["before"], "stage %d (rank %d): the rollback left other weights" % (
                stage, d["rank"])
        final = {j: zbsvc.read_dumps(dumps, j, ITERATIONS - 1) for j in (jid_clean, jid_pv, jid_sy)}
        assert zbsvc.weights_differ(final[jid_pv], final[jid_sy]) == [], "post-validated != synchronous"
        holding = sorted(st for st, d in at_nan.items() if d["tensors"])  # 4 layers over 8 stages: some hold none
        assert zbsvc.weights_differ(final[jid_pv], final[jid_clean]) == holding, "the NaN step left no trace"
        print("inject_nan: every stage's weights after the rolled-back step equal those before it; final weights "
              "equal the synchronous run's (%d stages)" % len(at_nan))

        # a clip norm far below the gradients' norm: every step clips
        jid_clip, clip_pv = run(c, spec("clip-pv", "post-validated", 0.05, dumps))
        jid_clip_sy, clip_sy = run(c, spec("clip-sync", "synchronous", 0.05, dumps))
        for its in (clip_pv, clip_sy):
            assert all(it.clipped and not it.skipped and it.grad_norm > 0.05 for it in its), its
        assert loss(clip_pv) == loss(clip_sy), (loss(clip_pv), loss(clip_sy))
        assert [it.grad_norm for it in clip_pv] == [it.grad_norm for it in clip_sy]
        assert loss(clip_pv) != loss(clean), "clipping changed nothing"
        print("clip_norm 0.05: post-validated == synchronous, grad norms %s" % [it.grad_norm for it in clip_pv])
        for i in range(ITERATIONS):
            a, b = (zbsvc.read_dumps(dumps, j, i) for j in (jid_clip, jid_clip_sy))
            assert zbsvc.weights_differ(a, b) == [], "clipping: weights differ after iteration %d" % i
            assert all(d["flags"] & zbsvc.DUMP_CLIPPED for d in a.values()), i
        print("clip_norm 0.05: the weights of both step modes agree in every bit after every iteration")

        cp = c.zbctl("watch", jid_pv)
        assert cp.returncode == 0, cp.stderr
        assert "skipped (non-finite)" in cp.stdout, cp.stdout
        cp = c.zbctl("watch", jid_clip)
        assert cp.returncode == 0, cp.stderr
        assert "clipped" in cp.stdout, cp.stdout
        cp = c.zbctl("get", jid_clip)
        assert "clip_norm 0.05, step post-validated" in cp.stdout, cp.stdout
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
