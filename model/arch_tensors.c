/* arch_tensors.c — which parameter tensors each stage of an architecture
 * holds, their shapes as zb computes with them, and the names and layouts
 * Hugging Face transformers gives them (zb_arch.h; docs/model.md,
 * Architectures). The builtin model keeps zb's own names, which its
 * checkpoints already use. */
#include <stdio.h>
#include <string.h>

#include "zb_arch.h"

/* One kind's names: outside blocks, and a block's tensors by role (NULL:
 * the kind has no such tensor). A block name is printf'd with the layer. */
typedef struct kind_names {
  const char *embed, *pos, *norm_f_w, *norm_f_b, *head;
  const char *block[ZB_T_ROLE_COUNT];
} kind_names;

static const kind_names names_of[ZB_ARCH_KIND_COUNT] = {
    [ZB_ARCH_BUILTIN] = {.embed = "embed.weight",
                         .pos = "pos_embed.weight",
                         .norm_f_w = "ln_f.weight",
                         .norm_f_b = "ln_f.bias",
                         .head = "head.weight",
                         .block = {[ZB_T_NORM1_W] = "layer%d.ln1.weight",
                                   [ZB_T_NORM1_B] = "layer%d.ln1.bias",
                                   [ZB_T_QKV_W] = "layer%d.attn.qkv.weight",
                                   [ZB_T_QKV_B] = "layer%d.attn.qkv.bias",
                                   [ZB_T_O_W] = "layer%d.attn.proj.weight",
                                   [ZB_T_O_B] = "layer%d.attn.proj.bias",
                                   [ZB_T_NORM2_W] = "layer%d.ln2.weight",
                                   [ZB_T_NORM2_B] = "layer%d.ln2.bias",
                                   [ZB_T_UP_W] = "layer%d.mlp.fc1.weight",
                                   [ZB_T_UP_B] = "layer%d.mlp.fc1.bias",
                                   [ZB_T_DOWN_W] = "layer%d.mlp.fc2.weight",
                                   [ZB_T_DOWN_B] = "layer%d.mlp.fc2.bias"}},
    [ZB_ARCH_GPT2] = {.embed = "transformer.wte.weight",
                      .pos = "transformer.wpe.weight",
                      .norm_f_w = "transformer.ln_f.weight",
                      .norm_f_b = "transformer.ln_f.bias",
                      .head = "lm_head.weight",
                      .block = {[ZB_T_NORM1_W] = "transformer.h.%d.ln_1.weight",
                                [ZB_T_NORM1_B] = "transformer.h.%d.ln_1.bias",
                                [ZB_T_QKV_W] = "transformer.h.%d.attn.c_attn.weight",
                                [ZB_T_QKV_B] = "transformer.h.%d.attn.c_attn.bias",
                                [ZB_T_O_W] = "transformer.h.%d.attn.c_proj.weight",
                                [ZB_T_O_B] = "transformer.h.%d.attn.c_proj.bias",
                                [ZB_T_NORM2_W] = "transformer.h.%d.ln_2.weight",
                                [ZB_T_NORM2_B] = "transformer.h.%d.ln_2.bias",
                                [ZB_T_UP_W] = "transformer.h.%d.mlp.c_fc.weight",
                                [ZB_T_UP_B] = "transformer.h.%d.mlp.c_fc.bias",
                                [ZB_T_DOWN_W] = "transformer.h.%d.mlp.c_proj.weight",
                                [ZB_T_DOWN_B] = "transformer.h.%d.mlp.c_proj.bias"}},
    [ZB_ARCH_LLAMA] = {.embed = "model.embed_tokens.weight",
                       .norm_f_w = "model.norm.weight",
                       .head = "lm_head.weight",
                       .block = {[ZB_T_NORM1_W] = "model.layers.%d.input_layernorm.weight",
                                 [ZB_T_Q_W] = "model.layers.%d.self_attn.q_proj.weight",
                                 [ZB_T_K_W] = "model.layers.%d.self_attn.k_proj.weight",
                                 [ZB_T_V_W] = "model.layers.%d.self_attn.v_proj.weight",
                                 [ZB_T_O_W] = "model.layers.%d.self_attn.o_proj.weight",
                                 [ZB_T_NORM2_W] = "model.layers.%d.post_attention_layernorm.weight",
                                 [ZB_T_GATE_W] = "model.layers.%d.mlp.gate_proj.weight",
                                 [ZB_T_UP_W] = "model.layers.%d.mlp.up_proj.weight",
                                 [ZB_T_DOWN_W] = "model.layers.%d.mlp.down_proj.weight"}},
};

