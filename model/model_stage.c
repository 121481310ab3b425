/* model_stage.c — a model stage's parameters (table layout and seeded
 * initialisation), its creation and freeing on its device, its accessors
 * and the host mirror of a non-host device's parameters and gradients
 * (zb_model.h; the layout is in model_internal.h; docs/model.md, Devices). */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "zb_alloc.h"
#include "zb_arch.h"
#include "zb_blas.h"
#include "zb_names.h"

/* ---- threads ---------------------------------------------------------- */

static atomic_int model_threads_set;

void zb_model_set_threads(int n) {
  zb_blas_set_threads(n);
  atomic_store(&model_threads_set, 1);
}

/* ---- parameters ------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
  return h;
}

/* Uniform in [0, 1) from (key, i) alone: a counter-based generator, so an
 * element's value does not depend on which stage initialises it. */
static double unit_at(uint64_t key, uint64_t i) {
  return (double)(splitmix64(key ^ splitmix64(i)) >> 11) * (1.0 / 9007199254740992.0);
}

typedef enum { INIT_ZERO, INIT_ONE, INIT_NORMAL } init_kind;

static void init_tensor(zb_model_tensor *t, uint64_t seed, init_kind kind, double std) {
  uint64_t key = splitmix64(seed) ^ fnv1a(t->name);
  for (size_t i = 0; i < t->numel; i++) {
    if (kind == INIT_NORMAL) {
      double u1 = 1.0 - unit_at(key, 2 * (uint64_t)i), u2 = unit_at(key, 2 * (uint64_t)i + 1);
      t->param[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    } else {
      t->param[i] = kind == INIT_ONE ? 1.0f : 0.0f;
    }
  }
}

/* Device memory for the stage's own buffers (parameters, workspace); NULL
 * and st->err set when the device cannot allocate. */
static void *dev_alloc(zb_model_stage *st, size_t bytes) {
  void *p = NULL;
  MODEL_DEV(st, alloc, bytes, &p);
  return st->err == ZB_OK ? p : NULL;
}

static void dev_free(zb_model_stage *st, void *p) {
  if (p)
    st->dev->ops->free(st->dev->self, p);
}

/* How a tensor of role r starts (GPT-2's scheme, docs/model.md, Model):
 * norm gains 1, biases 0, weights N(0, std), residual projections
 * N(0, std / sqrt(2 layers)), learned positions N(0, std / 2). */
static void init_of(const zb_arch *a, zb_tensor_role r, init_kind *kind, double *sd) {
  double std = 0.02;
  *kind = INIT_NORMAL;
  *sd = std;
  switch (r) {
  case ZB_T_NORM1_W:
  case ZB_T_NORM2_W:
  case ZB_T_NORM_F_W: *kind = INIT_ONE; break;
  case ZB_T_NORM1_B:
  case ZB_T_NORM2_B:
  case ZB_T_NORM_F_B:
  case ZB_T_QKV_B:
  case ZB_T_O_B:
  case ZB_T_UP_B:
  case ZB_T_DOWN_B: *kind = INIT_ZERO; break;
  case ZB_T_O_W:
  case ZB_T_DOWN_W: *sd = std / sqrt(2.0 * (a->layers > 0 ? a->layers : 1)); break;
  case ZB_T_POS: *sd = std / 2; break;
  default: break;
  }
}

/* Table indices by role: the embeddings, the final norm and head, and
 * each block's (st->t_block). A tied head is the embedding on a one-stage
 * partition, else the last stage's own copy. */
static void index_roles(zb_model_stage *st, const zb_arch_tensor *ts, int n) {
  st->t_embed = st->t_pos = st->t_lnf = st->t_lnf_b = st->t_head = -1;
  size_t cells = (size_t)(st->n_layers > 0 ? st->n_layers : 1) * ZB_T_ROLE_COUNT;
  st->t_block = zb_malloc(cells * sizeof *st->t_block);
  for (size_t k = 0; k < cells; k++)
    st->t_block[k] = -1;
  for (int i = 0; i < n; i++) {
    switch (ts[i].role) {
    case ZB_T_EMBED: st->t_embed = i; break;
    case ZB_T_POS: st->t_pos = i; break;
    case ZB_T_NORM_F_W: st->t_lnf = i; break;
    case ZB_T_NORM_F_B: st->t_lnf_b = i; break;
    case ZB_T_HEAD: st->t_head = i; break;
    default: st->t_block[(ts[i].layer - st->first_layer) * ZB_T_ROLE_COUNT + ts[i].role] = i; break;
    }
  }
  if (st->is_last && st->t_head < 0)
    st->t_head = st->t_embed;
}

/* Fills the table from the architecture's list and initialises every
 * tensor; padded vocabulary rows stay zero. */
static void fill_tensors(zb_model_stage *st, const zb_arch_tensor *ts, int n) {
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    zb_model_tensor *t = &st->tensors[i];
    snprintf(t->name, sizeof t->name, "%s", ts[i].hf_name);
    t->rows = ts[i].rows;
    t->cols = ts[i].cols;
    t->numel = (size_t)t->rows * (size_t)t->cols;
    t->param = st->params + off;
    t->grad = st->grads + off;
    off += t->numel;
    init_kind kind;
    double sd;
    init_of(&st->arch, ts[i].role, &kind, &sd);
    zb_model_tensor live = *t; /* rows past the vocabulary stay zero */
    live.numel = (size_t)ts[i].hf_rows * (size_t)ts[i].hf_cols;
    init_tensor(&live, st->cfg.seed, kind, sd);
    memset(t->param + live.numel, 0, (t->numel - live.numel) * sizeof(float));
  }
}

