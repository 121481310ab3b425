/* test_schedule.c — the vocabulary of libzb: schedules (new, clone, push,
 * free), placement, op kinds, stripping comm actions, the cost model
 * (whole-share division, checks), family names and shape refusals, and
 * lowering: every SEND meets its RECV on the peer, and lowered lists
 * validate and strip back to the compute lists they came from.
 */
/* First, so this unit checks that the umbrella header stands on its own. */
#include "zb.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_validate.h"
#include "zbtest.h"

/* ---- helpers ---------------------------------------------------------- */

static bool same_action(const zb_action *a, const zb_action *b) {
  return a->op == b->op && a->stage == b->stage && a->mb == b->mb && a->peer == b->peer &&
         a->batch == b->batch;
}

/* Whether a and b have the same shape and identical lists. */
static bool same_lists(const zb_schedule *a, const zb_schedule *b) {
  if (a->p != b->p || a->v != b->v || a->m != b->m || a->placement != b->placement)
    return false;
  for (int r = 0; r < a->p; r++) {
    if (a->ranks[r].n != b->ranks[r].n)
      return false;
    for (int i = 0; i < a->ranks[r].n; i++)
      if (!same_action(&a->ranks[r].actions[i], &b->ranks[r].actions[i]))
        return false;
  }
  return true;
}

/* Index of the first action on rank r with this op, stage and mb; -1. */
static int find_action(const zb_schedule *s, int r, zb_op op, int stage, int mb) {
  for (int i = 0; i < s->ranks[r].n; i++) {
    const zb_action *a = &s->ranks[r].actions[i];
    if (a->op == op && a->stage == stage && a->mb == mb)
      return i;
  }
  return -1;
}

/* Number of actions on rank r with this op, stage and mb. */
static int count_action(const zb_schedule *s, int r, zb_op op, int stage, int mb) {
  int n = 0;
  for (int i = 0; i < s->ranks[r].n; i++) {
    const zb_action *a = &s->ranks[r].actions[i];
    n += a->op == op && a->stage == stage && a->mb == mb;
  }
  return n;
}

/* ---- schedules -------------------------------------------------------- */

static void test_new_clone_free(void) {
  CHECK(zb_schedule_new(0, 1, 4, ZB_PLACE_LOOP) == NULL);
  CHECK(zb_schedule_new(2, 0, 4, ZB_PLACE_LOOP) == NULL);
  CHECK(zb_schedule_new(2, 1, 0, ZB_PLACE_LOOP) == NULL);
  CHECK(zb_schedule_new(-1, 1, 4, ZB_PLACE_LOOP) == NULL);
  CHECK(zb_schedule_new(ZB_MAX_RANKS + 1, 1, 4, ZB_PLACE_LOOP) == NULL); /* a peer is 16 bits */
  zb_schedule *widest = zb_schedule_new(ZB_MAX_RANKS, 1, 4, ZB_PLACE_LOOP);
  CHECK(widest != NULL);
  zb_schedule_free(widest);
  /* an action's stage is 18 bits and its microbatch 24 */
  CHECK(zb_schedule_new(ZB_MAX_RANKS, 5, 4, ZB_PLACE_LOOP) == NULL); /* 163835 stages */
  CHECK(zb_schedule_new(2, 1, ZB_MAX_MICROBATCHES + 1, ZB_PLACE_LOOP) == NULL);
  widest = zb_schedule_new(ZB_MAX_STAGES, 1, ZB_MAX_MICROBATCHES, ZB_PLACE_LOOP);
  CHECK(widest == NULL); /* ZB_MAX_STAGES is above ZB_MAX_RANKS: ranks refuse first */
  widest = zb_schedule_new(ZB_MAX_RANKS, 4, ZB_MAX_MICROBATCHES, ZB_PLACE_LOOP);
  CHECK(widest != NULL);
  zb_schedule_push_op(widest, ZB_MAX_RANKS - 1, ZB_OP_F, 4 * ZB_MAX_RANKS - 1, ZB_MAX_MICROBATCHES - 1);
  const zb_action *last = widest->ranks[ZB_MAX_RANKS - 1].actions;
  CHECK(last->stage == 4 * ZB_MAX_RANKS - 1 && last->mb == ZB_MAX_MICROBATCHES - 1 && last->op == ZB_OP_F);
  zb_schedule_free(widest);
  zb_schedule_free(NULL);

  zb_schedule *s = zb_schedule_new(3, 2, 5, ZB_PLACE_V);
  CHECK(s != NULL);
  bool shape =
      s->p == 3 && s->v == 2 && s->m == 5 && s->placement == ZB_PLACE_V && zb_schedule_stages(s) == 6;
  bool empty = true;
  for (int r = 0; r < 3; r++)
    empty = empty && s->ranks[r].n == 0;
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push(s, 1, (zb_action){.op = ZB_OP_SEND_F, .stage = 1, .mb = 0, .peer = 2, .batch = true});
  zb_schedule *c = zb_schedule_clone(s);
  bool cloned = same_lists(s, c) && c->ranks != s->ranks && c->ranks[1].actions != s->ranks[1].actions;
  /* the copy is deep: changing it leaves the original alone */
  c->ranks[1].actions[0].mb = 4;
  zb_schedule_push_op(c, 0, ZB_OP_F, 0, 0);
  bool independent = s->ranks[1].actions[0].mb == 0 && s->ranks[0].n == 0 && c->ranks[0].n == 1;
  zb_schedule_free(c);
  zb_schedule_free(s);
  CHECK(shape);
  CHECK(empty);
  CHECK(cloned);
  CHECK(independent);
}

