/* One figure definition for every plan (docs/schedules.md, Planning
 * pipeline, and zb-auto):
 *   - every family's compute-only lists written as CSV and read back
 *     through zb_planner_given have the figures zb_planner_run gave the
 *     family, headline (lowered) and compute-only, at T_comm 0 and 0.3;
 *   - zb-auto, judged by the headline figure it reports, never gets worse
 *     as the memory limit rises and is never behind a named family at that
 *     family's own peak: p in {2, 4, 8, 16}, m in {p, 2p, 4p, 8p}, equal
 *     costs, 1:1.2:0.8:0.05, 1:1.5:0.5:0.2 and per-stage uneven times,
 *     limits 1p, 2p, 3p and every named family's peak. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_format.h"
#include "zb_planner.h"
#include "zbtest.h"

#define EPS 1e-9

static bool same(double a, double b) {
  return fabs(a - b) <= EPS * (1 + fabs(a));
}

static bool same_figures(const zb_sim_result *a, const zb_sim_result *b) {
  if (!a || !b || a->p != b->p || !same(a->makespan, b->makespan) ||
      !same(a->bubble_ratio, b->bubble_ratio) || !same(a->bubble_ratio_paper, b->bubble_ratio_paper))
    return false;
  for (int r = 0; r < a->p; r++)
    if (!same(a->peak_memory_units[r], b->peak_memory_units[r]))
      return false;
  return true;
}

/* Family f (v: its chunks, 0 its own) planned, its lists through CSV and
 * back, planned again: false (and a line saying why) when they differ. */
static bool round_trip(zb_family f, int v, int p, int m, double t_comm) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_comm = t_comm;
  zb_planner_request req = {.family = f, .p = p, .v = v, .m = m, .rank = rc, .keep_compute = true};
  zb_planner_result gen, back;
  memset(&back, 0, sizeof back);
  zb_diag d = {{0}};
  zb_schedule *read = NULL;
  zb_buf csv = ZB_BUF_INIT;
  bool ok = false;
  if (zb_planner_run(&req, &gen, &d) != ZB_OK) {
    ok = zb_plan_check_shape(f, p, v ? v : zb_family_default_chunks(f), m, NULL) != ZB_OK;
    goto done;
  }
  zb_csv_write(gen.compute, &csv);
  if (zb_csv_parse(csv.data, csv.len, ZB_PLACE_INFER, &read, &d) != ZB_OK)
    goto done;
  zb_planner_given_request given = {.name = "csv", .schedule = read, .costs = gen.costs};
  if (zb_planner_given(&given, &back, &d) != ZB_OK)
    goto done;
  ok = same_figures(gen.sim, back.sim) && same_figures(gen.sim_compute, back.sim_compute);
  if (!ok)
    fprintf(stderr, "  %s v=%d p=%d m=%d T_comm %g: makespan %g / %g planned, %g / %g read back\n",
            zb_family_name(f), gen.v, p, m, t_comm, gen.sim->makespan, gen.sim_compute->makespan,
            back.sim->makespan, back.sim_compute->makespan);
done:
  if (!ok && d.msg[0])
    fprintf(stderr, "  %s p=%d m=%d: %s\n", zb_family_name(f), p, m, d.msg);
  zb_buf_free(&csv);
  zb_schedule_free(read);
  zb_planner_result_free(&gen);
  zb_planner_result_free(&back);
  return ok;
}

static void test_csv_round_trip_every_family(void) {
  int failures = 0, checked = 0;
  static const int shapes[][2] = {{4, 8}, {4, 16}, {8, 16}, {8, 32}};
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int k = 0; k < 4; k++)
      for (int c = 0; c < 2; c++) {
        int vmax = f == ZB_FAMILY_INTERLEAVED_1F1B || f == ZB_FAMILY_ZB_INTERLEAVED ? 4 : 0;
        for (int v = vmax ? 2 : 0; v <= vmax; v++) {
          failures += !round_trip((zb_family)f, v, shapes[k][0], shapes[k][1], c ? 0.3 : 0);
          checked++;
        }
      }
  printf("  %d plans read back, %d differ\n", checked, failures);
  CHECK_EQ(failures, 0);
}

/* A cost setting of the sweep: one rank's share, or per-stage times. */
typedef struct sweep_costs {
  const char *name;
  double t_f, t_b, t_w, t_comm;
  bool per_stage;
} sweep_costs;

static const sweep_costs sweep_settings[] = {
    {"equal", 1, 1, 1, 0, false},
    {"1:1.2:0.8:0.05", 1, 1.2, 0.8, 0.05, false},
    {"1:1.5:0.5:0.2", 1, 1.5, 0.5, 0.2, false},
    {"per-stage", 1, 1.2, 0.8, 0.05, true},
};

/* Per-stage times for p stages: a third of them 1.5x slower, one W in
 * four half as long (fills stage_times[p][3]). */
static void per_stage_times(int p, double (*t)[3]) {
  for (int s = 0; s < p; s++) {
    double slow = s % 3 == 1 ? 1.5 : 1;
    t[s][0] = 1 * slow;
    t[s][1] = 1.2 * slow;
    t[s][2] = (s % 4 == 2 ? 0.4 : 0.8) * slow;
  }
}