/* Builds the tensor table and the flat parameter and gradient arrays. */
static void build_tensors(zb_model_stage *st) {
  int n = 0;
  zb_arch_stage_tensors(&st->arch, st->stage, st->n_stages, NULL, 0, &n, NULL);
  zb_arch_tensor *ts = zb_calloc(n ? (size_t)n : 1, sizeof *ts);
  zb_arch_stage_tensors(&st->arch, st->stage, st->n_stages, ts, n, &n, NULL);
  index_roles(st, ts, n);
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += (size_t)ts[i].rows * (size_t)ts[i].cols;
  st->n_tensors = n;
  st->n_params = total;
  st->tensors = zb_calloc(n ? (size_t)n : 1, sizeof *st->tensors);
  size_t bytes = (total ? total : 1) * sizeof(float);
  st->d_params = dev_alloc(st, bytes);
  st->d_grads = dev_alloc(st, bytes);
  MODEL_DEV(st, zero, st->d_grads, bytes);
  if (st->host) { /* the device memory is host memory: no mirror */
    st->params = st->d_params;
    st->grads = st->d_grads;
  } else {
    st->params = zb_calloc(total ? total : 1, sizeof(float));
    st->grads = zb_calloc(total ? total : 1, sizeof(float));
  }
  if (st->err != ZB_OK) /* the stage is freed; the table stays empty */
    st->n_tensors = 0;
  else
    fill_tensors(st, ts, n);
  free(ts);
  if (st->err == ZB_OK && !st->host)
    MODEL_DEV(st, copy, st->d_params, st->params, total * sizeof(float), ZB_COPY_H2D);
}

/* ---- the stage -------------------------------------------------------- */

zb_err zb_model_layer_range(int layers, int n_stages, int stage, int *first, int *count) {
  return zb_arch_layer_range(layers, n_stages, stage, first, count);
}

zb_err zb_model_tensor_stage(int layers, int n_stages, const char *name, int *stage) {
  if (layers < 0 || n_stages < 1)
    return ZB_ERR_INVALID_ARG;
  zb_arch names_only = zb_arch_builtin(256, 1, 1, layers, 1); /* the builtin's names depend on layers alone */
  return zb_arch_tensor_stage(&names_only, n_stages, name, stage, NULL);
}

/* The architecture a config asks for: cfg->arch, or the builtin model at
 * cfg's sizes; the config's sizes then follow the architecture. */
