/* device_cuda.c — the CUDA device of zb_device.h (docs/model.md, Devices):
 * one non-blocking compute stream, a cuBLAS handle bound to it, a caching
 * allocator, events from the runtime, and the project's kernels through the
 * zbk_* launchers of zb_cuda_kernels.h.
 *
 * It calls only a small subset of the CUDA runtime and cuBLAS, so that the
 * same file runs against the real libraries (products) and against the CPU
 * stand-in of them (tests/standin/, test binaries): cudaGetDeviceCount,
 * cudaSetDevice, cudaGetDeviceProperties, cudaDriverGetVersion,
 * cudaStreamCreateWithFlags, cudaStreamDestroy, cudaStreamSynchronize,
 * cudaMalloc, cudaFree, cudaFreeAsync (exact mode), cudaMemGetInfo, cudaMemcpyAsync, cudaMemcpy2DAsync,
 * cudaMemsetAsync, cudaEventCreate, cudaEventDestroy, cudaEventRecord, cudaEventElapsedTime,
 * cudaGetErrorString, cudaGetLastError; cublasCreate, cublasDestroy,
 * cublasSetStream, cublasSetMathMode, cublasSetWorkspace, cublasGemmStridedBatchedEx (fp32, or
 * bf16 A and B with an fp32 C).
 *
 * Allocator: blocks from cudaMalloc are rounded up to a size class (512
 * bytes, then four classes per power of two) and, when given back, kept in
 * that class's free list for the next request of the class. `current` and
 * `peak` count the bytes asked for, exactly; `cached` counts the (rounded)
 * bytes of the free blocks; `held` (and its high-water `held_peak`) counts
 * every block taken from cudaMalloc at its rounded size, live or cached,
 * and the cuBLAS workspace (a block of its own, given to the handle with
 * cublasSetWorkspace), with cudaMemGetInfo's used bytes sampled at each
 * new high (docs/model.md, Memory accounting). Reusing a block at once is safe because every
 * op runs on the one stream, in order: whatever used the block before is
 * queued ahead of whatever uses it next. When cudaMalloc runs out, the free
 * blocks go back to CUDA and the request is tried once more. On the CPU
 * stand-in the allocator is exact instead (device_cuda_alloc.c): no
 * caching, so the stand-in names a use after free or an overrun of a block.
 *
 * Threads: one thread at a time (zb_device.h); each call makes the device
 * current on the calling thread first, so the thread may change between
 * calls. Errors: a CUDA or cuBLAS failure names the call and the library's
 * message and poisons the device (every later call returns the first
 * error); a bad argument is ZB_ERR_INVALID_ARG and does not poison.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_cuda_internal.h"
#include "zb_cuda_kernels.h"
#include "zb_names.h"

/* tests/standin/standin.h's STANDIN_DEVICE_NAME: the stand-in says so. */
#define STANDIN_NAME "zb CPU stand-in (not a GPU)"

struct zb_device_event {
  cudaEvent_t ev;
};

/* ---- errors ---- */

zb_err cuda_fail(cuda_dev *d, zb_diag *diag, zb_err err, const char *fmt, ...) {
  if (d->err == ZB_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err_msg, sizeof d->err_msg, fmt, ap);
    va_end(ap);
    d->err = err;
  }
  return zb_diag_set(diag, d->err, "%s", d->err_msg);
}

zb_err cuda_ok(cuda_dev *d, zb_diag *diag, cudaError_t e, const char *call) {
  if (e == cudaSuccess)
    return ZB_OK;
  return cuda_fail(d, diag, ZB_ERR_IO, "cuda device %d: %s: %s (error %d)", d->ordinal, call,
                   cudaGetErrorString(e), (int)e);
}

static const char *cublas_status_name(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "an unknown cuBLAS status";
}

static zb_err cublas_ok(cuda_dev *d, zb_diag *diag, cublasStatus_t s, const char *call) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return ZB_OK;
  return cuda_fail(d, diag, ZB_ERR_IO, "cuda device %d: %s: %s (status %d)", d->ordinal, call,
                   cublas_status_name(s), (int)s);
}

/* Every call starts here: the first error again, or the device made
 * current on this thread. An error another call left as this thread's last
 * error (a polling transport's "not ready", a failed call its caller
 * handled) is cleared, since a launch's status is read with
 * cudaGetLastError (zbk_*) and cuBLAS may read it too; a sticky error
 * cannot be cleared and is reported by the next call. */
