/* kernels_cpu.c — the host's element-wise and row kernels (kernels_cpu.h).
 * The arithmetic of an element is zb_kernel_math.h's (one source with the
 * CUDA kernels); reductions run in 8 lanes so the compiler vectorises them.
 * Built with -O3 -fno-trapping-math (model/CMakeLists.txt); nothing
 * reassociates or contracts, so results are the same at any -O level. */
#include "kernels_cpu.h"

#include <math.h>
#include <string.h>

static float row_max(const float *restrict x, int n) {
  float m[LANES];
  for (int l = 0; l < LANES; l++)
    m[l] = x[0];
  int j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++)
      m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  float mx = m[0];
  for (int l = 1; l < LANES; l++)
    mx = m[l] > mx ? m[l] : mx;
  for (; j < n; j++)
    mx = x[j] > mx ? x[j] : mx;
  return mx;
}

static float row_sum(const float *restrict x, int n) {
  float s[LANES] = {0};
  int j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++)
      s[l] += x[j + l];
  float sum = 0.0f;
  for (int l = 0; l < LANES; l++)
    sum += s[l];
  for (; j < n; j++)
    sum += x[j];
  return sum;
}

ZB_VEC void kernels_cpu_layernorm_fwd(const float *x, const float *g, const float *b, float *y, float *xhat,
                                      float *rstd, int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict xr = x + (size_t)r * h;
    float *restrict hr = xhat + (size_t)r * h, *restrict yr = y + (size_t)r * h;
    float mean = row_sum(xr, h) / (float)h;
    /* Centre first: the variance of centred values does not cancel. */
    for (int c = 0; c < h; c++)
      hr[c] = xr[c] - mean;
    float rs = zbm_ln_rstd(kernels_cpu_dot(hr, hr, h), h);
    rstd[r] = rs;
    for (int c = 0; c < h; c++) {
      hr[c] *= rs;
      yr[c] = hr[c] * g[c] + b[c];
    }
  }
}

ZB_VEC void kernels_cpu_layernorm_affine(const float *xhat, const float *g, const float *b, float *y, int n,
                                         int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict hr = xhat + (size_t)r * h;
    float *restrict yr = y + (size_t)r * h;
    if (b)
      for (int c = 0; c < h; c++)
        yr[c] = hr[c] * g[c] + b[c];
    else /* RMSNorm: no shift */
      for (int c = 0; c < h; c++)
        yr[c] = hr[c] * g[c];
  }
}

ZB_VEC void kernels_cpu_layernorm_bwd_acc(const float *dy, const float *xhat, const float *rstd,
                                          const float *g, float *dx, int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict dr = dy + (size_t)r * h, *restrict hr = xhat + (size_t)r * h;
    float *restrict xr = dx + (size_t)r * h;
    float a1[LANES] = {0}, a2[LANES] = {0};
    int c = 0;
    for (; c + LANES <= h; c += LANES)
      for (int l = 0; l < LANES; l++) {
        float dxh = dr[c + l] * g[c + l];
        a1[l] += dxh;
        a2[l] += dxh * hr[c + l];
      }
    float s1 = 0.0f, s2 = 0.0f;
    for (int l = 0; l < LANES; l++) {
      s1 += a1[l];
      s2 += a2[l];
    }
    for (; c < h; c++) {
      float dxh = dr[c] * g[c];
      s1 += dxh;
      s2 += dxh * hr[c];
    }
    float m1 = s1 / (float)h, m2 = s2 / (float)h, rs = rstd[r];
    for (c = 0; c < h; c++)
      xr[c] += zbm_ln_dx(dr[c], g[c], hr[c], rs, m1, m2);
  }
}

ZB_VEC void kernels_cpu_layernorm_param_grads_acc(const float *dy, const float *xhat, float *dg, float *db,
                                                  int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *dr = dy + (size_t)r * h, *hr = xhat + (size_t)r * h;
    for (int c = 0; c < h; c++)
      dg[c] += dr[c] * hr[c];
    if (db)
      for (int c = 0; c < h; c++)
        db[c] += dr[c];
  }
}

