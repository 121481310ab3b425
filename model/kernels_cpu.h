/* kernels_cpu.h — the model's element-wise and row-wise kernels on the
 * host: the compute behind the host device's ops (device_host.c; matrix
 * products go to CBLAS there). Internal to zbmodel. The per-element
 * arithmetic is zb_kernel_math.h's, shared with the CUDA kernels; what is
 * here is how the host walks rows (8-lane reductions, so loops vectorise).
 *
 * Shapes are row-major: n rows of `cols` floats. The caller owns every
 * buffer; nothing here allocates, blocks or fails. Kernels that end in
 * _acc add to their output instead of overwriting it.
 */
#ifndef KERNELS_CPU_H
#define KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "zb_kernel_math.h"

/* Each kernel is built for AVX-512, AVX2 and the x86-64 baseline, and the
 * loader picks the widest the CPU has (GCC's target_clones, an ifunc): the
 * element-wise loops are 2-4x faster on wide units. The clones compute the
 * same operations in the same order (C11 mode: no contraction, no
 * reassociation), so a result does not depend on the CPU. Sanitizer builds
 * keep one version. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define ZB_VEC __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZB_VEC
#endif

/* Row reductions in 8 independent lanes: the compiler vectorises them
 * (a single accumulator would be a serial chain, and reassociating it is
 * not allowed without -ffast-math). */
#define LANES 8

/* a . b over n floats, in LANES lanes summed in order, then the tail. */
static inline float kernels_cpu_dot(const float *restrict a, const float *restrict b, int n) {
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

/* LayerNorm forward: xhat = (x - mean) * rstd per row, y = xhat * g + b.
 * Keeps xhat [n, h] and rstd [n] for the backward pass. */
void kernels_cpu_layernorm_fwd(const float *x, const float *g, const float *b, float *y, float *xhat,
                               float *rstd, int n, int h);

/* y = xhat * g + b: LayerNorm's output again from what F kept. */
void kernels_cpu_layernorm_affine(const float *xhat, const float *g, const float *b, float *y, int n, int h);

/* LayerNorm input gradient, added to dx: zbm_ln_dx per element with the
 * row means of dy g and dy g xhat. */
void kernels_cpu_layernorm_bwd_acc(const float *dy, const float *xhat, const float *rstd, const float *g,
                                   float *dx, int n, int h);

/* LayerNorm parameter gradients: dg += sum_rows dy * xhat, db += sum_rows dy. */
void kernels_cpu_layernorm_param_grads_acc(const float *dy, const float *xhat, float *dg, float *db, int n,
                                           int h);

/* y[r, c] += b[c]. */
void kernels_cpu_bias_add(float *y, const float *b, int n, int cols);

/* db[c] += sum_r dy[r, c]. */
void kernels_cpu_col_sums_acc(const float *dy, float *db, int n, int cols);

/* out = gelu(u), tanh approximation, over len elements. */
void kernels_cpu_gelu_fwd(const float *u, float *out, size_t len);

/* In place: u <- dout * gelu'(u), turning the kept pre-activation into the
 * pre-activation's gradient. */
void kernels_cpu_gelu_bwd_inplace(const float *dout, float *u, size_t len);

/* In place on count [t, t] score matrices (stride t*t): row i becomes
 * softmax(s[i, 0..i]) followed by zeros (the causal mask). Entries above
 * the diagonal are not read. */
void kernels_cpu_softmax_causal(float *s, int t, int count);

/* In place on count dp [t, t]: ds = p * (dp - sum_j p * dp) per row on and
 * below the diagonal, zero above it (not read there). */
void kernels_cpu_softmax_causal_bwd(const float *p, float *dp, int t, int count);

/* In place: logits [n, v] become softmax probabilities; row_loss[r] =
 * -log p[target[r]] in double. */
void kernels_cpu_xent_fwd(float *logits, const int32_t *targets, double *row_loss, int n, int v);

/* In place: probs [n, v] become scale * (probs - onehot(target)). */
void kernels_cpu_xent_bwd(float *probs, const int32_t *targets, int n, int v, float scale);

/* x[r] = emb[tokens[r]] + pos[r % t], rows of h; without pos (NULL)
 * x[r] = emb[tokens[r]]. Ids are not checked. */
void kernels_cpu_embed_fwd(const float *emb, const float *pos, const int32_t *tokens, float *x, int n, int h,
                           int t);

/* demb[tokens[r]] += dx[r]; dpos[r % t] += dx[r] unless dpos is NULL;
 * rows in order. */
void kernels_cpu_embed_bwd_acc(const float *dx, const int32_t *tokens, float *demb, float *dpos, int n, int h,
                               int t);

/* One AdamW step (zbm_adamw) over n parameters; decay[i] is 0 or 1. */
void kernels_cpu_adamw(float *p, float *m, float *v, const float *g, const uint8_t *decay, size_t n,
                       const zbm_adamw_step *step);

/* y += alpha * x. */
void kernels_cpu_add(float *y, const float *x, float alpha, size_t n);

/* x *= alpha. */
void kernels_cpu_scale(float *x, float alpha, size_t n);

/* Sum of squares in double; *nonfinite = 1 when any element is NaN or
 * infinite (the double sum of finite floats' squares cannot overflow). */
void kernels_cpu_sumsq(const float *x, size_t n, double *out, int *nonfinite);

/* llama's ops (zb_device.h has their contracts): RMSNorm forward and
 * input gradient, rotary embeddings in place, SwiGLU and its gradients
 * in place. */
void kernels_cpu_rmsnorm_fwd(const float *x, const float *g, float *y, float *xhat, float *rstd, int n, int h,
                             float eps);
void kernels_cpu_rmsnorm_bwd_acc(const float *dy, const float *xhat, const float *rstd, const float *g,
                                 float *dx, int n, int h);
void kernels_cpu_rope(float *x, const float *cos, const float *sin, int n, int t, int heads, int hd, int ld,
                      int inverse);
void kernels_cpu_swiglu_fwd(const float *gate, const float *up, float *out, size_t len);
void kernels_cpu_swiglu_bwd_inplace(const float *dout, float *gate, float *up, size_t len);

#endif
