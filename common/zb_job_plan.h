/* zb_job_plan.h — the plan a job spec implies: the spec's family, shape,
 * costs, stage times and memory limit as one zb_planner_request, run by
 * libzb's pipeline (zb_planner.h) with the generator timed on the
 * monotonic clock. The coordinator plans every submission, schedule
 * update and Plan call through it.
 *
 * Ownership: the result is the caller's (zb_planner_result_free); the
 * spec is borrowed for the call.
 */
#ifndef ZB_JOB_PLAN_H
#define ZB_JOB_PLAN_H

#include "zb_jobspec.h"
#include "zb_planner.h"

/* Plans spec (objective: zb-auto's). The simulation keeps the figures,
 * not every action's times (figures_only: a coordinator holds many plans);
 * zb_simulate the lowered lists for those. Fails with the pipeline's
 * error and a message naming the family and the step, or
 * ZB_ERR_INVALID_ARG for an unknown schedule name. Blocks on nothing but
 * the CPU. */
zb_err zb_job_plan(const zb_job_spec *spec, zb_objective objective, zb_planner_result *out, zb_diag *diag);

#endif
