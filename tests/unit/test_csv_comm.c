/* csv-comm (zb_csv_write_comms) against what PyTorch's
 * _PipelineScheduleRuntime needs to run it with its default arguments
 * (docs/formats.md, csv-comm; tests/torch runs it in PyTorch itself):
 *   - every family at p = 2, 3, 4 reads back, holds the lowered lists'
 *     own actions in their order, and follows the rules below;
 *   - each send has one wait, right after the first later action of its
 *     rank that proves the peer received it (so it never stalls), or in
 *     the list's tail when there is none;
 *   - each stage has one REDUCE_GRAD, after its last W or BW, directly
 *     followed by its WAIT_REDUCE_GRAD (one reduction pending at most);
 *   - the checker refuses hand-made rows that break each rule;
 *   - lists that carry their own reductions keep them where they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_format.h"
#include "zb_planner.h"
#include "zb_reduce.h"
#include "zbtest.h"

static bool is_wait(zb_op op) {
  return op == ZB_OP_WAIT_SEND_F || op == ZB_OP_WAIT_SEND_B;
}

/* The peer cannot have missed send when a runs later on its rank: the
 * rule of the writer's comment, stated again from the dependencies. */
static bool proves(const zb_action *send, const zb_action *a) {
  bool bwd = a->op == ZB_OP_B || a->op == ZB_OP_BW || a->op == ZB_OP_W;
  if (a->mb != send->mb)
    return false;
  if (send->op == ZB_OP_SEND_F)
    return bwd || (a->op == ZB_OP_F && a->stage > send->stage);
  return bwd && a->stage < send->stage;
}

/* Why the wait of l's send at i is misplaced, or NULL. */
static const char *wait_fault(const zb_rank_list *l, int i) {
  const zb_action *s = &l->actions[i];
  zb_op want = s->op == ZB_OP_SEND_F ? ZB_OP_WAIT_SEND_F : ZB_OP_WAIT_SEND_B;
  int w = -1, proof = -1, waits = 0;
  for (int j = i + 1; j < l->n; j++) {
    const zb_action *a = &l->actions[j];
    if (a->op == want && a->stage == s->stage && a->mb == s->mb)
      w = w < 0 ? j : w, waits++;
    if (proof < 0 && zb_op_is_compute(a->op) && proves(s, a))
      proof = a->overlap ? j + 1 : j;
  }
  if (waits != 1)
    return waits ? "a send waited on twice" : "a send without its wait";
  if (proof >= 0 && w < proof)
    return "a wait before the action that proves its send received (it may stall)";
  for (int j = proof + 1; proof >= 0 && j < w; j++)
    if (!is_wait(l->actions[j].op))
      return "a wait later than the action that proves its send received";
  for (int j = w + 1; proof < 0 && j < l->n; j++) /* in the tail: no compute or comm after it */
    if (zb_op_is_compute(l->actions[j].op) || zb_op_is_comm(l->actions[j].op))
      return "an unproven send waited on before the list's tail";
  return NULL;
}

/* Why stage st's reduction on l is misplaced, or NULL. */
static const char *reduce_fault(const zb_rank_list *l, int st) {
  int red = -1, n = 0, last_w = -1;
  for (int j = 0; j < l->n; j++) {
    const zb_action *a = &l->actions[j];
    if (a->stage == st && a->op == ZB_OP_REDUCE_GRAD)
      red = j, n++;
    if (a->stage == st && (a->op == ZB_OP_W || a->op == ZB_OP_BW))
      last_w = j;
  }
  if (n != 1)
    return n ? "a stage reduced twice" : "a stage without REDUCE_GRAD (gradients m times too large)";
  if (red < last_w)
    return "a REDUCE_GRAD before the stage's last W or BW";
  const zb_action *next = red + 1 < l->n ? &l->actions[red + 1] : NULL;
  if (!next || next->op != ZB_OP_WAIT_REDUCE_GRAD || next->stage != st)
    return "a REDUCE_GRAD not followed by its WAIT_REDUCE_GRAD";
  return NULL;
}

