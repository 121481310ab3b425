/* model_math.c — the model's matrix products (CBLAS, recorded when
 * tracing), its linear layers, and causal self-attention forward and
 * backward (zb_model.h; element-wise kernels are in kernels_cpu.c). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels_cpu.h"
#include "model_internal.h"

/* ---- matrix products -------------------------------------------------- */

/* C = alpha * op(A) op(B) + beta * C, row-major; recorded when tracing. */
void model_mm(zb_model_stage *st, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
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
void model_linear_fwd(zb_model_stage *st, const float *x, const float *w, const float *b, float *y, int in,
                      int out, int accumulate) {
  model_mm(st, 0, 1, st->n_tok, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out);
  kernels_cpu_bias_add(y, b, st->n_tok, out);
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
    kernels_cpu_col_sums_acc(dy, db, st->n_tok, out);
}

/* ---- attention -------------------------------------------------------- */

/* Per (sequence, head): P = softmax_causal(Q K^T / sqrt(d)), O = P V. qkv
 * rows are [q | k | v], head j at columns j*d of each. */
void model_attention_fwd(zb_model_stage *st, const float *qkv, float *att, float *o) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h;
  float scale = 1.0f / sqrtf((float)d);
  for (int b = 0; b < c->batch; b++)
    for (int j = 0; j < c->heads; j++) {
      const float *q = qkv + (size_t)b * t * ld + (size_t)j * d, *k = q + h, *v = q + 2 * h;
      float *p = att + ((size_t)b * c->heads + j) * t * t;
      model_mm(st, 0, 1, t, t, d, scale, q, ld, k, ld, 0.0f, p, t);
      kernels_cpu_softmax_causal(p, t);
      model_mm(st, 0, 0, t, d, t, 1.0f, p, t, v, ld, 0.0f, o + (size_t)b * t * h + (size_t)j * d, h);
    }
}

/* From dout (the gradient of O, [N, h]) turns qkv into dqkv in place: each
 * head's Q, K, V are read only by that head, so its gradients go to
 * scratch first and then over them. That way B never holds both. */
void model_attention_bwd(zb_model_stage *st, float *qkv, const float *att, const float *dout) {
  const zb_model_config *c = &st->cfg;
  int h = c->hidden, t = c->seq_len, d = h / c->heads, ld = 3 * h;
  float scale = 1.0f / sqrtf((float)d), *ds = st->ws_tt, *dq = st->ws_head, *dk = dq + d, *dv = dq + 2 * d;
  for (int b = 0; b < c->batch; b++)
    for (int j = 0; j < c->heads; j++) {
      float *q = qkv + (size_t)b * t * ld + (size_t)j * d, *k = q + h, *v = q + 2 * h;
      const float *p = att + ((size_t)b * c->heads + j) * t * t;
      const float *dO = dout + (size_t)b * t * h + (size_t)j * d;
      model_mm(st, 0, 1, t, t, d, 1.0f, dO, h, v, ld, 0.0f, ds, t);    /* dP = dO V^T */
      model_mm(st, 1, 0, t, d, t, 1.0f, p, t, dO, h, 0.0f, dv, 3 * d); /* dV = P^T dO */
      kernels_cpu_softmax_causal_bwd(p, ds, t);
      model_mm(st, 0, 0, t, d, t, scale, ds, t, k, ld, 0.0f, dq, 3 * d); /* dQ = dS K / sqrt(d) */
      model_mm(st, 1, 0, t, d, t, scale, ds, t, q, ld, 0.0f, dk, 3 * d); /* dK = dS^T Q / sqrt(d) */
      for (int r = 0; r < t; r++) {
        const float *src = dq + (size_t)r * 3 * d;
        memcpy(q + (size_t)r * ld, src, (size_t)d * sizeof(float));
        memcpy(k + (size_t)r * ld, src + d, (size_t)d * sizeof(float));
        memcpy(v + (size_t)r * ld, src + 2 * d, (size_t)d * sizeof(float));
      }
    }
}

int zb_model_trace_gemms(zb_model_stage *st, zb_model_gemm *buf, int cap) {
  int n = st->trace_n;
  st->trace = buf;
  st->trace_cap = buf ? cap : 0;
  st->trace_n = 0;
  return n;
}
