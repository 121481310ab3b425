/* zb_planner.h — the one planning pipeline of zb: a job-spec-like request
 * in, every rank's runnable action list and its predicted figures out.
 *
 *   costs     built from one rank's share, optional per-stage times and a
 *             memory limit (or taken as given), then checked;
 *   generate  the family's compute-only schedule (zb_plan.h);
 *   lower     SEND/RECV actions and transport groups inserted (zb_lower.h);
 *   validate  dependencies, placement, comm pairing, memory (zb_validate.h);
 *   simulate  makespan, bubble ratios and peak memory (zb_sim.h), twice:
 *             the lowered plan as workers run it (the headline figures)
 *             and the compute-only lists (the paper's view).
 *
 * Costs with some t_reduce > 0 price the gradient reduction of data
 * parallelism (zb_reduce.h): lowering gives the lowered lists their
 * REDUCE_GRAD and WAIT_REDUCE_GRAD actions, the compute-only figures are
 * of the compute lists with the same actions (result->compute itself
 * stays without them, but for a compute_only request, whose lists they
 * are), and zb-auto judges its candidates with them.
 *
 * zbctl, the coordinator, the tests and the benchmarks all plan through
 * zb_planner_run, and a schedule given whole (a CSV file) through
 * zb_planner_given, so one plan has one set of figures whatever its
 * source (docs/schedules.md, Planning pipeline). Pure: no I/O, no
 * threads, no globals; the only time it reads is the caller's clock, the
 * only threads it uses the caller's runner's.
 *
 * Ownership: a zb_planner_result owns everything it points to and is
 * released by zb_planner_result_free() (also after a failed run, and on a
 * zeroed result). The request's pointers are borrowed for the call.
 */
#ifndef ZB_PLANNER_H
#define ZB_PLANNER_H

#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"

typedef struct zb_planner_request {
  zb_family family;
  int p, m;
  int v; /* chunks per rank; 0: the family's default */
  /* Costs, one of two ways. costs == NULL: built from rank (one rank's
   * whole share, zb_costs_from_rank_share), then stage_times (NULL, or
   * n_stage_times == p*v rows of T_F, T_B, T_W seconds per stage) replace
   * the times, and mem_limit (per rank, in M_F units; <= 0: none, and
   * zb-auto defaults to 1F1B's peak) is converted with rank.m_f. costs !=
   * NULL: used as they are (copied); rank, stage_times and mem_limit are
   * ignored. */
  const zb_costs *costs;
  zb_rank_costs rank;
  const double (*stage_times)[3];
  int n_stage_times;
  double mem_limit;
  zb_objective objective; /* zb-auto only */
  /* Validate and simulate the generated lists without lowering them (the
   * paper's view: comm in the costs only). result->lowered stays NULL. */
  bool compute_only;
  /* Keep the generated compute-only lists in result->compute. */
  bool keep_compute;
  /* result->sim without per-action times (zb_simulate_figures): for
   * callers that never draw or trace the plan. */
  bool figures_only;
  /* Optional monotonic clock in seconds: times the generator. */
  double (*clock)(void);
  /* Optional runner for pieces of work at once (zb_par.h): lowering's
   * ranks in shares, and validation beside simulation. NULL: in turn. */
  const zb_par *par;
  /* How the plan is predicted (docs/schedules.md, Execution model):
   * ZB_SIM_BLOCKING (0, the default) as the host-blocking executor runs
   * it; ZB_SIM_DEVICE as the device-ordered one (zb_simulate_device for
   * the lowered lists, zb_simulate_figures_mode for the compute-only
   * ones), where gradient reductions overlap compute. zb-auto judges its
   * candidates the same way. */
  zb_sim_mode mode;
} zb_planner_request;

/* The step a run stopped at (ZB_PLANNER_DONE when it did not). */
typedef enum zb_planner_step {
  ZB_PLANNER_DONE = 0,
  ZB_PLANNER_COSTS,
  ZB_PLANNER_GENERATE,
  ZB_PLANNER_LOWER,
  ZB_PLANNER_VALIDATE,
  ZB_PLANNER_SIMULATE,
} zb_planner_step;

