/* attn_standin.c — zbk_attn_fwd and zbk_attn_bwd of model/zb_cuda_kernels.h
 * as host code on the CPU stand-in's streams (test-only; docs/model.md, The
 * CPU stand-in and Flash attention (CUDA)): the host twins of
 * kernels_cuda.cu's flash attention kernels.
 *
 * They walk the tiles the GPU's blocks walk (zb_cuda_kernels.h: F over
 * ZBK_ATTN_BQ query rows against ZBK_ATTN_BK keys, B's key blocks and query
 * blocks over ZBK_ATTN_BQB-row tiles), with the same masks, the same
 * online softmax (the max and sum of a tile row reduced as the GPU's 16
 * threads of a row do: 4 strided entries each, then an xor butterfly) and
 * dot products in column order, so the stand-in tests the algorithm the
 * GPU runs, not another one. Blocks run one after the other on the
 * stream's thread; a block's "shared memory" is a per-launch scratch of
 * tile size (O(tile), never T x T), freed by the launch.
 *
 * Device memory is reached only through the job's pointers, each read at
 * one place (attn_job, set by the launcher, unpacked at the top of each
 * run function).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_internal.h"
#include "zb_cuda_kernels.h"

enum { BQ = ZBK_ATTN_BQ, BK = ZBK_ATTN_BK, BQB = ZBK_ATTN_BQB, LANES = 16 };

typedef struct attn_job {
  zbk_attn a;
  const float *qkv, *o, *lse, *dout; /* device: inputs */
  float *o_out, *lse_out, *dqkv;     /* device: outputs */
} attn_job;

static int imin(int x, int y) {
  return x < y ? x : y;
}

/* The GPU's row reduction: lane l holds the sum (or max) of entries l,
 * l + 16, ...; lanes meet in an xor butterfly (offsets 8, 4, 2, 1). */
static float lanes_reduce(const float *row, int is_max) {
  float v[LANES];
  for (int l = 0; l < LANES; l++) {
    v[l] = row[l];
    for (int j = l + LANES; j < BK; j += LANES)
      v[l] = is_max ? fmaxf(v[l], row[j]) : v[l] + row[j];
  }
  for (int off = LANES / 2; off > 0; off /= 2) {
    float w[LANES];
    for (int l = 0; l < LANES; l++)
      w[l] = is_max ? fmaxf(v[l], v[l ^ off]) : v[l] + v[l ^ off];
    memcpy(v, w, sizeof v);
  }
  return v[0];
}

static float dot(const float *x, const float *y, int n) {
  float s = 0.0f;
  for (int c = 0; c < n; c++)
    s += x[c] * y[c];
  return s;
}

/* ---- F ---- */

/* Tile row i of a query block: scores s (BK, masked to -inf) become
 * probabilities under the new running max; returns the accumulator's factor. */
static float fwd_online(float *s, float *m, float *l) {
  float mx = fmaxf(*m, lanes_reduce(s, 1));
  float alpha = *l > 0.0f ? zbm_exp(*m - mx) : 0.0f;
  for (int j = 0; j < BK; j++)
    s[j] = s[j] == -INFINITY ? 0.0f : zbm_exp(s[j] - mx);
  *l = *l * alpha + lanes_reduce(s, 0);
  *m = mx;
  return alpha;
}

