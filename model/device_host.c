/* device_host.c — the host device (zb_device.h, docs/model.md, Devices):
 * malloc'ed memory with byte-exact accounting, cblas_sgemm for products,
 * attn_cpu.c for flash attention and kernels_cpu.c for every other op.
 * Every op runs before its call returns, so sync() has nothing to wait
 * for and an event is a clock reading (util/zb_clock.h).
 *
 * Ownership: zb_device_host_new's caller owns the device (zb_device_free).
 * Blocks from alloc() carry a 64-byte header with their size, so free()
 * can account exactly the bytes that were asked for and the data stays
 * 64-byte aligned. Threads: one at a time, as for every device.
 * Errors: only bad arguments (ZB_ERR_INVALID_ARG) and a failed malloc
 * (ZB_ERR_IO); nothing poisons the host device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cpu.h"
#include "kernels_cpu.h"
#include "zb_blas.h"
#include "zb_clock.h"
#include "zb_device.h"
#include "zb_names.h"

#define HOST_ALIGN 64

typedef struct host_dev {
  zb_device_mem mem;
  int64_t host_syncs; /* h_sync calls */
  float *attn_ws;     /* flash attention's tiles (attn_cpu.h), grown on demand; not counted in mem */
  size_t attn_ws_n;
} host_dev;

struct zb_device_event {
  int64_t ns;
  int recorded;
};

/* ---- memory ---- */

