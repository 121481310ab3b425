/* bench_gpu_flash.c — zb_bench_gpu's section 5 (bench_gpu.h): flash
 * attention, the device's fused causal attention (zb_device_ops.attn_fwd
 * and attn_bwd; docs/model.md, Flash attention), beside the unfused path
 * on the same device, at the bench's --batch, --heads, --hidden / --heads
 * and --seq (T; 1024 by default, the shape):
 *
 *   flash    attn_fwd, then attn_bwd: what F keeps for B is O and the
 *            per-row log-sum-exp, O(T) per row;
 *   unfused  per sequence, batched over the heads: S = scale Q K^T (the
 *            full T x T products), the causal softmax in place, O = P V;
 *            B: dP = dO V^T, dV = P^T dO, the softmax backward, dQ =
 *            scale dS K, dK = scale dS^T Q. F keeps O and P, T x T per
 *            head and sequence.
 *
 * Both are timed by device events, best of --reps after a warm-up run,
 * and count the same FLOPs, those a causal kernel needs: T(T+1)/2 score
 * entries per head and sequence, 2 hd FLOPs each per product, 2 products
 * in F and 4 in B (flash attention's B recomputes the scores, a fifth
 * product this does not count; the unfused path computes the full
 * products, twice what it counts). Peak bytes are the device allocator's
 * high-water mark (zb_device_ops.mem after reset_peak) above the inputs
 * (qkv and dO): F's is what F allocates (its outputs and any scratch), B's
 * what F left plus what B allocates. The warm-up run also compares the two
 * paths' O and dQ|dK|dV: the largest difference relative to the largest
 * unfused value.
 *
 * Where the device has no flash attention (its attn_fwd or attn_bwd is
 * NULL, or the head dimension is over its attn_max_hd) the section says
 * so and measures nothing.
 *
 * Ownership: everything is allocated and freed here. Threads: the caller's.
 * Errors: exit 1 through gpu_die.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_gpu.h"
#include "zb_alloc.h"

enum { FWD, BWD };

/* The device buffers of one run; o, lse, p, dp, dqkv belong to a path. */
typedef struct flash_run {
  zb_device *dev;
  zb_attn a;
  int hidden;
  float *qkv, *dout; /* inputs: [N, ld] and [N, lo] */
  float *o, *lse, *p, *dp, *dqkv;
} flash_run;

static float *dev_alloc(zb_device *dev, size_t floats) {
  zb_diag d = {{0}};
  void *p;
  if (dev->ops->alloc(dev->self, floats * sizeof(float), &p, &d))
    gpu_die("alloc", &d);
  return p;
}

static void must(zb_err err, const char *what, const zb_diag *d) {
  if (err)
    gpu_die(what, d);
}

static void gemm(zb_device *dev, zb_gemm g) {
  zb_diag d = {{0}};
  must(dev->ops->gemm(dev->self, &g, &d), "gemm (unfused attention)", &d);
}

/* The unfused F (see the header comment). */
static void unfused_fwd(flash_run *r) {
  const zb_attn *a = &r->a;
  int T = a->t, H = a->heads, hd = a->hd, h = r->hidden;
  int64_t tt = (int64_t)T * T;
  for (int s = 0; s < a->batch; s++) {
    const float *q = r->qkv + (size_t)s * T * a->ld;
    float *p = r->p + (size_t)s * H * tt;
    gemm(r->dev, (zb_gemm){.trans_b = true,
                           .m = T,
                           .n = T,
                           .k = hd,
                           .alpha = a->scale,
                           .a = q,
                           .lda = a->ld,
                           .stride_a = hd,
                           .b = q + h,
                           .ldb = a->ld,
                           .stride_b = hd,
                           .c = p,
                           .ldc = T,
                           .stride_c = tt,
                           .batch = H});
  }
  zb_diag d = {{0}};
  must(r->dev->ops->softmax_causal(r->dev->self, r->p, T, a->batch * H, &d), "softmax_causal", &d);
  for (int s = 0; s < a->batch; s++)
    gemm(r->dev, (zb_gemm){.m = T,
                           .n = hd,
                           .k = T,
                           .alpha = 1,
                           .a = r->p + (size_t)s * H * tt,
                           .lda = T,
                           .stride_a = tt,
                           .b = r->qkv + (size_t)s * T * a->ld + 2 * h,
                           .ldb = a->ld,
                           .stride_b = hd,
                           .c = r->o + (size_t)s * T * a->lo,
                           .ldc = a->lo,
                           .stride_c = hd,
                           .batch = H});
}