ZB_VEC void kernels_cpu_bias_add(float *y, const float *b, int n, int cols) {
  for (int r = 0; r < n; r++) {
    float *yr = y + (size_t)r * cols;
    for (int c = 0; c < cols; c++)
      yr[c] += b[c];
  }
}

ZB_VEC void kernels_cpu_col_sums_acc(const float *dy, float *db, int n, int cols) {
  for (int r = 0; r < n; r++) {
    const float *dr = dy + (size_t)r * cols;
    for (int c = 0; c < cols; c++)
      db[c] += dr[c];
  }
}

ZB_VEC void kernels_cpu_gelu_fwd(const float *restrict u, float *restrict out, size_t len) {
  for (size_t i = 0; i < len; i++)
    out[i] = zbm_gelu(u[i]);
}

ZB_VEC void kernels_cpu_gelu_bwd_inplace(const float *restrict dout, float *restrict u, size_t len) {
  for (size_t i = 0; i < len; i++)
    u[i] = zbm_gelu_grad(u[i], dout[i]);
}

/* x[j] <- e^(x[j] - mx) over n entries; returns their sum. */
static float exp_sum(float *restrict x, int n, float mx) {
  for (int j = 0; j < n; j++)
    x[j] = zbm_exp(x[j] - mx);
  return row_sum(x, n);
}

ZB_VEC void kernels_cpu_softmax_causal(float *s, int t, int count) {
  for (int m = 0; m < count; m++)
    for (int i = 0; i < t; i++) {
      float *restrict row = s + ((size_t)m * t + i) * t;
      float inv = 1.0f / exp_sum(row, i + 1, row_max(row, i + 1));
      for (int j = 0; j <= i; j++)
        row[j] *= inv;
      for (int j = i + 1; j < t; j++)
        row[j] = 0.0f;
    }
}

ZB_VEC void kernels_cpu_softmax_causal_bwd(const float *p, float *dp, int t, int count) {
  for (int m = 0; m < count; m++)
    for (int i = 0; i < t; i++) {
      const float *restrict pr = p + ((size_t)m * t + i) * t;
      float *restrict dr = dp + ((size_t)m * t + i) * t;
      float d = kernels_cpu_dot(pr, dr, i + 1);
      for (int j = 0; j <= i; j++)
        dr[j] = zbm_softmax_bwd(pr[j], dr[j], d);
      for (int j = i + 1; j < t; j++)
        dr[j] = 0.0f;
    }
}

ZB_VEC void kernels_cpu_xent_fwd(float *logits, const int32_t *targets, double *row_loss, int n, int v) {
  for (int r = 0; r < n; r++) {
    float *restrict row = logits + (size_t)r * v;
    float mx = row_max(row, v);
    float lt = row[targets[r]] - mx;
    float sum = exp_sum(row, v, mx), inv = 1.0f / sum;
    for (int j = 0; j < v; j++)
      row[j] *= inv;
    row_loss[r] = zbm_xent_loss(sum, lt);
  }
}

ZB_VEC void kernels_cpu_xent_bwd(float *probs, const int32_t *targets, int n, int v, float scale) {
  for (int r = 0; r < n; r++) {
    float *restrict row = probs + (size_t)r * v;
    int tg = targets[r];
    for (int j = 0; j < v; j++)
      row[j] = zbm_xent_grad(row[j], j == tg, scale);
  }
}

ZB_VEC void kernels_cpu_embed_fwd(const float *emb, const float *pos, const int32_t *tokens, float *x, int n,
                                  int h, int t) {
  for (int r = 0; r < n; r++) {
    const float *restrict e = emb + (size_t)tokens[r] * h;
    float *restrict xr = x + (size_t)r * h;
    if (!pos) {
      memcpy(xr, e, (size_t)h * sizeof *xr);
      continue;
    }
    const float *restrict p = pos + (size_t)(r % t) * h;
    for (int k = 0; k < h; k++)
      xr[k] = e[k] + p[k];
  }
}

ZB_VEC void kernels_cpu_embed_bwd_acc(const float *dx, const int32_t *tokens, float *demb, float *dpos, int n,
                                      int h, int t) {
  for (int r = 0; r < n; r++) {
    const float *d = dx + (size_t)r * h;
    float *e = demb + (size_t)tokens[r] * h;
    for (int k = 0; k < h; k++)
      e[k] += d[k];
    if (!dpos)
      continue;
    float *p = dpos + (size_t)(r % t) * h;
    for (int k = 0; k < h; k++)
      p[k] += d[k];
  }
}

