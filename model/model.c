/* model.c — the transformer stage: parameters, per-microbatch state, and
 * F, B, W (zb_model.h). Matrix products go through mm() to CBLAS; the rest
 * is in kernels_cpu.c.
 *
 * What each op keeps, per block (N = batch * seq_len tokens, h hidden):
 *   F keeps  xhat1, rstd1, qkv, att (softmax probabilities), o (attention
 *            output), xhat2, rstd2, u (fc1 pre-activation), gel (gelu(u));
 *   B frees  rstd1, att, rstd2 (only B needs them), turns qkv and u into
 *            their own gradients dqkv and dfc1 in place, and keeps da1,
 *            dproj, da2, dfc2: the output gradient of every LayerNorm and
 *            linear;
 *   W reads  xhat (LayerNorm outputs are recomputed from it: y = xhat*g+b),
 *            o, gel and the gradients, then frees everything.
 * The last stage keeps the final LayerNorm's xhat/rstd and the
 * probabilities (which B turns into the logits' gradient in place); the
 * first keeps the tokens and, from B, the gradient of the embedding sum.
 */
#include "zb_model.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu.h"
#include "zb_alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

/* A block's tensors, in table order. */
enum {
  BT_LN1_W,
  BT_LN1_B,
  BT_QKV_W,
  BT_QKV_B,
  BT_PROJ_W,
  BT_PROJ_B,
  BT_LN2_W,
  BT_LN2_B,
  BT_FC1_W,
  BT_FC1_B,
  BT_FC2_W,
  BT_FC2_B,
  BT_COUNT
};
static const char *const block_tensor_names[BT_COUNT] = {
    "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "ln2.weight", "ln2.bias", "mlp.fc1.weight",  "mlp.fc1.bias",  "mlp.fc2.weight",   "mlp.fc2.bias",
};

enum { PHASE_F = 1, PHASE_B = 2 };

typedef struct block_state {
  float *xhat1, *rstd1, *qkv, *att, *o, *xhat2, *rstd2, *u, *gel; /* from F */
  float *da1, *dqkv, *dproj, *da2, *dfc2; /* from B; dqkv is qkv's buffer, and u holds dfc1 after B */
} block_state;

typedef struct cached_buf {
  void *p;
  size_t bytes;
} cached_buf;

typedef struct mb_state {
  int phase;
  int64_t bytes;
  uint8_t *tokens, *targets;
  float *dh0;                         /* first stage: gradient of embed + pos_embed (from B) */
  float *xhatf, *rstdf, *probs, *daf; /* last stage; probs holds dlogits after B */
  block_state *blocks;
} mb_state;

struct zb_model_stage {
  zb_model_config cfg;
  int stage, n_stages, first_layer, n_layers;
  int is_first, is_last;
  int n_tok;  /* N = batch * seq_len */
  int nan_mb; /* a test hook: B of this microbatch starts from NaN (-1: none) */

  zb_model_tensor *tensors;
  int n_tensors;
  float *params, *grads;
  size_t n_params;
  int t_embed, t_pos, t_block0, t_lnf, t_head; /* table indices; -1 where absent */

  mb_state **mbs; /* indexed by microbatch */
  int mb_cap;
  int64_t state_bytes, peak_bytes, workspace_bytes;
  cached_buf *cache; /* freed state buffers, for reuse */
  int cache_n, cache_cap;
  int64_t cache_bytes;

  float *ws_x;    /* [N, h] the residual stream in F, its gradient in B */
  float *ws_a;    /* [N, h] LayerNorm outputs; the attention output's gradient */
  float *ws_big;  /* [N, 4h] gelu output's gradient */
  float *ws_tt;   /* [T, T] one head's score gradient */
  float *ws_head; /* [T, 3d] one head's dQ | dK | dV */

