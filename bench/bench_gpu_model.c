/* bench_gpu_model.c — zb_bench_gpu's section 1 (bench_gpu.h): F, B and W of
 * one model stage on the CUDA device, each beside cuBLAS replaying exactly
 * the matrix products that op issued (zb_model_trace_gemms: same shapes,
 * transposes, leading dimensions, batch and strides, same number of calls)
 * through the same device's gemm, in the same run. The target
 * (docs/model.md, Devices): each op at least 70% of its replay.
 *
 * Ops run on device buffers (zb_model_forward_dev, zb_model_backward_b_dev:
 * no host copies), one microbatch at a time. Each op is timed with device
 * events recorded around it on the compute stream; the figures are the best
 * of --reps rounds after one traced round (which also warms up: cuBLAS
 * loads its kernels, the allocator fills its cache). FLOPs count the
 * matrix products only (2*m*n*k each, as issued: the causal skip's
 * products, not T x T; the stage keeps the unfused attention, whose
 * products these are); the element-wise kernels count nothing but take
 * time, which is what the ratio shows. The replay reuses one set of
 * buffers, so it runs from a warm L2 where the model's products may not: a
 * slightly flattering baseline.
 *
 * Ownership: everything is allocated and freed here. Threads: the caller's.
 * Errors: a device or model failure exits 1 through gpu_die.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "zb_alloc.h"
#include "zb_model.h"

#define TRACE_CAP 65536 /* distinct products per op: the causal skip issues a few per row block */

enum { OP_F, OP_B, OP_W, N_OPS };

/* One stage and the device buffers its ops read and write. */
typedef struct stage_run {
  zb_device *dev;
  zb_model_stage *st;
  float *x, *y, *dy, *dx; /* device memory, act_numel floats each */
  int32_t *targets;       /* host memory (the model copies them) */
  bool last;
} stage_run;

/* The builtin model of the bench's shapes, three stages of o->layers
 * blocks each, on dev. */
static zb_model_config builtin_config(zb_device *dev, const gpu_opts *o) {
  return (zb_model_config){.vocab = o->vocab,
                           .hidden = o->hidden,
                           .heads = o->heads,
                           .layers =
                               3 * o->layers, /* the middle one of three stages holds o->layers blocks */
                           .seq_len = o->seq,
                           .batch = o->batch,
                           .seed = 1,
                           .device = dev,
                           .attn_block = o->attn_block,
                           /* the unfused attention: its products are cuBLAS's, so the replay covers the op
                              (flash attention issues none; docs/model.md, Flash attention (CUDA)) */
                           .attn_unfused = 1,
                           /* --precision bf16: bf16 storage (weights' compute copy, saved state), as jobs */
                           .bf16 = o->precision == ZB_PRECISION_BF16};
}

static void stage_open(const zb_model_config *cfg, int stage, stage_run *r) {
  zb_diag d = {{0}};
  memset(r, 0, sizeof *r);
  r->dev = cfg->device;
  if (zb_model_stage_new(cfg, stage, 3, &r->st, &d) != ZB_OK)
    gpu_die("zb_model_stage_new", &d);
  int vocab = zb_model_stage_config(r->st)->vocab;
  size_t na = zb_model_act_numel(r->st), nt = (size_t)cfg->batch * cfg->seq_len;
  r->last = zb_model_stage_is_last(r->st);
  r->x = gpu_dev_floats(r->dev, na);
  r->y = gpu_dev_floats(r->dev, na);
  r->dy = gpu_dev_floats(r->dev, na);
  r->dx = gpu_dev_floats(r->dev, na);
  r->targets = zb_malloc(nt * sizeof *r->targets);
  for (size_t i = 0; i < nt; i++)
    r->targets[i] = (int32_t)((i * 7) % (size_t)vocab);
}

static void stage_close(stage_run *r) {
  float *bufs[] = {r->x, r->y, r->dy, r->dx};
  for (int i = 0; i < 4; i++)
    r->dev->ops->free(r->dev->self, bufs[i]);
  free(r->targets);
  zb_model_stage_free(r->st);
}

/* Enqueues op on microbatch 0 (the last stage's F waits for its loss). */
static void stage_op(stage_run *r, int op) {
  zb_diag d = {{0}};
  float loss;
  zb_err err;
  if (op == OP_F)
    err = zb_model_forward_dev(r->st, 0, NULL, r->x, r->last ? r->targets : NULL, r->last ? NULL : r->y,
                               r->last ? &loss : NULL, &d);
  else if (op == OP_B)
    err = zb_model_backward_b_dev(r->st, 0, r->last ? NULL : r->dy, r->dx, &d);
  else
    err = zb_model_backward_w(r->st, 0, &d);
  if (err)
    gpu_die(op == OP_F ? "F" : op == OP_B ? "B" : "W", &d);
}

