"""cpu jobs train the built-in model through the service (real processes,
real activations over TCP, AdamW on every rank after its W ops).

- p = 2 and p = 4, 1f1b and zb-v (with p = 4, zb-v's 8 stages split 4
  layers: half the stages are empty), tiny model, fixed seed: every job
  SUCCEEDS, every iteration carries the loss of the rank hosting the last
  stage (and only that rank's RankIteration has one), and the loss falls:
  the mean of the last 5 iterations is below FALL x the first iteration's.
- Given the same seed and data, 1f1b and zb-v trace the same loss curve:
  per iteration |loss_zbv - loss_1f1b| <= CURVE_TOL x loss_1f1b. The ops are
  deterministic; the schedules differ only in the order the microbatches'
  weight gradients are summed (fp32 rounding), which AdamW carries into the
  weights.
- A schedule update of a cpu job that keeps its chunks and placement
  (1f1b -> zb-h1) carries the weights and optimizer state over: the curve
  is 1f1b's. One that would move stages between ranks (-> zb-v) is refused.
- The same for a job with an architecture: a llama (the transformers
  fixture's config, seeded weights) on the bytes of a text switched from
  1f1b to zb-v traces the plain 1f1b curve, so the switch moved every
  tensor (Hugging Face names) and its AdamW moments. For a gpt2, whose
  tied head has two holders, such a switch is refused naming why (not
  built yet) and the job runs on; one that keeps the placement is taken.
- zbctl watch and get show the loss; get shows the model.
- Memory: a model past what the workers advertise is refused at
  submission; one admitted whose ranks still cannot fit (state plus live
  activations) fails naming the rank, the worker and both figures; a model
  too large for a worker advertising nothing fails as out of memory.
"""

import os
import re

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, rpc_error, zb_pb2

import grpc

ITERATIONS = 30
M = 4
FALL = 0.8  # last-5 mean loss < FALL x first loss
# Relative, per iteration: 1f1b vs zb-v vs a switched 1f1b. Every schedule
# here runs a stage's W ops in microbatch order, so the curves come out
# bit for bit equal (0 observed); the bound leaves room for a schedule
# that sums them in another order, and is tighter than issue 4's 1e-5.
CURVE_TOL = 1e-6


def cpu_spec(name, ranks, schedule, iterations=ITERATIONS):
    model = zb_pb2.ModelSpec(hidden=32, heads=2, layers=4, seq_len=32, batch=4, seed=7, lr=1e-2)
    return zb_pb2.JobSpec(name=name, ranks=ranks, microbatches=M, schedule=schedule, iterations=iterations,
                          backend="cpu", model=model)


def last_stage_rank(ranks, schedule):
    return 0 if schedule == "zb-v" else ranks - 1  # V placement ends on rank 0; loop on rank p-1


def curve(c, jid, ranks, schedules, n=ITERATIONS):
    """The loss of the job's first n iterations, checking who reported it
    (schedules: the family, or one per iteration)."""
    its = iteration_events(c.events(jid))[:n]
    assert [it.iteration for it in its] == list(range(n)), [it.iteration for it in its]
    losses = []
    for it in its:
        assert it.has_loss, it
        owner = last_stage_rank(ranks, schedules[it.iteration] if isinstance(schedules, list) else schedules)
        holders = [r.rank for r in it.ranks if r.has_loss]
        assert holders == [owner], (it.iteration, holders, owner)
        assert [r.loss for r in it.ranks if r.has_loss] == [it.loss], it
        losses.append(it.loss)
    return losses


def check_falls(label, losses):
    first, tail = losses[0], sum(losses[-5:]) / 5
    print("%-14s loss %.4f -> %.4f (last-5 mean; bound %.4f)" % (label, first, tail, FALL * first))
    assert 5.0 < first < 6.0, (label, first)  # about ln(256) = 5.55 from a fresh model
    assert tail < FALL * first, (label, losses)


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def run_pair(c, ranks):
    """1f1b and zb-v on the same model, seed and data; returns their curves."""
    jobs = {}
    for schedule in ("1f1b", "zb-v"):
        jid = c.submit(cpu_spec("train-%s-p%d" % (schedule, ranks), ranks, schedule))
        jobs[schedule] = jid
        if ranks * 2 > c.n_workers:  # both fit at once at p = 2 on 4 workers
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=90)
    curves = {}
    for schedule, jid in jobs.items():
        job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=90)
        assert job.iterations_done == ITERATIONS, job
        assert job.last.has_loss, job.last
        curves[schedule] = curve(c, jid, ranks, schedule)
        check_falls("%s p=%d" % (schedule, ranks), curves[schedule])
    rel = max_rel(curves["zb-v"], curves["1f1b"])
    print("p=%d: zb-v vs 1f1b, max relative loss difference %.3g (tolerance %g)" % (ranks, rel, CURVE_TOL))
    assert rel <= CURVE_TOL, (curves["1f1b"], curves["zb-v"])
    return curves, jobs


