/* The event simulator (zb_sim.h) on small schedules worked out by hand:
 * per-op start/end times, makespan, busy time and span per rank, the two
 * bubble ratios, peak memory (raw and in units of the rank's M_F), comm and
 * FSDP actions taking no time, the fast path agreeing with the full one,
 * deadlocks and mismatched costs. Every expected number is derived in the
 * comments from the cost model of docs/schedules.md: an op starts when its rank is
 * free and its inputs are there; an input from another rank arrives T_comm
 * after its producer ends, one from the same rank when the producer ends. */
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zbtest.h"

#define SIM_EPS 1e-9

/* Costs for n_stages stages, every stage alike. */
static zb_costs *sim_costs(int n_stages, double tf, double tb, double tw, double tcomm, double mf, double mb,
                           double mw) {
  zb_costs *c = zb_costs_new(n_stages);
  for (int s = 0; s < n_stages; s++) {
    c->t_f[s] = tf;
    c->t_b[s] = tb;
    c->t_w[s] = tw;
    c->m_f[s] = mf;
    c->m_b[s] = mb;
    c->m_w[s] = mw;
  }
  c->t_comm = tcomm;
  return c;
}

static void sim_push_comm(zb_schedule *s, int rank, zb_op op, int stage, int mb, int peer) {
  zb_action a = {.op = op, .stage = stage, .mb = mb, .peer = peer, .batch = false};
  zb_schedule_push(s, rank, a);
}

/* Compares rank `rank`'s simulated start/end times with want[i] = {start,
 * end} for every action of its list; prints the first mismatch. */
static bool sim_times_are(const zb_schedule *s, const zb_sim_result *r, int rank, const double (*want)[2],
                          int n) {
  if (s->ranks[rank].n != n) {
    fprintf(stderr, "  rank %d has %d actions, expected %d\n", rank, s->ranks[rank].n, n);
    return false;
  }
  for (int i = 0; i < n; i++)
    if (fabs(r->start[rank][i] - want[i][0]) > SIM_EPS || fabs(r->end[rank][i] - want[i][1]) > SIM_EPS) {
      const zb_action *a = &s->ranks[rank].actions[i];
      fprintf(stderr, "  rank %d #%d (%s s%d mb%d): %g..%g, expected %g..%g\n", rank, i, zb_op_name(a->op),
              a->stage, a->mb, r->start[rank][i], r->end[rank][i], want[i][0], want[i][1]);
      return false;
    }
  return true;
}

/* zb_simulate_makespan gives the same makespan and max span as zb_simulate. */
static bool sim_fast_path_agrees(const zb_schedule *s, const zb_costs *c, const zb_sim_result *r) {
  double mk = -1, span = -1;
  if (zb_simulate_makespan(s, c, &mk, &span) != ZB_OK)
    return false;
  if (fabs(mk - r->makespan) > SIM_EPS || fabs(span - r->max_span) > SIM_EPS) {
    fprintf(stderr, "  fast path: makespan %g span %g, full: %g %g\n", mk, span, r->makespan, r->max_span);
    return false;
  }
  return true;
}

/* Loop placement, p = 2, v = 1, m = 2, split backward; every stage has
 * T_F = 1, T_B = 2, T_W = 0.5, T_comm = 0.25; M_F = 2, M_B = -1.5,
 * M_W = -0.5 (so one rank's M_F is 2).
 *   rank 0: F0.0 F0.1 B0.0 W0.0 B0.1 W0.1
 *   rank 1: F1.0 B1.0 F1.1 B1.1 W1.0 W1.1
 * rank 0: F0.0 0..1, F0.1 1..2.
 * rank 1: F1.0 waits for F0.0 (ends 1) + 0.25 -> 1.25..2.25; B1.0 (last
 *   stage: needs only its F, same rank) 2.25..4.25; F1.1 (input at 2.25,
 *   rank busy) 4.25..5.25; B1.1 5.25..7.25; W1.0 7.25..7.75; W1.1 ..8.25.
 * rank 0: B0.0 needs B1.0 (4.25) + 0.25 -> 4.5..6.5; W0.0 6.5..7; B0.1
 *   needs B1.1 (7.25) + 0.25 -> 7.5..9.5; W0.1 9.5..10.
 * makespan 10; busy 2*(1+2+0.5) = 7 on each rank; spans 0..10 and
 * 1.25..8.25, S_max = 10; bubble_ratio = 1 - 14/(2*10) = 0.3;
 * bubble_ratio_paper = (10 - 2*3.5)/10 = 0.3.
 * Memory rank 0: 2, 4, 2.5, 2, 0.5, 0 -> peak 4 = 2 units; rank 1: 2, 0.5,
 *   2.5, 1, 0.5, 0 -> peak 2.5 = 1.25 units. */
