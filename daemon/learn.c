/* learn.c — what a job's sampled iterations teach (docs/wire.md,
 * Timelines): per-stage op times and T_comm learned from the aligned
 * timelines (a running average), the predicted bubble re-simulated from
 * them so that predicted and measured compare like with like, and the
 * ranks whose compute runs slow against the plan (stragglers). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_log.h"
#include "zb_reduce.h"

/* Weight of a new sampled iteration in the running average: recent enough
 * to follow drift within a few samples, smooth enough to ride out one
 * descheduled op. */
#define LEARN_ALPHA 0.3

static double blend(double old, double obs, bool first) {
  if (isnan(obs))
    return old;
  return first ? obs : old + LEARN_ALPHA * (obs - old);
}

/* Folds one iteration's costs into j->learned (started from the plan's
 * costs; restarted when the plan's stage count changed). */
static void learn_costs(coord_job *j, const zb_planner_result *pl, const zb_tl_costs *c) {
  if (j->learned && j->learned->n_stages != pl->costs->n_stages) {
    zb_costs_free(j->learned);
    j->learned = NULL;
  }
  bool first = !j->learned;
  if (first) {
    j->learned = zb_costs_clone(pl->costs);
    j->learned_iterations = 0;
  }
  zb_costs *l = j->learned;
  for (int s = 0; s < l->n_stages; s++) {
    l->t_f[s] = blend(l->t_f[s], c->t_f[s], first);
    l->t_b[s] = blend(l->t_b[s], c->t_b[s], first);
    l->t_w[s] = blend(l->t_w[s], c->t_w[s], first);
    l->t_reduce[s] = blend(l->t_reduce[s], c->t_reduce[s], first);
  }
  l->t_comm = blend(l->t_comm, c->t_comm, first);
  j->learned_iterations++;
}

