/* The simulator's device-ordered mode (zb_simulate_device, docs/schedules.md,
 * Execution model) against the host-blocking one (zb_simulate): on the
 * lowered standard families the two agree when T_comm = 0 (interleaved
 * aside) and the device-ordered one never beats the compute-only
 * simulation; a hand-worked
 * 2-rank case shows head-of-line blocking on the comm stream to the
 * unit; crossing sends that buffered sends survive deadlock on the
 * device, and the validator (rendezvous groups) rejects them; the window
 * holds compute behind old groups. */
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define EPS 1e-9

static zb_costs *dev_costs(int n, double tf, double tb, double tw, double tcomm) {
  zb_costs *c = zb_costs_new(n);
  for (int s = 0; s < n; s++) {
    c->t_f[s] = tf;
    c->t_b[s] = tb;
    c->t_w[s] = tw;
    c->m_f[s] = 1;
    c->m_b[s] = -0.5;
    c->m_w[s] = -0.5;
  }
  c->t_comm = tcomm;
  return c;
}

static void push_comm(zb_schedule *s, int rank, zb_op op, int stage, int mb, int peer) {
  zb_schedule_push(s, rank, (zb_action){.op = (uint8_t)op, .stage = stage, .mb = mb, .peer = peer});
}

/* Family f at (p, m) lowered under c; makespans of the compute-only lists
 * in *cmp and of the lowered ones in both modes in *blk and *dev.
 * *ran false when the family refuses the shape. */
static void family_modes(zb_family f, int p, int m, const zb_costs *c, double *cmp, double *blk, double *dev,
                         bool *ran) {
  int v = zb_family_default_chunks(f);
  zb_plan_request req = {.family = f, .p = p, .v = v, .m = m, .costs = c};
  zb_schedule *s = NULL, *low = NULL;
  zb_sim_result *rb = NULL, *rd = NULL;
  zb_diag d = {{0}};
  *ran = zb_plan_generate(&req, &s, &d) == ZB_OK;
  if (!*ran)
    return;
  CHECK_EQ(zb_lower(s, c, &low, &d), ZB_OK);
  CHECK_EQ(zb_simulate_figures(s, c, &rb, &d), ZB_OK);
  *cmp = rb ? rb->makespan : 0;
  zb_sim_result_free(rb);
  CHECK_EQ(zb_simulate_mode(low, c, ZB_SIM_BLOCKING, &rb, &d), ZB_OK);
  zb_err e = zb_simulate_mode(low, c, ZB_SIM_DEVICE, &rd, &d);
  CHECK_MSG(e == ZB_OK, "%s p=%d m=%d: %s", zb_family_name(f), p, m, d.msg);
  *blk = rb ? rb->makespan : 0;
  *dev = rd ? rd->makespan : 0;
  zb_sim_result_free(rb);
  zb_sim_result_free(rd);
  zb_schedule_free(low);
  zb_schedule_free(s);
}

/* Over the standard families at small p, m: with T_comm = 0 both modes
 * agree, except interleaved-1F1B, whose sends wait for producers that
 * later receives on the comm stream queue behind (head-of-line, a unit
 * later at p = 2, m = 3); the device-ordered mode is never below the
 * compute-only simulation (every transfer starts no earlier than its
 * producer's end). With T_comm > 0 it is often slower than the blocking
 * one: a consumer waits for its receive's whole group, sends batched with
 * it included, and one comm stream runs the groups one at a time
 * (docs/schedules.md, Execution model). The counts are printed. */
static void test_families(void) {
  const zb_family fams[] = {ZB_FAMILY_GPIPE, ZB_FAMILY_1F1B,  ZB_FAMILY_INTERLEAVED_1F1B,
                            ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_H2, ZB_FAMILY_ZB_V,
                            ZB_FAMILY_V_HALF};
  const double tcomms[] = {0, 0.3, 1, 2.5};
  int compared = 0, slower = 0, faster = 0;
  double worst = 1;
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++)
    for (int p = 2; p <= 4; p++)
      for (int m = p; m <= 2 * p + 1; m++)
        for (size_t t = 0; t < sizeof tcomms / sizeof tcomms[0]; t++) {
          int v = zb_family_default_chunks(fams[k]);
          zb_costs *c = dev_costs(p * v, 1, 1, 1, tcomms[t]);
          double cmp = 0, blk = 0, dev = 0;
          bool ran = false;
          family_modes(fams[k], p, m, c, &cmp, &blk, &dev, &ran);
          zb_costs_free(c);
          if (!ran)
            continue;
          compared++;
          const char *name = zb_family_name(fams[k]);
          CHECK_MSG(dev >= cmp - EPS, "%s p=%d m=%d T_comm=%g: device %g below compute-only %g", name, p, m,
                    tcomms[t], dev, cmp);
          if (tcomms[t] == 0 && fams[k] != ZB_FAMILY_INTERLEAVED_1F1B)
            CHECK_MSG(fabs(blk - dev) < EPS, "%s p=%d m=%d T_comm=0: blocking %g, device %g", name, p, m, blk,
                      dev);
          slower += dev > blk + EPS;
          faster += dev < blk - EPS;
          worst = dev / blk > worst ? dev / blk : worst;
        }
  printf("device-ordered vs blocking over %d cases: %d slower, %d faster, worst ratio %.3f\n", compared,
         slower, faster, worst);
  CHECK(compared > 100);
}

