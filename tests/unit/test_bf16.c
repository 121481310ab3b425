/* test_bf16.c — bf16 storage (docs/model.md, Mixed precision) on the cuda
 * device over the CPU stand-in (test_bf16_standin):
 *   - rounding: zbm_bf16_from_f32 and the device's to_bf16 (the stand-in's
 *     twin of the GPU kernel) against hand-made cases: ties to even both
 *     ways, subnormals, overflow to Inf, Inf, NaN (canonical, never Inf),
 *     -0; and the widening is exact;
 *   - a bf16 product (zb_gemm's a16, b16): bf16 inputs, fp32 accumulation,
 *     equal to a double reference of the rounded inputs within fp32's
 *     summation error, and different from the fp32 product;
 *   - memory: a middle stage (blocks only) after F of K microbatches holds
 *     half the state bytes under bf16 (the model's figure) and the
 *     allocator's high-water mark rises by about half as much (one block's
 *     fp32 working copy on top: 1 / (K L) of the fp32 figure);
 *   - transfers: the _dev forms' activations are bf16, half the bytes;
 *   - training: 50 AdamW iterations of the test model under fp32 and bf16
 *     from the same weights and data; every bf16 loss within 2e-2 relative
 *     of fp32's (why: below).
 * Exit 77 (skip) where the device is absent. Single-threaded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_device.h"
#include "zb_model.h"
#include "zbtest.h"

/* fp32 runs use ZB_PRECISION_FP32: under BF16 the device rounds fp32
 * products' inputs too, which would make the baseline bf16-like. */