/* The plan's lowered lists simulated under the learned costs. */
static void predict_learned(const coord_job *j, const zb_planner_result *pl, Zb__V1__IterationMetrics *it) {
  zb_sim_result *sim = NULL;
  if (!pl->lowered || zb_planner_predict(pl, j->learned, &sim, NULL) != ZB_OK)
    return;
  it->predicted_bubble_ratio = sim->bubble_ratio;
  it->predicted_bubble_ratio_paper = sim->bubble_ratio_paper;
  it->predicted_from_learned = true;
  zb_sim_result_free(sim);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Each rank's measured compute over its planned compute, against the
 * median rank's; ranks above COORD_STRAGGLER_RATIO into it->straggler_ranks
 * (allocated into *stragglers, which the caller frees after the event). */
static void find_stragglers(const zb_planner_result *pl, const zb_tl_summary *s, Zb__V1__RankIteration *ris,
                            Zb__V1__IterationMetrics *it, int32_t **stragglers) {
  int p = s->p;
  double *ratio = zb_malloc(sizeof(double) * (size_t)p), *sorted = zb_malloc(sizeof(double) * (size_t)p);
  for (int r = 0; r < p; r++) {
    double planned = pl->sim ? pl->sim->busy[r] : 0;
    ratio[r] = sorted[r] = planned > 0 ? s->compute[r] / planned : 1;
  }
  qsort(sorted, (size_t)p, sizeof(double), cmp_double);
  double median = p % 2 ? sorted[p / 2] : (sorted[p / 2 - 1] + sorted[p / 2]) / 2;
  *stragglers = zb_malloc(sizeof(int32_t) * (size_t)p);
  it->n_straggler_ranks = 0;
  for (int r = 0; r < p; r++) {
    ris[r].slowdown = median > 0 ? ratio[r] / median : 1;
    if (ris[r].slowdown > COORD_STRAGGLER_RATIO)
      (*stragglers)[it->n_straggler_ranks++] = r;
  }
  it->straggler_ranks = *stragglers;
  free(ratio);
  free(sorted);
}

/* Each stage's T_reduce over every replica's timelines into c (replica
 * 0's own kept when another's does not fit: zb_timeline_reduce_times). */
static void learn_reduce_all(const coord_job *j, const zb_tl_rank *ranks, int world, zb_tl_costs *c) {
  if (world <= j->spec.ranks)
    return;
  double *t = zb_malloc(sizeof(double) * (size_t)c->n_stages);
  zb_diag d = {{0}};
  if (zb_timeline_reduce_times(ranks, world, c->n_stages, t, &d) == ZB_OK)
    memcpy(c->t_reduce, t, sizeof(double) * (size_t)c->n_stages);
  else
    ZB_WARN("job %s: T_reduce learned from replica 0 only: %s", j->row.id, d.msg);
  free(t);
}

void job_learn(coord_job *j, const zb_planner_result *pl, const zb_tl_rank *ranks, int world,
               const zb_tl_summary *s, Zb__V1__RankIteration *ris, Zb__V1__IterationMetrics *it,
               int32_t **stragglers) {
  zb_tl_costs c = {0};
  zb_diag d = {{0}};
  if (pl->costs && zb_timeline_costs(ranks, s->p, pl->costs, &c, &d) == ZB_OK) {
    learn_reduce_all(j, ranks, world, &c);
    learn_costs(j, pl, &c);
    predict_learned(j, pl, it);
  } else if (pl->costs) {
    ZB_WARN("job %s: iteration %d: no costs learned: %s", j->row.id, it->iteration, d.msg);
  }
  zb_tl_costs_free(&c);
  find_stragglers(pl, s, ris, it, stragglers);
  if (!j->slowdown)
    j->slowdown = zb_calloc((size_t)s->p, sizeof(double));
  for (int r = 0; r < s->p; r++)
    j->slowdown[r] = ris[r].slowdown;
  for (size_t k = 0; k < it->n_straggler_ranks; k++)
    ZB_INFO(
        "job %s: iteration %d: rank %d is a straggler (compute %.2fx the median rank's, against the plan)",
        j->row.id, it->iteration, it->straggler_ranks[k], ris[it->straggler_ranks[k]].slowdown);
}

Zb__V1__LearnedCosts *job_learned_pb(const coord_job *j) {
  const zb_costs *l = j->learned;
  if (!l)
    return NULL;
  Zb__V1__LearnedCosts *pb = zb_malloc(sizeof *pb);
  zb__v1__learned_costs__init(pb);
  pb->n_stages = (size_t)l->n_stages;
  pb->stages = zb_malloc(sizeof *pb->stages * (size_t)(l->n_stages ? l->n_stages : 1));
  for (int s = 0; s < l->n_stages; s++) {
    pb->stages[s] = zb_malloc(sizeof **pb->stages);
    zb__v1__stage_costs__init(pb->stages[s]);
    pb->stages[s]->t_f = l->t_f[s];
    pb->stages[s]->t_b = l->t_b[s];
    pb->stages[s]->t_w = l->t_w[s];
  }
  if (zb_costs_reduces(l)) { /* one replica has no reduction to show */
    pb->n_stage_t_reduce = (size_t)l->n_stages;
    pb->stage_t_reduce = zb_malloc(sizeof(double) * (size_t)l->n_stages);
    memcpy(pb->stage_t_reduce, l->t_reduce, sizeof(double) * (size_t)l->n_stages);
  }
  pb->t_comm = l->t_comm;
  pb->iterations = j->learned_iterations;
  return pb;
}

/* ---- adaptive re-planning ---- */

/* The best plan of j's shape under the learned costs (none: *best left
 * empty, false). Families that keep each rank's stages: zb-auto for one
 * stage per rank, zb-interleaved for more on loop placement, the V
 * families for V placement. */
static bool adapt_best(const coord_job *j, zb_planner_result *best) {
  const zb_planner_result *cur = &j->plan;
  static const zb_family loop[] = {ZB_FAMILY_ZB_AUTO}, loop_v[] = {ZB_FAMILY_ZB_INTERLEAVED},
                         vee[] = {ZB_FAMILY_ZB_V, ZB_FAMILY_V_HALF, ZB_FAMILY_V_MIN};
  const zb_family *fams = cur->placement == ZB_PLACE_V ? vee : cur->v == 1 ? loop : loop_v;
  int n = cur->placement == ZB_PLACE_V ? 3 : 1;
  memset(best, 0, sizeof *best);
  for (int k = 0; k < n; k++) {
    zb_planner_request req = {.family = fams[k], .p = cur->p, .m = cur->m, .v = cur->v, .costs = j->learned};
    zb_planner_result r;
    /* each family's own generator (zb-auto the loop one, not its whole
     * choice among plans): this runs on the loop, within ADAPT_MAX_OPS */
    if (zb_planner_run_family(&req, &r, NULL) == ZB_OK && r.sim && r.placement == cur->placement &&
        r.v == cur->v && (!best->sim || r.sim->makespan < best->sim->makespan)) {
      zb_planner_result_free(best);
      *best = r;
    } else {
      zb_planner_result_free(&r);
    }
  }
  return best->sim != NULL;
}

/* A plan made under the learned costs carries the spec's costs again: the
 * assignment hands each rank its stages' op times (what a sim backend
 * sleeps, and what stragglers are measured against), which must stay the
 * job's own; its simulation is redone under them. */
static void adapt_spec_costs(zb_planner_result *plan, const zb_costs *spec_costs) {
  if (zb_planner_resimulate(plan, spec_costs, false, NULL) !=
      ZB_OK) { /* keep the spec's costs all the same */
    zb_costs_free(plan->costs);
    plan->costs = zb_costs_clone(spec_costs);
  }
}

/* Planning runs on the coordinator's loop between two reports: shapes
 * whose plans take long (zb-auto at p = 128, m = 4096 takes seconds) are
 * not re-planned adaptively, so no report waits past its deadline. */
#define ADAPT_MAX_OPS 65536

void job_adapt(coord *co, coord_job *j) {
  const zb_adaptive_spec *a = &j->spec.adaptive;
  int at = j->max_reported + 3; /* as UpdateSchedule: an iteration no rank has started */
  if (!zb_job_spec_adaptive(&j->spec) || !j->learned || j->switch_at >= 0 || !j->plan.lowered ||
      j->recovered || j->learned_iterations % a->check_every != 0 || at >= j->spec.iterations)
    return;
  if ((long long)j->plan.p * j->plan.v * j->plan.m > ADAPT_MAX_OPS) {
    if (j->learned_iterations == a->check_every)
      ZB_WARN("job %s: p x chunks x m = %lld is beyond adaptive re-planning's %d; not re-planned", j->row.id,
              (long long)j->plan.p * j->plan.v * j->plan.m, ADAPT_MAX_OPS);
    return;
  }
  zb_sim_result *now = NULL;
  if (zb_planner_predict(&j->plan, j->learned, &now, NULL) != ZB_OK)
    return;
  zb_planner_result best;
  if (adapt_best(j, &best)) {
    double was = now->makespan, will = best.sim->makespan, gain = was > 0 ? (was - will) / was : 0;
    ZB_DEBUG("job %s: adaptive check: running plan %.4g s, best %s %.4g s under the learned costs", j->row.id,
             was, zb_family_name(best.family), will);
    if (gain > a->min_gain) {
      snprintf(
          j->row.reason, sizeof j->row.reason,
          "adaptive re-plan: %s from iteration %d: predicted makespan %.4g s -> %.4g s (-%.1f%%) under the "
          "costs learned from %d sampled iteration(s)",
          zb_family_name(best.family), at, was, will, 100 * gain, j->learned_iterations);
      ZB_INFO("job %s: %s", j->row.id, j->row.reason);
      snprintf(j->spec.schedule, sizeof j->spec.schedule, "%s", zb_family_name(best.family));
      adapt_spec_costs(&best, j->plan.costs);
      job_switch_plan(j, &best, at);
      job_event(co, j, NULL, NULL);
    }
  }
  zb_planner_result_free(&best);
  zb_sim_result_free(now);
}
