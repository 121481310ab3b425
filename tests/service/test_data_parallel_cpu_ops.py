"""Data-parallel cpu jobs through operations (docs/operations.md): a cpu
job of data_parallel 2 x ranks 2 on four real workers, checkpointing into
one shared checkpoint_dir and dumping its weights (model.dump_dir).

- The coordinator SIGKILLed mid-run and started again on its data dir and
  port: all four ranks train on and are taken back, and the job ends with
  every loss of an uninterrupted run, bit for bit, and its final weights,
  replica 1's bit-identical to replica 0's. Only replica 0 writes
  checkpoints (one file per stage, named by its global ranks 0 and 1).
- A schedule update mid-run that moves stages (zb-h1, one stage per rank,
  to zb-v, two per rank on V placement: the workers restage their
  weights and optimizer state) keeps both replicas' weights bit-identical
  through the last step, and the job ends SUCCEEDED."""

import glob
import os
import shutil
import tempfile

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, zb_pb2

ITERATIONS = 60


def spec(name, ckdir, schedule="zb-h1"):
    model = zb_pb2.ModelSpec(hidden=16, heads=2, layers=4, seq_len=8, batch=2, seed=5, lr=1e-2,
                             checkpoint_every=2, checkpoint_dir=ckdir, dump_dir=os.path.join(ckdir, "dumps"),
                             dump_every=ITERATIONS)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=3, schedule=schedule, iterations=ITERATIONS,
                          backend="cpu", data_parallel=2, model=model)


def losses(c, jid):
    return {it.iteration: it.loss for it in iteration_events(c.events(jid)) if it.has_loss}


def replicas_identical(ckdir, jid):
    """Replica 1's weights before and after the last step equal replica 0's in every bit; replica 0's dumps."""
    dumps = os.path.join(ckdir, "dumps")
    r0 = zbsvc.read_dumps(dumps, jid, ITERATIONS - 1, replica=0)
    r1 = zbsvc.read_dumps(dumps, jid, ITERATIONS - 1, replica=1)
    differ = zbsvc.weights_differ(r0, r1)
    assert differ == [], "replicas' final weights differ on stages %s" % differ
    assert zbsvc.weights_differ(r0, r1, "before") == []
    return r0


def test_coordinator_restart_and_restage_with_two_replicas():
    ckdir = tempfile.mkdtemp(prefix="zb-dp-ops-")
    try:
        with Cluster(workers=4, name="dp-cpu-ops") as c:
            ref_spec = spec("reference", ckdir)
            ref_spec.trace_every = 15  # sampled timelines, so T_reduce is learned
            ref = c.submit(ref_spec)
            c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=240)
            # a model job's T_reduce comes from the model's bytes and the link: zbctl get says so
            got = c.zbctl("get", ref).stdout
            spec_row = [ln for ln in got.splitlines() if ln.strip().startswith("spec  (each stage)")]
            assert "T_reduce learned" in got and spec_row and spec_row[0].endswith("from the link"), got
            want = losses(c, ref)
            assert sorted(want) == list(range(ITERATIONS)), sorted(want)
            ref_final = replicas_identical(ckdir, ref)
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckdir, ref, "*.ckpt")))
            assert files == ["rank0-stage0.ckpt", "rank1-stage1.ckpt"], files  # replica 0's only
            c.wait_workers(4, idle=True, timeout=30)

            jid = c.submit(spec("coordinator-killed", ckdir))
            c.wait_iterations(jid, 4, timeout=120)
            port = c.port
            c.coordinator.kill()
            c.start_coordinator(port=port)
            assert c.get(jid).iterations_done < ITERATIONS, "the kill came too late"
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=240)
            got = losses(c, jid)
            print("coordinator killed mid-run: %s; losses of iterations %d..%d" % (job.reason, min(got), max(got)))
            assert sorted(got) == list(range(ITERATIONS)), sorted(got)
            assert [(i, got[i], want[i]) for i in got if got[i] != want[i]] == []  # bit for bit
            final = replicas_identical(ckdir, jid)
            assert zbsvc.weights_differ(final, ref_final) == [], "final weights differ from the reference's"
            c.wait_workers(4, idle=True, timeout=30)

            jid = c.submit(spec("restaged", ckdir))
            c.wait_iterations(jid, 2, timeout=120)
            at = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"),
                                       timeout=30).from_iteration
            assert at < ITERATIONS - 1, at
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=240)
            its = iteration_events(c.events(jid))
            assert [it.schedule for it in its] == ["zb-h1"] * at + ["zb-v"] * (ITERATIONS - at), \
                [it.schedule for it in its]
            final = replicas_identical(ckdir, jid)
            assert len(final) == 4, sorted(final)  # zb-v's four stages
            print("restaged at iteration %d: both replicas' %d stages agree in every bit" % (at, len(final)))
            c.assert_serving()
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
