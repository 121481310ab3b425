"""The GPU path through the service, on the CPU stand-in of CUDA, cuBLAS
and NCCL (and, with ZB_CUDA_REAL=1, the same suite on real GPUs) (docs/model.md, The CPU stand-in): real zb-coordinator and four
real worker processes built from zb-worker's own sources but linked against
the stand-in (zb-worker-standin, test-only), each running backend cuda
(model/device_cuda.c over the stand-in's cudart and cuBLAS, the CUDA
kernels' host versions) and transport nccl (worker/transport_nccl.c over the
stand-in's NCCL, which carries tensors between the processes over sockets;
rank 0's ncclUniqueId comes from the real libnccl and travels through the
coordinator).

- zbctl workers shows each worker's GPU, and says "stand-in";
- every family at (p, m) = (2, 3) and (4, 8): the pipelined gradients equal
  the unpipelined cpu model's within 1e-5 (zb-gradcheck on the ranks' dumps);
- the peak memory each rank's device allocator measured is within 10% of
  the plan's accounting (the model's per-stage bytes summed in the rank's
  list order);
- each rank's GPU figures reach the metrics: the allocator's high-water mark
  above the states' peak by at least the cuBLAS workspace, and no more than
  the device's used bytes;
- a worker advertises its GPU's free memory and admits a rank only if it fits
  with the cuBLAS workspace;
- a worker killed mid-job fails the job naming its rank within the
  heartbeat timeout;
- checkpoints of a cuda job, whose optimizer steps on the device (its
  moments live there): cancelled mid-run, `zbctl resume` finishes it with
  the losses of an uninterrupted run and its final weights, bit for bit.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zbsvc
from zbsvc import SLOW, STATE, zb_pb2

# ZB_CUDA_REAL=1 runs the same suite with the product zb-worker on real
# GPUs (ctest label gpu): one worker per GPU (--gpu k), shapes up to the
# number of GPUs (NCCL refuses two ranks on one device). On a machine with
# one GPU every worker shares it (--gpu 0) and jobs use transport tcp
# (host staging), so the cuda backend still runs whole pipelines; the nccl
# transport then goes unexercised (the run says so). No GPU is a skip (77).
REAL = os.environ.get("ZB_CUDA_REAL") == "1"


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    cp = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in cp.stdout.splitlines()) if cp.returncode == 0 else 0


N_GPUS = gpu_count() if REAL else 0
if REAL and N_GPUS < 1:
    print("test_cuda_standin on real GPUs: no GPU here; skipped")
    sys.exit(77)
SHARED_GPU = REAL and N_GPUS == 1
TRANSPORT = "tcp" if SHARED_GPU else "nccl"
if SHARED_GPU:
    print("one GPU: every worker runs on GPU 0 and jobs use transport tcp; the nccl transport is not exercised")


def Cluster(workers=4, **kw):
    """A zbsvc.Cluster; on real GPUs no more workers than GPUs, each on its
    own, or all on the one GPU there is."""
    if REAL and not SHARED_GPU:
        workers = min(workers, N_GPUS)
        kw["worker_args"] = lambda k: ["--gpu", str(k)]
    return zbsvc.Cluster(workers=workers, **kw)


def ranks_fit(p):
    return not REAL or SHARED_GPU or p <= N_GPUS

GRAD_TOL = 1e-5
FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zb-v", "v-half", "v-min"]
SHAPES = [(2, 3), (4, 8)]
ITERATIONS = 2
GRADCHECK = os.environ["ZB_GRADCHECK_BIN"]
HEARTBEAT_TIMEOUT_MS = 3000
SLACK_S = 4.0




def microbatches(family, p, m):
    return -(-m // p) * p if family == "interleaved-1f1b" else m


def model(dump_dir=""):
    return zb_pb2.ModelSpec(hidden=16, heads=2, layers=6, seq_len=8, batch=2, seed=11, lr=1e-2,
                            dump_dir=dump_dir)


def spec(family, p, m, dump_dir, iterations=ITERATIONS):
    return zb_pb2.JobSpec(name="cuda-%s-p%d-m%d" % (family, p, m), ranks=p, microbatches=m, schedule=family,
                          iterations=iterations, backend="cuda", transport=TRANSPORT, model=model(dump_dir))


def test_workers_show_the_stand_in_gpu():
    with Cluster(workers=2, name="cuda-workers") as c:
        ws = c.list_workers()
        assert len(ws) == 2, ws
        for w in ws:
            assert ("stand-in" not in w.gpu and w.gpu) if REAL else "stand-in" in w.gpu, w
            assert "cuda" in list(w.backends) and "nccl" in list(w.transports), w
        out = c.zbctl("workers")
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("stand-in") == (0 if REAL else 2), out.stdout


def test_every_family_matches_the_unpipelined_model():
    table = []
    with Cluster(workers=4, name="cuda-grads") as c:
        dump_dir = os.path.join(c.dir, "dumps")
        for family in FAMILIES:
            for p, m0 in [sh for sh in SHAPES if ranks_fit(sh[0])]:
                m = microbatches(family, p, m0)
                jid = c.submit(spec(family, p, m, dump_dir))
                job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
                assert job.iterations_done == ITERATIONS, job
                where = "%s p=%d m=%d (job %s)" % (family, p, m, jid)
                stages = zbsvc.job_stages(family, p, dump_dir, jid)
                results = zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, jid), jid, stages,
                                                m, ITERATIONS, GRAD_TOL, where)
                table.append((family, p, m, max(r["max_rel_err"] for r in results),
                              max(r["loss_rel_err"] for r in results)))
    print("gradient check, backend cuda + transport %s on %s (worst over %d iterations):"
          % (TRANSPORT, "the GPU" if REAL else "the stand-in", ITERATIONS))
    print("%-17s %3s %3s %12s %12s" % ("family", "p", "m", "grad rel err", "loss rel err"))
    for row in table:
        print("%-17s %3d %3d %12.3g %12.3g" % row)


def test_tcp_transport_stages_through_the_host():
    """backend cuda with transport tcp: messages are staged through host
    memory, and the gradients are as exact as over nccl."""
    p = 4 if ranks_fit(4) else 2
    with Cluster(workers=p, name="cuda-tcp") as c:
        dump_dir = os.path.join(c.dir, "dumps")
        for family in ("1f1b", "zb-v", "interleaved-1f1b"):
            js = spec(family, p, 8, dump_dir)
            js.transport = "tcp"
            jid = c.submit(js)
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
            zbsvc.check_gradcheck(GRADCHECK, os.path.join(dump_dir, jid), jid, p * zbsvc.family_chunks(family), 8,
                                  ITERATIONS, GRAD_TOL, "%s over tcp (job %s)" % (family, jid))


def test_precision_reaches_the_gemms():
    """precision bf16 and tf32 make cuBLAS round the products' inputs (the
    stand-in rounds as the tensor cores would), so their losses move away
    from fp32's by about the rounding, while fp32 stays exact. On a real
    GPU the fast compute types permit the rounding but do not force it:
    cuBLAS may run products this small without tensor cores (an H200 did:
    both losses within 1.2e-6 of fp32's), so there only the bounds hold."""
    losses = {}
    with Cluster(workers=2, name="cuda-precision") as c:
        for precision in ("fp32", "tf32", "bf16"):
            js = spec("1f1b", 2, 4, "", iterations=3)
            js.precision = precision
            jid = c.submit(js)
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            assert job.last.has_loss, job
            losses[precision] = job.last.loss
    rel = {p: abs(losses[p] - losses["fp32"]) / abs(losses["fp32"]) for p in ("tf32", "bf16")}
    print("loss after 3 iterations: %s; relative to fp32: %s" % (losses, rel))
    assert rel["tf32"] < 1e-2 and rel["bf16"] < 5e-2, rel
    if not REAL:
        assert 0 < rel["tf32"] and rel["bf16"] > rel["tf32"], rel


# ---- memory: the allocator's peak against the plan's accounting ----

MEM_MODEL = dict(hidden=32, heads=2, layers=8, seq_len=16, batch=2, seed=5)
VOCAB = 256


def stage_deltas(stage, stages):
    """Bytes one microbatch's state of `stage` holds after F, and the change
    B makes, from the model's layout (docs/model.md, F, B, W): per block F
    keeps xhat1, rstd1, qkv, att, o, xhat2, rstd2, u, gel; B drops rstd1,
    att, rstd2 and adds da1, dproj, da2, dfc2 (dqkv and dfc1 reuse qkv and
    u). The first stage adds the tokens (F; int32 ids, 4 bytes each) and
    the embedding sum's gradient (B); the last the final LayerNorm, the
    probabilities and the targets (F; int32 too) and the LayerNorm's input
    gradient less its rstd (B). W frees everything."""
    h, t, b, heads = MEM_MODEL["hidden"], MEM_MODEL["seq_len"], MEM_MODEL["batch"], MEM_MODEL["heads"]
    n, L = b * t, MEM_MODEL["layers"]
    blocks = (stage + 1) * L // stages - stage * L // stages
    att = b * heads * t * t
    f = blocks * 4 * (14 * n * h + 2 * n + att)
    d = blocks * 4 * (4 * n * h - 2 * n - att)
    if stage == 0:
        f += 4 * n
        d += 4 * n * h
    if stage == stages - 1:
        f += 4 * (n * h + n + n * VOCAB) + 4 * n
        d += 4 * (n * h - n)
    return f, d


def planned_peak(actions, stages):
    """The plan's accounting in bytes: the running sum of the compute ops'
    deltas in the rank's list order, and its maximum. A fused BW is B then
    W, so it holds B's state for a moment."""
    held = peak = 0
    F, B, W, BW = (zb_pb2.ACTION_KIND_F, zb_pb2.ACTION_KIND_B, zb_pb2.ACTION_KIND_W, zb_pb2.ACTION_KIND_BW)
    for kind, stage in zip(actions.kind, actions.stage):
        if kind not in (F, B, W, BW):
            continue
        f, d = stage_deltas(stage, stages)
        for delta in {F: [f], B: [d], W: [-(f + d)], BW: [d, -(f + d)]}[kind]:
            held += delta
            peak = max(peak, held)
    return peak


def test_peak_memory_follows_the_plan():
    rows = []
    p, m = (4, 8) if ranks_fit(4) else (2, 4)
    with Cluster(workers=p, name="cuda-mem") as c:
        for family in ("1f1b", "zb-h1", "zb-h2", "zb-v", "v-half"):
            js = zb_pb2.JobSpec(name="mem-" + family, ranks=p, microbatches=m, schedule=family, iterations=2,
                                backend="cuda", transport=TRANSPORT, model=zb_pb2.ModelSpec(**MEM_MODEL))
            plan = c.stub.Plan(zb_pb2.PlanRequest(spec=js, with_action_lists=True), timeout=30 * SLOW)
            stages = p * zbsvc.family_chunks(family)
            jid = c.submit(js)
            c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=180)
            its = zbsvc.iteration_events(c.events(jid))
            assert len(its) == 2, its
            for it in its:  # iteration 0 too, whose slots are allocated as it runs
                measured = {r.rank: r.peak_memory_bytes for r in it.ranks}
                for rank in range(p):
                    want = planned_peak(plan.action_lists[rank], stages)
                    got = measured[rank]
                    if it is its[-1]:
                        rows.append((family, rank, got, want, got / want))
                    assert abs(got - want) <= 0.10 * want, (family, it.iteration, rank, got, want)
    print("peak memory per rank, the cuda device's allocator against the plan's accounting (bytes):")
    print("%-8s %4s %10s %10s %6s" % ("family", "rank", "measured", "planned", "ratio"))
    for row in rows:
        print("%-8s %4d %10d %10d %6.3f" % row)