/* Lists in one block: each fills its own room, and one that outgrows it
 * moves out with its actions while its neighbours stay put. Large enough
 * (about 10 MB) to take the huge-page path of zb_malloc_large. */
static void test_reserve_all_block(void) {
  enum { BIG = 600000 };
  zb_schedule *s = zb_schedule_new(3, 1, BIG, ZB_PLACE_LOOP);
  int n[3] = {3, 0, BIG};
  zb_schedule_reserve_all(s, n);
  for (int i = 0; i < 3; i++)
    zb_schedule_push_op(s, 0, ZB_OP_F, 0, i);
  for (int i = 0; i < BIG; i++)
    zb_schedule_push_op(s, 2, ZB_OP_W, 2, i);
  bool in_block = s->ranks[0].in_block && s->ranks[2].in_block && s->ranks[0].actions == s->block &&
                  s->ranks[2].actions >= s->block + 3; /* past rank 0's room */
  zb_schedule_push_op(s, 0, ZB_OP_B, 0, 0);            /* past its room of 3 */
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);            /* no room at all */
  bool moved = !s->ranks[0].in_block && s->ranks[0].n == 4 && s->ranks[0].actions[2].mb == 2 &&
               s->ranks[0].actions[3].op == ZB_OP_B && s->ranks[1].n == 1 && !s->ranks[1].in_block;
  bool kept = s->ranks[2].in_block && s->ranks[2].n == BIG;
  for (int i = 0; i < BIG && kept; i++)
    kept = s->ranks[2].actions[i].op == ZB_OP_W && s->ranks[2].actions[i].mb == i;
  zb_schedule *c = zb_schedule_clone(s);
  bool cloned = same_lists(s, c) && c->block != NULL && c->ranks[2].actions != s->ranks[2].actions;
  zb_schedule_free(c);
  zb_schedule_free(s); /* ASan: the moved lists and the block freed once each */
  CHECK(in_block);
  CHECK(moved);
  CHECK(kept);
  CHECK(cloned);
}

static void test_push_grows_in_order(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 100, ZB_PLACE_LOOP);
  for (int i = 0; i < 100; i++)
    zb_schedule_push_op(s, 1, i % 2 ? ZB_OP_BW : ZB_OP_F, 1, i);
  zb_schedule_push(s, 0, (zb_action){.op = ZB_OP_RECV_B, .stage = 0, .mb = 7, .peer = 1, .batch = true});
  bool ordered = s->ranks[1].n == 100 && s->ranks[1].cap >= 100;
  for (int i = 0; i < 100 && ordered; i++) {
    const zb_action *a = &s->ranks[1].actions[i];
    ordered =
        a->op == (i % 2 ? ZB_OP_BW : ZB_OP_F) && a->stage == 1 && a->mb == i && a->peer == -1 && !a->batch;
  }
  const zb_action *r0 = &s->ranks[0].actions[0];
  bool kept = s->ranks[0].n == 1 && r0->op == ZB_OP_RECV_B && r0->mb == 7 && r0->peer == 1 && r0->batch;
  int computes = zb_schedule_compute_count(s, 1), computes0 = zb_schedule_compute_count(s, 0);
  zb_schedule_free(s);
  CHECK(ordered);
  CHECK(kept);
  CHECK_EQ(computes, 100);
  CHECK_EQ(computes0, 0);
}

