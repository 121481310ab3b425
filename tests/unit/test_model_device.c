/* The model on its device (model/zb_device.h, docs/model.md, Devices):
 *   - the host device's allocator counts exactly the bytes asked for and
 *     keeps 64-byte alignment; its batched gemm and sumsq compute what a
 *     plain loop does;
 *   - a stage's device memory is its parameters, gradients, workspace and
 *     microbatch state to the byte, and all of it goes back when it is
 *     freed; zb_model_pull / zb_model_push_params are no-ops on the host
 *     device, whose mirror is the device memory;
 *   - the causal skip of attention (row blocks, only the unmasked products)
 *     and the host's flash attention (attn_cpu.c) give the loss, stage
 *     outputs, input gradients and every parameter gradient of the full
 *     T x T products (attn_full) within 1e-5 relative, over odd shapes,
 *     and the skip issues fewer FLOPs as counted;
 *   - losses kept on the device (F without a loss pointer) read back as
 *     the floats F returns.
 * Every comparison names what failed. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_device.h"
#include "zb_model.h"
#include "zbtest.h"

#define SKIP_TOL 1e-5

static void fill_tokens(int32_t *dst, size_t n, int vocab, uint64_t key) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (int32_t)(zbt_mix64(key * 1000003ULL + i) % (uint64_t)vocab);
}

static zb_model_stage *new_stage(const zb_model_config *c, int s, int n) {
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(c, s, n, &st, &d) != ZB_OK) {
    fprintf(stderr, "  zb_model_stage_new(%d of %d): %s\n", s, n, d.msg);
    return NULL;
  }
  return st;
}

/* ---- the host device -------------------------------------------------- */

static void test_host_accounting(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  const zb_device_ops *o = dev->ops;
  zb_device_info info;
  o->info(dev->self, &info);
  CHECK_STREQ(info.name, "host");
  CHECK(!info.standin && info.total_bytes == 0);
  static const size_t sizes[] = {1, 100, 64, 0, 4097, 3};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  void *p[NS];
  int64_t sum = 0;
  zb_device_mem m;
  for (int i = 0; i < NS; i++) {
    CHECK(o->alloc(dev->self, sizes[i], &p[i], NULL) == ZB_OK);
    CHECK_MSG(((uintptr_t)p[i] & 63) == 0, "block %d not 64-byte aligned", i);
    memset(p[i], 0xab, sizes[i]); /* all of it is usable (ASan checks) */
    sum += (int64_t)sizes[i];
    o->mem(dev->self, &m);
    CHECK_EQ(m.current, sum);
    CHECK_EQ(m.peak, sum);
  }
  o->free(dev->self, p[1]);
  o->free(dev->self, p[4]);
  o->mem(dev->self, &m);
  CHECK_EQ(m.current, sum - 100 - 4097);
  CHECK_EQ(m.peak, sum);
  CHECK_EQ(m.cached, 0);
  o->reset_peak(dev->self);
  o->mem(dev->self, &m);
  CHECK_EQ(m.peak, sum - 100 - 4097);
  for (int i = 0; i < NS; i++)
    if (i != 1 && i != 4)
      o->free(dev->self, p[i]);
  o->free(dev->self, NULL);
  o->mem(dev->self, &m);
  CHECK_EQ(m.current, 0);
  zb_device_event *e0, *e1;
  float ms = -1;
  CHECK(o->event_new(dev->self, &e0, NULL) == ZB_OK && o->event_new(dev->self, &e1, NULL) == ZB_OK);
  CHECK(o->event_elapsed_ms(dev->self, e0, e1, &ms, NULL) == ZB_ERR_INVALID_ARG); /* not recorded */
  CHECK(o->event_record(dev->self, e0, NULL) == ZB_OK && o->event_record(dev->self, e1, NULL) == ZB_OK);
  CHECK(o->event_elapsed_ms(dev->self, e0, e1, &ms, NULL) == ZB_OK && ms >= 0.0f);
  o->event_free(dev->self, e0);
  o->event_free(dev->self, e1);
  zb_device_free(dev);
}

