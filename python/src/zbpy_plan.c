/* zbpy_plan.c — zbctl plan's planning sequence without its command line;
 * see zbpy_plan.h. */
#include "zbpy_plan.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "zb_format.h"

/* The generator's clock, as zbctl's (util/zb_clock.c is not in libzb). */
static double zbpy_clock_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* client/plan_args.c's plan_costs: the rank's share divided among v
 * chunks, per-stage times in place of the times, then checked. */
static zb_err zbpy_costs(const zbpy_request *req, int v, zb_costs **out, zb_diag *diag) {
  if (!(req->rank.m_f > 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "mem needs M_F > 0 (memory is reported in units of it)");
  int stages = req->p * v;
  if (req->stage_times && req->n_stage_times != stages)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage_costs has %d row%s, the schedule has %d stages (p*v)",
                       req->n_stage_times, req->n_stage_times == 1 ? "" : "s", stages);
  zb_costs *c = zb_costs_from_rank_share(req->p, v, &req->rank, req->limit_units * req->rank.m_f);
  for (int s = 0; req->stage_times && s < stages; s++) {
    c->t_f[s] = req->stage_times[s][0];
    c->t_b[s] = req->stage_times[s][1];
    c->t_w[s] = req->stage_times[s][2];
  }
  zb_diag d;
  if (zb_costs_check(c, &d) != ZB_OK) {
    zb_costs_free(c);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s: %s", req->stage_times ? "stage_costs" : "costs/mem",
                       d.msg);
  }
  *out = c;
  return ZB_OK;
}

/* The request every run shares: compute lists kept (csv, compute
 * actions), no per-action times (nothing here draws), timed generator. */
static zb_planner_request zbpy_planner_request(const zbpy_request *req, zb_family f) {
  return (zb_planner_request){.family = f,
                              .p = req->p,
                              .m = req->m,
                              .objective = req->objective,
                              .keep_compute = true,
                              .figures_only = true,
                              .clock = zbpy_clock_s};
}

zb_err zbpy_plan_run(const zbpy_request *req, zbpy_plan *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  out->rank = req->rank;
  out->limit_units = req->limit_units > 0 ? req->limit_units : 0;
  out->stage_times = req->stage_times != NULL;
  zb_family f;
  zb_err err = zb_family_parse(req->schedule, &f, diag);
  if (err)
    return err;
  if (req->have_objective && f != ZB_FAMILY_ZB_AUTO)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "objective applies to zb-auto only");
  int v = req->v ? req->v : zb_family_default_chunks(f);
  if ((err = zb_plan_check_shape(f, req->p, v, req->m, diag)))
    return err;
  zb_planner_request pr = zbpy_planner_request(req, f);
  out->searched = f == ZB_FAMILY_ZB_AUTO && !req->v && !req->stage_times;
  if (out->searched) {
    pr.rank = req->rank;
    pr.mem_limit = out->limit_units;
  } else {
    if ((err = zbpy_costs(req, v, &out->costs, diag)))
      return err;
    pr.v = v;
    pr.costs = out->costs;
  }
  if ((err = zb_planner_run(&pr, &out->result, diag)))
    return err;
  const zb_planner_result *r = &out->result;
  if (out->searched)
    snprintf(out->name, sizeof out->name, "zb-auto (chose %s, %d chunk%s)", zb_family_name(r->chosen), r->v,
             r->v == 1 ? "" : "s");
  else
    snprintf(out->name, sizeof out->name, "%s", zb_family_name(f));
  return ZB_OK;
}

void zbpy_plan_free(zbpy_plan *pl) {
  zb_planner_result_free(&pl->result);
  zb_costs_free(pl->costs);
  pl->costs = NULL;
}

void zbpy_plan_json(const zbpy_plan *pl, zb_buf *out) {
  const zb_planner_result *r = &pl->result;
  zb_plan_report rep = {
      .schedule = pl->name,
      .sched = r->lowered,
      .costs = pl->searched ? r->costs : pl->costs,
      .rank_costs = pl->stage_times ? NULL : &pl->rank,
      .mem_limit_units = pl->limit_units,
      .sim = r->sim,
      .sim_compute = r->sim_compute,
      .generation_seconds = r->generate_seconds >= 0 ? r->generate_seconds : 0,
  };
  zb_json_write(&rep, out);
}
