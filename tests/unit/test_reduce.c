/* The gradient reduction of data x pipeline parallelism (zb_reduce.h;
 * docs/schedules.md, Gradient reduction): where lowering puts REDUCE_GRAD
 * and WAIT_REDUCE_GRAD, what the validator refuses, the simulator's two
 * modes worked by hand on p = 2, m = 2, and zb-auto pricing it. */
#include "zb_lower.h"
#include "zb_planner.h"
#include "zb_reduce.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

#define EPS 1e-9

/* Unit F, B, W, no comm time, t_reduce r on every stage; no memory limit. */
static zb_costs *red_costs(int stages, double r) {
  zb_costs *c = zb_costs_new(stages);
  for (int s = 0; s < stages; s++) {
    c->t_f[s] = c->t_b[s] = c->t_w[s] = 1;
    c->m_f[s] = 1;
    c->m_b[s] = c->m_w[s] = -0.5;
    c->t_reduce[s] = r;
  }
  return c;
}

/* p = 2, two chunks a rank on loop placement (stages 0, 2 on rank 0; 1, 3
 * on rank 1), m = 2: each rank runs its forwards, then its later stage's
 * B and W, then its earlier stage's. Stage 2's (3's) W end before stage
 * 0's (1's) B and W run: room to hide a reduction. */
static zb_schedule *red_tiny(void) {
  zb_schedule *s = zb_schedule_new(2, 2, 2, ZB_PLACE_LOOP);
  for (int r = 0; r < 2; r++) {
    int early = r, late = r + 2;
    zb_schedule_push_op(s, r, ZB_OP_F, early, 0);
    zb_schedule_push_op(s, r, ZB_OP_F, early, 1);
    zb_schedule_push_op(s, r, ZB_OP_F, late, 0);
    zb_schedule_push_op(s, r, ZB_OP_F, late, 1);
    for (int k = 0; k < 2; k++)
      for (int mb = 0; mb < 2; mb++) {
        zb_schedule_push_op(s, r, ZB_OP_B, k ? early : late, mb);
        zb_schedule_push_op(s, r, ZB_OP_W, k ? early : late, mb);
      }
  }
  return s;
}

static zb_sim_result *red_sim(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode) {
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_simulate_mode(s, c, mode, &r, &d);
  if (err)
    fprintf(stderr, "  simulation: %s\n", d.msg);
  return r;
}

/* Without reductions (worked by hand): rank 1's F(1,0) [1,2], F(1,1)
 * [2,3], F(3,*) [3,5], B/W of stage 3 [5,9], of stage 1 [9,13]; rank 0's
 * F(0,*) [0,2], F(2,*) [2,4], B/W of stage 2 [6,10] (B(2,0) waits for
 * B(3,0) at 6), of stage 0 [10,14]. Makespan 14. With t_reduce 2 a
 * stage, device-ordered, earliest: rank 0 reduces stage 2 over [10,12],
 * under B(0,0) and W(0,0), and stage 0 over [14,16]; rank 1 stage 3 over
 * [9,11], under B(1,0) and W(1,0), and stage 1 over [13,15]. Makespan 16,
 * each rank 4 of reduction, 2 hidden. At the end: rank 0 [14,18], rank 1
 * [13,17]: 18, none hidden. Host-blocking, earliest: rank 1 is held
 * [9,11], so B(1,0) [11,12], W(1,0) [12,13], B(1,1) [13,14], W(1,1)
 * [14,15], stage 1 [15,17]; rank 0 held [10,12], B(0,0) [12,13] (its
 * input at 12), ..., W(0,1) [15,16], stage 0 [16,18]: 18, none hidden;
 * at the end 18 too (the compute as without, then [14,18]). */