/* The headline makespan and peak of family f (v: 0 its own) at limit
 * (p units; 0: none); false when it does not plan. */
static bool plan_at(zb_family f, int v, int p, int m, const sweep_costs *sc, double limit, double *makespan,
                    double *peak) {
  double times[64][3];
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_f = sc->t_f, rc.t_b = sc->t_b, rc.t_w = sc->t_w, rc.t_comm = sc->t_comm;
  rc.m_f = 1, rc.m_b = 0, rc.m_w = -1; /* M = 1, 0, -1 */
  zb_planner_request req = {
      .family = f, .p = p, .v = v, .m = m, .rank = rc, .mem_limit = limit * p, .figures_only = true};
  if (sc->per_stage) {
    per_stage_times(p, times);
    req.v = 1;
    req.stage_times = (const double(*)[3])times;
    req.n_stage_times = p;
  }
  zb_planner_result r;
  bool ok = zb_planner_run(&req, &r, NULL) == ZB_OK;
  if (ok) {
    *makespan = r.sim->makespan;
    *peak = zb_sim_max_peak(r.sim);
  }
  zb_planner_result_free(&r);
  return ok;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The named families a setting compares with: every family and chunk
 * count, or those of one chunk per rank with per-stage times. */
static const struct {
  zb_family f;
  int v;
} named[] = {{ZB_FAMILY_GPIPE, 0},
             {ZB_FAMILY_1F1B, 0},
             {ZB_FAMILY_ZB_H1, 0},
             {ZB_FAMILY_ZB_H2, 0},
             {ZB_FAMILY_ZB_V, 0},
             {ZB_FAMILY_V_HALF, 0},
             {ZB_FAMILY_V_MIN, 0},
             {ZB_FAMILY_INTERLEAVED_1F1B, 2},
             {ZB_FAMILY_INTERLEAVED_1F1B, 4},
             {ZB_FAMILY_ZB_INTERLEAVED, 2},
             {ZB_FAMILY_ZB_INTERLEAVED, 3}};
enum { N_NAMED = sizeof named / sizeof named[0] };

/* One shape and setting; returns the failures. */
static int sweep(int p, int m, const sweep_costs *sc) {
  double limits[3 + N_NAMED], auto_ms[3 + N_NAMED], fam_ms[N_NAMED], fam_peak[N_NAMED];
  int n = 0, failures = 0;
  for (int k = 1; k <= 3; k++)
    limits[n++] = k;
  for (int i = 0; i < N_NAMED; i++) {
    fam_peak[i] = -1;
    if (sc->per_stage && zb_family_default_chunks(named[i].f) != 1)
      continue;
    if (plan_at(named[i].f, named[i].v, p, m, sc, 0, &fam_ms[i], &fam_peak[i]))
      limits[n++] = fam_peak[i] / p;
    else
      fam_peak[i] = -1;
  }
  qsort(limits, (size_t)n, sizeof limits[0], cmp_double);
  double prev = INFINITY, peak;
  for (int k = 0; k < n; k++) {
    auto_ms[k] = k && limits[k] <= limits[k - 1] + EPS ? auto_ms[k - 1] : INFINITY;
    if (isfinite(auto_ms[k]) || !plan_at(ZB_FAMILY_ZB_AUTO, 0, p, m, sc, limits[k], &auto_ms[k], &peak))
      continue; /* the same limit again, or below what any plan needs */
    if (auto_ms[k] > prev + EPS || peak > limits[k] * p * (1 + EPS) + EPS) {
      fprintf(stderr, "  p=%d m=%d %s limit %.4gp: makespan %g (peak %g), at the lower limit %g\n", p, m,
              sc->name, limits[k], auto_ms[k], peak, prev);
      failures++;
    }
    prev = auto_ms[k];
  }
  for (int i = 0; i < N_NAMED; i++) {
    int k = 0;
    while (k < n - 1 && limits[k] < fam_peak[i] / p - EPS)
      k++;
    if (fam_peak[i] >= 0 && !(auto_ms[k] <= fam_ms[i] + EPS)) {
      fprintf(stderr, "  p=%d m=%d %s: zb-auto %g at %s's peak %g, which has %g\n", p, m, sc->name,
              auto_ms[k], zb_family_name(named[i].f), fam_peak[i], fam_ms[i]);
      failures++;
    }
  }
  return failures;
}

static void test_auto_monotone_and_never_behind(void) {
  int failures = 0, points = 0;
  for (int p = 2; p <= 16; p *= 2)
    for (int k = 1; k <= 8; k *= 2)
      for (size_t c = 0; c < sizeof sweep_settings / sizeof sweep_settings[0]; c++) {
        failures += sweep(p, k * p, &sweep_settings[c]);
        points++;
      }
  printf("  %d shapes x cost settings, %d failures\n", points, failures);
  CHECK_EQ(failures, 0);
}

ZBT_MAIN(ZBT(test_csv_round_trip_every_family), ZBT(test_auto_monotone_and_never_behind))
