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

const char *const model_block_tensor_names[BT_COUNT] = {
    "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "ln2.weight", "ln2.bias", "mlp.fc1.weight",  "mlp.fc1.bias",  "mlp.fc2.weight",   "mlp.fc2.bias",
};

/* ---- threads ---------------------------------------------------------- */

/* OpenBLAS's own; declared here too because a cblas.h from another
 * implementation (found by the non-pkg-config path) lacks it. */
void openblas_set_num_threads(int num_threads);

static atomic_int model_threads_set;

void zb_model_set_threads(int n) {
  openblas_set_num_threads(n < 1 ? 1 : n);
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

typedef struct tensor_spec {
  char name[48];
  int rows, cols;
  init_kind kind;
  double std;
} tensor_spec;

static void add_spec(tensor_spec *specs, int *n, const char *name, int rows, int cols, init_kind kind,
                     double std) {
  tensor_spec *s = &specs[(*n)++];
  snprintf(s->name, sizeof s->name, "%s", name);
  s->rows = rows;
  s->cols = cols;
  s->kind = kind;
  s->std = std;
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

/* Builds the tensor table and the flat parameter and gradient arrays. */
static void build_tensors(zb_model_stage *st) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, cap = 2 + BT_COUNT * st->n_layers + 3, n = 0;
  tensor_spec *specs = zb_calloc((size_t)cap, sizeof *specs);
  double std = 0.02, std_res = 0.02 / sqrt(2.0 * (c->layers > 0 ? c->layers : 1));
  st->t_embed = st->t_pos = st->t_block0 = st->t_lnf = st->t_head = -1;
  if (st->is_first) {
    st->t_embed = n;
    add_spec(specs, &n, "embed.weight", c->vocab, h, INIT_NORMAL, std);
    st->t_pos = n;
    add_spec(specs, &n, "pos_embed.weight", c->seq_len, h, INIT_NORMAL, std / 2);
  }
  st->t_block0 = n;
  for (int i = 0; i < st->n_layers; i++) {
    static const int rows[BT_COUNT] = {1, 1, 3, 1, 1, 1, 1, 1, 4, 1, 1, 1};
    static const int cols[BT_COUNT] = {1, 1, 1, 3, 1, 1, 1, 1, 1, 4, 4, 1};
    for (int k = 0; k < BT_COUNT; k++) {
      char name[48];
      snprintf(name, sizeof name, "layer%d.%s", st->first_layer + i, model_block_tensor_names[k]);
      int is_vec = k == BT_LN1_W || k == BT_LN1_B || k == BT_LN2_W || k == BT_LN2_B || k == BT_QKV_B ||
                   k == BT_PROJ_B || k == BT_FC1_B || k == BT_FC2_B;
      init_kind kind = k == BT_LN1_W || k == BT_LN2_W ? INIT_ONE : is_vec ? INIT_ZERO : INIT_NORMAL;
      double sd = k == BT_PROJ_W || k == BT_FC2_W ? std_res : std;
      add_spec(specs, &n, name, is_vec ? 1 : rows[k] * h, cols[k] * h, kind, sd);
    }
  }
  if (st->is_last) {
    st->t_lnf = n;
    add_spec(specs, &n, "ln_f.weight", 1, h, INIT_ONE, 0);
    add_spec(specs, &n, "ln_f.bias", 1, h, INIT_ZERO, 0);
    st->t_head = n;
    add_spec(specs, &n, "head.weight", c->vocab, h, INIT_NORMAL, std);
  }
  size_t total = 0;
  for (int i = 0; i < n; i++)
    total += (size_t)specs[i].rows * (size_t)specs[i].cols;
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
  if (st->err != ZB_OK) { /* the stage is freed; the table stays empty */
    st->n_tensors = 0;
    free(specs);
    return;
  }
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    zb_model_tensor *t = &st->tensors[i];
    memcpy(t->name, specs[i].name, sizeof t->name);
    t->rows = specs[i].rows;
    t->cols = specs[i].cols;
    t->numel = (size_t)t->rows * (size_t)t->cols;
    t->param = st->params + off;
    t->grad = st->grads + off;
    off += t->numel;
    init_tensor(t, c->seed, specs[i].kind, specs[i].std);
  }
  free(specs);
  if (!st->host)
    MODEL_DEV(st, copy, st->d_params, st->params, total * sizeof(float), ZB_COPY_H2D);
}

/* ---- the stage -------------------------------------------------------- */

zb_err zb_model_layer_range(int layers, int n_stages, int stage, int *first, int *count) {
  return zb_arch_layer_range(layers, n_stages, stage, first, count);
}