/* ---- placement -------------------------------------------------------- */

static void test_loop_placement(void) {
  zb_schedule *s = zb_schedule_new(4, 3, 8, ZB_PLACE_LOOP);
  int hosted[4] = {0};
  for (int st = 0; st < 12; st++) {
    int r = zb_stage_rank(s, st);
    CHECK_EQ(r, st % 4);
    CHECK_EQ(zb_placement_rank(ZB_PLACE_LOOP, 4, 3, st), r);
    hosted[r]++;
  }
  zb_schedule_free(s);
  for (int r = 0; r < 4; r++)
    CHECK_EQ(hosted[r], 3);
  CHECK_EQ(zb_placement_rank(ZB_PLACE_LOOP, 1, 2, 1), 0);
}

static void test_v_placement(void) {
  /* p = 4: stages 0..7 go down the ranks and back up */
  static const int want[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  zb_schedule *s = zb_schedule_new(4, 2, 8, ZB_PLACE_V);
  for (int st = 0; st < 8; st++) {
    CHECK_EQ(zb_stage_rank(s, st), want[st]);
    CHECK_EQ(zb_placement_rank(ZB_PLACE_V, 4, 2, st), want[st]);
  }
  zb_schedule_free(s);
  /* every rank hosts exactly stages r and 2p-1-r */
  for (int p = 1; p <= 6; p++)
    for (int st = 0; st < 2 * p; st++) {
      int r = zb_placement_rank(ZB_PLACE_V, p, 2, st);
      CHECK(r >= 0 && r < p);
      CHECK(st == r || st == 2 * p - 1 - r);
    }
  /* the families agree with the rule they claim */
  CHECK_EQ(zb_family_placement(ZB_FAMILY_ZB_V), ZB_PLACE_V);
  CHECK_EQ(zb_family_placement(ZB_FAMILY_V_MIN), ZB_PLACE_V);
  CHECK_EQ(zb_family_placement(ZB_FAMILY_INTERLEAVED_1F1B), ZB_PLACE_LOOP);
  CHECK_EQ(zb_family_default_chunks(ZB_FAMILY_V_HALF), 2);
  CHECK_EQ(zb_family_default_chunks(ZB_FAMILY_ZB_H1), 1);
}

/* ---- op kinds --------------------------------------------------------- */

static void test_op_kinds(void) {
  int compute = 0, comm = 0;
  for (int k = 0; k < ZB_OP_COUNT_; k++) {
    zb_op op = (zb_op)k;
    bool want_compute = op == ZB_OP_F || op == ZB_OP_B || op == ZB_OP_W || op == ZB_OP_BW;
    bool want_comm = op == ZB_OP_SEND_F || op == ZB_OP_RECV_F || op == ZB_OP_SEND_B || op == ZB_OP_RECV_B;
    CHECK_MSG(zb_op_is_compute(op) == want_compute, "zb_op_is_compute(%s)", zb_op_name(op));
    CHECK_MSG(zb_op_is_comm(op) == want_comm, "zb_op_is_comm(%s)", zb_op_name(op));
    compute += zb_op_is_compute(op);
    comm += zb_op_is_comm(op);
    CHECK(strcmp(zb_op_name(op), "?") != 0);
    for (int j = 0; j < k; j++)
      CHECK_MSG(strcmp(zb_op_name((zb_op)j), zb_op_name(op)) != 0, "ops %d and %d share a name", j, k);
  }
  CHECK_EQ(compute, 4);
  CHECK_EQ(comm, 4);
  CHECK_STREQ(zb_op_name(ZB_OP_BW), "BW");
  CHECK_STREQ(zb_op_name(ZB_OP_SEND_F), "SEND_F");
  CHECK_STREQ(zb_op_name(ZB_OP_RECV_B), "RECV_B");
  CHECK_STREQ(zb_op_name(ZB_OP_COUNT_), "?");
}

static void test_has_comm_and_splits_w(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  bool empty_splits = zb_schedule_splits_w(s), empty_comm = zb_schedule_has_comm(s);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_W, 1, 0);
  bool split = zb_schedule_splits_w(s);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 0);
  bool fused = !zb_schedule_splits_w(s);
  bool no_comm = !zb_schedule_has_comm(s);
  zb_schedule_push(s, 1, (zb_action){.op = ZB_OP_RECV_F, .stage = 1, .mb = 0, .peer = 0});
  bool comm = zb_schedule_has_comm(s);
  zb_schedule_strip_comm(s);
  bool stripped = !zb_schedule_has_comm(s) && s->ranks[1].n == 3 && s->ranks[0].n == 2;
  zb_schedule_free(s);
  CHECK(empty_splits);
  CHECK(!empty_comm);
  CHECK(split);
  CHECK(fused);
  CHECK(no_comm);
  CHECK(comm);
  CHECK(stripped);
}

