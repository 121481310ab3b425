/* arch_weights.c — a stage's tensors from and to Hugging Face checkpoints
 * (zb_arch_weights.h; docs/model.md, Architectures): names and shapes
 * from zb_arch_tensor, Conv1D weights transposed, padded vocabulary rows
 * zeroed on the way in and dropped on the way out, and config.json. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_arch_weights.h"

/* The shape transformers stores t in: [cols] for a vector, else
 * [hf_rows, hf_cols], or [hf_cols, hf_rows] for Conv1D. */
static int hf_shape(const zb_arch_tensor *t, uint64_t shape[2]) {
  if (t->hf_vector) {
    shape[0] = (uint64_t)t->hf_cols;
    return 1;
  }
  shape[0] = (uint64_t)(t->hf_transposed ? t->hf_cols : t->hf_rows);
  shape[1] = (uint64_t)(t->hf_transposed ? t->hf_rows : t->hf_cols);
  return 2;
}

static void shape_str(char *s, size_t n, int ndim, const uint64_t *shape) {
  int k = snprintf(s, n, "[");
  for (int i = 0; i < ndim && k > 0 && (size_t)k < n; i++)
    k += snprintf(s + k, n - (size_t)k, "%s%" PRIu64, i ? ", " : "", shape[i]);
  if (k > 0 && (size_t)k < n)
    snprintf(s + k, n - (size_t)k, "]");
}

/* dst [cols, rows] -> [rows, cols] in place through a scratch copy. */
static void transpose(float *m, int rows_out, int cols_out) {
  size_t n = (size_t)rows_out * (size_t)cols_out;
  float *src = zb_malloc(n * sizeof *src);
  memcpy(src, m, n * sizeof *src);
  for (int r = 0; r < rows_out; r++)
    for (int c = 0; c < cols_out; c++)
      m[(size_t)r * cols_out + c] = src[(size_t)c * rows_out + r];
  free(src);
}

static zb_err read_one(const zb_arch_tensor *t, zb_st_checkpoint *ck, float *dst, zb_diag *diag) {
  const zb_st_tensor *x = NULL;
  zb_err e = zb_st_checkpoint_find(ck, t->hf_name, &x, diag);
  if (e != ZB_OK)
    return e;
  uint64_t want[2];
  int nd = hf_shape(t, want);
  if (x->ndim != nd || x->shape[0] != want[0] || (nd == 2 && x->shape[1] != want[1])) {
    char got_s[64], want_s[64];
    shape_str(got_s, sizeof got_s, x->ndim, x->shape);
    shape_str(want_s, sizeof want_s, nd, want);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "checkpoint tensor %s has shape %s; the model needs %s",
                       t->hf_name, got_s, want_s);
  }
  size_t stored = (size_t)t->hf_rows * (size_t)t->hf_cols, all = (size_t)t->rows * (size_t)t->cols;
  if ((e = zb_st_checkpoint_read_f32(ck, t->hf_name, dst, stored, diag)) != ZB_OK)
    return e;
  if (t->hf_transposed)
    transpose(dst, t->hf_rows, t->hf_cols);
  memset(dst + stored, 0, (all - stored) * sizeof *dst); /* padding rows */
  return ZB_OK;
}

zb_err zb_arch_read_tensors(const zb_arch_tensor *ts, int n, zb_st_checkpoint *ck, float *const *dst,
                            zb_diag *diag) {
  for (int i = 0; i < n; i++) {
    zb_err e = read_one(&ts[i], ck, dst[i], diag);
    if (e != ZB_OK)
      return e;
  }
  return ZB_OK;
}

zb_err zb_arch_hf_entries(const zb_arch_tensor *ts, int n, const float *const *src, zb_st_entry *out,
                          size_t *n_out, float ***owned, zb_diag *diag) {
  (void)diag;
  float **own = zb_calloc((size_t)(n > 0 ? n : 1), sizeof *own);
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    const zb_arch_tensor *t = &ts[i];
    if (t->tied_copy)
      continue;
    zb_st_entry *en = &out[k++];
    memset(en, 0, sizeof *en);
    en->name = t->hf_name;
    en->ndim = hf_shape(t, en->shape);
    en->data = src[i]; /* the first hf_rows rows are what the file holds */
    if (t->hf_transposed) {
      size_t len = (size_t)t->hf_rows * (size_t)t->hf_cols;
      own[i] = zb_malloc(len * sizeof(float));
      for (int r = 0; r < t->hf_rows; r++) /* [rows, cols] -> [cols, rows] */
        for (int c = 0; c < t->hf_cols; c++)
          own[i][(size_t)c * t->hf_rows + r] = src[i][(size_t)r * t->cols + c];
      en->data = own[i];
    }
  }
  *n_out = k;
  *owned = own;
  return ZB_OK;
}

void zb_arch_entries_free(float **owned, int n) {
  if (!owned)
    return;
  for (int i = 0; i < n; i++)
    free(owned[i]);
  free(owned);
}