static zb_schedule *sim_loop_schedule(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  const zb_op ops0[] = {ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_B, ZB_OP_W};
  const int mbs0[] = {0, 1, 0, 0, 1, 1};
  const zb_op ops1[] = {ZB_OP_F, ZB_OP_B, ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_W};
  const int mbs1[] = {0, 0, 1, 1, 0, 1};
  for (int i = 0; i < 6; i++) {
    zb_schedule_push_op(s, 0, ops0[i], 0, mbs0[i]);
    zb_schedule_push_op(s, 1, ops1[i], 1, mbs1[i]);
  }
  return s;
}

static void test_sim_loop_by_hand(void) {
  zb_schedule *s = sim_loop_schedule();
  zb_costs *c = sim_costs(2, 1, 2, 0.5, 0.25, 2, -1.5, -0.5);
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  static const double want0[][2] = {{0, 1}, {1, 2}, {4.5, 6.5}, {6.5, 7}, {7.5, 9.5}, {9.5, 10}};
  static const double want1[][2] = {{1.25, 2.25}, {2.25, 4.25}, {4.25, 5.25},
                                    {5.25, 7.25}, {7.25, 7.75}, {7.75, 8.25}};
  bool times_ok = sim_times_are(s, r, 0, want0, 6) && sim_times_are(s, r, 1, want1, 6);
  bool fast_ok = sim_fast_path_agrees(s, c, r);
  zb_sim_result res = *r;
  double busy[2] = {r->busy[0], r->busy[1]}, ss[2] = {r->span_start[0], r->span_start[1]};
  double se[2] = {r->span_end[0], r->span_end[1]}, pk[2] = {r->peak_memory[0], r->peak_memory[1]};
  double pku[2] = {r->peak_memory_units[0], r->peak_memory_units[1]};
  zb_sim_result_free(r);

  /* Without T_comm: F1.0 1..2, B1.0 2..4, F1.1 4..5, B1.1 5..7, W 7..8;
   * rank 0 B0.0 4..6, W0.0 6..6.5, B0.1 7..9, W0.1 9..9.5: makespan 9.5. */
  c->t_comm = 0;
  double mk0 = -1, span0 = -1;
  zb_err err0 = zb_simulate_makespan(s, c, &mk0, &span0);
  zb_costs_free(c);
  zb_schedule_free(s);

  CHECK(times_ok);
  CHECK(fast_ok);
  CHECK_EQ(res.p, 2);
  CHECK_NEAR(res.makespan, 10, SIM_EPS);
  CHECK_NEAR(busy[0], 7, SIM_EPS);
  CHECK_NEAR(busy[1], 7, SIM_EPS);
  CHECK_NEAR(ss[0], 0, SIM_EPS);
  CHECK_NEAR(ss[1], 1.25, SIM_EPS);
  CHECK_NEAR(se[0], 10, SIM_EPS);
  CHECK_NEAR(se[1], 8.25, SIM_EPS);
  CHECK_NEAR(res.max_span, 10, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio, 0.3, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio_paper, 0.3, SIM_EPS);
  CHECK_NEAR(pk[0], 4, SIM_EPS);
  CHECK_NEAR(pk[1], 2.5, SIM_EPS);
  CHECK_NEAR(pku[0], 2, SIM_EPS);
  CHECK_NEAR(pku[1], 1.25, SIM_EPS);
  CHECK_EQ(err0, ZB_OK);
  CHECK_NEAR(mk0, 9.5, SIM_EPS);
  CHECK_NEAR(span0, 9.5, SIM_EPS);
}

/* V placement, p = 2, v = 2, m = 1: stages 0 and 3 on rank 0, 1 and 2 on
 * rank 1 (the turn 1 -> 2 stays on rank 1). Per stage T_F = 1, T_B = 1.5,
 * T_W = 2 (one rank's share: 2, 3, 4), T_comm = 0.25; M_F = 1, M_B = -0.25,
 * M_W = -0.75.
 *   rank 0: F0 F3 B3 W3 B0 W0
 *   rank 1: F1 F2 B2 B1 W2 W1
 * rank 0: F0 0..1.
 * rank 1: F1 needs F0 + 0.25 -> 1.25..2.25; F2 needs F1 on the same rank,
 *   no delay -> 2.25..3.25.
 * rank 0: F3 needs F2 (3.25) + 0.25 -> 3.5..4.5; B3 4.5..6; W3 6..8.
 * rank 1: B2 needs B3 (6) + 0.25 -> 6.25..7.75; B1 needs B2 on the same
 *   rank -> 7.75..9.25; W2 9.25..11.25; W1 11.25..13.25.
 * rank 0: B0 needs B1 (9.25) + 0.25 -> 9.5..11; W0 11..13.
 * makespan 13.25; busy 9 per rank (= m(T_F+T_B+T_W) of one share); spans
 * 0..13 (13) and 1.25..13.25 (12): S_max = 13. bubble_ratio = 1 - 18/26.5
 * = 17/53; bubble_ratio_paper = (13 - 9)/13 = 4/13: here they differ.
 * Memory: each rank runs both its F before any B: peak 2 = its M_F, 1 unit. */
