/* test_validate.c — the validator, by mutation: a valid generated schedule
 * (compute-only, or lowered with SEND/RECV for the comm and blocking
 * checks) is broken in exactly one known place, and the first violation
 * must name that kind, rank, index and action. Every violation kind is
 * covered; zb_violation_format is checked on real violations. Every
 * verdict is also asked of zb_validate_par on two threads, whose deadlock
 * run starts before the scan has vouched for the lists: it must give the
 * same violation, and (under the sanitizers) read nothing out of range.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "zb_lower.h"
#include "zb_par_threads.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

/* ---- helpers ---------------------------------------------------------- */

/* zb_validate's verdict, checked to be zb_validate_par's on two threads
 * (a difference fails the test that asked, as a CHECK would). */
static zb_err validate_both(const zb_schedule *s, const zb_costs *c, zb_violation *out) {
  zb_err err = zb_validate(s, c, out);
  zb_par par = zb_par_threads(2);
  zb_violation w;
  zb_err werr = zb_validate_par(s, c, &par, &w);
  if (werr != err || w.kind != out->kind || w.rank != out->rank || w.index != out->index ||
      strcmp(w.detail, out->detail) != 0) {
    fprintf(stderr,
            "  with threads: %d, %s at rank %d index %d (%s); alone: %d, %s at rank %d index %d (%s)\n", werr,
            zb_violation_kind_name(w.kind), w.rank, w.index, w.detail, err, zb_violation_kind_name(out->kind),
            out->rank, out->index, out->detail);
    zbt_failed_checks++;
  }
  return err;
}

/* Generates family f for (p, v, m) under unit costs, lowered when asked,
 * and returns it only if it validates (NULL, reported, otherwise). */
static zb_schedule *valid_schedule(zb_family f, int p, int v, int m, bool lowered) {
  zb_plan_request req = {.family = f, .p = p, .v = v, .m = m};
  zb_schedule *s = NULL, *low = NULL;
  zb_diag d = {{0}};
  if (zb_plan_generate(&req, &s, &d) != ZB_OK) {
    fprintf(stderr, "  %s p=%d v=%d m=%d: %s\n", zb_family_name(f), p, v, m, d.msg);
    return NULL;
  }
  if (lowered) {
    zb_err err = zb_lower(s, NULL, &low, &d);
    zb_schedule_free(s);
    if (err != ZB_OK) {
      fprintf(stderr, "  %s p=%d v=%d m=%d: lowering: %s\n", zb_family_name(f), p, v, m, d.msg);
      return NULL;
    }
    s = low;
  }
  zb_violation viol;
  if (validate_both(s, NULL, &viol) != ZB_OK || viol.kind != ZB_VIOL_NONE) {
    char buf[256];
    zb_violation_format(&viol, buf, sizeof buf);
    fprintf(stderr, "  %s p=%d v=%d m=%d%s is not valid to start with: %s\n", zb_family_name(f), p, v, m,
            lowered ? " lowered" : "", buf);
    zb_schedule_free(s);
    return NULL;
  }
  return s;
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

static void remove_action(zb_schedule *s, int r, int i) {
  zb_rank_list *l = &s->ranks[r];
  memmove(&l->actions[i], &l->actions[i + 1], sizeof *l->actions * (size_t)(l->n - i - 1));
  l->n--;
}

/* Inserts a so that it ends up at index i of rank r. */
static void insert_action(zb_schedule *s, int r, int i, zb_action a) {
  zb_schedule_push(s, r, a); /* grows the list */
  zb_rank_list *l = &s->ranks[r];
  memmove(&l->actions[i + 1], &l->actions[i], sizeof *l->actions * (size_t)(l->n - 1 - i));
  l->actions[i] = a;
}

/* Moves the action at index from so that it ends up at index to. */
static void move_action(zb_schedule *s, int r, int from, int to) {
  zb_action a = s->ranks[r].actions[from];
  remove_action(s, r, from);
  insert_action(s, r, to, a);
}

static void swap_actions(zb_schedule *s, int r, int i, int j) {
  zb_action t = s->ranks[r].actions[i];
  s->ranks[r].actions[i] = s->ranks[r].actions[j];
  s->ranks[r].actions[j] = t;
}

static zb_action act(zb_op op, int stage, int mb, int peer, bool batch) {
  return (zb_action){.op = op, .stage = stage, .mb = mb, .peer = peer, .batch = batch};
}

/* Validates s and compares the first violation with the expected one;
 * reports every difference. */
static bool expect_violation(const zb_schedule *s, const zb_costs *c, zb_violation_kind kind, int rank,
                             int index, zb_action want) {
  zb_violation v;
  zb_err err = validate_both(s, c, &v);
  char buf[256];
  zb_violation_format(&v, buf, sizeof buf);
  const zb_action *a = &v.action;
  bool ok = err == ZB_ERR_INVALID_SCHEDULE && v.kind == kind && v.rank == rank && v.index == index &&
            a->op == want.op && a->stage == want.stage && a->mb == want.mb && a->peer == want.peer &&
            a->batch == want.batch && v.detail[0] != '\0';
  if (!ok)
    fprintf(stderr,
            "  want %s at rank %d index %d (%s stage %d mb %d peer %d batch %d)\n"
            "  got  err %d: %s (peer %d batch %d)\n",
            zb_violation_kind_name(kind), rank, index, zb_op_name(want.op), want.stage, want.mb, want.peer,
            want.batch, err, buf, a->peer, a->batch);
  return ok;
}

/* ---- baseline --------------------------------------------------------- */

static void test_generated_schedules_are_valid(void) {
  static const struct {
    zb_family f;
    int v;
  } fams[] = {{ZB_FAMILY_1F1B, 1},  {ZB_FAMILY_ZB_H1, 1},
              {ZB_FAMILY_ZB_H2, 1}, {ZB_FAMILY_INTERLEAVED_1F1B, 2},
              {ZB_FAMILY_ZB_V, 2},  {ZB_FAMILY_GPIPE, 1}};
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++)
    for (int lowered = 0; lowered < 2; lowered++) {
      zb_schedule *s = valid_schedule(fams[k].f, 4, fams[k].v, 8, lowered);
      CHECK_MSG(s != NULL, "%s lowered=%d", zb_family_name(fams[k].f), lowered);
      zb_violation v;
      memset(&v, 0x5a, sizeof v);
      zb_err err = validate_both(s, NULL, &v);
      bool has_comm = zb_schedule_has_comm(s);
      zb_schedule_free(s);
      CHECK_EQ(err, ZB_OK);
      CHECK_EQ(v.kind, ZB_VIOL_NONE);
      CHECK_EQ(v.rank, -1);
      CHECK_EQ(v.index, -1);
      CHECK(has_comm == (lowered != 0));
    }
}

