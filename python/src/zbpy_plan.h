/* zbpy_plan.h — `zbctl plan`'s planning sequence for the Python package
 * (python/README.md), in plain C over libzb: no Python object here, so the
 * module (zbpy_module.c) can run it with the GIL released.
 *
 * A zbpy_request says what `zbctl plan --schedule ... --ranks ...
 * --microbatches ... [--chunks] [--costs] [--stage-costs] [--mem]
 * [--mem-limit] [--objective]` says, already parsed and range-checked by
 * the caller (python/zb/_args.py). zbpy_plan_run takes the same steps as
 * client/plan.c's plan_generated, in the same order and with the same
 * messages where libzb writes them: the family is parsed, the shape
 * checked, the costs built (one rank's share divided among chunks, per-
 * stage times replacing the times, the limit converted from M_F units)
 * and checked, then zb_planner_run plans (zb-auto with neither chunks nor
 * stage times searches every placement, as zbctl's does). So one request
 * gives the bytes zbctl writes for it (docs/schedules.md, From Python).
 *
 * Ownership: the request's pointers are borrowed for the call. A
 * zbpy_plan owns its planner result and costs; zbpy_plan_free releases
 * them, also after a failed run and on a zeroed plan. The writers only
 * append to the caller's zb_buf.
 */
#ifndef ZBPY_PLAN_H
#define ZBPY_PLAN_H

#include <stdbool.h>

#include "zb_buf.h"
#include "zb_planner.h"

typedef struct zbpy_request {
  const char *schedule; /* family name, as zb_family_parse reads it */
  int p, m;
  int v;              /* chunks per rank; 0: the family's default */
  zb_rank_costs rank; /* one rank's whole share: times, T_comm, memory deltas */
  /* NULL, or n_stage_times rows of T_F, T_B, T_W per stage (already per
   * chunk); the count must be p*v */
  const double (*stage_times)[3];
  int n_stage_times;
  double limit_units; /* per-rank memory limit in M_F units; <= 0: none */
  bool have_objective;
  zb_objective objective;
} zbpy_request;

typedef struct zbpy_plan {
  zb_planner_result result; /* compute lists kept; figures without times */
  zb_costs *costs;          /* what the family was planned with; NULL after a search */
  bool searched;            /* zb-auto over every placement */
  bool stage_times;         /* the request had per-stage times */
  zb_rank_costs rank;       /* the request's, for the JSON report */
  double limit_units;
  char name[96]; /* the report's "schedule": the family, or zb-auto's choice */
} zbpy_plan;

/* Plans req into *out (zeroed here first). On failure returns the error
 * with diag holding zbctl's message for it (without zbctl's "zbctl plan: "
 * prefix); free *out either way. Never touches Python. */
zb_err zbpy_plan_run(const zbpy_request *req, zbpy_plan *out, zb_diag *diag);
void zbpy_plan_free(zbpy_plan *pl);

/* `zbctl plan -o json`: the report of the lowered plan and both figure
 * sets. generation_seconds is this run's generator time. */
void zbpy_plan_json(const zbpy_plan *pl, zb_buf *out);

#endif
