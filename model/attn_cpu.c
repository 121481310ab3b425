/* attn_cpu.c — causal flash attention on the host (attn_cpu.h;
 * docs/model.md, Flash attention (host)).
 *
 * F, per sequence and query head, per block of BQ query rows: walks the
 * key blocks up to the block's last row (the causal skip: tiles above the
 * diagonal are never touched), S = scale Q K^T on the tile, an online
 * softmax per row (running max m and sum l; the accumulator is rescaled
 * by e^(m_old - m_new) when the max grows), acc += P V; at the end
 * o = acc / l and lse = m + log l.
 * B (FlashAttention-2's), per sequence and key/value head, per key block:
 * over the query heads of the group and the blocks of queries from the
 * key block's first row on (the queries that see it),
 * P = e^(S - lse) from the recomputed scores, dV += P^T dO, dP = dO V^T,
 * dS = P (dP - D) with D = rowsum(dO o) (computed once per row), dQ +=
 * scale dS K and dK += scale dS^T Q. dQ accumulates in dqkv over the key
 * blocks; dK and dV over the group's heads, so grouped-query attention
 * needs no reduction afterwards.
 * Tiles are products of CBLAS; the row loops are ZB_VEC clones with
 * 8-lane reductions, the exponential zbm_exp (zb_kernel_math.h). */
#include "attn_cpu.h"

#include <math.h>
#include <string.h>

#include "kernels_cpu.h"
#include "zb_blas.h"

/* Tiles: F walks BQ query rows against BK keys at a time; B takes BQB
 * query rows per key block (larger products, the same O(T) scratch).
 * Measured with zb_bench_model --sections attention (docs/model.md, Flash
 * attention (host)): 32 to 128 for BQ and BK within noise at T = 256 and
 * 1024; B gains from BQB 128 over 64. */
enum { BQ = 64, BK = 64, BQB = 128 };

static int min_int(int a, int b) {
  return a < b ? a : b;
}

/* Keys c0..c0+nc-1 that query row i sees (key j <= i): the first ones. */
static int visible(int i, int c0, int nc) {
  int v = i - c0 + 1;
  return v < 0 ? 0 : v > nc ? nc : v;
}

static void mm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
               int ldb, float beta, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

size_t kernels_cpu_attn_scratch(const zb_attn *a) {
  size_t f = (size_t)BQ * BK + (size_t)BQ * (size_t)a->hd + 2 * (size_t)BQ;
  size_t b = 2 * (size_t)BQB * BK + (size_t)a->heads * (size_t)a->t;
  return f > b ? f : b;
}

/* ---- F ------------------------------------------------------------------ */

/* One tile row of the online softmax: s (nc scores, the first v visible)
 * becomes e^(s - m') (zero past v) with m' the new running max; m and l
 * are updated. Returns the factor e^(m - m') for the row's accumulator
 * (0 before the first visible key). */
ZB_VEC static float online_row(float *restrict s, int v, int nc, float *m, float *l) {
  if (v == 0) {
    memset(s, 0, (size_t)nc * sizeof *s);
    return 1.0f;
  }
  float mx[LANES];
  for (int k = 0; k < LANES; k++)
    mx[k] = *m;
  int j = 0;
  for (; j + LANES <= v; j += LANES)
    for (int k = 0; k < LANES; k++)
      mx[k] = s[j + k] > mx[k] ? s[j + k] : mx[k];
  float nm = mx[0];
  for (int k = 1; k < LANES; k++)
    nm = mx[k] > nm ? mx[k] : nm;
  for (; j < v; j++)
    nm = s[j] > nm ? s[j] : nm;
  float sum[LANES] = {0};
  for (j = 0; j + LANES <= v; j += LANES)
    for (int k = 0; k < LANES; k++) {
      s[j + k] = zbm_exp(s[j + k] - nm);
      sum[k] += s[j + k];
    }
  float total = 0.0f;
  for (int k = 0; k < LANES; k++)
    total += sum[k];
  for (; j < v; j++) {
    s[j] = zbm_exp(s[j] - nm);
    total += s[j];
  }
  for (j = v; j < nc; j++)
    s[j] = 0.0f;
  float alpha = *l > 0.0f ? zbm_exp(*m - nm) : 0.0f;
  *l = *l * alpha + total;
  *m = nm;
  return alpha;
}