/* One block: sequence b, query head h, rows [r0, r0 + nr). ws: BQ BK + BQ hd + 2 BQ floats. */
static void fwd_block(const attn_job *j, int b, int h, int r0, float *ws) {
  const zbk_attn *a = &j->a;
  const float *qkv = j->qkv;
  float *o = j->o_out, *lse = j->lse_out;
  int d = a->hd, kh = h / (a->heads / a->kv_heads), nr = imin(BQ, a->t - r0), end = r0 + nr;
  size_t row0 = (size_t)b * a->t;
  const float *q = qkv + row0 * a->ld + (size_t)h * d, *k = qkv + row0 * a->ld + (size_t)(a->heads + kh) * d;
  const float *v = k + (size_t)a->kv_heads * d;
  float *s = ws, *acc = s + BQ * BK, *m = acc + (size_t)BQ * d, *l = m + BQ;
  memset(acc, 0, (size_t)BQ * d * sizeof *acc);
  for (int i = 0; i < BQ; i++)
    m[i] = -INFINITY, l[i] = 0.0f;
  for (int c0 = 0; c0 < end; c0 += BK) {
    int nc = imin(BK, a->t - c0);
    for (int i = 0; i < nr; i++) {
      float *si = s + (size_t)i * BK;
      for (int jj = 0; jj < BK; jj++) {
        int c = c0 + jj;
        si[jj] = c <= r0 + i && c < a->t
                     ? dot(q + (size_t)(r0 + i) * a->ld, k + (size_t)c * a->ld, d) * a->scale
                     : -INFINITY;
      }
      float alpha = fwd_online(si, &m[i], &l[i]);
      for (int c = 0; c < d; c++)
        acc[(size_t)i * d + c] *= alpha;
    }
    for (int kk = 0; kk < nc; kk++)
      for (int i = 0; i < nr; i++)
        for (int c = 0; c < d; c++)
          acc[(size_t)i * d + c] += s[(size_t)i * BK + kk] * v[(size_t)(c0 + kk) * a->ld + c];
  }
  for (int i = 0; i < nr; i++) {
    float inv = 1.0f / l[i];
    for (int c = 0; c < d; c++)
      o[(row0 + r0 + i) * a->lo + (size_t)h * d + c] = acc[(size_t)i * d + c] * inv;
    lse[((size_t)b * a->heads + h) * a->t + r0 + i] = m[i] + logf(l[i]);
  }
}

static cudaError_t fwd_run(void *arg) {
  const attn_job *j = arg;
  const zbk_attn *a = &j->a;
  float *ws = malloc(((size_t)BQ * BK + (size_t)BQ * a->hd + 2 * BQ) * sizeof(float));
  if (!ws) {
    standin_error("zbk_attn_fwd: out of host memory for the stand-in's tiles");
    return cudaErrorMemoryAllocation;
  }
  for (int b = 0; b < a->batch; b++)
    for (int h = 0; h < a->heads; h++)
      for (int r0 = 0; r0 < a->t; r0 += BQ)
        fwd_block(j, b, h, r0, ws);
  free(ws);
  return cudaSuccess;
}

/* ---- B ---- */

/* What B's blocks share: one sequence's pointers and, per query tile, the
 * tile's P and dS ([BQB][BK]) and its rows' lse and D. */
typedef struct bwd_ctx {
  const zbk_attn *a;
  const float *q, *k, *o, *dout, *lse; /* q, k: head 0's columns of the sequence's row 0 */
  float *dq;                           /* dqkv at the same place */
  float *p, *ds, *lse_t, *dd;
} bwd_ctx;

/* P and dS of query head h's rows [q0, q0 + BQB) against key/value head
 * kh's keys [c0, c0 + BK), with the masks of F. */
static void bwd_tile(const bwd_ctx *x, int h, int kh, int q0, int c0) {
  const zbk_attn *a = x->a;
  int d = a->hd, nq = imin(BQB, a->t - q0);
  const float *v = x->k + (size_t)(a->kv_heads + kh) * d, *k = x->k + (size_t)kh * d;
  for (int i = 0; i < BQB; i++) {
    int r = q0 + i;
    x->lse_t[i] = i < nq ? x->lse[(size_t)h * a->t + r] : 0.0f;
    x->dd[i] =
        i < nq ? dot(x->dout + (size_t)r * a->lo + (size_t)h * d, x->o + (size_t)r * a->lo + (size_t)h * d, d)
               : 0.0f;
    for (int jj = 0; jj < BK; jj++) {
      int c = c0 + jj;
      float p = 0.0f, dp = 0.0f;
      if (c <= r && r < a->t && c < a->t) {
        p = zbm_exp(dot(x->q + (size_t)r * a->ld + (size_t)h * d, k + (size_t)c * a->ld, d) * a->scale -
                    x->lse_t[i]);
        dp = dot(x->dout + (size_t)r * a->lo + (size_t)h * d, v + (size_t)c * a->ld, d);
      }
      x->p[i * BK + jj] = p;
      x->ds[i * BK + jj] = zbm_softmax_bwd(p, dp, x->dd[i]);
    }
  }
}