zb_err cuda_enter(cuda_dev *d, zb_diag *diag) {
  if (d->err != ZB_OK)
    return zb_diag_set(diag, d->err, "%s", d->err_msg);
  zb_err err = cuda_ok(d, diag, cudaSetDevice(d->ordinal), "cudaSetDevice");
  if (!err)
    (void)cudaGetLastError();
  return err;
}

zb_err cuda_bad_arg(zb_diag *diag, const char *op, const char *what) {
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cuda device: %s: %s", op, what);
}

/* ---- copies, sync ---- */

static zb_err dev_copy(void *self, void *dst, const void *src, size_t bytes, zb_copy_kind kind,
                       zb_diag *diag) {
  cuda_dev *d = self;
  static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                              cudaMemcpyDeviceToDevice};
  if ((unsigned)kind > ZB_COPY_D2D)
    return cuda_bad_arg(diag, "copy", "unknown copy kind");
  zb_err err = cuda_enter(d, diag);
  if (err || bytes == 0)
    return err;
  if (!dst || !src)
    return cuda_bad_arg(diag, "copy", "NULL buffer");
  return cuda_ok(d, diag, cudaMemcpyAsync(dst, src, bytes, kinds[kind], d->stream), "cudaMemcpyAsync");
}

static zb_err dev_copy_2d(void *self, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t rows, zb_diag *diag) {
  cuda_dev *d = self;
  if (width > dpitch || width > spitch)
    return cuda_bad_arg(diag, "copy_2d", "row width larger than a pitch");
  zb_err err = cuda_enter(d, diag);
  if (err || width == 0 || rows == 0)
    return err;
  return cuda_ok(
      d, diag, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, d->stream),
      "cudaMemcpy2DAsync");
}

static zb_err dev_zero(void *self, void *p, size_t bytes, zb_diag *diag) {
  cuda_dev *d = self;
  if (!p && bytes)
    return cuda_bad_arg(diag, "zero", "NULL buffer");
  zb_err err = cuda_enter(d, diag);
  if (err || bytes == 0)
    return err;
  return cuda_ok(d, diag, cudaMemsetAsync(p, 0, bytes, d->stream), "cudaMemsetAsync");
}

static zb_err dev_sync(void *self, zb_diag *diag) {
  cuda_dev *d = self;
  d->host_syncs++;
  zb_err err = cuda_enter(d, diag);
  if (err)
    return err;
  return cuda_ok(d, diag, cudaStreamSynchronize(d->stream), "cudaStreamSynchronize");
}

static int64_t dev_host_syncs(void *self) {
  return ((cuda_dev *)self)->host_syncs;
}

static void dev_info(void *self, zb_device_info *out) {
  *out = ((cuda_dev *)self)->info;
}

static void *dev_stream(void *self) {
  return (void *)((cuda_dev *)self)->stream;
}

/* ---- events ---- */

static zb_err dev_event_new(void *self, zb_device_event **out, zb_diag *diag) {
  cuda_dev *d = self;
  if (!out)
    return cuda_bad_arg(diag, "event_new", "no output pointer");
  *out = NULL;
  zb_err err = cuda_enter(d, diag);
  if (err)
    return err;
  zb_device_event *e = calloc(1, sizeof *e);
  if (!e)
    return cuda_fail(d, diag, ZB_ERR_IO, "cuda device %d: out of host memory for an event", d->ordinal);
  if ((err = cuda_ok(d, diag, cudaEventCreate(&e->ev), "cudaEventCreate"))) {
    free(e);
    return err;
  }
  *out = e;
  return ZB_OK;
}

static void dev_event_free(void *self, zb_device_event *e) {
  (void)self;
  if (e) {
    cudaEventDestroy(e->ev);
    free(e);
  }
}

static zb_err dev_event_record(void *self, zb_device_event *e, zb_diag *diag) {
  cuda_dev *d = self;
  if (!e)
    return cuda_bad_arg(diag, "event_record", "NULL event");
  zb_err err = cuda_enter(d, diag);
  return err ? err : cuda_ok(d, diag, cudaEventRecord(e->ev, d->stream), "cudaEventRecord");
}

