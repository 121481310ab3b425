/* zb_job_plan.c — see zb_job_plan.h. */
#include "zb_job_plan.h"

#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_par_threads.h"

/* A model job with data_parallel > 1 derives each stage's T_reduce
 * (zb_jobspec_dp.h): the planner takes per-stage costs then, built as it
 * would build them from the rank share (zb_planner.h). zb-auto searching
 * the chunks has no fixed stages: its ranks get the average share. */
static zb_err dp_costs(const zb_job_spec *spec, zb_family fam, zb_planner_request *req, zb_diag *diag) {
  int v = spec->chunks ? spec->chunks : zb_family_default_chunks(fam), n = spec->ranks * v;
  double *t = zb_calloc((size_t)n, sizeof *t);
  zb_err err = zb_job_spec_reduce_times(spec, n, t, diag);
  if (!err && fam == ZB_FAMILY_ZB_AUTO && !spec->chunks) {
    for (int k = 0; k < n; k++)
      req->rank.t_reduce += t[k] / spec->ranks;
  } else if (!err) {
    double limit = spec->mem_limit > 0 ? spec->mem_limit * spec->costs.m_f : 0;
    zb_costs *c = zb_costs_from_rank_share(spec->ranks, v, &spec->costs, limit);
    for (int k = 0; k < n; k++) {
      if (spec->n_stage_costs == n) {
        c->t_f[k] = spec->stage_costs[k][0];
        c->t_b[k] = spec->stage_costs[k][1];
        c->t_w[k] = spec->stage_costs[k][2];
      }
      c->t_reduce[k] = t[k];
    }
    req->costs = c;
  }
  free(t);
  return err;
}

zb_err zb_job_plan(const zb_job_spec *spec, zb_objective objective, zb_planner_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  zb_par par = zb_par_threads(zb_par_plan_width());
  zb_family family;
  zb_err err = zb_family_parse(spec->schedule, &family, diag);
  if (err)
    return err;
  zb_planner_request req = {.family = family,
                            .p = spec->ranks,
                            .m = spec->microbatches,
                            .v = spec->chunks,
                            .rank = spec->costs,
                            .stage_times = (const double(*)[3])spec->stage_costs,
                            .n_stage_times = spec->n_stage_costs,
                            .mem_limit = spec->mem_limit,
                            .objective = objective,
                            .figures_only = true,
                            .clock = zb_clock_s,
                            .par = &par};
  if (zb_job_spec_derives_reduce(spec) && (err = dp_costs(spec, family, &req, diag)))
    return err;
  req.v = req.costs ? req.costs->n_stages / spec->ranks : req.v;
  err = zb_planner_run(&req, out, diag);
  zb_costs_free((zb_costs *)req.costs);
  return err;
}