static zb_err resolve_arch(zb_model_config *c, zb_arch *a, zb_diag *diag) {
  if (!c->arch) {
    if (c->vocab < 1 || c->vocab > 256)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "model vocab %d: the builtin model's tokens are bytes (1..256)", c->vocab);
    if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads != 0)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model hidden %d must be a positive multiple of heads %d",
                         c->hidden, c->heads);
    *a = zb_arch_builtin(c->vocab, c->hidden, c->heads, c->layers, c->seq_len);
  } else {
    *a = *c->arch;
    c->vocab = a->vocab;
    c->hidden = a->hidden;
    c->heads = a->heads;
    c->layers = a->layers;
  }
  zb_err e = zb_arch_check(a, diag);
  if (e != ZB_OK)
    return e;
  if (c->seq_len > a->max_positions)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model seq_len %d is past the architecture's %d positions",
                       c->seq_len, a->max_positions);
  if (a->norm == ZB_NORM_LAYER && (float)a->norm_eps != ZBM_LN_EPS)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "LayerNorm eps %g is not supported (1e-05 is)", a->norm_eps);
  return ZB_OK;
}

static zb_err check_config(zb_model_config *c, zb_arch *a, zb_diag *diag) {
  if (c->layers < 0 || c->seq_len < 1 || c->batch < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model layers %d, seq_len %d, batch %d out of range",
                       c->layers, c->seq_len, c->batch);
  zb_err e = resolve_arch(c, a, diag);
  if (e != ZB_OK)
    return e;
  /* gemm dimensions and leading dimensions are ints. */
  int64_t n = (int64_t)c->batch * c->seq_len, qkv = (int64_t)(a->heads + 2 * a->kv_heads) * a->head_dim;
  int64_t wide = a->intermediate > qkv ? a->intermediate : qkv;
  if (n * (wide > a->vocab ? wide : a->vocab) > INT_MAX ||
      (int64_t)c->seq_len * c->seq_len * a->heads > INT_MAX)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model shape too large (a buffer past 2^31 elements)");
  if (!isfinite(c->loss_scale))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model loss_scale is not finite");
  return ZB_OK;
}

/* cos and sin of every (position, frequency) of rotary embeddings, as
 * transformers computes them in fp32: inverse frequencies theta^(-2i/d),
 * rescaled as rope_scaling says (zb_rope_freqs), times the position. */
static void rope_tables(zb_model_stage *st) {
  int t = st->cfg.seq_len, half = st->arch.head_dim / 2;
  size_t len = (size_t)t * (size_t)half;
  float *inv = zb_malloc((size_t)half * sizeof *inv), *tab = zb_malloc(2 * len * sizeof *tab);
  zb_rope_freqs(&st->arch.rope, st->arch.head_dim, inv);
  for (int p = 0; p < t; p++)
    for (int i = 0; i < half; i++) {
      float ang = (float)p * inv[i];
      tab[(size_t)p * half + i] = cosf(ang);
      tab[len + (size_t)p * half + i] = sinf(ang);
    }
  st->rope_cos = dev_alloc(st, len * sizeof(float));
  st->rope_sin = dev_alloc(st, len * sizeof(float));
  model_copy(st, st->rope_cos, tab, len * sizeof(float), ZB_COPY_H2D);
  model_copy(st, st->rope_sin, tab + len, len * sizeof(float), ZB_COPY_H2D);
  if (st->err == ZB_OK) /* tab is read by the copies: wait for them */
    st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  free(inv);
  free(tab);
}