/* One traced round: trace[op] gets op's products; returns their counts. */
static void trace_round(stage_run *r, zb_model_gemm *trace[N_OPS], int n[N_OPS]) {
  zb_model_trace_gemms(r->st, trace[OP_F], TRACE_CAP);
  stage_op(r, OP_F);
  n[OP_F] = zb_model_trace_gemms(r->st, trace[OP_B], TRACE_CAP);
  stage_op(r, OP_B);
  n[OP_B] = zb_model_trace_gemms(r->st, trace[OP_W], TRACE_CAP);
  stage_op(r, OP_W);
  n[OP_W] = zb_model_trace_gemms(r->st, NULL, 0);
  gpu_sync(r->dev);
  for (int op = 0; op < N_OPS; op++)
    if (n[op] > TRACE_CAP) {
      zb_diag d;
      snprintf(d.msg, sizeof d.msg, "an op issued %d distinct products, more than %d", n[op], TRACE_CAP);
      gpu_die("trace", &d);
    }
}

/* Best seconds of F, B and W over reps rounds, by events around each op. */
static void time_ops(stage_run *r, int reps, double best[N_OPS]) {
  zb_device *dev = r->dev;
  zb_device_event *e[N_OPS + 1];
  zb_diag d = {{0}};
  for (int i = 0; i <= N_OPS; i++)
    if (dev->ops->event_new(dev->self, &e[i], &d))
      gpu_die("event_new", &d);
  for (int op = 0; op < N_OPS; op++)
    best[op] = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    gpu_record(dev, e[0]);
    for (int op = 0; op < N_OPS; op++) {
      stage_op(r, op);
      gpu_record(dev, e[op + 1]);
    }
    gpu_sync(dev);
    for (int op = 0; op < N_OPS; op++) {
      double s = gpu_elapsed_s(dev, e[op], e[op + 1]);
      best[op] = s < best[op] ? s : best[op];
    }
  }
  for (int i = 0; i <= N_OPS; i++)
    dev->ops->event_free(dev->self, e[i]);
}

/* Floats an operand of the traced call spans: (batch-1) strides plus its
 * rows at their leading dimension. */
static size_t span(int batch, int64_t stride, int rows, int ld) {
  return (size_t)(batch - 1) * (size_t)stride + (size_t)rows * (size_t)ld;
}

/* Buffers large enough for every traced product of every op. */
typedef struct replay_bufs {
  float *a, *b, *c;
} replay_bufs;

static void replay_open(zb_device *dev, zb_model_gemm *trace[N_OPS], const int n[N_OPS], replay_bufs *rb) {
  size_t na = 1, nb = 1, nc = 1;
  for (int op = 0; op < N_OPS; op++)
    for (int i = 0; i < n[op]; i++) {
      const zb_model_gemm *g = &trace[op][i];
      size_t sa = span(g->batch, g->stride_a, g->trans_a ? g->k : g->m, g->lda);
      size_t sb = span(g->batch, g->stride_b, g->trans_b ? g->n : g->k, g->ldb);
      size_t sc = span(g->batch, g->stride_c, g->m, g->ldc);
      na = sa > na ? sa : na;
      nb = sb > nb ? sb : nb;
      nc = sc > nc ? sc : nc;
    }
  rb->a = gpu_dev_floats(dev, na);
  rb->b = gpu_dev_floats(dev, nb);
  rb->c = gpu_dev_floats(dev, nc);
}

/* Enqueues one replay of an op's products: count / batch calls each. */
static void replay_enqueue(zb_device *dev, const zb_model_gemm *t, int n, const replay_bufs *rb) {
  zb_diag d = {{0}};
  for (int i = 0; i < n; i++) {
    zb_gemm g = {.trans_a = t[i].trans_a,
                 .trans_b = t[i].trans_b,
                 .m = t[i].m,
                 .n = t[i].n,
                 .k = t[i].k,
                 .alpha = t[i].alpha,
                 .beta = t[i].beta,
                 .a = rb->a,
                 .lda = t[i].lda,
                 .stride_a = t[i].stride_a,
                 .b = rb->b,
                 .ldb = t[i].ldb,
                 .stride_b = t[i].stride_b,
                 .c = rb->c,
                 .ldc = t[i].ldc,
                 .stride_c = t[i].stride_c,
                 .batch = t[i].batch};
    for (int call = 0; call < t[i].count / t[i].batch; call++)
      if (dev->ops->gemm(dev->self, &g, &d))
        gpu_die("gemm (replay)", &d);
  }
}