static void test_tiny_by_hand(void) {
  zb_schedule *plain = red_tiny(), *early = red_tiny(), *end = red_tiny();
  zb_costs *c = red_costs(4, 2);
  zb_reduce_insert(early, ZB_REDUCE_EARLIEST);
  zb_reduce_insert(end, ZB_REDUCE_AT_END);
  const struct {
    const zb_schedule *s;
    zb_sim_mode mode;
    double makespan, hidden;
  } want[] = {
      {plain, ZB_SIM_BLOCKING, 14, 0}, {plain, ZB_SIM_DEVICE, 14, 0},   {early, ZB_SIM_DEVICE, 16, 2},
      {end, ZB_SIM_DEVICE, 18, 0},     {early, ZB_SIM_BLOCKING, 18, 0}, {end, ZB_SIM_BLOCKING, 18, 0},
  };
  for (int k = 0; k < (int)(sizeof want / sizeof want[0]); k++) {
    zb_sim_result *r = red_sim(want[k].s, c, want[k].mode);
    CHECK(r);
    CHECK_MSG(fabs(r->makespan - want[k].makespan) < EPS, "case %d: makespan %g, expected %g", k, r->makespan,
              want[k].makespan);
    double total = want[k].s == plain ? 0 : 4;
    for (int q = 0; q < 2; q++) {
      CHECK_NEAR(r->reduce_time[q], total, EPS);
      CHECK_MSG(fabs(r->reduce_hidden[q] - want[k].hidden) < EPS, "case %d rank %d: hidden %g, expected %g",
                k, q, r->reduce_hidden[q], want[k].hidden);
      CHECK_NEAR(r->reduce_hidden[q] + r->reduce_exposed[q], r->reduce_time[q], EPS);
    }
    double mk = -1, span = -1;
    CHECK_EQ(zb_simulate_makespan_mode(want[k].s, c, want[k].mode, &mk, &span), ZB_OK);
    CHECK_NEAR(mk, r->makespan, EPS);
    zb_sim_result_free(r);
  }
  /* rank 0's stage-2 reduction, earliest and device-ordered: [10, 12],
   * right after W(2,1) (index 7) */
  zb_sim_result *r = red_sim(early, c, ZB_SIM_DEVICE);
  CHECK(r);
  CHECK_EQ(early->ranks[0].actions[8].op, ZB_OP_REDUCE_GRAD);
  CHECK_EQ(early->ranks[0].actions[8].stage, 2);
  CHECK_NEAR(r->start[0][8], 10, EPS);
  CHECK_NEAR(r->end[0][8], 12, EPS);
  zb_sim_result_free(r);
  zb_schedule_free(plain);
  zb_schedule_free(early);
  zb_schedule_free(end);
  zb_costs_free(c);
}

/* The same lists lowered (T_comm 0): lowering adds the reductions itself,
 * and the device-ordered run of the lowered lists keeps the hand figures. */
static void test_tiny_lowered(void) {
  zb_schedule *s = red_tiny(), *low = NULL;
  zb_costs *c = red_costs(4, 2);
  CHECK_EQ(zb_lower(s, c, &low, NULL), ZB_OK);
  CHECK(zb_schedule_has_reduce(low));
  zb_violation v;
  CHECK_EQ(zb_validate(low, c, &v), ZB_OK);
  zb_sim_result *r = red_sim(low, c, ZB_SIM_DEVICE);
  CHECK(r);
  CHECK_NEAR(r->makespan, 16, EPS);
  CHECK_NEAR(r->reduce_hidden[0] + r->reduce_hidden[1], 4, EPS);
  zb_sim_result_free(r);
  zb_schedule_free(low);
  zb_costs_free(c);
  zb_schedule_free(s);
}

/* Whether rank r's list has, for each stage it hosts, exactly one
 * REDUCE_GRAD, right after the stage's last W or BW (at_end: after every
 * other action but the reductions), and a WAIT_REDUCE_GRAD last. */
static bool red_placed(const zb_schedule *s, int r, bool at_end) {
  const zb_rank_list *l = &s->ranks[r];
  if (l->n == 0 || l->actions[l->n - 1].op != ZB_OP_WAIT_REDUCE_GRAD)
    return false;
  int first_reduce = l->n;
  for (int st = 0; st < zb_schedule_stages(s); st++) {
    if (zb_stage_rank(s, st) != r)
      continue;
    int last_w = -1, at = -1, count = 0;
    for (int i = 0; i < l->n; i++) {
      const zb_action *a = &l->actions[i];
      if ((a->op == ZB_OP_W || a->op == ZB_OP_BW) && a->stage == st)
        last_w = i;
      if (a->op == ZB_OP_REDUCE_GRAD && a->stage == st)
        at = i, count++;
    }
    if (count != 1 || at < last_w || (!at_end && at != last_w + 1))
      return false;
    first_reduce = at < first_reduce ? at : first_reduce;
  }
  for (int i = first_reduce; at_end && i < l->n; i++)
    if (l->actions[i].op != ZB_OP_REDUCE_GRAD && l->actions[i].op != ZB_OP_WAIT_REDUCE_GRAD)
      return false;
  return true;
}

/* A plan of family f at p = 4, m = 8 with t_reduce (one rank's share). */
static zb_err red_plan(zb_family f, double t_reduce, zb_sim_mode mode, zb_planner_result *out) {
  zb_planner_request req = {.family = f, .p = 4, .m = 8, .rank = zb_rank_costs_default(), .mode = mode};
  req.rank.t_reduce = t_reduce;
  zb_diag d = {{0}};
  zb_err err = zb_planner_run(&req, out, &d);
  if (err)
    fprintf(stderr, "  %s: %s\n", zb_family_name(f), d.msg);
  return err;
}