ZB_VEC static void scale_row(float *restrict x, float alpha, int n) {
  for (int c = 0; c < n; c++)
    x[c] *= alpha;
}

/* o (row stride lo) = acc / l per row; lse = m + log l. */
ZB_VEC static void finish_rows(const float *restrict acc, const float *m, const float *l, float *restrict o,
                               int lo, float *lse, int nr, int d) {
  for (int i = 0; i < nr; i++) {
    float inv = 1.0f / l[i];
    for (int c = 0; c < d; c++)
      o[(size_t)i * lo + c] = acc[(size_t)i * d + c] * inv;
    lse[i] = m[i] + logf(l[i]);
  }
}

/* One query head of one sequence: q, k, v at the head's columns (rows ld
 * apart), o at its output columns, lse its t entries. */
static void fwd_head(const float *q, const float *k, const float *v, float *o, float *lse, const zb_attn *a,
                     float *ws) {
  int t = a->t, d = a->hd, ld = a->ld;
  float *s = ws, *acc = s + BQ * BK, *m = acc + (size_t)BQ * d, *l = m + BQ;
  for (int r0 = 0; r0 < t; r0 += BQ) {
    int nr = min_int(BQ, t - r0), end = r0 + nr; /* the block sees keys 0..end-1 */
    memset(acc, 0, (size_t)nr * (size_t)d * sizeof *acc);
    for (int i = 0; i < nr; i++) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
    }
    for (int c0 = 0; c0 < end; c0 += BK) {
      int nc = min_int(BK, end - c0);
      mm(0, 1, nr, nc, d, a->scale, q + (size_t)r0 * ld, ld, k + (size_t)c0 * ld, ld, 0.0f, s, BK);
      for (int i = 0; i < nr; i++) {
        float alpha = online_row(s + (size_t)i * BK, visible(r0 + i, c0, nc), nc, &m[i], &l[i]);
        if (alpha != 1.0f)
          scale_row(acc + (size_t)i * d, alpha, d);
      }
      mm(0, 0, nr, d, nc, 1.0f, s, BK, v + (size_t)c0 * ld, ld, 1.0f, acc, d);
    }
    finish_rows(acc, m, l, o + (size_t)r0 * a->lo, a->lo, lse + r0, nr, d);
  }
}

void kernels_cpu_attn_fwd(const float *qkv, float *o, float *lse, const zb_attn *a, float *scratch) {
  int g = a->heads / a->kv_heads, d = a->hd;
  for (int b = 0; b < a->batch; b++) {
    const float *q = qkv + (size_t)b * a->t * a->ld, *k = q + (size_t)a->heads * d,
                *v = k + (size_t)a->kv_heads * d;
    for (int h = 0; h < a->heads; h++)
      fwd_head(q + (size_t)h * d, k + (size_t)(h / g) * d, v + (size_t)(h / g) * d,
               o + (size_t)b * a->t * a->lo + (size_t)h * d, lse + ((size_t)b * a->heads + h) * a->t, a,
               scratch);
  }
}

/* ---- B ------------------------------------------------------------------ */

/* D[h t + i] = dO_i . o_i per head and row of one sequence. */
ZB_VEC static void rows_dot(const float *restrict o, const float *restrict dout, float *restrict dd,
                            const zb_attn *a) {
  int d = a->hd;
  for (int h = 0; h < a->heads; h++)
    for (int i = 0; i < a->t; i++) {
      const float *x = o + (size_t)i * a->lo + (size_t)h * d, *y = dout + (size_t)i * a->lo + (size_t)h * d;
      dd[(size_t)h * a->t + i] = kernels_cpu_dot(x, y, d);
    }
}

/* P = e^(S - lse) on the visible keys of each row of a tile, 0 past them. */
ZB_VEC static void tile_probs(float *restrict s, const float *lse, int r0, int c0, int nr, int nc) {
  for (int i = 0; i < nr; i++) {
    float *restrict row = s + (size_t)i * BK;
    int v = visible(r0 + i, c0, nc);
    float li = lse[i];
    for (int j = 0; j < v; j++)
      row[j] = zbm_exp(row[j] - li);
    for (int j = v; j < nc; j++)
      row[j] = 0.0f;
  }
}