/* The stage's workspace (model_internal.h), on the device. */
static void alloc_workspace(zb_model_stage *st) {
  const zb_model_config *c = &st->cfg;
  const zb_arch *a = &st->arch;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden, count = (size_t)st->n_layers;
  size_t attn = (size_t)a->heads * (size_t)a->head_dim, wa = attn > h ? attn : h;
  size_t big = count ? n * (size_t)a->intermediate : 1,
         tt = count && !st->flash ? (size_t)c->heads * c->seq_len * c->seq_len : 1;
  size_t head = count ? (st->flash ? n : (size_t)c->seq_len) * (size_t)st->qkv_cols : 1;
  size_t loss = st->is_last ? n : 1;
  st->ws_x = dev_alloc(st, n * h * sizeof(float));
  st->ws_a = dev_alloc(st, n * wa * sizeof(float));
  st->ws_big = dev_alloc(st, big * sizeof(float));
  st->ws_tt = dev_alloc(st, tt * sizeof(float));
  st->ws_head = dev_alloc(st, head * sizeof(float));
  st->ws_loss = dev_alloc(st, loss * sizeof(double));
  st->h_loss = zb_malloc(loss * sizeof(double));
  st->workspace_bytes = (int64_t)((n * h + n * wa + big + tt + head) * sizeof(float) + loss * sizeof(double));
  if (a->pos == ZB_POS_ROPE && count)
    rope_tables(st);
}

zb_err zb_model_stage_new(const zb_model_config *cfg, int stage, int n_stages, zb_model_stage **out,
                          zb_diag *diag) {
  if (!cfg || !out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model: NULL argument");
  zb_model_config c = *cfg;
  if (c.vocab == 0)
    c.vocab = 256;
  if (c.loss_scale == 0.0f)
    c.loss_scale = 1.0f;
  zb_arch arch;
  zb_err err = check_config(&c, &arch, diag);
  if (err != ZB_OK)
    return err;
  int first, count;
  if (zb_model_layer_range(c.layers, n_stages, stage, &first, &count) != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model stage %d of %d out of range", stage, n_stages);
  if (!atomic_load(&model_threads_set))
    zb_model_set_threads(1);

  zb_model_stage *st = zb_calloc(1, sizeof *st);
  st->cfg = c;
  st->cfg.arch = NULL; /* the stage keeps its own copy */
  st->arch = arch;
  st->qkv_cols = (arch.heads + 2 * arch.kv_heads) * arch.head_dim;
  st->stage = stage;
  st->n_stages = n_stages;
  st->first_layer = first;
  st->n_layers = count;
  st->is_first = stage == 0;
  st->is_last = stage == n_stages - 1;
  st->nan_mb = -1;
  st->n_tok = c.batch * c.seq_len;
  if (c.device) {
    st->dev = c.device;
  } else if ((err = zb_device_host_new(&st->dev, diag)) != ZB_OK) {
    free(st);
    return err;
  } else {
    st->own_dev = 1;
    st->cfg.device = st->dev;
  }
  st->host = strcmp(st->dev->ops->name, ZB_DEVICE_HOST) == 0;
  int block = c.attn_block > 0 ? c.attn_block : st->dev->ops->attn_block;
  st->attn_block = c.attn_full || c.seq_len < block ? c.seq_len : block;
  const zb_device_ops *ops = st->dev->ops;
  st->flash = ops->attn_fwd && ops->attn_bwd && !c.attn_full && !c.attn_unfused &&
              (ops->attn_max_hd == 0 || st->arch.head_dim <= ops->attn_max_hd);
  if (c.bf16 && (!st->dev->ops->to_bf16 || !st->dev->ops->from_bf16)) {
    err = zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "model: bf16 storage needs a device with bf16 (cuda), not %s",
                      st->dev->ops->name);
    zb_model_stage_free(st);
    return err;
  }
  model_begin(st);
  build_tensors(st);
  alloc_workspace(st);
  model_bf16_init(st);
  if (st->err != ZB_OK) {
    err = model_end(st, diag);
    zb_model_stage_free(st);
    return err;
  }
  *out = st;
  return ZB_OK;
}

void zb_model_stage_free(zb_model_stage *st) {
  if (!st)
    return;
  zb_model_drop_states(st);
  zb_model_release_cache(st);
  free(st->cache);
  free(st->mbs);
  free(st->tensors);
  free(st->t_block);
  if (!st->host) {
    free(st->params);
    free(st->grads);
  }
  void *dev_bufs[] = {st->d_params, st->d_grads, st->ws_x,     st->ws_a,     st->ws_big,   st->ws_tt,
                      st->ws_head,  st->ws_loss, st->rope_cos, st->rope_sin, st->loss_rows};
  for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++)
    dev_free(st, dev_bufs[i]);
  model_bf16_free(st);
  free(st->h_loss);
  if (st->own_dev)
    zb_device_free(st->dev);
  free(st);
}