ZB_VEC void kernels_cpu_adamw(float *p, float *m, float *v, const float *g, const uint8_t *decay, size_t n,
                              const zbm_adamw_step *step) {
  for (size_t i = 0; i < n; i++)
    zbm_adamw(&p[i], &m[i], &v[i], g[i], decay[i], step);
}

ZB_VEC void kernels_cpu_add(float *restrict y, const float *restrict x, float alpha, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] += alpha * x[i];
}

ZB_VEC void kernels_cpu_scale(float *x, float alpha, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] *= alpha;
}

ZB_VEC void kernels_cpu_sumsq(const float *restrict x, size_t n, double *out, int *nonfinite) {
  double s[LANES] = {0};
  size_t j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++)
      s[l] += (double)x[j + l] * (double)x[j + l];
  double sum = 0.0;
  for (int l = 0; l < LANES; l++)
    sum += s[l];
  for (; j < n; j++)
    sum += (double)x[j] * (double)x[j];
  *out = sum;
  *nonfinite = !isfinite(sum);
}

/* ---- llama's row and element ops ---- */

ZB_VEC void kernels_cpu_rmsnorm_fwd(const float *x, const float *g, float *y, float *xhat, float *rstd, int n,
                                    int h, float eps) {
  for (int r = 0; r < n; r++) {
    const float *restrict xr = x + (size_t)r * h;
    float *restrict hr = xhat + (size_t)r * h, *restrict yr = y + (size_t)r * h;
    float rs = zbm_rms_rstd(kernels_cpu_dot(xr, xr, h), h, eps);
    rstd[r] = rs;
    for (int c = 0; c < h; c++) {
      hr[c] = xr[c] * rs;
      yr[c] = hr[c] * g[c];
    }
  }
}

ZB_VEC void kernels_cpu_rmsnorm_bwd_acc(const float *dy, const float *xhat, const float *rstd, const float *g,
                                        float *dx, int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict dr = dy + (size_t)r * h, *restrict hr = xhat + (size_t)r * h;
    float *restrict xr = dx + (size_t)r * h;
    float a2[LANES] = {0};
    int c = 0;
    for (; c + LANES <= h; c += LANES)
      for (int l = 0; l < LANES; l++)
        a2[l] += dr[c + l] * g[c + l] * hr[c + l];
    float s2 = 0.0f;
    for (int l = 0; l < LANES; l++)
      s2 += a2[l];
    for (; c < h; c++)
      s2 += dr[c] * g[c] * hr[c];
    float m2 = s2 / (float)h, rs = rstd[r];
    for (c = 0; c < h; c++)
      xr[c] += zbm_rms_dx(dr[c], g[c], hr[c], rs, m2);
  }
}

ZB_VEC void kernels_cpu_rope(float *x, const float *cos, const float *sin, int n, int t, int heads, int hd,
                             int ld, int inverse) {
  int half = hd / 2;
  for (int r = 0; r < n; r++) {
    const float *c = cos + (size_t)(r % t) * half, *s = sin + (size_t)(r % t) * half;
    for (int k = 0; k < heads; k++) {
      float *xh = x + (size_t)r * ld + (size_t)k * hd;
      for (int i = 0; i < half; i++)
        zbm_rope_pair(&xh[i], &xh[i + half], c[i], inverse ? -s[i] : s[i]);
    }
  }
}

ZB_VEC void kernels_cpu_swiglu_fwd(const float *restrict gate, const float *restrict up, float *restrict out,
                                   size_t len) {
  for (size_t i = 0; i < len; i++)
    out[i] = zbm_swiglu(gate[i], up[i]);
}

ZB_VEC void kernels_cpu_swiglu_bwd_inplace(const float *restrict dout, float *restrict gate,
                                           float *restrict up, size_t len) {
  for (size_t i = 0; i < len; i++)
    zbm_swiglu_grad(gate[i], up[i], dout[i], &gate[i], &up[i]);
}
