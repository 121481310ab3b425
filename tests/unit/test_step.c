/* The optimizer step with global clipping and the NaN/Inf check
 * (train/zb_step.h): post-validated and synchronous steps leave the same
 * parameters and moments, bit for bit, whether the step clips or not; a
 * failed check (a non-finite gradient elsewhere, or a failed reduction)
 * rolls the optimistic step back bit for bit. The "other ranks" are a
 * local reduce callback adding a fixed share, the way the chain would. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zb_step.h"
#include "zbtest.h"

static const zb_adamw_config cfg = {
    .lr = 0.01, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};

enum { N0 = 37, N1 = 11 };

/* Two stages as one rank would host them, with moments that are not zero
 * (two plain steps first), and an iteration's gradients. */
typedef struct rank_state {
  zb_adamw *opt[2];
  float p0[N0], p1[N1], g0[N0], g1[N1];
} rank_state;

static void rank_init(rank_state *r) {
  zb_diag d = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, N0, &r->opt[0], &d), ZB_OK);
  CHECK_EQ(zb_adamw_new(&cfg, N1, &r->opt[1], &d), ZB_OK);
  for (int i = 0; i < N0; i++)
    r->p0[i] = (float)sin(i + 1.0);
  for (int i = 0; i < N1; i++)
    r->p1[i] = (float)cos(i + 1.0);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < N0; i++)
      r->g0[i] = (float)(0.1 * sin(3.0 * i + k));
    for (int i = 0; i < N1; i++)
      r->g1[i] = (float)(0.2 * cos(5.0 * i + k));
    zb_adamw_step(r->opt[0], r->p0, r->g0);
    zb_adamw_step(r->opt[1], r->p1, r->g1);
  }
  for (int i = 0; i < N0; i++)
    r->g0[i] = (float)(0.3 * sin(7.0 * i + 0.5));
  for (int i = 0; i < N1; i++)
    r->g1[i] = (float)(0.4 * cos(11.0 * i + 0.5));
}

static void rank_free(rank_state *r) {
  zb_adamw_free(r->opt[0]);
  zb_adamw_free(r->opt[1]);
}

/* Parameters, moments and step counts compare bit for bit. */
static bool same_state(const rank_state *a, const rank_state *b) {
  if (memcmp(a->p0, b->p0, sizeof a->p0) || memcmp(a->p1, b->p1, sizeof a->p1))
    return false;
  for (int k = 0; k < 2; k++) {
    int64_t sa, sb;
    const float *ma, *va, *mb, *vb;
    zb_adamw_state(a->opt[k], &sa, &ma, &va);
    zb_adamw_state(b->opt[k], &sb, &mb, &vb);
    size_t n = zb_adamw_size(a->opt[k]) * sizeof(float);
    if (sa != sb || memcmp(ma, mb, n) || memcmp(va, vb, n))
      return false;
  }
  return true;
}

/* The other ranks' share, added after this rank's (rank 0 first). */
typedef struct others {
  double sumsq;
  bool finite;
  bool fail;
} others;

static zb_err reduce_local(void *arg, zb_step_partial *p, zb_diag *diag) {
  const others *o = arg;
  if (o->fail)
    return zb_diag_set(diag, ZB_ERR_IO, "reduction failed (test)");
  p->sumsq = p->sumsq + o->sumsq;
  p->finite = p->finite && o->finite;
  return ZB_OK;
}

static zb_err run_step(rank_state *r, zb_step_mode mode, double clip, others *o, zb_step_result *res) {
  zb_stepper *s = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_stepper_new(2, r->opt, clip, mode, &s, &d);
  if (err)
    return err;
  float *params[2] = {r->p0, r->p1};
  const float *grads[2] = {r->g0, r->g1};
  err = zb_stepper_step(s, params, grads, reduce_local, o, res, &d);
  zb_stepper_free(s);
  return err;
}

/* Both modes, the same case; returns the results of each. */
static void both_modes(double clip, others o, zb_step_result *pv, zb_step_result *sy) {
  rank_state a, b;
  rank_init(&a);
  rank_init(&b);
  CHECK(same_state(&a, &b));
  CHECK_EQ(run_step(&a, ZB_STEP_POST_VALIDATED, clip, &o, pv), ZB_OK);
  CHECK_EQ(run_step(&b, ZB_STEP_SYNCHRONOUS, clip, &o, sy), ZB_OK);
  CHECK_MSG(same_state(&a, &b), "post-validated and synchronous differ (clip %g)", clip);
  CHECK(memcmp(pv, sy, offsetof(zb_step_result, rolled_back)) == 0);
  rank_free(&a);
  rank_free(&b);
}

static void test_no_clip_same(void) {
  zb_step_result pv, sy;
  both_modes(1000.0, (others){.sumsq = 2.0, .finite = true}, &pv, &sy);
  CHECK(!pv.clipped && !pv.skipped && !pv.rolled_back);
  CHECK_EQ(pv.coef, 1.0);
  CHECK(pv.grad_norm > sqrt(2.0));
  /* clip_norm 0: no clipping whatever the norm */
  both_modes(0.0, (others){.sumsq = 1e6, .finite = true}, &pv, &sy);
  CHECK(!pv.clipped && !pv.rolled_back);
}

