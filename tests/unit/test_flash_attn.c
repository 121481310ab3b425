/* Flash attention on the host device (zb_device.h's attn_fwd / attn_bwd;
 * docs/model.md, Flash attention (host)):
 *   - o, the log-sum-exp, dQ, dK and dV against a triple loop in double,
 *     each within FLASH_TOL of the tensor's norm, on odd shapes: T of 1,
 *     17, 70 and 130 (not a multiple of the 64-row tile, and below it),
 *     one head, head dimensions 80 and 128, grouped-query attention (4
 *     heads on 2 and on 1 key/value heads), batch > 1, padded row strides
 *     (whose padding the kernels leave alone);
 *   - bad shapes, NULL buffers and dqkv over qkv are refused, naming it;
 *   - a model stage on the host keeps O(T) attention state after F: at a
 *     fixed number of tokens (batch T), T = 256 holds exactly what
 *     T = 128 does, where the unfused attention grows by the probabilities'
 *     heads layers (256^2 - 2 128^2) floats.
 * The unfused attention against flash through the whole model (loss,
 * outputs, every gradient) is test_model_device's causal test. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_ref.h"
#include "zb_alloc.h"
#include "zb_device.h"
#include "zb_model.h"
#include "zbtest.h"

#define FLASH_TOL 2e-6
#define PAD_VALUE 12345.0f

/* Entries of rows from column `from` to ld still PAD_VALUE. */
static int pad_intact(const float *x, size_t rows, int ld, int from) {
  for (size_t r = 0; r < rows; r++)
    for (int c = from; c < ld; c++)
      if (x[r * ld + c] != PAD_VALUE)
        return 0;
  return 1;
}

static void check_shape(zb_device *dev, zb_attn a, int k) {
  int cols = (a.heads + 2 * a.kv_heads) * a.hd, lo = a.heads * a.hd;
  size_t rows = (size_t)a.batch * a.t;
  float *qkv = zb_malloc(rows * a.ld * sizeof(float)), *dqkv = zb_malloc(rows * a.ld * sizeof(float));
  float *o = zb_malloc(rows * a.lo * sizeof(float)), *dout = zb_malloc(rows * a.lo * sizeof(float));
  float *lse = zb_malloc(rows * a.heads * sizeof(float));
  for (size_t i = 0; i < rows * a.ld; i++) {
    qkv[i] = 2.0f * zbt_urand(100 + (uint64_t)k, i); /* scores of a few units: a peaked softmax */
    dqkv[i] = PAD_VALUE;
  }
  for (size_t i = 0; i < rows * a.lo; i++) {
    dout[i] = zbt_urand(200 + (uint64_t)k, i);
    o[i] = PAD_VALUE;
  }
  CHECK(dev->ops->attn_fwd(dev->self, qkv, o, lse, &a, NULL) == ZB_OK);
  CHECK(dev->ops->attn_bwd(dev->self, qkv, o, lse, dout, dqkv, &a, NULL) == ZB_OK);
  ref_attn ra = {a.batch, a.t, a.heads, a.kv_heads, a.hd, a.ld, a.lo, a.scale};
  ref_out r;
  ref_attn_run(qkv, dout, &ra, &r);
  CHECK(r.o && r.lse && r.dqkv);
  double e[5];
  ref_errors(o, lse, dqkv, &r, &ra, e);
  static const char *const names[5] = REF_NAMES;
  for (int i = 0; i < 5; i++)
    CHECK_MSG(e[i] <= FLASH_TOL, "shape %d (batch %d, t %d, heads %d on %d, hd %d): %s off by %.3g", k,
              a.batch, a.t, a.heads, a.kv_heads, a.hd, names[i], e[i]);
  CHECK_MSG(pad_intact(o, rows, a.lo, lo) && pad_intact(dqkv, rows, a.ld, cols),
            "shape %d: the kernels wrote into the rows' padding", k);
  printf("    batch %d t %3d heads %d/%d hd %3d: o %.1e lse %.1e dQ %.1e dK %.1e dV %.1e\n", a.batch, a.t,
         a.heads, a.kv_heads, a.hd, e[0], e[1], e[2], e[3], e[4]);
  ref_attn_free(&r);
  free(qkv);
  free(dqkv);
  free(o);
  free(dout);
  free(lse);
}

static void test_flash_matches_reference(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  CHECK(dev->ops->attn_fwd && dev->ops->attn_bwd);
  /* batch, t, heads, kv_heads, hd, row padding of qkv, of o */
  static const int shapes[][7] = {{1, 1, 1, 1, 8, 0, 0},    {2, 17, 1, 1, 16, 3, 1}, {1, 70, 4, 2, 80, 0, 0},
                                  {2, 70, 4, 1, 128, 5, 2}, {3, 17, 4, 2, 80, 0, 0}, {1, 130, 2, 2, 64, 1, 0},
                                  {2, 65, 3, 1, 12, 0, 4}};
  for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    const int *s = shapes[k];
    zb_attn a = {.batch = s[0], .t = s[1], .heads = s[2], .kv_heads = s[3], .hd = s[4]};
    a.ld = (a.heads + 2 * a.kv_heads) * a.hd + s[5];
    a.lo = a.heads * a.hd + s[6];
    a.scale = 1.0f / sqrtf((float)a.hd);
    check_shape(dev, a, k);
  }
  zb_device_free(dev);
}