  zb_model_gemm *trace;
  int trace_cap, trace_n;
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
      snprintf(name, sizeof name, "layer%d.%s", st->first_layer + i, block_tensor_names[k]);
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
  st->params = zb_calloc(total ? total : 1, sizeof(float));
  st->grads = zb_calloc(total ? total : 1, sizeof(float));
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
}

static float *bparam(const zb_model_stage *st, int blk, int k) {
  return st->tensors[st->t_block0 + blk * BT_COUNT + k].param;
}
static float *bgrad(const zb_model_stage *st, int blk, int k) {
  return st->tensors[st->t_block0 + blk * BT_COUNT + k].grad;
}

/* ---- matrix products -------------------------------------------------- */

/* C = alpha * op(A) op(B) + beta * C, row-major; recorded when tracing. */
static void mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
               const float *b, int ldb, float beta, float *c, int ldc) {
  if (st->trace) {
    zb_model_gemm g = {ta, tb, m, n, k, lda, ldb, ldc, alpha, beta, 1};
    zb_model_gemm *last =
        st->trace_n > 0 && st->trace_n <= st->trace_cap ? &st->trace[st->trace_n - 1] : NULL;
    if (last && last->trans_a == ta && last->trans_b == tb && last->m == m && last->n == n && last->k == k &&
        last->lda == lda && last->ldb == ldb && last->ldc == ldc && last->alpha == alpha &&
        last->beta == beta)
      last->count++;
    else if (st->trace_n++ < st->trace_cap)
      st->trace[st->trace_n - 1] = g;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

/* y = x W^T + b (+ y when accumulate): x [N, in], W [out, in]. */
static void linear_fwd(zb_model_stage *st, const float *x, const float *w, const float *b, float *y, int in,
                       int out, int accumulate) {
  mm(st, 0, 1, st->n_tok, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
  kernels_cpu_bias_add(y, b, st->n_tok, out);
}

/* dx = dy W: the linear layer's B. */
static void linear_bwd_input(zb_model_stage *st, const float *dy, const float *w, float *dx, int in,
                             int out) {
  mm(st, 0, 0, st->n_tok, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

/* dW += dy^T x, db += sum dy: the linear layer's W. */
static void linear_bwd_weight(zb_model_stage *st, const float *dy, const float *x, float *dw, float *db,
                              int in, int out) {
  mm(st, 1, 0, out, in, st->n_tok, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db)
    kernels_cpu_col_sums_acc(dy, db, st->n_tok, out);
}

/* ---- microbatch state ------------------------------------------------- */

static void account(zb_model_stage *st, mb_state *s, int64_t delta) {
  s->bytes += delta;
  st->state_bytes += delta;
  if (st->state_bytes > st->peak_bytes)
    st->peak_bytes = st->state_bytes;
}

/* Freed state buffers stay in the stage's cache and serve the next
 * request of the same size (the ops repeat a handful of sizes), so a
 * steady pipeline neither returns pages to the kernel nor faults them in
 * again on every F. Under ASan cached buffers are poisoned, so a use after
 * drop is still caught. */
static void *cache_get(zb_model_stage *st, size_t bytes) {
  for (int i = st->cache_n - 1; i >= 0; i--)
    if (st->cache[i].bytes == bytes) {
      void *p = st->cache[i].p;
      st->cache[i] = st->cache[--st->cache_n];
      st->cache_bytes -= (int64_t)bytes;
      ASAN_UNPOISON_MEMORY_REGION(p, bytes);
      return p;
    }
  return zb_malloc(bytes);
}

static void cache_put(zb_model_stage *st, void *p, size_t bytes) {
  /* Held + cached never exceeds the peak of held: the cache costs no memory
   * a schedule's peak does not already need. */
  if (st->state_bytes + st->cache_bytes + (int64_t)bytes > st->peak_bytes) {
    free(p);
    return;
  }
  if (st->cache_n == st->cache_cap) {
    st->cache_cap = st->cache_cap ? 2 * st->cache_cap : 32;
    st->cache = zb_realloc(st->cache, (size_t)st->cache_cap * sizeof *st->cache);
  }
  ASAN_POISON_MEMORY_REGION(p, bytes);
  st->cache[st->cache_n++] = (cached_buf){p, bytes};
  st->cache_bytes += (int64_t)bytes;
}

static void *take(zb_model_stage *st, mb_state *s, size_t bytes) {
  account(st, s, (int64_t)bytes);
  return cache_get(st, bytes);
}
static float *takef(zb_model_stage *st, mb_state *s, size_t numel) {
  return take(st, s, numel * sizeof(float));
}

/* Give a state buffer back: to the cache, and out of the accounting. */
static void dropf(zb_model_stage *st, mb_state *s, float **p, size_t numel) {
  if (*p) {
    account(st, s, -(int64_t)(numel * sizeof(float)));
    cache_put(st, *p, numel * sizeof(float));
    *p = NULL;
  }
}
static void dropb(zb_model_stage *st, mb_state *s, uint8_t **p, size_t bytes) {
  if (*p) {
    account(st, s, -(int64_t)bytes);
    cache_put(st, *p, bytes);
    *p = NULL;
  }
}

static mb_state *mb_get(const zb_model_stage *st, int mb) {
  return mb >= 0 && mb < st->mb_cap ? st->mbs[mb] : NULL;
}

static void mb_destroy(zb_model_stage *st, int mb) {
  mb_state *s = mb_get(st, mb);
  if (!s)
    return;
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * (size_t)c->heads * (size_t)c->seq_len * (size_t)c->seq_len;
  for (int i = 0; i < st->n_layers; i++) {
    block_state *b = &s->blocks[i];
    dropf(st, s, &b->xhat1, n * h);
    dropf(st, s, &b->rstd1, n);
    dropf(st, s, &b->qkv, n * 3 * h);
    dropf(st, s, &b->att, att);
    dropf(st, s, &b->o, n * h);
    dropf(st, s, &b->xhat2, n * h);
    dropf(st, s, &b->rstd2, n);
    dropf(st, s, &b->u, n * 4 * h);
    dropf(st, s, &b->gel, n * 4 * h);
    dropf(st, s, &b->da1, n * h);
    dropf(st, s, &b->dqkv, n * 3 * h);
    dropf(st, s, &b->dproj, n * h);
    dropf(st, s, &b->da2, n * h);
    dropf(st, s, &b->dfc2, n * h);
  }
  dropb(st, s, &s->tokens, n);
  dropb(st, s, &s->targets, n);
  dropf(st, s, &s->dh0, n * h);
  dropf(st, s, &s->xhatf, n * h);
  dropf(st, s, &s->rstdf, n);
  dropf(st, s, &s->probs, n * (size_t)c->vocab);
  dropf(st, s, &s->daf, n * h);
  free(s->blocks);
  free(s);
  st->mbs[mb] = NULL;
}

/* The limit keeps a bad microbatch id from growing the table without bound. */
#define MODEL_MAX_MB (1 << 24)

static zb_err mb_create(zb_model_stage *st, int mb, mb_state **out, zb_diag *diag) {
  if (mb < 0 || mb >= MODEL_MAX_MB)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "microbatch %d out of range", mb);
  if (mb_get(st, mb))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F of microbatch %d: it already has state",
                       st->stage, mb);
  if (mb >= st->mb_cap) {
    int cap = st->mb_cap ? st->mb_cap : 8;
    while (cap <= mb)
      cap *= 2;
    st->mbs = zb_realloc(st->mbs, (size_t)cap * sizeof *st->mbs);
    memset(st->mbs + st->mb_cap, 0, (size_t)(cap - st->mb_cap) * sizeof *st->mbs);
    st->mb_cap = cap;
  }
  mb_state *s = zb_calloc(1, sizeof *s);
  s->blocks = zb_calloc(st->n_layers ? (size_t)st->n_layers : 1, sizeof *s->blocks);
  st->mbs[mb] = s;
  *out = s;
  return ZB_OK;
}

/* ---- attention -------------------------------------------------------- */

/* Per (sequence, head): P = softmax_causal(Q K^T / sqrt(d)), O = P V. qkv
 * rows are [q | k | v], head j at columns j*d of each. */
static void attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h;
  float scale = 1.0f / sqrtf((float)d);
  for (int b = 0; b < c->batch; b++)
    for (int j = 0; j < c->heads; j++) {
      const float *q = qkv + (size_t)b * t * ld + (size_t)j * d, *k = q + h, *v = q + 2 * h;
      float *p = att + ((size_t)b * c->heads + j) * t * t;
      mm(st, 0, 1, t, t, d, scale, q, ld, k, ld, 0.0f, p, t);
      kernels_cpu_softmax_causal(p, t);
      mm(st, 0, 0, t, d, t, 1.0f, p, t, v, ld, 0.0f, o + (size_t)b * t * h + (size_t)j * d, h);
    }
}

/* From dout (the gradient of O, [N, h]) turns qkv into dqkv in place: each
 * head's Q, K, V are read only by that head, so its gradients go to
 * scratch first and then over them. That way B never holds both. */
static void attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *dout) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h;
  float scale = 1.0f / sqrtf((float)d), *ds = st->ws_tt, *dq = st->ws_head, *dk = dq + d, *dv = dq + 2 * d;
  for (int b = 0; b < c->batch; b++)
    for (int j = 0; j < c->heads; j++) {
      float *q = qkv + (size_t)b * t * ld + (size_t)j * d, *k = q + h, *v = q + 2 * h;
      const float *p = att + ((size_t)b * c->heads + j) * t * t;
      const float *dO = dout + (size_t)b * t * h + (size_t)j * d;
      mm(st, 0, 1, t, t, d, 1.0f, dO, h, v, ld, 0.0f, ds, t);    /* dP = dO V^T */
      mm(st, 1, 0, t, d, t, 1.0f, p, t, dO, h, 0.0f, dv, 3 * d); /* dV = P^T dO */
      kernels_cpu_softmax_causal_bwd(p, ds, t);
      mm(st, 0, 0, t, d, t, scale, ds, t, k, ld, 0.0f, dq, 3 * d); /* dQ = dS K / sqrt(d) */
      mm(st, 1, 0, t, d, t, scale, ds, t, q, ld, 0.0f, dk, 3 * d); /* dK = dS^T Q / sqrt(d) */
      for (int r = 0; r < t; r++) {
        const float *src = dq + (size_t)r * 3 * d;
        memcpy(q + (size_t)r * ld, src, (size_t)d * sizeof(float));
        memcpy(k + (size_t)r * ld, src + d, (size_t)d * sizeof(float));
        memcpy(v + (size_t)r * ld, src + 2 * d, (size_t)d * sizeof(float));
      }
    }
}