def test_train_p2_p4_1f1b_zbv_and_update():
    with Cluster(workers=4, name="train-cpu") as c:
        assert all(list(w.backends) == ["sim", "cpu"] for w in c.list_workers()), c.list_workers()
        curves2, jobs2 = run_pair(c, 2)
        run_pair(c, 4)

        # zbctl shows the loss and the model
        cp = c.zbctl("watch", jobs2["zb-v"])
        assert cp.returncode == 0, cp.stderr
        assert "loss %.4f" % curves2["zb-v"][-1] in cp.stdout, cp.stdout
        cp = c.zbctl("get", jobs2["1f1b"])
        assert cp.returncode == 0, cp.stderr
        assert "loss %.4f" % curves2["1f1b"][-1] in cp.stdout, cp.stdout
        assert "hidden 32, heads 2, layers 4, seq_len 32, batch 4, seed 7" in cp.stdout, cp.stdout
        assert "16384 bytes/activation" in cp.stdout, cp.stdout  # 4 x 32 x 32 x 4, derived

        # an update to another placement moves every stage's weights and
        # AdamW moments to its new rank at the switch (1f1b: stage r on rank
        # r; zb-v: stages r and 3-r). The job runs long enough that the
        # update always lands (data depend on the iteration only, so its
        # first ITERATIONS iterations are comparable), and is cancelled once
        # they are done. Any tensor or moment lost on the way shows in the
        # losses after the switch.
        c.wait_workers(4)
        jid = c.submit(cpu_spec("train-switch", 2, "1f1b", iterations=100000))
        c.wait_iterations(jid, 1)
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"), timeout=10)
        at = resp.from_iteration
        assert 1 <= at <= ITERATIONS - 5, at  # enough iterations on the new plan to compare
        c.wait_iterations(jid, ITERATIONS)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="compared"), timeout=10)
        schedules = ["1f1b"] * at + ["zb-v"] * (ITERATIONS - at)
        switched = curve(c, jid, 2, schedules)
        its = iteration_events(c.events(jid))[:ITERATIONS]
        assert [it.schedule for it in its] == schedules, [it.schedule for it in its]
        rel = max_rel(switched, curves2["1f1b"])
        print("1f1b -> zb-v at iteration %d vs 1f1b: max relative loss difference %.3g" % (at, rel))
        assert rel <= CURVE_TOL, (switched, curves2["1f1b"])
        c.wait_workers(4)


HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")


def llama_spec(name, schedule, iterations, arch="llama"):
    with open(os.path.join(HF, arch, "config.json")) as f:
        config = f.read()
    model = zb_pb2.ModelSpec(architecture=arch, config_json=config, data="/usr/share/common-licenses/GPL-3",
                             seq_len=16, batch=4, seed=7, lr=1e-2)
    return zb_pb2.JobSpec(name=name, ranks=2, microbatches=M, schedule=schedule, iterations=iterations,
                          backend="cpu", model=model)


def test_llama_switch_moves_its_tensors():
    """The switched job runs first, and the plain one as many iterations as
    it took past the switch, so where the switch lands does not matter."""
    after = 8  # iterations compared on the new plan
    with Cluster(workers=2, name="train-llama-switch") as c:
        jid = c.submit(llama_spec("llama-switch", "1f1b", 100000))
        c.wait_iterations(jid, 1)
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"), timeout=10)
        at = resp.from_iteration
        n = at + after
        c.wait_iterations(jid, n)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="compared"), timeout=10)
        switched = curve(c, jid, 2, ["1f1b"] * at + ["zb-v"] * after, n)
        c.wait_workers(2)
        ref = c.submit(llama_spec("llama-1f1b", "1f1b", n))
        c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        plain = curve(c, ref, 2, "1f1b", n)
        assert abs(plain[0] - 6.24) < 0.5, plain  # seeded weights: about ln(512), uniform over the vocabulary
        rel = max_rel(switched, plain)
        print("llama 1f1b -> zb-v at iteration %d vs 1f1b: loss %.4f -> %.4f, max relative difference %.3g" %
              (at, plain[0], plain[-1], rel))
        assert plain[-1] < plain[0], plain
        assert rel <= CURVE_TOL, (switched, plain)

        # a tied head over several stages (gpt2) cannot move yet: the
        # update is refused naming that, and the job runs on with its plan
        c.wait_workers(2)
        jid = c.submit(llama_spec("gpt2-switch", "1f1b", 100000, arch="gpt2"))
        c.wait_iterations(jid, 1)
        code, details = rpc_error(c.stub.UpdateSchedule, zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"),
                                  timeout=30)
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        assert "ties its head to its embedding" in details and "zb-v" in details, details
        done = c.get(jid).iterations_done
        c.wait_iterations(jid, done + 2)
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        # a schedule with the same placement is taken
        c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-h1"), timeout=30)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.wait_state(jid, STATE.JOB_STATE_CANCELLED, timeout=60)
        print("gpt2 1f1b -> zb-v refused: %s" % details[:140])


