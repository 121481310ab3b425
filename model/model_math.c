/* model_math.c — the model's matrix products (through the device's gemm,
 * recorded when tracing), its linear layers, and causal self-attention
 * forward and backward (zb_model.h; docs/model.md, Devices). Attention
 * computes, per block of query rows, only the products on and below the
 * diagonal blocks (the causal skip), each batched over the heads of one
 * sequence; attn_full computes the whole T x T products instead. */
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
  st->err = st->dev->ops->gemm(st->dev->self, g, &st->ediag);
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
  MODEL_DEV(st, bias_add, y, b, st->n_tok, out);
}

/* dx = dy W: the linear layer's B. */
void model_linear_bwd_input(zb_model_stage *st, const float *dy, const float *w, float *dx, int in, int out) {
  model_mm(st, 0, 0, st->n_tok, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

/* dW += dy^T x, db += sum dy: the linear layer's W. */
void model_linear_bwd_weight(zb_model_stage *st, const float *dy, const float *x, float *dw, float *db,
                             int in, int out) {
  model_mm(st, 1, 0, out, in, st->n_tok, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db)
    MODEL_DEV(st, col_sums_acc, dy, db, st->n_tok, out);
}

/* ---- attention -------------------------------------------------------- */

/* A product batched over the heads of one sequence: A, B and C advance by
 * sa, sb, sc floats from one head to the next. */
static void heads_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                     int lda, int64_t sa, const float *b, int ldb, int64_t sb, float *c, int ldc,
                     int64_t sc) {
  zb_gemm g = {.trans_a = ta,
               .trans_b = tb,
               .m = m,
               .n = n,
               .k = k,
               .alpha = alpha,
               .beta = 0.0f,
               .a = a,
               .lda = lda,
               .stride_a = sa,
               .b = b,
               .ldb = ldb,
               .stride_b = sb,
               .c = c,
               .ldc = ldc,
               .stride_c = sc,
               .batch = st->cfg.heads};
  model_gemm(st, &g);
}

/* Per sequence, batched over heads: P = softmax_causal(Q K^T / sqrt(d)),
 * O = P V. qkv rows are [q | k | v], head j at columns j*d of each. Row
 * block [r0, r1) needs keys 0..r1-1 only; what the diagonal block computes
 * above the diagonal is overwritten by the softmax's zeros. */
void model_attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h, bs = st->attn_block;
  int64_t tt = (int64_t)t * t;
  float scale = 1.0f / sqrtf((float)d);
  for (int b = 0; b < c->batch; b++) {
    const float *q = qkv + (size_t)b * t * ld, *k = q + h, *v = q + 2 * h;
    float *p = att + (size_t)b * c->heads * tt, *ob = o + (size_t)b * t * h;
    for (int r0 = 0; r0 < t; r0 += bs) {
      int r1 = r0 + bs < t ? r0 + bs : t;
      heads_mm(st, 0, 1, r1 - r0, r1, d, scale, q + (size_t)r0 * ld, ld, d, k, ld, d, p + (size_t)r0 * t, t,
               tt);
    }
    MODEL_DEV(st, softmax_causal, p, t, c->heads);
    for (int r0 = 0; r0 < t; r0 += bs) {
      int r1 = r0 + bs < t ? r0 + bs : t;
      heads_mm(st, 0, 0, r1 - r0, d, r1, 1.0f, p + (size_t)r0 * t, t, tt, v, ld, d, ob + (size_t)r0 * h, h,
               d);
    }
  }
}

/* From dout (the gradient of O, [N, h]) turns qkv into dqkv in place, one
 * sequence at a time: its dQ | dK | dV go to scratch laid out like qkv and
 * then over it (each sequence's Q, K, V are read only by that sequence),
 * so B never holds both. Query block [r0, r1) reaches keys 0..r1-1; key
 * block [c0, c1) is reached by queries c0..T-1. */
void model_attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *dout) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h, bs = st->attn_block;
  int64_t tt = (int64_t)t * t;
  float scale = 1.0f / sqrtf((float)d), *ds = st->ws_tt, *dq = st->ws_head, *dk = dq + h, *dv = dq + 2 * h;
  for (int b = 0; b < c->batch; b++) {
    float *q = qkv + (size_t)b * t * ld, *k = q + h, *v = q + 2 * h;
    const float *p = att + (size_t)b * c->heads * tt, *dO = dout + (size_t)b * t * h;
    for (int r0 = 0; r0 < t; r0 += bs) { /* dP = dO V^T */
      int r1 = r0 + bs < t ? r0 + bs : t;
      heads_mm(st, 0, 1, r1 - r0, r1, d, 1.0f, dO + (size_t)r0 * h, h, d, v, ld, d, ds + (size_t)r0 * t, t,
               tt);
    }
    for (int c0 = 0; c0 < t; c0 += bs) { /* dV = P^T dO */
      int c1 = c0 + bs < t ? c0 + bs : t;
      heads_mm(st, 1, 0, c1 - c0, d, t - c0, 1.0f, p + (size_t)c0 * t + c0, t, tt, dO + (size_t)c0 * h, h, d,
               dv + (size_t)c0 * ld, ld, d);
    }
    MODEL_DEV(st, softmax_causal_bwd, p, ds, t, c->heads);
    for (int r0 = 0; r0 < t; r0 += bs) { /* dQ = dS K / sqrt(d) */
      int r1 = r0 + bs < t ? r0 + bs : t;
      heads_mm(st, 0, 0, r1 - r0, d, r1, scale, ds + (size_t)r0 * t, t, tt, k, ld, d, dq + (size_t)r0 * ld,
               ld, d);
    }
    for (int c0 = 0; c0 < t; c0 += bs) { /* dK = dS^T Q / sqrt(d) */
      int c1 = c0 + bs < t ? c0 + bs : t;
      heads_mm(st, 1, 0, c1 - c0, d, t - c0, scale, ds + (size_t)c0 * t + c0, t, tt, q + (size_t)c0 * ld, ld,
               d, dk + (size_t)c0 * ld, ld, d);
    }
    model_copy(st, q, dq, (size_t)t * ld * sizeof(float), ZB_COPY_D2D);
  }
}

int zb_model_trace_gemms(zb_model_stage *st, zb_model_gemm *buf, int cap) {
  int n = st->trace_n;
  st->trace = buf;
  st->trace_cap = buf ? cap : 0;
  st->trace_n = 0;
  return n;
}