/* The hand-worked case (docs/schedules.md, Execution model). Two ranks,
 * stage 0 on rank 0 (T_F = 3), stage 1 on rank 1 (T_F = 1), T_B = T_W = 1,
 * T_comm = 1. Rank 1 posts its receive of microbatch 1 before its send of
 * B(1,0), so that send waits behind the late receive. */
static zb_schedule *hol_lists(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  push_comm(s, 0, ZB_OP_SEND_F, 0, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 1);
  push_comm(s, 0, ZB_OP_SEND_F, 0, 1, 1);
  push_comm(s, 0, ZB_OP_RECV_B, 0, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);
  push_comm(s, 0, ZB_OP_RECV_B, 0, 1, 1);
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_W, 0, 1);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  push_comm(s, 1, ZB_OP_SEND_B, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 1);
  push_comm(s, 1, ZB_OP_SEND_B, 1, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 1);
  return s;
}

static void check_times(const zb_sim_result *r, int rank, const double (*want)[2], int n) {
  for (int i = 0; i < n; i++)
    CHECK_MSG(fabs(r->start[rank][i] - want[i][0]) < EPS && fabs(r->end[rank][i] - want[i][1]) < EPS,
              "rank %d action %d: [%g, %g], want [%g, %g]", rank, i, r->start[rank][i], r->end[rank][i],
              want[i][0], want[i][1]);
}

static void test_head_of_line(void) {
  zb_schedule *s = hol_lists();
  zb_costs *c = dev_costs(2, 1, 1, 1, 1);
  c->t_f[0] = 3;
  zb_diag d = {{0}};
  zb_violation v;
  CHECK_EQ(zb_validate(s, c, &v), ZB_OK);
  zb_sim_result *r = NULL;
  CHECK_EQ(zb_simulate_device(s, c, ZB_SIM_WINDOW, &r, &d), ZB_OK);
  /* Rank 0: F(0,0) [0,3]; its send starts at 3 and meets rank 1's receive
   * (posted at 0) at 3 + 1 = 4. F(0,1) [3,6]; its send starts at 6, the
   * receive (after the first group, 4) then, done at 7. RECV_B(0,0) is
   * next on rank 0's comm stream: starts at 7. Rank 1: F(1,0) waits for
   * its receive, [4,5]; B(1,0) [5,6]. SEND_B(1,0)'s producer ended at 6,
   * but RECV_F(1,1) is before it on the comm stream and ends at 7: the
   * send starts at 7, not 6 (head-of-line blocking), arrives at 8, so
   * B(0,0) runs [8,9] where an unblocked stream gives [7,8]. F(1,1) [7,8]
   * (its input at 7), B(1,1) [8,9], SEND_B(1,1) [9,10] (after the group
   * ending 8 and its producer at 9); RECV_B(0,1) starts at 8 (after the
   * group ending 8), done at 10, B(0,1) [10,11], W [11,12] [12,13];
   * rank 1's W [9,10] [10,11]. Makespan 13. */
  const double r0[][2] = {{0, 3}, {3, 4},  {3, 6},   {6, 7},   {7, 8},
                          {8, 9}, {8, 10}, {10, 11}, {11, 12}, {12, 13}};
  const double r1[][2] = {{0, 4}, {4, 5}, {4, 7}, {5, 6}, {7, 8}, {7, 8}, {8, 9}, {9, 10}, {9, 10}, {10, 11}};
  if (r) {
    check_times(r, 0, r0, 10);
    check_times(r, 1, r1, 10);
    CHECK(fabs(r->makespan - 13) < EPS);
  }
  zb_sim_result_free(r);
  /* Host-blocking: RECV_F(1,1) holds rank 1 until 7, so B(1,0) runs [7,8]
   * and arrives at 9: B(0,0) [9,10], RECV_B(0,1) after B(1,1) [9,10] at
   * 11, B(0,1) [11,12], W [12,13] [13,14]: makespan 14. */
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  if (r)
    CHECK(fabs(r->makespan - 14) < EPS);
  zb_sim_result_free(r);
  /* Compute only (the comm actions stripped): B(0,0)'s input arrives at
   * B(1,0)'s end + T_comm = 7, as if the send had not queued. */
  zb_schedule_strip_comm(s);
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  if (r)
    CHECK(fabs(r->start[0][2] - 7) < EPS); /* rank 0: F F B ... */
  zb_sim_result_free(r);
  zb_costs_free(c);
  zb_schedule_free(s);
}