static void test_sim_v_by_hand(void) {
  zb_schedule *s = zb_schedule_new(2, 2, 1, ZB_PLACE_V);
  const zb_op ops[] = {ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_B, ZB_OP_W};
  const int st0[] = {0, 3, 3, 3, 0, 0}, st1[] = {1, 2, 2, 1, 2, 1};
  const zb_op ops1[] = {ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_B, ZB_OP_W, ZB_OP_W};
  for (int i = 0; i < 6; i++) {
    zb_schedule_push_op(s, 0, ops[i], st0[i], 0);
    zb_schedule_push_op(s, 1, ops1[i], st1[i], 0);
  }
  zb_costs *c = sim_costs(4, 1, 1.5, 2, 0.25, 1, -0.25, -0.75);
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  static const double want0[][2] = {{0, 1}, {3.5, 4.5}, {4.5, 6}, {6, 8}, {9.5, 11}, {11, 13}};
  static const double want1[][2] = {{1.25, 2.25}, {2.25, 3.25},  {6.25, 7.75},
                                    {7.75, 9.25}, {9.25, 11.25}, {11.25, 13.25}};
  bool times_ok = sim_times_are(s, r, 0, want0, 6) && sim_times_are(s, r, 1, want1, 6);
  bool fast_ok = sim_fast_path_agrees(s, c, r);
  zb_sim_result res = *r;
  double busy[2] = {r->busy[0], r->busy[1]}, ss[2] = {r->span_start[0], r->span_start[1]};
  double se[2] = {r->span_end[0], r->span_end[1]}, pk[2] = {r->peak_memory[0], r->peak_memory[1]};
  double pku[2] = {r->peak_memory_units[0], r->peak_memory_units[1]};
  zb_sim_result_free(r);
  zb_costs_free(c);
  zb_schedule_free(s);

  CHECK(times_ok);
  CHECK(fast_ok);
  CHECK_NEAR(res.makespan, 13.25, SIM_EPS);
  CHECK_NEAR(busy[0], 9, SIM_EPS);
  CHECK_NEAR(busy[1], 9, SIM_EPS);
  CHECK_NEAR(ss[0], 0, SIM_EPS);
  CHECK_NEAR(ss[1], 1.25, SIM_EPS);
  CHECK_NEAR(se[0], 13, SIM_EPS);
  CHECK_NEAR(se[1], 13.25, SIM_EPS);
  CHECK_NEAR(res.max_span, 13, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio, 17.0 / 53.0, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio_paper, 4.0 / 13.0, SIM_EPS);
  CHECK(res.bubble_ratio > res.bubble_ratio_paper);
  CHECK_NEAR(pk[0], 2, SIM_EPS);
  CHECK_NEAR(pk[1], 2, SIM_EPS);
  CHECK_NEAR(pku[0], 1, SIM_EPS);
  CHECK_NEAR(pku[1], 1, SIM_EPS);
}

/* Fused backward, p = 2, m = 1: F then BW on each rank, T_F = 1, T_B = 2,
 * T_W = 0.5, T_comm = 0.25, M_F = 2, M_B = -1.5, M_W = -0.5.
 * rank 0 F 0..1; rank 1 F 1.25..2.25, BW (2 + 0.5) 2.25..4.75; rank 0 BW
 * needs rank 1's BW + 0.25 -> 5..7.5. makespan 7.5, busy 3.5 each, spans
 * 7.5 and 3.5: bubble_ratio = 1 - 7/15 = 8/15, bubble_ratio_paper =
 * (7.5 - 3.5)/7.5 = 8/15. BW frees M_B + M_W = -2: peak 2 = 1 unit. */
