/* zb_planner_search.c — zb-auto over every placement (docs/schedules.md,
 * zb-auto): when a zb-auto request leaves the chunks open and gives its
 * costs as one rank's share, every family is planned at that shape (the
 * loop zb-auto and zb-interleaved, and the V families, within the request's
 * memory limit; the handcrafted ones as they are), compute-only, and the
 * one with the best objective whose peak fits the limit is planned in
 * full. The named families are its candidates, so it is never behind any
 * of them at its limit; the result says which it chose. */
#include <math.h>
#include <string.h>

#include "zb_plan_internal.h"
#include "zb_planner.h"

bool zb_planner_searches(const zb_planner_request *req) {
  return req->family == ZB_FAMILY_ZB_AUTO && req->v == 0 && !req->costs && req->n_stage_times == 0;
}

typedef struct search_cand {
  zb_family family;
  int v;
  bool limited; /* planned within the request's limit (else its own) */
} search_cand;

static const search_cand search_cands[] = {
    {ZB_FAMILY_ZB_AUTO, 1, true},
    {ZB_FAMILY_1F1B, 1, false},
    {ZB_FAMILY_GPIPE, 1, false},
    {ZB_FAMILY_ZB_H1, 1, false},
    {ZB_FAMILY_ZB_H2, 1, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 2, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 3, false},
    {ZB_FAMILY_INTERLEAVED_1F1B, 4, false},
    {ZB_FAMILY_ZB_V, 2, true},
    {ZB_FAMILY_V_HALF, 2, true},
    {ZB_FAMILY_V_MIN, 2, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 2, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 3, true},
    {ZB_FAMILY_ZB_INTERLEAVED, 4, true},
};

/* Candidates left out to keep the search quick: V-Half and V-Min when the
 * limit holds ZB-V (1F1B's peak, which they trade bubble for), and
 * zb-interleaved beyond 2 chunks on large plans (p v m above 16384). */
static bool search_skips(const zb_planner_request *req, const search_cand *sc, double limit) {
  if ((sc->family == ZB_FAMILY_V_HALF || sc->family == ZB_FAMILY_V_MIN) && limit >= req->p)
    return true;
  return sc->family == ZB_FAMILY_ZB_INTERLEAVED && sc->v > 2 && (double)req->p * sc->v * req->m > 16384;
}

/* Generates candidate sc under the request's rank costs (its limit for a
 * limited one) and scores it: the objective (makespan, or the longest
 * rank span) and whether it fits the limit. Generation and the fast
 * simulation only: the winner is validated when it is planned in full. */
static bool search_score(const zb_planner_request *req, const search_cand *sc, double limit, double *key) {
  zb_costs *c = zb_costs_from_rank_share(req->p, sc->v, &req->rank, sc->limited ? limit * req->rank.m_f : 0);
  zb_plan_request gen = {
      .family = sc->family, .p = req->p, .v = sc->v, .m = req->m, .costs = c, .objective = req->objective};
  zb_schedule *s = NULL;
  double makespan, span;
  bool ok = zb_costs_check(c, NULL) == ZB_OK && zb_plan_generate(&gen, &s, NULL) == ZB_OK;
  c->mem_limit = limit * req->rank.m_f; /* the fit is judged by the request's limit */
  ok = ok && zb_plan_fits_memory(s, c) && zb_simulate_makespan(s, c, &makespan, &span) == ZB_OK;
  *key = req->objective == ZB_OBJ_SPAN ? span : makespan;
  zb_schedule_free(s);
  zb_costs_free(c);
  return ok;
}

zb_err zb_planner_search(const zb_planner_request *req, zb_planner_result *out, zb_diag *diag) {
  memset(out, 0, sizeof *out); /* the caller frees it either way */
  out->family = out->chosen = ZB_FAMILY_ZB_AUTO;
  double limit = req->mem_limit > 0 ? req->mem_limit : req->p; /* 1F1B's peak by default */
  int best = -1;
  double best_key = INFINITY;
  for (int k = 0; k < (int)(sizeof search_cands / sizeof search_cands[0]); k++) {
    const search_cand *sc = &search_cands[k];
    double key;
    if (zb_plan_check_shape(sc->family, req->p, sc->v, req->m, NULL) != ZB_OK ||
        search_skips(req, sc, limit) || !search_score(req, sc, limit, &key))
      continue;
    if (key < best_key - 1e-9) {
      best = k;
      best_key = key;
    }
  }
  if (best < 0)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE,
                       "zb-auto: no schedule of any placement fits %g x M_F per rank", limit);
  zb_planner_request win = *req;
  win.family = search_cands[best].family;
  win.v = search_cands[best].v;
  win.mem_limit = search_cands[best].limited ? limit : 0;
  zb_err err = zb_planner_run(&win, out, diag);
  out->family = ZB_FAMILY_ZB_AUTO;
  out->chosen = win.family;
  return err;
}