/* A key block: dK and dV of key/value head kh's keys [c0, c0 + BK). acc: 2 BK hd floats. */
static void bwd_kv_block(const bwd_ctx *x, int kh, int c0, float *acc) {
  const zbk_attn *a = x->a;
  int d = a->hd, g = a->heads / a->kv_heads, nk = imin(BK, a->t - c0);
  float *dk = acc, *dv = acc + (size_t)BK * d;
  memset(acc, 0, 2 * (size_t)BK * d * sizeof *acc);
  for (int h = kh * g; h < (kh + 1) * g; h++)
    for (int q0 = c0; q0 < a->t; q0 += BQB) {
      bwd_tile(x, h, kh, q0, c0);
      for (int qq = 0; qq < imin(BQB, a->t - q0); qq++) {
        const float *qr = x->q + (size_t)(q0 + qq) * a->ld + (size_t)h * d,
                    *dor = x->dout + (size_t)(q0 + qq) * a->lo + (size_t)h * d;
        for (int kr = 0; kr < BK; kr++)
          for (int c = 0; c < d; c++) {
            dv[(size_t)kr * d + c] += x->p[qq * BK + kr] * dor[c];
            dk[(size_t)kr * d + c] += x->ds[qq * BK + kr] * qr[c];
          }
      }
    }
  for (int kr = 0; kr < nk; kr++)
    for (int c = 0; c < d; c++) {
      float *row = x->dq + (size_t)(c0 + kr) * a->ld;
      row[(size_t)(a->heads + kh) * d + c] = dk[(size_t)kr * d + c] * a->scale;
      row[(size_t)(a->heads + a->kv_heads + kh) * d + c] = dv[(size_t)kr * d + c];
    }
}

/* A query block: dQ of query head h's rows [q0, q0 + BQB). acc: BQB hd floats. */
static void bwd_q_block(const bwd_ctx *x, int h, int q0, float *acc) {
  const zbk_attn *a = x->a;
  int d = a->hd, kh = h / (a->heads / a->kv_heads), nq = imin(BQB, a->t - q0);
  const float *k = x->k + (size_t)kh * d;
  memset(acc, 0, (size_t)BQB * d * sizeof *acc);
  for (int c0 = 0; c0 < q0 + nq; c0 += BK) {
    bwd_tile(x, h, kh, q0, c0);
    for (int kk = 0; kk < imin(BK, a->t - c0); kk++)
      for (int i = 0; i < BQB; i++)
        for (int c = 0; c < d; c++)
          acc[(size_t)i * d + c] += x->ds[i * BK + kk] * k[(size_t)(c0 + kk) * a->ld + c];
  }
  for (int i = 0; i < nq; i++)
    for (int c = 0; c < d; c++)
      x->dq[(size_t)(q0 + i) * a->ld + (size_t)h * d + c] = acc[(size_t)i * d + c] * a->scale;
}

static cudaError_t bwd_run(void *arg) {
  const attn_job *j = arg;
  const zbk_attn *a = &j->a;
  size_t tiles = 2 * (size_t)BQB * BK + 2 * BQB, accs = 2 * (size_t)BK * a->hd;
  float *ws = malloc((tiles + accs) * sizeof(float));
  if (!ws) {
    standin_error("zbk_attn_bwd: out of host memory for the stand-in's tiles");
    return cudaErrorMemoryAllocation;
  }
  for (int b = 0; b < a->batch; b++) {
    size_t row0 = (size_t)b * a->t;
    bwd_ctx x = {.a = a,
                 .q = j->qkv + row0 * a->ld,
                 .k = j->qkv + row0 * a->ld + (size_t)a->heads * a->hd,
                 .o = j->o + row0 * a->lo,
                 .dout = j->dout + row0 * a->lo,
                 .lse = j->lse + (size_t)b * a->heads * a->t,
                 .dq = j->dqkv + row0 * a->ld,
                 .p = ws,
                 .ds = ws + BQB * BK,
                 .lse_t = ws + 2 * BQB * BK,
                 .dd = ws + 2 * BQB * BK + BQB};
    for (int kh = 0; kh < a->kv_heads; kh++) /* the launch's key blocks */
      for (int c0 = 0; c0 < a->t; c0 += BK)
        bwd_kv_block(&x, kh, c0, ws + tiles);
    for (int h = 0; h < a->heads; h++) /* its query blocks */
      for (int q0 = 0; q0 < a->t; q0 += BQB)
        bwd_q_block(&x, h, q0, ws + tiles);
  }
  free(ws);
  return cudaSuccess;
}

