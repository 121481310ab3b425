/* bench_gpu.c — zb_bench_gpu: what a GPU gives the model (docs/model.md,
 * Devices and Transports), measured on the real CUDA runtime, cuBLAS and
 * NCCL (or, built as the test-only zb_bench_gpu_standin, on the CPU
 * stand-in, where only the output's form means anything).
 *
 *   zb_bench_gpu [--gpu 0] [--hidden 1024] [--heads 16] [--seq 1024]
 *                [--batch 8] [--vocab 256] [--layers 2] [--reps 20]
 *                [--precision fp32|tf32|bf16] [--nccl-max-mib 256] [--shapes]
 *                [--attn-block N] [--mfu-layers 2] [--mfu-batch 4]
 *                [--mfu-seq 1024] [--mfu-heads N]
 *                [--sections model,nccl,pipeline,mfu,flash,syncs]
 *
 * Sections (bench_gpu.h names the files; --sections picks some, in this
 * order whatever the list's):
 *   1. F, B and W of one model stage (a middle and a last one of --layers
 *      blocks, one microbatch of batch x seq tokens) on GPU --gpu, timed
 *      with the device's events, best of --reps after a traced warm-up,
 *      beside cuBLAS replaying exactly the products each op issued, and
 *      the ratio (the target: >= 70%).
 *   2. NCCL send/recv GB/s through zb's nccl transport beside a plain
 *      ncclSend/ncclRecv loop of the same sizes, GPU --gpu to the next one,
 *      two ranks as two threads; with fewer than two GPUs it says so.
 *   3. zb-v against 1f1b (p = the visible GPUs, m = 2p): the bubble
 *      predicted by libzb's simulator from section 1's op times, and, with
 *      two GPUs or more, measured by running each rank's lowered list with
 *      the worker's executor over the cuda backend and the nccl transport.
 *      Without section 1 it predicts from 1 ms per op.
 *   4. MFU: F, B and W of a middle stage of --mfu-layers blocks of a GPT-2
 *      124M-shaped and a LLaMA-shaped (hidden 4096, GQA 32/8, SwiGLU 14336)
 *      model, --mfu-batch sequences of --mfu-seq tokens; model FLOPs per
 *      op, TFLOP/s, and MFU against the device's dense peak for the
 *      precision where the device is in the table (H100/H200 SXM, A100),
 *      else "peak unknown". --mfu-heads N scales the width down (N heads
 *      of the same head dimension).
 *   5. Flash attention (the device's attn_fwd / attn_bwd) beside the
 *      unfused products and softmax at batch, heads, seq: causal TFLOP/s,
 *      the allocator's peak bytes, and how far the two agree; "not on this
 *      device" where the device has none.
 *   6. Host syncs per iteration of one rank holding all 4 stages of a
 *      small job (the cuda backend, the loss read, the device optimizer
 *      step) for m = 4, 8, 16, and whether the count is constant in m.
 *   --attn-block N sets the query rows per causal attention block (default:
 *   the device's choice, zb_device_ops.attn_block).
 *   --shapes adds a table of every product shape of one layer through the
 *   device's gemm (FLOPs 2*m*n*k*batch, attention counted in full).
 * Without a CUDA device it prints why and exits 0: there is nothing to
 * measure. It prints; it never fails on a slow result. Exit 1 on a device,
 * NCCL or planner error, 2 on a bad flag.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"

typedef struct shape {
  const char *name;
  bool ta, tb;
  int m, n, k, batch;
} shape;

_Noreturn void gpu_die(const char *what, const zb_diag *diag) {
  fprintf(stderr, "zb_bench_gpu: %s: %s\n", what, diag->msg);
  exit(1);
}

void gpu_record(zb_device *dev, zb_device_event *e) {
  zb_diag d = {{0}};
  if (dev->ops->event_record(dev->self, e, &d))
    gpu_die("event_record", &d);
}

double gpu_elapsed_s(zb_device *dev, zb_device_event *a, zb_device_event *b) {
  zb_diag d = {{0}};
  float ms = 0;
  if (dev->ops->event_elapsed_ms(dev->self, a, b, &ms, &d))
    gpu_die("event_elapsed_ms", &d);
  return ms * 1e-3;
}

void gpu_sync(zb_device *dev) {
  zb_diag d = {{0}};
  if (dev->ops->sync(dev->self, &d))
    gpu_die("sync", &d);
}

zb_device_event *gpu_event(zb_device *dev) {
  zb_diag d = {{0}};
  zb_device_event *e;
  if (dev->ops->event_new(dev->self, &e, &d))
    gpu_die("event_new", &d);
  return e;
}

bool gpu_section_on(const gpu_opts *o, const char *name) {
  size_t n = strlen(name);
  for (const char *p = o->sections; (p = strstr(p, name)) != NULL; p += n)
    if ((p == o->sections || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
      return true;
  return false;
}

int gpu_count(void) {
  zb_device_info info;
  int n = 0;
  while (n < 1024 && zb_device_cuda_probe(n, &info, NULL) == ZB_OK)
    n++;
  return n;
}

const char *gpu_precision_name(zb_precision p) {
  static const char *const names[] = {"fp32 (TF32 off)", "tf32", "bf16"};
  return names[p];
}

/* The products of one layer (row-major, as the model stores them) and of
 * the LM head, for N = batch * seq tokens, d = hidden / heads. */
