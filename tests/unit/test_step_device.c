/* test_step_device.c — the optimizer step on the device (train/
 * zb_step_device.h) against the host step (train/zb_step.h's own target)
 * on the same parameters, moments and gradients, iteration after
 * iteration: no clipping, clipping, another rank's NaN, this rank's own
 * NaN and Inf (skipped: the device state unchanged bit for bit), a failed
 * reduction (the optimistic step rolled back bit for bit), in both modes
 * (post-validated and synchronous), over four stages of 1031, 37, 0 and 11
 * parameters with decay off on some ranges and non-zero moments to start.
 *
 * Devices: the host device (zb_device_host_new), and when the binary is
 * built with the CUDA device (ZB_WITH_CUDA) zb_device_cuda_new(0): the CPU
 * stand-in (test_step_device_standin) or a real GPU (test_step_device,
 * label gpu; exit 77 when there is none, after the host device's part).
 *
 * Rule: parameters, m and v within 1e-6 relative of the host step's (the
 * per-element math is the same; only the sum of squares is taken in
 * another order, which moves a clipped step's scale by double rounding);
 * flags equal; grad_norm within 1e-12 relative. The program prints the
 * largest differences and how many elements differ at all.
 *
 * Single-threaded; frees what it allocates (the device's allocator ends
 * where it started).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zb_device.h"
#include "zb_step.h"
#include "zb_step_device.h"
#include "zbtest.h"

enum { NS = 4, ITERS = 8 };
static const size_t SIZES[NS] = {1031, 37, 0, 11};
static const zb_adamw_config CFG = {
    .lr = 0.01, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};

/* What each iteration does. */
typedef struct plan {
  double clip;        /* clip_norm */
  double others;      /* the other ranks' sum of squares */
  bool others_finite; /* false: another rank saw a NaN */
  bool fail;          /* the reduction fails */
  int bad_stage;      /* >= 0: this rank's gradient [bad_stage][bad_index] is bad_value */
  size_t bad_index;
  float bad_value;
} plan;

static const plan PLANS[ITERS] = {
    {.clip = 0, .others = 0.5, .others_finite = true, .bad_stage = -1},
    {.clip = 0.1, .others = 0.5, .others_finite = true, .bad_stage = -1},
    {.clip = 1.0, .others = NAN, .others_finite = false, .bad_stage = -1},
    {.clip = 1.0, .others = 0.5, .others_finite = true, .bad_stage = 3, .bad_index = 2, .bad_value = NAN},
    {.clip = 0.1, .others = 0.5, .others_finite = true, .fail = true, .bad_stage = -1},
    {.clip = 1000, .others = 0.5, .others_finite = true, .bad_stage = -1},
    {.clip = 0.1,
     .others = 0.5,
     .others_finite = true,
     .bad_stage = 0,
     .bad_index = 500,
     .bad_value = INFINITY},
    {.clip = 0.05, .others = 2.0, .others_finite = true, .bad_stage = -1},
};

/* The worst differences of the device step from the host step. */
typedef struct worst {
  double p, m, v, norm;
  long differ; /* elements (p, m, v) not bit-identical */
  long compared;
} worst;

static zb_err reduce_local(void *arg, zb_step_partial *p, zb_diag *diag) {
  const plan *pl = arg;
  if (pl->fail)
    return zb_diag_set(diag, ZB_ERR_IO, "reduction failed (test)");
  p->sumsq = p->sumsq + pl->others;
  p->finite = p->finite && pl->others_finite;
  return ZB_OK;
}

static void grads_of(int k, float *g[NS]) {
  for (int s = 0; s < NS; s++)
    for (size_t i = 0; i < SIZES[s]; i++)
      g[s][i] = (float)((0.05 + 0.1 * s) * sin(0.37 * (double)i + 1.3 * k + s));
  if (k < ITERS && PLANS[k].bad_stage >= 0) /* k >= ITERS: the warm-up steps */
    g[PLANS[k].bad_stage][PLANS[k].bad_index] = PLANS[k].bad_value;
}

