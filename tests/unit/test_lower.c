/* Lowering (zb_lower.h): the per-rank merge that zb_lower uses when every
 * F, B and W takes time gives exactly the lists of the reference global
 * walk (zb_lower_global), action by action and batch flag by batch flag,
 * for every family over a sweep of shapes and costs (uneven per stage,
 * with and without T_comm); with a zero-cost W zb_lower falls back to the
 * walk itself; and the merged lists validate and simulate to the compute
 * lists' makespan. Lowering hands back its own simulation's figures
 * (zb_lower_par_figures) exactly when they are the lowered plan's. */
#include <string.h>

#include "zb_lower.h"
#include "zb_par_threads.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

/* Costs of a family's shape: one rank's share with T_B = tb, T_W = tw and
 * T_comm = tc, each stage's times scaled by 1, 1.1 or 1.2 in turn. */
static zb_costs *lower_costs(int p, int v, double tb, double tw, double tc) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_b = tb;
  rc.t_w = tw;
  rc.t_comm = tc;
  zb_costs *c = zb_costs_from_rank_share(p, v, &rc, 0);
  for (int s = 0; s < c->n_stages; s++) {
    double k = 1 + 0.1 * (s % 3);
    c->t_f[s] *= k;
    c->t_b[s] *= k;
    c->t_w[s] *= k;
  }
  return c;
}

/* The first rank and index where a and b differ; false when equal. */
static bool lower_differ(const zb_schedule *a, const zb_schedule *b, int *rank, int *index) {
  for (int r = 0; r < a->p; r++) {
    int n = a->ranks[r].n < b->ranks[r].n ? a->ranks[r].n : b->ranks[r].n;
    for (int i = 0; i < n; i++) {
      const zb_action *x = &a->ranks[r].actions[i], *y = &b->ranks[r].actions[i];
      if (x->op != y->op || x->stage != y->stage || x->mb != y->mb || x->peer != y->peer ||
          x->batch != y->batch || x->overlap != y->overlap) {
        *rank = r;
        *index = i;
        return true;
      }
    }
    if (a->ranks[r].n != b->ranks[r].n) {
      *rank = r;
      *index = n;
      return true;
    }
  }
  return false;
}

/* Lowers family f at (p, m) under c both ways; counts the cases compared. */
static void lower_compare(zb_family f, int p, int m, const zb_costs *c, int *compared) {
  int v = zb_family_default_chunks(f);
  zb_plan_request req = {.family = f, .p = p, .v = v, .m = m, .costs = c};
  zb_schedule *s = NULL, *fast = NULL, *ref = NULL;
  zb_diag d = {{0}};
  if (zb_plan_generate(&req, &s, &d) != ZB_OK)
    return; /* a shape the family refuses (interleaved m < p, ...) */
  zb_err e1 = zb_lower(s, c, &fast, &d), e2 = zb_lower_global(s, c, &ref, &d);
  CHECK_MSG(e1 == ZB_OK && e2 == ZB_OK, "%s p=%d m=%d: %s", zb_family_name(f), p, m, d.msg);
  int r = -1, i = -1;
  if (fast && ref) {
    (*compared)++;
    CHECK_MSG(!lower_differ(fast, ref, &r, &i), "%s p=%d m=%d t_comm=%g: rank %d differs at action %d",
              zb_family_name(f), p, m, c->t_comm, r, i);
    zb_violation viol;
    CHECK_MSG(zb_validate(fast, c, &viol) == ZB_OK, "%s p=%d m=%d: %s", zb_family_name(f), p, m, viol.detail);
    double mk0, mk1, span;
    CHECK(zb_simulate_makespan(s, c, &mk0, &span) == ZB_OK &&
          zb_simulate_makespan(fast, c, &mk1, &span) == ZB_OK);
    /* a RECV holds its rank until the tensor is there: never faster */
    CHECK_MSG(mk1 >= mk0 - 1e-9 * (1 + mk0), "%s p=%d m=%d: lowered %g < %g", zb_family_name(f), p, m, mk1,
              mk0);
    if (c->t_comm == 0)
      CHECK_MSG(mk1 <= mk0 + 1e-9 * (1 + mk0), "%s p=%d m=%d t_comm 0: lowered %g > %g", zb_family_name(f), p,
                m, mk1, mk0);
  }
  zb_schedule_free(s);
  zb_schedule_free(fast);
  zb_schedule_free(ref);
}

