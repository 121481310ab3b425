"""Pipelined gradients of real architectures equal transformers' own
(docs/model.md, Reference fixtures from transformers): every schedule
family at (p, m) = (2, 4) and (4, 8), for GPT-2 (tied head) and LLaMA
(GQA, rotary, SwiGLU, untied head), on real zb-worker processes.

Each job trains the fixture of tests/data/hf/ARCH: its config.json, its
safetensors weights (model.weights) and its batch of 8 rows, read in order
from the fixture's llm.c shard tokens.bin (model.order: sequential), so
that the m microbatches of 8/m rows are the fixture's batch split in
order. One iteration, with model.dump_dir set: each rank dumps its stages'
weights before the step and the iteration's gradients (train/zb_dump.h).
Checked against expected.safetensors, which tools/hf_fixtures.py computed
with transformers in one process without a pipeline:

- per parameter tensor ||g - g_ref|| / ||g_ref|| <= GRAD_TOL (1e-5);
  the tied GPT-2 embedding's gradient on both of its holders (the first
  stage's embedding, the last stage's head), each the sum of both uses;
- the iteration's loss (the last stage's mean over its microbatches)
  within the same relative tolerance of the fixture's;
- every transformers parameter is held by exactly the stages that should
  hold it (a tied copy on the last stage, nothing else twice), and the
  weights before the step are model.safetensors' values, bit for bit.

ZB_HF_BACKEND and ZB_HF_TRANSPORT (default cpu, tcp) choose the job's
backend and transport: service_test_hf_pipelines_standin runs the same
jobs as cuda over nccl on the CPU stand-in (zb-worker-standin), the GPU
path with its device step and the tied gradient through the host.
"""

import array
import json
import math
import os
import struct

import zbsvc
from zbsvc import STATE, Cluster, zb_pb2

GRAD_TOL = 1e-5  # the bound: fp32, per parameter tensor, relative
FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zb-v", "v-half", "v-min",
            "zb-interleaved", "dualpipe-v"]
SHAPES = [(2, 4), (4, 8)]
BACKEND = os.environ.get("ZB_HF_BACKEND", "cpu")
TRANSPORT = os.environ.get("ZB_HF_TRANSPORT", "tcp")
ROWS, SEQ = 8, 16  # the fixture's batch
HF = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf"))
# GPT-2 stores its linear layers as Conv1D, [in, out]: zb's [out, in] transposed
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def read_safetensors(path):
    """{name: (shape, array('f'))} of a float32 safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        lo, hi = info["data_offsets"]
        a = array.array("f")
        a.frombytes(raw[8 + n + lo:8 + n + hi])
        out[name] = (info["shape"], a)
    return out


def zb_layout(arch, name, shape, values):
    """An HF tensor as zb lays it out (row-major [rows, cols])."""
    if arch == "gpt2" and name.endswith(CONV1D):
        rows, cols = shape[1], shape[0]
        return array.array("f", (values[c * rows + r] for r in range(rows) for c in range(cols)))
    return values


def rel_err(got, want):
    num = sum((float(a) - float(b)) ** 2 for a, b in zip(got, want))
    den = sum(float(b) ** 2 for b in want)
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def floats(raw):
    a = array.array("f")
    a.frombytes(raw)
    return a


def check_job(arch, dumps, fixture, weights, expected, where):
    """Compares one job's iteration-0 dumps with the fixture; returns the
    largest relative gradient error."""
    held = {}
    worst = 0.0
    for stage in sorted(dumps):
        d = dumps[stage]
        before, grads = floats(d["before"]), floats(d["grads"])
        off = 0
        for name, rows, cols in d["tensors"]:
            n = rows * cols
            held.setdefault(name, []).append(stage)
            shape, ref = weights[name]
            want_w = zb_layout(arch, name, shape, ref)
            want_g = zb_layout(arch, name, shape, expected["grad." + name][1])
            assert len(want_g) == n, (where, name, rows, cols, shape)
            assert before[off:off + n] == want_w, "%s: %s (stage %d) is not model.safetensors' value" % (
                where, name, stage)
            err = rel_err(grads[off:off + n], want_g)
            assert err <= GRAD_TOL, "%s: grad of %s (stage %d): relative error %.3g > %g" % (
                where, name, stage, err, GRAD_TOL)
            worst = max(worst, err)
            off += n
    last = dumps[max(dumps)]
    loss_err = abs(last["loss"] - fixture["loss"]) / abs(fixture["loss"])
    assert loss_err <= GRAD_TOL, (where, last["loss"], fixture["loss"])
    # every parameter once, the tied embedding on the first and last stage
    assert sorted(held) == sorted(weights), (where, sorted(set(weights) ^ set(held)))
    ns = len(dumps)
    for name, stages in held.items():
        want = [0, ns - 1] if name in fixture["tied_holders"] and ns > 1 else stages[:1]
        assert stages == want, (where, name, stages, want)
    return worst


def spec(arch, family, p, m, dump_dir):
    d = os.path.join(HF, arch)
    with open(os.path.join(d, "config.json")) as f:
        config = f.read()
    model = zb_pb2.ModelSpec(architecture=arch, config_json=config, weights=d, data=os.path.join(d, "tokens.bin"),
                             order="sequential", seq_len=SEQ, batch=ROWS // m, seed=1, lr=1e-3, dump_dir=dump_dir)
    return zb_pb2.JobSpec(name="hf-%s-%s-p%d-m%d" % (arch, family, p, m), ranks=p, microbatches=m,
                          schedule=family, iterations=1, backend=BACKEND, transport=TRANSPORT, trace_every=0,
                          model=model)


def fixture_of(arch):
    d = os.path.join(HF, arch)
    with open(os.path.join(d, "fixture.json")) as f:
        fx = json.load(f)
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    expected = read_safetensors(os.path.join(d, "expected.safetensors"))
    # the tied head is not saved: its one logical weight is the embedding
    fx["tied_holders"] = set(fx["tied"].values())
    assert fx["batch"] == ROWS and fx["seq"] == SEQ, fx
    return fx, weights, expected


def run_arch(arch):
    fx, weights, expected = fixture_of(arch)
    worst = []
    with Cluster(workers=4, name="hf-" + arch) as c:
        dump_dir = os.path.join(c.dir, "dumps")
        for family in FAMILIES:
            for p, m in SHAPES:
                jid = c.submit(spec(arch, family, p, m, dump_dir))
                where = "%s %s p=%d m=%d (job %s)" % (arch, family, p, m, jid)
                job = c.wait_state(jid, STATE.JOB_STATE_SUCCEEDED, timeout=120)
                assert job.iterations_done == 1, (where, job)
                dumps = zbsvc.read_dumps(dump_dir, jid, 0)
                assert len(dumps) == zbsvc.job_stages(family, p, dump_dir, jid), (where, sorted(dumps))
                worst.append((check_job(arch, dumps, fx, weights, expected, where), where))
                c.wait_workers(4)
        c.assert_serving()
    worst.sort()
    print("%s (%s over %s): %d jobs, every gradient within %g of transformers'; largest relative error %.2e (%s)"
          % (arch, BACKEND, TRANSPORT, len(worst), GRAD_TOL, worst[-1][0], worst[-1][1]))


def test_llama_every_family():
    run_arch("llama")


def test_gpt2_every_family():
    run_arch("gpt2")


if __name__ == "__main__":
    zbsvc.run_tests(globals())
