/* zb_kernel_math.h — the model's per-element and per-row arithmetic, in
 * one place for every device (docs/model.md, Devices). The host kernels
 * (kernels_cpu.c), the CUDA kernels (kernels_cuda.cu) and the CPU stand-in
 * of the CUDA launchers (tests/standin/) call these functions, so a formula
 * has one source: the devices may differ in how they reduce a row (lanes
 * on the host, a tree of threads on a GPU) but not in what they compute
 * from the reduced values.
 *
 * Everything here is `static inline` and marked ZB_HD, which is
 * `__host__ __device__` under nvcc and nothing elsewhere. No function
 * touches memory beyond its arguments, allocates or blocks; none depends on
 * <math.h> beyond sqrtf, sqrt and isfinite, which both sides provide. Results are
 * bit-identical on any host given the same inputs: nothing reassociates
 * and nothing contracts (nvcc's default --fmad=true may fuse on a GPU;
 * which is within the per-op tolerance the tests state).
 */
#ifndef ZB_KERNEL_MATH_H
#define ZB_KERNEL_MATH_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define ZB_HD __host__ __device__
#else
#define ZB_HD
#include <math.h>
#endif

/* LayerNorm's epsilon (inside the square root). */
#define ZBM_LN_EPS 1e-5f

/* e^x without libm, written so a compiler vectorises it (no call, no
 * branch): Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial for
 * e^r (Cephes' coefficients; relative error about 1.5e-7 against expf) and
 * 2^n built in the exponent bits. x is clamped to [-87, 88], so the result
 * is finite and normal; NaN stays NaN. */
ZB_HD static inline float zbm_exp(float x) {
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
  } scale = {.i = ((int32_t)n + 127) * (1 << 23)};
  return p * scale.f;
}

#define ZBM_GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define ZBM_GELU_K1 0.044715f

/* GeLU, tanh form, as x * logistic(2z): 0.5 (1 + tanh z) = 1 / (1 + e^-2z)
 * with z = sqrt(2/pi) (x + 0.044715 x^3). */
ZB_HD static inline float zbm_gelu(float x) {
  float z = ZBM_GELU_K0 * (x + ZBM_GELU_K1 * x * x * x);
  return x / (1.0f + zbm_exp(-2.0f * z));
}

/* dout * gelu'(x): with s = 1 / (1 + e^-2z), d/dx [x s] = s + 2 x s (1-s) dz/dx. */
ZB_HD static inline float zbm_gelu_grad(float x, float dout) {
  float z = ZBM_GELU_K0 * (x + ZBM_GELU_K1 * x * x * x);
  float s = 1.0f / (1.0f + zbm_exp(-2.0f * z));
  float dz = ZBM_GELU_K0 * (1.0f + 3.0f * ZBM_GELU_K1 * x * x);
  return dout * (s + 2.0f * x * s * (1.0f - s) * dz);
}

/* ---- LayerNorm, given a row's reductions ---- */

/* 1/std of a row of h values from the sum of its centred squares. */
ZB_HD static inline float zbm_ln_rstd(float centred_sumsq, int h) {
  return 1.0f / sqrtf(centred_sumsq / (float)h + ZBM_LN_EPS);
}

/* The input gradient of one element: rstd * (dy g - mean(dy g) - xhat
 * mean(dy g xhat)), given the two row means m1 = mean(dy g) and m2 =
 * mean(dy g xhat). */
ZB_HD static inline float zbm_ln_dx(float dy, float g, float xhat, float rstd, float m1, float m2) {
  return rstd * (dy * g - m1 - xhat * m2);
}

/* ---- RMSNorm (llama), given a row's sum of squares ---- */

/* 1/rms of a row of h values from the sum of their squares. */
ZB_HD static inline float zbm_rms_rstd(float sumsq, int h, float eps) {
  return 1.0f / sqrtf(sumsq / (float)h + eps);
}

/* The input gradient of one element: rstd * (dy g - xhat mean(dy g
 * xhat)), given the row mean m2 = mean(dy g xhat). */
ZB_HD static inline float zbm_rms_dx(float dy, float g, float xhat, float rstd, float m2) {
  return rstd * (dy * g - xhat * m2);
}

/* ---- SwiGLU (llama's MLP): silu(gate) * up ---- */

ZB_HD static inline float zbm_swiglu(float gate, float up) {
  return gate / (1.0f + zbm_exp(-gate)) * up;
}

/* The gradients of silu(g) u: with s = logistic(g), d/dg = dout u s (1 +
 * g (1 - s)) and d/du = dout g s. */