static zb_err h_alloc(void *self, size_t bytes, void **out, zb_diag *diag) {
  host_dev *d = self;
  if (!out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: alloc: NULL out");
  size_t body = (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
  if (body < bytes || body > SIZE_MAX - HOST_ALIGN)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: alloc of %zu bytes is too large", bytes);
  unsigned char *p = aligned_alloc(HOST_ALIGN, HOST_ALIGN + body);
  if (!p)
    return zb_diag_set(diag, ZB_ERR_IO, "host device: out of memory allocating %zu bytes", bytes);
  memcpy(p, &bytes, sizeof bytes);
  d->mem.current += (int64_t)bytes;
  if (d->mem.current > d->mem.peak)
    d->mem.peak = d->mem.current;
  d->mem.held += (int64_t)(HOST_ALIGN + body); /* what malloc was asked for: header and rounding */
  if (d->mem.held > d->mem.held_peak)
    d->mem.held_peak = d->mem.device_used = d->mem.held; /* no other view of the memory */
  *out = p + HOST_ALIGN;
  return ZB_OK;
}

static void h_free(void *self, void *p) {
  host_dev *d = self;
  if (!p)
    return;
  unsigned char *base = (unsigned char *)p - HOST_ALIGN;
  size_t bytes;
  memcpy(&bytes, base, sizeof bytes);
  d->mem.current -= (int64_t)bytes;
  d->mem.held -= (int64_t)(HOST_ALIGN + (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN);
  free(base);
}

static zb_err h_copy(void *self, void *dst, const void *src, size_t bytes, zb_copy_kind kind, zb_diag *diag) {
  (void)self;
  (void)kind; /* host and device memory are one */
  if (bytes && (!dst || !src))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: copy with a NULL pointer");
  if (bytes && dst != src)
    memmove(dst, src, bytes);
  return ZB_OK;
}

static zb_err h_copy_2d(void *self, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t rows, zb_diag *diag) {
  (void)self;
  if (width > dpitch || width > spitch)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: copy_2d width %zu exceeds a pitch", width);
  for (size_t r = 0; r < rows; r++)
    memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
  return ZB_OK;
}

static zb_err h_zero(void *self, void *p, size_t bytes, zb_diag *diag) {
  (void)self;
  (void)diag;
  if (bytes)
    memset(p, 0, bytes);
  return ZB_OK;
}

static zb_err h_sync(void *self, zb_diag *diag) {
  (void)diag;
  ((host_dev *)self)->host_syncs++; /* nothing to wait for; counted as a GPU would */
  return ZB_OK;
}

static int64_t h_host_syncs(void *self) {
  return ((host_dev *)self)->host_syncs;
}

static void h_mem(void *self, zb_device_mem *out) {
  *out = ((host_dev *)self)->mem;
}

static void h_reset_peak(void *self) {
  host_dev *d = self;
  d->mem.peak = d->mem.current;
}

static void h_info(void *self, zb_device_info *out) {
  (void)self;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", ZB_DEVICE_HOST);
}

static void *h_stream(void *self) {
  (void)self;
  return NULL;
}

/* ---- events ---- */

static zb_err h_event_new(void *self, zb_device_event **out, zb_diag *diag) {
  (void)self;
  if (!out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: event_new: NULL out");
  *out = calloc(1, sizeof **out);
  if (!*out)
    return zb_diag_set(diag, ZB_ERR_IO, "host device: out of memory for an event");
  return ZB_OK;
}

static void h_event_free(void *self, zb_device_event *e) {
  (void)self;
  free(e);
}

static zb_err h_event_record(void *self, zb_device_event *e, zb_diag *diag) {
  (void)self;
  if (!e)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: event_record: NULL event");
  e->ns = zb_clock_ns();
  e->recorded = 1;
  return ZB_OK;
}

static zb_err h_event_elapsed(void *self, zb_device_event *start, zb_device_event *end, float *ms,
                              zb_diag *diag) {
  (void)self;
  if (!start || !end || !ms || !start->recorded || !end->recorded)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: elapsed time needs two recorded events");
  *ms = (float)((double)(end->ns - start->ns) * 1e-6);
  return ZB_OK;
}

/* ---- compute ---- */

static zb_err h_gemm(void *self, const zb_gemm *g, zb_diag *diag) {
  (void)self;
  if (!g || g->batch < 1 || g->m < 0 || g->n < 0 || g->k < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: gemm with a bad shape");
  if (g->a16 || g->b16)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "host device: gemm with bf16 operands (the host has no bf16)");
  if (g->m == 0 || g->n == 0)
    return ZB_OK;
  for (int i = 0; i < g->batch; i++)
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans,
                g->m, g->n, g->k, g->alpha, g->a + i * g->stride_a, g->lda, g->b + i * g->stride_b, g->ldb,
                g->beta, g->c + i * g->stride_c, g->ldc);
  return ZB_OK;
}

static zb_err h_set_precision(void *self, zb_precision p, zb_diag *diag) {
  (void)self;
  (void)p; /* the host computes fp32 whatever is asked */
  (void)diag;
  return ZB_OK;
}

static zb_err h_embed_fwd(void *self, const float *emb, const float *pos, const int32_t *tokens, float *x,
                          int n, int h, int t, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_embed_fwd(emb, pos, tokens, x, n, h, t);
  return ZB_OK;
}

static zb_err h_embed_bwd(void *self, const float *dx, const int32_t *tokens, float *demb, float *dpos, int n,
                          int h, int t, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_embed_bwd_acc(dx, tokens, demb, dpos, n, h, t);
  return ZB_OK;
}

static zb_err h_ln_fwd(void *self, const float *x, const float *g, const float *b, float *y, float *xhat,
                       float *rstd, int n, int h, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_layernorm_fwd(x, g, b, y, xhat, rstd, n, h);
  return ZB_OK;
}

static zb_err h_ln_affine(void *self, const float *xhat, const float *g, const float *b, float *y, int n,
                          int h, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_layernorm_affine(xhat, g, b, y, n, h);
  return ZB_OK;
}

static zb_err h_ln_bwd(void *self, const float *dy, const float *xhat, const float *rstd, const float *g,
                       float *dx, int n, int h, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_layernorm_bwd_acc(dy, xhat, rstd, g, dx, n, h);
  return ZB_OK;
}

static zb_err h_ln_param(void *self, const float *dy, const float *xhat, float *dg, float *db, int n, int h,
                         zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_layernorm_param_grads_acc(dy, xhat, dg, db, n, h);
  return ZB_OK;
}

static zb_err h_rms_fwd(void *self, const float *x, const float *g, float *y, float *xhat, float *rstd, int n,
                        int h, float eps, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_rmsnorm_fwd(x, g, y, xhat, rstd, n, h, eps);
  return ZB_OK;
}

static zb_err h_rms_bwd(void *self, const float *dy, const float *xhat, const float *rstd, const float *g,
                        float *dx, int n, int h, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_rmsnorm_bwd_acc(dy, xhat, rstd, g, dx, n, h);
  return ZB_OK;
}

static zb_err h_rope(void *self, float *x, const float *cos, const float *sin, int n, int t, int heads,
                     int hd, int ld, int inverse, zb_diag *diag) {
  (void)self;
  if (n < 0 || t < 1 || heads < 0 || hd < 0 || hd % 2 || ld < heads * hd)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host rope: bad shape (n %d, t %d, heads %d, hd %d, ld %d)",
                       n, t, heads, hd, ld);
  kernels_cpu_rope(x, cos, sin, n, t, heads, hd, ld, inverse);
  return ZB_OK;
}

static zb_err h_swiglu_fwd(void *self, const float *gate, const float *up, float *out, size_t len,
                           zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_swiglu_fwd(gate, up, out, len);
  return ZB_OK;
}

static zb_err h_swiglu_bwd(void *self, const float *dout, float *gate, float *up, size_t len, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_swiglu_bwd_inplace(dout, gate, up, len);
  return ZB_OK;
}

static zb_err h_bias_add(void *self, float *y, const float *b, int n, int cols, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_bias_add(y, b, n, cols);
  return ZB_OK;
}

static zb_err h_col_sums(void *self, const float *dy, float *db, int n, int cols, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_col_sums_acc(dy, db, n, cols);
  return ZB_OK;
}

static zb_err h_gelu_fwd(void *self, const float *u, float *out, size_t len, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_gelu_fwd(u, out, len);
  return ZB_OK;
}

static zb_err h_gelu_bwd(void *self, const float *dout, float *u, size_t len, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_gelu_bwd_inplace(dout, u, len);
  return ZB_OK;
}

static zb_err h_softmax(void *self, float *s, int t, int count, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_softmax_causal(s, t, count);
  return ZB_OK;
}

static zb_err h_softmax_bwd(void *self, const float *p, float *dp, int t, int count, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_softmax_causal_bwd(p, dp, t, count);
  return ZB_OK;
}

/* A shape attn_fwd / attn_bwd can run, and the scratch for it. */
static zb_err attn_prepare(host_dev *d, const void *p1, const void *p2, const zb_attn *a, const char *op,
                           zb_diag *diag) {
  if (!a || !p1 || !p2)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: %s with a NULL argument", op);
  if (a->batch < 1 || a->t < 1 || a->heads < 1 || a->kv_heads < 1 || a->hd < 1 || a->heads % a->kv_heads ||
      (int64_t)a->ld < (int64_t)(a->heads + 2 * a->kv_heads) * a->hd ||
      (int64_t)a->lo < (int64_t)a->heads * a->hd)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "host device: %s: bad shape (batch %d, t %d, heads %d on %d kv heads, head dim %d, ld %d, "
        "lo %d)",
        op, a->batch, a->t, a->heads, a->kv_heads, a->hd, a->ld, a->lo);
  size_t n = kernels_cpu_attn_scratch(a);
  if (n > d->attn_ws_n) {
    float *w = realloc(d->attn_ws, n * sizeof(float));
    if (!w)
      return zb_diag_set(diag, ZB_ERR_IO, "host device: %s: out of memory for %zu floats of tiles", op, n);
    d->attn_ws = w;
    d->attn_ws_n = n;
  }
  return ZB_OK;
}

static zb_err h_attn_fwd(void *self, const float *qkv, float *o, float *lse, const zb_attn *a,
                         zb_diag *diag) {
  zb_err err = attn_prepare(self, qkv, o && lse ? o : NULL, a, "attn_fwd", diag);
  if (err == ZB_OK)
    kernels_cpu_attn_fwd(qkv, o, lse, a, ((host_dev *)self)->attn_ws);
  return err;
}

static zb_err h_attn_bwd(void *self, const float *qkv, const float *o, const float *lse, const float *dout,
                         float *dqkv, const zb_attn *a, zb_diag *diag) {
  zb_err err = attn_prepare(self, qkv, o && lse && dout && dqkv ? o : NULL, a, "attn_bwd", diag);
  if (err == ZB_OK && dqkv == qkv)
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: attn_bwd: dqkv must not be qkv");
  if (err == ZB_OK)
    kernels_cpu_attn_bwd(qkv, o, lse, dout, dqkv, a, ((host_dev *)self)->attn_ws);
  return err;
}

static zb_err h_xent_fwd(void *self, float *logits, const int32_t *targets, double *row_loss, int n, int v,
                         zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_xent_fwd(logits, targets, row_loss, n, v);
  return ZB_OK;
}

static zb_err h_xent_bwd(void *self, float *probs, const int32_t *targets, int n, int v, float scale,
                         zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_xent_bwd(probs, targets, n, v, scale);
  return ZB_OK;
}

static zb_err h_adamw(void *self, float *p, float *m, float *v, const float *g, const uint8_t *decay,
                      size_t n, const zbm_adamw_step *step, zb_diag *diag) {
  (void)self;
  if (!step)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: adamw without step constants");
  kernels_cpu_adamw(p, m, v, g, decay, n, step);
  return ZB_OK;
}

static zb_err h_add(void *self, float *y, const float *x, float alpha, size_t n, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_add(y, x, alpha, n);
  return ZB_OK;
}

static zb_err h_scale(void *self, float *x, float alpha, size_t n, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_scale(x, alpha, n);
  return ZB_OK;
}

static zb_err h_sumsq(void *self, const float *x, size_t n, double *out, int *nonfinite_out, zb_diag *diag) {
  (void)self;
  (void)diag;
  kernels_cpu_sumsq(x, n, out, nonfinite_out);
  return ZB_OK;
}

/* The step's fused ops: the same per-element function and summation
 * order as the GPU's (zb_kernel_math.h), so the host device's norm is the
 * GPU's bit for bit. */
static zb_err h_adamw_multi(void *self, const zbm_adamw_tensor *t, int count, zbm_adamw_mode mode,
                            zb_diag *diag) {
  (void)self;
  if (count < 0 || (count && !t) || mode < ZBM_ADAMW_FULL || mode > ZBM_ADAMW_COMMIT)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: adamw_multi of %d arrays, mode %d", count,
                       (int)mode);
  for (int k = 0; k < count; k++)
    for (size_t i = 0; i < t[k].n; i++)
      zbm_adamw_at(&t[k], i, mode);
  return ZB_OK;
}