/* A batched, transposed product against a plain loop; sumsq's flag. */
static void test_host_gemm_sumsq(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  enum { M = 5, N = 3, K = 7, BATCH = 3, LDA = 9, LDB = 4, LDC = 6 };
  float a[BATCH * K * LDA], b[BATCH * K * LDB], c[BATCH * M * LDC];
  for (size_t i = 0; i < sizeof a / sizeof *a; i++)
    a[i] = zbt_urand(1, i);
  for (size_t i = 0; i < sizeof b / sizeof *b; i++)
    b[i] = zbt_urand(2, i);
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    c[i] = zbt_urand(3, i);
  float c0[sizeof c / sizeof *c];
  memcpy(c0, c, sizeof c);
  /* A stored K x M (trans_a), B stored K x N. */
  zb_gemm g = {.trans_a = true,
               .m = M,
               .n = N,
               .k = K,
               .alpha = 0.5f,
               .beta = 2.0f,
               .a = a,
               .lda = LDA,
               .stride_a = K * LDA,
               .b = b,
               .ldb = LDB,
               .stride_b = K * LDB,
               .c = c,
               .ldc = LDC,
               .stride_c = M * LDC,
               .batch = BATCH};
  CHECK(dev->ops->gemm(dev->self, &g, NULL) == ZB_OK);
  double worst = 0;
  for (int z = 0; z < BATCH; z++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0;
        for (int k = 0; k < K; k++)
          s += (double)a[z * K * LDA + k * LDA + i] * b[z * K * LDB + k * LDB + j];
        double want = 0.5 * s + 2.0 * c0[z * M * LDC + i * LDC + j];
        double err = fabs(want - c[z * M * LDC + i * LDC + j]);
        worst = err > worst ? err : worst;
      }
  CHECK_MSG(worst < 1e-5, "batched gemm off by %g", worst);
  double ss = -1;
  int bad = -1;
  CHECK(dev->ops->sumsq(dev->self, a, 19, &ss, &bad, NULL) == ZB_OK);
  double want = 0;
  for (int i = 0; i < 19; i++)
    want += (double)a[i] * a[i];
  CHECK_NEAR(ss, want, 1e-12 * want);
  CHECK_EQ(bad, 0);
  a[11] = NAN;
  CHECK(dev->ops->sumsq(dev->self, a, 19, &ss, &bad, NULL) == ZB_OK);
  CHECK_EQ(bad, 1);
  a[11] = INFINITY;
  CHECK(dev->ops->sumsq(dev->self, a, 19, &ss, &bad, NULL) == ZB_OK);
  CHECK_EQ(bad, 1);
  zb_device_free(dev);
}

/* A stage on a caller's host device: the device holds exactly the stage's
 * parameters, gradients, workspace and microbatch state (and cache). */
