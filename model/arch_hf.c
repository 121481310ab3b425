/* arch_hf.c — an architecture from a Hugging Face config.json (zb_arch_hf.h;
 * docs/model.md, Architectures): every key is either used, known to
 * change nothing zb computes (metadata, token ids, dropout, which zb does
 * not apply and says so), or refused by name, so a model zb would compute
 * differently from transformers never starts. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zb_arch_hf.h"

/* Keys any config may carry that change nothing zb computes. */
static const char *const metadata_keys[] = {"architectures",
                                            "model_type",
                                            "transformers_version",
                                            "torch_dtype",
                                            "dtype",
                                            "bos_token_id",
                                            "eos_token_id",
                                            "pad_token_id",
                                            "use_cache",
                                            "initializer_range",
                                            "_name_or_path",
                                            "task_specific_params",
                                            "output_attentions",
                                            "output_hidden_states",
                                            "return_dict",
                                            "tokenizer_class",
                                            "id2label",
                                            "label2id",
                                            NULL};

/* Dropout rates: accepted, not applied (zb trains without dropout). */
static const char *const dropout_keys[] = {
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "summary_first_dropout", NULL};

static const char *const gpt2_keys[] = {"vocab_size",
                                        "n_positions",
                                        "n_embd",
                                        "n_layer",
                                        "n_head",
                                        "n_inner",
                                        "activation_function",
                                        "layer_norm_epsilon",
                                        "tie_word_embeddings",
                                        "n_ctx",
                                        "scale_attn_weights",
                                        "scale_attn_by_inverse_layer_idx",
                                        "reorder_and_upcast_attn",
                                        "add_cross_attention",
                                        "summary_type",
                                        "summary_use_proj",
                                        "summary_activation",
                                        "summary_proj_to_labels",
                                        NULL};

static const char *const llama_keys[] = {
    "vocab_size",        "hidden_size",         "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim",          "hidden_act",          "max_position_embeddings",
    "rms_norm_eps",      "rope_theta",          "rope_scaling",
    "rope_parameters",   "tie_word_embeddings", "attention_bias",
    "mlp_bias",          "pretraining_tp",      NULL};

static int listed(const char *const *list, const char *key) {
  for (int i = 0; list[i]; i++)
    if (strcmp(list[i], key) == 0)
      return 1;
  return 0;
}

/* An integer key: absent gives dflt (dflt < 0: required). */
static zb_err get_int(const zb_json *cfg, const char *key, long long dflt, long long lo, long long hi,
                      int *out, zb_diag *diag) {
  const zb_json *v = zb_json_get(cfg, key);
  if (!v || v->kind == ZB_JSON_NULL) {
    if (dflt < 0)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json has no %s", key);
    *out = (int)dflt;
    return ZB_OK;
  }
  if (v->kind != ZB_JSON_NUMBER || !v->is_integer)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s must be an integer, not a %s", key,
                       zb_json_kind_name(v->kind));
  if (v->integer < lo || v->integer > hi)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s %lld is out of range [%lld, %lld]", key,
                       v->integer, lo, hi);
  *out = (int)v->integer;
  return ZB_OK;
}

static zb_err get_num(const zb_json *cfg, const char *key, double dflt, double *out, zb_diag *diag) {
  const zb_json *v = zb_json_get(cfg, key);
  if (!v || v->kind == ZB_JSON_NULL) {
    *out = dflt;
    return ZB_OK;
  }
  if (v->kind != ZB_JSON_NUMBER || !isfinite(v->number))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s must be a finite number", key);
  *out = v->number;
  return ZB_OK;
}

static zb_err get_bool(const zb_json *cfg, const char *key, int dflt, int *out, zb_diag *diag) {
  const zb_json *v = zb_json_get(cfg, key);
  if (!v || v->kind == ZB_JSON_NULL) {
    *out = dflt;
    return ZB_OK;
  }
  if (v->kind != ZB_JSON_BOOL)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s must be true or false", key);
  *out = v->boolean;
  return ZB_OK;
}

/* A key whose only supported value is `want` (absent is fine). */
static zb_err require_bool(const zb_json *cfg, const char *key, int want, const char *why, zb_diag *diag) {
  int got = want;
  zb_err e = get_bool(cfg, key, want, &got, diag);
  if (e == ZB_OK && got != want)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "config.json %s: %s is not supported (%s)", key,
                       got ? "true" : "false", why);
  return e;
}

static zb_err require_string(const zb_json *cfg, const char *key, const char *const *allowed, zb_diag *diag) {
  const zb_json *v = zb_json_get(cfg, key);
  if (!v)
    return ZB_OK;
  if (v->kind != ZB_JSON_STRING)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s must be a string", key);
  if (listed(allowed, v->string))
    return ZB_OK;
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "config.json %s '%s' is not supported (zb computes %s)", key,
                     v->string, allowed[0]);
}