def test_bad_cpu_jobs_are_refused():
    with Cluster(workers=2, name="train-bad") as c:
        spec = cpu_spec("bad", 2, "1f1b")
        spec.bytes_per_activation = 65536
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "bytes_per_activation" in details and "65536" in details and "16384" in details, details
        spec = cpu_spec("bad", 2, "1f1b")
        spec.model.heads = 3
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "model.heads" in details, (code, details)
        spec = cpu_spec("bad", 2, "1f1b")
        spec.model.hidden = spec.model.seq_len = spec.model.batch = 2**31 - 1  # no overflow on the way
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "model.hidden" in details, (code, details)
        spec = zbsvc.job_spec(name="sim-with-model", ranks=2, microbatches=4)
        spec.model.hidden = 32
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "only a cpu or cuda job" in details, (code, details)

        # only the rank of the last stage reports a loss (1f1b, p = 2: rank 1)
        jid = c.submit(cpu_spec("long", 2, "1f1b", iterations=100000))
        c.wait_iterations(jid, 1)
        ahead = c.get(jid).iterations_done + 4  # an iteration no rank has reached
        metrics = zb_pb2.RankIteration(rank=0, wall_seconds=1, loss=2.5, has_loss=True)
        code, details = rpc_error(c.stub.Report, zb_pb2.ReportRequest(worker_id=c.worker_of_rank(jid, 0), job_id=jid,
                                                                      rank=0, iteration=ahead, metrics=metrics))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "metrics.has_loss" in details, (code, details)
        assert "another rank" in details, details
        assert c.get(jid).state == STATE.JOB_STATE_RUNNING
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid), timeout=10)
        c.wait_workers(2)

        # a data file the workers cannot read fails the job with the path
        spec = cpu_spec("no-data", 2, "1f1b", iterations=2)
        spec.model.data = "/nonexistent/corpus.txt"
        jid = c.submit(spec)
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=30)
        assert "/nonexistent/corpus.txt" in job.reason, job.reason
        c.wait_workers(2)
        c.assert_serving()


def test_model_too_large_fails_the_job_not_the_worker():
    """model.hidden 65536 passes the spec's checks but needs about 800 GB of
    weights and optimizer state: on a worker that advertises no memory (so
    the coordinator cannot refuse it) the rank fails its job saying it is
    out of memory, and the worker stays attached and runs the next job (it
    once aborted)."""
    with Cluster(workers=1, name="train-huge", worker_args=lambda k: ["--memory-bytes", "0"]) as c:
        spec = cpu_spec("huge", 1, "1f1b", iterations=1)
        spec.model.hidden = 65536
        spec.model.heads = 4
        spec.model.layers = 1
        spec.model.seq_len = 8
        spec.model.batch = 1
        jid = c.submit(spec)
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=120)
        assert "out of memory" in job.reason, job.reason
        c.wait_workers(1)
        ok = c.submit(cpu_spec("after", 1, "1f1b", iterations=2))
        c.wait_state(ok, STATE.JOB_STATE_SUCCEEDED, timeout=60)