/* ---- blocks ----------------------------------------------------------- */

/* F of block i on the stream st->ws_x, in place. */
static void block_fwd(zb_model_stage *st, mb_state *s, int i) {
  const zb_model_config *c = &st->cfg;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * (size_t)c->heads * (size_t)c->seq_len * (size_t)c->seq_len;
  int hi = c->hidden;
  float *x = st->ws_x, *a = st->ws_a;

  b->xhat1 = takef(st, s, n * h);
  b->rstd1 = takef(st, s, n);
  kernels_cpu_layernorm_fwd(x, bparam(st, i, BT_LN1_W), bparam(st, i, BT_LN1_B), a, b->xhat1, b->rstd1,
                            st->n_tok, hi);
  b->qkv = takef(st, s, n * 3 * h);
  linear_fwd(st, a, bparam(st, i, BT_QKV_W), bparam(st, i, BT_QKV_B), b->qkv, hi, 3 * hi, 0);
  b->att = takef(st, s, att);
  b->o = takef(st, s, n * h);
  attention_fwd(st, b->qkv, b->att, b->o);
  linear_fwd(st, b->o, bparam(st, i, BT_PROJ_W), bparam(st, i, BT_PROJ_B), x, hi, hi, 1);

  b->xhat2 = takef(st, s, n * h);
  b->rstd2 = takef(st, s, n);
  kernels_cpu_layernorm_fwd(x, bparam(st, i, BT_LN2_W), bparam(st, i, BT_LN2_B), a, b->xhat2, b->rstd2,
                            st->n_tok, hi);
  b->u = takef(st, s, n * 4 * h);
  linear_fwd(st, a, bparam(st, i, BT_FC1_W), bparam(st, i, BT_FC1_B), b->u, hi, 4 * hi, 0);
  b->gel = takef(st, s, n * 4 * h);
  kernels_cpu_gelu_fwd(b->u, b->gel, n * 4 * h);
  linear_fwd(st, b->gel, bparam(st, i, BT_FC2_W), bparam(st, i, BT_FC2_B), x, 4 * hi, hi, 1);
}