static zb_err dev_event_elapsed_ms(void *self, zb_device_event *start, zb_device_event *end, float *ms,
                                   zb_diag *diag) {
  cuda_dev *d = self;
  if (!start || !end || !ms)
    return cuda_bad_arg(diag, "event_elapsed_ms", "NULL event or output");
  zb_err err = cuda_enter(d, diag);
  return err ? err : cuda_ok(d, diag, cudaEventElapsedTime(ms, start->ev, end->ev), "cudaEventElapsedTime");
}

/* ---- gemm ---- */

static zb_err gemm_check(const zb_gemm *g, zb_diag *diag) {
  if (!g || g->m < 0 || g->n < 0 || g->k < 0 || g->batch < 1)
    return cuda_bad_arg(diag, "gemm", "negative shape or batch < 1");
  int a_cols = g->trans_a ? g->m : g->k, b_cols = g->trans_b ? g->k : g->n;
  if (g->lda < (a_cols > 1 ? a_cols : 1) || g->ldb < (b_cols > 1 ? b_cols : 1) ||
      g->ldc < (g->n > 1 ? g->n : 1))
    return cuda_bad_arg(diag, "gemm", "a leading dimension is smaller than its matrix's row");
  if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0)
    return cuda_bad_arg(diag, "gemm", "negative batch stride");
  if ((g->a16 == NULL) != (g->b16 == NULL))
    return cuda_bad_arg(diag, "gemm", "one bf16 operand: a16 and b16 go together");
  return ZB_OK;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a
 * row-major matrix read column-major is its transpose, so cuBLAS gets B
 * first, n and m swapped, the same transposes and the same leading
 * dimensions. */
static zb_err dev_gemm(void *self, const zb_gemm *g, zb_diag *diag) {
  cuda_dev *d = self;
  zb_err err = gemm_check(g, diag);
  if (err || (err = cuda_enter(d, diag)) || g->m == 0 || g->n == 0)
    return err;
  /* fp32: CUBLAS_COMPUTE_32F under CUBLAS_DEFAULT_MATH never uses TF32
   * (only NVIDIA_TF32_OVERRIDE=1 in the environment would); the pedantic
   * type is documented as slower and meant for testing. */
  static const cublasComputeType_t compute[] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32,
                                                CUBLAS_COMPUTE_32F_FAST_16BF};
  /* bf16 operands: bf16 tensor-core products accumulated in fp32 into an
   * fp32 C (docs/model.md, Mixed precision) */
  bool bf16 = g->a16 != NULL;
  const void *a = bf16 ? (const void *)g->a16 : g->a, *b = bf16 ? (const void *)g->b16 : g->b;
  cudaDataType ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t s = cublasGemmStridedBatchedEx(
      d->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g->n, g->m,
      g->k, &g->alpha, b, ab, g->ldb, g->stride_b, a, ab, g->lda, g->stride_a, &g->beta, g->c, CUDA_R_32F,
      g->ldc, g->stride_c, g->batch, bf16 ? CUBLAS_COMPUTE_32F : compute[d->precision], CUBLAS_GEMM_DEFAULT);
  return cublas_ok(d, diag, s, "cublasGemmStridedBatchedEx");
}

static zb_err dev_set_precision(void *self, zb_precision p, zb_diag *diag) {
  cuda_dev *d = self;
  if ((unsigned)p > ZB_PRECISION_BF16)
    return cuda_bad_arg(diag, "set_precision", "unknown precision");
  zb_err err = cuda_enter(d, diag);
  if (!err)
    d->precision = p;
  return err;
}

/* ---- kernels: check the shape, make the device current, launch ---- */

#define LAUNCH(op, ok_shape, launch)                                                                         \
  do {                                                                                                       \
    cuda_dev *d_ = self;                                                                                     \
    if (!(ok_shape))                                                                                         \
      return cuda_bad_arg(diag, op, "negative size");                                                        \
    zb_err e_ = cuda_enter(d_, diag);                                                                        \
    return e_ ? e_ : cuda_ok(d_, diag, launch, "zbk_" op);                                                   \
  } while (0)
#define S(self) (((cuda_dev *)(self))->stream)

static zb_err k_embed_fwd(void *self, const float *emb, const float *pos, const int32_t *tokens, float *x,
                          int n, int h, int t, zb_diag *diag) {
  LAUNCH("embed_fwd", n >= 0 && h >= 0 && t > 0, zbk_embed_fwd(S(self), emb, pos, tokens, x, n, h, t));
}