/* dP becomes dS = P (dP - D) per element (zbm_softmax_bwd). */
ZB_VEC static void tile_dscores(const float *restrict p, float *restrict dp, const float *dd, int nr,
                                int nc) {
  for (int i = 0; i < nr; i++)
    for (int j = 0; j < nc; j++)
      dp[(size_t)i * BK + j] = zbm_softmax_bwd(p[(size_t)i * BK + j], dp[(size_t)i * BK + j], dd[i]);
}

/* Pointers of one sequence for B. */
typedef struct bwd_seq {
  const float *q, *k, *v, *o, *dout, *lse; /* lse: [heads, t] */
  float *dq, *dk, *dv;                     /* dqkv's columns, rows ld apart */
  const float *dd;                         /* [heads, t]: D */
} bwd_seq;

/* The tile of query head h's rows [r0, r0 + nr) against key block
 * [c0, c0 + nc) of key/value head kh. */
static void bwd_tile(const bwd_seq *x, const zb_attn *a, int h, int kh, int r0, int nr, int c0, int nc,
                     float *p, float *dp) {
  int d = a->hd, ld = a->ld, lo = a->lo;
  size_t qo = (size_t)r0 * ld + (size_t)h * d, oo = (size_t)r0 * lo + (size_t)h * d;
  size_t ko = (size_t)c0 * ld + (size_t)kh * d;
  mm(0, 1, nr, nc, d, a->scale, x->q + qo, ld, x->k + ko, ld, 0.0f, p, BK);
  tile_probs(p, x->lse + (size_t)h * a->t + r0, r0, c0, nr, nc);
  mm(1, 0, nc, d, nr, 1.0f, p, BK, x->dout + oo, lo, 1.0f, x->dv + ko, ld);
  mm(0, 1, nr, nc, d, 1.0f, x->dout + oo, lo, x->v + ko, ld, 0.0f, dp, BK);
  tile_dscores(p, dp, x->dd + (size_t)h * a->t + r0, nr, nc);
  mm(0, 0, nr, d, nc, a->scale, dp, BK, x->k + ko, ld, 1.0f, x->dq + qo, ld);
  mm(1, 0, nc, d, nr, a->scale, dp, BK, x->q + qo, ld, 1.0f, x->dk + ko, ld);
}

void kernels_cpu_attn_bwd(const float *qkv, const float *o, const float *lse, const float *dout, float *dqkv,
                          const zb_attn *a, float *scratch) {
  int g = a->heads / a->kv_heads, d = a->hd, t = a->t;
  size_t kq = (size_t)a->heads * d, kv = (size_t)a->kv_heads * d;
  float *p = scratch, *dp = p + BQB * BK, *dd = dp + BQB * BK;
  for (int b = 0; b < a->batch; b++) {
    size_t row = (size_t)b * t;
    bwd_seq x = {.q = qkv + row * a->ld,
                 .o = o + row * a->lo,
                 .dout = dout + row * a->lo,
                 .lse = lse + (size_t)b * a->heads * t,
                 .dq = dqkv + row * a->ld,
                 .dd = dd};
    x.k = x.q + kq;
    x.v = x.k + kv;
    x.dk = x.dq + kq;
    x.dv = x.dk + kv;
    /* dQ, dK, dV accumulate: the sequence's rows start at zero */
    for (int i = 0; i < t; i++)
      memset(x.dq + (size_t)i * a->ld, 0, (kq + 2 * kv) * sizeof(float));
    rows_dot(x.o, x.dout, dd, a);
    for (int kh = 0; kh < a->kv_heads; kh++)
      for (int c0 = 0; c0 < t; c0 += BK) {
        int nc = min_int(BK, t - c0);
        for (int h = kh * g; h < (kh + 1) * g; h++)
          for (int r0 = c0; r0 < t; r0 += BQB) /* the queries that see key c0 */
            bwd_tile(&x, a, h, kh, r0, min_int(BQB, t - r0), c0, nc, p, dp);
      }
  }
}