static void test_stage_device_memory(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  zb_model_config c = {
      .hidden = 12, .heads = 3, .layers = 2, .seq_len = 7, .batch = 2, .seed = 5, .device = dev};
  zb_model_stage *st = new_stage(&c, 0, 1);
  CHECK(st && zb_model_device(st) == dev);
  if (!st)
    return;
  zb_device_mem dm;
  zb_model_mem mm;
  dev->ops->mem(dev->self, &dm);
  zb_model_mem_stats(st, &mm);
  CHECK_EQ(dm.current, mm.param_bytes + mm.workspace_bytes);
  int32_t tok[14], tgt[14];
  fill_tokens(tok, 14, 256, 1);
  fill_tokens(tgt, 14, 256, 2);
  float loss = 0;
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
  CHECK(zb_model_forward(st, 1, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
  dev->ops->mem(dev->self, &dm);
  zb_model_mem_stats(st, &mm);
  CHECK(mm.state_bytes > 0);
  CHECK_EQ(dm.current, mm.param_bytes + mm.workspace_bytes + mm.state_bytes + mm.cached_bytes);
  CHECK(zb_model_backward_bw(st, 0, NULL, NULL, NULL) == ZB_OK);
  dev->ops->mem(dev->self, &dm);
  zb_model_mem_stats(st, &mm);
  CHECK(mm.cached_bytes > 0);
  CHECK_EQ(dm.current, mm.param_bytes + mm.workspace_bytes + mm.state_bytes + mm.cached_bytes);
  zb_model_release_cache(st);
  dev->ops->mem(dev->self, &dm);
  zb_model_mem_stats(st, &mm);
  CHECK_EQ(mm.cached_bytes, 0);
  CHECK_EQ(dm.current, mm.param_bytes + mm.workspace_bytes + mm.state_bytes);
  zb_model_stage_free(st);
  dev->ops->mem(dev->self, &dm);
  CHECK_EQ(dm.current, 0);
  zb_device_free(dev);
}

/* On the host device the mirror is the device memory: pull and push are
 * no-ops that succeed, a parameter written through the mirror is what F
 * computes with, and get/set/zero_grads act on it directly. */
static void test_pull_push_host(void) {
  zb_model_config c = {.hidden = 8, .heads = 2, .layers = 1, .seq_len = 5, .batch = 1, .seed = 9};
  zb_model_stage *st = new_stage(&c, 0, 1);
  CHECK(st != NULL);
  if (!st)
    return;
  zb_device *dev = zb_model_device(st);
  CHECK(dev != NULL);
  zb_device_info info;
  dev->ops->info(dev->self, &info);
  CHECK_STREQ(info.name, "host");
  size_t n = zb_model_n_params(st);
  CHECK(zb_model_tensor_at(st, 0)->param == zb_model_params(st));
  CHECK(zb_model_tensor_at(st, 0)->grad == zb_model_grads(st));
  int32_t tok[5], tgt[5];
  fill_tokens(tok, 5, 256, 3);
  fill_tokens(tgt, 5, 256, 4);
  float l0 = 0, l1 = 0;
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &l0, NULL) == ZB_OK);
  CHECK(zb_model_backward_bw(st, 0, NULL, NULL, NULL) == ZB_OK);
  float *saved = zb_malloc(n * sizeof(float));
  memcpy(saved, zb_model_grads(st), n * sizeof(float));
  CHECK(zb_model_pull(st, NULL) == ZB_OK);
  CHECK(memcmp(saved, zb_model_grads(st), n * sizeof(float)) == 0);
  const zb_model_tensor *head = zb_model_find_tensor(st, "head.weight");
  CHECK(head != NULL);
  for (size_t i = 0; head && i < head->numel; i++)
    head->param[i] *= 3.0f;
  CHECK(zb_model_push_params(st, NULL) == ZB_OK);
  CHECK(zb_model_forward(st, 1, tok, NULL, tgt, NULL, &l1, NULL) == ZB_OK);
  CHECK_MSG(l1 != l0, "a parameter written through the mirror did not reach F (%g)", l0);
  CHECK(zb_model_get_params(st, saved, n) == ZB_OK);
  CHECK(memcmp(saved, zb_model_params(st), n * sizeof(float)) == 0);
  zb_model_zero_grads(st);
  int nonzero = 0;
  for (size_t i = 0; i < n; i++)
    nonzero += zb_model_grads(st)[i] != 0.0f;
  CHECK_EQ(nonzero, 0);
  free(saved);
  zb_model_stage_free(st);
}

/* ---- the causal skip against the full products ------------------------ */

/* max |a - b| / max |b|, and the index of the worst element. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]), m = fabs((double)b[i]);
    num = d > num ? d : num;
    den = m > den ? m : den;
  }
  return num / den;
}

typedef struct run_out {
  float loss;
  float *y, *dx;   /* stage 0's output, stage 1's input gradient */
  float *grads[2]; /* per stage */
  size_t n_params[2];
} run_out;