static void test_sim_fused_bw(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  for (int k = 0; k < 2; k++) {
    zb_schedule_push_op(s, k, ZB_OP_F, k, 0);
    zb_schedule_push_op(s, k, ZB_OP_BW, k, 0);
  }
  zb_costs *c = sim_costs(2, 1, 2, 0.5, 0.25, 2, -1.5, -0.5);
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  static const double want0[][2] = {{0, 1}, {5, 7.5}};
  static const double want1[][2] = {{1.25, 2.25}, {2.25, 4.75}};
  bool times_ok = sim_times_are(s, r, 0, want0, 2) && sim_times_are(s, r, 1, want1, 2);
  zb_sim_result res = *r;
  double busy1 = r->busy[1], pk0 = r->peak_memory[0], pku1 = r->peak_memory_units[1];
  zb_sim_result_free(r);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(times_ok);
  CHECK_NEAR(res.makespan, 7.5, SIM_EPS);
  CHECK_NEAR(busy1, 3.5, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio, 8.0 / 15.0, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio_paper, 8.0 / 15.0, SIM_EPS);
  CHECK_NEAR(pk0, 2, SIM_EPS);
  CHECK_NEAR(pku1, 1, SIM_EPS);
}

/* Uneven stages, p = 2, m = 1, T_comm = 0: stage 0 has T_F = T_B = T_W = 1,
 * stage 1 has 2 each. rank 0 F 0..1; rank 1 F 1..3, B 3..5, W 5..7; rank 0
 * B 5..6, W 6..7. makespan 7, busy 3 and 6, spans 7 and 6. bubble_ratio =
 * 1 - 9/14 = 5/14. With uneven stages the paper's m(T_F+T_B+T_W) is taken
 * as the most loaded rank's work (zb_sim.c): (7 - 6)/7 = 1/7. */
static void test_sim_uneven_stages(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  for (int k = 0; k < 2; k++) {
    zb_schedule_push_op(s, k, ZB_OP_F, k, 0);
    zb_schedule_push_op(s, k, ZB_OP_B, k, 0);
    zb_schedule_push_op(s, k, ZB_OP_W, k, 0);
  }
  zb_costs *c = sim_costs(2, 1, 1, 1, 0, 1, -0.5, -0.5);
  c->t_f[1] = c->t_b[1] = c->t_w[1] = 2;
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  static const double want0[][2] = {{0, 1}, {5, 6}, {6, 7}};
  static const double want1[][2] = {{1, 3}, {3, 5}, {5, 7}};
  bool times_ok = sim_times_are(s, r, 0, want0, 3) && sim_times_are(s, r, 1, want1, 3);
  bool fast_ok = sim_fast_path_agrees(s, c, r);
  zb_sim_result res = *r;
  double busy0 = r->busy[0], busy1 = r->busy[1];
  zb_sim_result_free(r);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(times_ok);
  CHECK(fast_ok);
  CHECK_NEAR(res.makespan, 7, SIM_EPS);
  CHECK_NEAR(busy0, 3, SIM_EPS);
  CHECK_NEAR(busy1, 6, SIM_EPS);
  CHECK_NEAR(res.max_span, 7, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio, 5.0 / 14.0, SIM_EPS);
  CHECK_NEAR(res.bubble_ratio_paper, 1.0 / 7.0, SIM_EPS);
}

/* Comm and FSDP actions take no time. p = 2, m = 1, T_F = 1, T_B = 2,
 * T_W = 0.5, T_comm = 0.25:
 *   rank 0: UNSHARD F0 SEND_F RECV_B B0 W0
 *   rank 1: RECV_F F1 B1 SEND_B W1
 * rank 0: UNSHARD at 0; F0 0..1; SEND_F at 1 (where the rank got to; a
 *   send holds nothing); RECV_B at 4.5, when rank 1's gradient arrives
 *   (B1's end 4.25 + T_comm: a RECV holds its rank until then, as the
 *   executor's transport group does). rank 1: RECV_F at 1.25 (F0's end +
 *   T_comm); F1 1.25..2.25; B1 2.25..4.25; SEND_B at 4.25; W1 4.25..4.75.
 *   rank 0: B0 4.5..6.5, W0 6.5..7. The compute-only schedule gives the
 *   same compute times: the RECVs sit where their consumers wait anyway. */
