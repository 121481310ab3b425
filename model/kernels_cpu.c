#include "kernels_cpu.h"

#include <math.h>

/* Row reductions in 8 independent lanes: the compiler vectorises them
 * (a single accumulator would be a serial chain, and reassociating it is
 * not allowed without -ffast-math). */
#define LANES 8

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

static float dot(const float *restrict a, const float *restrict b, int n) {
  float s[LANES] = {0};
  int j = 0;
  for (; j + LANES <= n; j += LANES)
    for (int l = 0; l < LANES; l++)
      s[l] += a[j + l] * b[j + l];
  float sum = 0.0f;
  for (int l = 0; l < LANES; l++)
    sum += s[l];
  for (; j < n; j++)
    sum += a[j] * b[j];
  return sum;
}

void kernels_cpu_layernorm_fwd(const float *x, const float *g, const float *b, float *y, float *xhat,
                               float *rstd, int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict xr = x + (size_t)r * h;
    float *restrict hr = xhat + (size_t)r * h, *restrict yr = y + (size_t)r * h;
    float mean = row_sum(xr, h) / (float)h;
    /* Centre first: the variance of centred values does not cancel. */
    for (int c = 0; c < h; c++)
      hr[c] = xr[c] - mean;
    float rs = 1.0f / sqrtf(dot(hr, hr, h) / (float)h + KERNELS_CPU_LN_EPS);
    rstd[r] = rs;
    for (int c = 0; c < h; c++) {
      hr[c] *= rs;
      yr[c] = hr[c] * g[c] + b[c];
    }
  }
}

void kernels_cpu_layernorm_affine(const float *xhat, const float *g, const float *b, float *y, int n, int h) {
  for (int r = 0; r < n; r++) {
    const float *restrict hr = xhat + (size_t)r * h;
    float *restrict yr = y + (size_t)r * h;
    for (int c = 0; c < h; c++)
      yr[c] = hr[c] * g[c] + b[c];
  }
}

void kernels_cpu_layernorm_bwd_acc(const float *dy, const float *xhat, const float *rstd, const float *g,
                                   float *dx, int n, int h) {
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
      xr[c] += rs * (dr[c] * g[c] - m1 - hr[c] * m2);
  }
}

void kernels_cpu_layernorm_param_grads_acc(const float *dy, const float *xhat, float *dg, float *db, int n,
                                           int h) {
  for (int r = 0; r < n; r++) {
    const float *dr = dy + (size_t)r * h, *hr = xhat + (size_t)r * h;
    for (int c = 0; c < h; c++) {
      dg[c] += dr[c] * hr[c];
      db[c] += dr[c];
    }
  }
}

void kernels_cpu_bias_add(float *y, const float *b, int n, int cols) {
  for (int r = 0; r < n; r++) {
    float *yr = y + (size_t)r * cols;
    for (int c = 0; c < cols; c++)
      yr[c] += b[c];
  }
}

void kernels_cpu_col_sums_acc(const float *dy, float *db, int n, int cols) {
  for (int r = 0; r < n; r++) {
    const float *dr = dy + (size_t)r * cols;
    for (int c = 0; c < cols; c++)
      db[c] += dr[c];
  }
}

/* expf for the kernels' hot loops, written so the compiler vectorises it
 * (no libm call, no branch): Cody-Waite range reduction x = n ln2 + r, a
 * degree-6 polynomial for e^r (Cephes' coefficients, max relative error
 * about 1.5e-7 against expf), and 2^n built in the exponent bits. Inputs
 * are clamped to [-87, 88], so the result is finite and normal (e^-87 >
 * FLT_MIN); NaN stays NaN (the polynomial carries it; n is zeroed first
 * so the int conversion stays defined). */
static inline float kexp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  /* n = round(x / ln2) by the 1.5 * 2^23 trick (round to nearest even). */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  n = n == n ? n : 0.0f;
  union {
    int32_t i;
    float f;
  } scale = {.i = ((int32_t)n + 127) << 23};
  return p * scale.f;
}

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* GeLU's tanh form rewritten with the logistic function: 0.5 (1 + tanh(z))
 * = 1 / (1 + e^-2z), one exp and one division per element. */
void kernels_cpu_gelu_fwd(const float *restrict u, float *restrict out, size_t len) {
  for (size_t i = 0; i < len; i++) {
    float x = u[i];
    float z = GELU_K0 * (x + GELU_K1 * x * x * x);
    out[i] = x / (1.0f + kexp(-2.0f * z));
  }
}

/* d/dx [x s(x)] with s = 1 / (1 + e^-2z): s + 2 x s (1 - s) dz/dx. */
void kernels_cpu_gelu_bwd_inplace(const float *restrict dout, float *restrict u, size_t len) {
  for (size_t i = 0; i < len; i++) {
    float x = u[i];
    float z = GELU_K0 * (x + GELU_K1 * x * x * x);
    float s = 1.0f / (1.0f + kexp(-2.0f * z));
    float dz = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
    u[i] = dout[i] * (s + 2.0f * x * s * (1.0f - s) * dz);
  }
}

/* x[j] <- e^(x[j] - mx) over n entries; returns their sum. */
static float exp_sum(float *restrict x, int n, float mx) {
  for (int j = 0; j < n; j++)
    x[j] = kexp(x[j] - mx);
  return row_sum(x, n);
}

void kernels_cpu_softmax_causal(float *s, int t) {
  for (int i = 0; i < t; i++) {
    float *restrict row = s + (size_t)i * t;
    float inv = 1.0f / exp_sum(row, i + 1, row_max(row, i + 1));
    for (int j = 0; j <= i; j++)
      row[j] *= inv;
    for (int j = i + 1; j < t; j++)
      row[j] = 0.0f;
  }
}

void kernels_cpu_softmax_causal_bwd(const float *p, float *dp, int t) {
  for (int i = 0; i < t; i++) {
    const float *restrict pr = p + (size_t)i * t;
    float *restrict dr = dp + (size_t)i * t;
    float d = dot(pr, dr, i + 1);
    for (int j = 0; j <= i; j++)
      dr[j] = pr[j] * (dr[j] - d);
    for (int j = i + 1; j < t; j++)
      dr[j] = 0.0f;
  }
}

double kernels_cpu_softmax_xent_fwd(float *logits, const uint8_t *targets, int n, int v) {
  double loss = 0.0;
  for (int r = 0; r < n; r++) {
    float *restrict row = logits + (size_t)r * v;
    float mx = row_max(row, v);
    /* -log p[target] = log(sum) - (logit[target] - max): exact even where p underflows. */
    float lt = row[targets[r]] - mx;
    float sum = exp_sum(row, v, mx), inv = 1.0f / sum;
    for (int j = 0; j < v; j++)
      row[j] *= inv;
    loss += log((double)sum) - (double)lt;
  }
  return loss;
}

void kernels_cpu_softmax_xent_bwd(float *probs, const uint8_t *targets, int n, int v, float scale) {
  for (int r = 0; r < n; r++) {
    float *row = probs + (size_t)r * v;
    row[targets[r]] -= 1.0f;
    for (int j = 0; j < v; j++)
      row[j] *= scale;
  }
}