/* Two stages, two microbatches, F / B / W split; gradients accumulate. */
static int run_two_stages(const zb_model_config *c, run_out *r) {
  zb_model_stage *s0 = new_stage(c, 0, 2), *s1 = new_stage(c, 1, 2);
  if (!s0 || !s1)
    return 0;
  size_t na = zb_model_act_numel(s0), nt = (size_t)c->batch * c->seq_len;
  int32_t *tok = zb_malloc(nt * sizeof *tok), *tgt = zb_malloc(nt * sizeof *tgt);
  r->y = zb_malloc(na * sizeof(float));
  r->dx = zb_malloc(na * sizeof(float));
  int ok = 1;
  r->loss = 0;
  for (int mb = 0; mb < 2 && ok; mb++) {
    float loss = 0;
    fill_tokens(tok, nt, 256, 10 + mb);
    fill_tokens(tgt, nt, 256, 20 + mb);
    ok = zb_model_forward(s0, mb, tok, NULL, NULL, r->y, NULL, NULL) == ZB_OK &&
         zb_model_forward(s1, mb, NULL, r->y, tgt, NULL, &loss, NULL) == ZB_OK &&
         zb_model_backward_b(s1, mb, NULL, r->dx, NULL) == ZB_OK &&
         zb_model_backward_b(s0, mb, r->dx, NULL, NULL) == ZB_OK &&
         zb_model_backward_w(s1, mb, NULL) == ZB_OK && zb_model_backward_w(s0, mb, NULL) == ZB_OK;
    r->loss += loss;
  }
  zb_model_stage *ss[2] = {s0, s1};
  for (int s = 0; s < 2; s++) {
    r->n_params[s] = zb_model_n_params(ss[s]);
    r->grads[s] = zb_malloc(r->n_params[s] * sizeof(float) + 1);
    memcpy(r->grads[s], zb_model_grads(ss[s]), r->n_params[s] * sizeof(float));
  }
  free(tok);
  free(tgt);
  zb_model_stage_free(s0);
  zb_model_stage_free(s1);
  return ok;
}

static void run_free(run_out *r) {
  free(r->y);
  free(r->dx);
  free(r->grads[0]);
  free(r->grads[1]);
}

static void test_causal_skip_matches_full(void) {
  /* T not a multiple of the block (and T below it), heads > 1, batch > 1,
   * one and three blocks per stage. */
  static const zb_model_config shapes[] = {
      {.hidden = 24, .heads = 3, .layers = 2, .seq_len = 37, .batch = 2, .seed = 11},
      {.hidden = 16, .heads = 2, .layers = 6, .seq_len = 70, .batch = 3, .seed = 12},
      {.hidden = 12, .heads = 4, .layers = 2, .seq_len = 5, .batch = 2, .seed = 13},
      {.hidden = 8, .heads = 1, .layers = 2, .seq_len = 65, .batch = 1, .seed = 14},
  };
  for (size_t i = 0; i < 2 * sizeof shapes / sizeof shapes[0]; i++) {
    size_t k = i / 2;
    zb_model_config full = shapes[k], skip = shapes[k];
    full.attn_full = 1;
    skip.attn_unfused = i % 2; /* odd: the skip, even: flash attention */
    const char *mode = i % 2 ? "skip" : "flash";
    run_out a = {0}, b = {0};
    int ok = run_two_stages(&skip, &a) && run_two_stages(&full, &b);
    CHECK_MSG(ok, "shape %zu (%s): ops failed", k, mode);
    if (ok) {
      size_t na = (size_t)full.batch * full.seq_len * full.hidden;
      CHECK_MSG(fabs(a.loss - b.loss) <= SKIP_TOL * fabs(b.loss), "shape %zu (%s): loss %.9g vs %.9g", k,
                mode, a.loss, b.loss);
      double ry = rel_diff(a.y, b.y, na), rdx = rel_diff(a.dx, b.dx, na);
      CHECK_MSG(ry <= SKIP_TOL, "shape %zu (%s): stage output differs by %g", k, mode, ry);
      CHECK_MSG(rdx <= SKIP_TOL, "shape %zu (%s): dx differs by %g", k, mode, rdx);
      for (int s = 0; s < 2; s++) {
        double rg = rel_diff(a.grads[s], b.grads[s], a.n_params[s]);
        CHECK_MSG(rg <= SKIP_TOL, "shape %zu (%s) stage %d: gradients differ by %g", k, mode, s, rg);
      }
    }
    run_free(&a);
    run_free(&b);
  }
}

/* F's traced FLOPs with the skip: per sequence and head, the two products
 * cover row blocks of 32 against keys up to the block's end; batched
 * products count heads times. */
