/* zb_planner.c — see zb_planner.h. */
#include "zb_planner.h"

#include <string.h>

#include "zb_reduce.h"

/* The costs req asks for, into *out (caller owns). */
static zb_err planner_costs(const zb_planner_request *req, int v, zb_costs **out, zb_diag *diag) {
  if (req->costs) {
    if (req->costs->n_stages != req->p * v)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "costs: %d stages for %d (ranks x chunks)",
                         req->costs->n_stages, req->p * v);
    *out = zb_costs_clone(req->costs);
    return ZB_OK;
  }
  double limit = req->mem_limit > 0 ? req->mem_limit * req->rank.m_f : 0;
  zb_costs *c = zb_costs_from_rank_share(req->p, v, &req->rank, limit);
  *out = c;
  if (req->n_stage_times > 0) {
    if (req->n_stage_times != req->p * v)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage_costs: %d rows for %d stages (ranks x chunks)",
                         req->n_stage_times, req->p * v);
    for (int s = 0; s < req->n_stage_times; s++) {
      c->t_f[s] = req->stage_times[s][0];
      c->t_b[s] = req->stage_times[s][1];
      c->t_w[s] = req->stage_times[s][2];
    }
  }
  return zb_costs_check(c, diag);
}

/* Generates the compute-only lists into out->compute, timing them; the
 * generator's short run, if it planned one, into *run (period microbatches
 * a period), for lowering. */
static zb_err planner_generate(const zb_planner_request *req, zb_planner_result *out, zb_schedule **run,
                               int *period, zb_diag *diag) {
  zb_plan_request gen = {.family = req->family,
                         .p = req->p,
                         .v = out->v,
                         .m = req->m,
                         .costs = out->costs,
                         .objective = req->objective,
                         .par = req->par};
  double t0 = req->clock ? req->clock() : 0;
  zb_err err = zb_plan_generate_run(&gen, &out->compute, run, period, diag);
  if (req->clock)
    out->generate_seconds = req->clock() - t0;
  return err;
}

/* What the check of one plan is asked for, from either request. */
typedef struct planner_opts {
  const char *name; /* for messages */
  bool compute_only, keep_compute, figures_only;
  const zb_par *par;
  zb_sim_mode mode;
} planner_opts;

/* Validation and simulation of one plan: independent, each its own
 * output, so a runner may take them at once. */
typedef struct planner_check_job {
  const zb_schedule *runs;
  const zb_costs *costs;
  const zb_par *par; /* validation's own pieces: its deadlock run beside its scan */
  bool figures_only;
  zb_sim_mode mode;
  zb_violation violation;
  zb_err valid_err, sim_err;
  zb_sim_result *sim;
  zb_diag sim_diag;
} planner_check_job;

static void planner_check_piece(void *arg, int k) {
  planner_check_job *j = arg;
  if (k == 0)
    j->valid_err = zb_validate_par(j->runs, j->costs, j->par, &j->violation);
  else if (j->mode == ZB_SIM_DEVICE)
    j->sim_err = (j->figures_only ? zb_simulate_figures_mode : zb_simulate_mode)(j->runs, j->costs, j->mode,
                                                                                 &j->sim, &j->sim_diag);
  else
    j->sim_err = (j->figures_only ? zb_simulate_figures : zb_simulate_starts)(j->runs, j->costs, &j->sim,
                                                                              &j->sim_diag);
}

/* The compute-only figures of s under c in mode, its reductions priced
 * when c asks for them (on a copy of s given them, when s has none). */
static zb_err planner_simulate_compute(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode,
                                       zb_sim_result **out, zb_diag *diag) {
  zb_schedule *priced = NULL;
  if (zb_costs_reduces(c) && !zb_schedule_has_reduce(s)) {
    priced = zb_schedule_clone(s);
    zb_reduce_insert(priced, ZB_REDUCE_EARLIEST);
  }
  zb_err err = zb_simulate_figures_mode(priced ? priced : s, c, mode, out, diag);
  zb_schedule_free(priced);
  return err;
}

/* The compute-only lists' figures into out->sim_compute, unless the plan
 * is compute-only (its headline is they). */
static zb_err planner_compute_figures(const planner_opts *o, zb_planner_result *out, zb_diag *diag) {
  if (o->compute_only || out->sim_compute)
    return ZB_OK;
  zb_diag d = {{0}};
  out->failed = ZB_PLANNER_SIMULATE;
  zb_err err = planner_simulate_compute(out->compute, out->costs, o->mode, &out->sim_compute, &d);
  if (err)
    return zb_diag_set(diag, err, "%s: simulation failed: %s", o->name, d.msg);
  return ZB_OK;
}

/* Lowers out->compute (from the generator's short run when there is one)
 * unless out->lowered is given, keeping the figures lowering's own
 * simulation gives when it gives them (*figures, caller owns). */
