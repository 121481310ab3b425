/* kernels_cpu.h — the model's element-wise and row-wise kernels on the CPU
 * (plain C; matrix products go to CBLAS in model.c). Internal to zbmodel.
 *
 * Shapes are row-major: n rows of `cols` floats. The caller owns every
 * buffer; nothing here allocates or blocks. Kernels that end in _acc add to
 * their output instead of overwriting it.
 */
#ifndef KERNELS_CPU_H
#define KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#define KERNELS_CPU_LN_EPS 1e-5f

/* LayerNorm forward: xhat = (x - mean) * rstd per row, y = xhat * g + b.
 * Keeps xhat [n, h] and rstd [n] for the backward pass. */
void kernels_cpu_layernorm_fwd(const float *x, const float *g, const float *b, float *y, float *xhat,
                               float *rstd, int n, int h);

/* y = xhat * g + b: LayerNorm's output again from what F kept. */
void kernels_cpu_layernorm_affine(const float *xhat, const float *g, const float *b, float *y, int n, int h);

/* LayerNorm input gradient, added to dx: with dxhat = dy * g,
 * dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) per row. */
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

/* In place on the [t, t] score matrix of one head: row i becomes
 * softmax(s[i, 0..i]) followed by zeros (the causal mask). */
void kernels_cpu_softmax_causal(float *s, int t);

/* In place on dp [t, t]: ds = p * (dp - sum_j p * dp) per row, the masked
 * entries zero. */
void kernels_cpu_softmax_causal_bwd(const float *p, float *dp, int t);

/* In place: logits [n, v] become softmax probabilities; returns the sum over
 * rows of -log p[target] (in double, so the microbatch mean keeps fp32's
 * precision). */
double kernels_cpu_softmax_xent_fwd(float *logits, const uint8_t *targets, int n, int v);

/* In place: probs [n, v] become scale * (probs - onehot(target)). */
void kernels_cpu_softmax_xent_bwd(float *probs, const uint8_t *targets, int n, int v, float scale);

#endif
