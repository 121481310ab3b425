/* bench_gpu_mfu.c — zb_bench_gpu's section 4 (bench_gpu.h): model FLOPs
 * utilisation (MFU) of one middle stage of two real shapes, so the GPU's
 * figures can be read against what large-model training reports:
 *
 *   gpt2   GPT-2 124M: hidden 768, 12 heads, MLP 3072 (tanh GeLU),
 *          LayerNorm, learned positions, vocab 50257 padded as the
 *          architecture code pads it (model/arch_hf.c);
 *   llama  LLaMA-3 8B-shaped: hidden 4096, 32 heads on 8 key/value heads
 *          (GQA, head dim 128), SwiGLU MLP of 14336, RMSNorm, rotary.
 *
 * Both come from a Hugging Face config.json text (zb_arch_from_hf_text),
 * then --mfu-heads scales the width down (fewer heads at the same head
 * dimension and group size, the MLP in proportion) for small devices and
 * the stand-in's smoke run. The stage is the middle one of three of
 * --mfu-layers blocks each, one microbatch of --mfu-batch sequences of
 * --mfu-seq tokens; F, B and W are timed as in section 1 (device events,
 * best of --reps after a warm-up round; gpu_time_stage), with attention
 * as a job runs it: flash attention where the device has it for the head
 * dimension, else the causal skip.
 *
 * Model FLOPs (what MFU counts; not what the kernels issue): per block,
 * 2 N P for the linear layers' products in F, again in B (input
 * gradients) and in W (weight gradients), N tokens and P the linear
 * weights' elements; causal attention counts the T(T+1)/2 score entries
 * on and below the diagonal per head and sequence, 2 hd FLOPs each per
 * product: 2 products in F (Q K^T, P V), 4 in B (dP, dV, dQ, dK). A
 * kernel that computes the full T x T products, or recomputes scores in
 * B (flash attention), does more work than this counts. Element-wise ops,
 * norms and the softmax count nothing.
 *
 * MFU = achieved TFLOP/s / the device's dense peak for the precision
 * (gpu_peak_tflops); for a device not in the table the peak is unknown
 * and no MFU is printed.
 *
 * Ownership: everything is allocated and freed here. Threads: the caller's.
 * Errors: exit 1 through gpu_die.
 */
#include <stdio.h>
#include <string.h>

#include "bench_gpu.h"
#include "zb_arch.h"
#include "zb_arch_hf.h"

/* Dense (no 2:4 sparsity) peak TFLOP/s from NVIDIA's datasheets
 * (docs/model.md, The GPU benchmark, names them): the H100 SXM datasheet
 * gives BF16 1,979 and TF32 989 (both "with sparsity", halved here) and
 * FP32 67, and the H200 SXM has the same compute; the A100 datasheet
 * gives BF16 312, TF32 156 and FP32 19.5 dense (SXM and PCIe alike). H100
 * and H200 PCIe and NVL boards are slower and not in the table. */
static const struct peak {
  const char *match;
  bool sxm_only;    /* names with "PCIe" or "NVL" are other boards */
  double tflops[3]; /* by zb_precision: fp32 (no tensor cores), tf32, bf16 */
} peaks[] = {
    {"H100", true, {67, 494, 989}}, {"H200", true, {67, 494, 989}}, {"A100", false, {19.5, 156, 312}}};

double gpu_peak_tflops(const char *name, zb_precision p) {
  for (size_t i = 0; i < sizeof peaks / sizeof *peaks; i++)
    if (strstr(name, peaks[i].match) &&
        !(peaks[i].sxm_only && (strstr(name, "PCIe") || strstr(name, "PCIE") || strstr(name, "NVL"))))
      return peaks[i].tflops[p];
  return 0;
}

static const char *const hf_configs[2] = {
    "{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_positions\": 1024, \"n_embd\": 768, "
    "\"n_layer\": 12, \"n_head\": 12}",
    "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 4096, \"intermediate_size\": "
    "14336, "
    "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
    "\"max_position_embeddings\": 8192, \"rope_theta\": 500000.0}"};

/* The architecture of hf_configs[i], scaled to o's MFU options. */
static zb_arch mfu_arch(int i, const gpu_opts *o) {
  zb_arch a;
  zb_diag d = {{0}};
  const char *text = hf_configs[i];
  if (zb_arch_from_hf_text(text, strlen(text), &a, NULL, 0, &d) != ZB_OK)
    gpu_die("zb_arch_from_hf_text", &d);
  if (o->mfu_heads > 0 && o->mfu_heads < a.heads) { /* same head dim and group size */
    int group = a.heads / a.kv_heads;
    a.intermediate = (int)((int64_t)a.intermediate * o->mfu_heads / a.heads);
    a.heads = o->mfu_heads;
    a.kv_heads = a.heads / group > 0 ? a.heads / group : 1;
    a.hidden = a.heads * a.head_dim;
  }
  a.layers = 3 * o->mfu_layers; /* the middle one of three stages */
  a.max_positions = a.max_positions > o->mfu_seq ? a.max_positions : o->mfu_seq;
  if (zb_arch_check(&a, &d) != ZB_OK)
    gpu_die("mfu arch", &d);
  return a;
}

