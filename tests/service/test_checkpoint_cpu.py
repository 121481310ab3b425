"""Checkpoints and resume of cpu jobs (model.checkpoint_every,
model.checkpoint_dir, zbctl resume; train/zb_checkpoint.h).

- A zb-v job on 2 workers (4 stages) with checkpoint_every 2 is frozen
  after a few iterations (SIGSTOP of rank 1's worker, so it cannot race to
  its end), cancelled, and let go: every rank writes one file per hosted
  stage, no temporary file is left, and `zbctl resume` runs a new job that
  starts right after the last iteration every rank holds and finishes the
  run. Its loss equals, bit for bit, an uninterrupted run of the same spec
  at every iteration it ran (the math is deterministic and the data depend
  only on the seed and the iteration), and so do its final weights: every
  stage's parameters after the last step, from the jobs' gradient dumps
  (model.dump_dir, train/zb_dump.h), agree in every bit.
- A worker SIGKILLed mid-run fails the job; once a worker with the same id
  is back, zbctl resume finishes it with the losses of the uninterrupted
  run and the same final weights. A coordinator SIGKILLed mid-run and
  started again on the same data dir and port needs no resume: the ranks
  train on, the job is taken back and ends with every loss and the final
  weights of the uninterrupted run.
- A damaged checkpoint file makes the resumed job fail with the file's path.
- checkpoint_every without an absolute checkpoint_dir is refused, naming
  the key; resuming a job without checkpoints or one still running is
  refused.
"""

import glob
import os
import shutil
import tempfile

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, rpc_error, zb_pb2

import grpc

ITERATIONS = 60
EVERY = 2


def spec(name, ckdir, every=EVERY):
    # dumps of iteration 0 and the last only: the final weights
    dump = os.path.join(ckdir, "dumps") if ckdir.startswith("/") else ""
    model = zb_pb2.ModelSpec(hidden=32, heads=2, layers=4, seq_len=32, batch=4, seed=7, lr=1e-2,
                             checkpoint_every=every, checkpoint_dir=ckdir, dump_dir=dump,
                             dump_every=ITERATIONS if dump else 0)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=4, schedule="zb-v", iterations=ITERATIONS,
                          backend="cpu", model=model)


def losses(c, jid):
    return {it.iteration: it.loss for it in iteration_events(c.events(jid)) if it.has_loss}


def same_final_weights(ckdir, ref, new):
    """The resumed job's weights after its last step are the uninterrupted
    run's, in every bit of every stage."""
    dumps = os.path.join(ckdir, "dumps")
    a, b = (zbsvc.read_dumps(dumps, j, ITERATIONS - 1) for j in (ref, new))
    differ = zbsvc.weights_differ(a, b)
    assert not differ, "final weights of %s and %s differ on stages %s" % (ref, new, differ)
    assert zbsvc.weights_differ(a, b, "before") == [], "weights before the last step differ"
    params = sum(len(d["after"]) // 4 for d in a.values())
    print("final weights of %s equal %s's: %d parameters over %d stages" % (new, ref, params, len(a)))


def test_cancel_resume_matches_uninterrupted():
    ckdir = tempfile.mkdtemp(prefix="zb-ckpt-")
    try:
        with Cluster(workers=2, name="ckpt-cpu") as c:
            ref = c.submit(spec("reference", ckdir))
            c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            want = losses(c, ref)
            assert sorted(want) == list(range(ITERATIONS)), sorted(want)
            c.wait_workers(2)

            jid = c.submit(spec("interrupted", ckdir))
            c.wait_iterations(jid, 5)
            done = zbsvc.interrupt(c, jid, ITERATIONS - 2)  # the cancel saves run after the release
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckdir, jid, "*.ckpt")))
            assert files == ["rank0-stage0.ckpt", "rank0-stage3.ckpt", "rank1-stage1.ckpt",
                             "rank1-stage2.ckpt"], files
            assert not glob.glob(os.path.join(ckdir, jid, "*tmp*")), os.listdir(os.path.join(ckdir, jid))

            # a job still running, or without checkpoints, cannot be resumed
            code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(resume_from_job_id="j-999"))
            assert code == grpc.StatusCode.NOT_FOUND, (code, details)
            cp = c.zbctl("resume", jid)
            assert cp.returncode == 0, cp.stderr
            new = cp.stdout.strip()
            job = c.wait_state(new, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            assert job.iterations_done == ITERATIONS, job
            got = losses(c, new)
            first = min(got)
            print("cancelled after %d iterations; resumed at iteration %d" % (done, first))
            assert 1 <= first <= done + 1, (first, done)  # ranks may be one iteration past the reports
            assert sorted(got) == list(range(first, ITERATIONS)), sorted(got)
            diff = [(i, got[i], want[i]) for i in got if got[i] != want[i]]
            assert not diff, diff  # bit for bit
            same_final_weights(ckdir, ref, new)
            cp = c.zbctl("get", new)
            assert cp.returncode == 0 and "%d/%d iterations" % (ITERATIONS, ITERATIONS) in cp.stdout, cp.stdout
            assert "checkpoint every 2 iterations" in cp.stdout and "resumed from %s" % jid in cp.stdout, cp.stdout
            c.wait_workers(2)

            # a damaged file is refused, named
            victim = os.path.join(ckdir, jid, "rank1-stage2.ckpt")
            with open(victim, "r+b") as f:
                f.seek(-40, os.SEEK_END)
                b = f.read(1)
                f.seek(-40, os.SEEK_END)
                f.write(bytes([b[0] ^ 0x10]))
            bad = c.zbctl("resume", jid).stdout.strip()
            job = c.wait_state(bad, STATE.JOB_STATE_FAILED, timeout=60)
            assert victim in job.reason and "corrupt" in job.reason, job.reason
            c.wait_workers(2)

            # the spec's rules
            s = spec("relative", "ckpt")
            code, details = rpc_error(c.submit, s)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "model.checkpoint_dir" in details, (code, details)
            s = spec("no-dir", "")
            code, details = rpc_error(c.submit, s)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "model.checkpoint_dir" in details, (code, details)
            plain = c.submit(spec("plain", "", every=0))
            c.wait_state(plain, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(resume_from_job_id=plain))
            assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
            s = spec("forged", ckdir)
            s.model.resume_from_job_id = jid
            code, details = rpc_error(c.submit, s)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "resume_from_job_id" in details, (code, details)
            c.assert_serving()
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)