static zb_device *cuda_dev(zb_precision p) {
  zb_cuda_device_config c = {.ordinal = 0, .precision = p};
  zb_device *d = NULL;
  zb_diag diag = {{0}};
  if (zb_device_cuda_new(&c, &d, &diag) != ZB_OK) {
    printf("no cuda device: %s\n", diag.msg);
    exit(77);
  }
  return d;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* fp32 bits in, bf16 bits expected (round to nearest, ties to even). */
static const uint32_t CASE_IN[] = {
    0x3f800000u, /* 1.0: exact */
    0x3f808000u, /* 1 + 2^-8: a tie, lsb 0 -> down */
    0x3f818000u, /* a tie with lsb 1 -> up to 0x3f82 */
    0x3f808001u, /* just above the tie -> up */
    0x3f807fffu, /* just below -> down */
    0xbf818000u, /* negative tie, lsb 1 -> up in magnitude */
    0x00008000u, /* smallest subnormals: a tie at 0 -> 0 */
    0x00018000u, /* subnormal tie, lsb 1 -> 0x0002 */
    0x00010001u, /* subnormal just above 0x0001's value -> 0x0001 */
    0x007fffffu, /* largest subnormal rounds up to the smallest normal */
    0x7f7fffffu, /* FLT_MAX rounds to +Inf */
    0x7f7f7fffu, /* the largest bf16 stays */
    0x7f800000u, /* +Inf */
    0xff800000u, /* -Inf */
    0x7f800001u, /* a NaN whose top bits look like Inf: must stay NaN */
    0xffc00000u, /* -NaN */
    0x80000000u, /* -0 */
};
static const uint16_t CASE_OUT[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0x0000, 0x0002, 0x0001,
                                    0x0080, 0x7f80, 0x7f7f, 0x7f80, 0xff80, 0x7fff, 0x7fff, 0x8000};
enum { NCASE = sizeof CASE_IN / sizeof CASE_IN[0] };

static void test_rounding(void) {
  CHECK_EQ((int)(sizeof CASE_OUT / sizeof CASE_OUT[0]), NCASE);
  float in[NCASE];
  for (int i = 0; i < NCASE; i++) {
    in[i] = from_bits(CASE_IN[i]);
    CHECK_MSG(zbm_bf16_from_f32(in[i]) == CASE_OUT[i], "case %d: %08x -> %04x, want %04x", i,
              (unsigned)CASE_IN[i], (unsigned)zbm_bf16_from_f32(in[i]), (unsigned)CASE_OUT[i]);
  }
  /* the device's kernel (the stand-in's twin) rounds the same */
  zb_device *d = cuda_dev(ZB_PRECISION_FP32);
  const zb_device_ops *o = d->ops;
  zb_diag diag = {{0}};
  void *x = NULL, *y = NULL, *z = NULL;
  CHECK(o->alloc(d->self, sizeof in, &x, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, NCASE * sizeof(uint16_t), &y, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, sizeof in, &z, &diag) == ZB_OK);
  uint16_t got[NCASE];
  float back[NCASE];
  CHECK(o->copy(d->self, x, in, sizeof in, ZB_COPY_H2D, &diag) == ZB_OK);
  CHECK(o->to_bf16(d->self, x, y, NCASE, &diag) == ZB_OK);
  CHECK(o->from_bf16(d->self, y, z, NCASE, &diag) == ZB_OK);
  CHECK(o->copy(d->self, got, y, sizeof got, ZB_COPY_D2H, &diag) == ZB_OK);
  CHECK(o->copy(d->self, back, z, sizeof back, ZB_COPY_D2H, &diag) == ZB_OK);
  CHECK(o->sync(d->self, &diag) == ZB_OK);
  for (int i = 0; i < NCASE; i++) {
    CHECK_MSG(got[i] == CASE_OUT[i], "device case %d: %04x, want %04x", i, (unsigned)got[i],
              (unsigned)CASE_OUT[i]);
    CHECK_MSG(bits(back[i]) == (uint32_t)CASE_OUT[i] << 16, "widening case %d is not exact", i);
  }
  CHECK(isnan(back[14]) && isnan(back[15]));
  o->free(d->self, x);
  o->free(d->self, y);
  o->free(d->self, z);
  zb_device_free(d);
}

/* C = A B^T (row-major, A m x k, B n x k) with bf16 operands. */
static void test_bf16_gemm(void) {
  enum { M = 7, N = 5, K = 300 };
  float a[M * K], b[N * K], c[M * N];
  uint16_t a16[M * K], b16[N * K];
  for (int i = 0; i < M * K; i++)
    a16[i] = zbm_bf16_from_f32(a[i] = zbt_urand(1, (uint64_t)i));
  for (int i = 0; i < N * K; i++)
    b16[i] = zbm_bf16_from_f32(b[i] = zbt_urand(2, (uint64_t)i));
  zb_device *d = cuda_dev(ZB_PRECISION_FP32); /* bf16 operands are bf16 whatever the precision */
  const zb_device_ops *o = d->ops;
  zb_diag diag = {{0}};
  void *da = NULL, *db = NULL, *dc = NULL;
  CHECK(o->alloc(d->self, sizeof a16, &da, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, sizeof b16, &db, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, sizeof c, &dc, &diag) == ZB_OK);
  CHECK(o->copy(d->self, da, a16, sizeof a16, ZB_COPY_H2D, &diag) == ZB_OK);
  CHECK(o->copy(d->self, db, b16, sizeof b16, ZB_COPY_H2D, &diag) == ZB_OK);
  zb_gemm g = {.trans_b = true,
               .m = M,
               .n = N,
               .k = K,
               .alpha = 1,
               .lda = K,
               .ldb = K,
               .c = dc,
               .ldc = N,
               .batch = 1,
               .a16 = da,
               .b16 = db};
  CHECK(o->gemm(d->self, &g, &diag) == ZB_OK);
  CHECK(o->copy(d->self, c, dc, sizeof c, ZB_COPY_D2H, &diag) == ZB_OK);
  CHECK(o->sync(d->self, &diag) == ZB_OK);
  double worst = 0, moved = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double r16 = 0, r32 = 0, mag = 0;
      for (int p = 0; p < K; p++) {
        r16 += (double)zbm_f32_from_bf16(a16[i * K + p]) * zbm_f32_from_bf16(b16[j * K + p]);
        r32 += (double)a[i * K + p] * b[j * K + p];
        mag += fabs((double)a[i * K + p] * b[j * K + p]);
      }
      worst = fmax(worst, fabs(c[i * N + j] - r16) / mag);
      moved = fmax(moved, fabs(c[i * N + j] - r32) / mag);
    }
  printf("bf16 gemm: worst |C - ref(bf16 inputs)| / sum|ab| = %.2e; from the fp32 product %.2e\n", worst,
         moved);
  CHECK(worst < K * 6e-8); /* fp32 accumulation over K terms */
  CHECK(moved > 1e-4);     /* the inputs were rounded to bf16 (2^-9 relative each) */
  /* one bf16 operand alone is refused */
  g.b16 = NULL;
  g.b = dc;
  CHECK(o->gemm(d->self, &g, &diag) == ZB_ERR_INVALID_ARG);
  o->free(d->self, da);
  o->free(d->self, db);
  o->free(d->self, dc);
  zb_device_free(d);
}

