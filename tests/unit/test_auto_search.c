/* zb-auto over every placement (zb_planner_search, docs/schedules.md):
 * a sweep over p in {2, 4, 8}, m in {p, 2p, 4p}, equal costs and
 * T_F:T_B:T_W:T_comm = 1:1.2:0.8:0.05 (memory M_F = 1, M_B = M_W = -1/2):
 *   - at every named family's own peak (its default chunks; the
 *     interleaved families with 2, 3 and 4), zb-auto planned within that
 *     peak has a makespan no larger than the family's;
 *   - over the limits of that sweep and 0.5p, p, 1.5p, 2p, taken in rising
 *     order, zb-auto's makespan never rises;
 *   - its peak never exceeds the limit, and the result names the family
 *     it chose, with that family's chunks and placement.
 * And zb-v under uneven costs (p in 4..16, m in p..8p) is never behind
 * zb-h1, which holds the same memory (1F1B's), in the paper's bubble. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_planner.h"
#include "zbtest.h"

#define EPS 1e-9

static zb_rank_costs costs_of(int uneven) {
  zb_rank_costs rc = zb_rank_costs_default();
  if (uneven) {
    rc.t_b = 1.2;
    rc.t_w = 0.8;
    rc.t_comm = 0.05;
  }
  return rc;
}

/* Plans (compute-only); the makespan and peak, or false. */
static bool figures(zb_family f, int v, int p, int m, const zb_rank_costs *rc, double limit, double *makespan,
                    double *peak, zb_family *chosen) {
  zb_planner_request req = {
      .family = f, .p = p, .m = m, .v = v, .rank = *rc, .mem_limit = limit, .compute_only = true};
  zb_planner_result r;
  bool ok = zb_planner_run(&req, &r, NULL) == ZB_OK;
  if (ok) {
    *makespan = r.sim->makespan;
    *peak = zb_sim_max_peak(r.sim);
    if (chosen)
      *chosen = r.chosen;
    bool multi = r.chosen == ZB_FAMILY_INTERLEAVED_1F1B || r.chosen == ZB_FAMILY_ZB_INTERLEAVED;
    bool shape =
        (multi || r.v == zb_family_default_chunks(r.chosen)) && r.placement == zb_family_placement(r.chosen);
    ok = !chosen || shape;
  }
  zb_planner_result_free(&r);
  return ok;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One shape and cost setting; returns the failures. */
static int sweep(int p, int m, int uneven) {
  zb_rank_costs rc = costs_of(uneven);
  double limits[64];
  int n = 0, failures = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int v = 1; v <= 4; v++) {
      bool multi = f == ZB_FAMILY_INTERLEAVED_1F1B || f == ZB_FAMILY_ZB_INTERLEAVED;
      if (f == ZB_FAMILY_ZB_AUTO || (multi ? v < 2 : v != zb_family_default_chunks((zb_family)f)))
        continue;
      double ms, pk, auto_ms, auto_pk;
      if (zb_plan_check_shape((zb_family)f, p, v, m, NULL) != ZB_OK ||
          !figures((zb_family)f, v, p, m, &rc, 0, &ms, &pk, NULL))
        continue;
      limits[n++] = pk;
      zb_family chosen;
      if (!figures(ZB_FAMILY_ZB_AUTO, 0, p, m, &rc, pk, &auto_ms, &auto_pk, &chosen) || auto_ms > ms + EPS ||
          auto_pk > pk + EPS) {
        fprintf(stderr, "  p=%d m=%d %s: at %s v=%d's peak %g zb-auto %g (peak %g) against %g\n", p, m,
                uneven ? "uneven" : "equal", zb_family_name((zb_family)f), v, pk, auto_ms, auto_pk, ms);
        failures++;
      }
    }
  const double fractions[] = {0.5, 1, 1.5, 2};
  for (int k = 0; k < 4; k++)
    limits[n++] = fractions[k] * p;
  qsort(limits, (size_t)n, sizeof limits[0], cmp_double);
  double last = INFINITY;
  for (int k = 0; k < n; k++) {
    double ms, pk;
    zb_family chosen;
    if (!figures(ZB_FAMILY_ZB_AUTO, 0, p, m, &rc, limits[k], &ms, &pk, &chosen))
      continue; /* nothing fits a low limit */
    if (ms > last + EPS || pk > limits[k] + EPS) {
      fprintf(stderr, "  p=%d m=%d %s: limit %g: zb-auto (%s) makespan %g after %g, peak %g\n", p, m,
              uneven ? "uneven" : "equal", limits[k], zb_family_name(chosen), ms, last, pk);
      failures++;
    }
    last = ms;
  }
  return failures;
}