static void test_lower_merge_equals_walk(void) {
  static const int ps[] = {1, 2, 3, 4, 5, 8}, ms[] = {1, 2, 3, 4, 7, 8, 16};
  static const double tcs[] = {0, 0.05, 0.5}, tbs[] = {1, 1.3, 2.0};
  int compared = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (size_t a = 0; a < sizeof ps / sizeof ps[0]; a++)
      for (size_t b = 0; b < sizeof ms / sizeof ms[0]; b++)
        for (size_t k = 0; k < sizeof tcs / sizeof tcs[0]; k++)
          for (size_t j = 0; j < sizeof tbs / sizeof tbs[0]; j++) {
            int v = zb_family_default_chunks((zb_family)f);
            zb_costs *c = lower_costs(ps[a], v, tbs[j], 2.5 - tbs[j], tcs[k]);
            lower_compare((zb_family)f, ps[a], ms[b], c, &compared);
            zb_costs_free(c);
          }
  printf("per-rank merge = global walk on %d lowered schedules\n", compared);
  CHECK(compared > 3000); /* the sweep really ran: every family but a few refused shapes */
}

/* A zero-cost W: zb_lower takes the walk (the merge's premise fails), so
 * both forms still agree and validate. */
static void test_lower_zero_cost_w(void) {
  int compared = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    int v = zb_family_default_chunks((zb_family)f);
    zb_costs *c = lower_costs(4, v, 1.0, 0.0, 0.0);
    lower_compare((zb_family)f, 4, 8, c, &compared);
    zb_costs_free(c);
  }
  CHECK(compared >= 8);
}

/* Stage 0 run by rank 3 of 4 instead of rank 0, whose list is empty:
 * invalid (placement), but it simulates, so the merge lowers it (the
 * reference walk reports a deadlock). F(0,0)'s output goes to rank 1,
 * none of rank 3's peers (only stage 3's neighbour, rank 2, is): the
 * merge cannot name it by rank 3's peers and looks it up, so the send
 * right after F(0,0) names rank 1. */
static void test_lower_misplaced_stage(void) {
  zb_schedule *s = zb_schedule_new(4, 1, 1, ZB_PLACE_LOOP);
  static const zb_op ops[] = {ZB_OP_F, ZB_OP_B, ZB_OP_W};
  zb_schedule_push_op(s, 3, ZB_OP_F, 0, 0);
  zb_schedule_push_op(s, 3, ZB_OP_F, 3, 0);
  for (int k = 1; k < 3; k++)
    zb_schedule_push_op(s, 3, ops[k], 3, 0);
  for (int k = 1; k < 3; k++)
    zb_schedule_push_op(s, 3, ops[k], 0, 0);
  for (int r = 1; r < 3; r++)
    for (int k = 0; k < 3; k++)
      zb_schedule_push_op(s, r, ops[k], r, 0);
  zb_costs *c = lower_costs(4, 1, 1.0, 1.0, 0.0);
  zb_schedule *low = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_lower(s, c, &low, &d), ZB_OK);
  const zb_rank_list *l = low ? &low->ranks[3] : NULL;
  CHECK(l && l->n > 1 && l->actions[0].op == ZB_OP_F && l->actions[0].stage == 0);
  if (l && l->n > 1) {
    const zb_action *a = &l->actions[1];
    CHECK(a->op == ZB_OP_SEND_F && a->stage == 0 && a->mb == 0 && a->peer == 1);
  }
  zb_schedule_free(low);
  zb_schedule_free(s);
  zb_costs_free(c);
}

