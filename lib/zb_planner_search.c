/* zb_planner_search.c — zb-auto as a choice among plans (docs/schedules.md,
 * zb-auto). Every family that can serve the request is planned, and the
 * plan with the best figure of the kind the result reports (the lowered
 * plan's, or the compute-only lists' for a compute_only request) whose peak
 * fits the limit is planned in full; result->chosen names it.
 *
 * Candidates: every family as it plans by itself (no limit: the plan a
 * user naming it gets), and the families that plan within a limit (the
 * loop zb-auto, zb-interleaved, the V families) at the request's limit and
 * at each rung of a ladder below it: multiples of 1F1B's peak and the
 * peaks of the families' own plans. A limit that rises keeps every rung
 * that a lower one had, so the choice never gets worse with more memory
 * at limits on the ladder (and never worse than a named family at that
 * family's own peak). Placements are open (loop with 1 to 4 chunks, V)
 * when the request leaves the chunks open and gives one rank's share;
 * otherwise the families of the request's chunks, under its costs.
 *
 * The compute-only makespan bounds the lowered one from below (a lowered
 * plan only adds waits), and a family's placement bounds both before it
 * is planned (search_bound), so they prune candidates that cannot win;
 * they never decide.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"
#include "zb_planner.h"
#include "zb_reduce.h"

#define SEARCH_EPS 1e-9
/* Plans above this many compute actions per rank's share (p v m) plan the
 * ladder's first rung only: each rung plans every limited family again. */
#define SEARCH_LADDER_OPS 4096
enum { SEARCH_MAX_RUNGS = 16 };

bool zb_planner_searches(const zb_planner_request *req) {
  return req->family == ZB_FAMILY_ZB_AUTO;
}

/* Whether the request leaves the placement open (one rank's share). */
static bool search_open(const zb_planner_request *req) {
  return req->v == 0 && !req->costs && req->n_stage_times == 0;
}

typedef struct search_fam {
  zb_family family;
  int v;
  bool limited; /* plans within a limit (else as it is) */
} search_fam;

static const search_fam search_fams[] = {
    {ZB_FAMILY_ZB_V, 2, true},
    {ZB_FAMILY_ZB_AUTO, 1, true},
    {ZB_FAMILY_1F1B, 1, false},
    {ZB_FAMILY_GPIPE, 1, false},
    {ZB_FAMILY_ZB_H1, 1, false},
    {ZB_FAMILY_ZB_H2, 1, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 2, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 3, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 4, false},
    {ZB_FAMILY_V_HALF, 2, true},
    {ZB_FAMILY_V_MIN, 2, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 2, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 3, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 4, true},
};
enum { SEARCH_FAMS = sizeof search_fams / sizeof search_fams[0] };

/* One search: the request, its limit and 1F1B's peak (absolute), the
 * best so far. */
typedef struct search_state {
  const zb_planner_request *req;
  int v; /* the request's chunks when the placement is closed */
  double limit, one_f1b;
  double rungs[SEARCH_MAX_RUNGS];
  int n_rungs;
  double best_key;
  int best_fam;
  double best_level; /* the winner's limit; 0: its own */
} search_state;

/* Costs of family sf's shape with mem_limit level (absolute; 0: none),
 * or NULL when they cannot be built. Caller owns. */
static zb_costs *search_costs(const search_state *st, const search_fam *sf, double level) {
  const zb_planner_request *req = st->req;
  zb_costs *c;
  if (req->costs) {
    c = zb_costs_clone(req->costs);
  } else {
    c = zb_costs_from_rank_share(req->p, sf->v, &req->rank, 0);
    for (int s = 0; s < req->n_stage_times && req->n_stage_times == c->n_stages; s++) {
      c->t_f[s] = req->stage_times[s][0];
      c->t_b[s] = req->stage_times[s][1];
      c->t_w[s] = req->stage_times[s][2];
    }
  }
  c->mem_limit = level;
  if (zb_costs_check(c, NULL) != ZB_OK) {
    zb_costs_free(c);
    return NULL;
  }
  return c;
}

