/* bench_reduce.c — zb_bench_reduce: what the gradient reduction of data x
 * pipeline parallelism costs each schedule family, as the simulator
 * predicts it (docs/schedules.md, Gradient reduction). For 1f1b, zb-h1,
 * zb-h2, zb-v and zb-auto at p ranks, m microbatches and unit F, B, W,
 * with each rank's whole reduction t_reduce = factor x (T_F+T_B+T_W), in
 * both simulator modes: the iteration without reduction, with every
 * REDUCE_GRAD at its earliest point (overlapped), with all of them at the
 * end of the list, the reduction time left exposed (the worst rank's),
 * and the ratios of the two against the iteration without. zb-auto's
 * choice is shown planned blind to the reduction (t_reduce 0, then run
 * with it) and with it priced. Figures are simulated, not timed: the same
 * on every machine.
 *
 *   zb_bench_reduce [-p P] [-m M] [-f FACTOR] [-c T_COMM]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_planner.h"
#include "zb_reduce.h"

typedef struct bench_args {
  int p, m;
  double factor, t_comm;
} bench_args;

static zb_err bench_plan(const bench_args *a, zb_family f, double t_reduce, zb_sim_mode mode,
                         zb_planner_result *out) {
  zb_planner_request req = {.family = f, .p = a->p, .m = a->m, .rank = zb_rank_costs_default(), .mode = mode};
  req.rank.t_comm = a->t_comm;
  req.rank.t_reduce = t_reduce;
  zb_diag d = {{0}};
  zb_err err = zb_planner_run(&req, out, &d);
  if (err)
    fprintf(stderr, "%s: %s\n", zb_family_name(f), d.msg);
  return err;
}

/* Makespan of lowered lists s (their reductions stripped and put back as
 * `at` says) under c, and the worst rank's exposed reduction. */
static double bench_run(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode, zb_reduce_at at,
                        double *exposed) {
  zb_schedule *t = zb_schedule_clone(s);
  zb_reduce_insert(t, at);
  zb_sim_result *r = NULL;
  double makespan = -1;
  *exposed = -1;
  if (zb_simulate_figures_mode(t, c, mode, &r, NULL) == ZB_OK) {
    makespan = r->makespan;
    *exposed = 0;
    for (int q = 0; q < r->p; q++)
      *exposed = r->reduce_exposed[q] > *exposed ? r->reduce_exposed[q] : *exposed;
  }
  zb_sim_result_free(r);
  zb_schedule_free(t);
  return makespan;
}

static void bench_name(const zb_planner_result *r, char *buf, size_t len) {
  if (r->family == ZB_FAMILY_ZB_AUTO)
    snprintf(buf, len, "zb-auto>%s/%d", zb_family_name(r->chosen), r->v);
  else
    snprintf(buf, len, "%s", zb_family_name(r->family));
}

/* One family's row: planned blind (t_reduce 0) and priced. */
static void bench_row(const bench_args *a, zb_family f, double t_reduce, zb_sim_mode mode) {
  zb_planner_result blind, priced;
  if (bench_plan(a, f, 0, mode, &blind) || bench_plan(a, f, t_reduce, mode, &priced)) {
    zb_planner_result_free(&blind);
    return;
  }
  double none = blind.sim->makespan, exp_e, exp_x, exp_b;
  double early = bench_run(priced.lowered, priced.costs, mode, ZB_REDUCE_EARLIEST, &exp_e);
  double end = bench_run(priced.lowered, priced.costs, mode, ZB_REDUCE_AT_END, &exp_x);
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_comm = a->t_comm;
  rc.t_reduce = t_reduce;
  zb_costs *bc = zb_costs_from_rank_share(a->p, blind.v, &rc, 0);
  double blind_early = bench_run(blind.lowered, bc, mode, ZB_REDUCE_EARLIEST, &exp_b);
  char bn[48], pn[48];
  bench_name(&blind, bn, sizeof bn);
  bench_name(&priced, pn, sizeof pn);
  printf("%-8s %-26s %8.2f %8.2f %8.2f %7.2f %6.3f %6.3f | %-26s %8.2f\n",
         mode == ZB_SIM_DEVICE ? "device" : "blocking", pn, none, early, end, exp_e, early / none, end / none,
         bn, blind_early);
  zb_costs_free(bc);
  zb_planner_result_free(&blind);
  zb_planner_result_free(&priced);
}

static int bench_usage(void) {
  fprintf(stderr, "usage: zb_bench_reduce [-p P] [-m M] [-f FACTOR] [-c T_COMM]\n");
  return 2;
}

int main(int argc, char **argv) {
  bench_args a = {.p = 4, .m = 8, .factor = 0.5, .t_comm = 0};
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc)
      return bench_usage();
    char *end = NULL;
    double v = strtod(argv[i + 1], &end);
    if (!end || *end || v < 0)
      return bench_usage();
    if (!strcmp(argv[i], "-p"))
      a.p = (int)v;
    else if (!strcmp(argv[i], "-m"))
      a.m = (int)v;
    else if (!strcmp(argv[i], "-f"))
      a.factor = v;
    else if (!strcmp(argv[i], "-c"))
      a.t_comm = v;
    else
      return bench_usage();
    i++;
  }
  if (a.p < 1 || a.m < 1)
    return bench_usage();
  double t_reduce = a.factor * 3; /* x (T_F + T_B + T_W), unit costs */
  printf("p=%d m=%d T_F=T_B=T_W=1 T_comm=%g t_reduce=%g per rank (%g x (T_F+T_B+T_W))\n", a.p, a.m, a.t_comm,
         t_reduce, a.factor);
  printf("%-8s %-26s %8s %8s %8s %7s %6s %6s | %-26s %8s\n", "mode", "plan (priced)", "none", "overlap",
         "at-end", "exposed", "ov/no", "end/no", "zb-auto blind to it", "its time");
  const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_ZB_V,
                            ZB_FAMILY_ZB_AUTO};
  for (int mode = ZB_SIM_BLOCKING; mode <= ZB_SIM_DEVICE; mode++)
    for (int k = 0; k < 5; k++)
      bench_row(&a, fams[k], t_reduce, (zb_sim_mode)mode);
  return 0;
}