static void must(zb_err err, const zb_diag *d) {
  if (err) {
    fprintf(stderr, "unexpected error: %s\n", d->msg);
    zbt_failed_checks++;
  }
}

static void to_dev(zb_device *dev, void *dst, const void *src, size_t bytes) {
  zb_diag d = {{0}};
  if (bytes)
    must(dev->ops->copy(dev->self, dst, src, bytes, ZB_COPY_H2D, &d), &d);
  must(dev->ops->sync(dev->self, &d), &d);
}

static void from_dev(zb_device *dev, void *dst, const void *src, size_t bytes) {
  zb_diag d = {{0}};
  if (bytes)
    must(dev->ops->copy(dev->self, dst, src, bytes, ZB_COPY_D2H, &d), &d);
  must(dev->ops->sync(dev->self, &d), &d);
}

/* The two sides: the host step's arrays and optimizers, and the device
 * step's (device arrays; optimizers for the config, mask and staging). */
typedef struct sides {
  zb_device *dev;
  zb_adamw *ho[NS], *dopt[NS];
  float *hp[NS], *hg[NS];
  float *dp[NS], *dg[NS];
  float *snap[NS]; /* 3 n floats: the device state before an iteration */
  zb_step_device *target;
} sides;

static void sides_init(sides *s, zb_device *dev, bool rollback) {
  zb_diag d = {{0}};
  memset(s, 0, sizeof *s);
  s->dev = dev;
  for (int i = 0; i < NS; i++) {
    size_t n = SIZES[i], b = (n ? n : 1) * sizeof(float);
    must(zb_adamw_new(&CFG, n, &s->ho[i], &d), &d);
    must(zb_adamw_new(&CFG, n, &s->dopt[i], &d), &d);
    s->hp[i] = malloc(b);
    s->hg[i] = malloc(b);
    s->snap[i] = malloc(3 * b);
    must(dev->ops->alloc(dev->self, b, (void **)&s->dp[i], &d), &d);
    must(dev->ops->alloc(dev->self, b, (void **)&s->dg[i], &d), &d);
    for (size_t j = 0; j < n; j++)
      s->hp[i][j] = (float)sin(1.0 + (double)j * 0.91 + i);
  }
  /* decay off on some ranges (vectors), the same on both sides */
  zb_adamw_set_decay(s->ho[0], 1000, 31, false, &d);
  zb_adamw_set_decay(s->dopt[0], 1000, 31, false, &d);
  zb_adamw_set_decay(s->ho[3], 0, 5, false, &d);
  zb_adamw_set_decay(s->dopt[3], 0, 5, false, &d);
  /* two plain host steps: moments not zero, step count 2, and the device
   * side starts from that state (the target uploads it) */
  for (int k = 0; k < 2; k++) {
    grads_of(k + 20, s->hg);
    for (int i = 0; i < NS; i++)
      zb_adamw_step(s->ho[i], s->hp[i], s->hg[i]);
  }
  for (int i = 0; i < NS; i++) {
    int64_t t;
    const float *m, *v;
    zb_adamw_state(s->ho[i], &t, &m, &v);
    must(zb_adamw_set_state(s->dopt[i], t, m, v, SIZES[i], &d), &d);
    to_dev(dev, s->dp[i], s->hp[i], SIZES[i] * sizeof(float));
  }
  const float *dg[NS] = {s->dg[0], s->dg[1], s->dg[2], s->dg[3]};
  must(zb_step_device_new(dev, NS, s->dopt, s->dp, dg, rollback, &s->target, &d), &d);
}

static void sides_free(sides *s) {
  zb_step_device_free(s->target);
  for (int i = 0; i < NS; i++) {
    zb_adamw_free(s->ho[i]);
    zb_adamw_free(s->dopt[i]);
    free(s->hp[i]);
    free(s->hg[i]);
    free(s->snap[i]);
    s->dev->ops->free(s->dev->self, s->dp[i]);
    s->dev->ops->free(s->dev->self, s->dg[i]);
  }
}