static zb_err k_embed_bwd_acc(void *self, const float *dx, const int32_t *tokens, float *demb, float *dpos,
                              int n, int h, int t, zb_diag *diag) {
  LAUNCH("embed_bwd_acc", n >= 0 && h >= 0 && t > 0,
         zbk_embed_bwd_acc(S(self), dx, tokens, demb, dpos, n, h, t));
}

static zb_err k_layernorm_fwd(void *self, const float *x, const float *g, const float *b, float *y,
                              float *xhat, float *rstd, int n, int h, zb_diag *diag) {
  LAUNCH("layernorm_fwd", n >= 0 && h >= 0, zbk_layernorm_fwd(S(self), x, g, b, y, xhat, rstd, n, h));
}

static zb_err k_layernorm_affine(void *self, const float *xhat, const float *g, const float *b, float *y,
                                 int n, int h, zb_diag *diag) {
  LAUNCH("layernorm_affine", n >= 0 && h >= 0, zbk_layernorm_affine(S(self), xhat, g, b, y, n, h));
}

static zb_err k_layernorm_bwd_acc(void *self, const float *dy, const float *xhat, const float *rstd,
                                  const float *g, float *dx, int n, int h, zb_diag *diag) {
  LAUNCH("layernorm_bwd_acc", n >= 0 && h >= 0, zbk_layernorm_bwd_acc(S(self), dy, xhat, rstd, g, dx, n, h));
}

static zb_err k_layernorm_param_grads_acc(void *self, const float *dy, const float *xhat, float *dg,
                                          float *db, int n, int h, zb_diag *diag) {
  LAUNCH("layernorm_param_grads_acc", n >= 0 && h >= 0,
         zbk_layernorm_param_grads_acc(S(self), dy, xhat, dg, db, n, h));
}

static zb_err k_rmsnorm_fwd(void *self, const float *x, const float *g, float *y, float *xhat, float *rstd,
                            int n, int h, float eps, zb_diag *diag) {
  LAUNCH("rmsnorm_fwd", n >= 0 && h >= 0, zbk_rmsnorm_fwd(S(self), x, g, y, xhat, rstd, n, h, eps));
}

static zb_err k_rmsnorm_bwd_acc(void *self, const float *dy, const float *xhat, const float *rstd,
                                const float *g, float *dx, int n, int h, zb_diag *diag) {
  LAUNCH("rmsnorm_bwd_acc", n >= 0 && h >= 0, zbk_rmsnorm_bwd_acc(S(self), dy, xhat, rstd, g, dx, n, h));
}

static zb_err k_rope(void *self, float *x, const float *cos, const float *sin, int n, int t, int heads,
                     int hd, int ld, int inverse, zb_diag *diag) {
  LAUNCH("rope", n >= 0 && t > 0 && heads >= 0 && hd >= 0 && hd % 2 == 0 && ld >= heads * hd,
         zbk_rope(S(self), x, cos, sin, n, t, heads, hd, ld, inverse));
}

static zb_err k_swiglu_fwd(void *self, const float *gate, const float *up, float *out, size_t len,
                           zb_diag *diag) {
  LAUNCH("swiglu_fwd", true, zbk_swiglu_fwd(S(self), gate, up, out, len));
}

static zb_err k_swiglu_bwd_inplace(void *self, const float *dout, float *gate, float *up, size_t len,
                                   zb_diag *diag) {
  LAUNCH("swiglu_bwd_inplace", true, zbk_swiglu_bwd_inplace(S(self), dout, gate, up, len));
}

static zb_err k_bias_add(void *self, float *y, const float *b, int n, int cols, zb_diag *diag) {
  LAUNCH("bias_add", n >= 0 && cols >= 0, zbk_bias_add(S(self), y, b, n, cols));
}

static zb_err k_col_sums_acc(void *self, const float *dy, float *db, int n, int cols, zb_diag *diag) {
  LAUNCH("col_sums_acc", n >= 0 && cols >= 0, zbk_col_sums_acc(S(self), dy, db, n, cols));
}

static zb_err k_gelu_fwd(void *self, const float *u, float *out, size_t len, zb_diag *diag) {
  LAUNCH("gelu_fwd", true, zbk_gelu_fwd(S(self), u, out, len));
}

static zb_err k_gelu_bwd_inplace(void *self, const float *dout, float *u, size_t len, zb_diag *diag) {
  LAUNCH("gelu_bwd_inplace", true, zbk_gelu_bwd_inplace(S(self), dout, u, len));
}