/* Rank 0 sends both F before receiving; rank 1 receives F0, sends B0,
 * then receives F1. Buffered sends (the blocking form) finish; on one
 * comm stream per rank with rendezvous transfers rank 0's second send
 * waits for rank 1's second receive, which waits behind rank 1's send,
 * which waits for rank 0's receive, behind rank 0's second send. */
static void test_crossing_deadlock(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 1);
  push_comm(s, 0, ZB_OP_SEND_F, 0, 0, 1);
  push_comm(s, 0, ZB_OP_SEND_F, 0, 1, 1);
  push_comm(s, 0, ZB_OP_RECV_B, 0, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 0);
  push_comm(s, 0, ZB_OP_RECV_B, 0, 1, 1);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 1);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_BW, 1, 0);
  push_comm(s, 1, ZB_OP_SEND_B, 1, 0, 0);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_BW, 1, 1);
  push_comm(s, 1, ZB_OP_SEND_B, 1, 1, 0);
  zb_costs *c = dev_costs(2, 1, 1, 1, 0.5);
  zb_diag d = {{0}};
  zb_sim_result *r = NULL;
  CHECK_EQ(zb_simulate(s, c, &r, &d), ZB_OK);
  zb_sim_result_free(r);
  r = NULL;
  CHECK_EQ(zb_simulate_device(s, c, ZB_SIM_WINDOW, &r, &d), ZB_ERR_DEADLOCK);
  CHECK(r == NULL);
  CHECK(strstr(d.msg, "device-ordered") != NULL);
  zb_violation v;
  CHECK_EQ(zb_validate(s, c, &v), ZB_ERR_INVALID_SCHEDULE);
  CHECK_EQ(v.kind, ZB_VIOL_DEADLOCK);
  zb_costs_free(c);
  zb_schedule_free(s);
}

/* The window. Three ranks, T_F of stage 2 is 10, the rest 1, T_comm 0.
 * Rank 1 receives B(2,0) before F(1,1) and F(1,2), so those receives end
 * at 13 (B(2,0): F(2,0) [2,12], B [12,13]), and rank 0's sends of
 * microbatches 1 and 2 with them. F(0,3) follows three groups: with a
 * window of 8 it runs [3,4]; with a window of 1 the host posts the third
 * group only once the second completed (13), so F(0,3) starts at 13. */
static zb_schedule *window_lists(void) {
  zb_schedule *s = zb_schedule_new(3, 1, 4, ZB_PLACE_LOOP);
  for (int mb = 0; mb < 3; mb++) {
    zb_schedule_push_op(s, 0, ZB_OP_F, 0, mb);
    push_comm(s, 0, ZB_OP_SEND_F, 0, mb, 1);
  }
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 3);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  push_comm(s, 1, ZB_OP_SEND_F, 1, 0, 2);
  push_comm(s, 1, ZB_OP_RECV_B, 1, 0, 2);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 1, 0);
  push_comm(s, 1, ZB_OP_RECV_F, 1, 2, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 2);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  push_comm(s, 2, ZB_OP_RECV_F, 2, 0, 1);
  zb_schedule_push_op(s, 2, ZB_OP_F, 2, 0);
  zb_schedule_push_op(s, 2, ZB_OP_B, 2, 0);
  push_comm(s, 2, ZB_OP_SEND_B, 2, 0, 1);
  return s;
}

static void test_window(void) {
  zb_schedule *s = window_lists();
  zb_costs *c = dev_costs(3, 1, 1, 1, 0);
  c->t_f[2] = 10;
  zb_diag d = {{0}};
  const int windows[] = {ZB_SIM_WINDOW, 0, 1}, want[] = {3, 3, 13};
  for (int k = 0; k < 3; k++) {
    zb_sim_result *r = NULL;
    CHECK_EQ(zb_simulate_device(s, c, windows[k], &r, &d), ZB_OK);
    if (!r)
      continue;
    CHECK_MSG(fabs(r->start[0][6] - want[k]) < EPS, "window %d: F(0,3) at %g, want %d", windows[k],
              r->start[0][6], want[k]);
    CHECK_MSG(fabs(r->start[1][6] - 13) < EPS, "window %d: F(1,1) at %g", windows[k], r->start[1][6]);
    CHECK(fabs(r->makespan - 16) < EPS); /* B(1,0) [15,16] */
    zb_sim_result_free(r);
  }
  zb_costs_free(c);
  zb_schedule_free(s);
}

ZBT_MAIN(ZBT(test_families), ZBT(test_head_of_line), ZBT(test_crossing_deadlock), ZBT(test_window))