static void test_strip_comm_keeps_fsdp_in_order(void) {
  zb_schedule *s = zb_schedule_new(2, 1, 1, ZB_PLACE_LOOP);
  const zb_action list[] = {
      {.op = ZB_OP_UNSHARD, .stage = 1, .mb = -1, .peer = -1},
      {.op = ZB_OP_RECV_F, .stage = 1, .mb = 0, .peer = 0, .batch = false},
      {.op = ZB_OP_F, .stage = 1, .mb = 0, .peer = -1},
      {.op = ZB_OP_BW, .stage = 1, .mb = 0, .peer = -1},
      {.op = ZB_OP_SEND_B, .stage = 1, .mb = 0, .peer = 0},
      {.op = ZB_OP_REDUCE_GRAD, .stage = 1, .mb = -1, .peer = -1},
  };
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
    zb_schedule_push(s, 1, list[i]);
  zb_schedule_strip_comm(s);
  static const int kept[] = {0, 2, 3, 5};
  bool ok = s->ranks[1].n == 4;
  for (int i = 0; i < 4 && ok; i++)
    ok = same_action(&s->ranks[1].actions[i], &list[kept[i]]);
  zb_schedule_free(s);
  CHECK(ok);
}

/* ---- costs ------------------------------------------------------------ */

static void test_costs_from_rank_share(void) {
  zb_rank_costs rc = {.t_f = 6, .t_b = 4, .t_w = 2, .t_comm = 0.5, .m_f = 3, .m_b = -2, .m_w = -1};
  zb_costs *c = zb_costs_from_rank_share(3, 2, &rc, 7);
  CHECK_EQ(c->n_stages, 6);
  for (int s = 0; s < 6; s++) {
    CHECK_NEAR(c->t_f[s], 3, 1e-12);
    CHECK_NEAR(c->t_b[s], 2, 1e-12);
    CHECK_NEAR(c->t_w[s], 1, 1e-12);
    CHECK_NEAR(c->m_f[s], 1.5, 1e-12);
    CHECK_NEAR(c->m_b[s], -1, 1e-12);
    CHECK_NEAR(c->m_w[s], -0.5, 1e-12);
  }
  CHECK_NEAR(c->t_comm, 0.5, 1e-12); /* per hop: not divided */
  CHECK_NEAR(c->mem_limit, 7, 1e-12);
  CHECK_EQ(zb_costs_check(c, NULL), ZB_OK);
  /* a rank's whole share of M_F is the unit of peaks and limits */
  CHECK_NEAR(zb_costs_rank_mf(c, ZB_PLACE_LOOP, 3, 2, 1), 3, 1e-12);
  CHECK_NEAR(zb_costs_rank_mf(c, ZB_PLACE_V, 3, 2, 2), 3, 1e-12);
  CHECK_NEAR(zb_costs_time(c, ZB_OP_BW, 4), 3, 1e-12);
  CHECK_NEAR(zb_costs_time(c, ZB_OP_F, 4), 3, 1e-12);
  CHECK_NEAR(zb_costs_time(c, ZB_OP_SEND_F, 4), 0, 1e-12);
  CHECK_NEAR(zb_costs_mem(c, ZB_OP_BW, 4), -1.5, 1e-12);
  CHECK_NEAR(zb_costs_mem(c, ZB_OP_W, 4), -0.5, 1e-12);
  CHECK_NEAR(zb_costs_mem(c, ZB_OP_RECV_F, 4), 0, 1e-12);
  /* clone is deep */
  zb_costs *d = zb_costs_clone(c);
  d->t_f[0] = 99;
  bool same =
      d->n_stages == 6 && d->t_comm == c->t_comm && d->mem_limit == c->mem_limit && d->m_w[5] == c->m_w[5];
  bool independent = c->t_f[0] == 3;
  zb_costs_free(d);
  zb_costs_free(c);
  zb_costs_free(NULL);
  CHECK(same);
  CHECK(independent);
  /* v = 1 keeps the figures as given */
  zb_rank_costs def = zb_rank_costs_default();
  c = zb_costs_from_rank_share(2, 1, &def, 0);
  bool unit = c->t_f[1] == 1 && c->t_b[1] == 1 && c->t_w[1] == 1 && c->m_f[1] == 1 && c->m_b[1] == -0.5 &&
              c->m_w[1] == -0.5 && c->t_comm == 0 && c->mem_limit == 0;
  zb_costs_free(c);
  CHECK(unit);
}