/* Why s (a csv-comm read back) breaks PyTorch's needs, or NULL. */
static const char *csv_comm_fault(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    int waits = 0, sends = 0;
    for (int i = 0; i < l->n; i++) {
      const char *why = NULL;
      waits += is_wait(l->actions[i].op);
      if (l->actions[i].op == ZB_OP_SEND_F || l->actions[i].op == ZB_OP_SEND_B)
        sends++, why = wait_fault(l, i);
      if (why)
        return why;
    }
    if (waits != sends)
      return "a wait without its send";
    for (int st = 0; st < zb_schedule_stages(s); st++)
      if (zb_stage_rank(s, st) == r && reduce_fault(l, st))
        return reduce_fault(l, st);
  }
  return NULL;
}

/* The written lists less the writer's additions equal the lowered ones. */
static bool same_actions(const zb_schedule *lowered, const zb_schedule *back) {
  for (int r = 0; r < back->p; r++) {
    int k = 0;
    for (int i = 0; i < back->ranks[r].n; i++) {
      const zb_action *a = &back->ranks[r].actions[i];
      if (is_wait(a->op) || a->op == ZB_OP_REDUCE_GRAD || a->op == ZB_OP_WAIT_REDUCE_GRAD)
        continue;
      const zb_action *b = k < lowered->ranks[r].n ? &lowered->ranks[r].actions[k++] : NULL;
      if (!b || a->op != b->op || a->stage != b->stage || a->mb != b->mb)
        return false;
    }
    if (k != lowered->ranks[r].n)
      return false;
  }
  return true;
}

static zb_schedule *write_and_read(const zb_schedule *s) {
  zb_buf b = ZB_BUF_INIT;
  zb_csv_write_comms(s, &b);
  zb_schedule *back = NULL;
  zb_diag d = {{0}};
  if (zb_csv_parse(b.data, b.len, ZB_PLACE_INFER, &back, &d) != ZB_OK)
    fprintf(stderr, "  csv-comm does not read back: %s\n", d.msg);
  zb_buf_free(&b);
  return back;
}

/* Appends to gaps (up to cap) how many actions lie from each send of s
 * to its wait; returns the new count. */
static int wait_gaps(const zb_schedule *s, int *gaps, int n, int cap) {
  for (int r = 0; r < s->p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    for (int i = 0; i < l->n && n < cap; i++) {
      const zb_action *a = &l->actions[i];
      if (a->op != ZB_OP_SEND_F && a->op != ZB_OP_SEND_B)
        continue;
      for (int j = i + 1; j < l->n; j++)
        if (is_wait(l->actions[j].op) && l->actions[j].stage == a->stage && l->actions[j].mb == a->mb) {
          gaps[n++] = j - i;
          break;
        }
    }
  }
  return n;
}

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

static void test_every_family(void) {
  int failed = 0, checked = 0, n_gap = 0, *gaps = malloc(sizeof(int) * 200000);
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int p = 2; p <= 4; p++) {
      zb_planner_request req = {.family = (zb_family)f, .p = p, .m = 8, .rank = zb_rank_costs_default()};
      req.v = zb_family_default_chunks((zb_family)f);
      zb_planner_result pl;
      zb_diag d = {{0}};
      CHECK_MSG(zb_planner_run(&req, &pl, &d) == ZB_OK, "%s p=%d: %s", zb_family_name((zb_family)f), p,
                d.msg);
      zb_schedule *back = pl.lowered ? write_and_read(pl.lowered) : NULL;
      const char *why = back ? csv_comm_fault(back) : "does not read back";
      if (!why && (!same_actions(pl.lowered, back) || back->placement != pl.lowered->placement))
        why = "the lowered actions or placement changed";
      if (why)
        fprintf(stderr, "  %s p=%d: %s\n", zb_family_name((zb_family)f), p, why), failed++;
      if (back)
        n_gap = wait_gaps(back, gaps, n_gap, 200000);
      checked++;
      zb_schedule_free(back);
      zb_planner_result_free(&pl);
    }
  qsort(gaps, (size_t)n_gap, sizeof *gaps, cmp_int);
  printf("  %d plans, %d waits; actions from a send to its wait: median %d, min %d\n", checked, n_gap,
         n_gap ? gaps[n_gap / 2] : 0, n_gap ? gaps[0] : 0);
  CHECK(n_gap > 0 && gaps[0] > 1); /* no wait right after its send */
  free(gaps);
  CHECK_EQ(failed, 0);
  CHECK_EQ(checked, 3 * ZB_FAMILY_COUNT_);
}