static zb_err h_sumsq_multi(void *self, const float *const *x, const size_t *n, int count, void *scratch,
                            double *sums, int *bad, zb_diag *diag) {
  (void)self;
  if (count < 0 || (count && (!x || !n || !scratch || !sums || !bad)))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "host device: sumsq_multi of %d arrays without its arrays",
                       count);
  double *part = scratch;
  for (int k = 0; k < count; k++) {
    size_t chunks = zbm_norm_chunks(n[k]);
    bad[k] = 0;
    for (size_t c = 0; c < chunks; c++) {
      size_t at = c * ZBM_NORM_CHUNK, len = n[k] - at < ZBM_NORM_CHUNK ? n[k] - at : ZBM_NORM_CHUNK;
      part[c] = zbm_norm_block(x[k] + at, NULL, len, &bad[k]);
    }
    sums[k] = zbm_norm_block(NULL, part, chunks, NULL);
  }
  return ZB_OK;
}

static void h_destroy(void *self) {
  free(((host_dev *)self)->attn_ws);
  free(self);
}

static const zb_device_ops host_ops = {
    .name = ZB_DEVICE_HOST,
    .attn_block = 32, /* OpenBLAS: 32-row products are still efficient */
    .alloc = h_alloc,
    .free = h_free,
    .copy = h_copy,
    .copy_2d = h_copy_2d,
    .zero = h_zero,
    .sync = h_sync,
    .host_syncs = h_host_syncs,
    .mem = h_mem,
    .reset_peak = h_reset_peak,
    .info = h_info,
    .stream = h_stream,
    .event_new = h_event_new,
    .event_free = h_event_free,
    .event_record = h_event_record,
    .event_elapsed_ms = h_event_elapsed,
    .gemm = h_gemm,
    .set_precision = h_set_precision,
    .embed_fwd = h_embed_fwd,
    .embed_bwd_acc = h_embed_bwd,
    .layernorm_fwd = h_ln_fwd,
    .layernorm_affine = h_ln_affine,
    .layernorm_bwd_acc = h_ln_bwd,
    .layernorm_param_grads_acc = h_ln_param,
    .rmsnorm_fwd = h_rms_fwd,
    .rmsnorm_bwd_acc = h_rms_bwd,
    .rope = h_rope,
    .swiglu_fwd = h_swiglu_fwd,
    .swiglu_bwd_inplace = h_swiglu_bwd,
    .bias_add = h_bias_add,
    .col_sums_acc = h_col_sums,
    .gelu_fwd = h_gelu_fwd,
    .gelu_bwd_inplace = h_gelu_bwd,
    .softmax_causal = h_softmax,
    .softmax_causal_bwd = h_softmax_bwd,
    .attn_fwd = h_attn_fwd,
    .attn_bwd = h_attn_bwd,
    .xent_fwd = h_xent_fwd,
    .xent_bwd = h_xent_bwd,
    .adamw = h_adamw,
    .add = h_add,
    .scale = h_scale,
    .sumsq = h_sumsq,
    .adamw_multi = h_adamw_multi,
    .sumsq_multi = h_sumsq_multi,
    .destroy = h_destroy,
};

zb_err zb_device_host_new(zb_device **out, zb_diag *diag) {
  if (!out)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb_device_host_new: NULL out");
  zb_device *d = calloc(1, sizeof *d);
  host_dev *h = calloc(1, sizeof *h);
  if (!d || !h) {
    free(d);
    free(h);
    return zb_diag_set(diag, ZB_ERR_IO, "host device: out of memory");
  }
  d->ops = &host_ops;
  d->self = h;
  *out = d;
  return ZB_OK;
}