static void test_flash_errors(void) {
  zb_device *dev = NULL;
  CHECK(zb_device_host_new(&dev, NULL) == ZB_OK);
  const zb_device_ops *op = dev->ops;
  float qkv[64] = {0}, o[64], lse[8], dout[64] = {0}, dqkv[64];
  zb_attn good = {.batch = 1, .t = 2, .heads = 2, .kv_heads = 1, .hd = 4, .ld = 16, .lo = 8, .scale = 0.5f};
  zb_diag d = {{0}};
  CHECK(op->attn_fwd(dev->self, qkv, o, lse, &good, &d) == ZB_OK);
  CHECK(op->attn_bwd(dev->self, qkv, o, lse, dout, dqkv, &good, &d) == ZB_OK);
  zb_attn bad[4] = {good, good, good, good};
  bad[0].kv_heads = 3; /* 2 heads do not split into groups of 3 */
  bad[1].ld = 15;      /* a row of q | k | v is 16 floats */
  bad[2].lo = 7;
  bad[3].t = 0;
  for (int i = 0; i < 4; i++) {
    CHECK(op->attn_fwd(dev->self, qkv, o, lse, &bad[i], &d) == ZB_ERR_INVALID_ARG);
    CHECK_MSG(strstr(d.msg, "attn_fwd: bad shape") != NULL, "case %d: %s", i, d.msg);
    CHECK(op->attn_bwd(dev->self, qkv, o, lse, dout, dqkv, &bad[i], &d) == ZB_ERR_INVALID_ARG);
    CHECK_MSG(strstr(d.msg, "attn_bwd: bad shape") != NULL, "case %d: %s", i, d.msg);
  }
  CHECK(op->attn_bwd(dev->self, qkv, o, lse, dout, qkv, &good, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "dqkv must not be qkv") != NULL, "%s", d.msg);
  CHECK(op->attn_fwd(dev->self, qkv, o, NULL, &good, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "attn_fwd with a NULL argument") != NULL, "%s", d.msg);
  CHECK(op->attn_bwd(dev->self, qkv, o, lse, NULL, dqkv, &good, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "attn_bwd with a NULL argument") != NULL, "%s", d.msg);
  CHECK(op->attn_fwd(dev->self, qkv, o, lse, NULL, &d) == ZB_ERR_INVALID_ARG);
  zb_device_free(dev);
}

/* State bytes of one microbatch after F on a middle stage (blocks only). */
static int64_t state_after_f(int t, int batch, int unfused) {
  zb_model_config c = {.hidden = 32, .heads = 4, .layers = 6, .seq_len = t, .batch = batch, .seed = 5};
  c.attn_unfused = unfused;
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(&c, 1, 3, &st, &d) != ZB_OK) {
    fprintf(stderr, "  stage: %s\n", d.msg);
    return -1;
  }
  size_t n = zb_model_act_numel(st);
  float *x = zb_malloc(n * sizeof(float)), *y = zb_malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    x[i] = zbt_urand(7, i);
  int64_t bytes = -1;
  if (zb_model_forward(st, 0, NULL, x, NULL, y, NULL, &d) == ZB_OK)
    bytes = zb_model_mb_bytes(st, 0);
  else
    fprintf(stderr, "  F: %s\n", d.msg);
  free(x);
  free(y);
  zb_model_stage_free(st);
  return bytes;
}

static void test_flash_state_linear(void) {
  int64_t f128 = state_after_f(128, 2, 0), f256 = state_after_f(256, 1, 0);
  int64_t u128 = state_after_f(128, 2, 1), u256 = state_after_f(256, 1, 1);
  printf(
      "    state after F, 256 tokens, 2 blocks: flash T 128 %lld B, T 256 %lld B; unfused %lld B, %lld B\n",
      (long long)f128, (long long)f256, (long long)u128, (long long)u256);
  CHECK(f128 > 0 && u128 > 0);
  CHECK_EQ(f256, f128);
  /* 2 blocks of 4 heads: the probabilities grow from 2 128^2 to 256^2 per head */
  CHECK_EQ(u256 - u128, (int64_t)2 * 4 * (256 * 256 - 2 * 128 * 128) * (int64_t)sizeof(float));
  CHECK(u128 > f128);
}

ZBT_MAIN(ZBT(test_flash_matches_reference), ZBT(test_flash_errors), ZBT(test_flash_state_linear))