/* The device state into snap (params, m, v per stage), via pull_state. */
static void device_state(sides *s, float *out[NS], int64_t steps[NS]) {
  zb_diag d = {{0}};
  must(zb_step_device_pull_state(s->target, &d), &d);
  for (int i = 0; i < NS; i++) {
    size_t n = SIZES[i];
    const float *m, *v;
    zb_adamw_state(s->dopt[i], &steps[i], &m, &v);
    from_dev(s->dev, out[i], s->dp[i], n * sizeof(float));
    memcpy(out[i] + n, m, n * sizeof(float));
    memcpy(out[i] + 2 * n, v, n * sizeof(float));
  }
}

static double rel(double got, double want) {
  if (got == want)
    return 0;
  return fabs(got - want) / fmax(fabs(want), 1e-30);
}

/* The device state against the host step's, into w. */
static void compare(sides *s, worst *w) {
  float *now[NS];
  int64_t steps[NS];
  for (int i = 0; i < NS; i++)
    now[i] = malloc(3 * (SIZES[i] ? SIZES[i] : 1) * sizeof(float));
  device_state(s, now, steps);
  for (int i = 0; i < NS; i++) {
    size_t n = SIZES[i];
    int64_t t;
    const float *m, *v;
    zb_adamw_state(s->ho[i], &t, &m, &v);
    CHECK_EQ(steps[i], t);
    const float *want[3] = {s->hp[i], m, v};
    double *slot[3] = {&w->p, &w->m, &w->v};
    for (int q = 0; q < 3; q++)
      for (size_t j = 0; j < n; j++) {
        float got = now[i][q * n + j];
        double r = rel(got, want[q][j]);
        *slot[q] = fmax(*slot[q], r);
        w->differ += memcmp(&got, &want[q][j], sizeof got) != 0;
        w->compared++;
      }
  }
  for (int i = 0; i < NS; i++)
    free(now[i]);
}

/* One iteration k on both sides. */
static void iterate(sides *s, int k, zb_step_mode mode, worst *w) {
  const plan *pl = &PLANS[k];
  zb_diag d = {{0}}, hd = {{0}};
  grads_of(k, s->hg);
  for (int i = 0; i < NS; i++)
    to_dev(s->dev, s->dg[i], s->hg[i], SIZES[i] * sizeof(float));
  int64_t before_steps[NS];
  device_state(s, s->snap, before_steps);

  zb_stepper *hs = NULL, *ds = NULL;
  must(zb_stepper_new(NS, s->ho, pl->clip, mode, &hs, &hd), &hd);
  zb_step_target t = zb_step_device_target(s->target);
  must(zb_stepper_new_target(&t, pl->clip, mode, &ds, &d), &d);
  zb_step_result hr, dr;
  zb_err herr = zb_stepper_step(hs, s->hp, (const float *const *)s->hg, reduce_local, (void *)pl, &hr, &hd);
  zb_err derr = zb_stepper_run(ds, reduce_local, (void *)pl, &dr, &d);
  zb_stepper_free(hs);
  zb_stepper_free(ds);
  CHECK_EQ(derr, herr);
  CHECK_EQ(derr, pl->fail ? ZB_ERR_IO : ZB_OK);
  if (!derr) {
    CHECK_EQ(dr.skipped, hr.skipped);
    CHECK_EQ(dr.clipped, hr.clipped);
    CHECK_EQ(dr.rolled_back, hr.rolled_back);
    if (!hr.skipped)
      w->norm = fmax(w->norm, rel(dr.grad_norm, hr.grad_norm));
    CHECK(dr.skipped == (k == 2 || k == 3 || k == 6));
    CHECK(dr.clipped == (k == 1 || k == 4 || k == 7));
  }
  compare(s, w);
  if (derr || dr.skipped) { /* nothing happened, to the bit */
    float *now[NS];
    int64_t steps[NS];
    for (int i = 0; i < NS; i++)
      now[i] = malloc(3 * (SIZES[i] ? SIZES[i] : 1) * sizeof(float));
    device_state(s, now, steps);
    for (int i = 0; i < NS; i++) {
      CHECK_EQ(steps[i], before_steps[i]);
      CHECK_MSG(memcmp(now[i], s->snap[i], 3 * SIZES[i] * sizeof(float)) == 0,
                "iteration %d: stage %d's state changed by a %s step", k, i, derr ? "failed" : "skipped");
      free(now[i]);
    }
  }
}