/* B of block i: st->ws_x holds the gradient of the block's output and
 * becomes that of its input. */
static void block_b(zb_model_stage *st, mb_state *s, int i) {
  const zb_model_config *c = &st->cfg;
  block_state *b = &s->blocks[i];
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * (size_t)c->heads * (size_t)c->seq_len * (size_t)c->seq_len;
  int hi = c->hidden;
  float *g = st->ws_x, *dout = st->ws_a, *dgel = st->ws_big;

  b->dfc2 = takef(st, s, n * h);
  memcpy(b->dfc2, g, n * h * sizeof(float));
  linear_bwd_input(st, g, bparam(st, i, BT_FC2_W), dgel, 4 * hi, hi);
  kernels_cpu_gelu_bwd_inplace(dgel, b->u, n * 4 * h); /* u is dfc1 from here on */
  b->da2 = takef(st, s, n * h);
  linear_bwd_input(st, b->u, bparam(st, i, BT_FC1_W), b->da2, hi, 4 * hi);
  kernels_cpu_layernorm_bwd_acc(b->da2, b->xhat2, b->rstd2, bparam(st, i, BT_LN2_W), g, st->n_tok, hi);
  dropf(st, s, &b->rstd2, n);

  b->dproj = takef(st, s, n * h);
  memcpy(b->dproj, g, n * h * sizeof(float));
  linear_bwd_input(st, g, bparam(st, i, BT_PROJ_W), dout, hi, hi);
  attention_bwd(st, b->qkv, b->att, dout);
  b->dqkv = b->qkv; /* same bytes, now W's */
  b->qkv = NULL;
  dropf(st, s, &b->att, att);
  b->da1 = takef(st, s, n * h);
  linear_bwd_input(st, b->dqkv, bparam(st, i, BT_QKV_W), b->da1, hi, 3 * hi);
  kernels_cpu_layernorm_bwd_acc(b->da1, b->xhat1, b->rstd1, bparam(st, i, BT_LN1_W), g, st->n_tok, hi);
  dropf(st, s, &b->rstd1, n);
}