void zb_arch_shard_name(int stage, int n_stages, char *buf, size_t len) {
  snprintf(buf, len, "model-%05d-of-%05d.safetensors", stage + 1, n_stages);
}

/* Appends stage s's "name": "file" pairs and counts their fp32 bytes. */
static zb_err index_stage(const zb_arch *a, int s, int n_stages, zb_buf *b, bool *comma, uint64_t *bytes,
                          zb_diag *diag) {
  int n = 0;
  zb_err e = zb_arch_stage_tensors(a, s, n_stages, NULL, 0, &n, diag);
  if (e != ZB_OK)
    return e;
  zb_arch_tensor *ts = zb_calloc((size_t)(n ? n : 1), sizeof *ts);
  e = zb_arch_stage_tensors(a, s, n_stages, ts, n, &n, diag);
  char file[64];
  zb_arch_shard_name(s, n_stages, file, sizeof file);
  for (int i = 0; e == ZB_OK && i < n; i++) {
    if (ts[i].tied_copy)
      continue;
    zb_buf_puts(b, *comma ? ", " : "");
    zb_buf_json_str(b, ts[i].hf_name);
    zb_buf_puts(b, ": ");
    zb_buf_json_str(b, file);
    *comma = true;
    *bytes += 4ull * (uint64_t)ts[i].hf_rows * (uint64_t)ts[i].hf_cols;
  }
  free(ts);
  return e;
}

zb_err zb_arch_hf_index(const zb_arch *a, int n_stages, zb_buf *b, zb_diag *diag) {
  zb_buf map = {0};
  bool comma = false;
  uint64_t bytes = 0;
  zb_err e = ZB_OK;
  for (int s = 0; e == ZB_OK && s < n_stages; s++)
    e = index_stage(a, s, n_stages, &map, &comma, &bytes, diag);
  if (e == ZB_OK)
    zb_buf_printf(b, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {%s}}\n",
                  (unsigned long long)bytes, map.data ? map.data : "");
  zb_buf_free(&map);
  return e;
}

static void rope_json(const zb_rope *r, zb_buf *b) {
  if (r->scaling == ZB_ROPE_NONE) {
    zb_buf_puts(b, "null");
    return;
  }
  zb_buf_puts(b, "{\"rope_type\": ");
  zb_buf_json_str(b, r->scaling == ZB_ROPE_LINEAR ? "linear" : "llama3");
  zb_buf_puts(b, ", \"factor\": ");
  zb_buf_json_num(b, r->factor);
  if (r->scaling == ZB_ROPE_LLAMA3) {
    zb_buf_puts(b, ", \"low_freq_factor\": ");
    zb_buf_json_num(b, r->low_freq_factor);
    zb_buf_puts(b, ", \"high_freq_factor\": ");
    zb_buf_json_num(b, r->high_freq_factor);
    zb_buf_printf(b, ", \"original_max_position_embeddings\": %d", r->original_max_positions);
  }
  zb_buf_puts(b, "}");
}

zb_err zb_arch_to_hf_json(const zb_arch *a, zb_buf *b, zb_diag *diag) {
  zb_err e = zb_arch_check(a, diag);
  if (e != ZB_OK)
    return e;
  if (a->kind == ZB_ARCH_GPT2) {
    zb_buf_printf(b,
                  "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"vocab_size\": %d, "
                  "\"n_positions\": %d, \"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"n_inner\": %d, "
                  "\"activation_function\": \"gelu_new\", \"resid_pdrop\": 0.0, \"embd_pdrop\": 0.0, "
                  "\"attn_pdrop\": 0.0, \"tie_word_embeddings\": %s, \"layer_norm_epsilon\": ",
                  a->vocab, a->max_positions, a->hidden, a->layers, a->heads, a->intermediate,
                  a->tied ? "true" : "false");
    zb_buf_json_num(b, a->norm_eps);
    zb_buf_puts(b, "}\n");
    return ZB_OK;
  }
  if (a->kind != ZB_ARCH_LLAMA)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "the builtin model has no Hugging Face config");
  zb_buf_printf(b,
                "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": %d, "
                "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
                "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                "\"max_position_embeddings\": %d, \"hidden_act\": \"silu\", \"attention_bias\": false, "
                "\"mlp_bias\": false, \"tie_word_embeddings\": %s, \"rms_norm_eps\": ",
                a->vocab, a->hidden, a->intermediate, a->layers, a->heads, a->kv_heads, a->head_dim,
                a->max_positions, a->tied ? "true" : "false");
  zb_buf_json_num(b, a->norm_eps);
  zb_buf_puts(b, ", \"rope_theta\": ");
  zb_buf_json_num(b, a->rope.theta);
  zb_buf_puts(b, ", \"rope_scaling\": ");
  rope_json(&a->rope, b);
  zb_buf_puts(b, "}\n");
  return ZB_OK;
}