static void test_lowering_places(void) {
  const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_ZB_V};
  for (int k = 0; k < 4; k++) {
    zb_planner_result res;
    CHECK_EQ(red_plan(fams[k], 1.5, ZB_SIM_BLOCKING, &res), ZB_OK); /* validated on the way */
    for (int r = 0; r < 4; r++)
      CHECK_MSG(red_placed(res.lowered, r, false), "%s rank %d", zb_family_name(fams[k]), r);
    zb_schedule *end = zb_schedule_clone(res.lowered);
    zb_reduce_insert(end, ZB_REDUCE_AT_END);
    zb_violation v;
    CHECK_EQ(zb_validate(end, res.costs, &v), ZB_OK);
    for (int r = 0; r < 4; r++)
      CHECK_MSG(red_placed(end, r, true), "%s rank %d at the end", zb_family_name(fams[k]), r);
    zb_schedule_free(end);
    zb_planner_result_free(&res);
    CHECK_EQ(red_plan(fams[k], 0, ZB_SIM_BLOCKING, &res), ZB_OK); /* d = 1: nothing added */
    CHECK(!zb_schedule_has_reduce(res.lowered));
    zb_planner_result_free(&res);
  }
}

/* Validates s after edit; expects the kind at rank/index and words. */
static bool red_refused(const zb_schedule *s, zb_violation_kind kind, int rank, int index,
                        const char *words) {
  zb_costs *c = red_costs(zb_schedule_stages(s), 2);
  zb_violation v;
  zb_err err = zb_validate(s, c, &v);
  zb_costs_free(c);
  char line[240];
  zb_violation_format(&v, line, (int)sizeof line);
  if (err != ZB_ERR_INVALID_SCHEDULE || v.kind != kind || v.rank != rank || v.index != index ||
      !strstr(line, words)) {
    fprintf(stderr, "  got: %s (rank %d index %d)\n", line, v.rank, v.index);
    return false;
  }
  return true;
}

static void red_swap(zb_schedule *s, int r, int i, int j) {
  zb_action t = s->ranks[r].actions[i];
  s->ranks[r].actions[i] = s->ranks[r].actions[j];
  s->ranks[r].actions[j] = t;
}

static void test_validator_refuses(void) {
  zb_schedule *base = red_tiny();
  zb_costs *c = red_costs(4, 2);
  zb_violation v;
  CHECK_EQ(zb_validate(base, c, &v), ZB_OK); /* without reductions: valid (d = 1) */
  zb_reduce_insert(base, ZB_REDUCE_EARLIEST);
  CHECK_EQ(zb_validate(base, c, &v), ZB_OK);
  /* rank 0: ... W(2,1) #7, REDUCE(2) #8, B(0,0) ... W(0,1) #12, REDUCE(0) #13, WAIT #14 */
  zb_schedule *s = zb_schedule_clone(base);
  red_swap(s, 0, 7, 8); /* the reduction before its stage's last W */
  CHECK(red_refused(s, ZB_VIOL_DEPENDENCY, 0, 8, "runs after REDUCE_GRAD of stage 2 (index 7)"));
  zb_schedule_free(s);
  s = zb_schedule_clone(base);
  s->ranks[0].actions[13].stage = 2; /* stage 2 reduced twice, stage 0 never */
  CHECK(red_refused(s, ZB_VIOL_DUPLICATE, 0, 13, "REDUCE_GRAD of stage 2 appears more than once"));
  zb_schedule_free(s);
  s = zb_schedule_clone(base);
  s->ranks[0].actions[13].op = ZB_OP_NONE; /* stage 0 never reduced */
  CHECK(red_refused(s, ZB_VIOL_MISSING, 0, -1, "REDUCE_GRAD of stage 0 never runs on rank 0"));
  zb_schedule_free(s);
  s = zb_schedule_clone(base);
  s->ranks[0].actions[13].stage = 1; /* a stage rank 0 does not host */
  CHECK(red_refused(s, ZB_VIOL_PLACEMENT, 0, 13, "stage 1 lives on rank 1"));
  zb_schedule_free(s);
  s = zb_schedule_clone(base);
  s->ranks[1].n--; /* rank 1 without its wait */
  CHECK(red_refused(s, ZB_VIOL_DEPENDENCY, 1, 13, "REDUCE_GRAD of stage 1 is never waited for"));
  zb_schedule_free(s);
  s = zb_schedule_clone(base);
  red_swap(s, 1, 13, 14); /* the wait before the last reduction */
  CHECK(red_refused(s, ZB_VIOL_DEPENDENCY, 1, 13, "no REDUCE_GRAD of stage 1 comes before it"));
  zb_schedule_free(s);
  /* PyTorch's form: a wait after each stage's reduction, compute after it */
  s = zb_schedule_new(2, 2, 2, ZB_PLACE_LOOP);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < base->ranks[r].n; i++) {
      zb_schedule_push(s, r, base->ranks[r].actions[i]);
      if (i == 8)
        zb_schedule_push(s, r,
                         (zb_action){.op = ZB_OP_WAIT_REDUCE_GRAD, .stage = r + 2, .mb = -1, .peer = -1});
    }
  CHECK_EQ(zb_validate(s, c, &v), ZB_OK);
  zb_schedule_free(s);
  zb_schedule_free(base);
  zb_costs_free(c);
}

