/* model_math.c — the model's matrix products (through the device's gemm,
 * recorded when tracing), its linear layers, and causal self-attention
 * forward and backward (zb_model.h; docs/model.md, Devices). Attention is
 * the device's fused op where it has one (flash attention: attn_fwd,
 * attn_bwd; docs/model.md, Flash attention (host)). Otherwise it is
 * unfused: per block of query rows, only the products on and below the
 * diagonal blocks (the causal skip), each batched over the heads of one
 * sequence, and a causal softmax; attn_full computes the whole T x T
 * products instead. */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* ---- matrix products -------------------------------------------------- */

static void trace_add(zb_model_stage *st, const zb_gemm *g) {
  zb_model_gemm t = {.trans_a = g->trans_a,
                     .trans_b = g->trans_b,
                     .m = g->m,
                     .n = g->n,
                     .k = g->k,
                     .lda = g->lda,
                     .ldb = g->ldb,
                     .ldc = g->ldc,
                     .alpha = g->alpha,
                     .beta = g->beta,
                     .count = g->batch,
                     .batch = g->batch,
                     .stride_a = g->batch > 1 ? g->stride_a : 0,
                     .stride_b = g->batch > 1 ? g->stride_b : 0,
                     .stride_c = g->batch > 1 ? g->stride_c : 0};
  zb_model_gemm *last = st->trace_n > 0 && st->trace_n <= st->trace_cap ? &st->trace[st->trace_n - 1] : NULL;
  if (last && last->trans_a == t.trans_a && last->trans_b == t.trans_b && last->m == t.m && last->n == t.n &&
      last->k == t.k && last->lda == t.lda && last->ldb == t.ldb && last->ldc == t.ldc &&
      last->alpha == t.alpha && last->beta == t.beta && last->batch == t.batch &&
      last->stride_a == t.stride_a && last->stride_b == t.stride_b && last->stride_c == t.stride_c)
    last->count += t.count;
  else if (st->trace_n++ < st->trace_cap)
    st->trace[st->trace_n - 1] = t;
}

void model_gemm(zb_model_stage *st, const zb_gemm *g) {
  if (st->err != ZB_OK)
    return;
  if (st->trace)
    trace_add(st, g);
  zb_gemm g16 = *g;
  if (st->cfg.bf16)
    model_bf16_gemm(st, &g16);
  if (st->err == ZB_OK)
    st->err = st->dev->ops->gemm(st->dev->self, &g16, &st->ediag);
}

/* C = alpha * op(A) op(B) + beta * C, row-major, one product. */
void model_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
  zb_gemm g = {.trans_a = ta,
               .trans_b = tb,
               .m = m,
               .n = n,
               .k = k,
               .alpha = alpha,
               .beta = beta,
               .a = a,
               .lda = lda,
               .b = b,
               .ldb = ldb,
               .c = c,
               .ldc = ldc,
               .batch = 1};
  model_gemm(st, &g);
}

void model_copy(zb_model_stage *st, void *dst, const void *src, size_t bytes, zb_copy_kind kind) {
  MODEL_DEV(st, copy, dst, src, bytes, kind);
}