static zb_err k_softmax_causal(void *self, float *s, int t, int count, zb_diag *diag) {
  LAUNCH("softmax_causal", t >= 0 && count >= 0, zbk_softmax_causal(S(self), s, t, count));
}

static zb_err k_softmax_causal_bwd(void *self, const float *p, float *dp, int t, int count, zb_diag *diag) {
  LAUNCH("softmax_causal_bwd", t >= 0 && count >= 0, zbk_softmax_causal_bwd(S(self), p, dp, t, count));
}

static zb_err k_xent_fwd(void *self, float *logits, const int32_t *targets, double *row_loss, int n, int v,
                         zb_diag *diag) {
  LAUNCH("xent_fwd", n >= 0 && v >= 0, zbk_xent_fwd(S(self), logits, targets, row_loss, n, v));
}

static zb_err k_xent_bwd(void *self, float *probs, const int32_t *targets, int n, int v, float scale,
                         zb_diag *diag) {
  LAUNCH("xent_bwd", n >= 0 && v >= 0, zbk_xent_bwd(S(self), probs, targets, n, v, scale));
}

static zb_err k_adamw(void *self, float *p, float *m, float *v, const float *g, const uint8_t *decay,
                      size_t n, const zbm_adamw_step *step, zb_diag *diag) {
  LAUNCH("adamw", step != NULL, zbk_adamw(S(self), p, m, v, g, decay, n, *step));
}

static zb_err k_to_bf16(void *self, const float *x, uint16_t *y, size_t n, zb_diag *diag) {
  LAUNCH("f32_to_bf16", true, zbk_f32_to_bf16(S(self), x, y, n));
}

static zb_err k_from_bf16(void *self, const uint16_t *x, float *y, size_t n, zb_diag *diag) {
  LAUNCH("bf16_to_f32", true, zbk_bf16_to_f32(S(self), x, y, n));
}

static zb_err k_add(void *self, float *y, const float *x, float alpha, size_t n, zb_diag *diag) {
  LAUNCH("add", true, zbk_add(S(self), y, x, alpha, n));
}

static zb_err k_scale(void *self, float *x, float alpha, size_t n, zb_diag *diag) {
  LAUNCH("scale", true, zbk_scale(S(self), x, alpha, n));
}

static zb_err k_sumsq(void *self, const float *x, size_t n, double *out, int *nonfinite_out, zb_diag *diag) {
  LAUNCH("sumsq", out != NULL && nonfinite_out != NULL, zbk_sumsq(S(self), x, n, out, nonfinite_out));
}

/* The step's fused ops: scratch holds the chunks' doubles, then their ints. */
static zb_err k_adamw_multi(void *self, const zbm_adamw_tensor *t, int count, zbm_adamw_mode mode,
                            zb_diag *diag) {
  LAUNCH("adamw_multi", count >= 0 && (t || !count), zbk_adamw_multi(S(self), t, count, (int)mode));
}

static zb_err k_sumsq_multi(void *self, const float *const *x, const size_t *n, int count, void *scratch,
                            double *sums, int *bad, zb_diag *diag) {
  size_t chunks = count > 0 && n ? zb_sumsq_multi_scratch(n, count) / (sizeof(double) + sizeof(int)) : 0;
  LAUNCH("sumsq_multi", count >= 0 && (!count || (x && n && scratch && sums && bad)),
         zbk_sumsq_multi(S(self), x, n, count, scratch, (int *)((double *)scratch + chunks), sums, bad));
}

/* ---- flash attention: zbk_attn_fwd / zbk_attn_bwd, no scratch ---- */

/* A shape the launchers take (zbk_attn_ok: head dimensions up to 128), as
 * zbk_attn; ZB_ERR_INVALID_ARG naming the op otherwise. */
static zb_err attn_shape(const zb_attn *a, const void *p1, const void *p2, const char *op, zbk_attn *out,
                         zb_diag *diag) {
  if (!a || !p1 || !p2)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cuda device: %s with a NULL argument", op);
  *out = (zbk_attn){a->batch, a->t, a->heads, a->kv_heads, a->hd, a->ld, a->lo, a->scale};
  if (!zbk_attn_ok(out))
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "cuda device: %s: bad shape (batch %d, t %d, heads %d on %d kv heads, head dim %d of at "
        "most %d, ld %d, lo %d)",
        op, a->batch, a->t, a->heads, a->kv_heads, a->hd, ZBK_ATTN_MAX_HD, a->ld, a->lo);
  return ZB_OK;
}