static void test_search_sweep(void) {
  int failures = 0, shapes = 0;
  for (int p = 2; p <= 8; p *= 2)
    for (int k = 1; k <= 4; k *= 2)
      for (int uneven = 0; uneven < 2; uneven++) {
        failures += sweep(p, k * p, uneven);
        shapes++;
      }
  printf("  %d shapes x cost settings swept, %d failures\n", shapes, failures);
  CHECK_EQ(failures, 0);
}

/* --chunks (v > 0) or per-stage costs keep zb-auto on loop placement:
 * it chooses among the families of one chunk per rank. */
static void test_restricted_stays_loop(void) {
  zb_planner_request req = {
      .family = ZB_FAMILY_ZB_AUTO, .p = 4, .m = 8, .v = 1, .rank = zb_rank_costs_default()};
  zb_planner_result r;
  CHECK(zb_planner_run(&req, &r, NULL) == ZB_OK);
  CHECK_EQ(zb_family_default_chunks(r.chosen), 1);
  CHECK_EQ(r.v, 1);
  CHECK_EQ(r.placement, ZB_PLACE_LOOP);
  zb_planner_result_free(&r);
  req.v = 0;
  CHECK(zb_planner_run(&req, &r, NULL) == ZB_OK);
  CHECK(r.chosen != ZB_FAMILY_ZB_AUTO || r.v == 1);
  CHECK_EQ(r.family, ZB_FAMILY_ZB_AUTO);
  zb_planner_result_free(&r);
}

static void test_zb_v_not_behind_zb_h1(void) {
  zb_rank_costs rc = costs_of(1);
  int failures = 0;
  for (int p = 4; p <= 16; p *= 2)
    for (int k = 1; k <= 8; k *= 2) {
      double bubble[2], peak[2];
      const zb_family fams[2] = {ZB_FAMILY_ZB_V, ZB_FAMILY_ZB_H1};
      for (int i = 0; i < 2; i++) {
        zb_planner_request req = {.family = fams[i], .p = p, .m = k * p, .rank = rc, .compute_only = true};
        zb_planner_result r;
        CHECK(zb_planner_run(&req, &r, NULL) == ZB_OK);
        bubble[i] = r.sim->bubble_ratio_paper;
        peak[i] = zb_sim_max_peak(r.sim);
        zb_planner_result_free(&r);
      }
      if (bubble[0] > bubble[1] + EPS || peak[0] > peak[1] + EPS) {
        fprintf(stderr, "  p=%d m=%d: zb-v %.4f (peak %g), zb-h1 %.4f (peak %g)\n", p, k * p, bubble[0],
                peak[0], bubble[1], peak[1]);
        failures++;
      }
    }
  CHECK_EQ(failures, 0);
}

/* A limit nothing fits is refused naming it, and the result frees clean. */
static void test_search_infeasible(void) {
  zb_planner_request req = {
      .family = ZB_FAMILY_ZB_AUTO, .p = 4, .m = 8, .rank = zb_rank_costs_default(), .mem_limit = 0.1};
  zb_planner_result r;
  zb_diag d = {{0}};
  CHECK(zb_planner_run(&req, &r, &d) == ZB_ERR_INFEASIBLE);
  CHECK_MSG(strstr(d.msg, "0.1") != NULL, "%s", d.msg);
  CHECK(r.sim == NULL && r.lowered == NULL);
  zb_planner_result_free(&r);
}

ZBT_MAIN(ZBT(test_search_sweep), ZBT(test_search_infeasible), ZBT(test_zb_v_not_behind_zb_h1),
         ZBT(test_restricted_stays_loop))
