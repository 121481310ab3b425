/* test_flash_cuda.c — flash attention on the CUDA device keeps no T x T
 * buffer (docs/model.md, Flash attention (CUDA)): a model stage's F and B
 * at a shape where one layer's probabilities (T^2 heads floats) dwarf
 * everything else, measured by the device's own allocator (its high-water
 * mark, zb_device_mem.peak, over what the stage held after creation):
 *   - with flash attention the rise stays below a single T x T x heads
 *     buffer, so none was allocated;
 *   - the unfused attention (attn_unfused) rises by at least that buffer
 *     and more than FACTOR times flash's rise;
 *   - both compute the same outputs and input gradients (within 1e-4 of
 *     their norms), so the saving is not from skipped work.
 * Runs on the real runtime (label gpu, exit 77 without a GPU) and on the
 * CPU stand-in (label standin), like test_device_ops.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "zb_device.h"
#include "zb_model.h"

#define FACTOR 4
enum { T = 1024, HEADS = 4, HIDDEN = 32 };

typedef struct run {
  int64_t rise; /* allocator peak during F and B, less what it held before */
  float *y, *dx;
} run;

static int fail(const char *what, const zb_diag *d) {
  fprintf(stderr, "test_flash_cuda: %s: %s\n", what, d->msg);
  return 1;
}

/* F then B of one microbatch on the middle of three stages. */
static int measure(zb_device *dev, int unfused, run *out) {
  zb_model_config c = {.hidden = HIDDEN,
                       .heads = HEADS,
                       .layers = 3,
                       .seq_len = T,
                       .batch = 1,
                       .seed = 3,
                       .device = dev,
                       .attn_unfused = unfused};
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(&c, 1, 3, &st, &d) != ZB_OK)
    return fail("zb_model_stage_new", &d);
  size_t n = zb_model_act_numel(st);
  float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
  out->y = malloc(n * sizeof(float));
  out->dx = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)sin(0.37 * (double)i);
    dy[i] = (float)cos(0.11 * (double)i) * 1e-2f;
  }
  zb_device_mem before, after;
  dev->ops->mem(dev->self, &before);
  dev->ops->reset_peak(dev->self);
  int rc = 0;
  if (zb_model_forward(st, 0, NULL, x, NULL, out->y, NULL, &d) != ZB_OK)
    rc = fail("F", &d);
  else if (zb_model_backward_b(st, 0, dy, out->dx, &d) != ZB_OK)
    rc = fail("B", &d);
  dev->ops->mem(dev->self, &after);
  out->rise = after.peak - before.current;
  free(x);
  free(dy);
  zb_model_stage_free(st);
  return rc;
}

static double rel(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

int main(void) {
  zb_diag d = {{0}};
  zb_device *dev = NULL;
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  zb_err err = zb_device_cuda_new(&cfg, &dev, &d);
  if (err == ZB_ERR_UNSUPPORTED) {
    printf("test_flash_cuda: no CUDA device (%s); skipping\n", d.msg);
    return 77;
  }
  if (err)
    return fail("zb_device_cuda_new", &d);
  run flash = {0}, unfused = {0};
  int rc = measure(dev, 0, &flash) || measure(dev, 1, &unfused);
  int64_t tt = (int64_t)T * T * HEADS * (int64_t)sizeof(float);
  size_t n = (size_t)T * HIDDEN;
  double ey = rc ? 0 : rel(flash.y, unfused.y, n), edx = rc ? 0 : rel(flash.dx, unfused.dx, n);
  printf("T %d, %d heads: one T x T x heads buffer %lld B; allocator's rise in F + B: flash %lld B, unfused "
         "%lld B (%.1fx); y off by %.2g, dx by %.2g\n",
         T, HEADS, (long long)tt, (long long)flash.rise, (long long)unfused.rise,
         flash.rise > 0 ? (double)unfused.rise / (double)flash.rise : 0.0, ey, edx);
  if (!rc && !(flash.rise > 0 && flash.rise < tt)) {
    printf("FAIL: flash attention's rise is not below one T x T x heads buffer\n");
    rc = 1;
  }
  if (!rc && !(unfused.rise >= tt && unfused.rise > FACTOR * flash.rise)) {
    printf("FAIL: the unfused attention's rise is not above a T x T buffer and %dx flash's\n", FACTOR);
    rc = 1;
  }
  if (!rc && !(ey <= 1e-4 && edx <= 1e-4)) {
    printf("FAIL: flash and unfused attention disagree\n");
    rc = 1;
  }
  free(flash.y), free(flash.dx), free(unfused.y), free(unfused.dx);
  zb_device_free(dev);
  printf("%s\n", rc ? "FAIL" : "ok");
  return rc;
}