ZB_HD static inline void zbm_swiglu_grad(float g, float u, float dout, float *dg, float *du) {
  float s = 1.0f / (1.0f + zbm_exp(-g));
  *dg = dout * u * s * (1.0f + g * (1.0f - s));
  *du = dout * g * s;
}

/* ---- rotary position embeddings ---- */

/* Rotates the pair (x1, x2) = (x[i], x[i + d/2]) of a head by the angle of
 * cosine c and sine s, as transformers' x cos + rotate_half(x) sin does;
 * the backward rotates by -s. */
ZB_HD static inline void zbm_rope_pair(float *x1, float *x2, float c, float s) {
  float a = *x1, b = *x2;
  *x1 = a * c - b * s;
  *x2 = b * c + a * s;
}

/* ---- softmax and cross-entropy, given a row's reductions ---- */

/* The causal softmax's backward for one element: p (dp - sum_j p_j dp_j). */
ZB_HD static inline float zbm_softmax_bwd(float p, float dp, float dot) {
  return p * (dp - dot);
}

/* -log p[target] of a row from its sum of e^(x - max) and its target's
 * logit minus the max: exact even where p[target] underflows. In double,
 * so the microbatch's mean keeps fp32's precision. */
ZB_HD static inline double zbm_xent_loss(float exp_sum, float target_minus_max) {
  return log((double)exp_sum) - (double)target_minus_max;
}

/* The logits' gradient of one element: scale (p - [j is the target]). */
ZB_HD static inline float zbm_xent_grad(float p, int is_target, float scale) {
  return (is_target ? p - 1.0f : p) * scale;
}

/* ---- AdamW, one element ---- */

/* The step's constants (docs/model.md, Optimizer and step), computed once
 * per step on the host: step t from 1. */
typedef struct zbm_adamw_step {
  double beta1, beta2, eps;
  double step_size;  /* lr / (1 - beta1^t) */
  double sqrt_bc2;   /* sqrt(1 - beta2^t) */
  double shrink;     /* 1 - lr * weight_decay, applied where decay is on */
  double grad_scale; /* clipping: every gradient times this (1: none) */
} zbm_adamw_step;

/* The new fp32 moments of one element, each rounded once from double. */
ZB_HD static inline void zbm_adamw_moments(float m, float v, float grad, const zbm_adamw_step *s,
                                           float *m_out, float *v_out) {
  double g = (double)grad * s->grad_scale;
  double mm = s->beta1 * (double)m + (1 - s->beta1) * g;
  double vv = s->beta2 * (double)v + (1 - s->beta2) * g * g;
  *m_out = (float)mm;
  *v_out = (float)vv;
}

/* The new parameter from the new (stored) moments, in double, rounded once. */
ZB_HD static inline float zbm_adamw_param(float p, float m_new, float v_new, int decay,
                                          const zbm_adamw_step *s) {
  double x = (double)p;
  if (decay)
    x *= s->shrink;
  x -= s->step_size * (double)m_new / (sqrt((double)v_new) / s->sqrt_bc2 + s->eps);
  return (float)x;
}

/* Updates one parameter and its fp32 moments in torch.optim.AdamW's order,
 * in double, each stored value rounded once; the update reads the moments
 * as stored (as an fp32 implementation does). The two halves above, so a
 * step split into them (zbm_adamw_tensor's modes) is this one bit for bit. */
ZB_HD static inline void zbm_adamw(float *p, float *m, float *v, float grad, int decay,
                                   const zbm_adamw_step *s) {
  zbm_adamw_moments(*m, *v, grad, s, m, v);
  *p = zbm_adamw_param(*p, *m, *v, decay, s);
}

/* One array of a multi-tensor AdamW (zb_device.h adamw_multi; device
 * pointers, n elements each, its own step constants). keep: n floats, used
 * by ZBM_ADAMW_TRY only. */
typedef struct zbm_adamw_tensor {
  float *p, *m, *v;
  const float *g;
  const uint8_t *decay;
  float *keep;
  size_t n;
  zbm_adamw_step step;
} zbm_adamw_tensor;

/* What a multi-tensor AdamW writes (docs/model.md, Optimizer and step):
 *   FULL:   p, m and v (zbm_adamw);
 *   TRY:    keep = the old p, p = the new p; m and v stay as they were;
 *   COMMIT: m and v, from the same (m, v, g) and constants as the TRY
 *           before it, so TRY then COMMIT is FULL bit for bit, and
 *           TRY then p = keep is no step at all. */
typedef enum zbm_adamw_mode { ZBM_ADAMW_FULL = 0, ZBM_ADAMW_TRY = 1, ZBM_ADAMW_COMMIT = 2 } zbm_adamw_mode;