static void test_clip_same(void) {
  zb_step_result pv, sy;
  both_modes(0.5, (others){.sumsq = 2.0, .finite = true}, &pv, &sy);
  CHECK(pv.clipped && !pv.skipped && pv.rolled_back && !sy.rolled_back);
  CHECK_NEAR(pv.coef, 0.5 / pv.grad_norm, 0);
  CHECK(pv.coef < 1);

  /* and the clipped step is the plain step with scaled gradients */
  rank_state a, b;
  rank_init(&a);
  rank_init(&b);
  zb_step_result r;
  others o = {.sumsq = 2.0, .finite = true};
  CHECK_EQ(run_step(&a, ZB_STEP_POST_VALIDATED, 0.5, &o, &r), ZB_OK);
  double sumsq = 0;
  for (int i = 0; i < N0; i++)
    sumsq += (double)b.g0[i] * b.g0[i];
  for (int i = 0; i < N1; i++)
    sumsq += (double)b.g1[i] * b.g1[i];
  double coef = 0.5 / sqrt(sumsq + 2.0);
  zb_adamw_step_scaled(b.opt[0], b.p0, b.g0, coef);
  zb_adamw_step_scaled(b.opt[1], b.p1, b.g1, coef);
  CHECK(same_state(&a, &b));
  rank_free(&a);
  rank_free(&b);
}

static void test_nonfinite_rolls_back(void) {
  zb_step_result pv, sy;
  /* another rank saw a NaN: both modes leave everything as it was */
  both_modes(1.0, (others){.sumsq = NAN, .finite = false}, &pv, &sy);
  CHECK(pv.skipped && !pv.clipped && pv.rolled_back);
  CHECK(isnan(pv.grad_norm));

  rank_state a, before;
  rank_init(&a);
  rank_init(&before);
  others o = {.sumsq = 0, .finite = false};
  CHECK_EQ(run_step(&a, ZB_STEP_POST_VALIDATED, 1.0, &o, &pv), ZB_OK);
  CHECK(pv.skipped);
  CHECK_MSG(same_state(&a, &before), "rollback is not exact");

  /* this rank's own Inf, other ranks finite */
  a.g1[3] = INFINITY;
  o = (others){.sumsq = 1.0, .finite = true};
  CHECK_EQ(run_step(&a, ZB_STEP_POST_VALIDATED, 1.0, &o, &pv), ZB_OK);
  CHECK(pv.skipped);
  CHECK(same_state(&a, &before));

  /* a failed reduction rolls back too, and says why */
  a.g1[3] = 0;
  o = (others){.fail = true};
  CHECK_EQ(run_step(&a, ZB_STEP_POST_VALIDATED, 1.0, &o, &pv), ZB_ERR_IO);
  CHECK(same_state(&a, &before));
  rank_free(&a);
  rank_free(&before);
}

static void test_refusals(void) {
  zb_stepper *s = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_stepper_new(0, NULL, -1.0, ZB_STEP_SYNCHRONOUS, &s, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_new(0, NULL, NAN, ZB_STEP_SYNCHRONOUS, &s, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_new(0, NULL, 1.0, (zb_step_mode)7, &s, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_stepper_new(0, NULL, 1.0, ZB_STEP_POST_VALIDATED, &s, &d), ZB_OK);
  zb_stepper_free(s);
  zb_stepper_free(NULL);
}

/* zb_stepper_count_prefix: the norm counts only stage 1's first 4
 * gradients; what follows is stepped all the same, and a non-finite value
 * there is not seen by the check (its first holder's check sees it). */
static void test_count_prefix(void) {
  rank_state r;
  rank_init(&r);
  zb_stepper *s = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_stepper_new(2, r.opt, 0, ZB_STEP_SYNCHRONOUS, &s, &d), ZB_OK);
  const float *grads[2] = {r.g0, r.g1};
  double all = zb_step_local(s, grads).sumsq, head = 0;
  for (int i = 0; i < N0; i++)
    head += (double)r.g0[i] * r.g0[i];
  for (int i = 0; i < 4; i++)
    head += (double)r.g1[i] * r.g1[i];
  CHECK_EQ(zb_stepper_count_prefix(s, 1, 4, &d), ZB_OK);
  CHECK(zb_step_local(s, grads).sumsq == head && head < all);
  float before = r.p1[N1 - 1];
  float *params[2] = {r.p0, r.p1};
  others o = {.sumsq = 0, .finite = true};
  zb_step_result res;
  CHECK_EQ(zb_stepper_step(s, params, grads, reduce_local, &o, &res, &d), ZB_OK);
  CHECK(res.grad_norm == sqrt(head));
  CHECK(r.p1[N1 - 1] != before); /* still stepped */
  r.g1[N1 - 1] = NAN;
  CHECK(zb_step_local(s, grads).finite);
  CHECK_EQ(zb_stepper_count_prefix(s, 1, N1 + 1, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "stage 1 cannot count 12"));
  CHECK_EQ(zb_stepper_count_prefix(s, 2, 0, &d), ZB_ERR_INVALID_ARG);
  zb_stepper_free(s);
  rank_free(&r);
}

ZBT_MAIN(ZBT(test_no_clip_same), ZBT(test_clip_same), ZBT(test_nonfinite_rolls_back), ZBT(test_refusals),
         ZBT(test_count_prefix))