/* [rows, cols] of a role as zb computes with it (a linear layer's weight
 * [out, in]; a vector [1, n]). */
static void role_shape(const zb_arch *a, zb_tensor_role r, int *rows, int *cols) {
  int h = a->hidden, q = a->heads * a->head_dim, kv = a->kv_heads * a->head_dim, in = a->intermediate;
  int vec = 0;
  switch (r) {
  case ZB_T_EMBED:
  case ZB_T_HEAD:
    *rows = a->vocab_padded;
    *cols = h;
    return;
  case ZB_T_POS:
    *rows = a->max_positions;
    *cols = h;
    return;
  case ZB_T_QKV_W:
    *rows = q + 2 * kv;
    *cols = h;
    return;
  case ZB_T_QKV_B: vec = q + 2 * kv; break;
  case ZB_T_Q_W:
    *rows = q;
    *cols = h;
    return;
  case ZB_T_K_W:
  case ZB_T_V_W:
    *rows = kv;
    *cols = h;
    return;
  case ZB_T_O_W:
    *rows = h;
    *cols = q;
    return;
  case ZB_T_UP_W:
  case ZB_T_GATE_W:
    *rows = in;
    *cols = h;
    return;
  case ZB_T_UP_B: vec = in; break;
  case ZB_T_DOWN_W:
    *rows = h;
    *cols = in;
    return;
  default: vec = h; break; /* norms, O_B, DOWN_B */
  }
  *rows = 1;
  *cols = vec;
}

static int is_vector(zb_tensor_role r) {
  return r != ZB_T_EMBED && r != ZB_T_HEAD && r != ZB_T_POS && r != ZB_T_QKV_W && r != ZB_T_Q_W &&
         r != ZB_T_K_W && r != ZB_T_V_W && r != ZB_T_O_W && r != ZB_T_UP_W && r != ZB_T_GATE_W &&
         r != ZB_T_DOWN_W;
}

/* Fills one entry from its role (name already formatted). */
static zb_arch_tensor make(const zb_arch *a, zb_tensor_role r, int layer, const char *name) {
  zb_arch_tensor t = {.role = r, .layer = layer};
  snprintf(t.hf_name, sizeof t.hf_name, "%s", name);
  role_shape(a, r, &t.rows, &t.cols);
  t.hf_rows = (r == ZB_T_EMBED || r == ZB_T_HEAD) ? a->vocab : t.rows;
  t.hf_cols = t.cols;
  t.hf_vector = is_vector(r);
  t.hf_transposed = a->conv1d && !t.hf_vector && r != ZB_T_EMBED && r != ZB_T_HEAD && r != ZB_T_POS;
  return t;
}

typedef struct tensor_list {
  zb_arch_tensor *out;
  int cap, n;
} tensor_list;

static void push(tensor_list *l, zb_arch_tensor t) {
  if (l->n < l->cap)
    l->out[l->n] = t;
  l->n++;
}

static void push_named(tensor_list *l, const zb_arch *a, zb_tensor_role r, const char *name) {
  if (name)
    push(l, make(a, r, -1, name));
}