static void test_sim_comm_adds_no_time(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  zb_action unshard = {.op = ZB_OP_UNSHARD, .stage = 0, .mb = -1, .peer = -1, .batch = false};
  zb_schedule_push(s, 0, unshard);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  sim_push_comm(s, 0, ZB_OP_SEND_F, 0, 0, 1);
  sim_push_comm(s, 0, ZB_OP_RECV_B, 0, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 0);
  sim_push_comm(s, 1, ZB_OP_RECV_F, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  sim_push_comm(s, 1, ZB_OP_SEND_B, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  zb_costs *c = sim_costs(2, 1, 2, 0.5, 0.25, 2, -1.5, -0.5);
  zb_sim_result *r = NULL, *plain = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  /* a RECV happens when its tensor arrives (holding its rank until then):
   * RECV_B at rank 1's B end 4.25 + T_comm, RECV_F at 1 + 0.25 */
  static const double want0[][2] = {{0, 0}, {0, 1}, {1, 1}, {4.5, 4.5}, {4.5, 6.5}, {6.5, 7}};
  static const double want1[][2] = {{1.25, 1.25}, {1.25, 2.25}, {2.25, 4.25}, {4.25, 4.25}, {4.25, 4.75}};
  bool times_ok = sim_times_are(s, r, 0, want0, 6) && sim_times_are(s, r, 1, want1, 5);
  bool fast_ok = sim_fast_path_agrees(s, c, r);
  zb_schedule *compute = zb_schedule_clone(s);
  zb_schedule_strip_comm(compute);
  zb_err err = zb_simulate(compute, c, &plain, &d);
  bool same = err == ZB_OK && compute->ranks[0].n == 4 && compute->ranks[1].n == 3 &&
              fabs(plain->makespan - r->makespan) < SIM_EPS && fabs(plain->start[1][0] - 1.25) < SIM_EPS &&
              fabs(plain->end[0][3] - 7) < SIM_EPS;
  zb_sim_result res = *r;
  double busy0 = r->busy[0], busy1 = r->busy[1], ss1 = r->span_start[1], se1 = r->span_end[1];
  zb_sim_result_free(plain);
  zb_sim_result_free(r);
  zb_schedule_free(compute);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(times_ok);
  CHECK(fast_ok);
  CHECK(same);
  CHECK_NEAR(res.makespan, 7, SIM_EPS);
  CHECK_NEAR(busy0, 3.5, SIM_EPS);
  CHECK_NEAR(busy1, 3.5, SIM_EPS);
  CHECK_NEAR(ss1, 1.25, SIM_EPS);
  CHECK_NEAR(se1, 4.75, SIM_EPS);
  CHECK_NEAR(res.max_span, 7, SIM_EPS);
}

/* The lowering pass inserts SEND/RECV into the hand-worked loop schedule;
 * every compute op keeps the start/end it had without them (the times
 * derived in test_sim_loop_by_hand), and the totals are unchanged. */
static void test_sim_lowered_same_times(void) {
  zb_schedule *s = sim_loop_schedule(), *low = NULL;
  zb_costs *c = sim_costs(2, 1, 2, 0.5, 0.25, 2, -1.5, -0.5);
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_lower(s, c, &low, &d), ZB_OK);
  CHECK(zb_schedule_has_comm(low));
  zb_err err = zb_simulate(low, c, &r, &d);
  static const double want[2][6][2] = {
      {{0, 1}, {1, 2}, {4.5, 6.5}, {6.5, 7}, {7.5, 9.5}, {9.5, 10}},
      {{1.25, 2.25}, {2.25, 4.25}, {4.25, 5.25}, {5.25, 7.25}, {7.25, 7.75}, {7.75, 8.25}}};
  bool ok = err == ZB_OK;
  int comm = 0;
  for (int k = 0; ok && k < 2; k++) {
    int j = 0;
    for (int i = 0; ok && i < low->ranks[k].n; i++) {
      const zb_action *a = &low->ranks[k].actions[i];
      if (!zb_op_is_compute(a->op)) {
        comm++;
        ok = fabs(r->end[k][i] - r->start[k][i]) < SIM_EPS;
        continue;
      }
      ok = j < 6 && fabs(r->start[k][i] - want[k][j][0]) < SIM_EPS &&
           fabs(r->end[k][i] - want[k][j][1]) < SIM_EPS;
      if (!ok)
        fprintf(stderr, "  lowered rank %d #%d: %g..%g\n", k, i, r->start[k][i], r->end[k][i]);
      j++;
    }
    ok = ok && j == 6;
  }
  /* two activations and two gradients cross between the ranks, each a
   * SEND on one side and a RECV on the other */
  bool totals = ok && fabs(r->makespan - 10) < SIM_EPS && fabs(r->busy[0] - 7) < SIM_EPS &&
                fabs(r->bubble_ratio - 0.3) < SIM_EPS && fabs(r->peak_memory_units[0] - 2) < SIM_EPS;
  zb_sim_result_free(r);
  zb_schedule_free(low);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(ok);
  CHECK(totals);
  CHECK_EQ(comm, 8);
}

/* The fast path agrees with zb_simulate on generated schedules with uneven
 * T_F/T_B/T_W and a T_comm, over several families and both placements. */
static void test_sim_fast_path_on_generated(void) {
  const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_INTERLEAVED_1F1B,
                            ZB_FAMILY_ZB_V};
  zb_rank_costs rc = {.t_f = 1, .t_b = 2.5, .t_w = 1.5, .t_comm = 0.3, .m_f = 1, .m_b = -0.5, .m_w = -0.5};
  int failures = 0, checked = 0;
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++)
    for (int p = 2; p <= 5; p++)
      for (int m = p; m <= 3 * p; m += p) {
        int v = zb_family_default_chunks(fams[k]);
        zb_costs *c = zb_costs_from_rank_share(p, v, &rc, 0);
        zb_plan_request req = {.family = fams[k], .p = p, .v = v, .m = m, .costs = c};
        zb_schedule *s = NULL;
        zb_sim_result *r = NULL;
        zb_diag d = {{0}};
        if (zb_plan_generate(&req, &s, &d) != ZB_OK || zb_simulate(s, c, &r, &d) != ZB_OK ||
            !sim_fast_path_agrees(s, c, r)) {
          fprintf(stderr, "  %s p=%d m=%d: %s\n", zb_family_name(fams[k]), p, m, d.msg);
          failures++;
        }
        checked++;
        zb_sim_result_free(r);
        zb_schedule_free(s);
        zb_costs_free(c);
      }
  CHECK_EQ(failures, 0);
  CHECK_EQ(checked, 5 * 4 * 3);
}

