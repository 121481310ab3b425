/* bench_gpu.c — zb_bench_gpu: what a GPU gives the model (docs/model.md,
 * Devices), measured on the real CUDA runtime, cuBLAS and NCCL.
 *
 *   zb_bench_gpu [--gpu 0] [--hidden 1024] [--heads 16] [--seq 1024]
 *                [--batch 8] [--vocab 256] [--reps 20]
 *                [--precision fp32|tf32|bf16] [--nccl-max-mib 256]
 *
 * Sections:
 *   1. cuBLAS: TFLOP/s of every matrix product shape of one transformer
 *      layer's F, B (input gradients) and W (weight gradients) and of the
 *      LM head, for one microbatch of batch x seq tokens, through the CUDA
 *      device's gemm (zb_device.h: cublasGemmStridedBatchedEx), timed with
 *      the device's events over --reps runs after one warm-up. FLOPs are
 *      2*m*n*k*batch; the attention products are counted in full.
 *   2. NCCL: send/recv GB/s from GPU --gpu to the next visible GPU, one
 *      process driving both (ncclCommInitAll), sizes from 1 MiB to
 *      --nccl-max-mib; with fewer than two GPUs it says so.
 * Without a CUDA device it prints why and exits 0: there is nothing to
 * measure. It prints; it never fails on a slow result. Exit 1 on a device
 * or NCCL error, 2 on a bad flag.
 */
#include <getopt.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_clock.h"
#include "zb_device.h"

typedef struct opts {
  int gpu, hidden, heads, seq, batch, vocab, reps, nccl_max_mib;
  zb_precision precision;
} opts;

typedef struct shape {
  const char *name;
  bool ta, tb;
  int m, n, k, batch;
} shape;

static void die(const char *what, const zb_diag *diag) {
  fprintf(stderr, "zb_bench_gpu: %s: %s\n", what, diag->msg);
  exit(1);
}

/* The products of one layer (row-major, as the model stores them) and of
 * the LM head, for N = batch * seq tokens, d = hidden / heads. */
static int layer_shapes(const opts *o, shape *s) {
  int h = o->hidden, N = o->batch * o->seq, T = o->seq, d = o->hidden / o->heads, bh = o->batch * o->heads;
  struct {
    const char *name;
    int out, in;
  } lin[] = {{"qkv", 3 * h, h},
             {"attn proj", h, h},
             {"mlp up", 4 * h, h},
             {"mlp down", h, 4 * h},
             {"lm head", o->vocab, h}};
  int n = 0;
  for (int i = 0; i < 5; i++) {
    static char names[5][3][40];
    snprintf(names[i][0], sizeof names[i][0], "F  %s", lin[i].name);
    snprintf(names[i][1], sizeof names[i][1], "B  %s dX", lin[i].name);
    snprintf(names[i][2], sizeof names[i][2], "W  %s dW", lin[i].name);
    s[n++] = (shape){names[i][0], false, false, N, lin[i].out, lin[i].in, 1}; /* Y = X W */
    s[n++] = (shape){names[i][1], false, true, N, lin[i].in, lin[i].out, 1};  /* dX = dY W^T */
    s[n++] = (shape){names[i][2], true, false, lin[i].in, lin[i].out, N, 1};  /* dW = X^T dY */
  }
  s[n++] = (shape){"F  scores Q K^T", false, true, T, T, d, bh};
  s[n++] = (shape){"F  P V", false, false, T, d, T, bh};
  s[n++] = (shape){"B  dP = dO V^T", false, true, T, T, d, bh};
  s[n++] = (shape){"B  dV = P^T dO", true, false, T, d, T, bh};
  s[n++] = (shape){"B  dQ = dS K", false, false, T, d, T, bh};
  s[n++] = (shape){"B  dK = dS^T Q", true, false, T, d, T, bh};
  return n;
}

/* Allocates n floats on dev, filled from a host pattern (not zeros: the
 * power a product draws depends on its data). */
static float *dev_floats(zb_device *dev, size_t n) {
  zb_diag diag = {{0}};
  void *p;
  if (dev->ops->alloc(dev->self, n * sizeof(float), &p, &diag))
    die("alloc", &diag);
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++)
    h[i] = (float)((i * 2654435761u) % 1000u) * 1e-3f - 0.5f;
  if (dev->ops->copy(dev->self, p, h, n * sizeof(float), ZB_COPY_H2D, &diag) ||
      dev->ops->sync(dev->self, &diag))
    die("copy", &diag);
  free(h);
  return p;
}