/* W of block i: adds its parameter gradients. */
static void block_w(zb_model_stage *st, mb_state *s, int i) {
  block_state *b = &s->blocks[i];
  int h = st->cfg.hidden;
  float *a = st->ws_a;

  kernels_cpu_layernorm_affine(b->xhat1, bparam(st, i, BT_LN1_W), bparam(st, i, BT_LN1_B), a, st->n_tok, h);
  linear_bwd_weight(st, b->dqkv, a, bgrad(st, i, BT_QKV_W), bgrad(st, i, BT_QKV_B), h, 3 * h);
  linear_bwd_weight(st, b->dproj, b->o, bgrad(st, i, BT_PROJ_W), bgrad(st, i, BT_PROJ_B), h, h);
  kernels_cpu_layernorm_param_grads_acc(b->da1, b->xhat1, bgrad(st, i, BT_LN1_W), bgrad(st, i, BT_LN1_B),
                                        st->n_tok, h);
  kernels_cpu_layernorm_affine(b->xhat2, bparam(st, i, BT_LN2_W), bparam(st, i, BT_LN2_B), a, st->n_tok, h);
  linear_bwd_weight(st, b->u, a, bgrad(st, i, BT_FC1_W), bgrad(st, i, BT_FC1_B), h, 4 * h);
  linear_bwd_weight(st, b->dfc2, b->gel, bgrad(st, i, BT_FC2_W), bgrad(st, i, BT_FC2_B), 4 * h, h);
  kernels_cpu_layernorm_param_grads_acc(b->da2, b->xhat2, bgrad(st, i, BT_LN2_W), bgrad(st, i, BT_LN2_B),
                                        st->n_tok, h);
}