/* ---- BAD_ACTION ------------------------------------------------------- */

static void test_bad_action_stage_out_of_range(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 2, ZB_OP_B, 2, 3);
  if (i >= 0)
    s->ranks[2].actions[i].stage = 4; /* S = 4 */
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 2, i, act(ZB_OP_B, 4, 3, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_bad_action_microbatch_out_of_range(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 3, ZB_OP_F, 3, 5);
  if (i >= 0)
    s->ranks[3].actions[i].mb = 8; /* m = 8 */
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 3, i, act(ZB_OP_F, 3, 8, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
  /* a compute op without a microbatch is out of range too */
  s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, false);
  CHECK(s != NULL);
  i = find_action(s, 1, ZB_OP_BW, 1, 2);
  if (i >= 0)
    s->ranks[1].actions[i].mb = -1;
  ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 1, i, act(ZB_OP_BW, 1, -1, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_bad_action_peer_out_of_range(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, true);
  CHECK(s != NULL);
  int i = find_action(s, 2, ZB_OP_SEND_B, 2, 1);
  zb_action want = {0};
  if (i >= 0) {
    s->ranks[2].actions[i].peer = 4; /* p = 4 */
    want = act(ZB_OP_SEND_B, 2, 1, 4, s->ranks[2].actions[i].batch);
  }
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 2, i, want);
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_bad_action_kind_and_missing_neighbour(void) {
  /* an unknown action kind */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 1, ZB_OP_W, 1, 0);
  if (i >= 0)
    s->ranks[1].actions[i].op = ZB_OP_COUNT_;
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 1, i, act(ZB_OP_COUNT_, 1, 0, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
  /* stage 0 has no previous stage to send a gradient to */
  s = valid_schedule(ZB_FAMILY_1F1B, 2, 1, 4, true);
  CHECK(s != NULL);
  i = find_action(s, 0, ZB_OP_SEND_F, 0, 0);
  zb_action want = {0};
  if (i >= 0) {
    s->ranks[0].actions[i].op = ZB_OP_SEND_B;
    want = act(ZB_OP_SEND_B, 0, 0, 1, s->ranks[0].actions[i].batch);
  }
  ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_BAD_ACTION, 0, i, want);
  zb_schedule_free(s);
  CHECK(ok);
}