static double time_gemm(zb_device *dev, const zb_gemm *g, int reps) {
  zb_diag diag = {{0}};
  zb_device_event *e0, *e1;
  if (dev->ops->event_new(dev->self, &e0, &diag) || dev->ops->event_new(dev->self, &e1, &diag))
    die("event_new", &diag);
  zb_err err = dev->ops->gemm(dev->self, g, &diag); /* warm-up: cuBLAS picks and loads its kernel */
  err = err ? err : dev->ops->event_record(dev->self, e0, &diag);
  for (int r = 0; r < reps && !err; r++)
    err = dev->ops->gemm(dev->self, g, &diag);
  err = err ? err : dev->ops->event_record(dev->self, e1, &diag);
  err = err ? err : dev->ops->sync(dev->self, &diag);
  float ms = 0;
  err = err ? err : dev->ops->event_elapsed_ms(dev->self, e0, e1, &ms, &diag);
  if (err)
    die("gemm", &diag);
  dev->ops->event_free(dev->self, e0);
  dev->ops->event_free(dev->self, e1);
  return (double)ms / reps;
}

static void bench_gemms(zb_device *dev, const opts *o) {
  shape s[24];
  int n = layer_shapes(o, s);
  size_t na = 0, nb = 0, nc = 0;
  for (int i = 0; i < n; i++) {
    size_t a = (size_t)s[i].m * s[i].k * s[i].batch, b = (size_t)s[i].k * s[i].n * s[i].batch,
           c = (size_t)s[i].m * s[i].n * s[i].batch;
    na = a > na ? a : na;
    nb = b > nb ? b : nb;
    nc = c > nc ? c : nc;
  }
  float *a = dev_floats(dev, na), *b = dev_floats(dev, nb), *c = dev_floats(dev, nc);
  static const char *prec[] = {"fp32 (TF32 off)", "tf32", "bf16"};
  printf("cuBLAS through the CUDA device, %s; hidden %d, %d heads, seq %d, batch %d, vocab %d; mean of %d "
         "runs\n",
         prec[o->precision], o->hidden, o->heads, o->seq, o->batch, o->vocab, o->reps);
  printf("  %-18s %2s %7s %7s %7s %6s %10s %9s\n", "product", "op", "m", "n", "k", "batch", "ms", "TFLOP/s");
  double total_flops = 0, total_ms = 0;
  for (int i = 0; i < n; i++) {
    zb_gemm g = {.trans_a = s[i].ta,
                 .trans_b = s[i].tb,
                 .m = s[i].m,
                 .n = s[i].n,
                 .k = s[i].k,
                 .alpha = 1.0f,
                 .beta = 0.0f,
                 .a = a,
                 .b = b,
                 .c = c,
                 .batch = s[i].batch};
    g.lda = s[i].ta ? s[i].m : s[i].k;
    g.ldb = s[i].tb ? s[i].k : s[i].n;
    g.ldc = s[i].n;
    g.stride_a = (int64_t)s[i].m * s[i].k;
    g.stride_b = (int64_t)s[i].k * s[i].n;
    g.stride_c = (int64_t)s[i].m * s[i].n;
    double ms = time_gemm(dev, &g, o->reps);
    double flops = 2.0 * s[i].m * s[i].n * s[i].k * s[i].batch;
    total_flops += flops;
    total_ms += ms;
    printf("  %-18s %c%c %7d %7d %7d %6d %10.3f %9.2f\n", s[i].name, s[i].ta ? 'T' : 'N', s[i].tb ? 'T' : 'N',
           s[i].m, s[i].n, s[i].k, s[i].batch, ms, flops / (ms * 1e-3) / 1e12);
  }
  printf("  %-18s %42s %10.3f %9.2f\n\n", "all of the above", "", total_ms,
         total_flops / (total_ms * 1e-3) / 1e12);
  dev->ops->free(dev->self, a);
  dev->ops->free(dev->self, b);
  dev->ops->free(dev->self, c);
}

#define NCCL_OK(call)                                                                                        \
  do {                                                                                                       \
    ncclResult_t r_ = (call);                                                                                \
    if (r_ != ncclSuccess) {                                                                                 \
      fprintf(stderr, "zb_bench_gpu: %s: %s\n", #call, ncclGetErrorString(r_));                              \
      exit(1);                                                                                               \
    }                                                                                                        \
  } while (0)

/* One send from dev[0] to dev[1] of `bytes`, reps times; seconds per send. */
static double time_sendrecv(zb_device *dev[2], ncclComm_t comm[2], void *buf[2], size_t bytes, int reps) {
  zb_diag diag = {{0}};
  double t0 = 0;
  for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
    if (r == 0)
      t0 = zb_clock_s();
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(buf[0], bytes, ncclChar, 1, comm[0], dev[0]->ops->stream(dev[0]->self)));
    NCCL_OK(ncclRecv(buf[1], bytes, ncclChar, 0, comm[1], dev[1]->ops->stream(dev[1]->self)));
    NCCL_OK(ncclGroupEnd());
    if (r == -1 || r == reps - 1)
      for (int i = 0; i < 2; i++)
        if (dev[i]->ops->sync(dev[i]->self, &diag))
          die("sync", &diag);
  }
  return (zb_clock_s() - t0) / reps;
}