typedef struct zb_planner_result {
  zb_family family;
  zb_family chosen; /* the family whose lists these are: family, or what zb-auto's search chose */
  int p, v, m;
  zb_placement placement;
  zb_costs *costs;        /* what was planned with: per stage, mem_limit absolute (0: none) */
  zb_schedule *compute;   /* generated lists; NULL unless keep_compute (or compute_only) */
  zb_schedule *lowered;   /* what every rank runs; NULL when compute_only */
  zb_violation violation; /* the validator's finding (kind NONE on success) */
  /* The headline figures: of lowered, as the executor runs it (of
   * compute when compute_only); no times when figures_only, else each
   * action's start (its end: zb_sim_end). */
  zb_sim_result *sim;
  /* The compute-only lists' figures (no times): transfers as latency
   * only, the paper's view; NULL when compute_only (sim is they). */
  zb_sim_result *sim_compute;
  /* zb_planner_given only: the schedule's own comm order was PyTorch's
   * asynchronous one, replaced by a lowering of its compute order. */
  bool relowered;
  double generate_seconds; /* the generator's time by req->clock; -1 without one */
  zb_sim_mode mode;        /* the request's: how sim, sim_compute and later predictions simulate */
  zb_planner_step failed;  /* where a failed run stopped */
} zb_planner_result;

/* Runs the pipeline. On failure returns the step's error with diag naming
 * the family and the step ("zb-v: lowering failed: ..."; the generator's
 * own refusals are passed on unchanged, as they already name the shape),
 * and result->failed says which step; the caller frees *out either way.
 * Never blocks on anything but the CPU; zb-auto on large shapes is bounded
 * (docs/schedules.md, Families). */
zb_err zb_planner_run(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag);

/* zb_planner_run for req->family's own generator, never the search
 * (zb-auto as the loop-placement generator alone). */
zb_err zb_planner_run_family(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag);

/* A schedule given whole, to be planned as a generated one is. */
typedef struct zb_planner_given_request {
  const char *name;            /* for messages ("FILE: invalid schedule: ..."); NULL: "schedule" */
  const zb_schedule *schedule; /* compute-only; lowered by zb (SEND/RECV); or PyTorch's compute_comms */
  const zb_costs *costs;       /* of its p*v stages; mem_limit (0: none) is validated */
  bool keep_compute, figures_only;
  const zb_par *par;
  zb_sim_mode mode; /* as zb_planner_request's */
} zb_planner_given_request;

/* Plans a given schedule: its compute order validated, lowered (a list
 * lowered by zb is kept as it is and validated; PyTorch's compute_comms
 * order, whose sends and receives are asynchronous, is replaced by a
 * lowering of its compute order, and result->relowered says so), and
 * simulated both ways, as zb_planner_run does for a generated one: a
 * family's plan written as CSV and read back here has the same figures.
 * result->family is ZB_FAMILY_COUNT_ (none); failures as zb_planner_run. */
zb_err zb_planner_given(const zb_planner_given_request *req, zb_planner_result *out, zb_diag *diag);

/* The headline figures (no times) of r's plan, its lowered lists (its
 * compute lists when it has none), under other costs c: what it would
 * take if c were true (the coordinator's predictions from learned
 * costs). *out is the caller's. */
zb_err zb_planner_predict(const zb_planner_result *r, const zb_costs *c, zb_sim_result **out, zb_diag *diag);

/* Simulates r's plan again under c (copied into r->costs), both figure
 * sets, the headline with every action's start when times is set (for
 * drawing; ends by zb_sim_end); r is unchanged on failure. */
zb_err zb_planner_resimulate(zb_planner_result *r, const zb_costs *c, bool times, zb_diag *diag);

/* zb-auto as a choice among plans (zb_planner_search.c): what
 * zb_planner_run does for every zb-auto request. Every family that serves
 * the request is planned (over every placement when its chunks are open,
 * v = 0, and its costs are one rank's share; otherwise those of its
 * chunks under its costs): each as it plans alone, and the ones that plan
 * within a limit at the request's limit (default 1F1B's peak) and at a
 * ladder of limits below it. The plan with the best figure of the kind
 * the result reports (lowered; compute-only for a compute_only request)
 * whose peak fits the limit is planned in full: result->chosen names it,
 * result->v and ->placement are its. So a higher limit never gives a
 * worse plan at limits on the ladder, and zb-auto is never behind a named
 * family at that family's own peak (docs/schedules.md, zb-auto). */
bool zb_planner_searches(const zb_planner_request *req);
zb_err zb_planner_search(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag);
void zb_planner_result_free(zb_planner_result *r);

/* The largest per-rank peak of a simulation, in M_F units. */
double zb_sim_max_peak(const zb_sim_result *sim);

#endif
