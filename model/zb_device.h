/* zb_device.h — the device the model's math runs on (docs/model.md,
 * Devices): memory, a stream of work, events, a batched GEMM and the
 * model's element-wise and row ops, behind one vtable, so the model
 * (model_*.c) is written once and runs on the host (zb_device_host_new:
 * plain C and CBLAS) or on a CUDA GPU (zb_device_cuda_new: cuBLAS and the
 * project's kernels).
 *
 * Semantics (CUDA's stream model, which the host device satisfies
 * trivially by running everything at once):
 *   - Every op is enqueued on the device's one compute stream and runs in
 *     the order it was issued; a call returns once the op is enqueued. A
 *     pointer argument is device memory from alloc() unless it says host.
 *   - Results are visible to the host only after sync(); copies to the
 *     host (ZB_COPY_D2H) are ordered on the stream like any op.
 *   - Errors: an op that cannot be enqueued returns its error at once; an
 *     error during execution is returned by the next sync(). After an
 *     error the device is poisoned: every later call returns it again.
 *
 * Matrices are row-major (as the model stores them); gemm() translates to
 * whatever the library wants (cuBLAS is column-major). Shapes are ints:
 * the model refuses configurations whose products overflow one.
 *
 * Ownership: a device is created by its constructor and owned by the
 * caller, who frees it with zb_device_free() after every buffer it handed
 * out was given back (NULL is a no-op). One thread uses a device at a time.
 *
 * Results: zb_err from lib/zb_err.h; ZB_ERR_INVALID_ARG for a bad argument,
 * ZB_ERR_IO for a device failure, out of device memory included (the
 * message names the CUDA/cuBLAS error), ZB_ERR_UNSUPPORTED for a device
 * that is not there.
 */
#ifndef ZB_DEVICE_H
#define ZB_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "zb_err.h"
#include "zb_kernel_math.h"

typedef enum zb_copy_kind { ZB_COPY_H2D, ZB_COPY_D2H, ZB_COPY_D2D } zb_copy_kind;

/* GEMM precision (the job spec's `precision`): fp32 everywhere by default;
 * tf32 and bf16 let the library use tensor cores with fp32 accumulation
 * (fp32 inputs rounded to tf32 / bf16 inside the product). A product with
 * bf16 operands (zb_gemm's a16, b16) is bf16 whatever the precision. The
 * host device computes fp32 whatever is asked. */
typedef enum zb_precision { ZB_PRECISION_FP32, ZB_PRECISION_TF32, ZB_PRECISION_BF16 } zb_precision;

/* One (batched) product, row-major: for i in 0..batch-1,
 *   C_i = alpha * op(A_i) op(B_i) + beta * C_i,
 * with X_i = X + i * stride_x, op(A_i) m x k, op(B_i) k x n, C_i m x n. */
typedef struct zb_gemm {
  bool trans_a, trans_b;
  int m, n, k;
  float alpha, beta;
  const float *a;
  int lda;
  int64_t stride_a;
  const float *b;
  int ldb;
  int64_t stride_b;
  float *c;
  int ldc;
  int64_t stride_c;
  int batch; /* >= 1 */
  /* bf16 operands (docs/model.md, Mixed precision): when both are set
   * (then a and b are unused) the product reads A and B as bf16 elements,
   * same leading dimensions and strides, and accumulates in fp32 into the
   * fp32 C. Devices without bf16 (to_bf16 NULL) refuse them. */
  const uint16_t *a16, *b16;
} zb_gemm;

/* The device's memory figures (docs/model.md, Memory accounting).
 * current, peak and cached are byte-exact sums of the sizes callers asked
 * for (not rounded to allocation granules); held and held_peak are what
 * the allocator took from the device, its rounding and cache included,
 * plus the cuBLAS workspace: the GPU's own high-water mark. */
