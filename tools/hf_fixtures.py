#!/usr/bin/env python3
"""Reference fixtures from Hugging Face transformers, the oracle of zb's models.

Builds two tiny causal language models with torch and transformers on the
CPU (float32, one thread, deterministic algorithms, fixed seeds): a GPT-2
(learned positions, LayerNorm with bias, tanh-GeLU, tied embedding and head)
and a LLaMA (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention,
untied head). For each it writes the Hugging Face directory that
`save_pretrained` makes (config.json, model.safetensors) and the expected
results of one fixed batch: the logits, the loss and the gradient of the
loss with respect to every parameter. docs/model.md ("Reference fixtures
from transformers") describes the files; tests/data/hf holds them.

    hf_fixtures.py --out DIR      write DIR/{gpt2,llama,llama-sharded}
    hf_fixtures.py --check DIR    regenerate in a temporary folder and compare
                                  with DIR; exit 1 naming what differs
    hf_fixtures.py --eval MODEL_DIR --tokens FILE
                                  load MODEL_DIR with from_pretrained and print
                                  the loss (definition below) on the int
                                  tensor "heldout.tokens" of FILE, as JSON

The loss, in every mode: from a token draw x of shape [B, T+1], the model
gets x[:, :-1] and predicts x[:, 1:]; loss = mean over the B*T positions of
the cross entropy of the logits against those targets (F.cross_entropy,
reduction "mean"). This equals transformers' own loss for
model(input_ids=x, labels=x), which shifts the labels inside; the script
asserts that too.

Runs in the venv of scripts/install-hf-venv.sh (pinned torch and
transformers); scripts/check-hf-fixtures.sh runs the check.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

SEED = 29
# Eight rows, so that a pipeline's 4 or 8 microbatches of 2 or 1 rows
# each are the fixture's batch split in order (the service tests).
BATCH = 8
SEQ = 16  # predictions per row; a token draw is SEQ + 1 wide
# llm.c's token shard header: magic 20240520, version 1 (uint16 tokens).
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256
VOCAB = 512
# A shard limit below the LLaMA model's 0.6 MB, so that its sharded copy
# has several shards and an index (tensors are never split across shards).
SHARD_SIZE = "200KB"
# Float tensors match when |a - b| <= REL_TOL * max(|b|, FLOOR * max|b|):
# relative per element, with a floor at a thousandth of the tensor's largest
# magnitude so that an element that cancels to near zero does not ask for
# more digits than float32 has.
REL_TOL = 1e-6
FLOOR = 1e-3

# Explicit configurations; every key zb must read is written out.
GPT2_CONFIG = dict(
    vocab_size=VOCAB,
    n_positions=32,
    n_embd=32,
    n_layer=8,
    n_head=4,
    n_inner=None,  # as in OpenAI's GPT-2 configs: 4 * n_embd
    activation_function="gelu_new",  # the tanh approximation of GeLU
    layer_norm_epsilon=1e-5,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    tie_word_embeddings=True,
    bos_token_id=VOCAB - 1,
    eos_token_id=VOCAB - 1,
)
LLAMA_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=80,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    attention_dropout=0.0,
    bos_token_id=1,
    eos_token_id=2,
)

LOSS_DEFINITION = (
    "tokens x: int32 [B, T+1]; logits = model(input_ids=x[:, :-1]).logits, "
    "float32 [B, T, V]; loss = mean over the B*T positions of "
    "cross_entropy(logits, x[:, 1:]) (torch.nn.functional.cross_entropy, "
    "reduction 'mean'); equal to model(input_ids=x, labels=x).loss"
)
PERTURBATION = (
    "the model's own initialisation (normal, std initializer_range 0.02) "
    "under torch.manual_seed(seed), then every norm weight set to "
    "1 + 0.1 * N(0, 1) and every bias to 0.02 * N(0, 1) from a generator "
    "seeded seed + 1, so that neither is 1 or 0"
)


def setup_torch():
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    return torch


def perturb(torch, model):
    """Moves norm weights off 1 and biases off 0, so that a reader that
    ignores them fails the fixture."""
    gen = torch.Generator().manual_seed(SEED + 1)
    norm_params = set()
    for mname, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, torch.nn.LayerNorm) or kind.endswith("RMSNorm"):
            norm_params.add(f"{mname}.weight")
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name in norm_params:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.02 * noise)


def build(torch, arch):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    config = GPT2Config(**GPT2_CONFIG) if arch == "gpt2" else LlamaConfig(**LLAMA_CONFIG)
    # eager attention: the plain softmax(Q K^T / sqrt(d)) path, the
    # definition zb implements, rather than a fused kernel; set before the
    # model is made, which reads it (it is not saved in config.json)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(config) if arch == "gpt2" else LlamaForCausalLM(config)
    if model.config._attn_implementation != "eager":
        sys.exit(f"hf_fixtures: {arch}: attention is {model.config._attn_implementation}, not eager")
    perturb(torch, model)
    return model.to(torch.float32).eval()


def rows_of(stream):
    """Rows b = stream[b*SEQ : b*SEQ + SEQ + 1]: windows every SEQ tokens,
    consecutive rows sharing one token, as a reader of the stream in order
    takes them (zb's model.order: sequential)."""
    return stream.unfold(0, SEQ + 1, SEQ)


def draw_tokens(torch):
    """The batch and the held-out batch, and the streams they are cut from."""
    gen = torch.Generator().manual_seed(SEED + 2)
    train = torch.randint(0, VOCAB, (BATCH * SEQ + 1,), generator=gen)
    heldout = torch.randint(0, VOCAB, (BATCH * SEQ + 1,), generator=gen)
    return rows_of(train), rows_of(heldout), train, heldout


def write_shard(path, stream):
    """stream as an llm.c token shard: 256 little-endian int32 (magic,
    version, token count, zeros), then the tokens as little-endian uint16."""
    import struct

    header = [SHARD_MAGIC, SHARD_VERSION, len(stream)] + [0] * (SHARD_HEADER_INTS - 3)
    with open(path, "wb") as f:
        f.write(struct.pack("<%di" % SHARD_HEADER_INTS, *header))
        f.write(struct.pack("<%dH" % len(stream), *[int(t) for t in stream]))


def loss_of(torch, model, x):
    """The loss of LOSS_DEFINITION; returns (logits, loss)."""
    import torch.nn.functional as F

    logits = model(input_ids=x[:, :-1], use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    return logits, loss


def check_hf_loss(torch, model, x, ours, what):
    """transformers' own labels path must give the same number."""
    with torch.no_grad():
        theirs = model(input_ids=x, labels=x, use_cache=False).loss.item()
    if abs(theirs - ours) > 1e-5 * abs(ours):
        sys.exit(f"hf_fixtures: {what}: transformers' labels loss {theirs!r} != {ours!r}")


def tied_names(model):
    """Names of parameters that share storage with an earlier one, as
    {tied name: kept name}; named_parameters() lists only the kept one."""
    kept, tied = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in kept:
            tied[name] = kept[id(p)]
        else:
            kept[id(p)] = name
    return tied


def versions():
    from importlib.metadata import version

    return {n: version(n) for n in ("torch", "transformers", "safetensors", "numpy")}


def expected_tensors(torch, model, arch, saved):
    """Runs the batch forward and backward; returns the tensors of
    expected.safetensors and the parameter shapes."""
    train, heldout, _, _ = draw_tokens(torch)
    model.zero_grad(set_to_none=True)
    logits, loss = loss_of(torch, model, train)
    loss.backward()
    with torch.no_grad():
        _, heldout_loss = loss_of(torch, model, heldout)
    check_hf_loss(torch, model, train, loss.item(), f"{arch} batch")
    check_hf_loss(torch, model, heldout, heldout_loss.item(), f"{arch} held-out batch")
    tensors = {
        "tokens": train.to(torch.int32).contiguous(),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(1),
        "heldout.tokens": heldout.to(torch.int32).contiguous(),
        "heldout.loss": heldout_loss.reshape(1),
    }
    params = {}
    for name, p in model.named_parameters():
        if name not in saved:
            sys.exit(f"hf_fixtures: {arch}: parameter {name} is not in model.safetensors")
        params[name] = list(p.shape)
        tensors["grad." + name] = p.grad.detach().contiguous()
    extra = sorted(set(saved) - set(params))
    if extra:
        sys.exit(f"hf_fixtures: {arch}: model.safetensors has tensors that are not parameters: {extra}")
    return tensors, params


def fixture_meta(model, arch, tensors, params):
    meta = {
        "architecture": arch,
        "made_by": "tools/hf_fixtures.py",
        "seed": SEED,
        "versions": versions(),
        "dtype": "float32",
        "attn_implementation": "eager",
        "batch": BATCH,
        "seq": SEQ,
        "vocab_size": VOCAB,
        "tokens": "two streams of batch * seq + 1 tokens, torch.randint(0, vocab_size, ...) from a generator seeded seed + 2 (first 'tokens', then 'heldout.tokens'); row b of a batch is stream[b*seq : b*seq + seq + 1], so consecutive rows share one token",
        "shards": "tokens.bin and heldout.bin: the two streams as llm.c token shards (magic 20240520, version 1, uint16 tokens); read in order (zb's model.order: sequential) with seq_len seq they give the rows above",
        "loss_definition": LOSS_DEFINITION,
        "loss": tensors["loss"].item(),
        "heldout_loss": tensors["heldout.loss"].item(),
        "weights": PERTURBATION,
        "gradients": "grad.NAME in expected.safetensors: d loss / d NAME for every parameter NAME of model.safetensors, for the batch 'tokens'",
        "tied": tied_names(model),
        "parameters": params,
    }
    if meta["tied"]:
        meta["tied_note"] = "a tied name is not saved in model.safetensors; the gradient of the kept name is the sum over both uses"
    if arch == "llama":
        meta["sharded_copy"] = f"../llama-sharded: the same weights, save_pretrained(max_shard_size='{SHARD_SIZE}')"
    return meta


def write_model(torch, arch, out):
    from safetensors.torch import load_file, save_file

    model = build(torch, arch)
    mdir = os.path.join(out, arch)
    shutil.rmtree(mdir, ignore_errors=True)
    model.save_pretrained(mdir, safe_serialization=True)
    saved = load_file(os.path.join(mdir, "model.safetensors"))
    tensors, params = expected_tensors(torch, model, arch, saved)
    save_file(tensors, os.path.join(mdir, "expected.safetensors"))
    _, _, train_stream, heldout_stream = draw_tokens(torch)
    write_shard(os.path.join(mdir, "tokens.bin"), train_stream)
    write_shard(os.path.join(mdir, "heldout.bin"), heldout_stream)
    with open(os.path.join(mdir, "fixture.json"), "w") as f:
        json.dump(fixture_meta(model, arch, tensors, params), f, indent=2, sort_keys=True)
        f.write("\n")
    if arch == "llama":
        sdir = os.path.join(out, "llama-sharded")
        shutil.rmtree(sdir, ignore_errors=True)
        model.save_pretrained(sdir, safe_serialization=True, max_shard_size=SHARD_SIZE)
        shards = [n for n in os.listdir(sdir) if n.endswith(".safetensors")]
        if len(shards) < 2 or not os.path.exists(os.path.join(sdir, "model.safetensors.index.json")):
            sys.exit(f"hf_fixtures: llama-sharded: expected an index and 2+ shards, got {sorted(os.listdir(sdir))}")
    print(f"hf_fixtures: {arch}: loss {tensors['loss'].item():.6f}, held-out {tensors['heldout.loss'].item():.6f}, {len(params)} parameters")


def generate(out):
    torch = setup_torch()
    os.makedirs(out, exist_ok=True)
    for arch in ("gpt2", "llama"):
        write_model(torch, arch, out)
    for sub in ("gpt2", "llama", "llama-sharded"):
        for name in os.listdir(os.path.join(out, sub)):  # safetensors writes 0600
            os.chmod(os.path.join(out, sub, name), 0o644)


# --- check mode --------------------------------------------------------------


def files_under(root):
    found = set()
    for d, _, names in os.walk(root):
        for n in names:
            found.add(os.path.relpath(os.path.join(d, n), root))
    return found


def json_diff(a, b, where, out):
    """Appends to out each place where JSON values a (committed) and b
    (regenerated) differ; floats within REL_TOL."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in b:
                out.append(f"{where}.{k}: only in the committed file")
            elif k not in a:
                out.append(f"{where}.{k}: only in the regenerated file")
            else:
                json_diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            json_diff(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float):
        if not math.isclose(a, b, rel_tol=REL_TOL):
            out.append(f"{where}: committed {a!r}, regenerated {b!r}")
    elif a != b or type(a) is not type(b):
        out.append(f"{where}: committed {a!r}, regenerated {b!r}")


def tensor_diff(torch, name, a, b, out):
    if a.dtype != b.dtype or a.shape != b.shape:
        out.append(f"{name}: committed {a.dtype} {list(a.shape)}, regenerated {b.dtype} {list(b.shape)}")
        return
    if not a.is_floating_point():
        bad = (a != b).nonzero()
        if len(bad):
            i = tuple(bad[0].tolist())
            out.append(f"{name}: {len(bad)} elements differ, first at {list(i)}: committed {a[i].item()}, regenerated {b[i].item()}")
        return
    a64, b64 = a.double(), b.double()
    scale = b64.abs().max().item() if b64.numel() else 0.0
    limit = REL_TOL * torch.clamp(b64.abs(), min=FLOOR * scale)
    bad = ((a64 - b64).abs() > limit).nonzero()
    if len(bad):
        i = tuple(bad[0].tolist())
        rel = ((a64 - b64).abs() / torch.clamp(b64.abs(), min=FLOOR * scale)).max().item()
        out.append(
            f"{name}: {len(bad)} of {a.numel()} elements beyond {REL_TOL:g} relative (worst {rel:.3g}), "
            f"first at {list(i)}: committed {a[i].item()!r}, regenerated {b[i].item()!r}"
        )


def compare_file(torch, rel, committed, fresh, out):
    from safetensors import safe_open

    if rel.endswith(".json"):
        with open(committed) as f:
            a = json.load(f)
        with open(fresh) as f:
            b = json.load(f)
        json_diff(a, b, rel, out)
        return 0
    if not rel.endswith(".safetensors"):
        with open(committed, "rb") as f, open(fresh, "rb") as g:
            if f.read() != g.read():
                out.append(f"{rel}: bytes differ")
        return 0
    with safe_open(committed, "pt") as fa, safe_open(fresh, "pt") as fb:
        json_diff(fa.metadata() or {}, fb.metadata() or {}, f"{rel} metadata", out)
        ka, kb = set(fa.keys()), set(fb.keys())
        for k in sorted(ka - kb):
            out.append(f"{rel}: tensor {k} only in the committed file")
        for k in sorted(kb - ka):
            out.append(f"{rel}: tensor {k} only in the regenerated file")
        for k in sorted(ka & kb):
            tensor_diff(torch, f"{rel}: {k}", fa.get_tensor(k), fb.get_tensor(k), out)
        return len(ka & kb)


def check(committed):
    torch = setup_torch()
    if not os.path.isdir(committed):
        sys.exit(f"hf_fixtures: --check: {committed} is not a directory")
    with tempfile.TemporaryDirectory(prefix="hf_fixtures.") as tmp:
        generate(tmp)
        want, have = files_under(tmp), files_under(committed)
        diffs = [f"{rel}: missing from {committed}" for rel in sorted(want - have)]
        diffs += [f"{rel}: in {committed} but not made by the script" for rel in sorted(have - want)]
        ntensors = 0
        for rel in sorted(want & have):
            ntensors += compare_file(torch, rel, os.path.join(committed, rel), os.path.join(tmp, rel), diffs)
    if diffs:
        what = "1 difference" if len(diffs) == 1 else f"{len(diffs)} differences"
        print(f"hf_fixtures: check FAILED: {what} between {committed} and a fresh run:")
        for d in diffs:
            print(f"  {d}")
        print("hf_fixtures: if the change is intended, regenerate with: tools/hf_fixtures.py --out " + committed)
        return 1
    print(f"hf_fixtures: check ok: {len(want)} files, {ntensors} tensors match {committed} (within {REL_TOL:g} relative)")
    return 0


def evaluate(model_dir, tokens_file, key):
    torch = setup_torch()
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with safe_open(tokens_file, "pt") as f:
        if key not in f.keys():
            sys.exit(f"hf_fixtures: --eval: {tokens_file} has no tensor {key}")
        x = f.get_tensor(key).long()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        _, loss = loss_of(torch, model, x)
    print(json.dumps({"model": model_dir, "tokens": f"{tokens_file}:{key}", "loss": loss.item()}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="DIR", help="write the fixtures under DIR")
    mode.add_argument("--check", metavar="DIR", help="compare DIR with a fresh run")
    mode.add_argument("--eval", metavar="MODEL_DIR", help="print transformers' loss of MODEL_DIR on --tokens")
    ap.add_argument("--tokens", metavar="FILE", help="safetensors file with the tokens for --eval")
    ap.add_argument("--tokens-key", default="heldout.tokens", help="tensor name in --tokens (default heldout.tokens)")
    args = ap.parse_args()
    if args.out:
        generate(args.out)
        return 0
    if args.check:
        return check(args.check)
    if not args.tokens:
        ap.error("--eval needs --tokens FILE")
    return evaluate(args.eval, args.tokens, args.tokens_key)


if __name__ == "__main__":
    sys.exit(main())