/* y = x W^T + b (+ y when accumulate): x [N, in], W [out, in]. */
void model_linear_fwd(zb_model_stage *st, const float *x, const float *w, const float *b, float *y, int in,
                      int out, int accumulate) {
  model_mm(st, 0, 1, st->n_tok, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
  if (b)
    MODEL_DEV(st, bias_add, y, b, st->n_tok, out);
}

/* dx = dy W (dx += dy W when accumulate): the linear layer's B. */
void model_linear_bwd_input(zb_model_stage *st, const float *dy, const float *w, float *dx, int in, int out,
                            int accumulate) {
  model_mm(st, 0, 0, st->n_tok, in, out, 1.0f, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
}

/* dW += dy^T x, db += sum dy: the linear layer's W. */
void model_linear_bwd_weight(zb_model_stage *st, const float *dy, const float *x, float *dw, float *db,
                             int in, int out) {
  model_mm(st, 1, 0, out, in, st->n_tok, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db)
    MODEL_DEV(st, col_sums_acc, dy, db, st->n_tok, out);
}

/* ---- attention -------------------------------------------------------- */

/* A product batched over the key/value heads of one sequence: A, B and C
 * advance by sa, sb, sc floats from one to the next. Grouped-query
 * attention runs one such product per query head of a group (m): query
 * head kh g + m reads key/value head kh. */
static void heads_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                     int lda, int64_t sa, const float *b, int ldb, int64_t sb, float beta, float *c, int ldc,
                     int64_t sc) {
  zb_gemm g = {.trans_a = ta,
               .trans_b = tb,
               .m = m,
               .n = n,
               .k = k,
               .alpha = alpha,
               .beta = beta,
               .a = a,
               .lda = lda,
               .stride_a = sa,
               .b = b,
               .ldb = ldb,
               .stride_b = sb,
               .c = c,
               .ldc = ldc,
               .stride_c = sc,
               .batch = st->arch.kv_heads};
  model_gemm(st, &g);
}

/* The shape of attention: heads H in groups of g per key/value head,
 * head dimension d, a row of qkv (ld: q | k | v), of the output (lo). */
typedef struct attn_dims {
  int t, d, g, ld, lo, bs;
  int64_t tt;
  float scale;
} attn_dims;

static attn_dims dims_of(const zb_model_stage *st) {
  const zb_arch *a = &st->arch;
  attn_dims x = {.t = st->cfg.seq_len,
                 .d = a->head_dim,
                 .g = a->heads / a->kv_heads,
                 .ld = st->qkv_cols,
                 .lo = a->heads * a->head_dim,
                 .bs = st->attn_block};
  x.tt = (int64_t)x.t * x.t;
  x.scale = 1.0f / sqrtf((float)x.d);
  return x;
}

size_t model_attn_state_numel(const zb_model_stage *st) {
  size_t bht = (size_t)st->cfg.batch * (size_t)st->arch.heads * (size_t)st->cfg.seq_len;
  return st->flash ? bht : bht * (size_t)st->cfg.seq_len;
}

static zb_attn attn_shape(const zb_model_stage *st) {
  const zb_arch *a = &st->arch;
  return (zb_attn){.batch = st->cfg.batch,
                   .t = st->cfg.seq_len,
                   .heads = a->heads,
                   .kv_heads = a->kv_heads,
                   .hd = a->head_dim,
                   .ld = st->qkv_cols,
                   .lo = a->heads * a->head_dim,
                   .scale = 1.0f / sqrtf((float)a->head_dim)};
}

/* Per sequence: P = softmax_causal(Q K^T / sqrt(d)), O = P V, head j at
 * columns j d of q and of O. Row block [r0, r1) needs keys 0..r1-1 only;
 * what the diagonal block computes above the diagonal is overwritten by
 * the softmax's zeros. */
void model_attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o) {
  if (st->flash) { /* att is the log-sum-exp */
    zb_attn a = attn_shape(st);
    MODEL_DEV(st, attn_fwd, qkv, o, att, &a);
    return;
  }
  attn_dims x = dims_of(st);
  int64_t gd = (int64_t)x.g * x.d, gtt = x.g * x.tt;
  for (int b = 0; b < st->cfg.batch; b++) {
    const float *q = qkv + (size_t)b * x.t * x.ld, *k = q + x.lo, *v = k + (size_t)st->arch.kv_heads * x.d;
    float *p = att + (size_t)b * st->arch.heads * x.tt, *ob = o + (size_t)b * x.t * x.lo;
    for (int m = 0; m < x.g; m++)
      for (int r0 = 0; r0 < x.t; r0 += x.bs) {
        int r1 = r0 + x.bs < x.t ? r0 + x.bs : x.t;
        heads_mm(st, 0, 1, r1 - r0, r1, x.d, x.scale, q + (size_t)r0 * x.ld + m * x.d, x.ld, gd, k, x.ld, x.d,
                 0.0f, p + m * x.tt + (size_t)r0 * x.t, x.t, gtt);
      }
    MODEL_DEV(st, softmax_causal, p, x.t, st->arch.heads);
    for (int m = 0; m < x.g; m++)
      for (int r0 = 0; r0 < x.t; r0 += x.bs) {
        int r1 = r0 + x.bs < x.t ? r0 + x.bs : x.t;
        heads_mm(st, 0, 0, r1 - r0, x.d, r1, 1.0f, p + m * x.tt + (size_t)r0 * x.t, x.t, gtt, v, x.ld, x.d,
                 0.0f, ob + (size_t)r0 * x.lo + m * x.d, x.lo, gd);
      }
  }
}

/* dV = sum over a group's query heads of P^T dO (dv given), or dK = sum
 * of dS^T Q / sqrt(d) (dk given): key block [c0, c1) is reached by
 * queries c0..T-1. */