/* The figure the request is judged by of s (compute-only lists) under c:
 * the lowered plan's unless the request is compute-only or T_comm is 0
 * (then the two agree). false when it cannot be had or the compute-only
 * bound already loses to the best. */
static bool search_key(const search_state *st, const zb_schedule *s, const zb_costs *c, double *key) {
  bool span = st->req->objective == ZB_OBJ_SPAN;
  zb_sim_mode mode = st->req->mode;
  double makespan, max_span;
  zb_schedule *priced = NULL; /* s with its reductions, when c asks for them: they are part of the figure */
  if (zb_costs_reduces(c)) {
    priced = zb_schedule_clone(s);
    zb_reduce_insert(priced, ZB_REDUCE_EARLIEST);
  }
  zb_err err = zb_simulate_makespan_mode(priced ? priced : s, c, mode, &makespan, &max_span);
  zb_schedule_free(priced);
  if (err != ZB_OK)
    return false;
  *key = span ? max_span : makespan;
  if (st->req->compute_only || c->t_comm <= 0)
    return true;
  if (!span && makespan >= st->best_key - SEARCH_EPS) /* a bound: lowering only adds waits */
    return false;
  zb_schedule *low = NULL;
  bool ok = zb_lower(s, c, &low, NULL) == ZB_OK &&
            zb_simulate_makespan_mode(low, c, mode, &makespan, &max_span) == ZB_OK;
  zb_schedule_free(low);
  *key = span ? max_span : makespan;
  return ok;
}

/* A lower bound, under c, of the figure the request is judged by for any
 * plan of family sf's placement: every rank works its whole share, and
 * (for the makespan) rank r starts no earlier than the forwards of
 * stages 0..r-1, each with its hop, that its first stage r waits for. */
static double search_bound(const search_state *st, const search_fam *sf, const zb_costs *c) {
  int p = st->req->p, v = sf->v, m = st->req->m;
  zb_placement pl = zb_family_placement(sf->family);
  double *busy = zb_calloc((size_t)p, sizeof *busy), start = 0, bound = 0;
  for (int s = 0; s < p * v; s++)
    busy[zb_placement_rank(pl, p, v, s)] += m * (c->t_f[s] + c->t_b[s] + c->t_w[s]);
  bool span = st->req->objective == ZB_OBJ_SPAN;
  for (int r = 0; r < p; r++) {
    double at = (span ? 0 : start) + busy[r];
    bound = at > bound ? at : bound;
    start += c->t_f[r] + c->t_comm;
  }
  free(busy);
  return bound;
}

/* Plans family k at level (absolute; 0: its own), keeps it when it fits
 * the limit and beats the best; *peak (when given) its peak, or -1. With
 * prune, a family whose bound cannot beat the best is not planned (its
 * peak then unknown): not while the peaks make the ladder, whose rungs
 * must not depend on what was found first. */
static void search_try(search_state *st, int k, double level, bool prune, double *peak) {
  const search_fam *sf = &search_fams[k];
  if (peak)
    *peak = -1;
  zb_costs *c = search_costs(st, sf, level);
  if (c && prune && search_bound(st, sf, c) >= st->best_key - SEARCH_EPS * (1 + fabs(st->best_key))) {
    zb_costs_free(c);
    return;
  }
  zb_plan_request gen = {.family = sf->family,
                         .p = st->req->p,
                         .v = sf->v,
                         .m = st->req->m,
                         .costs = c,
                         .objective = st->req->objective};
  zb_schedule *s = NULL;
  if (c && zb_plan_generate(&gen, &s, NULL) == ZB_OK) {
    double at = zb_plan_peak(s, c), key;
    if (peak)
      *peak = at;
    if (at <= st->limit * (1 + SEARCH_EPS) + SEARCH_EPS && search_key(st, s, c, &key) &&
        key < st->best_key - SEARCH_EPS * (1 + fabs(key))) {
      st->best_key = key;
      st->best_fam = k;
      st->best_level = level;
    }
  }
  zb_schedule_free(s);
  zb_costs_free(c);
}

