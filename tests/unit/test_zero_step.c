/* ZeRO-1's sharded step (docs/model.md, Data parallelism: ZeRO-1) against
 * the unsharded one: a stage of five tensors (vectors without weight
 * decay, matrices with it) cut into d shards by zb_ring_shard, so shard
 * boundaries fall inside tensors; each shard has its own AdamW
 * (zb_adamw_set_decay_in_shard) and stepper, all of them fed the same
 * global check, the shards' partials summed in member order as the
 * worker's stage group does. Per element the math is the unsharded
 * step's, so the parameters and moments must be bit-identical, through
 * plain, clipped and skipped (non-finite) iterations, synchronous and
 * post-validated; and each shard keeps about 1/d of the moments. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zb_collective.h"
#include "zb_step.h"
#include "zbtest.h"

static const zb_adamw_config cfg = {
    .lr = 0.01, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};

/* offsets and sizes of the stage's tensors; rows == 1: a vector (no decay) */
enum { NT = 5, N = 57, ITERS = 6 };
static const size_t t_off[NT] = {0, 7, 37, 41, 56}, t_len[NT] = {7, 30, 4, 15, 1};
static const int t_rows[NT] = {1, 5, 1, 3, 1};

/* The global check every member is given: computed before any step. */
typedef struct fixed_total {
  zb_step_partial total;
} fixed_total;

static zb_err give_total(void *arg, zb_step_partial *p, zb_diag *diag) {
  (void)diag;
  *p = ((fixed_total *)arg)->total;
  return ZB_OK;
}

/* Iteration it's gradients: a scale that makes some iterations clip, and
 * one non-finite gradient at iteration 4. */
static void grads_of(int it, float *g) {
  double scale = it % 2 ? 3.0 : 0.05;
  for (size_t i = 0; i < N; i++)
    g[i] = (float)(scale * sin(1.7 * (double)i + 0.3 * it));
  if (it == 4)
    g[40] = NAN;
}

typedef struct sharded {
  int d;
  size_t off[8], len[8];
  zb_adamw *opt[8];
  zb_stepper *st[8];
} sharded;

static void sharded_new(sharded *s, int d, zb_step_mode mode, double clip) {
  zb_diag diag = {{0}};
  s->d = d;
  for (int k = 0; k < d; k++) {
    zb_ring_shard(N, d, k, &s->off[k], &s->len[k]);
    CHECK_EQ(zb_adamw_new(&cfg, s->len[k], &s->opt[k], &diag), ZB_OK);
    for (int t = 0; t < NT; t++)
      if (t_rows[t] == 1)
        zb_adamw_set_decay_in_shard(s->opt[k], s->off[k], t_off[t], t_len[t], false);
    CHECK_EQ(zb_stepper_new(1, &s->opt[k], clip, mode, &s->st[k], &diag), ZB_OK);
  }
}

static void sharded_free(sharded *s) {
  for (int k = 0; k < s->d; k++) {
    zb_stepper_free(s->st[k]);
    zb_adamw_free(s->opt[k]);
  }
}

/* One iteration of the d members over the shared parameters (each steps
 * only its own shard, as after the all-gather every replica holds all). */
static void sharded_step(sharded *s, float *p, const float *g, zb_step_result *r0) {
  zb_step_partial total = {.sumsq = 0, .finite = true};
  for (int k = 0; k < s->d; k++) {
    const float *gk = g + s->off[k];
    zb_step_partial pk = zb_step_local(s->st[k], &gk);
    total.sumsq += pk.sumsq;
    total.finite = total.finite && pk.finite;
  }
  fixed_total ft = {total};
  for (int k = 0; k < s->d; k++) {
    float *pk = p + s->off[k];
    const float *gk = g + s->off[k];
    zb_step_result r;
    zb_diag diag = {{0}};
    CHECK_EQ(zb_stepper_step(s->st[k], &pk, &gk, give_total, &ft, &r, &diag), ZB_OK);
    if (k == 0)
      *r0 = r;
    CHECK(r.clipped == r0->clipped && r.skipped == r0->skipped && r.coef == r0->coef);
  }
}

/* The whole run for d shards against the unsharded optimizer, which is
 * given the sharded members' total so both use the same coefficient. */