static void test_causal_trace(void) {
  zb_model_config c = {.hidden = 16, .heads = 4, .layers = 1, .seq_len = 40, .batch = 3, .seed = 3};
  double N = 120, h = 16, d = 4, attn = 3 * 4 * (32.0 * 32 + 8.0 * 40) * d;
  for (int full = 0; full < 2; full++) {
    c.attn_full = full;
    c.attn_unfused = 1; /* flash attention issues no gemm of the device */
    zb_model_stage *st = new_stage(&c, 0, 1);
    if (!st)
      return;
    int32_t tok[120], tgt[120];
    fill_tokens(tok, 120, 256, 1);
    fill_tokens(tgt, 120, 256, 2);
    zb_model_gemm g[256];
    float loss;
    zb_model_trace_gemms(st, g, 256);
    CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
    int n = zb_model_trace_gemms(st, NULL, 0);
    CHECK(n > 0 && n <= 256);
    double flops = 0;
    int calls = 0;
    for (int i = 0; i < n && i < 256; i++) {
      flops += 2.0 * g[i].m * g[i].n * g[i].k * g[i].count;
      calls += g[i].count;
    }
    double a = full ? 3 * 4 * 40.0 * 40 * d : attn;
    CHECK_NEAR(flops, 2 * (N * 12 * h * h + 2 * a) + 2 * N * h * 256, 0.5);
    /* 4 linear products + per sequence (3) per head (4) 2 (full) or 4 (two blocks) */
    CHECK_EQ(calls, 5 + 3 * 4 * (full ? 2 : 4));
    zb_model_stage_free(st);
  }
}

/* F without a loss pointer keeps the loss on the device: zb_model_losses
 * then gives, for every microbatch, the very float F returns with one, the
 * kept rows count as workspace, and asking past the filled slots or on a
 * stage without the head is refused by name. */
static void test_deferred_losses(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  zb_model_config c = {
      .hidden = 8, .heads = 2, .layers = 2, .seq_len = 5, .batch = 2, .seed = 3, .device = dev};
  zb_model_stage *now = new_stage(&c, 1, 2), *later = new_stage(&c, 1, 2), *first = new_stage(&c, 0, 2);
  CHECK(now && later && first);
  if (!now || !later || !first)
    return;
  enum { M = 9 }; /* past the first capacity, so the slots grow once */
  int32_t tgt[10];
  float x[10 * 8], want[M], got[M];
  zb_diag d = {{0}};
  for (int mb = 0; mb < M; mb++) {
    fill_tokens(tgt, 10, 256, 40 + (uint64_t)mb);
    for (int i = 0; i < 80; i++)
      x[i] = (float)((zbt_mix64((uint64_t)(mb * 80 + i)) % 2001) - 1000) * 1e-3f;
    CHECK(zb_model_forward(now, mb, NULL, x, tgt, NULL, &want[mb], NULL) == ZB_OK);
    CHECK(zb_model_forward(later, mb, NULL, x, tgt, NULL, NULL, NULL) == ZB_OK);
  }
  CHECK(zb_model_losses(later, M, got, &d) == ZB_OK);
  for (int mb = 0; mb < M; mb++)
    CHECK_MSG(got[mb] == want[mb], "mb %d: kept %.9g, returned %.9g", mb, got[mb], want[mb]);
  zb_model_mem mn, ml;
  zb_model_mem_stats(now, &mn);
  zb_model_mem_stats(later, &ml);
  CHECK(ml.workspace_bytes >= mn.workspace_bytes + (int64_t)(M * 10 * sizeof(double)));
  CHECK(zb_model_losses(later, 64, got, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "64 microbatches") != NULL);
  CHECK(zb_model_losses(first, 1, got, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "last stage") != NULL);
  zb_model_stage_free(now);
  zb_model_stage_free(later);
  zb_model_stage_free(first);
  zb_device_mem dm;
  dev->ops->mem(dev->self, &dm);
  CHECK_EQ(dm.current, 0);
  zb_device_free(dev);
}

ZBT_MAIN(ZBT(test_host_accounting), ZBT(test_host_gemm_sumsq), ZBT(test_stage_device_memory),
         ZBT(test_pull_push_host), ZBT(test_causal_skip_matches_full), ZBT(test_causal_trace),
         ZBT(test_deferred_losses))
