/* zb_plan_keep.c — what the cost-aware generators compare and improve
 * candidates with: the memory-limit check, the score (makespan and
 * longest span) and its order, keeping the better of two, the local
 * search that moves a W out of the way of the op it delays, whether costs
 * are even, and the best greedy schedule within the limit. Calls only the
 * greedy (zb_plan_greedy.c) and the simulator, never a family's
 * generator. */
#include <math.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_plan_internal.h"
#include "zb_sim.h"

#define ZB_EPS 1e-9

double zb_plan_peak(const zb_schedule *s, const zb_costs *c) {
  double peak = 0;
  for (int r = 0; r < s->p; r++) {
    double mem = 0;
    for (int i = 0; i < s->ranks[r].n; i++) {
      mem += zb_costs_mem(c, s->ranks[r].actions[i].op, s->ranks[r].actions[i].stage);
      peak = mem > peak ? mem : peak;
    }
  }
  return peak;
}

bool zb_plan_fits_memory(const zb_schedule *s, const zb_costs *c) {
  double lim = c->mem_limit;
  return lim <= 0 || zb_plan_peak(s, c) <= lim + ZB_EPS * (1 + fabs(lim));
}

bool zb_plan_score_of(const zb_schedule *s, const zb_costs *c, zb_objective obj, zb_plan_score *out) {
  out->objective = obj;
  return zb_simulate_makespan_in_range(s, c, &out->makespan, &out->span) == ZB_OK;
}

bool zb_plan_score_better(zb_plan_score a, zb_plan_score b) {
  double a1 = a.makespan, a2 = a.span, b1 = b.makespan, b2 = b.span;
  if (a.objective == ZB_OBJ_SPAN) {
    a1 = a.span, a2 = a.makespan, b1 = b.span, b2 = b.makespan;
  }
  double tol = 1e-9 * (1 + fabs(b1));
  if (a1 < b1 - tol)
    return true;
  if (a1 > b1 + tol)
    return false;
  return a2 < b2 - tol;
}

/* The figure a score is not ranked by first. */
static double score_other(zb_plan_score a) {
  return a.objective == ZB_OBJ_SPAN ? a.makespan : a.span;
}

bool zb_plan_score_better_capped(zb_plan_score a, zb_plan_score b, double cap) {
  double oa = score_other(a), ob = score_other(b), tol = 1e-9 * (1 + fabs(cap));
  if (cap > 0 && (oa > cap + tol || ob > cap + tol) && fabs(oa - ob) > tol)
    return oa < ob;
  return zb_plan_score_better(a, b);
}

/* Whether `later` needs `earlier` (both on one rank): the same-rank edges
 * of the dependencies in docs/schedules.md. */
static bool refine_depends(const zb_action *later, const zb_action *earlier) {
  if (later->mb != earlier->mb)
    return false;
  bool eb = earlier->op == ZB_OP_B || earlier->op == ZB_OP_BW;
  switch (later->op) {
  case ZB_OP_F: return earlier->op == ZB_OP_F && earlier->stage == later->stage - 1;
  case ZB_OP_B:
  case ZB_OP_BW:
    return (earlier->op == ZB_OP_F && earlier->stage == later->stage) ||
           (eb && earlier->stage == later->stage + 1);
  case ZB_OP_W: return earlier->op == ZB_OP_B && earlier->stage == later->stage;
  default: return false;
  }
}

/* A swap of two neighbours is a candidate move when the second does not
 * need the first and they are not the same kind of op of one stage (whose
 * microbatch order stays as generated). */
static bool refine_can_swap(const zb_action *first, const zb_action *second) {
  if (first->op == second->op && first->stage == second->stage)
    return false;
  return !refine_depends(second, first);
}

/* Walks the critical path back from the op that decides the objective
 * (last op of the latest rank, or of the longest span) and collects the
 * places where a W ran right before an F/B whose input was already there:
 * that W delayed the path. Writes up to max (rank, index-of-W) pairs. */