/* Adds a rung below the limit unless it is there already. */
static void search_add_rung(search_state *st, double level) {
  if (level <= 0 || level >= st->limit * (1 - SEARCH_EPS) || st->n_rungs == SEARCH_MAX_RUNGS)
    return;
  for (int i = 0; i < st->n_rungs; i++)
    if (fabs(st->rungs[i] - level) <= SEARCH_EPS * (1 + level))
      return;
  st->rungs[st->n_rungs++] = level;
}

/* Whether family k serves the request at all, and at this level: V-Half
 * and V-Min trade bubble for memory below 1F1B's peak and are not planned
 * within a limit at it or above (as they plan alone, they are);
 * zb-interleaved beyond 2 chunks not on large plans. */
static bool search_serves(const search_state *st, int k, double level) {
  const search_fam *sf = &search_fams[k];
  const zb_planner_request *req = st->req;
  if (search_open(req) ? false : sf->v != st->v)
    return false;
  if (zb_plan_check_shape(sf->family, req->p, sf->v, req->m, NULL) != ZB_OK)
    return false;
  if ((sf->family == ZB_FAMILY_V_HALF || sf->family == ZB_FAMILY_V_MIN) &&
      level >= st->one_f1b * (1 - SEARCH_EPS))
    return false;
  return !(sf->family == ZB_FAMILY_ZB_INTERLEAVED && sf->v > 2 && (double)req->p * sf->v * req->m > 16384);
}

/* Every family as it is (its peak a rung), then the limited ones at the
 * limit and at every rung below it. */
static void search_all(search_state *st) {
  bool ladder = (double)st->req->p * st->req->m * (st->v ? st->v : 1) <= SEARCH_LADDER_OPS;
  for (int k = 1; k * st->one_f1b < st->limit * (1 - SEARCH_EPS) && (ladder || k == 1); k++)
    search_add_rung(st, k * st->one_f1b);
  for (int k = 0; k < SEARCH_FAMS; k++) {
    double peak = -1;
    if (search_fams[k].family != ZB_FAMILY_ZB_AUTO && search_serves(st, k, 0))
      search_try(st, k, 0, !ladder, &peak);
    if (ladder)
      search_add_rung(st, peak);
  }
  for (int k = 0; k < SEARCH_FAMS; k++) {
    if (!search_fams[k].limited)
      continue;
    if (search_serves(st, k, st->limit))
      search_try(st, k, st->limit, true, NULL);
    for (int i = 0; i < st->n_rungs; i++)
      if (search_serves(st, k, st->rungs[i]))
        search_try(st, k, st->rungs[i], true, NULL);
  }
}

zb_err zb_planner_search(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out); /* the caller frees it either way */
  out->family = out->chosen = ZB_FAMILY_ZB_AUTO;
  search_state st = {.req = req, .v = req->v > 0 ? req->v : 1, .best_key = INFINITY, .best_fam = -1};
  if (search_open(req))
    st.v = 0;
  else if (req->costs && req->costs->n_stages % req->p == 0)
    st.v = req->costs->n_stages / req->p;
  zb_costs *base = search_costs(&st, &(search_fam){ZB_FAMILY_1F1B, st.v ? st.v : 1, false}, 0);
  if (!base)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "zb-auto: the costs do not describe %d ranks", req->p);
  double unit = zb_costs_rank_mf(base, ZB_PLACE_LOOP, req->p, st.v ? st.v : 1, 0);
  double given = req->costs ? req->costs->mem_limit : req->mem_limit * req->rank.m_f;
  st.one_f1b = req->p * unit;
  st.limit = given > 0 ? given : st.one_f1b; /* 1F1B's peak by default */
  zb_costs_free(base);
  search_all(&st);
  if (st.best_fam < 0)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE,
                       "zb-auto: no schedule of any placement fits %g x M_F per rank", st.limit / unit);
  const search_fam *win = &search_fams[st.best_fam];
  zb_costs *c = search_costs(&st, win, st.best_level);
  zb_planner_request run = *req;
  run.family = win->family;
  run.v = win->v;
  run.costs = c;
  zb_err err = zb_planner_run_family(&run, out, diag);
  zb_costs_free(c);
  out->family = ZB_FAMILY_ZB_AUTO;
  out->chosen = win->family;
  if (out->costs)
    out->costs->mem_limit = st.limit;
  return err;
}