/* Every key of cfg is in known or the shared lists; dropout rates above
 * zero are noted in notes. */
static zb_err check_keys(const zb_json *cfg, const char *const *known, char *notes, size_t notes_len,
                         zb_diag *diag) {
  for (size_t i = 0; i < cfg->n; i++) {
    const char *key = cfg->keys[i];
    if (listed(known, key) || listed(metadata_keys, key))
      continue;
    if (!listed(dropout_keys, key))
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "config.json key '%s' is not supported for this architecture (zb would compute a "
                         "different model)",
                         key);
    const zb_json *v = &cfg->items[i];
    if (v->kind != ZB_JSON_NUMBER)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json %s must be a number", key);
    if (v->number != 0 && notes && strlen(notes) + strlen(key) + 40 < notes_len)
      snprintf(notes + strlen(notes), notes_len - strlen(notes),
               "%s%s %g not applied (zb trains without dropout)", notes[0] ? "; " : "", key, v->number);
  }
  return ZB_OK;
}

static zb_err gpt2_from_hf(const zb_json *cfg, zb_arch *a, zb_diag *diag) {
  static const char *const gelu_tanh[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
  zb_err e;
  int n_inner = 0;
  *a = (zb_arch){.kind = ZB_ARCH_GPT2,
                 .norm = ZB_NORM_LAYER,
                 .pos = ZB_POS_LEARNED,
                 .mlp = ZB_MLP_GELU_TANH,
                 .biases = 1,
                 .conv1d = 1,
                 .fused_qkv = 1};
  if ((e = get_int(cfg, "vocab_size", -1, 1, 1 << 24, &a->vocab, diag)) ||
      (e = get_int(cfg, "n_positions", -1, 1, 1 << 24, &a->max_positions, diag)) ||
      (e = get_int(cfg, "n_embd", -1, 1, 1 << 20, &a->hidden, diag)) ||
      (e = get_int(cfg, "n_layer", -1, 0, 1 << 16, &a->layers, diag)) ||
      (e = get_int(cfg, "n_head", -1, 1, 1 << 16, &a->heads, diag)) ||
      (e = get_int(cfg, "n_inner", 0, 0, 1 << 24, &n_inner, diag)) ||
      (e = get_num(cfg, "layer_norm_epsilon", 1e-5, &a->norm_eps, diag)) ||
      (e = get_bool(cfg, "tie_word_embeddings", 1, &a->tied, diag)) ||
      (e = require_string(cfg, "activation_function", gelu_tanh, diag)) ||
      (e = require_bool(cfg, "scale_attn_weights", 1, "scores are always divided by sqrt(head_dim)", diag)) ||
      (e = require_bool(cfg, "scale_attn_by_inverse_layer_idx", 0, "no per-layer score scaling", diag)) ||
      (e = require_bool(cfg, "add_cross_attention", 0, "a decoder without cross-attention", diag)))
    return e;
  int n_ctx = a->max_positions;
  if ((e = get_int(cfg, "n_ctx", a->max_positions, 1, 1 << 24, &n_ctx, diag)))
    return e;
  if (n_ctx != a->max_positions)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "config.json n_ctx %d differs from n_positions %d", n_ctx,
                       a->max_positions);
  if (a->hidden % a->heads != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json n_embd %d is not a multiple of n_head %d",
                       a->hidden, a->heads);
  a->kv_heads = a->heads;
  a->head_dim = a->hidden / a->heads;
  a->intermediate = n_inner ? n_inner : 4 * a->hidden;
  /* rows of the embedding rounded up so its products run on aligned
   * shapes; the padding rows are zero and masked out of the softmax */
  a->vocab_padded = (a->vocab + 127) / 128 * 128;
  return ZB_OK;
}

/* rope_scaling (transformers 4) or rope_parameters (5): a type and its
 * numbers; the parameters object may also carry rope_theta. */
static zb_err rope_from_hf(const zb_json *r, zb_rope *rope, zb_diag *diag) {
  if (!r || r->kind == ZB_JSON_NULL)
    return ZB_OK;
  if (r->kind != ZB_JSON_OBJECT)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json rope_scaling must be an object or null");
  const zb_json *t = zb_json_get(r, "rope_type");
  if (!t)
    t = zb_json_get(r, "type");
  const char *type = t && t->kind == ZB_JSON_STRING ? t->string : "default";
  zb_err e;
  if ((e = get_num(r, "rope_theta", rope->theta, &rope->theta, diag)))
    return e;
  if (strcmp(type, "default") == 0)
    rope->scaling = ZB_ROPE_NONE;
  else if (strcmp(type, "linear") == 0)
    rope->scaling = ZB_ROPE_LINEAR;
  else if (strcmp(type, "llama3") == 0)
    rope->scaling = ZB_ROPE_LLAMA3;
  else
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "config.json rope_scaling type '%s' is not supported (default, linear, llama3 are)",
                       type);
  if ((e = get_num(r, "factor", 1, &rope->factor, diag)) ||
      (e = get_num(r, "low_freq_factor", 1, &rope->low_freq_factor, diag)) ||
      (e = get_num(r, "high_freq_factor", 4, &rope->high_freq_factor, diag)))
    return e;
  return get_int(r, "original_max_position_embeddings", 8192, 1, 1 << 24, &rope->original_max_positions,
                 diag);
}