static int refine_candidates(const zb_schedule *s, const zb_costs *c, const zb_sim_result *sim,
                             zb_objective obj, int *cand_rank, int *cand_idx, int max) {
  int p = s->p, S = zb_schedule_stages(s), m = s->m;
  int r = 0;
  double best = -1;
  for (int k = 0; k < p; k++) {
    double key = obj == ZB_OBJ_SPAN ? sim->span_end[k] - sim->span_start[k] : sim->span_end[k];
    if (key > best) {
      best = key;
      r = k;
    }
  }
  /* where each F and B/BW of (stage, mb) sits */
  size_t cells = (size_t)S * m;
  int *f_at = zb_malloc(sizeof(int) * cells * 2), *b_at = f_at + cells;
  for (size_t k = 0; k < 2 * cells; k++)
    f_at[k] = -1;
  for (int k = 0; k < p; k++)
    for (int i = 0; i < s->ranks[k].n; i++) {
      const zb_action *a = &s->ranks[k].actions[i];
      if (a->op == ZB_OP_F)
        f_at[(size_t)a->stage * m + a->mb] = k * 0x100000 + i;
      else if (a->op == ZB_OP_B || a->op == ZB_OP_BW)
        b_at[(size_t)a->stage * m + a->mb] = k * 0x100000 + i;
    }
  int n = 0, i = s->ranks[r].n - 1;
  while (i >= 0 && n < max) {
    const zb_action *a = &s->ranks[r].actions[i];
    double st = sim->start[r][i];
    /* the producer that feeds a and when its output arrived */
    int prod = -1;
    double ready = 0;
    if (a->op == ZB_OP_F && a->stage > 0)
      prod = f_at[(size_t)(a->stage - 1) * m + a->mb];
    else if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage < S - 1)
      prod = b_at[(size_t)(a->stage + 1) * m + a->mb];
    else if (a->op == ZB_OP_W || a->op == ZB_OP_B || a->op == ZB_OP_BW)
      prod = a->op == ZB_OP_W ? b_at[(size_t)a->stage * m + a->mb] : f_at[(size_t)a->stage * m + a->mb];
    if (prod >= 0) {
      int pr = prod / 0x100000, pi = prod % 0x100000;
      ready = sim->end[pr][pi] + (pr != r ? c->t_comm : 0);
    }
    bool resource_bound = i > 0 && st <= sim->end[r][i - 1] + 1e-9 && ready < st - 1e-9;
    if (resource_bound || prod < 0) {
      if (resource_bound && refine_can_swap(&s->ranks[r].actions[i - 1], a)) {
        cand_rank[n] = r;
        cand_idx[n++] = i - 1;
      }
      i--;
    } else {
      r = prod / 0x100000;
      i = prod % 0x100000;
    }
  }
  free(f_at);
  return n;
}

/* Local search after the greedy (see zb_plan_internal.h): first
 * improvement over the swaps found on the current critical path (the
 * other figure's while that is over cap), until a pass finds none or
 * max_evals simulations are spent. */
void zb_plan_refine_capped(zb_schedule *s, const zb_costs *c, zb_objective obj, double cap, int max_evals) {
  zb_plan_score best;
  if (!zb_plan_score_of(s, c, obj, &best))
    return;
  enum { MAX_CAND = 64 };
  int cr[MAX_CAND], ci[MAX_CAND];
  int evals = 0;
  bool improved = true;
  while (improved && evals < max_evals) {
    improved = false;
    zb_sim_result *sim = NULL;
    if (zb_simulate(s, c, &sim, NULL) != ZB_OK)
      return;
    bool over = cap > 0 && score_other(best) > cap + 1e-9 * (1 + cap);
    zb_objective path = over ? (obj == ZB_OBJ_SPAN ? ZB_OBJ_MAKESPAN : ZB_OBJ_SPAN) : obj;
    int n = refine_candidates(s, c, sim, path, cr, ci, MAX_CAND);
    zb_sim_result_free(sim);
    for (int k = 0; k < n && evals < max_evals && !improved; k++) {
      zb_action *w = &s->ranks[cr[k]].actions[ci[k]], *next = w + 1;
      zb_action tmp = *w;
      *w = *next;
      *next = tmp;
      zb_plan_score sc;
      evals++;
      if (zb_plan_fits_memory(s, c) && zb_plan_score_of(s, c, obj, &sc) &&
          zb_plan_score_better_capped(sc, best, cap)) {
        best = sc;
        improved = true;
      } else {
        *next = *w;
        *w = tmp;
      }
    }
  }
}

void zb_plan_refine(zb_schedule *s, const zb_costs *c, zb_objective obj, int max_evals) {
  zb_plan_refine_capped(s, c, obj, 0, max_evals);
}