/* ---- memory ---- */

enum { MEM_L = 4, MEM_K = 8 };

/* The middle stage of three (MEM_L blocks, no embedding, no head) after F
 * of MEM_K microbatches: the model's state bytes and the allocator's rise
 * over the stage's fixed memory. */
static void state_after_f(int bf16, int64_t *state, int64_t *alloc_rise) {
  zb_device *d = cuda_dev(bf16 ? ZB_PRECISION_BF16 : ZB_PRECISION_FP32);
  zb_model_config c = {.hidden = 64,
                       .heads = 4,
                       .layers = 3 * MEM_L,
                       .seq_len = 16,
                       .batch = 2,
                       .seed = 3,
                       .device = d,
                       .bf16 = bf16};
  zb_model_stage *st = NULL;
  zb_diag diag = {{0}};
  CHECK(zb_model_stage_new(&c, 1, 3, &st, &diag) == ZB_OK);
  if (!st) {
    zb_device_free(d);
    return;
  }
  size_t na = zb_model_act_numel(st);
  float *x = malloc(na * sizeof *x), *y = malloc(na * sizeof *y);
  for (size_t i = 0; i < na; i++)
    x[i] = zbt_urand(7, i);
  /* one F, B, W first: the products' bf16 scratch is workspace, allocated once */
  CHECK(zb_model_forward(st, 99, NULL, x, NULL, y, NULL, &diag) == ZB_OK);
  CHECK(zb_model_backward_bw(st, 99, x, y, &diag) == ZB_OK);
  zb_device_mem m0, m1;
  d->ops->mem(d->self, &m0);
  d->ops->reset_peak(d->self);
  for (int mb = 0; mb < MEM_K; mb++)
    CHECK(zb_model_forward(st, mb, NULL, x, NULL, y, NULL, &diag) == ZB_OK);
  d->ops->mem(d->self, &m1);
  zb_model_mem mm;
  zb_model_mem_stats(st, &mm);
  *state = mm.state_bytes;
  *alloc_rise = m1.peak - m0.current;
  zb_model_stage_free(st);
  free(x);
  free(y);
  zb_device_free(d);
}

static void test_memory_halves(void) {
  int64_t s32 = 0, s16 = 0, a32 = 0, a16 = 0;
  state_after_f(0, &s32, &a32);
  state_after_f(1, &s16, &a16);
  double rs = (double)s16 / (double)s32, ra = (double)a16 / (double)a32;
  printf("state after F of %d microbatches, %d blocks: fp32 %lld bytes, bf16 %lld (ratio %.4f); allocator's "
         "rise fp32 %lld, bf16 %lld (ratio %.4f)\n",
         MEM_K, MEM_L, (long long)s32, (long long)s16, rs, (long long)a32, (long long)a16, ra);
  /* half but for what stays fp32 on purpose: 1/rstd (one float per row per
   * norm, 2) and, with flash attention, the log-sum-exp (one per row per
   * head, 4), 6 of the ~910 floats a row keeps: 0.5 + 6 / (2 x 910) */
  CHECK_MSG(rs > 0.5 && rs < 0.5 + 6.0 / 900.0, "state ratio %.4f", rs);
  /* half, plus one block's fp32 working copy: 1 / (K L) of the fp32 rise */
  CHECK(ra > 0.5 && ra < 0.5 + 1.0 / (MEM_K * MEM_L) + 0.005);
}