/* Runs a schedule that must deadlock through both entry points. */
static bool sim_deadlocks(const zb_schedule *s, const zb_costs *c, char *msg, size_t len) {
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_simulate(s, c, &r, &d);
  double mk = -1, span = -1;
  zb_err fast = zb_simulate_makespan(s, c, &mk, &span);
  snprintf(msg, len, "%s", d.msg);
  bool ok = err == ZB_ERR_DEADLOCK && r == NULL && fast == ZB_ERR_DEADLOCK;
  zb_sim_result_free(r);
  return ok;
}

/* Rank 0 runs B of microbatch 0 before its F: it waits for its own later
 * op, and rank 1 waits for that F. Both ranks are stuck at their first op. */
static void test_sim_deadlock_own_order(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  zb_costs *c = sim_costs(2, 1, 1, 1, 0, 1, -0.5, -0.5);
  char msg[256];
  bool dead = sim_deadlocks(s, c, msg, sizeof msg);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(dead);
  CHECK_MSG(strstr(msg, "rank 0") && strstr(msg, "rank 1"), "message does not name the stuck ranks: %s", msg);
}

/* A cross-rank cycle, m = 2: rank 0 runs B0.0 (needing B1.0) before F0.1;
 * rank 1 runs F1.1 (needing F0.1) before F1.0 and B1.0. Rank 0 gets past
 * F0.0 and sticks at #1; rank 1 sticks at #0. Without the cycle (rank 1
 * in 1F1B order, T = 1 each, T_comm = 0.5) the same rank-0 list
 * completes: rank 0 F0.0 0..1; rank 1 F1.0 1.5..2.5, B1.0 2.5..3.5; rank 0
 * B0.0 4..5, F0.1 5..6, W0.0 6..7; rank 1 F1.1 6.5..7.5, W1.0 7.5..8.5,
 * B1.1 8.5..9.5, W1.1 9.5..10.5; rank 0 B0.1 10..11, W0.1 11..12:
 * makespan and S_max 12. */
static void test_sim_deadlock_cycle(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  const zb_op ops0[] = {ZB_OP_F, ZB_OP_B, ZB_OP_F, ZB_OP_W, ZB_OP_B, ZB_OP_W};
  const int mbs0[] = {0, 0, 1, 0, 1, 1};
  const zb_op ops1[] = {ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_W, ZB_OP_B, ZB_OP_W};
  const int mbs1[] = {1, 0, 0, 0, 1, 1};
  for (int i = 0; i < 6; i++) {
    zb_schedule_push_op(s, 0, ops0[i], 0, mbs0[i]);
    zb_schedule_push_op(s, 1, ops1[i], 1, mbs1[i]);
  }
  zb_costs *c = sim_costs(2, 1, 1, 1, 0.5, 1, -0.5, -0.5);
  char msg[256];
  bool dead = sim_deadlocks(s, c, msg, sizeof msg);
  /* rank 1 in 1F1B order, F1.0 B1.0 F1.1 W1.0 B1.1 W1.1: completes */
  zb_action *a1 = s->ranks[1].actions;
  a1[0].mb = 0;
  a1[1].op = ZB_OP_B;
  a1[2].op = ZB_OP_F;
  a1[2].mb = 1;
  double mk = -1, span = -1;
  zb_err fixed = zb_simulate_makespan(s, c, &mk, &span);
  zb_costs_free(c);
  zb_schedule_free(s);
  CHECK(dead);
  CHECK_MSG(strstr(msg, "rank 0 at #1") && strstr(msg, "rank 1 at #0"), "message: %s", msg);
  CHECK_EQ(fixed, ZB_OK);
  CHECK_NEAR(mk, 12, SIM_EPS);
  CHECK_NEAR(span, 12, SIM_EPS);
}