/* ---- the stage -------------------------------------------------------- */

zb_err zb_model_layer_range(int layers, int n_stages, int stage, int *first, int *count) {
  if (layers < 0 || n_stages < 1 || stage < 0 || stage >= n_stages)
    return ZB_ERR_INVALID_ARG;
  int64_t lo = (int64_t)stage * layers / n_stages, hi = (int64_t)(stage + 1) * layers / n_stages;
  *first = (int)lo;
  *count = (int)(hi - lo);
  return ZB_OK;
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
  build_tensors(st);

  size_t n = (size_t)st->n_tok, h = (size_t)c.hidden;
  size_t big = count ? n * 4 * h : 1, tt = count ? (size_t)c.seq_len * c.seq_len : 1;
  st->ws_x = zb_malloc(n * h * sizeof(float));
  st->ws_a = zb_malloc(n * h * sizeof(float));
  st->ws_big = zb_malloc(big * sizeof(float));
  size_t head = count ? (size_t)c.seq_len * 3 * (size_t)(c.hidden / c.heads) : 1;
  st->ws_tt = zb_malloc(tt * sizeof(float));
  st->ws_head = zb_malloc(head * sizeof(float));
  st->workspace_bytes = (int64_t)((2 * n * h + big + tt + head) * sizeof(float));
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
  free(st->params);
  free(st->grads);
  free(st->ws_x);
  free(st->ws_a);
  free(st->ws_big);
  free(st->ws_tt);
  free(st->ws_head);
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

static zb_err check_tokens(const zb_model_stage *st, const uint8_t *ids, const char *what, zb_diag *diag) {
  for (int i = 0; i < st->n_tok; i++)
    if (ids[i] >= st->cfg.vocab)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: %s[%d] = %d is outside the vocab of %d",
                         st->stage, what, i, ids[i], st->cfg.vocab);
  return ZB_OK;
}