/* ---- training ---- */

enum { ITERS = 50, MBS = 2 };

/* Tokens of microbatch mb: a noisy periodic text a model learns fast. */
static void batch_tokens(int it, int mb, int n, int32_t *tok, int32_t *tgt) {
  uint64_t key = (uint64_t)(it * MBS + mb);
  int off = (int)(zbt_mix64(key) % 13);
  for (int i = 0; i <= n; i++) {
    int v = (i + off) % 13 * 7 % 61;
    if (i < n)
      tok[i] = v;
    if (i > 0)
      tgt[i - 1] = v;
  }
}

static void train(int bf16, float *losses) {
  zb_device *d = cuda_dev(bf16 ? ZB_PRECISION_BF16 : ZB_PRECISION_FP32);
  zb_model_config c = {.hidden = 32,
                       .heads = 2,
                       .layers = 2,
                       .seq_len = 16,
                       .batch = 2,
                       .vocab = 64,
                       .seed = 5,
                       .loss_scale = 1.0f / MBS,
                       .device = d,
                       .bf16 = bf16};
  zb_model_stage *st = NULL;
  zb_diag diag = {{0}};
  CHECK(zb_model_stage_new(&c, 0, 1, &st, &diag) == ZB_OK);
  if (!st) {
    zb_device_free(d);
    return;
  }
  size_t np = zb_model_n_params(st);
  int n = c.seq_len * c.batch;
  int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok), *tgt = malloc((size_t)(n + 1) * sizeof *tgt);
  void *m = NULL, *v = NULL, *decay = NULL;
  const zb_device_ops *o = d->ops;
  CHECK(o->alloc(d->self, np * sizeof(float), &m, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, np * sizeof(float), &v, &diag) == ZB_OK);
  CHECK(o->alloc(d->self, np, &decay, &diag) == ZB_OK);
  CHECK(o->zero(d->self, m, np * sizeof(float), &diag) == ZB_OK);
  CHECK(o->zero(d->self, v, np * sizeof(float), &diag) == ZB_OK);
  CHECK(o->zero(d->self, decay, np, &diag) == ZB_OK);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95;
  for (int it = 0; it < ITERS; it++) {
    zb_model_zero_grads(st);
    float sum = 0;
    for (int mb = 0; mb < MBS; mb++) {
      float loss = 0;
      batch_tokens(it, mb, n, tok, tgt);
      CHECK(zb_model_forward(st, mb, tok, NULL, tgt, NULL, &loss, &diag) == ZB_OK);
      CHECK(zb_model_backward_bw(st, mb, NULL, NULL, &diag) == ZB_OK);
      sum += loss;
    }
    losses[it] = sum / MBS;
    zbm_adamw_step k = {.beta1 = b1,
                        .beta2 = b2,
                        .eps = 1e-8,
                        .grad_scale = 1.0,
                        .step_size = lr / (1 - pow(b1, it + 1)),
                        .sqrt_bc2 = sqrt(1 - pow(b2, it + 1)),
                        .shrink = 1.0};
    CHECK(o->adamw(d->self, zb_model_device_params(st), m, v, zb_model_device_grads(st), decay, np, &k,
                   &diag) == ZB_OK);
    CHECK(zb_model_refresh_compute(st, &diag) == ZB_OK);
  }
  o->free(d->self, m);
  o->free(d->self, v);
  o->free(d->self, decay);
  free(tok);
  free(tgt);
  zb_model_stage_free(st);
  zb_device_free(d);
}

/* The bound: bf16 keeps 8 significant bits (unit roundoff u = 2^-9 ~
 * 2e-3). Each product's inputs and each saved activation are rounded once,
 * so one step's loss moves by a few u; AdamW normalises the gradient, so
 * the weights' paths drift apart only by the same few u per step relative
 * to the step itself. 2e-2 (about 10 u) bounds that over 50 steps of a
 * model that learns, while a bug (a stale compute copy, a wrong unpack) moves
 * the loss by far more, and an fp32 run that silently ignored bf16 would
 * match to 1e-6 (checked too). */
