/* zb_job_plan.c — see zb_job_plan.h. */
#include "zb_job_plan.h"

#include <string.h>

#include "zb_clock.h"
#include "zb_par_threads.h"

/* Threads one plan may borrow: lowering at scale splits well up to a few
 * (docs/schedules.md, Planning pipeline). */
#define JOB_PLAN_THREADS 4

zb_err zb_job_plan(const zb_job_spec *spec, zb_objective objective, zb_planner_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  int cpus = zb_par_cpus();
  zb_par par = zb_par_threads(cpus < JOB_PLAN_THREADS ? cpus : JOB_PLAN_THREADS);
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