/* Applies one corruption to valid unit costs (4 stages) and expects
 * zb_costs_check to refuse with a message holding both needles. */
static bool costs_refused(int what, const char *needle1, const char *needle2) {
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(2, 2, &rc, 0);
  switch (what) {
  case 0: c->t_b[2] = -1; break;
  case 1: c->t_f[1] = NAN; break;
  case 2: c->t_comm = -0.25; break;
  case 3: c->m_b[3] = -0.75, c->m_w[3] = 0.25; break; /* sums to zero, W grows memory */
  case 4: c->m_f[0] = -0.5, c->m_b[0] = 0.25, c->m_w[0] = 0.25; break;
  case 5: c->m_w[1] = -0.5; break; /* M_F + M_B + M_W = -0.25 */
  case 6: c->mem_limit = INFINITY; break;
  }
  zb_diag d = {{0}};
  zb_err err = zb_costs_check(c, &d);
  zb_err err_nodiag = zb_costs_check(c, NULL);
  zb_costs_free(c);
  bool ok = err == ZB_ERR_INVALID_ARG && err_nodiag == ZB_ERR_INVALID_ARG && strstr(d.msg, needle1) &&
            strstr(d.msg, needle2);
  if (!ok)
    fprintf(stderr, "  case %d: err %d, \"%s\"\n", what, err, d.msg);
  return ok;
}

static void test_costs_check_refusals(void) {
  CHECK(costs_refused(0, "T_B", "stage 2"));
  CHECK(costs_refused(1, "T_F", "stage 1"));
  CHECK(costs_refused(2, "T_comm", ">= 0"));
  CHECK(costs_refused(3, "stage 3", "M_W <= 0"));
  CHECK(costs_refused(4, "stage 0", "M_F >= 0"));
  CHECK(costs_refused(5, "stage 1", "sum to zero"));
  CHECK(costs_refused(6, "memory limit", "finite"));
}

/* ---- families and shapes ---------------------------------------------- */