WORKSPACE = 32 << 20  # cuBLAS's workspace on cc 9.x (the stand-in's), a block of the device's allocator


def test_device_figures_reach_the_metrics():
    """Each rank's GPU figures (docs/model.md, Memory accounting): the
    allocator's high-water mark holds the workspace on top of the states'
    peak, and the device's used bytes sampled beside it hold at least that."""
    with Cluster(workers=2, name="cuda-devmem") as c:
        js = zb_pb2.JobSpec(name="devmem", ranks=2, microbatches=4, schedule="1f1b", iterations=10000,
                            backend="cuda", transport=TRANSPORT, model=zb_pb2.ModelSpec(**MEM_MODEL))
        jid = c.submit(js)
        c.wait_iterations(jid, 2, timeout=180)
        _, _, body = c.metrics()
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="measured"), timeout=10 * SLOW)
        assert "# HELP zb_rank_device_peak_bytes" in body and "# HELP zb_rank_device_used_bytes" in body
        m = zbsvc.parse_metrics(body)
        peak = {dict(lab)["rank"]: v for lab, v in zbsvc.series(m, "zb_rank_device_peak_bytes", job_id=jid).items()}
        used = {dict(lab)["rank"]: v for lab, v in zbsvc.series(m, "zb_rank_device_used_bytes", job_id=jid).items()}
        states = {dict(lab)["rank"]: v for lab, v in zbsvc.series(m, "zb_rank_peak_memory_bytes", job_id=jid).items()}
        assert sorted(peak) == sorted(used) == sorted(states) == ["0", "1"], (peak, used, states)
        for r in peak:
            print("rank %s: states' peak %d, device peak %d, device used %d" % (r, states[r], peak[r], used[r]))
            assert peak[r] >= states[r] + (0 if REAL else WORKSPACE), (r, peak[r], states[r])
            assert states[r] < peak[r] <= used[r], (r, states[r], peak[r], used[r])
        c.wait_workers(2)