zb_err zb_model_forward(zb_model_stage *st, int mb, const uint8_t *tokens, const float *x,
                        const uint8_t *targets, float *y, float *loss, zb_diag *diag) {
  if (st->is_first ? !tokens || x : tokens || !x)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F takes %s", st->stage,
                       st->is_first ? "tokens, not x" : "x, not tokens");
  if (st->is_last ? !targets || !loss || y : targets || loss || !y)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F %s", st->stage,
                       st->is_last ? "takes targets and returns a loss, not y"
                                   : "returns y, takes no targets");
  zb_err err;
  if ((tokens && (err = check_tokens(st, tokens, "tokens", diag)) != ZB_OK) ||
      (targets && (err = check_tokens(st, targets, "targets", diag)) != ZB_OK))
    return err;
  mb_state *s = NULL;
  if ((err = mb_create(st, mb, &s, diag)) != ZB_OK)
    return err;

  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  float *xs = st->ws_x;
  if (st->is_first) {
    s->tokens = take(st, s, n);
    memcpy(s->tokens, tokens, n);
    const float *emb = st->tensors[st->t_embed].param, *pos = st->tensors[st->t_pos].param;
    for (size_t r = 0; r < n; r++) {
      const float *e = emb + tokens[r] * h, *p = pos + (r % (size_t)c->seq_len) * h;
      for (size_t k = 0; k < h; k++)
        xs[r * h + k] = e[k] + p[k];
    }
  } else {
    memcpy(xs, x, n * h * sizeof(float));
  }
  for (int i = 0; i < st->n_layers; i++)
    block_fwd(st, s, i);
  if (st->is_last) {
    s->xhatf = takef(st, s, n * h);
    s->rstdf = takef(st, s, n);
    kernels_cpu_layernorm_fwd(xs, st->tensors[st->t_lnf].param, st->tensors[st->t_lnf + 1].param, st->ws_a,
                              s->xhatf, s->rstdf, st->n_tok, c->hidden);
    s->probs = takef(st, s, n * (size_t)c->vocab);
    mm(st, 0, 1, st->n_tok, c->vocab, c->hidden, 1.0f, st->ws_a, c->hidden, st->tensors[st->t_head].param,
       c->hidden, 0.0f, s->probs, c->vocab);
    s->targets = take(st, s, n);
    memcpy(s->targets, targets, n);
    *loss = (float)(kernels_cpu_softmax_xent_fwd(s->probs, targets, st->n_tok, c->vocab) / (double)n);
  } else {
    memcpy(y, xs, n * h * sizeof(float));
  }
  s->phase = PHASE_F;
  return ZB_OK;
}

zb_err zb_model_backward_b(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag) {
  if (st->is_last ? dy != NULL : dy == NULL)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B %s dy", st->stage,
                       st->is_last ? "starts from the loss, takes no" : "needs");
  if (st->is_first ? dx != NULL : dx == NULL)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B %s dx", st->stage,
                       st->is_first ? "has tokens as input, returns no" : "needs");
  mb_state *s = mb_get(st, mb);
  if (!s || s->phase != PHASE_F)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: B of microbatch %d %s", st->stage, mb,
                       s ? "ran already" : "before its F");

  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  float *g = st->ws_x;
  if (st->is_last) {
    /* Mean over the microbatch's tokens, times the caller's scale. */
    float scale = mb == st->nan_mb ? NAN : c->loss_scale / (float)n;
    kernels_cpu_softmax_xent_bwd(s->probs, s->targets, st->n_tok, c->vocab, scale);
    s->daf = takef(st, s, n * h);
    mm(st, 0, 0, st->n_tok, c->hidden, c->vocab, 1.0f, s->probs, c->vocab, st->tensors[st->t_head].param,
       c->hidden, 0.0f, s->daf, c->hidden);
    memset(g, 0, n * h * sizeof(float));
    kernels_cpu_layernorm_bwd_acc(s->daf, s->xhatf, s->rstdf, st->tensors[st->t_lnf].param, g, st->n_tok,
                                  c->hidden);
    dropf(st, s, &s->rstdf, n);
  } else {
    memcpy(g, dy, n * h * sizeof(float));
  }
  for (int i = st->n_layers - 1; i >= 0; i--)
    block_b(st, s, i);
  if (st->is_first) {
    s->dh0 = takef(st, s, n * h);
    memcpy(s->dh0, g, n * h * sizeof(float));
  } else {
    memcpy(dx, g, n * h * sizeof(float));
  }
  s->phase = PHASE_B;
  return ZB_OK;
}

