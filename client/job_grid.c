/* job_grid.c — zbctl get's lines on where a job's ranks run: runs of ranks
 * on one host, and for a data-parallel job the grid of replicas x stages
 * with each cell's worker, host and state (docs/formats.md, Data
 * parallelism; global rank = replica x p + pipeline rank). */
#include <stdio.h>
#include <string.h>

#include "zb/v1/zb.pb-c.h"
#include "zbctl.h"

/* "hosts      ranks 0-3 on a, 4-7 on b": runs of ranks on one host. */
static void print_rank_hosts(const Zb__V1__Job *j) {
  if (!j->n_rank_hosts)
    return;
  printf("hosts      ranks");
  for (size_t r = 0, first = 0; r < j->n_rank_hosts; r++)
    if (r + 1 == j->n_rank_hosts || strcmp(j->rank_hosts[r + 1], j->rank_hosts[r]) != 0) {
      printf("%s %zu", first ? "," : "", first);
      if (r > first)
        printf("-%zu", r);
      printf(" on %s", j->rank_hosts[r]);
      first = r + 1;
    }
  printf("\n");
}

/* replica R  stage S: WORKER@HOST STATE, ... one line per replica. */
static void print_grid(const Zb__V1__Job *j) {
  const Zb__V1__JobSpec *s = j->spec;
  int d = s->data_parallel > 0 ? s->data_parallel : 1, p = s->ranks;
  if (p < 1 || j->n_rank_workers != (size_t)d * (size_t)p)
    return;
  printf("grid       %d replicas x %d stages, rank_order %s\n", d, p,
         s->rank_order && s->rank_order[0] ? s->rank_order : "pipelines");
  for (int rep = 0; rep < d; rep++) {
    printf("replica %-3d", rep);
    for (int r = 0; r < p; r++) {
      size_t g = (size_t)rep * (size_t)p + (size_t)r;
      const char *host = g < j->n_rank_hosts ? j->rank_hosts[g] : "?";
      const char *state = g < j->n_rank_states ? j->rank_states[g] : "?";
      printf("%s stage %d: %s@%s %s", r ? "," : "", r, j->rank_workers[g], host, state);
    }
    printf("\n");
  }
}

void zbctl_print_placement(const Zb__V1__Job *j) {
  print_rank_hosts(j);
  if (j->spec && j->spec->data_parallel > 1)
    print_grid(j);
}
