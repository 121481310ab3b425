/* zbtest_job.c — see zbtest_job.h. */
#include "zbtest_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_assignment.h"

void zbt_job_free(zbt_job *j) {
  zb_costs_free(j->costs);
  zb_schedule_free(j->lowered);
  zb_sim_result_free(j->sim);
  memset(j, 0, sizeof *j);
}

/* Rank r's list as a worker decodes it from its packed Assignment, into
 * j->lowered; false (printed) when it differs from the planned list. */
static bool decode_rank(const zb_assignment_src *src, int r, zbt_job *j) {
  Zb__V1__Assignment a;
  zb_assignment_encode(src, r, &a);
  size_t n = protobuf_c_message_get_packed_size(&a.base);
  uint8_t *buf = zb_malloc(n ? n : 1);
  protobuf_c_message_pack(&a.base, buf);
  zb_assignment_encode_clear(&a);
  Zb__V1__Assignment *back =
      (Zb__V1__Assignment *)protobuf_c_message_unpack(&zb__v1__assignment__descriptor, NULL, n, buf);
  free(buf);
  zb_assignment got;
  zb_diag d = {{0}};
  bool ok = back && zb_assignment_decode(back, &got, &d) == ZB_OK;
  if (back)
    protobuf_c_message_free_unpacked(&back->base, NULL);
  const zb_rank_list *want = &src->plan->lowered->ranks[r];
  if (ok) {
    const zb_rank_list *l = &got.sched->ranks[r];
    ok = l->n == want->n;
    for (int i = 0; i < l->n; i++) {
      const zb_action *x = &l->actions[i], *y = &want->actions[i];
      ok = ok && x->op == y->op && x->stage == y->stage && x->mb == y->mb && x->peer == y->peer &&
           x->batch == y->batch;
      zb_schedule_push(j->lowered, r, *x);
    }
    if (!ok)
      snprintf(d.msg, sizeof d.msg, "the decoded list differs from the planned one");
  }
  zb_assignment_free(&got);
  if (!ok)
    fprintf(stderr, "  %s p=%d m=%d rank %d: %s\n", zb_family_name(j->f), j->p, j->m, r, d.msg);
  return ok;
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
  zb_planner_request req = {.family = f, .p = p, .m = m, .rank = rc ? *rc : zb_rank_costs_default()};
  zb_planner_result pl;
  zb_diag d = {{0}};
  if (zb_planner_run(&req, &pl, &d) != ZB_OK) {
    fprintf(stderr, "  %s p=%d m=%d: %s\n", zb_family_name(f), p, m, d.msg);
    zb_planner_result_free(&pl);
    return false;
  }
  /* zb-auto searches every placement: the plan says what it chose */
  j->v = pl.v;
  j->S = p * pl.v;
  j->placement = pl.placement;
  zb_job_spec spec;
  zb_job_spec_default(&spec);
  zb_assignment_src src = {.job_id = "j-test", .spec = &spec, .plan = &pl, .plan_version = 1};
  j->lowered = zb_schedule_new(p, j->v, m, j->placement);
  bool ok = true;
  for (int r = 0; r < p && ok; r++)
    ok = decode_rank(&src, r, j);
  /* the plan's own costs and simulation: the decoded lists are the same */
  j->costs = pl.costs;
  j->sim = pl.sim;
  pl.costs = NULL;
  pl.sim = NULL;
  zb_planner_result_free(&pl);
  return ok;
}

int zbt_job_stages(const zbt_job *j, int r, int *stages) {
  int n = 0;
  for (int s = 0; s < j->S; s++)
    if (zb_placement_rank(j->placement, j->p, j->v, s) == r)
      stages[n++] = s;
  return n;
}