static zb_err k_attn_fwd(void *self, const float *qkv, float *o, float *lse, const zb_attn *a,
                         zb_diag *diag) {
  zbk_attn k;
  zb_err err = attn_shape(a, qkv, o && lse ? o : NULL, "attn_fwd", &k, diag);
  if (!err)
    err = cuda_enter(self, diag);
  return err ? err : cuda_ok(self, diag, zbk_attn_fwd(S(self), qkv, o, lse, k), "zbk_attn_fwd");
}

static zb_err k_attn_bwd(void *self, const float *qkv, const float *o, const float *lse, const float *dout,
                         float *dqkv, const zb_attn *a, zb_diag *diag) {
  zbk_attn k;
  zb_err err = attn_shape(a, qkv, o && lse && dout && dqkv ? o : NULL, "attn_bwd", &k, diag);
  if (!err && dqkv == qkv)
    err = cuda_bad_arg(diag, "attn_bwd", "dqkv must not be qkv");
  if (!err)
    err = cuda_enter(self, diag);
  return err ? err : cuda_ok(self, diag, zbk_attn_bwd(S(self), qkv, o, lse, dout, dqkv, k), "zbk_attn_bwd");
}

/* ---- creation ---- */

static void dev_destroy(void *self) {
  cuda_dev *d = self;
  if (!d)
    return;
  cudaSetDevice(d->ordinal);
  if (d->stream)
    cudaStreamSynchronize(d->stream);
  if (d->blas) /* first: the handle uses the workspace, a block of the allocator */
    cublasDestroy(d->blas);
  cuda_alloc_destroy(d);
  if (d->stream)
    cudaStreamDestroy(d->stream);
  free(d);
}

static const zb_device_ops cuda_ops = {
    .name = ZB_DEVICE_CUDA,
    .attn_block = 256, /* fastest with the skip on an H200 at T = 1024 (zb_bench_gpu --attn-block) */
    .attn_max_hd = ZBK_ATTN_MAX_HD,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = dev_copy,
    .copy_2d = dev_copy_2d,
    .zero = dev_zero,
    .sync = dev_sync,
    .host_syncs = dev_host_syncs,
    .mem = cuda_mem,
    .reset_peak = cuda_reset_peak,
    .info = dev_info,
    .stream = dev_stream,
    .event_new = dev_event_new,
    .event_free = dev_event_free,
    .event_record = dev_event_record,
    .event_elapsed_ms = dev_event_elapsed_ms,
    .gemm = dev_gemm,
    .set_precision = dev_set_precision,
    .embed_fwd = k_embed_fwd,
    .embed_bwd_acc = k_embed_bwd_acc,
    .layernorm_fwd = k_layernorm_fwd,
    .layernorm_affine = k_layernorm_affine,
    .layernorm_bwd_acc = k_layernorm_bwd_acc,
    .layernorm_param_grads_acc = k_layernorm_param_grads_acc,
    .bias_add = k_bias_add,
    .col_sums_acc = k_col_sums_acc,
    .rmsnorm_fwd = k_rmsnorm_fwd,
    .rmsnorm_bwd_acc = k_rmsnorm_bwd_acc,
    .rope = k_rope,
    .swiglu_fwd = k_swiglu_fwd,
    .swiglu_bwd_inplace = k_swiglu_bwd_inplace,
    .gelu_fwd = k_gelu_fwd,
    .gelu_bwd_inplace = k_gelu_bwd_inplace,
    .softmax_causal = k_softmax_causal,
    .softmax_causal_bwd = k_softmax_causal_bwd,
    .attn_fwd = k_attn_fwd,
    .attn_bwd = k_attn_bwd,
    .xent_fwd = k_xent_fwd,
    .xent_bwd = k_xent_bwd,
    .adamw = k_adamw,
    .to_bf16 = k_to_bf16,
    .from_bf16 = k_from_bf16,
    .add = k_add,
    .scale = k_scale,
    .sumsq = k_sumsq,
    .adamw_multi = k_adamw_multi,
    .sumsq_multi = k_sumsq_multi,
    .destroy = dev_destroy,
};