/* Best seconds of each op's replay over reps rounds, after a warm-up. */
static void time_replays(zb_device *dev, zb_model_gemm *trace[N_OPS], const int n[N_OPS], int reps,
                         double best[N_OPS]) {
  replay_bufs rb;
  replay_open(dev, trace, n, &rb);
  zb_device_event *e0, *e1;
  zb_diag d = {{0}};
  if (dev->ops->event_new(dev->self, &e0, &d) || dev->ops->event_new(dev->self, &e1, &d))
    gpu_die("event_new", &d);
  for (int op = 0; op < N_OPS; op++) {
    best[op] = 1e30;
    replay_enqueue(dev, trace[op], n[op], &rb); /* warm-up */
    for (int rep = 0; rep < reps; rep++) {
      gpu_record(dev, e0);
      replay_enqueue(dev, trace[op], n[op], &rb);
      gpu_record(dev, e1);
      gpu_sync(dev);
      double s = gpu_elapsed_s(dev, e0, e1);
      best[op] = s < best[op] ? s : best[op];
    }
  }
  dev->ops->event_free(dev->self, e0);
  dev->ops->event_free(dev->self, e1);
  dev->ops->free(dev->self, rb.a);
  dev->ops->free(dev->self, rb.b);
  dev->ops->free(dev->self, rb.c);
}

static double trace_flops(const zb_model_gemm *g, int n, int *calls) {
  double f = 0;
  *calls = 0;
  for (int i = 0; i < n; i++) {
    f += 2.0 * g[i].m * g[i].n * g[i].k * g[i].count;
    *calls += g[i].count / g[i].batch;
  }
  return f;
}

/* Measures and prints one stage's three rows; op seconds into t. */
static void bench_stage(zb_device *dev, const gpu_opts *o, int stage, double t[N_OPS]) {
  static const char *const kinds[] = {"first", "middle", "last"}, *const ops[] = {"F", "B", "W"};
  stage_run r;
  zb_model_config cfg = builtin_config(dev, o);
  stage_open(&cfg, stage, &r);
  zb_model_gemm *trace[N_OPS];
  int n[N_OPS];
  for (int op = 0; op < N_OPS; op++)
    trace[op] = zb_malloc(TRACE_CAP * sizeof(zb_model_gemm));
  trace_round(&r, trace, n);
  double replay[N_OPS];
  time_ops(&r, o->reps, t);
  time_replays(dev, trace, n, o->reps, replay);
  for (int op = 0; op < N_OPS; op++) {
    int calls;
    double fl = trace_flops(trace[op], n[op], &calls);
    printf("%-7s %-2s %10.4g %6d %10.3f %9.2f %11.3f %9.2f %8.0f%%\n", kinds[stage], ops[op], fl * 1e-9,
           calls, t[op] * 1e3, fl / t[op] * 1e-12, replay[op] * 1e3, fl / replay[op] * 1e-12,
           100.0 * replay[op] / t[op]);
    free(trace[op]);
  }
  stage_close(&r);
}

void gpu_time_stage(const zb_model_config *cfg, int stage, int reps, double best[3]) {
  stage_run r;
  stage_open(cfg, stage, &r);
  for (int op = 0; op < N_OPS; op++) /* warm-up: cuBLAS loads its kernels, the allocator fills its cache */
    stage_op(&r, op);
  gpu_sync(r.dev);
  time_ops(&r, reps, best);
  stage_close(&r);
}

void gpu_bench_model(zb_device *dev, const gpu_opts *o, gpu_block_times *block) {
  printf(
      "1. model stage on the CUDA device, %s: %d blocks, hidden %d, %d heads, seq %d, batch %d (%d tokens), "
      "vocab %d; attention blocks of %d query rows; best of %d\n",
      gpu_precision_name(o->precision), o->layers, o->hidden, o->heads, o->seq, o->batch, o->batch * o->seq,
      o->vocab, o->attn_block > 0 ? o->attn_block : dev->ops->attn_block, o->reps);
  printf("   op: the model's op, timed with device events; cuBLAS: the products that op issued, replayed "
         "alone\n");
  printf("%-7s %-2s %10s %6s %10s %9s %11s %9s %9s\n", "stage", "op", "GFLOP", "gemms", "op ms", "TFLOP/s",
         "cuBLAS ms", "TFLOP/s", "op/cuBLAS");
  double mid[N_OPS], last[N_OPS];
  bench_stage(dev, o, 1, mid);
  bench_stage(dev, o, 2, last);
  printf("   target: every op at least 70%% of its cuBLAS replay (op/cuBLAS = cuBLAS ms / op ms)\n\n");
  block->f = mid[OP_F] / o->layers;
  block->b = mid[OP_B] / o->layers;
  block->w = mid[OP_W] / o->layers;
}