static int layer_shapes(const gpu_opts *o, shape *s) {
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
float *gpu_dev_floats(zb_device *dev, size_t n) {
  zb_diag diag = {{0}};
  void *p;
  if (dev->ops->alloc(dev->self, n * sizeof(float), &p, &diag))
    gpu_die("alloc", &diag);
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++)
    h[i] = (float)((i * 2654435761u) % 1000u) * 1e-3f - 0.5f;
  if (dev->ops->copy(dev->self, p, h, n * sizeof(float), ZB_COPY_H2D, &diag) ||
      dev->ops->sync(dev->self, &diag))
    gpu_die("copy", &diag);
  free(h);
  return p;
}

static double time_gemm(zb_device *dev, const zb_gemm *g, int reps) {
  zb_diag diag = {{0}};
  zb_device_event *e0, *e1;
  if (dev->ops->event_new(dev->self, &e0, &diag) || dev->ops->event_new(dev->self, &e1, &diag))
    gpu_die("event_new", &diag);
  zb_err err = dev->ops->gemm(dev->self, g, &diag); /* warm-up: cuBLAS picks and loads its kernel */
  err = err ? err : dev->ops->event_record(dev->self, e0, &diag);
  for (int r = 0; r < reps && !err; r++)
    err = dev->ops->gemm(dev->self, g, &diag);
  err = err ? err : dev->ops->event_record(dev->self, e1, &diag);
  err = err ? err : dev->ops->sync(dev->self, &diag);
  float ms = 0;
  err = err ? err : dev->ops->event_elapsed_ms(dev->self, e0, e1, &ms, &diag);
  if (err)
    gpu_die("gemm", &diag);
  dev->ops->event_free(dev->self, e0);
  dev->ops->event_free(dev->self, e1);
  return (double)ms / reps;
}

static void bench_gemms(zb_device *dev, const gpu_opts *o) {
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
  float *a = gpu_dev_floats(dev, na), *b = gpu_dev_floats(dev, nb), *c = gpu_dev_floats(dev, nc);
  printf("every product shape of one layer through the device's gemm, %s; hidden %d, %d heads, seq %d, "
         "batch %d, vocab %d; mean of %d runs\n",
         gpu_precision_name(o->precision), o->hidden, o->heads, o->seq, o->batch, o->vocab, o->reps);
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

static const char *const section_names[] = {"model", "nccl", "pipeline", "mfu", "flash", "syncs"};

/* 0 when every name in o->sections is a section's, else 2 after saying which is not. */
static int check_sections(const gpu_opts *o) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", o->sections);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < sizeof section_names / sizeof *section_names && strcmp(t, section_names[i]) != 0)
      i++;
    if (i == sizeof section_names / sizeof *section_names)
      return fprintf(stderr,
                     "zb_bench_gpu: --sections: no section '%s' (model, nccl, pipeline, mfu, flash, syncs)\n",
                     t),
             2;
  }
  return 0;
}

static int parse_precision(const char *s, gpu_opts *o) {
  static const char *const names[] = {"fp32", "tf32", "bf16"};
  for (int i = 0; i < 3; i++)
    if (strcmp(s, names[i]) == 0) {
      o->precision = (zb_precision)i;
      return 0;
    }
  return fprintf(stderr, "zb_bench_gpu: --precision takes fp32, tf32 or bf16\n"), 2;
}