static void attention_bwd_kv(zb_model_stage *st, const attn_dims *x, const float *p, const float *ds,
                             const float *dO, const float *q, float *dk, float *dv) {
  int64_t gd = (int64_t)x->g * x->d, gtt = x->g * x->tt;
  for (int c0 = 0; c0 < x->t; c0 += x->bs) {
    int c1 = c0 + x->bs < x->t ? c0 + x->bs : x->t;
    for (int m = 0; m < x->g; m++) {
      float beta = m ? 1.0f : 0.0f;
      if (dv)
        heads_mm(st, 1, 0, c1 - c0, x->d, x->t - c0, 1.0f, p + m * x->tt + (size_t)c0 * x->t + c0, x->t, gtt,
                 dO + (size_t)c0 * x->lo + m * x->d, x->lo, gd, beta, dv + (size_t)c0 * x->ld, x->ld, x->d);
      if (dk)
        heads_mm(st, 1, 0, c1 - c0, x->d, x->t - c0, x->scale, ds + m * x->tt + (size_t)c0 * x->t + c0, x->t,
                 gtt, q + (size_t)c0 * x->ld + m * x->d, x->ld, gd, beta, dk + (size_t)c0 * x->ld, x->ld,
                 x->d);
    }
  }
}

/* From dout (the gradient of O) turns qkv into dqkv in place, one
 * sequence at a time: its dQ | dK | dV go to scratch laid out like qkv and
 * then over it (each sequence's Q, K, V are read only by that sequence),
 * so B never holds both. Query block [r0, r1) reaches keys 0..r1-1. O is
 * read by flash attention only (unfused, P holds what it needs). */
void model_attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *o,
                         const float *dout) {
  if (st->flash) { /* all of dQ | dK | dV into ws_head, then over qkv */
    zb_attn a = attn_shape(st);
    MODEL_DEV(st, attn_bwd, qkv, o, att, dout, st->ws_head, &a);
    model_copy(st, qkv, st->ws_head, (size_t)st->n_tok * st->qkv_cols * sizeof(float), ZB_COPY_D2D);
    return;
  }
  attn_dims x = dims_of(st);
  int64_t gd = (int64_t)x.g * x.d, gtt = x.g * x.tt;
  size_t kvd = (size_t)st->arch.kv_heads * x.d;
  float *ds = st->ws_tt, *dq = st->ws_head, *dk = dq + x.lo, *dv = dk + kvd;
  for (int b = 0; b < st->cfg.batch; b++) {
    float *q = qkv + (size_t)b * x.t * x.ld, *k = q + x.lo, *v = k + kvd;
    const float *p = att + (size_t)b * st->arch.heads * x.tt, *dO = dout + (size_t)b * x.t * x.lo;
    for (int m = 0; m < x.g; m++) /* dP = dO V^T */
      for (int r0 = 0; r0 < x.t; r0 += x.bs) {
        int r1 = r0 + x.bs < x.t ? r0 + x.bs : x.t;
        heads_mm(st, 0, 1, r1 - r0, r1, x.d, 1.0f, dO + (size_t)r0 * x.lo + m * x.d, x.lo, gd, v, x.ld, x.d,
                 0.0f, ds + m * x.tt + (size_t)r0 * x.t, x.t, gtt);
      }
    /* dV needs P and dO only: before the softmax's backward overwrites dP */
    attention_bwd_kv(st, &x, p, NULL, dO, q, NULL, dv);
    MODEL_DEV(st, softmax_causal_bwd, p, ds, x.t, st->arch.heads);
    for (int m = 0; m < x.g; m++) /* dQ = dS K / sqrt(d) */
      for (int r0 = 0; r0 < x.t; r0 += x.bs) {
        int r1 = r0 + x.bs < x.t ? r0 + x.bs : x.t;
        heads_mm(st, 0, 0, r1 - r0, x.d, r1, x.scale, ds + m * x.tt + (size_t)r0 * x.t, x.t, gtt, k, x.ld,
                 x.d, 0.0f, dq + (size_t)r0 * x.ld + m * x.d, x.ld, gd);
      }
    attention_bwd_kv(st, &x, NULL, ds, NULL, q, dk, NULL);
    model_copy(st, q, dq, (size_t)x.t * x.ld * sizeof(float), ZB_COPY_D2D);
  }
}

int zb_model_trace_gemms(zb_model_stage *st, zb_model_gemm *buf, int cap) {
  int n = st->trace_n;
  st->trace = buf;
  st->trace_cap = buf ? cap : 0;
  st->trace_n = 0;
  return n;
}
