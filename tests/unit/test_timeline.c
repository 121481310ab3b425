/* The timeline summary (zb_timeline.h) against the simulator: a simulated
 * run's per-action times, given to the summary as if measured, must give
 * the simulator's bubble ratios exactly, for every family, also after
 * each rank's times are shifted by its own offset and shifted back (what
 * the coordinator does with clock offsets); comm groups count as comm
 * wait, not busy; bad times are refused naming the rank. */
#include "zb_alloc.h"
#include "zb_planner.h"
#include "zb_timeline.h"
#include "zbtest.h"

/* The simulated run of family at (p, m) as per-rank timelines, every time
 * plus offset[r] (NULL: none). Comm actions become groups of one that take
 * t_wait seconds from the time the rank reached them. Caller frees ops. */
static zb_tl_rank *from_sim(const zb_planner_result *pl, const double *offset, double t_wait) {
  const zb_schedule *s = pl->lowered;
  zb_tl_rank *ranks = zb_calloc((size_t)s->p, sizeof *ranks);
  for (int r = 0; r < s->p; r++) {
    zb_tl_op *ops = zb_calloc((size_t)s->ranks[r].n + 1, sizeof *ops);
    int n = 0;
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op) && !zb_op_is_comm(a->op))
        continue;
      double st = pl->sim->start[r][i] + (offset ? offset[r] : 0),
             en = zb_sim_end(pl->sim, a, r, i) + (offset ? offset[r] : 0);
      if (zb_op_is_comm(a->op))
        en = st + t_wait;
      ops[n++] = (zb_tl_op){.op = a->op,
                            .stage = a->stage,
                            .mb = a->mb,
                            .group_size = zb_op_is_comm(a->op),
                            .start = st,
                            .end = en};
    }
    ranks[r] = (zb_tl_rank){.ops = ops, .n = n};
  }
  return ranks;
}

static void free_ranks(zb_tl_rank *ranks, int p) {
  for (int r = 0; r < p; r++)
    free((void *)ranks[r].ops);
  free(ranks);
}

static bool plan(zb_family f, int p, int m, zb_planner_result *pl) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_b = 1.2;
  rc.t_w = 0.8;
  rc.t_comm = 0.05;
  zb_planner_request req = {.family = f, .p = p, .m = m, .rank = rc};
  zb_diag d = {{0}};
  zb_err err = zb_planner_run(&req, pl, &d);
  if (err)
    fprintf(stderr, "  plan %s p=%d m=%d: %s\n", zb_family_name(f), p, m, d.msg);
  return err == ZB_OK;
}

static void test_timeline_equals_the_simulator(void) {
  zb_family fams[] = {ZB_FAMILY_1F1B,  ZB_FAMILY_INTERLEAVED_1F1B,
                      ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2,
                      ZB_FAMILY_ZB_V,  ZB_FAMILY_V_HALF};
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
    zb_planner_result pl = {0};
    CHECK(plan(fams[k], 4, 8, &pl));
    zb_tl_rank *ranks = from_sim(&pl, NULL, 0.0);
    zb_tl_summary s;
    zb_diag d = {{0}};
    CHECK_EQ(zb_timeline_summarize(ranks, 4, &s, &d), ZB_OK);
    CHECK_MSG(fabs(s.bubble_ratio - pl.sim->bubble_ratio) < 1e-12, "%s: %g vs %g", zb_family_name(fams[k]),
              s.bubble_ratio, pl.sim->bubble_ratio);
    CHECK_NEAR(s.bubble_ratio_paper, pl.sim->bubble_ratio_paper, 1e-12);
    CHECK_NEAR(s.span, pl.sim->makespan, 1e-12);
    CHECK_NEAR(s.max_span, pl.sim->max_span, 1e-12);
    for (int r = 0; r < 4; r++) {
      CHECK_NEAR(s.compute[r], pl.sim->busy[r], 1e-12);
      CHECK_NEAR(s.idle[r], s.span - s.compute[r], 1e-12); /* comm took no time */
    }
    zb_tl_summary_free(&s);
    free_ranks(ranks, 4);
    zb_planner_result_free(&pl);
  }
}

/* Ranks whose clocks differ by seconds: summarised raw, the bubble is
 * nonsense; with the offsets taken back out, the simulator's again. */