static zb_err planner_lower(const planner_opts *o, zb_planner_result *out, const zb_schedule *run, int period,
                            zb_sim_result **figures, zb_diag *diag) {
  *figures = NULL;
  if (o->compute_only || out->lowered)
    return ZB_OK;
  zb_diag d = {{0}};
  out->failed = ZB_PLANNER_LOWER;
  /* lowering's own figures are the host-blocking run's */
  bool own = o->figures_only && o->mode == ZB_SIM_BLOCKING;
  zb_err err = zb_lower_par_figures(out->compute, run, period, out->costs, o->par, &out->lowered,
                                    own ? figures : NULL, &d);
  if (err)
    return zb_diag_set(diag, err, "%s: lowering failed: %s", o->name, d.msg);
  if (*figures) /* the lowered lists run on the compute timeline: one simulation for both */
    out->sim_compute = zb_sim_result_copy_figures(*figures);
  return ZB_OK;
}

/* Lowers (unless given or compute_only), validates and simulates
 * out->compute, both ways. */
static zb_err planner_check(const planner_opts *o, zb_planner_result *out, const zb_schedule *run, int period,
                            zb_diag *diag) {
  zb_sim_result *figures = NULL; /* the lowered plan's, when lowering's own simulation gives them */
  zb_err err = planner_lower(o, out, run, period, &figures, diag);
  if (!err)
    err = planner_compute_figures(o, out, diag);
  if (err)
    return err;
  if (o->compute_only && zb_costs_reduces(out->costs) && !zb_schedule_has_reduce(out->compute))
    zb_reduce_insert(out->compute, ZB_REDUCE_EARLIEST); /* the lists that run: priced in them */
  const zb_schedule *runs = o->compute_only ? out->compute : out->lowered;
  if (!o->keep_compute && !o->compute_only) { /* no longer needed: at scale a third of the peak */
    zb_schedule_free(out->compute);
    out->compute = NULL;
  }
  /* validation splits too when the runner has a processor beyond the two
   * that it and the simulation take (on two, three threads only take
   * turns: interleaved 1F1B, 4 chunks, p=256, m=4096 was no faster), or
   * when lowering gave the figures and it runs alone */
  const zb_par *vpar = zb_par_width(o->par) > 2 || figures ? o->par : NULL;
  planner_check_job job = {
      .runs = runs, .costs = out->costs, .par = vpar, .figures_only = o->figures_only, .mode = o->mode};
  if (figures) {
    planner_check_piece(&job, 0);
    job.sim = figures;
  } else if (zb_par_width(o->par) > 1) {
    zb_par_run(o->par, planner_check_piece, &job, 2);
  } else { /* in turn: an invalid plan is not simulated */
    planner_check_piece(&job, 0);
    if (!job.valid_err)
      planner_check_piece(&job, 1);
  }
  out->violation = job.violation;
  out->failed = ZB_PLANNER_VALIDATE;
  if (job.valid_err) { /* an invalid plan's simulation, if any, is not kept */
    zb_sim_result_free(job.sim);
    char line[200];
    zb_violation_format(&out->violation, line, (int)sizeof line);
    return zb_diag_set(diag, job.valid_err, "%s: invalid schedule: %s", o->name, line);
  }
  out->failed = ZB_PLANNER_SIMULATE;
  out->sim = job.sim;
  if (job.sim_err)
    return zb_diag_set(diag, job.sim_err, "%s: simulation failed: %s", o->name, job.sim_diag.msg);
  out->failed = ZB_PLANNER_DONE;
  return ZB_OK;
}

zb_err zb_planner_run(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag) {
  if (zb_planner_searches(req) && req->p >= 1 && req->m >= 1)
    return zb_planner_search(req, out, diag);
  return zb_planner_run_family(req, out, diag);
}

zb_err zb_planner_run_family(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  out->family = req->family;
  out->chosen = req->family;
  out->p = req->p;
  out->m = req->m;
  out->v = req->v > 0 ? req->v : zb_family_default_chunks(req->family);
  out->placement = zb_family_placement(req->family);
  out->generate_seconds = -1;
  out->mode = req->mode;
  out->failed = ZB_PLANNER_COSTS;
  if (req->p < 1 || req->m < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: ranks and microbatches must be positive (p=%d, m=%d)",
                       zb_family_name(req->family), req->p, req->m);
  zb_err err = planner_costs(req, out->v, &out->costs, diag);
  if (err)
    return err;
  out->failed = ZB_PLANNER_GENERATE;
  zb_schedule *run = NULL;
  int period = 0;
  if ((err = planner_generate(req, out, &run, &period, diag)))
    return err;
  planner_opts o = {.name = zb_family_name(req->family),
                    .compute_only = req->compute_only,
                    .keep_compute = req->keep_compute,
                    .figures_only = req->figures_only,
                    .par = req->par,
                    .mode = req->mode};
  err = planner_check(&o, out, run, period, diag);
  zb_schedule_free(run);
  if (!req->keep_compute && !req->compute_only) {
    zb_schedule_free(out->compute);
    out->compute = NULL;
  }
  return err;
}