def test_admission_counts_free_memory_and_the_workspace():
    """A worker advertises its GPU's free memory at start, not the total,
    and admits a cuda rank only if the model and its activations fit with
    the cuBLAS workspace and the allocator's rounding (docs/operations.md,
    Admission): with 16 MiB free of the stand-in's 16 GiB (other processes
    hold the rest: ZB_STANDIN_OTHER_BYTES), a small model fits the total and
    the free bytes but not the free bytes with the 32 MiB workspace."""
    if REAL:
        print("real GPUs: the free memory cannot be set; skipped")
        return
    free = 16 << 20
    os.environ["ZB_STANDIN_OTHER_BYTES"] = str((16 << 30) - free)  # read by the workers started here
    try:
        with Cluster(workers=2, name="cuda-admit") as c:
            os.environ.pop("ZB_STANDIN_OTHER_BYTES")
            refused_for_the_workspace(c, free)
    finally:
        os.environ.pop("ZB_STANDIN_OTHER_BYTES", None)


def refused_for_the_workspace(c, free):
    jid = c.submit(spec("1f1b", 2, 4, ""))
    job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=60)
    print("refused: %s" % job.reason)
    assert "it has %d (the GPU's free memory it advertised)" % free in job.reason, job.reason
    assert "cuBLAS workspace %d" % WORKSPACE in job.reason, job.reason
    need = int(job.reason.split(" needs ")[1].split(" bytes")[0])
    assert need - WORKSPACE < free < need, (need, free)  # the workspace is what does not fit
    c.wait_workers(2)