/* One microbatch's F, B and W of stage0 on rank 0 and of stage1 on rank
 * 1 (p = 2, loop placement) under c: whether it simulates to the times
 * want0 and want1 ({start, end} per action) and the fast path agrees;
 * the makespan in *makespan. */
static bool sim_one_microbatch(int stage0, int stage1, const zb_costs *c, const double (*want0)[2],
                               const double (*want1)[2], double *makespan) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  const zb_op ops[] = {ZB_OP_F, ZB_OP_B, ZB_OP_W};
  for (int i = 0; i < 3; i++) {
    zb_schedule_push_op(s, 0, ops[i], stage0, 0);
    zb_schedule_push_op(s, 1, ops[i], stage1, 0);
  }
  zb_sim_result *r = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_simulate(s, c, &r, &d);
  if (err)
    fprintf(stderr, "  simulation failed: %s\n", d.msg);
  bool ok = !err && sim_times_are(s, r, 0, want0, 3) && sim_times_are(s, r, 1, want1, 3) &&
            sim_fast_path_agrees(s, c, r);
  *makespan = r ? r->makespan : -1;
  zb_sim_result_free(r);
  zb_schedule_free(s);
  return ok;
}

/* Lists on the wrong ranks (the validator's to refuse) still run as
 * their dependencies allow: each stage's F, B and W moved to the other
 * rank, p = 2, m = 1, T = 1 each, T_comm = 0.5. Whether an input crosses
 * ranks is read from placement, and by placement every input here stays
 * on its rank: no T_comm. Rank 0 holds stage 1's ops and waits for F0.0,
 * which rank 1 runs 0..1; F1.0 1..2, B1.0 2..3, W1.0 3..4 on rank 0;
 * B0.0 (after B1.0) 3..4 and W0.0 4..5 on rank 1: makespan 5. A
 * producer's output goes to the host of the consuming stage, which here
 * runs nothing that takes it: the run must find the waiting rank some
 * other way than the producer's notice. */
static void test_sim_misplaced_runs(void) {
  zb_costs *c = sim_costs(2, 1, 1, 1, 0.5, 1, -0.5, -0.5);
  const double rank0[][2] = {{1, 2}, {2, 3}, {3, 4}};
  const double rank1[][2] = {{0, 1}, {3, 4}, {4, 5}};
  double mk = -1;
  bool ok = sim_one_microbatch(1, 0, c, rank0, rank1, &mk);
  zb_costs_free(c);
  CHECK(ok);
  CHECK_NEAR(mk, 5, SIM_EPS);
}

/* An output made at time 0 counts as made: F takes no time (T_F = 0,
 * T_B = T_W = 1, T_comm = 0), p = 2, m = 1. F0.0 0..0; F1.0 0..0 (its
 * input ended at 0); B1.0 0..1, W1.0 1..2; B0.0 (after B1.0) 1..2, W0.0
 * 2..3: makespan 3. A run that took a zero end for "not yet" would wait
 * at F1.0 for ever (a layout where cells start as zeros was tried, and
 * kept a zero end as -0.0: this failed without it). */
static void test_sim_zero_time_output(void) {
  zb_costs *c = sim_costs(2, 0, 1, 1, 0, 1, -0.5, -0.5);
  const double rank0[][2] = {{0, 0}, {1, 2}, {2, 3}};
  const double rank1[][2] = {{0, 0}, {0, 1}, {1, 2}};
  double mk = -1;
  bool ok = sim_one_microbatch(0, 1, c, rank0, rank1, &mk);
  zb_costs_free(c);
  CHECK(ok);
  CHECK_NEAR(mk, 3, SIM_EPS);
}

/* p = 2, m = 1 with one extra action out of range (microbatch 5 or 7):
 * where the run meets it (rank 1 right after F(1,0), or as the second of
 * an overlapped pair) and where it never gets (rank 0 after a deadlock:
 * rank 1 runs B(1,0) before its own F). The run checks each action it
 * takes and stops at one out of range; a run that stops short names the
 * first in list order, as a pass before the run once did. The in-range
 * form takes the caller's word, so an action it never meets is not
 * looked for. */
