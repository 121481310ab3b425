/* zb_job_plan.c — see zb_job_plan.h. */
#include "zb_job_plan.h"

#include <string.h>

#include "zb_clock.h"
#include "zb_par_threads.h"

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
  return zb_planner_run(&req, out, diag);
}