def test_killed_worker_fails_the_job_naming_its_rank():
    p = 4 if ranks_fit(4) else 2
    with Cluster(workers=p, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, name="cuda-kill") as c:
        jid = c.submit(spec("zb-h1", p, 8, "", iterations=100000))
        c.wait_iterations(jid, 1, timeout=120)
        victim = p // 2
        wid = c.worker_of_rank(jid, victim)
        t0 = time.monotonic()
        c.workers[wid].kill()
        limit = HEARTBEAT_TIMEOUT_MS / 1000 + SLACK_S
        job = c.wait_state(jid, STATE.JOB_STATE_FAILED, timeout=limit * SLOW)
        elapsed = time.monotonic() - t0
        assert elapsed < limit * SLOW, elapsed
        assert job.reason.startswith("rank %d " % victim), job.reason
        print("FAILED after %.2f s: %s" % (elapsed, job.reason))
        c.assert_serving()


CKPT_ITERATIONS = 16


def ckpt_spec(name, ckdir):
    """A cuda job that checkpoints every 2 iterations and dumps its first
    and last iteration (the final weights)."""
    js = spec("zb-v", 2, 4, os.path.join(ckdir, "dumps"), iterations=CKPT_ITERATIONS)
    js.name = name
    js.model.checkpoint_every = 2
    js.model.checkpoint_dir = ckdir
    js.model.dump_every = CKPT_ITERATIONS
    return js


