/* job_measured.c — zbctl's lines for what the timelines measured
 * (docs/wire.md, Timelines): a sampled iteration's aligned figures and
 * stragglers (watch, get), and the costs learned from them beside the
 * spec's (get). */
#include <stdio.h>

#include "zb/v1/zb.pb-c.h"
#include "zbctl.h"

void zbctl_print_sampled(const Zb__V1__IterationMetrics *it) {
  if (!it->aligned)
    return;
  printf("  timelines: span %.4f s, bubble %.4f (paper %.4f), predicted %.4f (paper %.4f) from %s costs\n",
         it->span_seconds, it->bubble_ratio, it->bubble_ratio_paper, it->predicted_bubble_ratio,
         it->predicted_bubble_ratio_paper, it->predicted_from_learned ? "the learned" : "the spec's");
  printf("  comm wait (of span):");
  for (size_t r = 0; r < it->n_ranks; r++) {
    const Zb__V1__RankIteration *ri = it->ranks[r];
    printf(" r%d:%.3f", ri->rank, it->span_seconds > 0 ? ri->span_comm_seconds / it->span_seconds : 0.0);
  }
  printf("\n");
  for (size_t k = 0; k < it->n_straggler_ranks; k++) {
    int r = it->straggler_ranks[k];
    double slow = r >= 0 && (size_t)r < it->n_ranks ? it->ranks[r]->slowdown : 0;
    printf("  straggler: rank %d computes %.2fx the median rank's time against the plan\n", r, slow);
  }
}

void zbctl_print_learned(const Zb__V1__Job *j) {
  const Zb__V1__LearnedCosts *l = j->learned;
  if (!l || !l->n_stages)
    return;
  const Zb__V1__JobSpec *s = j->spec;
  printf("learned    from %d sampled iteration(s): T_comm %.3g s", l->iterations, l->t_comm);
  if (s && s->costs)
    printf(" (spec %.3g s)", s->costs->t_comm);
  bool reduces = l->n_stage_t_reduce == l->n_stages; /* data-parallel replicas reduce */
  printf("\n  stage      T_F learned      T_B learned      T_W learned%s   (seconds)\n",
         reduces ? "   T_reduce learned" : "");
  for (size_t k = 0; k < l->n_stages; k++) {
    const Zb__V1__StageCosts *c = l->stages[k];
    printf("  %5zu %16.4g %16.4g %16.4g", k, c->t_f, c->t_b, c->t_w);
    if (reduces)
      printf(" %18.4g", l->stage_t_reduce[k]);
    printf("\n");
  }
  if (s && s->n_stage_costs == 0 && s->costs) {
    int v = l->n_stages && s->ranks > 0 ? (int)l->n_stages / s->ranks : 1;
    printf("  spec  (each stage) %10.4g %16.4g %16.4g", s->costs->t_f / v, s->costs->t_b / v,
           s->costs->t_w / v);
    if (reduces && s->costs->t_reduce > 0)
      printf(" %18.4g", s->costs->t_reduce / v);
    else if (reduces) /* derived from the model's bytes and the link (docs/schedules.md) */
      printf(" %18s", "from the link");
    printf("\n");
  }
}