static void test_check_shape_says_what_is_needed(void) {
  zb_diag d = {{0}};
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_ZB_H1, 4, 1, 8, &d), ZB_OK);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, 4, 3, 8, &d), ZB_OK);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_ZB_V, 4, 2, 3, &d), ZB_OK);
  /* interleaved: any m >= p (not only multiples); fewer is refused saying so */
  static const int pm[][2] = {{4, 6}, {3, 7}, {5, 11}};
  for (size_t k = 0; k < sizeof pm / sizeof pm[0]; k++)
    CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, pm[k][0], 2, pm[k][1], NULL), ZB_OK);
  memset(&d, 0, sizeof d);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, 4, 2, 2, &d), ZB_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(d.msg, "at least as many microbatches as ranks") != NULL, "\"%s\"", d.msg);
  /* zb-interleaved: any m, at least 2 chunks */
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_ZB_INTERLEAVED, 4, 2, 3, NULL), ZB_OK);
  memset(&d, 0, sizeof d);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_ZB_INTERLEAVED, 4, 1, 8, &d), ZB_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(d.msg, "at least 2 chunks") != NULL, "\"%s\"", d.msg);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, 4, 1, 8, &d), ZB_ERR_UNSUPPORTED);
  CHECK(strstr(d.msg, "at least 2 chunks") != NULL);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_V_MIN, 4, 3, 8, &d), ZB_ERR_UNSUPPORTED);
  CHECK(strstr(d.msg, "v-min") && strstr(d.msg, "2 chunks"));
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_ZB_H2, 4, 2, 8, &d), ZB_ERR_UNSUPPORTED);
  CHECK(strstr(d.msg, "zb-h2") && strstr(d.msg, "one chunk") && strstr(d.msg, "interleaved-1f1b"));
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_1F1B, 0, 1, 8, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "at least 1 rank") != NULL);
  /* a peer is 16 bits: past ZB_MAX_RANKS, refused by name */
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_1F1B, ZB_MAX_RANKS + 1, 1, 8, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "at most 32767 ranks (got 32768)") != NULL);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_1F1B, ZB_MAX_RANKS, 1, 8, &d), ZB_OK);
  /* and a stage 18 bits, a microbatch 24 */
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, 16384, 8, 16384, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "at most 131071 stages (got 16384 ranks x 8 chunks)") != NULL);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_INTERLEAVED_1F1B, 16383, 8, 16384, &d), ZB_OK);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_1F1B, 8, 1, ZB_MAX_MICROBATCHES + 1, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "at most 8388607 microbatches") != NULL);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_GPIPE, 2, 1, 0, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "at least 1 microbatch") != NULL);
  CHECK_EQ(zb_plan_check_shape(ZB_FAMILY_COUNT_, 2, 1, 2, &d), ZB_ERR_INVALID_ARG);
}

static void test_family_names(void) {
  zb_family f = ZB_FAMILY_COUNT_;
  for (int k = 0; k < ZB_FAMILY_COUNT_; k++) {
    const char *name = zb_family_name((zb_family)k);
    CHECK(strcmp(name, "?") != 0);
    CHECK_EQ(zb_family_parse(name, &f, NULL), ZB_OK);
    CHECK_EQ(f, k);
  }
  CHECK_STREQ(zb_family_name(ZB_FAMILY_INTERLEAVED_1F1B), "interleaved-1f1b");
  CHECK_STREQ(zb_family_name(ZB_FAMILY_COUNT_), "?");
  zb_diag d = {{0}};
  f = ZB_FAMILY_GPIPE;
  CHECK_EQ(zb_family_parse("zb-h1x", &f, &d), ZB_ERR_INVALID_ARG);
  CHECK_EQ(f, ZB_FAMILY_GPIPE); /* untouched on failure */
  CHECK(strstr(d.msg, "zb-h1x") != NULL);
  for (int k = 0; k < ZB_FAMILY_COUNT_; k++)
    CHECK_MSG(strstr(d.msg, zb_family_name((zb_family)k)) != NULL, "\"%s\" does not list %s", d.msg,
              zb_family_name((zb_family)k));
  CHECK_EQ(zb_family_parse("ZB-H1", &f, NULL), ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_family_parse("", &f, NULL), ZB_ERR_INVALID_ARG);
}

/* ---- lowering --------------------------------------------------------- */

/* Checks one lowered schedule against its compute-only source: every
 * cross-rank edge has exactly one SEND after its producer and one RECV on
 * the peer before its consumer, with the right stages, microbatch and
 * peers; local edges have none; batch marks exactly a comm action followed
 * by another; it validates; stripping gives back the source. */
