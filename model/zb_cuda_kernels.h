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
/* The step's fused ops (kernels_cuda_step.cu; zb_device.h's adamw_multi
 * and sumsq_multi): the table (t; x and n) is host memory, read at the
 * call, its pointers device memory; at most ZBK_MULTI_MAX arrays per
 * kernel launch (more take several). sumsq_multi's part and part_bad hold
 * a slot per chunk (zbm_norm_chunks of each array, in order); sums and bad
 * get count entries, every one written. */
#define ZBK_MULTI_MAX 16
cudaError_t zbk_adamw_multi(cudaStream_t s, const zbm_adamw_tensor *t, int count, int mode);
cudaError_t zbk_sumsq_multi(cudaStream_t s, const float *const *x, const size_t *n, int count, double *part,
                            int *part_bad, double *sums, int *bad);
/* bf16 storage (kernels_cuda_bf16.cu; zbm_bf16_from_f32's rounding):
 * y[i] = bf16(x[i]) / y[i] = fp32(x[i]) for i < n; x and y do not overlap */
cudaError_t zbk_f32_to_bf16(cudaStream_t s, const float *x, uint16_t *y, size_t n);
cudaError_t zbk_bf16_to_f32(cudaStream_t s, const uint16_t *x, float *y, size_t n);

/* ---- causal flash attention (docs/model.md, Flash attention (CUDA)) ----
 * zb_device.h's attn_fwd / attn_bwd: the same shape (zbk_attn mirrors
 * zb_attn field for field, so this header needs no device header) and the
 * same meaning. One launch each, no scratch memory (tiles live in shared
 * memory), no atomics: every output element has one writer, so two runs
 * agree bit for bit. Head dimensions up to ZBK_ATTN_MAX_HD.
 * Tiles, which the stand-in's twins (tests/standin/attn_standin.c) follow:
 *   F: a block per (sequence, query head, ZBK_ATTN_BQ query rows) walks
 *      key tiles of ZBK_ATTN_BK up to its last row with an online softmax;
 *   B: a block per (sequence, key/value head, ZBK_ATTN_BK keys) sums dK and
 *      dV over its group's query heads and the ZBK_ATTN_BQB-row query tiles
 *      that see its keys; a block per (sequence, query head, ZBK_ATTN_BQB
 *      query rows) sums dQ over its key tiles. Both kinds run in the one
 *      launch; each recomputes P = e^(S - lse) and D = rowsum(dO o O). */
#define ZBK_ATTN_MAX_HD 128
#define ZBK_ATTN_BQ 64
#define ZBK_ATTN_BK 64
#define ZBK_ATTN_BQB 32

typedef struct zbk_attn {
  int batch, t, heads, kv_heads, hd, ld, lo;
  float scale;
} zbk_attn;

/* A shape both launchers take: positive sizes, heads in whole groups, hd
 * up to ZBK_ATTN_MAX_HD, rows wide enough. */
static inline int zbk_attn_ok(const zbk_attn *a) {
  return a->batch >= 1 && a->t >= 1 && a->heads >= 1 && a->kv_heads >= 1 && a->heads % a->kv_heads == 0 &&
         a->hd >= 1 && a->hd <= ZBK_ATTN_MAX_HD &&
         (long long)a->ld >= (long long)(a->heads + 2 * a->kv_heads) * a->hd &&
         (long long)a->lo >= (long long)a->heads * a->hd;
}

/* o [batch t, lo] and lse [batch, heads, t] from qkv. */
cudaError_t zbk_attn_fwd(cudaStream_t s, const float *qkv, float *o, float *lse, zbk_attn a);
/* dqkv (laid out as qkv; every q | k | v column written, the rows'
 * padding left alone; must not overlap qkv) from qkv, o, lse and dout. */
cudaError_t zbk_attn_bwd(cudaStream_t s, const float *qkv, const float *o, const float *lse,
                         const float *dout, float *dqkv, zbk_attn a);

#ifdef __cplusplus
}
#endif

#endif
