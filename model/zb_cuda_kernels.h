/* zb_cuda_kernels.h — launchers of the model's CUDA kernels
 * (docs/model.md, Devices): one per element-wise or row op of zb_device.h,
 * same arguments and meaning, plus the stream to launch on. The CUDA
 * device (device_cuda.c) calls them; they are implemented twice:
 *   - kernels_cuda.cu, kernels_cuda_bf16.cu (nvcc, in zb-worker): real
 *     kernels;
 *   - tests/standin/ (test-only): host loops over the same per-element
 *     arithmetic (zb_kernel_math.h), run in order on the stream's thread
 *     of the CPU stand-in of the CUDA runtime.
 * So device_cuda.c, the file that ships, runs unchanged against both.
 *
 * Every pointer is device memory (tokens, targets and decay are bytes).
 * A launcher enqueues and returns the launch's status (cudaSuccess, or
 * the error cudaGetLastError reports after the launch); errors during
 * execution surface at the next synchronisation, as in CUDA. A count of 0
 * launches nothing. No launcher allocates or blocks.
 */
#ifndef ZB_CUDA_KERNELS_H
#define ZB_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "zb_kernel_math.h"

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t zbk_embed_fwd(cudaStream_t s, const float *emb, const float *pos, const int32_t *tokens, float *x,
                          int n, int h, int t);
cudaError_t zbk_embed_bwd_acc(cudaStream_t s, const float *dx, const int32_t *tokens, float *demb,
                              float *dpos, int n, int h, int t);
cudaError_t zbk_layernorm_fwd(cudaStream_t s, const float *x, const float *g, const float *b, float *y,
                              float *xhat, float *rstd, int n, int h);
cudaError_t zbk_layernorm_affine(cudaStream_t s, const float *xhat, const float *g, const float *b, float *y,
                                 int n, int h);
cudaError_t zbk_layernorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                  const float *g, float *dx, int n, int h);
cudaError_t zbk_layernorm_param_grads_acc(cudaStream_t s, const float *dy, const float *xhat, float *dg,
                                          float *db, int n, int h);
cudaError_t zbk_rmsnorm_fwd(cudaStream_t s, const float *x, const float *g, float *y, float *xhat,
                            float *rstd, int n, int h, float eps);
cudaError_t zbk_rmsnorm_bwd_acc(cudaStream_t s, const float *dy, const float *xhat, const float *rstd,
                                const float *g, float *dx, int n, int h);
cudaError_t zbk_rope(cudaStream_t s, float *x, const float *cos, const float *sin, int n, int t, int heads,
                     int hd, int ld, int inverse);
cudaError_t zbk_swiglu_fwd(cudaStream_t s, const float *gate, const float *up, float *out, size_t len);
cudaError_t zbk_swiglu_bwd_inplace(cudaStream_t s, const float *dout, float *gate, float *up, size_t len);
cudaError_t zbk_bias_add(cudaStream_t s, float *y, const float *b, int n, int cols);
cudaError_t zbk_col_sums_acc(cudaStream_t s, const float *dy, float *db, int n, int cols);
cudaError_t zbk_gelu_fwd(cudaStream_t s, const float *u, float *out, size_t len);
cudaError_t zbk_gelu_bwd_inplace(cudaStream_t s, const float *dout, float *u, size_t len);
cudaError_t zbk_softmax_causal(cudaStream_t s, float *p, int t, int count);
cudaError_t zbk_softmax_causal_bwd(cudaStream_t s, const float *p, float *dp, int t, int count);
cudaError_t zbk_xent_fwd(cudaStream_t s, float *logits, const int32_t *targets, double *row_loss, int n,
                         int v);
cudaError_t zbk_xent_bwd(cudaStream_t s, float *probs, const int32_t *targets, int n, int v, float scale);
cudaError_t zbk_adamw(cudaStream_t s, float *p, float *m, float *v, const float *g, const uint8_t *decay,
                      size_t n, zbm_adamw_step step);
cudaError_t zbk_add(cudaStream_t s, float *y, const float *x, float alpha, size_t n);
cudaError_t zbk_scale(cudaStream_t s, float *x, float alpha, size_t n);
/* *out = sum x^2 (double), *nonfinite = any x not finite (0 or 1); both overwritten */
cudaError_t zbk_sumsq(cudaStream_t s, const float *x, size_t n, double *out, int *nonfinite);
/* bf16 storage (kernels_cuda_bf16.cu; zbm_bf16_from_f32's rounding):
 * y[i] = bf16(x[i]) / y[i] = fp32(x[i]) for i < n; x and y do not overlap */
cudaError_t zbk_f32_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n);
cudaError_t zbk_bf16_to_f32(cudaStream_t s, const uint16_t *x, float *y, size_t n);

#ifdef __cplusplus
}
#endif

#endif
