/* attn_ref.h — causal attention in double, the reference the flash
 * attention tests compare with (tests/unit/test_flash_attn.c on the host
 * device, tests/standin/test_standin_attn.c on the stand-in's launchers,
 * tests/unit/test_flash_cuda.c on the CUDA device): the unfused
 * definition, a full softmax per row, with no tiles. Test-only, header-only.
 *
 * ref_attn mirrors zb_attn (model/zb_device.h) and zbk_attn
 * (model/zb_cuda_kernels.h) field for field, so callers of either convert
 * with one initializer. ref_attn_run fills every output; ref_attn_free
 * gives them back. ref_rel_err compares a float tensor with its reference.
 */
#ifndef ZB_ATTN_REF_H
#define ZB_ATTN_REF_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

typedef struct ref_attn {
  int batch, t, heads, kv_heads, hd, ld, lo;
  float scale;
} ref_attn;

/* o [rows, lo], lse [batch, heads, t], dqkv laid out as qkv (padding 0). */
typedef struct ref_out {
  double *o, *lse, *dqkv;
} ref_out;

/* One query row i of head h of sequence b: probabilities p[0..i] and lse. */
static inline double ref_probs(const float *qkv, const ref_attn *a, int b, int h, int i, double *p) {
  int g = a->heads / a->kv_heads, d = a->hd;
  const float *q = qkv + ((size_t)b * a->t + i) * a->ld + (size_t)h * d;
  double mx = -INFINITY;
  for (int j = 0; j <= i; j++) {
    const float *k = qkv + ((size_t)b * a->t + j) * a->ld + (size_t)(a->heads + h / g) * d;
    double s = 0;
    for (int c = 0; c < d; c++)
      s += (double)q[c] * k[c];
    p[j] = s * a->scale;
    mx = p[j] > mx ? p[j] : mx;
  }
  double sum = 0;
  for (int j = 0; j <= i; j++)
    sum += exp(p[j] - mx);
  for (int j = 0; j <= i; j++)
    p[j] = exp(p[j] - mx) / sum;
  return mx + log(sum);
}

/* F and B of one query row, accumulating dK and dV. */
static inline void ref_row(const float *qkv, const float *dout, const ref_attn *a, int b, int h, int i,
                           double *p, double *dp, ref_out *r) {
  int g = a->heads / a->kv_heads, d = a->hd, kh = h / g;
  size_t qi = ((size_t)b * a->t + i) * a->ld + (size_t)h * d,
         oi = ((size_t)b * a->t + i) * a->lo + (size_t)h * d;
  r->lse[((size_t)b * a->heads + h) * a->t + i] = ref_probs(qkv, a, b, h, i, p);
  double dd = 0;
  for (int j = 0; j <= i; j++) {
    size_t vj = ((size_t)b * a->t + j) * a->ld + (size_t)(a->heads + a->kv_heads + kh) * d;
    dp[j] = 0;
    for (int c = 0; c < d; c++) {
      r->o[oi + c] += p[j] * qkv[vj + c];
      dp[j] += (double)dout[oi + c] * qkv[vj + c];
      r->dqkv[vj + c] += p[j] * dout[oi + c];
    }
    dd += p[j] * dp[j];
  }
  for (int j = 0; j <= i; j++) {
    size_t kj = ((size_t)b * a->t + j) * a->ld + (size_t)(a->heads + kh) * d;
    double ds = p[j] * (dp[j] - dd) * a->scale;
    for (int c = 0; c < d; c++) {
      r->dqkv[qi + c] += ds * qkv[kj + c];
      r->dqkv[kj + c] += ds * qkv[qi + c];
    }
  }
}

/* Every output of shape a from qkv and dout (host memory); NULL outputs
 * when out of memory. */
static inline void ref_attn_run(const float *qkv, const float *dout, const ref_attn *a, ref_out *r) {
  size_t rows = (size_t)a->batch * a->t;
  r->o = calloc(rows * a->lo, sizeof(double));
  r->lse = calloc(rows * a->heads, sizeof(double));
  r->dqkv = calloc(rows * a->ld, sizeof(double));
  double *p = malloc((size_t)a->t * sizeof(double)), *dp = malloc((size_t)a->t * sizeof(double));
  if (r->o && r->lse && r->dqkv && p && dp)
    for (int b = 0; b < a->batch; b++)
      for (int h = 0; h < a->heads; h++)
        for (int i = 0; i < a->t; i++)
          ref_row(qkv, dout, a, b, h, i, p, dp, r);
  free(p);
  free(dp);
}

static inline void ref_attn_free(ref_out *r) {
  free(r->o);
  free(r->lse);
  free(r->dqkv);
}

/* ||x - ref|| / ||ref|| over `cols` columns from `col` of rows ld apart. */
static inline double ref_rel_err(const float *x, const double *ref, size_t rows, int ld, int col, int cols) {
  double num = 0, den = 0;
  for (size_t r = 0; r < rows; r++)
    for (int c = col; c < col + cols; c++) {
      double e = (double)x[r * ld + c] - ref[r * ld + c];
      num += e * e;
      den += ref[r * ld + c] * ref[r * ld + c];
    }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The five errors of a run: o, lse, dQ, dK, dV (REF_NAMES). */
#define REF_NAMES                                                                                            \
  { "o", "lse", "dQ", "dK", "dV" }
static inline void ref_errors(const float *o, const float *lse, const float *dqkv, const ref_out *r,
                              const ref_attn *a, double e[5]) {
  size_t rows = (size_t)a->batch * a->t;
  int lo = a->heads * a->hd, kv = a->kv_heads * a->hd;
  e[0] = ref_rel_err(o, r->o, rows, a->lo, 0, lo);
  e[1] = ref_rel_err(lse, r->lse, rows * a->heads, 1, 0, 1);
  e[2] = ref_rel_err(dqkv, r->dqkv, rows, a->ld, 0, lo);
  e[3] = ref_rel_err(dqkv, r->dqkv, rows, a->ld, lo, kv);
  e[4] = ref_rel_err(dqkv, r->dqkv, rows, a->ld, lo + kv, kv);
}

#endif