static zb_schedule *sim_with_stray(int variant) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  static const zb_op ops[] = {ZB_OP_F, ZB_OP_B, ZB_OP_W};
  for (int k = 0; k < 3; k++)
    zb_schedule_push_op(s, 0, ops[k], 0, 0);
  if (variant == 2) {
    zb_schedule_push_op(s, 0, ZB_OP_F, 0, 7);
    zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
    zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
    zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
    return s;
  }
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  s->ranks[1].actions[0].overlap = variant == 1;
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 5);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  return s;
}

static void test_sim_out_of_range(void) {
  zb_costs *c = sim_costs(2, 1, 1, 1, 0, 1, -0.5, -0.5);
  static const char *const want[] = {"rank 1 action 1: stage 1 / microbatch 5 out of range",
                                     "rank 1 action 1: stage 1 / microbatch 5 out of range",
                                     "rank 0 action 3: stage 0 / microbatch 7 out of range"};
  for (int variant = 0; variant < 3; variant++) {
    zb_schedule *s = sim_with_stray(variant);
    zb_sim_result *r = NULL;
    zb_diag d = {{0}};
    CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_ERR_INVALID_ARG);
    CHECK(r == NULL);
    CHECK_MSG(strstr(d.msg, want[variant]) != NULL, "variant %d: %s", variant, d.msg);
    double mk, span;
    CHECK_EQ(zb_simulate_makespan(s, c, &mk, &span), ZB_ERR_INVALID_ARG);
    zb_err promised = zb_simulate_makespan_in_range(s, c, &mk, &span);
    CHECK_EQ(promised, variant == 2 ? ZB_ERR_DEADLOCK : ZB_ERR_INVALID_ARG);
    zb_schedule_free(s);
  }
  zb_costs_free(c);
}

/* Costs that do not describe the schedule's stages are refused. */
static void test_sim_wrong_costs(void) {
  zb_schedule *loop = sim_loop_schedule();               /* 2 stages */
  zb_schedule *v = zb_schedule_new(2, 2, 1, ZB_PLACE_V); /* 4 stages */
  zb_schedule_push_op(v, 0, ZB_OP_F, 0, 0);
  zb_costs *c3 = sim_costs(3, 1, 1, 1, 0, 1, -0.5, -0.5);
  zb_costs *c2 = sim_costs(2, 1, 1, 1, 0, 1, -0.5, -0.5);
  zb_sim_result *r = NULL;
  zb_diag d1 = {{0}}, d2 = {{0}}, d3 = {{0}};
  zb_err e1 = zb_simulate(loop, c3, &r, &d1);
  zb_err e2 = zb_simulate(v, c2, &r, &d2);
  zb_err e3 = zb_simulate(loop, NULL, &r, &d3);
  double mk, span;
  zb_err e4 = zb_simulate_makespan(loop, c3, &mk, &span);
  /* an op naming a stage the costs do not have */
  zb_schedule_push_op(loop, 1, ZB_OP_F, 2, 0);
  zb_diag d5 = {{0}};
  zb_err e5 = zb_simulate(loop, c2, &r, &d5);
  zb_schedule_free(v);
  zb_schedule_free(loop);
  zb_costs_free(c3);
  zb_costs_free(c2);
  CHECK(r == NULL);
  CHECK_EQ(e1, ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d1.msg, "3") && strstr(d1.msg, "2"), "message: %s", d1.msg);
  CHECK_EQ(e2, ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d2.msg, "2") && strstr(d2.msg, "4"), "message: %s", d2.msg);
  CHECK_EQ(e3, ZB_ERR_INVALID_ARG);
  CHECK(d3.msg[0] != '\0');
  CHECK_EQ(e4, ZB_ERR_INVALID_ARG);
  CHECK_EQ(e5, ZB_ERR_INVALID_ARG);
  CHECK(d5.msg[0] != '\0');
}

ZBT_MAIN(ZBT(test_sim_loop_by_hand), ZBT(test_sim_v_by_hand), ZBT(test_sim_fused_bw),
         ZBT(test_sim_uneven_stages), ZBT(test_sim_comm_adds_no_time), ZBT(test_sim_lowered_same_times),
         ZBT(test_sim_fast_path_on_generated), ZBT(test_sim_deadlock_own_order), ZBT(test_sim_deadlock_cycle),
         ZBT(test_sim_misplaced_runs), ZBT(test_sim_zero_time_output), ZBT(test_sim_wrong_costs),
         ZBT(test_sim_out_of_range))