/* A runner that takes the pieces last first, one after another, and
 * counts them: the split's pieces must not depend on their order. */
static int reverse_pieces;
static void reverse_run(const zb_par *par, zb_par_fn fn, void *arg, int n) {
  (void)par;
  reverse_pieces = n;
  for (int k = n - 1; k >= 0; k--)
    fn(arg, k);
}

/* Lowering split over a runner's pieces gives the same lists as in one
 * piece: in reverse order, and on threads (2 and 4 at once). The plans are
 * large, so zb_lower takes them through their steady state and the
 * pieces merge every rank in full: the same lists again. */
static void test_lower_par_same_lists(void) {
  static const zb_family fams[] = {ZB_FAMILY_ZB_V, ZB_FAMILY_INTERLEAVED_1F1B, ZB_FAMILY_ZB_H1};
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    int p = 64, m = 8192 / zb_family_default_chunks(fams[f]), v = zb_family_default_chunks(fams[f]);
    zb_costs *c = lower_costs(p, v, 1.3, 1.2, 0.05);
    zb_plan_request req = {.family = fams[f], .p = p, .v = v, .m = m, .costs = c};
    zb_schedule *s = NULL, *one = NULL;
    zb_diag d = {{0}};
    CHECK_EQ(zb_plan_generate(&req, &s, &d), ZB_OK);
    CHECK_EQ(zb_lower(s, c, &one, &d), ZB_OK);
    zb_par runners[] = {{.run = reverse_run, .width = 3}, zb_par_threads(2), zb_par_threads(4)};
    for (size_t k = 0; k < sizeof runners / sizeof runners[0]; k++) {
      zb_schedule *split = NULL;
      reverse_pieces = 0;
      CHECK_EQ(zb_lower_full_par(s, c, &runners[k], &split, &d), ZB_OK);
      int r = -1, i = -1;
      CHECK_MSG(!lower_differ(split, one, &r, &i), "%s runner %zu: rank %d differs at action %d",
                zb_family_name(fams[f]), k, r, i);
      if (k == 0)
        CHECK_MSG(reverse_pieces == 3, "%s: split into %d pieces", zb_family_name(fams[f]), reverse_pieces);
      zb_schedule_free(split);
    }
    zb_schedule_free(one);
    zb_schedule_free(s);
    zb_costs_free(c);
  }
}

/* Whether a and b hold the same figures, to the bit (the same sums in the
 * same order); names the first that differs. */
static bool lower_same_figures(const zb_sim_result *a, const zb_sim_result *b, const char **what) {
  *what = a->makespan != b->makespan                       ? "makespan"
          : a->max_span != b->max_span                     ? "max span"
          : a->bubble_ratio != b->bubble_ratio             ? "bubble ratio"
          : a->bubble_ratio_paper != b->bubble_ratio_paper ? "paper bubble ratio"
                                                           : NULL;
  for (int r = 0; r < a->p && !*what; r++)
    *what = a->busy[r] != b->busy[r]                             ? "busy"
            : a->span_start[r] != b->span_start[r]               ? "span start"
            : a->span_end[r] != b->span_end[r]                   ? "span end"
            : a->peak_memory[r] != b->peak_memory[r]             ? "peak memory"
            : a->peak_memory_units[r] != b->peak_memory_units[r] ? "peak memory units"
                                                                 : NULL;
  return !*what;
}

/* The figures lowering hands back are the lowered plan's own simulation's,
 * field for field, and come whenever T_comm is 0; with a T_comm that
 * receives wait for, the lowered timeline is not the compute plan's, and
 * none come (interleaved 1F1B's figures then differ: the check is needed).
 * Every family, uneven costs, on threads. */