/* Whether s holds PyTorch's WAIT_SEND markers (a compute_comms order). */
static bool planner_has_send_waits(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].actions[i].op == ZB_OP_WAIT_SEND_F || s->ranks[r].actions[i].op == ZB_OP_WAIT_SEND_B)
        return true;
  return false;
}

zb_err zb_planner_given(const zb_planner_given_request *req, zb_planner_result *out, zb_diag *diag) {
  const zb_schedule *s = req->schedule;
  memset(out, 0, sizeof *out);
  out->family = out->chosen = ZB_FAMILY_COUNT_;
  out->p = s->p;
  out->v = s->v;
  out->m = s->m;
  out->placement = s->placement;
  out->generate_seconds = -1;
  out->mode = req->mode;
  out->failed = ZB_PLANNER_COSTS;
  planner_opts o = {.name = req->name ? req->name : "schedule",
                    .keep_compute = req->keep_compute,
                    .figures_only = req->figures_only,
                    .par = req->par,
                    .mode = req->mode};
  if (req->costs->n_stages != s->p * s->v)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: costs for %d stages, the schedule has %d", o.name,
                       req->costs->n_stages, s->p * s->v);
  out->costs = zb_costs_clone(req->costs);
  out->compute = zb_schedule_clone(s);
  if (zb_schedule_has_comm(s)) {
    /* PyTorch's sends and receives are posted early and waited on at use,
     * which blocking comm actions would serialise: its compute order is
     * what it schedules, lowered anew; zb's own lowered lists run as given */
    out->relowered = planner_has_send_waits(s);
    zb_schedule_strip_comm(out->compute);
    if (!out->relowered)
      out->lowered = zb_schedule_clone(s);
  }
  out->failed = ZB_PLANNER_VALIDATE; /* the compute order first: its faults name the user's actions */
  zb_err err = zb_validate(out->compute, out->costs, &out->violation);
  if (err) {
    char line[200];
    zb_violation_format(&out->violation, line, (int)sizeof line);
    return zb_diag_set(diag, err, "%s: invalid schedule: %s", o.name, line);
  }
  return planner_check(&o, out, NULL, 0, diag);
}

static const zb_schedule *planner_lists(const zb_planner_result *r) {
  return r->lowered ? r->lowered : r->compute;
}

zb_err zb_planner_predict(const zb_planner_result *r, const zb_costs *c, zb_sim_result **out, zb_diag *diag) {
  *out = NULL;
  if (!planner_lists(r))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "no plan to simulate");
  return zb_simulate_figures_mode(planner_lists(r), c, r->mode, out, diag);
}

zb_err zb_planner_resimulate(zb_planner_result *r, const zb_costs *c, bool times, zb_diag *diag) {
  const zb_schedule *s = planner_lists(r);
  if (!s)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "no plan to simulate");
  zb_sim_result *sim = NULL, *compute = NULL;
  zb_err err = r->mode == ZB_SIM_DEVICE
                   ? (times ? zb_simulate_mode : zb_simulate_figures_mode)(s, c, r->mode, &sim, diag)
                   : (times ? zb_simulate_starts : zb_simulate_figures)(s, c, &sim, diag);
  if (!err && r->lowered) { /* the compute-only figures of its compute lists */
    zb_schedule *cs = r->compute ? NULL : zb_schedule_clone(r->lowered);
    if (cs)
      zb_schedule_strip_comm(cs);
    err = planner_simulate_compute(r->compute ? r->compute : cs, c, r->mode, &compute, diag);
    zb_schedule_free(cs);
  }
  if (err) {
    zb_sim_result_free(sim);
    return err;
  }
  zb_costs_free(r->costs);
  r->costs = zb_costs_clone(c);
  zb_sim_result_free(r->sim);
  zb_sim_result_free(r->sim_compute);
  r->sim = sim;
  r->sim_compute = compute;
  return ZB_OK;
}

void zb_planner_result_free(zb_planner_result *r) {
  zb_costs_free(r->costs);
  zb_schedule_free(r->compute);
  zb_schedule_free(r->lowered);
  zb_sim_result_free(r->sim);
  zb_sim_result_free(r->sim_compute);
  memset(r, 0, sizeof *r);
}

double zb_sim_max_peak(const zb_sim_result *sim) {
  double peak = 0;
  for (int k = 0; k < sim->p; k++)
    if (sim->peak_memory_units[k] > peak)
      peak = sim->peak_memory_units[k];
  return peak;
}