/* One rank pair of p = 2, m = 1, 1F1B, with a fault named by expect. */
static void check_refused(const char *csv, const char *expect) {
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_csv_parse(csv, strlen(csv), ZB_PLACE_LOOP, &s, &d) == ZB_OK, "%s", d.msg);
  const char *why = s ? csv_comm_fault(s) : NULL;
  CHECK_MSG(why && strstr(why, expect), "want \"%s\", got \"%s\"", expect, why ? why : "no fault");
  zb_schedule_free(s);
}

static void test_checker_refuses(void) {
  static const char good[] = "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
                             "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0\n";
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  CHECK(zb_csv_parse(good, strlen(good), ZB_PLACE_LOOP, &s, &d) == ZB_OK);
  CHECK(s && csv_comm_fault(s) == NULL);
  zb_schedule_free(s);
  /* main's old output: the wait right after its send, no reductions */
  check_refused("0F0,0SEND_F0,0WAIT_SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
                "1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n",
                "may stall");
  check_refused("0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
                "without REDUCE_GRAD");
  check_refused("0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0WAIT_SEND_F0\n"
                "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0\n",
                "later than");
  check_refused("0F0,0SEND_F0,0RECV_B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0B0,0WAIT_SEND_F0\n"
                "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1WAIT_SEND_B0\n",
                "before the stage's last");
  check_refused("0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD\n"
                "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n",
                "without its wait");
}

/* A plan lowered with its reductions at the end (zb_reduce.h): each
 * REDUCE_GRAD stays where the lists put it, its wait right after, and the
 * lists' single WAIT_REDUCE_GRAD is gone. */
static void test_lists_own_reductions(void) {
  zb_planner_request req = {.family = ZB_FAMILY_ZB_V, .p = 4, .m = 8, .rank = zb_rank_costs_default()};
  zb_planner_result pl;
  zb_diag d = {{0}};
  CHECK(zb_planner_run(&req, &pl, &d) == ZB_OK);
  zb_schedule *own = zb_schedule_clone(pl.lowered);
  zb_reduce_insert(own, ZB_REDUCE_AT_END);
  zb_schedule *back = write_and_read(own);
  CHECK(back != NULL);
  CHECK(back && csv_comm_fault(back) == NULL);
  for (int r = 0; back && r < back->p; r++) {
    const zb_rank_list *l = &back->ranks[r];
    /* at the end: the two stages' pairs, then the unproven sends' waits */
    int k = l->n - 1;
    while (k >= 0 && is_wait(l->actions[k].op))
      k--;
    CHECK_MSG(k >= 3 && l->actions[k].op == ZB_OP_WAIT_REDUCE_GRAD &&
                  l->actions[k - 2].op == ZB_OP_WAIT_REDUCE_GRAD,
              "rank %d: the reductions left the end", r);
  }
  zb_schedule_free(back);
  zb_schedule_free(own);
  zb_planner_result_free(&pl);
}

ZBT_MAIN(ZBT(test_every_family), ZBT(test_checker_refuses), ZBT(test_lists_own_reductions))