static void bench_nccl(zb_device *dev0, const opts *o) {
  zb_device_info info;
  zb_diag diag = {{0}};
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  if (zb_device_cuda_probe(o->gpu + 1, &info, &diag) != ZB_OK) {
    printf("NCCL %d send/recv: needs a second GPU after GPU %d (%s); not measured\n", version, o->gpu,
           diag.msg);
    return;
  }
  zb_device *dev[2] = {dev0, NULL};
  zb_cuda_device_config cfg = {.ordinal = o->gpu + 1, .precision = ZB_PRECISION_FP32};
  if (zb_device_cuda_new(&cfg, &dev[1], &diag))
    die("zb_device_cuda_new", &diag);
  ncclComm_t comm[2];
  int devs[2] = {o->gpu, o->gpu + 1};
  NCCL_OK(ncclCommInitAll(comm, 2, devs));
  size_t max = (size_t)o->nccl_max_mib << 20;
  void *buf[2];
  for (int i = 0; i < 2; i++)
    if (dev[i]->ops->alloc(dev[i]->self, max, &buf[i], &diag))
      die("alloc", &diag);
  printf("NCCL %d send/recv, GPU %d -> GPU %d (%s), one process; mean of %d sends\n", version, o->gpu,
         o->gpu + 1, info.name, o->reps);
  printf("  %12s %10s %9s\n", "bytes", "ms", "GB/s");
  for (size_t bytes = (size_t)1 << 20; bytes <= max; bytes *= 4) {
    double s = time_sendrecv(dev, comm, buf, bytes, o->reps);
    printf("  %12zu %10.3f %9.2f\n", bytes, s * 1e3, (double)bytes / s / 1e9);
  }
  for (int i = 0; i < 2; i++) {
    dev[i]->ops->free(dev[i]->self, buf[i]);
    ncclCommDestroy(comm[i]);
  }
  zb_device_free(dev[1]);
}

static int parse(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"gpu", 1, 0, 'g'},          {"hidden", 1, 0, 'h'}, {"heads", 1, 0, 'a'}, {"seq", 1, 0, 's'},
      {"batch", 1, 0, 'b'},        {"vocab", 1, 0, 'v'},  {"reps", 1, 0, 'r'},  {"precision", 1, 0, 'p'},
      {"nccl-max-mib", 1, 0, 'n'}, {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    if (c == 'p') {
      if (strcmp(optarg, "fp32") == 0)
        o->precision = ZB_PRECISION_FP32;
      else if (strcmp(optarg, "tf32") == 0)
        o->precision = ZB_PRECISION_TF32;
      else if (strcmp(optarg, "bf16") == 0)
        o->precision = ZB_PRECISION_BF16;
      else
        return fprintf(stderr, "zb_bench_gpu: --precision takes fp32, tf32 or bf16\n"), 2;
      continue;
    }
    if (c == '?')
      return 2;
    char *end;
    long v = strtol(optarg, &end, 10);
    if (*end || v < (c == 'g' ? 0 : 1) || v > (1 << 20))
      return fprintf(stderr, "zb_bench_gpu: bad number '%s'\n", optarg), 2;
    int *f[] = {&o->gpu, &o->hidden, &o->heads, &o->seq, &o->batch, &o->vocab, &o->reps, &o->nccl_max_mib};
    *f[strchr("ghasbvrn", c) - "ghasbvrn"] = (int)v;
  }
  if (optind < argc || o->hidden % o->heads)
    return fprintf(stderr, "zb_bench_gpu: %s\n",
                   optind < argc ? "unexpected argument" : "heads must divide hidden"),
           2;
  return 0;
}

int main(int argc, char **argv) {
  opts o = {.gpu = 0,
            .hidden = 1024,
            .heads = 16,
            .seq = 1024,
            .batch = 8,
            .vocab = 256,
            .reps = 20,
            .nccl_max_mib = 256,
            .precision = ZB_PRECISION_FP32};
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  zb_device *dev;
  zb_diag diag = {{0}};
  zb_cuda_device_config cfg = {.ordinal = o.gpu, .precision = o.precision};
  zb_err err = zb_device_cuda_new(&cfg, &dev, &diag);
  if (err == ZB_ERR_UNSUPPORTED) {
    printf("zb_bench_gpu: no CUDA device (%s); nothing to measure\n", diag.msg);
    return 0;
  }
  if (err)
    die("zb_device_cuda_new", &diag);
  zb_device_info info;
  dev->ops->info(dev->self, &info);
  printf("GPU %d: %s, %.1f GiB, compute capability %d.%d, driver %d\n\n", o.gpu, info.name,
         (double)info.total_bytes / (1 << 30), info.cc_major, info.cc_minor, info.driver_version);
  bench_gemms(dev, &o);
  bench_nccl(dev, &o);
  zb_device_free(dev);
  return 0;
}