static bool lowering_ok(const zb_schedule *s, const zb_schedule *low, const char *what) {
  const int S = zb_schedule_stages(s), p = s->p;
  int sends = 0, edges = 0;
  for (int r = 0; r < p; r++)
    for (int i = 0; i < low->ranks[r].n; i++) {
      const zb_action *a = &low->ranks[r].actions[i];
      bool want_batch =
          zb_op_is_comm(a->op) && i + 1 < low->ranks[r].n && zb_op_is_comm(low->ranks[r].actions[i + 1].op);
      if (a->batch != want_batch) {
        fprintf(stderr, "  %s: rank %d index %d batch %d\n", what, r, i, a->batch);
        return false;
      }
      if (a->op != ZB_OP_SEND_F && a->op != ZB_OP_SEND_B)
        continue;
      sends++;
      bool fwd = a->op == ZB_OP_SEND_F;
      int to_stage = fwd ? a->stage + 1 : a->stage - 1;
      zb_op recv = fwd ? ZB_OP_RECV_F : ZB_OP_RECV_B, prod = fwd ? ZB_OP_F : ZB_OP_B;
      int q = a->peer;
      bool ok = to_stage >= 0 && to_stage < S && q == zb_stage_rank(s, to_stage) && q != r;
      int ri = ok ? find_action(low, q, recv, to_stage, a->mb) : -1;
      ok = ri >= 0 && count_action(low, q, recv, to_stage, a->mb) == 1 && low->ranks[q].actions[ri].peer == r;
      /* the producer runs before the send (B or BW for a gradient) */
      int pi = find_action(low, r, prod, a->stage, a->mb);
      if (!fwd && pi < 0)
        pi = find_action(low, r, ZB_OP_BW, a->stage, a->mb);
      /* the consumer runs after the receive */
      int ci = find_action(low, q, fwd ? ZB_OP_F : ZB_OP_B, to_stage, a->mb);
      if (!fwd && ci < 0)
        ci = find_action(low, q, ZB_OP_BW, to_stage, a->mb);
      ok = ok && pi >= 0 && pi < i && ci > ri && count_action(low, r, a->op, a->stage, a->mb) == 1;
      if (!ok) {
        fprintf(stderr, "  %s: rank %d index %d %s stage %d mb %d peer %d unmatched\n", what, r, i,
                zb_op_name(a->op), a->stage, a->mb, a->peer);
        return false;
      }
    }
  int recvs = 0;
  for (int r = 0; r < p; r++)
    for (int i = 0; i < low->ranks[r].n; i++)
      recvs += low->ranks[r].actions[i].op == ZB_OP_RECV_F || low->ranks[r].actions[i].op == ZB_OP_RECV_B;
  for (int st = 0; st + 1 < S; st++)
    edges += zb_stage_rank(s, st) != zb_stage_rank(s, st + 1);
  edges *= 2 * s->m; /* one activation and one gradient per microbatch */
  zb_violation v;
  zb_err err = zb_validate(low, NULL, &v);
  zb_schedule *back = zb_schedule_clone(low);
  zb_schedule_strip_comm(back);
  bool same = same_lists(s, back);
  zb_schedule_free(back);
  if (sends != edges || recvs != edges || err != ZB_OK || !same) {
    char buf[256];
    zb_violation_format(&v, buf, sizeof buf);
    fprintf(stderr, "  %s: %d sends, %d recvs, %d cross-rank edges; %s; strip %s\n", what, sends, recvs,
            edges, buf, same ? "matches" : "differs");
    return false;
  }
  return true;
}

static void test_lowering_pairs_every_send(void) {
  static const struct {
    zb_family f;
    int p, v, m;
  } cases[] = {
      {ZB_FAMILY_GPIPE, 4, 1, 6},
      {ZB_FAMILY_1F1B, 4, 1, 8},
      {ZB_FAMILY_1F1B, 1, 1, 3},
      {ZB_FAMILY_INTERLEAVED_1F1B, 4, 2, 8},
      {ZB_FAMILY_INTERLEAVED_1F1B, 2, 3, 4},
      {ZB_FAMILY_ZB_H1, 4, 1, 8},
      {ZB_FAMILY_ZB_H2, 3, 1, 7},
      {ZB_FAMILY_ZB_AUTO, 4, 1, 8},
      {ZB_FAMILY_ZB_V, 4, 2, 8},
      {ZB_FAMILY_V_HALF, 4, 2, 8},
      {ZB_FAMILY_V_MIN, 3, 2, 6},
  };
  int checked = 0;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    zb_plan_request req = {.family = cases[k].f, .p = cases[k].p, .v = cases[k].v, .m = cases[k].m};
    char what[96];
    snprintf(what, sizeof what, "%s p=%d v=%d m=%d", zb_family_name(req.family), req.p, req.v, req.m);
    zb_schedule *s = NULL, *low = NULL;
    zb_diag d = {{0}};
    zb_err err = zb_plan_generate(&req, &s, &d);
    CHECK_MSG(err == ZB_OK, "%s: %s", what, d.msg);
    err = zb_lower(s, NULL, &low, &d);
    bool ok = err == ZB_OK && lowering_ok(s, low, what);
    /* lowering a lowered schedule is refused (p = 1 has nothing to lower) */
    bool has_comm = low && zb_schedule_has_comm(low);
    zb_schedule *again = NULL;
    zb_err err2 = has_comm ? zb_lower(low, NULL, &again, &d) : ZB_ERR_INVALID_ARG;
    zb_schedule_free(again);
    zb_schedule_free(low);
    zb_schedule_free(s);
    CHECK_MSG(ok, "%s: lowering (%s)", what, err ? d.msg : "see above");
    CHECK(has_comm == (req.p > 1));
    CHECK_EQ(err2, ZB_ERR_INVALID_ARG);
    CHECK(again == NULL);
    checked++;
  }
  CHECK_EQ(checked, (int)(sizeof cases / sizeof cases[0]));
}