/* Model FLOPs of F, B and W of L blocks of a (see the header comment). */
static void model_flops(const zb_arch *a, const gpu_opts *o, double fl[3]) {
  double h = a->hidden, hd = a->head_dim, I = a->intermediate, T = o->mfu_seq, B = o->mfu_batch;
  double P =
      h * (a->heads + 2.0 * a->kv_heads) * hd + a->heads * hd * h + (a->mlp == ZB_MLP_SWIGLU ? 3 : 2) * h * I;
  double lin = 2 * B * T * P, attn = 2 * hd * T * (T + 1) * a->heads * B; /* 2 products x 2 hd x T(T+1)/2 */
  fl[0] = o->mfu_layers * (lin + attn);
  fl[1] = o->mfu_layers * (lin + 2 * attn);
  fl[2] = o->mfu_layers * lin;
}

static void mfu_row(const char *arch, const char *op, double flops, double s, double peak) {
  double tf = flops / s * 1e-12;
  char mfu[16] = "-";
  if (peak > 0)
    snprintf(mfu, sizeof mfu, "%.1f%%", 100 * tf / peak);
  printf("%-6s %-6s %12.6g %10.3f %9.2f %7s\n", arch, op, flops * 1e-9, s * 1e3, tf, mfu);
}

static void describe(const zb_arch *a) {
  printf("   %s: hidden %d, %d heads on %d key/value heads of %d, MLP %d (%s), %s, vocab %d (padded %d)\n",
         zb_arch_kind_name(a->kind), a->hidden, a->heads, a->kv_heads, a->head_dim, a->intermediate,
         a->mlp == ZB_MLP_SWIGLU ? "SwiGLU" : "GeLU", a->norm == ZB_NORM_RMS ? "RMSNorm" : "LayerNorm",
         a->vocab, a->vocab_padded);
}

static void mfu_arch_rows(zb_device *dev, const gpu_opts *o, const zb_arch *a, double peak) {
  zb_model_config cfg = {.vocab = a->vocab,
                         .hidden = a->hidden,
                         .heads = a->heads,
                         .layers = a->layers,
                         .seq_len = o->mfu_seq,
                         .batch = o->mfu_batch,
                         .seed = 1,
                         .device = dev,
                         .arch = a,
                         .attn_block = o->attn_block,
                         .bf16 = o->precision == ZB_PRECISION_BF16}; /* bf16 storage too */
  double t[3], fl[3];
  gpu_time_stage(&cfg, 1, o->reps, t);
  model_flops(a, o, fl);
  static const char *const ops[3] = {"F", "B", "W"};
  for (int op = 0; op < 3; op++)
    mfu_row(zb_arch_kind_name(a->kind), ops[op], fl[op], t[op], peak);
  mfu_row(zb_arch_kind_name(a->kind), "F+B+W", fl[0] + fl[1] + fl[2], t[0] + t[1] + t[2], peak);
}

void gpu_bench_mfu(zb_device *dev, const gpu_opts *o) {
  zb_device_info info;
  dev->ops->info(dev->self, &info);
  double peak = gpu_peak_tflops(info.name, o->precision);
  printf("4. MFU of a middle stage: %d blocks, batch %d, seq %d (%d tokens), %s; best of %d\n", o->mfu_layers,
         o->mfu_batch, o->mfu_seq, o->mfu_batch * o->mfu_seq, gpu_precision_name(o->precision), o->reps);
  zb_arch a[2] = {mfu_arch(0, o), mfu_arch(1, o)};
  describe(&a[0]);
  describe(&a[1]);
  if (peak > 0)
    printf("   peak: %g TFLOP/s (%s, dense, %s)\n", peak, info.name, gpu_precision_name(o->precision));
  else
    printf("   peak unknown: %s is not in the table of known peaks; no MFU\n", info.name);
  printf(
      "   model FLOPs: linear products 2 N P per op; causal attention T(T+1)/2 entries per head, 2 products "
      "in F, 4 in B\n");
  printf("%-6s %-6s %12s %10s %9s %7s\n", "arch", "op", "GFLOP", "ms", "TFLOP/s", "MFU");
  for (int i = 0; i < 2; i++)
    mfu_arch_rows(dev, o, &a[i], peak);
  printf("\n");
}
