/* AdamW (train/zb_optimizer.h) against steps worked out by hand from the
 * formula (decoupled decay first, then the bias-corrected moments), plus
 * the properties a trainer leans on: the first step moves every parameter
 * by lr whatever its gradient's scale, the decay mask, a state restored
 * from zb_adamw_state continuing exactly, and the refusals.
 * Tolerance: 1e-6 absolute on values near 1 (a few fp32 ulps: parameters
 * and moments are stored in fp32). */
#include <stdint.h>

#include "zb_optimizer.h"
#include "zbtest.h"

#define TOL 1e-6

static const zb_adamw_config cfg = {.lr = 0.1, .weight_decay = 0.5, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};

/* Two steps on three parameters, the last without decay:
 *   lr 0.1, weight_decay 0.5 (shrink 1 - 0.05 = 0.95), beta1 0.9, beta2 0.99, eps 1e-8.
 * Step 1, g = (0.1, -0.2, 0):
 *   m = 0.1 g = (0.01, -0.02, 0); v = 0.01 g^2 = (1e-4, 4e-4, 0)
 *   bias corrections 1 - 0.9 = 0.1 and 1 - 0.99 = 0.01: m^ = (0.1, -0.2, 0), sqrt(v^) = (0.1, 0.2, 0)
 *   p0 = 1 * 0.95 - 0.1 * 0.1 / (0.1 + 1e-8) = 0.95 - 0.09999999 = 0.85000001
 *   p1 = -2 * 0.95 + 0.1 * 0.2 / (0.2 + 1e-8) = -1.9 + 0.099999995 = -1.800000005
 *   p2 = 0.5 (no decay; m = 0 moves nothing)
 * Step 2, g = (0.3, 0, 0.4); bias corrections 1 - 0.81 = 0.19, 1 - 0.9801 = 0.0199:
 *   p0: m = 0.009 + 0.03 = 0.039, v = 9.9e-5 + 9e-4 = 9.99e-4;
 *       m^ = 0.205263158, sqrt(v^) = sqrt(0.050201005) = 0.224055809
 *       0.85000001 * 0.95 - 0.1 * 0.205263158 / 0.224055819 = 0.807500010 - 0.091612510 = 0.715887500
 *   p1: m = -0.018, v = 3.96e-4; m^ = -0.094736842, sqrt(v^) = 0.141065177
 *       -1.800000005 * 0.95 + 0.1 * 0.094736842 / 0.141065187 = -1.710000005 + 0.067157410 = -1.642842595
 *       (to 1e-6: -1.6428420)
 *   p2: m = 0.04, v = 1.6e-3; m^ = 0.210526316, sqrt(v^) = 0.283552167
 *       0.5 - 0.1 * 0.210526316 / 0.283552177 = 0.5 - 0.074245976 = 0.425754024 */
static void test_hand_computed_steps(void) {
  zb_adamw *o = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, 3, &o, &d), ZB_OK);
  CHECK_EQ(zb_adamw_set_decay(o, 2, 1, false, &d), ZB_OK);
  float p[3] = {1.0f, -2.0f, 0.5f};
  const float g1[3] = {0.1f, -0.2f, 0.0f}, g2[3] = {0.3f, 0.0f, 0.4f};
  zb_adamw_step(o, p, g1);
  CHECK_EQ(zb_adamw_steps(o), 1);
  CHECK_NEAR(p[0], 0.85000001, TOL);
  CHECK_NEAR(p[1], -1.800000005, TOL);
  CHECK_NEAR(p[2], 0.5, 0);
  zb_adamw_step(o, p, g2);
  CHECK_EQ(zb_adamw_steps(o), 2);
  CHECK_NEAR(p[0], 0.7158875, TOL);
  CHECK_NEAR(p[1], -1.6428420, TOL);
  CHECK_NEAR(p[2], 0.4257540, TOL);
  int64_t steps;
  const float *m, *v;
  zb_adamw_state(o, &steps, &m, &v);
  CHECK_EQ(steps, 2);
  CHECK_NEAR(m[0], 0.039, 1e-8);
  CHECK_NEAR(m[1], -0.018, 1e-8);
  CHECK_NEAR(v[0], 9.99e-4, 1e-10);
  CHECK_NEAR(v[2], 1.6e-3, 1e-10);
  zb_adamw_free(o);
}

/* Adam's first step is lr * g / |g| (bias correction undoes the (1 - beta)
 * factors), so every parameter moves by lr for gradients of any scale. */
static void test_first_step_is_lr(void) {
  zb_adamw_config c = cfg;
  c.weight_decay = 0;
  c.eps = 1e-12;
  zb_adamw *o = NULL;
  CHECK_EQ(zb_adamw_new(&c, 4, &o, NULL), ZB_OK);
  float p[4] = {0, 0, 0, 0};
  const float g[4] = {1e-3f, -1.0f, 1e3f, -7.5f};
  zb_adamw_step(o, p, g);
  CHECK_NEAR(p[0], -0.1, TOL);
  CHECK_NEAR(p[1], 0.1, TOL);
  CHECK_NEAR(p[2], -0.1, TOL);
  CHECK_NEAR(p[3], 0.1, TOL);
  zb_adamw_free(o);
}