/* Every iteration in one mode on dev; prints and checks the worst. */
static void scenario(zb_device *dev, const char *name, zb_step_mode mode) {
  zb_device_mem m0, m1;
  dev->ops->mem(dev->self, &m0);
  sides s;
  sides_init(&s, dev, mode == ZB_STEP_POST_VALIDATED);
  worst w = {0};
  for (int k = 0; k < ITERS; k++)
    iterate(&s, k, mode, &w);
  sides_free(&s);
  printf("%-8s %-14s params %.3g  m %.3g  v %.3g  grad_norm %.3g  (max rel diff); %ld of %ld values "
         "not bit-identical\n",
         name, mode == ZB_STEP_POST_VALIDATED ? "post-validated" : "synchronous", w.p, w.m, w.v, w.norm,
         w.differ, w.compared);
  CHECK(w.compared > 0);
  CHECK_MSG(w.p <= 1e-6 && w.m <= 1e-6 && w.v <= 1e-6, "%s: device step differs by more than 1e-6", name);
  CHECK_MSG(w.norm <= 1e-12, "%s: grad_norm differs by %g", name, w.norm);
  dev->ops->mem(dev->self, &m1);
  CHECK_EQ(m1.current, m0.current);
}

static void both_modes(zb_device *dev, const char *name) {
  scenario(dev, name, ZB_STEP_POST_VALIDATED);
  scenario(dev, name, ZB_STEP_SYNCHRONOUS);
}

static void test_host_device(void) {
  zb_device *dev = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_device_host_new(&dev, &d), ZB_OK);
  both_modes(dev, "host");
  zb_device_free(dev);
}

/* Set when this binary has the CUDA device but no device is there. */
static bool no_cuda;

static void test_cuda_device(void) {
#ifdef ZB_WITH_CUDA
  zb_device *dev = NULL;
  zb_diag d = {{0}};
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  zb_err err = zb_device_cuda_new(&cfg, &dev, &d);
  if (err == ZB_ERR_UNSUPPORTED) {
    printf("no CUDA device (%s): the cuda part is skipped\n", d.msg);
    no_cuda = true;
    return;
  }
  CHECK_MSG(err == ZB_OK, "zb_device_cuda_new: %s", d.msg);
  zb_device_info info;
  dev->ops->info(dev->self, &info);
  both_modes(dev, info.standin ? "stand-in" : "cuda");
  zb_device_free(dev);
#else
  printf("built without the CUDA device: the host device only\n");
#endif
}

/* Each stepper steps its own kind of target; a target without rollback
 * buffers refuses a post-validated step. */