def reference(c, ckdir):
    """The job id and losses of an uninterrupted run."""
    ref = c.submit(spec("reference", ckdir))
    c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    want = losses(c, ref)
    assert sorted(want) == list(range(ITERATIONS)), sorted(want)
    c.wait_workers(2)
    return ref, want


def resume_matches(c, ckdir, old, ref, want, label):
    """zbctl resume OLD finishes it with the losses (want) and the final
    weights of the uninterrupted job ref, bit for bit."""
    cp = c.zbctl("resume", old)
    assert cp.returncode == 0, cp.stderr
    new = cp.stdout.strip()
    job = c.wait_state(new, STATE.JOB_STATE_SUCCEEDED, timeout=120)
    assert job.iterations_done == ITERATIONS, job
    got = losses(c, new)
    first = min(got)
    print("%s: resumed at iteration %d" % (label, first))
    assert first >= 1, first
    assert sorted(got) == list(range(first, ITERATIONS)), sorted(got)
    diff = [(i, got[i], want[i]) for i in got if got[i] != want[i]]
    assert not diff, diff  # bit for bit
    same_final_weights(ckdir, ref, new)
    c.wait_workers(2)


def test_killed_worker_then_coordinator_restart():
    ckdir = tempfile.mkdtemp(prefix="zb-ckpt-kill-")
    try:
        with Cluster(workers=2, name="ckpt-kill") as c:
            ref, want = reference(c, ckdir)

            # a worker SIGKILLed mid-run; a supervisor brings it back under its id
            jid = c.submit(spec("worker-killed", ckdir))
            c.wait_iterations(jid, 5)
            wid = c.worker_of_rank(jid, 1)
            c.workers[wid].kill()
            job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=30)
            print("worker %s killed after %d iterations: %s" % (wid, job.iterations_done, job.reason))
            assert job.iterations_done < ITERATIONS - 2, job.iterations_done  # the kill came in time
            c.start_worker(wid)
            ws = c.wait_workers(2, timeout=20)
            assert sorted(w.id for w in ws) == ["w0", "w1"], ws
            resume_matches(c, ckdir, jid, ref, want, "after the worker kill")

            # the coordinator SIGKILLed mid-run, started again on its data dir
            # and port: the ranks kept training, the job is taken back and
            # ends with every loss and the final weights of the uninterrupted
            # run, bit for bit, and no resume
            jid = c.submit(spec("coordinator-killed", ckdir))
            c.wait_iterations(jid, 5)
            port = c.port
            c.coordinator.kill()
            c.start_coordinator(port=port)
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            got = losses(c, jid)
            print("coordinator killed mid-run: %s, %s; losses of iterations %d..%d" %
                  (zbsvc.state_name(job.state), job.reason, min(got), max(got)))
            assert sorted(got) == list(range(ITERATIONS)), sorted(got)
            assert [(i, got[i], want[i]) for i in got if got[i] != want[i]] == []
            same_final_weights(ckdir, ref, jid)
            c.wait_workers(2, timeout=30)
            c.assert_serving()
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)


if __name__ == "__main__":
    zbsvc.run_tests(globals())