const zb_model_config *zb_model_stage_config(const zb_model_stage *st) {
  return &st->cfg;
}
int zb_model_stage_is_first(const zb_model_stage *st) {
  return st->is_first;
}
int zb_model_stage_is_last(const zb_model_stage *st) {
  return st->is_last;
}
size_t zb_model_act_numel(const zb_model_stage *st) {
  return (size_t)st->n_tok * (size_t)st->cfg.hidden;
}

/* ---- tensors and parameters ------------------------------------------- */

int zb_model_n_tensors(const zb_model_stage *st) {
  return st->n_tensors;
}

const zb_model_tensor *zb_model_tensor_at(const zb_model_stage *st, int i) {
  return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const zb_model_tensor *zb_model_find_tensor(const zb_model_stage *st, const char *name) {
  for (int i = 0; i < st->n_tensors; i++)
    if (strcmp(st->tensors[i].name, name) == 0)
      return &st->tensors[i];
  return NULL;
}

size_t zb_model_n_params(const zb_model_stage *st) {
  return st->n_params;
}
float *zb_model_params(zb_model_stage *st) {
  return st->params;
}
float *zb_model_grads(zb_model_stage *st) {
  return st->grads;
}

float *zb_model_device_params(zb_model_stage *st) {
  return st->d_params;
}
float *zb_model_device_grads(zb_model_stage *st) {
  return st->d_grads;
}

zb_err zb_model_get_params(const zb_model_stage *st, float *dst, size_t n) {
  if (n != st->n_params || (n && !dst))
    return ZB_ERR_INVALID_ARG;
  if (!n)
    return ZB_OK;
  if (st->host) {
    memcpy(dst, st->params, n * sizeof(float));
    return ZB_OK;
  }
  zb_diag d;
  zb_err err = st->dev->ops->copy(st->dev->self, dst, st->d_params, n * sizeof(float), ZB_COPY_D2H, &d);
  return err != ZB_OK ? err : st->dev->ops->sync(st->dev->self, &d);
}

zb_err zb_model_set_params(zb_model_stage *st, const float *src, size_t n) {
  if (n != st->n_params || (n && !src))
    return ZB_ERR_INVALID_ARG;
  if (n)
    memcpy(st->params, src, n * sizeof(float));
  return zb_model_push_params(st, NULL);
}

void zb_model_zero_grads(zb_model_stage *st) {
  if (!st->n_params)
    return;
  if (!st->host)
    memset(st->grads, 0, st->n_params * sizeof(float));
  zb_diag d; /* a failure poisons the device: the next op reports it */
  (void)st->dev->ops->zero(st->dev->self, st->d_grads, st->n_params * sizeof(float), &d);
}

zb_err zb_model_pull(zb_model_stage *st, zb_diag *diag) {
  if (st->host || !st->n_params)
    return ZB_OK;
  model_begin(st);
  size_t bytes = st->n_params * sizeof(float);
  model_copy(st, st->params, st->d_params, bytes, ZB_COPY_D2H);
  model_copy(st, st->grads, st->d_grads, bytes, ZB_COPY_D2H);
  if (st->err == ZB_OK)
    st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  return model_end(st, diag);
}

zb_err zb_model_push_params(zb_model_stage *st, zb_diag *diag) {
  if (st->host || !st->n_params)
    return ZB_OK;
  model_begin(st);
  model_copy(st, st->d_params, st->params, st->n_params * sizeof(float), ZB_COPY_H2D);
  if (st->cfg.bf16)
    MODEL_DEV(st, to_bf16, st->d_params, st->d_params16, st->n_params);
  return model_end(st, diag);
}

zb_device *zb_model_device(const zb_model_stage *st) {
  return st->dev;
}
