/* zbtest_job.c — see zbtest_job.h. */
#include <stdio.h>
#include <string.h>

#include "zbtest_job.h"

void zbt_job_free(zbt_job *j) {
  zb_costs_free(j->costs);
  zb_schedule_free(j->lowered);
  zb_sim_result_free(j->sim);
  memset(j, 0, sizeof *j);
}

bool zbt_job_make(zb_family f, int p, int m, const zb_rank_costs *rc, zbt_job *j) {
  memset(j, 0, sizeof *j);
  j->f = f;
  j->p = p;
  j->m = m;
  j->v = zb_family_default_chunks(f);
  j->S = p * j->v;
  j->placement = zb_family_placement(f);
  if (zb_plan_check_shape(f, p, j->v, m, NULL) != ZB_OK)
    return false;
  zb_rank_costs def = zb_rank_costs_default();
  j->costs = zb_costs_from_rank_share(p, j->v, rc ? rc : &def, 0);
  zb_plan_request req = {.family = f, .p = p, .v = j->v, .m = m, .costs = j->costs};
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  bool ok = zb_plan_generate(&req, &s, &d) == ZB_OK && zb_lower(s, j->costs, &j->lowered, &d) == ZB_OK &&
            zb_simulate(j->lowered, j->costs, &j->sim, &d) == ZB_OK;
  if (!ok)
    fprintf(stderr, "  %s p=%d m=%d: %s\n", zb_family_name(f), p, m, d.msg);
  zb_schedule_free(s);
  return ok;
}

int zbt_job_stages(const zbt_job *j, int r, int *stages) {
  int n = 0;
  for (int s = 0; s < j->S; s++)
    if (zb_placement_rank(j->placement, j->p, j->v, s) == r)
      stages[n++] = s;
  return n;
}