static void test_lower_figures_only_when_same(void) {
  static const double tcs[] = {0, 0.3};
  zb_par par = zb_par_threads(2);
  int shared[2] = {0, 0}, total = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (size_t k = 0; k < 2; k++) {
      int p = 8, m = 32, v = zb_family_default_chunks((zb_family)f);
      zb_costs *c = lower_costs(p, v, 1.3, 1.2, tcs[k]);
      zb_plan_request req = {.family = (zb_family)f, .p = p, .v = v, .m = m, .costs = c};
      zb_schedule *s = NULL, *low = NULL;
      zb_sim_result *fig = NULL, *ref = NULL;
      zb_diag d = {{0}};
      CHECK_EQ(zb_plan_generate(&req, &s, &d), ZB_OK);
      CHECK_EQ(zb_lower_par_figures(s, NULL, 0, c, &par, &low, &fig, &d), ZB_OK);
      CHECK_EQ(zb_simulate_figures(low, c, &ref, &d), ZB_OK);
      const char *what = NULL;
      CHECK_MSG(!fig || lower_same_figures(fig, ref, &what), "%s T_comm %g: %s differs",
                zb_family_name((zb_family)f), tcs[k], what);
      CHECK(!fig || fig->start == NULL);
      shared[k] += fig != NULL;
      total += k == 0;
      if (f == ZB_FAMILY_INTERLEAVED_1F1B && k == 1) { /* its receives wait: the plan's figures are not s's */
        zb_sim_result *own = NULL;
        CHECK_EQ(zb_simulate_figures(s, c, &own, &d), ZB_OK);
        CHECK(fig == NULL && own->makespan != ref->makespan);
        zb_sim_result_free(own);
      }
      zb_sim_result_free(fig);
      zb_sim_result_free(ref);
      zb_schedule_free(low);
      zb_schedule_free(s);
      zb_costs_free(c);
    }
  printf("figures from lowering: %d of %d plans with T_comm 0, %d with T_comm 0.3\n", shared[0], total,
         shared[1]);
  CHECK_EQ(shared[0], total);
  CHECK(shared[1] < total);
}

/* Receives at arrival: 1F1B at p = 2, m = 3 with T_F = T_B = T_W =
 * T_comm = 1. A receive placed at its producer's end held the op after
 * it until the tensor arrived (makespan 18 against the compute lists'
 * 16); placed where the tensor arrives, none holds its rank, the lowered
 * plan runs on the compute plan's timeline, and lowering hands back its
 * own simulation's figures. The lists validate (no send blocks on a
 * receive its peer posts only after a send back). */
static void test_lower_recv_at_arrival(void) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_comm = 1;
  zb_costs *c = zb_costs_from_rank_share(2, 1, &rc, 0);
  zb_plan_request req = {.family = ZB_FAMILY_1F1B, .p = 2, .v = 1, .m = 3, .costs = c};
  zb_schedule *s = NULL, *low = NULL;
  zb_sim_result *fig = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_plan_generate(&req, &s, &d), ZB_OK);
  CHECK_EQ(zb_lower_par_figures(s, NULL, 0, c, NULL, &low, &fig, &d), ZB_OK);
  double mk0 = 0, mk1 = 0, span;
  CHECK(zb_simulate_makespan(s, c, &mk0, &span) == ZB_OK &&
        zb_simulate_makespan(low, c, &mk1, &span) == ZB_OK);
  CHECK_MSG(mk0 == 16 && mk1 == 16, "compute-only %g, lowered %g", mk0, mk1);
  CHECK(fig != NULL && fig->makespan == 16);
  zb_violation viol;
  CHECK_MSG(zb_validate(low, c, &viol) == ZB_OK, "%s", viol.detail);
  zb_sim_result_free(fig);
  zb_schedule_free(low);
  zb_schedule_free(s);
  zb_costs_free(c);
}

ZBT_MAIN(ZBT(test_lower_merge_equals_walk), ZBT(test_lower_zero_cost_w), ZBT(test_lower_misplaced_stage),
         ZBT(test_lower_par_same_lists), ZBT(test_lower_figures_only_when_same),
         ZBT(test_lower_recv_at_arrival))