static void test_offsets_taken_out(void) {
  zb_planner_result pl = {0};
  CHECK(plan(ZB_FAMILY_ZB_H1, 4, 8, &pl));
  double skew[4] = {0, 100.0, -50.0, 0.25}, back[4];
  for (int r = 0; r < 4; r++)
    back[r] = 0;
  zb_tl_rank *raw = from_sim(&pl, skew, 0.0);
  zb_tl_summary s;
  CHECK_EQ(zb_timeline_summarize(raw, 4, &s, NULL), ZB_OK);
  CHECK(s.bubble_ratio > 0.5); /* a span of 150 s around ~30 s of work: mostly "bubble" */
  zb_tl_summary_free(&s);
  for (int r = 0; r < 4; r++) { /* what the coordinator does: worker time + offset */
    back[r] = -skew[r];
    zb_tl_op *ops = (zb_tl_op *)raw[r].ops;
    for (int i = 0; i < raw[r].n; i++) {
      ops[i].start += back[r];
      ops[i].end += back[r];
    }
  }
  CHECK_EQ(zb_timeline_summarize(raw, 4, &s, NULL), ZB_OK);
  CHECK_NEAR(s.bubble_ratio, pl.sim->bubble_ratio, 1e-9);
  zb_tl_summary_free(&s);
  free_ranks(raw, 4);
  zb_planner_result_free(&pl);
}

static void test_comm_is_not_busy(void) {
  zb_planner_result pl = {0};
  CHECK(plan(ZB_FAMILY_1F1B, 4, 8, &pl));
  zb_tl_rank *ranks = from_sim(&pl, NULL, 0.01);
  zb_tl_summary s;
  CHECK_EQ(zb_timeline_summarize(ranks, 4, &s, NULL), ZB_OK);
  CHECK_NEAR(s.bubble_ratio, pl.sim->bubble_ratio, 1e-12);
  for (int r = 0; r < 4; r++) {
    CHECK(s.groups[r] > 0);
    CHECK_NEAR(s.comm[r], 0.01 * s.groups[r], 1e-9);
    CHECK_NEAR(s.idle[r], s.span - s.compute[r] - s.comm[r], 1e-9);
  }
  zb_tl_summary_free(&s);
  free_ranks(ranks, 4);
  zb_planner_result_free(&pl);
}

/* A REDUCE_GRAD span is a timed op of its own: counted in reduce, not as
 * a transport group, so comm and idle stay what they were. */
/* A REDUCE_GRAD span is counted apart from the transport groups, and in
 * comm (the host-blocking executor waits for it); the iteration's span
 * runs to the last reduction's end, as the simulator's makespan does. */
static void test_reduce_is_its_own(void) {
  zb_tl_op r0[] = {{.op = ZB_OP_F, .stage = 0, .mb = 0, .start = 0, .end = 1},
                   {.op = ZB_OP_SEND_F, .stage = 0, .mb = 0, .group_size = 1, .start = 1, .end = 1.5},
                   {.op = ZB_OP_B, .stage = 0, .mb = 0, .start = 1.5, .end = 2.5},
                   {.op = ZB_OP_REDUCE_GRAD, .stage = 0, .mb = -1, .start = 2.5, .end = 4}};
  zb_tl_rank ranks[1] = {{r0, 4}};
  zb_tl_summary s;
  CHECK_EQ(zb_timeline_summarize(ranks, 1, &s, NULL), ZB_OK);
  CHECK_EQ(s.groups[0], 1);
  CHECK_EQ(s.reduce_ops[0], 1);
  CHECK_NEAR(s.reduce[0], 1.5, 1e-12);
  CHECK_NEAR(s.end, 4, 1e-12);
  CHECK_NEAR(s.span, 4, 1e-12);
  CHECK_NEAR(s.max_span, 2.5, 1e-12); /* the paper's: compute only */
  CHECK_NEAR(s.comm[0], 0.5 + 1.5, 1e-12);
  CHECK_NEAR(s.idle[0], 0, 1e-12);
  CHECK_NEAR(s.bubble_ratio, 1 - 2.0 / 4, 1e-12);
  zb_tl_summary_free(&s);
}