static zb_err llama_from_hf(const zb_json *cfg, zb_arch *a, zb_diag *diag) {
  static const char *const silu[] = {"silu", NULL};
  zb_err e;
  *a = (zb_arch){.kind = ZB_ARCH_LLAMA,
                 .norm = ZB_NORM_RMS,
                 .pos = ZB_POS_ROPE,
                 .mlp = ZB_MLP_SWIGLU,
                 .rope = {.theta = 10000, .factor = 1}};
  if ((e = get_int(cfg, "vocab_size", -1, 1, 1 << 24, &a->vocab, diag)) ||
      (e = get_int(cfg, "hidden_size", -1, 1, 1 << 20, &a->hidden, diag)) ||
      (e = get_int(cfg, "intermediate_size", -1, 1, 1 << 24, &a->intermediate, diag)) ||
      (e = get_int(cfg, "num_hidden_layers", -1, 0, 1 << 16, &a->layers, diag)) ||
      (e = get_int(cfg, "num_attention_heads", -1, 1, 1 << 16, &a->heads, diag)) ||
      (e = get_int(cfg, "num_key_value_heads", a->heads, 1, 1 << 16, &a->kv_heads, diag)) ||
      (e = get_int(cfg, "max_position_embeddings", -1, 1, 1 << 24, &a->max_positions, diag)) ||
      (e = get_num(cfg, "rms_norm_eps", 1e-6, &a->norm_eps, diag)) ||
      (e = get_num(cfg, "rope_theta", 10000, &a->rope.theta, diag)) ||
      (e = get_bool(cfg, "tie_word_embeddings", 0, &a->tied, diag)) ||
      (e = require_string(cfg, "hidden_act", silu, diag)) ||
      (e = require_bool(cfg, "attention_bias", 0, "q, k, v and o have no biases", diag)) ||
      (e = require_bool(cfg, "mlp_bias", 0, "the MLP has no biases", diag)))
    return e;
  int tp = 1;
  if ((e = get_int(cfg, "pretraining_tp", 1, 1, 1 << 16, &tp, diag)))
    return e;
  if (tp != 1)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "config.json pretraining_tp %d is not supported (1 is)", tp);
  if ((e = rope_from_hf(zb_json_get(cfg, "rope_scaling"), &a->rope, diag)) ||
      (e = rope_from_hf(zb_json_get(cfg, "rope_parameters"), &a->rope, diag)))
    return e;
  if (!zb_json_get(cfg, "head_dim") && a->hidden % a->heads != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "config.json hidden_size %d is not a multiple of num_attention_heads %d", a->hidden,
                       a->heads);
  if ((e = get_int(cfg, "head_dim", a->hidden / a->heads, 1, 1 << 16, &a->head_dim, diag)))
    return e;
  a->vocab_padded = a->vocab;
  return ZB_OK;
}

zb_err zb_arch_from_hf(const zb_json *cfg, zb_arch *a, char *notes, size_t notes_len, zb_diag *diag) {
  if (notes && notes_len)
    notes[0] = 0;
  if (!cfg || cfg->kind != ZB_JSON_OBJECT)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json must hold an object");
  const zb_json *mt = zb_json_get(cfg, "model_type");
  if (!mt || mt->kind != ZB_JSON_STRING)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "config.json has no model_type string");
  zb_err e;
  if (strcmp(mt->string, "gpt2") == 0)
    e = check_keys(cfg, gpt2_keys, notes, notes_len, diag);
  else if (strcmp(mt->string, "llama") == 0)
    e = check_keys(cfg, llama_keys, notes, notes_len, diag);
  else
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "config.json model_type '%s' is not supported (gpt2, llama are)", mt->string);
  if (e != ZB_OK)
    return e;
  e = strcmp(mt->string, "gpt2") == 0 ? gpt2_from_hf(cfg, a, diag) : llama_from_hf(cfg, a, diag);
  return e != ZB_OK ? e : zb_arch_check(a, diag);
}

zb_err zb_arch_from_hf_text(const char *text, size_t len, zb_arch *a, char *notes, size_t notes_len,
                            zb_diag *diag) {
  zb_json *cfg = NULL;
  zb_err e = zb_json_parse(text, len, &cfg, diag);
  if (e == ZB_OK)
    e = zb_arch_from_hf(cfg, a, notes, notes_len, diag);
  zb_json_free(cfg);
  return e;
}