/* Decay alone (zero gradients): decayed parameters shrink by 1 - lr*wd per
 * step, the others stay; a range can be switched back on. */
static void test_decay_mask(void) {
  zb_adamw *o = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, 5, &o, &d), ZB_OK);
  CHECK_EQ(zb_adamw_set_decay(o, 1, 3, false, &d), ZB_OK);
  CHECK_EQ(zb_adamw_set_decay(o, 2, 1, true, &d), ZB_OK);
  float p[5] = {1, 1, 1, 1, 1};
  const float g[5] = {0, 0, 0, 0, 0};
  zb_adamw_step(o, p, g);
  zb_adamw_step(o, p, g);
  const float want[5] = {0.9025f, 1, 0.9025f, 1, 0.9025f};
  for (int i = 0; i < 5; i++)
    CHECK_NEAR(p[i], want[i], TOL);
  zb_adamw_free(o);
}

/* A second optimizer given the first's state after k steps continues
 * bit for bit as the first does. */
static void test_state_round_trip(void) {
  enum { N = 64, K = 3 };
  zb_adamw *a = NULL, *b = NULL;
  CHECK_EQ(zb_adamw_new(&cfg, N, &a, NULL), ZB_OK);
  CHECK_EQ(zb_adamw_new(&cfg, N, &b, NULL), ZB_OK);
  float pa[N], pb[N], g[N];
  for (int i = 0; i < N; i++)
    pa[i] = (float)(i % 7) * 0.1f - 0.3f;
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++)
      g[i] = (float)((i * 13 + k * 5) % 11) * 0.02f - 0.1f;
    zb_adamw_step(a, pa, g);
  }
  int64_t steps;
  const float *m, *v;
  zb_adamw_state(a, &steps, &m, &v);
  CHECK_EQ(zb_adamw_set_state(b, steps, m, v, N, NULL), ZB_OK);
  CHECK_EQ(zb_adamw_steps(b), K);
  for (int i = 0; i < N; i++) {
    pb[i] = pa[i];
    g[i] = (float)(i % 5) * 0.03f - 0.06f;
  }
  zb_adamw_step(a, pa, g);
  zb_adamw_step(b, pb, g);
  CHECK(memcmp(pa, pb, sizeof pa) == 0);
  zb_adamw_free(a);
  zb_adamw_free(b);
}

static bool refused(zb_adamw_config c, const char *want) {
  zb_adamw *o = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_adamw_new(&c, 1, &o, &d);
  zb_adamw_free(o);
  if (err != ZB_ERR_INVALID_ARG || !strstr(d.msg, want)) {
    fprintf(stderr, "    got %d: %s (want '%s')\n", err, d.msg, want);
    return false;
  }
  return true;
}

static void test_refusals(void) {
  zb_adamw_config c = cfg;
  c.lr = 0;
  CHECK(refused(c, "lr"));
  c = cfg;
  c.weight_decay = -1;
  CHECK(refused(c, "weight_decay"));
  c = cfg;
  c.beta1 = 1;
  CHECK(refused(c, "beta1"));
  c = cfg;
  c.beta2 = NAN;
  CHECK(refused(c, "beta2"));
  c = cfg;
  c.eps = 0;
  CHECK(refused(c, "eps"));

  zb_adamw *o = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, 4, &o, &d), ZB_OK);
  CHECK_EQ(zb_adamw_set_decay(o, 3, 2, false, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "3..5"), "message: %s", d.msg);
  CHECK_EQ(zb_adamw_set_decay(o, 5, 0, false, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_adamw_set_decay(o, 4, 0, false, &d), ZB_OK);
  float m[4] = {0}, v[4] = {0};
  CHECK_EQ(zb_adamw_set_state(o, 1, m, v, 3, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_adamw_set_state(o, -1, m, v, 4, &d), ZB_ERR_INVALID_ARG);
  zb_adamw_free(o);

  /* a stage without parameters steps nothing */
  CHECK_EQ(zb_adamw_new(&cfg, 0, &o, &d), ZB_OK);
  CHECK_EQ(zb_adamw_size(o), 0);
  zb_adamw_step(o, NULL, NULL);
  CHECK_EQ(zb_adamw_steps(o), 1);
  zb_adamw_free(o);
  zb_adamw_free(NULL);
  /* a model too large for the host: an error, not an abort (the worker
   * fails its job with it) */
  zb_adamw *huge = NULL;
  zb_diag hd = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, SIZE_MAX / 4, &huge, &hd), ZB_ERR_IO);
  CHECK(huge == NULL);
  CHECK_MSG(strstr(hd.msg, "out of memory") != NULL, "%s", hd.msg);
}

ZBT_MAIN(ZBT(test_hand_computed_steps), ZBT(test_first_step_is_lr), ZBT(test_decay_mask),
         ZBT(test_state_round_trip), ZBT(test_refusals))