static void test_bad_times_refused(void) {
  zb_tl_op ops[2] = {{.op = ZB_OP_F, .start = 0, .end = 1},
                     {.op = ZB_OP_B, .stage = 1, .mb = 3, .start = 2, .end = 1.5}};
  zb_tl_rank ranks[2] = {{.ops = ops, .n = 1}, {.ops = ops, .n = 2}};
  zb_tl_summary s;
  zb_diag d = {{0}};
  CHECK_EQ(zb_timeline_summarize(ranks, 2, &s, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "rank 1") && strstr(d.msg, "op 1"), "message: %s", d.msg);
  zb_tl_summary_free(&s);
  ops[1].end = NAN;
  CHECK_EQ(zb_timeline_summarize(ranks, 2, &s, &d), ZB_ERR_INVALID_ARG);
  zb_tl_summary_free(&s);
  CHECK_EQ(zb_timeline_summarize(ranks, 0, &s, &d), ZB_ERR_INVALID_ARG);
  zb_tl_rank empty[1] = {{.ops = NULL, .n = 0}};
  CHECK_EQ(zb_timeline_summarize(empty, 1, &s, &d), ZB_OK);
  CHECK(s.span == 0 && s.bubble_ratio == 0);
  zb_tl_summary_free(&s);
}

/* Round trips to a clock 7 s ahead, with asymmetric delays: the estimate
 * is the least-delay sample's, within half its delay of the truth; bad
 * samples are refused; the window keeps the last ZB_CLOCK_SAMPLES. */
static void test_clock_offset(void) {
  zb_clock_offset c = {0};
  double off, delay;
  CHECK(!zb_clock_offset_get(&c, &off, &delay));
  double ahead = 7.0, t = 100.0;
  double out_d[] = {0.004, 0.0001, 0.010, 0.002}, back_d[] = {0.001, 0.0003, 0.0005, 0.008};
  for (int i = 0; i < 4; i++, t += 1.0) {
    double t1 = t, t2 = t1 + out_d[i] + ahead, t3 = t2 + 0.0002, t4 = t3 - ahead + back_d[i];
    CHECK(zb_clock_offset_add(&c, t1, t2, t3, t4));
  }
  CHECK(zb_clock_offset_get(&c, &off, &delay));
  CHECK_NEAR(delay, 0.0004, 1e-9); /* sample 1: 0.0001 out + 0.0003 back */
  CHECK_NEAR(off, ahead + (0.0001 - 0.0003) / 2, 1e-9);
  CHECK(fabs(off - ahead) <= delay / 2);
  CHECK(!zb_clock_offset_add(&c, 5, 1, 2, 4)); /* back before it left */
  CHECK(!zb_clock_offset_add(&c, 1, 3, 2, 4)); /* answered before it arrived */
  CHECK(!zb_clock_offset_add(&c, 1, 2, 5, 3)); /* a negative delay */
  CHECK(!zb_clock_offset_add(&c, NAN, 2, 3, 4));
  for (int i = 0; i < ZB_CLOCK_SAMPLES; i++) /* the good sample leaves the window */
    CHECK(zb_clock_offset_add(&c, 0, 1.001, 1.001, 0.002));
  CHECK(zb_clock_offset_get(&c, &off, &delay));
  CHECK_NEAR(delay, 0.002, 1e-9);
  CHECK_NEAR(off, 1.0, 1e-9);
}

/* A simulated run with T_F:T_B:T_W = 1:1.2:0.8 and T_comm 0.05: the learned per-stage
 * times are the planned ones exactly (fused BW split by the prior's
 * ratio), T_comm is the simulator's latency, and a stage out of range is
 * refused. */
static void test_costs_from_a_timeline(void) {
  zb_family fams[] = {ZB_FAMILY_ZB_H1, ZB_FAMILY_1F1B, ZB_FAMILY_ZB_V};
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
    zb_planner_result pl = {0};
    CHECK(plan(fams[k], 4, 8, &pl));
    zb_tl_rank *ranks = from_sim(&pl, NULL, 0.0);
    zb_tl_costs c;
    zb_diag d = {{0}};
    CHECK_EQ(zb_timeline_costs(ranks, 4, pl.costs, &c, &d), ZB_OK);
    CHECK_EQ(c.n_stages, pl.costs->n_stages);
    for (int s = 0; s < c.n_stages; s++) {
      CHECK_NEAR(c.t_f[s], pl.costs->t_f[s], 1e-12);
      CHECK_NEAR(c.t_b[s], pl.costs->t_b[s], 1e-12);
      CHECK_NEAR(c.t_w[s], pl.costs->t_w[s], 1e-12);
    }
    CHECK_MSG(c.comm_samples > 0 && fabs(c.t_comm - 0.05) < 1e-9, "%s: t_comm %g from %d samples",
              zb_family_name(fams[k]), c.t_comm, c.comm_samples);
    zb_tl_costs_free(&c);
    ((zb_tl_op *)ranks[1].ops)[0].stage = 99;
    CHECK_EQ(zb_timeline_costs(ranks, 4, pl.costs, &c, &d), ZB_ERR_INVALID_ARG);
    CHECK(strstr(d.msg, "stage 99"));
    zb_tl_costs_free(&c);
    free_ranks(ranks, 4);
    zb_planner_result_free(&pl);
  }
}

