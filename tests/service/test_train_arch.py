"""Jobs with an architecture train through the service (docs/model.md,
Jobs with an architecture): real coordinator, workers and zbctl.

- A llama job (the transformers fixture tests/data/hf/llama: config.json and
  its safetensors weights) on the llm.c token shards tests/data/tokens,
  submitted with zbctl from YAML, on 2 ranks with 1f1b and with zb-v (4
  stages of 2 layers): SUCCEEDS, every iteration has a finite loss near
  ln(512) at the start (the fixture's random weights), and the loss falls
  over ITERATIONS iterations.
- A config.json with a key zb does not compute ("sliding_window") is
  refused at submit naming the key, by zbctl and by the coordinator (a
  spec sent over gRPC with that config text); no job is created.
- gpt2 (tied head) trains on 2 ranks with 1f1b (the embedding and the
  head's copy on ranks 0 and 1) and zb-v (both on rank 0) and on 1 rank;
  after the last step the two holders of the tied weight have the same
  bits (their dumps).
"""

import json
import math
import os

import zbsvc
from zbsvc import STATE, Cluster, iteration_events, rpc_error, zb_pb2

import grpc

DATA = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
LLAMA = os.path.join(DATA, "hf", "llama")
GPT2 = os.path.join(DATA, "hf", "gpt2")
SHARDS = os.path.join(DATA, "tokens", "gpl3_*.bin")
ITERATIONS = 12
FALL = 0.9  # last-3 mean loss < FALL x first loss


def arch_yaml(name, arch, config, ranks, schedule, weights=None, iterations=ITERATIONS):
    text = ("name: %s\nranks: %d\nmicrobatches: 4\nschedule: %s\niterations: %d\nbackend: cpu\n"
            "trace_every: 0\nmodel:\n  architecture: %s\n  config: %s\n  data: %s\n  seq_len: 16\n"
            "  batch: 4\n  seed: 3\n  lr: 1e-2\n" % (name, ranks, schedule, iterations, arch, config, SHARDS))
    if weights:
        text += "  weights: %s\n" % weights
    return text