typedef struct zb_device_mem {
  int64_t current;   /* handed out and not given back */
  int64_t peak;      /* highest current since creation or reset_peak */
  int64_t cached;    /* given back, kept for reuse (not in current) */
  int64_t held;      /* taken from the device now: blocks live or cached at their rounded size, workspace */
  int64_t held_peak; /* highest held since creation (reset_peak leaves it) */
  int64_t workspace; /* the cuBLAS workspace (in held, not in current); 0 for the host */
  /* The device's used bytes (cudaMemGetInfo's total - free: every
   * context and process on it) sampled when held last reached held_peak,
   * so held_peak <= device_used on a device only this allocator fills;
   * the host device has no other view and answers held_peak. */
  int64_t device_used;
} zb_device_mem;

/* The cuBLAS workspace the CUDA device gives its handle (cublasSetWorkspace,
 * from its own allocator so held counts it): what cuBLAS recommends for
 * the architecture, 32 MiB from Hopper (cc 9) on and 4 MiB before
 * (docs/model.md, Memory accounting). The worker's admission adds it. */
static inline int64_t zb_cublas_workspace_bytes(int cc_major) {
  return (int64_t)(cc_major >= 9 ? 32 : 4) << 20;
}

/* What the device is, for reports ("zbctl workers") and logs. */
typedef struct zb_device_info {
  char name[128];      /* "host", "NVIDIA H100 80GB HBM3", or the stand-in's name */
  int64_t total_bytes; /* device memory; 0 for the host */
  int64_t free_bytes;  /* free when probed (cudaMemGetInfo); 0 for the host */
  int cc_major, cc_minor;
  int driver_version; /* cudaDriverGetVersion's number; 0 for the host */
  bool standin;       /* the CPU stand-in of the CUDA APIs (tests only) */
} zb_device_info;

/* The shape of one causal self-attention call (attn_fwd, attn_bwd):
 * `batch` sequences of t tokens; row r = s t + i of qkv holds token i of
 * sequence s as q (heads heads of hd floats) | k (kv_heads heads) | v
 * (kv_heads heads), rows ld floats apart; rows of o and dout hold the
 * heads' outputs (heads hd floats, lo apart). Grouped-query attention:
 * query head h reads key/value head h / (heads / kv_heads). Scores are
 * scale q.k (1 / sqrt(hd) in the model). */
typedef struct zb_attn {
  int batch, t, heads, kv_heads, hd, ld, lo;
  float scale;
} zb_attn;

typedef struct zb_device_event zb_device_event;