zb_err zb_device_cuda_probe(int ordinal, zb_device_info *out, zb_diag *diag) {
  if (!out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cuda probe: no output");
  memset(out, 0, sizeof *out);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "cudaGetDeviceCount: %s (error %d)", cudaGetErrorString(e),
                       (int)e);
  if (ordinal < 0 || ordinal >= count)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "CUDA device %d: out of range (%d visible%s)", ordinal,
                       count, getenv("CUDA_VISIBLE_DEVICES") ? " under CUDA_VISIBLE_DEVICES" : "");
  struct cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess)
    return zb_diag_set(diag, ZB_ERR_IO, "cudaGetDeviceProperties(%d): %s (error %d)", ordinal,
                       cudaGetErrorString(e), (int)e);
  int driver = 0;
  if ((e = cudaDriverGetVersion(&driver)) != cudaSuccess)
    return zb_diag_set(diag, ZB_ERR_IO, "cudaDriverGetVersion: %s (error %d)", cudaGetErrorString(e), (int)e);
  size_t len = strnlen(prop.name, sizeof prop.name); /* names are shorter than 128; cut if not */
  len = len < sizeof out->name ? len : sizeof out->name - 1;
  memcpy(out->name, prop.name, len);
  out->name[len] = '\0';
  out->total_bytes = (int64_t)prop.totalGlobalMem;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  out->driver_version = driver;
  size_t free_b = 0, total_b = 0; /* after cudaSetDevice: the context exists, its own bytes are used */
  if ((e = cudaSetDevice(ordinal)) != cudaSuccess)
    return zb_diag_set(diag, ZB_ERR_IO, "cudaSetDevice(%d): %s (error %d)", ordinal, cudaGetErrorString(e),
                       (int)e);
  if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess)
    return zb_diag_set(diag, ZB_ERR_IO, "cudaMemGetInfo(%d): %s (error %d)", ordinal, cudaGetErrorString(e),
                       (int)e);
  out->free_bytes = (int64_t)free_b;
  out->standin = strcmp(out->name, STANDIN_NAME) == 0;
  return ZB_OK;
}

/* The stream, then cuBLAS on it; d is freed by the caller on failure. */
static zb_err cuda_dev_start(cuda_dev *d, zb_diag *diag) {
  zb_err err = cuda_ok(d, diag, cudaSetDevice(d->ordinal), "cudaSetDevice");
  if (!err)
    err = cuda_ok(d, diag, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking),
                  "cudaStreamCreateWithFlags");
  if (!err && (err = cublas_ok(d, diag, cublasCreate(&d->blas), "cublasCreate")))
    d->blas = NULL;
  if (!err)
    err = cublas_ok(d, diag, cublasSetStream(d->blas, d->stream), "cublasSetStream");
  /* fp32 products stay fp32 (TF32 off) unless set_precision asks */
  if (!err)
    err = cublas_ok(d, diag, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  /* cuBLAS's workspace from our allocator, so the high-water mark counts
   * it (docs/model.md, Memory accounting) */
  void *ws = NULL;
  size_t ws_bytes = (size_t)zb_cublas_workspace_bytes(d->info.cc_major);
  if (!err)
    err = cuda_workspace_alloc(d, ws_bytes, &ws, diag);
  if (!err)
    err = cublas_ok(d, diag, cublasSetWorkspace(d->blas, ws, ws_bytes), "cublasSetWorkspace");
  return err;
}

zb_err zb_device_cuda_new(const zb_cuda_device_config *cfg, zb_device **out, zb_diag *diag) {
  if (!cfg || !out || (unsigned)cfg->precision > ZB_PRECISION_BF16)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cuda device: %s",
                       !cfg || !out ? "no config or output" : "unknown precision");
  *out = NULL;
  zb_device_info info;
  zb_err err = zb_device_cuda_probe(cfg->ordinal, &info, diag);
  if (err)
    return err;
  cuda_dev *d = calloc(1, sizeof *d);
  zb_device *dev = calloc(1, sizeof *dev);
  if (!d || !dev) {
    free(d);
    free(dev);
    return zb_diag_set(diag, ZB_ERR_IO, "cuda device: out of host memory");
  }
  d->ordinal = cfg->ordinal;
  d->precision = cfg->precision;
  d->info = info;
  d->exact = info.standin; /* the stand-in's range checks then see every block (docs/model.md) */
  if ((err = cuda_dev_start(d, diag))) {
    dev_destroy(d);
    free(dev);
    return err;
  }
  dev->ops = &cuda_ops;
  dev->self = d;
  *out = dev;
  return ZB_OK;
}