static void test_lowering_v_keeps_the_turn_local(void) {
  /* V with p = 4: stage 3 -> 4 is on rank 3, so no comm carries it, while
   * stage 2 -> 3 does */
  zb_plan_request req = {.family = ZB_FAMILY_ZB_V, .p = 4, .v = 2, .m = 8};
  zb_schedule *s = NULL, *low = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_plan_generate(&req, &s, &d), ZB_OK);
  zb_err err = zb_lower(s, NULL, &low, &d);
  int turn = 0, hop = 0;
  for (int mb = 0; err == ZB_OK && mb < 8; mb++) {
    turn += count_action(low, 3, ZB_OP_SEND_F, 3, mb) + count_action(low, 3, ZB_OP_RECV_F, 4, mb) +
            count_action(low, 3, ZB_OP_SEND_B, 4, mb) + count_action(low, 3, ZB_OP_RECV_B, 3, mb);
    hop += count_action(low, 2, ZB_OP_SEND_F, 2, mb) + count_action(low, 3, ZB_OP_RECV_F, 3, mb);
  }
  zb_schedule_free(low);
  zb_schedule_free(s);
  CHECK_EQ(err, ZB_OK);
  CHECK_EQ(turn, 0);
  CHECK_EQ(hop, 16);
}

static void test_strip_undoes_lowering_with_costs(void) {
  /* lowering under uneven costs and a comm latency orders comm actions
   * unlike lowering under unit costs, but never moves compute actions */
  zb_rank_costs rc = {.t_f = 1, .t_b = 2.5, .t_w = 0.5, .t_comm = 0.75, .m_f = 1, .m_b = -0.25, .m_w = -0.75};
  zb_costs *c = zb_costs_from_rank_share(4, 2, &rc, 0);
  c->t_f[5] = 3; /* one slow stage */
  zb_plan_request req = {.family = ZB_FAMILY_INTERLEAVED_1F1B, .p = 4, .v = 2, .m = 8, .costs = c};
  zb_schedule *s = NULL, *low = NULL, *low_unit = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_plan_generate(&req, &s, &d);
  if (err == ZB_OK)
    err = zb_lower(s, c, &low, &d);
  if (err == ZB_OK)
    err = zb_lower(s, NULL, &low_unit, &d);
  bool ok = err == ZB_OK && lowering_ok(s, low, "interleaved-1f1b with costs") &&
            lowering_ok(s, low_unit, "interleaved-1f1b with unit costs");
  bool differ = err == ZB_OK && !same_lists(low, low_unit);
  zb_schedule_free(low_unit);
  zb_schedule_free(low);
  zb_schedule_free(s);
  zb_costs_free(c);
  CHECK_MSG(ok, "%s", d.msg);
  CHECK(differ);
}

ZBT_MAIN(ZBT(test_new_clone_free), ZBT(test_reserve_all_block), ZBT(test_push_grows_in_order),
         ZBT(test_loop_placement), ZBT(test_v_placement), ZBT(test_op_kinds), ZBT(test_has_comm_and_splits_w),
         ZBT(test_strip_comm_keeps_fsdp_in_order), ZBT(test_costs_from_rank_share),
         ZBT(test_costs_check_refusals), ZBT(test_check_shape_says_what_is_needed), ZBT(test_family_names),
         ZBT(test_lowering_pairs_every_send), ZBT(test_lowering_v_keeps_the_turn_local),
         ZBT(test_strip_undoes_lowering_with_costs))