zb_err zb_model_tensor_stage(int layers, int n_stages, const char *name, int *stage) {
  if (layers < 0 || n_stages < 1)
    return ZB_ERR_INVALID_ARG;
  if (strcmp(name, "embed.weight") == 0 || strcmp(name, "pos_embed.weight") == 0) {
    *stage = 0;
    return ZB_OK;
  }
  if (strcmp(name, "ln_f.weight") == 0 || strcmp(name, "ln_f.bias") == 0 ||
      strcmp(name, "head.weight") == 0) {
    *stage = n_stages - 1;
    return ZB_OK;
  }
  int layer, used = 0;
  if (sscanf(name, "layer%d.%n", &layer, &used) != 1 || used == 0 || layer < 0 || layer >= layers)
    return ZB_ERR_INVALID_ARG;
  for (int k = 0; k < BT_COUNT; k++)
    if (strcmp(name + used, model_block_tensor_names[k]) == 0) {
      /* the last stage whose first layer is at or below `layer` */
      int s = n_stages - 1, first, count;
      while (s > 0 && zb_model_layer_range(layers, n_stages, s, &first, &count) == ZB_OK && first > layer)
        s--;
      *stage = s;
      return ZB_OK;
    }
  return ZB_ERR_INVALID_ARG;
}

static zb_err check_config(const zb_model_config *c, zb_diag *diag) {
  if (c->vocab < 1 || c->vocab > 256)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model vocab %d: tokens are bytes (1..256)", c->vocab);
  if (c->hidden < 1 || c->heads < 1 || c->hidden % c->heads != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model hidden %d must be a positive multiple of heads %d",
                       c->hidden, c->heads);
  if (c->layers < 0 || c->seq_len < 1 || c->batch < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model layers %d, seq_len %d, batch %d out of range",
                       c->layers, c->seq_len, c->batch);
  /* gemm dimensions and leading dimensions are ints. */
  int64_t n = (int64_t)c->batch * c->seq_len;
  if (n * 4 * c->hidden > INT_MAX || (int64_t)c->seq_len * c->seq_len > INT_MAX)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model shape too large (batch*seq_len*4*hidden > INT_MAX)");
  if (!isfinite(c->loss_scale))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model loss_scale is not finite");
  return ZB_OK;
}

/* The stage's workspace (model_internal.h), on the device. */
static void alloc_workspace(zb_model_stage *st) {
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden, count = (size_t)st->n_layers;
  size_t big = count ? n * 4 * h : 1, tt = count ? (size_t)c->heads * c->seq_len * c->seq_len : 1;
  size_t head = count ? (size_t)c->seq_len * 3 * h : 1, loss = st->is_last ? n : 1;
  st->ws_x = dev_alloc(st, n * h * sizeof(float));
  st->ws_a = dev_alloc(st, n * h * sizeof(float));
  st->ws_big = dev_alloc(st, big * sizeof(float));
  st->ws_tt = dev_alloc(st, tt * sizeof(float));
  st->ws_head = dev_alloc(st, head * sizeof(float));
  st->ws_loss = dev_alloc(st, loss * sizeof(double));
  st->h_loss = zb_malloc(loss * sizeof(double));
  st->workspace_bytes = (int64_t)((2 * n * h + big + tt + head) * sizeof(float) + loss * sizeof(double));
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
  zb_err err = check_config(&c, diag);
  if (err != ZB_OK)
    return err;
  int first, count;
  if (zb_model_layer_range(c.layers, n_stages, stage, &first, &count) != ZB_OK)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "model stage %d of %d out of range", stage, n_stages);
  if (!atomic_load(&model_threads_set))
    zb_model_set_threads(1);

  zb_model_stage *st = zb_calloc(1, sizeof *st);
  st->cfg = c;
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
  st->host = strcmp(st->dev->ops->name, "host") == 0;
  int block = c.attn_block > 0 ? c.attn_block : st->dev->ops->attn_block;
  st->attn_block = c.attn_full || c.seq_len < block ? c.seq_len : block;
  model_begin(st);
  build_tensors(st);
  alloc_workspace(st);
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
  if (!st->host) {
    free(st->params);
    free(st->grads);
  }
  void *dev_bufs[] = {st->d_params, st->d_grads, st->ws_x,    st->ws_a,
                      st->ws_big,   st->ws_tt,   st->ws_head, st->ws_loss};
  for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++)
    dev_free(st, dev_bufs[i]);
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
  return model_end(st, diag);
}

zb_device *zb_model_device(const zb_model_stage *st) {
  return st->dev;
}