static void push_block(tensor_list *l, const zb_arch *a, int layer) {
  const kind_names *k = &names_of[a->kind];
  for (int r = 0; r < ZB_T_ROLE_COUNT; r++) {
    const char *fmt = k->block[r];
    if (!fmt || (!a->biases && (r == ZB_T_NORM1_B || r == ZB_T_NORM2_B || r == ZB_T_QKV_B || r == ZB_T_O_B ||
                                r == ZB_T_UP_B || r == ZB_T_DOWN_B)))
      continue;
    char name[ZB_ARCH_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    push(l, make(a, (zb_tensor_role)r, layer, name));
  }
}

zb_err zb_arch_stage_tensors(const zb_arch *a, int stage, int n_stages, zb_arch_tensor *out, int cap, int *n,
                             zb_diag *diag) {
  zb_err e = zb_arch_check(a, diag);
  if (e != ZB_OK)
    return e;
  int first, count;
  if (zb_arch_layer_range(a->layers, n_stages, stage, &first, &count) != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d of %d is out of range", stage, n_stages);
  const kind_names *k = &names_of[a->kind];
  tensor_list l = {out, cap, 0};
  if (stage == 0) {
    push_named(&l, a, ZB_T_EMBED, k->embed);
    if (a->pos == ZB_POS_LEARNED)
      push_named(&l, a, ZB_T_POS, k->pos);
  }
  for (int i = 0; i < count; i++)
    push_block(&l, a, first + i);
  if (stage == n_stages - 1) {
    push_named(&l, a, ZB_T_NORM_F_W, k->norm_f_w);
    if (a->biases)
      push_named(&l, a, ZB_T_NORM_F_B, k->norm_f_b);
    if (!a->tied) {
      push_named(&l, a, ZB_T_HEAD, k->head);
    } else if (n_stages > 1) { /* the tied weight's second holder */
      zb_arch_tensor t = make(a, ZB_T_HEAD, -1, k->embed);
      t.tied_copy = 1;
      push(&l, t);
    }
  }
  *n = l.n;
  return ZB_OK;
}

/* The layer of a block tensor named `name` under format fmt ("...%d..."),
 * or -1 when the name does not have that form. */
static int match_layer(const char *fmt, const char *name) {
  const char *hole = strstr(fmt, "%d");
  size_t pre = (size_t)(hole - fmt);
  if (strncmp(name, fmt, pre) != 0)
    return -1;
  const char *p = name + pre;
  long layer = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9' && layer < 1000000; p++, digits++)
    layer = layer * 10 + (*p - '0');
  if (digits == 0 || (digits > 1 && name[pre] == '0') || strcmp(p, hole + 2) != 0)
    return -1;
  return (int)layer;
}

static int stage_of_layer(const zb_arch *a, int n_stages, int layer) {
  int s = n_stages - 1, first, count;
  while (s > 0 && zb_arch_layer_range(a->layers, n_stages, s, &first, &count) == ZB_OK && first > layer)
    s--;
  return s;
}

zb_err zb_arch_tensor_stage(const zb_arch *a, int n_stages, const char *hf_name, int *stage, zb_diag *diag) {
  zb_err e = zb_arch_check(a, diag);
  if (e != ZB_OK)
    return e;
  if (n_stages < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%d stages", n_stages);
  const kind_names *k = &names_of[a->kind];
  int head = !a->tied && k->head && strcmp(hf_name, k->head) == 0;
  int norm_f = (k->norm_f_w && strcmp(hf_name, k->norm_f_w) == 0) ||
               (a->biases && k->norm_f_b && strcmp(hf_name, k->norm_f_b) == 0);
  int pos = a->pos == ZB_POS_LEARNED && k->pos && strcmp(hf_name, k->pos) == 0;
  if (strcmp(hf_name, k->embed) == 0 || pos) {
    *stage = 0;
    return ZB_OK;
  }
  if (head || norm_f) {
    *stage = n_stages - 1;
    return ZB_OK;
  }
  zb_arch_tensor probe[ZB_T_ROLE_COUNT];
  tensor_list l = {probe, ZB_T_ROLE_COUNT, 0};
  for (int r = 0; r < ZB_T_ROLE_COUNT; r++) {
    int layer = k->block[r] ? match_layer(k->block[r], hf_name) : -1;
    if (layer < 0 || layer >= a->layers)
      continue;
    l.n = 0; /* the tensor exists only if this kind's block lists it (biases) */
    push_block(&l, a, layer);
    for (int i = 0; i < l.n; i++)
      if (strcmp(probe[i].hf_name, hf_name) == 0) {
        *stage = stage_of_layer(a, n_stages, layer);
        return ZB_OK;
      }
  }
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "the %s model has no tensor '%s'", zb_arch_kind_name(a->kind),
                     hf_name);
}

int64_t zb_arch_param_count(const zb_arch *a) {
  int64_t total = 0;
  int n = 0;
  if (zb_arch_stage_tensors(a, 0, 1, NULL, 0, &n, NULL) != ZB_OK)
    return -1;
  /* one block's tensors, times the blocks, plus the rest */
  zb_arch_tensor one[ZB_T_ROLE_COUNT];
  tensor_list l = {one, ZB_T_ROLE_COUNT, 0};
  push_block(&l, a, 0);
  for (int i = 0; i < l.n; i++)
    total += (int64_t)one[i].hf_rows * one[i].hf_cols * a->layers;
  const kind_names *k = &names_of[a->kind];
  zb_arch_tensor outer[4];
  tensor_list o = {outer, 4, 0};
  push_named(&o, a, ZB_T_EMBED, k->embed);
  if (a->pos == ZB_POS_LEARNED)
    push_named(&o, a, ZB_T_POS, k->pos);
  push_named(&o, a, ZB_T_NORM_F_W, k->norm_f_w);
  if (a->biases)
    push_named(&o, a, ZB_T_NORM_F_B, k->norm_f_b);
  for (int i = 0; i < o.n; i++)
    total += (int64_t)outer[i].hf_rows * outer[i].hf_cols;
  if (!a->tied)
    total += (int64_t)a->vocab * a->hidden;
  return total;
}
