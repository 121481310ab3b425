/* arch.c — architectures as data (zb_arch.h): their names, their checks,
 * and the tensor list of each stage with the names and layouts Hugging
 * Face transformers uses (docs/model.md, Architectures). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zb_arch.h"

static const char *const kind_names[ZB_ARCH_KIND_COUNT] = {"builtin", "gpt2", "llama"};

const char *zb_arch_kind_name(zb_arch_kind k) {
  return k >= 0 && k < ZB_ARCH_KIND_COUNT ? kind_names[k] : "?";
}

zb_err zb_arch_kind_parse(const char *name, zb_arch_kind *out, zb_diag *diag) {
  for (int k = 0; k < ZB_ARCH_KIND_COUNT; k++)
    if (strcmp(name, kind_names[k]) == 0) {
      *out = (zb_arch_kind)k;
      return ZB_OK;
    }
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "architecture '%s' is not one of builtin, gpt2, llama", name);
}

zb_arch zb_arch_builtin(int vocab, int hidden, int heads, int layers, int max_positions) {
  int v = vocab > 0 ? vocab : 256;
  return (zb_arch){.kind = ZB_ARCH_BUILTIN,
                   .vocab = v,
                   .vocab_padded = v,
                   .hidden = hidden,
                   .heads = heads,
                   .kv_heads = heads,
                   .head_dim = heads > 0 ? hidden / heads : 0,
                   .layers = layers,
                   .intermediate = 4 * hidden,
                   .max_positions = max_positions,
                   .norm = ZB_NORM_LAYER,
                   .norm_eps = 1e-5,
                   .pos = ZB_POS_LEARNED,
                   .mlp = ZB_MLP_GELU_TANH,
                   .biases = 1,
                   .fused_qkv = 1};
}

zb_err zb_arch_layer_range(int layers, int n_stages, int stage, int *first, int *count) {
  if (layers < 0 || n_stages < 1 || stage < 0 || stage >= n_stages)
    return ZB_ERR_INVALID_ARG;
  int64_t lo = (int64_t)stage * layers / n_stages, hi = (int64_t)(stage + 1) * layers / n_stages;
  *first = (int)lo;
  *count = (int)(hi - lo);
  return ZB_OK;
}

static zb_err check_rope(const zb_rope *r, zb_diag *diag) {
  if (!isfinite(r->theta) || r->theta <= 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "rope_theta %g must be finite and above 1", r->theta);
  if (r->scaling != ZB_ROPE_NONE && (!isfinite(r->factor) || r->factor < 1))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "rope_scaling.factor %g must be finite and at least 1",
                       r->factor);
  if (r->scaling == ZB_ROPE_LLAMA3 &&
      (!isfinite(r->low_freq_factor) || !isfinite(r->high_freq_factor) || r->low_freq_factor <= 0 ||
       r->high_freq_factor <= r->low_freq_factor || r->original_max_positions < 1))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "rope_scaling llama3 needs 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings >= 1 (got %g, %g, %d)",
                       r->low_freq_factor, r->high_freq_factor, r->original_max_positions);
  return ZB_OK;
}

/* Every dimension of every tensor must be an int (gemm sizes are): the
 * fused q|k|v rows and the attention width. Sizes of whole tensors are
 * size_t, so a model too large for memory is the allocator's to refuse. */
static zb_err check_extent(const zb_arch *a, zb_diag *diag) {
  int64_t qkv = (int64_t)(a->heads + 2 * a->kv_heads) * a->head_dim;
  if (qkv > INT_MAX / 2)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model too large: (heads + 2 kv_heads) head_dim is %lld",
                       (long long)qkv);
  return ZB_OK;
}

zb_err zb_arch_check(const zb_arch *a, zb_diag *diag) {
  if (a->kind < 0 || a->kind >= ZB_ARCH_KIND_COUNT)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "architecture %d is unknown", (int)a->kind);
  if (a->vocab < 1 || a->vocab_padded < a->vocab)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "vocab %d (padded %d) must be at least 1 and padded >= vocab", a->vocab,
                       a->vocab_padded);
  if (a->hidden < 1 || a->heads < 1 || a->head_dim < 1 || a->layers < 0 || a->intermediate < 1 ||
      a->max_positions < 1)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "sizes must be positive: hidden %d, heads %d, head_dim %d, layers %d, intermediate %d, "
        "max_positions %d",
        a->hidden, a->heads, a->head_dim, a->layers, a->intermediate, a->max_positions);
  if (a->kv_heads < 1 || a->kv_heads > a->heads || a->heads % a->kv_heads != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "num_key_value_heads %d must divide num_attention_heads %d",
                       a->kv_heads, a->heads);
  if (a->pos == ZB_POS_ROPE && a->head_dim % 2 != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "rotary embeddings need an even head_dim (got %d)",
                       a->head_dim);
  if (a->fused_qkv && a->kv_heads != a->heads)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "a fused qkv projection needs kv_heads == heads");
  if (!isfinite(a->norm_eps) || a->norm_eps <= 0 || a->norm_eps > 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "norm eps %g must be in (0, 1]", a->norm_eps);
  if (a->pos == ZB_POS_ROPE) {
    zb_err e = check_rope(&a->rope, diag);
    if (e != ZB_OK)
      return e;
  }
  return check_extent(a, diag);
}

void zb_rope_freqs(const zb_rope *r, int hd, float *inv) {
  const float two_pi = 6.283185307179586f;
  float factor = (float)r->factor, old_len = (float)r->original_max_positions;
  float low_wave = old_len / (float)r->low_freq_factor, high_wave = old_len / (float)r->high_freq_factor;
  for (int i = 0; i < hd / 2; i++) {
    float f = 1.0f / powf((float)r->theta, (float)(2 * i) / (float)hd);
    if (r->scaling == ZB_ROPE_LINEAR) {
      f /= factor;
    } else if (r->scaling == ZB_ROPE_LLAMA3) {
      float wave = two_pi / f;
      if (wave > low_wave) {
        f /= factor;
      } else if (wave >= high_wave) { /* between: a blend of the two */
        float smooth = (old_len / wave - (float)r->low_freq_factor) /
                       ((float)r->high_freq_factor - (float)r->low_freq_factor);
        f = (1.0f - smooth) * f / factor + smooth * f;
      }
    }
    inv[i] = f;
  }
}