static void test_refusals(void) {
  zb_device *dev = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_device_host_new(&dev, &d), ZB_OK);
  sides s;
  sides_init(&s, dev, false);
  zb_stepper *st = NULL;
  zb_step_result r;
  plan pl = {.clip = 1, .others_finite = true, .bad_stage = -1};
  CHECK_EQ(zb_stepper_new(NS, s.ho, 1.0, ZB_STEP_SYNCHRONOUS, &st, &d), ZB_OK);
  CHECK_EQ(zb_stepper_run(st, reduce_local, &pl, &r, &d), ZB_ERR_INVALID_ARG);
  zb_stepper_free(st);
  zb_step_target t = zb_step_device_target(s.target);
  CHECK_EQ(zb_stepper_new_target(&t, -1.0, ZB_STEP_SYNCHRONOUS, &st, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_new_target(NULL, 1.0, ZB_STEP_SYNCHRONOUS, &st, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_new_target(&t, 1.0, ZB_STEP_POST_VALIDATED, &st, &d), ZB_OK);
  CHECK_EQ(zb_stepper_step(st, s.hp, (const float *const *)s.hg, reduce_local, &pl, &r, &d),
           ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_run(st, reduce_local, &pl, &r, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "rollback") != NULL);
  zb_stepper_free(st);
  zb_step_device *bad = NULL;
  CHECK_EQ(zb_step_device_new(NULL, 1, s.dopt, s.dp, NULL, false, &bad, &d), ZB_ERR_INVALID_ARG);
  sides_free(&s);
  zb_device_free(dev);
}

/* What post-validation keeps (the parameters: 4 bytes per parameter, not
 * the 12 of three full copies) measured by the device's allocator, and
 * the host syncs of a post-validated step that rolls back and redoes
 * (clipped): one, the partial's read-back. */
static void rollback_cost(zb_device *dev, const char *name) {
  zb_device_mem m0, m1, m2;
  dev->ops->mem(dev->self, &m0);
  sides s;
  sides_init(&s, dev, false);
  dev->ops->mem(dev->self, &m1);
  sides_free(&s);
  sides_init(&s, dev, true);
  dev->ops->mem(dev->self, &m2);
  size_t params = 0;
  for (int i = 0; i < NS; i++)
    params += SIZES[i];
  long long kept = (long long)(m2.current - m1.current);
  printf("%-8s rollback keeps %lld device bytes for %zu parameters (three full copies: %zu)\n", name, kept,
         params, 3 * params * sizeof(float));
  CHECK_EQ(kept, (long long)(params * sizeof(float)));
  CHECK_EQ(zb_step_device_rollback_bytes(s.target), params * sizeof(float));
  grads_of(1, s.hg);
  for (int i = 0; i < NS; i++)
    to_dev(dev, s.dg[i], s.hg[i], SIZES[i] * sizeof(float));
  zb_diag d = {{0}};
  zb_stepper *ds = NULL;
  zb_step_target t = zb_step_device_target(s.target);
  must(zb_stepper_new_target(&t, 0.1, ZB_STEP_POST_VALIDATED, &ds, &d), &d);
  zb_step_result r;
  int64_t before = dev->ops->host_syncs ? dev->ops->host_syncs(dev->self) : 0;
  must(zb_stepper_run(ds, reduce_local, (void *)&PLANS[1], &r, &d), &d);
  int64_t syncs = dev->ops->host_syncs ? dev->ops->host_syncs(dev->self) - before : 0;
  printf("%-8s a clipped post-validated step (rolled back, redone): %lld host syncs\n", name,
         (long long)syncs);
  CHECK(r.rolled_back && r.clipped);
  if (dev->ops->host_syncs)
    CHECK_EQ(syncs, 1);
  zb_stepper_free(ds);
  sides_free(&s);
  dev->ops->mem(dev->self, &m1);
  CHECK_EQ(m1.current, m0.current);
}

static void test_rollback_cost(void) {
  zb_device *dev = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_device_host_new(&dev, &d), ZB_OK);
  rollback_cost(dev, "host");
  zb_device_free(dev);
#ifdef ZB_WITH_CUDA
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  if (zb_device_cuda_new(&cfg, &dev, &d) == ZB_OK) {
    zb_device_info info;
    dev->ops->info(dev->self, &info);
    rollback_cost(dev, info.standin ? "stand-in" : "cuda");
    zb_device_free(dev);
  }
#endif
}

int zbt_failed_checks;

int main(int argc, char **argv) {
  static const zbt_case cases[] = {ZBT(test_host_device), ZBT(test_cuda_device), ZBT(test_refusals),
                                   ZBT(test_rollback_cost)};
  int rc = zbt_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
  return rc == 0 && no_cuda ? 77 : rc;
}