/* Element i of t under mode: what every device's multi-tensor AdamW does. */
ZB_HD static inline void zbm_adamw_at(const zbm_adamw_tensor *t, size_t i, int mode) {
  float m, v;
  zbm_adamw_moments(t->m[i], t->v[i], t->g[i], &t->step, &m, &v);
  if (mode != ZBM_ADAMW_COMMIT) {
    float p = t->p[i];
    if (mode == ZBM_ADAMW_TRY)
      t->keep[i] = p;
    t->p[i] = zbm_adamw_param(p, m, v, t->decay[i] != 0, &t->step);
  }
  if (mode != ZBM_ADAMW_TRY) {
    t->m[i] = m;
    t->v[i] = v;
  }
}

/* ---- the gradient norm's summation order ----
 * Every device sums squares in this order (docs/model.md, Optimizer and
 * step), so the stand-in and the host device compute what a GPU computes:
 * an array is cut into chunks of ZBM_NORM_CHUNK elements; a chunk's
 * ZBM_NORM_LANES lanes each add x[l], x[l + LANES], ... in sequence, in
 * double; the lanes meet in a pairwise tree within each group of 32 (a
 * warp's butterfly), then the groups' sums in a pairwise tree. The chunks'
 * sums of an array are added by the same rule over the chunks (lanes, then
 * trees). Depends on the lengths only, never on timing. */
#define ZBM_NORM_CHUNK 8192
#define ZBM_NORM_LANES 256

/* Pairwise tree over b[0..w) (w a power of two), in place: b[0] is the sum. */
ZB_HD static inline double zbm_tree_d(double *b, int w) {
  for (int h = w / 2; h >= 1; h /= 2)
    for (int i = 0; i < h; i++)
      b[i] = b[i] + b[i + h];
  return b[0];
}

/* The rule over ZBM_NORM_LANES lane sums (overwritten). */
ZB_HD static inline double zbm_lanes_total(double *lane) {
  double warp[ZBM_NORM_LANES / 32];
  for (int w = 0; w < ZBM_NORM_LANES / 32; w++)
    warp[w] = zbm_tree_d(lane + 32 * w, 32);
  return zbm_tree_d(warp, ZBM_NORM_LANES / 32);
}

/* Chunks of an array of n elements. */
ZB_HD static inline size_t zbm_norm_chunks(size_t n) {
  return (n + ZBM_NORM_CHUNK - 1) / ZBM_NORM_CHUNK;
}

/* The rule over x[0..n) as one device block runs it: a chunk of squares
 * (sq = 1, *bad |= any x not finite) or the chunk sums of an array
 * (sq = 0, xd instead of x). The host device and the stand-in call this;
 * the GPU kernels follow it with threads (kernels_cuda_step.cu). */
ZB_HD static inline double zbm_norm_block(const float *x, const double *xd, size_t n, int *bad) {
  double lane[ZBM_NORM_LANES];
  int nf = 0;
  for (int l = 0; l < ZBM_NORM_LANES; l++) {
    double s = 0.0;
    for (size_t i = (size_t)l; i < n; i += ZBM_NORM_LANES) {
      if (x) {
        double v = (double)x[i];
        nf |= !isfinite(x[i]);
        s += v * v;
      } else {
        s += xd[i];
      }
    }
    lane[l] = s;
  }
  if (bad)
    *bad |= nf;
  return zbm_lanes_total(lane);
}

/* ---- bf16 ---- */

/* bfloat16: the top 16 bits of an fp32 (sign, 8 exponent bits, 7 mantissa
 * bits). fp32 -> bf16 rounds to nearest, ties to even, as the GPU's
 * __float2bfloat16_rn does: subnormals round like any value (bf16 has the
 * same exponent range, so they stay subnormal or become 0 or the smallest
 * normal), finite values past the largest bf16 become +-Inf, Inf stays Inf
 * and every NaN becomes the canonical NaN 0x7fff (rounding a NaN's bits
 * could turn it into Inf). bf16 -> fp32 is exact. */
typedef union zbm_f32_bits {
  float f;
  uint32_t u;
} zbm_f32_bits;

ZB_HD static inline uint16_t zbm_bf16_from_f32(float x) {
  zbm_f32_bits b;
  b.f = x;
  if ((b.u & 0x7fffffffu) > 0x7f800000u)
    return 0x7fff;
  uint32_t lsb = (b.u >> 16) & 1u;
  return (uint16_t)((b.u + 0x7fffu + lsb) >> 16);
}

ZB_HD static inline float zbm_f32_from_bf16(uint16_t h) {
  zbm_f32_bits b;
  b.u = (uint32_t)h << 16;
  return b.f;
}

#endif