static void test_training_bound(void) {
  float l32[ITERS], l16[ITERS];
  train(0, l32);
  train(1, l16);
  double worst = 0, any = 0;
  for (int i = 0; i < ITERS; i++) {
    double rel = fabs((double)l16[i] - l32[i]) / l32[i];
    worst = fmax(worst, rel);
    any = fmax(any, fabs((double)l16[i] - l32[i]));
  }
  printf("loss fp32 %.4f -> %.4f, bf16 %.4f -> %.4f; worst relative difference %.2e over %d iterations\n",
         l32[0], l32[ITERS - 1], l16[0], l16[ITERS - 1], worst, ITERS);
  CHECK(l32[ITERS - 1] < 0.7f * l32[0]); /* it learns: the bound is not vacuous */
  CHECK(any > 1e-6);                     /* bf16 storage is in effect */
  CHECK(worst < 2e-2);
}

/* What a rank sends under bf16: zb_model_act_bytes is half, and the _dev
 * form's y is exactly the host form's fp32 y rounded to bf16 (same ops,
 * then one rounding). */
static void test_dev_io(void) {
  zb_device *d = cuda_dev(ZB_PRECISION_BF16);
  zb_model_config c = {
      .hidden = 32, .heads = 2, .layers = 2, .seq_len = 8, .batch = 2, .seed = 9, .device = d, .bf16 = 1};
  zb_model_stage *st = NULL;
  zb_diag diag = {{0}};
  CHECK(zb_model_stage_new(&c, 0, 2, &st, &diag) == ZB_OK);
  if (!st) {
    zb_device_free(d);
    return;
  }
  size_t na = zb_model_act_numel(st);
  CHECK_EQ(zb_model_act_bytes(st), na * sizeof(uint16_t));
  int32_t tok[16];
  for (int i = 0; i < 16; i++)
    tok[i] = (i * 37) % 200;
  float *y = malloc(na * sizeof *y);
  uint16_t *y16 = malloc(na * sizeof *y16);
  void *dy = NULL;
  CHECK(d->ops->alloc(d->self, zb_model_act_bytes(st), &dy, &diag) == ZB_OK);
  CHECK(zb_model_forward(st, 0, tok, NULL, NULL, y, NULL, &diag) == ZB_OK);
  CHECK(zb_model_forward_dev(st, 1, tok, NULL, NULL, dy, NULL, &diag) == ZB_OK);
  CHECK(d->ops->copy(d->self, y16, dy, na * sizeof *y16, ZB_COPY_D2H, &diag) == ZB_OK);
  CHECK(d->ops->sync(d->self, &diag) == ZB_OK);
  size_t differ = 0;
  for (size_t i = 0; i < na; i++)
    differ += y16[i] != zbm_bf16_from_f32(y[i]);
  CHECK_MSG(differ == 0, "%zu of %zu bf16 outputs are not the fp32 output rounded", differ, na);
  d->ops->free(d->self, dy);
  free(y);
  free(y16);
  zb_model_stage_free(st);
  zb_device_free(d);
}

/* The host device has no bf16: a bf16 stage on it is refused by name. */
static void test_host_refused(void) {
  zb_model_config c = {.hidden = 32, .heads = 2, .layers = 1, .seq_len = 4, .batch = 1, .bf16 = 1};
  zb_model_stage *st = NULL;
  zb_diag diag = {{0}};
  CHECK(zb_model_stage_new(&c, 0, 1, &st, &diag) == ZB_ERR_UNSUPPORTED);
  CHECK(st == NULL);
  CHECK(strstr(diag.msg, "bf16") != NULL);
}

ZBT_MAIN(ZBT(test_rounding), ZBT(test_bf16_gemm), ZBT(test_memory_halves), ZBT(test_training_bound),
         ZBT(test_dev_io), ZBT(test_host_refused))