def test_model_that_cannot_fit_is_refused_at_submission():
    """Workers advertise their memory; a model whose parameters, gradients
    and AdamW moments alone exceed it on a rank is refused before anything
    is planned or started, naming both figures; one that fits runs."""
    small = 64 << 20
    with Cluster(workers=2, name="train-fit", worker_args=lambda k: ["--memory-bytes", str(small)]) as c:
        assert all(w.memory_bytes == small for w in c.list_workers()), c.list_workers()
        spec = cpu_spec("big", 2, "1f1b", iterations=1)
        spec.model.hidden = 512  # 25 M parameters: 200 MB per rank over 2
        spec.model.heads = 8
        spec.model.layers = 8
        code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=30)
        print("refused: %s %s" % (code.name, details))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert "spec.model" in details and "0.0625 GiB" in details and "0 of the 2 workers" in details, details
        assert c.list_jobs() == []
        ok = c.submit(cpu_spec("fits", 2, "1f1b", iterations=2))
        c.wait_state(ok, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        c.start_worker("probed")  # no flag: what the host has available
        c.wait_workers(3)
        probed = [w for w in c.list_workers() if w.id == "probed"][0]
        print("a worker without --memory-bytes advertises %.1f GiB" % (probed.memory_bytes / 2**30))
        assert probed.memory_bytes > small, probed
        c.assert_serving()


def test_rank_that_cannot_fit_fails_naming_both_figures():
    """Issue 28, item 5: a model job whose ranks need more than the workers
    advertise once the activations its plan keeps live are counted (64 MiB
    each here; its state alone fits) is refused at submission, naming the
    rank, the plan and both figures; a job that reaches a worker anyway (a
    sim job, whose buffers the coordinator does not count) fails before any
    rank allocates, saying which rank on which worker needs how many bytes
    and how many it has. The workers stay attached and run a job that
    fits."""
    small = 64 << 20
    with Cluster(workers=2, name="train-admit", worker_args=lambda k: ["--memory-bytes", str(small)]) as c:
        spec = cpu_spec("wide", 2, "1f1b", iterations=1)
        spec.model.hidden = 256  # 1.8 M parameters: 14 MB of state per rank
        spec.model.heads = 4
        spec.model.layers = 2
        spec.model.seq_len = 256
        spec.model.batch = 256  # one activation: 64 MiB
        code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=30)
        print("cpu: refused: %s %s" % (code.name, details))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert re.search(r"rank \d of its 1f1b plan needs [0-9.]+ GiB", details), details
        assert "0 of the 2 workers" in details and "0.0625 GiB" in details, details
        assert c.list_jobs() == []
        sim = zbsvc.job_spec("buffers", ranks=2, microbatches=4, bytes_per_activation=1 << 30)
        for what, job_spec in (("sim", sim),):
            jid = c.submit(job_spec)
            job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=60)
            print("%s: %s" % (what, job.reason))
            assert re.search(r"rank \d on worker w\d needs \d+ bytes, it has %d \(the host memory" % small,
                             job.reason), job.reason
            assert "bytes_per_activation" in job.reason, job.reason
            c.wait_workers(2)
        ok = c.submit(cpu_spec("fits", 2, "1f1b", iterations=2))
        c.wait_state(ok, STATE.JOB_STATE_SUCCEEDED, timeout=60)
        c.assert_serving()


def own_memory_cgroup(limit):
    """A fresh cgroup under this process's own memory cgroup (v2 when the
    memory controller is there, else v1) limited to limit bytes: (path of
    its cgroup.procs, cleanup), or None where none can be made (not root,
    a read-only cgroupfs)."""
    import uuid
    mounts = [ln.split() for ln in open("/proc/self/mountinfo")]
    cgroups = [ln.rstrip("\n").split(":", 2) for ln in open("/proc/self/cgroup")]
    for v2 in (True, False):
        mount = next((m[4] for m in mounts if (m[m.index("-") + 1] == "cgroup2") == v2 and
                      m[m.index("-") + 1].startswith("cgroup") and
                      (v2 or "memory" in m[m.index("-") + 3].split(","))), None)
        path = next((c[2] for c in cgroups if (c[1] == "" if v2 else "memory" in c[1].split(","))), None)
        if not mount or path is None:
            continue
        d = os.path.join(mount + path, "zbtest-" + uuid.uuid4().hex[:8])
        try:
            os.mkdir(d)
            with open(os.path.join(d, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit))
            return os.path.join(d, "cgroup.procs"), lambda d=d: os.rmdir(d)
        except OSError:
            try:
                os.rmdir(d)
            except OSError:
                pass
    return None


def test_worker_advertises_its_own_cgroups_limit():
    """A worker in a 2 GiB memory cgroup (its own, not the root's)
    advertises at most 2 GiB, so a job that cannot fit it is refused
    naming both figures."""
    two = 2 << 30
    made = own_memory_cgroup(two)
    if made is None:
        print("SKIP: cannot make a memory cgroup here (needs root and a writable cgroupfs)")
        return
    procs, cleanup = made
    try:
        with Cluster(workers=0, name="train-cgroup") as c:
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, zbsvc.WORKER, "--coordinator", c.address,
                    "--id", "boxed", "--heartbeat-ms", "200"]
            p = zbsvc.Proc("worker-boxed", argv, c.dir)
            c.workers["boxed"] = p
            c.procs.append(p)
            c.wait_workers(1)
            boxed = c.list_workers()[0]
            print("a worker in a 2 GiB cgroup advertises %.2f GiB" % (boxed.memory_bytes / 2**30))
            assert 0 < boxed.memory_bytes <= two, boxed
            spec = cpu_spec("big", 1, "1f1b", iterations=1)
            spec.model.hidden = 2048  # 400 M parameters: far past 2 GiB with gradients and moments
            spec.model.heads = 16
            spec.model.layers = 8
            code, details = rpc_error(c.stub.SubmitJob, zb_pb2.SubmitJobRequest(spec=spec), timeout=30)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "spec.model" in details, (code, details)
            c.assert_serving()
    finally:
        cleanup()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
