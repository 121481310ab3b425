#!/usr/bin/env python3
"""PyTorch's side of zb_bench_model's comparison (docs/model.md, BLAS and
speed): the same model as zb's, built with transformers from a config,
trained on the CPU in float32, timed as zb_bench_model times zb.

    torch_model.py --arch builtin|llama --vocab V --hidden H --heads N
                   [--kv-heads K] [--intermediate I] --layers L --seq T
                   --batch B [--threads 1] [--reps 5]

The models, by zb's architecture (model/zb_arch.h):
  builtin  GPT2LMHeadModel with an untied head: learned positions,
           LayerNorm with bias (eps 1e-5), fused qkv with bias, tanh-GeLU
           MLP of 4h with biases, final LayerNorm, LM head without bias;
  llama    LlamaForCausalLM: RMSNorm (eps 1e-5), rotary positions (theta
           10000), SwiGLU MLP of I units, grouped-query attention (K
           key/value heads), no biases, untied head.
Attention is transformers' "sdpa" (torch.nn.functional
.scaled_dot_product_attention, causal); dropout is off.

What is timed, each of --reps rounds after two warm-up rounds, the best
kept: one training step of the whole model on one microbatch of B
sequences of T tokens, without the optimizer: the forward pass, the loss
(F.cross_entropy, mean over the B*T positions, against fixed targets) and
loss.backward(), which computes both the input gradients (zb's B) and
the weight gradients (zb's W). Gradients accumulate across rounds, as
zb's W accumulates them across microbatches. torch.set_num_threads(T)
and one inter-op thread.

Prints what it built, then one line zb_bench_model reads:
    torch_model: step_ms=X forward_ms=Y backward_ms=Z tokens=N
Exit status 3 when torch or transformers does not import.
"""

import argparse
import re
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=("builtin", "llama"), required=True)
    for name in ("vocab", "hidden", "heads", "layers", "seq", "batch"):
        p.add_argument("--" + name, type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (default: --heads)")
    p.add_argument("--intermediate", type=int, default=0, help="llama: MLP units (default: 4h)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    return p.parse_args()


def build(torch, a):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if a.arch == "builtin":
        config = GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.hidden, n_layer=a.layers,
                            n_head=a.heads, n_inner=None, activation_function="gelu_new",
                            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            tie_word_embeddings=False)
        make = GPT2LMHeadModel
    else:
        config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                             intermediate_size=a.intermediate or 4 * a.hidden, num_hidden_layers=a.layers,
                             num_attention_heads=a.heads, num_key_value_heads=a.kv_heads or a.heads,
                             hidden_act="silu", max_position_embeddings=a.seq, rms_norm_eps=1e-5,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                             tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                             attention_dropout=0.0)
        make = LlamaForCausalLM
    # read when the model is made; "sdpa": scaled_dot_product_attention
    config._attn_implementation = "sdpa"
    model = make(config).to("cpu", dtype=torch.float32)
    if model.config._attn_implementation != "sdpa":
        sys.exit("torch_model: attention is %s, not sdpa" % model.config._attn_implementation)
    return model.train()


def main():
    a = parse_args()
    try:
        import torch
        import torch.nn.functional as F
        import transformers
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        print("torch_model: cannot import torch and transformers: %s" % e)
        sys.exit(3)
    hf_logging.set_verbosity_error()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(1)
    model = build(torch, a)
    params = sum(p.numel() for p in model.parameters())
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print("torch %s, transformers %s, %d thread(s), BLAS %s, oneDNN %s; %s of %d parameters, attention %s" %
          (torch.__version__, transformers.__version__, torch.get_num_threads(), blas.group(1) if blas else "?",
           "on" if torch.backends.mkldnn.is_available() else "off", type(model).__name__, params,
           model.config._attn_implementation))
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:].reshape(-1)
    best = (float("inf"), 0.0, 0.0)
    for r in range(a.reps + 2):  # two warm-up rounds
        t0 = time.perf_counter()
        logits = model(input_ids=inputs, use_cache=False).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if r >= 2 and t2 - t0 < best[0]:
            best = (t2 - t0, t1 - t0, t2 - t1)
    print("torch_model: step_ms=%.3f forward_ms=%.3f backward_ms=%.3f tokens=%d" %
          (best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, a.batch * a.seq))


if __name__ == "__main__":
    main()