zb_err zb_model_backward_w(zb_model_stage *st, int mb, zb_diag *diag) {
  mb_state *s = mb_get(st, mb);
  if (!s || s->phase != PHASE_B)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: W of microbatch %d before its B", st->stage, mb);
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  if (st->is_last) {
    const zb_model_tensor *lw = &st->tensors[st->t_lnf], *lb = lw + 1;
    kernels_cpu_layernorm_affine(s->xhatf, lw->param, lb->param, st->ws_a, st->n_tok, c->hidden);
    linear_bwd_weight(st, s->probs, st->ws_a, st->tensors[st->t_head].grad, NULL, c->hidden, c->vocab);
    kernels_cpu_layernorm_param_grads_acc(s->daf, s->xhatf, lw->grad, lb->grad, st->n_tok, c->hidden);
  }
  for (int i = st->n_layers - 1; i >= 0; i--)
    block_w(st, s, i);
  if (st->is_first) {
    float *de = st->tensors[st->t_embed].grad, *dp = st->tensors[st->t_pos].grad;
    for (size_t r = 0; r < n; r++) {
      const float *d = s->dh0 + r * h;
      float *e = de + s->tokens[r] * h, *p = dp + (r % (size_t)c->seq_len) * h;
      for (size_t k = 0; k < h; k++) {
        e[k] += d[k];
        p[k] += d[k];
      }
    }
  }
  mb_destroy(st, mb);
  return ZB_OK;
}

zb_err zb_model_backward_bw(zb_model_stage *st, int mb, const float *dy, float *dx, zb_diag *diag) {
  zb_err err = zb_model_backward_b(st, mb, dy, dx, diag);
  return err != ZB_OK ? err : zb_model_backward_w(st, mb, diag);
}

void zb_model_inject_nan(zb_model_stage *st, int mb) {
  st->nan_mb = mb;
}

void zb_model_drop_states(zb_model_stage *st) {
  for (int mb = 0; mb < st->mb_cap; mb++)
    mb_destroy(st, mb);
}

/* ---- tensors, memory, tracing ----------------------------------------- */

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

zb_err zb_model_get_params(const zb_model_stage *st, float *dst, size_t n) {
  if (n != st->n_params || (n && !dst))
    return ZB_ERR_INVALID_ARG;
  if (n)
    memcpy(dst, st->params, n * sizeof(float));
  return ZB_OK;
}

zb_err zb_model_set_params(zb_model_stage *st, const float *src, size_t n) {
  if (n != st->n_params || (n && !src))
    return ZB_ERR_INVALID_ARG;
  if (n)
    memcpy(st->params, src, n * sizeof(float));
  return ZB_OK;
}

void zb_model_zero_grads(zb_model_stage *st) {
  if (st->n_params)
    memset(st->grads, 0, st->n_params * sizeof(float));
}

void zb_model_mem_stats(const zb_model_stage *st, zb_model_mem *out) {
  out->state_bytes = st->state_bytes;
  out->peak_state_bytes = st->peak_bytes;
  out->workspace_bytes = st->workspace_bytes;
  out->param_bytes = (int64_t)(2 * st->n_params * sizeof(float));
  out->cached_bytes = st->cache_bytes;
}

int64_t zb_model_mb_bytes(const zb_model_stage *st, int mb) {
  const mb_state *s = mb_get(st, mb);
  return s ? s->bytes : 0;
}

void zb_model_reset_peak(zb_model_stage *st) {
  st->peak_bytes = st->state_bytes;
}

void zb_model_release_cache(zb_model_stage *st) {
  for (int i = 0; i < st->cache_n; i++) {
    ASAN_UNPOISON_MEMORY_REGION(st->cache[i].p, st->cache[i].bytes);
    free(st->cache[i].p);
  }
  st->cache_n = 0;
  st->cache_bytes = 0;
}

int zb_model_trace_gemms(zb_model_stage *st, zb_model_gemm *buf, int cap) {
  int n = st->trace_n;
  st->trace = buf;
  st->trace_cap = buf ? cap : 0;
  st->trace_n = 0;
  return n;
}