static int parse(int argc, char **argv, gpu_opts *o) {
  static const struct option lo[] = {
      {"gpu", 1, 0, 'g'},        {"hidden", 1, 0, 'h'},       {"heads", 1, 0, 'a'},
      {"seq", 1, 0, 's'},        {"batch", 1, 0, 'b'},        {"vocab", 1, 0, 'v'},
      {"reps", 1, 0, 'r'},       {"precision", 1, 0, 'p'},    {"layers", 1, 0, 'l'},
      {"shapes", 0, 0, 'S'},     {"nccl-max-mib", 1, 0, 'n'}, {"attn-block", 1, 0, 'k'},
      {"mfu-layers", 1, 0, 'L'}, {"mfu-batch", 1, 0, 'B'},    {"mfu-seq", 1, 0, 'T'},
      {"mfu-heads", 1, 0, 'H'},  {"sections", 1, 0, 'x'},     {0, 0, 0, 0}};
  static const char fields[] = "ghasbvrlnkLBTH";
  int c, li = 0;
  while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
    if (c == 'S') {
      o->shapes = true;
      continue;
    }
    if (c == 'x') {
      o->sections = optarg;
      continue;
    }
    if (c == 'p') {
      if (parse_precision(optarg, o))
        return 2;
      continue;
    }
    if (c == '?')
      return 2;
    char *end;
    long v = strtol(optarg, &end, 10);
    if (*end || v < (c == 'g' ? 0 : 1) || v > (1 << 20))
      return fprintf(stderr, "zb_bench_gpu: bad number '%s' for --%s\n", optarg, lo[li].name), 2;
    int *f[] = {&o->gpu,        &o->hidden,    &o->heads,   &o->seq,          &o->batch,
                &o->vocab,      &o->reps,      &o->layers,  &o->nccl_max_mib, &o->attn_block,
                &o->mfu_layers, &o->mfu_batch, &o->mfu_seq, &o->mfu_heads};
    *f[strchr(fields, c) - fields] = (int)v;
  }
  if (optind < argc || o->hidden % o->heads)
    return fprintf(stderr, "zb_bench_gpu: %s\n",
                   optind < argc ? "unexpected argument" : "--heads must divide --hidden"),
           2;
  return check_sections(o);
}

/* A CUDA device on GPU o->gpu: 0, or ZB_ERR_UNSUPPORTED's message in why
 * when there is none; exits 1 on another failure. */
static zb_device *open_device(const gpu_opts *o, char *why, size_t len) {
  zb_device *dev = NULL;
  zb_diag diag = {{0}};
  zb_cuda_device_config cfg = {.ordinal = o->gpu, .precision = o->precision};
  zb_err err = zb_device_cuda_new(&cfg, &dev, &diag);
  if (err == ZB_ERR_UNSUPPORTED) {
    snprintf(why, len, "%s", diag.msg);
    return NULL;
  }
  if (err)
    gpu_die("zb_device_cuda_new", &diag);
  return dev;
}

int main(int argc, char **argv) {
  gpu_opts o = {.gpu = 0,
                .hidden = 1024,
                .heads = 16,
                .seq = 1024,
                .batch = 8,
                .vocab = 256,
                .layers = 2,
                .reps = 20,
                .nccl_max_mib = 256,
                .precision = ZB_PRECISION_FP32,
                .mfu_layers = 2,
                .mfu_batch = 4,
                .mfu_seq = 1024,
                .sections = "model,nccl,pipeline,mfu,flash,syncs"};
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  char why[256];
  zb_device *dev = open_device(&o, why, sizeof why);
  if (!dev) {
    printf("zb_bench_gpu: no CUDA device (%s); nothing to measure\n", why);
    return 0;
  }
  zb_device_info info;
  dev->ops->info(dev->self, &info);
  int n_gpus = gpu_count();
  printf("GPU %d of %d: %s, %.1f GiB, compute capability %d.%d, driver %d\n", o.gpu, n_gpus, info.name,
         (double)info.total_bytes / (1 << 30), info.cc_major, info.cc_minor, info.driver_version);
  if (info.standin)
    printf("stand-in: this is the CPU stand-in of CUDA, cuBLAS and NCCL (a test build); its timings mean "
           "nothing\n");
  printf("\n");
  gpu_block_times block = {1e-3, 1e-3, 1e-3}; /* the prediction's op times when section 1 does not run */
  if (gpu_section_on(&o, "model"))
    gpu_bench_model(dev, &o, &block);
  if (o.shapes)
    bench_gemms(dev, &o);
  zb_device_free(dev); /* the next sections make one device per rank */
  if (gpu_section_on(&o, "nccl"))
    gpu_bench_nccl(&o, n_gpus);
  if (gpu_section_on(&o, "pipeline"))
    gpu_bench_pipeline(&o, n_gpus, &block);
  dev = open_device(&o, why, sizeof why); /* sections 4-6 on GPU --gpu again, from a fresh allocator */
  if (!dev) {
    printf("zb_bench_gpu: GPU %d is gone (%s)\n", o.gpu, why);
    return 1;
  }
  if (gpu_section_on(&o, "mfu"))
    gpu_bench_mfu(dev, &o);
  if (gpu_section_on(&o, "flash"))
    gpu_bench_flash(dev, &o);
  if (gpu_section_on(&o, "syncs"))
    gpu_bench_syncs(dev, &o);
  zb_device_free(dev);
  return 0;
}