def zbctl_submit(c, name, text):
    path = os.path.join(c.dir, name + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    return c.zbctl("submit", path)


def job_id_of(cp):
    assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
    return cp.stdout.split()[-1]


def losses_of(c, jid, n):
    its = iteration_events(c.events(jid))[:n]
    assert [it.iteration for it in its] == list(range(n)), [it.iteration for it in its]
    for it in its:
        assert it.has_loss and math.isfinite(it.loss), it
    return [it.loss for it in its]


def check_trains(label, losses):
    first, tail = losses[0], sum(losses[-3:]) / 3
    print("%-12s loss %.4f -> %.4f (last-3 mean; bound %.4f)" % (label, first, tail, FALL * first))
    assert abs(first - math.log(512)) < 0.5, (label, first)  # random weights: about uniform over 512 ids
    assert tail < FALL * first, (label, losses)


def test_llama_trains_1f1b_and_zbv():
    with Cluster(workers=2, name="train-arch") as c:
        curves = {}
        for schedule in ("1f1b", "zb-v"):
            cp = zbctl_submit(c, "llama-" + schedule,
                              arch_yaml("llama-" + schedule, "llama", os.path.join(LLAMA, "config.json"), 2,
                                        schedule, weights=LLAMA))
            jid = job_id_of(cp)
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            assert job.iterations_done == ITERATIONS, job
            assert job.spec.model.architecture == "llama" and job.spec.model.hidden == 32, job.spec.model
            curves[schedule] = losses_of(c, jid, ITERATIONS)
            check_trains("llama " + schedule, curves[schedule])
            c.wait_workers(2)
        # the same data (both ends draw the same windows) and weights: the
        # same curve under either schedule, up to fp32 summation order
        rel = max(abs(a - b) / abs(b) for a, b in zip(curves["zb-v"], curves["1f1b"]))
        assert rel <= 1e-6, (curves["1f1b"], curves["zb-v"])
        cp = c.zbctl("get", jid)
        assert cp.returncode == 0 and "arch       llama" in cp.stdout and LLAMA in cp.stdout, cp.stdout

        # without weights: seeded initialisation, another first loss
        cp = zbctl_submit(c, "llama-seeded", arch_yaml("llama-seeded", "llama", os.path.join(LLAMA, "config.json"),
                                                       2, "1f1b", iterations=1))
        jid = job_id_of(cp)
        c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
        seeded = losses_of(c, jid, 1)[0]
        assert math.isfinite(seeded) and abs(seeded - curves["1f1b"][0]) > 1e-4, (seeded, curves["1f1b"][0])
        c.wait_workers(2)

        # a weights directory the workers lack fails the job naming it
        cp = zbctl_submit(c, "llama-nowhere", arch_yaml("llama-nowhere", "llama", os.path.join(LLAMA, "config.json"),
                                                        2, "1f1b", weights="/nonexistent/ckpt", iterations=1))
        job = c.wait_state(job_id_of(cp), STATE.JOB_STATE_FAILED, timeout=60)
        assert "/nonexistent/ckpt" in job.reason, job.reason
        c.wait_workers(2)
        c.assert_serving()


def test_bad_config_key_refused_at_submit():
    with Cluster(workers=2, name="arch-bad") as c:
        with open(os.path.join(LLAMA, "config.json")) as f:
            cfg = json.load(f)
        cfg["sliding_window"] = 4096
        bad = os.path.join(c.dir, "config.json")
        with open(bad, "w") as f:
            json.dump(cfg, f)
        cp = zbctl_submit(c, "bad-key", arch_yaml("bad-key", "llama", bad, 2, "1f1b"))
        assert cp.returncode != 0, cp.stdout
        assert "model.config" in cp.stderr and "sliding_window" in cp.stderr, cp.stderr
        # the coordinator refuses the same config text sent over gRPC
        model = zb_pb2.ModelSpec(architecture="llama", config_json=json.dumps(cfg), data=SHARDS, seq_len=16)
        spec = zb_pb2.JobSpec(name="bad-key", ranks=2, microbatches=4, schedule="1f1b", backend="cpu", model=model)
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert "model.config" in details and "sliding_window" in details, details
        # gpt2's config for architecture llama, and hidden given twice
        model = spec.model  # the spec holds a copy
        with open(os.path.join(GPT2, "config.json")) as f:
            model.config_json = f.read()
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "model_type is gpt2" in details, (code, details)
        with open(os.path.join(LLAMA, "config.json")) as f:
            model.config_json = f.read()
        model.hidden = 64
        code, details = rpc_error(c.submit, spec)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "model.hidden" in details, (code, details)
        assert len(c.list_jobs()) == 0, c.list_jobs()  # nothing was created
        c.assert_serving()


def tied_holders_agree(dump_dir, jid, iteration):
    """The tied embedding's weights after the step, on the first stage and
    on the last stage's copy: the same bits."""
    dumps = zbsvc.read_dumps(dump_dir, jid, iteration)
    first, last = dumps[0], dumps[max(dumps)]
    name, rows, cols = first["tensors"][0]
    assert name == "transformer.wte.weight" and last["tensors"][-1] == (name, rows, cols), (first["tensors"][0],
                                                                                          last["tensors"][-1])
    n = 4 * rows * cols
    assert first["after"][:n] == last["after"][-n:], "%s: the two holders of %s differ" % (jid, name)
    assert first["after"][:n] != first["before"][:n], "%s: %s did not move" % (jid, name)


def test_gpt2_tied_head():
    with Cluster(workers=2, name="arch-gpt2") as c:
        config = os.path.join(GPT2, "config.json")
        dump_dir = os.path.join(c.dir, "dumps")
        # 2 ranks: the holders on ranks 0 and 1 (1f1b) and both on rank 0 (zb-v)
        for ranks, schedule in ((2, "1f1b"), (2, "zb-v"), (1, "1f1b")):
            name = "gpt2-%s-%d" % (schedule, ranks)
            text = arch_yaml(name, "gpt2", config, ranks, schedule, weights=GPT2)
            text += "  dump_dir: %s\n  dump_every: %d\n" % (dump_dir, ITERATIONS)
            jid = job_id_of(zbctl_submit(c, name, text))
            job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
            assert job.iterations_done == ITERATIONS, job
            check_trains("gpt2 %s p=%d" % (schedule, ranks), losses_of(c, jid, ITERATIONS))
            if ranks > 1 or schedule == "zb-v":
                tied_holders_agree(dump_dir, jid, ITERATIONS - 1)
            c.wait_workers(2)
        c.assert_serving()


if __name__ == "__main__":
    zbsvc.run_tests(globals())