/* Two replicas of a two-stage pipeline, each rank reducing its stage
 * after its W: zb_timeline_costs learns from one replica with the
 * reductions (mb -1) and WAIT marker in its lists, pricing each stage's
 * reduction by its span; over both replicas each stage's T_reduce is the
 * shorter span (the replica that launched last: the other's span held its
 * wait); a REDUCE_GRAD of a stage out of range is refused naming it. */
static void test_reduce_times_learned(void) {
  zb_rank_costs rc = zb_rank_costs_default();
  zb_planner_request req = {.family = ZB_FAMILY_1F1B, .p = 2, .m = 1, .rank = rc};
  zb_planner_result pl = {0};
  CHECK_EQ(zb_planner_run(&req, &pl, NULL), ZB_OK);
  /* replica 0: stage 0 on rank 0, stage 1 on rank 1; replica 1 the same
   * stages, its reductions launched 0.3 s later (spans shorter by that) */
  zb_tl_op ops[4][6];
  zb_tl_rank ranks[4];
  for (int g = 0; g < 4; g++) {
    int st = g % 2;
    double late = g >= 2 ? 0.3 : 0, f0 = st ? 1 : 0, b0 = st ? 2 : 3;
    double red_end = 6 + st; /* both replicas' reductions of a stage end together */
    zb_tl_op *o = ops[g];
    o[0] = (zb_tl_op){.op = ZB_OP_F, .stage = st, .mb = 0, .start = f0, .end = f0 + 1};
    o[1] = (zb_tl_op){.op = ZB_OP_B, .stage = st, .mb = 0, .start = b0, .end = b0 + 1};
    o[2] = (zb_tl_op){.op = ZB_OP_W, .stage = st, .mb = 0, .start = b0 + 1, .end = b0 + 2};
    o[3] = (zb_tl_op){.op = ZB_OP_REDUCE_GRAD, .stage = st, .mb = -1, .start = 5 + late, .end = red_end};
    o[4] = (zb_tl_op){.op = ZB_OP_WAIT_REDUCE_GRAD, .stage = -1, .mb = -1, .start = red_end, .end = red_end};
    ranks[g] = (zb_tl_rank){.ops = o, .n = 5};
  }
  zb_tl_costs c;
  zb_diag d = {{0}};
  CHECK_EQ(zb_timeline_costs(ranks, 2, pl.costs, &c, &d), ZB_OK);
  CHECK_NEAR(c.t_f[1], 1, 1e-12);
  CHECK_NEAR(c.t_reduce[0], 1, 1e-12);
  CHECK_NEAR(c.t_reduce[1], 2, 1e-12);
  zb_tl_costs_free(&c);
  double t[2];
  CHECK_EQ(zb_timeline_reduce_times(ranks, 4, 2, t, &d), ZB_OK);
  CHECK_NEAR(t[0], 0.7, 1e-12);
  CHECK_NEAR(t[1], 1.7, 1e-12);
  CHECK_EQ(zb_timeline_reduce_times(ranks, 1, 2, t, &d), ZB_OK); /* rank 0 reduces stage 0 only */
  CHECK(isnan(t[1]));
  ops[3][3].stage = 7;
  CHECK_EQ(zb_timeline_reduce_times(ranks, 4, 2, t, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "rank 3") && strstr(d.msg, "stage 7"), "message: %s", d.msg);
  zb_planner_result_free(&pl);
}

ZBT_MAIN(ZBT(test_costs_from_a_timeline), ZBT(test_reduce_times_learned), ZBT(test_clock_offset),
         ZBT(test_timeline_equals_the_simulator), ZBT(test_offsets_taken_out), ZBT(test_comm_is_not_busy),
         ZBT(test_bad_times_refused), ZBT(test_reduce_is_its_own))