/* ---- launchers ---- */

/* The stand-in's view of device buffer p (standin.h: the twins only ever
 * see views), after checking that `floats` of it lie in one allocation. */
static cudaError_t view(const char *api, const char *arg, const void *p, size_t floats, float **out) {
  char what[96];
  snprintf(what, sizeof what, "%s %s", api, arg);
  *out = standin_view(p, floats * sizeof(float), what);
  return standin_set_last(*out ? cudaSuccess : cudaErrorInvalidValue);
}

/* Floats a buffer of `rows` rows `ld` apart spans, its last row `width` wide. */
static size_t span(size_t rows, int ld, int width) {
  return (rows - 1) * (size_t)ld + (size_t)width;
}

static cudaError_t enqueue(cudaStream_t s, standin_fn fn, const char *api, const attn_job *job) {
  if (standin_inject(api, NULL)) /* as a launch that cannot run (standin_fail.c) */
    return standin_set_last(cudaErrorLaunchOutOfResources);
  attn_job *j = malloc(sizeof *j);
  if (!j)
    return standin_set_last(cudaErrorMemoryAllocation);
  *j = *job;
  cudaError_t e = standin_enqueue(s, fn, j, free);
  if (e != cudaSuccess) {
    free(j);
    return standin_set_last(e);
  }
  return cudaGetLastError(); /* as kernels_cuda.cu's launchers return */
}

static cudaError_t bad(const char *api, const zbk_attn *a) {
  standin_error(
      "%s: bad shape (batch %d, t %d, heads %d on %d kv heads, head dim %d of at most %d, ld %d, lo %d)", api,
      a->batch, a->t, a->heads, a->kv_heads, a->hd, ZBK_ATTN_MAX_HD, a->ld, a->lo);
  return standin_set_last(cudaErrorInvalidValue);
}

cudaError_t zbk_attn_fwd(cudaStream_t s, const float *qkv, float *o, float *lse, zbk_attn a) {
  const char *api = "zbk_attn_fwd";
  if (!zbk_attn_ok(&a))
    return bad(api, &a);
  size_t rows = (size_t)a.batch * a.t;
  float *vq, *vo, *vl;
  cudaError_t e;
  if ((e = view(api, "qkv", qkv, span(rows, a.ld, (a.heads + 2 * a.kv_heads) * a.hd), &vq)) ||
      (e = view(api, "o", o, span(rows, a.lo, a.heads * a.hd), &vo)) ||
      (e = view(api, "lse", lse, rows * a.heads, &vl)))
    return e;
  return enqueue(s, fwd_run, api, &(attn_job){.a = a, .qkv = vq, .o_out = vo, .lse_out = vl});
}

cudaError_t zbk_attn_bwd(cudaStream_t s, const float *qkv, const float *o, const float *lse,
                         const float *dout, float *dqkv, zbk_attn a) {
  const char *api = "zbk_attn_bwd";
  if (!zbk_attn_ok(&a))
    return bad(api, &a);
  size_t rows = (size_t)a.batch * a.t, qkv_n = span(rows, a.ld, (a.heads + 2 * a.kv_heads) * a.hd),
         o_n = span(rows, a.lo, a.heads * a.hd);
  float *vq, *vo, *vl, *vd, *vdq;
  cudaError_t e;
  if ((e = view(api, "qkv", qkv, qkv_n, &vq)) || (e = view(api, "o", o, o_n, &vo)) ||
      (e = view(api, "lse", lse, rows * a.heads, &vl)) || (e = view(api, "dout", dout, o_n, &vd)) ||
      (e = view(api, "dqkv", dqkv, qkv_n, &vdq)))
    return e;
  uintptr_t w = (uintptr_t)dqkv, r = (uintptr_t)qkv, n = qkv_n * sizeof(float);
  if (w < r + n && r < w + n) {
    standin_error("%s: dqkv overlaps qkv", api);
    return standin_set_last(cudaErrorInvalidValue);
  }
  return enqueue(s, bwd_run, api,
                 &(attn_job){.a = a, .qkv = vq, .o = vo, .lse = vl, .dout = vd, .dqkv = vdq});
}