/* At p = 4, m = 8, device-ordered, each family's reductions hide better
 * at the earliest point than at the end, and never worse. */
static void test_families_overlap(void) {
  const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_ZB_V};
  for (int k = 0; k < 4; k++) {
    zb_planner_result res;
    CHECK_EQ(red_plan(fams[k], 1.5, ZB_SIM_DEVICE, &res), ZB_OK);
    zb_schedule *end = zb_schedule_clone(res.lowered);
    zb_reduce_insert(end, ZB_REDUCE_AT_END);
    zb_sim_result *a = red_sim(res.lowered, res.costs, ZB_SIM_DEVICE),
                  *b = red_sim(end, res.costs, ZB_SIM_DEVICE);
    CHECK(a && b);
    CHECK_MSG(a->makespan <= b->makespan + EPS, "%s: earliest %g, at the end %g", zb_family_name(fams[k]),
              a->makespan, b->makespan);
    if (fams[k] == ZB_FAMILY_ZB_V) /* chunk 1's W end early: something hides */
      CHECK_MSG(a->makespan < b->makespan - EPS, "zb-v: earliest %g, at the end %g", a->makespan,
                b->makespan);
    CHECK_NEAR(res.sim->makespan, a->makespan, EPS);
    zb_sim_result_free(a);
    zb_sim_result_free(b);
    zb_schedule_free(end);
    zb_planner_result_free(&res);
  }
}

/* zb-auto over every placement, device-ordered, p = 4, m = 8, t_reduce
 * 4 (one rank's share): the plan chosen with the reductions priced runs
 * them faster than the plan chosen blind to them (t_reduce 0) would: a
 * different plan (27.5 against 28 when written). */
static void test_auto_prices(void) {
  zb_planner_result blind, priced;
  CHECK_EQ(red_plan(ZB_FAMILY_ZB_AUTO, 0, ZB_SIM_DEVICE, &blind), ZB_OK);
  CHECK_EQ(red_plan(ZB_FAMILY_ZB_AUTO, 4, ZB_SIM_DEVICE, &priced), ZB_OK);
  CHECK(zb_schedule_has_reduce(priced.lowered));
  /* the blind choice with its reductions, as it would run */
  zb_schedule *s = zb_schedule_clone(blind.lowered);
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_reduce = 4;
  zb_costs *c = zb_costs_from_rank_share(4, blind.v, &rc, 0);
  zb_reduce_insert(s, ZB_REDUCE_EARLIEST);
  zb_sim_result *r = red_sim(s, c, ZB_SIM_DEVICE);
  CHECK(r);
  fprintf(stderr, "  blind: %s v=%d %g; priced: %s v=%d %g\n", zb_family_name(blind.chosen), blind.v,
          r->makespan, zb_family_name(priced.chosen), priced.v, priced.sim->makespan);
  CHECK(priced.sim->makespan <= r->makespan + EPS);
  CHECK(priced.sim->makespan < r->makespan - EPS);
  zb_sim_result_free(r);
  zb_costs_free(c);
  zb_schedule_free(s);
  zb_planner_result_free(&blind);
  zb_planner_result_free(&priced);
}

/* Every t_reduce 0: the same lists and figures as costs without it. */
static void test_zero_is_none(void) {
  zb_planner_result a;
  CHECK_EQ(red_plan(ZB_FAMILY_ZB_AUTO, 0, ZB_SIM_BLOCKING, &a), ZB_OK);
  CHECK(!zb_schedule_has_reduce(a.lowered));
  for (int q = 0; q < 4; q++)
    CHECK_NEAR(a.sim->reduce_time[q], 0, 0);
  zb_planner_result_free(&a);
}

ZBT_MAIN(ZBT(test_tiny_by_hand), ZBT(test_tiny_lowered), ZBT(test_lowering_places),
         ZBT(test_validator_refuses), ZBT(test_families_overlap), ZBT(test_auto_prices),
         ZBT(test_zero_is_none))