/* ---- PLACEMENT -------------------------------------------------------- */

static void test_placement_loop(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 0, ZB_OP_F, 0, 2);
  if (i >= 0)
    s->ranks[0].actions[i].stage = 1; /* stage 1 lives on rank 1 */
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_PLACEMENT, 0, i, act(ZB_OP_F, 1, 2, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_placement_v(void) {
  /* V with p = 4: rank 1 hosts stages 1 and 6. Stage 5 would be on rank 1
   * under loop placement, but lives on rank 2 in a V. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_V, 4, 2, 8, false);
  CHECK(s != NULL);
  CHECK_EQ(zb_placement_rank(ZB_PLACE_LOOP, 4, 2, 5), 1);
  int i = find_action(s, 1, ZB_OP_F, 6, 0);
  if (i >= 0)
    s->ranks[1].actions[i].stage = 5;
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_PLACEMENT, 1, i, act(ZB_OP_F, 5, 0, -1, false));
  zb_violation v;
  validate_both(s, NULL, &v);
  zb_schedule_free(s);
  CHECK(ok);
  CHECK(strstr(v.detail, "rank 2") != NULL);
}

/* ---- DUPLICATE -------------------------------------------------------- */

static void test_duplicate_split(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 2, ZB_OP_B, 2, 3);
  if (i >= 0)
    insert_action(s, 2, i + 1, s->ranks[2].actions[i]);
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_DUPLICATE, 2, i + 1, act(ZB_OP_B, 2, 3, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_duplicate_b_next_to_bw(void) {
  /* B of a (stage, mb) that already runs BW repeats its input gradient */
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, false);
  CHECK(s != NULL);
  int n = s->ranks[1].n;
  zb_schedule_push_op(s, 1, ZB_OP_B, 1, 5);
  bool ok = find_action(s, 1, ZB_OP_BW, 1, 5) >= 0 &&
            expect_violation(s, NULL, ZB_VIOL_DUPLICATE, 1, n, act(ZB_OP_B, 1, 5, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

/* ---- MISSING ---------------------------------------------------------- */

/* Deletes (op, stage, mb) from rank r and expects MISSING of it on rank r. */
static bool missing_case(zb_family f, int v, int r, zb_op op, int stage, int mb) {
  zb_schedule *s = valid_schedule(f, 4, v, 8, false);
  if (!s)
    return false;
  int i = find_action(s, r, op, stage, mb);
  if (i >= 0)
    remove_action(s, r, i);
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_MISSING, r, -1, act(op, stage, mb, -1, false));
  zb_schedule_free(s);
  return ok;
}

static void test_missing(void) {
  CHECK(missing_case(ZB_FAMILY_ZB_H1, 1, 1, ZB_OP_W, 1, 4));
  CHECK(missing_case(ZB_FAMILY_ZB_H1, 1, 3, ZB_OP_F, 3, 0));
  CHECK(missing_case(ZB_FAMILY_ZB_H1, 1, 2, ZB_OP_B, 2, 5));
  CHECK(missing_case(ZB_FAMILY_1F1B, 1, 0, ZB_OP_BW, 0, 7));
  /* V: stage 5 lives on rank 2 = 2p-1-5 */
  CHECK(missing_case(ZB_FAMILY_ZB_V, 2, 2, ZB_OP_W, 5, 3));
}

/* ---- DEPENDENCY ------------------------------------------------------- */

static void test_dependency_b_before_f(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 3, ZB_OP_F, 3, 0), j = find_action(s, 3, ZB_OP_B, 3, 0);
  if (i >= 0 && j > i)
    swap_actions(s, 3, i, j);
  bool ok =
      i >= 0 && j > i && expect_violation(s, NULL, ZB_VIOL_DEPENDENCY, 3, i, act(ZB_OP_B, 3, 0, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_dependency_w_before_b(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 2, ZB_OP_B, 2, 0), j = find_action(s, 2, ZB_OP_W, 2, 0);
  if (i >= 0 && j > i)
    swap_actions(s, 2, i, j);
  bool ok =
      i >= 0 && j > i && expect_violation(s, NULL, ZB_VIOL_DEPENDENCY, 2, i, act(ZB_OP_W, 2, 0, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_dependency_local_stage_in_v(void) {
  /* V with p = 4: stages 3 and 4 both live on rank 3, so F(4) must follow
   * F(3) in that rank's list. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_V, 4, 2, 8, false);
  CHECK(s != NULL);
  int i = find_action(s, 3, ZB_OP_F, 3, 0), j = find_action(s, 3, ZB_OP_F, 4, 0);
  if (i >= 0 && j > i)
    swap_actions(s, 3, i, j);
  bool ok =
      i >= 0 && j > i && expect_violation(s, NULL, ZB_VIOL_DEPENDENCY, 3, i, act(ZB_OP_F, 4, 0, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_dependency_lowered_recv_after_use(void) {
  /* the RECV_F of F(1,1)'s input moves to just after F(1,1) */
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 2, 1, 4, true);
  CHECK(s != NULL);
  int j = find_action(s, 1, ZB_OP_RECV_F, 1, 1), k = find_action(s, 1, ZB_OP_F, 1, 1);
  if (j >= 0 && k > j)
    move_action(s, 1, j, k);
  /* F(1,1) is now at k - 1 */
  bool ok = j >= 0 && k > j &&
            expect_violation(s, NULL, ZB_VIOL_DEPENDENCY, 1, k - 1, act(ZB_OP_F, 1, 1, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_dependency_lowered_send_before_produce(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 2, 1, 4, true);
  CHECK(s != NULL);
  int i = find_action(s, 0, ZB_OP_F, 0, 1), j = find_action(s, 0, ZB_OP_SEND_F, 0, 1);
  zb_action want = {0};
  if (i >= 0 && j > i) {
    want = act(ZB_OP_SEND_F, 0, 1, 1, s->ranks[0].actions[j].batch);
    move_action(s, 0, j, i); /* the SEND now precedes F(0,1) */
  }
  bool ok = i >= 0 && j > i && expect_violation(s, NULL, ZB_VIOL_DEPENDENCY, 0, i, want);
  zb_schedule_free(s);
  CHECK(ok);
}

/* ---- COMM_MISMATCH ---------------------------------------------------- */

static void test_comm_mismatch_wrong_peer(void) {
  /* rank 1's SEND_F(1,0) goes to rank 3 instead of stage 2's rank 2 */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, true);
  CHECK(s != NULL);
  int i = find_action(s, 1, ZB_OP_SEND_F, 1, 0);
  zb_action want = {0};
  if (i >= 0) {
    CHECK_EQ(s->ranks[1].actions[i].peer, 2);
    s->ranks[1].actions[i].peer = 3;
    want = act(ZB_OP_SEND_F, 1, 0, 3, s->ranks[1].actions[i].batch);
  }
  bool ok = i >= 0 && expect_violation(s, NULL, ZB_VIOL_COMM_MISMATCH, 1, i, want);
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_comm_mismatch_sent_twice(void) {
  /* rank 1's SEND_F(1,3) is retargeted to microbatch 2, already sent */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, true);
  CHECK(s != NULL);
  int first = find_action(s, 1, ZB_OP_SEND_F, 1, 2), i = find_action(s, 1, ZB_OP_SEND_F, 1, 3);
  zb_action want = {0};
  if (first >= 0 && i > first) {
    s->ranks[1].actions[i].mb = 2;
    want = act(ZB_OP_SEND_F, 1, 2, 2, s->ranks[1].actions[i].batch);
  }
  bool ok = first >= 0 && i > first && expect_violation(s, NULL, ZB_VIOL_COMM_MISMATCH, 1, i, want);
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_comm_mismatch_never_sent(void) {
  /* deleting SEND_F(1,3) leaves RECV_F(2,3) on rank 2 without a partner:
   * reported on the sender's rank with no index */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, true);
  CHECK(s != NULL);
  int i = find_action(s, 1, ZB_OP_SEND_F, 1, 3);
  if (i >= 0)
    remove_action(s, 1, i);
  bool ok = i >= 0 && find_action(s, 2, ZB_OP_RECV_F, 2, 3) >= 0 &&
            expect_violation(s, NULL, ZB_VIOL_COMM_MISMATCH, 1, -1, act(ZB_OP_SEND_F, 1, 3, 2, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_comm_mismatch_local_transfer_in_v(void) {
  /* V with p = 4: stage 3 -> 4 stays on rank 3, so a SEND_F of stage 3 has
   * no partner rank */
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_V, 4, 2, 8, true);
  CHECK(s != NULL);
  CHECK(find_action(s, 3, ZB_OP_SEND_F, 3, 0) < 0);
  int i = find_action(s, 3, ZB_OP_F, 3, 0);
  if (i >= 0)
    insert_action(s, 3, i + 1, act(ZB_OP_SEND_F, 3, 0, 3, false));
  bool ok =
      i >= 0 && expect_violation(s, NULL, ZB_VIOL_COMM_MISMATCH, 3, i + 1, act(ZB_OP_SEND_F, 3, 0, 3, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_comm_mismatch_out_of_posting_order(void) {
  /* Lowered GPipe p=2: rank 1 receives mb 1's activation before mb 0's.
   * The transports pair the messages between two ranks in posting order,
   * so its first receive would take mb 0's activation. Within one group
   * (mb 1's RECV_F batched with mb 0's) every transfer still has both
   * sides, which once passed; apart, it once read as a deadlock. Rank 0
   * posts first (the run starts at rank 0), so rank 1's receive meets it. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_GPIPE, 2, 1, 4, true);
  CHECK(s != NULL);
  int i = find_action(s, 1, ZB_OP_RECV_F, 1, 0), j = find_action(s, 1, ZB_OP_RECV_F, 1, 1);
  bool pre = i >= 0 && j > i && !s->ranks[1].actions[i].batch;
  bool ok = false;
  for (int grouped = 0; pre && grouped <= 1; grouped++) {
    zb_schedule *t = zb_schedule_clone(s);
    move_action(t, 1, j, i); /* rank 1: ..., RECV_F(1,1), RECV_F(1,0), ... */
    t->ranks[1].actions[i].batch = grouped;
    ok = expect_violation(t, NULL, ZB_VIOL_COMM_MISMATCH, 1, i, act(ZB_OP_RECV_F, 1, 1, 0, grouped));
    zb_schedule_free(t);
    if (!ok)
      break;
  }
  zb_schedule_free(s);
  CHECK(pre);
  CHECK(ok);
}

/* ---- DEADLOCK --------------------------------------------------------- */

static void test_deadlock_compute_cycle_generated(void) {
  /* 1F1B p=4: rank 0 moves BW(0,0) right after F(0,0). BW(0,0) waits for
   * B(1,0), which rank 1 runs after F(1,1), which waits for F(0,1), which
   * rank 0 now runs after BW(0,0). Rank 0 is stuck at index 1. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, false);
  CHECK(s != NULL);
  int j = find_action(s, 0, ZB_OP_BW, 0, 0);
  bool pre = find_action(s, 0, ZB_OP_F, 0, 0) == 0 && j > 1;
  if (pre)
    move_action(s, 0, j, 1);
  bool ok = pre && expect_violation(s, NULL, ZB_VIOL_DEADLOCK, 0, 1, act(ZB_OP_BW, 0, 0, -1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_deadlock_compute_cycle_by_hand(void) {
  /* two ranks, two microbatches, each rank waiting on the other's later
   * work: rank 0 runs mb 0 first, rank 1 mb 1 first */
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 0);
  zb_schedule_push_op(s, 0, ZB_OP_F, 0, 1);
  zb_schedule_push_op(s, 0, ZB_OP_BW, 0, 1);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_BW, 1, 1);
  zb_schedule_push_op(s, 1, ZB_OP_F, 1, 0);
  zb_schedule_push_op(s, 1, ZB_OP_BW, 1, 0);
  bool ok = expect_violation(s, NULL, ZB_VIOL_DEADLOCK, 0, 1, act(ZB_OP_BW, 0, 0, -1, false));
  /* the same lists with rank 1 in mb order are fine */
  swap_actions(s, 1, 0, 2);
  swap_actions(s, 1, 1, 3);
  zb_violation v;
  zb_err err = validate_both(s, NULL, &v);
  zb_schedule_free(s);
  CHECK(ok);
  CHECK_EQ(err, ZB_OK);
}

static void test_deadlock_blocking_sends_head_to_head(void) {
  /* Lowered 1F1B p=2. Rank 0 posts SEND_F(0,1) with RECV_B(0,0) in one
   * group. Rank 1 is reordered to SEND_B(1,0) before RECV_F(1,1): still
   * valid, because rank 0's group posts its receive together with its
   * send. Splitting rank 0's group makes both ranks block in a send whose
   * receive the peer has not posted. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 2, 1, 4, true);
  CHECK(s != NULL);
  int g = find_action(s, 0, ZB_OP_SEND_F, 0, 1);
  int j = find_action(s, 1, ZB_OP_RECV_F, 1, 1), k = find_action(s, 1, ZB_OP_SEND_B, 1, 0);
  bool pre = g >= 0 && g + 1 < s->ranks[0].n && s->ranks[0].actions[g].batch &&
             s->ranks[0].actions[g + 1].op == ZB_OP_RECV_B && s->ranks[0].actions[g + 1].mb == 0 && j >= 0 &&
             k > j && !s->ranks[1].actions[k].batch;
  zb_err err_reordered = ZB_ERR_INVALID_ARG;
  bool ok = false;
  if (pre) {
    move_action(s, 1, j, k); /* rank 1: ..., SEND_B(1,0), RECV_F(1,1), ... */
    zb_violation v;
    err_reordered = validate_both(s, NULL, &v);
    s->ranks[0].actions[g].batch = false;
    ok = expect_violation(s, NULL, ZB_VIOL_DEADLOCK, 0, g, act(ZB_OP_SEND_F, 0, 1, 1, false));
  }
  zb_schedule_free(s);
  CHECK(pre);
  CHECK_EQ(err_reordered, ZB_OK);
  CHECK(ok);
}

static void test_deadlock_blocking_recv_first(void) {
  /* Lowered 1F1B p=2: rank 0 waits for the gradient of mb 0 before it
   * sends mb 0's activation, which rank 1 needs to produce that gradient. */
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 2, 1, 4, true);
  CHECK(s != NULL);
  int i = find_action(s, 0, ZB_OP_SEND_F, 0, 0), j = find_action(s, 0, ZB_OP_RECV_B, 0, 0);
  bool pre = i > 0 && j > i && !s->ranks[0].actions[j].batch;
  if (pre) {
    move_action(s, 0, j, i); /* RECV_B(0,0) takes SEND_F(0,0)'s place */
    /* the action that grouped with RECV_B(0,0) before the move no longer
     * precedes a comm action */
    if (s->ranks[0].actions[j].batch && !zb_op_is_comm(s->ranks[0].actions[j + 1].op))
      s->ranks[0].actions[j].batch = false;
  }
  bool ok = pre && expect_violation(s, NULL, ZB_VIOL_DEADLOCK, 0, i, act(ZB_OP_RECV_B, 0, 0, 1, false));
  zb_schedule_free(s);
  CHECK(ok);
}

static void test_deadlock_send_before_arrival_by_hand(void) {
  /* Two ranks, two microbatches, written out by hand. Each rank sends in
   * the window of a transfer coming its way and receives that transfer
   * only after its own send back, as placing every receive at arrival
   * would: rank 0 blocks in SEND_F(0,1) until rank 1 posts RECV_F(1,1),
   * which comes after rank 1's SEND_B(1,0), blocked until rank 0 posts
   * RECV_B(0,0), which comes after SEND_F(0,1). Moving RECV_F(1,1) ahead
   * of SEND_B(1,0), in one group with it (what lowering does when a
   * receive's arrival falls after a send that comes later in transfer
   * order, docs/schedules.md, Lowering), breaks the cycle. */
  zb_schedule *s = zb_schedule_new(2, 1, 2, ZB_PLACE_LOOP);
  const zb_action r0[] = {act(ZB_OP_F, 0, 0, -1, false),     act(ZB_OP_SEND_F, 0, 0, 1, false),
                          act(ZB_OP_F, 0, 1, -1, false),     act(ZB_OP_SEND_F, 0, 1, 1, false),
                          act(ZB_OP_RECV_B, 0, 0, 1, false), act(ZB_OP_BW, 0, 0, -1, false),
                          act(ZB_OP_RECV_B, 0, 1, 1, false), act(ZB_OP_BW, 0, 1, -1, false)};
  const zb_action r1[] = {act(ZB_OP_RECV_F, 1, 0, 0, false), act(ZB_OP_F, 1, 0, -1, false),
                          act(ZB_OP_BW, 1, 0, -1, false),    act(ZB_OP_SEND_B, 1, 0, 0, false),
                          act(ZB_OP_RECV_F, 1, 1, 0, false), act(ZB_OP_F, 1, 1, -1, false),
                          act(ZB_OP_BW, 1, 1, -1, false),    act(ZB_OP_SEND_B, 1, 1, 0, false)};
  for (size_t i = 0; i < sizeof r0 / sizeof r0[0]; i++) {
    zb_schedule_push(s, 0, r0[i]);
    zb_schedule_push(s, 1, r1[i]);
  }
  bool ok = expect_violation(s, NULL, ZB_VIOL_DEADLOCK, 0, 3, act(ZB_OP_SEND_F, 0, 1, 1, false));
  move_action(s, 1, 4, 3); /* rank 1: ..., BW(1,0), RECV_F(1,1), SEND_B(1,0), F(1,1), ... */
  s->ranks[1].actions[3].batch = true;
  zb_violation v;
  zb_err err = validate_both(s, NULL, &v);
  zb_schedule_free(s);
  CHECK(ok);
  CHECK_EQ(err, ZB_OK);
}

/* ---- MEMORY ----------------------------------------------------------- */

static void test_memory_limit(void) {
  /* ZB-H1 p=4 with stage 2 twice as heavy in activations. Rank 2 opens
   * F(2,0) F(2,1) B(2,0) F(2,2): memory 2, 4, 3, 5, so a limit of 4.5 is
   * first exceeded at its index 3; ranks 0 and 1 stay within it. */
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(4, 1, &rc, 0);
  c->m_f[2] = 2;
  c->m_b[2] = -1;
  c->m_w[2] = -1;
  zb_schedule *s = valid_schedule(ZB_FAMILY_ZB_H1, 4, 1, 8, false);
  zb_sim_result *sim = NULL;
  zb_diag d = {{0}};
  bool pre = s && zb_costs_check(c, &d) == ZB_OK && zb_simulate(s, c, &sim, &d) == ZB_OK &&
             find_action(s, 2, ZB_OP_F, 2, 0) == 0 && find_action(s, 2, ZB_OP_F, 2, 1) == 1 &&
             find_action(s, 2, ZB_OP_B, 2, 0) == 2 && find_action(s, 2, ZB_OP_F, 2, 2) == 3 &&
             sim->peak_memory[0] <= 4.5 && sim->peak_memory[1] <= 4.5 && sim->peak_memory[2] > 4.5;
  zb_violation v;
  zb_err err_none = pre ? validate_both(s, c, &v) : ZB_ERR_INVALID_ARG; /* mem_limit 0: no limit */
  c->mem_limit = pre ? sim->peak_memory[2] : 0;                         /* exactly the peak is allowed */
  zb_err err_at_peak = pre ? validate_both(s, c, &v) : ZB_ERR_INVALID_ARG;
  c->mem_limit = 4.5;
  bool ok = pre && expect_violation(s, c, ZB_VIOL_MEMORY, 2, 3, act(ZB_OP_F, 2, 2, -1, false));
  /* the same schedule under unit costs exceeds 3.5 first on rank 0, at
   * its fourth F */
  zb_costs *u = zb_costs_from_rank_share(4, 1, &rc, 3.5);
  bool ok_unit = pre && find_action(s, 0, ZB_OP_F, 0, 3) == 3 &&
                 expect_violation(s, u, ZB_VIOL_MEMORY, 0, 3, act(ZB_OP_F, 0, 3, -1, false));
  zb_costs_free(u);
  zb_sim_result_free(sim);
  zb_schedule_free(s);
  zb_costs_free(c);
  CHECK(pre);
  CHECK_EQ(err_none, ZB_OK);
  CHECK_EQ(err_at_peak, ZB_OK);
  CHECK(ok);
  CHECK(ok_unit);
}

static void test_memory_limit_lowered(void) {
  /* comm actions carry no memory: the lowered list fails at the same
   * compute action, shifted by the comm actions before it */
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(4, 1, &rc, 3.5);
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, true);
  int i = s ? find_action(s, 0, ZB_OP_F, 0, 3) : -1;
  bool ok = i >= 3 && expect_violation(s, c, ZB_VIOL_MEMORY, 0, i, act(ZB_OP_F, 0, 3, -1, false));
  zb_schedule_free(s);
  zb_costs_free(c);
  CHECK(ok);
}

/* ---- formatting ------------------------------------------------------- */

/* Costs for another shape are refused, not silently half-checked. */
static void test_costs_for_other_shape_refused(void) {
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c3 = zb_costs_from_rank_share(3, 1, &rc, 2); /* 3 stages, tight limit */
  zb_costs *c4 = zb_costs_from_rank_share(4, 1, &rc, 0);
  zb_plan_request req = {.family = ZB_FAMILY_1F1B, .p = 4, .v = 1, .m = 8, .costs = c4};
  zb_schedule *s = NULL;
  CHECK_EQ(zb_plan_generate(&req, &s, NULL), ZB_OK);
  zb_violation viol;
  zb_err err = validate_both(s, c3, &viol);
  char line[256];
  zb_violation_format(&viol, line, sizeof line);
  zb_schedule_free(s);
  zb_costs_free(c3);
  zb_costs_free(c4);
  CHECK_EQ(err, ZB_ERR_INVALID_ARG);
  CHECK_EQ(viol.kind, ZB_VIOL_NONE);
  CHECK_MSG(strstr(line, "3 stages") && strstr(line, "has 4"), "line: %s", line);
}

static void test_violation_format(void) {
  zb_schedule *s = valid_schedule(ZB_FAMILY_1F1B, 4, 1, 8, false);
  CHECK(s != NULL);
  zb_violation v;
  char buf[256];
  validate_both(s, NULL, &v);
  zb_violation_format(&v, buf, sizeof buf);
  CHECK_STREQ(buf, "valid");
  int j = find_action(s, 0, ZB_OP_BW, 0, 0);
  if (j > 1)
    move_action(s, 0, j, 1);
  zb_err err = validate_both(s, NULL, &v);
  zb_violation_format(&v, buf, sizeof buf);
  /* a MISSING violation has no index */
  int k = find_action(s, 3, ZB_OP_F, 3, 6);
  if (k >= 0)
    remove_action(s, 3, k);
  zb_violation vm;
  validate_both(s, NULL, &vm);
  char bufm[256];
  zb_violation_format(&vm, bufm, sizeof bufm);
  zb_schedule_free(s);
  CHECK(j > 1 && k >= 0);
  CHECK_EQ(err, ZB_ERR_INVALID_SCHEDULE);
  CHECK_MSG(strncmp(buf, "deadlock at rank 0 index 1 (BW stage 0 mb 0)", 44) == 0, "got \"%s\"", buf);
  CHECK(strstr(buf, v.detail) != NULL);
  CHECK_MSG(strncmp(bufm, "missing at rank 3 index -1 (F stage 3 mb 6)", 43) == 0, "got \"%s\"", bufm);
  /* a short buffer is truncated, not overrun */
  char small[12];
  memset(small, 'x', sizeof small);
  zb_violation_format(&v, small, 8);
  CHECK_EQ(strlen(small), 7);
  CHECK_EQ(small[8], 'x');
}

static void test_violation_kind_names(void) {
  const char *names[ZB_VIOL_MEMORY + 1];
  for (int k = 0; k <= ZB_VIOL_MEMORY; k++) {
    names[k] = zb_violation_kind_name((zb_violation_kind)k);
    CHECK(names[k] != NULL && strcmp(names[k], "?") != 0);
    for (int j = 0; j < k; j++)
      CHECK_MSG(strcmp(names[j], names[k]) != 0, "kinds %d and %d share the name %s", j, k, names[k]);
  }
  CHECK_STREQ(zb_violation_kind_name(ZB_VIOL_DEADLOCK), "deadlock");
  CHECK_STREQ(zb_violation_kind_name(ZB_VIOL_COMM_MISMATCH), "comm-mismatch");
}

ZBT_MAIN(ZBT(test_generated_schedules_are_valid), ZBT(test_costs_for_other_shape_refused),
         ZBT(test_bad_action_stage_out_of_range), ZBT(test_bad_action_microbatch_out_of_range),
         ZBT(test_bad_action_peer_out_of_range), ZBT(test_bad_action_kind_and_missing_neighbour),
         ZBT(test_placement_loop), ZBT(test_placement_v), ZBT(test_duplicate_split),
         ZBT(test_duplicate_b_next_to_bw), ZBT(test_missing), ZBT(test_dependency_b_before_f),
         ZBT(test_dependency_w_before_b), ZBT(test_dependency_local_stage_in_v),
         ZBT(test_dependency_lowered_recv_after_use), ZBT(test_dependency_lowered_send_before_produce),
         ZBT(test_comm_mismatch_wrong_peer), ZBT(test_comm_mismatch_sent_twice),
         ZBT(test_comm_mismatch_never_sent), ZBT(test_comm_mismatch_local_transfer_in_v),
         ZBT(test_comm_mismatch_out_of_posting_order), ZBT(test_deadlock_compute_cycle_generated),
         ZBT(test_deadlock_compute_cycle_by_hand), ZBT(test_deadlock_blocking_sends_head_to_head),
         ZBT(test_deadlock_blocking_recv_first), ZBT(test_deadlock_send_before_arrival_by_hand),
         ZBT(test_memory_limit), ZBT(test_memory_limit_lowered), ZBT(test_violation_format),
         ZBT(test_violation_kind_names))