typedef struct zb_device_ops {
  const char *name; /* "host", "cuda" */
  /* Query rows per block of the causal attention (model_math.c) that suit
   * this device's GEMMs: small blocks skip more of the masked triangle,
   * large ones make fewer, larger products (docs/model.md, Devices). */
  int attn_block;
  /* The largest head dimension attn_fwd / attn_bwd take (0: any); the
   * model keeps the unfused attention above it. */
  int attn_max_hd;

  /* ---- memory ---- */
  zb_err (*alloc)(void *self, size_t bytes, void **out, zb_diag *diag);
  /* stream-ordered: safe while ops of this device's stream that use p are
   * queued; work on another stream (a transport's) must have completed, or
   * this stream must wait on it, before p is freed */
  void (*free)(void *self, void *p);
  zb_err (*copy)(void *self, void *dst, const void *src, size_t bytes, zb_copy_kind kind, zb_diag *diag);
  /* rows of `width` bytes, from src (pitch spitch) to dst (pitch dpitch), device to device */
  zb_err (*copy_2d)(void *self, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t rows, zb_diag *diag);
  zb_err (*zero)(void *self, void *p, size_t bytes, zb_diag *diag);
  zb_err (*sync)(void *self, zb_diag *diag);
  /* sync() calls since creation: the host syncs (docs/model.md, Host syncs);
   * the host device counts them too, though it has nothing to wait for */
  int64_t (*host_syncs)(void *self);
  void (*mem)(void *self, zb_device_mem *out);
  void (*reset_peak)(void *self); /* peak <- current */
  void (*info)(void *self, zb_device_info *out);
  /* Native stream handle (cudaStream_t for cuda, NULL for the host), for a
   * transport that orders its own stream after the device's. */
  void *(*stream)(void *self);

  /* ---- events: timing and ordering ---- */
  zb_err (*event_new)(void *self, zb_device_event **out, zb_diag *diag);
  void (*event_free)(void *self, zb_device_event *e);
  zb_err (*event_record)(void *self, zb_device_event *e, zb_diag *diag); /* when the stream reaches it */
  /* milliseconds between two recorded events; both must have completed (after sync) */
  zb_err (*event_elapsed_ms)(void *self, zb_device_event *start, zb_device_event *end, float *ms,
                             zb_diag *diag);

  /* ---- compute ---- */
  zb_err (*gemm)(void *self, const zb_gemm *g, zb_diag *diag);
  zb_err (*set_precision)(void *self, zb_precision p, zb_diag *diag);

  /* x[r] = emb[tokens[r]] + pos[r % t] (rows of h); tokens: n int32 ids
   * on the device, each in [0, rows of emb) (an id outside is an
   * out-of-bounds read, not checked). pos NULL: no learned positions (a
   * rotary model), x[r] = emb[tokens[r]]. */
  zb_err (*embed_fwd)(void *self, const float *emb, const float *pos, const int32_t *tokens, float *x, int n,
                      int h, int t, zb_diag *diag);
  /* demb[tokens[r]] += dx[r]; dpos[r % t] += dx[r]; dpos NULL: no
   * position gradient (pos was NULL in F) */
  zb_err (*embed_bwd_acc)(void *self, const float *dx, const int32_t *tokens, float *demb, float *dpos, int n,
                          int h, int t, zb_diag *diag);
  /* xhat = (x - mean) * rstd per row, y = xhat * g + b; keeps xhat [n, h] and rstd [n] */
  zb_err (*layernorm_fwd)(void *self, const float *x, const float *g, const float *b, float *y, float *xhat,
                          float *rstd, int n, int h, zb_diag *diag);
  /* y = xhat * g + b (b NULL: y = xhat * g, RMSNorm's output) */
  zb_err (*layernorm_affine)(void *self, const float *xhat, const float *g, const float *b, float *y, int n,
                             int h, zb_diag *diag);
  /* dx += zbm_ln_dx(...) per element (row means of dy g and dy g xhat) */
  zb_err (*layernorm_bwd_acc)(void *self, const float *dy, const float *xhat, const float *rstd,
                              const float *g, float *dx, int n, int h, zb_diag *diag);
  /* dg += sum_rows dy * xhat, db += sum_rows dy (db NULL: dg only) */
  zb_err (*layernorm_param_grads_acc)(void *self, const float *dy, const float *xhat, float *dg, float *db,
                                      int n, int h, zb_diag *diag);
  /* RMSNorm: xhat = x * rstd per row (rstd = zbm_rms_rstd), y = xhat * g;
   * keeps xhat [n, h] and rstd [n]. Its weight's gradient is
   * layernorm_param_grads_acc's dg (with db NULL). */
  zb_err (*rmsnorm_fwd)(void *self, const float *x, const float *g, float *y, float *xhat, float *rstd, int n,
                        int h, float eps, zb_diag *diag);
  /* dx += zbm_rms_dx(...) per element (row mean of dy g xhat) */
  zb_err (*rmsnorm_bwd_acc)(void *self, const float *dy, const float *xhat, const float *rstd, const float *g,
                            float *dx, int n, int h, zb_diag *diag);
  /* in place on n rows of x (row stride ld), row r at position r % t: in
   * each of `heads` heads of hd columns (head k at column k hd), pair (i,
   * i + hd/2) is rotated by zbm_rope_pair with cos[pos hd/2 + i] and
   * sin[pos hd/2 + i] (tables [t, hd/2], device memory); inverse: by -sin,
   * which is the backward */
  zb_err (*rope)(void *self, float *x, const float *cos, const float *sin, int n, int t, int heads, int hd,
                 int ld, int inverse, zb_diag *diag);
  /* out = zbm_swiglu(gate, up) */
  zb_err (*swiglu_fwd)(void *self, const float *gate, const float *up, float *out, size_t len, zb_diag *diag);
  /* in place: gate and up become their gradients (zbm_swiglu_grad) from dout */
  zb_err (*swiglu_bwd_inplace)(void *self, const float *dout, float *gate, float *up, size_t len,
                               zb_diag *diag);
  /* y[r, c] += b[c] */
  zb_err (*bias_add)(void *self, float *y, const float *b, int n, int cols, zb_diag *diag);
  /* db[c] += sum_r dy[r, c] */
  zb_err (*col_sums_acc)(void *self, const float *dy, float *db, int n, int cols, zb_diag *diag);
  /* out = gelu(u) */
  zb_err (*gelu_fwd)(void *self, const float *u, float *out, size_t len, zb_diag *diag);
  /* u <- zbm_gelu_grad(u, dout), in place */
  zb_err (*gelu_bwd_inplace)(void *self, const float *dout, float *u, size_t len, zb_diag *diag);
  /* count matrices of t x t (stride t*t), in place: row i becomes
   * softmax(s[i, 0..i]) followed by zeros. Entries above the diagonal are
   * not read (a causal product may leave them unwritten). */
  zb_err (*softmax_causal)(void *self, float *s, int t, int count, zb_diag *diag);
  /* in place on dp (same layout as p): dp <- zbm_softmax_bwd per element
   * on and below the diagonal, zero above it; entries above the diagonal
   * of dp are not read */
  zb_err (*softmax_causal_bwd)(void *self, const float *p, float *dp, int t, int count, zb_diag *diag);
  /* Fused causal attention (flash attention: tiles of queries and keys, an
   * online softmax; docs/model.md, Flash attention (host)). NULL where the
   * device has none: the model then computes attention from gemm and
   * softmax_causal and keeps the T x T probabilities. F: o = softmax(scale
   * q k^T, causal) v per head, and lse [batch, heads, t] = each score
   * row's log-sum-exp (the softmax's max plus the log of its sum), all
   * that B needs beside q, k, v and o. */
  zb_err (*attn_fwd)(void *self, const float *qkv, float *o, float *lse, const zb_attn *a, zb_diag *diag);
  /* B: dqkv (laid out as qkv, every column written; it must not overlap
   * qkv) = the gradients of q, k and v from dout, the gradient of o; the
   * key/value gradients sum over the query heads of their group */
  zb_err (*attn_bwd)(void *self, const float *qkv, const float *o, const float *lse, const float *dout,
                     float *dqkv, const zb_attn *a, zb_diag *diag);
  /* in place: logits [n, v] become probabilities; row_loss[r] (device,
   * double) = -log p[target[r]]; targets: n int32 ids on the device, each
   * in [0, v) */
  zb_err (*xent_fwd)(void *self, float *logits, const int32_t *targets, double *row_loss, int n, int v,
                     zb_diag *diag);
  /* in place: probs [n, v] become zbm_xent_grad(p, j == target, scale) */
  zb_err (*xent_bwd)(void *self, float *probs, const int32_t *targets, int n, int v, float scale,
                     zb_diag *diag);
  /* one AdamW step over n parameters (decay: n bytes, 0 or 1, on the device) */
  zb_err (*adamw)(void *self, float *p, float *m, float *v, const float *g, const uint8_t *decay, size_t n,
                  const zbm_adamw_step *step, zb_diag *diag);
  /* bf16 storage (docs/model.md, Mixed precision); both NULL where the
   * device has none (the host). y[i] = x[i] rounded to bf16 (to nearest
   * even, NaN canonical: zbm_bf16_from_f32) / widened to fp32, i < n. */
  zb_err (*to_bf16)(void *self, const float *x, uint16_t *y, size_t n, zb_diag *diag);
  zb_err (*from_bf16)(void *self, const uint16_t *x, float *y, size_t n, zb_diag *diag);
  /* y += alpha * x */
  zb_err (*add)(void *self, float *y, const float *x, float alpha, size_t n, zb_diag *diag);
  /* x *= alpha */
  zb_err (*scale)(void *self, float *x, float alpha, size_t n, zb_diag *diag);
  /* out (device, double) = sum x^2 in double, and *nonfinite_out (device, int) = 1 if any x is not finite */
  zb_err (*sumsq)(void *self, const float *x, size_t n, double *out, int *nonfinite_out, zb_diag *diag);

  /* The optimizer step's fused ops (docs/model.md, Optimizer and step);
   * NULL where a device has none, and callers then use adamw and sumsq.
   * adamw_multi: one launch steps count arrays (zbm_adamw_tensor, the
   * table on the host; its pointers on the device) under mode
   * (zbm_adamw_mode), each element as zbm_adamw_at. */
  zb_err (*adamw_multi)(void *self, const zbm_adamw_tensor *t, int count, zbm_adamw_mode mode, zb_diag *diag);
  /* sums[i] (device, double) = the sum of x[i][0..n[i])^2 in
   * zb_kernel_math.h's blocked order, bad[i] (device, int) = 1 if one is
   * not finite, for i < count (x and n: host arrays of device pointers and
   * lengths); scratch: zb_sumsq_multi_scratch(n, count) bytes of device
   * memory, each chunk's partial, overwritten. Every output is written. */
  zb_err (*sumsq_multi)(void *self, const float *const *x, const size_t *n, int count, void *scratch,
                        double *sums, int *bad, zb_diag *diag);

  void (*destroy)(void *self);
} zb_device_ops;