/* The unfused B (see the header comment): dQ | dK | dV into dqkv. */
static void unfused_bwd(flash_run *r) {
  const zb_attn *a = &r->a;
  int T = a->t, H = a->heads, hd = a->hd, h = r->hidden;
  int64_t tt = (int64_t)T * T;
  for (int s = 0; s < a->batch; s++) {
    const float *q = r->qkv + (size_t)s * T * a->ld, *dout = r->dout + (size_t)s * T * a->lo;
    float *p = r->p + (size_t)s * H * tt, *dp = r->dp + (size_t)s * H * tt,
          *dq = r->dqkv + (size_t)s * T * a->ld;
    gemm(r->dev, (zb_gemm){.trans_b = true,
                           .m = T,
                           .n = T,
                           .k = hd,
                           .alpha = 1,
                           .a = dout,
                           .lda = a->lo,
                           .stride_a = hd,
                           .b = q + 2 * h,
                           .ldb = a->ld,
                           .stride_b = hd,
                           .c = dp,
                           .ldc = T,
                           .stride_c = tt,
                           .batch = H});
    gemm(r->dev, (zb_gemm){.trans_a = true,
                           .m = T,
                           .n = hd,
                           .k = T,
                           .alpha = 1,
                           .a = p,
                           .lda = T,
                           .stride_a = tt,
                           .b = dout,
                           .ldb = a->lo,
                           .stride_b = hd,
                           .c = dq + 2 * h,
                           .ldc = a->ld,
                           .stride_c = hd,
                           .batch = H});
  }
  zb_diag d = {{0}};
  must(r->dev->ops->softmax_causal_bwd(r->dev->self, r->p, r->dp, T, a->batch * H, &d), "softmax_causal_bwd",
       &d);
  for (int s = 0; s < a->batch; s++) {
    const float *q = r->qkv + (size_t)s * T * a->ld, *ds = r->dp + (size_t)s * H * tt;
    float *dq = r->dqkv + (size_t)s * T * a->ld;
    gemm(r->dev, (zb_gemm){.m = T,
                           .n = hd,
                           .k = T,
                           .alpha = a->scale,
                           .a = ds,
                           .lda = T,
                           .stride_a = tt,
                           .b = q + h,
                           .ldb = a->ld,
                           .stride_b = hd,
                           .c = dq,
                           .ldc = a->ld,
                           .stride_c = hd,
                           .batch = H});
    gemm(r->dev, (zb_gemm){.trans_a = true,
                           .m = T,
                           .n = hd,
                           .k = T,
                           .alpha = a->scale,
                           .a = ds,
                           .lda = T,
                           .stride_a = tt,
                           .b = q,
                           .ldb = a->ld,
                           .stride_b = hd,
                           .c = dq + h,
                           .ldc = a->ld,
                           .stride_c = hd,
                           .batch = H});
  }
}

static void run_op(flash_run *r, bool flash, int op) {
  zb_diag d = {{0}};
  const zb_device_ops *ops = r->dev->ops;
  if (flash && op == FWD)
    must(ops->attn_fwd(r->dev->self, r->qkv, r->o, r->lse, &r->a, &d), "attn_fwd", &d);
  else if (flash)
    must(ops->attn_bwd(r->dev->self, r->qkv, r->o, r->lse, r->dout, r->dqkv, &r->a, &d), "attn_bwd", &d);
  else if (op == FWD)
    unfused_fwd(r);
  else
    unfused_bwd(r);
}

/* Best seconds of op over reps runs (the outputs exist: a warm-up ran). */
static double time_op(flash_run *r, bool flash, int op, int reps) {
  zb_device_event *e0 = gpu_event(r->dev), *e1 = gpu_event(r->dev);
  double best = 1e30;
  for (int i = 0; i < reps; i++) {
    gpu_record(r->dev, e0);
    run_op(r, flash, op);
    gpu_record(r->dev, e1);
    gpu_sync(r->dev);
    double s = gpu_elapsed_s(r->dev, e0, e1);
    best = s < best ? s : best;
  }
  r->dev->ops->event_free(r->dev->self, e0);
  r->dev->ops->event_free(r->dev->self, e1);
  return best;
}

static int64_t peak_above(zb_device *dev, int64_t base) {
  zb_device_mem m;
  dev->ops->mem(dev->self, &m);
  return m.peak - base;
}

/* One path: allocates its buffers, warms up measuring the peaks, times F
 * and B into t, leaves the outputs (o, dqkv) in r for the comparison. */
static void run_path(flash_run *r, bool flash, int reps, double t[2], int64_t peak[2]) {
  const zb_attn *a = &r->a;
  size_t n = (size_t)a->batch * a->t, pp = (size_t)a->batch * a->heads * a->t * a->t;
  zb_device_mem m;
  r->dev->ops->mem(r->dev->self, &m);
  int64_t base = m.current;
  r->dev->ops->reset_peak(r->dev->self);
  r->o = dev_alloc(r->dev, n * a->lo);
  if (flash)
    r->lse = dev_alloc(r->dev, (size_t)a->batch * a->heads * a->t);
  else
    r->p = dev_alloc(r->dev, pp);
  run_op(r, flash, FWD);
  gpu_sync(r->dev);
  peak[FWD] = peak_above(r->dev, base);
  r->dev->ops->reset_peak(r->dev->self);
  r->dqkv = dev_alloc(r->dev, n * a->ld);
  if (!flash)
    r->dp = dev_alloc(r->dev, pp);
  run_op(r, flash, BWD);
  gpu_sync(r->dev);
  peak[BWD] = peak_above(r->dev, base);
  t[FWD] = time_op(r, flash, FWD, reps);
  t[BWD] = time_op(r, flash, BWD, reps);
}