static void check_against_whole(int d, zb_step_mode mode) {
  double clip = 1.0;
  zb_adamw *whole;
  zb_stepper *ws;
  zb_diag diag = {{0}};
  CHECK_EQ(zb_adamw_new(&cfg, N, &whole, &diag), ZB_OK);
  for (int t = 0; t < NT; t++)
    if (t_rows[t] == 1)
      CHECK_EQ(zb_adamw_set_decay(whole, t_off[t], t_len[t], false, &diag), ZB_OK);
  CHECK_EQ(zb_stepper_new(1, &whole, clip, mode, &ws, &diag), ZB_OK);
  sharded s;
  sharded_new(&s, d, mode, clip);
  float pw[N], ps[N], g[N];
  for (size_t i = 0; i < N; i++)
    pw[i] = ps[i] = (float)cos(0.9 * (double)i);
  int clipped = 0, skipped = 0;
  for (int it = 0; it < ITERS; it++) {
    grads_of(it, g);
    zb_step_result rs = {0}, rw = {0};
    sharded_step(&s, ps, g, &rs);
    /* the whole step reads the members' total, exactly as they did */
    fixed_total ft = {{.sumsq = 0, .finite = true}};
    for (int k = 0; k < d; k++) {
      const float *gk = g + s.off[k];
      zb_step_partial pk = zb_step_local(s.st[k], &gk);
      ft.total.sumsq += pk.sumsq;
      ft.total.finite = ft.total.finite && pk.finite;
    }
    float *pwp = pw;
    const float *gp = g;
    CHECK_EQ(zb_stepper_step(ws, &pwp, &gp, give_total, &ft, &rw, &diag), ZB_OK);
    CHECK(rw.clipped == rs.clipped && rw.skipped == rs.skipped && rw.coef == rs.coef);
    clipped += rs.clipped;
    skipped += rs.skipped;
    CHECK(memcmp(pw, ps, sizeof pw) == 0);
  }
  CHECK(clipped > 0 && skipped == 1); /* the run went through every branch */
  int64_t steps_w, steps_k;
  const float *mw, *vw, *mk, *vk;
  zb_adamw_state(whole, &steps_w, &mw, &vw);
  size_t moments = 0;
  for (int k = 0; k < d; k++) {
    zb_adamw_state(s.opt[k], &steps_k, &mk, &vk);
    CHECK_EQ(steps_k, steps_w);
    CHECK(memcmp(mk, mw + s.off[k], s.len[k] * sizeof(float)) == 0);
    CHECK(memcmp(vk, vw + s.off[k], s.len[k] * sizeof(float)) == 0);
    CHECK(s.len[k] <= (N + (size_t)d - 1) / (size_t)d); /* 1/d of the state, rounded up */
    moments += zb_adamw_size(s.opt[k]);
  }
  CHECK_EQ(moments, (size_t)N);
  printf("d=%d %s: parameters and moments bit-identical to the unsharded step; optimizer state per member "
         "%zu of %d parameters' moments (%zu bytes of %zu)\n",
         d, mode == ZB_STEP_SYNCHRONOUS ? "synchronous" : "post-validated", s.len[0], N,
         2 * sizeof(float) * s.len[0], 2 * sizeof(float) * (size_t)N);
  sharded_free(&s);
  zb_stepper_free(ws);
  zb_adamw_free(whole);
}

static void test_shards_step_as_the_whole(void) {
  for (int d = 2; d <= 5; d++) {
    check_against_whole(d, ZB_STEP_SYNCHRONOUS);
    check_against_whole(d, ZB_STEP_POST_VALIDATED);
  }
}

/* The decay mask of a shard cut inside tensors: element by element the
 * whole mask's. */
static void test_decay_mask_respects_tensors(void) {
  zb_diag diag = {{0}};
  zb_adamw *whole;
  CHECK_EQ(zb_adamw_new(&cfg, N, &whole, &diag), ZB_OK);
  for (int t = 0; t < NT; t++)
    if (t_rows[t] == 1)
      CHECK_EQ(zb_adamw_set_decay(whole, t_off[t], t_len[t], false, &diag), ZB_OK);
  for (int d = 2; d <= 7; d++) {
    sharded s;
    sharded_new(&s, d, ZB_STEP_SYNCHRONOUS, 0);
    for (int k = 0; k < d; k++)
      CHECK(memcmp(zb_adamw_decay_mask(s.opt[k]), zb_adamw_decay_mask(whole) + s.off[k], s.len[k]) == 0);
    sharded_free(&s);
  }
  zb_adamw_free(whole);
}

ZBT_MAIN(ZBT(test_decay_mask_respects_tensors), ZBT(test_shards_step_as_the_whole))