void zb_plan_keep(zb_schedule **best, zb_plan_score *best_score, zb_schedule *cand,
                  const zb_plan_score *known, const zb_costs *c, zb_objective obj) {
  zb_plan_keep_capped(best, best_score, cand, known, c, obj, 0);
}

void zb_plan_keep_capped(zb_schedule **best, zb_plan_score *best_score, zb_schedule *cand,
                         const zb_plan_score *known, const zb_costs *c, zb_objective obj, double cap) {
  zb_plan_score sc;
  if (!cand)
    return;
  if (known)
    sc = *known;
  else if (!zb_plan_fits_memory(cand, c) || !zb_plan_score_of(cand, c, obj, &sc)) {
    zb_schedule_free(cand);
    return;
  }
  if (!*best || zb_plan_score_better_capped(sc, *best_score, cap)) {
    zb_schedule_free(*best);
    *best = cand;
    *best_score = sc;
  } else {
    zb_schedule_free(cand);
  }
}

/* Whether the greedy schedule admitting k microbatches at stage 0 gets
 * through (it sticks when the memory limit blocks the F that would feed a
 * B). Probed on at most vp + 2 microbatches: getting stuck happens during
 * the warm-up, which that covers, and the probe costs a fraction of a run. */
static bool greedy_admits(int p, int v, int m, zb_placement pl, const zb_costs *c, int *cap, int k) {
  int mp = m < v * p + 2 ? m : v * p + 2;
  cap[0] = k;
  zb_schedule *s = zb_plan_greedy(p, v, mp, pl, c, cap, ZB_W_GAP, ZB_OBJ_MAKESPAN, NULL);
  zb_schedule_free(s);
  return s != NULL;
}

zb_schedule *zb_plan_greedy_search(int p, int v, int m, zb_placement pl, const zb_costs *c) {
  int S = v * p;
  int *cap = zb_calloc((size_t)S, sizeof(int));
  /* lo admits, hi + 1 does not. Start at what the limit holds of stage 0's
   * M_F, where the answer usually lies, and step out from there. */
  int lo = 0, hi = S, k = S;
  if (c->mem_limit > 0 && c->m_f[0] > 0 && c->mem_limit / c->m_f[0] < k)
    k = (int)(c->mem_limit / c->m_f[0] + 1e-9);
  k = k > 1 ? k : 1;
  for (int step = 1; lo < hi; step = step < S ? 2 * step : S) { /* the range shrinks each pass */
    if (greedy_admits(p, v, m, pl, c, cap, k)) {
      lo = k;
      k = k + step < hi ? k + step : hi;
    } else {
      hi = k - 1;
      k = k - step > lo ? k - step : lo + 1;
    }
    if (k <= lo || k > hi) /* bracketed: bisect */
      k = (lo + hi + 1) / 2;
  }
  zb_schedule *best = NULL;
  zb_plan_score best_score = {INFINITY, INFINITY, ZB_OBJ_MAKESPAN};
  const struct { int k, w_policy; } runs[] = {{lo * 9 / 10, ZB_W_GAP}, {lo, ZB_W_GAP}};
  for (size_t i = 0; lo > 0 && i < sizeof runs / sizeof runs[0]; i++) {
    if (runs[i].k < 1 || (i > 0 && runs[i].k == runs[i - 1].k))
      continue;
    cap[0] = runs[i].k;
    zb_plan_score sc;
    zb_schedule *cand = zb_plan_greedy(p, v, m, pl, c, cap, runs[i].w_policy, ZB_OBJ_MAKESPAN, &sc);
    if (cand && (!best || zb_plan_score_better(sc, best_score))) {
      zb_schedule_free(best);
      best = cand;
      best_score = sc;
    } else {
      zb_schedule_free(cand);
    }
  }
  /* the probe saw only the first vp + 2 microbatches: walk down if it erred */
  for (int j = lo - 1; !best && j >= 1; j--) {
    cap[0] = j;
    best = zb_plan_greedy(p, v, m, pl, c, cap, ZB_W_GAP, ZB_OBJ_MAKESPAN, NULL);
  }
  free(cap);
  return best;
}

bool zb_plan_costs_even(const zb_costs *c) {
  for (int s = 0; s < c->n_stages; s++)
    if (c->t_f[s] != c->t_b[s] || c->t_b[s] != c->t_w[s] || c->t_f[s] != c->t_f[0])
      return false;
  return c->t_comm == 0;
}