/* Scratch bytes of sumsq_multi: a double and an int per chunk. */
static inline size_t zb_sumsq_multi_scratch(const size_t *n, int count) {
  size_t chunks = 0;
  for (int i = 0; i < count; i++)
    chunks += zbm_norm_chunks(n[i]);
  return (chunks ? chunks : 1) * (sizeof(double) + sizeof(int));
}

typedef struct zb_device {
  const zb_device_ops *ops;
  void *self;
} zb_device;

/* Frees d (after every buffer went back); NULL is a no-op. */
static inline void zb_device_free(zb_device *d) {
  if (d) {
    d->ops->destroy(d->self);
    free(d);
  }
}

/* ---- constructors ---- */

/* The host: malloc'ed memory with byte-exact accounting, CBLAS for gemm,
 * kernels_cpu.c for the rest; every op runs before the call returns, so
 * sync() has nothing to wait for and events read the clock. Never fails
 * but for a NULL out. The caller owns *out. */
zb_err zb_device_host_new(zb_device **out, zb_diag *diag);

/* A CUDA device (built with ZB_CUDA; model/device_cuda.c). */
typedef struct zb_cuda_device_config {
  int ordinal;            /* cudaSetDevice's number, after CUDA_VISIBLE_DEVICES */
  zb_precision precision; /* of gemm(); settable later */
} zb_cuda_device_config;

/* Creates a compute stream, a cuBLAS handle bound to it and a caching
 * allocator on device `ordinal`. ZB_ERR_UNSUPPORTED when there is no such
 * device (the message says why: no driver, no device, ordinal out of
 * range). The caller owns *out. */
zb_err zb_device_cuda_new(const zb_cuda_device_config *cfg, zb_device **out, zb_diag *diag);

/* Describes CUDA device `ordinal` without creating one (a worker's report
 * to the coordinator). ZB_ERR_UNSUPPORTED when there is none. */
zb_err zb_device_cuda_probe(int ordinal, zb_device_info *out, zb_diag *diag);

#endif