def test_checkpoint_resume_matches_uninterrupted():
    """The device step's moments and step count go to the checkpoint and
    come back on resume: without them the resumed losses would differ."""
    ckdir = tempfile.mkdtemp(prefix="zb-ckpt-cuda-")
    try:
        with Cluster(workers=2, name="cuda-ckpt") as c:
            ref = c.submit(ckpt_spec("reference", ckdir))
            c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=180)
            want = {it.iteration: it.loss for it in zbsvc.iteration_events(c.events(ref)) if it.has_loss}
            assert sorted(want) == list(range(CKPT_ITERATIONS)), sorted(want)
            c.wait_workers(2)

            jid = c.submit(ckpt_spec("interrupted", ckdir))
            c.wait_iterations(jid, 4, timeout=120)
            done = zbsvc.interrupt(c, jid, CKPT_ITERATIONS - 2)
            files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckdir, jid, "*.ckpt")))
            assert files == ["rank0-stage0.ckpt", "rank0-stage3.ckpt", "rank1-stage1.ckpt",
                             "rank1-stage2.ckpt"], files
            cp = c.zbctl("resume", jid)
            assert cp.returncode == 0, cp.stderr
            new = cp.stdout.strip()
            job = c.wait_state(new, STATE.JOB_STATE_SUCCEEDED, timeout=180)
            assert job.iterations_done == CKPT_ITERATIONS, job
            got = {it.iteration: it.loss for it in zbsvc.iteration_events(c.events(new)) if it.has_loss}
            first = min(got)
            print("cuda job cancelled after %d iterations; resumed at iteration %d" % (done, first))
            assert 1 <= first <= done + 1, (first, done)
            assert sorted(got) == list(range(first, CKPT_ITERATIONS)), sorted(got)
            diff = [(i, got[i], want[i]) for i in got if got[i] != want[i]]
            assert not diff, diff  # bit for bit
            dumps = os.path.join(ckdir, "dumps")
            a, b = (zbsvc.read_dumps(dumps, j, CKPT_ITERATIONS - 1) for j in (ref, new))
            assert zbsvc.weights_differ(a, b) == [], "final weights differ"
            assert zbsvc.weights_differ(a, b, "before") == [], "weights before the last step differ"
            c.assert_serving()
    finally:
        shutil.rmtree(ckdir, ignore_errors=True)


SWITCH_AFTER = 4  # iterations compared after the switch lands
# 1f1b and zb-v sum each stage's W ops in microbatch order, so a switch
# that moves every tensor and moment intact keeps the curve bit for bit on
# the stand-in; on a GPU cuBLAS may pick other kernels for the new layout,
# so a rounding's worth is allowed. A lost moment moves it by about 1e-3.
SWITCH_TOL = 1e-5


def losses_of(c, jid, n):
    its = zbsvc.iteration_events(c.events(jid))[:n]
    assert [it.iteration for it in its] == list(range(n)), [it.iteration for it in its]
    assert all(it.has_loss for it in its), its
    return [it.loss for it in its], [it.schedule for it in its]


def test_switch_moves_stages_between_devices():
    """An update from 1f1b to zb-v moves stages between ranks: each tensor,
    with its AdamW moments, leaves one rank's device and lands on
    another's; the losses after the switch equal a plain 1f1b run's. The
    switch lands where the coordinator says (from_iteration), however
    fast the job runs: the comparison follows it, and the plain run is as
    long as the switched one went."""
    with Cluster(workers=2, name="cuda-switch") as c:
        jid = c.submit(spec("1f1b", 2, 4, "", iterations=100000))
        c.wait_iterations(jid, 1, timeout=120)
        resp = c.stub.UpdateSchedule(zb_pb2.UpdateScheduleRequest(job_id=jid, schedule="zb-v"), timeout=10 * SLOW)
        at = resp.from_iteration
        assert at >= 1, at
        n = at + SWITCH_AFTER
        c.wait_iterations(jid, n, timeout=180)
        c.stub.CancelJob(zb_pb2.CancelJobRequest(job_id=jid, reason="compared"), timeout=10 * SLOW)
        got, schedules = losses_of(c, jid, n)
        assert schedules == ["1f1b"] * at + ["zb-v"] * SWITCH_AFTER, schedules
        c.wait_workers(2)
        ref = c.submit(spec("1f1b", 2, 4, "", iterations=n))
        c.wait_state(ref, STATE.JOB_STATE_SUCCEEDED, timeout=180)
        want, _ = losses_of(c, ref, n)
        rel = max(abs(x - y) / abs(y) for x, y in zip(got, want))
        print("cuda 1f1b -> zb-v at iteration %d vs plain 1f1b: max relative loss difference %.3g" % (at, rel))
        assert rel <= SWITCH_TOL, (got, want)
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