static void free_path(flash_run *r) {
  float **bufs[] = {&r->o, &r->lse, &r->p, &r->dp, &r->dqkv};
  for (int i = 0; i < 5; i++) {
    if (*bufs[i])
      r->dev->ops->free(r->dev->self, *bufs[i]);
    *bufs[i] = NULL;
  }
}

static float *to_host(zb_device *dev, const float *p, size_t n) {
  float *h = zb_malloc(n * sizeof *h);
  zb_diag d = {{0}};
  must(dev->ops->copy(dev->self, h, p, n * sizeof *h, ZB_COPY_D2H, &d), "copy", &d);
  gpu_sync(dev);
  return h;
}

/* max |x - y| / max |y| */
static double rel_diff(const float *x, const float *y, size_t n) {
  double dmax = 0, ymax = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - y[i]);
    dmax = d > dmax ? d : dmax;
    ymax = fabs((double)y[i]) > ymax ? fabs((double)y[i]) : ymax;
  }
  return ymax > 0 ? dmax / ymax : dmax;
}

static void flash_row(const char *path, const char *op, double flops, double s, int64_t peak) {
  printf("%-8s %-2s %12.6g %10.3f %9.2f %14lld %10.3f\n", path, op, flops * 1e-9, s * 1e3, flops / s * 1e-12,
         (long long)peak, (double)peak / (1 << 20));
}

static void flash_measure(flash_run *r, int reps) {
  const zb_attn *a = &r->a;
  size_t n = (size_t)a->batch * a->t;
  double fl[2], t[2][2];
  int64_t peak[2][2];
  fl[FWD] = 2.0 * a->hd * a->t * (a->t + 1.0) * a->heads * a->batch; /* 2 products x 2 hd x T(T+1)/2 */
  fl[BWD] = 2 * fl[FWD];
  float *ho[2], *hd[2];
  for (int path = 0; path < 2; path++) { /* 0: flash, 1: unfused */
    run_path(r, path == 0, reps, t[path], peak[path]);
    ho[path] = to_host(r->dev, r->o, n * a->lo);
    hd[path] = to_host(r->dev, r->dqkv, n * a->ld);
    free_path(r);
  }
  printf("%-8s %-2s %12s %10s %9s %14s %10s\n", "path", "op", "GFLOP", "ms", "TFLOP/s", "peak bytes",
         "peak MiB");
  static const char *const paths[2] = {"flash", "unfused"}, *const ops[2] = {"F", "B"};
  for (int path = 0; path < 2; path++)
    for (int op = 0; op < 2; op++)
      flash_row(paths[path], ops[op], fl[op], t[path][op], peak[path][op]);
  printf("   flash / unfused: speed F %.2fx, B %.2fx; peak bytes F %.3f, B %.3f\n", t[1][FWD] / t[0][FWD],
         t[1][BWD] / t[0][BWD], (double)peak[0][FWD] / (double)peak[1][FWD],
         (double)peak[0][BWD] / (double)peak[1][BWD]);
  printf("   flash against unfused: O differs by %.2e, dQ|dK|dV by %.2e (of the largest unfused value)\n",
         rel_diff(ho[0], ho[1], n * a->lo), rel_diff(hd[0], hd[1], n * a->ld));
  for (int path = 0; path < 2; path++) {
    free(ho[path]);
    free(hd[path]);
  }
}

void gpu_bench_flash(zb_device *dev, const gpu_opts *o) {
  int hd = o->hidden / o->heads;
  printf("5. flash attention against the unfused path, %s: batch %d, %d heads of %d, T = %d; best of %d\n",
         gpu_precision_name(o->precision), o->batch, o->heads, hd, o->seq, o->reps);
  if (!dev->ops->attn_fwd || !dev->ops->attn_bwd) {
    printf("flash attention: not on this device (%s: no attn_fwd / attn_bwd)\n\n", dev->ops->name);
    return;
  }
  if (dev->ops->attn_max_hd > 0 && hd > dev->ops->attn_max_hd) {
    printf("flash attention: not on this device at head dim %d (%s: at most %d)\n\n", hd, dev->ops->name,
           dev->ops->attn_max_hd);
    return;
  }
  printf("   FLOPs as a causal kernel needs them: T(T+1)/2 entries per head, 2 products in F, 4 in B; peak: "
         "the allocator's high-water mark above qkv and dO\n");
  flash_run r = {.dev = dev,
                 .a = {.batch = o->batch,
                       .t = o->seq,
                       .heads = o->heads,
                       .kv_heads = o->heads,
                       .hd = hd,
                       .ld = 3 * o->hidden,
                       .lo = o->hidden,
                       .scale = 1.0f / sqrtf((float)hd)},
                 .hidden = o->hidden};
  size_t n = (size_t)o->batch * o->seq;
  r.qkv = gpu_dev_floats(dev, n * r.a.ld);
  r.dout = gpu_dev_floats(dev, n * r.a.lo);
  flash_measure(&r, o->reps);
  dev->ops->free(dev->self, r.qkv);
  dev->ops->free(dev->self, r.dout);
  printf("\n");
}
