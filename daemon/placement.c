/* placement.c — which idle workers a starting job's global ranks go to
 * (docs/formats.md, Data parallelism): host by host, the hosts with the
 * most idle workers first, so that ranks consecutive in the job's
 * rank_order share a host where they can (a replica's pipeline stages for
 * pipelines, a stage group's replicas for stages); within a host in attach
 * order. Sorting keeps it O(n log n) in the attached workers. A torch
 * job's candidates are its run's agents, one per rank (worker_can_run):
 * each takes the rank it is bound to (docs/pytorch.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_jobspec_dp.h"

/* An idle worker able to run the job, with its place in attach order. */
typedef struct candidate {
  coord_worker *w;
  int order;
} candidate;

/* Hosts grouped, attach order within a host. */
static int by_host(const void *a, const void *b) {
  const candidate *x = a, *y = b;
  int c = strcmp(x->w->hostname, y->w->hostname);
  return c ? c : x->order - y->order;
}

/* One host's run in the sorted candidates. */
typedef struct host_run {
  int start, n;
  int first; /* attach order of its first worker */
} host_run;

/* Most idle workers first; ties in attach order. */
static int by_size(const void *a, const void *b) {
  const host_run *x = a, *y = b;
  return x->n != y->n ? y->n - x->n : x->first - y->first;
}

/* The global rank the k-th taken worker gets: in rank order (a replica's
 * p ranks consecutive) for rank_order pipelines; stage group by stage
 * group (pipeline rank k / d of replica k % d) for stages. */
int placement_rank_at(const zb_job_spec *s, int k) {
  if (strcmp(s->rank_order, ZB_RANK_ORDER_STAGES) != 0)
    return k;
  int d = s->data_parallel;
  return zb_dp_global(k % d, k / d, s->ranks);
}

void job_take_workers(coord *co, coord_job *j) {
  int p = zb_job_spec_world(&j->spec), n = 0, r = 0, n_runs = 0;
  j->ranks = zb_calloc((size_t)p, sizeof *j->ranks);
  j->rank_hosts = zb_calloc((size_t)p, sizeof *j->rank_hosts);
  j->rank_workers = zb_calloc((size_t)p, sizeof *j->rank_workers);
  int total = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    total++;
  candidate *c = zb_calloc((size_t)(total ? total : 1), sizeof *c);
  host_run *runs = zb_calloc((size_t)(total ? total : 1), sizeof *runs);
  int order = 0;
  for (coord_worker *w = co->workers; w; w = w->next, order++)
    if (!w->job && worker_can_run(w, &j->spec))
      c[n++] = (candidate){w, order};
  qsort(c, (size_t)n, sizeof *c, by_host);
  for (int k = 0; k < n; k++)
    if (k == 0 || strcmp(c[k].w->hostname, c[k - 1].w->hostname) != 0)
      runs[n_runs++] = (host_run){k, 1, c[k].order};
    else
      runs[n_runs - 1].n++;
  qsort(runs, (size_t)n_runs, sizeof *runs, by_size);
  for (int h = 0; h < n_runs && r < p; h++)
    for (int k = runs[h].start; k < runs[h].start + runs[h].n && r < p; k++) {
      coord_worker *w = c[k].w;
      int g = w->torch_run[0] ? w->torch_rank : placement_rank_at(&j->spec, r); /* bound: its own */
      r++;
      w->job = j;
      w->rank = g;
      snprintf(j->rank_hosts[g], sizeof j->rank_hosts[g], "%s", w->hostname);
      snprintf(j->rank_workers[g], sizeof j->rank_workers[g], "%s", w->id);
      j->ranks[g] = w;
    }
  free(c);
  free(runs);
}
